#include "dataplane.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>

#include "log.h"

/* Chunk payload plus header; anything larger is refused by the receiving socket. */
#define DP_MAX_CHUNK (64u * 1024 * 1024)
#define DP_RECV_MAX (DP_MAX_CHUNK + sizeof(struct dp_header))
#define DP_INITIAL_WORKERS 8

enum { W_RECV, W_PARKED, W_SEND };

struct dp_request {
	struct dataplane *dp;
	struct dp_request *next; /* every worker, for shutdown */
	nng_ctx ctx;
	nng_aio *aio;
	nng_msg *msg;
	int state;
	struct dp_header header;
};

struct dp_peer {
	struct dp_peer *next;
	char url[256];
	nng_socket sock;
};

struct dataplane {
	nng_socket sock;
	dp_deliver_fn deliver;
	void *arg;
	pthread_mutex_t lock;
	struct dp_request *workers;
	struct dp_peer *peers;
	int stopping;
};

static void dp_worker_cb(void *arg);

static int dp_worker_start(struct dataplane *dp)
{
	struct dp_request *w = calloc(1, sizeof(*w));
	if (w == NULL)
		return -1;
	w->dp = dp;
	if (nng_ctx_open(&w->ctx, dp->sock) != 0) {
		free(w);
		return -1;
	}
	if (nng_aio_alloc(&w->aio, dp_worker_cb, w) != 0) {
		nng_ctx_close(w->ctx);
		free(w);
		return -1;
	}
	pthread_mutex_lock(&dp->lock);
	w->next = dp->workers;
	dp->workers = w;
	w->state = W_RECV;
	pthread_mutex_unlock(&dp->lock);
	nng_ctx_recv(w->ctx, w->aio);
	return 0;
}

static void dp_reply(struct dp_request *w, int code, const char *message)
{
	nng_msg *reply;
	if (w->msg != NULL) {
		nng_msg_free(w->msg);
		w->msg = NULL;
	}
	size_t len = message ? strlen(message) : 0;
	if (nng_msg_alloc(&reply, 4 + len) != 0) {
		w->state = W_RECV;
		nng_ctx_recv(w->ctx, w->aio);
		return;
	}
	uint32_t c = (uint32_t)code;
	memcpy(nng_msg_body(reply), &c, 4);
	if (len)
		memcpy((char *)nng_msg_body(reply) + 4, message, len);
	w->state = W_SEND;
	nng_aio_set_msg(w->aio, reply);
	nng_ctx_send(w->ctx, w->aio);
}

static void dp_handle(struct dp_request *w)
{
	struct dataplane *dp = w->dp;
	struct status st;
	status_clear(&st);
	size_t len = nng_msg_len(w->msg);
	if (len < sizeof(struct dp_header)) {
		dp_reply(w, ST_INVALID_ARGUMENT, "data-plane chunk shorter than its header");
		return;
	}
	memcpy(&w->header, nng_msg_body(w->msg), sizeof(w->header));
	if (w->header.magic != DP_MAGIC || w->header.length != len - sizeof(struct dp_header)) {
		dp_reply(w, ST_INVALID_ARGUMENT, "malformed data-plane chunk header");
		return;
	}
	int rv = dp->deliver(dp->arg, w, &w->header,
	                     (const char *)nng_msg_body(w->msg) + sizeof(struct dp_header), &st);
	if (rv == DP_PARKED) {
		/* This worker now waits for the collective; keep receiving on a new one. */
		if (dp_worker_start(dp) != 0)
			log_error("data plane: cannot start a receive worker");
		return;
	}
	dp_reply(w, rv, rv == ST_OK ? NULL : st.message);
}

static void dp_worker_cb(void *arg)
{
	struct dp_request *w = arg;
	int rv = nng_aio_result(w->aio);
	if (w->state == W_SEND) {
		if (rv != 0)
			nng_msg_free(nng_aio_get_msg(w->aio));
		if (rv == NNG_ECLOSED || rv == NNG_ECANCELED)
			return;
		w->state = W_RECV;
		nng_ctx_recv(w->ctx, w->aio);
		return;
	}
	if (rv == NNG_ECLOSED || rv == NNG_ECANCELED)
		return;
	if (rv != 0) {
		nng_ctx_recv(w->ctx, w->aio);
		return;
	}
	w->msg = nng_aio_get_msg(w->aio);
	w->state = W_PARKED;
	dp_handle(w);
}

const struct dp_header *dp_request_header(const struct dp_request *req)
{
	return &req->header;
}

const void *dp_request_payload(const struct dp_request *req)
{
	return (const char *)nng_msg_body(req->msg) + sizeof(struct dp_header);
}

void dp_complete(struct dp_request *req, int code, const char *message)
{
	dp_reply(req, code, code == ST_OK ? NULL : message);
}

