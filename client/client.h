/*
 * The client library's insides, shared by its files: podemu.c (connection, steps, transfers,
 * memory), ops.c (recording ops into the pending graph) and collectives.c (replica groups,
 * meshes and collectives). Nothing here is exported (client/podemu.map).
 */
#ifndef PODEMU_CLIENT_H
#define PODEMU_CLIENT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "graph.h"
#include "podemu.pb-c.h"
#include "podemu/podemu.h"
#include "status.h"

struct pe_tensor {
	pe_client *c;
	pe_tensor *prev, *next;
	struct shape shape;
	int node;        /* >= 0: pending, the node of the current graph */
	uint64_t handle; /* != 0: a device buffer */
	int recording;   /* where it was made: 0 the entry, else a computation being recorded */
};

/* How long the library waits for a short call to the coordinator. */
#define CALL_TIMEOUT_MS 60000
/* Longest host or program name a session carries. */
#define SESSION_TEXT_MAX 64

struct pe_client {
	struct rpc_client *rpc;
	/* The session that owns every buffer this client makes (session.c). */
	uint64_t session; /* written by the caller's thread under keeper_lock */
	int lease_ms;
	uint64_t coordinator_epoch; /* the coordinator process that knows the session */
	pthread_t keeper;
	pthread_mutex_t keeper_lock;
	pthread_cond_t keeper_cv;
	bool keeper_stop, keeper_running;
	bool closing;  /* pe_disconnect: the session's end frees the buffers */
	int owner_pid; /* the process that opened the session */
	int code;
	char error[STATUS_MESSAGE_MAX + 64];
	char topology[64];
	char backing[8]; /* "host" or "none": whether the pod's cores hold bytes */
	int world_size;
	int num_hosts;
	pe_tensor *tensors;
	/* The pending graph. */
	struct arena *graph_arena;
	Podemu__Node **nodes;
	struct shape *shapes;
	int num_nodes;
	int cap_nodes;
	/* Computations recorded for the pending graph, and the one being recorded (0: none). */
	Podemu__Computation **comps;
	struct shape **comp_shapes;
	int num_comps, cap_comps;
	int recording, last_recording;
	uint64_t *release_after;
	size_t num_release;
	size_t cap_release;
	/* The device mesh and every pe_groups made, which live as long as the client. */
	struct arena *long_arena;
	Podemu__MeshAxis **mesh;
	size_t num_mesh;
	/*
	 * Steps sent without waiting (steps.c): the handles the session may name outputs with,
	 * [named_next, named_end), the sequence number of its last step sent, the one in flight,
	 * and the first failure among them not reported yet.
	 */
	uint64_t named_next, named_end;
	uint64_t step_sequence;
	struct async_step *in_flight;
	int async_code;
	char async_error[STATUS_MESSAGE_MAX];
	/* The last step's collectives: node indices, timings, algorithms, scratch. */
	int num_colls;
	int64_t *coll_micros;
	char **coll_algorithms;
	int64_t *coll_scratch;
	/* Per collective and core: when it first started and last ended (agent clock, µs). */
	struct coll_on_core {
		int k, ordinal;
		int64_t start, end;
	} * coll_on_core;
	size_t num_coll_on_core;
	pe_receive_info receive; /* the last step's receive slots */
};

struct pe_groups {
	const char *axis; /* a mesh axis, or NULL */
	Podemu__ReplicaGroup **groups;
	size_t num_groups;
};

/* One RPC to the coordinator with a fresh arena (*a) that the caller frees; c's error set. */
int client_call(pe_client *c, unsigned method, const void *req, struct arena **a, void **reply,
                int timeout_ms);
/* Releases device buffers of c's session (nothing while pe_disconnect closes it). */
int client_release_handles(pe_client *c, uint64_t *handles, size_t n);
/* Records code and message as c's last error; returns code. */
int client_fail(pe_client *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int client_fail_status(pe_client *c, const struct status *st);

/* A tensor of c (a pending node's value when node >= 0, else device buffer handle). */
pe_tensor *client_tensor_new(pe_client *c, const struct shape *shape, int node, uint64_t handle);
/* A new node of the pending graph, zeroed, with opcode set; NULL (c's error set) on failure. */
Podemu__Node *client_node_new(pe_client *c, enum opcode op);
int64_t *client_dims_copy(pe_client *c, const int64_t *dims, size_t n);
Podemu__Shape *client_shape_new(pe_client *c, int dtype, const int64_t *dims, int rank);
/* Infers the node's shape and appends it; returns its index or -1. */
int client_node_add(pe_client *c, Podemu__Node *n);
/* client_node_add, and the tensor of its value. */
pe_tensor *client_node_tensor(pe_client *c, Podemu__Node *n);
/* n (NULL: an error already set) over the single operand a, recorded; its tensor or NULL. */
pe_tensor *client_unary(pe_tensor *a, Podemu__Node *n);
/* The node that reads tensor t in the pending graph: its own node, or a parameter; -1. */
int client_operand_of(pe_tensor *t);
/* The n tensors of node index's value: its elements (a tuple), else itself (control.c). */
int client_unpack(pe_client *c, int index, pe_tensor **out, int n);
/* Opens c's session and starts renewing it; closes it (freeing its buffers everywhere). */
int client_session_open(pe_client *c, struct status *st);
void client_session_close(pe_client *c);
/*
 * True in a child forked after pe_connect: the session, the keeper thread and the connection
 * are the parent's, and the child must not end or use them.
 */
bool client_forked(const pe_client *c);
/*
 * A coordinator answered with coordinator_epoch: when it is another process than the one that
 * knows c's session (it restarted, and the session died with it), c opens a new session there.
 */
int client_session_follow(pe_client *c, uint64_t coordinator_epoch, struct status *st);
/*
 * Waits for the step pe_mark_step_async sent, if one is in flight, so that what follows sees
 * its outputs; a failure is kept for pe_wait_device_ops (or the next step) to report.
 */
void client_finish_async(pe_client *c);
/* Empties the pending graph (after a step took it); RESOURCE_EXHAUSTED without memory. */
int client_graph_reset(pe_client *c);
/* The computations of the pending graph (control.c), freed with it. */
void client_computations_free(pe_client *c);

#endif
