/*
 * Progress of long CLI operations on stderr, one line rewritten in place: only on a terminal
 * and never with --json (progress_enable decides once), so pipes and logs see nothing extra.
 */
#ifndef PODEMU_CLI_PROGRESS_H
#define PODEMU_CLI_PROGRESS_H

#include <stdbool.h>

/* Progress is shown from now on when stderr is a terminal and json is false. */
void progress_enable(bool json);
/* Replaces the progress line. */
void progress_show(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Clears the progress line (before normal output or at the end). */
void progress_clear(void);

#endif
