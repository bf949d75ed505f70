/*
 * What the coordinator's service (service.c) and its steps (step.c) share: the agents' clients
 * when the pod is ready, releasing buffers everywhere, and the ExecuteStep handler.
 */
#ifndef PODEMU_COORD_STEPS_H
#define PODEMU_COORD_STEPS_H

#include "service.h"

/*
 * Snapshot of the agents' clients (and data URLs, when asked) taken under the lock; fails when
 * the pod is not ready.
 */
int snapshot_hosts(struct coordinator *co, struct arena *a, struct rpc_client ***clients,
                   char ***data_urls, struct status *st);
/* Releases handles on every agent but the skipped hosts (errors ignored). */
void release_everywhere(struct coordinator *co, struct arena *a, struct rpc_client **clients,
                        uint64_t *handles, size_t n, const int *skip_host);
/*
 * Releases handles on every live host, whether or not the pod is ready (a lost host has
 * nothing left to free). Errors are ignored.
 */
void release_on_live_hosts(struct coordinator *co, struct arena *a, uint64_t *handles, size_t n);
/* ExecuteStep: check, compile, plan, dispatch and run one step (or only plan it). */
int h_execute_step(void *state, struct arena *a, const void *request, void *reply,
                   struct status *st);

#endif
