/* HLO element types and shapes: the sizes, the text form, and reading a shape with its layout. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "hlo_reader.h"

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

/* Element types XLA prints that podemu sizes like one it knows. */
static const struct {
	const char *name;
	enum hlo_type as;
} more_types[] = {
    {"s2", HT_S4},
    {"u2", HT_U4},
    {"f8e4m3", HT_F8E4M3FN},
    {"f8e4m3b11fnuz", HT_F8E4M3FN},
    {"f8e4m3fnuz", HT_F8E4M3FN},
    {"f8e5m2fnuz", HT_F8E5M2},
    {"f8e3m4", HT_F8E4M3FN},
    {"f8e8m0fnu", HT_F8E4M3FN},
};

const char *hlo_type_name(enum hlo_type t)
{
	return t > HT_INVALID && t < HT_COUNT ? types[t].name : "invalid";
}

int hlo_type_bits(enum hlo_type t)
{
	return t > HT_INVALID && t < HT_COUNT ? types[t].bits : 0;
}

enum hlo_type hlo_type_parse(const char *w)
{
	for (int t = HT_PRED; t < HT_COUNT; t++)
		if (t != HT_TUPLE && strcmp(types[t].name, w) == 0)
			return (enum hlo_type)t;
	for (size_t k = 0; k < sizeof(more_types) / sizeof(more_types[0]); k++)
		if (strcmp(more_types[k].name, w) == 0)
			return more_types[k].as;
	return HT_INVALID;
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
	int bits = s->element_bits > 0 ? s->element_bits : hlo_type_bits(s->type);
	return (hlo_shape_elements(s) * bits + 7) / 8;
}

