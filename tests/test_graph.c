/* Shape inference and graph validation, with XLA's error texts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "graph.h"
#include "graph_builder.h"

static struct shape shapes[256];

static int check(struct gb *b, int world, struct status *st)
{
	return graph_check(&b->g, world, shapes, b->a, st);
}

static void test_elementwise_chain(void **state)
{
	struct gb b;
	gb_init(&b);
	int64_t d[] = {4, 128};
	gb_node(&b, "constant", -1, -1, -1)->shape = gb_shape(&b, DT_F32, d, 2);
	gb_node(&b, "iota", -1, -1, -1)->shape = gb_shape(&b, DT_F32, d, 2);
	int64_t one = 1;
	gb_dims(&b, b.nodes[1], &one, 1);
	gb_node(&b, "add", 0, 1, -1);
	gb_node(&b, "maximum", 2, 0, -1);
	Podemu__Node *cv = gb_node(&b, "convert", 3, -1, -1);
	cv->shape = gb_shape(&b, DT_BF16, NULL, 0);
	struct status st;
	assert_int_equal(check(&b, 8, &st), ST_OK);
	char buf[64];
	assert_string_equal(shape_format(buf, sizeof(buf), &shapes[3]), "f32[4,128]");
	assert_string_equal(shape_format(buf, sizeof(buf), &shapes[4]), "bf16[4,128]");
	arena_free(b.a);
}

static void test_binary_mismatch_reads_like_xla(void **state)
{
	struct gb b;
	gb_init(&b);
	int64_t d4[] = {4}, d8[] = {8};
	gb_node(&b, "constant", -1, -1, -1)->shape = gb_shape(&b, DT_F32, d4, 1);
	gb_node(&b, "constant", -1, -1, -1)->shape = gb_shape(&b, DT_F32, d8, 1);
	gb_node(&b, "add", 0, 1, -1);
	struct status st;
	assert_int_equal(check(&b, 8, &st), ST_INVALID_ARGUMENT);
	assert_string_equal(
	    st.message, "add (node 2): Binary op add with incompatible shapes: f32[4] and f32[8].");
	arena_free(b.a);
}

static void test_all_gather_shapes(void **state)
{
	struct gb b;
	gb_init(&b);
	int64_t d[] = {3, 5};
	gb_node(&b, "constant", -1, -1, -1)->shape = gb_shape(&b, DT_S32, d, 2);
	int64_t dim1 = 1, dim0 = 0, dim2 = 2;
	gb_dims(&b, gb_node(&b, "all-gather", 0, -1, -1), &dim1, 1);
	gb_dims(&b, gb_node(&b, "all-gather", 0, -1, -1), &dim0, 1);
	struct status st;
	assert_int_equal(check(&b, 6, &st), ST_OK);
	assert_int_equal(shapes[1].dims[0], 3);
	assert_int_equal(shapes[1].dims[1], 30);
	assert_int_equal(shapes[2].dims[0], 18);
	gb_dims(&b, gb_node(&b, "all-gather", 0, -1, -1), &dim2, 1);
	assert_int_equal(check(&b, 6, &st), ST_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "all_gather_dimension"));
	arena_free(b.a);
}

/* A scaled all-reduce multiplies in floating point: refused on integers, not ignored. */
static void test_all_reduce_scale_needs_floats(void **state)
{
	struct gb b;
	gb_init(&b);
	int64_t d[] = {8};
	gb_node(&b, "constant", -1, -1, -1)->shape = gb_shape(&b, DT_S32, d, 1);
	gb_node(&b, "all-reduce", 0, -1, -1)->scale = 0.5;
	struct status st;
	assert_int_equal(check(&b, 2, &st), ST_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "all-reduce scale 0.5 needs a floating-point operand"));
	assert_non_null(strstr(st.message, "not s32"));
	b.g.nodes[1]->scale = 1; /* no scale */
	assert_int_equal(check(&b, 2, &st), ST_OK);
	b.g.nodes[0]->shape = gb_shape(&b, DT_F32, d, 1);
	b.g.nodes[1]->scale = 0.5;
	assert_int_equal(check(&b, 2, &st), ST_OK);
	arena_free(b.a);
}

