/*
 * Control flow on a core: while, conditional and call run their computations as frames. A
 * computation's temporaries sit in its callee heap, which the plan put at the call site's
 * offset in the caller's frame (frames nest inside the one reservation); its parameters are
 * the caller's values and its results go into the call's own elements. A while body's
 * results are staged in host memory and copied into the loop state after each iteration,
 * which the plan counts as written in place (XLA's copy insertion makes that safe there).
 * A pod without bytes cannot read a predicate: a while runs its known trip count (once when
 * unknown), a conditional its first branch.
 */
#include <stdio.h>
#include <string.h>

#include "step.h"

#define NODE_NAME(s, id) ((s)->node_of[id]->opcode)

/* Elements of a value of shape sh: a tuple's count, 1 for an array. */
static int element_count(const struct shape *sh)
{
	return sh->tuple ? sh->n_elements : 1;
}

static const struct shape *element_shape(const struct shape *sh, int k)
{
	return sh->tuple ? &sh->elements[k] : sh;
}

/* The id of computation comp's root. */
static int root_of(const struct step *s, int comp)
{
	return s->comp_first[comp] + s->prog->graph->computations[comp]->root;
}

/* Checks one element's assignment of control-flow node id (slots: its computation's). */
static int check_element(struct step *s, int id, int k, const Podemu__BufferAssignment *e,
                         int64_t bytes, struct status *st)
{
	const Podemu__BufferAssignment *target;
	switch (e->kind) {
	case PODEMU__BUFFER_KIND__BUFFER_TEMP:
		if (e->offset >= 0 && e->offset <= s->prog->temp_bytes &&
		    bytes <= s->prog->temp_bytes - e->offset)
			return ST_OK;
		break;
	case PODEMU__BUFFER_KIND__BUFFER_ALIAS: /* an output of the entry holds it: it, or later */
		if (s->comp_of[id] != -1 || e->alias_of < id || (size_t)e->alias_of >= s->n_entry)
			break;
		target = s->prog->buffers[e->alias_of];
		if (target->kind == PODEMU__BUFFER_KIND__BUFFER_OUTPUT && target->donor == 0 &&
		    target->bytes >= bytes)
			return ST_OK;
		break;
	case PODEMU__BUFFER_KIND__BUFFER_CALLER:
		if (s->comp_of[id] >= 0 && e->alias_of >= 0 &&
		    e->alias_of < element_count(&s->shapes[root_of(s, s->comp_of[id])]))
			return ST_OK;
		break;
	default:
		break;
	}
	return status_set(st, ST_INVALID_ARGUMENT, "%s (node %d): element %d: invalid assignment",
	                  NODE_NAME(s, id), id, k);
}

/* A node of a called computation: what it may be assigned, and what the pod runs. */
static int check_nested(struct step *s, int id, struct status *st)
{
	const Podemu__BufferAssignment *b = s->prog->buffers[id];
	enum opcode op = s->ops[id];
	int comp = s->comp_of[id];
	int64_t bytes = shape_bytes(&s->shapes[id]);
	switch (b->kind) {
	case PODEMU__BUFFER_KIND__BUFFER_CALLER:
		if (op == OP_PARAMETER
		        ? b->alias_of == -1
		        : b->alias_of >= 0 &&
		              b->alias_of < element_count(&s->shapes[root_of(s, comp)]))
			return ST_OK;
		break;
	case PODEMU__BUFFER_KIND__BUFFER_ALIAS:
		if (op == OP_GET_TUPLE_ELEMENT && b->alias_of >= s->comp_first[comp] &&
		    b->alias_of < id)
			return ST_OK;
		break;
	case PODEMU__BUFFER_KIND__BUFFER_NONE:
		if (op == OP_OPT_BARRIER || op == OP_TUPLE || step_has_elements(s, id))
			return ST_OK;
		break;
	case PODEMU__BUFFER_KIND__BUFFER_FUSED:
		if (s->prog->n_fused_into && s->prog->fused_into[id] != -1)
			return ST_OK;
		break;
	case PODEMU__BUFFER_KIND__BUFFER_TEMP:
		if (op != OP_PARAMETER && op != OP_GET_TUPLE_ELEMENT && op != OP_TUPLE &&
		    !opcode_is_control_flow(op) && b->offset >= 0 &&
		    b->offset <= s->prog->temp_bytes && bytes <= s->prog->temp_bytes - b->offset)
			return ST_OK;
		break;
	default:
		break;
	}
	return status_set(st, ST_INVALID_ARGUMENT, "%s (node %d): invalid buffer assignment",
	                  NODE_NAME(s, id), id);
}

