/*
 * One simulated core's HBM heap, after the behaviour TPU error messages show: device buffers are
 * placed best-fit from the top, a program's temporaries are reserved as one region at the bottom,
 * and every byte is accounted with PJRT's statistic names. Not thread-safe: the caller locks.
 */
#ifndef PODEMU_HBM_H
#define PODEMU_HBM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hindex.h"
#include "status.h"
#include "topology.h"

struct hbm_stats {
	int64_t bytes_in_use; /* device buffers plus the reservation */
	int64_t peak_bytes_in_use;
	int64_t bytes_limit;
	int64_t num_allocs; /* allocations made since start */
	int64_t largest_alloc_size;
	int64_t bytes_reserved;
	int64_t peak_bytes_reserved;
	int64_t bytes_reservable_limit; /* free bytes from the bottom to the lowest buffer */
	int64_t largest_free_block_bytes;
};

/* A free gap [a, b) of the heap, in its trees by start and by size (hbm.c). */
struct hbm_node {
	int64_t a, b;
	int left[2], right[2]; /* node indices + 1 in the node's trees (0: none) */
	uint32_t prio;
};

/* A device buffer of the heap (offset first: the hash index reads it there). */
struct hbm_buffer {
	int64_t offset, size;
};

/*
 * Freed bytes whose pages stay committed, so a buffer of the same size allocated next (the
 * common case step after step) does not page-fault anew; past this, free pages go back to the
 * system. The agent returns them all once its cores are idle (device_return_idle_memory).
 */
#define HBM_RETAIN_BYTES ((int64_t)128 << 20)

struct hbm {
	int64_t capacity;
	int64_t retained; /* estimate of freed bytes whose pages are still committed */

	unsigned char *base; /* NULL under --backing none */
	/*
	 * So that alloc and free take O(log n) with any number of buffers: the free gaps above
	 * the reservation in treaps by start and by (size, end) for best fit, over one node pool;
	 * the buffers in a dense array indexed by offset (common/hindex.c).
	 */
	struct hbm_node *nodes;
	int num_nodes, cap_nodes;
	int free_node;                   /* a free list through left[0] */
	int gaps_by_start, gaps_by_size; /* roots */
	struct hbm_buffer *buffers;
	int num_blocks, cap_blocks;
	struct hindex index; /* offset -> buffers[] position */
	int64_t used;        /* buffers plus the reservation */
	uint32_t seed;
	int64_t reserved;
	struct hbm_stats stats;
};

/*
 * Sets up a heap of capacity bytes. With backed, the heap is one lazily committed mapping that
 * returns its pages to the system when more than HBM_RETAIN_BYTES have been freed. Returns
 * RESOURCE_EXHAUSTED when the mapping cannot be made.
 */
int hbm_init(struct hbm *h, int64_t capacity, bool backed, struct status *st);
void hbm_destroy(struct hbm *h);
/* Gives the pages of every free gap back to the system now (they read as zero after). */
void hbm_return_free_pages(struct hbm *h);

/*
 * Places a device buffer of size bytes best-fit from the top. On success *offset is its
 * position; on failure RESOURCE_EXHAUSTED carries XLA's "Attempting to allocate ..." text and
 * nothing changes.
 */
int hbm_alloc(struct hbm *h, int64_t size, int64_t *offset, struct status *st);
/* Frees the buffer at offset; returns NOT_FOUND when there is none. */
int hbm_free(struct hbm *h, int64_t offset);

/*
 * Reserves [0, size) for a program's temporaries. Fails with XLA's "Attempting to reserve X at
 * the bottom of memory ..." when size exceeds the reservable bytes, and with
 * FAILED_PRECONDITION when a reservation is already held.
 */
int hbm_reserve_bottom(struct hbm *h, int64_t size, struct status *st);
void hbm_release_reservation(struct hbm *h);

/* Host address of a heap offset, or NULL without backing. */
static inline void *hbm_ptr(const struct hbm *h, int64_t offset)
{
	return h->base ? h->base + offset : NULL;
}

/* Current statistics (derived fields are computed on the call). */
void hbm_get_stats(const struct hbm *h, struct hbm_stats *out);

/* Rounds size up to HBM_ALIGNMENT (at least one granule); -1 on overflow. */
int64_t hbm_aligned_size(int64_t size);

#endif
