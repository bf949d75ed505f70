/*
 * TPU generations and pod presets: the one table of hardware facts podemu uses.
 */
#ifndef PODEMU_TOPOLOGY_H
#define PODEMU_TOPOLOGY_H

#include <stdint.h>

#include "status.h"

#define TOPOLOGY_NAME_MAX 32

/* Every device allocation is rounded up to this many bytes, as device allocators align. */
#define HBM_ALIGNMENT 256

struct topology {
	char name[TOPOLOGY_NAME_MAX]; /* "v3-8", or "custom" */
	int num_hosts;
	int cores_per_host;
	int64_t hbm_bytes;      /* capacity of one core's HBM */
	int64_t reserved_bytes; /* taken by the runtime before any user allocation */
};

/*
 * Fills out from a preset name such as "v3-8", "v4-32", "v5e-16", "v5p-8". On an unknown name
 * INVALID_ARGUMENT lists the generations.
 */
int topology_from_preset(struct topology *out, const char *name, struct status *st);

/* Fills out for an explicit layout; hbm_bytes is the capacity per core (no reservation). */
int topology_custom(struct topology *out, int hosts, int cores_per_host, int64_t hbm_bytes,
                    struct status *st);

static inline int topology_world_size(const struct topology *t)
{
	return t->num_hosts * t->cores_per_host;
}

/* Usable bytes per core: capacity minus the runtime reservation. */
static inline int64_t topology_bytes_limit(const struct topology *t)
{
	return t->hbm_bytes - t->reserved_bytes;
}

/*
 * Parses a byte size: a plain number of bytes, or a number with K, M, G, T (binary, 1024-based;
 * "KiB"/"KB"/"K" all mean 1024) and an optional fraction ("1.5G"). Returns INVALID_ARGUMENT on
 * garbage, negatives or overflow.
 */
int parse_size(int64_t *out, const char *text, struct status *st);

/*
 * Parses what (an option's name, say) from text: a whole decimal number in [lo, hi], nothing
 * after it. Returns INVALID_ARGUMENT naming what and quoting the text on anything else (a
 * word, a fraction, an empty text, out of range).
 */
int parse_int(int *out, const char *what, const char *text, int lo, int hi, struct status *st);

#endif
