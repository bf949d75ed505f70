/* Recording ops into the pending graph: each infers its shape as it is recorded. */
#include "podemu/podemu.h"

#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "client.h"

/* A pe_reduce_op is the compiler's reducer of the same name: one list of reductions. */
_Static_assert((int)PE_REDUCE_SUM == (int)RED_ADD && (int)PE_REDUCE_PRODUCT == (int)RED_MULTIPLY &&
                   (int)PE_REDUCE_MAX == (int)RED_MAX && (int)PE_REDUCE_MIN == (int)RED_MIN &&
                   (int)PE_REDUCE_AND == (int)RED_AND && (int)PE_REDUCE_OR == (int)RED_OR,
               "pe_reduce_op and enum reducer list the reductions in the same order");

pe_tensor *pe_full(pe_client *c, pe_dtype dtype, const int64_t *dims, int rank, double value)
{
	Podemu__Node *n = client_node_new(c, OP_CONSTANT);
	if (n == NULL || rank < 0 || rank > PE_MAX_RANK) {
		if (n != NULL)
			client_fail(c, ST_INVALID_ARGUMENT, "rank %d is out of range [0, %d]", rank,
			            PE_MAX_RANK);
		return NULL;
	}
	n->value = value;
	n->shape = client_shape_new(c, dtype, dims, rank);
	return n->shape ? client_node_tensor(c, n) : NULL;
}

pe_tensor *pe_iota(pe_client *c, pe_dtype dtype, const int64_t *dims, int rank, int dimension)
{
	Podemu__Node *n = client_node_new(c, OP_IOTA);
	if (n == NULL || rank < 0 || rank > PE_MAX_RANK) {
		if (n != NULL)
			client_fail(c, ST_INVALID_ARGUMENT, "rank %d is out of range [0, %d]", rank,
			            PE_MAX_RANK);
		return NULL;
	}
	int64_t d = dimension;
	n->dimensions = client_dims_copy(c, &d, 1);
	n->n_dimensions = 1;
	n->shape = client_shape_new(c, dtype, dims, rank);
	return n->shape ? client_node_tensor(c, n) : NULL;
}

pe_tensor *pe_replica_id(pe_client *c)
{
	Podemu__Node *n = client_node_new(c, OP_REPLICA_ID);
	return n ? client_node_tensor(c, n) : NULL;
}

/* Node n (already made) with operands a and b, of one client. */
static pe_tensor *binary_node(pe_tensor *a, pe_tensor *b, Podemu__Node *n)
{
	pe_client *c = a->c;
	if (b->c != c) {
		client_fail(c, ST_INVALID_ARGUMENT, "%s: operands belong to different clients",
		            n->opcode);
		return NULL;
	}
	int x = client_operand_of(a), y = x >= 0 ? client_operand_of(b) : -1;
	if (y < 0)
		return NULL;
	n->operands = arena_calloc(c->graph_arena, 2, sizeof(int32_t));
	if (n->operands == NULL)
		return NULL;
	n->operands[0] = x;
	n->operands[1] = y;
	n->n_operands = 2;
	return client_node_tensor(c, n);
}

static pe_tensor *binary(pe_tensor *a, pe_tensor *b, enum opcode op)
{
	if (a == NULL || b == NULL)
		return NULL;
	Podemu__Node *n = client_node_new(a->c, op);
	return n != NULL ? binary_node(a, b, n) : NULL;
}

pe_tensor *pe_add(pe_tensor *a, pe_tensor *b)
{
	return binary(a, b, OP_ADD);
}

pe_tensor *pe_subtract(pe_tensor *a, pe_tensor *b)
{
	return binary(a, b, OP_SUBTRACT);
}

pe_tensor *pe_multiply(pe_tensor *a, pe_tensor *b)
{
	return binary(a, b, OP_MULTIPLY);
}

pe_tensor *pe_maximum(pe_tensor *a, pe_tensor *b)
{
	return binary(a, b, OP_MAXIMUM);
}

pe_tensor *pe_minimum(pe_tensor *a, pe_tensor *b)
{
	return binary(a, b, OP_MINIMUM);
}

pe_tensor *pe_convert(pe_tensor *a, pe_dtype dtype)
{
	if (a == NULL)
		return NULL;
	Podemu__Node *n = client_node_new(a->c, OP_CONVERT);
	if (n == NULL || (n->shape = client_shape_new(a->c, dtype, NULL, 0)) == NULL)
		return NULL;
	return client_unary(a, n);
}

