#include "schedule.h"

#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "layout.h"

/* What the delaying pass knows about the program. */
struct sched_ctx {
	const struct sched_program *p;
	int *segment;
	int *n_uses, *first_use, *uses; /* consumers of node i: uses[first_use[i] ..][n_uses[i]] */
	int *anchor; /* node i runs just before anchor[i] (itself when it keeps its place) */
};

static bool movable(const struct sched_ctx *x, int i)
{
	enum opcode op = x->p->ops[i];
	return op != OP_PARAMETER && op != OP_OPT_BARRIER && op != OP_GET_TUPLE_ELEMENT &&
	       !opcode_is_collective(op);
}

/*
 * Whether delaying `via` to just before target keeps operand p from living longer: p lives
 * until target anyway (a parameter, an output, another use there or later), or every use of p
 * is via and p can move along with it (the same holds for its own operands).
 */
static bool free_at(const struct sched_ctx *x, int p, int via, int target, int depth)
{
	if (x->p->ops[p] == OP_PARAMETER || x->p->held[p])
		return true;
	bool only_via = true;
	for (int u = 0; u < x->n_uses[p]; u++) {
		int c = x->uses[x->first_use[p] + u];
		if (c > via && x->anchor[c] >= target)
			return true;
		only_via &= c == via;
	}
	if (!only_via || depth > 32 || !movable(x, p) || x->segment[p] != x->segment[target])
		return false;
	for (int k = x->p->first[p]; k < x->p->first[p + 1]; k++)
		if (!free_at(x, x->p->operands[k], p, target, depth + 1))
			return false;
	return true;
}

/*
 * The order: in recorded order, each anchor after the nodes delayed to it (in recorded
 * order), each group leader followed by the collectives that joined it. head and link are
 * scratch of n entries.
 */
static int emit(const struct sched_ctx *x, const int *leader, const int *next, int *head, int *link,
                int *order)
{
	int n = x->p->n;
	for (int i = 0; i < n; i++)
		head[i] = -1;
	for (int i = n - 1; i >= 0; i--)
		if (x->anchor[i] != i && leader[i] == -1) {
			link[i] = head[x->anchor[i]];
			head[x->anchor[i]] = i;
		}
	int k = 0;
	for (int i = 0; i < n; i++) {
		if (x->anchor[i] != i)
			continue; /* delayed, or joined a group: emitted with its anchor */
		for (int d = head[i]; d != -1; d = link[d])
			order[k++] = d;
		order[k++] = i;
		for (int m = next[i]; m != -1; m = next[m])
			order[k++] = m;
	}
	return k;
}

/*
 * Highest sum of live temporaries over the order: a value is live from its node to its last
 * use (get-tuple-element and opt-barrier alias their sources). Parameters and outputs are
 * device buffers for the whole step in any order, so they are left out. position, last and
 * root are scratch of n entries.
 */
static int64_t live_peak(const struct sched_ctx *x, const int *order, int *position, int *last,
                         int *root)
{
	const struct sched_program *p = x->p;
	int n = x->p->n;
	for (int k = 0; k < n; k++)
		position[order[k]] = k;
	for (int i = 0; i < n; i++) {
		root[i] = p->alias_of[i] >= 0 ? root[p->alias_of[i]] : i;
		last[i] = position[i];
	}
	for (int i = 0; i < n; i++)
		for (int k = p->first[i]; k < p->first[i + 1]; k++) {
			int r = root[p->operands[k]];
			if (position[i] > last[r])
				last[r] = position[i];
		}
	for (int i = 0; i < n; i++)
		if (p->held[i])
			last[root[i]] = -1; /* held: not a temporary */
	int64_t *delta = calloc((size_t)n + 2, sizeof(int64_t));
	if (delta == NULL)
		return INT64_MAX;
	for (int i = 0; i < n; i++) {
		if (root[i] != i || last[i] < 0 || x->p->ops[i] == OP_PARAMETER)
			continue;
		delta[position[i]] += p->bytes[i];
		delta[last[i] + 1] -= p->bytes[i]; /* freed once its last user has run */
	}
	int64_t live = 0, peak = 0;
	for (int k = 0; k <= n; k++) {
		live += delta[k];
		if (live > peak)
			peak = live;
	}
	free(delta);
	return peak;
}

