# Shared by the shell tests: one pod in a temporary state directory, always stopped on exit.
# Source it after setting bin (the build's bin directory) and name (the state dir's prefix);
# then `pe CMD ARGS...` runs `podemu CMD --state-dir DIR ARGS...` and `fail WHY` exits 1.
state=$(mktemp -d "/tmp/podemu-$name-XXXXXX")
cleanup() {
	# Should `podemu down` itself fail (a binary rebuilt under the test, say), its pid files
	# still name what to stop.
	if ! "$bin/podemu" down --state-dir "$state" >/dev/null 2>&1; then
		for f in "$state"/*.pid; do
			[ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null
		done
	fi
	rm -rf "$state"
}
trap cleanup EXIT
pe() { "$bin/podemu" "$1" --state-dir "$state" "${@:2}"; }
fail() {
	echo "FAIL: $*" >&2
	exit 1
}
