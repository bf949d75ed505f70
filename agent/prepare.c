/*
 * Preparing a step on one host: the compiled program checked against what this host has (its
 * buffers, donors, assignments, schedules, the reservation), then every core's outputs and
 * temporaries allocated, all or none.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusion.h"
#include "graph.h"
#include "log.h"
#include "lower.h"
#include "step.h"

#define DEFAULT_COLLECTIVE_TIMEOUT_MS 120000
#define DEFAULT_CHUNK_BYTES (4 * 1024 * 1024)

/*
 * An output written into a donated parameter's device buffer: the donor is a parameter node of
 * this program, given to this output only, and its buffer holds the output's bytes.
 */
static int check_donor(struct device *dev, struct step *s, size_t i, struct status *st)
{
	const Podemu__BufferAssignment *b = s->prog->buffers[i];
	size_t d = (size_t)b->donor - 1;
	if (b->donor < 0 || d >= s->n_entry || s->ops[d] != OP_PARAMETER ||
	    s->prog->buffers[d]->kind != PODEMU__BUFFER_KIND__BUFFER_PARAMETER)
		return status_set(st, ST_INVALID_ARGUMENT, "node %zu: donor %d is not a parameter",
		                  i, b->donor - 1);
	for (size_t j = 0; j < i; j++)
		if (s->prog->buffers[j]->kind == PODEMU__BUFFER_KIND__BUFFER_OUTPUT &&
		    s->prog->buffers[j]->donor == b->donor)
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "nodes %zu and %zu take the same donated buffer", j, i);
	struct device_buffer *db = device_find_buffer(dev, s->prog->buffers[d]->handle);
	if (db == NULL || shape_bytes(&db->shape) < shape_bytes(&s->shapes[i]))
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "node %zu: the donated buffer cannot hold the output", i);
	return ST_OK;
}

