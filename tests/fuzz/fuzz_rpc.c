/*
 * libFuzzer target: one RPC frame as a server receives it. The envelope is decoded, then the
 * payload with the named method's message type, then the checks a handler runs before it
 * touches state (shapes, graphs, replica groups, schedules' buffer plans). Nothing may crash,
 * leak or read out of bounds, whatever the bytes.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "arena.h"
#include "graph.h"
#include "podemu.pb-c.h"
#include "services.h"

static void check_graph(const Podemu__Graph *g)
{
	if (g == NULL || graph_total_nodes(g) > 4096)
		return;
	struct shape *shapes = calloc(graph_total_nodes(g) + 1, sizeof(*shapes));
	struct arena *a = arena_new();
	struct status st;
	if (shapes != NULL && a != NULL)
		graph_check(g, 8, shapes, a, &st);
	arena_free(a);
	free(shapes);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct arena *a = arena_new();
	if (a == NULL)
		return 0;
	ProtobufCAllocator *alloc = arena_protobuf_allocator(a);
	Podemu__RpcRequest *env = podemu__rpc_request__unpack(alloc, size, data);
	if (env == NULL)
		goto out;
	/* Both services: the same frame may reach a coordinator or an agent. */
	const ProtobufCServiceDescriptor *svcs[] = {&podemu__coordinator__descriptor,
	                                            &podemu__agent__descriptor};
	for (int k = 0; k < 2; k++) {
		if (env->method >= svcs[k]->n_methods)
			continue;
		const ProtobufCMessageDescriptor *in = svcs[k]->methods[env->method].input;
		ProtobufCMessage *msg =
		    protobuf_c_message_unpack(in, alloc, env->payload.len, env->payload.data);
		if (msg == NULL)
			continue;
		struct status st;
		struct shape s;
		if (in == &podemu__step_request__descriptor)
			check_graph(((Podemu__StepRequest *)msg)->graph);
		else if (in == &podemu__program__descriptor)
			check_graph(((Podemu__Program *)msg)->graph);
		else if (in == &podemu__create_buffer_request__descriptor)
			shape_from_proto(&s, ((Podemu__CreateBufferRequest *)msg)->shape, &st);
	}
out:
	arena_free(a);
	return 0;
}
