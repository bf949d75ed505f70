#include "assign.h"

#include <stdlib.h>
#include <string.h>

#include "combine.h"
#include "fusion.h"
#include "heap.h"
#include "layout.h"
#include "hlo_collective.h"
#include "schedule.h"

static int oom(struct builder *b)
{
	return status_set(b->st, ST_RESOURCE_EXHAUSTED, "out of host memory");
}

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

static int by_size(const void *x, const void *y, void *arg)
{
	const struct plan_buffer *buffers = arg;
	int64_t a = buffers[*(const int *)x].bytes, b = buffers[*(const int *)y].bytes;
	return a < b ? 1 : a > b ? -1 : *(const int *)x - *(const int *)y;
}

/*
 * In-place reuse, as XLA's buffer assignment does it: an elementwise instruction (or a
 * dynamic-update-slice, of its operand 0) takes the temporary holding an operand that it alone
 * reads (made by that operand, or taken in place by it in turn), when the sizes match. The
 * buffer index, or -1.
 */
static int in_place_buffer(const struct memplan *p, const struct hlo_instruction *in,
                           const struct refs *refs, const int *uses, const int *taken,
                           const struct memplan_options *o)
{
	enum opcode code = opcode_parse(in->opcode);
	/* Writes into its operand 0: an update, or a strategy's all-reduce (compiler/strategy.c).
	 */
	bool update =
	    code == OP_DYNAMIC_UPDATE_SLICE || (code == OP_ALL_REDUCE && in->may_alias_operand);
	if (in->shape.type == HT_TUPLE || (!opcode_is_elementwise(code) && !update))
		return -1;
	for (int k = 0; k < (update ? 1 : in->n_operands); k++) {
		const struct hlo_instruction *op = in->operands[k];
		const struct refs *from = &refs[op->index];
		int times = 0;
		for (int j = 0; j < in->n_operands; j++)
			times += in->operands[j] == op;
		if (from->n != 1 || uses[op->index] != times)
			continue;
		int id = from->ids[0];
		const struct plan_buffer *buf = &p->buffers[id];
		/* Only within one memory space: HBM to HBM, or outside it. */
		bool same_space = (buf->other_space_bytes > 0) == !layout_in_hbm(&in->shape);
		if (buf->kind == BUF_TEMP && (buf->def == op || taken[op->index] == id) &&
		    same_space &&
		    buf->bytes == aligned(layout_bytes(&in->shape, o->tiled), o->alignment) &&
		    buf->unpadded_bytes == layout_bytes(&in->shape, false))
			return id;
	}
	return -1;
}

