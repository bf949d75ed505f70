/*
 * Every collective against an independent host computation, on a real pod with real bytes
 * over real sockets: it_collectives HOSTS CORES [HOSTS_PER_AGENT] starts a pod of that shape
 * (64 KiB chunks, so small tensors already span many chunks; HOSTS_PER_AGENT hosts in each
 * agent process) and checks each op x dtype x reduction x group layout, zero-size tensors,
 * sizes that do not divide a chunk, and XLA's errors.
 */
#include <math.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "pod_fixture.h"

static int hosts = 2, cores = 2, world = 4;
static int hosts_per_agent = 1; /* hosts each agent process emulates */

enum kind { AG, AR, RS, A2A };

/* Element i of core r's input for a case; small integers so every result is exact. */
static double input_value(pe_dtype dt, pe_reduce_op op, int r, int64_t i)
{
	if (op == PE_REDUCE_PRODUCT) {
		static const double v[] = {1, -1, 2, 1, 1};
		return v[(r * 3 + i) % 5];
	}
	if (dt == PE_PRED)
		return (r + i) % 3 == 0;
	if (dt == PE_U8)
		return (double)((r * 5 + i * 3) % 7);
	return (double)((r * 7 + i * 3) % 9) - 4;
}

static size_t esize(pe_dtype dt)
{
	return dt == PE_F32 || dt == PE_S32 || dt == PE_U32 ? 4 : dt == PE_BF16 ? 2 : 1;
}

static double get(pe_dtype dt, const void *p, int64_t i)
{
	switch (dt) {
	case PE_F32:
		return ((const float *)p)[i];
	case PE_S32:
		return ((const int32_t *)p)[i];
	case PE_BF16: {
		uint32_t bits = (uint32_t)((const uint16_t *)p)[i] << 16;
		float f;
		memcpy(&f, &bits, 4);
		return f;
	}
	default:
		return ((const uint8_t *)p)[i];
	}
}

static void set(pe_dtype dt, void *p, int64_t i, double v)
{
	switch (dt) {
	case PE_F32:
		((float *)p)[i] = (float)v;
		return;
	case PE_S32:
		((int32_t *)p)[i] = (int32_t)v;
		return;
	case PE_BF16: {
		float f = (float)v; /* small integers: exact in bf16 */
		uint32_t bits;
		memcpy(&bits, &f, 4);
		((uint16_t *)p)[i] = (uint16_t)(bits >> 16);
		return;
	}
	default:
		((uint8_t *)p)[i] = (uint8_t)v;
		return;
	}
}

static double combine(pe_reduce_op op, double a, double b)
{
	switch (op) {
	case PE_REDUCE_SUM:
		return a + b;
	case PE_REDUCE_PRODUCT:
		return a * b;
	case PE_REDUCE_MAX:
		return a > b ? a : b;
	case PE_REDUCE_MIN:
		return a < b ? a : b;
	case PE_REDUCE_AND:
		return (double)((int64_t)a & (int64_t)b);
	default:
		return (double)((int64_t)a | (int64_t)b);
	}
}

/* Groups as lists: group_of[r], members[g][k], size. */
struct groups {
	int n, size;
	int members[64][64];
	int group_of[64], pos_of[64];
};

static void groups_from_text(struct groups *g, const char *text)
{
	memset(g, 0, sizeof(*g));
	if (text == NULL) {
		g->n = 1;
		g->size = world;
		for (int r = 0; r < world; r++) {
			g->members[0][r] = r;
			g->pos_of[r] = r;
		}
		return;
	}
	const char *p = text + 1;
	while (*p == '{') {
		p++;
		int k = 0;
		while (*p != '}') {
			int v = (int)strtol(p, (char **)&p, 10);
			g->members[g->n][k] = v;
			g->group_of[v] = g->n;
			g->pos_of[v] = k++;
			if (*p == ',')
				p++;
		}
		g->size = k;
		g->n++;
		p++;
		if (*p == ',')
			p++;
	}
}

