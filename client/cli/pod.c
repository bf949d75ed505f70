#include "pod.h"
#include "progress.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "arena.h"
#include "cpus.h"
#include "podemu.pb-c.h"
#include "rpc.h"
#include "services.h"
#include "statedir.h"
#include "status.h"
#include "tls.h"
#include "token.h"
#include "topology.h"

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
	nanosleep(&ts, NULL);
}

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The folder this executable lives in; the daemons are installed beside it. */
static void bin_dir(char *out, size_t len)
{
	const char *env = getenv("PODEMU_BIN_DIR");
	if (env != NULL && env[0] != '\0') {
		snprintf(out, len, "%s", env);
		return;
	}
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n <= 0) {
		snprintf(out, len, ".");
		return;
	}
	exe[n] = '\0';
	char *slash = strrchr(exe, '/');
	if (slash != NULL)
		*slash = '\0';
	snprintf(out, len, "%s", exe);
}

/* True when pid is a live (not zombie) podemu daemon. */
static int pid_is_podemu(pid_t pid)
{
	char path[64], buf[4096];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	if (f == NULL)
		return 0;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	char *close_paren = strrchr(buf, ')');
	if (close_paren == NULL || close_paren[1] == '\0' || close_paren[2] == 'Z')
		return 0;
	return strstr(buf, "(podemu-") != NULL;
}

static pid_t read_pid(const char *path)
{
	FILE *f = fopen(path, "r");
	if (f == NULL)
		return 0;
	int pid = 0;
	if (fscanf(f, "%d", &pid) != 1)
		pid = 0;
	fclose(f);
	return (pid_t)pid;
}

static int write_pid(const char *path, pid_t pid)
{
	FILE *f = fopen(path, "w");
	if (f == NULL)
		return -1;
	fprintf(f, "%d\n", (int)pid);
	return fclose(f);
}

/* Starts argv in the background with its output in log; returns its pid or -1. */
static pid_t spawn(char *const argv[], const char *log)
{
	pid_t pid = fork();
	if (pid != 0)
		return pid;
	setsid();
	int in = open("/dev/null", O_RDONLY);
	int out = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
	if (in < 0 || out < 0)
		_exit(127);
	dup2(in, 0);
	dup2(out, 1);
	dup2(out, 2);
	for (int fd = 3; fd < 1024; fd++)
		close(fd);
	execv(argv[0], argv);
	dprintf(2, "podemu: cannot run %s: %s\n", argv[0], strerror(errno));
	_exit(127);
}

static void print_log_tail(const char *log)
{
	FILE *f = fopen(log, "r");
	if (f == NULL)
		return;
	char lines[8][512];
	int n = 0;
	while (fgets(lines[n % 8], sizeof(lines[0]), f) != NULL)
		n++;
	fclose(f);
	fprintf(stderr, "--- last lines of %s ---\n", log);
	for (int i = n > 8 ? n - 8 : 0; i < n; i++)
		fputs(lines[i % 8], stderr);
}

/* Polls the coordinator until the pod is ready or the deadline passes. */
/*
 * Waits until the coordinator says the pod is ready and every agent this command started
 * (started[h] = its pid, 0 for a host left alone) has registered itself: until then the
 * registration of the process it replaces may still stand.
 */
static int wait_ready(const char *url, const char *token, const pid_t *started, int num_hosts,
                      int64_t deadline, char *why, size_t why_len)
{
	struct rpc_client *c = NULL;
	struct status st;
	status_clear(&st);
	while (now_ms() < deadline) {
		if (c == NULL && rpc_client_open(&c, url, false, &st) != ST_OK)
			c = NULL;
		if (c != NULL)
			rpc_client_set_token(c, token);
		if (c != NULL) {
			struct arena *a = arena_new();
			Podemu__StatusRequest req = PODEMU__STATUS_REQUEST__INIT;
			void *reply;
			if (a != NULL &&
			    rpc_call(c, &podemu__coordinator__descriptor, CM_GET_STATUS, &req, a,
			             &reply, 2000, &st) == ST_OK) {
				Podemu__PodStatus *ps = reply;
				int ready = ps->ready;
				int alive = 0;
				for (size_t i = 0; i < ps->n_hosts; i++) {
					const Podemu__HostInfo *hi = ps->hosts[i];
					alive += hi->alive;
					if (hi->index >= 0 && hi->index < num_hosts &&
					    started[hi->index] != 0 &&
					    hi->pid != started[hi->index])
						ready = 0; /* still the replaced process */
				}
				snprintf(why, why_len, "%d of %d hosts registered", alive,
				         ps->num_hosts);
				progress_show("podemu up: %s", why);
				arena_free(a);
				if (ready) {
					progress_clear();
					rpc_client_close(c);
					return 0;
				}
			} else {
				snprintf(why, why_len, "%s", st.message);
				arena_free(a);
			}
		}
		sleep_ms(100);
	}
	progress_clear();
	rpc_client_close(c);
	return -1;
}

