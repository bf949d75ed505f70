/*
 * The HBM heap's bookkeeping: device buffers in a treap by offset, free gaps (above the
 * reservation) in treaps by start and by size, so that best fit, free with merging and the
 * statistics each take O(log n) whatever the number of buffers; bytes in use is a running total.
 */
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

/* ---- Treaps over the node pool: every operation takes O(log n) expected ---- */

enum tree { T_GAP_START, T_GAP_SIZE };

static struct hbm_node *node(const struct hbm *h, int i)
{
	return &h->nodes[i - 1];
}

static int slot_of(enum tree t)
{
	return t == T_GAP_SIZE ? 1 : 0;
}

/* Children for walks that only read. */
static int left(const struct hbm *h, enum tree t, int i)
{
	return node(h, i)->left[slot_of(t)];
}

static int right(const struct hbm *h, enum tree t, int i)
{
	return node(h, i)->right[slot_of(t)];
}

/* Children's links, for the operations that relink them. */
static int *left_of(struct hbm *h, enum tree t, int i)
{
	return &node(h, i)->left[slot_of(t)];
}

static int *right_of(struct hbm *h, enum tree t, int i)
{
	return &node(h, i)->right[slot_of(t)];
}

/* Key order: gaps by start on a; gaps by size on size, then end from the top down. */
static bool before(const struct hbm *h, enum tree t, int i, int j)
{
	const struct hbm_node *x = node(h, i), *y = node(h, j);
	if (t != T_GAP_SIZE)
		return x->a < y->a;
	int64_t sx = x->b - x->a, sy = y->b - y->a;
	return sx != sy ? sx < sy : x->b > y->b; /* equal sizes: the highest first */
}

/* Splits t into the keys before pivot's (*l) and the others (*r). */
static void split(struct hbm *h, enum tree t, int root, int pivot, int *l, int *r)
{
	if (root == 0) {
		*l = *r = 0;
		return;
	}
	if (before(h, t, root, pivot)) {
		split(h, t, *right_of(h, t, root), pivot, right_of(h, t, root), r);
		*l = root;
	} else {
		split(h, t, *left_of(h, t, root), pivot, l, left_of(h, t, root));
		*r = root;
	}
}

/* Joins l and r, every key of l before every key of r. */
static int merge(struct hbm *h, enum tree t, int l, int r)
{
	if (l == 0 || r == 0)
		return l ? l : r;
	if (node(h, l)->prio > node(h, r)->prio) {
		*right_of(h, t, l) = merge(h, t, *right_of(h, t, l), r);
		return l;
	}
	*left_of(h, t, r) = merge(h, t, l, *left_of(h, t, r));
	return r;
}

/* Goes down while the nodes outrank i, then splits what is below around it. */
static void tree_insert(struct hbm *h, enum tree t, int *root, int i)
{
	int *at = root;
	while (*at != 0 && node(h, *at)->prio > node(h, i)->prio)
		at = before(h, t, i, *at) ? left_of(h, t, *at) : right_of(h, t, *at);
	split(h, t, *at, i, left_of(h, t, i), right_of(h, t, i));
	*at = i;
}

static void tree_erase(struct hbm *h, enum tree t, int *root, int i)
{
	int *at = root;
	while (*at != 0 && *at != i)
		at = before(h, t, i, *at) ? left_of(h, t, *at) : right_of(h, t, *at);
	if (*at == i)
		*at = merge(h, t, *left_of(h, t, i), *right_of(h, t, i));
}

/* The node of tree t (by a) whose a equals key, or 0. */
static int find_at(const struct hbm *h, enum tree t, int root, int64_t key)
{
	while (root != 0 && node(h, root)->a != key)
		root = key < node(h, root)->a ? left(h, t, root) : right(h, t, root);
	return root;
}

/* The last node of a tree, or 0. */
static int last_of(const struct hbm *h, enum tree t, int root)
{
	while (root != 0 && right(h, t, root) != 0)
		root = right(h, t, root);
	return root;
}

/*
 * Best fit: the smallest gap of at least need bytes, the highest of equal ones (the first in
 * the size tree's order from need on); 0 if none.
 */
static int best_gap(const struct hbm *h, int64_t need)
{
	int best = 0;
	for (int at = h->gaps_by_size; at != 0;) {
		if (node(h, at)->b - node(h, at)->a >= need) {
			best = at;
			at = left(h, T_GAP_SIZE, at);
		} else {
			at = right(h, T_GAP_SIZE, at);
		}
	}
	return best;
}

/* ---- Nodes ---- */

static int node_new(struct hbm *h, int64_t a, int64_t b)
{
	int i = h->free_node;
	if (i != 0) {
		h->free_node = node(h, i)->left[0];
	} else {
		if (h->num_nodes == h->cap_nodes) {
			int cap = h->cap_nodes ? h->cap_nodes * 2 : 64;
			struct hbm_node *n = realloc(h->nodes, (size_t)cap * sizeof(*n));
			if (n == NULL)
				return 0;
			h->nodes = n;
			h->cap_nodes = cap;
		}
		i = ++h->num_nodes;
	}
	h->seed = h->seed * 1664525u + 1013904223u;
	*node(h, i) = (struct hbm_node){.a = a, .b = b, .prio = h->seed};
	return i;
}

