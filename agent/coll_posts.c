/*
 * Receives a core has open in its collective, so that the data plane reads a peer's chunk
 * straight into the output: which phases may have one, and when it opens and closes.
 */
#include <errno.h>
#include <stdlib.h>

#include "coll_run.h"

bool coll_placeable(const struct run *r, const Podemu__CollPhase *ph)
{
	return r->dev->backed && ph->kind == PODEMU__PHASE_KIND__PHASE_EXCHANGE && !ph->reduce &&
	       !ph->stage && ph->recv_peer >= 0 && !is_local(r, ph->recv_peer) &&
	       layout_len(ph->recv_block) > 0;
}

/* The bytes a layout spans in buffer base, as an address range. */
struct span {
	uintptr_t lo, hi;
};

static struct span span_of(const unsigned char *base, const Podemu__BlockLayout *l)
{
	if (base == NULL || l == NULL || layout_len(l) == 0)
		return (struct span){0, 0};
	uintptr_t lo = (uintptr_t)(base + l->offset);
	return (struct span){lo, lo + (uintptr_t)((l->rows - 1) * l->row_stride + l->row_bytes)};
}

static bool spans_meet(struct span a, struct span b)
{
	return a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi;
}

/* True when phase ph reads or writes any byte of span x. */
static bool phase_touches(const struct run *r, const Podemu__CollPhase *ph, struct span x)
{
	const unsigned char *from = send_base(r, ph);
	bool sends = ph->kind == PODEMU__PHASE_KIND__PHASE_COPY || ph->send_peer >= 0;
	bool receives = ph->kind == PODEMU__PHASE_KIND__PHASE_COPY ||
	                ph->kind == PODEMU__PHASE_KIND__PHASE_ZERO || ph->recv_peer >= 0;
	return (sends && spans_meet(span_of(from, ph->send_block), x)) ||
	       (receives && spans_meet(span_of(recv_base(r, ph), ph->recv_block), x)) ||
	       (ph->kind == PODEMU__PHASE_KIND__PHASE_COMBINE &&
	        spans_meet(span_of(r->in, ph->combine_block), x));
}

static void set_post(struct run *r, int k, const Podemu__CollPhase *ph, uint32_t tag)
{
	r->receives[k] = (struct recv_post){.open = true,
	                                    .coll = r->coll,
	                                    .src = (uint32_t)ph->recv_peer,
	                                    .tag = tag,
	                                    .base = recv_base(r, ph),
	                                    .layout = ph->recv_block,
	                                    .len = layout_len(ph->recv_block)};
}

void coll_open_early_posts(struct run *r, const Podemu__CollectiveSchedule *sched)
{
	uint32_t *tags = calloc((size_t)r->dev->world_size, sizeof(uint32_t));
	if (tags == NULL)
		return;
	pthread_mutex_lock(&r->dev->lock);
	r->s->posts[r->c->local] = (struct recv_posts){r->receives, (int)sched->n_phases};
	for (size_t k = 0; k < sched->n_phases; k++) {
		const Podemu__CollPhase *ph = sched->phases[k];
		if (ph->kind != PODEMU__PHASE_KIND__PHASE_EXCHANGE &&
		    ph->kind != PODEMU__PHASE_KIND__PHASE_COMBINE)
			continue;
		if (ph->recv_peer < 0 || layout_len(ph->recv_block) == 0)
			continue;
		uint32_t tag = tags[ph->recv_peer]++;
		if (!coll_placeable(r, ph))
			continue;
		struct span x = span_of(recv_base(r, ph), ph->recv_block);
		bool free_before = true;
		for (size_t q = 0; q < k && free_before; q++)
			free_before = !phase_touches(r, sched->phases[q], x);
		if (free_before)
			set_post(r, (int)k, ph, tag);
	}
	pthread_mutex_unlock(&r->dev->lock);
	free(tags);
}

void coll_open_post(struct run *r, int k, const Podemu__CollPhase *ph, uint32_t tag)
{
	pthread_mutex_lock(&r->dev->lock);
	if (!r->receives[k].open)
		set_post(r, k, ph, tag);
	pthread_mutex_unlock(&r->dev->lock);
}

void coll_close_post(struct run *r, int k, bool failed)
{
	struct device *dev = r->dev;
	struct recv_post *p = &r->receives[k];
	bool cancelled = false;
	pthread_mutex_lock(&dev->lock);
	p->open = false;
	while (p->placing != NULL) {
		if (!cancelled && (failed || r->s->cancel_code != ST_OK)) {
			dp_request_cancel(p->placing);
			cancelled = true;
		}
		if (coll_wait(r) == ETIMEDOUT)
			failed = true;
	}
	pthread_mutex_unlock(&dev->lock);
}
