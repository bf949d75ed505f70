#include "rpc.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>

#include "log.h"
#include "podemu.pb-c.h"
#include "tls.h"
#include "token.h"

struct rpc_worker {
	struct rpc_server *server;
	pthread_t thread;
	nng_ctx ctx;
	nng_aio *aio;
};

struct rpc_server {
	nng_socket sock;
	char token[TOKEN_MAX + 1]; /* "" when none is required */
	const ProtobufCServiceDescriptor *svc;
	const rpc_handler *handlers;
	void *state;
	int num_workers;
	struct rpc_worker *workers;
};

struct rpc_client {
	nng_socket sock;
	char url[256];
	char token[TOKEN_MAX + 1];
};

static int status_from_nng(struct status *st, int rv, const char *what, const char *url)
{
	if (rv == NNG_ETIMEDOUT)
		return status_set(st, ST_DEADLINE_EXCEEDED, "%s %s: deadline exceeded", what, url);
	return status_set(st, ST_UNAVAILABLE, "%s %s: %s", what, url, nng_strerror(rv));
}

/*
 * Decodes one request envelope, runs the handler, and encodes the reply envelope into *out.
 * Malformed input yields an error reply, never a crash.
 */
static nng_msg *rpc_dispatch(struct rpc_server *s, nng_msg *req)
{
	struct status st;
	status_clear(&st);
	struct arena *a = arena_new();
	Podemu__RpcResponse resp = PODEMU__RPC_RESPONSE__INIT;
	void *reply = NULL;
	const ProtobufCMethodDescriptor *m = NULL;
	nng_msg *out = NULL;
	if (a == NULL) {
		status_set(&st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		goto respond;
	}
	Podemu__RpcRequest *env = podemu__rpc_request__unpack(arena_protobuf_allocator(a),
	                                                      nng_msg_len(req), nng_msg_body(req));
	if (env == NULL) {
		status_set(&st, ST_INVALID_ARGUMENT, "malformed RPC envelope (%zu bytes)",
		           nng_msg_len(req));
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
	if (nng_msg_alloc(&out, len) == 0)
		podemu__rpc_response__pack(&resp, nng_msg_body(out));
	arena_free(a);
	return out;
}

static void *rpc_worker_main(void *arg)
{
	struct rpc_worker *w = arg;
	for (;;) {
		nng_ctx_recv(w->ctx, w->aio);
		nng_aio_wait(w->aio);
		int rv = nng_aio_result(w->aio);
		if (rv == NNG_ECLOSED || rv == NNG_ECANCELED)
			break;
		if (rv != 0)
			continue;
		nng_msg *req = nng_aio_get_msg(w->aio);
		nng_msg *resp = rpc_dispatch(w->server, req);
		nng_msg_free(req);
		if (resp == NULL)
			continue;
		nng_aio_set_msg(w->aio, resp);
		nng_ctx_send(w->ctx, w->aio);
		nng_aio_wait(w->aio);
		rv = nng_aio_result(w->aio);
		if (rv != 0)
			nng_msg_free(resp);
		if (rv == NNG_ECLOSED)
			break;
	}
	return NULL;
}

int rpc_server_start(struct rpc_server **out, const char *url,
                     const ProtobufCServiceDescriptor *svc, const rpc_handler *handlers,
                     void *state, int workers, const char *token, char *bound_url,
                     struct status *st)
{
	struct rpc_server *s = calloc(1, sizeof(*s));
	if (s == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	snprintf(s->token, sizeof(s->token), "%s", token ? token : "");
	s->svc = svc;
	s->handlers = handlers;
	s->state = state;
	int rv = nng_rep0_open(&s->sock);
	if (rv != 0) {
		free(s);
		return status_from_nng(st, rv, "cannot open socket for", url);
	}
	nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, RPC_MAX_MESSAGE_BYTES);
	nng_listener l;
	if (tls_listener_create(&l, s->sock, url, st) != ST_OK) {
		nng_close(s->sock);
		free(s);
		return st->code;
	}
	rv = nng_listener_start(l, 0);
	if (rv != 0) {
		nng_close(s->sock);
		free(s);
		return status_from_nng(st, rv, "cannot listen on", url);
	}
	if (bound_url != NULL)
		tls_bound_url(bound_url, url, l);
	s->workers = calloc((size_t)workers, sizeof(*s->workers));
	if (s->workers == NULL) {
		nng_close(s->sock);
		free(s);
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	}
	for (int i = 0; i < workers; i++) {
		struct rpc_worker *w = &s->workers[i];
		w->server = s;
		if (nng_ctx_open(&w->ctx, s->sock) != 0 || nng_aio_alloc(&w->aio, NULL, NULL) != 0)
			break;
		if (pthread_create(&w->thread, NULL, rpc_worker_main, w) != 0) {
			nng_aio_free(w->aio);
			nng_ctx_close(w->ctx);
			break;
		}
		s->num_workers++;
	}
	if (s->num_workers == 0) {
		rpc_server_stop(s);
		return status_set(st, ST_RESOURCE_EXHAUSTED, "cannot start RPC workers");
	}
	*out = s;
	return ST_OK;
}

void rpc_server_stop(struct rpc_server *s)
{
	if (s == NULL)
		return;
	for (int i = 0; i < s->num_workers; i++)
		nng_aio_stop(s->workers[i].aio);
	nng_close(s->sock);
	for (int i = 0; i < s->num_workers; i++) {
		pthread_join(s->workers[i].thread, NULL);
		nng_aio_free(s->workers[i].aio);
	}
	free(s->workers);
	free(s);
}

int rpc_client_open(struct rpc_client **out, const char *url, bool wait, struct status *st)
{
	struct rpc_client *c = calloc(1, sizeof(*c));
	if (c == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	snprintf(c->url, sizeof(c->url), "%s", url);
	int rv = nng_req0_open(&c->sock);
	if (rv != 0) {
		free(c);
		return status_from_nng(st, rv, "cannot open socket for", url);
	}
	nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, RPC_MAX_MESSAGE_BYTES);
	/* A request is never resent: a slow step must not run twice. */
	nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
	nng_socket_set_ms(c->sock, NNG_OPT_RECONNMINT, 50);
	nng_socket_set_ms(c->sock, NNG_OPT_RECONNMAXT, 1000);
	nng_dialer d;
	if (tls_dialer_create(&d, c->sock, url, st) != ST_OK) {
		nng_close(c->sock);
		free(c);
		return st->code;
	}
	rv = nng_dialer_start(d, wait ? NNG_FLAG_NONBLOCK : 0);
	if (rv != 0) {
		nng_close(c->sock);
		free(c);
		return status_from_nng(st, rv, "cannot connect to", url);
	}
	*out = c;
	return ST_OK;
}

void rpc_client_close(struct rpc_client *c)
{
	if (c == NULL)
		return;
	nng_close(c->sock);
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

/* Registers aio with cancel (or fails if it already fired). */
static int cancel_attach(struct rpc_cancel *cancel, nng_aio *aio)
{
	if (cancel == NULL)
		return 0;
	pthread_mutex_lock(&cancel->lock);
	int fired = cancel->fired;
	if (!fired)
		cancel->aio = aio;
	pthread_mutex_unlock(&cancel->lock);
	return fired;
}

static void cancel_detach(struct rpc_cancel *cancel)
{
	if (cancel == NULL)
		return;
	pthread_mutex_lock(&cancel->lock);
	cancel->aio = NULL;
	pthread_mutex_unlock(&cancel->lock);
}

int rpc_call(struct rpc_client *c, const ProtobufCServiceDescriptor *svc, unsigned method,
             const void *request, struct arena *a, void **reply, int timeout_ms, struct status *st)
{
	return rpc_call_cancellable(c, svc, method, request, a, reply, timeout_ms, NULL, st);
}

struct rpc_async {
	struct rpc_client *c;
	const ProtobufCMethodDescriptor *m;
	nng_ctx ctx;
	nng_aio *aio;
	int timeout_ms;
	struct rpc_cancel *cancel;
	bool sent;
	int rv;        /* nng's result once done */
	nng_msg *resp; /* the reply's message once done */
	void (*done)(void *arg);
	void *arg;
	/* For rpc_wait: set once the call is over. */
	pthread_mutex_t lock;
	pthread_cond_t cv;
	bool over;
};

static void async_free(struct rpc_async *x)
{
	pthread_cond_destroy(&x->cv);
	pthread_mutex_destroy(&x->lock);
	free(x);
}

/* The call's aio completed: the request went out (then the reply is awaited), or it is over. */
static void async_cb(void *arg)
{
	struct rpc_async *x = arg;
	int rv = nng_aio_result(x->aio);
	if (!x->sent) {
		if (rv == 0) {
			x->sent = true;
			nng_ctx_recv(x->ctx, x->aio);
			return;
		}
		nng_msg_free(nng_aio_get_msg(x->aio)); /* a send that failed leaves it ours */
	} else if (rv == 0) {
		x->resp = nng_aio_get_msg(x->aio);
	}
	x->rv = rv;
	if (x->done != NULL)
		x->done(x->arg);
	pthread_mutex_lock(&x->lock);
	x->over = true;
	pthread_cond_signal(&x->cv);
	pthread_mutex_unlock(&x->lock);
}

struct rpc_async *rpc_start(struct rpc_client *c, const ProtobufCServiceDescriptor *svc,
                            unsigned method, const void *request, struct arena *a, int timeout_ms,
                            struct rpc_cancel *cancel, void (*done)(void *arg), void *arg,
                            struct status *st)
{
	if (method >= svc->n_methods) {
		status_set(st, ST_INTERNAL, "%s has no method %u", svc->name, method);
		return NULL;
	}
	const ProtobufCMethodDescriptor *m = &svc->methods[method];
	Podemu__RpcRequest env = PODEMU__RPC_REQUEST__INIT;
	env.method = method;
	env.token.data = (uint8_t *)c->token;
	env.token.len = strlen(c->token);
	env.payload.len = protobuf_c_message_get_packed_size(request);
	env.payload.data = arena_alloc(a, env.payload.len ? env.payload.len : 1);
	if (env.payload.data == NULL) {
		status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		return NULL;
	}
	protobuf_c_message_pack(request, env.payload.data);
	if (env.payload.len + 64 > RPC_MAX_MESSAGE_BYTES) {
		status_set(st, ST_INVALID_ARGUMENT,
		           "%s request of %zu bytes exceeds the %d-byte message limit", m->name,
		           env.payload.len, RPC_MAX_MESSAGE_BYTES);
		return NULL;
	}
	struct rpc_async *x = calloc(1, sizeof(*x));
	nng_msg *msg;
	if (x == NULL || nng_msg_alloc(&msg, podemu__rpc_request__get_packed_size(&env)) != 0) {
		free(x);
		status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		return NULL;
	}
	podemu__rpc_request__pack(&env, nng_msg_body(msg));
	*x = (struct rpc_async){
	    .c = c, .m = m, .timeout_ms = timeout_ms, .cancel = cancel, .done = done, .arg = arg};
	pthread_mutex_init(&x->lock, NULL);
	pthread_cond_init(&x->cv, NULL);
	int rv = nng_ctx_open(&x->ctx, c->sock);
	if (rv == 0 && (rv = nng_aio_alloc(&x->aio, async_cb, x)) != 0)
		nng_ctx_close(x->ctx);
	if (rv != 0) {
		nng_msg_free(msg);
		async_free(x);
		status_from_nng(st, rv, "cannot call", c->url);
		return NULL;
	}
	if (cancel_attach(cancel, x->aio)) {
		nng_msg_free(msg);
		nng_aio_free(x->aio);
		nng_ctx_close(x->ctx);
		async_free(x);
		status_set(st, ST_UNAVAILABLE, "%s", cancel->reason);
		return NULL;
	}
	nng_aio_set_timeout(x->aio, timeout_ms);
	nng_aio_set_msg(x->aio, msg);
	nng_ctx_send(x->ctx, x->aio);
	return x;
}

int rpc_finish(struct rpc_async *x, struct arena *a, void **reply, struct status *st)
{
	cancel_detach(x->cancel);
	nng_aio_free(x->aio);
	nng_ctx_close(x->ctx);
	int rv = x->rv;
	nng_msg *resp_msg = x->resp;
	const ProtobufCMethodDescriptor *m = x->m;
	const char *url = x->c->url;
	struct rpc_cancel *cancel = x->cancel;
	int timeout_ms = x->timeout_ms;
	async_free(x);
	if (rv == NNG_ECANCELED && cancel != NULL)
		return status_set(st, ST_UNAVAILABLE, "%s", cancel->reason);
	if (rv == NNG_ETIMEDOUT)
		return status_set(st, ST_DEADLINE_EXCEEDED,
		                  "%s to %s: no reply within %d ms (is the peer running?)", m->name,
		                  url, timeout_ms);
	if (rv != 0)
		return status_from_nng(st, rv, m->name, url);
	Podemu__RpcResponse *resp = podemu__rpc_response__unpack(
	    arena_protobuf_allocator(a), nng_msg_len(resp_msg), nng_msg_body(resp_msg));
	nng_msg_free(resp_msg);
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

int rpc_wait(struct rpc_async *x, struct arena *a, void **reply, struct status *st)
{
	pthread_mutex_lock(&x->lock);
	while (!x->over)
		pthread_cond_wait(&x->cv, &x->lock);
	pthread_mutex_unlock(&x->lock);
	return rpc_finish(x, a, reply, st);
}

int rpc_call_cancellable(struct rpc_client *c, const ProtobufCServiceDescriptor *svc,
                         unsigned method, const void *request, struct arena *a, void **reply,
                         int timeout_ms, struct rpc_cancel *cancel, struct status *st)
{
	struct rpc_async *x =
	    rpc_start(c, svc, method, request, a, timeout_ms, cancel, NULL, NULL, st);
	return x != NULL ? rpc_wait(x, a, reply, st) : st->code;
}
