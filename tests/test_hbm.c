/* HBM heap: placement, reservation, XLA error texts, statistics, backing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "hbm.h"

#define MiB ((int64_t)1 << 20)
#define GiB ((int64_t)1 << 30)

static void test_buffers_fill_from_top_best_fit(void **state)
{
	struct hbm h;
	struct status st;
	assert_int_equal(hbm_init(&h, 100 * MiB, false, &st), ST_OK);
	struct hbm_buffer a, b, c, d;
	assert_int_equal(hbm_alloc(&h, 10 * MiB, &a, &st), ST_OK);
	assert_int_equal(a.offset, 90 * MiB);
	assert_int_equal(hbm_alloc(&h, 20 * MiB, &b, &st), ST_OK);
	assert_int_equal(b.offset, 70 * MiB);
	assert_int_equal(hbm_alloc(&h, 5 * MiB, &c, &st), ST_OK);
	assert_int_equal(c.offset, 65 * MiB);
	/* Free the 20 MiB in the middle: a 3 MiB buffer goes into that hole (best fit over the
	 * 65 MiB below), at its top. */
	assert_int_equal(hbm_free(&h, b), ST_OK);
	assert_int_equal(hbm_alloc(&h, 3 * MiB, &d, &st), ST_OK);
	assert_int_equal(d.offset, 87 * MiB);
	/* What names no live buffer changes nothing: a made-up one, a freed one, a wrong offset. */
	assert_int_equal(hbm_free(&h, (struct hbm_buffer){.offset = 12345, .id = 1}), ST_NOT_FOUND);
	assert_int_equal(hbm_free(&h, (struct hbm_buffer){.offset = 1, .id = 1 << 30}),
	                 ST_NOT_FOUND);
	assert_int_equal(hbm_free(&h, b), ST_NOT_FOUND);
	assert_int_equal(hbm_free(&h, (struct hbm_buffer){.offset = a.offset + 256, .id = a.id}),
	                 ST_NOT_FOUND);
	struct hbm_stats s;
	hbm_get_stats(&h, &s);
	assert_int_equal(s.bytes_in_use, 18 * MiB);
	assert_int_equal(hbm_free(&h, a), ST_OK);
	assert_int_equal(hbm_free(&h, a), ST_NOT_FOUND);
	hbm_destroy(&h);
}

static void test_sizes_are_aligned(void **state)
{
	struct hbm h;
	struct status st;
	hbm_init(&h, 1 * MiB, false, &st);
	struct hbm_buffer a;
	assert_int_equal(hbm_alloc(&h, 1, &a, &st), ST_OK);
	assert_int_equal(a.offset, 1 * MiB - HBM_ALIGNMENT);
	struct hbm_stats s;
	hbm_get_stats(&h, &s);
	assert_int_equal(s.bytes_in_use, HBM_ALIGNMENT);
	hbm_destroy(&h);
}

static void test_allocation_failure_text(void **state)
{
	struct hbm h;
	struct status st;
	hbm_init(&h, 16 * GiB, false, &st);
	struct hbm_buffer a;
	assert_int_equal(hbm_alloc(&h, 12 * GiB, &a, &st), ST_OK);
	assert_int_equal(hbm_alloc(&h, 5 * GiB, &a, &st), ST_RESOURCE_EXHAUSTED);
	assert_string_equal(st.message, "Error allocating device buffer: Attempting to allocate "
	                                "5.00G. That was not possible. There are 4.00G free.");
	struct hbm_stats s;
	hbm_get_stats(&h, &s);
	assert_int_equal(s.bytes_in_use, 12 * GiB);
	assert_int_equal(s.num_allocs, 1);
	hbm_destroy(&h);
}

/*
 * The failure of pytorch/xla 3510: enough bytes are free, but not below the lowest device
 * buffer, so the program's reservation at the bottom fails.
 */
