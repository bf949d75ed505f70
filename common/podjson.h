/*
 * The pod's status as JSON, one writer for `podemu status --json` and the coordinator's
 * /api/status: topology, hosts (alive, addresses, RSS and accounted bytes) and every core's
 * memory as torch_xla and PJRT name it.
 */
#ifndef PODEMU_PODJSON_H
#define PODEMU_PODJSON_H

#include <stdio.h>

#include "podemu.pb-c.h"

/* A JSON string literal of s (NULL: ""), for every JSON podemu writes. */
void json_string(FILE *f, const char *s);

/* ps as one JSON object; coordinator is the address it was asked at. */
void pod_status_json(FILE *f, const Podemu__PodStatus *ps, const char *coordinator);

#endif