/* Checks one node's buffer assignment against the graph and the host's buffers. */
static int check_assignment(struct device *dev, struct step *s, size_t i, struct status *st)
{
	const Podemu__BufferAssignment *b = s->prog->buffers[i];
	const struct shape *shape = &s->shapes[i];
	enum opcode op = s->ops[i];
	int64_t bytes = shape_bytes(shape);
	switch (b->kind) {
	case PODEMU__BUFFER_KIND__BUFFER_PARAMETER: {
		if (op != OP_PARAMETER)
			break;
		struct device_buffer *db = device_find_buffer(dev, b->handle);
		if (db == NULL)
			return status_set(st, ST_NOT_FOUND,
			                  "parameter (node %zu): no device buffer with handle %llu "
			                  "on host %d",
			                  i, (unsigned long long)b->handle, dev->host_index);
		if (!shape_equal(&db->shape, shape)) {
			char sa[128], sb[128];
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "parameter (node %zu): buffer %llu is %s, not %s", i,
			                  (unsigned long long)b->handle,
			                  shape_format(sa, sizeof(sa), &db->shape),
			                  shape_format(sb, sizeof(sb), shape));
		}
		return ST_OK;
	}
	case PODEMU__BUFFER_KIND__BUFFER_OUTPUT:
		/* An element of a while, conditional or call the client holds is its own. */
		if (op == OP_PARAMETER || op == OP_OPT_BARRIER || op == OP_TUPLE ||
		    (step_has_elements(s, (int)i) && shape->tuple) ||
		    (op == OP_GET_TUPLE_ELEMENT &&
		     !step_has_elements(s, step_operand(s, (int)i, 0))))
			break;
		if (b->handle == 0 || device_find_buffer(dev, b->handle) != NULL)
			return status_set(st, ST_ALREADY_EXISTS,
			                  "node %zu: output handle %llu is taken", i,
			                  (unsigned long long)b->handle);
		if (b->bytes < bytes)
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "node %zu: output of %lld bytes charged %lld", i,
			                  (long long)bytes, (long long)b->bytes);
		return b->donor == 0 ? ST_OK : check_donor(dev, s, i, st);
	case PODEMU__BUFFER_KIND__BUFFER_TEMP:
		if (op == OP_PARAMETER || op == OP_OPT_BARRIER || op == OP_GET_TUPLE_ELEMENT ||
		    op == OP_TUPLE || opcode_is_control_flow(op))
			break;
		if (b->offset < 0 || b->offset > s->prog->temp_bytes ||
		    bytes > s->prog->temp_bytes - b->offset)
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "node %zu: temporary [%lld, +%lld) is outside the "
			                  "%lld-byte reservation",
			                  i, (long long)b->offset, (long long)bytes,
			                  (long long)s->prog->temp_bytes);
		return ST_OK;
	case PODEMU__BUFFER_KIND__BUFFER_ALIAS:
		if (op == OP_GET_TUPLE_ELEMENT && b->alias_of >= 0 && (size_t)b->alias_of < i)
			return ST_OK;
		/*
		 * A value computed into a later output's buffer, which works on it in place: the
		 * output exists before the step runs and is at least as large.
		 */
		if (op != OP_PARAMETER && op != OP_OPT_BARRIER && op != OP_GET_TUPLE_ELEMENT &&
		    b->alias_of >= 0 && (size_t)b->alias_of > i &&
		    (size_t)b->alias_of < s->n_entry &&
		    s->prog->buffers[b->alias_of]->kind == PODEMU__BUFFER_KIND__BUFFER_OUTPUT &&
		    s->prog->buffers[b->alias_of]->bytes >= bytes)
			return ST_OK;
		break;
	case PODEMU__BUFFER_KIND__BUFFER_NONE: /* elements of control flow: control_check */
		if (op != OP_OPT_BARRIER && op != OP_TUPLE && !step_has_elements(s, (int)i))
			break;
		return ST_OK;
	case PODEMU__BUFFER_KIND__BUFFER_OTHER_SPACE:
		if (op == OP_PARAMETER || op == OP_OPT_BARRIER || op == OP_GET_TUPLE_ELEMENT ||
		    opcode_is_collective(op))
			break;
		return ST_OK;
	case PODEMU__BUFFER_KIND__BUFFER_FUSED:
		if (s->prog->n_fused_into == 0 || s->prog->fused_into[i] == -1)
			break;
		return ST_OK;
	default:
		break;
	}
	return status_set(st, ST_INVALID_ARGUMENT, "node %zu (%s): invalid buffer assignment", i,
	                  opcode_name(op));
}

/* Checks that a layout stays inside a buffer of `bytes` bytes. */
static bool layout_fits(const Podemu__BlockLayout *l, int64_t bytes)
{
	if (l == NULL)
		return false;
	if (l->rows == 0 || l->row_bytes == 0)
		return l->rows >= 0 && l->row_bytes >= 0; /* empty: nothing is touched */
	if (l->offset < 0 || l->row_bytes < 0 || l->rows < 0 || l->row_stride < l->row_bytes)
		return false;
	int64_t span;
	if (!mul_overflow_i64(l->rows - 1, l->row_stride, &span) || span > bytes)
		return false;
	return l->offset <= bytes - span && l->row_bytes <= bytes - span - l->offset;
}

