#include "hlo.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const struct {
	const char *name;
	int bits;
} types[HT_COUNT] = {
    [HT_INVALID] = {"invalid", 0}, [HT_PRED] = {"pred", 8},
    [HT_S4] = {"s4", 4},           [HT_S8] = {"s8", 8},
    [HT_S16] = {"s16", 16},        [HT_S32] = {"s32", 32},
    [HT_S64] = {"s64", 64},        [HT_U4] = {"u4", 4},
    [HT_U8] = {"u8", 8},           [HT_U16] = {"u16", 16},
    [HT_U32] = {"u32", 32},        [HT_U64] = {"u64", 64},
    [HT_F16] = {"f16", 16},        [HT_BF16] = {"bf16", 16},
    [HT_F32] = {"f32", 32},        [HT_F64] = {"f64", 64},
    [HT_C64] = {"c64", 64},        [HT_C128] = {"c128", 128},
    [HT_F8E5M2] = {"f8e5m2", 8},   [HT_F8E4M3FN] = {"f8e4m3fn", 8},
    [HT_TOKEN] = {"token", 0},     [HT_TUPLE] = {"tuple", 0},
};

const char *hlo_type_name(enum hlo_type t)
{
	return t > HT_INVALID && t < HT_COUNT ? types[t].name : "invalid";
}

int hlo_type_bits(enum hlo_type t)
{
	return t > HT_INVALID && t < HT_COUNT ? types[t].bits : 0;
}

int64_t hlo_shape_elements(const struct hlo_shape *s)
{
	if (s->type == HT_TUPLE || s->type == HT_TOKEN)
		return 0;
	int64_t n = 1;
	for (int i = 0; i < s->rank; i++)
		n *= s->dims[i]; /* bounded when parsed */
	return n;
}

int64_t hlo_shape_bytes(const struct hlo_shape *s)
{
	return (hlo_shape_elements(s) * hlo_type_bits(s->type) + 7) / 8;
}

char *hlo_shape_format(char *buf, size_t len, const struct hlo_shape *s)
{
	size_t at = 0;
	buf[0] = '\0';
#define PUT(...)                                                                                   \
	do {                                                                                       \
		if (at < len)                                                                      \
			at += (size_t)snprintf(buf + at, len - at, __VA_ARGS__);                   \
	} while (0)
	if (s->type == HT_TUPLE) {
		PUT("(");
		for (int i = 0; i < s->n_tuple; i++) {
			char inner[256];
			PUT("%s%s", i ? ", " : "",
			    hlo_shape_format(inner, sizeof(inner), &s->tuple[i]));
		}
		PUT(")");
		return buf;
	}
	PUT("%s[", hlo_type_name(s->type));
	for (int i = 0; i < s->rank; i++)
		PUT("%s%lld", i ? "," : "", (long long)s->dims[i]);
	PUT("]");
#undef PUT
	return buf;
}

/* ---- the reader ---- */

/* Largest dimension and element count accepted (well past any real HBM). */
#define MAX_DIM (1LL << 40)
#define MAX_ELEMENTS (1LL << 50)
#define MAX_TUPLE 4096
#define MAX_OPERANDS 65536

struct reader {
	const char *p, *end, *start;
	struct arena *a;
	struct status *st;
	int failed;
	/* The last position asked for, so that walking forward costs O(text) in all. */
	const char *mark;
	int mark_line, mark_col;
};

static void position(struct reader *r, const char *at, int *line, int *col)
{
	if (r->mark == NULL || at < r->mark) {
		r->mark = r->start;
		r->mark_line = 1;
		r->mark_col = 1;
	}
	for (; r->mark < at && r->mark < r->end; r->mark++) {
		if (*r->mark == '\n') {
			r->mark_line++;
			r->mark_col = 1;
		} else {
			r->mark_col++;
		}
	}
	*line = r->mark_line;
	*col = r->mark_col;
}

