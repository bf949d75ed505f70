/* The memory report of a plan: XLA's out-of-memory text, the summary, JSON and an SVG. */
#include <stdlib.h>
#include <string.h>

#include "memplan.h"
#include "podjson.h"

/* A buffer kind's name in the JSON report, and in XLA's words ("Allocation type"). */
static const struct {
	const char *name, *xla;
} kinds[] = {
    [BUF_ARGUMENT] = {"argument", "HLO argument"},
    [BUF_OUTPUT] = {"output", "HLO output"},
    [BUF_TEMP] = {"temp", "HLO temp"},
    [BUF_CONSTANT] = {"constant", "global constant"},
};

static const char *kind_name(enum buffer_kind k)
{
	return kinds[k].name;
}

static const char *xla_kind(enum buffer_kind k)
{
	return kinds[k].xla;
}

/* A buffer's name inside the computation it lives in: "body.3/dot.7", or "dot.7" in the entry. */
static const char *buffer_name(char *buf, size_t len, const struct plan_buffer *b)
{
	if (b->comp != NULL && !b->comp->is_entry)
		snprintf(buf, len, "%s/%s", b->comp->name, b->def->name);
	else
		snprintf(buf, len, "%s", b->def->name);
	return buf;
}

static void print_largest(FILE *f, const struct memplan *p, int max)
{
	char size[32], unpadded[32], extra[32], shape[512], layout[256], name[512];
	for (int k = 0; k < p->n_peak_live && k < max; k++) {
		const struct plan_buffer *b = &p->buffers[p->peak_live[k]];
		/* With its layout when the module writes one, as XLA prints it. */
		fprintf(f,
		        "  %d. Size: %s\n"
		        "     Operator: op_type=\"%s\"\n"
		        "     Shape: %s%s\n"
		        "     Unpadded size: %s\n",
		        k + 1, status_human_bytes(size, b->bytes), b->op ? b->op : b->def->opcode,
		        hlo_shape_format(shape, sizeof(shape), &b->def->shape),
		        hlo_layout_format(layout, sizeof(layout), &b->def->shape),
		        status_human_bytes(unpadded, b->unpadded_bytes));
		if (b->bytes > b->unpadded_bytes)
			fprintf(f, "     Extra memory due to padding: %s (%.1fx expansion)\n",
			        status_human_bytes(extra, b->bytes - b->unpadded_bytes),
			        b->unpadded_bytes > 0 ? (double)b->bytes / (double)b->unpadded_bytes
			                              : 0.0);
		fprintf(f,
		        "     XLA label: %s = %s(...)\n"
		        "     Allocation type: %s\n"
		        "     ==========================\n\n",
		        buffer_name(name, sizeof(name), b), b->def->opcode, xla_kind(b->kind));
	}
}

/* What the combiners and an all-gather strategy other than native did to the plan. */
static void print_strategy(FILE *f, const struct memplan *p)
{
	char threshold[32];
	if (p->n_fused > 0)
		fprintf(f,
		        "fused %d elementwise instructions into the kernels of later ones: they "
		        "take no HBM (--fusion none keeps them)\n\n",
		        p->n_fused);
	if (p->n_delayed > 0)
		fprintf(f,
		        "the memory-aware scheduler ran %d computations just before their first "
		        "consumer (--scheduler recorded keeps the written order)\n\n",
		        p->n_delayed);
	if (p->n_in_place > 0)
		fprintf(f,
		        "%d results (elementwise, dynamic-update-slice) reuse the bytes of an "
		        "operand that dies there (in "
		        "place)\n\n",
		        p->n_in_place);
	if (p->n_combined > 0)
		fprintf(
		    f,
		    "combined %d collectives into earlier independent ones (threshold %s): their "
		    "outputs are live from there on\n\n",
		    p->n_combined, status_human_bytes(threshold, p->combine_threshold_bytes));
	if (p->n_rewritten > 0)
		fprintf(
		    f,
		    "all-gather strategy %s: each of the %d all-gathers fills an output-sized "
		    "buffer with zeros and its input, then all-reduces it %s, with one chunk of "
		    "scratch; it sends 2(n-1)/n of the output instead of (n-1)/n\n\n",
		    ag_strategy_name(p->all_gather), p->n_rewritten,
		    p->no_alias ? "into a second output-sized buffer (--no-alias)" : "in place");
}

