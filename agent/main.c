/*
 * podemu-agent: one emulated TPU VM host. Serves the Agent service to the coordinator, receives
 * collective chunks from peer agents, and runs one executor thread per simulated core. The main
 * thread runs a libevent loop for signals, registration and heartbeats.
 */
#include <errno.h>
#include <event2/event.h>
#include <getopt.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cpus.h"
#include "dataplane.h"
#include "log.h"
#include "podemu.pb-c.h"
#include "service.h"
#include "services.h"
#include "tls.h"
#include "token.h"

struct agent_main {
	struct agent agent;
	struct event_base *base;
	struct rpc_client *coordinator;
	struct dataplane *dp;
	const char *backing;
	int requested_index;
	char control_url[256];
	char data_url[256];
	int host_index;
	uint64_t incarnation;
	uint64_t agent_epoch;       /* this process */
	uint64_t coordinator_epoch; /* the coordinator process that knows our buffers */
	bool registered;
	bool device_up;
	int cores_per_host;
	int num_hosts;
};

static void usage(FILE *f)
{
	fprintf(f,
	        "usage: podemu-agent [options]\n"
	        "  --coordinator URL       coordinator address (default tcp://127.0.0.1:7460)\n"
	        "  --listen URL            data-plane address (default tcp://127.0.0.1:0)\n"
	        "  --control-listen URL    Agent service address (default tcp://127.0.0.1:0)\n"
	        "  --advertise-host NAME   host name or IP that peers and the coordinator dial\n"
	        "                          (default: the listen host, or the host name when\n"
	        "                          listening on 0.0.0.0)\n"
	        "  --host-index N          ask for host index N (e.g. a StatefulSet ordinal)\n"
	        "  --backing host|none     real bytes behind each heap, or accounting only\n"
	        "  --heartbeat-ms N        heartbeat interval (default 1000)\n"
	        "  --cpus LIST             run on these CPUs only, e.g. 0-3,8 (as taskset -c)\n"
	        "  --token-file PATH       the pod's secret (else PODEMU_TOKEN)\n"
	        "  --insecure              allow non-loopback addresses without a token\n"
	        "  --tls-cert PATH --tls-key PATH --tls-ca PATH\n"
	        "                          identity and pod CA for tls+tcp:// (mutual TLS; else\n"
	        "                          PODEMU_TLS_CERT, PODEMU_TLS_KEY, PODEMU_TLS_CA)\n"
	        "  --verbose               log debug messages\n");
}

/* Replaces the host of a tcp URL for advertising: wildcard or explicitly given. */
static void advertise(char *out, const char *bound, const char *host)
{
	char name[256];
	const char *scheme_end = strstr(bound, "://");
	const char *colon = strrchr(bound, ':');
	if (scheme_end == NULL || colon == NULL || colon < scheme_end + 3) {
		snprintf(out, 256, "%s", bound);
		return;
	}
	const char *h = scheme_end + 3;
	size_t hlen = (size_t)(colon - h);
	bool wildcard =
	    (hlen == 7 && strncmp(h, "0.0.0.0", 7) == 0) || (hlen == 1 && *h == '*') || hlen == 0;
	if (host == NULL && wildcard) {
		if (gethostname(name, sizeof(name)) != 0)
			snprintf(name, sizeof(name), "localhost");
		name[sizeof(name) - 1] = '\0';
		host = name;
	}
	if (host == NULL) {
		snprintf(out, 256, "%s", bound);
		return;
	}
	snprintf(out, 256, "%.*s%s%s", (int)(h - bound), bound, host, colon);
}

