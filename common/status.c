#include "status.h"

#include <stdio.h>
#include <string.h>

static const char *const code_names[] = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
};

const char *status_code_name(int code)
{
	if (code < 0 || code >= (int)(sizeof(code_names) / sizeof(code_names[0])))
		return "UNKNOWN";
	return code_names[code];
}

int status_set(struct status *st, int code, const char *fmt, ...)
{
	if (st != NULL) {
		/* The arguments may include st->message itself (adding context to an error). */
		char text[STATUS_MESSAGE_MAX];
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(text, sizeof(text), fmt, ap);
		va_end(ap);
		st->code = code;
		memcpy(st->message, text, sizeof(text));
	}
	return code;
}

void status_clear(struct status *st)
{
	if (st != NULL) {
		st->code = ST_OK;
		st->message[0] = '\0';
	}
}

char *status_human_bytes(char *buf, int64_t bytes)
{
	static const char units[] = "KMGTPE";
	const char *neg = bytes < 0 ? "-" : "";
	uint64_t n = bytes < 0 ? (uint64_t)0 - (uint64_t)bytes : (uint64_t)bytes;
	if (n < 1024) {
		snprintf(buf, 16, "%s%lluB", neg, (unsigned long long)n);
		return buf;
	}
	int unit = 0;
	while (n >= (uint64_t)1024 * 1024 && unit < 5) {
		n /= 1024;
		unit++;
	}
	snprintf(buf, 16, "%s%.2f%c", neg, (double)n / 1024.0, units[unit]);
	return buf;
}
