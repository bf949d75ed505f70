/*
 * The HBM heap's bookkeeping: buffers and free gaps above the reservation as segments in address
 * order (a freed buffer finds the gaps it merges with at once), gaps by size in a treap and, once
 * there are many, the small ones in exact-size bins under a bitmap, so that best fit, free with
 * merging and the statistics take O(1) or O(log n) whatever the number of buffers; bytes in use
 * is a running total. A buffer is named by its node (struct hbm_buffer), so freeing it needs no
 * search.
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

/* ---- Segments: buffers and gaps in address order, over one node pool ---- */

static struct hbm_node *node(const struct hbm *h, int i)
{
	return &h->nodes[i - 1];
}

/*
 * Commits the whole pages of [from, to) now: one system call instead of a page fault a page,
 * which costs more, most of all on a virtual machine. Best effort.
 */
static void populate(void *from, void *to)
{
#ifdef MADV_POPULATE_WRITE
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t lo = ((uintptr_t)from + page - 1) / page * page, hi = (uintptr_t)to / page * page;
	if (hi > lo)
		madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE);
#else
	(void)from, (void)to;
#endif
}

/* Room for one more node, so that what follows cannot fail; -1 when out of memory. */
static int node_room(struct hbm *h)
{
	if (h->free_node != 0 || h->num_nodes < h->cap_nodes)
		return 0;
	int cap = h->cap_nodes ? h->cap_nodes * 2 : 64;
	if (h->keep != NULL) {
		struct hbm_keep *k = realloc(h->keep, (size_t)cap * sizeof(*k));
		if (k == NULL)
			return -1;
		h->keep = k;
	}
	struct hbm_node *n = realloc(h->nodes, (size_t)cap * sizeof(*n));
	if (n == NULL)
		return -1;
	h->nodes = n;
	populate(n + h->cap_nodes, n + cap); /* the new nodes are taken one after another */
	h->cap_nodes = cap;
	return 0;
}

/* A node off the pool; node_room must have succeeded. */
static int node_take(struct hbm *h)
{
	int i = h->free_node;
	if (i != 0)
		h->free_node = node(h, i)->next;
	else
		i = ++h->num_nodes;
	node(h, i)->a = -1; /* names no buffer until linked */
	return i;
}

static bool is_gap(const struct hbm_node *n)
{
	return n->left >= 0;
}

/* Node i becomes segment [a, b), linked after prev (0: first). */
static int node_link(struct hbm *h, int i, int64_t a, int64_t b, bool gap, int prev)
{
	int next = prev != 0 ? node(h, prev)->next : h->first;
	*node(h, i) =
	    (struct hbm_node){.a = a, .b = b, .prev = prev, .next = next, .left = gap ? 0 : -1};
	if (h->keep != NULL)
		h->keep[i - 1] = (struct hbm_keep){{0, 0}, {0, 0}};
	if (next != 0)
		node(h, next)->prev = i;
	if (prev != 0)
		node(h, prev)->next = i;
	else
		h->first = i;
	return i;
}

/* A new segment [a, b) linked after prev (0: first); node_room must have succeeded. */
static int node_new(struct hbm *h, int64_t a, int64_t b, bool gap, int prev)
{
	return node_link(h, node_take(h), a, b, gap, prev);
}

static void node_put(struct hbm *h, int i)
{
	node(h, i)->a = -1; /* names no buffer (hbm_free) */
	node(h, i)->next = h->free_node;
	h->free_node = i;
}

/* Takes segment i out of the address order; its node is free again. */
static void node_unlink(struct hbm *h, int i)
{
	struct hbm_node *n = node(h, i);
	if (n->prev != 0)
		node(h, n->prev)->next = n->next;
	else
		h->first = n->next;
	if (n->next != 0)
		node(h, n->next)->prev = n->prev;
	node_put(h, i);
}

/* ---- Treaps of gaps: every operation takes O(log n) expected ---- */

/* Node i's priority: its index hashed, as good as a random draw for the treap's balance. */
static uint32_t prio(int i)
{
	uint32_t x = (uint32_t)i;
	x ^= x >> 16;
	x *= 0x7feb352du;
	x ^= x >> 15;
	x *= 0x846ca68bu;
	return x ^ (x >> 16);
}

