/* The coordinator's registry: where agents land when they register, again or anew. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "registry.h"

static int setup(void **state)
{
	static struct registry r;
	struct topology topo;
	struct status st;
	if (topology_custom(&topo, 2, 2, 1 << 30, &st) != ST_OK ||
	    registry_init(&r, &topo, 1000, &st) != ST_OK)
		return -1;
	*state = &r;
	return 0;
}

static int teardown(void **state)
{
	registry_destroy(*state);
	return 0;
}

static int join(struct registry *r, int requested, const char *control, uint64_t epoch, int *index,
                uint64_t *incarnation)
{
	struct status st;
	const struct host_claim c = {requested, control, "tcp://127.0.0.1:2", "host", 42, epoch, 0};
	return registry_register(r, &c, index, incarnation, &st);
}

static void test_a_lost_reply_does_not_take_a_second_place(void **state)
{
	struct registry *r = *state;
	int first, again;
	uint64_t inc, inc_again;
	assert_int_equal(join(r, -1, "tcp://127.0.0.1:1", 7, &first, &inc), ST_OK);
	struct rpc_client *client = r->hosts[first].client;
	/* The same process asks again without an index: the same host, connection, lease. */
	assert_int_equal(join(r, -1, "tcp://127.0.0.1:1", 7, &again, &inc_again), ST_OK);
	assert_int_equal(again, first);
	assert_int_equal(inc_again, inc);
	assert_ptr_equal(r->hosts[first].client, client);
	assert_int_equal(r->num_retired, 0);
	assert_false(r->hosts[1 - first].registered);
}

static void test_a_new_process_takes_over_its_host(void **state)
{
	struct registry *r = *state;
	int index, index2;
	uint64_t inc, inc2;
	assert_int_equal(join(r, 1, "tcp://127.0.0.1:1", 7, &index, &inc), ST_OK);
	struct rpc_client *client = r->hosts[1].client;
	assert_int_equal(join(r, 1, "tcp://127.0.0.1:3", 8, &index2, &inc2), ST_OK);
	assert_int_equal(index2, 1);
	assert_int_not_equal(inc2, inc);
	assert_ptr_not_equal(r->hosts[1].client, client); /* steps on the old one see a restart */
	assert_int_equal(r->num_retired, 1);
	/* The old incarnation's heartbeat is not taken for the new one's. */
	assert_false(registry_heartbeat(r, 1, inc));
	assert_true(registry_heartbeat(r, 1, inc2));
}

static struct shape f32_shape(void)
{
	struct shape sh;
	struct status st;
	int64_t n = 16;
	shape_make(&sh, DT_F32, &n, 1, &st);
	return sh;
}

/*
 * The handle index against a plain list: random adds and removes (which shift probe runs
 * back and move the last entry into the hole) leave every handle findable and no other.
 */
static void test_handle_index_agrees_with_a_list(void **state)
{
	struct registry *r = *state;
	struct status st;
	uint64_t session;
	assert_int_equal(session_open(r, 1, "h", "t", 0, &session, &st), ST_OK);
	struct shape sh = f32_shape();
	enum { N = 20000 };
	static uint64_t live[N];
	int n_live = 0;
	unsigned seed = 12345;
	for (int step = 0; step < 4 * N; step++) {
		seed = seed * 1103515245u + 12345u;
		bool add = n_live == 0 || (n_live < N && (seed >> 16) % 3 != 0);
		if (add) {
			/* Handles close together and far apart, as epochs and counters make them.
			 */
			uint64_t h = ((uint64_t)(seed % 7) << 40) | (seed >> 8);
			if (registry_find_handle(r, h) != NULL)
				continue;
			assert_int_equal(registry_add_handle(r, h, session, 64, &sh, NULL, &st),
			                 ST_OK);
			live[n_live++] = h;
		} else {
			int k = (int)((seed >> 4) % (unsigned)n_live);
			registry_remove_handle(r, live[k]);
			assert_null(registry_find_handle(r, live[k]));
			live[k] = live[--n_live];
		}
	}
	assert_int_equal(r->num_handles, n_live);
	for (int k = 0; k < n_live; k++) {
		struct handle_entry *e = registry_find_handle(r, live[k]);
		assert_non_null(e);
		assert_true(e->handle == live[k]);
	}
}

