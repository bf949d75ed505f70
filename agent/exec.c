/*
 * Steps on one host, once prepared (prepare.c): run (every core thread walks the program;
 * collectives follow their schedules in collectives.c, control flow in control.c), finish (free
 * temporaries, publish outputs, release what the client dropped), abort.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "step.h"
#include "graph.h"
#include "fusion.h"
#include "kernels.h"
#include "log.h"

bool device_step_uses(struct device *dev, uint64_t handle)
{
	struct step *s = dev->step;
	if (s == NULL)
		return false;
	for (size_t i = 0; i < s->prog->n_buffers; i++)
		if (s->prog->buffers[i]->handle == handle)
			return true;
	return false;
}

void step_free_outputs(struct device *dev, struct step *s)
{
	for (int c = 0; c < dev->cores_per_host; c++)
		for (size_t i = 0; i < s->n_entry; i++)
			if (s->prog->buffers[i]->kind == PODEMU__BUFFER_KIND__BUFFER_OUTPUT &&
			    s->prog->buffers[i]->donor == 0 && s->at[c][i].offset >= 0)
				hbm_free(&dev->cores[c].heap, s->at[c][i]);
}

void step_destroy(struct device *dev, struct step *s)
{
	receive_slots_drain(dev, s);
	coll_step_cleanup(dev, s);
	device_note_activity(dev);
	for (int c = 0; c < dev->cores_per_host; c++)
		hbm_release_reservation(&dev->cores[c].heap);
	dev->done_step = s->id;
	arena_free(s->arena);
	if (dev->step == s)
		dev->step = NULL;
}

/* Refuses the chunks held for a step that is not s (NULL: all of them). Lock held. */
static void refuse_early(struct device *dev, const struct step *s, const char *why)
{
	int kept = 0;
	for (int i = 0; i < dev->num_early; i++) {
		struct dp_request *req = dev->early[i];
		if (s != NULL && dp_request_header(req)->step_id == s->id)
			dev->early[kept++] = req;
		else
			dp_resume(req, ST_FAILED_PRECONDITION, why);
	}
	dev->num_early = kept;
}

void device_adopt_early(struct device *dev, struct step *s)
{
	refuse_early(dev, s, "its step is not the one this host prepared");
	for (int i = 0; i < dev->num_early; i++)
		dp_resume(dev->early[i], ST_OK, NULL); /* read now, where the step says */
	dev->num_early = 0;
}

void device_drop_early(struct device *dev, const char *why)
{
	refuse_early(dev, NULL, why);
	free(dev->early);
	dev->early = NULL;
	dev->cap_early = 0;
}

/*
 * Holds a chunk of a step not prepared here yet, unread: its bytes wait in the sender's memory
 * (and its stream with them) until the step is prepared or dropped. Lock held.
 */
static int park_early(struct device *dev, struct dp_request *req, struct status *st)
{
	if (dev->num_early == dev->cap_early) {
		int cap = dev->cap_early ? dev->cap_early * 2 : 16;
		struct dp_request **list = realloc(dev->early, (size_t)cap * sizeof(*list));
		if (list == NULL)
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		dev->early = list;
		dev->cap_early = cap;
	}
	dev->early[dev->num_early++] = req;
	return DP_PARKED;
}

int device_abort(struct device *dev, uint64_t step_id, int code, const char *reason, int *positions,
                 struct status *st)
{
	pthread_mutex_lock(&dev->lock);
	struct step *s = dev->step;
	int rv = ST_OK;
	for (int c = 0; positions != NULL && c < dev->cores_per_host; c++)
		positions[c] = s != NULL && s->running ? s->position[c] : CORE_COMPUTING;
	if (s == NULL || (step_id != 0 && s->id != step_id)) {
		rv = status_set(st, ST_NOT_FOUND, "host %d has no step %llu prepared",
		                dev->host_index, (unsigned long long)step_id);
		/* Its ExecuteStep may still be on the way: the step fails when it comes. */
		if (step_id != 0 && step_id != dev->done_step) {
			dev->aborted_step = step_id;
			dev->aborted_code = code != ST_OK ? code : ST_ABORTED;
			snprintf(dev->aborted_reason, sizeof(dev->aborted_reason), "%s",
			         reason && reason[0] ? reason : "the step was aborted");
			refuse_early(dev, s, "its step was aborted");
		}
	} else if (s->running) {
		/* Every core waiting in a collective gives up with this status. */
		if (s->cancel_code == ST_OK) {
			s->cancel_code = code != ST_OK ? code : ST_ABORTED;
			snprintf(s->cancel_reason, sizeof(s->cancel_reason), "%s",
			         reason && reason[0] ? reason : "the step was aborted");
		}
		device_wake_cores(dev);
		pthread_cond_broadcast(&dev->cv); /* a stalled core */
	} else {
		step_free_outputs(dev, s);
		step_destroy(dev, s);
	}
	pthread_mutex_unlock(&dev->lock);
	return rv;
}

