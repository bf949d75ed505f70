#include "podemu/podemu.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "arena.h"
#include "collective.h"
#include "dtype.h"
#include "graph.h"
#include "podemu.pb-c.h"
#include "rpc.h"
#include "services.h"
#include "statedir.h"
#include "status.h"

#define CALL_TIMEOUT_MS 60000
#define STEP_TIMEOUT_MS (3600 * 1000)

struct pe_tensor {
	pe_client *c;
	pe_tensor *prev, *next;
	struct shape shape;
	int node;        /* >= 0: pending, the node of the current graph */
	uint64_t handle; /* != 0: a device buffer */
};

struct pe_client {
	struct rpc_client *rpc;
	int code;
	char error[STATUS_MESSAGE_MAX + 64];
	char topology[64];
	int world_size;
	int num_hosts;
	pe_tensor *tensors;
	/* The pending graph. */
	struct arena *graph_arena;
	Podemu__Node **nodes;
	struct shape *shapes;
	int num_nodes;
	int cap_nodes;
	uint64_t *release_after;
	size_t num_release;
	size_t cap_release;
	/* The device mesh and every pe_groups made, which live as long as the client. */
	struct arena *long_arena;
	Podemu__MeshAxis **mesh;
	size_t num_mesh;
	/* The last step's collectives: node indices, timings, algorithms, scratch. */
	int num_colls;
	int64_t *coll_micros;
	char **coll_algorithms;
	int64_t *coll_scratch;
};

struct pe_groups {
	const char *axis; /* a mesh axis, or NULL */
	Podemu__ReplicaGroup **groups;
	size_t num_groups;
};

static _Thread_local char connect_error[STATUS_MESSAGE_MAX + 64];

static int fail(pe_client *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(pe_client *c, int code, const char *fmt, ...)
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

static int fail_status(pe_client *c, const struct status *st)
{
	return fail(c, st->code, "%s", st->message);
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

int pe_num_hosts(const pe_client *c)
{
	return c->num_hosts;
}

const char *pe_topology(const pe_client *c)
{
	return c->topology;
}

/* One RPC to the coordinator with a fresh arena that the caller frees. */
static int call(pe_client *c, unsigned method, const void *req, struct arena **a, void **reply,
                int timeout_ms)
{
	struct status st;
	*a = arena_new();
	if (*a == NULL)
		return fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
	int rv = rpc_call(c->rpc, &podemu__coordinator__descriptor, method, req, *a, reply,
	                  timeout_ms, &st);
	if (rv != ST_OK)
		fail_status(c, &st);
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
		int rv = call(c, CM_GET_STATUS, &req, &a, &reply, CALL_TIMEOUT_MS);
		bool ready = rv == ST_OK && ((Podemu__PodStatus *)reply)->ready;
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
			return fail(c, ST_DEADLINE_EXCEEDED,
			            "the pod was not ready within %d ms: %s", timeout_ms, why);
		struct timespec pause = {0, 50 * 1000000};
		nanosleep(&pause, NULL);
	}
}

static int graph_reset(pe_client *c)
{
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
	if (rv == ST_OK && graph_reset(c) != ST_OK)
		rv = status_set(&st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	if (rv == ST_OK) {
		Podemu__StatusRequest req = PODEMU__STATUS_REQUEST__INIT;
		struct arena *a;
		void *reply;
		rv = call(c, CM_GET_STATUS, &req, &a, &reply, 10000);
		if (rv == ST_OK) {
			Podemu__PodStatus *ps = reply;
			snprintf(c->topology, sizeof(c->topology), "%s", ps->topology);
			c->world_size = ps->world_size;
			c->num_hosts = ps->num_hosts;
		} else {
			status_set(&st, rv, "%s", c->error);
		}
		arena_free(a);
	}
	if (rv != ST_OK) {
		snprintf(connect_error, sizeof(connect_error), "%s: %s", status_code_name(rv),
		         st.message);
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
	while (c->tensors != NULL)
		pe_release(c->tensors);
	if (c->num_release > 0) {
		/* Buffers that only the abandoned graph still read. */
		Podemu__ReleaseRequest req = PODEMU__RELEASE_REQUEST__INIT;
		req.handles = c->release_after;
		req.n_handles = c->num_release;
		struct arena *a;
		void *reply;
		call(c, CM_RELEASE, &req, &a, &reply, CALL_TIMEOUT_MS);
		arena_free(a);
	}
	rpc_client_close(c->rpc);
	arena_free(c->graph_arena);
	arena_free(c->long_arena);
	free(c->nodes);
	free(c->shapes);
	free(c->release_after);
	free(c->coll_micros);
	free(c->coll_algorithms);
	free(c->coll_scratch);
	free(c);
}

static pe_tensor *tensor_new(pe_client *c, const struct shape *shape, int node, uint64_t handle)
{
	pe_tensor *t = calloc(1, sizeof(*t));
	if (t == NULL) {
		fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
		return NULL;
	}
	t->c = c;
	t->shape = *shape;
	t->node = node;
	t->handle = handle;
	t->next = c->tensors;
	if (c->tensors)
		c->tensors->prev = t;
	c->tensors = t;
	return t;
}

/* A new node of the pending graph, zeroed, with opcode set. */
static Podemu__Node *node_new(pe_client *c, enum opcode op)
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
			fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
			return NULL;
		}
		c->cap_nodes = cap;
	}
	Podemu__Node *n = arena_alloc(c->graph_arena, sizeof(*n));
	if (n == NULL) {
		fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
		return NULL;
	}
	podemu__node__init(n);
	n->opcode = (char *)opcode_name(op);
	return n;
}

static int64_t *dims_copy(pe_client *c, const int64_t *dims, size_t n)
{
	int64_t *p = arena_calloc(c->graph_arena, n + 1, sizeof(int64_t));
	if (p != NULL && n > 0)
		memcpy(p, dims, n * sizeof(int64_t));
	return p;
}

