/* `podemu compile`: the memory plan of an HLO module, as text or JSON. */
#ifndef PODEMU_CLI_COMPILE_H
#define PODEMU_CLI_COMPILE_H

#include <stdbool.h>
#include <stdint.h>

#include "topology.h"

struct compile_options {
	const char *file;
	bool json;
	bool tiled;          /* TPU layouts; false: --layout none */
	int64_t chunk_bytes; /* 0: the default */
	int all_gather;      /* enum ag_strategy */
	bool no_alias;
	int64_t combine_threshold_bytes;
	const char *svg; /* also draw the plan here (podemu mem) */
};

/* Reads, parses and plans the file for topo; returns a process exit code (1: does not fit). */
int cmd_compile(const struct compile_options *o, const struct topology *topo);

#endif
