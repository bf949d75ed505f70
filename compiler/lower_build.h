/*
 * Building one core's schedule (lower.c and the algorithms in lower_flat.c and lower_grid.c):
 * the blocks of a buffer as layouts, and the phases made of them, all from one arena.
 */
#ifndef PODEMU_LOWER_BUILD_H
#define PODEMU_LOWER_BUILD_H

#include <stdbool.h>
#include <string.h>

#include "lower.h"

/* Builds the phases of one core; every phase and layout comes from the arena. */
struct builder {
	struct arena *a;
	Podemu__CollPhase **phases;
	size_t n;
	size_t cap;
	int failed;
};

/* count zeroed objects of size bytes from the arena; NULL (and b->failed) when out of memory. */
static inline void *builder_alloc(struct builder *b, size_t count, size_t size)
{
	void *p = arena_calloc(b->a, count, size);
	if (p == NULL)
		b->failed = 1;
	return p;
}

static inline Podemu__BlockLayout *layout(struct builder *b, int64_t offset, int64_t row_bytes,
                                          int64_t row_stride, int64_t rows)
{
	Podemu__BlockLayout *l = builder_alloc(b, 1, sizeof(*l));
	if (l == NULL)
		return NULL;
	podemu__block_layout__init(l);
	l->offset = offset;
	l->row_bytes = row_bytes;
	l->row_stride = row_stride;
	l->rows = rows;
	return l;
}

/* The whole buffer as one run. */
static inline Podemu__BlockLayout *whole(struct builder *b, const struct shape *s)
{
	int64_t bytes = shape_bytes(s);
	return layout(b, 0, bytes, bytes, 1);
}

/*
 * s split evenly along dimension d into n blocks: the bytes of one block in a row (part), of a
 * whole row (full), and the number of rows (outer).
 */
static inline void split_sizes(const struct shape *s, int d, int n, int64_t *part, int64_t *full,
                               int64_t *outer)
{
	int64_t inner = (int64_t)dtype_size(s->dtype);
	for (int i = d + 1; i < s->rank; i++)
		inner *= s->dims[i];
	*outer = 1;
	for (int i = 0; i < d; i++)
		*outer *= s->dims[i];
	*full = s->dims[d] * inner;
	*part = *full / n;
}

/* Blocks k .. k+count-1 of n when s is split evenly along dimension d. */
static inline Podemu__BlockLayout *split_range(struct builder *b, const struct shape *s, int d,
                                               int n, int k, int count)
{
	int64_t part, full, outer;
	split_sizes(s, d, n, &part, &full, &outer);
	return layout(b, (int64_t)k * part, count * part, full, outer);
}

/* Block `k` of n when s is split evenly along dimension d. */
static inline Podemu__BlockLayout *split_block(struct builder *b, const struct shape *s, int d,
                                               int n, int k)
{
	return split_range(b, s, d, n, k, 1);
}

/* True when the blocks of s split along d are contiguous (one row each). */
static inline bool blocks_contiguous(const struct shape *s, int d)
{
	return !lower_blocks_strided(s->dims, s->rank, d);
}

/* The first (half 0) or second half, in whole elements, of contiguous block k of n along d. */
static inline Podemu__BlockLayout *half_block(struct builder *b, const struct shape *s, int d,
                                              int n, int k, int half)
{
	int64_t es = (int64_t)dtype_size(s->dtype), part, full, outer;
	split_sizes(s, d, n, &part, &full, &outer);
	int64_t first = part / es / 2 * es;
	return half == 0 ? layout(b, (int64_t)k * part, first, first, 1)
	                 : layout(b, (int64_t)k * part + first, part - first, part - first, 1);
}

/* Block `k` of n of the flat element sequence, sizes differing by at most one element. */
static inline Podemu__BlockLayout *flat_block(struct builder *b, const struct shape *s, int n,
                                              int k)
{
	int64_t es = (int64_t)dtype_size(s->dtype), elems = shape_elements(s);
	int64_t base = elems / n, rem = elems % n;
	int64_t start = k * base + (k < rem ? k : rem), count = base + (k < rem);
	return layout(b, start * es, count * es, count * es, 1);
}

static inline Podemu__CollPhase *phase(struct builder *b, Podemu__PhaseKind kind)
{
	if (b->n == b->cap) {
		size_t cap = b->cap ? b->cap * 2 : 8;
		Podemu__CollPhase **p = builder_alloc(b, cap, sizeof(*p));
		if (p == NULL)
			return NULL;
		if (b->n)
			memcpy(p, b->phases, b->n * sizeof(*p));
		b->phases = p;
		b->cap = cap;
	}
	Podemu__CollPhase *ph = builder_alloc(b, 1, sizeof(*ph));
	if (ph == NULL)
		return NULL;
	podemu__coll_phase__init(ph);
	ph->kind = kind;
	ph->send_peer = -1;
	ph->recv_peer = -1;
	b->phases[b->n++] = ph;
	return ph;
}

