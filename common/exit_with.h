/*
 * A daemon that lives no longer than another process: PODEMU_EXIT_WITH=PID makes the
 * coordinator and the agents shut down (as on SIGTERM) once process PID has exited, so that
 * a pod started for a job, a notebook or a test goes away with it even when that process is
 * killed outright and cannot run `podemu down`.
 */
#ifndef PODEMU_EXIT_WITH_H
#define PODEMU_EXIT_WITH_H

#include <sys/types.h>

#include "status.h"

/*
 * Reads PODEMU_EXIT_WITH: *fd is -1 when it is unset or empty, else a descriptor that becomes
 * readable once that process has exited (a pidfd; watch it in the daemon's event loop) and
 * *pid its process. INVALID_ARGUMENT: not a process id; NOT_FOUND: no such process (it
 * exited already); UNAVAILABLE: this kernel cannot watch a process (pidfd_open).
 */
int exit_with_open(int *fd, pid_t *pid, struct status *st);

#endif
