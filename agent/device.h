/*
 * The agent's simulated host: its cores (one executor thread and one HBM heap each), the device
 * buffers that live on them, and the step being prepared or run. One lock guards it all; kernels
 * and transfers run outside it.
 */
#ifndef PODEMU_DEVICE_H
#define PODEMU_DEVICE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "arena.h"
#include "dataplane.h"
#include "hindex.h"
#include "dtype.h"
#include "hbm.h"
#include "podemu.pb-c.h"
#include "status.h"

struct step;

struct core {
	struct device *dev;
	int local;
	int ordinal;
	struct hbm heap;
	pthread_t thread;
	bool thread_started;
	struct step *pending; /* set by device_run, cleared by the core when done */
	/*
	 * A core waits on its own cv: idle, for its next step (`pending`); in a collective, for
	 * its own events, bumped (under dev->lock, with a signal) whenever it may go on. Nothing
	 * else is woken by a chunk or a step's start.
	 */
	pthread_cond_t cv;
	uint64_t events;
	/*
	 * What it sent being taken or acknowledged may let it go on (a send waits for room, or
	 * the collective for its sends): only then do those wake it.
	 */
	bool awaits_sends;
	/*
	 * Collectives this core ran in the running step: chunks name the instance, the same on
	 * every core as each runs the same program (a collective in a loop runs once per trip).
	 */
	uint32_t collectives_run;
	/*
	 * While it waits in a collective it may hold its host's data plane and poll it itself
	 * (dp_hold): `polling` (under dev->lock) while it may be in dp_poll, when core_wake also
	 * writes wake_fd, an eventfd, to end the poll.
	 */
	int wake_fd;
	bool holds_dp;
	bool polling;
};

/* A device buffer exists on every core of the host (SPMD), at its own offset in each heap. */
struct device_buffer {
	uint64_t handle; /* first: the hash index reads it there */
	struct shape shape;
	struct hbm_buffer *at; /* [cores_per_host]: its place on each core's heap */
};

struct device {
	pthread_mutex_t lock;
	pthread_cond_t cv;
	int host_index;
	int num_hosts;
	int cores_per_host;
	int world_size;
	bool backed;
	int window; /* data-plane chunks in flight per peer */
	struct core *cores;
	struct device_buffer *buffers;
	int num_buffers;
	int cap_buffers;
	struct hindex index; /* handle -> buffers[] position */
	struct step *step;   /* prepared or running */
	struct dataplane *dp;
	/* A core holds dp (coll_wait.c), or dp cannot be held (not plain TCP, or stopping). */
	bool dp_held, dp_unholdable;
	/*
	 * A step reaches hosts at different times (ExecuteStep prepares and runs at once), so a
	 * peer's chunks may come before this host prepared their step: they are held here unread
	 * (their bytes stay in the sender's memory, and their stream waits) and read when it is
	 * prepared; any others are refused then.
	 */
	struct dp_request **early;
	int num_early, cap_early;
	uint64_t done_step; /* the last step that ended here: its late chunks are refused */
	/* An abort that came before its step: the step fails when it comes. */
	uint64_t aborted_step;
	int aborted_code;
	char aborted_reason[256];
	bool stopping;
	/* Memory freed since the cores were last idle: kept for the next step until then. */
	bool freed_since_idle;
	int64_t last_active_ms;
	/*
	 * Failpoint for fault tests (PODEMU_FAILPOINT=stall-before-collective): every core stops
	 * before each collective until the step is aborted, as a hung kernel would.
	 */
	bool stall_before_collective;
	/* PODEMU_FAILPOINT=fail-prepare: every step fails to prepare here (out of memory). */
	bool fail_prepare;
};

/* The index on this host of core `ordinal` (outside [0, cores_per_host) when elsewhere). */
static inline int device_local(const struct device *dev, int ordinal)
{
	return ordinal - dev->host_index * dev->cores_per_host;
}

/* No step is prepared and none has run or freed buffers for idle_ms. */
bool device_idle(struct device *dev, int idle_ms);
/*
 * Once no step has run or freed buffers for idle_ms, gives back what steps keep for the next
 * one: the pages of freed device memory and the data plane's receive buffers, so that the
 * agent's RSS follows the bytes its cores account; true when it did (the process's free heap
 * chunks are then the caller's to trim, once for all its hosts). Cheap when there is nothing
 * to give back; for a timer.
 */
bool device_return_idle_memory(struct device *dev, int idle_ms);
/* Notes that a step ran or buffers were freed (lock held). */
void device_note_activity(struct device *dev);

