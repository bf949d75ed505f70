#!/usr/bin/env bash
# The CLI end to end: podemu up / status / demo / down on real processes, checked against the
# figures of pytorch/xla issue 3510. Usage: it_cli.sh BIN_DIR
set -euo pipefail
bin="$1"
name=cli
source "$(dirname "$0")/pod_lib.sh"

# Coordinator options pass through podemu up, and a bad one stops it with the coordinator's words.
refused "podemu-coordinator: --window: '0' is not a whole number in \[1, 64\]" \
	pe up --hosts 1 --cores-per-host 1 --hbm 64M --window 0 --port 0
# Numbers are whole numbers: a word is refused, not read as 0.
refused "--hosts: 'two' is not a whole number" pe up --hosts two --cores-per-host 1 --port 0
refused "--iters: 'abc' is not a whole number" pe bench --iters abc
refused "--min-bytes: 2 bytes hold no element" pe bench --min-bytes 2

# A v3-8 at the seed's full size without backing: 512 MiB in, 4 GiB out per core.
pe up --topology v3-8 --backing none --port 0 >/dev/null
pe status --json >"$state/status.json"
python3 - "$state/status.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["ready"] is True, s
assert s["topology"] == "v3-8" and s["world_size"] == 8, s
assert len(s["hosts"]) == 1 and len(s["cores"]) == 8, s
for c in s["cores"]:
    assert c["bytes_limit"] == 16624123904, c   # 16 GiB minus the 530 MiB runtime reservation
    assert c["host"] == 0 and c["bytes_used"] == 0, c
PY
refused "PODEMU_SESSION_LEASE_MS: 'soon' is not a whole number" env PODEMU_SESSION_LEASE_MS=soon \
	"$bin/podemu" demo --state-dir "$state"
pe demo --json >"$state/demo.json"
python3 - "$state/demo.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
G = 1 << 30
assert d["world_size"] == 8 and d["elements"] == 134217728, d
assert len(d["cores"]) == 8
for c in d["cores"]:
    assert c["sum"] is None, c          # no bytes behind the heaps
    peak, used = c["peak_bytes_used"], c["bytes_used"]
    assert 4.5 * G <= peak <= 4.5 * G * 1.01, ("peak", c)
    assert 4 * G <= used <= 4 * G * 1.01, ("used", c)
print("v3-8 seed: peak %.3f GiB, in use %.3f GiB per core" % (peak / G, used / G))
PY
# Without the pod's token, or with a wrong one, nothing is answered; an agent cannot join.
if PODEMU_TOKEN=wrong pe status >"$state/denied.txt" 2>&1; then fail "status without the token"; fi
grep -q UNAUTHENTICATED "$state/denied.txt" || fail "status was not refused as UNAUTHENTICATED"
if PODEMU_TOKEN=wrong pe demo >"$state/denied.txt" 2>&1; then fail "a step without the token"; fi
grep -q UNAUTHENTICATED "$state/denied.txt" || fail "a step was not refused as UNAUTHENTICATED"
if PODEMU_TOKEN= "$bin/podemu-agent" --coordinator "$(cat "$state/coordinator.url")" \
	>"$state/intruder.log" 2>&1; then :; fi
grep -q "registration refused: UNAUTHENTICATED" "$state/intruder.log" ||
	fail "an agent without the token was not refused"
