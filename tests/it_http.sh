#!/usr/bin/env bash
# The coordinator's HTTP side with real parts: /metrics passes promtool and a Prometheus server
# scrapes it (a query through its HTTP API returns the per-core bytes the pod reports);
# /api/status is `podemu status --json`; headless Chromium renders the dashboard, whose
# numbers must be the pod's, and saves a screenshot.
# Usage: it_http.sh BIN_DIR [SCREENSHOT]   (exit 77: Prometheus or Chromium not installed)
set -euo pipefail
bin="$1"
shot="${2:-}"
name=http
for tool in prometheus promtool chromium; do
	command -v "$tool" >/dev/null || {
		echo "SKIP: $tool is not installed (deploy/install-deps.sh installs it)"
		exit 77
	}
done
source "$(dirname "$0")/pod_lib.sh"
prom_pid=""
holder=""
trap 'for p in $prom_pid $holder; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; cleanup' EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
get() { python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode(), end="")' "$1"; }

pe up --hosts 2 --cores-per-host 2 --hbm 256M --backing host --port 0 --http-port 0 >/dev/null
url=$(cat "$state/http.url")
expect "dashboard $url" pe status
pe demo --elements 4096 >/dev/null
# Something in use on every core while Prometheus and Chromium look: a client holding 1 MiB.
source "$(dirname "$0")/asan_env.sh"
(asan_preload "$bin/../libpodemu.so" && PYTHONPATH="$bin/../python" PODEMU_STATE_DIR="$state" exec python3 -c '
import time, podemu
pod = podemu.Pod()
held = pod.full([1024, 256], 1.0)
pod.mark_step()
print("held", flush=True)
time.sleep(300)') >"$state/holder.txt" 2>&1 &
holder=$!
for _ in $(seq 1 100); do grep -q held "$state/holder.txt" && break; sleep 0.1; done
grep -q held "$state/holder.txt" || fail "the holding client: $(cat "$state/holder.txt")"

# /metrics: Prometheus' own checker, and the figures podemu status gives.
get "${url}metrics" >"$state/metrics.txt"
promtool check metrics <"$state/metrics.txt" >"$state/promtool.txt" 2>&1 ||
	fail "promtool check metrics: $(cat "$state/promtool.txt")"
pe status --json >"$state/status.json"
python3 - "$state/metrics.txt" "$state/status.json" <<'PY' || fail "metrics differ from podemu status"
import json, re, sys
metrics = open(sys.argv[1]).read()
status = json.load(open(sys.argv[2]))
for c in status["cores"]:
    for metric, field in (("bytes_in_use", "bytes_used"), ("peak_bytes_in_use", "peak_bytes_used"),
                          ("bytes_limit", "bytes_limit")):
        m = re.search(r'^podemu_core_%s\{[^}]*core="%d"\} (\d+)$' % (metric, c["ordinal"]),
                      metrics, re.M)
        assert m and int(m.group(1)) == c[field], (metric, c)
assert re.search(r"^podemu_steps_total ([1-9]\d*)$", metrics, re.M), "no steps counted"
assert all(c["bytes_used"] >= 1 << 20 for c in status["cores"]), status["cores"]
assert re.search(r'^podemu_collective_sent_bytes_total\{op="all-gather"\} [1-9]', metrics, re.M)
assert re.search(r'^podemu_step_duration_seconds_count [1-9]', metrics, re.M)
# The holding client's session, with its 1 MiB per core, in both.
assert re.search(r'^podemu_sessions\{[^}]*\} %d$' % len(status["sessions"]), metrics, re.M)
assert any(s["name"].startswith("python") and s["bytes_per_core"] >= 1 << 20
           for s in status["sessions"]), status["sessions"]
PY
api=$(get "${url}api/status")
python3 - "$api" "$state/status.json" <<'PY' || fail "/api/status differs from podemu status --json"
import json, sys
a, b = json.loads(sys.argv[1]), json.load(open(sys.argv[2]))
assert a["cores"] == b["cores"] and a["topology"] == b["topology"], (a, b)
PY

# A Prometheus server scrapes the pod; its query API gives back the pod's per-core bytes.
prom_port=$(free_port)
cat >"$state/prometheus.yml" <<YML
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: podemu
    static_configs:
      - targets: ["${url#http://}"]
YML
sed -i 's|/"\]$|"]|' "$state/prometheus.yml"
prometheus --config.file="$state/prometheus.yml" --storage.tsdb.path="$state/tsdb" \
	--web.listen-address="127.0.0.1:$prom_port" >"$state/prometheus.log" 2>&1 &
prom_pid=$!
want=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["cores"][3]["bytes_used"])' "$state/status.json")
got=""
for _ in $(seq 1 60); do
	got=$(python3 - "$prom_port" <<'PY' 2>/dev/null || true
import json, sys, urllib.parse, urllib.request
q = urllib.parse.quote('podemu_core_bytes_in_use{core="3"}')
r = json.load(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/api/v1/query?query={q}", timeout=5))
print(r["data"]["result"][0]["value"][1] if r["data"]["result"] else "")
PY
)
	[ -n "$got" ] && break
	sleep 0.5
done
[ "$got" = "$want" ] || fail "Prometheus says core 3 holds '$got' bytes, the pod $want: $(tail -5 "$state/prometheus.log")"
kill "$prom_pid"
wait "$prom_pid" 2>/dev/null || true
prom_pid=""

# Headless Chromium renders the dashboard: its numbers are the pod's.
chrome=(chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage
	--user-data-dir="$state/chrome" --virtual-time-budget=5000)
"${chrome[@]}" --dump-dom "$url" >"$state/dom.html" 2>"$state/chrome.log" ||
	fail "chromium: $(tail -3 "$state/chrome.log")"
python3 - "$state/dom.html" "$state/status.json" <<'PY' || fail "the dashboard shows other numbers than podemu status"
import json, re, sys
dom = open(sys.argv[1]).read()
status = json.load(open(sys.argv[2]))
assert 'data-loaded="1"' in dom, "the page did not load the pod's status"
for c in status["cores"]:
    row = re.search(r'<tr data-core="%d">(.*?)</tr>' % c["ordinal"], dom, re.S)
    assert row, c
    for field in ("bytes_used", "peak_bytes_used", "bytes_limit"):
        v = re.search(r'data-field="%s" data-value="(\d+)"' % field, row.group(1))
        assert v and int(v.group(1)) == c[field], (field, c)
assert re.search(r'data-field="steps_total">[1-9]', dom), "no steps shown"
assert "<polyline" in dom, "no timeline of the last step"
PY
timeline=$(get "${url}api/timeline")
python3 - "$timeline" <<'PY' || fail "/api/timeline: $timeline"
import json, sys
t = json.loads(sys.argv[1])
assert t["step"] > 0 and t["live_bytes"] and t["peak_bytes"] == max(t["live_bytes"]) >= 1 << 20, t
PY
if [ -n "$shot" ]; then
	"${chrome[@]}" --window-size=1100,700 --screenshot="$shot" "$url" >/dev/null 2>&1 ||
		fail "chromium --screenshot"
	[ -s "$shot" ] || fail "no screenshot"
	echo "dashboard screenshot: $shot"
fi
pe down >/dev/null

echo "metrics pass promtool and reach Prometheus; /api/status and the rendered dashboard show the pod's figures"
