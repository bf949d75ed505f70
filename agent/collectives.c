/*
 * The collective executor: a core walks the schedule its agent lowered for it, phase by phase,
 * posting chunks to its send peer (a local core's inbox, or a data-plane channel to a peer
 * agent) and consuming chunks from its receive peer, with at most `window` chunks in flight
 * per peer, through the workspace the plan reserved for it. It never decides anything the
 * schedule does not say.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "coll_run.h"
#include "kernels.h"
#include "log.h"
#include "lower.h"

static void seq_write(unsigned char *base, const Podemu__BlockLayout *l, int64_t pos,
                      const unsigned char *src, int64_t len)
{
	while (len > 0) {
		int64_t n;
		unsigned char *p = block_piece(base, l, pos, len, &n);
		memcpy(p, src, (size_t)n);
		src += n, pos += n, len -= n;
	}
}

static void seq_read(unsigned char *dst, unsigned char *base, const Podemu__BlockLayout *l,
                     int64_t pos, int64_t len)
{
	while (len > 0) {
		int64_t n;
		unsigned char *p = block_piece(base, l, pos, len, &n);
		memcpy(dst, p, (size_t)n);
		dst += n, pos += n, len -= n;
	}
}

static void seq_reduce(int dtype, enum reducer red, unsigned char *base,
                       const Podemu__BlockLayout *l, int64_t pos, const unsigned char *src,
                       int64_t len)
{
	while (len > 0) {
		int64_t n;
		unsigned char *p = block_piece(base, l, pos, len, &n);
		kernel_combine(dtype, red, p, p, src, n);
		src += n, pos += n, len -= n;
	}
}

/* Wakes a core that waits for its sends to be taken or acknowledged. dev->lock held. */
static void sends_progressed(struct core *c)
{
	if (c->awaits_sends)
		core_wake(c);
}

/* A channel of core arg completed a send or took an acknowledgement. */
static void notify(void *arg)
{
	struct core *c = arg;
	struct device *dev = c->dev;
	pthread_mutex_lock(&dev->lock);
	sends_progressed(c);
	pthread_mutex_unlock(&dev->lock);
}

/* A data-plane failure toward host h, said with the cores it serves. */
static int peer_failed(const struct run *r, int h, int rv, struct status *st)
{
	if (rv == ST_OK || rv == DP_BUSY)
		return rv;
	int cph = r->dev->cores_per_host;
	char why[STATUS_MESSAGE_MAX];
	snprintf(why, sizeof(why), "%s", st->message);
	return status_set(st, rv, "host %d (cores %d..%d): %s", h, h * cph, (h + 1) * cph - 1, why);
}

static int get_chan(struct run *r, int ordinal, struct dp_chan **out, struct status *st)
{
	int h = host_of(r, ordinal);
	if (r->chans[h] == NULL) {
		int rv = dp_chan_open(&r->chans[h], r->dev->dp, r->s->prog->peer_data_urls[h],
		                      r->s->window, r->s->timeout_ms, notify, r->c, st);
		if (rv != ST_OK)
			return peer_failed(r, h, rv, st);
	}
	*out = r->chans[h];
	return ST_OK;
}

/*
 * Frees the posts the receivers consumed (and their stage slots); returns how many to `peer`
 * (-1: any) are out. dev->lock held.
 */
static int reap_posts(struct run *r, int peer)
{
	int k = 0, out = 0;
	for (int i = 0; i < r->num_posts; i++) {
		struct inbox_entry *e = r->posts[i];
		if (e->done) {
			for (int j = 0; j < r->num_stage; j++)
				if (r->stage[j].local == e)
					r->stage[j].local = NULL;
			free(e);
			continue;
		}
		r->posts[k++] = e;
		out += peer < 0 || e->h.dst_ordinal == (uint32_t)peer;
	}
	r->num_posts = k;
	return out;
}

/* A free stage slot, or -1 when every one still holds a send. */
static int stage_slot(struct run *r)
{
	pthread_mutex_lock(&r->dev->lock);
	reap_posts(r, -1);
	pthread_mutex_unlock(&r->dev->lock);
	for (int j = 0; j < r->num_stage; j++) {
		struct stage_slot *x = &r->stage[j];
		if (x->ch != NULL && dp_chan_written(x->ch, x->ticket))
			x->ch = NULL;
		if (x->ch == NULL && x->local == NULL)
			return j;
	}
	return -1;
}

