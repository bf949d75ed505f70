/*
 * All-gather strategies, lowered to real instructions so that `podemu compile` plans them and
 * the pod (through `podemu run`) runs and measures them. native keeps the all-gather (its
 * output is its only memory). via-all-reduce (torch_xla 1.10) and decomposed (XLA's
 * AllGatherDecomposer) both become: output-sized zeros (broadcast of a constant), this core's
 * input written into them at its position in its group (dynamic-update-slice, in place), and
 * an all-reduce (sum) of that. On one SPMD program the per-core padding torch_xla used is
 * exactly that dynamic-update-slice, so the two lower alike and differ in name only. Each core
 * then sends 2(n-1)/n of the output instead of (n-1)/n.
 */
#ifndef PODEMU_STRATEGY_H
#define PODEMU_STRATEGY_H

#include <stdbool.h>

#include "arena.h"
#include "hlo.h"
#include "status.h"

/* How an all-gather is carried out. */
enum ag_strategy { AG_NATIVE, AG_VIA_ALL_REDUCE, AG_DECOMPOSED };

/* "native", "via-all-reduce", "decomposed"; -1 when unknown. */
int ag_strategy_parse(const char *name);
const char *ag_strategy_name(enum ag_strategy s);

/*
 * Lowers every array all-gather of m (on world cores) by strategy s, in place in m (new
 * instructions from a). in_place: the all-reduce may take its operand's bytes (XLA aliases
 * them); else it writes a buffer of its own (--no-alias). Groups must be consecutive blocks of
 * replicas (or all of them): UNIMPLEMENTED otherwise. *lowered counts the all-gathers.
 */
int strategy_lower(struct hlo_module *m, enum ag_strategy s, bool in_place, int world, int *lowered,
                   struct arena *a, struct status *st);

#endif
