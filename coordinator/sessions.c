/*
 * The coordinator's client sessions: who holds device buffers. A session stays open while
 * requests or renewals that carry it keep arriving within its lease; then it ends, and what
 * it owned is freed (session_service.c). Ended sessions are kept a while so that a late
 * request hears why. Every function runs with the registry's lock held.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "registry.h"

/* Ended sessions remembered for their reason, at most. */
#define ENDED_KEPT 64

/* The position of session id, or -1. Sessions are kept in the order they opened, by id. */
static int position_of(const struct registry *r, uint64_t id)
{
	int lo = 0, hi = r->num_sessions;
	while (lo < hi) {
		int mid = lo + (hi - lo) / 2;
		if (r->sessions[mid].id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < r->num_sessions && r->sessions[lo].id == id ? lo : -1;
}

static struct session *find(const struct registry *r, uint64_t id)
{
	int i = position_of(r, id);
	return i >= 0 ? &r->sessions[i] : NULL;
}

/* Forgets the oldest ended sessions beyond ENDED_KEPT. */
static void prune_ended(struct registry *r)
{
	int ended = 0;
	for (int i = 0; i < r->num_sessions; i++)
		ended += r->sessions[i].state == SESSION_ENDED;
	for (int i = 0; i < r->num_sessions && ended > ENDED_KEPT;) {
		if (r->sessions[i].state != SESSION_ENDED) {
			i++;
			continue;
		}
		memmove(&r->sessions[i], &r->sessions[i + 1],
		        (size_t)(r->num_sessions - i - 1) * sizeof(r->sessions[0]));
		r->num_sessions--;
		ended--;
	}
}

int session_open(struct registry *r, int pid, const char *host_name, const char *name, int lease_ms,
                 uint64_t *id, struct status *st)
{
	if (lease_ms != 0 && (lease_ms < 100 || lease_ms > 3600 * 1000))
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "session lease %d ms is out of range [100, 3600000]", lease_ms);
	prune_ended(r);
	if (r->num_sessions == r->cap_sessions) {
		int cap = r->cap_sessions ? r->cap_sessions * 2 : 16;
		struct session *s = realloc(r->sessions, (size_t)cap * sizeof(*s));
		if (s == NULL)
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		r->sessions = s;
		r->cap_sessions = cap;
	}
	struct session *s = &r->sessions[r->num_sessions++];
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	*s = (struct session){
	    .id = r->epoch << HANDLE_EPOCH_SHIFT | r->next_session++,
	    .pid = pid,
	    .started_unix_ms = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000,
	    .last_seen_ms = registry_now_ms(),
	    .lease_ms = lease_ms ? lease_ms : r->session_lease_ms,
	    .state = SESSION_OPEN,
	    .named_next = r->next_handle,
	    .named_end = r->next_handle + SESSION_HANDLE_BLOCK,
	    .next_sequence = 1,
	};
	r->next_handle += SESSION_HANDLE_BLOCK;
	if (r->next_handle >> HANDLE_EPOCH_SHIFT != r->epoch) {
		/* This coordinator's handles would run out: the session names none of its own. */
		r->next_handle -= SESSION_HANDLE_BLOCK;
		s->named_next = s->named_end = 0;
	}
	snprintf(s->host_name, sizeof(s->host_name), "%s", host_name ? host_name : "");
	snprintf(s->name, sizeof(s->name), "%s", name ? name : "");
	*id = s->id;
	return ST_OK;
}

int session_use(struct registry *r, uint64_t id, struct status *st)
{
	if (id == 0)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "the request carries no session (OpenSession first; pe_connect "
		                  "does it)");
	if (id >> HANDLE_EPOCH_SHIFT != r->epoch)
		return status_set(
		    st, ST_NOT_FOUND,
		    "session %llu was opened with an earlier coordinator process (the "
		    "coordinator restarted); its buffers are gone",
		    (unsigned long long)id);
	struct session *s = find(r, id);
	if (s == NULL)
		return status_set(st, ST_NOT_FOUND,
		                  "session %llu is not open (it ended long ago, or never was)",
		                  (unsigned long long)id);
	if (s->state != SESSION_OPEN)
		return status_set(st, ST_NOT_FOUND, "session %llu has ended: %s",
		                  (unsigned long long)id, s->end_reason);
	s->last_seen_ms = registry_now_ms();
	return ST_OK;
}

