/*
 * The serving half of the RPC layer: a stream listener whose accepted connections are each read
 * by a thread of their own, frame after frame, each frame dispatched to its method's handler and
 * answered on the same connection.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>

#include "log.h"
#include "podemu.pb-c.h"
#include "rpc.h"
#include "stream_socket.h"
#include "tls.h"
#include "token.h"

/* What a connection's buffer keeps between frames; a larger frame's buffer is given back. */
#define CONN_BUFFER_BYTES (64 * 1024)

struct rpc_conn {
	struct rpc_server *server;
	nng_stream *stream;
	nng_aio *aio;
	/*
	 * A plain TCP stream's socket, read and written by the connection's thread itself: an nng
	 * read is woken on nng's poller thread, which then wakes this one (two hand-offs a frame
	 * where poll takes one). -1: through nng (TLS).
	 */
	int fd;
	uint8_t *buf; /* bytes read and not yet dispatched: [0, have) */
	size_t cap, have;
	struct rpc_conn *prev, *next;
};

struct rpc_server {
	nng_stream_listener *listener;
	nng_aio *accept;
	char token[TOKEN_MAX + 1]; /* "" when none is required */
	const ProtobufCServiceDescriptor *svc;
	const rpc_handler *handlers;
	void *state;
	char url[256];
	pthread_mutex_t lock;
	pthread_cond_t idle; /* signalled when threads drops to 0 */
	struct rpc_conn *conns;
	int threads; /* connection threads still running */
	bool stopping;
};

/*
 * Decodes one request envelope, runs the handler, and encodes the reply envelope into a frame
 * (malloc'd, *out_len bytes). Malformed input yields an error reply, never a crash; NULL only
 * when host memory runs out.
 */
