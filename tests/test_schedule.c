/*
 * The scheduling passes on step graphs, through the compiler's one pipeline (plan_graph):
 * combining, memory-aware delaying, barriers as hard constraints.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "graph.h"
#include "graph_builder.h"
#include "plan.h"
#include "schedule.h"
#include "topology.h"

static struct shape shapes[256];

static Podemu__Node *param(struct gb *b, int64_t elements, uint64_t handle)
{
	Podemu__Node *n = gb_node(b, "parameter", -1, -1, -1);
	n->shape = gb_shape(b, DT_F32, &elements, 1);
	n->handle = handle;
	return n;
}

static Podemu__Node *all_gather(struct gb *b, int operand)
{
	int64_t zero = 0;
	Podemu__Node *n = gb_node(b, "all-gather", operand, -1, -1);
	gb_dims(b, n, &zero, 1);
	return n;
}

/* What the pipeline makes of b's graph on a pod of `world` cores (fusion off). */
static struct compiled compile(struct gb *b, int world, int64_t combine, bool memory_aware)
{
	struct status st;
	struct topology topo;
	assert_int_equal(topology_custom(&topo, 1, world, (int64_t)1 << 30, &st), ST_OK);
	struct plan_options o = {.topology = &topo,
	                         .combine_threshold_bytes = combine,
	                         .memory_aware = memory_aware,
	                         .chunk_bytes = 4 << 20};
	struct compiled c;
	int rv = plan_graph(&c, b->a, &b->g, shapes, &o, &st);
	if (rv != ST_OK)
		fail_msg("%s", st.message);
	/* Still a valid graph in its new order. */
	if (c.order != NULL) {
		struct shape copy[256], checked[256];
		memcpy(copy, shapes, sizeof(copy));
		struct schedule s = {.n = c.n, .order = c.order};
		const Podemu__Graph *g = schedule_apply(&b->g, &s, copy, b->a);
		assert_non_null(g);
		assert_int_equal(graph_check(g, world, checked, b->a, &st), ST_OK);
	}
	return c;
}

static void assert_order(const struct compiled *c, const int *want, int n)
{
	for (int k = 0; k < n; k++)
		assert_int_equal(c->order != NULL ? c->order[k] : k, want[k]);
}

/*
 * FSDP's forward: gather layer 1's parameters, use them, gather layer 2's, use them. The
 * gathers only read parameters, so the combiner merges them: both full layers are live at once.
 */
static void build_two_layers(struct gb *b, bool barrier)
{
	gb_init(b);
	param(b, 1024, 1);                                  /* 0: layer 1 shard, 4 KiB */
	param(b, 1024, 2);                                  /* 1: layer 2 shard */
	all_gather(b, 0);                                   /* 2: 16 KiB on 4 cores */
	Podemu__Node *h = gb_node(b, "convert", 2, -1, -1); /* 3: bf16, 8 KiB */
	h->shape = gb_shape(b, DT_BF16, NULL, 0);
	int x = 3, w2 = 1;
	if (barrier) {
		gb_node(b, "opt-barrier", 3, 1, -1);                         /* 4 */
		gb_node(b, "get-tuple-element", 4, -1, -1)->tuple_index = 0; /* 5 */
		gb_node(b, "get-tuple-element", 4, -1, -1)->tuple_index = 1; /* 6 */
		x = 5, w2 = 6;
	}
	int ag2 = (int)b->g.n_nodes;
	all_gather(b, w2);
	gb_node(b, "convert", ag2, -1, -1)->shape = gb_shape(b, DT_BF16, NULL, 0);
	int32_t outs[] = {(int32_t)x, (int32_t)b->g.n_nodes - 1};
	gb_outputs(b, outs, 2);
}

