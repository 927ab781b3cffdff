/* Metrics as JSON Lines.  Each event is built with cJSON (so strings are
 * escaped correctly), printed on one line and written with one write(2), so
 * a program tailing the file sees whole lines.  After open the handle is
 * read-only but for its sticky error, so threads may share one writer.  A
 * failed write (a full disk) is warned about once, naming the file and the
 * error; later events are dropped, and dp_metrics_close_check reports it, so
 * the command fails at its end without losing the rest of the run
 * (docs/metrics.md).  The merge of a cluster's per-task files is here too,
 * written with the atomic replace of file.h. */
#include "downpour/metrics.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "downpour/clock.h"
#include "downpour/file.h"
#include "downpour/log.h"
#include "downpour/tensorboard.h"

struct dp_metrics {
    int fd;    /* -1: drop everything */
    double t0; /* dp_now() at open */
    atomic_int failed; /* errno of the first failed write, 0: none */
    char *path;
    char task[64]; /* "worker:3": added to events lacking "task"; "" none */
    _Atomic(dp_tensorboard *) tb; /* mirrors events as scalars, or NULL */
};

/* Records the first failure (the one that warns); later ones are dropped. */
static void set_failed(dp_metrics *m, int e)
{
    int none = 0;
    if (atomic_compare_exchange_strong(&m->failed, &none, e ? e : EIO))
        dp_warn("metrics file %s: write failed: %s; later events are dropped and the command "
                "will exit with an error", m->path, strerror(e ? e : EIO));
}

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
    atomic_init(&m->failed, 0);
    m->path = NULL;
    m->task[0] = '\0';
    atomic_init(&m->tb, NULL);
    if (path) {
        m->path = strdup(path);
        m->fd = m->path ? open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
        if (m->fd < 0) {
            int e = m->path ? errno : ENOMEM;
            free(m->path);
            free(m);
            return dp_errf(err, "cannot open metrics file %s: %s", path, strerror(e));
        }
    }
    *out = m;
    return 0;
}

int dp_metrics_close_check(dp_metrics *m, dp_err *err)
{
    if (!m)
        return 0;
    int rc = 0;
    if (m->fd >= 0) {
        /* A filesystem may report a lost write only at fsync or close (NFS,
         * a disk filled behind the page cache); pipes and devices such as
         * /dev/stdout cannot sync, which is no error. */
        if (!atomic_load(&m->failed) && fsync(m->fd) < 0 && errno != EINVAL &&
            errno != ENOTSUP && errno != EROFS)
            set_failed(m, errno);
        if (close(m->fd) < 0 && errno != EINTR && !atomic_load(&m->failed))
            set_failed(m, errno);
    }
    int e = atomic_load(&m->failed);
    if (e)
        rc = dp_errf(err, "metrics file %s: write failed: %s (the file is incomplete)", m->path,
                     strerror(e));
    free(m->path);
    free(m);
    return rc;
}

void dp_metrics_close(dp_metrics *m)
{
    dp_metrics_close_check(m, NULL);
}

void dp_metrics_set_task(dp_metrics *m, const char *task)
{
    if (m)
        snprintf(m->task, sizeof m->task, "%s", task ? task : "");
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
 * field kind, out of memory or a failed write (this one or an earlier one:
 * the error is sticky).  A NULL handle and the
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
    /* Milliseconds are enough to align tasks, and keep lines short. */
    char wall[32];
    snprintf(wall, sizeof wall, "%.3f", dp_wall_now());
    if (!obj || !cJSON_AddStringToObject(obj, "event", event) ||
        !cJSON_AddItemToObject(obj, "t", json_num(t)) ||
        !cJSON_AddItemToObject(obj, "wall", cJSON_CreateRaw(wall)))
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
    if (m && m->task[0] && !cJSON_GetObjectItemCaseSensitive(obj, "task") &&
        !cJSON_AddStringToObject(obj, "task", m->task))
        goto out;
    /* The mirror fires for a writer with no file too: --tensorboard alone. */
    dp_tensorboard *tb = m ? atomic_load(&m->tb) : NULL;
    if (tb && (line = cJSON_PrintUnformatted(obj)))
        dp_tensorboard_metrics_event(tb, line, strlen(line));
    if (!m || m->fd < 0) {
        rc = 0;
        goto out;
    }
    if (atomic_load_explicit(&m->failed, memory_order_relaxed))
        goto out; /* already reported: one warning, not one per event */

    if (!line && !(line = cJSON_PrintUnformatted(obj)))
        goto out;
    size_t n = strlen(line);
    /* cJSON's buffer has room for the terminator, which becomes the newline. */
    line[n] = '\n';
    rc = dp_write_all(m->fd, line, n + 1, NULL);
    if (rc < 0)
        set_failed(m, errno);
out:
    cJSON_free(line);
    cJSON_Delete(obj);
    return rc;
}

void dp_metrics_attach_tensorboard(dp_metrics *m, dp_tensorboard *tb)
{
    if (m)
        atomic_store(&m->tb, tb);
}

/* ---- merging the files of a cluster's tasks ---- */

typedef struct task_res {
    double cpu_sum;
    long samples;
    double rss_peak;
    double pss_peak;
    long pss_samples;
    double tx, rx;
} task_res;

