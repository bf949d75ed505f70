#!/usr/bin/env bash
# Runs the Python package's tests with pytest against pods of this build. Usage: run.sh BUILD_DIR
# Uses the first Python that has pytest and NumPy (Debian's python3 does once
# deploy/install-deps.sh ran).
set -euo pipefail
build=$(cd "$1" && pwd)
# A library built with AddressSanitizer (the sanitizer build) loads into Python only after
# its runtime; CPython's own allocations are not leaks worth reporting.
asan=$(ldd "$build/libpodemu.so" 2>/dev/null | awk '/libasan/ {print $3}')
if [ -n "$asan" ]; then
	export LD_PRELOAD="$asan" ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"
fi
for py in /usr/bin/python3 python3; do
	if "$py" -c 'import numpy, pytest' 2>/dev/null; then
		export PYTHONPATH="$build/python" PODEMU_BIN="$build/bin"
		exec "$py" -m pytest -q -p no:cacheprovider "$(dirname "$0")"
	fi
done
echo "FAIL: no python3 with numpy and pytest (deploy/install-deps.sh installs them)" >&2
exit 1
