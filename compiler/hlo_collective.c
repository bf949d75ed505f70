#include "hlo_collective.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collective.h"
#include "layout.h"

enum opcode hlo_collective_op(const struct hlo_instruction *in)
{
	if (hlo_is(in, "all-gather") || hlo_is(in, "all-gather-start"))
		return OP_ALL_GATHER;
	if (hlo_is(in, "all-reduce") || hlo_is(in, "all-reduce-start"))
		return OP_ALL_REDUCE;
	if (hlo_is(in, "reduce-scatter"))
		return OP_REDUCE_SCATTER;
	if (hlo_is(in, "all-to-all"))
		return OP_ALL_TO_ALL;
	if (hlo_is(in, "collective-permute") || hlo_is(in, "collective-permute-start"))
		return OP_COLLECTIVE_PERMUTE;
	return OP_INVALID;
}

/* An async start's result is its tuple's element 1 (element 0 is the operand). */
static const struct hlo_shape *result_of(const struct hlo_instruction *in)
{
	return in->shape.type == HT_TUPLE && in->shape.n_tuple > 1 ? &in->shape.tuple[1]
	                                                           : &in->shape;
}

static const struct hlo_shape *operand_of(const struct hlo_instruction *in)
{
	return in->n_operands > 0 ? &in->operands[0]->shape : result_of(in);
}

int64_t hlo_collective_sent(const struct hlo_instruction *in, int n)
{
	if (n <= 1)
		return 0;
	int64_t out = layout_bytes(result_of(in), false);
	int64_t operand = in->n_operands > 0 ? layout_bytes(operand_of(in), false) : 0;
	switch (hlo_collective_op(in)) {
	case OP_ALL_GATHER:
	case OP_ALL_TO_ALL:
		return out / n * (n - 1);
	case OP_ALL_REDUCE:
		return out / n * 2 * (n - 1);
	case OP_REDUCE_SCATTER:
		return operand / n * (n - 1);
	case OP_COLLECTIVE_PERMUTE:
		return operand;
	default:
		return 0;
	}
}

static void pod_shape(struct shape *out, const struct hlo_shape *h);

/* The largest workspace over groups g, each with the algorithm lower_choose gives it. */
static int workspace_of_groups(struct coll_workspace *out, const struct coll_groups *g,
                               enum opcode op, int64_t in_bytes, int64_t out_bytes, bool strided,
                               const struct hlo_shape *result, int d, int world, int cph,
                               int64_t chunk_bytes, int window, const char *forced,
                               struct status *st)
{
	unsigned char *placement = calloc((size_t)g->num_groups + 1, 1);
	int *count = calloc((size_t)(world / cph) + 1, sizeof(int));
	if (placement == NULL || count == NULL) {
		free(placement);
		free(count);
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	}
	lower_place_groups(placement, g, cph, count);
	struct shape res;
	pod_shape(&res,
	          result->type == HT_TUPLE && result->n_tuple > 0 ? &result->tuple[0] : result);
	for (int k = 0; k < g->num_groups; k++) {
		int n = g->size[k];
		const char *algo = lower_choose(
		    op, n, in_bytes, lower_group_shape(placement[k], n, &res, d), forced);
		struct coll_workspace w =
		    lower_workspace(op, n, in_bytes, out_bytes, strided, chunk_bytes, window, algo);
		if (w.staging + w.work > out->staging + out->work)
			*out = w;
	}
	free(placement);
	free(count);
	return ST_OK;
}