static void test_structural_ops(void **state)
{
	struct gb b;
	gb_init(&b);
	int64_t d[] = {4, 6};
	gb_node(&b, "constant", -1, -1, -1)->shape = gb_shape(&b, DT_F32, d, 2);
	Podemu__Node *pad = gb_node(&b, "pad", 0, -1, -1);
	int64_t lo[] = {1, -1}, hi[] = {0, 2}, in[] = {1, 0};
	pad->pad_low = gb_ints(&b, lo, 2);
	pad->pad_high = gb_ints(&b, hi, 2);
	pad->pad_interior = gb_ints(&b, in, 2);
	pad->n_pad_low = pad->n_pad_high = pad->n_pad_interior = 2;
	Podemu__Node *sl = gb_node(&b, "slice", 0, -1, -1);
	int64_t s0[] = {1, 0}, l0[] = {4, 6}, st0[] = {2, 4};
	sl->starts = gb_ints(&b, s0, 2);
	sl->limits = gb_ints(&b, l0, 2);
	sl->strides = gb_ints(&b, st0, 2);
	sl->n_starts = sl->n_limits = sl->n_strides = 2;
	int64_t c1 = 1;
	gb_dims(&b, gb_node(&b, "concatenate", 0, 0, -1), &c1, 1);
	int64_t r[] = {24};
	gb_dims(&b, gb_node(&b, "reshape", 0, -1, -1), r, 1);
	int64_t red[] = {1};
	gb_dims(&b, gb_node(&b, "reduce", 0, -1, -1), red, 1);
	struct status st;
	assert_int_equal(check(&b, 1, &st), ST_OK);
	char buf[64];
	assert_string_equal(shape_format(buf, sizeof(buf), &shapes[1]), "f32[8,7]");
	assert_string_equal(shape_format(buf, sizeof(buf), &shapes[2]), "f32[2,2]");
	assert_string_equal(shape_format(buf, sizeof(buf), &shapes[3]), "f32[4,12]");
	assert_string_equal(shape_format(buf, sizeof(buf), &shapes[4]), "f32[24]");
	assert_string_equal(shape_format(buf, sizeof(buf), &shapes[5]), "f32[4]");
	/* reduce(operand, init_value): the init is a scalar of the operand's type. */
	gb_node(&b, "constant", -1, -1, -1)->shape = gb_shape(&b, DT_F32, NULL, 0);
	gb_dims(&b, gb_node(&b, "reduce", 0, 6, -1), red, 1);
	assert_int_equal(check(&b, 1, &st), ST_OK);
	assert_string_equal(shape_format(buf, sizeof(buf), &shapes[7]), "f32[4]");
	gb_dims(&b, gb_node(&b, "reduce", 0, 5, -1), red, 1);
	assert_int_equal(check(&b, 1, &st), ST_INVALID_ARGUMENT);
	assert_string_equal(st.message, "reduce (node 8): init value must be a scalar f32, got "
	                                "f32[4]");
	b.g.n_nodes--;
	int64_t bad[] = {25};
	gb_dims(&b, gb_node(&b, "reshape", 0, -1, -1), bad, 1);
	assert_int_equal(check(&b, 1, &st), ST_INVALID_ARGUMENT);
	assert_string_equal(st.message,
	                    "reshape (node 8): Reshape operation has mismatched element counts: "
	                    "from=24 (f32[4,6]) to=25 (f32[25]).");
	arena_free(b.a);
}

static void test_barrier_and_tuple_elements(void **state)
{
	struct gb b;
	gb_init(&b);
	int64_t d[] = {2};
	gb_node(&b, "constant", -1, -1, -1)->shape = gb_shape(&b, DT_F32, d, 1);
	int64_t d3[] = {3};
	gb_node(&b, "constant", -1, -1, -1)->shape = gb_shape(&b, DT_S32, d3, 1);
	gb_node(&b, "opt-barrier", 0, 1, -1);
	gb_node(&b, "get-tuple-element", 2, -1, -1)->tuple_index = 1;
	struct status st;
	assert_int_equal(check(&b, 1, &st), ST_OK);
	assert_true(shapes[2].tuple);
	assert_int_equal(shapes[3].dtype, DT_S32);
	/* A tuple cannot feed an ordinary op. */
	gb_node(&b, "add", 2, 2, -1);
	assert_int_equal(check(&b, 1, &st), ST_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "is a tuple"));
	arena_free(b.a);
}

