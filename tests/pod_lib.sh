# Shared by the shell tests: one pod in a temporary state directory, always stopped on exit.
# Source it after setting bin (the build's bin directory) and name (the state dir's prefix);
# then `pe CMD ARGS...` runs `podemu CMD --state-dir DIR ARGS...`, `fail WHY` exits 1 and
# `expect PATTERN CMD ARGS...` fails unless CMD succeeds and prints a line matching PATTERN.
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
# A test that ctest kills outright (its timeout) runs no trap: its pods go with it instead.
export PODEMU_EXIT_WITH=$$
pe() { "$bin/podemu" "$1" --state-dir "$state" "${@:2}"; }
fail() {
	echo "FAIL: $*" >&2
	exit 1
}
# Not `CMD | grep -q`: grep leaves early, and a crash shows neither its signal nor its output.
expect() {
	local pattern=$1 out rc=0
	shift
	out=$("$@" 2>&1) || rc=$?
	((rc == 0)) || fail "$* exited with status $rc$( ((rc > 128)) && echo " (signal $((rc - 128)))"): $out"
	grep -Eq -- "$pattern" <<<"$out" || fail "$* printed no line matching '$pattern': $out"
}
# CMD must fail (not crash) and say PATTERN.
refused() {
	local pattern=$1 out rc=0
	shift
	out=$("$@" 2>&1) || rc=$?
	((rc != 0)) || fail "$* succeeded: $out"
	((rc < 128)) || fail "$* died of signal $((rc - 128)): $out"
	grep -Eq -- "$pattern" <<<"$out" || fail "$* printed no line matching '$pattern': $out"
}
