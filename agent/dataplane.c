#include "dataplane.h"

#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <nng/nng.h>

#include "clock.h"
#include "log.h"
#include "tls.h"
#include "token.h"

/* The largest payload a receiver accepts; a header announcing more closes the stream. */
#define DP_MAX_CHUNK (64u * 1024 * 1024)
/* A reader of a plain TCP stream is woken once this many bytes (or all it waits for) are in. */
#define DP_RCVLOWAT (1u << 20)
/* Payload buffers a receiver keeps for reuse once their chunks are consumed. */
#define DP_POOL_KEEP 8
/* and at most this many bytes of them, so that the agent's RSS follows its accounted bytes */
#define DP_POOL_KEEP_BYTES ((size_t)8 << 20)
#define DP_MESSAGE_MAX 480

/*
 * A stream with its closing: nng 1.5 leaves an operation started on a closed TCP stream
 * pending forever, so operations and the close are ordered here, and one started after the
 * close completes at once with nothing transferred (which the callbacks take as closed).
 */
struct dp_stream {
	nng_stream *s;
	pthread_mutex_t lock;
	bool closed;
};

static void ds_init(struct dp_stream *ds, nng_stream *s)
{
	ds->s = s;
	ds->closed = false;
	pthread_mutex_init(&ds->lock, NULL);
}

static void ds_close(struct dp_stream *ds)
{
	pthread_mutex_lock(&ds->lock);
	ds->closed = true;
	nng_stream_close(ds->s);
	pthread_mutex_unlock(&ds->lock);
}

static void ds_io(struct dp_stream *ds, nng_aio *aio, bool send)
{
	pthread_mutex_lock(&ds->lock);
	if (ds->closed)
		nng_sleep_aio(0, aio);
	else if (send)
		nng_stream_send(ds->s, aio);
	else
		nng_stream_recv(ds->s, aio);
	pthread_mutex_unlock(&ds->lock);
}

static void ds_fini(struct dp_stream *ds)
{
	nng_stream_free(ds->s);
	pthread_mutex_destroy(&ds->lock);
}

/* ---- Writing frames to a stream in order, each whole before the next ---- */

struct dp_frame {
	struct dp_frame *next;
	nng_iov iov[4];
	unsigned niov;
	void (*done)(struct dp_frame *f, int rv); /* written (rv 0) or failed; without locks */
};

struct dp_writer {
	pthread_mutex_t lock;
	struct dp_stream *ds;
	nng_aio *aio;
	struct dp_frame *head, *tail; /* head is being written */
	int error;                    /* once the stream failed, later frames fail at once */
};

static void writer_send(struct dp_writer *w, struct dp_frame *f)
{
	nng_aio_set_iov(w->aio, f->niov, f->iov);
	ds_io(w->ds, w->aio, true);
}

static void writer_enqueue(struct dp_writer *w, struct dp_frame *f)
{
	f->next = NULL;
	pthread_mutex_lock(&w->lock);
	if (w->error != 0) {
		int e = w->error;
		pthread_mutex_unlock(&w->lock);
		f->done(f, e);
		return;
	}
	bool start = w->head == NULL;
	if (start)
		w->head = f;
	else
		w->tail->next = f;
	w->tail = f;
	pthread_mutex_unlock(&w->lock);
	if (start)
		writer_send(w, f);
}

/* Drops the first n bytes of f's vector. */
static void frame_advance(struct dp_frame *f, size_t n)
{
	unsigned k = 0;
	while (k < f->niov && n >= f->iov[k].iov_len)
		n -= f->iov[k++].iov_len;
	if (k < f->niov) {
		f->iov[k].iov_buf = (char *)f->iov[k].iov_buf + n;
		f->iov[k].iov_len -= n;
	}
	memmove(f->iov, f->iov + k, (f->niov - k) * sizeof(f->iov[0]));
	f->niov -= k;
}

/* Fails every queued frame; the stream is broken. */
static void writer_fail(struct dp_writer *w, int rv)
{
	pthread_mutex_lock(&w->lock);
	if (w->error == 0)
		w->error = rv;
	struct dp_frame *list = w->head;
	w->head = w->tail = NULL;
	pthread_mutex_unlock(&w->lock);
	while (list != NULL) {
		struct dp_frame *next = list->next;
		list->done(list, rv);
		list = next;
	}
}