void memplan_print_oom(FILE *f, const struct memplan *p, const struct topology *topo)
{
	char used[32], cap[32], over[32], res[32], args[32], outs[32], temps[32], consts[32];
	fprintf(
	    f,
	    "Ran out of memory in memory space hbm. Used %s of %s hbm. Exceeded hbm capacity by "
	    "%s.\n\n",
	    status_human_bytes(used, p->peak_bytes), status_human_bytes(cap, p->capacity),
	    status_human_bytes(over, p->peak_bytes - p->capacity));
	fprintf(f,
	        "Total hbm usage >= %s:\n"
	        "    reserved        %s\n"
	        "    arguments       %s\n"
	        "    outputs         %s\n"
	        "    constants       %s\n"
	        "    temporaries     %s (the peak is at instruction %d, %s)\n\n",
	        status_human_bytes(used, p->peak_bytes + topo->reserved_bytes),
	        status_human_bytes(res, topo->reserved_bytes),
	        status_human_bytes(args, p->argument_bytes),
	        status_human_bytes(outs, p->output_bytes),
	        status_human_bytes(consts, p->constant_bytes),
	        status_human_bytes(temps, p->temp_bytes), p->peak_at, p->peak_name);
	print_strategy(f, p);
	fprintf(f, "Largest program allocations in hbm:\n\n");
	print_largest(f, p, 10);
}

void memplan_print_text(FILE *f, const struct memplan *p, const struct topology *topo)
{
	if (!p->fits) {
		memplan_print_oom(f, p, topo);
		return;
	}
	char peak[32], cap[32], args[32], outs[32], temps[32], pad[32], sent[32], scr[32],
	    alias[32], consts[32], other[32];
	fprintf(f,
	        "fits: peak %s of %s hbm per core (%s, %d cores)\n"
	        "  arguments %s, outputs %s, temporaries %s, collective scratch at the peak %s\n"
	        "  padding in the live set at the peak %s; each core sends %s in collectives\n\n",
	        status_human_bytes(peak, p->peak_bytes), status_human_bytes(cap, p->capacity),
	        topo->name, p->world_size, status_human_bytes(args, p->argument_bytes),
	        status_human_bytes(outs, p->output_bytes), status_human_bytes(temps, p->temp_bytes),
	        status_human_bytes(scr, p->peak_scratch), status_human_bytes(pad, p->padding_bytes),
	        status_human_bytes(sent, p->sent_bytes));
	if (p->alias_bytes > 0 || p->constant_bytes > 0 || p->other_space_bytes > 0)
		fprintf(
		    f,
		    "  of which outputs in the bytes of parameters (input_output_alias) %s; "
		    "constants %s;\n  outside HBM (other memory spaces, not in the peak) %s\n\n",
		    status_human_bytes(alias, p->alias_bytes),
		    status_human_bytes(consts, p->constant_bytes),
		    status_human_bytes(other, p->other_space_bytes));
	if (p->receive_bytes > 0) {
		char slot[32], all[32];
		fprintf(
		    f,
		    "  of the temporaries, receive slots for chunks from other hosts %s (%d slots "
		    "of %s, live through the whole program)\n\n",
		    status_human_bytes(all, p->receive_bytes), p->receive_slots,
		    status_human_bytes(slot, p->receive_slot_bytes));
	}
	print_strategy(f, p);
	fprintf(f, "Live at the peak (instruction %d, %s):\n\n", p->peak_at, p->peak_name);
	print_largest(f, p, 10);
}

void memplan_print_json(FILE *f, const struct memplan *p, const struct status *error)
{
	fprintf(f, "{\"cores\": [");
	for (int core = 0; p != NULL && core < p->world_size; core++) {
		fprintf(f,
		        "%s\n {\"ordinal\": %d, \"argument_bytes\": %lld, \"output_bytes\": %lld, "
		        "\"alias_bytes\": %lld, \"temp_bytes\": %lld, \"peak_bytes\": %lld, "
		        "\"constant_bytes\": %lld, \"other_space_bytes\": %lld, "
		        "\"padding_bytes\": %lld, \"sent_bytes\": %lld, \"receive_bytes\": %lld, "
		        "\"fits\": %s, \"peak_live\": [",
		        core ? "," : "", core, (long long)p->argument_bytes,
		        (long long)p->output_bytes, (long long)p->alias_bytes,
		        (long long)p->temp_bytes, (long long)p->peak_bytes,
		        (long long)p->constant_bytes, (long long)p->other_space_bytes,
		        (long long)p->padding_bytes, (long long)p->sent_bytes,
		        (long long)p->receive_bytes, p->fits ? "true" : "false");
		for (int k = 0; k < p->n_peak_live; k++) {
			const struct plan_buffer *b = &p->buffers[p->peak_live[k]];
			char shape[512], name[512];
			fprintf(f, "%s{\"name\": ", k ? ", " : "");
			json_string(f, buffer_name(name, sizeof(name), b));
			fprintf(f, ", \"op\": ");
			json_string(f, b->op ? b->op : b->def->opcode);
			fprintf(f, ", \"shape\": ");
			json_string(f, hlo_shape_format(shape, sizeof(shape), &b->def->shape));
			fprintf(f, ", \"bytes\": %lld, \"padded_bytes\": %lld, \"kind\": \"%s\"}",
			        (long long)b->unpadded_bytes, (long long)b->bytes,
			        kind_name(b->kind));
		}
		fprintf(f, "]}");
	}
	fprintf(f, "],\n \"warnings\": [");
	for (int k = 0; p != NULL && k < p->n_warnings; k++) {
		fprintf(f, "%s{\"line\": %d, \"text\": ", k ? ", " : "", p->warnings[k].line);
		json_string(f, p->warnings[k].text);
		fputc('}', f);
	}
	fprintf(f, "],\n \"error\": ");
	if (error == NULL) {
		fprintf(f, "null}\n");
	} else {
		fprintf(f, "{\"code\": ");
		json_string(f, status_code_name(error->code));
		fprintf(f, ", \"message\": ");
		json_string(f, error->message);
		fprintf(f, "}}\n");
	}
}