/* The order of each computation's nodes: a permutation of them. */
static int check_order(struct step *s, struct status *st)
{
	const Podemu__Program *p = s->prog;
	size_t nested = s->n_total - s->n_entry;
	if (p->n_computation_order == 0)
		return ST_OK;
	if (p->n_computation_order != nested)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "program orders %zu nodes of computations, which have %zu",
		                  p->n_computation_order, nested);
	bool *seen = arena_calloc(s->arena, nested + 1, sizeof(bool));
	if (seen == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (size_t c = 0; c < p->graph->n_computations; c++) {
		int first = s->comp_first[c] - (int)s->n_entry;
		int n = (int)p->graph->computations[c]->n_nodes;
		for (int k = 0; k < n; k++) {
			int local = p->computation_order[first + k];
			if (local < 0 || local >= n || seen[first + local])
				return status_set(st, ST_INVALID_ARGUMENT,
				                  "computation %zu: its order is not a permutation",
				                  c);
			seen[first + local] = true;
		}
	}
	return ST_OK;
}

int control_check(struct device *dev, struct step *s, struct status *st)
{
	const Podemu__Program *p = s->prog;
	int rv = check_order(s, st);
	for (size_t id = s->n_entry; rv == ST_OK && id < s->n_total; id++)
		rv = check_nested(s, (int)id, st);
	for (size_t id = 0; rv == ST_OK && id < s->n_total; id++) {
		const Podemu__BufferAssignment *b = p->buffers[id];
		if (!step_has_elements(s, (int)id))
			continue;
		int n = element_count(&s->shapes[id]);
		bool own = b->kind == PODEMU__BUFFER_KIND__BUFFER_OUTPUT && !s->shapes[id].tuple &&
		           s->comp_of[id] == -1; /* an array result held: its own device buffer */
		if ((b->kind != PODEMU__BUFFER_KIND__BUFFER_NONE && !own) ||
		    (int)b->n_elements != n || b->offset < 0 || b->offset > p->temp_bytes ||
		    s->node_of[id]->known_trip_count < 0)
			rv = status_set(st, ST_INVALID_ARGUMENT,
			                "%s (node %zu): invalid assignment of its %d elements",
			                NODE_NAME(s, id), id, n);
		for (int k = 0; rv == ST_OK && k < n; k++)
			rv = check_element(s, (int)id, k, b->elements[k],
			                   shape_bytes(element_shape(&s->shapes[id], k)), st);
	}
	if (rv != ST_OK)
		return rv;
	/* Where each core's values placed at run time go. */
	int cores = dev->cores_per_host;
	s->ptrs = arena_calloc(s->arena, (size_t)cores, sizeof(*s->ptrs));
	s->elems = arena_calloc(s->arena, (size_t)cores, sizeof(*s->elems));
	if (s->ptrs == NULL || s->elems == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int c = 0; c < cores; c++) {
		s->ptrs[c] = arena_calloc(s->arena, s->n_total + 1, sizeof(void *));
		s->elems[c] = arena_calloc(s->arena, s->n_total + 1, sizeof(void **));
		if (s->ptrs[c] == NULL || s->elems[c] == NULL)
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		for (size_t id = 0; id < s->n_total; id++) {
			enum opcode op = s->ops[id];
			bool tuple = s->shapes[id].tuple && op != OP_GET_TUPLE_ELEMENT;
			if (!tuple && !step_has_elements(s, (int)id))
				continue;
			int n = element_count(&s->shapes[id]);
			s->elems[c][id] = arena_calloc(s->arena, (size_t)n + 1, sizeof(void *));
			if (s->elems[c][id] == NULL)
				return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		}
	}
	return ST_OK;
}

