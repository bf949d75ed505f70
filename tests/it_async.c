/*
 * Steps sent without waiting (pe_mark_step_async) on a real 2x2 pod: a loop of them computes
 * what the same loop of pe_mark_step does; a failed one is reported by the next call that waits
 * and leaves the pod as it was; the coordinator checks the handles a client names and runs a
 * session's steps in their order, whichever reaches it first.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "pod_fixture.h"
#include "raw_rpc.h"

#define WORLD 4

static int setup(void **state)
{
	pe_client *c = pod_start("--hosts 2 --cores-per-host 2 --hbm 64M --backing host");
	if (c == NULL)
		return -1;
	*state = c;
	return 0;
}

static int teardown(void **state)
{
	pe_disconnect(*state);
	pod_stop();
	return 0;
}

static void memory_all(pe_client *c, int64_t *used)
{
	assert_int_equal(pod_bytes_used(c, used, WORLD), PE_OK);
}

/* w = all-reduce(w) / world + 1, steps times (each step reads the one before), then read. */
static void loop(pe_client *c, int steps, bool async, float *out)
{
	int64_t n = 1024;
	pe_tensor *w = pe_full(c, PE_F32, &n, 1, 1.0);
	assert_int_equal(pe_mark_step(c), PE_OK);
	for (int i = 0; i < steps; i++) {
		pe_tensor *r = pe_all_reduce(w, PE_REDUCE_SUM, 1.0 / WORLD, NULL);
		pe_tensor *one = pe_full(c, PE_F32, &n, 1, 1.0);
		pe_tensor *next = pe_add(r, one);
		pe_release(r);
		pe_release(one);
		pe_release(w);
		w = next;
		assert_int_equal(async ? pe_mark_step_async(c) : pe_mark_step(c), PE_OK);
	}
	assert_int_equal(pe_wait_device_ops(c), PE_OK);
	for (int core = 0; core < WORLD; core++)
		assert_int_equal(pe_fetch(w, core, out + core * n, (size_t)n * sizeof(float)),
		                 PE_OK);
	pe_release(w);
}

static void test_async_steps_compute_what_steps_do(void **state)
{
	pe_client *c = *state;
	int64_t before[WORLD], after[WORLD];
	memory_all(c, before);
	static float sync_out[WORLD * 1024], async_out[WORLD * 1024];
	loop(c, 40, false, sync_out);
	loop(c, 40, true, async_out);
	assert_memory_equal(sync_out, async_out, sizeof(sync_out));
	for (int i = 0; i < WORLD * 1024; i++)
		assert_true(async_out[i] == 41.0f);
	/* The last step that finished describes its one collective. */
	int64_t micros[2];
	const char *algorithms[2];
	assert_int_equal(pe_last_step_collectives(c, micros, algorithms, 2), 1);
	assert_true(algorithms[0][0] != '\0');
	/* Every buffer the async steps made and released is gone again. */
	memory_all(c, after);
	assert_memory_equal(before, after, sizeof(before));
}

static void test_a_failed_async_step_is_reported_and_leaves_the_pod_as_it_was(void **state)
{
	pe_client *c = *state;
	int64_t before[WORLD], after[WORLD];
	memory_all(c, before);
	/* 128 MiB per core on 64 MiB cores: the step fails on the pod, after it was sent. */
	int64_t big = 32 << 20;
	pe_tensor *x = pe_full(c, PE_F32, &big, 1, 2.0);
	assert_int_equal(pe_mark_step_async(c), PE_OK);
	/* Read at once, before anything waited: the step's failure decides. */
	float *dst = malloc((size_t)big * sizeof(float)); /* never touched */
	assert_non_null(dst);
	assert_int_equal(pe_fetch(x, 0, dst, (size_t)big * sizeof(float)), PE_FAILED_PRECONDITION);
	assert_non_null(strstr(pe_last_error(c), "belongs to a step that failed"));
	assert_int_equal(pe_wait_device_ops(c), PE_RESOURCE_EXHAUSTED);
	assert_non_null(strstr(pe_last_error(c), "(sent by mark_step_async)"));
	/* Again, with a step over its output sent behind it. */
	pe_release(x);
	x = pe_full(c, PE_F32, &big, 1, 2.0);
	assert_int_equal(pe_mark_step_async(c), PE_OK);
	pe_tensor *y = pe_negate(x); /* reads the failed step's output */
	assert_int_equal(pe_mark_step_async(c), PE_RESOURCE_EXHAUSTED);
	assert_non_null(strstr(pe_last_error(c), "(sent by mark_step_async)"));
	assert_non_null(strstr(pe_last_error(c), "Ran out of memory in memory space hbm"));
	/* The step that read it failed as well, and says so once waited for. */
	assert_int_not_equal(pe_wait_device_ops(c), PE_OK);
	assert_int_equal(pe_wait_device_ops(c), PE_OK); /* reported once */
	float v;
	int64_t one = 1;
	assert_int_equal(pe_fetch(x, 0, dst, (size_t)big * sizeof(float)), PE_FAILED_PRECONDITION);
	free(dst);
	assert_non_null(strstr(pe_last_error(c), "belongs to a step that failed"));
	pe_release(x);
	pe_release(y);
	/* The pod keeps serving this session. */
	pe_tensor *z = pe_full(c, PE_F32, &one, 1, 3.0);
	assert_int_equal(pe_mark_step_async(c), PE_OK);
	assert_int_equal(pe_fetch(z, 3, &v, sizeof(v)), PE_OK);
	assert_true(v == 3.0f);
	pe_release(z);
	memory_all(c, after);
	assert_memory_equal(before, after, sizeof(before));
}

