/* Where a local pod keeps its pid files, logs and coordinator address. */
#ifndef PODEMU_STATEDIR_H
#define PODEMU_STATEDIR_H

#include <stddef.h>

#define STATE_COORDINATOR_FILE "coordinator.url"

/*
 * The state directory: explicit if not NULL, else $PODEMU_STATE_DIR, else
 * $XDG_RUNTIME_DIR/podemu, else /tmp/podemu-<uid>.
 */
void state_dir_resolve(char *out, size_t len, const char *explicit_dir);

/*
 * The coordinator URL to use: $PODEMU_COORDINATOR, else the one recorded in the state
 * directory, else tcp://127.0.0.1:7460.
 */
void state_coordinator_url(char *out, size_t len, const char *state_dir);

/*
 * The pod token a client presents: $PODEMU_TOKEN, else the first line of the state directory's
 * `token` file (written by `podemu up`), else "" (none). out holds at least 65 bytes.
 */
void state_token(char *out, size_t len, const char *state_dir);

#endif
