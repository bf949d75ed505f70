/*
 * HLO instructions recorded as client-library ops, for `podemu run`: each instruction of a
 * computation becomes the library's op of the same meaning (or an opaque one), with the layout
 * its module writes; while, call and conditional record their computations through the
 * library's callbacks by replaying the module's own.
 */
#include "record.h"

#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"

int unimplemented(struct runner *r, const struct hlo_instruction *in, const char *why)
{
	return status_set(&r->st, ST_UNIMPLEMENTED,
	                  "line %d: %s (%s) cannot run on the pod: %s; `podemu compile` plans it",
	                  in->line, in->name, in->opcode, why);
}

int pe_type(enum hlo_type t)
{
	switch (t) {
	case HT_PRED:
		return PE_PRED;
	case HT_S32:
		return PE_S32;
	case HT_U8:
		return PE_U8;
	case HT_BF16:
		return PE_BF16;
	case HT_F32:
		return PE_F32;
	case HT_U32:
		return PE_U32;
	default:
		return -1;
	}
}

/* The numbers of a literal ("(1.5)", "({1, 2}, {3, 4})", "(true)"); count returned. */
static int64_t literal_numbers(const char *text, double *out, int64_t max)
{
	int64_t n = 0;
	const char *q = text;
	while (*q != '\0' && n < max) {
		if (strncmp(q, "true", 4) == 0 || strncmp(q, "false", 5) == 0) {
			out[n++] = *q == 't';
			q += *q == 't' ? 4 : 5;
			continue;
		}
		char *end;
		double v = strtod(q, &end);
		if (end != q && (isdigit((unsigned char)*q) || *q == '-' || *q == '+' ||
		                 *q == '.' || *q == 'i' || *q == 'n')) {
			out[n++] = v;
			q = end;
		} else {
			q++;
		}
	}
	return n;
}

/* The reduction of a to_apply computation: its root's opcode. */
static int reducer_of(const struct hlo_instruction *in)
{
	if (in->to_apply == NULL) /* a pass's all-reduce names its reduction only */
		return in->to_apply_name != NULL && strcmp(in->to_apply_name, "add") == 0
		           ? PE_REDUCE_SUM
		           : -1;
	const char *op = in->to_apply->root->opcode;
	if (strcmp(op, "add") == 0)
		return PE_REDUCE_SUM;
	if (strcmp(op, "multiply") == 0)
		return PE_REDUCE_PRODUCT;
	if (strcmp(op, "maximum") == 0)
		return PE_REDUCE_MAX;
	if (strcmp(op, "minimum") == 0)
		return PE_REDUCE_MIN;
	if (strcmp(op, "and") == 0)
		return PE_REDUCE_AND;
	if (strcmp(op, "or") == 0)
		return PE_REDUCE_OR;
	return -1;
}

/* One operand as a single tensor. */
static pe_tensor *arg(struct runner *r, const struct hlo_instruction *in, int k)
{
	return k < in->n_operands ? r->vals[in->operands[k]->index].t : NULL;
}

/* "lo_hi_interior x ..." into arrays of rank entries. */
static int parse_padding(const char *text, int rank, int64_t *lo, int64_t *hi, int64_t *interior)
{
	const char *q = text;
	for (int d = 0; d < rank; d++) {
		char *end;
		lo[d] = strtoll(q, &end, 10);
		if (*end != '_')
			return -1;
		hi[d] = strtoll(end + 1, &end, 10);
		interior[d] = 0;
		if (*end == '_')
			interior[d] = strtoll(end + 1, &end, 10);
		if (d + 1 < rank && *end != 'x')
			return -1;
		q = end + 1;
	}
	return 0;
}

/* "{[a:b], [c:d:s]}" into arrays of rank entries. */
static int parse_slice(const char *text, int rank, int64_t *start, int64_t *limit, int64_t *stride)
{
	const char *q = text;
	for (int d = 0; d < rank; d++) {
		q = strchr(q, '[');
		if (q == NULL)
			return -1;
		char *end;
		start[d] = strtoll(q + 1, &end, 10);
		if (*end != ':')
			return -1;
		limit[d] = strtoll(end + 1, &end, 10);
		stride[d] = 1;
		if (*end == ':')
			stride[d] = strtoll(end + 1, &end, 10);
		q = end;
	}
	return 0;
}

