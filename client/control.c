/*
 * Control flow in the client library: while, call and conditional record their computations
 * by calling the user's functions once, with parameter tensors of a computation of their own
 * (torch's while_loop(cond_fn, body_fn, carried_inputs), XLA's While, Call, Conditional). A
 * computation is numbered when its recording ends, after the ones it calls, so a graph's
 * computations only call earlier ones. Tensors made inside are freed when it ends.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "client.h"

#define MAX_VALUES 4096 /* tensors of a loop state, a call's arguments or results */

void client_computations_free(pe_client *c)
{
	for (int k = 0; k < c->num_comps; k++)
		free(c->comp_shapes[k]);
	free(c->comps);
	free(c->comp_shapes);
	c->comps = NULL;
	c->comp_shapes = NULL;
	c->num_comps = c->cap_comps = 0;
}

/* What the recording of a computation replaced. */
struct saved {
	Podemu__Node **nodes;
	struct shape *shapes;
	int num_nodes, cap_nodes, recording;
};

static void begin(pe_client *c, struct saved *sv)
{
	*sv = (struct saved){c->nodes, c->shapes, c->num_nodes, c->cap_nodes, c->recording};
	c->nodes = NULL;
	c->shapes = NULL;
	c->num_nodes = c->cap_nodes = 0;
	c->recording = ++c->last_recording;
}

/*
 * Ends a recording: its tensors are freed, the caller's graph is back, and (ok) the
 * computation returning node root is added. Its index, or -1 (c's error set).
 */
static int end(pe_client *c, struct saved *sv, const char *name, int root, bool ok)
{
	int recorded = c->recording;
	for (pe_tensor *t = c->tensors, *next; t != NULL; t = next) {
		next = t->next;
		if (t->recording == recorded) {
			t->handle =
			    0; /* a value of the computation: nothing to release on the pod */
			pe_release(t);
		}
	}
	Podemu__Node **nodes = c->nodes;
	struct shape *shapes = c->shapes;
	int n = c->num_nodes;
	c->nodes = sv->nodes;
	c->shapes = sv->shapes;
	c->num_nodes = sv->num_nodes;
	c->cap_nodes = sv->cap_nodes;
	c->recording = sv->recording;
	Podemu__Computation *comp = NULL;
	if (ok && c->num_comps == c->cap_comps) {
		int cap = c->cap_comps ? c->cap_comps * 2 : 8;
		Podemu__Computation **comps = realloc(c->comps, (size_t)cap * sizeof(*comps));
		if (comps != NULL)
			c->comps = comps;
		struct shape **cs = realloc(c->comp_shapes, (size_t)cap * sizeof(*cs));
		if (cs != NULL)
			c->comp_shapes = cs;
		if (comps != NULL && cs != NULL)
			c->cap_comps = cap;
	}
	if (ok && c->num_comps < c->cap_comps &&
	    (comp = arena_alloc(c->graph_arena, sizeof(*comp))) != NULL) {
		podemu__computation__init(comp);
		comp->name = arena_strdup(c->graph_arena, name);
		comp->nodes = arena_calloc(c->graph_arena, (size_t)n + 1, sizeof(*comp->nodes));
		if (comp->name == NULL || comp->nodes == NULL)
			comp = NULL;
	}
	if (comp == NULL) {
		free(nodes);
		free(shapes);
		if (ok)
			client_fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
		return -1;
	}
	memcpy(comp->nodes, nodes, (size_t)n * sizeof(*nodes));
	comp->n_nodes = (size_t)n;
	comp->root = root;
	free(nodes);
	c->comps[c->num_comps] = comp;
	c->comp_shapes[c->num_comps] = shapes; /* owned until the graph is reset */
	return c->num_comps++;
}

/* A computation's parameter number k of shape sh (a tuple: its elements too). */
static Podemu__Shape *shape_proto(pe_client *c, const struct shape *sh)
{
	if (!sh->tuple)
		return client_shape_new(c, sh->dtype, sh->dims, sh->rank);
	Podemu__Shape *p = client_shape_new(c, 0, NULL, 0);
	if (p == NULL)
		return NULL;
	p->tuple = true;
	p->elements =
	    arena_calloc(c->graph_arena, (size_t)sh->n_elements + 1, sizeof(*p->elements));
	if (p->elements == NULL)
		return NULL;
	for (int k = 0; k < sh->n_elements; k++)
		if ((p->elements[p->n_elements++] = shape_proto(c, &sh->elements[k])) == NULL)
			return NULL;
	return p;
}

/*
 * Parameter number k of the computation being recorded, of shape sh, as the tensors the
 * user's function gets: a tuple's elements (get-tuple-element), or the array itself.
 */
static int parameter(pe_client *c, int k, const struct shape *sh, pe_tensor **out, int n)
{
	Podemu__Node *p = client_node_new(c, OP_PARAMETER);
	if (p == NULL || (p->shape = shape_proto(c, sh)) == NULL)
		return client_fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
	p->parameter_number = k;
	int index = client_node_add(c, p);
	return index < 0 ? c->code : client_unpack(c, index, out, n);
}