/* Reads the first line of a file into out ("" when missing). */
static void read_line(const char *path, char *out, size_t len)
{
	out[0] = '\0';
	FILE *f = fopen(path, "r");
	if (f == NULL)
		return;
	if (fgets(out, (int)len, f) == NULL)
		out[0] = '\0';
	fclose(f);
	out[strcspn(out, "\r\n")] = '\0';
}

/* The parts of a state directory the daemons are started with. */
/*
 * What a pod was started with, kept in the state directory so that `podemu up` restarts a
 * missing coordinator with the pod's shape whatever its own command line says: the agents'
 * backing on the first line, then the coordinator's options, one word a line.
 */
#define POD_ARGS_FILE "pod.args"
/* How many hosts each agent process of the pod emulates: a resumed pod keeps it. */
#define HOSTS_PER_AGENT_FILE "hosts-per-agent"
#define POD_ARGS_MAX 24

struct pod_files {
	const char *dir;
	char token_file[PATH_MAX];
	char url_file[PATH_MAX];
	char token[TOKEN_MAX + 1];
	char exe_dir[PATH_MAX];
	char backing[8];              /* from pod.args when resuming */
	char args[POD_ARGS_MAX][256]; /* the coordinator's saved options */
	int saved_args;               /* how many (0: none saved, or a fresh pod) */
};

/* Loads pod.args into pf; false when there is none. */
static bool load_pod_args(struct pod_files *pf)
{
	char path[PATH_MAX], line[256];
	snprintf(path, sizeof(path), "%s/%s", pf->dir, POD_ARGS_FILE);
	FILE *f = fopen(path, "r");
	if (f == NULL)
		return false;
	pf->saved_args = 0;
	bool first = true;
	while (fgets(line, sizeof(line), f) != NULL && pf->saved_args < POD_ARGS_MAX) {
		line[strcspn(line, "\n")] = '\0';
		if (first)
			snprintf(pf->backing, sizeof(pf->backing), "%s", line);
		else
			snprintf(pf->args[pf->saved_args++], sizeof(pf->args[0]), "%s", line);
		first = false;
	}
	fclose(f);
	return !first;
}

