/*
 * Client sessions on a real pod: a client's device buffers die with it (kill -9 in the middle
 * of a step, or an exit without releasing), within the lease and a second; the pod keeps
 * serving the other sessions, whose buffers are untouched; and no session can read, release or
 * compute with another's buffers.
 *
 * The clients that die are this program again (`it_sessions --child ROLE`), started with exec.
 * The pod's agents stall before every collective (a failpoint) until the step is aborted, so
 * the killed client's step is certainly still running when its lease runs out.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <sys/types.h>

#include "pod_fixture.h"
#include "raw_rpc.h"

#define LEASE_MS 2000
#define WORLD 4
/* What each dying client holds per core: 16 MiB of input (and the all-reduce's output). */
#define CHILD_ELEMENTS (4 << 20)

static char self_exe[512];
/* The dying client of the test running, killed by the teardown if an assertion left it. */
static pid_t child_pid;

/*
 * The dying client: makes its buffers, says "ready" on stdout and then either starts a step
 * that stalls in its collective ("stall") or exits without releasing anything ("exit").
 */
static int child_main(const char *role)
{
	pe_client *c;
	if (pe_connect(&c, NULL) != PE_OK) {
		fprintf(stderr, "child: %s\n", pe_connect_error());
		return 2;
	}
	int64_t n = CHILD_ELEMENTS;
	pe_tensor *x = pe_full(c, PE_F32, &n, 1, 1.0);
	if (pe_mark_step(c) != PE_OK) {
		fprintf(stderr, "child: %s\n", pe_last_error(c));
		return 2;
	}
	pe_tensor *y = pe_all_reduce(x, PE_REDUCE_SUM, 1.0, NULL);
	printf("ready %d\n", (int)getpid());
	fflush(stdout);
	if (strcmp(role, "exit") == 0)
		exit(0); /* no pe_disconnect: the buffers stay until the session ends */
	int rv = pe_mark_step(c);
	fprintf(stderr, "child: the stalled step returned %s\n", pe_code_name(rv));
	(void)y;
	return 3;
}

/* Starts `self --child role` with its stdout on a pipe; waits for its "ready" line. */
static pid_t spawn_child(const char *role)
{
	int fds[2];
	assert_int_equal(pipe(fds), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(fds[1], 1);
		close(fds[0]);
		close(fds[1]);
		execl(self_exe, self_exe, "--child", role, (char *)NULL);
		_exit(127);
	}
	child_pid = pid;
	close(fds[1]);
	FILE *f = fdopen(fds[0], "r");
	char line[64] = "";
	assert_non_null(fgets(line, sizeof(line), f));
	fclose(f);
	assert_non_null(strstr(line, "ready"));
	return pid;
}

static void memory_all(pe_client *c, int64_t *used)
{
	assert_int_equal(pod_bytes_used(c, used, WORLD), PE_OK);
}

/* Seconds until every core's bytes in use are back to before (or -1 after 15 s). */
static double wait_restored(pe_client *c, const int64_t *before, double from)
{
	for (;;) {
		int64_t now[WORLD];
		memory_all(c, now);
		if (memcmp(now, before, sizeof(now)) == 0)
			return pod_now_s() - from;
		if (pod_now_s() - from > 15.0) {
			for (int i = 0; i < WORLD; i++)
				fprintf(stderr, "core %d: %lld bytes in use, %lld before\n", i,
				        (long long)now[i], (long long)before[i]);
			return -1;
		}
		struct timespec ts = {0, 20 * 1000000};
		nanosleep(&ts, NULL);
	}
}

/* Bytes per core of pid's session as `podemu status --json` lists it; -1 when it lists none. */
static long long status_session_bytes(pid_t pid)
{
	char cmd[1024], out[65536];
	snprintf(cmd, sizeof(cmd), "%s/podemu status --json --state-dir %s", PODEMU_BIN_DIR,
	         pod_state_dir);
	FILE *p = popen(cmd, "r");
	size_t len = p != NULL ? fread(out, 1, sizeof(out) - 1, p) : 0;
	if (p != NULL)
		pclose(p);
	out[len] = '\0';
	char want[128];
	snprintf(want, sizeof(want), "\"pid\": %d, \"name\": \"it_sessions\"", (int)pid);
	const char *at = strstr(out, want);
	const char *bytes = at != NULL ? strstr(at, "\"bytes_per_core\": ") : NULL;
	const char *end = at != NULL ? strchr(at, '}') : NULL;
	if (bytes == NULL || end == NULL || bytes > end)
		return -1;
	return atoll(bytes + strlen("\"bytes_per_core\": "));
}

/* The surviving client's own buffer: made before, checked after each death. */
struct survivor {
	pe_client *c;
	pe_tensor *keep;
	int64_t before[WORLD];
};

