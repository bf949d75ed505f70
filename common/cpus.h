/*
 * CPU lists as taskset and cgroups write them ("0-3,8"), and the placement of a pod's agents
 * on the CPUs of one machine.
 */
#ifndef PODEMU_CPUS_H
#define PODEMU_CPUS_H

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>

#include "status.h"

/* Parses a list such as "0-3,8" into set; INVALID_ARGUMENT says what is wrong with it. */
int cpus_parse(cpu_set_t *set, const char *list, struct status *st);
/* Writes set as a list ("0-3,8") into out; false when it does not fit. */
bool cpus_format(const cpu_set_t *set, char *out, size_t len);
/*
 * The CPUs this process may run on (its affinity mask, which taskset and cgroups narrow) into
 * set; returns how many. Where the mask cannot be read: CPU 0 alone, 1.
 */
int cpus_allowed(cpu_set_t *set);
/*
 * The CPUs of `allowed` that agent h of n gets: a block of consecutive allowed CPUs each when
 * there are at least n, else one CPU, taken round-robin (agents h and h + #allowed share).
 * Neighbours in a ring then sit on different CPUs, as they would on different hosts.
 */
void cpus_for_agent(cpu_set_t *out, const cpu_set_t *allowed, int h, int n);

#endif
