/* `podemu status`: the running pod in brief, then its hosts, sessions and cores. */
#ifndef PODEMU_CLI_STATUS_CMD_H
#define PODEMU_CLI_STATUS_CMD_H

#include <stdbool.h>

/*
 * Asks the coordinator of the pod in state_dir. Text: a summary first, then every host,
 * session and core when the pod is small or all is set; JSON: everything. Returns 0 when the
 * pod is ready, 3 when it is not, 1 when there is no pod.
 */
int cli_status(const char *state_dir, bool json, bool all);

#endif