# podemu up on a complete running pod starts nothing and keeps it.
expect "started the 0 missing processes" pe up --topology v3-8 --port 0
pids=$(cat "$state"/*.pid)
pe down >/dev/null
for p in $pids; do
	if kill -0 "$p" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$p/status"; then
		fail "process $p outlived podemu down"
	fi
done
if pe status >/dev/null 2>&1; then fail "status answered after down"; fi

# Real bytes: every core's sum of the gathered ones is exactly 8 x 1048576.
pe up --topology v3-8 --backing host --port 0 >/dev/null
pe demo --elements 1048576 --json >"$state/demo.json"
python3 - "$state/demo.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert [c["sum"] for c in d["cores"]] == [8388608] * 8, d
PY
# The example program checks every core's gathered rows against the host.
PODEMU_STATE_DIR="$state" expect "every core matches the host" "$bin/podemu-example-allgather" 64 300
pe down >/dev/null

# A step that stores more bytes than the machine has is refused before it touches a page, with
# the way out; the pod loses nothing. Each core writes the machine's whole memory here.
mem_kib=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
pe up --hosts 1 --cores-per-host 2 --hbm "$((mem_kib / 1048576 * 2 + 8))G" --backing host \
	--port 0 >/dev/null
if pe demo --elements "$((mem_kib * 256))" >"$state/overcommit.txt" 2>&1; then
	fail "a step of twice the machine's memory ran with --backing host"
fi
grep -q "RESOURCE_EXHAUSTED: host memory: this step writes .* on host 0's 2 cores" \
	"$state/overcommit.txt" && grep -q -- "--backing none" "$state/overcommit.txt" ||
	fail "host memory not named: $(cat "$state/overcommit.txt")"
pe demo --elements 1024 --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert [c["sum"] for c in d["cores"]] == [2048] * 2, d' || fail "demo after a refused step"
pe down >/dev/null

# podemu up on a pod with a missing agent, then with a missing coordinator, starts only that one;
# the other processes carry on and the pod computes again.
gone() {
	for _ in $(seq 500); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.01; done
	return 1
}
sums() {
	pe demo --elements 1024 --json | python3 -c '
import json, sys
assert [c["sum"] for c in json.load(sys.stdin)["cores"]] == [4096] * 4' || fail "demo after $1"
}
# podemu up ARGS starts exactly one missing process; what it said (and how it ended, and the
# logs' last lines) in $state/up.txt.
restart() {
	local rc=0
	pe up "$@" >"$state/up.txt" 2>&1 || rc=$?
	grep -q "started the 1 missing processes" "$state/up.txt" && return 0
	echo "podemu up exited with $rc" >>"$state/up.txt"
	tail -n 5 "$state"/*.log >>"$state/up.txt"
	return 1
}
shape=(--hosts 2 --cores-per-host 2 --hbm 1G --backing host --port 0)
pe up "${shape[@]}" >/dev/null
coordinator=$(cat "$state/coordinator.pid") agent0=$(cat "$state/agent-0.pid")
kill -9 "$(cat "$state/agent-1.pid")" && gone "$(cat "$state/agent-1.pid")"
restart "${shape[@]}" || fail "agent not restarted: $(cat "$state/up.txt")"
[[ $(cat "$state/coordinator.pid") == "$coordinator" && $(cat "$state/agent-0.pid") == "$agent0" ]] ||
	fail "podemu up restarted running processes"
# Ready means the new agent registered, not the killed one whose lease has not yet run out.
pe status --json | python3 -c '
import json, sys
assert json.load(sys.stdin)["hosts"][1]["pid"] == int(sys.argv[1])' "$(cat "$state/agent-1.pid")" ||
	fail "podemu up returned before the restarted agent registered"
sums "an agent restart"
agent1=$(cat "$state/agent-1.pid")
kill -9 "$coordinator" && gone "$coordinator"
# Another command line does not change the pod: it is restarted with the shape it had.
restart --topology v3-8 --backing none --port 0 ||
	fail "coordinator not restarted: $(cat "$state/up.txt")"
pe status --json | python3 -c '
import json, sys
s = json.load(sys.stdin)
assert s["world_size"] == 4 and s["num_hosts"] == 2, s' || fail "restarted with another shape"
[[ $(cat "$state/agent-0.pid") == "$agent0" && $(cat "$state/agent-1.pid") == "$agent1" ]] ||
	fail "podemu up restarted running agents"
sums "a coordinator restart"
# podemu bench: every op and dtype, checked against the host, JSON as the collectives issue says.
for dtype in f32 bf16 s32; do
	pe bench --op all-gather,reduce-scatter,all-reduce,all-to-all,collective-permute \
		--dtype "$dtype" --min-bytes 64K --max-bytes 256K --factor 4 --iters 2 --check --json |
		python3 -c '
import json, sys
b = json.load(sys.stdin)
assert b["world_size"] == 4 and len(b["rows"]) == 10, b
for r in b["rows"]:
    assert set(r) >= {"op", "bytes", "time_us", "algbw_gbps", "busbw_gbps", "peak_temp_bytes",
                      "checked", "ok"}, r
    assert r["checked"] and r["ok"], r
    assert r["peak_temp_bytes"] == 0 or r["op"] in ("reduce-scatter", "all-reduce"), r' ||
		fail "bench --dtype $dtype"
done
# --backing host: once its cores are idle (200 ms), an agent's RSS is what its cores account
# plus at most 64 MiB: what steps freed is kept for the next one only while steps follow.
pe bench --op all-gather,reduce-scatter,all-reduce --min-bytes 16M --max-bytes 16M --iters 1 \
	>/dev/null
sleep 0.5
# AddressSanitizer's shadow memory and quarantine are no agent overhead: the bound is not
# checked under it (the figures are still printed).
pe status --json | PODEMU_ASAN="${ASAN_OPTIONS:+1}" python3 -c '
import json, os, sys
s = json.load(sys.stdin)
for h in s["hosts"]:
    bound = h["accounted_bytes"] + (64 << 20)
    print("host %d: RSS %d MiB, accounted %d MiB, bound %d MiB%s" % (h["index"],
          h["rss_bytes"] >> 20, h["accounted_bytes"] >> 20, bound >> 20,
          " (not checked under AddressSanitizer)" if os.environ.get("PODEMU_ASAN") else ""))
    if os.environ.get("PODEMU_ASAN"):
        continue
    assert 0 < h["rss_bytes"] <= bound, h' || fail "agent RSS over accounted HBM + overhead"
pe down >/dev/null

# podemu compile / mem on HLO text: offline, and for the running pod.
hlo="$(dirname "$0")/hlo"
"$bin/podemu" compile "$hlo/seed.hlo" --topology v3-8 --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
assert r["error"] is None and len(r["cores"]) == 8, r
for c in r["cores"]:
    assert c["peak_bytes"] == 4831838208 and c["fits"] and c["temp_bytes"] == 0, c
    assert c["sent_bytes"] == 7 * 2**29, c
    assert [b["kind"] for b in c["peak_live"]] == ["output", "argument"], c' ||
	fail "compile seed.hlo"
for layout in tpu none; do
	"$bin/podemu" compile "$hlo/padding.hlo" --topology v3-8 --layout $layout --json
done | python3 -c '
import json, sys
text, dec, docs = sys.stdin.read(), json.JSONDecoder(), []
while text.strip():
    doc, end = dec.raw_decode(text.strip())
    docs.append(doc)
    text = text.strip()[end:]
tpu, none = docs
assert tpu["cores"][0]["peak_bytes"] == 12 * 2**30, tpu["cores"][0]
assert tpu["cores"][0]["padding_bytes"] == 2 * (6 * 2**30 - 48 * 2**20), tpu["cores"][0]
assert none["cores"][0]["peak_bytes"] == 96 * 2**20, none["cores"][0]' || fail "compile padding.hlo"
if "$bin/podemu" compile "$hlo/too-big.hlo" --topology v3-8 >"$state/oom.txt" 2>&1; then
	fail "a step over 16 GiB per v3 core was accepted"
fi
grep -q "Ran out of memory in memory space hbm. Used 18.00G of 15.48G hbm" "$state/oom.txt" ||
	fail "no XLA out-of-memory text: $(head -3 "$state/oom.txt")"
grep -q "Extra memory due to padding: 5.95G (128.0x expansion)" "$state/oom.txt" ||
	fail "the largest allocations do not show the padding"
if "$bin/podemu" compile "$hlo/undefined-operand.hlo" --topology v3-8 2>"$state/err.txt"; then
	fail "bad HLO accepted"
fi
grep -q "line 4, column 26: q uses nope" "$state/err.txt" || fail "parse error: $(cat "$state/err.txt")"
"$bin/podemu" mem "$hlo/seed.hlo" --topology v3-8 --svg "$state/seed.svg" >/dev/null
python3 -c '
import sys, xml.dom.minidom
d = xml.dom.minidom.parse(sys.argv[1])
text = " ".join(t.firstChild.data for t in d.getElementsByTagName("text") if t.firstChild)
assert "peak 4.50G" in text and "capacity 15.48G" in text, text' "$state/seed.svg" ||
	fail "mem --svg"
pe up --hosts 2 --cores-per-host 4 --hbm 1G --backing none --port 0 >/dev/null
# Without bytes a bench would print bandwidth for nothing: refused, or marked on every row.
if pe bench --op all-reduce --min-bytes 64K --max-bytes 64K --iters 1 2>"$state/bench.err"; then
	fail "bench ran on a pod without bytes"
fi
grep -q "FAILED_PRECONDITION: the pod runs with --backing none" "$state/bench.err" ||
	fail "bench: $(cat "$state/bench.err")"
pe bench --op all-gather,all-reduce --min-bytes 64K --max-bytes 256K --factor 4 --iters 1 \
	--no-bytes --json | python3 -c '
import json, sys
rows = json.load(sys.stdin)["rows"]
assert len(rows) == 4 and all(r["no_bytes"] for r in rows), rows' || fail "bench --no-bytes"
expect "\(no bytes moved\)" pe bench --op all-reduce --min-bytes 64K --max-bytes 64K --iters 1 --no-bytes
# Each agent runs on its own half of the CPUs this test may use (one each if it has two).
python3 - "$state" <<'PY' || fail "agents not bound to their CPUs"
import os, sys
cpus = sorted(os.sched_getaffinity(0))
for h in range(2):
    pid = open(f"{sys.argv[1]}/agent-{h}.pid").read().strip()
    line = [l for l in open(f"/proc/{pid}/status") if l.startswith("Cpus_allowed_list")][0]
    got = set()
    for part in line.split()[1].split(","):
        lo, _, hi = part.partition("-")
        got |= set(range(int(lo), int(hi or lo) + 1))
    want = set(cpus[h * len(cpus) // 2:(h + 1) * len(cpus) // 2]) if len(cpus) > 1 else set(cpus)
    if len(cpus) == 1:
        want = got  # one CPU: nothing to bind
    assert got == want, (h, sorted(got), sorted(want))
PY
if pe up --bind-to cores >"$state/bind.txt" 2>&1; then fail "--bind-to cores accepted"; fi
grep -q -- "--bind-to must be cpu or none" "$state/bind.txt" || fail "--bind-to cores not refused"
{ pe compile "$hlo/seed.hlo" --json || [[ $? == 1 ]]; } | python3 -c '
import json, sys
r = json.load(sys.stdin)
assert len(r["cores"]) == 8 and not r["cores"][0]["fits"], r["cores"][0]
assert r["error"]["code"] == "RESOURCE_EXHAUSTED", r["error"]' || fail "compile for the running pod"
pe down >/dev/null

# podemu run: an HLO module as a step with real bytes; the step peaks at what was planned.
pe up --hosts 2 --cores-per-host 4 --hbm 256M --backing host --port 0 >/dev/null
pe run "$hlo/run.hlo" --fill 1.5 --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
sums = {}
for o in r["outputs"]:
    sums.setdefault(o["output"], []).append(o["sum"])
assert sums[0] == [8 * 1024 * 3.0] * 8, sums[0]    # all-gather of 2 x 1.5
assert sums[1] == [1024 * 12.0] * 8, sums[1]       # all-reduce over groups of 4
assert sums[2] == [1024 * 12.0] * 8, sums[2]       # reduce of that
assert sums[3] == [128 * 3.0] * 8, sums[3]         # slice
for c in r["cores"]:
    assert c["peak_bytes_in_use"] == r["planned_peak_bytes"], (c, r["planned_peak_bytes"])' ||
	fail "run run.hlo"
mkdir -p "$state/params"
python3 -c '
import struct, sys
for core in range(8):
    with open("%s/param0.core%d.bin" % (sys.argv[1], core), "wb") as f:
        f.write(struct.pack("<1024f", *([float(core)] * 1024)))' "$state/params"
pe run "$hlo/run.hlo" --param-dir "$state/params" --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
got = [o["sum"] for o in r["outputs"] if o["output"] == 1]
assert got == [1024 * 2.0 * 6] * 4 + [1024 * 2.0 * 22] * 4, got' || fail "run --param-dir"
# A layer: dot, transpose, negate, all-reduce: -(8 x 1 x 1) summed over 8 cores, 64 elements.
pe run "$hlo/layer.hlo" --fill 1 --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
assert [o["sum"] for o in r["outputs"]] == [-64.0 * 64] * 8, r["outputs"]' || fail "run layer.hlo"
# All-gather strategies run as their own instructions, with the values of the all-gather.
for strategy in native via-all-reduce decomposed; do
	pe run "$hlo/strategy.hlo" --fill 1 --all-gather-strategy $strategy --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
got = [o["sum"] for o in r["outputs"]]
assert got == [3072.0, 3072.0, 7168.0, 7168.0, 11264.0, 11264.0, 15360.0, 15360.0], got' ||
		fail "run strategy.hlo --all-gather-strategy $strategy"
done
# FSDP training: the loss falls and matches the host; barriers lower the peak; the agents'
# measured peak equals the plan's in both runs.
PODEMU_STATE_DIR="$state" "$bin/podemu-example-fsdp-mlp" >"$state/fsdp.txt" 2>&1 ||
	fail "fsdp_mlp: $(tail -5 "$state/fsdp.txt")"
python3 - "$state/fsdp.txt" <<'PY' || fail "fsdp_mlp output: $(tail -3 "$state/fsdp.txt")"
import re, sys
text = open(sys.argv[1]).read()
losses = [float(x) for x in re.findall(r"barriers +step +\d+: loss ([0-9.]+)", text)]
assert len(losses) == 40 and losses[19] < 0.9 * losses[0], losses
m = re.search(r"peak HBM per core: (\d+) bytes with barriers, (\d+) without "
              r"\(core 0 measured (\d+) and (\d+)\)", text)
with_b, without, meas_b, meas_p = map(int, m.groups())
assert with_b < without and meas_b == with_b and meas_p == without, m.groups()
PY
# A train step whose updated parameters alias their outputs: the pod writes each update into
# the donated parameter buffer (w2 = w - (m + g) = -1, m2 = m + g = 2 with --fill 1), and the
# cores hold the three parameters and nothing more.
pe run "$hlo/aliased-step.hlo" --fill 1 --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
sums = sorted({(o["output"], o["sum"]) for o in r["outputs"]})
assert sums == [(0, -1048576.0), (1, 2097152.0)], sums
assert r["planned_peak_bytes"] == 3 * 4194304 + 256, r["planned_peak_bytes"]' ||
	fail "run aliased-step.hlo"
# Every kernel family of ops.hlo (see the file), per core: dynamic slices at the replica id.
check_ops() {
	python3 -c '
import json, sys
r = json.load(sys.stdin)
got = {}
for o in r["outputs"]:
    got.setdefault(o["output"], []).append(o["sum"])
near = lambda a, b: abs(a - b) < 1e-4 * max(1, abs(b))
want = {0: 120, 1: 176, 2: 32, 3: 88, 4: 400, 5: 36, 8: 32, 9: 0, 10: 120}
for k, v in want.items():
    assert all(near(x, v) for x in got[k]), (k, got[k])
assert got[6] == [8.0 * c for c in range(8)], got[6]   # row c of a [8,8] iota
assert got[7] == [8.0 * c for c in range(8)], got[7]   # written back at row c'
}
pe run "$hlo/ops.hlo" --fill 2 --json | check_ops >/dev/null || fail "run ops.hlo"
# A temporary in memory space S(5) lives in the agent's host memory, outside HBM, and the
# kernels read it there; tiles as written (see the file for the figures).
pe run "$hlo/spaces.hlo" --fill 2 --json | python3 -c '
import json, math, sys
r = json.load(sys.stdin)
assert r["planned_peak_bytes"] == 2048, r["planned_peak_bytes"]
for o in r["outputs"]:
    assert abs(o["sum"] - 3 * (math.exp(2) + 2)) < 1e-3, o' || fail "run spaces.hlo"
# Control flow with real bytes: a loop calling a computation, then a conditional on the trip
# count; and an all-reduce inside a loop body, run once per trip (figures in the files).
pe run "$hlo/control.hlo" --fill 2 --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
sums = sorted(set((o["output"], o["sum"]) for o in r["outputs"]))
assert sums == [(0, 4096), (1, 4194304)], sums' || fail "run control.hlo"
pe run "$hlo/loop-collective.hlo" --fill 1 --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
assert [o["sum"] for o in r["outputs"]] == [524288] * 8, r["outputs"]' ||
	fail "run loop-collective.hlo"
fused_run() {
	pe run "$hlo/fusion.hlo" --fill 2 --json | python3 -c '
import json, math, sys
r = json.load(sys.stdin)
for o in r["outputs"]:
    assert abs(o["sum"] - 1024 * (math.exp(2) - 2)) < 1e-2, o
print(r["planned_peak_bytes"])'
}
fused_peak=$(fused_run) || fail "run fusion.hlo"
if pe run "$hlo/no-kernel.hlo" >"$state/err.txt" 2>&1; then fail "run of an op without a kernel"; fi
grep -q "UNIMPLEMENTED: node 1: cosine (e, line 5) has no kernel in podemu" "$state/err.txt" ||
	fail "run: $(cat "$state/err.txt")"
pe down >/dev/null
# The same values without the coordinator's passes, and a higher peak without fusion.
pe up --hosts 2 --cores-per-host 4 --hbm 256M --backing host --port 0 --fusion none \
	--scheduler recorded --combine-threshold-bytes 0 >/dev/null
pe run "$hlo/ops.hlo" --fill 2 --json | check_ops >/dev/null || fail "run ops.hlo unfused"
plain_peak=$(fused_run) || fail "run fusion.hlo unfused"
# p and s (the output, a device buffer of its own); unfused also n (e is computed into s's
# buffer, which the add then works on in place).
[ "$fused_peak" -eq 8192 ] && [ "$plain_peak" -eq 12288 ] ||
	fail "fusion.hlo planned peak: $fused_peak fused, $plain_peak unfused"
echo "fusion.hlo planned peak per core: $fused_peak bytes fused, $plain_peak without fusion"
pe down >/dev/null
# Without real bytes, an op without a kernel is planned and accounted like any other
# (unpadded, so that the figures are the shapes' bytes).
pe up --hosts 2 --cores-per-host 4 --hbm 256M --backing none --port 0 --layout none >/dev/null
pe run "$hlo/no-kernel.hlo" --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
assert r["planned_peak_bytes"] == 2 * 256, r      # parameter and result, 256-byte aligned
for c in r["cores"]:
    assert c["peak_bytes_in_use"] == r["planned_peak_bytes"], c' || fail "run --backing none"
# A tuple-shaped op without a kernel (a custom-call): every element planned and accounted.
pe run "$hlo/tuple-op.hlo" --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
# As podemu compile plans it: p, the tuple of the custom-call (elements a and b, and its index
# table, 256 bytes aligned), r, and the index table of the two outputs (a tuple in XLA).
assert r["planned_peak_bytes"] == 1024 + (1024 + 4096 + 256) + 1024 + 256, r
for c in r["cores"]:
    assert c["peak_bytes_in_use"] == r["planned_peak_bytes"], c' || fail "run tuple-op.hlo"
pe down >/dev/null

# Pod scale: a v3-128 is 16 hosts with 8 cores of 16 GiB each (on few CPUs, 4 per agent process).
pe up --topology v3-128 --backing none --port 0 >/dev/null
pe demo --json >"$state/demo.json"
python3 - "$state/demo.json" "$bin" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["world_size"] == 128 and len(d["cores"]) == 128, d
n, receive = d["elements"], d["receive_bytes"]
# The receive slots are what `podemu compile` plans for the same all-gather on a v3-128.
hlo = sys.argv[1] + ".hlo"
open(hlo, "w").write(f"HloModule g\n\nENTRY %m (p: f32[{n}]) -> f32[{n * 128}] {{\n"
                     f"  %p = f32[{n}]{{0}} parameter(0)\n  ROOT %g = f32[{n * 128}]{{0}} "
                     f"all-gather(f32[{n}]{{0}} %p), replica_groups={{}}, dimensions={{0}}\n}}\n")
import subprocess
plan = json.loads(subprocess.run([sys.argv[2] + "/podemu", "compile", hlo, "--topology",
                                  "v3-128", "--json"], capture_output=True, text=True).stdout)
assert 0 < receive == plan["cores"][0]["temp_bytes"], (receive, plan["cores"][0])
for c in d["cores"]:
    assert c["peak_bytes_used"] == n * 4 * 129 + receive, c   # input + 128x output + slots
    assert c["bytes_used"] == n * 4 * 128, c
PY
# A big pod's status: the summary first and alone (every core only with --all).
pe status >"$state/status.txt"
grep -Eq "hosts: 16 of 16 alive (in [0-9]+ agent processes )?\(RSS [0-9.]+M\); 128 cores: 0B in use" \
	"$state/status.txt" ||
	fail "status summary: $(cat "$state/status.txt")"
[[ $(wc -l <"$state/status.txt") -le 4 ]] || fail "status of a v3-128 is not brief"
[[ $(pe status --all | grep -c "^ *[0-9]* *[0-9]* *0 ") -eq 128 ]] || fail "status --all"
pe down >/dev/null

# Progress on a terminal only: through a pseudo-terminal podemu up shows hosts registering,
# through a pipe only its result.
out=$(script -qec "$bin/podemu up --state-dir $state --topology v3-32 --backing none --port 0" \
	/dev/null)
grep -q "podemu up: 4 of 4 hosts registered" <<<"$out" || fail "no progress on a terminal: $out"
pe down >/dev/null
pe up --topology v3-32 --backing none --port 0 2>"$state/up.err" >/dev/null
if grep -q "registered" "$state/up.err"; then fail "progress through a pipe"; fi
pe down >/dev/null
# Several hosts per agent process: a killed process is restarted whole, with its hosts.
pe up --hosts 4 --cores-per-host 1 --hbm 256M --hosts-per-agent 2 --port 0 >/dev/null
[[ $(cat "$state/agent-2.pid") == $(cat "$state/agent-3.pid") &&
	$(cat "$state/agent-0.pid") != $(cat "$state/agent-2.pid") ]] || fail "hosts per agent"
expect "hosts: 4 of 4 alive in 2 agent processes" pe status
kill -9 "$(cat "$state/agent-2.pid")" && gone "$(cat "$state/agent-2.pid")"
restart || fail "process of two hosts not restarted: $(cat "$state/up.txt")"
[[ $(cat "$state/agent-2.pid") == $(cat "$state/agent-3.pid") ]] || fail "restarted host by host"
pe down >/dev/null
# PODEMU_EXIT_WITH=PID: the pod goes away with that process, even one killed outright (as
# ctest ends a test past its timeout; the tests name themselves so).
sleep 120 &
owner=$!
PODEMU_EXIT_WITH=$owner pe up --hosts 2 --cores-per-host 1 --hbm 64M --port 0 >/dev/null
pids=$(cat "$state"/*.pid)
kill -9 "$owner"
wait "$owner" 2>/dev/null || true
for p in $pids; do gone "$p" || fail "process $p outlived PODEMU_EXIT_WITH's process"; done
grep -q "process $owner (PODEMU_EXIT_WITH) exited: shutting down" "$state/coordinator.log" ||
	fail "the coordinator did not say why it stopped"
refused "PODEMU_EXIT_WITH=$owner: no such process" env PODEMU_EXIT_WITH="$owner" \
	"$bin/podemu-coordinator" --listen tcp://127.0.0.1:0
refused "PODEMU_EXIT_WITH=-3: not a process id" env PODEMU_EXIT_WITH=-3 \
	"$bin/podemu-agent" --coordinator tcp://127.0.0.1:1
# A coordinator told to stop while a step waits on a frozen agent stops at once (the call fails
# UNAVAILABLE), not when the step times out: with its loop ended, no lease would run out.
pe up --hosts 2 --cores-per-host 1 --hbm 64M --heartbeat-timeout-ms 10000 --port 0 >/dev/null
frozen=$(cat "$state/agent-1.pid") coordinator=$(cat "$state/coordinator.pid")
kill -STOP "$frozen"
sessions=$(grep -c "opened: podemu" "$state/coordinator.log" || true)
pe demo --elements 1024 >"$state/demo.txt" 2>&1 &
demo=$!
# Its session opens just before its first step goes out to the agents.
for _ in $(seq 500); do
	(($(grep -c "opened: podemu" "$state/coordinator.log") > sessions)) && break
	sleep 0.01
done
sleep 0.5
kill -TERM "$coordinator"
stopped=0
gone "$coordinator" || stopped=$?
kill -CONT "$frozen"
wait "$demo" && fail "a step went through a frozen agent: $(cat "$state/demo.txt")"
((stopped == 0)) || fail "the coordinator waited on a frozen agent after SIGTERM"
grep -q "step failed: UNAVAILABLE: the coordinator is shutting down" "$state/coordinator.log" ||
	fail "the step in flight did not fail as the coordinator stopped"
pe down >/dev/null
echo "it_cli: all checks passed"