/* Elementwise ops that map one to one onto the library. */
static pe_tensor *(*binary_fn(const char *op))(pe_tensor *, pe_tensor *)
{
	static const struct {
		const char *name;
		pe_tensor *(*fn)(pe_tensor *, pe_tensor *);
	} ops[] = {{"add", pe_add},           {"subtract", pe_subtract},
	           {"multiply", pe_multiply}, {"divide", pe_divide},
	           {"maximum", pe_maximum},   {"minimum", pe_minimum},
	           {"and", pe_and},           {"or", pe_or}};
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		if (strcmp(op, ops[i].name) == 0)
			return ops[i].fn;
	return NULL;
}

static pe_tensor *(*unary_fn(const char *op))(pe_tensor *)
{
	static const struct {
		const char *name;
		pe_tensor *(*fn)(pe_tensor *);
	} ops[] = {{"negate", pe_negate}, {"not", pe_not},
	           {"abs", pe_abs},       {"exponential", pe_exponential},
	           {"log", pe_log},       {"tanh", pe_tanh},
	           {"sqrt", pe_sqrt},     {"rsqrt", pe_rsqrt}};
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		if (strcmp(op, ops[i].name) == 0)
			return ops[i].fn;
	return NULL;
}

/*
 * The layout the module writes for a value the pod makes (tiles, minor-to-major), so that the
 * pod sizes it as podemu compile does; the default one when none is written.
 */
int set_layout(struct runner *r, const struct hlo_instruction *in, pe_tensor *t,
               const struct hlo_shape *s)
{
	char text[256];
	if (!s->has_layout || hlo_layout_format(text, sizeof(text), s)[0] == '\0')
		return ST_OK;
	if (pe_set_layout(t, text) != PE_OK)
		return status_set(&r->st, pe_last_code(r->c), "line %d: %s: %s", in->line, in->name,
		                  pe_last_error(r->c));
	return ST_OK;
}