/* A session owns its buffers: another cannot use them, and its end takes them all. */
static void test_sessions_own_their_buffers(void **state)
{
	struct registry *r = *state;
	struct status st;
	uint64_t a, b;
	assert_int_equal(session_open(r, 1, "h", "a", 0, &a, &st), ST_OK);
	assert_int_equal(session_open(r, 2, "h", "b", 500, &b, &st), ST_OK);
	struct shape sh = f32_shape();
	uint64_t base = r->epoch << HANDLE_EPOCH_SHIFT;
	assert_int_equal(registry_add_handle(r, base | 1, a, 100, &sh, NULL, &st), ST_OK);
	assert_int_equal(registry_add_handle(r, base | 2, a, 200, &sh, NULL, &st), ST_OK);
	assert_int_equal(registry_add_handle(r, base | 3, b, 400, &sh, NULL, &st), ST_OK);
	assert_non_null(registry_use_handle(r, base | 1, a, &st));
	assert_null(registry_use_handle(r, base | 1, b, &st));
	assert_int_equal(st.code, ST_NOT_FOUND);
	int buffers;
	int64_t bytes;
	session_usage(r, a, &buffers, &bytes);
	assert_int_equal(buffers, 2);
	assert_int_equal(bytes, 300);
	int all_buffers[8];
	int64_t all_bytes[8];
	assert_int_equal(r->num_sessions, 2);
	session_usage_all(r, all_buffers, all_bytes);
	assert_int_equal(all_buffers[0], 2);
	assert_int_equal(all_bytes[0], 300);
	assert_int_equal(all_buffers[1], 1);
	assert_int_equal(all_bytes[1], 400);

	/* No request for 0 ms: b's lease (500 ms) runs out first, a's (the default) later. */
	int64_t now = registry_now_ms();
	uint64_t ids[4];
	assert_int_equal(session_expire(r, now + 400, ids, 4), 0);
	assert_int_equal(session_expire(r, now + 600, ids, 4), 1);
	assert_true(ids[0] == b);
	assert_false(session_is_open(r, b));
	/* An ending session takes no new buffer and serves no request. */
	assert_int_equal(registry_add_handle(r, base | 4, b, 1, &sh, NULL, &st), ST_CANCELLED);
	assert_int_equal(session_use(r, b, &st), ST_NOT_FOUND);
	assert_non_null(strstr(st.message, "lease of 500 ms ran out"));
	uint64_t taken[8];
	assert_int_equal(session_take_handles(r, b, taken), 1);
	assert_true(taken[0] == (base | 3));
	assert_null(registry_find_handle(r, base | 3));
	assert_non_null(registry_find_handle(r, base | 1));

	assert_int_equal(session_use(r, 0, &st), ST_INVALID_ARGUMENT);
	/* A session of another coordinator process is named as such. */
	assert_int_equal(session_use(r, ((r->epoch + 1) << HANDLE_EPOCH_SHIFT) | 1, &st),
	                 ST_NOT_FOUND);
	assert_non_null(strstr(st.message, "earlier coordinator process"));
	assert_int_equal(session_begin_end(r, a, "the client closed it", &st), ST_OK);
	assert_int_equal(session_take_handles(r, a, taken), 2);
	assert_int_equal(r->num_handles, 0);
}

/* A lost host is named with every host its agent process serves, and their cores. */
static void test_a_process_is_named_with_all_its_hosts(void **state)
{
	struct registry r;
	struct topology topo;
	struct status st;
	assert_int_equal(topology_custom(&topo, 4, 2, 1 << 30, &st), ST_OK);
	assert_int_equal(registry_init(&r, &topo, 1000, &st), ST_OK);
	const uint64_t process_of[4] = {77, 77, 99, 77};
	for (int h = 0; h < 4; h++) {
		char control[64];
		snprintf(control, sizeof(control), "tcp://127.0.0.1:%d", 10 + h);
		const struct host_claim c = {h,  control,  "tcp://127.0.0.1:2", "host",
		                             42, 1000 + h, process_of[h]};
		int index;
		uint64_t incarnation;
		assert_int_equal(registry_register(&r, &c, &index, &incarnation, &st), ST_OK);
	}
	bool same[4];
	char who[256];
	assert_int_equal(registry_name_process_locked(&r, 1, same, who, sizeof(who)), 3);
	assert_string_equal(who, "hosts 0..1,3 (cores 0..3,6..7; one agent process, pid 42)");
	assert_true(same[0] && same[1] && !same[2] && same[3]);
	assert_int_equal(registry_name_process_locked(&r, 2, same, who, sizeof(who)), 1);
	assert_string_equal(who, "host 2 (cores 4..5)");
	assert_true(!same[0] && !same[1] && same[2] && !same[3]);
	registry_destroy(&r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_a_lost_reply_does_not_take_a_second_place, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(test_a_new_process_takes_over_its_host, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(test_handle_index_agrees_with_a_list, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_sessions_own_their_buffers, setup, teardown),
	    cmocka_unit_test(test_a_process_is_named_with_all_its_hosts),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
