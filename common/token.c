#include "token.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tls.h"

int token_load(char out[TOKEN_MAX + 1], const char *file, struct status *st)
{
	out[0] = '\0';
	char line[4 * TOKEN_MAX];
	if (file == NULL) {
		const char *env = getenv("PODEMU_TOKEN");
		if (env == NULL)
			return ST_OK;
		snprintf(line, sizeof(line), "%s", env);
	} else {
		FILE *f = fopen(file, "r");
		if (f == NULL)
			return status_set(st, ST_INVALID_ARGUMENT, "cannot read token file %s",
			                  file);
		if (fgets(line, sizeof(line), f) == NULL)
			line[0] = '\0';
		fclose(f);
	}
	line[strcspn(line, "\r\n")] = '\0';
	if (strlen(line) > TOKEN_MAX)
		return status_set(st, ST_INVALID_ARGUMENT, "the pod token is longer than %d bytes",
		                  TOKEN_MAX);
	snprintf(out, TOKEN_MAX + 1, "%s", line);
	return ST_OK;
}

int token_generate(char out[TOKEN_MAX + 1], struct status *st)
{
	unsigned char raw[TOKEN_MAX / 2];
	FILE *f = fopen("/dev/urandom", "rb");
	if (f == NULL || fread(raw, 1, sizeof(raw), f) != sizeof(raw)) {
		if (f != NULL)
			fclose(f);
		return status_set(st, ST_INTERNAL, "cannot read /dev/urandom");
	}
	fclose(f);
	for (size_t i = 0; i < sizeof(raw); i++)
		snprintf(out + 2 * i, 3, "%02x", raw[i]);
	return ST_OK;
}

bool token_matches(const char *expected, const void *presented, size_t len)
{
	size_t n = strlen(expected);
	const unsigned char *p = presented;
	unsigned char diff = (unsigned char)(n != len);
	/* Always walk TOKEN_MAX bytes so timing says nothing about where a mismatch is. */
	for (size_t i = 0; i < TOKEN_MAX; i++) {
		unsigned char e = i < n ? (unsigned char)expected[i] : 0;
		unsigned char g = i < len ? p[i] : 0;
		diff |= e ^ g;
	}
	return diff == 0;
}

bool url_is_local(const char *url)
{
	if (strncmp(url, "ipc://", 6) == 0 || strncmp(url, "inproc://", 9) == 0)
		return true;
	const char *host = strstr(url, "://");
	if (host == NULL)
		return false;
	host += 3;
	return strncmp(host, "127.", 4) == 0 || strncmp(host, "localhost:", 10) == 0 ||
	       strncmp(host, "[::1]:", 6) == 0;
}

bool daemon_trust_option(struct daemon_trust *t, int opt, const char *arg)
{
	switch (opt - DAEMON_TRUST_OPT_BASE) {
	case 0:
		t->token_file = arg;
		return true;
	case 1:
		t->insecure = true;
		return true;
	case 2:
		t->tls_cert = arg;
		return true;
	case 3:
		t->tls_key = arg;
		return true;
	case 4:
		t->tls_ca = arg;
		return true;
	default:
		return false;
	}
}

int token_for_daemon(char out[TOKEN_MAX + 1], const struct daemon_trust *t,
                     const char *const *listen_urls, int n, struct status *st)
{
	tls_set_files(t->tls_cert, t->tls_key, t->tls_ca);
	int rv = token_load(out, t->token_file, st);
	if (rv != ST_OK || out[0] != '\0' || t->insecure)
		return rv;
	for (int i = 0; i < n; i++)
		if (!url_is_local(listen_urls[i]))
			return status_set(st, ST_FAILED_PRECONDITION,
			                  "refusing to listen on %s without a pod token: give "
			                  "--token-file (or PODEMU_TOKEN), or --insecure",
			                  listen_urls[i]);
	return ST_OK;
}
