#include "memplan.h"

#include <stdlib.h>
#include <string.h>

#include "collective.h"
#include "combine.h"
#include "fusion.h"
#include "heap.h"
#include "layout.h"
#include "verify.h"
#include "topology.h"
#include "schedule.h"

#define DEFAULT_CHUNK_BYTES (4 << 20)

/* ---- buffer analysis ---- */

struct refs {
	int n;
	int *ids; /* buffers this instruction's value is made of */
};

/* What planning a computation costs where it is called. */
struct callee_plan {
	int state;       /* 0: not planned, 1: being planned, 2: planned */
	int64_t extra;   /* peak bytes of its own buffers while it runs (no parameters) */
	int n_peak_live; /* buffers live at that peak */
	int *peak_live;
};

struct builder {
	struct memplan *p;
	struct arena *a;
	const struct memplan_options *o;
	int cap;
	const struct hlo_module *m;
	const struct hlo_computation *comp; /* the computation being planned */
	struct callee_plan *callees;        /* [m->n_computations] */
	struct verify_cache groups;
	struct status *st;
};

/* Bytes rounded up to the heap's alignment, saturating; an empty buffer still takes one unit. */
static int64_t aligned(int64_t bytes, int64_t alignment)
{
	if (alignment <= 1)
		return bytes;
	bytes = layout_add(bytes > 0 ? bytes : 1, alignment - 1);
	return bytes / alignment * alignment;
}

static int new_buffer(struct builder *b, const struct hlo_instruction *def,
                      const struct hlo_shape *s, enum buffer_kind kind, int at)
{
	if (b->p->n_buffers == b->cap) {
		int cap = b->cap ? b->cap * 2 : 256;
		struct plan_buffer *list = arena_calloc(b->a, (size_t)cap, sizeof(*list));
		if (list == NULL)
			return -1;
		if (b->p->n_buffers > 0)
			memcpy(list, b->p->buffers, (size_t)b->p->n_buffers * sizeof(*list));
		b->p->buffers = list;
		b->cap = cap;
	}
	struct plan_buffer *buf = &b->p->buffers[b->p->n_buffers];
	memset(buf, 0, sizeof(*buf));
	buf->def = def;
	buf->comp = b->comp;
	buf->kind = kind;
	buf->bytes = aligned(layout_bytes(s, b->o->tiled), b->o->alignment);
	buf->unpadded_bytes = layout_bytes(s, false);
	if (!layout_in_hbm(s)) { /* another memory space: reported, not in the HBM peak */
		buf->other_space_bytes = buf->bytes;
		buf->bytes = buf->unpadded_bytes = 0;
	}
	buf->first = at;
	buf->last = at;
	return b->p->n_buffers++;
}

/* XLA's tuple index table: one 8-byte pointer per element, a buffer of its own. */
static int tuple_table(struct builder *b, const struct hlo_instruction *in, enum buffer_kind kind,
                       int at)
{
	int id = new_buffer(b, in, &in->shape, kind, at);
	if (id >= 0) {
		struct plan_buffer *buf = &b->p->buffers[id];
		buf->bytes = aligned(8 * (int64_t)in->shape.n_tuple, b->o->alignment);
		buf->unpadded_bytes = 8 * (int64_t)in->shape.n_tuple;
		buf->other_space_bytes = 0;
		buf->op = "tuple index table";
	}
	return id;
}

/*
 * One buffer per element of a tuple shape (so get-tuple-element can name one), else one; the
 * elements from `from` on (0: all), the first ones taken from keep (NULL: none).
 */
static int define_from(struct builder *b, const struct hlo_instruction *in, enum buffer_kind kind,
                       int at, const struct refs *keep, struct refs *out)
{
	int n = in->shape.type == HT_TUPLE ? in->shape.n_tuple : 1;
	int kept = keep != NULL ? keep->n : 0;
	out->ids = arena_calloc(b->a, (size_t)(n + kept) + 1, sizeof(int));
	if (out->ids == NULL)
		return -1;
	out->n = 0;
	for (int k = 0; k < kept; k++)
		out->ids[out->n++] = keep->ids[k];
	for (int k = keep != NULL ? 1 : 0; k < n; k++) {
		const struct hlo_shape *s =
		    in->shape.type == HT_TUPLE ? &in->shape.tuple[k] : &in->shape;
		if ((out->ids[out->n++] = new_buffer(b, in, s, kind, at)) < 0)
			return -1;
	}
	if (in->shape.type == HT_TUPLE && keep == NULL && tuple_table(b, in, kind, at) < 0)
		return -1;
	return 0;
}

static int define(struct builder *b, const struct hlo_instruction *in, enum buffer_kind kind,
                  int at, struct refs *out)
{
	return define_from(b, in, kind, at, NULL, out);
}

int ag_strategy_parse(const char *name)
{
	static const char *const names[] = {"native", "via-all-reduce", "decomposed"};
	for (int i = 0; i < 3; i++)
		if (strcmp(name, names[i]) == 0)
			return i;
	return -1;
}

