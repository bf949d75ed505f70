#include "memplan.h"

#include <stdlib.h>
#include <string.h>

#include "collective.h"
#include "fusion.h"
#include "layout.h"
#include "schedule.h"

#define DEFAULT_CHUNK_BYTES (4 << 20)

/* ---- buffer analysis ---- */

struct refs {
	int n;
	int *ids; /* buffers this instruction's value is made of */
};

struct builder {
	struct memplan *p;
	struct arena *a;
	const struct memplan_options *o;
	int cap;
};

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
	buf->def = def;
	buf->kind = kind;
	buf->bytes = layout_bytes(s, b->o->tiled);
	buf->unpadded_bytes = layout_bytes(s, false);
	buf->first = at;
	buf->last = at;
	return b->p->n_buffers++;
}

/* One buffer per element of a tuple shape (so get-tuple-element can name one), else one. */
static int define(struct builder *b, const struct hlo_instruction *in, enum buffer_kind kind,
                  int at, struct refs *out)
{
	int n = in->shape.type == HT_TUPLE ? in->shape.n_tuple : 1;
	out->ids = arena_calloc(b->a, (size_t)n + 1, sizeof(int));
	if (out->ids == NULL)
		return -1;
	out->n = n;
	for (int k = 0; k < n; k++) {
		const struct hlo_shape *s =
		    in->shape.type == HT_TUPLE ? &in->shape.tuple[k] : &in->shape;
		if ((out->ids[k] = new_buffer(b, in, s, kind, at)) < 0)
			return -1;
	}
	return 0;
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

/* The last replica_groups text read and its group size: modules repeat the same groups. */
struct group_cache {
	const char *text;
	int size;
};

/* Group size of a collective: the first group of its replica_groups, or every core. */
static int group_size(const struct hlo_instruction *in, int world, struct group_cache *cache,
                      struct status *st)
{
	const char *text = in->replica_groups;
	if (text == NULL || strcmp(text, "{}") == 0 || strcmp(text, "{{}}") == 0)
		return world;
	if (cache->text != NULL && strcmp(cache->text, text) == 0)
		return cache->size;
	int64_t *ids;
	int *sizes, n;
	if (coll_groups_parse(text, &ids, &sizes, &n, st) != ST_OK) {
		status_set(st, ST_INVALID_ARGUMENT, "line %d: %s: replica_groups=%s: %s", in->line,
		           in->name, text, st->message);
		return -1;
	}
	int size = n > 0 ? sizes[0] : world;
	int64_t total = 0;
	for (int g = 0; g < n; g++)
		total += sizes[g];
	for (int64_t k = 0; k < total; k++)
		if (ids[k] >= world) {
			status_set(
			    st, ST_INVALID_ARGUMENT,
			    "line %d: %s: replica_groups=%s names replica %lld, but the pod has "
			    "%d cores",
			    in->line, in->name, text, (long long)ids[k], world);
			size = -1;
			break;
		}
	free(ids);
	free(sizes);
	if (size < 0)
		return -1;
	*cache = (struct group_cache){text, size};
	return size;
}

static int64_t value_bytes(const struct hlo_shape *s)
{
	return layout_bytes(s, false);
}

static bool same_text(const char *a, const char *b)
{
	return (a == NULL && b == NULL) || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

/*
 * The combiners: each collective merged into an earlier one of its kind gets that one's place
 * in at[] (else its own index). Returns how many were merged.
 */
static int combine(const struct hlo_computation *c, int64_t threshold, int *at)
{
	static const char *const kinds[] = {"all-gather", "reduce-scatter", "all-reduce"};
	struct {
		int first;
		int64_t bytes;
	} open[3] = {{-1, 0}, {-1, 0}, {-1, 0}};
	int merged = 0;
	for (int i = 0; i < c->n_instructions; i++) {
		const struct hlo_instruction *in = c->instructions[i];
		at[i] = i;
		if (strcmp(in->opcode, "opt-barrier") == 0 ||
		    strcmp(in->opcode, "optimization-barrier") == 0) {
			for (int k = 0; k < 3; k++)
				open[k].first = -1; /* nothing is combined across a barrier */
			continue;
		}
		int kind = -1;
		for (int k = 0; k < 3; k++)
			if (strcmp(in->opcode, kinds[k]) == 0)
				kind = k;
		if (kind < 0 || threshold <= 0 || in->shape.type == HT_TUPLE)
			continue;
		int64_t bytes = value_bytes(&in->shape);
		int first = open[kind].first;
		bool fits = first >= 0 && open[kind].bytes + bytes <= threshold;
		if (fits) {
			const struct hlo_instruction *f = c->instructions[first];
			fits = same_text(f->replica_groups, in->replica_groups) &&
			       same_text(f->to_apply_name, in->to_apply_name) &&
			       f->n_dimensions == in->n_dimensions &&
			       (in->n_dimensions == 0 ||
			        memcmp(f->dimensions, in->dimensions,
			               (size_t)in->n_dimensions * sizeof(int64_t)) == 0);
			/* Independent: everything it reads exists where the first one runs. */
			for (int j = 0; fits && j < in->n_operands; j++)
				fits = in->operands[j]->index < first;
		}
		if (fits) {
			at[i] = first;
			open[kind].bytes += bytes;
			merged++;
		} else {
			open[kind].first = i;
			open[kind].bytes = bytes;
		}
	}
	return merged;
}

/* What one core sends in a collective, nccl-tests' way of counting. */
static int64_t sent_by(const struct hlo_instruction *in, int n)
{
	if (n <= 1)
		return 0;
	int64_t out = value_bytes(&in->shape);
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
static int memory_aware_order(const struct hlo_computation *c, const int *merged_into, bool on,
                              bool tiled, int *order, int *n_delayed, struct arena *a,
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
		    is(in->operands[0], "tuple") && in->tuple_index < in->operands[0]->n_operands)
			alias_of[i] = in->operands[0]->operands[in->tuple_index]->index;
		first[i] = at;
		for (int k = 0; k < in->n_operands; k++)
			operands[at++] = in->operands[k]->index;
		first[i + 1] = at;
	}
	held[c->root->index] = true;
	if (is(c->root, "tuple"))
		for (int k = 0; k < c->root->n_operands; k++)
			held[c->root->operands[k]->index] = true;
	/* Combined collectives (merged_into[j] = the first of the group) stay with their group. */
	int *leader = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *next = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *tail = arena_calloc(a, (size_t)n + 1, sizeof(int));
	if (!leader || !next || !tail)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int i = 0; i < n; i++) {
		leader[i] = merged_into[i] != i ? merged_into[i] : -1;
		next[i] = -1;
		tail[i] = i;
	}
	for (int j = 0; j < n; j++)
		if (leader[j] >= 0) {
			next[tail[leader[j]]] = j;
			tail[leader[j]] = j;
		}
	struct sched_program p = {n, ops, bytes, first, operands, alias_of, held};
	return schedule_delays(&p, leader, next, NULL, on, order, n_delayed, a, st);
}

