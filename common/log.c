#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* The role may be renamed while other threads log (an agent once its hosts are known). */
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_role[64] = "podemu";
static atomic_int log_min = LOG_INFO;

void log_init(const char *role, enum log_level level)
{
	pthread_mutex_lock(&log_lock);
	snprintf(log_role, sizeof(log_role), "%s", role);
	pthread_mutex_unlock(&log_lock);
	atomic_store(&log_min, (int)level);
}

enum log_level log_level(void)
{
	return (enum log_level)atomic_load(&log_min);
}

void log_msg(enum log_level level, const char *fmt, ...)
{
	static const char *const names[] = {"debug", "info", "warn", "error"};
	if ((int)level < atomic_load(&log_min))
		return;
	char line[4096];
	struct timespec ts;
	struct tm tm;
	char role[sizeof(log_role)];
	pthread_mutex_lock(&log_lock);
	memcpy(role, log_role, sizeof(role));
	pthread_mutex_unlock(&log_lock);
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	int n = snprintf(line, sizeof(line),
	                 "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s: ", tm.tm_year + 1900,
	                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
	                 ts.tv_nsec / 1000000, role, names[level]);
	va_list ap;
	va_start(ap, fmt);
	if (n > 0 && (size_t)n < sizeof(line))
		vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	/* One write per line keeps lines from several threads whole. */
	fprintf(stderr, "%s\n", line);
}
