/*
 * podemu client library: connect to a pod, record lazy step graphs (torch_xla semantics), run
 * them with pe_mark_step, move tensors between host and device, read memory statistics.
 *
 * Ops are recorded, not run: every op returns a new pending tensor whose shape is known at once.
 * pe_mark_step compiles the pending graph and runs it on every core (SPMD); the tensors the
 * program still holds become device buffers and the rest are temporaries of that step. A
 * tensor released before pe_mark_step never becomes an output.
 *
 * Errors: functions that return int return a pe_code (PE_OK is 0); functions that return a
 * tensor return NULL on error. Either way pe_last_error() gives the message, in XLA's words
 * where XLA has them ("RESOURCE_EXHAUSTED: ..."). An op given a NULL tensor returns NULL, so a
 * chain of ops can be checked once at the end.
 *
 * Thread safety: a pe_client and its tensors are used by one thread at a time.
 */
#ifndef PODEMU_PODEMU_H
#define PODEMU_PODEMU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(PE_BUILDING_LIBRARY)
#define PE_API __attribute__((visibility("default")))
#else
#define PE_API
#endif

/* Status codes, numbered as absl / gRPC. */
typedef enum pe_code {
	PE_OK = 0,
	PE_CANCELLED = 1,
	PE_UNKNOWN = 2,
	PE_INVALID_ARGUMENT = 3,
	PE_DEADLINE_EXCEEDED = 4,
	PE_NOT_FOUND = 5,
	PE_ALREADY_EXISTS = 6,
	PE_PERMISSION_DENIED = 7,
	PE_RESOURCE_EXHAUSTED = 8,
	PE_FAILED_PRECONDITION = 9,
	PE_ABORTED = 10,
	PE_OUT_OF_RANGE = 11,
	PE_UNIMPLEMENTED = 12,
	PE_INTERNAL = 13,
	PE_UNAVAILABLE = 14,
	PE_DATA_LOSS = 15,
	PE_UNAUTHENTICATED = 16,
} pe_code;

/* Element types (XLA names). */
typedef enum pe_dtype {
	PE_PRED = 1,
	PE_S32 = 2,
	PE_U8 = 3,
	PE_BF16 = 4,
	PE_F32 = 5,
	PE_U32 = 6,
} pe_dtype;

#define PE_MAX_RANK 8

typedef struct pe_client pe_client;
typedef struct pe_tensor pe_tensor;

/*
 * Connects to a coordinator. url NULL means: $PODEMU_COORDINATOR, else the address that
 * `podemu up` wrote into the state directory ($PODEMU_STATE_DIR or the default), else
 * tcp://127.0.0.1:7460. On success *out owns the client; on failure *out is NULL and the code
 * says why (the message is printed by pe_connect_error).
 */
PE_API int pe_connect(pe_client **out, const char *url);
/* The message of the last failed pe_connect on this thread. */
PE_API const char *pe_connect_error(void);
/* Releases every tensor of the client, then disconnects and frees it. NULL is allowed. */
PE_API void pe_disconnect(pe_client *c);

/* Message and code of the client's last error ("" and PE_OK when none). */
PE_API const char *pe_last_error(const pe_client *c);
PE_API int pe_last_code(const pe_client *c);

/* Pod facts. */
PE_API int pe_world_size(const pe_client *c);
PE_API int pe_num_hosts(const pe_client *c);
PE_API const char *pe_topology(const pe_client *c);
/* "host" when the pod's cores hold real bytes, "none" under --backing none ("" if unknown). */
PE_API const char *pe_backing(const pe_client *c);
/*
 * Waits until every host of the pod is registered and alive (after a restart, say). PE_OK, or
 * PE_DEADLINE_EXCEEDED with the coordinator's last reason after timeout_ms.
 */
PE_API int pe_wait_ready(pe_client *c, int timeout_ms);

/* ---- ops (lazy) ---- */

