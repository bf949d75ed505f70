/*
 * The Coordinator service: registration and heartbeats, status, device buffers and their
 * transfers, releases and memory statistics; steps are step.c's.
 */
#include "service.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "from_graph.h"
#include "graph.h"
#include "log.h"
#include "podemu.pb-c.h"
#include "services.h"
#include "sessions.h"
#include "steps.h"

/*
 * Snapshot of the agents' clients and data URLs, taken under the lock; fails when the pod is
 * not ready.
 */
int snapshot_hosts(struct coordinator *co, struct arena *a, struct rpc_client ***clients,
                   char ***data_urls, struct status *st)
{
	int n = co->reg.topo.num_hosts;
	*clients = arena_calloc(a, (size_t)n, sizeof(**clients));
	if (data_urls != NULL)
		*data_urls = arena_calloc(a, (size_t)n, sizeof(**data_urls));
	if (*clients == NULL || (data_urls != NULL && *data_urls == NULL))
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	pthread_mutex_lock(&co->reg.lock);
	if (!registry_ready_locked(&co->reg, st)) {
		pthread_mutex_unlock(&co->reg.lock);
		return st->code;
	}
	for (int h = 0; h < n; h++) {
		(*clients)[h] = co->reg.hosts[h].client;
		if (data_urls != NULL)
			(*data_urls)[h] = arena_strdup(a, co->reg.hosts[h].data_url);
	}
	pthread_mutex_unlock(&co->reg.lock);
	return ST_OK;
}

static int h_register(void *state, struct arena *a, const void *request, void *reply,
                      struct status *st)
{
	struct coordinator *co = state;
	const Podemu__RegisterRequest *req = request;
	Podemu__RegisterReply *rep = reply;
	int index;
	uint64_t incarnation;
	const struct host_claim claim = {
	    req->requested_host_index, req->control_url,  req->data_url, req->backing, req->pid,
	    req->agent_epoch,          req->process_epoch};
	int rv = registry_register(&co->reg, &claim, &index, &incarnation, st);
	if (rv != ST_OK)
		return rv;
	rep->host_index = index;
	rep->topology = arena_strdup(a, co->reg.topo.name);
	rep->num_hosts = co->reg.topo.num_hosts;
	rep->cores_per_host = co->reg.topo.cores_per_host;
	rep->hbm_bytes = co->reg.topo.hbm_bytes;
	rep->reserved_bytes = co->reg.topo.reserved_bytes;
	rep->incarnation = incarnation;
	rep->coordinator_epoch = co->reg.epoch;
	return ST_OK;
}

static int h_heartbeat(void *state, struct arena *a, const void *request, void *reply,
                       struct status *st)
{
	struct coordinator *co = state;
	const Podemu__HeartbeatRequest *req = request;
	Podemu__HeartbeatReply *rep = reply;
	/* One agent process for all its hosts; those the registry does not know register again. */
	if (req->n_hosts > (size_t)co->reg.topo.num_hosts)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "heartbeat: %zu hosts named; the pod has %d", req->n_hosts,
		                  co->reg.topo.num_hosts);
	rep->unknown_hosts = arena_calloc(a, req->n_hosts, sizeof(*rep->unknown_hosts));
	if (rep->unknown_hosts == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (size_t i = 0; i < req->n_hosts; i++) {
		const Podemu__HostLease *l = req->hosts[i];
		if (l != NULL && !registry_heartbeat(&co->reg, l->host_index, l->incarnation))
			rep->unknown_hosts[rep->n_unknown_hosts++] = l->host_index;
	}
	rep->known = rep->n_unknown_hosts == 0;
	return ST_OK;
}

/* Gathers every core's statistics, in ordinal order, into *cores. */
static int collect_memory(struct coordinator *co, struct arena *a, struct rpc_client **clients,
                          Podemu__CoreMemory ***cores, size_t *n_cores, Podemu__HostInfo **hosts,
                          struct status *st)