/* The node holding values[0..n): the value itself (n == 1), else a tuple of them; or -1. */
static int pack(pe_client *c, pe_tensor *const *values, int n)
{
	if (n == 1)
		return values[0] != NULL ? client_operand_of(values[0]) : -1;
	Podemu__Node *t = client_node_new(c, OP_TUPLE);
	if (t == NULL ||
	    (t->operands = arena_calloc(c->graph_arena, (size_t)n, sizeof(int32_t))) == NULL) {
		client_fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
		return -1;
	}
	for (int k = 0; k < n; k++) {
		int o = values[k] != NULL ? client_operand_of(values[k]) : -1;
		if (o < 0) {
			if (values[k] == NULL)
				client_fail(c, ST_INVALID_ARGUMENT, "value %d is missing", k);
			return -1;
		}
		t->operands[t->n_operands++] = o;
	}
	return client_node_add(c, t);
}

int client_unpack(pe_client *c, int index, pe_tensor **out, int n)
{
	if (!c->shapes[index].tuple)
		return (out[0] = client_tensor_new(c, &c->shapes[index], index, 0)) ? PE_OK
		                                                                    : c->code;
	if (c->shapes[index].n_elements != n)
		return client_fail(c, ST_INVALID_ARGUMENT, "%d results for a tuple of %d", n,
		                   c->shapes[index].n_elements);
	for (int k = 0; k < n; k++) {
		Podemu__Node *g = client_node_new(c, OP_GET_TUPLE_ELEMENT);
		if (g == NULL ||
		    (g->operands = arena_calloc(c->graph_arena, 1, sizeof(int32_t))) == NULL)
			return client_fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
		g->operands[0] = index;
		g->n_operands = 1;
		g->tuple_index = k;
		if ((out[k] = client_node_tensor(c, g)) == NULL) {
			while (k-- > 0)
				pe_release(out[k]);
			return c->code;
		}
	}
	return PE_OK;
}

/* The user's part of recording one computation. */
struct body {
	pe_cond_fn cond;      /* a condition, or */
	pe_computation_fn fn; /* a body, callee or branch */
	void *ctx;
	int n_results;
};

/*
 * Records a computation of one parameter (shape sh, the function seeing n tensors) or, with
 * n_params > 1, of n_params array parameters; its index or -1.
 */
static int record(pe_client *c, const char *name, const struct shape *sh, int n, int n_params,
                  const struct body *b)
{
	int count = n_params > 1 ? n_params : n;
	pe_tensor **params = calloc((size_t)count + 1, sizeof(*params));
	pe_tensor **results = calloc((size_t)b->n_results + 1, sizeof(*results));
	if (params == NULL || results == NULL) {
		free(params);
		free(results);
		client_fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
		return -1;
	}
	struct saved sv;
	begin(c, &sv);
	int rv = PE_OK, root = -1;
	for (int k = 0; rv == PE_OK && k < n_params; k++)
		rv = parameter(c, k, &sh[k], &params[n_params > 1 ? k : 0], n_params > 1 ? 1 : n);
	if (rv == PE_OK && b->cond != NULL) {
		pe_tensor *pred = b->cond(params, count, b->ctx);
		root = pred != NULL ? client_operand_of(pred) : -1;
		if (pred == NULL && c->code == PE_OK)
			client_fail(c, ST_INVALID_ARGUMENT, "%s: the condition returned no tensor",
			            name);
	} else if (rv == PE_OK) {
		rv = b->fn(params, count, b->ctx, results, b->n_results);
		if (rv != PE_OK && c->code == PE_OK)
			client_fail(c, rv, "%s: the function failed with %s", name,
			            pe_code_name(rv));
		root = rv == PE_OK ? pack(c, results, b->n_results) : -1;
	}
	free(params);
	free(results);
	return end(c, &sv, name, root, root >= 0);
}

/* The tensors of one client, made where recording is now; their count must be in range. */
static pe_client *client_of(pe_tensor *const *ts, int n, const char *what)
{
	if (ts == NULL || n < 1 || n > MAX_VALUES || ts[0] == NULL)
		return NULL;
	for (int k = 1; k < n; k++)
		if (ts[k] == NULL || ts[k]->c != ts[0]->c) {
			client_fail(ts[0]->c, ST_INVALID_ARGUMENT,
			            "%s: tensor %d is missing or foreign", what, k);
			return NULL;
		}
	return ts[0]->c;
}