/* Element index in a [d0,d1] row-major array. */
#define AT(i, j, d1) ((i) * (d1) + (j))

static void check_case(pe_client *c, enum kind kind, pe_dtype dt, pe_reduce_op op,
                       const char *groups_text, int64_t d0, int64_t d1, int dim, int dim2,
                       double scale)
{
	struct groups g;
	groups_from_text(&g, groups_text);
	int n = g.size;
	int64_t in_elems = d0 * d1;
	void **in = calloc((size_t)world, sizeof(void *));
	for (int r = 0; r < world; r++) {
		in[r] = calloc((size_t)in_elems + 1, esize(dt));
		for (int64_t i = 0; i < in_elems; i++)
			set(dt, in[r], i, input_value(dt, op, r, i));
	}
	int64_t dims[] = {d0, d1};
	pe_tensor *x = pe_upload(c, dt, dims, 2, (const void *const *)in);
	assert_non_null(x);
	pe_groups *pg = groups_text ? pe_groups_parse(c, groups_text) : NULL;
	pe_tensor *y = NULL;
	int64_t o0 = d0, o1 = d1;
	switch (kind) {
	case AG:
		y = pe_all_gather_groups(x, dim, pg);
		*(dim == 0 ? &o0 : &o1) *= n;
		break;
	case AR:
		y = pe_all_reduce(x, op, scale, pg);
		break;
	case RS:
		y = pe_reduce_scatter(x, op, dim, pg);
		*(dim == 0 ? &o0 : &o1) /= n;
		break;
	case A2A:
		y = pe_all_to_all(x, dim, dim2, pg);
		*(dim == 0 ? &o0 : &o1) /= n;
		*(dim2 == 0 ? &o0 : &o1) *= n;
		break;
	}
	if (y == NULL)
		fail_msg("recording: %s", pe_last_error(c));
	if (pe_mark_step(c) != PE_OK)
		fail_msg("step: %s", pe_last_error(c));
	int64_t out_elems = o0 * o1;
	void *got = calloc((size_t)out_elems + 1, esize(dt));
	for (int r = 0; r < world; r++) {
		assert_int_equal(pe_fetch(y, r, got, (size_t)out_elems * esize(dt)), PE_OK);
		const int *m = g.members[g.group_of[r]];
		int p = g.pos_of[r];
		for (int64_t i = 0; i < o0; i++) {
			for (int64_t j = 0; j < o1; j++) {
				double want = 0;
				if (kind == AG) {
					int64_t src_i = dim == 0 ? i % d0 : i,
					        src_j = dim == 1 ? j % d1 : j;
					int who = m[dim == 0 ? i / d0 : j / d1];
					want = get(dt, in[who], AT(src_i, src_j, d1));
				} else if (kind == AR || kind == RS) {
					int64_t si = kind == RS && dim == 0 ? p * o0 + i : i;
					int64_t sj = kind == RS && dim == 1 ? p * o1 + j : j;
					want = get(dt, in[m[0]], AT(si, sj, d1));
					for (int k = 1; k < n; k++)
						want = combine(op, want,
						               get(dt, in[m[k]], AT(si, sj, d1)));
					if (kind == AR && scale != 0)
						want *= scale;
				} else {
					/* piece from member `who` = its block p along dim, placed
					 * at block `who` along dim2 */
					int64_t blk0 = dim2 == 0 ? o0 / n : o0,
					        blk1 = dim2 == 1 ? o1 / n : o1;
					int who = dim2 == 0 ? (int)(i / blk0) : (int)(j / blk1);
					int64_t pi = dim2 == 0 ? i % blk0 : i,
					        pj = dim2 == 1 ? j % blk1 : j;
					int64_t si = dim == 0 ? p * (d0 / n) + pi : pi;
					int64_t sj = dim == 1 ? p * (d1 / n) + pj : pj;
					want = get(dt, in[m[who]], AT(si, sj, d1));
				}
				double have = get(dt, got, AT(i, j, o1));
				if (have != want)
					fail_msg("kind %d dtype %d op %d groups %s [%lld,%lld] dim "
					         "%d: core "
					         "%d element (%lld,%lld) is %g, want %g",
					         kind, dt, op, groups_text ? groups_text : "all",
					         (long long)d0, (long long)d1, dim, r, (long long)i,
					         (long long)j, have, want);
			}
		}
	}
	free(got);
	for (int r = 0; r < world; r++)
		free(in[r]);
	free(in);
	pe_release(x);
	pe_release(y);
}

