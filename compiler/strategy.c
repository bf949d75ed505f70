#include "strategy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collective.h"

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

/* The instructions being built for one computation. */
struct emitter {
	struct arena *a;
	struct hlo_computation *c;
	const struct hlo_instruction *from; /* the all-gather: its name and place */
	struct hlo_instruction **list;
	int n, cap;
};

/* Appends in to the new program; -1 when out of memory. */
static int push(struct emitter *e, struct hlo_instruction *in)
{
	if (e->n == e->cap) {
		int cap = e->cap ? e->cap * 2 : 64;
		struct hlo_instruction **more = arena_calloc(e->a, (size_t)cap, sizeof(*more));
		if (more == NULL)
			return -1;
		if (e->n > 0)
			memcpy(more, e->list, (size_t)e->n * sizeof(*more));
		e->list = more;
		e->cap = cap;
	}
	e->list[e->n++] = in;
	return 0;
}

static struct hlo_instruction *emit(struct emitter *e, const char *suffix, const char *opcode,
                                    enum hlo_type type, int rank, const int64_t *dims,
                                    int n_operands, struct hlo_instruction **operands)
{
	struct hlo_instruction *in = arena_calloc(e->a, 1, sizeof(*in));
	char name[256];
	snprintf(name, sizeof(name), "%s.%s", e->from->name, suffix);
	if (in == NULL || (in->name = arena_strdup(e->a, name)) == NULL)
		return NULL;
	in->opcode = opcode;
	in->parameter_number = -1;
	in->line = e->from->line;
	in->column = e->from->column;
	in->parent = e->c;
	in->shape.type = type;
	in->shape.rank = rank;
	in->shape.dims = arena_calloc(e->a, (size_t)rank + 1, sizeof(int64_t));
	in->operands = arena_calloc(e->a, (size_t)n_operands + 1, sizeof(*in->operands));
	if (in->shape.dims == NULL || in->operands == NULL)
		return NULL;
	if (rank > 0)
		memcpy(in->shape.dims, dims, (size_t)rank * sizeof(int64_t));
	if (n_operands > 0)
		memcpy(in->operands, operands, (size_t)n_operands * sizeof(*operands));
	in->n_operands = n_operands;
	return push(e, in) == 0 ? in : NULL;
}

static struct hlo_instruction *scalar(struct emitter *e, const char *suffix, enum hlo_type type,
                                      const char *literal)
{
	struct hlo_instruction *in = emit(e, suffix, "constant", type, 0, NULL, 0, NULL);
	if (in != NULL && (in->literal = arena_strdup(e->a, literal)) == NULL)
		return NULL;
	return in;
}

/*
 * The size of in's groups when they are consecutive blocks of replicas ([0, S), [S, 2S), ...),
 * world when it names none; 0 otherwise.
 */
static int block_size(const struct hlo_instruction *in, int world, struct status *st)
{
	const char *text = in->replica_groups;
	if (text == NULL || strcmp(text, "{}") == 0 || strcmp(text, "{{}}") == 0)
		return world;
	int64_t *ids;
	int *sizes, n;
	if (coll_groups_parse(text, &ids, &sizes, &n, st) != ST_OK)
		return -1;
	int size = n > 0 ? sizes[0] : 0;
	for (int k = 0, at = 0; k < n && size > 0; k++)
		for (int j = 0; j < sizes[k] && size > 0; j++, at++)
			if (sizes[k] != size || ids[at] != at)
				size = 0;
	free(ids);
	free(sizes);
	return size;
}

/*
 * zeros, this core's position, the update and the all-reduce for all-gather ag; the
 * all-reduce, or NULL (st set).
 */
