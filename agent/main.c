/*
 * podemu-agent: one or several emulated TPU VM hosts. Each serves the Agent service to the
 * coordinator, receives collective chunks from peer hosts on its own data-plane endpoint, and
 * runs one executor thread per simulated core, exactly as if it were alone in its process. The
 * main thread runs a libevent loop for signals, registration and one heartbeat for all of them.
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
#include "exit_with.h"
#include "log.h"
#include "podemu.pb-c.h"
#include "service.h"
#include "services.h"
#include "tls.h"
#include "token.h"

/* Hosts one process may emulate (podemu-agent --hosts, --host-index A-B). */
#define AGENT_MAX_HOSTS 1024

/* One emulated host: its own identity, heaps, data-plane endpoint and Agent service. */
struct agent_host {
	struct agent agent;
	struct agent_process *proc;
	struct dataplane *dp;
	struct rpc_server *server;
	int requested_index;
	char control_url[256];
	char data_url[256];
	int host_index;
	uint64_t incarnation;
	uint64_t agent_epoch;       /* this start of the host */
	uint64_t coordinator_epoch; /* the coordinator process that knows our buffers */
	bool registered;
	bool device_up;
	int cores_per_host;
	int num_hosts;
};

/* The process: one event loop, one coordinator connection and one heartbeat for its hosts. */
struct agent_process {
	struct event_base *base;
	struct rpc_client *coordinator;
	const char *backing;
	uint64_t epoch;
	struct agent_host *hosts;
	int num_hosts;
	pid_t owner; /* PODEMU_EXIT_WITH's process, or 0 */
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
	        "  --host-index N|A-B      ask for host index N (e.g. a StatefulSet ordinal), or\n"
	        "                          emulate hosts A..B in this process\n"
	        "  --hosts N               emulate N hosts in this process (default 1; from\n"
	        "                          --host-index N on, or any free ones)\n"
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

/* The log's role: "agent-3", or "agent-0..15" for a process with several hosts. */
static void name_log(struct agent_process *p)
{
	int lo = -1, hi = -1;
	for (int i = 0; i < p->num_hosts; i++) {
		if (!p->hosts[i].device_up)
			return;
		int h = p->hosts[i].host_index;
		lo = lo < 0 || h < lo ? h : lo;
		hi = h > hi ? h : hi;
	}
	char role[48];
	if (lo == hi)
		snprintf(role, sizeof(role), "agent-%d", lo);
	else
		snprintf(role, sizeof(role), "agent-%d..%d", lo, hi);
	log_init(role, log_level());
}

static void try_register(struct agent_host *m)
{
	struct agent_process *p = m->proc;
	struct arena *a = arena_new();
	if (a == NULL)
		return;
	Podemu__RegisterRequest req = PODEMU__REGISTER_REQUEST__INIT;
	req.requested_host_index = m->registered ? m->host_index : m->requested_index;
	req.control_url = m->control_url;
	req.data_url = m->data_url;
	req.pid = (int)getpid();
	req.backing = (char *)p->backing;
	req.agent_epoch = m->agent_epoch;
	req.process_epoch = p->epoch;
	void *reply;
	struct status st;
	int rv = rpc_call(p->coordinator, &podemu__coordinator__descriptor, CM_REGISTER, &req, a,
	                  &reply, 2000, &st);
	if (rv != ST_OK) {
		if (rv != ST_DEADLINE_EXCEEDED && rv != ST_UNAVAILABLE) {
			log_error("registration refused: %s: %s", status_code_name(rv), st.message);
			event_base_loopbreak(p->base);
		}
		arena_free(a);
		return;
	}
	Podemu__RegisterReply *r = reply;
	if (m->device_up && (r->cores_per_host != m->cores_per_host ||
	                     r->num_hosts != m->num_hosts || r->host_index != m->host_index)) {
		log_error("the coordinator now describes another pod (%s); exiting", r->topology);
		event_base_loopbreak(p->base);
		arena_free(a);
		return;
	}
	if (m->device_up && r->coordinator_epoch != m->coordinator_epoch) {
		int freed = device_forget_all(&m->agent.dev, "the coordinator restarted", 10000);
		log_warn("host %d: a new coordinator process: freed the %d device buffers the old "
		         "one made",
		         m->host_index, freed);
	}
	m->coordinator_epoch = r->coordinator_epoch;
	m->host_index = r->host_index;
	m->incarnation = r->incarnation;
	m->registered = true;
	if (!m->device_up) {
		/* The process's budget of kept freed pages, shared by all its heaps. */
		int64_t heaps =
		    (int64_t)p->num_hosts * (r->cores_per_host > 0 ? r->cores_per_host : 1);
		int rv2 =
		    device_init(&m->agent.dev, r->host_index, r->num_hosts, r->cores_per_host,
		                r->hbm_bytes - r->reserved_bytes, strcmp(p->backing, "host") == 0,
		                HBM_RETAIN_PROCESS_BYTES / heaps, &st);
		if (rv2 != ST_OK) {
			log_error("cannot create cores: %s", st.message);
			event_base_loopbreak(p->base);
			arena_free(a);
			return;
		}
		m->agent.dev.dp = m->dp;
		m->cores_per_host = r->cores_per_host;
		m->num_hosts = r->num_hosts;
		m->device_up = true;
		name_log(p);
	}
	m->agent.ready = true;
	log_info("registered as host %d of %s (%d cores, ordinals %d..%d)", r->host_index,
	         r->topology, r->cores_per_host, r->host_index * r->cores_per_host,
	         (r->host_index + 1) * r->cores_per_host - 1);
	arena_free(a);
}

/* One heartbeat for every registered host of the process; those unknown register again. */
static void heartbeat(struct agent_process *p)
{
	struct arena *a = arena_new();
	Podemu__HostLease *leases = calloc((size_t)p->num_hosts, sizeof(*leases));
	Podemu__HostLease **list = calloc((size_t)p->num_hosts, sizeof(*list));
	if (a == NULL || leases == NULL || list == NULL)
		goto out;
	Podemu__HeartbeatRequest req = PODEMU__HEARTBEAT_REQUEST__INIT;
	for (int i = 0; i < p->num_hosts; i++) {
		if (!p->hosts[i].registered)
			continue;
		podemu__host_lease__init(&leases[i]);
		leases[i].host_index = p->hosts[i].host_index;
		leases[i].incarnation = p->hosts[i].incarnation;
		list[req.n_hosts++] = &leases[i];
	}
	req.hosts = list;
	void *reply;
	struct status st;
	if (req.n_hosts == 0 || rpc_call(p->coordinator, &podemu__coordinator__descriptor,
	                                 CM_HEARTBEAT, &req, a, &reply, 1000, &st) != ST_OK)
		goto out;
	const Podemu__HeartbeatReply *r = reply;
	for (size_t k = 0; k < r->n_unknown_hosts; k++) {
		for (int i = 0; i < p->num_hosts; i++) {
			struct agent_host *m = &p->hosts[i];
			if (m->registered && m->host_index == r->unknown_hosts[k]) {
				log_warn("the coordinator does not know host %d; registering again",
				         m->host_index);
				try_register(m);
			}
		}
	}
out:
	free(list);
	free(leases);
	arena_free(a);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
	struct agent_process *p = arg;
	for (int i = 0; i < p->num_hosts; i++)
		if (!p->hosts[i].registered)
			try_register(&p->hosts[i]);
	heartbeat(p);
	/* Connections peers closed, even when no collective runs. */
	for (int i = 0; i < p->num_hosts; i++)
		dp_reap(p->hosts[i].dp);
}

/* Idle this long, the agent gives back what steps keep for the next one. */
#define IDLE_RETURN_MS 200

/*
 * Only once every host of the process is idle: giving pages back stops the process's threads
 * for the TLB shootdowns, and malloc_trim (one call for all hosts) can take this thread, the
 * one that sends the heartbeat, for a long time while many threads run.
 */
static void on_idle_timer(evutil_socket_t fd, short what, void *arg)
{
	struct agent_process *p = arg;
	for (int i = 0; i < p->num_hosts; i++)
		if (p->hosts[i].device_up && !device_idle(&p->hosts[i].agent.dev, IDLE_RETURN_MS))
			return;
	bool returned = false;
	for (int i = 0; i < p->num_hosts; i++)
		if (p->hosts[i].device_up)
			returned |=
			    device_return_idle_memory(&p->hosts[i].agent.dev, IDLE_RETURN_MS);
	if (returned)
		malloc_trim(0);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	struct agent_process *p = arg;
	log_info("signal %d: shutting down", (int)sig);
	event_base_loopbreak(p->base);
}

/* The process named by PODEMU_EXIT_WITH exited (exit_with.h). */
static void on_owner_exit(evutil_socket_t fd, short what, void *arg)
{
	struct agent_process *p = arg;
	log_info("process %d (PODEMU_EXIT_WITH) exited: shutting down", (int)p->owner);
	event_base_loopbreak(p->base);
}

/*
 * The listen URL of the host in slot i: the same URL when its port is 0 (each gets its own) or
 * for the first host, else the port plus i. Refuses a port past 65535.
 */
static int slot_url(char *out, size_t len, const char *url, int slot)
{
	const char *colon = strrchr(url, ':');
	char *end;
	long port = colon != NULL ? strtol(colon + 1, &end, 10) : 0;
	if (slot == 0 || colon == NULL || port == 0) {
		snprintf(out, len, "%s", url);
		return 0;
	}
	if (port + slot > 65535)
		return -1;
	snprintf(out, len, "%.*s:%ld%s", (int)(colon - url), url, port + slot, end);
	return 0;
}

/* Parses --host-index: "N" or "A-B" (first and count). */
static int parse_host_index(const char *s, int *first, int *count)
{
	char *end;
	long a = strtol(s, &end, 10), b = a;
	if (end == s || a < 0)
		return -1;
	if (*end == '-') {
		const char *rest = end + 1;
		b = strtol(rest, &end, 10);
		if (end == rest || b < a)
			return -1;
	}
	if (*end != '\0' || b >= (1 << 20))
		return -1;
	*first = (int)a;
	*count = (int)(b - a + 1);
	return 0;
}

/* Starts the data plane and the Agent service of the host in slot i. */
static int start_host(struct agent_process *p, int i, const char *data_listen,
                      const char *control_listen, const char *advertise_host, const char *token,
                      struct status *st)
{
	struct agent_host *m = &p->hosts[i];
	char data[256], control[256], bound[256];
	if (slot_url(data, sizeof(data), data_listen, i) != 0 ||
	    slot_url(control, sizeof(control), control_listen, i) != 0)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "host %d of this process: its port would pass 65535", i);
	const struct dp_handlers handlers = {agent_deliver, agent_place, agent_unplace, agent_admit,
	                                     &m->agent};
	if (dp_start(&m->dp, data, bound, &handlers, st) != ST_OK)
		return st->code;
	dp_set_token(m->dp, token);
	advertise(m->data_url, bound, advertise_host);
	if (rpc_server_start(&m->server, control, &podemu__agent__descriptor, agent_handlers,
	                     &m->agent, token, bound, st) != ST_OK) {
		dp_stop(m->dp);
		m->dp = NULL;
		return st->code;
	}
	advertise(m->control_url, bound, advertise_host);
	return ST_OK;
}

