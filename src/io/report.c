/* Reports (report.h, docs/reports.md): metrics files read into runs, and one
 * self-contained HTML page of inline SVG charts and tables written from
 * them and from the caller's items.
 *
 * Memory is bounded whatever the file holds: a line over 1 MiB and more
 * than MAX_RUNS runs are errors; a task's resource samples are thinned
 * (every other one dropped, then every fourth, ...) to stay under
 * MAX_SAMPLES, while its means, peaks and last counters are taken over every
 * sample; tasks, epochs, steps rows and faults beyond their caps are counted
 * and left out with one warning.
 *
 * Time: a line's x on the per-task charts is its "wall" minus the run's
 * earliest wall, so tasks of one cluster share an axis; a line without
 * wall uses its task's wall - t offset, and a file with no wall at all
 * falls back to "t" (each process's own clock, which a launcher starts at
 * about the same moment). */
#include "downpour/report.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "downpour/file.h"
#include "downpour/log.h"
#include "io/svg.h"

#define MAX_RUNS 64
#define MAX_TASKS 512
#define MAX_LINE (1 << 20)
#define MAX_SAMPLES 2048  /* per task; thinned beyond */
#define MAX_ROWS 10000    /* epochs of a run, steps rows of a task */
#define MAX_FAULTS 500
#define MAX_STRAGGLERS 500
#define STRAGGLER_FACTOR 1.5

typedef struct sample {
    double t, wall, cpu, rss, net; /* net: cumulative tx + rx bytes */
} sample;

typedef struct step_row {
    double epoch, t, wall, median, p90, max, sps;
    double steps, compute; /* compute: median compute ms a step, NAN in older files */
} step_row;

typedef struct task_data {
    char *name;
    sample *s;
    int n;
    long seen, stride; /* resource lines read; one of every stride is kept */
    double cpu_sum, rss_peak, pss_peak, tx_last, rx_last;
    long cpu_n, pss_n;
    step_row *steps;
    int n_steps;
    double offset; /* wall - t, from its first line with both */
    bool has_offset;
} task_data;

typedef struct epoch_row {
    double epoch, val_acc, val_loss, train_loss, lr, val_auc; /* val_auc: bce models */
} epoch_row;

typedef struct fault_row {
    char *task, *what;
    double t, wall;
} fault_row;

typedef struct straggler {
    int task;
    double epoch, x, ms, median;
    bool by_compute; /* ms and median are compute times, else step times */
    double waited_s; /* how long the other tasks waited on it in the epoch, NAN unknown */
} straggler;

typedef struct run {
    char *path, *label;
    epoch_row *ep;
    int n_ep;
    cJSON *done, *total;
    bool done_chief;
    task_data *tasks;
    int n_tasks;
    fault_row *faults;
    int n_faults;
    long dropped; /* rows beyond the caps */
    bool has_wall;
    double base, any_offset;
    bool has_any_offset;
    straggler *strag;
    int n_strag;
} run;

typedef enum item_kind { ITEM_HEADING, ITEM_PARAGRAPH, ITEM_TABLE, ITEM_CHART, ITEM_KIND_COUNT } item_kind;

typedef struct item {
    item_kind kind;
    char *text; /* heading, paragraph, table caption, chart title */
    int cols, rows;
    char **cells; /* table: header then rows x cols */
    char *x_label, *y_label;
    bool y_from_zero;
    svg_series *series; /* chart: names and points copied */
    int n_series;
} item;

struct dp_report {
    char *title;
    item *items;
    int n_items, cap_items;
    run *runs;
    int n_runs;
};

/* ---- small helpers ---- */

static char *dup_str(const char *s)
{
    return strdup(s ? s : "");
}

