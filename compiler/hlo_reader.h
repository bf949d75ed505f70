/*
 * The HLO text reader's primitives, shared by the files of the frontend (hlo.c: instructions
 * and computations; hlo_module.c: the module and its header; hlo_shape.c: shapes and layouts;
 * hlo_infer.c: the shapes XLA infers). Like XLA's lexer, the reader treats line breaks as blanks:
 * an instruction may continue over several lines. Every error names the line and column; after the
 * first one the reader is failed and every later call returns at once.
 */
#ifndef PODEMU_HLO_READER_H
#define PODEMU_HLO_READER_H

#include <stdbool.h>
#include <stdint.h>

#include "arena.h"
#include "hlo.h"
#include "status.h"

/* Largest dimension and element count accepted (well past any real HBM), and rank. */
#define HLO_MAX_DIM (1LL << 40)
#define HLO_MAX_ELEMENTS (1LL << 50)
#define HLO_MAX_DIMS 256
#define HLO_MAX_TUPLE 4096

struct reader {
	const char *p, *end, *start;
	struct arena *a;
	struct status *st;
	int failed;
	/* The last position asked for, so that walking forward costs O(text) in all. */
	const char *mark;
	int mark_line, mark_col;
	struct hlo_module *m; /* for warnings */
	int warnings_cap;
};

void reader_position(struct reader *r, const char *at, int *line, int *col);
/* The position where line `line` starts, for errors about what was read before. */
const char *reader_line_start(struct reader *r, int line);

/* Fails the reader with "line L, column C: ..."; returns INVALID_ARGUMENT. */
int reader_fail(struct reader *r, const char *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Adds a warning about line `line` to the module. */
void reader_warn(struct reader *r, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The text [s, e) copied into the arena, or NULL after an error. */
const char *reader_copy(struct reader *r, const char *s, const char *e);

/* Makes room for item n of an arena array of *cap items of size bytes (doubling it). */
int reader_reserve(struct reader *r, void *items_ptr, int n, int *cap, size_t size, const char *at);

/* Skips blanks, line breaks and comments. */
void reader_skip(struct reader *r);
bool reader_at(struct reader *r, char c);
/* Consumes c after blanks when it is next. */
bool reader_accept(struct reader *r, char c);
int reader_expect(struct reader *r, char c, const char *what);
/* A name or keyword (letters, digits, _ . - % $); NULL (nothing consumed) when none. */
const char *reader_word(struct reader *r);
int reader_integer(struct reader *r, int64_t *out, int64_t max, const char *what);
/* A balanced (), [] or {} group or a "string" starting at r->p, as text. */
const char *reader_balanced(struct reader *r);

/* "{1,2,3}" (text, read at `at`) into a list of integers. */
int reader_int_list(struct reader *r, const char *text, const char *at, int64_t **out, int *n);
/*
 * One attribute value: a balanced group or a string, or a run of characters up to a ',' or a
 * blank outside brackets ("[2,64]<=[2,64]T(1,0)", "%add.3", "GT").
 */
const char *reader_attribute_value(struct reader *r);
/* "key =" of an attribute: the key, or NULL after an error. */
const char *reader_attribute_key(struct reader *r);

/* FNV-1a of a name, for name tables. */
uint64_t hlo_name_hash(const char *name);
/* Where instruction in starts in the text, for errors found after it was read. */
const char *hlo_where(struct reader *r, const struct hlo_instruction *in);
/* One computation at r->p ("name (params) -> shape { instructions }"), resolved and checked. */
int hlo_read_computation(struct reader *r, struct hlo_computation **out);

/* A name without its leading '%'. */
const char *hlo_bare(const char *name);

enum hlo_type hlo_type_parse(const char *w);

/* A shape (with its layout) at r->p; depth bounds tuple nesting. */
int hlo_read_shape(struct reader *r, struct hlo_shape *out, int depth);

/*
 * The result shape of in from its operands (already resolved), for an instruction whose text
 * left it to XLA; INVALID_ARGUMENT naming the instruction when podemu cannot infer it.
 */
int hlo_infer_shape(struct reader *r, struct hlo_instruction *in);

#endif
