/* The HLO text frontend: instructions and computations (hlo_module.c: the module and its header).
 */
#include "hlo.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "hlo_reader.h"

#define MAX_OPERANDS 65536

struct pending_operand {
	const char *name;
	const char *at;
};

/* What an instruction names by text until its computation is read. */
struct pending {
	int n_operands;
	struct pending_operand *operands;
	int n_control;
	struct pending_operand *control;
};

struct comp_builder {
	struct hlo_computation *c;
	int cap;
};

uint64_t hlo_name_hash(const char *name)
{
	uint64_t h = 1469598103934665603u;
	for (const char *q = name; *q; q++)
		h = (h ^ (unsigned char)*q) * 1099511628211u;
	return h;
}

static int push_instruction(struct reader *r, struct comp_builder *b, struct hlo_instruction *in,
                            const char *at)
{
	if (b->c->n_instructions == HLO_MAX_INSTRUCTIONS)
		return reader_fail(r, at, "more than %d instructions in %s", HLO_MAX_INSTRUCTIONS,
		                   b->c->name);
	if (reader_reserve(r, &b->c->instructions, b->c->n_instructions, &b->cap,
	                   sizeof(*b->c->instructions), at) != ST_OK)
		return ST_INVALID_ARGUMENT;
	in->index = b->c->n_instructions;
	in->parent = b->c;
	b->c->instructions[b->c->n_instructions++] = in;
	return ST_OK;
}

int reader_int_list(struct reader *r, const char *text, const char *at, int64_t **out, int *n)
{
	int count = 0;
	for (const char *q = text; *q; q++)
		count += *q == ',';
	int64_t *list = arena_calloc(r->a, (size_t)count + 1, sizeof(*list));
	if (list == NULL)
		return reader_fail(r, at, "out of host memory");
	int k = 0;
	const char *q = text;
	while (*q != '\0') {
		if (isdigit((unsigned char)*q) || (*q == '-' && isdigit((unsigned char)q[1]))) {
			bool neg = *q == '-';
			q += neg;
			int64_t v = 0;
			while (isdigit((unsigned char)*q)) {
				if (v > (HLO_MAX_DIM - (*q - '0')) / 10)
					return reader_fail(r, at, "%s: a number is too large",
					                   text);
				v = v * 10 + (*q++ - '0');
			}
			if (k <= count)
				list[k++] = neg ? -v : v;
		} else if (*q == '{' || *q == '}' || *q == ',' || isspace((unsigned char)*q)) {
			q++;
		} else {
			return reader_fail(r, at, "%s is not a list of integers", text);
		}
	}
	*out = list;
	*n = k;
	return ST_OK;
}

/* "%a" or "{%a, %b}" into names; each is added to *names. */
static int name_list(struct reader *r, const char *text, const char *at,
                     struct pending_operand **names, int *n)
{
	int cap = *n;
	const char *q = text;
	while (*q != '\0') {
		while (*q == '{' || *q == '}' || *q == ',' || isspace((unsigned char)*q))
			q++;
		const char *s = q;
		while (*q != '\0' && *q != ',' && *q != '}' && !isspace((unsigned char)*q))
			q++;
		if (q == s)
			continue;
		if (reader_reserve(r, names, *n, &cap, sizeof(**names), at) != ST_OK)
			return ST_INVALID_ARGUMENT;
		const char *name = reader_copy(r, s, q);
		if (name == NULL)
			return ST_INVALID_ARGUMENT;
		(*names)[(*n)++] = (struct pending_operand){hlo_bare(name), at};
	}
	return ST_OK;
}