/* Starts the coordinator listening on listen and waits until it wrote its address to url. */
static int start_coordinator(const struct up_options *o, const struct topology *topo,
                             struct pod_files *pf, const char *listen, int64_t deadline, char *url,
                             size_t url_len)
{
	char exe[PATH_MAX + 32], path[PATH_MAX], log[PATH_MAX];
	snprintf(exe, sizeof(exe), "%s/podemu-coordinator", pf->exe_dir);
	char hosts[16], cores[16], hbm[32];
	char *argv[32 + POD_ARGS_MAX];
	int argc = 0;
	argv[argc++] = exe;
	argv[argc++] = "--listen";
	argv[argc++] = (char *)listen;
	argv[argc++] = "--address-file";
	argv[argc++] = pf->url_file;
	argv[argc++] = "--token-file";
	argv[argc++] = pf->token_file;
	int shape_from = argc;
	if (pf->saved_args > 0) {
		for (int i = 0; i < pf->saved_args; i++)
			argv[argc++] = pf->args[i];
	} else if (o->topology != NULL) {
		argv[argc++] = "--topology";
		argv[argc++] = (char *)o->topology;
	} else {
		snprintf(hosts, sizeof(hosts), "%d", topo->num_hosts);
		snprintf(cores, sizeof(cores), "%d", topo->cores_per_host);
		snprintf(hbm, sizeof(hbm), "%lld", (long long)topo->hbm_bytes);
		argv[argc++] = "--hosts";
		argv[argc++] = hosts;
		argv[argc++] = "--cores-per-host";
		argv[argc++] = cores;
		argv[argc++] = "--hbm";
		argv[argc++] = hbm;
	}
	/* Options passed to the coordinator as given. */
	const struct {
		const char *flag, *value;
	} passed[] = {{"--chunk-bytes", o->chunk_bytes},
	              {"--window", o->window},
	              {"--collective-timeout-ms", o->collective_timeout_ms},
	              {"--heartbeat-timeout-ms", o->heartbeat_timeout_ms},
	              {"--session-lease-ms", o->session_lease_ms},
	              {"--combine-threshold-bytes", o->combine_threshold},
	              {"--scheduler", o->scheduler},
	              {"--fusion", o->fusion},
	              {"--layout", o->layout}};
	for (size_t k = 0; k < sizeof(passed) / sizeof(passed[0]); k++)
		if (passed[k].value != NULL) {
			argv[argc++] = (char *)passed[k].flag;
			argv[argc++] = (char *)passed[k].value;
		}
	char http_listen[64], http_file[PATH_MAX];
	if (o->http_port != NULL) {
		snprintf(http_listen, sizeof(http_listen), "127.0.0.1:%s", o->http_port);
		snprintf(http_file, sizeof(http_file), "%s/http.url", pf->dir);
		argv[argc++] = "--http-listen";
		argv[argc++] = http_listen;
		argv[argc++] = "--http-file";
		argv[argc++] = http_file;
	}
	argv[argc] = NULL;
	if (pf->saved_args == 0) {
		/* A fresh pod: remember its shape for restarts. */
		char args_path[PATH_MAX];
		snprintf(args_path, sizeof(args_path), "%s/%s", pf->dir, POD_ARGS_FILE);
		FILE *f = fopen(args_path, "w");
		if (f != NULL) {
			fprintf(f, "%s\n", o->backing);
			for (int i = shape_from; i < argc; i++)
				fprintf(f, "%s\n", argv[i]);
			fclose(f);
		}
	}
	unlink(pf->url_file);
	snprintf(log, sizeof(log), "%s/coordinator.log", pf->dir);
	snprintf(path, sizeof(path), "%s/coordinator.pid", pf->dir);
	pid_t coordinator = spawn(argv, log);
	if (coordinator < 0 || write_pid(path, coordinator) != 0) {
		fprintf(stderr, "podemu up: cannot start %s\n", exe);
		return -1;
	}
	url[0] = '\0';
	while (now_ms() < deadline) {
		read_line(pf->url_file, url, url_len);
		if (url[0] != '\0')
			return 0;
		int status;
		if (waitpid(coordinator, &status, WNOHANG) == coordinator) {
			fprintf(stderr, "podemu up: the coordinator exited\n");
			print_log_tail(log);
			unlink(path);
			return -1;
		}
		sleep_ms(20);
	}
	fprintf(stderr, "podemu up: the coordinator did not start listening\n");
	print_log_tail(log);
	return -1;
}

/* True when host h's agent (recorded in the state directory) runs. */
static bool agent_running(const struct pod_files *pf, int h)
{
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/agent-%d.pid", pf->dir, h);
	pid_t running = read_pid(path);
	return running > 0 && pid_is_podemu(running);
}

/*
 * Starts one agent process for hosts first..first+count-1 (its log agent-FIRST.log, its pid in
 * every host's agent-H.pid); 0 on success.
 */
static int start_agent(struct pod_files *pf, int first, int count, const char *url,
                       const char *backing, const char *cpus, pid_t *pids)
{
	char exe[PATH_MAX + 32], path[PATH_MAX], log[PATH_MAX], index[32];
	snprintf(exe, sizeof(exe), "%s/podemu-agent", pf->exe_dir);
	if (count == 1)
		snprintf(index, sizeof(index), "%d", first);
	else
		snprintf(index, sizeof(index), "%d-%d", first, first + count - 1);
	char *argv[16] = {exe,         "--coordinator", (char *)url,    "--host-index", index,
	                  "--backing", (char *)backing, "--token-file", pf->token_file};
	int argc = 9;
	if (tls_url(url)) {
		/* Over TLS like the coordinator; the identity comes from PODEMU_TLS_*. */
		argv[argc++] = "--listen";
		argv[argc++] = "tls+tcp://127.0.0.1:0";
		argv[argc++] = "--control-listen";
		argv[argc++] = "tls+tcp://127.0.0.1:0";
	}
	if (cpus != NULL) {
		argv[argc++] = "--cpus";
		argv[argc++] = (char *)cpus;
	}
	argv[argc] = NULL;
	snprintf(log, sizeof(log), "%s/agent-%d.log", pf->dir, first);
	pid_t pid = spawn(argv, log);
	for (int h = first; h < first + count; h++) {
		snprintf(path, sizeof(path), "%s/agent-%d.pid", pf->dir, h);
		if (pid < 0 || write_pid(path, pid) != 0) {
			fprintf(stderr, "podemu up: cannot start %s\n", exe);
			return -1;
		}
		pids[h] = pid;
	}
	return 0;
}