/*
 * Sends one chunk: `len` bytes at sequence position pos of layout l of buffer base, through a
 * stage slot when they are strided or `stage` says the collective overwrites them before the
 * peer has them; `covered` is what the chunk stands for. DP_BUSY: no room yet.
 */
static int post_chunk(struct run *r, int peer, uint32_t tag, int64_t pos, int64_t covered,
                      unsigned char *base, const Podemu__BlockLayout *l, int64_t len, bool stage,
                      struct status *st)
{
	struct dp_header h = {.step_id = r->s->id,
	                      .collective = r->coll,
	                      .src_ordinal = (uint32_t)r->c->ordinal,
	                      .dst_ordinal = (uint32_t)peer,
	                      .tag = tag,
	                      .offset = (uint64_t)pos,
	                      .length = (uint64_t)len,
	                      .covered = (uint64_t)covered};
	const unsigned char *data = NULL;
	int slot = -1;
	if (len > 0) {
		int64_t n;
		unsigned char *p = block_piece(base, l, pos, len, &n);
		if (n == len && !stage) {
			data = p;
		} else if (r->num_stage == 0 || len > r->stage_bytes) {
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "program: no room to stage a chunk of %lld bytes",
			                  (long long)len);
		} else if ((slot = stage_slot(r)) < 0) {
			return DP_BUSY;
		} else {
			seq_read(r->stage[slot].p, base, l, pos, len);
			data = r->stage[slot].p;
		}
	}
	if (!is_local(r, peer)) {
		struct dp_chan *ch = NULL;
		int rv = get_chan(r, peer, &ch, st);
		if (rv != ST_OK)
			return rv;
		struct dp_segment seg = {data, (size_t)len};
		uint64_t ticket = 0;
		rv = dp_chan_send(ch, &h, &seg, len > 0 ? 1 : 0, &ticket, st);
		if (rv == ST_OK && slot >= 0)
			r->stage[slot] = (struct stage_slot){r->stage[slot].p, NULL, ch, ticket};
		return peer_failed(r, host_of(r, peer), rv, st);
	}
	if (r->num_posts == r->cap_posts) {
		int cap = r->cap_posts ? r->cap_posts * 2 : 16;
		struct inbox_entry **p = realloc(r->posts, (size_t)cap * sizeof(*p));
		if (p == NULL)
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		r->posts = p;
		r->cap_posts = cap;
	}
	struct inbox_entry *e = calloc(1, sizeof(*e));
	if (e == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	e->h = h;
	e->payload = data;
	if (slot >= 0)
		r->stage[slot].local = e;
	pthread_mutex_lock(&r->dev->lock);
	int to = device_local(r->dev, peer);
	inbox_push(r->s, to, e);
	r->posts[r->num_posts++] = e;
	core_wake(&r->dev->cores[to]);
	pthread_mutex_unlock(&r->dev->lock);
	return ST_OK;
}

static bool can_post(struct run *r, int peer)
{
	if (!is_local(r, peer)) {
		struct dp_chan *ch = r->chans[host_of(r, peer)];
		return ch == NULL || dp_chan_in_flight(ch) < r->s->window;
	}
	pthread_mutex_lock(&r->dev->lock);
	int out = reap_posts(r, peer);
	pthread_mutex_unlock(&r->dev->lock);
	return out < r->s->window;
}

/* Takes the first queued chunk from src with tag (and, if below >= 0, ending at or below it). */
static struct inbox_entry *take_entry(struct run *r, int src, uint32_t tag, int64_t below)
{
	struct inbox_entry **pp = &r->s->inbox[r->c->local];
	for (; *pp != NULL; pp = &(*pp)->next) {
		struct inbox_entry *e = *pp;
		if (e->h.collective != r->coll || e->h.src_ordinal != (uint32_t)src ||
		    e->h.tag != tag)
			continue;
		if (below >= 0 && (int64_t)(e->h.offset + e->h.covered) > below)
			continue;
		*pp = e->next;
		return e;
	}
	return NULL;
}

