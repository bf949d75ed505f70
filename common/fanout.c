#include "fanout.h"

#include <pthread.h>
#include <stdlib.h>

struct fanout_job {
	int index;
	void (*fn)(int i, void *arg);
	void *arg;
	pthread_t thread;
	int started;
};

static void *fanout_main(void *p)
{
	struct fanout_job *job = p;
	job->fn(job->index, job->arg);
	return NULL;
}

void fanout_run(int n, void (*fn)(int i, void *arg), void *arg)
{
	if (n == 1) {
		fn(0, arg);
		return;
	}
	struct fanout_job *jobs = calloc((size_t)n, sizeof(*jobs));
	if (jobs == NULL) {
		for (int i = 0; i < n; i++)
			fn(i, arg);
		return;
	}
	for (int i = 0; i < n; i++) {
		jobs[i] = (struct fanout_job){.index = i, .fn = fn, .arg = arg};
		jobs[i].started = pthread_create(&jobs[i].thread, NULL, fanout_main, &jobs[i]) == 0;
		if (!jobs[i].started)
			fn(i, arg);
	}
	for (int i = 0; i < n; i++)
		if (jobs[i].started)
			pthread_join(jobs[i].thread, NULL);
	free(jobs);
}
