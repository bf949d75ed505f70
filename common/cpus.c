#include "cpus.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>

/* Reads a CPU number at *p; -1 when there is none or it is not below CPU_SETSIZE. */
static long cpu_number(const char **p)
{
	if (!isdigit((unsigned char)**p))
		return -1;
	long v = 0;
	while (isdigit((unsigned char)**p)) {
		v = v * 10 + (**p - '0');
		if (v >= CPU_SETSIZE)
			return -1;
		(*p)++;
	}
	return v;
}

int cpus_allowed(cpu_set_t *set)
{
	if (sched_getaffinity(0, sizeof(*set), set) == 0 && CPU_COUNT(set) > 0)
		return CPU_COUNT(set);
	CPU_ZERO(set);
	CPU_SET(0, set);
	return 1;
}

int cpus_parse(cpu_set_t *set, const char *list, struct status *st)
{
	CPU_ZERO(set);
	const char *p = list;
	do {
		long lo = cpu_number(&p), hi = lo;
		if (lo >= 0 && *p == '-') {
			p++;
			hi = cpu_number(&p);
		}
		if (lo < 0 || hi < lo || (*p != ',' && *p != '\0'))
			return status_set(st, ST_INVALID_ARGUMENT,
			                  "'%s' is not a CPU list such as 0-3,8 (CPUs below %d)",
			                  list, CPU_SETSIZE);
		for (long c = lo; c <= hi; c++)
			CPU_SET((int)c, set);
	} while (*p++ == ',');
	return ST_OK;
}

bool cpus_format(const cpu_set_t *set, char *out, size_t len)
{
	size_t at = 0;
	out[0] = '\0';
	for (int c = 0; c < CPU_SETSIZE; c++) {
		if (!CPU_ISSET(c, set))
			continue;
		int end = c;
		while (end + 1 < CPU_SETSIZE && CPU_ISSET(end + 1, set))
			end++;
		int n = end > c ? snprintf(out + at, len - at, "%s%d-%d", at ? "," : "", c, end)
		                : snprintf(out + at, len - at, "%s%d", at ? "," : "", c);
		if (n < 0 || (size_t)n >= len - at)
			return false;
		at += (size_t)n;
		c = end;
	}
	return true;
}

void cpus_for_agent(cpu_set_t *out, const cpu_set_t *allowed, int h, int n)
{
	int ids[CPU_SETSIZE], count = 0;
	for (int c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, allowed))
			ids[count++] = c;
	CPU_ZERO(out);
	if (count == 0 || n <= 0 || h < 0)
		return;
	if (n > count) {
		CPU_SET(ids[h % count], out);
		return;
	}
	for (int k = (int)((long)h * count / n); k < (int)((long)(h + 1) * count / n); k++)
		CPU_SET(ids[k], out);
}