static void test_compare_select_broadcast_dynamic(void **state)
{
	struct gb b;
	struct status st;
	char buf[64];
	gb_init(&b);
	int64_t d[] = {3, 4}, v[] = {4}, win[] = {2, 2};
	gb_node(&b, "constant", -1, -1, -1)->shape = gb_shape(&b, DT_F32, d, 2); /* 0 */
	gb_node(&b, "constant", -1, -1, -1)->shape = gb_shape(&b, DT_F32, v, 1); /* 1 */
	gb_node(&b, "compare", 0, 0, -1)->comparison_direction = "GT";           /* 2 */
	gb_node(&b, "select", 2, 0, 0);                                          /* 3 */
	Podemu__Node *bc = gb_node(&b, "broadcast", 1, -1, -1);                  /* 4 */
	bc->shape = gb_shape(&b, DT_F32, d, 2);
	int64_t one = 1;
	gb_dims(&b, bc, &one, 1);
	gb_node(&b, "exponential", 4, -1, -1);                                      /* 5 */
	gb_node(&b, "constant", -1, -1, -1)->shape = gb_shape(&b, DT_S32, NULL, 0); /* 6 */
	gb_dims(&b, gb_node(&b, "dynamic-slice", 0, 6, 6), win, 2);                 /* 7 */
	gb_node(&b, "constant", -1, -1, -1)->shape = gb_shape(&b, DT_F32, win, 2);  /* 8 */
	Podemu__Node *dus = gb_node(&b, "dynamic-update-slice", 0, 8, 6);           /* 9 */
	dus->operands[dus->n_operands++] = 6;
	gb_node(&b, "partition-id", -1, -1, -1); /* 10 */
	assert_int_equal(check(&b, 8, &st), ST_OK);
	assert_string_equal(shape_format(buf, sizeof(buf), &shapes[2]), "pred[3,4]");
	assert_string_equal(shape_format(buf, sizeof(buf), &shapes[3]), "f32[3,4]");
	assert_string_equal(shape_format(buf, sizeof(buf), &shapes[4]), "f32[3,4]");
	assert_string_equal(shape_format(buf, sizeof(buf), &shapes[7]), "f32[2,2]");
	assert_string_equal(shape_format(buf, sizeof(buf), &shapes[9]), "f32[3,4]");
	assert_string_equal(shape_format(buf, sizeof(buf), &shapes[10]), "u32[]");

	/* Each mistake in XLA's words. */
	b.nodes[2]->comparison_direction = "BIGGER";
	assert_int_equal(check(&b, 8, &st), ST_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "Unknown comparison direction 'BIGGER'"));
	b.nodes[2]->comparison_direction = "GT";
	b.nodes[3]->operands[0] = 0;
	assert_int_equal(check(&b, 8, &st), ST_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "Select's pred operand must have PRED element type"));
	b.nodes[3]->operands[0] = 2;
	b.nodes[3]->operands[2] = 1;
	assert_int_equal(check(&b, 8, &st), ST_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "Operands to select must be the same shape; got "
	                                   "f32[3,4] and f32[4]."));
	b.nodes[3]->operands[2] = 0;
	bc->dimensions[0] = 0;
	assert_int_equal(check(&b, 8, &st), ST_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "Broadcast dimension 0 mismatch: 4 != 3."));
	bc->dimensions[0] = 1;
	b.nodes[1]->shape->dtype = PODEMU__DTYPE__DTYPE_S32;
	bc->shape->dtype = PODEMU__DTYPE__DTYPE_S32;
	assert_int_equal(check(&b, 8, &st), ST_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "Expected element type in shape to be floating or "
	                                   "complex for exponential operation; got S32."));
	b.nodes[1]->shape->dtype = PODEMU__DTYPE__DTYPE_F32;
	bc->shape->dtype = PODEMU__DTYPE__DTYPE_F32;
	b.nodes[7]->dimensions[1] = 5;
	assert_int_equal(check(&b, 8, &st), ST_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "Slice dim size 5 greater than dynamic slice "
	                                   "dimension: 4."));
	b.nodes[7]->dimensions[1] = 2;
	b.nodes[7]->operands[1] = 0;
	assert_int_equal(check(&b, 8, &st), ST_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "start indices must be scalars"));
	b.nodes[7]->operands[1] = 6;
	dus->n_operands = 3;
	assert_int_equal(check(&b, 8, &st), ST_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "Dynamic slice start number of dimensions 1 must "
	                                   "match rank 2"));
	arena_free(b.a);
}

