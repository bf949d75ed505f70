/*
 * The data plane's reactor: one thread that waits, in one epoll set, until plain TCP streams
 * have the bytes their readers wait for, and runs the readers' callbacks itself. An nng read
 * is woken on nng's poller thread and completed on one of its task threads: two thread
 * hand-offs a read, where this takes one. A core waiting in a collective may hold the set and
 * poll it itself (dp_hold): then the read takes none, and the thread sleeps meanwhile.
 */
#include "dp_internal.h"

#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

struct dp_reactor {
	int epfd;
	int wake; /* an eventfd in the set: dp_reactor_forget and dp_reactor_stop ring it */
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t turned;   /* a turn ended, or the thread parked */
	pthread_cond_t released; /* the holder let go, or the reactor stops */
	uint64_t turns; /* turns of the loop that ended: a reader forgotten before one began is
	                   never touched after it ends */
	/*
	 * One poller at a time: the thread, or a holder (a core waiting in a collective), while
	 * the thread is parked. polling: a turn is under way or about to begin, on `poller`.
	 */
	bool held, parked, polling;
	pthread_t poller;
	int holder_fd; /* the holder's wake eventfd, in the set while it holds */
	bool stopping, stopped;
};

static void ring(struct dp_reactor *re)
{
	uint64_t one = 1;
	ssize_t n = write(re->wake, &one, sizeof(one));
	(void)n; /* a full counter still wakes the set */
}

static void drain(int fd)
{
	uint64_t count;
	ssize_t got = read(fd, &count, sizeof(count));
	(void)got;
}

/* Runs the event a turn's epoll_wait returned. */
static void run_event(struct dp_reactor *re, const struct epoll_event *ev)
{
	if (ev->data.ptr == NULL) {
		drain(re->wake);
	} else if (ev->data.ptr == &re->holder_fd) {
		drain(re->holder_fd);
	} else {
		struct dp_reader *r = ev->data.ptr;
		r->cb(r->arg);
	}
}

/* A turn ends on the poller's thread. Lock held. */
static void turn_ended(struct dp_reactor *re)
{
	re->turns++;
	re->polling = false;
	pthread_cond_broadcast(&re->turned);
}

/*
 * One event a turn: a reader whose callback frees another reader (never itself) then leaves
 * no event of the freed one behind in a batch still to run. While a holder polls, the thread
 * is parked.
 */
static void *reactor_main(void *arg)
{
	struct dp_reactor *re = arg;
	pthread_mutex_lock(&re->lock);
	for (;;) {
		while (re->held && !re->stopping) {
			re->parked = true;
			pthread_cond_broadcast(&re->turned);
			pthread_cond_wait(&re->released, &re->lock);
		}
		re->parked = false;
		if (re->stopping)
			break;
		re->polling = true;
		re->poller = pthread_self();
		pthread_mutex_unlock(&re->lock);
		struct epoll_event ev;
		int n = epoll_wait(re->epfd, &ev, 1, -1);
		pthread_mutex_lock(&re->lock);
		bool stopping = re->stopping;
		pthread_mutex_unlock(&re->lock);
		if (n == 1 && !stopping)
			run_event(re, &ev);
		pthread_mutex_lock(&re->lock);
		turn_ended(re);
	}
	pthread_mutex_unlock(&re->lock);
	return NULL;
}

int dp_reactor_start(struct dp_reactor **out)
{
	struct dp_reactor *re = calloc(1, sizeof(*re));
	if (re == NULL)
		return -1;
	re->holder_fd = -1;
	re->epfd = epoll_create1(EPOLL_CLOEXEC);
	re->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
	if (re->epfd < 0 || re->wake < 0 || epoll_ctl(re->epfd, EPOLL_CTL_ADD, re->wake, &ev) != 0)
		goto fail;
	pthread_mutex_init(&re->lock, NULL);
	pthread_cond_init(&re->turned, NULL);
	pthread_cond_init(&re->released, NULL);
	if (pthread_create(&re->thread, NULL, reactor_main, re) != 0) {
		pthread_cond_destroy(&re->released);
		pthread_cond_destroy(&re->turned);
		pthread_mutex_destroy(&re->lock);
		goto fail;
	}
	pthread_setname_np(re->thread, "podemu:dp");
	*out = re;
	return 0;
fail:
	if (re->epfd >= 0)
		close(re->epfd);
	if (re->wake >= 0)
		close(re->wake);
	free(re);
	return -1;
}