enum tree { T_BIG, T_BIN };

/* Key order: big gaps by size, then end from the top down; a bin's (one size) by end. */
static bool before(const struct hbm *h, enum tree t, int i, int j)
{
	const struct hbm_node *x = node(h, i), *y = node(h, j);
	if (t == T_BIN)
		return x->b < y->b;
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
		split(h, t, node(h, root)->right, pivot, &node(h, root)->right, r);
		*l = root;
	} else {
		split(h, t, node(h, root)->left, pivot, l, &node(h, root)->left);
		*r = root;
	}
}

/* Joins l and r, every key of l before every key of r. */
static int merge(struct hbm *h, int l, int r)
{
	if (l == 0 || r == 0)
		return l ? l : r;
	if (prio(l) > prio(r)) {
		node(h, l)->right = merge(h, node(h, l)->right, r);
		return l;
	}
	node(h, r)->left = merge(h, l, node(h, r)->left);
	return r;
}

/* Goes down while the nodes outrank i, then splits what is below around it. */
static void tree_insert(struct hbm *h, enum tree t, int *root, int i)
{
	int *at = root;
	while (*at != 0 && prio(*at) > prio(i))
		at = before(h, t, i, *at) ? &node(h, *at)->left : &node(h, *at)->right;
	split(h, t, *at, i, &node(h, i)->left, &node(h, i)->right);
	*at = i;
}

static void tree_erase(struct hbm *h, enum tree t, int *root, int i)
{
	int *at = root;
	while (*at != 0 && *at != i)
		at = before(h, t, i, *at) ? &node(h, *at)->left : &node(h, *at)->right;
	if (*at == i)
		*at = merge(h, node(h, i)->left, node(h, i)->right);
}

/* The first or last node of a tree, or 0. */
static int end_of(const struct hbm *h, int root, bool last)
{
	for (int next; root != 0; root = next)
		if ((next = last ? node(h, root)->right : node(h, root)->left) == 0)
			break;
	return root;
}

/* ---- Gaps by size: the big treap, and exact-size bins under a bitmap ---- */

/* The bin of a gap of size bytes, or -1 when it goes to the big treap (or there are no bins). */
static int bin_of(const struct hbm *h, int64_t size)
{
	if (h->bins == NULL || size > (int64_t)HBM_BINS * HBM_ALIGNMENT)
		return -1;
	return (int)(size / HBM_ALIGNMENT) - 1;
}

/* The first bin from i on that holds a gap, or -1. */
static int bin_from(const struct hbm *h, int i)
{
	int w = i / 64;
	uint64_t m = h->bin_bits[w] & (~0ull << (i % 64));
	if (m != 0)
		return w * 64 + __builtin_ctzll(m);
	uint64_t words = w + 1 < 64 ? h->bin_words & (~0ull << (w + 1)) : 0;
	if (words == 0)
		return -1;
	w = __builtin_ctzll(words);
	return w * 64 + __builtin_ctzll(h->bin_bits[w]);
}

/* The last bin that holds a gap, or -1. */
static int bin_last(const struct hbm *h)
{
	if (h->bin_words == 0)
		return -1;
	int w = 63 - __builtin_clzll(h->bin_words);
	return w * 64 + 63 - __builtin_clzll(h->bin_bits[w]);
}

/* Files gap g by its size. */
static void gap_add(struct hbm *h, int g)
{
	int k = bin_of(h, node(h, g)->b - node(h, g)->a);
	h->num_gaps++;
	if (k < 0) {
		tree_insert(h, T_BIG, &h->big, g);
		return;
	}
	tree_insert(h, T_BIN, &h->bins[k], g);
	h->bin_bits[k / 64] |= 1ull << (k % 64);
	h->bin_words |= 1ull << (k / 64);
}

static void gap_remove(struct hbm *h, int g)
{
	int k = bin_of(h, node(h, g)->b - node(h, g)->a);
	h->num_gaps--;
	if (k < 0) {
		tree_erase(h, T_BIG, &h->big, g);
		return;
	}
	tree_erase(h, T_BIN, &h->bins[k], g);
	if (h->bins[k] == 0) {
		h->bin_bits[k / 64] &= ~(1ull << (k % 64));
		if (h->bin_bits[k / 64] == 0)
			h->bin_words &= ~(1ull << (k / 64));
	}
}

