/*
 * Shape inference of step-graph nodes (graph_infer_node, declared in graph.h): what each op
 * makes of its operands, refused in XLA's words where XLA has them.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collective.h"
#include "graph.h"
#include "infer_tuple.h"

/* Prefix for every error about node i: "node 7 (add "x")". */
static const char *node_label(char *buf, size_t len, const Podemu__Node *n, int i)
{
	if (n->name != NULL && n->name[0] != '\0')
		snprintf(buf, len, "%s %%%s (node %d)", n->opcode, n->name, i);
	else
		snprintf(buf, len, "%s (node %d)", n->opcode, i);
	return buf;
}

static int check_value_fits(const Podemu__Node *n, int dtype, const char *label, struct status *st)
{
	double v = n->value;
	double lo, hi;
	switch (dtype) {
	case DT_PRED:
		lo = 0, hi = 1;
		break;
	case DT_U8:
		lo = 0, hi = 255;
		break;
	case DT_S32:
		lo = -2147483648.0, hi = 2147483647.0;
		break;
	case DT_U32:
		lo = 0, hi = 4294967295.0;
		break;
	default:
		return ST_OK;
	}
	if (!(v >= lo && v <= hi) || v != floor(v))
		return status_set(st, ST_INVALID_ARGUMENT, "%s: value %g is not a valid %s", label,
		                  v, dtype_name(dtype));
	return ST_OK;
}

/* XLA's spelling of an element type in messages ("F32"). */
static const char *type_upper(int dtype)
{
	switch (dtype) {
	case DT_F32:
		return "F32";
	case DT_BF16:
		return "BF16";
	case DT_S32:
		return "S32";
	case DT_U32:
		return "U32";
	case DT_U8:
		return "U8";
	case DT_PRED:
		return "PRED";
	}
	return "INVALID";
}

/* XLA's refusal of a pred operand for an arithmetic op. */
static int pred_not_arithmetic(enum opcode op, const char *label, struct status *st)
{
	return status_set(st, ST_INVALID_ARGUMENT,
	                  "%s: Expected element type in shape to be arithmetic type for operation "
	                  "%s; got PRED.",
	                  label, opcode_name(op));
}

static int infer_unary(struct shape *out, const struct shape *a, enum opcode op, const char *label,
                       struct status *st)
{
	bool floating = op == OP_EXPONENTIAL || op == OP_LOG || op == OP_TANH || op == OP_SQRT ||
	                op == OP_RSQRT;
	if (floating && !dtype_is_float(a->dtype))
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: Expected element type in shape to be floating or complex "
		                  "for %s operation; got %s.",
		                  label, opcode_name(op), type_upper(a->dtype));
	if (op == OP_NOT && dtype_is_float(a->dtype))
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: Expected pred or an integral element type in argument to "
		                  "Not operation; got %s.",
		                  label, type_upper(a->dtype));
	if ((op == OP_NEGATE || op == OP_ABS) && a->dtype == DT_PRED)
		return pred_not_arithmetic(op, label, st);
	*out = *a;
	return ST_OK;
}

static int infer_compare(struct shape *out, const Podemu__Node *n, const struct shape *a,
                         const struct shape *b, const char *label, struct status *st)
{
	char sa[128], sb[128];
	if (comparison_parse(n->comparison_direction) == CMP_INVALID)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: Unknown comparison direction '%s' (EQ, NE, LT, LE, GT, GE)",
		                  label, n->comparison_direction ? n->comparison_direction : "");
	if (!shape_equal(a, b))
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: Binary op compare with incompatible shapes: %s and %s.",
		                  label, shape_format(sa, sizeof(sa), a),
		                  shape_format(sb, sizeof(sb), b));
	*out = *a;
	out->dtype = DT_PRED;
	return ST_OK;
}

