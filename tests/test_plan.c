/* Buffer planning: kinds, liveness sharing of temporaries, barriers, outputs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "graph.h"
#include "graph_builder.h"
#include "from_graph.h"
#include "layout.h"
#include "lower.h"
#include "topology.h"
#include "plan.h"
#include "topology.h"

#define KIND(p, i) ((p).buffers[i]->kind)

static struct shape shapes[256];
static int world = 1;
static bool tiled; /* TPU layouts (the tests plan unpadded bytes unless they say) */

/* The pipeline's plan for b's graph in the recorded order, without fusion. */
static int plan(struct plan *out, struct gb *b, const uint64_t *handles, struct status *st)
{
	struct topology topo;
	assert_int_equal(topology_custom(&topo, 1, world, (int64_t)64 << 30, st), ST_OK);
	struct plan_options o = {.topology = &topo, .chunk_bytes = 4 << 20, .tiled = tiled};
	struct compiled c;
	int rv = plan_graph(&c, b->a, &b->g, shapes, &o, st);
	if (rv == ST_OK)
		rv = plan_bind(out, b->a, &c, &b->g, handles, st);
	return rv;
}

/* A value computed from nothing (an iota of f32), which may live anywhere. */
static Podemu__Node *iota(struct gb *b, const int64_t *dims, int rank)
{
	int64_t zero = 0;
	Podemu__Node *n = gb_node(b, "iota", -1, -1, -1);
	n->shape = gb_shape(b, DT_F32, dims, rank);
	gb_dims(b, n, &zero, 1);
	return n;
}

static void test_temporaries_share_bytes_when_lifetimes_do_not_overlap(void **state)
{
	struct gb b;
	gb_init(&b);
	int64_t d[] = {32, 32}, perm[] = {1, 0}; /* 4 KiB each */
	iota(&b, d, 2);                          /* 0 temp */
	for (int i = 1; i <= 3; i++)             /* 1, 2 temp; 3 out */
		gb_dims(&b, gb_node(&b, "transpose", i - 1, -1, -1), perm, 2);
	int32_t outs[] = {3};
	gb_outputs(&b, outs, 1);
	struct status st;
	assert_int_equal(graph_check(&b.g, 1, shapes, b.a, &st), ST_OK);
	struct plan p = {0};
	uint64_t handles[] = {77};
	assert_int_equal(plan(&p, &b, handles, &st), ST_OK);
	assert_int_equal(KIND(p, 0), PODEMU__BUFFER_KIND__BUFFER_TEMP);
	assert_int_equal(KIND(p, 3), PODEMU__BUFFER_KIND__BUFFER_OUTPUT);
	assert_int_equal(p.buffers[3]->handle, 77);
	/* 0 dies at 1, 1 dies at 2: at most two temporaries are live at once. */
	assert_int_equal(p.temp_bytes, 2 * 4096);
	assert_int_equal(p.output_bytes, 4096);
	assert_int_not_equal(p.buffers[1]->offset, p.buffers[0]->offset);
	assert_int_not_equal(p.buffers[2]->offset, p.buffers[1]->offset);
	assert_int_equal(p.buffers[2]->offset, p.buffers[0]->offset);
	arena_free(b.a);
}

/* An elementwise op takes the bytes of an operand that dies there, as XLA's assignment does. */
static void test_elementwise_ops_work_in_place(void **state)
{
	struct gb b;
	gb_init(&b);
	int64_t d[] = {1024};              /* 4 KiB each */
	iota(&b, d, 1);                    /* 0 */
	gb_node(&b, "add", 0, 0, -1);      /* 1: in 0 */
	gb_node(&b, "add", 1, 1, -1);      /* 2: in 1 */
	gb_node(&b, "negate", 2, -1, -1);  /* 3 */
	gb_node(&b, "multiply", 3, 2, -1); /* 4: out */
	int32_t outs[] = {4};
	gb_outputs(&b, outs, 1);
	struct status st;
	assert_int_equal(graph_check(&b.g, 1, shapes, b.a, &st), ST_OK);
	struct plan p = {0};
	uint64_t handles[] = {78};
	assert_int_equal(plan(&p, &b, handles, &st), ST_OK);
	assert_int_equal(p.buffers[1]->offset, p.buffers[0]->offset);
	assert_int_equal(p.buffers[2]->offset, p.buffers[0]->offset);
	/*
	 * 2 is read again by 4, so 3 cannot take its bytes; 4, the output, takes 3's: 3 is
	 * computed into the output's buffer (an alias of 4), and 0 = 1 = 2 is the one temporary.
	 */
	assert_int_equal(KIND(p, 3), PODEMU__BUFFER_KIND__BUFFER_ALIAS);
	assert_int_equal(p.buffers[3]->alias_of, 4);
	assert_int_equal(KIND(p, 4), PODEMU__BUFFER_KIND__BUFFER_OUTPUT);
	assert_int_equal(p.temp_bytes, 4096);
	arena_free(b.a);
}

