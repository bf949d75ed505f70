/* The data plane: its life (start, shutdown, stop) and the receiving side. */
#include "dp_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "tls.h"
#include "token.h"

/* ---- The receiving side: one connection per dialling peer ---- */

struct dp_conn {
	struct dataplane *dp;
	struct dp_conn *next;
	struct dp_stream ds;
	struct dp_writer w;
	struct dp_reader r;
	int refs;     /* under dp->lock: the reader while it runs, each request, a closing ack */
	bool reading; /* the reader holds its reference */
	struct dp_header h;
	struct dp_request *req; /* the chunk whose payload is being read */
	uint64_t discard;       /* payload bytes of a refused chunk still to skip */
	nng_aio *resume;        /* dp_resume's work, on an nng thread */
	int resume_code;
	char resume_message[DP_MESSAGE_MAX];
	int held;            /* under dp->lock: chunks read and not yet acknowledged */
	uint64_t held_bytes; /* and their payload bytes */
	char *junk;          /* where they go */
};

struct dp_request {
	struct dp_conn *conn;
	struct dp_header header;
	void *payload; /* buf, or the place the receiver gave */
	void *buf;
	size_t cap;
};

struct ack_frame {
	struct dp_frame f;
	struct dp_conn *closing; /* the stream to close once this is written */
	struct dp_ack a;
	char message[DP_MESSAGE_MAX];
};

static void *pool_get(struct dataplane *dp, size_t len, size_t *cap)
{
	pthread_mutex_lock(&dp->lock);
	int best = -1;
	for (int i = 0; i < dp->pool_n; i++)
		if (dp->pool[i].cap >= len && (best < 0 || dp->pool[i].cap < dp->pool[best].cap))
			best = i;
	if (best >= 0) {
		void *p = dp->pool[best].p;
		*cap = dp->pool[best].cap;
		dp->pool[best] = dp->pool[--dp->pool_n];
		pthread_mutex_unlock(&dp->lock);
		return p;
	}
	pthread_mutex_unlock(&dp->lock);
	*cap = len;
	return malloc(len);
}

/* Lock held. */
static void pool_put_locked(struct dataplane *dp, void *p, size_t cap)
{
	if (p == NULL)
		return;
	size_t kept = 0;
	for (int i = 0; i < dp->pool_n; i++)
		kept += dp->pool[i].cap;
	if (cap > DP_POOL_KEEP_BYTES || kept + cap > DP_POOL_KEEP_BYTES) {
		free(p);
		return;
	}
	if (dp->pool_n < DP_POOL_KEEP && !dp->stopping) {
		dp->pool[dp->pool_n++] = (struct pool_buf){p, cap};
		return;
	}
	/* Full: keep the larger buffers, which chunks of any size fit. */
	int smallest = -1;
	for (int i = 0; i < dp->pool_n; i++)
		if (dp->pool[i].cap < cap &&
		    (smallest < 0 || dp->pool[i].cap < dp->pool[smallest].cap))
			smallest = i;
	if (smallest >= 0) {
		free(dp->pool[smallest].p);
		dp->pool[smallest] = (struct pool_buf){p, cap};
		return;
	}
	free(p);
}

static void dp_free(struct dataplane *dp)
{
	for (int i = 0; i < dp->pool_n; i++)
		free(dp->pool[i].p);
	dp_reactor_free(dp->reactor);
	pthread_mutex_destroy(&dp->lock);
	free(dp);
}

/* Frees a connection nobody uses any more. Never from one of its own callbacks. */
static void conn_free(struct dp_conn *c)
{
	if (c->resume != NULL) {
		nng_aio_stop(c->resume);
		nng_aio_free(c->resume);
	}
	link_fini(&c->ds, &c->w, &c->r);
	free(c->junk);
	free(c);
}

void dp_unref(struct dataplane *dp, int n)
{
	pthread_mutex_lock(&dp->lock);
	dp->refs -= n;
	bool gone = dp->refs == 0;
	pthread_mutex_unlock(&dp->lock);
	if (gone)
		dp_free(dp);
}

