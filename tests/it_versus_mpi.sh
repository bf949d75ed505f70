#!/bin/bash
# bench/versus_mpi.sh end to end, small: one round of a 4x1 pod against Open MPI over TCP, a
# table row for every op and size with both sides measured and podemu's check passing, and
# the loopback TCP ceiling under it (the script measures; this checks that it works at all).
# Skips where Open MPI is not installed (or the build is sanitized, which leaves
# podemu-mpi-bench out).
#
#   tests/it_versus_mpi.sh BIN_DIR
set -euo pipefail
# Should ctest kill this test outright (its timeout), the pods go with it.
export PODEMU_EXIT_WITH=$$
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
if [[ ! -x $bin/podemu-mpi-bench ]] || ! command -v mpirun >/dev/null; then
	echo "SKIP: needs Open MPI (mpirun and podemu-mpi-bench, built where an MPI compiler is)"
	exit 77
fi
out=$(BENCH_ARGS="--op all-gather,all-reduce --min-bytes 64K --max-bytes 256K --factor 4 --iters 3" \
	bash "$here/../bench/versus_mpi.sh" "$bin" tcp 1)
echo "$out"
rows=$(echo "$out" | grep -cE '^\| (all-gather|all-reduce) \| (64|256) KiB \| [0-9.]+ \(.*\) \| [0-9.]+ \(.*\) \| [0-9.]+x \| [a-z-]+ \|$')
[[ $rows -eq 4 ]] || { echo "FAIL: $rows of 4 rows measured on both sides and checked" >&2; exit 1; }
echo "$out" | grep -qE '^busbw ceiling of loopback TCP for 4 ranks on these CPUs .*: [0-9.]+ \([0-9.]+\)$' ||
	{ echo "FAIL: no loopback TCP ceiling (podemu-bench-tcp-floor) under the table" >&2; exit 1; }
echo "PASS"
