#include "plan.h"

#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "layout.h"
#include "topology.h"

struct temp {
	int node;
	int64_t size;
	int first; /* schedule position where the value is defined */
	int last;  /* last position that reads it */
	int64_t offset;
};

static int temp_by_size(const void *pa, const void *pb)
{
	const struct temp *a = pa, *b = pb;
	if (a->size != b->size)
		return a->size > b->size ? -1 : 1;
	return a->first - b->first;
}

/* Bytes rounded up to the heap's alignment, saturating (sizes come from the client). */
static int64_t aligned(int64_t bytes)
{
	if (bytes == 0)
		return HBM_ALIGNMENT;
	bytes = layout_add(bytes, HBM_ALIGNMENT - 1);
	return bytes / HBM_ALIGNMENT * HBM_ALIGNMENT;
}

/*
 * Places temporaries largest first at the lowest offset where no temporary that is live at the
 * same time sits (XLA's heap simulator does the same greedy by decreasing size).
 */
static int64_t place_temps(struct temp *t, int n)
{
	qsort(t, (size_t)n, sizeof(*t), temp_by_size);
	int64_t high = 0;
	for (int i = 0; i < n; i++) {
		int64_t offset = 0;
		/* Re-scan until the candidate overlaps nothing that is placed and live with it. */
		for (int moved = 1; moved;) {
			moved = 0;
			for (int j = 0; j < i; j++) {
				if (t[j].last < t[i].first || t[i].last < t[j].first)
					continue;
				if (offset < layout_add(t[j].offset, t[j].size) &&
				    t[j].offset < layout_add(offset, t[i].size)) {
					offset = layout_add(t[j].offset, t[j].size);
					moved = 1;
				}
			}
		}
		t[i].offset = offset;
		if (layout_add(offset, t[i].size) > high)
			high = layout_add(offset, t[i].size);
	}
	return high;
}

/*
 * In-place reuse, as XLA's buffer assignment does it: the operand of an elementwise node i whose
 * temporary i alone reads, with as many bytes, lends i its buffer. Returns it, or -1.
 */
static int in_place_operand(const Podemu__Graph *g, int i, enum opcode op, const int *uses,
                            Podemu__BufferAssignment *const *buffers, const struct shape *shapes)
{
	const Podemu__Node *node = g->nodes[i];
	if (!opcode_is_elementwise(op))
		return -1;
	for (size_t k = 0; k < node->n_operands; k++) {
		int p = node->operands[k], refs = 0;
		if (buffers[p]->kind != PODEMU__BUFFER_KIND__BUFFER_TEMP ||
		    shape_bytes(&shapes[p]) != shape_bytes(&shapes[i]))
			continue;
		for (size_t j = 0; j < node->n_operands; j++)
			refs += node->operands[j] == p;
		if (uses[p] == refs)
			return p;
	}
	return -1;
}

