/*
 * gRPC-style control plane over nng byte streams (tcp://, tls+tcp://, ipc://). A service is a
 * protobuf-c service descriptor; a method is called by its index. Every request and reply
 * travels in an RpcRequest / RpcResponse envelope that carries an absl-style status code and
 * message, framed on the stream by an 8-byte header (rpc_frame_*).
 *
 * A connection carries one call at a time: the client sends a request frame and reads one reply
 * frame. A client keeps the connections its calls left idle and opens another when every one is
 * busy; a server reads each connection on a thread of its own, so a slow method holds only its
 * caller's connection. One round trip costs a thread wake-up at each end, where nng's req/rep
 * protocol handed each message between several of its own threads.
 */
#ifndef PODEMU_RPC_H
#define PODEMU_RPC_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "arena.h"
#include "status.h"

/* Largest RPC message accepted on any control socket. Transfers are chunked well below it. */
#define RPC_MAX_MESSAGE_BYTES (64 * 1024 * 1024)
/* Size of one host<->device transfer chunk. */
#define RPC_TRANSFER_CHUNK_BYTES (8 * 1024 * 1024)
/* Connections one server serves at once; more are closed as they arrive. */
#define RPC_MAX_CONNECTIONS 1024
/* Once a frame has begun, the rest of it must arrive within this time. */
#define RPC_FRAME_TIMEOUT_MS 30000

/*
 * A frame: the magic "pRC1", the length of the envelope that follows (little-endian, at most
 * RPC_MAX_MESSAGE_BYTES), then the envelope. A frame that breaks these rules ends its
 * connection.
 */
#define RPC_FRAME_HEADER_BYTES 8

static inline void rpc_frame_encode(uint8_t header[RPC_FRAME_HEADER_BYTES], uint32_t length)
{
	header[0] = 'p';
	header[1] = 'R';
	header[2] = 'C';
	header[3] = '1';
	for (int i = 0; i < 4; i++)
		header[4 + i] = (uint8_t)(length >> (8 * i));
}

/* The envelope's length, or -1 when the header is not a frame's or announces too much. */
static inline int64_t rpc_frame_decode(const uint8_t header[RPC_FRAME_HEADER_BYTES])
{
	if (header[0] != 'p' || header[1] != 'R' || header[2] != 'C' || header[3] != '1')
		return -1;
	uint32_t length = 0;
	for (int i = 0; i < 4; i++)
		length |= (uint32_t)header[4 + i] << (8 * i);
	return length > RPC_MAX_MESSAGE_BYTES ? -1 : (int64_t)length;
}

/*
 * A method handler. request is decoded and owned by the call's arena; reply is an initialised
 * message of the method's output type which the handler fills, allocating from a. Returns a
 * status code; on error the reply is not sent, st's message is.
 */
typedef int (*rpc_handler)(void *state, struct arena *a, const void *request, void *reply,
                           struct status *st);

struct rpc_server;

/*
 * Listens on url and serves svc with handlers[i] for method i (NULL: UNIMPLEMENTED), each
 * connection on its own thread (handlers may run concurrently). With a token (not NULL or ""),
 * requests that do not carry it get UNAUTHENTICATED. On success *out owns the server
 * and *bound_url (if not NULL, at least 256 bytes) receives the address with the port actually
 * bound (for tcp://host:0).
 */
int rpc_server_start(struct rpc_server **out, const char *url,
                     const ProtobufCServiceDescriptor *svc, const rpc_handler *handlers,
                     void *state, const char *token, char *bound_url, struct status *st);

/* Stops accepting, waits for running handlers to finish, frees the server. NULL is allowed. */
void rpc_server_stop(struct rpc_server *s);

struct rpc_client;

/*
 * A client of url. With wait false the first connection must succeed now (UNAVAILABLE
 * otherwise) and a call whose connection cannot be made fails at once; with wait true nothing is
 * dialled yet and a call redials every 50 ms until its deadline. Safe for concurrent calls.
 * A connection that breaks before any byte of its reply came back, after it had served an
 * earlier call, is dialled again once and the request resent (the peer restarted); one that
 * breaks later fails the call.
 */
int rpc_client_open(struct rpc_client **out, const char *url, bool wait, struct status *st);
void rpc_client_close(struct rpc_client *c);
const char *rpc_client_url(const struct rpc_client *c);
/* Every later call carries token (NULL or "": none). Not while calls are in flight. */
void rpc_client_set_token(struct rpc_client *c, const char *token);

/*
 * Calls method `method` of svc with request and waits up to timeout_ms for the reply, which is
 * decoded into *reply (allocated from a). Returns the remote status code (with its message in
 * st), UNAVAILABLE / DEADLINE_EXCEEDED for transport failures, INTERNAL for a malformed reply.
 */
int rpc_call(struct rpc_client *c, const ProtobufCServiceDescriptor *svc, unsigned method,
             const void *request, struct arena *a, void **reply, int timeout_ms, struct status *st);

/*
 * Lets another thread abort a call in progress (a peer that is known to be gone need not be
 * waited for). The call then returns UNAVAILABLE with the reason given to rpc_cancel_fire.
 */
struct rpc_cancel {
	pthread_mutex_t lock;
	void *aio; /* the nng_aio the call waits on, while it waits */
	int fired;
	char reason[512];
};

void rpc_cancel_init(struct rpc_cancel *c);
void rpc_cancel_destroy(struct rpc_cancel *c);
void rpc_cancel_fire(struct rpc_cancel *c, const char *reason);

/*
 * A call in flight without a thread of its own: rpc_start sends the request and returns (it
 * may block while the request is written; a waiting client with no connection yet leaves its
 * dials to nng's threads). rpc_poll reads the reply on the calling thread for up to wait_ms
 * (< 0: until it is in; 0: only what is in already, without waiting) and says whether the call
 * is over; then rpc_finish decodes the reply into a as rpc_call does and frees the call.
 * rpc_wait polls until the call is over, then finishes it. rpc_start returns NULL with st set
 * when the call cannot start.
 */
struct rpc_async;
struct rpc_async *rpc_start(struct rpc_client *c, const ProtobufCServiceDescriptor *svc,
                            unsigned method, const void *request, struct arena *a, int timeout_ms,
                            struct rpc_cancel *cancel, struct status *st);
bool rpc_poll(struct rpc_async *x, int wait_ms);
int rpc_finish(struct rpc_async *x, struct arena *a, void **reply, struct status *st);
int rpc_wait(struct rpc_async *x, struct arena *a, void **reply, struct status *st);

/* rpc_call that rpc_cancel_fire(cancel) can abort; cancel may be NULL. */
int rpc_call_cancellable(struct rpc_client *c, const ProtobufCServiceDescriptor *svc,
                         unsigned method, const void *request, struct arena *a, void **reply,
                         int timeout_ms, struct rpc_cancel *cancel, struct status *st);

#endif
