/*
 * Dispatch: the coordinator's calls to its agents. Every call to a host that is lost or
 * restarts meanwhile is given up (UNAVAILABLE) rather than waited for.
 */
#ifndef PODEMU_DISPATCH_H
#define PODEMU_DISPATCH_H

#include <stdint.h>

#include "arena.h"
#include "rpc.h"
#include "service.h"
#include "status.h"

/*
 * Calls method on every host with requests[h] (NULL: skip h), replies[h] and sts[h] per host.
 * Returns the first error in host order, or OK.
 */
int fan_call(struct coordinator *co, struct rpc_client **clients, unsigned method,
             const void *const *requests, struct arena *a, void **replies, struct status *sts,
             int timeout_ms, struct status *st);

/*
 * fan_call for a step's phases (step_id), watching the hosts while it runs: a lost host fails
 * the step everywhere at once, and a collective that timed out on one host is aborted
 * everywhere with the cores that never arrived at it (DEADLINE_EXCEEDED names them). When the
 * step's client session (0: none) ends, the step is aborted everywhere (CANCELLED).
 */
int fan_call_watched(struct coordinator *co, struct rpc_client **clients, unsigned method,
                     int timeout_ms, uint64_t step_id, uint64_t session,
                     const void *const *requests, struct arena *a, void **replies,
                     struct status *sts, struct status *st);

/* One call to one host; *reply from a. */
int call_host(struct coordinator *co, int host, struct rpc_client *client, unsigned method,
              const void *req, struct arena *a, void **reply, struct status *st);

/* The same request for every one of n hosts (from a), or NULL. */
const void **same_for_all(struct arena *a, int n, const void *request);

#endif