/* Checks a collective schedule: peers, and every block inside its buffer. */
static int check_schedule(struct device *dev, struct step *s, const Podemu__CollectiveSchedule *cs,
                          struct status *st)
{
	const Podemu__Node *n = s->node_of[cs->node];
	const struct shape *in = &s->shapes[step_operand(s, cs->node, 0)],
	                   *out = &s->shapes[cs->node];
	int64_t in_bytes = shape_bytes(in), out_bytes = shape_bytes(out);
	int64_t work_bytes = lower_node_workspace(n, cs->group_size, in, out, s->chunk_bytes,
	                                          s->window, cs->algorithm)
	                         .work;
	for (size_t k = 0; k < cs->n_phases; k++) {
		const Podemu__CollPhase *ph = cs->phases[k];
		int64_t src_bytes = ph->send_buffer == PODEMU__COLL_BUFFER__COLL_INPUT  ? in_bytes
		                    : ph->send_buffer == PODEMU__COLL_BUFFER__COLL_WORK ? work_bytes
		                                                                        : out_bytes;
		bool ok = ph->send_peer >= -1 && ph->send_peer < dev->world_size &&
		          ph->recv_peer >= -1 && ph->recv_peer < dev->world_size &&
		          ph->send_peer != cs->ordinal && ph->recv_peer != cs->ordinal;
		bool local = ph->kind == PODEMU__PHASE_KIND__PHASE_COPY ||
		             ph->kind == PODEMU__PHASE_KIND__PHASE_ZERO;
		bool sends =
		    ph->kind == PODEMU__PHASE_KIND__PHASE_COPY || (!local && ph->send_peer >= 0);
		bool recvs = local || ph->recv_peer >= 0;
		if (sends)
			ok = ok && layout_fits(ph->send_block, src_bytes);
		if (recvs)
			ok = ok &&
			     layout_fits(ph->recv_block, ph->recv_work ? work_bytes : out_bytes);
		if (ok && ph->kind == PODEMU__PHASE_KIND__PHASE_COPY)
			ok = layout_len(ph->send_block) == layout_len(ph->recv_block);
		if (ok && ph->kind == PODEMU__PHASE_KIND__PHASE_COMBINE && recvs)
			ok = layout_fits(ph->combine_block, in_bytes) &&
			     layout_len(ph->combine_block) == layout_len(ph->recv_block);
		if (!ok)
			return status_set(
			    st, ST_INVALID_ARGUMENT,
			    "%s (node %d): phase %zu of core %d's schedule is invalid", n->opcode,
			    cs->node, k, cs->ordinal);
	}
	return ST_OK;
}

