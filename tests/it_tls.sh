#!/usr/bin/env bash
# Mutual TLS on every socket: a pod started with `podemu up --tls` (coordinator, agents and their
# data planes on tls+tcp://) runs a step with real bytes; a client without a certificate, with
# one from another CA, or speaking plain TCP gets nothing. Usage: it_tls.sh BIN_DIR
set -euo pipefail
bin="$1"
command -v openssl >/dev/null || {
	echo "SKIP: openssl is needed to make the test certificates"
	exit 77
}
state=$(mktemp -d /tmp/podemu-tls-XXXXXX)
cleanup() {
	"$bin/podemu" down --state-dir "$state" >/dev/null 2>&1 || true
	rm -rf "$state"
}
trap cleanup EXIT
# A test that ctest kills outright (its timeout) runs no trap: its pods go with it instead.
export PODEMU_EXIT_WITH=$$
fail() {
	echo "FAIL: $*" >&2
	exit 1
}
pe() { "$bin/podemu" "$1" --state-dir "$state" "${@:2}"; }

# A pod CA and one certificate (server and client use) for 127.0.0.1; a second, foreign CA.
certs="$state/certs"
mkdir -p "$certs"
make_ca() {
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
		-subj "/CN=$1" -keyout "$certs/$1.key" -out "$certs/$1.pem" 2>/dev/null
}
make_cert() { # name ca
	openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=127.0.0.1" \
		-keyout "$certs/$1.key" -out "$certs/$1.csr" 2>/dev/null
	printf 'subjectAltName=DNS:127.0.0.1,DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' \
		>"$certs/$1.ext"
	openssl x509 -req -in "$certs/$1.csr" -CA "$certs/$2.pem" -CAkey "$certs/$2.key" \
		-CAcreateserial -days 2 -extfile "$certs/$1.ext" -out "$certs/$1.pem" 2>/dev/null
}
make_ca pod-ca
make_ca other-ca
make_cert node pod-ca
make_cert stranger other-ca
export PODEMU_TLS_CERT="$certs/node.pem" PODEMU_TLS_KEY="$certs/node.key" PODEMU_TLS_CA="$certs/pod-ca.pem"

pe up --tls --hosts 2 --cores-per-host 2 --hbm 1G --backing host --port 0 --http-port 0 >/dev/null
url=$(cat "$state/coordinator.url")
[[ $url == tls+tcp://127.0.0.1:* ]] || fail "coordinator address $url is not tls+tcp"
pe status --json | python3 -c '
import json, sys
s = json.load(sys.stdin)
assert s["ready"], s
for h in s["hosts"]:
    assert h["control_url"].startswith("tls+tcp://") and h["data_url"].startswith("tls+tcp://"), h'
# A step over TLS: every core gathers 4 x 1024 ones from both hosts.
pe demo --elements 1024 --json | python3 -c '
import json, sys
assert [c["sum"] for c in json.load(sys.stdin)["cores"]] == [4096] * 4' || fail "demo over TLS"
# Steps that outlast the coordinator's 100 ms look at the hosts: their replies still arrive.
timeout 60 "$bin/podemu" demo --state-dir "$state" --elements 8000000 --json | python3 -c '
import json, sys
assert [c["sum"] for c in json.load(sys.stdin)["cores"]] == [32000000] * 4' || fail "long steps over TLS"

# No certificate, a certificate of another CA, plain TCP: refused.
if env -u PODEMU_TLS_CERT "$bin/podemu" status --state-dir "$state" >"$state/out" 2>&1; then
	fail "a client without a certificate was answered"
fi
grep -q "PODEMU_TLS_CERT" "$state/out" || fail "no certificate: $(cat "$state/out")"
if PODEMU_TLS_CERT="$certs/stranger.pem" PODEMU_TLS_KEY="$certs/stranger.key" \
	timeout 20 "$bin/podemu" status --state-dir "$state" >"$state/out" 2>&1; then
	fail "a client with a foreign certificate was answered"
fi
echo "foreign certificate: $(tail -n 1 "$state/out")"
if PODEMU_COORDINATOR="tcp://${url#tls+tcp://}" timeout 20 "$bin/podemu" status \
	--state-dir "$state" >"$state/out" 2>&1; then
	fail "a plain TCP client was answered"
fi
echo "plain TCP: $(tail -n 1 "$state/out")"
# Metrics and the dashboard of a pod on TLS: HTTPS with the pod's certificate, not plain HTTP.
http=$(cat "$state/http.url")
[[ $http == https://127.0.0.1:* ]] || fail "the dashboard of a TLS pod is at $http"
python3 - "$http" "$certs/pod-ca.pem" <<'PY' || fail "HTTPS metrics"
import ssl, sys, urllib.request
url, ca = sys.argv[1], sys.argv[2]
body = urllib.request.urlopen(url + "metrics", context=ssl.create_default_context(cafile=ca),
                              timeout=10).read().decode()
assert "podemu_core_bytes_in_use" in body, body[:200]
try:
    urllib.request.urlopen(url.replace("https://", "http://") + "metrics", timeout=5).read()
    raise AssertionError("plain HTTP was answered")
except (OSError, ValueError) as e:
    print("plain HTTP to the dashboard:", type(e).__name__)
try:
    urllib.request.urlopen(url + "metrics", timeout=5).read()  # without the pod CA
    raise AssertionError("a client that does not trust the pod CA got an answer")
except ssl.SSLError:
    pass
except OSError as e:
    assert "CERTIFICATE_VERIFY_FAILED" in str(e), e
PY
# The pod is unharmed.
pe status >/dev/null || fail "status after the refused clients"
pe down >/dev/null
echo "it_tls: all checks passed"
