/* A step on one host, shared by the step lifecycle (exec.c) and the collectives (collectives.c). */
#ifndef PODEMU_STEP_H
#define PODEMU_STEP_H

#include "device.h"
#include "graph.h"

/* A chunk waiting for the core it is addressed to. */
struct inbox_entry {
	struct inbox_entry *next;
	struct dp_header h;
	const void *payload;
	struct dp_request *req; /* from a peer agent: acknowledged with dp_complete */
	bool placed;            /* from a peer agent: read straight into the output already */
	bool in_slot;           /* from a peer agent: its payload is in a receive slot */
	int done;               /* local: the receiver consumed it */
	int orphan;             /* local: the sender gave up; the receiver frees it */
};

/*
 * A receive a core has open in its collective: a peer's chunk for it is read by the data
 * plane straight into the output (only where received bytes are copied, not reduced). A
 * phase's receive opens when the phase starts, or with the collective when nothing before
 * that phase touches its bytes.
 */
struct recv_post {
	bool open;
	uint32_t coll, src, tag;
	unsigned char *base;
	const Podemu__BlockLayout *layout;
	int64_t len;
	struct dp_request *placing; /* the chunk being read into it; the phase waits for it */
};

struct recv_posts {
	struct recv_post *list; /* one per phase of the running collective */
	int n;
};

/* The host's receive slots for a step (receive_slots.c); all under the device lock. */
struct receive_slots {
	int n;        /* on this host (0: none, or no backing) */
	int per_core; /* each core's share, at the top of its reservation */
	int64_t bytes;
	unsigned char **base; /* [core]: its share's first slot */
	int *free_list;       /* slot numbers, core * per_core + k */
	int n_free;
	struct dp_request **reading; /* [slot]: the chunk being read into it, or NULL */
	int peak;                    /* the most in use at once */
	int64_t outside;             /* chunks from peer hosts that found no slot */
};

#define CORE_COMPUTING (-1)
#define CORE_DONE (-2)

struct step {
	uint64_t id;
	struct arena *arena;
	Podemu__Program *prog;
	struct shape *shapes;
	enum opcode *ops;
	/*
	 * [core][node]: where the node's value is on the core's heap (offset -1: not there);
	 * the step owns the buffers of its outputs until they become device buffers.
	 */
	struct hbm_buffer **at;
	/*
	 * Nodes are numbered across the graph (graph.h): the entry's, then each computation's.
	 * A called computation's values are placed as it runs (control.c).
	 */
	size_t n_entry, n_total;
	Podemu__Node **node_of; /* [node] */
	int *base_of;      /* [node]: the id of its computation's node 0 (operands add to it) */
	int *comp_of;      /* [node]: its computation, -1 for the entry */
	int *comp_first;   /* [computation]: the id of its node 0 */
	void ***ptrs;      /* [core][node]: where a value placed at run time is, or NULL */
	void ****elems;    /* [core][node]: a tuple value's elements' addresses, or NULL */
	void ****staging;  /* [core][node]: a while body's results, staged per iteration */
	void ***elsewhere; /* [core][node]: a value outside HBM (BUFFER_OTHER_SPACE), or NULL */
	const Podemu__CollectiveSchedule ***sched; /* [core][node] */
	int *coll_of_node;
	int num_colls;
	uint32_t max_instances; /* collective instances a chunk may name: more with loops */
	int timeout_ms;
	int64_t chunk_bytes;
	int window;
	bool running;
	int done_cores;
	struct status *core_status;
	int *position;   /* [core]: the collective node it waits in, CORE_COMPUTING or CORE_DONE */
	int cancel_code; /* set when the coordinator aborts the running step, or a core fails */
	int failed_core; /* the local core whose failure set cancel_code, or -1 */
	char cancel_reason[512];
	struct inbox_entry **inbox; /* [core] */
	struct recv_posts *posts;   /* [core] */
	int64_t *micros;            /* [core * num_colls] */
	/* [core * num_colls]: the monotonic clock at the first start and the last end (µs) */
	int64_t *started_micros, *ended_micros;
	int *fusion_head; /* [node]: first node fused into it, or -1 */
	int *fusion_next; /* [node]: the next node of the same fusion, or -1 */
	struct receive_slots receive;
};

/* The index the client recorded node i under (the coordinator may have reordered nodes). */
static inline int step_source_node(const struct step *s, int i)
{
	return (size_t)i < s->prog->n_source_nodes ? s->prog->source_nodes[i] : i;
}

/* Bytes in a block's sequence (0 for none). */
static inline int64_t layout_len(const Podemu__BlockLayout *l)
{
	return l == NULL ? 0 : l->row_bytes * l->rows;
}

/* Bytes of a contiguous piece of layout l starting at sequence position pos (*n of them). */
static inline unsigned char *block_piece(unsigned char *base, const Podemu__BlockLayout *l,
                                         int64_t pos, int64_t len, int64_t *n)
{
	int64_t row = pos / l->row_bytes, within = pos % l->row_bytes;
	*n = l->row_bytes - within < len ? l->row_bytes - within : len;
	return base + l->offset + row * l->row_stride + within;
}