/* A 10-trip loop over (f32[4], s32[]) state, and a call: shapes, and XLA's verifier words. */
static void test_control_flow(void **state)
{
	(void)state;
	struct gb b;
	gb_init(&b);
	int64_t four = 4;
	Podemu__Shape *elems[] = {gb_shape(&b, DT_F32, &four, 1), gb_shape(&b, DT_S32, NULL, 0)};
	Podemu__Shape *st_shape = gb_tuple(&b, elems, 2);
	int cond = gb_begin_computation(&b, "cond");
	gb_node(&b, "parameter", -1, -1, -1)->shape = st_shape;
	gb_node(&b, "get-tuple-element", 0, -1, -1)->tuple_index = 1;
	gb_node(&b, "constant", -1, -1, -1)->shape = elems[1];
	gb_node(&b, "compare", 1, 2, -1)->comparison_direction = "LT";
	gb_end_computation(&b, 3);
	int body = gb_begin_computation(&b, "body");
	gb_node(&b, "parameter", -1, -1, -1)->shape = st_shape;
	gb_node(&b, "get-tuple-element", 0, -1, -1)->tuple_index = 0;
	gb_node(&b, "get-tuple-element", 0, -1, -1)->tuple_index = 1;
	gb_node(&b, "negate", 1, -1, -1);
	gb_node(&b, "constant", -1, -1, -1)->shape = elems[1];
	gb_node(&b, "add", 2, 4, -1);
	gb_node(&b, "tuple", 3, 5, -1);
	gb_end_computation(&b, 6);
	gb_node(&b, "constant", -1, -1, -1)->shape = elems[0];
	gb_node(&b, "constant", -1, -1, -1)->shape = elems[1];
	gb_node(&b, "tuple", 0, 1, -1);
	int32_t calls[] = {cond, body};
	gb_called(&b, gb_node(&b, "while", 2, -1, -1), calls, 2);
	gb_node(&b, "get-tuple-element", 3, -1, -1)->tuple_index = 0;
	int32_t outs[] = {4};
	gb_outputs(&b, outs, 1);
	struct status st;
	assert_int_equal(check(&b, 1, &st), ST_OK);
	char buf[128];
	assert_string_equal(shape_format(buf, sizeof(buf), &shapes[3]), "(f32[4], s32[])");
	assert_string_equal(shape_format(buf, sizeof(buf), &shapes[4]), "f32[4]");
	assert_int_equal(graph_total_nodes(&b.g), 5 + 4 + 7);
	/* The body must return its state's shape. */
	b.comps[body]->root = 3;
	assert_int_equal(check(&b, 1, &st), ST_INVALID_ARGUMENT);
	assert_string_equal(st.message, "while (node 3): The body should have same shape as the "
	                                "init; got body f32[4], init (f32[4], s32[])");
	b.comps[body]->root = 6;
	/* The condition must return pred[]. */
	b.comps[cond]->root = 1;
	assert_int_equal(check(&b, 1, &st), ST_INVALID_ARGUMENT);
	assert_string_equal(st.message,
	                    "while (node 3): Condition computation must return bool; got: s32[]");
	b.comps[cond]->root = 3;
	/* Only computations defined before the caller. */
	int32_t later[] = {cond, 5};
	b.nodes[3]->called = later;
	assert_int_equal(check(&b, 1, &st), ST_INVALID_ARGUMENT);
	assert_string_equal(st.message, "while (node 3): calls computation 5, which is not one "
	                                "defined before it");
	b.nodes[3]->called = calls;
	/* A call with the wrong arguments. */
	int32_t callee[] = {body};
	gb_called(&b, gb_node(&b, "call", 0, -1, -1), callee, 1);
	assert_int_equal(check(&b, 1, &st), ST_INVALID_ARGUMENT);
	assert_string_equal(st.message, "call (node 5): parameter 0 of the callee body is (f32[4], "
	                                "s32[]), given f32[4]");
	arena_free(b.a);
}

