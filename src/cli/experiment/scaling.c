/* downpour experiment scaling: throughput and speedup over one process for
 * each strategy at 1, 2, 4 and 8 workers, the platform metrics the sources
 * name (docs/experiments.md).  Writes DIR/results.json and DIR/report.html
 * (a table and charts) and each run's metrics and log under DIR/runs. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "downpour/clock.h"
#include "downpour/file.h"
#include "downpour/report.h"
#include "downpour/strategy.h"
#include "cli/experiment/experiment.h"
#include "cli/experiment/study.h"

#define USAGE                                                                                   \
    "downpour experiment scaling --out DIR [--strategies LIST] [--workers LIST] [--epochs N]\n" \
    "                            [--dataset NAME] [--model SPEC] [--batch N] [--repeats N]\n"  \
    "                            [--train-size N] [--hosts N --link-mbit B [--delay-ms D]]\n"  \
    "\n"                                                                                        \
    "Trains the same model with one process (--strategy single) and with each strategy at\n"   \
    "each worker count, and reports samples/s, the speedup over the one process and the\n"    \
    "efficiency (speedup / workers). Parameter-server strategies run a chief, the workers\n"  \
    "and one ps; allreduce runs that many workers, worker 0 evaluating. Each run's\n"         \
    "samples/s is the training records processed per second of its epoch loop, over all\n"   \
    "workers. On one machine the workers share its cores: the speedup measures what the\n"   \
    "strategy costs, not what more machines would give (see --hosts)."

#define MAX_REPEATS 9

/* The strategy table's data-parallel ones on a cluster: against the one
 * process, dp_strategy_single. */
static int ok_strategy(const char *s)
{
    dp_err ignored;
    const dp_strategy_ops *ops = dp_strategy_find(s, &ignored);
    return ops && ops->cluster && ops->data_parallel;
}

static int ok_workers(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    return *s && !*end && v >= 1 && v <= 64;
}

typedef struct point {
    const char *strategy; /* dp_strategy_single's name for the baseline */
    int workers;
    int runs;
    study_stat sps, acc;
    char metrics[MAX_REPEATS][4400];
    char why[512];
    int failed;
} point;

typedef struct scaling {
    const char *out, *dataset, *model;
    long epochs, batch, repeats, train_size;
    study_cluster cluster;
} scaling;

static int command(const scaling *S, const point *p, int seed, const char *metrics,
                   study_argv *a, dp_err *err)
{
    char buf[64];
    int bad = 0;
    dp_err ignored;
    const dp_strategy_ops *ops = dp_strategy_find(p->strategy, &ignored);
    if (!ops || !ops->cluster) {
        study_argv_init(a);
        bad |= study_argv_add(a, "/proc/self/exe");
    } else {
        /* ps strategies: a chief, the workers, a ps; allreduce: the workers alone */
        int ps = (ops->needs & DP_ROLE_BIT(DP_ROLE_PS)) != 0;
        if (study_cluster_command(&S->cluster, a, ps, p->workers, ps, err) < 0)
            return -1;
    }
    bad |= study_argv_add(a, "train") | study_argv_add(a, "--strategy") |
           study_argv_add(a, p->strategy) | study_argv_add(a, "--dataset") |
           study_argv_add(a, S->dataset) | study_argv_add(a, "--model") |
           study_argv_add(a, S->model) | study_argv_add(a, "--batch");
    snprintf(buf, sizeof buf, "%ld", S->batch);
    bad |= study_argv_add(a, buf) | study_argv_add(a, "--epochs");
    snprintf(buf, sizeof buf, "%ld", S->epochs);
    bad |= study_argv_add(a, buf) | study_argv_add(a, "--seed");
    snprintf(buf, sizeof buf, "%d", seed);
    bad |= study_argv_add(a, buf) | study_argv_add(a, "--train-size");
    snprintf(buf, sizeof buf, "%ld", S->train_size);
    bad |= study_argv_add(a, buf) |
           study_argv_add_words(a, "--val-size 2000 --log-every 0 --no-progress --metrics") |
           study_argv_add(a, metrics);
    if (bad)
        return dp_errf(err, "command line too long");
    return 0;
}