pe_tensor *pe_divide(pe_tensor *a, pe_tensor *b)
{
	return binary(a, b, OP_DIVIDE);
}

pe_tensor *pe_and(pe_tensor *a, pe_tensor *b)
{
	return binary(a, b, OP_AND);
}

pe_tensor *pe_or(pe_tensor *a, pe_tensor *b)
{
	return binary(a, b, OP_OR);
}

pe_tensor *pe_compare(pe_tensor *a, pe_tensor *b, const char *direction)
{
	if (a == NULL || b == NULL)
		return NULL;
	pe_client *c = a->c;
	if (b->c != c) {
		client_fail(c, ST_INVALID_ARGUMENT,
		            "compare: operands belong to different clients");
		return NULL;
	}
	Podemu__Node *n = client_node_new(c, OP_COMPARE);
	if (n == NULL)
		return NULL;
	n->operands = arena_calloc(c->graph_arena, 2, sizeof(int32_t));
	n->comparison_direction = arena_strdup(c->graph_arena, direction ? direction : "");
	if (n->operands == NULL || n->comparison_direction == NULL)
		return NULL;
	if ((n->operands[0] = client_operand_of(a)) < 0 ||
	    (n->operands[1] = client_operand_of(b)) < 0)
		return NULL;
	n->n_operands = 2;
	return client_node_tensor(c, n);
}

pe_tensor *pe_select(pe_tensor *pred, pe_tensor *on_true, pe_tensor *on_false)
{
	if (pred == NULL || on_true == NULL || on_false == NULL)
		return NULL;
	pe_client *c = pred->c;
	if (on_true->c != c || on_false->c != c) {
		client_fail(c, ST_INVALID_ARGUMENT, "select: operands belong to different clients");
		return NULL;
	}
	Podemu__Node *n = client_node_new(c, OP_SELECT);
	if (n == NULL)
		return NULL;
	n->operands = arena_calloc(c->graph_arena, 3, sizeof(int32_t));
	if (n->operands == NULL)
		return NULL;
	pe_tensor *ops[3] = {pred, on_true, on_false};
	for (int k = 0; k < 3; k++)
		if ((n->operands[k] = client_operand_of(ops[k])) < 0)
			return NULL;
	n->n_operands = 3;
	return client_node_tensor(c, n);
}

/* A one-operand op without attributes. */
static pe_tensor *elementwise1(pe_tensor *a, enum opcode op)
{
	return a == NULL ? NULL : client_unary(a, client_node_new(a->c, op));
}

pe_tensor *pe_negate(pe_tensor *a)
{
	return elementwise1(a, OP_NEGATE);
}

pe_tensor *pe_not(pe_tensor *a)
{
	return elementwise1(a, OP_NOT);
}

pe_tensor *pe_abs(pe_tensor *a)
{
	return elementwise1(a, OP_ABS);
}

pe_tensor *pe_exponential(pe_tensor *a)
{
	return elementwise1(a, OP_EXPONENTIAL);
}

pe_tensor *pe_log(pe_tensor *a)
{
	return elementwise1(a, OP_LOG);
}

pe_tensor *pe_tanh(pe_tensor *a)
{
	return elementwise1(a, OP_TANH);
}

pe_tensor *pe_sqrt(pe_tensor *a)
{
	return elementwise1(a, OP_SQRT);
}

pe_tensor *pe_rsqrt(pe_tensor *a)
{
	return elementwise1(a, OP_RSQRT);
}

pe_tensor *pe_broadcast(pe_tensor *a, const int64_t *dims, int rank,
                        const int64_t *broadcast_dimensions)
{
	if (a == NULL)
		return NULL;
	if (rank < 0 || rank > PE_MAX_RANK) {
		client_fail(a->c, ST_INVALID_ARGUMENT, "broadcast: rank %d is out of range", rank);
		return NULL;
	}
	int in_rank = a->shape.rank;
	Podemu__Node *n = client_node_new(a->c, OP_BROADCAST);
	if (n == NULL || (n->shape = client_shape_new(a->c, a->shape.dtype, dims, rank)) == NULL)
		return NULL;
	n->dimensions = client_dims_copy(a->c, broadcast_dimensions, (size_t)in_rank);
	n->n_dimensions = (size_t)in_rank;
	return client_unary(a, n);
}

pe_tensor *pe_partition_id(pe_client *c)
{
	Podemu__Node *n = client_node_new(c, OP_PARTITION_ID);
	return n ? client_node_tensor(c, n) : NULL;
}

