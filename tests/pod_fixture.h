/*
 * Integration tests: start a real pod with `podemu up` in a temporary state directory on a free
 * port, and always stop it again (also when a test crashes).
 */
#ifndef PODEMU_TEST_POD_FIXTURE_H
#define PODEMU_TEST_POD_FIXTURE_H

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "podemu/podemu.h"

static char pod_state_dir[256];

static void pod_stop(void)
{
	if (pod_state_dir[0] == '\0')
		return;
	char cmd[1024];
	snprintf(cmd, sizeof(cmd), "%s/podemu down --state-dir %s >/dev/null; rm -rf %s",
	         PODEMU_BIN_DIR, pod_state_dir, pod_state_dir);
	if (system(cmd) != 0)
		fprintf(stderr, "pod_stop: '%s' failed\n", cmd);
	pod_state_dir[0] = '\0';
}

static void pod_crash_handler(int sig)
{
	pod_stop();
	signal(sig, SIG_DFL);
	raise(sig);
}

/* Starts a pod with the given `podemu up` arguments and connects to it; NULL on failure. */
static pe_client *pod_start(const char *args)
{
	pod_stop(); /* the pod of a test that failed before it stopped it */
	snprintf(pod_state_dir, sizeof(pod_state_dir), "/tmp/podemu-test-XXXXXX");
	if (mkdtemp(pod_state_dir) == NULL)
		return NULL;
	atexit(pod_stop);
	signal(SIGSEGV, pod_crash_handler);
	signal(SIGABRT, pod_crash_handler);
	signal(SIGTERM, pod_crash_handler);
	signal(SIGINT, pod_crash_handler);
	/* Killed outright (ctest's timeout), this process runs no handler: the pod goes with it. */
	char self[32];
	snprintf(self, sizeof(self), "%d", (int)getpid());
	setenv("PODEMU_EXIT_WITH", self, 1);
	char cmd[1024];
	snprintf(cmd, sizeof(cmd), "%s/podemu up --state-dir %s --port 0 %s", PODEMU_BIN_DIR,
	         pod_state_dir, args);
	if (system(cmd) != 0)
		return NULL;
	char url_file[512], url[256] = "";
	snprintf(url_file, sizeof(url_file), "%s/coordinator.url", pod_state_dir);
	FILE *f = fopen(url_file, "r");
	if (f == NULL)
		return NULL;
	if (fgets(url, sizeof(url), f) == NULL)
		url[0] = '\0';
	fclose(f);
	url[strcspn(url, "\n")] = '\0';
	setenv("PODEMU_STATE_DIR", pod_state_dir, 1); /* where the pod token is */
	pe_client *c;
	if (pe_connect(&c, url) != PE_OK) {
		fprintf(stderr, "pe_connect: %s\n", pe_connect_error());
		return NULL;
	}
	return c;
}

/* Every core's bytes in use, used[0..n) (n: the pod's world size, at most 64); a pe code. */
static inline int pod_bytes_used(pe_client *c, int64_t *used, int n)
{
	pe_memory_info m[64];
	int rv = n <= 64 ? pe_memory_info_all(c, m, n) : PE_INVALID_ARGUMENT;
	for (int i = 0; rv == PE_OK && i < n; i++)
		used[i] = m[i].bytes_used;
	return rv;
}

/* Seconds on the monotonic clock. */
static inline double pod_now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The pid of a pod daemon ("coordinator", "agent-1"), or 0. */
static inline pid_t pod_pid(const char *name)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s.pid", pod_state_dir, name);
	FILE *f = fopen(path, "r");
	int pid = 0;
	if (f != NULL) {
		if (fscanf(f, "%d", &pid) != 1)
			pid = 0;
		fclose(f);
	}
	return (pid_t)pid;
}

