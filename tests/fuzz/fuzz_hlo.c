/*
 * libFuzzer target: HLO text as `podemu compile` reads it. The text is parsed and, when it
 * parses, planned on a v3-8: with layouts and combining, and without layouts, through
 * all-reduces, without aliasing. Nothing may crash, leak or read out of
 * bounds, whatever the bytes.
 */
#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "hlo.h"
#include "memplan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct arena *a = arena_new();
	if (a == NULL)
		return 0;
	struct hlo_module m;
	struct status st;
	struct topology topo;
	if (hlo_parse((const char *)data, size, a, &m, &st) == ST_OK &&
	    topology_from_preset(&topo, "v3-8", &st) == ST_OK) {
		struct memplan p;
		struct memplan_options o = {.tiled = true, .combine_threshold_bytes = 30 << 20};
		memplan_build(&p, &m, &topo, &o, a, &st);
		o = (struct memplan_options){.all_gather = AG_VIA_ALL_REDUCE,
		                             .no_alias = true,
		                             .combine_threshold_bytes = 1 << 30};
		memplan_build(&p, &m, &topo, &o, a, &st);
	}
	arena_free(a);
	return 0;
}