const char *ag_strategy_name(enum ag_strategy s)
{
	return s == AG_VIA_ALL_REDUCE ? "via-all-reduce"
	       : s == AG_DECOMPOSED   ? "decomposed"
	                              : "native";
}

static bool is(const struct hlo_instruction *in, const char *op)
{
	return strcmp(in->opcode, op) == 0;
}

static bool is_any(const struct hlo_instruction *in, const char *const *ops)
{
	for (; *ops != NULL; ops++)
		if (is(in, *ops))
			return true;
	return false;
}

static int64_t value_bytes(const struct hlo_shape *s)
{
	return layout_bytes(s, false);
}

/* What one core sends in a collective, nccl-tests' way of counting. */
static int64_t sent_by(const struct hlo_instruction *in, int n)
{
	if (n <= 1)
		return 0;
	/* An async start's result is its tuple's element 1 (element 0 is the operand). */
	const struct hlo_shape *result =
	    in->shape.type == HT_TUPLE && in->shape.n_tuple > 1 ? &in->shape.tuple[1] : &in->shape;
	int64_t out = value_bytes(result);
	int64_t operand = in->n_operands > 0 ? value_bytes(&in->operands[0]->shape) : 0;
	if (is(in, "all-gather") || is(in, "all-gather-start") || is(in, "all-to-all"))
		return out / n * (n - 1);
	if (is(in, "all-reduce") || is(in, "all-reduce-start"))
		return out / n * 2 * (n - 1);
	if (is(in, "reduce-scatter"))
		return operand / n * (n - 1);
	if (is(in, "collective-permute") || is(in, "collective-permute-start"))
		return operand;
	return 0;
}

static int by_size(const void *x, const void *y, void *arg)
{
	const struct plan_buffer *buffers = arg;
	int64_t a = buffers[*(const int *)x].bytes, b = buffers[*(const int *)y].bytes;
	return a < b ? 1 : a > b ? -1 : *(const int *)x - *(const int *)y;
}

/*
 * The coordinator's memory-aware scheduler (compiler/schedule.c) on the entry computation:
 * order[k] is the instruction run k-th. Collectives, parameters and tuple plumbing keep their
 * places; an unknown op is a computation that may be delayed.
 */
static int memory_aware_order(const struct hlo_computation *c, const struct combining *groups,
                              bool on, bool tiled, int *order, int *n_delayed, struct arena *a,
                              struct status *st)
{
	static const char *const pinned[] = {"all-gather",
	                                     "all-gather-start",
	                                     "all-gather-done",
	                                     "all-reduce",
	                                     "all-reduce-start",
	                                     "all-reduce-done",
	                                     "reduce-scatter",
	                                     "all-to-all",
	                                     "collective-permute",
	                                     "collective-permute-start",
	                                     "collective-permute-done",
	                                     "send",
	                                     "send-done",
	                                     "recv",
	                                     "recv-done",
	                                     "infeed",
	                                     "outfeed",
	                                     "rng",
	                                     "custom-call",
	                                     "while",
	                                     "conditional",
	                                     "call",
	                                     NULL};
	int n = c->n_instructions, total = 0;
	for (int i = 0; i < n; i++)
		total += c->instructions[i]->n_operands;
	enum opcode *ops = arena_calloc(a, (size_t)n + 1, sizeof(enum opcode));
	int64_t *bytes = arena_calloc(a, (size_t)n + 1, sizeof(int64_t));
	int *first = arena_calloc(a, (size_t)n + 2, sizeof(int));
	int *operands = arena_calloc(a, (size_t)total + 1, sizeof(int));
	int *alias_of = arena_calloc(a, (size_t)n + 1, sizeof(int));
	bool *held = arena_calloc(a, (size_t)n + 1, sizeof(bool));
	if (!ops || !bytes || !first || !operands || !alias_of || !held)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int i = 0, at = 0; i < n; i++) {
		const struct hlo_instruction *in = c->instructions[i];
		bool plumbing = is(in, "tuple") || is(in, "get-tuple-element") || is(in, "bitcast");
		ops[i] = in->parameter_number >= 0                                 ? OP_PARAMETER
		         : is(in, "opt-barrier") || is(in, "optimization-barrier") ? OP_OPT_BARRIER
		         : is_any(in, pinned) ? OP_ALL_REDUCE /* keeps its place */
		         : plumbing           ? OP_GET_TUPLE_ELEMENT
		                              : opcode_parse(in->opcode);
		bytes[i] =
		    plumbing || ops[i] == OP_OPT_BARRIER ? 0 : layout_bytes(&in->shape, tiled);
		alias_of[i] = -1;
		if (is(in, "bitcast") && in->n_operands == 1)
			alias_of[i] = in->operands[0]->index;
		if (is(in, "get-tuple-element") && in->n_operands == 1 && in->has_index &&
		    (is(in->operands[0], "tuple") || is(in->operands[0], "opt-barrier") ||
		     is(in->operands[0], "optimization-barrier")) &&
		    in->tuple_index < in->operands[0]->n_operands)
			alias_of[i] = in->operands[0]->operands[in->tuple_index]->index;
		/* The result's tuple only holds the outputs: it is no consumer to move next to. */
		first[i] = at;
		for (int k = 0; in != c->root && k < in->n_operands; k++)
			operands[at++] = in->operands[k]->index;
		first[i + 1] = at;
	}
	held[c->root->index] = true;
	if (is(c->root, "tuple"))
		for (int k = 0; k < c->root->n_operands; k++)
			held[c->root->operands[k]->index] = true;
	/* Combined collectives stay with their group. */
	struct sched_program p = {n, ops, bytes, first, operands, alias_of, held};
	return schedule_delays(&p, groups->leader, groups->next, groups->hoist, on, order,
	                       n_delayed, a, st);
}

