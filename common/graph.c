#include "graph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const opcode_names[OP_COUNT] = {
    [OP_INVALID] = "invalid",
    [OP_PARAMETER] = "parameter",
    [OP_CONSTANT] = "constant",
    [OP_IOTA] = "iota",
    [OP_REPLICA_ID] = "replica-id",
    [OP_ADD] = "add",
    [OP_SUBTRACT] = "subtract",
    [OP_MULTIPLY] = "multiply",
    [OP_MAXIMUM] = "maximum",
    [OP_MINIMUM] = "minimum",
    [OP_CONVERT] = "convert",
    [OP_RESHAPE] = "reshape",
    [OP_PAD] = "pad",
    [OP_SLICE] = "slice",
    [OP_CONCATENATE] = "concatenate",
    [OP_REDUCE] = "reduce",
    [OP_OPT_BARRIER] = "opt-barrier",
    [OP_GET_TUPLE_ELEMENT] = "get-tuple-element",
    [OP_ALL_GATHER] = "all-gather",
    [OP_ALL_REDUCE] = "all-reduce",
    [OP_REDUCE_SCATTER] = "reduce-scatter",
    [OP_ALL_TO_ALL] = "all-to-all",
    [OP_COLLECTIVE_PERMUTE] = "collective-permute",
    [OP_NEGATE] = "negate",
    [OP_TRANSPOSE] = "transpose",
    [OP_DOT] = "dot",
    [OP_DIVIDE] = "divide",
    [OP_AND] = "and",
    [OP_OR] = "or",
    [OP_NOT] = "not",
    [OP_ABS] = "abs",
    [OP_EXPONENTIAL] = "exponential",
    [OP_LOG] = "log",
    [OP_TANH] = "tanh",
    [OP_SQRT] = "sqrt",
    [OP_RSQRT] = "rsqrt",
    [OP_COMPARE] = "compare",
    [OP_SELECT] = "select",
    [OP_BROADCAST] = "broadcast",
    [OP_PARTITION_ID] = "partition-id",
    [OP_DYNAMIC_SLICE] = "dynamic-slice",
    [OP_DYNAMIC_UPDATE_SLICE] = "dynamic-update-slice",
    [OP_TUPLE] = "tuple",
    [OP_WHILE] = "while",
    [OP_CONDITIONAL] = "conditional",
    [OP_CALL] = "call",
    [OP_OPAQUE] = "opaque",
};

static const char *const reducer_names[] = {"add", "multiply", "max", "min", "and", "or"};

enum reducer reducer_parse(const char *name)
{
	if (name == NULL || name[0] == '\0')
		return RED_ADD;
	for (int i = 0; i < RED_INVALID; i++)
		if (strcmp(name, reducer_names[i]) == 0)
			return (enum reducer)i;
	return RED_INVALID;
}

const char *reducer_name(enum reducer r)
{
	return r < RED_INVALID ? reducer_names[r] : "invalid";
}

static const char *const comparison_names[] = {"EQ", "NE", "LT", "LE", "GT", "GE"};

enum comparison comparison_parse(const char *name)
{
	for (int i = 0; name != NULL && i < CMP_INVALID; i++)
		if (strcmp(name, comparison_names[i]) == 0)
			return (enum comparison)i;
	return CMP_INVALID;
}

const char *opcode_name(enum opcode op)
{
	if ((int)op <= OP_INVALID || op >= OP_COUNT)
		return "invalid";
	return opcode_names[op];
}

enum opcode opcode_parse(const char *name)
{
	for (int i = 1; i < OP_COUNT; i++)
		if (strcmp(name, opcode_names[i]) == 0)
			return (enum opcode)i;
	return OP_INVALID;
}

bool opcode_is_unary(enum opcode op)
{
	switch (op) {
	case OP_NEGATE:
	case OP_NOT:
	case OP_ABS:
	case OP_EXPONENTIAL:
	case OP_LOG:
	case OP_TANH:
	case OP_SQRT:
	case OP_RSQRT:
		return true;
	default:
		return false;
	}
}