static void test_parameters_barriers_and_aliases(void **state)
{
	struct gb b;
	gb_init(&b);
	int64_t d[] = {64};
	Podemu__Node *param = gb_node(&b, "parameter", -1, -1, -1);
	param->shape = gb_shape(&b, DT_F32, d, 1);
	param->handle = 5;
	gb_node(&b, "add", 0, 0, -1);                /* 1 */
	gb_node(&b, "opt-barrier", 1, -1, -1);       /* 2 */
	gb_node(&b, "get-tuple-element", 2, -1, -1); /* 3 = value of 1 */
	int32_t outs[] = {3};
	gb_outputs(&b, outs, 1);
	struct status st;
	assert_int_equal(graph_check(&b.g, 1, shapes, b.a, &st), ST_OK);
	struct plan p = {0};
	uint64_t handles[] = {9};
	assert_int_equal(plan(&p, &b, handles, &st), ST_OK);
	assert_int_equal(KIND(p, 0), PODEMU__BUFFER_KIND__BUFFER_PARAMETER);
	assert_int_equal(p.buffers[0]->handle, 5);
	/* Holding the barrier's output holds the value it passes through. */
	assert_int_equal(KIND(p, 1), PODEMU__BUFFER_KIND__BUFFER_OUTPUT);
	assert_int_equal(p.buffers[1]->handle, 9);
	assert_int_equal(KIND(p, 2), PODEMU__BUFFER_KIND__BUFFER_NONE);
	assert_int_equal(KIND(p, 3), PODEMU__BUFFER_KIND__BUFFER_ALIAS);
	assert_int_equal(p.buffers[3]->alias_of, 1);
	assert_int_equal(p.temp_bytes, 0);
	assert_int_equal(p.argument_bytes, 256);
	arena_free(b.a);
}

static void test_outputs_that_are_parameters_are_refused(void **state)
{
	struct gb b;
	gb_init(&b);
	int64_t d[] = {64};
	Podemu__Node *param = gb_node(&b, "parameter", -1, -1, -1);
	param->shape = gb_shape(&b, DT_F32, d, 1);
	param->handle = 5;
	int32_t outs[] = {0};
	gb_outputs(&b, outs, 1);
	struct status st;
	assert_int_equal(graph_check(&b.g, 1, shapes, b.a, &st), ST_OK);
	struct plan p = {0};
	uint64_t handles[] = {9};
	assert_int_equal(plan(&p, &b, handles, &st), ST_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "is the parameter itself"));
	arena_free(b.a);
}

static void test_all_gather_output_is_the_only_extra_memory(void **state)
{
	/* The seed: a held all-gather of a device buffer needs its output and nothing else. */
	struct gb b;
	gb_init(&b);
	int64_t d[] = {134217728};
	Podemu__Node *param = gb_node(&b, "parameter", -1, -1, -1);
	param->shape = gb_shape(&b, DT_F32, d, 1);
	param->handle = 1;
	int64_t dim0 = 0;
	gb_dims(&b, gb_node(&b, "all-gather", 0, -1, -1), &dim0, 1);
	int32_t outs[] = {1};
	gb_outputs(&b, outs, 1);
	struct status st;
	assert_int_equal(graph_check(&b.g, 8, shapes, b.a, &st), ST_OK);
	struct plan p = {0};
	uint64_t handles[] = {2};
	world = 8;
	assert_int_equal(plan(&p, &b, handles, &st), ST_OK);
	world = 1;
	assert_int_equal(p.temp_bytes, 0);
	assert_int_equal(p.output_bytes, 4LL << 30);
	assert_int_equal(p.argument_bytes, 512LL << 20);
	arena_free(b.a);
}

/*
 * A parameter the client released with the step (a donor) becomes the output of its size
 * that is written after its last read, or by its last reader in place; not one it is still
 * read after.
 */
