/*
 * podemu-coordinator: registers agents, assigns host indices and ordinals, compiles and
 * dispatches steps. The main thread runs a libevent loop (signals, lease timer); RPCs are served
 * on worker threads.
 */
#include <event2/event.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exit_with.h"
#include "log.h"
#include "podemu.pb-c.h"
#include "http.h"
#include "service.h"
#include "sessions.h"
#include "tls.h"
#include "token.h"
#include "topology.h"

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: podemu-coordinator [options]\n"
	    "  --listen URL               control address (default tcp://127.0.0.1:7460;\n"
	    "                             port 0 picks a free port)\n"
	    "  --topology NAME            v2-8, v3-8, v3-32, v3-128, v4-8, v4-32, ... (default "
	    "v3-8)\n"
	    "  --hosts H --cores-per-host C --hbm SIZE   an explicit pod instead of a preset\n"
	    "  --address-file PATH        write the bound address here once listening\n"
	    "  --chunk-bytes SIZE         collective chunk size (default 4M)\n"
	    "  --collective-timeout-ms N  a collective fails after N ms (default 120000)\n"
	    "  --heartbeat-timeout-ms N   a host that is silent this long is lost (default 3000)\n"
	    "  --session-lease-ms N       a client session that renews nothing this long ends\n"
	    "                             and its buffers are freed (default 3000)\n"
	    "  --collective-algo NAME     force ring, bidirectional-ring, direct,\n"
	    "                             recursive-doubling, hierarchical or torus where it\n"
	    "                             applies (also PODEMU_COLLECTIVE_ALGO)\n"
	    "  --window N                 data-plane chunks in flight per peer (default 4)\n"
	    "  --combine-threshold-bytes SIZE  merge independent all-gathers, reduce-scatters\n"
	    "                             and all-reduces up to SIZE of output, as XLA's\n"
	    "                             combiners do (default 30M; 0: never)\n"
	    "  --scheduler NAME           memory-aware (default) or recorded (run nodes in the\n"
	    "                             order the client recorded them)\n"
	    "  --layout NAME              tpu (default: every buffer is charged its size in the\n"
	    "                             TPU's tiled layout, as podemu compile plans it) or none\n"
	    "  --fusion NAME              elementwise (default: chains of elementwise ops are one\n"
	    "                             kernel, their intermediates take no HBM) or none\n"
	    "  --token-file PATH          the pod's secret (else PODEMU_TOKEN); agents and\n"
	    "                             clients without it are refused\n"
	    "  --insecure                 allow a non-loopback address without a token\n"
	    "  --tls-cert PATH --tls-key PATH --tls-ca PATH\n"
	    "                             identity and pod CA for tls+tcp:// (mutual TLS; else\n"
	    "                             PODEMU_TLS_CERT, PODEMU_TLS_KEY, PODEMU_TLS_CA)\n"
	    "  --http-listen HOST:PORT    serve /metrics (Prometheus), /api/status and a\n"
	    "                             dashboard at / (port 0 picks one; off loopback the\n"
	    "                             token is required as a bearer token)\n"
	    "  --http-file PATH           write the dashboard's URL here once listening\n"
	    "  --verbose                  log debug messages\n");
}

struct loop_state {
	struct event_base *base;
	struct coordinator *co;
	pid_t owner;
};

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	struct loop_state *ls = arg;
	log_info("signal %d: shutting down", (int)sig);
	event_base_loopbreak(ls->base);
}

/* The process named by PODEMU_EXIT_WITH exited (exit_with.h). */
static void on_owner_exit(evutil_socket_t fd, short what, void *arg)
{
	struct loop_state *ls = arg;
	log_info("process %d (PODEMU_EXIT_WITH) exited: shutting down", ls->owner);
	event_base_loopbreak(ls->base);
}

static void on_lease_timer(evutil_socket_t fd, short what, void *arg)
{
	struct loop_state *ls = arg;
	registry_expire(&ls->co->reg);
}

/* Writes text to path atomically (temporary file + rename). */
static int write_file_atomic(const char *path, const char *text)
{
	char tmp[4096];
	snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
	FILE *f = fopen(tmp, "w");
	if (f == NULL)
		return -1;
	fprintf(f, "%s\n", text);
	if (fclose(f) != 0 || rename(tmp, path) != 0) {
		unlink(tmp);
		return -1;
	}
	return 0;
}

