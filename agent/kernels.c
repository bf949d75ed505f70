#include "kernels.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* An integer element (every integer type is exact in a double). */
static int64_t load_int(int dtype, const void *p, int64_t i)
{
	return (int64_t)dtype_load(dtype, p, i);
}

/* Stores an integer result, wrapping as two's-complement hardware does. */
static void store_int(int dtype, void *p, int64_t i, int64_t v)
{
	switch (dtype) {
	case DT_S32:
		((int32_t *)p)[i] = (int32_t)(uint32_t)(uint64_t)v;
		return;
	case DT_U32:
		((uint32_t *)p)[i] = (uint32_t)(uint64_t)v;
		return;
	case DT_U8:
		((uint8_t *)p)[i] = (uint8_t)(uint64_t)v;
		return;
	case DT_PRED:
		((uint8_t *)p)[i] = v != 0;
		return;
	}
}

static void fill(const struct shape *s, void *out, double value)
{
	int64_t n = shape_elements(s);
	if (s->dtype == DT_F32) {
		float v = (float)value;
		float *o = out;
		for (int64_t i = 0; i < n; i++)
			o[i] = v;
		return;
	}
	if (n == 0)
		return;
	size_t es = dtype_size(s->dtype);
	dtype_store(s->dtype, out, 0, value);
	for (int64_t i = 1; i < n; i++)
		memcpy((unsigned char *)out + (size_t)i * es, out, es);
}

/* Row-major strides (in elements) of a shape. */
static void strides_of(const struct shape *s, int64_t *strides)
{
	int64_t acc = 1;
	for (int d = s->rank - 1; d >= 0; d--) {
		strides[d] = acc;
		acc *= s->dims[d];
	}
}

/* Advances a multi-index over dims; returns 0 after the last element. */
static int next_index(int64_t *idx, const int64_t *dims, int rank)
{
	for (int d = rank - 1; d >= 0; d--) {
		if (++idx[d] < dims[d])
			return 1;
		idx[d] = 0;
	}
	return 0;
}

/*
 * XLA's integer division: x / 0 is -1 (all bits set) for signed and unsigned types, and the
 * most negative value divided by -1 is itself; otherwise it rounds toward zero.
 */
static int64_t int_divide(int dtype, int64_t x, int64_t y)
{
	if (y == 0)
		return dtype == DT_S32 ? -1 : (int64_t)UINT64_MAX;
	if (dtype == DT_S32 && x == INT32_MIN && y == -1)
		return x;
	return x / y;
}

static void binary(const struct kernel_call *k)
{
	int dt = k->out_shape->dtype;
	int64_t n = shape_elements(k->out_shape);
	const void *a = k->in[0], *b = k->in[1];
	if (dt == DT_F32) {
		const float *x = a, *y = b;
		float *o = k->out;
		switch (k->op) {
		case OP_ADD:
			for (int64_t i = 0; i < n; i++)
				o[i] = x[i] + y[i];
			return;
		case OP_SUBTRACT:
			for (int64_t i = 0; i < n; i++)
				o[i] = x[i] - y[i];
			return;
		case OP_MULTIPLY:
			for (int64_t i = 0; i < n; i++)
				o[i] = x[i] * y[i];
			return;
		case OP_DIVIDE:
			for (int64_t i = 0; i < n; i++)
				o[i] = x[i] / y[i];
			return;
		default:
			break;
		}
	}
	for (int64_t i = 0; i < n; i++) {
		if (dtype_is_float(dt)) {
			float x = (float)dtype_load(dt, a, i), y = (float)dtype_load(dt, b, i),
			      r = 0;
			switch (k->op) {
			case OP_ADD:
				r = x + y;
				break;
			case OP_SUBTRACT:
				r = x - y;
				break;
			case OP_MULTIPLY:
				r = x * y;
				break;
			case OP_MAXIMUM: /* NaN propagates, as in XLA */
				r = (isnan(x) || x > y) ? x : y;
				break;
			case OP_MINIMUM:
				r = (isnan(x) || x < y) ? x : y;
				break;
			case OP_DIVIDE:
				r = x / y;
				break;
			default:
				break;
			}
			dtype_store(dt, k->out, i, r);
		} else {
			int64_t x = load_int(dt, a, i), y = load_int(dt, b, i), r = 0;
			switch (k->op) {
			case OP_ADD:
				r = x + y;
				break;
			case OP_SUBTRACT:
				r = x - y;
				break;
			case OP_MULTIPLY:
				r = (int64_t)((uint64_t)x * (uint64_t)y);
				break;
			case OP_MAXIMUM:
				r = x > y ? x : y;
				break;
			case OP_MINIMUM:
				r = x < y ? x : y;
				break;
			case OP_DIVIDE:
				r = int_divide(dt, x, y);
				break;
			case OP_AND:
				r = dt == DT_PRED ? (x && y) : (x & y);
				break;
			case OP_OR:
				r = dt == DT_PRED ? (x || y) : (x | y);
				break;
			default:
				break;
			}
			store_int(dt, k->out, i, r);
		}
	}
}

