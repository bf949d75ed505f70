/*
 * The RPC layer over real nng streams: success, remote errors, bad envelopes and frames,
 * deadlines, concurrent calls, peers that restart.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>

#include <cmocka.h>

#include "podemu.pb-c.h"
#include "raw_frames.h"
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
	                     handlers, NULL, "pod-secret", f.url, &st) != ST_OK)
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

/* A plain TCP connection to the fixture's server. */
static int raw_connect(struct fixture *f)
{
	return raw_tcp_connect(f->url, 5);
}

/* Reads one reply frame from fd and decodes its envelope: its code and message. */
static int raw_reply(int fd, char *message, size_t mlen)
{
	static uint8_t buf[65536];
	int64_t len = raw_frame_recv(fd, buf, sizeof(buf));
	assert_true(len >= 0);
	Podemu__RpcResponse *resp = podemu__rpc_response__unpack(NULL, (size_t)len, buf);
	assert_non_null(resp);
	int code = resp->code;
	snprintf(message, mlen, "%s", resp->message);
	podemu__rpc_response__free_unpacked(resp, NULL);
	return code;
}

/* Sends bytes to the server as one frame and decodes the envelope that comes back. */
static int raw_call(struct fixture *f, const void *bytes, size_t len, char *message, size_t mlen)
{
	int fd = raw_connect(f);
	assert_true(raw_frame_send(fd, bytes, len));
	int code = raw_reply(fd, message, mlen);
	close(fd);
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
	                                  &podemu__coordinator__descriptor, handlers, NULL, NULL,
	                                  url, &st),
	                 ST_OK);
	rpc_server_stop(tmp);
	struct rpc_client *c;
	assert_int_equal(rpc_client_open(&c, url, false, &st), ST_UNAVAILABLE);
	assert_non_null(strstr(st.message, "cannot connect"));
}

/* Frames that break the framing end their connection; the server serves the next one. */
static void test_bad_frames_close_the_connection(void **state)
{
	struct fixture *f = *state;
	uint8_t buf[64];
	/* Not a frame's magic. */
	int fd = raw_connect(f);
	memcpy(buf, "GET / HTTP/1.0\r\n\r\n", 18);
	assert_int_equal(send(fd, buf, 18, MSG_NOSIGNAL), 18);
	assert_true(recv(fd, buf, sizeof(buf), 0) <= 0);
	close(fd);
	/* A frame announcing more than the limit: refused after its header. */
	fd = raw_connect(f);
	rpc_frame_encode(buf, RPC_MAX_MESSAGE_BYTES + 1u);
	assert_int_equal(send(fd, buf, RPC_FRAME_HEADER_BYTES, MSG_NOSIGNAL),
	                 RPC_FRAME_HEADER_BYTES);
	assert_true(recv(fd, buf, sizeof(buf), 0) <= 0);
	close(fd);
	/* Two frames in one write are answered in order on the same connection. */
	fd = raw_connect(f);
	const char garbage[] = "\xff\xff\xff";
	uint8_t two[2 * (RPC_FRAME_HEADER_BYTES + sizeof(garbage))];
	for (int k = 0; k < 2; k++) {
		uint8_t *p = two + k * (RPC_FRAME_HEADER_BYTES + sizeof(garbage));
		rpc_frame_encode(p, sizeof(garbage));
		memcpy(p + RPC_FRAME_HEADER_BYTES, garbage, sizeof(garbage));
	}
	assert_int_equal(send(fd, two, sizeof(two), MSG_NOSIGNAL), (ssize_t)sizeof(two));
	char msg[512];
	assert_int_equal(raw_reply(fd, msg, sizeof(msg)), ST_INVALID_ARGUMENT);
	assert_int_equal(raw_reply(fd, msg, sizeof(msg)), ST_INVALID_ARGUMENT);
	close(fd);

	bool known;
	struct status st;
	assert_int_equal(heartbeat(f, 2, 42, 5000, &known, &st), ST_OK);
}

struct slow_call {
	struct fixture *f;
	int rv;
	int timeout_ms;
};

static void *slow_call_main(void *arg)
{
	struct slow_call *sc = arg;
	bool known;
	struct status st;
	sc->rv = heartbeat(sc->f, 99, 42, sc->timeout_ms, &known, &st);
	return NULL;
}

