#include "arena.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ARENA_BLOCK (64 * 1024)

struct arena_block {
	struct arena_block *next;
	size_t used;
	size_t size;
	_Alignas(16) unsigned char data[];
};

struct arena {
	pthread_mutex_t lock; /* replies from several agents are decoded into one arena at once */
	struct arena_block *blocks;
	struct arena_block *cur; /* the block being filled; those after it are empty or full */
	ProtobufCAllocator allocator;
};

static void *arena_pb_alloc(void *ctx, size_t size)
{
	return arena_alloc(ctx, size);
}

static void arena_pb_free(void *ctx, void *ptr)
{
	(void)ctx;
	(void)ptr;
}

struct arena *arena_new(void)
{
	struct arena *a = calloc(1, sizeof(*a));
	if (a == NULL)
		return NULL;
	a->allocator.alloc = arena_pb_alloc;
	a->allocator.free = arena_pb_free;
	a->allocator.allocator_data = a;
	pthread_mutex_init(&a->lock, NULL);
	return a;
}

void arena_free(struct arena *a)
{
	if (a == NULL)
		return;
	struct arena_block *b = a->blocks;
	while (b != NULL) {
		struct arena_block *next = b->next;
		free(b);
		b = next;
	}
	pthread_mutex_destroy(&a->lock);
	free(a);
}

static void *arena_alloc_locked(struct arena *a, size_t size)
{
	size_t rounded = (size + 15) & ~(size_t)15;
	if (rounded < size)
		return NULL;
	/* Blocks after the current one are empty after arena_reset, or full. */
	struct arena_block *b = a->cur;
	while (b != NULL && b->size - b->used < rounded && b->next != NULL &&
	       rounded <= ARENA_BLOCK / 2)
		b = a->cur = b->next;
	/* A large one may have an empty block of its size, since arena_reset. */
	for (struct arena_block *x = b != NULL ? b->next : NULL;
	     x != NULL && rounded > ARENA_BLOCK / 2; x = x->next)
		if (x->used == 0 && x->size >= rounded) {
			x->used = rounded;
			return x->data;
		}
	if (b == NULL || b->size - b->used < rounded) {
		size_t want = rounded > ARENA_BLOCK / 2 ? rounded : ARENA_BLOCK;
		if (want > SIZE_MAX - sizeof(*b))
			return NULL;
		struct arena_block *nb = malloc(sizeof(*nb) + want);
		if (nb == NULL)
			return NULL;
		nb->used = 0;
		nb->size = want;
		if (b == NULL) {
			nb->next = NULL;
			a->blocks = a->cur = nb;
		} else {
			/* After the current block; a large one leaves it current, so its space
			 * keeps serving. */
			nb->next = b->next;
			b->next = nb;
			if (rounded <= ARENA_BLOCK / 2)
				a->cur = nb;
		}
		b = nb;
	}
	void *p = b->data + b->used;
	b->used += rounded;
	return p;
}

void arena_reset(struct arena *a)
{
	pthread_mutex_lock(&a->lock);
	for (struct arena_block *b = a->blocks; b != NULL; b = b->next)
		b->used = 0;
	a->cur = a->blocks;
	pthread_mutex_unlock(&a->lock);
}

void *arena_alloc(struct arena *a, size_t size)
{
	pthread_mutex_lock(&a->lock);
	void *p = arena_alloc_locked(a, size);
	pthread_mutex_unlock(&a->lock);
	if (p != NULL)
		memset(p, 0, size);
	return p;
}

void *arena_calloc(struct arena *a, size_t count, size_t size)
{
	size_t total;
	if (__builtin_mul_overflow(count, size, &total))
		return NULL;
	return arena_alloc(a, total == 0 ? 1 : total);
}

char *arena_strdup(struct arena *a, const char *s)
{
	size_t n = strlen(s) + 1;
	char *p = arena_alloc(a, n);
	if (p != NULL)
		memcpy(p, s, n);
	return p;
}

ProtobufCAllocator *arena_protobuf_allocator(struct arena *a)
{
	return &a->allocator;
}
