#!/usr/bin/env bash
# Multi-host: the coordinator and two agents each in their own network namespace (own IP,
# joined by a bridge in a fourth namespace), a step with an all-gather across them, driven by a
# client in the coordinator's namespace. Needs root for `ip netns`; skips (exit 77) otherwise.
# Usage: it_netns.sh BIN_DIR
set -euo pipefail
bin="$1"
if [ "$(id -u)" -ne 0 ]; then
	echo "SKIP: network namespaces need root (run as root to test multi-host)"
	exit 77
fi
if ! command -v ip >/dev/null; then
	echo "SKIP: iproute2 (ip) is not installed"
	exit 77
fi
tag="pe$$"
net="10.231.$(($$ % 200 + 20))"
hosts=(c a0 a1)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do
		for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
		kill -9 "$p" 2>/dev/null || true
	done
	for h in "${hosts[@]}" sw; do ip netns del "$tag-$h" 2>/dev/null || true; done
}
trap cleanup EXIT
# A test that ctest kills outright (its timeout) runs no trap: its pods go with it instead.
export PODEMU_EXIT_WITH=$$
if ! ip netns add "$tag-sw" 2>/dev/null; then
	echo "SKIP: cannot create network namespaces here"
	exit 77
fi
ip -n "$tag-sw" link add br0 type bridge
ip -n "$tag-sw" link set br0 up
i=1
for h in "${hosts[@]}"; do
	ip netns add "$tag-$h"
	ip link add "$tag-$h" type veth peer name eth0 netns "$tag-$h"
	ip link set "$tag-$h" netns "$tag-sw"
	ip -n "$tag-sw" link set "$tag-$h" master br0 up
	ip -n "$tag-$h" addr add "$net.$i/24" dev eth0
	ip -n "$tag-$h" link set eth0 up
	ip -n "$tag-$h" link set lo up
	i=$((i + 1))
done
log=$(mktemp -d /tmp/podemu-netns-XXXXXX)
coord="tcp://$net.1:7460"
# Off loopback the daemons insist on the pod's secret.
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$log/token"
if ip netns exec "$tag-c" "$bin/podemu-coordinator" --listen "$coord" --hosts 2 \
	--cores-per-host 2 --hbm 256M >"$log/refused.log" 2>&1; then
	echo "FAIL: the coordinator listened on $coord without a token"
	exit 1
fi
grep -q "without a pod token" "$log/refused.log"
ip netns exec "$tag-c" "$bin/podemu-coordinator" --listen "$coord" --hosts 2 \
	--cores-per-host 2 --hbm 256M --token-file "$log/token" >"$log/coordinator.log" 2>&1 &
pids+=($!)
for a in 0 1; do
	ip="$net.$((a + 2))"
	ip netns exec "$tag-a$a" "$bin/podemu-agent" --coordinator "$coord" --backing host \
		--listen "tcp://$ip:0" --control-listen "tcp://$ip:0" --token-file "$log/token" \
		>"$log/agent-$a.log" 2>&1 &
	pids+=($!)
done
export PODEMU_COORDINATOR="$coord"
PODEMU_TOKEN=$(cat "$log/token")
export PODEMU_TOKEN
ready=0
for _ in $(seq 100); do
	if ip netns exec "$tag-c" "$bin/podemu" status >/dev/null 2>&1; then ready=1; break; fi
	sleep 0.1
done
if [ "$ready" -ne 1 ]; then
	tail -n 20 "$log"/*.log
	echo "FAIL: the pod did not become ready"
	exit 1
fi
ip netns exec "$tag-c" "$bin/podemu" status --json >"$log/status.json"
ip netns exec "$tag-c" "$bin/podemu" demo --elements 65536 --json >"$log/demo.json"
python3 - "$log/status.json" "$log/demo.json" "$net" <<'PY'
import json, sys
status, demo, net = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
urls = sorted(h["data_url"] for h in status["hosts"])
assert urls[0].startswith("tcp://%s.2:" % net) and urls[1].startswith("tcp://%s.3:" % net), urls
assert [c["sum"] for c in demo["cores"]] == [65536 * 4] * 4, demo
print("netns: all-gather across hosts %s: sums %s" % (urls, [c["sum"] for c in demo["cores"]]))
PY
rm -rf "$log"