int plan_step(struct plan *out, struct arena *a, const Podemu__Graph *g, const struct shape *shapes,
              const uint64_t *output_handles, const int64_t *scratch, const int *fused_into,
              struct status *st)
{
	int n = (int)g->n_nodes;
	memset(out, 0, sizeof(*out));
	int *root = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *last = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *output_of = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *uses = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *temp_of = arena_calloc(a, (size_t)n + 1, sizeof(int)); /* index into temps */
	int *owner = arena_calloc(a, (size_t)n + 1, sizeof(int));   /* node whose bytes it uses */
	struct temp *temps = arena_calloc(a, 2 * (size_t)n + 1, sizeof(*temps));
	out->buffers = arena_calloc(a, (size_t)n + 1, sizeof(*out->buffers));
	if (!root || !last || !output_of || !uses || !temp_of || !owner || !temps || !out->buffers)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int i = 0; i < n; i++) {
		const Podemu__Node *node = g->nodes[i];
		enum opcode op = opcode_parse(node->opcode);
		root[i] = i;
		if (op == OP_GET_TUPLE_ELEMENT)
			root[i] = root[g->nodes[node->operands[0]]->operands[node->tuple_index]];
		last[i] = i;
		output_of[i] = -1;
		/* A fused node reads its operands when its fusion's root runs. */
		int at = fused_into && fused_into[i] >= 0 ? fused_into[i] : i;
		for (size_t k = 0; k < node->n_operands; k++) {
			int r = root[node->operands[k]];
			if (at > last[r])
				last[r] = at;
			uses[node->operands[k]]++;
		}
	}
	for (size_t k = 0; k < g->n_outputs; k++) {
		int r = root[g->outputs[k]];
		if (opcode_parse(g->nodes[r]->opcode) == OP_PARAMETER)
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "output %zu (node %d) is the parameter itself; hold its "
			                  "device buffer instead",
			                  k, g->outputs[k]);
		if (output_of[r] >= 0)
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "outputs %d and %zu are the same value (node %d)",
			                  output_of[r], k, r);
		output_of[r] = (int)k;
	}
	int num_temps = 0;
	for (int i = 0; i < n; i++) {
		const Podemu__Node *node = g->nodes[i];
		enum opcode op = opcode_parse(node->opcode);
		Podemu__BufferAssignment *b = arena_alloc(a, sizeof(*b));
		if (b == NULL)
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		podemu__buffer_assignment__init(b);
		out->buffers[i] = b;
		b->bytes = shape_bytes(&shapes[i]);
		if (op == OP_PARAMETER) {
			b->kind = PODEMU__BUFFER_KIND__BUFFER_PARAMETER;
			b->handle = node->handle;
			out->argument_bytes = layout_add(out->argument_bytes, aligned(b->bytes));
		} else if (op == OP_OPT_BARRIER) {
			b->kind = PODEMU__BUFFER_KIND__BUFFER_NONE;
		} else if (fused_into && fused_into[i] >= 0) {
			b->kind = PODEMU__BUFFER_KIND__BUFFER_FUSED; /* computed inside its root */
		} else if (op == OP_GET_TUPLE_ELEMENT) {
			b->kind = PODEMU__BUFFER_KIND__BUFFER_ALIAS;
			b->alias_of = root[i];
		} else if (output_of[i] >= 0) {
			b->kind = PODEMU__BUFFER_KIND__BUFFER_OUTPUT;
			b->handle = output_handles[output_of[i]];
			out->output_bytes = layout_add(out->output_bytes, aligned(b->bytes));
		} else {
			b->kind = PODEMU__BUFFER_KIND__BUFFER_TEMP;
			int p = fused_into && fused_into[i] >= 0
			            ? -1
			            : in_place_operand(g, i, op, uses, out->buffers, shapes);
			if (p >= 0) { /* the operand's bytes become the result */
				struct temp *t = &temps[temp_of[p]];
				t->last = last[i] > t->last ? last[i] : t->last;
				temp_of[i] = temp_of[p];
				owner[i] = owner[p];
				continue;
			}
			temp_of[i] = num_temps;
			owner[i] = i;
			temps[num_temps++] = (struct temp){
			    .node = i, .size = aligned(b->bytes), .first = i, .last = last[i]};
		}
	}
	for (int i = 0; scratch != NULL && i < n; i++)
		if (scratch[i] > 0)
			temps[num_temps++] = (struct temp){
			    .node = -1 - i, .size = aligned(scratch[i]), .first = i, .last = i};
	out->temp_bytes = place_temps(temps, num_temps);
	for (int t = 0; t < num_temps; t++)
		if (temps[t].node >= 0)
			out->buffers[temps[t].node]->offset = temps[t].offset;
	for (int i = 0; i < n; i++)
		if (out->buffers[i]->kind == PODEMU__BUFFER_KIND__BUFFER_TEMP && owner[i] != i)
			out->buffers[i]->offset = out->buffers[owner[i]]->offset;
	return ST_OK;
}

int plan_rebind(struct plan *out, struct arena *a, const struct plan *cached,
                const Podemu__Graph *g, const uint64_t *output_handles, struct status *st)
{
	int n = (int)g->n_nodes;
	*out = *cached;
	out->buffers = arena_calloc(a, (size_t)n + 1, sizeof(*out->buffers));
	int *root = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *output_of = arena_calloc(a, (size_t)n + 1, sizeof(int));
	if (out->buffers == NULL || root == NULL || output_of == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int i = 0; i < n; i++) {
		const Podemu__Node *node = g->nodes[i];
		root[i] = i;
		if (opcode_parse(node->opcode) == OP_GET_TUPLE_ELEMENT)
			root[i] = root[g->nodes[node->operands[0]]->operands[node->tuple_index]];
		output_of[i] = -1;
	}
	for (size_t k = 0; k < g->n_outputs; k++)
		output_of[root[g->outputs[k]]] = (int)k;
	for (int i = 0; i < n; i++) {
		Podemu__BufferAssignment *b = arena_alloc(a, sizeof(*b));
		if (b == NULL)
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		*b = *cached->buffers[i];
		if (b->kind == PODEMU__BUFFER_KIND__BUFFER_PARAMETER)
			b->handle = g->nodes[i]->handle;
		else if (b->kind == PODEMU__BUFFER_KIND__BUFFER_OUTPUT && output_of[i] >= 0)
			b->handle = output_handles[output_of[i]];
		out->buffers[i] = b;
	}
	return ST_OK;
}