static int infer_select(struct shape *out, const struct shape *p, const struct shape *t,
                        const struct shape *f, const char *label, struct status *st)
{
	char sa[128], sb[128];
	if (!shape_equal(t, f))
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: Operands to select must be the same shape; got %s and %s.",
		                  label, shape_format(sa, sizeof(sa), t),
		                  shape_format(sb, sizeof(sb), f));
	if (p->dtype != DT_PRED)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: Select's pred operand must have PRED element type; got %s.",
		                  label, shape_format(sa, sizeof(sa), p));
	bool same_dims = p->rank == t->rank;
	for (int d = 0; same_dims && d < p->rank; d++)
		same_dims = p->dims[d] == t->dims[d];
	if (!same_dims)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: Operands to select and predicate must be the same shape; "
		                  "got %s and %s.",
		                  label, shape_format(sa, sizeof(sa), t),
		                  shape_format(sb, sizeof(sb), p));
	*out = *t;
	return ST_OK;
}

/* XLA broadcast: operand dimension i becomes result dimension dimensions[i]. */
static int infer_broadcast(struct shape *out, const Podemu__Node *n, const struct shape *a,
                           const char *label, struct status *st)
{
	int rv;
	if (n->shape == NULL)
		return status_set(st, ST_INVALID_ARGUMENT, "%s: broadcast needs its result shape",
		                  label);
	if ((rv = shape_from_proto(out, n->shape, st)) != ST_OK)
		return status_set(st, rv, "%s: %s", label, st->message);
	if (out->tuple)
		return status_set(st, ST_INVALID_ARGUMENT, "%s: result cannot be a tuple", label);
	out->dtype = a->dtype;
	if (n->n_dimensions != (size_t)a->rank)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: Broadcast dimensions order is wrong: %zu dimensions for an "
		                  "operand of rank %d.",
		                  label, n->n_dimensions, a->rank);
	for (int i = 0; i < a->rank; i++) {
		int64_t d = n->dimensions[i];
		if (d < 0 || d >= out->rank || (i > 0 && d <= n->dimensions[i - 1]))
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "%s: Broadcast dimension %lld is out of bound or not "
			                  "increasing.",
			                  label, (long long)d);
		if (a->dims[i] != out->dims[d])
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "%s: Broadcast dimension %d mismatch: %lld != %lld.",
			                  label, i, (long long)a->dims[i], (long long)out->dims[d]);
	}
	return shape_make(out, out->dtype, out->dims, out->rank, st);
}

/*
 * dynamic-slice (operand, start indices...; sizes in dimensions) and dynamic-update-slice
 * (operand, update, start indices...): one integer scalar start index per dimension.
 */
static int infer_dynamic_slice(struct shape *out, enum opcode op, const Podemu__Node *n,
                               const struct shape *shapes, const char *label, struct status *st)
{
	const struct shape *a = &shapes[n->operands[0]];
	int first_index = op == OP_DYNAMIC_SLICE ? 1 : 2;
	if (n->n_operands != (size_t)(first_index + a->rank))
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: Dynamic slice start number of dimensions %zu must match "
		                  "rank %d of slice input",
		                  label, n->n_operands - (size_t)first_index, a->rank);
	for (int d = 0; d < a->rank; d++) {
		const struct shape *ix = &shapes[n->operands[first_index + d]];
		if (ix->rank != 0 || (ix->dtype != DT_S32 && ix->dtype != DT_U32))
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "%s: Dynamic slice start indices must be scalars of an "
			                  "integral type (s32, u32); index %d is %s",
			                  label, d, type_upper(ix->dtype));
	}
	*out = *a;
	if (op == OP_DYNAMIC_SLICE) {
		if (n->n_dimensions != (size_t)a->rank)
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "%s: Dynamic slice start number of dimensions %d must "
			                  "match number of slice sizes %zu",
			                  label, a->rank, n->n_dimensions);
		for (int d = 0; d < a->rank; d++) {
			int64_t size = n->dimensions[d];
			if (size < 0 || size > a->dims[d])
				return status_set(st, ST_INVALID_ARGUMENT,
				                  "%s: Slice dim size %lld greater than dynamic "
				                  "slice dimension: %lld.",
				                  label, (long long)size, (long long)a->dims[d]);
			out->dims[d] = size;
		}
		return ST_OK;
	}
	const struct shape *u = &shapes[n->operands[1]];
	char sa[128], sb[128];
	if (u->rank != a->rank || u->dtype != a->dtype)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: Dynamic update slice update %s must match the rank and "
		                  "element type of the operand %s.",
		                  label, shape_format(sa, sizeof(sa), u),
		                  shape_format(sb, sizeof(sb), a));
	for (int d = 0; d < a->rank; d++)
		if (u->dims[d] > a->dims[d])
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "%s: Dynamic update slice update dimension %d (%lld) "
			                  "exceeds the operand's (%lld).",
			                  label, d, (long long)u->dims[d], (long long)a->dims[d]);
	return ST_OK;
}