static void writer_cb(void *arg)
{
	struct dp_writer *w = arg;
	int rv = nng_aio_result(w->aio);
	size_t n = nng_aio_count(w->aio);
	if (rv == 0 && n == 0)
		rv = NNG_ECLOSED;
	if (rv != 0) {
		ds_close(w->ds);
		writer_fail(w, rv);
		return;
	}
	pthread_mutex_lock(&w->lock);
	struct dp_frame *f = w->head;
	if (f == NULL) { /* failed meanwhile */
		pthread_mutex_unlock(&w->lock);
		return;
	}
	frame_advance(f, n);
	if (f->niov > 0) {
		pthread_mutex_unlock(&w->lock);
		writer_send(w, f);
		return;
	}
	w->head = f->next;
	if (w->head == NULL)
		w->tail = NULL;
	struct dp_frame *next = w->head;
	pthread_mutex_unlock(&w->lock);
	f->done(f, 0);
	if (next != NULL)
		writer_send(w, next);
}

static int writer_init(struct dp_writer *w, struct dp_stream *ds)
{
	pthread_mutex_init(&w->lock, NULL);
	w->ds = ds;
	return nng_aio_alloc(&w->aio, writer_cb, w);
}

/* ---- Reading exactly n bytes ---- */

struct dp_reader {
	struct dp_stream *ds;
	nng_aio *aio;
	char *buf;
	size_t want, got;
	int fd;    /* the stream's TCP socket, to batch wake-ups; -1: not known */
	int lowat; /* its SO_RCVLOWAT */
};

/*
 * The socket under a plain TCP stream, found by its two addresses among this process's
 * descriptors; -1 when there is none. nng 1.5 has no option for a stream's receive low-water
 * mark, and without one a reader is woken for every segment loopback delivers (64 KiB): about
 * 64 wake-ups and thread hand-offs per 4 MiB chunk. The descriptor stays nng's: only
 * SO_RCVLOWAT is set on it.
 */
static int stream_socket(nng_stream *s)
{
	nng_sockaddr la, ra;
	if (nng_stream_get_addr(s, NNG_OPT_LOCADDR, &la) != 0 ||
	    nng_stream_get_addr(s, NNG_OPT_REMADDR, &ra) != 0 || la.s_family != NNG_AF_INET ||
	    ra.s_family != NNG_AF_INET)
		return -1;
	DIR *d = opendir("/proc/self/fd");
	if (d == NULL)
		return -1;
	int found = -1;
	struct dirent *e;
	while (found < 0 && (e = readdir(d)) != NULL) {
		char *end;
		long fd = strtol(e->d_name, &end, 10);
		struct sockaddr_in a, b;
		socklen_t al = sizeof(a), bl = sizeof(b);
		if (*end != '\0' || end == e->d_name || fd == dirfd(d) ||
		    getsockname((int)fd, (struct sockaddr *)&a, &al) != 0 ||
		    a.sin_family != AF_INET ||
		    getpeername((int)fd, (struct sockaddr *)&b, &bl) != 0 ||
		    b.sin_family != AF_INET)
			continue;
		if (a.sin_port == la.s_in.sa_port && a.sin_addr.s_addr == la.s_in.sa_addr &&
		    b.sin_port == ra.s_in.sa_port && b.sin_addr.s_addr == ra.s_in.sa_addr)
			found = (int)fd;
	}
	closedir(d);
	return found;
}

static void reader_more(struct dp_reader *r)
{
	/*
	 * Woken when what is left (up to DP_RCVLOWAT) is there. Never more than is still to come:
	 * nng completes a read as soon as it got any bytes, and the next one sets the mark anew
	 * before it waits.
	 */
	if (r->fd >= 0) {
		size_t left = r->want - r->got;
		int mark = left < DP_RCVLOWAT ? (int)left : (int)DP_RCVLOWAT;
		if (mark != r->lowat &&
		    setsockopt(r->fd, SOL_SOCKET, SO_RCVLOWAT, &mark, sizeof(mark)) == 0)
			r->lowat = mark;
	}
	nng_iov iov = {r->buf + r->got, r->want - r->got};
	nng_aio_set_iov(r->aio, 1, &iov);
	ds_io(r->ds, r->aio, false);
}

