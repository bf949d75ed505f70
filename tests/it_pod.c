/*
 * End to end on a real pod (2 hosts x 2 cores, 64 MiB per core, real bytes): op values against
 * host computations, all-gather across agents, exact memory accounting, and errors that leave
 * the pod working.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "pod_fixture.h"

#define MiB ((int64_t)1 << 20)
#define WORLD 4

static int setup(void **state)
{
	/* The heap's figures below are the shapes' bytes: no TPU padding (--layout none). */
	pe_client *c =
	    pod_start("--hosts 2 --cores-per-host 2 --hbm 64M --backing host --layout none");
	if (c == NULL)
		return -1;
	*state = c;
	return 0;
}

static int teardown(void **state)
{
	pe_disconnect(*state);
	pod_stop();
	return 0;
}

static void test_ops_match_host(void **state)
{
	pe_client *c = *state;
	int64_t d[] = {2, 3};
	pe_tensor *io = pe_iota(c, PE_F32, d, 2, 1);           /* [[0,1,2],[0,1,2]] */
	pe_tensor *rid = pe_convert(pe_replica_id(c), PE_F32); /* r */
	int64_t one[] = {1, 1};
	pe_tensor *rid2 = pe_reshape(rid, one, 2);
	int64_t lo[] = {0, 0}, hi[] = {1, 2};
	pe_tensor *rpad = pe_pad(rid2, lo, hi, NULL, 0); /* [[r,0,0],[0,0,0]] */
	pe_tensor *sum = pe_add(io, rpad);
	pe_tensor *prod = pe_multiply(sum, pe_full(c, PE_F32, d, 2, 2.0));
	int64_t s0[] = {0, 1}, l0[] = {2, 3};
	pe_tensor *sl = pe_slice(prod, s0, l0, NULL); /* [[2,4],[2,4]] */
	pe_tensor *parts[] = {prod, sl};
	pe_tensor *cat = pe_concatenate(parts, 2, 1); /* [2,5] */
	int64_t red[] = {1};
	pe_tensor *rows = pe_reduce_sum(cat, red, 1);
	assert_non_null(rows);
	assert_int_equal(pe_mark_step(c), PE_OK);
	for (int r = 0; r < WORLD; r++) {
		float got_cat[10], got_rows[2];
		assert_int_equal(pe_fetch(cat, r, got_cat, sizeof(got_cat)), PE_OK);
		assert_int_equal(pe_fetch(rows, r, got_rows, sizeof(got_rows)), PE_OK);
		float want_cat[10] = {2.0f * r, 2, 4, 2, 4, 0, 2, 4, 2, 4};
		assert_memory_equal(got_cat, want_cat, sizeof(want_cat));
		assert_true(got_rows[0] == 2.0f * r + 12 && got_rows[1] == 12);
	}
	/* cat^T [5,2] x cat [2,5], negated: against the host. */
	int64_t perm[] = {1, 0};
	pe_tensor *cat_t = pe_transpose(cat, perm, 2);
	pe_tensor *gram = pe_negate(pe_dot(cat_t, cat));
	assert_non_null(gram);
	assert_int_equal(pe_mark_step(c), PE_OK);
	for (int r = 0; r < WORLD; r++) {
		float x[10] = {2.0f * r, 2, 4, 2, 4, 0, 2, 4, 2, 4}, got[25];
		assert_int_equal(pe_fetch(gram, r, got, sizeof(got)), PE_OK);
		for (int i = 0; i < 5; i++)
			for (int j = 0; j < 5; j++)
				assert_true(got[i * 5 + j] == -(x[i] * x[j] + x[5 + i] * x[5 + j]));
	}
	pe_tensor *all[] = {io, rid, rid2, rpad, sum, prod, sl, cat, rows, cat_t, gram};
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		pe_release(all[i]);
}