/* A chunk of a step that is neither prepared here nor on its way. */
static int no_step(const struct device *dev, const struct dp_header *h, struct status *st)
{
	return status_set(st, ST_FAILED_PRECONDITION, "host %d has no step %llu", dev->host_index,
	                  (unsigned long long)h->step_id);
}

int device_admit(void *arg, struct dp_request *req, const struct dp_header *h, struct status *st)
{
	struct device *dev = arg;
	pthread_mutex_lock(&dev->lock);
	int rv = ST_OK;
	if (dev->step == NULL || dev->step->id != h->step_id) {
		if (h->step_id != dev->done_step && h->step_id != dev->aborted_step &&
		    !dev->stopping)
			rv = park_early(dev, req, st); /* its step is on the way */
		else
			rv = no_step(dev, h, st);
	}
	pthread_mutex_unlock(&dev->lock);
	return rv;
}

int device_deliver(void *arg, struct dp_request *req, const struct dp_header *h,
                   const void *payload, struct status *st)
{
	struct device *dev = arg;
	pthread_mutex_lock(&dev->lock);
	struct step *s = dev->step;
	int rv = s != NULL && s->id == h->step_id ? coll_enqueue_remote(dev, s, req, h, payload, st)
	                                          : no_step(dev, h, st);
	if (s != NULL && rv != DP_PARKED) {
		coll_unplace(dev, s, req); /* refused: its receive no longer waits for it */
		receive_slot_put(dev, s, payload);
	}
	pthread_mutex_unlock(&dev->lock);
	return rv;
}

void *device_place(void *arg, struct dp_request *req, const struct dp_header *h)
{
	struct device *dev = arg;
	void *at = NULL;
	pthread_mutex_lock(&dev->lock);
	struct step *s = dev->step;
	if (s != NULL && s->id == h->step_id && dev->backed) {
		at = coll_place(dev, s, req, h);
		if (at == NULL)
			at = receive_slot_take(s, req, (int64_t)h->length);
	}
	pthread_mutex_unlock(&dev->lock);
	return at;
}

void device_unplace(void *arg, struct dp_request *req)
{
	struct device *dev = arg;
	pthread_mutex_lock(&dev->lock);
	if (dev->step != NULL) {
		coll_unplace(dev, dev->step, req);
		receive_slot_put(dev, dev->step, dp_request_payload(req));
	}
	pthread_mutex_unlock(&dev->lock);
}

/* Where a core is, for an abort that asks which cores never reached a collective. */
static void set_position(struct device *dev, struct step *s, struct core *c, int node)
{
	pthread_mutex_lock(&dev->lock);
	s->position[c->local] = node;
	pthread_mutex_unlock(&dev->lock);
}

/* How long a stalled core takes to stop once aborted, as a kernel that notices late would. */
#define STALL_UNWIND_MS 200

/*
 * The failpoint: waits, not in the collective, until the step is aborted, then takes
 * STALL_UNWIND_MS to stop, so that tests see what others do while a step still unwinds.
 */
static int stall(struct device *dev, struct step *s, struct core *c, int node, struct status *st)
{
	log_warn("failpoint stall-before-collective: core %d stops before node %d", c->ordinal,
	         node);
	pthread_mutex_lock(&dev->lock);
	while (s->cancel_code == ST_OK && !dev->stopping)
		pthread_cond_wait(&dev->cv, &dev->lock);
	int rv = status_set(st, s->cancel_code != ST_OK ? s->cancel_code : ST_ABORTED, "%s",
	                    s->cancel_code != ST_OK ? s->cancel_reason : "the agent is stopping");
	pthread_mutex_unlock(&dev->lock);
	struct timespec unwind = {0, STALL_UNWIND_MS * 1000000L};
	nanosleep(&unwind, NULL);
	return rv;
}

/* Elements per tile of a fusion: each member's tile lives in host scratch, not in HBM. */
#define FUSION_TILE 4096

/*
 * Runs the fusion rooted at node root tile by tile: every member computes a tile of its values
 * from HBM operands or from the tiles of the members before it; only the root writes HBM.
 */