/* Acknowledges a consumed chunk: to its agent, or to the local core that posted it. */
static void ack_entry(struct run *r, struct inbox_entry *e, int code, const char *why)
{
	if (e->req != NULL) {
		if (e->in_slot) { /* free before the acknowledgement lets its sender go on */
			pthread_mutex_lock(&r->dev->lock);
			receive_slot_put(r->dev, r->s, e->payload);
			pthread_mutex_unlock(&r->dev->lock);
		}
		dp_complete(e->req, code, why);
		free(e);
		return;
	}
	pthread_mutex_lock(&r->dev->lock);
	if (e->orphan) { /* its poster left the collective */
		free(e);
	} else {
		/* The core that posted it may post more, or end its phase or collective. */
		e->done = 1;
		sends_progressed(&r->dev->cores[device_local(r->dev, (int)e->h.src_ordinal)]);
	}
	pthread_mutex_unlock(&r->dev->lock);
}

/* Checks a chunk against what the phase expects to receive. */
static int check_chunk(const struct run *r, const struct inbox_entry *e, int64_t expect,
                       struct status *st)
{
	bool backed = r->dev->backed;
	if ((int64_t)e->h.offset < 0 || (int64_t)e->h.covered <= 0 ||
	    (int64_t)e->h.length > r->s->chunk_bytes ||
	    (int64_t)(e->h.offset + e->h.covered) > expect ||
	    (backed && e->h.length != e->h.covered) || (!backed && e->h.length != 0))
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "chunk [%llu, +%llu) with %llu bytes from core %u does not fit "
		                  "the %lld bytes core %d expects",
		                  (unsigned long long)e->h.offset, (unsigned long long)e->h.covered,
		                  (unsigned long long)e->h.length, e->h.src_ordinal,
		                  (long long)expect, r->c->ordinal);
	return ST_OK;
}

/* Waits until local cores took every chunk this core posted (a phase's `drain`). Lock held. */
static int drain_posts_locked(struct run *r, struct status *st)
{
	int rv = ST_OK;
	r->c->awaits_sends = true;
	while (rv == ST_OK && reap_posts(r, -1) > 0)
		if (r->s->cancel_code != ST_OK)
			rv = status_set(st, r->s->cancel_code, "%s", r->s->cancel_reason);
		else if (coll_wait(r) == ETIMEDOUT)
			rv = status_set(st, ST_DEADLINE_EXCEEDED,
			                "a local core did not take this core's data within %d ms",
			                r->s->timeout_ms);
	return rv;
}

static int drain_posts(struct run *r, struct status *st)
{
	pthread_mutex_lock(&r->dev->lock);
	int rv = drain_posts_locked(r, st);
	pthread_mutex_unlock(&r->dev->lock);
	return rv;
}

/* Applies one received chunk to the output as the phase says. */
static void consume(struct run *r, const Podemu__CollPhase *ph, const struct inbox_entry *e)
{
	if (!r->dev->backed || e->placed)
		return;
	int64_t pos = (int64_t)e->h.offset, len = (int64_t)e->h.length;
	if (ph->kind == PODEMU__PHASE_KIND__PHASE_COMBINE) {
		/*
		 * Input then received, straight into the output, run by run where both are
		 * contiguous (an output in the input's bytes has the same layout: each run is its
		 * own).
		 */
		const unsigned char *got = e->payload;
		for (int64_t at = 0; at < len;) {
			int64_t n_in, n_out;
			unsigned char *src =
			    block_piece(r->in, ph->combine_block, pos + at, len - at, &n_in);
			unsigned char *dst = block_piece(recv_base(r, ph), ph->recv_block, pos + at,
			                                 len - at, &n_out);
			int64_t n = n_in < n_out ? n_in : n_out;
			kernel_combine(r->dtype, r->red, dst, src, got + at, n);
			at += n;
		}
	} else if (ph->reduce) {
		seq_reduce(r->dtype, r->red, recv_base(r, ph), ph->recv_block, pos, e->payload,
		           len);
	} else {
		seq_write(recv_base(r, ph), ph->recv_block, pos, e->payload, len);
	}
}

/* One send/receive pair of a phase group, and how far it got. */
struct leg {
	int k;
	const Podemu__CollPhase *ph;
	uint32_t stag, rtag;
	int64_t send_len, recv_len, sent, recvd;
	unsigned char *send_base;
	bool post; /* its receive may be read into place */
};