/*
 * In-place reuse, as XLA's buffer assignment does it: an elementwise instruction takes the
 * temporary holding an operand that it alone reads (made by that operand, or taken in place by
 * it in turn), when the sizes match. The buffer index, or -1.
 */
static int in_place_buffer(const struct memplan *p, const struct hlo_instruction *in,
                           const struct refs *refs, const int *uses, const int *taken,
                           const struct memplan_options *o)
{
	if (in->shape.type == HT_TUPLE || !opcode_is_elementwise(opcode_parse(in->opcode)))
		return -1;
	for (int k = 0; k < in->n_operands; k++) {
		const struct hlo_instruction *op = in->operands[k];
		const struct refs *from = &refs[op->index];
		int times = 0;
		for (int j = 0; j < in->n_operands; j++)
			times += in->operands[j] == op;
		if (from->n != 1 || uses[op->index] != times)
			continue;
		int id = from->ids[0];
		const struct plan_buffer *buf = &p->buffers[id];
		if (buf->kind == BUF_TEMP && (buf->def == op || taken[op->index] == id) &&
		    buf->bytes == aligned(layout_bytes(&in->shape, o->tiled), o->alignment) &&
		    buf->unpadded_bytes == layout_bytes(&in->shape, false))
			return id;
	}
	return -1;
}

/*
 * Elementwise fusion of the entry computation (compiler/fusion.c's rule): fused_into[i] is the
 * instruction whose kernel computes instruction i, or -1. Returns the number fused.
 */
static int fuse(const struct hlo_computation *c, bool on, const bool *held, int *fused_into,
                struct arena *a)
{
	int n = c->n_instructions;
	for (int i = 0; i < n; i++)
		fused_into[i] = -1;
	if (!on)
		return 0;
	int total = 0;
	for (int i = 0; i < n; i++)
		total += c->instructions[i]->n_operands;
	enum opcode *ops = arena_calloc(a, (size_t)n + 1, sizeof(enum opcode));
	int64_t *elements = arena_calloc(a, (size_t)n + 1, sizeof(int64_t));
	int *first = arena_calloc(a, (size_t)n + 2, sizeof(int));
	int *operands = arena_calloc(a, (size_t)total + 1, sizeof(int));
	if (!ops || !elements || !first || !operands)
		return -1;
	int at = 0;
	for (int i = 0; i < n; i++) {
		const struct hlo_instruction *in = c->instructions[i];
		ops[i] = is(in, "optimization-barrier") ? OP_OPT_BARRIER : opcode_parse(in->opcode);
		elements[i] = in->shape.type == HT_TUPLE ? -1 : hlo_shape_elements(&in->shape);
		first[i] = at;
		for (int k = 0; k < in->n_operands; k++)
			operands[at++] = in->operands[k]->index;
	}
	first[n] = at;
	struct fusion_program p = {n, ops, elements, first, operands, held};
	return fusion_decide(&p, fused_into, a);
}

static int oom(struct builder *b)
{
	return status_set(b->st, ST_RESOURCE_EXHAUSTED, "out of host memory");
}

/* Instructions whose value is their operands' buffers, with nothing of their own. */
static bool forwards(const struct hlo_instruction *in)
{
	static const char *const ops[] = {"bitcast",        "opt-barrier", "optimization-barrier",
	                                  "add-dependency", "domain",      NULL};
	return is_any(in, ops);
}

static bool is_async_start(const struct hlo_instruction *in)
{
	size_t n = strlen(in->opcode);
	return n > 6 && strcmp(in->opcode + n - 6, "-start") == 0;
}

static bool is_async_done(const struct hlo_instruction *in)
{
	size_t n = strlen(in->opcode);
	return n > 5 && strcmp(in->opcode + n - 5, "-done") == 0;
}

static int plan_callee(struct builder *b, const struct hlo_computation *c, int depth);

/*
 * The bytes a call site adds while it runs: a while the larger of its body and condition, a
 * conditional its largest branch, a call or an async computation its callee. Fusions,
 * reducers and comparators run in registers and VMEM: nothing. *callee names the computation
 * whose peak it is (NULL: none).
 */
