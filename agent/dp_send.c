/* The data plane's sending side: one stream per peer agent, shared by channels. */
#include "dp_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "tls.h"

/* ---- The sending side: one stream per peer agent, shared by channels ---- */

struct dp_peer {
	struct dataplane *dp;
	struct dp_peer *next;
	char url[256];
	int refs; /* under dp->lock: the peer list's and each channel's */
	struct dp_stream ds;
	struct dp_writer w;
	struct dp_reader r;
	struct dp_ack ack;
	char ack_message[DP_MESSAGE_MAX + 1];
	bool reading_message;
	pthread_mutex_t lock; /* the channels and the failure */
	struct dp_chan **chans;
	int num_chans, cap_chans;
	uint32_t next_chan;
	bool failed;
	bool closing; /* the receiver said it closes: no new channel takes this stream */
	char why[512];
};

struct dp_slot {
	struct dp_frame frame; /* first: frames are found back as slots */
	struct dp_chan *ch;
	struct dp_header h;
	uint64_t seq; /* which send of the channel it carries */
	bool busy, writing, awaiting;
};

struct dp_chan {
	struct dp_peer *peer;
	uint32_t id;
	pthread_mutex_t lock;
	pthread_cond_t cv;
	void (*notify)(void *);
	void *notify_arg;
	int window;
	int in_flight;
	uint64_t sent; /* sends so far: the last one's number */
	int timeout_ms;
	bool aborted;
	int code;
	char message[512];
	struct dp_slot *slots;
};

static void chan_fail_locked(struct dp_chan *ch, int code, const char *message)
{
	if (ch->code == ST_OK) {
		ch->code = code;
		snprintf(ch->message, sizeof(ch->message), "%s", message);
	}
}

/* Frees a slot once it is written and acknowledged (or given up); ch->lock held. */
static void slot_settle_locked(struct dp_chan *ch, struct dp_slot *s)
{
	if (s->busy && !s->writing && !s->awaiting) {
		s->busy = false;
		ch->in_flight--;
		pthread_cond_broadcast(&ch->cv);
	}
}

/* The peer's stream broke: every channel on it fails and nothing more is awaited. */
static void peer_fail(struct dp_peer *p, int code, const char *why)
{
	pthread_mutex_lock(&p->lock);
	if (p->failed) {
		pthread_mutex_unlock(&p->lock);
		return;
	}
	p->failed = true;
	snprintf(p->why, sizeof(p->why), "%s", why);
	/* Each channel's waiter (a core) is told, once the locks are let go. */
	struct waiter {
		void (*notify)(void *);
		void *arg;
	} *waiters = calloc((size_t)p->num_chans + 1, sizeof(*waiters));
	int n = 0;
	for (int i = 0; i < p->num_chans; i++) {
		struct dp_chan *ch = p->chans[i];
		pthread_mutex_lock(&ch->lock);
		chan_fail_locked(ch, code, why);
		for (int k = 0; k < ch->window; k++) {
			ch->slots[k].awaiting = false;
			slot_settle_locked(ch, &ch->slots[k]);
		}
		pthread_cond_broadcast(&ch->cv);
		if (ch->notify != NULL && waiters != NULL)
			waiters[n++] = (struct waiter){ch->notify, ch->notify_arg};
		pthread_mutex_unlock(&ch->lock);
	}
	pthread_mutex_unlock(&p->lock);
	ds_close(&p->ds); /* queued frames fail and settle their slots */
	for (int i = 0; i < n; i++)
		waiters[i].notify(waiters[i].arg);
	free(waiters);
}

static void slot_written(struct dp_frame *f, int rv)
{
	struct dp_slot *s = (struct dp_slot *)f;
	struct dp_chan *ch = s->ch;
	struct dp_peer *p = ch->peer;
	if (rv != 0) {
		char why[512];
		snprintf(why, sizeof(why), "cannot send to peer %s: %s", p->url, nng_strerror(rv));
		peer_fail(p, ST_UNAVAILABLE, why);
	}
	pthread_mutex_lock(&ch->lock);
	s->writing = false;
	if (rv != 0)
		s->awaiting = false;
	slot_settle_locked(ch, s);
	pthread_cond_broadcast(&ch->cv); /* dp_chan_flush */
	void (*notify)(void *) = ch->notify;
	void *notify_arg = ch->notify_arg;
	pthread_mutex_unlock(&ch->lock);
	if (notify != NULL)
		notify(notify_arg);
}