static void try_register(struct agent_main *m)
{
	struct arena *a = arena_new();
	if (a == NULL)
		return;
	Podemu__RegisterRequest req = PODEMU__REGISTER_REQUEST__INIT;
	req.requested_host_index = m->registered ? m->host_index : m->requested_index;
	req.control_url = m->control_url;
	req.data_url = m->data_url;
	req.pid = (int)getpid();
	req.backing = (char *)m->backing;
	req.agent_epoch = m->agent_epoch;
	void *reply;
	struct status st;
	int rv = rpc_call(m->coordinator, &podemu__coordinator__descriptor, CM_REGISTER, &req, a,
	                  &reply, 2000, &st);
	if (rv != ST_OK) {
		if (rv != ST_DEADLINE_EXCEEDED && rv != ST_UNAVAILABLE) {
			log_error("registration refused: %s: %s", status_code_name(rv), st.message);
			event_base_loopbreak(m->base);
		}
		arena_free(a);
		return;
	}
	Podemu__RegisterReply *r = reply;
	if (m->device_up && (r->cores_per_host != m->cores_per_host ||
	                     r->num_hosts != m->num_hosts || r->host_index != m->host_index)) {
		log_error("the coordinator now describes another pod (%s); exiting", r->topology);
		event_base_loopbreak(m->base);
		arena_free(a);
		return;
	}
	if (m->device_up && r->coordinator_epoch != m->coordinator_epoch) {
		int freed = device_forget_all(&m->agent.dev, "the coordinator restarted", 10000);
		log_warn("a new coordinator process: freed the %d device buffers the old one made",
		         freed);
	}
	m->coordinator_epoch = r->coordinator_epoch;
	m->host_index = r->host_index;
	m->incarnation = r->incarnation;
	m->registered = true;
	if (!m->device_up) {
		int rv2 = device_init(&m->agent.dev, r->host_index, r->num_hosts, r->cores_per_host,
		                      r->hbm_bytes - r->reserved_bytes,
		                      strcmp(m->backing, "host") == 0, &st);
		if (rv2 != ST_OK) {
			log_error("cannot create cores: %s", st.message);
			event_base_loopbreak(m->base);
			arena_free(a);
			return;
		}
		m->agent.dev.dp = m->dp;
		m->cores_per_host = r->cores_per_host;
		m->num_hosts = r->num_hosts;
		m->device_up = true;
		char role[32];
		snprintf(role, sizeof(role), "agent-%d", r->host_index);
		log_init(role, LOG_INFO);
	}
	m->agent.ready = true;
	log_info("registered as host %d of %s (%d cores, ordinals %d..%d)", r->host_index,
	         r->topology, r->cores_per_host, r->host_index * r->cores_per_host,
	         (r->host_index + 1) * r->cores_per_host - 1);
	arena_free(a);
}

static void heartbeat(struct agent_main *m)
{
	struct arena *a = arena_new();
	if (a == NULL)
		return;
	Podemu__HeartbeatRequest req = PODEMU__HEARTBEAT_REQUEST__INIT;
	req.host_index = m->host_index;
	req.incarnation = m->incarnation;
	void *reply;
	struct status st;
	if (rpc_call(m->coordinator, &podemu__coordinator__descriptor, CM_HEARTBEAT, &req, a,
	             &reply, 1000, &st) == ST_OK &&
	    !((Podemu__HeartbeatReply *)reply)->known) {
		log_warn("the coordinator does not know this host; registering again");
		try_register(m);
	}
	arena_free(a);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
	struct agent_main *m = arg;
	if (!m->registered)
		try_register(m);
	else
		heartbeat(m);
	dp_reap(m->dp); /* connections peers closed, even when no collective runs */
}

/* Idle this long, the agent gives back what steps keep for the next one. */
#define IDLE_RETURN_MS 200

