/*
 * Collective lowering: for every collective of a step, the algorithm (from size, groups and
 * pod shape, or forced) and each core's explicit schedule of phases (peer, block, copy or
 * reduce). The coordinator ships the program with the collectives' parameters (op, groups,
 * shapes, a forced algorithm); each agent lowers them for its own cores when it prepares the
 * step, so what crosses the wire does not grow with the world.
 */
#ifndef PODEMU_LOWER_H
#define PODEMU_LOWER_H

#include <stdbool.h>
#include <stdint.h>

#include "arena.h"
#include "collective.h"
#include "dtype.h"
#include "graph.h"
#include "podemu.pb-c.h"
#include "status.h"

/*
 * All-reduces up to this size, and all-gathers up to these output sizes across hosts, use
 * recursive doubling when the group size is a power of two. Above 1 MiB the hierarchical
 * all-gather wins for groups with several members on each of several hosts (measured on a 4x2
 * pod: 0.68 against 0.40 GB/s busbw at 4 MiB; recursive doubling 0.40 against 0.32 at 1 MiB).
 */
#define LOWER_SMALL_ALL_REDUCE_BYTES (256 * 1024)
#define LOWER_SMALL_ALL_GATHER_BYTES (4 * 1024 * 1024)
#define LOWER_SMALL_LAYERED_ALL_GATHER_BYTES (1024 * 1024)
/*
 * Larger all-gathers across hosts, up to this output size, go both ways around the ring when
 * their blocks are contiguous (4x1 pod, 16 MiB: 1.05 against 0.89 GB/s busbw; at 64 MiB the
 * plain ring did as well or better).
 */
#define LOWER_BIDIRECTIONAL_ALL_GATHER_BYTES (32 * 1024 * 1024)
/*
 * All-gathers and all-reduces (past recursive doubling's sizes) across hosts in groups of more
 * members than this go around a torus, one ring per dimension (a v4-4096's 2048 cores: 4 x 4 x
 * 4 x 4 x 4 x 2, 16 phases instead of 2047), whatever their size: the same bytes cross, in far
 * fewer steps.
 */
#define LOWER_TORUS_MEMBERS 64
/*
 * All-reduces (past recursive doubling's sizes) go direct within one host, and across hosts
 * for groups of up to this many members, one on each host (4x1 pod: 0.57 against 0.51 GB/s
 * busbw at 4 MiB, 0.63-0.66 against 0.50-0.57 at 16 MiB; more members would hold up to a
 * window of chunks from each of them at once).
 */
#define LOWER_DIRECT_HOSTS 4
/*
 * A direct all-reduce runs in segments of at least this many bytes per member's block, at most
 * LOWER_DIRECT_SEGMENTS_MAX of them (lower_direct_segments; 4x1 pod, 16 MiB, four alternating
 * runs of 150 iterations, busbw of 4 segments against 1: 1.229 / 1.117, 1.347 / 1.275,
 * 1.267 / 1.112, 1.143 / 1.036 GB/s; at 64 MiB even, at 4 MiB 256 KiB blocks lost: 1.25 / 1.46).
 */
#define LOWER_DIRECT_SEGMENT_BYTES (1024 * 1024)
#define LOWER_DIRECT_SEGMENTS_MAX 4
/* How many segments a direct all-reduce of `bytes` over n members runs in. */
int lower_direct_segments(int n, int64_t bytes);
/*
 * Reduce-scatters go direct within one host, and across such groups up to this operand size
 * (4x1 pod, three alternating runs, busbw median against the ring: 1 MiB 0.152 / 0.121, 16 MiB
 * 0.381 / 0.263, 64 MiB 0.528 / 0.596 GB/s; within one host direct was ahead at every size).
 */
#define LOWER_DIRECT_REDUCE_SCATTER_BYTES (32 * 1024 * 1024)
#define LOWER_TORUS_DIMS_MAX 16
#define LOWER_TORUS_DIM_SIZE 4

/*
 * Schedules of host `host`'s cores (of cores_per_host each, world cores in all) for every
 * collective of g (shapes from graph_check).
 * forced_algorithm is NULL/"" (choose), "ring", "bidirectional-ring" (all-gather with
 * contiguous blocks), "direct", "recursive-doubling", "hierarchical" or "torus"; an algorithm that
 * does not apply to an op is ignored for it. Results are allocated from a.
 */
int lower_collectives(Podemu__CollectiveSchedule ***out, size_t *n_out, struct arena *a,
                      const Podemu__Graph *g, const struct shape *shapes, int world,
                      int cores_per_host, int host, const char *forced_algorithm,
                      struct status *st);

/*
 * The same in two stages, for lowering many hosts of one graph: lower_begin resolves every
 * collective's groups once (the arrays from a, the groups malloc'd: lower_end frees them,
 * also after a failure of lower_begin); lower_host then gives host `host`'s schedules as
 * lower_collectives does.
 */
