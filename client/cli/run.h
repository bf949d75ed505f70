/* `podemu run`: an HLO module's entry computation as a step on the running pod. */
#ifndef PODEMU_CLI_RUN_H
#define PODEMU_CLI_RUN_H

#include <stdbool.h>

struct run_options {
	const char *file;
	double fill;           /* every parameter element, unless param_dir */
	const char *param_dir; /* DIR/param<N>.core<R>.bin: raw row-major bytes per core */
	bool json;
	/*
	 * native (NULL), via-all-reduce or decomposed: all-gathers run as the strategy's own
	 * instructions (compiler/strategy.c), as `podemu compile --no-alias` plans them (the pod
	 * runs an all-reduce into a buffer of its own).
	 */
	const char *all_gather_strategy;
};

/* Returns a process exit code (1: does not fit, 2: cannot run). */
int cmd_run(const struct run_options *o);

#endif
