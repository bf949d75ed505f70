/*
 * Steps: a graph checked, compiled through the compiler's one pipeline (or taken from the
 * program cache), checked against the cores' HBM, prepared (each agent lowering its cores'
 * collectives) and run on every agent in one round trip; then what it leaves for the metrics.
 */
#include "steps.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "clock.h"
#include "dispatch.h"
#include "from_graph.h"
#include "graph.h"
#include "layout.h"
#include "log.h"
#include "lower.h"
#include "plan.h"
#include "podemu.pb-c.h"
#include "services.h"

#define MAX_GRAPH_NODES (1 << 20)

const double metrics_bucket_bounds[METRICS_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                       0.25,  0.5,    1,     2.5,  10,    60};

/* A step that ran (or failed), for /metrics. */
static void count_step(struct coordinator *co, int rv, double seconds, const struct step_report *r)
{
	struct metrics *m = &co->metrics;
	pthread_mutex_lock(&m->lock);
	if (rv != ST_OK) {
		m->steps_failed++;
	} else {
		m->steps_run++;
		m->latency_count++;
		m->latency_sum_seconds += seconds;
		int k = 0;
		while (k < METRICS_BUCKETS - 1 && seconds > metrics_bucket_bounds[k])
			k++;
		if (seconds <= metrics_bucket_bounds[k])
			m->latency_buckets[k]++;
		int world = topology_world_size(&co->reg.topo);
		for (int op = 0; op < OP_COUNT; op++)
			m->sent_bytes[op] += (double)r->sent_by_op[op] * world;
		int64_t *live = malloc(((size_t)r->n_live + 1) * sizeof(int64_t));
		if (live != NULL) {
			if (r->n_live > 0)
				memcpy(live, r->live, (size_t)r->n_live * sizeof(int64_t));
			free(m->last_live);
			m->last_live = live;
			m->n_last_live = r->n_live;
			m->last_step = r->step_id;
		}
	}
	pthread_mutex_unlock(&m->lock);
}

/* Converts inferred shapes back to the wire so agents see complete nodes. */
static Podemu__Shape *shape_to_proto(struct arena *a, const struct shape *s)
{
	Podemu__Shape *p = arena_alloc(a, sizeof(*p));
	if (p == NULL)
		return NULL;
	podemu__shape__init(p);
	p->tuple = s->tuple;
	p->dtype = (Podemu__DType)s->dtype;
	p->n_dims = (size_t)s->rank;
	p->dims = arena_calloc(a, (size_t)s->rank + 1, sizeof(int64_t));
	p->elements = arena_calloc(a, (size_t)s->n_elements + 1, sizeof(*p->elements));
	if (p->dims == NULL || p->elements == NULL)
		return NULL;
	memcpy(p->dims, s->dims, (size_t)s->rank * sizeof(int64_t));
	for (int k = 0; k < s->n_elements; k++)
		if ((p->elements[p->n_elements++] = shape_to_proto(a, &s->elements[k])) == NULL)
			return NULL;
	return p;
}

/* Compile-time check: XLA's text when the plan alone exceeds a core's HBM. */
static int check_fits(struct coordinator *co, const struct plan *p, struct status *st)
{
	int64_t limit = topology_bytes_limit(&co->reg.topo);
	int64_t used = layout_add(layout_add(p->argument_bytes, p->output_bytes), p->temp_bytes);
	if (used <= limit)
		return ST_OK;
	char u[16], l[16], over[16], args[16], outs[16], temps[16];
	return status_set(
	    st, ST_RESOURCE_EXHAUSTED,
	    "Ran out of memory in memory space hbm. Used %s of %s hbm. Exceeded hbm "
	    "capacity by %s. (on each of cores 0..%d, the same plan: arguments %s, outputs %s, "
	    "temporaries %s)",
	    status_human_bytes(u, used), status_human_bytes(l, limit),
	    status_human_bytes(over, used - limit), topology_world_size(&co->reg.topo) - 1,
	    status_human_bytes(args, p->argument_bytes), status_human_bytes(outs, p->output_bytes),
	    status_human_bytes(temps, p->temp_bytes));
}