static Podemu__Shape *shape_new(pe_client *c, int dtype, const int64_t *dims, int rank)
{
	Podemu__Shape *s = arena_alloc(c->graph_arena, sizeof(*s));
	if (s == NULL)
		return NULL;
	podemu__shape__init(s);
	s->dtype = (Podemu__DType)dtype;
	if (rank > 0) {
		s->dims = dims_copy(c, dims, (size_t)rank);
		s->n_dims = (size_t)rank;
	}
	return s;
}

/* Infers the node's shape and appends it; returns its index or -1. */
static int node_add(pe_client *c, Podemu__Node *n)
{
	struct status st;
	struct shape shape;
	c->nodes[c->num_nodes] = n;
	struct graph_env env = {c->world_size, c->mesh, c->num_mesh};
	if (graph_infer_node(&shape, c->nodes, c->num_nodes, c->shapes, &env, &st) != ST_OK) {
		fail_status(c, &st);
		return -1;
	}
	c->shapes[c->num_nodes] = shape;
	return c->num_nodes++;
}

static pe_tensor *node_tensor(pe_client *c, Podemu__Node *n)
{
	int index = node_add(c, n);
	if (index < 0)
		return NULL;
	return tensor_new(c, &c->shapes[index], index, 0);
}

/* The node that reads tensor t in the pending graph: its own node, or a parameter. */
static int operand_of(pe_tensor *t)
{
	pe_client *c = t->c;
	if (t->node >= 0)
		return t->node;
	if (t->handle == 0) {
		fail(c, ST_FAILED_PRECONDITION,
		     "tensor belongs to a step that failed; it has no value");
		return -1;
	}
	for (int i = 0; i < c->num_nodes; i++)
		if (c->nodes[i]->handle == t->handle &&
		    strcmp(c->nodes[i]->opcode, "parameter") == 0)
			return i;
	Podemu__Node *n = node_new(c, OP_PARAMETER);
	if (n == NULL)
		return -1;
	n->handle = t->handle;
	n->shape = shape_new(c, t->shape.dtype, t->shape.dims, t->shape.rank);
	return n->shape ? node_add(c, n) : -1;
}

static pe_tensor *unary(pe_tensor *a, Podemu__Node *n)
{
	if (n == NULL)
		return NULL;
	int o = operand_of(a);
	if (o < 0)
		return NULL;
	n->operands = arena_calloc(a->c->graph_arena, 1, sizeof(int32_t));
	if (n->operands == NULL)
		return NULL;
	n->operands[0] = o;
	n->n_operands = 1;
	return node_tensor(a->c, n);
}

pe_tensor *pe_full(pe_client *c, pe_dtype dtype, const int64_t *dims, int rank, double value)
{
	Podemu__Node *n = node_new(c, OP_CONSTANT);
	if (n == NULL || rank < 0 || rank > PE_MAX_RANK) {
		if (n != NULL)
			fail(c, ST_INVALID_ARGUMENT, "rank %d is out of range [0, %d]", rank,
			     PE_MAX_RANK);
		return NULL;
	}
	n->value = value;
	n->shape = shape_new(c, dtype, dims, rank);
	return n->shape ? node_tensor(c, n) : NULL;
}

pe_tensor *pe_iota(pe_client *c, pe_dtype dtype, const int64_t *dims, int rank, int dimension)
{
	Podemu__Node *n = node_new(c, OP_IOTA);
	if (n == NULL || rank < 0 || rank > PE_MAX_RANK) {
		if (n != NULL)
			fail(c, ST_INVALID_ARGUMENT, "rank %d is out of range [0, %d]", rank,
			     PE_MAX_RANK);
		return NULL;
	}
	int64_t d = dimension;
	n->dimensions = dims_copy(c, &d, 1);
	n->n_dimensions = 1;
	n->shape = shape_new(c, dtype, dims, rank);
	return n->shape ? node_tensor(c, n) : NULL;
}

pe_tensor *pe_replica_id(pe_client *c)
{
	Podemu__Node *n = node_new(c, OP_REPLICA_ID);
	return n ? node_tensor(c, n) : NULL;
}

pe_tensor *pe_upload(pe_client *c, pe_dtype dtype, const int64_t *dims, int rank,
                     const void *const *per_core)
{
	struct shape shape;
	struct status st;
	if (rank < 0 || rank > PE_MAX_RANK) {
		fail(c, ST_INVALID_ARGUMENT, "rank %d is out of range [0, %d]", rank, PE_MAX_RANK);
		return NULL;
	}
	if (shape_make(&shape, dtype, dims, rank, &st) != ST_OK) {
		fail_status(c, &st);
		return NULL;
	}
	struct arena *scratch = arena_new();
	Podemu__Shape *ps = NULL;
	if (scratch != NULL && (ps = arena_alloc(scratch, sizeof(*ps))) != NULL) {
		podemu__shape__init(ps);
		ps->dtype = (Podemu__DType)dtype;
		ps->dims = (int64_t *)dims;
		ps->n_dims = (size_t)rank;
	}
	if (ps == NULL) {
		arena_free(scratch);
		fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
		return NULL;
	}
	Podemu__CreateBufferRequest req = PODEMU__CREATE_BUFFER_REQUEST__INIT;
	req.shape = ps;
	struct arena *a;
	void *reply;
	int rv = call(c, CM_CREATE_BUFFER, &req, &a, &reply, CALL_TIMEOUT_MS);
	uint64_t handle = rv == ST_OK ? ((Podemu__CreateBufferReply *)reply)->handle : 0;
	arena_free(a);
	arena_free(scratch);
	if (rv != ST_OK)
		return NULL;
	pe_tensor *t = tensor_new(c, &shape, -1, handle);
	if (t == NULL)
		return NULL;
	int64_t total = shape_bytes(&shape);
	void *zeros = NULL;
	for (int core = 0; core < c->world_size && rv == ST_OK; core++) {
		const void *src = per_core ? per_core[core] : NULL;
		if (src == NULL) {
			if (zeros == NULL)
				zeros = calloc(1, RPC_TRANSFER_CHUNK_BYTES);
			if (zeros == NULL) {
				rv = fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
				break;
			}
		}
		for (int64_t off = 0; off < total && rv == ST_OK; off += RPC_TRANSFER_CHUNK_BYTES) {
			int64_t len = total - off < RPC_TRANSFER_CHUNK_BYTES
			                  ? total - off
			                  : RPC_TRANSFER_CHUNK_BYTES;
			Podemu__TransferToDeviceRequest tr =
			    PODEMU__TRANSFER_TO_DEVICE_REQUEST__INIT;
			tr.handle = handle;
			tr.ordinal = core;
			tr.offset = off;
			tr.data.data = (uint8_t *)(src ? (const char *)src + off : zeros);
			tr.data.len = (size_t)len;
			rv = call(c, CM_TRANSFER_TO_DEVICE, &tr, &a, &reply, CALL_TIMEOUT_MS);
			arena_free(a);
		}
	}
	free(zeros);
	if (rv != ST_OK) {
		int code = c->code;
		char saved[sizeof(c->error)];
		memcpy(saved, c->error, sizeof(saved));
		pe_release(t);
		c->code = code;
		memcpy(c->error, saved, sizeof(saved));
		return NULL;
	}
	return t;
}

