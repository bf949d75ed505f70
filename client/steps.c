/*
 * Steps: the pending graph cut into a step and run on the pod (pe_mark_step), planned only
 * (pe_plan_step), or sent without waiting for it (pe_mark_step_async), and what the last step
 * left for pe_last_step_*.
 */
#include "podemu/podemu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "client.h"
#include "graph.h"
#include "podemu.pb-c.h"
#include "rpc.h"
#include "services.h"
#include "status.h"

#define STEP_TIMEOUT_MS (3600 * 1000)

/* The pending graph's collective nodes, in recording order (malloc'd; NULL without memory). */
static int *collective_nodes(const pe_client *c, int *n)
{
	int *list = malloc(((size_t)c->num_nodes + 1) * sizeof(int));
	*n = 0;
	for (int i = 0; list != NULL && i < c->num_nodes; i++)
		if (opcode_is_collective(opcode_parse(c->nodes[i]->opcode)))
			list[(*n)++] = i;
	return list;
}

/*
 * Keeps the step's per-collective timings (max over cores) for pe_last_step_collectives;
 * colls: the step's collective nodes (collective_nodes).
 */
static void record_collectives(pe_client *c, const int *colls, int n, const Podemu__StepReply *rep)
{
	if (colls == NULL)
		n = 0;
	free(c->coll_micros);
	free(c->coll_algorithms);
	free(c->coll_scratch);
	free(c->coll_on_core);
	c->coll_micros = calloc((size_t)n + 1, sizeof(int64_t));
	c->coll_algorithms = calloc((size_t)n + 1, sizeof(char *));
	c->coll_scratch = calloc((size_t)n + 1, sizeof(int64_t));
	c->coll_on_core = calloc(rep->n_timings + 1, sizeof(*c->coll_on_core));
	c->num_colls = 0;
	c->num_coll_on_core = 0;
	if (!c->coll_micros || !c->coll_algorithms || !c->coll_scratch || !c->coll_on_core)
		return;
	for (int k = 0; k < n; k++) {
		int i = colls[k];
		for (size_t t = 0; t < rep->n_timings; t++) {
			const Podemu__CollectiveTiming *ct = rep->timings[t];
			if (ct->node != i)
				continue;
			if (ct->micros > c->coll_micros[k])
				c->coll_micros[k] = ct->micros;
			c->coll_on_core[c->num_coll_on_core++] = (struct coll_on_core){
			    k, ct->ordinal, ct->started_micros, ct->ended_micros};
			if (c->coll_algorithms[k] == NULL)
				c->coll_algorithms[k] = arena_strdup(c->long_arena, ct->algorithm);
		}
		if ((size_t)i < rep->n_node_scratch_bytes)
			c->coll_scratch[k] = rep->node_scratch_bytes[i];
	}
	c->num_colls = n;
	c->receive = (pe_receive_info){.reserved_bytes = rep->receive_bytes,
	                               .peak_host_bytes = rep->receive_peak_bytes,
	                               .outside_chunks = rep->receive_outside_chunks};
}

void pe_last_step_receive(pe_client *c, pe_receive_info *out)
{
	*out = c->receive;
}

int pe_last_step_collectives(pe_client *c, int64_t *micros, const char **algorithms, int max)
{
	for (int k = 0; k < c->num_colls && k < max; k++) {
		if (micros)
			micros[k] = c->coll_micros[k];
		if (algorithms)
			algorithms[k] = c->coll_algorithms[k] ? c->coll_algorithms[k] : "";
	}
	return c->num_colls;
}