static int infer_binary(struct shape *out, const struct shape *a, const struct shape *b,
                        enum opcode op, const char *label, struct status *st)
{
	char sa[128], sb[128];
	if (!shape_equal(a, b) || a->tuple)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: Binary op %s with incompatible shapes: %s and %s.", label,
		                  opcode_name(op), shape_format(sa, sizeof(sa), a),
		                  shape_format(sb, sizeof(sb), b));
	if ((op == OP_AND || op == OP_OR) && dtype_is_float(a->dtype))
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: Expected pred or integral type in argument to %s "
		                  "operation; got %s.",
		                  label, opcode_name(op), type_upper(a->dtype));
	if (a->dtype == DT_PRED && op != OP_MAXIMUM && op != OP_MINIMUM && op != OP_AND &&
	    op != OP_OR)
		return pred_not_arithmetic(op, label, st);
	*out = *a;
	return ST_OK;
}

static int infer_pad(struct shape *out, const Podemu__Node *n, const struct shape *in,
                     const char *label, struct status *st)
{
	if (n->n_pad_low != (size_t)in->rank || n->n_pad_high != (size_t)in->rank ||
	    n->n_pad_interior != (size_t)in->rank)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: The rank of the operand and the padding configuration do "
		                  "not match: %d vs %zu.",
		                  label, in->rank, n->n_pad_low);
	*out = *in;
	for (int d = 0; d < in->rank; d++) {
		int64_t lo = n->pad_low[d], hi = n->pad_high[d], interior = n->pad_interior[d];
		if (interior < 0 || interior > (int64_t)1 << 40 || lo < -((int64_t)1 << 50) ||
		    lo > (int64_t)1 << 50 || hi < -((int64_t)1 << 50) || hi > (int64_t)1 << 50)
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "%s: invalid padding %lld_%lld_%lld in dimension %d",
			                  label, (long long)lo, (long long)hi, (long long)interior,
			                  d);
		int64_t gaps = in->dims[d] > 0 ? in->dims[d] - 1 : 0;
		int64_t inner;
		if (!mul_overflow_i64(gaps, interior, &inner))
			return status_set(st, ST_INVALID_ARGUMENT, "%s: padded size overflows",
			                  label);
		int64_t size = in->dims[d] + inner + lo + hi;
		if (size < 0)
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "%s: padding makes dimension %d negative (%lld)", label,
			                  d, (long long)size);
		out->dims[d] = size;
	}
	return shape_make(out, in->dtype, out->dims, in->rank, st);
}

static int infer_slice(struct shape *out, const Podemu__Node *n, const struct shape *in,
                       const char *label, struct status *st)
{
	if (n->n_starts != (size_t)in->rank || n->n_limits != (size_t)in->rank ||
	    (n->n_strides != 0 && n->n_strides != (size_t)in->rank))
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: slice index count does not match argument rank: %zu vs %d.",
		                  label, n->n_starts, in->rank);
	*out = *in;
	for (int d = 0; d < in->rank; d++) {
		int64_t start = n->starts[d], limit = n->limits[d];
		int64_t stride = n->n_strides ? n->strides[d] : 1;
		if (start < 0 || limit < start || limit > in->dims[d] || stride < 1)
			return status_set(
			    st, ST_INVALID_ARGUMENT,
			    "%s: Slice dimension %d is out of bounds: [%lld:%lld:%lld] of %lld",
			    label, d, (long long)start, (long long)limit, (long long)stride,
			    (long long)in->dims[d]);
		out->dims[d] = (limit - start + stride - 1) / stride;
	}
	return ST_OK;
}