/* A tensor of shape dims filled with value on every core (XLA: broadcast of a constant). */
PE_API pe_tensor *pe_full(pe_client *c, pe_dtype dtype, const int64_t *dims, int rank,
                          double value);
/* Values counting up along dimension (XLA iota). */
PE_API pe_tensor *pe_iota(pe_client *c, pe_dtype dtype, const int64_t *dims, int rank,
                          int dimension);
/* This core's replica id as a u32 scalar. */
PE_API pe_tensor *pe_replica_id(pe_client *c);
/*
 * Uploads host data now (torch_xla's .to(device)): per_core[i] holds the bytes for core i
 * (row-major, shape dims); a NULL entry, or per_core NULL, uploads zeros.
 */
PE_API pe_tensor *pe_upload(pe_client *c, pe_dtype dtype, const int64_t *dims, int rank,
                            const void *const *per_core);
/*
 * pe_upload into a device buffer of the layout XLA would write after its shape ("{0:T(256)}",
 * "{0,1:T(2,128)}"; NULL: the pod's layout): the pod charges the buffer's bytes in it.
 */
PE_API pe_tensor *pe_upload_layout(pe_client *c, pe_dtype dtype, const int64_t *dims, int rank,
                                   const char *layout, const void *const *per_core);
/*
 * Gives a pending tensor's value a layout (as above) before mark_step: the plan sizes it so, and
 * a device buffer made from it keeps it. PE_INVALID_ARGUMENT for a tensor that is already a
 * device buffer (its layout was fixed when it was made); a layout that does not read is
 * refused by the step.
 */
PE_API int pe_set_layout(pe_tensor *t, const char *layout);

/* Elementwise, on tensors of equal shape. */
PE_API pe_tensor *pe_add(pe_tensor *a, pe_tensor *b);
PE_API pe_tensor *pe_subtract(pe_tensor *a, pe_tensor *b);
PE_API pe_tensor *pe_multiply(pe_tensor *a, pe_tensor *b);
PE_API pe_tensor *pe_maximum(pe_tensor *a, pe_tensor *b);
PE_API pe_tensor *pe_minimum(pe_tensor *a, pe_tensor *b);
PE_API pe_tensor *pe_convert(pe_tensor *a, pe_dtype dtype);
PE_API pe_tensor *pe_negate(pe_tensor *a);
/* XLA divide: integer division rounds toward zero, x / 0 is -1 (all bits set). */
PE_API pe_tensor *pe_divide(pe_tensor *a, pe_tensor *b);
/* Logical on pred, bitwise on integers. */
PE_API pe_tensor *pe_and(pe_tensor *a, pe_tensor *b);
PE_API pe_tensor *pe_or(pe_tensor *a, pe_tensor *b);
PE_API pe_tensor *pe_not(pe_tensor *a);
PE_API pe_tensor *pe_abs(pe_tensor *a);
/* Floating point only. */
PE_API pe_tensor *pe_exponential(pe_tensor *a);
PE_API pe_tensor *pe_log(pe_tensor *a);
PE_API pe_tensor *pe_tanh(pe_tensor *a);
PE_API pe_tensor *pe_sqrt(pe_tensor *a);
PE_API pe_tensor *pe_rsqrt(pe_tensor *a);
/* A pred tensor: direction is XLA's "EQ", "NE", "LT", "LE", "GT" or "GE". */
PE_API pe_tensor *pe_compare(pe_tensor *a, pe_tensor *b, const char *direction);
/* Elementwise pred ? on_true : on_false (pred has the dimensions of the others). */
PE_API pe_tensor *pe_select(pe_tensor *pred, pe_tensor *on_true, pe_tensor *on_false);
/*
 * XLA broadcast: a result of shape dims in which dimension broadcast_dimensions[i] (increasing,
 * rank(a) entries) is a's dimension i and every other dimension repeats a.
 */
PE_API pe_tensor *pe_broadcast(pe_tensor *a, const int64_t *dims, int rank,
                               const int64_t *broadcast_dimensions);