static void convert(const struct kernel_call *k)
{
	int from = k->in_shapes[0]->dtype, to = k->out_shape->dtype;
	int64_t n = shape_elements(k->out_shape);
	if (from == to) {
		memcpy(k->out, k->in[0], (size_t)shape_bytes(k->out_shape));
		return;
	}
	for (int64_t i = 0; i < n; i++) {
		if (!dtype_is_float(from) && !dtype_is_float(to))
			store_int(to, k->out, i,
			          to == DT_PRED ? load_int(from, k->in[0], i) != 0
			                        : load_int(from, k->in[0], i));
		else
			dtype_store(to, k->out, i, dtype_load(from, k->in[0], i));
	}
}

static void iota(const struct kernel_call *k)
{
	const struct shape *s = k->out_shape;
	int dim = (int)k->node->dimensions[0];
	int64_t idx[SHAPE_MAX_RANK] = {0};
	int64_t n = shape_elements(s);
	for (int64_t i = 0; i < n; i++) {
		dtype_store(s->dtype, k->out, i, (double)idx[dim]);
		next_index(idx, s->dims, s->rank);
	}
}

static void pad(const struct kernel_call *k)
{
	const struct shape *in = k->in_shapes[0], *out = k->out_shape;
	size_t es = dtype_size(in->dtype);
	fill(out, k->out, k->node->value);
	int64_t out_strides[SHAPE_MAX_RANK];
	strides_of(out, out_strides);
	int64_t idx[SHAPE_MAX_RANK] = {0};
	int64_t n = shape_elements(in);
	for (int64_t i = 0; i < n; i++) {
		int64_t at = 0;
		int inside = 1;
		for (int d = 0; d < in->rank; d++) {
			int64_t pos = k->node->pad_low[d] + idx[d] * (k->node->pad_interior[d] + 1);
			if (pos < 0 || pos >= out->dims[d]) {
				inside = 0;
				break;
			}
			at += pos * out_strides[d];
		}
		if (inside)
			memcpy((unsigned char *)k->out + (size_t)at * es,
			       (const unsigned char *)k->in[0] + (size_t)i * es, es);
		next_index(idx, in->dims, in->rank);
	}
}

static void slice(const struct kernel_call *k)
{
	const struct shape *in = k->in_shapes[0], *out = k->out_shape;
	size_t es = dtype_size(in->dtype);
	int64_t in_strides[SHAPE_MAX_RANK];
	strides_of(in, in_strides);
	int64_t idx[SHAPE_MAX_RANK] = {0};
	int64_t n = shape_elements(out);
	for (int64_t i = 0; i < n; i++) {
		int64_t at = 0;
		for (int d = 0; d < in->rank; d++) {
			int64_t stride = k->node->n_strides ? k->node->strides[d] : 1;
			at += (k->node->starts[d] + idx[d] * stride) * in_strides[d];
		}
		memcpy((unsigned char *)k->out + (size_t)i * es,
		       (const unsigned char *)k->in[0] + (size_t)at * es, es);
		next_index(idx, out->dims, out->rank);
	}
}

