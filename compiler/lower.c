#include "lower.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collective.h"
#include "graph.h"

/* Builds the phases of one core; every phase and layout comes from the arena. */
struct builder {
	struct arena *a;
	Podemu__CollPhase **phases;
	size_t n;
	size_t cap;
	int failed;
};

static Podemu__BlockLayout *layout(struct builder *b, int64_t offset, int64_t row_bytes,
                                   int64_t row_stride, int64_t rows)
{
	Podemu__BlockLayout *l = arena_alloc(b->a, sizeof(*l));
	if (l == NULL) {
		b->failed = 1;
		return NULL;
	}
	podemu__block_layout__init(l);
	l->offset = offset;
	l->row_bytes = row_bytes;
	l->row_stride = row_stride;
	l->rows = rows;
	return l;
}

/* The whole buffer as one run. */
static Podemu__BlockLayout *whole(struct builder *b, const struct shape *s)
{
	int64_t bytes = shape_bytes(s);
	return layout(b, 0, bytes, bytes, 1);
}

/*
 * s split evenly along dimension d into n blocks: the bytes of one block in a row (part), of a
 * whole row (full), and the number of rows (outer).
 */
static void split_sizes(const struct shape *s, int d, int n, int64_t *part, int64_t *full,
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
static Podemu__BlockLayout *split_range(struct builder *b, const struct shape *s, int d, int n,
                                        int k, int count)
{
	int64_t part, full, outer;
	split_sizes(s, d, n, &part, &full, &outer);
	return layout(b, (int64_t)k * part, count * part, full, outer);
}

/* Block `k` of n when s is split evenly along dimension d. */
static Podemu__BlockLayout *split_block(struct builder *b, const struct shape *s, int d, int n,
                                        int k)
{
	return split_range(b, s, d, n, k, 1);
}

/* True when the blocks of s split along d are contiguous (one row each). */
static bool blocks_contiguous(const struct shape *s, int d)
{
	return !lower_blocks_strided(s->dims, s->rank, d);
}

/* The first (half 0) or second half, in whole elements, of contiguous block k of n along d. */
static Podemu__BlockLayout *half_block(struct builder *b, const struct shape *s, int d, int n,
                                       int k, int half)
{
	int64_t es = (int64_t)dtype_size(s->dtype), part, full, outer;
	split_sizes(s, d, n, &part, &full, &outer);
	int64_t first = part / es / 2 * es;
	return half == 0 ? layout(b, (int64_t)k * part, first, first, 1)
	                 : layout(b, (int64_t)k * part + first, part - first, part - first, 1);
}

/* Block `k` of n of the flat element sequence, sizes differing by at most one element. */
static Podemu__BlockLayout *flat_block(struct builder *b, const struct shape *s, int n, int k)
{
	int64_t es = (int64_t)dtype_size(s->dtype), elems = shape_elements(s);
	int64_t base = elems / n, rem = elems % n;
	int64_t start = k * base + (k < rem ? k : rem), count = base + (k < rem);
	return layout(b, start * es, count * es, count * es, 1);
}

static Podemu__CollPhase *phase(struct builder *b, Podemu__PhaseKind kind)
{
	if (b->n == b->cap) {
		size_t cap = b->cap ? b->cap * 2 : 8;
		Podemu__CollPhase **p = arena_calloc(b->a, cap, sizeof(*p));
		if (p == NULL) {
			b->failed = 1;
			return NULL;
		}
		if (b->n)
			memcpy(p, b->phases, b->n * sizeof(*p));
		b->phases = p;
		b->cap = cap;
	}
	Podemu__CollPhase *ph = arena_alloc(b->a, sizeof(*ph));
	if (ph == NULL) {
		b->failed = 1;
		return NULL;
	}
	podemu__coll_phase__init(ph);
	ph->kind = kind;
	ph->send_peer = -1;
	ph->recv_peer = -1;
	b->phases[b->n++] = ph;
	return ph;
}

static void copy_phase(struct builder *b, Podemu__CollBuffer from, Podemu__BlockLayout *src,
                       Podemu__BlockLayout *dst)
{
	Podemu__CollPhase *ph = phase(b, PODEMU__PHASE_KIND__PHASE_COPY);
	if (ph == NULL)
		return;
	ph->send_buffer = from;
	ph->send_block = src;
	ph->recv_block = dst;
}

static Podemu__CollPhase *exchange(struct builder *b, int send_peer, Podemu__CollBuffer from,
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
static Podemu__CollPhase *combine(struct builder *b, int send_peer, Podemu__CollBuffer from,
                                  Podemu__BlockLayout *src, int recv_peer, Podemu__BlockLayout *dst,
                                  Podemu__BlockLayout *with)
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
static void at_once(struct builder *b, size_t first)
{
	for (size_t k = first; k + 1 < b->n; k++)
		b->phases[k]->with_next = 1;
}

/*
 * All-gather in place: ring (n-1 phases of one block each), direct (every member sends its
 * input to every other, all at once), or recursive doubling for a power-of-two group (log2 n
 * phases: at distance `bit` a core swaps the 'bit' blocks it holds, a run of consecutive
 * blocks, with the core that holds the next run). Like every all-gather here, the first step
 * sends the input itself rather than its copy in the output, so that the executor may copy it
 * there while it waits for the first chunks.
 */
static void all_gather(struct builder *b, const int64_t *m, int n, int p, int d,
                       const struct shape *in, const struct shape *out, int direct, int doubling)
{
	copy_phase(b, IN, whole(b, in), split_block(b, out, d, n, p));
	if (doubling) {
		for (int bit = 1; bit < n; bit <<= 1) {
			int partner = p ^ bit;
			exchange(b, (int)m[partner], bit == 1 ? IN : OUT,
			         bit == 1 ? whole(b, in)
			                  : split_range(b, out, d, n, p & ~(bit - 1), bit),
			         (int)m[partner],
			         split_range(b, out, d, n, partner & ~(bit - 1), bit), 0);
		}
		return;
	}
	if (direct) {
		size_t first = b->n;
		for (int k = 1; k < n; k++)
			exchange(b, (int)m[MOD(p + k, n)], IN, whole(b, in), (int)m[MOD(p - k, n)],
			         split_block(b, out, d, n, MOD(p - k, n)), 0);
		at_once(b, first);
		return;
	}
	for (int s = 0; s < n - 1; s++)
		exchange(b, (int)m[MOD(p + 1, n)], s == 0 ? IN : OUT,
		         s == 0 ? whole(b, in) : split_block(b, out, d, n, MOD(p - s, n)),
		         (int)m[MOD(p - 1, n)], split_block(b, out, d, n, MOD(p - s - 1, n)), 0);
}

/*
 * Bidirectional ring all-gather (contiguous blocks): the first half of every block travels
 * around the ring one way and the second half the other way, both at once (`with_next`), so
 * each core sends to and receives from both neighbours in every step.
 */
static void all_gather_bidirectional(struct builder *b, const int64_t *m, int n, int p, int d,
                                     const struct shape *in, const struct shape *out)
{
	copy_phase(b, IN, whole(b, in), split_block(b, out, d, n, p));
	/* The first step sends the input's halves (the input is the one block of its split). */
	for (int s = 0; s < n - 1; s++) {
		Podemu__CollBuffer from = s == 0 ? IN : OUT;
		Podemu__CollPhase *ph = exchange(
		    b, (int)m[MOD(p + 1, n)], from,
		    s == 0 ? half_block(b, in, d, 1, 0, 0)
		           : half_block(b, out, d, n, MOD(p - s, n), 0),
		    (int)m[MOD(p - 1, n)], half_block(b, out, d, n, MOD(p - s - 1, n), 0), 0);
		if (ph != NULL)
			ph->with_next = 1;
		exchange(b, (int)m[MOD(p - 1, n)], from,
		         s == 0 ? half_block(b, in, d, 1, 0, 1)
		                : half_block(b, out, d, n, MOD(p + s, n), 1),
		         (int)m[MOD(p + 1, n)], half_block(b, out, d, n, MOD(p + s + 1, n), 1), 0);
	}
}

/*
 * Ring reduce-scatter with the output as accumulator: at phase s a core sends its partial sum of
 * block p-s-1 on and receives the partial of block p-s-2, which it adds to its own input block
 * into the output. After n-1 phases the output holds block p, reduced over the group.
 */
static void reduce_scatter(struct builder *b, const int64_t *m, int n, int p, int d,
                           const struct shape *in, const struct shape *out)
{
	if (n == 1) {
		copy_phase(b, IN, whole(b, in), whole(b, out));
		return;
	}
	for (int s = 0; s < n - 1; s++) {
		Podemu__CollPhase *ph =
		    combine(b, (int)m[MOD(p + 1, n)], s == 0 ? IN : OUT,
		            s == 0 ? split_block(b, in, d, n, MOD(p - 1, n)) : whole(b, out),
		            (int)m[MOD(p - 1, n)], whole(b, out),
		            split_block(b, in, d, n, MOD(p - s - 2, n)));
		if (ph != NULL)
			ph->stage = s > 0;
	}
}

/*
 * Direct reduce-scatter: every member sends block q of its input to member q, all at once,
 * and sums the blocks it receives into its output in the order of the members after it.
 */
static void reduce_scatter_direct(struct builder *b, const int64_t *m, int n, int p, int d,
                                  const struct shape *in, const struct shape *out)
{
	copy_phase(b, IN, split_block(b, in, d, n, p), whole(b, out));
	size_t first = b->n;
	for (int k = 1; k < n; k++)
		exchange(b, (int)m[MOD(p - k, n)], IN, split_block(b, in, d, n, MOD(p - k, n)),
		         (int)m[MOD(p + k, n)], whole(b, out), 1);
	at_once(b, first);
}

/*
 * All-reduce into the output: a ring reduce-scatter over flat blocks leaves block p+1 reduced
 * on core p, then the blocks are gathered around the ring. The reduce half combines each
 * received partial with the core's own input block into the output, so the input is never
 * copied whole (the gather half writes block p, the one block the reduce half leaves alone).
 */
static void all_reduce(struct builder *b, const int64_t *m, int n, int p, const struct shape *in,
                       int doubling)
{
	if (n == 1 || doubling)
		copy_phase(b, IN, whole(b, in), whole(b, in));
	if (n == 1)
		return;
	if (doubling) {
		for (int bit = 1; bit < n; bit <<= 1) {
			Podemu__CollPhase *ph = exchange(b, (int)m[p ^ bit], OUT, whole(b, in),
			                                 (int)m[p ^ bit], whole(b, in), 1);
			if (ph != NULL)
				ph->stage = 1;
		}
		return;
	}
	for (int s = 0; s < n - 1; s++)
		combine(b, (int)m[MOD(p + 1, n)], s == 0 ? IN : OUT,
		        flat_block(b, in, n, MOD(p - s, n)), (int)m[MOD(p - 1, n)],
		        flat_block(b, in, n, MOD(p - s - 1, n)),
		        flat_block(b, in, n, MOD(p - s - 1, n)));
	/* The gather half rewrites blocks the reduce half sent: local cores must have taken them.
	 */
	for (int s = 0; s < n - 1; s++) {
		Podemu__CollPhase *ph =
		    exchange(b, (int)m[MOD(p + 1, n)], OUT, flat_block(b, in, n, MOD(p + 1 - s, n)),
		             (int)m[MOD(p - 1, n)], flat_block(b, in, n, MOD(p - s, n)), 0);
		if (ph != NULL && s == 0)
			ph->drain = 1;
	}
}

/*
 * Direct all-reduce: every member sends flat block q of its input to member q, all at once,
 * and sums the blocks it receives into its own block of the output in the order of the
 * members after it (p+1, p+2, ...: the same order whoever arrives first); then it sends its
 * summed block to every other member, all at once. Two rounds instead of a ring's 2(n-1), the
 * same bytes. Sends come from the input, which only the gather half (after a drain: local
 * cores took what they were sent) overwrites when the output is the input's bytes.
 */
static void all_reduce_direct(struct builder *b, const int64_t *m, int n, int p,
                              const struct shape *in)
{
	copy_phase(b, IN, flat_block(b, in, n, p), flat_block(b, in, n, p));
	size_t first = b->n;
	for (int k = 1; k < n; k++)
		exchange(b, (int)m[MOD(p - k, n)], IN, flat_block(b, in, n, MOD(p - k, n)),
		         (int)m[MOD(p + k, n)], flat_block(b, in, n, p), 1);
	at_once(b, first);
	first = b->n;
	for (int k = 1; k < n; k++) {
		Podemu__CollPhase *ph =
		    exchange(b, (int)m[MOD(p + k, n)], OUT, flat_block(b, in, n, p),
		             (int)m[MOD(p - k, n)], flat_block(b, in, n, MOD(p - k, n)), 0);
		if (ph != NULL && k == 1)
			ph->drain = 1;
	}
	at_once(b, first);
}

/* Sub-block k of n2 of flat block q of n1 (sizes differing by at most one element). */
static Podemu__BlockLayout *flat_sub(struct builder *b, const struct shape *s, int n1, int q,
                                     int n2, int k)
{
	int64_t es = (int64_t)dtype_size(s->dtype), elems = shape_elements(s);
	int64_t base = elems / n1, rem = elems % n1;
	int64_t start = q * base + (q < rem ? q : rem), count = base + (q < rem);
	int64_t sub = count / n2, srem = count % n2;
	int64_t at = start + k * sub + (k < srem ? k : srem), len = sub + (k < srem);
	return layout(b, at * es, len * es, len * es, 1);
}

/*
 * Hierarchical all-reduce for a group of H hosts with L members each (local holds this host's
 * members, p this core's place among them, across the members in its place on every host, h
 * this host's place): a ring reduce-scatter within the host leaves block q = p+1 (of L) summed
 * over the host on this core; a ring all-reduce of block q with the cores in the same place on
 * the other hosts sums it over the group; the blocks are then gathered within the host by
 * memory copy. Each host sends 2(H-1)/H of the buffer off the host instead of 2(N-1)/N per
 * core around one ring.
 */
static void all_reduce_hierarchical(struct builder *b, const int64_t *local, int L, int p,
                                    const int64_t *across, int H, int h, const struct shape *in)
{
	copy_phase(b, IN, whole(b, in), whole(b, in));
	for (int s = 0; s < L - 1; s++)
		exchange(b, (int)local[MOD(p + 1, L)], OUT, flat_block(b, in, L, MOD(p - s, L)),
		         (int)local[MOD(p - 1, L)], flat_block(b, in, L, MOD(p - s - 1, L)), 1);
	int q = MOD(p + 1, L);
	for (int s = 0; s < H - 1; s++)
		exchange(b, (int)across[MOD(h + 1, H)], OUT,
		         flat_sub(b, in, L, q, H, MOD(h - s, H)), (int)across[MOD(h - 1, H)],
		         flat_sub(b, in, L, q, H, MOD(h - s - 1, H)), 1);
	for (int s = 0; s < H - 1; s++) {
		Podemu__CollPhase *ph = exchange(
		    b, (int)across[MOD(h + 1, H)], OUT, flat_sub(b, in, L, q, H, MOD(h + 1 - s, H)),
		    (int)across[MOD(h - 1, H)], flat_sub(b, in, L, q, H, MOD(h - s, H)), 0);
		if (ph != NULL && s == 0)
			ph->drain = 1;
	}
	for (int s = 0; s < L - 1; s++) {
		Podemu__CollPhase *ph = exchange(
		    b, (int)local[MOD(p + 1 + s, L)], OUT, flat_block(b, in, L, MOD(p + 1, L)),
		    (int)local[MOD(p - 1 - s, L)], flat_block(b, in, L, MOD(p - s, L)), 0);
		if (ph != NULL && s == 0)
			ph->drain = 1;
	}
}

/*
 * Splits group m (n members) by host: H hosts of L members each, in order of first appearance,
 * members in group order. Fills local (this core's host's members), across (the members in
 * place p of every host), grid (the group position of place q on host j at j * L + q), p and
 * h. False when hosts hold different numbers of members.
 */
static bool split_by_host(const int64_t *m, int n, int cph, int64_t me, int64_t *local,
                          int64_t *across, int *grid, int *L, int *H, int *p, int *h)
{
	int64_t hosts[64];
	int nh = 0, count[64] = {0};
	for (int k = 0; k < n; k++) {
		int64_t host = m[k] / cph;
		int j = 0;
		while (j < nh && hosts[j] != host)
			j++;
		if (j == nh) {
			if (nh == 64)
				return false;
			hosts[nh++] = host;
		}
		count[j]++;
	}
	for (int j = 1; j < nh; j++)
		if (count[j] != count[0])
			return false;
	*H = nh, *L = count[0];
	int64_t my_host = me / cph;
	int at = 0;
	for (int k = 0; k < n; k++)
		if (m[k] / cph == my_host) {
			if (m[k] == me)
				*p = at;
			local[at++] = m[k];
		}
	for (int j = 0; j < nh; j++) {
		if (hosts[j] == my_host)
			*h = j;
		int seen = 0;
		for (int k = 0; k < n; k++)
			if (m[k] / cph == hosts[j]) {
				if (seen == *p)
					across[j] = m[k];
				grid[j * *L + seen++] = k;
			}
	}
	return true;
}

/*
 * Hierarchical all-gather for a group of H hosts with L members each (grid and the rest as
 * split_by_host fills them): a ring all-gather with the cores in the same place on the other
 * hosts gathers their blocks, then the cores of a host exchange what they gathered by memory
 * copy, one block a phase. Every block crosses between hosts once per place instead of once
 * per ring hop, and the output is still written in place (no scratch).
 */
static void all_gather_hierarchical(struct builder *b, const int64_t *local, int L, int p,
                                    const int64_t *across, int H, int h, const int *grid, int n,
                                    int d, const struct shape *in, const struct shape *out)
{
#define BLOCK(j, q) split_block(b, out, d, n, grid[MOD(j, H) * L + MOD(q, L)])
	copy_phase(b, IN, whole(b, in), BLOCK(h, p));
	for (int s = 0; s < H - 1; s++)
		exchange(b, (int)across[MOD(h + 1, H)], s == 0 ? IN : OUT,
		         s == 0 ? whole(b, in) : BLOCK(h - s, p), (int)across[MOD(h - 1, H)],
		         BLOCK(h - s - 1, p), 0);
	for (int k = 1; k < L; k++)
		for (int j = 0; j < H; j++)
			exchange(b, (int)local[MOD(p + k, L)], OUT, BLOCK(j, p),
			         (int)local[MOD(p - k, L)], BLOCK(j, p - k), 0);
#undef BLOCK
}

/*
 * A torus of dimensions f (k of them): below[i] is how many positions the dimensions before i
 * span (below[k] = n).
 */
static void torus_below(const int *f, int k, int *below)
{
	below[0] = 1;
	for (int i = 0; i < k; i++)
		below[i + 1] = below[i] * f[i];
}

/*
 * Position p's ring along dimension i: its digit there, the first position of its run of that
 * dimension (digits i and before zero), and the positions after and before it on the ring.
 */
struct torus_ring {
	int digit, base, next, prev;
};

static struct torus_ring torus_ring(int p, const int *f, const int *below, int i)
{
	int digit = p / below[i] % f[i], base = p - p % below[i + 1], low = p % below[i];
	return (struct torus_ring){digit, base, base + MOD(digit + 1, f[i]) * below[i] + low,
	                           base + MOD(digit - 1, f[i]) * below[i] + low};
}

/*
 * Torus all-gather: a ring along each dimension in turn. Along dimension i a core passes on
 * the run of blocks it gathered so far (all positions of the dimensions before i, its own in
 * the ones after), so after f_i - 1 steps it holds the run of the next dimension. sum(f_i - 1)
 * phases instead of n - 1, each block still crossing to every core once, written in place.
 */
static void all_gather_torus(struct builder *b, const int64_t *m, int n, int p, int d, const int *f,
                             int k, const struct shape *in, const struct shape *out)
{
	copy_phase(b, IN, whole(b, in), split_block(b, out, d, n, p));
	int below[LOWER_TORUS_DIMS_MAX + 1];
	torus_below(f, k, below);
	for (int i = 0; i < k; i++) {
		struct torus_ring t = torus_ring(p, f, below, i);
		for (int s = 0; s < f[i] - 1; s++)
			exchange(
			    b, (int)m[t.next], i + s == 0 ? IN : OUT,
			    i + s == 0
			        ? whole(b, in)
			        : split_range(b, out, d, n,
			                      t.base + MOD(t.digit - s, f[i]) * below[i], below[i]),
			    (int)m[t.prev],
			    split_range(b, out, d, n,
			                t.base + MOD(t.digit - s - 1, f[i]) * below[i], below[i]),
			    0);
	}
}

/* Flat blocks k..k+count-1 of n, as one contiguous range of s. */
static Podemu__BlockLayout *flat_range(struct builder *b, const struct shape *s, int n, int k,
                                       int count)
{
	int64_t es = (int64_t)dtype_size(s->dtype), elems = shape_elements(s);
	int64_t base = elems / n, rem = elems % n;
	int64_t start = k * base + (k < rem ? k : rem);
	int64_t end = (k + count) * base + (k + count < rem ? k + count : rem);
	return layout(b, start * es, (end - start) * es, (end - start) * es, 1);
}

/*
 * Torus all-reduce over flat blocks, in the output: a ring reduce-scatter along each dimension
 * from the slowest (each core keeping the run of its own position along it, so every run is a
 * contiguous range), which leaves block p summed over the group on core p; then the torus
 * all-gather of those blocks back. 2 sum(f_i - 1) phases instead of 2(n - 1), the same bytes.
 */
static void all_reduce_torus(struct builder *b, const int64_t *m, int n, int p, const int *f, int k,
                             const struct shape *in)
{
	copy_phase(b, IN, whole(b, in), whole(b, in));
	int below[LOWER_TORUS_DIMS_MAX + 1];
	torus_below(f, k, below);
	for (int i = k - 1; i >= 0; i--) {
		struct torus_ring t = torus_ring(p, f, below, i);
		for (int s = 0; s < f[i] - 1; s++)
			exchange(
			    b, (int)m[t.next], OUT,
			    flat_range(b, in, n, t.base + MOD(t.digit - s - 1, f[i]) * below[i],
			               below[i]),
			    (int)m[t.prev],
			    flat_range(b, in, n, t.base + MOD(t.digit - s - 2, f[i]) * below[i],
			               below[i]),
			    1);
	}
	/* The gather half rewrites runs the reduce half sent: local cores must have taken them. */
	bool first = true;
	for (int i = 0; i < k; i++) {
		struct torus_ring t = torus_ring(p, f, below, i);
		for (int s = 0; s < f[i] - 1; s++) {
			Podemu__CollPhase *ph = exchange(
			    b, (int)m[t.next], OUT,
			    flat_range(b, in, n, t.base + MOD(t.digit - s, f[i]) * below[i],
			               below[i]),
			    (int)m[t.prev],
			    flat_range(b, in, n, t.base + MOD(t.digit - s - 1, f[i]) * below[i],
			               below[i]),
			    0);
			if (ph != NULL && first)
				ph->drain = 1;
			first = false;
		}
	}
}

/*
 * Torus reduce-scatter of contiguous blocks (the dimensions taken from the smallest, so that the
 * slowest is the largest): a ring reduce-scatter along the slowest dimension combines the
 * received partial sums of runs of n/f blocks with the input into the work area, one run
 * (lower_workspace's `work`); then, as the all-reduce's first half, a ring along each other
 * dimension reduces ever smaller runs in place there, and block p, summed over the group, is
 * copied out. sum(f_i - 1) + 1 phases instead of n - 1; the work area is 1/f of the input.
 */
static void reduce_scatter_torus(struct builder *b, const int64_t *m, int n, int p, int d,
                                 const int *dims, int k, const struct shape *in,
                                 const struct shape *out)
{
	int f[LOWER_TORUS_DIMS_MAX], below[LOWER_TORUS_DIMS_MAX + 1];
	memcpy(f, dims, (size_t)k * sizeof(int));
	for (int i = 1; i < k; i++) /* ascending: the largest slowest */
		for (int j = i; j > 0 && f[j - 1] > f[j]; j--) {
			int x = f[j];
			f[j] = f[j - 1];
			f[j - 1] = x;
		}
	torus_below(f, k, below);
	int64_t part, full, outer;
	split_sizes(in, d, n, &part, &full, &outer);
	/* Blocks j .. j+count-1: of the input, or of the work area (holding run `origin`). */
#define RUN(j, count, origin) layout(b, ((j) - (origin)) * part, (count)*part, (count)*part, 1)
	int top = k - 1, fk = f[top], R = below[top];
	struct torus_ring t = torus_ring(p, f, below, top);
	int origin = t.digit * R; /* the run this core ends with */
	for (int s = 0; s < fk - 1; s++) {
		Podemu__CollPhase *ph =
		    combine(b, (int)m[t.next], s == 0 ? IN : WORK,
		            s == 0 ? RUN(MOD(t.digit - 1, fk) * R, R, 0) : RUN(origin, R, origin),
		            (int)m[t.prev], RUN(origin, R, origin),
		            RUN(MOD(t.digit - s - 2, fk) * R, R, 0));
		if (ph != NULL) {
			ph->recv_work = 1;
			ph->stage = s > 0; /* it sends the run it then receives into */
		}
	}
	for (int i = top - 1; i >= 0; i--) {
		struct torus_ring u = torus_ring(p, f, below, i);
		for (int s = 0; s < f[i] - 1; s++) {
			Podemu__CollPhase *ph = exchange(
			    b, (int)m[u.next], WORK,
			    RUN(u.base + MOD(u.digit - s - 1, f[i]) * below[i], below[i], origin),
			    (int)m[u.prev],
			    RUN(u.base + MOD(u.digit - s - 2, f[i]) * below[i], below[i], origin),
			    1);
			if (ph != NULL)
				ph->recv_work = 1;
		}
	}
	copy_phase(b, WORK, RUN(p, 1, origin), whole(b, out));
#undef RUN
}

static void all_to_all(struct builder *b, const int64_t *m, int n, int p, int sd, int cd,
                       const struct shape *in, const struct shape *out)
{
	copy_phase(b, IN, split_block(b, in, sd, n, p), split_block(b, out, cd, n, p));
	for (int k = 1; k < n; k++)
		exchange(b, (int)m[MOD(p + k, n)], IN, split_block(b, in, sd, n, MOD(p + k, n)),
		         (int)m[MOD(p - k, n)], split_block(b, out, cd, n, MOD(p - k, n)), 0);
}

static void permute(struct builder *b, const Podemu__Node *node, int me, const struct shape *in)
{
	int source = -1, target = -1;
	for (size_t k = 0; k + 1 < node->n_source_target_pairs; k += 2) {
		if (node->source_target_pairs[k] == me)
			target = (int)node->source_target_pairs[k + 1];
		if (node->source_target_pairs[k + 1] == me)
			source = (int)node->source_target_pairs[k];
	}
	if (source == me) {
		copy_phase(b, IN, whole(b, in), whole(b, in));
		if (target != me && target >= 0)
			exchange(b, target, IN, whole(b, in), -1, NULL, 0);
		return;
	}
	if (source < 0) {
		Podemu__CollPhase *z = phase(b, PODEMU__PHASE_KIND__PHASE_ZERO);
		if (z != NULL)
			z->recv_block = whole(b, in);
	}
	if (source >= 0 || target >= 0)
		exchange(b, target, IN, whole(b, in), source, source >= 0 ? whole(b, in) : NULL, 0);
}

void lower_place_groups(unsigned char *placement, const struct coll_groups *g, int cph, int *count)
{
	for (int k = 0; k < g->num_groups; k++) {
		const int64_t *m = g->ids + g->start[k];
		int n = g->size[k], hosts = 0;
		bool one_host = true, distinct = true;
		for (int j = 0; j < n; j++) {
			one_host &= m[j] / cph == m[0] / cph;
			hosts += count[m[j] / cph]++ == 0;
		}
		bool uniform = true;
		for (int j = 0; j < n; j++) {
			distinct &= count[m[j] / cph] == 1;
			uniform &= count[m[j] / cph] == count[m[0] / cph];
		}
		int per_host = n > 0 ? count[m[0] / cph] : 0;
		for (int j = 0; j < n; j++)
			count[m[j] / cph] = 0;
		/* Several hosts with several members each, as many on each: intra-, then
		 * inter-host (split_by_host's grid). */
		bool layered = !one_host && n <= SPLIT_MAX && hosts <= 64 && uniform && hosts > 1 &&
		               per_host > 1;
		placement[k] = (one_host ? PLACED_ONE_HOST : 0) |
		               (!one_host && distinct ? PLACED_ONE_PER_HOST : 0) |
		               (layered ? PLACED_LAYERED : 0);
	}
}

struct group_shape lower_group_shape(unsigned char placement, int n, const struct shape *res, int d)
{
	int f[LOWER_TORUS_DIMS_MAX];
	return (struct group_shape){.one_host = placement & PLACED_ONE_HOST,
	                            .one_per_host = placement & PLACED_ONE_PER_HOST,
	                            .layered = placement & PLACED_LAYERED,
	                            .contiguous = blocks_contiguous(res, d),
	                            .torus = lower_torus_dims(n, f) > 1};
}

void lower_end(struct lowering *L)
{
	for (size_t k = 0; L->groups != NULL && k < L->n; k++)
		coll_groups_free(&L->groups[k]);
	free(L->groups);
	L->groups = NULL;
}

int lower_begin(struct lowering *L, struct arena *a, const Podemu__Graph *g,
                const struct shape *shapes, int world, int cores_per_host,
                const char *forced_algorithm, struct status *st)
{
	*L = (struct lowering){.g = g,
	                       .shapes = shapes,
	                       .world = world,
	                       .cph = cores_per_host,
	                       .forced = forced_algorithm};
	if (world <= 0 || cores_per_host <= 0 || world % cores_per_host != 0)
		return status_set(st, ST_INVALID_ARGUMENT, "lower: a pod of %d cores, %d per host",
		                  world, cores_per_host);
	size_t total = graph_total_nodes(g);
	if ((L->first = graph_first_ids(g, a)) == NULL ||
	    (L->ids = arena_calloc(a, total + 1, sizeof(int))) == NULL ||
	    (L->groups = calloc(total + 1, sizeof(*L->groups))) == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	/* Every collective of the graph, in called computations too (ids across the graph). */
	for (size_t i = 0; i < total; i++) {
		int comp;
		const Podemu__Node *node = graph_node_at(g, L->first, (int)i, &comp);
		enum opcode op = opcode_parse(node->opcode);
		if (!opcode_is_collective(op))
			continue;
		L->ids[L->n] = (int)i;
		char label[64];
		snprintf(label, sizeof(label), "%s (node %zu)", node->opcode, i);
		int rv = op == OP_COLLECTIVE_PERMUTE
		             ? ST_OK
		             : coll_groups_resolve(&L->groups[L->n], node, g->mesh, g->n_mesh,
		                                   world, op == OP_ALL_REDUCE, label, st);
		L->n++; /* freed by lower_end whether resolved or not */
		if (rv != ST_OK) {
			lower_end(L);
			return rv;
		}
	}
	/* Where each collective's groups lie, once for all hosts. */
	int *seen = calloc((size_t)(world / cores_per_host) + 1, sizeof(int));
	L->placement = arena_calloc(a, L->n + 1, sizeof(*L->placement));
	for (size_t k = 0; seen != NULL && L->placement != NULL && k < L->n; k++) {
		L->placement[k] = arena_calloc(a, (size_t)L->groups[k].num_groups + 1, 1);
		if (L->placement[k] == NULL)
			break;
		lower_place_groups(L->placement[k], &L->groups[k], cores_per_host, seen);
	}
	bool done =
	    seen != NULL && L->placement != NULL && (L->n == 0 || L->placement[L->n - 1] != NULL);
	free(seen);
	if (!done) {
		lower_end(L);
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	}
	return ST_OK;
}

int lower_host(Podemu__CollectiveSchedule ***out, size_t *n_out, struct arena *a,
               const struct lowering *lw, int host, struct status *st)
{
	int cph = lw->cph, world = lw->world;
	const char *forced_algorithm = lw->forced;
	if (host < 0 || host >= world / cph)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "lower: host %d of a pod of %d cores, %d per host", host, world,
		                  cph);
	Podemu__CollectiveSchedule **list = arena_calloc(a, lw->n * (size_t)cph + 1, sizeof(*list));
	if (list == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	size_t at = 0;
	for (size_t ci = 0; ci < lw->n; ci++) {
		size_t i = (size_t)lw->ids[ci];
		int comp;
		const Podemu__Node *node = graph_node_at(lw->g, lw->first, (int)i, &comp);
		enum opcode op = opcode_parse(node->opcode);
		int base = comp < 0 ? 0 : lw->first[comp];
		const struct shape *in = &lw->shapes[base + node->operands[0]],
		                   *res = &lw->shapes[i];
		const struct coll_groups groups = lw->groups[ci];
		for (int c = 0; c < cph; c++) {
			int me = host * cph + c;
			struct builder b = {.a = a};
			const char *algo = "direct";
			if (op == OP_COLLECTIVE_PERMUTE) {
				permute(&b, node, me, in);
			} else {
				int gi = groups.group_of[me], n = groups.size[gi];
				int p = groups.position_of[me];
				const int64_t *m = groups.ids + groups.start[gi];
				int d = node->n_dimensions ? (int)node->dimensions[0] : 0;
				int f[LOWER_TORUS_DIMS_MAX], k = lower_torus_dims(n, f);
				struct group_shape gs =
				    lower_group_shape(lw->placement[ci][gi], n, res, d);
				int64_t local[SPLIT_MAX], across[SPLIT_MAX];
				int grid[SPLIT_MAX];
				int L = 0, H = 0, lp = 0, h = 0;
				bool layered = gs.layered &&
				               (op == OP_ALL_REDUCE || op == OP_ALL_GATHER) &&
				               split_by_host(m, n, cph, me, local, across, grid, &L,
				                             &H, &lp, &h);
				gs.layered = layered;
				algo = lower_choose(op, n, shape_bytes(in), gs, forced_algorithm);
				bool hier = strcmp(algo, "hierarchical") == 0;
				bool doubling = strcmp(algo, "recursive-doubling") == 0;
				if (op == OP_ALL_GATHER && strcmp(algo, "torus") == 0)
					all_gather_torus(&b, m, n, p, d, f, k, in, res);
				else if (op == OP_ALL_GATHER && hier)
					all_gather_hierarchical(&b, local, L, lp, across, H, h,
					                        grid, n, d, in, res);
				else if (op == OP_ALL_GATHER &&
				         strcmp(algo, "bidirectional-ring") == 0)
					all_gather_bidirectional(&b, m, n, p, d, in, res);
				else if (op == OP_ALL_GATHER)
					all_gather(&b, m, n, p, d, in, res,
					           strcmp(algo, "direct") == 0, doubling);
				else if (op == OP_REDUCE_SCATTER && strcmp(algo, "torus") == 0)
					reduce_scatter_torus(&b, m, n, p, d, f, k, in, res);
				else if (op == OP_REDUCE_SCATTER)
					strcmp(algo, "direct") == 0
					    ? reduce_scatter_direct(&b, m, n, p, d, in, res)
					    : reduce_scatter(&b, m, n, p, d, in, res);
				else if (hier)
					all_reduce_hierarchical(&b, local, L, lp, across, H, h, in);
				else if (op == OP_ALL_REDUCE && strcmp(algo, "torus") == 0)
					all_reduce_torus(&b, m, n, p, f, k, in);
				else if (op == OP_ALL_REDUCE && strcmp(algo, "direct") == 0)
					all_reduce_direct(&b, m, n, p, in);
				else if (op == OP_ALL_REDUCE)
					all_reduce(&b, m, n, p, in, doubling);
				else
					all_to_all(&b, m, n, p, (int)node->split_dimension,
					           (int)node->concat_dimension, in, res);
			}
			Podemu__CollectiveSchedule *s = arena_alloc(a, sizeof(*s));
			if (b.failed || s == NULL)
				return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
			podemu__collective_schedule__init(s);
			s->node = (int32_t)i;
			s->ordinal = me;
			s->algorithm = (char *)algo;
			s->group_size =
			    op == OP_COLLECTIVE_PERMUTE ? 0 : groups.size[groups.group_of[me]];
			s->phases = b.phases;
			s->n_phases = b.n;
			list[at++] = s;
		}
	}
	*out = list;
	*n_out = at;
	return ST_OK;
}

int lower_collectives(Podemu__CollectiveSchedule ***out, size_t *n_out, struct arena *a,
                      const Podemu__Graph *g, const struct shape *shapes, int world,
                      int cores_per_host, int host, const char *forced_algorithm, struct status *st)
{
	struct lowering L;
	int rv = lower_begin(&L, a, g, shapes, world, cores_per_host, forced_algorithm, st);
	if (rv == ST_OK)
		rv = lower_host(out, n_out, a, &L, host, st);
	lower_end(&L);
	return rv;
}