static void on_idle_timer(evutil_socket_t fd, short what, void *arg)
{
	struct agent_main *m = arg;
	if (m->device_up)
		device_return_idle_memory(&m->agent.dev, IDLE_RETURN_MS);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	struct agent_main *m = arg;
	log_info("signal %d: shutting down", (int)sig);
	event_base_loopbreak(m->base);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"coordinator", required_argument, NULL, 'c'},
	    {"listen", required_argument, NULL, 'l'},
	    {"control-listen", required_argument, NULL, 'L'},
	    {"advertise-host", required_argument, NULL, 'A'},
	    {"host-index", required_argument, NULL, 'i'},
	    {"backing", required_argument, NULL, 'b'},
	    {"heartbeat-ms", required_argument, NULL, 'B'},
	    {"cpus", required_argument, NULL, 'C'},
	    DAEMON_TRUST_LONG_OPTIONS,
	    {"verbose", no_argument, NULL, 'v'},
	    {"help", no_argument, NULL, 'h'},
	    {0, 0, 0, 0},
	};
	static struct agent_main m;
	const char *coordinator = "tcp://127.0.0.1:7460", *data_listen = "tcp://127.0.0.1:0";
	const char *control_listen = "tcp://127.0.0.1:0", *advertise_host = NULL;
	int heartbeat_ms = 1000;
	const char *cpus = NULL;
	struct daemon_trust trust = {0};
	enum log_level level = LOG_INFO;
	m.backing = "host";
	m.requested_index = -1;
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	m.agent_epoch = ((uint64_t)now.tv_sec << 32) ^ (uint64_t)now.tv_nsec ^ (uint64_t)getpid();
	int c;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'c':
			coordinator = optarg;
			break;
		case 'l':
			data_listen = optarg;
			break;
		case 'L':
			control_listen = optarg;
			break;
		case 'A':
			advertise_host = optarg;
			break;
		case 'i':
			m.requested_index = atoi(optarg);
			break;
		case 'b':
			m.backing = optarg;
			break;

		case 'B':
			heartbeat_ms = atoi(optarg);
			break;
		case 'C':
			cpus = optarg;
			break;
		case 'v':
			level = LOG_DEBUG;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			if (daemon_trust_option(&trust, c, optarg))
				break;
			usage(stderr);
			return 2;
		}
	}
	if (cpus != NULL) {
		/* Before any thread starts: nng's, the cores' and the server's inherit it. */
		cpu_set_t set;
		struct status st;
		if (cpus_parse(&set, cpus, &st) != ST_OK) {
			fprintf(stderr, "podemu-agent: --cpus: %s\n", st.message);
			return 2;
		}
		if (sched_setaffinity(0, sizeof(set), &set) != 0) {
			fprintf(stderr, "podemu-agent: --cpus %s: %s\n", cpus, strerror(errno));
			return 2;
		}
	}
	if (strcmp(m.backing, "host") != 0 && strcmp(m.backing, "none") != 0) {
		fprintf(stderr, "podemu-agent: --backing must be host or none\n");
		return 2;
	}
	if (heartbeat_ms < 50 || heartbeat_ms > 60000) {
		fprintf(stderr, "podemu-agent: --heartbeat-ms must be in [50, 60000]\n");
		return 2;
	}
	log_init("agent", level);
	if (cpus != NULL)
		log_info("running on CPUs %s", cpus);
	signal(SIGPIPE, SIG_IGN);
	/*
	 * Chunk buffers (a few MiB, allocated and freed for every chunk) must come from reused heap
	 * memory: served by fresh mmaps, each would page-fault anew and halve throughput. One
	 * arena for every thread, so that what steps freed goes back to the system once the cores
	 * are idle (malloc_trim returns only the main arena's top; device_return_idle_memory).
	 */
	mallopt(M_MMAP_THRESHOLD, 256 << 20);
	mallopt(M_TRIM_THRESHOLD, 1 << 30);
	mallopt(M_ARENA_MAX, 1);

	struct status st;
	char token[TOKEN_MAX + 1];
	const char *listens[] = {data_listen, control_listen};
	if (token_for_daemon(token, &trust, listens, 2, &st) != ST_OK) {
		fprintf(stderr, "podemu-agent: %s\n", st.message);
		return 2;
	}

	char bound[256];
	struct dataplane *dp;
	const struct dp_handlers handlers = {agent_deliver, agent_place, agent_unplace, &m.agent};
	if (dp_start(&dp, data_listen, bound, &handlers, &st) != ST_OK) {
		fprintf(stderr, "podemu-agent: %s\n", st.message);
		return 1;
	}
	dp_set_token(dp, token);
	advertise(m.data_url, bound, advertise_host);
	struct rpc_server *server;
	if (rpc_server_start(&server, control_listen, &podemu__agent__descriptor, agent_handlers,
	                     &m.agent, 4, token, bound, &st) != ST_OK) {
		fprintf(stderr, "podemu-agent: %s\n", st.message);
		dp_stop(dp);
		return 1;
	}
	advertise(m.control_url, bound, advertise_host);
	if (rpc_client_open(&m.coordinator, coordinator, true, &st) != ST_OK) {
		fprintf(stderr, "podemu-agent: %s\n", st.message);
		rpc_server_stop(server);
		dp_stop(dp);
		return 1;
	}
	rpc_client_set_token(m.coordinator, token);

	m.dp = dp;
	log_info("data plane %s, control %s, coordinator %s, backing %s", m.data_url, m.control_url,
	         coordinator, m.backing);

	m.base = event_base_new();
	struct event *sigint = evsignal_new(m.base, SIGINT, on_signal, &m);
	struct event *sigterm = evsignal_new(m.base, SIGTERM, on_signal, &m);
	struct event *timer = event_new(m.base, -1, EV_PERSIST, on_timer, &m);
	struct timeval tick = {heartbeat_ms / 1000, (heartbeat_ms % 1000) * 1000};
	struct event *idle = event_new(m.base, -1, EV_PERSIST, on_idle_timer, &m);
	struct timeval idle_tick = {0, IDLE_RETURN_MS / 2 * 1000};
	evsignal_add(sigint, NULL);
	evsignal_add(sigterm, NULL);
	event_add(timer, &tick);
	event_add(idle, &idle_tick);
	try_register(&m);
	event_base_dispatch(m.base);

	m.agent.ready = false;
	event_free(idle);
	event_free(timer);
	event_free(sigterm);
	event_free(sigint);
	event_base_free(m.base);
	/*
	 * A step in flight is aborted first: its cores stop waiting in collectives, and the
	 * request that runs it returns, so the server's workers can be joined.
	 */
	if (m.device_up)
		device_abort(&m.agent.dev, 0, ST_UNAVAILABLE, "the agent is stopping", NULL, NULL);
	rpc_server_stop(server);
	/* No chunk arrives once the data plane is shut, but cores still see it until joined. */
	dp_shutdown(dp);
	if (m.device_up)
		device_destroy(&m.agent.dev);
	dp_stop(dp);
	rpc_client_close(m.coordinator);
	log_info("stopped");
	return 0;
}
