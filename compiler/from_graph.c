#include "from_graph.h"

#include <stdio.h>
#include <string.h>

#include "collective.h"
#include "graph.h"
#include "layout.h"

static enum hlo_type hlo_type_of(int dtype)
{
	switch (dtype) {
	case DT_PRED:
		return HT_PRED;
	case DT_S32:
		return HT_S32;
	case DT_U8:
		return HT_U8;
	case DT_BF16:
		return HT_BF16;
	case DT_F32:
		return HT_F32;
	case DT_U32:
		return HT_U32;
	default:
		return HT_INVALID;
	}
}

int graph_value_shape(struct hlo_shape *out, const struct shape *s, const char *layout,
                      struct arena *a, struct status *st)
{
	memset(out, 0, sizeof(*out));
	out->type = hlo_type_of(s->dtype);
	out->rank = s->rank;
	out->dims = arena_calloc(a, (size_t)s->rank + 1, sizeof(int64_t));
	if (out->dims == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	memcpy(out->dims, s->dims, (size_t)s->rank * sizeof(int64_t));
	if (layout == NULL || layout[0] == '\0')
		return ST_OK;
	int rv = hlo_parse_layout(out, layout, a, st);
	if (rv == ST_OK && out->element_bits != 0 && out->element_bits < hlo_type_bits(out->type)) {
		char text[128];
		return status_set(st, ST_UNIMPLEMENTED,
		                  "layout %s of %s: E(%d) packs elements below their %d bits, and "
		                  "the pod stores whole elements",
		                  layout, hlo_shape_format(text, sizeof(text), out),
		                  out->element_bits, hlo_type_bits(out->type));
	}
	return rv;
}

int graph_value_bytes(int64_t *bytes, const struct shape *s, const char *layout, bool tiled,
                      struct arena *a, struct status *st)
{
	struct hlo_shape h;
	int rv = graph_value_shape(&h, s, layout, a, st);
	*bytes = rv == ST_OK ? layout_bytes(&h, tiled) : 0;
	if (rv == ST_OK && h.memory_space != 0) {
		char text[128];
		return status_set(st, ST_UNIMPLEMENTED,
		                  "layout %s of %s: memory space S(%lld) is not HBM, and the pod "
		                  "keeps device buffers in HBM",
		                  layout, hlo_shape_format(text, sizeof(text), &h),
		                  (long long)h.memory_space);
	}
	return rv;
}

/* in's shape: the tuple of its operands' shapes (the root, an opt-barrier). */
static int tuple_of_operands(struct hlo_instruction *in, struct arena *a)
{
	in->shape.type = HT_TUPLE;
	in->shape.n_tuple = in->n_operands;
	in->shape.tuple = arena_calloc(a, (size_t)in->n_operands + 1, sizeof(struct hlo_shape));
	if (in->shape.tuple == NULL)
		return -1;
	for (int k = 0; k < in->n_operands; k++)
		in->shape.tuple[k] = in->operands[k]->shape;
	return 0;
}

/* The groups a collective runs over, as XLA writes them ("{{0,1},{2,3}}"), or NULL: all. */
static int groups_text(const char **out, const Podemu__Graph *g, const Podemu__Node *n, int index,
                       int world, struct arena *a, struct status *st)
{
	*out = NULL;
	if (n->n_replica_groups == 0 && (n->mesh_axis == NULL || n->mesh_axis[0] == '\0'))
		return ST_OK;
	char label[64];
	snprintf(label, sizeof(label), "node %d", index);
	struct coll_groups cg;
	int rv = coll_groups_resolve(&cg, n, g->mesh, g->n_mesh, world, 1, label, st);
	if (rv != ST_OK)
		return rv;
	size_t cap = 4 + (size_t)world * 12 + (size_t)cg.num_groups * 4, at = 0;
	char *text = arena_alloc(a, cap);
	if (text != NULL) {
		at += (size_t)snprintf(text + at, cap - at, "{");
		for (int k = 0; k < cg.num_groups; k++) {
			at += (size_t)snprintf(text + at, cap - at, "%s{", k ? "," : "");
			for (int m = 0; m < cg.size[k]; m++)
				at += (size_t)snprintf(text + at, cap - at, "%s%lld", m ? "," : "",
				                       (long long)cg.ids[cg.start[k] + m]);
			at += (size_t)snprintf(text + at, cap - at, "}");
		}
		snprintf(text + at, cap - at, "}");
	} else {
		rv = status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	}
	coll_groups_free(&cg);
	*out = text;
	return rv;
}

/* A collective-permute's pairs as XLA writes them ("{{0,1},{1,2}}"); NULL without memory. */
static const char *pairs_text(const Podemu__Node *n, struct arena *a)
{
	size_t cap = 4 + n->n_source_target_pairs * 24, at = 0;
	char *text = arena_alloc(a, cap);
	if (text == NULL)
		return NULL;
	at += (size_t)snprintf(text, cap, "{");
	for (size_t k = 0; k + 1 < n->n_source_target_pairs; k += 2)
		at += (size_t)snprintf(text + at, cap - at, "%s{%lld,%lld}", k ? "," : "",
		                       (long long)n->source_target_pairs[k],
		                       (long long)n->source_target_pairs[k + 1]);
	snprintf(text + at, cap - at, "}");
	return text;
}

/* The reduction of a node as a to_apply name: "add", or "add*0.5" with a scale. */
static const char *reduction(const Podemu__Node *n, struct arena *a)
{
	const char *r = n->reducer != NULL && n->reducer[0] != '\0' ? n->reducer : "add";
	if (n->scale == 0 || n->scale == 1)
		return r;
	char text[96];
	snprintf(text, sizeof(text), "%s*%.17g", r, n->scale);
	return arena_strdup(a, text);
}

/* An HLO shape for a graph value: an array in its layout, or a tuple of arrays. */
static int value_shape(struct hlo_shape *out, const struct shape *s, const char *layout,
                       struct arena *a, struct status *st)
{
	if (!s->tuple)
		return graph_value_shape(out, s, layout, a, st);
	memset(out, 0, sizeof(*out));
	out->type = HT_TUPLE;
	out->n_tuple = s->n_elements;
	out->tuple = arena_calloc(a, (size_t)s->n_elements + 1, sizeof(*out->tuple));
	if (out->tuple == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int k = 0; k < s->n_elements; k++) {
		int rv = graph_value_shape(&out->tuple[k], &s->elements[k], NULL, a, st);
		if (rv != ST_OK)
			return rv;
	}
	return ST_OK;
}

/* What graph_to_module builds one computation from. */
struct source {
	const Podemu__Graph *g;
	Podemu__Node *const *nodes;
	int n;
	const struct shape *shapes; /* of these nodes */
	bool entry;                 /* the root is a tuple of g's outputs (instruction n) */
	int root;                   /* otherwise: the node returned */
	int first;                  /* the global id of node 0 */
	struct hlo_computation **comps;
	int world;
};

/* How a control-flow node names its computations in HLO. */
static int link_calls(struct hlo_instruction *in, enum opcode op, const Podemu__Node *node,
                      const struct source *src, struct arena *a)
{
	in->calls = arena_calloc(a, node->n_called + 1, sizeof(*in->calls));
	if (in->calls == NULL)
		return -1;
	for (size_t k = 0; k < node->n_called; k++) {
		enum hlo_call_role role = op == OP_CALL          ? CALL_TO_APPLY
		                          : op == OP_CONDITIONAL ? CALL_BRANCH
		                          : k == 0               ? CALL_CONDITION
		                                                 : CALL_BODY;
		struct hlo_computation *callee = src->comps[node->called[k]];
		in->calls[in->n_calls++] = (struct hlo_call){role, callee->name, callee};
		if (op == OP_CALL) {
			in->to_apply = callee;
			in->to_apply_name = callee->name;
		}
	}
	return 0;
}

/* One computation's instructions from src's nodes (checked, with their shapes). */
static int build_computation(struct hlo_computation *c, const struct source *src, struct arena *a,
                             struct status *st)
{
	int n = src->n, count = src->entry ? n + 1 : n;
	struct hlo_instruction *ins = arena_calloc(a, (size_t)count + 1, sizeof(*ins));
	c->n_instructions = count;
	c->instructions = arena_calloc(a, (size_t)count + 1, sizeof(*c->instructions));
	c->parameters = arena_calloc(a, (size_t)count + 1, sizeof(*c->parameters));
	if (ins == NULL || c->instructions == NULL || c->parameters == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int i = 0; i < count; i++) {
		struct hlo_instruction *in = &ins[i];
		in->index = i;
		in->parent = c;
		in->parameter_number = -1;
		c->instructions[i] = in;
		const Podemu__Node *node = i < n ? src->nodes[i] : NULL;
		size_t n_ops = node != NULL ? node->n_operands : src->g->n_outputs;
		in->operands = arena_calloc(a, n_ops + 1, sizeof(*in->operands));
		if (in->operands == NULL)
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		for (size_t k = 0; k < n_ops; k++)
			in->operands[k] =
			    &ins[node != NULL ? node->operands[k] : src->g->outputs[k]];
		in->n_operands = (int)n_ops;
		if (node == NULL) { /* the entry's root: what the client holds */
			in->opcode = "tuple";
			in->name = "outputs";
			in->is_root = true;
			if (tuple_of_operands(in, a) != 0)
				return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
			c->root = in;
			continue;
		}
		enum opcode op = opcode_parse(node->opcode);
		in->opcode = node->opcode;
		char name[64];
		snprintf(name, sizeof(name), "%s.%d", node->opcode, src->first + i);
		in->name = node->name != NULL && node->name[0] != '\0' ? node->name
		                                                       : arena_strdup(a, name);
		if (in->name == NULL)
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		if (op == OP_OPT_BARRIER || op == OP_TUPLE) { /* its operands' shapes, as written */
			if (tuple_of_operands(in, a) != 0)
				return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		} else if (value_shape(&in->shape, &src->shapes[i], node->layout, a, st) != ST_OK) {
			char msg[STATUS_MESSAGE_MAX];
			snprintf(msg, sizeof(msg), "%s", st->message);
			return status_set(st, st->code, "node %d (%s): %s", src->first + i,
			                  node->opcode, msg);
		}
		in->n_dimensions = (int)node->n_dimensions;
		in->dimensions = node->dimensions;
		if (op == OP_ALL_TO_ALL &&
		    in->n_dimensions == 0) { /* XLA's form: dimensions={split} */
			if ((in->dimensions = arena_alloc(a, sizeof(int64_t))) == NULL)
				return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
			in->dimensions[0] = node->split_dimension;
			in->n_dimensions = 1;
		}
		if (op == OP_PARAMETER) {
			in->parameter_number =
			    src->entry ? c->n_parameters : node->parameter_number;
			c->parameters[in->parameter_number] = in;
			c->n_parameters++;
		} else if (op == OP_GET_TUPLE_ELEMENT) {
			in->has_index = true;
			in->tuple_index = node->tuple_index;
		} else if (opcode_is_control_flow(op)) {
			if (link_calls(in, op, node, src, a) != 0)
				return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		} else if (opcode_is_collective(op)) {
			int rv = groups_text(&in->replica_groups, src->g, node, src->first + i,
			                     src->world, a, st);
			if (rv != ST_OK)
				return rv;
			if (op == OP_ALL_REDUCE || op == OP_REDUCE_SCATTER)
				in->to_apply_name = reduction(node, a);
			if (op == OP_COLLECTIVE_PERMUTE &&
			    (in->source_target_pairs = pairs_text(node, a)) == NULL)
				return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		}
	}
	if (!src->entry) {
		c->root = &ins[src->root];
		c->root->is_root = true;
	}
	return ST_OK;
}

int graph_to_module(struct hlo_module *out, const Podemu__Graph *g, const struct shape *shapes,
                    int world, struct arena *a, struct status *st)
{
	memset(out, 0, sizeof(*out));
	int n_comps = (int)g->n_computations;
	struct hlo_computation **comps = arena_calloc(a, (size_t)n_comps + 1, sizeof(*comps));
	int *first = graph_first_ids(g, a);
	if (comps == NULL || first == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	/* Called computations first (each calls only earlier ones), the entry last. */
	for (int k = 0; k <= n_comps; k++) {
		struct hlo_computation *c = arena_calloc(a, 1, sizeof(*c));
		if (c == NULL)
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		c->index = k;
		comps[k] = c;
		const Podemu__Computation *gc = k < n_comps ? g->computations[k] : NULL;
		struct source src = {.g = g, .comps = comps, .world = world};
		if (gc != NULL) {
			c->name =
			    gc->name != NULL && gc->name[0] != '\0' ? gc->name : "computation";
			src.nodes = gc->nodes;
			src.n = (int)gc->n_nodes;
			src.root = gc->root;
			src.first = first[k];
		} else {
			c->name = "step";
			c->is_entry = true;
			src.nodes = g->nodes;
			src.n = (int)g->n_nodes;
			src.entry = true;
		}
		src.shapes = shapes + src.first;
		int rv = build_computation(c, &src, a, st);
		if (rv != ST_OK)
			return rv;
	}
	struct hlo_computation *c = comps[n_comps];
	struct hlo_instruction *ins = c->instructions[0];
	int n = (int)g->n_nodes;
	/* The parameters the client gave up: their buffers may become outputs. */
	if (g->n_donors > 0) {
		out->donors = arena_calloc(a, g->n_donors + 1, sizeof(*out->donors));
		if (out->donors == NULL)
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		for (size_t k = 0; k < g->n_donors; k++) {
			int d = g->donors[k];
			if (d < 0 || d >= n || ins[d].parameter_number < 0)
				return status_set(st, ST_INVALID_ARGUMENT,
				                  "donor %zu: node %d is not a parameter", k, d);
			out->donors[out->n_donors++].parameter = ins[d].parameter_number;
		}
	}
	out->name = "step";
	out->n_computations = n_comps + 1;
	out->computations = comps;
	out->entry = c;
	return ST_OK;
}
