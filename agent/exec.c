/*
 * Steps on one host: prepare (validate a compiled program, allocate every core's outputs and
 * temporaries), run (every core thread walks the program; collectives meet at slots), finish
 * (free temporaries, publish outputs, release what the client dropped).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device.h"
#include "graph.h"
#include "kernels.h"
#include "log.h"

#define DEFAULT_COLLECTIVE_TIMEOUT_MS 120000
#define DEFAULT_CHUNK_BYTES (4 * 1024 * 1024)

/* Where the cores of this host meet for one collective of the step. */
struct coll_slot {
	int node;
	int arrived;
	bool active; /* every local core has arrived: chunks may be written */
	void **out;
	const void **in;
	int64_t shard_bytes;
	int64_t shard_row; /* contiguous bytes of one shard per outer index */
	int64_t out_row;
	int64_t recv_bytes;
	int recv_last;
	unsigned char *src_done; /* [world_size] */
	int local_done;
	int copying; /* deliveries writing outside the lock */
	struct dp_request **parked;
	int num_parked;
	int cap_parked;
	int code;
	char message[1024];
};

struct step {
	uint64_t id;
	struct arena *arena;
	Podemu__Program *prog;
	struct shape *shapes;
	enum opcode *ops;
	int64_t **offsets; /* [core][node]: heap offset of the node's value, -1 when none */
	int *coll_of_node;
	struct coll_slot *colls;
	int num_colls;
	const char **remote_urls;
	int num_remote;
	int timeout_ms;
	int64_t chunk_bytes;
	bool running;
	int done_cores;
	struct status *core_status;
};

bool device_step_uses(struct device *dev, uint64_t handle)
{
	struct step *s = dev->step;
	if (s == NULL)
		return false;
	for (size_t i = 0; i < s->prog->n_buffers; i++)
		if (s->prog->buffers[i]->handle == handle)
			return true;
	return false;
}

static void deadline_after(struct timespec *ts, int ms)
{
	clock_gettime(CLOCK_REALTIME, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (long)(ms % 1000) * 1000000;
	if (ts->tv_nsec >= 1000000000) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000;
	}
}

static void *core_ptr(struct core *c, struct step *s, int node)
{
	int64_t off = s->offsets[c->local][node];
	return off < 0 ? NULL : hbm_ptr(&c->heap, off);
}

/* Frees the outputs a prepared step allocated (when it did not publish them). Lock held. */
static void step_free_outputs(struct device *dev, struct step *s)
{
	for (int c = 0; c < dev->cores_per_host; c++)
		for (size_t i = 0; i < s->prog->n_buffers; i++)
			if (s->prog->buffers[i]->kind == PODEMU__BUFFER_KIND__BUFFER_OUTPUT &&
			    s->offsets[c][i] >= 0)
				hbm_free(&dev->cores[c].heap, s->offsets[c][i]);
}

/* Answers every parked chunk of s with code and frees the step. Lock held. */
static void step_destroy(struct device *dev, struct step *s, int code, const char *why)
{
	for (int k = 0; k < s->num_colls; k++) {
		struct coll_slot *slot = &s->colls[k];
		while (slot->copying > 0)
			pthread_cond_wait(&dev->cv, &dev->lock);
		for (int p = 0; p < slot->num_parked; p++)
			dp_complete(slot->parked[p], code, why);
		free(slot->parked);
	}
	for (int c = 0; c < dev->cores_per_host; c++)
		hbm_release_reservation(&dev->cores[c].heap);
	arena_free(s->arena);
	if (dev->step == s)
		dev->step = NULL;
}