static int fail(struct reader *r, const char *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(struct reader *r, const char *at, const char *fmt, ...)
{
	if (r->failed)
		return ST_INVALID_ARGUMENT;
	char msg[STATUS_MESSAGE_MAX];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	int line, col;
	position(r, at, &line, &col);
	r->failed = 1;
	return status_set(r->st, ST_INVALID_ARGUMENT, "line %d, column %d: %s", line, col, msg);
}

/* The text [s, e) copied into the arena, or NULL after an error. */
static const char *copy_text(struct reader *r, const char *s, const char *e)
{
	size_t n = (size_t)(e - s);
	char *t = arena_alloc(r->a, n + 1);
	if (t == NULL) {
		fail(r, s, "out of host memory");
		return NULL;
	}
	memcpy(t, s, n);
	t[n] = '\0';
	return t;
}

/* Makes room for item n of an arena array of *cap items of size bytes (doubling it). */
static int reserve(struct reader *r, void *items_ptr, int n, int *cap, size_t size, const char *at)
{
	void **items = items_ptr;
	if (n < *cap)
		return ST_OK;
	int grown = *cap > 0 ? *cap * 2 : 8;
	void *more = arena_calloc(r->a, (size_t)grown, size);
	if (more == NULL)
		return fail(r, at, "out of host memory");
	if (n > 0)
		memcpy(more, *items, (size_t)n * size);
	*items = more;
	*cap = grown;
	return ST_OK;
}

/* FNV-1a of a name, for the instruction table. */
static uint64_t name_hash(const char *name)
{
	uint64_t h = 1469598103934665603u;
	for (const char *q = name; *q; q++)
		h = (h ^ (unsigned char)*q) * 1099511628211u;
	return h;
}

/* Skips blanks and comments; stops at a newline when stop_at_newline. */
static void skip_space(struct reader *r, bool stop_at_newline)
{
	while (r->p < r->end) {
		char c = *r->p;
		if (c == '\n' && stop_at_newline)
			return;
		if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
			r->p++;
		} else if (c == '/' && r->p + 1 < r->end && r->p[1] == '*') {
			const char *q = r->p + 2;
			while (q + 1 < r->end && !(q[0] == '*' && q[1] == '/'))
				q++;
			r->p = q + 1 < r->end ? q + 2 : r->end;
		} else if (c == '/' && r->p + 1 < r->end && r->p[1] == '/') {
			while (r->p < r->end && *r->p != '\n')
				r->p++;
		} else {
			return;
		}
	}
}

static bool at_char(struct reader *r, char c)
{
	return r->p < r->end && *r->p == c;
}

static bool accept(struct reader *r, char c)
{
	skip_space(r, true);
	if (at_char(r, c)) {
		r->p++;
		return true;
	}
	return false;
}

static int expect(struct reader *r, char c, const char *what)
{
	if (accept(r, c))
		return ST_OK;
	if (r->p >= r->end)
		return fail(r, r->p, "expected '%c' %s, found the end of the text", c, what);
	return fail(r, r->p, "expected '%c' %s, found '%c'", c, what, *r->p);
}

static bool name_char(char c)
{
	return isalnum((unsigned char)c) || c == '_' || c == '.' || c == '-' || c == '%' ||
	       c == '$';
}

/* A name or keyword (letters, digits, _ . - % $); NULL (nothing consumed) when none. */
static const char *word(struct reader *r)
{
	skip_space(r, true);
	const char *s = r->p;
	while (r->p < r->end && name_char(*r->p))
		r->p++;
	if (r->p == s)
		return NULL;
	return copy_text(r, s, r->p);
}

/* A name without its leading '%'. */
static const char *bare(const char *name)
{
	return name[0] == '%' ? name + 1 : name;
}

static int integer(struct reader *r, int64_t *out, int64_t max, const char *what)
{
	skip_space(r, true);
	const char *s = r->p;
	bool neg = accept(r, '-');
	if (!(r->p < r->end && isdigit((unsigned char)*r->p)))
		return fail(r, s, "expected %s", what);
	int64_t v = 0;
	while (r->p < r->end && isdigit((unsigned char)*r->p)) {
		if (v > (max - (*r->p - '0')) / 10)
			return fail(r, s, "%s is larger than %lld", what, (long long)max);
		v = v * 10 + (*r->p++ - '0');
	}
	*out = neg ? -v : v;
	return ST_OK;
}

