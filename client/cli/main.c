/* podemu: start and stop a local pod, show its status, run the seed scenario. */
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "arena.h"
#include "podjson.h"
#include "bench.h"
#include "compile.h"
#include "memplan.h"
#include "pod.h"
#include "run.h"
#include "status_cmd.h"
#include "podemu.pb-c.h"
#include "podemu/podemu.h"
#include "rpc.h"
#include "services.h"
#include "statedir.h"
#include "status.h"
#include "topology.h"

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: podemu COMMAND [options]\n"
	    "\n"
	    "commands:\n"
	    "  up      start a local pod (coordinator + agents) and wait until ready\n"
	    "          --topology NAME | --hosts H --cores-per-host C --hbm SIZE\n"
	    "          --backing host|none  --port N (0: any free port)  --timeout-ms N\n"
	    "          --chunk-bytes SIZE  --collective-timeout-ms N  --heartbeat-timeout-ms N\n"
	    "          --session-lease-ms N (a client that renews nothing this long loses its\n"
	    "          buffers; default 3000)\n"
	    "          --window N (data-plane chunks in flight per peer, default 4)\n"
	    "          --combine-threshold-bytes SIZE (default 30M; 0: no combining)\n"
	    "          --scheduler memory-aware|recorded (default memory-aware)\n"
	    "          --fusion elementwise|none (default elementwise)\n"
	    "          --layout tpu|none (default tpu: heaps charge each buffer its TPU-tiled "
	    "size)\n"
	    "          --http-port N (Prometheus /metrics, /api/status and a dashboard on\n"
	    "          127.0.0.1:N; 0 picks a port, podemu status says which)\n"
	    "          --tls (mutual TLS on every socket; certificate, key and pod CA from\n"
	    "          PODEMU_TLS_CERT, PODEMU_TLS_KEY, PODEMU_TLS_CA)\n"
	    "          --bind-to cpu|none (default cpu: with several agents, each runs on its\n"
	    "          own CPUs, or shares one round-robin when there are fewer CPUs)\n"
	    "          --hosts-per-agent N (hosts each agent process emulates; default 1 up\n"
	    "          to 8 hosts or 2 per CPU, else 4, more past 16 processes per CPU)\n"
	    "  down    stop every process of the pod\n"
	    "  status  the pod in brief, then its hosts, sessions and cores (a big pod: only\n"
	    "          the summary unless --all)  [--json: everything]  [--all]\n"
	    "  demo    the seed scenario (pytorch/xla 3510): fill N ones per core, mark_step,\n"
	    "          all-gather along dim 0, release the input, mark_step, sum per core\n"
	    "          [--elements N] [--json]\n"
	    "  bench   collective bandwidth, nccl-tests style, on the running pod\n"
	    "          --op all-gather,reduce-scatter,all-reduce,all-to-all,collective-permute\n"
	    "          --min-bytes SIZE --max-bytes SIZE --factor 2|4 --iters N --warmup N\n"
	    "          --groups '{{0,1},{2,3}}' | --mesh data=4,model=2 --axis model\n"
	    "          --dtype f32 --check --json --no-bytes (time a --backing none pod anyway)\n"
	    "  compile FILE.hlo  the memory plan of an HLO module per core: peak, arguments,\n"
	    "          outputs, temporaries, padding, bytes sent, the live set at the peak, or\n"
	    "          XLA's out-of-memory report; offline with --topology NAME (or --hosts,\n"
	    "          --cores-per-host, --hbm), else for the running pod\n"
	    "          [--json] [--layout tpu|none] [--chunk-bytes SIZE] [--no-alias]\n"
	    "          [--all-gather-strategy native|via-all-reduce|decomposed]\n"
	    "          [--combine-threshold-bytes SIZE (default 30M; 0: no combining)]\n"
	    "          [--fusion elementwise|none (default elementwise)]\n"
	    "          [--scheduler memory-aware|recorded (default memory-aware)]\n"
	    "  run FILE.hlo  the entry computation as a step on the running pod: parameters\n"
	    "          filled with --fill V (default 0) or from --param-dir DIR\n"
	    "          (DIR/param<N>.core<R>.bin); prints each output per core and the peak\n"
	    "          HBM beside the plan's  [--json]\n"
	    "          [--all-gather-strategy native|via-all-reduce|decomposed]: all-gathers run\n"
	    "          as the strategy's instructions (podemu compile --no-alias plans them)\n"
	    "  mem FILE.hlo --svg OUT.svg  the same, and a chart of live bytes over the program\n"
	    "          with the peak marked and the live set at the peak listed\n"
	    "\n"
	    "every command takes --state-dir DIR (default $PODEMU_STATE_DIR, else a folder\n"
	    "under $XDG_RUNTIME_DIR or /tmp)\n");
}