{
	int n = co->reg.topo.num_hosts;
	Podemu__MemoryStatsRequest *req = arena_alloc(a, sizeof(*req));
	void **replies = arena_calloc(a, (size_t)n, sizeof(void *));
	struct status *sts = arena_calloc(a, (size_t)n, sizeof(*sts));
	const void **reqs = same_for_all(a, n, req);
	*cores = arena_calloc(a, (size_t)topology_world_size(&co->reg.topo), sizeof(**cores));
	if (!req || !replies || !sts || !reqs || !*cores)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	podemu__memory_stats_request__init(req);
	req->ordinal = -1;
	int rv = fan_call(co, clients, AM_GET_MEMORY_STATS, reqs, a, replies, sts,
	                  co->agent_timeout_ms, st);
	if (rv != ST_OK)
		return rv;
	*n_cores = 0;
	for (int h = 0; h < n; h++) {
		Podemu__MemoryStatsReply *r = replies[h];
		if (hosts != NULL && hosts[h] != NULL) {
			hosts[h]->rss_bytes = r->host_rss_bytes;
			for (size_t k = 0; k < r->n_cores; k++)
				hosts[h]->accounted_bytes += r->cores[k]->bytes_in_use;
		}
		for (size_t k = 0;
		     k < r->n_cores && *n_cores < (size_t)topology_world_size(&co->reg.topo); k++)
			(*cores)[(*n_cores)++] = r->cores[k];
	}
	return ST_OK;
}

int coordinator_status(struct coordinator *co, struct arena *a, bool memory, Podemu__PodStatus *out)
{
	Podemu__StatusRequest req = PODEMU__STATUS_REQUEST__INIT;
	req.memory = memory;
	struct status st;
	podemu__pod_status__init(out);
	return coordinator_handlers[CM_GET_STATUS](co, a, &req, out, &st);
}

/* The sessions that are open (or ending) with what they own, into rep (registry lock held). */
static void list_sessions(const struct registry *r, struct arena *a, Podemu__PodStatus *rep)
{
	rep->sessions = arena_calloc(a, (size_t)r->num_sessions + 1, sizeof(*rep->sessions));
	int *buffers = arena_calloc(a, (size_t)r->num_sessions + 1, sizeof(int));
	int64_t *bytes = arena_calloc(a, (size_t)r->num_sessions + 1, sizeof(int64_t));
	if (rep->sessions == NULL || buffers == NULL || bytes == NULL)
		return;
	session_usage_all(r, buffers, bytes); /* one walk over the buffers for all of them */
	for (int i = 0; i < r->num_sessions; i++) {
		const struct session *s = &r->sessions[i];
		if (s->state == SESSION_ENDED)
			continue;
		Podemu__SessionInfo *si = arena_alloc(a, sizeof(*si));
		if (si == NULL)
			return;
		podemu__session_info__init(si);
		si->id = s->id;
		si->pid = s->pid;
		si->host_name = arena_strdup(a, s->host_name);
		si->name = arena_strdup(a, s->name);
		si->started_unix_ms = s->started_unix_ms;
		si->lease_ms = s->lease_ms;
		si->buffers = buffers[i];
		si->bytes_per_core = bytes[i];
		rep->sessions[rep->n_sessions++] = si;
	}
}

