#include "verify.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collective.h"
#include "hlo_collective.h"

static bool is_collective(const struct hlo_instruction *in)
{
	return hlo_collective_op(in) != OP_INVALID || hlo_is(in, "collective-broadcast");
}

/* The groups as written, checked by the one implementation of XLA's rules. */
static int check_groups(const struct hlo_instruction *in, const char *text, int world, int *size,
                        struct status *st)
{
	char label[256];
	snprintf(label, sizeof(label), "line %d: %s", in->line, in->name);
	struct coll_groups resolved;
	bool any_size = hlo_is(in, "all-reduce") || hlo_is(in, "all-reduce-start");
	int rv = coll_groups_from_text(&resolved, text, world, any_size, label, st);
	if (rv == ST_OK) {
		*size = 0;
		for (int k = 0; k < resolved.num_groups; k++)
			*size = resolved.size[k] > *size ? resolved.size[k] : *size;
		coll_groups_free(&resolved);
	}
	return rv;
}

/* All-gather grows its dimension by the group size; reduce-scatter shrinks it by as much. */
static int check_shape(const struct hlo_instruction *in, int size, struct status *st)
{
	bool gather = hlo_is(in, "all-gather"), scatter = hlo_is(in, "reduce-scatter");
	if ((!gather && !scatter) || in->n_operands != 1 || in->shape.type == HT_TUPLE ||
	    in->n_dimensions != 1)
		return ST_OK;
	const struct hlo_shape *op = &in->operands[0]->shape, *out = &in->shape;
	int64_t d = in->dimensions[0];
	if (d < 0 || d >= out->rank || op->rank != out->rank)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "line %d: %s: dimensions={%lld} is out of range for rank %d",
		                  in->line, in->name, (long long)d, out->rank);
	int64_t small = gather ? op->dims[d] : out->dims[d];
	int64_t large = gather ? out->dims[d] : op->dims[d];
	if (large != small * size)
		return status_set(
		    st, ST_INVALID_ARGUMENT,
		    "line %d: %s: %s dimension %lld is %lld, but the %s's is %lld and "
		    "the replica groups have %d members (expected %lld)",
		    in->line, in->name, gather ? "output" : "operand", (long long)d,
		    (long long)large, gather ? "operand" : "output", (long long)small, size,
		    (long long)(small * size));
	return ST_OK;
}

int verify_collective(const struct hlo_instruction *in, int world, struct verify_cache *cache,
                      int *group_size, struct status *st)
{
	const char *text = in->replica_groups;
	if (text == NULL || strcmp(text, "{}") == 0 || strcmp(text, "{{}}") == 0) {
		*group_size = world;
	} else if (cache->text != NULL && strcmp(cache->text, text) == 0) {
		*group_size = cache->size;
	} else {
		if (check_groups(in, text, world, group_size, st) != ST_OK)
			return ST_INVALID_ARGUMENT;
		*cache = (struct verify_cache){text, *group_size};
	}
	return check_shape(in, *group_size, st);
}

int verify_module(const struct hlo_module *m, int world, struct status *st)
{
	struct verify_cache cache = {NULL, 0};
	for (int i = 0; i < m->n_computations; i++) {
		const struct hlo_computation *c = m->computations[i];
		for (int j = 0; j < c->n_instructions; j++) {
			const struct hlo_instruction *in = c->instructions[j];
			int size;
			if (is_collective(in) &&
			    verify_collective(in, world, &cache, &size, st) != ST_OK)
				return ST_INVALID_ARGUMENT;
			if (hlo_is(in, "get-tuple-element") &&
			    (in->n_operands != 1 || !in->has_index ||
			     in->operands[0]->shape.type != HT_TUPLE ||
			     in->tuple_index >= in->operands[0]->shape.n_tuple))
				return status_set(
				    st, ST_INVALID_ARGUMENT,
				    "line %d: %s: get-tuple-element index %lld is out of "
				    "range for %s",
				    in->line, in->name, (long long)in->tuple_index,
				    in->n_operands > 0 ? in->operands[0]->name : "nothing");
			if (hlo_is(in, "tuple") && in->shape.type == HT_TUPLE &&
			    in->shape.n_tuple != in->n_operands)
				return status_set(
				    st, ST_INVALID_ARGUMENT,
				    "line %d: %s: a tuple of %d operands has a shape of %d "
				    "elements",
				    in->line, in->name, in->n_operands, in->shape.n_tuple);
		}
	}
	return ST_OK;
}