/* Gap g becomes [a, b), filed again by its size. */
static void gap_resize(struct hbm *h, int g, int64_t a, int64_t b)
{
	gap_remove(h, g);
	node(h, g)->a = a;
	node(h, g)->b = b;
	gap_add(h, g);
}

/*
 * Past HBM_BINS_FROM gaps, the small ones move to their bins (a heap with few gaps, the common
 * case of a pod's cores, has no bins); without memory for the bins all stay in the big treap,
 * which only costs time.
 */
static void bins_start(struct hbm *h)
{
	if (h->bins != NULL || h->num_gaps < HBM_BINS_FROM ||
	    (h->bins = calloc(HBM_BINS, sizeof(int))) == NULL)
		return;
	for (int g; (g = end_of(h, h->big, false)) != 0;) {
		if (bin_of(h, node(h, g)->b - node(h, g)->a) < 0)
			break;
		tree_erase(h, T_BIG, &h->big, g);
		h->num_gaps--;
		gap_add(h, g);
	}
}

/*
 * Best fit: the smallest gap of at least need bytes, the highest of equal ones (a bin's last,
 * or the first in the big treap's order from need on); 0 if none.
 */
static int best_gap(const struct hbm *h, int64_t need)
{
	int k = bin_of(h, need) >= 0 ? bin_from(h, bin_of(h, need)) : -1;
	if (k >= 0)
		return end_of(h, h->bins[k], true);
	int best = 0;
	for (int at = h->big; at != 0;) {
		if (node(h, at)->b - node(h, at)->a >= need) {
			best = at;
			at = node(h, at)->left;
		} else {
			at = node(h, at)->right;
		}
	}
	return best;
}

static int64_t largest_gap(const struct hbm *h)
{
	int g = end_of(h, h->big, true);
	if (g == 0 && bin_last(h) >= 0)
		g = h->bins[bin_last(h)];
	return g != 0 ? node(h, g)->b - node(h, g)->a : 0;
}

/*
 * madvise in pieces: each call holds the process's memory map lock for its whole range, and a
 * long one (hundreds of MiB) would stall every other thread that maps memory or faults (the
 * agent's heartbeat among them).
 */
#define HBM_ADVISE_PIECE ((int64_t)8 << 20)

static void advise(const struct hbm *h, int64_t from, int64_t to, int advice)
{
	for (int64_t at = from; at < to; at += HBM_ADVISE_PIECE)
		madvise(h->base + at,
		        (size_t)(to - at < HBM_ADVISE_PIECE ? to - at : HBM_ADVISE_PIECE), advice);
}

/*
 * Gives back the pages that hold some of [a, b) and lie wholly inside the free gap
 * [gap_a, gap_b) (a page shared with a buffer stays).
 */
static void discard_pages(struct hbm *h, int64_t a, int64_t b, int64_t gap_a, int64_t gap_b)
{
	if (b <= a)
		return;
	int64_t page = sysconf(_SC_PAGESIZE);
	int64_t from = a / page * page, to = (b + page - 1) / page * page;
	int64_t gap_from = (gap_a + page - 1) / page * page, gap_to = gap_b / page * page;
	from = from > gap_from ? from : gap_from;
	to = to < gap_to ? to : gap_to;
	if (to > from)
		advise(h, from, to, MADV_DONTNEED);
}

/*
 * ---- Freed pages kept: each gap's two spans of the pages it may still have committed ----
 *
 * A gap's kept pages are bounded by two spans: one low in the gap, one high. Two, because a
 * gap is reused at both ends: the next reservation takes the bottom gap's lowest bytes, and
 * the next buffer any gap's highest. One span would have to cover the untouched bytes between
 * the reservation's pages and a freed output's, and counted as kept they would push the
 * output's pages past the budget.
 */

static bool span_empty(struct hbm_span s)
{
	return s.b <= s.a;
}

static int64_t span_len(struct hbm_span s)
{
	return span_empty(s) ? 0 : s.b - s.a;
}