static void test_all_gather_moves_real_bytes_across_agents(void **state)
{
	pe_client *c = *state;
	/* Core r holds [3, 5] with values r*1000 + i; gather along dim 1 and dim 0. */
	static float data[WORLD][15];
	const void *per_core[WORLD];
	for (int r = 0; r < WORLD; r++) {
		for (int i = 0; i < 15; i++)
			data[r][i] = (float)(r * 1000 + i);
		per_core[r] = data[r];
	}
	int64_t d[] = {3, 5};
	pe_tensor *x = pe_upload(c, PE_F32, d, 2, per_core);
	assert_non_null(x);
	pe_tensor *g1 = pe_all_gather(x, 1);
	pe_tensor *g0 = pe_all_gather(x, 0);
	assert_non_null(g1);
	assert_non_null(g0);
	assert_int_equal(pe_mark_step(c), PE_OK);
	int64_t dims[PE_MAX_RANK];
	int rank;
	pe_tensor_shape(g1, NULL, dims, &rank);
	assert_int_equal(rank, 2);
	assert_int_equal(dims[0], 3);
	assert_int_equal(dims[1], 5 * WORLD);
	for (int r = 0; r < WORLD; r++) {
		float got1[3 * 5 * WORLD], got0[3 * 5 * WORLD];
		assert_int_equal(pe_fetch(g1, r, got1, sizeof(got1)), PE_OK);
		assert_int_equal(pe_fetch(g0, r, got0, sizeof(got0)), PE_OK);
		for (int row = 0; row < 3; row++)
			for (int src = 0; src < WORLD; src++)
				for (int col = 0; col < 5; col++)
					assert_true(got1[row * 5 * WORLD + src * 5 + col] ==
					            data[src][row * 5 + col]);
		for (int src = 0; src < WORLD; src++)
			assert_memory_equal(&got0[src * 15], data[src], sizeof(data[src]));
	}
	pe_release(x);
	pe_release(g1);
	pe_release(g0);
}

static void test_large_all_gather_in_chunks(void **state)
{
	pe_client *c = *state;
	/* 3 MiB + 4 bytes per core: several 4 MiB-chunk boundaries are not hit evenly. */
	int64_t n = 3 * MiB / 4 + 1;
	/* v = iota + [r, 0, 0, ...] (a padded replica id). */
	pe_tensor *io = pe_iota(c, PE_S32, &n, 1, 0);
	pe_tensor *rid = pe_convert(pe_replica_id(c), PE_S32);
	int64_t one = 1, lo = 0, hi = n - 1;
	pe_tensor *rpad = pe_pad(pe_reshape(rid, &one, 1), &lo, &hi, NULL, 0);
	pe_tensor *v = pe_add(io, rpad);
	pe_tensor *g = pe_all_gather(v, 0);
	assert_non_null(g);
	assert_int_equal(pe_mark_step(c), PE_OK);
	int32_t *got = malloc((size_t)(n * WORLD) * sizeof(int32_t));
	assert_int_equal(pe_fetch(g, 3, got, (size_t)(n * WORLD) * sizeof(int32_t)), PE_OK);
	for (int src = 0; src < WORLD; src++) {
		assert_int_equal(got[src * n], src);
		assert_int_equal(got[src * n + 1], 1);
		assert_int_equal(got[src * n + n - 1], n - 1);
	}
	free(got);
	pe_release(io);
	pe_release(rid);
	pe_release(rpad);
	pe_release(v);
	pe_release(g);
	pe_mark_step(c);
}

/*
 * "Would this fit?": a compile-only step reports the plan without running it, leaves the graph
 * pending, and the step then run peaks at exactly the planned bytes; a plan that does not fit
 * says so in XLA's words, and running it fails the same way. Runs first: peaks are cumulative.
 */