static void test_bad_graphs(void **state)
{
	struct gb b;
	struct status st;
	gb_init(&b);
	int64_t d[] = {2};
	gb_node(&b, "constant", -1, -1, -1)->shape = gb_shape(&b, DT_F32, d, 1);
	gb_node(&b, "add", 0, 5, -1);
	assert_int_equal(check(&b, 1, &st), ST_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "not an earlier node"));
	arena_free(b.a);

	/* dot of [2,3] by [2,3], and a transpose that is no permutation: XLA's words. */
	gb_init(&b);
	int64_t m23[] = {2, 3};
	gb_node(&b, "constant", -1, -1, -1)->shape = gb_shape(&b, DT_F32, m23, 2);
	gb_node(&b, "dot", 0, 0, -1);
	assert_int_equal(check(&b, 1, &st), ST_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "Cannot infer shape for dot operation: f32[2,3] <dot> "
	                                   "f32[2,3]"));
	arena_free(b.a);
	gb_init(&b);
	gb_node(&b, "constant", -1, -1, -1)->shape = gb_shape(&b, DT_F32, m23, 2);
	int64_t not_perm[] = {0, 0};
	Podemu__Node *t = gb_node(&b, "transpose", 0, -1, -1);
	t->dimensions = gb_ints(&b, not_perm, 2);
	t->n_dimensions = 2;
	assert_int_equal(check(&b, 1, &st), ST_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "Transpose dimensions must be a permutation"));
	arena_free(b.a);

	gb_init(&b);
	gb_node(&b, "frobnicate", -1, -1, -1);
	assert_int_equal(check(&b, 1, &st), ST_UNIMPLEMENTED);
	assert_non_null(strstr(st.message, "unknown opcode 'frobnicate'"));
	arena_free(b.a);

	gb_init(&b);
	int64_t neg[] = {-4};
	gb_node(&b, "constant", -1, -1, -1)->shape = gb_shape(&b, DT_F32, neg, 1);
	assert_int_equal(check(&b, 1, &st), ST_INVALID_ARGUMENT);
	arena_free(b.a);

	gb_init(&b);
	Podemu__Node *c = gb_node(&b, "constant", -1, -1, -1);
	c->shape = gb_shape(&b, DT_U8, d, 1);
	c->value = 300;
	assert_int_equal(check(&b, 1, &st), ST_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "not a valid u8"));
	arena_free(b.a);

	gb_init(&b);
	gb_node(&b, "constant", -1, -1, -1)->shape = gb_shape(&b, DT_F32, d, 1);
	int32_t outs[] = {0, 0};
	gb_outputs(&b, outs, 2);
	assert_int_equal(check(&b, 1, &st), ST_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "output twice"));
	int32_t out_of_range[] = {3};
	gb_outputs(&b, out_of_range, 1);
	assert_int_equal(check(&b, 1, &st), ST_INVALID_ARGUMENT);
	arena_free(b.a);

	/* A declared shape that is itself invalid is reported as such (found by fuzz_rpc). */
	gb_init(&b);
	gb_node(&b, "constant", -1, -1, -1)->shape = gb_shape(&b, DT_F32, d, 1);
	gb_node(&b, "add", 0, 0, -1)->shape = gb_shape(&b, 99, d, 1);
	assert_int_equal(check(&b, 1, &st), ST_INVALID_ARGUMENT);
	assert_non_null(
	    strstr(st.message, "add (node 1): declared shape: invalid element type 99"));
	arena_free(b.a);

	gb_init(&b);
	gb_node(&b, "parameter", -1, -1, -1)->shape = gb_shape(&b, DT_F32, d, 1);
	assert_int_equal(check(&b, 1, &st), ST_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "no buffer handle"));
	arena_free(b.a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_elementwise_chain),
	    cmocka_unit_test(test_binary_mismatch_reads_like_xla),
	    cmocka_unit_test(test_all_gather_shapes),
	    cmocka_unit_test(test_all_reduce_scale_needs_floats),
	    cmocka_unit_test(test_structural_ops),
	    cmocka_unit_test(test_barrier_and_tuple_elements),
	    cmocka_unit_test(test_compare_select_broadcast_dynamic),
	    cmocka_unit_test(test_bad_graphs),
	    cmocka_unit_test(test_control_flow),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
