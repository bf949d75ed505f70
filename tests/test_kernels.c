/* Reference kernels against values computed by hand. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "graph_builder.h"
#include "kernels.h"

static struct shape mk(int dtype, int64_t d0, int64_t d1, int rank)
{
	struct shape s;
	struct status st;
	int64_t d[] = {d0, d1};
	shape_make(&s, dtype, d, rank, &st);
	return s;
}

static int run(enum opcode op, const Podemu__Node *n, const struct shape *out_shape, void *out,
               const struct shape *a_shape, const void *a, const struct shape *b_shape,
               const void *b)
{
	struct kernel_call k = {.op = op, .node = n, .out_shape = out_shape, .out = out};
	if (a_shape) {
		k.in_shapes[k.num_in] = a_shape;
		k.in[k.num_in++] = a;
	}
	if (b_shape) {
		k.in_shapes[k.num_in] = b_shape;
		k.in[k.num_in++] = b;
	}
	struct status st;
	return kernel_run(&k, &st);
}

static void test_elementwise(void **state)
{
	Podemu__Node n = PODEMU__NODE__INIT;
	struct shape s = mk(DT_F32, 4, 0, 1);
	float a[] = {1, -2, 3.5f, NAN}, b[] = {2, 2, -1, 0}, o[4];
	run(OP_ADD, &n, &s, o, &s, a, &s, b);
	assert_true(o[0] == 3 && o[1] == 0 && o[2] == 2.5f && isnan(o[3]));
	run(OP_MAXIMUM, &n, &s, o, &s, a, &s, b);
	assert_true(o[0] == 2 && o[1] == 2 && o[2] == 3.5f && isnan(o[3]));
	run(OP_MINIMUM, &n, &s, o, &s, a, &s, b);
	assert_true(o[0] == 1 && o[1] == -2 && o[2] == -1);
	run(OP_MULTIPLY, &n, &s, o, &s, a, &s, b);
	assert_true(o[0] == 2 && o[1] == -4 && o[2] == -3.5f);
	struct shape si = mk(DT_S32, 2, 0, 1);
	int32_t x[] = {INT32_MAX, -5}, y[] = {1, 7}, z[2];
	run(OP_ADD, &n, &si, z, &si, x, &si, y);
	assert_int_equal(z[0], INT32_MIN); /* wraps like the hardware */
	assert_int_equal(z[1], 2);
	run(OP_SUBTRACT, &n, &si, z, &si, x, &si, y);
	assert_int_equal(z[1], -12);
}

static void test_convert_and_bf16(void **state)
{
	assert_int_equal(dtype_f32_to_bf16(1.0f), 0x3f80);
	/* 1 + 2^-8 lies halfway between two bf16 values: rounds to even (1.0). */
	assert_int_equal(dtype_f32_to_bf16(1.00390625f), 0x3f80);
	assert_true(dtype_bf16_to_f32(0x4049) > 3.14f && dtype_bf16_to_f32(0x4049) < 3.15f);
	Podemu__Node n = PODEMU__NODE__INIT;
	struct shape f = mk(DT_F32, 3, 0, 1), s = mk(DT_S32, 3, 0, 1), u = mk(DT_U8, 3, 0, 1);
	float a[] = {-3.7f, 1e10f, NAN};
	int32_t out[3];
	run(OP_CONVERT, &n, &s, out, &f, a, NULL, NULL);
	assert_int_equal(out[0], -3);
	assert_int_equal(out[1], INT32_MAX);
	assert_int_equal(out[2], 0);
	uint8_t b[3];
	run(OP_CONVERT, &n, &u, b, &f, a, NULL, NULL);
	assert_int_equal(b[0], 0);
	assert_int_equal(b[1], 255);
}