/*
 * XLA partition-id. podemu runs a program as one partition replicated on every core, as
 * torch_xla does without SPMD: it is 0 everywhere (replica-id tells the cores apart).
 */
PE_API pe_tensor *pe_partition_id(pe_client *c);
/*
 * A window of sizes (rank(a) entries) starting at the scalar s32/u32 tensors starts[d], each
 * clamped to [0, dim - size] as XLA does.
 */
PE_API pe_tensor *pe_dynamic_slice(pe_tensor *a, pe_tensor *const *starts, const int64_t *sizes);
/* a with update written at starts (clamped so the update fits). */
PE_API pe_tensor *pe_dynamic_update_slice(pe_tensor *a, pe_tensor *update,
                                          pe_tensor *const *starts);
/* Dimension d of the result is dimension permutation[d] of a (XLA transpose). */
PE_API pe_tensor *pe_transpose(pe_tensor *a, const int64_t *permutation, int rank);
/*
 * An op podemu has no kernel for (name says which, e.g. "exponential"), with its result shape:
 * planned and accounted on a pod with --backing none; a pod with real bytes refuses the step
 * with UNIMPLEMENTED naming it.
 */
PE_API pe_tensor *pe_opaque(pe_client *c, const char *name, pe_dtype dtype, const int64_t *dims,
                            int rank, pe_tensor *const *operands, int n_operands);
/* pe_opaque of a tuple result (XLA's custom-call returning a tuple): its elements to out. */
PE_API int pe_opaque_tuple(pe_client *c, const char *name, int n_results, const pe_dtype *dtypes,
                           const int64_t *const *dims, const int *ranks, pe_tensor *const *operands,
                           int n_operands, pe_tensor **out);
/* Matrix product of a [m,k] and b [k,n] (XLA dot contracting a's dimension 1 with b's 0). */
PE_API pe_tensor *pe_dot(pe_tensor *a, pe_tensor *b);
PE_API pe_tensor *pe_reshape(pe_tensor *a, const int64_t *dims, int rank);
/* low/high may be negative (cropping); interior >= 0. Arrays of rank(a) entries. */
PE_API pe_tensor *pe_pad(pe_tensor *a, const int64_t *low, const int64_t *high,
                         const int64_t *interior, double value);
/* strides NULL means 1. */
PE_API pe_tensor *pe_slice(pe_tensor *a, const int64_t *starts, const int64_t *limits,
                           const int64_t *strides);
PE_API pe_tensor *pe_concatenate(pe_tensor *const *tensors, int n, int dimension);
/* Sums over the listed dimensions, which disappear from the shape. */
PE_API pe_tensor *pe_reduce_sum(pe_tensor *a, const int64_t *dimensions, int n);
/*
 * torch_xla's optimization_barrier_: in place, every tensor is replaced by the barrier's output,
 * so nothing computed before the barrier is moved after it and vice versa.
 */
PE_API int pe_optimization_barrier(pe_tensor **tensors, int n);
/* Gathers a along dimension from all cores, in ordinal order. */
PE_API pe_tensor *pe_all_gather(pe_tensor *a, int dimension);

/* ---- collectives over replica groups ---- */

/* Reductions of the reducing collectives (XLA's to_apply computations). */
typedef enum pe_reduce_op {
	PE_REDUCE_SUM,
	PE_REDUCE_PRODUCT,
	PE_REDUCE_MAX,
	PE_REDUCE_MIN,
	PE_REDUCE_AND, /* integers and pred */
	PE_REDUCE_OR,
} pe_reduce_op;

typedef struct pe_groups pe_groups;

/*
 * Replica groups in XLA's syntax, "{{0,1,2,3},{4,5,6,7}}" or the iota form "[2,4]<=[8]"; group
 * order is concatenation order. NULL on a syntax error. The client owns the result (freed by
 * pe_disconnect). Passing NULL groups to a collective means one group of every core.
 */
