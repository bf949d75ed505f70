/* The socket under a plain TCP nng stream (stream_socket.h). */
#include "stream_socket.h"

#include <dirent.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/socket.h>

/* Whether descriptor fd is the TCP socket from la to ra (the local end checked first). */
static bool is_socket_of(int fd, const nng_sockaddr *la, const nng_sockaddr *ra)
{
	struct sockaddr_in a, b;
	socklen_t al = sizeof(a), bl = sizeof(b);
	return getsockname(fd, (struct sockaddr *)&a, &al) == 0 && a.sin_family == AF_INET &&
	       a.sin_port == la->s_in.sa_port && a.sin_addr.s_addr == la->s_in.sa_addr &&
	       getpeername(fd, (struct sockaddr *)&b, &bl) == 0 && b.sin_family == AF_INET &&
	       b.sin_port == ra->s_in.sa_port && b.sin_addr.s_addr == ra->s_in.sa_addr;
}

/*
 * Where the last one was found. Streams come in bursts (a step's peers dialled at once), each
 * given the lowest free descriptor, so the next is most often close by: looking there first
 * spares a scan of every descriptor, which with thousands of them (a process of many hosts)
 * cost more than everything else a big pod's step did.
 */
static atomic_int last_found = -1;
#define NEAR 32

int stream_socket(nng_stream *s)
{
	nng_sockaddr la, ra;
	if (nng_stream_get_addr(s, NNG_OPT_LOCADDR, &la) != 0 ||
	    nng_stream_get_addr(s, NNG_OPT_REMADDR, &ra) != 0 || la.s_family != NNG_AF_INET ||
	    ra.s_family != NNG_AF_INET)
		return -1;
	int found = -1;
	int hint = atomic_load_explicit(&last_found, memory_order_relaxed);
	for (int fd = hint + NEAR; hint >= 0 && found < 0 && fd >= 0 && fd >= hint - NEAR; fd--)
		if (is_socket_of(fd, &la, &ra))
			found = fd;
	DIR *d = found < 0 ? opendir("/proc/self/fd") : NULL;
	struct dirent *e;
	while (d != NULL && found < 0 && (e = readdir(d)) != NULL) {
		char *end;
		long fd = strtol(e->d_name, &end, 10);
		if (*end == '\0' && end != e->d_name && fd != dirfd(d) &&
		    is_socket_of((int)fd, &la, &ra))
			found = (int)fd;
	}
	if (d != NULL)
		closedir(d);
	if (found >= 0)
		atomic_store_explicit(&last_found, found, memory_order_relaxed);
	return found;
}