int64_t pe_last_step_collectives_span(pe_client *c, int first, int last)
{
	if (first < 0 || last < first || last >= c->num_colls)
		return -1;
	int cores = 0;
	for (size_t i = 0; i < c->num_coll_on_core; i++)
		if (c->coll_on_core[i].ordinal >= cores)
			cores = c->coll_on_core[i].ordinal + 1;
	int64_t *start = malloc(((size_t)cores + 1) * sizeof(int64_t));
	if (start == NULL)
		return -1;
	for (int r = 0; r < cores; r++)
		start[r] = INT64_MIN;
	for (size_t i = 0; i < c->num_coll_on_core; i++)
		if (c->coll_on_core[i].k == first && c->coll_on_core[i].ordinal >= 0)
			start[c->coll_on_core[i].ordinal] = c->coll_on_core[i].start;
	int64_t span = -1;
	for (size_t i = 0; i < c->num_coll_on_core; i++) {
		const struct coll_on_core *e = &c->coll_on_core[i];
		if (e->k == last && e->ordinal >= 0 && start[e->ordinal] != INT64_MIN &&
		    e->end - start[e->ordinal] > span)
			span = e->end - start[e->ordinal];
	}
	free(start);
	return span;
}

int64_t pe_last_step_scratch_bytes(pe_client *c, int k)
{
	return k >= 0 && k < c->num_colls ? c->coll_scratch[k] : 0;
}

/* The pending graph as a step: its outputs are the nodes of the tensors still held. */
struct pending_step {
	Podemu__Graph graph;
	pe_tensor **holders; /* [graph.n_outputs], malloc'd */
};

static int pending_step(pe_client *c, struct pending_step *p)
{
	int num_outputs = 0;
	for (pe_tensor *t = c->tensors; t != NULL; t = t->next)
		num_outputs += t->node >= 0;
	int32_t *outputs = arena_calloc(c->graph_arena, (size_t)num_outputs + 1, sizeof(int32_t));
	p->holders = calloc((size_t)num_outputs + 1, sizeof(*p->holders));
	if (outputs == NULL || p->holders == NULL) {
		free(p->holders);
		return client_fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
	}
	int k = 0;
	for (pe_tensor *t = c->tensors; t != NULL; t = t->next)
		if (t->node >= 0) {
			p->holders[k] = t;
			outputs[k++] = t->node;
		}
	podemu__graph__init(&p->graph);
	p->graph.nodes = c->nodes;
	p->graph.n_nodes = (size_t)c->num_nodes;
	p->graph.outputs = outputs;
	p->graph.n_outputs = (size_t)num_outputs;
	p->graph.mesh = c->mesh;
	p->graph.n_mesh = c->num_mesh;
	p->graph.computations = c->comps;
	p->graph.n_computations = (size_t)c->num_comps;
	return ST_OK;
}

int pe_mark_step(pe_client *c)
{
	int rv = ST_OK;
	c->code = PE_OK;
	c->error[0] = '\0';
	if (c->recording != 0)
		return client_fail(c, ST_FAILED_PRECONDITION,
		                   "mark_step inside a computation being recorded");
	if ((rv = pe_wait_device_ops(c)) != PE_OK)
		return rv;
	if (c->num_nodes == 0) {
		if (c->num_release > 0)
			rv = client_release_handles(c, c->release_after, c->num_release);
		c->num_release = 0;
		return rv;
	}
	struct pending_step p;
	if ((rv = pending_step(c, &p)) != ST_OK)
		return rv;
	int num_outputs = (int)p.graph.n_outputs;
	Podemu__StepRequest req = PODEMU__STEP_REQUEST__INIT;
	req.session = c->session;
	req.graph = &p.graph;
	req.release_after = c->release_after;
	req.n_release_after = c->num_release;
	struct arena *a;
	void *reply;
	rv = client_call(c, CM_EXECUTE_STEP, &req, &a, &reply, STEP_TIMEOUT_MS);
	Podemu__StepReply *rep = reply;
	if (rv == ST_OK && rep->n_output_handles != (size_t)num_outputs)
		rv = client_fail(c, ST_INTERNAL, "coordinator returned %zu outputs for %d",
		                 rep->n_output_handles, num_outputs);
	for (int i = 0; i < num_outputs; i++) {
		p.holders[i]->node = -1;
		p.holders[i]->handle = rv == ST_OK ? rep->output_handles[i] : 0;
	}
	if (rv == ST_OK) {
		int n;
		int *colls = collective_nodes(c, &n);
		record_collectives(c, colls, n, rep);
		free(colls);
	}
	arena_free(a);
	free(p.holders);
	if (client_graph_reset(c) != ST_OK && rv == ST_OK)
		rv = client_fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
	return rv;
}