static void run_point(const scaling *S, point *p, int *done, int total)
{
    double sps[MAX_REPEATS], acc[MAX_REPEATS];
    for (int r = 0; r < S->repeats; r++) {
        char log[4400];
        snprintf(p->metrics[r], sizeof p->metrics[r], "%s/runs/%s-w%d-r%d.jsonl", S->out,
                 p->strategy, p->workers, r + 1);
        snprintf(log, sizeof log, "%s/runs/%s-w%d-r%d.log", S->out, p->strategy, p->workers,
                 r + 1);
        study_argv a;
        dp_err err;
        study_run run;
        char label[64];
        snprintf(label, sizeof label, "%s with %d worker(s)", p->strategy, p->workers);
        (*done)++;
        if (command(S, p, r + 1, p->metrics[r], &a, &err) < 0) {
            p->failed = 1;
            snprintf(p->why, sizeof p->why, "%s", err.msg);
            fprintf(stderr, "experiment: %s: %s\n", label, p->why);
            return;
        }
        if (study_run_one(&a, p->metrics[r], log, 3600, label, r + 1, &run, p->why,
                          sizeof p->why) < 0) {
            p->failed = 1;
            return;
        }
        sps[p->runs] = run.samples_per_second;
        acc[p->runs] = run.test_accuracy;
        p->runs++;
        printf("[%d/%d] %-9s %2d worker(s), seed %d: %.0f samples/s, test accuracy %.4f, "
               "wall %.1f s\n",
               *done, total, p->strategy, p->workers, r + 1, run.samples_per_second,
               run.test_accuracy, run.wall_seconds);
        fflush(stdout);
    }
    p->sps = study_stats(sps, p->runs);
    p->acc = study_stats(acc, p->runs);
}

