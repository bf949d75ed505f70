#include "dataplane.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>

#include "log.h"
#include "tls.h"
#include "token.h"

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
	char token[TOKEN_MAX + 1];
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
	if (dp->token[0] != '\0' &&
	    !token_matches(dp->token, w->header.token, strnlen(w->header.token, TOKEN_MAX))) {
		dp_reply(w, ST_UNAUTHENTICATED, "chunk carries no pod token, or a wrong one");
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
		if (tls_listener_create(&l, dp->sock, url, st) != ST_OK) {
			nng_close(dp->sock);
			pthread_mutex_destroy(&dp->lock);
			free(dp);
			return st->code;
		}
		rv = nng_listener_start(l, 0);
		if (rv != 0)
			nng_close(dp->sock);
	}
	if (rv != 0) {
		pthread_mutex_destroy(&dp->lock);
		free(dp);
		return status_set(st, ST_UNAVAILABLE, "data plane cannot listen on %s: %s", url,
		                  nng_strerror(rv));
	}
	tls_bound_url(bound_url, url, l);
	for (int i = 0; i < DP_INITIAL_WORKERS; i++)
		dp_worker_start(dp);
	*out = dp;
	return ST_OK;
}

void dp_set_token(struct dataplane *dp, const char *token)
{
	snprintf(dp->token, sizeof(dp->token), "%s", token ? token : "");
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
			nng_dialer d;
			if (tls_dialer_create(&d, p->sock, url, st) != ST_OK) {
				nng_close(p->sock);
				free(p);
				pthread_mutex_unlock(&dp->lock);
				return st->code;
			}
			rv = nng_dialer_start(d, NNG_FLAG_NONBLOCK);
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

struct dp_slot {
	struct dp_chan *ch;
	nng_ctx ctx;
	nng_aio *aio;
	int state;
};

struct dp_chan {
	struct dataplane *dp;
	pthread_mutex_t lock;
	pthread_cond_t cv;
	char url[256];
	void (*notify)(void *);
	void *notify_arg;
	int window;
	int in_flight;
	bool aborted; /* no new sends, and no waiting for acknowledgements */
	int code;
	char message[512];
	struct dp_slot *slots;
	int num_slots;
};

static void dp_chan_fail(struct dp_chan *ch, int code, const char *fmt, const char *a,
                         const char *b)
{
	if (ch->code == ST_OK) {
		ch->code = code;
		snprintf(ch->message, sizeof(ch->message), fmt, a, b);
	}
}

static void dp_slot_cb(void *arg)
{
	struct dp_slot *s = arg;
	struct dp_chan *ch = s->ch;
	int rv = nng_aio_result(s->aio);
	pthread_mutex_lock(&ch->lock);
	if (s->state == S_SENDING && rv == 0 && !ch->aborted) {
		s->state = S_RECEIVING;
		pthread_mutex_unlock(&ch->lock);
		nng_ctx_recv(s->ctx, s->aio);
		/* An abort between the unlock and the recv cancelled nothing: cancel it now. */
		pthread_mutex_lock(&ch->lock);
		bool aborted = ch->aborted;
		pthread_mutex_unlock(&ch->lock);
		if (aborted)
			nng_aio_cancel(s->aio);
		return;
	}
	if (s->state == S_SENDING && rv == 0) {
		/* Sent (nng owns the message), but nobody waits for the acknowledgement any more.
		 */
		s->state = S_RECEIVING;
		rv = NNG_ECANCELED;
	}
	if (rv != 0) {
		if (s->state == S_SENDING)
			nng_msg_free(nng_aio_get_msg(s->aio));
		dp_chan_fail(ch, rv == NNG_ETIMEDOUT ? ST_DEADLINE_EXCEEDED : ST_UNAVAILABLE,
		             "peer %s did not acknowledge a chunk: %s", ch->url, nng_strerror(rv));
	} else {
		nng_msg *reply = nng_aio_get_msg(s->aio);
		uint32_t code = ST_INTERNAL;
		if (nng_msg_len(reply) >= 4)
			memcpy(&code, nng_msg_body(reply), 4);
		if (code != ST_OK && ch->code == ST_OK) {
			ch->code = (int)code;
			snprintf(ch->message, sizeof(ch->message), "peer %s: %.*s", ch->url,
			         (int)(nng_msg_len(reply) >= 4 ? nng_msg_len(reply) - 4 : 0),
			         (const char *)nng_msg_body(reply) + 4);
		}
		nng_msg_free(reply);
	}
	s->state = S_IDLE;
	ch->in_flight--;
	pthread_cond_broadcast(&ch->cv);
	void (*notify)(void *) = ch->notify;
	void *notify_arg = ch->notify_arg;
	pthread_mutex_unlock(&ch->lock);
	if (notify != NULL)
		notify(notify_arg);
}

int dp_chan_open(struct dp_chan **out, struct dataplane *dp, const char *url, int window,
                 int timeout_ms, void (*notify)(void *), void *arg, struct status *st)
{
	nng_socket sock;
	int rv = dp_peer_socket(dp, url, &sock, st);
	if (rv != ST_OK)
		return rv;
	struct dp_chan *ch = calloc(1, sizeof(*ch));
	if (ch == NULL || (ch->slots = calloc((size_t)window, sizeof(*ch->slots))) == NULL) {
		free(ch);
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	}
	pthread_mutex_init(&ch->lock, NULL);
	pthread_cond_init(&ch->cv, NULL);
	snprintf(ch->url, sizeof(ch->url), "%s", url);
	ch->dp = dp;
	ch->notify = notify;
	ch->notify_arg = arg;
	ch->window = window;
	for (; ch->num_slots < window; ch->num_slots++) {
		struct dp_slot *s = &ch->slots[ch->num_slots];
		s->ch = ch;
		if (nng_ctx_open(&s->ctx, sock) != 0)
			break;
		if (nng_aio_alloc(&s->aio, dp_slot_cb, s) != 0) {
			nng_ctx_close(s->ctx);
			break;
		}
		nng_aio_set_timeout(s->aio, timeout_ms);
	}
	if (ch->num_slots == 0) {
		dp_chan_close(ch);
		return status_set(st, ST_RESOURCE_EXHAUSTED, "cannot open a channel to %s", url);
	}
	*out = ch;
	return ST_OK;
}

int dp_chan_send(struct dp_chan *ch, const struct dp_header *h, const struct dp_segment *segs,
                 int n, struct status *st)
{
	size_t len = 0;
	for (int i = 0; i < n; i++)
		len += segs[i].len;
	pthread_mutex_lock(&ch->lock);
	if (ch->code == ST_OK && ch->aborted)
		dp_chan_fail(ch, ST_ABORTED, "the channel to %s was aborted%s", ch->url, "");
	if (ch->code != ST_OK) {
		int code = status_set(st, ch->code, "%s", ch->message);
		pthread_mutex_unlock(&ch->lock);
		return code;
	}
	struct dp_slot *slot = NULL;
	for (int i = 0; i < ch->num_slots && slot == NULL; i++)
		if (ch->slots[i].state == S_IDLE)
			slot = &ch->slots[i];
	if (slot == NULL) {
		pthread_mutex_unlock(&ch->lock);
		return DP_BUSY;
	}
	slot->state = S_SENDING;
	ch->in_flight++;
	pthread_mutex_unlock(&ch->lock);

	nng_msg *msg;
	if (nng_msg_alloc(&msg, sizeof(struct dp_header) + len) != 0) {
		pthread_mutex_lock(&ch->lock);
		slot->state = S_IDLE;
		ch->in_flight--;
		pthread_mutex_unlock(&ch->lock);
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	}
	struct dp_header hh = *h;
	hh.magic = DP_MAGIC;
	hh.length = len;
	memset(hh.token, 0, sizeof(hh.token));
	memcpy(hh.token, ch->dp->token, strlen(ch->dp->token));
	char *body = nng_msg_body(msg);
	memcpy(body, &hh, sizeof(hh));
	body += sizeof(hh);
	for (int i = 0; i < n; i++) {
		memcpy(body, segs[i].data, segs[i].len);
		body += segs[i].len;
	}
	nng_aio_set_msg(slot->aio, msg);
	nng_ctx_send(slot->ctx, slot->aio);
	return ST_OK;
}

void dp_chan_wait(struct dp_chan *ch, int max_in_flight)
{
	pthread_mutex_lock(&ch->lock);
	while (ch->in_flight > max_in_flight && ch->code == ST_OK)
		pthread_cond_wait(&ch->cv, &ch->lock);
	pthread_mutex_unlock(&ch->lock);
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
	pthread_mutex_unlock(&ch->lock);
	for (int i = 0; i < ch->num_slots; i++)
		nng_aio_cancel(ch->slots[i].aio);
}

void dp_chan_close(struct dp_chan *ch)
{
	if (ch == NULL)
		return;
	pthread_mutex_lock(&ch->lock);
	ch->notify = NULL;
	while (ch->in_flight > 0)
		pthread_cond_wait(&ch->cv, &ch->lock);
	pthread_mutex_unlock(&ch->lock);
	for (int i = 0; i < ch->num_slots; i++) {
		nng_aio_free(ch->slots[i].aio);
		nng_ctx_close(ch->slots[i].ctx);
	}
	free(ch->slots);
	pthread_cond_destroy(&ch->cv);
	pthread_mutex_destroy(&ch->lock);
	free(ch);
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
			while ((rv = dp_chan_send(chans[p], &h, &seg, len ? 1 : 0, st)) == DP_BUSY)
				dp_chan_wait(chans[p], chans[p]->num_slots - 1);
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
