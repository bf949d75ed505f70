/*
 * The data plane's reactor: one thread that waits, in one epoll set, until plain TCP streams
 * have the bytes their readers wait for, and runs the readers' callbacks itself. An nng read
 * is woken on nng's poller thread and completed on one of its task threads: two thread
 * hand-offs a read, where this takes one.
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
	pthread_cond_t turned;
	uint64_t turns; /* turns of the loop that ended: a reader forgotten before one began is
	                   never touched after it ends */
	bool stopping, stopped;
};

static void ring(struct dp_reactor *re)
{
	uint64_t one = 1;
	ssize_t n = write(re->wake, &one, sizeof(one));
	(void)n; /* a full counter still wakes the set */
}

/*
 * One event a turn: a reader whose callback frees another reader (never itself) then leaves
 * no event of the freed one behind in a batch still to run.
 */
static void *reactor_main(void *arg)
{
	struct dp_reactor *re = arg;
	for (;;) {
		struct epoll_event ev;
		int n = epoll_wait(re->epfd, &ev, 1, -1);
		pthread_mutex_lock(&re->lock);
		bool stopping = re->stopping;
		pthread_mutex_unlock(&re->lock);
		if (stopping)
			break;
		if (n == 1 && ev.data.ptr == NULL) {
			uint64_t count;
			ssize_t got = read(re->wake, &count, sizeof(count));
			(void)got;
		} else if (n == 1) {
			struct dp_reader *r = ev.data.ptr;
			r->cb(r->arg);
		}
		pthread_mutex_lock(&re->lock);
		re->turns++;
		pthread_cond_broadcast(&re->turned);
		pthread_mutex_unlock(&re->lock);
	}
	return NULL;
}

int dp_reactor_start(struct dp_reactor **out)
{
	struct dp_reactor *re = calloc(1, sizeof(*re));
	if (re == NULL)
		return -1;
	re->epfd = epoll_create1(EPOLL_CLOEXEC);
	re->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
	if (re->epfd < 0 || re->wake < 0 || epoll_ctl(re->epfd, EPOLL_CTL_ADD, re->wake, &ev) != 0)
		goto fail;
	pthread_mutex_init(&re->lock, NULL);
	pthread_cond_init(&re->turned, NULL);
	if (pthread_create(&re->thread, NULL, reactor_main, re) != 0) {
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

/* Ends the loop; every caller returns once it has (no callback runs after). */
void dp_reactor_stop(struct dp_reactor *re)
{
	pthread_mutex_lock(&re->lock);
	bool first = !re->stopping;
	re->stopping = true;
	pthread_mutex_unlock(&re->lock);
	if (first) {
		ring(re);
		pthread_join(re->thread, NULL);
		pthread_mutex_lock(&re->lock);
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
	if (pthread_equal(pthread_self(), re->thread))
		return; /* the turn under way is another reader's: r has no event in hand */
	/*
	 * A turn that began before the removal may hold r's event: wait for it to end (or for
	 * the loop to).
	 */
	pthread_mutex_lock(&re->lock);
	uint64_t turn = re->turns;
	if (!re->stopped)
		ring(re);
	while (re->turns == turn && !re->stopped)
		pthread_cond_wait(&re->turned, &re->lock);
	pthread_mutex_unlock(&re->lock);
}