/*
 * Skips a balanced (), [] or {} group or a "string" starting at r->p, and returns it as text.
 */
static const char *balanced(struct reader *r)
{
	const char *s = r->p;
	char stack[64];
	int depth = 0;
	bool quoted = false;
	while (r->p < r->end) {
		char c = *r->p++;
		if (quoted) {
			if (c == '\\' && r->p < r->end)
				r->p++;
			else if (c == '"')
				quoted = false;
			if (depth == 0 && !quoted)
				break;
			continue;
		}
		if (c == '"') {
			quoted = true;
			continue; /* a string at the top level ends at its closing quote */
		} else if (c == '(' || c == '[' || c == '{') {
			if (depth == (int)sizeof(stack)) {
				fail(r, r->p - 1, "brackets nested deeper than %d",
				     (int)sizeof(stack));
				return NULL;
			}
			stack[depth++] = c == '(' ? ')' : c == '[' ? ']' : '}';
		} else if (c == ')' || c == ']' || c == '}') {
			if (depth == 0 || stack[depth - 1] != c) {
				fail(r, r->p - 1, "unbalanced '%c'", c);
				return NULL;
			}
			depth--;
		}
		if (depth == 0)
			break;
	}
	if (depth != 0 || quoted) {
		fail(r, s, "unterminated '%c'", *s);
		return NULL;
	}
	return copy_text(r, s, r->p);
}

static enum hlo_type type_parse(const char *w)
{
	for (int t = HT_PRED; t < HT_COUNT; t++)
		if (t != HT_TUPLE && strcmp(types[t].name, w) == 0)
			return (enum hlo_type)t;
	return HT_INVALID;
}

static int shape(struct reader *r, struct hlo_shape *out, int depth);

/* "{1,0}" or "{1,0:T(8,128)(2,1)}" after the dimensions. */
static int layout(struct reader *r, struct hlo_shape *out)
{
	const char *s = r->p;
	const char *eol = memchr(s, '\n', (size_t)(r->end - s));
	const char *close = memchr(s, '}', (size_t)((eol != NULL ? eol : r->end) - s));
	if (close == NULL)
		return fail(r, s, "unbalanced '{': the layout is not closed on its line");
	const char *text = balanced(r);
	if (text == NULL)
		return ST_INVALID_ARGUMENT;
	const char *q = text + 1;
	int n = 0;
	while (*q != '\0' && *q != '}' && *q != ':') {
		while (*q == ' ' || *q == ',')
			q++;
		if (!isdigit((unsigned char)*q))
			break;
		long v = 0;
		while (isdigit((unsigned char)*q) && v < 1000)
			v = v * 10 + (*q++ - '0');
		if (n >= out->rank || v >= out->rank)
			return fail(r, s, "layout %s does not fit a rank-%d shape", text,
			            out->rank);
		out->minor_to_major[n++] = (int)v;
	}
	if (n != 0 && n != out->rank)
		return fail(r, s, "layout %s names %d of %d dimensions", text, n, out->rank);
	out->has_layout = n == out->rank;
	return ST_OK;
}

