/*
 * Collective lowering: for every collective of a step, the algorithm (from size, groups and
 * pod shape, or forced) and each core's explicit schedule of phases (peer, block, copy or
 * reduce). The coordinator ships the program with the collectives' parameters (op, groups,
 * shapes, a forced algorithm); each agent lowers them for its own cores when it prepares the
 * step, so what crosses the wire does not grow with the world.
 */
#ifndef PODEMU_LOWER_H
#define PODEMU_LOWER_H

#include <stdint.h>

#include "arena.h"
#include "dtype.h"
#include "podemu.pb-c.h"
#include "status.h"

/*
 * All-reduces up to this size, and all-gathers up to these output sizes across hosts, use
 * recursive doubling when the group size is a power of two. Above 1 MiB the hierarchical
 * all-gather wins for groups with several members on each of several hosts (measured on a 4x2
 * pod: 0.68 against 0.40 GB/s busbw at 4 MiB; recursive doubling 0.40 against 0.32 at 1 MiB).
 */
#define LOWER_SMALL_ALL_REDUCE_BYTES (256 * 1024)
#define LOWER_SMALL_ALL_GATHER_BYTES (4 * 1024 * 1024)
#define LOWER_SMALL_LAYERED_ALL_GATHER_BYTES (1024 * 1024)
/*
 * Larger all-gathers across hosts, up to this output size, go both ways around the ring when
 * their blocks are contiguous (4x1 pod, 16 MiB: 1.05 against 0.89 GB/s busbw; at 64 MiB the
 * plain ring did as well or better).
 */
#define LOWER_BIDIRECTIONAL_ALL_GATHER_BYTES (32 * 1024 * 1024)
/*
 * All-gathers and all-reduces (past recursive doubling's sizes) across hosts in groups of more
 * members than this go around a torus, one ring per dimension (a v4-4096's 2048 cores: 4 x 4 x
 * 4 x 4 x 4 x 2, 16 phases instead of 2047), whatever their size: the same bytes cross, in far
 * fewer steps.
 */
#define LOWER_TORUS_MEMBERS 64

/*
 * Schedules of host `host`'s cores (of cores_per_host each, world cores in all) for every
 * collective of g (shapes from graph_check).
 * forced_algorithm is NULL/"" (choose), "ring", "bidirectional-ring" (all-gather with
 * contiguous blocks), "direct", "recursive-doubling", "hierarchical" or "torus"; an algorithm that
 * does not apply to an op is ignored for it. Results are allocated from a.
 */
int lower_collectives(Podemu__CollectiveSchedule ***out, size_t *n_out, struct arena *a,
                      const Podemu__Graph *g, const struct shape *shapes, int world,
                      int cores_per_host, int host, const char *forced_algorithm,
                      struct status *st);

/* Scratch HBM a collective reserves per core: one chunk for the reducing ones, else 0. */
int64_t lower_scratch_bytes(const Podemu__Node *n, const struct shape *in, int64_t chunk_bytes);

#endif