static void test_fill_iota_pad_slice_concat_reduce(void **state)
{
	Podemu__Node n = PODEMU__NODE__INIT;
	struct shape s23 = mk(DT_F32, 2, 3, 2);
	float c[6];
	n.value = 2.5;
	run(OP_CONSTANT, &n, &s23, c, NULL, NULL, NULL, NULL);
	for (int i = 0; i < 6; i++)
		assert_true(c[i] == 2.5f);

	int64_t dim1 = 1;
	n.dimensions = &dim1;
	n.n_dimensions = 1;
	float io[6];
	run(OP_IOTA, &n, &s23, io, NULL, NULL, NULL, NULL);
	float want_iota[] = {0, 1, 2, 0, 1, 2};
	assert_memory_equal(io, want_iota, sizeof(io));

	/* pad [2,3] -> low (0,1) high (1,0) interior (1,0) with -1: [4,4] */
	Podemu__Node p = PODEMU__NODE__INIT;
	int64_t lo[] = {0, 1}, hi[] = {1, 0}, in[] = {1, 0};
	p.pad_low = lo, p.pad_high = hi, p.pad_interior = in;
	p.n_pad_low = p.n_pad_high = p.n_pad_interior = 2;
	p.value = -1;
	struct shape s44 = mk(DT_F32, 4, 4, 2);
	float padded[16];
	run(OP_PAD, &p, &s44, padded, &s23, io, NULL, NULL);
	float want_pad[] = {-1, 0, 1, 2, -1, -1, -1, -1, -1, 0, 1, 2, -1, -1, -1, -1};
	assert_memory_equal(padded, want_pad, sizeof(padded));

	/* slice [4,4][1:4:2, 1:4:2] -> [2,2] */
	Podemu__Node sl = PODEMU__NODE__INIT;
	int64_t st0[] = {1, 1}, li[] = {4, 4}, str[] = {2, 2};
	sl.starts = st0, sl.limits = li, sl.strides = str;
	sl.n_starts = sl.n_limits = sl.n_strides = 2;
	struct shape s22 = mk(DT_F32, 2, 2, 2);
	float sliced[4];
	run(OP_SLICE, &sl, &s22, sliced, &s44, padded, NULL, NULL);
	float want_slice[] = {-1, -1, -1, -1};
	assert_memory_equal(sliced, want_slice, sizeof(sliced));

	/* concatenate [2,3] and [2,3] along 1 -> [2,6] */
	Podemu__Node cc = PODEMU__NODE__INIT;
	cc.dimensions = &dim1;
	cc.n_dimensions = 1;
	struct shape s26 = mk(DT_F32, 2, 6, 2);
	float cat[12];
	run(OP_CONCATENATE, &cc, &s26, cat, &s23, io, &s23, c);
	float want_cat[] = {0, 1, 2, 2.5f, 2.5f, 2.5f, 0, 1, 2, 2.5f, 2.5f, 2.5f};
	assert_memory_equal(cat, want_cat, sizeof(cat));

	/* reduce-sum of [2,6] over dim 1 -> [2] */
	Podemu__Node r = PODEMU__NODE__INIT;
	r.dimensions = &dim1;
	r.n_dimensions = 1;
	struct shape s2 = mk(DT_F32, 2, 0, 1);
	float sums[2];
	run(OP_REDUCE, &r, &s2, sums, &s26, cat, NULL, NULL);
	assert_true(sums[0] == 10.5f && sums[1] == 10.5f);
	r.reducer = "max";
	run(OP_REDUCE, &r, &s2, sums, &s26, cat, NULL, NULL);
	assert_true(sums[0] == 2.5f);
}

