/*
 * Scheduling: the order in which a core runs a computation decides which values are live
 * together, so it decides the peak. The memory-aware pass: a computation whose result is
 * consumed later runs just before its first consumer instead, when that shortens its result's
 * life and lengthens no other (every operand is live there anyway), kept only when the peak
 * falls. Combined collectives (compiler/combine.c) run together. Optimization barriers are
 * hard constraints: nothing moves across one. And a step graph put into that order.
 */
#ifndef PODEMU_SCHEDULE_H
#define PODEMU_SCHEDULE_H

#include <stdbool.h>
#include <stdint.h>

#include "arena.h"
#include "combine.h"
#include "dtype.h"
#include "graph.h"
#include "hlo.h"
#include "podemu.pb-c.h"
#include "status.h"

/* XLA's default combine threshold (30 MiB). */
#define SCHEDULE_DEFAULT_COMBINE_BYTES ((int64_t)30 << 20)

struct schedule_options {
	int64_t combine_threshold_bytes; /* 0: no combining */
	bool memory_aware;
};

/* An order: order[k] = index in the original graph of the node run k-th. */
struct schedule {
	int n;
	int *order;
};

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

/*
 * The order of computation c: order[k] is the instruction run k-th. Collectives, parameters,
 * control flow, custom-calls and tuple plumbing keep their places (groups' members run right
 * after their first); an unknown op is a computation that may be delayed (memory_aware).
 * Values are sized in the TPU layout when tiled. *n_delayed counts what moved.
 */
int schedule_computation(const struct hlo_computation *c, const struct combining *groups,
                         bool memory_aware, bool tiled, int *order, int *n_delayed, struct arena *a,
                         struct status *st);

/*
 * g with its nodes in s's order: node k is g's node s->order[k], operands, tuple sources and
 * outputs renumbered; shapes (NULL: none) permuted the same way in place. Node structs are
 * copied from a, so g itself is unchanged. NULL when out of memory.
 */
Podemu__Graph *schedule_apply(const Podemu__Graph *g, const struct schedule *s,
                              struct shape *shapes, struct arena *a);

#endif