/* Appends to buf (len bytes) at *at, as far as it fits. */
static void appendf(char *buf, size_t len, size_t *at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void appendf(char *buf, size_t len, size_t *at, const char *fmt, ...)
{
	if (*at >= len)
		return;
	va_list ap;
	va_start(ap, fmt);
	*at += (size_t)vsnprintf(buf + *at, len - *at, fmt, ap);
	va_end(ap);
}

#define PUT(...) appendf(buf, len, &at, __VA_ARGS__)

char *hlo_shape_format(char *buf, size_t len, const struct hlo_shape *s)
{
	size_t at = 0;
	buf[0] = '\0';
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
		PUT("%s%s%lld", i ? "," : "", s->dynamic && s->dynamic[i] ? "<=" : "",
		    (long long)s->dims[i]);
	PUT("]");
	return buf;
}

/* T(8,128)(2,1): the tile levels after 'T'. */
static int read_tiles(struct reader *r, struct hlo_shape *out)
{
	int cap = 0;
	while (reader_at(r, '(')) {
		const char *s = r->p++;
		int64_t dims[HLO_MAX_DIMS];
		int n = 0;
		do {
			reader_skip(r);
			if (n == HLO_MAX_DIMS)
				return reader_fail(r, s, "a tile of more than %d dimensions",
				                   HLO_MAX_DIMS);
			if (reader_accept(r, '*')) {
				dims[n++] = -1;
				continue;
			}
			if (reader_integer(r, &dims[n], HLO_MAX_DIM, "a tile dimension") != ST_OK)
				return ST_INVALID_ARGUMENT;
			if (dims[n] < 1)
				return reader_fail(r, s, "tile dimension %lld is not positive",
				                   (long long)dims[n]);
			n++;
		} while (reader_accept(r, ','));
		if (reader_expect(r, ')', "to end the tile") != ST_OK)
			return ST_INVALID_ARGUMENT;
		if (reader_reserve(r, &out->tiles, out->n_tiles, &cap, sizeof(*out->tiles), s) !=
		    ST_OK)
			return ST_INVALID_ARGUMENT;
		struct hlo_tile *t = &out->tiles[out->n_tiles++];
		t->rank = n;
		t->dims = arena_calloc(r->a, (size_t)n, sizeof(int64_t));
		if (t->dims == NULL)
			return reader_fail(r, s, "out of host memory");
		memcpy(t->dims, dims, (size_t)n * sizeof(int64_t));
	}
	return ST_OK;
}

/* "(N)" after a layout item such as E or S. */
static int item_number(struct reader *r, int64_t *out, const char *what)
{
	if (reader_expect(r, '(', what) != ST_OK ||
	    reader_integer(r, out, HLO_MAX_DIM, what) != ST_OK ||
	    reader_expect(r, ')', what) != ST_OK)
		return ST_INVALID_ARGUMENT;
	return ST_OK;
}

/*
 * The layout after the dimensions: "{1,0}", "{1,0:T(8,128)(2,1)E(4)S(1)}", and XLA's other
 * items (P, L, D, SC, M, #(...)), which are read; those that would change a dense array's size
 * and are not modelled (split configs, a physical shape, dynamic metadata) are warnings.
 */
static int read_layout(struct reader *r, struct hlo_shape *out)
{
	const char *s = r->p++;
	int line, col;
	reader_position(r, s, &line, &col);
	int n = 0;
	int m2m[HLO_MAX_DIMS];
	reader_skip(r);
	if (!reader_at(r, '}') && !reader_at(r, ':')) {
		do {
			int64_t v;
			if (reader_integer(r, &v, HLO_MAX_DIMS, "a dimension in the layout") !=
			    ST_OK)
				return ST_INVALID_ARGUMENT;
			if (n >= out->rank || v < 0 || v >= out->rank)
				return reader_fail(r, s, "the layout does not fit a rank-%d shape",
				                   out->rank);
			m2m[n++] = (int)v;
		} while (reader_accept(r, ','));
	}
	if (n != 0 && n != out->rank)
		return reader_fail(r, s, "the layout names %d of %d dimensions", n, out->rank);
	if (n == out->rank && out->rank > 0) {
		out->minor_to_major = arena_calloc(r->a, (size_t)n, sizeof(int));
		if (out->minor_to_major == NULL)
			return reader_fail(r, s, "out of host memory");
		memcpy(out->minor_to_major, m2m, (size_t)n * sizeof(int));
	}
	out->has_layout = true;
	if (reader_accept(r, ':')) {
		for (;;) {
			reader_skip(r);
			const char *item = r->p;
			while (r->p < r->end && (isupper((unsigned char)*r->p) || *r->p == '#'))
				r->p++;
			if (r->p == item)
				break;
			size_t len = (size_t)(r->p - item);
			int64_t v;
			if (len == 1 && *item == 'T') {
				if (read_tiles(r, out) != ST_OK)
					return ST_INVALID_ARGUMENT;
			} else if (len == 1 && *item == 'E') {
				if (item_number(r, &v, "for E(bits)") != ST_OK)
					return ST_INVALID_ARGUMENT;
				if (v > 1024)
					return reader_fail(r, item, "E(%lld): too many bits",
					                   (long long)v);
				out->element_bits = (int)v;
			} else if (len == 1 && *item == 'S') {
				if (item_number(r, &out->memory_space, "for S(space)") != ST_OK)
					return ST_INVALID_ARGUMENT;
			} else {
				if (!reader_at(r, '('))
					return reader_fail(r, item,
					                   "expected '(' after layout item %.*s",
					                   (int)len, item);
				while (reader_at(r, '('))
					if (reader_balanced(r) == NULL)
						return ST_INVALID_ARGUMENT;
				if ((len == 2 && strncmp(item, "SC", 2) == 0) ||
				    (len == 1 && (*item == '#' || *item == 'M')))
					reader_warn(r, line,
					            "layout item %.*s(...) is not modelled: the "
					            "buffer is sized without it",
					            (int)len, item);
			}
		}
	}
	reader_skip(r);
	if (!reader_at(r, '}'))
		return reader_fail(r, s, "unbalanced '{': the layout is not closed with '}'");
	r->p++;
	return ST_OK;
}

int hlo_read_shape(struct reader *r, struct hlo_shape *out, int depth)
{
	memset(out, 0, sizeof(*out));
	reader_skip(r);
	const char *s = r->p;
	if (depth > 16)
		return reader_fail(r, s, "tuple shapes nested deeper than 16");
	if (reader_accept(r, '(')) {
		out->type = HT_TUPLE;
		struct hlo_shape elems[16];
		struct hlo_shape *list = elems;
		int cap = 16;
		reader_skip(r);
		if (reader_accept(r, ')'))
			return ST_OK;
		do {
			if (out->n_tuple == HLO_MAX_TUPLE)
				return reader_fail(r, s, "a tuple of more than %d elements",
				                   HLO_MAX_TUPLE);
			if (out->n_tuple == cap) {
				/* The first 16 live on the stack; more in the arena. */
				struct hlo_shape *more =
				    arena_calloc(r->a, (size_t)cap * 2, sizeof(*more));
				if (more == NULL)
					return reader_fail(r, s, "out of host memory");
				memcpy(more, list, (size_t)cap * sizeof(*more));
				list = more;
				cap *= 2;
			}
			if (hlo_read_shape(r, &list[out->n_tuple], depth + 1) != ST_OK)
				return ST_INVALID_ARGUMENT;
			out->n_tuple++;
		} while (reader_accept(r, ','));
		if (reader_expect(r, ')', "to end the tuple shape") != ST_OK)
			return ST_INVALID_ARGUMENT;
		out->tuple = arena_calloc(r->a, (size_t)out->n_tuple, sizeof(*out->tuple));
		if (out->tuple == NULL)
			return reader_fail(r, s, "out of host memory");
		memcpy(out->tuple, list, (size_t)out->n_tuple * sizeof(*list));
		if (reader_at(r, '{')) /* a tuple's layout, if any, says nothing */
			return reader_balanced(r) != NULL ? ST_OK : ST_INVALID_ARGUMENT;
		return ST_OK;
	}
	const char *w = reader_word(r);
	if (w == NULL)
		return reader_fail(r, s, "expected a shape");
	out->type = hlo_type_parse(w);
	if (out->type == HT_INVALID)
		return reader_fail(r, s, "unknown element type '%s'", w);
	if (!reader_at(r, '['))
		return out->type == HT_TOKEN ? ST_OK
		                             : reader_fail(r, r->p, "expected '[' after %s", w);
	r->p++;
	int64_t dims[HLO_MAX_DIMS];
	bool dynamic[HLO_MAX_DIMS], any_dynamic = false;
	int64_t elements = 1;
	reader_skip(r);
	if (!reader_accept(r, ']')) {
		do {
			if (out->rank == HLO_MAX_DIMS)
				return reader_fail(r, s, "more than %d dimensions", HLO_MAX_DIMS);
			reader_skip(r);
			if (reader_at(r, '?'))
				return reader_fail(
				    r, r->p,
				    "dimension %d of %s[...] is unbounded ('?'): podemu "
				    "plans a dynamic dimension at its bound; write it "
				    "as <=N",
				    out->rank, w);
			/* A dynamic dimension "<=N" is planned at its bound. */
			dynamic[out->rank] = false;
			if (r->p + 1 < r->end && r->p[0] == '<' && r->p[1] == '=') {
				r->p += 2;
				dynamic[out->rank] = any_dynamic = true;
			}
			int64_t d;
			if (reader_integer(r, &d, HLO_MAX_DIM, "a dimension size") != ST_OK)
				return ST_INVALID_ARGUMENT;
			if (d < 0)
				return reader_fail(r, s, "dimension %d is negative (%lld)",
				                   out->rank, (long long)d);
			if (d > 0 && elements > HLO_MAX_ELEMENTS / d)
				return reader_fail(r, s, "more than %lld elements",
				                   (long long)HLO_MAX_ELEMENTS);
			elements *= d;
			dims[out->rank++] = d;
		} while (reader_accept(r, ','));
		if (reader_expect(r, ']', "to end the dimensions") != ST_OK)
			return ST_INVALID_ARGUMENT;
	}
	out->dims = arena_calloc(r->a, (size_t)out->rank + 1, sizeof(int64_t));
	if (out->dims == NULL)
		return reader_fail(r, s, "out of host memory");
	memcpy(out->dims, dims, (size_t)out->rank * sizeof(int64_t));
	if (any_dynamic) {
		out->dynamic = arena_calloc(r->a, (size_t)out->rank, sizeof(bool));
		if (out->dynamic == NULL)
			return reader_fail(r, s, "out of host memory");
		memcpy(out->dynamic, dynamic, (size_t)out->rank * sizeof(bool));
	}
	if (reader_at(r, '{'))
		return read_layout(r, out);
	return ST_OK;
}

int hlo_parse_layout(struct hlo_shape *s, const char *text, struct arena *a, struct status *st)
{
	struct hlo_module m = {0}; /* takes the warnings, which a lone layout has no line for */
	struct status rst;
	status_clear(&rst);
	struct reader r = {
	    .p = text, .end = text + strlen(text), .start = text, .a = a, .st = &rst, .m = &m};
	reader_skip(&r);
	if (!reader_at(&r, '{'))
		reader_fail(&r, r.p, "expected '{' to start the layout");
	else if (read_layout(&r, s) == ST_OK) {
		reader_skip(&r);
		if (r.p != r.end)
			reader_fail(&r, r.p, "unexpected text after the layout");
	}
	if (!r.failed)
		return ST_OK;
	char shape[256];
	/* "line 1, column C: ..." names the column of the layout text. */
	const char *msg = strstr(rst.message, "column");
	return status_set(st, ST_INVALID_ARGUMENT, "layout %s of %s: %s", text,
	                  hlo_shape_format(shape, sizeof(shape), s), msg ? msg : rst.message);
}

char *hlo_layout_format(char *buf, size_t len, const struct hlo_shape *s)
{
	size_t at = 0;
	buf[0] = '\0';
	if (!s->has_layout || s->type == HT_TUPLE)
		return buf;
	PUT("{");
	for (int i = 0; s->minor_to_major != NULL && i < s->rank; i++)
		PUT("%s%d", i ? "," : "", s->minor_to_major[i]);
	if (s->n_tiles > 0 || s->element_bits > 0 || s->memory_space != 0)
		PUT(":");
	for (int t = 0; t < s->n_tiles; t++) {
		PUT("%s(", t == 0 ? "T" : "");
		for (int d = 0; d < s->tiles[t].rank; d++) {
			if (s->tiles[t].dims[d] < 0)
				PUT("%s*", d ? "," : "");
			else
				PUT("%s%lld", d ? "," : "", (long long)s->tiles[t].dims[d]);
		}
		PUT(")");
	}
	if (s->element_bits > 0)
		PUT("E(%d)", s->element_bits);
	if (s->memory_space != 0)
		PUT("S(%lld)", (long long)s->memory_space);
	PUT("}");
#undef PUT
	return buf;
}