static int write_outputs(const scaling *S, const point *pts, int n, const char **strategies,
                         int n_strategies, double wall, dp_err *err)
{
    const point *base = &pts[0];
    double base_sps = base->failed ? NAN : base->sps.median;
    /* results.json */
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "experiment", "scaling");
    cJSON_AddStringToObject(root, "cluster", S->cluster.description);
    cJSON_AddNumberToObject(root, "cores", study_cores());
    cJSON_AddStringToObject(root, "dataset", S->dataset);
    cJSON_AddStringToObject(root, "model", S->model);
    cJSON_AddNumberToObject(root, "batch", (double)S->batch);
    cJSON_AddNumberToObject(root, "epochs", (double)S->epochs);
    cJSON_AddNumberToObject(root, "repeats", (double)S->repeats);
    cJSON_AddNumberToObject(root, "wall_seconds", wall);
    cJSON *arr = cJSON_AddArrayToObject(root, "points");
    for (int i = 0; i < n; i++) {
        const point *p = &pts[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "strategy", p->strategy);
        cJSON_AddNumberToObject(o, "workers", p->workers);
        if (p->failed) {
            cJSON_AddStringToObject(o, "status", "failed");
            cJSON_AddStringToObject(o, "reason", p->why);
        } else {
            cJSON_AddStringToObject(o, "status", "done");
            cJSON_AddNumberToObject(o, "samples_per_second", p->sps.median);
            cJSON_AddNumberToObject(o, "samples_per_second_min", p->sps.min);
            cJSON_AddNumberToObject(o, "samples_per_second_max", p->sps.max);
            if (isfinite(base_sps)) {
                cJSON_AddNumberToObject(o, "speedup", p->sps.median / base_sps);
                cJSON_AddNumberToObject(o, "efficiency", p->sps.median / base_sps / p->workers);
            }
            cJSON_AddNumberToObject(o, "test_accuracy", p->acc.median);
        }
        cJSON_AddItemToArray(arr, o);
    }
    if (study_write_results(S->out, root, err) < 0)
        return -1;

    /* report.html: the table, then speedup and samples/s against workers */
    dp_report *r;
    if (dp_report_open(&r, "Scaling: samples/s and speedup per strategy", err) < 0)
        return -1;
    char text2[1024];
    snprintf(text2, sizeof text2,
             "%s, batch %ld per worker, %ld epoch(s) of %ld records on %s, on %s; %ld run(s) per "
             "point (medians). Speedup is samples/s over one process's (%.0f samples/s); "
             "efficiency is speedup / workers.",
             S->model, S->batch, S->epochs, S->train_size, S->dataset, S->cluster.description,
             S->repeats, base_sps);
    int bad = dp_report_add_paragraph(r, text2);
    enum { COLS = 6 };
    const char *head[COLS] = {"strategy", "workers", "samples/s", "speedup", "efficiency",
                              "test accuracy"};
    const char **cells = calloc((size_t)n * COLS, sizeof *cells);
    char (*store)[48] = calloc((size_t)n * COLS, sizeof *store);
    double *xs = calloc((size_t)n, sizeof *xs), *ys = calloc((size_t)n, sizeof *ys),
           *ts = calloc((size_t)n, sizeof *ts);
    dp_chart_series *sp = calloc((size_t)n_strategies + 1, sizeof *sp);
    dp_chart_series *tp = calloc((size_t)n_strategies + 1, sizeof *tp);
    if (!cells || !store || !xs || !ys || !ts || !sp || !tp) {
        bad = -1;
        goto done;
    }
    for (int i = 0; i < n; i++) {
        const point *p = &pts[i];
        char(*s)[48] = store + (size_t)i * COLS;
        snprintf(s[0], 48, "%s", p->strategy);
        snprintf(s[1], 48, "%d", p->workers);
        if (p->failed) {
            snprintf(s[2], 48, "failed");
            snprintf(s[3], 48, "-");
            snprintf(s[4], 48, "-");
            snprintf(s[5], 48, "-");
        } else {
            snprintf(s[2], 48, "%.0f", p->sps.median);
            snprintf(s[3], 48, "%.2f", p->sps.median / base_sps);
            snprintf(s[4], 48, "%.2f", p->sps.median / base_sps / p->workers);
            snprintf(s[5], 48, "%.4f", p->acc.median);
        }
        for (int k = 0; k < COLS; k++)
            cells[(size_t)i * COLS + k] = s[k];
    }
    bad |= dp_report_add_table(r, "Throughput per strategy and worker count", COLS, head, n,
                               cells);
    /* one series per strategy; x = workers */
    int used = 0, ns = 0;
    for (int k = 0; k < n_strategies; k++) {
        int start = used;
        for (int i = 1; i < n; i++)
            if (!strcmp(pts[i].strategy, strategies[k]) && !pts[i].failed) {
                xs[used] = pts[i].workers;
                ys[used] = pts[i].sps.median / base_sps;
                ts[used] = pts[i].sps.median;
                used++;
            }
        sp[ns] = (dp_chart_series){strategies[k], xs + start, ys + start, used - start};
        tp[ns] = (dp_chart_series){strategies[k], xs + start, ts + start, used - start};
        ns++;
    }
    dp_chart c1 = {"Speedup over one process", "workers", "speedup (x one process)", true};
    dp_chart c2 = {"Throughput", "workers", "samples/s (all workers)", true};
    bad |= dp_report_add_line_chart(r, &c1, sp, ns);
    bad |= dp_report_add_line_chart(r, &c2, tp, ns);
done:
    free(cells);
    free(store);
    free(xs);
    free(ys);
    free(ts);
    free(sp);
    free(tp);
    if (bad) {
        dp_report_free(r);
        return dp_errf(err, "report: out of memory");
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < pts[i].runs; k++) {
            char label[96];
            snprintf(label, sizeof label, "%s x%d%s", pts[i].strategy, pts[i].workers,
                     k ? " (repeat)" : "");
            if (dp_report_add_run(r, pts[i].metrics[k], label, err) < 0) {
                dp_report_free(r);
                return -1;
            }
        }
    char path[4200];
    snprintf(path, sizeof path, "%s/report.html", S->out);
    int rc = dp_report_write(r, path, err);
    dp_report_free(r);
    return rc;
}

