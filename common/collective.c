#include "collective.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void coll_groups_free(struct coll_groups *g)
{
	free(g->start);
	free(g->size);
	free(g->ids);
	free(g->group_of);
	free(g->position_of);
	memset(g, 0, sizeof(*g));
}

static int alloc_groups(struct coll_groups *g, int num_groups, int num_ids, int world)
{
	memset(g, 0, sizeof(*g));
	g->num_groups = num_groups;
	g->start = calloc((size_t)num_groups + 1, sizeof(int));
	g->size = calloc((size_t)num_groups + 1, sizeof(int));
	g->ids = calloc((size_t)num_ids + 1, sizeof(int64_t));
	g->group_of = calloc((size_t)world + 1, sizeof(int));
	g->position_of = calloc((size_t)world + 1, sizeof(int));
	if (!g->start || !g->size || !g->ids || !g->group_of || !g->position_of) {
		coll_groups_free(g);
		return -1;
	}
	return 0;
}

/*
 * Groups of a mesh axis: ordinals enumerate the mesh row-major (last axis fastest), and the
 * cores that agree on every other coordinate form a group, ordered along the axis. With the
 * fastest axes inside a host, groups over them stay on one host.
 */
static int mesh_groups(struct coll_groups *out, Podemu__MeshAxis *const *mesh, size_t n_mesh,
                       const char *axis, int world, const char *label, struct status *st)
{
	int64_t total = 1, stride = 1, size = 0;
	int found = -1;
	for (size_t i = 0; i < n_mesh; i++) {
		if (mesh[i]->size < 1 || mesh[i]->size > world)
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "%s: mesh axis '%s' has size %lld", label, mesh[i]->name,
			                  (long long)mesh[i]->size);
		total *= mesh[i]->size;
		if (total > world)
			break;
		if (strcmp(mesh[i]->name, axis) == 0)
			found = (int)i;
	}
	if (total != world)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: the mesh has %lld devices but the pod has %d cores", label,
		                  (long long)total, world);
	if (found < 0)
		return status_set(st, ST_INVALID_ARGUMENT, "%s: the mesh has no axis named '%s'",
		                  label, axis);
	for (size_t i = (size_t)found + 1; i < n_mesh; i++)
		stride *= mesh[i]->size;
	size = mesh[found]->size;
	int num_groups = (int)(world / size);
	if (alloc_groups(out, num_groups, world, world) != 0)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	int g = 0;
	for (int r = 0; r < world; r++) {
		/* r is a group's first member when its coordinate on the axis is 0. */
		if ((r / stride) % size != 0)
			continue;
		out->start[g] = g * (int)size;
		out->size[g] = (int)size;
		for (int64_t k = 0; k < size; k++)
			out->ids[g * size + k] = r + k * stride;
		g++;
	}
	out->uniform_size = (int)size;
	for (int gi = 0; gi < num_groups; gi++)
		for (int k = 0; k < out->size[gi]; k++) {
			int64_t id = out->ids[out->start[gi] + k];
			out->group_of[id] = gi;
			out->position_of[id] = k;
		}
	return ST_OK;
}

