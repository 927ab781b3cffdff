/* Timelines in the Chrome trace event format (trace.h, docs/trace.md).
 *
 * One ring per recording thread, allocated at the thread's first span and
 * linked into a list under a mutex (once per thread); a span is then a
 * store into the thread's own ring, with no lock and no allocation.  The
 * rings are freed at close, including those of threads that have exited. */
#include "downpour/trace.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/clock.h"
#include "downpour/file.h"
#include "downpour/log.h"

typedef struct span {
    const char *name, *cat;
    int64_t ts, dur; /* microseconds: wall clock, length */
    int arg;
} span;

typedef struct ring {
    struct ring *next;
    int tid;
    long n; /* spans recorded; the newest DP_TRACE_RING are kept */
    span s[DP_TRACE_RING];
} ring;

static atomic_bool on;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static ring *rings;  /* every thread's, under mu */
static int next_tid; /* under mu */
static double wall_minus_mono; /* seconds: the wall clock at open less dp_now() */
static char *out_path, *proc_name;
static int out_pid;

static atomic_int generation; /* bumped at close: rings of an earlier trace are gone */
static _Thread_local ring *mine;
static _Thread_local int mine_gen;
static _Thread_local double compute_s;

bool dp_trace_enabled(void)
{
    return atomic_load_explicit(&on, memory_order_relaxed);
}

int dp_trace_open(const char *path, int pid, const char *process_name, dp_err *err)
{
    pthread_mutex_lock(&mu);
    if (out_path) {
        pthread_mutex_unlock(&mu);
        return dp_errf(err, "--trace %s: a trace is already open in this process", path);
    }
    out_path = strdup(path);
    proc_name = strdup(process_name ? process_name : "downpour");
    if (!out_path || !proc_name) {
        free(out_path);
        free(proc_name);
        out_path = proc_name = NULL;
        pthread_mutex_unlock(&mu);
        return dp_errf(err, "--trace %s: out of memory", path);
    }
    out_pid = pid;
    wall_minus_mono = dp_wall_now() - dp_now();
    pthread_mutex_unlock(&mu);
    atomic_store(&on, true);
    return 0;
}

/* The calling thread's ring, allocated once; NULL out of memory. */
static ring *my_ring(void)
{
    int g = atomic_load_explicit(&generation, memory_order_relaxed);
    if (mine && mine_gen == g)
        return mine;
    ring *r = malloc(sizeof *r);
    if (!r)
        return NULL;
    r->n = 0;
    pthread_mutex_lock(&mu);
    r->tid = ++next_tid;
    r->next = rings;
    rings = r;
    pthread_mutex_unlock(&mu);
    mine_gen = g;
    return mine = r;
}

void dp_trace_span(const char *name, const char *cat, double t0, double t1, int arg)
{
    if (!dp_trace_enabled())
        return;
    ring *r = my_ring();
    if (!r)
        return;
    /* Both ends rounded from one shifted clock, so nested spans stay nested. */
    int64_t a = (int64_t)floor((t0 + wall_minus_mono) * 1e6);
    int64_t b = (int64_t)floor((t1 + wall_minus_mono) * 1e6);
    span *s = &r->s[r->n % DP_TRACE_RING];
    s->name = name;
    s->cat = cat;
    s->ts = a;
    s->dur = b > a ? b - a : 0;
    s->arg = arg;
    r->n++;
}

void dp_trace_compute(const char *name, double t0, double t1)
{
    compute_s += t1 - t0;
    dp_trace_span(name, "compute", t0, t1, -1);
}

double dp_trace_thread_compute(void)
{
    return compute_s;
}

/* ---- writing ---- */

typedef struct tbuf {
    char *p;
    size_t len, cap;
    bool oom;
} tbuf;