static int shape(struct reader *r, struct hlo_shape *out, int depth)
{
	memset(out, 0, sizeof(*out));
	skip_space(r, true);
	const char *s = r->p;
	if (depth > 16)
		return fail(r, s, "tuple shapes nested deeper than 16");
	if (accept(r, '(')) {
		out->type = HT_TUPLE;
		struct hlo_shape elems[64];
		struct hlo_shape *list = elems;
		int cap = 64;
		skip_space(r, true);
		if (accept(r, ')'))
			return ST_OK;
		do {
			if (out->n_tuple == MAX_TUPLE)
				return fail(r, s, "a tuple of more than %d elements", MAX_TUPLE);
			if (reserve(r, &list, out->n_tuple, &cap, sizeof(*list), s) != ST_OK)
				return ST_INVALID_ARGUMENT;
			if (shape(r, &list[out->n_tuple], depth + 1) != ST_OK)
				return ST_INVALID_ARGUMENT;
			out->n_tuple++;
		} while (accept(r, ','));
		if (expect(r, ')', "to end the tuple shape") != ST_OK)
			return ST_INVALID_ARGUMENT;
		out->tuple = arena_calloc(r->a, (size_t)out->n_tuple, sizeof(*out->tuple));
		if (out->tuple == NULL)
			return fail(r, s, "out of host memory");
		memcpy(out->tuple, list, (size_t)out->n_tuple * sizeof(*list));
		return ST_OK;
	}
	const char *w = word(r);
	if (w == NULL)
		return fail(r, s, "expected a shape");
	out->type = type_parse(w);
	if (out->type == HT_INVALID)
		return fail(r, s, "unknown element type '%s'", w);
	if (!at_char(r, '['))
		return out->type == HT_TOKEN ? ST_OK : fail(r, r->p, "expected '[' after %s", w);
	r->p++;
	int64_t elements = 1;
	skip_space(r, true);
	if (!accept(r, ']')) {
		do {
			if (out->rank == HLO_MAX_RANK)
				return fail(r, s, "more than %d dimensions", HLO_MAX_RANK);
			skip_space(r, true);
			/* A dynamic dimension "<=N" is planned at its bound. */
			if (r->p + 1 < r->end && r->p[0] == '<' && r->p[1] == '=')
				r->p += 2;
			int64_t d;
			if (integer(r, &d, MAX_DIM, "a dimension size") != ST_OK)
				return ST_INVALID_ARGUMENT;
			if (d < 0)
				return fail(r, s, "dimension %d is negative (%lld)", out->rank,
				            (long long)d);
			if (d > 0 && elements > MAX_ELEMENTS / d)
				return fail(r, s, "more than %lld elements",
				            (long long)MAX_ELEMENTS);
			elements *= d;
			out->dims[out->rank++] = d;
		} while (accept(r, ','));
		if (expect(r, ']', "to end the dimensions") != ST_OK)
			return ST_INVALID_ARGUMENT;
	}
	if (at_char(r, '{'))
		return layout(r, out);
	return ST_OK;
}

/* ---- instructions ---- */

struct pending_operand {
	const char *name;
	const char *at;
};

struct comp_builder {
	struct hlo_computation *c;
	int cap;
};

static int push_instruction(struct reader *r, struct comp_builder *b, struct hlo_instruction *in,
                            const char *at)
{
	if (b->c->n_instructions == HLO_MAX_INSTRUCTIONS)
		return fail(r, at, "more than %d instructions in %s", HLO_MAX_INSTRUCTIONS,
		            b->c->name);
	if (reserve(r, &b->c->instructions, b->c->n_instructions, &b->cap,
	            sizeof(*b->c->instructions), at) != ST_OK)
		return ST_INVALID_ARGUMENT;
	in->index = b->c->n_instructions;
	b->c->instructions[b->c->n_instructions++] = in;
	return ST_OK;
}

/* "{1,2,3}" into a list of integers. */
static int int_list(struct reader *r, const char *text, const char *at, int64_t **out, int *n)
{
	int count = 0;
	for (const char *q = text; *q; q++)
		count += *q == ',';
	int64_t *list = arena_calloc(r->a, (size_t)count + 1, sizeof(*list));
	if (list == NULL)
		return fail(r, at, "out of host memory");
	int k = 0;
	const char *q = text;
	while (*q != '\0') {
		if (isdigit((unsigned char)*q) || (*q == '-' && isdigit((unsigned char)q[1]))) {
			bool neg = *q == '-';
			q += neg;
			int64_t v = 0;
			while (isdigit((unsigned char)*q)) {
				if (v > (MAX_DIM - (*q - '0')) / 10)
					return fail(r, at, "%s: a number is too large", text);
				v = v * 10 + (*q++ - '0');
			}
			if (k <= count)
				list[k++] = neg ? -v : v;
		} else if (*q == '{' || *q == '}' || *q == ',' || *q == ' ') {
			q++;
		} else {
			return fail(r, at, "%s is not a list of integers", text);
		}
	}
	*out = list;
	*n = k;
	return ST_OK;
}

