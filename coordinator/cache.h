/*
 * The compiled-program cache: a training loop submits the same step graph every step, with
 * other buffer handles. The coordinator keys what it compiled (schedule, fusions, buffer plan)
 * by the graph's fingerprint (its serialized form with buffer handles left out) on its own
 * topology and options, and a step whose graph is byte-for-byte the same reuses it.
 */
#ifndef PODEMU_CACHE_H
#define PODEMU_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "plan.h"
#include "podemu.pb-c.h"
#include "status.h"
#include "topology.h"

#define PROGRAM_CACHE_ENTRIES 16

struct cache_entry {
	struct arena *arena; /* owns key and compiled; NULL: empty slot */
	uint64_t hash;
	uint8_t *key;
	size_t key_len;
	uint64_t last_used;
	struct compiled compiled;
};

struct program_cache {
	struct cache_entry entries[PROGRAM_CACHE_ENTRIES];
	uint64_t clock;
	uint64_t hits, misses;
};

/* The fingerprint of g: its packed bytes without parameter handles (from a). */
int cache_key(const Podemu__Graph *g, struct arena *a, uint8_t **key, size_t *len, uint64_t *hash);

/* The entry compiled from the same key, or NULL; counts the hit or miss. */
struct cache_entry *cache_find(struct program_cache *c, const uint8_t *key, size_t len,
                               uint64_t hash);

/*
 * Keeps a deep copy of what was compiled for key, evicting the least recently used entry;
 * returns the entry, or NULL when out of memory. An entry lives until a later store evicts it
 * (every use is under the coordinator's step lock).
 */
struct cache_entry *cache_store(struct program_cache *c, const uint8_t *key, size_t len,
                                uint64_t hash, const struct compiled *compiled);

void cache_free(struct program_cache *c);

#endif
