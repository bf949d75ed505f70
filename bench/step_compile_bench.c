/*
 * Compile time of a step on the running pod, first time and from the program cache: records a
 * graph of N nodes (elementwise chains with an all-gather and a reduction every 50 nodes, the
 * shape of a layer loop), asks for its plan (compile-only mark_step) twice, runs it, and then
 * records and runs the same graph again as a training loop's next step would.
 *
 *   podemu up --backing none && podemu-bench-step-compile [NODES]
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "podemu/podemu.h"

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* About n nodes; w is the parameter; returns the step's held result. */
static pe_tensor *record(pe_client *c, pe_tensor *w, int n)
{
	int64_t len = 4096, dim0 = 0;
	pe_tensor *x = pe_add(w, w), *acc = pe_full(c, PE_F32, &len, 1, 0);
	for (int i = 0; i < n / 50; i++) {
		pe_tensor *g = pe_all_gather(x, 0);
		pe_tensor *s = pe_reduce_sum(g, &dim0, 1);
		pe_release(g);
		pe_tensor *b = pe_broadcast(s, &len, 1, NULL);
		pe_release(s);
		for (int k = 0; k < 22; k++) { /* each step of the chain: two nodes */
			pe_tensor *y = pe_multiply(x, b);
			pe_tensor *z = pe_maximum(y, x);
			pe_release(y);
			pe_release(x);
			x = z;
		}
		pe_release(b);
		pe_tensor *next = pe_add(acc, x);
		pe_release(acc);
		acc = next;
	}
	pe_release(x);
	return acc;
}

int main(int argc, char **argv)
{
	int nodes = argc > 1 ? atoi(argv[1]) : 10000;
	pe_client *c;
	if (pe_connect(&c, NULL) != PE_OK) {
		fprintf(stderr, "connect: %s\n", pe_connect_error());
		return 1;
	}
	int64_t len = 4096;
	pe_tensor *w = pe_full(c, PE_F32, &len, 1, 1.0);
	if (pe_mark_step(c) != PE_OK) {
		fprintf(stderr, "step: %s\n", pe_last_error(c));
		return 1;
	}
	printf("%-36s %10s %8s %6s %6s %6s\n", "what", "ms", "cached", "comb", "fused", "nodes");
	for (int round = 0; round < 2; round++) {
		pe_tensor *out = record(c, w, nodes);
		for (int k = 0; k < 2; k++) {
			pe_step_plan p;
			double t0 = now_ms();
			if (pe_plan_step(c, &p) != PE_OK) {
				fprintf(stderr, "plan: %s\n", pe_last_error(c));
				return 1;
			}
			double t1 = now_ms();
			printf("%-36s %10.1f %8s %6d %6d %6d\n",
			       round == 0 && k == 0 ? "plan (compile-only mark_step)"
			                            : "plan again",
			       t1 - t0, p.program_cache_hit ? "yes" : "no", p.combined_collectives,
			       p.fused_nodes, nodes);
		}
		double t0 = now_ms();
		if (pe_mark_step(c) != PE_OK) {
			fprintf(stderr, "step: %s\n", pe_last_error(c));
			return 1;
		}
		printf("%-36s %10.1f\n", round == 0 ? "mark_step" : "mark_step of the next step",
		       now_ms() - t0);
		pe_release(out);
	}
	pe_release(w);
	pe_disconnect(c);
	return 0;
}
