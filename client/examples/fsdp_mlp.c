/*
 * A two-layer MLP trained ZeRO-3 / FSDP style on a local pod, as torch_xla's FSDP runs it:
 * every parameter is flattened and each core keeps one 1-D shard of it; each training step
 * all-gathers the full parameters for the forward pass (and layer 2's again for the backward
 * pass), reduce-scatters the gradients, and applies SGD to the shards, with one mark_step per
 * step. Each core trains on its own synthetic batch; the loss is the mean over all of them.
 *
 * The same 20 steps run twice: with optimization barriers between the layers (what torch_xla's
 * FSDP inserts) and without. Without them nothing stops the coordinator's combiner from
 * merging every parameter all-gather of the step into the first one, so all full parameters
 * are live at once; with them each layer's gather waits for its layer. Each step prints the
 * loss, the loss of the same model trained on the host on one core, and the peak HBM per core.
 *
 *   podemu up --hosts 2 --cores-per-host 4 --hbm 1G
 *   podemu-example-fsdp-mlp [STEPS]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "podemu/podemu.h"

enum { D = 128, H = 256, O = 128, B = 16 }; /* input, hidden, output, batch per core */
#define LR 0.5f

/* One parameter: its full host value (for the reference) and its shard on the pod. */
struct param {
	int64_t size;
	float *host;
	pe_tensor *shard;
};

/* A deterministic pseudo-random value in [-1, 1). */
static float uniform(unsigned *state)
{
	*state = *state * 1664525u + 1013904223u;
	return (float)((*state >> 8) & 0xffffff) / 8388608.0f - 1.0f;
}

/* Uploads core r's slice of p->host as its shard. */
static int upload_shards(pe_client *c, struct param *p, int world)
{
	int64_t n = p->size / world;
	const void **per_core = calloc((size_t)world, sizeof(void *));
	if (per_core == NULL)
		return -1;
	for (int r = 0; r < world; r++)
		per_core[r] = p->host + r * n;
	pe_release(p->shard);
	p->shard = pe_upload(c, PE_F32, &n, 1, per_core);
	free(per_core);
	return p->shard ? 0 : -1;
}

/* The full parameter, gathered from the shards, in shape dims. */
static pe_tensor *gather(struct param *p, const int64_t *dims, int rank)
{
	pe_tensor *flat = pe_all_gather(p->shard, 0);
	pe_tensor *full = pe_reshape(flat, dims, rank);
	pe_release(flat);
	return full;
}

static pe_tensor *full(pe_client *c, const int64_t *dims, int rank, double v)
{
	return pe_full(c, PE_F32, dims, rank, v);
}

/* In place: tensors[i] becomes the barrier's i-th output (torch_xla's optimization_barrier_). */
static int barrier(pe_tensor **tensors, int n, int on)
{
	return on ? pe_optimization_barrier(tensors, n) : PE_OK;
}

struct model {
	struct param w1, b1, w2, b2;
};

/*
 * result, after dropping a and b (either may be NULL): every intermediate is released once
 * recorded, or it would stay alive and become an output of the step, as in torch_xla.
 */
static pe_tensor *done(pe_tensor *result, pe_tensor *a, pe_tensor *b)
{
	pe_release(a);
	pe_release(b);
	return result;
}