bool session_is_open(const struct registry *r, uint64_t id)
{
	const struct session *s = find(r, id);
	return s != NULL && s->state == SESSION_OPEN;
}

struct session *session_find(struct registry *r, uint64_t id)
{
	struct session *s = find(r, id);
	return s != NULL && s->state == SESSION_OPEN ? s : NULL;
}

int session_name_outputs(struct registry *r, uint64_t id, const uint64_t *handles, size_t n,
                         struct status *st)
{
	struct session *s = session_find(r, id);
	if (s == NULL)
		return status_set(st, ST_NOT_FOUND, "session %llu is not open",
		                  (unsigned long long)id);
	uint64_t next = s->named_next;
	for (size_t k = 0; k < n; k++) {
		if (handles[k] < next || handles[k] >= s->named_end)
			return status_set(
			    st, ST_INVALID_ARGUMENT,
			    "output %zu: handle %llu is not one session %llu may name now (its "
			    "block is [%llu, %llu), ascending, each once; next free %llu)",
			    k, (unsigned long long)handles[k], (unsigned long long)id,
			    (unsigned long long)(s->named_end - SESSION_HANDLE_BLOCK),
			    (unsigned long long)s->named_end, (unsigned long long)next);
		next = handles[k] + 1;
	}
	s->named_next = next;
	return ST_OK;
}

int session_expire(struct registry *r, int64_t now_ms, uint64_t *ids, int max)
{
	int n = 0;
	for (int i = 0; i < r->num_sessions && n < max; i++) {
		struct session *s = &r->sessions[i];
		if (s->state != SESSION_OPEN || now_ms - s->last_seen_ms <= s->lease_ms)
			continue;
		s->state = SESSION_ENDING;
		snprintf(s->end_reason, sizeof(s->end_reason),
		         "its lease of %d ms ran out (the client exited or cannot reach the "
		         "coordinator)",
		         s->lease_ms);
		ids[n++] = s->id;
	}
	return n;
}

int session_begin_end(struct registry *r, uint64_t id, const char *reason, struct status *st)
{
	int rv = session_use(r, id, st);
	if (rv != ST_OK)
		return rv;
	struct session *s = find(r, id);
	s->state = SESSION_ENDING;
	snprintf(s->end_reason, sizeof(s->end_reason), "%s", reason);
	return ST_OK;
}

size_t session_take_handles(struct registry *r, uint64_t id, uint64_t *out)
{
	size_t n = 0;
	for (int i = 0; out != NULL && i < r->num_handles; i++)
		if (r->handles[i].session == id)
			out[n++] = r->handles[i].handle;
	for (size_t k = 0; k < n; k++)
		registry_remove_handle(r, out[k]);
	struct session *s = find(r, id);
	if (s != NULL)
		s->state = SESSION_ENDED;
	return n;
}

void session_usage(const struct registry *r, uint64_t id, int *buffers, int64_t *bytes)
{
	*buffers = 0;
	*bytes = 0;
	for (int i = 0; i < r->num_handles; i++)
		if (r->handles[i].session == id) {
			(*buffers)++;
			*bytes += r->handles[i].bytes;
		}
}

void session_usage_all(const struct registry *r, int *buffers, int64_t *bytes)
{
	memset(buffers, 0, (size_t)r->num_sessions * sizeof(*buffers));
	memset(bytes, 0, (size_t)r->num_sessions * sizeof(*bytes));
	for (int i = 0; i < r->num_handles; i++) {
		int k = position_of(r, r->handles[i].session);
		if (k >= 0) {
			buffers[k]++;
			bytes[k] += r->handles[i].bytes;
		}
	}
}
