/*
 * The coordinator's HTTP side, on a thread of its own (libevent's evhttp): /metrics in
 * Prometheus' text format, /api/status (the status JSON of `podemu status --json`),
 * /api/timeline (the last step's planned bytes live per core over its schedule) and / (the
 * dashboard, coordinator/dashboard.c). Off loopback every request must carry the pod's token
 * as a bearer token; a pod on TLS serves HTTPS with its own certificate.
 */
#include "http.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/thread.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "arena.h"
#include "log.h"
#include "podjson.h"
#include "tls.h"

struct http_server {
	struct coordinator *co;
	struct event_base *base;
	struct evhttp *http;
	SSL_CTX *ssl; /* HTTPS, for a pod on TLS */
	pthread_t thread;
	bool loopback;
	char token[128];
	char coordinator_url[256];
};

/* One labelled sample per core of a memory statistic. */
static void core_gauge(FILE *f, const Podemu__PodStatus *ps, const char *name, const char *help,
                       size_t field)
{
	fprintf(f, "# HELP podemu_core_%s %s\n# TYPE podemu_core_%s gauge\n", name, help, name);
	for (size_t i = 0; i < ps->n_cores; i++) {
		const Podemu__CoreMemory *m = ps->cores[i];
		int64_t v = *(const int64_t *)((const char *)m + field);
		fprintf(f, "podemu_core_%s{topology=\"%s\",host=\"%d\",core=\"%d\"} %lld\n", name,
		        ps->topology, m->host, m->ordinal, (long long)v);
	}
}

static void write_metrics(FILE *f, struct coordinator *co, const Podemu__PodStatus *ps)
{
	static const struct {
		const char *name, *help;
		size_t field;
	} core[] = {
	    {"bytes_in_use", "HBM bytes in use (PJRT bytes_in_use).",
	     offsetof(Podemu__CoreMemory, bytes_in_use)},
	    {"peak_bytes_in_use", "Most HBM bytes ever in use (PJRT peak_bytes_in_use).",
	     offsetof(Podemu__CoreMemory, peak_bytes_in_use)},
	    {"bytes_limit", "Usable HBM bytes (PJRT bytes_limit).",
	     offsetof(Podemu__CoreMemory, bytes_limit)},
	    {"bytes_reserved", "HBM bytes reserved for the running step (PJRT bytes_reserved).",
	     offsetof(Podemu__CoreMemory, bytes_reserved)},
	    {"largest_free_block_bytes", "The largest free HBM block.",
	     offsetof(Podemu__CoreMemory, largest_free_block_bytes)},
	    {"num_allocs", "Device buffers allocated (PJRT num_allocs).",
	     offsetof(Podemu__CoreMemory, num_allocs)},
	};
	fprintf(f, "# HELP podemu_pod_ready Whether every host is registered and alive.\n"
	           "# TYPE podemu_pod_ready gauge\n");
	fprintf(f, "podemu_pod_ready{topology=\"%s\"} %d\n", ps->topology, ps->ready ? 1 : 0);
	for (size_t k = 0; k < sizeof(core) / sizeof(core[0]); k++)
		core_gauge(f, ps, core[k].name, core[k].help, core[k].field);
	fprintf(f, "# HELP podemu_host_up Whether the host's agent is registered and alive.\n"
	           "# TYPE podemu_host_up gauge\n");
	for (size_t h = 0; h < ps->n_hosts; h++)
		fprintf(f, "podemu_host_up{topology=\"%s\",host=\"%d\"} %d\n", ps->topology,
		        ps->hosts[h]->index, ps->hosts[h]->alive ? 1 : 0);
	fprintf(f, "# HELP podemu_host_resident_memory_bytes Resident memory of the agent process "
	           "serving the host (its other hosts report the same).\n"
	           "# TYPE podemu_host_resident_memory_bytes gauge\n");
	for (size_t h = 0; h < ps->n_hosts; h++)
		fprintf(f, "podemu_host_resident_memory_bytes{topology=\"%s\",host=\"%d\"} %lld\n",
		        ps->topology, ps->hosts[h]->index, (long long)ps->hosts[h]->rss_bytes);
	fprintf(f, "# HELP podemu_sessions Client sessions open (each owns its device buffers).\n"
	           "# TYPE podemu_sessions gauge\n");
	fprintf(f, "podemu_sessions{topology=\"%s\"} %zu\n", ps->topology, ps->n_sessions);
	struct metrics *m = &co->metrics;
	pthread_mutex_lock(&m->lock);
	fprintf(f,
	        "# HELP podemu_steps_total Steps run to the end.\n# TYPE podemu_steps_total "
	        "counter\npodemu_steps_total %llu\n"
	        "# HELP podemu_steps_failed_total Steps that failed.\n"
	        "# TYPE podemu_steps_failed_total counter\npodemu_steps_failed_total %llu\n",
	        (unsigned long long)m->steps_run, (unsigned long long)m->steps_failed);
	fprintf(f, "# HELP podemu_step_duration_seconds Time from a step's request to its answer.\n"
	           "# TYPE podemu_step_duration_seconds histogram\n");
	uint64_t cumulative = 0;
	for (int k = 0; k < METRICS_BUCKETS; k++) {
		cumulative += m->latency_buckets[k];
		fprintf(f, "podemu_step_duration_seconds_bucket{le=\"%g\"} %llu\n",
		        metrics_bucket_bounds[k], (unsigned long long)cumulative);
	}
	fprintf(f,
	        "podemu_step_duration_seconds_bucket{le=\"+Inf\"} %llu\n"
	        "podemu_step_duration_seconds_sum %.6f\npodemu_step_duration_seconds_count %llu\n",
	        (unsigned long long)m->latency_count, m->latency_sum_seconds,
	        (unsigned long long)m->latency_count);
	fprintf(f, "# HELP podemu_collective_sent_bytes_total Bytes the cores sent in collectives, "
	           "as planned.\n# TYPE podemu_collective_sent_bytes_total counter\n");
	for (int op = 0; op < OP_COUNT; op++)
		if (opcode_is_collective((enum opcode)op))
			fprintf(f, "podemu_collective_sent_bytes_total{op=\"%s\"} %.0f\n",
			        opcode_name((enum opcode)op), m->sent_bytes[op]);
	pthread_mutex_unlock(&m->lock);
}