/* The command line, checked. */
struct options {
	const char *listen_url, *address_file, *http_listen, *http_file;
	const char *algo; /* NULL or "": chosen per collective */
	struct topology topo;
	int64_t chunk, combine;
	int collective_timeout, heartbeat_timeout, session_lease, window;
	bool memory_aware, fusion, tiled;
	struct daemon_trust trust;
	enum log_level level;
};

static bool one_of(const char *text, const char *const *names)
{
	for (; *names != NULL; names++)
		if (strcmp(text, *names) == 0)
			return true;
	return false;
}

/* The pod: --hosts/--cores-per-host/--hbm, else a preset. */
static int pick_topology(struct options *o, const char *preset, const char *hosts,
                         const char *cores, const char *hbm_text, struct status *st)
{
	if (hosts == NULL && cores == NULL && hbm_text == NULL)
		return topology_from_preset(&o->topo, preset ? preset : "v3-8", st);
	int h = 1, c = 8, rv = ST_OK;
	int64_t hbm = 16LL << 30;
	if (hosts != NULL)
		rv = parse_int(&h, "--hosts", hosts, 1, INT_MAX, st);
	if (rv == ST_OK && cores != NULL)
		rv = parse_int(&c, "--cores-per-host", cores, 1, INT_MAX, st);
	if (rv == ST_OK && hbm_text != NULL && (rv = parse_size(&hbm, hbm_text, st)) != ST_OK)
		status_set(st, rv, "--hbm: %s", st->message);
	return rv == ST_OK ? topology_custom(&o->topo, h, c, hbm, st) : rv;
}

