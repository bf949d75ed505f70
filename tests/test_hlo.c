/* The HLO text reader, the TPU layout sizes and the memory plan. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hlo.h"
#include "memplan.h"

#define GiB (1LL << 30)
#define MiB (1LL << 20)

static struct arena *a;

static int setup(void **state)
{
	a = arena_new();
	return a == NULL;
}

static int teardown(void **state)
{
	arena_free(a);
	return 0;
}

static int parse(const char *text, struct hlo_module *m, struct status *st)
{
	return hlo_parse(text, strlen(text), a, m, st);
}

static const char *full_module =
    "HloModule jit_step, is_scheduled=true, entry_computation_layout={(f32[8,128]{1,0})->f32[]}\n"
    "\n"
    "// the reducer\n"
    "%region_0.4 (Arg_0.5: f32[], Arg_1.6: f32[]) -> f32[] {\n"
    "  %Arg_0.5 = f32[] parameter(0)\n"
    "  %Arg_1.6 = f32[] parameter(1)\n"
    "  ROOT %add.7 = f32[] add(f32[] %Arg_0.5, f32[] %Arg_1.6), metadata={op_name=\"a, b\"}\n"
    "}\n"
    "\n"
    "ENTRY %main.12 (Arg_0.1: f32[8,128]) -> f32[] {\n"
    "  %Arg_0.1 = f32[8,128]{1,0:T(8,128)} parameter(0), sharding={replicated}\n"
    "  %ag = f32[64,128]{1,0} all-gather(%Arg_0.1), channel_id=3, "
    "replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true\n"
    "  %t = (f32[64,128], f32[8,128]{1,0}) tuple(ag, Arg_0.1)\n"
    "  gte = f32[64,128] get-tuple-element(%t), index=0\n"
    "  %c = f32[] constant(0)\n"
    "  %cc = f32[] custom-call(%c), custom_call_target=\"Sharding, a\", "
    "backend_config=\"{\\\"x\\\": 1}\"\n"
    "  ROOT %r = f32[] reduce(gte, %c), dimensions={0,1}, to_apply=%region_0.4 /* sum */\n"
    "}\n";

static void test_parse_module(void **state)
{
	struct hlo_module m;
	struct status st;
	assert_int_equal(parse(full_module, &m, &st), ST_OK);
	assert_string_equal(m.name, "jit_step");
	assert_int_equal(m.n_computations, 2);
	assert_string_equal(m.entry->name, "main.12");
	const struct hlo_computation *c = m.entry;
	assert_int_equal(c->n_instructions, 7);
	assert_int_equal(c->n_parameters, 1);
	assert_string_equal(c->root->name, "r");
	const struct hlo_instruction *ag = c->instructions[1];
	assert_string_equal(ag->opcode, "all-gather");
	assert_int_equal(ag->shape.dims[0], 64);
	assert_true(ag->has_channel_id && ag->channel_id == 3);
	assert_string_equal(ag->replica_groups, "[1,8]<=[8]");
	assert_true(ag->use_global_device_ids);
	assert_int_equal(ag->n_dimensions, 1);
	assert_ptr_equal(ag->operands[0], c->instructions[0]);
	assert_true(c->instructions[0]->shape.has_layout);
	const struct hlo_instruction *t = c->instructions[2];
	assert_int_equal(t->shape.type, HT_TUPLE);
	assert_int_equal(t->shape.n_tuple, 2);
	assert_int_equal(c->instructions[3]->tuple_index, 0);
	assert_ptr_equal(c->root->to_apply, m.computations[0]);
	char buf[128];
	assert_string_equal(hlo_shape_format(buf, sizeof(buf), &t->shape),
	                    "(f32[64,128], f32[8,128])");
	/* Quoted attribute values (with commas and escaped quotes) are skipped whole. */
	assert_string_equal(c->instructions[5]->opcode, "custom-call");
	assert_int_equal(c->instructions[5]->n_operands, 1);
}

static void expect_error(const char *text, const char *where, const char *what)
{
	struct hlo_module m;
	struct status st;
	assert_int_equal(parse(text, &m, &st), ST_INVALID_ARGUMENT);
	if (strstr(st.message, where) == NULL || strstr(st.message, what) == NULL)
		fail_msg("expected \"%s\" ... \"%s\", got \"%s\"", where, what, st.message);
}

