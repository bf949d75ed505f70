# Shared by the shell tests: one pod in a temporary state directory, always stopped on exit.
# Source it after setting bin (the build's bin directory) and name (the state dir's prefix);
# then `pe CMD ARGS...` runs `podemu CMD --state-dir DIR ARGS...` and `fail WHY` exits 1.
state=$(mktemp -d "/tmp/podemu-$name-XXXXXX")
cleanup() {
	"$bin/podemu" down --state-dir "$state" >/dev/null 2>&1 || true
	rm -rf "$state"
}
trap cleanup EXIT
pe() { "$bin/podemu" "$1" --state-dir "$state" "${@:2}"; }
fail() {
	echo "FAIL: $*" >&2
	exit 1
}