/* dynamic-slice and dynamic-update-slice: operands, then one start index per dimension. */
static pe_tensor *dynamic(enum opcode op, pe_tensor *a, pe_tensor *update, pe_tensor *const *starts,
                          const int64_t *sizes)
{
	if (a == NULL || (op == OP_DYNAMIC_UPDATE_SLICE && update == NULL) || starts == NULL)
		return NULL;
	pe_client *c = a->c;
	int rank = a->shape.rank, first = op == OP_DYNAMIC_SLICE ? 1 : 2;
	for (int d = 0; d < rank; d++)
		if (starts[d] == NULL)
			return NULL;
	Podemu__Node *n = client_node_new(c, op);
	if (n == NULL)
		return NULL;
	n->operands = arena_calloc(c->graph_arena, (size_t)(first + rank), sizeof(int32_t));
	if (n->operands == NULL)
		return NULL;
	for (int k = 0; k < first + rank; k++) {
		pe_tensor *t = k == 0 ? a : k < first ? update : starts[k - first];
		if (t->c != c) {
			client_fail(c, ST_INVALID_ARGUMENT,
			            "%s: operands belong to different clients", opcode_name(op));
			return NULL;
		}
		if ((n->operands[k] = client_operand_of(t)) < 0)
			return NULL;
	}
	n->n_operands = (size_t)(first + rank);
	if (op == OP_DYNAMIC_SLICE) {
		n->dimensions = client_dims_copy(c, sizes, (size_t)rank);
		n->n_dimensions = (size_t)rank;
	}
	return client_node_tensor(c, n);
}

pe_tensor *pe_dynamic_slice(pe_tensor *a, pe_tensor *const *starts, const int64_t *sizes)
{
	return dynamic(OP_DYNAMIC_SLICE, a, NULL, starts, sizes);
}

pe_tensor *pe_dynamic_update_slice(pe_tensor *a, pe_tensor *update, pe_tensor *const *starts)
{
	return dynamic(OP_DYNAMIC_UPDATE_SLICE, a, update, starts, NULL);
}

pe_tensor *pe_transpose(pe_tensor *a, const int64_t *permutation, int rank)
{
	if (a == NULL)
		return NULL;
	if (rank < 0 || rank > PE_MAX_RANK) {
		client_fail(a->c, ST_INVALID_ARGUMENT, "transpose: rank %d is out of range", rank);
		return NULL;
	}
	Podemu__Node *n = client_node_new(a->c, OP_TRANSPOSE);
	if (n == NULL)
		return NULL;
	n->dimensions = client_dims_copy(a->c, permutation, (size_t)rank);
	n->n_dimensions = (size_t)rank;
	return client_unary(a, n);
}

/* An opaque node named name over operands (its shape still to set), or NULL. */
static Podemu__Node *opaque_node(pe_client *c, const char *name, pe_tensor *const *operands,
                                 int n_operands)
{
	Podemu__Node *n = client_node_new(c, OP_OPAQUE);
	if (n == NULL)
		return NULL;
	n->name = arena_strdup(c->graph_arena, name ? name : "opaque");
	n->operands = arena_calloc(c->graph_arena, (size_t)n_operands + 1, sizeof(int32_t));
	if (n->name == NULL || n->operands == NULL)
		return NULL;
	for (int k = 0; k < n_operands; k++) {
		if (operands[k] == NULL || operands[k]->c != c) {
			client_fail(c, ST_INVALID_ARGUMENT,
			            "opaque %s: operand %d is not a tensor of this client", n->name,
			            k);
			return NULL;
		}
		if ((n->operands[k] = client_operand_of(operands[k])) < 0)
			return NULL;
	}
	n->n_operands = (size_t)n_operands;
	return n;
}

pe_tensor *pe_opaque(pe_client *c, const char *name, pe_dtype dtype, const int64_t *dims, int rank,
                     pe_tensor *const *operands, int n_operands)
{
	if (rank < 0 || rank > PE_MAX_RANK || n_operands < 0) {
		client_fail(c, ST_INVALID_ARGUMENT,
		            "opaque %s: rank %d or %d operands out of range", name ? name : "",
		            rank, n_operands);
		return NULL;
	}
	Podemu__Node *n = opaque_node(c, name, operands, n_operands);
	if (n == NULL || (n->shape = client_shape_new(c, dtype, dims, rank)) == NULL)
		return NULL;
	return client_node_tensor(c, n);
}