static pe_tensor *binary(pe_tensor *a, pe_tensor *b, enum opcode op)
{
	if (a == NULL || b == NULL)
		return NULL;
	pe_client *c = a->c;
	if (b->c != c) {
		fail(c, ST_INVALID_ARGUMENT, "%s: operands belong to different clients",
		     opcode_name(op));
		return NULL;
	}
	Podemu__Node *n = node_new(c, op);
	if (n == NULL)
		return NULL;
	int x = operand_of(a), y = x >= 0 ? operand_of(b) : -1;
	if (y < 0)
		return NULL;
	n->operands = arena_calloc(c->graph_arena, 2, sizeof(int32_t));
	if (n->operands == NULL)
		return NULL;
	n->operands[0] = x;
	n->operands[1] = y;
	n->n_operands = 2;
	return node_tensor(c, n);
}

pe_tensor *pe_add(pe_tensor *a, pe_tensor *b)
{
	return binary(a, b, OP_ADD);
}

pe_tensor *pe_subtract(pe_tensor *a, pe_tensor *b)
{
	return binary(a, b, OP_SUBTRACT);
}

pe_tensor *pe_multiply(pe_tensor *a, pe_tensor *b)
{
	return binary(a, b, OP_MULTIPLY);
}

pe_tensor *pe_maximum(pe_tensor *a, pe_tensor *b)
{
	return binary(a, b, OP_MAXIMUM);
}

pe_tensor *pe_minimum(pe_tensor *a, pe_tensor *b)
{
	return binary(a, b, OP_MINIMUM);
}

pe_tensor *pe_convert(pe_tensor *a, pe_dtype dtype)
{
	if (a == NULL)
		return NULL;
	Podemu__Node *n = node_new(a->c, OP_CONVERT);
	if (n == NULL || (n->shape = shape_new(a->c, dtype, NULL, 0)) == NULL)
		return NULL;
	return unary(a, n);
}

pe_tensor *pe_divide(pe_tensor *a, pe_tensor *b)
{
	return binary(a, b, OP_DIVIDE);
}

pe_tensor *pe_and(pe_tensor *a, pe_tensor *b)
{
	return binary(a, b, OP_AND);
}

pe_tensor *pe_or(pe_tensor *a, pe_tensor *b)
{
	return binary(a, b, OP_OR);
}

pe_tensor *pe_compare(pe_tensor *a, pe_tensor *b, const char *direction)
{
	if (a == NULL || b == NULL)
		return NULL;
	pe_client *c = a->c;
	if (b->c != c) {
		fail(c, ST_INVALID_ARGUMENT, "compare: operands belong to different clients");
		return NULL;
	}
	Podemu__Node *n = node_new(c, OP_COMPARE);
	if (n == NULL)
		return NULL;
	n->operands = arena_calloc(c->graph_arena, 2, sizeof(int32_t));
	n->comparison_direction = arena_strdup(c->graph_arena, direction ? direction : "");
	if (n->operands == NULL || n->comparison_direction == NULL)
		return NULL;
	if ((n->operands[0] = operand_of(a)) < 0 || (n->operands[1] = operand_of(b)) < 0)
		return NULL;
	n->n_operands = 2;
	return node_tensor(c, n);
}

pe_tensor *pe_select(pe_tensor *pred, pe_tensor *on_true, pe_tensor *on_false)
{
	if (pred == NULL || on_true == NULL || on_false == NULL)
		return NULL;
	pe_client *c = pred->c;
	if (on_true->c != c || on_false->c != c) {
		fail(c, ST_INVALID_ARGUMENT, "select: operands belong to different clients");
		return NULL;
	}
	Podemu__Node *n = node_new(c, OP_SELECT);
	if (n == NULL)
		return NULL;
	n->operands = arena_calloc(c->graph_arena, 3, sizeof(int32_t));
	if (n->operands == NULL)
		return NULL;
	pe_tensor *ops[3] = {pred, on_true, on_false};
	for (int k = 0; k < 3; k++)
		if ((n->operands[k] = operand_of(ops[k])) < 0)
			return NULL;
	n->n_operands = 3;
	return node_tensor(c, n);
}

/* A one-operand op without attributes. */
static pe_tensor *elementwise1(pe_tensor *a, enum opcode op)
{
	return a == NULL ? NULL : unary(a, node_new(a->c, op));
}

pe_tensor *pe_negate(pe_tensor *a)
{
	return elementwise1(a, OP_NEGATE);
}

pe_tensor *pe_not(pe_tensor *a)
{
	return elementwise1(a, OP_NOT);
}

pe_tensor *pe_abs(pe_tensor *a)
{
	return elementwise1(a, OP_ABS);
}

pe_tensor *pe_exponential(pe_tensor *a)
{
	return elementwise1(a, OP_EXPONENTIAL);
}

pe_tensor *pe_log(pe_tensor *a)
{
	return elementwise1(a, OP_LOG);
}

