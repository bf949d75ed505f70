/*
 * TLS for every socket whose URL is tls+tcp://: one process-wide identity (certificate, key and
 * the CA that signed the pod's certificates), mutual authentication on both sides. Daemons set
 * it from --tls-cert/--tls-key/--tls-ca; otherwise PODEMU_TLS_CERT, PODEMU_TLS_KEY and
 * PODEMU_TLS_CA are used, which is how client programs get it.
 */
#ifndef PODEMU_TLS_H
#define PODEMU_TLS_H

#include <nng/nng.h>
#include <stdbool.h>

#include "status.h"

/* The identity files in use ("" when unset): certificate, key, the pod's CA. */
void tls_files(const char **cert, const char **key, const char **ca);

/* True for a tls+tcp:// URL. */
bool tls_url(const char *url);

/* Sets the identity files (NULL: the environment variable, when set). Call before any socket. */
void tls_set_files(const char *cert, const char *key, const char *ca);

/*
 * A stream listener / dialer for url, with the TLS identity when url is tls+tcp://
 * (FAILED_PRECONDITION when certificate, key or CA is missing or cannot be loaded): allocated,
 * configured, not yet started.
 */
int tls_stream_listener_create(nng_stream_listener **l, const char *url, struct status *st);
int tls_stream_dialer_create(nng_stream_dialer **d, const char *url, struct status *st);

/* For tcp:// and tls+tcp:// listeners: url with the port actually bound, into out (256 bytes). */
void tls_stream_bound_url(char *out, const char *url, nng_stream_listener *l);

#endif
