/*
 * An open-addressing index (linear probing, backward-shift deletion) from 64-bit handles to the
 * positions of entries in an array that its owner keeps (dense, or with entries the index
 * never holds between them): lookups cost the same with ten entries or a million. Every entry
 * begins with its uint64_t handle; entries are `stride` bytes apart. Not thread-safe: the owner
 * locks.
 */
#ifndef PODEMU_HINDEX_H
#define PODEMU_HINDEX_H

#include <stddef.h>
#include <stdint.h>

struct hindex {
	int *slots; /* entry position + 1; 0 is empty */
	size_t num_slots;
};

/* The position of the entry with handle, or -1. */
int hindex_find(const struct hindex *x, const void *entries, size_t stride, uint64_t handle);
/*
 * Indexes the entry at position `at` (its handle already written), count entries with it; -1
 * when out of memory (nothing changes). Positions need not be dense (see hindex_remove).
 */
int hindex_add(struct hindex *x, const void *entries, size_t stride, int count, int at);
/*
 * Forgets the entry at position `at` (call before the owner changes its array); the owner then
 * moves its last entry (position last) into the hole, and the index already points there. An
 * owner whose entries stay where they are passes last = at.
 */
void hindex_remove(struct hindex *x, void *entries, size_t stride, int at, int last);
void hindex_free(struct hindex *x);

#endif