/* s within segment n ({0, 0} when nothing of it is). */
static struct hbm_span span_clip(struct hbm_span s, const struct hbm_node *n)
{
	s.a = s.a > n->a ? s.a : n->a;
	s.b = s.b < n->b ? s.b : n->b;
	return span_empty(s) ? (struct hbm_span){0, 0} : s;
}

static const struct hbm_keep keep_none = {{0, 0}, {0, 0}};

/* Gap g's spans: none without backing. */
static struct hbm_keep keep_of(const struct hbm *h, int g)
{
	return h->keep != NULL ? h->keep[g - 1] : keep_none;
}

/* Gap g's spans become k, clipped to the gap (a lone span is the low one); retained follows. */
static void keep_set(struct hbm *h, int g, struct hbm_keep k)
{
	if (h->keep == NULL)
		return;
	const struct hbm_node *n = node(h, g);
	struct hbm_keep *was = &h->keep[g - 1];
	h->retained -= span_len(was->lo) + span_len(was->hi);
	k = (struct hbm_keep){span_clip(k.lo, n), span_clip(k.hi, n)};
	if (span_empty(k.lo))
		k = (struct hbm_keep){k.hi, {0, 0}};
	*was = k;
	h->retained += span_len(k.lo) + span_len(k.hi);
}

/* After gap g shrank: its spans keep what the gap still spans. */
static void keep_clip(struct hbm *h, int g)
{
	keep_set(h, g, keep_of(h, g));
}

/*
 * Spans s[0..n) (disjoint, some empty, in any order) as two: cut at the widest hole between
 * neighbours, and each side becomes the one span that covers it.
 */
static struct hbm_keep keep_union(struct hbm_span *s, int n)
{
	int m = 0;
	for (int i = 0; i < n; i++) /* the non-empty ones, in address order */
		if (!span_empty(s[i])) {
			struct hbm_span x = s[i];
			int j = m++;
			for (; j > 0 && s[j - 1].a > x.a; j--)
				s[j] = s[j - 1];
			s[j] = x;
		}
	if (m == 0)
		return keep_none;
	int cut = 0; /* the hole after s[cut - 1]; 0: none */
	for (int i = 1; i < m; i++)
		if (cut == 0 || s[i].a - s[i - 1].b > s[cut].a - s[cut - 1].b)
			cut = i;
	if (cut == 0)
		return (struct hbm_keep){s[0], {0, 0}};
	return (struct hbm_keep){{s[0].a, s[cut - 1].b}, {s[cut].a, s[m - 1].b}};
}

/* Freed bytes [lo, hi) join gap g's spans. */
static void keep_add(struct hbm *h, int g, int64_t lo, int64_t hi)
{
	struct hbm_keep k = keep_of(h, g);
	struct hbm_span s[3] = {k.lo, k.hi, {lo, hi}};
	keep_set(h, g, keep_union(s, 3));
}

/* Span s keeps `room` bytes at its low end (low) or its high end; the rest goes back. */
static struct hbm_span span_trim(struct hbm *h, struct hbm_span s, int64_t room, bool low,
                                 const struct hbm_node *gap)
{
	room = room < span_len(s) ? room : span_len(s);
	if (low) {
		discard_pages(h, s.a + room, s.b, gap->a, gap->b);
		return (struct hbm_span){s.a, s.a + room};
	}
	discard_pages(h, s.a, s.b - room, gap->a, gap->b);
	return (struct hbm_span){s.b - room, s.b};
}

/*
 * A free made or grew gap g. Past the budget, g's kept pages beyond what still fits go back
 * (the newest freed first): the bottom gap keeps first its lowest bytes, which the next
 * reservation takes, then its highest; another gap its highest, where the next buffer is
 * placed, and then the highest of its low span.
 */
static void retain_or_return(struct hbm *h, int g)
{
	if (h->keep == NULL || h->retained <= h->retain_limit)
		return;
	const struct hbm_node *n = node(h, g);
	struct hbm_keep k = keep_of(h, g);
	int64_t room = h->retain_limit - (h->retained - span_len(k.lo) - span_len(k.hi));
	room = room > 0 ? room : 0;
	if (g == h->first) {
		k.lo = span_trim(h, k.lo, room, true, n);
		k.hi = span_trim(h, k.hi, room - span_len(k.lo), false, n);
	} else {
		k.hi = span_trim(h, k.hi, room, false, n);
		k.lo = span_trim(h, k.lo, room - span_len(k.hi), false, n);
	}
	keep_set(h, g, k);
}