int schedule_delays(const struct sched_program *p, const int *leader, const int *next,
                    const int *hoist, bool memory_aware, int *order, int *n_delayed,
                    struct arena *a, struct status *st)
{
	int n = p->n;
	*n_delayed = 0;
	int *segment = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *anchor = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *n_uses = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *first_use = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *uses = arena_calloc(a, (size_t)p->first[n] + 1, sizeof(int));
	int *none = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *head = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *link = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *combined = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *position = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *last = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *root = arena_calloc(a, (size_t)n + 1, sizeof(int));
	if (!segment || !anchor || !n_uses || !first_use || !uses || !none || !head || !link ||
	    !combined || !position || !last || !root)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int i = 0, seg = 0; i < n; i++) {
		segment[i] = seg;
		seg += p->ops[i] == OP_OPT_BARRIER; /* closes its segment */
		none[i] = -1;
	}
	leader = leader ? leader : none;
	next = next ? next : none;
	hoist = hoist ? hoist : none;
	for (int i = 0; i < n; i++)
		for (int k = p->first[i]; k < p->first[i + 1]; k++)
			n_uses[p->operands[k]]++;
	for (int i = 0, at = 0; i < n; i++) {
		first_use[i] = at;
		at += n_uses[i];
		n_uses[i] = 0;
	}
	for (int i = 0; i < n; i++)
		for (int k = p->first[i]; k < p->first[i + 1]; k++) {
			int o = p->operands[k];
			uses[first_use[o] + n_uses[o]++] = i;
		}

	/*
	 * Delaying, from the last node back: node i runs just before anchor[i], a node that keeps
	 * its place. A collective that joined a group runs where the group's first one does.
	 */
	struct sched_ctx x = {p, segment, n_uses, first_use, uses, anchor};
	for (int i = 0; i < n; i++)
		anchor[i] = leader[i] != -1 ? leader[i] : hoist[i] != -1 ? hoist[i] : i;
	if (emit(&x, leader, next, head, link, combined) != n)
		return status_set(st, ST_INTERNAL, "scheduling lost nodes");
	memcpy(order, combined, (size_t)n * sizeof(int));
	if (!memory_aware)
		return ST_OK;
	for (int i = n - 1; i >= 0; i--) {
		if (!movable(&x, i) || n_uses[i] == 0 || p->bytes[i] == 0)
			continue;
		int target = n;
		for (int u = 0; u < n_uses[i]; u++) {
			int c = anchor[uses[first_use[i] + u]];
			if (c < target)
				target = c;
		}
		if (target <= i + 1 || target >= n || segment[target] != segment[i])
			continue;
		bool free_move = true;
		for (int k = p->first[i]; free_move && k < p->first[i + 1]; k++)
			free_move = free_at(&x, p->operands[k], i, target, 0);
		if (free_move) {
			anchor[i] = target;
			(*n_delayed)++;
		}
	}
	if (*n_delayed == 0)
		return ST_OK;
	if (emit(&x, leader, next, head, link, order) != n)
		return status_set(st, ST_INTERNAL, "scheduling lost nodes");
	/* Kept only when it lowers the peak of live bytes. */
	int64_t before = live_peak(&x, combined, position, last, root);
	int64_t after = live_peak(&x, order, position, last, root);
	if (after >= before) {
		memcpy(order, combined, (size_t)n * sizeof(int));
		*n_delayed = 0;
	}
	return ST_OK;
}

Podemu__Graph *schedule_apply(const Podemu__Graph *g, const struct schedule *s,
                              struct shape *shapes, struct arena *a)
{
	int n = s->n;
	int *position = arena_calloc(a, (size_t)n + 1, sizeof(int));
	Podemu__Graph *out = arena_alloc(a, sizeof(*out));
	Podemu__Node **nodes = arena_calloc(a, (size_t)n + 1, sizeof(*nodes));
	int32_t *outputs = arena_calloc(a, g->n_outputs + 1, sizeof(int32_t));
	struct shape *moved = shapes ? arena_calloc(a, (size_t)n + 1, sizeof(*moved)) : NULL;
	if (!position || !out || !nodes || !outputs || (shapes && !moved))
		return NULL;
	for (int k = 0; k < n; k++)
		position[s->order[k]] = k;
	for (int k = 0; k < n; k++) {
		const Podemu__Node *src = g->nodes[s->order[k]];
		Podemu__Node *copy = arena_alloc(a, sizeof(*copy));
		int32_t *operands = arena_calloc(a, src->n_operands + 1, sizeof(int32_t));
		if (copy == NULL || operands == NULL)
			return NULL;
		*copy = *src;
		for (size_t j = 0; j < src->n_operands; j++)
			operands[j] = position[src->operands[j]];
		copy->operands = operands;
		nodes[k] = copy;
		if (shapes)
			moved[k] = shapes[s->order[k]];
	}
	for (size_t j = 0; j < g->n_outputs; j++)
		outputs[j] = position[g->outputs[j]];
	int32_t *donors = arena_calloc(a, g->n_donors + 1, sizeof(int32_t));
	if (donors == NULL)
		return NULL;
	for (size_t j = 0; j < g->n_donors; j++)
		donors[j] = g->donors[j] >= 0 && g->donors[j] < n ? position[g->donors[j]] : -1;
	if (shapes)
		memcpy(shapes, moved, (size_t)n * sizeof(*shapes));
	*out = *g;
	out->nodes = nodes;
	out->outputs = outputs;
	out->donors = donors;
	return out;
}