enum {
	OPT_STATE_DIR = 256,
	OPT_TOPOLOGY,
	OPT_HOSTS,
	OPT_CORES,
	OPT_HBM,
	OPT_BACKING,
	OPT_PORT,
	OPT_TIMEOUT,
	OPT_JSON,
	OPT_ALL,
	OPT_ELEMENTS,
	OPT_CHUNK,
	OPT_WINDOW,
	OPT_COLL_TIMEOUT,
	OPT_LEASE,
	OPT_SESSION_LEASE,
	OPT_TLS,
	OPT_BIND_TO,
	OPT_HOSTS_PER_AGENT,
	OPT_HELP,
	OPT_OP,
	OPT_MIN_BYTES,
	OPT_MAX_BYTES,
	OPT_FACTOR,
	OPT_DTYPE,
	OPT_ITERS,
	OPT_WARMUP,
	OPT_GROUPS,
	OPT_MESH,
	OPT_AXIS,
	OPT_CHECK,
	OPT_NO_BYTES,
	OPT_LAYOUT,
	OPT_HTTP_PORT,
	OPT_AG_STRATEGY,
	OPT_NO_ALIAS,
	OPT_COMBINE,
	OPT_SCHEDULER,
	OPT_FUSION,
	OPT_SVG,
	OPT_FILL,
	OPT_PARAM_DIR,
};

struct cli {
	char state_dir[PATH_MAX];
	const char *state_dir_arg;
	struct up_options up;
	int json;
	int all; /* status: every host, session and core, however many */
	long long elements;
	struct bench_options bench;
	const char *file;   /* compile's HLO file */
	int topology_given; /* --topology, --hosts, --cores-per-host or --hbm */
	const char *layout;
	const char *ag_strategy;
	int no_alias;
	const char *combine_threshold;
	const char *svg;
	double fill;
	const char *param_dir;
};

/* A whole-number option in [lo, hi]: 1 (taken), or -1 after saying what is wrong with it. */
static int int_option(int *out, const char *name, const char *text, int lo, int hi)
{
	struct status st;
	if (parse_int(out, name, text, lo, hi, &st) == ST_OK)
		return 1;
	fprintf(stderr, "podemu: %s\n", st.message);
	return -1;
}

