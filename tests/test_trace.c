/* --trace (docs/trace.md):
 * - in-process: spans of two threads written in the Chrome trace format,
 *   nested as taken, with their thread and process; two files merged;
 * - a 2-worker all-reduce launch and a ps-sync launch with a straggler,
 *   each with --trace: one merged file, every span nested within its
 *   thread, every task present, the expected spans there, the per-task
 *   files gone; the report names the straggler found by compute time.
 * No wall-clock bounds: only structure and names are checked. */
#include <pthread.h>
#include <stdbool.h>
#include <unistd.h>

#include "downpour/clock.h"
#include "downpour/trace.h"
#include "proc.h"

static char err[65536];

static cJSON *read_trace(const char *path)
{
    char *s = slurp(path, NULL);
    CHECKF(s != NULL, "%s missing", path);
    cJSON *j = s ? cJSON_Parse(s) : NULL;
    CHECKF(j != NULL, "%s is not JSON", path);
    free(s);
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(j, "traceEvents");
    CHECKF(cJSON_IsArray(ev), "%s has no traceEvents array", path);
    return j;
}

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static const char *str(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

typedef struct xspan {
    int pid, tid;
    double ts, end;
} xspan;

static int by_thread_then_start(const void *a, const void *b)
{
    const xspan *x = a, *y = b;
    if (x->pid != y->pid)
        return x->pid - y->pid;
    if (x->tid != y->tid)
        return x->tid - y->tid;
    if (x->ts != y->ts)
        return x->ts < y->ts ? -1 : 1;
    return x->end > y->end ? -1 : x->end < y->end; /* the longer (the parent) first */
}

/* Every "X" event well formed, and every span of a thread either inside or
 * after the spans open before it (a stack walk over start order).  Returns
 * the number of X events. */
static int check_nesting(const cJSON *root)
{
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(root, "traceEvents"), *e;
    int n = cJSON_GetArraySize(ev), k = 0;
    xspan *s = calloc((size_t)(n ? n : 1), sizeof *s);
    REQUIRE(s);
    cJSON_ArrayForEach(e, ev)
    {
        if (strcmp(str(e, "ph"), "X") != 0)
            continue;
        double ts = num(e, "ts"), dur = num(e, "dur");
        CHECKF(isfinite(ts) && dur >= 0 && str(e, "name")[0] && isfinite(num(e, "pid")) &&
                   isfinite(num(e, "tid")),
               "a malformed span: %s", str(e, "name"));
        s[k++] = (xspan){(int)num(e, "pid"), (int)num(e, "tid"), ts, ts + dur};
    }
    qsort(s, (size_t)k, sizeof *s, by_thread_then_start);
    xspan *stack[256];
    int depth = 0, bad = 0;
    for (int i = 0; i < k; i++) {
        if (i > 0 && (s[i].pid != s[i - 1].pid || s[i].tid != s[i - 1].tid))
            depth = 0;
        while (depth > 0 && s[i].ts >= stack[depth - 1]->end)
            depth--;
        if (depth > 0 && s[i].end > stack[depth - 1]->end) {
            if (bad++ < 5)
                fprintf(stderr, "pid %d tid %d: span [%.0f, %.0f] overlaps [%.0f, %.0f]\n",
                        s[i].pid, s[i].tid, s[i].ts, s[i].end, stack[depth - 1]->ts,
                        stack[depth - 1]->end);
        }
        if (depth < 256)
            stack[depth++] = &s[i];
    }
    CHECKF(bad == 0, "%d span(s) not nested within their thread", bad);
    free(s);
    return k;
}

/* Spans named name (and of pid, when pid >= 0). */
static int count_spans(const cJSON *root, const char *name, int pid)
{
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(root, "traceEvents"), *e;
    int n = 0;
    cJSON_ArrayForEach(e, ev)
    n += !strcmp(str(e, "ph"), "X") && !strcmp(str(e, "name"), name) &&
         (pid < 0 || num(e, "pid") == pid);
    return n;
}

/* The process_name of pid, or "". */
static const char *process_name(const cJSON *root, int pid)
{
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(root, "traceEvents"), *e;
    cJSON_ArrayForEach(e, ev)
    if (!strcmp(str(e, "ph"), "M") && !strcmp(str(e, "name"), "process_name") &&
        num(e, "pid") == pid)
        return str(cJSON_GetObjectItemCaseSensitive(e, "args"), "name");
    return "";
}

/* ---- in-process ---- */

static void *other_thread(void *arg)
{
    (void)arg;
    double t0 = dp_now();
    dp_trace_compute("compute", t0, dp_now());
    dp_trace_span("all-reduce bucket", "allreduce", t0, dp_now(), 3);
    return NULL;
}

static void test_in_process(void)
{
    char path[1200], second[1200], merged[1200];
    snprintf(path, sizeof path, "%s/one.json", test_tmp());
    snprintf(second, sizeof second, "%s/two.json", test_tmp());
    snprintf(merged, sizeof merged, "%s/merged.json", test_tmp());
    dp_err e;
    double before = dp_trace_thread_compute();
    dp_trace_span("not recorded", "x", dp_now(), dp_now(), -1); /* no trace open: a no-op */
    REQUIRE(dp_trace_open(path, 4, "worker:3", &e) == 0);
    CHECK(dp_trace_enabled());
    CHECK(dp_trace_open(path, 4, "worker:3", &e) == -1); /* one a process */
    double a = dp_now();
    double b = dp_now();
    dp_trace_compute("compute", a, b);
    double c = dp_now();
    dp_trace_span("push", "push", c, dp_now(), -1);
    dp_trace_span("step", "step", a, dp_now(), 1);
    CHECK(dp_trace_thread_compute() - before == b - a);
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, other_thread, NULL) == 0);
    pthread_join(th, NULL);
    REQUIRE(dp_trace_close(&e) == 0);
    CHECK(!dp_trace_enabled());

    cJSON *j = read_trace(path);
    REQUIRE(j);
    CHECK(check_nesting(j) == 5);
    CHECK(!strcmp(process_name(j, 4), "worker:3"));
    CHECK(count_spans(j, "step", 4) == 1 && count_spans(j, "compute", 4) == 2 &&
          count_spans(j, "not recorded", -1) == 0);
    /* two threads, each its own tid */
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(j, "traceEvents"), *x;
    double tid_step = NAN, tid_bucket = NAN;
    cJSON_ArrayForEach(x, ev)
    {
        if (!strcmp(str(x, "name"), "step"))
            tid_step = num(x, "tid");
        if (!strcmp(str(x, "name"), "all-reduce bucket")) {
            tid_bucket = num(x, "tid");
            CHECK(num(cJSON_GetObjectItemCaseSensitive(x, "args"), "n") == 3);
        }
    }
    CHECK(isfinite(tid_step) && isfinite(tid_bucket) && tid_step != tid_bucket);
    cJSON_Delete(j);

    /* A second trace in the same process starts afresh. */
    REQUIRE(dp_trace_open(second, 0, "chief:0", &e) == 0);
    double t = dp_now();
    dp_trace_span("evaluation", "eval", t, dp_now(), 1);
    REQUIRE(dp_trace_close(&e) == 0);
    const char *in[] = {path, second, "/nonexistent/trace.json"};
    REQUIRE(dp_trace_merge(merged, in, 3, &e) == 0);
    j = read_trace(merged);
    REQUIRE(j);
    CHECK(check_nesting(j) == 6);
    CHECK(!strcmp(process_name(j, 4), "worker:3") && !strcmp(process_name(j, 0), "chief:0"));
    CHECK(count_spans(j, "evaluation", 0) == 1);
    cJSON_Delete(j);
}

