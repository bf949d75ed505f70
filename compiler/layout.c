#include "layout.h"

#define TILE_MINOR 128
#define TILE_1D 1024

static int64_t round_up(int64_t v, int64_t m)
{
	return v % m == 0 ? v : v + (m - v % m);
}

static int64_t mul_cap(int64_t a, int64_t b)
{
	int64_t r;
	if (__builtin_mul_overflow(a, b, &r) || r > LAYOUT_BYTES_CAP)
		return LAYOUT_BYTES_CAP;
	return r;
}

int64_t layout_add(int64_t a, int64_t b)
{
	return a > LAYOUT_BYTES_CAP - b ? LAYOUT_BYTES_CAP : a + b;
}

bool layout_in_hbm(const struct hlo_shape *s)
{
	return s->memory_space == 0;
}

/* The dimension that is k-th from the minor end. */
static int physical(const struct hlo_shape *s, int k)
{
	return s->minor_to_major != NULL ? s->minor_to_major[k] : s->rank - 1 - k;
}

/* Elements after padding to a written tile: only the first level pads (as in XLA). */
static int64_t tiled_elements(const struct hlo_shape *s, const struct hlo_tile *t)
{
	int64_t n = 1;
	int k = 0;
	for (; k < t->rank; k++) {
		int64_t dim = k < s->rank ? s->dims[physical(s, k)] : 1;
		int64_t tile = t->dims[t->rank - 1 - k];
		n = mul_cap(n, tile > 0 ? round_up(dim, tile) : dim);
	}
	for (; k < s->rank; k++)
		n = mul_cap(n, s->dims[physical(s, k)]);
	return n;
}

/* Elements after padding to the TPU's default tiling. */
static int64_t default_tiled_elements(const struct hlo_shape *s, int bits)
{
	if (s->rank == 1)
		return round_up(s->dims[0], TILE_1D);
	int minor = physical(s, 0), second = physical(s, 1);
	/* 8 rows of 32-bit words; narrower types are packed into the words. */
	int64_t rows = bits >= 32 ? 8 : 8 * (32 / bits);
	int64_t n = 1;
	for (int i = 0; i < s->rank; i++)
		n = mul_cap(n, i == minor    ? round_up(s->dims[i], TILE_MINOR)
		               : i == second ? round_up(s->dims[i], rows)
		                             : s->dims[i]);
	return n;
}

int64_t layout_bytes(const struct hlo_shape *s, bool tiled)
{
	if (s->type == HT_TUPLE) {
		int64_t sum = 0;
		for (int i = 0; i < s->n_tuple; i++)
			sum = layout_add(sum, layout_bytes(&s->tuple[i], tiled));
		return sum;
	}
	int bits = s->element_bits > 0 ? s->element_bits : hlo_type_bits(s->type);
	if (bits == 0)
		return 0;
	for (int i = 0; i < s->rank; i++)
		if (s->dims[i] == 0)
			return 0;
	int64_t elements;
	if (tiled && s->n_tiles > 0)
		elements = tiled_elements(s, &s->tiles[0]);
	else if (tiled && s->rank > 0)
		elements = default_tiled_elements(s, bits);
	else
		elements = hlo_shape_elements(s);
	int64_t total_bits = mul_cap(elements, bits);
	if (total_bits == LAYOUT_BYTES_CAP || elements == LAYOUT_BYTES_CAP)
		return LAYOUT_BYTES_CAP; /* saturated */
	return total_bits / 8 + (total_bits % 8 != 0);
}