static int infer_concatenate(struct shape *out, const Podemu__Node *n, const struct shape *shapes,
                             const char *label, struct status *st)
{
	if (n->n_operands < 1)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: Concatenate expects at least one argument.", label);
	if (n->n_dimensions != 1)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: concatenate needs exactly one dimension", label);
	const struct shape *first = &shapes[n->operands[0]];
	int64_t dim = n->dimensions[0];
	if (first->tuple || dim < 0 || dim >= first->rank)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: Concatenate dimension out of bounds: %lld.", label,
		                  (long long)dim);
	*out = *first;
	out->dims[dim] = 0;
	for (size_t k = 0; k < n->n_operands; k++) {
		const struct shape *s = &shapes[n->operands[k]];
		char sa[128], sb[128];
		bool same = !s->tuple && s->dtype == first->dtype && s->rank == first->rank;
		for (int d = 0; same && d < s->rank; d++)
			if (d != dim && s->dims[d] != first->dims[d])
				same = false;
		if (!same)
			return status_set(
			    st, ST_INVALID_ARGUMENT,
			    "%s: Cannot concatenate arrays that differ in dimensions "
			    "other than the one being concatenated. Dimension %lld in "
			    "both shapes must be equal: %s vs %s.",
			    label, (long long)dim, shape_format(sa, sizeof(sa), first),
			    shape_format(sb, sizeof(sb), s));
		out->dims[dim] += s->dims[dim];
	}
	return shape_make(out, first->dtype, out->dims, out->rank, st);
}

/* reduce(operand) or reduce(operand, init_value): the init a scalar of the operand's type. */
static int infer_reduce(struct shape *out, const Podemu__Node *n, const struct shape *shapes,
                        const char *label, struct status *st)
{
	if (n->n_operands != 1 && n->n_operands != 2)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: expects an operand and an optional init value, got %zu "
		                  "operands",
		                  label, n->n_operands);
	const struct shape *in = &shapes[n->operands[0]];
	if (n->n_operands == 2) {
		const struct shape *init = &shapes[n->operands[1]];
		char text[128];
		if (init->rank != 0 || init->dtype != in->dtype)
			return status_set(
			    st, ST_INVALID_ARGUMENT, "%s: init value must be a scalar %s, got %s",
			    label, dtype_name(in->dtype), shape_format(text, sizeof(text), init));
	}
	enum reducer r = reducer_parse(n->reducer);
	if (r == RED_INVALID || r == RED_AND || r == RED_OR)
		return status_set(st, ST_UNIMPLEMENTED,
		                  "%s: reduce computation '%s' is not supported (add, max, min, "
		                  "multiply)",
		                  label, n->reducer);
	bool reduced[SHAPE_MAX_RANK] = {false};
	for (size_t k = 0; k < n->n_dimensions; k++) {
		int64_t d = n->dimensions[k];
		if (d < 0 || d >= in->rank || reduced[d])
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "%s: reducing out-of-bounds or repeated dimension %lld "
			                  "of a rank-%d operand",
			                  label, (long long)d, in->rank);
		reduced[d] = true;
	}
	memset(out, 0, sizeof(*out));
	out->dtype = in->dtype;
	for (int d = 0; d < in->rank; d++)
		if (!reduced[d])
			out->dims[out->rank++] = in->dims[d];
	return ST_OK;
}

/* The reducer of a reducing collective, checked against the element type. */
static int check_collective_reducer(const Podemu__Node *n, const struct shape *in,
                                    const char *label, struct status *st)
{
	enum reducer r = reducer_parse(n->reducer);
	if (r == RED_INVALID)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: unknown reduction '%s' (add, multiply, max, min, and, or)",
		                  label, n->reducer);
	if ((r == RED_AND || r == RED_OR) && dtype_is_float(in->dtype))
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: reduction '%s' needs an integer or pred operand, not %s",
		                  label, reducer_name(r), dtype_name(in->dtype));
	if (r != RED_AND && r != RED_OR && in->dtype == DT_PRED)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: reduction '%s' on pred; use and / or", label,
		                  reducer_name(r));
	return ST_OK;
}