pe_tensor *pe_tanh(pe_tensor *a)
{
	return elementwise1(a, OP_TANH);
}

pe_tensor *pe_sqrt(pe_tensor *a)
{
	return elementwise1(a, OP_SQRT);
}

pe_tensor *pe_rsqrt(pe_tensor *a)
{
	return elementwise1(a, OP_RSQRT);
}

pe_tensor *pe_broadcast(pe_tensor *a, const int64_t *dims, int rank,
                        const int64_t *broadcast_dimensions)
{
	if (a == NULL)
		return NULL;
	if (rank < 0 || rank > PE_MAX_RANK) {
		fail(a->c, ST_INVALID_ARGUMENT, "broadcast: rank %d is out of range", rank);
		return NULL;
	}
	int in_rank = a->shape.rank;
	Podemu__Node *n = node_new(a->c, OP_BROADCAST);
	if (n == NULL || (n->shape = shape_new(a->c, a->shape.dtype, dims, rank)) == NULL)
		return NULL;
	n->dimensions = dims_copy(a->c, broadcast_dimensions, (size_t)in_rank);
	n->n_dimensions = (size_t)in_rank;
	return unary(a, n);
}

pe_tensor *pe_partition_id(pe_client *c)
{
	Podemu__Node *n = node_new(c, OP_PARTITION_ID);
	return n ? node_tensor(c, n) : NULL;
}

/* dynamic-slice and dynamic-update-slice: operands, then one start index per dimension. */
static pe_tensor *dynamic(enum opcode op, pe_tensor *a, pe_tensor *update, pe_tensor *const *starts,
                          const int64_t *sizes)
{
	if (a == NULL || (op == OP_DYNAMIC_UPDATE_SLICE && update == NULL) || starts == NULL)
		return NULL;
	pe_client *c = a->c;
	int rank = a->shape.rank, first = op == OP_DYNAMIC_SLICE ? 1 : 2;
	for (int d = 0; d < rank; d++)
		if (starts[d] == NULL)
			return NULL;
	Podemu__Node *n = node_new(c, op);
	if (n == NULL)
		return NULL;
	n->operands = arena_calloc(c->graph_arena, (size_t)(first + rank), sizeof(int32_t));
	if (n->operands == NULL)
		return NULL;
	for (int k = 0; k < first + rank; k++) {
		pe_tensor *t = k == 0 ? a : k < first ? update : starts[k - first];
		if (t->c != c) {
			fail(c, ST_INVALID_ARGUMENT, "%s: operands belong to different clients",
			     opcode_name(op));
			return NULL;
		}
		if ((n->operands[k] = operand_of(t)) < 0)
			return NULL;
	}
	n->n_operands = (size_t)(first + rank);
	if (op == OP_DYNAMIC_SLICE) {
		n->dimensions = dims_copy(c, sizes, (size_t)rank);
		n->n_dimensions = (size_t)rank;
	}
	return node_tensor(c, n);
}

pe_tensor *pe_dynamic_slice(pe_tensor *a, pe_tensor *const *starts, const int64_t *sizes)
{
	return dynamic(OP_DYNAMIC_SLICE, a, NULL, starts, sizes);
}

pe_tensor *pe_dynamic_update_slice(pe_tensor *a, pe_tensor *update, pe_tensor *const *starts)
{
	return dynamic(OP_DYNAMIC_UPDATE_SLICE, a, update, starts, NULL);
}

pe_tensor *pe_transpose(pe_tensor *a, const int64_t *permutation, int rank)
{
	if (a == NULL)
		return NULL;
	if (rank < 0 || rank > PE_MAX_RANK) {
		fail(a->c, ST_INVALID_ARGUMENT, "transpose: rank %d is out of range", rank);
		return NULL;
	}
	Podemu__Node *n = node_new(a->c, OP_TRANSPOSE);
	if (n == NULL)
		return NULL;
	n->dimensions = dims_copy(a->c, permutation, (size_t)rank);
	n->n_dimensions = (size_t)rank;
	return unary(a, n);
}

pe_tensor *pe_opaque(pe_client *c, const char *name, pe_dtype dtype, const int64_t *dims, int rank,
                     pe_tensor *const *operands, int n_operands)
{
	if (rank < 0 || rank > PE_MAX_RANK || n_operands < 0) {
		fail(c, ST_INVALID_ARGUMENT, "opaque %s: rank %d or %d operands out of range",
		     name ? name : "", rank, n_operands);
		return NULL;
	}
	Podemu__Node *n = node_new(c, OP_OPAQUE);
	if (n == NULL || (n->shape = shape_new(c, dtype, dims, rank)) == NULL)
		return NULL;
	n->name = arena_strdup(c->graph_arena, name ? name : "opaque");
	n->operands = arena_calloc(c->graph_arena, (size_t)n_operands + 1, sizeof(int32_t));
	if (n->name == NULL || n->operands == NULL)
		return NULL;
	for (int k = 0; k < n_operands; k++) {
		if (operands[k] == NULL || operands[k]->c != c) {
			fail(c, ST_INVALID_ARGUMENT,
			     "opaque %s: operand %d is not a tensor of this "
			     "client",
			     n->name, k);
			return NULL;
		}
		if ((n->operands[k] = operand_of(operands[k])) < 0)
			return NULL;
	}
	n->n_operands = (size_t)n_operands;
	return node_tensor(c, n);
}

pe_tensor *pe_dot(pe_tensor *a, pe_tensor *b)
{
	return binary(a, b, OP_DOT);
}

pe_tensor *pe_reshape(pe_tensor *a, const int64_t *dims, int rank)
{
	if (a == NULL)
		return NULL;
	if (rank < 0 || rank > PE_MAX_RANK) {
		fail(a->c, ST_INVALID_ARGUMENT, "reshape: rank %d is out of range", rank);
		return NULL;
	}
	Podemu__Node *n = node_new(a->c, OP_RESHAPE);
	if (n == NULL)
		return NULL;
	n->dimensions = dims_copy(a->c, dims, (size_t)rank);
	n->n_dimensions = (size_t)rank;
	return unary(a, n);
}

