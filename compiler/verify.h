/*
 * Verify: the checks XLA's HLO verifier makes before anything is planned, in its words.
 * Replica groups: no empty group, no repeated replica, every replica named, one size for all
 * groups except in all-reduce; collective shapes against the group size; tuple arity.
 */
#ifndef PODEMU_VERIFY_H
#define PODEMU_VERIFY_H

#include "hlo.h"
#include "status.h"

/*
 * The last replica_groups text verified and its (largest) group size: modules repeat the same
 * groups.
 */
struct verify_cache {
	const char *text;
	int size;
};

/*
 * Checks collective `in` on a pod of world cores and gives the size of its groups (every core
 * when it names none; the largest when they differ, as an all-reduce's may). INVALID_ARGUMENT
 * with "line L: NAME: ..." otherwise.
 */
int verify_collective(const struct hlo_instruction *in, int world, struct verify_cache *cache,
                      int *group_size, struct status *st);

/* Checks every instruction of m that XLA's verifier would refuse and podemu can tell. */
int verify_module(const struct hlo_module *m, int world, struct status *st);

#endif