static double num_field(const cJSON *o, const char *key, int *found)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsNumber(v)) {
        *found = 1;
        return v->valuedouble;
    }
    return 0;
}

/* Folds one "resource" event into the task's totals. */
static void add_resource(task_res *tr, const cJSON *o)
{
    int f = 0;
    double cpu = num_field(o, "cpu_percent", &f);
    if (f) {
        tr->cpu_sum += cpu;
        tr->samples++;
    }
    double v = num_field(o, "rss_bytes", &f);
    if (v > tr->rss_peak)
        tr->rss_peak = v;
    f = 0;
    v = num_field(o, "pss_bytes", &f);
    if (f) {
        tr->pss_samples++;
        if (v > tr->pss_peak)
            tr->pss_peak = v;
    }
    v = num_field(o, "net_tx_bytes", &f);
    if (v > tr->tx)
        tr->tx = v;
    v = num_field(o, "net_rx_bytes", &f);
    if (v > tr->rx)
        tr->rx = v;
}

/* Copies one task's file into fd, tagging lines with the task; adds its
 * resource figures to tr.  A missing file is a warning, not an error. */
static int merge_one(int fd, const dp_metrics_source *src, task_res *tr, char **line, size_t *cap,
                     const char *out, dp_err *err)
{
    FILE *in = fopen(src->path, "r");
    if (!in) {
        dp_warn("merging metrics: no metrics from %s (%s: %s)", src->task, src->path,
                strerror(errno));
        return 0;
    }
    long skipped = 0;
    ssize_t n;
    int rc = 0;
    while (rc == 0 && (n = getline(line, cap, in)) > 0) {
        cJSON *o = cJSON_ParseWithLength(*line, (size_t)n);
        if (!cJSON_IsObject(o)) {
            skipped++;
            cJSON_Delete(o);
            continue;
        }
        if (!cJSON_GetObjectItemCaseSensitive(o, "task"))
            cJSON_AddStringToObject(o, "task", src->task);
        const cJSON *ev = cJSON_GetObjectItemCaseSensitive(o, "event");
        if (cJSON_IsString(ev) && strcmp(ev->valuestring, "resource") == 0)
            add_resource(tr, o);
        char *s = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (!s) {
            rc = dp_errf(err, "merging metrics: out of memory");
            break;
        }
        size_t len = strlen(s);
        s[len] = '\n'; /* cJSON's buffer has room for the terminator */
        if (dp_write_all(fd, s, len + 1, NULL) < 0)
            rc = dp_errf(err, "merging metrics: writing %s: %s", out, strerror(errno));
        cJSON_free(s);
    }
    fclose(in);
    if (skipped)
        dp_warn("merging metrics: skipped %ld line%s of %s (not a JSON object; a task "
                "killed while writing leaves a torn last line)",
                skipped, skipped == 1 ? "" : "s", src->path);
    return rc;
}

int dp_metrics_merge(const char *path, const dp_metrics_source *src, int n, double seconds,
                     dp_err *err)
{
    dp_atomic_file af;
    if (dp_atomic_open(&af, path, err) < 0)
        return dp_err_prefix(err, "merging metrics");
    double cpu_mean_sum = 0, rss = 0, pss = 0, tx = 0, rx = 0;
    long samples = 0;
    int tasks_with = 0;
    bool all_pss = true; /* a PSS sum means something only over every task */
    char *line = NULL;
    size_t cap = 0;
    for (int i = 0; i < n; i++) {
        task_res tr = {0};
        if (merge_one(af.fd, &src[i], &tr, &line, &cap, path, err) < 0) {
            free(line);
            dp_atomic_abort(&af);
            return -1;
        }
        if (tr.samples > 0) {
            tasks_with++;
            samples += tr.samples;
            cpu_mean_sum += tr.cpu_sum / (double)tr.samples;
        }
        rss += tr.rss_peak;
        pss += tr.pss_peak;
        if (tr.samples > 0 && tr.pss_samples == 0)
            all_pss = false;
        tx += tr.tx;
        rx += tr.rx;
    }
    free(line);
    if (tasks_with > 0) {
        char total[512], pss_field[64] = "";
        if (all_pss)
            snprintf(pss_field, sizeof pss_field, ",\"pss_peak_bytes\":%.0f", pss);
        int len = snprintf(total, sizeof total,
                           "{\"event\":\"resource_total\",\"t\":%.3f,\"wall\":%.3f,\"tasks\":%d,\"samples\":%ld,"
                           "\"cpu_percent_mean\":%.3f,\"cpu_percent_sum\":%.3f,"
                           "\"rss_peak_bytes\":%.0f%s,\"net_tx_bytes\":%.0f,\"net_rx_bytes\":%.0f}\n",
                           seconds, dp_wall_now(), tasks_with, samples, cpu_mean_sum / tasks_with, cpu_mean_sum,
                           rss, pss_field, tx, rx);
        if (len < 0 || (size_t)len >= sizeof total ||
            dp_write_all(af.fd, total, (size_t)len, NULL) < 0) {
            dp_errf(err, "merging metrics: writing %s: %s", path,
                    len < 0 || (size_t)len >= sizeof total ? "line too long" : strerror(errno));
            dp_atomic_abort(&af);
            return -1;
        }
    }
    if (dp_atomic_commit(&af, err) < 0)
        return dp_err_prefix(err, "merging metrics");
    return 0;
}
