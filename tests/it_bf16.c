/*
 * bf16 reductions against a reference that rounds where the schedule rounds: every hop of a
 * ring (or of recursive doubling, or of the two rings of the hierarchical all-reduce) adds
 * in f32 and rounds the partial sum to bf16 before it travels on, as XLA on a TPU does. The
 * inputs have full 8-bit mantissas, so the order and the points of rounding decide the result:
 * the test also checks that a sum rounded only once differs from the reference somewhere, so
 * an executor that kept f32 partials (or rounded in another order) cannot pass.
 *
 * Usage: it_bf16 HOSTS CORES_PER_HOST (PODEMU_COLLECTIVE_ALGO forces an algorithm).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "pod_fixture.h"

static int hosts = 1, cores = 8, world = 8;
static pe_client *client;

/* Round to nearest even, as XLA converts f32 to bf16 (no NaNs occur here). */
static uint16_t to_bf16(float f)
{
	uint32_t bits;
	memcpy(&bits, &f, sizeof(bits));
	bits += 0x7FFFu + ((bits >> 16) & 1u);
	return (uint16_t)(bits >> 16);
}

static float from_bf16(uint16_t h)
{
	uint32_t bits = (uint32_t)h << 16;
	float f;
	memcpy(&f, &bits, sizeof(f));
	return f;
}

/* One hop: the partial so far plus a member's value, rounded to bf16. */
static float hop(float acc, float v)
{
	return from_bf16(to_bf16(v + acc));
}

/* Values in [0.5, 4) with random 8-bit mantissas, different on every core. */
static uint16_t **inputs(int64_t n, unsigned seed)
{
	uint16_t **in = calloc((size_t)world, sizeof(*in));
	assert_non_null(in);
	for (int c = 0; c < world; c++) {
		in[c] = malloc((size_t)n * sizeof(uint16_t));
		assert_non_null(in[c]);
		for (int64_t i = 0; i < n; i++) {
			seed = seed * 1664525u + 1013904223u;
			float v = (float)(0.5 + 3.5 * (double)(seed >> 8) / (double)(1u << 24));
			in[c][i] = to_bf16(v);
		}
	}
	return in;
}

static void free_inputs(uint16_t **in)
{
	for (int c = 0; c < world; c++)
		free(in[c]);
	free(in);
}

/* Start and length of piece k of n of [start, start + count), as the lowering splits. */
static void piece(int64_t start, int64_t count, int n, int k, int64_t *at, int64_t *len)
{
	int64_t base = count / n, rem = count % n;
	*at = start + k * base + (k < rem ? k : rem);
	*len = base + (k < rem);
}

/* The piece of [0, count) split n ways that holds element e. */
static int piece_of(int64_t count, int n, int64_t e, int64_t start)
{
	for (int k = 0; k < n; k++) {
		int64_t at, len;
		piece(start, count, n, k, &at, &len);
		if (e >= at && e < at + len)
			return k;
	}
	return n - 1;
}

/* A chain around members (ordinals) starting at position first: x0, x0+x1, ... rounded. */
static float chain(uint16_t **in, int64_t e, const int *members, int n, int first)
{
	float acc = from_bf16(in[members[first % n]][e]);
	for (int k = 1; k < n; k++)
		acc = hop(acc, from_bf16(in[members[(first + k) % n]][e]));
	return acc;
}

/* The all-reduce sum of element e as the named algorithm computes it (on every core). */
static float all_reduce_ref(uint16_t **in, int64_t n, int64_t e, const char *algo)
{
	int all[64];
	for (int c = 0; c < world; c++)
		all[c] = c;
	/* Block q is summed from core q up, around the ring or on core q (direct). */
	if (strcmp(algo, "ring") == 0 || strcmp(algo, "direct") == 0)
		return chain(in, e, all, world, piece_of(n, world, e, 0));
	if (strcmp(algo, "recursive-doubling") == 0) {
		float v[64];
		for (int c = 0; c < world; c++)
			v[c] = from_bf16(in[c][e]);
		for (int bit = 1; bit < world; bit <<= 1) {
			float next[64];
			for (int c = 0; c < world; c++)
				next[c] = hop(v[c], v[c ^ bit]);
			memcpy(v, next, sizeof(v));
		}
		return v[0];
	}
	assert_string_equal(algo, "hierarchical");
	/* A ring within each host over block q (of the host's cores), then a ring across the
	 * hosts over sub-block r (of the hosts) of it. */
	int q = piece_of(n, cores, e, 0);
	int64_t qat, qlen;
	piece(0, n, cores, q, &qat, &qlen);
	int r = piece_of(qlen, hosts, e, qat);
	float host_sum[64] = {0};
	for (int h = 0; h < hosts; h++) {
		int local[64];
		for (int p = 0; p < cores; p++)
			local[p] = h * cores + p;
		host_sum[h] = chain(in, e, local, cores, q);
	}
	float acc = host_sum[r];
	for (int k = 1; k < hosts; k++)
		acc = hop(acc, host_sum[(r + k) % hosts]);
	return acc;
}