static void node_free(struct hbm *h, int i)
{
	node(h, i)->left[0] = h->free_node;
	h->free_node = i;
}

static void gap_add(struct hbm *h, int i)
{
	tree_insert(h, T_GAP_START, &h->gaps_by_start, i);
	tree_insert(h, T_GAP_SIZE, &h->gaps_by_size, i);
}

static void gap_remove(struct hbm *h, int i)
{
	tree_erase(h, T_GAP_START, &h->gaps_by_start, i);
	tree_erase(h, T_GAP_SIZE, &h->gaps_by_size, i);
}

/*
 * Makes [from, to) free, merged with the gaps that touch it. Needs at most one new node; -1
 * when there is none to have. A gap's place among the others by start never changes when it
 * grows into a neighbouring range, so only the size tree moves it.
 */
static int free_range(struct hbm *h, int64_t from, int64_t to)
{
	/* No gap starts inside [from, to): the last gap before `to` is the one below, if any. */
	int below = 0, above = 0;
	for (int at = h->gaps_by_start; at != 0 && above == 0;) {
		if (node(h, at)->a == to) {
			above = at;
			at = left(h, T_GAP_START, at);
			/* the one below is the greatest start in the left subtree, or found already
			 */
			for (; at != 0; at = right(h, T_GAP_START, at))
				below = at;
		} else if (node(h, at)->a < to) {
			below = at;
			at = right(h, T_GAP_START, at);
		} else {
			at = left(h, T_GAP_START, at);
		}
	}
	if (below != 0 && node(h, below)->b != from)
		below = 0;
	if (below == 0 && above == 0) {
		int g = node_new(h, from, to);
		if (g == 0)
			return -1;
		gap_add(h, g);
		return 0;
	}
	if (below != 0 && above != 0) { /* the three become below */
		gap_remove(h, above);
		tree_erase(h, T_GAP_SIZE, &h->gaps_by_size, below);
		node(h, below)->b = node(h, above)->b;
		node_free(h, above);
		tree_insert(h, T_GAP_SIZE, &h->gaps_by_size, below);
		return 0;
	}
	int g = below != 0 ? below : above;
	tree_erase(h, T_GAP_SIZE, &h->gaps_by_size, g);
	if (below != 0)
		node(h, g)->b = to;
	else
		node(h, g)->a = from;
	tree_insert(h, T_GAP_SIZE, &h->gaps_by_size, g);
	return 0;
}

/* ---- Buffers: a dense array, indexed by offset ---- */

static int buffer_find(const struct hbm *h, int64_t offset)
{
	return hindex_find(&h->index, h->buffers, sizeof(h->buffers[0]), (uint64_t)offset);
}

/* Room for one more buffer (array and index); -1 when out of memory. */
static int buffer_room(struct hbm *h)
{
	if (h->num_blocks == h->cap_blocks) {
		int cap = h->cap_blocks ? h->cap_blocks * 2 : 64;
		struct hbm_buffer *b = realloc(h->buffers, (size_t)cap * sizeof(*b));
		if (b == NULL)
			return -1;
		h->buffers = b;
		h->cap_blocks = cap;
	}
	return 0;
}

/* ---- The heap ---- */

