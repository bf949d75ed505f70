/* Status texts, byte formatting, topologies, sizes, shapes, CPU lists. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <malloc.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include "arena.h"
#include "collective.h"
#include "cpus.h"
#include "dtype.h"
#include "exit_with.h"
#include "status.h"
#include "topology.h"

static void test_human_bytes_like_xla(void **state)
{
	char buf[16];
	assert_string_equal(status_human_bytes(buf, 0), "0B");
	assert_string_equal(status_human_bytes(buf, 1023), "1023B");
	assert_string_equal(status_human_bytes(buf, 1024), "1.00K");
	assert_string_equal(status_human_bytes(buf, 1536), "1.50K");
	assert_string_equal(status_human_bytes(buf, 12LL << 30), "12.00G");
	/* 10.98G as in pytorch/xla 3510's message. */
	assert_string_equal(status_human_bytes(buf, 11790000000LL), "10.98G");
	assert_string_equal(status_human_bytes(buf, -2048), "-2.00K");
}

static void test_status_names(void **state)
{
	assert_string_equal(status_code_name(ST_RESOURCE_EXHAUSTED), "RESOURCE_EXHAUSTED");
	assert_string_equal(status_code_name(ST_UNAUTHENTICATED), "UNAUTHENTICATED");
	assert_string_equal(status_code_name(99), "UNKNOWN");
	struct status st;
	assert_int_equal(status_set(&st, ST_NOT_FOUND, "handle %d", 7), ST_NOT_FOUND);
	assert_string_equal(st.message, "handle 7");
}

static void test_presets(void **state)
{
	struct topology t;
	struct status st;
	static const struct {
		const char *name;
		int hosts, cores;
		int64_t hbm;
	} cases[] = {
	    {"v2-8", 1, 8, 8LL << 30},     {"v3-8", 1, 8, 16LL << 30},  {"v3-32", 4, 8, 16LL << 30},
	    {"v3-128", 16, 8, 16LL << 30}, {"v4-8", 1, 4, 32LL << 30},  {"v4-32", 4, 4, 32LL << 30},
	    {"v5e-16", 2, 8, 16LL << 30},  {"v5p-8", 1, 4, 95LL << 30},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		assert_int_equal(topology_from_preset(&t, cases[i].name, &st), ST_OK);
		assert_string_equal(t.name, cases[i].name);
		assert_int_equal(t.num_hosts, cases[i].hosts);
		assert_int_equal(t.cores_per_host, cases[i].cores);
		assert_int_equal(t.hbm_bytes, cases[i].hbm);
	}
	/* v3: 16 GiB with about 530 MiB taken by the runtime, 15.48 GiB usable. */
	topology_from_preset(&t, "v3-8", &st);
	char buf[16];
	assert_string_equal(status_human_bytes(buf, topology_bytes_limit(&t)), "15.48G");
	assert_int_equal(topology_from_preset(&t, "v3-7", &st), ST_INVALID_ARGUMENT);
	assert_int_equal(topology_from_preset(&t, "v9-8", &st), ST_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "unknown topology 'v9-8'"));
	assert_int_equal(topology_custom(&t, 0, 8, 1LL << 30, &st), ST_INVALID_ARGUMENT);
	assert_int_equal(topology_custom(&t, 3, 2, 1LL << 30, &st), ST_OK);
	assert_int_equal(topology_world_size(&t), 6);
}

static void test_parse_size(void **state)
{
	int64_t v;
	struct status st;
	assert_int_equal(parse_size(&v, "4096", &st), ST_OK);
	assert_int_equal(v, 4096);
	assert_int_equal(parse_size(&v, "16G", &st), ST_OK);
	assert_int_equal(v, 16LL << 30);
	assert_int_equal(parse_size(&v, "1.5GiB", &st), ST_OK);
	assert_int_equal(v, 3LL << 29);
	assert_int_equal(parse_size(&v, "64MB", &st), ST_OK);
	assert_int_equal(v, 64LL << 20);
	assert_int_equal(parse_size(&v, "-1", &st), ST_INVALID_ARGUMENT);
	assert_int_equal(parse_size(&v, "12Q", &st), ST_INVALID_ARGUMENT);
	assert_int_equal(parse_size(&v, "99999999999T", &st), ST_INVALID_ARGUMENT);
	assert_int_equal(parse_size(&v, "", &st), ST_INVALID_ARGUMENT);
}