static void peer_acked(struct dp_peer *p)
{
	const struct dp_ack *a = &p->ack;
	void (*notify)(void *) = NULL;
	void *notify_arg = NULL;
	pthread_mutex_lock(&p->lock);
	for (int i = 0; i < p->num_chans; i++) {
		struct dp_chan *ch = p->chans[i];
		if (ch->id != a->chan)
			continue;
		pthread_mutex_lock(&ch->lock);
		if (a->slot < (uint32_t)ch->window && ch->slots[a->slot].awaiting) {
			struct dp_slot *s = &ch->slots[a->slot];
			s->awaiting = false;
			if (a->code != ST_OK) {
				char why[600];
				snprintf(why, sizeof(why), "peer %s: %s", p->url, p->ack_message);
				chan_fail_locked(ch, a->code, why);
			}
			slot_settle_locked(ch, s);
		}
		notify = ch->notify;
		notify_arg = ch->notify_arg;
		pthread_mutex_unlock(&ch->lock);
		break;
	}
	pthread_mutex_unlock(&p->lock);
	if (notify != NULL)
		notify(notify_arg);
}

/*
 * Goes on from a complete read of an acknowledgement's header or message: 1 when the read it
 * started next completed at once, 0 when the callback goes on (or the peer failed).
 */
static int peer_next(struct dp_peer *p)
{
	if (!p->reading_message) {
		if (p->ack.magic != DP_ACK_MAGIC || p->ack.len > DP_MESSAGE_MAX) {
			peer_fail(p, ST_INTERNAL, "malformed data-plane acknowledgement");
			return 0;
		}
		if (p->ack.len > 0) {
			p->reading_message = true;
			return reader_read(&p->r, p->ack_message, p->ack.len);
		}
	}
	p->ack_message[p->ack.len] = '\0';
	p->reading_message = false;
	bool closing = (p->ack.flags & DP_ACK_CLOSING) != 0;
	if (closing) {
		/* Before the channel learns why: a new channel must dial afresh. */
		pthread_mutex_lock(&p->lock);
		p->closing = true;
		pthread_mutex_unlock(&p->lock);
	}
	peer_acked(p);
	if (closing) {
		char why[600];
		snprintf(why, sizeof(why), "peer %s closed the connection: %s", p->url,
		         p->ack_message);
		peer_fail(p, ST_UNAVAILABLE, why);
		return 0;
	}
	return reader_read(&p->r, &p->ack, sizeof(p->ack));
}

static void peer_read_cb(void *arg)
{
	struct dp_peer *p = arg;
	int err = 0;
	int rv = reader_step(&p->r, &err);
	if (rv < 0) {
		char why[512];
		snprintf(why, sizeof(why), "peer %s closed the data-plane connection: %s", p->url,
		         nng_strerror(err));
		peer_fail(p, ST_UNAVAILABLE, why);
		return;
	}
	while (rv == 1)
		rv = peer_next(p);
}

/* Never from the peer's own callbacks. */
static void peer_free(struct dp_peer *p)
{
	struct dataplane *dp = p->dp;
	link_fini(&p->ds, &p->w, &p->r);
	pthread_mutex_destroy(&p->lock);
	free(p->chans);
	free(p);
	dp_unref(dp, 1);
}

static void peer_unref(struct dp_peer *p)
{
	struct dataplane *dp = p->dp;
	pthread_mutex_lock(&dp->lock);
	bool last = --p->refs == 0;
	pthread_mutex_unlock(&dp->lock);
	if (last)
		peer_free(p);
}

/* A dial under way: dial_start begins it, dial_finish waits and makes the peer. */
struct dial {
	nng_stream_dialer *d;
	nng_aio *aio;
};

static int dial_start(struct dial *x, const char *url, int timeout_ms, struct status *st)
{
	int rv = tls_stream_dialer_create(&x->d, url, st);
	if (rv != ST_OK)
		return rv;
	if (nng_aio_alloc(&x->aio, NULL, NULL) != 0) {
		nng_stream_dialer_free(x->d);
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	}
	nng_aio_set_timeout(x->aio, timeout_ms);
	nng_stream_dialer_dial(x->d, x->aio);
	return ST_OK;
}

