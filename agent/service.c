#include "service.h"

#include <stdio.h>
#include <unistd.h>

#include "graph.h"
#include "podemu.pb-c.h"
#include "services.h"

/* Resident memory of this process, from /proc (0 if unknown). */
static int64_t rss_bytes(void)
{
	FILE *f = fopen("/proc/self/statm", "r");
	long long size = 0, resident = 0;
	if (f == NULL)
		return 0;
	if (fscanf(f, "%lld %lld", &size, &resident) != 2)
		resident = 0;
	fclose(f);
	return (int64_t)resident * sysconf(_SC_PAGESIZE);
}

static int not_ready(struct status *st)
{
	return status_set(st, ST_UNAVAILABLE, "agent has not registered with its coordinator yet");
}

int agent_deliver(void *arg, struct dp_request *req, const struct dp_header *h, const void *payload,
                  struct status *st)
{
	struct agent *ag = arg;
	if (!ag->ready) {
		/* Placed while ready: its receive must not wait for it (dev is zeroed until up). */
		device_unplace(&ag->dev, req);
		return not_ready(st);
	}
	return device_deliver(&ag->dev, req, h, payload, st);
}

void *agent_place(void *arg, struct dp_request *req, const struct dp_header *h)
{
	struct agent *ag = arg;
	return ag->ready ? device_place(&ag->dev, req, h) : NULL;
}

int agent_admit(void *arg, struct dp_request *req, const struct dp_header *h, struct status *st)
{
	struct agent *ag = arg;
	return ag->ready ? device_admit(&ag->dev, req, h, st) : not_ready(st);
}

void agent_unplace(void *arg, struct dp_request *req)
{
	struct agent *ag = arg;
	device_unplace(&ag->dev, req);
}

/* Prepares the host's part of a step and runs it at once: one round trip per step. */
static int h_execute(void *state, struct arena *a, const void *request, void *reply,
                     struct status *st)
{
	struct agent *ag = state;
	const Podemu__HostStep *req = request;
	Podemu__MemoryStatsReply *rep = reply;
	if (!ag->ready)
		return not_ready(st);
	if (req->program == NULL)
		return status_set(st, ST_INVALID_ARGUMENT, "execute step: no program");
	int rv = device_prepare(&ag->dev, req->program, st);
	if (rv != ST_OK) {
		struct status rst;
		device_release(&ag->dev, req->release_after, req->n_release_after, &rst);
		return rv;
	}
	rv = device_run(&ag->dev, req->program->step_id, req->release_after, req->n_release_after,
	                a, rep, st);
	if (rv != ST_OK)
		return rv;
	return device_memory_stats(&ag->dev, a, -1, &rep->cores, &rep->n_cores, st);
}

static int h_abort(void *state, struct arena *a, const void *request, void *reply,
                   struct status *st)
{
	struct agent *ag = state;
	const Podemu__AbortRequest *req = request;
	if (!ag->ready)
		return not_ready(st);
	Podemu__AbortReply *rep = reply;
	int *positions = arena_calloc(a, (size_t)ag->dev.cores_per_host, sizeof(int));
	if (positions == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	int rv = device_abort(&ag->dev, req->step_id, req->code, req->reason, positions, st);
	rep->core_node = positions;
	rep->n_core_node = (size_t)ag->dev.cores_per_host;
	return rv;
}

static int h_create_buffer(void *state, struct arena *a, const void *request, void *reply,
                           struct status *st)
{
	struct agent *ag = state;
	const Podemu__CreateBufferRequest *req = request;
	if (!ag->ready)
		return not_ready(st);
	struct shape shape;
	int rv = shape_from_proto(&shape, req->shape, st);
	if (rv != ST_OK)
		return rv;
	return device_create_buffer(&ag->dev, req->handle, &shape, req->bytes, st);
}

static int h_to_device(void *state, struct arena *a, const void *request, void *reply,
                       struct status *st)
{
	struct agent *ag = state;
	const Podemu__TransferToDeviceRequest *req = request;
	if (!ag->ready)
		return not_ready(st);
	return device_write(&ag->dev, req->handle, req->ordinal, req->offset, req->data.data,
	                    (int64_t)req->data.len, st);
}

static int h_from_device(void *state, struct arena *a, const void *request, void *reply,
                         struct status *st)
{
	struct agent *ag = state;
	const Podemu__TransferFromDeviceRequest *req = request;
	Podemu__TransferFromDeviceReply *rep = reply;
	if (!ag->ready)
		return not_ready(st);
	if (req->length < 0 || req->length > RPC_TRANSFER_CHUNK_BYTES)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "transfer length %lld is out of range [0, %d]",
		                  (long long)req->length, RPC_TRANSFER_CHUNK_BYTES);
	void *data;
	int64_t got, total;
	bool backed;
	int rv = device_read(&ag->dev, a, req->handle, req->ordinal, req->offset, req->length,
	                     &data, &got, &total, &backed, st);
	if (rv != ST_OK)
		return rv;
	rep->backed = backed;
	rep->total_bytes = total;
	rep->data.data = data;
	rep->data.len = data ? (size_t)got : 0;
	return ST_OK;
}

static int h_release(void *state, struct arena *a, const void *request, void *reply,
                     struct status *st)
{
	struct agent *ag = state;
	const Podemu__ReleaseRequest *req = request;
	if (!ag->ready)
		return not_ready(st);
	return device_release(&ag->dev, req->handles, req->n_handles, st);
}

static int h_memory(void *state, struct arena *a, const void *request, void *reply,
                    struct status *st)
{
	struct agent *ag = state;
	const Podemu__MemoryStatsRequest *req = request;
	Podemu__MemoryStatsReply *rep = reply;
	if (!ag->ready)
		return not_ready(st);
	rep->host_rss_bytes = rss_bytes();
	return device_memory_stats(&ag->dev, a, req->ordinal, &rep->cores, &rep->n_cores, st);
}

const rpc_handler agent_handlers[AM_COUNT] = {
    [AM_EXECUTE_STEP] = h_execute,
    [AM_ABORT_STEP] = h_abort,
    [AM_CREATE_BUFFER] = h_create_buffer,
    [AM_TRANSFER_TO_DEVICE] = h_to_device,
    [AM_TRANSFER_FROM_DEVICE] = h_from_device,
    [AM_RELEASE] = h_release,
    [AM_GET_MEMORY_STATS] = h_memory,
};