/* Copies the program into the step's arena and checks everything that is not heap state. */
static int step_build(struct device *dev, struct step *s, const Podemu__Program *prog,
                      struct status *st)
{
	size_t len = podemu__program__get_packed_size(prog);
	uint8_t *buf = malloc(len ? len : 1);
	if (buf == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	podemu__program__pack(prog, buf);
	s->prog = podemu__program__unpack(arena_protobuf_allocator(s->arena), len, buf);
	free(buf);
	if (s->prog == NULL || s->prog->graph == NULL)
		return status_set(st, ST_INVALID_ARGUMENT, "malformed program");
	Podemu__Program *p = s->prog;
	size_t n_entry = p->graph->n_nodes, n = graph_total_nodes(p->graph);
	s->n_entry = n_entry;
	s->n_total = n;
	if (p->world_size != dev->world_size || p->cores_per_host != dev->cores_per_host ||
	    p->n_peer_data_urls != (size_t)dev->num_hosts)
		return status_set(st, ST_FAILED_PRECONDITION,
		                  "program was compiled for %d cores (%d per host, %zu hosts) but "
		                  "this pod has %d (%d per host, %d hosts)",
		                  p->world_size, p->cores_per_host, p->n_peer_data_urls,
		                  dev->world_size, dev->cores_per_host, dev->num_hosts);
	if (p->n_buffers != n || p->temp_bytes < 0)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "program has %zu buffer assignments for %zu nodes", p->n_buffers,
		                  n);
	if (p->n_source_nodes != 0 && p->n_source_nodes != n_entry)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "program has %zu source node indices for %zu nodes",
		                  p->n_source_nodes, n_entry);
	for (size_t i = 0; i < p->n_source_nodes; i++)
		if (p->source_nodes[i] < 0 || (size_t)p->source_nodes[i] >= n_entry)
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "program: source node %d of node %zu is out of range",
			                  p->source_nodes[i], i);
	s->id = p->step_id;
	s->timeout_ms = p->collective_timeout_ms > 0 && p->collective_timeout_ms < 86400000
	                    ? (int)p->collective_timeout_ms
	                    : DEFAULT_COLLECTIVE_TIMEOUT_MS;
	s->chunk_bytes =
	    p->chunk_bytes > 0 && p->chunk_bytes <= (64 << 20) && p->chunk_bytes % 64 == 0
	        ? p->chunk_bytes
	        : DEFAULT_CHUNK_BYTES;
	s->shapes = arena_calloc(s->arena, n, sizeof(*s->shapes));
	s->ops = arena_calloc(s->arena, n, sizeof(*s->ops));
	s->coll_of_node = arena_calloc(s->arena, n, sizeof(int));
	s->core_status = arena_calloc(s->arena, (size_t)dev->cores_per_host, sizeof(struct status));
	s->position = arena_calloc(s->arena, (size_t)dev->cores_per_host, sizeof(int));
	if (!s->shapes || !s->ops || !s->coll_of_node || !s->core_status || !s->position)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int c = 0; c < dev->cores_per_host; c++)
		s->position[c] = CORE_COMPUTING;
	s->failed_core = -1;
	int rv = graph_check(p->graph, dev->world_size, s->shapes, s->arena, st);
	if (rv != ST_OK)
		return rv;
	s->node_of = arena_calloc(s->arena, n + 1, sizeof(*s->node_of));
	s->base_of = arena_calloc(s->arena, n + 1, sizeof(int));
	s->comp_of = arena_calloc(s->arena, n + 1, sizeof(int));
	int *first = s->comp_first = graph_first_ids(p->graph, s->arena);
	bool loops = false;
	if (!s->node_of || !s->base_of || !s->comp_of || !first)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (size_t i = 0; i < n; i++) {
		s->node_of[i] = graph_node_at(p->graph, first, (int)i, &s->comp_of[i]);
		s->base_of[i] = s->comp_of[i] < 0 ? 0 : first[s->comp_of[i]];
		s->ops[i] = opcode_parse(s->node_of[i]->opcode);
		if (p->buffers[i] == NULL)
			return status_set(st, ST_INVALID_ARGUMENT, "node %zu has no buffer", i);
		if (opcode_is_collective(s->ops[i]))
			s->coll_of_node[i] = s->num_colls++;
		/* A collective in a called computation may run any number of times. */
		loops |= opcode_is_collective(s->ops[i]) && i >= n_entry;
	}
	s->max_instances = loops ? UINT32_MAX : (uint32_t)s->num_colls;
	if ((rv = fusion_check(s->node_of, s->base_of, n, s->shapes, s->ops, p->fused_into,
	                       p->n_fused_into, st)) != ST_OK)
		return rv;
	if ((rv = control_check(dev, s, st)) != ST_OK)
		return rv;
	s->fusion_next = arena_calloc(s->arena, n + 1, sizeof(int));
	s->fusion_head = arena_calloc(s->arena, n + 1, sizeof(int));
	if (!s->fusion_next || !s->fusion_head)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (size_t i = 0; i < n; i++)
		s->fusion_head[i] = -1;
	for (size_t i = n; i-- > 0;) /* members of each fusion, in program order */
		if (p->n_fused_into && p->fused_into[i] != -1) {
			s->fusion_next[i] = s->fusion_head[p->fused_into[i]];
			s->fusion_head[p->fused_into[i]] = (int)i;
		}
	if ((rv = receive_slots_check(p, st)) != ST_OK)
		return rv;
	s->window = p->window > 0 && p->window <= 64 ? p->window : 4;
	/* Each core of a peer host sends us at most a window of chunks at a time. */
	if (dev->dp != NULL)
		dp_set_credit(dev->dp, s->window * dev->cores_per_host,
		              (uint64_t)s->window * (uint64_t)dev->cores_per_host *
		                  (uint64_t)s->chunk_bytes);
	s->inbox = arena_calloc(s->arena, (size_t)dev->cores_per_host, sizeof(*s->inbox));
	s->posts = arena_calloc(s->arena, (size_t)dev->cores_per_host, sizeof(*s->posts));
	s->micros = arena_calloc(s->arena, (size_t)dev->cores_per_host * (size_t)(s->num_colls + 1),
	                         sizeof(int64_t));
	size_t per_core_coll = (size_t)dev->cores_per_host * (size_t)(s->num_colls + 1);
	s->started_micros = arena_calloc(s->arena, per_core_coll, sizeof(int64_t));
	s->ended_micros = arena_calloc(s->arena, per_core_coll, sizeof(int64_t));
	s->sched = arena_calloc(s->arena, (size_t)dev->cores_per_host, sizeof(*s->sched));
	if (!s->inbox || !s->posts || !s->micros || !s->started_micros || !s->ended_micros ||
	    !s->sched)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int c = 0; c < dev->cores_per_host; c++)
		if ((s->sched[c] = arena_calloc(s->arena, n, sizeof(**s->sched))) == NULL)
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	/* This host's cores' schedules, from the collectives' parameters in the program. */
	Podemu__CollectiveSchedule **scheds;
	size_t n_scheds;
	rv = lower_collectives(&scheds, &n_scheds, s->arena, p->graph, s->shapes, dev->world_size,
	                       dev->cores_per_host, dev->host_index, p->collective_algorithm, st);
	if (rv != ST_OK)
		return rv;
	for (size_t k = 0; k < n_scheds; k++) {
		const Podemu__CollectiveSchedule *cs = scheds[k];
		int local = device_local(dev, cs->ordinal);
		if (local < 0 || local >= dev->cores_per_host || cs->node < 0 ||
		    (size_t)cs->node >= n || !opcode_is_collective(s->ops[cs->node]))
			return status_set(
			    st, ST_INVALID_ARGUMENT,
			    "schedule %zu names core %d / node %d, not a collective of "
			    "this host",
			    k, cs->ordinal, cs->node);
		rv = check_schedule(dev, s, cs, st);
		if (rv != ST_OK)
			return rv;
		s->sched[local][cs->node] = cs;
	}
	return ST_OK;
}