/* One of `podemu up`'s options: 1 when c is one, 0 when not, -1 (said) on a bad value. */
static int parse_up_option(struct up_options *u, int c, const char *arg)
{
	switch (c) {
	case OPT_TOPOLOGY:
		u->topology = arg;
		return 1;
	case OPT_HOSTS:
		return int_option(&u->hosts, "--hosts", arg, 1, INT_MAX);
	case OPT_CORES:
		return int_option(&u->cores_per_host, "--cores-per-host", arg, 1, INT_MAX);
	case OPT_HBM:
		u->hbm = arg;
		return 1;
	case OPT_BACKING:
		if (strcmp(arg, "host") != 0 && strcmp(arg, "none") != 0) {
			fprintf(stderr, "podemu: --backing must be host or none\n");
			return -1;
		}
		u->backing = arg;
		return 1;
	case OPT_PORT:
		return int_option(&u->port, "--port", arg, 0, 65535);
	case OPT_HTTP_PORT: {
		int port;
		if (int_option(&port, "--http-port", arg, 0, 65535) < 0)
			return -1;
		u->http_port = arg;
		return 1;
	}
	case OPT_TIMEOUT:
		return int_option(&u->timeout_ms, "--timeout-ms", arg, 1, INT_MAX);
	case OPT_HOSTS_PER_AGENT:
		return int_option(&u->hosts_per_agent, "--hosts-per-agent", arg, 1, 1024);
	/* Checked by the coordinator, whose words podemu up passes on. */
	case OPT_CHUNK:
		u->chunk_bytes = arg;
		return 1;
	case OPT_WINDOW:
		u->window = arg;
		return 1;
	case OPT_COLL_TIMEOUT:
		u->collective_timeout_ms = arg;
		return 1;
	case OPT_LEASE:
		u->heartbeat_timeout_ms = arg;
		return 1;
	case OPT_SESSION_LEASE:
		u->session_lease_ms = arg;
		return 1;
	case OPT_SCHEDULER:
		u->scheduler = arg;
		return 1;
	case OPT_FUSION:
		u->fusion = arg;
		return 1;
	case OPT_TLS:
		u->tls = 1;
		return 1;
	case OPT_BIND_TO:
		if (strcmp(arg, "cpu") != 0 && strcmp(arg, "none") != 0) {
			fprintf(stderr, "podemu: --bind-to must be cpu or none\n");
			return -1;
		}
		u->bind_to = arg;
		return 1;
	default:
		return 0;
	}
}

/* One of `podemu bench`'s options: 1 when c is one, 0 when not, -1 (said) on a bad value. */
static int parse_bench_option(struct bench_options *b, int c, const char *arg)
{
	switch (c) {
	case OPT_OP:
		b->ops = arg;
		return 1;
	case OPT_MIN_BYTES:
	case OPT_MAX_BYTES: {
		struct status st;
		int64_t v = 0;
		int rv = parse_size(&v, arg, &st);
		if (rv == ST_OK && v < 4)
			rv = status_set(&st, ST_INVALID_ARGUMENT,
			                "%lld bytes hold no element: at least 4", (long long)v);
		if (rv != ST_OK) {
			fprintf(stderr, "podemu: %s: %s\n",
			        c == OPT_MIN_BYTES ? "--min-bytes" : "--max-bytes", st.message);
			return -1;
		}
		*(c == OPT_MIN_BYTES ? &b->min_bytes : &b->max_bytes) = v;
		return 1;
	}
	case OPT_FACTOR:
		return int_option(&b->factor, "--factor", arg, 2, INT_MAX);
	case OPT_ITERS:
		return int_option(&b->iters, "--iters", arg, 1, INT_MAX);
	case OPT_WARMUP:
		return int_option(&b->warmup, "--warmup", arg, 0, INT_MAX);
	case OPT_DTYPE:
		b->dtype = arg;
		return 1;
	case OPT_GROUPS:
		b->groups = arg;
		return 1;
	case OPT_MESH:
		b->mesh = arg;
		return 1;
	case OPT_AXIS:
		b->axis = arg;
		return 1;
	case OPT_CHECK:
		b->check = 1;
		return 1;
	case OPT_NO_BYTES:
		b->no_bytes = 1;
		return 1;
	default:
		return 0;
	}
}