static void test_parse_int(void **state)
{
	int v = -7;
	struct status st;
	assert_int_equal(parse_int(&v, "n", "64", 1, 64, &st), ST_OK);
	assert_int_equal(v, 64);
	assert_int_equal(parse_int(&v, "n", "-3", -5, 5, &st), ST_OK);
	assert_int_equal(v, -3);
	assert_int_equal(parse_int(&v, "--window", "65", 1, 64, &st), ST_INVALID_ARGUMENT);
	assert_string_equal(st.message, "--window: '65' is not a whole number in [1, 64]");
	assert_int_equal(parse_int(&v, "--hosts", "two", 1, INT_MAX, &st), ST_INVALID_ARGUMENT);
	assert_string_equal(st.message, "--hosts: 'two' is not a whole number of at least 1");
	const char *bad[] = {"", "4x", "1.5", "0", "99999999999", "-99999999999"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(parse_int(&v, "n", bad[i], 1, INT_MAX, &st), ST_INVALID_ARGUMENT);
	assert_int_equal(v, -3); /* untouched by a failure */
}

static void test_shapes(void **state)
{
	struct shape s;
	struct status st;
	int64_t dims[] = {1024, 128};
	assert_int_equal(shape_make(&s, DT_F32, dims, 2, &st), ST_OK);
	assert_int_equal(shape_bytes(&s), 1024 * 128 * 4);
	char buf[64];
	assert_string_equal(shape_format(buf, sizeof(buf), &s), "f32[1024,128]");
	int64_t huge[] = {1LL << 40, 1LL << 40};
	assert_int_equal(shape_make(&s, DT_F32, huge, 2, &st), ST_INVALID_ARGUMENT);
	int64_t neg[] = {-1};
	assert_int_equal(shape_make(&s, DT_F32, neg, 1, &st), ST_INVALID_ARGUMENT);
	assert_int_equal(shape_make(&s, 99, dims, 2, &st), ST_INVALID_ARGUMENT);
	/* dims may alias the output. */
	assert_int_equal(shape_make(&s, DT_BF16, s.dims, s.rank, &st), ST_OK);
	assert_int_equal(shape_bytes(&s), 1024 * 128 * 2);
	assert_int_equal(dtype_parse("bf16"), DT_BF16);
	assert_int_equal(dtype_parse("f64"), DT_INVALID);
}

/* 100,000 small allocations fill 64 KiB blocks one after another: about 2 MiB of heap. */
static void test_arena_packs_small_allocations(void **state)
{
	struct mallinfo2 before = mallinfo2();
	struct arena *a = arena_new();
	assert_non_null(a);
	for (int i = 0; i < 100000; i++) {
		char *p = arena_alloc(a, 16);
		assert_non_null(p);
		p[15] = 1;
		if (i % 1000 == 0)
			assert_non_null(
			    arena_alloc(a, 100000)); /* large ones get blocks of their own */
	}
	struct mallinfo2 after = mallinfo2();
	size_t grown = (after.uordblks + after.hblkhd) - (before.uordblks + before.hblkhd);
	assert_true(grown < 2 * 1024 * 1024 + 100 * 100016 + (1 << 20));
	arena_free(a);
}

/*
 * After arena_reset the same allocations reuse the arena's blocks, large ones too: a loop of
 * 100 rounds of 1 MiB in small pieces and a 100 KB piece holds one round's memory, zeroed.
 */
static void test_arena_reset_reuses_its_blocks(void **state)
{
	(void)state;
	struct arena *a = arena_new();
	assert_non_null(a);
	size_t after_first = 0;
	for (int round = 0; round < 100; round++) {
		arena_reset(a);
		for (int i = 0; i < 4096; i++) {
			unsigned char *p = arena_alloc(a, 256);
			assert_non_null(p);
			assert_int_equal(p[0] | p[255], 0); /* zeroed though reused */
			memset(p, 0xff, 256);
		}
		unsigned char *big = arena_alloc(a, 100000);
		assert_non_null(big);
		assert_int_equal(big[99999], 0);
		memset(big, 0xff, 100000);
		struct mallinfo2 m = mallinfo2();
		if (round == 0)
			after_first = m.uordblks + m.hblkhd;
		else
			assert_true(m.uordblks + m.hblkhd <= after_first);
	}
	arena_free(a);
}

static void test_iota_replica_groups(void **state)
{
	int64_t *ids = NULL;
	int *sizes = NULL;
	int n = 0;
	struct status st;
	assert_int_equal(coll_groups_parse("[2,4]<=[8]", &ids, &sizes, &n, &st), ST_OK);
	assert_int_equal(n, 2);
	assert_int_equal(sizes[0], 4);
	assert_int_equal(ids[7], 7);
	free(ids);
	free(sizes);
	/*
	 * With a transpose, as multi-host JAX dumps write them: [4,2]<=[2,4]T(1,0) lays 0..7 out
	 * as [[0,1,2,3],[4,5,6,7]], transposes it and reads pairs: {0,4},{1,5},{2,6},{3,7}.
	 */
	assert_int_equal(coll_groups_parse("[4,2]<=[2,4]T(1,0)", &ids, &sizes, &n, &st), ST_OK);
	assert_int_equal(n, 4);
	assert_int_equal(sizes[3], 2);
	const int64_t want[] = {0, 4, 1, 5, 2, 6, 3, 7};
	for (int i = 0; i < 8; i++)
		assert_int_equal(ids[i], want[i]);
	free(ids);
	free(sizes);
	/* Three dimensions: [2,2,2]T(2,1,0) reverses the bits of each position. */
	assert_int_equal(coll_groups_parse("[2,4]<=[2,2,2]T(2,1,0)", &ids, &sizes, &n, &st), ST_OK);
	const int64_t reversed[] = {0, 4, 2, 6, 1, 5, 3, 7};
	for (int i = 0; i < 8; i++)
		assert_int_equal(ids[i], reversed[i]);
	free(ids);
	free(sizes);
	/* Counts whose product overflows, or that disagree, are refused, not multiplied. */
	const char *bad[] = {"[9999999999999999999999,8]<=[8]",
	                     "[4611686018427387904,2]<=[0]",
	                     "[3,3]<=[8]",
	                     "[0,8]<=[8]",
	                     "[4,2]<=[2,4]T(1,1)",
	                     "[4,2]<=[2,4]T(0)",
	                     "[4,2]<=[2,4]T(0,2)",
	                     "[4,2]<=[2,5]"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ids = NULL;
		sizes = NULL;
		assert_int_equal(coll_groups_parse(bad[i], &ids, &sizes, &n, &st),
		                 ST_INVALID_ARGUMENT);
		free(ids);
		free(sizes);
	}
}

/* More ids than cores (a group repeated): refused with XLA's words, within the ids' memory. */
static void test_replica_groups_longer_than_the_world(void **state)
{
	int64_t ids[4] = {0, 1, 2, 3};
	Podemu__ReplicaGroup groups[3], *list[3];
	for (int g = 0; g < 3; g++) {
		podemu__replica_group__init(&groups[g]);
		groups[g].n_replica_ids = 4;
		groups[g].replica_ids = ids;
		list[g] = &groups[g];
	}
	Podemu__Node node = PODEMU__NODE__INIT;
	node.n_replica_groups = 3;
	node.replica_groups = list;
	struct coll_groups out;
	struct status st;
	assert_int_equal(coll_groups_resolve(&out, &node, NULL, 0, 4, 0, "all-gather", &st),
	                 ST_INVALID_ARGUMENT);
	assert_string_equal(st.message,
	                    "all-gather: Replica 0 is repeated in instruction's replica-groups");
}

/* The affinity mask, as taskset narrows it: this thread pinned to one of its CPUs, then back. */
static void test_cpus_allowed(void **state)
{
	(void)state;
	cpu_set_t before, set, one;
	assert_int_equal(sched_getaffinity(0, sizeof(before), &before), 0);
	assert_int_equal(cpus_allowed(&set), CPU_COUNT(&before));
	assert_true(CPU_EQUAL(&set, &before));
	int last = -1;
	for (int i = 0; i < CPU_SETSIZE; i++)
		if (CPU_ISSET(i, &before))
			last = i;
	CPU_ZERO(&one);
	CPU_SET(last, &one);
	assert_int_equal(sched_setaffinity(0, sizeof(one), &one), 0);
	int n = cpus_allowed(&set);
	assert_int_equal(sched_setaffinity(0, sizeof(before), &before), 0);
	assert_int_equal(n, 1);
	assert_true(CPU_ISSET(last, &set));
}

static void test_cpu_lists(void **state)
{
	cpu_set_t set;
	struct status st;
	char text[64];
	assert_int_equal(cpus_parse(&set, "0-3,8,10-11", &st), ST_OK);
	assert_int_equal(CPU_COUNT(&set), 7);
	assert_true(CPU_ISSET(8, &set) && !CPU_ISSET(9, &set));
	assert_true(cpus_format(&set, text, sizeof(text)));
	assert_string_equal(text, "0-3,8,10-11");
	assert_false(cpus_format(&set, text, 8)); /* "0-3,8,1" would name another CPU */
	const char *bad[] = {"",   "a", "3-1", "1,", ",1", "1-", "0-99999", "99999999999999999999",
	                     "1 ", "-1"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(cpus_parse(&set, bad[i], &st), ST_INVALID_ARGUMENT);
		assert_non_null(strstr(st.message, "is not a CPU list"));
	}

	/* Fewer CPUs than agents: one each, round-robin; else blocks of consecutive CPUs. */
	cpu_set_t two, eight, mine;
	cpus_parse(&two, "0-1", &st);
	cpus_parse(&eight, "0-7", &st);
	const char *want4on2[] = {"0", "1", "0", "1"};
	for (int h = 0; h < 4; h++) {
		cpus_for_agent(&mine, &two, h, 4);
		cpus_format(&mine, text, sizeof(text));
		assert_string_equal(text, want4on2[h]);
	}
	const char *want3on8[] = {"0-1", "2-4", "5-7"};
	for (int h = 0; h < 3; h++) {
		cpus_for_agent(&mine, &eight, h, 3);
		cpus_format(&mine, text, sizeof(text));
		assert_string_equal(text, want3on8[h]);
	}
	cpus_parse(&set, "2,5,9", &st); /* the allowed CPUs need not be consecutive */
	cpus_for_agent(&mine, &set, 4, 5);
	cpus_format(&mine, text, sizeof(text));
	assert_string_equal(text, "5");
}

/* Whether fd is readable now (a pidfd: its process exited). */
static bool readable(int fd, int wait_ms)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	return poll(&p, 1, wait_ms) == 1 && (p.revents & POLLIN);
}