static void test_combining_merges_independent_all_gathers(void **state)
{
	struct gb b;
	struct status st;
	build_two_layers(&b, false);
	assert_int_equal(graph_check(&b.g, 4, shapes, b.a, &st), ST_OK);
	struct compiled c = compile(&b, 4, 30 << 20, false);
	assert_int_equal(c.n_combined, 1);
	int want[] = {0, 1, 2, 4, 3, 5};
	assert_order(&c, want, 6);
	/*
	 * Combined: both gathered layers at once. Without combining: one at a time. The two
	 * outputs are a tuple whose index table (256 bytes aligned) lives throughout.
	 */
	assert_int_equal(c.plan.temp_bytes, 2 * 16384 + 256);
	assert_int_equal(compile(&b, 4, 0, false).plan.temp_bytes, 16384 + 256);

	/* Below the threshold only. */
	c = compile(&b, 4, 16384 + 16383, false);
	assert_int_equal(c.n_combined, 0);
	assert_null(c.order);
	arena_free(b.a);

	/* A parameter first used after the leader (the library adds it then) moves up too. */
	gb_init(&b);
	param(&b, 1024, 1);                /* 0 */
	all_gather(&b, 0);                 /* 1 */
	gb_node(&b, "add", 1, 1, -1);      /* 2 */
	param(&b, 1024, 2);                /* 3 */
	all_gather(&b, 3);                 /* 4 */
	gb_node(&b, "multiply", 4, 2, -1); /* 5 */
	int32_t out5[] = {5};
	gb_outputs(&b, out5, 1);
	assert_int_equal(graph_check(&b.g, 4, shapes, b.a, &st), ST_OK);
	c = compile(&b, 4, 30 << 20, false);
	assert_int_equal(c.n_combined, 1);
	int want_hoisted[] = {0, 3, 1, 4, 2, 5};
	assert_order(&c, want_hoisted, 6);
	/* 2 works in place in 1's bytes; 5, the output, in 4's (4 is computed into it). */
	assert_int_equal(c.plan.temp_bytes, 16384);
	arena_free(b.a);

	/* An opt-barrier between them keeps them apart. */
	build_two_layers(&b, true);
	assert_int_equal(graph_check(&b.g, 4, shapes, b.a, &st), ST_OK);
	c = compile(&b, 4, 30 << 20, false);
	assert_int_equal(c.n_combined, 0);
	assert_null(c.order);
	arena_free(b.a);
}

static void test_combining_needs_operands_ready_and_same_attributes(void **state)
{
	struct gb b;
	struct status st;
	gb_init(&b);
	param(&b, 1024, 1);                      /* 0 */
	all_gather(&b, 0);                       /* 1 */
	gb_node(&b, "add", 0, 0, -1);            /* 2: computed after the first gather */
	all_gather(&b, 2);                       /* 3: its operand is not ready at 1 */
	gb_node(&b, "all-reduce", 0, -1, -1);    /* 4: another kind */
	Podemu__Node *other = all_gather(&b, 0); /* 5: other groups */
	Podemu__ReplicaGroup g0 = PODEMU__REPLICA_GROUP__INIT, g1 = PODEMU__REPLICA_GROUP__INIT;
	int64_t ids0[] = {0, 1}, ids1[] = {2, 3};
	g0.replica_ids = ids0, g0.n_replica_ids = 2;
	g1.replica_ids = ids1, g1.n_replica_ids = 2;
	Podemu__ReplicaGroup *groups[] = {&g0, &g1};
	other->replica_groups = groups;
	other->n_replica_groups = 2;
	int32_t outs[] = {1, 3, 4, 5};
	gb_outputs(&b, outs, 4);
	assert_int_equal(graph_check(&b.g, 4, shapes, b.a, &st), ST_OK);
	assert_int_equal(compile(&b, 4, 30 << 20, false).n_combined, 0);
	/* The same groups as the nearest one (3, whose operand exists by then): joins it. */
	other->n_replica_groups = 0;
	assert_int_equal(graph_check(&b.g, 4, shapes, b.a, &st), ST_OK);
	struct compiled c = compile(&b, 4, 30 << 20, false);
	assert_int_equal(c.n_combined, 1);
	int want[] = {0, 1, 2, 3, 5, 4};
	assert_order(&c, want, 6);
	arena_free(b.a);
}

/* A value of `elements` f32 computed from nothing (an iota), so that it may move. */
static void iota(struct gb *b, int64_t elements)
{
	int64_t zero = 0;
	Podemu__Node *n = gb_node(b, "iota", -1, -1, -1);
	n->shape = gb_shape(b, DT_F32, &elements, 1);
	gb_dims(b, n, &zero, 1);
}

/* A reshape of node x, of `elements` values, to [64, elements / 64]. */
static void reshape(struct gb *b, int x, int64_t elements)
{
	int64_t dims[2] = {64, elements / 64};
	Podemu__Node *n = gb_node(b, "reshape", x, -1, -1);
	gb_dims(b, n, dims, 2);
}