static void test_plan_step_says_whether_it_fits(void **state)
{
	pe_client *c = *state;
	int64_t n = 2 * MiB; /* 8 MiB of f32 per core, gathered into 32 MiB */
	pe_tensor *x = pe_full(c, PE_F32, &n, 1, 1.0);
	pe_tensor *y = pe_all_gather(x, 0);
	pe_release(x); /* a temporary of the step */
	pe_step_plan p;
	assert_int_equal(pe_plan_step(c, &p), PE_OK);
	assert_true(p.fits);
	assert_int_equal(p.argument_bytes, 0);
	assert_int_equal(p.output_bytes, 32 * MiB);
	/* The input, and receive slots for chunks from the other host (two of 4 MiB each). */
	assert_int_equal(p.receive_bytes, 8 * MiB);
	assert_int_equal(p.temp_bytes, 8 * MiB + p.receive_bytes);
	assert_int_equal(p.peak_bytes, 40 * MiB + p.receive_bytes);
	assert_int_equal(p.bytes_limit, 64 * MiB);
	assert_string_equal(p.oom_message, "");
	assert_int_equal(pe_mark_step(c), PE_OK);
	pe_memory_info m[WORLD];
	assert_int_equal(pe_memory_info_all(c, m, WORLD), PE_OK);
	for (int r = 0; r < WORLD; r++)
		assert_int_equal(m[r].peak_bytes_used, p.peak_bytes);
	pe_release(y);

	n = 4 * MiB; /* 16 MiB in, 64 MiB out: over the 64 MiB heap */
	x = pe_full(c, PE_F32, &n, 1, 1.0);
	y = pe_all_gather(x, 0);
	assert_int_equal(pe_plan_step(c, &p), PE_OK);
	assert_false(p.fits);
	char want[160];
	snprintf(want, sizeof(want),
	         "Ran out of memory in memory space hbm. Used %.2fM of 64.00M hbm. Exceeded hbm "
	         "capacity by %.2fM.",
	         80.0 + (double)p.receive_bytes / MiB, 16.0 + (double)p.receive_bytes / MiB);
	assert_true(p.receive_bytes > 0);
	assert_non_null(strstr(p.oom_message, want));
	assert_int_equal(pe_mark_step(c), PE_RESOURCE_EXHAUSTED);
	pe_release(x);
	pe_release(y);
}

static void test_memory_accounting_is_exact(void **state)
{
	pe_client *c = *state;
	pe_memory_info before[WORLD], after[WORLD];
	assert_int_equal(pe_memory_info_all(c, before, WORLD), PE_OK);
	int64_t n = MiB; /* 4 MiB of f32 */
	pe_tensor *x = pe_full(c, PE_F32, &n, 1, 1.0);
	assert_int_equal(pe_mark_step(c), PE_OK);
	/* y = (x + x) * x: x + x is fused into the multiply (no HBM), y a 4 MiB output. */
	pe_tensor *t = pe_add(x, x);
	pe_tensor *y = pe_multiply(t, x);
	pe_release(t);
	pe_step_plan p;
	assert_int_equal(pe_plan_step(c, &p), PE_OK);
	assert_int_equal(p.fused_nodes, 1);
	assert_int_equal(p.temp_bytes, 0);
	assert_int_equal(pe_mark_step(c), PE_OK);
	assert_int_equal(pe_memory_info_all(c, after, WORLD), PE_OK);
	for (int r = 0; r < WORLD; r++) {
		assert_int_equal(after[r].bytes_used, before[r].bytes_used + 8 * MiB);
		assert_int_equal(after[r].bytes_reserved, 0);
		/* During the step: x and y. */
		int64_t step_peak = before[r].bytes_used + 8 * MiB;
		int64_t want =
		    before[r].peak_bytes_used > step_peak ? before[r].peak_bytes_used : step_peak;
		assert_int_equal(after[r].peak_bytes_used, want);
		assert_int_equal(after[r].bytes_limit, 64 * MiB);
	}
	pe_release(x);
	pe_release(y);
	assert_int_equal(pe_memory_info_all(c, after, WORLD), PE_OK);
	for (int r = 0; r < WORLD; r++)
		assert_int_equal(after[r].bytes_used, before[r].bytes_used);
}