/* Wakes one core waiting in a collective, or every core (a step aborted). dev->lock held. */
void core_wake(struct core *c);
void device_wake_cores(struct device *dev);

/*
 * Creates the host's cores, each with a heap of bytes_limit usable bytes that keeps up to
 * retain bytes of freed pages (hbm_set_retain), and starts their executor threads. dp may be
 * NULL until the data plane is up (set dev->dp later).
 */
int device_init(struct device *dev, int host_index, int num_hosts, int cores_per_host,
                int64_t bytes_limit, bool backed, int64_t retain, struct status *st);
/* Stops the executor threads and frees every heap and buffer. */
void device_destroy(struct device *dev);

/* Device buffers. Each fails with NOT_FOUND for an unknown handle. */
/* bytes: what each core's heap charges, at least the shape's bytes (0: exactly those). */
int device_create_buffer(struct device *dev, uint64_t handle, const struct shape *shape,
                         int64_t bytes, struct status *st);
int device_write(struct device *dev, uint64_t handle, int ordinal, int64_t offset, const void *data,
                 int64_t len, struct status *st);
/*
 * Reads up to len bytes at offset of the buffer on one core into a buffer allocated from a.
 * *backed is false (and nothing is read) under --backing none.
 */
int device_read(struct device *dev, struct arena *a, uint64_t handle, int ordinal, int64_t offset,
                int64_t len, void **data, int64_t *got, int64_t *total, bool *backed,
                struct status *st);
int device_release(struct device *dev, const uint64_t *handles, size_t n, struct status *st);
/*
 * Aborts the step in flight (waiting up to wait_ms for it to end) and frees every device buffer:
 * for a coordinator that does not know them. Returns how many buffers were freed.
 */
int device_forget_all(struct device *dev, const char *reason, int wait_ms);

/* Statistics of one core (ordinal) or every core (-1), allocated from a. */
int device_memory_stats(struct device *dev, struct arena *a, int ordinal, Podemu__CoreMemory ***out,
                        size_t *n, struct status *st);

/*
 * Steps (exec.c). prepare validates the program and allocates every core's outputs and
 * temporary reservation (all cores or none: RESOURCE_EXHAUSTED names the core). run executes it
 * on every core, frees release_after, and fills rep with each core's time in each collective
 * (allocated from a) and the host's use of its receive slots. abort drops a prepared step.
 */
int device_prepare(struct device *dev, const Podemu__Program *prog, struct status *st);
/*
 * Lets the chunks held before step s was prepared be read into it, refusing others. Lock held.
 */
void device_adopt_early(struct device *dev, struct step *s);
/* Refuses every chunk still waiting for its step (the agent stops). Lock held. */
void device_drop_early(struct device *dev, const char *why);
int device_run(struct device *dev, uint64_t step_id, const uint64_t *release_after,
               size_t n_release, struct arena *a, Podemu__MemoryStatsReply *rep, struct status *st);
/*
 * abort also tells where each core of the host is (positions[cores_per_host], unless NULL): the
 * collective node it waits in, CORE_COMPUTING, or CORE_DONE.
 */
int device_abort(struct device *dev, uint64_t step_id, int code, const char *reason, int *positions,
                 struct status *st);

/* Data-plane delivery (a dp_deliver_fn with a struct device as arg). */
int device_deliver(void *arg, struct dp_request *req, const struct dp_header *h,
                   const void *payload, struct status *st);
/* Data-plane placement into an open receive (dp_place_fn, dp_unplace_fn). */
void *device_place(void *arg, struct dp_request *req, const struct dp_header *h);
void device_unplace(void *arg, struct dp_request *req);
/* A dp_admit_fn: a chunk of a step on its way is held unread until it is prepared. */
int device_admit(void *arg, struct dp_request *req, const struct dp_header *h, struct status *st);

/* Internal to the agent: the lookup and the executor loop shared by device.c and exec.c. */
struct device_buffer *device_find_buffer(struct device *dev, uint64_t handle);
/* A donated buffer becomes the output's: the same bytes under a new handle (lock held). */
void device_rename_buffer(struct device *dev, struct device_buffer *b, uint64_t handle);
/* Adds a buffer record that takes ownership of at. Lock held. */
int device_add_buffer(struct device *dev, uint64_t handle, const struct shape *shape,
                      struct hbm_buffer *at, struct status *st);
/* True when the prepared or running step reads or writes handle. Lock held. */
bool device_step_uses(struct device *dev, uint64_t handle);
void *device_core_main(void *arg);

#endif
