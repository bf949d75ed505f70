#include "podemu/podemu.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "arena.h"
#include "client.h"
#include "collective.h"
#include "dtype.h"
#include "graph.h"
#include "podemu.pb-c.h"
#include "rpc.h"
#include "services.h"
#include "statedir.h"
#include "status.h"

static _Thread_local char connect_error[STATUS_MESSAGE_MAX + 64];

int client_fail(pe_client *c, int code, const char *fmt, ...)
{
	char msg[STATUS_MESSAGE_MAX];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	c->code = code;
	snprintf(c->error, sizeof(c->error), "%s: %s", status_code_name(code), msg);
	return code;
}

int client_fail_status(pe_client *c, const struct status *st)
{
	return client_fail(c, st->code, "%s", st->message);
}

const char *pe_code_name(int code)
{
	return status_code_name(code);
}

const char *pe_connect_error(void)
{
	return connect_error;
}

const char *pe_last_error(const pe_client *c)
{
	return c->error;
}

int pe_last_code(const pe_client *c)
{
	return c->code;
}

int pe_world_size(const pe_client *c)
{
	return c->world_size;
}

const char *pe_backing(const pe_client *c)
{
	return c->backing;
}

int pe_num_hosts(const pe_client *c)
{
	return c->num_hosts;
}

const char *pe_topology(const pe_client *c)
{
	return c->topology;
}

/* One RPC to the coordinator with a fresh arena that the caller frees. */
int client_call(pe_client *c, unsigned method, const void *req, struct arena **a, void **reply,
                int timeout_ms)
{
	struct status st;
	/* Whatever this call reads or changes, the step sent before it has done its part. */
	client_finish_async(c);
	*a = arena_new();
	if (*a == NULL)
		return client_fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
	int rv = rpc_call(c->rpc, &podemu__coordinator__descriptor, method, req, *a, reply,
	                  timeout_ms, &st);
	if (rv != ST_OK)
		client_fail_status(c, &st);
	return rv;
}