/* Instructions whose value is their operands' buffers, with nothing of their own. */
static bool forwards(const struct hlo_instruction *in)
{
	static const char *const ops[] = {"bitcast",        "opt-barrier", "optimization-barrier",
	                                  "add-dependency", "domain",      NULL};
	return hlo_is_any(in, ops);
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
	if (hlo_is(in, "fusion") || hlo_is(in, "custom-call"))
		return ST_OK;
	for (int k = 0; k < in->n_calls; k++) {
		const struct hlo_call *call = &in->calls[k];
		if (call->role == CALL_TO_APPLY && !hlo_is(in, "call"))
			continue;
		int index = call->callee != NULL ? call->callee->index : -1;
		if (index < 0 || index >= b->m->n_computations ||
		    b->m->computations[index] != call->callee)
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
 * A parameter of the buffer_donor list (or, for a step graph, a buffer the client released)
 * that output buffer ob may take: the same size, unused so far, and read for the last time
 * before ob is first written, or by the instruction writing it when that works in place
 * (elementwise, dynamic-update-slice). Of those, the one read last, so that earlier donors
 * stay for earlier outputs. Its parameter number, or -1.
 */
static int donor_for(struct builder *b, const struct hlo_computation *c, const struct refs *refs,
                     const struct plan_buffer *ob, bool *used)
{
	enum opcode writer = ob->def != NULL ? opcode_parse(ob->def->opcode) : OP_INVALID;
	bool in_place = opcode_is_elementwise(writer) || writer == OP_DYNAMIC_UPDATE_SLICE;
	int best = -1, best_last = -1;
	for (int k = 0; k < b->m->n_donors; k++) {
		int64_t p = b->m->donors[k].parameter;
		if (used[k] || p < 0 || p >= c->n_parameters)
			continue;
		const struct refs *pr = &refs[c->parameters[p]->index];
		if (pr->n != 1)
			continue;
		const struct plan_buffer *pb = &b->p->buffers[pr->ids[0]];
		if (pb->bytes == ob->bytes && ob->kind != BUF_ARGUMENT &&
		    (pb->last < ob->first || (pb->last == ob->first && in_place)) &&
		    pb->last > best_last) {
			best = k;
			best_last = pb->last;
		}
	}
	if (best < 0)
		return -1;
	used[best] = true;
	return (int)b->m->donors[best].parameter;
}

/* Output buffer buf takes the bytes of parameter param: counted once, as alias_bytes. */
static void alias_output(struct memplan *out, struct plan_buffer *buf, int param, int n)
{
	out->alias_bytes = layout_add(out->alias_bytes, buf->bytes);
	if (buf->kind == BUF_ARGUMENT) { /* passed through in place */
		out->output_bytes = layout_add(out->output_bytes, buf->bytes);
		return;
	}
	buf->kind = BUF_OUTPUT;
	buf->aliased = true;
	buf->donor = param;
	buf->last = n - 1;
}

/*
 * XLA's buffer assignment of the entry's result: every leaf is an output buffer of its own. A
 * leaf that input_output_alias (or buffer_donor) gives a parameter takes the parameter's bytes
 * (alias_bytes, once per buffer); a leaf that is a parameter, a constant or a buffer already
 * returned is copied (XLA's copy insertion). A tuple result has its index table, 8 bytes per
 * element. A step graph's outputs (graph_outputs) are distinct buffers already; their tuple's
 * table is reserved with the temporaries, and they take donated buffers the same way.
 */
static int assign_outputs(struct builder *b, const struct hlo_computation *c,
                          const struct refs *refs, int n)
{
	struct memplan *out = b->p;
	const struct refs *root = &refs[c->root->index];
	bool *donor_used = arena_calloc(b->a, (size_t)b->m->n_donors + 1, sizeof(bool));
	bool *seen = arena_calloc(b->a, (size_t)out->n_buffers + 1, sizeof(bool));
	if (donor_used == NULL || seen == NULL)
		return oom(b);
	if (b->o->graph_outputs) {
		for (int q = 0; q < root->n; q++) {
			struct plan_buffer *buf = &out->buffers[root->ids[q]];
			int param = donor_for(b, c, refs, buf, donor_used);
			buf->kind = BUF_OUTPUT;
			if (param >= 0)
				alias_output(out, buf, param, n);
		}
		if (c->root->n_operands > 1) {
			int table = tuple_table(b, c->root, BUF_TEMP, 0);
			if (table < 0)
				return oom(b);
			out->buffers[table].last = n - 1;
		}
		return ST_OK;
	}
	for (int q = 0; q < root->n; q++) {
		int id = root->ids[q];
		struct plan_buffer *buf = &out->buffers[id];
		int param = aliased_parameter(b->m, c->root, q);
		if (param < 0 && !seen[id])
			param = donor_for(b, c, refs, buf, donor_used);
		const struct refs *pr = param >= 0 && param < c->n_parameters
		                            ? &refs[c->parameters[param]->index]
		                            : NULL;
		if (pr != NULL && pr->n == 1 && !seen[id]) {
			seen[id] = true;
			alias_output(out, buf, param, n);
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

/*
 * The heap of computation c: its temporaries and constants, and at each position the scratch
 * of its collectives and the heap of the callee running there, placed by heap_place; offsets
 * are written into the buffers. The size, or -1 when out of memory.
 */
static int64_t place(struct builder *b, const struct hlo_computation *c, const int64_t *scratch,
                     const int *order, int n)
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
	struct comp_plan *cp = &out->comps[c->index];
	for (int q = 0; q < k; q++)
		if (blocks[q].id >= 0)
			out->buffers[blocks[q].id].offset = blocks[q].offset;
		else /* position first's scratch: a callee's heap starts there */
			cp->callee_at[order[blocks[q].first]] = blocks[q].offset;
	cp->heap = size;
	return size;
}

/* What planning one computation keeps per instruction. */
struct comp_state {
	const struct hlo_computation *c;
	bool entry;
	int n;
	int *at;           /* where it runs: a merged collective where its group's first does */
	int *order;        /* the schedule */
	bool *held;        /* values the computation's result names */
	int *uses;         /* operand slots naming it */
	int *fused_into;   /* the fusion root computing it, or -1 */
	struct refs *refs; /* its value's buffers */
	int *split;        /* async start: where its result's buffers begin in refs */
	int *taken;        /* the buffer it took in place, or -1 */
	int64_t *scratch;  /* per position: collective scratch and callees' heaps */
	int64_t *coll_scratch;
};

/* Combining, the schedule, positions, uses and fusion of c. */
static int prepare(struct builder *b, struct comp_state *x, struct comp_result *res)
{
	const struct memplan_options *o = b->o;
	struct memplan *out = b->p;
	struct arena *a = b->a;
	const struct hlo_computation *c = x->c;
	int n = x->n, rv;
	x->at = arena_calloc(a, (size_t)n + 1, sizeof(int));
	x->order = arena_calloc(a, (size_t)n + 1, sizeof(int));
	x->held = arena_calloc(a, (size_t)n + 1, sizeof(bool));
	x->uses = arena_calloc(a, (size_t)n + 1, sizeof(int));
	x->fused_into = arena_calloc(a, (size_t)n + 1, sizeof(int));
	x->refs = arena_calloc(a, (size_t)n + 1, sizeof(*x->refs));
	x->split = arena_calloc(a, (size_t)n + 1, sizeof(int));
	x->taken = arena_calloc(a, (size_t)n + 1, sizeof(int));
	x->scratch = arena_calloc(a, (size_t)n + 1, sizeof(int64_t));
	x->coll_scratch = arena_calloc(a, (size_t)n + 1, sizeof(int64_t));
	int *position = arena_calloc(a, (size_t)n + 1, sizeof(int));
	res->callee_at = arena_calloc(a, (size_t)n + 1, sizeof(*res->callee_at));
	if (!x->at || !x->order || !x->held || !x->uses || !x->fused_into || !x->refs ||
	    !x->split || !x->taken || !x->scratch || !x->coll_scratch || !position ||
	    !res->callee_at)
		return oom(b);
	struct combining groups;
	rv = combine_collectives(&groups, c, x->entry ? o->combine_threshold_bytes : 0, a, b->st);
	if (rv != ST_OK)
		return rv;
	rv = schedule_computation(c, &groups, x->entry && !o->recorded_order && !b->m->is_scheduled,
	                          o->tiled, x->order, x->entry ? &out->n_delayed : &(int){0}, a,
	                          b->st);
	if (rv != ST_OK)
		return rv;
	if (x->entry)
		out->n_combined = groups.n_combined;
	res->order = x->order;
	/* Positions in the schedule; a merged collective runs where its group's first one does. */
	for (int k = 0; k < n; k++)
		position[x->order[k]] = k;
	for (int i = 0; i < n; i++) {
		x->at[i] = position[groups.leader[i] >= 0 ? groups.leader[i] : i];
		x->taken[i] = -1;
		for (int k = 0; k < c->instructions[i]->n_operands; k++)
			x->uses[c->instructions[i]->operands[k]->index]++;
	}
	x->held[c->root->index] = true;
	if (c->root->shape.type == HT_TUPLE && hlo_is(c->root, "tuple"))
		for (int k = 0; k < c->root->n_operands; k++)
			x->held[c->root->operands[k]->index] = true;
	int fused = fusion_computation(c, !o->no_fusion, x->held, x->fused_into, a);
	if (fused < 0)
		return oom(b);
	out->n_fused += fused;
	return ST_OK;
}

/* refs = the operands' buffers, concatenated (n_extra more slots). */
static int concat_operands(struct builder *b, const struct comp_state *x,
                           const struct hlo_instruction *in, struct refs *r)
{
	int total = 0;
	for (int j = 0; j < in->n_operands; j++)
		total += x->refs[in->operands[j]->index].n;
	r->ids = arena_calloc(b->a, (size_t)total + 1, sizeof(int));
	if (r->ids == NULL)
		return oom(b);
	r->n = 0;
	for (int j = 0; j < in->n_operands; j++) {
		const struct refs *from = &x->refs[in->operands[j]->index];
		if (from->n > 0)
			memcpy(r->ids + r->n, from->ids, (size_t)from->n * sizeof(int));
		r->n += from->n;
	}
	return ST_OK;
}

static int one_ref(struct builder *b, struct refs *r, int id)
{
	r->ids = arena_calloc(b->a, 2, sizeof(int));
	if (r->ids == NULL || id < 0)
		return oom(b);
	r->ids[0] = id;
	r->n = 1;
	return ST_OK;
}

/*
 * The buffers of the k-th instruction run: none (fused), its operands' (forwarding ops,
 * tuples, get-tuple-element, async -done), an operand's that dies there (in place), or new.
 */
static int assign_value(struct builder *b, struct comp_state *x, int k,
                        const struct comp_result *res)
{
	const struct memplan_options *o = b->o;
	struct memplan *out = b->p;
	const struct hlo_computation *c = x->c;
	int i = x->order[k], reuse;
	const struct hlo_instruction *in = c->instructions[i];
	struct refs *r = &x->refs[i];
	if (x->fused_into[i] >= 0)
		return ST_OK; /* computed inside the kernel of a later instruction: no buffer */
	if (in->parameter_number >= 0) {
		if (define(b, in, x->entry ? BUF_ARGUMENT : BUF_TEMP, 0, r) != 0)
			return oom(b);
		if (!x->entry) /* the caller's bytes */
			for (int j = res->first_buffer; j < out->n_buffers; j++)
				if (out->buffers[j].def == in)
					out->buffers[j].bytes = out->buffers[j].unpadded_bytes = 0;
		return ST_OK;
	}
	if (hlo_is(in, "constant"))
		return define(b, in, BUF_CONSTANT, 0, r) != 0 ? oom(b) : ST_OK;
	if (forwards(in) || hlo_is(in, "tuple")) {
		/* No memory of its own but a tuple's index table: the operands' buffers. */
		if (concat_operands(b, x, in, r) != ST_OK)
			return ST_RESOURCE_EXHAUSTED;
		if (hlo_is(in, "tuple") && !(x->entry && in == c->root) &&
		    tuple_table(b, in, BUF_TEMP, k) < 0)
			return oom(b);
		return ST_OK;
	}
	if (hlo_is(in, "get-tuple-element")) {
		const struct hlo_instruction *t = in->operands[0];
		const struct refs *from = &x->refs[t->index];
		*r = *from;
		if (from->n == t->shape.n_tuple) {
			r->ids = from->ids + in->tuple_index;
			r->n = 1;
		}
		return ST_OK;
	}
	if (is_async_done(in) && in->n_operands == 1 && x->refs[in->operands[0]->index].n > 0) {
		/* The -done is the -start's result buffer: nothing new. */
		const struct refs *from = &x->refs[in->operands[0]->index];
		int s = x->split[in->operands[0]->index];
		r->ids = from->ids + (s < from->n ? s : 0);
		r->n = 1;
		return ST_OK;
	}
	if (is_async_start(in) && in->shape.type == HT_TUPLE && in->n_operands > 0) {
		/* (operands, result, context...): the operands are the operands' buffers. */
		struct refs keep;
		if (concat_operands(b, x, in, &keep) != ST_OK)
			return ST_RESOURCE_EXHAUSTED;
		x->split[i] = keep.n;
		return define_from(b, in, BUF_TEMP, x->at[i], &keep, r) != 0 ? oom(b) : ST_OK;
	}
	if ((x->entry || !x->held[i]) &&
	    (reuse = in_place_buffer(out, in, x->refs, x->uses, x->taken, o)) >= 0) {
		/*
		 * A result in the bytes of an operand that dies here; an entry output too (the
		 * operand is then computed into the output's buffer).
		 */
		x->taken[i] = reuse;
		out->n_in_place++;
		return one_ref(b, r, reuse);
	}
	return define(b, in, BUF_TEMP, x->at[i], r) != 0 ? oom(b) : ST_OK;
}

/*
 * What instruction i adds around it: its operands stay live up to their last use (a merged
 * collective's is where it runs, a fused instruction's where its fusion's root runs), the
 * heap of a callee running there, a collective's scratch and bytes sent.
 */
static int account(struct builder *b, struct comp_state *x, int i, int depth,
                   struct comp_result *res)
{
	const struct memplan_options *o = b->o;
	struct memplan *out = b->p;
	const struct hlo_instruction *in = x->c->instructions[i];
	int at = x->at[i], rv;
	int use = x->fused_into[i] >= 0 ? x->at[x->fused_into[i]] : at;
	for (int j = 0; j < in->n_operands; j++) {
		const struct refs *from = &x->refs[in->operands[j]->index];
		for (int q = 0; q < from->n; q++)
			if (out->buffers[from->ids[q]].last < use)
				out->buffers[from->ids[q]].last = use;
	}
	int64_t extra;
	if ((rv = call_extra(b, in, depth, &extra, &res->callee_at[at])) != ST_OK)
		return rv;
	x->scratch[at] = layout_add(x->scratch[at], extra);
	if (hlo_collective_op(in) == OP_INVALID)
		return ST_OK;
	int size;
	if (verify_collective(in, out->world_size, &b->groups, &size, b->st) != ST_OK)
		return ST_INVALID_ARGUMENT;
	int64_t sent = hlo_collective_sent(in, size);
	out->sent_bytes = layout_add(out->sent_bytes, sent);
	enum opcode op = opcode_parse(in->opcode);
	out->sent_by_op[op] = layout_add(out->sent_by_op[op], sent);
	struct coll_workspace w;
	if (hlo_collective_workspace(&w, in, out->world_size, out->cores_per_host, o->chunk_bytes,
	                             o->window, o->collective_algorithm, b->st) != ST_OK)
		return ST_INVALID_ARGUMENT;
	int64_t need = w.staging + w.work;
	if (need > x->coll_scratch[at]) { /* a merged collective shares one workspace */
		x->scratch[at] += need - x->coll_scratch[at];
		x->coll_scratch[at] = need;
	}
	return ST_OK;
}

/* Lifetimes that reach the end, the entry's outputs, the heap and the live bytes. */
static int finish(struct builder *b, struct comp_state *x, struct comp_result *res)
{
	struct memplan *out = b->p;
	const struct hlo_computation *c = x->c;
	int n = x->n, rv;
	/* The entry's outputs first, while parameters' lifetimes still end at their last use. */
	if (x->entry && (rv = assign_outputs(b, c, x->refs, n)) != ST_OK)
		return rv;
	/* Constants live throughout, as parameters do; so does what the root names. */
	for (int j = res->first_buffer; j < out->n_buffers; j++) {
		struct plan_buffer *buf = &out->buffers[j];
		if (buf->comp != c)
			continue; /* a callee's, planned in the meantime */
		if (buf->kind == BUF_ARGUMENT || buf->kind == BUF_CONSTANT ||
		    (!x->entry && buf->def != NULL && buf->def->parameter_number >= 0))
			buf->last = n - 1;
	}
	const struct refs *root = &x->refs[c->root->index];
	for (int q = 0; q < root->n; q++) {
		struct plan_buffer *buf = &out->buffers[root->ids[q]];
		buf->last = n - 1;
		/* Written into the caller's result; a loop predicate is the condition's own. */
		if (!x->entry && !(c->root->shape.type == HT_PRED && c->root->shape.rank == 0))
			buf->bytes = 0;
	}
	if (x->entry) {
		/* Device buffers for the whole program: arguments, and outputs made up front. */
		for (int j = res->first_buffer; j < out->n_buffers; j++) {
			struct plan_buffer *buf = &out->buffers[j];
			if (buf->comp == c &&
			    (buf->kind == BUF_ARGUMENT || buf->kind == BUF_OUTPUT)) {
				buf->first = 0;
				buf->last = n - 1;
			}
		}
		out->order = x->order;
		out->fused_into = x->fused_into;
		out->value_buffer = arena_calloc(b->a, (size_t)n + 1, sizeof(int));
		if (out->value_buffer == NULL)
			return oom(b);
		for (int i = 0; i < n; i++)
			out->value_buffer[i] = x->refs[i].n == 1 ? x->refs[i].ids[0] : -1;
	}
	/* What the pod needs to run this computation. */
	struct comp_plan *cp = &out->comps[c->index];
	cp->n = n;
	cp->order = x->order;
	cp->fused_into = x->fused_into;
	cp->n_values = arena_calloc(b->a, (size_t)n + 1, sizeof(int));
	cp->values = arena_calloc(b->a, (size_t)n + 1, sizeof(int *));
	cp->callee_at = arena_calloc(b->a, (size_t)n + 1, sizeof(int64_t));
	cp->scratch_at = arena_calloc(b->a, (size_t)n + 1, sizeof(int64_t));
	cp->scratch_bytes = arena_calloc(b->a, (size_t)n + 1, sizeof(int64_t));
	if (cp->n_values == NULL || cp->values == NULL || cp->callee_at == NULL ||
	    cp->scratch_at == NULL || cp->scratch_bytes == NULL)
		return oom(b);
	for (int i = 0; i < n; i++) {
		cp->n_values[i] = x->refs[i].n;
		cp->values[i] = x->refs[i].ids;
		cp->callee_at[i] = -1;
		cp->scratch_at[i] = -1;
	}
	if ((res->heap = place(b, c, x->scratch, x->order, n)) < 0)
		return oom(b);
	/*
	 * A collective's workspace closes the block placed where it runs (a merged one shares
	 * its group's, whose members run one after the other from there).
	 */
	for (int i = 0; i < n; i++) {
		int at = x->at[i];
		if (x->coll_scratch[at] <= 0 || x->fused_into[i] >= 0 ||
		    hlo_collective_op(c->instructions[i]) == OP_INVALID)
			continue;
		cp->scratch_bytes[i] = x->coll_scratch[at];
		cp->scratch_at[i] =
		    cp->callee_at[x->order[at]] + x->scratch[at] - x->coll_scratch[at];
	}
	/* Live bytes at each position: +bytes at first, -bytes after last. */
	int64_t *delta = arena_calloc(b->a, (size_t)n + 1, sizeof(int64_t));
	res->live = arena_calloc(b->a, (size_t)n + 1, sizeof(int64_t));
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
		res->live[k] = layout_add(live, x->scratch[k]);
		if (res->live[k] > res->peak) {
			res->peak = res->live[k];
			res->peak_at = k;
			res->peak_scratch = x->coll_scratch[k];
		}
	}
	return ST_OK;
}

int assign_computation(struct builder *b, const struct hlo_computation *c, bool entry, int depth,
                       struct comp_result *res)
{
	const struct hlo_computation *saved = b->comp;
	b->comp = c;
	memset(res, 0, sizeof(*res));
	res->n = c->n_instructions;
	res->first_buffer = b->p->n_buffers;
	struct comp_state x = {.c = c, .entry = entry, .n = c->n_instructions};
	int rv = prepare(b, &x, res);
	for (int k = 0; rv == ST_OK && k < x.n; k++)
		if ((rv = assign_value(b, &x, k, res)) == ST_OK)
			rv = account(b, &x, x.order[k], depth, res);
	if (rv == ST_OK)
		rv = finish(b, &x, res);
	b->comp = saved;
	return rv;
}

int assign_peak_set(struct builder *b, const struct hlo_computation *c,
                    const struct comp_result *res, int **list, int *n_list)
{
	struct memplan *out = b->p;
	const struct hlo_computation *callee = res->callee_at[res->peak_at];
	const struct callee_plan *cp = callee != NULL ? &b->callees[callee->index] : NULL;
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
	struct callee_plan *cp = &b->callees[c->index]; /* checked by call_extra */
	if (cp->state == 2)
		return ST_OK;
	if (cp->state == 1 || depth > 64)
		return status_set(b->st, ST_INVALID_ARGUMENT,
		                  "line %d: computation %s calls itself (directly or not)", c->line,
		                  c->name);
	cp->state = 1;
	struct comp_result res;
	int rv = assign_computation(b, c, false, depth, &res);
	if (rv != ST_OK)
		return rv;
	cp->extra = res.heap;
	rv = assign_peak_set(b, c, &res, &cp->peak_live, &cp->n_peak_live);
	cp->state = 2;
	return rv;
}
