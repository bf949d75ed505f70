/*
 * One status type for the whole code base: an absl-style code plus a message that names the
 * offending thing. Functions return the code (0 = OK) and, when given a struct status, fill its
 * message.
 */
#ifndef PODEMU_STATUS_H
#define PODEMU_STATUS_H

#include <stdarg.h>
#include <stdint.h>

enum status_code {
	ST_OK = 0,
	ST_CANCELLED = 1,
	ST_UNKNOWN = 2,
	ST_INVALID_ARGUMENT = 3,
	ST_DEADLINE_EXCEEDED = 4,
	ST_NOT_FOUND = 5,
	ST_ALREADY_EXISTS = 6,
	ST_PERMISSION_DENIED = 7,
	ST_RESOURCE_EXHAUSTED = 8,
	ST_FAILED_PRECONDITION = 9,
	ST_ABORTED = 10,
	ST_OUT_OF_RANGE = 11,
	ST_UNIMPLEMENTED = 12,
	ST_INTERNAL = 13,
	ST_UNAVAILABLE = 14,
	ST_DATA_LOSS = 15,
	ST_UNAUTHENTICATED = 16,
};

#define STATUS_MESSAGE_MAX 2048

struct status {
	int code;
	char message[STATUS_MESSAGE_MAX];
};

/* Returns the absl name of a code ("RESOURCE_EXHAUSTED"), or "UNKNOWN" for an unknown value. */
const char *status_code_name(int code);

/*
 * Sets st (when not NULL) to code and a printf-style message; returns code. The arguments may
 * include st->message, to add context to an error.
 */
int status_set(struct status *st, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Resets st to OK with an empty message. */
void status_clear(struct status *st);

/*
 * Formats a byte count the way XLA's error messages do (tsl HumanReadableNumBytes): "512B",
 * "1.50K", "12.00G". buf must hold at least 16 bytes; returns buf.
 */
char *status_human_bytes(char *buf, int64_t bytes);

#endif
