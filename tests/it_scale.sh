#!/bin/bash
# A pod-scale pod on this machine (--backing none): `podemu up` packs its hosts into few agent
# processes and `podemu demo` runs the seed scenario on every core, each reporting its exact
# bytes (bench/scale.sh measures; this checks that it works at all).
#
#   tests/it_scale.sh BIN_DIR TOPOLOGY
set -euo pipefail
# Should ctest kill this test outright (its timeout), the pods go with it.
export PODEMU_EXIT_WITH=$$
bin=$1 topology=$2
here=$(cd "$(dirname "$0")" && pwd)
out=$(bash "$here/../bench/scale.sh" "$bin" "$topology")
echo "$out"
row=$(echo "$out" | awk -v t="$topology" '$1 == t')
[[ $row == *"every core exact"* ]] || { echo "FAIL: $topology: $row" >&2; exit 1; }
# 16 processes per CPU at most, plus the coordinator.
cpus=$(nproc)
processes=$(echo "$row" | awk '{print $3}')
[[ $processes -le $((16 * cpus + 1)) ]] || { echo "FAIL: $processes processes" >&2; exit 1; }
echo "PASS: $topology"
