/* Elementwise fusion: which nodes fuse, what the agent accepts, what it saves in the plan. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "fusion.h"
#include "graph.h"
#include "graph_builder.h"
#include "plan.h"
#include "topology.h"

static struct shape shapes[256];

/* The pipeline on b's graph for one core, in the recorded order; fused_into as decided. */
static struct compiled compile(struct gb *b, bool fusion)
{
	struct status st;
	struct topology topo;
	assert_int_equal(topology_custom(&topo, 1, 1, (int64_t)1 << 30, &st), ST_OK);
	struct plan_options o = {.topology = &topo, .fusion = fusion, .chunk_bytes = 4 << 20};
	struct compiled c;
	int rv = plan_graph(&c, b->a, &b->g, shapes, &o, &st);
	if (rv != ST_OK)
		fail_msg("%s", st.message);
	assert_null(c.order);
	return c;
}

static const int zeros[256]; /* every node of the entry: operands are entry ids */

static void check_ops(struct gb *b, enum opcode *ops)
{
	for (size_t i = 0; i < b->g.n_nodes; i++)
		ops[i] = opcode_parse(b->g.nodes[i]->opcode);
}

static void test_chains_fuse_into_their_last_op(void **state)
{
	struct gb b;
	struct status st;
	gb_init(&b);
	int64_t d[] = {64, 128}; /* 32 KiB in f32 */
	Podemu__Node *p = gb_node(&b, "parameter", -1, -1, -1);
	p->shape = gb_shape(&b, DT_F32, d, 2);
	p->handle = 1;
	gb_node(&b, "constant", -1, -1, -1)->shape = gb_shape(&b, DT_F32, d, 2); /* 1 */
	gb_node(&b, "multiply", 0, 1, -1);                                       /* 2 */
	gb_node(&b, "exponential", 2, -1, -1);                                   /* 3 */
	gb_node(&b, "add", 3, 0, -1);                                            /* 4 */
	gb_node(&b, "compare", 4, 0, -1)->comparison_direction = "GT";           /* 5 */
	gb_node(&b, "select", 5, 4, 0);                                          /* 6 */
	int64_t rows[] = {0};
	gb_dims(&b, gb_node(&b, "reduce", 6, -1, -1), rows, 1); /* 7: not elementwise */
	int32_t outs[] = {7};
	gb_outputs(&b, outs, 1);
	assert_int_equal(graph_check(&b.g, 1, shapes, b.a, &st), ST_OK);
	/* 1, 2, 3 fuse into 4; 4 has two consumers (5 and 6) and 5 feeds 6: 5 fuses into 6. */
	struct compiled with = compile(&b, true), without = compile(&b, false);
	assert_int_equal(with.n_fused, 4);
	int want[] = {-1, 4, 4, 4, -1, 6, -1, -1};
	int fused[16];
	memcpy(fused, with.fused_into, sizeof(want));
	assert_memory_equal(fused, want, sizeof(want));
	enum opcode ops[16];
	check_ops(&b, ops);
	assert_int_equal(fusion_check(b.g.nodes, zeros, b.g.n_nodes, shapes, ops, fused, 8, &st),
	                 ST_OK);

	/*
	 * The plan: fused nodes have no buffer. Unfused, at the select the constant (live
	 * throughout), 4, the mask 5 and 6 are live; fused, the constant and the mask are tiles
	 * inside the kernels.
	 */
	assert_int_equal(with.plan.buffers[2]->kind, PODEMU__BUFFER_KIND__BUFFER_FUSED);
	assert_null(without.fused_into);
	assert_int_equal(without.plan.temp_bytes, 3 * 32768 + 8192);
	assert_int_equal(with.plan.temp_bytes, 2 * 32768);

	/* What an agent refuses: a fused value read by another node, a fusion into a non-root. */
	fused[4] = -1, fused[3] = 6;
	assert_int_equal(fusion_check(b.g.nodes, zeros, b.g.n_nodes, shapes, ops, fused, 8, &st),
	                 ST_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "node 3 reads node 2, which is fused into node 4"));
	fused[3] = 7;
	assert_int_equal(fusion_check(b.g.nodes, zeros, b.g.n_nodes, shapes, ops, fused, 8, &st),
	                 ST_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "node 3 (exponential) cannot be fused into node 7"));
	assert_int_equal(fusion_check(b.g.nodes, zeros, b.g.n_nodes, shapes, ops, fused, 3, &st),
	                 ST_INVALID_ARGUMENT);
	arena_free(b.a);
}

static void test_outputs_barriers_and_sizes_stop_fusion(void **state)
{
	struct gb b;
	struct status st;
	gb_init(&b);
	int64_t d[] = {256}, half[] = {128};
	gb_node(&b, "constant", -1, -1, -1)->shape = gb_shape(&b, DT_F32, d, 1);    /* 0 */
	gb_node(&b, "negate", 0, -1, -1);                                           /* 1: held */
	gb_node(&b, "abs", 1, -1, -1);                                              /* 2 */
	gb_node(&b, "opt-barrier", 2, -1, -1);                                      /* 3 */
	gb_node(&b, "get-tuple-element", 3, -1, -1);                                /* 4 */
	gb_node(&b, "tanh", 4, -1, -1);                                             /* 5 */
	gb_node(&b, "constant", -1, -1, -1)->shape = gb_shape(&b, DT_F32, d, 1);    /* 6 */
	gb_node(&b, "sqrt", 6, -1, -1);                                             /* 7 */
	gb_node(&b, "constant", -1, -1, -1)->shape = gb_shape(&b, DT_F32, half, 1); /* 8 */
	int64_t sizes[] = {128};
	Podemu__Node *r = gb_node(&b, "reshape", 8, -1, -1); /* 9 */
	gb_dims(&b, r, sizes, 1);
	int32_t outs[] = {1, 5, 7, 9};
	gb_outputs(&b, outs, 4);
	assert_int_equal(graph_check(&b.g, 1, shapes, b.a, &st), ST_OK);
	/* 0 into 1 only: 1 is held, 2 is fed by a held value but stops at the barrier (3 is no
	 * elementwise root), 5 after the barrier has only a gte operand, 6 into 7, 8 feeds a
	 * reshape. */
	struct compiled c = compile(&b, true);
	assert_int_equal(c.n_fused, 2);
	int want[] = {1, -1, -1, -1, -1, -1, 7, -1, -1, -1};
	int fused[16];
	memcpy(fused, c.fused_into, sizeof(want));
	assert_memory_equal(fused, want, sizeof(want));
	arena_free(b.a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_chains_fuse_into_their_last_op),
	    cmocka_unit_test(test_outputs_barriers_and_sizes_stop_fusion),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