int control_allocate(struct device *dev, struct step *s, struct status *st)
{
	if (!dev->backed)
		return ST_OK;
	int cores = dev->cores_per_host;
	for (size_t id = 0; id < s->n_total; id++) {
		if (s->ops[id] != OP_WHILE)
			continue;
		if (s->staging == NULL && (s->staging = arena_calloc(s->arena, (size_t)cores,
		                                                     sizeof(*s->staging))) == NULL)
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		int n = element_count(&s->shapes[id]);
		for (int c = 0; c < cores; c++) {
			if (s->staging[c] == NULL &&
			    (s->staging[c] = arena_calloc(s->arena, s->n_total + 1,
			                                  sizeof(**s->staging))) == NULL)
				return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
			void **r = arena_calloc(s->arena, (size_t)n + 1, sizeof(void *));
			if (r == NULL)
				return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
			for (int k = 0; k < n; k++) {
				int64_t bytes = shape_bytes(element_shape(&s->shapes[id], k));
				if ((r[k] = arena_alloc(s->arena, (size_t)bytes + 1)) == NULL)
					return status_set(
					    st, ST_RESOURCE_EXHAUSTED,
					    "while (node %zu): out of host memory staging "
					    "%lld bytes",
					    id, (long long)bytes);
			}
			s->staging[c][id] = r;
		}
	}
	return ST_OK;
}

int control_frame_ptr(struct step *s, struct core *c, const struct frame *f, int64_t offset,
                      int64_t bytes, int id, void **out, struct status *st)
{
	int64_t at = f->base + offset;
	if (at < 0 || at > s->prog->temp_bytes || bytes > s->prog->temp_bytes - at)
		return status_set(
		    st, ST_INVALID_ARGUMENT,
		    "%s (node %d): [%lld, +%lld) is outside the %lld-byte reservation",
		    NODE_NAME(s, id), id, (long long)at, (long long)bytes,
		    (long long)s->prog->temp_bytes);
	*out = hbm_ptr(&c->heap, at);
	return ST_OK;
}

int control_place(struct step *s, struct core *c, const struct frame *f, int id, struct status *st)
{
	const Podemu__BufferAssignment *b = s->prog->buffers[id];
	const Podemu__Node *n = s->node_of[id];
	void **ptr = &s->ptrs[c->local][id];
	enum opcode op = s->ops[id];
	if (op == OP_TUPLE) {
		for (size_t k = 0; k < n->n_operands; k++)
			s->elems[c->local][id][k] = core_ptr(c, s, step_operand(s, id, k));
		return ST_OK;
	}
	if (f->comp < 0 && b->kind != PODEMU__BUFFER_KIND__BUFFER_ALIAS)
		return ST_OK; /* the entry's values are where step_allocate put them */
	switch (b->kind) {
	case PODEMU__BUFFER_KIND__BUFFER_TEMP:
		return control_frame_ptr(s, c, f, b->offset, shape_bytes(&s->shapes[id]), id, ptr,
		                         st);
	case PODEMU__BUFFER_KIND__BUFFER_CALLER:
		if (op != OP_PARAMETER) {
			if (b->alias_of >= f->n_results)
				return status_set(st, ST_INVALID_ARGUMENT,
				                  "%s (node %d): result %d of %d", n->opcode, id,
				                  b->alias_of, f->n_results);
			*ptr = f->results[b->alias_of];
			return ST_OK;
		}
		if (n->parameter_number >= f->n_args)
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "parameter (node %d): argument %lld of %d", id,
			                  (long long)n->parameter_number, f->n_args);
		const struct step_arg *arg = &f->args[n->parameter_number];
		if (s->shapes[id].tuple) {
			if (arg->n != s->shapes[id].n_elements || arg->elems == NULL)
				return status_set(
				    st, ST_INVALID_ARGUMENT,
				    "parameter (node %d): its argument is no tuple of %d", id,
				    s->shapes[id].n_elements);
			memcpy(s->elems[c->local][id], arg->elems, (size_t)arg->n * sizeof(void *));
		} else {
			*ptr = arg->ptr;
		}
		return ST_OK;
	case PODEMU__BUFFER_KIND__BUFFER_ALIAS: {
		/* A get-tuple-element: the element of a tuple value, or the node it forwards. */
		void **elems = s->elems[c->local][b->alias_of];
		*ptr = elems != NULL ? elems[n->tuple_index] : core_ptr(c, s, b->alias_of);
		return ST_OK;
	}
	default:
		return ST_OK;
	}
}

