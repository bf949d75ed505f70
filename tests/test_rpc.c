/* The RPC layer over real nng sockets: success, remote errors, bad frames, deadlines. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "podemu.pb-c.h"
#include "rpc.h"
#include "services.h"

static int h_heartbeat(void *state, struct arena *a, const void *request, void *reply,
                       struct status *st)
{
	const Podemu__HeartbeatRequest *req = request;
	Podemu__HeartbeatReply *rep = reply;
	if (req->n_hosts != 1)
		return status_set(st, ST_INVALID_ARGUMENT, "%zu hosts, not one", req->n_hosts);
	const Podemu__HostLease *l = req->hosts[0];
	if (l->host_index < 0)
		return status_set(st, ST_INVALID_ARGUMENT, "host index %d is negative",
		                  l->host_index);
	if (l->host_index == 99)
		usleep(600 * 1000); /* slower than the caller's deadline */
	rep->known = l->incarnation == 42;
	return ST_OK;
}

static const rpc_handler handlers[CM_COUNT] = {[CM_HEARTBEAT] = h_heartbeat};

struct fixture {
	struct rpc_server *server;
	struct rpc_client *client;
	char url[256];
};

static int setup(void **state)
{
	static struct fixture f;
	struct status st;
	if (rpc_server_start(&f.server, "tcp://127.0.0.1:0", &podemu__coordinator__descriptor,
	                     handlers, NULL, 4, "pod-secret", f.url, &st) != ST_OK)
		return -1;
	if (rpc_client_open(&f.client, f.url, false, &st) != ST_OK)
		return -1;
	rpc_client_set_token(f.client, "pod-secret");
	*state = &f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	rpc_client_close(f->client);
	rpc_server_stop(f->server);
	return 0;
}

static int heartbeat(struct fixture *f, int host, uint64_t incarnation, int timeout_ms, bool *known,
                     struct status *st)
{
	struct arena *a = arena_new();
	Podemu__HostLease lease = PODEMU__HOST_LEASE__INIT;
	lease.host_index = host;
	lease.incarnation = incarnation;
	Podemu__HostLease *leases[] = {&lease};
	Podemu__HeartbeatRequest req = PODEMU__HEARTBEAT_REQUEST__INIT;
	req.hosts = leases;
	req.n_hosts = 1;
	void *reply;
	int rv = rpc_call(f->client, &podemu__coordinator__descriptor, CM_HEARTBEAT, &req, a,
	                  &reply, timeout_ms, st);
	if (rv == ST_OK)
		*known = ((Podemu__HeartbeatReply *)reply)->known;
	arena_free(a);
	return rv;
}

static void test_call_and_remote_error(void **state)
{
	struct fixture *f = *state;
	struct status st;
	bool known = false;
	assert_int_equal(heartbeat(f, 1, 42, 5000, &known, &st), ST_OK);
	assert_true(known);
	assert_int_equal(heartbeat(f, 1, 7, 5000, &known, &st), ST_OK);
	assert_false(known);
	assert_int_equal(heartbeat(f, -3, 42, 5000, &known, &st), ST_INVALID_ARGUMENT);
	assert_string_equal(st.message, "host index -3 is negative");
}

static void test_unimplemented_method(void **state)
{
	struct fixture *f = *state;
	struct arena *a = arena_new();
	Podemu__StatusRequest req = PODEMU__STATUS_REQUEST__INIT;
	void *reply;
	struct status st;
	assert_int_equal(rpc_call(f->client, &podemu__coordinator__descriptor, CM_GET_STATUS, &req,
	                          a, &reply, 5000, &st),
	                 ST_UNIMPLEMENTED);
	arena_free(a);
}

/* Sends raw bytes to the server and decodes the envelope that comes back. */
static int raw_call(struct fixture *f, const void *bytes, size_t len, char *message, size_t mlen)
{
	nng_socket s;
	nng_req0_open(&s);
	nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 5000);
	assert_int_equal(nng_dial(s, f->url, NULL, 0), 0);
	assert_int_equal(nng_send(s, (void *)bytes, len, 0), 0);
	char *buf;
	size_t got;
	assert_int_equal(nng_recv(s, &buf, &got, NNG_FLAG_ALLOC), 0);
	Podemu__RpcResponse *resp = podemu__rpc_response__unpack(NULL, got, (uint8_t *)buf);
	assert_non_null(resp);
	int code = resp->code;
	snprintf(message, mlen, "%s", resp->message);
	podemu__rpc_response__free_unpacked(resp, NULL);
	nng_free(buf, got);
	nng_close(s);
	return code;
}

static void test_malformed_frames_get_errors_and_server_keeps_serving(void **state)
{
	struct fixture *f = *state;
	char msg[512];
	const char garbage[] = "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff garbage";
	assert_int_equal(raw_call(f, garbage, sizeof(garbage), msg, sizeof(msg)),
	                 ST_INVALID_ARGUMENT);
	assert_non_null(strstr(msg, "malformed RPC envelope"));

	/* A valid envelope around a truncated payload. */
	Podemu__RpcRequest env = PODEMU__RPC_REQUEST__INIT;
	uint8_t payload[] = {0x08}; /* field 1 varint, value missing */
	env.method = CM_HEARTBEAT;
	env.token.data = (uint8_t *)"pod-secret";
	env.token.len = 10;
	env.payload.data = payload;
	env.payload.len = sizeof(payload);
	uint8_t frame[64];
	size_t n = podemu__rpc_request__pack(&env, frame);
	assert_int_equal(raw_call(f, frame, n, msg, sizeof(msg)), ST_INVALID_ARGUMENT);
	assert_non_null(strstr(msg, "malformed"));

	env.method = 1000;
	n = podemu__rpc_request__pack(&env, frame);
	assert_int_equal(raw_call(f, frame, n, msg, sizeof(msg)), ST_UNIMPLEMENTED);

	bool known;
	struct status st;
	assert_int_equal(heartbeat(f, 2, 42, 5000, &known, &st), ST_OK);
	assert_true(known);
}

static void test_deadline_and_unreachable(void **state)
{
	struct fixture *f = *state;
	struct status st;
	bool known;
	assert_int_equal(heartbeat(f, 99, 42, 200, &known, &st), ST_DEADLINE_EXCEEDED);
	assert_non_null(strstr(st.message, "no reply within 200 ms"));

	/* Nothing listens on this port (it was just bound and released). */
	struct rpc_server *tmp;
	char url[256];
	assert_int_equal(rpc_server_start(&tmp, "tcp://127.0.0.1:0",
	                                  &podemu__coordinator__descriptor, handlers, NULL, 1, NULL,
	                                  url, &st),
	                 ST_OK);
	rpc_server_stop(tmp);
	struct rpc_client *c;
	assert_int_equal(rpc_client_open(&c, url, false, &st), ST_UNAVAILABLE);
	assert_non_null(strstr(st.message, "cannot connect"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_call_and_remote_error),
	    cmocka_unit_test(test_unimplemented_method),
	    cmocka_unit_test(test_malformed_frames_get_errors_and_server_keeps_serving),
	    cmocka_unit_test(test_deadline_and_unreachable),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