const char *reader_attribute_value(struct reader *r)
{
	reader_skip(r);
	const char *s = r->p;
	if (reader_at(r, '{') || reader_at(r, '"'))
		return reader_balanced(r);
	int depth = 0;
	while (r->p < r->end && !(depth == 0 && (*r->p == ',' || isspace((unsigned char)*r->p))) &&
	       !(*r->p == '/' && r->p + 1 < r->end && (r->p[1] == '*' || r->p[1] == '/'))) {
		if (*r->p == '[' || *r->p == '(' || *r->p == '{')
			depth++;
		else if ((*r->p == ']' || *r->p == ')' || *r->p == '}') && depth > 0)
			depth--;
		else if (*r->p == ']' || *r->p == ')' || *r->p == '}')
			break;
		r->p++;
	}
	if (r->p == s) {
		reader_fail(r, s, "expected an attribute value");
		return NULL;
	}
	return reader_copy(r, s, r->p);
}

static const struct {
	const char *key;
	enum hlo_call_role role;
} call_keys[] = {
    {"to_apply", CALL_TO_APPLY},         {"calls", CALL_CALLS},
    {"called_computations", CALL_CALLS}, {"body", CALL_BODY},
    {"condition", CALL_CONDITION},       {"true_computation", CALL_BRANCH},
    {"false_computation", CALL_BRANCH},  {"branch_computations", CALL_BRANCH},
};

/* Adds the computations named by v to in->calls. */
static int add_calls(struct reader *r, struct hlo_instruction *in, enum hlo_call_role role,
                     const char *v, const char *at)
{
	struct pending_operand *names = NULL;
	int n = 0;
	if (name_list(r, v, at, &names, &n) != ST_OK)
		return ST_INVALID_ARGUMENT;
	struct hlo_call *calls = arena_calloc(r->a, (size_t)(in->n_calls + n) + 1, sizeof(*calls));
	if (calls == NULL)
		return reader_fail(r, at, "out of host memory");
	if (in->n_calls > 0)
		memcpy(calls, in->calls, (size_t)in->n_calls * sizeof(*calls));
	for (int k = 0; k < n; k++)
		calls[in->n_calls + k] = (struct hlo_call){role, names[k].name, NULL};
	in->calls = calls;
	in->n_calls += n;
	return ST_OK;
}

const char *reader_attribute_key(struct reader *r)
{
	reader_skip(r);
	const char *at = r->p;
	const char *key = reader_word(r);
	if (key == NULL) {
		reader_fail(r, at, "expected an attribute name");
		return NULL;
	}
	return reader_expect(r, '=', "after the attribute name") == ST_OK ? key : NULL;
}

