/*
 * The coordinator's device buffer table: dense entries (for walks over every buffer) and a
 * hash index from handle to entry (common/hindex.c). Every function runs with the registry's
 * lock held.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "registry.h"

struct handle_entry *registry_find_handle(struct registry *r, uint64_t handle)
{
	int i = hindex_find(&r->index, r->handles, sizeof(r->handles[0]), handle);
	return i >= 0 ? &r->handles[i] : NULL;
}

int registry_add_handle(struct registry *r, uint64_t handle, uint64_t session, int64_t bytes,
                        const struct shape *shape, const char *layout, struct status *st)
{
	if (layout != NULL && strlen(layout) >= LAYOUT_TEXT_MAX)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "layout %.40s...: longer than %d characters", layout,
		                  LAYOUT_TEXT_MAX - 1);
	/* No buffer joins a session that is ending: what it owns is being freed. */
	if (!session_is_open(r, session))
		return status_set(st, ST_CANCELLED, "session %llu has ended",
		                  (unsigned long long)session);
	if (registry_find_handle(r, handle) != NULL)
		return status_set(st, ST_INTERNAL, "device buffer %llu is already in the table",
		                  (unsigned long long)handle);
	if (r->num_handles == r->cap_handles) {
		int cap = r->cap_handles ? r->cap_handles * 2 : 64;
		struct handle_entry *e = realloc(r->handles, (size_t)cap * sizeof(*e));
		if (e == NULL)
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		r->handles = e;
		r->cap_handles = cap;
	}
	int i = r->num_handles;
	struct handle_entry *e = &r->handles[i];
	*e = (struct handle_entry){.handle = handle,
	                           .session = session,
	                           .bytes = bytes,
	                           .serial = r->next_serial,
	                           .shape = *shape};
	snprintf(e->layout, sizeof(e->layout), "%s", layout != NULL ? layout : "");
	if (hindex_add(&r->index, r->handles, sizeof(r->handles[0]), i + 1, i) != 0)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	r->num_handles++;
	r->next_serial++;
	return ST_OK;
}

void registry_remove_handle(struct registry *r, uint64_t handle)
{
	int i = hindex_find(&r->index, r->handles, sizeof(r->handles[0]), handle);
	if (i < 0)
		return;
	int last = r->num_handles - 1;
	hindex_remove(&r->index, r->handles, sizeof(r->handles[0]), i, last);
	r->handles[i] = r->handles[last];
	r->num_handles--;
}

int registry_unknown_handle(const struct registry *r, uint64_t handle, uint64_t session,
                            struct status *st)
{
	if (handle >> HANDLE_EPOCH_SHIFT != r->epoch)
		return status_set(
		    st, ST_NOT_FOUND,
		    "device buffer %llu was made by an earlier coordinator process (the "
		    "coordinator restarted); its data is gone",
		    (unsigned long long)handle);
	/* The same words whether another session owns it or none does: nothing leaks. */
	return status_set(st, ST_NOT_FOUND,
	                  "unknown device buffer %llu in session %llu (never created, released, "
	                  "or another session's)",
	                  (unsigned long long)handle, (unsigned long long)session);
}

struct handle_entry *registry_use_handle(struct registry *r, uint64_t handle, uint64_t session,
                                         struct status *st)
{
	struct handle_entry *e = registry_find_handle(r, handle);
	if (e == NULL || e->session != session) {
		registry_unknown_handle(r, handle, session, st);
		return NULL;
	}
	int cph = r->topo.cores_per_host;
	for (int h = 0; h < r->topo.num_hosts; h++)
		if (e->serial < r->hosts[h].data_floor) {
			status_set(
			    st, ST_DATA_LOSS,
			    "device buffer %llu lost its shards on host %d (cores %d..%d) when "
			    "that host's agent restarted; release it and compute it again",
			    (unsigned long long)handle, h, h * cph, (h + 1) * cph - 1);
			return NULL;
		}
	return e;
}
