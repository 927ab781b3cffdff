/* Metrics as JSON Lines.  Each event is built with cJSON (so strings are
 * escaped correctly), printed on one line and written with one write(2), so
 * a program tailing the file sees whole lines.  After open the handle is
 * read-only, so threads may share one writer. */
#include "downpour/metrics.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "downpour/clock.h"
#include "downpour/file.h"

struct dp_metrics {
    int fd;    /* -1: drop everything */
    double t0; /* dp_now() at open */
};

int dp_metrics_open(dp_metrics **out, const char *path, dp_err *err)
{
    if (!out)
        return dp_errf(err, "metrics: no output handle");
    *out = NULL;
    dp_metrics *m = malloc(sizeof *m);
    if (!m)
        return dp_errf(err, "metrics: out of memory");
    m->fd = -1;
    m->t0 = dp_now();
    if (path) {
        m->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (m->fd < 0) {
            int e = errno;
            free(m);
            return dp_errf(err, "cannot open metrics file %s: %s", path, strerror(e));
        }
    }
    *out = m;
    return 0;
}

void dp_metrics_close(dp_metrics *m)
{
    if (!m)
        return;
    if (m->fd >= 0)
        close(m->fd);
    free(m);
}

/* A JSON integer printed exactly (cJSON would go through double). */
static cJSON *json_long(long v)
{
    char s[32];
    snprintf(s, sizeof s, "%ld", v);
    return cJSON_CreateRaw(s);
}

/* Finite doubles as numbers (cJSON prints %.15g, or %.17g when that is needed
 * to read back the same double); NaN and infinities as null. */
static cJSON *json_num(double v)
{
    return isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull();
}

/* Returns 0, or -1 (nothing written) for a NULL event or key, an unknown
 * field kind, out of memory or a failed write.  A NULL handle and the
 * writer opened with a NULL path accept everything and write nothing, after
 * checking the list all the same. */
int dp_metrics_event(dp_metrics *m, const char *event, ...)
{
    if (!event)
        return -1;
    double t = m ? dp_now() - m->t0 : 0.0;
    int rc = -1;
    char *line = NULL;
    cJSON *obj = cJSON_CreateObject();
    if (!obj || !cJSON_AddStringToObject(obj, "event", event) ||
        !cJSON_AddItemToObject(obj, "t", json_num(t)))
        goto out;

    va_list ap;
    va_start(ap, event);
    int bad = 0;
    for (;;) {
        int kind = va_arg(ap, int);
        if (kind == DP_F_END)
            break;
        if (kind != DP_F_INT && kind != DP_F_NUM && kind != DP_F_STR) {
            bad = 1; /* the rest of the list cannot be read safely */
            break;
        }
        const char *key = va_arg(ap, const char *);
        cJSON *v;
        if (kind == DP_F_INT) {
            v = json_long(va_arg(ap, long));
        } else if (kind == DP_F_NUM) {
            v = json_num(va_arg(ap, double));
        } else {
            const char *s = va_arg(ap, const char *);
            v = s ? cJSON_CreateString(s) : cJSON_CreateNull();
        }
        if (!key || !v || !cJSON_AddItemToObject(obj, key, v)) {
            cJSON_Delete(v);
            bad = 1;
            break;
        }
    }
    va_end(ap);
    if (bad)
        goto out;
    if (!m || m->fd < 0) {
        rc = 0;
        goto out;
    }

    line = cJSON_PrintUnformatted(obj);
    if (!line)
        goto out;
    size_t n = strlen(line);
    /* cJSON's buffer has room for the terminator, which becomes the newline. */
    line[n] = '\n';
    rc = dp_write_all(m->fd, line, n + 1, NULL);
out:
    cJSON_free(line);
    cJSON_Delete(obj);
    return rc;
}
