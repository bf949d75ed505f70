/* Replica groups, device meshes and the collectives recorded over them. */
#include "podemu/podemu.h"

#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "client.h"
#include "collective.h"

static pe_tensor *collective(pe_tensor *a, enum opcode op, const pe_groups *g, int dimension,
                             int reduce, double scale);

pe_tensor *pe_all_gather(pe_tensor *a, int dimension)
{
	return collective(a, OP_ALL_GATHER, NULL, dimension, 0, 0);
}

pe_groups *pe_groups_parse(pe_client *c, const char *text)
{
	int64_t *ids;
	int *sizes, n;
	struct status st;
	if (coll_groups_parse(text, &ids, &sizes, &n, &st) != ST_OK) {
		client_fail_status(c, &st);
		return NULL;
	}
	pe_groups *g = arena_alloc(c->long_arena, sizeof(*g));
	if (g != NULL)
		g->groups = arena_calloc(c->long_arena, (size_t)n, sizeof(*g->groups));
	for (int k = 0, at = 0; g != NULL && g->groups != NULL && k < n; k++) {
		Podemu__ReplicaGroup *rg = arena_alloc(c->long_arena, sizeof(*rg));
		if (rg == NULL)
			break;
		podemu__replica_group__init(rg);
		rg->replica_ids =
		    arena_calloc(c->long_arena, (size_t)sizes[k] + 1, sizeof(int64_t));
		if (rg->replica_ids == NULL)
			break;
		memcpy(rg->replica_ids, ids + at, (size_t)sizes[k] * sizeof(int64_t));
		rg->n_replica_ids = (size_t)sizes[k];
		at += sizes[k];
		g->groups[g->num_groups++] = rg;
	}
	free(ids);
	free(sizes);
	if (g == NULL || g->num_groups != (size_t)n) {
		client_fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
		return NULL;
	}
	return g;
}

int pe_set_mesh(pe_client *c, const char *spec)
{
	char **names;
	int64_t *sizes;
	int n;
	struct status st;
	if (coll_mesh_parse(spec, &names, &sizes, &n, &st) != ST_OK)
		return client_fail_status(c, &st);
	int64_t product = 1;
	for (int i = 0; i < n; i++)
		product *= sizes[i];
	int rv = ST_OK;
	Podemu__MeshAxis **mesh = arena_calloc(c->long_arena, (size_t)n, sizeof(*mesh));
	if (product != c->world_size)
		rv = client_fail(c, ST_INVALID_ARGUMENT,
		                 "mesh '%s' has %lld devices but the pod has %d cores", spec,
		                 (long long)product, c->world_size);
	for (int i = 0; rv == ST_OK && i < n; i++) {
		if (mesh == NULL ||
		    (mesh[i] = arena_alloc(c->long_arena, sizeof(**mesh))) == NULL) {
			rv = client_fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
			break;
		}
		podemu__mesh_axis__init(mesh[i]);
		mesh[i]->name = arena_strdup(c->long_arena, names[i]);
		mesh[i]->size = sizes[i];
	}
	if (rv == ST_OK) {
		c->mesh = mesh;
		c->num_mesh = (size_t)n;
	}
	coll_mesh_free(names, sizes, n);
	return rv;
}

pe_groups *pe_groups_axis(pe_client *c, const char *axis)
{
	for (size_t i = 0; i < c->num_mesh; i++) {
		if (strcmp(c->mesh[i]->name, axis) != 0)
			continue;
		pe_groups *g = arena_alloc(c->long_arena, sizeof(*g));
		if (g == NULL || (g->axis = arena_strdup(c->long_arena, axis)) == NULL) {
			client_fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
			return NULL;
		}
		return g;
	}
	client_fail(c, ST_INVALID_ARGUMENT,
	            "the mesh has no axis named '%s' (call pe_set_mesh first)", axis);
	return NULL;
}

static void set_groups(Podemu__Node *n, const pe_groups *g)
{
	if (g == NULL)
		return;
	if (g->axis != NULL) {
		n->mesh_axis = (char *)g->axis;
		return;
	}
	n->replica_groups = g->groups;
	n->n_replica_groups = g->num_groups;
}

static pe_tensor *collective(pe_tensor *a, enum opcode op, const pe_groups *g, int dimension,
                             int reduce, double scale)
{
	if (a == NULL)
		return NULL;
	if (reduce < 0 || reduce > PE_REDUCE_OR) {
		client_fail(a->c, ST_INVALID_ARGUMENT, "%s: unknown reduction %d", opcode_name(op),
		            reduce);
		return NULL;
	}
	Podemu__Node *n = client_node_new(a->c, op);
	if (n == NULL)
		return NULL;
	set_groups(n, g);
	if (op == OP_ALL_GATHER || op == OP_REDUCE_SCATTER) {
		int64_t d = dimension;
		n->dimensions = client_dims_copy(a->c, &d, 1);
		n->n_dimensions = 1;
	}
	n->reducer = (char *)reducer_name((enum reducer)reduce);
	n->scale = scale;
	return client_unary(a, n);
}

pe_tensor *pe_all_gather_groups(pe_tensor *a, int dimension, const pe_groups *g)
{
	return collective(a, OP_ALL_GATHER, g, dimension, 0, 0);
}

pe_tensor *pe_all_reduce(pe_tensor *a, pe_reduce_op op, double scale, const pe_groups *g)
{
	return collective(a, OP_ALL_REDUCE, g, 0, (int)op, scale);
}

pe_tensor *pe_reduce_scatter(pe_tensor *a, pe_reduce_op op, int dimension, const pe_groups *g)
{
	return collective(a, OP_REDUCE_SCATTER, g, dimension, (int)op, 0);
}

pe_tensor *pe_all_to_all(pe_tensor *a, int split_dimension, int concat_dimension,
                         const pe_groups *g)
{
	if (a == NULL)
		return NULL;
	Podemu__Node *n = client_node_new(a->c, OP_ALL_TO_ALL);
	if (n == NULL)
		return NULL;
	set_groups(n, g);
	n->split_dimension = split_dimension;
	n->concat_dimension = concat_dimension;
	/* The group size: every group of a valid set has the same size. */
	n->split_count = a->c->world_size;
	if (g != NULL && g->axis != NULL) {
		for (size_t i = 0; i < a->c->num_mesh; i++)
			if (strcmp(a->c->mesh[i]->name, g->axis) == 0)
				n->split_count = a->c->mesh[i]->size;
	} else if (g != NULL && g->num_groups > 0) {
		n->split_count = (int64_t)g->groups[0]->n_replica_ids;
	}
	return client_unary(a, n);
}

pe_tensor *pe_collective_permute(pe_tensor *a, const int64_t *pairs, int num_pairs)
{
	if (a == NULL)
		return NULL;
	if (num_pairs < 0 || (num_pairs > 0 && pairs == NULL)) {
		client_fail(a->c, ST_INVALID_ARGUMENT, "collective-permute: %d pairs", num_pairs);
		return NULL;
	}
	Podemu__Node *n = client_node_new(a->c, OP_COLLECTIVE_PERMUTE);
	if (n == NULL)
		return NULL;
	n->source_target_pairs = client_dims_copy(a->c, pairs, (size_t)num_pairs * 2);
	n->n_source_target_pairs = (size_t)num_pairs * 2;
	return client_unary(a, n);
}
