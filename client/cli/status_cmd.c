#include "status_cmd.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "arena.h"
#include "podemu.pb-c.h"
#include "podjson.h"
#include "rpc.h"
#include "services.h"
#include "statedir.h"
#include "status.h"

/* Pods with more cores than this print only their summary unless --all. */
#define STATUS_DETAIL_CORES 32

static void print_summary(const Podemu__PodStatus *ps)
{
	int alive = 0, processes = 0;
	int64_t rss = 0;
	for (size_t i = 0; i < ps->n_hosts; i++) {
		const Podemu__HostInfo *h = ps->hosts[i];
		alive += h->alive;
		/* Hosts of one agent process are listed one after another and share its RSS. */
		if (h->alive &&
		    (i == 0 || h->process == 0 || h->process != ps->hosts[i - 1]->process)) {
			processes++;
			rss += h->rss_bytes;
		}
	}
	printf("  hosts: %d of %d alive", alive, ps->num_hosts);
	if (processes != alive)
		printf(" in %d agent processes", processes);
	if (rss > 0) {
		char r[16];
		printf(" (RSS %s)", status_human_bytes(r, rss));
	}
	if (ps->n_cores > 0) {
		int64_t total = 0, top = -1;
		size_t at = 0;
		for (size_t i = 0; i < ps->n_cores; i++) {
			total += ps->cores[i]->bytes_in_use;
			if (ps->cores[i]->bytes_in_use > top) {
				top = ps->cores[i]->bytes_in_use;
				at = i;
			}
		}
		char t[16], m[16], l[16];
		printf("; %zu cores: %s in use, the most %s on core %d (limit %s)", ps->n_cores,
		       status_human_bytes(t, total), status_human_bytes(m, top),
		       ps->cores[at]->ordinal, status_human_bytes(l, ps->cores[at]->bytes_limit));
	}
	printf("; sessions: %zu\n", ps->n_sessions);
}

static void print_hosts(const Podemu__PodStatus *ps)
{
	for (size_t i = 0; i < ps->n_hosts; i++) {
		const Podemu__HostInfo *h = ps->hosts[i];
		printf("  host %d: %s pid %d backing %s data %s rss %lld accounted %lld\n",
		       h->index, h->alive ? "alive" : "missing", h->pid, h->backing, h->data_url,
		       (long long)h->rss_bytes, (long long)h->accounted_bytes);
	}
}

static void print_sessions(const Podemu__PodStatus *ps)
{
	if (ps->n_sessions > 0)
		printf("  %18s %7s %-24s %8s %16s  %s\n", "session", "pid", "program@host",
		       "buffers", "bytes_per_core", "since");
	for (size_t i = 0; i < ps->n_sessions; i++) {
		const Podemu__SessionInfo *s = ps->sessions[i];
		char who[160], since[32] = "";
		snprintf(who, sizeof(who), "%s@%s", s->name, s->host_name);
		time_t t = (time_t)(s->started_unix_ms / 1000);
		struct tm tm;
		if (localtime_r(&t, &tm) != NULL)
			strftime(since, sizeof(since), "%Y-%m-%d %H:%M:%S", &tm);
		printf("  %18llu %7d %-24s %8d %16lld  %s\n", (unsigned long long)s->id, s->pid,
		       who, s->buffers, (long long)s->bytes_per_core, since);
	}
}

static void print_cores(const Podemu__PodStatus *ps)
{
	if (ps->n_cores > 0)
		printf("  %7s %5s %16s %16s %16s\n", "ordinal", "host", "bytes_used",
		       "peak_bytes_used", "bytes_limit");
	for (size_t i = 0; i < ps->n_cores; i++) {
		const Podemu__CoreMemory *m = ps->cores[i];
		printf("  %7d %5d %16lld %16lld %16lld\n", m->ordinal, m->host,
		       (long long)m->bytes_in_use, (long long)m->peak_bytes_in_use,
		       (long long)m->bytes_limit);
	}
}

int cli_status(const char *state_dir, bool json, bool all)
{
	char url[512];
	struct status st;
	state_coordinator_url(url, sizeof(url), state_dir);
	struct rpc_client *c;
	struct arena *a = arena_new();
	void *reply = NULL;
	int rv = a == NULL ? status_set(&st, ST_RESOURCE_EXHAUSTED, "out of host memory")
	                   : rpc_client_open(&c, url, false, &st);
	if (rv == ST_OK) {
		char token[128];
		state_token(token, sizeof(token), state_dir);
		rpc_client_set_token(c, token);
		Podemu__StatusRequest req = PODEMU__STATUS_REQUEST__INIT;
		req.memory = 1;
		rv = rpc_call(c, &podemu__coordinator__descriptor, CM_GET_STATUS, &req, a, &reply,
		              10000, &st);
		rpc_client_close(c);
	}
	if (rv != ST_OK) {
		if (json) {
			printf("{\"ready\": false, \"error\": ");
			char msg[STATUS_MESSAGE_MAX + 64];
			snprintf(msg, sizeof(msg), "%s: %s", status_code_name(rv), st.message);
			json_string(stdout, msg);
			printf("}\n");
		} else {
			fprintf(stderr, "podemu status: no pod at %s: %s: %s\n", url,
			        status_code_name(rv), st.message);
		}
		arena_free(a);
		return 1;
	}
	Podemu__PodStatus *ps = reply;
	if (json) {
		pod_status_json(stdout, ps, url);
	} else {
		printf("pod %s: %s, %d hosts x %d cores (world size %d), coordinator %s\n",
		       ps->topology, ps->ready ? "ready" : "NOT READY", ps->num_hosts,
		       ps->cores_per_host, ps->world_size, url);
		if (!ps->ready && ps->reason != NULL)
			printf("  %s\n", ps->reason);
		char http_path[PATH_MAX], http[256] = "";
		snprintf(http_path, sizeof(http_path), "%s/http.url", state_dir);
		FILE *hf = fopen(http_path, "r");
		if (hf != NULL && fgets(http, sizeof(http), hf) != NULL)
			printf("  dashboard %.*s (metrics at /metrics)\n", (int)strcspn(http, "\n"),
			       http);
		if (hf != NULL)
			fclose(hf);
		print_summary(ps);
		if (all || ps->world_size <= STATUS_DETAIL_CORES) {
			print_hosts(ps);
			print_sessions(ps);
			print_cores(ps);
		} else {
			printf(
			    "  (podemu status --all lists every host, session and core; --json has "
			    "everything)\n");
		}
	}
	int ready = ps->ready;
	arena_free(a);
	return ready ? 0 : 3;
}
