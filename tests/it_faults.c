/*
 * A peer that dies or freezes never hangs a step: it fails on every core with UNAVAILABLE
 * naming the lost host, within the heartbeat lease plus a second, and the survivors keep
 * their memory straight.
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "pod_fixture.h"

static pid_t agent_pid(int host)
{
	char name[32];
	snprintf(name, sizeof(name), "agent-%d", host);
	return pod_pid(name);
}

struct killer {
	pid_t pid;
	int sig;
	int64_t bytes_used; /* kill once core 1 holds more than this: the step is on it */
	double at;
};

/*
 * Kills the agent once the step has reached its core (the core's heap holds the step's output,
 * allocated when the step is prepared), watched through a client of its own: on an event, not
 * after a guess at how long the collective takes.
 */
static void *kill_when_running(void *arg)
{
	struct killer *k = arg;
	char url_file[512], url[256] = "";
	snprintf(url_file, sizeof(url_file), "%s/coordinator.url", pod_state_dir);
	FILE *f = fopen(url_file, "r");
	if (f != NULL && fgets(url, sizeof(url), f) == NULL)
		url[0] = '\0';
	if (f != NULL)
		fclose(f);
	url[strcspn(url, "\n")] = '\0';
	pe_client *watch = NULL;
	if (pe_connect(&watch, url) == PE_OK) {
		pe_memory_info m = {0};
		for (int i = 0; i < 20000; i++) {
			if (pe_memory_info_get(watch, 1, &m) == PE_OK &&
			    m.bytes_used > k->bytes_used)
				break;
			struct timespec ts = {0, 1000000};
			nanosleep(&ts, NULL);
		}
		pe_disconnect(watch);
	}
	k->at = pod_now_s();
	kill(k->pid, k->sig);
	return NULL;
}

/*
 * The lease is 3 s (the default); a step must fail within seconds of the loss: lease + 1 s is
 * what it takes here, the bound leaves room for a loaded machine and the sanitizer build.
 */
#define LEASE_S 3.0

static void test_peer_killed_mid_collective(void **state)
{
	pe_client *c = pod_start("--hosts 2 --cores-per-host 1 --hbm 2G --backing host");
	assert_non_null(c);
	/* 512 MiB per core: an all-reduce over loopback takes seconds here. */
	int64_t n = 128LL << 20;
	pe_tensor *x = pe_full(c, PE_F32, &n, 1, 1.0);
	assert_int_equal(pe_mark_step(c), PE_OK);
	pe_memory_info before;
	assert_int_equal(pe_memory_info_get(c, 0, &before), PE_OK);
	pe_tensor *y = pe_all_reduce(x, PE_REDUCE_SUM, 1.0, NULL);
	struct killer k = {.pid = agent_pid(1), .sig = SIGKILL, .bytes_used = before.bytes_used};
	assert_true(k.pid > 0);
	pthread_t t;
	pthread_create(&t, NULL, kill_when_running, &k);
	int rv = pe_mark_step(c);
	double done = pod_now_s();
	pthread_join(t, NULL);
	printf("%s\n", pe_last_error(c));
	assert_int_equal(rv, PE_UNAVAILABLE);
	/*
	 * The coordinator's lease ("host 1 (cores 1) is lost") or the survivor's broken stream
	 * ("host 1 (cores 1..1): ..."), whichever notices first.
	 */
	assert_non_null(strstr(pe_last_error(c), "host 1 (cores 1"));
	assert_true(done - k.at < LEASE_S + 4.0);
	/* The survivor freed what the failed step allocated and kept its earlier buffer. */
	pe_memory_info after;
	assert_int_equal(pe_memory_info_get(c, 0, &after), PE_OK);
	assert_int_equal(after.bytes_used, before.bytes_used);
	assert_int_equal(after.bytes_reserved, 0);
	pe_release(y);
	pe_disconnect(c);
	pod_stop();
}