static void test_reservation_fails_when_fragmented(void **state)
{
	struct hbm h;
	struct status st;
	hbm_init(&h, 16 * GiB, false, &st);
	struct hbm_buffer top, low, mid;
	assert_int_equal(hbm_alloc(&h, 4 * GiB, &top, &st), ST_OK); /* [12G, 16G) */
	assert_int_equal(hbm_alloc(&h, 4 * GiB, &mid, &st), ST_OK); /* [8G, 12G) */
	assert_int_equal(hbm_alloc(&h, 6 * GiB, &low, &st), ST_OK); /* [2G, 8G) */
	assert_int_equal(hbm_free(&h, mid), ST_OK);                 /* 6G free: 2G + 4G */
	assert_int_equal(hbm_reserve_bottom(&h, 3 * GiB, &st), ST_RESOURCE_EXHAUSTED);
	assert_string_equal(st.message, "Attempting to reserve 3.00G at the bottom of memory. That "
	                                "was not possible. There are 6.00G free, 0B reserved, and "
	                                "2.00G reservable.");
	assert_int_equal(hbm_reserve_bottom(&h, 2 * GiB, &st), ST_OK);
	struct hbm_stats s;
	hbm_get_stats(&h, &s);
	assert_int_equal(s.bytes_reserved, 2 * GiB);
	assert_int_equal(s.bytes_in_use, 12 * GiB);
	assert_int_equal(s.peak_bytes_in_use, 14 * GiB);
	assert_int_equal(s.bytes_reservable_limit, 2 * GiB);
	/* A second reservation while one is held is a program bug, not a memory shortage. */
	assert_int_equal(hbm_reserve_bottom(&h, 1 * MiB, &st), ST_FAILED_PRECONDITION);
	/*
	 * Device buffers never go into the reserved region: best fit would put 1G into the 2G
	 * gap at the bottom, which the reservation holds, so it lands in the 4G gap above.
	 */
	struct hbm_buffer x;
	assert_int_equal(hbm_alloc(&h, 1 * GiB, &x, &st), ST_OK);
	assert_true(x.offset >= 2 * GiB);
	assert_int_equal(hbm_free(&h, x), ST_OK);
	hbm_release_reservation(&h);
	hbm_get_stats(&h, &s);
	assert_int_equal(s.bytes_reserved, 0);
	assert_int_equal(s.peak_bytes_reserved, 2 * GiB);
	hbm_destroy(&h);
}

/*
 * A reservation that takes the whole bottom gap is released into a gap of its own whatever was
 * allocated meanwhile (however full the heap's bookkeeping got): it needs nothing then.
 */
static void test_releasing_a_reservation_needs_nothing(void **state)
{
	(void)state;
	for (int k = 0; k < 300; k++) {
		struct hbm h;
		struct status st;
		struct hbm_buffer top, low, at;
		assert_int_equal(hbm_init(&h, 64 * MiB, false, &st), ST_OK);
		assert_int_equal(hbm_alloc(&h, 8 * MiB, &top, &st), ST_OK); /* [56, 64) */
		assert_int_equal(hbm_alloc(&h, 8 * MiB, &low, &st), ST_OK); /* [48, 56) */
		assert_int_equal(hbm_free(&h, top), ST_OK);
		assert_int_equal(hbm_reserve_bottom(&h, 48 * MiB, &st), ST_OK);
		for (int i = 0; i < k; i++) /* each splits the top gap */
			assert_int_equal(hbm_alloc(&h, 4096, &at, &st), ST_OK);
		hbm_release_reservation(&h);
		struct hbm_stats s;
		hbm_get_stats(&h, &s);
		assert_int_equal(s.bytes_reserved, 0);
		assert_int_equal(s.bytes_in_use, 8 * MiB + (int64_t)k * 4096);
		assert_int_equal(s.bytes_reservable_limit, 48 * MiB);
		assert_int_equal(s.largest_free_block_bytes, 48 * MiB);
		assert_int_equal(hbm_alloc(&h, 48 * MiB, &at, &st), ST_OK);
		assert_int_equal(at.offset, 0);
		hbm_destroy(&h);
	}
}

static void test_statistics(void **state)
{
	struct hbm h;
	struct status st;
	hbm_init(&h, 64 * MiB, false, &st);
	struct hbm_buffer a, b;
	hbm_alloc(&h, 8 * MiB, &a, &st);
	hbm_alloc(&h, 16 * MiB, &b, &st);
	hbm_free(&h, a);
	struct hbm_stats s;
	hbm_get_stats(&h, &s);
	assert_int_equal(s.bytes_in_use, 16 * MiB);
	assert_int_equal(s.peak_bytes_in_use, 24 * MiB);
	assert_int_equal(s.bytes_limit, 64 * MiB);
	assert_int_equal(s.num_allocs, 2);
	assert_int_equal(s.largest_alloc_size, 16 * MiB);
	assert_int_equal(s.bytes_reservable_limit, 40 * MiB);
	assert_int_equal(s.largest_free_block_bytes, 40 * MiB);
	hbm_destroy(&h);
}

