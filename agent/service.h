/* The Agent service: the coordinator's calls into one host. */
#ifndef PODEMU_AGENT_SERVICE_H
#define PODEMU_AGENT_SERVICE_H

#include <stdatomic.h>
#include <stdbool.h>

#include "device.h"
#include "rpc.h"

struct agent {
	atomic_bool ready; /* registered and the device is up */
	struct device dev;
};

/* Handlers indexed by enum agent_method, with a struct agent as state. */
extern const rpc_handler agent_handlers[];

/* A dp_deliver_fn with a struct agent as arg: refuses chunks until the agent is ready. */
int agent_deliver(void *arg, struct dp_request *req, const struct dp_header *h, const void *payload,
                  struct status *st);
/* dp_place_fn, dp_unplace_fn and dp_admit_fn with a struct agent as arg. */
void *agent_place(void *arg, struct dp_request *req, const struct dp_header *h);
void agent_unplace(void *arg, struct dp_request *req);
int agent_admit(void *arg, struct dp_request *req, const struct dp_header *h, struct status *st);

#endif
