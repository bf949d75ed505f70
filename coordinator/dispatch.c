/*
 * Dispatch: calls to every agent at once (each in flight on nng's own threads; the caller
 * waits for them all), and the watch over a running step that fails it everywhere when a host
 * is lost, a collective times out or the step's session ends.
 */
#include "dispatch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"
#include "services.h"

struct step_watch;

/*
 * Calls method on every host with requests[h] (NULL: skip h); a call to a host that is lost or
 * restarts meanwhile is given up (UNAVAILABLE) rather than waited for. Returns the first error
 * in host order, or OK.
 */
int fan_call(struct coordinator *co, struct rpc_client **clients, unsigned method,
             const void *const *requests, struct arena *a, void **replies, struct status *sts,
             int timeout_ms, struct status *st)
{
	return fan_call_watched(co, clients, method, timeout_ms, 0, 0, requests, a, replies, sts,
	                        st);
}

/* One call to one host, given up (UNAVAILABLE) if the host is lost or restarts meanwhile. */
int call_host(struct coordinator *co, int host, struct rpc_client *client, unsigned method,
              const void *req, struct arena *a, void **reply, struct status *st)
{
	int n = co->reg.topo.num_hosts;
	struct rpc_client **clients = arena_calloc(a, (size_t)n, sizeof(*clients));
	const void **reqs = arena_calloc(a, (size_t)n, sizeof(void *));
	void **replies = arena_calloc(a, (size_t)n, sizeof(void *));
	struct status *sts = arena_calloc(a, (size_t)n, sizeof(*sts));
	if (!clients || !reqs || !replies || !sts)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	clients[host] = client;
	reqs[host] = req;
	int rv = fan_call(co, clients, method, reqs, a, replies, sts, co->agent_timeout_ms, st);
	*reply = replies[host];
	return rv;
}

/* The same request for every host. */
const void **same_for_all(struct arena *a, int n, const void *request)
{
	const void **list = arena_calloc(a, (size_t)n, sizeof(void *));
	for (int i = 0; list != NULL && i < n; i++)
		list[i] = request;
	return list;
}

/*
 * Watches the hosts of a running step: a lost one makes the step fail everywhere at once, and
 * a collective that timed out on one host is aborted everywhere with the cores that never
 * arrived at it.
 */
struct step_watch {
	struct coordinator *co;
	struct rpc_client **clients;
	struct rpc_cancel *cancels;
	const void *const *requests; /* [host]: NULL for a host not called */
	uint64_t step_id;
	uint64_t session; /* the client session of the step; 0: none */
	bool session_ended;
	pthread_mutex_t lock;
	bool *answered;         /* [host]: its call returned */
	int failed;             /* the first host that answered another error, or -1 */
	int timed_out;          /* the first host that answered DEADLINE_EXCEEDED, or -1 */
	struct status deadline; /* the composed DEADLINE_EXCEEDED, once known */
};

static void watch_answered(struct step_watch *w, int host, const struct status *st, bool running)
{
	pthread_mutex_lock(&w->lock);
	w->answered[host] = true;
	if (running && st->code == ST_DEADLINE_EXCEEDED && w->timed_out < 0) {
		w->timed_out = host;
		w->deadline = *st;
	} else if (running && st->code != ST_OK && st->code != ST_UNAVAILABLE && w->failed < 0 &&
	           w->timed_out < 0) {
		/* UNAVAILABLE: a host or a link is gone, which the lease names (watch_tick). */
		w->failed = host;
	}
	pthread_mutex_unlock(&w->lock);
}

/*
 * Aborts the watched step on host h with code and reason (2 s at most). Returns the RPC's code;
 * with positions (cores_per_host ints) the host's answer says where its cores were, -1 each
 * when it did not answer it.
 */
static int abort_on_host(struct step_watch *w, int h, int code, const char *reason, int *positions)
{
	int cph = w->co->reg.topo.cores_per_host;
	struct arena *a = arena_new();
	Podemu__AbortRequest req = PODEMU__ABORT_REQUEST__INIT;
	req.step_id = w->step_id;
	req.code = code;
	req.reason = (char *)reason;
	void *reply = NULL;
	struct status st;
	int rv = a == NULL ? ST_RESOURCE_EXHAUSTED
	                   : rpc_call(w->clients[h], &podemu__agent__descriptor, AM_ABORT_STEP,
	                              &req, a, &reply, 2000, &st);
	const Podemu__AbortReply *rep = reply;
	for (int c = 0; positions != NULL && c < cph; c++)
		positions[c] =
		    rv == ST_OK && rep->n_core_node == (size_t)cph ? rep->core_node[c] : -1;
	arena_free(a);
	return rv;
}