static void test_parse_errors_name_line_and_column(void **state)
{
	expect_error("", "line 1, column 1", "HloModule");
	expect_error("HloModule m\nENTRY e {\n  p = f33[2] parameter(0)\n}\n", "line 3, column 7",
	             "unknown element type 'f33'");
	expect_error("HloModule m\nENTRY e {\n  p = f32[2] parameter(0)\n  ROOT q = f32[2] add(p, "
	             "nope)\n}\n",
	             "line 4, column 26", "q uses nope");
	expect_error("HloModule m\nENTRY e {\n  p = f32[2]{0 parameter(0)\n}\n", "line 3",
	             "unbalanced");
	expect_error("HloModule m\nENTRY e {\n  p = f32[-2] parameter(0)\n}\n", "line 3",
	             "negative");
	expect_error(
	    "HloModule m\nENTRY e {\n  p = f32[2] parameter(0)\n  p = f32[2] negate(p)\n}\n",
	    "line 4", "defined twice");
	expect_error("HloModule m\nENTRY e {\n  p = f32[99999999999999] parameter(0)\n}\n",
	             "line 3", "larger than");
	expect_error("HloModule m\nENTRY e {\n  p = f32[2] parameter(0)\n", "line 4", "not closed");
	expect_error(
	    "HloModule m\nENTRY e {\n  p = f32[2] parameter(0)\n  ROOT r = f32[] reduce(p), "
	    "to_apply=missing\n}\n",
	    "line 4", "to_apply=missing is not defined");
	expect_error("HloModule m\nc {\n  p = f32[] parameter(0)\n}\nc {\n  p = f32[] "
	             "parameter(0)\n}\n",
	             "line 5", "computation c is defined twice");
	expect_error("HloModule m\nENTRY e {\n  p = f32[2] parameter(1)\n}\n", "line 2",
	             "parameter numbers");
	expect_error(
	    "HloModule m\nENTRY e {\n  q = f32[2] negate(p)\n  p = f32[2] parameter(0)\n}\n",
	    "line 3, column 21", "defined after it");
}

/* A layout alone (as the pod's graph carries it): read onto a shape, and written back. */
static void test_layout_text(void **state)
{
	(void)state;
	struct status st;
	int64_t dims[] = {4, 256};
	struct hlo_shape s = {.type = HT_F32, .rank = 2, .dims = dims};
	assert_int_equal(hlo_parse_layout(&s, "{1,0:T(8,128)(2,1)E(32)S(1)}", a, &st), ST_OK);
	assert_int_equal(s.n_tiles, 2);
	assert_int_equal(s.memory_space, 1);
	char buf[128];
	assert_string_equal(hlo_layout_format(buf, sizeof(buf), &s),
	                    "{1,0:T(8,128)(2,1)E(32)S(1)}");
	struct hlo_shape t = {.type = HT_F32, .rank = 2, .dims = dims};
	assert_int_equal(hlo_parse_layout(&t, "{0}", a, &st), ST_INVALID_ARGUMENT);
	assert_string_equal(
	    st.message, "layout {0} of f32[4,256]: column 1: the layout names 1 of 2 dimensions");
	struct hlo_shape u = {.type = HT_F32, .rank = 2, .dims = dims};
	assert_int_equal(hlo_parse_layout(&u, "{1,0} x", a, &st), ST_INVALID_ARGUMENT);
	assert_string_equal(
	    st.message, "layout {1,0} x of f32[4,256]: column 7: unexpected text after the layout");
	struct hlo_shape v = {.type = HT_F32, .rank = 2, .dims = dims};
	assert_string_equal(hlo_layout_format(buf, sizeof(buf), &v), "");
}

static void test_layout_bytes(void **state)
{
	struct hlo_module m;
	struct status st;
	assert_int_equal(parse("HloModule m\nENTRY e {\n"
	                       "  a = f32[12582912,1]{1,0} parameter(0)\n"
	                       "  b = f32[134217728] parameter(1)\n"
	                       "  c = f32[98304,128] parameter(2)\n"
	                       "  d = f32[1000] parameter(3)\n"
	                       "  e = bf16[8,128] parameter(4)\n"
	                       "  f = f32[1,12582912]{0,1} parameter(5)\n"
	                       "  g = f32[] parameter(6)\n"
	                       "  ROOT t = (f32[], f32[]) tuple(g, g)\n}\n",
	                       &m, &st),
	                 ST_OK);
	struct hlo_instruction **p = m.entry->parameters;
	/* pytorch/xla 1965: a minor dimension of 1 pads to 128. */
	assert_int_equal(layout_bytes(&p[0]->shape, true), 6 * GiB);
	assert_int_equal(layout_bytes(&p[0]->shape, false), 48 * MiB);
	assert_int_equal(layout_bytes(&p[1]->shape, true), 512 * MiB); /* 1-D: 1024-element tiles */
	assert_int_equal(layout_bytes(&p[2]->shape, true), 48 * MiB);  /* reshaped: no padding */
	assert_int_equal(layout_bytes(&p[3]->shape, true), 4096);
	assert_int_equal(layout_bytes(&p[4]->shape, true), 16 * 128 * 2); /* bf16 rows packed */
	assert_int_equal(layout_bytes(&p[5]->shape, true), 6 * GiB);      /* layout {0,1} */
	assert_int_equal(layout_bytes(&p[6]->shape, true), 4);
}

