#include "hindex.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static uint64_t key_of(const void *entries, size_t stride, int i)
{
	uint64_t k;
	memcpy(&k, (const char *)entries + (size_t)i * stride, sizeof(k));
	return k;
}

static size_t home_of(const struct hindex *x, uint64_t handle)
{
	uint64_t h = handle; /* splitmix64's finalizer: every bit moves every bit */
	h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
	h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
	return (size_t)(h ^ (h >> 31)) & (x->num_slots - 1);
}

/* The slot holding handle, or the empty slot where it would go. */
static size_t probe(const struct hindex *x, const void *entries, size_t stride, uint64_t handle)
{
	size_t s = home_of(x, handle);
	while (x->slots[s] != 0 && key_of(entries, stride, x->slots[s] - 1) != handle)
		s = (s + 1) & (x->num_slots - 1);
	return s;
}

int hindex_find(const struct hindex *x, const void *entries, size_t stride, uint64_t handle)
{
	if (x->num_slots == 0)
		return -1;
	return x->slots[probe(x, entries, stride, handle)] - 1;
}

int hindex_add(struct hindex *x, const void *entries, size_t stride, int count, int at)
{
	if ((size_t)count * 2 > x->num_slots) { /* at most half full */
		size_t n = x->num_slots ? x->num_slots : 64;
		while ((size_t)count * 2 > n)
			n *= 2;
		int *slots = calloc(n, sizeof(*slots));
		if (slots == NULL)
			return -1;
		struct hindex old = *x;
		x->slots = slots;
		x->num_slots = n;
		for (size_t s = 0; s < old.num_slots; s++)
			if (old.slots[s] != 0)
				x->slots[probe(x, entries, stride,
				               key_of(entries, stride, old.slots[s] - 1))] =
				    old.slots[s];
		free(old.slots);
	}
	x->slots[probe(x, entries, stride, key_of(entries, stride, at))] = at + 1;
	return 0;
}

void hindex_remove(struct hindex *x, void *entries, size_t stride, int at, int last)
{
	if (x->num_slots == 0)
		return;
	size_t mask = x->num_slots - 1;
	size_t hole = probe(x, entries, stride, key_of(entries, stride, at));
	if (x->slots[hole] == 0)
		return;
	x->slots[hole] = 0;
	/* Backward shift: later entries of the probe run move up into the hole. */
	for (size_t s = (hole + 1) & mask; x->slots[s] != 0; s = (s + 1) & mask) {
		size_t home = home_of(x, key_of(entries, stride, x->slots[s] - 1));
		/* The entry at s may fill the hole when its home is not within (hole, s]. */
		bool stays = hole <= s ? (home > hole && home <= s) : (home > hole || home <= s);
		if (stays)
			continue;
		x->slots[hole] = x->slots[s];
		x->slots[s] = 0;
		hole = s;
	}
	/* The owner moves its last entry into position at: its slot follows. */
	if (at != last)
		x->slots[probe(x, entries, stride, key_of(entries, stride, last))] = at + 1;
}

void hindex_free(struct hindex *x)
{
	free(x->slots);
	x->slots = NULL;
	x->num_slots = 0;
}
