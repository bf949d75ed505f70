/*
 * Buffer planning for one step: where every value lives on a core, as the compiler's buffer
 * assignment decides it, in the form agents run (a BufferAssignment per node).
 */
#ifndef PODEMU_PLAN_H
#define PODEMU_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "arena.h"
#include "dtype.h"
#include "graph.h"
#include "podemu.pb-c.h"
#include "status.h"
#include "topology.h"

struct plan {
	Podemu__BufferAssignment **buffers; /* one per node, from the arena */
	int64_t temp_bytes;                 /* size of the reservation */
	int64_t output_bytes; /* newly allocated: outputs not written into donated buffers */
	int64_t argument_bytes;
	int64_t alias_bytes; /* outputs written into donated parameter buffers */
	/* The receive slots at the top of the reservation (memplan.h), in temp_bytes. */
	int64_t receive_offset;
	int receive_slots;
	int64_t receive_slot_bytes;
};

/* The compiler's options for the pod's steps. */
struct plan_options {
	const struct topology *topology;
	int64_t combine_threshold_bytes;  /* 0: no combining */
	bool memory_aware;                /* else the recorded order */
	bool fusion;                      /* elementwise fusion */
	bool tiled;                       /* buffers in the TPU's tiled layout (else unpadded) */
	int64_t chunk_bytes;              /* a collective's chunk; its workspace is in chunks */
	int window;                       /* chunks in flight per peer */
	const char *collective_algorithm; /* forced (NULL: chosen per collective) */
};

/*
 * What compiling a graph produced, apart from buffer handles. Nodes are numbered as agents
 * see them: the entry's in their scheduled order, then each computation's (graph.h).
 */
struct compiled {
	int n;                  /* entry nodes */
	int n_total;            /* every node */
	int *order;             /* scheduled order of the entry (NULL: as recorded) */
	int *fused_into;        /* [n_total]; NULL: no fusion */
	int *computation_order; /* [n_total - n]: Program.computation_order; NULL: none */
	/* [n_total]; an output's handle is the index of the output it is (plan_bind). */
	struct plan plan;
	int n_combined, n_delayed, n_fused;
	int64_t sent_by_op[OP_COUNT]; /* bytes each core sends per run, by collective opcode */
	int64_t *live;                /* bytes live per core at each place of the schedule */
	int n_live;
};

/*
 * Compiles g (already checked; shapes[id] is node id's shape) with the compiler's one
 * pipeline: the graph becomes an HLO module (compiler/from_graph.c) and is combined, scheduled,
 * fused and assigned buffers by compiler/memplan.c, exactly as `podemu compile` plans HLO text.
 * Parameters are existing device buffers, held values new device buffers, everything else
 * lives in the reservation (a called computation's in its callee's part of it), with the
 * receive slots the step's collectives need from peer hosts at its top. Returns
 * INVALID_ARGUMENT when an output is a parameter or two outputs are the same value. out's
 * arrays are from a.
 */
int plan_graph(struct compiled *out, struct arena *a, const Podemu__Graph *g,
               const struct shape *shapes, const struct plan_options *o, struct status *st);

/*
 * c's plan bound to a step's buffers: parameters get the handles g's nodes carry (g in c's
 * scheduled order), outputs output_handles[k] for the k-th output.
 */
int plan_bind(struct plan *out, struct arena *a, const struct compiled *c, const Podemu__Graph *g,
              const uint64_t *output_handles, struct status *st);

#endif