pe_tensor *pe_pad(pe_tensor *a, const int64_t *low, const int64_t *high, const int64_t *interior,
                  double value)
{
	if (a == NULL)
		return NULL;
	Podemu__Node *n = node_new(a->c, OP_PAD);
	if (n == NULL)
		return NULL;
	size_t r = (size_t)a->shape.rank;
	int64_t zeros[PE_MAX_RANK] = {0};
	n->pad_low = dims_copy(a->c, low ? low : zeros, r);
	n->pad_high = dims_copy(a->c, high ? high : zeros, r);
	n->pad_interior = dims_copy(a->c, interior ? interior : zeros, r);
	n->n_pad_low = n->n_pad_high = n->n_pad_interior = r;
	n->value = value;
	return unary(a, n);
}

pe_tensor *pe_slice(pe_tensor *a, const int64_t *starts, const int64_t *limits,
                    const int64_t *strides)
{
	if (a == NULL)
		return NULL;
	Podemu__Node *n = node_new(a->c, OP_SLICE);
	if (n == NULL)
		return NULL;
	size_t r = (size_t)a->shape.rank;
	n->starts = dims_copy(a->c, starts, r);
	n->limits = dims_copy(a->c, limits, r);
	n->n_starts = n->n_limits = r;
	if (strides != NULL) {
		n->strides = dims_copy(a->c, strides, r);
		n->n_strides = r;
	}
	return unary(a, n);
}

pe_tensor *pe_concatenate(pe_tensor *const *tensors, int n_tensors, int dimension)
{
	if (tensors == NULL || n_tensors < 1 || tensors[0] == NULL)
		return NULL;
	pe_client *c = tensors[0]->c;
	for (int k = 1; k < n_tensors; k++)
		if (tensors[k] == NULL)
			return NULL;
	Podemu__Node *n = node_new(c, OP_CONCATENATE);
	if (n == NULL)
		return NULL;
	n->operands = arena_calloc(c->graph_arena, (size_t)n_tensors, sizeof(int32_t));
	if (n->operands == NULL)
		return NULL;
	for (int k = 0; k < n_tensors; k++) {
		if (tensors[k]->c != c) {
			fail(c, ST_INVALID_ARGUMENT,
			     "concatenate: operands belong to different clients");
			return NULL;
		}
		if ((n->operands[k] = operand_of(tensors[k])) < 0)
			return NULL;
	}
	n->n_operands = (size_t)n_tensors;
	int64_t d = dimension;
	n->dimensions = dims_copy(c, &d, 1);
	n->n_dimensions = 1;
	return node_tensor(c, n);
}

static const char *const reduce_names[] = {"add", "multiply", "max", "min", "and", "or"};

pe_tensor *pe_reduce(pe_tensor *a, pe_reduce_op op, const int64_t *dimensions, int n_dims)
{
	if (a == NULL)
		return NULL;
	if (n_dims < 0 || n_dims > PE_MAX_RANK || op < 0 || op > PE_REDUCE_OR) {
		fail(a->c, ST_INVALID_ARGUMENT, "reduce: %d dimensions, reduction %d", n_dims,
		     (int)op);
		return NULL;
	}
	Podemu__Node *n = node_new(a->c, OP_REDUCE);
	if (n == NULL)
		return NULL;
	n->dimensions = dims_copy(a->c, dimensions, (size_t)n_dims);
	n->n_dimensions = (size_t)n_dims;
	n->reducer = (char *)reduce_names[op];
	return unary(a, n);
}

pe_tensor *pe_reduce_sum(pe_tensor *a, const int64_t *dimensions, int n_dims)
{
	return pe_reduce(a, PE_REDUCE_SUM, dimensions, n_dims);
}

int pe_optimization_barrier(pe_tensor **tensors, int n_tensors)
{
	if (tensors == NULL || n_tensors < 1 || tensors[0] == NULL)
		return PE_INVALID_ARGUMENT;
	pe_client *c = tensors[0]->c;
	/* Device buffers are already computed: only pending values are ordered by a barrier. */
	int pending = 0;
	for (int k = 0; k < n_tensors; k++) {
		if (tensors[k] == NULL || tensors[k]->c != c)
			return fail(c, ST_INVALID_ARGUMENT,
			            "optimization_barrier: tensor %d is missing or foreign", k);
		pending += tensors[k]->node >= 0;
	}
	if (pending == 0)
		return PE_OK;
	Podemu__Node *barrier = node_new(c, OP_OPT_BARRIER);
	if (barrier == NULL)
		return c->code;
	barrier->operands = arena_calloc(c->graph_arena, (size_t)pending, sizeof(int32_t));
	if (barrier->operands == NULL)
		return fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int k = 0; k < n_tensors; k++)
		if (tensors[k]->node >= 0)
			barrier->operands[barrier->n_operands++] = tensors[k]->node;
	int b = node_add(c, barrier);
	if (b < 0)
		return c->code;
	int index = 0;
	for (int k = 0; k < n_tensors; k++) {
		if (tensors[k]->node < 0)
			continue;
		Podemu__Node *gte = node_new(c, OP_GET_TUPLE_ELEMENT);
		if (gte == NULL)
			return c->code;
		gte->operands = arena_calloc(c->graph_arena, 1, sizeof(int32_t));
		if (gte->operands == NULL)
			return fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
		gte->operands[0] = b;
		gte->n_operands = 1;
		gte->tuple_index = index++;
		int g = node_add(c, gte);
		if (g < 0)
			return c->code;
		tensors[k]->node = g;
	}
	return PE_OK;
}

static pe_tensor *collective(pe_tensor *a, enum opcode op, const pe_groups *g, int dimension,
                             int reduce, double scale);

pe_tensor *pe_all_gather(pe_tensor *a, int dimension)
{
	return collective(a, OP_ALL_GATHER, NULL, dimension, 0, 0);
}

