#include "hlo_reader.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void reader_position(struct reader *r, const char *at, int *line, int *col)
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

const char *reader_line_start(struct reader *r, int line)
{
	const char *at = r->start;
	for (int l = 1; l < line && at < r->end; at++)
		l += *at == '\n';
	return at;
}

int reader_fail(struct reader *r, const char *at, const char *fmt, ...)
{
	if (r->failed)
		return ST_INVALID_ARGUMENT;
	char msg[STATUS_MESSAGE_MAX];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	int line, col;
	reader_position(r, at, &line, &col);
	r->failed = 1;
	return status_set(r->st, ST_INVALID_ARGUMENT, "line %d, column %d: %s", line, col, msg);
}

void reader_warn(struct reader *r, int line, const char *fmt, ...)
{
	struct hlo_module *m = r->m;
	if (m == NULL || r->failed)
		return;
	char msg[STATUS_MESSAGE_MAX];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (reader_reserve(r, &m->warnings, m->n_warnings, &r->warnings_cap, sizeof(*m->warnings),
	                   r->p) != ST_OK)
		return;
	const char *text = reader_copy(r, msg, msg + strlen(msg));
	if (text != NULL)
		m->warnings[m->n_warnings++] = (struct hlo_warning){line, text};
}

const char *reader_copy(struct reader *r, const char *s, const char *e)
{
	size_t n = (size_t)(e - s);
	char *t = arena_alloc(r->a, n + 1);
	if (t == NULL) {
		reader_fail(r, s, "out of host memory");
		return NULL;
	}
	memcpy(t, s, n);
	t[n] = '\0';
	return t;
}

int reader_reserve(struct reader *r, void *items_ptr, int n, int *cap, size_t size, const char *at)
{
	void **items = items_ptr;
	if (n < *cap)
		return ST_OK;
	int grown = *cap > 0 ? *cap * 2 : 8;
	void *more = arena_calloc(r->a, (size_t)grown, size);
	if (more == NULL)
		return reader_fail(r, at, "out of host memory");
	if (n > 0)
		memcpy(more, *items, (size_t)n * size);
	*items = more;
	*cap = grown;
	return ST_OK;
}

void reader_skip(struct reader *r)
{
	while (r->p < r->end) {
		char c = *r->p;
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

bool reader_at(struct reader *r, char c)
{
	return r->p < r->end && *r->p == c;
}

bool reader_accept(struct reader *r, char c)
{
	reader_skip(r);
	if (reader_at(r, c)) {
		r->p++;
		return true;
	}
	return false;
}

int reader_expect(struct reader *r, char c, const char *what)
{
	if (reader_accept(r, c))
		return ST_OK;
	if (r->p >= r->end)
		return reader_fail(r, r->p, "expected '%c' %s, found the end of the text", c, what);
	return reader_fail(r, r->p, "expected '%c' %s, found '%c'", c, what, *r->p);
}

static bool name_char(char c)
{
	return isalnum((unsigned char)c) || c == '_' || c == '.' || c == '-' || c == '%' ||
	       c == '$';
}

const char *reader_word(struct reader *r)
{
	reader_skip(r);
	const char *s = r->p;
	while (r->p < r->end && name_char(*r->p))
		r->p++;
	if (r->p == s)
		return NULL;
	return reader_copy(r, s, r->p);
}

const char *hlo_bare(const char *name)
{
	return name[0] == '%' ? name + 1 : name;
}

int reader_integer(struct reader *r, int64_t *out, int64_t max, const char *what)
{
	reader_skip(r);
	const char *s = r->p;
	bool neg = reader_accept(r, '-');
	if (!(r->p < r->end && isdigit((unsigned char)*r->p)))
		return reader_fail(r, s, "expected %s", what);
	int64_t v = 0;
	while (r->p < r->end && isdigit((unsigned char)*r->p)) {
		if (v > (max - (*r->p - '0')) / 10)
			return reader_fail(r, s, "%s is larger than %lld", what, (long long)max);
		v = v * 10 + (*r->p++ - '0');
	}
	*out = neg ? -v : v;
	return ST_OK;
}

const char *reader_balanced(struct reader *r)
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
				reader_fail(r, r->p - 1, "brackets nested deeper than %d",
				            (int)sizeof(stack));
				return NULL;
			}
			stack[depth++] = c == '(' ? ')' : c == '[' ? ']' : '}';
		} else if (c == ')' || c == ']' || c == '}') {
			if (depth == 0 || stack[depth - 1] != c) {
				reader_fail(r, r->p - 1, "unbalanced '%c'", c);
				return NULL;
			}
			depth--;
		}
		if (depth == 0)
			break;
	}
	if (depth != 0 || quoted) {
		reader_fail(r, s, "unterminated '%c'", *s);
		return NULL;
	}
	return reader_copy(r, s, r->p);
}
