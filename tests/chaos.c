/*
 * Chaos: on a 4-host x 2-core pod with real bytes, steps with an all-gather and an all-reduce run
 * in a loop while a random agent is killed with SIGKILL at a random moment and started again,
 * COUNT times (default 20). Prints steps ok, steps failed cleanly, hangs, HBM left allocated
 * after each recovery, and the longest times from a kill to the failure and to ready again.
 * Exits non-zero on a hang, a leak, or a wrong value.
 *
 * usage: chaos [COUNT [SEED]]
 */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <time.h>

#include "pod_fixture.h"

#define HOSTS 4
#define CORES 8
#define ELEMENTS (256 * 1024)
/* A step slower than this counts as a hang: lease 3 s + the restart + a wide margin. */
#define HANG_S 20.0
/* A kill after which no step succeeds for this long fails the run. */
#define RECOVERY_S 90.0

struct killer {
	int host;
	int delay_ms;
	pthread_mutex_t lock;
	double killed_at; /* 0 until killed */
	int done;         /* the agent was started again (or could not be) */
	int restarted;
};

static void killer_state(struct killer *k, double *killed_at, int *done)
{
	pthread_mutex_lock(&k->lock);
	*killed_at = k->killed_at;
	*done = k->done;
	pthread_mutex_unlock(&k->lock);
}

static void *kill_and_restart(void *arg)
{
	struct killer *k = arg;
	struct timespec ts = {k->delay_ms / 1000, (long)(k->delay_ms % 1000) * 1000000};
	nanosleep(&ts, NULL);
	char name[32];
	snprintf(name, sizeof(name), "agent-%d", k->host);
	pthread_mutex_lock(&k->lock);
	k->killed_at = pod_now_s();
	pthread_mutex_unlock(&k->lock);
	int restarted = pod_restart(name, SIGKILL, "registered as host") > 0;
	pthread_mutex_lock(&k->lock);
	k->restarted = restarted;
	k->done = 1;
	pthread_mutex_unlock(&k->lock);
	return NULL;
}

/* One step: all-gather and all-reduce of ones; checks one core's results. PE_OK or the code. */
static int one_step(pe_client *c, int core, int *wrong)
{
	int64_t n = ELEMENTS;
	pe_tensor *x = pe_full(c, PE_F32, &n, 1, 1.0);
	pe_tensor *y = pe_all_gather(x, 0);
	pe_tensor *z = pe_all_reduce(x, PE_REDUCE_SUM, 1.0, NULL);
	int rv = x && y && z ? pe_mark_step(c) : pe_last_code(c);
	static float gathered[ELEMENTS * CORES], reduced[ELEMENTS];
	if (rv == PE_OK)
		rv = pe_fetch(y, core, gathered, sizeof(gathered));
	if (rv == PE_OK)
		rv = pe_fetch(z, core, reduced, sizeof(reduced));
	if (rv == PE_OK) {
		for (int i = 0; i < ELEMENTS * CORES; i++)
			*wrong += gathered[i] != 1.0f;
		for (int i = 0; i < ELEMENTS; i++)
			*wrong += reduced[i] != (float)CORES;
	}
	pe_release(x);
	pe_release(y);
	pe_release(z);
	return rv;
}

