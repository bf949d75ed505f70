/*
 * Reference kernels for the ops a core executes on real bytes (--backing host). Each reads its
 * operands and writes its whole result; shapes were checked by the coordinator.
 */
#ifndef PODEMU_KERNELS_H
#define PODEMU_KERNELS_H

#include <stdint.h>

#include "dtype.h"
#include "graph.h"
#include "status.h"

#define KERNEL_MAX_OPERANDS 64

struct kernel_call {
	enum opcode op;
	const Podemu__Node *node; /* attributes */
	const struct shape *out_shape;
	void *out;
	int num_in;
	const struct shape *in_shapes[KERNEL_MAX_OPERANDS];
	const void *in[KERNEL_MAX_OPERANDS];
	int64_t replica_id;
};

/* Runs one kernel. Returns UNIMPLEMENTED for ops without a kernel, INTERNAL on host OOM. */
int kernel_run(const struct kernel_call *k, struct status *st);

/*
 * dst[i] = a[i] (op) b[i] for the nbytes / element-size elements of dtype: the reduction step
 * of the reducing collectives. Integers wrap, pred and/or are logical, NaN propagates through
 * max and min. dst is a (a sum in place) or overlaps neither a nor b.
 */
void kernel_combine(int dtype, enum reducer red, void *dst, const void *a, const void *restrict b,
                    int64_t nbytes);

#endif