/* Stops the hosts that started (a step in flight is aborted first). */
static void stop_hosts(struct agent_process *p)
{
	for (int i = 0; i < p->num_hosts; i++) {
		struct agent_host *m = &p->hosts[i];
		m->agent.ready = false;
		/*
		 * Its cores stop waiting in collectives and the request that runs the step
		 * returns, so that the server's workers can be joined.
		 */
		if (m->device_up)
			device_abort(&m->agent.dev, 0, ST_UNAVAILABLE, "the agent is stopping",
			             NULL, NULL);
	}
	for (int i = 0; i < p->num_hosts; i++)
		if (p->hosts[i].server != NULL)
			rpc_server_stop(p->hosts[i].server);
	/* No chunk arrives once the data planes are shut, but cores still see them until joined. */
	for (int i = 0; i < p->num_hosts; i++)
		if (p->hosts[i].dp != NULL)
			dp_shutdown(p->hosts[i].dp);
	for (int i = 0; i < p->num_hosts; i++) {
		struct agent_host *m = &p->hosts[i];
		if (m->device_up)
			device_destroy(&m->agent.dev);
		if (m->dp != NULL)
			dp_stop(m->dp);
	}
}

/* The command line, checked. */
struct options {
	const char *coordinator, *data_listen, *control_listen, *advertise_host, *cpus;
	int heartbeat_ms, first_index;
	struct daemon_trust trust;
	enum log_level level;
};