static void concatenate(const struct kernel_call *k)
{
	const struct shape *out = k->out_shape;
	int dim = (int)k->node->dimensions[0];
	size_t es = dtype_size(out->dtype);
	int64_t outer = 1, inner = 1;
	for (int d = 0; d < dim; d++)
		outer *= out->dims[d];
	for (int d = dim + 1; d < out->rank; d++)
		inner *= out->dims[d];
	size_t out_row = (size_t)(out->dims[dim] * inner) * es;
	size_t at = 0;
	for (int j = 0; j < k->num_in; j++) {
		size_t row = (size_t)(k->in_shapes[j]->dims[dim] * inner) * es;
		for (int64_t o = 0; o < outer; o++)
			memcpy((unsigned char *)k->out + (size_t)o * out_row + at,
			       (const unsigned char *)k->in[j] + (size_t)o * row, row);
		at += row;
	}
}

static int reduce(const struct kernel_call *k, struct status *st)
{
	const struct shape *in = k->in_shapes[0], *out = k->out_shape;
	const char *r = k->node->reducer ? k->node->reducer : "";
	int kind = strcmp(r, "max") == 0        ? 1
	           : strcmp(r, "min") == 0      ? 2
	           : strcmp(r, "multiply") == 0 ? 3
	                                        : 0;
	int64_t n_out = shape_elements(out);
	/* Accumulate in double (floats) or int64 (integers), then store once. */
	double *acc = malloc((size_t)(n_out ? n_out : 1) * sizeof(double));
	if (acc == NULL)
		return status_set(st, ST_INTERNAL, "reduce: out of host memory");
	double init = kind == 1 ? -INFINITY : kind == 2 ? INFINITY : kind == 3 ? 1 : 0;
	if (!dtype_is_float(in->dtype) && kind == 1)
		init = -9.3e18;
	if (!dtype_is_float(in->dtype) && kind == 2)
		init = 9.3e18;
	if (k->node->n_operands == 2) /* XLA's init_value, folded in once per result element */
		init = dtype_load(in->dtype, k->in[1], 0);
	for (int64_t i = 0; i < n_out; i++)
		acc[i] = init;
	bool reduced[SHAPE_MAX_RANK] = {false};
	for (size_t d = 0; d < k->node->n_dimensions; d++)
		reduced[k->node->dimensions[d]] = true;
	int64_t out_strides[SHAPE_MAX_RANK];
	strides_of(out, out_strides);
	int64_t idx[SHAPE_MAX_RANK] = {0};
	int64_t n = shape_elements(in);
	for (int64_t i = 0; i < n; i++) {
		int64_t at = 0;
		for (int d = 0, od = 0; d < in->rank; d++)
			if (!reduced[d])
				at += idx[d] * out_strides[od++];
		double v = dtype_load(in->dtype, k->in[0], i);
		switch (kind) {
		case 0:
			acc[at] += v;
			break;
		case 1:
			acc[at] = (isnan(v) || v > acc[at]) ? v : acc[at];
			break;
		case 2:
			acc[at] = (isnan(v) || v < acc[at]) ? v : acc[at];
			break;
		case 3:
			acc[at] *= v;
			break;
		}
		next_index(idx, in->dims, in->rank);
	}
	for (int64_t i = 0; i < n_out; i++) {
		if (dtype_is_float(out->dtype))
			dtype_store(out->dtype, k->out, i, acc[i]);
		else
			store_int(out->dtype, k->out, i,
			          (int64_t)fmod(acc[i], 18446744073709551616.0));
	}
	free(acc);
	return ST_OK;
}

static double unary_float(enum opcode op, double x)
{
	switch (op) {
	case OP_NEGATE:
		return -x;
	case OP_ABS:
		return fabs(x);
	case OP_EXPONENTIAL:
		return exp(x);
	case OP_LOG:
		return log(x);
	case OP_TANH:
		return tanh(x);
	case OP_SQRT:
		return sqrt(x);
	case OP_RSQRT:
		return 1.0 / sqrt(x);
	default:
		return x;
	}
}

