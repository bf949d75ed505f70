/*
 * A client of the podemu library: every core uploads its own rows, the pod all-gathers them
 * along dimension 1, and every core's result is checked against the same concatenation done
 * on the host. Then the memory each core used.
 *
 *   podemu up --hosts 2 --cores-per-host 4 --hbm 1G
 *   podemu-example-allgather [ROWS COLS]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "podemu/podemu.h"

int main(int argc, char **argv)
{
	int64_t rows = argc > 2 ? atoll(argv[1]) : 256, cols = argc > 2 ? atoll(argv[2]) : 1024;
	pe_client *c;
	if (pe_connect(&c, NULL) != PE_OK) {
		fprintf(stderr, "connect: %s\n", pe_connect_error());
		return 1;
	}
	int world = pe_world_size(c);
	size_t shard = (size_t)(rows * cols);
	float **data = calloc((size_t)world, sizeof(float *));
	for (int r = 0; r < world; r++) {
		data[r] = malloc(shard * sizeof(float));
		for (size_t i = 0; i < shard; i++)
			data[r][i] = (float)(r * 1000003 + (int64_t)i % 1000003) * 0.5f;
	}
	int64_t dims[] = {rows, cols};
	pe_tensor *x = pe_upload(c, PE_F32, dims, 2, (const void *const *)data);
	pe_tensor *g = pe_all_gather(x, 1);
	pe_release(x); /* not an output: freed after the step that reads it */
	if (g == NULL || pe_mark_step(c) != PE_OK) {
		fprintf(stderr, "step: %s\n", pe_last_error(c));
		return 1;
	}
	size_t out_elems = shard * (size_t)world;
	float *got = malloc(out_elems * sizeof(float));
	int bad = 0;
	for (int r = 0; r < world; r++) {
		int rv = pe_fetch(g, r, got, out_elems * sizeof(float));
		if (rv == PE_FAILED_PRECONDITION) {
			printf("core %d: no backing store, values not checked\n", r);
			continue;
		}
		if (rv != PE_OK) {
			fprintf(stderr, "fetch: %s\n", pe_last_error(c));
			return 1;
		}
		for (int64_t row = 0; row < rows; row++)
			for (int src = 0; src < world; src++)
				bad += memcmp(&got[(size_t)(row * cols * world + src * cols)],
				              &data[src][row * cols],
				              (size_t)cols * sizeof(float)) != 0;
	}
	pe_memory_info mem;
	for (int r = 0; r < world; r++) {
		if (pe_memory_info_get(c, r, &mem) != PE_OK)
			break;
		printf("core %3d: bytes_used %lld peak_bytes_used %lld bytes_limit %lld\n", r,
		       (long long)mem.bytes_used, (long long)mem.peak_bytes_used,
		       (long long)mem.bytes_limit);
	}
	printf("all-gather f32[%lld,%lld] x %d cores along dim 1: %s\n", (long long)rows,
	       (long long)cols, world, bad ? "MISMATCH" : "every core matches the host");
	for (int r = 0; r < world; r++)
		free(data[r]);
	free(data);
	free(got);
	pe_release(g);
	pe_disconnect(c);
	return bad ? 1 : 0;
}