static int infer_collective(struct shape *out, enum opcode op, const Podemu__Node *n,
                            const struct shape *in, const struct graph_env *env, const char *label,
                            struct status *st)
{
	*out = *in;
	/* A scale multiplies in floating point; on integers it would be dropped or wrong. */
	if (op == OP_ALL_REDUCE && n->scale != 0 && n->scale != 1 && !dtype_is_float(in->dtype))
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: all-reduce scale %g needs a floating-point operand (f32, "
		                  "bf16), not %s",
		                  label, n->scale, dtype_name(in->dtype));
	if (op == OP_COLLECTIVE_PERMUTE) {
		if (n->n_source_target_pairs % 2 != 0)
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "%s: source_target_pairs must come in pairs", label);
		unsigned char *src = calloc((size_t)env->world_size, 1);
		unsigned char *dst = calloc((size_t)env->world_size, 1);
		int rv =
		    src && dst ? ST_OK : status_set(st, ST_RESOURCE_EXHAUSTED, "out of memory");
		for (size_t k = 0; rv == ST_OK && k < n->n_source_target_pairs; k += 2) {
			int64_t s = n->source_target_pairs[k], t = n->source_target_pairs[k + 1];
			if (s < 0 || s >= env->world_size || t < 0 || t >= env->world_size)
				rv =
				    status_set(st, ST_INVALID_ARGUMENT,
				               "%s: source-target pair {%lld,%lld} names a replica "
				               "outside [0, %d)",
				               label, (long long)s, (long long)t, env->world_size);
			else if (src[s]++)
				rv = status_set(st, ST_INVALID_ARGUMENT,
				                "%s: Source %lld appears more than once in "
				                "instruction's source-target pairs",
				                label, (long long)s);
			else if (dst[t]++)
				rv = status_set(st, ST_INVALID_ARGUMENT,
				                "%s: Target %lld appears more than once in "
				                "instruction's source-target pairs",
				                label, (long long)t);
		}
		free(src);
		free(dst);
		return rv;
	}
	struct coll_groups g;
	int rv = coll_groups_resolve(&g, n, env->mesh, env->n_mesh, env->world_size,
	                             op == OP_ALL_REDUCE, label, st);
	if (rv != ST_OK)
		return rv;
	int64_t size = g.uniform_size;
	coll_groups_free(&g);
	if (op == OP_ALL_REDUCE)
		return check_collective_reducer(n, in, label, st);
	if (in->rank < 1)
		return status_set(st, ST_INVALID_ARGUMENT, "%s: needs an operand of rank >= 1",
		                  label);
	if (op == OP_ALL_TO_ALL) {
		int64_t sd = n->split_dimension, cd = n->concat_dimension;
		if (sd < 0 || sd >= in->rank || cd < 0 || cd >= in->rank)
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "%s: split_dimension %lld / concat_dimension %lld out of "
			                  "range for rank %d",
			                  label, (long long)sd, (long long)cd, in->rank);
		if (n->split_count != size)
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "%s: split_count %lld must equal the replica group size "
			                  "%lld",
			                  label, (long long)n->split_count, (long long)size);
		if (in->dims[sd] % size != 0)
			return status_set(
			    st, ST_INVALID_ARGUMENT,
			    "%s: AllToAll split dimension size %lld must be divisible "
			    "by split_count %lld",
			    label, (long long)in->dims[sd], (long long)size);
		out->dims[sd] /= size;
		if (!mul_overflow_i64(out->dims[cd], size, &out->dims[cd]))
			return status_set(st, ST_INVALID_ARGUMENT, "%s: result size overflows",
			                  label);
		return shape_make(out, in->dtype, out->dims, in->rank, st);
	}
	if (n->n_dimensions != 1 || n->dimensions[0] < 0 || n->dimensions[0] >= in->rank)
		return status_set(
		    st, ST_INVALID_ARGUMENT, "%s: %s must be one dimension of the rank-%d operand",
		    label, op == OP_ALL_GATHER ? "all_gather_dimension" : "scatter_dimension",
		    in->rank);
	int64_t d = n->dimensions[0];
	if (op == OP_REDUCE_SCATTER) {
		if ((rv = check_collective_reducer(n, in, label, st)) != ST_OK)
			return rv;
		if (in->dims[d] % size != 0)
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "%s: ReduceScatter operand scatter dimension size %lld "
			                  "must be dividable by shard_count %lld.",
			                  label, (long long)in->dims[d], (long long)size);
		out->dims[d] /= size;
		return ST_OK;
	}
	if (!mul_overflow_i64(in->dims[d], size, &out->dims[d]))
		return status_set(st, ST_INVALID_ARGUMENT, "%s: gathered size overflows", label);
	return shape_make(out, in->dtype, out->dims, in->rank, st);
}

