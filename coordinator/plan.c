#include "plan.h"

#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "heap.h"
#include "layout.h"
#include "topology.h"

static int64_t aligned(int64_t bytes)
{
	if (bytes == 0)
		return HBM_ALIGNMENT;
	bytes = layout_add(bytes, HBM_ALIGNMENT - 1);
	return bytes / HBM_ALIGNMENT * HBM_ALIGNMENT;
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
	struct heap_block *temps = arena_calloc(a, 2 * (size_t)n + 1, sizeof(*temps));
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
				struct heap_block *t = &temps[temp_of[p]];
				t->last = last[i] > t->last ? last[i] : t->last;
				temp_of[i] = temp_of[p];
				owner[i] = owner[p];
				continue;
			}
			temp_of[i] = num_temps;
			owner[i] = i;
			temps[num_temps++] = (struct heap_block){
			    .id = i, .size = aligned(b->bytes), .first = i, .last = last[i]};
		}
	}
	for (int i = 0; scratch != NULL && i < n; i++)
		if (scratch[i] > 0)
			temps[num_temps++] = (struct heap_block){
			    .id = -1 - i, .size = aligned(scratch[i]), .first = i, .last = i};
	if ((out->temp_bytes = heap_place(temps, num_temps, a)) < 0)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int t = 0; t < num_temps; t++)
		if (temps[t].id >= 0)
			out->buffers[temps[t].id]->offset = temps[t].offset;
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
