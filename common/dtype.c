#include "dtype.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const struct {
	const char *name;
	size_t size;
} dtypes[DT_COUNT] = {
    [DT_INVALID] = {"invalid", 0}, [DT_PRED] = {"pred", 1}, [DT_S32] = {"s32", 4},
    [DT_U8] = {"u8", 1},           [DT_BF16] = {"bf16", 2}, [DT_F32] = {"f32", 4},
    [DT_U32] = {"u32", 4},
};

size_t dtype_size(int dtype)
{
	if (dtype <= DT_INVALID || dtype >= DT_COUNT)
		return 0;
	return dtypes[dtype].size;
}

const char *dtype_name(int dtype)
{
	if (dtype <= DT_INVALID || dtype >= DT_COUNT)
		return "invalid";
	return dtypes[dtype].name;
}

int dtype_parse(const char *name)
{
	for (int i = 1; i < DT_COUNT; i++)
		if (strcmp(name, dtypes[i].name) == 0)
			return i;
	return DT_INVALID;
}

bool mul_overflow_i64(int64_t a, int64_t b, int64_t *out)
{
	if (a < 0 || b < 0)
		return false;
	return !__builtin_mul_overflow(a, b, out);
}

int shape_make(struct shape *out, int dtype, const int64_t *dims, int rank, struct status *st)
{
	if (dtype_size(dtype) == 0)
		return status_set(st, ST_INVALID_ARGUMENT, "invalid element type %d", dtype);
	if (rank < 0 || rank > SHAPE_MAX_RANK)
		return status_set(st, ST_INVALID_ARGUMENT, "rank %d is out of range [0, %d]", rank,
		                  SHAPE_MAX_RANK);
	int64_t n = 1;
	for (int i = 0; i < rank; i++) {
		if (dims[i] < 0)
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "dimension %d has negative size %lld", i,
			                  (long long)dims[i]);
		if (!mul_overflow_i64(n, dims[i], &n))
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "shape's element count overflows int64 at dimension %d",
			                  i);
	}
	int64_t bytes;
	if (!mul_overflow_i64(n, (int64_t)dtype_size(dtype), &bytes))
		return status_set(st, ST_INVALID_ARGUMENT, "shape's byte size overflows int64");
	/* dims may point into out itself. */
	struct shape made;
	memset(&made, 0, sizeof(made));
	made.dtype = dtype;
	made.rank = rank;
	for (int i = 0; i < rank; i++)
		made.dims[i] = dims[i];
	*out = made;
	return ST_OK;
}

int64_t shape_elements(const struct shape *s)
{
	int64_t n = 1;
	for (int i = 0; i < s->rank; i++)
		n *= s->dims[i];
	return n;
}

int64_t shape_bytes(const struct shape *s)
{
	if (s->tuple)
		return 0;
	return shape_elements(s) * (int64_t)dtype_size(s->dtype);
}

char *shape_format(char *buf, size_t len, const struct shape *s)
{
	if (s->tuple) {
		size_t at = (size_t)snprintf(buf, len, "(");
		for (int k = 0; k < s->n_elements && at < len; k++) {
			char e[128];
			at += (size_t)snprintf(buf + at, len - at, "%s%s", k ? ", " : "",
			                       shape_format(e, sizeof(e), &s->elements[k]));
		}
		if (at < len)
			snprintf(buf + at, len - at, ")");
		return buf;
	}
	size_t used = (size_t)snprintf(buf, len, "%s[", dtype_name(s->dtype));
	for (int i = 0; i < s->rank && used < len; i++)
		used += (size_t)snprintf(buf + used, len - used, "%s%lld", i ? "," : "",
		                         (long long)s->dims[i]);
	if (used < len)
		snprintf(buf + used, len - used, "]");
	return buf;
}

bool shape_equal(const struct shape *a, const struct shape *b)
{
	if (a->dtype != b->dtype || a->rank != b->rank || a->tuple != b->tuple ||
	    a->n_elements != b->n_elements)
		return false;
	for (int k = 0; k < a->n_elements; k++)
		if (!shape_equal(&a->elements[k], &b->elements[k]))
			return false;
	for (int i = 0; i < a->rank; i++)
		if (a->dims[i] != b->dims[i])
			return false;
	return true;
}

float dtype_bf16_to_f32(uint16_t v)
{
	uint32_t bits = (uint32_t)v << 16;
	float f;
	memcpy(&f, &bits, sizeof(f));
	return f;
}

uint16_t dtype_f32_to_bf16(float f)
{
	uint32_t bits;
	memcpy(&bits, &f, sizeof(bits));
	if (isnan(f))
		return 0x7fc0;
	bits += 0x7fff + ((bits >> 16) & 1);
	return (uint16_t)(bits >> 16);
}

bool dtype_is_float(int dtype)
{
	return dtype == DT_F32 || dtype == DT_BF16;
}

double dtype_load(int dtype, const void *p, int64_t i)
{
	switch (dtype) {
	case DT_F32:
		return ((const float *)p)[i];
	case DT_BF16:
		return dtype_bf16_to_f32(((const uint16_t *)p)[i]);
	case DT_S32:
		return ((const int32_t *)p)[i];
	case DT_U32:
		return ((const uint32_t *)p)[i];
	case DT_U8:
	case DT_PRED:
		return ((const uint8_t *)p)[i];
	}
	return 0;
}

static double saturate(double v, double lo, double hi)
{
	if (isnan(v))
		return 0;
	return v < lo ? lo : v > hi ? hi : v;
}

void dtype_store(int dtype, void *p, int64_t i, double v)
{
	switch (dtype) {
	case DT_F32:
		((float *)p)[i] = (float)v;
		return;
	case DT_BF16:
		((uint16_t *)p)[i] = dtype_f32_to_bf16((float)v);
		return;
	case DT_S32:
		((int32_t *)p)[i] = (int32_t)saturate(trunc(v), -2147483648.0, 2147483647.0);
		return;
	case DT_U32:
		((uint32_t *)p)[i] = (uint32_t)saturate(trunc(v), 0, 4294967295.0);
		return;
	case DT_U8:
		((uint8_t *)p)[i] = (uint8_t)saturate(trunc(v), 0, 255);
		return;
	case DT_PRED:
		((uint8_t *)p)[i] = !isnan(v) && v != 0;
		return;
	}
}
