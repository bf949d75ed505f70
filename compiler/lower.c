#include "lower_build.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collective.h"
#include "graph.h"

void lower_place_groups(unsigned char *placement, const struct coll_groups *g, int cph, int *count)
{
	for (int k = 0; k < g->num_groups; k++) {
		const int64_t *m = g->ids + g->start[k];
		int n = g->size[k], hosts = 0;
		bool one_host = true, distinct = true;
		for (int j = 0; j < n; j++) {
			one_host &= m[j] / cph == m[0] / cph;
			hosts += count[m[j] / cph]++ == 0;
		}
		bool uniform = true;
		for (int j = 0; j < n; j++) {
			distinct &= count[m[j] / cph] == 1;
			uniform &= count[m[j] / cph] == count[m[0] / cph];
		}
		int per_host = n > 0 ? count[m[0] / cph] : 0;
		for (int j = 0; j < n; j++)
			count[m[j] / cph] = 0;
		/* Several hosts with several members each, as many on each: intra-, then
		 * inter-host (split_by_host's grid). */
		bool layered = !one_host && n <= SPLIT_MAX && hosts <= 64 && uniform && hosts > 1 &&
		               per_host > 1;
		placement[k] = (one_host ? PLACED_ONE_HOST : 0) |
		               (!one_host && distinct ? PLACED_ONE_PER_HOST : 0) |
		               (layered ? PLACED_LAYERED : 0);
	}
}

struct group_shape lower_group_shape(unsigned char placement, int n, const struct shape *res, int d)
{
	int f[LOWER_TORUS_DIMS_MAX];
	return (struct group_shape){.one_host = placement & PLACED_ONE_HOST,
	                            .one_per_host = placement & PLACED_ONE_PER_HOST,
	                            .layered = placement & PLACED_LAYERED,
	                            .contiguous = blocks_contiguous(res, d),
	                            .torus = lower_torus_dims(n, f) > 1};
}

void lower_end(struct lowering *L)
{
	for (size_t k = 0; L->groups != NULL && k < L->n; k++)
		coll_groups_free(&L->groups[k]);
	free(L->groups);
	L->groups = NULL;
}