/* ---- The protocol, spoken directly ---- */

static const Podemu__OpenSessionReply *open_session(struct rpc_client *rc, struct arena *a)
{
	const Podemu__OpenSessionReply *r = pod_raw_open_session(rc, a);
	assert_true(r->handle_count > 0);
	return r;
}

/* A one-output step: full(7) when reads is 0, else negate(parameter reads). */
struct raw_step {
	Podemu__Shape shape;
	int64_t dim;
	Podemu__Node a, b;
	Podemu__Node *nodes[2];
	int32_t operand, output;
	Podemu__Graph g;
	Podemu__StepRequest req;
};

static void raw_step_init(struct raw_step *s, uint64_t session, uint64_t reads, uint64_t *named)
{
	memset(s, 0, sizeof(*s));
	podemu__shape__init(&s->shape);
	s->dim = 256;
	s->shape.dtype = PODEMU__DTYPE__DTYPE_F32;
	s->shape.dims = &s->dim;
	s->shape.n_dims = 1;
	podemu__node__init(&s->a);
	podemu__node__init(&s->b);
	podemu__graph__init(&s->g);
	podemu__step_request__init(&s->req);
	s->nodes[0] = &s->a;
	if (reads == 0) {
		s->a.opcode = "constant";
		s->a.shape = &s->shape;
		s->a.value = 7.0;
		s->output = 0;
		s->g.n_nodes = 1;
	} else {
		s->a.opcode = "parameter";
		s->a.handle = reads;
		s->a.shape = &s->shape;
		s->b.opcode = "negate";
		s->b.operands = &s->operand;
		s->b.n_operands = 1;
		s->nodes[1] = &s->b;
		s->output = 1;
		s->g.n_nodes = 2;
	}
	s->g.nodes = s->nodes;
	s->g.outputs = &s->output;
	s->g.n_outputs = 1;
	s->req.graph = &s->g;
	s->req.session = session;
	s->req.output_handles = named;
	s->req.n_output_handles = named != NULL ? 1 : 0;
}