static int h_get_status(void *state, struct arena *a, const void *request, void *reply,
                        struct status *st)
{
	struct coordinator *co = state;
	const Podemu__StatusRequest *req = request;
	Podemu__PodStatus *rep = reply;
	const struct topology *t = &co->reg.topo;
	rep->topology = arena_strdup(a, t->name);
	rep->coordinator_epoch = co->reg.epoch;
	rep->world_size = topology_world_size(t);
	rep->num_hosts = t->num_hosts;
	rep->cores_per_host = t->cores_per_host;
	rep->hbm_bytes = t->hbm_bytes;
	rep->hosts = arena_calloc(a, (size_t)t->num_hosts, sizeof(*rep->hosts));
	if (rep->hosts == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	struct status ready_st;
	pthread_mutex_lock(&co->reg.lock);
	rep->ready = registry_ready_locked(&co->reg, &ready_st);
	if (!rep->ready)
		rep->reason = arena_strdup(a, ready_st.message);
	for (int h = 0; h < t->num_hosts; h++) {
		const struct host *src = &co->reg.hosts[h];
		Podemu__HostInfo *hi = arena_alloc(a, sizeof(*hi));
		if (hi == NULL)
			break;
		podemu__host_info__init(hi);
		hi->index = h;
		hi->control_url = arena_strdup(a, src->registered ? src->control_url : "");
		hi->data_url = arena_strdup(a, src->registered ? src->data_url : "");
		hi->backing = arena_strdup(a, src->registered ? src->backing : "");
		hi->pid = src->pid;
		hi->process = src->registered ? src->process_epoch : 0;
		hi->alive = src->registered && src->alive;
		rep->hosts[rep->n_hosts++] = hi;
	}
	list_sessions(&co->reg, a, rep);
	pthread_mutex_unlock(&co->reg.lock);
	if (req->memory && rep->ready) {
		struct rpc_client **clients;
		struct status mst;
		if (snapshot_hosts(co, a, &clients, NULL, &mst) == ST_OK &&
		    collect_memory(co, a, clients, &rep->cores, &rep->n_cores, rep->hosts, &mst) !=
		        ST_OK)
			log_warn("status: cannot collect memory statistics: %s", mst.message);
	}
	return ST_OK;
}

/* Releases handles on every agent (errors ignored: some may be gone already). */
void release_everywhere(struct coordinator *co, struct arena *a, struct rpc_client **clients,
                        uint64_t *handles, size_t n, const int *skip_host)
{
	if (n == 0)
		return;
	int hosts = co->reg.topo.num_hosts;
	Podemu__ReleaseRequest *req = arena_alloc(a, sizeof(*req));
	const void **reqs = arena_calloc(a, (size_t)hosts, sizeof(void *));
	void **replies = arena_calloc(a, (size_t)hosts, sizeof(void *));
	struct status *sts = arena_calloc(a, (size_t)hosts, sizeof(*sts));
	if (!req || !reqs || !replies || !sts)
		return;
	podemu__release_request__init(req);
	req->handles = handles;
	req->n_handles = n;
	/* Hosts that are gone have nothing left to free, and would only be waited for. */
	pthread_mutex_lock(&co->reg.lock);
	for (int h = 0; h < hosts; h++)
		reqs[h] = (skip_host && skip_host[h]) || !co->reg.hosts[h].alive ? NULL : req;
	pthread_mutex_unlock(&co->reg.lock);

	struct status st;
	fan_call(co, clients, AM_RELEASE, reqs, a, replies, sts, co->agent_timeout_ms, &st);
}

void release_on_live_hosts(struct coordinator *co, struct arena *a, uint64_t *handles, size_t n)
{
	int hosts = co->reg.topo.num_hosts;
	struct rpc_client **clients = arena_calloc(a, (size_t)hosts, sizeof(*clients));
	if (clients == NULL || n == 0)
		return;
	pthread_mutex_lock(&co->reg.lock);
	for (int h = 0; h < hosts; h++)
		clients[h] = co->reg.hosts[h].client;
	pthread_mutex_unlock(&co->reg.lock);
	release_everywhere(co, a, clients, handles, n, NULL);
}

static int h_create_buffer(void *state, struct arena *a, const void *request, void *reply,
                           struct status *st)
{
	struct coordinator *co = state;
	const Podemu__CreateBufferRequest *req = request;
	Podemu__CreateBufferReply *rep = reply;
	struct shape shape;
	int rv = shape_from_proto(&shape, req->shape, st);
	if (rv != ST_OK)
		return status_set(st, rv, "create buffer: %s", st->message);
	if (shape.tuple)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "create buffer: a buffer cannot be a tuple");
	int hosts = co->reg.topo.num_hosts;
	struct rpc_client **clients;
	pthread_mutex_lock(&co->step_lock);
	if ((rv = snapshot_hosts(co, a, &clients, NULL, st)) != ST_OK)
		goto out;
	pthread_mutex_lock(&co->reg.lock);
	rv = session_use(&co->reg, req->session, st);
	uint64_t handle = co->reg.next_handle++;
	pthread_mutex_unlock(&co->reg.lock);
	if (rv != ST_OK)
		goto out;
	Podemu__CreateBufferRequest *fwd = arena_alloc(a, sizeof(*fwd));
	void **replies = arena_calloc(a, (size_t)hosts, sizeof(void *));
	struct status *sts = arena_calloc(a, (size_t)hosts, sizeof(*sts));
	const void **reqs = same_for_all(a, hosts, fwd);
	int *failed = arena_calloc(a, (size_t)hosts, sizeof(int));
	if (!fwd || !replies || !sts || !reqs || !failed) {
		rv = status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		goto out;
	}
	podemu__create_buffer_request__init(fwd);
	fwd->shape = req->shape;
	fwd->handle = handle;
	fwd->layout = req->layout;
	fwd->session = req->session;
	if ((rv = graph_value_bytes(&fwd->bytes, &shape, req->layout, co->tiled, a, st)) != ST_OK)
		goto out;
	if (req->layout != NULL && strlen(req->layout) >= LAYOUT_TEXT_MAX) {
		rv = status_set(st, ST_INVALID_ARGUMENT,
		                "create buffer: layout longer than %d "
		                "characters",
		                LAYOUT_TEXT_MAX - 1);
		goto out;
	}
	rv = fan_call(co, clients, AM_CREATE_BUFFER, reqs, a, replies, sts, co->agent_timeout_ms,
	              st);
	if (rv != ST_OK) {
		for (int h = 0; h < hosts; h++)
			failed[h] = sts[h].code != ST_OK;
		release_everywhere(co, a, clients, &handle, 1, failed);
		goto out;
	}
	pthread_mutex_lock(&co->reg.lock);
	rv = registry_add_handle(&co->reg, handle, req->session, fwd->bytes, &shape, req->layout,
	                         st);
	pthread_mutex_unlock(&co->reg.lock);
	if (rv != ST_OK)
		release_everywhere(co, a, clients, &handle, 1, NULL);
	rep->handle = handle;
out:
	pthread_mutex_unlock(&co->step_lock);
	return rv;
}