static void put(tbuf *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(tbuf *t, const char *fmt, ...)
{
    if (t->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->p ? t->p + t->len : NULL, t->p ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->oom = true;
            return;
        }
        if (t->p && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = t->cap ? t->cap * 2 : 1 << 16;
        while (cap < t->len + (size_t)n + 1)
            cap *= 2;
        char *p = realloc(t->p, cap);
        if (!p) {
            t->oom = true;
            return;
        }
        t->p = p;
        t->cap = cap;
    }
}

/* A JSON string of s (names are literals or task names, but escape anyway). */
static void put_str(tbuf *t, const char *s)
{
    put(t, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            put(t, "\\%c", c);
        else if (c < 0x20)
            put(t, "\\u%04x", c);
        else
            put(t, "%c", c);
    }
    put(t, "\"");
}

int dp_trace_close(dp_err *err)
{
    if (!atomic_exchange(&on, false) && !out_path)
        return 0;
    pthread_mutex_lock(&mu);
    tbuf t = {0};
    long dropped = 0;
    put(&t, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    put(&t, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":",
        out_pid);
    put_str(&t, proc_name);
    put(&t, "}},\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
            "\"args\":{\"sort_index\":%d}}",
        out_pid, out_pid);
    for (ring *r = rings; r; r = r->next) {
        long first = r->n > DP_TRACE_RING ? r->n - DP_TRACE_RING : 0;
        dropped += first;
        put(&t, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":"
                "{\"name\":\"%s %d\"}}",
            out_pid, r->tid, r->tid == 1 ? "main" : "thread", r->tid);
        for (long k = first; k < r->n; k++) {
            const span *s = &r->s[k % DP_TRACE_RING];
            put(&t, ",\n{\"name\":");
            put_str(&t, s->name);
            put(&t, ",\"cat\":");
            put_str(&t, s->cat);
            put(&t, ",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%lld,\"dur\":%lld", out_pid,
                r->tid, (long long)s->ts, (long long)s->dur);
            if (s->arg >= 0)
                put(&t, ",\"args\":{\"n\":%d}", s->arg);
            put(&t, "}");
        }
    }
    put(&t, "\n],\"otherData\":{\"dropped_spans\":%ld}}\n", dropped);
    int rc = 0;
    if (t.oom)
        rc = dp_errf(err, "--trace %s: out of memory writing the trace", out_path);
    else
        rc = dp_file_replace(out_path, t.p, t.len, err);
    if (dropped)
        dp_warn("--trace %s: %ld older span(s) left out (each thread keeps its newest %d)",
                out_path, dropped, DP_TRACE_RING);
    free(t.p);
    while (rings) {
        ring *r = rings;
        rings = r->next;
        free(r);
    }
    free(out_path);
    free(proc_name);
    out_path = proc_name = NULL;
    next_tid = 0;
    atomic_fetch_add(&generation, 1);
    pthread_mutex_unlock(&mu);
    return rc;
}

/* ---- merging a cluster's files ---- */

static int read_whole(const char *path, char **out, size_t *len, dp_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return dp_errf(err, "%s", strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *p = malloc(cap);
    while (p) {
        n += fread(p + n, 1, cap - n, f);
        if (n < cap)
            break;
        char *q = realloc(p, cap *= 2);
        if (!q) {
            free(p);
            p = NULL;
        }
        p = q;
    }
    int bad = ferror(f);
    fclose(f);
    if (!p || bad) {
        const char *why = p ? "read error" : "out of memory";
        free(p);
        return dp_errf(err, "%s", why);
    }
    *out = p;
    *len = n;
    return 0;
}

int dp_trace_merge(const char *path, const char *const *inputs, int n, dp_err *err)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *all = root ? cJSON_AddArrayToObject(root, "traceEvents") : NULL;
    if (!all || !cJSON_AddStringToObject(root, "displayTimeUnit", "ms")) {
        cJSON_Delete(root);
        return dp_errf(err, "merging traces: out of memory");
    }
    for (int i = 0; i < n; i++) {
        size_t len = 0;
        char *s = NULL;
        dp_err rerr;
        if (read_whole(inputs[i], &s, &len, &rerr) < 0) {
            dp_warn("merging traces: no trace from %s: %s", inputs[i], rerr.msg);
            continue;
        }
        cJSON *one = cJSON_ParseWithLength(s, len);
        free(s);
        cJSON *ev = cJSON_GetObjectItemCaseSensitive(one, "traceEvents");
        if (!cJSON_IsArray(ev)) {
            dp_warn("merging traces: %s is not a trace (no traceEvents array); left out",
                    inputs[i]);
            cJSON_Delete(one);
            continue;
        }
        /* Move the events over, not copy them: a trace can be large. */
        while (cJSON_GetArraySize(ev) > 0)
            cJSON_AddItemToArray(all, cJSON_DetachItemFromArray(ev, 0));
        cJSON_Delete(one);
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!text)
        return dp_errf(err, "merging traces: out of memory");
    int rc = dp_file_replace(path, text, strlen(text), err);
    cJSON_free(text);
    return rc;
}
