#include "plan.h"

#include <stdlib.h>
#include <string.h>

#include "from_graph.h"
#include "graph.h"
#include "memplan.h"

/* The value an entry node stands for: a get-tuple-element of a tuple or barrier is its operand. */
static int value_root(const Podemu__Graph *g, const int *root, size_t i)
{
	const Podemu__Node *node = g->nodes[i];
	if (opcode_parse(node->opcode) != OP_GET_TUPLE_ELEMENT)
		return (int)i;
	const Podemu__Node *t = g->nodes[node->operands[0]];
	enum opcode top = opcode_parse(t->opcode);
	if (top == OP_OPT_BARRIER || top == OP_TUPLE)
		return root[t->operands[node->tuple_index]];
	/* An element of a while, call or conditional: the first such node names it. */
	for (size_t j = 0; j < i; j++)
		if (g->nodes[j]->operands != NULL && g->nodes[j]->n_operands == 1 &&
		    g->nodes[j]->operands[0] == node->operands[0] &&
		    opcode_parse(g->nodes[j]->opcode) == OP_GET_TUPLE_ELEMENT &&
		    g->nodes[j]->tuple_index == node->tuple_index)
			return root[j];
	return (int)i;
}

/* Refuses outputs that are parameters or the same value twice (a GTE names its source). */
static int check_outputs(const Podemu__Graph *g, int *root, int *output_of, struct status *st)
{
	for (size_t i = 0; i < g->n_nodes; i++) {
		root[i] = value_root(g, root, i);
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

/* What turning the compiler's buffers into agents' assignments needs. */
struct planner {
	const Podemu__Graph *g;
	const struct memplan *mp;
	const int *first;     /* global id of each computation's node 0 */
	const int *position;  /* entry node -> its place in the schedule (its id for agents) */
	const int *output_of; /* entry node -> the output it is, or -1 */
	const int *holder;    /* buffer -> the entry output node whose device buffer it is */
	const int *parameter_node;
	const int *root_slot; /* buffer -> the element of its computation's result it is, or -1 */
	const struct shape *shapes; /* by global id */
	int n_comps;
	struct arena *a;
	struct status *st;
};

/* The agents' id of node i of computation c (-1: the entry, in its scheduled place). */
static int agent_id(const struct planner *p, int c, int i)
{
	return c < 0 ? p->position[i] : p->first[c] + i;
}

/* Where a value held in buffer id lives. */
static int from_buffer(Podemu__BufferAssignment *b, const struct planner *p, int id, int node,
                       const char *opcode)
{
	const struct plan_buffer *buf = &p->mp->buffers[id];
	if (buf->other_space_bytes > 0 && buf->kind == BUF_OUTPUT)
		return status_set(p->st, ST_UNIMPLEMENTED,
		                  "node %d (%s): an output in a memory space other than HBM: the "
		                  "pod keeps device buffers in HBM",
		                  node, opcode);
	if (buf->other_space_bytes > 0) {
		b->kind = PODEMU__BUFFER_KIND__BUFFER_OTHER_SPACE; /* host memory, not HBM */
	} else if (buf->kind == BUF_OUTPUT && p->holder[id] < 0) {
		return status_set(p->st, ST_INTERNAL, "node %d (%s): an output no node holds", node,
		                  opcode);
	} else if (buf->kind == BUF_OUTPUT) {
		b->kind = PODEMU__BUFFER_KIND__BUFFER_OUTPUT;
		b->handle = (uint64_t)p->output_of[p->holder[id]]; /* bound by plan_bind */
		if (buf->aliased) /* written into the donated parameter's buffer */
			b->donor = 1 + p->position[p->parameter_node[buf->donor]];
		b->bytes = buf->bytes; /* the padded size the heap charges */
	} else if (p->root_slot[id] >= 0) {
		b->kind = PODEMU__BUFFER_KIND__BUFFER_CALLER; /* the caller's result */
		b->alias_of = p->root_slot[id];
	} else {
		b->kind = PODEMU__BUFFER_KIND__BUFFER_TEMP;
		b->offset = buf->offset;
	}
	return ST_OK;
}

/* A while, conditional or call: its result's elements, and where its callees' heap starts. */
static int control_flow(Podemu__BufferAssignment *b, const struct planner *p,
                        const struct comp_plan *cp, int c, int i, int node, const char *opcode)
{
	int n = cp->n_values[i], rv;
	b->kind = PODEMU__BUFFER_KIND__BUFFER_NONE;
	/* An array result the client holds: a device buffer of its own, its one element. */
	bool held = c < 0 && n == 1 && p->output_of[i] >= 0 &&
	            p->mp->buffers[cp->values[i][0]].kind == BUF_OUTPUT;
	if (held && (rv = from_buffer(b, p, cp->values[i][0], node, opcode)) != ST_OK)
		return rv;
	b->offset = cp->callee_at[i] > 0 ? cp->callee_at[i] : 0;
	b->elements = arena_calloc(p->a, (size_t)n + 1, sizeof(*b->elements));
	if (b->elements == NULL)
		return status_set(p->st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int k = 0; k < n; k++) {
		Podemu__BufferAssignment *e = arena_alloc(p->a, sizeof(*e));
		if (e == NULL)
			return status_set(p->st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		podemu__buffer_assignment__init(e);
		int id = cp->values[i][k];
		if (p->mp->buffers[id].kind == BUF_OUTPUT && p->holder[id] >= 0) {
			/* An element the client holds: the device buffer of the node that names it.
			 */
			e->kind = PODEMU__BUFFER_KIND__BUFFER_ALIAS;
			e->alias_of = p->position[p->holder[id]];
			b->elements[b->n_elements++] = e;
			continue;
		}
		if ((rv = from_buffer(e, p, id, node, opcode)) != ST_OK)
			return rv;
		b->elements[b->n_elements++] = e;
	}
	return ST_OK;
}

/* Node i of computation c (-1: the entry): where its value lives on every core. */
static int assignment(Podemu__BufferAssignment *b, const struct planner *p, int c, int i)
{
	const Podemu__Node *node = c < 0 ? p->g->nodes[i] : p->g->computations[c]->nodes[i];
	const struct comp_plan *cp = &p->mp->comps[c < 0 ? p->n_comps : c];
	int id = agent_id(p, c, i);
	podemu__buffer_assignment__init(b);
	enum opcode op = opcode_parse(node->opcode);
	b->bytes = shape_bytes(&p->shapes[c < 0 ? i : id]);
	if (cp->order == NULL) /* a computation nothing calls */
		return ST_OK;
	if (cp->scratch_at[i] >= 0) {
		b->scratch_offset = cp->scratch_at[i];
		b->scratch_bytes = cp->scratch_bytes[i];
	}
	int nv = cp->n_values[i];
	const int *vals = cp->values[i];
	const struct plan_buffer *buf = nv == 1 ? &p->mp->buffers[vals[0]] : NULL;
	if (op == OP_PARAMETER && c < 0) {
		b->kind = PODEMU__BUFFER_KIND__BUFFER_PARAMETER; /* its handle: plan_bind */
	} else if (op == OP_PARAMETER) {
		b->kind = PODEMU__BUFFER_KIND__BUFFER_CALLER; /* its caller's argument */
		b->alias_of = -1;
	} else if (op == OP_OPT_BARRIER || op == OP_TUPLE) {
		b->kind = PODEMU__BUFFER_KIND__BUFFER_NONE; /* its operands' values */
	} else if (cp->fused_into[i] >= 0) {
		b->kind = PODEMU__BUFFER_KIND__BUFFER_FUSED; /* computed inside its root */
	} else if (opcode_is_control_flow(op) ||
	           (op == OP_OPAQUE && p->shapes[c < 0 ? i : id].tuple)) {
		return control_flow(b, p, cp, c, i, id, node->opcode);
	} else if (buf == NULL) {
		return status_set(p->st, ST_INTERNAL, "node %d (%s) has no buffer", id,
		                  node->opcode);
	} else if (op == OP_GET_TUPLE_ELEMENT && c < 0 && p->output_of[i] >= 0 &&
	           buf->kind == BUF_OUTPUT) {
		return from_buffer(b, p, vals[0], id, node->opcode); /* an element held: its own */
	} else if (op == OP_GET_TUPLE_ELEMENT) {
		/* The node that made the buffer; of a tuple value, element tuple_index. */
		b->kind = PODEMU__BUFFER_KIND__BUFFER_ALIAS;
		b->alias_of = agent_id(p, c, buf->def->index);
	} else if (c < 0 && buf->kind == BUF_OUTPUT && p->output_of[i] < 0) {
		/* Computed into the buffer of the output that then works on it in place. */
		b->kind = PODEMU__BUFFER_KIND__BUFFER_ALIAS;
		b->alias_of = p->position[p->holder[vals[0]]];
	} else {
		return from_buffer(b, p, vals[0], id, node->opcode);
	}
	return ST_OK;
}

/* buffer -> the element of its computation's result it is (the caller's bytes), or -1. */
static int *root_slots(const struct memplan *mp, const struct hlo_module *m, struct arena *a)
{
	int *slot = arena_calloc(a, (size_t)mp->n_buffers + 1, sizeof(int));
	if (slot == NULL)
		return NULL;
	for (int k = 0; k < mp->n_buffers; k++)
		slot[k] = -1;
	for (int c = 0; c < m->n_computations; c++) {
		const struct comp_plan *cp = &mp->comps[c];
		if (m->computations[c]->is_entry || cp->order == NULL)
			continue;
		int r = m->computations[c]->root->index;
		for (int k = 0; k < cp->n_values[r]; k++)
			if (mp->buffers[cp->values[r][k]].bytes == 0 &&
			    mp->buffers[cp->values[r][k]].def->parameter_number < 0)
				slot[cp->values[r][k]] = k;
	}
	return slot;
}

int plan_graph(struct compiled *out, struct arena *a, const Podemu__Graph *g,
               const struct shape *shapes, const struct plan_options *o, struct status *st)
{
	int n = (int)g->n_nodes, rv;
	int total = (int)graph_total_nodes(g);
	memset(out, 0, sizeof(*out));
	out->n = n;
	out->n_total = total;
	int *root = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *output_of = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *order = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *position = arena_calloc(a, (size_t)n + 1, sizeof(int));
	out->fused_into = arena_calloc(a, (size_t)total + 1, sizeof(int));
	out->plan.buffers = arena_calloc(a, (size_t)total + 1, sizeof(*out->plan.buffers));
	out->computation_order = arena_calloc(a, (size_t)(total - n) + 1, sizeof(int));
	int *first = graph_first_ids(g, a);
	if (!root || !output_of || !order || !position || !out->fused_into || !out->plan.buffers ||
	    !out->computation_order || !first)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	if ((rv = check_outputs(g, root, output_of, st)) != ST_OK)
		return rv;
	struct hlo_module m;
	if ((rv = graph_to_module(&m, g, shapes, topology_world_size(o->topology), a, st)) != ST_OK)
		return rv;
	struct memplan_options mo = {.tiled = o->tiled,
	                             .chunk_bytes = o->chunk_bytes,
	                             .window = o->window,
	                             .collective_algorithm = o->collective_algorithm,
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
	/* Parameter number k is the k-th parameter node (compiler/from_graph.c). */
	int *parameter_node = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *slots = root_slots(&mp, &m, a);
	if (holder == NULL || parameter_node == NULL || slots == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int k = 0; k < mp.n_buffers; k++)
		holder[k] = -1;
	for (int i = 0; i < n; i++)
		if (output_of[i] >= 0 && mp.value_buffer[i] >= 0)
			holder[mp.value_buffer[i]] = i;
	for (int i = 0, k = 0; i < n; i++)
		if (opcode_parse(g->nodes[i]->opcode) == OP_PARAMETER)
			parameter_node[k++] = i;
	struct planner p = {.g = g,
	                    .mp = &mp,
	                    .first = first,
	                    .position = position,
	                    .output_of = output_of,
	                    .holder = holder,
	                    .parameter_node = parameter_node,
	                    .root_slot = slots,
	                    .shapes = shapes,
	                    .n_comps = (int)g->n_computations,
	                    .a = a,
	                    .st = st};
	for (int c = -1; c < (int)g->n_computations; c++) {
		int count = c < 0 ? n : (int)g->computations[c]->n_nodes;
		const struct comp_plan *cp = &mp.comps[c < 0 ? p.n_comps : c];
		for (int i = 0; i < count; i++) {
			int id = agent_id(&p, c, i);
			int r = cp->order != NULL ? cp->fused_into[i] : -1;
			out->fused_into[id] = r >= 0 ? agent_id(&p, c, r) : -1;
			if (c >= 0) /* the order a computation's nodes run in */
				out->computation_order[id - n] =
				    cp->order != NULL ? cp->order[i] : i;
			Podemu__BufferAssignment *b = arena_alloc(a, sizeof(*b));
			if (b == NULL)
				return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
			if ((rv = assignment(b, &p, c, i)) != ST_OK)
				return rv;
			out->plan.buffers[id] = b;
		}
	}
	memcpy(out->sent_by_op, mp.sent_by_op, sizeof(out->sent_by_op));
	out->live = mp.live;
	out->n_live = mp.n_instructions;
	out->n_combined = mp.n_combined;
	out->n_delayed = mp.n_delayed;
	out->n_fused = mp.n_fused;
	if (out->n_fused == 0)
		out->fused_into = NULL;
	if (total == n)
		out->computation_order = NULL;
	out->plan.receive_offset = mp.receive_offset;
	out->plan.receive_slots = mp.receive_slots;
	out->plan.receive_slot_bytes = mp.receive_slot_bytes;
	out->plan.temp_bytes = mp.temp_bytes;
	out->plan.output_bytes = mp.output_bytes - mp.alias_bytes;
	out->plan.alias_bytes = mp.alias_bytes;
	out->plan.argument_bytes = mp.argument_bytes;
	return ST_OK;
}

/* A copy of a (and its elements) with its device buffer handles bound. */
static Podemu__BufferAssignment *bind(struct arena *a, const Podemu__BufferAssignment *from,
                                      uint64_t parameter_handle, const uint64_t *output_handles)
{
	Podemu__BufferAssignment *b = arena_alloc(a, sizeof(*b));
	if (b == NULL)
		return NULL;
	*b = *from;
	if (b->kind == PODEMU__BUFFER_KIND__BUFFER_PARAMETER)
		b->handle = parameter_handle;
	else if (b->kind == PODEMU__BUFFER_KIND__BUFFER_OUTPUT)
		b->handle = output_handles[from->handle];
	if (from->n_elements > 0) {
		b->elements = arena_calloc(a, from->n_elements + 1, sizeof(*b->elements));
		if (b->elements == NULL)
			return NULL;
		for (size_t k = 0; k < from->n_elements; k++)
			if ((b->elements[k] = bind(a, from->elements[k], 0, output_handles)) ==
			    NULL)
				return NULL;
	}
	return b;
}

int plan_bind(struct plan *out, struct arena *a, const struct compiled *c, const Podemu__Graph *g,
              const uint64_t *output_handles, struct status *st)
{
	*out = c->plan;
	out->buffers = arena_calloc(a, (size_t)c->n_total + 1, sizeof(*out->buffers));
	if (out->buffers == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int i = 0; i < c->n_total; i++) {
		uint64_t handle = i < c->n ? g->nodes[i]->handle : 0;
		if ((out->buffers[i] = bind(a, c->plan.buffers[i], handle, output_handles)) == NULL)
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	}
	return ST_OK;
}