/* Parses argv into o and p's hosts and backing: -1 to go on, else the exit code (said). */
static int parse_options(struct options *o, struct agent_process *p, int argc, char **argv)
{
	static const struct option opts[] = {
	    {"coordinator", required_argument, NULL, 'c'},
	    {"listen", required_argument, NULL, 'l'},
	    {"control-listen", required_argument, NULL, 'L'},
	    {"advertise-host", required_argument, NULL, 'A'},
	    {"host-index", required_argument, NULL, 'i'},
	    {"hosts", required_argument, NULL, 'H'},
	    {"backing", required_argument, NULL, 'b'},
	    {"heartbeat-ms", required_argument, NULL, 'B'},
	    {"cpus", required_argument, NULL, 'C'},
	    DAEMON_TRUST_LONG_OPTIONS,
	    {"verbose", no_argument, NULL, 'v'},
	    {"help", no_argument, NULL, 'h'},
	    {0, 0, 0, 0},
	};
	*o = (struct options){.coordinator = "tcp://127.0.0.1:7460",
	                      .data_listen = "tcp://127.0.0.1:0",
	                      .control_listen = "tcp://127.0.0.1:0",
	                      .heartbeat_ms = 1000,
	                      .first_index = -1,
	                      .level = LOG_INFO};
	p->backing = "host";
	int index_count = 0, count = 0, rv = ST_OK, c;
	struct status st;
	status_clear(&st);
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1 && rv == ST_OK) {
		switch (c) {
		case 'c':
			o->coordinator = optarg;
			break;
		case 'l':
			o->data_listen = optarg;
			break;
		case 'L':
			o->control_listen = optarg;
			break;
		case 'A':
			o->advertise_host = optarg;
			break;
		case 'i':
			if (parse_host_index(optarg, &o->first_index, &index_count) != 0)
				rv = status_set(&st, ST_INVALID_ARGUMENT,
				                "--host-index must be N or A-B, not %s", optarg);
			break;
		case 'H':
			rv = parse_int(&count, "--hosts", optarg, 1, AGENT_MAX_HOSTS, &st);
			break;
		case 'b':
			p->backing = optarg;
			break;
		case 'B':
			rv = parse_int(&o->heartbeat_ms, "--heartbeat-ms", optarg, 50, 60000, &st);
			break;
		case 'C':
			o->cpus = optarg;
			break;
		case 'v':
			o->level = LOG_DEBUG;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			if (daemon_trust_option(&o->trust, c, optarg))
				break;
			usage(stderr);
			return 2;
		}
	}
	p->num_hosts = count != 0 ? count : index_count > 0 ? index_count : 1;
	if (rv == ST_OK && index_count > 1 && count != 0 && count != index_count)
		rv = status_set(&st, ST_INVALID_ARGUMENT, "--host-index names %d hosts, --hosts %d",
		                index_count, count);
	if (rv == ST_OK && p->num_hosts > AGENT_MAX_HOSTS)
		rv = status_set(&st, ST_INVALID_ARGUMENT, "at most %d hosts per process",
		                AGENT_MAX_HOSTS);
	if (rv == ST_OK && strcmp(p->backing, "host") != 0 && strcmp(p->backing, "none") != 0)
		rv = status_set(&st, ST_INVALID_ARGUMENT, "--backing must be host or none");
	if (rv != ST_OK) {
		fprintf(stderr, "podemu-agent: %s\n", st.message);
		return 2;
	}
	return -1;
}