/* Elementwise one-operand ops; floats computed in double and rounded once. */
static void unary(const struct kernel_call *k)
{
	int dt = k->out_shape->dtype;
	int64_t n = shape_elements(k->out_shape);
	for (int64_t i = 0; i < n; i++) {
		if (dtype_is_float(dt)) {
			dtype_store(dt, k->out, i, unary_float(k->op, dtype_load(dt, k->in[0], i)));
			continue;
		}
		int64_t x = load_int(dt, k->in[0], i);
		int64_t r = k->op == OP_NEGATE ? -x
		            : k->op == OP_ABS  ? (x < 0 ? -x : x)
		            : dt == DT_PRED    ? !x
		                               : ~x; /* not */
		store_int(dt, k->out, i, r);
	}
}

/* pred result; floats compare as IEEE does (NaN is unordered: only NE holds). */
static void compare(const struct kernel_call *k)
{
	int dt = k->in_shapes[0]->dtype;
	enum comparison dir = comparison_parse(k->node->comparison_direction);
	int64_t n = shape_elements(k->out_shape);
	uint8_t *o = k->out;
	for (int64_t i = 0; i < n; i++) {
		double x = dtype_load(dt, k->in[0], i), y = dtype_load(dt, k->in[1], i);
		switch (dir) {
		case CMP_EQ:
			o[i] = x == y;
			break;
		case CMP_NE:
			o[i] = x != y;
			break;
		case CMP_LT:
			o[i] = x < y;
			break;
		case CMP_LE:
			o[i] = x <= y;
			break;
		case CMP_GT:
			o[i] = x > y;
			break;
		default:
			o[i] = x >= y;
			break;
		}
	}
}

static void select_op(const struct kernel_call *k)
{
	size_t es = dtype_size(k->out_shape->dtype);
	int64_t n = shape_elements(k->out_shape);
	const uint8_t *p = k->in[0];
	for (int64_t i = 0; i < n; i++)
		memmove((unsigned char *)k->out + (size_t)i * es, /* in place: the same bytes */
		        (const unsigned char *)k->in[p[i] ? 1 : 2] + (size_t)i * es, es);
}

/*
 * out[idx] = in[j] where input dimension e of j is output dimension axis[e] of idx: the element
 * copy behind broadcast (axis = dimensions) and transpose (axis = inverse permutation).
 */
static void copy_by_axes(const struct kernel_call *k, const int64_t *axis)
{
	const struct shape *in = k->in_shapes[0], *out = k->out_shape;
	size_t es = dtype_size(out->dtype);
	int64_t in_strides[SHAPE_MAX_RANK], idx[SHAPE_MAX_RANK] = {0};
	strides_of(in, in_strides);
	int64_t n = shape_elements(out);
	for (int64_t i = 0; i < n; i++) {
		int64_t from = 0;
		for (int e = 0; e < in->rank; e++)
			from += idx[axis[e]] * in_strides[e];
		memcpy((unsigned char *)k->out + (size_t)i * es,
		       (const unsigned char *)k->in[0] + (size_t)from * es, es);
		next_index(idx, out->dims, out->rank);
	}
}

/* Start index of dimension d, clamped as XLA does so the window stays inside the operand. */
static int64_t clamped_start(const struct kernel_call *k, int operand, int64_t dim, int64_t window)
{
	const struct shape *s = k->in_shapes[operand];
	int64_t v = s->dtype == DT_S32 ? *(const int32_t *)k->in[operand]
	                               : (int64_t) * (const uint32_t *)k->in[operand];
	if (v > dim - window)
		v = dim - window;
	return v < 0 ? 0 : v;
}

/*
 * Copies the box of size dims box[] between a row-major array (full) at start[] and a dense
 * array (window): into the window when to_window, else out of it.
 */
static void copy_box(void *full, const struct shape *fs, const int64_t *start, void *window,
                     const int64_t *box, bool to_window)
{
	size_t es = dtype_size(fs->dtype);
	int64_t strides[SHAPE_MAX_RANK], idx[SHAPE_MAX_RANK] = {0}, n = 1;
	strides_of(fs, strides);
	for (int d = 0; d < fs->rank; d++)
		n *= box[d];
	for (int64_t i = 0; i < n; i++) {
		int64_t at = 0;
		for (int d = 0; d < fs->rank; d++)
			at += (start[d] + idx[d]) * strides[d];
		unsigned char *f = (unsigned char *)full + (size_t)at * es;
		unsigned char *w = (unsigned char *)window + (size_t)i * es;
		memcpy(to_window ? w : f, to_window ? f : w, es);
		next_index(idx, box, fs->rank);
	}
}

