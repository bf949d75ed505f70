#include "hlo_collective.h"

#include "layout.h"

enum opcode hlo_collective_op(const struct hlo_instruction *in)
{
	if (hlo_is(in, "all-gather") || hlo_is(in, "all-gather-start"))
		return OP_ALL_GATHER;
	if (hlo_is(in, "all-reduce") || hlo_is(in, "all-reduce-start"))
		return OP_ALL_REDUCE;
	if (hlo_is(in, "reduce-scatter"))
		return OP_REDUCE_SCATTER;
	if (hlo_is(in, "all-to-all"))
		return OP_ALL_TO_ALL;
	if (hlo_is(in, "collective-permute") || hlo_is(in, "collective-permute-start"))
		return OP_COLLECTIVE_PERMUTE;
	return OP_INVALID;
}

/* An async start's result is its tuple's element 1 (element 0 is the operand). */
static const struct hlo_shape *result_of(const struct hlo_instruction *in)
{
	return in->shape.type == HT_TUPLE && in->shape.n_tuple > 1 ? &in->shape.tuple[1]
	                                                           : &in->shape;
}

static const struct hlo_shape *operand_of(const struct hlo_instruction *in)
{
	return in->n_operands > 0 ? &in->operands[0]->shape : result_of(in);
}

int64_t hlo_collective_sent(const struct hlo_instruction *in, int n)
{
	if (n <= 1)
		return 0;
	int64_t out = layout_bytes(result_of(in), false);
	int64_t operand = in->n_operands > 0 ? layout_bytes(operand_of(in), false) : 0;
	switch (hlo_collective_op(in)) {
	case OP_ALL_GATHER:
	case OP_ALL_TO_ALL:
		return out / n * (n - 1);
	case OP_ALL_REDUCE:
		return out / n * 2 * (n - 1);
	case OP_REDUCE_SCATTER:
		return operand / n * (n - 1);
	case OP_COLLECTIVE_PERMUTE:
		return operand;
	default:
		return 0;
	}
}

struct coll_workspace hlo_collective_workspace(const struct hlo_instruction *in, int n,
                                               int64_t chunk_bytes, int window,
                                               const char *forced_algorithm)
{
	enum opcode op = hlo_collective_op(in);
	const struct hlo_shape *result = result_of(in), *operand = operand_of(in);
	const struct hlo_shape *blocks = op == OP_ALL_GATHER ? result : operand;
	int d = in->n_dimensions > 0 ? (int)in->dimensions[0] : 0;
	bool strided = op != OP_ALL_REDUCE && blocks->type != HT_TUPLE &&
	               lower_blocks_strided(blocks->dims, blocks->rank, d);
	return lower_workspace(op, n, layout_bytes(operand, false), layout_bytes(result, false),
	                       strided, chunk_bytes, window, forced_algorithm);
}
