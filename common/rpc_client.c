/*
 * The calling half of the RPC layer. A call is a small state machine (dial, pause between
 * dials, send, receive) over one nng aio at a time, which the calling thread waits on (no
 * thread hand-off beyond the one nng's poller makes; none when the bytes are in already). Only
 * a call that must first wait for its peer to listen has its dials driven by nng's threads, so
 * that starting it does not block.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>

#include "clock.h"
#include "log.h"
#include "podemu.pb-c.h"
#include "rpc.h"
#include "tls.h"
#include "token.h"

/* A reply is first read into this much; a larger one gets a buffer of its size. */
#define CALL_BUFFER_BYTES (16 * 1024)
/* Idle connections a client keeps; more are closed when their call ends. */
#define CLIENT_IDLE_MAX 8
/* How long a waiting client pauses between two dials that found no listener. */
#define REDIAL_MS 50
/* How long rpc_client_open's first dial may take. */
#define OPEN_TIMEOUT_MS 10000

struct rpc_client {
	char url[256];
	char token[TOKEN_MAX + 1];
	/*
	 * Made at open, where it checks the URL and the TLS identity; it dials only there (each
	 * call dials with its own). It lives as long as the client: freed at open instead, a
	 * cached step on 1x8 took 50-60 us more (nng 1.5; why, not found).
	 */
	nng_stream_dialer *dialer;
	bool wait;
	bool tls; /* receives run on nng's threads: a cancelled TLS receive loses its bytes */
	pthread_mutex_t lock;
	nng_stream *idle[CLIENT_IDLE_MAX];
	int num_idle;
};

static int status_from_nng(struct status *st, int rv, const char *what, const char *url)
{
	if (rv == NNG_ETIMEDOUT)
		return status_set(st, ST_DEADLINE_EXCEEDED, "%s %s: deadline exceeded", what, url);
	return status_set(st, ST_UNAVAILABLE, "%s %s: %s", what, url, nng_strerror(rv));
}

static bool pool_take(struct rpc_client *c, nng_stream **s)
{
	pthread_mutex_lock(&c->lock);
	bool got = c->num_idle > 0;
	if (got)
		*s = c->idle[--c->num_idle];
	pthread_mutex_unlock(&c->lock);
	return got;
}

/* Keeps s for a later call; false (s still the caller's) when enough are kept already. */
static bool pool_put(struct rpc_client *c, nng_stream *s)
{
	pthread_mutex_lock(&c->lock);
	bool kept = c->num_idle < CLIENT_IDLE_MAX;
	if (kept)
		c->idle[c->num_idle++] = s;
	pthread_mutex_unlock(&c->lock);
	return kept;
}

static void stream_ready(nng_stream *s)
{
	/* Requests are single small writes that must not wait for Nagle's timer. */
	nng_stream_set_bool(s, NNG_OPT_TCP_NODELAY, true);
}

/*
 * A finished dial's outcome: 0 with *s the connection, or nng's error. A dial reported done
 * without a stream (nng 1.5 did, on a dialer whose earlier dial a deadline cut short) counts
 * as refused.
 */
static int dial_outcome(nng_aio *aio, nng_stream **s)
{
	int rv = nng_aio_result(aio);
	*s = rv == 0 ? nng_aio_get_output(aio, 0) : NULL;
	if (rv != 0)
		return rv;
	if (*s == NULL)
		return NNG_ECONNREFUSED;
	stream_ready(*s);
	return 0;
}