static int run_fusion(struct step *s, struct core *c, int root, struct status *st)
{
	int members[FUSION_MAX_NODES + 1], m = 0;
	for (int j = s->fusion_head[root]; j != -1 && m < FUSION_MAX_NODES; j = s->fusion_next[j])
		members[m++] = j;
	members[m++] = root;
	unsigned char *scratch = malloc((size_t)m * FUSION_TILE * sizeof(double));
	if (scratch == NULL)
		return status_set(st, ST_INTERNAL, "out of host memory");
	int64_t total = shape_elements(&s->shapes[root]);
	int rv = ST_OK;
	for (int64_t t = 0; t < total && rv == ST_OK; t += FUSION_TILE) {
		int64_t len = total - t < FUSION_TILE ? total - t : FUSION_TILE;
		for (int q = 0; q < m && rv == ST_OK; q++) {
			int node = members[q];
			const Podemu__Node *n = s->node_of[node];
			struct shape tiles[4];
			struct kernel_call k = {
			    .op = s->ops[node], .node = n, .out_shape = &tiles[3]};
			shape_make(&tiles[3], s->shapes[node].dtype, &len, 1, st);
			size_t es = dtype_size(s->shapes[node].dtype);
			k.out = node == root
			            ? (unsigned char *)core_ptr(c, s, root) + (size_t)t * es
			            : scratch + (size_t)q * FUSION_TILE * sizeof(double);
			for (size_t j = 0; j < n->n_operands && j < 3; j++) {
				int p = step_operand(s, node, j), slot = -1;
				for (int r = 0; r < q; r++)
					slot = members[r] == p ? r : slot;
				shape_make(&tiles[j], s->shapes[p].dtype, &len, 1, st);
				k.in_shapes[j] = &tiles[j];
				k.in[j] =
				    slot >= 0
				        ? scratch + (size_t)slot * FUSION_TILE * sizeof(double)
				        : (const unsigned char *)core_ptr(c, s, p) +
				              (size_t)t * dtype_size(s->shapes[p].dtype);
				k.num_in++;
			}
			rv = kernel_run(&k, st);
		}
	}
	free(scratch);
	return rv;
}

int step_run_nodes(struct device *dev, struct step *s, struct core *c, const struct frame *f,
                   struct status *st)
{
	size_t count = s->n_entry;
	int first = 0;
	const int32_t *order = NULL;
	if (f->comp >= 0) {
		count = s->prog->graph->computations[f->comp]->n_nodes;
		first = s->comp_first[f->comp];
		if (s->prog->n_computation_order)
			order = s->prog->computation_order + (first - (int)s->n_entry);
	}
	for (size_t at = 0; at < count; at++) {
		int i = first + (order != NULL ? order[at] : (int)at);
		enum opcode op = s->ops[i];
		int rv = control_place(s, c, f, i, st);
		if (rv != ST_OK)
			return rv;
		if (op == OP_PARAMETER || op == OP_OPT_BARRIER || op == OP_GET_TUPLE_ELEMENT ||
		    op == OP_TUPLE)
			continue;
		if (opcode_is_control_flow(op)) {
			if ((rv = control_run(dev, s, c, f, i, st)) != ST_OK)
				return rv;
			continue;
		}
		if (opcode_is_collective(op)) {
			if (dev->stall_before_collective)
				return stall(dev, s, c, i, st);
			const Podemu__BufferAssignment *b = s->prog->buffers[i];
			void *scratch = NULL;
			if (dev->backed && b->scratch_bytes > 0 &&
			    (rv = control_frame_ptr(s, c, f, b->scratch_offset, b->scratch_bytes, i,
			                            &scratch, st)) != ST_OK)
				return rv;
			set_position(dev, s, c, i);
			rv = coll_run(dev, s, c, i, scratch, b->scratch_bytes, st);
			set_position(dev, s, c, CORE_COMPUTING);
			if (rv != ST_OK)
				return rv;
			continue;
		}
		if (!dev->backed || (s->prog->n_fused_into && s->prog->fused_into[i] != -1))
			continue; /* a fused node is computed by its fusion's root */
		const Podemu__Node *n = s->node_of[i];
		if (s->fusion_head[i] != -1) {
			rv = run_fusion(s, c, i, st);
			if (rv != ST_OK)
				return status_set(
				    st, rv, "fusion rooted at %s (node %d) on core %d: %s",
				    n->opcode, step_source_node(s, i), c->ordinal, st->message);
			continue;
		}
		struct kernel_call k = {.op = op,
		                        .node = n,
		                        .out_shape = &s->shapes[i],
		                        .out = core_ptr(c, s, i),
		                        .num_in = (int)n->n_operands,
		                        .replica_id = c->ordinal};
		if (n->n_operands > KERNEL_MAX_OPERANDS)
			return status_set(st, ST_UNIMPLEMENTED,
			                  "%s (node %d) has too many operands", n->opcode, i);
		for (size_t j = 0; j < n->n_operands; j++) {
			k.in_shapes[j] = &s->shapes[step_operand(s, i, j)];
			k.in[j] = core_ptr(c, s, step_operand(s, i, j));
		}
		rv = kernel_run(&k, st);
		if (rv != ST_OK)
			return status_set(st, rv, "%s (node %d) on core %d: %s", n->opcode,
			                  step_source_node(s, i), c->ordinal, st->message);
	}
	return ST_OK;
}

