/*
 * The step-graph frontend: a graph the client library recorded (already checked) as an HLO
 * module, so that the pod's steps and `podemu compile` go through the same passes. Instruction
 * i of the entry computation is node i (its HLO opcode, shape and operands), parameters are
 * numbered in order, and the root (instruction n) is a tuple of the graph's outputs.
 * Collectives carry their resolved replica groups in XLA's text, reductions their reducer (and
 * scale) as to_apply, so that only collectives the pod would run alike are combined; the
 * graph's donors are the module's buffer_donor list.
 */
#ifndef PODEMU_FROM_GRAPH_H
#define PODEMU_FROM_GRAPH_H

#include "arena.h"
#include "dtype.h"
#include "hlo.h"
#include "podemu.pb-c.h"
#include "status.h"

/*
 * An array value of shape s in the layout written for it (XLA's text after a shape, such as
 * "{0:T(256)}"; NULL or "": the pod's layout). INVALID_ARGUMENT for a layout that does not
 * read or fit, UNIMPLEMENTED for E(n) below the type's bits (the pod stores whole elements).
 */
int graph_value_shape(struct hlo_shape *out, const struct shape *s, const char *layout,
                      struct arena *a, struct status *st);
/*
 * The bytes of a device buffer of that shape and layout as the plan charges them (TPU tiles
 * unless tiled is false), into *bytes; UNIMPLEMENTED for a memory space other than HBM.
 */
int graph_value_bytes(int64_t *bytes, const struct shape *s, const char *layout, bool tiled,
                      struct arena *a, struct status *st);

/* Builds *out from g (shapes[i]: node i's checked shape) for a pod of world cores, from a. */
int graph_to_module(struct hlo_module *out, const Podemu__Graph *g, const struct shape *shapes,
                    int world, struct arena *a, struct status *st);

#endif