/* Frees the connections whose last user is gone; dp itself may go with them. */
void reap_conns(struct dataplane *dp)
{
	struct dp_conn *dead = NULL;
	int n = 0;
	pthread_mutex_lock(&dp->lock);
	for (struct dp_conn **pp = &dp->conns; *pp != NULL;) {
		struct dp_conn *c = *pp;
		if (c->refs > 0) {
			pp = &c->next;
			continue;
		}
		*pp = c->next;
		c->next = dead;
		dead = c;
		n++;
	}
	pthread_mutex_unlock(&dp->lock);
	while (dead != NULL) {
		struct dp_conn *next = dead->next;
		conn_free(dead);
		dead = next;
	}
	if (n > 0)
		dp_unref(dp, n);
}

static void conn_unref(struct dp_conn *c)
{
	pthread_mutex_lock(&c->dp->lock);
	c->refs--;
	pthread_mutex_unlock(&c->dp->lock);
}

/* The reader stops and lets go of the connection. */
static void conn_stop_reading(struct dp_conn *c)
{
	pthread_mutex_lock(&c->dp->lock);
	if (c->reading) {
		c->reading = false;
		c->refs--;
	}
	pthread_mutex_unlock(&c->dp->lock);
}

static void ack_done(struct dp_frame *f, int rv)
{
	(void)rv;
	struct ack_frame *a = (struct ack_frame *)f;
	if (a->closing != NULL) {
		ds_close(&a->closing->ds);
		conn_unref(a->closing);
	}
	free(a);
}

/* Writes an acknowledgement; with closing, the stream closes once it is out. */
static void conn_ack(struct dp_conn *c, uint32_t chan, uint32_t slot, int code, const char *message,
                     bool closing)
{
	struct ack_frame *a = calloc(1, sizeof(*a));
	if (a == NULL) {
		ds_close(&c->ds); /* the sender learns it from the closed stream */
		return;
	}
	size_t len = message != NULL ? strnlen(message, DP_MESSAGE_MAX) : 0;
	memcpy(a->message, message != NULL ? message : "", len);
	a->a = (struct dp_ack){.magic = DP_ACK_MAGIC,
	                       .flags = closing ? DP_ACK_CLOSING : 0,
	                       .chan = chan,
	                       .slot = slot,
	                       .code = code,
	                       .len = (uint32_t)len};
	a->f.iov[0] = (nng_iov){&a->a, sizeof(a->a)};
	a->f.iov[1] = (nng_iov){a->message, len};
	a->f.niov = len > 0 ? 2 : 1;
	a->f.done = ack_done;
	if (closing) {
		pthread_mutex_lock(&c->dp->lock);
		c->refs++;
		pthread_mutex_unlock(&c->dp->lock);
		a->closing = c;
	}
	writer_enqueue(&c->w, &a->f);
}

const struct dp_header *dp_request_header(const struct dp_request *req)
{
	return &req->header;
}

const void *dp_request_payload(const struct dp_request *req)
{
	return req->payload != NULL ? req->payload : "";
}

void dp_request_cancel(struct dp_request *req)
{
	ds_close(&req->conn->ds);
}

void dp_complete(struct dp_request *req, int code, const char *message)
{
	struct dp_conn *c = req->conn;
	struct dataplane *dp = c->dp;
	/* The credit comes back before the acknowledgement lets the peer send again. */
	pthread_mutex_lock(&dp->lock);
	c->held--;
	c->held_bytes -= req->header.length;
	pthread_mutex_unlock(&dp->lock);
	conn_ack(c, req->header.chan, req->header.slot, code, code == ST_OK ? NULL : message,
	         false);
	pthread_mutex_lock(&dp->lock);
	pool_put_locked(dp, req->buf, req->cap);
	c->refs--;
	bool last = dp->stopping && c->refs == 0;
	pthread_mutex_unlock(&dp->lock);
	free(req);
	if (last) /* dp_stop left this connection to its last request */
		reap_conns(dp);
}

/*
 * What reads on a connection returns: 1 when the read it started completed at once (the
 * caller goes on with conn_next), 0 when a callback or dp_resume goes on.
 */
static int conn_payload(struct dp_conn *c);
static int conn_refuse_chunk(struct dp_conn *c, int code, const char *message);

/* Refuses the stream's latest frame and stops reading it: framing is lost. */
static void conn_refuse(struct dp_conn *c, int code, const char *message)
{
	log_warn("data plane: closing a connection: %s", message);
	conn_ack(c, c->h.chan, c->h.slot, code, message, true);
	conn_stop_reading(c);
}

