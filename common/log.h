/* Minimal leveled logging to stderr with a timestamp and the process role. */
#ifndef PODEMU_LOG_H
#define PODEMU_LOG_H

enum log_level { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR };

/* Sets the role printed on every line ("coordinator", "agent-3") and the lowest level shown. */
void log_init(const char *role, enum log_level level);
enum log_level log_level(void); /* the level log_init set */
void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)

#endif