int hlo_collective_workspace(struct coll_workspace *out, const struct hlo_instruction *in,
                             int world, int cores_per_host, int64_t chunk_bytes, int window,
                             const char *forced_algorithm, struct status *st)
{
	memset(out, 0, sizeof(*out));
	enum opcode op = hlo_collective_op(in);
	const struct hlo_shape *result = result_of(in), *operand = operand_of(in);
	const struct hlo_shape *blocks = op == OP_ALL_GATHER ? result : operand;
	int d = in->n_dimensions > 0 ? (int)in->dimensions[0] : 0;
	bool strided = op != OP_ALL_REDUCE && blocks->type != HT_TUPLE &&
	               lower_blocks_strided(blocks->dims, blocks->rank, d);
	int64_t in_bytes = layout_bytes(operand, false), out_bytes = layout_bytes(result, false);
	if (op == OP_COLLECTIVE_PERMUTE || op == OP_INVALID)
		return ST_OK;
	/* Every group runs the algorithm its size and place choose: the most any of them needs. */
	const char *text = in->replica_groups;
	bool all = text == NULL || strcmp(text, "{}") == 0 || strcmp(text, "{{}}") == 0;
	struct coll_groups g = {0};
	int start = 0, size = world, rv = ST_OK;
	int64_t *ids = NULL;
	if (all) { /* one group of every core */
		if ((ids = malloc((size_t)world * sizeof(int64_t))) == NULL)
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		for (int k = 0; k < world; k++)
			ids[k] = k;
		g = (struct coll_groups){
		    .num_groups = 1, .start = &start, .size = &size, .ids = ids};
	} else if ((rv = coll_groups_from_text(&g, text, world, op == OP_ALL_REDUCE, in->name,
	                                       st)) != ST_OK) {
		return rv;
	}
	rv = workspace_of_groups(out, &g, op, in_bytes, out_bytes, strided, result, d, world,
	                         cores_per_host, chunk_bytes, window, forced_algorithm, st);
	if (all)
		free(ids);
	else
		coll_groups_free(&g);
	return rv;
}

/*
 * An array as the pod's lowering sees it: its dimensions in a pod dtype of the same width (8
 * bytes: f32 with the minor dimension doubled; narrower than a byte: u8). Only sizes and
 * dimensions matter to where chunks go.
 */
static void pod_shape(struct shape *out, const struct hlo_shape *h)
{
	memset(out, 0, sizeof(*out));
	int bits = hlo_type_bits(h->type);
	out->dtype = h->type == HT_PRED ? DT_PRED
	             : bits <= 8        ? DT_U8
	             : bits == 16       ? DT_BF16
	                                : DT_F32;
	int skip = h->rank > SHAPE_MAX_RANK ? h->rank - SHAPE_MAX_RANK : 0;
	out->rank = h->rank - skip;
	for (int k = 0; k < out->rank; k++)
		out->dims[k] = h->dims[k + skip];
	for (int k = 0; k < skip && out->rank > 0; k++) /* leading dimensions folded */
		out->dims[0] *= h->dims[k];
	if (bits == 64 && out->rank == 0)
		out->dims[out->rank++] = 2;
	else if (bits == 64)
		out->dims[out->rank - 1] *= 2;
}

/* XLA's text of groups or pairs as the flat list and sizes a graph node carries. */
static int node_groups(Podemu__Node *n, const char *groups, const char *pairs, struct arena *a,
                       struct status *st)
{
	if (groups != NULL && (strcmp(groups, "{}") == 0 || strcmp(groups, "{{}}") == 0))
		groups = NULL; /* every replica, as the verifier reads it */
	const char *text = groups != NULL ? groups : pairs;
	if (text == NULL)
		return ST_OK;
	int64_t *ids;
	int *sizes, count, rv = coll_groups_parse(text, &ids, &sizes, &count, st);
	if (rv != ST_OK)
		return rv;
	int total = 0;
	for (int k = 0; k < count; k++)
		total += sizes[k];
	int64_t *kept = arena_calloc(a, (size_t)total + 1, sizeof(int64_t));
	Podemu__ReplicaGroup **list = arena_calloc(a, (size_t)count + 1, sizeof(*list));
	Podemu__ReplicaGroup *each = arena_calloc(a, (size_t)count + 1, sizeof(*each));
	rv = kept != NULL && list != NULL && each != NULL ? ST_OK : ST_RESOURCE_EXHAUSTED;
	if (rv == ST_OK)
		memcpy(kept, ids, (size_t)total * sizeof(int64_t));
	if (rv == ST_OK && groups == NULL) { /* a collective-permute's pairs */
		n->source_target_pairs = kept;
		n->n_source_target_pairs = (size_t)total;
	} else if (rv == ST_OK) {
		for (int k = 0, at = 0; k < count; at += sizes[k++]) {
			podemu__replica_group__init(&each[k]);
			each[k].replica_ids = kept + at;
			each[k].n_replica_ids = (size_t)sizes[k];
			list[k] = &each[k];
		}
		n->replica_groups = list;
		n->n_replica_groups = (size_t)count;
	}
	free(ids);
	free(sizes);
	return rv == ST_OK ? ST_OK : status_set(st, rv, "out of host memory");
}

