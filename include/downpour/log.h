/* Human-readable log lines on stderr.  The task tag ("worker 0") is set once
 * per process so every line says who wrote it. */
#ifndef DOWNPOUR_LOG_H
#define DOWNPOUR_LOG_H

typedef enum dp_log_level {
    DP_LOG_DEBUG,
    DP_LOG_INFO,
    DP_LOG_WARN,
    DP_LOG_ERROR,
    DP_LOG_COUNT
} dp_log_level;

/* The environment variable a process reads its level from at start
 * (`downpour --log-level` sets it, so that launched tasks inherit it). */
#define DP_LOG_LEVEL_ENV "DOWNPOUR_LOG_LEVEL"

void dp_log_set_level(dp_log_level level);
dp_log_level dp_log_get_level(void);
/* "error", "warn" (or "warning"), "info", "debug"; -1 for another name. */
int dp_log_level_parse(const char *name, dp_log_level *out);
const char *dp_log_level_name(dp_log_level level);
/* While a progress line is drawn on stderr (a terminal), each log line first
 * erases it, so no stale bar is left above the line; the bar's next draw
 * puts it back below. */
void dp_log_set_progress(int drawn);
void dp_log(dp_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define dp_debug(...) dp_log(DP_LOG_DEBUG, __VA_ARGS__)
#define dp_info(...) dp_log(DP_LOG_INFO, __VA_ARGS__)
#define dp_warn(...) dp_log(DP_LOG_WARN, __VA_ARGS__)
#define dp_error(...) dp_log(DP_LOG_ERROR, __VA_ARGS__)

#endif
