/*
 * The receive slots a program names must lie inside its reservation: an agent refuses any
 * other placement with INVALID_ARGUMENT before it allocates anything.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "step.h"

static int check(int64_t temp, int64_t offset, int32_t slots, int64_t bytes, struct status *st)
{
	Podemu__Program p = PODEMU__PROGRAM__INIT;
	p.temp_bytes = temp;
	p.receive_offset = offset;
	p.receive_slots = slots;
	p.receive_slot_bytes = bytes;
	status_clear(st);
	return receive_slots_check(&p, st);
}

static void test_slots_inside_the_reservation(void **state)
{
	(void)state;
	struct status st;
	assert_int_equal(check(0, 0, 0, 0, &st), ST_OK); /* none */
	assert_int_equal(check(1 << 20, 0, 0, 0, &st), ST_OK);
	assert_int_equal(check(5 << 20, 1 << 20, 4, 1 << 20, &st), ST_OK); /* exactly fills it */
	assert_int_equal(check(5 << 20, 1 << 20, 2, 2 << 20, &st), ST_OK);
}

static void test_slots_outside_are_refused(void **state)
{
	(void)state;
	struct status st;
	/* One slot past the top. */
	assert_int_equal(check(5 << 20, 1 << 20, 5, 1 << 20, &st), ST_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "5 receive slots of 1048576 bytes at offset 1048576 do "
	                                   "not lie in its reservation of 5242880 bytes"));
	assert_int_equal(check(5 << 20, -1, 1, 1 << 20, &st), ST_INVALID_ARGUMENT);
	assert_int_equal(check(5 << 20, 6 << 20, 1, 256, &st), ST_INVALID_ARGUMENT);
	assert_int_equal(check(5 << 20, 0, 1, 0, &st), ST_INVALID_ARGUMENT);
	assert_int_equal(check(5 << 20, 0, -3, 256, &st), ST_INVALID_ARGUMENT);
	/* Larger than any chunk, and counts whose product would wrap. */
	assert_int_equal(check(INT64_MAX, 0, 1, (int64_t)128 << 20, &st), ST_INVALID_ARGUMENT);
	assert_int_equal(check(INT64_MAX, 0, INT32_MAX, 64 << 20, &st), ST_INVALID_ARGUMENT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_slots_inside_the_reservation),
	    cmocka_unit_test(test_slots_outside_are_refused),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