PE_API pe_groups *pe_groups_parse(pe_client *c, const char *text);
/*
 * Declares the device mesh, e.g. "data=4,model=2": ordinals enumerate it row-major, last axis
 * fastest, so the fastest axes stay within a host. Its product must be the world size.
 */
PE_API int pe_set_mesh(pe_client *c, const char *spec);
/* The groups of one mesh axis (the coordinator derives the replica groups). */
PE_API pe_groups *pe_groups_axis(pe_client *c, const char *axis);

/* XLA reduce over dimensions with the reduction's identity as init (add, multiply, max, min). */
PE_API pe_tensor *pe_reduce(pe_tensor *a, pe_reduce_op op, const int64_t *dimensions, int n);
/*
 * XLA reduce(a, init) over dimensions: init, a scalar of a's type, is folded in once per result
 * element (NULL: the reduction's identity, as pe_reduce).
 */
PE_API pe_tensor *pe_reduce_init(pe_tensor *a, pe_tensor *init, pe_reduce_op op,
                                 const int64_t *dimensions, int n);

PE_API pe_tensor *pe_all_gather_groups(pe_tensor *a, int dimension, const pe_groups *g);
/* torch_xla's all_reduce: reduce over each group, then multiply by scale (1.0: none). */
PE_API pe_tensor *pe_all_reduce(pe_tensor *a, pe_reduce_op op, double scale, const pe_groups *g);
/* Reduce over each group and keep this core's shard of dimension (size / group size). */
PE_API pe_tensor *pe_reduce_scatter(pe_tensor *a, pe_reduce_op op, int dimension,
                                    const pe_groups *g);
/* Split split_dimension into group-size pieces, send piece j to member j, concatenate the
 * received pieces along concat_dimension (split_count is the group size). */
PE_API pe_tensor *pe_all_to_all(pe_tensor *a, int split_dimension, int concat_dimension,
                                const pe_groups *g);
/* Send to targets: pairs = {source0, target0, source1, target1, ...}; a core that is no target
 * gets zeros. */
PE_API pe_tensor *pe_collective_permute(pe_tensor *a, const int64_t *pairs, int num_pairs);

/*
 * Per-collective timings of the last pe_mark_step: for the k-th collective of the step (in
 * recording order), the longest time any core spent in it, in microseconds, and the algorithm
 * the coordinator chose. Returns the number of collectives, or a negative pe_code.
 */
PE_API int pe_last_step_collectives(pe_client *c, int64_t *micros, const char **algorithms,
                                    int max);
/*
 * The span of the last step's collectives first..last (recording order) on its slowest core:
 * from the start of first to the end of last, in microseconds, as nccl-tests times a loop of
 * collectives on each rank. Unlike the sum of pe_last_step_collectives' times, a core's wait
 * for a slower one is counted once. Negative when there is no such collective.
 */
PE_API int64_t pe_last_step_collectives_span(pe_client *c, int first, int last);
/* Collective scratch the last step reserved per core for its k-th collective, in bytes. */
PE_API int64_t pe_last_step_scratch_bytes(pe_client *c, int k);

/*
 * The receive slots of the last step: chunks from peer hosts that cannot be read straight
 * into place (partial sums to combine, copies whose receive is not open yet) wait there, in
 * each core's reservation. reserved_bytes: each core's share (0 on one host);
 * peak_host_bytes: the most any host's slots held at once (its cores' shares together);
 * outside_chunks: chunks that found no slot and waited in host memory outside HBM (0 unless
 * the plan was short).
 */
typedef struct {
	int64_t reserved_bytes;
	int64_t peak_host_bytes;
	int64_t outside_chunks;
} pe_receive_info;
PE_API void pe_last_step_receive(pe_client *c, pe_receive_info *out);

/* ---- control flow: computations recorded by functions ---- */

