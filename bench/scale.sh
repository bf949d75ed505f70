#!/bin/bash
# Pod scale on this machine: for each topology, `podemu up --backing none` and `podemu demo`
# (the seed scenario on every core), their wall time, whether every core reported its exact
# bytes, and the resident memory of the pod's processes summed, read while the pod is up.
#
#   bench/scale.sh [BIN_DIR] [TOPOLOGY...]     (default: build/bin, v3-128 v4-256 v4-512 v4-1024)
#
# PODEMU_UP_ARGS adds `podemu up` options (e.g. --hosts-per-agent 1 for one process per host).
#
# Each pod runs in a temporary state directory and is stopped before the next one starts.
set -u
bin=${1:-build/bin}
shift || true
topologies=("$@")
[[ ${#topologies[@]} -gt 0 ]] || topologies=(v3-128 v4-256 v4-512 v4-1024)
state=$(mktemp -d /tmp/podemu-scale-XXXXXX)
trap '"$bin/podemu" down --state-dir "$state" >/dev/null 2>&1 || true; rm -rf "$state"' EXIT

now() { date +%s.%N; }

# The pod's processes (an agent process with several hosts has a pid file for each).
pod_pids() { cat "$state"/*.pid 2>/dev/null | sort -u; }

# Resident KiB of the pod's processes, summed.
pod_rss_kib() {
	local total=0 pid kib
	for pid in $(pod_pids); do
		kib=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null) || continue
		total=$((total + ${kib:-0}))
	done
	echo "$total"
}

printf '%-10s %6s %9s %8s %8s %10s  %s\n' topology world processes up_s demo_s rss_mib result
for t in "${topologies[@]}"; do
	t0=$(now)
	# shellcheck disable=SC2086
	if ! "$bin/podemu" up --state-dir "$state" --topology "$t" --backing none --port 0 \
		--timeout-ms 600000 ${PODEMU_UP_ARGS:-} >"$state/up.out" 2>&1; then
		printf '%-10s %6s %9s %8s %8s %10s  %s\n' "$t" - - - - - \
			"up failed: $(tail -1 "$state/up.out")"
		"$bin/podemu" down --state-dir "$state" >/dev/null 2>&1
		continue
	fi
	t1=$(now)
	rss=$(pod_rss_kib)
	processes=$(pod_pids | wc -l)
	if "$bin/podemu" demo --state-dir "$state" --json >"$state/demo.json" 2>"$state/demo.err"; then
		result=$(python3 - "$state/demo.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
n, w, receive = d["elements"], d["world_size"], d["receive_bytes"]
exact = len(d["cores"]) == w and all(
    c["bytes_used"] == n * 4 * w and c["peak_bytes_used"] == n * 4 * (w + 1) + receive
    for c in d["cores"])
print("every core exact" if exact else "WRONG bytes")
PY
)
		world=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["world_size"])' \
			"$state/demo.json")
	else
		result="demo failed: $(tail -1 "$state/demo.err")"
		world=-
	fi
	t2=$(now)
	r=$(pod_rss_kib)
	[[ $r -gt $rss ]] && rss=$r
	printf '%-10s %6s %9d %8.1f %8.1f %10d  %s\n' "$t" "$world" "$processes" \
		"$(echo "$t1 - $t0" | bc)" "$(echo "$t2 - $t1" | bc)" $((rss / 1024)) "$result"
	"$bin/podemu" down --state-dir "$state" >/dev/null 2>&1
done