int lower_begin(struct lowering *L, struct arena *a, const Podemu__Graph *g,
                const struct shape *shapes, int world, int cores_per_host,
                const char *forced_algorithm, struct status *st)
{
	*L = (struct lowering){.g = g,
	                       .shapes = shapes,
	                       .world = world,
	                       .cph = cores_per_host,
	                       .forced = forced_algorithm};
	if (world <= 0 || cores_per_host <= 0 || world % cores_per_host != 0)
		return status_set(st, ST_INVALID_ARGUMENT, "lower: a pod of %d cores, %d per host",
		                  world, cores_per_host);
	size_t total = graph_total_nodes(g);
	if ((L->first = graph_first_ids(g, a)) == NULL ||
	    (L->ids = arena_calloc(a, total + 1, sizeof(int))) == NULL ||
	    (L->groups = calloc(total + 1, sizeof(*L->groups))) == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	/* Every collective of the graph, in called computations too (ids across the graph). */
	for (size_t i = 0; i < total; i++) {
		int comp;
		const Podemu__Node *node = graph_node_at(g, L->first, (int)i, &comp);
		enum opcode op = opcode_parse(node->opcode);
		if (!opcode_is_collective(op))
			continue;
		L->ids[L->n] = (int)i;
		char label[64];
		snprintf(label, sizeof(label), "%s (node %zu)", node->opcode, i);
		int rv = op == OP_COLLECTIVE_PERMUTE
		             ? ST_OK
		             : coll_groups_resolve(&L->groups[L->n], node, g->mesh, g->n_mesh,
		                                   world, op == OP_ALL_REDUCE, label, st);
		L->n++; /* freed by lower_end whether resolved or not */
		if (rv != ST_OK) {
			lower_end(L);
			return rv;
		}
	}
	/* Where each collective's groups lie, once for all hosts. */
	int *seen = calloc((size_t)(world / cores_per_host) + 1, sizeof(int));
	L->placement = arena_calloc(a, L->n + 1, sizeof(*L->placement));
	for (size_t k = 0; seen != NULL && L->placement != NULL && k < L->n; k++) {
		L->placement[k] = arena_calloc(a, (size_t)L->groups[k].num_groups + 1, 1);
		if (L->placement[k] == NULL)
			break;
		lower_place_groups(L->placement[k], &L->groups[k], cores_per_host, seen);
	}
	bool done =
	    seen != NULL && L->placement != NULL && (L->n == 0 || L->placement[L->n - 1] != NULL);
	free(seen);
	if (!done) {
		lower_end(L);
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	}
	return ST_OK;
}

int lower_host(Podemu__CollectiveSchedule ***out, size_t *n_out, struct arena *a,
               const struct lowering *lw, int host, struct status *st)
{
	int cph = lw->cph, world = lw->world;
	const char *forced_algorithm = lw->forced;
	if (host < 0 || host >= world / cph)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "lower: host %d of a pod of %d cores, %d per host", host, world,
		                  cph);
	Podemu__CollectiveSchedule **list = arena_calloc(a, lw->n * (size_t)cph + 1, sizeof(*list));
	if (list == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	size_t at = 0;
	for (size_t ci = 0; ci < lw->n; ci++) {
		size_t i = (size_t)lw->ids[ci];
		int comp;
		const Podemu__Node *node = graph_node_at(lw->g, lw->first, (int)i, &comp);
		enum opcode op = opcode_parse(node->opcode);
		int base = comp < 0 ? 0 : lw->first[comp];
		const struct shape *in = &lw->shapes[base + node->operands[0]],
		                   *res = &lw->shapes[i];
		const struct coll_groups groups = lw->groups[ci];
		for (int c = 0; c < cph; c++) {
			int me = host * cph + c;
			struct builder b = {.a = a};
			const char *algo = "direct";
			if (op == OP_COLLECTIVE_PERMUTE) {
				lower_permute(&b, node, me, in);
			} else {
				int gi = groups.group_of[me], n = groups.size[gi];
				int p = groups.position_of[me];
				const int64_t *m = groups.ids + groups.start[gi];
				int d = node->n_dimensions ? (int)node->dimensions[0] : 0;
				int f[LOWER_TORUS_DIMS_MAX], k = lower_torus_dims(n, f);
				struct group_shape gs =
				    lower_group_shape(lw->placement[ci][gi], n, res, d);
				int64_t local[SPLIT_MAX], across[SPLIT_MAX];
				int grid[SPLIT_MAX];
				int L = 0, H = 0, lp = 0, h = 0;
				bool layered = gs.layered &&
				               (op == OP_ALL_REDUCE || op == OP_ALL_GATHER) &&
				               lower_split_by_host(m, n, cph, me, local, across,
				                                   grid, &L, &H, &lp, &h);
				gs.layered = layered;
				algo = lower_choose(op, n, shape_bytes(in), gs, forced_algorithm);
				bool hier = strcmp(algo, "hierarchical") == 0;
				bool doubling = strcmp(algo, "recursive-doubling") == 0;
				if (op == OP_ALL_GATHER && strcmp(algo, "torus") == 0)
					lower_all_gather_torus(&b, m, n, p, d, f, k, in, res);
				else if (op == OP_ALL_GATHER && hier)
					lower_all_gather_hierarchical(&b, local, L, lp, across, H,
					                              h, grid, n, d, in, res);
				else if (op == OP_ALL_GATHER &&
				         strcmp(algo, "bidirectional-ring") == 0)
					lower_all_gather_bidirectional(&b, m, n, p, d, in, res);
				else if (op == OP_ALL_GATHER)
					lower_all_gather(&b, m, n, p, d, in, res,
					                 strcmp(algo, "direct") == 0, doubling);
				else if (op == OP_REDUCE_SCATTER && strcmp(algo, "torus") == 0)
					lower_reduce_scatter_torus(&b, m, n, p, d, f, k, in, res);
				else if (op == OP_REDUCE_SCATTER)
					strcmp(algo, "direct") == 0
					    ? lower_reduce_scatter_direct(&b, m, n, p, d, in, res)
					    : lower_reduce_scatter(&b, m, n, p, d, in, res);
				else if (hier)
					lower_all_reduce_hierarchical(&b, local, L, lp, across, H,
					                              h, in);
				else if (op == OP_ALL_REDUCE && strcmp(algo, "torus") == 0)
					lower_all_reduce_torus(&b, m, n, p, f, k, in);
				else if (op == OP_ALL_REDUCE && strcmp(algo, "direct") == 0)
					lower_all_reduce_direct(&b, m, n, p, in);
				else if (op == OP_ALL_REDUCE)
					lower_all_reduce(&b, m, n, p, in, doubling);
				else
					lower_all_to_all(&b, m, n, p, (int)node->split_dimension,
					                 (int)node->concat_dimension, in, res);
			}
			Podemu__CollectiveSchedule *s = arena_alloc(a, sizeof(*s));
			if (b.failed || s == NULL)
				return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
			podemu__collective_schedule__init(s);
			s->node = (int32_t)i;
			s->ordinal = me;
			s->algorithm = (char *)algo;
			s->group_size =
			    op == OP_COLLECTIVE_PERMUTE ? 0 : groups.size[groups.group_of[me]];
			s->phases = b.phases;
			s->n_phases = b.n;
			list[at++] = s;
		}
	}
	*out = list;
	*n_out = at;
	return ST_OK;
}

int lower_collectives(Podemu__CollectiveSchedule ***out, size_t *n_out, struct arena *a,
                      const Podemu__Graph *g, const struct shape *shapes, int world,
                      int cores_per_host, int host, const char *forced_algorithm, struct status *st)
{
	struct lowering L;
	int rv = lower_begin(&L, a, g, shapes, world, cores_per_host, forced_algorithm, st);
	if (rv == ST_OK)
		rv = lower_host(out, n_out, a, &L, host, st);
	lower_end(&L);
	return rv;
}