static void dynamic_slice(const struct kernel_call *k)
{
	const struct shape *in = k->in_shapes[0], *out = k->out_shape;
	int64_t start[SHAPE_MAX_RANK];
	for (int d = 0; d < in->rank; d++)
		start[d] = clamped_start(k, 1 + d, in->dims[d], out->dims[d]);
	copy_box((void *)k->in[0], in, start, k->out, out->dims, true);
}

static void dynamic_update_slice(const struct kernel_call *k)
{
	const struct shape *in = k->in_shapes[0], *up = k->in_shapes[1];
	int64_t start[SHAPE_MAX_RANK];
	for (int d = 0; d < in->rank; d++)
		start[d] = clamped_start(k, 2 + d, in->dims[d], up->dims[d]);
	memmove(k->out, k->in[0], (size_t)shape_bytes(in));
	copy_box(k->out, in, start, (void *)k->in[1], up->dims, false);
}

/* Output dimension d is input dimension perm[d]. */
static void transpose(const struct kernel_call *k)
{
	int64_t axis[SHAPE_MAX_RANK];
	for (int d = 0; d < k->out_shape->rank; d++)
		axis[k->node->dimensions[d]] = d;
	copy_by_axes(k, axis);
}

/* [m,k] x [k,n]: sums in double (integers wrap when stored, as the hardware does). */
static int dot(const struct kernel_call *k, struct status *st)
{
	const struct shape *a = k->in_shapes[0], *b = k->in_shapes[1];
	int64_t m = a->dims[0], kk = a->dims[1], n = b->dims[1];
	int dt = k->out_shape->dtype;
	double *row = malloc((size_t)(n ? n : 1) * sizeof(double));
	if (row == NULL)
		return status_set(st, ST_INTERNAL, "dot: out of host memory");
	if (dt == DT_F32) { /* the same sums without a conversion call per element */
		const float *x = k->in[0], *y = k->in[1];
		float *o = k->out;
		for (int64_t i = 0; i < m; i++) {
			for (int64_t j = 0; j < n; j++)
				row[j] = 0;
			for (int64_t p = 0; p < kk; p++) {
				double xv = x[i * kk + p];
				const float *yr = y + p * n;
				for (int64_t j = 0; j < n; j++)
					row[j] += xv * yr[j];
			}
			for (int64_t j = 0; j < n; j++)
				o[i * n + j] = (float)row[j];
		}
		free(row);
		return ST_OK;
	}
	for (int64_t i = 0; i < m; i++) {
		for (int64_t j = 0; j < n; j++)
			row[j] = 0;
		for (int64_t p = 0; p < kk; p++) {
			double x = dtype_load(dt, k->in[0], i * kk + p);
			for (int64_t j = 0; j < n; j++)
				row[j] += x * dtype_load(dt, k->in[1], p * n + j);
		}
		for (int64_t j = 0; j < n; j++) {
			if (dtype_is_float(dt))
				dtype_store(dt, k->out, i * n + j, row[j]);
			else
				store_int(dt, k->out, i * n + j,
				          (int64_t)fmod(row[j], 18446744073709551616.0));
		}
	}
	free(row);
	return ST_OK;
}