/* Binds the process to cpus (NULL: no binding) before any thread starts; false when it cannot. */
static bool bind_cpus(const char *cpus)
{
	if (cpus == NULL)
		return true;
	/* nng's threads, the cores' and the server's inherit it. */
	cpu_set_t set;
	struct status st;
	if (cpus_parse(&set, cpus, &st) != ST_OK) {
		fprintf(stderr, "podemu-agent: --cpus: %s\n", st.message);
		return false;
	}
	if (sched_setaffinity(0, sizeof(set), &set) != 0) {
		fprintf(stderr, "podemu-agent: --cpus %s: %s\n", cpus, strerror(errno));
		return false;
	}
	return true;
}

/* Starts p's hosts and its coordinator client; 0, or an exit code after saying why. */
static int start_process(struct agent_process *p, const struct options *o, const char *token)
{
	struct status st;
	p->hosts = calloc((size_t)p->num_hosts, sizeof(*p->hosts));
	if (p->hosts == NULL) {
		fprintf(stderr, "podemu-agent: out of memory\n");
		return 1;
	}
	for (int i = 0; i < p->num_hosts; i++) {
		struct agent_host *m = &p->hosts[i];
		m->proc = p;
		m->requested_index = o->first_index >= 0 ? o->first_index + i : -1;
		m->agent_epoch = p->epoch + (uint64_t)i;
		if (start_host(p, i, o->data_listen, o->control_listen, o->advertise_host, token,
		               &st) != ST_OK) {
			fprintf(stderr, "podemu-agent: %s\n", st.message);
			stop_hosts(p);
			return 1;
		}
	}
	if (rpc_client_open(&p->coordinator, o->coordinator, true, &st) != ST_OK) {
		fprintf(stderr, "podemu-agent: %s\n", st.message);
		stop_hosts(p);
		return 1;
	}
	rpc_client_set_token(p->coordinator, token);
	if (p->num_hosts == 1)
		log_info("data plane %s, control %s, coordinator %s, backing %s",
		         p->hosts[0].data_url, p->hosts[0].control_url, o->coordinator, p->backing);
	else
		log_info("%d hosts: data planes %s.., controls %s.., coordinator %s, backing %s",
		         p->num_hosts, p->hosts[0].data_url, p->hosts[0].control_url,
		         o->coordinator, p->backing);
	return 0;
}

