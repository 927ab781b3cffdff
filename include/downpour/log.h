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

void dp_log_set_level(dp_log_level level);
dp_log_level dp_log_get_level(void);
void dp_log(dp_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define dp_debug(...) dp_log(DP_LOG_DEBUG, __VA_ARGS__)
#define dp_info(...) dp_log(DP_LOG_INFO, __VA_ARGS__)
#define dp_warn(...) dp_log(DP_LOG_WARN, __VA_ARGS__)
#define dp_error(...) dp_log(DP_LOG_ERROR, __VA_ARGS__)

#endif