/*
 * The bytes the step writes on this core, committed before it runs (each core its own, so the
 * host's cores do it in parallel): its reservation and the outputs it allocated.
 */
static void commit_step_memory(struct step *s, struct core *c)
{
	hbm_commit(&c->heap, 0, s->prog->temp_bytes);
	for (size_t i = 0; i < s->n_entry; i++) {
		const Podemu__BufferAssignment *b = s->prog->buffers[i];
		if (b->kind == PODEMU__BUFFER_KIND__BUFFER_OUTPUT && b->donor == 0)
			hbm_commit(&c->heap, s->at[c->local][i].offset, b->bytes);
	}
}

static int run_core(struct device *dev, struct step *s, struct core *c, struct status *st)
{
	struct frame entry = {.comp = -1};
	c->collectives_run = 0;
	commit_step_memory(s, c);
	int rv = step_run_nodes(dev, s, c, &entry, st);
	core_release_dp(dev, c);
	return rv;
}

/* Core c is done with s, with status st. Lock held. */
static void core_finished(struct device *dev, struct step *s, struct core *c,
                          const struct status *st)
{
	s->core_status[c->local] = *st;
	s->position[c->local] = CORE_DONE;
	if (st->code != ST_OK && s->cancel_code == ST_OK) {
		/* The host's other cores need not wait for this one's data any more. */
		s->cancel_code = st->code;
		s->failed_core = c->local;
		snprintf(s->cancel_reason, sizeof(s->cancel_reason), "core %d failed: %s",
		         c->ordinal, st->message);
		device_wake_cores(dev);
	}
	if (++s->done_cores == dev->cores_per_host)
		pthread_cond_broadcast(&dev->cv); /* device_run */
}

void *device_core_main(void *arg)
{
	struct core *c = arg;
	struct device *dev = c->dev;
	pthread_mutex_lock(&dev->lock);
	for (;;) {
		while (!dev->stopping && c->pending == NULL)
			pthread_cond_wait(&c->cv, &dev->lock);
		if (dev->stopping)
			break;
		struct step *s = c->pending;
		pthread_mutex_unlock(&dev->lock);
		struct status st;
		status_clear(&st);
		run_core(dev, s, c, &st);
		pthread_mutex_lock(&dev->lock);
		c->pending = NULL;
		core_finished(dev, s, c, &st);
	}
	pthread_mutex_unlock(&dev->lock);
	return NULL;
}

/*
 * A step small enough to run on the calling thread, core after core: no collective (its cores
 * never wait for each other) and, with bytes behind the heaps, at most this much per core to
 * compute. Waking a thread per core costs more than such a step's kernels.
 */
#define STEP_INLINE_BYTES (256 * 1024)

static bool step_runs_inline(const struct device *dev, const struct step *s)
{
	if (s->num_colls > 0)
		return false;
	if (!dev->backed)
		return true;
	int64_t bytes = s->prog->temp_bytes;
	for (size_t i = 0; i < s->n_entry && bytes <= STEP_INLINE_BYTES; i++)
		if (s->prog->buffers[i]->kind == PODEMU__BUFFER_KIND__BUFFER_OUTPUT)
			bytes += s->prog->buffers[i]->bytes;
	return bytes <= STEP_INLINE_BYTES;
}