/* The value of node id as an argument (a tuple's elements, or an array). */
static struct step_arg argument(struct step *s, struct core *c, int id)
{
	void **elems = s->elems[c->local][id];
	if (elems != NULL && s->shapes[id].tuple)
		return (struct step_arg){.elems = elems, .n = s->shapes[id].n_elements};
	return (struct step_arg){.ptr = core_ptr(c, s, id), .n = 1};
}

/* Copies what computation comp returned into out[] where it is not there already. */
static void collect(struct device *dev, struct step *s, struct core *c, int comp, void **out)
{
	if (!dev->backed)
		return;
	int r = root_of(s, comp);
	const struct shape *sh = &s->shapes[r];
	for (int k = 0; k < element_count(sh); k++) {
		void *from = s->ops[r] == OP_TUPLE ? core_ptr(c, s, step_operand(s, r, (size_t)k))
		             : sh->tuple           ? s->elems[c->local][r][k]
		                                   : core_ptr(c, s, r);
		if (from != out[k] && from != NULL && out[k] != NULL)
			memmove(out[k], from, (size_t)shape_bytes(element_shape(sh, k)));
	}
}

/* Runs computation comp on core c with arguments args, its results into out[n]. */
static int call(struct device *dev, struct step *s, struct core *c, int comp, int64_t base,
                const struct step_arg *args, int n_args, void *const *out, int n, struct status *st)
{
	struct frame f = {.comp = comp,
	                  .base = base,
	                  .args = args,
	                  .n_args = n_args,
	                  .results = out,
	                  .n_results = n};
	return step_run_nodes(dev, s, c, &f, st);
}

static int run_while(struct device *dev, struct step *s, struct core *c, int id, void **state,
                     int n, int64_t base, struct status *st)
{
	const Podemu__Node *node = s->node_of[id];
	int cond = node->called[0], body = node->called[1];
	struct step_arg init = argument(s, c, step_operand(s, id, 0));
	for (int k = 0; dev->backed && k < n; k++) {
		void *from = init.elems ? init.elems[k] : init.ptr;
		if (from != state[k])
			memmove(state[k], from,
			        (size_t)shape_bytes(element_shape(&s->shapes[id], k)));
	}
	struct step_arg arg = s->shapes[id].tuple ? (struct step_arg){.elems = state, .n = n}
	                                          : (struct step_arg){.ptr = state[0], .n = 1};
	void **staged = dev->backed ? s->staging[c->local][id] : state;
	int64_t trips = node->known_trip_count > 0 ? node->known_trip_count : 1;
	for (int64_t i = 0;; i++) {
		if (s->cancel_code != ST_OK)
			return status_set(st, s->cancel_code, "%s", s->cancel_reason);
		int rv = call(dev, s, c, cond, base, &arg, 1, NULL, 0, st);
		if (rv != ST_OK)
			return rv;
		bool more = dev->backed
		                ? *(const unsigned char *)core_ptr(c, s, root_of(s, cond)) != 0
		                : i < trips;
		if (!more)
			return ST_OK;
		if ((rv = call(dev, s, c, body, base, &arg, 1, staged, n, st)) != ST_OK)
			return rv;
		/* The next state: the body's results, through staging (they may read the state). */
		collect(dev, s, c, body, staged);
		for (int k = 0; dev->backed && k < n; k++)
			memmove(state[k], staged[k],
			        (size_t)shape_bytes(element_shape(&s->shapes[id], k)));
	}
}