static void test_named_handles_are_checked(void **state)
{
	(void)state;
	struct rpc_client *rc = pod_raw_client();
	struct arena *a = arena_new();
	const Podemu__OpenSessionReply *mine = open_session(rc, a), *other = open_session(rc, a);
	struct status st;
	void *reply;
	struct raw_step s;
	uint64_t named = mine->handle_base - 1; /* below the block */
	raw_step_init(&s, mine->session, 0, &named);
	assert_int_equal(pod_raw_call(rc, CM_EXECUTE_STEP, &s.req, a, &reply, &st),
	                 ST_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "is not one session"));
	named = other->handle_base; /* another session's */
	assert_int_equal(pod_raw_call(rc, CM_EXECUTE_STEP, &s.req, a, &reply, &st),
	                 ST_INVALID_ARGUMENT);
	named = mine->handle_base + mine->handle_count; /* past the block */
	assert_int_equal(pod_raw_call(rc, CM_EXECUTE_STEP, &s.req, a, &reply, &st),
	                 ST_INVALID_ARGUMENT);
	uint64_t two[2] = {mine->handle_base + 5, mine->handle_base + 6};
	s.req.output_handles = two; /* two handles for one output */
	s.req.n_output_handles = 2;
	assert_int_equal(pod_raw_call(rc, CM_EXECUTE_STEP, &s.req, a, &reply, &st),
	                 ST_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "2 output handles named for 1 outputs"));
	named = mine->handle_base + 5;
	raw_step_init(&s, mine->session, 0, &named);
	assert_int_equal(pod_raw_call(rc, CM_EXECUTE_STEP, &s.req, a, &reply, &st), ST_OK);
	assert_int_equal(((Podemu__StepReply *)reply)->output_handles[0], named);
	/* Once named, never again, nor anything below it. */
	assert_int_equal(pod_raw_call(rc, CM_EXECUTE_STEP, &s.req, a, &reply, &st),
	                 ST_INVALID_ARGUMENT);
	named = mine->handle_base + 4;
	assert_int_equal(pod_raw_call(rc, CM_EXECUTE_STEP, &s.req, a, &reply, &st),
	                 ST_INVALID_ARGUMENT);
	/* The buffer it made is the session's, as any other. */
	Podemu__TransferFromDeviceRequest get = PODEMU__TRANSFER_FROM_DEVICE_REQUEST__INIT;
	get.session = mine->session;
	get.handle = mine->handle_base + 5;
	get.ordinal = 2;
	get.length = 256 * sizeof(float);
	assert_int_equal(pod_raw_call(rc, CM_TRANSFER_FROM_DEVICE, &get, a, &reply, &st), ST_OK);
	float v;
	memcpy(&v, ((Podemu__TransferFromDeviceReply *)reply)->data.data, sizeof(v));
	assert_true(v == 7.0f);
	get.session = other->session;
	assert_int_equal(pod_raw_call(rc, CM_TRANSFER_FROM_DEVICE, &get, a, &reply, &st),
	                 ST_NOT_FOUND);
	Podemu__SessionRequest close_req = PODEMU__SESSION_REQUEST__INIT;
	close_req.session = mine->session;
	assert_int_equal(pod_raw_call(rc, CM_CLOSE_SESSION, &close_req, a, &reply, &st), ST_OK);
	close_req.session = other->session;
	assert_int_equal(pod_raw_call(rc, CM_CLOSE_SESSION, &close_req, a, &reply, &st), ST_OK);
	arena_free(a);
	rpc_client_close(rc);
}

static void test_steps_run_in_their_order(void **state)
{
	(void)state;
	struct rpc_client *rc = pod_raw_client();
	struct arena *a = arena_new(), *a2 = arena_new();
	const Podemu__OpenSessionReply *mine = open_session(rc, a);
	struct status st;
	void *reply;
	uint64_t first = mine->handle_base, second = mine->handle_base + 1;
	/* Step 2 reads step 1's output and is sent first: it waits for step 1. */
	struct raw_step s1, s2;
	raw_step_init(&s1, mine->session, 0, &first);
	raw_step_init(&s2, mine->session, first, &second);
	s1.req.sequence = 1;
	s2.req.sequence = 2;
	struct rpc_async *x = rpc_start(rc, &podemu__coordinator__descriptor, CM_EXECUTE_STEP,
	                                &s2.req, a2, 10000, NULL, &st);
	assert_non_null(x);
	/* Long enough for step 2 to be at the coordinator first (it would fail, run first). */
	struct timespec pause = {0, 200 * 1000000};
	nanosleep(&pause, NULL);
	assert_int_equal(pod_raw_call(rc, CM_EXECUTE_STEP, &s1.req, a, &reply, &st), ST_OK);
	assert_int_equal(rpc_wait(x, a2, &reply, &st), ST_OK);
	/* Step 2 computed -7 from step 1's 7. */
	Podemu__TransferFromDeviceRequest get = PODEMU__TRANSFER_FROM_DEVICE_REQUEST__INIT;
	get.session = mine->session;
	get.handle = second;
	get.ordinal = 1;
	get.length = sizeof(float);
	assert_int_equal(pod_raw_call(rc, CM_TRANSFER_FROM_DEVICE, &get, a, &reply, &st), ST_OK);
	float v;
	memcpy(&v, ((Podemu__TransferFromDeviceReply *)reply)->data.data, sizeof(v));
	assert_true(v == -7.0f);
	/* A step of a place already taken is refused. */
	uint64_t third = mine->handle_base + 2;
	raw_step_init(&s1, mine->session, 0, &third);
	s1.req.sequence = 2;
	assert_int_equal(pod_raw_call(rc, CM_EXECUTE_STEP, &s1.req, a, &reply, &st),
	                 ST_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "has been sent before"));
	Podemu__SessionRequest close_req = PODEMU__SESSION_REQUEST__INIT;
	close_req.session = mine->session;
	assert_int_equal(pod_raw_call(rc, CM_CLOSE_SESSION, &close_req, a, &reply, &st), ST_OK);
	arena_free(a);
	arena_free(a2);
	rpc_client_close(rc);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_async_steps_compute_what_steps_do),
	    cmocka_unit_test(test_a_failed_async_step_is_reported_and_leaves_the_pod_as_it_was),
	    cmocka_unit_test(test_named_handles_are_checked),
	    cmocka_unit_test(test_steps_run_in_their_order),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
