#include "cache.h"

#include <stdlib.h>
#include <string.h>

/* FNV-1a, 64 bits. */
static uint64_t fnv1a(const uint8_t *p, size_t len)
{
	uint64_t h = 14695981039346656037ULL;
	for (size_t i = 0; i < len; i++) {
		h ^= p[i];
		h *= 1099511628211ULL;
	}
	return h;
}

int cache_key(const Podemu__Graph *g, struct arena *a, uint8_t **key, size_t *len, uint64_t *hash)
{
	uint64_t *handles = arena_calloc(a, g->n_nodes + 1, sizeof(uint64_t));
	if (handles == NULL)
		return -1;
	for (size_t i = 0; i < g->n_nodes; i++) {
		handles[i] = g->nodes[i]->handle;
		g->nodes[i]->handle = 0;
	}
	*len = podemu__graph__get_packed_size(g);
	*key = arena_alloc(a, *len + 1);
	if (*key != NULL)
		podemu__graph__pack(g, *key);
	for (size_t i = 0; i < g->n_nodes; i++)
		g->nodes[i]->handle = handles[i];
	if (*key == NULL)
		return -1;
	*hash = fnv1a(*key, *len);
	return 0;
}

struct cache_entry *cache_find(struct program_cache *c, const uint8_t *key, size_t len,
                               uint64_t hash)
{
	for (int i = 0; i < PROGRAM_CACHE_ENTRIES; i++) {
		struct cache_entry *e = &c->entries[i];
		if (e->arena != NULL && e->hash == hash && e->key_len == len &&
		    memcmp(e->key, key, len) == 0) {
			e->last_used = ++c->clock;
			c->hits++;
			return e;
		}
	}
	c->misses++;
	return NULL;
}

static int *copy_ints(struct arena *a, const int *src, int n)
{
	if (src == NULL)
		return NULL;
	int *dst = arena_calloc(a, (size_t)n + 1, sizeof(int));
	if (dst != NULL)
		memcpy(dst, src, (size_t)n * sizeof(int));
	return dst;
}

/* A deep copy of b (its elements too). */
static Podemu__BufferAssignment *copy_assignment(struct arena *a, const Podemu__BufferAssignment *b)
{
	Podemu__BufferAssignment *copy = arena_alloc(a, sizeof(*copy));
	if (copy == NULL)
		return NULL;
	*copy = *b;
	if (b->n_elements == 0)
		return copy;
	copy->elements = arena_calloc(a, b->n_elements + 1, sizeof(*copy->elements));
	if (copy->elements == NULL)
		return NULL;
	for (size_t k = 0; k < b->n_elements; k++)
		if ((copy->elements[k] = copy_assignment(a, b->elements[k])) == NULL)
			return NULL;
	return copy;
}

struct cache_entry *cache_store(struct program_cache *c, const uint8_t *key, size_t len,
                                uint64_t hash, const struct compiled *compiled)
{
	struct cache_entry *victim = &c->entries[0];
	for (int i = 0; i < PROGRAM_CACHE_ENTRIES; i++) {
		struct cache_entry *e = &c->entries[i];
		if (e->arena == NULL) {
			victim = e;
			break;
		}
		if (e->last_used < victim->last_used)
			victim = e;
	}
	arena_free(victim->arena);
	memset(victim, 0, sizeof(*victim));
	struct arena *a = arena_new();
	if (a == NULL)
		return NULL;
	int n = compiled->n, total = compiled->n_total;
	struct compiled *dst = &victim->compiled;
	*dst = *compiled;
	victim->key = arena_alloc(a, len + 1);
	dst->order = copy_ints(a, compiled->order, n);
	dst->fused_into = copy_ints(a, compiled->fused_into, total);
	dst->computation_order = copy_ints(a, compiled->computation_order, total - n);
	dst->live = arena_calloc(a, (size_t)compiled->n_live + 1, sizeof(int64_t));
	if (dst->live != NULL && compiled->live != NULL)
		memcpy(dst->live, compiled->live, (size_t)compiled->n_live * sizeof(int64_t));
	dst->plan.buffers = arena_calloc(a, (size_t)total + 1, sizeof(*dst->plan.buffers));
	bool ok = victim->key && dst->plan.buffers && dst->live &&
	          (!compiled->order || dst->order) && (!compiled->fused_into || dst->fused_into) &&
	          (!compiled->computation_order || dst->computation_order);
	for (int i = 0; ok && i < total; i++)
		ok = (dst->plan.buffers[i] = copy_assignment(a, compiled->plan.buffers[i])) != NULL;
	if (!ok) {
		arena_free(a);
		memset(victim, 0, sizeof(*victim));
		return NULL;
	}
	memcpy(victim->key, key, len);
	victim->key_len = len;
	victim->hash = hash;
	victim->arena = a;
	victim->last_used = ++c->clock;
	return victim;
}

void cache_free(struct program_cache *c)
{
	for (int i = 0; i < PROGRAM_CACHE_ENTRIES; i++)
		arena_free(c->entries[i].arena);
	memset(c, 0, sizeof(*c));
}
