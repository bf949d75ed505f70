/*
 * Latency of cached steps through the client library: a small training-loop step (an
 * all-reduce of a gradient and an update of the weights the client keeps; `train`) or one
 * `add` of the weights and a constant (`add`), recorded and run again and again, as torch_xla's
 * loop does after its first step; prints p50, p90, p99 and the mean of mark_step's wall time
 * (the first, compiled, step is left out). With `async`, each step is sent by
 * pe_mark_step_async, which waits only for the step before it: its time is then the loop's
 * period, what a training loop that does not read its results sees per step (the last step is
 * waited for, and counted, at the end).
 *
 *   podemu up --topology v3-8 --backing none &&
 *   podemu-bench-step-latency [STEPS] [ELEMENTS] [train|add] [sync|async]
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "podemu/podemu.h"

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int by_value(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	int steps = argc > 1 ? atoi(argv[1]) : 200;
	int64_t n = argc > 2 ? atoll(argv[2]) : 1024;
	const char *kind = argc > 3 ? argv[3] : "train";
	bool train = strcmp(kind, "train") == 0;
	const char *mode = argc > 4 ? argv[4] : "sync";
	bool async = strcmp(mode, "async") == 0;
	if (steps < 2 || n < 1 || (!train && strcmp(kind, "add") != 0) ||
	    (!async && strcmp(mode, "sync") != 0)) {
		fprintf(stderr, "usage: podemu-bench-step-latency [STEPS >= 2] [ELEMENTS] "
		                "[train|add] [sync|async]\n");
		return 2;
	}
	pe_client *c;
	if (pe_connect(&c, NULL) != PE_OK) {
		fprintf(stderr, "connect: %s\n", pe_connect_error());
		return 1;
	}
	pe_tensor *w = pe_full(c, PE_F32, &n, 1, 1.0);
	double *us = calloc((size_t)steps, sizeof(double));
	int hits = 0;
	for (int i = 0; us != NULL && i <= steps; i++) {
		if (!train) { /* w = w + 1 */
			pe_tensor *one = pe_full(c, PE_F32, &n, 1, 1.0);
			pe_tensor *next = pe_add(w, one);
			pe_release(one);
			pe_release(w);
			w = next;
		} else {
			/* grad = all-reduce(w * 0.5) / world; w = w - 0.01 grad */
			pe_tensor *half = pe_full(c, PE_F32, &n, 1, 0.5);
			pe_tensor *g = pe_multiply(w, half);
			pe_release(half);
			pe_tensor *r =
			    pe_all_reduce(g, PE_REDUCE_SUM, 1.0 / pe_world_size(c), NULL);
			pe_release(g);
			pe_tensor *lr = pe_full(c, PE_F32, &n, 1, 0.01);
			pe_tensor *step = pe_multiply(r, lr);
			pe_release(lr);
			pe_release(r);
			pe_tensor *next = pe_subtract(w, step);
			pe_release(step);
			pe_release(w);
			w = next;
		}
		double t0 = now_us();
		/* The first step compiles (and is waited for); the others come from the cache. */
		int rv = async && i > 0 ? pe_mark_step_async(c) : pe_mark_step(c);
		if (rv == PE_OK && async && i == steps)
			rv = pe_wait_device_ops(c);
		if (rv != PE_OK) {
			fprintf(stderr, "step %d: %s\n", i, pe_last_error(c));
			return 1;
		}
		if (i > 0)
			us[i - 1] = now_us() - t0;
		hits += i > 0;
	}
	qsort(us, (size_t)steps, sizeof(double), by_value);
	double sum = 0;
	for (int i = 0; i < steps; i++)
		sum += us[i];
	printf("%s, %d cores on %d hosts: %d cached steps of %s f32[%lld]%s%s\n", pe_topology(c),
	       pe_world_size(c), pe_num_hosts(c), hits, train ? "an all-reduce of" : "one add of",
	       (long long)n, train ? " and an update" : "",
	       async ? ", sent by mark_step_async" : "");
	printf("%s (us): p50 %.0f  p90 %.0f  p99 %.0f  mean %.0f  max %.0f\n",
	       async ? "step period" : "mark_step latency", us[steps / 2], us[steps * 9 / 10],
	       us[steps * 99 / 100], sum / steps, us[steps - 1]);
	free(us);
	pe_release(w);
	pe_disconnect(c);
	return 0;
}
