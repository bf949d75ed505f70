/* `podemu bench`: collective bandwidth on the running pod, nccl-tests style. */
#ifndef PODEMU_CLI_BENCH_H
#define PODEMU_CLI_BENCH_H

#include <stdint.h>

#include "podemu/podemu.h"

struct bench_options {
	const char *ops; /* comma-separated op names */
	int64_t min_bytes;
	int64_t max_bytes;
	int factor;
	const char *dtype;
	int iters;
	int warmup;
	const char *groups;
	const char *mesh;
	const char *axis;
	int check;
	int json;
	int no_bytes; /* time a pod without bytes anyway (--no-bytes) */
};

/* Runs the benchmark and prints its table (or JSON); returns a process exit code. */
int bench_run(pe_client *c, const struct bench_options *o);

#endif
