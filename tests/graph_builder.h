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
};

static inline void gb_init(struct gb *b)
{
	b->a = arena_new();
	podemu__graph__init(&b->g);
	b->g.nodes = b->nodes;
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
	b->nodes[b->g.n_nodes++] = n;
	return n;
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