/* What XLA prints and podemu must read: every form below comes from real dumps. */
static const char *xla_forms =
    "HloModule jit_train_step, is_scheduled=true,\n"
    "  entry_computation_layout={(f32[3]{0:T(256)}, s32[]{:T(128)})->(f32[3]{0:T(256)}, s32[])},\n"
    "  input_output_alias={ {0}: (0, {}, may-alias), {1}: (1, {}, must-alias) },\n"
    "  buffer_donor={ (1, {}) }\n"
    "\n"
    "%body.1 (state: (f32[3], s32[])) -> (f32[3], s32[]) {\n"
    "  %state = (f32[3]{0}, s32[]) parameter(0)\n"
    "  x = get-tuple-element(%state), index=0\n"
    "  %i = s32[] get-tuple-element((f32[3]{0}, s32[]) %state), index=1\n"
    "  %one = s32[] constant(1)\n"
    "  %next = add(%i, %one)\n"
    "  %y = f32[3]{0} multiply(f32[3]{0} %x,\n"
    "                          f32[3]{0} %x),\n"
    "      metadata={op_name=\"jit(step)/mul\" source_file=\"a.py\" source_line=3}\n"
    "  ROOT %t = tuple(%y, %next)\n"
    "}\n"
    "%cond.2 (s: (f32[3], s32[])) -> pred[] {\n"
    "  %s = (f32[3], s32[]) parameter(0)\n"
    "  %k = s32[] get-tuple-element(%s), index=1\n"
    "  %ten = s32[] constant(10)\n"
    "  ROOT %lt = pred[] compare(%k, %ten), direction=LT\n"
    "}\n"
    "ENTRY %main.3 (p0: f32[3], p1: s32[]) -> (f32[3], s32[]) {\n"
    "  %p0 = f32[3]{0} parameter(0), sharding={replicated}\n"
    "  %p1 = s32[] parameter(1)\n"
    "  %hi = f32[2,1,1,1,1,1,1,1,1,128]{9,8,7,6,5,4,3,2,1,0:T(2,128)} broadcast(%p0), "
    "dimensions={}\n"
    "  %dyn = f32[<=16,128]{1,0:T(8,128)S(1)} broadcast(%p1), dimensions={}\n"
    "  %packed = s4[1024]{0:T(1024)E(4)} broadcast(%p1), dimensions={}\n"
    "  %init = tuple(%p0, %p1), control-predecessors={%dyn}\n"
    "  %w = (f32[3]{0}, s32[]) while(%init), condition=%cond.2, body=%body.1,\n"
    "      backend_config={\"known_trip_count\":{\"n\":\"10\"}}\n"
    "  %ags = (f32[3]{0}, f32[24]{0}) all-gather-start(%p0), channel_id=1,\n"
    "      replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true\n"
    "  %agd = all-gather-done(%ags)\n"
    "  %wx = get-tuple-element(%w), index=0\n"
    "  ROOT %out = (f32[3]{0}, s32[]) tuple(%wx, %p1)\n"
    "}\n";

