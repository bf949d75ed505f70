/*
 * The receive slots of a step: where a chunk from a peer host waits when it cannot be read
 * straight into its place (a partial sum to combine, a copy whose receive is not open yet).
 * The data plane lets one peer host's stream hold up to window x cores_per_host chunks
 * unacknowledged (its credit), so a host needs, for every peer host its cores receive from,
 * that many slots or the chunks that peer sends it in the whole step if fewer; each core holds
 * an equal share. The peers and chunks are read off the schedules the agents run
 * (lower_collectives, host by host), so plan and agents agree.
 */
#include <stdlib.h>
#include <string.h>

#include "lower.h"
#include "topology.h"

/*
 * The slots host h needs: from each peer host, the chunks it sends h's cores in the step, at
 * most its credit (a collective of a called computation may run any number of times: the
 * credit). Raises *slot to the largest such chunk. chunks[] is scratch of a counter per host.
 */
static int64_t host_need(const Podemu__CollectiveSchedule *const *scheds, size_t n, size_t n_entry,
                         const int *repeats, int h, int cph, int64_t chunk_bytes, int64_t credit,
                         int64_t *chunks, int hosts, int64_t *slot)
{
	memset(chunks, 0, (size_t)hosts * sizeof(*chunks));
	for (size_t k = 0; k < n; k++)
		for (size_t q = 0; q < scheds[k]->n_phases; q++) {
			const Podemu__CollPhase *ph = scheds[k]->phases[q];
			int peer = ph->recv_peer < 0 ? h : ph->recv_peer / cph;
			int64_t len = ph->recv_block == NULL
			                  ? 0
			                  : ph->recv_block->row_bytes * ph->recv_block->rows;
			if (peer == h || len <= 0)
				continue;
			int64_t first = len < chunk_bytes ? len : chunk_bytes;
			*slot = first > *slot ? first : *slot;
			int64_t times = repeats != NULL ? repeats[scheds[k]->node] : 1;
			chunks[peer] =
			    (size_t)scheds[k]->node >= n_entry
			        ? credit
			        : chunks[peer] + times * ((len + chunk_bytes - 1) / chunk_bytes);
			if (chunks[peer] > credit)
				chunks[peer] = credit;
		}
	int64_t need = 0;
	for (int p = 0; p < hosts; p++)
		need += chunks[p];
	return need;
}

int lower_receive_area(struct receive_area *out, const Podemu__Graph *g, const struct shape *shapes,
                       const int *repeats, int world, int cores_per_host,
                       const char *forced_algorithm, int64_t chunk_bytes, int window,
                       struct status *st)
{
	memset(out, 0, sizeof(*out));
	int cph = cores_per_host;
	if (world <= 0 || cph <= 0 || world % cph != 0)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "receive slots: a pod of %d cores, %d per host", world, cph);
	int hosts = world / cph;
	/* Chunks between local cores stay in their sender's memory; no chunks, no slots. */
	if (hosts == 1 || chunk_bytes <= 0 || window <= 0)
		return ST_OK;
	int64_t slot = 0, most = 0, credit = (int64_t)window * cph;
	int64_t *chunks = calloc((size_t)hosts, sizeof(int64_t));
	if (chunks == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	struct arena *whole = arena_new();
	struct lowering L = {0};
	int rv = whole == NULL
	             ? status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory")
	             : lower_begin(&L, whole, g, shapes, world, cph, forced_algorithm, st);
	struct arena *a = arena_new(); /* one host's schedules at a time */
	if (rv == ST_OK && a == NULL)
		rv = status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int h = 0; h < hosts && rv == ST_OK && L.n > 0; h++) {
		Podemu__CollectiveSchedule **scheds;
		size_t n;
		arena_reset(a);
		rv = lower_host(&scheds, &n, a, &L, h, st);
		if (rv == ST_OK) {
			int64_t need = host_need((const Podemu__CollectiveSchedule *const *)scheds,
			                         n, g->n_nodes, repeats, h, cph, chunk_bytes,
			                         credit, chunks, hosts, &slot);
			most = need > most ? need : most;
		}
	}
	arena_free(a);
	lower_end(&L);
	arena_free(whole);
	free(chunks);
	if (rv != ST_OK || most == 0 || slot == 0)
		return rv;
	out->slot_bytes = (slot + HBM_ALIGNMENT - 1) / HBM_ALIGNMENT * HBM_ALIGNMENT;
	out->slots = (int)((most + cph - 1) / cph);
	return ST_OK;
}