/* One attribute value: a balanced group, a string, or a run of characters up to ',' or EOL. */
static const char *attribute_value(struct reader *r)
{
	skip_space(r, true);
	const char *s = r->p;
	if (at_char(r, '{') || at_char(r, '"'))
		return balanced(r);
	/* [2,4]<=[8] and friends: brackets inside, no top-level comma. */
	int depth = 0;
	while (r->p < r->end && *r->p != '\n' && !(depth == 0 && *r->p == ',') &&
	       !(*r->p == '/' && r->p + 1 < r->end && (r->p[1] == '*' || r->p[1] == '/'))) {
		if (*r->p == '[' || *r->p == '(' || *r->p == '{')
			depth++;
		else if ((*r->p == ']' || *r->p == ')' || *r->p == '}') && depth > 0)
			depth--;
		else if (*r->p == ']' || *r->p == ')' || *r->p == '}')
			break;
		r->p++;
	}
	while (r->p > s && (r->p[-1] == ' ' || r->p[-1] == '\t' || r->p[-1] == '\r'))
		r->p--;
	if (r->p == s) {
		fail(r, s, "expected an attribute value");
		return NULL;
	}
	return copy_text(r, s, r->p);
}

static int attribute(struct reader *r, struct hlo_instruction *in)
{
	skip_space(r, true);
	const char *at = r->p;
	const char *key = word(r);
	if (key == NULL)
		return fail(r, at, "expected an attribute name");
	if (expect(r, '=', "after the attribute name") != ST_OK)
		return ST_INVALID_ARGUMENT;
	const char *v = attribute_value(r);
	if (v == NULL)
		return ST_INVALID_ARGUMENT;
	if (strcmp(key, "dimensions") == 0)
		return int_list(r, v, at, &in->dimensions, &in->n_dimensions);
	if (strcmp(key, "index") == 0 || strcmp(key, "iota_dimension") == 0) {
		int64_t *list;
		int n;
		if (int_list(r, v, at, &list, &n) != ST_OK)
			return ST_INVALID_ARGUMENT;
		if (n != 1 || list[0] < 0)
			return fail(r, at, "%s=%s is not an index", key, v);
		if (key[0] == 'i' && key[1] == 'n') {
			in->has_index = true;
			in->tuple_index = list[0];
		} else {
			in->has_iota_dimension = true;
			in->iota_dimension = list[0];
		}
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
		if (int_list(r, v, at, &list, &n) != ST_OK || n != 1)
			return fail(r, at, "channel_id=%s is not an integer", v);
		in->has_channel_id = true;
		in->channel_id = list[0];
	} else if (strcmp(key, "use_global_device_ids") == 0) {
		in->use_global_device_ids = strcmp(v, "true") == 0;
	} else if (strcmp(key, "to_apply") == 0) {
		in->to_apply_name = bare(v);
	} else if (strcmp(key, "slice") == 0) {
		in->slice = v;
	} else if (strcmp(key, "padding") == 0) {
		in->padding = v;
	} else if (strcmp(key, "direction") == 0) {
		in->direction = v;
	} else if (strcmp(key, "dynamic_slice_sizes") == 0) {
		return int_list(r, v, at, &in->slice_sizes, &in->n_slice_sizes);
	}
	return ST_OK; /* metadata, sharding, backend_config, ...: not needed */
}

