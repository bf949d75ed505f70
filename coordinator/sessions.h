/*
 * Client sessions as a service (session_service.c): OpenSession, RenewSession and
 * CloseSession, and the reaper that ends sessions whose lease ran out. Ending a session aborts
 * its running step (the step's watcher sees it) and frees its buffers on every host.
 */
#ifndef PODEMU_COORD_SESSIONS_H
#define PODEMU_COORD_SESSIONS_H

#include "service.h"

int h_open_session(void *state, struct arena *a, const void *request, void *reply,
                   struct status *st);
int h_renew_session(void *state, struct arena *a, const void *request, void *reply,
                    struct status *st);
int h_close_session(void *state, struct arena *a, const void *request, void *reply,
                    struct status *st);

/* Starts and stops the thread that ends expired sessions. */
int sessions_start_reaper(struct coordinator *co, struct status *st);
void sessions_stop_reaper(struct coordinator *co);

#endif