/* Publishes a finished step's outputs as device buffers. Lock held. */
static int step_publish(struct device *dev, struct step *s, struct status *st)
{
	for (size_t i = 0; i < s->n_entry; i++) {
		const Podemu__BufferAssignment *b = s->prog->buffers[i];
		if (b->kind != PODEMU__BUFFER_KIND__BUFFER_OUTPUT)
			continue;
		if (b->donor != 0) {
			/* The donated buffer is the output now: same bytes, the output's name. */
			struct device_buffer *db =
			    device_find_buffer(dev, s->prog->buffers[b->donor - 1]->handle);
			if (db == NULL)
				return status_set(st, ST_INTERNAL, "node %zu: its donor is gone",
				                  i);
			device_rename_buffer(dev, db, b->handle);
			db->shape = s->shapes[i];
			for (int c = 0; c < dev->cores_per_host; c++)
				s->at[c][i] = HBM_NO_BUFFER;
			continue;
		}
		struct hbm_buffer *at = calloc((size_t)dev->cores_per_host, sizeof(*at));
		if (at == NULL)
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		for (int c = 0; c < dev->cores_per_host; c++) {
			at[c] = s->at[c][i];
			s->at[c][i] = HBM_NO_BUFFER; /* now owned by the buffer */
		}
		int rv = device_add_buffer(dev, b->handle, &s->shapes[i], at, st);
		if (rv != ST_OK) {
			for (int c = 0; c < dev->cores_per_host; c++)
				s->at[c][i] = at[c];
			free(at);
			return rv;
		}
	}
	return ST_OK;
}

/* Copies the per-core collective timings of a finished step into a. Lock held. */
static int step_timings(struct device *dev, struct step *s, struct arena *a,
                        Podemu__CollectiveTiming ***out, size_t *n, struct status *st)
{
	size_t total = (size_t)dev->cores_per_host * (size_t)s->num_colls;
	Podemu__CollectiveTiming **list = arena_calloc(a, total + 1, sizeof(*list));
	if (list == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	size_t k = 0;
	for (size_t i = 0; i < s->prog->graph->n_nodes; i++) {
		if (!opcode_is_collective(s->ops[i]))
			continue;
		for (int c = 0; c < dev->cores_per_host; c++) {
			Podemu__CollectiveTiming *t = arena_alloc(a, sizeof(*t));
			if (t == NULL)
				return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
			podemu__collective_timing__init(t);
			t->node = step_source_node(s, (int)i);
			t->ordinal = dev->cores[c].ordinal;
			t->micros = s->micros[c * s->num_colls + s->coll_of_node[i]];
			t->started_micros =
			    s->started_micros[c * s->num_colls + s->coll_of_node[i]];
			t->ended_micros = s->ended_micros[c * s->num_colls + s->coll_of_node[i]];
			t->algorithm =
			    arena_strdup(a, s->sched[c][i] ? s->sched[c][i]->algorithm : "");
			list[k++] = t;
		}
	}
	*out = list;
	*n = k;
	return ST_OK;
}

int device_run(struct device *dev, uint64_t step_id, const uint64_t *release_after,
               size_t n_release, struct arena *a, Podemu__MemoryStatsReply *rep, struct status *st)
{
	pthread_mutex_lock(&dev->lock);
	struct step *s = dev->step;
	if (s == NULL || s->id != step_id || s->running) {
		pthread_mutex_unlock(&dev->lock);
		return status_set(st, ST_FAILED_PRECONDITION, "host %d has no prepared step %llu",
		                  dev->host_index, (unsigned long long)step_id);
	}
	s->running = true;
	if (step_runs_inline(dev, s)) {
		for (int c = 0; c < dev->cores_per_host; c++) {
			struct status cst;
			status_clear(&cst);
			pthread_mutex_unlock(&dev->lock);
			run_core(dev, s, &dev->cores[c], &cst);
			pthread_mutex_lock(&dev->lock);
			core_finished(dev, s, &dev->cores[c], &cst);
		}
	}
	for (int c = 0; c < dev->cores_per_host && s->done_cores == 0; c++) {
		dev->cores[c].pending = s;
		core_wake(&dev->cores[c]);
	}
	while (s->done_cores < dev->cores_per_host)
		pthread_cond_wait(&dev->cv, &dev->lock);
	int rv = ST_OK;
	if (s->failed_core >= 0) /* the cause, not the cores that gave up because of it */
		rv = status_set(st, s->core_status[s->failed_core].code, "%s",
		                s->core_status[s->failed_core].message);
	for (int c = 0; c < dev->cores_per_host && rv == ST_OK; c++)
		if (s->core_status[c].code != ST_OK)
			rv =
			    status_set(st, s->core_status[c].code, "%s", s->core_status[c].message);
	if (rv == ST_OK)
		rv = step_timings(dev, s, a, &rep->timings, &rep->n_timings, st);
	rep->receive_peak_slots = s->receive.peak;
	rep->receive_outside = s->receive.outside;
	if (rv == ST_OK)
		rv = step_publish(dev, s, st);
	step_free_outputs(dev, s);
	step_destroy(dev, s);
	pthread_cond_broadcast(&dev->cv); /* device_forget_all waits for no step */
	pthread_mutex_unlock(&dev->lock);
	if (n_release > 0) {
		struct status rst;
		device_release(dev, release_after, n_release, &rst);
	}
	return rv;
}