/* Group layouts that exist for every pod shape used here. */
static char group_texts[5][512];
static const char *layouts[5];
static int num_layouts;

static void add_layout(int per_group, int (*member)(int g, int k))
{
	char *t = group_texts[num_layouts];
	size_t at = 0;
	at += (size_t)sprintf(t + at, "{");
	for (int g = 0; g < world / per_group; g++) {
		at += (size_t)sprintf(t + at, "%s{", g ? "," : "");
		for (int k = 0; k < per_group; k++)
			at += (size_t)sprintf(t + at, "%s%d", k ? "," : "", member(g, k));
		at += (size_t)sprintf(t + at, "}");
	}
	sprintf(t + at, "}");
	layouts[num_layouts] = t;
	num_layouts++;
}

static int per_host(int g, int k)
{
	return g * cores + k;
}
static int across_hosts(int g, int k)
{
	return k * cores + g;
}
static int strided(int g, int k)
{
	return k * 2 + g;
}
static int reversed(int g, int k)
{
	return world - 1 - k;
}

static void build_layouts(void)
{
	num_layouts = 0;
	layouts[num_layouts++] = NULL; /* all cores */
	if (cores > 1 && hosts > 1) {
		add_layout(cores, per_host);
		add_layout(hosts, across_hosts);
	}
	if (world % 2 == 0 && world > 2)
		add_layout(world / 2, strided);
	add_layout(world, reversed);
}

static void test_all_gather(void **state)
{
	pe_client *c = *state;
	for (int l = 0; l < num_layouts; l++) {
		check_case(c, AG, PE_F32, 0, layouts[l], 37, 5, 0, 0, 0);
		check_case(c, AG, PE_S32, 0, layouts[l], 6, 7, 1, 0, 0);
		check_case(c, AG, PE_BF16, 0, layouts[l], 3, 11, 1, 0, 0);
	}
	/* Bigger than many 64 KiB chunks and not a multiple of one. */
	check_case(c, AG, PE_F32, 0, NULL, 25001, 3, 0, 0, 0);
	check_case(c, AG, PE_U8, 0, NULL, 1, 70001, 1, 0, 0);
}

static void test_all_reduce(void **state)
{
	pe_client *c = *state;
	static const pe_reduce_op arith[] = {PE_REDUCE_SUM, PE_REDUCE_PRODUCT, PE_REDUCE_MAX,
	                                     PE_REDUCE_MIN};
	for (int l = 0; l < num_layouts; l++)
		for (int o = 0; o < 4; o++) {
			check_case(c, AR, PE_F32, arith[o], layouts[l], 5, 13, 0, 0, 0);
			check_case(c, AR, PE_S32, arith[o], layouts[l], 3, 7, 0, 0, 0);
			check_case(c, AR, PE_BF16, arith[o], layouts[l], 2, 9, 0, 0, 0);
		}
	check_case(c, AR, PE_S32, PE_REDUCE_AND, NULL, 4, 4, 0, 0, 0);
	check_case(c, AR, PE_U8, PE_REDUCE_OR, NULL, 4, 5, 0, 0, 0);
	check_case(c, AR, PE_PRED, PE_REDUCE_AND, NULL, 3, 3, 0, 0, 0);
	check_case(c, AR, PE_PRED, PE_REDUCE_OR, NULL, 3, 3, 0, 0, 0);
	/* Ring over many chunks (1.2 MB), recursive doubling for small power-of-two groups. */
	check_case(c, AR, PE_F32, PE_REDUCE_SUM, NULL, 300007, 1, 0, 0, 0);
	check_case(c, AR, PE_F32, PE_REDUCE_SUM, NULL, 4, 4, 0, 0, 0.5);
}

