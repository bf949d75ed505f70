/*
 * gRPC-style control plane over nng req/rep. A service is a protobuf-c service descriptor; a
 * method is called by its index. Every request and reply travels in an RpcRequest /
 * RpcResponse envelope that carries an absl-style status code and message.
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

/*
 * A method handler. request is decoded and owned by the call's arena; reply is an initialised
 * message of the method's output type which the handler fills, allocating from a. Returns a
 * status code; on error the reply is not sent, st's message is.
 */
typedef int (*rpc_handler)(void *state, struct arena *a, const void *request, void *reply,
                           struct status *st);

struct rpc_server;

/*
 * Listens on url and serves svc with handlers[i] for method i (NULL: UNIMPLEMENTED), on
 * `workers` threads so that slow methods do not block others. With a token (not NULL or ""),
 * requests that do not carry it get UNAUTHENTICATED. On success *out owns the server
 * and *bound_url (if not NULL, at least 256 bytes) receives the address with the port actually
 * bound (for tcp://host:0).
 */
int rpc_server_start(struct rpc_server **out, const char *url,
                     const ProtobufCServiceDescriptor *svc, const rpc_handler *handlers,
                     void *state, int workers, const char *token, char *bound_url,
                     struct status *st);

/* Stops accepting, waits for running handlers to finish, frees the server. NULL is allowed. */
void rpc_server_stop(struct rpc_server *s);

struct rpc_client;

/*
 * Dials url. With wait false the first connection must succeed now (UNAVAILABLE otherwise);
 * with wait true the client keeps redialling in the background. Safe for concurrent calls.
 */
int rpc_client_open(struct rpc_client **out, const char *url, bool wait, struct status *st);
void rpc_client_close(struct rpc_client *c);
const char *rpc_client_url(const struct rpc_client *c);
/* Every later call carries token (NULL or "": none). */
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
	void *aio; /* the call's nng_aio while it waits */
	int fired;
	char reason[512];
};

void rpc_cancel_init(struct rpc_cancel *c);
void rpc_cancel_destroy(struct rpc_cancel *c);
void rpc_cancel_fire(struct rpc_cancel *c, const char *reason);

/*
 * A call in flight without a thread of its own: rpc_start sends the request and returns;
 * done(arg) (if not NULL) runs on an nng thread once the reply (or a failure) is in, and must
 * not block; then rpc_finish, from any thread but done's, decodes the reply into a as rpc_call
 * does and frees the call. rpc_wait waits for the call to be over, then finishes it.
 * rpc_start returns NULL with st set when the call cannot start (done never runs then).
 */
struct rpc_async;
struct rpc_async *rpc_start(struct rpc_client *c, const ProtobufCServiceDescriptor *svc,
                            unsigned method, const void *request, struct arena *a, int timeout_ms,
                            struct rpc_cancel *cancel, void (*done)(void *arg), void *arg,
                            struct status *st);
int rpc_finish(struct rpc_async *x, struct arena *a, void **reply, struct status *st);
int rpc_wait(struct rpc_async *x, struct arena *a, void **reply, struct status *st);

/* rpc_call that rpc_cancel_fire(cancel) can abort; cancel may be NULL. */
int rpc_call_cancellable(struct rpc_client *c, const ProtobufCServiceDescriptor *svc,
                         unsigned method, const void *request, struct arena *a, void **reply,
                         int timeout_ms, struct rpc_cancel *cancel, struct status *st);

#endif
