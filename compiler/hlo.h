/*
 * XLA's HLO text, read into a module of computations and instructions. The reader keeps what
 * memory planning and the collectives need (shapes with their layouts, operands, the attributes
 * podemu understands) and skips the rest (metadata, unknown attributes). Instructions are read
 * in program order: an operand must be defined before its use. Every error names the line and
 * column. Everything is allocated from one arena.
 */
#ifndef PODEMU_HLO_H
#define PODEMU_HLO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "status.h"

#define HLO_MAX_INSTRUCTIONS (1 << 20)

/* Element types of HLO (PrimitiveType), with their sizes in bits. */
enum hlo_type {
	HT_INVALID = 0,
	HT_PRED,
	HT_S4,
	HT_S8,
	HT_S16,
	HT_S32,
	HT_S64,
	HT_U4,
	HT_U8,
	HT_U16,
	HT_U32,
	HT_U64,
	HT_F16,
	HT_BF16,
	HT_F32,
	HT_F64,
	HT_C64,
	HT_C128,
	HT_F8E5M2,
	HT_F8E4M3FN,
	HT_TOKEN,
	HT_TUPLE,
	HT_COUNT
};

const char *hlo_type_name(enum hlo_type t);
/* Bits per element (pred is stored in 8); 0 for token and tuple. */
int hlo_type_bits(enum hlo_type t);

/*
 * One level of a tiled layout, T(8,128): tile dimensions, most major first; -1 stands for '*'
 * (XLA's combined dimension).
 */
struct hlo_tile {
	int rank;
	int64_t *dims;
};

/*
 * An array shape (or a tuple of shapes), with the layout as written when given. Any rank XLA
 * allows; a dimension written "<=N" is dynamic with bound N (dims[i] holds the bound).
 */
struct hlo_shape {
	enum hlo_type type;
	int rank;
	int64_t *dims; /* [rank] */
	bool *dynamic; /* [rank], or NULL when every dimension is static */
	bool has_layout;
	int *minor_to_major; /* [rank] when has_layout */
	int n_tiles;
	struct hlo_tile *tiles; /* T(..)(..): the first level decides the padded size */
	int element_bits;       /* E(n); 0: the type's own size */
	int64_t memory_space;   /* S(n); 0 is HBM */
	int n_tuple;
	struct hlo_shape *tuple; /* [n_tuple] when type == HT_TUPLE */
};

/* Elements and unpadded bytes of an array shape (0 for tuples and tokens). */
int64_t hlo_shape_elements(const struct hlo_shape *s);
int64_t hlo_shape_bytes(const struct hlo_shape *s);
/* XLA's text form without layout ("f32[1024,128]", "(f32[2], s32[])"); returns buf. */
char *hlo_shape_format(char *buf, size_t len, const struct hlo_shape *s);

/*
 * Reads a layout as XLA writes it after a shape ("{1,0:T(8,128)(2,1)S(1)}") onto the array
 * shape s; INVALID_ARGUMENT naming the layout and the column on error. Format writes s's
 * layout back in that form ("" when s has none); returns buf.
 */
int hlo_parse_layout(struct hlo_shape *s, const char *text, struct arena *a, struct status *st);
char *hlo_layout_format(char *buf, size_t len, const struct hlo_shape *s);

struct hlo_computation;

/* How an instruction names another computation. */
enum hlo_call_role {
	CALL_TO_APPLY,  /* to_apply=: a reducer, map or sort comparator, or call's callee */
	CALL_CALLS,     /* calls=: a fusion's, call's, async op's or custom-call's computation */
	CALL_BODY,      /* while body= */
	CALL_CONDITION, /* while condition= */
	CALL_BRANCH,    /* true_computation, false_computation, branch_computations */
};

struct hlo_call {
	enum hlo_call_role role;
	const char *name;
	struct hlo_computation *callee;
};

/* An entry output (shape index) that may or must take the bytes of a parameter. */
struct hlo_alias {
	int output_index_len;
	int64_t *output_index; /* {} is the whole result, {1} its element 1, ... */
	int64_t parameter;
	int parameter_index_len;
	int64_t *parameter_index;
	bool must;
};