/* Posts the leg's next chunks while the window allows; 1 when one was posted. */
static int leg_send(struct run *r, struct leg *g, int *rv, struct status *st)
{
	const Podemu__CollPhase *ph = g->ph;
	int64_t chunk = r->s->chunk_bytes;
	int progress = 0;
	while (*rv == ST_OK && g->sent < g->send_len && can_post(r, ph->send_peer)) {
		int64_t len = r->dev->backed
		                  ? (g->send_len - g->sent < chunk ? g->send_len - g->sent : chunk)
		                  : 0;
		int64_t covered = r->dev->backed ? len : g->send_len;
		*rv = post_chunk(r, ph->send_peer, g->stag, g->sent, covered, g->send_base,
		                 ph->send_block, len, ph->stage, st);
		if (*rv == DP_BUSY) {
			*rv = ST_OK;
			break;
		}
		g->sent += covered;
		progress = 1;
	}
	if (*rv == ST_OK && ph->send_peer >= 0 && !is_local(r, ph->send_peer) &&
	    r->chans[host_of(r, ph->send_peer)] != NULL)
		*rv = peer_failed(r, host_of(r, ph->send_peer),
		                  dp_chan_error(r->chans[host_of(r, ph->send_peer)], st), st);
	return progress;
}

/* Consumes the leg's chunks that arrived; 1 when one was. */
static int leg_receive(struct run *r, struct leg *g, int *rv, struct status *st)
{
	const Podemu__CollPhase *ph = g->ph;
	int progress = 0;
	while (*rv == ST_OK && g->recvd < g->recv_len) {
		pthread_mutex_lock(&r->dev->lock);
		struct inbox_entry *e =
		    take_entry(r, ph->recv_peer, g->rtag, ph->stage ? g->sent : -1);
		pthread_mutex_unlock(&r->dev->lock);
		if (e == NULL)
			break;
		*rv = check_chunk(r, e, g->recv_len, st);
		if (*rv == ST_OK)
			consume(r, ph, e);
		g->recvd += (int64_t)e->h.covered;
		ack_entry(r, e, *rv, st->message);
		progress = 1;
	}
	return progress;
}

static bool leg_done(const struct leg *g)
{
	return g->sent >= g->send_len && g->recvd >= g->recv_len;
}

static bool legs_done(const struct leg *legs, int count)
{
	for (int i = 0; i < count; i++)
		if (!leg_done(&legs[i]))
			return false;
	return true;
}

/*
 * One phase, or a group of phases that run at the same time (each but the last `with_next`):
 * post every send_block to its send_peer chunk by chunk while the window allows, and consume
 * chunks from every recv_peer as they come, until all are complete. With `stage`, a chunk is
 * only consumed once this core's own chunk at that position was posted (their regions
 * overlap). Phases that reduce into the output are consumed in their order, so that every run
 * sums in the same order (the result is the same, bit for bit, whoever arrives first).
 */
