/* `podemu compile`: the memory plan of an HLO module, as text or JSON. */
#ifndef PODEMU_CLI_COMPILE_H
#define PODEMU_CLI_COMPILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "topology.h"

struct compile_options {
	const char *file;
	bool json;
	bool tiled;          /* TPU layouts; false: --layout none */
	int64_t chunk_bytes; /* 0: the default */
	int all_gather;      /* enum ag_strategy */
	bool no_alias;
	int64_t combine_threshold_bytes;
	bool no_fusion;
	bool recorded_order;
	const char *svg; /* also draw the plan here (podemu mem) */
};

/* A whole file (HLO text, at most 256 MiB), malloc'd; NULL with st set. */
char *cli_read_file(const char *path, size_t *len, struct status *st);

/* Reads, parses and plans the file for topo; returns a process exit code (1: does not fit). */
int cmd_compile(const struct compile_options *o, const struct topology *topo);

#endif
