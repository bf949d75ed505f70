#include "heap.h"

#include <stdlib.h>

#include "layout.h"

static int by_size(const void *pa, const void *pb)
{
	const struct heap_block *a = pa, *b = pb;
	if (a->size != b->size)
		return a->size > b->size ? -1 : 1;
	if (a->first != b->first)
		return a->first - b->first;
	return a->id - b->id;
}

static int by_offset(const void *pa, const void *pb, void *arg)
{
	const struct heap_block *blocks = arg;
	int64_t a = blocks[*(const int *)pa].offset, b = blocks[*(const int *)pb].offset;
	return a < b ? -1 : a > b;
}

/*
 * Placed blocks are registered in every time bucket their lifetime spans, so a block meets
 * only the blocks that may be live with it: placing n short-lived blocks costs about n log n.
 */
int64_t heap_place(struct heap_block *blocks, int n, struct arena *a)
{
	if (n == 0)
		return 0;
	qsort(blocks, (size_t)n, sizeof(*blocks), by_size);
	int horizon = 0;
	for (int i = 0; i < n; i++)
		if (blocks[i].last + 1 > horizon)
			horizon = blocks[i].last + 1;
	int width = horizon / 1024 + 1, n_buckets = horizon / width + 1;
	int *count = arena_calloc(a, (size_t)n_buckets + 1, sizeof(int));
	int *cap = arena_calloc(a, (size_t)n_buckets + 1, sizeof(int));
	int **members = arena_calloc(a, (size_t)n_buckets + 1, sizeof(int *));
	int *stamp = arena_calloc(a, (size_t)n + 1, sizeof(int));
	int *cand = arena_calloc(a, (size_t)n + 1, sizeof(int));
	if (!count || !cap || !members || !stamp || !cand)
		return -1;
	int64_t high = 0;
	for (int i = 0; i < n; i++) {
		struct heap_block *b = &blocks[i];
		int lo = b->first / width, hi = b->last / width, k = 0;
		for (int q = lo; q <= hi; q++)
			for (int m = 0; m < count[q]; m++) {
				int j = members[q][m];
				const struct heap_block *o = &blocks[j];
				if (stamp[j] == i + 1 || o->last < b->first || b->last < o->first)
					continue;
				stamp[j] = i + 1;
				cand[k++] = j;
			}
		qsort_r(cand, (size_t)k, sizeof(int), by_offset, blocks);
		int64_t offset = 0;
		for (int m = 0; m < k; m++) {
			const struct heap_block *o = &blocks[cand[m]];
			if (o->offset >= layout_add(offset, b->size))
				break;
			if (layout_add(o->offset, o->size) > offset)
				offset = layout_add(o->offset, o->size);
		}
		b->offset = offset;
		if (layout_add(offset, b->size) > high)
			high = layout_add(offset, b->size);
		for (int q = lo; q <= hi; q++) {
			if (count[q] == cap[q]) {
				int grown = cap[q] ? cap[q] * 2 : 8;
				int *more = arena_calloc(a, (size_t)grown, sizeof(int));
				if (more == NULL)
					return -1;
				for (int m = 0; m < count[q]; m++)
					more[m] = members[q][m];
				members[q] = more;
				cap[q] = grown;
			}
			members[q][count[q]++] = i;
		}
	}
	return high;
}