static int attribute(struct reader *r, struct hlo_instruction *in, struct pending *pend)
{
	reader_skip(r);
	const char *at = r->p;
	const char *key = reader_attribute_key(r);
	if (key == NULL)
		return ST_INVALID_ARGUMENT;
	const char *v = reader_attribute_value(r);
	if (v == NULL)
		return ST_INVALID_ARGUMENT;
	for (size_t k = 0; k < sizeof(call_keys) / sizeof(call_keys[0]); k++)
		if (strcmp(key, call_keys[k].key) == 0) {
			if (call_keys[k].role == CALL_TO_APPLY)
				in->to_apply_name = hlo_bare(v);
			return add_calls(r, in, call_keys[k].role, v, at);
		}
	if (strcmp(key, "dimensions") == 0)
		return reader_int_list(r, v, at, &in->dimensions, &in->n_dimensions);
	if (strcmp(key, "index") == 0 || strcmp(key, "iota_dimension") == 0) {
		int64_t *list;
		int n;
		if (reader_int_list(r, v, at, &list, &n) != ST_OK)
			return ST_INVALID_ARGUMENT;
		if (n != 1 || list[0] < 0)
			return reader_fail(r, at, "%s=%s is not an index", key, v);
		if (key[0] == 'i' && key[1] == 'n') {
			in->has_index = true;
			in->tuple_index = list[0];
		} else {
			in->has_iota_dimension = true;
			in->iota_dimension = list[0];
		}
	} else if (strcmp(key, "control-predecessors") == 0) {
		return name_list(r, v, at, &pend->control, &pend->n_control);
	} else if (strcmp(key, "lhs_contracting_dims") == 0) {
		in->lhs_contracting_dims = v;
	} else if (strcmp(key, "rhs_contracting_dims") == 0) {
		in->rhs_contracting_dims = v;
	} else if (strcmp(key, "lhs_batch_dims") == 0 || strcmp(key, "rhs_batch_dims") == 0) {
		in->has_batch_dims |= strcmp(v, "{}") != 0;
	} else if (strcmp(key, "replica_groups") == 0) {
		in->replica_groups = v;
	} else if (strcmp(key, "source_target_pairs") == 0) {
		in->source_target_pairs = v;
	} else if (strcmp(key, "channel_id") == 0) {
		int64_t *list;
		int n;
		if (reader_int_list(r, v, at, &list, &n) != ST_OK || n != 1)
			return reader_fail(r, at, "channel_id=%s is not an integer", v);
		in->has_channel_id = true;
		in->channel_id = list[0];
	} else if (strcmp(key, "use_global_device_ids") == 0) {
		in->use_global_device_ids = strcmp(v, "true") == 0;
	} else if (strcmp(key, "slice") == 0) {
		in->slice = v;
	} else if (strcmp(key, "padding") == 0) {
		in->padding = v;
	} else if (strcmp(key, "direction") == 0) {
		in->direction = v;
	} else if (strcmp(key, "dynamic_slice_sizes") == 0) {
		return reader_int_list(r, v, at, &in->slice_sizes, &in->n_slice_sizes);
	} else if (strcmp(key, "custom_call_target") == 0) {
		in->custom_call_target = v;
	} else if (strcmp(key, "output_to_operand_aliasing") == 0) {
		in->operand_aliasing = v;
		if (strcmp(v, "{}") != 0)
			reader_warn(
			    r, in->line,
			    "%s: output_to_operand_aliasing=%s is not modelled: its outputs "
			    "get buffers of their own",
			    in->name, v);
	} else if (strcmp(key, "async_execution_thread") == 0) {
		in->execution_thread = v;
	} else if (strcmp(key, "backend_config") == 0) {
		in->backend_config = v;
	}
	return ST_OK; /* metadata, sharding, ...: nothing for memory */
}

/* The operands "(f32[8] %x, %y)" (each may carry its shape first). */
static int operands(struct reader *r, struct hlo_instruction *in, struct pending *pend)
{
	const char *at = r->p++;
	int cap = 0, n = 0;
	struct pending_operand *ops = NULL;
	if (!reader_accept(r, ')')) {
		do {
			reader_skip(r);
			const char *oat = r->p;
			const char *first = reader_word(r);
			reader_skip(r);
			const char *name = first;
			if (first == NULL || reader_at(r, '[') ||
			    (hlo_type_parse(first) != HT_INVALID && !reader_at(r, ',') &&
			     !reader_at(r, ')'))) {
				r->p = oat;
				struct hlo_shape ignored;
				if (hlo_read_shape(r, &ignored, 0) != ST_OK)
					return ST_INVALID_ARGUMENT;
				name = reader_word(r);
			}
			if (name == NULL)
				return reader_fail(r, oat, "expected an operand name");
			if (n == MAX_OPERANDS)
				return reader_fail(r, oat, "more than %d operands", MAX_OPERANDS);
			if (reader_reserve(r, &ops, n, &cap, sizeof(*ops), oat) != ST_OK)
				return ST_INVALID_ARGUMENT;
			ops[n++] = (struct pending_operand){hlo_bare(name), oat};
		} while (reader_accept(r, ','));
		if (reader_expect(r, ')', "to end the operands") != ST_OK)
			return ST_INVALID_ARGUMENT;
	}
	(void)at;
	in->n_operands = n;
	pend->operands = ops;
	pend->n_operands = n;
	return ST_OK;
}

/*
 * "[ROOT] name = [shape] opcode(operands), attributes": the shape may be left out for XLA to
 * infer, and the instruction may continue over several lines.
 */