static int call_extra(struct builder *b, const struct hlo_instruction *in, int depth,
                      int64_t *extra, const struct hlo_computation **callee)
{
	*extra = 0;
	*callee = NULL;
	if (is(in, "fusion") || is(in, "custom-call"))
		return ST_OK;
	for (int k = 0; k < in->n_calls; k++) {
		const struct hlo_call *call = &in->calls[k];
		if (call->role == CALL_TO_APPLY && !is(in, "call"))
			continue;
		int index = -1;
		for (int j = 0; j < b->m->n_computations; j++)
			if (b->m->computations[j] == call->callee)
				index = j;
		if (index < 0)
			continue;
		int rv = plan_callee(b, call->callee, depth + 1);
		if (rv != ST_OK)
			return rv;
		if (b->callees[index].extra > *extra) {
			*extra = b->callees[index].extra;
			*callee = call->callee;
		}
	}
	return ST_OK;
}

/* The parameter that output leaf q may take the bytes of (input_output_alias), or -1. */
static int aliased_parameter(const struct hlo_module *m, const struct hlo_instruction *root, int q)
{
	bool leaves = root->shape.type == HT_TUPLE;
	for (int k = 0; k < m->n_aliases; k++) {
		const struct hlo_alias *al = &m->aliases[k];
		if ((!leaves && al->output_index_len == 0) ||
		    (leaves && al->output_index_len == 1 && al->output_index[0] == q))
			return (int)al->parameter;
	}
	return -1;
}

/*
 * XLA's buffer assignment of the entry's result: every leaf is an output buffer of its own. A
 * leaf that input_output_alias (or buffer_donor, for a parameter of the same size) gives a
 * parameter takes the parameter's bytes (alias_bytes, once per buffer); a leaf that is a
 * parameter, a constant or a buffer already returned is copied (XLA's copy insertion). A tuple
 * result has its index table, 8 bytes per element.
 */
static int assign_outputs(struct builder *b, const struct hlo_computation *c,
                          const struct refs *refs, int n)
{
	struct memplan *out = b->p;
	const struct refs *root = &refs[c->root->index];
	if (b->o->graph_outputs) {
		/*
		 * Several outputs are the program's result tuple, as XLA's programs return them:
		 * their index table is reserved with the temporaries for the whole program.
		 */
		for (int q = 0; q < root->n; q++)
			out->buffers[root->ids[q]].kind = BUF_OUTPUT;
		if (c->root->n_operands > 1) {
			int table = tuple_table(b, c->root, BUF_TEMP, 0);
			if (table < 0)
				return oom(b);
			out->buffers[table].last = n - 1;
		}
		return ST_OK;
	}
	bool *donor_used = arena_calloc(b->a, (size_t)b->m->n_donors + 1, sizeof(bool));
	bool *seen = arena_calloc(b->a, (size_t)out->n_buffers + 1, sizeof(bool));
	if (donor_used == NULL || seen == NULL)
		return oom(b);
	for (int q = 0; q < root->n; q++) {
		int id = root->ids[q];
		struct plan_buffer *buf = &out->buffers[id];
		int param = aliased_parameter(b->m, c->root, q);
		for (int k = 0; param < 0 && k < b->m->n_donors; k++) {
			int64_t p = b->m->donors[k].parameter;
			if (!donor_used[k] && p < c->n_parameters &&
			    layout_bytes(&c->parameters[p]->shape, b->o->tiled) == buf->bytes &&
			    buf->kind != BUF_ARGUMENT) {
				donor_used[k] = true;
				param = (int)p;
			}
		}
		const struct refs *pr = param >= 0 && param < c->n_parameters
		                            ? &refs[c->parameters[param]->index]
		                            : NULL;
		if (pr != NULL && pr->n == 1 && !seen[id]) {
			seen[id] = true;
			out->alias_bytes = layout_add(out->alias_bytes, buf->bytes);
			if (buf->kind == BUF_ARGUMENT) { /* passed through in place */
				out->output_bytes = layout_add(out->output_bytes, buf->bytes);
				continue;
			}
			buf->kind = BUF_OUTPUT;
			buf->aliased = true; /* its bytes are the parameter's */
			buf->last = n - 1;
			continue;
		}
		if (buf->kind == BUF_ARGUMENT || buf->kind == BUF_CONSTANT || seen[id]) {
			int copy = new_buffer(b, c->root, &c->root->shape, BUF_OUTPUT, n - 1);
			if (copy < 0)
				return oom(b);
			struct plan_buffer *cb = &out->buffers[copy];
			buf = &out->buffers[id];
			cb->bytes = buf->bytes;
			cb->unpadded_bytes = buf->unpadded_bytes;
			cb->def = buf->def;
			cb->op = "copy (the entry's result gets a buffer of its own)";
			continue;
		}
		seen[id] = true;
		buf->kind = BUF_OUTPUT;
		buf->last = n - 1;
	}
	if (c->root->shape.type == HT_TUPLE && tuple_table(b, c->root, BUF_OUTPUT, n - 1) < 0)
		return oom(b);
	return ST_OK;
}

