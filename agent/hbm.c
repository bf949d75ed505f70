#include "hbm.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int64_t hbm_aligned_size(int64_t size)
{
	if (size < 0 || size > INT64_MAX - HBM_ALIGNMENT)
		return -1;
	if (size == 0)
		return HBM_ALIGNMENT;
	return (size + HBM_ALIGNMENT - 1) / HBM_ALIGNMENT * HBM_ALIGNMENT;
}

int hbm_init(struct hbm *h, int64_t capacity, bool backed, struct status *st)
{
	memset(h, 0, sizeof(*h));
	h->capacity = capacity / HBM_ALIGNMENT * HBM_ALIGNMENT;
	h->stats.bytes_limit = h->capacity;
	if (backed) {
		void *p = mmap(NULL, (size_t)h->capacity, PROT_READ | PROT_WRITE,
		               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (p == MAP_FAILED)
			return status_set(st, ST_RESOURCE_EXHAUSTED,
			                  "cannot map %lld bytes of host memory for a heap",
			                  (long long)h->capacity);
		h->base = p;
	}
	return ST_OK;
}

void hbm_destroy(struct hbm *h)
{
	if (h->base != NULL)
		munmap(h->base, (size_t)h->capacity);
	free(h->blocks);
	memset(h, 0, sizeof(*h));
}

static int64_t hbm_used(const struct hbm *h)
{
	int64_t used = h->reserved;
	for (int i = 0; i < h->num_blocks; i++)
		used += h->blocks[i].size;
	return used;
}

void hbm_return_free_pages(struct hbm *h)
{
	if (h->base == NULL)
		return;
	h->retained = 0;
	int64_t page = sysconf(_SC_PAGESIZE);
	int64_t prev_end = h->reserved;
	for (int i = 0; i <= h->num_blocks; i++) {
		int64_t next = i < h->num_blocks ? h->blocks[i].offset : h->capacity;
		int64_t from = (prev_end + page - 1) / page * page, to = next / page * page;
		if (to > from)
			madvise(h->base + from, (size_t)(to - from), MADV_DONTNEED);
		if (i < h->num_blocks)
			prev_end = h->blocks[i].offset + h->blocks[i].size;
	}
}

/*
 * Notes that `bytes` were freed; once more than HBM_RETAIN_BYTES are, gives the pages of every
 * free gap back to the system.
 */
static void hbm_discard(struct hbm *h, int64_t bytes)
{
	if (h->base == NULL)
		return;
	h->retained += bytes;
	if (h->retained > HBM_RETAIN_BYTES)
		hbm_return_free_pages(h);
}

static void hbm_note_usage(struct hbm *h)
{
	int64_t used = hbm_used(h);
	if (used > h->stats.peak_bytes_in_use)
		h->stats.peak_bytes_in_use = used;
}

int hbm_alloc(struct hbm *h, int64_t size, int64_t *offset, struct status *st)
{
	int64_t need = hbm_aligned_size(size);
	struct hbm_stats now;
	char want[16], free_text[16];
	if (need < 0 || need > h->capacity)
		goto fail;
	/* Best fit: the smallest gap above the reservation that holds need; ties go up. */
	int64_t best_end = -1, best_size = INT64_MAX;
	int64_t prev_end = h->reserved;
	for (int i = 0; i <= h->num_blocks; i++) {
		int64_t next = i < h->num_blocks ? h->blocks[i].offset : h->capacity;
		int64_t lo = prev_end > h->reserved ? prev_end : h->reserved;
		int64_t gap = next - lo;
		if (gap >= need && gap <= best_size) {
			best_size = gap;
			best_end = next;
		}
		if (i < h->num_blocks)
			prev_end = h->blocks[i].offset + h->blocks[i].size;
	}
	if (best_end < 0)
		goto fail;
	if (h->num_blocks == h->cap_blocks) {
		int cap = h->cap_blocks ? h->cap_blocks * 2 : 16;
		struct hbm_block *b = realloc(h->blocks, (size_t)cap * sizeof(*b));
		if (b == NULL)
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		h->blocks = b;
		h->cap_blocks = cap;
	}
	int64_t at = best_end - need;
	int pos = 0;
	while (pos < h->num_blocks && h->blocks[pos].offset < at)
		pos++;
	memmove(&h->blocks[pos + 1], &h->blocks[pos],
	        (size_t)(h->num_blocks - pos) * sizeof(h->blocks[0]));
	h->blocks[pos] = (struct hbm_block){.offset = at, .size = need};
	h->num_blocks++;
	h->stats.num_allocs++;
	/* A new buffer mostly lands on pages a freed one left committed. */
	h->retained = h->retained > need ? h->retained - need : 0;

	if (need > h->stats.largest_alloc_size)
		h->stats.largest_alloc_size = need;
	hbm_note_usage(h);
	*offset = at;
	return ST_OK;
fail:
	hbm_get_stats(h, &now);
	return status_set(st, ST_RESOURCE_EXHAUSTED,
	                  "Error allocating device buffer: Attempting to allocate %s. That was "
	                  "not possible. There are %s free.",
	                  status_human_bytes(want, size),
	                  status_human_bytes(free_text, h->capacity - now.bytes_in_use));
}

int hbm_free(struct hbm *h, int64_t offset)
{
	for (int i = 0; i < h->num_blocks; i++) {
		if (h->blocks[i].offset != offset)
			continue;
		int64_t size = h->blocks[i].size;
		memmove(&h->blocks[i], &h->blocks[i + 1],
		        (size_t)(h->num_blocks - i - 1) * sizeof(h->blocks[0]));
		h->num_blocks--;
		hbm_discard(h, size);
		return ST_OK;
	}
	return ST_NOT_FOUND;
}

int hbm_reserve_bottom(struct hbm *h, int64_t size, struct status *st)
{
	if (h->reserved != 0)
		return status_set(st, ST_FAILED_PRECONDITION,
		                  "a program reservation is already held");
	if (size == 0)
		return ST_OK;
	int64_t need = hbm_aligned_size(size);
	int64_t reservable = h->num_blocks ? h->blocks[0].offset : h->capacity;
	if (need < 0 || need > reservable) {
		char want[16], free_text[16], reserved[16], reservable_text[16];
		return status_set(st, ST_RESOURCE_EXHAUSTED,
		                  "Attempting to reserve %s at the bottom of memory. That was not "
		                  "possible. There are %s free, %s reserved, and %s reservable.",
		                  status_human_bytes(want, size),
		                  status_human_bytes(free_text, h->capacity - hbm_used(h)),
		                  status_human_bytes(reserved, h->reserved),
		                  status_human_bytes(reservable_text, reservable));
	}
	h->reserved = need;
	if (need > h->stats.peak_bytes_reserved)
		h->stats.peak_bytes_reserved = need;
	hbm_note_usage(h);
	return ST_OK;
}

void hbm_release_reservation(struct hbm *h)
{
	int64_t was = h->reserved;
	h->reserved = 0;
	if (was > 0)
		hbm_discard(h, was);
}

void hbm_get_stats(const struct hbm *h, struct hbm_stats *out)
{
	*out = h->stats;
	out->bytes_in_use = hbm_used(h);
	out->bytes_reserved = h->reserved;
	out->bytes_reservable_limit = h->num_blocks ? h->blocks[0].offset : h->capacity;
	int64_t largest = 0, prev_end = h->reserved;
	for (int i = 0; i <= h->num_blocks; i++) {
		int64_t next = i < h->num_blocks ? h->blocks[i].offset : h->capacity;
		if (next - prev_end > largest)
			largest = next - prev_end;
		if (i < h->num_blocks)
			prev_end = h->blocks[i].offset + h->blocks[i].size;
	}
	out->largest_free_block_bytes = largest;
}