/* Checks one node's buffer assignment against the graph and the host's buffers. */
static int check_assignment(struct device *dev, struct step *s, size_t i, struct status *st)
{
	const Podemu__BufferAssignment *b = s->prog->buffers[i];
	const struct shape *shape = &s->shapes[i];
	enum opcode op = s->ops[i];
	int64_t bytes = shape_bytes(shape);
	switch (b->kind) {
	case PODEMU__BUFFER_KIND__BUFFER_PARAMETER: {
		if (op != OP_PARAMETER)
			break;
		struct device_buffer *db = device_find_buffer(dev, b->handle);
		if (db == NULL)
			return status_set(st, ST_NOT_FOUND,
			                  "parameter (node %zu): no device buffer with handle %llu "
			                  "on host %d",
			                  i, (unsigned long long)b->handle, dev->host_index);
		if (!shape_equal(&db->shape, shape)) {
			char sa[128], sb[128];
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "parameter (node %zu): buffer %llu is %s, not %s", i,
			                  (unsigned long long)b->handle,
			                  shape_format(sa, sizeof(sa), &db->shape),
			                  shape_format(sb, sizeof(sb), shape));
		}
		return ST_OK;
	}
	case PODEMU__BUFFER_KIND__BUFFER_OUTPUT:
		if (op == OP_PARAMETER || op == OP_OPT_BARRIER || op == OP_GET_TUPLE_ELEMENT)
			break;
		if (b->handle == 0 || device_find_buffer(dev, b->handle) != NULL)
			return status_set(st, ST_ALREADY_EXISTS,
			                  "node %zu: output handle %llu is taken", i,
			                  (unsigned long long)b->handle);
		return ST_OK;
	case PODEMU__BUFFER_KIND__BUFFER_TEMP:
		if (op == OP_PARAMETER || op == OP_OPT_BARRIER || op == OP_GET_TUPLE_ELEMENT)
			break;
		if (b->offset < 0 || b->offset > s->prog->temp_bytes ||
		    bytes > s->prog->temp_bytes - b->offset)
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "node %zu: temporary [%lld, +%lld) is outside the "
			                  "%lld-byte reservation",
			                  i, (long long)b->offset, (long long)bytes,
			                  (long long)s->prog->temp_bytes);
		return ST_OK;
	case PODEMU__BUFFER_KIND__BUFFER_ALIAS:
		if (op != OP_GET_TUPLE_ELEMENT || b->alias_of < 0 || (size_t)b->alias_of >= i)
			break;
		return ST_OK;
	case PODEMU__BUFFER_KIND__BUFFER_NONE:
		if (op != OP_OPT_BARRIER)
			break;
		return ST_OK;
	default:
		break;
	}
	return status_set(st, ST_INVALID_ARGUMENT, "node %zu (%s): invalid buffer assignment", i,
	                  opcode_name(op));
}