static int release_handles(pe_client *c, uint64_t *handles, size_t n)
{
	Podemu__ReleaseRequest req = PODEMU__RELEASE_REQUEST__INIT;
	req.handles = handles;
	req.n_handles = n;
	struct arena *a;
	void *reply;
	int rv = call(c, CM_RELEASE, &req, &a, &reply, CALL_TIMEOUT_MS);
	arena_free(a);
	return rv;
}

/* Keeps the step's per-collective timings (max over cores) for pe_last_step_collectives. */
static void record_collectives(pe_client *c, const Podemu__StepReply *rep)
{
	int n = 0;
	for (int i = 0; i < c->num_nodes; i++)
		n += opcode_is_collective(opcode_parse(c->nodes[i]->opcode));
	free(c->coll_micros);
	free(c->coll_algorithms);
	free(c->coll_scratch);
	c->coll_micros = calloc((size_t)n + 1, sizeof(int64_t));
	c->coll_algorithms = calloc((size_t)n + 1, sizeof(char *));
	c->coll_scratch = calloc((size_t)n + 1, sizeof(int64_t));
	c->num_colls = 0;
	if (!c->coll_micros || !c->coll_algorithms || !c->coll_scratch)
		return;
	for (int i = 0, k = 0; i < c->num_nodes; i++) {
		if (!opcode_is_collective(opcode_parse(c->nodes[i]->opcode)))
			continue;
		for (size_t t = 0; t < rep->n_timings; t++) {
			const Podemu__CollectiveTiming *ct = rep->timings[t];
			if (ct->node != i)
				continue;
			if (ct->micros > c->coll_micros[k])
				c->coll_micros[k] = ct->micros;
			if (c->coll_algorithms[k] == NULL)
				c->coll_algorithms[k] = arena_strdup(c->long_arena, ct->algorithm);
		}
		if ((size_t)i < rep->n_node_scratch_bytes)
			c->coll_scratch[k] = rep->node_scratch_bytes[i];
		k++;
	}
	c->num_colls = n;
}

int pe_last_step_collectives(pe_client *c, int64_t *micros, const char **algorithms, int max)
{
	for (int k = 0; k < c->num_colls && k < max; k++) {
		if (micros)
			micros[k] = c->coll_micros[k];
		if (algorithms)
			algorithms[k] = c->coll_algorithms[k] ? c->coll_algorithms[k] : "";
	}
	return c->num_colls;
}

int64_t pe_last_step_scratch_bytes(pe_client *c, int k)
{
	return k >= 0 && k < c->num_colls ? c->coll_scratch[k] : 0;
}

/* The pending graph as a step: its outputs are the nodes of the tensors still held. */
struct pending_step {
	Podemu__Graph graph;
	pe_tensor **holders; /* [graph.n_outputs], malloc'd */
};

static int pending_step(pe_client *c, struct pending_step *p)
{
	int num_outputs = 0;
	for (pe_tensor *t = c->tensors; t != NULL; t = t->next)
		num_outputs += t->node >= 0;
	int32_t *outputs = arena_calloc(c->graph_arena, (size_t)num_outputs + 1, sizeof(int32_t));
	p->holders = calloc((size_t)num_outputs + 1, sizeof(*p->holders));
	if (outputs == NULL || p->holders == NULL) {
		free(p->holders);
		return fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
	}
	int k = 0;
	for (pe_tensor *t = c->tensors; t != NULL; t = t->next)
		if (t->node >= 0) {
			p->holders[k] = t;
			outputs[k++] = t->node;
		}
	podemu__graph__init(&p->graph);
	p->graph.nodes = c->nodes;
	p->graph.n_nodes = (size_t)c->num_nodes;
	p->graph.outputs = outputs;
	p->graph.n_outputs = (size_t)num_outputs;
	p->graph.mesh = c->mesh;
	p->graph.n_mesh = c->num_mesh;
	return ST_OK;
}

int pe_mark_step(pe_client *c)
{
	int rv = ST_OK;
	c->code = PE_OK;
	c->error[0] = '\0';
	if (c->num_nodes == 0) {
		if (c->num_release > 0)
			rv = release_handles(c, c->release_after, c->num_release);
		c->num_release = 0;
		return rv;
	}
	struct pending_step p;
	if ((rv = pending_step(c, &p)) != ST_OK)
		return rv;
	int num_outputs = (int)p.graph.n_outputs;
	Podemu__StepRequest req = PODEMU__STEP_REQUEST__INIT;
	req.graph = &p.graph;
	req.release_after = c->release_after;
	req.n_release_after = c->num_release;
	struct arena *a;
	void *reply;
	rv = call(c, CM_EXECUTE_STEP, &req, &a, &reply, STEP_TIMEOUT_MS);
	Podemu__StepReply *rep = reply;
	if (rv == ST_OK && rep->n_output_handles != (size_t)num_outputs)
		rv = fail(c, ST_INTERNAL, "coordinator returned %zu outputs for %d",
		          rep->n_output_handles, num_outputs);
	for (int i = 0; i < num_outputs; i++) {
		p.holders[i]->node = -1;
		p.holders[i]->handle = rv == ST_OK ? rep->output_handles[i] : 0;
	}
	if (rv == ST_OK)
		record_collectives(c, rep);
	arena_free(a);
	free(p.holders);
	if (graph_reset(c) != ST_OK && rv == ST_OK)
		rv = fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
	return rv;
}