static int instruction(struct reader *r, struct comp_builder *b, struct pending_operand **ops_out,
                       struct hlo_instruction **out)
{
	skip_space(r, false);
	const char *at = r->p;
	struct hlo_instruction *in = arena_calloc(r->a, 1, sizeof(*in));
	if (in == NULL)
		return fail(r, at, "out of host memory");
	position(r, at, &in->line, &in->column);
	in->parameter_number = -1;
	const char *w = word(r);
	if (w != NULL && strcmp(w, "ROOT") == 0) {
		in->is_root = true;
		w = word(r);
	}
	if (w == NULL)
		return fail(r, at, "expected an instruction name");
	in->name = bare(w);
	if (expect(r, '=', "after the instruction name") != ST_OK)
		return ST_INVALID_ARGUMENT;
	if (shape(r, &in->shape, 0) != ST_OK)
		return ST_INVALID_ARGUMENT;
	skip_space(r, true);
	const char *op_at = r->p;
	in->opcode = word(r);
	if (in->opcode == NULL)
		return fail(r, op_at, "expected an opcode");
	skip_space(r, true);
	if (!at_char(r, '('))
		return fail(r, r->p, "expected '(' after %s", in->opcode);
	if (strcmp(in->opcode, "constant") == 0) {
		in->literal = balanced(r);
		if (in->literal == NULL)
			return ST_INVALID_ARGUMENT;
	} else if (strcmp(in->opcode, "parameter") == 0) {
		r->p++;
		if (integer(r, &in->parameter_number, 1 << 20, "a parameter number") != ST_OK)
			return ST_INVALID_ARGUMENT;
		if (in->parameter_number < 0)
			return fail(r, op_at, "parameter number %lld is negative",
			            (long long)in->parameter_number);
		if (expect(r, ')', "after the parameter number") != ST_OK)
			return ST_INVALID_ARGUMENT;
	} else {
		r->p++;
		int cap = 8, n = 0;
		struct pending_operand *ops = arena_calloc(r->a, (size_t)cap, sizeof(*ops));
		if (ops == NULL)
			return fail(r, at, "out of host memory");
		skip_space(r, true);
		if (!accept(r, ')')) {
			do {
				skip_space(r, true);
				const char *oat = r->p;
				/* "f32[8] %x" (shape first) or "%x" / "x". */
				const char *save = r->p;
				const char *first = word(r);
				skip_space(r, true);
				const char *name = first;
				if (first == NULL || at_char(r, '[') ||
				    (type_parse(first) != HT_INVALID && !at_char(r, ',') &&
				     !at_char(r, ')'))) {
					r->p = save;
					struct hlo_shape ignored;
					if (shape(r, &ignored, 0) != ST_OK)
						return ST_INVALID_ARGUMENT;
					name = word(r);
				}
				if (name == NULL)
					return fail(r, oat, "expected an operand name");
				if (n == MAX_OPERANDS)
					return fail(r, oat, "more than %d operands", MAX_OPERANDS);
				if (reserve(r, &ops, n, &cap, sizeof(*ops), oat) != ST_OK)
					return ST_INVALID_ARGUMENT;
				ops[n++] = (struct pending_operand){bare(name), oat};
			} while (accept(r, ','));
			if (expect(r, ')', "to end the operands") != ST_OK)
				return ST_INVALID_ARGUMENT;
		}
		in->n_operands = n;
		*ops_out = ops;
	}
	while (accept(r, ','))
		if (attribute(r, in) != ST_OK)
			return ST_INVALID_ARGUMENT;
	skip_space(r, true);
	if (r->p < r->end && *r->p != '\n' && *r->p != '}')
		return fail(r, r->p, "unexpected '%c' after %s", *r->p, in->name);
	if (push_instruction(r, b, in, at) != ST_OK)
		return ST_INVALID_ARGUMENT;
	*out = in;
	return ST_OK;
}

