/*
 * A bump allocator for everything that belongs to one RPC or one step: decoded requests,
 * replies under construction, scratch. Freed all at once; nothing inside is freed alone.
 */
#ifndef PODEMU_ARENA_H
#define PODEMU_ARENA_H

#include <stddef.h>

#include <protobuf-c/protobuf-c.h>

struct arena;

/* Returns a new empty arena, or NULL when out of memory. */
struct arena *arena_new(void);
/* Frees every allocation made from a, then a itself. NULL is allowed. */
void arena_free(struct arena *a);
/*
 * Makes every allocation of a invalid and keeps its memory for the next ones: a loop that
 * builds and drops the same kind of things again and again allocates once.
 */
void arena_reset(struct arena *a);
/* Zeroed, 16-byte aligned memory that lives until arena_free; NULL when out of memory. */
void *arena_alloc(struct arena *a, size_t size);
/* arena_alloc(count * size) with an overflow check. */
void *arena_calloc(struct arena *a, size_t count, size_t size);
char *arena_strdup(struct arena *a, const char *s);
/* A protobuf-c allocator that allocates from a (its free is a no-op). */
ProtobufCAllocator *arena_protobuf_allocator(struct arena *a);

#endif