/* Copies the program into the step's arena and checks everything that is not heap state. */
static int step_build(struct device *dev, struct step *s, const Podemu__Program *prog,
                      struct status *st)
{
	size_t len = podemu__program__get_packed_size(prog);
	uint8_t *buf = malloc(len ? len : 1);
	if (buf == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	podemu__program__pack(prog, buf);
	s->prog = podemu__program__unpack(arena_protobuf_allocator(s->arena), len, buf);
	free(buf);
	if (s->prog == NULL || s->prog->graph == NULL)
		return status_set(st, ST_INVALID_ARGUMENT, "malformed program");
	Podemu__Program *p = s->prog;
	size_t n = p->graph->n_nodes;
	if (p->world_size != dev->world_size || p->cores_per_host != dev->cores_per_host ||
	    p->n_peer_data_urls != (size_t)dev->num_hosts)
		return status_set(st, ST_FAILED_PRECONDITION,
		                  "program was compiled for %d cores (%d per host, %zu hosts) but "
		                  "this pod has %d (%d per host, %d hosts)",
		                  p->world_size, p->cores_per_host, p->n_peer_data_urls,
		                  dev->world_size, dev->cores_per_host, dev->num_hosts);
	if (p->n_buffers != n || p->temp_bytes < 0)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "program has %zu buffer assignments for %zu nodes", p->n_buffers,
		                  n);
	s->id = p->step_id;
	s->timeout_ms = p->collective_timeout_ms > 0 && p->collective_timeout_ms < 86400000
	                    ? (int)p->collective_timeout_ms
	                    : DEFAULT_COLLECTIVE_TIMEOUT_MS;
	s->chunk_bytes = p->chunk_bytes > 0 ? p->chunk_bytes : DEFAULT_CHUNK_BYTES;
	s->shapes = arena_calloc(s->arena, n, sizeof(*s->shapes));
	s->ops = arena_calloc(s->arena, n, sizeof(*s->ops));
	s->coll_of_node = arena_calloc(s->arena, n, sizeof(int));
	s->core_status = arena_calloc(s->arena, (size_t)dev->cores_per_host, sizeof(struct status));
	s->remote_urls = arena_calloc(s->arena, (size_t)dev->num_hosts, sizeof(char *));
	if (!s->shapes || !s->ops || !s->coll_of_node || !s->core_status || !s->remote_urls)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	int rv = graph_check(p->graph, dev->world_size, s->shapes, st);
	if (rv != ST_OK)
		return rv;
	for (size_t i = 0; i < n; i++) {
		s->ops[i] = opcode_parse(p->graph->nodes[i]->opcode);
		if (p->buffers[i] == NULL)
			return status_set(st, ST_INVALID_ARGUMENT, "node %zu has no buffer", i);
		if (opcode_is_collective(s->ops[i]))
			s->coll_of_node[i] = s->num_colls++;
	}
	for (int h = 0; h < dev->num_hosts; h++)
		if (h != dev->host_index)
			s->remote_urls[s->num_remote++] = p->peer_data_urls[h];
	s->colls =
	    arena_calloc(s->arena, (size_t)(s->num_colls ? s->num_colls : 1), sizeof(*s->colls));
	if (s->colls == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (size_t i = 0; i < n; i++) {
		if (!opcode_is_collective(s->ops[i]))
			continue;
		struct coll_slot *slot = &s->colls[s->coll_of_node[i]];
		const struct shape *in = &s->shapes[p->graph->nodes[i]->operands[0]];
		const struct shape *out = &s->shapes[i];
		int d = (int)p->graph->nodes[i]->dimensions[0];
		int64_t inner = (int64_t)dtype_size(in->dtype);
		for (int k = d + 1; k < in->rank; k++)
			inner *= in->dims[k];
		slot->node = (int)i;
		slot->shard_bytes = shape_bytes(in);
		slot->shard_row = in->dims[d] * inner;
		slot->out_row = out->dims[d] * inner;
		slot->out = arena_calloc(s->arena, (size_t)dev->cores_per_host, sizeof(void *));
		slot->in = arena_calloc(s->arena, (size_t)dev->cores_per_host, sizeof(void *));
		slot->src_done = arena_calloc(s->arena, (size_t)dev->world_size, 1);
		if (!slot->out || !slot->in || !slot->src_done)
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	}
	return ST_OK;
}

/* Allocates outputs and the reservation on every core; all or nothing. Lock held. */
static int step_allocate(struct device *dev, struct step *s, struct status *st)
{
	Podemu__Program *p = s->prog;
	size_t n = p->graph->n_nodes;
	s->offsets = arena_calloc(s->arena, (size_t)dev->cores_per_host, sizeof(int64_t *));
	if (s->offsets == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int c = 0; c < dev->cores_per_host; c++) {
		s->offsets[c] = arena_calloc(s->arena, n, sizeof(int64_t));
		if (s->offsets[c] == NULL)
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		for (size_t i = 0; i < n; i++)
			s->offsets[c][i] = -1;
	}
	int rv = ST_OK;
	for (int c = 0; c < dev->cores_per_host && rv == ST_OK; c++) {
		struct core *core = &dev->cores[c];
		for (size_t i = 0; i < n && rv == ST_OK; i++) {
			const Podemu__BufferAssignment *b = p->buffers[i];
			if (b->kind == PODEMU__BUFFER_KIND__BUFFER_OUTPUT)
				rv = hbm_alloc(&core->heap, shape_bytes(&s->shapes[i]),
				               &s->offsets[c][i], st);
		}
		if (rv == ST_OK)
			rv = hbm_reserve_bottom(&core->heap, p->temp_bytes, st);
		if (rv != ST_OK)
			status_set(st, rv, "core %d (host %d): %s", core->ordinal, dev->host_index,
			           st->message);
	}
	if (rv != ST_OK) {
		step_free_outputs(dev, s);
		for (int c = 0; c < dev->cores_per_host; c++)
			hbm_release_reservation(&dev->cores[c].heap);
		return rv;
	}
	for (int c = 0; c < dev->cores_per_host; c++) {
		for (size_t i = 0; i < n; i++) {
			const Podemu__BufferAssignment *b = p->buffers[i];
			if (b->kind == PODEMU__BUFFER_KIND__BUFFER_PARAMETER)
				s->offsets[c][i] = device_find_buffer(dev, b->handle)->offsets[c];
			else if (b->kind == PODEMU__BUFFER_KIND__BUFFER_TEMP)
				s->offsets[c][i] = b->offset;
			else if (b->kind == PODEMU__BUFFER_KIND__BUFFER_ALIAS)
				s->offsets[c][i] = s->offsets[c][b->alias_of];
		}
	}
	return ST_OK;
}

int device_prepare(struct device *dev, const Podemu__Program *prog, struct status *st)
{
	struct step *s = NULL;
	struct arena *a = arena_new();
	if (a == NULL || (s = arena_alloc(a, sizeof(*s))) == NULL) {
		arena_free(a);
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	}
	s->arena = a;
	int rv = step_build(dev, s, prog, st);
	if (rv != ST_OK) {
		arena_free(a);
		return rv;
	}
	pthread_mutex_lock(&dev->lock);
	if (dev->step != NULL) {
		if (dev->step->running) {
			pthread_mutex_unlock(&dev->lock);
			arena_free(a);
			return status_set(st, ST_FAILED_PRECONDITION,
			                  "host %d is still running step %llu", dev->host_index,
			                  (unsigned long long)dev->step->id);
		}
		/* A step that was prepared but never run (its coordinator gave up) is dropped. */
		step_free_outputs(dev, dev->step);
		step_destroy(dev, dev->step, ST_ABORTED, "step was replaced");
	}
	for (size_t i = 0; i < s->prog->n_buffers && rv == ST_OK; i++)
		rv = check_assignment(dev, s, i, st);
	if (rv == ST_OK)
		rv = step_allocate(dev, s, st);
	if (rv == ST_OK)
		dev->step = s;
	pthread_mutex_unlock(&dev->lock);
	if (rv != ST_OK)
		arena_free(a);
	return rv;
}

int device_abort(struct device *dev, uint64_t step_id, struct status *st)
{
	pthread_mutex_lock(&dev->lock);
	struct step *s = dev->step;
	int rv = ST_OK;
	if (s == NULL || (step_id != 0 && s->id != step_id)) {
		rv = status_set(st, ST_NOT_FOUND, "host %d has no step %llu prepared",
		                dev->host_index, (unsigned long long)step_id);
	} else if (s->running) {
		rv = status_set(st, ST_FAILED_PRECONDITION, "step %llu is running",
		                (unsigned long long)step_id);
	} else {
		step_free_outputs(dev, s);
		step_destroy(dev, s, ST_ABORTED, "step was aborted");
	}
	pthread_mutex_unlock(&dev->lock);
	return rv;
}

/* Copies bytes [offset, offset+len) of the shard of group position pos into out. */
static void scatter_shard(const struct coll_slot *slot, void *out, int pos, const void *data,
                          int64_t offset, int64_t len)
{
	const char *src = data;
	while (len > 0 && slot->shard_row > 0) {
		int64_t row = offset / slot->shard_row, within = offset % slot->shard_row;
		int64_t n = slot->shard_row - within < len ? slot->shard_row - within : len;
		memcpy((char *)out + row * slot->out_row + pos * slot->shard_row + within, src,
		       (size_t)n);
		src += n;
		offset += n;
		len -= n;
	}
}

/*
 * Writes one received chunk into every local core's output. The caller has counted it in
 * slot->copying (under the lock) so the step outlives the copy.
 */
static int deliver_active(struct device *dev, struct step *s, struct coll_slot *slot,
                          const struct dp_header *h, const void *payload, struct status *st)
{
	int rv = ST_OK;
	int local_lo = dev->host_index * dev->cores_per_host;
	if (h->src_ordinal >= (uint32_t)dev->world_size ||
	    (h->src_ordinal >= (uint32_t)local_lo &&
	     h->src_ordinal < (uint32_t)(local_lo + dev->cores_per_host)))
		rv = status_set(st, ST_INVALID_ARGUMENT, "chunk from core %u, which is no peer",
		                h->src_ordinal);
	else if (dev->backed && (h->total != (uint64_t)slot->shard_bytes || h->offset > h->total ||
	                         h->length > h->total - h->offset))
		rv = status_set(st, ST_INVALID_ARGUMENT,
		                "chunk [%llu, +%llu) of a %llu-byte shard does not fit the "
		                "%lld-byte shard of node %d",
		                (unsigned long long)h->offset, (unsigned long long)h->length,
		                (unsigned long long)h->total, (long long)slot->shard_bytes,
		                slot->node);
	else if (!dev->backed && h->length != 0)
		rv = status_set(st, ST_INVALID_ARGUMENT,
		                "host %d has no backing store but received %llu bytes",
		                dev->host_index, (unsigned long long)h->length);
	if (rv == ST_OK && h->length > 0)
		for (int c = 0; c < dev->cores_per_host; c++)
			scatter_shard(slot, slot->out[c], (int)h->src_ordinal, payload,
			              (int64_t)h->offset, (int64_t)h->length);
	pthread_mutex_lock(&dev->lock);
	slot->copying--;
	if (rv == ST_OK) {
		slot->recv_bytes += (int64_t)h->length;
		if (h->flags & DP_FLAG_LAST) {
			slot->recv_last++;
			slot->src_done[h->src_ordinal] = 1;
		}
	} else if (slot->code == ST_OK) {
		slot->code = rv;
		snprintf(slot->message, sizeof(slot->message), "%s", st->message);
	}
	pthread_cond_broadcast(&dev->cv);
	pthread_mutex_unlock(&dev->lock);
	(void)s;
	return rv;
}

int device_deliver(void *arg, struct dp_request *req, const struct dp_header *h,
                   const void *payload, struct status *st)
{
	struct device *dev = arg;
	pthread_mutex_lock(&dev->lock);
	struct step *s = dev->step;
	if (s == NULL || s->id != h->step_id) {
		pthread_mutex_unlock(&dev->lock);
		return status_set(st, ST_FAILED_PRECONDITION, "host %d has no step %llu",
		                  dev->host_index, (unsigned long long)h->step_id);
	}
	if (h->collective >= (uint32_t)s->num_colls) {
		pthread_mutex_unlock(&dev->lock);
		return status_set(st, ST_INVALID_ARGUMENT, "step %llu has no collective %u",
		                  (unsigned long long)h->step_id, h->collective);
	}
	struct coll_slot *slot = &s->colls[h->collective];
	if (!slot->active) {
		if (slot->num_parked == slot->cap_parked) {
			int cap = slot->cap_parked ? slot->cap_parked * 2 : 16;
			void *p = realloc(slot->parked, (size_t)cap * sizeof(*slot->parked));
			if (p == NULL) {
				pthread_mutex_unlock(&dev->lock);
				return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
			}
			slot->parked = p;
			slot->cap_parked = cap;
		}
		slot->parked[slot->num_parked++] = req;
		pthread_mutex_unlock(&dev->lock);
		return DP_PARKED;
	}
	slot->copying++;
	pthread_mutex_unlock(&dev->lock);
	return deliver_active(dev, s, slot, h, payload, st);
}

/* Lists the cores whose data never arrived, for a deadline message. */
static void missing_sources(struct device *dev, const struct coll_slot *slot, char *buf, size_t len)
{
	size_t used = 0;
	buf[0] = '\0';
	int local_lo = dev->host_index * dev->cores_per_host;
	for (int r = 0; r < dev->world_size && used + 16 < len; r++) {
		if (r >= local_lo && r < local_lo + dev->cores_per_host)
			continue;
		if (!slot->src_done[r])
			used +=
			    (size_t)snprintf(buf + used, len - used, "%s%d", used ? "," : "", r);
	}
}

static int run_all_gather(struct device *dev, struct step *s, struct core *c, int node,
                          struct status *st)
{
	struct coll_slot *slot = &s->colls[s->coll_of_node[node]];
	const void *in = core_ptr(c, s, (int)s->prog->graph->nodes[node]->operands[0]);
	struct timespec deadline;
	deadline_after(&deadline, s->timeout_ms);
	struct dp_request **parked = NULL;
	int num_parked = 0;