/* Per computation planned: live bytes by position, the peak and the call sites' callees. */
struct comp_result {
	int n;
	int64_t *live;
	int peak_at;
	int64_t peak, peak_scratch;
	int64_t heap; /* the reservation: temporaries, constants, scratch and callees by liveness */
	const struct hlo_computation **callee_at; /* [n]: whose peak a position includes */
	int first_buffer;                         /* buffers of this computation from here on */
	int *order;
};

/*
 * The heap of computation c: its temporaries and constants, and at each position the scratch
 * of its collectives and the heap of the callee running there, placed by heap_place; offsets
 * are written into the buffers. The size, or -1 when out of memory.
 */
static int64_t place(struct builder *b, const struct hlo_computation *c, const int64_t *scratch,
                     int n)
{
	struct memplan *out = b->p;
	int count = n;
	for (int j = 0; j < out->n_buffers; j++)
		count += out->buffers[j].comp == c;
	struct heap_block *blocks = arena_calloc(b->a, (size_t)count + 1, sizeof(*blocks));
	if (blocks == NULL)
		return -1;
	int k = 0;
	for (int j = 0; j < out->n_buffers; j++) {
		const struct plan_buffer *buf = &out->buffers[j];
		if (buf->comp == c && (buf->kind == BUF_TEMP || buf->kind == BUF_CONSTANT) &&
		    buf->bytes > 0)
			blocks[k++] = (struct heap_block){buf->bytes, buf->first, buf->last, j, 0};
	}
	for (int i = 0; i < n; i++)
		if (scratch[i] > 0)
			blocks[k++] = (struct heap_block){scratch[i], i, i, -1, 0};
	int64_t size = heap_place(blocks, k, b->a);
	for (int q = 0; q < k; q++)
		if (blocks[q].id >= 0)
			out->buffers[blocks[q].id].offset = blocks[q].offset;
	return size;
}

/*
 * Plans one computation: its buffers (added to b->p), their liveness over its schedule, and
 * the live bytes at each position with collective scratch and callees' peaks. The entry's
 * parameters are arguments and its root's leaves outputs; a nested computation's parameters
 * belong to its caller (no bytes here) and its root's leaves are the caller's result.
 */
