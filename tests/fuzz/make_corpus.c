/*
 * Writes the seed corpus of fuzz_rpc: one valid frame for every method of both services, so
 * the fuzzer starts from every message type. Usage: make_corpus DIR
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "podemu.pb-c.h"

static void write_frame(const char *dir, const char *name, unsigned method, const void *msg)
{
	Podemu__RpcRequest env = PODEMU__RPC_REQUEST__INIT;
	env.method = method;
	env.payload.len = protobuf_c_message_get_packed_size(msg);
	env.payload.data = malloc(env.payload.len + 1);
	protobuf_c_message_pack(msg, env.payload.data);
	env.token.data = (uint8_t *)"0123456789abcdef";
	env.token.len = 16;
	size_t len = podemu__rpc_request__get_packed_size(&env);
	uint8_t *buf = malloc(len + 1);
	podemu__rpc_request__pack(&env, buf);
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "wb");
	if (f != NULL) {
		fwrite(buf, 1, len, f);
		fclose(f);
	}
	free(buf);
	free(env.payload.data);
}

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	const char *dir = argv[1];
	int64_t dims[] = {4, 128};
	Podemu__Shape shape = PODEMU__SHAPE__INIT;
	shape.dtype = PODEMU__DTYPE__DTYPE_F32;
	shape.dims = dims;
	shape.n_dims = 2;

	/* A graph with every kind of node the checks know: constant, add, all-gather, reduce,
	 * opt-barrier, get-tuple-element, a replica group. */
	Podemu__Node n0 = PODEMU__NODE__INIT, n1 = PODEMU__NODE__INIT, n2 = PODEMU__NODE__INIT;
	Podemu__Node n3 = PODEMU__NODE__INIT, n4 = PODEMU__NODE__INIT, n5 = PODEMU__NODE__INIT;
	int32_t op0[] = {0}, op01[] = {0, 0}, op1[] = {1}, op4[] = {4};
	int64_t d0[] = {0}, d1[] = {1};
	int64_t ids[] = {0, 1, 2, 3, 4, 5, 6, 7};
	Podemu__ReplicaGroup rg = PODEMU__REPLICA_GROUP__INIT;
	Podemu__ReplicaGroup *rgs[] = {&rg};
	rg.replica_ids = ids;
	rg.n_replica_ids = 8;
	n0.opcode = "constant";
	n0.shape = &shape;
	n0.value = 1;
	n1.opcode = "add";
	n1.operands = op01;
	n1.n_operands = 2;
	n2.opcode = "all-gather";
	n2.operands = op1;
	n2.n_operands = 1;
	n2.dimensions = d0;
	n2.n_dimensions = 1;
	n2.replica_groups = rgs;
	n2.n_replica_groups = 1;
	n3.opcode = "reduce";
	n3.operands = op0;
	n3.n_operands = 1;
	n3.dimensions = d1;
	n3.n_dimensions = 1;
	n4.opcode = "opt-barrier";
	n4.operands = op0;
	n4.n_operands = 1;
	n5.opcode = "get-tuple-element";
	n5.operands = op4;
	n5.n_operands = 1;
	Podemu__Node *nodes[] = {&n0, &n1, &n2, &n3, &n4, &n5};
	int32_t outs[] = {2};
	Podemu__Graph graph = PODEMU__GRAPH__INIT;
	graph.nodes = nodes;
	graph.n_nodes = 6;
	graph.outputs = outs;
	graph.n_outputs = 1;

	Podemu__StepRequest step = PODEMU__STEP_REQUEST__INIT;
	step.graph = &graph;
	Podemu__Program prog = PODEMU__PROGRAM__INIT;
	prog.graph = &graph;
	prog.world_size = 8;
	prog.cores_per_host = 8;
	Podemu__CreateBufferRequest create = PODEMU__CREATE_BUFFER_REQUEST__INIT;
	create.shape = &shape;
	Podemu__RegisterRequest reg = PODEMU__REGISTER_REQUEST__INIT;
	reg.requested_host_index = -1;
	reg.control_url = "tcp://127.0.0.1:7461";
	reg.data_url = "tcp://127.0.0.1:7462";
	reg.backing = "host";
	Podemu__HeartbeatRequest hb = PODEMU__HEARTBEAT_REQUEST__INIT;
	Podemu__StatusRequest status = PODEMU__STATUS_REQUEST__INIT;
	Podemu__TransferToDeviceRequest to = PODEMU__TRANSFER_TO_DEVICE_REQUEST__INIT;
	to.data.data = (uint8_t *)"abcd";
	to.data.len = 4;
	Podemu__TransferFromDeviceRequest from = PODEMU__TRANSFER_FROM_DEVICE_REQUEST__INIT;
	from.length = 4;
	uint64_t handles[] = {1, 2};
	Podemu__ReleaseRequest rel = PODEMU__RELEASE_REQUEST__INIT;
	rel.handles = handles;
	rel.n_handles = 2;
	Podemu__MemoryStatsRequest mem = PODEMU__MEMORY_STATS_REQUEST__INIT;
	Podemu__HostStep host_step = PODEMU__HOST_STEP__INIT;
	host_step.program = &prog;
	host_step.release_after = handles;
	host_step.n_release_after = 2;
	Podemu__AbortRequest abort_req = PODEMU__ABORT_REQUEST__INIT;

	write_frame(dir, "coordinator-register", 0, &reg);
	write_frame(dir, "coordinator-heartbeat", 1, &hb);
	write_frame(dir, "coordinator-status", 2, &status);
	write_frame(dir, "coordinator-step", 3, &step);
	write_frame(dir, "coordinator-create", 4, &create);
	write_frame(dir, "coordinator-to-device", 5, &to);
	write_frame(dir, "coordinator-from-device", 6, &from);
	write_frame(dir, "coordinator-release", 7, &rel);
	write_frame(dir, "coordinator-memory", 8, &mem);
	write_frame(dir, "agent-execute", 0, &host_step);
	write_frame(dir, "agent-abort", 1, &abort_req);
	return 0;
}
