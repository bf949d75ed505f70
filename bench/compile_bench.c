/*
 * Compile-time benchmark: an HLO module of N instructions (default 10,000) shaped like a
 * transformer step as XLA prints it (parameters, elementwise chains, reshapes, all-gathers and
 * reduce-scatters, metadata on every line), parsed and planned for a v3-128, R times. Prints the
 * text size and the best and median time of parsing, planning and both.
 *
 * usage: podemu-bench-compile [N [R]]
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "hlo.h"
#include "memplan.h"

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static long faults(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_minflt;
}

static int cmp(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;
	return a < b ? -1 : a > b;
}

/* Appends one formatted line to the growing text. */
static void put(char **text, size_t *len, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void put(char **text, size_t *len, size_t *cap, const char *fmt, ...)
{
	va_list ap;
	for (;;) {
		va_start(ap, fmt);
		int n = vsnprintf(*text + *len, *cap - *len, fmt, ap);
		va_end(ap);
		if (n >= 0 && (size_t)n < *cap - *len) {
			*len += (size_t)n;
			return;
		}
		*cap *= 2;
		*text = realloc(*text, *cap);
		if (*text == NULL)
			exit(1);
	}
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 10000;
	int rounds = argc > 2 ? atoi(argv[2]) : 5;
	if (n < 10 || rounds < 1) {
		fprintf(stderr, "usage: podemu-bench-compile [N>=10 [ROUNDS]]\n");
		return 2;
	}
	size_t len = 0, cap = 1 << 20;
	char *text = malloc(cap);
	put(&text, &len, &cap, "HloModule bench_%d, is_scheduled=true\n\n", n);
	put(&text, &len, &cap,
	    "%%sum (a: f32[], b: f32[]) -> f32[] {\n  %%a = f32[] parameter(0)\n"
	    "  %%b = f32[] parameter(1)\n  ROOT %%s = f32[] add(%%a, %%b)\n}\n\n");
	put(&text, &len, &cap, "ENTRY %%main {\n");
	int params = 16;
	for (int i = 0; i < params; i++)
		put(&text, &len, &cap,
		    "  %%p.%d = f32[65536]{0} parameter(%d), "
		    "metadata={op_type=\"xla__device_data\" "
		    "op_name=\"xla__device_data\"}\n",
		    i, i);
	int prev = 0;
	char kind[8] = "p";
	for (int i = params; i < n - 1; i++) {
		int k = i % 7;
		if (k == 0)
			put(&text, &len, &cap,
			    "  %%v.%d = f32[524288]{0} all-gather(f32[65536]{0} %%p.%d), "
			    "channel_id=%d, "
			    "replica_groups=[16,8]<=[128], dimensions={0}, "
			    "use_global_device_ids=true, "
			    "metadata={op_type=\"xla__all_gather\" op_name=\"layer_%d\"}\n",
			    i, i % params, i, i);
		else if (k == 3)
			put(&text, &len, &cap,
			    "  %%v.%d = f32[65536]{0} reduce-scatter(f32[524288]{0} %%v.%d), "
			    "channel_id=%d, "
			    "replica_groups=[16,8]<=[128], dimensions={0}, to_apply=%%sum\n",
			    i, prev, i);
		else if (k == 5)
			put(&text, &len, &cap,
			    "  %%v.%d = f32[512,1024]{1,0} reshape(f32[524288]{0} %%v.%d)\n", i,
			    prev);
		else if (k == 6)
			put(&text, &len, &cap,
			    "  %%v.%d = f32[524288]{0} reshape(f32[512,1024]{1,0} %%v.%d)\n", i,
			    prev);
		else
			put(&text, &len, &cap,
			    "  %%v.%d = f32[%s]{0} multiply(f32[%s]{0} %%%s.%d, f32[%s]{0} "
			    "%%%s.%d), "
			    "metadata={op_type=\"aten__mul\" op_name=\"mul\" "
			    "source_file=\"model.py\" "
			    "source_line=%d}\n",
			    i, k == 4 ? "65536" : "524288", k == 4 ? "65536" : "524288", kind, prev,
			    k == 4 ? "65536" : "524288", kind, prev, i);
		prev = i;
		strcpy(kind, "v");
	}
	put(&text, &len, &cap, "  ROOT %%out = f32[524288]{0} negate(%%v.%d)\n}\n", prev);

	struct topology topo;
	struct status st;
	topology_from_preset(&topo, "v3-128", &st);
	double *parse_s = calloc((size_t)rounds, sizeof(double));
	double *plan_s = calloc((size_t)rounds, sizeof(double));
	double *total_s = calloc((size_t)rounds, sizeof(double));
	int64_t peak = 0;
	int instructions = 0;
	for (int r = 0; r < rounds; r++) {
		struct arena *a = arena_new();
		struct hlo_module m;
		struct memplan p;
		struct memplan_options o = {.tiled = true};
		long f0 = faults();
		double t0 = now_s();
		if (hlo_parse(text, len, a, &m, &st) != ST_OK) {
			fprintf(stderr, "parse: %s\n", st.message);
			return 1;
		}
		double t1 = now_s();
		long f1 = faults();
		if (memplan_build(&p, &m, &topo, &o, a, &st) != ST_OK) {
			fprintf(stderr, "plan: %s\n", st.message);
			return 1;
		}
		double t2 = now_s();
		if (r == 0)
			printf("page faults: parse %ld, plan %ld\n", f1 - f0, faults() - f1);
		parse_s[r] = t1 - t0;
		plan_s[r] = t2 - t1;
		total_s[r] = t2 - t0;
		peak = p.peak_bytes;
		instructions = m.entry->n_instructions;
		arena_free(a);
	}
	qsort(parse_s, (size_t)rounds, sizeof(double), cmp);
	qsort(plan_s, (size_t)rounds, sizeof(double), cmp);
	qsort(total_s, (size_t)rounds, sizeof(double), cmp);
	printf("compile %d instructions (%.2f MiB of HLO text) for v3-128, %d rounds:\n",
	       instructions, (double)len / (1 << 20), rounds);
	printf("  parse  best %7.1f ms  median %7.1f ms\n", parse_s[0] * 1e3,
	       parse_s[rounds / 2] * 1e3);
	printf("  plan   best %7.1f ms  median %7.1f ms\n", plan_s[0] * 1e3,
	       plan_s[rounds / 2] * 1e3);
	printf("  total  best %7.1f ms  median %7.1f ms  (peak %lld bytes per core)\n",
	       total_s[0] * 1e3, total_s[rounds / 2] * 1e3, (long long)peak);
	free(parse_s);
	free(plan_s);
	free(total_s);
	free(text);
	return 0;
}
