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
#include "hindex.h"
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
	uint64_t agent_epoch;   /* this start of the host */
	uint64_t process_epoch; /* the agent process serving it (several hosts may share one) */
	uint64_t
	    data_floor; /* buffers of serials below this were made before the agent (re)started */
	int64_t last_heartbeat_ms;
	bool alive;
	struct rpc_client *client;
};

/* Longest layout text a device buffer keeps (Node.layout, CreateBufferRequest.layout). */
#define LAYOUT_TEXT_MAX 160

struct handle_entry {
	uint64_t handle;  /* first: the hash index reads it there */
	uint64_t session; /* the client session that owns it */
	int64_t bytes;    /* what each core's heap charges for it */
	uint64_t serial;  /* the order it was made in (handles a session names are not) */
	struct shape shape;
	char layout[LAYOUT_TEXT_MAX]; /* as written; "" is the pod's layout */
};

/* A client session (sessions.c): it owns device buffers, which end with it. */
enum session_state {
	SESSION_OPEN,
	SESSION_ENDING, /* its lease ran out or it closed: its buffers are being freed */
	SESSION_ENDED,  /* kept a while to say why a late request fails */
};

#define SESSION_NAME_MAX 64
/* A session that renews nothing for this long ends (podemu-coordinator --session-lease-ms). */
#define SESSION_DEFAULT_LEASE_MS 3000

struct session {
	uint64_t id;
	int pid;
	char host_name[SESSION_NAME_MAX];
	char name[SESSION_NAME_MAX];
	int64_t started_unix_ms;
	int64_t last_seen_ms; /* monotonic: the last request that carried it */
	int lease_ms;
	enum session_state state;
	char end_reason[160];
	/* The handles it may name its steps' outputs with: [named_next, named_end). */
	uint64_t named_next, named_end;
	uint64_t next_sequence; /* the sequence number of its step that may run next */
};

/* Handles a session gets to name its steps' outputs with (OpenSessionReply.handle_count). */
#define SESSION_HANDLE_BLOCK ((uint64_t)1 << 20)

struct registry {
	pthread_mutex_t lock;
	struct topology topo;
	struct host *hosts;
	/* Device buffers (handles.c): dense entries and a hash index over them. */
	struct handle_entry *handles;
	int num_handles;
	int cap_handles;
	struct hindex index;
	/* Client sessions (sessions.c). */
	struct session *sessions;
	int num_sessions, cap_sessions;
	uint64_t next_session;
	int session_lease_ms; /* the lease of a session that does not ask for one */
	uint64_t epoch;       /* this coordinator process; also the top bits of its handles */
	uint64_t next_handle; /* epoch << HANDLE_EPOCH_SHIFT | counter */
	uint64_t next_serial; /* of the next buffer made (handle_entry.serial) */
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
 * Registers a host of an agent process (lock taken inside). c->requested is a host index or -1
 * for the lowest free one; an index that is already registered is taken over (the agent restarted).
 * The same process (agent_epoch and control URL) registering again keeps its place, incarnation and
 * connection. Validates the URLs and that every host uses the same backing. On success
 * *host_index and *incarnation are set.
 */
struct host_claim {
	int requested; /* a host index, or -1 for the lowest free one */
	const char *control_url, *data_url, *backing;
	int pid;
	uint64_t agent_epoch;   /* new with every start of the host */
	uint64_t process_epoch; /* the agent process (0: agent_epoch) */
};

int registry_register(struct registry *r, const struct host_claim *c, int *host_index,
                      uint64_t *incarnation, struct status *st);

/* Records a heartbeat; returns false when the host or incarnation is unknown. */
bool registry_heartbeat(struct registry *r, int host_index, uint64_t incarnation);

/* Marks hosts whose lease expired as not alive. Lock taken inside. */
void registry_expire(struct registry *r);

/*
 * Names host and every host its agent process serves (same[i] set for each), as "host 3 (cores
 * 12..15)" or "hosts 0..15 (cores 0..63; one agent process, pid 1234)"; returns how many
 * hosts that names. Lock held.
 */
int registry_name_process_locked(const struct registry *r, int host, bool *same, char *out,
                                 size_t len);

/* True when every host is registered and alive; otherwise st says what is missing. Lock held. */
bool registry_ready_locked(struct registry *r, struct status *st);

/* Handle table (handles.c, lock held). find returns NULL when unknown. */
struct handle_entry *registry_find_handle(struct registry *r, uint64_t handle);
/*
 * A new buffer of an open session (CANCELLED when the session is ending: what it owns is being
 * freed). layout: NULL or "" for the pod's layout; at most LAYOUT_TEXT_MAX - 1 characters.
 */
int registry_add_handle(struct registry *r, uint64_t handle, uint64_t session, int64_t bytes,
                        const struct shape *shape, const char *layout, struct status *st);
void registry_remove_handle(struct registry *r, uint64_t handle);

/*
 * The entry for a handle that session uses (lock held), or NULL with st set: NOT_FOUND for a
 * handle this coordinator never made (another coordinator process made it, or it was
 * released) or that another session owns, and DATA_LOSS when a host that held a shard of it
 * restarted since.
 */
struct handle_entry *registry_use_handle(struct registry *r, uint64_t handle, uint64_t session,
                                         struct status *st);

/* NOT_FOUND for a handle session cannot use, saying why as well as it can. */
int registry_unknown_handle(const struct registry *r, uint64_t handle, uint64_t session,
                            struct status *st);

/*
 * Sessions (sessions.c, lock held). open: lease_ms 0 takes the registry's default; *id set.
 * use: the session is open (INVALID_ARGUMENT for none, NOT_FOUND for one unknown or ended,
 * saying why) and its lease starts again. is_open: for watchers of its steps.
 */
int session_open(struct registry *r, int pid, const char *host_name, const char *name, int lease_ms,
                 uint64_t *id, struct status *st);
int session_use(struct registry *r, uint64_t id, struct status *st);
bool session_is_open(const struct registry *r, uint64_t id);
/* The open session id, or NULL (its address holds until sessions are added or pruned). */
struct session *session_find(struct registry *r, uint64_t id);
/*
 * Checks the n handles a step of session id names its outputs with: ascending, above every
 * one it named before and inside its block (INVALID_ARGUMENT, naming the handle, if not); on
 * success they are the session's and none can be named again.
 */
int session_name_outputs(struct registry *r, uint64_t id, const uint64_t *handles, size_t n,
                         struct status *st);
/* Open sessions whose lease ran out before now become ENDING; up to max of their ids. */
int session_expire(struct registry *r, int64_t now_ms, uint64_t *ids, int max);
/* An open session starts to end (CloseSession); NOT_FOUND as session_use. */
int session_begin_end(struct registry *r, uint64_t id, const char *reason, struct status *st);
/*
 * An ENDING session's buffers leave the table into out (room for r->num_handles; NULL when it
 * owns none) and it is ENDED; returns how many.
 */
size_t session_take_handles(struct registry *r, uint64_t id, uint64_t *out);
/* Buffers and bytes per core that session owns. */
void session_usage(const struct registry *r, uint64_t id, int *buffers, int64_t *bytes);
/* The same for every session at once, by position in r->sessions (arrays of num_sessions). */
void session_usage_all(const struct registry *r, int *buffers, int64_t *bytes);

int64_t registry_now_ms(void);

#endif
