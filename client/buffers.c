/* Device buffers from the host's side: uploads (torch_xla's .to(device)), fetches, releases. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "rpc.h"
#include "services.h"

pe_tensor *pe_upload(pe_client *c, pe_dtype dtype, const int64_t *dims, int rank,
                     const void *const *per_core)
{
	return pe_upload_layout(c, dtype, dims, rank, NULL, per_core);
}

pe_tensor *pe_upload_layout(pe_client *c, pe_dtype dtype, const int64_t *dims, int rank,
                            const char *layout, const void *const *per_core)
{
	struct shape shape;
	struct status st;
	if (rank < 0 || rank > PE_MAX_RANK) {
		client_fail(c, ST_INVALID_ARGUMENT, "rank %d is out of range [0, %d]", rank,
		            PE_MAX_RANK);
		return NULL;
	}
	if (shape_make(&shape, dtype, dims, rank, &st) != ST_OK) {
		client_fail_status(c, &st);
		return NULL;
	}
	struct arena *scratch = arena_new();
	Podemu__Shape *ps = NULL;
	if (scratch != NULL && (ps = arena_alloc(scratch, sizeof(*ps))) != NULL) {
		podemu__shape__init(ps);
		ps->dtype = (Podemu__DType)dtype;
		ps->dims = (int64_t *)dims;
		ps->n_dims = (size_t)rank;
	}
	if (ps == NULL) {
		arena_free(scratch);
		client_fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
		return NULL;
	}
	Podemu__CreateBufferRequest req = PODEMU__CREATE_BUFFER_REQUEST__INIT;
	req.session = c->session;
	req.shape = ps;
	if (layout != NULL)
		req.layout = (char *)layout;
	struct arena *a;
	void *reply;
	int rv = client_call(c, CM_CREATE_BUFFER, &req, &a, &reply, CALL_TIMEOUT_MS);
	uint64_t handle = rv == ST_OK ? ((Podemu__CreateBufferReply *)reply)->handle : 0;
	arena_free(a);
	arena_free(scratch);
	if (rv != ST_OK)
		return NULL;
	pe_tensor *t = client_tensor_new(c, &shape, -1, handle);
	if (t == NULL)
		return NULL;
	int64_t total = shape_bytes(&shape);
	void *zeros = NULL;
	for (int core = 0; core < c->world_size && rv == ST_OK; core++) {
		const void *src = per_core ? per_core[core] : NULL;
		if (src == NULL) {
			if (zeros == NULL)
				zeros = calloc(1, RPC_TRANSFER_CHUNK_BYTES);
			if (zeros == NULL) {
				rv = client_fail(c, ST_RESOURCE_EXHAUSTED, "out of host memory");
				break;
			}
		}
		for (int64_t off = 0; off < total && rv == ST_OK; off += RPC_TRANSFER_CHUNK_BYTES) {
			int64_t len = total - off < RPC_TRANSFER_CHUNK_BYTES
			                  ? total - off
			                  : RPC_TRANSFER_CHUNK_BYTES;
			Podemu__TransferToDeviceRequest tr =
			    PODEMU__TRANSFER_TO_DEVICE_REQUEST__INIT;
			tr.session = c->session;
			tr.handle = handle;
			tr.ordinal = core;
			tr.offset = off;
			tr.data.data = (uint8_t *)(src ? (const char *)src + off : zeros);
			tr.data.len = (size_t)len;
			rv =
			    client_call(c, CM_TRANSFER_TO_DEVICE, &tr, &a, &reply, CALL_TIMEOUT_MS);
			arena_free(a);
		}
	}
	free(zeros);
	if (rv != ST_OK) {
		int code = c->code;
		char saved[sizeof(c->error)];
		memcpy(saved, c->error, sizeof(saved));
		pe_release(t);
		c->code = code;
		memcpy(c->error, saved, sizeof(saved));
		return NULL;
	}
	return t;
}

int client_release_handles(pe_client *c, uint64_t *handles, size_t n)
{
	if (c->closing)
		return ST_OK;
	Podemu__ReleaseRequest req = PODEMU__RELEASE_REQUEST__INIT;
	req.session = c->session;
	req.handles = handles;
	req.n_handles = n;
	struct arena *a;
	void *reply;
	int rv = client_call(c, CM_RELEASE, &req, &a, &reply, CALL_TIMEOUT_MS);
	arena_free(a);
	return rv;
}

int pe_fetch(pe_tensor *t, int ordinal, void *dst, size_t dst_bytes)
{
	if (t == NULL)
		return PE_INVALID_ARGUMENT;
	pe_client *c = t->c;
	/* The step that makes it may be in flight: its outcome decides what there is to read. */
	client_finish_async(c);
	int64_t total = shape_bytes(&t->shape);
	if ((int64_t)dst_bytes != total)
		return client_fail(c, ST_INVALID_ARGUMENT,
		                   "fetch: destination has %zu bytes but the tensor has %lld",
		                   dst_bytes, (long long)total);
	if (ordinal < 0 || ordinal >= c->world_size)
		return client_fail(c, ST_INVALID_ARGUMENT, "fetch: core %d is out of range [0, %d)",
		                   ordinal, c->world_size);
	if (t->node >= 0) {
		int rv = pe_mark_step(c);
		if (rv != ST_OK)
			return rv;
	}
	if (t->handle == 0)
		return client_fail(c, ST_FAILED_PRECONDITION,
		                   "fetch: tensor belongs to a step that failed; it has no value");
	int64_t off = 0;
	do {
		Podemu__TransferFromDeviceRequest req = PODEMU__TRANSFER_FROM_DEVICE_REQUEST__INIT;
		req.session = c->session;
		req.handle = t->handle;
		req.ordinal = ordinal;
		req.offset = off;
		req.length =
		    total - off < RPC_TRANSFER_CHUNK_BYTES ? total - off : RPC_TRANSFER_CHUNK_BYTES;
		struct arena *a;
		void *reply;
		int rv = client_call(c, CM_TRANSFER_FROM_DEVICE, &req, &a, &reply, CALL_TIMEOUT_MS);
		Podemu__TransferFromDeviceReply *rep = reply;
		if (rv == ST_OK && !rep->backed)
			rv = client_fail(
			    c, ST_FAILED_PRECONDITION,
			    "core %d has no backing store (--backing none): tensor values "
			    "are not kept",
			    ordinal);
		else if (rv == ST_OK && (int64_t)rep->data.len != req.length)
			rv = client_fail(c, ST_DATA_LOSS, "fetch: asked for %lld bytes, got %zu",
			                 (long long)req.length, rep->data.len);
		if (rv == ST_OK && req.length > 0)
			memcpy((char *)dst + off, rep->data.data, (size_t)req.length);
		arena_free(a);
		if (rv != ST_OK)
			return rv;
		off += req.length;
	} while (off < total);
	return PE_OK;
}

void pe_release(pe_tensor *t)
{
	if (t == NULL)
		return;
	pe_client *c = t->c;
	if (t->prev)
		t->prev->next = t->next;
	else
		c->tensors = t->next;
	if (t->next)
		t->next->prev = t->prev;
	if (t->handle != 0) {
		bool read_by_pending = false;
		for (int i = 0; i < c->num_nodes && !read_by_pending; i++)
			read_by_pending = c->nodes[i]->handle == t->handle &&
			                  strcmp(c->nodes[i]->opcode, "parameter") == 0;
		if (read_by_pending) {
			if (c->num_release == c->cap_release) {
				size_t cap = c->cap_release ? c->cap_release * 2 : 16;
				uint64_t *p = realloc(c->release_after, cap * sizeof(*p));
				if (p != NULL) {
					c->release_after = p;
					c->cap_release = cap;
				}
			}
			if (c->num_release < c->cap_release)
				c->release_after[c->num_release++] = t->handle;
		} else {
			client_release_handles(c, &t->handle, 1);
		}
	}
	free(t);
}