static void test_parse_xla_forms(void **state)
{
	struct hlo_module m;
	struct status st;
	int rv = parse(xla_forms, &m, &st);
	if (rv != ST_OK)
		fail_msg("%s", st.message);
	assert_true(m.is_scheduled);
	assert_int_equal(m.n_aliases, 2);
	assert_int_equal(m.aliases[1].output_index[0], 1);
	assert_int_equal(m.aliases[1].parameter, 1);
	assert_true(m.aliases[1].must);
	assert_false(m.aliases[0].must);
	assert_int_equal(m.n_donors, 1);
	assert_int_equal(m.donors[0].parameter, 1);
	struct hlo_computation *body = hlo_find_computation(&m, "body.1");
	/* Shapes XLA infers: x from the state, next from its operands, t from both. */
	assert_true(body->instructions[1]->shape_inferred);
	assert_int_equal(body->instructions[1]->shape.dims[0], 3);
	assert_int_equal(body->instructions[4]->shape.type, HT_S32);
	assert_int_equal(body->root->shape.type, HT_TUPLE);
	assert_int_equal(body->root->shape.n_tuple, 2);
	assert_int_equal(body->instructions[5]->n_operands, 2); /* over two lines */
	struct hlo_computation *e = m.entry;
	/* The entry layout gives p0 its tile T(256): 1 KiB, not 4 KiB. */
	assert_int_equal(e->parameters[0]->shape.n_tiles, 1);
	assert_int_equal(layout_bytes(&e->parameters[0]->shape, true), 1024);
	const struct hlo_instruction *hi = e->instructions[2], *dyn = e->instructions[3],
	                             *packed = e->instructions[4], *init = e->instructions[5],
	                             *w = e->instructions[6], *agd = e->instructions[8];
	assert_int_equal(hi->shape.rank, 10);
	/* T(2,128) on [...,1,128]: the second-minor 1 pads to 2: 2 x 2 x 128 x 4 bytes. */
	assert_int_equal(layout_bytes(&hi->shape, true), 2 * 2 * 128 * 4);
	assert_true(dyn->shape.dynamic[0]);
	assert_int_equal(dyn->shape.dims[0], 16);
	assert_int_equal(dyn->shape.memory_space, 1);
	assert_false(layout_in_hbm(&dyn->shape));
	assert_int_equal(layout_bytes(&packed->shape, true), 512); /* E(4): two to a byte */
	assert_int_equal(init->n_control_predecessors, 1);
	assert_ptr_equal(init->control_predecessors[0], dyn);
	assert_ptr_equal(hlo_callee(w, CALL_BODY, 0), body);
	assert_ptr_equal(hlo_callee(w, CALL_CONDITION, 0), hlo_find_computation(&m, "cond.2"));
	assert_int_equal(agd->shape.dims[0], 24); /* the start's result */
	/* An unbounded dimension is named, with what to write instead. */
	expect_error("HloModule m\nENTRY e {\n  p = f32[1,?] parameter(0)\n}\n",
	             "line 3, column 13", "unbounded ('?')");
	expect_error(
	    "HloModule m\nENTRY e {\n  p = f32[2] parameter(0)\n  ROOT r = convert(p)\n}\n",
	    "line 4", "cannot infer");
	expect_error(
	    "HloModule m\nENTRY e {\n  p = f32[2] parameter(0)\n  ROOT w = f32[2] while(p), "
	    "body=nowhere, condition=nowhere\n}\n",
	    "line 4", "body=nowhere is not defined");
}

static bool no_fusion;               /* plan() with --fusion none */
static bool recorded;                /* plan() with --scheduler recorded */
static const char *forced_algorithm; /* plan() with --collective-algo */

static int plan(const char *text, const char *topology, struct memplan *p)
{
	struct hlo_module m;
	struct status st;
	struct topology topo;
	assert_int_equal(topology_from_preset(&topo, topology, &st), ST_OK);
	int rv = parse(text, &m, &st);
	if (rv != ST_OK)
		fail_msg("%s", st.message);
	struct memplan_options o = {.alignment = 1,
	                            .tiled = true,
	                            .no_fusion = no_fusion,
	                            .recorded_order = recorded,
	                            .collective_algorithm = forced_algorithm};
	rv = memplan_build(p, &m, &topo, &o, a, &st);
	if (rv != ST_OK)
		fail_msg("%s", st.message);
	return rv;
}

/* The seed scenario (pytorch/xla 3510) as HLO: input + output, exactly. */
static void test_plan_seed_all_gather(void **state)
{
	struct memplan p;
	plan("HloModule seed\nENTRY main {\n"
	     "  p0 = f32[134217728]{0} parameter(0)\n"
	     "  ROOT ag = f32[1073741824]{0} all-gather(p0), replica_groups={{0,1,2,3,4,5,6,7}}, "
	     "dimensions={0}\n}\n",
	     "v3-8", &p);
	assert_int_equal(p.peak_bytes, 4 * GiB + 512 * MiB);
	assert_int_equal(p.argument_bytes, 512 * MiB);
	assert_int_equal(p.output_bytes, 4 * GiB);
	assert_int_equal(p.temp_bytes, 0);
	assert_int_equal(p.receive_bytes, 0);
	assert_int_equal(p.sent_bytes, 4 * GiB / 8 * 7);
	assert_true(p.fits);
	assert_int_equal(p.n_peak_live, 2);
	assert_string_equal(p.buffers[p.peak_live[0]].def->name, "ag");
}

/*
 * Receive slots and workspace of reduce-scatters over one member per host of a v3-32 (4
 * hosts x 8 cores). Direct (each core sends block q to member q at once, and sums what it
 * gets): no workspace; every core of host 0 receives a 1 MiB block from each other host, 8
 * chunks from each, within the stream's credit of 4 x 8: three slots of 1 MiB per core, at
 * the top of the reservation. Five of them: 40 chunks from each host, capped by the credit:
 * 12 per core. As a ring (forced): one peer host, staging of 4 chunks. (One host receives
 * nothing from another: the seed's plan on a v3-8 has none.)
 */
