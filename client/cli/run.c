/*
 * podemu run FILE.hlo: the entry computation of an HLO module as steps on the running pod. The
 * parameters become device buffers first (filled with --fill, or from per-core files); then
 * every instruction is recorded with the client library and the whole computation runs as one
 * step. Prints each output per core (element count, sum, first values) and the step's peak
 * HBM per core beside the plan's.
 */
#include "run.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "compile.h"
#include "dtype.h"
#include "hlo.h"
#include "record.h"
#include "strategy.h"
#include "podemu/podemu.h"

/* A parameter: --fill everywhere, or DIR/param<N>.core<R>.bin per core. */
static pe_tensor *parameter(struct runner *r, const struct run_options *o,
                            const struct hlo_instruction *in)
{
	const struct hlo_shape *s = &in->shape;
	int dtype = pe_type(s->type);
	if (s->type == HT_TUPLE || dtype < 0) {
		unimplemented(r, in, "only array parameters of f32, bf16, s32, u32, u8, pred");
		return NULL;
	}
	char layout[256];
	hlo_layout_format(layout, sizeof(layout), s);
	if (o->param_dir == NULL) {
		pe_tensor *t = pe_full(r->c, dtype, s->dims, s->rank, o->fill);
		return t != NULL && set_layout(r, in, t, s) == ST_OK ? t : NULL;
	}
	int world = pe_world_size(r->c);
	size_t bytes = (size_t)hlo_shape_elements(s) * dtype_size(dtype);
	void **per_core = calloc((size_t)world, sizeof(void *));
	pe_tensor *t = NULL;
	int k = 0;
	for (; per_core != NULL && k < world; k++) {
		char path[4096];
		snprintf(path, sizeof(path), "%s/param%lld.core%d.bin", o->param_dir,
		         (long long)in->parameter_number, k);
		FILE *f = fopen(path, "rb");
		per_core[k] = malloc(bytes + 1);
		size_t got = f && per_core[k] ? fread(per_core[k], 1, bytes + 1, f) : 0;
		if (f != NULL)
			fclose(f);
		if (got != bytes) {
			status_set(&r->st, ST_INVALID_ARGUMENT,
			           "%s: expected %zu bytes (%s of parameter %lld), found %zu", path,
			           bytes, hlo_type_name(s->type), (long long)in->parameter_number,
			           got);
			break;
		}
	}
	if (per_core != NULL && k == world)
		t = pe_upload_layout(r->c, dtype, s->dims, s->rank, layout,
		                     (const void *const *)per_core);
	for (int j = 0; per_core != NULL && j < world; j++)
		free(per_core[j]);
	free(per_core);
	return t;
}

static void print_output(const struct runner *r, const struct run_options *o, int index,
                         pe_tensor *t, bool *first)
{
	pe_dtype dtype;
	int64_t dims[PE_MAX_RANK];
	int rank;
	pe_tensor_shape(t, &dtype, dims, &rank);
	int64_t bytes = pe_tensor_bytes(t);
	size_t es = dtype_size(dtype);
	int64_t count = (int64_t)((size_t)bytes / es);
	unsigned char *buf = malloc((size_t)bytes + 1);
	int world = pe_world_size(r->c);
	for (int core = 0; buf != NULL && core < world; core++) {
		int rv = pe_fetch(t, core, buf, (size_t)bytes);
		double sum = 0;
		for (int64_t i = 0; rv == PE_OK && i < count; i++)
			sum += dtype_load(dtype, buf, i);
		if (o->json) {
			printf("%s{\"output\": %d, \"core\": %d, \"elements\": %lld, \"sum\": ",
			       *first ? "" : ", ", index, core, (long long)count);
			if (rv == PE_OK && isfinite(sum))
				printf("%.17g}", sum);
			else
				printf("null}");
			*first = false;
		} else {
			printf("output %d core %d: %lld elements, sum %s", index, core,
			       (long long)count, rv == PE_OK ? "" : "(no bytes: --backing none)");
			if (rv == PE_OK) {
				printf("%.9g, first", sum);
				for (int64_t i = 0; i < count && i < 4; i++)
					printf(" %.9g", dtype_load(dtype, buf, i));
			}
			printf("\n");
		}
	}
	free(buf);
}