/* Hands the chunk whose payload is complete to the receiver, then reads the next header. */
static int conn_deliver(struct dp_conn *c)
{
	struct dataplane *dp = c->dp;
	struct dp_request *req = c->req;
	c->req = NULL;
	struct status st;
	status_clear(&st);
	int rv = dp->on.deliver(dp->on.arg, req, &req->header, dp_request_payload(req), &st);
	if (rv != DP_PARKED)
		dp_complete(req, rv, rv == ST_OK ? NULL : st.message);
	return reader_read(&c->r, &c->h, sizeof(c->h));
}

#define DP_JUNK 65536

/* Reads the next piece of a refused payload, or the next header once it is all skipped. */
static int conn_skip(struct dp_conn *c)
{
	if (c->discard == 0)
		return reader_read(&c->r, &c->h, sizeof(c->h));
	if (c->junk == NULL && (c->junk = malloc(DP_JUNK)) == NULL) {
		conn_refuse(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
		return 0;
	}
	size_t n = c->discard < DP_JUNK ? (size_t)c->discard : DP_JUNK;
	c->discard -= n;
	return reader_read(&c->r, c->junk, n);
}

/* Checks a header, then reads the payload (if any) into its place or a buffer. */
static int conn_header(struct dp_conn *c)
{
	struct dataplane *dp = c->dp;
	if (c->h.magic != DP_MAGIC || c->h.length > DP_MAX_CHUNK) {
		conn_refuse(c, ST_INVALID_ARGUMENT, "malformed data-plane chunk header");
		return 0;
	}
	if (dp->token[0] != '\0' &&
	    !token_matches(dp->token, c->h.token, strnlen(c->h.token, sizeof(c->h.token)))) {
		/* Framing holds: refuse this chunk, skip its payload, and read on. */
		conn_ack(c, c->h.chan, c->h.slot, ST_UNAUTHENTICATED,
		         "chunk carries no pod token, or a wrong one", false);
		c->discard = c->h.length;
		return conn_skip(c);
	}
	/* A peer that ignores its window is cut off before it makes us hold more. */
	pthread_mutex_lock(&dp->lock);
	bool over = dp->credit_chunks > 0 && (c->held + 1 > dp->credit_chunks ||
	                                      c->held_bytes + c->h.length > dp->credit_bytes);
	int held = c->held, credit = dp->credit_chunks;
	uint64_t held_bytes = c->held_bytes, credit_bytes = dp->credit_bytes;
	pthread_mutex_unlock(&dp->lock);
	if (over) {
		char why[DP_MESSAGE_MAX];
		snprintf(why, sizeof(why),
		         "the peer sent past its credit: %d chunks (%llu bytes) unacknowledged and "
		         "one of %llu more; a peer may hold %d chunks (%llu bytes)",
		         held, (unsigned long long)held_bytes, (unsigned long long)c->h.length,
		         credit, (unsigned long long)credit_bytes);
		conn_refuse(c, ST_RESOURCE_EXHAUSTED, why);
		return 0;
	}
	struct dp_request *req = calloc(1, sizeof(*req));
	if (req == NULL) {
		conn_refuse(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
		return 0;
	}
	req->conn = c;
	req->header = c->h;
	pthread_mutex_lock(&dp->lock);
	c->refs++;
	c->held++;
	c->held_bytes += c->h.length;
	pthread_mutex_unlock(&dp->lock);
	c->req = req;
	int rv = ST_OK;
	struct status st;
	status_clear(&st);
	if (dp->on.admit != NULL)
		rv = dp->on.admit(dp->on.arg, req, &req->header, &st);
	if (rv == DP_PARKED) /* held: nothing is read until dp_resume */
		return 0;
	if (rv != ST_OK)
		return conn_refuse_chunk(c, rv, st.message);
	return conn_payload(c);
}

/* Reads the payload of the admitted chunk into its place or a buffer (or delivers it). */
static int conn_payload(struct dp_conn *c)
{
	struct dataplane *dp = c->dp;
	struct dp_request *req = c->req;
	if (req->header.length == 0)
		return conn_deliver(c);
	if (dp->on.place != NULL)
		req->payload = dp->on.place(dp->on.arg, req, &req->header);
	if (req->payload == NULL) {
		req->payload = req->buf = pool_get(dp, req->header.length, &req->cap);
		if (req->buf == NULL)
			return conn_refuse_chunk(c, ST_RESOURCE_EXHAUSTED,
			                         "out of host memory for a chunk");
	}
	return reader_read(&c->r, req->payload, req->header.length);
}

/* Refuses the admitted chunk alone: its payload is skipped and the stream read on. */
static int conn_refuse_chunk(struct dp_conn *c, int code, const char *message)
{
	struct dp_request *req = c->req;
	c->req = NULL;
	c->discard = req->header.length;
	dp_complete(req, code, message);
	return conn_skip(c);
}

/* Goes on from a complete read: what was read decides what comes next. */
static int conn_next(struct dp_conn *c)
{
	if (c->req != NULL)
		return conn_deliver(c);
	if (c->r.buf == c->junk)
		return conn_skip(c);
	return conn_header(c);
}

/* Goes on while reads complete at once (rv: what the last one returned). */
static void conn_run(struct dp_conn *c, int rv)
{
	while (rv == 1)
		rv = conn_next(c);
}

static void conn_resume_cb(void *arg)
{
	struct dp_conn *c = arg;
	if (c->req == NULL) /* stopped as the connection is freed: nothing is held */
		return;
	conn_run(c, c->resume_code == ST_OK
	                ? conn_payload(c)
	                : conn_refuse_chunk(c, c->resume_code, c->resume_message));
}

void dp_resume(struct dp_request *req, int code, const char *message)
{
	struct dp_conn *c = req->conn;
	c->resume_code = code;
	snprintf(c->resume_message, sizeof(c->resume_message), "%s", message ? message : "");
	nng_sleep_aio(0, c->resume);
}

static void conn_read_cb(void *arg)
{
	struct dp_conn *c = arg;
	int err = 0;
	int rv = reader_step(&c->r, &err);
	if (rv < 0) {
		/* The peer went away (or dp_stop closed us): parked requests still answer. */
		ds_close(&c->ds);
		struct dp_request *req = c->req;
		c->req = NULL;
		if (req != NULL) {
			/* A payload cut short: nobody gets it. */
			if (req->buf == NULL && c->dp->on.unplace != NULL)
				c->dp->on.unplace(c->dp->on.arg, req);
			struct dataplane *dp = c->dp;
			pthread_mutex_lock(&dp->lock);
			pool_put_locked(dp, req->buf, req->cap);
			c->held--;
			c->held_bytes -= req->header.length;
			c->refs--;
			pthread_mutex_unlock(&dp->lock);
			free(req);
		}
		conn_stop_reading(c);
		return;
	}
	conn_run(c, rv);
}

static void accept_cb(void *arg)
{
	struct dataplane *dp = arg;
	int rv = nng_aio_result(dp->accept);
	if (rv == NNG_ECLOSED || rv == NNG_ECANCELED)
		return;
	if (rv == 0) {
		nng_stream *s = nng_aio_get_output(dp->accept, 0);
		struct dp_conn *c = calloc(1, sizeof(*c));
		if (c == NULL || link_init(&c->ds, &c->w, &c->r, s, conn_read_cb, c) != 0) {
			free(c);
			nng_stream_free(s);
			log_error("data plane: out of memory for a connection");
		} else if (nng_aio_alloc(&c->resume, conn_resume_cb, c) != 0) {
			conn_free(c);
			log_error("data plane: out of memory for a connection");
		} else {
			c->dp = dp;
			c->refs = 1;
			c->reading = true;
			if (dp->plain_tcp)
				link_use_socket(&c->w, &c->r, s, dp->reactor);
			pthread_mutex_lock(&dp->lock);
			bool stopping = dp->stopping;
			if (!stopping) {
				c->next = dp->conns;
				dp->conns = c;
				dp->refs++;
			}
			pthread_mutex_unlock(&dp->lock);
			if (stopping) {
				conn_free(c);
				return;
			}
			conn_run(c, reader_read(&c->r, &c->h, sizeof(c->h)));
		}
	}
	nng_stream_listener_accept(dp->listener, dp->accept);
}

int dp_start(struct dataplane **out, const char *url, char *bound_url,
             const struct dp_handlers *handlers, struct status *st)
{
	struct dataplane *dp = calloc(1, sizeof(*dp));
	if (dp == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	dp->on = *handlers;
	dp->refs = 1;
	dp->plain_tcp = strncmp(url, "tcp://", 6) == 0;
	pthread_mutex_init(&dp->lock, NULL);
	if (dp->plain_tcp && dp_reactor_start(&dp->reactor) != 0) {
		dp_free(dp);
		return status_set(st, ST_RESOURCE_EXHAUSTED,
		                  "cannot start the data plane's reactor thread");
	}
	if (tls_stream_listener_create(&dp->listener, url, st) != ST_OK) {
		dp_free(dp);
		return st->code;
	}
	int rv = nng_stream_listener_listen(dp->listener);
	if (rv == 0)
		rv = nng_aio_alloc(&dp->accept, accept_cb, dp);
	if (rv != 0) {
		nng_stream_listener_free(dp->listener);
		dp_free(dp);
		return status_set(st, ST_UNAVAILABLE, "data plane cannot listen on %s: %s", url,
		                  nng_strerror(rv));
	}
	tls_stream_bound_url(bound_url, url, dp->listener);
	nng_stream_listener_accept(dp->listener, dp->accept);
	*out = dp;
	return ST_OK;
}

void dp_reap(struct dataplane *dp)
{
	if (dp != NULL)
		reap_conns(dp);
}

void dp_set_token(struct dataplane *dp, const char *token)
{
	snprintf(dp->token, sizeof(dp->token), "%s", token ? token : "");
}

void dp_trim(struct dataplane *dp)
{
	pthread_mutex_lock(&dp->lock);
	for (int i = 0; i < dp->pool_n; i++)
		free(dp->pool[i].p);
	dp->pool_n = 0;
	pthread_mutex_unlock(&dp->lock);
}

void dp_set_credit(struct dataplane *dp, int chunks, uint64_t bytes)
{
	pthread_mutex_lock(&dp->lock);
	dp->credit_chunks = chunks > 0 ? chunks : 0;
	dp->credit_bytes = bytes;
	pthread_mutex_unlock(&dp->lock);
}

void dp_shutdown(struct dataplane *dp)
{
	if (dp == NULL)
		return;
	pthread_mutex_lock(&dp->lock);
	bool again = dp->stopping;
	dp->stopping = 1;
	struct dp_peer *peers = again ? NULL : dp->peers;
	dp->peers = NULL;
	pthread_mutex_unlock(&dp->lock);
	if (again)
		return;
	nng_stream_listener_close(dp->listener);
	nng_aio_free(dp->accept);
	nng_stream_listener_free(dp->listener);
	/*
	 * No new connection comes now. A core still opening a channel may reap the list
	 * meanwhile: work on a snapshot, each connection held by a reference.
	 */
	pthread_mutex_lock(&dp->lock);
	int n = 0;
	for (struct dp_conn *c = dp->conns; c != NULL; c = c->next)
		n++;
	struct dp_conn **conns = calloc((size_t)n + 1, sizeof(*conns));
	n = 0;
	for (struct dp_conn *c = dp->conns; c != NULL && conns != NULL; c = c->next) {
		c->refs++;
		conns[n++] = c;
	}
	pthread_mutex_unlock(&dp->lock);
	for (int i = 0; i < n; i++) {
		struct dp_conn *c = conns[i];
		pthread_mutex_lock(&c->w.lock);
		c->w.error = NNG_ECLOSED; /* requests answered later free their acknowledgement */
		pthread_mutex_unlock(&c->w.lock);
		ds_close(&c->ds);
		reader_stop(&c->r);
		nng_aio_stop(c->w.aio);
		writer_fail(&c->w, NNG_ECLOSED);
		conn_stop_reading(c);
		conn_unref(c);
	}
	free(conns);
	peers_stop(peers);
	reap_conns(dp);
	/* Every stream is closed and no reader waits: no callback runs after this. */
	if (dp->reactor != NULL)
		dp_reactor_stop(dp->reactor);
}

void dp_stop(struct dataplane *dp)
{
	if (dp == NULL)
		return;
	dp_shutdown(dp);
	dp_unref(dp, 1);
}

bool dp_hold(struct dataplane *dp, int wake_fd)
{
	return dp->reactor != NULL && dp_reactor_hold(dp->reactor, wake_fd);
}

int dp_poll(struct dataplane *dp, int timeout_ms)
{
	return dp_reactor_poll(dp->reactor, timeout_ms);
}

void dp_release(struct dataplane *dp)
{
	dp_reactor_release(dp->reactor);
}