int main(int argc, char **argv)
{
	int count = argc > 1 ? atoi(argv[1]) : 20;
	unsigned seed = argc > 2 ? (unsigned)atoi(argv[2]) : (unsigned)time(NULL);
	if (count < 1) {
		fprintf(stderr, "usage: chaos [COUNT [SEED]]\n");
		return 2;
	}
	srand(seed);
	pe_client *c = pod_start("--hosts 4 --cores-per-host 2 --hbm 256M --backing host");
	if (c == NULL) {
		fprintf(stderr, "chaos: the pod did not start\n");
		return 1;
	}
	int ok = 0, failed = 0, hangs = 0, wrong = 0, kills = 0;
	int64_t leaked = 0;
	double worst_failure = 0, worst_ready = 0;
	for (int round = 0; round < count; round++) {
		struct killer k = {.host = rand() % HOSTS, .delay_ms = rand() % 1500};
		pthread_mutex_init(&k.lock, NULL);
		pthread_t t;
		pthread_create(&t, NULL, kill_and_restart, &k);
		double first_failure = 0, round_start = pod_now_s();
		int joined = 0, ok_after = 0;
		/* Steps until the agent is back and a step after that succeeded. */
		while (!joined || ok_after == 0) {
			double t0 = pod_now_s();
			if (t0 - round_start > RECOVERY_S) {
				/* Say so and stop, rather than wait forever on a pod that is gone.
				 */
				fprintf(stderr,
				        "chaos: no step succeeded within %.0f s of kill %d\n",
				        RECOVERY_S, round + 1);
				if (!joined)
					pthread_join(t, NULL);
				pthread_mutex_destroy(&k.lock);
				pe_disconnect(c);
				pod_stop();
				return 1;
			}
			int rv = one_step(c, rand() % CORES, &wrong);
			double t1 = pod_now_s(), killed_at;
			int done;
			killer_state(&k, &killed_at, &done);
			if (t1 - t0 > HANG_S)
				hangs++;
			if (rv == PE_OK) {
				ok++;
				ok_after += joined;
			} else {
				failed++;
				if (first_failure == 0 && killed_at > 0)
					first_failure = t1;
				if (pe_wait_ready(c, 30000) != PE_OK)
					fprintf(stderr, "chaos: %s\n", pe_last_error(c));
			}
			if (!joined && done) {
				pthread_join(t, NULL);
				joined = 1;
				if (!k.restarted) {
					fprintf(stderr, "chaos: agent-%d did not come back\n",
					        k.host);
					hangs++;
					ok_after = 1;
				}
			}
		}
		pthread_mutex_destroy(&k.lock);
		kills++;
		if (first_failure > 0 && first_failure - k.killed_at > worst_failure)
			worst_failure = first_failure - k.killed_at;
		/* Ready again, and nothing left allocated on any core (nothing is held). */
		if (pe_wait_ready(c, 30000) != PE_OK)
			hangs++;
		double ready = pod_now_s() - k.killed_at;
		if (ready > worst_ready)
			worst_ready = ready;
		pe_memory_info m[CORES];
		if (pe_memory_info_all(c, m, CORES) == PE_OK) {
			for (int i = 0; i < CORES; i++)
				leaked += m[i].bytes_used + m[i].bytes_reserved;
		} else {
			fprintf(stderr, "chaos: memory info: %s\n", pe_last_error(c));
			leaked = -1;
		}
		char failure[64] = "no step failed";
		if (first_failure > 0)
			snprintf(failure, sizeof(failure), "a step failed %.2f s later",
			         first_failure - k.killed_at);
		printf("kill %2d: agent-%d after %4d ms; %s; ready %.2f s after the kill\n",
		       round + 1, k.host, k.delay_ms, failure, ready);
		fflush(stdout);
	}
	printf(
	    "chaos (seed %u): %d kills; steps ok %d, failed cleanly %d, hangs %d, wrong values %d, "
	    "HBM left after recoveries %lld bytes; longest kill-to-failure %.2f s, "
	    "kill-to-ready %.2f s\n",
	    seed, kills, ok, failed, hangs, wrong, (long long)leaked, worst_failure, worst_ready);
	if (hangs > 0 || wrong > 0 || leaked != 0) {
		/* Keep the logs of a failed run next to the state directory. */
		char cmd[1024];
		snprintf(cmd, sizeof(cmd), "cp -r %s %s-failed", pod_state_dir, pod_state_dir);
		if (system(cmd) == 0)
			printf("chaos: logs kept in %s-failed\n", pod_state_dir);
	}
	pe_disconnect(c);
	pod_stop();
	return hangs == 0 && wrong == 0 && leaked == 0 ? 0 : 1;
}
