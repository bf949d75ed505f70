/* The scheduling passes: combining, memory-aware delaying, barriers as hard constraints. */
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

/* Temporaries the step reserves when run in s's order (NULL: as recorded). */
static int64_t temp_bytes(struct gb *b, const struct schedule *s)
{
	struct status st;
	struct shape copy[256];
	memcpy(copy, shapes, sizeof(copy));
	const Podemu__Graph *g = s ? schedule_apply(&b->g, s, copy, b->a) : &b->g;
	assert_non_null(g);
	struct shape checked[256];
	assert_int_equal(graph_check(g, 4, checked, &st), ST_OK); /* still a valid graph */
	uint64_t handles[8] = {101, 102, 103, 104, 105, 106, 107, 108};
	struct plan p;
	assert_int_equal(plan_step(&p, b->a, g, copy, handles, NULL, NULL, &st), ST_OK);
	return p.temp_bytes;
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
	struct schedule s;
	build_two_layers(&b, false);
	assert_int_equal(graph_check(&b.g, 4, shapes, &st), ST_OK);
	struct schedule_options o = {.combine_threshold_bytes = 30 << 20};
	assert_int_equal(schedule_step(&s, &b.g, shapes, &o, b.a, &st), ST_OK);
	assert_int_equal(s.n_combined, 1);
	int want[] = {0, 1, 2, 4, 3, 5};
	assert_memory_equal(s.order, want, sizeof(want));
	/* Recorded: one gathered layer at a time. Combined: both at once. */
	assert_int_equal(temp_bytes(&b, NULL), 16384);
	assert_int_equal(temp_bytes(&b, &s), 2 * 16384);

	/* Below the threshold only. */
	o.combine_threshold_bytes = 16384 + 16383;
	assert_int_equal(schedule_step(&s, &b.g, shapes, &o, b.a, &st), ST_OK);
	assert_int_equal(s.n_combined, 0);
	assert_true(schedule_is_identity(&s));
	arena_free(b.a);

	/* A parameter first used after the leader (the library adds it then) moves up too. */
	o.combine_threshold_bytes = 30 << 20;
	gb_init(&b);
	param(&b, 1024, 1);                /* 0 */
	all_gather(&b, 0);                 /* 1 */
	gb_node(&b, "add", 1, 1, -1);      /* 2 */
	param(&b, 1024, 2);                /* 3 */
	all_gather(&b, 3);                 /* 4 */
	gb_node(&b, "multiply", 4, 2, -1); /* 5 */
	int32_t out5[] = {5};
	gb_outputs(&b, out5, 1);
	assert_int_equal(graph_check(&b.g, 4, shapes, &st), ST_OK);
	assert_int_equal(schedule_step(&s, &b.g, shapes, &o, b.a, &st), ST_OK);
	assert_int_equal(s.n_combined, 1);
	int want_hoisted[] = {0, 3, 1, 4, 2, 5};
	assert_memory_equal(s.order, want_hoisted, sizeof(want_hoisted));
	assert_int_equal(temp_bytes(&b, &s), 2 * 16384); /* 2 works in place in 1's bytes */
	arena_free(b.a);

	/* An opt-barrier between them keeps them apart. */
	build_two_layers(&b, true);
	assert_int_equal(graph_check(&b.g, 4, shapes, &st), ST_OK);
	o.combine_threshold_bytes = 30 << 20;
	assert_int_equal(schedule_step(&s, &b.g, shapes, &o, b.a, &st), ST_OK);
	assert_int_equal(s.n_combined, 0);
	assert_true(schedule_is_identity(&s));
	arena_free(b.a);
}

static void test_combining_needs_operands_ready_and_same_attributes(void **state)
{
	struct gb b;
	struct status st;
	struct schedule s;
	struct schedule_options o = {.combine_threshold_bytes = 30 << 20};
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
	assert_int_equal(graph_check(&b.g, 4, shapes, &st), ST_OK);
	assert_int_equal(schedule_step(&s, &b.g, shapes, &o, b.a, &st), ST_OK);
	assert_int_equal(s.n_combined, 0);
	/* The same groups as the nearest one (3, whose operand exists by then): joins it. */
	other->n_replica_groups = 0;
	assert_int_equal(graph_check(&b.g, 4, shapes, &st), ST_OK);
	assert_int_equal(schedule_step(&s, &b.g, shapes, &o, b.a, &st), ST_OK);
	assert_int_equal(s.n_combined, 1);
	int want[] = {0, 1, 2, 3, 5, 4};
	assert_memory_equal(s.order, want, sizeof(want));
	arena_free(b.a);
}