/* A slow call holds only its own connection: calls beside it are answered meanwhile. */
static void test_concurrent_calls(void **state)
{
	struct fixture *f = *state;
	struct slow_call sc = {f, -1, 5000};
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, slow_call_main, &sc), 0);
	usleep(100 * 1000);
	bool known;
	struct status st;
	for (int i = 0; i < 10; i++)
		assert_int_equal(heartbeat(f, 1, 42, 300, &known, &st), ST_OK);
	pthread_join(t, NULL);
	assert_int_equal(sc.rv, ST_OK);
}

/* A heartbeat for host (99: answered after 600 ms) started on c. */
static struct rpc_async *start_heartbeat(struct rpc_client *c, int host, struct arena *a,
                                         struct rpc_cancel *cancel, struct status *st)
{
	Podemu__HostLease lease = PODEMU__HOST_LEASE__INIT;
	lease.host_index = host;
	lease.incarnation = 42;
	Podemu__HostLease *leases[] = {&lease};
	Podemu__HeartbeatRequest req = PODEMU__HEARTBEAT_REQUEST__INIT;
	req.hosts = leases;
	req.n_hosts = 1;
	return rpc_start(c, &podemu__coordinator__descriptor, CM_HEARTBEAT, &req, a, 5000, cancel,
	                 st);
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* rpc_poll waits no longer than it is told; a reply in already is taken without waiting. */
static void test_poll_and_cancel(void **state)
{
	struct fixture *f = *state;
	struct arena *a = arena_new();
	struct status st;
	void *reply;
	struct rpc_async *x = start_heartbeat(f->client, 99, a, NULL, &st);
	assert_non_null(x);
	assert_false(rpc_poll(x, 0));
	double t0 = now_ms();
	assert_false(rpc_poll(x, 100));
	double waited = now_ms() - t0;
	assert_true(waited >= 90 && waited < 500);
	assert_true(rpc_poll(x, -1));
	assert_int_equal(rpc_finish(x, a, &reply, &st), ST_OK);
	assert_true(((Podemu__HeartbeatReply *)reply)->known);

	x = start_heartbeat(f->client, 1, a, NULL, &st);
	assert_non_null(x);
	usleep(100 * 1000);
	assert_true(rpc_poll(x, 0));
	assert_int_equal(rpc_finish(x, a, &reply, &st), ST_OK);

	/* A cancel ends a call between two polls, with its reason. */
	struct rpc_cancel cancel;
	rpc_cancel_init(&cancel);
	x = start_heartbeat(f->client, 99, a, &cancel, &st);
	assert_non_null(x);
	assert_false(rpc_poll(x, 50));
	rpc_cancel_fire(&cancel, "host 99 is lost");
	assert_true(rpc_poll(x, 0));
	assert_int_equal(rpc_finish(x, a, &reply, &st), ST_UNAVAILABLE);
	assert_string_equal(st.message, "host 99 is lost");
	/* A cancel that fired before the call started: the call does not start. */
	assert_null(start_heartbeat(f->client, 1, a, &cancel, &st));
	assert_int_equal(st.code, ST_UNAVAILABLE);
	rpc_cancel_destroy(&cancel);
	/* The cancelled call took its connection down with it; the next call is answered. */
	bool known;
	assert_int_equal(heartbeat(f, 1, 42, 5000, &known, &st), ST_OK);
	arena_free(a);
}

struct late_server {
	char url[256];
	struct rpc_server *server;
};

static void *late_server_main(void *arg)
{
	struct late_server *ls = arg;
	usleep(300 * 1000);
	struct status st;
	assert_int_equal(rpc_server_start(&ls->server, ls->url, &podemu__coordinator__descriptor,
	                                  handlers, NULL, "pod-secret", NULL, &st),
	                 ST_OK);
	return NULL;
}

/* A waiting client (with the pod's token) of a server that started on a free port and stopped. */
static struct rpc_client *client_of_stopped_server(struct late_server *ls)
{
	struct status st;
	struct rpc_client *c;
	assert_int_equal(rpc_server_start(&ls->server, "tcp://127.0.0.1:0",
	                                  &podemu__coordinator__descriptor, handlers, NULL, NULL,
	                                  ls->url, &st),
	                 ST_OK);
	rpc_server_stop(ls->server);
	assert_int_equal(rpc_client_open(&c, ls->url, true, &st), ST_OK);
	rpc_client_set_token(c, "pod-secret");
	return c;
}

/*
 * A waiting client's call reaches a server that starts after it; a client whose server
 * restarts reaches the new one with its next call.
 */
static void test_server_late_and_restarted(void **state)
{
	struct fixture *f = *state;
	struct status st;
	struct late_server ls;
	struct fixture g = *f;
	g.client = client_of_stopped_server(&ls);
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, late_server_main, &ls), 0);
	/* Its dials go on while the caller does not wait. */
	struct arena *a = arena_new();
	struct rpc_async *x = start_heartbeat(g.client, 1, a, NULL, &st);
	assert_non_null(x);
	assert_false(rpc_poll(x, 0));
	void *reply;
	assert_int_equal(rpc_wait(x, a, &reply, &st), ST_OK);
	assert_true(((Podemu__HeartbeatReply *)reply)->known);
	arena_free(a);
	pthread_join(t, NULL);
	bool known = false;
	/* The server restarts; the client's idle connection to the old one is dead. */
	rpc_server_stop(ls.server);
	assert_int_equal(rpc_server_start(&ls.server, ls.url, &podemu__coordinator__descriptor,
	                                  handlers, NULL, "pod-secret", NULL, &st),
	                 ST_OK);
	assert_int_equal(heartbeat(&g, 1, 42, 5000, &known, &st), ST_OK);
	rpc_client_close(g.client);
	rpc_server_stop(ls.server);
	/* Nothing listens now: a waiting client's call ends at its deadline. */
	assert_int_equal(rpc_client_open(&g.client, ls.url, true, &st), ST_OK);
	assert_int_equal(heartbeat(&g, 1, 42, 200, &known, &st), ST_DEADLINE_EXCEEDED);
	rpc_client_close(g.client);
}