static void test_plan_receive_slots(void **state)
{
	static const char *rs =
	    "  rs%d = f32[262144]{0} reduce-scatter(p0), replica_groups={{0,8,16,24},{1,9,17,25},"
	    "{2,10,18,26},{3,11,19,27},{4,12,20,28},{5,13,21,29},{6,14,22,30},{7,15,23,31}}, "
	    "dimensions={0}, to_apply=add\n";
	static const struct {
		int count;
		const char *algorithm;
		int slots;
		int64_t workspace;
	} cases[] = {{1, NULL, 3, 0}, {5, NULL, 12, 0}, {1, "ring", 3, 4 * MiB}};
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		char text[8192], line[512];
		int at = snprintf(text, sizeof(text),
		                  "HloModule rs\nadd {\n  a = f32[] parameter(0)\n  b = f32[] "
		                  "parameter(1)\n  ROOT s = f32[] add(a, b)\n}\nENTRY main {\n"
		                  "  p0 = f32[1048576]{0} parameter(0)\n");
		for (int k = 1; k <= cases[c].count; k++) {
			snprintf(line, sizeof(line), rs, k);
			at += snprintf(text + at, sizeof(text) - (size_t)at, "%s", line);
		}
		at += snprintf(text + at, sizeof(text) - (size_t)at, "  ROOT t = (");
		for (int k = 1; k <= cases[c].count; k++)
			at += snprintf(text + at, sizeof(text) - (size_t)at, "%sf32[262144]",
			               k > 1 ? ", " : "");
		at += snprintf(text + at, sizeof(text) - (size_t)at, ") tuple(");
		for (int k = 1; k <= cases[c].count; k++)
			at += snprintf(text + at, sizeof(text) - (size_t)at, "%srs%d",
			               k > 1 ? ", " : "", k);
		snprintf(text + at, sizeof(text) - (size_t)at, ")\n}\n");
		struct memplan p;
		forced_algorithm = cases[c].algorithm;
		plan(text, "v3-32", &p);
		forced_algorithm = NULL;
		assert_int_equal(p.receive_slots, cases[c].slots);
		assert_int_equal(p.receive_slot_bytes, 1 * MiB);
		assert_int_equal(p.receive_bytes, p.receive_slots * MiB);
		assert_int_equal(p.receive_offset + p.receive_bytes, p.temp_bytes);
		assert_int_equal(p.peak_scratch, cases[c].workspace);
		assert_int_equal(p.peak_bytes,
		                 p.argument_bytes + p.output_bytes + p.temp_bytes - p.alias_bytes);
	}
}

/*
 * The seed's all-gather through an all-reduce (torch_xla 1.10) or XLA's decomposition: the
 * output-sized zeros are reused in place by the all-reduce (input + output), or not
 * (--no-alias: input + 2 x output); either way each core sends twice as much.
 */
static void test_plan_all_gather_strategies(void **state)
{
	static const char *seed =
	    "HloModule seed\nENTRY main {\n"
	    "  p0 = f32[134217728]{0} parameter(0)\n"
	    "  ROOT ag = f32[1073741824]{0} all-gather(p0), replica_groups={{0,1,2,3,4,5,6,7}}, "
	    "dimensions={0}\n}\n";
	struct hlo_module m;
	struct status st;
	struct topology topo;
	assert_int_equal(topology_from_preset(&topo, "v3-8", &st), ST_OK);
	assert_int_equal(parse(seed, &m, &st), ST_OK);
	for (int strategy = AG_VIA_ALL_REDUCE; strategy <= AG_DECOMPOSED; strategy++) {
		for (int no_alias = 0; no_alias <= 1; no_alias++) {
			struct memplan p;
			struct memplan_options o = {.alignment = 1,
			                            .tiled = true,
			                            .all_gather = (enum ag_strategy)strategy,
			                            .no_alias = no_alias};
			assert_int_equal(parse(seed, &m, &st), ST_OK); /* lowered in m: anew */
			assert_int_equal(memplan_build(&p, &m, &topo, &o, a, &st), ST_OK);
			/* And a few scalars: the zero, this core's position, its offset. */
			int64_t want = 512 * MiB + (no_alias ? 8 : 4) * GiB;
			assert_true(p.peak_bytes >= want && p.peak_bytes < want + 64);
			assert_int_equal(p.peak_scratch, 0);
			assert_int_equal(p.sent_bytes, 4 * GiB / 8 * 2 * 7);
			assert_int_equal(p.n_rewritten, 1);
			/* The output-sized buffers at the peak: the output, and the zeros
			 * unaliased. */
			int big = 0;
			for (int k = 0; k < p.n_peak_live; k++)
				big += p.buffers[p.peak_live[k]].bytes == 4 * GiB;
			assert_int_equal(big, no_alias ? 2 : 1);
		}
	}
	assert_int_equal(ag_strategy_parse("decomposed"), AG_DECOMPOSED);
	assert_int_equal(ag_strategy_parse("nope"), -1);
}