static inline void copy_phase(struct builder *b, Podemu__CollBuffer from, Podemu__BlockLayout *src,
                              Podemu__BlockLayout *dst)
{
	Podemu__CollPhase *ph = phase(b, PODEMU__PHASE_KIND__PHASE_COPY);
	if (ph == NULL)
		return;
	ph->send_buffer = from;
	ph->send_block = src;
	ph->recv_block = dst;
}

static inline Podemu__CollPhase *exchange(struct builder *b, int send_peer, Podemu__CollBuffer from,
                                          Podemu__BlockLayout *src, int recv_peer,
                                          Podemu__BlockLayout *dst, int reduce)
{
	Podemu__CollPhase *ph = phase(b, PODEMU__PHASE_KIND__PHASE_EXCHANGE);
	if (ph == NULL)
		return NULL;
	ph->send_peer = send_peer;
	ph->send_buffer = from;
	ph->send_block = src;
	ph->recv_peer = recv_peer;
	ph->recv_block = dst;
	ph->reduce = reduce;
	return ph;
}

/* An exchange whose received block is added to block `with` of the input into dst. */
static inline Podemu__CollPhase *combine(struct builder *b, int send_peer, Podemu__CollBuffer from,
                                         Podemu__BlockLayout *src, int recv_peer,
                                         Podemu__BlockLayout *dst, Podemu__BlockLayout *with)
{
	Podemu__CollPhase *ph = exchange(b, send_peer, from, src, recv_peer, dst, 0);
	if (ph != NULL) {
		ph->kind = PODEMU__PHASE_KIND__PHASE_COMBINE;
		ph->combine_block = with;
	}
	return ph;
}

#define MOD(x, n) ((((x) % (n)) + (n)) % (n))
#define SPLIT_MAX 1024 /* members of a group that may be split by host */
#define IN PODEMU__COLL_BUFFER__COLL_INPUT
#define OUT PODEMU__COLL_BUFFER__COLL_OUTPUT
#define WORK PODEMU__COLL_BUFFER__COLL_WORK

/* Makes the exchanges added since phase `first` one group that runs at once (`with_next`). */
static inline void at_once(struct builder *b, size_t first)
{
	for (size_t k = first; k + 1 < b->n; k++)
		b->phases[k]->with_next = 1;
}

/*
 * The algorithms (lower_flat.c, lower_grid.c): each appends one core's phases to b, for a group
 * m of n members in which the core is member p (the hierarchical ones take the group as
 * lower_split_by_host splits it).
 */
void lower_all_gather(struct builder *b, const int64_t *m, int n, int p, int d,
                      const struct shape *in, const struct shape *out, int direct, int doubling);
void lower_all_gather_bidirectional(struct builder *b, const int64_t *m, int n, int p, int d,
                                    const struct shape *in, const struct shape *out);
void lower_reduce_scatter(struct builder *b, const int64_t *m, int n, int p, int d,
                          const struct shape *in, const struct shape *out);
void lower_reduce_scatter_direct(struct builder *b, const int64_t *m, int n, int p, int d,
                                 const struct shape *in, const struct shape *out);
void lower_all_reduce(struct builder *b, const int64_t *m, int n, int p, const struct shape *in,
                      int doubling);
void lower_all_reduce_direct(struct builder *b, const int64_t *m, int n, int p,
                             const struct shape *in);
void lower_all_to_all(struct builder *b, const int64_t *m, int n, int p, int sd, int cd,
                      const struct shape *in, const struct shape *out);
void lower_permute(struct builder *b, const Podemu__Node *node, int me, const struct shape *in);
void lower_all_reduce_hierarchical(struct builder *b, const int64_t *local, int L, int p,
                                   const int64_t *across, int H, int h, const struct shape *in);
bool lower_split_by_host(const int64_t *m, int n, int cph, int64_t me, int64_t *local,
                         int64_t *across, int *grid, int *L, int *H, int *p, int *h);
void lower_all_gather_hierarchical(struct builder *b, const int64_t *local, int L, int p,
                                   const int64_t *across, int H, int h, const int *grid, int n,
                                   int d, const struct shape *in, const struct shape *out);
void lower_all_gather_torus(struct builder *b, const int64_t *m, int n, int p, int d, const int *f,
                            int k, const struct shape *in, const struct shape *out);
void lower_all_reduce_torus(struct builder *b, const int64_t *m, int n, int p, const int *f, int k,
                            const struct shape *in);
void lower_reduce_scatter_torus(struct builder *b, const int64_t *m, int n, int p, int d,
                                const int *dims, int k, const struct shape *in,
                                const struct shape *out);

#endif
