/*
 * podemu bench: collective bandwidth on the running pod, reported as nccl-tests does (size,
 * count, time, algbw, busbw), with the scratch each collective reserved and, with --check, every
 * core's result compared with an independent host computation.
 */
#include "bench.h"
#include "progress.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collective.h"
#include "dtype.h"
#include "status.h"
#include "topology.h"

enum bench_op { B_AG, B_RS, B_AR, B_A2A, B_PERMUTE, B_COUNT };

static const char *const op_names[B_COUNT] = {"all-gather", "reduce-scatter", "all-reduce",
                                              "all-to-all", "collective-permute"};

/* nccl-tests' bus bandwidth factors. */
static double bus_factor(enum bench_op op, int n)
{
	if (n <= 1)
		return 1;
	if (op == B_AR)
		return 2.0 * (n - 1) / n;
	if (op == B_PERMUTE)
		return 1;
	return (double)(n - 1) / n;
}

struct member_groups {
	int n;         /* group size */
	int *group_of; /* [world] */
	int *pos_of;   /* [world] */
	int64_t *ids;  /* group g's members at ids[g * n ...] */
};

static int resolve_groups(struct member_groups *mg, const struct bench_options *o, int world)
{
	Podemu__Node node = PODEMU__NODE__INIT;
	Podemu__MeshAxis axes[SHAPE_AXES_MAX], *mesh[SHAPE_AXES_MAX];
	char **names = NULL;
	int64_t *sizes = NULL;
	int n_mesh = 0;
	struct status st;
	int rv = ST_OK;
	if (o->mesh != NULL) {
		rv = coll_mesh_parse(o->mesh, &names, &sizes, &n_mesh, &st);
		for (int i = 0; rv == ST_OK && i < n_mesh; i++) {
			podemu__mesh_axis__init(&axes[i]);
			axes[i].name = names[i];
			axes[i].size = sizes[i];
			mesh[i] = &axes[i];
		}
		node.mesh_axis = (char *)(o->axis ? o->axis : "");
	}
	struct coll_groups cg;
	if (rv == ST_OK && o->mesh == NULL && o->groups != NULL)
		rv = coll_groups_from_text(&cg, o->groups, world, 0, "bench", &st);
	else if (rv == ST_OK)
		rv = coll_groups_resolve(&cg, &node, mesh, (size_t)n_mesh, world, 0, "bench", &st);
	if (rv == ST_OK) {
		mg->n = cg.uniform_size;
		mg->group_of = malloc((size_t)world * sizeof(int));
		mg->pos_of = malloc((size_t)world * sizeof(int));
		mg->ids = malloc((size_t)world * sizeof(int64_t));
		for (int r = 0; r < world; r++) {
			mg->group_of[r] = cg.group_of[r];
			mg->pos_of[r] = cg.position_of[r];
		}
		for (int g = 0; g < cg.num_groups; g++)
			memcpy(mg->ids + g * mg->n, cg.ids + cg.start[g],
			       (size_t)mg->n * sizeof(int64_t));
		coll_groups_free(&cg);
	} else {
		fprintf(stderr, "podemu bench: %s\n", st.message);
	}
	coll_mesh_free(names, sizes, n_mesh);
	return rv;
}

/* Input element i of core r: small integers, so sums over any group are exact. */
static float value(int r, int64_t i)
{
	return (float)((r * 7 + i * 3) % 9 - 4);
}

/* The benchmarked element types (values as dtype.h's); small integers are exact in each. */
struct bench_dtype {
	const char *name;
	pe_dtype dtype;
	int size;
};

static const struct bench_dtype dtypes[] = {
    {"f32", PE_F32, 4}, {"bf16", PE_BF16, 2}, {"s32", PE_S32, 4}, {NULL, PE_F32, 0}};

