/*
 * An HLO collective's costs on each core, as the pod's agents incur them: the bytes it sends
 * and the workspace it runs through (compiler/lower.h's rules, read off the instruction).
 */
#ifndef PODEMU_HLO_COLLECTIVE_H
#define PODEMU_HLO_COLLECTIVE_H

#include "graph.h"
#include "hlo.h"
#include "lower.h"

/* The op a collective (or its async start) runs as; OP_INVALID for any other instruction. */
enum opcode hlo_collective_op(const struct hlo_instruction *in);

/* What one core sends in collective `in` over groups of n, nccl-tests' way of counting. */
int64_t hlo_collective_sent(const struct hlo_instruction *in, int n);

/*
 * The workspace of collective `in` on a pod of world cores, cores_per_host per host: the most
 * that any of its groups needs with the algorithm lower_choose gives it (lower_workspace),
 * with the pod's chunk size, window and forced algorithm. INVALID_ARGUMENT for groups the
 * verifier would refuse.
 */
int hlo_collective_workspace(struct coll_workspace *out, const struct hlo_instruction *in,
                             int world, int cores_per_host, int64_t chunk_bytes, int window,
                             const char *forced_algorithm, struct status *st);

/*
 * The receive slots of module m on a pod of world cores, cores_per_host per host, as
 * lower_receive_area counts them for a step graph: m's collectives lowered as the agents lower
 * them (each array of a tuple-shaped collective apart), with the pod's chunk size, window and
 * forced algorithm. None on one host.
 */
int hlo_receive_area(struct receive_area *out, const struct hlo_module *m, int world,
                     int cores_per_host, const char *forced_algorithm, int64_t chunk_bytes,
                     int window, struct status *st);

#endif