static int instruction(struct reader *r, struct comp_builder *b, struct pending *pend,
                       struct hlo_instruction **out)
{
	reader_skip(r);
	const char *at = r->p;
	struct hlo_instruction *in = arena_calloc(r->a, 1, sizeof(*in));
	if (in == NULL)
		return reader_fail(r, at, "out of host memory");
	reader_position(r, at, &in->line, &in->column);
	in->parameter_number = -1;
	const char *w = reader_word(r);
	if (w != NULL && strcmp(w, "ROOT") == 0) {
		in->is_root = true;
		w = reader_word(r);
	}
	if (w == NULL)
		return reader_fail(r, at, "expected an instruction name");
	in->name = hlo_bare(w);
	if (reader_expect(r, '=', "after the instruction name") != ST_OK)
		return ST_INVALID_ARGUMENT;
	/* A shape, unless a word follows directly by '(': an opcode whose shape XLA infers. */
	reader_skip(r);
	const char *shape_at = r->p;
	const char *first = reader_at(r, '(') ? NULL : reader_word(r);
	reader_skip(r);
	if (first != NULL && reader_at(r, '(') && hlo_type_parse(first) == HT_INVALID) {
		in->opcode = first;
		in->shape_inferred = true;
	} else {
		r->p = shape_at;
		if (hlo_read_shape(r, &in->shape, 0) != ST_OK)
			return ST_INVALID_ARGUMENT;
		reader_skip(r);
		const char *op_at = r->p;
		in->opcode = reader_word(r);
		if (in->opcode == NULL)
			return reader_fail(r, op_at, "expected an opcode");
	}
	reader_skip(r);
	if (!reader_at(r, '('))
		return reader_fail(r, r->p, "expected '(' after %s", in->opcode);
	const char *op_at = r->p;
	if (strcmp(in->opcode, "constant") == 0) {
		in->literal = reader_balanced(r);
		if (in->literal == NULL)
			return ST_INVALID_ARGUMENT;
	} else if (strcmp(in->opcode, "parameter") == 0) {
		r->p++;
		if (reader_integer(r, &in->parameter_number, 1 << 20, "a parameter number") !=
		    ST_OK)
			return ST_INVALID_ARGUMENT;
		if (in->parameter_number < 0)
			return reader_fail(r, op_at, "parameter number %lld is negative",
			                   (long long)in->parameter_number);
		if (reader_expect(r, ')', "after the parameter number") != ST_OK)
			return ST_INVALID_ARGUMENT;
	} else if (operands(r, in, pend) != ST_OK) {
		return ST_INVALID_ARGUMENT;
	}
	if (in->shape_inferred && in->parameter_number >= 0)
		return reader_fail(r, at, "%s: a parameter needs its shape", in->name);
	while (reader_accept(r, ','))
		if (attribute(r, in, pend) != ST_OK)
			return ST_INVALID_ARGUMENT;
	reader_skip(r);
	if (r->p < r->end && *r->p != '}' && *r->p != '%' && !isalnum((unsigned char)*r->p) &&
	    *r->p != '_')
		return reader_fail(r, r->p, "unexpected '%c' after %s", *r->p, in->name);
	if (push_instruction(r, b, in, at) != ST_OK)
		return ST_INVALID_ARGUMENT;
	*out = in;
	return ST_OK;
}

const char *hlo_where(struct reader *r, const struct hlo_instruction *in)
{
	return reader_line_start(r, in->line) + in->column - 1;
}

/* The instruction of that name in the table, or NULL. */
static struct hlo_instruction *lookup(struct hlo_instruction **table, size_t cap, const char *name)
{
	size_t k = hlo_name_hash(name) & (cap - 1);
	while (table[k] != NULL && strcmp(table[k]->name, name) != 0)
		k = (k + 1) & (cap - 1);
	return table[k];
}