/* Makes segment i (a buffer) free, merged with the gaps that touch it; returns that gap. */
static int segment_free(struct hbm *h, int i)
{
	struct hbm_node *n = node(h, i);
	int below = n->prev != 0 && is_gap(node(h, n->prev)) ? n->prev : 0;
	int above = n->next != 0 && is_gap(node(h, n->next)) ? n->next : 0;
	if (below == 0 && above == 0) {
		gap_add(h, i);
		keep_set(h, i, (struct hbm_keep){{n->a, n->b}, {0, 0}});
		bins_start(h);
		return i;
	}
	int64_t b = above ? node(h, above)->b : n->b;
	/* The freed bytes join the spans of the gaps they merge with. */
	struct hbm_keep lo = below != 0 ? keep_of(h, below) : keep_none;
	struct hbm_keep hi = above != 0 ? keep_of(h, above) : keep_none;
	struct hbm_span spans[5] = {lo.lo, lo.hi, {n->a, n->b}, hi.lo, hi.hi};
	struct hbm_keep keep = keep_union(spans, 5);
	if (below != 0 && above != 0) { /* the three become below */
		keep_set(h, above, keep_none);
		gap_remove(h, above);
		node_unlink(h, above);
	}
	int gap = below != 0 ? below : above;
	gap_resize(h, gap, below != 0 ? node(h, below)->a : n->a, b);
	keep_set(h, gap, keep);
	node_unlink(h, i);
	return gap;
}

/* ---- The heap ---- */

int hbm_init(struct hbm *h, int64_t capacity, bool backed, struct status *st)
{
	memset(h, 0, sizeof(*h));
	h->capacity = capacity / HBM_ALIGNMENT * HBM_ALIGNMENT;
	h->stats.bytes_limit = h->capacity;
	h->retain_limit = HBM_RETAIN_BYTES;
	if (node_room(h) != 0)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	if (h->capacity > 0)
		gap_add(h, node_new(h, 0, h->capacity, true, 0));
	if (backed) {
		void *p = mmap(NULL, (size_t)h->capacity, PROT_READ | PROT_WRITE,
		               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (p == MAP_FAILED) {
			hbm_destroy(h);
			return status_set(st, ST_RESOURCE_EXHAUSTED,
			                  "cannot map %lld bytes of host memory for a heap",
			                  (long long)capacity);
		}
		h->base = p;
		h->keep = calloc((size_t)h->cap_nodes, sizeof(*h->keep));
		if (h->keep == NULL) {
			hbm_destroy(h);
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		}
	}
	return ST_OK;
}

void hbm_destroy(struct hbm *h)
{
	if (h->base != NULL)
		munmap(h->base, (size_t)h->capacity);
	free(h->nodes);
	free(h->keep);
	free(h->bins);
	memset(h, 0, sizeof(*h));
}

void hbm_set_retain(struct hbm *h, int64_t bytes)
{
	h->retain_limit = bytes > HBM_RETAIN_BYTES ? bytes : HBM_RETAIN_BYTES;
	if (h->retained > h->retain_limit)
		hbm_return_free_pages(h);
}

void hbm_return_free_pages(struct hbm *h)
{
	if (h->keep == NULL)
		return;
	for (int i = h->first; i != 0; i = node(h, i)->next) {
		const struct hbm_node *n = node(h, i);
		if (is_gap(n)) {
			struct hbm_keep k = keep_of(h, i);
			discard_pages(h, k.lo.a, k.lo.b, n->a, n->b);
			discard_pages(h, k.hi.a, k.hi.b, n->a, n->b);
			keep_set(h, i, keep_none);
		}
	}
}

void hbm_commit(const struct hbm *h, int64_t offset, int64_t len)
{
#ifdef MADV_POPULATE_WRITE
	if (h->base == NULL || len < HBM_COMMIT_MIN_BYTES || offset < 0 ||
	    offset > h->capacity - len)
		return;
	int64_t page = sysconf(_SC_PAGESIZE);
	int64_t from = offset / page * page, to = (offset + len + page - 1) / page * page;
#ifdef MADV_HUGEPAGE
	/*
	 * The range's whole huge pages may be huge pages: the step writes every byte of it, so
	 * none is committed for nothing, and on a virtual machine one fault of 2 MiB costs about
	 * what one of 4 KiB does. The rest of the heap keeps small pages, so that a small buffer
	 * commits only its own.
	 */
	uintptr_t huge = (uintptr_t)2 << 20, at = (uintptr_t)(h->base + offset);
	uintptr_t huge_from = (at + huge - 1) / huge * huge,
	          huge_to = (at + (uintptr_t)len) / huge * huge;
	if (huge_to > huge_from)
		madvise((void *)huge_from, huge_to - huge_from, MADV_HUGEPAGE);
#endif
	advise(h, from, to, MADV_POPULATE_WRITE);
#else
	(void)h, (void)offset, (void)len;
#endif
}

static void hbm_note_usage(struct hbm *h)
{
	if (h->used > h->stats.peak_bytes_in_use)
		h->stats.peak_bytes_in_use = h->used;
}

int hbm_alloc(struct hbm *h, int64_t size, struct hbm_buffer *out, struct status *st)
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
	if (node_room(h) != 0)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	/* The buffer's place at the top of the gap. */
	int64_t at = node(h, g)->b - need;
	int i = g;
	if (at > node(h, g)->a) /* what stays below it is still free */
		i = node_new(h, at, node(h, g)->b, false, g);
	if (i != g) {
		gap_resize(h, g, node(h, g)->a, at);
		keep_clip(h, g);
	} else {
		keep_set(h, g, keep_none);
		gap_remove(h, g);
		node(h, g)->left = -1; /* a buffer now */
	}
	h->num_blocks++;
	h->used += need;
	h->stats.num_allocs++;
	if (need > h->stats.largest_alloc_size)
		h->stats.largest_alloc_size = need;
	hbm_note_usage(h);
	*out = (struct hbm_buffer){.offset = at, .id = i};
	return ST_OK;
}

