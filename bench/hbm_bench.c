/*
 * The HBM heap's cost with many buffers: OPS allocations of random sizes (256 B to 256 KiB)
 * interleaved with frees of random live buffers on a 16 GiB core without backing, then every
 * buffer freed; prints the time and the statistics (checked against a running sum).
 *
 *   podemu-bench-hbm [OPS] [MAX_LIVE]    (default 100000, no limit: up to ~2/3 of OPS live)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hbm.h"

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	int ops = argc > 1 ? atoi(argv[1]) : 100000;
	int max_live = argc > 2 ? atoi(argv[2]) : ops;
	if (ops < 1 || max_live < 1) {
		fprintf(stderr, "usage: podemu-bench-hbm [OPS >= 1] [MAX_LIVE]\n");
		return 2;
	}
	struct hbm_buffer *live = malloc((size_t)ops * sizeof(*live));
	int64_t *sizes = malloc((size_t)ops * sizeof(int64_t));
	struct hbm h;
	struct status st;
	if (live == NULL || sizes == NULL || hbm_init(&h, (int64_t)16 << 30, false, &st) != ST_OK)
		return 1;
	/* Its own arrays are touched first: their page faults are not the heap's. */
	memset(live, 0, (size_t)ops * sizeof(*live));
	memset(sizes, 0, (size_t)ops * sizeof(int64_t));
	unsigned seed = 1;
	int n = 0, peak = 0, failed = 0;
	int64_t expect = 0;
	double t0 = now_s();
	for (int i = 0; i < ops; i++) {
		seed = seed * 1103515245u + 12345u;
		/* Two allocations for each free while it grows: tens of thousands live at once. */
		if (n > 0 && ((seed >> 8) % 3 == 0 || n >= max_live)) {
			int k = (int)((seed >> 10) % (unsigned)n);
			hbm_free(&h, live[k]);
			expect -= sizes[k];
			live[k] = live[--n];
			sizes[k] = sizes[n];
		}
		int64_t size = 256 + (int64_t)((seed >> 4) % (1 << 18));
		struct hbm_buffer at;
		if (hbm_alloc(&h, size, &at, &st) != ST_OK) {
			failed++;
			continue;
		}
		live[n] = at;
		sizes[n++] = hbm_aligned_size(size);
		expect += hbm_aligned_size(size);
		peak = n > peak ? n : peak;
	}
	struct hbm_stats s;
	hbm_get_stats(&h, &s);
	int exact = s.bytes_in_use == expect;
	while (n > 0)
		hbm_free(&h, live[--n]);
	double t1 = now_s();
	hbm_get_stats(&h, &s);
	exact = exact && s.bytes_in_use == 0;
	printf("%d allocations (%d refused) and as many frees, up to %d buffers live: %.1f ms; "
	       "statistics %s\n",
	       ops - failed, failed, peak, (t1 - t0) * 1e3, exact ? "exact" : "WRONG");
	hbm_destroy(&h);
	free(live);
	free(sizes);
	return exact ? 0 : 1;
}
