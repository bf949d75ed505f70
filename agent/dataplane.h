/*
 * The data plane: tensor bytes between agents over nng byte streams. An agent dials one
 * stream to each peer agent it sends to, on first use, and keeps it; a chunk is a fixed header
 * followed by its payload, written straight from the sender's memory. The receiver reads the
 * payload into a reused buffer, hands it to its core, and writes an acknowledgement back on
 * the same stream once the core consumed it, so a sender has at most `window` chunks in flight
 * per channel; a receiver holds no more than its credit per peer (dp_set_credit), whatever the
 * peer sends.
 *
 * A receiver whose core has not consumed a chunk yet parks the request and answers it once it
 * gets there (the sender just waits), so chunks need no extra copy on arrival.
 */
#ifndef PODEMU_DATAPLANE_H
#define PODEMU_DATAPLANE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define DP_MAGIC 0x50454450u /* "PEDP" */
#define DP_FLAG_LAST 1u

/* Fixed header in front of every chunk; host byte order (agents share one architecture). */
struct dp_header {
	uint32_t magic;
	uint32_t flags;
	uint64_t step_id;
	uint32_t collective; /* index of the collective within the step */
	uint32_t src_ordinal;
	uint32_t dst_ordinal;
	uint32_t tag;     /* the sender's n-th transfer to this destination in the collective */
	uint64_t offset;  /* position in the transfer's byte sequence */
	uint64_t length;  /* payload bytes that follow */
	uint64_t covered; /* sequence bytes this chunk stands for (length, or more without data) */
	uint32_t chan;    /* the sending channel and its slot, echoed by the acknowledgement */
	uint32_t slot;
	char token[64]; /* the pod's secret, zero-padded */
};

/* What a receiver writes back for each chunk: code, then len bytes of message. */
#define DP_ACK_MAGIC 0x4b434150u /* "PACK" */
#define DP_ACK_CLOSING 1u        /* the receiver closes the stream after this */
struct dp_ack {
	uint32_t magic;
	uint32_t flags;
	uint32_t chan;
	uint32_t slot;
	int32_t code;
	uint32_t len;
};

/* A piece of memory to send; a chunk may be gathered from several. */
struct dp_segment {
	const void *data;
	size_t len;
};

struct dp_request;
struct dataplane;

/*
 * Called on an nng thread for each chunk received. Returns ST_OK when the payload has been
 * consumed (the chunk is acknowledged), DP_PARKED when the receiver keeps req to finish later
 * with dp_complete, or an error code (with st) that is sent back to the sender.
 */
#define DP_PARKED (-1)
typedef int (*dp_deliver_fn)(void *arg, struct dp_request *req, const struct dp_header *h,
                             const void *payload, struct status *st);

/*
 * Optional, on an nng thread, once a chunk's header is read and checked: where to read its
 * length payload bytes, or NULL for a buffer of the data plane's own. A chunk read into the
 * place returned is then delivered with that pointer as its payload; if its stream breaks
 * before the payload is complete, unplace(arg, req) is called instead and req is gone after.
 */
typedef void *(*dp_place_fn)(void *arg, struct dp_request *req, const struct dp_header *h);
typedef void (*dp_unplace_fn)(void *arg, struct dp_request *req);

/*
 * Optional, on an nng thread, once a chunk's header is read and checked, before its payload:
 * ST_OK reads it on; DP_PARKED holds it unread (nothing more is read from its stream, so its
 * bytes wait in the sender's memory, until the receiver calls dp_resume); an error code (with
 * st) refuses the chunk, whose payload is then skipped.
 */
typedef int (*dp_admit_fn)(void *arg, struct dp_request *req, const struct dp_header *h,
                           struct status *st);

struct dp_handlers {
	dp_deliver_fn deliver;
	dp_place_fn place;
	dp_unplace_fn unplace;
	dp_admit_fn admit;
	void *arg;
};

/*
 * Goes on with a chunk its receiver held (dp_admit_fn): with code ST_OK its payload is read as
 * if just admitted, else the chunk is refused with message and its payload skipped. Safe under
 * the receiver's locks: the work runs on an nng thread.
 */
void dp_resume(struct dp_request *req, int code, const char *message);

/*
 * Listens on url (tcp://host:0 picks a port; the address bound is written to bound_url, at
 * least 256 bytes) and hands every chunk to the handlers.
 */
int dp_start(struct dataplane **out, const char *url, char *bound_url,
             const struct dp_handlers *handlers, struct status *st);
/*
 * dp_shutdown closes every stream and the listener and stops all callbacks; channels opened
 * after it fail with UNAVAILABLE, and parked requests may still be completed. dp_stop does
 * the same if not done yet, then lets go of dp (freed once no parked request holds it).
 */
void dp_shutdown(struct dataplane *dp);
void dp_stop(struct dataplane *dp);
/*
 * Frees what connections peers closed left behind (channels opening do it too). Not from the
 * data plane's own callbacks.
 */
void dp_reap(struct dataplane *dp);
/* Frees the receive buffers the data plane keeps for reuse. */
void dp_trim(struct dataplane *dp);
/* Chunks must carry token (and sent ones do); NULL or "": none. Call before traffic starts. */
void dp_set_token(struct dataplane *dp, const char *token);