int dp_experiment_scaling(int argc, char **argv)
{
    scaling S;
    memset(&S, 0, sizeof S);
    const char *out = NULL, *strategies = "ps-async,ps-sync,allreduce", *workers = "1,2,4,8";
    const char *dataset = "mnist", *model = "mlp-300-100";
    long epochs = 1, batch = 128, repeats = 1, train_size = 54000;
    study_cluster_opts copts;
    study_cluster_opts_init(&copts);
    const cli_opt opts[] = {
        {"out", CLI_STR, &out, "DIR", "where results.json, report.html and runs/ go", 0, 0},
        {"strategies", CLI_STR, &strategies, "LIST", "of ps-async, ps-sync, ps-ssp, ps-dssp, model-avg, allreduce", 0, 0},
        {"workers", CLI_STR, &workers, "LIST", "worker counts, 1..64", 0, 0},
        {"epochs", CLI_INT, &epochs, "N", "epochs per run", 1, 1000},
        {"dataset", CLI_STR, &dataset, "NAME|DIR", "the training data", 0, 0},
        {"model", CLI_STR, &model, "SPEC", "the model (as train --model)", 0, 0},
        {"batch", CLI_INT, &batch, "N", "records per step per worker", 1, 1 << 20},
        {"repeats", CLI_INT, &repeats, "N", "runs per point, seeds 1..N (medians)", 1, MAX_REPEATS},
        {"train-size", CLI_INT, &train_size, "N", "training records", 1, 1L << 31},
        STUDY_CLUSTER_CLI_OPTS(copts),
    };
    int pr = study_parse("scaling", USAGE, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv,
                         &out);
    if (pr >= 0)
        return pr;
    dp_err err;
    char sbuf[256], wbuf[128];
    const char *st[STUDY_MAX_LIST], *ws[STUDY_MAX_LIST];
    int ns, nw;
    if (study_split_list("strategies", strategies, sbuf, sizeof sbuf, st, &ns, ok_strategy,
                         &err) < 0 ||
        study_split_list("workers", workers, wbuf, sizeof wbuf, ws, &nw, ok_workers, &err) < 0 ||
        study_cluster_setup(&S.cluster, &copts, &err) < 0) {
        fprintf(stderr, "downpour experiment scaling: %s\n", err.msg);
        return 2;
    }
    if (study_prepare_out(out, &err) < 0) {
        fprintf(stderr, "downpour experiment scaling: %s\n", err.msg);
        return 1;
    }
    S.out = out;
    S.dataset = dataset;
    S.model = model;
    S.epochs = epochs;
    S.batch = batch;
    S.repeats = repeats;
    S.train_size = train_size;

    int n = 1 + ns * nw;
    point *pts = calloc((size_t)n, sizeof *pts);
    if (!pts) {
        fprintf(stderr, "downpour experiment scaling: out of memory\n");
        return 1;
    }
    pts[0] = (point){.strategy = dp_strategy_single.name, .workers = 1};
    for (int s = 0; s < ns; s++)
        for (int w = 0; w < nw; w++)
            pts[1 + s * nw + w] = (point){.strategy = st[s], .workers = atoi(ws[w])};
    printf("downpour experiment scaling: %d run(s) on %s; outputs in %s\n", n * (int)repeats,
           S.cluster.description, out);
    fflush(stdout);
    double t0 = dp_now();
    int done = 0, failed = 0;
    for (int i = 0; i < n; i++) {
        run_point(&S, &pts[i], &done, n * (int)repeats);
        failed += pts[i].failed;
    }
    double wall = dp_now() - t0;
    int rc = 0;
    if (pts[0].failed) {
        fprintf(stderr, "downpour experiment scaling: the one-process baseline failed, so no "
                        "speedup can be computed\n");
        rc = 1;
    }
    if (write_outputs(&S, pts, n, st, ns, wall, &err) < 0) {
        fprintf(stderr, "downpour experiment scaling: %s\n", err.msg);
        rc = 1;
    }
    printf("\n%-10s %7s %11s %8s %10s\n", "strategy", "workers", "samples/s", "speedup",
           "efficiency");
    for (int i = 0; i < n; i++) {
        if (pts[i].failed) {
            printf("%-10s %7d %11s\n", pts[i].strategy, pts[i].workers, "failed");
            continue;
        }
        double sp = pts[i].sps.median / pts[0].sps.median;
        printf("%-10s %7d %11.0f %8.2f %10.2f\n", pts[i].strategy, pts[i].workers,
               pts[i].sps.median, sp, sp / pts[i].workers);
    }
    printf("Study wall time: %.1f s; wrote %s/results.json and %s/report.html\n", wall, out, out);
    if (failed && rc == 0)
        rc = 1;
    free(pts);
    return rc;
}