static int parse(struct cli *o, int argc, char **argv)
{
	static const struct option opts[] = {
	    {"state-dir", required_argument, NULL, OPT_STATE_DIR},
	    {"topology", required_argument, NULL, OPT_TOPOLOGY},
	    {"hosts", required_argument, NULL, OPT_HOSTS},
	    {"cores-per-host", required_argument, NULL, OPT_CORES},
	    {"hbm", required_argument, NULL, OPT_HBM},
	    {"backing", required_argument, NULL, OPT_BACKING},
	    {"port", required_argument, NULL, OPT_PORT},
	    {"timeout-ms", required_argument, NULL, OPT_TIMEOUT},
	    {"json", no_argument, NULL, OPT_JSON},
	    {"all", no_argument, NULL, OPT_ALL},
	    {"elements", required_argument, NULL, OPT_ELEMENTS},
	    {"chunk-bytes", required_argument, NULL, OPT_CHUNK},
	    {"window", required_argument, NULL, OPT_WINDOW},
	    {"collective-timeout-ms", required_argument, NULL, OPT_COLL_TIMEOUT},
	    {"heartbeat-timeout-ms", required_argument, NULL, OPT_LEASE},
	    {"session-lease-ms", required_argument, NULL, OPT_SESSION_LEASE},
	    {"tls", no_argument, NULL, OPT_TLS},
	    {"bind-to", required_argument, NULL, OPT_BIND_TO},
	    {"hosts-per-agent", required_argument, NULL, OPT_HOSTS_PER_AGENT},
	    {"help", no_argument, NULL, OPT_HELP},
	    {"op", required_argument, NULL, OPT_OP},
	    {"min-bytes", required_argument, NULL, OPT_MIN_BYTES},
	    {"max-bytes", required_argument, NULL, OPT_MAX_BYTES},
	    {"factor", required_argument, NULL, OPT_FACTOR},
	    {"dtype", required_argument, NULL, OPT_DTYPE},
	    {"iters", required_argument, NULL, OPT_ITERS},
	    {"warmup", required_argument, NULL, OPT_WARMUP},
	    {"groups", required_argument, NULL, OPT_GROUPS},
	    {"mesh", required_argument, NULL, OPT_MESH},
	    {"axis", required_argument, NULL, OPT_AXIS},
	    {"check", no_argument, NULL, OPT_CHECK},
	    {"no-bytes", no_argument, NULL, OPT_NO_BYTES},
	    {"layout", required_argument, NULL, OPT_LAYOUT},
	    {"http-port", required_argument, NULL, OPT_HTTP_PORT},
	    {"all-gather-strategy", required_argument, NULL, OPT_AG_STRATEGY},
	    {"no-alias", no_argument, NULL, OPT_NO_ALIAS},
	    {"combine-threshold-bytes", required_argument, NULL, OPT_COMBINE},
	    {"scheduler", required_argument, NULL, OPT_SCHEDULER},
	    {"fusion", required_argument, NULL, OPT_FUSION},
	    {"svg", required_argument, NULL, OPT_SVG},
	    {"fill", required_argument, NULL, OPT_FILL},
	    {"param-dir", required_argument, NULL, OPT_PARAM_DIR},
	    {0, 0, 0, 0},
	};
	int c;
	char *end;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		int rv = parse_up_option(&o->up, c, optarg);
		if (rv == 0)
			rv = parse_bench_option(&o->bench, c, optarg);
		if (rv < 0)
			return -1;
		if (rv > 0)
			continue;
		switch (c) {
		case OPT_STATE_DIR:
			o->state_dir_arg = optarg;
			break;
		case OPT_JSON:
			o->json = 1;
			break;
		case OPT_ALL:
			o->all = 1;
			break;
		case OPT_ELEMENTS:
			o->elements = strtoll(optarg, &end, 10);
			if (*end != '\0' || o->elements < 1) {
				fprintf(stderr, "podemu: --elements must be a positive integer\n");
				return -1;
			}
			break;
		case OPT_LAYOUT:
			o->layout = optarg;
			o->up.layout = optarg;
			break;
		case OPT_AG_STRATEGY:
			o->ag_strategy = optarg;
			break;
		case OPT_NO_ALIAS:
			o->no_alias = 1;
			break;
		case OPT_COMBINE:
			o->up.combine_threshold = optarg;
			o->combine_threshold = optarg;
			break;
		case OPT_SVG:
			o->svg = optarg;
			break;
		case OPT_FILL:
			o->fill = strtod(optarg, &end);
			if (*end != '\0') {
				fprintf(stderr, "podemu: --fill must be a number\n");
				return -1;
			}
			break;
		case OPT_PARAM_DIR:
			o->param_dir = optarg;
			break;
		case OPT_HELP:
			usage(stdout);
			exit(0);
		default:
			usage(stderr);
			return -1;
		}
	}
	if (optind < argc && (strcmp(argv[0], "compile") == 0 || strcmp(argv[0], "mem") == 0 ||
	                      strcmp(argv[0], "run") == 0))
		o->file = argv[optind++];
	if (optind != argc) {
		fprintf(stderr, "podemu: unexpected argument '%s'\n", argv[optind]);
		return -1;
	}
	o->topology_given =
	    o->up.topology != NULL || o->up.hosts || o->up.cores_per_host || o->up.hbm;
	state_dir_resolve(o->state_dir, sizeof(o->state_dir), o->state_dir_arg);
	o->up.state_dir = o->state_dir;
	if (o->up.topology == NULL && !o->up.hosts && !o->up.cores_per_host && !o->up.hbm)
		o->up.topology = "v3-8";
	return 0;
}