static void test_reduce_scatter(void **state)
{
	pe_client *c = *state;
	for (int l = 0; l < num_layouts; l++) {
		int n = layouts[l] == NULL ? world : 0;
		if (n == 0) {
			struct groups g;
			groups_from_text(&g, layouts[l]);
			n = g.size;
		}
		check_case(c, RS, PE_F32, PE_REDUCE_SUM, layouts[l], 3 * n, 5, 0, 0, 0);
		check_case(c, RS, PE_S32, PE_REDUCE_MAX, layouts[l], 4, 2 * n, 1, 0, 0);
		check_case(c, RS, PE_BF16, PE_REDUCE_MIN, layouts[l], n, 3, 0, 0, 0);
	}
	check_case(c, RS, PE_F32, PE_REDUCE_SUM, NULL, (int64_t)world * 20011, 1, 0, 0, 0);
}

static void test_all_to_all(void **state)
{
	pe_client *c = *state;
	for (int l = 0; l < num_layouts; l++) {
		int n = world;
		if (layouts[l] != NULL) {
			struct groups g;
			groups_from_text(&g, layouts[l]);
			n = g.size;
		}
		check_case(c, A2A, PE_F32, 0, layouts[l], 2 * n, 3, 0, 1, 0);
		check_case(c, A2A, PE_S32, 0, layouts[l], 5, 3 * n, 1, 0, 0);
		check_case(c, A2A, PE_BF16, 0, layouts[l], n, 4, 0, 0, 0);
	}
}

static void test_collective_permute(void **state)
{
	pe_client *c = *state;
	int64_t n = 10007;
	float *in[64];
	for (int r = 0; r < world; r++) {
		in[r] = malloc((size_t)n * sizeof(float));
		for (int64_t i = 0; i < n; i++)
			in[r][i] = (float)(r * 100000 + i);
	}
	pe_tensor *x = pe_upload(c, PE_F32, &n, 1, (const void *const *)in);
	/* A ring shift, and a partial permutation where core 0 gets nothing (zeros). */
	int64_t ring[128], partial[128];
	for (int r = 0; r < world; r++) {
		ring[2 * r] = r;
		ring[2 * r + 1] = (r + 1) % world;
	}
	int np = 0;
	for (int r = 0; r + 1 < world; r++) {
		partial[2 * np] = r;
		partial[2 * np + 1] = r + 1;
		np++;
	}
	pe_tensor *a = pe_collective_permute(x, ring, world);
	pe_tensor *b = pe_collective_permute(x, partial, np);
	assert_non_null(a);
	assert_non_null(b);
	assert_int_equal(pe_mark_step(c), PE_OK);
	float *got = malloc((size_t)n * sizeof(float));
	for (int r = 0; r < world; r++) {
		assert_int_equal(pe_fetch(a, r, got, (size_t)n * sizeof(float)), PE_OK);
		assert_memory_equal(got, in[(r + world - 1) % world], (size_t)n * sizeof(float));
		assert_int_equal(pe_fetch(b, r, got, (size_t)n * sizeof(float)), PE_OK);
		if (r == 0)
			assert_true(got[0] == 0 && got[n - 1] == 0);
		else
			assert_memory_equal(got, in[r - 1], (size_t)n * sizeof(float));
	}
	free(got);
	for (int r = 0; r < world; r++)
		free(in[r]);
	pe_release(x);
	pe_release(a);
	pe_release(b);
}

