/*
 * Collective combining, as XLA's AllGatherCombiner / ReduceScatterCombiner / AllReduceCombiner
 * do it, for HLO modules and step graphs alike: a later all-gather, reduce-scatter or
 * all-reduce joins the nearest earlier group of its kind in the same segment (an opt-barrier
 * ends a segment) when they are alike (opcode, element type, dimensions, reduction, replica
 * groups), everything it reads exists where the group's first one runs (a parameter, a device
 * buffer that exists all along, moves up with it) and the group's outputs stay within a byte
 * threshold. A group runs where its first member does, its members right after it.
 */
#ifndef PODEMU_COMBINE_H
#define PODEMU_COMBINE_H

#include <stdint.h>

#include "arena.h"
#include "hlo.h"
#include "status.h"

struct combining {
	int *leader;    /* [n]: the group's first member, or -1 (not joined) */
	int *next;      /* [n]: the next member after this one, or -1 */
	int *hoist;     /* [n]: a parameter that must run before this index, or -1 */
	int n_combined; /* collectives that joined a group */
};

/* Combines the collectives of c (threshold 0: none). Arrays from a; RESOURCE_EXHAUSTED. */
int combine_collectives(struct combining *out, const struct hlo_computation *c, int64_t threshold,
                        struct arena *a, struct status *st);

#endif