bool opcode_is_elementwise(enum opcode op)
{
	if (opcode_is_unary(op))
		return true;
	switch (op) {
	case OP_ADD:
	case OP_SUBTRACT:
	case OP_MULTIPLY:
	case OP_DIVIDE:
	case OP_MAXIMUM:
	case OP_MINIMUM:
	case OP_AND:
	case OP_OR:
	case OP_COMPARE:
	case OP_SELECT:
	case OP_CONVERT:
		return true;
	default:
		return false;
	}
}

int opcode_is_collective(enum opcode op)
{
	return op == OP_ALL_GATHER || op == OP_ALL_REDUCE || op == OP_REDUCE_SCATTER ||
	       op == OP_ALL_TO_ALL || op == OP_COLLECTIVE_PERMUTE;
}

int shape_from_proto(struct shape *out, const Podemu__Shape *p, struct status *st)
{
	if (p == NULL)
		return status_set(st, ST_INVALID_ARGUMENT, "missing shape");
	if (p->tuple) {
		memset(out, 0, sizeof(*out));
		out->tuple = true;
		return ST_OK;
	}
	if (p->n_dims > SHAPE_MAX_RANK)
		return status_set(st, ST_INVALID_ARGUMENT, "rank %zu exceeds the maximum of %d",
		                  p->n_dims, SHAPE_MAX_RANK);
	return shape_make(out, (int)p->dtype, p->dims, (int)p->n_dims, st);
}

bool opcode_is_control_flow(enum opcode op)
{
	return op == OP_WHILE || op == OP_CONDITIONAL || op == OP_CALL;
}

size_t graph_total_nodes(const Podemu__Graph *g)
{
	size_t n = g->n_nodes;
	for (size_t c = 0; c < g->n_computations; c++)
		n += g->computations[c] ? g->computations[c]->n_nodes : 0;
	return n;
}

int *graph_first_ids(const Podemu__Graph *g, struct arena *a)
{
	int *first = arena_calloc(a, g->n_computations + 1, sizeof(int));
	if (first == NULL)
		return NULL;
	size_t at = g->n_nodes;
	for (size_t c = 0; c < g->n_computations; c++) {
		first[c] = (int)at;
		at += g->computations[c] ? g->computations[c]->n_nodes : 0;
	}
	first[g->n_computations] = (int)at;
	return first;
}

Podemu__Node *graph_node_at(const Podemu__Graph *g, const int *first, int id, int *comp)
{
	*comp = -1;
	if (id < 0)
		return NULL;
	if ((size_t)id < g->n_nodes)
		return g->nodes[id];
	for (size_t c = 0; c < g->n_computations; c++)
		if (id < first[c + 1]) {
			*comp = (int)c;
			return g->computations[c]->nodes[id - first[c]];
		}
	return NULL;
}

/* Infers the shapes of one node list (the entry's or a computation's) into shapes. */
static int check_nodes(Podemu__Node *const *nodes, size_t n, struct shape *shapes,
                       const struct graph_env *env, const char *where, struct status *st)
{
	for (size_t i = 0; i < n; i++) {
		if (nodes[i] == NULL)
			return status_set(st, ST_INVALID_ARGUMENT, "%snode %zu is empty", where, i);
		int rv = graph_infer_node(&shapes[i], nodes, (int)i, shapes, env, st);
		if (rv != ST_OK) {
			if (where[0] != '\0') {
				char msg[STATUS_MESSAGE_MAX];
				snprintf(msg, sizeof(msg), "%s", st->message);
				status_set(st, rv, "%s%s", where, msg);
			}
			return rv;
		}
		const Podemu__Shape *declared = nodes[i]->shape;
		enum opcode op = opcode_parse(nodes[i]->opcode);
		if (declared != NULL && op != OP_PARAMETER && op != OP_CONSTANT && op != OP_IOTA &&
		    op != OP_OPAQUE && op != OP_CONVERT && declared->dtype != 0 &&
		    !declared->tuple) {
			struct shape d;
			char sa[128], sb[128];
			int rv2 = shape_from_proto(&d, declared, st);
			if (rv2 != ST_OK)
				return status_set(st, rv2, "%s%s (node %zu): declared shape: %s",
				                  where, nodes[i]->opcode, i, st->message);
			if (!shape_equal(&d, &shapes[i]))
				return status_set(
				    st, ST_INVALID_ARGUMENT,
				    "%s%s (node %zu): declared shape %s does not match "
				    "the inferred shape %s",
				    where, nodes[i]->opcode, i, shape_format(sa, sizeof(sa), &d),
				    shape_format(sb, sizeof(sb), &shapes[i]));
		}
	}
	return ST_OK;
}