static void test_zero_size_and_scratch(void **state)
{
	pe_client *c = *state;
	int64_t zero[] = {0, 5};
	pe_tensor *x = pe_full(c, PE_F32, zero, 2, 1.0);
	pe_tensor *ag = pe_all_gather(x, 1);
	pe_tensor *ar = pe_all_reduce(x, PE_REDUCE_SUM, 1.0, NULL);
	assert_non_null(ag);
	assert_non_null(ar);
	assert_int_equal(pe_mark_step(c), PE_OK);
	int64_t d[PE_MAX_RANK];
	int rank;
	pe_tensor_shape(ag, NULL, d, &rank);
	assert_int_equal(d[1], 5 * world);
	pe_release(x);
	pe_release(ag);
	pe_release(ar);

	/*
	 * All-gather of contiguous blocks needs no workspace, nor an all-reduce, which combines
	 * into its output, but for the window's 4 chunks (64 KiB) to stage the sends recursive
	 * doubling overwrites when that is forced (it is chosen only up to 256 KiB).
	 */
	int64_t n = 100000;
	pe_tensor *v = pe_full(c, PE_F32, &n, 1, 1.0);
	pe_tensor *g = pe_all_gather(v, 0);
	pe_tensor *s = pe_all_reduce(v, PE_REDUCE_SUM, 1.0, NULL);
	assert_int_equal(pe_mark_step(c), PE_OK);
	int64_t micros[2];
	assert_int_equal(pe_last_step_collectives(c, micros, NULL, 2), 2);
	/* One collective's span is its slowest core's time; two's covers each. */
	assert_int_equal(pe_last_step_collectives_span(c, 0, 0), micros[0]);
	assert_int_equal(pe_last_step_collectives_span(c, 1, 1), micros[1]);
	int64_t span = pe_last_step_collectives_span(c, 0, 1);
	assert_true(span >= micros[0] && span >= micros[1]);
	assert_int_equal(pe_last_step_collectives_span(c, 1, 0), -1);
	assert_int_equal(pe_last_step_collectives_span(c, 0, 2), -1);
	assert_int_equal(pe_last_step_scratch_bytes(c, 0), 0);
	const char *forced = getenv("PODEMU_COLLECTIVE_ALGO");
	int doubling = forced != NULL && strcmp(forced, "recursive-doubling") == 0;
	assert_int_equal(pe_last_step_scratch_bytes(c, 1), (doubling ? 4 : 0) * 64 * 1024);
	pe_release(v);
	pe_release(g);
	pe_release(s);
}

/* The last step's receive slots held every chunk from a peer host, within what was reserved. */
static void assert_receive_in_slots(pe_client *c, const char *what, bool reduces)
{
	pe_receive_info ri;
	pe_last_step_receive(c, &ri);
	printf("%s: receive slots %lld bytes per core, a host held at most %lld, %lld chunks "
	       "outside\n",
	       what, (long long)ri.reserved_bytes, (long long)ri.peak_host_bytes,
	       (long long)ri.outside_chunks);
	assert_int_equal(ri.outside_chunks, 0);
	assert_true(ri.peak_host_bytes <= ri.reserved_bytes * cores);
	if (hosts == 1) {
		assert_int_equal(ri.reserved_bytes, 0);
		assert_int_equal(ri.peak_host_bytes, 0);
	} else {
		assert_true(ri.reserved_bytes > 0);
	}
	/* Partial sums from peer hosts are combined, never read into place: slots were used. */
	if (reduces && hosts > 1)
		assert_true(ri.peak_host_bytes > 0);
}

/*
 * Chunks from peer hosts that cannot be read straight into place wait in the receive slots
 * the plan reserved at the top of each core's reservation: whatever the op, size and
 * algorithm, none waits in host memory outside HBM, and no host holds more than its cores'
 * shares. Each op alone (many chunks of each), then all in one step.
 */