/* Ends the loop (and a holder's polls); every caller returns once no callback runs any more. */
void dp_reactor_stop(struct dp_reactor *re)
{
	pthread_mutex_lock(&re->lock);
	bool first = !re->stopping;
	re->stopping = true;
	pthread_cond_broadcast(&re->released);
	pthread_mutex_unlock(&re->lock);
	if (first) {
		ring(re);
		pthread_join(re->thread, NULL);
		pthread_mutex_lock(&re->lock);
		while (re->polling) { /* a holder's turn */
			ring(re);
			pthread_cond_wait(&re->turned, &re->lock);
		}
		re->stopped = true;
		pthread_cond_broadcast(&re->turned);
		pthread_mutex_unlock(&re->lock);
		return;
	}
	pthread_mutex_lock(&re->lock);
	while (!re->stopped)
		pthread_cond_wait(&re->turned, &re->lock);
	pthread_mutex_unlock(&re->lock);
}

void dp_reactor_free(struct dp_reactor *re)
{
	if (re == NULL)
		return;
	dp_reactor_stop(re);
	close(re->epfd);
	close(re->wake);
	pthread_cond_destroy(&re->released);
	pthread_cond_destroy(&re->turned);
	pthread_mutex_destroy(&re->lock);
	free(re);
}

int dp_reactor_arm(struct dp_reactor *re, struct dp_reader *r)
{
	struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT, .data.ptr = r};
	/* Marked first: once in the set, r is the reactor's, whose callback may arm it again. */
	bool added = !r->registered;
	r->registered = true;
	if (epoll_ctl(re->epfd, added ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, r->fd, &ev) == 0)
		return 0;
	if (added)
		r->registered = false;
	return -1;
}

void dp_reactor_forget(struct dp_reactor *re, struct dp_reader *r)
{
	if (!r->registered)
		return;
	struct epoll_event ev = {0};
	epoll_ctl(re->epfd, EPOLL_CTL_DEL, r->fd, &ev);
	r->registered = false;
	pthread_mutex_lock(&re->lock);
	/*
	 * A turn that began before the removal may hold r's event: wait for it to end (or for
	 * the loop to). None is under way when nobody polls; on the poller's own thread, the turn
	 * under way is another reader's: r has no event in hand.
	 */
	if (re->polling && !pthread_equal(re->poller, pthread_self())) {
		uint64_t turn = re->turns;
		if (!re->stopped)
			ring(re);
		while (re->turns == turn && !re->stopped)
			pthread_cond_wait(&re->turned, &re->lock);
	}
	pthread_mutex_unlock(&re->lock);
}

bool dp_reactor_hold(struct dp_reactor *re, int wake_fd)
{
	pthread_mutex_lock(&re->lock);
	if (re->held || re->stopping) {
		pthread_mutex_unlock(&re->lock);
		return false;
	}
	re->held = true;
	ring(re); /* the thread leaves its epoll_wait, and parks */
	while (!re->parked && !re->stopping)
		pthread_cond_wait(&re->turned, &re->lock);
	bool ok = !re->stopping;
	pthread_mutex_unlock(&re->lock);
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &re->holder_fd};
	if (ok && epoll_ctl(re->epfd, EPOLL_CTL_ADD, wake_fd, &ev) == 0) {
		re->holder_fd = wake_fd;
		return true;
	}
	pthread_mutex_lock(&re->lock);
	re->held = false;
	pthread_cond_broadcast(&re->released);
	pthread_mutex_unlock(&re->lock);
	return false;
}

int dp_reactor_poll(struct dp_reactor *re, int timeout_ms)
{
	pthread_mutex_lock(&re->lock);
	if (re->stopping) {
		pthread_mutex_unlock(&re->lock);
		return -1;
	}
	re->polling = true;
	re->poller = pthread_self();
	pthread_mutex_unlock(&re->lock);
	struct epoll_event ev;
	int n = epoll_wait(re->epfd, &ev, 1, timeout_ms);
	if (n == 1)
		run_event(re, &ev);
	pthread_mutex_lock(&re->lock);
	turn_ended(re);
	pthread_mutex_unlock(&re->lock);
	return n == 1 ? 1 : 0;
}

void dp_reactor_release(struct dp_reactor *re)
{
	struct epoll_event ev = {0};
	epoll_ctl(re->epfd, EPOLL_CTL_DEL, re->holder_fd, &ev);
	re->holder_fd = -1;
	pthread_mutex_lock(&re->lock);
	re->held = false;
	pthread_cond_broadcast(&re->released);
	pthread_mutex_unlock(&re->lock);
}
