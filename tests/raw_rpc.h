/*
 * The coordinator's protocol spoken directly, for integration tests that send what the
 * library never would (include after pod_fixture.h, with the pod started).
 */
#ifndef PODEMU_TEST_RAW_RPC_H
#define PODEMU_TEST_RAW_RPC_H

#include "podemu.pb-c.h"
#include "rpc.h"
#include "services.h"

/* The first line of a file of the pod's state directory. */
static inline void pod_state_line(const char *name, char *out, size_t len)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", pod_state_dir, name);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	assert_non_null(fgets(out, (int)len, f));
	fclose(f);
	out[strcspn(out, "\n")] = '\0';
}

/* A connection to the pod's coordinator that carries the pod's token. */
static inline struct rpc_client *pod_raw_client(void)
{
	char url[256], token[256];
	pod_state_line("coordinator.url", url, sizeof(url));
	pod_state_line("token", token, sizeof(token));
	struct rpc_client *rc;
	struct status st;
	assert_int_equal(rpc_client_open(&rc, url, false, &st), ST_OK);
	rpc_client_set_token(rc, token);
	return rc;
}

/* One call to the coordinator. */
static inline int pod_raw_call(struct rpc_client *rc, unsigned method, const void *req,
                               struct arena *a, void **reply, struct status *st)
{
	return rpc_call(rc, &podemu__coordinator__descriptor, method, req, a, reply, 10000, st);
}

/* A new session of this process (from a). */
static inline const Podemu__OpenSessionReply *pod_raw_open_session(struct rpc_client *rc,
                                                                   struct arena *a)
{
	Podemu__OpenSessionRequest req = PODEMU__OPEN_SESSION_REQUEST__INIT;
	req.pid = (int)getpid();
	req.name = "raw";
	void *reply;
	struct status st;
	assert_int_equal(pod_raw_call(rc, CM_OPEN_SESSION, &req, a, &reply, &st), ST_OK);
	return reply;
}

#endif