/* Finds the agent that owns ordinal and checks handle and range. */
static int route_transfer(struct coordinator *co, uint64_t session, uint64_t handle, int ordinal,
                          int64_t offset, int64_t len, struct rpc_client **client, int *host,
                          struct status *st)
{
	int world = topology_world_size(&co->reg.topo);
	if (ordinal < 0 || ordinal >= world)
		return status_set(st, ST_INVALID_ARGUMENT, "core %d is out of range [0, %d)",
		                  ordinal, world);
	pthread_mutex_lock(&co->reg.lock);
	int rv = session_use(&co->reg, session, st);
	struct handle_entry *e = NULL;
	if (rv == ST_OK && (e = registry_use_handle(&co->reg, handle, session, st)) == NULL)
		rv = st->code;
	struct status rst;
	if (rv == ST_OK) {
		int64_t total = shape_bytes(&e->shape);
		if (offset < 0 || len < 0 || offset > total || len > total - offset)
			rv = status_set(st, ST_OUT_OF_RANGE,
			                "byte range [%lld, +%lld) is outside the %lld-byte buffer "
			                "%llu",
			                (long long)offset, (long long)len, (long long)total,
			                (unsigned long long)handle);
	}
	if (rv == ST_OK && !registry_ready_locked(&co->reg, &rst))
		rv = status_set(st, rst.code, "%s", rst.message);
	*host = ordinal / co->reg.topo.cores_per_host;
	if (rv == ST_OK)
		*client = co->reg.hosts[*host].client;
	pthread_mutex_unlock(&co->reg.lock);
	return rv;
}

static int h_transfer_to_device(void *state, struct arena *a, const void *request, void *reply,
                                struct status *st)
{
	struct coordinator *co = state;
	const Podemu__TransferToDeviceRequest *req = request;
	struct rpc_client *client;
	pthread_mutex_lock(&co->step_lock);
	int host;
	int rv = route_transfer(co, req->session, req->handle, req->ordinal, req->offset,
	                        (int64_t)req->data.len, &client, &host, st);
	void *ignored;
	if (rv == ST_OK)
		rv = call_host(co, host, client, AM_TRANSFER_TO_DEVICE, req, a, &ignored, st);
	pthread_mutex_unlock(&co->step_lock);
	return rv;
}

static int h_transfer_from_device(void *state, struct arena *a, const void *request, void *reply,
                                  struct status *st)
{
	struct coordinator *co = state;
	const Podemu__TransferFromDeviceRequest *req = request;
	if (req->length < 0 || req->length > RPC_TRANSFER_CHUNK_BYTES)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "transfer length %lld is out of range [0, %d]",
		                  (long long)req->length, RPC_TRANSFER_CHUNK_BYTES);
	struct rpc_client *client;
	pthread_mutex_lock(&co->step_lock);
	int host;
	int rv = route_transfer(co, req->session, req->handle, req->ordinal, req->offset, 0,
	                        &client, &host, st);
	void *got = NULL;
	if (rv == ST_OK)
		rv = call_host(co, host, client, AM_TRANSFER_FROM_DEVICE, req, a, &got, st);
	pthread_mutex_unlock(&co->step_lock);
	if (rv == ST_OK)
		*(Podemu__TransferFromDeviceReply *)reply = *(Podemu__TransferFromDeviceReply *)got;
	return rv;
}

