/*
 * The client's session on the coordinator: opened by pe_connect, kept alive by a thread that
 * renews it a few times per lease (the calls themselves renew it too), closed by
 * pe_disconnect. A process that exits or is killed stops renewing; the coordinator then ends
 * the session and frees its buffers, as a TPU's buffers die with their process.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client.h"
#include "clock.h"
#include "rpc.h"
#include "services.h"
#include "topology.h"

/* The program's name, as /proc tells it ("" elsewhere). */
static void program_name(char *out, size_t len)
{
	out[0] = '\0';
	FILE *f = fopen("/proc/self/comm", "r");
	if (f == NULL)
		return;
	if (fgets(out, (int)len, f) != NULL)
		out[strcspn(out, "\n")] = '\0';
	fclose(f);
}

static void *keeper_main(void *arg)
{
	pe_client *c = arg;
	pthread_mutex_lock(&c->keeper_lock);
	while (!c->keeper_stop) {
		struct timespec ts = clock_deadline_ms(c->lease_ms / 4);
		pthread_cond_timedwait(&c->keeper_cv, &c->keeper_lock, &ts);
		if (c->keeper_stop)
			break;
		Podemu__SessionRequest req = PODEMU__SESSION_REQUEST__INIT;
		req.session = c->session;
		int lease = c->lease_ms;
		pthread_mutex_unlock(&c->keeper_lock);
		struct arena *a = arena_new();
		struct status st;
		void *reply;
		/* An ended session's calls say why; a new one (pe_wait_ready) is renewed next. */
		if (a != NULL)
			rpc_call(c->rpc, &podemu__coordinator__descriptor, CM_RENEW_SESSION, &req,
			         a, &reply, lease, &st);
		arena_free(a);
		pthread_mutex_lock(&c->keeper_lock);
	}
	pthread_mutex_unlock(&c->keeper_lock);
	return NULL;
}

/* Opens a session on the coordinator: *id, *lease_ms and *epoch set. */
/*
 * Opens a session: its id, lease and coordinator, and the block of handles it may name its
 * steps' outputs with ([*named, *named + *named_count)).
 */
static int open_session(pe_client *c, uint64_t *id, int *lease_ms, uint64_t *epoch, uint64_t *named,
                        uint64_t *named_count, struct status *st)
{
	char host[SESSION_TEXT_MAX] = "", name[SESSION_TEXT_MAX];
	gethostname(host, sizeof(host) - 1);
	program_name(name, sizeof(name));
	Podemu__OpenSessionRequest req = PODEMU__OPEN_SESSION_REQUEST__INIT;
	req.pid = (int32_t)getpid();
	req.host_name = host;
	req.name = name;
	const char *lease = getenv("PODEMU_SESSION_LEASE_MS");
	int lease_asked = 0; /* 0: the pod's lease; the coordinator checks the range */
	if (lease != NULL && lease[0] != '\0' &&
	    parse_int(&lease_asked, "PODEMU_SESSION_LEASE_MS", lease, 0, INT_MAX, st) != ST_OK)
		return st->code;
	req.lease_ms = lease_asked;
	struct arena *a = arena_new();
	if (a == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	void *reply;
	int rv = rpc_call(c->rpc, &podemu__coordinator__descriptor, CM_OPEN_SESSION, &req, a,
	                  &reply, 10000, st);
	if (rv == ST_OK) {
		const Podemu__OpenSessionReply *r = reply;
		*id = r->session;
		*lease_ms = r->lease_ms < 100 ? 100 : r->lease_ms;
		*epoch = r->coordinator_epoch;
		*named = r->handle_base;
		*named_count = r->handle_count;
	}
	arena_free(a);
	return rv;
}

int client_session_open(pe_client *c, struct status *st)
{
	uint64_t count;
	int rv = open_session(c, &c->session, &c->lease_ms, &c->coordinator_epoch, &c->named_next,
	                      &count, st);
	if (rv != ST_OK)
		return rv;
	c->named_end = c->named_next + count;
	c->step_sequence = 0;
	pthread_mutex_init(&c->keeper_lock, NULL);
	pthread_cond_init(&c->keeper_cv, NULL);
	if (pthread_create(&c->keeper, NULL, keeper_main, c) != 0) {
		pthread_cond_destroy(&c->keeper_cv);
		pthread_mutex_destroy(&c->keeper_lock);
		return status_set(st, ST_RESOURCE_EXHAUSTED, "cannot start the session's keeper");
	}
	c->keeper_running = true;
	c->owner_pid = getpid();
	return ST_OK;
}

bool client_forked(const pe_client *c)
{
	return c->keeper_running && getpid() != c->owner_pid;
}

int client_session_follow(pe_client *c, uint64_t coordinator_epoch, struct status *st)
{
	if (coordinator_epoch == c->coordinator_epoch || !c->keeper_running)
		return ST_OK;
	uint64_t id, epoch, named, count;
	int lease;
	int rv = open_session(c, &id, &lease, &epoch, &named, &count, st);
	if (rv != ST_OK)
		return rv;
	/* A new session: its own handles and step order. */
	c->named_next = named;
	c->named_end = named + count;
	c->step_sequence = 0;
	pthread_mutex_lock(&c->keeper_lock);
	c->session = id;
	c->lease_ms = lease;
	c->coordinator_epoch = epoch;
	pthread_mutex_unlock(&c->keeper_lock);
	return ST_OK;
}

void client_session_close(pe_client *c)
{
	if (!c->keeper_running)
		return;
	pthread_mutex_lock(&c->keeper_lock);
	c->keeper_stop = true;
	pthread_cond_broadcast(&c->keeper_cv);
	pthread_mutex_unlock(&c->keeper_lock);
	pthread_join(c->keeper, NULL);
	pthread_cond_destroy(&c->keeper_cv);
	pthread_mutex_destroy(&c->keeper_lock);
	c->keeper_running = false;
	Podemu__SessionRequest req = PODEMU__SESSION_REQUEST__INIT;
	req.session = c->session;
	struct arena *a = arena_new();
	struct status st;
	void *reply;
	if (a != NULL)
		rpc_call(c->rpc, &podemu__coordinator__descriptor, CM_CLOSE_SESSION, &req, a,
		         &reply, CALL_TIMEOUT_MS, &st);
	arena_free(a);
}
