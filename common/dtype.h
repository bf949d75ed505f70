/* Element types and shapes: sizes, names, overflow-checked element and byte counts. */
#ifndef PODEMU_DTYPE_H
#define PODEMU_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* Values match podemu.DType in proto/podemu.proto. */
enum dtype {
	DT_INVALID = 0,
	DT_PRED = 1,
	DT_S32 = 2,
	DT_U8 = 3,
	DT_BF16 = 4,
	DT_F32 = 5,
	DT_U32 = 6,
	DT_COUNT
};

#define SHAPE_MAX_RANK 8

struct shape {
	int dtype;
	int rank;
	int64_t dims[SHAPE_MAX_RANK];
	bool tuple;
	/* A tuple's elements (arrays), owned by whoever made the shape (an arena). */
	int n_elements;
	const struct shape *elements;
};

/* Bytes per element, or 0 for an invalid dtype. */
size_t dtype_size(int dtype);
/* f32 and bf16. */
bool dtype_is_float(int dtype);
/* XLA's spelling ("f32", "bf16", "s32", "u8", "pred", "u32"); "invalid" otherwise. */
const char *dtype_name(int dtype);
/* Parses XLA's spelling; returns DT_INVALID when unknown. */
int dtype_parse(const char *name);

/*
 * Fills out with dtype and dims after checking them: a valid dtype, rank <= SHAPE_MAX_RANK,
 * non-negative dims, and an element and byte count that fit in int64. On error nothing is
 * written to out and INVALID_ARGUMENT names the problem.
 */
int shape_make(struct shape *out, int dtype, const int64_t *dims, int rank, struct status *st);

/* Element and byte counts of a shape made by shape_make (cannot overflow there). */
int64_t shape_elements(const struct shape *s);
int64_t shape_bytes(const struct shape *s);

/* XLA's text form, "f32[1024,128]", "(f32[2], s32[])"; returns buf. */
char *shape_format(char *buf, size_t len, const struct shape *s);

bool shape_equal(const struct shape *a, const struct shape *b);

/* bfloat16 from and to float (round to nearest even; NaN stays NaN). */
float dtype_bf16_to_f32(uint16_t v);
uint16_t dtype_f32_to_bf16(float f);

/*
 * Element i of an array of dtype as a double, and the store back: floats round, integers
 * saturate (NaN gives 0), pred is v != 0.
 */
double dtype_load(int dtype, const void *p, int64_t i);
void dtype_store(int dtype, void *p, int64_t i, double v);

/* a * b into *out; returns false on int64 overflow or a negative operand. */
bool mul_overflow_i64(int64_t a, int64_t b, int64_t *out);

#endif