static int run_phases(struct run *r, int k0, int count, const Podemu__CollectiveSchedule *sched,
                      struct status *st)
{
	struct device *dev = r->dev;
	struct leg two[2], *legs = count <= 2 ? two : calloc((size_t)count, sizeof(*legs));
	if (legs == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	int rv = ST_OK;
	for (int i = 0; i < count; i++) {
		const Podemu__CollPhase *ph = sched->phases[k0 + i];
		struct leg *g = &legs[i];
		*g = (struct leg){.k = k0 + i, .ph = ph};
		g->send_len = ph->send_peer >= 0 ? layout_len(ph->send_block) : 0;
		g->recv_len = ph->recv_peer >= 0 ? layout_len(ph->recv_block) : 0;
		g->stag = g->send_len > 0 ? r->send_tags[ph->send_peer]++ : 0;
		g->rtag = g->recv_len > 0 ? r->recv_tags[ph->recv_peer]++ : 0;
		g->send_base = send_base(r, ph);
		if (rv == ST_OK && ph->drain)
			rv = drain_posts(r, st);
		/* Copied chunks from a peer agent may go straight into place as they are read. */
		g->post = r->receives != NULL && coll_placeable(r, ph);
		if (g->post)
			coll_open_post(r, g->k, ph, g->rtag);
	}
	while (rv == ST_OK && !legs_done(legs, count)) {
		bool sending = false;
		for (int i = 0; i < count; i++)
			sending |= legs[i].sent < legs[i].send_len;
		pthread_mutex_lock(&dev->lock);
		uint64_t gen = r->c->events;
		r->c->awaits_sends = sending; /* room for the next chunk, or a free stage slot */
		pthread_mutex_unlock(&dev->lock);
		int progress = 0;
		for (int i = 0; i < count && rv == ST_OK; i++)
			progress |= leg_send(r, &legs[i], &rv, st);
		bool summing = false; /* an earlier phase that reduces is still receiving */
		for (int i = 0; i < count && rv == ST_OK; i++) {
			bool reduces = legs[i].ph->reduce ||
			               legs[i].ph->kind == PODEMU__PHASE_KIND__PHASE_COMBINE;
			if (reduces && summing)
				continue;
			progress |= leg_receive(r, &legs[i], &rv, st);
			summing |= reduces && legs[i].recvd < legs[i].recv_len;
		}
		if (rv != ST_OK || progress || legs_done(legs, count))
			continue;
		pthread_mutex_lock(&dev->lock);
		int timed_out = 0;
		while (r->c->events == gen && !timed_out && r->s->cancel_code == ST_OK)
			timed_out = coll_wait(r) == ETIMEDOUT;
		if (r->s->cancel_code != ST_OK)
			rv = status_set(st, r->s->cancel_code, "%s", r->s->cancel_reason);
		pthread_mutex_unlock(&dev->lock);
		for (int i = 0; timed_out && rv == ST_OK && i < count; i++) {
			const struct leg *g = &legs[i];
			if (!leg_done(g))
				rv = status_set(
				    st, ST_DEADLINE_EXCEEDED,
				    "no progress within %d ms: received %lld of %lld bytes "
				    "from core %d, sent %lld of %lld bytes to core %d",
				    r->s->timeout_ms, (long long)g->recvd, (long long)g->recv_len,
				    g->ph->recv_peer, (long long)g->sent, (long long)g->send_len,
				    g->ph->send_peer);
		}
	}
	for (int i = 0; i < count; i++)
		if (legs[i].post)
			coll_close_post(r, legs[i].k, rv != ST_OK);
	/*
	 * Chunks not staged are written from the buffers themselves: a later phase may overwrite
	 * what this one sent only once the stream has it. Chunks without bytes need no wait.
	 */
	for (int i = 0; i < count && rv == ST_OK; i++) {
		const Podemu__CollPhase *ph = legs[i].ph;
		if (legs[i].send_len > 0 && dev->backed && !ph->stage &&
		    !is_local(r, ph->send_peer) && r->chans[host_of(r, ph->send_peer)] != NULL)
			rv =
			    peer_failed(r, host_of(r, ph->send_peer),
			                dp_chan_flush(r->chans[host_of(r, ph->send_peer)], st), st);
	}
	if (legs != two)
		free(legs);
	return rv;
}

/*
 * Ends a collective: waits until every chunk this core sent was consumed (local) or
 * acknowledged (remote), then closes the channels. After a failure, local posts that nobody
 * consumed are left to their receivers (or the step's end) to free.
 */
static int finish(struct run *r, int rv, struct status *st)
{
	struct device *dev = r->dev;
	pthread_mutex_lock(&dev->lock);
	if (rv == ST_OK)
		rv = drain_posts_locked(r, st);
	r->c->awaits_sends = true; /* for the acknowledgements below */
	reap_posts(r, -1);
	for (int i = 0; i < r->num_posts; i++)
		r->posts[i]->orphan = 1;
	r->num_posts = 0;
	/*
	 * Remote peers acknowledge what they consumed (each acknowledgement wakes this core). A
	 * peer that died is not waited for past an abort of the step or the deadline.
	 */
	while (rv == ST_OK) {
		int waiting = 0;
		for (int h = 0; r->chans != NULL && h < dev->num_hosts; h++)
			if (r->chans[h] != NULL && dp_chan_in_flight(r->chans[h]) > 0 &&
			    dp_chan_error(r->chans[h], NULL) == ST_OK)
				waiting = 1;
		if (!waiting)
			break;
		if (r->s->cancel_code != ST_OK)
			rv = status_set(st, r->s->cancel_code, "%s", r->s->cancel_reason);
		else if (coll_wait(r) == ETIMEDOUT)
			rv = status_set(st, ST_DEADLINE_EXCEEDED,
			                "a peer did not acknowledge this core's data within %d ms",
			                r->s->timeout_ms);
	}
	pthread_mutex_unlock(&dev->lock);
	for (int h = 0; r->chans != NULL && h < dev->num_hosts; h++) {
		if (r->chans[h] == NULL)
			continue;
		if (rv != ST_OK)
			dp_chan_abort(r->chans[h]);
		dp_chan_wait(r->chans[h], 0);

		if (rv == ST_OK)
			rv = peer_failed(r, h, dp_chan_error(r->chans[h], st), st);
		dp_chan_close(r->chans[h]);
		r->chans[h] = NULL;
	}
	return rv;
}

static void local_phase(struct run *r, const Podemu__CollPhase *ph)
{
	if (!r->dev->backed)
		return;
	const Podemu__BlockLayout *dst = ph->recv_block;
	int64_t len = layout_len(dst);
	if (ph->kind == PODEMU__PHASE_KIND__PHASE_ZERO) {
		for (int64_t pos = 0; pos < len;) {
			int64_t n;
			unsigned char *p = block_piece(recv_base(r, ph), dst, pos, len - pos, &n);
			memset(p, 0, (size_t)n);
			pos += n;
		}
		return;
	}
	unsigned char *src = send_base(r, ph);
	for (int64_t pos = 0; pos < len;) {
		int64_t n;
		unsigned char *p = block_piece(src, ph->send_block, pos, len - pos, &n);
		seq_write(recv_base(r, ph), dst, pos, p, n);
		pos += n;
	}
}

static void apply_scale(struct run *r, const struct shape *s, double scale)
{
	if (!r->dev->backed || scale == 0 || scale == 1)
		return;
	int64_t n = shape_elements(s);
	if (s->dtype == DT_F32) {
		float *o = (float *)r->out;
		for (int64_t i = 0; i < n; i++)
			o[i] = (float)(o[i] * scale);
	} else if (s->dtype == DT_BF16) {
		uint16_t *o = (uint16_t *)r->out;
		for (int64_t i = 0; i < n; i++)
			o[i] = dtype_f32_to_bf16((float)(dtype_bf16_to_f32(o[i]) * scale));
	}
}

int coll_run(struct device *dev, struct step *s, struct core *c, int node, void *scratch,
             int64_t scratch_bytes, struct status *st)
{
	const Podemu__CollectiveSchedule *sched = s->sched[c->local][node];
	const Podemu__Node *n = s->node_of[node];
	if (sched == NULL)
		return status_set(st, ST_INVALID_ARGUMENT, "%s (node %d): no schedule for core %d",
		                  n->opcode, node, c->ordinal);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	struct run r = {.dev = dev,
	                .s = s,
	                .c = c,
	                .coll = c->collectives_run++,
	                .in = core_ptr(c, s, step_operand(s, node, 0)),
	                .out = core_ptr(c, s, node),
	                .dtype = s->shapes[node].dtype,
	                .red = reducer_parse(n->reducer)};
	r.deadline = clock_deadline_ms(s->timeout_ms);

	r.send_tags = calloc((size_t)dev->world_size, sizeof(uint32_t));
	r.recv_tags = calloc((size_t)dev->world_size, sizeof(uint32_t));
	r.chans = calloc((size_t)dev->num_hosts, sizeof(*r.chans));
	/* It works through the workspace the plan reserved for it: stage slots, then work area. */
	struct coll_workspace w =
	    lower_node_workspace(n, sched->group_size, &s->shapes[step_operand(s, node, 0)],
	                         &s->shapes[node], s->chunk_bytes, s->window, sched->algorithm);
	int64_t need = w.staging + w.work;
	if (dev->backed && w.staging > 0) {
		r.num_stage = (int)(w.staging / w.slot);
		r.stage_bytes = w.slot;
		r.stage = calloc((size_t)r.num_stage, sizeof(*r.stage));
	}
	int rv = ST_OK;
	if (!r.send_tags || !r.recv_tags || !r.chans || (r.num_stage > 0 && !r.stage))
		rv = status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	else if (dev->backed && need > 0 && (scratch == NULL || scratch_bytes < need))
		rv =
		    status_set(st, ST_INVALID_ARGUMENT,
		               "program: the plan reserves %lld bytes of collective workspace, not "
		               "the %lld it works through",
		               (long long)(scratch ? scratch_bytes : 0), (long long)need);
	for (int j = 0; rv == ST_OK && j < r.num_stage; j++)
		r.stage[j].p = (unsigned char *)scratch + (int64_t)j * w.slot;
	if (rv == ST_OK && dev->backed && w.work > 0)
		r.work = (unsigned char *)scratch + w.staging;
	for (size_t k = 0; rv == ST_OK && dev->backed && r.work == NULL && k < sched->n_phases; k++)
		if (sched->phases[k]->recv_work ||
		    sched->phases[k]->send_buffer == PODEMU__COLL_BUFFER__COLL_WORK)
			rv = status_set(st, ST_INVALID_ARGUMENT,
			                "program: %s needs a work area the plan does not reserve",
			                sched->algorithm);
	for (size_t k = 0; k < sched->n_phases && !r.remote; k++) {
		const Podemu__CollPhase *ph = sched->phases[k];
		r.remote = (ph->send_peer >= 0 && !is_local(&r, ph->send_peer)) ||
		           (ph->recv_peer >= 0 && !is_local(&r, ph->recv_peer));
	}
	/* Without it, every chunk from a peer agent is copied by this core. */
	r.receives = calloc(sched->n_phases + 1, sizeof(*r.receives));
	if (rv == ST_OK && r.receives != NULL)
		coll_open_early_posts(&r, sched);
	for (size_t k = 0; k < sched->n_phases && rv == ST_OK; k++) {
		const Podemu__CollPhase *ph = sched->phases[k];
		if (ph->kind == PODEMU__PHASE_KIND__PHASE_COPY ||
		    ph->kind == PODEMU__PHASE_KIND__PHASE_ZERO) {
			local_phase(&r, ph);
			continue;
		}
		/* Exchanges at once (a bidirectional ring's directions, a direct algorithm's
		 * peers). */
		int count = 1;
		while (sched->phases[k + (size_t)count - 1]->with_next &&
		       k + (size_t)count < sched->n_phases &&
		       sched->phases[k + (size_t)count]->kind != PODEMU__PHASE_KIND__PHASE_COPY &&
		       sched->phases[k + (size_t)count]->kind != PODEMU__PHASE_KIND__PHASE_ZERO)
			count++;
		rv = run_phases(&r, (int)k, count, sched, st);
		k += (size_t)count - 1;
	}
	/* Receives of phases a failure skipped: nothing may still be read into them. */
	for (size_t k = 0; r.receives != NULL && k < sched->n_phases; k++)
		if (r.receives[k].open)
			coll_close_post(&r, (int)k, rv != ST_OK);
	if (r.receives != NULL) {
		pthread_mutex_lock(&dev->lock);
		s->posts[c->local] = (struct recv_posts){NULL, 0};
		pthread_mutex_unlock(&dev->lock);
	}
	rv = finish(&r, rv, st);
	/* Its host's other cores may wait for reads while this one computes. */
	if (dev->cores_per_host > 1)
		core_release_dp(dev, c);
	if (rv == ST_OK && opcode_parse(n->opcode) == OP_ALL_REDUCE)
		apply_scale(&r, &s->shapes[node], n->scale);
	free(r.send_tags);
	free(r.recv_tags);
	free(r.chans);
	free(r.stage);
	free(r.posts);
	free(r.receives);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	size_t at = (size_t)c->local * (size_t)s->num_colls + (size_t)s->coll_of_node[node];
	int64_t started = (int64_t)t0.tv_sec * 1000000 + t0.tv_nsec / 1000;
	s->ended_micros[at] = (int64_t)t1.tv_sec * 1000000 + t1.tv_nsec / 1000;
	s->micros[at] += s->ended_micros[at] - started;
	if (s->started_micros[at] == 0)
		s->started_micros[at] = started;
	if (rv != ST_OK)
		status_set(st, rv, "%s (node %d, %s) on core %d: %s", n->opcode,
		           step_source_node(s, node), sched->algorithm, c->ordinal, st->message);
	return rv;
}
