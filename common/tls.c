#include "tls.h"

#include <nng/supplemental/tls/tls.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t tls_lock = PTHREAD_MUTEX_INITIALIZER;
static char cert_path[1024], key_path[1024], ca_path[1024];
static bool files_set;

bool tls_url(const char *url)
{
	return url != NULL && strncmp(url, "tls+tcp://", 10) == 0;
}

static void pick(char *out, size_t len, const char *given, const char *env)
{
	const char *v = given != NULL ? given : getenv(env);
	snprintf(out, len, "%s", v != NULL ? v : "");
}

void tls_files(const char **cert, const char **key, const char **ca)
{
	*cert = cert_path;
	*key = key_path;
	*ca = ca_path;
}

void tls_set_files(const char *cert, const char *key, const char *ca)
{
	pthread_mutex_lock(&tls_lock);
	pick(cert_path, sizeof(cert_path), cert, "PODEMU_TLS_CERT");
	pick(key_path, sizeof(key_path), key, "PODEMU_TLS_KEY");
	pick(ca_path, sizeof(ca_path), ca, "PODEMU_TLS_CA");
	files_set = true;
	pthread_mutex_unlock(&tls_lock);
}

/* A whole PEM file as a string, or NULL. */
static char *read_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (f == NULL)
		return NULL;
	char *buf = NULL;
	if (fseek(f, 0, SEEK_END) == 0) {
		long n = ftell(f);
		if (n >= 0 && n < (1 << 20) && fseek(f, 0, SEEK_SET) == 0 &&
		    (buf = malloc((size_t)n + 1)) != NULL) {
			if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
				free(buf);
				buf = NULL;
			} else {
				buf[n] = '\0';
			}
		}
	}
	fclose(f);
	return buf;
}

/* A configuration for one side with the process identity; both sides verify the peer. */
static int make_config(nng_tls_config **out, nng_tls_mode mode, const char *url, struct status *st)
{
	pthread_mutex_lock(&tls_lock);
	if (!files_set) {
		pthread_mutex_unlock(&tls_lock);
		tls_set_files(NULL, NULL, NULL);
		pthread_mutex_lock(&tls_lock);
	}
	char cert[sizeof(cert_path)], key[sizeof(key_path)], ca[sizeof(ca_path)];
	memcpy(cert, cert_path, sizeof(cert));
	memcpy(key, key_path, sizeof(key));
	memcpy(ca, ca_path, sizeof(ca));
	pthread_mutex_unlock(&tls_lock);
	if (cert[0] == '\0' || key[0] == '\0' || ca[0] == '\0')
		return status_set(
		    st, ST_FAILED_PRECONDITION,
		    "%s needs a certificate, its key and the pod's CA: give --tls-cert, "
		    "--tls-key and --tls-ca (or PODEMU_TLS_CERT, PODEMU_TLS_KEY, "
		    "PODEMU_TLS_CA)",
		    url);
	char *cert_pem = read_file(cert), *key_pem = read_file(key);
	nng_tls_config *cfg = NULL;
	int rv =
	    cert_pem == NULL || key_pem == NULL ? NNG_ENOENT : nng_tls_config_alloc(&cfg, mode);
	const char *what = cert_pem == NULL  ? cert
	                   : key_pem == NULL ? key
	                                     : "the TLS configuration";
	if (rv == 0) {
		what = cert;
		rv = nng_tls_config_own_cert(cfg, cert_pem, key_pem, NULL);
	}
	if (rv == 0) {
		what = ca;
		rv = nng_tls_config_ca_file(cfg, ca);
	}
	if (rv == 0)
		rv = nng_tls_config_auth_mode(cfg, NNG_TLS_AUTH_MODE_REQUIRED);
	if (rv == 0 && mode == NNG_TLS_MODE_CLIENT) {
		/* The peer's certificate must name the host we dial. */
		char host[256];
		const char *h = url + strlen("tls+tcp://");
		const char *colon = strrchr(h, ':');
		size_t n = colon != NULL ? (size_t)(colon - h) : strlen(h);
		if (n > 0 && h[0] == '[' && h[n - 1] == ']') {
			h++;
			n -= 2;
		}
		snprintf(host, sizeof(host), "%.*s", (int)n, h);
		what = "the server name";
		rv = nng_tls_config_server_name(cfg, host);
	}
	free(cert_pem);
	free(key_pem);
	if (rv != 0) {
		if (cfg != NULL)
			nng_tls_config_free(cfg);
		return status_set(st, ST_FAILED_PRECONDITION, "TLS for %s: cannot load %s: %s", url,
		                  what, nng_strerror(rv));
	}
	*out = cfg;
	return ST_OK;
}

/* Gives obj the TLS configuration for url through set(obj, cfg), when url is tls+tcp://. */
static int with_tls(const char *url, nng_tls_mode mode, int (*set)(void *, nng_tls_config *),
                    void *obj, struct status *st)
{
	if (!tls_url(url))
		return ST_OK;
	nng_tls_config *cfg;
	int rv = make_config(&cfg, mode, url, st);
	if (rv != ST_OK)
		return rv;
	int nrv = set(obj, cfg);
	nng_tls_config_free(cfg); /* obj holds its own reference */
	if (nrv != 0)
		return status_set(st, ST_INTERNAL, "TLS for %s: %s", url, nng_strerror(nrv));
	return ST_OK;
}

static int set_stream_listener(void *l, nng_tls_config *cfg)
{
	return nng_stream_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, cfg);
}

static int set_stream_dialer(void *d, nng_tls_config *cfg)
{
	return nng_stream_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, cfg);
}

int tls_stream_listener_create(nng_stream_listener **l, const char *url, struct status *st)
{
	int rv = nng_stream_listener_alloc(l, url);
	if (rv != 0)
		return status_set(st, ST_INVALID_ARGUMENT, "cannot listen on %s: %s", url,
		                  nng_strerror(rv));
	if ((rv = with_tls(url, NNG_TLS_MODE_SERVER, set_stream_listener, *l, st)) != ST_OK)
		nng_stream_listener_free(*l);
	return rv;
}

int tls_stream_dialer_create(nng_stream_dialer **d, const char *url, struct status *st)
{
	int rv = nng_stream_dialer_alloc(d, url);
	if (rv != 0)
		return status_set(st, ST_INVALID_ARGUMENT, "cannot dial %s: %s", url,
		                  nng_strerror(rv));
	if ((rv = with_tls(url, NNG_TLS_MODE_CLIENT, set_stream_dialer, *d, st)) != ST_OK)
		nng_stream_dialer_free(*d);
	return rv;
}

static void bound_url(char *out, const char *url, int port, bool got)
{
	snprintf(out, 256, "%s", url);
	if ((strncmp(url, "tcp://", 6) == 0 || tls_url(url)) && got) {
		const char *colon = strrchr(url, ':');
		snprintf(out, 256, "%.*s:%d", (int)(colon - url), url, port);
	}
}

void tls_stream_bound_url(char *out, const char *url, nng_stream_listener *l)
{
	int port = 0;
	bool got = nng_stream_listener_get_int(l, NNG_OPT_TCP_BOUND_PORT, &port) == 0;
	bound_url(out, url, port, got);
}