int pe_plan_step(pe_client *c, pe_step_plan *out)
{
	memset(out, 0, sizeof(*out));
	c->code = PE_OK;
	c->error[0] = '\0';
	int rv = ST_OK;
	struct pending_step p;
	if ((rv = pending_step(c, &p)) != ST_OK)
		return rv;
	free(p.holders);
	Podemu__StepRequest req = PODEMU__STEP_REQUEST__INIT;
	req.graph = &p.graph;
	req.compile_only = true;
	/* What mark_step would release may be donated to its outputs: the same plan. */
	req.release_after = c->release_after;
	req.n_release_after = c->num_release;
	struct arena *a;
	void *reply;
	rv = p.graph.n_nodes == 0 ? ST_OK
	                          : call(c, CM_EXECUTE_STEP, &req, &a, &reply, STEP_TIMEOUT_MS);
	if (p.graph.n_nodes == 0) {
		out->fits = 1; /* nothing to run */
		return PE_OK;
	}
	if (rv == ST_OK) {
		const Podemu__StepReply *rep = reply;
		out->argument_bytes = rep->argument_bytes;
		out->output_bytes = rep->output_bytes;
		out->temp_bytes = rep->temp_bytes;
		out->peak_bytes = rep->argument_bytes + rep->output_bytes + rep->temp_bytes;
		out->bytes_limit = rep->bytes_limit;
		out->fits = rep->fits;
		out->combined_collectives = rep->combined_collectives;
		out->delayed_nodes = rep->delayed_nodes;
		out->fused_nodes = rep->fused_nodes;
		out->program_cache_hit = rep->program_cache_hit;
		snprintf(out->oom_message, sizeof(out->oom_message), "%s",
		         rep->oom_message ? rep->oom_message : "");
	}
	arena_free(a);
	return rv;
}

int pe_fetch(pe_tensor *t, int ordinal, void *dst, size_t dst_bytes)
{
	if (t == NULL)
		return PE_INVALID_ARGUMENT;
	pe_client *c = t->c;
	int64_t total = shape_bytes(&t->shape);
	if ((int64_t)dst_bytes != total)
		return fail(c, ST_INVALID_ARGUMENT,
		            "fetch: destination has %zu bytes but the tensor has %lld", dst_bytes,
		            (long long)total);
	if (ordinal < 0 || ordinal >= c->world_size)
		return fail(c, ST_INVALID_ARGUMENT, "fetch: core %d is out of range [0, %d)",
		            ordinal, c->world_size);
	if (t->node >= 0) {
		int rv = pe_mark_step(c);
		if (rv != ST_OK)
			return rv;
	}
	if (t->handle == 0)
		return fail(c, ST_FAILED_PRECONDITION,
		            "fetch: tensor belongs to a step that failed; it has no value");
	int64_t off = 0;
	do {
		Podemu__TransferFromDeviceRequest req = PODEMU__TRANSFER_FROM_DEVICE_REQUEST__INIT;
		req.handle = t->handle;
		req.ordinal = ordinal;
		req.offset = off;
		req.length =
		    total - off < RPC_TRANSFER_CHUNK_BYTES ? total - off : RPC_TRANSFER_CHUNK_BYTES;
		struct arena *a;
		void *reply;
		int rv = call(c, CM_TRANSFER_FROM_DEVICE, &req, &a, &reply, CALL_TIMEOUT_MS);
		Podemu__TransferFromDeviceReply *rep = reply;
		if (rv == ST_OK && !rep->backed)
			rv = fail(c, ST_FAILED_PRECONDITION,
			          "core %d has no backing store (--backing none): tensor values "
			          "are not kept",
			          ordinal);
		else if (rv == ST_OK && (int64_t)rep->data.len != req.length)
			rv = fail(c, ST_DATA_LOSS, "fetch: asked for %lld bytes, got %zu",
			          (long long)req.length, rep->data.len);
		if (rv == ST_OK && req.length > 0)
			memcpy((char *)dst + off, rep->data.data, (size_t)req.length);
		arena_free(a);
		if (rv != ST_OK)
			return rv;
		off += req.length;
	} while (off < total);
	return PE_OK;
}