static void test_released_parameters_are_donated(void **state)
{
	struct gb b;
	gb_init(&b);
	int64_t d[] = {1024};
	Podemu__Node *w = gb_node(&b, "parameter", -1, -1, -1); /* 0 */
	w->shape = gb_shape(&b, DT_F32, d, 1);
	w->handle = 5;
	Podemu__Node *g = gb_node(&b, "parameter", -1, -1, -1); /* 1 */
	g->shape = gb_shape(&b, DT_F32, d, 1);
	g->handle = 6;
	gb_node(&b, "subtract", 0, 1, -1); /* 2: w - g, in place in w */
	gb_node(&b, "negate", 1, -1, -1);  /* 3: -g, written while g is read (by 4) */
	gb_node(&b, "add", 3, 1, -1);      /* 4 */
	int32_t outs[] = {2, 4};
	gb_outputs(&b, outs, 2);
	int32_t donors[] = {0, 1};
	b.g.donors = donors;
	b.g.n_donors = 2;
	struct status st;
	assert_int_equal(graph_check(&b.g, 1, shapes, b.a, &st), ST_OK);
	struct plan p = {0};
	uint64_t handles[] = {9, 10};
	assert_int_equal(plan(&p, &b, handles, &st), ST_OK);
	assert_int_equal(KIND(p, 2), PODEMU__BUFFER_KIND__BUFFER_OUTPUT);
	assert_int_equal(p.buffers[2]->donor, 1 + 0);
	/* 4 takes 3's bytes in place (3 is an alias of 4), and 3 is written before g's last read.
	 */
	assert_int_equal(p.buffers[4]->donor, 0);
	assert_int_equal(p.alias_bytes, 4096);
	assert_int_equal(p.output_bytes, 4096);
	arena_free(b.a);
}

/* Sizes from the client saturate: two f32[2^60] outputs never wrap to a negative total. */
static void test_sizes_saturate(void **state)
{
	struct gb b;
	gb_init(&b);
	int64_t d[] = {(int64_t)1 << 60};
	gb_node(&b, "constant", -1, -1, -1)->shape = gb_shape(&b, DT_F32, d, 1);
	gb_node(&b, "negate", 0, -1, -1);
	gb_node(&b, "negate", 0, -1, -1);
	int32_t outs[] = {1, 2};
	gb_outputs(&b, outs, 2);
	struct status st;
	assert_int_equal(graph_check(&b.g, 1, shapes, b.a, &st), ST_OK);
	struct plan p = {0};
	uint64_t handles[] = {1, 2};
	assert_int_equal(plan(&p, &b, handles, &st), ST_OK);
	assert_true(p.output_bytes >= LAYOUT_BYTES_CAP - HBM_ALIGNMENT);
	assert_true(p.temp_bytes >= LAYOUT_BYTES_CAP - HBM_ALIGNMENT);
	arena_free(b.a);
}

/* Layouts written for the graph's values size them; a device buffer is in HBM. */
static void test_written_layouts(void **state)
{
	(void)state;
	struct gb b;
	gb_init(&b);
	int64_t d[] = {3};
	iota(&b, d, 1)->layout = "{0:T(256)}"; /* a temporary: 1024 bytes, not 4096 */
	gb_node(&b, "negate", 0, -1, -1)->layout = "{0:T(128)S(5)}"; /* outside HBM */
	gb_node(&b, "exponential", 1, -1, -1)->layout = "{0:T(256)}";
	int32_t outs[] = {2};
	gb_outputs(&b, outs, 1);
	struct status st;
	assert_int_equal(graph_check(&b.g, 1, shapes, b.a, &st), ST_OK);
	struct plan p = {0};
	uint64_t handles[] = {7};
	tiled = true;
	assert_int_equal(plan(&p, &b, handles, &st), ST_OK);
	assert_int_equal(KIND(p, 0), PODEMU__BUFFER_KIND__BUFFER_TEMP);
	assert_int_equal(KIND(p, 1), PODEMU__BUFFER_KIND__BUFFER_OTHER_SPACE);
	assert_int_equal(KIND(p, 2), PODEMU__BUFFER_KIND__BUFFER_OUTPUT);
	assert_int_equal(p.buffers[2]->bytes, 1024);
	assert_int_equal(p.temp_bytes, 1024);
	/* A device buffer's bytes; none outside HBM; a layout that does not read. */
	int64_t bytes;
	assert_int_equal(graph_value_bytes(&bytes, &shapes[0], "{0:T(256)}", true, b.a, &st),
	                 ST_OK);
	assert_int_equal(bytes, 1024);
	assert_int_equal(graph_value_bytes(&bytes, &shapes[0], "", true, b.a, &st), ST_OK);
	assert_int_equal(bytes, 4096);
	assert_int_equal(graph_value_bytes(&bytes, &shapes[0], "{0:S(1)}", true, b.a, &st),
	                 ST_UNIMPLEMENTED);
	assert_int_equal(graph_value_bytes(&bytes, &shapes[0], "{0:T(", true, b.a, &st),
	                 ST_INVALID_ARGUMENT);
	/* An output outside HBM is refused. */
	b.nodes[2]->layout = "{0:S(1)}";
	assert_int_equal(plan(&p, &b, handles, &st), ST_UNIMPLEMENTED);
	assert_string_equal(st.message, "node 2 (exponential): an output in a memory space other "
	                                "than HBM: the pod keeps device buffers in HBM");
	tiled = false;
	arena_free(b.a);
}

