/* The Coordinator service: registration, status, step compilation and dispatch, buffers. */
#ifndef PODEMU_COORD_SERVICE_H
#define PODEMU_COORD_SERVICE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cache.h"
#include "graph.h"
#include "registry.h"
#include "rpc.h"
#include "schedule.h"

/* Step latency histogram buckets (seconds, upper bounds), as Prometheus wants them. */
#define METRICS_BUCKETS 13
extern const double metrics_bucket_bounds[METRICS_BUCKETS];

/* What /metrics reports besides memory: steps, their latency, collective bytes. */
struct metrics {
	pthread_mutex_t lock;
	uint64_t steps_run, steps_failed;
	uint64_t latency_count;
	double latency_sum_seconds;
	uint64_t latency_buckets[METRICS_BUCKETS]; /* not cumulative: in (bound[k-1], bound[k]] */
	double sent_bytes[OP_COUNT];               /* over every core, by collective opcode */
	/* The last step that ran: its id and the planned bytes live per core over its schedule. */
	uint64_t last_step;
	int64_t *last_live; /* malloc'd */
	int n_last_live;
};

/* What a step that ran leaves for the metrics. */
struct step_report {
	uint64_t step_id;
	int64_t sent_by_op[OP_COUNT];
	const int64_t *live;
	int n_live;
};

struct coordinator {
	struct registry reg;
	pthread_mutex_t step_lock; /* one step or buffer operation at a time */
	/* Under reg.lock: a session's step ran, so the next one of its order may (step.c). */
	pthread_cond_t sequence_cv;
	uint64_t next_step;
	int64_t chunk_bytes;
	int collective_timeout_ms;
	int step_timeout_ms;
	int agent_timeout_ms;             /* for short agent calls */
	int window;                       /* data-plane chunks in flight per peer */
	const char *collective_algorithm; /* forced algorithm, or NULL to choose */
	struct schedule_options schedule; /* combining and memory-aware scheduling */
	bool fusion;                      /* elementwise fusion */
	bool tiled;                       /* heaps charge TPU-tiled sizes (--layout tpu) */
	struct program_cache cache;       /* compiled programs, under step_lock */
	struct metrics metrics;
	/* The thread that ends sessions whose lease ran out (session_service.c). */
	pthread_t reaper;
	pthread_mutex_t reaper_lock;
	pthread_cond_t reaper_cv;
	bool reaper_stop;
	/* Set once the main loop ended: calls to agents in flight stop waiting (dispatch.c). */
	atomic_bool stopping;
};

/*
 * The pod's status as GetStatus answers it (memory too when asked), from a: for the HTTP
 * server. ST_OK always, the reply saying what is missing.
 */
int coordinator_status(struct coordinator *co, struct arena *a, bool memory,
                       Podemu__PodStatus *out);

/* Handlers indexed by enum coordinator_method, with a struct coordinator as state. */
extern const rpc_handler coordinator_handlers[];

#endif