/* A training loop's step graph is compiled once; later steps reuse it with other buffers. */
static void test_program_cache_reuses_compiled_steps(void **state)
{
	pe_client *c = *state;
	int64_t n = 1024, dim0 = 0;
	pe_tensor *w = pe_full(c, PE_F32, &n, 1, 1.0);
	assert_int_equal(pe_mark_step(c), PE_OK);
	for (int s = 0; s < 3; s++) {
		pe_tensor *g = pe_all_gather(w, 0);
		pe_tensor *sum = pe_reduce_sum(g, &dim0, 1);
		pe_tensor *one = pe_full(c, PE_F32, &n, 1, 1.0);
		pe_tensor *next = pe_add(w, one);
		pe_release(g);
		pe_release(one);
		pe_release(w);
		w = next;
		pe_step_plan p;
		assert_int_equal(pe_plan_step(c, &p), PE_OK);
		assert_int_equal(p.program_cache_hit, s > 0); /* step 0: compiled by this plan */
		assert_int_equal(pe_mark_step(c), PE_OK);
		float got;
		assert_int_equal(pe_fetch(sum, 3, &got, sizeof(got)), PE_OK);
		assert_true(got ==
		            (float)(WORLD * n * (s + 1))); /* the reused plan binds new buffers */
		pe_release(sum);
	}
	pe_release(w);
}

static void test_output_that_does_not_fit_is_refused_and_pod_keeps_working(void **state)
{
	pe_client *c = *state;
	pe_memory_info before[WORLD], after[WORLD];
	assert_int_equal(pe_memory_info_all(c, before, WORLD), PE_OK);

	/* Larger than a core: refused when compiling, nothing dispatched. */
	int64_t big = 20 * MiB; /* 80 MiB of f32 */
	pe_tensor *huge = pe_full(c, PE_F32, &big, 1, 0);
	assert_int_equal(pe_mark_step(c), PE_RESOURCE_EXHAUSTED);
	assert_non_null(strstr(pe_last_error(c),
	                       "RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used "
	                       "80.00M of 64.00M hbm. Exceeded hbm capacity by 16.00M. (on each of "
	                       "cores 0..3"));
	float v;
	assert_int_equal(pe_fetch(huge, 0, &v, sizeof(v)) != PE_OK, 1);
	pe_release(huge);

	/* Fits a core, but not next to what is already there: the agent refuses it. */
	int64_t n40 = 10 * MiB, n30 = 30 * MiB / 4;
	pe_tensor *held = pe_full(c, PE_F32, &n40, 1, 0);
	assert_int_equal(pe_mark_step(c), PE_OK);
	pe_tensor *more = pe_full(c, PE_F32, &n30, 1, 0);
	assert_int_equal(pe_mark_step(c), PE_RESOURCE_EXHAUSTED);
	const char *e = pe_last_error(c);
	assert_non_null(strstr(e, "RESOURCE_EXHAUSTED: core 0 (host 0): Error allocating device "
	                          "buffer: Attempting to allocate 30.00M. That was not possible."));
	pe_release(more);
	pe_release(held);

	/* Nothing leaked and the pod still runs steps. */
	assert_int_equal(pe_memory_info_all(c, after, WORLD), PE_OK);
	for (int r = 0; r < WORLD; r++)
		assert_int_equal(after[r].bytes_used, before[r].bytes_used);
	int64_t four = 4;
	pe_tensor *ok = pe_full(c, PE_F32, &four, 1, 3.0);
	float got[4];
	assert_int_equal(pe_fetch(ok, 1, got, sizeof(got)), PE_OK);
	assert_true(got[3] == 3.0f);
	pe_release(ok);
}

static void test_fragmented_heap_fails_the_reservation_in_xla_words(void **state)
{
	pe_client *c = *state;
	int64_t n16 = 4 * MiB; /* 16 MiB each */
	pe_tensor *a = pe_full(c, PE_F32, &n16, 1, 0);
	pe_tensor *b = pe_full(c, PE_F32, &n16, 1, 0);
	pe_tensor *d = pe_full(c, PE_F32, &n16, 1, 0);
	assert_int_equal(pe_mark_step(c), PE_OK);
	pe_release(b); /* a hole of 16 MiB between a and d; 16 MiB free at the bottom */
	/* A 20 MiB temporary: 32 MiB are free, but only 16 MiB at the bottom. */
	int64_t n20 = 5 * MiB, dim0 = 0;
	pe_tensor *tmp = pe_full(c, PE_F32, &n20, 1, 1.0);
	pe_tensor *s = pe_reduce_sum(tmp, &dim0, 1);
	pe_release(tmp);
	assert_int_equal(pe_mark_step(c), PE_RESOURCE_EXHAUSTED);
	assert_non_null(strstr(pe_last_error(c),
	                       "Attempting to reserve 20.00M at the bottom of memory. That was not "
	                       "possible. There are 32.00M free, 0B reserved, and 16.00M "
	                       "reservable."));
	pe_release(s);
	pe_release(a);
	pe_release(d);
	/* With the heap empty again the same step fits. */
	tmp = pe_full(c, PE_F32, &n20, 1, 1.0);
	s = pe_reduce_sum(tmp, &dim0, 1);
	pe_release(tmp);
	float sum;
	assert_int_equal(pe_fetch(s, 2, &sum, sizeof(sum)), PE_OK);
	assert_true(sum == (float)n20);
	pe_release(s);
}