static void survivor_check(struct survivor *s)
{
	static float v[1024];
	for (int core = 0; core < WORLD; core++) {
		assert_int_equal(pe_fetch(s->keep, core, v, sizeof(v)), PE_OK);
		for (int i = 0; i < 1024; i++)
			assert_true(v[i] == 3.0f);
	}
	/* And it still computes. */
	pe_tensor *sum = pe_add(s->keep, s->keep);
	assert_int_equal(pe_mark_step(s->c), PE_OK);
	assert_int_equal(pe_fetch(sum, 2, v, sizeof(v)), PE_OK);
	assert_true(v[7] == 6.0f);
	pe_release(sum);
}

static int setup(void **state)
{
	static struct survivor s;
	setenv("PODEMU_FAILPOINT", "stall-before-collective", 1);
	char args[256];
	snprintf(args, sizeof(args),
	         "--hosts 2 --cores-per-host 2 --hbm 512M --backing host --session-lease-ms %d",
	         LEASE_MS);
	s.c = pod_start(args);
	unsetenv("PODEMU_FAILPOINT");
	if (s.c == NULL)
		return -1;
	int64_t n = 1024;
	s.keep = pe_full(s.c, PE_F32, &n, 1, 3.0);
	if (pe_mark_step(s.c) != PE_OK)
		return -1;
	*state = &s;
	return 0;
}

static int teardown(void **state)
{
	struct survivor *s = *state;
	if (child_pid > 0 && kill(child_pid, SIGKILL) == 0)
		waitpid(child_pid, NULL, 0);
	pe_disconnect(s->c);
	pod_stop();
	return 0;
}

static void test_killed_mid_step(void **state)
{
	struct survivor *s = *state;
	memory_all(s->c, s->before);
	long log_from = 0;
	char path[512];
	snprintf(path, sizeof(path), "%s/agent-1.log", pod_state_dir);
	FILE *lf = fopen(path, "r");
	if (lf != NULL && fseek(lf, 0, SEEK_END) == 0)
		log_from = ftell(lf);
	if (lf != NULL)
		fclose(lf);
	pid_t child = spawn_child("stall");
	/* Its step is on the cores, stalled before the all-reduce. */
	assert_true(pod_log_has("agent-1", log_from, "failpoint stall-before-collective"));
	/* Its input is its buffer so far; the step's output becomes one when the step ends. */
	assert_int_equal(status_session_bytes(child), 4LL * CHILD_ELEMENTS);
	double at = pod_now_s();
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	child_pid = 0;
	double took = wait_restored(s->c, s->before, at);
	printf("killed mid-step: every core back to its bytes in use %.2f s after kill -9 "
	       "(lease %d ms)\n",
	       took, LEASE_MS);
	assert_true(took >= 0);
	assert_true(took <= LEASE_MS / 1000.0 + 1.0);
	assert_true(pod_log_has("coordinator", 0, "is cancelled"));
	assert_int_equal(status_session_bytes(child), -1); /* the session is gone */
	survivor_check(s);
}

static void test_exit_without_release(void **state)
{
	struct survivor *s = *state;
	memory_all(s->c, s->before);
	pid_t child = spawn_child("exit");
	waitpid(child, NULL, 0);
	child_pid = 0;
	double at = pod_now_s();
	double took = wait_restored(s->c, s->before, at);
	printf("exited without releasing: every core back %.2f s after the exit (lease %d ms)\n",
	       took, LEASE_MS);
	assert_true(took >= 0);
	assert_true(took <= LEASE_MS / 1000.0 + 1.0);
	survivor_check(s);
}

/*
 * A child forked after pe_connect that disconnects (a Python worker's finalizer, say) leaves
 * its parent's session and buffers alone: they are the parent's.
 */
static void test_a_forked_child_does_not_end_the_parents_session(void **state)
{
	struct survivor *s = *state;
	memory_all(s->c, s->before);
	pid_t child = fork();
	assert_true(child >= 0);
	if (child == 0) {
		pe_disconnect(s->c);
		_exit(0);
	}
	int status;
	assert_int_equal(waitpid(child, &status, 0), child);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	/* Past the lease: the session still lives and holds what it held. */
	struct timespec ts = {LEASE_MS / 1000 + 1, 0};
	nanosleep(&ts, NULL);
	int64_t now[WORLD];
	memory_all(s->c, now);
	assert_memory_equal(now, s->before, sizeof(now));
	survivor_check(s);
}

