/*
 * The coordinator's device buffer table: dense entries (for walks over every buffer) and an
 * open-addressing index (linear probing) from handle to entry, so that a lookup costs the same
 * with ten buffers or a million. Every function runs with the registry's lock held.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "registry.h"

static size_t slot_of(const struct registry *r, uint64_t handle)
{
	uint64_t x = handle; /* splitmix64's finalizer: every bit moves every bit */
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	return (size_t)(x ^ (x >> 31)) & (r->num_slots - 1);
}

/* The slot holding handle, or the empty slot where it would go. */
static size_t probe(const struct registry *r, uint64_t handle)
{
	size_t s = slot_of(r, handle);
	while (r->slots[s] != 0 && r->handles[r->slots[s] - 1].handle != handle)
		s = (s + 1) & (r->num_slots - 1);
	return s;
}

/* A larger index, at most half full. */
static int grow_index(struct registry *r, size_t want_entries)
{
	size_t n = r->num_slots ? r->num_slots : 128;
	while (n < 2 * want_entries)
		n *= 2;
	if (n == r->num_slots)
		return 0;
	int *slots = calloc(n, sizeof(*slots));
	if (slots == NULL)
		return -1;
	free(r->slots);
	r->slots = slots;
	r->num_slots = n;
	for (int i = 0; i < r->num_handles; i++)
		r->slots[probe(r, r->handles[i].handle)] = i + 1;
	return 0;
}

struct handle_entry *registry_find_handle(struct registry *r, uint64_t handle)
{
	if (r->num_slots == 0)
		return NULL;
	size_t s = probe(r, handle);
	return r->slots[s] != 0 ? &r->handles[r->slots[s] - 1] : NULL;
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
	if (grow_index(r, (size_t)r->num_handles + 1) != 0)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	int i = r->num_handles++;
	struct handle_entry *e = &r->handles[i];
	*e = (struct handle_entry){
	    .handle = handle, .session = session, .bytes = bytes, .shape = *shape};
	snprintf(e->layout, sizeof(e->layout), "%s", layout != NULL ? layout : "");
	r->slots[probe(r, handle)] = i + 1;
	return ST_OK;
}

void registry_remove_handle(struct registry *r, uint64_t handle)
{
	if (r->num_slots == 0)
		return;
	size_t hole = probe(r, handle);
	if (r->slots[hole] == 0)
		return;
	int i = r->slots[hole] - 1;
	/* Backward-shift deletion: later entries of the probe run move up into the hole. */
	size_t mask = r->num_slots - 1;
	r->slots[hole] = 0;
	for (size_t s = (hole + 1) & mask; r->slots[s] != 0; s = (s + 1) & mask) {
		size_t home = slot_of(r, r->handles[r->slots[s] - 1].handle);
		/* The entry at s may fill the hole when its home is not within (hole, s]. */
		bool stays = hole <= s ? (home > hole && home <= s) : (home > hole || home <= s);
		if (stays)
			continue;
		r->slots[hole] = r->slots[s];
		r->slots[s] = 0;
		hole = s;
	}
	/* The last entry takes the freed place in the dense array. */
	int last = --r->num_handles;
	if (i != last) {
		r->handles[i] = r->handles[last];
		r->slots[probe(r, r->handles[i].handle)] = i + 1;
	}
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
		if (handle < r->hosts[h].data_floor) {
			status_set(
			    st, ST_DATA_LOSS,
			    "device buffer %llu lost its shards on host %d (cores %d..%d) when "
			    "that host's agent restarted; release it and compute it again",
			    (unsigned long long)handle, h, h * cph, (h + 1) * cph - 1);
			return NULL;
		}
	return e;
}
