#include "memplan.h"

#include <string.h>

#include "assign.h"
#include "hlo_collective.h"
#include "topology.h"
#include "verify.h"

#define DEFAULT_CHUNK_BYTES (4 << 20)
#define DEFAULT_WINDOW 4

/*
 * The receive slots (hlo_receive_area) live as long as the program: at the top of the
 * reservation, so every instruction's live bytes carry them.
 */
static int plan_receive_slots(struct memplan *p, const struct hlo_module *m,
                              const struct topology *topo, const struct memplan_options *o,
                              struct status *st)
{
	struct receive_area ra;
	int rv = hlo_receive_area(&ra, m, p->world_size, topo->cores_per_host,
	                          o->collective_algorithm, o->chunk_bytes, o->window, st);
	if (rv != ST_OK || ra.slots == 0)
		return rv;
	int64_t align = o->alignment, before = p->temp_bytes;
	p->receive_offset = layout_add(before, align - 1) / align * align;
	p->receive_slots = ra.slots;
	p->receive_slot_bytes = ra.slot_bytes;
	p->receive_bytes = ra.slot_bytes * ra.slots; /* at most 64 MiB x window x hosts */
	p->temp_bytes = layout_add(p->receive_offset, p->receive_bytes);
	for (int k = 0; k < p->n_instructions; k++)
		p->live[k] = layout_add(p->live[k], p->temp_bytes - before);
	return ST_OK;
}

int memplan_build(struct memplan *out, struct hlo_module *m, const struct topology *topo,
                  const struct memplan_options *o, struct arena *a, struct status *st)
{
	memset(out, 0, sizeof(*out));
	const struct hlo_computation *c = m->entry;
	out->world_size = topology_world_size(topo);
	out->cores_per_host = topo->cores_per_host;
	out->all_gather = o->all_gather;
	out->no_alias = o->no_alias;
	out->capacity = topology_bytes_limit(topo);
	out->combine_threshold_bytes = o->combine_threshold_bytes;
	struct memplan_options opts = *o;
	if (opts.chunk_bytes <= 0)
		opts.chunk_bytes = DEFAULT_CHUNK_BYTES;
	if (opts.window <= 0)
		opts.window = DEFAULT_WINDOW;
	if (opts.alignment <= 0)
		opts.alignment = HBM_ALIGNMENT;
	struct builder b = {.p = out, .a = a, .o = &opts, .m = m, .st = st};
	b.callees = arena_calloc(a, (size_t)m->n_computations + 1, sizeof(*b.callees));
	out->comps = arena_calloc(a, (size_t)m->n_computations + 1, sizeof(*out->comps));
	if (b.callees == NULL || out->comps == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	int rv = verify_module(m, out->world_size, st);
	if (rv != ST_OK)
		return rv;
	rv = strategy_lower(m, o->all_gather, !o->no_alias, out->world_size, &out->n_rewritten, a,
	                    st);
	if (rv != ST_OK)
		return rv;
	struct comp_result res;
	if ((rv = assign_computation(&b, c, true, 0, &res)) != ST_OK)
		return rv;
	out->n_instructions = res.n;
	out->live = res.live;
	out->peak_at = res.peak_at;
	out->peak_scratch = res.peak_scratch;
	out->peak_name = c->instructions[res.order[res.peak_at]]->name;
	for (int k = 0; k < out->n_buffers; k++) {
		const struct plan_buffer *buf = &out->buffers[k];
		out->other_space_bytes = layout_add(out->other_space_bytes, buf->other_space_bytes);
		if (buf->comp != c)
			continue;
		int64_t *sum = buf->kind == BUF_ARGUMENT   ? &out->argument_bytes
		               : buf->kind == BUF_OUTPUT   ? &out->output_bytes
		               : buf->kind == BUF_CONSTANT ? &out->constant_bytes
		                                           : &out->temp_bytes;
		*sum = layout_add(*sum, buf->bytes);
	}
	/* The temporaries are the heap; the constants were counted among them. */
	out->temp_bytes = res.heap;
	if ((rv = plan_receive_slots(out, m, topo, &opts, st)) != ST_OK)
		return rv;
	out->peak_bytes = layout_add(
	    layout_add(out->argument_bytes, out->output_bytes - out->alias_bytes), out->temp_bytes);
	if ((rv = assign_peak_set(&b, c, &res, &out->peak_live, &out->n_peak_live)) != ST_OK)
		return rv;
	for (int k = 0; k < out->n_peak_live; k++) {
		const struct plan_buffer *buf = &out->buffers[out->peak_live[k]];
		out->padding_bytes =
		    layout_add(out->padding_bytes, buf->bytes - buf->unpadded_bytes);
	}
	out->n_warnings = m->n_warnings;
	out->warnings = m->warnings;
	out->fits = out->peak_bytes <= out->capacity;
	return ST_OK;
}
