#!/bin/bash
# podemu's collectives against Open MPI's on this machine, side by side: ROUNDS rounds, in each
# every pass (the ops at one size) runs on a fresh local pod (`podemu bench --check`) and then
# under `mpirun` (podemu-mpi-bench) with the same options, alternating so that both see the
# same machine. Prints each row's median busbw (GB/s) with every round's, and the ratio of the
# medians; over TCP also the busbw that loopback TCP allows 4 ranks on these CPUs at all
# (podemu-bench-tcp-floor, once a round).
#
#   bench/versus_mpi.sh [BIN_DIR] [tcp|shm] [ROUNDS]     (default: build/bin tcp 3)
#
#   tcp: 4 agents x 1 core over TCP loopback against 4 ranks over `--mca btl tcp,self`
#   shm: 1 agent x 8 cores against 8 ranks over shared memory, `--mca btl vader,self`
#
# By default all-gather, reduce-scatter and all-reduce of 1, 4, 16 and 64 MiB, each size with
# 256 MiB / size iterations but at least 20 (so that a small size's figure is not one
# scheduler hiccup: 20 iterations of 1 MiB take about 10 ms). BENCH_ARGS replaces all that
# with one set of bench options for both sides. Needs Open MPI (`apt-get install
# libopenmpi-dev openmpi-bin`) before building, so that podemu-mpi-bench exists.
set -u
bin=${1:-build/bin}
setting=${2:-tcp}
rounds=${3:-3}
# One pass of `podemu bench` and of podemu-mpi-bench per entry, with the same options.
passes=()
if [[ -n ${BENCH_ARGS:-} ]]; then
	passes=("$BENCH_ARGS")
else
	for mib in 1 4 16 64; do
		iters=$((256 / mib > 20 ? 256 / mib : 20))
		passes+=("--op all-gather,reduce-scatter,all-reduce --min-bytes ${mib}M --max-bytes ${mib}M --iters $iters")
	done
fi
case $setting in
tcp) up=(--hosts 4 --cores-per-host 1) mpi=(-np 4 --mca btl tcp,self) ;;
shm) up=(--hosts 1 --cores-per-host 8) mpi=(-np 8 --mca btl vader,self) ;;
*)
	echo "usage: bench/versus_mpi.sh [BIN_DIR] [tcp|shm] [ROUNDS]" >&2
	exit 2
	;;
esac
if [[ ! -x $bin/podemu-mpi-bench ]] || ! command -v mpirun >/dev/null; then
	echo "bench/versus_mpi.sh: needs mpirun and $bin/podemu-mpi-bench (install Open MPI, rebuild)" >&2
	exit 2
fi
root=()
[[ $(id -u) == 0 ]] && root=(--allow-run-as-root)
state=$(mktemp -d /tmp/podemu-versus-XXXXXX)
trap '"$bin/podemu" down --state-dir "$state/pod" >/dev/null 2>&1 || true; rm -rf "$state"' EXIT

for r in $(seq 1 "$rounds"); do
	# Each pass on a fresh pod and then under mpirun, seconds apart: this machine's speed
	# drifts over a minute by more than the two sides differ.
	for p in "${!passes[@]}"; do
		mkdir -p "$state/pod"
		"$bin/podemu" up --state-dir "$state/pod" "${up[@]}" --hbm 2G --port 0 >/dev/null || exit 1
		# shellcheck disable=SC2086
		"$bin/podemu" bench --state-dir "$state/pod" ${passes[$p]} --check --json \
			>"$state/podemu.$r.$p" || exit 1
		"$bin/podemu" down --state-dir "$state/pod" >/dev/null
		# shellcheck disable=SC2086
		mpirun "${root[@]}" --oversubscribe "${mpi[@]}" "$bin/podemu-mpi-bench" ${passes[$p]} \
			>"$state/mpi.$r.$p" 2>"$state/mpi.err" || {
			cat "$state/mpi.err" >&2
			exit 1
		}
	done
	# Over TCP: what loopback TCP lets any 4 ranks on these CPUs reach, this round.
	if [[ $setting == tcp && -x $bin/podemu-bench-tcp-floor ]]; then
		"$bin/podemu-bench-tcp-floor" 1024 4 1 | awk '/ceiling/ {print $(NF - 1)}' \
			>"$state/ceiling.$r"
	fi
	echo "round $r of $rounds done" >&2
done

python3 - "$state" "$rounds" "$setting" <<'PY'
import glob, json, statistics, sys

state, rounds, setting = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def podemu_rows(path):
    """podemu bench --json: busbw, whether the check ran and passed, the algorithm."""
    return {(row["op"], row["bytes"]): (row["busbw_gbps"], row["checked"] and row["ok"],
                                        row["algorithm"])
            for row in json.load(open(path))["rows"]}

def mpi_rows(path):
    """podemu-mpi-bench's table: op, size, count, time, algbw, busbw."""
    return {(f[0], int(f[1])): float(f[5])
            for f in (line.split() for line in open(path) if not line.startswith("#"))
            if len(f) >= 6}

def rounds_of(side, read):
    """Each round's rows, every pass of it in one dict, sizes in the order they ran."""
    out = []
    for r in range(1, rounds + 1):
        rows = {}
        passes = glob.glob(f"{state}/{side}.{r}.*")
        for path in sorted(passes, key=lambda p: int(p.rsplit(".", 1)[1])):
            rows.update(read(path))
        out.append(rows)
    return out

pod = rounds_of("podemu", podemu_rows)
mpi = rounds_of("mpi", mpi_rows)
print(f"# {setting}: {rounds} alternating rounds, busbw in GB/s, median (every round)")
print("| op | size | podemu | Open MPI | podemu / MPI | algorithm |")
print("|---|---|---|---|---|---|")
ops = list(dict.fromkeys(op for op, _ in pod[0]))
for key in sorted(pod[0], key=lambda k: (ops.index(k[0]), k[1])):
    op, size = key
    p = [x[key][0] for x in pod if key in x]
    m = [x[key] for x in mpi if key in x]
    failed = sum(1 for x in pod if key in x and not x[key][1])
    algos = sorted({x[key][2] for x in pod if key in x})
    pm, mm = statistics.median(p), statistics.median(m) if m else 0.0
    ratio = f"{pm / mm:.2f}x" if mm > 0 else "-"
    check = f" (check failed in {failed} rounds)" if failed else ""
    size_text = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
    print(f"| {op} | {size_text} | {pm:.3f} ({', '.join(f'{v:.3f}' for v in p)}) | "
          f"{mm:.3f} ({', '.join(f'{v:.3f}' for v in m)}) | {ratio} | {'/'.join(algos)}{check} |")

ceilings = []
for r in range(1, rounds + 1):
    try:
        ceilings.append(float(open(f"{state}/ceiling.{r}").read()))
    except (OSError, ValueError):
        pass
if ceilings:
    print(f"\nbusbw ceiling of loopback TCP for 4 ranks on these CPUs (podemu-bench-tcp-floor): "
          f"{statistics.median(ceilings):.3f} ({', '.join(f'{v:.3f}' for v in ceilings)})")
PY