/*
 * Releases what the step does not give back: the elements of a while's, call's or
 * conditional's result that are no output, and every value that is neither an output nor a
 * parameter. A parameter the module gives to its outputs (input_output_alias, buffer_donor) is
 * released with the step too, so its buffer may become an output (donated); the other
 * parameters go to after[] (*n_after of them), to be released once the step has run, as a
 * caller's arguments are.
 */
static int release_temporaries(struct runner *r, pe_tensor *const *outs, int n_out,
                               pe_tensor **after, int *n_after)
{
	const struct hlo_module *m = r->m;
	const struct hlo_computation *c = m->entry;
	bool *donated = calloc((size_t)c->n_parameters + 1, sizeof(bool));
	if (donated == NULL)
		return status_set(&r->st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int k = 0; k < m->n_aliases; k++)
		if (m->aliases[k].parameter < c->n_parameters)
			donated[m->aliases[k].parameter] = true;
	for (int k = 0; k < m->n_donors; k++)
		if (m->donors[k].parameter < c->n_parameters)
			donated[m->donors[k].parameter] = true;
	for (int i = 0; i < c->n_instructions; i++)
		for (int e = 0; r->vals[i].own_elems && e < r->vals[i].n; e++) {
			bool kept = false;
			for (int k = 0; k < n_out; k++)
				kept |= outs[k] == r->vals[i].elems[e];
			if (!kept) {
				for (int j = 0; j < c->n_instructions; j++)
					if (r->vals[j].t == r->vals[i].elems[e])
						r->vals[j].t = NULL; /* a get-tuple-element of it */
				pe_release(r->vals[i].elems[e]);
				r->vals[i].elems[e] = NULL;
			}
		}
	for (int i = 0; i < c->n_instructions; i++) {
		pe_tensor *t = r->vals[i].t;
		bool kept = false;
		for (int k = 0; k < n_out; k++)
			kept |= outs[k] == t;
		/* An alias of an earlier value (a get-tuple-element) is that value's. */
		for (int j = 0; j < i && !kept; j++)
			kept |= r->vals[j].t == t;
		int64_t p = c->instructions[i]->parameter_number;
		if (!kept && t != NULL && p >= 0 && !donated[p])
			after[(*n_after)++] = t;
		else if (!kept && t != NULL)
			pe_release(t);
	}
	free(donated);
	return ST_OK;
}

/* Every output per core, then each core's peak HBM beside the plan's. */
static void print_report(const struct runner *r, const struct run_options *o,
                         pe_tensor *const *outs, int n_out, const pe_step_plan *plan)
{
	bool first = true;
	if (o->json)
		printf("{\"outputs\": [");
	for (int k = 0; k < n_out; k++)
		print_output(r, o, k, outs[k], &first);
	int world = pe_world_size(r->c);
	pe_memory_info *mi = calloc((size_t)world, sizeof(*mi));
	if (mi != NULL && pe_memory_info_all(r->c, mi, world) == PE_OK) {
		if (o->json)
			printf("], \"planned_peak_bytes\": %lld, \"cores\": [",
			       (long long)plan->peak_bytes);
		for (int k = 0; k < world; k++) {
			if (o->json)
				printf("%s{\"ordinal\": %d, \"peak_bytes_in_use\": %lld}",
				       k ? ", " : "", k, (long long)mi[k].peak_bytes_in_use);
			else
				printf("core %d: peak %lld bytes in use, planned %lld\n", k,
				       (long long)mi[k].peak_bytes_in_use,
				       (long long)plan->peak_bytes);
		}
		if (o->json)
			printf("]}\n");
	} else if (o->json) {
		printf("]}\n");
	}
	free(mi);
}