/* A remark about the module: something that changes memory and is not modelled. */
struct hlo_warning {
	int line;
	const char *text;
};

struct hlo_instruction {
	const char *name;
	const char *opcode; /* as written: "add", "all-gather", "custom-call" */
	struct hlo_shape shape;
	bool shape_inferred; /* the text left the result shape to XLA */
	int n_operands;
	struct hlo_instruction **operands;
	int n_control_predecessors;
	struct hlo_instruction **control_predecessors;
	bool is_root;
	int line, column; /* where the instruction starts */
	int index;        /* position in its computation */
	struct hlo_computation *parent;

	/* Attributes podemu uses (absent: has_* false, counts 0, pointers NULL). */
	int64_t parameter_number; /* parameter(N); -1 otherwise */
	int n_dimensions;
	int64_t *dimensions; /* dimensions={...} */
	bool has_index;
	int64_t tuple_index;              /* get-tuple-element index=N */
	const char *lhs_contracting_dims; /* dot, as written ("{1}") */
	const char *rhs_contracting_dims;
	bool has_batch_dims; /* dot with lhs_batch_dims or rhs_batch_dims */
	bool has_iota_dimension;
	int64_t iota_dimension;
	const char *replica_groups; /* text as written: "{{0,1},{2,3}}" or "[2,4]<=[8]" */
	const char *source_target_pairs;
	bool has_channel_id;
	int64_t channel_id;
	bool use_global_device_ids;
	const char *to_apply_name;
	struct hlo_computation *to_apply;
	int n_calls;
	struct hlo_call *calls; /* every computation it names, to_apply included */
	const char *slice;      /* slice={[a:b:c], ...} as written */
	const char *padding;    /* padding=0_0x1_2 as written */
	const char *literal;    /* constant(...) contents */
	const char *direction;  /* compare: direction=GT */
	int n_slice_sizes;
	int64_t *slice_sizes;           /* dynamic-slice: dynamic_slice_sizes={...} */
	const char *custom_call_target; /* custom-call */
	const char *operand_aliasing;   /* custom-call output_to_operand_aliasing, as written */
	const char *execution_thread;   /* async_execution_thread, as written */
	const char *backend_config;     /* as written */

	/* Set by compiler passes. */
	bool may_alias_operand; /* an all-reduce that may write into its operand's bytes */
	struct hlo_instruction *replaced_by; /* lowered into this one (compiler/strategy.c) */
};

/* A while's known_trip_count from its backend_config, or 0 when it gives none. */
int64_t hlo_known_trip_count(const struct hlo_instruction *in);

/* The k-th computation of that role an instruction names, or NULL. */
struct hlo_computation *hlo_callee(const struct hlo_instruction *in, enum hlo_call_role role,
                                   int k);

struct hlo_computation {
	const char *name;
	bool is_entry;
	int n_instructions;
	struct hlo_instruction **instructions; /* in program order */
	struct hlo_instruction *root;
	int n_parameters;
	struct hlo_instruction **parameters; /* by parameter number */
	int line;                            /* where it starts */
	int index;                           /* its place in the module's computations */
};

struct hlo_module {
	const char *name;
	int n_computations;
	struct hlo_computation **computations;
	struct hlo_computation *entry;
	bool is_scheduled; /* is_scheduled=true: each computation's order is its schedule */
	int n_aliases;
	struct hlo_alias *aliases; /* input_output_alias */
	int n_donors;
	struct hlo_alias *donors; /* buffer_donor: parameter and parameter_index only */
	int n_warnings;
	struct hlo_warning *warnings;
};

/*
 * Parses HLO text (len bytes, need not be NUL-terminated) into *out, allocated from a. On error
 * INVALID_ARGUMENT with "line L, column C: ..." and nothing usable in *out.
 */
int hlo_parse(const char *text, size_t len, struct arena *a, struct hlo_module *out,
              struct status *st);

/* Whether in's opcode is op, or any of ops (NULL-terminated). */
bool hlo_is(const struct hlo_instruction *in, const char *op);
bool hlo_is_any(const struct hlo_instruction *in, const char *const *ops);

/* The computation of that name (with or without '%'), or NULL. */
struct hlo_computation *hlo_find_computation(const struct hlo_module *m, const char *name);

#endif