static int demo_fail(pe_client *c, const char *what)
{
	fprintf(stderr, "podemu demo: %s: %s\n", what, pe_last_error(c));
	pe_disconnect(c);
	return 1;
}

/*
 * The scenario of pytorch/xla issue 3510: every core holds N ones, all-gathers them along dim 0
 * (output N x world), releases the input, and reports the sum and its memory.
 */
static int cmd_demo(const struct cli *o)
{
	char url[512];
	state_coordinator_url(url, sizeof(url), o->state_dir);
	pe_client *c;
	if (pe_connect(&c, url) != PE_OK) {
		fprintf(stderr, "podemu demo: %s\n", pe_connect_error());
		return 1;
	}
	int world = pe_world_size(c);
	int64_t n = o->elements > 0 ? o->elements : (1LL << 30) / world;
	pe_tensor *x = pe_full(c, PE_F32, &n, 1, 1.0);
	if (x == NULL || pe_mark_step(c) != PE_OK)
		return demo_fail(c, "fill");
	pe_tensor *y = pe_all_gather(x, 0);
	if (y == NULL)
		return demo_fail(c, "all-gather");
	pe_release(x);
	if (pe_mark_step(c) != PE_OK)
		return demo_fail(c, "all-gather step");
	pe_receive_info receive;
	pe_last_step_receive(c, &receive);
	int64_t dim0 = 0;
	pe_tensor *sum = pe_reduce_sum(y, &dim0, 1);
	if (sum == NULL || pe_mark_step(c) != PE_OK)
		return demo_fail(c, "sum");
	double *sums = calloc((size_t)world, sizeof(double));
	int *have = calloc((size_t)world, sizeof(int));
	pe_memory_info *mem = calloc((size_t)world, sizeof(*mem));
	if (sums == NULL || have == NULL || mem == NULL) {
		fprintf(stderr, "podemu demo: out of memory\n");
		return 1;
	}
	/* A pod without bytes (--backing none) has no sums to read: null, without asking. */
	bool bytes = strcmp(pe_backing(c), "none") != 0;
	for (int r = 0; bytes && r < world; r++) {
		float v;
		int rv = pe_fetch(sum, r, &v, sizeof(v));
		if (rv == PE_OK) {
			sums[r] = v;
			have[r] = 1;
		} else if (rv != PE_FAILED_PRECONDITION) {
			return demo_fail(c, "fetch");
		}
	}
	pe_release(sum);
	if (pe_mark_step(c) != PE_OK || pe_memory_info_all(c, mem, world) != PE_OK)
		return demo_fail(c, "memory info");
	if (o->json) {
		printf("{\"world_size\": %d, \"elements\": %lld, \"receive_bytes\": %lld, "
		       "\"topology\": ",
		       world, (long long)n, (long long)receive.reserved_bytes);
		json_string(stdout, pe_topology(c));
		printf(", \"cores\": [");
		for (int r = 0; r < world; r++) {
			printf("%s{\"ordinal\": %d, \"sum\": ", r ? ", " : "", mem[r].ordinal);
			if (have[r])
				printf("%.17g", sums[r]);
			else
				printf("null");
			printf(
			    ", \"bytes_used\": %lld, \"peak_bytes_used\": %lld, \"bytes_limit\": "
			    "%lld}",
			    (long long)mem[r].bytes_used, (long long)mem[r].peak_bytes_used,
			    (long long)mem[r].bytes_limit);
		}
		printf("]}\n");
	} else {
		printf("all-gather of f32[%lld] per core on %s (%d cores): output f32[%lld]\n",
		       (long long)n, pe_topology(c), world, (long long)n * world);
		printf("%7s %20s %16s %16s %16s\n", "ordinal", "sum", "bytes_used",
		       "peak_bytes_used", "bytes_limit");
		for (int r = 0; r < world; r++) {
			char sum_text[32] = "null";
			if (have[r])
				snprintf(sum_text, sizeof(sum_text), "%.17g", sums[r]);
			printf("%7d %20s %16lld %16lld %16lld\n", mem[r].ordinal, sum_text,
			       (long long)mem[r].bytes_used, (long long)mem[r].peak_bytes_used,
			       (long long)mem[r].bytes_limit);
		}
		if (receive.reserved_bytes > 0)
			printf(
			    "the peak includes %lld bytes per core of receive slots, where chunks "
			    "from other hosts wait\nthat cannot be read into the output yet\n",
			    (long long)receive.reserved_bytes);
	}
	free(sums);
	free(have);
	free(mem);
	pe_disconnect(c);
	return 0;
}

