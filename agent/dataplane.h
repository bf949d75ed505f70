/*
 * The data plane: tensor bytes between agents. Each agent listens with an nng rep socket and
 * dials every peer with a req socket; a chunk is a request and its reply is the receiver's
 * acknowledgement, so a sender has at most `window` chunks in flight per peer and a receiver
 * never buffers more than what its peers have in flight.
 *
 * A receiver that is not yet at the collective a chunk belongs to parks the request and answers
 * it once it gets there (the sender just waits), so chunks need no extra copy on arrival.
 */
#ifndef PODEMU_DATAPLANE_H
#define PODEMU_DATAPLANE_H

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
	uint64_t offset; /* byte offset within the sender's shard */
	uint64_t length; /* payload bytes that follow */
	uint64_t total;  /* bytes of the sender's whole shard (0 under --backing none) */
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
 * Listens on url (tcp://host:0 picks a port; the address bound is written to bound_url, at
 * least 256 bytes) and hands every chunk to deliver(arg, ...).
 */
int dp_start(struct dataplane **out, const char *url, char *bound_url, dp_deliver_fn deliver,
             void *arg, struct status *st);
void dp_stop(struct dataplane *dp);

/* The header and payload of a parked request (valid until dp_complete). */
const struct dp_header *dp_request_header(const struct dp_request *req);
const void *dp_request_payload(const struct dp_request *req);

/* Acknowledges a parked request with code (ST_OK, or an error with its message). */
void dp_complete(struct dp_request *req, int code, const char *message);

/*
 * Sends data (total bytes, or only a header when data is NULL) to every peer in peer_urls, in
 * chunks of chunk_bytes with at most window chunks in flight per peer, each chunk's header
 * built from *base with its offset and length; the last chunk carries DP_FLAG_LAST. Returns
 * when every chunk is acknowledged: UNAVAILABLE when a peer cannot be reached or fails,
 * DEADLINE_EXCEEDED after timeout_ms, or the receiver's error.
 */
int dp_send(struct dataplane *dp, const char *const *peer_urls, int num_peers,
            const struct dp_header *base, const void *data, uint64_t total, uint64_t chunk_bytes,
            int window, int timeout_ms, struct status *st);

#endif
