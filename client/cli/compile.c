#include "compile.h"

#include <stdio.h>
#include <stdlib.h>

#include "arena.h"
#include "hlo.h"
#include "memplan.h"
#include "pipeline.h"
#include "progress.h"

/* HLO text larger than this is refused (a 10,000-instruction module is about 1 MiB). */
#define MAX_HLO_BYTES (256 << 20)

char *cli_read_file(const char *path, size_t *len, struct status *st)
{
	FILE *f = fopen(path, "rb");
	if (f == NULL) {
		status_set(st, ST_NOT_FOUND, "cannot open %s", path);
		return NULL;
	}
	size_t cap = 1 << 16, n = 0;
	char *buf = malloc(cap);
	while (buf != NULL) {
		n += fread(buf + n, 1, cap - n, f);
		if (n < cap)
			break;
		if (cap >= MAX_HLO_BYTES) {
			status_set(st, ST_INVALID_ARGUMENT, "%s is larger than %d MiB", path,
			           MAX_HLO_BYTES >> 20);
			free(buf);
			buf = NULL;
			break;
		}
		char *more = realloc(buf, cap * 2);
		if (more == NULL) {
			free(buf);
			buf = NULL;
		}
		buf = more;
		cap *= 2;
	}
	if (buf == NULL && st->code == ST_OK)
		status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory reading %s", path);
	fclose(f);
	*len = n;
	return buf;
}

int cmd_compile(const struct compile_options *o, const struct topology *topo)
{
	struct status st;
	status_clear(&st);
	size_t len = 0;
	char *text = cli_read_file(o->file, &len, &st);
	struct arena *a = arena_new();
	struct memplan plan;
	struct hlo_module m;
	int rv = text == NULL ? st.code : a == NULL ? ST_RESOURCE_EXHAUSTED : ST_OK;
	struct memplan_options mo = {.tiled = o->tiled,
	                             .chunk_bytes = o->chunk_bytes,
	                             .all_gather = (enum ag_strategy)o->all_gather,
	                             .no_alias = o->no_alias,
	                             .combine_threshold_bytes = o->combine_threshold_bytes,
	                             .no_fusion = o->no_fusion,
	                             .recorded_order = o->recorded_order};
	/* A big module takes a moment: say what is going on (on a terminal only). */
	progress_enable(o->json);
	if (rv == ST_OK && len > (4u << 20))
		progress_show("podemu compile: reading and planning %s (%.1f MiB)...", o->file,
		              (double)len / (1 << 20));
	if (rv == ST_OK)
		rv = compile_module(&plan, &m, text, len, o->file, topo, &mo, a, &st);
	progress_clear();
	int code = rv == ST_OK ? (plan.fits ? 0 : 1) : 2;
	for (int k = 0; rv == ST_OK && !o->json && k < plan.n_warnings; k++)
		fprintf(stderr, "podemu compile: warning: %s: line %d: %s\n", o->file,
		        plan.warnings[k].line, plan.warnings[k].text);
	if (rv == ST_OK && o->svg != NULL) {
		FILE *svg = fopen(o->svg, "w");
		if (svg == NULL) {
			fprintf(stderr, "podemu mem: cannot write %s\n", o->svg);
			code = 2;
		} else {
			memplan_write_svg(svg, &plan, topo, m.name);
			if (fclose(svg) != 0) {
				fprintf(stderr, "podemu mem: cannot write %s\n", o->svg);
				code = 2;
			}
		}
	}
	if (o->json) {
		struct status oom;
		const struct status *error = rv != ST_OK ? &st : NULL;
		if (rv == ST_OK && !plan.fits) {
			compile_oom_status(&oom, &plan);
			error = &oom;
		}
		memplan_print_json(stdout, rv == ST_OK ? &plan : NULL, error);
	} else if (rv != ST_OK) {
		fprintf(stderr, "podemu compile: %s: %s\n", status_code_name(rv), st.message);
	} else {
		memplan_print_text(plan.fits ? stdout : stderr, &plan, topo);
	}
	arena_free(a);
	free(text);
	return code;
}