int hbm_init(struct hbm *h, int64_t capacity, bool backed, struct status *st)
{
	memset(h, 0, sizeof(*h));
	h->capacity = capacity / HBM_ALIGNMENT * HBM_ALIGNMENT;
	h->stats.bytes_limit = h->capacity;
	h->seed = 0x9e3779b9u;
	if (h->capacity > 0 && free_range(h, 0, h->capacity) != 0)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	if (backed) {
		void *p = mmap(NULL, (size_t)h->capacity, PROT_READ | PROT_WRITE,
		               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (p == MAP_FAILED) {
			free(h->nodes);
			return status_set(st, ST_RESOURCE_EXHAUSTED,
			                  "cannot map %lld bytes of host memory for a heap",
			                  (long long)h->capacity);
		}
		h->base = p;
	}
	return ST_OK;
}

void hbm_destroy(struct hbm *h)
{
	if (h->base != NULL)
		munmap(h->base, (size_t)h->capacity);
	free(h->nodes);
	free(h->buffers);
	hindex_free(&h->index);
	memset(h, 0, sizeof(*h));
}

/* Gives back the whole pages of the gaps under root (the tree by start). */
static void return_pages(const struct hbm *h, int root, int64_t page)
{
	while (root != 0) {
		return_pages(h, left(h, T_GAP_START, root), page);
		const struct hbm_node *g = node(h, root);
		int64_t from = (g->a + page - 1) / page * page, to = g->b / page * page;
		if (to > from)
			madvise(h->base + from, (size_t)(to - from), MADV_DONTNEED);
		root = right(h, T_GAP_START, root);
	}
}

void hbm_return_free_pages(struct hbm *h)
{
	if (h->base == NULL)
		return;
	h->retained = 0;
	return_pages(h, h->gaps_by_start, sysconf(_SC_PAGESIZE));
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
	if (h->used > h->stats.peak_bytes_in_use)
		h->stats.peak_bytes_in_use = h->used;
}

int hbm_alloc(struct hbm *h, int64_t size, int64_t *offset, struct status *st)
{
	int64_t need = hbm_aligned_size(size);
	char want[16], free_text[16];
	/* Best fit: the smallest gap above the reservation that holds need; ties go up. */
	int g = need < 0 || need > h->capacity ? 0 : best_gap(h, need);
	if (g == 0)
		return status_set(st, ST_RESOURCE_EXHAUSTED,
		                  "Error allocating device buffer: Attempting to allocate %s. That "
		                  "was not possible. There are %s free.",
		                  status_human_bytes(want, size),
		                  status_human_bytes(free_text, h->capacity - h->used));
	if (buffer_room(h) != 0)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	/* The buffer's place at the top of the gap, indexed before anything changes. */
	int k = h->num_blocks;
	int64_t at = node(h, g)->b - need;
	h->buffers[k] = (struct hbm_buffer){at, need};
	if (hindex_add(&h->index, h->buffers, sizeof(h->buffers[0]), k + 1, k) != 0)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	/* What stays below it is still free (in the same place by start). */
	if (at > node(h, g)->a) {
		tree_erase(h, T_GAP_SIZE, &h->gaps_by_size, g);
		node(h, g)->b = at;
		tree_insert(h, T_GAP_SIZE, &h->gaps_by_size, g);
	} else {
		gap_remove(h, g);
		node_free(h, g);
	}
	h->num_blocks++;
	h->used += need;
	h->stats.num_allocs++;
	/* A new buffer mostly lands on pages a freed one left committed. */
	h->retained = h->retained > need ? h->retained - need : 0;
	if (need > h->stats.largest_alloc_size)
		h->stats.largest_alloc_size = need;
	hbm_note_usage(h);
	*offset = at;
	return ST_OK;
}

int hbm_free(struct hbm *h, int64_t offset)
{
	int i = buffer_find(h, offset);
	if (i < 0)
		return ST_NOT_FOUND;
	int64_t size = h->buffers[i].size;
	int last = h->num_blocks - 1;
	hindex_remove(&h->index, h->buffers, sizeof(h->buffers[0]), i, last);
	h->buffers[i] = h->buffers[last];
	h->num_blocks--;
	free_range(h, offset, offset + size);
	h->used -= size;
	hbm_discard(h, size);
	return ST_OK;
}

/*
 * The lowest buffer's offset, or the capacity: how much the reservation may take. Where no gap
 * starts just above the reservation, a buffer does (or the reservation fills the heap).
 */
static int64_t reservable(const struct hbm *h)
{
	int g = find_at(h, T_GAP_START, h->gaps_by_start, h->reserved);
	if (g != 0)
		return node(h, g)->b;
	return h->num_blocks > 0 ? h->reserved : h->capacity;
}

int hbm_reserve_bottom(struct hbm *h, int64_t size, struct status *st)
{
	if (h->reserved != 0)
		return status_set(st, ST_FAILED_PRECONDITION,
		                  "a program reservation is already held");
	if (size == 0)
		return ST_OK;
	int64_t need = hbm_aligned_size(size);
	int64_t limit = reservable(h);
	if (need < 0 || need > limit) {
		char want[16], free_text[16], reserved[16], reservable_text[16];
		return status_set(st, ST_RESOURCE_EXHAUSTED,
		                  "Attempting to reserve %s at the bottom of memory. That was not "
		                  "possible. There are %s free, %s reserved, and %s reservable.",
		                  status_human_bytes(want, size),
		                  status_human_bytes(free_text, h->capacity - h->used),
		                  status_human_bytes(reserved, h->reserved),
		                  status_human_bytes(reservable_text, limit));
	}
	/* The bottom gap, [0, limit), gives up its first need bytes. */
	int g = find_at(h, T_GAP_START, h->gaps_by_start, 0);
	if (g != 0) {
		gap_remove(h, g);
		if (node(h, g)->b > need) {
			node(h, g)->a = need;
			gap_add(h, g);
		} else {
			node_free(h, g);
		}
	}
	h->reserved = need;
	h->used += need;
	if (need > h->stats.peak_bytes_reserved)
		h->stats.peak_bytes_reserved = need;
	hbm_note_usage(h);
	return ST_OK;
}

void hbm_release_reservation(struct hbm *h)
{
	int64_t was = h->reserved;
	if (was == 0)
		return;
	h->reserved = 0;
	h->used -= was;
	free_range(h, 0, was);
	hbm_discard(h, was);
}

void hbm_get_stats(const struct hbm *h, struct hbm_stats *out)
{
	*out = h->stats;
	out->bytes_in_use = h->used;
	out->bytes_reserved = h->reserved;
	out->bytes_reservable_limit = reservable(h);
	int largest = last_of(h, T_GAP_SIZE, h->gaps_by_size);
	out->largest_free_block_bytes =
	    largest != 0 ? node(h, largest)->b - node(h, largest)->a : 0;
}