/* Compares core r's output with the host's computation of the same collective. */
static int check_core(enum bench_op op, const struct member_groups *mg, int world, int r,
                      const struct bench_dtype *t, const unsigned char *got, int64_t in_elems,
                      int64_t out_elems)
{
	const int64_t *m = mg->ids + (int64_t)mg->group_of[r] * mg->n;
	int p = mg->pos_of[r], n = mg->n;
	for (int64_t i = 0; i < out_elems; i++) {
		float want = 0;
		switch (op) {
		case B_AG:
			want = value((int)m[i / in_elems], i % in_elems);
			break;
		case B_AR:
			for (int k = 0; k < n; k++)
				want += value((int)m[k], i);
			break;
		case B_RS:
			for (int k = 0; k < n; k++)
				want += value((int)m[k], p * out_elems + i);
			break;
		case B_A2A: {
			int64_t block = in_elems / n;
			want = value((int)m[i / block], p * block + i % block);
			break;
		}
		default:
			want = value((r + world - 1) % world, i);
			break;
		}
		if (dtype_load(t->dtype, got, i) != want)
			return 0;
	}
	return 1;
}

static pe_tensor *record(pe_client *c, enum bench_op op, pe_tensor *x, const pe_groups *g,
                         int world)
{
	switch (op) {
	case B_AG:
		return pe_all_gather_groups(x, 0, g);
	case B_RS:
		return pe_reduce_scatter(x, PE_REDUCE_SUM, 0, g);
	case B_AR:
		return pe_all_reduce(x, PE_REDUCE_SUM, 1.0, g);
	case B_A2A:
		return pe_all_to_all(x, 0, 0, g);
	default: {
		int64_t *pairs = malloc((size_t)world * 2 * sizeof(int64_t));
		for (int r = 0; r < world; r++) {
			pairs[2 * r] = r;
			pairs[2 * r + 1] = (r + 1) % world;
		}
		pe_tensor *y = pe_collective_permute(x, pairs, world);
		free(pairs);
		return y;
	}
	}
}

struct row {
	enum bench_op op;
	int64_t bytes, count;
	double time_us, algbw, busbw;
	int64_t peak_temp;
	pe_receive_info receive;
	int checked, ok;
	const char *algorithm;
};