	pthread_mutex_lock(&dev->lock);
	slot->in[c->local] = in;
	slot->out[c->local] = core_ptr(c, s, node);
	if (++slot->arrived == dev->cores_per_host) {
		slot->active = true;
		parked = slot->parked;
		num_parked = slot->num_parked;
		slot->parked = NULL;
		slot->num_parked = slot->cap_parked = 0;
		slot->copying += num_parked;
		pthread_cond_broadcast(&dev->cv);
	}
	while (!slot->active && slot->code == ST_OK)
		if (pthread_cond_timedwait(&dev->cv, &dev->lock, &deadline) == ETIMEDOUT) {
			slot->code = ST_DEADLINE_EXCEEDED;
			snprintf(slot->message, sizeof(slot->message),
			         "only %d of %d cores of host %d reached the collective",
			         slot->arrived, dev->cores_per_host, dev->host_index);
			pthread_cond_broadcast(&dev->cv);
		}
	bool go = slot->active;
	pthread_mutex_unlock(&dev->lock);

	for (int p = 0; p < num_parked; p++) {
		struct status pst;
		status_clear(&pst);
		int rv = deliver_active(dev, s, slot, dp_request_header(parked[p]),
		                        dp_request_payload(parked[p]), &pst);
		dp_complete(parked[p], rv, pst.message);
	}
	free(parked);