/* Records one training step; returns the pending loss, or NULL. */
static pe_tensor *record_step(pe_client *c, struct model *m, pe_tensor *x, pe_tensor *t, int world,
                              int barriers)
{
	const int64_t bh[] = {B, H}, bo[] = {B, O}, dh[] = {D, H}, ho[] = {H, O}, hv[] = {H},
	              ov[] = {O};
	const int64_t swap[] = {1, 0}, cols[] = {1}, rows[] = {0}, both[] = {0, 1};
	const double scale = 2.0 / ((double)B * world * O); /* d(mean squared error)/dy */
	pe_tensor *p, *q;

	/* Forward, layer 1. */
	pe_tensor *w1 = gather(&m->w1, dh, 2), *b1 = gather(&m->b1, hv, 1);
	p = done(pe_dot(x, w1), w1, NULL);
	q = done(pe_broadcast(b1, bh, 2, cols), b1, NULL);
	pe_tensor *z1 = done(pe_add(p, q), p, q);
	pe_tensor *zero_bh = full(c, bh, 2, 0);
	pe_tensor *mask = pe_compare(z1, zero_bh, "GT");
	pe_tensor *h = done(pe_select(mask, z1, zero_bh), z1, NULL);

	/* Forward, layer 2, after a barrier: its gathers cannot move up into layer 1. */
	if (barrier(&h, 1, barriers) != PE_OK)
		return NULL;
	pe_tensor *w2 = gather(&m->w2, ho, 2), *b2 = gather(&m->b2, ov, 1);
	p = done(pe_dot(h, w2), w2, NULL);
	q = done(pe_broadcast(b2, bo, 2, cols), b2, NULL);
	pe_tensor *y = done(pe_add(p, q), p, q);
	pe_tensor *diff = done(pe_subtract(y, t), y, NULL);
	pe_tensor *sq = pe_multiply(diff, diff);
	pe_tensor *local = done(pe_reduce_sum(sq, both, 2), sq, NULL);
	pe_tensor *loss = done(
	    pe_all_reduce(local, PE_REDUCE_SUM, 1.0 / ((double)B * world * O), NULL), local, NULL);

	/* Backward, layer 2, after a barrier: FSDP gathers w2 again (the forward copy is gone). */
	q = full(c, bo, 2, scale);
	pe_tensor *dy = done(pe_multiply(diff, q), diff, q);
	if (barrier(&dy, 1, barriers) != PE_OK)
		return NULL;
	p = pe_transpose(h, swap, 2);
	pe_tensor *dw2 = done(pe_dot(p, dy), p, NULL);
	pe_tensor *db2 = pe_reduce_sum(dy, rows, 1);
	p = gather(&m->w2, ho, 2);
	q = done(pe_transpose(p, swap, 2), p, NULL);
	p = done(pe_dot(dy, q), q, dy);
	pe_tensor *dz1 = done(pe_select(mask, p, zero_bh), p, mask);
	pe_release(zero_bh);
	pe_release(h);

	/* Backward, layer 1. */
	p = pe_transpose(x, swap, 2);
	pe_tensor *dw1 = done(pe_dot(p, dz1), p, NULL);
	pe_tensor *db1 = done(pe_reduce_sum(dz1, rows, 1), dz1, NULL);

	/* Gradients summed over cores and scattered into shards; SGD on the shards. */
	struct param *ps[] = {&m->w1, &m->b1, &m->w2, &m->b2};
	pe_tensor *grads[] = {dw1, db1, dw2, db2};
	for (int k = 0; k < 4; k++) {
		int64_t flat = ps[k]->size, shard = flat / world;
		p = done(pe_reshape(grads[k], &flat, 1), grads[k], NULL);
		pe_tensor *gs = done(pe_reduce_scatter(p, PE_REDUCE_SUM, 0, NULL), p, NULL);
		q = full(c, &shard, 1, LR);
		p = done(pe_multiply(gs, q), gs, q);
		pe_tensor *updated = done(pe_subtract(ps[k]->shard, p), ps[k]->shard, p);
		ps[k]->shard = updated;
	}
	return loss;
}

