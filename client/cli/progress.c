#include "progress.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

static bool enabled, shown;

void progress_enable(bool json)
{
	enabled = !json && isatty(STDERR_FILENO);
}

void progress_show(const char *fmt, ...)
{
	if (!enabled)
		return;
	va_list ap;
	va_start(ap, fmt);
	fputs("\r\033[K", stderr);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fflush(stderr);
	shown = true;
}

void progress_clear(void)
{
	if (!enabled || !shown)
		return;
	fputs("\r\033[K", stderr);
	fflush(stderr);
	shown = false;
}
