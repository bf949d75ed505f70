/*
 * Buffer planning for one step: where every value lives on a core. Parameters are existing
 * device buffers, held values become new device buffers (outputs), everything else is a
 * temporary placed inside one reservation by liveness, so values whose lifetimes do not overlap
 * share bytes.
 */
#ifndef PODEMU_PLAN_H
#define PODEMU_PLAN_H

#include <stdint.h>

#include "arena.h"
#include "dtype.h"
#include "podemu.pb-c.h"
#include "status.h"

struct plan {
	Podemu__BufferAssignment **buffers; /* one per node, from the arena */
	int64_t temp_bytes;                 /* size of the reservation */
	int64_t output_bytes;
	int64_t argument_bytes;
};

/*
 * Plans g (already checked; shapes[i] is node i's shape). output_handles[k] is the handle the
 * k-th output will get. scratch (NULL: none) gives per node the bytes a collective needs while
 * it runs, planned as a temporary live only at that node. fused_into (NULL: no fusion) names per
 * node the fusion root that computes it: such a node gets no buffer, and what it reads is live
 * until its root runs. Returns INVALID_ARGUMENT when an output is a parameter or two outputs are
 * the same value.
 */
int plan_step(struct plan *out, struct arena *a, const Podemu__Graph *g, const struct shape *shapes,
              const uint64_t *output_handles, const int64_t *scratch, const int *fused_into,
              struct status *st);

/*
 * The plan cached for a graph of the same shape, bound to this step's buffers: parameters get
 * the handles g's nodes carry, outputs output_handles in g's output order.
 */
int plan_rebind(struct plan *out, struct arena *a, const struct plan *cached,
                const Podemu__Graph *g, const uint64_t *output_handles, struct status *st);

#endif