int coll_groups_resolve(struct coll_groups *out, const Podemu__Node *n,
                        Podemu__MeshAxis *const *mesh, size_t n_mesh, int world, int non_uniform_ok,
                        const char *label, struct status *st)
{
	if (n->mesh_axis != NULL && n->mesh_axis[0] != '\0')
		return mesh_groups(out, mesh, n_mesh, n->mesh_axis, world, label, st);
	if (n->n_replica_groups == 0) {
		if (alloc_groups(out, 1, world, world) != 0)
			return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		out->size[0] = world;
		out->uniform_size = world;
		for (int r = 0; r < world; r++) {
			out->ids[r] = r;
			out->position_of[r] = r;
		}
		return ST_OK;
	}
	size_t total = 0;
	for (size_t g = 0; g < n->n_replica_groups; g++) {
		if (n->replica_groups[g] == NULL || n->replica_groups[g]->n_replica_ids == 0)
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "%s: Instruction cannot have an empty replica group",
			                  label);
		total += n->replica_groups[g]->n_replica_ids;
		if (total > (size_t)world)
			break;
	}
	/* At most `world` ids are kept: each is below world, and a repeat is refused first. */
	if (alloc_groups(out, (int)n->n_replica_groups,
	                 (int)(total < (size_t)world ? total : (size_t)world), world) != 0)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	unsigned char *seen = calloc((size_t)world, 1);
	int rv = ST_OK;
	int at = 0;
	if (seen == NULL) {
		rv = status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
		goto out;
	}
	out->uniform_size = (int)n->replica_groups[0]->n_replica_ids;
	for (size_t g = 0; g < n->n_replica_groups && rv == ST_OK; g++) {
		const Podemu__ReplicaGroup *rg = n->replica_groups[g];
		out->start[g] = at;
		out->size[g] = (int)rg->n_replica_ids;
		if ((int)rg->n_replica_ids != out->uniform_size)
			out->uniform_size = -1;
		for (size_t k = 0; k < rg->n_replica_ids; k++) {
			int64_t id = rg->replica_ids[k];
			if (id < 0 || id >= world) {
				rv = status_set(st, ST_INVALID_ARGUMENT,
				                "%s: In cross-replica mode, replica groups should "
				                "contain %d replicas, but found replica %lld",
				                label, world, (long long)id);
				break;
			}
			if (seen[id]) {
				rv = status_set(st, ST_INVALID_ARGUMENT,
				                "%s: Replica %lld is repeated in instruction's "
				                "replica-groups",
				                label, (long long)id);
				break;
			}
			seen[id] = 1;
			out->ids[at++] = id;
			out->group_of[id] = (int)g;
			out->position_of[id] = (int)k;
		}
	}
	for (int r = 0; r < world && rv == ST_OK; r++)
		if (!seen[r])
			rv = status_set(st, ST_INVALID_ARGUMENT,
			                "%s: Replica %d is not named in instruction's "
			                "replica-groups",
			                label, r);
	if (rv == ST_OK && out->uniform_size < 0 && !non_uniform_ok)
		rv = status_set(st, ST_INVALID_ARGUMENT,
		                "%s: Replica groups expected to be of uniform size", label);
out:
	free(seen);
	if (rv != ST_OK)
		coll_groups_free(out);
	return rv;
}

static void skip_space(const char **p)
{
	while (isspace((unsigned char)**p))
		(*p)++;
}

static int parse_int(const char **p, int64_t *v)
{
	skip_space(p);
	char *end;
	long long x = strtoll(*p, &end, 10);
	if (end == *p)
		return -1;
	*v = x;
	*p = end;
	return 0;
}

/* "[a,b,...]" of n_max positive numbers at most; the count, or -1. */
static int parse_dims(const char **p, int64_t *out, int n_max)
{
	int n = 0;
	skip_space(p);
	if (*(*p)++ != '[')
		return -1;
	do {
		if (n == n_max || parse_int(p, &out[n]) || out[n] < 1 || out[n] > 1 << 20)
			return -1;
		n++;
		skip_space(p);
	} while (**p == ',' && (*p)++);
	return *(*p)++ == ']' ? n : -1;
}

/*
 * Iota form "[G,S]<=[d0,d1,...]T(perm)" (XLA's IotaReplicaGroupList): the ids 0..N-1 laid out
 * as an array of dims d, transposed by perm (none: as is), read in order and cut into G groups
 * of S.
 */