int main(int argc, char **argv)
{
	static struct agent_process p;
	struct options o;
	int code = parse_options(&o, &p, argc, argv);
	if (code >= 0)
		return code;
	if (!bind_cpus(o.cpus))
		return 2;
	log_init("agent", o.level);
	if (o.cpus != NULL)
		log_info("running on CPUs %s", o.cpus);
	signal(SIGPIPE, SIG_IGN);
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	p.epoch = ((uint64_t)now.tv_sec << 32) ^ (uint64_t)now.tv_nsec ^ (uint64_t)getpid();
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
	const char *listens[] = {o.data_listen, o.control_listen};
	if (token_for_daemon(token, &o.trust, listens, 2, &st) != ST_OK) {
		fprintf(stderr, "podemu-agent: %s\n", st.message);
		return 2;
	}
	int owner_fd;
	if (exit_with_open(&owner_fd, &p.owner, &st) != ST_OK) {
		fprintf(stderr, "podemu-agent: %s\n", st.message);
		return 2;
	}
	if ((code = start_process(&p, &o, token)) != 0)
		return code;

	p.base = event_base_new();
	struct event *sigint = evsignal_new(p.base, SIGINT, on_signal, &p);
	struct event *sigterm = evsignal_new(p.base, SIGTERM, on_signal, &p);
	struct event *timer = event_new(p.base, -1, EV_PERSIST, on_timer, &p);
	struct timeval tick = {o.heartbeat_ms / 1000, (o.heartbeat_ms % 1000) * 1000};
	struct event *idle = event_new(p.base, -1, EV_PERSIST, on_idle_timer, &p);
	struct timeval idle_tick = {0, IDLE_RETURN_MS / 2 * 1000};
	evsignal_add(sigint, NULL);
	evsignal_add(sigterm, NULL);
	event_add(timer, &tick);
	event_add(idle, &idle_tick);
	struct event *owner_exit =
	    owner_fd >= 0 ? event_new(p.base, owner_fd, EV_READ, on_owner_exit, &p) : NULL;
	if (owner_exit != NULL)
		event_add(owner_exit, NULL);
	for (int i = 0; i < p.num_hosts; i++)
		try_register(&p.hosts[i]);
	event_base_dispatch(p.base);

	if (owner_exit != NULL)
		event_free(owner_exit);
	if (owner_fd >= 0)
		close(owner_fd);
	event_free(idle);
	event_free(timer);
	event_free(sigterm);
	event_free(sigint);
	event_base_free(p.base);
	stop_hosts(&p);
	rpc_client_close(p.coordinator);
	free(p.hosts);
	log_info("stopped");
	return 0;
}