static inline void *core_ptr(struct core *c, struct step *s, int node)
{
	if (s->ptrs[c->local][node] != NULL || (size_t)node >= s->n_entry)
		return s->ptrs[c->local][node];
	int64_t off = s->at[c->local][node].offset;
	if (off < 0)
		return s->elsewhere != NULL ? s->elsewhere[c->local][node] : NULL;
	return hbm_ptr(&c->heap, off);
}

/* A node whose value has element assignments: control flow, or an opaque op's tuple. */
static inline bool step_has_elements(const struct step *s, int id)
{
	return opcode_is_control_flow(s->ops[id]) ||
	       (s->ops[id] == OP_OPAQUE && s->shapes[id].tuple);
}

/* The id of operand j of node id (operands index the node's own computation). */
static inline int step_operand(const struct step *s, int id, size_t j)
{
	return s->base_of[id] + s->node_of[id]->operands[j];
}

/* One activation of a computation on a core: its part of the reservation, its arguments. */
struct step_arg {
	void *ptr;    /* an array argument */
	void **elems; /* a tuple argument's elements */
	int n;
};
struct frame {
	int comp;                    /* -1: the entry */
	int64_t base;                /* where its temporaries start in the reservation */
	const struct step_arg *args; /* by parameter number */
	int n_args;
	void *const *results; /* where the elements of what it returns go (BUFFER_CALLER) */
	int n_results;
};

/* Runs the nodes of f's computation on core c, in their planned order (exec.c). */
int step_run_nodes(struct device *dev, struct step *s, struct core *c, const struct frame *f,
                   struct status *st);
/* Places node id's value for frame f before it runs (control.c). */
int control_place(struct step *s, struct core *c, const struct frame *f, int id, struct status *st);
/* Runs a while, conditional or call node on core c (control.c). */
int control_run(struct device *dev, struct step *s, struct core *c, const struct frame *f, int id,
                struct status *st);
/*
 * The address of bytes at offset in frame f's part of the reservation (NULL without backing);
 * INVALID_ARGUMENT when they are not inside it (node id names them).
 */
int control_frame_ptr(struct step *s, struct core *c, const struct frame *f, int64_t offset,
                      int64_t bytes, int id, void **out, struct status *st);
/* Checks what step_build can of the computations: kinds, slots, what the pod runs. */
int control_check(struct device *dev, struct step *s, struct status *st);
/* The staging of each while's results on every core (backed pods), at prepare. */
int control_allocate(struct device *dev, struct step *s, struct status *st);

/* Frees the outputs a prepared step allocated (when it did not publish them). Lock held. */
void step_free_outputs(struct device *dev, struct step *s);
/* Answers every queued chunk of s and frees the step. Lock held. */
void step_destroy(struct device *dev, struct step *s);

/*
 * Runs core c's schedule for collective node `node` of s, through its workspace (scratch_bytes
 * of the reservation where the plan put them).
 */
int coll_run(struct device *dev, struct step *s, struct core *c, int node, void *scratch,
             int64_t scratch_bytes, struct status *st);
/* Gives back the data plane core c holds since a collective's wait (coll_wait.c), if any. */
void core_release_dp(struct device *dev, struct core *c);
/* Appends e to the inbox of local core `local` (inbox.c; lock held). */
void inbox_push(struct step *s, int local, struct inbox_entry *e);
/* Queues a chunk from a peer agent for its core (lock held by the caller). */
int coll_enqueue_remote(struct device *dev, struct step *s, struct dp_request *req,
                        const struct dp_header *h, const void *payload, struct status *st);
/* Where a peer's chunk for an open receive goes (NULL: nowhere yet). Lock held. */
void *coll_place(struct device *dev, struct step *s, struct dp_request *req,
                 const struct dp_header *h);
/* A chunk being placed was lost with its stream. Lock held. */
void coll_unplace(struct device *dev, struct step *s, struct dp_request *req);
/*
 * Receive slots (receive_slots.c), all with the device lock held. check: the program's slots
 * lie in its reservation (at step_build). init: the host's slots from its cores' reservations
 * (at prepare, once they are allocated). take: a free slot for a chunk of len bytes being read
 * by req, or NULL (then counted as outside). read: the chunk read into payload is delivered;
 * true when payload is a slot. put: the slot at payload is free again (a chunk consumed, or
 * one whose read broke off). drain: cancels the reads into slots and waits for them to end,
 * before the reservation goes.
 */
int receive_slots_check(const Podemu__Program *p, struct status *st);
int receive_slots_init(struct device *dev, struct step *s, struct status *st);
void *receive_slot_take(struct step *s, struct dp_request *req, int64_t len);
bool receive_slot_read(struct device *dev, struct step *s, const void *payload);
void receive_slot_put(struct device *dev, struct step *s, const void *payload);
void receive_slots_drain(struct device *dev, struct step *s);

/* Answers and frees every chunk still queued when the step ends (lock held). */
void coll_step_cleanup(struct device *dev, struct step *s);

#endif