static void reader_read(struct dp_reader *r, void *buf, size_t want)
{
	r->buf = buf;
	r->want = want;
	r->got = 0;
	reader_more(r);
}

/* In the reader's callback: 1 when the bytes are all there, 0 when it reads on, or -1. */
static int reader_step(struct dp_reader *r, int *err)
{
	int rv = nng_aio_result(r->aio);
	size_t n = nng_aio_count(r->aio);
	if (rv == 0 && n == 0)
		rv = NNG_ECONNSHUT;
	if (rv != 0) {
		*err = rv;
		return -1;
	}
	r->got += n;
	if (r->got < r->want) {
		reader_more(r);
		return 0;
	}
	return 1;
}

/*
 * Both ends of a connection: the stream, a writer and a reader whose callback is cb(arg).
 * On failure nothing is left allocated but the stream, which stays the caller's.
 */
static int link_init(struct dp_stream *ds, struct dp_writer *w, struct dp_reader *r, nng_stream *s,
                     void (*cb)(void *), void *arg)
{
	/* Acknowledgements and headers are small writes that must not wait for Nagle's timer. */
	nng_stream_set_bool(s, NNG_OPT_TCP_NODELAY, true);
	ds_init(ds, s);
	r->ds = ds;
	r->fd = -1;
	r->lowat = 1;
	if (writer_init(w, ds) != 0) {
		pthread_mutex_destroy(&w->lock);
		pthread_mutex_destroy(&ds->lock);
		return -1;
	}
	if (nng_aio_alloc(&r->aio, cb, arg) != 0) {
		nng_aio_free(w->aio);
		pthread_mutex_destroy(&w->lock);
		pthread_mutex_destroy(&ds->lock);
		return -1;
	}
	return 0;
}

/* Closes and frees a link. Never from one of its own callbacks. */
static void link_fini(struct dp_stream *ds, struct dp_writer *w, struct dp_reader *r)
{
	ds_close(ds);
	nng_aio_free(r->aio);
	nng_aio_free(w->aio);
	writer_fail(w, NNG_ECLOSED); /* frames never started */
	ds_fini(ds);
	pthread_mutex_destroy(&w->lock);
}

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
	int held;               /* under dp->lock: chunks read and not yet acknowledged */
	uint64_t held_bytes;    /* and their payload bytes */
	char *junk;             /* where they go */
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

struct pool_buf {
	void *p;
	size_t cap;
};

struct dataplane {
	pthread_mutex_t lock;
	char token[TOKEN_MAX + 1];
	struct dp_handlers on;
	nng_stream_listener *listener;
	nng_aio *accept;
	struct dp_conn *conns;
	struct dp_peer *peers;
	struct pool_buf pool[DP_POOL_KEEP];
	int pool_n;
	int refs; /* the owner until dp_stop, each connection and each peer */
	int stopping;
	int credit_chunks;     /* what one connection may hold unacknowledged (0: no limit) */
	uint64_t credit_bytes; /* under lock */
	bool plain_tcp; /* tcp://, whose streams read straight from their sockets (not TLS) */
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
	pthread_mutex_destroy(&dp->lock);
	free(dp);
}

/* Frees a connection nobody uses any more. Never from one of its own callbacks. */
static void conn_free(struct dp_conn *c)
{
	link_fini(&c->ds, &c->w, &c->r);
	free(c->junk);
	free(c);
}

static void dp_unref(struct dataplane *dp, int n)
{
	pthread_mutex_lock(&dp->lock);
	dp->refs -= n;
	bool gone = dp->refs == 0;
	pthread_mutex_unlock(&dp->lock);
	if (gone)
		dp_free(dp);
}

/* Frees the connections whose last user is gone; dp itself may go with them. */
static void reap_conns(struct dataplane *dp)
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

/* Refuses the stream's latest frame and stops reading it: framing is lost. */
static void conn_refuse(struct dp_conn *c, int code, const char *message)
{
	log_warn("data plane: closing a connection: %s", message);
	conn_ack(c, c->h.chan, c->h.slot, code, message, true);
	conn_stop_reading(c);
}