/* Two all-gathers consumed at the end are live together; each is freed after its last use. */
static const char *const two_gathers = "HloModule two\nENTRY main {\n"
                                       "  x = f32[1048576] parameter(0)\n"
                                       "  a = f32[8388608] all-gather(x), dimensions={0}\n"
                                       "  b = f32[8388608] all-gather(x), dimensions={0}\n"
                                       "  s = f32[8388608] add(a, b)\n"
                                       "  ROOT r = f32[8388608] negate(s)\n}\n";

static void test_plan_liveness(void **state)
{
	struct memplan p;
	plan(two_gathers, "v3-8", &p);
	/*
	 * s is fused into r and takes no HBM; x (argument) and r (output) are device buffers for
	 * the whole program, a and b live together from b to r: 4 + 32 + 2 x 32 MiB.
	 */
	assert_int_equal(p.n_fused, 1);
	assert_int_equal(p.peak_bytes, 4 * MiB + 3 * 32 * MiB);
	assert_string_equal(p.peak_name, "b");
	assert_int_equal(p.temp_bytes, 2 * 32 * MiB);
	no_fusion = true;
	plan(two_gathers, "v3-8", &p);
	no_fusion = false;
	/*
	 * --fusion none: s works in place in a's bytes (a dies there), and r, the output, in s's:
	 * a is computed into the output's buffer, so only b is a temporary.
	 */
	assert_int_equal(p.n_fused, 0);
	assert_int_equal(p.n_in_place, 2);
	assert_int_equal(p.peak_bytes, 4 * MiB + 2 * 32 * MiB);
	assert_string_equal(p.peak_name, "b");
	assert_int_equal(p.temp_bytes, 32 * MiB);
	/*
	 * A ring reduce-scatter reserves, while it runs, the window's 4 chunks (here blocks of
	 * 4 MiB) to stage the sends it overwrites; it combines straight into its output. Within
	 * one host it goes direct (each block straight to its owner, from the input): nothing.
	 */
	static const char *rs =
	    "HloModule rs\nENTRY main {\n"
	    "  x = f32[8388608] parameter(0)\n"
	    "  ROOT r = f32[1048576] reduce-scatter(x), dimensions={0}, to_apply=add\n}\n"
	    "add {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n"
	    "  ROOT s = f32[] add(a, b)\n}\n";
	plan(rs, "v3-8", &p);
	assert_int_equal(p.peak_bytes, 32 * MiB + 4 * MiB);
	assert_int_equal(p.peak_scratch, 0);
	forced_algorithm = "ring";
	plan(rs, "v3-8", &p);
	forced_algorithm = NULL;
	assert_int_equal(p.peak_bytes, 32 * MiB + 4 * MiB + 4 * 4 * MiB);
	assert_int_equal(p.peak_scratch, 4 * 4 * MiB);
}

/*
 * Two independent all-gathers whose outputs are consumed later: combined, both outputs are live
 * at once; an opt-barrier between them keeps them apart and the peak back at one.
 */
static void test_plan_combining_and_barriers(void **state)
{
	const char *fmt = "HloModule two\n"
	                  "add {\n  l = f32[] parameter(0)\n  r = f32[] parameter(1)\n"
	                  "  ROOT s = f32[] add(l, r)\n}\n"
	                  "ENTRY main {\n"
	                  "  x = f32[262144] parameter(0)\n"
	                  "  y = f32[262144] parameter(1)\n"
	                  "  z = f32[] constant(0)\n"
	                  "  a = f32[2097152] all-gather(x), dimensions={0}\n"
	                  "  ra = f32[] reduce(a, z), dimensions={0}, to_apply=add\n"
	                  "  %s\n"
	                  "  b = f32[2097152] all-gather(y), dimensions={0}\n"
	                  "  rb = f32[] reduce(b, z), dimensions={0}, to_apply=add\n"
	                  "  ROOT t = (f32[], f32[]) tuple(ra, rb)\n}\n";
	char text[1024];
	struct hlo_module m;
	struct status st;
	struct topology topo;
	assert_int_equal(topology_from_preset(&topo, "v3-8", &st), ST_OK);
	struct memplan_options o = {
	    .alignment = 1, .tiled = true, .combine_threshold_bytes = 30 * MiB};
	struct memplan p;
	/* Outputs ra and rb with the result's index table (16), and z, a constant, throughout. */
	const int64_t scalars = 4 + 4 + 16 + 4;
	/* Combined: b runs with a, so both 8 MiB outputs are live at once. */
	snprintf(text, sizeof(text), fmt, "c = f32[] constant(1)");
	assert_int_equal(parse(text, &m, &st), ST_OK);
	assert_int_equal(memplan_build(&p, &m, &topo, &o, a, &st), ST_OK);
	assert_int_equal(p.n_combined, 1);
	assert_int_equal(p.peak_bytes, 2 * MiB + 2 * 8 * MiB + scalars + 4); /* and c */
	/* Without combining (threshold below the pair), one output at a time. */
	o.combine_threshold_bytes = 10 * MiB;
	assert_int_equal(memplan_build(&p, &m, &topo, &o, a, &st), ST_OK);
	assert_int_equal(p.n_combined, 0);
	assert_int_equal(p.peak_bytes, 2 * MiB + 8 * MiB + scalars + 4); /* and c */
	/* An opt-barrier between them keeps them apart at any threshold. */
	o.combine_threshold_bytes = 30 * MiB;
	snprintf(text, sizeof(text), fmt, "ob = f32[] opt-barrier(ra)");
	assert_int_equal(parse(text, &m, &st), ST_OK);
	assert_int_equal(memplan_build(&p, &m, &topo, &o, a, &st), ST_OK);
	assert_int_equal(p.n_combined, 0);
	assert_int_equal(p.peak_bytes, 2 * MiB + 8 * MiB + scalars);
}