static int plan_computation(struct builder *b, const struct hlo_computation *c, bool entry,
                            int depth, struct comp_result *res)
{
	const struct memplan_options *o = b->o;
	struct memplan *out = b->p;
	struct arena *a = b->a;
	int n = c->n_instructions, rv;
	const struct hlo_computation *saved = b->comp;
	b->comp = c;
	memset(res, 0, sizeof(*res));
	res->n = n;
	res->first_buffer = out->n_buffers;
	int *at = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *order = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *position = arena_calloc(a, (size_t)n + 1, sizeof(int));
	bool *held = arena_calloc(a, (size_t)n + 1, sizeof(bool));
	int *uses = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *fused_into = arena_calloc(a, (size_t)n + 1, sizeof(int));
	struct refs *refs = arena_calloc(a, (size_t)n + 1, sizeof(*refs));
	int *split = arena_calloc(a, (size_t)n + 1, sizeof(int)); /* async start: result's ref */
	int *taken = arena_calloc(a, (size_t)n + 1, sizeof(int)); /* the buffer taken in place */
	int64_t *scratch = arena_calloc(a, (size_t)n + 1, sizeof(int64_t));
	int64_t *coll_scratch = arena_calloc(a, (size_t)n + 1, sizeof(int64_t));
	res->callee_at = arena_calloc(a, (size_t)n + 1, sizeof(*res->callee_at));
	if (!at || !order || !position || !held || !uses || !fused_into || !refs || !split ||
	    !taken || !scratch || !coll_scratch || !res->callee_at)
		return oom(b);
	struct combining groups;
	rv = combine_collectives(&groups, c, entry ? o->combine_threshold_bytes : 0, a, b->st);
	if (rv != ST_OK)
		return rv;
	rv = memory_aware_order(c, &groups, entry && !o->recorded_order && !b->m->is_scheduled,
	                        o->tiled, order, entry ? &out->n_delayed : &(int){0}, a, b->st);
	if (rv != ST_OK)
		return rv;
	if (entry)
		out->n_combined = groups.n_combined;
	for (int i = 0; i < n; i++)
		at[i] = groups.leader[i] >= 0 ? groups.leader[i] : i, taken[i] = -1;
	res->order = order;
	/* Positions in the schedule; a merged collective runs where its group's first one does. */
	for (int k = 0; k < n; k++)
		position[order[k]] = k;
	for (int i = 0; i < n; i++)
		at[i] = position[at[i]];
	held[c->root->index] = true;
	if (c->root->shape.type == HT_TUPLE && is(c->root, "tuple"))
		for (int k = 0; k < c->root->n_operands; k++)
			held[c->root->operands[k]->index] = true;
	for (int i = 0; i < n; i++)
		for (int k = 0; k < c->instructions[i]->n_operands; k++)
			uses[c->instructions[i]->operands[k]->index]++;
	int fused = fuse(c, !o->no_fusion, held, fused_into, a);
	if (fused < 0)
		return oom(b);
	out->n_fused += fused;
	static const char *const reducing[] = {"all-reduce", "all-reduce-start", "reduce-scatter",
	                                       NULL};
	static const char *const collectives[] = {
	    "all-gather",         "all-gather-start",         "all-reduce",
	    "all-reduce-start",   "reduce-scatter",           "all-to-all",
	    "collective-permute", "collective-permute-start", NULL};
	for (int k = 0; k < n; k++) {
		int i = order[k];
		const struct hlo_instruction *in = c->instructions[i];
		struct refs *r = &refs[i];
		int reuse;
		if (fused_into[i] >= 0) {
			/* Computed inside the kernel of a later instruction: no buffer. */
		} else if (in->parameter_number >= 0) {
			if (define(b, in, entry ? BUF_ARGUMENT : BUF_TEMP, 0, r) != 0)
				return oom(b);
			if (!entry) /* the caller's bytes */
				for (int j = res->first_buffer; j < out->n_buffers; j++)
					if (out->buffers[j].def == in)
						out->buffers[j].bytes =
						    out->buffers[j].unpadded_bytes = 0;
		} else if (is(in, "constant")) {
			if (define(b, in, BUF_CONSTANT, 0, r) != 0)
				return oom(b);
		} else if (forwards(in) || is(in, "tuple")) {
			/* No memory of its own but a tuple's index table: the operands' buffers. */
			int total = 0;
			for (int j = 0; j < in->n_operands; j++)
				total += refs[in->operands[j]->index].n;
			r->ids = arena_calloc(a, (size_t)total + 1, sizeof(int));
			if (r->ids == NULL)
				return oom(b);
			for (int j = 0; j < in->n_operands; j++) {
				const struct refs *from = &refs[in->operands[j]->index];
				if (from->n > 0)
					memcpy(r->ids + r->n, from->ids,
					       (size_t)from->n * sizeof(int));
				r->n += from->n;
			}
			if (is(in, "tuple") && !(entry && in == c->root) &&
			    tuple_table(b, in, BUF_TEMP, k) < 0)
				return oom(b);
		} else if (is(in, "get-tuple-element")) {
			const struct hlo_instruction *t = in->operands[0];
			const struct refs *from = &refs[t->index];
			*r = *from;
			if (from->n == t->shape.n_tuple) {
				r->ids = from->ids + in->tuple_index;
				r->n = 1;
			}
		} else if (is_async_done(in) && in->n_operands == 1 &&
		           refs[in->operands[0]->index].n > 0) {
			/* The -done is the -start's result buffer: nothing new. */
			const struct refs *from = &refs[in->operands[0]->index];
			int s = split[in->operands[0]->index];
			r->ids = from->ids + (s < from->n ? s : 0);
			r->n = 1;
		} else if (is_async_start(in) && in->shape.type == HT_TUPLE && in->n_operands > 0) {
			/* (operands, result, context...): the operands are the operands' buffers.
			 */
			struct refs keep = {0, NULL};
			keep.ids = arena_calloc(a, 64, sizeof(int));
			if (keep.ids == NULL)
				return oom(b);
			for (int j = 0; j < in->n_operands && keep.n < 64; j++) {
				const struct refs *from = &refs[in->operands[j]->index];
				for (int q = 0; q < from->n && keep.n < 64; q++)
					keep.ids[keep.n++] = from->ids[q];
			}
			split[i] = keep.n;
			if (define_from(b, in, BUF_TEMP, at[i], &keep, r) != 0)
				return oom(b);
		} else if (o->all_gather != AG_NATIVE && is(in, "all-gather") &&
		           in->shape.type != HT_TUPLE) {
			/*
			 * The output-sized zeros holding this core's input (pad, or broadcast +
			 * dynamic-update-slice in place), then an all-reduce of it: in place, or
			 * into a buffer of its own with --no-alias.
			 */
			int padded = new_buffer(b, in, &in->shape, BUF_TEMP, at[i]);
			if (padded < 0)
				return oom(b);
			out->buffers[padded].op =
			    o->all_gather == AG_VIA_ALL_REDUCE
			        ? "pad (all-gather via all-reduce)"
			        : "dynamic-update-slice (decomposed all-gather)";
			r->ids = arena_calloc(a, 2, sizeof(int));
			if (r->ids == NULL)
				return oom(b);
			r->n = 1;
			r->ids[0] =
			    o->no_alias ? new_buffer(b, in, &in->shape, BUF_TEMP, at[i]) : padded;
			if (r->ids[0] < 0)
				return oom(b);
			out->n_rewritten++;
		} else if (!held[i] &&
		           (reuse = in_place_buffer(out, in, refs, uses, taken, o)) >= 0) {
			taken[i] = reuse;
			/* An elementwise result in the bytes of an operand that dies here. */
			r->ids = arena_calloc(a, 2, sizeof(int));
			if (r->ids == NULL)
				return oom(b);
			r->ids[0] = reuse;
			r->n = 1;
			out->n_in_place++;
		} else {
			if (define(b, in, BUF_TEMP, at[i], r) != 0)
				return oom(b);
		}
		/*
		 * Operands stay live up to their last use (a merged collective's is where it runs,
		 * a fused instruction's where its fusion's root runs).
		 */
		int use = fused_into[i] >= 0 ? at[fused_into[i]] : at[i];
		for (int j = 0; j < in->n_operands; j++) {
			const struct refs *from = &refs[in->operands[j]->index];
			for (int q = 0; q < from->n; q++)
				if (out->buffers[from->ids[q]].last < use)
					out->buffers[from->ids[q]].last = use;
		}
		int64_t extra;
		if ((rv = call_extra(b, in, depth, &extra, &res->callee_at[at[i]])) != ST_OK)
			return rv;
		scratch[at[i]] = layout_add(scratch[at[i]], extra);
		if (is_any(in, collectives)) {
			int size;
			if (verify_collective(in, out->world_size, &b->groups, &size, b->st) !=
			    ST_OK)
				return ST_INVALID_ARGUMENT;
			bool rewritten = o->all_gather != AG_NATIVE && is(in, "all-gather") &&
			                 in->shape.type != HT_TUPLE;
			/* A rewritten all-gather is an all-reduce of the output-sized buffer. */
			int64_t reduced = rewritten ? value_bytes(&in->shape)
			                  : is_any(in, reducing) && in->n_operands > 0
			                      ? value_bytes(&in->operands[0]->shape)
			                      : 0;
			int64_t sent = rewritten && size > 1 ? reduced / size * 2 * (size - 1)
			                                     : sent_by(in, size);
			out->sent_bytes = layout_add(out->sent_bytes, sent);
			int64_t chunk = reduced < o->chunk_bytes ? reduced : o->chunk_bytes;
			if (chunk >
			    coll_scratch[at[i]]) { /* a merged collective shares one chunk */
				scratch[at[i]] += chunk - coll_scratch[at[i]];
				coll_scratch[at[i]] = chunk;
			}
		}
	}
	/* Constants live throughout, as parameters do; so does what the root names. */
	for (int j = res->first_buffer; j < out->n_buffers; j++)
		if (out->buffers[j].comp != c)
			continue; /* a callee's, planned in the meantime */
		else if (out->buffers[j].kind == BUF_ARGUMENT ||
		         out->buffers[j].kind == BUF_CONSTANT ||
		         (!entry && out->buffers[j].def != NULL &&
		          out->buffers[j].def->parameter_number >= 0))
			out->buffers[j].last = n - 1;
	const struct refs *root = &refs[c->root->index];
	for (int q = 0; q < root->n; q++) {
		struct plan_buffer *buf = &out->buffers[root->ids[q]];
		buf->last = n - 1;
		/* Written into the caller's result; a loop predicate is the condition's own. */
		if (!entry && !(c->root->shape.type == HT_PRED && c->root->shape.rank == 0))
			buf->bytes = 0;
	}
	if (entry && (rv = assign_outputs(b, c, refs, n)) != ST_OK)
		return rv;
	if (entry) {
		/* Device buffers for the whole program: arguments, and outputs made up front. */
		for (int j = res->first_buffer; j < out->n_buffers; j++)
			if (out->buffers[j].comp == c && (out->buffers[j].kind == BUF_ARGUMENT ||
			                                  out->buffers[j].kind == BUF_OUTPUT)) {
				out->buffers[j].first = 0;
				out->buffers[j].last = n - 1;
			}
		out->order = order;
		out->fused_into = fused_into;
		out->value_buffer = arena_calloc(a, (size_t)n + 1, sizeof(int));
		if (out->value_buffer == NULL)
			return oom(b);
		for (int i = 0; i < n; i++)
			out->value_buffer[i] = refs[i].n == 1 ? refs[i].ids[0] : -1;
	}
	if ((res->heap = place(b, c, scratch, n)) < 0)
		return oom(b);
	/* Live bytes at each position: +bytes at first, -bytes after last. */
	int64_t *delta = arena_calloc(a, (size_t)n + 1, sizeof(int64_t));
	res->live = arena_calloc(a, (size_t)n + 1, sizeof(int64_t));
	if (delta == NULL || res->live == NULL)
		return oom(b);
	for (int j = res->first_buffer; j < out->n_buffers; j++) {
		const struct plan_buffer *buf = &out->buffers[j];
		if (buf->aliased || buf->comp != c)
			continue;
		delta[buf->first] += buf->bytes;
		delta[buf->last + 1] -= buf->bytes;
	}
	int64_t live = 0;
	res->peak = -1;
	for (int k = 0; k < n; k++) {
		live += delta[k];
		res->live[k] = layout_add(live, scratch[k]);
		if (res->live[k] > res->peak) {
			res->peak = res->live[k];
			res->peak_at = k;
			res->peak_scratch = coll_scratch[k];
		}
	}
	b->comp = saved;
	return ST_OK;
}

