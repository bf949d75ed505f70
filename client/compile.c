/* The offline compiler in the client library: pe_compile_hlo (compiler/pipeline.c). */
#include <stdio.h>
#include <stdlib.h>

#include "arena.h"
#include "client.h"
#include "pipeline.h"
#include "strategy.h"

void pe_free(void *p)
{
	free(p);
}

int pe_compile_hlo(const char *text, size_t len, const pe_compile_options *o, char **report_json)
{
	pe_compile_options none = {0};
	if (o == NULL)
		o = &none;
	if (report_json == NULL)
		return PE_INVALID_ARGUMENT;
	*report_json = NULL;
	struct status st;
	status_clear(&st);
	struct topology topo;
	int rv = topology_from_preset(&topo, o->topology ? o->topology : "v3-8", &st);
	int strategy =
	    ag_strategy_parse(o->all_gather_strategy ? o->all_gather_strategy : "native");
	if (rv == ST_OK && strategy < 0)
		rv = status_set(&st, ST_INVALID_ARGUMENT,
		                "all_gather_strategy must be native, via-all-reduce or decomposed");
	if (rv == ST_OK && text == NULL)
		rv = status_set(&st, ST_INVALID_ARGUMENT, "no HLO text");
	struct arena *a = arena_new();
	if (a == NULL)
		return PE_RESOURCE_EXHAUSTED;
	/* XLA's combiners merge up to 30 MiB by default, as podemu compile does. */
	struct memplan_options mo = {.tiled = !o->layout_none,
	                             .all_gather = (enum ag_strategy)strategy,
	                             .no_alias = o->no_alias != 0,
	                             .combine_threshold_bytes = 30 << 20};
	struct memplan plan;
	struct hlo_module m;
	if (rv == ST_OK)
		rv = compile_module(&plan, &m, text, len, o->name ? o->name : "module", &topo, &mo,
		                    a, &st);
	struct status oom;
	const struct status *error = rv != ST_OK ? &st : NULL;
	if (rv == ST_OK && !plan.fits) {
		compile_oom_status(&oom, &plan);
		error = &oom;
	}
	size_t size = 0;
	FILE *f = open_memstream(report_json, &size);
	if (f != NULL) {
		memplan_print_json(f, rv == ST_OK ? &plan : NULL, error);
		fclose(f);
	}
	arena_free(a);
	if (f == NULL)
		return PE_RESOURCE_EXHAUSTED;
	return rv;
}