/* A collective's array j as a parameter and the collective over it, nodes[at] and [at + 1]. */
static int collective_pair(Podemu__Node **nodes, struct shape *shapes, int at,
                           const struct hlo_instruction *in, int j, struct arena *a,
                           struct status *st)
{
	enum opcode op = hlo_collective_op(in);
	const struct hlo_shape *res = result_of(in);
	Podemu__Node *param = arena_alloc(a, sizeof(*param)), *node = arena_alloc(a, sizeof(*node));
	int32_t *operand = arena_alloc(a, sizeof(int32_t));
	if (param == NULL || node == NULL || operand == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	podemu__node__init(param);
	podemu__node__init(node);
	param->opcode = "parameter";
	node->opcode = (char *)opcode_name(op);
	*operand = at;
	node->operands = operand;
	node->n_operands = 1;
	node->n_dimensions = (size_t)in->n_dimensions;
	node->dimensions = in->dimensions;
	if (op == OP_ALL_TO_ALL && in->n_dimensions > 0)
		node->split_dimension = node->concat_dimension = in->dimensions[0];
	nodes[at] = param;
	nodes[at + 1] = node;
	pod_shape(&shapes[at], &in->operands[j]->shape);
	pod_shape(&shapes[at + 1], res->type == HT_TUPLE ? &res->tuple[j] : res);
	bool permute = op == OP_COLLECTIVE_PERMUTE;
	return node_groups(node, permute ? NULL : in->replica_groups,
	                   permute ? in->source_target_pairs : NULL, a, st);
}

/* The arrays m's collectives exchange, in the entry (entry true) or in called computations. */
static int count_collectives(const struct hlo_module *m, bool entry)
{
	int count = 0;
	for (int c = 0; c < m->n_computations; c++)
		for (int i = 0; entry == m->computations[c]->is_entry &&
		                i < m->computations[c]->n_instructions;
		     i++) {
			const struct hlo_instruction *in = m->computations[c]->instructions[i];
			const struct hlo_shape *res = result_of(in);
			if (hlo_collective_op(in) != OP_INVALID && in->replaced_by == NULL)
				count += res->type != HT_TUPLE           ? 1
				         : res->n_tuple < in->n_operands ? res->n_tuple
				                                         : in->n_operands;
		}
	return count;
}

/*
 * What makes two collective arrays lower alike (opcode, shapes, dimensions, groups or pairs),
 * as text, into key; returns its hash.
 */
static uint64_t collective_key(char *key, size_t len, const struct hlo_instruction *in, int j)
{
	const struct hlo_shape *res = result_of(in);
	char arg[256], out[256];
	hlo_shape_format(arg, sizeof(arg), &in->operands[j]->shape);
	hlo_shape_format(out, sizeof(out), res->type == HT_TUPLE ? &res->tuple[j] : res);
	int at = snprintf(key, len, "%d|%s|%s|%s|%s|", (int)hlo_collective_op(in), arg, out,
	                  in->replica_groups ? in->replica_groups : "",
	                  in->source_target_pairs ? in->source_target_pairs : "");
	for (int k = 0; k < in->n_dimensions && at > 0 && (size_t)at < len; k++)
		at += snprintf(key + at, len - (size_t)at, "%lld,", (long long)in->dimensions[k]);
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	for (const char *c = key; *c != '\0'; c++)
		h = (h ^ (unsigned char)*c) * 1099511628211ull;
	return h;
}

/* The distinct collective arrays seen so far, each with its node (ids by computation). */
struct seen {
	uint64_t *hash;
	char **key;
	int *node;
	int n;
};

/*
 * Adds the collective arrays of m's entry (entry true) or called computations to nodes from
 * *at on (shapes alike): one pair per distinct array, the others counted in repeats[base +
 * node] (base: the id of nodes[0] in the graph).
 */
static int add_collectives(const struct hlo_module *m, bool entry, Podemu__Node **nodes,
                           struct shape *shapes, int *repeats, int base, int *at, struct seen *seen,
                           struct arena *a, struct status *st)
{
	char key[2048];
	for (int c = 0; c < m->n_computations; c++) {
		const struct hlo_computation *comp = m->computations[c];
		for (int i = 0; entry == comp->is_entry && i < comp->n_instructions; i++) {
			const struct hlo_instruction *in = comp->instructions[i];
			if (hlo_collective_op(in) == OP_INVALID || in->replaced_by != NULL)
				continue;
			const struct hlo_shape *res = result_of(in);
			int parts = res->type == HT_TUPLE ? res->n_tuple : 1;
			for (int j = 0; j < parts && j < in->n_operands; j++) {
				uint64_t h = collective_key(key, sizeof(key), in, j);
				int k = 0;
				while (k < seen->n &&
				       (seen->hash[k] != h || strcmp(seen->key[k], key)))
					k++;
				if (k < seen->n) {
					repeats[base + seen->node[k]]++;
					continue;
				}
				int rv = collective_pair(nodes, shapes, *at, in, j, a, st);
				if (rv != ST_OK)
					return rv;
				if ((seen->key[k] = arena_strdup(a, key)) == NULL)
					return status_set(st, ST_RESOURCE_EXHAUSTED,
					                  "out of host memory");
				seen->hash[k] = h;
				seen->node[k] = *at + 1;
				seen->n++;
				repeats[base + *at + 1] = 1;
				*at += 2;
			}
		}
	}
	return ST_OK;
}

/*
 * m's collectives as a step graph (each distinct array of a collective once, over a
 * parameter of its own; repeats[id] says how many it stands for): the entry's in g's nodes,
 * the called computations' in one computation of g, so that lower_receive_area knows they may
 * run many times. shapes and repeats by global id.
 */
static int collectives_graph(Podemu__Graph *g, struct shape **shapes, int **repeats,
                             const struct hlo_module *m, struct arena *a, struct status *st)
{
	int n_entry = 2 * count_collectives(m, true), n_called = 2 * count_collectives(m, false);
	size_t total = (size_t)(n_entry + n_called) + 1;
	Podemu__Computation *called = arena_alloc(a, sizeof(*called));
	g->nodes = arena_calloc(a, (size_t)n_entry + 1, sizeof(*g->nodes));
	g->computations = arena_calloc(a, 1, sizeof(*g->computations));
	*shapes = arena_calloc(a, total, sizeof(**shapes));
	*repeats = arena_calloc(a, total, sizeof(int));
	struct seen seen = {.hash = arena_calloc(a, total, sizeof(uint64_t)),
	                    .key = arena_calloc(a, total, sizeof(char *)),
	                    .node = arena_calloc(a, total, sizeof(int))};
	if (called == NULL || g->nodes == NULL || g->computations == NULL || *shapes == NULL ||
	    *repeats == NULL || seen.hash == NULL || seen.key == NULL || seen.node == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	podemu__computation__init(called);
	called->nodes = arena_calloc(a, (size_t)n_called + 1, sizeof(*called->nodes));
	if (called->nodes == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	int at_entry = 0, at_called = 0;
	int rv = add_collectives(m, true, g->nodes, *shapes, *repeats, 0, &at_entry, &seen, a, st);
	if (rv != ST_OK)
		return rv;
	/* The called computations' collectives run any number of times: each counts once. */
	seen.n = 0;
	if ((rv = add_collectives(m, false, called->nodes, *shapes + at_entry, *repeats, at_entry,
	                          &at_called, &seen, a, st)) != ST_OK)
		return rv;
	g->n_nodes = (size_t)at_entry;
	called->n_nodes = (size_t)at_called;
	g->computations[0] = called;
	g->n_computations = at_called > 0;
	return ST_OK;
}

int hlo_receive_area(struct receive_area *out, const struct hlo_module *m, int world,
                     int cores_per_host, const char *forced_algorithm, int64_t chunk_bytes,
                     int window, struct status *st)
{
	memset(out, 0, sizeof(*out));
	if (cores_per_host <= 0 || world <= cores_per_host)
		return ST_OK; /* one host: chunks between its cores stay in their senders' memory */
	struct arena *a = arena_new();
	if (a == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	Podemu__Graph g;
	podemu__graph__init(&g);
	struct shape *shapes = NULL;
	int *repeats = NULL;
	int rv = collectives_graph(&g, &shapes, &repeats, m, a, st);
	if (rv == ST_OK && graph_total_nodes(&g) > 0)
		rv = lower_receive_area(out, &g, shapes, repeats, world, cores_per_host,
		                        forced_algorithm, chunk_bytes, window, st);
	arena_free(a);
	return rv;
}