/*
 * Hosts per agent process when --hosts-per-agent is not given. A pod of up to 8 hosts, or with
 * a CPU for every two hosts, runs a process per host, as a real pod does (a killed process is
 * one lost host). Past that, every process costs two thread wake-ups per step and its own
 * threads: four hosts per process (a v3-128 on 2 CPUs: 5 processes instead of 17, a cached
 * step's p50 0.8 ms instead of 1.1, up and demo 1.3 s instead of 1.7, 24 MiB instead of 69),
 * and more past 16 processes per CPU, where processes and their heartbeats starve each other
 * (a v4-4096's 512 hosts on 2 CPUs: 16 per process).
 */
static int default_hosts_per_agent(int num_hosts, int cpus)
{
	if (cpus < 1)
		cpus = 1;
	if (num_hosts <= 8 || num_hosts <= 2 * cpus)
		return 1;
	int processes = 16 * cpus;
	int per = (num_hosts + processes - 1) / processes;
	return per > 4 ? per : 4;
}

/*
 * Starts the agents of hosts that do not run, per agents of per consecutive hosts (a host
 * whose process partly runs gets one of its own). Returns how many started, or -1.
 */
static int start_agents(struct pod_files *pf, int num_hosts, int per, const char *url,
                        const char *backing, const char *bind_to, pid_t *pids)
{
	/*
	 * Hosts do not share CPUs, agents on one machine do: each gets its own, as mpirun binds
	 * ranks (not with one agent or one CPU).
	 */
	cpu_set_t allowed;
	int groups = (num_hosts + per - 1) / per, started = 0;
	bool bind = strcmp(bind_to, "cpu") == 0 && groups > 1 && cpus_allowed(&allowed) > 1;
	for (int g = 0; g < groups; g++) {
		int first = g * per, count = per < num_hosts - first ? per : num_hosts - first;
		int missing = 0;
		for (int h = first; h < first + count; h++)
			missing += !agent_running(pf, h);
		if (missing == 0)
			continue;
		char cpus[1024];
		cpu_set_t mine;
		if (bind)
			cpus_for_agent(&mine, &allowed, g, groups);
		bool bound = bind && cpus_format(&mine, cpus, sizeof(cpus));
		const char *on = bound ? cpus : NULL;
		if (missing == count) {
			if (start_agent(pf, first, count, url, backing, on, pids) != 0)
				return -1;
			started++;
			continue;
		}
		/* Part of the group runs: each missing host gets a process of its own. */
		for (int h = first; h < first + count; h++) {
			if (agent_running(pf, h))
				continue;
			if (start_agent(pf, h, 1, url, backing, on, pids) != 0)
				return -1;
			started++;
		}
	}
	return started;
}

/* Writes a fresh secret for the pod, readable by its owner only. */
static int new_token(struct pod_files *pf)
{
	struct status st;
	int fd = -1;
	if (token_generate(pf->token, &st) != ST_OK ||
	    (fd = open(pf->token_file, O_WRONLY | O_CREAT | O_TRUNC, 0600)) < 0 ||
	    write(fd, pf->token, strlen(pf->token)) != (ssize_t)strlen(pf->token)) {
		fprintf(stderr, "podemu up: cannot write the pod token to %s\n", pf->token_file);
		if (fd >= 0)
			close(fd);
		return -1;
	}
	close(fd);
	return 0;
}

/* True when an agent recorded in the state directory is running. */
static bool any_agent_running(const char *dir)
{
	DIR *d = opendir(dir);
	if (d == NULL)
		return false;
	bool any = false;
	struct dirent *e;
	char path[PATH_MAX];
	while (!any && (e = readdir(d)) != NULL) {
		if (strncmp(e->d_name, "agent-", 6) != 0 || strstr(e->d_name, ".pid") == NULL)
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		pid_t pid = read_pid(path);
		any = pid > 0 && pid_is_podemu(pid);
	}
	closedir(d);
	return any;
}

/*
 * The running pod's size and backing, as its coordinator describes them. The backing comes
 * from a registered host; o->backing when none is.
 */