void pe_release(pe_tensor *t)
{
	if (t == NULL)
		return;
	pe_client *c = t->c;
	if (t->prev)
		t->prev->next = t->next;
	else
		c->tensors = t->next;
	if (t->next)
		t->next->prev = t->prev;
	if (t->handle != 0) {
		bool read_by_pending = false;
		for (int i = 0; i < c->num_nodes && !read_by_pending; i++)
			read_by_pending = c->nodes[i]->handle == t->handle &&
			                  strcmp(c->nodes[i]->opcode, "parameter") == 0;
		if (read_by_pending) {
			if (c->num_release == c->cap_release) {
				size_t cap = c->cap_release ? c->cap_release * 2 : 16;
				uint64_t *p = realloc(c->release_after, cap * sizeof(*p));
				if (p != NULL) {
					c->release_after = p;
					c->cap_release = cap;
				}
			}
			if (c->num_release < c->cap_release)
				c->release_after[c->num_release++] = t->handle;
		} else {
			release_handles(c, &t->handle, 1);
		}
	}
	free(t);
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
	int rv = call(c, CM_GET_MEMORY_STATS, &req, &a, &reply, CALL_TIMEOUT_MS);
	if (rv == ST_OK) {
		Podemu__MemoryStatsReply *rep = reply;
		if (rep->n_cores < (size_t)n)
			rv = fail(c, ST_INTERNAL, "coordinator returned %zu cores, expected %d",
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
		return fail(c, ST_INVALID_ARGUMENT, "core %d is out of range [0, %d)", ordinal,
		            c->world_size);
	return memory_call(c, ordinal, out, 1);
}

int pe_memory_info_all(pe_client *c, pe_memory_info *out, int n)
{
	if (n < c->world_size)
		return fail(c, ST_INVALID_ARGUMENT, "room for %d cores, the pod has %d", n,
		            c->world_size);
	return memory_call(c, -1, out, c->world_size);
}

pe_groups *pe_groups_parse(pe_client *c, const char *text)
{
	int64_t *ids;
	int *sizes, n;
	struct status st;
	if (coll_groups_parse(text, &ids, &sizes, &n, &st) != ST_OK) {
		fail_status(c, &st);
		return NULL;
	}
	pe_groups *g = arena_alloc(c->long_arena, sizeof(*g));
	if (g != NULL)
		g->groups = arena_calloc(c->long_arena, (size_t)n, sizeof(*g->groups));
	for (int k = 0, at = 0; g != NULL && g->groups != NULL && k < n; k++) {
		Podemu__ReplicaGroup *rg = arena_alloc(c->long_arena, sizeof(*rg));
		if (rg == NULL)
			break;
		podemu__replica_group__init(rg);
		rg->replica_ids =
		    arena_calloc(c->long_arena, (size_t)sizes[k] + 1, sizeof(int64_t));
		if (rg->replica_ids == NULL)
			break;
		memcpy(rg->replica_ids, ids + at, (size_t)sizes[k] * sizeof(int64_t));
		rg->n_replica_ids = (size_t)sizes[k];
		at += sizes[k];
		g->groups[g->num_groups++] = rg;
	}
	free(ids);
	free(sizes);
	if (g == NULL || g->num_groups != (size_t)n) {
		fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
		return NULL;
	}
	return g;
}

int pe_set_mesh(pe_client *c, const char *spec)
{
	char **names;
	int64_t *sizes;
	int n;
	struct status st;
	if (coll_mesh_parse(spec, &names, &sizes, &n, &st) != ST_OK)
		return fail_status(c, &st);
	int64_t product = 1;
	for (int i = 0; i < n; i++)
		product *= sizes[i];
	int rv = ST_OK;
	Podemu__MeshAxis **mesh = arena_calloc(c->long_arena, (size_t)n, sizeof(*mesh));
	if (product != c->world_size)
		rv = fail(c, ST_INVALID_ARGUMENT,
		          "mesh '%s' has %lld devices but the pod has %d cores", spec,
		          (long long)product, c->world_size);
	for (int i = 0; rv == ST_OK && i < n; i++) {
		if (mesh == NULL ||
		    (mesh[i] = arena_alloc(c->long_arena, sizeof(**mesh))) == NULL) {
			rv = fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
			break;
		}
		podemu__mesh_axis__init(mesh[i]);
		mesh[i]->name = arena_strdup(c->long_arena, names[i]);
		mesh[i]->size = sizes[i];
	}
	if (rv == ST_OK) {
		c->mesh = mesh;
		c->num_mesh = (size_t)n;
	}
	coll_mesh_free(names, sizes, n);
	return rv;
}

pe_groups *pe_groups_axis(pe_client *c, const char *axis)
{
	for (size_t i = 0; i < c->num_mesh; i++) {
		if (strcmp(c->mesh[i]->name, axis) != 0)
			continue;
		pe_groups *g = arena_alloc(c->long_arena, sizeof(*g));
		if (g == NULL || (g->axis = arena_strdup(c->long_arena, axis)) == NULL) {
			fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
			return NULL;
		}
		return g;
	}
	fail(c, ST_INVALID_ARGUMENT, "the mesh has no axis named '%s' (call pe_set_mesh first)",
	     axis);
	return NULL;
}

static void set_groups(Podemu__Node *n, const pe_groups *g)
{
	if (g == NULL)
		return;
	if (g->axis != NULL) {
		n->mesh_axis = (char *)g->axis;
		return;
	}
	n->replica_groups = g->groups;
	n->n_replica_groups = g->num_groups;
}

static pe_tensor *collective(pe_tensor *a, enum opcode op, const pe_groups *g, int dimension,
                             int reduce, double scale)
{
	if (a == NULL)
		return NULL;
	if (reduce < 0 || reduce > PE_REDUCE_OR) {
		fail(a->c, ST_INVALID_ARGUMENT, "%s: unknown reduction %d", opcode_name(op),
		     reduce);
		return NULL;
	}
	Podemu__Node *n = node_new(a->c, op);
	if (n == NULL)
		return NULL;
	set_groups(n, g);
	if (op == OP_ALL_GATHER || op == OP_REDUCE_SCATTER) {
		int64_t d = dimension;
		n->dimensions = dims_copy(a->c, &d, 1);
		n->n_dimensions = 1;
	}
	n->reducer = (char *)reduce_names[reduce];
	n->scale = scale;
	return unary(a, n);
}

pe_tensor *pe_all_gather_groups(pe_tensor *a, int dimension, const pe_groups *g)
{
	return collective(a, OP_ALL_GATHER, g, dimension, 0, 0);
}

pe_tensor *pe_all_reduce(pe_tensor *a, pe_reduce_op op, double scale, const pe_groups *g)
{
	return collective(a, OP_ALL_REDUCE, g, 0, (int)op, scale);
}

pe_tensor *pe_reduce_scatter(pe_tensor *a, pe_reduce_op op, int dimension, const pe_groups *g)
{
	return collective(a, OP_REDUCE_SCATTER, g, dimension, (int)op, 0);
}

pe_tensor *pe_all_to_all(pe_tensor *a, int split_dimension, int concat_dimension,
                         const pe_groups *g)
{
	if (a == NULL)
		return NULL;
	Podemu__Node *n = node_new(a->c, OP_ALL_TO_ALL);
	if (n == NULL)
		return NULL;
	set_groups(n, g);
	n->split_dimension = split_dimension;
	n->concat_dimension = concat_dimension;
	/* The group size: every group of a valid set has the same size. */
	n->split_count = a->c->world_size;
	if (g != NULL && g->axis != NULL) {
		for (size_t i = 0; i < a->c->num_mesh; i++)
			if (strcmp(a->c->mesh[i]->name, g->axis) == 0)
				n->split_count = a->c->mesh[i]->size;
	} else if (g != NULL && g->num_groups > 0) {
		n->split_count = (int64_t)g->groups[0]->n_replica_ids;
	}
	return unary(a, n);
}

pe_tensor *pe_collective_permute(pe_tensor *a, const int64_t *pairs, int num_pairs)
{
	if (a == NULL)
		return NULL;
	if (num_pairs < 0 || (num_pairs > 0 && pairs == NULL)) {
		fail(a->c, ST_INVALID_ARGUMENT, "collective-permute: %d pairs", num_pairs);
		return NULL;
	}
	Podemu__Node *n = node_new(a->c, OP_COLLECTIVE_PERMUTE);
	if (n == NULL)
		return NULL;
	n->source_target_pairs = dims_copy(a->c, pairs, (size_t)num_pairs * 2);
	n->n_source_target_pairs = (size_t)num_pairs * 2;
	return unary(a, n);
}