/* Runs one op at one size; fills row. Returns 0, or -1 after printing an error. */
static int run_one(pe_client *c, const struct bench_options *o, const struct bench_dtype *t,
                   enum bench_op op, int64_t bytes, const pe_groups *g,
                   const struct member_groups *mg, bool no_bytes, struct row *row)
{
	int world = pe_world_size(c), n = mg->n;
	/* Per-core input elements such that `bytes` is what nccl-tests calls the size: the
	 * output for all-gather, the input for reduce-scatter, the buffer for the others. */
	int64_t elems = bytes / t->size, in_elems;
	if (op == B_AG)
		in_elems = elems / n > 0 ? elems / n : 1;
	else if (op == B_RS || op == B_A2A)
		in_elems = elems / n * n > 0 ? elems / n * n : n;
	else
		in_elems = elems > 0 ? elems : 1;
	int64_t out_elems = op == B_AG ? in_elems * n : op == B_RS ? in_elems / n : in_elems;
	pe_tensor *x;
	if (no_bytes) { /* nothing to hold them: the input is made on the pod */
		x = pe_full(c, t->dtype, &in_elems, 1, 1.0);
	} else {
		unsigned char **data = calloc((size_t)world, sizeof(*data));
		for (int r = 0; r < world; r++) {
			data[r] = malloc((size_t)in_elems * (size_t)t->size);
			for (int64_t i = 0; i < in_elems; i++)
				dtype_store(t->dtype, data[r], i, value(r, i));
		}
		x = pe_upload(c, t->dtype, &in_elems, 1, (const void *const *)data);
		for (int r = 0; r < world; r++)
			free(data[r]);
		free(data);
	}
	if (x == NULL) {
		fprintf(stderr, "podemu bench: upload: %s\n", pe_last_error(c));
		return -1;
	}
	/*
	 * All iterations run back to back in one step, as nccl-tests loops on a stream: the cost
	 * of dispatching a step to every agent is paid once, not per collective. An optimization
	 * barrier after each keeps them apart, as nccl-tests runs one collective at a time: the
	 * compiler would otherwise combine them into one collective of all their bytes. Only the
	 * last result is kept; the others are temporaries that share one region.
	 */
	int total = o->warmup + o->iters;
	pe_tensor *y = NULL;
	/* The first step warms up (first touch of the buffers); the second is timed. */
	for (int pass = 0; pass < 2; pass++) {
		for (int it = 0; it < total; it++) {
			pe_release(y);
			y = record(c, op, x, g, world);
			if (y != NULL && pe_optimization_barrier(&y, 1) != PE_OK) {
				pe_release(y);
				y = NULL;
			}
			if (y == NULL) /* reported below */
				break;
		}
		if (y == NULL || pe_mark_step(c) != PE_OK) {
			fprintf(stderr, "podemu bench: %s of %lld bytes: %s\n", op_names[op],
			        (long long)bytes, pe_last_error(c));
			pe_release(y);
			pe_release(x);
			return -1;
		}
	}

	const char **algos = calloc((size_t)total, sizeof(char *));
	pe_last_step_collectives(c, NULL, algos, total);
	/*
	 * The timed iterations' span on the slowest core, as nccl-tests times its loop on each
	 * rank: summing each collective's slowest core would count twice a core's wait for another
	 * that was still in the collective before.
	 */
	int64_t span = pe_last_step_collectives_span(c, o->warmup, total - 1);
	double total_us = span > 0 ? (double)span : 0; /* 0: no core reported its times */
	const char *algo = algos != NULL && algos[total - 1] ? algos[total - 1] : "";
	free(algos);

	row->op = op;
	row->count = op == B_AG ? out_elems : in_elems;

	row->bytes = row->count * t->size;
	row->time_us = total_us / o->iters;
	row->algbw = row->time_us > 0 ? (double)row->bytes / row->time_us / 1e3 : 0;
	row->busbw = row->algbw * bus_factor(op, op == B_PERMUTE ? 2 : n);
	row->peak_temp = pe_last_step_scratch_bytes(c, 0);
	pe_last_step_receive(c, &row->receive);
	row->algorithm = algo;
	row->checked = o->check;
	row->ok = 1;
	if (o->check) {
		unsigned char *got = malloc((size_t)(out_elems ? out_elems : 1) * (size_t)t->size);
		for (int r = 0; r < world && row->ok; r++) {
			int rv = pe_fetch(y, r, got, (size_t)out_elems * (size_t)t->size);
			if (rv == PE_FAILED_PRECONDITION) {
				row->checked = 0;
				break;
			}
			row->ok = rv == PE_OK &&
			          check_core(op, mg, world, r, t, got, in_elems, out_elems);
		}
		free(got);
	}
	pe_release(y);
	pe_release(x);
	return 0;
}