static void test_frozen_peer_fails_the_step(void **state)
{
	pe_client *c = pod_start("--hosts 2 --cores-per-host 1 --hbm 256M --backing host");
	assert_non_null(c);
	int64_t n = 1024;
	pe_tensor *x = pe_full(c, PE_F32, &n, 1, 1.0);
	assert_int_equal(pe_mark_step(c), PE_OK);
	pid_t frozen = agent_pid(1);
	kill(frozen, SIGSTOP);
	double t0 = pod_now_s();
	pe_tensor *y = pe_all_gather(x, 0);
	int rv = pe_mark_step(c);
	double took = pod_now_s() - t0;
	kill(frozen, SIGCONT);
	printf("frozen: rv %d after %.2f s: %s\n", rv, took, pe_last_error(c));
	/* Either the lease had expired when the step came (not ready) or it fails mid-way. */
	assert_true(rv == PE_UNAVAILABLE || rv == PE_FAILED_PRECONDITION);
	assert_non_null(strstr(pe_last_error(c), "host 1"));
	assert_true(took < LEASE_S + 4.0);
	pe_release(x);
	pe_release(y);
	pe_disconnect(c);
	pod_stop();
}

/*
 * An agent killed and started again with the same host index re-registers; the pod is ready
 * again without restarting anything else. Buffers that had a shard on it report DATA_LOSS; the
 * survivors keep theirs until released.
 */
static void test_agent_restart_rejoins(void **state)
{
	pe_client *c = pod_start("--hosts 2 --cores-per-host 2 --hbm 256M --backing host");
	assert_non_null(c);
	int64_t n = 1024;
	pe_tensor *x = pe_full(c, PE_F32, &n, 1, 3.0);
	assert_int_equal(pe_mark_step(c), PE_OK);
	pid_t coordinator = pod_pid("coordinator");
	assert_true(pod_restart("agent-1", SIGKILL, "registered as host") > 0);
	assert_int_equal(pe_wait_ready(c, 15000), PE_OK);
	assert_int_equal(pod_pid("coordinator"), coordinator);

	float v[1024];
	assert_int_equal(pe_fetch(x, 0, v, sizeof(v)), PE_DATA_LOSS);
	assert_non_null(strstr(pe_last_error(c), "lost its shards on host 1 (cores 2..3)"));
	pe_tensor *y = pe_all_gather(x, 0);
	assert_non_null(y);
	assert_int_equal(pe_mark_step(c), PE_DATA_LOSS);
	pe_release(y);
	pe_release(x);
	pe_memory_info m;
	assert_int_equal(pe_memory_info_get(c, 0, &m), PE_OK);
	assert_int_equal(m.bytes_used, 0);

	/* The restarted pod computes as before. */
	int64_t one = 1;
	pe_tensor *z = pe_all_gather(pe_reshape(pe_replica_id(c), &one, 1), 0);
	assert_int_equal(pe_mark_step(c), PE_OK);
	int32_t ids[4];
	assert_int_equal(pe_fetch(z, 3, ids, sizeof(ids)), PE_OK);
	for (int i = 0; i < 4; i++)
		assert_int_equal(ids[i], i);
	pe_disconnect(c);
	pod_stop();
}

/*
 * A restarted coordinator: the agents redial and re-register on their own and free the buffers
 * the old one made; a client that uses one gets NOT_FOUND saying why.
 */
static void test_coordinator_restart(void **state)
{
	pe_client *c = pod_start("--hosts 2 --cores-per-host 1 --hbm 256M --backing host");
	assert_non_null(c);
	int64_t n = 4096;
	pe_tensor *x = pe_full(c, PE_F32, &n, 1, 1.0);
	assert_int_equal(pe_mark_step(c), PE_OK);
	pid_t agent = agent_pid(0);
	assert_true(pod_restart("coordinator", SIGKILL, NULL) > 0);
	assert_int_equal(pe_wait_ready(c, 15000), PE_OK);
	assert_int_equal(agent_pid(0), agent);

	static float v[4096];
	assert_int_equal(pe_fetch(x, 0, v, sizeof(v)), PE_NOT_FOUND);
	assert_non_null(strstr(pe_last_error(c), "earlier coordinator process"));
	pe_memory_info m[2];
	assert_int_equal(pe_memory_info_all(c, m, 2), PE_OK);
	assert_int_equal(m[0].bytes_used, 0);
	assert_int_equal(m[1].bytes_used, 0);

	pe_tensor *y = pe_all_reduce(pe_full(c, PE_F32, &n, 1, 2.0), PE_REDUCE_SUM, 1.0, NULL);
	assert_int_equal(pe_mark_step(c), PE_OK);
	assert_int_equal(pe_fetch(y, 1, v, sizeof(v)), PE_OK);
	assert_true(v[0] == 4.0f);
	pe_disconnect(c);
	pod_stop();
}

