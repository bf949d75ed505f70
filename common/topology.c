#include "topology.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GiB ((int64_t)1 << 30)
#define MiB ((int64_t)1 << 20)

/*
 * Cloud TPU facts. The preset number counts TensorCores for v2, v3, v4 and v5p (two per chip)
 * and chips for v5e, as the accelerator type names do. A v4 or v5p chip is one device
 * (megacore), so it is one simulated core holding the whole chip's HBM.
 *
 * The runtime reservation is known for v3 (16 GiB per core, about 15.48 GiB usable, as TPU
 * error messages show); the same reservation is assumed for the other generations.
 */
static const struct generation {
	const char *prefix;
	int64_t hbm_per_device;
	int count_per_device; /* preset units per simulated device */
	int devices_per_host;
	int min_count;
	int max_count;
} generations[] = {
    {"v2", 8 * GiB, 1, 8, 8, 512},         {"v3", 16 * GiB, 1, 8, 8, 2048},
    {"v4", 32 * GiB, 2, 4, 8, 8192},       {"v5e", 16 * GiB, 1, 8, 1, 256},
    {"v5litepod", 16 * GiB, 1, 8, 1, 256}, {"v5p", 95 * GiB, 2, 4, 8, 12288},
};

static const int64_t runtime_reservation = 530 * MiB;

int topology_from_preset(struct topology *out, const char *name, struct status *st)
{
	const char *dash = strrchr(name, '-');
	if (dash == NULL)
		goto unknown;
	for (size_t i = 0; i < sizeof(generations) / sizeof(generations[0]); i++) {
		const struct generation *g = &generations[i];
		if (strlen(g->prefix) != (size_t)(dash - name) ||
		    strncmp(name, g->prefix, (size_t)(dash - name)) != 0)
			continue;
		char *end;
		long count = strtol(dash + 1, &end, 10);
		if (*end != '\0' || count < g->min_count || count > g->max_count ||
		    (count & (count - 1)) != 0 || count % g->count_per_device != 0)
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "unknown topology '%s': %s pods have a power-of-two size "
			                  "from %d to %d",
			                  name, g->prefix, g->min_count, g->max_count);
		int devices = (int)(count / g->count_per_device);
		memset(out, 0, sizeof(*out));
		snprintf(out->name, sizeof(out->name), "%s", name);
		out->cores_per_host = devices < g->devices_per_host ? devices : g->devices_per_host;
		out->num_hosts = devices / out->cores_per_host;
		out->hbm_bytes = g->hbm_per_device;
		out->reserved_bytes = runtime_reservation;
		return ST_OK;
	}
unknown:
	return status_set(st, ST_INVALID_ARGUMENT,
	                  "unknown topology '%s' (expected v2-N, v3-N, v4-N, v5e-N or v5p-N, e.g. "
	                  "v3-8, v3-128, v4-32)",
	                  name);
}

int topology_custom(struct topology *out, int hosts, int cores_per_host, int64_t hbm_bytes,
                    struct status *st)
{
	if (hosts < 1 || hosts > 4096)
		return status_set(st, ST_INVALID_ARGUMENT, "--hosts %d is out of range [1, 4096]",
		                  hosts);
	if (cores_per_host < 1 || cores_per_host > 64)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "--cores-per-host %d is out of range [1, 64]", cores_per_host);
	if (hbm_bytes < 1 * MiB || hbm_bytes > 1024 * GiB)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "--hbm %lld is out of range [1 MiB, 1 TiB]",
		                  (long long)hbm_bytes);
	memset(out, 0, sizeof(*out));
	snprintf(out->name, sizeof(out->name), "custom-%dx%d", hosts, cores_per_host);
	out->num_hosts = hosts;
	out->cores_per_host = cores_per_host;
	out->hbm_bytes = hbm_bytes;
	/* A custom heap small enough to study by hand gets no hidden reservation. */
	out->reserved_bytes = hbm_bytes >= 4 * GiB ? runtime_reservation : 0;
	return ST_OK;
}

int parse_size(int64_t *out, const char *text, struct status *st)
{
	const char *p = text;
	if (!isdigit((unsigned char)*p))
		goto bad;
	char *end;
	double value = strtod(p, &end);
	int64_t scale = 1;
	switch (toupper((unsigned char)*end)) {
	case 'K':
		scale = 1024;
		break;
	case 'M':
		scale = MiB;
		break;
	case 'G':
		scale = GiB;
		break;
	case 'T':
		scale = 1024 * GiB;
		break;
	case '\0':
		break;
	case 'B':
		break;
	default:
		goto bad;
	}
	if (scale != 1) {
		end++;
		if (*end == 'i' || *end == 'I')
			end++;
		if (*end == 'B' || *end == 'b')
			end++;
	} else if (*end == 'B') {
		end++;
	}
	if (*end != '\0')
		goto bad;
	double bytes = value * (double)scale;
	if (!(bytes >= 0) || bytes >= 9.2e18 || bytes != floor(bytes))
		goto bad;
	*out = (int64_t)bytes;
	return ST_OK;
bad:
	return status_set(st, ST_INVALID_ARGUMENT,
	                  "invalid size '%s' (expected bytes, or a number with K, M, G or T)",
	                  text);
}

int parse_int(int *out, const char *what, const char *text, int lo, int hi, struct status *st)
{
	char *end;
	errno = 0;
	long long v = strtoll(text, &end, 10);
	if (end != text && *end == '\0' && errno == 0 && v >= lo && v <= hi) {
		*out = (int)v;
		return ST_OK;
	}
	if (hi == INT_MAX)
		return status_set(st, ST_INVALID_ARGUMENT,
		                  "%s: '%s' is not a whole number of at least %d", what, text, lo);
	return status_set(st, ST_INVALID_ARGUMENT, "%s: '%s' is not a whole number in [%d, %d]",
	                  what, text, lo, hi);
}