/* The same model, data and SGD on the host, one core, the whole batch at once. */
static float host_step(struct model *m, const float *x, const float *t, int world)
{
	int n = B * world;
	float *z1 = calloc((size_t)n * H, sizeof(float)), *y = calloc((size_t)n * O, sizeof(float));
	float *dy = calloc((size_t)n * O, sizeof(float)),
	      *dz = calloc((size_t)n * H, sizeof(float));
	float *gw1 = calloc((size_t)D * H, sizeof(float)),
	      *gw2 = calloc((size_t)H * O, sizeof(float));
	float gb1[H] = {0}, gb2[O] = {0};
	double loss = 0;
	for (int i = 0; i < n; i++) {
		for (int j = 0; j < H; j++) {
			double s = 0;
			for (int p = 0; p < D; p++)
				s += (double)x[i * D + p] * m->w1.host[p * H + j];
			float v = (float)s + m->b1.host[j];
			z1[i * H + j] = v > 0 ? v : 0;
		}
		for (int j = 0; j < O; j++) {
			double s = 0;
			for (int p = 0; p < H; p++)
				s += (double)z1[i * H + p] * m->w2.host[p * O + j];
			float d = ((float)s + m->b2.host[j]) - t[i * O + j];
			y[i * O + j] = d;
			loss += (double)d * d;
			dy[i * O + j] = d * (float)(2.0 / ((double)n * O));
		}
	}
	for (int i = 0; i < n; i++)
		for (int p = 0; p < H; p++) {
			double s = 0;
			for (int j = 0; j < O; j++)
				s += (double)dy[i * O + j] * m->w2.host[p * O + j];
			dz[i * H + p] = z1[i * H + p] > 0 ? (float)s : 0;
		}
	for (int i = 0; i < n; i++) {
		for (int p = 0; p < H; p++)
			for (int j = 0; j < O; j++)
				gw2[p * O + j] += z1[i * H + p] * dy[i * O + j];
		for (int j = 0; j < O; j++)
			gb2[j] += dy[i * O + j];
		for (int p = 0; p < D; p++)
			for (int j = 0; j < H; j++)
				gw1[p * H + j] += x[i * D + p] * dz[i * H + j];
		for (int j = 0; j < H; j++)
			gb1[j] += dz[i * H + j];
	}
	for (int k = 0; k < D * H; k++)
		m->w1.host[k] -= LR * gw1[k];
	for (int k = 0; k < H * O; k++)
		m->w2.host[k] -= LR * gw2[k];
	for (int k = 0; k < H; k++)
		m->b1.host[k] -= LR * gb1[k];
	for (int k = 0; k < O; k++)
		m->b2.host[k] -= LR * gb2[k];
	free(z1), free(y), free(dy), free(dz), free(gw1), free(gw2);
	return (float)(loss / ((double)n * O));
}

static void init_model(struct model *m, unsigned seed)
{
	struct param *ps[] = {&m->w1, &m->b1, &m->w2, &m->b2};
	int64_t sizes[] = {D * H, H, H * O, O};
	float scales[] = {1.0f / sqrtf(D), 0.1f, 1.0f / sqrtf(H), 0.1f};
	for (int k = 0; k < 4; k++) {
		ps[k]->size = sizes[k];
		ps[k]->host = malloc((size_t)sizes[k] * sizeof(float));
		ps[k]->shard = NULL;
		for (int64_t i = 0; i < sizes[k]; i++)
			ps[k]->host[i] = uniform(&seed) * scales[k];
	}
}

static void free_model(struct model *m)
{
	struct param *ps[] = {&m->w1, &m->b1, &m->w2, &m->b2};
	for (int k = 0; k < 4; k++) {
		free(ps[k]->host);
		pe_release(ps[k]->shard);
	}
}