/* Hands the chunk whose payload is complete to the receiver, then reads the next header. */
static void conn_deliver(struct dp_conn *c)
{
	struct dataplane *dp = c->dp;
	struct dp_request *req = c->req;
	c->req = NULL;
	struct status st;
	status_clear(&st);
	int rv = dp->on.deliver(dp->on.arg, req, &req->header, dp_request_payload(req), &st);
	if (rv != DP_PARKED)
		dp_complete(req, rv, rv == ST_OK ? NULL : st.message);
	reader_read(&c->r, &c->h, sizeof(c->h));
}

#define DP_JUNK 65536

/* Reads the next piece of a refused payload, or the next header once it is all skipped. */
static void conn_skip(struct dp_conn *c)
{
	if (c->discard == 0) {
		reader_read(&c->r, &c->h, sizeof(c->h));
		return;
	}
	if (c->junk == NULL && (c->junk = malloc(DP_JUNK)) == NULL) {
		conn_refuse(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
		return;
	}
	size_t n = c->discard < DP_JUNK ? (size_t)c->discard : DP_JUNK;
	c->discard -= n;
	reader_read(&c->r, c->junk, n);
}

/* Checks a header, then reads the payload (if any) into its place or a buffer. */
static void conn_header(struct dp_conn *c)
{
	struct dataplane *dp = c->dp;
	if (c->h.magic != DP_MAGIC || c->h.length > DP_MAX_CHUNK) {
		conn_refuse(c, ST_INVALID_ARGUMENT, "malformed data-plane chunk header");
		return;
	}
	if (dp->token[0] != '\0' &&
	    !token_matches(dp->token, c->h.token, strnlen(c->h.token, sizeof(c->h.token)))) {
		/* Framing holds: refuse this chunk, skip its payload, and read on. */
		conn_ack(c, c->h.chan, c->h.slot, ST_UNAUTHENTICATED,
		         "chunk carries no pod token, or a wrong one", false);
		c->discard = c->h.length;
		conn_skip(c);
		return;
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
		return;
	}
	struct dp_request *req = calloc(1, sizeof(*req));
	if (req == NULL) {
		conn_refuse(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
		return;
	}
	req->conn = c;
	req->header = c->h;
	pthread_mutex_lock(&dp->lock);
	c->refs++;
	c->held++;
	c->held_bytes += c->h.length;
	pthread_mutex_unlock(&dp->lock);
	c->req = req;
	if (c->h.length == 0) {
		conn_deliver(c);
		return;
	}
	if (dp->on.place != NULL)
		req->payload = dp->on.place(dp->on.arg, req, &req->header);
	if (req->payload == NULL) {
		req->payload = req->buf = pool_get(dp, c->h.length, &req->cap);
		if (req->buf == NULL) {
			c->req = NULL;
			pthread_mutex_lock(&dp->lock);
			c->held--;
			c->held_bytes -= c->h.length;
			pthread_mutex_unlock(&dp->lock);
			conn_unref(c);
			free(req);
			conn_refuse(c, ST_RESOURCE_EXHAUSTED, "out of host memory for a chunk");
			return;
		}
	}
	reader_read(&c->r, req->payload, c->h.length);
}

static void conn_read_cb(void *arg)
{
	struct dp_conn *c = arg;
	int err = 0;
	int rv = reader_step(&c->r, &err);
	if (rv == 0)
		return;
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
	if (c->req != NULL)
		conn_deliver(c);
	else if (c->r.buf == c->junk)
		conn_skip(c);
	else
		conn_header(c);
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
		} else {
			c->dp = dp;
			c->refs = 1;
			c->reading = true;
			if (dp->plain_tcp)
				c->r.fd = stream_socket(s);
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
			reader_read(&c->r, &c->h, sizeof(c->h));
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
	unsigned char *copy;
	size_t copy_cap;
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

static void peer_read_cb(void *arg)
{
	struct dp_peer *p = arg;
	int err = 0;
	int rv = reader_step(&p->r, &err);
	if (rv == 0)
		return;
	if (rv < 0) {
		char why[512];
		snprintf(why, sizeof(why), "peer %s closed the data-plane connection: %s", p->url,
		         nng_strerror(err));
		peer_fail(p, ST_UNAVAILABLE, why);
		return;
	}
	if (!p->reading_message) {
		if (p->ack.magic != DP_ACK_MAGIC || p->ack.len > DP_MESSAGE_MAX) {
			peer_fail(p, ST_INTERNAL, "malformed data-plane acknowledgement");
			return;
		}
		if (p->ack.len > 0) {
			p->reading_message = true;
			reader_read(&p->r, p->ack_message, p->ack.len);
			return;
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
		return;
	}
	reader_read(&p->r, &p->ack, sizeof(p->ack));
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

static int peer_dial(struct dataplane *dp, const char *url, int timeout_ms, struct dp_peer **out,
                     struct status *st)
{
	nng_stream_dialer *d;
	int rv = tls_stream_dialer_create(&d, url, st);
	if (rv != ST_OK)
		return rv;
	nng_aio *aio;
	if (nng_aio_alloc(&aio, NULL, NULL) != 0) {
		nng_stream_dialer_free(d);
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	}
	nng_aio_set_timeout(aio, timeout_ms);
	nng_stream_dialer_dial(d, aio);
	nng_aio_wait(aio);
	int nrv = nng_aio_result(aio);
	nng_stream *s = nrv == 0 ? nng_aio_get_output(aio, 0) : NULL;
	nng_aio_free(aio);
	nng_stream_dialer_free(d);
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
	pthread_mutex_init(&p->lock, NULL);
	reader_read(&p->r, &p->ack, sizeof(p->ack));
	*out = p;
	return ST_OK;
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
	int rv = peer_dial(dp, url, timeout_ms, &p, st);
	if (rv != ST_OK)
		return rv;
	pthread_mutex_lock(&dp->lock);
	dp->refs++;
	if (dp->stopping) {
		pthread_mutex_unlock(&dp->lock);
		p->refs = 1;
		peer_unref(p);
		return status_set(st, ST_UNAVAILABLE, "the data plane of this agent stopped");
	}
	p->refs = 2; /* the list's and the caller's */
	p->next = dp->peers;
	dp->peers = p;
	pthread_mutex_unlock(&dp->lock);
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
                 int n, bool copy, struct status *st)
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
	if (copy && len > 0) {
		if (s->copy_cap < len) {
			unsigned char *p = realloc(s->copy, len);
			if (p == NULL) {
				pthread_mutex_lock(&ch->lock);
				s->busy = s->writing = s->awaiting = false;
				ch->in_flight--;
				pthread_mutex_unlock(&ch->lock);
				return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
			}
			s->copy = p;
			s->copy_cap = len;
		}
		size_t at = 0;
		for (int i = 0; i < n; i++) {
			memcpy(s->copy + at, segs[i].data, segs[i].len);
			at += segs[i].len;
		}
		s->frame.iov[s->frame.niov++] = (nng_iov){s->copy, len};
	} else {
		for (int i = 0; i < n; i++)
			if (segs[i].len > 0)
				s->frame.iov[s->frame.niov++] =
				    (nng_iov){(void *)segs[i].data, segs[i].len};
	}
	writer_enqueue(&ch->peer->w, &s->frame);
	return ST_OK;
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
	int code = ch->code;
	if (code != ST_OK)
		status_set(st, code, "%s", ch->message);
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
	int code = ch->code;
	if (code != ST_OK)
		status_set(st, code, "%s", ch->message);
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
	for (int i = 0; i < ch->window; i++)
		free(ch->slots[i].copy);
	free(ch->slots);
	pthread_cond_destroy(&ch->cv);
	pthread_mutex_destroy(&ch->lock);
	peer_unref(p);
	free(ch);
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
		nng_aio_stop(c->r.aio);
		nng_aio_stop(c->w.aio);
		writer_fail(&c->w, NNG_ECLOSED);
		conn_stop_reading(c);
		conn_unref(c);
	}
	free(conns);
	while (peers != NULL) {
		struct dp_peer *next = peers->next;
		peer_fail(peers, ST_UNAVAILABLE, "the data plane stopped");
		peer_unref(peers);
		peers = next;
	}
	reap_conns(dp);
}

void dp_stop(struct dataplane *dp)
{
	if (dp == NULL)
		return;
	dp_shutdown(dp);
	dp_unref(dp, 1);
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