/* Allocates outputs and the reservation on every core; all or nothing. Lock held. */
/*
 * A value outside HBM (memory space S(n)): host memory of the step's own, freed with it and
 * charged to no core's heap, as XLA keeps such buffers out of HBM.
 */
static int place_elsewhere(struct step *s, int c, size_t i, int cores, size_t n, struct status *st)
{
	if (s->elsewhere == NULL &&
	    (s->elsewhere = arena_calloc(s->arena, (size_t)cores, sizeof(void **))) == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	if (s->elsewhere[c] == NULL &&
	    (s->elsewhere[c] = arena_calloc(s->arena, n, sizeof(void *))) == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	int64_t bytes = shape_bytes(&s->shapes[i]);
	s->elsewhere[c][i] = arena_calloc(s->arena, 1, (size_t)bytes + 1);
	if (s->elsewhere[c][i] == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED,
		                  "node %zu: out of host memory for %lld bytes outside HBM", i,
		                  (long long)bytes);
	return ST_OK;
}

/* The machine's available memory in bytes (MemAvailable), or -1 when it cannot be read. */
static int64_t host_memory_available(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	if (f == NULL)
		return -1;
	char line[128];
	long long kib = -1;
	while (kib < 0 && fgets(line, sizeof(line), f) != NULL)
		if (sscanf(line, "MemAvailable: %lld kB", &kib) != 1)
			kib = -1;
	fclose(f);
	return kib >= 0 ? (int64_t)kib * 1024 : -1;
}

/* Steps that write less than this on a host are not checked: reading the figure costs more. */
#define HOST_MEMORY_CHECK_BYTES ((int64_t)256 << 20)

/*
 * With --backing host, a step's bytes are the machine's memory: what it writes on this host's
 * cores (their temporaries and new outputs) must fit in what the machine has available (and
 * the freed pages its heaps keep), or its first touches would push the machine into reclaim,
 * and every process on it, heartbeats included, would stall until hosts are declared lost.
 */
static int check_host_memory(const struct device *dev, const Podemu__Program *p, struct status *st)
{
	if (!dev->backed)
		return ST_OK;
	int64_t per_core = p->temp_bytes, need, kept = 0;
	for (size_t i = 0; i < p->n_buffers; i++) {
		const Podemu__BufferAssignment *b = p->buffers[i];
		if (b->kind == PODEMU__BUFFER_KIND__BUFFER_OUTPUT && b->donor == 0 &&
		    __builtin_add_overflow(per_core, b->bytes, &per_core))
			per_core = INT64_MAX;
	}
	if (__builtin_mul_overflow(per_core, (int64_t)dev->cores_per_host, &need))
		need = INT64_MAX;
	if (need < HOST_MEMORY_CHECK_BYTES)
		return ST_OK;
	int64_t available = host_memory_available();
	for (int c = 0; c < dev->cores_per_host; c++)
		kept += dev->cores[c].heap.retained;
	if (available < 0 || need <= available + kept)
		return ST_OK;
	char need_text[16], available_text[16];
	return status_set(st, ST_RESOURCE_EXHAUSTED,
	                  "host memory: this step writes %s on host %d's %d cores, and with "
	                  "--backing host every byte is stored, but the machine has %s available. "
	                  "Run the pod with --backing none to account for memory at this scale "
	                  "without storing the bytes",
	                  status_human_bytes(need_text, need), dev->host_index, dev->cores_per_host,
	                  status_human_bytes(available_text, available));
}

static int step_allocate(struct device *dev, struct step *s, struct status *st)
{
	Podemu__Program *p = s->prog;
	size_t n = p->graph->n_nodes;
	s->at = arena_calloc(s->arena, (size_t)dev->cores_per_host, sizeof(*s->at));
	if (s->at == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int c = 0; c < dev->cores_per_host; c++) {
		s->at[c] = arena_calloc(s->arena, n, sizeof(**s->at));
		if (s->at[c] == NULL)
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		for (size_t i = 0; i < n; i++)
			s->at[c][i] = HBM_NO_BUFFER;
	}
	int rv = ST_OK;
	for (int c = 0; c < dev->cores_per_host && dev->backed; c++)
		for (size_t i = 0; i < n; i++)
			if (p->buffers[i]->kind == PODEMU__BUFFER_KIND__BUFFER_OTHER_SPACE &&
			    (rv = place_elsewhere(s, c, i, dev->cores_per_host, n, st)) != ST_OK)
				return rv;
	for (int c = 0; c < dev->cores_per_host && rv == ST_OK; c++) {
		struct core *core = &dev->cores[c];
		for (size_t i = 0; i < n && rv == ST_OK; i++) {
			const Podemu__BufferAssignment *b = p->buffers[i];
			if (b->kind == PODEMU__BUFFER_KIND__BUFFER_OUTPUT && b->donor != 0)
				s->at[c][i] =
				    device_find_buffer(dev, p->buffers[b->donor - 1]->handle)
				        ->at[c];
			else if (b->kind == PODEMU__BUFFER_KIND__BUFFER_OUTPUT)
				rv = hbm_alloc(&core->heap, b->bytes, &s->at[c][i], st);
		}
		if (rv == ST_OK)
			rv = hbm_reserve_bottom(&core->heap, p->temp_bytes, st);
		if (rv != ST_OK)
			status_set(st, rv, "core %d (host %d): %s", core->ordinal, dev->host_index,
			           st->message);
	}
	if (rv != ST_OK) {
		step_free_outputs(dev, s);
		for (int c = 0; c < dev->cores_per_host; c++)
			hbm_release_reservation(&dev->cores[c].heap);
		return rv;
	}
	for (int c = 0; c < dev->cores_per_host; c++) {
		for (size_t i = 0; i < n; i++) {
			const Podemu__BufferAssignment *b = p->buffers[i];
			if (b->kind == PODEMU__BUFFER_KIND__BUFFER_PARAMETER)
				s->at[c][i] = device_find_buffer(dev, b->handle)->at[c];
			else if (b->kind == PODEMU__BUFFER_KIND__BUFFER_TEMP)
				s->at[c][i] = (struct hbm_buffer){.offset = b->offset};
			else if (b->kind == PODEMU__BUFFER_KIND__BUFFER_ALIAS)
				s->at[c][i] = s->at[c][b->alias_of];
		}
	}
	return ST_OK;
}

/*
 * Connects, all at once, to the peer hosts this host's cores send to in the step (a stream is
 * kept per peer across steps): else each core dials its peers one by one as it reaches them.
 */
static void connect_peers(struct device *dev, struct step *s, const Podemu__Program *prog)
{
	if (dev->dp == NULL)
		return;
	bool *want = calloc((size_t)dev->num_hosts, sizeof(bool));
	const char **urls = calloc((size_t)dev->num_hosts, sizeof(char *));
	int n = 0;
	for (int c = 0; want != NULL && urls != NULL && c < dev->cores_per_host; c++)
		for (size_t i = 0; i < s->n_total; i++) {
			const Podemu__CollectiveSchedule *cs = s->sched[c][i];
			for (size_t k = 0; cs != NULL && k < cs->n_phases; k++) {
				int peer = cs->phases[k]->send_peer;
				int h = peer >= 0 ? peer / dev->cores_per_host : -1;
				if (h >= 0 && h != dev->host_index && !want[h]) {
					want[h] = true;
					urls[n++] = prog->peer_data_urls[h];
				}
			}
		}
	if (n > 0)
		dp_connect(dev->dp, urls, n, 3000);
	free(urls);
	free(want);
}

int device_prepare(struct device *dev, const Podemu__Program *prog, struct status *st)
{
	struct step *s = NULL;
	struct arena *a = arena_new();
	if (a == NULL || (s = arena_alloc(a, sizeof(*s))) == NULL) {
		arena_free(a);
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	}
	s->arena = a;
	int rv = step_build(dev, s, prog, st);
	if (rv != ST_OK) {
		arena_free(a);
		return rv;
	}
	connect_peers(dev, s, prog);
	pthread_mutex_lock(&dev->lock);
	if (dev->fail_prepare) {
		pthread_mutex_unlock(&dev->lock);
		rv = status_set(st, ST_RESOURCE_EXHAUSTED,
		                "failpoint fail-prepare: host %d cannot allocate step %llu",
		                dev->host_index, (unsigned long long)s->id);
		arena_free(a);
		return rv;
	}
	if (dev->step != NULL) {
		if (dev->step->running) {
			pthread_mutex_unlock(&dev->lock);
			arena_free(a);
			return status_set(st, ST_FAILED_PRECONDITION,
			                  "host %d is still running step %llu", dev->host_index,
			                  (unsigned long long)dev->step->id);
		}
		/* A step that was prepared but never run (its coordinator gave up) is dropped. */
		step_free_outputs(dev, dev->step);
		step_destroy(dev, dev->step);
	}
	for (size_t i = 0; i < s->n_entry && rv == ST_OK; i++)
		rv = check_assignment(dev, s, i, st);
	if (rv == ST_OK)
		rv = check_host_memory(dev, s->prog, st);
	if (rv == ST_OK)
		rv = step_allocate(dev, s, st);
	if (rv == ST_OK && ((rv = control_allocate(dev, s, st)) != ST_OK ||
	                    (rv = receive_slots_init(dev, s, st)) != ST_OK)) {
		step_free_outputs(dev, s);
		for (int c = 0; c < dev->cores_per_host; c++)
			hbm_release_reservation(&dev->cores[c].heap);
	}
	if (rv == ST_OK && s->id == dev->aborted_step) {
		/*
		 * Aborted before it came (another host failed it). It was still prepared, so that
		 * a host that cannot run it either says why in its own words.
		 */
		rv = status_set(st, dev->aborted_code, "%s", dev->aborted_reason);
		step_free_outputs(dev, s);
		step_destroy(dev, s);
		pthread_mutex_unlock(&dev->lock);
		return rv;
	}
	if (rv == ST_OK) {
		dev->step = s;
		device_adopt_early(dev, s);
	}
	pthread_mutex_unlock(&dev->lock);
	if (rv != ST_OK)
		arena_free(a);
	return rv;
}
