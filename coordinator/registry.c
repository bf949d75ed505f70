#include "registry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

int64_t registry_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int registry_init(struct registry *r, const struct topology *topo, int heartbeat_timeout_ms,
                  struct status *st)
{
	memset(r, 0, sizeof(*r));
	r->topo = *topo;
	r->hosts = calloc((size_t)topo->num_hosts, sizeof(*r->hosts));
	if (r->hosts == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	/* Handles of an earlier coordinator process are told apart from this one's. */
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	r->epoch = ((uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec ^ (uint64_t)getpid()) &
	           ((1u << 20) - 1);
	if (r->epoch == 0)
		r->epoch = 1;
	r->next_handle = (r->epoch << HANDLE_EPOCH_SHIFT) | 1;
	r->next_incarnation = (uint64_t)time(NULL) << 20;
	r->heartbeat_timeout_ms = heartbeat_timeout_ms;
	r->session_lease_ms = SESSION_DEFAULT_LEASE_MS;
	r->next_session = 1;
	r->next_serial = 1;
	pthread_mutex_init(&r->lock, NULL);
	return ST_OK;
}

void registry_destroy(struct registry *r)
{
	for (int i = 0; i < r->topo.num_hosts; i++)
		rpc_client_close(r->hosts[i].client);
	for (int i = 0; i < r->num_retired; i++)
		rpc_client_close(r->retired[i]);
	free(r->retired);
	free(r->hosts);
	free(r->handles);
	hindex_free(&r->index);
	free(r->sessions);
	pthread_mutex_destroy(&r->lock);
}

static bool url_ok(const char *url)
{
	size_t n = url ? strlen(url) : 0;
	return n > 6 && n < URL_MAX && strstr(url, "://") != NULL;
}

int registry_register(struct registry *r, const struct host_claim *c, int *host_index,
                      uint64_t *incarnation, struct status *st)
{
	int requested = c->requested, pid = c->pid;
	const char *control_url = c->control_url, *data_url = c->data_url, *backing = c->backing;
	uint64_t agent_epoch = c->agent_epoch;
	if (!url_ok(control_url) || !url_ok(data_url))
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "register: control and data URLs must be scheme://address "
		                  "(shorter than %d bytes)",
		                  URL_MAX);
	if (backing == NULL || (strcmp(backing, "host") != 0 && strcmp(backing, "none") != 0))
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "register: backing must be \"host\" or \"none\"");
	pthread_mutex_lock(&r->lock);
	int n = r->topo.num_hosts;
	int rv = ST_OK;
	int index = requested;
	if (requested < -1 || requested >= n) {
		rv = status_set(st, ST_INVALID_ARGUMENT,
		                "register: host index %d is out of range for %s (%d hosts)",
		                requested, r->topo.name, n);
		goto out;
	}
	for (int i = 0; i < n; i++) {
		if (r->hosts[i].registered && i != requested &&
		    strcmp(r->hosts[i].backing, backing) != 0) {
			rv = status_set(st, ST_FAILED_PRECONDITION,
			                "register: host %d uses --backing %s; every host of a pod "
			                "must use the same backing, not %s",
			                i, r->hosts[i].backing, backing);
			goto out;
		}
	}
	/* The same process again (its reply was lost): the place it already has. */
	for (int i = 0; i < n && index < 0; i++)
		if (r->hosts[i].registered && r->hosts[i].agent_epoch == agent_epoch)
			index = i;
	if (index < 0) {
		for (int i = 0; i < n && index < 0; i++)
			if (!r->hosts[i].registered)
				index = i;
		if (index < 0) {
			rv = status_set(st, ST_RESOURCE_EXHAUSTED,
			                "register: all %d hosts of %s are registered", n,
			                r->topo.name);
			goto out;
		}
	}
	struct host *h = &r->hosts[index];
	if (h->registered && h->agent_epoch == agent_epoch &&
	    strcmp(h->control_url, control_url) == 0) {
		/*
		 * A process that registered already asks again, its reply lost or its lease run
		 * out: it keeps its connection, so that the steps running on it carry on.
		 */
		h->alive = true;
		h->last_heartbeat_ms = registry_now_ms();
		*host_index = index;
		*incarnation = h->incarnation;
		log_info("host %d registered again (pid %d)", index, pid);
		goto out;
	}
	struct rpc_client *client;
	rv = rpc_client_open(&client, control_url, true, st);
	if (rv != ST_OK)
		goto out;
	rpc_client_set_token(client, r->token);
	if (h->registered)
		log_info("host %d re-registered (was %s, now %s)", index, h->control_url,
		         control_url);
	if (h->client != NULL) {
		struct rpc_client **list =
		    realloc(r->retired, (size_t)(r->num_retired + 1) * sizeof(*list));
		if (list == NULL) {
			rpc_client_close(client);
			rv = status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
			goto out;
		}
		r->retired = list;
		r->retired[r->num_retired++] = h->client;
	}
	h->client = client;
	if (h->agent_epoch != agent_epoch) {
		/* A new agent process: whatever the old one held of existing buffers is gone. */
		if (h->registered)
			log_warn("host %d restarted: its shards of the %d live buffers are lost",
			         index, r->num_handles);
		h->data_floor = r->next_serial;
		h->agent_epoch = agent_epoch;
	}
	h->registered = true;
	h->alive = true;
	h->pid = pid;
	h->process_epoch = c->process_epoch != 0 ? c->process_epoch : agent_epoch;
	h->incarnation = ++r->next_incarnation;
	h->last_heartbeat_ms = registry_now_ms();
	snprintf(h->control_url, sizeof(h->control_url), "%s", control_url);
	snprintf(h->data_url, sizeof(h->data_url), "%s", data_url);
	snprintf(h->backing, sizeof(h->backing), "%s", backing);
	*host_index = index;
	*incarnation = h->incarnation;
	log_info("host %d registered: control %s, data %s, backing %s, pid %d", index, control_url,
	         data_url, backing, pid);
out:
	pthread_mutex_unlock(&r->lock);
	return rv;
}

