/*
 * The compiler's driver and its result: the memory plan of an HLO module (read from text, or a
 * step graph through compiler/from_graph.c) on one core of a topology: which buffers exist
 * (arguments, outputs, constants, temporaries, in every computation the entry calls), how big
 * they are in their layouts, when each is live over the schedule, where temporaries sit in the
 * reservation, the peak, the live set at the peak, and the bytes each core sends in
 * collectives. The plan is the same for every core (SPMD); the pod runs exactly this plan.
 */
#ifndef PODEMU_MEMPLAN_H
#define PODEMU_MEMPLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "arena.h"
#include "graph.h"
#include "hlo.h"
#include "layout.h"
#include "strategy.h"
#include "status.h"
#include "topology.h"

enum buffer_kind { BUF_ARGUMENT, BUF_OUTPUT, BUF_TEMP, BUF_CONSTANT };

struct plan_buffer {
	const struct hlo_instruction *def;
	const struct hlo_computation *comp; /* where it lives (first/last are positions there) */
	const char *op; /* what made it, when not def's opcode (a strategy's temporary) */
	enum buffer_kind kind;
	int64_t bytes;  /* in HBM (padded when tiled, aligned) */
	int64_t offset; /* temporaries and constants of the entry: where in the reservation */
	int64_t unpadded_bytes;
	int first, last;           /* live over [first, last] in program order */
	int64_t other_space_bytes; /* in a memory space other than HBM (bytes is then 0) */
	bool aliased;              /* an output in the bytes of a parameter (input_output_alias) */
	int donor;                 /* aliased: that parameter's number */
};

struct memplan_options {
	bool tiled;          /* TPU layouts (default) or none */
	int64_t chunk_bytes; /* a collective's chunk (default 4 MiB): its workspace is in chunks */
	int window;          /* chunks in flight per peer (default 4) */
	const char *collective_algorithm; /* forced, as lower_collectives takes it (NULL: none) */
	enum ag_strategy all_gather;      /* lowered by compiler/strategy.c before planning */
	bool no_alias; /* a strategy's all-reduce never reuses its operand's buffer */
	/*
	 * Independent all-gathers, reduce-scatters and all-reduces with the same groups are merged
	 * into the first of them while their outputs together stay at or below this many bytes
	 * (0: no combining), as XLA's combiners do; an opt-barrier between two stops it. A merged
	 * collective runs, and its output is live, from the first one's place on.
	 */
	int64_t combine_threshold_bytes;
	bool no_fusion;      /* keep every elementwise intermediate in HBM (--fusion none) */
	bool recorded_order; /* no memory-aware scheduling (--scheduler recorded) */
	/* Every buffer rounded up to this many bytes (0: the pod's heap, HBM_ALIGNMENT). */
	int64_t alignment;
	/*
	 * The entry's root is a tuple naming a step graph's outputs, each a device buffer of its
	 * own: no index table and no copies (the graph's outputs are distinct and not parameters).
	 */
	bool graph_outputs;
};

/*
 * One computation as the pod runs it: its schedule, what fusion made of each instruction,
 * the buffers of each instruction's value (one per tuple element), and where each call site's
 * callee heap starts in the computation's own heap.
 */
struct comp_plan {
	int n;
	int *order;         /* order[k]: the instruction run k-th */
	int *fused_into;    /* [instruction]: the fusion root that computes it, or -1 */
	int *n_values;      /* [instruction]: buffers of its value */
	int **values;       /* [instruction][k]: buffer indices */
	int64_t *callee_at; /* [instruction]: offset of its callee's heap, or -1 */
	/* [instruction]: a collective's workspace in the heap (offset -1: none) */
	int64_t *scratch_at, *scratch_bytes;
	int64_t heap; /* bytes of this computation's heap (its temporaries by liveness) */
};

struct memplan {
	int world_size, cores_per_host;
	int64_t capacity; /* usable HBM per core */
	int n_buffers;
	struct plan_buffer *buffers;
	/*
	 * As XLA's CompiledMemoryStats: temp_bytes is the reservation that holds every temporary,
	 * constant and collective scratch by liveness (constant_bytes of it are constants), and
	 * peak_bytes = argument + output - alias + temp, what a core's heap holds while the
	 * program runs (arguments and outputs are device buffers for all of it).
	 */
	int64_t argument_bytes, output_bytes, alias_bytes, temp_bytes, constant_bytes;
	/*
	 * Of temp_bytes, at its top: each core's receive slots (hlo_receive_area), where chunks
	 * from peer hosts wait that cannot be read straight into place (0 on one host).
	 */
	int64_t receive_offset, receive_bytes, receive_slot_bytes;
	int receive_slots;
	int64_t other_space_bytes; /* buffers outside HBM (memory space S(n), n > 0) */
	int n_warnings;
	const struct hlo_warning *warnings; /* what changes memory and is not modelled */
	int64_t peak_bytes;
	int64_t padding_bytes; /* of the buffers live at the peak */
	int peak_at;           /* position of the peak in the schedule */
	const char *peak_name; /* and its name */
	int n_instructions;
	int64_t *live; /* [n_instructions]: live bytes (scratch included) at each instruction */
	int n_peak_live;
	int *peak_live;               /* buffer indices live at the peak, largest first */
	int64_t peak_scratch;         /* collective scratch at the peak */
	int64_t sent_bytes;           /* per core, over every collective */
	int64_t sent_by_op[OP_COUNT]; /* of it, by opcode (graph.h; a loop's collectives once) */
	enum ag_strategy all_gather;
	bool no_alias;
	int n_rewritten; /* all-gathers lowered to an all-reduce (compiler/strategy.c) */
	int n_combined;  /* collectives merged into an earlier one */
	int n_fused;     /* elementwise instructions fused into a later one: no buffer */
	int n_in_place;  /* elementwise results in the bytes of an operand that dies there */
	int n_delayed;   /* computations the memory-aware scheduler moved later */
	int64_t combine_threshold_bytes;
	bool fits;
	/* The entry's schedule and what each instruction became, for the pod. */
	int *order;              /* order[k]: the instruction run k-th */
	int *fused_into;         /* [instruction]: the fusion root that computes it, or -1 */
	int *value_buffer;       /* [instruction]: the buffer holding its (array) value, or -1 */
	struct comp_plan *comps; /* [computation index]: every planned computation, the entry too */
};

/*
 * Plans m for one core of topo: the entry and every computation it calls. With an all-gather
 * strategy other than native, m's all-gathers are lowered first, in m (compiler/strategy.c).
 * INVALID_ARGUMENT for what cannot be planned (bad replica groups, a get-tuple-element out of
 * range). The plan is allocated from a.
 */
int memplan_build(struct memplan *out, struct hlo_module *m, const struct topology *topo,
                  const struct memplan_options *o, struct arena *a, struct status *st);

/* XLA's out-of-memory report ("Ran out of memory in memory space hbm. ...") into f. */
void memplan_print_oom(FILE *f, const struct memplan *p, const struct topology *topo);

/* The JSON memory report (one entry per core; none when p is NULL) and error (or null) into f. */
void memplan_print_json(FILE *f, const struct memplan *p, const struct status *error);

/*
 * An SVG chart of live bytes over the program, the capacity, the peak marked and the live set
 * at the peak listed, into f.
 */
void memplan_write_svg(FILE *f, const struct memplan *p, const struct topology *topo,
                       const char *title);

/* The text summary (fits or XLA's report) into f. */
void memplan_print_text(FILE *f, const struct memplan *p, const struct topology *topo);

#endif