static void test_memory_aware_delays_what_is_consumed_late(void **state)
{
	struct gb b;
	struct status st;
	int64_t big = 4096, small = 1024; /* 16 KiB, 4 KiB */
	gb_init(&b);
	param(&b, big, 1);                 /* 0 */
	iota(&b, big);                     /* 1 */
	gb_node(&b, "add", 0, 0, -1);      /* 2 */
	gb_node(&b, "multiply", 2, 0, -1); /* 3 */
	reshape(&b, 3, big);               /* 4: outputs, not elementwise: nothing works */
	reshape(&b, 1, big);               /* 5: in place in them */
	int32_t outs[] = {4, 5};
	gb_outputs(&b, outs, 2);
	assert_int_equal(graph_check(&b.g, 1, shapes, b.a, &st), ST_OK);
	struct compiled c = compile(&b, 1, 0, true);
	/* The iota moves down to its reshape: it no longer sits beside 2 and 3. */
	assert_int_equal(c.n_delayed, 1);
	int want[] = {0, 2, 3, 4, 1, 5};
	assert_order(&c, want, 6);
	/*
	 * 3 works in place in 2's bytes: the iota beside them, or not (and the outputs' table). The
	 * outputs are reshapes, which copy: nothing is computed into them in place.
	 */
	assert_int_equal(compile(&b, 1, 0, false).plan.temp_bytes, 2 * 16384 + 256);
	assert_int_equal(c.plan.temp_bytes, 16384 + 256);
	arena_free(b.a);

	/* A chain moves as a whole: the sum of two iotas too. */
	gb_init(&b);
	param(&b, big, 1);                 /* 0 */
	iota(&b, small);                   /* 1 */
	gb_node(&b, "negate", 1, -1, -1);  /* 2 */
	gb_node(&b, "add", 0, 0, -1);      /* 3 */
	gb_node(&b, "multiply", 3, 0, -1); /* 4 */
	reshape(&b, 4, big);               /* 5 */
	reshape(&b, 2, small);             /* 6 */
	int32_t outs2[] = {5, 6};
	gb_outputs(&b, outs2, 2);
	assert_int_equal(graph_check(&b.g, 1, shapes, b.a, &st), ST_OK);
	c = compile(&b, 1, 0, true);
	assert_int_equal(c.n_delayed, 2);
	int want_chain[] = {0, 3, 4, 5, 1, 2, 6};
	assert_order(&c, want_chain, 7);
	assert_true(c.plan.temp_bytes < compile(&b, 1, 0, false).plan.temp_bytes);
	arena_free(b.a);

	/* A move that lowers no peak is not made. */
	gb_init(&b);
	param(&b, big, 1);                 /* 0 */
	gb_node(&b, "add", 0, 0, -1);      /* 1 */
	gb_node(&b, "negate", 1, -1, -1);  /* 2: delaying it would keep 1 alive */
	gb_node(&b, "multiply", 0, 0, -1); /* 3 */
	gb_node(&b, "add", 2, 3, -1);      /* 4 */
	int32_t out[] = {4};
	gb_outputs(&b, out, 1);
	assert_int_equal(graph_check(&b.g, 1, shapes, b.a, &st), ST_OK);
	/* 1 and 2 could run after 3, but 3 would then be live beside them: no lower peak. */
	c = compile(&b, 1, 0, true);
	assert_int_equal(c.n_delayed, 0);
	assert_null(c.order);
	arena_free(b.a);

	/* Nothing moves across an opt-barrier. */
	gb_init(&b);
	param(&b, small, 1);                         /* 0 */
	iota(&b, big);                               /* 1 */
	gb_node(&b, "add", 0, 0, -1);                /* 2 */
	gb_node(&b, "opt-barrier", 2, -1, -1);       /* 3 */
	gb_node(&b, "get-tuple-element", 3, -1, -1); /* 4 */
	gb_node(&b, "negate", 1, -1, -1);            /* 5 */
	int32_t out3[] = {4, 5};
	gb_outputs(&b, out3, 2);
	assert_int_equal(graph_check(&b.g, 1, shapes, b.a, &st), ST_OK);
	c = compile(&b, 1, 0, true);
	assert_int_equal(c.n_delayed, 0);
	assert_null(c.order);
	arena_free(b.a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_combining_merges_independent_all_gathers),
	    cmocka_unit_test(test_combining_needs_operands_ready_and_same_attributes),
	    cmocka_unit_test(test_memory_aware_delays_what_is_consumed_late),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
