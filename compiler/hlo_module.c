/* The HLO text frontend: the module, its header (aliases, donors, the entry's layout) and links. */
#include <stdio.h>
#include <string.h>

#include "hlo.h"
#include "hlo_reader.h"

/* "{1, 2}" (a shape index) at r->p. */
static int shape_index(struct reader *r, int64_t **out, int *n)
{
	reader_skip(r);
	const char *at = r->p;
	if (!reader_at(r, '{'))
		return reader_fail(r, at, "expected a shape index such as {} or {1}");
	const char *text = reader_balanced(r);
	return text == NULL ? ST_INVALID_ARGUMENT : reader_int_list(r, text, at, out, n);
}

/*
 * input_output_alias={ {0}: (0, {}, may-alias), ... } and buffer_donor={ (0, {}), ... } into
 * *list (donors have no output index).
 */
static int alias_list(struct reader *r, bool donors, struct hlo_alias **list, int *n)
{
	int cap = 0;
	if (reader_expect(r, '{', "to open the list") != ST_OK)
		return ST_INVALID_ARGUMENT;
	if (reader_accept(r, '}'))
		return ST_OK;
	do {
		reader_skip(r);
		const char *at = r->p;
		if (reader_reserve(r, list, *n, &cap, sizeof(**list), at) != ST_OK)
			return ST_INVALID_ARGUMENT;
		struct hlo_alias *e = &(*list)[*n];
		if (!donors && (shape_index(r, &e->output_index, &e->output_index_len) != ST_OK ||
		                reader_expect(r, ':', "after the output index") != ST_OK))
			return ST_INVALID_ARGUMENT;
		if (reader_expect(r, '(', "before the parameter number") != ST_OK ||
		    reader_integer(r, &e->parameter, 1 << 20, "a parameter number") != ST_OK ||
		    reader_expect(r, ',', "after the parameter number") != ST_OK ||
		    shape_index(r, &e->parameter_index, &e->parameter_index_len) != ST_OK)
			return ST_INVALID_ARGUMENT;
		if (reader_accept(r, ',')) {
			const char *kind_at = r->p;
			const char *kind = reader_word(r);
			if (kind == NULL ||
			    (strcmp(kind, "may-alias") != 0 && strcmp(kind, "must-alias") != 0))
				return reader_fail(r, kind_at, "expected may-alias or must-alias");
			e->must = strcmp(kind, "must-alias") == 0;
		}
		if (reader_expect(r, ')', "to end the alias") != ST_OK)
			return ST_INVALID_ARGUMENT;
		(*n)++;
	} while (reader_accept(r, ','));
	return reader_expect(r, '}', "to end the list");
}

/* The module's header attributes after "HloModule name". */
static int header(struct reader *r, struct hlo_module *m, struct hlo_shape *entry_layout)
{
	while (reader_accept(r, ',')) {
		const char *key = reader_attribute_key(r);
		if (key == NULL)
			return ST_INVALID_ARGUMENT;
		int rv = ST_OK;
		if (strcmp(key, "input_output_alias") == 0) {
			rv = alias_list(r, false, &m->aliases, &m->n_aliases);
		} else if (strcmp(key, "buffer_donor") == 0) {
			rv = alias_list(r, true, &m->donors, &m->n_donors);
		} else if (strcmp(key, "entry_computation_layout") == 0) {
			struct hlo_shape result;
			if (reader_expect(r, '{', "to open the layout") != ST_OK ||
			    hlo_read_shape(r, entry_layout, 0) != ST_OK)
				return ST_INVALID_ARGUMENT;
			reader_skip(r);
			if (r->p + 1 >= r->end || r->p[0] != '-' || r->p[1] != '>')
				return reader_fail(r, r->p, "expected '->' in the entry layout");
			r->p += 2;
			rv = hlo_read_shape(r, &result, 0) != ST_OK
			         ? ST_INVALID_ARGUMENT
			         : reader_expect(r, '}', "to end the entry layout");
		} else {
			const char *v = reader_attribute_value(r);
			if (v == NULL)
				return ST_INVALID_ARGUMENT;
			if (strcmp(key, "is_scheduled") == 0)
				m->is_scheduled = strcmp(v, "true") == 0;
		}
		if (rv != ST_OK)
			return rv;
	}
	return ST_OK;
}

/*
 * Entry parameters keep the layout entry_computation_layout gives them where their own text
 * writes none (a dump of an optimized module writes tiles in one place or the other).
 */
static void apply_entry_layout(struct hlo_module *m, const struct hlo_shape *layout)
{
	if (layout->type != HT_TUPLE)
		return;
	struct hlo_computation *e = m->entry;
	for (int k = 0; k < e->n_parameters && k < layout->n_tuple; k++) {
		struct hlo_shape *s = &e->parameters[k]->shape;
		const struct hlo_shape *l = &layout->tuple[k];
		if (s->type == HT_TUPLE || s->n_tiles > 0 || s->memory_space != 0 ||
		    l->rank != s->rank || l->type != s->type || !l->has_layout)
			continue;
		s->has_layout = true;
		if (l->minor_to_major != NULL)
			s->minor_to_major = l->minor_to_major;
		s->n_tiles = l->n_tiles;
		s->tiles = l->tiles;
		s->element_bits = l->element_bits;
		s->memory_space = l->memory_space;
	}
}