int cmd_run(const struct run_options *o)
{
	struct status st;
	status_clear(&st);
	size_t len;
	char *text = cli_read_file(o->file, &len, &st);
	struct arena *a = arena_new();
	struct hlo_module m;
	int rv = text == NULL ? st.code : a == NULL ? ST_RESOURCE_EXHAUSTED : ST_OK;
	if (rv == ST_OK)
		rv = hlo_parse(text, len, a, &m, &st);
	if (rv != ST_OK) {
		fprintf(stderr, "podemu run: %s: %s: %s\n", o->file, status_code_name(rv),
		        st.message);
		arena_free(a);
		free(text);
		return 2;
	}
	int strategy =
	    ag_strategy_parse(o->all_gather_strategy ? o->all_gather_strategy : "native");
	int lowered = 0;
	if (strategy < 0)
		rv = status_set(
		    &st, ST_INVALID_ARGUMENT,
		    "--all-gather-strategy must be native, via-all-reduce or decomposed");
	if (rv != ST_OK) {
		fprintf(stderr, "podemu run: %s\n", st.message);
		arena_free(a);
		free(text);
		return 2;
	}
	struct runner r = {.m = &m};
	status_clear(&r.st);
	if (pe_connect(&r.c, NULL) != PE_OK) {
		fprintf(stderr, "podemu run: %s\n", pe_connect_error());
		arena_free(a);
		free(text);
		return 1;
	}
	/* The strategy's instructions, lowered as `podemu compile` lowers them. */
	if (strategy != AG_NATIVE &&
	    strategy_lower(&m, (enum ag_strategy)strategy, false, pe_world_size(r.c), &lowered, a,
	                   &st) != ST_OK) {
		fprintf(stderr, "podemu run: %s: %s\n", status_code_name(st.code), st.message);
		pe_disconnect(r.c);
		arena_free(a);
		free(text);
		return 2;
	}
	const struct hlo_computation *c = m.entry;
	r.vals = calloc((size_t)c->n_instructions, sizeof(*r.vals));
	rv =
	    r.vals == NULL ? status_set(&r.st, ST_RESOURCE_EXHAUSTED, "out of host memory") : ST_OK;
	/* The parameters first, as device buffers: the arguments of the step. */
	for (int i = 0; rv == ST_OK && i < c->n_parameters; i++) {
		const struct hlo_instruction *p = c->parameters[i];
		if ((r.vals[p->index].t = parameter(&r, o, p)) == NULL)
			rv = r.st.code != ST_OK
			         ? r.st.code
			         : status_set(&r.st, pe_last_code(r.c), "%s", pe_last_error(r.c));
	}
	if (rv == ST_OK && pe_mark_step(r.c) != PE_OK)
		rv = status_set(&r.st, pe_last_code(r.c), "parameters: %s", pe_last_error(r.c));
	for (int i = 0; rv == ST_OK && i < c->n_instructions; i++)
		if (c->instructions[i]->parameter_number < 0)
			rv = record(&r, c->instructions[i]);
	/* What the root holds is the output; everything else becomes a temporary of the step. */
	const struct value *root = rv == ST_OK ? &r.vals[c->root->index] : NULL;
	int n_out = root == NULL ? 0 : root->elems ? root->n : 1;
	pe_tensor **outs = calloc((size_t)n_out + 1, sizeof(*outs));
	for (int k = 0; outs != NULL && k < n_out; k++)
		outs[k] = root->elems ? root->elems[k] : root->t;
	pe_tensor **after = calloc((size_t)c->n_parameters + 1, sizeof(*after));
	int n_after = 0;
	if (rv == ST_OK)
		rv = after == NULL || outs == NULL
		         ? status_set(&r.st, ST_RESOURCE_EXHAUSTED, "out of host memory")
		         : release_temporaries(&r, outs, n_out, after, &n_after);
	pe_step_plan plan;
	if (rv == ST_OK && pe_plan_step(r.c, &plan) != PE_OK)
		rv = status_set(&r.st, pe_last_code(r.c), "%s", pe_last_error(r.c));
	if (rv == ST_OK && !plan.fits)
		rv = status_set(&r.st, ST_RESOURCE_EXHAUSTED, "%s", plan.oom_message);
	if (rv == ST_OK && pe_mark_step(r.c) != PE_OK)
		rv = status_set(&r.st, pe_last_code(r.c), "%s", pe_last_error(r.c));
	for (int k = 0; k < n_after; k++)
		pe_release(after[k]);
	free(after);
	int code = 0;
	if (rv != ST_OK) {
		fprintf(stderr, "podemu run: %s: %s\n", status_code_name(rv), r.st.message);
		code = rv == ST_RESOURCE_EXHAUSTED ? 1 : 2;
	} else {
		print_report(&r, o, outs, n_out, &plan);
	}
	for (int i = 0; r.vals != NULL && i < c->n_instructions; i++)
		free(r.vals[i].elems);
	free(r.vals);
	free(outs);
	pe_disconnect(r.c);
	arena_free(a);
	free(text);
	return code;
}