static void test_bad_calls_get_clear_errors(void **state)
{
	pe_client *c = *state;
	int64_t d[] = {4};
	pe_tensor *x = pe_full(c, PE_F32, d, 1, 1.0);
	int64_t bad[] = {3};
	assert_null(pe_reshape(x, bad, 1));
	assert_int_equal(pe_last_code(c), PE_INVALID_ARGUMENT);
	assert_non_null(strstr(pe_last_error(c), "mismatched element counts"));
	assert_null(pe_add(x, NULL));
	assert_null(pe_all_gather(x, 3));
	assert_non_null(strstr(pe_last_error(c), "all_gather_dimension"));
	float v[4];
	assert_int_equal(pe_fetch(x, WORLD, v, sizeof(v)), PE_INVALID_ARGUMENT);
	assert_int_equal(pe_fetch(x, 0, v, 3), PE_INVALID_ARGUMENT);
	assert_int_equal(pe_fetch(x, 0, v, sizeof(v)), PE_OK);
	int64_t neg[] = {-1};
	assert_null(pe_upload(c, PE_F32, neg, 1, NULL));
	assert_int_equal(pe_last_code(c), PE_INVALID_ARGUMENT);
	pe_release(x);
	pe_release(NULL);
}

static void test_optimization_barrier_keeps_values(void **state)
{
	pe_client *c = *state;
	int64_t d[] = {8};
	pe_tensor *a = pe_full(c, PE_F32, d, 1, 2.0);
	pe_tensor *b = pe_iota(c, PE_F32, d, 1, 0);
	pe_tensor *pair[] = {a, b};
	assert_int_equal(pe_optimization_barrier(pair, 2), PE_OK);
	pe_tensor *s = pe_multiply(a, b);
	float got[8];
	assert_int_equal(pe_fetch(s, 0, got, sizeof(got)), PE_OK);
	for (int i = 0; i < 8; i++)
		assert_true(got[i] == 2.0f * i);
	assert_int_equal(pe_fetch(a, 3, got, sizeof(got)), PE_OK);
	assert_true(got[7] == 2.0f);
	pe_release(a);
	pe_release(b);
	pe_release(s);
}

/* A loop over (x, i): x = 2x + replica id, i = i + 1, while i < limit. */
struct loop {
	pe_client *c;
	double limit;
	pe_tensor *outside; /* a tensor of the caller, which a computation may not use */
};

static pe_tensor *loop_cond(pe_tensor *const *state, int n, void *ctx)
{
	struct loop *l = ctx;
	assert_int_equal(n, 2);
	return pe_compare(state[1], pe_full(l->c, PE_S32, NULL, 0, l->limit), "LT");
}

static int loop_body(pe_tensor *const *state, int n, void *ctx, pe_tensor **next, int n_next)
{
	struct loop *l = ctx;
	assert_int_equal(n, 2);
	assert_int_equal(n_next, 2);
	int64_t d[] = {8};
	pe_tensor *id = pe_broadcast(pe_convert(pe_replica_id(l->c), PE_F32), d, 1, NULL);
	pe_tensor *x = l->outside != NULL ? l->outside : state[0];
	next[0] = pe_add(pe_multiply(x, pe_full(l->c, PE_F32, d, 1, 2.0)), id);
	next[1] = pe_add(state[1], pe_full(l->c, PE_S32, NULL, 0, 1.0));
	return next[0] && next[1] ? PE_OK : PE_INVALID_ARGUMENT;
}