/*
 * A direct all-reduce of 16 MiB over four hosts runs in four segments: five groups of phases
 * that run at once, the gather round of each segment beside the reduce round of the next, and
 * each reduce round sums in the same order (p+1 first, combined with the core's own block).
 * At 4 MiB a member's block would be under 1 MiB a segment: one segment, two groups.
 */
static void test_direct_all_reduce_runs_in_segments(void **state)
{
	(void)state;
	assert_int_equal(lower_direct_segments(4, 16 << 20), 4);
	assert_int_equal(lower_direct_segments(4, 64 << 20), 4);
	assert_int_equal(lower_direct_segments(8, 16 << 20), 2);
	assert_int_equal(lower_direct_segments(4, 4 << 20), 1);
	for (int mib = 4; mib <= 16; mib += 12) {
		struct gb b;
		gb_init(&b);
		int64_t d[] = {(int64_t)mib << 18}; /* f32: mib MiB */
		Podemu__Node *param = gb_node(&b, "parameter", -1, -1, -1);
		param->shape = gb_shape(&b, DT_F32, d, 1);
		param->handle = 1;
		gb_node(&b, "all-reduce", 0, -1, -1)->reducer = "add";
		int32_t outs[] = {1};
		gb_outputs(&b, outs, 1);
		struct status st;
		assert_int_equal(graph_check(&b.g, 4, shapes, b.a, &st), ST_OK);
		Podemu__CollectiveSchedule **s;
		size_t n;
		assert_int_equal(lower_collectives(&s, &n, b.a, &b.g, shapes, 4, 1, 2, NULL, &st),
		                 ST_OK);
		assert_int_equal(n, 1);
		assert_string_equal(s[0]->algorithm, "direct");
		int segs = mib == 16 ? 4 : 1, groups = 0;
		assert_int_equal(s[0]->n_phases, (size_t)(6 * segs));
		int64_t block = ((int64_t)mib << 20) / 4 / segs;
		for (size_t k = 0; k < s[0]->n_phases; k++) {
			const Podemu__CollPhase *ph = s[0]->phases[k];
			groups += !ph->with_next;
			assert_int_equal(ph->recv_block->row_bytes, block);
			if (ph->kind == PODEMU__PHASE_KIND__PHASE_COMBINE) /* from p+1: core 3 */
				assert_int_equal(ph->recv_peer, 3);
		}
		assert_int_equal(groups, segs + 1);
		/* The first group is the first segment's reduce round: core 2's block of it. */
		assert_int_equal(s[0]->phases[0]->kind, PODEMU__PHASE_KIND__PHASE_COMBINE);
		assert_int_equal(s[0]->phases[0]->recv_block->offset, 2 * block);
		/* The last phase gathers the last segment's block of core 3 (p-3). */
		const Podemu__CollPhase *last = s[0]->phases[s[0]->n_phases - 1];
		assert_int_equal(last->recv_peer, 3);
		assert_int_equal(last->recv_block->offset,
		                 (int64_t)(segs - 1) * 4 * block + 3 * block);
		arena_free(b.a);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_temporaries_share_bytes_when_lifetimes_do_not_overlap),
	    cmocka_unit_test(test_elementwise_ops_work_in_place),
	    cmocka_unit_test(test_parameters_barriers_and_aliases),
	    cmocka_unit_test(test_outputs_that_are_parameters_are_refused),
	    cmocka_unit_test(test_all_gather_output_is_the_only_extra_memory),
	    cmocka_unit_test(test_sizes_saturate),
	    cmocka_unit_test(test_released_parameters_are_donated),
	    cmocka_unit_test(test_written_layouts),
	    cmocka_unit_test(test_direct_all_reduce_runs_in_segments),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
