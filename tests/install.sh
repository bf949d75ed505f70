#!/usr/bin/env bash
# cmake --install gives what a user builds against: client/examples/allgather.c builds out of
# tree against the installed copy with pkg-config and with find_package(podemu), and both
# programs run on a pod that the installed `podemu up` starts from the installed daemons.
# Usage: install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1"
src=$(cd "$2" && pwd)
prefix=$(mktemp -d /tmp/podemu-prefix-XXXXXX)
work=$(mktemp -d /tmp/podemu-outoftree-XXXXXX)
bin="$prefix/bin"
name=install
source "$(dirname "$0")/pod_lib.sh"
trap 'cleanup; rm -rf "$prefix" "$work"' EXIT

cmake --install "$build" --prefix "$prefix" >/dev/null
for f in bin/podemu bin/podemu-coordinator bin/podemu-agent include/podemu/podemu.h; do
	[ -e "$prefix/$f" ] || fail "not installed: $f"
done
libdir=$(dirname "$(find "$prefix" -name libpodemu.so | head -1)")
[ -f "$libdir/pkgconfig/podemu.pc" ] || fail "no podemu.pc in $libdir/pkgconfig"
[ -f "$libdir/cmake/podemu/podemuConfig.cmake" ] || fail "no CMake package in $libdir/cmake"

# Programs built without AddressSanitizer load a sanitized copy only after its runtime.
source "$(dirname "$0")/asan_env.sh"
run() { (asan_preload "$libdir/libpodemu.so" && "$@"); }

# pkg-config, as a Makefile would use it.
export PKG_CONFIG_PATH="$libdir/pkgconfig"
[ "$(pkg-config --modversion podemu)" = "$(sed -n 's/^project(podemu VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")" ] ||
	fail "pkg-config --modversion podemu: $(pkg-config --modversion podemu)"
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror -o "$work/allgather-pc" "$src/client/examples/allgather.c" \
	$(pkg-config --cflags --libs podemu) -Wl,-rpath,"$libdir" || fail "pkg-config build"

# find_package(podemu) in a project of its own.
mkdir -p "$work/cmake"
cat >"$work/cmake/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.18)
project(uses_podemu C)
find_package(podemu 0.1 REQUIRED)
add_executable(allgather-cmake "$src/client/examples/allgather.c")
target_link_libraries(allgather-cmake PRIVATE podemu::podemu)
set_target_properties(allgather-cmake PROPERTIES BUILD_RPATH "$libdir")
CMAKE
cmake -S "$work/cmake" -B "$work/cmake/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null ||
	fail "find_package(podemu)"
cmake --build "$work/cmake/build" >/dev/null || fail "CMake build against the package"

# Both run on a pod of the installed daemons.
pe up --hosts 2 --cores-per-host 2 --hbm 256M --backing host --port 0 >/dev/null
pgrep -f "^$prefix/bin/podemu-agent" >/dev/null || fail "the pod does not run the installed agent"
export PODEMU_STATE_DIR="$state"
for program in "$work/allgather-pc" "$work/cmake/build/allgather-cmake"; do
	run "$program" 64 128 >"$work/out.txt" 2>&1 || fail "$program: $(cat "$work/out.txt")"
	grep -q "x 4 cores along dim 1: every core matches the host" "$work/out.txt" || fail "$program: $(cat "$work/out.txt")"
done
# The Python package beside the library loads the installed libpodemu.so.
pydir=$(dirname "$(find "$prefix" -path '*/dist-packages/podemu/__init__.py' | head -1)")
[ -d "$pydir" ] || fail "the Python package is not installed"
PYTHONPATH=$(dirname "$pydir") run python3 -c '
import sys, podemu
assert podemu._lib.lib._name.startswith(sys.argv[1]), podemu._lib.lib._name
with podemu.Pod() as pod:
    assert pod.world_size == 4, pod.world_size
assert podemu.compile_hlo(sys.argv[2])["cores"][0]["peak_bytes"] == 4831838208' \
	"$prefix" "$src/tests/hlo/seed.hlo" || fail "the installed Python package"
pe down >/dev/null
echo "installed into a prefix; allgather.c built with pkg-config and with find_package(podemu); both ran on a pod of installed daemons; the installed Python package loads the installed library"