static void test_negate_transpose_dot(void **state)
{
	Podemu__Node n = PODEMU__NODE__INIT;
	struct shape a = mk(DT_F32, 2, 3, 2), at = mk(DT_F32, 3, 2, 2), c = mk(DT_F32, 2, 2, 2);
	float x[] = {1, 2, 3, 4, 5, 6}, neg[6], xt[6], prod[4];
	assert_int_equal(run(OP_NEGATE, &n, &a, neg, &a, x, NULL, NULL), ST_OK);
	assert_true(neg[0] == -1 && neg[5] == -6);
	int64_t perm[] = {1, 0};
	n.dimensions = perm;
	n.n_dimensions = 2;
	assert_int_equal(run(OP_TRANSPOSE, &n, &at, xt, &a, x, NULL, NULL), ST_OK);
	float want_t[] = {1, 4, 2, 5, 3, 6};
	assert_memory_equal(xt, want_t, sizeof(want_t));
	/* [[1,2,3],[4,5,6]] x [[1,4],[2,5],[3,6]] = [[14,32],[32,77]] */
	assert_int_equal(run(OP_DOT, &n, &c, prod, &a, x, &at, xt), ST_OK);
	float want_p[] = {14, 32, 32, 77};
	assert_memory_equal(prod, want_p, sizeof(want_p));
	struct shape si = mk(DT_S32, 1, 2, 2), sj = mk(DT_S32, 2, 1, 2), so = mk(DT_S32, 1, 1, 2);
	int32_t p[] = {65536, 65536}, q[] = {65536, 1}, r[1], ni[2];
	assert_int_equal(run(OP_DOT, &n, &so, r, &si, p, &sj, q), ST_OK);
	assert_int_equal(r[0], 65536); /* 2^32 wraps to 0, plus 65536 */
	assert_int_equal(run(OP_NEGATE, &n, &si, ni, &si, p, NULL, NULL), ST_OK);
	assert_int_equal(ni[0], -65536);
}

static void test_divide_logic_unary(void **state)
{
	Podemu__Node n = PODEMU__NODE__INIT;
	struct shape s = mk(DT_F32, 4, 0, 1);
	float a[] = {1, -8, 0, 4}, b[] = {2, 2, 0, -0.5f}, o[4];
	run(OP_DIVIDE, &n, &s, o, &s, a, &s, b);
	assert_true(o[0] == 0.5f && o[1] == -4 && isnan(o[2]) && o[3] == -8);
	struct shape si = mk(DT_S32, 4, 0, 1);
	int32_t x[] = {7, -7, 5, INT32_MIN}, y[] = {2, 2, 0, -1}, z[4];
	run(OP_DIVIDE, &n, &si, z, &si, x, &si, y);
	/* rounds toward zero; x / 0 = -1; INT_MIN / -1 = INT_MIN, as XLA defines them */
	assert_true(z[0] == 3 && z[1] == -3 && z[2] == -1 && z[3] == INT32_MIN);
	struct shape su = mk(DT_U32, 1, 0, 1);
	uint32_t u = 9, zero = 0, uz;
	run(OP_DIVIDE, &n, &su, &uz, &su, &u, &su, &zero);
	assert_true(uz == UINT32_MAX);
	struct shape sp = mk(DT_PRED, 4, 0, 1);
	uint8_t p[] = {0, 1, 0, 1}, q[] = {0, 0, 1, 1}, r[4];
	run(OP_AND, &n, &sp, r, &sp, p, &sp, q);
	assert_true(r[0] == 0 && r[1] == 0 && r[2] == 0 && r[3] == 1);
	run(OP_OR, &n, &sp, r, &sp, p, &sp, q);
	assert_true(r[0] == 0 && r[1] == 1 && r[2] == 1 && r[3] == 1);
	run(OP_NOT, &n, &sp, r, &sp, p, NULL, NULL);
	assert_true(r[0] == 1 && r[1] == 0);
	run(OP_NOT, &n, &si, z, &si, x, NULL, NULL);
	assert_int_equal(z[0], ~7);
	run(OP_ABS, &n, &si, z, &si, x, NULL, NULL);
	assert_true(z[0] == 7 && z[1] == 7);
	float e[] = {0, 1, 4, -1};
	run(OP_EXPONENTIAL, &n, &s, o, &s, e, NULL, NULL);
	assert_true(o[0] == 1 && fabsf(o[1] - 2.7182817f) < 1e-6f);
	run(OP_LOG, &n, &s, o, &s, e, NULL, NULL);
	assert_true(isinf(o[0]) && o[0] < 0 && o[1] == 0 && isnan(o[3]));
	run(OP_SQRT, &n, &s, o, &s, e, NULL, NULL);
	assert_true(o[2] == 2);
	run(OP_RSQRT, &n, &s, o, &s, e, NULL, NULL);
	assert_true(o[2] == 0.5f);
	run(OP_TANH, &n, &s, o, &s, e, NULL, NULL);
	assert_true(o[0] == 0 && fabsf(o[3] + 0.7615942f) < 1e-6f);
	run(OP_ABS, &n, &s, o, &s, e, NULL, NULL);
	assert_true(o[3] == 1);
}