int dp_start(struct dataplane **out, const char *url, char *bound_url, dp_deliver_fn deliver,
             void *arg, struct status *st)
{
	struct dataplane *dp = calloc(1, sizeof(*dp));
	if (dp == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	dp->deliver = deliver;
	dp->arg = arg;
	pthread_mutex_init(&dp->lock, NULL);
	int rv = nng_rep0_open(&dp->sock);
	nng_listener l;
	if (rv == 0) {
		nng_socket_set_size(dp->sock, NNG_OPT_RECVMAXSZ, DP_RECV_MAX);
		rv = nng_listen(dp->sock, url, &l, 0);
		if (rv != 0)
			nng_close(dp->sock);
	}
	if (rv != 0) {
		pthread_mutex_destroy(&dp->lock);
		free(dp);
		return status_set(st, ST_UNAVAILABLE, "data plane cannot listen on %s: %s", url,
		                  nng_strerror(rv));
	}
	int port = 0;
	snprintf(bound_url, 256, "%s", url);
	if (strncmp(url, "tcp://", 6) == 0 &&
	    nng_listener_get_int(l, NNG_OPT_TCP_BOUND_PORT, &port) == 0) {
		const char *colon = strrchr(url, ':');
		snprintf(bound_url, 256, "%.*s:%d", (int)(colon - url), url, port);
	}
	for (int i = 0; i < DP_INITIAL_WORKERS; i++)
		dp_worker_start(dp);
	*out = dp;
	return ST_OK;
}

void dp_stop(struct dataplane *dp)
{
	if (dp == NULL)
		return;
	pthread_mutex_lock(&dp->lock);
	dp->stopping = 1;
	struct dp_request *workers = dp->workers;
	dp->workers = NULL;
	pthread_mutex_unlock(&dp->lock);
	nng_close(dp->sock);
	for (struct dp_request *w = workers; w != NULL;) {
		struct dp_request *next = w->next;
		nng_aio_free(w->aio);
		if (w->msg != NULL)
			nng_msg_free(w->msg);
		free(w);
		w = next;
	}
	for (struct dp_peer *p = dp->peers; p != NULL;) {
		struct dp_peer *next = p->next;
		nng_close(p->sock);
		free(p);
		p = next;
	}
	pthread_mutex_destroy(&dp->lock);
	free(dp);
}

/* Returns the req socket dialled to url, dialling it on first use. */
static int dp_peer_socket(struct dataplane *dp, const char *url, nng_socket *out, struct status *st)
{
	pthread_mutex_lock(&dp->lock);
	struct dp_peer *p;
	for (p = dp->peers; p != NULL; p = p->next)
		if (strcmp(p->url, url) == 0)
			break;
	int rv = 0;
	if (p == NULL) {
		p = calloc(1, sizeof(*p));
		if (p == NULL) {
			pthread_mutex_unlock(&dp->lock);
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		}
		snprintf(p->url, sizeof(p->url), "%s", url);
		rv = nng_req0_open(&p->sock);
		if (rv == 0) {
			nng_socket_set_ms(p->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
			nng_socket_set_size(p->sock, NNG_OPT_RECVMAXSZ, 64 * 1024);
			nng_socket_set_ms(p->sock, NNG_OPT_RECONNMINT, 20);
			nng_socket_set_ms(p->sock, NNG_OPT_RECONNMAXT, 500);
			rv = nng_dial(p->sock, url, NULL, NNG_FLAG_NONBLOCK);
			if (rv != 0)
				nng_close(p->sock);
		}
		if (rv != 0) {
			free(p);
			pthread_mutex_unlock(&dp->lock);
			return status_set(st, ST_UNAVAILABLE, "cannot dial peer %s: %s", url,
			                  nng_strerror(rv));
		}
		p->next = dp->peers;
		dp->peers = p;
	}
	*out = p->sock;
	pthread_mutex_unlock(&dp->lock);
	return ST_OK;
}

enum { S_IDLE, S_SENDING, S_RECEIVING };

struct dp_send_op;

struct dp_slot {
	struct dp_send_op *op;
	int peer;
	nng_ctx ctx;
	nng_aio *aio;
	int state;
};

struct dp_send_op {
	pthread_mutex_t lock;
	pthread_cond_t cv;
	const char *const *urls;
	int code;
	char message[512];
};

static void dp_send_fail(struct dp_send_op *op, int code, const char *fmt, const char *a,
                         const char *b)
{
	if (op->code == ST_OK) {
		op->code = code;
		snprintf(op->message, sizeof(op->message), fmt, a, b);
	}
}

static void dp_slot_cb(void *arg)
{
	struct dp_slot *s = arg;
	struct dp_send_op *op = s->op;
	int rv = nng_aio_result(s->aio);
	pthread_mutex_lock(&op->lock);
	if (s->state == S_SENDING && rv == 0) {
		s->state = S_RECEIVING;
		pthread_mutex_unlock(&op->lock);
		nng_ctx_recv(s->ctx, s->aio);
		return;
	}
	if (rv != 0) {
		if (s->state == S_SENDING)
			nng_msg_free(nng_aio_get_msg(s->aio));
		dp_send_fail(op, rv == NNG_ETIMEDOUT ? ST_DEADLINE_EXCEEDED : ST_UNAVAILABLE,
		             "peer %s did not acknowledge a chunk: %s", op->urls[s->peer],
		             nng_strerror(rv));
	} else {
		nng_msg *reply = nng_aio_get_msg(s->aio);
		uint32_t code = ST_INTERNAL;
		if (nng_msg_len(reply) >= 4)
			memcpy(&code, nng_msg_body(reply), 4);
		if (code != ST_OK && op->code == ST_OK) {
			op->code = (int)code;
			snprintf(op->message, sizeof(op->message), "peer %s: %.*s",
			         op->urls[s->peer], (int)(nng_msg_len(reply) - 4),
			         (const char *)nng_msg_body(reply) + 4);
		}
		nng_msg_free(reply);
	}
	s->state = S_IDLE;
	pthread_cond_broadcast(&op->cv);
	pthread_mutex_unlock(&op->lock);
}

int dp_send(struct dataplane *dp, const char *const *peer_urls, int num_peers,
            const struct dp_header *base, const void *data, uint64_t total, uint64_t chunk_bytes,
            int window, int timeout_ms, struct status *st)
{
	status_clear(st);
	if (num_peers == 0)
		return ST_OK;
	if (chunk_bytes == 0 || chunk_bytes > DP_MAX_CHUNK)
		chunk_bytes = DP_MAX_CHUNK;
	if (window < 1)
		window = 1;
	uint64_t sent_total = data ? total : 0;
	uint64_t chunks = sent_total == 0 ? 1 : (sent_total + chunk_bytes - 1) / chunk_bytes;
	struct dp_send_op op = {.urls = peer_urls, .code = ST_OK};
	pthread_mutex_init(&op.lock, NULL);
	pthread_cond_init(&op.cv, NULL);
	int nslots = num_peers * window;
	struct dp_slot *slots = calloc((size_t)nslots, sizeof(*slots));
	int ready = 0;
	if (slots == NULL) {
		status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		goto out;
	}
	for (; ready < nslots; ready++) {
		struct dp_slot *s = &slots[ready];
		nng_socket sock;
		s->op = &op;
		s->peer = ready / window;
		if (dp_peer_socket(dp, peer_urls[s->peer], &sock, st) != ST_OK)
			goto out;
		if (nng_ctx_open(&s->ctx, sock) != 0)
			break;
		if (nng_aio_alloc(&s->aio, dp_slot_cb, s) != 0) {
			nng_ctx_close(s->ctx);
			break;
		}
		nng_aio_set_timeout(s->aio, timeout_ms);
	}
	if (ready < nslots) {
		status_set(st, ST_RESOURCE_EXHAUSTED, "cannot set up data-plane sends");
		goto out;
	}
	for (uint64_t c = 0; c < chunks; c++) {
		uint64_t offset = c * chunk_bytes;
		uint64_t len =
		    sent_total == 0
		        ? 0
		        : (sent_total - offset < chunk_bytes ? sent_total - offset : chunk_bytes);
		for (int p = 0; p < num_peers; p++) {
			struct dp_slot *s = &slots[p * window + (int)(c % (uint64_t)window)];
			pthread_mutex_lock(&op.lock);
			while (s->state != S_IDLE && op.code == ST_OK)
				pthread_cond_wait(&op.cv, &op.lock);
			int failed = op.code != ST_OK;
			pthread_mutex_unlock(&op.lock);
			if (failed)
				goto drain;
			nng_msg *msg;
			if (nng_msg_alloc(&msg, sizeof(struct dp_header) + len) != 0) {
				pthread_mutex_lock(&op.lock);
				dp_send_fail(&op, ST_RESOURCE_EXHAUSTED, "%s%s",
				             "out of host memory", "");
				pthread_mutex_unlock(&op.lock);
				goto drain;
			}
			struct dp_header h = *base;
			h.magic = DP_MAGIC;
			h.offset = offset;
			h.length = len;
			h.total = sent_total;
			h.flags = c + 1 == chunks ? DP_FLAG_LAST : 0;
			memcpy(nng_msg_body(msg), &h, sizeof(h));
			if (len)
				memcpy((char *)nng_msg_body(msg) + sizeof(h),
				       (const char *)data + offset, len);
			s->state = S_SENDING;
			nng_aio_set_msg(s->aio, msg);
			nng_ctx_send(s->ctx, s->aio);
		}
	}
drain:
	pthread_mutex_lock(&op.lock);
	for (int i = 0; i < nslots; i++)
		while (slots[i].state != S_IDLE)
			pthread_cond_wait(&op.cv, &op.lock);
	pthread_mutex_unlock(&op.lock);
	if (op.code != ST_OK)
		status_set(st, op.code, "%s", op.message);
out:
	for (int i = 0; i < ready; i++) {
		nng_aio_free(slots[i].aio);
		nng_ctx_close(slots[i].ctx);
	}
	free(slots);
	pthread_cond_destroy(&op.cv);
	pthread_mutex_destroy(&op.lock);
	return st->code;
}