int pe_plan_step(pe_client *c, pe_step_plan *out)
{
	memset(out, 0, sizeof(*out));
	c->code = PE_OK;
	c->error[0] = '\0';
	if (c->recording != 0)
		return client_fail(c, ST_FAILED_PRECONDITION,
		                   "plan_step inside a computation being recorded");
	int rv = ST_OK;
	struct pending_step p;
	if ((rv = pending_step(c, &p)) != ST_OK)
		return rv;
	free(p.holders);
	Podemu__StepRequest req = PODEMU__STEP_REQUEST__INIT;
	req.session = c->session;
	req.graph = &p.graph;
	req.compile_only = true;
	/* What mark_step would release may be donated to its outputs: the same plan. */
	req.release_after = c->release_after;
	req.n_release_after = c->num_release;
	struct arena *a;
	void *reply;
	rv = p.graph.n_nodes == 0
	         ? ST_OK
	         : client_call(c, CM_EXECUTE_STEP, &req, &a, &reply, STEP_TIMEOUT_MS);
	if (p.graph.n_nodes == 0) {
		out->fits = 1; /* nothing to run */
		return PE_OK;
	}
	if (rv == ST_OK) {
		const Podemu__StepReply *rep = reply;
		out->argument_bytes = rep->argument_bytes;
		out->output_bytes = rep->output_bytes;
		out->temp_bytes = rep->temp_bytes;
		out->peak_bytes = rep->argument_bytes + rep->output_bytes + rep->temp_bytes;
		out->bytes_limit = rep->bytes_limit;
		out->fits = rep->fits;
		out->combined_collectives = rep->combined_collectives;
		out->delayed_nodes = rep->delayed_nodes;
		out->fused_nodes = rep->fused_nodes;
		out->program_cache_hit = rep->program_cache_hit;
		out->receive_bytes = rep->receive_bytes;
		snprintf(out->oom_message, sizeof(out->oom_message), "%s",
		         rep->oom_message ? rep->oom_message : "");
	}
	arena_free(a);
	return rv;
}

/* ---- Steps sent without waiting (pe_mark_step_async) ---- */

/* A step sent by pe_mark_step_async whose reply has not been taken yet. */
struct async_step {
	struct rpc_async *x;
	struct arena *a; /* the call's: the reply is decoded into it */
	uint64_t sequence;
	uint64_t first_output, end_output; /* the handles it named: [first, end) */
	int *colls;                        /* its collective nodes, for their timings */
	int num_colls;
};

/* Notes the first failure of an asynchronous step, for the call that reports it. */
static void async_failed(pe_client *c, uint64_t sequence, int code, const char *message)
{
	if (c->async_code != ST_OK)
		return;
	c->async_code = code;
	snprintf(c->async_error, sizeof(c->async_error),
	         "step %llu of this session (sent by mark_step_async): %s",
	         (unsigned long long)sequence, message);
}