static int dial_finish(struct dial *x, struct dataplane *dp, const char *url, struct dp_peer **out,
                       struct status *st)
{
	nng_aio_wait(x->aio);
	int nrv = nng_aio_result(x->aio);
	nng_stream *s = nrv == 0 ? nng_aio_get_output(x->aio, 0) : NULL;
	nng_aio_free(x->aio);
	nng_stream_dialer_free(x->d);
	if (nrv != 0)
		return status_set(st, nrv == NNG_ETIMEDOUT ? ST_DEADLINE_EXCEEDED : ST_UNAVAILABLE,
		                  "cannot connect to peer %s: %s", url, nng_strerror(nrv));
	struct dp_peer *p = calloc(1, sizeof(*p));
	if (p == NULL || link_init(&p->ds, &p->w, &p->r, s, peer_read_cb, p) != 0) {
		free(p);
		nng_stream_free(s);
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	}
	p->dp = dp;
	snprintf(p->url, sizeof(p->url), "%s", url);
	if (strncmp(url, "tcp://", 6) == 0)
		link_use_socket(&p->w, &p->r, s, dp->reactor);
	pthread_mutex_init(&p->lock, NULL);
	/* Nothing was sent yet, so no acknowledgement is there: this read waits. */
	(void)reader_read(&p->r, &p->ack, sizeof(p->ack));
	*out = p;
	return ST_OK;
}

/* Puts a new peer on dp's list with refs references (the list's among them). */
static int peer_add(struct dataplane *dp, struct dp_peer *p, int refs, struct status *st)
{
	pthread_mutex_lock(&dp->lock);
	dp->refs++;
	if (dp->stopping) {
		pthread_mutex_unlock(&dp->lock);
		p->refs = 1;
		peer_unref(p);
		return status_set(st, ST_UNAVAILABLE, "the data plane of this agent stopped");
	}
	p->refs = refs;
	p->next = dp->peers;
	dp->peers = p;
	pthread_mutex_unlock(&dp->lock);
	return ST_OK;
}

static bool peer_listed(struct dataplane *dp, const char *url)
{
	bool found = false;
	pthread_mutex_lock(&dp->lock);
	for (struct dp_peer *p = dp->peers; p != NULL && !found; p = p->next) {
		pthread_mutex_lock(&p->lock);
		found = !p->failed && !p->closing && strcmp(p->url, url) == 0;
		pthread_mutex_unlock(&p->lock);
	}
	pthread_mutex_unlock(&dp->lock);
	return found;
}

void dp_connect(struct dataplane *dp, const char *const *urls, int n, int timeout_ms)
{
	struct dial *dials = calloc((size_t)n + 1, sizeof(*dials));
	bool *started = calloc((size_t)n + 1, sizeof(*started));
	struct status st;
	for (int i = 0; dials != NULL && started != NULL && i < n; i++)
		started[i] = !peer_listed(dp, urls[i]) &&
		             dial_start(&dials[i], urls[i], timeout_ms, &st) == ST_OK;
	for (int i = 0; dials != NULL && started != NULL && i < n; i++) {
		struct dp_peer *p;
		if (started[i] && dial_finish(&dials[i], dp, urls[i], &p, &st) == ST_OK)
			peer_add(dp, p, 1, &st);
	}
	free(started);
	free(dials);
}

