/*
 * The data plane's insides, shared by its files: dp_stream.c (streams, and frames written and
 * bytes read on them in order), dataplane.c (the receiving side and the data plane's life) and
 * dp_send.c (the sending side: peers and channels).
 */
#ifndef PODEMU_DP_INTERNAL_H
#define PODEMU_DP_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>

#include <nng/nng.h>

#include "dataplane.h"
#include "stream_socket.h"
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
	int fd; /* the stream's TCP socket, written straight while nothing queues; -1: not known */
};

struct dp_reactor;

struct dp_reader {
	struct dp_stream *ds;
	nng_aio *aio; /* reads through nng, when the socket is not known */
	void (*cb)(void *);
	void *arg;
	char *buf;
	size_t want, got;
	/*
	 * The stream's TCP socket, or -1: not known. A known socket is read straight, and waited
	 * for by the reactor (re), which calls cb.
	 */
	int fd;
	int lowat; /* its SO_RCVLOWAT, which wakes the reactor once that much is in */
	struct dp_reactor *re;
	bool registered; /* in the reactor's set */
	int err;         /* the stream failed (an nng error): the callback says so */
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
	struct dp_reactor *reactor; /* with plain_tcp */
};

struct dp_conn;
struct dp_peer;

/* The reactor (dp_reactor.c): a thread that runs readers' callbacks as their sockets fill. */
int dp_reactor_start(struct dp_reactor **out);
/* Ends its thread; every caller returns once no callback runs any more. */
void dp_reactor_stop(struct dp_reactor *re);
void dp_reactor_free(struct dp_reactor *re);
/* Calls r->cb once r->fd is readable (r->lowat bytes, the end, or an error); -1 on failure. */
int dp_reactor_arm(struct dp_reactor *re, struct dp_reader *r);
/* Takes r out of the set; its callback does not run after this returns (or, on the thread
 * whose turn is under way, after that turn). */
void dp_reactor_forget(struct dp_reactor *re, struct dp_reader *r);
/* dp_hold, dp_poll and dp_release (dataplane.h) on the reactor. */
bool dp_reactor_hold(struct dp_reactor *re, int wake_fd);
int dp_reactor_poll(struct dp_reactor *re, int timeout_ms);
void dp_reactor_release(struct dp_reactor *re);

/* Streams and what runs on them (dp_stream.c). */
/* Closes the stream; operations started after it complete at once with nothing moved. */
void ds_close(struct dp_stream *ds);
/*
 * Queues a frame; it is written whole after those before it, then f->done runs: at once on
 * the caller's thread when the socket took it all (so without the caller's locks).
 */
void writer_enqueue(struct dp_writer *w, struct dp_frame *f);
/* Fails the frame being written and every queued one with rv. */
void writer_fail(struct dp_writer *w, int rv);
/*
 * Starts reading exactly want bytes into buf. Returns 1 when they were all there at once (the
 * caller goes on with them; no callback comes), or 0: the link's callback runs as they come.
 * One read at a time: only its callback, or whoever holds the reader while nothing is under
 * way, starts the next.
 */
int reader_read(struct dp_reader *r, void *buf, size_t want);
/* From the callback: 1 when the read is complete, 0 to wait for more, -1 closed (*err). */
int reader_step(struct dp_reader *r, int *err);
/*
 * A plain TCP link (stream s) writes and reads its socket straight from now on, its reads
 * waited for by re; before its first read or write.
 */
void link_use_socket(struct dp_writer *w, struct dp_reader *r, nng_stream *s,
                     struct dp_reactor *re);
/* No callback of r runs after this returns (nor from the reactor, which forgets r). */
void reader_stop(struct dp_reader *r);
/* A stream with its writer and reader (cb reading); link_fini undoes it. */
int link_init(struct dp_stream *ds, struct dp_writer *w, struct dp_reader *r, nng_stream *s,
              void (*cb)(void *), void *arg);
void link_fini(struct dp_stream *ds, struct dp_writer *w, struct dp_reader *r);

/* The receiving side and the data plane's life (dataplane.c). */
/* Lets go of n references to dp, freeing it with the last. */
void dp_unref(struct dataplane *dp, int n);
/* Frees the connections whose last user is gone; dp itself may go with them. */
void reap_conns(struct dataplane *dp);

/* The sending side (dp_send.c). */
/* dp_shutdown: fails every peer of the list (taken from the data plane) and lets go of it. */
void peers_stop(struct dp_peer *peers);

#endif
