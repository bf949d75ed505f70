/*
 * How a core waits in a collective: on its condition, or, when the collective has peers on
 * other hosts, polling its host's data plane itself (dp_hold), so that a chunk or an
 * acknowledgement for it wakes it straight from its socket instead of through the reactor
 * thread. It holds the data plane until core_release_dp.
 */
#include <errno.h>
#include <limits.h>
#include <time.h>

#include "coll_run.h"

/* Milliseconds from now to deadline (a CLOCK_REALTIME time), rounded up; <= 0 once past. */
static int64_t ms_until(const struct timespec *deadline)
{
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	return (int64_t)(deadline->tv_sec - now.tv_sec) * 1000 +
	       (deadline->tv_nsec - now.tv_nsec + 999999) / 1000000;
}

int coll_wait(struct run *r)
{
	struct core *c = r->c;
	struct device *dev = r->dev;
	if (!c->holds_dp && r->remote && dev->dp != NULL && !dev->dp_held && !dev->dp_unholdable) {
		/*
		 * Claimed first, so that the host's other cores wait on their conditions meanwhile;
		 * the lock is let go because the reactor thread may need it to end its turn.
		 */
		dev->dp_held = true;
		pthread_mutex_unlock(&dev->lock);
		bool held = dp_hold(dev->dp, c->wake_fd);
		pthread_mutex_lock(&dev->lock);
		c->holds_dp = held;
		dev->dp_held = held;
		dev->dp_unholdable = !held;
		return 0; /* the caller looks again: what came meanwhile woke nobody */
	}
	if (!c->holds_dp)
		return pthread_cond_timedwait(&c->cv, &dev->lock, &r->deadline);
	/*
	 * Past the deadline it still reads a little: a wait that goes on (a read into place being
	 * given up) ends only by a read that nobody else makes.
	 */
	int64_t ms = ms_until(&r->deadline);
	bool past = ms <= 0;
	if (past)
		ms = 10;
	c->polling = true;
	pthread_mutex_unlock(&dev->lock);
	int rv = dp_poll(dev->dp, ms > INT_MAX ? INT_MAX : (int)ms);
	if (rv < 0) /* the data plane stops: waits go back to the condition */
		core_release_dp(dev, c);
	pthread_mutex_lock(&dev->lock);
	c->polling = false;
	return past ? ETIMEDOUT : 0;
}

void core_release_dp(struct device *dev, struct core *c)
{
	if (!c->holds_dp)
		return;
	dp_release(dev->dp);
	c->holds_dp = false;
	pthread_mutex_lock(&dev->lock);
	dev->dp_held = false;
	pthread_mutex_unlock(&dev->lock);
}