/* The sum rounded once: what an executor that kept f32 partials would give. */
static float rounded_once(uint16_t **in, int64_t e)
{
	float acc = 0;
	for (int c = 0; c < world; c++)
		acc += from_bf16(in[c][e]);
	return from_bf16(to_bf16(acc));
}

static pe_tensor *upload(uint16_t **in, int64_t n)
{
	const void **per_core = calloc((size_t)world, sizeof(*per_core));
	assert_non_null(per_core);
	for (int c = 0; c < world; c++)
		per_core[c] = in[c];
	pe_tensor *t = pe_upload(client, PE_BF16, &n, 1, per_core);
	free(per_core);
	assert_non_null(t);
	return t;
}

/* Runs the pending step, which holds one collective; the algorithm the pod ran it with. */
static const char *run_one_collective(void)
{
	assert_int_equal(pe_mark_step(client), PE_OK);
	int64_t micros;
	const char *algo;
	assert_int_equal(pe_last_step_collectives(client, &micros, &algo, 1), 1);
	return algo;
}

static void check_all_reduce(int64_t n, unsigned seed)
{
	uint16_t **in = inputs(n, seed);
	pe_tensor *x = upload(in, n);
	pe_tensor *y = pe_all_reduce(x, PE_REDUCE_SUM, 1.0, NULL);
	const char *algo = run_one_collective();
	uint16_t *got = malloc((size_t)n * sizeof(uint16_t));
	float *want = malloc((size_t)n * sizeof(float));
	assert_non_null(got);
	assert_non_null(want);
	int64_t differ_from_once = 0;
	for (int64_t e = 0; e < n; e++) {
		want[e] = all_reduce_ref(in, n, e, algo);
		differ_from_once += want[e] != rounded_once(in, e);
	}
	for (int c = 0; c < world; c++) {
		assert_int_equal(pe_fetch(y, c, got, (size_t)n * sizeof(uint16_t)), PE_OK);
		for (int64_t e = 0; e < n; e++)
			if (from_bf16(got[e]) != want[e]) {
				fprintf(stderr,
				        "%s all-reduce, core %d, element %lld: %g, reference %g\n",
				        algo, c, (long long)e, (double)from_bf16(got[e]),
				        (double)want[e]);
				fail();
			}
	}
	printf("all-reduce of %lld bf16 (%s): every core matches the per-hop reference; "
	       "%lld elements differ from a sum rounded once\n",
	       (long long)n, algo, (long long)differ_from_once);
	assert_true(differ_from_once > 0);
	pe_release(x);
	pe_release(y);
	free(got);
	free(want);
	free_inputs(in);
}

static void test_all_reduce_small(void **state)
{
	check_all_reduce(8 * 1024 + 3, 7); /* recursive doubling where the group allows */
}

static void test_all_reduce_large(void **state)
{
	check_all_reduce(512 * 1024 + 5, 11); /* rings */
}

static void test_reduce_scatter(void **state)
{
	const int64_t block = 64 * 1024 + 1;
	int64_t n = block * world;
	uint16_t **in = inputs(n, 13);
	pe_tensor *x = upload(in, n);
	pe_tensor *y = pe_reduce_scatter(x, PE_REDUCE_SUM, 0, NULL);
	const char *algo = run_one_collective();
	/* Around the ring block j starts on core j+1; direct, core j sums from its own up. */
	int first = strcmp(algo, "direct") == 0 ? 0 : 1;
	if (first)
		assert_string_equal(algo, "ring");
	int all[64];
	for (int c = 0; c < world; c++)
		all[c] = c;
	uint16_t *got = malloc((size_t)block * sizeof(uint16_t));
	assert_non_null(got);
	int64_t differ_from_once = 0;
	for (int j = 0; j < world; j++) {
		assert_int_equal(pe_fetch(y, j, got, (size_t)block * sizeof(uint16_t)), PE_OK);
		for (int64_t i = 0; i < block; i++) {
			int64_t e = j * block + i;
			float want = chain(in, e, all, world, (j + first) % world);
			differ_from_once += want != rounded_once(in, e);
			if (from_bf16(got[i]) != want) {
				fprintf(stderr,
				        "reduce-scatter, core %d, element %lld: %g, reference %g\n",
				        j, (long long)i, (double)from_bf16(got[i]), (double)want);
				fail();
			}
		}
	}
	printf("reduce-scatter of %lld bf16 (%s): every shard matches the per-hop reference; "
	       "%lld elements differ from a sum rounded once\n",
	       (long long)n, algo, (long long)differ_from_once);
	assert_true(differ_from_once > 0);
	pe_release(x);
	pe_release(y);
	free(got);
	free_inputs(in);
}

static int setup(void **state)
{
	char args[256];
	snprintf(args, sizeof(args), "--hosts %d --cores-per-host %d --hbm 256M --backing host",
	         hosts, cores);
	client = pod_start(args);
	return client != NULL ? 0 : -1;
}

static int teardown(void **state)
{
	pe_disconnect(client);
	pod_stop();
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3) {
		hosts = atoi(argv[1]);
		cores = atoi(argv[2]);
	}
	world = hosts * cores;
	if (world < 2 || world > 64)
		return 2;
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_all_reduce_small),
	    cmocka_unit_test(test_all_reduce_large),
	    cmocka_unit_test(test_reduce_scatter),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
