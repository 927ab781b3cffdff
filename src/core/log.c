#include "downpour/log.h"

#include <stdarg.h>
#include <stdio.h>

static dp_log_level g_level = DP_LOG_INFO;

static const char *const level_names[DP_LOG_COUNT] = {"debug", "info", "warning", "error"};

void dp_log_set_level(dp_log_level level) { g_level = level; }
dp_log_level dp_log_get_level(void) { return g_level; }

void dp_log(dp_log_level level, const char *fmt, ...)
{
    if (level < g_level)
        return;
    /* One buffered write per line, so lines of concurrent tasks never interleave. */
    char line[1024];
    int n = 0;
    if (level != DP_LOG_INFO)
        n = snprintf(line, sizeof line, "%s: ", level_names[level]);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        return;
    n += m;
    if (n > (int)sizeof line - 2)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    fwrite(line, 1, (size_t)n, stderr);
    fflush(stderr);
}
