#include "podjson.h"

void json_string(FILE *f, const char *s)
{
	fputc('"', f);
	for (; s != NULL && *s; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\')
			fprintf(f, "\\%c", ch);
		else if (ch < 0x20)
			fprintf(f, "\\u%04x", ch);
		else
			fputc(ch, f);
	}
	fputc('"', f);
}

void pod_status_json(FILE *f, const Podemu__PodStatus *ps, const char *coordinator)
{
	fprintf(f, "{\"ready\": %s, \"topology\": ", ps->ready ? "true" : "false");
	json_string(f, ps->topology);
	fprintf(f,
	        ", \"world_size\": %d, \"num_hosts\": %d, \"cores_per_host\": %d, "
	        "\"hbm_bytes\": %lld, \"coordinator\": ",
	        ps->world_size, ps->num_hosts, ps->cores_per_host, (long long)ps->hbm_bytes);
	json_string(f, coordinator);
	if (!ps->ready) {
		fprintf(f, ", \"reason\": ");
		json_string(f, ps->reason);
	}
	fprintf(f, ", \"hosts\": [");
	for (size_t i = 0; i < ps->n_hosts; i++) {
		const Podemu__HostInfo *h = ps->hosts[i];
		fprintf(f, "%s{\"index\": %d, \"alive\": %s, \"pid\": %d, \"backing\": ",
		        i ? ", " : "", h->index, h->alive ? "true" : "false", h->pid);
		json_string(f, h->backing);
		fprintf(f, ", \"control_url\": ");
		json_string(f, h->control_url);
		fprintf(f, ", \"data_url\": ");
		json_string(f, h->data_url);
		fprintf(f,
		        ", \"rss_bytes\": %lld, \"accounted_bytes\": %lld, \"process\": \"%llx\"}",
		        (long long)h->rss_bytes, (long long)h->accounted_bytes,
		        (unsigned long long)h->process);
	}
	fprintf(f, "], \"sessions\": [");
	for (size_t i = 0; i < ps->n_sessions; i++) {
		const Podemu__SessionInfo *s = ps->sessions[i];
		fprintf(f, "%s{\"id\": %llu, \"pid\": %d, \"name\": ", i ? ", " : "",
		        (unsigned long long)s->id, s->pid);
		json_string(f, s->name);
		fprintf(f, ", \"host_name\": ");
		json_string(f, s->host_name);
		fprintf(f,
		        ", \"started_unix_ms\": %lld, \"lease_ms\": %d, \"buffers\": %d, "
		        "\"bytes_per_core\": %lld}",
		        (long long)s->started_unix_ms, s->lease_ms, s->buffers,
		        (long long)s->bytes_per_core);
	}
	fprintf(f, "], \"cores\": [");
	for (size_t i = 0; i < ps->n_cores; i++) {
		const Podemu__CoreMemory *m = ps->cores[i];
		fprintf(f,
		        "%s{\"ordinal\": %d, \"host\": %d, \"bytes_limit\": %lld, "
		        "\"bytes_used\": %lld, \"peak_bytes_used\": %lld, \"num_allocs\": %lld, "
		        "\"bytes_reserved\": %lld, \"peak_bytes_reserved\": %lld, "
		        "\"bytes_reservable_limit\": %lld, \"largest_free_block_bytes\": %lld}",
		        i ? ", " : "", m->ordinal, m->host, (long long)m->bytes_limit,
		        (long long)m->bytes_in_use, (long long)m->peak_bytes_in_use,
		        (long long)m->num_allocs, (long long)m->bytes_reserved,
		        (long long)m->peak_bytes_reserved, (long long)m->bytes_reservable_limit,
		        (long long)m->largest_free_block_bytes);
	}
	fprintf(f, "]}\n");
}