struct lowering {
	const Podemu__Graph *g;
	const struct shape *shapes;
	int world, cph;
	const char *forced;
	int *first;                 /* graph_first_ids */
	size_t n;                   /* collective nodes */
	int *ids;                   /* [n]: their ids */
	struct coll_groups *groups; /* [n]: their groups (a permute's: none) */
	unsigned char **placement;  /* [n][group]: PLACED_* */
};
#define PLACED_ONE_HOST 1     /* every member on one host */
#define PLACED_ONE_PER_HOST 2 /* every member on a host of its own */
#define PLACED_LAYERED 4      /* several hosts with as many members each, more than one */
int lower_begin(struct lowering *L, struct arena *a, const Podemu__Graph *g,
                const struct shape *shapes, int world, int cores_per_host,
                const char *forced_algorithm, struct status *st);
int lower_host(Podemu__CollectiveSchedule ***out, size_t *n_out, struct arena *a,
               const struct lowering *lw, int host, struct status *st);
void lower_end(struct lowering *L);

/*
 * The dimensions of a torus for a group of n members: n's prime factors packed into dimensions
 * of at most LOWER_TORUS_DIM_SIZE members (a larger prime is a dimension of its own), first
 * dimension fastest over group positions, into f[LOWER_TORUS_DIMS_MAX]. Every step of a ring
 * moves as many bytes whatever the shape, so small dimensions mean fewer steps: 2048 members
 * are 4 x 4 x 4 x 4 x 4 x 2, 16 phases. Returns how many; fewer than 2 means no torus (a ring
 * is the same).
 */
int lower_torus_dims(int n, int *f);

/* The shape of a collective's group, as the choice of its algorithm reads it. */
struct group_shape {
	bool one_host;     /* every member on one host */
	bool one_per_host; /* every member on a host of its own */
	bool layered;      /* several members on each of several hosts */
	bool contiguous;   /* blocks along the collective's dimension are contiguous */
	bool torus;        /* the group folds into a torus of more than one dimension */
};

/*
 * Where each group of g lies (PLACED_*), into placement[group]; count has a zero counter per
 * host and is left so.
 */
void lower_place_groups(unsigned char *placement, const struct coll_groups *g, int cph, int *count);
/* The shape of a group of n members placed so (PLACED_*), its blocks along d of res. */
struct group_shape lower_group_shape(unsigned char placement, int n, const struct shape *res,
                                     int d);

/*
 * The algorithm of op over a group of n members of bytes each (its operand), from the group's
 * shape; forced as lower_collectives takes it, where it applies.
 */
const char *lower_choose(enum opcode op, int n, int64_t bytes, struct group_shape g,
                         const char *forced);

/*
 * What one core works through while a collective runs, in its part of the reservation, besides
 * its input and output (received partial sums are combined with the input straight into the
 * output): `window` chunks for sends whose bytes must stay put until the peer has them (those a
 * phase overwrites in place, as a ring reduce-scatter's and a recursive-doubling all-reduce's,
 * and those gathered from strided rows), then, for a reduce-scatter that may go around a torus,
 * its work area.
 */
struct coll_workspace {
	int64_t staging; /* window slots of slot bytes */
	int64_t slot;
	int64_t work; /* a torus reduce-scatter's partial sums: one run of its largest dimension */
};

/*
 * The workspace of op over a group of n members that runs `algorithm` (lower_choose's),
 * in_bytes in and out_bytes out, whose send blocks are `strided`
 * (lower_blocks_strided), with the pod's chunk size and window. The plan reserves it and
 * agents use it: one rule.
 */
struct coll_workspace lower_workspace(enum opcode op, int n, int64_t in_bytes, int64_t out_bytes,
                                      bool strided, int64_t chunk_bytes, int window,
                                      const char *algorithm);
/*
 * True when the blocks of a value of these dimensions split along d are not one run each (the
 * dimensions before d hold other than one element): an all-gather's result, a reduce-scatter's
 * or all-to-all's operand.
 */
bool lower_blocks_strided(const int64_t *dims, int rank, int d);
/*
 * The workspace of collective node n for a core in a group of group_size that runs
 * `algorithm` (its schedule's), in and out its operand's and result's shapes (the agents'
 * side; the plan reads HLO, hlo_collective.c).
 */
struct coll_workspace lower_node_workspace(const Podemu__Node *n, int group_size,
                                           const struct shape *in, const struct shape *out,
                                           int64_t chunk_bytes, int window, const char *algorithm);

/*
 * Each core's share of its host's receive slots for a step (lower_receive.c): where chunks
 * from peer hosts wait that cannot be read straight into place. A peer host's stream may hold
 * window x cores_per_host chunks (the data plane's credit), so a host holds that many slots
 * for each peer host it receives from, or as many as that peer sends it in the step if fewer
 * (a collective in a called computation may run any number of times: the credit); each core
 * holds an equal share (the most over the pod's hosts), each slot as large as the largest
 * chunk from a peer (rounded up to HBM_ALIGNMENT). None on one host. g's computations are
 * the called ones; repeats[id] (NULL: 1 each) says how many collectives entry node id stands
 * for, so that alike ones are lowered once.
 */
struct receive_area {
	int slots;          /* per core */
	int64_t slot_bytes; /* each */
};
int lower_receive_area(struct receive_area *out, const Podemu__Graph *g, const struct shape *shapes,
                       const int *repeats, int world, int cores_per_host,
                       const char *forced_algorithm, int64_t chunk_bytes, int window,
                       struct status *st);

#endif
