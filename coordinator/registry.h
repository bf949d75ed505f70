/*
 * What the coordinator knows about the pod: the topology, which agent serves which host index,
 * and every device buffer handle with its shape. Guarded by one lock in struct registry.
 */
#ifndef PODEMU_REGISTRY_H
#define PODEMU_REGISTRY_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "dtype.h"
#include "rpc.h"
#include "status.h"
#include "topology.h"

#define URL_MAX 256
#define HANDLE_EPOCH_SHIFT 40

struct host {
	bool registered;
	char control_url[URL_MAX];
	char data_url[URL_MAX];
	char backing[8];
	int pid;
	uint64_t incarnation;
	uint64_t agent_epoch;
	uint64_t data_floor; /* handles below this were created before the agent (re)started */
	int64_t last_heartbeat_ms;
	bool alive;
	struct rpc_client *client;
};

/* Longest layout text a device buffer keeps (Node.layout, CreateBufferRequest.layout). */
#define LAYOUT_TEXT_MAX 160

struct handle_entry {
	uint64_t handle;
	struct shape shape;
	char layout[LAYOUT_TEXT_MAX]; /* as written; "" is the pod's layout */
};

struct registry {
	pthread_mutex_t lock;
	struct topology topo;
	struct host *hosts;
	struct handle_entry *handles;
	int num_handles;
	int cap_handles;
	uint64_t epoch;       /* this coordinator process; also the top bits of its handles */
	uint64_t next_handle; /* epoch << HANDLE_EPOCH_SHIFT | counter */
	uint64_t next_incarnation;
	int heartbeat_timeout_ms;
	char token[65]; /* presented to agents */
	/* Clients of replaced agents; a call may still be using one, so they close at the end. */
	struct rpc_client **retired;
	int num_retired;
};

int registry_init(struct registry *r, const struct topology *topo, int heartbeat_timeout_ms,
                  struct status *st);
void registry_destroy(struct registry *r);

/*
 * Registers an agent (lock taken inside). requested is a host index or -1 for the lowest free
 * one; an index that is already registered is taken over (the agent restarted). The same
 * process (agent_epoch and control URL) registering again keeps its place, incarnation and
 * connection. Validates the URLs and that every host uses the same backing. On success
 * *host_index and *incarnation are set.
 */
int registry_register(struct registry *r, int requested, const char *control_url,
                      const char *data_url, const char *backing, int pid, uint64_t agent_epoch,
                      int *host_index, uint64_t *incarnation, struct status *st);

/* Records a heartbeat; returns false when the host or incarnation is unknown. */
bool registry_heartbeat(struct registry *r, int host_index, uint64_t incarnation);

/* Marks hosts whose lease expired as not alive. Lock taken inside. */
void registry_expire(struct registry *r);

/* True when every host is registered and alive; otherwise st says what is missing. Lock held. */
bool registry_ready_locked(struct registry *r, struct status *st);

/* Handle table (lock held). find returns NULL when unknown. */
struct handle_entry *registry_find_handle(struct registry *r, uint64_t handle);
/* layout: NULL or "" for the pod's layout; at most LAYOUT_TEXT_MAX - 1 characters. */
int registry_add_handle(struct registry *r, uint64_t handle, const struct shape *shape,
                        const char *layout, struct status *st);
void registry_remove_handle(struct registry *r, uint64_t handle);

/*
 * The entry for a handle a request uses (lock held), or NULL with st set: NOT_FOUND for a handle
 * this coordinator never made (another coordinator process made it, or it was released), and
 * DATA_LOSS when a host that held a shard of it restarted since.
 */
struct handle_entry *registry_use_handle(struct registry *r, uint64_t handle, struct status *st);

/* NOT_FOUND for a handle the table does not have, saying why as well as it can. */
int registry_unknown_handle(const struct registry *r, uint64_t handle, struct status *st);

int64_t registry_now_ms(void);

#endif
