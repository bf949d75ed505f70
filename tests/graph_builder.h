/* Builds step graphs for tests from an arena, one node per call. */
#ifndef PODEMU_TEST_GRAPH_BUILDER_H
#define PODEMU_TEST_GRAPH_BUILDER_H

#include <string.h>

#include "arena.h"
#include "dtype.h"
#include "podemu.pb-c.h"

struct gb {
	struct arena *a;
	Podemu__Graph g;
	Podemu__Node *nodes[256];
	Podemu__Computation *comps[16];
	Podemu__Computation *cur; /* where gb_node appends (NULL: the entry) */
};

static inline void gb_init(struct gb *b)
{
	b->a = arena_new();
	podemu__graph__init(&b->g);
	b->g.nodes = b->nodes;
	b->g.computations = b->comps;
	b->cur = NULL;
}

/* Nodes go into a new computation (its index is returned) until gb_end_computation. */
static inline int gb_begin_computation(struct gb *b, const char *name)
{
	Podemu__Computation *c = arena_alloc(b->a, sizeof(*c));
	podemu__computation__init(c);
	c->name = (char *)name;
	c->nodes = arena_calloc(b->a, 64, sizeof(Podemu__Node *));
	b->comps[b->g.n_computations] = c;
	b->cur = c;
	return (int)b->g.n_computations++;
}

static inline void gb_end_computation(struct gb *b, int root)
{
	b->cur->root = root;
	b->cur = NULL;
}

static inline int64_t *gb_ints(struct gb *b, const int64_t *v, size_t n)
{
	int64_t *p = arena_calloc(b->a, n + 1, sizeof(int64_t));
	if (n > 0)
		memcpy(p, v, n * sizeof(int64_t));
	return p;
}

static inline Podemu__Shape *gb_shape(struct gb *b, int dtype, const int64_t *dims, int rank)
{
	Podemu__Shape *s = arena_alloc(b->a, sizeof(*s));
	podemu__shape__init(s);
	s->dtype = (Podemu__DType)dtype;
	s->dims = gb_ints(b, dims, (size_t)rank);
	s->n_dims = (size_t)rank;
	return s;
}

/* Appends a node with opcode and up to 3 operands (-1 ends the list); returns its index. */
static inline Podemu__Node *gb_node(struct gb *b, const char *opcode, int x, int y, int z)
{
	Podemu__Node *n = arena_alloc(b->a, sizeof(*n));
	podemu__node__init(n);
	n->opcode = (char *)opcode;
	n->operands = arena_calloc(b->a, 3, sizeof(int32_t));
	int ops[3] = {x, y, z};
	for (int i = 0; i < 3 && ops[i] >= 0; i++)
		n->operands[n->n_operands++] = ops[i];
	if (b->cur != NULL)
		b->cur->nodes[b->cur->n_nodes++] = n;
	else
		b->nodes[b->g.n_nodes++] = n;
	return n;
}

/* A tuple shape of the given array shapes. */
static inline Podemu__Shape *gb_tuple(struct gb *b, Podemu__Shape *const *elements, size_t n)
{
	Podemu__Shape *s = arena_alloc(b->a, sizeof(*s));
	podemu__shape__init(s);
	s->tuple = true;
	s->elements = arena_calloc(b->a, n + 1, sizeof(Podemu__Shape *));
	memcpy(s->elements, elements, n * sizeof(Podemu__Shape *));
	s->n_elements = n;
	return s;
}

/* The computations a while, conditional or call node runs. */
static inline void gb_called(struct gb *b, Podemu__Node *n, const int32_t *comps, size_t count)
{
	n->called = arena_calloc(b->a, count + 1, sizeof(int32_t));
	memcpy(n->called, comps, count * sizeof(int32_t));
	n->n_called = count;
}

static inline void gb_dims(struct gb *b, Podemu__Node *n, const int64_t *d, size_t count)
{
	n->dimensions = gb_ints(b, d, count);
	n->n_dimensions = count;
}

static inline void gb_outputs(struct gb *b, const int32_t *outs, size_t n)
{
	b->g.outputs = arena_calloc(b->a, n + 1, sizeof(int32_t));
	memcpy(b->g.outputs, outs, n * sizeof(int32_t));
	b->g.n_outputs = n;
}

#endif