/* A node calling computations called[0..n_called) over operands, its value unpacked to out. */
static int control_node(pe_client *c, enum opcode op, const int *operands, int n_operands,
                        const int *called, int n_called, int64_t trips, pe_tensor **out, int n_out)
{
	Podemu__Node *node = client_node_new(c, op);
	if (node == NULL)
		return c->code;
	node->operands = arena_calloc(c->graph_arena, (size_t)n_operands + 1, sizeof(int32_t));
	node->called = arena_calloc(c->graph_arena, (size_t)n_called + 1, sizeof(int32_t));
	if (node->operands == NULL || node->called == NULL)
		return client_fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
	memcpy(node->operands, operands, (size_t)n_operands * sizeof(int32_t));
	node->n_operands = (size_t)n_operands;
	memcpy(node->called, called, (size_t)n_called * sizeof(int32_t));
	node->n_called = (size_t)n_called;
	node->known_trip_count = trips;
	int index = client_node_add(c, node);
	return index < 0 ? c->code : client_unpack(c, index, out, n_out);
}

int pe_while_loop(pe_tensor *const *init, int n, pe_cond_fn cond, pe_computation_fn body, void *ctx,
                  int64_t known_trip_count, pe_tensor **out)
{
	pe_client *c = client_of(init, n, "while_loop");
	if (c == NULL)
		return PE_INVALID_ARGUMENT;
	if (cond == NULL || body == NULL || out == NULL || known_trip_count < 0)
		return client_fail(c, ST_INVALID_ARGUMENT,
		                   "while_loop: needs a condition, a body and room for the state");
	int state = pack(c, init, n);
	if (state < 0)
		return c->code;
	struct shape sh = c->shapes[state];
	struct body cb = {.cond = cond, .ctx = ctx};
	int called[2];
	if ((called[0] = record(c, "condition", &sh, n, 1, &cb)) < 0)
		return c->code;
	struct body bb = {.fn = body, .ctx = ctx, .n_results = n};
	if ((called[1] = record(c, "body", &sh, n, 1, &bb)) < 0)
		return c->code;
	return control_node(c, OP_WHILE, &state, 1, called, 2, known_trip_count, out, n);
}

int pe_call(pe_tensor *const *args, int n_args, pe_computation_fn fn, void *ctx, pe_tensor **out,
            int n_out)
{
	pe_client *c = client_of(args, n_args, "call");
	if (c == NULL)
		return PE_INVALID_ARGUMENT;
	if (fn == NULL || out == NULL || n_out < 1 || n_out > MAX_VALUES)
		return client_fail(c, ST_INVALID_ARGUMENT,
		                   "call: needs a function and its results");
	int *operands = calloc((size_t)n_args, sizeof(*operands));
	struct shape *shapes = calloc((size_t)n_args, sizeof(*shapes));
	int rv = operands && shapes ? PE_OK
	                            : client_fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int k = 0; rv == PE_OK && k < n_args; k++) {
		if ((operands[k] = client_operand_of(args[k])) < 0)
			rv = c->code;
		shapes[k] = args[k]->shape;
	}
	struct body b = {.fn = fn, .ctx = ctx, .n_results = n_out};
	int callee = rv != PE_OK  ? -1
	             : n_args > 1 ? record(c, "callee", shapes, n_args, n_args, &b)
	                          : record(c, "callee", shapes, 1, 1, &b);
	if (callee >= 0)
		rv = control_node(c, OP_CALL, operands, n_args, &callee, 1, 0, out, n_out);
	else if (rv == PE_OK)
		rv = c->code;
	free(operands);
	free(shapes);
	return rv;
}

int pe_conditional(pe_tensor *index, int n_branches, pe_tensor *const *const *branch_args,
                   const int *n_branch_args, const pe_computation_fn *branches, void *const *ctxs,
                   pe_tensor **out, int n_out)
{
	if (index == NULL)
		return PE_INVALID_ARGUMENT;
	pe_client *c = index->c;
	if (n_branches < 1 || n_branches > 64 || branch_args == NULL || n_branch_args == NULL ||
	    branches == NULL || out == NULL || n_out < 1 || n_out > MAX_VALUES)
		return client_fail(c, ST_INVALID_ARGUMENT,
		                   "conditional: 1 to 64 branches, each with its arguments and "
		                   "function");
	int operands[65], called[64];
	if ((operands[0] = client_operand_of(index)) < 0)
		return c->code;
	for (int k = 0; k < n_branches; k++) {
		int n = n_branch_args[k];
		if (client_of(branch_args[k], n, "conditional") != c || branches[k] == NULL)
			return client_fail(c, ST_INVALID_ARGUMENT,
			                   "conditional: branch %d has no function or arguments",
			                   k);
		if ((operands[k + 1] = pack(c, branch_args[k], n)) < 0)
			return c->code;
		char name[32];
		snprintf(name, sizeof(name), "branch_%d", k);
		struct body b = {
		    .fn = branches[k], .ctx = ctxs ? ctxs[k] : NULL, .n_results = n_out};
		if ((called[k] = record(c, name, &c->shapes[operands[k + 1]], n, 1, &b)) < 0)
			return c->code;
	}
	return control_node(c, OP_CONDITIONAL, operands, n_branches + 1, called, n_branches, 0, out,
	                    n_out);
}