/* The live stream to url (dialled on first use, and again after it broke), referenced. */
static int peer_get(struct dataplane *dp, const char *url, int timeout_ms, struct dp_peer **out,
                    struct status *st)
{
	struct dp_peer *dead = NULL, *found = NULL;
	reap_conns(dp);
	pthread_mutex_lock(&dp->lock);
	if (dp->stopping) {
		pthread_mutex_unlock(&dp->lock);
		return status_set(st, ST_UNAVAILABLE, "the data plane of this agent stopped");
	}
	for (struct dp_peer **pp = &dp->peers; *pp != NULL;) {
		struct dp_peer *p = *pp;
		pthread_mutex_lock(&p->lock);
		bool failed = p->failed || p->closing;
		pthread_mutex_unlock(&p->lock);
		if (failed) {
			*pp = p->next;
			p->next = dead;
			dead = p;
			continue;
		}
		if (found == NULL && strcmp(p->url, url) == 0) {
			found = p;
			p->refs++;
		}
		pp = &p->next;
	}
	pthread_mutex_unlock(&dp->lock);
	while (dead != NULL) {
		struct dp_peer *next = dead->next;
		peer_unref(dead);
		dead = next;
	}
	if (found != NULL) {
		*out = found;
		return ST_OK;
	}
	struct dp_peer *p = NULL;
	struct dial x;
	int rv = dial_start(&x, url, timeout_ms, st);
	if (rv == ST_OK)
		rv = dial_finish(&x, dp, url, &p, st);
	if (rv == ST_OK)
		rv = peer_add(dp, p, 2, st); /* the list's and the caller's */
	if (rv != ST_OK)
		return rv;
	*out = p;
	return ST_OK;
}

int dp_chan_open(struct dp_chan **out, struct dataplane *dp, const char *url, int window,
                 int timeout_ms, void (*notify)(void *), void *arg, struct status *st)
{
	if (window < 1)
		window = 1;
	struct dp_chan *ch = calloc(1, sizeof(*ch));
	if (ch == NULL || (ch->slots = calloc((size_t)window, sizeof(*ch->slots))) == NULL) {
		free(ch);
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	}
	struct dp_peer *p = NULL;
	int rv = peer_get(dp, url, timeout_ms, &p, st);
	if (rv != ST_OK) {
		free(ch->slots);
		free(ch);
		return rv;
	}
	pthread_mutex_init(&ch->lock, NULL);
	pthread_cond_init(&ch->cv, NULL);
	ch->peer = p;
	ch->notify = notify;
	ch->notify_arg = arg;
	ch->window = window;
	ch->timeout_ms = timeout_ms;
	for (int i = 0; i < window; i++) {
		ch->slots[i].ch = ch;
		ch->slots[i].frame.done = slot_written;
	}
	pthread_mutex_lock(&p->lock);
	if (p->num_chans == p->cap_chans) {
		int cap = p->cap_chans ? p->cap_chans * 2 : 8;
		struct dp_chan **list = realloc(p->chans, (size_t)cap * sizeof(*list));
		if (list == NULL) {
			pthread_mutex_unlock(&p->lock);
			dp_chan_close(ch);
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		}
		p->chans = list;
		p->cap_chans = cap;
	}
	ch->id = ++p->next_chan;
	p->chans[p->num_chans++] = ch;
	if (p->failed)
		chan_fail_locked(ch, ST_UNAVAILABLE, p->why);
	pthread_mutex_unlock(&p->lock);
	*out = ch;
	return ST_OK;
}

int dp_chan_send(struct dp_chan *ch, const struct dp_header *h, const struct dp_segment *segs,
                 int n, uint64_t *ticket, struct status *st)
{
	if (n < 0 || n > 3)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "a chunk is gathered from 0 to 3 pieces");
	size_t len = 0;
	for (int i = 0; i < n; i++)
		len += segs[i].len;
	if (len > DP_MAX_CHUNK)
		return status_set(st, ST_INVALID_ARGUMENT, "a chunk of %zu bytes exceeds %u", len,
		                  DP_MAX_CHUNK);
	pthread_mutex_lock(&ch->lock);
	if (ch->code == ST_OK && ch->aborted)
		chan_fail_locked(ch, ST_ABORTED, "the channel was aborted");
	if (ch->code != ST_OK) {
		int code = status_set(st, ch->code, "%s", ch->message);
		pthread_mutex_unlock(&ch->lock);
		return code;
	}
	int index = 0;
	while (index < ch->window && ch->slots[index].busy)
		index++;
	if (index == ch->window) {
		pthread_mutex_unlock(&ch->lock);
		return DP_BUSY;
	}
	struct dp_slot *s = &ch->slots[index];
	s->busy = s->writing = s->awaiting = true;
	s->seq = ++ch->sent;
	if (ticket != NULL)
		*ticket = s->seq;
	ch->in_flight++;
	pthread_mutex_unlock(&ch->lock);

	s->h = *h;
	s->h.magic = DP_MAGIC;
	s->h.length = len;
	s->h.chan = ch->id;
	s->h.slot = (uint32_t)index;
	memset(s->h.token, 0, sizeof(s->h.token));
	memcpy(s->h.token, ch->peer->dp->token, strlen(ch->peer->dp->token));
	s->frame.iov[0] = (nng_iov){&s->h, sizeof(s->h)};
	s->frame.niov = 1;
	for (int i = 0; i < n; i++)
		if (segs[i].len > 0)
			s->frame.iov[s->frame.niov++] =
			    (nng_iov){(void *)segs[i].data, segs[i].len};
	writer_enqueue(&ch->peer->w, &s->frame);
	return ST_OK;
}