static int negate(pe_tensor *const *args, int n, void *ctx, pe_tensor **out, int n_out)
{
	(void)ctx;
	assert_int_equal(n, 1);
	assert_int_equal(n_out, 1);
	out[0] = pe_negate(args[0]);
	return PE_OK;
}

static int times_ten(pe_tensor *const *args, int n, void *ctx, pe_tensor **out, int n_out)
{
	struct loop *l = ctx;
	int64_t d[] = {8};
	(void)n;
	(void)n_out;
	out[0] = pe_multiply(args[0], pe_full(l->c, PE_F32, d, 1, 10.0));
	return PE_OK;
}

/* while, call and conditional run their computations on every core, with real bytes. */
static void test_control_flow_runs_on_every_core(void **state)
{
	pe_client *c = *state;
	int64_t d[] = {8};
	struct loop l = {.c = c, .limit = 3};
	pe_tensor *init[] = {pe_iota(c, PE_F32, d, 1, 0), pe_full(c, PE_S32, NULL, 0, 0.0)};
	pe_tensor *out[2];
	assert_int_equal(pe_while_loop(init, 2, loop_cond, loop_body, &l, 0, out), PE_OK);
	pe_tensor *called;
	assert_int_equal(pe_call(&out[0], 1, negate, NULL, &called, 1), PE_OK);
	/* Core 0 takes the first branch (10 x), the others the second (-x). */
	pe_tensor *first = pe_compare(pe_replica_id(c), pe_full(c, PE_U32, NULL, 0, 1.0), "LT");
	pe_tensor *const branch_x[] = {out[0]};
	pe_tensor *const *args[] = {branch_x, branch_x};
	int n_args[] = {1, 1};
	pe_computation_fn fns[] = {times_ten, negate};
	void *ctxs[] = {&l, NULL};
	pe_tensor *picked;
	assert_int_equal(pe_conditional(first, 2, args, n_args, fns, ctxs, &picked, 1), PE_OK);
	for (int r = 0; r < pe_world_size(c); r++) {
		float x[8], neg[8], p[8];
		int32_t i;
		assert_int_equal(pe_fetch(out[0], r, x, sizeof(x)), PE_OK);
		assert_int_equal(pe_fetch(out[1], r, &i, sizeof(i)), PE_OK);
		assert_int_equal(pe_fetch(called, r, neg, sizeof(neg)), PE_OK);
		assert_int_equal(pe_fetch(picked, r, p, sizeof(p)), PE_OK);
		assert_int_equal(i, 3);
		for (int j = 0; j < 8; j++) {
			assert_true(x[j] == 8.0f * j + 7.0f * r); /* three times 2x + r */
			assert_true(neg[j] == -x[j]);
			assert_true(p[j] == (r == 0 ? 10 * x[j] : -x[j]));
		}
	}
	/* A computation cannot use a tensor of its caller; the step is not harmed. */
	l.outside = out[0];
	pe_tensor *again[2];
	assert_int_equal(pe_while_loop(init, 2, loop_cond, loop_body, &l, 0, again),
	                 PE_INVALID_ARGUMENT);
	assert_non_null(strstr(pe_last_error(c), "a tensor from outside the computation"));
	for (int k = 0; k < 2; k++)
		pe_release(init[k]);
	pe_release(out[0]);
	pe_release(out[1]);
	pe_release(called);
	pe_release(first);
	pe_release(picked);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_plan_step_says_whether_it_fits),
	    cmocka_unit_test(test_ops_match_host),
	    cmocka_unit_test(test_all_gather_moves_real_bytes_across_agents),
	    cmocka_unit_test(test_large_all_gather_in_chunks),
	    cmocka_unit_test(test_memory_accounting_is_exact),
	    cmocka_unit_test(test_program_cache_reuses_compiled_steps),
	    cmocka_unit_test(test_output_that_does_not_fit_is_refused_and_pod_keeps_working),
	    cmocka_unit_test(test_fragmented_heap_fails_the_reservation_in_xla_words),
	    cmocka_unit_test(test_bad_calls_get_clear_errors),
	    cmocka_unit_test(test_optimization_barrier_keeps_values),
	    cmocka_unit_test(test_control_flow_runs_on_every_core),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
