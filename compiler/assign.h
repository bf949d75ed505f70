/*
 * Buffer assignment with nested liveness, the planner's core (internal to compiler/): the
 * buffers of each computation, their liveness over its schedule, in-place reuse, aliases, the
 * entry's outputs as XLA's buffer assignment gives them, and the heap that holds the
 * temporaries. memplan.c drives it and sums up what it found.
 */
#ifndef PODEMU_ASSIGN_H
#define PODEMU_ASSIGN_H

#include <stdbool.h>
#include <stdint.h>

#include "arena.h"
#include "hlo.h"
#include "memplan.h"
#include "status.h"
#include "verify.h"

/* The buffers an instruction's value is made of (one per leaf of a tuple). */
struct refs {
	int n;
	int *ids;
};

/* What planning a computation costs where it is called. */
struct callee_plan {
	int state;       /* 0: not planned, 1: being planned, 2: planned */
	int64_t extra;   /* its heap: the bytes of its own buffers while it runs */
	int n_peak_live; /* buffers live at its peak */
	int *peak_live;
};

struct builder {
	struct memplan *p;
	struct arena *a;
	const struct memplan_options *o; /* chunk_bytes and alignment set */
	int cap;
	const struct hlo_module *m;
	const struct hlo_computation *comp; /* the computation being planned */
	struct callee_plan *callees;        /* [m->n_computations] */
	struct verify_cache groups;
	struct status *st;
};

/* One computation planned: live bytes by position, the peak and the callees' call sites. */
struct comp_result {
	int n;
	int64_t *live;
	int peak_at;
	int64_t peak, peak_scratch;
	int64_t heap; /* the reservation: temporaries, constants, scratch and callees by liveness */
	const struct hlo_computation **callee_at; /* [n]: whose peak a position includes */
	int first_buffer;                         /* buffers of this computation from here on */
	int *order;
};

/*
 * Plans computation c (the entry when entry): its buffers are added to b->p, with their
 * liveness over its schedule; the entry also fills b->p's order, fused_into and value_buffer.
 */
int assign_computation(struct builder *b, const struct hlo_computation *c, bool entry, int depth,
                       struct comp_result *res);

/*
 * The buffers of c live at its peak (largest first), with those of the callee that runs
 * there (named inside the computation they live in), into *list (from b->a).
 */
int assign_peak_set(struct builder *b, const struct hlo_computation *c,
                    const struct comp_result *res, int **list, int *n_list);

#endif