/*
 * A host failed the step (its cores could not allocate, a kernel failed): the others would wait
 * for its data until the collective deadline, so they are aborted now with its reason.
 */
static void watch_failed(struct step_watch *w, const struct status *cause)
{
	int hosts = w->co->reg.topo.num_hosts;
	char reason[STATUS_MESSAGE_MAX];
	snprintf(reason, sizeof(reason), "host %d failed step %llu: %s", w->failed,
	         (unsigned long long)w->step_id, cause->message);
	for (int h = 0; h < hosts; h++)
		if (h != w->failed && w->requests[h] != NULL && !w->answered[h])
			abort_on_host(w, h, ST_ABORTED, reason, NULL);
}

/* Appends " a..b" or " a" ranges of the marked ordinals to out; returns how many. */
static int format_cores(char *out, size_t len, const bool *marked, int n)
{
	int count = 0;
	for (int i = 0; i < n; i++) {
		if (!marked[i] || (i > 0 && marked[i - 1]))
			continue;
		int j = i;
		while (j + 1 < n && marked[j + 1])
			j++;
		size_t at = strlen(out);
		if (j > i)
			snprintf(out + at, len - at, "%s%d..%d", count ? ", " : "", i, j);
		else
			snprintf(out + at, len - at, "%s%d", count ? ", " : "", i);
		count += j - i + 1;
	}
	return count;
}

/*
 * A collective timed out on host w->timed_out: asks every host still running where its cores
 * are while aborting the step there. Cores waiting in a collective arrived; cores still
 * computing, and the cores of hosts that do not answer, never did. The step fails with
 * DEADLINE_EXCEEDED naming them. Called without w->lock.
 */
static void watch_deadline(struct step_watch *w, const bool *answered)
{
	struct registry *reg = &w->co->reg;
	int hosts = reg->topo.num_hosts, cph = reg->topo.cores_per_host, world = hosts * cph;
	bool *silent = calloc((size_t)world, sizeof(bool));
	bool *computing = calloc((size_t)world, sizeof(bool));
	if (silent == NULL || computing == NULL)
		goto out;
	char reason[STATUS_MESSAGE_MAX];
	snprintf(reason, sizeof(reason), "a collective timed out on host %d: %s", w->timed_out,
	         w->deadline.message);
	for (int h = 0; h < hosts; h++) {
		if (answered[h])
			continue;
		int where[cph];
		int rv = abort_on_host(w, h, ST_DEADLINE_EXCEEDED, reason, where);
		if (rv == ST_OK) {
			for (int c = 0; c < cph; c++)
				computing[h * cph + c] = where[c] == -1;
		} else if (rv != ST_NOT_FOUND) {
			/* Frozen or gone: its ExecuteStep will not answer either. */
			for (int c = 0; c < cph; c++)
				silent[h * cph + c] = true;
			rpc_cancel_fire(&w->cancels[h], reason);
		}
	}
	char missing[STATUS_MESSAGE_MAX / 2] = "";
	char list[STATUS_MESSAGE_MAX / 4] = "";
	if (format_cores(list, sizeof(list), silent, world) > 0)
		snprintf(missing, sizeof(missing), "cores %s (their host did not answer)", list);
	list[0] = '\0';
	if (format_cores(list, sizeof(list), computing, world) > 0) {
		size_t at = strlen(missing);
		snprintf(missing + at, sizeof(missing) - at, "%scores %s (still computing)",
		         at ? "; " : "", list);
	}
	pthread_mutex_lock(&w->lock);
	if (missing[0] == '\0')
		status_set(&w->deadline, ST_DEADLINE_EXCEEDED,
		           "%s (every core had arrived at a collective)", w->deadline.message);
	else
		status_set(&w->deadline, ST_DEADLINE_EXCEEDED, "%s; never arrived: %s",
		           w->deadline.message, missing);
	pthread_mutex_unlock(&w->lock);
	log_warn("step %llu: %s", (unsigned long long)w->step_id, w->deadline.message);
out:
	free(silent);
	free(computing);
}