static void test_backing_holds_bytes(void **state)
{
	struct hbm h;
	struct status st;
	assert_int_equal(hbm_init(&h, 256 * MiB, true, &st), ST_OK);
	struct hbm_buffer a, b, c;
	const int64_t small = 64 * 1024;
	hbm_alloc(&h, small, &a, &st);
	unsigned char *p = hbm_ptr(&h, a.offset);
	assert_non_null(p);
	memset(p, 0xab, (size_t)small);
	assert_int_equal(p[small - 1], 0xab);
	/* A free within the budget keeps its pages for the next buffer... */
	hbm_free(&h, a);
	assert_int_equal(p[12345], 0xab);
	assert_int_equal(h.retained, small);
	/* ... which takes them: nothing is kept then. */
	hbm_alloc(&h, 4 * MiB, &b, &st);
	unsigned char *q = hbm_ptr(&h, b.offset);
	assert_ptr_equal(q + 4 * MiB - small, p);
	assert_int_equal(h.retained, 0);
	/* Past the budget, a free keeps the highest bytes that fit (the next buffer's place)... */
	hbm_alloc(&h, 100, &c, &st); /* b's gap is not the bottom one */
	memset(q, 0xcd, (size_t)(4 * MiB));
	hbm_free(&h, b);
	assert_int_equal(h.retained, HBM_RETAIN_BYTES);
	assert_int_equal(q[4 * MiB - 1], 0xcd);
	assert_int_equal(q[4 * MiB - HBM_RETAIN_BYTES], 0xcd);
	assert_int_equal(q[4 * MiB - HBM_RETAIN_BYTES - 1], 0);
	assert_int_equal(q[0], 0);
	/* ... and the bottom gap its lowest (the next reservation's), in what is left. */
	hbm_free(&h, c);
	hbm_set_retain(&h, 2 * MiB);
	assert_int_equal(hbm_reserve_bottom(&h, 4 * MiB, &st), ST_OK);
	unsigned char *r = hbm_ptr(&h, 0);
	memset(r, 0xee, (size_t)(4 * MiB));
	hbm_release_reservation(&h);
	assert_int_equal(h.retained, 2 * MiB);
	assert_int_equal(r[0], 0xee);
	assert_int_equal(r[4 * MiB - 1], 0);
	/* The agent gives everything back once idle. */
	hbm_return_free_pages(&h);
	assert_int_equal(h.retained, 0);
	assert_int_equal(r[0], 0);
	assert_int_equal(q[4 * MiB - 1], 0);
	/* Lowering the budget below what is kept gives it back. */
	hbm_set_retain(&h, 8 * MiB);
	hbm_alloc(&h, 4 * MiB, &b, &st);
	q = hbm_ptr(&h, b.offset);
	memset(q, 0xcd, (size_t)(4 * MiB));
	hbm_free(&h, b);
	assert_int_equal(h.retained, 4 * MiB);
	assert_int_equal(q[4 * MiB - 1], 0xcd);
	hbm_set_retain(&h, 0); /* at least HBM_RETAIN_BYTES */
	assert_int_equal(h.retained, 0);
	assert_int_equal(q[4 * MiB - 1], 0);
	/* What does not fit goes back at once: it reads as zero. */
	hbm_alloc(&h, 4 * MiB, &b, &st);
	q = hbm_ptr(&h, b.offset);
	memset(q, 0xcd, (size_t)(4 * MiB));
	hbm_free(&h, b);
	assert_int_equal(q[HBM_RETAIN_BYTES - 1], 0xcd);
	assert_int_equal(q[4 * MiB - 1], 0);
	/* But not the page it shares with a buffer still there (b's first, c's last bytes). */
	hbm_alloc(&h, HBM_RETAIN_BYTES + 100, &b, &st);
	hbm_alloc(&h, 100, &c, &st);
	q = hbm_ptr(&h, b.offset);
	r = hbm_ptr(&h, c.offset);
	memset(q, 0xcd, (size_t)HBM_RETAIN_BYTES + 100);
	memset(r, 0xef, 100);
	hbm_free(&h, b);
	assert_int_equal(r[99], 0xef);
	assert_int_equal(q[HBM_RETAIN_BYTES / 2], 0);
	hbm_destroy(&h);

	assert_int_equal(hbm_init(&h, 64 * MiB, false, &st), ST_OK);
	hbm_alloc(&h, 4 * MiB, &a, &st);
	assert_null(hbm_ptr(&h, a.offset));
	hbm_destroy(&h);
}

