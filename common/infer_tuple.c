/*
 * Shape inference of tuples and control flow (infer.c calls it): tuple and opt-barrier values,
 * declared tuple shapes, a called computation's parameters, and while, conditional and call
 * checked against the computations they run, as XLA's verifier does.
 */
#include "infer_tuple.h"

#include <stdio.h>
#include <string.h>

/* A tuple of the operands' shapes (tuple, opt-barrier); its elements from env's arena. */
int tuple_of(struct shape *out, const Podemu__Node *n, const struct shape *shapes,
             const struct graph_env *env, const char *label, struct status *st)
{
	struct shape *elements =
	    env->arena ? arena_calloc(env->arena, n->n_operands + 1, sizeof(*elements)) : NULL;
	if (elements == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "%s: out of host memory", label);
	for (size_t k = 0; k < n->n_operands; k++)
		elements[k] = shapes[n->operands[k]];
	memset(out, 0, sizeof(*out));
	out->tuple = true;
	out->n_elements = (int)n->n_operands;
	out->elements = elements;
	return ST_OK;
}

/* A declared shape: an array, or a tuple of arrays (its elements from env's arena). */
int declared_shape(struct shape *out, const Podemu__Shape *p, const struct graph_env *env,
                   const char *label, struct status *st)
{
	if (p == NULL || !p->tuple) {
		int rv = shape_from_proto(out, p, st);
		return rv == ST_OK ? ST_OK : status_set(st, rv, "%s: %s", label, st->message);
	}
	struct shape *elements =
	    env->arena ? arena_calloc(env->arena, p->n_elements + 1, sizeof(*elements)) : NULL;
	if (elements == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "%s: out of host memory", label);
	for (size_t k = 0; k < p->n_elements; k++) {
		int rv = p->elements[k] && p->elements[k]->tuple
		             ? status_set(st, ST_UNIMPLEMENTED, "a tuple inside a tuple")
		             : shape_from_proto(&elements[k], p->elements[k], st);
		if (rv != ST_OK)
			return status_set(st, rv, "%s: element %zu: %s", label, k, st->message);
	}
	memset(out, 0, sizeof(*out));
	out->tuple = true;
	out->n_elements = (int)p->n_elements;
	out->elements = elements;
	return ST_OK;
}

/* A computation's parameter: its declared shape, an array or a tuple of arrays. */
int infer_computation_parameter(struct shape *out, const Podemu__Node *n,
                                const struct graph_env *env, const char *label, struct status *st)
{
	if (n->handle != 0)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: a computation's parameter names no device buffer", label);
	return declared_shape(out, n->shape, env, label, st);
}

/* The shape of computation c's parameter number k (NULL when it has none) and its count. */
static const struct shape *callee_parameter(const struct graph_env *env, int c, int64_t k,
                                            int *count)
{
	const Podemu__Computation *comp = env->comps[c];
	const struct shape *found = NULL;
	*count = 0;
	for (size_t i = 0; i < comp->n_nodes; i++)
		if (opcode_parse(comp->nodes[i]->opcode) == OP_PARAMETER) {
			(*count)++;
			if (comp->nodes[i]->parameter_number == k)
				found = &env->comp_shapes[c][i];
		}
	return found;
}

/* Computation c must take exactly the given argument shapes. */
static int check_arguments(const struct graph_env *env, int c, const struct shape *const *args,
                           int n_args, const char *label, const char *role, struct status *st)
{
	int count;
	callee_parameter(env, c, 0, &count);
	if (count != n_args)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: the %s %s takes %d parameters, given %d", label, role,
		                  env->comps[c]->name, count, n_args);
	for (int k = 0; k < n_args; k++) {
		const struct shape *p = callee_parameter(env, c, k, &count);
		char sa[256], sb[256];
		if (p == NULL || !shape_equal(p, args[k]))
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "%s: parameter %d of the %s %s is %s, given %s", label, k,
			                  role, env->comps[c]->name,
			                  p ? shape_format(sa, sizeof(sa), p) : "missing",
			                  shape_format(sb, sizeof(sb), args[k]));
	}
	return ST_OK;
}