int rpc_client_open(struct rpc_client **out, const char *url, bool wait, struct status *st)
{
	struct rpc_client *c = calloc(1, sizeof(*c));
	if (c == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	snprintf(c->url, sizeof(c->url), "%s", url);
	c->wait = wait;
	c->tls = strncmp(url, "tls+", 4) == 0;
	if (tls_stream_dialer_create(&c->dialer, url, st) != ST_OK) {
		free(c);
		return st->code;
	}
	pthread_mutex_init(&c->lock, NULL);
	int rv = 0;
	if (!wait) {
		nng_aio *aio;
		rv = nng_aio_alloc(&aio, NULL, NULL);
		if (rv == 0) {
			nng_aio_set_timeout(aio, OPEN_TIMEOUT_MS);
			nng_stream_dialer_dial(c->dialer, aio);
			nng_aio_wait(aio);
			nng_stream *s;
			if ((rv = dial_outcome(aio, &s)) == 0)
				pool_put(c, s);
			nng_aio_free(aio);
		}
	}
	if (rv != 0) {
		rpc_client_close(c);
		return status_from_nng(st, rv, "cannot connect to", url);
	}
	*out = c;
	return ST_OK;
}

void rpc_client_close(struct rpc_client *c)
{
	if (c == NULL)
		return;
	for (int i = 0; i < c->num_idle; i++)
		nng_stream_free(c->idle[i]);
	nng_stream_dialer_free(c->dialer);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

const char *rpc_client_url(const struct rpc_client *c)
{
	return c->url;
}

void rpc_client_set_token(struct rpc_client *c, const char *token)
{
	snprintf(c->token, sizeof(c->token), "%s", token ? token : "");
}

void rpc_cancel_init(struct rpc_cancel *c)
{
	memset(c, 0, sizeof(*c));
	pthread_mutex_init(&c->lock, NULL);
}

void rpc_cancel_destroy(struct rpc_cancel *c)
{
	pthread_mutex_destroy(&c->lock);
}

void rpc_cancel_fire(struct rpc_cancel *c, const char *reason)
{
	pthread_mutex_lock(&c->lock);
	if (!c->fired) {
		c->fired = 1;
		snprintf(c->reason, sizeof(c->reason), "%s", reason);
	}
	if (c->aio != NULL)
		nng_aio_cancel(c->aio);
	pthread_mutex_unlock(&c->lock);
}

static void cancel_detach(struct rpc_cancel *cancel)
{
	if (cancel == NULL)
		return;
	pthread_mutex_lock(&cancel->lock);
	cancel->aio = NULL;
	pthread_mutex_unlock(&cancel->lock);
}

enum call_stage { CALL_DIAL, CALL_PAUSE, CALL_SEND, CALL_RECV, CALL_OVER };

struct rpc_async {
	struct rpc_client *c;
	const ProtobufCMethodDescriptor *m;
	int timeout_ms; /* < 0: none */
	nng_time deadline;
	struct rpc_cancel *cancel;
	nng_aio *sync_aio; /* waited on by the calling thread */
	nng_aio *cb_aio;   /* nng's threads drive the call through it (call_apart) */
	nng_aio *aio;      /* the one in use */
	enum call_stage stage;
	/*
	 * The call's own dialer, made at its first dial. With one per client, a dial that a
	 * call's deadline cut short broke the next call's dial on it (nng 1.5 panicked on an aio
	 * assertion, or reported a dial done without a stream): agents whose heartbeats timed out
	 * while their coordinator restarted died.
	 */
	nng_stream_dialer *dialer;
	nng_stream *stream; /* the call's connection (closed, not freed, when it failed) */
	nng_stream *broken; /* an idle connection that broke: freed by rpc_finish */
	bool reused;        /* stream served an earlier call */
	uint8_t *req;       /* the request's frame */
	size_t req_len, sent;
	uint8_t *resp;              /* the reply's frame as it arrives */
	size_t resp_cap, got, want; /* want: 0 until the header is in */
	int rv;                     /* nng's error once over, or 0 */
	bool malformed;             /* the reply broke the framing */
	/* Clear while nng's threads drive the call (call_apart). */
	pthread_mutex_t lock;
	pthread_cond_t cv;
	bool handed_back;
};

static void call_fail(struct rpc_async *x, int rv)
{
	x->rv = rv;
	if (x->stream != NULL)
		nng_stream_close(x->stream);
	x->stage = CALL_OVER;
}

/*
 * The connection failed with rv. An idle connection kept from an earlier call that fails
 * before any byte of the reply came back is one the peer closed meanwhile (it restarted): the
 * call dials again, once.
 */
static void call_broken(struct rpc_async *x, int rv)
{
	if (!x->reused || x->got > 0 || rv == NNG_ECANCELED || rv == NNG_ETIMEDOUT) {
		call_fail(x, rv);
		return;
	}
	nng_stream_close(x->stream);
	x->broken = x->stream;
	x->stream = NULL;
	x->reused = false;
	x->stage = CALL_DIAL;
}

/* Makes the call's own dialer; false (x->rv set) when it cannot. */
static bool call_dialer(struct rpc_async *x)
{
	struct status st;
	if (tls_stream_dialer_create(&x->dialer, x->c->url, &st) == ST_OK)
		return true;
	x->dialer = NULL;
	x->rv = NNG_EADDRINVAL;
	return false;
}

/*
 * Starts the current stage's operation on x->aio, for at most bound_ms when that is positive;
 * false (x->rv set) when it cannot start.
 */
static bool call_issue(struct rpc_async *x, nng_duration bound_ms)
{
	nng_duration t = NNG_DURATION_INFINITE;
	if (x->timeout_ms >= 0) {
		nng_time now = nng_clock();
		if (now >= x->deadline) {
			x->rv = NNG_ETIMEDOUT;
			return false;
		}
		t = (nng_duration)(x->deadline - now);
	}
	if (bound_ms > 0 && (t == NNG_DURATION_INFINITE || bound_ms < t))
		t = bound_ms;
	if (x->stage == CALL_DIAL && x->dialer == NULL && !call_dialer(x))
		return false;
	nng_aio_set_timeout(x->aio, t);
	if (x->cancel != NULL) {
		/* Under the lock, so that a cancel either sees this operation or came first. */
		pthread_mutex_lock(&x->cancel->lock);
		if (x->cancel->fired) {
			pthread_mutex_unlock(&x->cancel->lock);
			x->rv = NNG_ECANCELED;
			return false;
		}
		x->cancel->aio = x->aio;
	}
	nng_iov iov;
	switch (x->stage) {
	case CALL_DIAL:
		nng_stream_dialer_dial(x->dialer, x->aio);
		break;
	case CALL_PAUSE:
		nng_sleep_aio(t == NNG_DURATION_INFINITE || t > REDIAL_MS ? REDIAL_MS : t, x->aio);
		break;
	case CALL_SEND:
		iov = (nng_iov){x->req + x->sent, x->req_len - x->sent};
		nng_aio_set_iov(x->aio, 1, &iov);
		nng_stream_send(x->stream, x->aio);
		break;
	case CALL_RECV:
		iov = (nng_iov){x->resp + x->got, (x->want ? x->want : x->resp_cap) - x->got};
		nng_aio_set_iov(x->aio, 1, &iov);
		nng_stream_recv(x->stream, x->aio);
		break;
	case CALL_OVER:
		break;
	}
	if (x->cancel != NULL)
		pthread_mutex_unlock(&x->cancel->lock);
	return true;
}

/* The reply's bytes so far: reads on, or ends the call. */
static void call_received(struct rpc_async *x, size_t n)
{
	x->got += n;
	if (x->want == 0 && x->got >= RPC_FRAME_HEADER_BYTES) {
		int64_t len = rpc_frame_decode(x->resp);
		if (len < 0) {
			x->malformed = true;
			call_fail(x, NNG_EPROTO);
			return;
		}
		x->want = RPC_FRAME_HEADER_BYTES + (size_t)len;
		if (x->want > x->resp_cap) {
			uint8_t *p = realloc(x->resp, x->want);
			if (p == NULL) {
				call_fail(x, NNG_ENOMEM);
				return;
			}
			x->resp = p;
			x->resp_cap = x->want;
		}
	}
	if (x->want != 0 && x->got > x->want) {
		x->malformed = true; /* more than one reply to one request */
		call_fail(x, NNG_EPROTO);
	} else if (x->want != 0 && x->got == x->want) {
		if (pool_put(x->c, x->stream))
			x->stream = NULL; /* else rpc_finish frees it */
		x->rv = 0;
		x->stage = CALL_OVER;
	}
}

/* The current operation completed: moves the call to its next stage. */
static void call_advance(struct rpc_async *x)
{
	int rv = nng_aio_result(x->aio);
	size_t n = nng_aio_count(x->aio);
	switch (x->stage) {
	case CALL_DIAL:
		if ((rv = dial_outcome(x->aio, &x->stream)) == 0) {
			x->sent = 0;
			x->stage = CALL_SEND;
		} else if (x->c->wait && rv != NNG_ECANCELED && rv != NNG_ETIMEDOUT) {
			x->stage = CALL_PAUSE;
		} else {
			call_fail(x, rv);
		}
		break;
	case CALL_PAUSE:
		if (rv == 0)
			x->stage = CALL_DIAL;
		else
			call_fail(x, rv);
		break;
	case CALL_SEND:
		if (rv != 0) {
			call_broken(x, rv);
		} else if ((x->sent += n) == x->req_len) {
			x->got = 0;
			x->want = 0;
			x->stage = CALL_RECV;
		}
		break;
	case CALL_RECV:
		if (rv == 0 && n == 0)
			rv = NNG_ECONNSHUT;
		if (rv != 0)
			call_broken(x, rv);
		else
			call_received(x, n);
		break;
	case CALL_OVER:
		break;
	}
}

/* cb_aio's callback: nng's threads drive the call until the caller can take over. */
static void call_cb(void *arg)
{
	struct rpc_async *x = arg;
	call_advance(x);
	if (x->stage != CALL_OVER && (x->stage != CALL_RECV || x->c->tls)) {
		if (call_issue(x, 0))
			return;
		call_fail(x, x->rv);
	}
	pthread_mutex_lock(&x->lock);
	x->handed_back = true;
	pthread_cond_signal(&x->cv);
	pthread_mutex_unlock(&x->lock);
}

/*
 * Leaves the call to nng's threads, until it has sent its request (a waiting client's call
 * that must dial) or is over (a TLS client's receive). The caller then neither blocks on a
 * peer that is not up yet nor bounds an operation by its own wait by cancelling it: nng 1.5
 * panics when a dial is cancelled and issued again at once, and its TLS stream keeps the bytes
 * of a cancelled receive from the next one.
 */
static void call_apart(struct rpc_async *x)
{
	if (x->cb_aio == NULL && nng_aio_alloc(&x->cb_aio, call_cb, x) != 0) {
		call_fail(x, NNG_ENOMEM);
		return;
	}
	pthread_mutex_lock(&x->lock);
	x->handed_back = false;
	pthread_mutex_unlock(&x->lock);
	x->aio = x->cb_aio;
	if (call_issue(x, 0))
		return; /* nng's threads own it until handed_back */
	call_fail(x, x->rv);
	x->handed_back = true;
}

/*
 * The operation just waited for ended by the caller's own bound, not by the call's deadline or
 * its cancel, with nothing transferred: the call stays where it was.
 */
static bool call_held(struct rpc_async *x)
{
	int rv = nng_aio_result(x->aio);
	if ((rv != NNG_ETIMEDOUT && rv != NNG_ECANCELED) || nng_aio_count(x->aio) != 0)
		return false;
	if (x->timeout_ms >= 0 && nng_clock() >= x->deadline)
		return false;
	if (x->cancel == NULL)
		return true;
	pthread_mutex_lock(&x->cancel->lock);
	bool fired = x->cancel->fired;
	pthread_mutex_unlock(&x->cancel->lock);
	return !fired;
}

/*
 * Drives the call on this thread until it reaches stage until, or is over, or (wait_ms >= 0)
 * wait_ms have passed while it sends or receives: false then. A waiting client's dial and a
 * TLS client's receive go to nng's threads (call_apart; true, the call not over). With
 * wait_ms 0 a send or receive is tried once at once: a reply already in is read without any
 * wait. Dials are never bounded.
 */
static bool call_run(struct rpc_async *x, enum call_stage until, int wait_ms)
{
	nng_time by = wait_ms > 0 ? nng_clock() + (nng_time)wait_ms : 0;
	x->aio = x->sync_aio;
	while (x->stage != CALL_OVER && x->stage != until) {
		if ((x->stage == CALL_DIAL && x->c->wait) || (x->stage == CALL_RECV && x->c->tls)) {
			call_apart(x);
			return true;
		}
		bool bounded = wait_ms >= 0 && (x->stage == CALL_SEND || x->stage == CALL_RECV);
		nng_duration bound = 0;
		if (bounded) {
			nng_time now = nng_clock();
			bound = by > now ? (nng_duration)(by - now) : 0;
		}
		if (!call_issue(x, bound)) {
			call_fail(x, x->rv);
			break;
		}
		if (bounded && bound == 0)
			nng_aio_cancel(x->aio); /* what the operation did at once stands */
		nng_aio_wait(x->aio);
		if (bounded && call_held(x))
			return false;
		call_advance(x);
	}
	return true;
}

static void call_free(struct rpc_async *x)
{
	cancel_detach(x->cancel);
	nng_aio_free(x->sync_aio);
	nng_aio_free(x->cb_aio);
	if (x->stream != NULL)
		nng_stream_free(x->stream);
	if (x->broken != NULL)
		nng_stream_free(x->broken);
	if (x->dialer != NULL)
		nng_stream_dialer_free(x->dialer);
	free(x->req);
	free(x->resp);
	pthread_cond_destroy(&x->cv);
	pthread_mutex_destroy(&x->lock);
	free(x);
}

/* The call's outcome as a status; the reply envelope is decoded into a. */
static int call_status(struct rpc_async *x, struct arena *a, void **reply, struct status *st)
{
	const ProtobufCMethodDescriptor *m = x->m;
	const char *url = x->c->url;
	if (x->rv == NNG_ECANCELED && x->cancel != NULL && x->cancel->fired)
		return status_set(st, ST_UNAVAILABLE, "%s", x->cancel->reason);
	if (x->rv == NNG_ETIMEDOUT)
		return status_set(st, ST_DEADLINE_EXCEEDED,
		                  "%s to %s: no reply within %d ms (is the peer running?)", m->name,
		                  url, x->timeout_ms);
	if (x->malformed)
		return status_set(st, ST_INTERNAL, "malformed reply to %s from %s", m->name, url);
	if (x->rv != 0)
		return status_from_nng(st, x->rv, m->name, url);
	Podemu__RpcResponse *resp = podemu__rpc_response__unpack(arena_protobuf_allocator(a),
	                                                         x->got - RPC_FRAME_HEADER_BYTES,
	                                                         x->resp + RPC_FRAME_HEADER_BYTES);
	if (resp == NULL)
		return status_set(st, ST_INTERNAL, "malformed reply to %s from %s", m->name, url);
	if (resp->code != ST_OK)
		return status_set(st, resp->code, "%s", resp->message);
	void *decoded = protobuf_c_message_unpack(m->output, arena_protobuf_allocator(a),
	                                          resp->payload.len, resp->payload.data);
	if (decoded == NULL)
		return status_set(st, ST_INTERNAL, "malformed %s reply from %s", m->name, url);
	*reply = decoded;
	status_clear(st);
	return ST_OK;
}

/* The request's frame, malloc'd; NULL with st set. */
static uint8_t *request_frame(struct rpc_client *c, const ProtobufCMethodDescriptor *m,
                              unsigned method, const void *request, size_t *len, struct status *st)
{
	Podemu__RpcRequest env = PODEMU__RPC_REQUEST__INIT;
	env.method = method;
	env.token.data = (uint8_t *)c->token;
	env.token.len = strlen(c->token);
	size_t payload = protobuf_c_message_get_packed_size(request);
	if (payload + 64 > RPC_MAX_MESSAGE_BYTES) {
		status_set(st, ST_INVALID_ARGUMENT,
		           "%s request of %zu bytes exceeds the %d-byte message limit", m->name,
		           payload, RPC_MAX_MESSAGE_BYTES);
		return NULL;
	}
	uint8_t *packed = malloc(payload ? payload : 1);
	if (packed == NULL) {
		status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		return NULL;
	}
	env.payload.data = packed;
	env.payload.len = protobuf_c_message_pack(request, packed);
	size_t env_len = podemu__rpc_request__get_packed_size(&env);
	uint8_t *frame = malloc(RPC_FRAME_HEADER_BYTES + env_len);
	if (frame != NULL) {
		rpc_frame_encode(frame, (uint32_t)env_len);
		podemu__rpc_request__pack(&env, frame + RPC_FRAME_HEADER_BYTES);
		*len = RPC_FRAME_HEADER_BYTES + env_len;
	} else {
		status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	}
	free(packed);
	return frame;
}

struct rpc_async *rpc_start(struct rpc_client *c, const ProtobufCServiceDescriptor *svc,
                            unsigned method, const void *request, struct arena *a, int timeout_ms,
                            struct rpc_cancel *cancel, struct status *st)
{
	if (method >= svc->n_methods) {
		status_set(st, ST_INTERNAL, "%s has no method %u", svc->name, method);
		return NULL;
	}
	struct rpc_async *x = calloc(1, sizeof(*x));
	if (x == NULL) {
		status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		return NULL;
	}
	*x = (struct rpc_async){.c = c,
	                        .m = &svc->methods[method],
	                        .timeout_ms = timeout_ms,
	                        .deadline = nng_clock() + (timeout_ms > 0 ? timeout_ms : 0),
	                        .cancel = cancel};
	pthread_mutex_init(&x->lock, NULL);
	pthread_cond_init(&x->cv, NULL);
	x->req = request_frame(c, x->m, method, request, &x->req_len, st);
	if (x->req == NULL) {
		call_free(x);
		return NULL;
	}
	x->resp = malloc(CALL_BUFFER_BYTES);
	x->resp_cap = CALL_BUFFER_BYTES;
	x->reused = pool_take(c, &x->stream);
	x->stage = x->reused ? CALL_SEND : CALL_DIAL;
	x->handed_back = true;
	if (x->resp == NULL || nng_aio_alloc(&x->sync_aio, NULL, NULL) != 0) {
		call_free(x);
		status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		return NULL;
	}
	/*
	 * The request goes out on this thread, which costs no hand-off when the socket takes it at
	 * once; a waiting client's dials are left to nng's threads (call_apart).
	 */
	call_run(x, CALL_RECV, -1);
	if (!x->handed_back)
		return x;
	if (x->stage == CALL_OVER) {
		void *unused;
		call_status(x, a, &unused, st);
		call_free(x);
		return NULL;
	}
	return x;
}

int rpc_finish(struct rpc_async *x, struct arena *a, void **reply, struct status *st)
{
	int rv = call_status(x, a, reply, st);
	call_free(x);
	return rv;
}

/* Waits up to wait_ms (< 0: as long as it takes) for nng's threads to hand the call back. */
static bool call_handed_back(struct rpc_async *x, int wait_ms)
{
	struct timespec by = clock_deadline_ms(wait_ms > 0 ? wait_ms : 0);
	pthread_mutex_lock(&x->lock);
	while (!x->handed_back && wait_ms != 0)
		if (wait_ms < 0)
			pthread_cond_wait(&x->cv, &x->lock);
		else if (pthread_cond_timedwait(&x->cv, &x->lock, &by) != 0)
			break;
	bool back = x->handed_back;
	pthread_mutex_unlock(&x->lock);
	return back;
}

bool rpc_poll(struct rpc_async *x, int wait_ms)
{
	/* Again after call_run left the call to nng's threads (x is not to be looked at then). */
	for (;;) {
		if (!call_handed_back(x, wait_ms))
			return false;
		if (x->stage == CALL_OVER)
			return true;
		if (!call_run(x, CALL_OVER, wait_ms))
			return false;
	}
}

int rpc_wait(struct rpc_async *x, struct arena *a, void **reply, struct status *st)
{
	rpc_poll(x, -1);
	return rpc_finish(x, a, reply, st);
}

int rpc_call(struct rpc_client *c, const ProtobufCServiceDescriptor *svc, unsigned method,
             const void *request, struct arena *a, void **reply, int timeout_ms, struct status *st)
{
	return rpc_call_cancellable(c, svc, method, request, a, reply, timeout_ms, NULL, st);
}

int rpc_call_cancellable(struct rpc_client *c, const ProtobufCServiceDescriptor *svc,
                         unsigned method, const void *request, struct arena *a, void **reply,
                         int timeout_ms, struct rpc_cancel *cancel, struct status *st)
{
	struct rpc_async *x = rpc_start(c, svc, method, request, a, timeout_ms, cancel, st);
	return x != NULL ? rpc_wait(x, a, reply, st) : st->code;
}