static int h_release(void *state, struct arena *a, const void *request, void *reply,
                     struct status *st)
{
	struct coordinator *co = state;
	const Podemu__ReleaseRequest *req = request;
	uint64_t *known = arena_calloc(a, req->n_handles + 1, sizeof(uint64_t));
	if (known == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	size_t n_known = 0;
	pthread_mutex_lock(&co->step_lock);
	pthread_mutex_lock(&co->reg.lock);
	int rv = session_use(&co->reg, req->session, st);
	/* Unknown handles do not keep the others from being released; the first is named. */
	struct status missing = {0};
	for (size_t k = 0; k < req->n_handles && rv == ST_OK; k++) {
		const struct handle_entry *e = registry_find_handle(&co->reg, req->handles[k]);
		if (e == NULL || e->session != req->session) {
			if (missing.code == ST_OK)
				registry_unknown_handle(&co->reg, req->handles[k], req->session,
				                        &missing);
			continue;
		}
		registry_remove_handle(&co->reg, req->handles[k]);
		known[n_known++] = req->handles[k];
	}
	pthread_mutex_unlock(&co->reg.lock);
	release_on_live_hosts(co, a, known, n_known);
	pthread_mutex_unlock(&co->step_lock);
	if (rv == ST_OK && missing.code != ST_OK)
		rv = status_set(st, missing.code, "%s", missing.message);
	return rv;
}

static int h_get_memory_stats(void *state, struct arena *a, const void *request, void *reply,
                              struct status *st)
{
	struct coordinator *co = state;
	const Podemu__MemoryStatsRequest *req = request;
	Podemu__MemoryStatsReply *rep = reply;
	int world = topology_world_size(&co->reg.topo);
	if (req->ordinal < -1 || req->ordinal >= world)
		return status_set(st, ST_INVALID_ARGUMENT, "core %d is out of range [0, %d)",
		                  req->ordinal, world);
	struct rpc_client **clients;
	if (req->ordinal >= 0) {
		/* One core can be asked while other hosts are missing. */
		int h = req->ordinal / co->reg.topo.cores_per_host;
		struct rpc_client *client = NULL;
		pthread_mutex_lock(&co->reg.lock);
		if (co->reg.hosts[h].registered && co->reg.hosts[h].alive)
			client = co->reg.hosts[h].client;
		pthread_mutex_unlock(&co->reg.lock);
		if (client == NULL)
			return status_set(st, ST_UNAVAILABLE, "host %d (core %d) is not alive", h,
			                  req->ordinal);
		void *one;
		int rv1 = call_host(co, h, client, AM_GET_MEMORY_STATS, req, a, &one, st);
		if (rv1 == ST_OK)
			*rep = *(Podemu__MemoryStatsReply *)one;
		return rv1;
	}
	int rv = snapshot_hosts(co, a, &clients, NULL, st);
	if (rv != ST_OK)
		return rv;
	return collect_memory(co, a, clients, &rep->cores, &rep->n_cores, NULL, st);
}

const rpc_handler coordinator_handlers[CM_COUNT] = {
    [CM_REGISTER] = h_register,
    [CM_HEARTBEAT] = h_heartbeat,
    [CM_GET_STATUS] = h_get_status,
    [CM_EXECUTE_STEP] = h_execute_step,
    [CM_CREATE_BUFFER] = h_create_buffer,
    [CM_TRANSFER_TO_DEVICE] = h_transfer_to_device,
    [CM_TRANSFER_FROM_DEVICE] = h_transfer_from_device,
    [CM_RELEASE] = h_release,
    [CM_GET_MEMORY_STATS] = h_get_memory_stats,
    [CM_OPEN_SESSION] = h_open_session,
    [CM_RENEW_SESSION] = h_renew_session,
    [CM_CLOSE_SESSION] = h_close_session,
};