/* Operand names to instructions, in the same computation (defined anywhere in it). */
static int resolve(struct reader *r, struct hlo_computation *c, struct pending_operand **ops)
{
	/* Names sorted would be faster; a linear probe table keeps it simple and O(n). */
	size_t cap = 16;
	while (cap < (size_t)c->n_instructions * 2)
		cap *= 2;
	struct hlo_instruction **table = arena_calloc(r->a, cap, sizeof(*table));
	if (table == NULL)
		return fail(r, r->p, "out of host memory");
	for (int i = 0; i < c->n_instructions; i++) {
		struct hlo_instruction *in = c->instructions[i];
		size_t k = name_hash(in->name) & (cap - 1);
		while (table[k] != NULL) {
			if (strcmp(table[k]->name, in->name) == 0) {
				const char *at = r->start;
				for (int line = 1; line < in->line && at < r->end; at++)
					line += *at == '\n';
				return fail(r, at + in->column - 1, "%s is defined twice in %s",
				            in->name, c->name);
			}
			k = (k + 1) & (cap - 1);
		}
		table[k] = in;
	}
	for (int i = 0; i < c->n_instructions; i++) {
		struct hlo_instruction *in = c->instructions[i];
		if (in->n_operands == 0)
			continue;
		in->operands = arena_calloc(r->a, (size_t)in->n_operands, sizeof(*in->operands));
		if (in->operands == NULL)
			return fail(r, r->p, "out of host memory");
		for (int j = 0; j < in->n_operands; j++) {
			const char *name = ops[i][j].name;
			size_t k = name_hash(name) & (cap - 1);
			while (table[k] != NULL && strcmp(table[k]->name, name) != 0)
				k = (k + 1) & (cap - 1);
			if (table[k] == NULL)
				return fail(r, ops[i][j].at, "%s uses %s, which %s does not define",
				            in->name, name, c->name);
			if (table[k]->index >= in->index)
				return fail(
				    r, ops[i][j].at,
				    "%s uses %s, which is defined after it (instructions are "
				    "read in program order)",
				    in->name, name);
			in->operands[j] = table[k];
		}
	}
	return ST_OK;
}

static int computation(struct reader *r, struct hlo_module *m, struct hlo_computation **out)
{
	skip_space(r, false);
	const char *at = r->p;
	struct hlo_computation *c = arena_calloc(r->a, 1, sizeof(*c));
	if (c == NULL)
		return fail(r, at, "out of host memory");
	const char *w = word(r);
	if (w != NULL && strcmp(w, "ENTRY") == 0) {
		c->is_entry = true;
		w = word(r);
	}
	if (w == NULL)
		return fail(r, at, "expected a computation name");
	c->name = bare(w);
	skip_space(r, true);
	if (at_char(r, '(') && balanced(r) == NULL) /* the signature: parameters are repeated */
		return ST_INVALID_ARGUMENT;
	skip_space(r, true);
	if (r->p + 1 < r->end && r->p[0] == '-' && r->p[1] == '>') {
		r->p += 2;
		struct hlo_shape ignored;
		if (shape(r, &ignored, 0) != ST_OK)
			return ST_INVALID_ARGUMENT;
	}
	skip_space(r, false);
	if (expect(r, '{', "to open the computation") != ST_OK)
		return ST_INVALID_ARGUMENT;
	struct comp_builder b = {c, 0};
	int cap_ops = 64;
	struct pending_operand **ops = arena_calloc(r->a, (size_t)cap_ops, sizeof(*ops));
	if (ops == NULL)
		return fail(r, at, "out of host memory");
	for (;;) {
		skip_space(r, false);
		if (r->p >= r->end)
			return fail(r, r->p, "computation %s is not closed with '}'", c->name);
		if (*r->p == '}') {
			r->p++;
			break;
		}
		struct pending_operand *in_ops = NULL;
		struct hlo_instruction *in = NULL;
		if (instruction(r, &b, &in_ops, &in) != ST_OK)
			return ST_INVALID_ARGUMENT;
		if (reserve(r, &ops, c->n_instructions - 1, &cap_ops, sizeof(*ops), at) != ST_OK)
			return ST_INVALID_ARGUMENT;
		ops[c->n_instructions - 1] = in_ops;
		if (in->is_root) {
			if (c->root != NULL)
				return fail(r, at, "%s has two ROOT instructions (%s and %s)",
				            c->name, c->root->name, in->name);
			c->root = in;
		}
	}
	if (c->n_instructions == 0)
		return fail(r, at, "computation %s has no instructions", c->name);
	if (c->root == NULL) /* XLA: the last instruction is the root */
		c->root = c->instructions[c->n_instructions - 1];
	if (resolve(r, c, ops) != ST_OK)
		return ST_INVALID_ARGUMENT;
	/* Parameters by number: 0..n-1, each once. */
	int n_params = 0;
	for (int i = 0; i < c->n_instructions; i++)
		n_params += c->instructions[i]->parameter_number >= 0;
	c->parameters = arena_calloc(r->a, (size_t)n_params + 1, sizeof(*c->parameters));
	if (c->parameters == NULL)
		return fail(r, at, "out of host memory");
	c->n_parameters = n_params;
	for (int i = 0; i < c->n_instructions; i++) {
		struct hlo_instruction *in = c->instructions[i];
		if (in->parameter_number < 0)
			continue;
		if (in->parameter_number >= n_params || c->parameters[in->parameter_number])
			return fail(
			    r, at, "%s: parameter numbers must be 0..%d, each once (%s is %lld)",
			    c->name, n_params - 1, in->name, (long long)in->parameter_number);
		c->parameters[in->parameter_number] = in;
	}
	(void)m;
	*out = c;
	return ST_OK;
}