/* Parses argv into o: -1 to go on, else the exit code (its reason said). */
static int parse_options(struct options *o, int argc, char **argv)
{
	static const struct option opts[] = {
	    {"listen", required_argument, NULL, 'l'},
	    {"topology", required_argument, NULL, 't'},
	    {"hosts", required_argument, NULL, 'H'},
	    {"cores-per-host", required_argument, NULL, 'C'},
	    {"hbm", required_argument, NULL, 'M'},
	    {"address-file", required_argument, NULL, 'a'},
	    {"chunk-bytes", required_argument, NULL, 'c'},
	    {"collective-timeout-ms", required_argument, NULL, 'T'},
	    {"heartbeat-timeout-ms", required_argument, NULL, 'B'},
	    {"session-lease-ms", required_argument, NULL, 'E'},
	    {"collective-algo", required_argument, NULL, 'A'},
	    {"window", required_argument, NULL, 'W'},
	    {"combine-threshold-bytes", required_argument, NULL, 'K'},
	    {"scheduler", required_argument, NULL, 'S'},
	    {"fusion", required_argument, NULL, 'F'},
	    {"layout", required_argument, NULL, 'L'},
	    DAEMON_TRUST_LONG_OPTIONS,
	    {"http-listen", required_argument, NULL, 'P'},
	    {"http-file", required_argument, NULL, 'U'},
	    {"verbose", no_argument, NULL, 'v'},
	    {"help", no_argument, NULL, 'h'},
	    {0, 0, 0, 0},
	};
	static const char *const algos[] = {
	    "ring", "direct", "recursive-doubling", "hierarchical", "torus", "bidirectional-ring",
	    NULL};
	static const char *const schedulers[] = {"memory-aware", "recorded", NULL};
	static const char *const fusions[] = {"elementwise", "none", NULL};
	static const char *const layouts[] = {"tpu", "none", NULL};
	*o = (struct options){.listen_url = "tcp://127.0.0.1:7460",
	                      .algo = getenv("PODEMU_COLLECTIVE_ALGO"),
	                      .collective_timeout = 120000,
	                      .heartbeat_timeout = 3000,
	                      .session_lease = SESSION_DEFAULT_LEASE_MS,
	                      .window = 4,
	                      .level = LOG_INFO};
	const char *topology = NULL, *hosts = NULL, *cores = NULL, *hbm = NULL;
	const char *chunk = "4M", *combine = "30M", *scheduler = "memory-aware";
	const char *fusion = "elementwise", *layout = "tpu";
	struct status st;
	status_clear(&st);
	int rv = ST_OK, c;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1 && rv == ST_OK) {
		switch (c) {
		case 'l':
			o->listen_url = optarg;
			break;
		case 't':
			topology = optarg;
			break;
		case 'H':
			hosts = optarg;
			break;
		case 'C':
			cores = optarg;
			break;
		case 'M':
			hbm = optarg;
			break;
		case 'a':
			o->address_file = optarg;
			break;
		case 'c':
			chunk = optarg;
			break;
		case 'T':
			rv = parse_int(&o->collective_timeout, "--collective-timeout-ms", optarg,
			               100, INT_MAX, &st);
			break;
		case 'B':
			rv = parse_int(&o->heartbeat_timeout, "--heartbeat-timeout-ms", optarg, 100,
			               INT_MAX, &st);
			break;
		case 'E':
			rv = parse_int(&o->session_lease, "--session-lease-ms", optarg, 100,
			               INT_MAX, &st);
			break;
		case 'A':
			o->algo = optarg;
			break;
		case 'W':
			rv = parse_int(&o->window, "--window", optarg, 1, 64, &st);
			break;
		case 'K':
			combine = optarg;
			break;
		case 'S':
			scheduler = optarg;
			break;
		case 'F':
			fusion = optarg;
			break;
		case 'L':
			layout = optarg;
			break;
		case 'P':
			o->http_listen = optarg;
			break;
		case 'U':
			o->http_file = optarg;
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
	if (rv == ST_OK)
		rv = pick_topology(o, topology, hosts, cores, hbm, &st);
	if (rv == ST_OK && (rv = parse_size(&o->chunk, chunk, &st)) != ST_OK)
		status_set(&st, rv, "--chunk-bytes: %s", st.message);
	if (rv == ST_OK && (o->chunk < 4096 || o->chunk > (64 << 20)))
		rv = status_set(&st, ST_INVALID_ARGUMENT, "--chunk-bytes must be in [4K, 64M]");
	if (rv == ST_OK && (rv = parse_size(&o->combine, combine, &st)) != ST_OK)
		status_set(&st, rv, "--combine-threshold-bytes: %s", st.message);
	if (rv == ST_OK && !one_of(scheduler, schedulers))
		rv = status_set(&st, ST_INVALID_ARGUMENT,
		                "unknown scheduler '%s' (memory-aware, recorded)", scheduler);
	if (rv == ST_OK && !one_of(fusion, fusions))
		rv = status_set(&st, ST_INVALID_ARGUMENT, "unknown fusion '%s' (elementwise, none)",
		                fusion);
	if (rv == ST_OK && !one_of(layout, layouts))
		rv =
		    status_set(&st, ST_INVALID_ARGUMENT, "unknown layout '%s' (tpu, none)", layout);
	if (rv == ST_OK && o->algo != NULL && o->algo[0] != '\0' && !one_of(o->algo, algos))
		rv = status_set(
		    &st, ST_INVALID_ARGUMENT,
		    "unknown collective algorithm '%s' (ring, bidirectional-ring, direct, "
		    "recursive-doubling, hierarchical, torus)",
		    o->algo);
	if (rv != ST_OK) {
		fprintf(stderr, "podemu-coordinator: %s\n", st.message);
		return 2;
	}
	o->memory_aware = strcmp(scheduler, "memory-aware") == 0;
	o->fusion = strcmp(fusion, "elementwise") == 0;
	o->tiled = strcmp(layout, "tpu") == 0;
	return -1;
}

int main(int argc, char **argv)
{
	struct options o;
	int code = parse_options(&o, argc, argv);
	if (code >= 0)
		return code;
	log_init("coordinator", o.level);
	signal(SIGPIPE, SIG_IGN);
	struct status st;
	status_clear(&st);
	char token[TOKEN_MAX + 1];
	if (token_for_daemon(token, &o.trust, &o.listen_url, 1, &st) != ST_OK) {
		fprintf(stderr, "podemu-coordinator: %s\n", st.message);
		return 2;
	}
	int owner_fd;
	pid_t owner;
	if (exit_with_open(&owner_fd, &owner, &st) != ST_OK) {
		fprintf(stderr, "podemu-coordinator: %s\n", st.message);
		return 2;
	}

	static struct coordinator co;
	if (registry_init(&co.reg, &o.topo, o.heartbeat_timeout, &st) != ST_OK) {
		fprintf(stderr, "podemu-coordinator: %s\n", st.message);
		return 1;
	}
	pthread_mutex_init(&co.step_lock, NULL);
	pthread_cond_init(&co.sequence_cv, NULL);
	co.reg.session_lease_ms = o.session_lease;
	snprintf(co.reg.token, sizeof(co.reg.token), "%s", token);
	co.chunk_bytes = o.chunk;
	co.collective_timeout_ms = o.collective_timeout;
	co.step_timeout_ms = o.collective_timeout + 600000;
	co.agent_timeout_ms = 30000;
	co.window = o.window;
	co.collective_algorithm = o.algo;
	co.schedule.combine_threshold_bytes = o.combine;
	co.schedule.memory_aware = o.memory_aware;
	co.fusion = o.fusion;
	co.tiled = o.tiled;

	struct rpc_server *server;
	char bound[256];
	/*
	 * Each connection is served by its own thread: a client's renewals, on a connection of
	 * their own, are answered while its steps wait for the step lock.
	 */
	if (rpc_server_start(&server, o.listen_url, &podemu__coordinator__descriptor,
	                     coordinator_handlers, &co, token, bound, &st) != ST_OK) {

		fprintf(stderr, "podemu-coordinator: %s\n", st.message);
		return 1;
	}
	log_info("listening on %s; topology %s: %d hosts x %d cores, %lld bytes HBM per core "
	         "(%lld usable)",
	         bound, o.topo.name, o.topo.num_hosts, o.topo.cores_per_host,
	         (long long)o.topo.hbm_bytes, (long long)topology_bytes_limit(&o.topo));
	if (o.address_file != NULL && write_file_atomic(o.address_file, bound) != 0) {
		log_error("cannot write %s", o.address_file);
		rpc_server_stop(server);
		return 1;
	}

	pthread_mutex_init(&co.metrics.lock, NULL);
	if (sessions_start_reaper(&co, &st) != ST_OK) {
		fprintf(stderr, "podemu-coordinator: %s\n", st.message);
		rpc_server_stop(server);
		return 1;
	}
	struct http_server *http = NULL;
	if (o.http_listen != NULL) {
		char url[300];
		if (http_start(&http, &co, o.http_listen, token, bound, url, sizeof(url), &st) !=
		    ST_OK) {
			fprintf(stderr, "podemu-coordinator: %s\n", st.message);
			sessions_stop_reaper(&co);
			rpc_server_stop(server);
			return 1;
		}
		log_info("dashboard and metrics at %s", url);
		if (o.http_file != NULL && write_file_atomic(o.http_file, url) != 0)
			log_error("cannot write %s", o.http_file);
	}

	struct loop_state ls = {.base = event_base_new(), .co = &co, .owner = owner};
	struct event *sigint = evsignal_new(ls.base, SIGINT, on_signal, &ls);
	struct event *sigterm = evsignal_new(ls.base, SIGTERM, on_signal, &ls);
	struct event *lease = event_new(ls.base, -1, EV_PERSIST, on_lease_timer, &ls);
	struct timeval tick = {0, 250000};
	evsignal_add(sigint, NULL);
	evsignal_add(sigterm, NULL);
	event_add(lease, &tick);
	struct event *owner_exit =
	    owner_fd >= 0 ? event_new(ls.base, owner_fd, EV_READ, on_owner_exit, &ls) : NULL;
	if (owner_exit != NULL)
		event_add(owner_exit, NULL);
	event_base_dispatch(ls.base);
	atomic_store(&co.stopping, true);

	if (owner_exit != NULL)
		event_free(owner_exit);
	if (owner_fd >= 0)
		close(owner_fd);
	event_free(lease);
	event_free(sigterm);
	event_free(sigint);
	event_base_free(ls.base);
	http_stop(http);
	sessions_stop_reaper(&co);
	rpc_server_stop(server);
	registry_destroy(&co.reg);
	cache_free(&co.cache);
	log_info("stopped");
	return 0;
}
