/*
 * The collective executor's state for one collective on one core, shared by its files:
 * collectives.c (phases, sends, receives) and coll_posts.c (receives read into place).
 */
#ifndef PODEMU_COLL_RUN_H
#define PODEMU_COLL_RUN_H

#include "step.h"

/*
 * A chunk of the collective's workspace holding a send: gathered from strided rows, or copied
 * from bytes the collective overwrites before the peer has them. Free again once the stream
 * wrote it (a peer agent's) or the local core took it.
 */
struct stage_slot {
	unsigned char *p;
	struct inbox_entry *local; /* the post it holds, or NULL */
	struct dp_chan *ch;        /* or the channel writing it, with its ticket */
	uint64_t ticket;
};

struct run {
	struct device *dev;
	struct step *s;
	struct core *c;
	uint32_t coll;
	unsigned char *in;
	unsigned char *out;
	int dtype;
	enum reducer red;
	uint32_t *send_tags;    /* [world] */
	uint32_t *recv_tags;    /* [world] */
	struct dp_chan **chans; /* [hosts] */
	unsigned char *work;    /* the work area after the stage slots (COLL_WORK), if any */
	/* The window's chunks after it, for sends that must stay put until written or taken. */
	struct stage_slot *stage;
	int num_stage;
	int64_t stage_bytes; /* of each slot */
	struct timespec deadline;
	struct recv_post *receives; /* [phase]: see struct recv_post */
	/* Chunks posted to local cores and not consumed yet (they may outlive a phase). */
	struct inbox_entry **posts;
	int num_posts;
	int cap_posts;
	bool remote; /* it has peers on other hosts */
};

static inline int host_of(const struct run *r, int ordinal)
{
	return ordinal / r->dev->cores_per_host;
}

static inline bool is_local(const struct run *r, int ordinal)
{
	return host_of(r, ordinal) == r->dev->host_index;
}

/* The buffer a phase sends from. */
static inline unsigned char *send_base(const struct run *r, const Podemu__CollPhase *ph)
{
	return ph->send_buffer == PODEMU__COLL_BUFFER__COLL_INPUT  ? r->in
	       : ph->send_buffer == PODEMU__COLL_BUFFER__COLL_WORK ? r->work
	                                                           : r->out;
}

/* The buffer a phase's recv_block is in. */
static inline unsigned char *recv_base(const struct run *r, const Podemu__CollPhase *ph)
{
	return ph->recv_work ? r->work : r->out;
}

/*
 * Waits until the core is woken or r's deadline, dev->lock held, as pthread_cond_timedwait
 * does: ETIMEDOUT once the deadline passed, else 0 (woken, or not: the caller looks again).
 * With peers on other hosts it polls its host's data plane meanwhile (coll_wait.c).
 */
int coll_wait(struct run *r);

/* A phase whose received bytes are copied from a peer agent: they may be read into place. */
bool coll_placeable(const struct run *r, const Podemu__CollPhase *ph);
/*
 * Opens, with the collective, the receives of the phases whose bytes no earlier phase reads
 * or writes (an all-gather's, say): a peer ahead of this core then lands its chunks in place
 * too. Their tags are the ones run_phases will count.
 */
void coll_open_early_posts(struct run *r, const Podemu__CollectiveSchedule *sched);
/* Opens phase k's receive (tag: its count from this peer) unless it is open already. */
void coll_open_post(struct run *r, int k, const Podemu__CollPhase *ph, uint32_t tag);
/*
 * Closes phase k's receive; a chunk still being read into it is waited for (it is complete
 * when the phase is), or after a failure or the deadline, given up with its stream.
 */
void coll_close_post(struct run *r, int k, bool failed);

#endif
