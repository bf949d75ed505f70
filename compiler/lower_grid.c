/*
 * Collective algorithms over a group seen as a grid: hosts by places within a host
 * (hierarchical), or a torus of small dimensions.
 */
#include "lower_build.h"

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
void lower_all_reduce_hierarchical(struct builder *b, const int64_t *local, int L, int p,
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
bool lower_split_by_host(const int64_t *m, int n, int cph, int64_t me, int64_t *local,
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
void lower_all_gather_hierarchical(struct builder *b, const int64_t *local, int L, int p,
                                   const int64_t *across, int H, int h, const int *grid, int n,
                                   int d, const struct shape *in, const struct shape *out)
{
#define BLOCK(j, q) split_block(b, out, d, n, grid[MOD(j, H) * L + MOD(q, L)])
	copy_phase(b, IN, whole(b, in), BLOCK(h, p));
	for (int s = 0; s < H - 1; s++)
		exchange(b, (int)across[MOD(h + 1, H)], OUT, BLOCK(h - s, p),
		         (int)across[MOD(h - 1, H)], BLOCK(h - s - 1, p), 0);
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
void lower_all_gather_torus(struct builder *b, const int64_t *m, int n, int p, int d, const int *f,
                            int k, const struct shape *in, const struct shape *out)
{
	copy_phase(b, IN, whole(b, in), split_block(b, out, d, n, p));
	int below[LOWER_TORUS_DIMS_MAX + 1];
	torus_below(f, k, below);
	for (int i = 0; i < k; i++) {
		struct torus_ring t = torus_ring(p, f, below, i);
		for (int s = 0; s < f[i] - 1; s++)
			exchange(b, (int)m[t.next], OUT,
			         split_range(b, out, d, n,
			                     t.base + MOD(t.digit - s, f[i]) * below[i], below[i]),
			         (int)m[t.prev],
			         split_range(b, out, d, n,
			                     t.base + MOD(t.digit - s - 1, f[i]) * below[i],
			                     below[i]),
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
void lower_all_reduce_torus(struct builder *b, const int64_t *m, int n, int p, const int *f, int k,
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
void lower_reduce_scatter_torus(struct builder *b, const int64_t *m, int n, int p, int d,
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
