/*
 * Sessions as a service: opening, renewing and closing them, and a reaper thread that ends the
 * ones whose lease ran out. A session ends in two moves: it is marked ENDING (a step of it that
 * runs is aborted by its watcher, and nothing new is accepted from it), then, once no step
 * runs (the step lock), its buffers leave the table and every live host frees them.
 */
#include "sessions.h"

#include <stdlib.h>

#include "clock.h"
#include "log.h"
#include "podemu.pb-c.h"
#include "steps.h"

int h_open_session(void *state, struct arena *a, const void *request, void *reply,
                   struct status *st)
{
	struct coordinator *co = state;
	const Podemu__OpenSessionRequest *req = request;
	Podemu__OpenSessionReply *rep = reply;
	uint64_t id;
	pthread_mutex_lock(&co->reg.lock);
	int rv =
	    session_open(&co->reg, req->pid, req->host_name, req->name, req->lease_ms, &id, st);
	int lease = rv == ST_OK ? (req->lease_ms ? req->lease_ms : co->reg.session_lease_ms) : 0;
	const struct session *s = rv == ST_OK ? session_find(&co->reg, id) : NULL;
	if (s != NULL) {
		rep->handle_base = s->named_next;
		rep->handle_count = s->named_end - s->named_next;
	}
	pthread_mutex_unlock(&co->reg.lock);
	if (rv != ST_OK)
		return rv;
	rep->session = id;
	rep->lease_ms = lease;
	rep->coordinator_epoch = co->reg.epoch;
	log_info("session %llu opened: %s (pid %d on %s), lease %d ms", (unsigned long long)id,
	         req->name ? req->name : "", req->pid, req->host_name ? req->host_name : "", lease);
	return ST_OK;
}

int h_renew_session(void *state, struct arena *a, const void *request, void *reply,
                    struct status *st)
{
	struct coordinator *co = state;
	const Podemu__SessionRequest *req = request;
	pthread_mutex_lock(&co->reg.lock);
	int rv = session_use(&co->reg, req->session, st);
	pthread_mutex_unlock(&co->reg.lock);
	return rv;
}

/*
 * Frees an ENDING session's buffers, once no step runs (one of its own may be aborting); the
 * session is then ENDED. One without buffers ends at once: none can join it any more.
 */
static void finish_session(struct coordinator *co, uint64_t id)
{
	int owned;
	int64_t bytes;
	pthread_mutex_lock(&co->reg.lock);
	session_usage(&co->reg, id, &owned, &bytes);
	if (owned == 0)
		session_take_handles(&co->reg, id, NULL);
	pthread_mutex_unlock(&co->reg.lock);
	if (owned == 0) {
		log_info("session %llu ended; it held no device buffers", (unsigned long long)id);
		return;
	}
	struct arena *a = arena_new();
	pthread_mutex_lock(&co->step_lock);
	pthread_mutex_lock(&co->reg.lock);
	uint64_t *handles =
	    a ? arena_calloc(a, (size_t)co->reg.num_handles + 1, sizeof(uint64_t)) : NULL;
	size_t n = 0;
	if (handles != NULL)
		n = session_take_handles(&co->reg, id, handles);
	pthread_mutex_unlock(&co->reg.lock);
	if (n > 0)
		release_on_live_hosts(co, a, handles, n);
	pthread_mutex_unlock(&co->step_lock);
	if (handles == NULL)
		log_error("session %llu: out of host memory; its buffers stay",
		          (unsigned long long)id);
	else
		log_info("session %llu ended: freed its %zu device buffers (%lld bytes per core)",
		         (unsigned long long)id, n, (long long)bytes);
	arena_free(a);
}

int h_close_session(void *state, struct arena *a, const void *request, void *reply,
                    struct status *st)
{
	struct coordinator *co = state;
	const Podemu__SessionRequest *req = request;
	pthread_mutex_lock(&co->reg.lock);
	int rv = session_begin_end(&co->reg, req->session, "the client closed it", st);
	pthread_mutex_unlock(&co->reg.lock);
	if (rv == ST_OK)
		finish_session(co, req->session);
	return rv;
}

/* How often the reaper looks, and how many sessions it ends in one look at most. */
#define REAPER_TICK_MS 100
#define REAPER_BATCH 64

static void *reaper_main(void *arg)
{
	struct coordinator *co = arg;
	pthread_mutex_lock(&co->reaper_lock);
	while (!co->reaper_stop) {
		struct timespec ts = clock_deadline_ms(REAPER_TICK_MS);
		pthread_cond_timedwait(&co->reaper_cv, &co->reaper_lock, &ts);
		if (co->reaper_stop)
			break;
		pthread_mutex_unlock(&co->reaper_lock);
		uint64_t ids[REAPER_BATCH];
		pthread_mutex_lock(&co->reg.lock);
		int n = session_expire(&co->reg, registry_now_ms(), ids, REAPER_BATCH);
		pthread_mutex_unlock(&co->reg.lock);
		for (int i = 0; i < n; i++) {
			log_warn("session %llu: its lease ran out; ending it",
			         (unsigned long long)ids[i]);
			finish_session(co, ids[i]);
		}
		pthread_mutex_lock(&co->reaper_lock);
	}
	pthread_mutex_unlock(&co->reaper_lock);
	return NULL;
}

int sessions_start_reaper(struct coordinator *co, struct status *st)
{
	pthread_mutex_init(&co->reaper_lock, NULL);
	pthread_cond_init(&co->reaper_cv, NULL);
	co->reaper_stop = false;
	if (pthread_create(&co->reaper, NULL, reaper_main, co) != 0)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "cannot start the session reaper");
	return ST_OK;
}

void sessions_stop_reaper(struct coordinator *co)
{
	pthread_mutex_lock(&co->reaper_lock);
	co->reaper_stop = true;
	pthread_cond_broadcast(&co->reaper_cv);
	pthread_mutex_unlock(&co->reaper_lock);
	pthread_join(co->reaper, NULL);
}