static struct hlo_instruction *lower_one(struct emitter *e, struct hlo_instruction *ag,
                                         bool in_place, int world, struct status *st)
{
	struct hlo_instruction *x = ag->operands[0];
	int64_t d = ag->dimensions[0];
	int size = block_size(ag, world, st);
	if (size < 0)
		return NULL;
	if (size == 0) {
		status_set(
		    st, ST_UNIMPLEMENTED,
		    "line %d: %s: replica_groups=%s: the all-gather strategies run on groups of "
		    "consecutive replicas only",
		    ag->line, ag->name, ag->replica_groups);
		return NULL;
	}
	const struct hlo_shape *out = &ag->shape;
	e->from = ag;
	struct hlo_instruction *ops[2];
	struct hlo_instruction *zero = scalar(e, "zero", out->type, "0");
	ops[0] = zero;
	struct hlo_instruction *zeros =
	    zero ? emit(e, "zeros", "broadcast", out->type, out->rank, out->dims, 1, ops) : NULL;
	struct hlo_instruction *rid = emit(e, "replica", "replica-id", HT_U32, 0, NULL, 0, NULL);
	ops[0] = rid;
	struct hlo_instruction *pos =
	    rid ? emit(e, "position", "convert", HT_S32, 0, NULL, 1, ops) : NULL;
	if (pos != NULL && size < world) { /* the position in a block of `size` replicas */
		char text[32];
		snprintf(text, sizeof(text), "%d", size);
		struct hlo_instruction *s = scalar(e, "group_size", HT_S32, text);
		ops[0] = pos, ops[1] = s;
		struct hlo_instruction *q =
		    s ? emit(e, "group", "divide", HT_S32, 0, NULL, 2, ops) : NULL;
		ops[0] = q;
		struct hlo_instruction *first =
		    q ? emit(e, "group_start", "multiply", HT_S32, 0, NULL, 2, ops) : NULL;
		ops[0] = pos, ops[1] = first;
		pos = first ? emit(e, "position_in_group", "subtract", HT_S32, 0, NULL, 2, ops)
		            : NULL;
	}
	char width[32];
	snprintf(width, sizeof(width), "%lld", (long long)x->shape.dims[d]);
	struct hlo_instruction *w = scalar(e, "width", HT_S32, width);
	ops[0] = pos, ops[1] = w;
	struct hlo_instruction *start =
	    pos && w ? emit(e, "start", "multiply", HT_S32, 0, NULL, 2, ops) : NULL;
	struct hlo_instruction *origin = scalar(e, "origin", HT_S32, "0");
	struct hlo_instruction **dus_ops =
	    arena_calloc(e->a, (size_t)out->rank + 3, sizeof(*dus_ops));
	if (!zeros || !start || !origin || !dus_ops) {
		status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		return NULL;
	}
	dus_ops[0] = zeros;
	dus_ops[1] = x;
	for (int k = 0; k < out->rank; k++)
		dus_ops[2 + k] = k == d ? start : origin;
	struct hlo_instruction *dus = emit(e, "update", "dynamic-update-slice", out->type,
	                                   out->rank, out->dims, out->rank + 2, dus_ops);
	ops[0] = dus;
	struct hlo_instruction *ar =
	    dus ? emit(e, "sum", "all-reduce", out->type, out->rank, out->dims, 1, ops) : NULL;
	if (ar == NULL) {
		status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		return NULL;
	}
	ar->name = ag->name; /* the all-gather's result, as the module names it */
	ar->replica_groups = ag->replica_groups;
	ar->use_global_device_ids = ag->use_global_device_ids;
	ar->has_channel_id = ag->has_channel_id;
	ar->channel_id = ag->channel_id;
	ar->to_apply_name = "add";
	ar->is_root = ag->is_root;
	ar->may_alias_operand = in_place;
	return ar;
}

static bool lowered_kind(const struct hlo_instruction *in)
{
	return strcmp(in->opcode, "all-gather") == 0 && in->shape.type != HT_TUPLE &&
	       in->n_operands == 1 && in->n_dimensions == 1 && in->dimensions[0] >= 0 &&
	       in->dimensions[0] < in->shape.rank;
}

/* What in reads, with every lowered all-gather read through its all-reduce. */
static void reread(struct hlo_instruction *in)
{
	for (int j = 0; j < in->n_operands; j++)
		while (in->operands[j]->replaced_by != NULL)
			in->operands[j] = in->operands[j]->replaced_by;
	for (int j = 0; j < in->n_control_predecessors; j++)
		while (in->control_predecessors[j]->replaced_by != NULL)
			in->control_predecessors[j] = in->control_predecessors[j]->replaced_by;
}

int strategy_lower(struct hlo_module *m, enum ag_strategy s, bool in_place, int world, int *lowered,
                   struct arena *a, struct status *st)
{
	*lowered = 0;
	if (s == AG_NATIVE)
		return ST_OK;
	for (int ci = 0; ci < m->n_computations; ci++) {
		struct hlo_computation *c = m->computations[ci];
		struct emitter e = {.a = a, .c = c};
		int count = 0;
		for (int i = 0; i < c->n_instructions; i++) {
			struct hlo_instruction *in = c->instructions[i];
			if (!lowered_kind(in)) {
				if (push(&e, in) != 0)
					return status_set(st, ST_RESOURCE_EXHAUSTED,
					                  "out of host memory");
				continue;
			}
			reread(in);
			if ((in->replaced_by = lower_one(&e, in, in_place, world, st)) == NULL)
				return st->code;
			count++;
		}
		if (count == 0)
			continue;
		for (int k = 0; k < e.n; k++) {
			e.list[k]->index = k;
			reread(e.list[k]);
		}
		while (c->root->replaced_by != NULL)
			c->root = c->root->replaced_by;
		c->instructions = e.list;
		c->n_instructions = e.n;
		*lowered += count;
	}
	return ST_OK;
}