int control_run(struct device *dev, struct step *s, struct core *c, const struct frame *f, int id,
                struct status *st)
{
	const Podemu__BufferAssignment *b = s->prog->buffers[id];
	const Podemu__Node *node = s->node_of[id];
	int n = element_count(&s->shapes[id]);
	void **out = s->elems[c->local][id];
	/* Its own result: in its frame, in a later output, or in its caller's result. */
	for (int k = 0; k < n; k++) {
		const Podemu__BufferAssignment *e = b->elements[k];
		int rv = ST_OK;
		if (e->kind == PODEMU__BUFFER_KIND__BUFFER_TEMP)
			rv = control_frame_ptr(s, c, f, e->offset,
			                       shape_bytes(element_shape(&s->shapes[id], k)), id,
			                       &out[k], st);
		else if (e->kind == PODEMU__BUFFER_KIND__BUFFER_ALIAS)
			out[k] = core_ptr(c, s, e->alias_of);
		else if (e->alias_of < f->n_results)
			out[k] = f->results[e->alias_of];
		else
			rv = status_set(st, ST_INVALID_ARGUMENT, "%s (node %d): result %d of %d",
			                node->opcode, id, e->alias_of, f->n_results);
		if (rv != ST_OK)
			return rv;
	}
	if (!s->shapes[id].tuple)
		s->ptrs[c->local][id] = out[0];
	int64_t base = f->base + b->offset;
	enum opcode op = s->ops[id];
	int rv;
	if (op == OP_WHILE) {
		rv = run_while(dev, s, c, id, out, n, base, st);
	} else if (op == OP_CALL) {
		struct step_arg args[64];
		if (node->n_operands > 64)
			return status_set(st, ST_UNIMPLEMENTED,
			                  "call (node %d): more than 64 arguments", id);
		for (size_t k = 0; k < node->n_operands; k++)
			args[k] = argument(s, c, step_operand(s, id, k));
		rv =
		    call(dev, s, c, node->called[0], base, args, (int)node->n_operands, out, n, st);
		if (rv == ST_OK)
			collect(dev, s, c, node->called[0], out);
	} else {
		/* conditional: a pred picks true (0) or false (1); an s32 out of range the last */
		int branches = (int)node->n_called, pick = 0;
		const void *index = core_ptr(c, s, step_operand(s, id, 0));
		if (dev->backed && index != NULL) {
			if (s->shapes[step_operand(s, id, 0)].dtype == DT_PRED) {
				pick = *(const unsigned char *)index ? 0 : 1;
			} else {
				int32_t v;
				memcpy(&v, index, sizeof(v));
				pick = v < 0 || v >= branches ? branches - 1 : v;
			}
		}
		struct step_arg arg = argument(s, c, step_operand(s, id, (size_t)pick + 1));
		rv = call(dev, s, c, node->called[pick], base, &arg, 1, out, n, st);
		if (rv == ST_OK)
			collect(dev, s, c, node->called[pick], out);
	}
	if (rv != ST_OK)
		return status_set(st, rv, "%s (node %d) on core %d: %s", node->opcode,
		                  step_source_node(s, id), c->ordinal, st->message);
	return ST_OK;
}