/* Operands each op takes (-1: any number, checked by its own rule). */
static const int op_arity[OP_COUNT] = {
    [OP_PARAMETER] = 0,
    [OP_CONSTANT] = 0,
    [OP_IOTA] = 0,
    [OP_REPLICA_ID] = 0,
    [OP_ADD] = 2,
    [OP_SUBTRACT] = 2,
    [OP_MULTIPLY] = 2,
    [OP_MAXIMUM] = 2,
    [OP_MINIMUM] = 2,
    [OP_CONVERT] = 1,
    [OP_RESHAPE] = 1,
    [OP_PAD] = 1,
    [OP_SLICE] = 1,
    [OP_CONCATENATE] = -1,
    [OP_REDUCE] = -1,
    [OP_OPT_BARRIER] = -1,
    [OP_GET_TUPLE_ELEMENT] = 1,
    [OP_ALL_GATHER] = 1,
    [OP_ALL_REDUCE] = 1,
    [OP_REDUCE_SCATTER] = 1,
    [OP_ALL_TO_ALL] = 1,
    [OP_COLLECTIVE_PERMUTE] = 1,
    [OP_NEGATE] = 1,
    [OP_TRANSPOSE] = 1,
    [OP_DOT] = 2,
    [OP_DIVIDE] = 2,
    [OP_AND] = 2,
    [OP_OR] = 2,
    [OP_NOT] = 1,
    [OP_ABS] = 1,
    [OP_EXPONENTIAL] = 1,
    [OP_LOG] = 1,
    [OP_TANH] = 1,
    [OP_SQRT] = 1,
    [OP_RSQRT] = 1,
    [OP_COMPARE] = 2,
    [OP_SELECT] = 3,
    [OP_BROADCAST] = 1,
    [OP_PARTITION_ID] = 0,
    [OP_DYNAMIC_SLICE] = -1,
    [OP_DYNAMIC_UPDATE_SLICE] = -1,
    [OP_TUPLE] = -1,
    [OP_WHILE] = 1,
    [OP_CONDITIONAL] = -1,
    [OP_CALL] = -1,
    [OP_OPAQUE] = -1,
};

/* The operand count the op takes, and operands that are earlier nodes and not tuples. */
static int check_operands(const Podemu__Node *n, enum opcode op, int index,
                          const struct shape *shapes, const char *label, struct status *st)
{
	if (op_arity[op] >= 0 && n->n_operands != (size_t)op_arity[op])
		return status_set(st, ST_INVALID_ARGUMENT, "%s: expects %d operands, got %zu",
		                  label, op_arity[op], n->n_operands);
	for (size_t k = 0; k < n->n_operands; k++) {
		int32_t o = n->operands[k];
		if (o < 0 || o >= index)
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "%s: operand %zu refers to node %d, which is not an "
			                  "earlier node",
			                  label, k, o);
		if (shapes[o].tuple && op != OP_GET_TUPLE_ELEMENT && !opcode_is_control_flow(op))
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "%s: operand %zu is a tuple; take its elements with "
			                  "get-tuple-element",
			                  label, k);
	}
	return ST_OK;
}

/* A parameter of the entry computation: a device buffer, of the shape its node declares. */
static int infer_parameter(struct shape *out, const Podemu__Node *n, const char *label,
                           struct status *st)
{
	int rv = shape_from_proto(out, n->shape, st);
	if (rv != ST_OK)
		return status_set(st, rv, "%s: %s", label, st->message);
	if (n->handle == 0)
		return status_set(st, ST_INVALID_ARGUMENT, "%s: parameter has no buffer handle",
		                  label);
	if (out->tuple)
		return status_set(st, ST_INVALID_ARGUMENT, "%s: a device buffer cannot be a tuple",
		                  label);
	return ST_OK;
}