static void reply_text(struct evhttp_request *req, int code, const char *type, const char *body,
                       size_t len)
{
	struct evbuffer *b = evbuffer_new();
	if (b == NULL) {
		evhttp_send_error(req, 500, "out of memory");
		return;
	}
	evbuffer_add(b, body, len);
	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", type);
	evhttp_add_header(evhttp_request_get_output_headers(req), "Cache-Control", "no-store");
	evhttp_send_reply(req, code, code == 200 ? "OK" : "Error", b);
	evbuffer_free(b);
}

static void reply_string(struct evhttp_request *req, int code, const char *text)
{
	reply_text(req, code, "text/plain", text, strlen(text));
}

/* The last step's planned bytes live per core over its schedule, as JSON. */
static void reply_timeline(struct http_server *h, struct evhttp_request *req)
{
	char *body = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&body, &len);
	if (f == NULL) {
		evhttp_send_error(req, 500, "out of memory");
		return;
	}
	struct metrics *m = &h->co->metrics;
	pthread_mutex_lock(&m->lock);
	int64_t peak = 0;
	fprintf(f, "{\"step\": %llu, \"live_bytes\": [", (unsigned long long)m->last_step);
	for (int k = 0; k < m->n_last_live; k++) {
		fprintf(f, "%s%lld", k ? ", " : "", (long long)m->last_live[k]);
		peak = m->last_live[k] > peak ? m->last_live[k] : peak;
	}
	fprintf(f, "], \"peak_bytes\": %lld}\n", (long long)peak);
	pthread_mutex_unlock(&m->lock);
	fclose(f);
	reply_text(req, 200, "application/json", body, len);
	free(body);
}

static bool authorized(struct http_server *h, struct evhttp_request *req)
{
	if (h->loopback)
		return true;
	const char *auth =
	    evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
	char want[160];
	snprintf(want, sizeof(want), "Bearer %s", h->token);
	return auth != NULL && h->token[0] != '\0' && strcmp(auth, want) == 0;
}

static void on_request(struct evhttp_request *req, void *arg)
{
	struct http_server *h = arg;
	if (!authorized(h, req)) {
		evhttp_add_header(evhttp_request_get_output_headers(req), "WWW-Authenticate",
		                  "Bearer");
		reply_string(req, 401, "the pod's token is required\n");
		return;
	}
	const char *path = evhttp_uri_get_path(evhttp_request_get_evhttp_uri(req));
	if (path == NULL || evhttp_request_get_command(req) != EVHTTP_REQ_GET) {
		reply_string(req, 405, "GET only\n");
		return;
	}
	if (strcmp(path, "/") == 0) {
		reply_text(req, 200, "text/html; charset=utf-8", dashboard_html,
		           strlen(dashboard_html));
		return;
	}
	bool metrics = strcmp(path, "/metrics") == 0;
	if (strcmp(path, "/api/timeline") == 0) {
		reply_timeline(h, req);
		return;
	}
	if (!metrics && strcmp(path, "/api/status") != 0) {
		reply_string(req, 404, "not found\n");
		return;
	}
	struct arena *a = arena_new();
	char *body = NULL;
	size_t len = 0;
	FILE *f = a != NULL ? open_memstream(&body, &len) : NULL;
	if (f == NULL) {
		arena_free(a);
		evhttp_send_error(req, 500, "out of memory");
		return;
	}
	Podemu__PodStatus ps;
	coordinator_status(h->co, a, true, &ps);
	if (metrics)
		write_metrics(f, h->co, &ps);
	else
		pod_status_json(f, &ps, h->coordinator_url);
	fclose(f);
	reply_text(req, 200,
	           metrics ? "text/plain; version=0.0.4; charset=utf-8" : "application/json", body,
	           len);
	free(body);
	arena_free(a);
}