/* 20 steps (or steps) with or without barriers; returns the worst relative loss error, or -1. */
static double train(pe_client *c, int steps, int barriers, int64_t *peak_out)
{
	int world = pe_world_size(c);
	struct model pod, host;
	init_model(&pod, 7);
	init_model(&host, 7);
	struct param *ps[] = {&pod.w1, &pod.b1, &pod.w2, &pod.b2};
	for (int k = 0; k < 4; k++)
		if (upload_shards(c, ps[k], world) != 0)
			return -1;
	/* Synthetic regression: targets from a fixed random linear map of the inputs. */
	unsigned seed = 11;
	int n = B * world;
	float *x = malloc((size_t)n * D * sizeof(float)), *t = calloc((size_t)n * O, sizeof(float));
	float *a = malloc((size_t)D * O * sizeof(float));
	for (int i = 0; i < n * D; i++)
		x[i] = uniform(&seed);
	for (int i = 0; i < D * O; i++)
		a[i] = uniform(&seed) / sqrtf(D);
	for (int i = 0; i < n; i++)
		for (int j = 0; j < O; j++)
			for (int p = 0; p < D; p++)
				t[i * O + j] += x[i * D + p] * a[p * O + j];
	const void **xs = calloc((size_t)world, sizeof(void *)),
	           **ts = calloc((size_t)world, sizeof(void *));
	for (int r = 0; r < world; r++)
		xs[r] = x + r * B * D, ts[r] = t + r * B * O;
	const int64_t bd[] = {B, D}, bo[] = {B, O};
	pe_tensor *xt = pe_upload(c, PE_F32, bd, 2, xs), *tt = pe_upload(c, PE_F32, bo, 2, ts);
	double worst = 0;
	int64_t peak = 0;
	for (int s = 0; s < steps && worst >= 0; s++) {
		pe_tensor *loss = record_step(c, &pod, xt, tt, world, barriers);
		pe_step_plan plan;
		if (loss == NULL || pe_plan_step(c, &plan) != PE_OK || pe_mark_step(c) != PE_OK) {
			fprintf(stderr, "step %d: %s\n", s, pe_last_error(c));
			worst = -1;
			break;
		}
		float got;
		int rv = pe_fetch(loss, 0, &got, sizeof(got));
		pe_release(loss);
		float want = host_step(&host, x, t, world);
		if (rv != PE_OK) {
			fprintf(stderr, "fetch: %s\n", pe_last_error(c));
			worst = -1;
			break;
		}
		double err = fabs((double)got - want) / fmax(fabs(want), 1e-12);
		worst = err > worst ? err : worst;
		peak = plan.peak_bytes > peak ? plan.peak_bytes : peak;
		printf("%s step %2d: loss %.6f (host %.6f)  peak HBM per core %lld bytes "
		       "(%d collectives combined, %d nodes fused)\n",
		       barriers ? "barriers   " : "no barriers", s + 1, got, want,
		       (long long)plan.peak_bytes, plan.combined_collectives, plan.fused_nodes);
	}
	*peak_out = peak;
	pe_release(xt);
	pe_release(tt);
	free_model(&pod);
	free_model(&host);
	free(x), free(t), free(a), free(xs), free(ts);
	return worst;
}

int main(int argc, char **argv)
{
	int steps = argc > 1 ? atoi(argv[1]) : 20;
	pe_client *c;
	if (pe_connect(&c, NULL) != PE_OK) {
		fprintf(stderr, "connect: %s\n", pe_connect_error());
		return 1;
	}
	int world = pe_world_size(c);
	if (H % world != 0 || O % world != 0) {
		fprintf(stderr, "the pod has %d cores; this model shards over 1, 2, ..., 128\n",
		        world);
		return 1;
	}
	int64_t peak_barriers, peak_plain;
	double err_b = train(c, steps, 1, &peak_barriers);
	pe_memory_info mem;
	int64_t measured_b = pe_memory_info_get(c, 0, &mem) == PE_OK ? mem.peak_bytes_in_use : -1;
	double err_p = err_b < 0 ? -1 : train(c, steps, 0, &peak_plain);
	int64_t measured_p = pe_memory_info_get(c, 0, &mem) == PE_OK ? mem.peak_bytes_in_use : -1;
	pe_disconnect(c);
	if (err_b < 0 || err_p < 0)
		return 1;
	printf("peak HBM per core: %lld bytes with barriers, %lld without (core 0 measured %lld "
	       "and %lld)\n",
	       (long long)peak_barriers, (long long)peak_plain, (long long)measured_b,
	       (long long)measured_p);
	printf("largest loss difference from the host: %.2g (relative)\n",
	       err_b > err_p ? err_b : err_p);
	return err_b > 1e-4 || err_p > 1e-4;
}