/* A value made early and read late moves next to its reader: the peak falls. */
static void test_plan_memory_aware_order(void **state)
{
	struct memplan p;
	const char *text = "HloModule late\nENTRY main {\n"
	                   "  p = f32[1024,1024] parameter(0)\n"
	                   "  z = f32[] constant(0)\n"
	                   "  big = f32[1024,1024] broadcast(z), dimensions={}\n"
	                   "  t1 = f32[1024,1024] transpose(p), dimensions={1,0}\n"
	                   "  t2 = f32[1024,1024] transpose(t1), dimensions={1,0}\n"
	                   "  t3 = f32[1024,1024] transpose(t2), dimensions={1,0}\n"
	                   "  rb = f32[] reduce(big, z), dimensions={0,1}, to_apply=add\n"
	                   "  ROOT r = (f32[1024,1024], f32[]) tuple(t3, rb)\n}\n"
	                   "add {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n"
	                   "  ROOT c = f32[] add(a, b)\n}\n";
	/* As written: p and t3 (argument, output) and, at t2, big, t1 and t2 (20 MiB). */
	recorded = true;
	plan(text, "v3-8", &p);
	recorded = false;
	assert_int_equal(p.n_delayed, 0);
	assert_true(p.peak_bytes >= 20 * MiB && p.peak_bytes < 20 * MiB + 4096);
	/* Scheduled: big no longer waits beside the transposes: two 4 MiB temporaries at most. */
	plan(text, "v3-8", &p);
	assert_true(p.n_delayed > 0);
	assert_true(p.peak_bytes >= 16 * MiB && p.peak_bytes < 16 * MiB + 4096);
}

/* Over 16 GiB on a v3 core: refused with the padded buffers as the largest allocations. */
static void test_plan_out_of_memory(void **state)
{
	struct memplan p;
	plan("HloModule big\nENTRY main {\n"
	     "  p = f32[12582912,1]{1,0} parameter(0)\n"
	     "  n = f32[12582912,1]{1,0} negate(p)\n"
	     "  m = f32[12582912,1]{1,0} multiply(n, p)\n"
	     "  ROOT t = (f32[12582912,1]{1,0}, f32[12582912,1]{1,0}) tuple(m, n)\n}\n",
	     "v3-8", &p);
	assert_false(p.fits);
	assert_int_equal(p.peak_bytes, 18 * GiB + 16); /* and the result's tuple index table */
	assert_int_equal(p.padding_bytes, 3 * (6 * GiB - 48 * MiB));
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	struct topology topo;
	struct status st;
	topology_from_preset(&topo, "v3-8", &st);
	memplan_print_oom(f, &p, &topo);
	fclose(f);
	assert_non_null(strstr(text, "Ran out of memory in memory space hbm. Used 18.00G of 15.48G "
	                             "hbm. Exceeded hbm capacity by 2.52G."));
	assert_non_null(strstr(text, "Extra memory due to padding: 5.95G (128.0x expansion)"));
	free(text);
}

/* A module of tests/hlo, planned for a v3-8 with TPU layouts. */
static void plan_file(const char *name, struct memplan *p, struct status *st, int want)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", PODEMU_HLO_DIR, name);
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	static char text[1 << 16];
	size_t len = fread(text, 1, sizeof(text), f);
	fclose(f);
	struct hlo_module m;
	struct topology topo;
	assert_int_equal(topology_from_preset(&topo, "v3-8", st), ST_OK);
	int rv = hlo_parse(text, len, a, &m, st);
	if (rv == ST_OK) {
		struct memplan_options o = {.alignment = 1, .tiled = true};
		rv = memplan_build(p, &m, &topo, &o, a, st);
	}
	if (rv != want)
		fail_msg("%s: %s", name, st->message);
}