/*
 * The computations by name, in an open-addressing table of *cap slots (a power of two), so
 * that a module of many fusions links in linear time; INVALID_ARGUMENT for a name defined
 * twice.
 */
static int computation_table(struct reader *r, const struct hlo_module *m,
                             struct hlo_computation ***out, size_t *cap)
{
	*cap = 16;
	while (*cap < (size_t)m->n_computations * 2)
		*cap *= 2;
	struct hlo_computation **table = arena_calloc(r->a, *cap, sizeof(*table));
	if (table == NULL)
		return reader_fail(r, r->p, "out of host memory");
	for (int i = 0; i < m->n_computations; i++) {
		struct hlo_computation *c = m->computations[i];
		c->index = i;
		size_t k = hlo_name_hash(c->name) & (*cap - 1);
		for (; table[k] != NULL; k = (k + 1) & (*cap - 1))
			if (strcmp(table[k]->name, c->name) == 0)
				return reader_fail(r, reader_line_start(r, c->line),
				                   "computation %s is defined twice", c->name);
		table[k] = c;
	}
	*out = table;
	return ST_OK;
}

static struct hlo_computation *table_find(struct hlo_computation **table, size_t cap,
                                          const char *name)
{
	name = hlo_bare(name);
	size_t k = hlo_name_hash(name) & (cap - 1);
	for (; table[k] != NULL; k = (k + 1) & (cap - 1))
		if (strcmp(table[k]->name, name) == 0)
			return table[k];
	return NULL;
}

/* Computation names to computations, then the shapes XLA infers, in module order. */
static int link(struct reader *r, struct hlo_module *m)
{
	struct hlo_computation **table = NULL;
	size_t cap = 0;
	if (computation_table(r, m, &table, &cap) != ST_OK)
		return ST_INVALID_ARGUMENT;
	for (int i = 0; i < m->n_computations; i++) {
		struct hlo_computation *c = m->computations[i];
		for (int j = 0; j < c->n_instructions; j++) {
			struct hlo_instruction *in = c->instructions[j];
			for (int k = 0; k < in->n_calls; k++) {
				struct hlo_call *call = &in->calls[k];
				call->callee = table_find(table, cap, call->name);
				static const char *const keys[] = {"to_apply", "calls", "body",
				                                   "condition",
				                                   "branch_computations"};
				if (call->callee == NULL)
					return reader_fail(r, hlo_where(r, in),
					                   "%s: %s=%s is not defined", in->name,
					                   keys[call->role], call->name);
				if (call->callee == c)
					return reader_fail(r, hlo_where(r, in),
					                   "%s: %s calls itself", in->name,
					                   c->name);
				if (call->role == CALL_TO_APPLY)
					in->to_apply = call->callee;
			}
			if (in->shape_inferred && hlo_infer_shape(r, in) != ST_OK)
				return ST_INVALID_ARGUMENT;
		}
	}
	return ST_OK;
}

int hlo_parse(const char *text, size_t len, struct arena *a, struct hlo_module *out,
              struct status *st)
{
	memset(out, 0, sizeof(*out));
	struct reader r = {.p = text, .end = text + len, .start = text, .a = a, .st = st, .m = out};
	reader_skip(&r);
	const char *w = reader_word(&r);
	if (w == NULL || strcmp(w, "HloModule") != 0)
		return reader_fail(&r, r.start, "HLO text starts with 'HloModule NAME'");
	const char *name = reader_word(&r);
	if (name == NULL)
		return reader_fail(&r, r.p, "expected the module name after HloModule");
	out->name = name;
	struct hlo_shape entry_layout = {0};
	if (header(&r, out, &entry_layout) != ST_OK)
		return ST_INVALID_ARGUMENT;
	int cap = 0;
	for (;;) {
		reader_skip(&r);
		if (r.p >= r.end)
			break;
		struct hlo_computation *c = NULL;
		if (hlo_read_computation(&r, &c) != ST_OK)
			return ST_INVALID_ARGUMENT;
		if (c->is_entry) {
			if (out->entry != NULL)
				return reader_fail(&r, r.p, "two ENTRY computations (%s and %s)",
				                   out->entry->name, c->name);
			out->entry = c;
		}
		if (reader_reserve(&r, &out->computations, out->n_computations, &cap,
		                   sizeof(*out->computations), r.p) != ST_OK)
			return ST_INVALID_ARGUMENT;
		out->computations[out->n_computations++] = c;
	}
	if (out->n_computations == 0)
		return reader_fail(&r, r.p, "module %s has no computations", out->name);
	if (out->entry == NULL) /* XLA: the last computation is the entry */
		out->entry = out->computations[out->n_computations - 1];
	if (link(&r, out) != ST_OK)
		return ST_INVALID_ARGUMENT;
	apply_entry_layout(out, &entry_layout);
	return ST_OK;
}