void client_finish_async(pe_client *c)
{
	struct async_step *s = c->in_flight;
	if (s == NULL)
		return;
	c->in_flight = NULL;
	void *reply = NULL;
	struct status st;
	int rv = rpc_wait(s->x, s->a, &reply, &st);
	const Podemu__StepReply *rep = reply;
	uint64_t n = s->end_output - s->first_output;
	if (rv == ST_OK && rep->n_output_handles != n)
		rv = status_set(&st, ST_INTERNAL, "coordinator returned %zu outputs for %llu",
		                rep->n_output_handles, (unsigned long long)n);
	if (rv == ST_OK) {
		record_collectives(c, s->colls, s->num_colls, rep);
	} else {
		async_failed(c, s->sequence, rv, st.message);
		/* Its outputs have no value; a later step that read them fails too. */
		for (pe_tensor *t = c->tensors; t != NULL; t = t->next)
			if (t->handle >= s->first_output && t->handle < s->end_output)
				t->handle = 0;
	}
	arena_free(s->a);
	free(s->colls);
	free(s);
}

/* The failure of an asynchronous step not reported yet, now reported (PE_OK: none). */
static int report_async(pe_client *c)
{
	if (c->async_code == ST_OK)
		return PE_OK;
	int code = c->async_code;
	c->async_code = ST_OK;
	return client_fail(c, code, "%s", c->async_error);
}

int pe_wait_device_ops(pe_client *c)
{
	client_finish_async(c);
	return report_async(c);
}

/*
 * Sends the pending graph as the session's next step with the output handles named here, so
 * that the step after it can read them before it has run. On failure nothing was sent and the
 * pending graph is as it was.
 */
static int send_async(pe_client *c, struct async_step **out)
{
	struct pending_step p;
	int rv = pending_step(c, &p);
	if (rv != ST_OK)
		return rv;
	size_t n = p.graph.n_outputs;
	struct async_step *s = calloc(1, sizeof(*s));
	uint64_t *named = arena_calloc(c->graph_arena, n + 1, sizeof(uint64_t));
	if (s == NULL || named == NULL || (s->a = arena_new()) == NULL) {
		free(s);
		free(p.holders);
		return client_fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
	}
	for (size_t k = 0; k < n; k++)
		named[k] = c->named_next + k;
	s->sequence = c->step_sequence + 1;
	s->first_output = c->named_next;
	s->end_output = c->named_next + n;
	s->colls = collective_nodes(c, &s->num_colls);
	Podemu__StepRequest req = PODEMU__STEP_REQUEST__INIT;
	req.session = c->session;
	req.graph = &p.graph;
	req.release_after = c->release_after;
	req.n_release_after = c->num_release;
	req.output_handles = named;
	req.n_output_handles = n;
	req.sequence = s->sequence;
	struct status st;
	s->x = rpc_start(c->rpc, &podemu__coordinator__descriptor, CM_EXECUTE_STEP, &req, s->a,
	                 STEP_TIMEOUT_MS, NULL, &st);
	if (s->x == NULL) {
		arena_free(s->a);
		free(s->colls);
		free(s);
		free(p.holders);
		return client_fail_status(c, &st);
	}
	c->step_sequence = s->sequence;
	c->named_next += n;
	for (size_t k = 0; k < n; k++) {
		p.holders[k]->node = -1;
		p.holders[k]->handle = named[k];
	}
	free(p.holders);
	*out = s;
	return ST_OK;
}

int pe_mark_step_async(pe_client *c)
{
	c->code = PE_OK;
	c->error[0] = '\0';
	if (c->recording != 0)
		return client_fail(c, ST_FAILED_PRECONDITION,
		                   "mark_step inside a computation being recorded");
	int outputs = 0;
	for (pe_tensor *t = c->tensors; t != NULL; t = t->next)
		outputs += t->node >= 0;
	/* Nothing to run, or no handles left to name the outputs with: as pe_mark_step. */
	if (c->num_nodes == 0 || c->named_end - c->named_next < (uint64_t)outputs)
		return pe_mark_step(c);
	struct async_step *s;
	int rv = send_async(c, &s);
	if (rv != ST_OK)
		return rv;
	/* The step before it has its reply in meanwhile: at most two are in flight. */
	client_finish_async(c);
	c->in_flight = s;
	if (client_graph_reset(c) != ST_OK)
		return client_fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
	return report_async(c);
}
