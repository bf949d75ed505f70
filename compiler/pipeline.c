#include "pipeline.h"

#include <stdio.h>

#include "hlo.h"

int compile_module(struct memplan *plan, struct hlo_module *m, const char *text, size_t len,
                   const char *name, const struct topology *topo, const struct memplan_options *mo,
                   struct arena *a, struct status *st)
{
	int rv = hlo_parse(text, len, a, m, st);
	if (rv == ST_OK)
		rv = memplan_build(plan, m, topo, mo, a, st);
	if (rv != ST_OK) {
		char msg[STATUS_MESSAGE_MAX];
		snprintf(msg, sizeof(msg), "%s", st->message);
		status_set(st, rv, "%s: %s", name, msg);
	}
	return rv;
}

void compile_oom_status(struct status *oom, const struct memplan *plan)
{
	char used[32], cap[32], over[32];
	status_set(oom, ST_RESOURCE_EXHAUSTED,
	           "Ran out of memory in memory space hbm. Used %s of %s hbm. Exceeded hbm "
	           "capacity by %s.",
	           status_human_bytes(used, plan->peak_bytes),
	           status_human_bytes(cap, plan->capacity),
	           status_human_bytes(over, plan->peak_bytes - plan->capacity));
}