static long log_size(const char *name)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s.log", pod_state_dir, name);
	FILE *f = fopen(path, "r");
	long n = 0;
	if (f != NULL) {
		fseek(f, 0, SEEK_END);
		n = ftell(f);
		fclose(f);
	}
	return n;
}

struct freezer {
	long from;
	pid_t pid;
	int frozen;
};

/* Freezes agent-1 once its cores stopped before the collective. */
static void *freeze_when_stalled(void *arg)
{
	struct freezer *f = arg;
	if (pod_log_has("agent-1", f->from, "failpoint stall-before-collective"))
		f->frozen = kill(f->pid, SIGSTOP) == 0;
	return NULL;
}

/*
 * A collective that some cores never reach fails after the collective deadline with
 * DEADLINE_EXCEEDED naming those cores, instead of waiting forever: first with cores that hang
 * before it (a failpoint on host 1), then with their host frozen as well.
 */
static void test_collective_never_reached(void **state)
{
	pe_client *c = pod_start("--hosts 2 --cores-per-host 2 --hbm 256M --backing host "
	                         "--collective-timeout-ms 1000 --heartbeat-timeout-ms 60000");
	assert_non_null(c);
	setenv("PODEMU_FAILPOINT", "stall-before-collective", 1);
	pid_t stalled = pod_restart("agent-1", SIGTERM, "registered as host");
	unsetenv("PODEMU_FAILPOINT");
	assert_true(stalled > 0);
	assert_int_equal(pe_wait_ready(c, 15000), PE_OK);

	int64_t n = 1024;
	pe_tensor *y = pe_all_reduce(pe_full(c, PE_F32, &n, 1, 1.0), PE_REDUCE_SUM, 1.0, NULL);
	double t0 = pod_now_s();
	assert_int_equal(pe_mark_step(c), PE_DEADLINE_EXCEEDED);
	double took = pod_now_s() - t0;
	assert_non_null(strstr(pe_last_error(c), "never arrived: cores 2..3 (still computing)"));
	assert_true(took < 1.0 + 2.0);
	pe_memory_info m[4];
	assert_int_equal(pe_memory_info_all(c, m, 4), PE_OK);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(m[i].bytes_used, 0);
		assert_int_equal(m[i].bytes_reserved, 0);
	}
	pe_release(y);

	struct freezer f = {.from = log_size("agent-1"), .pid = stalled};
	pthread_t t;
	pthread_create(&t, NULL, freeze_when_stalled, &f);
	y = pe_all_reduce(pe_full(c, PE_F32, &n, 1, 1.0), PE_REDUCE_SUM, 1.0, NULL);
	t0 = pod_now_s();
	int rv = pe_mark_step(c);
	took = pod_now_s() - t0;
	pthread_join(t, NULL);
	kill(stalled, SIGCONT);
	assert_true(f.frozen);
	assert_int_equal(rv, PE_DEADLINE_EXCEEDED);
	assert_non_null(
	    strstr(pe_last_error(c), "never arrived: cores 2..3 (their host did not answer)"));
	assert_true(took < 1.0 + 2.0 + 1.5);
	pe_release(y);
	pe_disconnect(c);
	pod_stop();
}

struct stall_killer {
	long from;
	pid_t pid;
	double at;
	int killed;
};

/* Kills the agent process of hosts 2..3 once its cores stopped before the collective. */
static void *kill_when_stalled(void *arg)
{
	struct stall_killer *k = arg;
	if (pod_log_has("agent-2", k->from, "failpoint stall-before-collective")) {
		k->at = pod_now_s();
		k->killed = kill(k->pid, SIGKILL) == 0;
	}
	return NULL;
}

/*
 * An agent process that emulates several hosts dies with all of them: the step fails with
 * UNAVAILABLE naming every one of its hosts and cores, within the lease plus a second, and the
 * surviving process's cores keep their memory straight. Its hosts stall before the collective
 * (a failpoint), so the step is surely running when the process is killed.
 */