bool dp_chan_written(struct dp_chan *ch, uint64_t ticket)
{
	bool written = true;
	pthread_mutex_lock(&ch->lock);
	for (int i = 0; i < ch->window && written; i++)
		written =
		    !(ch->slots[i].busy && ch->slots[i].writing && ch->slots[i].seq == ticket);
	pthread_mutex_unlock(&ch->lock);
	return written;
}

void dp_chan_wait(struct dp_chan *ch, int max_in_flight)
{
	pthread_mutex_lock(&ch->lock);
	struct timespec deadline = clock_deadline_ms(ch->timeout_ms);
	int before = ch->in_flight;
	while (ch->in_flight > max_in_flight && ch->code == ST_OK) {
		if (pthread_cond_timedwait(&ch->cv, &ch->lock, &deadline) != ETIMEDOUT)
			continue;
		if (ch->in_flight < before) { /* progress: a new deadline */
			before = ch->in_flight;
			deadline = clock_deadline_ms(ch->timeout_ms);
			continue;
		}
		char why[512];
		snprintf(why, sizeof(why), "peer %s did not acknowledge a chunk within %d ms",
		         ch->peer->url, ch->timeout_ms);
		chan_fail_locked(ch, ST_DEADLINE_EXCEEDED, why);
	}
	pthread_mutex_unlock(&ch->lock);
}

/* The channel's failure into st, if any; its code. ch->lock held. */
static int chan_status_locked(const struct dp_chan *ch, struct status *st)
{
	if (ch->code != ST_OK)
		status_set(st, ch->code, "%s", ch->message);
	return ch->code;
}

int dp_chan_flush(struct dp_chan *ch, struct status *st)
{
	pthread_mutex_lock(&ch->lock);
	struct timespec deadline = clock_deadline_ms(ch->timeout_ms);
	for (;;) {
		bool writing = false;
		for (int i = 0; i < ch->window; i++)
			writing |= ch->slots[i].writing;
		if (!writing || ch->code != ST_OK)
			break;
		if (pthread_cond_timedwait(&ch->cv, &ch->lock, &deadline) == ETIMEDOUT) {
			char why[512];
			snprintf(why, sizeof(why), "peer %s did not take a chunk within %d ms",
			         ch->peer->url, ch->timeout_ms);
			chan_fail_locked(ch, ST_DEADLINE_EXCEEDED, why);
		}
	}
	int code = chan_status_locked(ch, st);
	pthread_mutex_unlock(&ch->lock);
	return code;
}

int dp_chan_in_flight(struct dp_chan *ch)
{
	pthread_mutex_lock(&ch->lock);
	int n = ch->in_flight;
	pthread_mutex_unlock(&ch->lock);
	return n;
}

int dp_chan_error(struct dp_chan *ch, struct status *st)
{
	pthread_mutex_lock(&ch->lock);
	int code = chan_status_locked(ch, st);
	pthread_mutex_unlock(&ch->lock);
	return code;
}

void dp_chan_abort(struct dp_chan *ch)
{
	pthread_mutex_lock(&ch->lock);
	ch->aborted = true;
	bool writing = false;
	for (int i = 0; i < ch->window; i++) {
		ch->slots[i].awaiting = false;
		slot_settle_locked(ch, &ch->slots[i]);
		writing |= ch->slots[i].writing;
	}
	pthread_mutex_unlock(&ch->lock);
	/*
	 * A chunk half written cannot be taken back, and a stopped peer would never take the
	 * rest: the stream goes (the next channel dials a new one).
	 */
	if (writing)
		peer_fail(ch->peer, ST_ABORTED, "a collective using this connection was aborted");
}