int pe_opaque_tuple(pe_client *c, const char *name, int n_results, const pe_dtype *dtypes,
                    const int64_t *const *dims, const int *ranks, pe_tensor *const *operands,
                    int n_operands, pe_tensor **out)
{
	if (n_results < 1 || n_results > 4096 || n_operands < 0 || dtypes == NULL || dims == NULL ||
	    ranks == NULL || out == NULL)
		return client_fail(c, ST_INVALID_ARGUMENT, "opaque %s: %d results, %d operands",
		                   name ? name : "", n_results, n_operands);
	Podemu__Node *n = opaque_node(c, name, operands, n_operands);
	Podemu__Shape *sh = n != NULL ? client_shape_new(c, 0, NULL, 0) : NULL;
	if (sh == NULL)
		return c->code ? c->code : PE_RESOURCE_EXHAUSTED;
	sh->tuple = true;
	sh->elements = arena_calloc(c->graph_arena, (size_t)n_results, sizeof(*sh->elements));
	if (sh->elements == NULL)
		return client_fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int k = 0; k < n_results; k++) {
		if (ranks[k] < 0 || ranks[k] > PE_MAX_RANK)
			return client_fail(c, ST_INVALID_ARGUMENT,
			                   "opaque %s: result %d has rank %d", n->name, k,
			                   ranks[k]);
		if ((sh->elements[k] = client_shape_new(c, dtypes[k], dims[k], ranks[k])) == NULL)
			return client_fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
	}
	sh->n_elements = (size_t)n_results;
	n->shape = sh;
	int index = client_node_add(c, n);
	return index < 0 ? c->code : client_unpack(c, index, out, n_results);
}

pe_tensor *pe_dot(pe_tensor *a, pe_tensor *b)
{
	return binary(a, b, OP_DOT);
}

pe_tensor *pe_reshape(pe_tensor *a, const int64_t *dims, int rank)
{
	if (a == NULL)
		return NULL;
	if (rank < 0 || rank > PE_MAX_RANK) {
		client_fail(a->c, ST_INVALID_ARGUMENT, "reshape: rank %d is out of range", rank);
		return NULL;
	}
	Podemu__Node *n = client_node_new(a->c, OP_RESHAPE);
	if (n == NULL)
		return NULL;
	n->dimensions = client_dims_copy(a->c, dims, (size_t)rank);
	n->n_dimensions = (size_t)rank;
	return client_unary(a, n);
}

pe_tensor *pe_pad(pe_tensor *a, const int64_t *low, const int64_t *high, const int64_t *interior,
                  double value)
{
	if (a == NULL)
		return NULL;
	Podemu__Node *n = client_node_new(a->c, OP_PAD);
	if (n == NULL)
		return NULL;
	size_t r = (size_t)a->shape.rank;
	int64_t zeros[PE_MAX_RANK] = {0};
	n->pad_low = client_dims_copy(a->c, low ? low : zeros, r);
	n->pad_high = client_dims_copy(a->c, high ? high : zeros, r);
	n->pad_interior = client_dims_copy(a->c, interior ? interior : zeros, r);
	n->n_pad_low = n->n_pad_high = n->n_pad_interior = r;
	n->value = value;
	return client_unary(a, n);
}

pe_tensor *pe_slice(pe_tensor *a, const int64_t *starts, const int64_t *limits,
                    const int64_t *strides)
{
	if (a == NULL)
		return NULL;
	Podemu__Node *n = client_node_new(a->c, OP_SLICE);
	if (n == NULL)
		return NULL;
	size_t r = (size_t)a->shape.rank;
	n->starts = client_dims_copy(a->c, starts, r);
	n->limits = client_dims_copy(a->c, limits, r);
	n->n_starts = n->n_limits = r;
	if (strides != NULL) {
		n->strides = client_dims_copy(a->c, strides, r);
		n->n_strides = r;
	}
	return client_unary(a, n);
}

pe_tensor *pe_concatenate(pe_tensor *const *tensors, int n_tensors, int dimension)
{
	if (tensors == NULL || n_tensors < 1 || tensors[0] == NULL)
		return NULL;
	pe_client *c = tensors[0]->c;
	for (int k = 1; k < n_tensors; k++)
		if (tensors[k] == NULL)
			return NULL;
	Podemu__Node *n = client_node_new(c, OP_CONCATENATE);
	if (n == NULL)
		return NULL;
	n->operands = arena_calloc(c->graph_arena, (size_t)n_tensors, sizeof(int32_t));
	if (n->operands == NULL)
		return NULL;
	for (int k = 0; k < n_tensors; k++) {
		if (tensors[k]->c != c) {
			client_fail(c, ST_INVALID_ARGUMENT,
			            "concatenate: operands belong to different clients");
			return NULL;
		}
		if ((n->operands[k] = client_operand_of(tensors[k])) < 0)
			return NULL;
	}
	n->n_operands = (size_t)n_tensors;
	int64_t d = dimension;
	n->dimensions = client_dims_copy(c, &d, 1);
	n->n_dimensions = 1;
	return client_node_tensor(c, n);
}