static void test_memory_aware_delays_what_is_consumed_late(void **state)
{
	struct gb b;
	struct status st;
	struct schedule s;
	struct schedule_options o = {.memory_aware = true};
	int64_t big = 4096, small = 1024; /* 16 KiB, 4 KiB */
	gb_init(&b);
	param(&b, big, 1);                                                          /* 0 */
	gb_node(&b, "constant", -1, -1, -1)->shape = gb_shape(&b, DT_F32, &big, 1); /* 1 */
	gb_node(&b, "add", 0, 0, -1);                                               /* 2 */
	gb_node(&b, "multiply", 2, 0, -1);                                          /* 3 */
	gb_node(&b, "add", 3, 0, -1);                                               /* 4 */
	gb_node(&b, "negate", 1, -1, -1);                                           /* 5 */
	int32_t outs[] = {4, 5};
	gb_outputs(&b, outs, 2);
	assert_int_equal(graph_check(&b.g, 1, shapes, &st), ST_OK);
	assert_int_equal(schedule_step(&s, &b.g, shapes, &o, b.a, &st), ST_OK);
	/* The constant moves down to the negate: it no longer sits beside 2 and 3. */
	assert_int_equal(s.n_delayed, 1);
	int want[] = {0, 2, 3, 4, 1, 5};
	assert_memory_equal(s.order, want, sizeof(want));
	/* 3 works in place in 2's bytes: the constant beside them, or not. */
	assert_int_equal(temp_bytes(&b, NULL), 2 * 16384);
	assert_int_equal(temp_bytes(&b, &s), 16384);
	arena_free(b.a);

	/* A chain moves as a whole: the sum of two constants too. */
	gb_init(&b);
	param(&b, big, 1);                                                            /* 0 */
	gb_node(&b, "constant", -1, -1, -1)->shape = gb_shape(&b, DT_F32, &small, 1); /* 1 */
	gb_node(&b, "negate", 1, -1, -1);                                             /* 2 */
	gb_node(&b, "add", 0, 0, -1);                                                 /* 3 */
	gb_node(&b, "multiply", 3, 0, -1);                                            /* 4 */
	gb_node(&b, "add", 4, 0, -1);                                                 /* 5 */
	gb_node(&b, "add", 2, 2, -1);                                                 /* 6 */
	int32_t outs2[] = {5, 6};
	gb_outputs(&b, outs2, 2);
	assert_int_equal(graph_check(&b.g, 1, shapes, &st), ST_OK);
	assert_int_equal(schedule_step(&s, &b.g, shapes, &o, b.a, &st), ST_OK);
	assert_int_equal(s.n_delayed, 2);
	int want_chain[] = {0, 3, 4, 5, 1, 2, 6};
	assert_memory_equal(s.order, want_chain, sizeof(want_chain));
	assert_true(temp_bytes(&b, &s) < temp_bytes(&b, NULL));
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
	assert_int_equal(graph_check(&b.g, 1, shapes, &st), ST_OK);
	assert_int_equal(schedule_step(&s, &b.g, shapes, &o, b.a, &st), ST_OK);
	/* 1 and 2 could run after 3, but 3 would then be live beside them: no lower peak. */
	assert_int_equal(s.n_delayed, 0);
	assert_true(schedule_is_identity(&s));
	arena_free(b.a);

	/* Nothing moves across an opt-barrier. */
	gb_init(&b);
	param(&b, small, 1);                                                        /* 0 */
	gb_node(&b, "constant", -1, -1, -1)->shape = gb_shape(&b, DT_F32, &big, 1); /* 1 */
	gb_node(&b, "add", 0, 0, -1);                                               /* 2 */
	gb_node(&b, "opt-barrier", 2, -1, -1);                                      /* 3 */
	gb_node(&b, "get-tuple-element", 3, -1, -1);                                /* 4 */
	gb_node(&b, "negate", 1, -1, -1);                                           /* 5 */
	int32_t out3[] = {4, 5};
	gb_outputs(&b, out3, 2);
	assert_int_equal(graph_check(&b.g, 1, shapes, &st), ST_OK);
	assert_int_equal(schedule_step(&s, &b.g, shapes, &o, b.a, &st), ST_OK);
	assert_int_equal(s.n_delayed, 0);
	assert_true(schedule_is_identity(&s));
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
