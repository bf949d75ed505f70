#include "pod.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "arena.h"
#include "podemu.pb-c.h"
#include "rpc.h"
#include "services.h"
#include "statedir.h"
#include "status.h"
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
static int wait_ready(const char *url, const char *token, int64_t deadline, char *why,
                      size_t why_len)
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
				for (size_t i = 0; i < ps->n_hosts; i++)
					alive += ps->hosts[i]->alive;
				snprintf(why, why_len, "%d of %d hosts registered", alive,
				         ps->num_hosts);
				arena_free(a);
				if (ready) {
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
	rpc_client_close(c);
	return -1;
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
	char path[PATH_MAX], log[PATH_MAX], url_file[PATH_MAX];
	snprintf(path, sizeof(path), "%s/coordinator.pid", o->state_dir);
	pid_t old = read_pid(path);
	if (old > 0 && pid_is_podemu(old)) {
		fprintf(stderr,
		        "podemu up: a pod is already running in %s (coordinator pid %d); run "
		        "`podemu down --state-dir %s` first\n",
		        o->state_dir, (int)old, o->state_dir);
		return 1;
	}
	snprintf(url_file, sizeof(url_file), "%s/%s", o->state_dir, STATE_COORDINATOR_FILE);
	unlink(url_file);
	/* A fresh secret for this pod, readable by its owner only. */
	char token[TOKEN_MAX + 1], token_file[PATH_MAX];
	snprintf(token_file, sizeof(token_file), "%s/%s", o->state_dir, STATE_TOKEN_FILE);
	int tfd = -1;
	if (token_generate(token, &st) != ST_OK ||
	    (tfd = open(token_file, O_WRONLY | O_CREAT | O_TRUNC, 0600)) < 0 ||
	    write(tfd, token, strlen(token)) != (ssize_t)strlen(token)) {
		fprintf(stderr, "podemu up: cannot write the pod token to %s\n", token_file);
		if (tfd >= 0)
			close(tfd);
		return 1;
	}
	close(tfd);

	char dir[PATH_MAX], exe[PATH_MAX + 32];
	bin_dir(dir, sizeof(dir));
	snprintf(exe, sizeof(exe), "%s/podemu-coordinator", dir);
	char listen[64], hosts[16], cores[16], hbm[32];
	snprintf(listen, sizeof(listen), "tcp://127.0.0.1:%d", o->port);
	char *argv[32];
	int argc = 0;
	argv[argc++] = exe;
	argv[argc++] = "--listen";
	argv[argc++] = listen;
	argv[argc++] = "--address-file";
	argv[argc++] = url_file;
	argv[argc++] = "--token-file";
	argv[argc++] = token_file;
	if (o->topology != NULL) {
		argv[argc++] = "--topology";
		argv[argc++] = (char *)o->topology;
	} else {
		snprintf(hosts, sizeof(hosts), "%d", topo.num_hosts);
		snprintf(cores, sizeof(cores), "%d", topo.cores_per_host);
		snprintf(hbm, sizeof(hbm), "%lld", (long long)topo.hbm_bytes);
		argv[argc++] = "--hosts";
		argv[argc++] = hosts;
		argv[argc++] = "--cores-per-host";
		argv[argc++] = cores;
		argv[argc++] = "--hbm";
		argv[argc++] = hbm;
	}
	if (o->chunk_bytes != NULL) {
		argv[argc++] = "--chunk-bytes";
		argv[argc++] = (char *)o->chunk_bytes;
	}
	if (o->collective_timeout_ms != NULL) {
		argv[argc++] = "--collective-timeout-ms";
		argv[argc++] = (char *)o->collective_timeout_ms;
	}
	argv[argc] = NULL;
	snprintf(log, sizeof(log), "%s/coordinator.log", o->state_dir);
	pid_t coordinator = spawn(argv, log);
	if (coordinator < 0 || write_pid(path, coordinator) != 0) {
		fprintf(stderr, "podemu up: cannot start %s\n", exe);
		return 1;
	}

	int64_t deadline = now_ms() + o->timeout_ms;
	char url[512] = "";
	while (now_ms() < deadline) {
		FILE *f = fopen(url_file, "r");
		if (f != NULL) {
			if (fgets(url, sizeof(url), f) == NULL)
				url[0] = '\0';
			fclose(f);
			url[strcspn(url, "\r\n")] = '\0';
			if (url[0] != '\0')
				break;
		}
		int status;
		if (waitpid(coordinator, &status, WNOHANG) == coordinator) {
			fprintf(stderr, "podemu up: the coordinator exited\n");
			print_log_tail(log);
			unlink(path);
			return 1;
		}
		sleep_ms(20);
	}
	if (url[0] == '\0') {
		fprintf(stderr, "podemu up: the coordinator did not start listening\n");
		print_log_tail(log);
		pod_down(o->state_dir);
		return 1;
	}

	snprintf(exe, sizeof(exe), "%s/podemu-agent", dir);
	for (int h = 0; h < topo.num_hosts; h++) {
		char index[16];
		snprintf(index, sizeof(index), "%d", h);
		char *aargv[] = {exe,
		                 "--coordinator",
		                 url,
		                 "--host-index",
		                 index,
		                 "--backing",
		                 (char *)o->backing,
		                 "--token-file",
		                 token_file,
		                 NULL};

		snprintf(log, sizeof(log), "%s/agent-%d.log", o->state_dir, h);
		snprintf(path, sizeof(path), "%s/agent-%d.pid", o->state_dir, h);
		pid_t pid = spawn(aargv, log);
		if (pid < 0 || write_pid(path, pid) != 0) {
			fprintf(stderr, "podemu up: cannot start %s\n", exe);
			pod_down(o->state_dir);
			return 1;
		}
	}
	char why[512] = "no answer";
	if (wait_ready(url, token, deadline, why, sizeof(why)) != 0) {
		fprintf(stderr, "podemu up: the pod did not become ready within %d ms (%s)\n",
		        o->timeout_ms, why);
		snprintf(log, sizeof(log), "%s/coordinator.log", o->state_dir);
		print_log_tail(log);
		pod_down(o->state_dir);
		return 1;
	}
	printf("pod %s is ready: %d hosts x %d cores, coordinator %s, backing %s, state %s\n",
	       topo.name, topo.num_hosts, topo.cores_per_host, url, o->backing, o->state_dir);
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
