/*
 * Scheduling passes over a step graph before it is planned: the order in which a core runs the
 * nodes decides which values are live together, so it decides the peak.
 *
 * Collective combining (XLA's AllGatherCombiner / ReduceScatterCombiner / AllReduceCombiner):
 * a later all-gather, reduce-scatter or all-reduce with the same attributes as an earlier one,
 * whose operands all exist at the earlier one's place, joins it: it runs right after it and its
 * output is live from there, while the outputs of the group stay within a byte threshold.
 *
 * Memory-aware scheduling: a computation whose result is consumed later runs just before its
 * first consumer instead, when that shortens its result's life and lengthens no other (every
 * operand is live there anyway), so the peak can only fall.
 *
 * Optimization barriers are hard constraints: nothing moves across one, so combining stops at
 * a barrier and no computation is delayed past it. A step boundary (mark_step) ends the graph.
 */
#ifndef PODEMU_SCHEDULE_H
#define PODEMU_SCHEDULE_H

#include <stdbool.h>
#include <stdint.h>

#include "arena.h"
#include "dtype.h"
#include "graph.h"
#include "podemu.pb-c.h"
#include "status.h"

/* XLA's default combine threshold (30 MiB). */
#define SCHEDULE_DEFAULT_COMBINE_BYTES ((int64_t)30 << 20)

struct schedule_options {
	int64_t combine_threshold_bytes; /* 0: no combining */
	bool memory_aware;
};

struct schedule {
	int n;
	int *order;     /* order[k] = index in the original graph of the node run k-th */
	int n_combined; /* collectives that joined an earlier one */
	int n_delayed;  /* computations moved to their first consumer */
};

/*
 * Orders g (already checked; shapes[i] is node i's shape). The order respects every data
 * dependency and every opt-barrier; with no options it is the recorded order.
 */
int schedule_step(struct schedule *out, const Podemu__Graph *g, const struct shape *shapes,
                  const struct schedule_options *o, struct arena *a, struct status *st);

/* Any program, as the delaying pass sees it: n nodes in program order. */
struct sched_program {
	int n;
	const enum opcode *ops; /* OP_INVALID: a computation podemu does not know */
	const int64_t *bytes;   /* of each node's value; 0: no buffer of its own */
	const int *first;       /* operands of node i: operands[first[i] .. first[i + 1]) */
	const int *operands;
	const int *alias_of; /* the node whose value node i names (get-tuple-element), or -1 */
	const bool *held;    /* values that outlive the program (outputs) */
};

/*
 * The memory-aware order of p into order (n entries): computations delayed to their first
 * consumer as described above, kept only when the live-bytes peak falls (*n_delayed says how
 * many moved). leader/next (a group's first collective and the next member) and hoist (a
 * parameter's new place) come from combining; NULL for none.
 */
int schedule_delays(const struct sched_program *p, const int *leader, const int *next,
                    const int *hoist, bool memory_aware, int *order, int *n_delayed,
                    struct arena *a, struct status *st);

/* True when the schedule is the recorded order. */
bool schedule_is_identity(const struct schedule *s);

/*
 * g with its nodes in s's order: node k is g's node s->order[k], operands, tuple sources and
 * outputs renumbered; shapes (NULL: none) permuted the same way in place. Node structs are
 * copied from a, so g itself is unchanged. NULL when out of memory.
 */
Podemu__Graph *schedule_apply(const Podemu__Graph *g, const struct schedule *s,
                              struct shape *shapes, struct arena *a);

#endif