/*
 * A computation's body: records ops over its n_args parameter tensors and writes n_results
 * tensors to results; returns PE_OK (else the recording fails with that code). The tensors it
 * sees and makes belong to the computation: they cannot be used outside it and are freed when
 * its recording ends; tensors from outside cannot be used inside (pass them in).
 */
typedef int (*pe_computation_fn)(pe_tensor *const *args, int n_args, void *ctx, pe_tensor **results,
                                 int n_results);
/* A loop condition: a pred[] tensor computed from the state. */
typedef pe_tensor *(*pe_cond_fn)(pe_tensor *const *state, int n, void *ctx);

/*
 * torch's while_loop(cond_fn, body_fn, carried_inputs), as XLA's While: the state is init[n]
 * (one tensor: the state itself; more: a tuple of them); cond and body are called once each,
 * now, to record their computations (body writes the next state, of the same shapes). The
 * final state goes to out[n]. known_trip_count (XLA's backend_config; 0 when unknown) is how
 * often a pod without bytes runs the body, as it cannot evaluate the condition.
 */
PE_API int pe_while_loop(pe_tensor *const *init, int n, pe_cond_fn cond, pe_computation_fn body,
                         void *ctx, int64_t known_trip_count, pe_tensor **out);
/* XLA's Call: fn over args[n_args] records the callee; its n_out results go to out. */
PE_API int pe_call(pe_tensor *const *args, int n_args, pe_computation_fn fn, void *ctx,
                   pe_tensor **out, int n_out);
/*
 * XLA's Conditional: index (a pred[]: branch 0 when true, 1 when false; or an s32[]: that
 * branch, the last when out of range) picks which of n_branches runs; branch k gets its
 * n_branch_args[k] tensors branch_args[k] (one: itself; more: a tuple of them) and all write
 * n_out results of the same shapes, which go to out; branches[k] is called with ctxs[k].
 */
PE_API int pe_conditional(pe_tensor *index, int n_branches, pe_tensor *const *const *branch_args,
                          const int *n_branch_args, const pe_computation_fn *branches,
                          void *const *ctxs, pe_tensor **out, int n_out);

/* ---- execution ---- */

/*
 * Compiles and runs the pending graph on every core. The tensors still held become device
 * buffers. On failure (e.g. RESOURCE_EXHAUSTED) the pending tensors become unusable and the
 * pod keeps its earlier device buffers.
 */
PE_API int pe_mark_step(pe_client *c);

/*
 * pe_mark_step without waiting for the step, as torch_xla's mark_step: the step is sent and
 * its outputs become device buffers at once (ops may read them in the next step, which is
 * then sent before this one has finished); the call waits only for the step sent before it,
 * so that at most two are in flight. Anything else that talks to the pod (pe_fetch, memory
 * statistics, pe_release of such a buffer, pe_mark_step) first waits for the step in flight.
 * A failure of a step sent so is returned by the next pe_mark_step_async, pe_mark_step or
 * pe_wait_device_ops ("step N of this session (sent by mark_step_async): ..."); its outputs
 * then have no value, and a step that read them fails too. pe_last_step_* describe the last
 * step that finished.
 */
PE_API int pe_mark_step_async(pe_client *c);
/*
 * Waits until every step sent by pe_mark_step_async has finished (torch_xla's
 * wait_device_ops); returns the first failure among them not yet reported, or PE_OK.
 */
PE_API int pe_wait_device_ops(pe_client *c);

/* What a step would need on each core (the plan is the same on every core). */
typedef struct pe_step_plan {
	int64_t argument_bytes;   /* device buffers the step reads */
	int64_t output_bytes;     /* tensors still held, which become device buffers */
	int64_t temp_bytes;       /* everything else, reserved for the step's duration */
	int64_t peak_bytes;       /* the sum: what the step needs at once */
	int64_t bytes_limit;      /* usable HBM per core */
	int fits;                 /* peak_bytes <= bytes_limit */
	char oom_message[1024];   /* XLA's "Ran out of memory in memory space hbm..." when not */
	int combined_collectives; /* collectives the coordinator merged into an earlier one */
	int delayed_nodes;        /* computations its memory-aware scheduler ran later */
	int fused_nodes;          /* elementwise nodes fused into a later one: no HBM buffer */
	int program_cache_hit;    /* the same graph was compiled before and its program reused */
	/*
	 * Of temp_bytes, each core's receive slots: where chunks from other hosts wait that cannot
	 * be read straight into place (pe_last_step_receive); 0 on one host.
	 */
	int64_t receive_bytes;
} pe_step_plan;