bool registry_heartbeat(struct registry *r, int host_index, uint64_t incarnation)
{
	bool known = false;
	pthread_mutex_lock(&r->lock);
	if (host_index >= 0 && host_index < r->topo.num_hosts) {
		struct host *h = &r->hosts[host_index];
		if (h->registered && h->incarnation == incarnation) {
			h->last_heartbeat_ms = registry_now_ms();
			if (!h->alive)
				log_info("host %d is alive again", host_index);
			h->alive = true;
			known = true;
		}
	}
	pthread_mutex_unlock(&r->lock);
	return known;
}

void registry_expire(struct registry *r)
{
	int64_t now = registry_now_ms();
	pthread_mutex_lock(&r->lock);
	for (int i = 0; i < r->topo.num_hosts; i++) {
		struct host *h = &r->hosts[i];
		if (h->registered && h->alive &&
		    now - h->last_heartbeat_ms > r->heartbeat_timeout_ms) {
			h->alive = false;
			log_warn("host %d missed its lease (%d ms); the pod is not ready", i,
			         r->heartbeat_timeout_ms);
		}
	}
	pthread_mutex_unlock(&r->lock);
}

bool registry_ready_locked(struct registry *r, struct status *st)
{
	int registered = 0, alive = 0, first_missing = -1;
	for (int i = 0; i < r->topo.num_hosts; i++) {
		registered += r->hosts[i].registered;
		alive += r->hosts[i].registered && r->hosts[i].alive;
		if (first_missing < 0 && !(r->hosts[i].registered && r->hosts[i].alive))
			first_missing = i;
	}
	if (alive == r->topo.num_hosts)
		return true;
	status_set(st, ST_FAILED_PRECONDITION,
	           "pod %s is not ready: %d of %d hosts registered, %d alive (host %d missing)",
	           r->topo.name, registered, r->topo.num_hosts, alive, first_missing);
	return false;
}

/* Appends "a..b" (or "a") for each run of set flags, comma-separated, each value times scale. */
static void append_runs(char *out, size_t len, const bool *set, int n, int scale, int last_add)
{
	bool first = true;
	for (int i = 0; i < n; i++) {
		if (!set[i])
			continue;
		int j = i;
		while (j + 1 < n && set[j + 1])
			j++;
		size_t used = strlen(out);
		if (used + 1 >= len)
			return;
		int lo = i * scale, hi = j * scale + last_add;
		if (lo == hi)
			snprintf(out + used, len - used, "%s%d", first ? "" : ",", lo);
		else
			snprintf(out + used, len - used, "%s%d..%d", first ? "" : ",", lo, hi);
		first = false;
		i = j;
	}
}

int registry_name_process_locked(const struct registry *r, int host, bool *same, char *out,
                                 size_t len)
{
	int n = r->topo.num_hosts, cph = r->topo.cores_per_host, count = 0;
	const struct host *lost = &r->hosts[host];
	for (int i = 0; i < n; i++) {
		same[i] = i == host || (r->hosts[i].registered && lost->process_epoch != 0 &&
		                        r->hosts[i].process_epoch == lost->process_epoch);
		count += same[i];
	}
	snprintf(out, len, "%s ", count > 1 ? "hosts" : "host");
	append_runs(out, len, same, n, 1, 0);
	size_t used = strlen(out);
	snprintf(out + used, len - used, " (cores ");
	append_runs(out, len, same, n, cph, cph - 1);
	used = strlen(out);
	if (count > 1)
		snprintf(out + used, len - used, "; one agent process, pid %d)", lost->pid);
	else
		snprintf(out + used, len - used, ")");
	return count;
}