/* A control edge is kept: the memory-aware scheduler moves nothing past what waits for it. */
static void test_control_predecessors_order(void **state)
{
	struct memplan p;
	const char *text = "HloModule ctl\nENTRY main {\n"
	                   "  p = f32[1024,1024] parameter(0)\n"
	                   "  big = f32[1024,1024] iota(), iota_dimension=0\n"
	                   "  t1 = f32[1024,1024] transpose(p), dimensions={1,0}\n"
	                   "  t2 = f32[1024,1024] transpose(t1), dimensions={1,0}, "
	                   "control-predecessors={big}\n"
	                   "  s = f32[1024,1024] add(big, t2)\n"
	                   "  ROOT r = (f32[1024,1024]) tuple(s)\n}\n";
	plan(text, "v3-8", &p);
	/* big runs before t2, however much later its value is read. */
	int big = -1, t2 = -1;
	for (int k = 0; k < p.n_instructions; k++) {
		big = p.order[k] == 1 ? k : big;
		t2 = p.order[k] == 3 ? k : t2;
	}
	assert_true(big < t2);
	/* Without the edge, big moves next to its reader. */
	char *free_text = strdup(text);
	char *edge = strstr(free_text, ", control-predecessors={big}");
	memset(edge, ' ', strlen(", control-predecessors={big}"));
	plan(free_text, "v3-8", &p);
	free(free_text);
	assert_true(p.n_delayed > 0);
}

/* The figures worked out by hand in each module's comment. */
static void test_plan_modules(void **state)
{
	struct memplan p;
	struct status st;
	/* A while costs its state and its body's peak; the peak names body/big. */
	plan_file("while-temp.hlo", &p, &st, ST_OK);
	assert_int_equal(p.peak_bytes, 268443680);
	assert_int_equal(p.argument_bytes, 4096);
	assert_int_equal(p.output_bytes, 4096);
	assert_int_equal(p.constant_bytes, 4);
	assert_string_equal(p.peak_name, "w");
	const struct plan_buffer *top = &p.buffers[p.peak_live[0]];
	assert_string_equal(top->comp->name, "body");
	assert_string_equal(top->def->name, "big");
	/* Every parameter of an aliased train step counted once. */
	plan_file("aliased-step.hlo", &p, &st, ST_OK);
	assert_int_equal(p.argument_bytes, 12582912);
	assert_int_equal(p.output_bytes, 8388624);
	assert_int_equal(p.alias_bytes, 8388608);
	assert_int_equal(p.peak_bytes, 12582928);
	/* Async pairs once, tiles as written, other memory spaces apart. */
	plan_file("async-tiles.hlo", &p, &st, ST_OK);
	assert_int_equal(p.argument_bytes, 1024);
	assert_int_equal(p.output_bytes, 1024);
	assert_int_equal(p.other_space_bytes, 512);
	assert_int_equal(p.constant_bytes, 4);
	assert_int_equal(p.peak_bytes, 2052);
	assert_int_equal(p.sent_bytes, 84);
	/* A loop calling a computation, a conditional; a collective in a loop (see the files). */
	plan_file("control.hlo", &p, &st, ST_OK);
	assert_int_equal(p.argument_bytes, 4096);
	assert_int_equal(p.output_bytes, 4096 + 4096 + 16);
	assert_int_equal(p.peak_bytes, 1048576 + 4 + 4096 + 4096 + 4096 + 4 + 1 + 16);
	assert_string_equal(p.peak_name, "c");
	plan_file("loop-collective.hlo", &p, &st, ST_OK);
	assert_int_equal(p.temp_bytes, 4 * 4096 + 16 + 4 + 4);
	assert_int_equal(p.peak_bytes, 4096 + 4096 + 4 * 4096 + 16 + 4 + 4);
	assert_int_equal(p.sent_bytes, 7168);
	/* Replica groups checked with XLA's verifier's words before planning. */
	plan_file("bad-groups.hlo", &p, &st, ST_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "line 8: ag: Replica 3 is repeated in instruction's "
	                                   "replica-groups"));
	plan_file("uneven-groups.hlo", &p, &st, ST_INVALID_ARGUMENT);
	assert_non_null(
	    strstr(st.message, "line 7: ag: Replica groups expected to be of uniform size"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_parse_module),
	    cmocka_unit_test(test_parse_errors_name_line_and_column),
	    cmocka_unit_test(test_layout_bytes),
	    cmocka_unit_test(test_layout_text),
	    cmocka_unit_test(test_parse_xla_forms),
	    cmocka_unit_test(test_plan_seed_all_gather),
	    cmocka_unit_test(test_plan_receive_slots),
	    cmocka_unit_test(test_plan_all_gather_strategies),
	    cmocka_unit_test(test_plan_combining_and_barriers),
	    cmocka_unit_test(test_plan_liveness),
	    cmocka_unit_test(test_plan_memory_aware_order),
	    cmocka_unit_test(test_plan_out_of_memory),
	    cmocka_unit_test(test_plan_modules),
	    cmocka_unit_test(test_control_predecessors_order),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