/* The port of url (tcp://127.0.0.1:PORT). */
static int url_port(const char *url)
{
	return atoi(strrchr(url, ':') + 1);
}

/*
 * Many calls end at their deadline while their dial is still under way (a listener on the
 * port whose queue is full drops the SYNs), as an agent's heartbeats do while its coordinator
 * restarts; then the server comes up on that port and the next call is answered.
 */
static void test_dials_cut_by_deadlines_then_server_up(void **state)
{
	struct fixture *f = *state;
	struct status st;
	struct late_server ls;
	struct fixture g = *f;
	g.client = client_of_stopped_server(&ls);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(url_port(ls.url))};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	int one = 1, full = socket(AF_INET, SOCK_STREAM, 0),
	    queued = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(full >= 0 && queued >= 0);
	setsockopt(full, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	assert_int_equal(bind(full, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(full, 0), 0);
	assert_int_equal(connect(queued, (struct sockaddr *)&sa, sizeof(sa)), 0);
	bool known = false;
	for (int i = 0; i < 40; i++) {
		int rv = heartbeat(&g, 1, 42, 5 + i % 7, &known, &st);
		assert_true(rv == ST_DEADLINE_EXCEEDED || rv == ST_UNAVAILABLE);
	}
	close(queued);
	close(full);
	assert_int_equal(rpc_server_start(&ls.server, ls.url, &podemu__coordinator__descriptor,
	                                  handlers, NULL, "pod-secret", NULL, &st),
	                 ST_OK);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(heartbeat(&g, 1, 42, 5000, &known, &st), ST_OK);
		assert_true(known);
	}
	rpc_client_close(g.client);
	rpc_server_stop(ls.server);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_call_and_remote_error),
	    cmocka_unit_test(test_unimplemented_method),
	    cmocka_unit_test(test_malformed_frames_get_errors_and_server_keeps_serving),
	    cmocka_unit_test(test_deadline_and_unreachable),
	    cmocka_unit_test(test_bad_frames_close_the_connection),
	    cmocka_unit_test(test_concurrent_calls),
	    cmocka_unit_test(test_poll_and_cancel),
	    cmocka_unit_test(test_server_late_and_restarted),
	    cmocka_unit_test(test_dials_cut_by_deadlines_then_server_up),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
