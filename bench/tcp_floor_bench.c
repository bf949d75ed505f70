/*
 * What moving bytes over loopback TCP costs in CPU on this machine: the floor under every
 * collective of a pod whose agents share it. One process streams MIB MiB to another in 4 MiB
 * writes (as the data plane does, TCP_NODELAY on); each side's CPU time is read from
 * getrusage. A collective in which each of RANKS ranks sends and receives B bytes then needs
 * at least RANKS * B * (send + receive cost) of CPU, so on this machine's CPUs its busbw
 * (which is B over the time for all-gather, reduce-scatter and all-reduce alike) cannot pass
 * CPUS / (RANKS * cost per byte). Prints every round, the median and that ceiling.
 *
 *   podemu-bench-tcp-floor [MIB] [RANKS] [ROUNDS]    (default 2048 4 3)
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cpus.h"

#define WRITE_BYTES ((size_t)4 << 20)

struct round {
	double gbps;      /* bytes moved per second of wall time, in GB/s */
	double send_s_gb; /* the sender's CPU seconds per GB */
	double recv_s_gb; /* the receiver's */
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static double cpu_s(const struct rusage *u)
{
	return (double)u->ru_utime.tv_sec + u->ru_utime.tv_usec / 1e6 + (double)u->ru_stime.tv_sec +
	       u->ru_stime.tv_usec / 1e6;
}

static void die(const char *what)
{
	perror(what);
	exit(1);
}

/* The receiving process: reads total bytes, answers one byte, exits. */
static void receive_all(const struct sockaddr_in *at, size_t total)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	char *buf = malloc(WRITE_BYTES);
	if (s < 0 || buf == NULL || connect(s, (const struct sockaddr *)at, sizeof(*at)) != 0)
		_exit(1);
	memset(buf, 0, WRITE_BYTES);
	for (size_t got = 0; got < total;) {
		size_t want = total - got < WRITE_BYTES ? total - got : WRITE_BYTES;
		ssize_t n = recv(s, buf, want, MSG_WAITALL);
		if (n <= 0)
			_exit(1);
		got += (size_t)n;
	}
	_exit(send(s, "k", 1, 0) == 1 ? 0 : 1);
}

static struct round one_round(size_t total)
{
	int ls = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in at = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(at);
	if (ls < 0 || bind(ls, (struct sockaddr *)&at, sizeof(at)) != 0 ||
	    getsockname(ls, (struct sockaddr *)&at, &len) != 0 || listen(ls, 1) != 0)
		die("listen on loopback");
	pid_t child = fork();
	if (child < 0)
		die("fork");
	if (child == 0)
		receive_all(&at, total);
	int s = accept(ls, NULL, NULL);
	int one = 1;
	if (s < 0 || setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0)
		die("accept");
	char *buf = malloc(WRITE_BYTES);
	if (buf == NULL)
		die("malloc");
	memset(buf, 1, WRITE_BYTES);
	struct rusage before, after, theirs;
	getrusage(RUSAGE_SELF, &before);
	double t0 = now_s();
	for (size_t sent = 0; sent < total;) {
		size_t want = total - sent < WRITE_BYTES ? total - sent : WRITE_BYTES;
		ssize_t n = send(s, buf, want, MSG_NOSIGNAL);
		if (n <= 0)
			die("send");
		sent += (size_t)n;
	}
	char ack;
	if (recv(s, &ack, 1, MSG_WAITALL) != 1)
		die("the receiver did not answer");
	double wall = now_s() - t0;
	getrusage(RUSAGE_SELF, &after);
	int status;
	if (wait4(child, &status, 0, &theirs) != child || !WIFEXITED(status) ||
	    WEXITSTATUS(status) != 0)
		die("the receiver failed");
	close(s);
	close(ls);
	free(buf);
	double gb = (double)total / 1e9;
	return (struct round){gb / wall, (cpu_s(&after) - cpu_s(&before)) / gb,
	                      cpu_s(&theirs) / gb};
}

static int by_cost(const void *a, const void *b)
{
	const struct round *x = a, *y = b;
	double cx = x->send_s_gb + x->recv_s_gb, cy = y->send_s_gb + y->recv_s_gb;
	return (cx > cy) - (cx < cy);
}

int main(int argc, char **argv)
{
	long mib = argc > 1 ? atol(argv[1]) : 2048;
	int ranks = argc > 2 ? atoi(argv[2]) : 4;
	int rounds = argc > 3 ? atoi(argv[3]) : 3;
	if (mib < 1 || mib > (1L << 20) || ranks < 2 || rounds < 1 || rounds > 100) {
		fprintf(stderr, "usage: podemu-bench-tcp-floor [MIB 1..1048576] [RANKS >= 2] "
		                "[ROUNDS 1..100]\n");
		return 2;
	}
	/* The CPUs this process may run on, as podemu up counts them for its agents. */
	cpu_set_t allowed;
	long cpus = cpus_allowed(&allowed);
	struct round r[100];
	for (int i = 0; i < rounds; i++) {
		r[i] = one_round((size_t)mib << 20);
		printf("round %d: %.2f GB/s; CPU seconds per GB: send %.3f, receive %.3f\n", i + 1,
		       r[i].gbps, r[i].send_s_gb, r[i].recv_s_gb);
	}
	qsort(r, (size_t)rounds, sizeof(r[0]), by_cost);
	struct round m = r[rounds / 2];
	double cost = m.send_s_gb + m.recv_s_gb;
	printf("median: %.3f CPU seconds per GB sent and received over loopback TCP\n", cost);
	printf("busbw ceiling for %d ranks on %ld CPUs: %.2f GB/s\n", ranks, cpus,
	       (double)cpus / (ranks * cost));
	return 0;
}
