/*
 * The result shapes XLA's text may leave out ("count = get-tuple-element(%param), index=0"):
 * inferred from the operands for the ops whose shape follows from them alone.
 */
#include <string.h>

#include "graph.h"
#include "hlo_reader.h"

/* Element k of a tuple operand, or the operand itself when it is not a tuple. */
static const struct hlo_shape *element(const struct hlo_shape *s, int k)
{
	return s->type == HT_TUPLE && k < s->n_tuple ? &s->tuple[k] : s;
}

int hlo_infer_shape(struct reader *r, struct hlo_instruction *in)
{
	const char *at = reader_line_start(r, in->line) + in->column - 1;
	const struct hlo_shape *first = in->n_operands > 0 ? &in->operands[0]->shape : NULL;
	enum opcode op = opcode_parse(in->opcode);
	if (hlo_is(in, "get-tuple-element")) {
		if (first == NULL || first->type != HT_TUPLE || !in->has_index ||
		    in->tuple_index >= first->n_tuple)
			return reader_fail(r, at,
			                   "%s: get-tuple-element needs a tuple operand and an "
			                   "index within it",
			                   in->name);
		in->shape = first->tuple[in->tuple_index];
	} else if (hlo_is(in, "tuple")) {
		in->shape = (struct hlo_shape){.type = HT_TUPLE, .n_tuple = in->n_operands};
		in->shape.tuple =
		    arena_calloc(r->a, (size_t)in->n_operands + 1, sizeof(struct hlo_shape));
		if (in->shape.tuple == NULL)
			return reader_fail(r, at, "out of host memory");
		for (int k = 0; k < in->n_operands; k++)
			in->shape.tuple[k] = in->operands[k]->shape;
	} else if (hlo_is(in, "after-all")) {
		in->shape = (struct hlo_shape){.type = HT_TOKEN};
	} else if (first != NULL && (hlo_is(in, "copy") || hlo_is(in, "opt-barrier") ||
	                             hlo_is(in, "optimization-barrier") || hlo_is(in, "while") ||
	                             hlo_is(in, "add-dependency") || hlo_is(in, "domain") ||
	                             hlo_is(in, "all-reduce-done") ||
	                             (op != OP_CONVERT && op != OP_COMPARE && op != OP_SELECT &&
	                              opcode_is_elementwise(op)))) {
		in->shape = hlo_is(in, "all-reduce-done") ? *element(first, 1) : *first;
	} else if (first != NULL && hlo_is(in, "compare")) {
		in->shape = *first;
		in->shape.type = HT_PRED;
		in->shape.has_layout = false;
		in->shape.n_tiles = 0;
		in->shape.element_bits = 0;
	} else if (in->n_operands == 3 && hlo_is(in, "select")) {
		in->shape = in->operands[1]->shape;
	} else if (first != NULL &&
	           (hlo_is(in, "all-gather-done") || hlo_is(in, "collective-permute-done") ||
	            hlo_is(in, "async-done"))) {
		in->shape = *element(first, 1);
	} else if (first != NULL && hlo_is(in, "copy-done")) {
		in->shape = *element(first, 0);
	} else {
		return reader_fail(r, at,
		                   "%s: the result shape of %s is not written and podemu cannot "
		                   "infer it; write it as XLA prints it (%s = f32[...] %s(...))",
		                   in->name, in->opcode, in->name, in->opcode);
	}
	return ST_OK;
}
