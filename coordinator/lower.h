/*
 * Collective lowering: for every collective of a step, the algorithm (from size, groups and
 * topology, or forced) and each core's explicit schedule of phases (peer, block, copy or
 * reduce), which the agents execute without deciding anything.
 */
#ifndef PODEMU_LOWER_H
#define PODEMU_LOWER_H

#include <stdint.h>

#include "arena.h"
#include "dtype.h"
#include "podemu.pb-c.h"
#include "status.h"
#include "topology.h"

/* All-reduces up to this size use recursive doubling when the group size is a power of two. */
#define LOWER_SMALL_ALL_REDUCE_BYTES (256 * 1024)

/*
 * Schedules of host `host`'s cores for every collective of g (shapes from graph_check).
 * forced_algorithm is NULL/"" (choose), "ring", "direct" or "recursive-doubling"; an algorithm
 * that does not apply to an op is ignored for it. Results are allocated from a.
 */
int lower_collectives(Podemu__CollectiveSchedule ***out, size_t *n_out, struct arena *a,
                      const Podemu__Graph *g, const struct shape *shapes, const struct topology *t,
                      int host, const char *forced_algorithm, struct status *st);

/* Scratch HBM a collective reserves per core: one chunk for the reducing ones, else 0. */
int64_t lower_scratch_bytes(const Podemu__Node *n, const struct shape *in, int64_t chunk_bytes);

#endif