static int parse_iota(const char *text, int64_t **ids, int **sizes, int *num_groups,
                      struct status *st)
{
	enum { MAX_IOTA_DIMS = 16 };
	const char *p = text;
	int64_t gs[2], dims[MAX_IOTA_DIMS], perm[MAX_IOTA_DIMS];
	int n_dims, n_perm = 0;
	if (parse_dims(&p, gs, 2) != 2 || (skip_space(&p), strncmp(p, "<=", 2) != 0))
		goto bad;
	p += 2;
	if ((n_dims = parse_dims(&p, dims, MAX_IOTA_DIMS)) < 1)
		goto bad;
	skip_space(&p);
	if (*p == 'T') {
		p++;
		skip_space(&p);
		if (*p != '(')
			goto bad;
		p++;
		do {
			if (n_perm == MAX_IOTA_DIMS || parse_int(&p, &perm[n_perm]) ||
			    perm[n_perm] < 0 || perm[n_perm] >= n_dims)
				goto bad;
			n_perm++;
			skip_space(&p);
		} while (*p == ',' && p++);
		if (*p++ != ')' || n_perm != n_dims)
			goto bad;
		for (int i = 0; i < n_perm; i++)
			for (int j = 0; j < i; j++)
				if (perm[i] == perm[j])
					goto bad;
	} else {
		for (int i = 0; i < n_dims; i++)
			perm[i] = i;
	}
	skip_space(&p);
	if (*p != '\0')
		goto bad;
	/* Bounded before multiplying: each factor is at most 2^20 and so is every product. */
	int64_t n = 1;
	for (int i = 0; i < n_dims; i++)
		if ((n *= dims[i]) > 1 << 20)
			goto bad;
	if (gs[0] > n || gs[1] > n || gs[0] * gs[1] != n)
		goto bad;
	*ids = malloc((size_t)n * sizeof(int64_t));
	*sizes = malloc((size_t)gs[0] * sizeof(int));
	if (*ids == NULL || *sizes == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	/* Element i of the transposed array: its index along each transposed dimension. */
	for (int64_t i = 0; i < n; i++) {
		int64_t rest = i, index[MAX_IOTA_DIMS], id = 0;
		for (int k = n_dims - 1; k >= 0; k--) {
			index[perm[k]] = rest % dims[perm[k]];
			rest /= dims[perm[k]];
		}
		for (int k = 0; k < n_dims; k++)
			id = id * dims[k] + index[k];
		(*ids)[i] = id;
	}
	for (int64_t i = 0; i < gs[0]; i++)
		(*sizes)[i] = (int)gs[1];
	*num_groups = (int)gs[0];
	return ST_OK;
bad:
	return status_set(st, ST_INVALID_ARGUMENT,
	                  "replica groups '%s': expected [G,S]<=[N] or [G,S]<=[d0,d1,...]T(perm) "
	                  "with G*S == N == d0*d1*...",
	                  text);
}

int coll_groups_parse(const char *text, int64_t **ids, int **sizes, int *num_groups,
                      struct status *st)
{
	*ids = NULL;
	*sizes = NULL;
	*num_groups = 0;
	const char *p = text;
	skip_space(&p);
	if (*p == '[')
		return parse_iota(p, ids, sizes, num_groups, st);
	size_t cap_ids = 64, cap_groups = 16, n_ids = 0;
	int64_t *id_list = malloc(cap_ids * sizeof(int64_t));
	int *size_list = malloc(cap_groups * sizeof(int));
	int groups = 0;
	if (id_list == NULL || size_list == NULL)
		goto oom;
	if (*p++ != '{')
		goto bad;
	for (;;) {
		skip_space(&p);
		if (*p++ != '{')
			goto bad;
		if ((size_t)groups == cap_groups) {
			int *s = realloc(size_list, (cap_groups *= 2) * sizeof(int));
			if (s == NULL)
				goto oom;
			size_list = s;
		}
		size_list[groups] = 0;
		skip_space(&p);
		while (*p != '}') {
			int64_t v;
			if (parse_int(&p, &v))
				goto bad;
			if (n_ids == cap_ids) {
				int64_t *s = realloc(id_list, (cap_ids *= 2) * sizeof(int64_t));
				if (s == NULL)
					goto oom;
				id_list = s;
			}
			id_list[n_ids++] = v;
			size_list[groups]++;
			skip_space(&p);
			if (*p == ',') {
				p++;
				skip_space(&p);
				if (*p == '}')
					goto bad;
			} else if (*p != '}') {
				goto bad;
			}
		}
		p++;
		groups++;
		skip_space(&p);
		if (*p == ',') {
			p++;
			continue;
		}
		if (*p++ != '}')
			goto bad;
		skip_space(&p);
		if (*p != '\0')
			goto bad;
		break;
	}
	*ids = id_list;
	*sizes = size_list;
	*num_groups = groups;
	return ST_OK;
bad:
	free(id_list);
	free(size_list);
	return status_set(st, ST_INVALID_ARGUMENT,
	                  "replica groups '%s': syntax error at column %d (expected "
	                  "{{0,1},{2,3}} or [2,4]<=[8])",
	                  text, (int)(p - text));
oom:
	free(id_list);
	free(size_list);
	return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
}

void coll_mesh_free(char **names, int64_t *sizes, int n)
{
	for (int i = 0; names && i < n; i++)
		free(names[i]);
	free(names);
	free(sizes);
}

int coll_mesh_parse(const char *text, char ***names, int64_t **sizes, int *n, struct status *st)
{
	*names = calloc(SHAPE_AXES_MAX, sizeof(char *));
	*sizes = calloc(SHAPE_AXES_MAX, sizeof(int64_t));
	*n = 0;
	if (*names == NULL || *sizes == NULL) {
		coll_mesh_free(*names, *sizes, 0);
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	}
	const char *p = text;
	while (*p != '\0') {
		const char *eq = strchr(p, '=');
		if (eq == NULL || eq == p || *n == SHAPE_AXES_MAX)
			goto bad;
		char *end;
		long long size = strtoll(eq + 1, &end, 10);
		if (end == eq + 1 || size < 1 || (*end != ',' && *end != '\0'))
			goto bad;
		(*names)[*n] = strndup(p, (size_t)(eq - p));
		(*sizes)[*n] = size;
		(*n)++;
		p = *end == ',' ? end + 1 : end;
	}
	if (*n == 0)
		goto bad;
	return ST_OK;
bad:
	coll_mesh_free(*names, *sizes, *n);
	*names = NULL;
	*sizes = NULL;
	*n = 0;
	return status_set(st, ST_INVALID_ARGUMENT,
	                  "mesh '%s': expected NAME=SIZE[,NAME=SIZE...], e.g. data=4,model=2",
	                  text);
}

int coll_groups_from_text(struct coll_groups *out, const char *text, int world, int non_uniform_ok,
                          const char *label, struct status *st)
{
	int64_t *ids;
	int *sizes, n;
	if (coll_groups_parse(text, &ids, &sizes, &n, st) != ST_OK)
		return status_set(st, ST_INVALID_ARGUMENT, "%s: replica_groups=%s: %s", label, text,
		                  st->message);
	Podemu__ReplicaGroup *groups = calloc((size_t)n + 1, sizeof(*groups));
	Podemu__ReplicaGroup **list = calloc((size_t)n + 1, sizeof(*list));
	int rv;
	if (groups == NULL || list == NULL) {
		rv = status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	} else {
		Podemu__Node node = PODEMU__NODE__INIT;
		for (int g = 0, at = 0; g < n; g++) {
			podemu__replica_group__init(&groups[g]);
			groups[g].replica_ids = ids + at;
			groups[g].n_replica_ids = (size_t)sizes[g];
			list[g] = &groups[g];
			at += sizes[g];
		}
		node.replica_groups = list;
		node.n_replica_groups = (size_t)n;
		rv = coll_groups_resolve(out, &node, NULL, 0, world, non_uniform_ok, label, st);
	}
	free(groups);
	free(list);
	free(ids);
	free(sizes);
	return rv;
}