/*
 * Per node: the workspace the plan reserved for a collective on every core (0 for other
 * nodes), the bytes its agents work through.
 */
static int64_t *node_scratch(struct arena *a, const struct plan *plan, size_t n_nodes)
{
	int64_t *scratch = arena_calloc(a, n_nodes + 1, sizeof(int64_t));
	for (size_t i = 0; scratch != NULL && i < n_nodes; i++)
		scratch[i] = plan->buffers[i]->scratch_bytes;
	return scratch;
}

/*
 * The coordinator's passes and buffer plan for a checked graph *g (shapes its node shapes):
 * from the program cache when the same graph was compiled before, else scheduling, fusion and
 * planning, then cached. *g and shapes become the scheduled graph and its shapes; out's arrays
 * are from a.
 */
static int *copy_ints(struct arena *a, const int *src, int n)
{
	int *dst = src != NULL ? arena_calloc(a, (size_t)n + 1, sizeof(int)) : NULL;
	if (dst != NULL)
		memcpy(dst, src, (size_t)n * sizeof(int));
	return dst;
}

static int compile_step(struct coordinator *co, struct arena *a, Podemu__Graph **g,
                        struct shape *shapes, const uint64_t *out_handles, struct compiled *out,
                        struct cache_entry **entry, int64_t **scratch, Podemu__StepReply *rep,
                        struct status *st)
{
	uint8_t *key;
	size_t key_len;
	uint64_t hash;
	if (cache_key(*g, a, &key, &key_len, &hash) != 0)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	*entry = cache_find(&co->cache, key, key_len, hash);
	const struct compiled *hit = *entry != NULL ? &(*entry)->compiled : NULL;
	int n = (int)(*g)->n_nodes, rv;
	memset(out, 0, sizeof(*out));
	if (hit != NULL) {
		/* Its arrays, which a later store may evict, copied for this step. */
		*out = *hit;
		rep->program_cache_hit = true;
		out->order = copy_ints(a, hit->order, hit->n);
		out->fused_into = copy_ints(a, hit->fused_into, hit->n_total);
		out->computation_order =
		    copy_ints(a, hit->computation_order, hit->n_total - hit->n);
		if ((hit->order && !out->order) || (hit->fused_into && !out->fused_into) ||
		    (hit->computation_order && !out->computation_order))
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	} else {
		/* The compiler's one pipeline, then the graph in its scheduled order. */
		struct plan_options po = {.topology = &co->reg.topo,
		                          .combine_threshold_bytes =
		                              co->schedule.combine_threshold_bytes,
		                          .memory_aware = co->schedule.memory_aware,
		                          .fusion = co->fusion,
		                          .tiled = co->tiled,
		                          .chunk_bytes = co->chunk_bytes,
		                          .window = co->window,
		                          .collective_algorithm = co->collective_algorithm};
		if ((rv = plan_graph(out, a, *g, shapes, &po, st)) != ST_OK)
			return rv;
		*entry = cache_store(&co->cache, key, key_len, hash, out);
	}
	if (out->order != NULL) {
		struct schedule sched = {.n = n, .order = out->order};
		if ((*g = schedule_apply(*g, &sched, shapes, a)) == NULL)
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	}
	struct compiled template = *out;
	if ((rv = plan_bind(&out->plan, a, &template, *g, out_handles, st)) != ST_OK)
		return rv;
	if ((*scratch = node_scratch(a, &out->plan, (*g)->n_nodes)) == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	rep->combined_collectives = out->n_combined;
	rep->receive_bytes = out->plan.receive_slot_bytes * out->plan.receive_slots;
	rep->delayed_nodes = out->n_delayed;
	rep->fused_nodes = out->n_fused;
	return ST_OK;
}

/*
 * The parameters whose device buffers the client released with this step are donors (XLA's
 * buffer_donor): an output of the same size may take their bytes (torch_xla's donation of a
 * tensor updated in place). Part of the graph, so the program cache tells them apart.
 */
static int mark_donors(Podemu__Graph *g, const Podemu__StepRequest *req, struct arena *a,
                       struct status *st)
{
	g->n_donors = 0;
	if (req->n_release_after == 0)
		return ST_OK;
	g->donors = arena_calloc(a, g->n_nodes + 1, sizeof(int32_t));
	if (g->donors == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (size_t i = 0; i < g->n_nodes; i++) {
		if (opcode_parse(g->nodes[i]->opcode) != OP_PARAMETER)
			continue;
		for (size_t k = 0; k < req->n_release_after; k++)
			if (req->release_after[k] == g->nodes[i]->handle) {
				g->donors[g->n_donors++] = (int32_t)i;
				break;
			}
	}
	return ST_OK;
}

/*
 * Checks, plans and runs one step on every host in one round trip (ExecuteStep: each host
 * prepares, all cores or none allocating, then runs; a host that fails has the others aborted).
 * *ran tells whether agents got the step (they then released release_after themselves).
 */
/*
 * Under the registry's lock: the step's session in use, each parameter's buffer found and its
 * shape and layout taken, the outputs' handles (named by the client, or new) and the step's id.
 */
static int bind_buffers(struct coordinator *co, struct arena *a, Podemu__Graph *g,
                        const struct shape *shapes, const Podemu__StepRequest *req,
                        uint64_t *out_handles, uint64_t *step_id, struct status *st)
{
	pthread_mutex_lock(&co->reg.lock);
	int rv = session_use(&co->reg, req->session, st);
	for (size_t i = 0; i < g->n_nodes && rv == ST_OK; i++) {
		if (opcode_parse(g->nodes[i]->opcode) != OP_PARAMETER)
			continue;
		struct status hst;
		struct handle_entry *e =
		    registry_use_handle(&co->reg, g->nodes[i]->handle, req->session, &hst);
		char sa[128], sb[128];
		if (e == NULL)
			rv = status_set(st, hst.code, "parameter (node %zu): %s", i, hst.message);
		else if (!shape_equal(&e->shape, &shapes[i]))
			rv = status_set(st, ST_INVALID_ARGUMENT,
			                "parameter (node %zu): buffer %llu is %s, not %s", i,
			                (unsigned long long)e->handle,
			                shape_format(sa, sizeof(sa), &e->shape),
			                shape_format(sb, sizeof(sb), &shapes[i]));
		else /* a parameter is in its device buffer's layout, whatever the client says */
			g->nodes[i]->layout =
			    e->layout[0] ? arena_strdup(a, e->layout) : (char *)"";
		if (g->nodes[i]->layout == NULL)
			rv = status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	}
	for (size_t k = 0; k < g->n_outputs && rv == ST_OK; k++) {
		const char *l = g->nodes[g->outputs[k]]->layout;
		if (l != NULL && strlen(l) >= LAYOUT_TEXT_MAX)
			rv = status_set(st, ST_INVALID_ARGUMENT,
			                "output %zu: layout longer than %d characters", k,
			                LAYOUT_TEXT_MAX - 1);
	}
	if (rv == ST_OK && req->n_output_handles > 0 && !req->compile_only) {
		/* Named by the client, which may already have sent a step that reads them. */
		if (req->n_output_handles != g->n_outputs)
			rv = status_set(st, ST_INVALID_ARGUMENT,
			                "%zu output handles named for %zu outputs",
			                req->n_output_handles, g->n_outputs);
		else if ((rv = session_name_outputs(&co->reg, req->session, req->output_handles,
		                                    req->n_output_handles, st)) == ST_OK)
			memcpy(out_handles, req->output_handles, g->n_outputs * sizeof(uint64_t));
	} else {
		for (size_t k = 0; k < g->n_outputs; k++)
			out_handles[k] = co->reg.next_handle++;
	}
	*step_id = ++co->next_step;
	pthread_mutex_unlock(&co->reg.lock);
	return rv;
}

/* The program every host gets (each lowers its own cores' collectives); NULL out of memory. */
static Podemu__Program *host_program(const struct coordinator *co, struct arena *a,
                                     Podemu__Graph *g, const struct compiled *c, uint64_t step_id,
                                     char **data_urls)
{
	const struct topology *t = &co->reg.topo;
	Podemu__Program *prog = arena_alloc(a, sizeof(*prog));
	if (prog == NULL)
		return NULL;
	podemu__program__init(prog);
	prog->window = co->window;
	prog->step_id = step_id;
	if (c->order != NULL) {
		prog->source_nodes = c->order;
		prog->n_source_nodes = (size_t)c->n;
	}
	if (c->fused_into != NULL) {
		prog->fused_into = c->fused_into;
		prog->n_fused_into = (size_t)c->n_total;
	}
	if (c->computation_order != NULL) {
		prog->computation_order = c->computation_order;
		prog->n_computation_order = (size_t)(c->n_total - c->n);
	}
	prog->graph = g;
	prog->buffers = c->plan.buffers;
	prog->n_buffers = (size_t)c->n_total;
	prog->temp_bytes = c->plan.temp_bytes;
	prog->receive_offset = c->plan.receive_offset;
	prog->receive_slots = c->plan.receive_slots;
	prog->receive_slot_bytes = c->plan.receive_slot_bytes;
	prog->world_size = topology_world_size(t);
	prog->cores_per_host = t->cores_per_host;
	prog->peer_data_urls = data_urls;
	prog->n_peer_data_urls = (size_t)t->num_hosts;
	prog->chunk_bytes = co->chunk_bytes;
	prog->collective_timeout_ms = co->collective_timeout_ms;
	prog->collective_algorithm =
	    (char *)(co->collective_algorithm ? co->collective_algorithm : "");
	return prog;
}

/* Every host's reply folded into the step's: its cores, timings and receive figures. */
static int gather_replies(Podemu__StepReply *rep, struct arena *a, const Podemu__Graph *g,
                          const struct compiled *c, const int64_t *scratch, void **replies,
                          int hosts, int world, struct status *st)
{
	rep->temp_bytes = c->plan.temp_bytes;
	rep->output_bytes = c->plan.output_bytes;
	rep->alias_bytes = c->plan.alias_bytes;
	rep->argument_bytes = c->plan.argument_bytes;
	rep->cores = arena_calloc(a, (size_t)world, sizeof(*rep->cores));
	if (rep->cores == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	size_t n_timings = 0;
	for (int h = 0; h < hosts; h++)
		n_timings += ((Podemu__MemoryStatsReply *)replies[h])->n_timings;
	rep->timings = arena_calloc(a, n_timings + 1, sizeof(*rep->timings));
	if (rep->timings == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int h = 0; h < hosts; h++) {
		Podemu__MemoryStatsReply *r = replies[h];
		for (size_t k = 0; k < r->n_cores && rep->n_cores < (size_t)world; k++)
			rep->cores[rep->n_cores++] = r->cores[k];
		for (size_t k = 0; k < r->n_timings; k++)
			rep->timings[rep->n_timings++] = r->timings[k];
		int64_t held = (int64_t)(r->receive_peak_slots > 0 ? r->receive_peak_slots : 0) *
		               c->plan.receive_slot_bytes;
		rep->receive_peak_bytes =
		    held > rep->receive_peak_bytes ? held : rep->receive_peak_bytes;
		rep->receive_outside_chunks += r->receive_outside;
	}
	/* The client counts nodes in its recorded order. */
	int64_t *recorded_scratch = arena_calloc(a, g->n_nodes + 1, sizeof(int64_t));
	if (recorded_scratch == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (size_t i = 0; i < g->n_nodes; i++)
		recorded_scratch[c->order ? c->order[i] : (int)i] = scratch[i];
	rep->node_scratch_bytes = recorded_scratch;
	rep->n_node_scratch_bytes = g->n_nodes;
	return ST_OK;
}

/* The step's outputs are the session's buffers now; freed everywhere should that fail. */
static int own_outputs(struct coordinator *co, struct arena *a, const Podemu__Graph *g,
                       const struct shape *shapes, const Podemu__StepRequest *req,
                       uint64_t *out_handles, struct rpc_client **clients, struct status *st)
{
	int64_t *out_bytes = arena_calloc(a, g->n_outputs + 1, sizeof(int64_t));
	if (out_bytes == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	int rv = ST_OK;
	for (size_t k = 0; k < g->n_outputs && rv == ST_OK; k++)
		rv = graph_value_bytes(&out_bytes[k], &shapes[g->outputs[k]],
		                       g->nodes[g->outputs[k]]->layout, co->tiled, a, st);
	pthread_mutex_lock(&co->reg.lock);
	size_t added = 0;
	for (; added < g->n_outputs && rv == ST_OK; added++)
		rv = registry_add_handle(&co->reg, out_handles[added], req->session,
		                         out_bytes[added], &shapes[g->outputs[added]],
		                         g->nodes[g->outputs[added]]->layout, st);
	/* Outputs nobody can own (the session ended meanwhile) are freed, not left behind. */
	for (size_t k = 0; rv != ST_OK && k < added; k++)
		registry_remove_handle(&co->reg, out_handles[k]);
	pthread_mutex_unlock(&co->reg.lock);
	if (rv != ST_OK)
		release_everywhere(co, a, clients, out_handles, g->n_outputs, NULL);
	return rv;
}

static int execute_locked(struct coordinator *co, struct arena *a, const Podemu__StepRequest *req,
                          Podemu__StepReply *rep, struct rpc_client **clients, char **data_urls,
                          bool *ran, struct step_report *report, struct status *st)
{
	const struct topology *t = &co->reg.topo;
	int hosts = t->num_hosts, world = topology_world_size(t);
	Podemu__Graph *g = req->graph;
	*ran = false;
	if (g == NULL || g->n_nodes == 0)
		return status_set(st, ST_INVALID_ARGUMENT, "step has no graph");
	size_t total = graph_total_nodes(g);
	if (total > MAX_GRAPH_NODES)
		return status_set(st, ST_INVALID_ARGUMENT, "graph has %zu nodes; the limit is %d",
		                  total, MAX_GRAPH_NODES);
	struct shape *shapes = arena_calloc(a, total + 1, sizeof(*shapes));
	uint64_t *out_handles = arena_calloc(a, g->n_outputs + 1, sizeof(uint64_t));
	if (shapes == NULL || out_handles == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	int rv = graph_check(g, world, shapes, a, st);
	if (rv != ST_OK)
		return rv;
	if ((rv = mark_donors(g, req, a, st)) != ST_OK)
		return rv;
	/* Ops without kernels can be planned and accounted, but not computed with real bytes. */
	pthread_mutex_lock(&co->reg.lock);
	bool backed = strcmp(co->reg.hosts[0].backing, "host") == 0;
	pthread_mutex_unlock(&co->reg.lock);
	for (size_t i = 0; backed && !req->compile_only && i < g->n_nodes; i++)
		if (opcode_parse(g->nodes[i]->opcode) == OP_OPAQUE)
			return status_set(st, ST_UNIMPLEMENTED,
			                  "node %zu: %s has no kernel in podemu; a pod with "
			                  "--backing none plans and accounts it",
			                  i,
			                  g->nodes[i]->name ? g->nodes[i]->name : "an opaque op");
	uint64_t step_id;
	if ((rv = bind_buffers(co, a, g, shapes, req, out_handles, &step_id, st)) != ST_OK)
		return rv;

	/* Node indices below are the scheduled ones. */
	struct compiled prog_c;
	struct cache_entry *entry = NULL;
	int64_t *scratch = NULL;
	if ((rv = compile_step(co, a, &g, shapes, out_handles, &prog_c, &entry, &scratch, rep,
	                       st)) != ST_OK)
		return rv;
	struct plan plan = prog_c.plan;
	if (req->compile_only) {
		/* "Would this fit?": the plan's figures, and XLA's text when it does not. */
		struct status oom;
		rep->argument_bytes = plan.argument_bytes;
		rep->output_bytes = plan.output_bytes;
		rep->alias_bytes = plan.alias_bytes;
		rep->temp_bytes = plan.temp_bytes;
		rep->bytes_limit = topology_bytes_limit(t);
		rep->fits = check_fits(co, &plan, &oom) == ST_OK;
		if (!rep->fits)
			rep->oom_message = arena_strdup(a, oom.message);
		return ST_OK;
	}
	if ((rv = check_fits(co, &plan, st)) != ST_OK)
		return rv;
	for (size_t i = 0; i < g->n_nodes; i++)
		if ((g->nodes[i]->shape = shape_to_proto(a, &shapes[i])) == NULL)
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");

	Podemu__Program *prog = host_program(co, a, g, &prog_c, step_id, data_urls);
	if (prog == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");

	void **replies = arena_calloc(a, (size_t)hosts, sizeof(void *));
	struct status *sts = arena_calloc(a, (size_t)hosts, sizeof(*sts));
	int *failed = arena_calloc(a, (size_t)hosts, sizeof(int));
	if (!replies || !sts || !failed)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	Podemu__HostStep *host_step = arena_alloc(a, sizeof(*host_step));
	if (host_step == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	podemu__host_step__init(host_step);
	host_step->program = prog;
	host_step->release_after = req->release_after;
	host_step->n_release_after = req->n_release_after;
	const void **reqs = same_for_all(a, hosts, host_step);
	*ran = true;
	rv = fan_call_watched(co, clients, AM_EXECUTE_STEP, co->step_timeout_ms, step_id,
	                      req->session, reqs, a, replies, sts, st);
	if (rv != ST_OK) {
		for (int h = 0; h < hosts; h++)
			failed[h] = sts[h].code != ST_OK;
		release_everywhere(co, a, clients, out_handles, g->n_outputs, failed);
		return rv;
	}
	if (report != NULL) {
		report->step_id = step_id;
		memcpy(report->sent_by_op, prog_c.sent_by_op, sizeof(prog_c.sent_by_op));
		report->live = prog_c.live;
		report->n_live = prog_c.n_live;
	}
	rep->step_id = step_id;
	rep->output_handles = out_handles;
	rep->n_output_handles = g->n_outputs;
	if ((rv = gather_replies(rep, a, g, &prog_c, scratch, replies, hosts, world, st)) !=
	    ST_OK) {
		release_everywhere(co, a, clients, out_handles, g->n_outputs, NULL);
		return rv;
	}
	return own_outputs(co, a, g, shapes, req, out_handles, clients, st);
}

/*
 * What the client released with the step that its session owns, into *owned (from a);
 * NOT_FOUND names the first handle it does not own.
 */
static int owned_release_after(struct coordinator *co, const Podemu__StepRequest *req,
                               struct arena *a, uint64_t **owned, size_t *n, struct status *st)
{
	*n = 0;
	*owned = arena_calloc(a, req->n_release_after + 1, sizeof(uint64_t));
	if (*owned == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	int rv = ST_OK;
	pthread_mutex_lock(&co->reg.lock);
	for (size_t k = 0; k < req->n_release_after; k++) {
		const struct handle_entry *e =
		    registry_find_handle(&co->reg, req->release_after[k]);
		if (e != NULL && e->session == req->session)
			(*owned)[(*n)++] = req->release_after[k];
		else if (rv == ST_OK)
			rv = registry_unknown_handle(&co->reg, req->release_after[k], req->session,
			                             st);
	}
	pthread_mutex_unlock(&co->reg.lock);
	return rv;
}

/*
 * A step that names its place in its session's order (StepRequest.sequence) waits, up to the
 * step timeout, until the session's earlier steps have run: a client may send a step before
 * the one it reads from has finished, on another connection context, and the two may reach
 * the coordinator's workers in either order.
 */
static int wait_turn(struct coordinator *co, const Podemu__StepRequest *req, struct status *st)
{
	if (req->sequence == 0)
		return ST_OK;
	struct timespec deadline;
	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += co->step_timeout_ms / 1000;
	deadline.tv_nsec += (long)(co->step_timeout_ms % 1000) * 1000000;
	if (deadline.tv_nsec >= 1000000000) {
		deadline.tv_sec++;
		deadline.tv_nsec -= 1000000000;
	}
	int rv = ST_OK;
	pthread_mutex_lock(&co->reg.lock);
	for (;;) {
		const struct session *s = session_find(&co->reg, req->session);
		if (s == NULL) {
			rv = session_use(&co->reg, req->session, st); /* says why */
			if (rv == ST_OK)
				rv = status_set(st, ST_NOT_FOUND, "session %llu is not open",
				                (unsigned long long)req->session);
			break;
		}
		if (s->next_sequence == req->sequence)
			break;
		if (s->next_sequence > req->sequence) {
			rv = status_set(st, ST_INVALID_ARGUMENT,
			                "step %llu of session %llu has been sent before",
			                (unsigned long long)req->sequence,
			                (unsigned long long)req->session);
			break;
		}
		/* In slices, so that a session that ends meanwhile is seen. */
		struct timespec slice;
		clock_gettime(CLOCK_REALTIME, &slice);
		slice.tv_nsec += 100 * 1000000;
		if (slice.tv_nsec >= 1000000000) {
			slice.tv_sec++;
			slice.tv_nsec -= 1000000000;
		}
		bool last = slice.tv_sec > deadline.tv_sec ||
		            (slice.tv_sec == deadline.tv_sec && slice.tv_nsec >= deadline.tv_nsec);
		if (pthread_cond_timedwait(&co->sequence_cv, &co->reg.lock,
		                           last ? &deadline : &slice) != 0 &&
		    last) {
			rv = status_set(st, ST_DEADLINE_EXCEEDED,
			                "step %llu of session %llu waited %d ms for its step %llu, "
			                "which did not come",
			                (unsigned long long)req->sequence,
			                (unsigned long long)req->session, co->step_timeout_ms,
			                (unsigned long long)s->next_sequence);
			break;
		}
	}
	pthread_mutex_unlock(&co->reg.lock);
	return rv;
}

/* The session's next step in its order may run now, whether this one worked or not. */
static void end_turn(struct coordinator *co, const Podemu__StepRequest *req)
{
	if (req->sequence == 0)
		return;
	pthread_mutex_lock(&co->reg.lock);
	struct session *s = session_find(&co->reg, req->session);
	if (s != NULL && s->next_sequence == req->sequence) {
		s->next_sequence++;
		pthread_cond_broadcast(&co->sequence_cv);
	}
	pthread_mutex_unlock(&co->reg.lock);
}

int h_execute_step(void *state, struct arena *a, const void *request, void *reply,
                   struct status *st)
{
	struct coordinator *co = state;
	const Podemu__StepRequest *req = request;
	struct rpc_client **clients;
	char **data_urls;
	bool ran = false;
	uint64_t *released;
	size_t n_released;
	int rv = wait_turn(co, req, st);
	if (rv != ST_OK)
		return rv;
	pthread_mutex_lock(&co->step_lock);
	long long t0 = clock_now_us();
	rv = owned_release_after(co, req, a, &released, &n_released, st);
	if (req->compile_only) { /* nothing is dispatched, so the pod need not be ready */
		if (rv == ST_OK)
			rv = execute_locked(co, a, req, reply, NULL, NULL, &ran, NULL, st);
		pthread_mutex_unlock(&co->step_lock);
		end_turn(co, req);
		return rv;
	}
	struct step_report report = {0};
	if (rv == ST_OK && (rv = snapshot_hosts(co, a, &clients, &data_urls, st)) == ST_OK)
		rv = execute_locked(co, a, req, reply, clients, data_urls, &ran, &report, st);
	count_step(co, rv, (double)(clock_now_us() - t0) / 1e6, &report);
	/* What the client released is gone whether or not the step worked. */
	if (n_released > 0) {
		if (!ran)
			release_on_live_hosts(co, a, released, n_released);
		pthread_mutex_lock(&co->reg.lock);
		for (size_t k = 0; k < n_released; k++)
			registry_remove_handle(&co->reg, released[k]);
		pthread_mutex_unlock(&co->reg.lock);
	}
	pthread_mutex_unlock(&co->step_lock);
	end_turn(co, req);
	if (rv != ST_OK)
		log_info("step failed: %s: %s", status_code_name(rv), st->message);
	return rv;
}