/*
 * Compile-only mark_step: checks and plans the pending graph as pe_mark_step would, and says
 * whether it fits, without running it; the pending graph stays pending. PE_OK whether it fits
 * or not (see out->fits); an error for a graph that is wrong.
 */
PE_API int pe_plan_step(pe_client *c, pe_step_plan *out);

/*
 * Copies a tensor from one core into dst (dst_bytes must be the tensor's byte size). A pending
 * tensor runs pe_mark_step first, as torch_xla does. Under --backing none there are no bytes:
 * PE_FAILED_PRECONDITION.
 */
PE_API int pe_fetch(pe_tensor *t, int ordinal, void *dst, size_t dst_bytes);

/* Drops the tensor; its device buffer is freed once no pending op reads it. NULL is allowed. */
PE_API void pe_release(pe_tensor *t);

/* Shape of a tensor; dims must hold PE_MAX_RANK entries. */
PE_API int pe_tensor_shape(const pe_tensor *t, pe_dtype *dtype, int64_t *dims, int *rank);
PE_API int64_t pe_tensor_bytes(const pe_tensor *t);

/* ---- memory ---- */

/* torch_xla's get_memory_info view plus PJRT's statistics, for one core. */
typedef struct pe_memory_info {
	int ordinal;
	int host;
	int64_t bytes_used;
	int64_t bytes_limit;
	int64_t peak_bytes_used;
	/* PJRT names */
	int64_t bytes_in_use;
	int64_t peak_bytes_in_use;
	int64_t num_allocs;
	int64_t largest_alloc_size;
	int64_t bytes_reserved;
	int64_t peak_bytes_reserved;
	int64_t bytes_reservable_limit;
	int64_t largest_free_block_bytes;
} pe_memory_info;

/* Statistics of core ordinal. */
PE_API int pe_memory_info_get(pe_client *c, int ordinal, pe_memory_info *out);
/* Statistics of every core, in ordinal order; out holds pe_world_size() entries. */
PE_API int pe_memory_info_all(pe_client *c, pe_memory_info *out, int n);

/* Name of a code ("RESOURCE_EXHAUSTED"). */
PE_API const char *pe_code_name(int code);

/* ---- the compiler, offline (no pod needed) ---- */

typedef struct pe_compile_options {
	const char *topology;            /* a preset ("v3-8", "v4-32"); NULL: v3-8 */
	int layout_none;                 /* unpadded bytes instead of TPU tiles (--layout none) */
	const char *all_gather_strategy; /* NULL or "native", "via-all-reduce", "decomposed" */
	int no_alias;                    /* a strategy's all-reduce never reuses its operand */
	const char *name;                /* names the text in errors (its path); NULL: "module" */
} pe_compile_options;

/*
 * `podemu compile --json` as a call: reads HLO text (len bytes) and plans it per core of the
 * topology (o NULL: the defaults). *report_json receives the report (malloc'd, free it with
 * pe_free): per core the figures and "fits"; a module that does not fit is PE_OK, "fits" false
 * and XLA's RESOURCE_EXHAUSTED text under "error". Text that does not read or verify returns
 * its code, with the report carrying the error.
 */
PE_API int pe_compile_hlo(const char *text, size_t len, const pe_compile_options *o,
                          char **report_json);
/* Frees what the library allocated for the caller (a report). */
PE_API void pe_free(void *p);

#ifdef __cplusplus
}
#endif

#endif
