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

/*
 * Once a heap has HBM_BINS_FROM gaps, those of up to HBM_BINS granules are kept by exact size,
 * one treap per size found through a bitmap; larger ones in one treap by size.
 */
#define HBM_BINS 4096
#define HBM_BINS_FROM 256
#define HBM_BIN_WORDS (HBM_BINS / 64)

/* A segment of the heap above the reservation: a device buffer or a free gap (hbm.c). */
struct hbm_node {
	int64_t a, b;
	int prev, next; /* neighbours by address (node indices + 1; 0: none) */
	/*
	 * A gap's children in its treap; left is -1 for a buffer. (32 bytes a node, two to a cache
	 * line: a treap's priority is a hash of the node's index, not a field.)
	 */
	int left, right;
};
_Static_assert(sizeof(struct hbm_node) == 32, "two heap nodes to a cache line");

/*
 * Freed pages a heap keeps committed for the next step, at least. A page's first touch after it
 * went back to the system is a page fault, and on a virtual machine that can cost several
 * microseconds a page: more than moving its bytes. So freed bytes keep their pages up to the
 * heap's budget (hbm_set_retain), the newest given back first; the lowest bytes of the bottom
 * gap (the next reservation's) and the highest of every gap (the next buffers') are kept. The
 * agent returns them all once its cores are idle (device_return_idle_memory).
 */
#define HBM_RETAIN_BYTES ((int64_t)1 << 20)
/*
 * What an agent process keeps so across all its heaps: its RSS stays within its bytes in use
 * plus 64 MiB, which also hold the program, the data plane and the libraries.
 */
#define HBM_RETAIN_PROCESS_BYTES ((int64_t)24 << 20)

struct hbm {
	int64_t capacity;
	int64_t retained;     /* the gaps' spans: at least the freed bytes whose pages are kept */
	int64_t retain_limit; /* what retained may reach (HBM_RETAIN_BYTES unless set) */

	unsigned char *base; /* NULL under --backing none */
	/*
	 * So that alloc and free take O(1) or O(log n) with any number of buffers: buffers and gaps
	 * are segments in address order (neighbours found at once), gaps are kept by size for best
	 * fit, and a buffer is named by its node (struct hbm_buffer).
	 */
	struct hbm_node *nodes;
	/*
	 * With backing, beside each node: a gap's two spans, low and high, that bound the pages it
	 * may still have committed.
	 */
	struct hbm_keep {
		struct hbm_span {
			int64_t a, b;
		} lo, hi;
	} * keep;
	int num_nodes, cap_nodes;
	int free_node; /* a free list through next */
	int spare;     /* a node set aside for the reservation's release */
	int first;     /* the lowest segment */
	int big;       /* root of the treap of gaps past HBM_BINS granules, by (size, end) */
	int *bins;     /* [HBM_BINS]: roots of the treaps of gaps of one size, by end, or NULL */
	int num_gaps;
	uint64_t bin_bits[HBM_BIN_WORDS]; /* bins that hold a gap */
	uint64_t bin_words;               /* words of bin_bits that are not zero */
	int num_blocks;
	int64_t used; /* buffers plus the reservation */
	int64_t reserved;
	struct hbm_stats stats;
};

/*
 * Sets up a heap of capacity bytes. With backed, the heap is one lazily committed mapping whose
 * freed pages go back to the system past the retention budget. Returns RESOURCE_EXHAUSTED when
 * the mapping cannot be made.
 */
int hbm_init(struct hbm *h, int64_t capacity, bool backed, struct status *st);
void hbm_destroy(struct hbm *h);
/* The bytes of freed pages the heap may keep (at least HBM_RETAIN_BYTES); see above. */
void hbm_set_retain(struct hbm *h, int64_t bytes);
/* Gives the pages of every free gap back to the system now (they read as zero after). */
void hbm_return_free_pages(struct hbm *h);

/*
 * A device buffer's place on its heap: the offset, and the heap's own name for the buffer,
 * with which hbm_free finds it at once (no index to search).
 */
struct hbm_buffer {
	int64_t offset; /* -1: none */
	int32_t id;     /* 0: not a buffer of the heap's (a temporary, or none) */
};
#define HBM_NO_BUFFER ((struct hbm_buffer){.offset = -1})

/*
 * Places a device buffer of size bytes best-fit from the top. On success *out is its place;
 * on failure RESOURCE_EXHAUSTED carries XLA's "Attempting to allocate ..." text and nothing
 * changes.
 */
int hbm_alloc(struct hbm *h, int64_t size, struct hbm_buffer *out, struct status *st);
/*
 * Frees the buffer; returns NOT_FOUND (and changes nothing) when buf is not a live buffer of
 * h at that offset.
 */
int hbm_free(struct hbm *h, struct hbm_buffer buf);

/*
 * Reserves [0, size) for a program's temporaries. Fails with XLA's "Attempting to reserve X at
 * the bottom of memory ..." when size exceeds the reservable bytes, and with
 * FAILED_PRECONDITION when a reservation is already held.
 */
int hbm_reserve_bottom(struct hbm *h, int64_t size, struct status *st);
void hbm_release_reservation(struct hbm *h);

/*
 * Commits the pages of [offset, offset + len) of a backed heap now, a few MiB per system call,
 * so that what a step first writes there costs no page fault each: on a TPU the memory simply
 * is there. Best
 * effort (a kernel without MADV_POPULATE_WRITE faults them in as they are touched); ranges
 * under HBM_COMMIT_MIN_BYTES are left to that.
 */
#define HBM_COMMIT_MIN_BYTES ((int64_t)1 << 20)
void hbm_commit(const struct hbm *h, int64_t offset, int64_t len);

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