	int rv = ST_OK;
	if (go && dev->backed)
		for (int k = 0; k < dev->cores_per_host; k++)
			scatter_shard(slot, slot->out[k], c->ordinal, in, 0, slot->shard_bytes);
	if (go) {
		struct dp_header h = {.step_id = s->id,
		                      .collective = (uint32_t)s->coll_of_node[node],
		                      .src_ordinal = (uint32_t)c->ordinal};
		struct status sst;
		rv = dp_send(dev->dp, s->remote_urls, s->num_remote, &h, dev->backed ? in : NULL,
		             dev->backed ? (uint64_t)slot->shard_bytes : 0,
		             (uint64_t)s->chunk_bytes, dev->window, s->timeout_ms, &sst);
		if (rv != ST_OK)
			status_set(st, rv, "%s", sst.message);
	}

	pthread_mutex_lock(&dev->lock);
	slot->local_done++;
	if (rv != ST_OK && slot->code == ST_OK) {
		slot->code = rv;
		snprintf(slot->message, sizeof(slot->message), "%s", st->message);
	}
	pthread_cond_broadcast(&dev->cv);
	int remote_cores = dev->world_size - dev->cores_per_host;
	int64_t expect_bytes = dev->backed ? (int64_t)remote_cores * slot->shard_bytes : 0;
	while (slot->code == ST_OK &&
	       !(slot->local_done == dev->cores_per_host && slot->recv_last == remote_cores &&
	         slot->recv_bytes == expect_bytes)) {
		if (pthread_cond_timedwait(&dev->cv, &dev->lock, &deadline) == ETIMEDOUT) {
			char missing[512];
			missing_sources(dev, slot, missing, sizeof(missing));
			slot->code = ST_DEADLINE_EXCEEDED;
			snprintf(slot->message, sizeof(slot->message),
			         "collective did not complete within %d ms; no data from cores "
			         "[%s]",
			         s->timeout_ms, missing);
			pthread_cond_broadcast(&dev->cv);
		}
	}
	rv = slot->code;
	if (rv != ST_OK)
		status_set(st, rv, "all-gather (node %d) on core %d: %s", node, c->ordinal,
		           slot->message);
	pthread_mutex_unlock(&dev->lock);
	return rv;
}

static int run_core(struct device *dev, struct step *s, struct core *c, struct status *st)
{
	const Podemu__Graph *g = s->prog->graph;
	for (size_t i = 0; i < g->n_nodes; i++) {
		enum opcode op = s->ops[i];
		if (op == OP_PARAMETER || op == OP_OPT_BARRIER || op == OP_GET_TUPLE_ELEMENT)
			continue;
		if (op == OP_ALL_GATHER) {
			int rv = run_all_gather(dev, s, c, (int)i, st);
			if (rv != ST_OK)
				return rv;
			continue;
		}
		if (!dev->backed)
			continue;
		const Podemu__Node *n = g->nodes[i];
		struct kernel_call k = {.op = op,
		                        .node = n,
		                        .out_shape = &s->shapes[i],
		                        .out = core_ptr(c, s, (int)i),
		                        .num_in = (int)n->n_operands,
		                        .replica_id = c->ordinal};
		if (n->n_operands > KERNEL_MAX_OPERANDS)
			return status_set(st, ST_UNIMPLEMENTED,
			                  "%s (node %zu) has too many operands", n->opcode, i);
		for (size_t j = 0; j < n->n_operands; j++) {
			k.in_shapes[j] = &s->shapes[n->operands[j]];
			k.in[j] = core_ptr(c, s, n->operands[j]);
		}
		int rv = kernel_run(&k, st);
		if (rv != ST_OK)
			return status_set(st, rv, "%s (node %zu) on core %d: %s", n->opcode, i,
			                  c->ordinal, st->message);
	}
	return ST_OK;
}

void *device_core_main(void *arg)
{
	struct core *c = arg;
	struct device *dev = c->dev;
	pthread_mutex_lock(&dev->lock);
	for (;;) {
		while (!dev->stopping && c->pending == NULL)
			pthread_cond_wait(&dev->cv, &dev->lock);
		if (dev->stopping)
			break;
		struct step *s = c->pending;
		pthread_mutex_unlock(&dev->lock);
		struct status st;
		status_clear(&st);
		run_core(dev, s, c, &st);
		pthread_mutex_lock(&dev->lock);
		s->core_status[c->local] = st;
		c->pending = NULL;
		s->done_cores++;
		pthread_cond_broadcast(&dev->cv);
	}
	pthread_mutex_unlock(&dev->lock);
	return NULL;
}

/* Publishes a finished step's outputs as device buffers. Lock held. */
static int step_publish(struct device *dev, struct step *s, struct status *st)
{
	for (size_t i = 0; i < s->prog->n_buffers; i++) {
		const Podemu__BufferAssignment *b = s->prog->buffers[i];
		if (b->kind != PODEMU__BUFFER_KIND__BUFFER_OUTPUT)
			continue;
		int64_t *offsets = calloc((size_t)dev->cores_per_host, sizeof(int64_t));
		if (offsets == NULL)
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		for (int c = 0; c < dev->cores_per_host; c++) {
			offsets[c] = s->offsets[c][i];
			s->offsets[c][i] = -1; /* now owned by the buffer */
		}
		int rv = device_add_buffer(dev, b->handle, &s->shapes[i], offsets, st);
		if (rv != ST_OK) {
			for (int c = 0; c < dev->cores_per_host; c++)
				s->offsets[c][i] = offsets[c];
			free(offsets);
			return rv;
		}
	}
	return ST_OK;
}

int device_run(struct device *dev, uint64_t step_id, const uint64_t *release_after,
               size_t n_release, struct status *st)
{
	pthread_mutex_lock(&dev->lock);
	struct step *s = dev->step;
	if (s == NULL || s->id != step_id || s->running) {
		pthread_mutex_unlock(&dev->lock);
		return status_set(st, ST_FAILED_PRECONDITION, "host %d has no prepared step %llu",
		                  dev->host_index, (unsigned long long)step_id);
	}
	s->running = true;
	for (int c = 0; c < dev->cores_per_host; c++)
		dev->cores[c].pending = s;
	pthread_cond_broadcast(&dev->cv);
	while (s->done_cores < dev->cores_per_host)
		pthread_cond_wait(&dev->cv, &dev->lock);
	int rv = ST_OK;
	for (int c = 0; c < dev->cores_per_host && rv == ST_OK; c++)
		if (s->core_status[c].code != ST_OK)
			rv =
			    status_set(st, s->core_status[c].code, "%s", s->core_status[c].message);
	if (rv == ST_OK)
		rv = step_publish(dev, s, st);
	step_free_outputs(dev, s);
	step_destroy(dev, s, ST_ABORTED, "step failed on the receiving host");
	pthread_mutex_unlock(&dev->lock);
	if (n_release > 0) {
		struct status rst;
		device_release(dev, release_after, n_release, &rst);
	}
	return rv;
}