int bench_run(pe_client *c, const struct bench_options *o)
{
	int world = pe_world_size(c);
	/* Without bytes a collective moves nothing: its bandwidth would be a made-up number. */
	bool no_bytes = strcmp(pe_backing(c), "none") == 0;
	if (no_bytes && !o->no_bytes) {
		fprintf(stderr,
		        "podemu bench: FAILED_PRECONDITION: the pod runs with --backing none: "
		        "collectives move no bytes, so their bandwidth would mean nothing "
		        "(--no-bytes times them anyway, every row marked)\n");
		return 2;
	}
	int enabled[B_COUNT] = {0};
	char *ops = strdup(o->ops);
	for (char *tok = strtok(ops, ","); tok != NULL; tok = strtok(NULL, ",")) {
		int found = 0;
		for (int k = 0; k < B_COUNT; k++)
			if (strcmp(tok, op_names[k]) == 0)
				enabled[k] = found = 1;
		if (!found) {
			fprintf(stderr, "podemu bench: unknown op '%s'\n", tok);
			free(ops);
			return 2;
		}
	}
	free(ops);
	const struct bench_dtype *t = dtypes;
	while (t->name != NULL && strcmp(t->name, o->dtype) != 0)
		t++;
	if (t->name == NULL) {
		fprintf(stderr, "podemu bench: --dtype must be f32, bf16 or s32\n");
		return 2;
	}
	struct member_groups mg = {0};
	if (resolve_groups(&mg, o, world) != ST_OK)
		return 2;
	pe_groups *g = NULL;
	if (o->mesh != NULL) {
		if (pe_set_mesh(c, o->mesh) != PE_OK ||
		    (g = pe_groups_axis(c, o->axis ? o->axis : "")) == NULL) {
			fprintf(stderr, "podemu bench: %s\n", pe_last_error(c));
			return 2;
		}
	} else if (o->groups != NULL && (g = pe_groups_parse(c, o->groups)) == NULL) {
		fprintf(stderr, "podemu bench: %s\n", pe_last_error(c));
		return 2;
	}
	if (!o->json) {
		printf("# podemu bench: %s, %d cores, group size %d, %s, %d iters, %d warmup\n",
		       pe_topology(c), world, mg.n, t->name, o->iters, o->warmup);
		printf("# %-18s %12s %12s %10s %9s %9s %12s %12s %8s %s\n", "op", "size(B)",
		       "count", "time(us)", "algbw", "busbw", "peak_temp(B)", "receive(B)", "check",
		       "algorithm");
		printf("# %-18s %12s %12s %10s %9s %9s %12s %12s %8s\n", "", "", "(elements)", "",
		       "(GB/s)", "(GB/s)", "per core", "per core", "");
	} else {
		printf("{\"world_size\": %d, \"group_size\": %d, \"rows\": [", world, mg.n);
	}
	int first = 1, rc = 0, rows = 0, done = 0;
	for (int k = 0; k < B_COUNT; k++)
		for (int64_t bytes = o->min_bytes; enabled[k] && bytes <= o->max_bytes;
		     bytes *= o->factor) {
			rows++;
			if (o->factor < 2)
				break;
		}
	progress_enable(o->json);
	for (int k = 0; k < B_COUNT; k++) {
		if (!enabled[k])
			continue;
		for (int64_t bytes = o->min_bytes; bytes <= o->max_bytes; bytes *= o->factor) {
			struct row row;
			progress_show("podemu bench: row %d of %d (%s, %lld bytes)", ++done, rows,
			              op_names[k], (long long)bytes);
			int failed =
			    run_one(c, o, t, (enum bench_op)k, bytes, g, &mg, no_bytes, &row);
			progress_clear();
			if (failed != 0) {
				rc = 1;
				break;
			}
			if (row.checked && !row.ok)
				rc = 1;
			const char *check = !row.checked ? "-" : row.ok ? "ok" : "WRONG";
			if (o->json) {
				printf("%s{\"op\": \"%s\", \"bytes\": %lld, \"count\": %lld, "
				       "\"time_us\": %.1f, \"algbw_gbps\": %.3f, \"busbw_gbps\": "
				       "%.3f, "
				       "\"peak_temp_bytes\": %lld, \"receive_bytes\": %lld, "
				       "\"receive_peak_host_bytes\": %lld, "
				       "\"receive_outside_chunks\": %lld, \"checked\": %s, \"ok\": "
				       "%s, "
				       "\"algorithm\": \"%s\", \"no_bytes\": %s}",
				       first ? "" : ", ", op_names[k], (long long)row.bytes,
				       (long long)row.count, row.time_us, row.algbw, row.busbw,
				       (long long)row.peak_temp,
				       (long long)row.receive.reserved_bytes,
				       (long long)row.receive.peak_host_bytes,
				       (long long)row.receive.outside_chunks,
				       row.checked ? "true" : "false", row.ok ? "true" : "false",
				       row.algorithm, no_bytes ? "true" : "false");
			} else {
				printf("  %-18s %12lld %12lld %10.1f %9.3f %9.3f %12lld %12lld %8s "
				       "%s%s\n",
				       op_names[k], (long long)row.bytes, (long long)row.count,
				       row.time_us, row.algbw, row.busbw, (long long)row.peak_temp,
				       (long long)row.receive.reserved_bytes, check, row.algorithm,
				       no_bytes ? " (no bytes moved)" : "");
			}
			fflush(stdout);
			first = 0;
			if (o->factor < 2)
				break;
		}
	}
	if (o->json)
		printf("]}\n");
	free(mg.group_of);
	free(mg.pos_of);
	free(mg.ids);
	return rc;
}