static void test_process_of_several_hosts_killed(void **state)
{
	setenv("PODEMU_FAILPOINT", "stall-before-collective", 1);
	pe_client *c = pod_start("--hosts 4 --cores-per-host 1 --hosts-per-agent 2 --hbm 256M "
	                         "--backing host");
	unsetenv("PODEMU_FAILPOINT");
	assert_non_null(c);
	assert_true(pod_pid("agent-2") == pod_pid("agent-3"));
	assert_true(pod_pid("agent-0") != pod_pid("agent-2"));
	pe_memory_info before;
	assert_int_equal(pe_memory_info_get(c, 0, &before), PE_OK);
	struct stall_killer k = {.from = 0, .pid = pod_pid("agent-2")};
	pthread_t t;
	pthread_create(&t, NULL, kill_when_stalled, &k);
	int64_t n = 1024;
	pe_tensor *y = pe_all_reduce(pe_full(c, PE_F32, &n, 1, 1.0), PE_REDUCE_SUM, 1.0, NULL);
	int rv = pe_mark_step(c);
	double done = pod_now_s();
	pthread_join(t, NULL);
	assert_true(k.killed);
	assert_int_equal(rv, PE_UNAVAILABLE);
	printf("%s, %.2f s after kill -9 (lease %.0f s)\n", pe_last_error(c), done - k.at, LEASE_S);
	assert_non_null(strstr(pe_last_error(c), "hosts 2..3 (cores 2..3; one agent process"));
	assert_true(done - k.at < LEASE_S + 1.0 + 1.0);
	/* The survivors freed what the failed step allocated. */
	for (int core = 0; core < 2; core++) {
		pe_memory_info after;
		assert_int_equal(pe_memory_info_get(c, core, &after), PE_OK);
		assert_int_equal(after.bytes_used, before.bytes_used);
		assert_int_equal(after.bytes_reserved, 0);
	}
	pe_release(y);
	pe_disconnect(c);
	pod_stop();
}

/*
 * A host that cannot prepare its part of the step (out of memory) fails it at once on every
 * host, with its reason: the others, already running, do not wait for its data until the
 * collective deadline, and give back what they allocated.
 */
static void test_host_that_cannot_prepare_fails_the_step_at_once(void **state)
{
	pe_client *c = pod_start("--hosts 2 --cores-per-host 2 --hbm 256M --backing host "
	                         "--collective-timeout-ms 60000");
	assert_non_null(c);
	int64_t n = 1024;
	pe_tensor *x = pe_full(c, PE_F32, &n, 1, 1.0);
	assert_int_equal(pe_mark_step(c), PE_OK);
	pe_memory_info before[4];
	assert_int_equal(pe_memory_info_all(c, before, 4), PE_OK);
	setenv("PODEMU_FAILPOINT", "fail-prepare", 1);
	pid_t failing = pod_restart("agent-1", SIGTERM, "registered as host");
	unsetenv("PODEMU_FAILPOINT");
	assert_true(failing > 0);
	assert_int_equal(pe_wait_ready(c, 15000), PE_OK);
	/* x lost its shards on the restarted host: a new input. */
	pe_release(x);
	assert_int_equal(pe_memory_info_all(c, before, 4), PE_OK);
	pe_tensor *y = pe_all_reduce(pe_full(c, PE_F32, &n, 1, 1.0), PE_REDUCE_SUM, 1.0, NULL);
	double t0 = pod_now_s();
	int rv = pe_mark_step(c);
	double took = pod_now_s() - t0;
	printf("%s, after %.2f s\n", pe_last_error(c), took);
	assert_int_equal(rv, PE_RESOURCE_EXHAUSTED);
	assert_non_null(strstr(pe_last_error(c), "failpoint fail-prepare: host 1"));
	assert_true(took < 10.0); /* not the 60 s collective deadline */
	pe_memory_info after[4];
	assert_int_equal(pe_memory_info_all(c, after, 4), PE_OK);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(after[i].bytes_used, before[i].bytes_used);
		assert_int_equal(after[i].bytes_reserved, 0);
	}
	pe_release(y);
	pe_disconnect(c);
	pod_stop();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_peer_killed_mid_collective),
	    cmocka_unit_test(test_process_of_several_hosts_killed),
	    cmocka_unit_test(test_frozen_peer_fails_the_step),
	    cmocka_unit_test(test_agent_restart_rejoins),
	    cmocka_unit_test(test_coordinator_restart),
	    cmocka_unit_test(test_collective_never_reached),
	    cmocka_unit_test(test_host_that_cannot_prepare_fails_the_step_at_once),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
