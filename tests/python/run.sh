#!/usr/bin/env bash
# Runs the Python package's tests with pytest against pods of this build. Usage: run.sh BUILD_DIR
# Uses the first Python that has pytest and NumPy (Debian's python3 does once
# deploy/install-deps.sh ran).
set -euo pipefail
build=$(cd "$1" && pwd)
source "$(dirname "$0")/../asan_env.sh"
asan_preload "$build/libpodemu.so"
for py in /usr/bin/python3 python3; do
	if "$py" -c 'import numpy, pytest' 2>/dev/null; then
		export PYTHONPATH="$build/python" PODEMU_BIN="$build/bin"
		exec "$py" -m pytest -q -p no:cacheprovider "$(dirname "$0")"
	fi
done
echo "FAIL: no python3 with numpy and pytest (deploy/install-deps.sh installs them)" >&2
exit 1
