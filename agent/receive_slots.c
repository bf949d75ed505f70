/*
 * A step's receive slots on one host: where a chunk from a peer host waits when it cannot be
 * read straight into its place (a partial sum to combine, a copy whose receive is not open
 * yet, rows the core gathers itself). Each core gives its share, at the top of its
 * reservation where the plan put it (compiler/memplan.h), so the bytes are accounted HBM; any
 * core's chunk may take any free slot of the host. A chunk that finds none is read into the
 * data plane's own memory and counted: the plan was short.
 */
#include <errno.h>
#include <stdlib.h>

#include "step.h"

/* Per core: far more than a window of chunks from every peer host of the largest pod. */
#define RECEIVE_SLOTS_MAX 65536

int receive_slots_check(const Podemu__Program *p, struct status *st)
{
	if (p->receive_slots == 0)
		return ST_OK;
	bool ok = p->receive_slots > 0 && p->receive_slots <= RECEIVE_SLOTS_MAX &&
	          p->receive_slot_bytes > 0 && p->receive_slot_bytes <= (64 << 20) &&
	          p->receive_offset >= 0 && p->receive_offset <= p->temp_bytes &&
	          p->receive_slots <= (p->temp_bytes - p->receive_offset) / p->receive_slot_bytes;
	if (!ok)
		return status_set(
		    st, ST_INVALID_ARGUMENT,
		    "program: %d receive slots of %lld bytes at offset %lld do not lie "
		    "in its reservation of %lld bytes",
		    p->receive_slots, (long long)p->receive_slot_bytes,
		    (long long)p->receive_offset, (long long)p->temp_bytes);
	return ST_OK;
}

int receive_slots_init(struct device *dev, struct step *s, struct status *st)
{
	struct receive_slots *r = &s->receive;
	const Podemu__Program *p = s->prog;
	int cores = dev->cores_per_host;
	if (!dev->backed || p->receive_slots == 0)
		return ST_OK;
	r->per_core = p->receive_slots;
	r->n = r->per_core * cores;
	r->bytes = p->receive_slot_bytes;
	r->base = arena_calloc(s->arena, (size_t)cores, sizeof(*r->base));
	r->free_list = arena_calloc(s->arena, (size_t)r->n, sizeof(int));
	r->reading = arena_calloc(s->arena, (size_t)r->n, sizeof(*r->reading));
	if (r->base == NULL || r->free_list == NULL || r->reading == NULL) {
		r->n = 0;
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	}
	for (int c = 0; c < cores; c++)
		r->base[c] = hbm_ptr(&dev->cores[c].heap, p->receive_offset);
	/* Taken from the top of the list: core by core, so one core's share fills first. */
	for (int k = 0; k < r->n; k++)
		r->free_list[k] = r->n - 1 - k;
	r->n_free = r->n;
	return ST_OK;
}

/* The slot whose bytes start at p, or -1. */
static int slot_at(const struct receive_slots *r, const void *p, int cores)
{
	const unsigned char *at = p;
	for (int c = 0; r->n > 0 && c < cores; c++) {
		const unsigned char *base = r->base[c];
		if (at >= base && at < base + (int64_t)r->per_core * r->bytes &&
		    (at - base) % r->bytes == 0)
			return c * r->per_core + (int)((at - base) / r->bytes);
	}
	return -1;
}

void *receive_slot_take(struct step *s, struct dp_request *req, int64_t len)
{
	struct receive_slots *r = &s->receive;
	if (len <= 0)
		return NULL;
	if (r->n_free == 0 || len > r->bytes) {
		r->outside++;
		return NULL;
	}
	int k = r->free_list[--r->n_free];
	r->reading[k] = req;
	if (r->n - r->n_free > r->peak)
		r->peak = r->n - r->n_free;
	return r->base[k / r->per_core] + (int64_t)(k % r->per_core) * r->bytes;
}

bool receive_slot_read(struct device *dev, struct step *s, const void *payload)
{
	int k = slot_at(&s->receive, payload, dev->cores_per_host);
	if (k >= 0)
		s->receive.reading[k] = NULL;
	return k >= 0;
}

void receive_slot_put(struct device *dev, struct step *s, const void *payload)
{
	struct receive_slots *r = &s->receive;
	int k = slot_at(r, payload, dev->cores_per_host);
	if (k < 0)
		return;
	if (r->reading[k] != NULL) {
		r->reading[k] = NULL;
		pthread_cond_broadcast(&dev->cv); /* receive_slots_drain */
	}
	r->free_list[r->n_free++] = k;
}

void receive_slots_drain(struct device *dev, struct step *s)
{
	struct receive_slots *r = &s->receive;
	for (;;) {
		bool reading = false;
		for (int k = 0; k < r->n; k++)
			if (r->reading[k] != NULL) {
				/* Its stream closes: the read ends and unplaces it. */
				dp_request_cancel(r->reading[k]);
				reading = true;
			}
		if (!reading)
			return;
		struct timespec deadline;
		clock_gettime(CLOCK_REALTIME, &deadline);
		deadline.tv_nsec += 100 * 1000 * 1000;
		if (deadline.tv_nsec >= 1000000000) {
			deadline.tv_sec++;
			deadline.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&dev->cv, &dev->lock, &deadline);
	}
}