static void test_receive_slots_hold_every_chunk(void **state)
{
	pe_client *c = *state;
	int64_t n = (int64_t)world * 48 * 1024; /* 192 KiB of f32 per core member: 3 chunks */
	int64_t *ring = calloc((size_t)world * 2, sizeof(int64_t));
	assert_non_null(ring);
	for (int r = 0; r < world; r++) {
		ring[2 * r] = r;
		ring[2 * r + 1] = (r + 1) % world;
	}
	static const char *const names[] = {"all-gather", "reduce-scatter",     "all-reduce",
	                                    "all-to-all", "collective-permute", "all in one step"};
	for (int op = 0; op <= 5; op++) {
		int64_t m = op == 0 ? n / world : n;
		pe_tensor *x = pe_full(c, PE_F32, &m, 1, 1.0), *y[5] = {NULL};
		if (op == 0 || op == 5)
			y[0] = pe_all_gather(x, 0);
		if (op == 1 || op == 5)
			y[1] = pe_reduce_scatter(x, PE_REDUCE_SUM, 0, NULL);
		if (op == 2 || op == 5)
			y[2] = pe_all_reduce(x, PE_REDUCE_SUM, 1.0, NULL);
		if (op == 3 || op == 5)
			y[3] = pe_all_to_all(x, 0, 0, NULL);
		if (op == 4 || op == 5)
			y[4] = pe_collective_permute(x, ring, world);
		assert_int_equal(pe_mark_step(c), PE_OK);
		assert_receive_in_slots(c, names[op], op == 1 || op == 5);
		for (int k = 0; k < 5; k++)
			pe_release(y[k]);
		pe_release(x);
	}
	free(ring);
}

/* Resident bytes of a process, from /proc (0 when gone). */
static int64_t rss_of(pid_t pid)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	long long kb = 0;
	while (f != NULL && fgets(line, sizeof(line), f) != NULL)
		if (sscanf(line, "VmRSS: %lld kB", &kb) == 1)
			break;
	if (f != NULL)
		fclose(f);
	return (int64_t)kb * 1024;
}

/* What an agent may hold beyond the bytes its cores account, right after a step. */
#define RSS_OVERHEAD_BYTES ((int64_t)64 << 20)

/*
 * Agent RSS follows HBM: right after podemu bench's shapes (1 MiB to 64 MiB of every reducing
 * and gathering op), every agent holds at most its cores' bytes in use plus a fixed 64 MiB
 * (what a step frees goes back to the system as the step ends; hbm.h).
 */
static void test_rss_follows_accounted_bytes(void **state)
{
	pe_client *c = *state;
	const char *forced = getenv("PODEMU_COLLECTIVE_ALGO");
	if (forced != NULL && forced[0] != '\0') {
		printf("(the bench shapes run once per pod shape, with the algorithms it picks)\n");
		skip();
	}
#ifdef __SANITIZE_ADDRESS__
	/* Its shadow memory and quarantine are no agent overhead: nothing to measure. */
	printf("(agent RSS is not measured under AddressSanitizer)\n");
	skip();
#endif
	/* 32 MiB this client holds on every core, written: RSS must cover it, and not much more. */
	int64_t elements = 8 << 20;
	pe_tensor *held = pe_full(c, PE_F32, &elements, 1, 1.0);
	assert_int_equal(pe_mark_step(c), PE_OK);
	static const char *const sizes[] = {"1M", "8M", "64M"};
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		char cmd[1024];
		snprintf(cmd, sizeof(cmd),
		         "%s/podemu bench --state-dir %s --op all-gather,reduce-scatter,all-reduce "
		         "--min-bytes %s --max-bytes %s --iters 1 >/dev/null",
		         PODEMU_BIN_DIR, pod_state_dir, sizes[i], sizes[i]);
		assert_int_equal(system(cmd), 0);
		/* At once: no idle time for the agents to give anything back. */
		pe_memory_info m[64];
		assert_int_equal(pe_memory_info_all(c, m, world), PE_OK);
		/* Per agent process: hosts_per_agent hosts share one. */
		for (int first = 0; first < hosts; first += hosts_per_agent) {
			int64_t accounted = 0;
			int n = hosts - first < hosts_per_agent ? hosts - first : hosts_per_agent;
			for (int k = 0; k < n * cores; k++)
				accounted += m[first * cores + k].bytes_used;
			char name[32];
			snprintf(name, sizeof(name), "agent-%d", first);
			int64_t rss = rss_of(pod_pid(name));
			printf(
			    "hosts %d..%d after the %s shapes: RSS %lld MiB, accounted %lld MiB\n",
			    first, first + n - 1, sizes[i], (long long)rss >> 20,
			    (long long)accounted >> 20);
			assert_true(accounted >= (int64_t)n * cores * (32 << 20));
			assert_true(rss >= accounted);
			assert_true(rss <= accounted + RSS_OVERHEAD_BYTES);
		}
	}
	pe_release(held);
}

