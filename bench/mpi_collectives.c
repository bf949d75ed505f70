/*
 * The reference for `podemu bench`: the same collectives, sizes and table with Open MPI, so the
 * two can run side by side on one machine.
 *
 *   mpirun -np 4 --mca btl tcp,self podemu-mpi-bench --min-bytes 1M --max-bytes 64M
 *   mpirun -np 8 --mca btl vader,self podemu-mpi-bench
 *
 * Sizes are nccl-tests': the output for all-gather, the input for reduce-scatter, the buffer
 * for all-reduce and all-to-all. Time is the slowest rank's span over --iters back-to-back
 * iterations (after --warmup ones), divided by --iters.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long long parse_size(const char *s)
{
	char *end;
	double v = strtod(s, &end);
	switch (*end) {
	case 'K':
	case 'k':
		v *= 1024;
		break;
	case 'M':
	case 'm':
		v *= 1024 * 1024;
		break;
	case 'G':
	case 'g':
		v *= 1024.0 * 1024 * 1024;
		break;
	}
	return (long long)v;
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	int rank, n;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &n);
	long long min_bytes = 1 << 20, max_bytes = 64 << 20;
	int iters = 5, warmup = 1, factor = 2;
	const char *ops = "all-gather,reduce-scatter,all-reduce";
	for (int i = 1; i + 1 < argc; i += 2) {
		if (strcmp(argv[i], "--min-bytes") == 0)
			min_bytes = parse_size(argv[i + 1]);
		else if (strcmp(argv[i], "--max-bytes") == 0)
			max_bytes = parse_size(argv[i + 1]);
		else if (strcmp(argv[i], "--iters") == 0)
			iters = atoi(argv[i + 1]);
		else if (strcmp(argv[i], "--warmup") == 0)
			warmup = atoi(argv[i + 1]);
		else if (strcmp(argv[i], "--factor") == 0)
			factor = atoi(argv[i + 1]);
		else if (strcmp(argv[i], "--op") == 0)
			ops = argv[i + 1];
	}
	static const char *names[] = {"all-gather", "reduce-scatter", "all-reduce", "all-to-all"};
	if (rank == 0) {
		printf("# mpi bench: %d ranks, %d iters, %d warmup\n", n, iters, warmup);
		printf("# %-18s %12s %12s %10s %9s %9s\n", "op", "size(B)", "count", "time(us)",
		       "algbw", "busbw");
	}
	for (int op = 0; op < 4; op++) {
		if (strstr(ops, names[op]) == NULL)
			continue;
		for (long long bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
			long long elems = bytes / 4 / n * n;
			long long per = elems / n;
			float *in = malloc((size_t)elems * sizeof(float));
			float *out = malloc((size_t)elems * sizeof(float));
			for (long long i = 0; i < elems; i++)
				in[i] = (float)((rank * 7 + i * 3) % 9 - 4);
			memset(out, 0, (size_t)elems * sizeof(float));
			/*
			 * As podemu bench and nccl-tests time: the iterations back to back after
			 * the warm-up ones, each rank's span, the slowest rank's.
			 */
			MPI_Barrier(MPI_COMM_WORLD);
			double t0 = 0;
			for (int it = 0; it < warmup + iters; it++) {
				if (it == warmup)
					t0 = MPI_Wtime();
				if (op == 0)
					MPI_Allgather(in, (int)per, MPI_FLOAT, out, (int)per,
					              MPI_FLOAT, MPI_COMM_WORLD);
				else if (op == 1)
					MPI_Reduce_scatter_block(in, out, (int)per, MPI_FLOAT,
					                         MPI_SUM, MPI_COMM_WORLD);
				else if (op == 2)
					MPI_Allreduce(in, out, (int)elems, MPI_FLOAT, MPI_SUM,
					              MPI_COMM_WORLD);
				else
					MPI_Alltoall(in, (int)per, MPI_FLOAT, out, (int)per,
					             MPI_FLOAT, MPI_COMM_WORLD);
			}
			double span = MPI_Wtime() - t0, total;
			MPI_Reduce(&span, &total, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
			if (rank == 0) {
				double us = total / iters * 1e6;
				double size = (double)elems * 4;
				double algbw = size / us / 1e3;
				double f = op == 2 ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
				printf("  %-18s %12lld %12lld %10.1f %9.3f %9.3f\n", names[op],
				       (long long)size, elems, us, algbw, algbw * f);
				fflush(stdout);
			}
			free(in);
			free(out);
		}
	}
	MPI_Finalize();
	return 0;
}