/* constant and iota: the array shape their node declares. */
static int infer_generated(struct shape *out, enum opcode op, const Podemu__Node *n,
                           const char *label, struct status *st)
{
	int rv = shape_from_proto(out, n->shape, st);
	if (rv != ST_OK)
		return status_set(st, rv, "%s: %s", label, st->message);
	if (out->tuple)
		return status_set(st, ST_INVALID_ARGUMENT, "%s: result cannot be a tuple", label);
	if (op == OP_CONSTANT)
		return check_value_fits(n, out->dtype, label, st);
	if (out->rank < 1 || n->n_dimensions != 1 || n->dimensions[0] < 0 ||
	    n->dimensions[0] >= out->rank)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: iota_dimension must name a dimension of %d", label,
		                  out->rank);
	return ST_OK;
}

static int infer_reshape(struct shape *out, const Podemu__Node *n, const struct shape *a,
                         const char *label, struct status *st)
{
	if (n->n_dimensions > SHAPE_MAX_RANK)
		return status_set(st, ST_INVALID_ARGUMENT, "%s: rank %zu is too large", label,
		                  n->n_dimensions);
	int rv = shape_make(out, a->dtype, n->dimensions, (int)n->n_dimensions, st);
	if (rv != ST_OK)
		return status_set(st, rv, "%s: %s", label, st->message);
	if (shape_elements(out) != shape_elements(a)) {
		char sa[128], sb[128];
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: Reshape operation has mismatched element counts: "
		                  "from=%lld (%s) to=%lld (%s).",
		                  label, (long long)shape_elements(a),
		                  shape_format(sa, sizeof(sa), a), (long long)shape_elements(out),
		                  shape_format(sb, sizeof(sb), out));
	}
	return ST_OK;
}

static int infer_get_tuple_element(struct shape *out, const Podemu__Node *n, const struct shape *a,
                                   const char *label, struct status *st)
{
	if (!a->tuple)
		return status_set(st, ST_INVALID_ARGUMENT, "%s: operand is not a tuple", label);
	if (n->tuple_index < 0 || n->tuple_index >= a->n_elements)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: tuple index %d out of range for a %d-element tuple", label,
		                  n->tuple_index, a->n_elements);
	*out = a->elements[n->tuple_index];
	return ST_OK;
}

static int infer_transpose(struct shape *out, const Podemu__Node *n, const struct shape *a,
                           const char *label, struct status *st)
{
	bool seen[SHAPE_MAX_RANK] = {false};
	if (n->n_dimensions != (size_t)a->rank)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: Transpose dimensions [%zu entries] must have the same "
		                  "size as the operand's rank %d",
		                  label, n->n_dimensions, a->rank);
	*out = *a;
	for (int d = 0; d < a->rank; d++) {
		int64_t from = n->dimensions[d];
		if (from < 0 || from >= a->rank || seen[from])
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "%s: Transpose dimensions must be a permutation of 0..%d",
			                  label, a->rank - 1);
		seen[from] = true;
		out->dims[d] = a->dims[from];
	}
	return ST_OK;
}

static int infer_dot(struct shape *out, const struct shape *a, const struct shape *b,
                     const char *label, struct status *st)
{
	char sa[128], sb[128];
	if (a->rank != 2 || b->rank != 2 || a->dtype != b->dtype || a->dtype == DT_PRED ||
	    a->dims[1] != b->dims[0])
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: Cannot infer shape for dot operation: %s <dot> %s. "
		                  "podemu's dot multiplies [m,k] by [k,n] of one arithmetic type.",
		                  label, shape_format(sa, sizeof(sa), a),
		                  shape_format(sb, sizeof(sb), b));
	int64_t dims[2] = {a->dims[0], b->dims[1]};
	int rv = shape_make(out, a->dtype, dims, 2, st);
	if (rv != ST_OK)
		return status_set(st, rv, "%s: %s", label, st->message);
	return ST_OK;
}