/*
 * The step's session ended (its client is gone): the step is cancelled on every host, as
 * torch_xla's computations die with their process. A host that took the abort is still waited
 * for: until its cores stopped, the step holds the session's buffers there, which are freed
 * once the step is over. Called with w->lock held; returns with it.
 */
static void watch_session_ended(struct step_watch *w)
{
	int hosts = w->co->reg.topo.num_hosts;
	char reason[256];
	snprintf(reason, sizeof(reason), "session %llu ended; step %llu is cancelled",
	         (unsigned long long)w->session, (unsigned long long)w->step_id);
	log_warn("%s", reason);
	pthread_mutex_unlock(&w->lock);
	for (int h = 0; h < hosts; h++) {
		if (w->requests[h] == NULL || w->answered[h])
			continue;
		/* NOT_FOUND: its step is on the way, and fails when it comes. */
		int rv = abort_on_host(w, h, ST_CANCELLED, reason, NULL);
		if (rv != ST_OK && rv != ST_NOT_FOUND)
			rpc_cancel_fire(&w->cancels[h], reason); /* frozen or gone */
	}
	pthread_mutex_lock(&w->lock);
}

/*
 * One look at the watched step, every 100 ms and as soon as a collective timed out: acts on the
 * coordinator shutting down, a timed-out collective, an ended session or a lost host. True once
 * it acted (then the watch is over: the calls fail with the cause).
 */
static bool watch_tick(struct step_watch *w)
{
	struct registry *reg = &w->co->reg;
	int hosts = reg->topo.num_hosts;
	pthread_mutex_lock(&w->lock);
	if (atomic_load(&w->co->stopping)) {
		/* Nothing notices a lost host any more: no reply is waited for. */
		for (int h = 0; h < hosts; h++)
			if (w->requests[h] != NULL && !w->answered[h])
				rpc_cancel_fire(&w->cancels[h], "the coordinator is shutting down");
		pthread_mutex_unlock(&w->lock);
		return true;
	}
	if (w->timed_out >= 0) {
		bool answered[hosts];
		memcpy(answered, w->answered, sizeof(answered));
		pthread_mutex_unlock(&w->lock);
		watch_deadline(w, answered);
		return true;
	}
	int lost = -1;
	bool restarted = false;
	pthread_mutex_lock(&reg->lock);
	if (w->session != 0 && !session_is_open(reg, w->session))
		w->session_ended = true;
	for (int h = 0; h < hosts && lost < 0; h++)
		if (w->requests[h] != NULL &&
		    (!reg->hosts[h].alive || reg->hosts[h].client != w->clients[h])) {
			lost = h;
			restarted = reg->hosts[h].alive;
		}
	/* Every host of the lost one's agent process is gone with it (they share one heartbeat). */
	bool gone[hosts > 0 ? hosts : 1];
	char who[256] = "";
	memset(gone, 0, sizeof(gone));
	int named = lost >= 0 ? registry_name_process_locked(reg, lost, gone, who, sizeof(who)) : 0;
	pthread_mutex_unlock(&reg->lock);
	if (w->session_ended) {
		watch_session_ended(w);
		pthread_mutex_unlock(&w->lock);
		return true;
	}
	pthread_mutex_unlock(&w->lock);
	if (lost < 0)
		return false;
	char reason[512], step[64] = "";
	if (w->step_id != 0)
		snprintf(step, sizeof(step), "; step %llu cannot complete",
		         (unsigned long long)w->step_id);
	if (restarted)
		snprintf(reason, sizeof(reason), "%s restarted%s", who, step);
	else
		snprintf(reason, sizeof(reason), "%s %s lost: no heartbeat within %d ms%s", who,
		         named > 1 ? "are" : "is", reg->heartbeat_timeout_ms, step);
	log_warn("%s", reason);
	for (int h = 0; h < hosts; h++)
		if (gone[h] && w->requests[h] != NULL)
			rpc_cancel_fire(&w->cancels[h], reason);
	/* The survivors stop waiting for the lost hosts' data and report why. */
	for (int h = 0; h < hosts && w->step_id != 0; h++) {
		if (gone[h])
			continue;
		abort_on_host(w, h, ST_UNAVAILABLE, reason, NULL);
	}
	return true;
}

