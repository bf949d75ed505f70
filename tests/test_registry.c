/* The coordinator's registry: where agents land when they register, again or anew. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

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
	return registry_register(r, requested, control, "tcp://127.0.0.1:2", "host", 42, epoch,
	                         index, incarnation, &st);
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

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_a_lost_reply_does_not_take_a_second_place, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(test_a_new_process_takes_over_its_host, setup,
	                                    teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