/*
 * 2.5 MiB a core and not a multiple of anything: a direct all-reduce (one host, or one core on
 * each host) runs in segments, across hosts in groups of one core a host too. After the RSS
 * test: the upload's heap leaves an agent a few MiB it keeps for later steps.
 */
static void test_all_reduce_in_segments(void **state)
{
	pe_client *c = *state;
	int64_t big = (int64_t)world * 640 * 1024 + 7;
	check_case(c, AR, PE_F32, PE_REDUCE_SUM, NULL, big, 1, 0, 0, 0);
	if (cores > 1 && hosts > 1)
		check_case(c, AR, PE_F32, PE_REDUCE_SUM, layouts[2], big, 1, 0, 0, 0);
}

static void test_mesh_axes(void **state)
{
	pe_client *c = *state;
	if (world % 2 != 0)
		skip();
	char spec[64];
	snprintf(spec, sizeof(spec), "data=%d,model=2", world / 2);
	assert_int_equal(pe_set_mesh(c, spec), PE_OK);
	int64_t n = 4;
	float vals[64][4];
	const void *in[64];
	for (int r = 0; r < world; r++) {
		for (int i = 0; i < 4; i++)
			vals[r][i] = (float)r;
		in[r] = vals[r];
	}
	pe_tensor *x = pe_upload(c, PE_F32, &n, 1, in);
	pe_tensor *model = pe_all_reduce(x, PE_REDUCE_SUM, 1.0, pe_groups_axis(c, "model"));
	pe_tensor *data = pe_all_reduce(x, PE_REDUCE_SUM, 1.0, pe_groups_axis(c, "data"));
	assert_non_null(model);
	assert_non_null(data);
	assert_int_equal(pe_mark_step(c), PE_OK);
	for (int r = 0; r < world; r++) {
		float got[4];
		assert_int_equal(pe_fetch(model, r, got, sizeof(got)), PE_OK);
		/* model pairs are {2k, 2k+1} */
		assert_true(got[0] == (float)((r / 2) * 4 + 1));
		assert_int_equal(pe_fetch(data, r, got, sizeof(got)), PE_OK);
		float want = 0;
		for (int k = r % 2; k < world; k += 2)
			want += (float)k;
		assert_true(got[0] == want);
	}
	assert_null(pe_groups_axis(c, "expert"));
	pe_release(x);
	pe_release(model);
	pe_release(data);
}