/* True once the daemon's log has text after byte offset from (polls up to 10 s). */
static inline int pod_log_has(const char *name, long from, const char *text)
{
	char path[512], line[1024];
	snprintf(path, sizeof(path), "%s/%s.log", pod_state_dir, name);
	for (int i = 0; i < 1000; i++) {
		FILE *f = fopen(path, "r");
		int found = 0;
		if (f != NULL && fseek(f, from, SEEK_SET) == 0)
			while (!found && fgets(line, sizeof(line), f) != NULL)
				found = strstr(line, text) != NULL;
		if (f != NULL)
			fclose(f);
		if (found)
			return 1;
		struct timespec ts = {0, 10 * 1000000};
		nanosleep(&ts, NULL);
	}
	return 0;
}

/*
 * Kills a pod daemon with sig and starts it again with the same command line (the coordinator
 * on the address it had), detached like `podemu up` starts it; then waits until its log says
 * wait_for (unless NULL). Returns the new pid or -1.
 */
static inline pid_t pod_restart(const char *name, int sig, const char *wait_for)
{
	pid_t old = pod_pid(name);
	char path[512], args[8192], url[256] = "";
	snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)old);
	FILE *f = old > 0 ? fopen(path, "r") : NULL;
	if (f == NULL)
		return -1;
	size_t len = fread(args, 1, sizeof(args) - 1, f);
	fclose(f);
	args[len] = '\0';
	snprintf(path, sizeof(path), "%s/coordinator.url", pod_state_dir);
	if ((f = fopen(path, "r")) != NULL) {
		if (fgets(url, sizeof(url), f) == NULL)
			url[0] = '\0';
		url[strcspn(url, "\n")] = '\0';
		fclose(f);
	}
	char *argv[64];
	int argc = 0;
	for (size_t at = 0; at < len && argc < 63; at += strlen(args + at) + 1) {
		argv[argc] = args + at;
		if (argc > 0 && strcmp(argv[argc - 1], "--listen") == 0 &&
		    strcmp(name, "coordinator") == 0 && url[0] != '\0')
			argv[argc] = url;
		argc++;
	}
	argv[argc] = NULL;
	kill(old, sig);
	/* Gone once /proc says so or shows a zombie (whoever adopted it may reap it late). */
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)old);
	for (int i = 0; i < 500; i++) {
		char stat[512] = "";
		FILE *sf = fopen(path, "r");
		if (sf == NULL)
			break;
		size_t got = fread(stat, 1, sizeof(stat) - 1, sf);
		fclose(sf);
		stat[got] = '\0';
		char *paren = strrchr(stat, ')');
		if (paren != NULL && paren[1] == ' ' && paren[2] == 'Z')
			break;
		struct timespec ts = {0, 10 * 1000000};
		nanosleep(&ts, NULL);
	}
	snprintf(path, sizeof(path), "%s/%s.log", pod_state_dir, name);
	long log_end = 0;
	if ((f = fopen(path, "r")) != NULL) {
		fseek(f, 0, SEEK_END);
		log_end = ftell(f);
		fclose(f);
	}
	int fds[2];
	if (pipe(fds) != 0)
		return -1;
	pid_t child = fork();
	if (child == 0) {
		setsid();
		pid_t pid = fork();
		if (pid == 0) {
			char log[512];
			snprintf(log, sizeof(log), "%s/%s.log", pod_state_dir, name);
			int out = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
			int in = open("/dev/null", O_RDONLY);
			dup2(in, 0);
			dup2(out, 1);
			dup2(out, 2);
			for (int fd = 3; fd < 1024; fd++)
				close(fd);
			execv(argv[0], argv);
			_exit(127);
		}
		if (write(fds[1], &pid, sizeof(pid)) != sizeof(pid))
			_exit(1);
		_exit(0);
	}
	close(fds[1]);
	pid_t pid = -1;
	if (read(fds[0], &pid, sizeof(pid)) != sizeof(pid))
		pid = -1;
	close(fds[0]);
	waitpid(child, NULL, 0);
	snprintf(path, sizeof(path), "%s/%s.pid", pod_state_dir, name);
	if (pid > 0 && (f = fopen(path, "w")) != NULL) {
		fprintf(f, "%d\n", (int)pid);
		fclose(f);
	}
	if (pid > 0 && wait_for != NULL && !pod_log_has(name, log_end, wait_for))
		return -1;
	return pid;
}

#endif
