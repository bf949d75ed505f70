/*
 * A core's inbox from the device's side: chunks from peer agents queued for their core (or read
 * straight into a receive the core has open), and what is left of them when a step ends. The
 * core's side, which posts and takes them, is the collective executor (collectives.c).
 */
#include <stdlib.h>

#include "step.h"

void inbox_push(struct step *s, int local, struct inbox_entry *e)
{
	struct inbox_entry **tail = &s->inbox[local];
	while (*tail != NULL)
		tail = &(*tail)->next;
	e->next = NULL;
	*tail = e;
}

int coll_enqueue_remote(struct device *dev, struct step *s, struct dp_request *req,
                        const struct dp_header *h, const void *payload, struct status *st)
{
	int local = device_local(dev, (int)h->dst_ordinal);
	if (h->collective >= s->max_instances)
		return status_set(st, ST_INVALID_ARGUMENT, "step %llu has no collective %u",
		                  (unsigned long long)h->step_id, h->collective);
	if (local < 0 || local >= dev->cores_per_host ||
	    h->src_ordinal >= (uint32_t)dev->world_size)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "chunk from core %u to core %u: not a core of host %d",
		                  h->src_ordinal, h->dst_ordinal, dev->host_index);
	struct inbox_entry *e = calloc(1, sizeof(*e));
	if (e == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	e->h = *h;
	e->payload = payload;
	e->req = req;
	e->in_slot = receive_slot_read(dev, s, payload);
	for (int k = 0; k < s->posts[local].n; k++)
		if (s->posts[local].list[k].placing == req) {
			s->posts[local].list[k].placing = NULL;
			e->placed = true;
		}
	inbox_push(s, local, e);
	core_wake(&dev->cores[local]);
	return DP_PARKED;
}

void *coll_place(struct device *dev, struct step *s, struct dp_request *req,
                 const struct dp_header *h)
{
	int local = device_local(dev, (int)h->dst_ordinal);
	if (local < 0 || local >= dev->cores_per_host)
		return NULL;
	struct recv_post *p = NULL;
	for (int k = 0; k < s->posts[local].n && p == NULL; k++) {
		struct recv_post *q = &s->posts[local].list[k];
		if (q->open && h->collective == q->coll && h->src_ordinal == q->src &&
		    h->tag == q->tag)
			p = q;
	}
	int64_t off = (int64_t)h->offset, len = (int64_t)h->length;
	if (p == NULL || p->placing != NULL || len <= 0 || h->covered != h->length || off < 0 ||
	    off > p->len - len || len > s->chunk_bytes)
		return NULL;
	int64_t n;
	unsigned char *at = block_piece(p->base, p->layout, off, len, &n);
	if (n != len)
		return NULL; /* spans rows: copied by the core */
	p->placing = req;
	return at;
}

void coll_unplace(struct device *dev, struct step *s, struct dp_request *req)
{
	for (int c = 0; c < dev->cores_per_host; c++)
		for (int k = 0; k < s->posts[c].n; k++)
			if (s->posts[c].list[k].placing == req) {
				s->posts[c].list[k].placing = NULL;
				core_wake(&dev->cores[c]);
			}
}

void coll_step_cleanup(struct device *dev, struct step *s)
{
	for (int c = 0; s->inbox != NULL && c < dev->cores_per_host; c++) {
		struct inbox_entry *e = s->inbox[c];
		while (e != NULL) {
			struct inbox_entry *next = e->next;
			if (e->in_slot)
				receive_slot_put(dev, s, e->payload);
			if (e->req != NULL)
				dp_complete(e->req, ST_ABORTED, "the receiving step ended");
			free(e);
			e = next;
		}
		s->inbox[c] = NULL;
	}
}
