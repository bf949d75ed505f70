/*
 * The compiler's entry for a whole module: HLO text read, verified and planned for one
 * topology. `podemu compile` and the client library's pe_compile_hlo both go through it.
 */
#ifndef PODEMU_PIPELINE_H
#define PODEMU_PIPELINE_H

#include <stddef.h>

#include "arena.h"
#include "memplan.h"
#include "status.h"
#include "topology.h"

/*
 * Reads text (len bytes; name prefixes every error) into *m and plans it into *plan, all from a. On
 * error the status code, with st naming the line and the problem.
 */
int compile_module(struct memplan *plan, struct hlo_module *m, const char *text, size_t len,
                   const char *name, const struct topology *topo, const struct memplan_options *mo,
                   struct arena *a, struct status *st);

/* XLA's RESOURCE_EXHAUSTED text for a plan that does not fit, into *oom. */
void compile_oom_status(struct status *oom, const struct memplan *plan);

#endif