/*
 * In-place reuse (the coordinator's rule): an elementwise instruction takes the temporary of an
 * operand that it alone reads, when the bytes match. The buffer index, or -1.
 */
static int in_place_buffer(const struct memplan *p, const struct hlo_instruction *in,
                           const struct refs *refs, const int *uses, bool tiled)
{
	if (in->shape.type == HT_TUPLE || !opcode_is_elementwise(opcode_parse(in->opcode)))
		return -1;
	for (int k = 0; k < in->n_operands; k++) {
		const struct hlo_instruction *o = in->operands[k];
		const struct refs *from = &refs[o->index];
		int times = 0;
		for (int j = 0; j < in->n_operands; j++)
			times += in->operands[j] == o;
		if (from->n != 1 || uses[o->index] != times)
			continue;
		const struct plan_buffer *buf = &p->buffers[from->ids[0]];
		if (buf->kind == BUF_TEMP && buf->def == o &&
		    buf->bytes == layout_bytes(&in->shape, tiled) &&
		    buf->unpadded_bytes == layout_bytes(&in->shape, false))
			return from->ids[0];
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

int memplan_build(struct memplan *out, const struct hlo_module *m, const struct topology *topo,
                  const struct memplan_options *o, struct arena *a, struct status *st)
{
	memset(out, 0, sizeof(*out));
	const struct hlo_computation *c = m->entry;
	int n = c->n_instructions;
	out->world_size = topology_world_size(topo);
	out->all_gather = o->all_gather;
	out->no_alias = o->no_alias;
	out->capacity = topology_bytes_limit(topo);
	struct memplan_options opts = *o;
	if (opts.chunk_bytes <= 0)
		opts.chunk_bytes = DEFAULT_CHUNK_BYTES;
	struct builder b = {out, a, &opts, 0};
	struct group_cache groups = {NULL, 0};
	int *at = arena_calloc(a, (size_t)n + 1, sizeof(int));
	if (at == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	out->combine_threshold_bytes = opts.combine_threshold_bytes;
	out->n_combined = combine(c, opts.combine_threshold_bytes, at);
	int *order = arena_calloc(a, (size_t)n + 1, sizeof(int));
	if (order == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	int rv = memory_aware_order(c, at, !opts.recorded_order, opts.tiled, order, &out->n_delayed,
	                            a, st);
	if (rv != ST_OK)
		return rv;
	/* Positions in the schedule; a merged collective runs where its group's first one does. */
	int *position = arena_calloc(a, (size_t)n + 1, sizeof(int));
	if (position == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int k = 0; k < n; k++)
		position[order[k]] = k;
	for (int i = 0; i < n; i++)
		at[i] = position[at[i]];
	/* The root's values are outputs; uses[i] counts the operands naming instruction i. */
	bool *held = arena_calloc(a, (size_t)n + 1, sizeof(bool));
	int *uses = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *fused_into = arena_calloc(a, (size_t)n + 1, sizeof(int));
	if (held == NULL || uses == NULL || fused_into == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	held[c->root->index] = true;
	if (c->root->shape.type == HT_TUPLE && is(c->root, "tuple"))
		for (int k = 0; k < c->root->n_operands; k++)
			held[c->root->operands[k]->index] = true;
	for (int i = 0; i < n; i++)
		for (int k = 0; k < c->instructions[i]->n_operands; k++)
			uses[c->instructions[i]->operands[k]->index]++;
	if ((out->n_fused = fuse(c, !opts.no_fusion, held, fused_into, a)) < 0)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	struct refs *refs = arena_calloc(a, (size_t)n, sizeof(*refs));
	int64_t *scratch = arena_calloc(a, (size_t)n, sizeof(int64_t));
	if (refs == NULL || scratch == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	static const char *const aliasing[] = {"bitcast", "opt-barrier", "optimization-barrier",
	                                       "tuple", NULL};
	static const char *const reducing[] = {"all-reduce", "all-reduce-start", "reduce-scatter",
	                                       NULL};
	static const char *const collectives[] = {
	    "all-gather",         "all-gather-start",         "all-reduce",
	    "all-reduce-start",   "reduce-scatter",           "all-to-all",
	    "collective-permute", "collective-permute-start", NULL};
	for (int i = 0; i < n; i++) {
		const struct hlo_instruction *in = c->instructions[i];
		struct refs *r = &refs[i];
		int reuse;
		if (fused_into[i] >= 0) {
			/* Computed inside the kernel of a later instruction: no buffer. */
		} else if (in->parameter_number >= 0) {
			if (define(&b, in, BUF_ARGUMENT, 0, r) != 0)
				return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		} else if (is_any(in, aliasing)) {
			/* No memory of its own: the operands' buffers, concatenated. */
			int total = 0;
			for (int j = 0; j < in->n_operands; j++)
				total += refs[in->operands[j]->index].n;
			r->ids = arena_calloc(a, (size_t)total + 1, sizeof(int));
			if (r->ids == NULL)
				return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
			for (int j = 0; j < in->n_operands; j++) {
				const struct refs *from = &refs[in->operands[j]->index];
				if (from->n > 0)
					memcpy(r->ids + r->n, from->ids,
					       (size_t)from->n * sizeof(int));
				r->n += from->n;
			}
		} else if (is(in, "get-tuple-element")) {
			if (in->n_operands != 1 || !in->has_index)
				return status_set(
				    st, ST_INVALID_ARGUMENT,
				    "line %d: %s: get-tuple-element needs one operand and "
				    "index=N",
				    in->line, in->name);
			const struct hlo_instruction *t = in->operands[0];
			const struct refs *from = &refs[t->index];
			if (t->shape.type != HT_TUPLE || in->tuple_index >= t->shape.n_tuple)
				return status_set(st, ST_INVALID_ARGUMENT,
				                  "line %d: %s: index %lld is out of range for %s",
				                  in->line, in->name, (long long)in->tuple_index,
				                  t->name);
			*r = *from;
			if (from->n == t->shape.n_tuple) {
				r->ids = from->ids + in->tuple_index;
				r->n = 1;
			}
		} else if (opts.all_gather != AG_NATIVE && is(in, "all-gather") &&
		           in->shape.type != HT_TUPLE) {
			/*
			 * The output-sized zeros holding this core's input (pad, or broadcast +
			 * dynamic-update-slice in place), then an all-reduce of it: in place, or
			 * into a buffer of its own with --no-alias.
			 */
			int padded = new_buffer(&b, in, &in->shape, BUF_TEMP, at[i]);
			if (padded < 0)
				return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
			out->buffers[padded].op =
			    opts.all_gather == AG_VIA_ALL_REDUCE
			        ? "pad (all-gather via all-reduce)"
			        : "dynamic-update-slice (decomposed all-gather)";
			r->ids = arena_calloc(a, 2, sizeof(int));
			if (r->ids == NULL)
				return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
			r->n = 1;
			r->ids[0] = opts.no_alias ? new_buffer(&b, in, &in->shape, BUF_TEMP, at[i])
			                          : padded;
			if (r->ids[0] < 0)
				return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
			out->n_rewritten++;
		} else if (!held[i] &&
		           (reuse = in_place_buffer(out, in, refs, uses, opts.tiled)) >= 0) {
			/* An elementwise result in the bytes of an operand that dies here. */
			r->ids = arena_calloc(a, 2, sizeof(int));
			if (r->ids == NULL)
				return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
			r->ids[0] = reuse;
			r->n = 1;
			out->n_in_place++;
		} else {
			if (define(&b, in, BUF_TEMP, at[i], r) != 0)
				return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		}
		/*
		 * Operands stay live up to their last use (a merged collective's is where it runs,
		 * a fused instruction's where its fusion's root runs).
		 */
		int use = fused_into[i] >= 0 ? at[fused_into[i]] : at[i];
		for (int j = 0; j < in->n_operands; j++) {
			const struct refs *from = &refs[in->operands[j]->index];
			for (int k = 0; k < from->n; k++)
				if (out->buffers[from->ids[k]].last < use)
					out->buffers[from->ids[k]].last = use;
		}
		if (is_any(in, collectives)) {
			int size = group_size(in, out->world_size, &groups, st);
			if (size < 0)
				return ST_INVALID_ARGUMENT;
			bool rewritten = opts.all_gather != AG_NATIVE && is(in, "all-gather") &&
			                 in->shape.type != HT_TUPLE;
			/* A rewritten all-gather is an all-reduce of the output-sized buffer. */
			int64_t reduced = rewritten ? value_bytes(&in->shape)
			                  : is_any(in, reducing) && in->n_operands > 0
			                      ? value_bytes(&in->operands[0]->shape)
			                      : 0;
			out->sent_bytes += rewritten && size > 1 ? reduced / size * 2 * (size - 1)
			                                         : sent_by(in, size);
			int64_t chunk = reduced < opts.chunk_bytes ? reduced : opts.chunk_bytes;
			if (scratch[at[i]] < chunk) /* a merged collective shares one chunk */
				scratch[at[i]] = chunk;
		}
	}
	/* Arguments live throughout; what the root names is an output, live to the end. */
	for (int k = 0; k < out->n_buffers; k++)
		if (out->buffers[k].kind == BUF_ARGUMENT)
			out->buffers[k].last = n - 1;
	const struct refs *root = &refs[c->root->index];
	for (int k = 0; k < root->n; k++) {
		struct plan_buffer *buf = &out->buffers[root->ids[k]];
		if (buf->kind == BUF_ARGUMENT) {
			out->alias_bytes += buf->bytes; /* an output that is an argument */
		} else {
			buf->kind = BUF_OUTPUT;
			buf->last = n - 1;
		}
	}
	for (int k = 0; k < out->n_buffers; k++) {
		const struct plan_buffer *buf = &out->buffers[k];
		int64_t *sum = buf->kind == BUF_ARGUMENT ? &out->argument_bytes
		               : buf->kind == BUF_OUTPUT ? &out->output_bytes
		                                         : &out->temp_bytes;
		*sum += buf->bytes;
	}
	/* Live bytes at each instruction: +bytes at first, -bytes after last. */
	int64_t *delta = arena_calloc(a, (size_t)n + 1, sizeof(int64_t));
	if (delta == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int k = 0; k < out->n_buffers; k++) {
		delta[out->buffers[k].first] += out->buffers[k].bytes;
		delta[out->buffers[k].last + 1] -= out->buffers[k].bytes;
	}
	int64_t live = 0;
	out->peak_bytes = -1;
	out->n_instructions = n;
	out->live = arena_calloc(a, (size_t)n + 1, sizeof(int64_t));
	if (out->live == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int i = 0; i < n; i++) {
		live += delta[i];
		out->live[i] = live + scratch[i];
		if (live + scratch[i] > out->peak_bytes) {
			out->peak_bytes = live + scratch[i];
			out->peak_at = i;
			out->peak_scratch = scratch[i];
		}
	}
	out->peak_name = c->instructions[order[out->peak_at]]->name;
	out->peak_live = arena_calloc(a, (size_t)out->n_buffers + 1, sizeof(int));
	if (out->peak_live == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int k = 0; k < out->n_buffers; k++) {
		const struct plan_buffer *buf = &out->buffers[k];
		if (buf->first <= out->peak_at && out->peak_at <= buf->last && buf->bytes > 0) {
			out->peak_live[out->n_peak_live++] = k;
			out->padding_bytes += buf->bytes - buf->unpadded_bytes;
		}
	}
	qsort_r(out->peak_live, (size_t)out->n_peak_live, sizeof(int), by_size, out->buffers);
	out->fits = out->peak_bytes <= out->capacity;
	return ST_OK;
}

/* ---- reports ---- */

static const char *kind_name(enum buffer_kind k)
{
	return k == BUF_ARGUMENT ? "argument" : k == BUF_OUTPUT ? "output" : "temp";
}

static const char *xla_kind(enum buffer_kind k)
{
	return k == BUF_ARGUMENT ? "HLO argument" : k == BUF_OUTPUT ? "HLO output" : "HLO temp";
}

static void print_largest(FILE *f, const struct memplan *p, int max)
{
	char size[32], unpadded[32], extra[32], shape[512];
	for (int k = 0; k < p->n_peak_live && k < max; k++) {
		const struct plan_buffer *b = &p->buffers[p->peak_live[k]];
		fprintf(f,
		        "  %d. Size: %s\n"
		        "     Operator: op_type=\"%s\"\n"
		        "     Shape: %s\n"
		        "     Unpadded size: %s\n",
		        k + 1, status_human_bytes(size, b->bytes), b->op ? b->op : b->def->opcode,
		        hlo_shape_format(shape, sizeof(shape), &b->def->shape),
		        status_human_bytes(unpadded, b->unpadded_bytes));
		if (b->bytes > b->unpadded_bytes)
			fprintf(f, "     Extra memory due to padding: %s (%.1fx expansion)\n",
			        status_human_bytes(extra, b->bytes - b->unpadded_bytes),
			        b->unpadded_bytes > 0 ? (double)b->bytes / (double)b->unpadded_bytes
			                              : 0.0);
		fprintf(f,
		        "     XLA label: %s = %s(...)\n"
		        "     Allocation type: %s\n"
		        "     ==========================\n\n",
		        b->def->name, b->def->opcode, xla_kind(b->kind));
	}
}

/* What the combiners and an all-gather strategy other than native did to the plan. */
static void print_strategy(FILE *f, const struct memplan *p)
{
	char threshold[32];
	if (p->n_fused > 0)
		fprintf(f,
		        "fused %d elementwise instructions into the kernels of later ones: they "
		        "take no HBM (--fusion none keeps them)\n\n",
		        p->n_fused);
	if (p->n_delayed > 0)
		fprintf(f,
		        "the memory-aware scheduler ran %d computations just before their first "
		        "consumer (--scheduler recorded keeps the written order)\n\n",
		        p->n_delayed);
	if (p->n_in_place > 0)
		fprintf(f,
		        "%d elementwise results reuse the bytes of an operand that dies there (in "
		        "place)\n\n",
		        p->n_in_place);
	if (p->n_combined > 0)
		fprintf(
		    f,
		    "combined %d collectives into earlier independent ones (threshold %s): their "
		    "outputs are live from there on\n\n",
		    p->n_combined, status_human_bytes(threshold, p->combine_threshold_bytes));
	if (p->n_rewritten > 0)
		fprintf(
		    f,
		    "all-gather strategy %s: each of the %d all-gathers fills an output-sized "
		    "buffer with zeros and its input, then all-reduces it %s, with one chunk of "
		    "scratch; it sends 2(n-1)/n of the output instead of (n-1)/n\n\n",
		    ag_strategy_name(p->all_gather), p->n_rewritten,
		    p->no_alias ? "into a second output-sized buffer (--no-alias)" : "in place");
}

void memplan_print_oom(FILE *f, const struct memplan *p, const struct topology *topo)
{
	char used[32], cap[32], over[32], res[32], args[32], outs[32], temps[32];
	fprintf(
	    f,
	    "Ran out of memory in memory space hbm. Used %s of %s hbm. Exceeded hbm capacity by "
	    "%s.\n\n",
	    status_human_bytes(used, p->peak_bytes), status_human_bytes(cap, p->capacity),
	    status_human_bytes(over, p->peak_bytes - p->capacity));
	fprintf(f,
	        "Total hbm usage >= %s:\n"
	        "    reserved        %s\n"
	        "    arguments       %s\n"
	        "    outputs         %s\n"
	        "    temporaries     %s (the peak is at instruction %d, %s)\n\n",
	        status_human_bytes(used, p->peak_bytes + topo->reserved_bytes),
	        status_human_bytes(res, topo->reserved_bytes),
	        status_human_bytes(args, p->argument_bytes),
	        status_human_bytes(outs, p->output_bytes), status_human_bytes(temps, p->temp_bytes),
	        p->peak_at, p->peak_name);
	print_strategy(f, p);
	fprintf(f, "Largest program allocations in hbm:\n\n");
	print_largest(f, p, 10);
}

void memplan_print_text(FILE *f, const struct memplan *p, const struct topology *topo)
{
	if (!p->fits) {
		memplan_print_oom(f, p, topo);
		return;
	}
	char peak[32], cap[32], args[32], outs[32], temps[32], pad[32], sent[32], scr[32];
	fprintf(f,
	        "fits: peak %s of %s hbm per core (%s, %d cores)\n"
	        "  arguments %s, outputs %s, temporaries %s, collective scratch at the peak %s\n"
	        "  padding in the live set at the peak %s; each core sends %s in collectives\n\n",
	        status_human_bytes(peak, p->peak_bytes), status_human_bytes(cap, p->capacity),
	        topo->name, p->world_size, status_human_bytes(args, p->argument_bytes),
	        status_human_bytes(outs, p->output_bytes), status_human_bytes(temps, p->temp_bytes),
	        status_human_bytes(scr, p->peak_scratch), status_human_bytes(pad, p->padding_bytes),
	        status_human_bytes(sent, p->sent_bytes));
	print_strategy(f, p);
	fprintf(f, "Live at the peak (instruction %d, %s):\n\n", p->peak_at, p->peak_name);
	print_largest(f, p, 10);
}

static void json_string(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\')
			fprintf(f, "\\%c", ch);
		else if (ch < 0x20)
			fprintf(f, "\\u%04x", ch);
		else
			fputc(ch, f);
	}
	fputc('"', f);
}

void memplan_print_json(FILE *f, const struct memplan *p, const struct status *error)
{
	fprintf(f, "{\"cores\": [");
	for (int core = 0; p != NULL && core < p->world_size; core++) {
		fprintf(
		    f,
		    "%s\n {\"ordinal\": %d, \"argument_bytes\": %lld, \"output_bytes\": %lld, "
		    "\"alias_bytes\": %lld, \"temp_bytes\": %lld, \"peak_bytes\": %lld, "
		    "\"padding_bytes\": %lld, \"sent_bytes\": %lld, \"fits\": %s, \"peak_live\": [",
		    core ? "," : "", core, (long long)p->argument_bytes, (long long)p->output_bytes,
		    (long long)p->alias_bytes, (long long)p->temp_bytes, (long long)p->peak_bytes,
		    (long long)p->padding_bytes, (long long)p->sent_bytes,
		    p->fits ? "true" : "false");
		for (int k = 0; k < p->n_peak_live; k++) {
			const struct plan_buffer *b = &p->buffers[p->peak_live[k]];
			char shape[512];
			fprintf(f, "%s{\"name\": ", k ? ", " : "");
			json_string(f, b->def->name);
			fprintf(f, ", \"op\": ");
			json_string(f, b->op ? b->op : b->def->opcode);
			fprintf(f, ", \"shape\": ");
			json_string(f, hlo_shape_format(shape, sizeof(shape), &b->def->shape));
			fprintf(f, ", \"bytes\": %lld, \"padded_bytes\": %lld, \"kind\": \"%s\"}",
			        (long long)b->unpadded_bytes, (long long)b->bytes,
			        kind_name(b->kind));
		}
		fprintf(f, "]}");
	}
	fprintf(f, "],\n \"error\": ");
	if (error == NULL) {
		fprintf(f, "null}\n");
	} else {
		fprintf(f, "{\"code\": ");
		json_string(f, status_code_name(error->code));
		fprintf(f, ", \"message\": ");
		json_string(f, error->message);
		fprintf(f, "}}\n");
	}
}

static void xml_text(FILE *f, const char *s)
{
	for (; *s; s++) {
		if (*s == '<')
			fputs("&lt;", f);
		else if (*s == '>')
			fputs("&gt;", f);
		else if (*s == '&')
			fputs("&amp;", f);
		else if (*s == '"')
			fputs("&quot;", f);
		else
			fputc(*s, f);
	}
}

void memplan_write_svg(FILE *f, const struct memplan *p, const struct topology *topo,
                       const char *title)
{
	const double w = 960, h = 360, left = 80, right = 20, top = 40, bottom = 40;
	int shown = p->n_peak_live < 12 ? p->n_peak_live : 12;
	double total_h = h + 30 + 18.0 * shown;
	int64_t ymax = p->peak_bytes > p->capacity ? p->peak_bytes : p->capacity;
	if (ymax <= 0)
		ymax = 1;
	int n = p->n_instructions > 0 ? p->n_instructions : 1;
	double pw = w - left - right, ph = h - top - bottom;
#define X(i) (left + pw * ((double)(i) / (double)n))
#define Y(v) (top + ph * (1.0 - (double)(v) / (double)ymax))
	fprintf(f,
	        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
	        "font-family=\"monospace\" font-size=\"12\">\n"
	        "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n<text x=\"%.0f\" "
	        "y=\"20\" font-size=\"14\">",
	        w, total_h, left);
	xml_text(f, title);
	char peak[32], cap[32];
	fprintf(f, " — live HBM per core over the program (%s, every core the same)</text>\n",
	        topo->name);
	/* Axes and the capacity. */
	fprintf(f,
	        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n"
	        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
	        left, top, left, top + ph, left, top + ph, left + pw, top + ph);
	fprintf(f,
	        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"red\" "
	        "stroke-dasharray=\"6,4\"/>\n<text x=\"%.1f\" y=\"%.1f\" fill=\"red\">"
	        "capacity %s</text>\n",
	        left, Y(p->capacity), left + pw, Y(p->capacity), left + pw - 160,
	        Y(p->capacity) - 4, status_human_bytes(cap, p->capacity));
	for (int k = 0; k <= 4; k++) {
		char label[32];
		int64_t v = ymax / 4 * k;
		fprintf(f, "<text x=\"4\" y=\"%.1f\">%s</text>\n", Y(v) + 4,
		        status_human_bytes(label, v));
	}
	fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">instruction (program order), 0..%d</text>\n", left,
	        top + ph + 28, n - 1);
	/* Live bytes as steps. */
	fprintf(f, "<polyline fill=\"none\" stroke=\"steelblue\" stroke-width=\"1.5\" points=\"");
	for (int i = 0; i < p->n_instructions; i++)
		fprintf(f, "%.1f,%.1f %.1f,%.1f ", X(i), Y(p->live[i]), X(i + 1), Y(p->live[i]));
	fprintf(f, "\"/>\n");
	/* The peak and what is live there. */
	double px = (X(p->peak_at) + X(p->peak_at + 1)) / 2, py = Y(p->peak_bytes);
	fprintf(f,
	        "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"orange\"/>\n<text x=\"%.1f\" "
	        "y=\"%.1f\">peak %s at %d (",
	        px, py, px + 8 > left + pw - 240 ? px - 240 : px + 8, py - 6,
	        status_human_bytes(peak, p->peak_bytes), p->peak_at);
	xml_text(f, p->peak_name ? p->peak_name : "");
	fprintf(f, ")</text>\n<text x=\"%.1f\" y=\"%.1f\">live at the peak:</text>\n", left,
	        h + 14);
	for (int k = 0; k < shown; k++) {
		const struct plan_buffer *b = &p->buffers[p->peak_live[k]];
		char size[32], shape[256];
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%9s  %-8s ", left, h + 32 + 18.0 * k,
		        status_human_bytes(size, b->bytes), kind_name(b->kind));
		xml_text(f, b->def->name);
		fputs(" = ", f);
		xml_text(f, hlo_shape_format(shape, sizeof(shape), &b->def->shape));
		fputc(' ', f);
		xml_text(f, b->op ? b->op : b->def->opcode);
		fprintf(f, "</text>\n");
	}
	fprintf(f, "</svg>\n");
#undef X
#undef Y
}