static void xml_text(FILE *f, const char *s)
{
	for (; *s; s++) {
		if (*s == '<')
			fputs("&lt;", f);
		else if (*s == '>')
			fputs("&gt;", f);
		else if (*s == '&')
			fputs("&amp;", f);
		else if (*s == '"')
			fputs("&quot;", f);
		else
			fputc(*s, f);
	}
}

void memplan_write_svg(FILE *f, const struct memplan *p, const struct topology *topo,
                       const char *title)
{
	const double w = 960, h = 360, left = 80, right = 20, top = 40, bottom = 40;
	int shown = p->n_peak_live < 12 ? p->n_peak_live : 12;
	double total_h = h + 30 + 18.0 * shown;
	int64_t ymax = p->peak_bytes > p->capacity ? p->peak_bytes : p->capacity;
	if (ymax <= 0)
		ymax = 1;
	int n = p->n_instructions > 0 ? p->n_instructions : 1;
	double pw = w - left - right, ph = h - top - bottom;
#define X(i) (left + pw * ((double)(i) / (double)n))
#define Y(v) (top + ph * (1.0 - (double)(v) / (double)ymax))
	fprintf(f,
	        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
	        "font-family=\"monospace\" font-size=\"12\">\n"
	        "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n<text x=\"%.0f\" "
	        "y=\"20\" font-size=\"14\">",
	        w, total_h, left);
	xml_text(f, title);
	char peak[32], cap[32];
	fprintf(f, " — live HBM per core over the program (%s, every core the same)</text>\n",
	        topo->name);
	/* Axes and the capacity. */
	fprintf(f,
	        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n"
	        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
	        left, top, left, top + ph, left, top + ph, left + pw, top + ph);
	fprintf(f,
	        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"red\" "
	        "stroke-dasharray=\"6,4\"/>\n<text x=\"%.1f\" y=\"%.1f\" fill=\"red\">"
	        "capacity %s</text>\n",
	        left, Y(p->capacity), left + pw, Y(p->capacity), left + pw - 160,
	        Y(p->capacity) - 4, status_human_bytes(cap, p->capacity));
	for (int k = 0; k <= 4; k++) {
		char label[32];
		int64_t v = ymax / 4 * k;
		fprintf(f, "<text x=\"4\" y=\"%.1f\">%s</text>\n", Y(v) + 4,
		        status_human_bytes(label, v));
	}
	fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">instruction (program order), 0..%d</text>\n", left,
	        top + ph + 28, n - 1);
	/* Live bytes as steps. */
	fprintf(f, "<polyline fill=\"none\" stroke=\"steelblue\" stroke-width=\"1.5\" points=\"");
	for (int i = 0; i < p->n_instructions; i++)
		fprintf(f, "%.1f,%.1f %.1f,%.1f ", X(i), Y(p->live[i]), X(i + 1), Y(p->live[i]));
	fprintf(f, "\"/>\n");
	/* The peak and what is live there. */
	double px = (X(p->peak_at) + X(p->peak_at + 1)) / 2, py = Y(p->peak_bytes);
	fprintf(f,
	        "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"orange\"/>\n<text x=\"%.1f\" "
	        "y=\"%.1f\">peak %s at %d (",
	        px, py, px + 8 > left + pw - 240 ? px - 240 : px + 8, py - 6,
	        status_human_bytes(peak, p->peak_bytes), p->peak_at);
	xml_text(f, p->peak_name ? p->peak_name : "");
	fprintf(f, ")</text>\n<text x=\"%.1f\" y=\"%.1f\">live at the peak:</text>\n", left,
	        h + 14);
	for (int k = 0; k < shown; k++) {
		const struct plan_buffer *b = &p->buffers[p->peak_live[k]];
		char size[32], shape[256];
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%9s  %-8s ", left, h + 32 + 18.0 * k,
		        status_human_bytes(size, b->bytes), kind_name(b->kind));
		char name[512];
		xml_text(f, buffer_name(name, sizeof(name), b));
		fputs(" = ", f);
		xml_text(f, hlo_shape_format(shape, sizeof(shape), &b->def->shape));
		fputc(' ', f);
		xml_text(f, b->op ? b->op : b->def->opcode);
		fprintf(f, "</text>\n");
	}
	fprintf(f, "</svg>\n");
#undef X
#undef Y
}