static void test_compare_select_broadcast(void **state)
{
	Podemu__Node n = PODEMU__NODE__INIT;
	struct shape s = mk(DT_F32, 4, 0, 1), sp = mk(DT_PRED, 4, 0, 1);
	float a[] = {1, 2, NAN, 4}, b[] = {2, 2, NAN, 3}, o[4];
	uint8_t r[4];
	const char *dirs[] = {"EQ", "NE", "LT", "LE", "GT", "GE"};
	uint8_t want[][4] = {{0, 1, 0, 0}, {1, 0, 1, 1}, {1, 0, 0, 0},
	                     {1, 1, 0, 0}, {0, 0, 0, 1}, {0, 1, 0, 1}};
	for (int d = 0; d < 6; d++) {
		n.comparison_direction = (char *)dirs[d];
		run(OP_COMPARE, &n, &sp, r, &s, a, &s, b);
		assert_memory_equal(r, want[d], 4); /* NaN: only NE holds */
	}
	struct kernel_call k = {
	    .op = OP_SELECT, .node = &n, .out_shape = &s, .out = o, .num_in = 3};
	uint8_t p[] = {1, 0, 0, 1};
	k.in_shapes[0] = &sp, k.in_shapes[1] = &s, k.in_shapes[2] = &s;
	k.in[0] = p, k.in[1] = a, k.in[2] = b;
	struct status st;
	assert_int_equal(kernel_run(&k, &st), ST_OK);
	assert_true(o[0] == 1 && o[1] == 2 && isnan(o[2]) && o[3] == 4);
	/* [3] broadcast into [2,3] along dimension 1: rows repeat; along 0 of [3,2]: columns */
	struct shape v = mk(DT_F32, 3, 0, 1), m23 = mk(DT_F32, 2, 3, 2), m32 = mk(DT_F32, 3, 2, 2);
	float x[] = {1, 2, 3}, y[6];
	int64_t one = 1, zero = 0;
	n.dimensions = &one;
	n.n_dimensions = 1;
	run(OP_BROADCAST, &n, &m23, y, &v, x, NULL, NULL);
	float w1[] = {1, 2, 3, 1, 2, 3};
	assert_memory_equal(y, w1, sizeof(w1));
	n.dimensions = &zero;
	run(OP_BROADCAST, &n, &m32, y, &v, x, NULL, NULL);
	float w0[] = {1, 1, 2, 2, 3, 3};
	assert_memory_equal(y, w0, sizeof(w0));
	struct shape scalar = mk(DT_F32, 0, 0, 0);
	float seven = 7;
	n.n_dimensions = 0;
	run(OP_BROADCAST, &n, &m23, y, &scalar, &seven, NULL, NULL);
	assert_true(y[0] == 7 && y[5] == 7);
}

