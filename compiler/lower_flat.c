/*
 * Collective algorithms over a group as one sequence of members: rings, direct exchanges and
 * recursive doubling, all-to-all and permutes.
 */
#include "lower_build.h"

/*
 * All-gather in place: ring (n-1 phases of one block each), direct (every member sends its
 * input to every other, all at once), or recursive doubling for a power-of-two group (log2 n
 * phases: at distance `bit` a core swaps the 'bit' blocks it holds, a run of consecutive
 * blocks, with the core that holds the next run).
 */
void lower_all_gather(struct builder *b, const int64_t *m, int n, int p, int d,
                      const struct shape *in, const struct shape *out, int direct, int doubling)
{
	copy_phase(b, IN, whole(b, in), split_block(b, out, d, n, p));
	if (doubling) {
		for (int bit = 1; bit < n; bit <<= 1) {
			int partner = p ^ bit;
			exchange(b, (int)m[partner], OUT,
			         split_range(b, out, d, n, p & ~(bit - 1), bit), (int)m[partner],
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
		exchange(b, (int)m[MOD(p + 1, n)], OUT, split_block(b, out, d, n, MOD(p - s, n)),
		         (int)m[MOD(p - 1, n)], split_block(b, out, d, n, MOD(p - s - 1, n)), 0);
}

/*
 * Bidirectional ring all-gather (contiguous blocks): the first half of every block travels
 * around the ring one way and the second half the other way, both at once (`with_next`), so
 * each core sends to and receives from both neighbours in every step.
 */
void lower_all_gather_bidirectional(struct builder *b, const int64_t *m, int n, int p, int d,
                                    const struct shape *in, const struct shape *out)
{
	copy_phase(b, IN, whole(b, in), split_block(b, out, d, n, p));
	for (int s = 0; s < n - 1; s++) {
		Podemu__CollPhase *ph = exchange(
		    b, (int)m[MOD(p + 1, n)], OUT, half_block(b, out, d, n, MOD(p - s, n), 0),
		    (int)m[MOD(p - 1, n)], half_block(b, out, d, n, MOD(p - s - 1, n), 0), 0);
		if (ph != NULL)
			ph->with_next = 1;
		exchange(b, (int)m[MOD(p - 1, n)], OUT, half_block(b, out, d, n, MOD(p + s, n), 1),
		         (int)m[MOD(p + 1, n)], half_block(b, out, d, n, MOD(p + s + 1, n), 1), 0);
	}
}

/*
 * Ring reduce-scatter with the output as accumulator: at phase s a core sends its partial sum of
 * block p-s-1 on and receives the partial of block p-s-2, which it adds to its own input block
 * into the output. After n-1 phases the output holds block p, reduced over the group.
 */
void lower_reduce_scatter(struct builder *b, const int64_t *m, int n, int p, int d,
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
 * and sums the blocks it receives into its output in the order of the members after it, the
 * first (from p+1) combined with its own block as it lands, so that block is never copied.
 */
void lower_reduce_scatter_direct(struct builder *b, const int64_t *m, int n, int p, int d,
                                 const struct shape *in, const struct shape *out)
{
	if (n == 1) {
		copy_phase(b, IN, split_block(b, in, d, n, p), whole(b, out));
		return;
	}
	size_t first = b->n;
	combine(b, (int)m[MOD(p - 1, n)], IN, split_block(b, in, d, n, MOD(p - 1, n)),
	        (int)m[MOD(p + 1, n)], whole(b, out), split_block(b, in, d, n, p));
	for (int k = 2; k < n; k++)
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
void lower_all_reduce(struct builder *b, const int64_t *m, int n, int p, const struct shape *in,
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

/* Block q of segment s (of segs) of a buffer split among n members. */
static Podemu__BlockLayout *seg_block(struct builder *b, const struct shape *in, int n, int segs,
                                      int s, int q)
{
	return flat_block(b, in, n * segs, s * n + q);
}

/*
 * Direct all-reduce: every member sends flat block q of its input to member q, all at once,
 * and sums the blocks it receives into its own block of the output in the order of the
 * members after it (p+1, p+2, ...: the same order whoever arrives first; p+1's combined with
 * its own input block as it lands, as the direct reduce-scatter does); then it sends its
 * summed block to every other member, all at once. Two rounds instead of a ring's 2(n-1), the
 * same bytes. Sends come from the input, which only the gather half (after a drain: local
 * cores took what they were sent) overwrites when the output is the input's bytes.
 *
 * A large buffer runs as segments, each its own two rounds, and the gather round of one runs
 * at once with the reduce round of the next: no member waits with idle links while the last
 * sums of a round land. Segment s's block q is flat piece s * n + q of the buffer.
 */
static void direct_reduce_round(struct builder *b, const int64_t *m, int n, int p,
                                const struct shape *in, int segs, int s)
{
	combine(b, (int)m[MOD(p - 1, n)], IN, seg_block(b, in, n, segs, s, MOD(p - 1, n)),
	        (int)m[MOD(p + 1, n)], seg_block(b, in, n, segs, s, p),
	        seg_block(b, in, n, segs, s, p));
	for (int k = 2; k < n; k++)
		exchange(b, (int)m[MOD(p - k, n)], IN, seg_block(b, in, n, segs, s, MOD(p - k, n)),
		         (int)m[MOD(p + k, n)], seg_block(b, in, n, segs, s, p), 1);
}

static void direct_gather_round(struct builder *b, const int64_t *m, int n, int p,
                                const struct shape *in, int segs, int s)
{
	for (int k = 1; k < n; k++) {
		Podemu__CollPhase *ph =
		    exchange(b, (int)m[MOD(p + k, n)], OUT, seg_block(b, in, n, segs, s, p),
		             (int)m[MOD(p - k, n)], seg_block(b, in, n, segs, s, MOD(p - k, n)), 0);
		if (ph != NULL && k == 1)
			ph->drain = 1;
	}
}

int lower_direct_segments(int n, int64_t bytes)
{
	int64_t segs = bytes / ((int64_t)n * LOWER_DIRECT_SEGMENT_BYTES);
	return segs < 1                           ? 1
	       : segs > LOWER_DIRECT_SEGMENTS_MAX ? LOWER_DIRECT_SEGMENTS_MAX
	                                          : (int)segs;
}

void lower_all_reduce_direct(struct builder *b, const int64_t *m, int n, int p,
                             const struct shape *in)
{
	if (n == 1) {
		copy_phase(b, IN, whole(b, in), whole(b, in));
		return;
	}
	int segs = lower_direct_segments(n, shape_bytes(in));
	for (int s = 0; s <= segs; s++) {
		size_t first = b->n;
		if (s > 0)
			direct_gather_round(b, m, n, p, in, segs, s - 1);
		if (s < segs)
			direct_reduce_round(b, m, n, p, in, segs, s);
		at_once(b, first);
	}
}

void lower_all_to_all(struct builder *b, const int64_t *m, int n, int p, int sd, int cd,
                      const struct shape *in, const struct shape *out)
{
	copy_phase(b, IN, split_block(b, in, sd, n, p), split_block(b, out, cd, n, p));
	for (int k = 1; k < n; k++)
		exchange(b, (int)m[MOD(p + k, n)], IN, split_block(b, in, sd, n, MOD(p + k, n)),
		         (int)m[MOD(p - k, n)], split_block(b, out, cd, n, MOD(p - k, n)), 0);
}

void lower_permute(struct builder *b, const Podemu__Node *node, int me, const struct shape *in)
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