/*
 * The buffers of c live at its peak (largest first), with those of the callee that runs there
 * (named inside the computation they live in).
 */
static int collect_peak(struct builder *b, const struct hlo_computation *c,
                        const struct comp_result *res, int **list, int *n_list)
{
	struct memplan *out = b->p;
	const struct hlo_computation *callee = res->callee_at[res->peak_at];
	const struct callee_plan *cp = NULL;
	for (int j = 0; callee != NULL && j < b->m->n_computations; j++)
		if (b->m->computations[j] == callee)
			cp = &b->callees[j];
	int extra = cp != NULL ? cp->n_peak_live : 0;
	*list = arena_calloc(b->a, (size_t)out->n_buffers + (size_t)extra + 1, sizeof(int));
	if (*list == NULL)
		return oom(b);
	*n_list = 0;
	for (int k = 0; k < out->n_buffers; k++) {
		const struct plan_buffer *buf = &out->buffers[k];
		if (buf->comp == c && buf->first <= res->peak_at && res->peak_at <= buf->last &&
		    buf->bytes > 0 && !buf->aliased)
			(*list)[(*n_list)++] = k;
	}
	for (int k = 0; k < extra; k++)
		(*list)[(*n_list)++] = cp->peak_live[k];
	qsort_r(*list, (size_t)*n_list, sizeof(int), by_size, out->buffers);
	return ST_OK;
}

