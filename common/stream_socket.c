/* The socket under a plain TCP nng stream (stream_socket.h). */
#include "stream_socket.h"

#include <dirent.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>

int stream_socket(nng_stream *s)
{
	nng_sockaddr la, ra;
	if (nng_stream_get_addr(s, NNG_OPT_LOCADDR, &la) != 0 ||
	    nng_stream_get_addr(s, NNG_OPT_REMADDR, &ra) != 0 || la.s_family != NNG_AF_INET ||
	    ra.s_family != NNG_AF_INET)
		return -1;
	DIR *d = opendir("/proc/self/fd");
	if (d == NULL)
		return -1;
	int found = -1;
	struct dirent *e;
	while (found < 0 && (e = readdir(d)) != NULL) {
		char *end;
		long fd = strtol(e->d_name, &end, 10);
		struct sockaddr_in a, b;
		socklen_t al = sizeof(a), bl = sizeof(b);
		if (*end != '\0' || end == e->d_name || fd == dirfd(d) ||
		    getsockname((int)fd, (struct sockaddr *)&a, &al) != 0 ||
		    a.sin_family != AF_INET ||
		    getpeername((int)fd, (struct sockaddr *)&b, &bl) != 0 ||
		    b.sin_family != AF_INET)
			continue;
		if (a.sin_port == la.s_in.sa_port && a.sin_addr.s_addr == la.s_in.sa_addr &&
		    b.sin_port == ra.s_in.sa_port && b.sin_addr.s_addr == ra.s_in.sa_addr)
			found = (int)fd;
	}
	closedir(d);
	return found;
}
