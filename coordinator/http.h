/* The coordinator's HTTP server: metrics, the status JSON and the dashboard (http.c). */
#ifndef PODEMU_COORD_HTTP_H
#define PODEMU_COORD_HTTP_H

#include <stddef.h>

#include "service.h"
#include "status.h"

struct http_server;

/* The dashboard page, served at / (dashboard.c). */
extern const char dashboard_html[];

/*
 * Serves HTTP at listen ("127.0.0.1:9090"; port 0 picks one) on a thread of its own; bound
 * receives the URL it serves at. A listen address off loopback needs token, which requests
 * must carry as "Authorization: Bearer TOKEN". A pod on TLS (coordinator_url tls+tcp://)
 * serves HTTPS with the pod's certificate (tls_files).
 */
int http_start(struct http_server **out, struct coordinator *co, const char *listen,
               const char *token, const char *coordinator_url, char *bound, size_t bound_len,
               struct status *st);
void http_stop(struct http_server *h);

#endif
