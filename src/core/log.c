#include "downpour/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

static dp_log_level g_level = DP_LOG_INFO;

static const char *const level_names[DP_LOG_COUNT] = {"debug", "info", "warning", "error"};

static _Atomic int g_progress; /* a progress line is on stderr's last line */

void dp_log_set_level(dp_log_level level) { g_level = level; }
dp_log_level dp_log_get_level(void) { return g_level; }
void dp_log_set_progress(int drawn) { atomic_store(&g_progress, drawn != 0); }

int dp_log_level_parse(const char *name, dp_log_level *out)
{
    static const struct {
        const char *name;
        dp_log_level level;
    } names[] = {{"debug", DP_LOG_DEBUG}, {"info", DP_LOG_INFO},  {"warn", DP_LOG_WARN},
                 {"warning", DP_LOG_WARN}, {"error", DP_LOG_ERROR}};
    for (size_t i = 0; name && i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i].name) == 0) {
            *out = names[i].level;
            return 0;
        }
    return -1;
}

const char *dp_log_level_name(dp_log_level level)
{
    return level >= 0 && level < DP_LOG_COUNT ? level_names[level] : "?";
}

void dp_log(dp_log_level level, const char *fmt, ...)
{
    if (level < g_level)
        return;
    /* One buffered write per line, so lines of concurrent tasks never interleave. */
    char line[1024];
    int n = 0;
    /* "\r", erase the line: the progress bar gives way (dp_log_set_progress) */
    if (atomic_exchange(&g_progress, 0))
        n = snprintf(line, sizeof line, "\r\033[K");
    if (level != DP_LOG_INFO)
        n += snprintf(line + n, sizeof line - (size_t)n, "%s: ", level_names[level]);
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
