/*
 * Integration tests: start a real pod with `podemu up` in a temporary state directory on a free
 * port, and always stop it again (also when a test crashes).
 */
#ifndef PODEMU_TEST_POD_FIXTURE_H
#define PODEMU_TEST_POD_FIXTURE_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
	snprintf(pod_state_dir, sizeof(pod_state_dir), "/tmp/podemu-test-XXXXXX");
	if (mkdtemp(pod_state_dir) == NULL)
		return NULL;
	atexit(pod_stop);
	signal(SIGSEGV, pod_crash_handler);
	signal(SIGABRT, pod_crash_handler);
	signal(SIGTERM, pod_crash_handler);
	signal(SIGINT, pod_crash_handler);
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

#endif