static void test_bad_groups_are_refused_in_xla_words(void **state)
{
	pe_client *c = *state;
	int64_t n = 8;
	pe_tensor *x = pe_full(c, PE_F32, &n, 1, 1.0);
	char text[256];
	snprintf(text, sizeof(text), "{{0,0}}");
	assert_null(pe_all_reduce(x, PE_REDUCE_SUM, 1, pe_groups_parse(c, text)));
	assert_non_null(
	    strstr(pe_last_error(c), "Replica 0 is repeated in instruction's replica-groups"));
	snprintf(text, sizeof(text), "{{0}}");
	if (world > 1) {
		assert_null(pe_all_reduce(x, PE_REDUCE_SUM, 1, pe_groups_parse(c, text)));
		assert_non_null(strstr(pe_last_error(c),
		                       "Replica 1 is not named in instruction's replica-groups"));
	}
	if (world >= 3) {
		size_t at = (size_t)sprintf(text, "{{0},{");
		for (int r = 1; r < world; r++)
			at += (size_t)sprintf(text + at, "%s%d", r > 1 ? "," : "", r);
		sprintf(text + at, "}}");
		/* all-reduce allows groups of unequal size; all-gather does not */
		assert_non_null(pe_all_reduce(x, PE_REDUCE_SUM, 1, pe_groups_parse(c, text)));
		assert_null(pe_all_gather_groups(x, 0, pe_groups_parse(c, text)));
		assert_non_null(
		    strstr(pe_last_error(c), "Replica groups expected to be of uniform size"));
	}
	assert_null(pe_groups_parse(c, "{{0,1}"));
	assert_non_null(strstr(pe_last_error(c), "syntax error"));
	if (world == 6) {
		/* 8 elements do not split over groups of 3 */
		assert_null(pe_reduce_scatter(x, PE_REDUCE_SUM, 0,
		                              pe_groups_parse(c, "{{0,1,2},{3,4,5}}")));
		assert_non_null(strstr(pe_last_error(c), "must be dividable by shard_count 3"));
	}
	int64_t pairs[] = {0, 1, 0, 2};
	if (world >= 3) {
		assert_null(pe_collective_permute(x, pairs, 2));
		assert_non_null(strstr(pe_last_error(c), "Source 0 appears more than once"));
	}
	assert_null(pe_all_reduce(pe_full(c, PE_F32, &n, 1, 1.0), PE_REDUCE_AND, 1, NULL));
	pe_release(x);
	/* The failed recordings left the pod usable. */
	pe_tensor *ok = pe_all_reduce(pe_full(c, PE_F32, &n, 1, 1.0), PE_REDUCE_SUM, 1, NULL);
	float got[8];
	assert_int_equal(pe_fetch(ok, world - 1, got, sizeof(got)), PE_OK);
	assert_true(got[7] == (float)world);
}

static int setup(void **state)
{
	/* Values, bytes sent and scratch are what is checked: unpadded buffers (--layout none). */
	char args[256];
	snprintf(args, sizeof(args),
	         "--hosts %d --cores-per-host %d --hbm 256M --backing host --chunk-bytes 64K "
	         "--layout none --hosts-per-agent %d",
	         hosts, cores, hosts_per_agent);
	pe_client *c = pod_start(args);
	if (c == NULL)
		return -1;
	build_layouts();
	*state = c;
	return 0;
}

static int teardown(void **state)
{
	pe_disconnect(*state);
	pod_stop();
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 3) {
		hosts = atoi(argv[1]);
		cores = atoi(argv[2]);
	}
	if (argc >= 4)
		hosts_per_agent = atoi(argv[3]);
	world = hosts * cores;
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_all_gather),
	    cmocka_unit_test(test_all_reduce),
	    cmocka_unit_test(test_reduce_scatter),
	    cmocka_unit_test(test_all_to_all),
	    cmocka_unit_test(test_collective_permute),
	    cmocka_unit_test(test_zero_size_and_scratch),
	    cmocka_unit_test(test_receive_slots_hold_every_chunk),
	    cmocka_unit_test(test_mesh_axes),
	    cmocka_unit_test(test_bad_groups_are_refused_in_xla_words),
	    cmocka_unit_test(test_rss_follows_accounted_bytes),
	    cmocka_unit_test(test_all_reduce_in_segments),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