static void test_dynamic_slices(void **state)
{
	Podemu__Node n = PODEMU__NODE__INIT;
	struct shape in = mk(DT_F32, 3, 4, 2), win = mk(DT_F32, 2, 2, 2), idx = mk(DT_S32, 0, 0, 0);
	float x[12], o[4], upd[] = {-1, -2, -3, -4}, full[12];
	for (int i = 0; i < 12; i++)
		x[i] = (float)i;
	int32_t r1 = 1, c2 = 2, big = 9, neg = -3;
	struct kernel_call k = {.op = OP_DYNAMIC_SLICE, .node = &n, .out_shape = &win, .out = o};
	k.num_in = 3;
	k.in_shapes[0] = &in, k.in_shapes[1] = &idx, k.in_shapes[2] = &idx;
	k.in[0] = x, k.in[1] = &r1, k.in[2] = &c2;
	struct status st;
	assert_int_equal(kernel_run(&k, &st), ST_OK);
	float want[] = {6, 7, 10, 11};
	assert_memory_equal(o, want, sizeof(want));
	k.in[1] = &big, k.in[2] = &neg; /* clamped to (1, 0) */
	assert_int_equal(kernel_run(&k, &st), ST_OK);
	float want_clamped[] = {4, 5, 8, 9};
	assert_memory_equal(o, want_clamped, sizeof(want_clamped));
	k = (struct kernel_call){
	    .op = OP_DYNAMIC_UPDATE_SLICE, .node = &n, .out_shape = &in, .out = full, .num_in = 4};
	k.in_shapes[0] = &in, k.in_shapes[1] = &win, k.in_shapes[2] = &idx, k.in_shapes[3] = &idx;
	k.in[0] = x, k.in[1] = upd, k.in[2] = &big, k.in[3] = &c2;
	assert_int_equal(kernel_run(&k, &st), ST_OK);
	assert_true(full[0] == 0 && full[5] == 5 && full[6] == -1 && full[7] == -2 &&
	            full[10] == -3 && full[11] == -4 && full[9] == 9);
}

/* The collectives' reduction step, into a third buffer and in place, over every dtype path. */
static void test_combine(void **state)
{
	(void)state;
	enum { N = 37 }; /* not a multiple of any vector width */
	float a[N], b[N], d[N];
	for (int i = 0; i < N; i++)
		a[i] = (float)i, b[i] = 0.5f * (float)(N - i), d[i] = -1;
	kernel_combine(DT_F32, RED_ADD, d, a, b, sizeof a);
	for (int i = 0; i < N; i++)
		assert_true(d[i] == (float)i + 0.5f * (float)(N - i) && a[i] == (float)i);
	kernel_combine(DT_F32, RED_MULTIPLY, a, a, b, sizeof a); /* in place */
	for (int i = 0; i < N; i++)
		assert_true(a[i] == (float)i * 0.5f * (float)(N - i));

	float x[3] = {NAN, 1, 5}, y[3] = {2, NAN, 3}, m[3];
	kernel_combine(DT_F32, RED_MAX, m, x, y, sizeof x);
	assert_true(isnan(m[0]) && isnan(m[1]) && m[2] == 5);
	kernel_combine(DT_F32, RED_MIN, x, x, y, sizeof x);
	assert_true(isnan(x[0]) && isnan(x[1]) && x[2] == 3);

	uint16_t p[2] = {dtype_f32_to_bf16(1.5f), dtype_f32_to_bf16(-2)};
	uint16_t q[2] = {dtype_f32_to_bf16(0.25f), dtype_f32_to_bf16(8)}, r[2];
	kernel_combine(DT_BF16, RED_ADD, r, p, q, sizeof p);
	assert_true(dtype_bf16_to_f32(r[0]) == 1.75f && dtype_bf16_to_f32(r[1]) == 6);

	int32_t s[2] = {INT32_MAX, -7}, t[2] = {1, 3};
	kernel_combine(DT_S32, RED_ADD, s, s, t, sizeof s);
	assert_true(s[0] == INT32_MIN && s[1] == -4); /* wraps */
	uint8_t u[3] = {1, 0, 2}, v[3] = {0, 0, 1}, w[3];
	kernel_combine(DT_PRED, RED_OR, w, u, v, sizeof u);
	assert_true(w[0] == 1 && w[1] == 0 && w[2] == 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_elementwise),
	    cmocka_unit_test(test_convert_and_bf16),
	    cmocka_unit_test(test_fill_iota_pad_slice_concat_reduce),
	    cmocka_unit_test(test_negate_transpose_dot),
	    cmocka_unit_test(test_divide_logic_unary),
	    cmocka_unit_test(test_compare_select_broadcast),
	    cmocka_unit_test(test_dynamic_slices),
	    cmocka_unit_test(test_combine),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