/* PODEMU_EXIT_WITH: unset is no watch; a bad value or a gone process is refused; a live one is
 * watched until it exits, killed outright. */
static void test_exit_with(void **state)
{
	(void)state;
	struct status st;
	int fd;
	pid_t pid;
	unsetenv("PODEMU_EXIT_WITH");
	assert_int_equal(exit_with_open(&fd, &pid, &st), ST_OK);
	assert_int_equal(fd, -1);
	setenv("PODEMU_EXIT_WITH", "", 1);
	assert_int_equal(exit_with_open(&fd, &pid, &st), ST_OK);
	assert_int_equal(fd, -1);

	const char *bad[] = {"abc", "0", "-3", "12x", " 5", "99999999999", "2147483648"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		setenv("PODEMU_EXIT_WITH", bad[i], 1);
		assert_int_equal(exit_with_open(&fd, &pid, &st), ST_INVALID_ARGUMENT);
		assert_non_null(strstr(st.message, "not a process id"));
		assert_int_equal(fd, -1);
	}

	pid_t child = fork();
	assert_true(child >= 0);
	if (child == 0) {
		pause();
		_exit(0);
	}
	char text[32];
	snprintf(text, sizeof(text), "%d", (int)child);
	setenv("PODEMU_EXIT_WITH", text, 1);
	assert_int_equal(exit_with_open(&fd, &pid, &st), ST_OK);
	assert_true(fd >= 0);
	assert_int_equal(pid, child);
	assert_false(readable(fd, 50)); /* alive */
	kill(child, SIGKILL);
	assert_true(readable(fd, 5000)); /* gone, before anyone reaped it */
	close(fd);
	assert_int_equal(waitpid(child, NULL, 0), child);
	assert_int_equal(exit_with_open(&fd, &pid, &st), ST_NOT_FOUND);
	assert_non_null(strstr(st.message, "no such process"));
	assert_int_equal(fd, -1);
	unsetenv("PODEMU_EXIT_WITH");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_human_bytes_like_xla),
	    cmocka_unit_test(test_status_names),
	    cmocka_unit_test(test_presets),
	    cmocka_unit_test(test_parse_size),
	    cmocka_unit_test(test_parse_int),
	    cmocka_unit_test(test_shapes),
	    cmocka_unit_test(test_arena_packs_small_allocations),
	    cmocka_unit_test(test_arena_reset_reuses_its_blocks),
	    cmocka_unit_test(test_iota_replica_groups),
	    cmocka_unit_test(test_replica_groups_longer_than_the_world),
	    cmocka_unit_test(test_cpu_lists),
	    cmocka_unit_test(test_cpus_allowed),
	    cmocka_unit_test(test_exit_with),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
