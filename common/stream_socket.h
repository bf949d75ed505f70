/*
 * The socket under a plain TCP nng stream. nng 1.5 has neither an option for a stream's
 * descriptor nor one for its receive low-water mark, and each nng read or write completes on
 * nng's own threads: a thread hand-off or two for each, where a small read or write costs less.
 * So the data plane and the RPC server use the socket itself (non-blocking, while nng has no
 * operation under way on it; the descriptor stays nng's, which closes it).
 */
#ifndef PODEMU_STREAM_SOCKET_H
#define PODEMU_STREAM_SOCKET_H

#include <nng/nng.h>

/*
 * The descriptor of plain TCP stream s, found by its two addresses among this process's
 * descriptors; -1 when there is none. Never for a TLS stream: its bytes are not the socket's.
 */
int stream_socket(nng_stream *s);

#endif