int hbm_free(struct hbm *h, struct hbm_buffer buf)
{
	int i = buf.id;
	if (i <= 0 || i > h->num_nodes || is_gap(node(h, i)) || node(h, i)->a != buf.offset ||
	    buf.offset < 0)
		return ST_NOT_FOUND;
	h->num_blocks--;
	h->used -= node(h, i)->b - node(h, i)->a;
	retain_or_return(h, segment_free(h, i));
	return ST_OK;
}

/*
 * How much the reservation may take: up to the lowest buffer, or the end of the heap. The
 * lowest segment is a gap from the reservation up, or a buffer, or there is none (the
 * reservation fills the heap).
 */
static int64_t reservable(const struct hbm *h)
{
	if (h->first == 0)
		return h->capacity;
	const struct hbm_node *n = node(h, h->first);
	return is_gap(n) ? n->b : n->a;
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
	/* Releasing it cannot fail: the node it may need is set aside now. */
	if (node_room(h) != 0)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	h->spare = node_take(h);
	/* The bottom gap, [0, limit), gives up its first need bytes. */
	int g = h->first;
	if (node(h, g)->b > need) {
		gap_resize(h, g, need, node(h, g)->b);
		keep_clip(h, g);
	} else {
		keep_set(h, g, keep_none);
		gap_remove(h, g);
		node_unlink(h, g);
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
	int g = h->first;
	if (g != 0 && is_gap(node(h, g))) {
		gap_resize(h, g, 0, node(h, g)->b);
		node_put(h, h->spare);
	} else {
		g = node_link(h, h->spare, 0, was, true, 0);
		gap_add(h, g);
	}
	h->spare = 0;
	keep_add(h, g, 0, was);
	retain_or_return(h, g);
}

void hbm_get_stats(const struct hbm *h, struct hbm_stats *out)
{
	*out = h->stats;
	out->bytes_in_use = h->used;
	out->bytes_reserved = h->reserved;
	out->bytes_reservable_limit = reservable(h);
	out->largest_free_block_bytes = largest_gap(h);
}