/* ---- launched runs ---- */

static void test_allreduce_launch(void)
{
    int rc = run_cmd(err, sizeof err,
                     "cd %s && %s launch --workers 2 -- train --strategy allreduce --dataset mnist "
                     "--model 784-32-10 --epochs 1 --train-size 2000 --val-size 500 --log-every 0 "
                     "--threads 1 --no-progress --trace ar.json",
                     test_tmp(), test_bin());
    CHECKF(rc == 0, "allreduce launch with --trace: rc %d\n%s", rc, err);
    char path[1200];
    snprintf(path, sizeof path, "%s/ar.json", test_tmp());
    cJSON *j = read_trace(path);
    if (!j)
        return;
    CHECK(check_nesting(j) > 0);
    for (int p = 0; p < 2; p++) {
        char want[32];
        snprintf(want, sizeof want, "worker:%d", p);
        CHECKF(!strcmp(process_name(j, p), want), "pid %d is '%s'", p, process_name(j, p));
        CHECKF(count_spans(j, "compute", p) > 0 && count_spans(j, "step", p) > 0 &&
                   count_spans(j, "all-reduce bucket", p) > 0,
               "worker:%d: %d compute, %d step, %d bucket spans", p, count_spans(j, "compute", p),
               count_spans(j, "step", p), count_spans(j, "all-reduce bucket", p));
    }
    CHECK(count_spans(j, "evaluation", -1) >= 1);
    cJSON_Delete(j);
    snprintf(path, sizeof path, "%s/ar.json.worker-0", test_tmp());
    CHECKF(access(path, F_OK) != 0, "%s left behind after the merge", path);
}

static void test_ps_sync_straggler(void)
{
    int rc = run_cmd(err, sizeof err,
                     "cd %s && %s launch --chief --workers 2 --ps 1 -- train --strategy ps-sync "
                     "--dataset mnist --model 784-32-10 --epochs 1 --train-size 2000 --val-size "
                     "500 --log-every 0 --threads 1 --no-progress --straggler 1:20 --trace ps.json "
                     "--metrics ps.jsonl && %s report ps.jsonl -o ps.html",
                     test_tmp(), test_bin(), test_bin());
    CHECKF(rc == 0, "ps-sync launch with --trace: rc %d\n%s", rc, err);
    char path[1200];
    snprintf(path, sizeof path, "%s/ps.json", test_tmp());
    cJSON *j = read_trace(path);
    if (!j)
        return;
    CHECK(check_nesting(j) > 0);
    const char *names[] = {"chief:0", "worker:0", "worker:1", "ps:0"};
    for (int p = 0; p < 4; p++)
        CHECKF(!strcmp(process_name(j, p), names[p]), "pid %d is '%s'", p, process_name(j, p));
    CHECK(count_spans(j, "push", 1) > 0 && count_spans(j, "pull", 2) > 0 &&
          count_spans(j, "apply push", 3) > 0 && count_spans(j, "evaluation", 0) >= 1);
    CHECK(count_spans(j, "compute (--straggler)", 2) > 0 &&
          count_spans(j, "compute (--straggler)", 1) == 0);
    cJSON_Delete(j);
    /* The straggler by compute time, though every worker's step time is alike. */
    snprintf(path, sizeof path, "%s/ps.html", test_tmp());
    char *h = slurp(path, NULL);
    CHECKF(h && strstr(h, "<p class=\"straggler\">worker:1 was the task the others waited for"),
           "the report does not name worker:1 as the straggler");
    CHECK(h && strstr(h, "data-k=\"compute_ms_median\""));
    free(h);
}

int main(void)
{
    REQUIRE(test_bin() && test_tmp());
    test_in_process();
    require_mnist();
    test_allreduce_launch();
    test_ps_sync_straggler();
    return CHECK_DONE();
}
