/* Deadlines for pthread_cond_timedwait, which waits on CLOCK_REALTIME. */
#ifndef PODEMU_CLOCK_H
#define PODEMU_CLOCK_H

#include <time.h>

/* The CLOCK_REALTIME instant ms milliseconds from now. */
static inline struct timespec clock_deadline_ms(long ms)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	return ts;
}

/* A monotonic clock in microseconds, for durations. */
static inline long long clock_now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

#endif