/*
 * A step's pattern: the reservation at the bottom and an output near the top are both freed
 * between steps; both keep their pages (not the untouched bytes between them), and the next
 * step's reservation and output take them again.
 */
static void test_backing_keeps_both_ends(void **state)
{
	struct hbm h;
	struct status st;
	assert_int_equal(hbm_init(&h, 256 * MiB, true, &st), ST_OK);
	hbm_set_retain(&h, 8 * MiB);
	struct hbm_buffer x, y;
	assert_int_equal(hbm_alloc(&h, 256 * 1024, &x, &st), ST_OK); /* an input, at the top */
	assert_int_equal(hbm_reserve_bottom(&h, 4 * MiB, &st), ST_OK);
	assert_int_equal(hbm_alloc(&h, MiB, &y, &st), ST_OK); /* the step's output */
	unsigned char *r = hbm_ptr(&h, 0), *q = hbm_ptr(&h, y.offset);
	memset(r, 0xee, (size_t)(4 * MiB));
	memset(q, 0xcd, (size_t)MiB);
	hbm_release_reservation(&h);
	assert_int_equal(h.retained, 4 * MiB);
	hbm_free(&h, y); /* one gap from 0 to x now */
	assert_int_equal(h.retained, 5 * MiB);
	assert_int_equal(r[0], 0xee);
	assert_int_equal(r[4 * MiB - 1], 0xee);
	assert_int_equal(q[0], 0xcd);
	assert_int_equal(q[MiB - 1], 0xcd);
	/* The next step takes both again. */
	assert_int_equal(hbm_reserve_bottom(&h, 4 * MiB, &st), ST_OK);
	assert_int_equal(h.retained, MiB);
	assert_int_equal(hbm_alloc(&h, MiB, &y, &st), ST_OK);
	assert_ptr_equal(hbm_ptr(&h, y.offset), q);
	assert_int_equal(h.retained, 0);
	/* Past the budget the bottom gap keeps its lowest bytes first, then its highest. */
	hbm_release_reservation(&h);
	hbm_set_retain(&h, 4 * MiB + MiB / 2);
	hbm_free(&h, y);
	assert_int_equal(h.retained, 4 * MiB + MiB / 2);
	assert_int_equal(r[4 * MiB - 1], 0xee);
	assert_int_equal(q[MiB - 1], 0xcd);
	assert_int_equal(q[MiB / 2], 0xcd);
	assert_int_equal(q[MiB / 2 - 1], 0);
	hbm_return_free_pages(&h);
	assert_int_equal(h.retained, 0);
	assert_int_equal(r[0], 0);
	assert_int_equal(q[MiB - 1], 0);
	hbm_free(&h, x);
	hbm_destroy(&h);
	(void)state;
}

/* The heap's rules written plainly (sorted blocks, linear scans): the reference. */
struct model {
	int64_t cap, reserved, off[4096], size[4096];
	int32_t id[4096]; /* the heap's name for each buffer */
	int n;
};

static int64_t model_alloc(struct model *m, int64_t size)
{
	int64_t need = hbm_aligned_size(size), best_end = -1, best = INT64_MAX, prev = m->reserved;
	for (int i = 0; i <= m->n; i++) {
		int64_t next = i < m->n ? m->off[i] : m->cap;
		if (next - prev >= need && next - prev <= best) {
			best = next - prev;
			best_end = next;
		}
		if (i < m->n)
			prev = m->off[i] + m->size[i];
	}
	if (best_end < 0)
		return -1;
	int64_t at = best_end - need;
	int pos = 0;
	while (pos < m->n && m->off[pos] < at)
		pos++;
	memmove(&m->off[pos + 1], &m->off[pos], (size_t)(m->n - pos) * sizeof(int64_t));
	memmove(&m->size[pos + 1], &m->size[pos], (size_t)(m->n - pos) * sizeof(int64_t));
	memmove(&m->id[pos + 1], &m->id[pos], (size_t)(m->n - pos) * sizeof(int32_t));
	m->off[pos] = at;
	m->size[pos] = need;
	m->n++;
	return at;
}