static uint8_t *rpc_dispatch(struct rpc_server *s, const uint8_t *req, size_t req_len,
                             size_t *out_len)
{
	struct status st;
	status_clear(&st);
	struct arena *a = arena_new();
	Podemu__RpcResponse resp = PODEMU__RPC_RESPONSE__INIT;
	void *reply = NULL;
	const ProtobufCMethodDescriptor *m = NULL;
	uint8_t *out = NULL;
	if (a == NULL) {
		status_set(&st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		goto respond;
	}
	Podemu__RpcRequest *env =
	    podemu__rpc_request__unpack(arena_protobuf_allocator(a), req_len, req);
	if (env == NULL) {
		status_set(&st, ST_INVALID_ARGUMENT, "malformed RPC envelope (%zu bytes)", req_len);
		goto respond;
	}
	if (s->token[0] != '\0' && !token_matches(s->token, env->token.data, env->token.len)) {
		status_set(&st, ST_UNAUTHENTICATED,
		           "request carries no pod token, or a wrong one (--token-file / "
		           "PODEMU_TOKEN)");
		goto respond;
	}
	if (env->method >= s->svc->n_methods || s->handlers[env->method] == NULL) {
		status_set(&st, ST_UNIMPLEMENTED, "%s has no method %u", s->svc->name, env->method);
		goto respond;
	}
	m = &s->svc->methods[env->method];
	ProtobufCMessage *in = protobuf_c_message_unpack(m->input, arena_protobuf_allocator(a),
	                                                 env->payload.len, env->payload.data);
	if (in == NULL) {
		status_set(&st, ST_INVALID_ARGUMENT, "malformed %s request (%zu bytes)", m->name,
		           env->payload.len);
		goto respond;
	}
	reply = arena_alloc(a, m->output->sizeof_message);
	if (reply == NULL) {
		status_set(&st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		goto respond;
	}
	protobuf_c_message_init(m->output, reply);
	st.code = s->handlers[env->method](s->state, a, in, reply, &st);
	if (st.code == ST_OK) {
		size_t len = protobuf_c_message_get_packed_size(reply);
		resp.payload.data = arena_alloc(a, len ? len : 1);
		if (resp.payload.data == NULL) {
			status_set(&st, ST_RESOURCE_EXHAUSTED, "out of host memory");
			goto respond;
		}
		resp.payload.len = protobuf_c_message_pack(reply, resp.payload.data);
	}
respond:
	resp.code = st.code;
	resp.message = st.code == ST_OK ? "" : st.message;
	if (st.code != ST_OK) {
		resp.payload.len = 0;
		log_debug("%s: %s: %s", m ? m->name : "rpc", status_code_name(st.code), st.message);
	}
	size_t len = podemu__rpc_response__get_packed_size(&resp);
	if (len > RPC_MAX_MESSAGE_BYTES) {
		/* A reply the caller would refuse: say so instead. */
		resp.code = ST_RESOURCE_EXHAUSTED;
		resp.message = "reply exceeds the RPC message limit";
		resp.payload.len = 0;
		len = podemu__rpc_response__get_packed_size(&resp);
	}
	out = malloc(RPC_FRAME_HEADER_BYTES + len);
	if (out != NULL) {
		rpc_frame_encode(out, (uint32_t)len);
		podemu__rpc_response__pack(&resp, out + RPC_FRAME_HEADER_BYTES);
		*out_len = RPC_FRAME_HEADER_BYTES + len;
	}
	arena_free(a);
	return out;
}

/*
 * conn_io on the socket itself: the first bytes that go or come (a count of 0 read: the peer
 * closed), waiting in poll up to timeout_ms. rpc_server_stop shuts the stream down, which
 * ends the wait.
 */
static int conn_io_socket(struct rpc_conn *c, bool out, void *data, size_t len,
                          nng_duration timeout_ms, size_t *count)
{
	*count = 0;
	for (;;) {
		pthread_mutex_lock(&c->server->lock);
		bool stopping = c->server->stopping;
		pthread_mutex_unlock(&c->server->lock);
		if (stopping)
			return NNG_ECLOSED;
		ssize_t n = out ? send(c->fd, data, len, MSG_DONTWAIT | MSG_NOSIGNAL)
		                : recv(c->fd, data, len, MSG_DONTWAIT);
		if (n >= 0) {
			*count = (size_t)n;
			return 0;
		}
		if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
			return NNG_ECONNSHUT;
		struct pollfd p = {.fd = c->fd, .events = out ? POLLOUT : POLLIN};
		int rv = poll(&p, 1, timeout_ms == NNG_DURATION_INFINITE ? -1 : (int)timeout_ms);
		if (rv == 0)
			return NNG_ETIMEDOUT;
	}
}

/*
 * Starts op on the connection's aio and waits for it. Started under the server's lock, so that
 * rpc_server_stop either cancels it or finds it refused: nng 1.5 lets an operation started on
 * a stream closed meanwhile wait until its timeout.
 */
static int conn_io(struct rpc_conn *c, void (*op)(nng_stream *, nng_aio *), void *data, size_t len,
                   nng_duration timeout_ms, size_t *count)
{
	if (c->fd >= 0)
		return conn_io_socket(c, op == nng_stream_send, data, len, timeout_ms, count);
	nng_iov iov = {data, len};
	nng_aio_set_iov(c->aio, 1, &iov);
	nng_aio_set_timeout(c->aio, timeout_ms);
	pthread_mutex_lock(&c->server->lock);
	bool stopping = c->server->stopping;
	if (!stopping)
		op(c->stream, c->aio);
	pthread_mutex_unlock(&c->server->lock);
	if (stopping)
		return NNG_ECLOSED;
	nng_aio_wait(c->aio);
	*count = nng_aio_count(c->aio);
	return nng_aio_result(c->aio);
}

/* One read into the buffer's free space, waiting up to timeout_ms. nng's error, or 0. */
static int conn_read(struct rpc_conn *c, nng_duration timeout_ms)
{
	size_t n = 0;
	int rv = conn_io(c, nng_stream_recv, c->buf + c->have, c->cap - c->have, timeout_ms, &n);
	if (rv == 0 && n == 0)
		rv = NNG_ECONNSHUT;
	c->have += n;
	return rv;
}

static int conn_write(struct rpc_conn *c, const uint8_t *data, size_t len)
{
	size_t sent = 0;
	while (sent < len) {
		size_t n = 0;
		int rv = conn_io(c, nng_stream_send, (void *)(data + sent), len - sent,
		                 RPC_FRAME_TIMEOUT_MS, &n);
		if (rv != 0)
			return rv;
		sent += n;
	}
	return 0;
}

/* Makes the buffer hold at least want bytes. False when host memory runs out. */
static bool conn_reserve(struct rpc_conn *c, size_t want)
{
	if (c->cap >= want)
		return true;
	/* Grows as bytes arrive, so that a header alone cannot make the server allocate. */
	size_t cap = c->cap * 4 < want ? c->cap * 4 : want;
	uint8_t *p = realloc(c->buf, cap);
	if (p == NULL)
		return false;
	c->buf = p;
	c->cap = cap;
	return true;
}

/*
 * Reads one whole frame into the buffer: its envelope's length, or -1 when the connection ends
 * (closed, broken, a bad header, a frame that stalls).
 */
static int64_t conn_read_frame(struct rpc_conn *c)
{
	while (c->have < RPC_FRAME_HEADER_BYTES) {
		/* Between frames a connection may stay idle for as long as its client likes. */
		nng_duration t = c->have == 0 ? NNG_DURATION_INFINITE : RPC_FRAME_TIMEOUT_MS;
		if (conn_read(c, t) != 0)
			return -1;
	}
	int64_t len = rpc_frame_decode(c->buf);
	if (len < 0) {
		log_debug("rpc %s: a frame with a bad header or over %d bytes; closing its "
		          "connection",
		          c->server->url, RPC_MAX_MESSAGE_BYTES);
		return -1;
	}
	size_t total = RPC_FRAME_HEADER_BYTES + (size_t)len;
	nng_time deadline = nng_clock() + RPC_FRAME_TIMEOUT_MS;
	while (c->have < total) {
		nng_time now = nng_clock();
		if (now >= deadline || !conn_reserve(c, total) ||
		    conn_read(c, (nng_duration)(deadline - now)) != 0)
			return -1;
	}
	return len;
}

/* Frees a connection and closes its stream. */
static void conn_free(struct rpc_conn *c)
{
	nng_stream_free(c->stream);
	if (c->aio != NULL)
		nng_aio_free(c->aio);
	free(c->buf);
	free(c);
}

static void conn_close(struct rpc_conn *c)
{
	struct rpc_server *s = c->server;
	pthread_mutex_lock(&s->lock);
	if (c->prev != NULL)
		c->prev->next = c->next;
	else
		s->conns = c->next;
	if (c->next != NULL)
		c->next->prev = c->prev;
	pthread_mutex_unlock(&s->lock);
	conn_free(c);
	pthread_mutex_lock(&s->lock);
	if (--s->threads == 0)
		pthread_cond_broadcast(&s->idle);
	pthread_mutex_unlock(&s->lock);
}

static void *conn_main(void *arg)
{
	struct rpc_conn *c = arg;
	for (;;) {
		int64_t len = conn_read_frame(c);
		if (len < 0)
			break;
		size_t reply_len = 0;
		uint8_t *reply = rpc_dispatch(c->server, c->buf + RPC_FRAME_HEADER_BYTES,
		                              (size_t)len, &reply_len);
		if (reply == NULL)
			break;
		int rv = conn_write(c, reply, reply_len);
		free(reply);
		if (rv != 0)
			break;
		/* A client that sent its next frame early: keep those bytes. */
		size_t used = RPC_FRAME_HEADER_BYTES + (size_t)len;
		memmove(c->buf, c->buf + used, c->have - used);
		c->have -= used;
		if (c->cap > CONN_BUFFER_BYTES && c->have <= CONN_BUFFER_BYTES) {
			uint8_t *p = realloc(c->buf, CONN_BUFFER_BYTES);
			if (p != NULL) {
				c->buf = p;
				c->cap = CONN_BUFFER_BYTES;
			}
		}
	}
	conn_close(c);
	return NULL;
}

/* Starts a thread for a connection just accepted; closes it when that cannot be. */
static void conn_start(struct rpc_server *s, nng_stream *stream)
{
	struct rpc_conn *c = calloc(1, sizeof(*c));
	if (c == NULL) {
		nng_stream_free(stream);
		return;
	}
	c->server = s;
	c->stream = stream;
	c->fd = strncmp(s->url, "tcp://", 6) == 0 ? stream_socket(stream) : -1;
	c->buf = malloc(CONN_BUFFER_BYTES);
	c->cap = CONN_BUFFER_BYTES;
	if (c->buf == NULL || nng_aio_alloc(&c->aio, NULL, NULL) != 0) {
		conn_free(c);
		return;
	}
	/* Replies are single small writes that must not wait for Nagle's timer. */
	nng_stream_set_bool(stream, NNG_OPT_TCP_NODELAY, true);
	pthread_mutex_lock(&s->lock);
	bool refuse = s->stopping || s->threads >= RPC_MAX_CONNECTIONS;
	pthread_t t;
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	if (!refuse && pthread_create(&t, &attr, conn_main, c) == 0) {
		c->next = s->conns;
		if (s->conns != NULL)
			s->conns->prev = c;
		s->conns = c;
		s->threads++;
	} else {
		if (!s->stopping)
			log_warn("rpc %s: %d connections are open already; closing a new one",
			         s->url, s->threads);
		refuse = true;
	}
	pthread_attr_destroy(&attr);
	pthread_mutex_unlock(&s->lock);
	if (refuse)
		conn_free(c);
}

static void accept_cb(void *arg)
{
	struct rpc_server *s = arg;
	int rv = nng_aio_result(s->accept);
	if (rv == 0)
		conn_start(s, nng_aio_get_output(s->accept, 0));
	if (rv == NNG_ECLOSED || rv == NNG_ECANCELED)
		return;
	pthread_mutex_lock(&s->lock);
	bool stopping = s->stopping;
	pthread_mutex_unlock(&s->lock);
	if (!stopping)
		nng_stream_listener_accept(s->listener, s->accept);
}

int rpc_server_start(struct rpc_server **out, const char *url,
                     const ProtobufCServiceDescriptor *svc, const rpc_handler *handlers,
                     void *state, const char *token, char *bound_url, struct status *st)
{
	struct rpc_server *s = calloc(1, sizeof(*s));
	if (s == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	snprintf(s->token, sizeof(s->token), "%s", token ? token : "");
	snprintf(s->url, sizeof(s->url), "%s", url);
	s->svc = svc;
	s->handlers = handlers;
	s->state = state;
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->idle, NULL);
	if (tls_stream_listener_create(&s->listener, url, st) != ST_OK)
		goto free_server;
	int rv = nng_stream_listener_listen(s->listener);
	if (rv != 0) {
		status_set(st, ST_UNAVAILABLE, "cannot listen on %s: %s", url, nng_strerror(rv));
		goto free_listener;
	}
	if (nng_aio_alloc(&s->accept, accept_cb, s) != 0) {
		status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		goto free_listener;
	}
	if (bound_url != NULL) {
		tls_stream_bound_url(bound_url, url, s->listener);
		snprintf(s->url, sizeof(s->url), "%s", bound_url);
	}
	nng_stream_listener_accept(s->listener, s->accept);
	*out = s;
	return ST_OK;
free_listener:
	nng_stream_listener_free(s->listener);
free_server:
	pthread_cond_destroy(&s->idle);
	pthread_mutex_destroy(&s->lock);
	free(s);
	return st->code;
}

void rpc_server_stop(struct rpc_server *s)
{
	if (s == NULL)
		return;
	pthread_mutex_lock(&s->lock);
	s->stopping = true;
	pthread_mutex_unlock(&s->lock);
	nng_stream_listener_close(s->listener);
	nng_aio_stop(s->accept);
	/* Ends every connection's wait for its next frame; a handler running finishes first. */
	pthread_mutex_lock(&s->lock);
	for (struct rpc_conn *c = s->conns; c != NULL; c = c->next) {
		nng_aio_cancel(c->aio);
		if (c->fd >= 0)
			nng_stream_close(c->stream); /* wakes its thread's poll */
	}
	while (s->threads > 0)
		pthread_cond_wait(&s->idle, &s->lock);
	pthread_mutex_unlock(&s->lock);
	nng_aio_free(s->accept);
	nng_stream_listener_free(s->listener);
	pthread_cond_destroy(&s->idle);
	pthread_mutex_destroy(&s->lock);
	free(s);
}