/* Names to instructions of the same computation: operands (defined before) and control edges. */
static int resolve(struct reader *r, struct hlo_computation *c, struct pending *pend)
{
	size_t cap = 16;
	while (cap < (size_t)c->n_instructions * 2)
		cap *= 2;
	struct hlo_instruction **table = arena_calloc(r->a, cap, sizeof(*table));
	if (table == NULL)
		return reader_fail(r, r->p, "out of host memory");
	for (int i = 0; i < c->n_instructions; i++) {
		struct hlo_instruction *in = c->instructions[i];
		size_t k = hlo_name_hash(in->name) & (cap - 1);
		while (table[k] != NULL) {
			if (strcmp(table[k]->name, in->name) == 0)
				return reader_fail(r, hlo_where(r, in), "%s is defined twice in %s",
				                   in->name, c->name);
			k = (k + 1) & (cap - 1);
		}
		table[k] = in;
	}
	for (int i = 0; i < c->n_instructions; i++) {
		struct hlo_instruction *in = c->instructions[i];
		struct pending *p = &pend[i];
		in->operands = arena_calloc(r->a, (size_t)p->n_operands + 1, sizeof(*in->operands));
		in->control_predecessors =
		    arena_calloc(r->a, (size_t)p->n_control + 1, sizeof(*in->control_predecessors));
		if (in->operands == NULL || in->control_predecessors == NULL)
			return reader_fail(r, r->p, "out of host memory");
		for (int j = 0; j < p->n_operands + p->n_control; j++) {
			bool control = j >= p->n_operands;
			const struct pending_operand *o =
			    control ? &p->control[j - p->n_operands] : &p->operands[j];
			struct hlo_instruction *def = lookup(table, cap, o->name);
			if (def == NULL)
				return reader_fail(r, o->at, "%s uses %s, which %s does not define",
				                   in->name, o->name, c->name);
			if (def->index >= in->index)
				return reader_fail(
				    r, o->at,
				    "%s uses %s, which is defined after it (instructions are "
				    "read in program order)",
				    in->name, o->name);
			if (control)
				in->control_predecessors[in->n_control_predecessors++] = def;
			else
				in->operands[j] = def;
		}
	}
	return ST_OK;
}

/* Parameters by number: 0..n-1, each once. */
static int number_parameters(struct reader *r, struct hlo_computation *c, const char *at)
{
	int n_params = 0;
	for (int i = 0; i < c->n_instructions; i++)
		n_params += c->instructions[i]->parameter_number >= 0;
	c->parameters = arena_calloc(r->a, (size_t)n_params + 1, sizeof(*c->parameters));
	if (c->parameters == NULL)
		return reader_fail(r, at, "out of host memory");
	c->n_parameters = n_params;
	for (int i = 0; i < c->n_instructions; i++) {
		struct hlo_instruction *in = c->instructions[i];
		if (in->parameter_number < 0)
			continue;
		if (in->parameter_number >= n_params || c->parameters[in->parameter_number])
			return reader_fail(
			    r, at, "%s: parameter numbers must be 0..%d, each once (%s is %lld)",
			    c->name, n_params - 1, in->name, (long long)in->parameter_number);
		c->parameters[in->parameter_number] = in;
	}
	return ST_OK;
}

/* Skips ", key=value" attributes (a computation's execution_thread, module flags). */
static int skip_attributes(struct reader *r)
{
	while (reader_accept(r, ','))
		if (reader_attribute_key(r) == NULL || reader_attribute_value(r) == NULL)
			return ST_INVALID_ARGUMENT;
	return ST_OK;
}