#define WATCH_TICK_MS 100

/* fan_call for a step's phases, watching the hosts while it runs. */
int fan_call_watched(struct coordinator *co, struct rpc_client **clients, unsigned method,
                     int timeout_ms, uint64_t step_id, uint64_t session,
                     const void *const *requests, struct arena *a, void **replies,
                     struct status *sts, struct status *st)
{
	int n = co->reg.topo.num_hosts;
	struct rpc_cancel *cancels = arena_calloc(a, (size_t)n, sizeof(*cancels));
	struct rpc_async **calls = arena_calloc(a, (size_t)n, sizeof(*calls));
	if (cancels == NULL || calls == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int h = 0; h < n; h++)
		rpc_cancel_init(&cancels[h]);
	struct step_watch w = {.co = co,
	                       .clients = clients,
	                       .cancels = cancels,
	                       .requests = requests,
	                       .step_id = step_id,
	                       .session = session,
	                       .answered = arena_calloc(a, (size_t)n, sizeof(bool)),
	                       .failed = -1,
	                       .timed_out = -1};
	if (w.answered == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	pthread_mutex_init(&w.lock, NULL);
	bool running = method == AM_EXECUTE_STEP;
	bool failure_handled = false;
	int pending = 0;
	for (int h = 0; h < n; h++) {
		status_clear(&sts[h]);
		if (requests[h] == NULL)
			continue;
		calls[h] = rpc_start(clients[h], &podemu__agent__descriptor, method, requests[h], a,
		                     timeout_ms, &cancels[h], &sts[h]);
		if (calls[h] == NULL)
			watch_answered(&w, h, &sts[h], running);
		else
			pending++;
	}
	/*
	 * The replies are read on this thread, each host's in turn (a step's hosts answer within
	 * moments of each other, and a reply that is in already costs no wait); every
	 * WATCH_TICK_MS, the replies in so far are taken from every host and the step looked at.
	 */
	bool watching = true;
	long long next_tick = clock_now_us() + WATCH_TICK_MS * 1000LL;
	int first = 0;
	while (pending > 0) {
		while (calls[first] == NULL)
			first++;
		long long left_us = next_tick - clock_now_us();
		bool in = rpc_poll(calls[first], left_us > 0 ? (int)((left_us + 999) / 1000) : 0);
		for (int h = first; h < n; h++) {
			bool over =
			    h == first ? in : !in && calls[h] != NULL && rpc_poll(calls[h], 0);
			if (!over)
				continue;
			rpc_finish(calls[h], a, &replies[h], &sts[h]);
			calls[h] = NULL;
			pending--;
			watch_answered(&w, h, &sts[h], running);
		}
		if (watching && w.failed >= 0 && !failure_handled) {
			failure_handled = true;
			watch_failed(&w, &sts[w.failed]);
		}
		/* Ticks go on once the watch is over: they pace the waits for the last replies. */
		if (clock_now_us() >= next_tick || (watching && w.timed_out >= 0)) {
			if (watching)
				watching = !watch_tick(&w);
			next_tick = clock_now_us() + WATCH_TICK_MS * 1000LL;
		}
	}
	pthread_mutex_destroy(&w.lock);
	for (int h = 0; h < n; h++)
		rpc_cancel_destroy(&cancels[h]);
	/* The cause first: a timed-out collective or a lost host; the others only echo it. */
	if (w.session_ended)
		return status_set(st, ST_CANCELLED, "session %llu ended; step %llu is cancelled",
		                  (unsigned long long)session, (unsigned long long)step_id);
	if (w.timed_out >= 0)
		return status_set(st, ST_DEADLINE_EXCEEDED, "%s", w.deadline.message);
	for (int h = 0; h < n; h++)
		if (cancels[h].fired)
			return status_set(st, ST_UNAVAILABLE, "%s", cancels[h].reason);
	/* Hosts that failed on their own, not the ones aborted because of them: the lowest. */
	for (int h = 0; w.failed >= 0 && h < n; h++)
		if (sts[h].code != ST_OK && sts[h].code != ST_ABORTED)
			return status_set(st, sts[h].code, "%s", sts[h].message);
	for (int h = 0; h < n; h++)
		if (sts[h].code != ST_OK)
			return status_set(st, sts[h].code, "%s", sts[h].message);
	return ST_OK;
}