static double num_of(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static const char *str_of(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Grows *p (of *n elements) by one; false when the cap or memory is hit. */
static bool grow(void **p, int n, size_t size, int cap)
{
    if (n >= cap)
        return false;
    if (n == 0 || (n & (n - 1)) == 0) { /* at 0, 1, 2, 4, ...: double */
        void *q = realloc(*p, (size_t)(n ? 2 * n : 1) * size);
        if (!q)
            return false;
        *p = q;
    }
    return true;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void run_free(run *r)
{
    free(r->path);
    free(r->label);
    free(r->ep);
    cJSON_Delete(r->done);
    cJSON_Delete(r->total);
    for (int i = 0; i < r->n_tasks; i++) {
        free(r->tasks[i].name);
        free(r->tasks[i].s);
        free(r->tasks[i].steps);
    }
    free(r->tasks);
    for (int i = 0; i < r->n_faults; i++) {
        free(r->faults[i].task);
        free(r->faults[i].what);
    }
    free(r->faults);
    free(r->strag);
}

/* ---- reading a run ---- */

typedef enum add_result { ADD_OK, ADD_CAPPED, ADD_NOMEM } add_result;

static int find_task(run *r, const char *name, bool create)
{
    for (int i = 0; i < r->n_tasks; i++)
        if (strcmp(r->tasks[i].name, name) == 0)
            return i;
    if (!create)
        return -1;
    if (r->n_tasks >= MAX_TASKS)
        return -2;
    if (!grow((void **)&r->tasks, r->n_tasks, sizeof *r->tasks, MAX_TASKS))
        return -3;
    task_data *td = &r->tasks[r->n_tasks];
    memset(td, 0, sizeof *td);
    td->stride = 1;
    td->rss_peak = td->pss_peak = NAN;
    td->tx_last = td->rx_last = NAN;
    if (!(td->name = strdup(name)))
        return -3;
    return r->n_tasks++;
}

static add_result add_sample(task_data *td, const cJSON *o, double t, double wall)
{
    double cpu = num_of(o, "cpu_percent"), rss = num_of(o, "rss_bytes");
    double tx = num_of(o, "net_tx_bytes"), rx = num_of(o, "net_rx_bytes");
    if (isfinite(cpu)) {
        td->cpu_sum += cpu;
        td->cpu_n++;
    }
    if (isfinite(rss) && !(rss <= td->rss_peak))
        td->rss_peak = rss;
    double pss = num_of(o, "pss_bytes");
    if (isfinite(pss)) {
        td->pss_n++;
        if (!(pss <= td->pss_peak))
            td->pss_peak = pss;
    }
    if (isfinite(tx))
        td->tx_last = tx;
    if (isfinite(rx))
        td->rx_last = rx;
    if (td->seen++ % td->stride != 0)
        return ADD_OK;
    if (td->n == MAX_SAMPLES) { /* thin: keep every other, and from now one in 2x */
        for (int k = 0; k < MAX_SAMPLES / 2; k++)
            td->s[k] = td->s[2 * k];
        td->n = MAX_SAMPLES / 2;
        td->stride *= 2;
        if ((td->seen - 1) % td->stride != 0)
            return ADD_OK;
    }
    if (!grow((void **)&td->s, td->n, sizeof *td->s, MAX_SAMPLES))
        return ADD_NOMEM;
    td->s[td->n++] = (sample){t, wall, cpu, rss,
                              isfinite(tx) || isfinite(rx) ? (isfinite(tx) ? tx : 0) +
                                                                 (isfinite(rx) ? rx : 0)
                                                           : NAN};
    return ADD_OK;
}

static add_result add_steps(task_data *td, const cJSON *o, double t, double wall)
{
    if (!grow((void **)&td->steps, td->n_steps, sizeof *td->steps, MAX_ROWS))
        return td->n_steps >= MAX_ROWS ? ADD_CAPPED : ADD_NOMEM;
    td->steps[td->n_steps++] =
        (step_row){num_of(o, "epoch"), t, wall, num_of(o, "step_ms_median"), num_of(o, "step_ms_p90"),
                   num_of(o, "step_ms_max"), num_of(o, "samples_per_second"), num_of(o, "steps"),
                   num_of(o, "compute_ms_median")};
    return ADD_OK;
}

static add_result add_epoch(run *r, const cJSON *o)
{
    if (!grow((void **)&r->ep, r->n_ep, sizeof *r->ep, MAX_ROWS))
        return r->n_ep >= MAX_ROWS ? ADD_CAPPED : ADD_NOMEM;
    r->ep[r->n_ep++] = (epoch_row){num_of(o, "epoch"), num_of(o, "val_accuracy"),
                                   num_of(o, "val_loss"), num_of(o, "train_loss"), num_of(o, "lr"),
                                   num_of(o, "val_auc")};
    return ADD_OK;
}

static add_result add_fault(run *r, const cJSON *o, double t, double wall)
{
    if (!grow((void **)&r->faults, r->n_faults, sizeof *r->faults, MAX_FAULTS))
        return r->n_faults >= MAX_FAULTS ? ADD_CAPPED : ADD_NOMEM;
    fault_row *f = &r->faults[r->n_faults];
    f->task = dup_str(str_of(o, "task"));
    f->what = dup_str(str_of(o, "what"));
    f->t = t;
    f->wall = wall;
    if (!f->task || !f->what) {
        free(f->task);
        free(f->what);
        return ADD_NOMEM;
    }
    r->n_faults++;
    return ADD_OK;
}

/* Whether a "done" line is the chief's or a single process's (the one whose
 * figures are the run's), not another task's. */
static bool done_of_chief(const cJSON *o)
{
    const char *task = str_of(o, "task");
    return !task || strncmp(task, "chief", 5) == 0;
}

/* One JSON object: returns 1 if it is an event of a run, 0 if not, -1 out of memory. */
static int take_line(run *r, cJSON *o)
{
    const char *ev = str_of(o, "event"), *task = str_of(o, "task");
    double t = num_of(o, "t"), wall = num_of(o, "wall");
    if (!ev)
        return 0;
    bool is_fault = strcmp(ev, "fault") == 0;
    int ti = -1;
    if (!is_fault && (task || strcmp(ev, "resource") == 0 || strcmp(ev, "steps") == 0)) {
        ti = find_task(r, task ? task : "process", true);
        if (ti == -3)
            return -1;
        if (ti == -2) {
            r->dropped++;
            return 1;
        }
        task_data *td = &r->tasks[ti];
        if (!td->has_offset && isfinite(t) && isfinite(wall)) {
            td->offset = wall - t;
            td->has_offset = true;
            if (!r->has_any_offset) {
                r->any_offset = td->offset;
                r->has_any_offset = true;
            }
        }
    }
    if (isfinite(wall))
        r->has_wall = true;
    add_result a = ADD_OK;
    int of_run = 1;
    if (strcmp(ev, "epoch") == 0) {
        a = add_epoch(r, o);
    } else if (strcmp(ev, "done") == 0) {
        bool chief = done_of_chief(o);
        if (!r->done || chief || !r->done_chief) {
            cJSON_Delete(r->done);
            if (!(r->done = cJSON_Duplicate(o, 1)))
                return -1;
            r->done_chief = chief;
        }
    } else if (strcmp(ev, "resource") == 0) {
        a = add_sample(&r->tasks[ti], o, t, wall);
    } else if (strcmp(ev, "steps") == 0) {
        a = add_steps(&r->tasks[ti], o, t, wall);
    } else if (is_fault) {
        a = add_fault(r, o, t, wall);
    } else if (strcmp(ev, "resource_total") == 0) {
        cJSON_Delete(r->total);
        if (!(r->total = cJSON_Duplicate(o, 1)))
            return -1;
    } else {
        of_run = 0;
    }
    if (a == ADD_NOMEM)
        return -1;
    if (a == ADD_CAPPED)
        r->dropped++;
    return of_run;
}

/* Reads one line of at most MAX_LINE bytes into *buf.  Returns its length,
 * -1 at end of file, -2 for a line too long; *newline tells whether it ended
 * with one (a torn last line does not). */
static long read_line(FILE *f, char **buf, size_t *cap, bool *newline)
{
    size_t n = 0;
    int c;
    *newline = false;
    while ((c = getc(f)) != EOF) {
        if (c == '\n') {
            *newline = true;
            break;
        }
        if (n >= MAX_LINE) {
            while ((c = getc(f)) != EOF && c != '\n') {
            }
            return -2;
        }
        if (n + 2 > *cap) {
            size_t nc = *cap ? *cap * 2 : 4096;
            char *p = realloc(*buf, nc);
            if (!p)
                return -3;
            *buf = p;
            *cap = nc;
        }
        (*buf)[n++] = (char)c;
    }
    if (n == 0 && c == EOF)
        return -1;
    if (*buf)
        (*buf)[n] = '\0';
    return (long)n;
}

static bool blank(const char *s, long n)
{
    for (long i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return false;
    return true;
}

static int read_run(run *r, const char *path, dp_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return dp_errf(err, "cannot open %s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t cap = 0;
    long lineno = 0, events = 0;
    int rc = -1;
    bool newline;
    for (;;) {
        long n = read_line(f, &buf, &cap, &newline);
        if (n == -1)
            break;
        lineno++;
        if (n == -3) {
            dp_errf(err, "%s: out of memory", path);
            goto out;
        }
        if (n == -2) {
            dp_errf(err, "%s: line %ld is longer than %d bytes (not a metrics file?)", path, lineno,
                    MAX_LINE);
            goto out;
        }
        if (blank(buf, n))
            continue;
        cJSON *o = cJSON_ParseWithLength(buf, (size_t)n);
        if (!cJSON_IsObject(o)) {
            cJSON_Delete(o);
            if (!newline) { /* the torn last line of a killed task */
                dp_warn("%s: line %ld is cut short (a killed task's last line?); skipped", path,
                        lineno);
                continue;
            }
            dp_errf(err, "%s: line %ld is not a JSON object (not a metrics file? see "
                         "docs/metrics.md)",
                    path, lineno);
            goto out;
        }
        int k = take_line(r, o);
        cJSON_Delete(o);
        if (k < 0) {
            dp_errf(err, "%s: out of memory", path);
            goto out;
        }
        events += k;
    }
    if (ferror(f)) {
        dp_errf(err, "cannot read %s: %s", path, strerror(errno));
        goto out;
    }
    if (events == 0) {
        dp_errf(err, "%s holds no event of a run (epoch, done, steps, resource, fault; see "
                     "docs/metrics.md)",
                path);
        goto out;
    }
    if (r->dropped)
        dp_warn("%s: %ld line(s) beyond the report's limits (%d tasks, %d epochs, %d faults) "
                "left out",
                path, r->dropped, MAX_TASKS, MAX_ROWS, MAX_FAULTS);
    rc = 0;
out:
    free(buf);
    fclose(f);
    return rc;
}

/* ---- time and stragglers ---- */

/* A line's seconds on the run's time axis (see the top of this file). */
static double run_x(const run *r, const task_data *td, double t, double wall)
{
    if (!r->has_wall)
        return t;
    if (!isfinite(wall) && isfinite(t)) {
        if (td && td->has_offset)
            wall = t + td->offset;
        else if (r->has_any_offset)
            wall = t + r->any_offset;
    }
    return wall - r->base;
}

static void settle_time(run *r)
{
    r->base = 0;
    if (!r->has_wall)
        return;
    double base = INFINITY;
    for (int i = 0; i < r->n_tasks; i++) {
        task_data *td = &r->tasks[i];
        for (int k = 0; k < td->n; k++)
            base = fmin(base, run_x(r, td, td->s[k].t, td->s[k].wall));
        for (int k = 0; k < td->n_steps; k++)
            base = fmin(base, run_x(r, td, td->steps[k].t, td->steps[k].wall));
    }
    for (int k = 0; k < r->n_faults; k++)
        base = fmin(base, run_x(r, NULL, r->faults[k].t, r->faults[k].wall));
    r->base = isfinite(base) ? base : 0;
}

/* The last steps row of a task for an epoch, or NULL. */
static const step_row *steps_at(const task_data *td, double epoch)
{
    for (int k = td->n_steps - 1; k >= 0; k--)
        if (td->steps[k].epoch == epoch)
            return &td->steps[k];
    return NULL;
}

/* The sorted distinct epochs of every task's steps rows; returns the count. */
static int step_epochs(const run *r, double **out)
{
    int total = 0;
    for (int i = 0; i < r->n_tasks; i++)
        total += r->tasks[i].n_steps;
    double *e = malloc((size_t)(total ? total : 1) * sizeof *e);
    *out = e;
    if (!e)
        return -1;
    int n = 0;
    for (int i = 0; i < r->n_tasks; i++)
        for (int k = 0; k < r->tasks[i].n_steps; k++)
            if (isfinite(r->tasks[i].steps[k].epoch))
                e[n++] = r->tasks[i].steps[k].epoch;
    qsort(e, (size_t)n, sizeof *e, cmp_double);
    int m = 0;
    for (int k = 0; k < n; k++)
        if (m == 0 || e[k] != e[m - 1])
            e[m++] = e[k];
    return m;
}

/* A straggler: a task whose median compute time a step in an epoch exceeds
 * STRAGGLER_FACTOR times the median over the run's tasks in that epoch.
 * Compute, not step time: under ps-sync and all-reduce the others wait for
 * the slow task, so every task's step time is the slowest one's.  A file
 * without compute times (an older downpour) falls back to step times. */
static int find_stragglers(run *r)
{
    double *ep;
    int n_ep = step_epochs(r, &ep);
    double *v = malloc((size_t)(r->n_tasks ? r->n_tasks : 1) * sizeof *v);
    if (n_ep < 0 || !v) {
        free(ep);
        free(v);
        return -1;
    }
    for (int e = 0; e < n_ep; e++) {
        int n = 0;
        bool by_compute = true;
        for (int i = 0; i < r->n_tasks; i++) {
            const step_row *s = steps_at(&r->tasks[i], ep[e]);
            if (s && isfinite(s->median))
                by_compute &= isfinite(s->compute);
        }
        for (int i = 0; i < r->n_tasks; i++) {
            const step_row *s = steps_at(&r->tasks[i], ep[e]);
            double x = s ? (by_compute ? s->compute : s->median) : NAN;
            if (isfinite(x))
                v[n++] = x;
        }
        if (n < 2)
            continue;
        qsort(v, (size_t)n, sizeof *v, cmp_double);
        double med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
        for (int i = 0; i < r->n_tasks; i++) {
            const step_row *s = steps_at(&r->tasks[i], ep[e]);
            double x = s ? (by_compute ? s->compute : s->median) : NAN;
            if (!(x > STRAGGLER_FACTOR * med))
                continue;
            /* The others' wait: a step of theirs less its compute, the
             * median over them, times their steps in the epoch. */
            double waited = NAN;
            if (by_compute) {
                int m = 0;
                double w[MAX_TASKS], steps = 0;
                for (int j = 0; j < r->n_tasks; j++) {
                    const step_row *o = steps_at(&r->tasks[j], ep[e]);
                    if (j == i || !o || !isfinite(o->median) || !isfinite(o->compute))
                        continue;
                    w[m++] = fmax(0, o->median - o->compute);
                    if (isfinite(o->steps))
                        steps = fmax(steps, o->steps);
                }
                if (m > 0 && steps > 0) {
                    qsort(w, (size_t)m, sizeof *w, cmp_double);
                    waited = (m % 2 ? w[m / 2] : (w[m / 2 - 1] + w[m / 2]) / 2) * steps / 1e3;
                }
            }
            if (!grow((void **)&r->strag, r->n_strag, sizeof *r->strag, MAX_STRAGGLERS))
                break;
            r->strag[r->n_strag++] = (straggler){i, ep[e], run_x(r, &r->tasks[i], s->t, s->wall),
                                                 x, med, by_compute, waited};
        }
    }
    free(ep);
    free(v);
    return 0;
}

/* ---- the public API: building ---- */

int dp_report_open(dp_report **out, const char *title, dp_err *err)
{
    *out = NULL;
    dp_report *r = calloc(1, sizeof *r);
    if (!r || !(r->title = dup_str(title ? title : "downpour report"))) {
        free(r);
        return dp_errf(err, "report: out of memory");
    }
    *out = r;
    return 0;
}

static void item_free(item *it)
{
    free(it->text);
    if (it->cells)
        for (int i = 0; i < (it->rows + 1) * it->cols; i++)
            free(it->cells[i]);
    free(it->cells);
    free(it->x_label);
    free(it->y_label);
    for (int i = 0; i < it->n_series; i++) {
        free((char *)it->series[i].name);
        free((double *)it->series[i].x);
        free((double *)it->series[i].y);
    }
    free(it->series);
}

void dp_report_free(dp_report *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->n_items; i++)
        item_free(&r->items[i]);
    free(r->items);
    for (int i = 0; i < r->n_runs; i++)
        run_free(&r->runs[i]);
    free(r->runs);
    free(r->title);
    free(r);
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s && s[1] ? s + 1 : path;
}

/* "ps-async b128 mnist" from the done event, else the file's name; a label
 * already taken gets " (2)", " (3)", ... so legends stay unambiguous. */
static char *derive_label(const dp_report *rep, const run *r)
{
    char s[256];
    const char *strat = r->done ? str_of(r->done, "strategy") : NULL;
    const char *ds = r->done ? str_of(r->done, "dataset") : NULL;
    double batch = r->done ? num_of(r->done, "batch") : NAN;
    if (strat && isfinite(batch))
        snprintf(s, sizeof s, "%s b%.0f%s%s", strat, batch, ds ? " " : "", ds ? ds : "");
    else if (strat)
        snprintf(s, sizeof s, "%s%s%s", strat, ds ? " " : "", ds ? ds : "");
    else
        snprintf(s, sizeof s, "%s", base_name(r->path));
    size_t len = strlen(s);
    for (int k = 2;; k++) {
        bool taken = false;
        for (int i = 0; i < rep->n_runs; i++)
            taken |= strcmp(rep->runs[i].label, s) == 0;
        if (!taken || k > MAX_RUNS + 1)
            break;
        snprintf(s + len, sizeof s - len, " (%d)", k);
    }
    return strdup(s);
}

int dp_report_add_run(dp_report *rep, const char *path, const char *label, dp_err *err)
{
    if (!rep || !path)
        return dp_errf(err, "report: no report or no path");
    if (rep->n_runs >= MAX_RUNS)
        return dp_errf(err, "%s: a report holds at most %d runs", path, MAX_RUNS);
    run r;
    memset(&r, 0, sizeof r);
    if (!(r.path = strdup(path)))
        return dp_errf(err, "%s: out of memory", path);
    if (read_run(&r, path, err) < 0) {
        run_free(&r);
        return -1;
    }
    settle_time(&r);
    if (find_stragglers(&r) < 0 || !(r.label = label ? strdup(label) : derive_label(rep, &r)) ||
        !grow((void **)&rep->runs, rep->n_runs, sizeof *rep->runs, MAX_RUNS)) {
        run_free(&r);
        return dp_errf(err, "%s: out of memory", path);
    }
    rep->runs[rep->n_runs++] = r;
    return 0;
}

static item *new_item(dp_report *r, item_kind kind)
{
    if (r->n_items == r->cap_items) {
        int cap = r->cap_items ? 2 * r->cap_items : 8;
        item *p = realloc(r->items, (size_t)cap * sizeof *p);
        if (!p)
            return NULL;
        r->items = p;
        r->cap_items = cap;
    }
    item *it = &r->items[r->n_items];
    memset(it, 0, sizeof *it);
    it->kind = kind;
    return it;
}

static int add_text(dp_report *r, item_kind kind, const char *text)
{
    item *it = r ? new_item(r, kind) : NULL;
    if (!it || !(it->text = dup_str(text)))
        return -1;
    r->n_items++;
    return 0;
}

int dp_report_add_heading(dp_report *r, const char *text)
{
    return add_text(r, ITEM_HEADING, text);
}

int dp_report_add_paragraph(dp_report *r, const char *text)
{
    return add_text(r, ITEM_PARAGRAPH, text);
}

int dp_report_add_table(dp_report *r, const char *caption, int cols, const char *const *header,
                        int rows, const char *const *cells)
{
    if (!r || cols < 1 || rows < 0 || cols > 1000 || rows > 1000000 / cols)
        return -1;
    item *it = new_item(r, ITEM_TABLE);
    if (!it)
        return -1;
    it->cols = cols;
    it->rows = rows;
    it->text = caption ? strdup(caption) : NULL;
    int n = (rows + 1) * cols;
    it->cells = calloc((size_t)n, sizeof *it->cells);
    bool ok = it->cells && (!caption || it->text);
    for (int i = 0; ok && i < n; i++) {
        const char *c = i < cols ? (header ? header[i] : "") : (cells ? cells[i - cols] : "");
        ok = (it->cells[i] = dup_str(c)) != NULL;
    }
    if (!ok) {
        item_free(it);
        return -1;
    }
    r->n_items++;
    return 0;
}

int dp_report_add_line_chart(dp_report *r, const dp_chart *c, const dp_chart_series *s, int n)
{
    if (!r || !c || n < 0 || (n > 0 && !s))
        return -1;
    item *it = new_item(r, ITEM_CHART);
    if (!it)
        return -1;
    it->text = dup_str(c->title);
    it->x_label = dup_str(c->x_label);
    it->y_label = dup_str(c->y_label);
    it->y_from_zero = c->y_from_zero;
    it->series = calloc((size_t)(n ? n : 1), sizeof *it->series);
    bool ok = it->text && it->x_label && it->y_label && it->series;
    for (int i = 0; ok && i < n; i++) {
        int m = s[i].n > 0 ? s[i].n : 0;
        double *x = malloc((size_t)(m ? m : 1) * sizeof *x), *y = malloc((size_t)(m ? m : 1) * sizeof *y);
        it->series[i] = (svg_series){dup_str(s[i].name), x, y, m};
        it->n_series = i + 1;
        ok = x && y && it->series[i].name;
        if (ok && m) {
            memcpy(x, s[i].x, (size_t)m * sizeof *x);
            memcpy(y, s[i].y, (size_t)m * sizeof *y);
        }
    }
    if (!ok) {
        item_free(it);
        return -1;
    }
    r->n_items++;
    return 0;
}

/* ---- the page ---- */

static const char CSS[] =
    "body{font-family:'DejaVu Sans',Helvetica,Arial,sans-serif;margin:24px auto;max-width:"
    "1120px;color:#222;background:#fff;padding:0 16px}"
    "h1{font-size:26px;margin-bottom:4px}h2{font-size:21px;margin-top:32px;border-bottom:1px "
    "solid #ccc;padding-bottom:4px}h3{font-size:17px;margin-top:24px}"
    ".gen{color:#666;font-size:13px}p.note{color:#555;font-size:14px}"
    "table{border-collapse:collapse;margin:12px 0;font-size:14px}table.final{font-size:13px}"
    "caption{text-align:left;font-weight:bold;padding:4px 0}"
    "th,td{border:1px solid #ccc;padding:4px 8px}th{background:#f2f2f2;text-align:left}"
    "td.n{text-align:right;font-variant-numeric:tabular-nums}"
    "figure.chart{margin:12px 0}"
    "svg text{font-family:'DejaVu Sans',Helvetica,Arial,sans-serif}"
    "svg .ct{font-size:15px;font-weight:bold}svg .at{font-size:13px;fill:#333}"
    "svg .tick{font-size:11px;fill:#444}svg .lg{font-size:12px;fill:#222}"
    "svg .grid{stroke:#e6e6e6}svg .ax{stroke:#555}svg .nodata{font-size:14px;fill:#888}"
    "details{margin:16px 0;border:1px solid #ddd;padding:8px 16px;border-radius:4px}"
    "summary{font-size:18px;font-weight:bold;cursor:pointer}";

static void esc_elem(sbuf *b, const char *tag, const char *text)
{
    sb_printf(b, "<%s>", tag);
    sb_esc(b, text);
    sb_printf(b, "</%s>\n", tag);
}

static bool is_number(const char *s)
{
    char *end;
    if (!s || !*s)
        return false;
    strtod(s, &end);
    while (*end == ' ' || *end == '%')
        end++;
    return *end == '\0';
}

static void caller_table(sbuf *b, const item *it)
{
    sb_puts(b, "<table>");
    if (it->text) {
        sb_puts(b, "<caption>");
        sb_esc(b, it->text);
        sb_puts(b, "</caption>");
    }
    sb_puts(b, "<tr>");
    for (int c = 0; c < it->cols; c++) {
        sb_puts(b, "<th>");
        sb_esc(b, it->cells[c]);
        sb_puts(b, "</th>");
    }
    sb_puts(b, "</tr>\n");
    for (int row = 1; row <= it->rows; row++) {
        sb_puts(b, "<tr>");
        for (int c = 0; c < it->cols; c++) {
            const char *s = it->cells[row * it->cols + c];
            sb_puts(b, is_number(s) ? "<td class=\"n\">" : "<td>");
            sb_esc(b, s);
            sb_puts(b, "</td>");
        }
        sb_puts(b, "</tr>\n");
    }
    sb_puts(b, "</table>\n");
}

/* Overlay of one per-epoch figure across runs; skipped when no run has it. */
typedef enum epoch_field { EP_VAL_ACC, EP_VAL_LOSS, EP_LR, EP_VAL_AUC, EP_FIELD_COUNT } epoch_field;

static double epoch_value(const epoch_row *e, epoch_field f)
{
    return f == EP_VAL_ACC    ? e->val_acc
           : f == EP_VAL_LOSS ? e->val_loss
           : f == EP_VAL_AUC  ? e->val_auc
                              : e->lr;
}

/* A run's epochs sorted by number, the last line of an epoch kept (a
 * resumed run writes an epoch again). */
static int sorted_epochs(const run *r, epoch_row **out)
{
    epoch_row *e = malloc((size_t)(r->n_ep ? r->n_ep : 1) * sizeof *e);
    *out = e;
    if (!e)
        return -1;
    int n = 0;
    for (int k = r->n_ep - 1; k >= 0; k--) { /* the last of each epoch number */
        bool seen = false;
        for (int j = 0; j < n && !seen; j++)
            seen = e[j].epoch == r->ep[k].epoch;
        if (!seen && isfinite(r->ep[k].epoch))
            e[n++] = r->ep[k];
    }
    for (int i = 1; i < n; i++) /* insertion sort: few epochs */
        for (int j = i; j > 0 && e[j - 1].epoch > e[j].epoch; j--) {
            epoch_row t = e[j];
            e[j] = e[j - 1];
            e[j - 1] = t;
        }
    return n;
}

static int overlay_epochs(sbuf *b, const dp_report *rep, epoch_field f, const svg_chart *c)
{
    int n = rep->n_runs;
    svg_series *s = calloc((size_t)n, sizeof *s);
    double *xy = NULL;
    int total = 0;
    for (int i = 0; i < n; i++)
        total += rep->runs[i].n_ep;
    xy = malloc((size_t)(2 * total + 1) * sizeof *xy);
    epoch_row *e = NULL;
    if (!s || !xy)
        goto oom;
    bool any = false;
    int used = 0;
    for (int i = 0; i < n; i++) {
        int m = sorted_epochs(&rep->runs[i], &e);
        if (m < 0)
            goto oom;
        double *x = xy + used, *y = xy + used + m;
        for (int k = 0; k < m; k++) {
            x[k] = e[k].epoch;
            y[k] = epoch_value(&e[k], f);
            any |= isfinite(y[k]);
        }
        used += 2 * m;
        s[i] = (svg_series){rep->runs[i].label, x, y, m};
        free(e);
        e = NULL;
    }
    if (any)
        svg_line_chart(b, c, s, n, NULL, 0);
    free(s);
    free(xy);
    return 0;
oom:
    free(s);
    free(xy);
    free(e);
    return -1;
}

/* Training against validation loss: two series a run, "LABEL train" and
 * "LABEL validation", so over-fitting (the two drifting apart) shows. */
static int overlay_losses(sbuf *b, const dp_report *rep)
{
    int n = rep->n_runs, total = 0;
    for (int i = 0; i < n; i++)
        total += rep->runs[i].n_ep;
    svg_series *s = calloc((size_t)(2 * n + 1), sizeof *s);
    double *xy = malloc((size_t)(3 * total + 1) * sizeof *xy);
    char(*names)[300] = calloc((size_t)(2 * n + 1), sizeof *names);
    epoch_row *e = NULL;
    int rc = 0, used = 0;
    bool any_train = false;
    if (!s || !xy || !names) {
        rc = -1;
        goto out;
    }
    for (int i = 0; i < n; i++) {
        int m = sorted_epochs(&rep->runs[i], &e);
        if (m < 0) {
            rc = -1;
            goto out;
        }
        double *x = xy + used, *tr = x + m, *va = tr + m;
        used += 3 * m;
        for (int k = 0; k < m; k++) {
            x[k] = e[k].epoch;
            tr[k] = e[k].train_loss;
            va[k] = e[k].val_loss;
            any_train |= isfinite(tr[k]);
        }
        snprintf(names[2 * i], sizeof names[0], "%s train", rep->runs[i].label);
        snprintf(names[2 * i + 1], sizeof names[0], "%s validation", rep->runs[i].label);
        s[2 * i] = (svg_series){names[2 * i], x, tr, m};
        s[2 * i + 1] = (svg_series){names[2 * i + 1], x, va, m};
        free(e);
        e = NULL;
    }
    if (any_train) {
        svg_chart c = {"Training against validation loss per epoch", "epoch",
                       "loss (cross-entropy)", false, true, "loss", false, 0, 0};
        svg_line_chart(b, &c, s, 2 * n, NULL, 0);
    }
out:
    free(s);
    free(xy);
    free(names);
    free(e);
    return rc;
}

/* Cluster samples/s per epoch: the sum of its tasks' "steps" samples_per_second. */
static int overlay_throughput(sbuf *b, const dp_report *rep)
{
    int n = rep->n_runs;
    svg_series *s = calloc((size_t)n, sizeof *s);
    double **bufs = calloc((size_t)n, sizeof *bufs);
    bool any = false;
    int rc = 0;
    if (!s || !bufs)
        rc = -1;
    for (int i = 0; rc == 0 && i < n; i++) {
        const run *r = &rep->runs[i];
        double *ep;
        int m = step_epochs(r, &ep);
        double *y = m >= 0 ? malloc((size_t)(m ? m : 1) * sizeof *y) : NULL;
        if (!y) {
            free(ep);
            rc = -1;
            break;
        }
        for (int k = 0; k < m; k++) {
            double sum = 0;
            int got = 0;
            for (int t = 0; t < r->n_tasks; t++) {
                const step_row *row = steps_at(&r->tasks[t], ep[k]);
                if (row && isfinite(row->sps)) {
                    sum += row->sps;
                    got++;
                }
            }
            y[k] = got ? sum : NAN;
            any |= got > 0;
        }
        bufs[i] = ep; /* x; y follows in its own block */
        s[i] = (svg_series){r->label, ep, y, m};
    }
    if (rc == 0 && any) {
        svg_chart c = {"Training throughput per epoch (all tasks together)", "epoch",
                       "samples/s", true, true, "throughput", false, 0, 0};
        svg_line_chart(b, &c, s, n, NULL, 0);
    }
    for (int i = 0; s && bufs && i < n; i++) {
        free(bufs[i]);
        free((double *)s[i].y);
    }
    free(s);
    free(bufs);
    return rc;
}

/* A table cell: the value shown, and for programs data-k (the metrics field)
 * and data-v (the exact number). */
static void num_cell(sbuf *b, const char *key, double v, const char *fmt, double scale)
{
    if (!isfinite(v)) {
        sb_printf(b, "<td class=\"n\" data-k=\"%s\">&ndash;</td>", key);
        return;
    }
    sb_printf(b, "<td class=\"n\" data-k=\"%s\" data-v=\"", key);
    sb_num(b, v);
    sb_puts(b, "\">");
    sb_printf(b, fmt, v * scale);
    sb_puts(b, "</td>");
}

static void str_cell(sbuf *b, const char *key, const char *s)
{
    sb_printf(b, "<td data-k=\"%s\">", key);
    sb_esc(b, s ? s : "");
    sb_puts(b, "</td>");
}

/* Whole-run resource figures: the launcher's resource_total, else computed
 * over the tasks the same way (metrics.h). */
/* *mem_key says which memory figure *mem_peak is: "pss_peak_bytes" (the
 * sum of each task's peak proportional set size, which counts the dataset
 * cache that tasks of a host share once) when every task's samples carry
 * PSS, else "rss_peak_bytes" (which counts a shared mapping once per task). */
static void run_resources(const run *r, double *cpu_mean, double *mem_peak, const char **mem_key,
                          double *net_tx)
{
    *cpu_mean = *mem_peak = *net_tx = NAN;
    *mem_key = "rss_peak_bytes";
    if (r->total) {
        *cpu_mean = num_of(r->total, "cpu_percent_mean");
        *mem_peak = num_of(r->total, "pss_peak_bytes");
        if (isfinite(*mem_peak))
            *mem_key = "pss_peak_bytes";
        else
            *mem_peak = num_of(r->total, "rss_peak_bytes");
        *net_tx = num_of(r->total, "net_tx_bytes");
        return;
    }
    double cpu = 0, rss = 0, pss = 0, tx = 0;
    int n_cpu = 0, n_rss = 0, n_tx = 0;
    bool all_pss = true;
    for (int i = 0; i < r->n_tasks; i++) {
        const task_data *td = &r->tasks[i];
        if (td->cpu_n) {
            cpu += td->cpu_sum / (double)td->cpu_n;
            n_cpu++;
        }
        if (isfinite(td->rss_peak)) {
            rss += td->rss_peak;
            n_rss++;
            all_pss &= td->pss_n > 0;
            pss += td->pss_n > 0 ? td->pss_peak : 0;
        }
        if (isfinite(td->tx_last)) {
            tx += td->tx_last;
            n_tx++;
        }
    }
    if (n_cpu)
        *cpu_mean = cpu / n_cpu;
    if (n_rss) {
        *mem_peak = all_pss ? pss : rss;
        *mem_key = all_pss ? "pss_peak_bytes" : "rss_peak_bytes";
    }
    if (n_tx)
        *net_tx = tx;
}

static void final_table(sbuf *b, const dp_report *rep)
{
    bool binary = false; /* a run of a bce model: its test AUC and log loss too */
    for (int i = 0; i < rep->n_runs; i++)
        binary |= rep->runs[i].done && isfinite(num_of(rep->runs[i].done, "test_auc"));
    sb_puts(b, "<table class=\"final\"><caption>Final figures of each run (from its "
               "<code>done</code> and <code>resource_total</code> events)</caption><tr><th>run</th>"
               "<th>strategy</th><th>model</th><th>dataset</th><th>batch</th><th>workers</th>"
               "<th>ps</th><th>epochs</th><th>optimiser</th><th>lr</th><th>schedule</th>"
               "<th>seed</th><th>test accuracy</th>");
    if (binary)
        sb_puts(b, "<th>test AUC</th><th>test log loss</th>");
    sb_puts(b, "<th>train time (s)</th>"
               "<th>throughput (samples/s)</th><th>CPU (% of a core, task mean)</th>"
               "<th>peak memory (MiB, sum of tasks; PSS<sup>*</sup>)</th>"
               "<th>network sent (MB, all tasks)</th></tr>\n");
    for (int i = 0; i < rep->n_runs; i++) {
        const run *r = &rep->runs[i];
        const cJSON *d = r->done;
        double cpu, rss, tx;
        const char *mem_key;
        run_resources(r, &cpu, &rss, &mem_key, &tx);
        sb_puts(b, "<tr data-run=\"");
        sb_esc(b, r->label);
        sb_puts(b, "\">");
        str_cell(b, "label", r->label);
        str_cell(b, "strategy", d ? str_of(d, "strategy") : NULL);
        str_cell(b, "model", d ? str_of(d, "model") : NULL);
        str_cell(b, "dataset", d ? str_of(d, "dataset") : NULL);
        num_cell(b, "batch", d ? num_of(d, "batch") : NAN, "%.0f", 1);
        num_cell(b, "workers", d ? num_of(d, "workers") : NAN, "%.0f", 1);
        num_cell(b, "ps", d ? num_of(d, "ps") : NAN, "%.0f", 1);
        num_cell(b, "epochs", d ? num_of(d, "epochs") : NAN, "%.0f", 1);
        str_cell(b, "optimizer", d ? str_of(d, "optimizer") : NULL);
        num_cell(b, "lr", d ? num_of(d, "lr") : NAN, "%.3g", 1);
        str_cell(b, "lr_schedule", d ? str_of(d, "lr_schedule") : NULL);
        num_cell(b, "seed", d ? num_of(d, "seed") : NAN, "%.0f", 1);
        num_cell(b, "test_accuracy", d ? num_of(d, "test_accuracy") : NAN, "%.4f", 1);
        if (binary) {
            num_cell(b, "test_auc", d ? num_of(d, "test_auc") : NAN, "%.4f", 1);
            num_cell(b, "test_log_loss", d ? num_of(d, "test_log_loss") : NAN, "%.4f", 1);
        }
        num_cell(b, "train_seconds", d ? num_of(d, "train_seconds") : NAN, "%.2f", 1);
        num_cell(b, "samples_per_second", d ? num_of(d, "samples_per_second") : NAN, "%.0f", 1);
        num_cell(b, "cpu_percent_mean", cpu, "%.1f", 1);
        num_cell(b, mem_key, rss, strcmp(mem_key, "pss_peak_bytes") ? "%.1f (RSS)" : "%.1f",
                 1.0 / (1024 * 1024));
        num_cell(b, "net_tx_bytes", tx, "%.1f", 1e-6);
        sb_puts(b, "</tr>\n");
    }
    sb_puts(b, "</table>\n<p class=\"note\"><sup>*</sup> Peak memory is the sum over tasks of "
               "each task's peak proportional set size (PSS, /proc/PID/smaps_rollup), which "
               "counts a mapping that tasks share (the dataset cache) once; a figure marked "
               "(RSS) comes from a file without PSS and counts such a mapping once per "
               "task.</p>\n");
}

typedef enum res_field { RES_CPU, RES_RSS, RES_NET, RES_FIELD_COUNT } res_field;

/* One per-task chart over time; tasks without samples are left out. */
static int resource_chart(sbuf *b, const run *r, res_field f, const svg_marker *mk, int n_mk,
                          const svg_chart *c)
{
    svg_series *s = calloc((size_t)(r->n_tasks ? r->n_tasks : 1), sizeof *s);
    int total = 0, n = 0, rc = 0;
    for (int i = 0; i < r->n_tasks; i++)
        total += r->tasks[i].n;
    double *xy = malloc((size_t)(2 * total + 1) * sizeof *xy);
    if (!s || !xy) {
        rc = -1;
        goto out;
    }
    double *p = xy;
    for (int i = 0; i < r->n_tasks; i++) {
        const task_data *td = &r->tasks[i];
        if (td->n == 0)
            continue;
        double *x = p, *y = p + td->n;
        p += 2 * td->n;
        for (int k = 0; k < td->n; k++) {
            const sample *sm = &td->s[k];
            x[k] = run_x(r, td, sm->t, sm->wall);
            if (f == RES_CPU) {
                y[k] = sm->cpu;
            } else if (f == RES_RSS) {
                y[k] = sm->rss / (1024.0 * 1024.0);
            } else { /* the rate between this sample and the one before */
                double dt = k ? x[k] - x[k - 1] : NAN, dn = k ? sm->net - td->s[k - 1].net : NAN;
                y[k] = dt > 0 && dn >= 0 ? dn / dt / 1e6 : NAN;
            }
        }
        s[n++] = (svg_series){td->name, x, y, td->n};
    }
    if (n > 0)
        svg_line_chart(b, c, s, n, mk, n_mk);
out:
    free(s);
    free(xy);
    return rc;
}

/* Per-task step-time boxes and samples/s per epoch, for tasks with "steps". */
static int steps_charts(sbuf *b, const run *r)
{
    double *ep;
    int m = step_epochs(r, &ep);
    if (m <= 0) {
        free(ep);
        return m < 0 ? -1 : 0;
    }
    int nt = r->n_tasks;
    svg_box_series *bx = calloc((size_t)nt, sizeof *bx);
    svg_series *ls = calloc((size_t)nt, sizeof *ls);
    double *v = malloc((size_t)nt * (size_t)m * 4 * sizeof *v);
    int rc = 0, n = 0;
    if (!bx || !ls || !v) {
        rc = -1;
        goto out;
    }
    for (int i = 0; i < nt; i++) {
        const task_data *td = &r->tasks[i];
        if (td->n_steps == 0)
            continue;
        double *md = v + (size_t)n * m * 4, *p9 = md + m, *mx = p9 + m, *sp = mx + m;
        for (int k = 0; k < m; k++) {
            const step_row *s = steps_at(td, ep[k]);
            md[k] = s ? s->median : NAN;
            p9[k] = s ? s->p90 : NAN;
            mx[k] = s ? s->max : NAN;
            sp[k] = s ? s->sps : NAN;
        }
        bx[n] = (svg_box_series){td->name, md, p9, mx};
        ls[n] = (svg_series){td->name, ep, sp, m};
        n++;
    }
    svg_chart cb = {"Step time per task and epoch", "epoch", "step time (ms)", true, true,
                    "step_ms", false, 0, 0};
    svg_box_chart(b, &cb, ep, m, bx, n);
    svg_chart cl = {"Throughput per task", "epoch", "samples/s", true, true, "task_throughput", false, 0, 0};
    svg_line_chart(b, &cl, ls, n, NULL, 0);
out:
    free(ep);
    free(bx);
    free(ls);
    free(v);
    return rc;
}

static int run_section(sbuf *b, const run *r, int index)
{
    sb_printf(b, "<details open data-run-index=\"%d\"><summary>", index);
    sb_esc(b, r->label);
    sb_puts(b, "</summary>\n<p class=\"note\">From <code>");
    sb_esc(b, r->path);
    sb_printf(b, "</code>. Time axes: seconds since the run's first %s.</p>\n",
              r->has_wall ? "line (wall clock, tasks aligned)"
                          : "line (each task's own clock: the file has no wall times)");
    int n_mk = r->n_faults + r->n_strag;
    svg_marker *mk = calloc((size_t)(n_mk ? n_mk : 1), sizeof *mk);
    char(*txt)[200] = calloc((size_t)(n_mk ? n_mk : 1), sizeof *txt);
    int rc = 0;
    if (!mk || !txt) {
        rc = -1;
        goto out;
    }
    for (int k = 0; k < r->n_faults; k++) {
        const fault_row *f = &r->faults[k];
        mk[k].x = run_x(r, NULL, f->t, f->wall);
        mk[k].kind = SVG_MARK_FAULT;
        snprintf(txt[k], sizeof txt[k], "fault: %s %s at %.1f s", f->task, f->what, mk[k].x);
        mk[k].text = txt[k];
    }
    for (int k = 0; k < r->n_strag; k++) {
        const straggler *s = &r->strag[k];
        svg_marker *m = &mk[r->n_faults + k];
        m->x = s->x;
        m->kind = SVG_MARK_STRAGGLER;
        snprintf(txt[r->n_faults + k], sizeof txt[0],
                 "straggler: %s in epoch %.0f, median %s %.3g ms against %.3g ms for the tasks",
                 r->tasks[s->task].name, s->epoch, s->by_compute ? "compute" : "step", s->ms,
                 s->median);
        m->text = txt[r->n_faults + k];
    }
    /* The three time charts share one x range: samples and markers. */
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < r->n_tasks; i++)
        for (int k = 0; k < r->tasks[i].n; k++) {
            double x = run_x(r, &r->tasks[i], r->tasks[i].s[k].t, r->tasks[i].s[k].wall);
            if (isfinite(x)) {
                lo = fmin(lo, x);
                hi = fmax(hi, x);
            }
        }
    for (int k = 0; k < n_mk; k++)
        if (isfinite(mk[k].x)) {
            lo = fmin(lo, mk[k].x);
            hi = fmax(hi, mk[k].x);
        }
    bool fixed = isfinite(lo) && hi > lo;
    svg_chart cc = {"CPU per task", "time (s)", "CPU (% of one core)", true, false, "cpu", fixed,
                    lo, hi};
    svg_chart cm = {"Memory per task (resident set)", "time (s)", "RSS (MiB)", true, false, "rss",
                    fixed, lo, hi};
    svg_chart cn = {"Network per task (sent + received)", "time (s)", "network (MB/s)", true,
                    false, "net", fixed, lo, hi};
    if (resource_chart(b, r, RES_CPU, mk, n_mk, &cc) < 0 ||
        resource_chart(b, r, RES_RSS, mk, n_mk, &cm) < 0 ||
        resource_chart(b, r, RES_NET, mk, n_mk, &cn) < 0 || steps_charts(b, r) < 0) {
        rc = -1;
        goto out;
    }
    bool any_res = false, any_steps = false;
    for (int i = 0; i < r->n_tasks; i++) {
        any_res |= r->tasks[i].n > 0;
        any_steps |= r->tasks[i].n_steps > 0;
    }
    if (!any_res)
        sb_puts(b, "<p class=\"note\">No resource samples: the run was not launched as a "
                   "cluster (docs/metrics.md).</p>\n");

    sb_printf(b, "<h3>Stragglers</h3>\n");
    if (r->n_strag == 0) {
        sb_printf(b, "<p class=\"note\">None: no task's median compute time a step in an epoch "
                     "exceeded %.1f times the median over the tasks%s.</p>\n",
                  STRAGGLER_FACTOR, any_steps ? "" : " (the file has no steps events)");
    } else {
        /* Name the task the others waited for, and for how long. */
        for (int k = 0; k < r->n_strag; k++) {
            const straggler *s = &r->strag[k];
            if (!s->by_compute || !isfinite(s->waited_s))
                continue;
            sb_puts(b, "<p class=\"straggler\">");
            sb_esc(b, r->tasks[s->task].name);
            sb_printf(b, " was the task the others waited for in epoch %.0f: it computed %.3g ms "
                         "a step against %.3g ms for the tasks (median), and the others waited "
                         "about %.2f s for it.</p>\n",
                      s->epoch, s->ms, s->median, s->waited_s);
        }
        sb_puts(b, "<table class=\"stragglers\"><tr><th>task</th><th>epoch</th><th>time (s)</th>"
                   "<th>its median (ms)</th><th>median over tasks (ms)</th><th>of</th>"
                   "<th>others waited (s)</th></tr>\n");
        for (int k = 0; k < r->n_strag; k++) {
            const straggler *s = &r->strag[k];
            sb_puts(b, "<tr>");
            str_cell(b, "task", r->tasks[s->task].name);
            num_cell(b, "epoch", s->epoch, "%.0f", 1);
            num_cell(b, "time", s->x, "%.1f", 1);
            num_cell(b, s->by_compute ? "compute_ms_median" : "step_ms_median", s->ms, "%.3f", 1);
            num_cell(b, "tasks_median", s->median, "%.3f", 1);
            str_cell(b, "of", s->by_compute ? "compute a step" : "step time");
            num_cell(b, "waited_seconds", s->waited_s, "%.2f", 1);
            sb_puts(b, "</tr>\n");
        }
        sb_puts(b, "</table>\n");
    }
    sb_puts(b, "<h3>Faults</h3>\n");
    if (r->n_faults == 0) {
        sb_puts(b, "<p class=\"note\">None recorded.</p>\n");
    } else {
        sb_puts(b, "<table class=\"faults\"><tr><th>time (s)</th><th>task</th><th>what</th>"
                   "</tr>\n");
        for (int k = 0; k < r->n_faults; k++) {
            sb_puts(b, "<tr>");
            num_cell(b, "time", mk[k].x, "%.1f", 1);
            str_cell(b, "task", r->faults[k].task);
            str_cell(b, "what", r->faults[k].what);
            sb_puts(b, "</tr>\n");
        }
        sb_puts(b, "</table>\n");
    }
    sb_puts(b, "</details>\n");
out:
    free(mk);
    free(txt);
    return rc;
}

static int runs_section(sbuf *b, const dp_report *rep)
{
    sb_puts(b, "<h2>Runs</h2>\n");
    svg_chart acc = {"Validation accuracy per epoch", "epoch", "validation accuracy (fraction)",
                     false, true, "val_accuracy", false, 0, 0};
    svg_chart loss = {"Validation loss per epoch", "epoch", "validation loss (cross-entropy)",
                      false, true, "val_loss", false, 0, 0};
    svg_chart lr = {"Learning rate at the end of each epoch", "epoch", "learning rate", true, true,
                    "lr", false, 0, 0};
    /* click-through models (a bce loss): drawn only when a run has val_auc */
    svg_chart auc = {"Validation AUC per epoch", "epoch", "validation AUC", false, true, "val_auc",
                     false, 0, 0};
    if (overlay_epochs(b, rep, EP_VAL_ACC, &acc) < 0 || overlay_epochs(b, rep, EP_VAL_LOSS, &loss) < 0 ||
        overlay_epochs(b, rep, EP_VAL_AUC, &auc) < 0 ||
        overlay_losses(b, rep) < 0 ||
        overlay_throughput(b, rep) < 0 || overlay_epochs(b, rep, EP_LR, &lr) < 0)
        return -1;
    final_table(b, rep);
    for (int i = 0; i < rep->n_runs; i++)
        if (run_section(b, &rep->runs[i], i) < 0)
            return -1;
    return 0;
}

int dp_report_write(dp_report *rep, const char *path, dp_err *err)
{
    if (!rep || !path)
        return dp_errf(err, "report: no report or no path");
    sbuf b = {0};
    char when[64];
    time_t now = time(NULL);
    struct tm tm;
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", gmtime_r(&now, &tm));
    sb_puts(&b, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>");
    sb_esc(&b, rep->title);
    sb_printf(&b, "</title><style>%s</style></head><body>\n<h1>", CSS);
    sb_esc(&b, rep->title);
    sb_printf(&b, "</h1><p class=\"gen\">Generated by downpour on %s.</p>\n", when);
    int rc = 0;
    for (int i = 0; i < rep->n_items; i++) {
        const item *it = &rep->items[i];
        if (it->kind == ITEM_HEADING) {
            esc_elem(&b, "h2", it->text);
        } else if (it->kind == ITEM_PARAGRAPH) {
            esc_elem(&b, "p", it->text);
        } else if (it->kind == ITEM_TABLE) {
            caller_table(&b, it);
        } else {
            svg_chart c = {it->text, it->x_label, it->y_label, it->y_from_zero, false, NULL, false, 0, 0};
            svg_line_chart(&b, &c, it->series, it->n_series, NULL, 0);
        }
    }
    if (rep->n_runs > 0)
        rc = runs_section(&b, rep);
    sb_puts(&b, "</body></html>\n");
    if (rc < 0 || b.oom) {
        sb_free(&b);
        return dp_errf(err, "%s: out of memory building the report", path);
    }
    rc = dp_file_replace(path, b.p, b.len, err);
    sb_free(&b);
    return rc;
}