/* Plans a called computation once: its extra bytes and the buffers live at its peak. */
static int plan_callee(struct builder *b, const struct hlo_computation *c, int depth)
{
	int index = 0;
	while (index < b->m->n_computations && b->m->computations[index] != c)
		index++;
	struct callee_plan *cp = &b->callees[index];
	if (cp->state == 2)
		return ST_OK;
	if (cp->state == 1 || depth > 64)
		return status_set(b->st, ST_INVALID_ARGUMENT,
		                  "line %d: computation %s calls itself (directly or not)", c->line,
		                  c->name);
	cp->state = 1;
	struct comp_result res;
	int rv = plan_computation(b, c, false, depth, &res);
	if (rv != ST_OK)
		return rv;
	cp->extra = res.heap;
	rv = collect_peak(b, c, &res, &cp->peak_live, &cp->n_peak_live);
	cp->state = 2;
	return rv;
}

int memplan_build(struct memplan *out, const struct hlo_module *m, const struct topology *topo,
                  const struct memplan_options *o, struct arena *a, struct status *st)
{
	memset(out, 0, sizeof(*out));
	const struct hlo_computation *c = m->entry;
	out->world_size = topology_world_size(topo);
	out->all_gather = o->all_gather;
	out->no_alias = o->no_alias;
	out->capacity = topology_bytes_limit(topo);
	out->combine_threshold_bytes = o->combine_threshold_bytes;
	struct memplan_options opts = *o;
	if (opts.chunk_bytes <= 0)
		opts.chunk_bytes = DEFAULT_CHUNK_BYTES;
	if (opts.alignment <= 0)
		opts.alignment = HBM_ALIGNMENT;
	struct builder b = {.p = out, .a = a, .o = &opts, .m = m, .st = st};
	b.callees = arena_calloc(a, (size_t)m->n_computations + 1, sizeof(*b.callees));
	if (b.callees == NULL)
		return oom(&b);
	int rv = verify_module(m, out->world_size, st);
	if (rv != ST_OK)
		return rv;
	struct comp_result res;
	if ((rv = plan_computation(&b, c, true, 0, &res)) != ST_OK)
		return rv;
	out->n_instructions = res.n;
	out->live = res.live;
	out->peak_at = res.peak_at;
	out->peak_scratch = res.peak_scratch;
	out->peak_name = c->instructions[res.order[res.peak_at]]->name;
	for (int k = 0; k < out->n_buffers; k++) {
		const struct plan_buffer *buf = &out->buffers[k];
		out->other_space_bytes = layout_add(out->other_space_bytes, buf->other_space_bytes);
		if (buf->comp != c)
			continue;
		int64_t *sum = buf->kind == BUF_ARGUMENT   ? &out->argument_bytes
		               : buf->kind == BUF_OUTPUT   ? &out->output_bytes
		               : buf->kind == BUF_CONSTANT ? &out->constant_bytes
		                                           : &out->temp_bytes;
		*sum = layout_add(*sum, buf->bytes);
	}
	/* The temporaries are the heap; the constants were counted among them. */
	out->temp_bytes = res.heap;
	out->peak_bytes = layout_add(
	    layout_add(out->argument_bytes, out->output_bytes - out->alias_bytes), out->temp_bytes);
	if ((rv = collect_peak(&b, c, &res, &out->peak_live, &out->n_peak_live)) != ST_OK)
		return rv;
	for (int k = 0; k < out->n_peak_live; k++) {
		const struct plan_buffer *buf = &out->buffers[out->peak_live[k]];
		out->padding_bytes =
		    layout_add(out->padding_bytes, buf->bytes - buf->unpadded_bytes);
	}
	out->n_warnings = m->n_warnings;
	out->warnings = m->warnings;
	out->fits = out->peak_bytes <= out->capacity;
	return ST_OK;
}