static int running_pod(const char *url, const char *token, int *num_hosts, char *backing,
                       size_t backing_len, const char *fallback)
{
	struct rpc_client *c;
	struct status st;
	if (rpc_client_open(&c, url, false, &st) != ST_OK)
		return -1;
	rpc_client_set_token(c, token);
	struct arena *a = arena_new();
	Podemu__StatusRequest req = PODEMU__STATUS_REQUEST__INIT;
	void *reply;
	int rv = -1;
	snprintf(backing, backing_len, "%s", fallback);
	if (a != NULL && rpc_call(c, &podemu__coordinator__descriptor, CM_GET_STATUS, &req, a,
	                          &reply, 5000, &st) == ST_OK) {
		Podemu__PodStatus *ps = reply;
		*num_hosts = ps->num_hosts;
		for (size_t i = 0; i < ps->n_hosts; i++)
			if (ps->hosts[i]->backing != NULL && ps->hosts[i]->backing[0] != '\0')
				snprintf(backing, backing_len, "%s", ps->hosts[i]->backing);
		rv = 0;
	} else {
		fprintf(stderr, "podemu up: the running coordinator does not answer: %s\n",
		        st.message);
	}
	arena_free(a);
	rpc_client_close(c);
	return rv;
}

int pod_up(const struct up_options *o)
{
	struct status st;
	struct topology topo;
	int rv;
	if (o->topology == NULL) {
		int64_t hbm = 16LL << 30;
		rv = ST_OK;
		if (o->hbm != NULL)
			rv = parse_size(&hbm, o->hbm, &st);
		if (rv == ST_OK)
			rv = topology_custom(&topo, o->hosts ? o->hosts : 1,
			                     o->cores_per_host ? o->cores_per_host : 8, hbm, &st);
	} else {
		rv = topology_from_preset(&topo, o->topology, &st);
	}
	if (rv != ST_OK) {
		fprintf(stderr, "podemu up: %s\n", st.message);
		return 2;
	}
	if (mkdir(o->state_dir, 0700) != 0 && errno != EEXIST) {
		fprintf(stderr, "podemu up: cannot create state directory %s: %s\n", o->state_dir,
		        strerror(errno));
		return 1;
	}
	struct pod_files pf = {.dir = o->state_dir};
	snprintf(pf.url_file, sizeof(pf.url_file), "%s/%s", o->state_dir, STATE_COORDINATOR_FILE);
	snprintf(pf.token_file, sizeof(pf.token_file), "%s/%s", o->state_dir, STATE_TOKEN_FILE);
	bin_dir(pf.exe_dir, sizeof(pf.exe_dir));
	int64_t deadline = now_ms() + o->timeout_ms;
	char path[PATH_MAX], url[512] = "";
	snprintf(path, sizeof(path), "%s/coordinator.pid", o->state_dir);
	pid_t old = read_pid(path);
	bool coordinator_up = old > 0 && pid_is_podemu(old);
	bool agents_up = any_agent_running(o->state_dir);
	/*
	 * Part of a pod still runs: keep its secret and address and start only what is missing, so
	 * that the running daemons (and their buffers) carry on.
	 */
	bool resume = coordinator_up || agents_up;
	int started = 0, num_hosts = topo.num_hosts;
	char backing[8];
	snprintf(backing, sizeof(backing), "%s", o->backing);
	if (resume) {
		/* The pod's own shape and backing, not this command line's. */
		if (load_pod_args(&pf) && pf.backing[0] != '\0')
			snprintf(backing, sizeof(backing), "%s", pf.backing);
		read_line(pf.token_file, pf.token, sizeof(pf.token));
		read_line(pf.url_file, url, sizeof(url));
		if (pf.token[0] == '\0' || url[0] == '\0') {
			fprintf(
			    stderr,
			    "podemu up: processes of a pod run in %s but its token or address is "
			    "gone; run `podemu down --state-dir %s` first\n",
			    o->state_dir, o->state_dir);
			return 1;
		}
	} else if (new_token(&pf) != 0) {
		return 1;
	}
	if (!coordinator_up) {
		char listen[512];
		if (resume)
			snprintf(listen, sizeof(listen), "%s", url); /* where the agents redial */
		else
			snprintf(listen, sizeof(listen), "%s://127.0.0.1:%d",
			         o->tls ? "tls+tcp" : "tcp", o->port);
		if (start_coordinator(o, &topo, &pf, listen, deadline, url, sizeof(url)) != 0) {
			if (!resume)
				pod_down(o->state_dir);
			return 1;
		}
		started++;
	}
	if (resume) {
		/* The running (or just restarted) coordinator says how many hosts the pod has. */
		char fallback[8];
		snprintf(fallback, sizeof(fallback), "%s", backing);
		if (running_pod(url, pf.token, &num_hosts, backing, sizeof(backing), fallback) != 0)
			return 1;
	}
	pid_t *agent_pids = calloc((size_t)num_hosts, sizeof(pid_t));
	if (agent_pids == NULL) {
		fprintf(stderr, "podemu up: out of memory\n");
		return 1;
	}
	/* Hosts per agent process: as asked, else as the running pod was started, else by size. */
	char per_path[PATH_MAX], per_text[16] = "";
	snprintf(per_path, sizeof(per_path), "%s/%s", o->state_dir, HOSTS_PER_AGENT_FILE);
	if (resume)
		read_line(per_path, per_text, sizeof(per_text));
	cpu_set_t allowed;
	int cpus = cpus_allowed(&allowed);
	int per = o->hosts_per_agent > 0 ? o->hosts_per_agent : atoi(per_text);
	if (per < 1 || per > num_hosts)
		per = default_hosts_per_agent(num_hosts, cpus);
	if (!resume) {
		FILE *f = fopen(per_path, "w");
		if (f != NULL) {
			fprintf(f, "%d\n", per);
			fclose(f);
		}
	}
	int got = start_agents(&pf, num_hosts, per, url, backing, o->bind_to, agent_pids);
	if (got < 0) {
		free(agent_pids);
		if (!resume)
			pod_down(o->state_dir);
		return 1;
	}
	started += got;
	char why[512] = "no answer";
	progress_enable(false);
	rv = wait_ready(url, pf.token, agent_pids, num_hosts, deadline, why, sizeof(why));
	free(agent_pids);
	if (rv != 0) {
		fprintf(stderr, "podemu up: the pod did not become ready within %d ms (%s)\n",
		        o->timeout_ms, why);
		char log[PATH_MAX];
		snprintf(log, sizeof(log), "%s/coordinator.log", o->state_dir);
		print_log_tail(log);
		if (!resume)
			pod_down(o->state_dir);
		return 1;
	}
	if (resume)
		printf("pod in %s was running: started the %d missing processes; coordinator %s\n",
		       o->state_dir, started, url);
	else
		printf(
		    "pod %s is ready: %d hosts x %d cores (%d per agent process), coordinator %s, "
		    "backing %s, state %s\n",
		    topo.name, topo.num_hosts, topo.cores_per_host, per, url, o->backing,
		    o->state_dir);
	return 0;
}