int graph_infer_node(struct shape *out, Podemu__Node *const *nodes, int index,
                     const struct shape *shapes, const struct graph_env *env, struct status *st)
{
	const Podemu__Node *n = nodes[index];
	char label[160];
	node_label(label, sizeof(label), n, index);
	enum opcode op = opcode_parse(n->opcode ? n->opcode : "");
	if (op == OP_INVALID)
		return status_set(st, ST_UNIMPLEMENTED, "node %d: unknown opcode '%s'", index,
		                  n->opcode ? n->opcode : "");
	int rv = check_operands(n, op, index, shapes, label, st);
	if (rv != ST_OK)
		return rv;
	const struct shape *a = n->n_operands > 0 ? &shapes[n->operands[0]] : NULL;
	if (opcode_is_unary(op))
		return infer_unary(out, a, op, label, st);
	switch (op) {
	case OP_PARAMETER:
		if (env->in_computation)
			return infer_computation_parameter(out, n, env, label, st);
		return infer_parameter(out, n, label, st);
	case OP_TUPLE:
		return tuple_of(out, n, shapes, env, label, st);
	case OP_WHILE:
	case OP_CONDITIONAL:
	case OP_CALL:
		return infer_call(out, op, n, shapes, env, label, st);
	case OP_OPAQUE:
		if (n->shape == NULL)
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "%s: an opaque op needs its shape", label);
		return declared_shape(out, n->shape, env, label, st);
	case OP_CONSTANT:
	case OP_IOTA:
		return infer_generated(out, op, n, label, st);
	case OP_REPLICA_ID:
	case OP_PARTITION_ID:
		return shape_make(out, DT_U32, NULL, 0, st);
	case OP_DIVIDE:
	case OP_AND:
	case OP_OR:
	case OP_ADD:
	case OP_SUBTRACT:
	case OP_MULTIPLY:
	case OP_MAXIMUM:
	case OP_MINIMUM:
		return infer_binary(out, a, &shapes[n->operands[1]], op, label, st);
	case OP_CONVERT:
		if (n->shape == NULL || dtype_size((int)n->shape->dtype) == 0)
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "%s: convert needs a valid target element type", label);
		*out = *a;
		out->dtype = (int)n->shape->dtype;
		return ST_OK;
	case OP_RESHAPE:
		return infer_reshape(out, n, a, label, st);
	case OP_PAD:
		if ((rv = check_value_fits(n, a->dtype, label, st)) != ST_OK)
			return rv;
		return infer_pad(out, n, a, label, st);
	case OP_SLICE:
		return infer_slice(out, n, a, label, st);
	case OP_CONCATENATE:
		return infer_concatenate(out, n, shapes, label, st);
	case OP_REDUCE:
		return infer_reduce(out, n, shapes, label, st);
	case OP_OPT_BARRIER:
		return tuple_of(out, n, shapes, env, label, st);
	case OP_GET_TUPLE_ELEMENT:
		return infer_get_tuple_element(out, n, a, label, st);
	case OP_ALL_GATHER:
	case OP_ALL_REDUCE:
	case OP_REDUCE_SCATTER:
	case OP_ALL_TO_ALL:
	case OP_COLLECTIVE_PERMUTE:
		return infer_collective(out, op, n, a, env, label, st);
	case OP_COMPARE:
		return infer_compare(out, n, a, &shapes[n->operands[1]], label, st);
	case OP_SELECT:
		return infer_select(out, a, &shapes[n->operands[1]], &shapes[n->operands[2]], label,
		                    st);
	case OP_BROADCAST:
		return infer_broadcast(out, n, a, label, st);
	case OP_DYNAMIC_SLICE:
	case OP_DYNAMIC_UPDATE_SLICE:
		if (n->n_operands < (op == OP_DYNAMIC_SLICE ? 1u : 2u))
			return status_set(st, ST_INVALID_ARGUMENT, "%s: too few operands", label);
		return infer_dynamic_slice(out, op, n, shapes, label, st);
	case OP_TRANSPOSE:
		return infer_transpose(out, n, a, label, st);
	case OP_DOT:
		return infer_dot(out, a, &shapes[n->operands[1]], label, st);
	default:
		return status_set(st, ST_UNIMPLEMENTED, "%s: not implemented", label);
	}
}
