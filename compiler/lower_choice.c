/*
 * Which algorithm a collective goes by, and the workspace it needs on each core while it runs:
 * the rules the lowering (lower*.c), the plan and the agents share.
 */
#include <string.h>

#include "lower.h"

int lower_torus_dims(int n, int *f)
{
	const int cap = LOWER_TORUS_DIM_SIZE;
	int primes[32], np = 0;
	for (int x = n, q = 2; x > 1 && np < 32; q++) {
		while (x % q == 0 && np < 32) {
			primes[np++] = q;
			x /= q;
		}
		if (q * q > x && x > 1) {
			primes[np++] = x;
			break;
		}
	}
	int k = 0;
	for (int i = np - 1; i >= 0; i--) { /* largest first, into the smallest dimension it fits */
		int best = -1;
		for (int j = 0; j < k; j++)
			if (f[j] * primes[i] <= cap && (best < 0 || f[j] < f[best]))
				best = j;
		if (best >= 0) {
			f[best] *= primes[i];
		} else {
			if (k == LOWER_TORUS_DIMS_MAX)
				return 0;
			f[k++] = primes[i];
		}
	}
	return k;
}

/* An all-reduce that goes by recursive doubling when its group's size is a power of two. */
static bool all_reduce_may_double(int64_t bytes, const char *forced)
{
	return bytes <= LOWER_SMALL_ALL_REDUCE_BYTES ||
	       (forced != NULL && strcmp(forced, "recursive-doubling") == 0);
}

bool lower_blocks_strided(const int64_t *dims, int rank, int d)
{
	int64_t outer = 1;
	for (int i = 0; i < d && i < rank; i++)
		outer *= dims[i];
	return outer != 1;
}

struct coll_workspace lower_workspace(enum opcode op, int n, int64_t in_bytes, int64_t out_bytes,
                                      bool strided, int64_t chunk_bytes, int window,
                                      const char *algorithm)
{
	struct coll_workspace w = {0};
	if (n <= 1 || op == OP_COLLECTIVE_PERMUTE || chunk_bytes <= 0)
		return w;
	const char *algo = algorithm != NULL ? algorithm : "";
	/*
	 * Sends a phase overwrites before the peer has them: a ring reduce-scatter's partial
	 * sums, recursive doubling's; and sends gathered from strided rows.
	 */
	bool stages = strided || (op == OP_REDUCE_SCATTER && strcmp(algo, "direct") != 0) ||
	              (op == OP_ALL_REDUCE && strcmp(algo, "recursive-doubling") == 0);
	/* The largest block a core sends: a whole operand, one n-th of it, or runs of blocks. */
	int64_t most = op == OP_ALL_REDUCE                              ? in_bytes
	               : op == OP_REDUCE_SCATTER || op == OP_ALL_TO_ALL ? in_bytes / n
	                                                                : out_bytes;
	/* A torus reduce-scatter sums the runs of its largest dimension first (lower_grid.c). */
	int f[LOWER_TORUS_DIMS_MAX], k;
	if (op == OP_REDUCE_SCATTER && strcmp(algo, "torus") == 0 &&
	    (k = lower_torus_dims(n, f)) > 1) {
		int largest = 1;
		for (int i = 0; i < k; i++)
			largest = f[i] > largest ? f[i] : largest;
		w.work = in_bytes / n * (n / largest);
		most = w.work;
	}
	if (stages && most > 0) {
		w.slot = most < chunk_bytes ? most : chunk_bytes;
		w.staging = w.slot * (window > 0 ? window : 1);
	}
	return w;
}

