/*
 * Elementwise fusion, as XLA's loop fusion does it: a chain of elementwise ops is one kernel
 * that reads its inputs from HBM and writes only the last result; the values in between never
 * get an HBM buffer (on a TPU they live in vector registers and VMEM). A node is fused into its
 * consumer when it is elementwise (or a constant), that consumer is its only one, is
 * elementwise too and has as many elements, no opt-barrier lies between them, and the client
 * does not hold the node's value. Agents run a fusion tile by tile in host scratch.
 */
#ifndef PODEMU_FUSION_H
#define PODEMU_FUSION_H

#include <stdbool.h>

#include "arena.h"
#include "dtype.h"
#include "graph.h"
#include "hlo.h"
#include "podemu.pb-c.h"
#include "status.h"

/* Nodes of one fusion at most (the root included). */
#define FUSION_MAX_NODES 32

/*
 * True for the ops a fusion may contain: the elementwise ones (opcode_is_elementwise), which
 * also root a fusion, and constant, only as a producer. An elementwise kernel reads element i
 * of every operand before writing element i, so its result may also take the buffer of an
 * operand that dies there (in place).
 */
bool fusion_elementwise(enum opcode op);

/* A program as fusion sees it: n nodes in program order. */
struct fusion_program {
	int n;
	const enum opcode *ops;  /* OP_INVALID for what podemu does not know */
	const int64_t *elements; /* per node; -1 for a tuple */
	const int *first;        /* operands of node i: operands[first[i] .. first[i + 1]) */
	const int *operands;
	const bool *held; /* values that must have a buffer of their own (outputs) */
};

/* fused_into as below for any program; the number of fused nodes, or -1 out of memory. */
int fusion_decide(const struct fusion_program *p, int *fused_into, struct arena *a);

/*
 * The fusions of computation c (held: values that need a buffer of their own): fused_into[i]
 * is the instruction whose kernel computes instruction i, or -1 (all -1 when !on). Returns
 * the number fused, or -1 when out of memory.
 */
int fusion_computation(const struct hlo_computation *c, bool on, const bool *held, int *fused_into,
                       struct arena *a);

/*
 * Checks fused_into as an agent receives it, for the n nodes across a graph (node_of[id],
 * whose operands add to base_of[id]): every fused node is elementwise and fused into a later
 * elementwise root of its own computation with as many elements, and no fusion has more than
 * FUSION_MAX_NODES.
 */
int fusion_check(Podemu__Node *const *node_of, const int *base_of, size_t n,
                 const struct shape *shapes, const enum opcode *ops, const int32_t *fused_into,
                 size_t n_fused_into, struct status *st);

#endif
