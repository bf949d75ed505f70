/*
 * Step graphs: opcodes (named after HLO, graph.c) and shape inference (infer.c). Shared by the
 * client library, which infers a tensor's shape when an op is recorded, and the coordinator,
 * which checks every graph it receives before planning it.
 */
#ifndef PODEMU_GRAPH_H
#define PODEMU_GRAPH_H

#include "arena.h"
#include "dtype.h"
#include "podemu.pb-c.h"
#include "status.h"

enum opcode {
	OP_INVALID = 0,
	OP_PARAMETER,
	OP_CONSTANT,
	OP_IOTA,
	OP_REPLICA_ID,
	OP_ADD,
	OP_SUBTRACT,
	OP_MULTIPLY,
	OP_MAXIMUM,
	OP_MINIMUM,
	OP_CONVERT,
	OP_RESHAPE,
	OP_PAD,
	OP_SLICE,
	OP_CONCATENATE,
	OP_REDUCE,
	OP_OPT_BARRIER,
	OP_GET_TUPLE_ELEMENT,
	OP_ALL_GATHER,
	OP_ALL_REDUCE,
	OP_REDUCE_SCATTER,
	OP_ALL_TO_ALL,
	OP_COLLECTIVE_PERMUTE,
	OP_NEGATE,
	OP_TRANSPOSE,
	OP_DOT,
	OP_DIVIDE,
	OP_AND,
	OP_OR,
	OP_NOT,
	OP_ABS,
	OP_EXPONENTIAL,
	OP_LOG,
	OP_TANH,
	OP_SQRT,
	OP_RSQRT,
	OP_COMPARE,
	OP_SELECT,
	OP_BROADCAST,
	OP_PARTITION_ID,
	OP_DYNAMIC_SLICE,
	OP_DYNAMIC_UPDATE_SLICE,
	OP_TUPLE,
	OP_WHILE,       /* runs Node.called[1] (body) while called[0] (condition) says so */
	OP_CONDITIONAL, /* runs the branch its operand 0 names */
	OP_CALL,        /* runs Node.called[0] */
	/*
	 * An op podemu has no kernel for (its HLO name in Node.name), with a declared shape: it is
	 * planned and accounted like any other, and refused by a pod with real bytes.
	 */
	OP_OPAQUE,
	OP_COUNT
};

/* Reduction computations ("to_apply") of reduce and the reducing collectives. */
enum reducer { RED_ADD, RED_MULTIPLY, RED_MAX, RED_MIN, RED_AND, RED_OR, RED_INVALID };

/* "" and "add" are RED_ADD; RED_INVALID when unknown. */
enum reducer reducer_parse(const char *name);
const char *reducer_name(enum reducer r);

/*
 * What shape inference needs besides the nodes: the core count, the device mesh, an arena for
 * tuple shapes' elements, and the computations a node may call with their nodes' shapes.
 */
struct graph_env {
	int world_size;
	Podemu__MeshAxis *const *mesh;
	size_t n_mesh;
	struct arena *arena;
	bool in_computation; /* a called computation's node: parameters are numbered, no buffers */
	int n_comps;         /* the computations it may call: [0, n_comps) */
	Podemu__Computation *const *comps;
	const struct shape *const *comp_shapes; /* [c]: the shapes of computation c's nodes */
};

/*
 * Nodes are numbered across a graph: the entry's first, then each computation's in order.
 * first[c] is computation c's node 0 (first[n_computations] the total); from a.
 */
int *graph_first_ids(const Podemu__Graph *g, struct arena *a);
size_t graph_total_nodes(const Podemu__Graph *g);
/* The node of global id `id` (NULL when out of range), and its computation (-1: the entry). */
Podemu__Node *graph_node_at(const Podemu__Graph *g, const int *first, int id, int *comp);

/* Control flow: while, conditional, call. */
bool opcode_is_control_flow(enum opcode op);

/* HLO spelling of an opcode, and back (OP_INVALID when unknown). */
const char *opcode_name(enum opcode op);
enum opcode opcode_parse(const char *name);
/* Comparison directions of compare (XLA's names); CMP_INVALID when unknown. */
enum comparison { CMP_EQ, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_INVALID };
enum comparison comparison_parse(const char *name);

/*
 * True for the elementwise ops (arithmetic, logic, unary math, compare, select, convert):
 * element i of the result depends on element i of each operand only.
 */
bool opcode_is_elementwise(enum opcode op);
/* The elementwise ops of one operand: negate, not, abs, exponential, log, tanh, sqrt, rsqrt. */
bool opcode_is_unary(enum opcode op);

/* True for the collectives, which move data between cores. */
int opcode_is_collective(enum opcode op);

/* Converts between the wire shape and struct shape, validating sizes (INVALID_ARGUMENT). */
int shape_from_proto(struct shape *out, const Podemu__Shape *p, struct status *st);

/*
 * Infers the result shape of nodes[index] from the shapes of earlier nodes (shapes[0..index)).
 * A parameter's shape is its declared shape. Collectives resolve their replica groups from env
 * (all-gather multiplies its dimension by the group size). On error INVALID_ARGUMENT (or
 * UNIMPLEMENTED) names the node, its opcode and the problem, in XLA's words where XLA has them.
 */
int graph_infer_node(struct shape *out, Podemu__Node *const *nodes, int index,
                     const struct shape *shapes, const struct graph_env *env, struct status *st);

/*
 * Checks a whole graph, its computations included: opcodes, operand indices (earlier nodes
 * only), attributes, shapes (each declared shape must equal the inferred one), calls (to
 * earlier computations, with the shapes their parameters and roots need) and outputs (valid,
 * distinct, not tuples). shapes receives graph_total_nodes(g) inferred shapes, by global id;
 * tuple elements come from a.
 */
int graph_check(const Podemu__Graph *g, int world_size, struct shape *shapes, struct arena *a,
                struct status *st);

#endif
