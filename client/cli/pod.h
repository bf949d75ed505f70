/* `podemu up` and `podemu down`: a local pod as background processes with a state directory. */
#ifndef PODEMU_CLI_POD_H
#define PODEMU_CLI_POD_H

#include <stdint.h>

struct up_options {
	const char *state_dir; /* resolved */
	const char *topology;  /* preset, or NULL with hosts/cores/hbm */
	int hosts;
	int cores_per_host;
	const char *hbm;
	const char *backing;
	int port;
	int timeout_ms;
	const char *chunk_bytes;
	const char *window; /* data-plane chunks in flight per peer */
	const char *collective_timeout_ms;
	const char *heartbeat_timeout_ms;
	const char *session_lease_ms;
	const char *combine_threshold; /* the coordinator's passes */
	const char *scheduler;
	const char *fusion;
	const char *layout;    /* tpu or none: the size each buffer is charged */
	int tls;               /* listen on tls+tcp:// (identity from PODEMU_TLS_CERT/KEY/CA) */
	const char *bind_to;   /* "cpu": each agent on its own CPUs (see cpus_for_agent), "none" */
	int hosts_per_agent;   /* hosts each agent process emulates; 0: by pod size and CPUs */
	const char *http_port; /* the coordinator serves metrics and a dashboard on loopback */
};

/* Starts coordinator and agents, waits until the pod is ready; returns a process exit code. */
int pod_up(const struct up_options *o);
/* Stops every process recorded in state_dir; returns a process exit code. */
int pod_down(const char *state_dir);

#endif