struct hlo_computation *hlo_find_computation(const struct hlo_module *m, const char *name)
{
	name = bare(name);
	for (int i = 0; i < m->n_computations; i++)
		if (strcmp(m->computations[i]->name, name) == 0)
			return m->computations[i];
	return NULL;
}

int hlo_parse(const char *text, size_t len, struct arena *a, struct hlo_module *out,
              struct status *st)
{
	memset(out, 0, sizeof(*out));
	struct reader r = {.p = text, .end = text + len, .start = text, .a = a, .st = st};
	skip_space(&r, false);
	const char *w = word(&r);
	if (w == NULL || strcmp(w, "HloModule") != 0)
		return fail(&r, r.start, "HLO text starts with 'HloModule NAME'");
	const char *name = word(&r);
	if (name == NULL)
		return fail(&r, r.p, "expected the module name after HloModule");
	out->name = name;
	/* The rest of the header line (entry_computation_layout=..., flags) is not needed. */
	while (r.p < r.end && *r.p != '\n') {
		if (*r.p == '{' || *r.p == '(' || *r.p == '[' || *r.p == '"') {
			if (balanced(&r) == NULL)
				return ST_INVALID_ARGUMENT;
		} else {
			r.p++;
		}
	}
	int cap = 8;
	out->computations = arena_calloc(a, (size_t)cap, sizeof(*out->computations));
	if (out->computations == NULL)
		return fail(&r, r.p, "out of host memory");
	for (;;) {
		skip_space(&r, false);
		if (r.p >= r.end)
			break;
		struct hlo_computation *c = NULL;
		if (computation(&r, out, &c) != ST_OK)
			return ST_INVALID_ARGUMENT;
		if (hlo_find_computation(out, c->name) != NULL)
			return fail(&r, r.p, "computation %s is defined twice", c->name);
		if (c->is_entry) {
			if (out->entry != NULL)
				return fail(&r, r.p, "two ENTRY computations (%s and %s)",
				            out->entry->name, c->name);
			out->entry = c;
		}
		if (reserve(&r, &out->computations, out->n_computations, &cap,
		            sizeof(*out->computations), r.p) != ST_OK)
			return ST_INVALID_ARGUMENT;
		out->computations[out->n_computations++] = c;
	}
	if (out->n_computations == 0)
		return fail(&r, r.p, "module %s has no computations", out->name);
	if (out->entry == NULL) /* XLA: the last computation is the entry */
		out->entry = out->computations[out->n_computations - 1];
	for (int i = 0; i < out->n_computations; i++) {
		struct hlo_computation *c = out->computations[i];
		for (int j = 0; j < c->n_instructions; j++) {
			struct hlo_instruction *in = c->instructions[j];
			if (in->to_apply_name == NULL)
				continue;
			in->to_apply = hlo_find_computation(out, in->to_apply_name);
			if (in->to_apply == NULL) {
				const char *at = r.start;
				for (int line = 1; line < in->line && at < r.end; at++)
					line += *at == '\n';
				return fail(&r, at + in->column - 1,
				            "%s: to_apply=%s is not defined", in->name,
				            in->to_apply_name);
			}
		}
	}
	return ST_OK;
}
