#include "fusion.h"

#include <stdlib.h>
#include <string.h>

bool fusion_elementwise(enum opcode op)
{
	return opcode_is_elementwise(op) || op == OP_CONSTANT;
}

int fusion_decide(const struct fusion_program *p, int *fused_into, struct arena *a)
{
	int n = p->n;
	int *consumer = arena_calloc(a, (size_t)n + 1, sizeof(int)); /* -1 none, -2 several */
	int *segment = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *size = arena_calloc(a, (size_t)n + 1, sizeof(int)); /* nodes in the fusion of a root */
	if (!consumer || !segment || !size)
		return -1;
	for (int i = 0, seg = 0; i < n; i++) {
		segment[i] = seg;
		seg += p->ops[i] == OP_OPT_BARRIER;
		consumer[i] = -1;
		fused_into[i] = -1;
		size[i] = 1;
	}
	for (int i = 0; i < n; i++)
		for (int k = p->first[i]; k < p->first[i + 1]; k++) {
			int o = p->operands[k];
			consumer[o] = consumer[o] == -1 || consumer[o] == i ? i : -2;
		}
	int fused = 0;
	/* From the last node back, so a consumer knows its own root first. */
	for (int i = n - 1; i >= 0; i--) {
		int c = consumer[i];
		if (c < 0 || p->held[i] || !fusion_elementwise(p->ops[i]) ||
		    !opcode_is_elementwise(p->ops[c]) || segment[c] != segment[i] ||
		    p->elements[i] < 0 || p->elements[i] != p->elements[c])
			continue;
		int root = fused_into[c] >= 0 ? fused_into[c] : c;
		if (size[root] >= FUSION_MAX_NODES)
			continue;
		fused_into[i] = root;
		size[root]++;
		fused++;
	}
	return fused;
}

int fusion_check(Podemu__Node *const *node_of, const int *base_of, size_t n,
                 const struct shape *shapes, const enum opcode *ops, const int32_t *fused_into,
                 size_t n_fused_into, struct status *st)
{
	if (n_fused_into == 0)
		return ST_OK;
	if (n_fused_into != n)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "program has %zu fusion entries for %zu nodes", n_fused_into, n);
	int *members = calloc(n + 1, sizeof(int));
	if (members == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	int rv = ST_OK;
	for (size_t i = 0; i < n && rv == ST_OK; i++) {
		int r = fused_into[i];
		if (r != -1 && (r <= (int)i || (size_t)r >= n || base_of[r] != base_of[i] ||
		                fused_into[r] != -1 || !fusion_elementwise(ops[i]) ||
		                !opcode_is_elementwise(ops[r]) ||
		                shape_elements(&shapes[i]) != shape_elements(&shapes[r])))
			rv = status_set(st, ST_INVALID_ARGUMENT,
			                "node %zu (%s) cannot be fused into node %d", i,
			                opcode_name(ops[i]), r);
		else if (r != -1 && ++members[r] >= FUSION_MAX_NODES)
			rv = status_set(st, ST_INVALID_ARGUMENT,
			                "the fusion rooted at node %d has more than %d nodes", r,
			                FUSION_MAX_NODES);
		/* A fused value has no buffer: only its own fusion may read it. */
		int own = r == -1 ? (int)i : r;
		for (size_t k = 0; rv == ST_OK && k < node_of[i]->n_operands; k++) {
			int p = base_of[i] + node_of[i]->operands[k];
			if (fused_into[p] != -1 && fused_into[p] != own)
				rv = status_set(
				    st, ST_INVALID_ARGUMENT,
				    "node %zu reads node %d, which is fused into node %d", i, p,
				    fused_into[p]);
		}
	}
	free(members);
	return rv;
}

int fusion_computation(const struct hlo_computation *c, bool on, const bool *held, int *fused_into,
                       struct arena *a)
{
	int n = c->n_instructions;
	for (int i = 0; i < n; i++)
		fused_into[i] = -1;
	if (!on)
		return 0;
	int total = 0;
	for (int i = 0; i < n; i++)
		total += c->instructions[i]->n_operands;
	enum opcode *ops = arena_calloc(a, (size_t)n + 1, sizeof(enum opcode));
	int64_t *elements = arena_calloc(a, (size_t)n + 1, sizeof(int64_t));
	int *first = arena_calloc(a, (size_t)n + 2, sizeof(int));
	int *operands = arena_calloc(a, (size_t)total + 1, sizeof(int));
	if (!ops || !elements || !first || !operands)
		return -1;
	int at = 0;
	for (int i = 0; i < n; i++) {
		const struct hlo_instruction *in = c->instructions[i];
		ops[i] = strcmp(in->opcode, "optimization-barrier") == 0 ? OP_OPT_BARRIER
		                                                         : opcode_parse(in->opcode);
		elements[i] = in->shape.type == HT_TUPLE ? -1 : hlo_shape_elements(&in->shape);
		first[i] = at;
		for (int k = 0; k < in->n_operands; k++)
			operands[at++] = in->operands[k]->index;
	}
	first[n] = at;
	struct fusion_program p = {n, ops, elements, first, operands, held};
	return fusion_decide(&p, fused_into, a);
}