/* A called computation: its nodes, parameters numbered 0..n-1 once each, and its root. */
static int check_computation(const Podemu__Graph *g, size_t c, struct shape *shapes,
                             const struct shape **comp_shapes, struct graph_env *env,
                             struct status *st)
{
	const Podemu__Computation *comp = g->computations[c];
	char where[160];
	snprintf(where, sizeof(where), "computation %zu (%s): ", c,
	         comp && comp->name ? comp->name : "");
	if (comp == NULL || comp->n_nodes == 0)
		return status_set(st, ST_INVALID_ARGUMENT, "%sno nodes", where);
	env->in_computation = true;
	env->n_comps = (int)c;
	int rv = check_nodes(comp->nodes, comp->n_nodes, shapes, env, where, st);
	if (rv != ST_OK)
		return rv;
	comp_shapes[c] = shapes;
	size_t params = 0;
	for (size_t i = 0; i < comp->n_nodes; i++)
		params += opcode_parse(comp->nodes[i]->opcode) == OP_PARAMETER;
	bool *seen = arena_calloc(env->arena, params + 1, sizeof(bool));
	if (seen == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (size_t i = 0; i < comp->n_nodes; i++) {
		if (opcode_parse(comp->nodes[i]->opcode) != OP_PARAMETER)
			continue;
		int64_t k = comp->nodes[i]->parameter_number;
		if (k < 0 || (size_t)k >= params || seen[k])
			return status_set(
			    st, ST_INVALID_ARGUMENT,
			    "%sparameter (node %zu): number %lld is repeated or not in "
			    "[0, %zu)",
			    where, i, (long long)k, params);
		seen[k] = true;
	}
	if (comp->root < 0 || (size_t)comp->root >= comp->n_nodes)
		return status_set(st, ST_INVALID_ARGUMENT, "%sroot %d names no node", where,
		                  comp->root);
	return ST_OK;
}

int graph_check(const Podemu__Graph *g, int world_size, struct shape *shapes, struct arena *a,
                struct status *st)
{
	const struct shape **comp_shapes =
	    arena_calloc(a, g->n_computations + 1, sizeof(*comp_shapes));
	int *first = graph_first_ids(g, a);
	if (comp_shapes == NULL || first == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	struct graph_env env = {.world_size = world_size,
	                        .mesh = g->mesh,
	                        .n_mesh = g->n_mesh,
	                        .arena = a,
	                        .comps = g->computations,
	                        .comp_shapes = comp_shapes};
	for (size_t i = 0; i < g->n_mesh; i++)
		if (g->mesh[i] == NULL || g->mesh[i]->name == NULL)
			return status_set(st, ST_INVALID_ARGUMENT, "mesh axis %zu is empty", i);
	for (size_t c = 0; c < g->n_computations; c++) {
		int rv = check_computation(g, c, shapes + first[c], comp_shapes, &env, st);
		if (rv != ST_OK)
			return rv;
	}
	env.in_computation = false;
	env.n_comps = (int)g->n_computations;
	int rv = check_nodes(g->nodes, g->n_nodes, shapes, &env, "", st);
	if (rv != ST_OK)
		return rv;
	for (size_t k = 0; k < g->n_outputs; k++) {
		int32_t o = g->outputs[k];
		if (o < 0 || (size_t)o >= g->n_nodes)
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "output %zu names node %d of %zu", k, o, g->n_nodes);
		if (shapes[o].tuple)
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "output %zu (node %d) is a tuple", k, o);
		for (size_t j = 0; j < k; j++)
			if (g->outputs[j] == o)
				return status_set(st, ST_INVALID_ARGUMENT,
				                  "node %d is listed as an output twice", o);
	}
	return ST_OK;
}