int schedule_computation(const struct hlo_computation *c, const struct combining *groups, bool on,
                         bool tiled, int *order, int *n_delayed, struct arena *a, struct status *st)
{
	static const char *const pinned[] = {"all-gather",
	                                     "all-gather-start",
	                                     "all-gather-done",
	                                     "all-reduce",
	                                     "all-reduce-start",
	                                     "all-reduce-done",
	                                     "reduce-scatter",
	                                     "all-to-all",
	                                     "collective-permute",
	                                     "collective-permute-start",
	                                     "collective-permute-done",
	                                     "send",
	                                     "send-done",
	                                     "recv",
	                                     "recv-done",
	                                     "infeed",
	                                     "outfeed",
	                                     "rng",
	                                     "custom-call",
	                                     "while",
	                                     "conditional",
	                                     "call",
	                                     NULL};
	int n = c->n_instructions, total = 0;
	for (int i = 0; i < n; i++)
		total +=
		    c->instructions[i]->n_operands + c->instructions[i]->n_control_predecessors;
	enum opcode *ops = arena_calloc(a, (size_t)n + 1, sizeof(enum opcode));
	int64_t *bytes = arena_calloc(a, (size_t)n + 1, sizeof(int64_t));
	int *first = arena_calloc(a, (size_t)n + 2, sizeof(int));
	int *operands = arena_calloc(a, (size_t)total + 1, sizeof(int));
	int *alias_of = arena_calloc(a, (size_t)n + 1, sizeof(int));
	bool *held = arena_calloc(a, (size_t)n + 1, sizeof(bool));
	if (!ops || !bytes || !first || !operands || !alias_of || !held)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int i = 0, at = 0; i < n; i++) {
		const struct hlo_instruction *in = c->instructions[i];
		bool plumbing =
		    hlo_is(in, "tuple") || hlo_is(in, "get-tuple-element") || hlo_is(in, "bitcast");
		ops[i] = in->parameter_number >= 0 ? OP_PARAMETER
		         : hlo_is(in, "opt-barrier") || hlo_is(in, "optimization-barrier")
		             ? OP_OPT_BARRIER
		         : hlo_is_any(in, pinned) ? OP_ALL_REDUCE /* keeps its place */
		         : plumbing               ? OP_GET_TUPLE_ELEMENT
		                                  : opcode_parse(in->opcode);
		bytes[i] =
		    plumbing || ops[i] == OP_OPT_BARRIER ? 0 : layout_bytes(&in->shape, tiled);
		alias_of[i] = -1;
		if (hlo_is(in, "bitcast") && in->n_operands == 1)
			alias_of[i] = in->operands[0]->index;
		if (hlo_is(in, "get-tuple-element") && in->n_operands == 1 && in->has_index &&
		    (hlo_is(in->operands[0], "tuple") || hlo_is(in->operands[0], "opt-barrier") ||
		     hlo_is(in->operands[0], "optimization-barrier")) &&
		    in->tuple_index < in->operands[0]->n_operands)
			alias_of[i] = in->operands[0]->operands[in->tuple_index]->index;
		/*
		 * The result's tuple only holds the outputs: it is no consumer to move next to. A
		 * control predecessor orders like an operand: nothing moves past what waits for it.
		 */
		first[i] = at;
		for (int k = 0; in != c->root && k < in->n_operands; k++)
			operands[at++] = in->operands[k]->index;
		for (int k = 0; k < in->n_control_predecessors; k++)
			operands[at++] = in->control_predecessors[k]->index;
		first[i + 1] = at;
	}
	held[c->root->index] = true;
	if (hlo_is(c->root, "tuple"))
		for (int k = 0; k < c->root->n_operands; k++)
			held[c->root->operands[k]->index] = true;
	/* Combined collectives stay with their group. */
	struct sched_program p = {n, ops, bytes, first, operands, alias_of, held};
	return schedule_delays(&p, groups->leader, groups->next, groups->hoist, on, order,
	                       n_delayed, a, st);
}