/* Sends SIGTERM, waits up to 10 s, then SIGKILL. */
static void stop_pid(pid_t pid)
{
	if (!pid_is_podemu(pid))
		return;
	kill(pid, SIGTERM);
	for (int i = 0; i < 200 && pid_is_podemu(pid); i++) {
		waitpid(pid, NULL, WNOHANG);
		sleep_ms(50);
	}
	if (pid_is_podemu(pid)) {
		kill(pid, SIGKILL);
		for (int i = 0; i < 100 && pid_is_podemu(pid); i++) {
			waitpid(pid, NULL, WNOHANG);
			sleep_ms(20);
		}
	}
	waitpid(pid, NULL, WNOHANG);
}

int pod_down(const char *state_dir)
{
	DIR *d = opendir(state_dir);
	if (d == NULL) {
		fprintf(stderr, "podemu down: no pod in %s\n", state_dir);
		return 0;
	}
	char path[PATH_MAX];
	int stopped = 0;
	struct dirent *e;
	/* Agents first, so none of them outlives its coordinator in a failed state. */
	for (int pass = 0; pass < 2; pass++) {
		rewinddir(d);
		while ((e = readdir(d)) != NULL) {
			size_t n = strlen(e->d_name);
			if (n < 5 || strcmp(e->d_name + n - 4, ".pid") != 0)
				continue;
			int is_coordinator = strcmp(e->d_name, "coordinator.pid") == 0;
			if (is_coordinator != (pass == 1))
				continue;
			snprintf(path, sizeof(path), "%s/%s", state_dir, e->d_name);
			pid_t pid = read_pid(path);
			if (pid > 0 && pid_is_podemu(pid)) {
				stop_pid(pid);
				stopped++;
			}
			unlink(path);
		}
	}
	closedir(d);
	snprintf(path, sizeof(path), "%s/%s", state_dir, STATE_COORDINATOR_FILE);
	unlink(path);
	printf("stopped %d processes in %s\n", stopped, state_dir);
	return 0;
}
