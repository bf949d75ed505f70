/*
 * The pod's shared secret: every RPC and every data-plane chunk carries it, and daemons refuse
 * what does not. Comparison takes the same time whatever the input.
 */
#ifndef PODEMU_TOKEN_H
#define PODEMU_TOKEN_H

#include <stdbool.h>
#include <stddef.h>

#include "status.h"

#define TOKEN_MAX 64 /* bytes of a token; a generated one is 64 hex digits */
#define STATE_TOKEN_FILE "token"

/*
 * Loads the token from file (its first line) or, when file is NULL, from $PODEMU_TOKEN; an
 * empty result means no token. INVALID_ARGUMENT for an unreadable file or a token longer than
 * TOKEN_MAX.
 */
int token_load(char out[TOKEN_MAX + 1], const char *file, struct status *st);

/* A fresh random token (64 hex digits) from the system's random source. */
int token_generate(char out[TOKEN_MAX + 1], struct status *st);

/* Constant-time comparison of a presented token (len bytes) with the expected one. */
bool token_matches(const char *expected, const void *presented, size_t len);

/* True for addresses only this machine can reach (loopback, ipc://, inproc://). */
bool url_is_local(const char *url);

/* What every daemon is told about trust: --token-file, --insecure, --tls-cert/-key/-ca. */
struct daemon_trust {
	const char *token_file;
	bool insecure;
	const char *tls_cert, *tls_key, *tls_ca;
};

/* Their getopt_long entries (include <getopt.h>), and the option values they return. */
#define DAEMON_TRUST_OPT_BASE 1000
#define DAEMON_TRUST_LONG_OPTIONS                                                                  \
	{"token-file", required_argument, NULL, DAEMON_TRUST_OPT_BASE},                            \
	    {"insecure", no_argument, NULL, DAEMON_TRUST_OPT_BASE + 1},                            \
	    {"tls-cert", required_argument, NULL, DAEMON_TRUST_OPT_BASE + 2},                      \
	    {"tls-key", required_argument, NULL, DAEMON_TRUST_OPT_BASE + 3},                       \
	{                                                                                          \
		"tls-ca", required_argument, NULL, DAEMON_TRUST_OPT_BASE + 4                       \
	}

/* Takes opt (a getopt_long value) when it is one of them; false otherwise. */
bool daemon_trust_option(struct daemon_trust *t, int opt, const char *arg);

/*
 * A daemon's token: loaded as token_load does, then required when any of the n listen URLs
 * is reachable from other machines, unless insecure. FAILED_PRECONDITION says what to give.
 * Also sets the TLS identity for tls+tcp:// sockets (tls.h).
 */
int token_for_daemon(char out[TOKEN_MAX + 1], const struct daemon_trust *t,
                     const char *const *listen_urls, int n, struct status *st);

#endif
