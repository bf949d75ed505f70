/*
 * Replica groups of collectives: explicit groups checked with XLA's verifier rules and words,
 * groups derived from a named axis of a device mesh, and lookups by ordinal.
 */
#ifndef PODEMU_COLLECTIVE_H
#define PODEMU_COLLECTIVE_H

#include <stddef.h>
#include <stdint.h>

#include "podemu.pb-c.h"
#include "status.h"

/* Most axes a device mesh may have. */
#define SHAPE_AXES_MAX 8

struct coll_groups {
	int num_groups;
	int *start;       /* [num_groups]: index of the group's first id in ids */
	int *size;        /* [num_groups] */
	int64_t *ids;     /* group members, in group order */
	int *group_of;    /* [world]: group index of each ordinal */
	int *position_of; /* [world]: position of each ordinal in its group */
	int uniform_size; /* the common size, or -1 */
};

/*
 * Resolves the groups of a collective node: its mesh_axis (over mesh), else its replica_groups,
 * else one group of every core. Checks XLA's rules: no empty group, no repeated replica, every
 * replica in [0, world) named, and (unless non_uniform_ok, as for all-reduce) equal sizes.
 * label prefixes errors. On success the caller frees out with coll_groups_free.
 */
int coll_groups_resolve(struct coll_groups *out, const Podemu__Node *n,
                        Podemu__MeshAxis *const *mesh, size_t n_mesh, int world, int non_uniform_ok,
                        const char *label, struct status *st);
void coll_groups_free(struct coll_groups *g);

/*
 * Parses XLA's text form of replica groups, "{{0,1},{2,3}}" or the iota form "[2,4]<=[8]",
 * into a flat id list and per-group sizes (malloc'd; free both). INVALID_ARGUMENT names the
 * column of a syntax error.
 */
int coll_groups_parse(const char *text, int64_t **ids, int **sizes, int *num_groups,
                      struct status *st);

/*
 * Parses XLA's text form of replica groups and resolves them as coll_groups_resolve does (the
 * same rules and words). On success the caller frees out with coll_groups_free.
 */
int coll_groups_from_text(struct coll_groups *out, const char *text, int world, int non_uniform_ok,
                          const char *label, struct status *st);

/* Parses "data=4,model=2" into names and sizes (malloc'd, names too; see coll_mesh_free). */
int coll_mesh_parse(const char *text, char ***names, int64_t **sizes, int *n, struct status *st);
void coll_mesh_free(char **names, int64_t *sizes, int n);

#endif