/* Gives up acknowledgements; chunks still being written get the timeout, then the stream goes. */
static void chan_release(struct dp_chan *ch)
{
	pthread_mutex_lock(&ch->lock);
	struct timespec deadline = clock_deadline_ms(ch->timeout_ms);
	bool timed_out = false;
	while (ch->in_flight > 0) {
		for (int i = 0; i < ch->window; i++) {
			ch->slots[i].awaiting = false;
			slot_settle_locked(ch, &ch->slots[i]);
		}
		if (ch->in_flight == 0)
			break;
		if (timed_out) {
			pthread_cond_wait(&ch->cv, &ch->lock);
		} else if (pthread_cond_timedwait(&ch->cv, &ch->lock, &deadline) == ETIMEDOUT) {
			timed_out = true;
			pthread_mutex_unlock(&ch->lock);
			peer_fail(ch->peer, ST_DEADLINE_EXCEEDED, "a chunk could not be written");
			pthread_mutex_lock(&ch->lock);
		}
	}
	pthread_mutex_unlock(&ch->lock);
}

void dp_chan_close(struct dp_chan *ch)
{
	if (ch == NULL)
		return;
	struct dp_peer *p = ch->peer;
	pthread_mutex_lock(&p->lock);
	for (int i = 0; i < p->num_chans; i++)
		if (p->chans[i] == ch) {
			p->chans[i] = p->chans[--p->num_chans];
			break;
		}
	pthread_mutex_unlock(&p->lock);
	pthread_mutex_lock(&ch->lock);
	ch->notify = NULL;
	pthread_mutex_unlock(&ch->lock);
	chan_release(ch);
	free(ch->slots);
	pthread_cond_destroy(&ch->cv);
	pthread_mutex_destroy(&ch->lock);
	peer_unref(p);
	free(ch);
}

void peers_stop(struct dp_peer *peers)
{
	while (peers != NULL) {
		struct dp_peer *next = peers->next;
		peer_fail(peers, ST_UNAVAILABLE, "the data plane stopped");
		peer_unref(peers);
		peers = next;
	}
}

int dp_send(struct dataplane *dp, const char *const *peer_urls, int num_peers,
            const struct dp_header *base, const void *data, uint64_t total, uint64_t chunk_bytes,
            int window, int timeout_ms, struct status *st)
{
	status_clear(st);
	if (chunk_bytes == 0 || chunk_bytes > DP_MAX_CHUNK)
		chunk_bytes = DP_MAX_CHUNK;
	uint64_t chunks = data == NULL || total == 0 ? 1 : (total + chunk_bytes - 1) / chunk_bytes;
	struct dp_chan **chans = calloc((size_t)num_peers + 1, sizeof(*chans));
	if (chans == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	int rv = ST_OK;
	for (int p = 0; p < num_peers && rv == ST_OK; p++)
		rv = dp_chan_open(&chans[p], dp, peer_urls[p], window, timeout_ms, NULL, NULL, st);
	for (uint64_t c = 0; c < chunks && rv == ST_OK; c++) {
		uint64_t off = c * chunk_bytes;
		uint64_t len =
		    data == NULL ? 0 : (total - off < chunk_bytes ? total - off : chunk_bytes);
		struct dp_header h = *base;
		h.offset = off;
		h.covered = data == NULL ? total : len;
		h.flags = c + 1 == chunks ? DP_FLAG_LAST : 0;
		struct dp_segment seg = {(const char *)data + (data ? off : 0), (size_t)len};
		for (int p = 0; p < num_peers && rv == ST_OK; p++)
			while ((rv = dp_chan_send(chans[p], &h, &seg, len ? 1 : 0, false, st)) ==
			       DP_BUSY)
				dp_chan_wait(chans[p], chans[p]->window - 1);
	}
	for (int p = 0; p < num_peers; p++) {
		if (chans[p] == NULL)
			continue;
		dp_chan_wait(chans[p], 0);
		if (rv == ST_OK)
			rv = dp_chan_error(chans[p], st);
		dp_chan_close(chans[p]);
	}
	free(chans);
	return rv;
}