int pe_wait_ready(pe_client *c, int timeout_ms)
{
	struct timespec t0, now;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	char why[STATUS_MESSAGE_MAX] = "no answer from the coordinator";
	for (;;) {
		Podemu__StatusRequest req = PODEMU__STATUS_REQUEST__INIT;
		struct arena *a;
		void *reply;
		int rv = client_call(c, CM_GET_STATUS, &req, &a, &reply, CALL_TIMEOUT_MS);
		bool ready = rv == ST_OK && ((Podemu__PodStatus *)reply)->ready;
		struct status sst;
		if (ready &&
		    client_session_follow(c, ((Podemu__PodStatus *)reply)->coordinator_epoch,
		                          &sst) != ST_OK) {
			ready = false;
			snprintf(why, sizeof(why), "cannot open a session: %s", sst.message);
		}
		if (rv == ST_OK && !ready)
			snprintf(why, sizeof(why), "%s", ((Podemu__PodStatus *)reply)->reason);
		else if (rv != ST_OK)
			snprintf(why, sizeof(why), "%s", c->error);
		arena_free(a);
		if (ready) {
			c->code = PE_OK;
			c->error[0] = '\0';
			return PE_OK;
		}
		clock_gettime(CLOCK_MONOTONIC, &now);
		if ((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000 >=
		    timeout_ms)
			return client_fail(c, ST_DEADLINE_EXCEEDED,
			                   "the pod was not ready within %d ms: %s", timeout_ms,
			                   why);
		struct timespec pause = {0, 50 * 1000000};
		nanosleep(&pause, NULL);
	}
}

int client_graph_reset(pe_client *c)
{
	client_computations_free(c);
	arena_free(c->graph_arena);
	free(c->nodes);
	free(c->shapes);
	c->nodes = NULL;
	c->shapes = NULL;
	c->num_nodes = c->cap_nodes = 0;
	c->num_release = 0;
	c->graph_arena = arena_new();
	return c->graph_arena ? ST_OK : ST_RESOURCE_EXHAUSTED;
}

int pe_connect(pe_client **out, const char *url)
{
	char resolved[512];
	struct status st;
	*out = NULL;
	if (url == NULL)
		state_coordinator_url(resolved, sizeof(resolved), NULL);
	else
		snprintf(resolved, sizeof(resolved), "%s", url);
	pe_client *c = calloc(1, sizeof(*c));
	if (c == NULL) {
		snprintf(connect_error, sizeof(connect_error), "RESOURCE_EXHAUSTED: out of memory");
		return PE_RESOURCE_EXHAUSTED;
	}
	int rv = rpc_client_open(&c->rpc, resolved, false, &st);
	if (rv == ST_OK) {
		char token[128];
		state_token(token, sizeof(token), NULL);
		rpc_client_set_token(c->rpc, token);
	}
	if (rv == ST_OK && (c->long_arena = arena_new()) == NULL)
		rv = status_set(&st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	if (rv == ST_OK && client_graph_reset(c) != ST_OK)
		rv = status_set(&st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	if (rv == ST_OK)
		rv = client_session_open(c, &st);
	if (rv == ST_OK) {
		Podemu__StatusRequest req = PODEMU__STATUS_REQUEST__INIT;
		struct arena *a;
		void *reply;
		rv = client_call(c, CM_GET_STATUS, &req, &a, &reply, 10000);
		if (rv == ST_OK) {
			Podemu__PodStatus *ps = reply;
			snprintf(c->topology, sizeof(c->topology), "%s", ps->topology);
			c->world_size = ps->world_size;
			c->num_hosts = ps->num_hosts;
			for (size_t h = 0; h < ps->n_hosts && c->backing[0] == '\0'; h++)
				if (ps->hosts[h]->backing != NULL &&
				    ps->hosts[h]->backing[0] != '\0')
					snprintf(c->backing, sizeof(c->backing), "%s",
					         ps->hosts[h]->backing);
		} else {
			status_set(&st, rv, "%s", c->error);
		}
		arena_free(a);
	}
	if (rv != ST_OK) {
		snprintf(connect_error, sizeof(connect_error), "%s: %s", status_code_name(rv),
		         st.message);
		client_session_close(c);
		rpc_client_close(c->rpc);
		arena_free(c->graph_arena);
		arena_free(c->long_arena);
		free(c);
		return rv;
	}
	*out = c;
	return PE_OK;
}

void pe_disconnect(pe_client *c)
{
	if (c == NULL)
		return;
	/* Closing the session frees every buffer it owns, on every host, in one call. */
	if (!client_forked(c))
		client_finish_async(c);
	c->closing = true;
	while (c->tensors != NULL)
		pe_release(c->tensors);
	/* A forked child leaves the parent's session, keeper and socket alone. */
	if (!client_forked(c)) {
		client_session_close(c);
		rpc_client_close(c->rpc);
	}
	client_computations_free(c);
	arena_free(c->graph_arena);
	arena_free(c->long_arena);
	free(c->nodes);
	free(c->shapes);
	free(c->release_after);
	free(c->coll_micros);
	free(c->coll_algorithms);
	free(c->coll_scratch);
	free(c->coll_on_core);
	free(c);
}

pe_tensor *client_tensor_new(pe_client *c, const struct shape *shape, int node, uint64_t handle)
{
	pe_tensor *t = calloc(1, sizeof(*t));
	if (t == NULL) {
		client_fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
		return NULL;
	}
	t->c = c;
	t->shape = *shape;
	t->node = node;
	t->handle = handle;
	t->recording = c->recording;
	t->next = c->tensors;
	if (c->tensors)
		c->tensors->prev = t;
	c->tensors = t;
	return t;
}

/* A new node of the pending graph, zeroed, with opcode set. */
Podemu__Node *client_node_new(pe_client *c, enum opcode op)
{
	if (c->num_nodes == c->cap_nodes) {
		int cap = c->cap_nodes ? c->cap_nodes * 2 : 64;
		Podemu__Node **nodes = realloc(c->nodes, (size_t)cap * sizeof(*nodes));
		if (nodes != NULL)
			c->nodes = nodes;
		struct shape *shapes = realloc(c->shapes, (size_t)cap * sizeof(*shapes));
		if (shapes != NULL)
			c->shapes = shapes;
		if (nodes == NULL || shapes == NULL) {
			client_fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
			return NULL;
		}
		c->cap_nodes = cap;
	}
	Podemu__Node *n = arena_alloc(c->graph_arena, sizeof(*n));
	if (n == NULL) {
		client_fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
		return NULL;
	}
	podemu__node__init(n);
	n->opcode = (char *)opcode_name(op);
	return n;
}

int64_t *client_dims_copy(pe_client *c, const int64_t *dims, size_t n)
{
	int64_t *p = arena_calloc(c->graph_arena, n + 1, sizeof(int64_t));
	if (p != NULL && n > 0)
		memcpy(p, dims, n * sizeof(int64_t));
	return p;
}

Podemu__Shape *client_shape_new(pe_client *c, int dtype, const int64_t *dims, int rank)
{
	Podemu__Shape *s = arena_alloc(c->graph_arena, sizeof(*s));
	if (s == NULL)
		return NULL;
	podemu__shape__init(s);
	s->dtype = (Podemu__DType)dtype;
	if (rank > 0) {
		s->dims = client_dims_copy(c, dims, (size_t)rank);
		s->n_dims = (size_t)rank;
	}
	return s;
}

/* Infers the node's shape and appends it; returns its index or -1. */
int client_node_add(pe_client *c, Podemu__Node *n)
{
	struct status st;
	struct shape shape;
	c->nodes[c->num_nodes] = n;
	struct graph_env env = {.world_size = c->world_size,
	                        .mesh = c->mesh,
	                        .n_mesh = c->num_mesh,
	                        .arena = c->graph_arena,
	                        .in_computation = c->recording != 0,
	                        .n_comps = c->num_comps,
	                        .comps = c->comps,
	                        .comp_shapes = (const struct shape *const *)c->comp_shapes};
	if (graph_infer_node(&shape, c->nodes, c->num_nodes, c->shapes, &env, &st) != ST_OK) {
		client_fail_status(c, &st);
		return -1;
	}
	c->shapes[c->num_nodes] = shape;
	return c->num_nodes++;
}

pe_tensor *client_node_tensor(pe_client *c, Podemu__Node *n)
{
	int index = client_node_add(c, n);
	if (index < 0)
		return NULL;
	return client_tensor_new(c, &c->shapes[index], index, 0);
}

/* The node that reads tensor t in the pending graph: its own node, or a parameter. */
int client_operand_of(pe_tensor *t)
{
	pe_client *c = t->c;
	if (t->recording != c->recording || (t->node < 0 && c->recording != 0)) {
		client_fail(c, ST_INVALID_ARGUMENT,
		            "a tensor from outside the computation being recorded; pass it in as "
		            "an argument (or the state of the loop)");
		return -1;
	}
	if (t->node >= 0)
		return t->node;
	if (t->handle == 0) {
		client_fail(c, ST_FAILED_PRECONDITION,
		            "tensor belongs to a step that failed; it has no value");
		return -1;
	}
	for (int i = 0; i < c->num_nodes; i++)
		if (c->nodes[i]->handle == t->handle &&
		    strcmp(c->nodes[i]->opcode, "parameter") == 0)
			return i;
	Podemu__Node *n = client_node_new(c, OP_PARAMETER);
	if (n == NULL)
		return -1;
	n->handle = t->handle;
	n->shape = client_shape_new(c, t->shape.dtype, t->shape.dims, t->shape.rank);
	return n->shape ? client_node_add(c, n) : -1;
}

pe_tensor *client_unary(pe_tensor *a, Podemu__Node *n)
{
	if (n == NULL)
		return NULL;
	int o = client_operand_of(a);
	if (o < 0)
		return NULL;
	n->operands = arena_calloc(a->c->graph_arena, 1, sizeof(int32_t));
	if (n->operands == NULL)
		return NULL;
	n->operands[0] = o;
	n->n_operands = 1;
	return client_node_tensor(a->c, n);
}

int pe_tensor_shape(const pe_tensor *t, pe_dtype *dtype, int64_t *dims, int *rank)
{
	if (t == NULL)
		return PE_INVALID_ARGUMENT;
	if (dtype)
		*dtype = (pe_dtype)t->shape.dtype;
	if (rank)
		*rank = t->shape.rank;
	if (dims)
		memcpy(dims, t->shape.dims, (size_t)t->shape.rank * sizeof(int64_t));
	return PE_OK;
}

int64_t pe_tensor_bytes(const pe_tensor *t)
{
	return t ? shape_bytes(&t->shape) : 0;
}

static void memory_from_proto(pe_memory_info *out, const Podemu__CoreMemory *m)
{
	memset(out, 0, sizeof(*out));
	out->ordinal = m->ordinal;
	out->host = m->host;
	out->bytes_used = m->bytes_in_use;
	out->bytes_limit = m->bytes_limit;
	out->peak_bytes_used = m->peak_bytes_in_use;
	out->bytes_in_use = m->bytes_in_use;
	out->peak_bytes_in_use = m->peak_bytes_in_use;
	out->num_allocs = m->num_allocs;
	out->largest_alloc_size = m->largest_alloc_size;
	out->bytes_reserved = m->bytes_reserved;
	out->peak_bytes_reserved = m->peak_bytes_reserved;
	out->bytes_reservable_limit = m->bytes_reservable_limit;
	out->largest_free_block_bytes = m->largest_free_block_bytes;
}

static int memory_call(pe_client *c, int ordinal, pe_memory_info *out, int n)
{
	Podemu__MemoryStatsRequest req = PODEMU__MEMORY_STATS_REQUEST__INIT;
	req.ordinal = ordinal;
	struct arena *a;
	void *reply;
	int rv = client_call(c, CM_GET_MEMORY_STATS, &req, &a, &reply, CALL_TIMEOUT_MS);
	if (rv == ST_OK) {
		Podemu__MemoryStatsReply *rep = reply;
		if (rep->n_cores < (size_t)n)
			rv = client_fail(c, ST_INTERNAL,
			                 "coordinator returned %zu cores, expected %d",
			                 rep->n_cores, n);
		for (int i = 0; rv == ST_OK && i < n; i++)
			memory_from_proto(&out[i], rep->cores[i]);
	}
	arena_free(a);
	return rv;
}

int pe_memory_info_get(pe_client *c, int ordinal, pe_memory_info *out)
{
	if (ordinal < 0 || ordinal >= c->world_size)
		return client_fail(c, ST_INVALID_ARGUMENT, "core %d is out of range [0, %d)",
		                   ordinal, c->world_size);
	return memory_call(c, ordinal, out, 1);
}

int pe_memory_info_all(pe_client *c, pe_memory_info *out, int n)
{
	if (n < c->world_size)
		return client_fail(c, ST_INVALID_ARGUMENT, "room for %d cores, the pod has %d", n,
		                   c->world_size);
	return memory_call(c, -1, out, c->world_size);
}