/* An HLO computation recorded again as a called one: its parameters are args. */
static int replay(struct runner *r, const struct hlo_computation *comp, pe_tensor *const *args,
                  int n_args, pe_tensor **results, int n_results)
{
	struct value *saved = r->vals;
	struct value *vals = calloc((size_t)comp->n_instructions + 1, sizeof(*vals));
	if (vals == NULL)
		return status_set(&r->st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	r->vals = vals;
	int rv = ST_OK;
	for (int k = 0; k < comp->n_parameters && rv == ST_OK; k++) {
		struct value *v = &vals[comp->parameters[k]->index];
		if (comp->n_parameters == 1 && comp->parameters[k]->shape.type == HT_TUPLE &&
		    n_args > 1) {
			v->n = n_args;
			v->elems = calloc((size_t)n_args, sizeof(*v->elems));
			if (v->elems == NULL)
				rv =
				    status_set(&r->st, ST_RESOURCE_EXHAUSTED, "out of host memory");
			else
				memcpy(v->elems, args, (size_t)n_args * sizeof(*args));
		} else if (k < n_args) {
			v->t = args[k];
		}
	}
	for (int i = 0; rv == ST_OK && i < comp->n_instructions; i++)
		if (comp->instructions[i]->parameter_number < 0)
			rv = record(r, comp->instructions[i]);
	const struct value *root = &vals[comp->root->index];
	for (int k = 0; rv == ST_OK && k < n_results; k++)
		results[k] = root->elems && k < root->n ? root->elems[k] : root->t;
	for (int i = 0; i < comp->n_instructions; i++)
		free(vals[i].elems);
	free(vals);
	r->vals = saved;
	return rv;
}

/* A computation of the module as the client library's callback records it. */
struct callee {
	struct runner *r;
	const struct hlo_computation *cond, *body;
};

static int replay_fn(pe_tensor *const *args, int n_args, void *ctx, pe_tensor **results,
                     int n_results)
{
	struct callee *k = ctx;
	return replay(k->r, k->body, args, n_args, results, n_results) == ST_OK
	           ? PE_OK
	           : PE_INVALID_ARGUMENT;
}

static pe_tensor *replay_cond(pe_tensor *const *state, int n, void *ctx)
{
	struct callee *k = ctx;
	pe_tensor *pred = NULL;
	return replay(k->r, k->cond, state, n, &pred, 1) == ST_OK ? pred : NULL;
}

/* Elements of an HLO value's shape as the library sees them (an array: 1). */
static int n_values(const struct hlo_shape *s)
{
	return s->type == HT_TUPLE ? s->n_tuple : 1;
}

/* while, call and conditional: their computations recorded through the library. */
static int control_flow(struct runner *r, const struct hlo_instruction *in, struct value *v)
{
	int n = n_values(&in->shape), rv;
	pe_tensor **out = calloc((size_t)n + 1, sizeof(*out));
	if (out == NULL)
		return status_set(&r->st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	struct callee k = {.r = r};
	if (hlo_is(in, "while")) {
		const struct value *init = &r->vals[in->operands[0]->index];
		k.cond = hlo_callee(in, CALL_CONDITION, 0);
		k.body = hlo_callee(in, CALL_BODY, 0);
		rv = pe_while_loop(init->elems ? init->elems : &init->t, init->elems ? init->n : 1,
		                   replay_cond, replay_fn, &k, hlo_known_trip_count(in), out);
	} else if (hlo_is(in, "call")) {
		pe_tensor **args = calloc((size_t)in->n_operands + 1, sizeof(*args));
		for (int j = 0; args != NULL && j < in->n_operands; j++)
			args[j] = arg(r, in, j);
		k.body = in->to_apply;
		rv = args ? pe_call(args, in->n_operands, replay_fn, &k, out, n)
		          : PE_RESOURCE_EXHAUSTED;
		free(args);
	} else { /* conditional */
		int branches = in->n_operands - 1;
		pe_tensor *const **bargs = calloc((size_t)branches + 1, sizeof(*bargs));
		int *nargs = calloc((size_t)branches + 1, sizeof(int));
		pe_computation_fn *fns = calloc((size_t)branches + 1, sizeof(*fns));
		struct callee *ks = calloc((size_t)branches + 1, sizeof(*ks));
		for (int b = 0; bargs && nargs && fns && ks && b < branches; b++) {
			struct value *op = &r->vals[in->operands[b + 1]->index];
			bargs[b] = op->elems ? op->elems : &op->t;
			nargs[b] = op->elems ? op->n : 1;
			fns[b] = replay_fn;
			ks[b] = (struct callee){.r = r, .body = hlo_callee(in, CALL_BRANCH, b)};
		}
		void **ctxs = calloc((size_t)branches + 1, sizeof(void *));
		for (int b = 0; ctxs && ks && b < branches; b++)
			ctxs[b] = &ks[b];
		rv = bargs && nargs && fns && ks && ctxs
		         ? pe_conditional(arg(r, in, 0), branches, bargs, nargs, fns, ctxs, out, n)
		         : PE_RESOURCE_EXHAUSTED;
		free(ctxs);
		free(bargs);
		free(nargs);
		free(fns);
		free(ks);
	}
	if (rv != PE_OK) {
		free(out);
		if (r->st.code != ST_OK)
			return r->st.code;
		return status_set(&r->st, pe_last_code(r->c) ? pe_last_code(r->c) : rv,
		                  "line %d: %s (%s): %s", in->line, in->name, in->opcode,
		                  pe_last_error(r->c));
	}
	if (in->shape.type == HT_TUPLE) {
		v->elems = out;
		v->n = n;
		v->own_elems = true;
	} else {
		v->t = out[0];
		free(out);
	}
	return ST_OK;
}

/* Not an op of this kind: the next kind is tried. */
#define NOT_THIS_KIND (-1)

/* tuple, and opt-barrier (the same elements, through the library's barrier). */
static int record_tuple(struct runner *r, const struct hlo_instruction *in, struct value *v,
                        bool barrier)
{
	const struct value *src = barrier ? &r->vals[in->operands[0]->index] : NULL;
	v->n = src ? src->n : in->n_operands;
	v->elems = calloc((size_t)v->n + 1, sizeof(*v->elems));
	if (v->elems == NULL)
		return status_set(&r->st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	for (int k = 0; k < v->n; k++)
		v->elems[k] = src ? src->elems[k] : arg(r, in, k);
	if (src != NULL && pe_optimization_barrier(v->elems, v->n) != PE_OK)
		return status_set(&r->st, pe_last_code(r->c), "line %d: %s", in->line,
		                  pe_last_error(r->c));
	return ST_OK;
}

/*
 * A constant: one value (a scalar, or one value for every element) stays a constant the
 * compiler sees as such; an array is uploaded in the module's layout (*uploaded).
 */
static int record_constant(struct runner *r, const struct hlo_instruction *in, int dtype,
                           struct value *v, bool *uploaded)
{
	const struct hlo_shape *s = &in->shape;
	int64_t count = hlo_shape_elements(s);
	double *nums = calloc((size_t)count + 1, sizeof(double));
	if (nums == NULL)
		return status_set(&r->st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	int64_t got = literal_numbers(in->literal ? in->literal : "", nums, count);
	if (got != count && !(count > 0 && got == 1)) {
		free(nums);
		return status_set(&r->st, ST_INVALID_ARGUMENT,
		                  "line %d: %s: the literal has %lld values, the shape %lld",
		                  in->line, in->name, (long long)got, (long long)count);
	}
	if (s->rank == 0 || got == 1) {
		v->is_scalar_constant = true;
		v->scalar = nums[0];
		v->t = pe_full(r->c, dtype, s->dims, s->rank, nums[0]);
	} else {
		size_t es = dtype_size(dtype);
		unsigned char *bytes = malloc((size_t)count * es + 1);
		for (int64_t i = 0; bytes != NULL && i < count; i++)
			dtype_store(dtype, bytes, i, nums[i]);
		int world = pe_world_size(r->c);
		const void **per_core = calloc((size_t)world, sizeof(void *));
		for (int k = 0; per_core != NULL && k < world; k++)
			per_core[k] = bytes;
		char layout[256];
		v->t =
		    bytes && per_core
		        ? pe_upload_layout(r->c, dtype, s->dims, s->rank,
		                           hlo_layout_format(layout, sizeof(layout), s), per_core)
		        : NULL;
		*uploaded = true;
		free(per_core);
		free(bytes);
	}
	free(nums);
	return ST_OK;
}

/* Ops that take their operands and at most a plain attribute: v->t, or NOT_THIS_KIND. */
static int record_plain(struct runner *r, const struct hlo_instruction *in, const char *op,
                        int dtype, struct value *v)
{
	const struct hlo_shape *s = &in->shape;
	pe_tensor *(*fn2)(pe_tensor *, pe_tensor *);
	pe_tensor *(*fn1)(pe_tensor *);
	if (strcmp(op, "broadcast") == 0) {
		/* As written (a scalar constant stays a constant), so the pod plans what XLA does.
		 */
		const struct value *src = &r->vals[in->operands[0]->index];
		v->is_scalar_constant = src->is_scalar_constant;
		v->scalar = src->scalar;
		v->t = pe_broadcast(arg(r, in, 0), s->dims, s->rank, in->dimensions);
	} else if (strcmp(op, "iota") == 0) {
		v->t = pe_iota(r->c, dtype, s->dims, s->rank, (int)in->iota_dimension);
	} else if (strcmp(op, "replica-id") == 0) {
		v->t = pe_replica_id(r->c);
	} else if (strcmp(op, "partition-id") == 0) {
		v->t = pe_partition_id(r->c);
	} else if ((fn2 = binary_fn(op)) != NULL) {
		v->t = fn2(arg(r, in, 0), arg(r, in, 1));
	} else if ((fn1 = unary_fn(op)) != NULL) {
		v->t = fn1(arg(r, in, 0));
	} else if (strcmp(op, "compare") == 0) {
		v->t = pe_compare(arg(r, in, 0), arg(r, in, 1), in->direction);
	} else if (strcmp(op, "select") == 0) {
		v->t = pe_select(arg(r, in, 0), arg(r, in, 1), arg(r, in, 2));
	} else if (strcmp(op, "transpose") == 0) {
		v->t = pe_transpose(arg(r, in, 0), in->dimensions, in->n_dimensions);
	} else if (strcmp(op, "convert") == 0) {
		v->t = pe_convert(arg(r, in, 0), dtype);
	} else if (strcmp(op, "reshape") == 0 || strcmp(op, "bitcast") == 0) {
		v->t = pe_reshape(arg(r, in, 0), s->dims, s->rank);
	} else {
		return NOT_THIS_KIND;
	}
	return ST_OK;
}

/* Array ops whose attributes are parsed and checked here: v->t, or NOT_THIS_KIND. */
static int record_shaped(struct runner *r, const struct hlo_instruction *in, const char *op,
                         struct value *v)
{
	const struct hlo_shape *s = &in->shape;
	if (strcmp(op, "dynamic-slice") == 0 || strcmp(op, "dynamic-update-slice") == 0) {
		bool update = op[8] == 'u';
		int first = update ? 2 : 1, rank = in->operands[0]->shape.rank;
		pe_tensor *starts[PE_MAX_RANK];
		if (in->n_operands != first + rank || (!update && in->n_slice_sizes != rank))
			return status_set(&r->st, ST_INVALID_ARGUMENT,
			                  "line %d: %s: needs %d start indices%s", in->line,
			                  in->name, rank, update ? "" : " and dynamic_slice_sizes");
		for (int d = 0; d < rank; d++)
			starts[d] = arg(r, in, first + d);
		v->t = update ? pe_dynamic_update_slice(arg(r, in, 0), arg(r, in, 1), starts)
		              : pe_dynamic_slice(arg(r, in, 0), starts, in->slice_sizes);
	} else if (strcmp(op, "dot") == 0) {
		if (in->has_batch_dims || in->lhs_contracting_dims == NULL ||
		    in->rhs_contracting_dims == NULL ||
		    strcmp(in->lhs_contracting_dims, "{1}") != 0 ||
		    strcmp(in->rhs_contracting_dims, "{0}") != 0)
			return unimplemented(
			    r, in,
			    "only lhs_contracting_dims={1}, rhs_contracting_dims={0} "
			    "without batch dimensions has a kernel");
		v->t = pe_dot(arg(r, in, 0), arg(r, in, 1));
	} else if (strcmp(op, "pad") == 0) {
		int64_t lo[PE_MAX_RANK], hi[PE_MAX_RANK], interior[PE_MAX_RANK];
		const struct value *init = &r->vals[in->operands[1]->index];
		if (!init->is_scalar_constant)
			return unimplemented(r, in, "the padding value must be a constant");
		if (in->padding == NULL ||
		    parse_padding(in->padding, s->rank, lo, hi, interior) != 0)
			return status_set(&r->st, ST_INVALID_ARGUMENT,
			                  "line %d: %s: bad padding=%s", in->line, in->name,
			                  in->padding ? in->padding : "(none)");
		v->t = pe_pad(arg(r, in, 0), lo, hi, interior, init->scalar);
	} else if (strcmp(op, "slice") == 0) {
		int64_t start[PE_MAX_RANK], limit[PE_MAX_RANK], stride[PE_MAX_RANK];
		int rank = in->operands[0]->shape.rank;
		if (in->slice == NULL || parse_slice(in->slice, rank, start, limit, stride) != 0)
			return status_set(&r->st, ST_INVALID_ARGUMENT, "line %d: %s: bad slice=%s",
			                  in->line, in->name, in->slice ? in->slice : "(none)");
		v->t = pe_slice(arg(r, in, 0), start, limit, stride);
	} else if (strcmp(op, "concatenate") == 0) {
		pe_tensor **parts = calloc((size_t)in->n_operands + 1, sizeof(*parts));
		for (int k = 0; parts != NULL && k < in->n_operands; k++)
			parts[k] = arg(r, in, k);
		v->t = parts && in->n_dimensions == 1
		           ? pe_concatenate(parts, in->n_operands, (int)in->dimensions[0])
		           : NULL;
		free(parts);
	} else if (strcmp(op, "reduce") == 0) {
		int red = reducer_of(in);
		if (red < 0 || red > PE_REDUCE_MIN || in->n_operands != 2)
			return unimplemented(r, in,
			                     "only one operand reduced by add, multiply, maximum "
			                     "or minimum has a kernel");
		v->t = pe_reduce_init(arg(r, in, 0), arg(r, in, 1), red, in->dimensions,
		                      in->n_dimensions);
	} else {
		return NOT_THIS_KIND;
	}
	return ST_OK;
}

/* Collectives over groups (NULL: every core): v->t, or NOT_THIS_KIND. */
static int record_collective(struct runner *r, const struct hlo_instruction *in, const char *op,
                             const pe_groups *groups, struct value *v)
{
	if (strcmp(op, "all-gather") == 0) {
		v->t = in->n_dimensions == 1
		           ? pe_all_gather_groups(arg(r, in, 0), (int)in->dimensions[0], groups)
		           : NULL;
	} else if (strcmp(op, "all-reduce") == 0 || strcmp(op, "reduce-scatter") == 0) {
		int red = reducer_of(in);
		if (red < 0)
			return unimplemented(
			    r, in, "its to_apply is not add, multiply, max, min, and, or");
		v->t = op[0] == 'a' ? pe_all_reduce(arg(r, in, 0), red, 1.0, groups)
		       : in->n_dimensions == 1
		           ? pe_reduce_scatter(arg(r, in, 0), red, (int)in->dimensions[0], groups)
		           : NULL;
	} else if (strcmp(op, "all-to-all") == 0) {
		v->t = in->n_dimensions == 1 ? pe_all_to_all(arg(r, in, 0), (int)in->dimensions[0],
		                                             (int)in->dimensions[0], groups)
		                             : NULL;
	} else if (strcmp(op, "collective-permute") == 0) {
		int64_t *pairs = NULL;
		int n = 0;
		if (in->source_target_pairs != NULL) {
			int64_t count = 0;
			for (const char *q = in->source_target_pairs; *q; q++)
				count += *q == ',';
			double *nums = calloc((size_t)count + 2, sizeof(double));
			pairs = calloc((size_t)count + 2, sizeof(int64_t));
			int64_t got = nums && pairs ? literal_numbers(in->source_target_pairs, nums,
			                                              count + 1)
			                            : 0;
			for (int64_t k = 0; k < got; k++)
				pairs[k] = (int64_t)nums[k];
			n = (int)(got / 2);
			free(nums);
		}
		v->t = pe_collective_permute(arg(r, in, 0), pairs, n);
		free(pairs);
	} else {
		return NOT_THIS_KIND;
	}
	return ST_OK;
}

/*
 * An op without a kernel: planned and accounted; refused by a pod with real bytes. A
 * tuple-shaped op is one opaque node per element, which get-tuple-element then picks. The
 * value is complete (with its layout) when this returns ST_OK.
 */
static int record_opaque(struct runner *r, const struct hlo_instruction *in, struct value *v)
{
	const struct hlo_shape *s = &in->shape;
	for (int k = 0; k < in->n_operands; k++)
		if (arg(r, in, k) == NULL)
			return unimplemented(r, in, "an op without a kernel on a tuple");
	int parts = s->type == HT_TUPLE ? s->n_tuple : 1;
	pe_tensor **ops = calloc((size_t)in->n_operands + 1, sizeof(*ops));
	pe_dtype *types = calloc((size_t)parts + 1, sizeof(*types));
	const int64_t **dims = calloc((size_t)parts + 1, sizeof(*dims));
	int *ranks = calloc((size_t)parts + 1, sizeof(int));
	if (ops == NULL || types == NULL || dims == NULL || ranks == NULL ||
	    (s->type == HT_TUPLE &&
	     (v->elems = calloc((size_t)parts + 1, sizeof(*v->elems))) == NULL)) {
		free(ops);
		free(types);
		free(dims);
		free(ranks);
		return status_set(&r->st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	}
	for (int k = 0; k < in->n_operands; k++)
		ops[k] = arg(r, in, k);
	int ok = 1;
	for (int e = 0; e < parts; e++) {
		const struct hlo_shape *es = s->type == HT_TUPLE ? &s->tuple[e] : s;
		int et = es->type == HT_TUPLE ? -1 : pe_type(es->type);
		ok &= et >= 0;
		types[e] = (pe_dtype)et;
		dims[e] = es->dims;
		ranks[e] = es->rank;
	}
	char name[160];
	snprintf(name, sizeof(name), "%s (%s, line %d)", in->opcode, in->name, in->line);
	int rv = !ok                   ? unimplemented(r, in, "a tuple element has no podemu type")
	         : s->type == HT_TUPLE ? pe_opaque_tuple(r->c, name, parts, types, dims, ranks, ops,
	                                                 in->n_operands, v->elems)
	                               : ((v->t = pe_opaque(r->c, name, types[0], dims[0], ranks[0],
	                                                    ops, in->n_operands)) != NULL
	                                      ? set_layout(r, in, v->t, s)
	                                      : pe_last_code(r->c));
	free(types);
	free(dims);
	free(ranks);
	free(ops);
	if (rv == ST_OK && s->type == HT_TUPLE) {
		v->n = parts;
		v->own_elems = true;
	}
	if (rv == ST_OK || r->st.code != ST_OK)
		return rv == ST_OK ? ST_OK : r->st.code;
	return status_set(&r->st, pe_last_code(r->c), "line %d: %s: %s", in->line, in->name,
	                  pe_last_error(r->c));
}

int record(struct runner *r, const struct hlo_instruction *in)
{
	struct value *v = &r->vals[in->index];
	const char *op = in->opcode;
	const struct hlo_shape *s = &in->shape;
	bool uploaded = false; /* a device buffer made in its layout already */
	int dtype = s->type == HT_TUPLE ? 0 : pe_type(s->type);
	if (s->type != HT_TUPLE && dtype < 0)
		return unimplemented(r, in, "its element type has no kernels");
	for (int k = 0; k < in->n_operands; k++)
		if (in->operands[k]->shape.rank > PE_MAX_RANK || s->rank > PE_MAX_RANK)
			return unimplemented(r, in, "the pod runs arrays of rank 8 at most");
	pe_groups *groups = NULL;
	if (in->replica_groups != NULL && strcmp(in->replica_groups, "{}") != 0 &&
	    (groups = pe_groups_parse(r->c, in->replica_groups)) == NULL)
		return status_set(&r->st, pe_last_code(r->c), "line %d: %s: %s", in->line, in->name,
		                  pe_last_error(r->c));
	/*
	 * An async pair runs as its collective: the -start's value is (operand, result) as XLA
	 * writes it (the result alone for all-reduce-start), the -done's the result.
	 */
	size_t len = strlen(op);
	if (len > 5 && strcmp(op + len - 5, "-done") == 0) {
		const struct value *start = &r->vals[in->operands[0]->index];
		v->t = start->elems != NULL && start->n > 1 ? start->elems[1] : start->t;
		return ST_OK;
	}
	char base[64];
	bool async_start = len > 6 && len < sizeof(base) && strcmp(op + len - 6, "-start") == 0;
	if (async_start) {
		snprintf(base, sizeof(base), "%.*s", (int)(len - 6), op);
		op = base;
	}
	if (strcmp(op, "while") == 0 || strcmp(op, "call") == 0 || strcmp(op, "conditional") == 0)
		return control_flow(r, in, v);
	if (strcmp(op, "tuple") == 0 || strcmp(op, "opt-barrier") == 0)
		return record_tuple(r, in, v, strcmp(op, "opt-barrier") == 0);
	if (strcmp(op, "get-tuple-element") == 0) {
		const struct value *t = &r->vals[in->operands[0]->index];
		if (t->elems == NULL || in->tuple_index >= t->n)
			return unimplemented(r, in, "its operand is not a tuple podemu built");
		v->t = t->elems[in->tuple_index];
		return ST_OK;
	}
	int rv = strcmp(op, "constant") == 0 ? record_constant(r, in, dtype, v, &uploaded)
	                                     : record_plain(r, in, op, dtype, v);
	if (rv == NOT_THIS_KIND)
		rv = record_shaped(r, in, op, v);
	if (rv == NOT_THIS_KIND)
		rv = record_collective(r, in, op, groups, v);
	if (rv == NOT_THIS_KIND) /* its layout set, a tuple's elements made */
		return record_opaque(r, in, v);
	if (rv != ST_OK)
		return rv;
	if (v->t == NULL)
		return status_set(&r->st,
		                  pe_last_code(r->c) ? pe_last_code(r->c) : ST_INVALID_ARGUMENT,
		                  "line %d: %s (%s): %s", in->line, in->name, in->opcode,
		                  pe_last_error(r->c)[0] ? pe_last_error(r->c) : "bad attributes");
	const struct hlo_shape *ls = s->type == HT_TUPLE && s->n_tuple > 1 ? &s->tuple[1] : s;
	if (!uploaded && ls->type != HT_TUPLE && set_layout(r, in, v->t, ls) != ST_OK)
		return r->st.code;
	if (async_start && s->type == HT_TUPLE) {
		v->n = 2;
		v->elems = calloc(3, sizeof(*v->elems));
		if (v->elems == NULL)
			return status_set(&r->st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		v->elems[0] = arg(r, in, 0);
		v->elems[1] = v->t;
	}
	return ST_OK;
}