static int cmd_bench(struct cli *o)
{
	char url[512];
	state_coordinator_url(url, sizeof(url), o->state_dir);
	pe_client *c;
	if (pe_connect(&c, url) != PE_OK) {
		fprintf(stderr, "podemu bench: %s\n", pe_connect_error());
		return 1;
	}
	o->bench.json = o->json;
	if (o->bench.iters < 1 || o->bench.warmup < 0 || o->bench.min_bytes > o->bench.max_bytes) {
		fprintf(stderr,
		        "podemu bench: need --iters >= 1, --warmup >= 0, min <= max bytes\n");
		pe_disconnect(c);
		return 2;
	}
	int rc = bench_run(c, &o->bench);
	pe_disconnect(c);
	return rc;
}

/* The topology to plan for: the one given, else the running pod's. */
static int compile_topology(const struct cli *o, struct topology *topo)
{
	struct status st;
	if (o->topology_given) {
		int64_t hbm = 16LL << 30;
		int rv = ST_OK;
		if (o->up.topology != NULL)
			rv = topology_from_preset(topo, o->up.topology, &st);
		else if (o->up.hbm == NULL || (rv = parse_size(&hbm, o->up.hbm, &st)) == ST_OK)
			rv = topology_custom(topo, o->up.hosts ? o->up.hosts : 1,
			                     o->up.cores_per_host ? o->up.cores_per_host : 8, hbm,
			                     &st);
		if (rv != ST_OK)
			fprintf(stderr, "podemu compile: %s\n", st.message);
		return rv;
	}
	pe_client *c;
	if (pe_connect(&c, NULL) != PE_OK) {
		fprintf(
		    stderr,
		    "podemu compile: give --topology NAME to plan offline, or start a pod: %s\n",
		    pe_connect_error());
		return ST_UNAVAILABLE;
	}
	pe_memory_info m;
	int rv = topology_from_preset(topo, pe_topology(c), &st);
	if (rv != ST_OK && pe_memory_info_get(c, 0, &m) == PE_OK)
		rv = topology_custom(topo, pe_num_hosts(c), pe_world_size(c) / pe_num_hosts(c),
		                     m.bytes_limit, &st);
	if (rv != ST_OK)
		fprintf(stderr, "podemu compile: the running pod's topology: %s\n", st.message);
	pe_disconnect(c);
	return rv;
}