int kernel_run(const struct kernel_call *k, struct status *st)
{
	if (opcode_is_unary(k->op)) {
		unary(k);
		return ST_OK;
	}
	switch (k->op) {
	case OP_CONSTANT:
		fill(k->out_shape, k->out, k->node->value);
		return ST_OK;
	case OP_IOTA:
		iota(k);
		return ST_OK;
	case OP_REPLICA_ID:
		*(uint32_t *)k->out = (uint32_t)k->replica_id;
		return ST_OK;
	case OP_PARTITION_ID: /* one partition per program: every core is a replica */
		*(uint32_t *)k->out = 0;
		return ST_OK;
	case OP_DIVIDE:
	case OP_AND:
	case OP_OR:
	case OP_ADD:
	case OP_SUBTRACT:
	case OP_MULTIPLY:
	case OP_MAXIMUM:
	case OP_MINIMUM:
		binary(k);
		return ST_OK;
	case OP_CONVERT:
		convert(k);
		return ST_OK;
	case OP_RESHAPE:
		memmove(k->out, k->in[0], (size_t)shape_bytes(k->out_shape));
		return ST_OK;
	case OP_PAD:
		pad(k);
		return ST_OK;
	case OP_SLICE:
		slice(k);
		return ST_OK;
	case OP_CONCATENATE:
		concatenate(k);
		return ST_OK;
	case OP_REDUCE:
		return reduce(k, st);
	case OP_COMPARE:
		compare(k);
		return ST_OK;
	case OP_SELECT:
		select_op(k);
		return ST_OK;
	case OP_BROADCAST: /* operand dimension i is result dimension dimensions[i] */
		copy_by_axes(k, k->node->dimensions);
		return ST_OK;
	case OP_DYNAMIC_SLICE:
		dynamic_slice(k);
		return ST_OK;
	case OP_DYNAMIC_UPDATE_SLICE:
		dynamic_update_slice(k);
		return ST_OK;
	case OP_TRANSPOSE:
		transpose(k);
		return ST_OK;
	case OP_DOT:
		return dot(k, st);
	default:
		return status_set(st, ST_UNIMPLEMENTED, "no kernel for %s", opcode_name(k->op));
	}
}

void kernel_combine(int dtype, enum reducer red, void *dst, const void *a, const void *restrict b,
                    int64_t nbytes)
{
	int64_t n = nbytes / (int64_t)dtype_size(dtype);
	if (dtype == DT_F32) {
		/* d may be x (no restrict): GCC checks that at run time and stays SIMD. */
		float *d = dst;
		const float *x = a, *restrict y = b;
		switch (red) {
		case RED_ADD:
			for (int64_t i = 0; i < n; i++)
				d[i] = x[i] + y[i];
			return;
		case RED_MULTIPLY:
			for (int64_t i = 0; i < n; i++)
				d[i] = x[i] * y[i];
			return;
		case RED_MAX:
			for (int64_t i = 0; i < n; i++)
				d[i] = (isnan(x[i]) || x[i] > y[i]) ? x[i] : y[i];
			return;
		case RED_MIN:
			for (int64_t i = 0; i < n; i++)
				d[i] = (isnan(x[i]) || x[i] < y[i]) ? x[i] : y[i];
			return;
		default:
			return;
		}
	}
	if (dtype == DT_BF16) {
		uint16_t *d = dst;
		const uint16_t *xs = a, *restrict ys = b;
		for (int64_t i = 0; i < n; i++) {
			float x = dtype_bf16_to_f32(xs[i]), y = dtype_bf16_to_f32(ys[i]), r = x;
			if (red == RED_ADD)
				r = x + y;
			else if (red == RED_MULTIPLY)
				r = x * y;
			else if (red == RED_MAX)
				r = (isnan(x) || x > y) ? x : y;
			else if (red == RED_MIN)
				r = (isnan(x) || x < y) ? x : y;
			d[i] = dtype_f32_to_bf16(r);
		}
		return;
	}
	for (int64_t i = 0; i < n; i++) {
		int64_t x = load_int(dtype, a, i), y = load_int(dtype, b, i), r;
		switch (red) {
		case RED_ADD:
			r = x + y;
			break;
		case RED_MULTIPLY:
			r = (int64_t)((uint64_t)x * (uint64_t)y);
			break;
		case RED_MAX:
			r = x > y ? x : y;
			break;
		case RED_MIN:
			r = x < y ? x : y;
			break;
		case RED_AND:
			r = dtype == DT_PRED ? (x && y) : (x & y);
			break;
		default:
			r = dtype == DT_PRED ? (x || y) : (x | y);
			break;
		}
		store_int(dtype, dst, i, r);
	}
}