static const struct shape *root_shape(const struct graph_env *env, int c)
{
	return &env->comp_shapes[c][env->comps[c]->root];
}

/*
 * while (condition, body), conditional (branches) and call: each calls computations listed
 * before the caller's own, with the shapes XLA's verifier asks for.
 */
int infer_call(struct shape *out, enum opcode op, const Podemu__Node *n, const struct shape *shapes,
               const struct graph_env *env, const char *label, struct status *st)
{
	size_t want = op == OP_WHILE ? 2 : op == OP_CALL ? 1 : n->n_called;
	if (n->n_called != want || n->n_called == 0)
		return status_set(st, ST_INVALID_ARGUMENT, "%s: calls %zu computations, not %zu",
		                  label, n->n_called, want);
	for (size_t k = 0; k < n->n_called; k++)
		if (n->called[k] < 0 || n->called[k] >= env->n_comps)
			return status_set(
			    st, ST_INVALID_ARGUMENT,
			    "%s: calls computation %d, which is not one defined before "
			    "it",
			    label, n->called[k]);
	const struct shape *args[64];
	char sa[256], sb[256];
	int rv;
	if (op == OP_CALL) {
		if (n->n_operands > 64)
			return status_set(st, ST_UNIMPLEMENTED, "%s: more than 64 arguments",
			                  label);
		for (size_t k = 0; k < n->n_operands; k++)
			args[k] = &shapes[n->operands[k]];
		if ((rv = check_arguments(env, n->called[0], args, (int)n->n_operands, label,
		                          "callee", st)) != ST_OK)
			return rv;
		*out = *root_shape(env, n->called[0]);
		return ST_OK;
	}
	if (op == OP_WHILE) {
		const struct shape *state = &shapes[n->operands[0]];
		if ((rv = check_arguments(env, n->called[0], &state, 1, label, "condition", st)) !=
		        ST_OK ||
		    (rv = check_arguments(env, n->called[1], &state, 1, label, "body", st)) !=
		        ST_OK)
			return rv;
		const struct shape *pred = root_shape(env, n->called[0]);
		if (pred->tuple || pred->rank != 0 || pred->dtype != DT_PRED)
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "%s: Condition computation must return bool; got: %s",
			                  label, shape_format(sa, sizeof(sa), pred));
		if (!shape_equal(root_shape(env, n->called[1]), state))
			return status_set(
			    st, ST_INVALID_ARGUMENT,
			    "%s: The body should have same shape as the init; got body "
			    "%s, init %s",
			    label, shape_format(sa, sizeof(sa), root_shape(env, n->called[1])),
			    shape_format(sb, sizeof(sb), state));
		*out = *state;
		return ST_OK;
	}
	/* conditional: a pred picks [true, false]; an s32 index any branch (out of range: last) */
	const struct shape *index = &shapes[n->operands[0]];
	bool pred = index->dtype == DT_PRED;
	if (index->tuple || index->rank != 0 || (!pred && index->dtype != DT_S32) ||
	    (pred && n->n_called != 2))
		return status_set(
		    st, ST_INVALID_ARGUMENT,
		    "%s: the branch index must be a pred[] with 2 branches or an s32[], "
		    "got %s",
		    label, shape_format(sa, sizeof(sa), index));
	if (n->n_operands != 1 + n->n_called)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: %zu branches need %zu operands after the index, got %zu",
		                  label, n->n_called, n->n_called, n->n_operands - 1);
	for (size_t k = 0; k < n->n_called; k++) {
		const struct shape *arg = &shapes[n->operands[k + 1]];
		if ((rv = check_arguments(env, n->called[k], &arg, 1, label, "branch", st)) !=
		    ST_OK)
			return rv;
		if (!shape_equal(root_shape(env, n->called[k]), root_shape(env, n->called[0])))
			return status_set(
			    st, ST_INVALID_ARGUMENT,
			    "%s: the branches return %s and %s; all must return the same shape",
			    label, shape_format(sa, sizeof(sa), root_shape(env, n->called[0])),
			    shape_format(sb, sizeof(sb), root_shape(env, n->called[k])));
	}
	*out = *root_shape(env, n->called[0]);
	return ST_OK;
}