static int cmd_compile_file(const struct cli *o)
{
	if (o->file == NULL) {
		fprintf(stderr, "podemu compile: which HLO file? (podemu compile FILE.hlo)\n");
		return 2;
	}
	if (o->layout != NULL && strcmp(o->layout, "tpu") != 0 && strcmp(o->layout, "none") != 0) {
		fprintf(stderr, "podemu compile: --layout must be tpu or none\n");
		return 2;
	}
	int64_t chunk = 0;
	struct status st;
	if (o->up.chunk_bytes != NULL && parse_size(&chunk, o->up.chunk_bytes, &st) != ST_OK) {
		fprintf(stderr, "podemu compile: --chunk-bytes: %s\n", st.message);
		return 2;
	}
	/* XLA's combiners merge up to 30 MiB by default. */
	int64_t combine = 30 << 20;
	if (o->combine_threshold != NULL &&
	    parse_size(&combine, o->combine_threshold, &st) != ST_OK) {
		fprintf(stderr, "podemu compile: --combine-threshold-bytes: %s\n", st.message);
		return 2;
	}
	if (o->up.fusion && strcmp(o->up.fusion, "none") != 0 &&
	    strcmp(o->up.fusion, "elementwise") != 0) {
		fprintf(stderr, "podemu compile: --fusion must be elementwise or none\n");
		return 2;
	}
	if (o->up.scheduler && strcmp(o->up.scheduler, "recorded") != 0 &&
	    strcmp(o->up.scheduler, "memory-aware") != 0) {
		fprintf(stderr, "podemu compile: --scheduler must be memory-aware or recorded\n");
		return 2;
	}
	int strategy = ag_strategy_parse(o->ag_strategy ? o->ag_strategy : "native");
	if (strategy < 0) {
		fprintf(stderr, "podemu compile: --all-gather-strategy must be native, "
		                "via-all-reduce or decomposed\n");
		return 2;
	}
	struct topology topo;
	if (compile_topology(o, &topo) != ST_OK)
		return 2;
	struct compile_options co = {.file = o->file,
	                             .json = o->json,
	                             .tiled = o->layout == NULL || strcmp(o->layout, "tpu") == 0,
	                             .chunk_bytes = chunk,
	                             .all_gather = strategy,
	                             .no_alias = o->no_alias,
	                             .combine_threshold_bytes = combine,
	                             .no_fusion = o->up.fusion && strcmp(o->up.fusion, "none") == 0,
	                             .recorded_order = o->up.scheduler &&
	                                               strcmp(o->up.scheduler, "recorded") == 0,
	                             .svg = o->svg};
	return cmd_compile(&co, &topo);
}

int main(int argc, char **argv)
{
	if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "help") == 0) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	const char *cmd = argv[1];
	struct cli o;
	memset(&o, 0, sizeof(o));
	o.up.backing = "host";
	o.up.bind_to = "cpu";
	o.up.port = 7460;
	o.up.timeout_ms = 60000;
	o.bench = (struct bench_options){.ops = "all-gather,reduce-scatter,all-reduce",
	                                 .min_bytes = 1 << 20,
	                                 .max_bytes = 64 << 20,
	                                 .factor = 2,
	                                 .dtype = "f32",
	                                 .iters = 5,
	                                 .warmup = 1};
	if (parse(&o, argc - 1, argv + 1) != 0)
		return 2;
	/* The library finds the coordinator's address and the pod token through it. */
	setenv("PODEMU_STATE_DIR", o.state_dir, 1);
	if (strcmp(cmd, "up") == 0)
		return pod_up(&o.up);
	if (strcmp(cmd, "down") == 0)
		return pod_down(o.state_dir);
	if (strcmp(cmd, "status") == 0)
		return cli_status(o.state_dir, o.json, o.all);
	if (strcmp(cmd, "demo") == 0)
		return cmd_demo(&o);
	if (strcmp(cmd, "bench") == 0)
		return cmd_bench(&o);
	if (strcmp(cmd, "compile") == 0)
		return cmd_compile_file(&o);
	if (strcmp(cmd, "run") == 0) {
		if (o.file == NULL) {
			fprintf(stderr, "podemu run: which HLO file? (podemu run FILE.hlo)\n");
			return 2;
		}
		struct run_options ro = {.file = o.file,
		                         .fill = o.fill,
		                         .param_dir = o.param_dir,
		                         .json = o.json,
		                         .all_gather_strategy = o.ag_strategy};
		return cmd_run(&ro);
	}
	if (strcmp(cmd, "mem") == 0) {
		if (o.svg == NULL) {
			fprintf(stderr,
			        "podemu mem: where to draw? (podemu mem FILE.hlo --svg OUT.svg)\n");
			return 2;
		}
		return cmd_compile_file(&o);
	}
	fprintf(stderr, "podemu: unknown command '%s'\n", cmd);
	usage(stderr);
	return 2;
}