/* A connection of an HTTPS server: TLS with the pod's certificate. */
static struct bufferevent *ssl_connection(struct event_base *base, void *arg)
{
	struct http_server *h = arg;
	SSL *ssl = SSL_new(h->ssl);
	return ssl ? bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_ACCEPTING,
	                                            BEV_OPT_CLOSE_ON_FREE)
	           : NULL;
}

/* The pod's certificate and key for HTTPS; NULL with st set when they do not load. */
static SSL_CTX *ssl_context(struct status *st)
{
	const char *cert, *key, *ca;
	tls_files(&cert, &key, &ca);
	SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
	if (ctx != NULL && SSL_CTX_use_certificate_chain_file(ctx, cert) == 1 &&
	    SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) == 1 &&
	    SSL_CTX_check_private_key(ctx) == 1) {
		SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
		return ctx;
	}
	char why[256];
	ERR_error_string_n(ERR_get_error(), why, sizeof(why));
	status_set(st, ST_FAILED_PRECONDITION, "HTTPS with certificate %s and key %s: %s",
	           cert[0] ? cert : "(none)", key[0] ? key : "(none)", why);
	SSL_CTX_free(ctx);
	return NULL;
}

static void *serve(void *arg)
{
	struct http_server *h = arg;
	event_base_dispatch(h->base);
	return NULL;
}

int http_start(struct http_server **out, struct coordinator *co, const char *listen,
               const char *token, const char *coordinator_url, char *bound, size_t bound_len,
               struct status *st)
{
	*out = NULL;
	char host[128];
	const char *colon = strrchr(listen, ':');
	char *end = NULL;
	long port = colon != NULL ? strtol(colon + 1, &end, 10) : -1;
	if (colon == NULL || colon == listen || (size_t)(colon - listen) >= sizeof(host) ||
	    end == colon + 1 || *end != '\0' || port < 0 || port > 65535)
		return status_set(st, ST_INVALID_ARGUMENT, "--http-listen %s: expected HOST:PORT",
		                  listen);
	snprintf(host, sizeof(host), "%.*s", (int)(colon - listen), listen);
	bool loopback = strcmp(host, "localhost") == 0 || strncmp(host, "127.", 4) == 0 ||
	                strcmp(host, "::1") == 0 || strcmp(host, "[::1]") == 0;
	if (!loopback && (token == NULL || token[0] == '\0'))
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "--http-listen %s is not loopback: the pod needs a token, which "
		                  "requests then carry as a bearer token",
		                  listen);
	struct http_server *h = calloc(1, sizeof(*h));
	if (h == NULL)
		return status_set(st, ST_RESOURCE_EXHAUSTED, "out of host memory");
	h->co = co;
	h->loopback = loopback;
	snprintf(h->token, sizeof(h->token), "%s", token ? token : "");
	snprintf(h->coordinator_url, sizeof(h->coordinator_url), "%s", coordinator_url);
	if (tls_url(coordinator_url) && (h->ssl = ssl_context(st)) == NULL) {
		free(h);
		return st->code;
	}
	evthread_use_pthreads();
	h->base = event_base_new();
	h->http = h->base ? evhttp_new(h->base) : NULL;
	struct evhttp_bound_socket *sock =
	    h->http ? evhttp_bind_socket_with_handle(h->http, host, (ev_uint16_t)port) : NULL;
	if (sock == NULL) {
		if (h->http)
			evhttp_free(h->http);
		if (h->base)
			event_base_free(h->base);
		SSL_CTX_free(h->ssl);
		free(h);
		return status_set(st, ST_UNAVAILABLE, "--http-listen %s: cannot listen there",
		                  listen);
	}
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	int bound_port = (int)port;
	if (getsockname(evhttp_bound_socket_get_fd(sock), (struct sockaddr *)&ss, &sl) == 0)
		bound_port =
		    ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
		                                   : ((struct sockaddr_in *)&ss)->sin_port);
	snprintf(bound, bound_len, "%s://%s:%d/", h->ssl ? "https" : "http", host, bound_port);
	if (h->ssl != NULL)
		evhttp_set_bevcb(h->http, ssl_connection, h);
	evhttp_set_allowed_methods(h->http, EVHTTP_REQ_GET);
	evhttp_set_gencb(h->http, on_request, h);
	if (pthread_create(&h->thread, NULL, serve, h) != 0) {
		evhttp_free(h->http);
		event_base_free(h->base);
		SSL_CTX_free(h->ssl);
		free(h);
		return status_set(st, ST_RESOURCE_EXHAUSTED, "cannot start the HTTP thread");
	}
	*out = h;
	return ST_OK;
}

void http_stop(struct http_server *h)
{
	if (h == NULL)
		return;
	event_base_loopexit(h->base, NULL);
	pthread_join(h->thread, NULL);
	evhttp_free(h->http);
	event_base_free(h->base);
	SSL_CTX_free(h->ssl);
	free(h);
}