struct coll_workspace lower_node_workspace(const Podemu__Node *n, int group_size,
                                           const struct shape *in, const struct shape *out,
                                           int64_t chunk_bytes, int window, const char *algorithm)
{
	enum opcode op = opcode_parse(n->opcode);
	bool strided = false;
	if (op == OP_ALL_GATHER || op == OP_REDUCE_SCATTER) {
		const struct shape *blocks = op == OP_ALL_GATHER ? out : in;
		int d = n->n_dimensions > 0 ? (int)n->dimensions[0] : 0;
		strided = lower_blocks_strided(blocks->dims, blocks->rank, d);
	} else if (op == OP_ALL_TO_ALL) {
		strided = lower_blocks_strided(in->dims, in->rank, (int)n->split_dimension);
	}
	return lower_workspace(op, group_size, shape_bytes(in), shape_bytes(out), strided,
	                       chunk_bytes, window, algorithm);
}

const char *lower_choose(enum opcode op, int n, int64_t bytes, struct group_shape g,
                         const char *forced)
{
	bool one_host = g.one_host, layered = g.layered, contiguous = g.contiguous, torus = g.torus;
	int pow2 = n > 0 && (n & (n - 1)) == 0;
	if (forced != NULL && forced[0] != '\0') {
		if (strcmp(forced, "torus") == 0 && torus &&
		    (op == OP_ALL_GATHER || op == OP_ALL_REDUCE ||
		     (op == OP_REDUCE_SCATTER && contiguous)))
			return "torus";
		if (strcmp(forced, "hierarchical") == 0 &&
		    (op == OP_ALL_REDUCE || op == OP_ALL_GATHER) && layered)
			return "hierarchical";
		if (strcmp(forced, "recursive-doubling") == 0 &&
		    (op == OP_ALL_REDUCE || op == OP_ALL_GATHER) && pow2)
			return "recursive-doubling";
		/*
		 * A direct all-reduce sums its blocks in order, holding the others' chunks: only
		 * where each peer host sends one member's (the data plane's credit per host).
		 */
		if (strcmp(forced, "direct") == 0 &&
		    (op == OP_ALL_GATHER || ((op == OP_ALL_REDUCE || op == OP_REDUCE_SCATTER) &&
		                             (g.one_host || g.one_per_host))))
			return "direct";
		if (strcmp(forced, "bidirectional-ring") == 0 && op == OP_ALL_GATHER && contiguous)
			return "bidirectional-ring";
		if (strcmp(forced, "ring") == 0 &&
		    (op == OP_ALL_GATHER || op == OP_ALL_REDUCE || op == OP_REDUCE_SCATTER))
			return "ring";
	}
	/* Within one host a transfer is a memory copy: no hop is worth a ring's extra steps. */
	switch (op) {
	case OP_ALL_GATHER:
		if (one_host)
			return "direct";
		if (pow2 && n > 1 &&
		    bytes * n <= (layered ? LOWER_SMALL_LAYERED_ALL_GATHER_BYTES
		                          : LOWER_SMALL_ALL_GATHER_BYTES))
			return "recursive-doubling";
		if (torus && n > LOWER_TORUS_MEMBERS)
			return "torus";
		if (layered)
			return "hierarchical";
		return contiguous && bytes * n <= LOWER_BIDIRECTIONAL_ALL_GATHER_BYTES
		           ? "bidirectional-ring"
		           : "ring";
	case OP_ALL_REDUCE:
		if (pow2 && n > 1 && all_reduce_may_double(bytes, NULL))
			return "recursive-doubling";
		if (torus && n > LOWER_TORUS_MEMBERS && !one_host)
			return "torus";
		if (one_host || (g.one_per_host && n <= LOWER_DIRECT_HOSTS))
			return "direct";
		return layered ? "hierarchical" : "ring";
	case OP_REDUCE_SCATTER:
		/* As the direct all-reduce's first half, and for the same groups. */
		if (one_host || (g.one_per_host && n <= LOWER_DIRECT_HOSTS &&
		                 bytes <= LOWER_DIRECT_REDUCE_SCATTER_BYTES))
			return "direct";
		return torus && contiguous && n > LOWER_TORUS_MEMBERS && !one_host ? "torus"
		                                                                   : "ring";

	case OP_ALL_TO_ALL:
	case OP_COLLECTIVE_PERMUTE:
		return "direct";
	default:
		return "ring";
	}
}