int hlo_read_computation(struct reader *r, struct hlo_computation **out)
{
	reader_skip(r);
	const char *at = r->p;
	struct hlo_computation *c = arena_calloc(r->a, 1, sizeof(*c));
	if (c == NULL)
		return reader_fail(r, at, "out of host memory");
	int col;
	reader_position(r, at, &c->line, &col);
	const char *w = reader_word(r);
	if (w != NULL && strcmp(w, "ENTRY") == 0) {
		c->is_entry = true;
		w = reader_word(r);
	}
	if (w == NULL)
		return reader_fail(r, at, "expected a computation name");
	c->name = hlo_bare(w);
	reader_skip(r);
	if (reader_at(r, '(') && reader_balanced(r) == NULL) /* the signature */
		return ST_INVALID_ARGUMENT;
	reader_skip(r);
	if (r->p + 1 < r->end && r->p[0] == '-' && r->p[1] == '>') {
		r->p += 2;
		struct hlo_shape ignored;
		if (hlo_read_shape(r, &ignored, 0) != ST_OK)
			return ST_INVALID_ARGUMENT;
	}
	if (reader_expect(r, '{', "to open the computation") != ST_OK)
		return ST_INVALID_ARGUMENT;
	struct comp_builder b = {c, 0};
	int cap_pend = 0;
	struct pending *pend = NULL;
	for (;;) {
		reader_skip(r);
		if (r->p >= r->end)
			return reader_fail(r, r->p, "computation %s is not closed with '}'",
			                   c->name);
		if (*r->p == '}') {
			r->p++;
			break;
		}
		if (reader_reserve(r, &pend, c->n_instructions, &cap_pend, sizeof(*pend), at) !=
		    ST_OK)
			return ST_INVALID_ARGUMENT;
		struct hlo_instruction *in = NULL;
		if (instruction(r, &b, &pend[c->n_instructions], &in) != ST_OK)
			return ST_INVALID_ARGUMENT;
		if (in->is_root) {
			if (c->root != NULL)
				return reader_fail(r, at,
				                   "%s has two ROOT instructions (%s and %s)",
				                   c->name, c->root->name, in->name);
			c->root = in;
		}
	}
	if (skip_attributes(r) != ST_OK)
		return ST_INVALID_ARGUMENT;
	if (c->n_instructions == 0)
		return reader_fail(r, at, "computation %s has no instructions", c->name);
	if (c->root == NULL) /* XLA: the last instruction is the root */
		c->root = c->instructions[c->n_instructions - 1];
	if (resolve(r, c, pend) != ST_OK || number_parameters(r, c, at) != ST_OK)
		return ST_INVALID_ARGUMENT;
	*out = c;
	return ST_OK;
}

bool hlo_is(const struct hlo_instruction *in, const char *op)
{
	return strcmp(in->opcode, op) == 0;
}

bool hlo_is_any(const struct hlo_instruction *in, const char *const *ops)
{
	for (; *ops != NULL; ops++)
		if (hlo_is(in, *ops))
			return true;
	return false;
}

struct hlo_computation *hlo_find_computation(const struct hlo_module *m, const char *name)
{
	name = hlo_bare(name);
	for (int i = 0; i < m->n_computations; i++)
		if (strcmp(m->computations[i]->name, name) == 0)
			return m->computations[i];
	return NULL;
}

int64_t hlo_known_trip_count(const struct hlo_instruction *in)
{
	/* backend_config={"known_trip_count":{"n":"10"}}, as XLA's while loop analysis writes it */
	const char *at = in->backend_config ? strstr(in->backend_config, "known_trip_count") : NULL;
	if (at == NULL || (at = strstr(at, "\"n\"")) == NULL)
		return 0;
	at += 3;
	while (*at == ':' || *at == ' ' || *at == '"')
		at++;
	long long n = 0;
	for (; *at >= '0' && *at <= '9' && n < (1LL << 40); at++)
		n = n * 10 + (*at - '0');
	return n;
}

struct hlo_computation *hlo_callee(const struct hlo_instruction *in, enum hlo_call_role role, int k)
{
	for (int i = 0; i < in->n_calls; i++)
		if (in->calls[i].role == role && k-- == 0)
			return in->calls[i].callee;
	return NULL;
}
