/* PODEMU_EXIT_WITH (exit_with.h): a process whose exit ends the daemon. */
#include "exit_with.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define EXIT_WITH_ENV "PODEMU_EXIT_WITH"

int exit_with_open(int *fd, pid_t *pid, struct status *st)
{
	*fd = -1;
	*pid = 0;
	const char *v = getenv(EXIT_WITH_ENV);
	if (v == NULL || v[0] == '\0')
		return ST_OK;
	char *end;
	errno = 0;
	long n = strtol(v, &end, 10);
	/* Digits only: pid_t is an int, and 0 and -N name process groups, not processes. */
	if (v[0] < '0' || v[0] > '9' || errno != 0 || *end != '\0' || n < 1 || n > INT_MAX)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  EXIT_WITH_ENV "=%s: not a process id (a positive integer)", v);
	int got = (int)syscall(SYS_pidfd_open, (pid_t)n, 0);
	if (got < 0 && errno == ESRCH)
		return status_set(st, ST_NOT_FOUND, EXIT_WITH_ENV "=%ld: no such process", n);
	if (got < 0)
		return status_set(st, ST_UNAVAILABLE,
		                  EXIT_WITH_ENV "=%ld: cannot watch the process: pidfd_open: %s", n,
		                  strerror(errno));
	*fd = got;
	*pid = (pid_t)n;
	return ST_OK;
}