static void model_free(struct model *m, int k)
{
	memmove(&m->off[k], &m->off[k + 1], (size_t)(m->n - k - 1) * sizeof(int64_t));
	memmove(&m->size[k], &m->size[k + 1], (size_t)(m->n - k - 1) * sizeof(int64_t));
	memmove(&m->id[k], &m->id[k + 1], (size_t)(m->n - k - 1) * sizeof(int32_t));
	m->n--;
}

static void model_check(const struct model *m, const struct hbm *h)
{
	int64_t used = m->reserved, largest = 0, prev = m->reserved;
	for (int i = 0; i <= m->n; i++) {
		int64_t next = i < m->n ? m->off[i] : m->cap;
		largest = next - prev > largest ? next - prev : largest;
		if (i < m->n) {
			used += m->size[i];
			prev = m->off[i] + m->size[i];
		}
	}
	struct hbm_stats s;
	hbm_get_stats(h, &s);
	assert_int_equal(s.bytes_in_use, used);
	assert_int_equal(s.bytes_reserved, m->reserved);
	assert_int_equal(s.bytes_reservable_limit, m->n ? m->off[0] : m->cap);
	assert_int_equal(s.largest_free_block_bytes, largest);
}

/*
 * Random allocations (of 1 byte to max_size), frees, reservations and releases: the heap places
 * every buffer where the plain rules do and its statistics stay exact.
 */
static void replay(int64_t max_size, unsigned seed)
{
	static struct model m;
	struct hbm h;
	struct status st;
	m = (struct model){.cap = 64 * MiB};
	assert_int_equal(hbm_init(&h, 64 * MiB, false, &st), ST_OK);
	for (int step = 0; step < 40000; step++) {
		seed = seed * 1103515245u + 12345u;
		unsigned r = seed >> 8;
		if (r % 50 == 0) { /* a program's reservation comes and goes */
			if (m.reserved) {
				hbm_release_reservation(&h);
				m.reserved = 0;
			} else {
				int64_t want = (int64_t)(r % (4 * MiB)) + 1;
				int64_t need = hbm_aligned_size(want);
				int ok = need <= (m.n ? m.off[0] : m.cap);
				assert_int_equal(hbm_reserve_bottom(&h, want, &st),
				                 ok ? ST_OK : ST_RESOURCE_EXHAUSTED);
				if (ok)
					m.reserved = need;
			}
		} else if (m.n > 0 && (r % 3 == 0 || m.n == 4096)) {
			int k = (int)((r / 3) % (unsigned)m.n);
			struct hbm_buffer b = {.offset = m.off[k], .id = m.id[k]};
			assert_int_equal(hbm_free(&h, b), ST_OK);
			model_free(&m, k);
		} else {
			int64_t size = (int64_t)(r % (unsigned)max_size) + 1;
			struct hbm_buffer at;
			int64_t want = model_alloc(&m, size);
			int rv = hbm_alloc(&h, size, &at, &st);
			assert_int_equal(rv, want < 0 ? ST_RESOURCE_EXHAUSTED : ST_OK);
			if (want >= 0) {
				assert_int_equal(at.offset, want);
				for (int i = 0; i < m.n; i++)
					if (m.off[i] == want)
						m.id[i] = at.id;
			}
		}
		model_check(&m, &h);
	}
	hbm_destroy(&h);
}

/* Gaps mostly larger than the exact-size bins, and few of them. */
static void test_heap_agrees_with_the_plain_rules(void **state)
{
	(void)state;
	replay(512 * 1024, 99);
}

/* Thousands of small gaps: the bins hold them (HBM_BINS_FROM). */
static void test_heap_with_many_small_gaps_agrees_with_the_plain_rules(void **state)
{
	(void)state;
	replay(16 * 1024, 7);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_heap_agrees_with_the_plain_rules),
	    cmocka_unit_test(test_heap_with_many_small_gaps_agrees_with_the_plain_rules),
	    cmocka_unit_test(test_buffers_fill_from_top_best_fit),
	    cmocka_unit_test(test_sizes_are_aligned),
	    cmocka_unit_test(test_allocation_failure_text),
	    cmocka_unit_test(test_reservation_fails_when_fragmented),
	    cmocka_unit_test(test_statistics),
	    cmocka_unit_test(test_releasing_a_reservation_needs_nothing),
	    cmocka_unit_test(test_backing_holds_bytes),
	    cmocka_unit_test(test_backing_keeps_both_ends),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