static void test_sessions_are_apart(void **state)
{
	struct survivor *s = *state;
	struct rpc_client *rc = pod_raw_client();
	struct status st;
	struct arena *a = arena_new();
	int64_t base[WORLD];
	memory_all(s->c, base);
	uint64_t mine = pod_raw_open_session(rc, a)->session,
	         other = pod_raw_open_session(rc, a)->session;
	assert_true(mine != other);

	int64_t dims[1] = {256};
	Podemu__Shape shape = PODEMU__SHAPE__INIT;
	shape.dtype = PODEMU__DTYPE__DTYPE_F32;
	shape.dims = dims;
	shape.n_dims = 1;
	Podemu__CreateBufferRequest create = PODEMU__CREATE_BUFFER_REQUEST__INIT;
	create.shape = &shape;
	void *reply;
	/* No session: refused. */
	assert_int_equal(pod_raw_call(rc, CM_CREATE_BUFFER, &create, a, &reply, &st),
	                 ST_INVALID_ARGUMENT);
	create.session = mine;
	assert_int_equal(pod_raw_call(rc, CM_CREATE_BUFFER, &create, a, &reply, &st), ST_OK);
	uint64_t h = ((Podemu__CreateBufferReply *)reply)->handle;
	float ones[256];
	for (int i = 0; i < 256; i++)
		ones[i] = 1.0f;
	Podemu__TransferToDeviceRequest put = PODEMU__TRANSFER_TO_DEVICE_REQUEST__INIT;
	put.session = mine;
	put.handle = h;
	put.ordinal = 3;
	put.data.data = (uint8_t *)ones;
	put.data.len = sizeof(ones);
	assert_int_equal(pod_raw_call(rc, CM_TRANSFER_TO_DEVICE, &put, a, &reply, &st), ST_OK);

	/* The other session reads, writes, computes with and releases nothing of it. */
	Podemu__TransferFromDeviceRequest get = PODEMU__TRANSFER_FROM_DEVICE_REQUEST__INIT;
	get.session = other;
	get.handle = h;
	get.ordinal = 3;
	get.length = sizeof(ones);
	assert_int_equal(pod_raw_call(rc, CM_TRANSFER_FROM_DEVICE, &get, a, &reply, &st),
	                 ST_NOT_FOUND);
	assert_non_null(strstr(st.message, "another session's"));
	put.session = other;
	assert_int_equal(pod_raw_call(rc, CM_TRANSFER_TO_DEVICE, &put, a, &reply, &st),
	                 ST_NOT_FOUND);
	Podemu__ReleaseRequest rel = PODEMU__RELEASE_REQUEST__INIT;
	rel.handles = &h;
	rel.n_handles = 1;
	rel.session = other;
	assert_int_equal(pod_raw_call(rc, CM_RELEASE, &rel, a, &reply, &st), ST_NOT_FOUND);
	Podemu__Node param = PODEMU__NODE__INIT, neg = PODEMU__NODE__INIT;
	param.opcode = "parameter";
	param.handle = h;
	param.shape = &shape;
	neg.opcode = "negate";
	int32_t operand = 0, output = 1;
	neg.operands = &operand;
	neg.n_operands = 1;
	Podemu__Node *nodes[] = {&param, &neg};
	Podemu__Graph g = PODEMU__GRAPH__INIT;
	g.nodes = nodes;
	g.n_nodes = 2;
	g.outputs = &output;
	g.n_outputs = 1;
	Podemu__StepRequest step = PODEMU__STEP_REQUEST__INIT;
	step.graph = &g;
	step.session = other;
	assert_int_equal(pod_raw_call(rc, CM_EXECUTE_STEP, &step, a, &reply, &st), ST_NOT_FOUND);
	step.release_after = &h; /* nor releases it along with a step of its own */
	step.n_release_after = 1;
	step.graph = NULL;
	assert_int_equal(pod_raw_call(rc, CM_EXECUTE_STEP, &step, a, &reply, &st), ST_NOT_FOUND);

	/* Its owner still reads it as written. */
	get.session = mine;
	assert_int_equal(pod_raw_call(rc, CM_TRANSFER_FROM_DEVICE, &get, a, &reply, &st), ST_OK);
	assert_memory_equal(((Podemu__TransferFromDeviceReply *)reply)->data.data, ones,
	                    sizeof(ones));
	/* Closing a session frees what it owns, at once; its handles are then unknown. */
	Podemu__SessionRequest close_req = PODEMU__SESSION_REQUEST__INIT;
	close_req.session = mine;
	assert_int_equal(pod_raw_call(rc, CM_CLOSE_SESSION, &close_req, a, &reply, &st), ST_OK);
	int64_t now[WORLD];
	memory_all(s->c, now);
	assert_memory_equal(now, base, sizeof(now));
	get.session = mine;
	assert_int_equal(pod_raw_call(rc, CM_TRANSFER_FROM_DEVICE, &get, a, &reply, &st),
	                 ST_NOT_FOUND);
	assert_non_null(strstr(st.message, "has ended: the client closed it"));
	close_req.session = other;
	assert_int_equal(pod_raw_call(rc, CM_CLOSE_SESSION, &close_req, a, &reply, &st), ST_OK);
	arena_free(a);
	rpc_client_close(rc);
	survivor_check(s);
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "--child") == 0)
		return child_main(argv[2]);
	ssize_t n = readlink("/proc/self/exe", self_exe, sizeof(self_exe) - 1);
	if (n <= 0)
		return 1;
	self_exe[n] = '\0';
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_killed_mid_step),
	    cmocka_unit_test(test_exit_without_release),
	    cmocka_unit_test(test_sessions_are_apart),
	    cmocka_unit_test(test_a_forked_child_does_not_end_the_parents_session),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