/*
 * Receive-side credit: what one connecting peer may have read and not yet acknowledged, at
 * most chunks chunks of bytes payload bytes in all (chunks 0: no limit, the default). A chunk
 * past it is refused (RESOURCE_EXHAUSTED) and the stream closed, whatever the peer's window.
 */
void dp_set_credit(struct dataplane *dp, int chunks, uint64_t bytes);

/* The header and payload of a parked request (valid until dp_complete). */
const struct dp_header *dp_request_header(const struct dp_request *req);
const void *dp_request_payload(const struct dp_request *req);

/* Acknowledges a parked request with code (ST_OK, or an error with its message). */
void dp_complete(struct dp_request *req, int code, const char *message);

/*
 * Gives up a chunk being read into a place: its stream is closed, so the read ends at once
 * (with unplace). Only between place and deliver/unplace for req.
 */
void dp_request_cancel(struct dp_request *req);

/*
 * A core that waits in a collective may poll the data plane itself: woken by the socket that
 * has its bytes, it runs that read (and any other reader's) on its own thread, one thread
 * hand-off less per chunk and per acknowledgement than the reactor thread reading them and
 * waking the core. One holder at a time; the reactor thread sleeps meanwhile, so a holder
 * must wait for nothing a read does except through dp_poll, and give the data plane back
 * before it computes for long.
 *
 * dp_hold: true when the caller now holds it; false when another holds it, the streams are
 * not plain TCP, or the data plane is stopping. wake_fd (an eventfd) written by another
 * thread ends a dp_poll under way. dp_poll: waits up to timeout_ms for one event and runs
 * it: 1 (an event ran, or wake_fd rang), 0 (timeout), -1 (the data plane is stopping:
 * release it). dp_release: gives it back to the reactor thread.
 */
bool dp_hold(struct dataplane *dp, int wake_fd);
int dp_poll(struct dataplane *dp, int timeout_ms);
void dp_release(struct dataplane *dp);

/*
 * Connects to each of urls that has no live stream yet, all dials at once, and keeps the
 * streams for dp_chan_open: a step's first collectives then do not dial peer after peer. A
 * dial that fails is left to dp_chan_open, which tries again and says why.
 */
void dp_connect(struct dataplane *dp, const char *const *urls, int n, int timeout_ms);

/*
 * A channel to one peer: up to `window` chunks in flight, each acknowledged by the receiver.
 * notify(arg) runs on an nng thread whenever a chunk completes, so a waiting sender can go on.
 */
struct dp_chan;

int dp_chan_open(struct dp_chan **out, struct dataplane *dp, const char *url, int window,
                 int timeout_ms, void (*notify)(void *), void *arg, struct status *st);
/*
 * Sends one chunk gathered from segs (n <= 3; nothing for n = 0). The bytes are written from
 * segs as they are, so they must stay unchanged until the chunk is written (dp_chan_written
 * with the *ticket it gets, or dp_chan_flush). Returns ST_OK when posted, DP_BUSY when
 * `window` chunks are in flight, or the channel's first failure: UNAVAILABLE when the peer
 * cannot be reached, DEADLINE_EXCEEDED after the timeout, or the receiver's error.
 */
#define DP_BUSY (-2)
int dp_chan_send(struct dp_chan *ch, const struct dp_header *h, const struct dp_segment *segs,
                 int n, uint64_t *ticket, struct status *st);
/* True once the send with this ticket is written to the stream (or given up). */
bool dp_chan_written(struct dp_chan *ch, uint64_t ticket);
/*
 * Waits until at most max_in_flight chunks are unacknowledged, or the channel failed; with no
 * acknowledgement for the channel's timeout it fails with DEADLINE_EXCEEDED.
 */
void dp_chan_wait(struct dp_chan *ch, int max_in_flight);
/*
 * Waits until every chunk posted is written to the stream (the caller may change its memory
 * then), or the channel failed; returns the channel's code.
 */
int dp_chan_flush(struct dp_chan *ch, struct status *st);
/* Chunks posted and not yet acknowledged. */
int dp_chan_in_flight(struct dp_chan *ch);
/* The channel's first failure (ST_OK if none), with its message in st. */
int dp_chan_error(struct dp_chan *ch, struct status *st);
/* Gives up every chunk in flight (they complete as failed at once). */
void dp_chan_abort(struct dp_chan *ch);
/* Waits for every chunk in flight, then frees the channel. NULL is allowed. */
void dp_chan_close(struct dp_chan *ch);

/*
 * Sends data (total bytes, or one header standing for total bytes when data is NULL) to every
 * peer in peer_urls in chunks of chunk_bytes, at most window in flight per peer; the last chunk
 * carries DP_FLAG_LAST. Returns once every chunk is acknowledged, or the first failure.
 */
int dp_send(struct dataplane *dp, const char *const *peer_urls, int num_peers,
            const struct dp_header *base, const void *data, uint64_t total, uint64_t chunk_bytes,
            int window, int timeout_ms, struct status *st);

#endif
