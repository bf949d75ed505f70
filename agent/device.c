#include "device.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

int device_init(struct device *dev, int host_index, int num_hosts, int cores_per_host,
                int64_t bytes_limit, bool backed, int64_t retain, struct status *st)
{
	memset(dev, 0, sizeof(*dev));
	pthread_mutex_init(&dev->lock, NULL);
	pthread_cond_init(&dev->cv, NULL);
	dev->host_index = host_index;
	dev->num_hosts = num_hosts;
	dev->cores_per_host = cores_per_host;
	dev->world_size = num_hosts * cores_per_host;
	dev->backed = backed;
	dev->window = 4;
	const char *failpoint = getenv("PODEMU_FAILPOINT");
	dev->stall_before_collective =
	    failpoint != NULL && strcmp(failpoint, "stall-before-collective") == 0;
	dev->fail_prepare = failpoint != NULL && strcmp(failpoint, "fail-prepare") == 0;
	dev->cores = calloc((size_t)cores_per_host, sizeof(*dev->cores));
	if (dev->cores == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int i = 0; i < cores_per_host; i++) {
		pthread_cond_init(&dev->cores[i].cv, NULL);
		dev->cores[i].wake_fd = -1;
	}
	for (int i = 0; i < cores_per_host; i++) {
		struct core *c = &dev->cores[i];
		c->dev = dev;
		c->local = i;
		c->ordinal = host_index * cores_per_host + i;
		int rv = hbm_init(&c->heap, bytes_limit, backed, st);
		if (rv != ST_OK) {
			device_destroy(dev);
			return rv;
		}
		hbm_set_retain(&c->heap, retain);
		if ((c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
			device_destroy(dev);
			return status_set(st, ST_RESOURCE_EXHAUSTED,
			                  "cannot make core %d's eventfd", c->ordinal);
		}
	}
	for (int i = 0; i < cores_per_host; i++) {
		struct core *c = &dev->cores[i];
		c->thread_started = pthread_create(&c->thread, NULL, device_core_main, c) == 0;
		if (!c->thread_started) {
			device_destroy(dev);
			return status_set(st, ST_RESOURCE_EXHAUSTED, "cannot start core %d",
			                  c->ordinal);
		}
	}
	return ST_OK;
}

void device_destroy(struct device *dev)
{
	if (dev->cores == NULL)
		return;
	pthread_mutex_lock(&dev->lock);
	dev->stopping = true;
	pthread_cond_broadcast(&dev->cv);
	device_wake_cores(dev);
	pthread_mutex_unlock(&dev->lock);
	for (int i = 0; i < dev->cores_per_host; i++)
		if (dev->cores[i].thread_started)
			pthread_join(dev->cores[i].thread, NULL);
	if (dev->step != NULL)
		device_abort(dev, 0, ST_ABORTED, "the agent is stopping", NULL, NULL);
	pthread_mutex_lock(&dev->lock);
	device_drop_early(dev, "the agent is stopping");
	pthread_mutex_unlock(&dev->lock);
	for (int i = 0; i < dev->num_buffers; i++)
		free(dev->buffers[i].at);
	free(dev->buffers);
	hindex_free(&dev->index);
	for (int i = 0; i < dev->cores_per_host; i++) {
		hbm_destroy(&dev->cores[i].heap);
		pthread_cond_destroy(&dev->cores[i].cv);
		if (dev->cores[i].wake_fd >= 0)
			close(dev->cores[i].wake_fd);
	}
	free(dev->cores);
	dev->cores = NULL;
	pthread_cond_destroy(&dev->cv);
	pthread_mutex_destroy(&dev->lock);
}

void core_wake(struct core *c)
{
	c->events++;
	pthread_cond_signal(&c->cv);
	/* A core's own reads (in its dp_poll) wake it by returning. */
	if (c->polling && !pthread_equal(pthread_self(), c->thread)) {
		uint64_t one = 1;
		ssize_t n = write(c->wake_fd, &one, sizeof(one));
		(void)n; /* a full counter still wakes the poll */
	}
}

void device_wake_cores(struct device *dev)
{
	for (int i = 0; i < dev->cores_per_host; i++)
		core_wake(&dev->cores[i]);
}

struct device_buffer *device_find_buffer(struct device *dev, uint64_t handle)
{
	int i = hindex_find(&dev->index, dev->buffers, sizeof(dev->buffers[0]), handle);
	return i >= 0 ? &dev->buffers[i] : NULL;
}

int device_add_buffer(struct device *dev, uint64_t handle, const struct shape *shape,
                      struct hbm_buffer *at, struct status *st)
{
	if (dev->num_buffers == dev->cap_buffers) {
		int cap = dev->cap_buffers ? dev->cap_buffers * 2 : 64;
		struct device_buffer *b = realloc(dev->buffers, (size_t)cap * sizeof(*b));
		if (b == NULL)
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		dev->buffers = b;
		dev->cap_buffers = cap;
	}
	int i = dev->num_buffers;
	dev->buffers[i] = (struct device_buffer){.handle = handle, .shape = *shape, .at = at};
	if (hindex_add(&dev->index, dev->buffers, sizeof(dev->buffers[0]), i + 1, i) != 0)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	dev->num_buffers++;
	return ST_OK;
}

void device_rename_buffer(struct device *dev, struct device_buffer *b, uint64_t handle)
{
	int i = (int)(b - dev->buffers);
	hindex_remove(&dev->index, dev->buffers, sizeof(dev->buffers[0]), i, i);
	b->handle = handle;
	/* The index has room: it held this entry a moment ago. */
	hindex_add(&dev->index, dev->buffers, sizeof(dev->buffers[0]), dev->num_buffers, i);
}

/* Frees buffer b's bytes on every core and forgets it (lock held). */
static void remove_buffer(struct device *dev, struct device_buffer *b)
{
	for (int c = 0; c < dev->cores_per_host; c++)
		hbm_free(&dev->cores[c].heap, b->at[c]);
	free(b->at);
	int i = (int)(b - dev->buffers), last = dev->num_buffers - 1;
	hindex_remove(&dev->index, dev->buffers, sizeof(dev->buffers[0]), i, last);
	dev->buffers[i] = dev->buffers[last];
	dev->num_buffers--;
	device_note_activity(dev);
}

int device_create_buffer(struct device *dev, uint64_t handle, const struct shape *shape,
                         int64_t bytes, struct status *st)
{
	if (bytes != 0 && bytes < shape_bytes(shape))
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "buffer %llu: %lld bytes charged for a %lld-byte shape",
		                  (unsigned long long)handle, (long long)bytes,
		                  (long long)shape_bytes(shape));
	if (bytes == 0)
		bytes = shape_bytes(shape);
	struct hbm_buffer *at = calloc((size_t)dev->cores_per_host, sizeof(*at));
	if (at == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	pthread_mutex_lock(&dev->lock);
	int rv = ST_OK;
	int done = 0;
	if (handle == 0 || device_find_buffer(dev, handle) != NULL) {
		rv = status_set(st, ST_ALREADY_EXISTS, "buffer handle %llu is taken",
		                (unsigned long long)handle);
		goto out;
	}
	for (; done < dev->cores_per_host; done++) {
		rv = hbm_alloc(&dev->cores[done].heap, bytes, &at[done], st);
		if (rv != ST_OK) {
			status_set(st, rv, "core %d (host %d): %s", dev->cores[done].ordinal,
			           dev->host_index, st->message);
			goto out;
		}
	}
	rv = device_add_buffer(dev, handle, shape, at, st);
out:
	if (rv != ST_OK) {
		for (int i = 0; i < done; i++)
			hbm_free(&dev->cores[i].heap, at[i]);
		free(at);
	}
	pthread_mutex_unlock(&dev->lock);
	return rv;
}

/* Finds the buffer and core for a transfer and checks the byte range. Lock held. */
static int device_locate(struct device *dev, uint64_t handle, int ordinal, int64_t offset,
                         int64_t len, struct device_buffer **buf, struct core **core,
                         struct status *st)
{
	int local = device_local(dev, ordinal);
	if (local < 0 || local >= dev->cores_per_host)
		return status_set(st, ST_INVALID_ARGUMENT, "core %d is not on host %d", ordinal,
		                  dev->host_index);
	*buf = device_find_buffer(dev, handle);
	if (*buf == NULL)
		return status_set(st, ST_NOT_FOUND, "no device buffer with handle %llu on host %d",
		                  (unsigned long long)handle, dev->host_index);
	int64_t total = shape_bytes(&(*buf)->shape);
	if (offset < 0 || len < 0 || offset > total || len > total - offset)
		return status_set(st, ST_OUT_OF_RANGE,
		                  "byte range [%lld, +%lld) is outside the %lld-byte buffer %llu",
		                  (long long)offset, (long long)len, (long long)total,
		                  (unsigned long long)handle);
	*core = &dev->cores[local];
	return ST_OK;
}

int device_write(struct device *dev, uint64_t handle, int ordinal, int64_t offset, const void *data,
                 int64_t len, struct status *st)
{
	struct device_buffer *buf = NULL; /* set when device_locate succeeds */
	struct core *core = NULL;
	pthread_mutex_lock(&dev->lock);
	int rv = device_locate(dev, handle, ordinal, offset, len, &buf, &core, st);
	if (rv == ST_OK && dev->backed && len > 0)
		memcpy((char *)hbm_ptr(&core->heap, buf->at[core->local].offset) + offset, data,
		       (size_t)len);
	pthread_mutex_unlock(&dev->lock);
	return rv;
}

int device_read(struct device *dev, struct arena *a, uint64_t handle, int ordinal, int64_t offset,
                int64_t len, void **data, int64_t *got, int64_t *total, bool *backed,
                struct status *st)
{
	struct device_buffer *buf = NULL; /* set when device_locate succeeds */
	struct core *core = NULL;
	pthread_mutex_lock(&dev->lock);
	int rv = device_locate(dev, handle, ordinal, offset, 0, &buf, &core, st);
	if (rv != ST_OK)
		goto out;
	*total = shape_bytes(&buf->shape);
	*backed = dev->backed;
	*got = *total - offset < len ? *total - offset : len;
	if (*got < 0)
		*got = 0;
	*data = NULL;
	if (!dev->backed || *got == 0)
		goto out;
	*data = arena_alloc(a, (size_t)*got);
	if (*data == NULL) {
		rv = status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		goto out;
	}
	memcpy(*data, (char *)hbm_ptr(&core->heap, buf->at[core->local].offset) + offset,
	       (size_t)*got);
out:
	pthread_mutex_unlock(&dev->lock);
	return rv;
}

int device_release(struct device *dev, const uint64_t *handles, size_t n, struct status *st)
{
	pthread_mutex_lock(&dev->lock);
	int rv = ST_OK;
	for (size_t k = 0; k < n; k++) {
		struct device_buffer *b = device_find_buffer(dev, handles[k]);
		if (b == NULL) {
			rv = status_set(st, ST_NOT_FOUND,
			                "no device buffer with handle %llu on host %d",
			                (unsigned long long)handles[k], dev->host_index);
			continue;
		}
		if (device_step_uses(dev, handles[k])) {
			rv = status_set(st, ST_FAILED_PRECONDITION,
			                "device buffer %llu is an argument of the step in flight",
			                (unsigned long long)handles[k]);
			continue;
		}
		remove_buffer(dev, b);
	}
	pthread_mutex_unlock(&dev->lock);
	return rv;
}

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void device_note_activity(struct device *dev)
{
	dev->freed_since_idle = true;
	dev->last_active_ms = now_ms();
}

/* Lock held. */
static bool idle_locked(const struct device *dev, int idle_ms)
{
	return dev->step == NULL && now_ms() - dev->last_active_ms >= idle_ms;
}

bool device_idle(struct device *dev, int idle_ms)
{
	if (dev->cores == NULL)
		return true;
	pthread_mutex_lock(&dev->lock);
	bool idle = idle_locked(dev, idle_ms);
	pthread_mutex_unlock(&dev->lock);
	return idle;
}

bool device_return_idle_memory(struct device *dev, int idle_ms)
{
	if (dev->cores == NULL)
		return false;
	pthread_mutex_lock(&dev->lock);
	bool idle = dev->freed_since_idle && idle_locked(dev, idle_ms);
	if (idle) {
		for (int c = 0; c < dev->cores_per_host; c++)
			hbm_return_free_pages(&dev->cores[c].heap);
		dev->freed_since_idle = false;
	}
	pthread_mutex_unlock(&dev->lock);
	if (idle && dev->dp != NULL)
		dp_trim(dev->dp);
	return idle;
}

int device_forget_all(struct device *dev, const char *reason, int wait_ms)
{
	if (dev->cores == NULL)
		return 0;
	device_abort(dev, 0, ST_ABORTED, reason, NULL, NULL);
	struct timespec deadline = clock_deadline_ms(wait_ms);
	pthread_mutex_lock(&dev->lock);
	while (dev->step != NULL &&
	       pthread_cond_timedwait(&dev->cv, &dev->lock, &deadline) != ETIMEDOUT)
		;
	/* The new coordinator numbers its steps afresh. */
	dev->done_step = 0;
	dev->aborted_step = 0;
	device_drop_early(dev, reason);
	int freed = 0;
	for (int i = dev->num_buffers - 1; i >= 0; i--) {
		struct device_buffer *b = &dev->buffers[i];
		if (device_step_uses(dev, b->handle))
			continue;
		remove_buffer(dev, b);
		freed++;
	}
	pthread_mutex_unlock(&dev->lock);
	return freed;
}

int device_memory_stats(struct device *dev, struct arena *a, int ordinal, Podemu__CoreMemory ***out,
                        size_t *n, struct status *st)
{
	int first = 0, count = dev->cores_per_host;
	if (ordinal >= 0) {
		first = device_local(dev, ordinal);
		if (first < 0 || first >= dev->cores_per_host)
			return status_set(st, ST_INVALID_ARGUMENT, "core %d is not on host %d",
			                  ordinal, dev->host_index);
		count = 1;
	}
	Podemu__CoreMemory **list = arena_calloc(a, (size_t)count, sizeof(*list));
	if (list == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	pthread_mutex_lock(&dev->lock);
	for (int i = 0; i < count; i++) {
		struct core *c = &dev->cores[first + i];
		struct hbm_stats s;
		hbm_get_stats(&c->heap, &s);
		Podemu__CoreMemory *m = arena_alloc(a, sizeof(*m));
		if (m == NULL) {
			pthread_mutex_unlock(&dev->lock);
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		}
		podemu__core_memory__init(m);
		m->ordinal = c->ordinal;
		m->host = dev->host_index;
		m->bytes_in_use = s.bytes_in_use;
		m->peak_bytes_in_use = s.peak_bytes_in_use;
		m->bytes_limit = s.bytes_limit;
		m->num_allocs = s.num_allocs;
		m->largest_alloc_size = s.largest_alloc_size;
		m->bytes_reserved = s.bytes_reserved;
		m->peak_bytes_reserved = s.peak_bytes_reserved;
		m->bytes_reservable_limit = s.bytes_reservable_limit;
		m->largest_free_block_bytes = s.largest_free_block_bytes;
		list[i] = m;
	}
	pthread_mutex_unlock(&dev->lock);
	*out = list;
	*n = (size_t)count;
	return ST_OK;
}
