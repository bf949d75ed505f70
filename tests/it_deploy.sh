#!/usr/bin/env bash
# The deployments that cannot run here (containers, Kubernetes) checked as far as possible:
# the compose file's and the Kubernetes manifests' wiring, parsed (services, image, the token
# required, agents = hosts, addresses that meet), and the image's entrypoint run outside a
# container as a coordinator and two agents on loopback, which then run a step.
# Usage: it_deploy.sh BIN_DIR DEPLOY_DIR
set -euo pipefail
bin="$1"
deploy="$2"
name=deploy
source "$(dirname "$0")/pod_lib.sh"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; cleanup' EXIT

python3 - "$deploy" <<'PY' || fail "deployment files"
import os, re, sys, yaml
deploy = sys.argv[1]

def interpolate(value, env):
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error}."""
    def one(m):
        var, op, arg = m.group(1), m.group(2), m.group(3)
        if env.get(var):
            return env[var]
        if op == ":?":
            raise KeyError(f"{var}: {arg}")
        return arg or ""
    return re.sub(r"\$\{(\w+)(:-|:\?)?([^}]*)\}", one, value)

def resolve(node, env):
    if isinstance(node, dict):
        return {k: resolve(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [resolve(v, env) for v in node]
    return interpolate(node, env) if isinstance(node, str) else node

compose = yaml.safe_load(open(os.path.join(deploy, "docker-compose.yml")))
try:
    resolve(compose, {})
    raise AssertionError("compose starts without PODEMU_TOKEN")
except KeyError as e:
    assert "PODEMU_TOKEN" in str(e), e
for hosts in ("2", "7"):
    c = resolve(compose, {"PODEMU_TOKEN": "t" * 32, "PODEMU_HOSTS": hosts})["services"]
    assert set(c) >= {"coordinator", "agent", "client"}, c.keys()
    assert {s["image"] for s in c.values()} == {"podemu:latest"}
    assert c["coordinator"]["build"]["dockerfile"] == "deploy/Dockerfile"
    assert int(c["agent"]["deploy"]["replicas"]) == int(c["coordinator"]["environment"]["PODEMU_HOSTS"]) == int(hosts)
    for s in c.values():
        assert s["environment"]["PODEMU_TOKEN"] == "t" * 32, s
    assert c["agent"]["environment"]["PODEMU_COORDINATOR"] == "tcp://coordinator:7460"
    assert c["client"]["environment"]["PODEMU_COORDINATOR"] == "tcp://coordinator:7460"

docs = []
for f in sorted(os.listdir(os.path.join(deploy, "k8s"))):
    docs += [d for d in yaml.safe_load_all(open(os.path.join(deploy, "k8s", f))) if d]
kinds = {(d["kind"], d["metadata"]["name"]): d for d in docs}
secret = kinds[("Secret", "podemu-token")]
assert "token" in secret["stringData"]
coord = kinds[("Deployment", "podemu-coordinator")]["spec"]
agents = kinds[("StatefulSet", "podemu-agent")]["spec"]
svc = kinds[("Service", "coordinator")]["spec"]
headless = kinds[("Service", "podemu-agent")]["spec"]
def env(container):
    return {e["name"]: e for e in container["env"]}
ce = env(coord["template"]["spec"]["containers"][0])
ae = env(agents["template"]["spec"]["containers"][0])
for e in (ce, ae):
    assert e["PODEMU_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "podemu-token", "key": "token"}
assert int(ce["PODEMU_HOSTS"]["value"]) == agents["replicas"]
assert svc["selector"] == coord["template"]["metadata"]["labels"]
port = int(ce["PODEMU_LISTEN"]["value"].rsplit(":", 1)[1])
assert port in [p["port"] for p in svc["ports"]]
assert ae["PODEMU_COORDINATOR"]["value"] == f"tcp://coordinator:{port}"
assert agents["serviceName"] == "podemu-agent" and headless["clusterIP"] == "None"
assert headless["selector"] == agents["template"]["metadata"]["labels"]
assert ae["PODEMU_ADVERTISE_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
probe = coord["template"]["spec"]["containers"][0]["readinessProbe"]["exec"]["command"]
assert probe == ["podemu", "status"], probe
assert ce["PODEMU_COORDINATOR"]["value"] == f"tcp://127.0.0.1:{port}"
print("compose and Kubernetes wiring: token required, agents = hosts, addresses meet")
PY

# The entrypoint, outside a container: a coordinator and two agents on loopback.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
entry="$deploy/docker-entrypoint.sh"
port=$(free_port)
export PATH="$bin:$PATH" PODEMU_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
export PODEMU_COORDINATOR="tcp://127.0.0.1:$port"
PODEMU_LISTEN="$PODEMU_COORDINATOR" PODEMU_HOSTS=2 PODEMU_CORES_PER_HOST=2 PODEMU_HBM=64M \
	sh "$entry" coordinator >"$state/coordinator.log" 2>&1 &
pids+=($!)
for h in 0 1; do
	PODEMU_HOST_INDEX=$h PODEMU_LISTEN_HOST=127.0.0.1 PODEMU_ADVERTISE_HOST=127.0.0.1 \
		PODEMU_DATA_PORT=$(free_port) PODEMU_CONTROL_PORT=$(free_port) PODEMU_BACKING=host \
		sh "$entry" agent >"$state/agent-$h.log" 2>&1 &
	pids+=($!)
done
for _ in $(seq 1 100); do
	sh "$entry" podemu status >"$state/status.txt" 2>&1 && break
	sleep 0.1
done
sh "$entry" podemu status >"$state/status.txt" 2>&1 || fail "not ready: $(cat "$state/status.txt" "$state"/*.log)"
grep -q "2 hosts x 2 cores" "$state/status.txt" || fail "$(cat "$state/status.txt")"
sh "$entry" podemu demo --elements 1024 >"$state/demo.txt" 2>&1 || fail "demo: $(cat "$state/demo.txt")"
grep -q "4096" "$state/demo.txt" || fail "demo: $(cat "$state/demo.txt")"
echo "the entrypoint started a coordinator and two agents that ran a step"
