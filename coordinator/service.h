/* The Coordinator service: registration, status, step compilation and dispatch, buffers. */
#ifndef PODEMU_COORD_SERVICE_H
#define PODEMU_COORD_SERVICE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "cache.h"
#include "registry.h"
#include "rpc.h"
#include "schedule.h"

struct coordinator {
	struct registry reg;
	pthread_mutex_t step_lock; /* one step or buffer operation at a time */
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
};

/* Handlers indexed by enum coordinator_method, with a struct coordinator as state. */
extern const rpc_handler coordinator_handlers[];

#endif
