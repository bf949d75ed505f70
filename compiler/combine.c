#include "combine.h"

#include <string.h>

#include "layout.h"

static bool is_combining_kind(const struct hlo_instruction *in)
{
	return in->shape.type != HT_TUPLE &&
	       (hlo_is(in, "all-gather") || hlo_is(in, "reduce-scatter") ||
	        hlo_is(in, "all-reduce"));
}

static bool same_text(const char *a, const char *b)
{
	return strcmp(a ? a : "", b ? b : "") == 0;
}

/* Whether two collectives could be one combined op. */
static bool alike(const struct hlo_instruction *a, const struct hlo_instruction *b)
{
	return hlo_is(a, b->opcode) && a->shape.type == b->shape.type &&
	       a->n_dimensions == b->n_dimensions &&
	       (a->n_dimensions == 0 || memcmp(a->dimensions, b->dimensions,
	                                       (size_t)a->n_dimensions * sizeof(int64_t)) == 0) &&
	       same_text(a->to_apply_name, b->to_apply_name) &&
	       same_text(a->replica_groups, b->replica_groups);
}

static bool is_barrier(const struct hlo_instruction *in)
{
	return hlo_is(in, "opt-barrier") || hlo_is(in, "optimization-barrier");
}

int combine_collectives(struct combining *out, const struct hlo_computation *c, int64_t threshold,
                        struct arena *a, struct status *st)
{
	int n = c->n_instructions;
	memset(out, 0, sizeof(*out));
	out->leader = arena_calloc(a, (size_t)n + 1, sizeof(int));
	out->next = arena_calloc(a, (size_t)n + 1, sizeof(int));
	out->hoist = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *segment = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int64_t *group = arena_calloc(a, (size_t)n + 1, sizeof(int64_t)); /* first: bytes */
	if (!out->leader || !out->next || !out->hoist || !segment || !group)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int i = 0, seg = 0; i < n; i++) {
		segment[i] = seg;
		seg += is_barrier(c->instructions[i]); /* closes its segment */
		out->leader[i] = out->next[i] = out->hoist[i] = -1;
	}
	for (int j = 0; threshold > 0 && j < n; j++) {
		const struct hlo_instruction *in = c->instructions[j];
		if (!is_combining_kind(in))
			continue;
		int64_t bytes = layout_bytes(&in->shape, false);
		for (int i = j - 1; i >= 0 && segment[i] == segment[j]; i--) {
			const struct hlo_instruction *first = c->instructions[i];
			if (out->leader[i] != -1 || !is_combining_kind(first) || !alike(first, in))
				continue;
			bool ready = true;
			for (int k = 0; k < in->n_operands; k++) {
				const struct hlo_instruction *p = in->operands[k];
				ready &= p->index < i || p->parameter_number >= 0;
			}
			int64_t first_bytes =
			    group[i] ? group[i] : layout_bytes(&first->shape, false);
			if (ready && layout_add(first_bytes, bytes) <= threshold) {
				for (int k = 0; k < in->n_operands; k++) {
					int p = in->operands[k]->index;
					if (p > i && (out->hoist[p] == -1 || out->hoist[p] > i))
						out->hoist[p] = i;
				}
				group[i] = first_bytes + bytes;
				out->leader[j] = i;
				int tail = i;
				while (out->next[tail] != -1)
					tail = out->next[tail];
				out->next[tail] = j;
				out->n_combined++;
			}
			break; /* only the nearest group of the same kind is a candidate */
		}
	}
	return ST_OK;
}
