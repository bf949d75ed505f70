/*
 * Heap simulation: where each temporary lives inside one reservation. Blocks are placed
 * largest first at the lowest offset where no block that is live at the same time sits (the
 * greedy by decreasing size of XLA's heap simulator), so blocks whose lifetimes do not overlap
 * share bytes. The one placement of the compiler: the pod's reservation is this size.
 */
#ifndef PODEMU_HEAP_H
#define PODEMU_HEAP_H

#include <stdint.h>

#include "arena.h"

struct heap_block {
	int64_t size;
	int first, last; /* live over positions [first, last] */
	int id;          /* the caller's, kept */
	int64_t offset;  /* out */
};

/*
 * Places blocks[0..n) (reordered: largest first) and returns the reservation's size, or -1
 * when out of memory. Sizes saturate: offsets never wrap.
 */
int64_t heap_place(struct heap_block *blocks, int n, struct arena *a);

#endif
