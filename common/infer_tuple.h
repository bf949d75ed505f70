/* Tuples and control flow in shape inference (infer_tuple.c), for infer.c. */
#ifndef PODEMU_INFER_TUPLE_H
#define PODEMU_INFER_TUPLE_H

#include "graph.h"

/* A tuple of n's operands' shapes (tuple, opt-barrier); its elements from env's arena. */
int tuple_of(struct shape *out, const Podemu__Node *n, const struct shape *shapes,
             const struct graph_env *env, const char *label, struct status *st);
/* A called computation's parameter: its declared shape, an array or a tuple of arrays. */
int infer_computation_parameter(struct shape *out, const Podemu__Node *n,
                                const struct graph_env *env, const char *label, struct status *st);
/* A declared shape (an opaque op's result): an array or a tuple of arrays. */
int declared_shape(struct shape *out, const Podemu__Shape *p, const struct graph_env *env,
                   const char *label, struct status *st);
/* while, conditional and call: shapes checked against the computations they run. */
int infer_call(struct shape *out, enum opcode op, const Podemu__Node *n, const struct shape *shapes,
               const struct graph_env *env, const char *label, struct status *st);

#endif
