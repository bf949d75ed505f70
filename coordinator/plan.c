#include "plan.h"

#include <stdlib.h>
#include <string.h>

#include "from_graph.h"
#include "graph.h"
#include "memplan.h"

/* Refuses outputs that are parameters or the same value twice (a GTE names its source). */
static int check_outputs(const Podemu__Graph *g, int *root, int *output_of, struct status *st)
{
	for (size_t i = 0; i < g->n_nodes; i++) {
		const Podemu__Node *node = g->nodes[i];
		root[i] = (int)i;
		if (opcode_parse(node->opcode) == OP_GET_TUPLE_ELEMENT)
			root[i] = root[g->nodes[node->operands[0]]->operands[node->tuple_index]];
		output_of[i] = -1;
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
	return ST_OK;
}

/*
 * Node i's assignment from the compiler's buffers; position maps nodes to scheduled places,
 * holder[buffer] names the output node whose device buffer it is (or -1).
 */
static int assignment(Podemu__BufferAssignment *b, const Podemu__Graph *g, int i,
                      const struct memplan *mp, const int *position, const int *output_of,
                      const int *holder, const int *parameter_node, const uint64_t *output_handles,
                      const struct shape *shapes, struct status *st)
{
	podemu__buffer_assignment__init(b);
	enum opcode op = opcode_parse(g->nodes[i]->opcode);
	b->bytes = shape_bytes(&shapes[i]);
	int vb = mp->value_buffer[i];
	const struct plan_buffer *buf = vb >= 0 ? &mp->buffers[vb] : NULL;
	if (op == OP_PARAMETER) {
		b->kind = PODEMU__BUFFER_KIND__BUFFER_PARAMETER;
		b->handle = g->nodes[i]->handle;
	} else if (op == OP_OPT_BARRIER) {
		b->kind = PODEMU__BUFFER_KIND__BUFFER_NONE;
	} else if (mp->fused_into[i] >= 0) {
		b->kind = PODEMU__BUFFER_KIND__BUFFER_FUSED; /* computed inside its root */
	} else if (buf == NULL) {
		return status_set(st, ST_INTERNAL, "node %d (%s) has no buffer", i,
		                  g->nodes[i]->opcode);
	} else if (op == OP_GET_TUPLE_ELEMENT) {
		b->kind = PODEMU__BUFFER_KIND__BUFFER_ALIAS;
		b->alias_of = position[buf->def->index];
	} else if (buf->other_space_bytes > 0 && buf->kind == BUF_OUTPUT) {
		return status_set(st, ST_UNIMPLEMENTED,
		                  "node %d (%s): an output in a memory space other than HBM: the "
		                  "pod keeps device buffers in HBM",
		                  i, g->nodes[i]->opcode);
	} else if (buf->other_space_bytes > 0) {
		b->kind = PODEMU__BUFFER_KIND__BUFFER_OTHER_SPACE; /* host memory, not HBM */
	} else if (buf->kind == BUF_OUTPUT && output_of[i] < 0) {
		/* Computed into the buffer of the output that then works on it in place. */
		b->kind = PODEMU__BUFFER_KIND__BUFFER_ALIAS;
		b->alias_of = position[holder[vb]];
	} else if (buf->kind == BUF_OUTPUT) {
		b->kind = PODEMU__BUFFER_KIND__BUFFER_OUTPUT;
		b->handle = output_handles[output_of[i]];
		if (buf->aliased) /* written into the donated parameter's buffer */
			b->donor = 1 + position[parameter_node[buf->donor]];
		b->bytes = buf->bytes; /* the padded size the heap charges */
	} else {
		b->kind = PODEMU__BUFFER_KIND__BUFFER_TEMP;
		b->offset = buf->offset;
	}
	return ST_OK;
}

int plan_graph(struct compiled *out, struct arena *a, const Podemu__Graph *g,
               const struct shape *shapes, const uint64_t *output_handles,
               const struct plan_options *o, struct status *st)
{
	int n = (int)g->n_nodes, rv;
	memset(out, 0, sizeof(*out));
	out->n = n;
	int *root = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *output_of = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *order = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *position = arena_calloc(a, (size_t)n + 1, sizeof(int));
	out->fused_into = arena_calloc(a, (size_t)n + 1, sizeof(int));
	out->plan.buffers = arena_calloc(a, (size_t)n + 1, sizeof(*out->plan.buffers));
	if (!root || !output_of || !order || !position || !out->fused_into || !out->plan.buffers)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	if ((rv = check_outputs(g, root, output_of, st)) != ST_OK)
		return rv;
	struct hlo_module m;
	if ((rv = graph_to_module(&m, g, shapes, topology_world_size(o->topology), a, st)) != ST_OK)
		return rv;
	struct memplan_options mo = {.tiled = o->tiled,
	                             .chunk_bytes = o->chunk_bytes,
	                             .combine_threshold_bytes = o->combine_threshold_bytes,
	                             .no_fusion = !o->fusion,
	                             .recorded_order = !o->memory_aware,
	                             .alignment = HBM_ALIGNMENT,
	                             .graph_outputs = true};
	struct memplan mp;
	if ((rv = memplan_build(&mp, &m, o->topology, &mo, a, st)) != ST_OK)
		return rv;
	/* The schedule without the root (the tuple of outputs, instruction n). */
	bool identity = true;
	for (int k = 0, j = 0; k <= n; k++)
		if (mp.order[k] != n) {
			order[j] = mp.order[k];
			identity &= order[j] == j;
			position[order[j]] = j;
			j++;
		}
	out->order = identity ? NULL : order;
	int *holder = arena_calloc(a, (size_t)mp.n_buffers + 1, sizeof(int));
	if (holder == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int k = 0; k < mp.n_buffers; k++)
		holder[k] = -1;
	for (int i = 0; i < n; i++)
		if (output_of[i] >= 0 && mp.value_buffer[i] >= 0)
			holder[mp.value_buffer[i]] = i;
	/* Parameter number k is the k-th parameter node (compiler/from_graph.c). */
	int *parameter_node = arena_calloc(a, (size_t)n + 1, sizeof(int));
	if (parameter_node == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int i = 0, k = 0; i < n; i++)
		if (opcode_parse(g->nodes[i]->opcode) == OP_PARAMETER)
			parameter_node[k++] = i;
	for (int i = 0; i < n; i++) {
		int r = mp.fused_into[i];
		out->fused_into[position[i]] = r >= 0 ? position[r] : -1;
		Podemu__BufferAssignment *b = arena_alloc(a, sizeof(*b));
		if (b == NULL)
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		rv = assignment(b, g, i, &mp, position, output_of, holder, parameter_node,
		                output_handles, shapes, st);
		if (rv != ST_OK)
			return rv;
		out->plan.buffers[position[i]] = b;
	}
	out->n_combined = mp.n_combined;
	out->n_delayed = mp.n_delayed;
	out->n_fused = mp.n_fused;
	if (out->n_fused == 0)
		out->fused_into = NULL;
	out->plan.temp_bytes = mp.temp_bytes;
	out->plan.output_bytes = mp.output_bytes - mp.alias_bytes;
	out->plan.alias_bytes = mp.alias_bytes;
	out->plan.argument_bytes = mp.argument_bytes;
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
	/* The same graph as the cached one, so its outputs passed this check before. */
	int rv = check_outputs(g, root, output_of, st);
	if (rv != ST_OK)
		return rv;
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