pe_tensor *pe_reduce_init(pe_tensor *a, pe_tensor *init, pe_reduce_op op, const int64_t *dimensions,
                          int n_dims)
{
	if (a == NULL)
		return NULL;
	if (n_dims < 0 || n_dims > PE_MAX_RANK || op < 0 || op > PE_REDUCE_OR) {
		client_fail(a->c, ST_INVALID_ARGUMENT, "reduce: %d dimensions, reduction %d",
		            n_dims, (int)op);
		return NULL;
	}
	Podemu__Node *n = client_node_new(a->c, OP_REDUCE);
	if (n == NULL)
		return NULL;
	n->dimensions = client_dims_copy(a->c, dimensions, (size_t)n_dims);
	n->n_dimensions = (size_t)n_dims;
	n->reducer = (char *)reducer_name((enum reducer)op);
	return init != NULL ? binary_node(a, init, n) : client_unary(a, n);
}

pe_tensor *pe_reduce(pe_tensor *a, pe_reduce_op op, const int64_t *dimensions, int n_dims)
{
	return pe_reduce_init(a, NULL, op, dimensions, n_dims);
}

pe_tensor *pe_reduce_sum(pe_tensor *a, const int64_t *dimensions, int n_dims)
{
	return pe_reduce(a, PE_REDUCE_SUM, dimensions, n_dims);
}

int pe_set_layout(pe_tensor *t, const char *layout)
{
	if (t == NULL)
		return PE_INVALID_ARGUMENT;
	if (t->node < 0)
		return client_fail(t->c, ST_INVALID_ARGUMENT,
		                   "set_layout: the tensor is a device buffer already; its layout "
		                   "was fixed when it was made");
	char *copy = arena_strdup(t->c->graph_arena, layout != NULL ? layout : "");
	if (copy == NULL)
		return client_fail(t->c, ST_RESOURCE_EXHAUSTED, "out of host memory");
	t->c->nodes[t->node]->layout = copy;
	return PE_OK;
}

int pe_optimization_barrier(pe_tensor **tensors, int n_tensors)
{
	if (tensors == NULL || n_tensors < 1 || tensors[0] == NULL)
		return PE_INVALID_ARGUMENT;
	pe_client *c = tensors[0]->c;
	/* Device buffers are already computed: only pending values are ordered by a barrier. */
	int pending = 0;
	for (int k = 0; k < n_tensors; k++) {
		if (tensors[k] == NULL || tensors[k]->c != c)
			return client_fail(c, ST_INVALID_ARGUMENT,
			                   "optimization_barrier: tensor %d is missing or foreign",
			                   k);
		pending += tensors[k]->node >= 0;
	}
	if (pending == 0)
		return PE_OK;
	Podemu__Node *barrier = client_node_new(c, OP_OPT_BARRIER);
	if (barrier == NULL)
		return c->code;
	barrier->operands = arena_calloc(c->graph_arena, (size_t)pending, sizeof(int32_t));
	if (barrier->operands == NULL)
		return client_fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int k = 0; k < n_tensors; k++)
		if (tensors[k]->node >= 0)
			barrier->operands[barrier->n_operands++] = tensors[k]->node;
	int b = client_node_add(c, barrier);
	if (b < 0)
		return c->code;
	int index = 0;
	for (int k = 0; k < n_tensors; k++) {
		if (tensors[k]->node < 0)
			continue;
		Podemu__Node *gte = client_node_new(c, OP_GET_TUPLE_ELEMENT);
		if (gte == NULL)
			return c->code;
		gte->operands = arena_calloc(c->graph_arena, 1, sizeof(int32_t));
		if (gte->operands == NULL)
			return client_fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
		gte->operands[0] = b;
		gte->n_operands = 1;
		gte->tuple_index = index++;
		int g = client_node_add(c, gte);
		if (g < 0)
			return c->code;
		tensors[k]->node = g;
	}
	return PE_OK;
}
