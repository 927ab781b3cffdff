/* downpour experiment sparse: a click-through model's sparse tables under
 * ps-async, ps-sync and allreduce (by rows, and whole with
 * --allreduce-dense) on a `downpour data synth ctr` set: bytes per step per
 * worker (measured, and the cost model's), samples/s, test AUC and log loss,
 * and the recommendation by the rule the thesis study uses (study_pick).
 * docs/experiments.md, "downpour experiment sparse". */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "downpour/clock.h"
#include "downpour/cost_model.h"
#include "downpour/file.h"
#include "downpour/model.h"
#include "downpour/report.h"
#include "downpour/sparse.h"
#include "cli/experiment/experiment.h"
#include "cli/experiment/study.h"

#define USAGE                                                                                  \
    "downpour experiment sparse --out DIR [--data DIR] [--rows N] [--test-rows N] [--ids N]\n" \
    "                           [--zipf S] [--model SPEC] [--runs LIST] [--workers N]\n"      \
    "                           [--ps N] [--batch N] [--epochs N] [--repeats N]\n"            \
    "                           [--hosts N --link-mbit B [--delay-ms D]]\n"                   \
    "\n"                                                                                       \
    "Trains a click-through model (wide-deep's shape for the set) on a synthetic set\n"        \
    "(`downpour data synth ctr`, written to DIR/data unless --data names one) under\n"        \
    "ps-async, ps-sync, allreduce (sparse tables all-gathered by rows) and allreduce-dense\n"  \
    "(--allreduce-dense), and reports bytes per step per worker, measured beside the cost\n"  \
    "model's, samples/s, test AUC and log loss, and which suits: AUC first where it\n"         \
    "differs by more than the spread between seeds, else the faster."

#define MAX_REPEATS 9
#define N_KINDS 4

static const char *const KINDS[N_KINDS] = {"ps-async", "ps-sync", "allreduce", "allreduce-dense"};

static int ok_kind(const char *s)
{
    for (int k = 0; k < N_KINDS; k++)
        if (strcmp(s, KINDS[k]) == 0)
            return 1;
    return 0;
}

typedef struct cell {
    const char *kind;
    int runs, failed;
    char why[512];
    char metrics[MAX_REPEATS][4400];
    study_stat auc, logloss, sps, train_s, bytes;
    double predicted;     /* the cost model's bytes per step per worker, sent + received */
    int by_rows;          /* the tables move by rows (the cost model's, as the strategy) */
} cell;

typedef struct study {
    const char *out, *data, *model;
    long rows, test_rows, ids, workers, ps, batch, epochs, repeats;
    double zipf;
    long train, val, steps; /* records, and each worker's steps over the run */
    study_cluster cluster;
    dp_cost_sparse sp;      /* the model's tables for the cost model */
    size_t n_params;
} study;

static int is_ps(const char *kind) { return strncmp(kind, "ps-", 3) == 0; }

static int add_num(study_argv *a, const char *flag, long v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%ld", v);
    return study_argv_add(a, flag) | study_argv_add(a, buf);
}

static int command(const study *S, const cell *c, int seed, const char *metrics, study_argv *a,
                   dp_err *err)
{
    int ps = is_ps(c->kind);
    if (study_cluster_command(&S->cluster, a, ps, (int)S->workers, ps ? (int)S->ps : 0, err) < 0)
        return -1;
    int bad = study_argv_add(a, "train") | study_argv_add(a, "--strategy") |
              study_argv_add(a, ps ? c->kind : "allreduce") | study_argv_add(a, "--dataset") |
              study_argv_add(a, S->data) | study_argv_add(a, "--model") |
              study_argv_add(a, S->model) | add_num(a, "--batch", S->batch) |
              add_num(a, "--epochs", S->epochs) | add_num(a, "--seed", seed) |
              add_num(a, "--train-size", S->train) | add_num(a, "--val-size", S->val) |
              study_argv_add_words(a, "--log-every 0 --no-progress --metrics") |
              study_argv_add(a, metrics);
    if (strcmp(c->kind, "allreduce-dense") == 0)
        bad |= study_argv_add(a, "--allreduce-dense");
    /* the ring, as the cost model prices it: auto's timing probes (at the
     * first sum, docs/strategies.md) would count in a short run's bytes */
    if (!ps)
        bad |= study_argv_add_words(a, "--allreduce-algo ring");
    return bad ? dp_errf(err, "command line too long") : 0;
}

static void run_cell(const study *S, cell *c, int *done, int total)
{
    double auc[MAX_REPEATS], ll[MAX_REPEATS], sps[MAX_REPEATS], ts[MAX_REPEATS], by[MAX_REPEATS];
    for (int r = 0; r < S->repeats; r++) {
        char log[4400];
        snprintf(c->metrics[r], sizeof c->metrics[r], "%s/runs/%s-r%d.jsonl", S->out, c->kind,
                 r + 1);
        snprintf(log, sizeof log, "%s/runs/%s-r%d.log", S->out, c->kind, r + 1);
        study_argv a;
        dp_err err;
        study_run run;
        (*done)++;
        if (command(S, c, r + 1, c->metrics[r], &a, &err) < 0) {
            c->failed = 1;
            snprintf(c->why, sizeof c->why, "%s", err.msg);
            fprintf(stderr, "experiment: %s: %s\n", c->kind, c->why);
            return;
        }
        if (study_run_one(&a, c->metrics[r], log, 3600, c->kind, r + 1, &run, c->why,
                          sizeof c->why) < 0) {
            c->failed = 1;
            return;
        }
        auc[c->runs] = run.test_auc;
        ll[c->runs] = run.test_log_loss;
        sps[c->runs] = run.samples_per_second;
        ts[c->runs] = run.train_seconds;
        by[c->runs] = run.workers ? (run.worker_tx + run.worker_rx) / run.workers / S->steps : NAN;
        c->runs++;
        printf("[%d/%d] %-15s seed %d: AUC %.4f, log loss %.4f, %.0f samples/s, %.0f bytes a "
               "step a worker, wall %.1f s\n",
               *done, total, c->kind, r + 1, run.test_auc, run.test_log_loss,
               run.samples_per_second, by[c->runs - 1], run.wall_seconds);
        fflush(stdout);
    }
    c->auc = study_stats(auc, c->runs);
    c->logloss = study_stats(ll, c->runs);
    c->sps = study_stats(sps, c->runs);
    c->train_s = study_stats(ts, c->runs);
    c->bytes = study_stats(by, c->runs);
}

/* The model's tables for the cost model: each table's expected unique rows
 * a batch from the ids' Zipf law (docs/cost_model.md, "Sparse tables"). */
static int describe_model(study *S, dp_err *err)
{
    dp_model m;
    if (dp_model_init(&m, S->model, 1, 1, err) < 0)
        return -1;
    dp_sparse_table t[DP_SPARSE_MAX];
    int k = dp_model_sparse_tables(&m, t, DP_SPARSE_MAX);
    memset(&S->sp, 0, sizeof S->sp);
    S->n_params = m.n_params;
    for (int i = 0; i < k && i < DP_COST_MAX_TABLES; i++) {
        double draws = (double)S->batch * (double)t[i].per_record;
        S->sp.width[i] = t[i].width;
        S->sp.rows[i] = dp_cost_zipf_unique((uint32_t)t[i].rows, S->zipf, draws);
        S->sp.bound[i] = draws < (double)t[i].rows ? draws : (double)t[i].rows;
        S->sp.table_floats += (size_t)t[i].rows * (size_t)t[i].width;
        S->sp.tables++;
    }
    dp_model_free(&m);
    return 0;
}

/* Bytes a worker sends and receives a step, by the cost model. */
static double predict(const study *S, cell *c)
{
    const dp_cost_sparse *sp = S->sp.tables ? &S->sp : NULL;
    dp_err err;
    double up = NAN, down = NAN;
    c->by_rows = 0;
    if (is_ps(c->kind)) {
        int rc = dp_cost_sparse_ps_bytes(S->n_params, sp, (int)S->ps, &up, &down, &err);
        c->by_rows = sp != NULL;
        return rc < 0 ? NAN : up + down;
    }
    int n = (int)S->workers;
    if (strcmp(c->kind, "allreduce-dense") == 0 || !sp)
        return 2 * dp_cost_ring_bytes(S->n_params, n, 512u << 10);
    return 2 * dp_cost_allreduce_sparse_bytes(S->n_params, sp, n, 512u << 10, &c->by_rows);
}

/* ------------------------------------------------------ the recommendation */

typedef struct verdict {
    const char *kind; /* NULL: no verdict */
    char reasons[8][480];
    int n;
} verdict;

static void reason(verdict *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void reason(verdict *v, const char *fmt, ...)
{
    if (v->n >= 8)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->reasons[v->n++], sizeof v->reasons[0], fmt, ap);
    va_end(ap);
}

/* The thesis study's rule (study_pick), candidate against candidate: AUC
 * first where it differs by more than the spread between seeds, else the
 * faster (training time), the winner going on to meet the next. */
static void recommend(const study *S, cell *cells, int n, verdict *v)
{
    memset(v, 0, sizeof *v);
    double sp[N_KINDS];
    int m = 0, best = -1, ran = 0;
    for (int i = 0; i < n; i++)
        if (!cells[i].failed && cells[i].runs > 1)
            sp[m++] = cells[i].auc.max - cells[i].auc.min;
    double spread = m ? study_stats(sp, m).median : NAN;
    for (int i = 0; i < n; i++) {
        if (cells[i].failed || !cells[i].runs)
            continue;
        ran++;
        if (best < 0) {
            best = i;
            continue;
        }
        const cell *a = &cells[best], *b = &cells[i];
        const char *pick = study_pick(a->kind, b->kind, b->auc.median - a->auc.median, spread,
                                      b->train_s.median / a->train_s.median);
        if (pick == b->kind)
            best = i;
    }
    if (ran < 2) {
        reason(v, "Fewer than two strategies finished: nothing to compare.");
        return;
    }
    if (!isfinite(spread)) {
        reason(v, "One seed ran, so the spread of AUC between seeds is not measured and no "
                  "strategy is recommended (--repeats 2 or more measures it); the figures "
                  "stand as measured.");
    } else {
        v->kind = cells[best].kind;
        reason(v, "%s: AUC %.4f (log loss %.4f), %.0f samples/s, %.2f s of training; the "
                  "spread of AUC between seeds measured here is %.4f, and a time within %.0f "
                  "%% is a tie.",
               v->kind, cells[best].auc.median, cells[best].logloss.median,
               cells[best].sps.median, cells[best].train_s.median, spread,
               100 * STUDY_TIME_TOLERANCE);
    }
    for (int i = 0; i < n; i++)
        if (!cells[i].failed && cells[i].runs && i != best)
            reason(v, "%s: AUC %+.4f, %.2fx the training time, %.2fx the bytes a step of %s.",
                   cells[i].kind, cells[i].auc.median - cells[best].auc.median,
                   cells[i].train_s.median / cells[best].train_s.median,
                   cells[i].bytes.median / cells[best].bytes.median, cells[best].kind);
    double err_sum = 0;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (!cells[i].failed && cells[i].runs && isfinite(cells[i].predicted)) {
            err_sum += fabs(cells[i].predicted / cells[i].bytes.median - 1);
            k++;
        }
    if (k)
        reason(v, "The cost model's bytes per step per worker (sparse traffic from the ids' "
                  "Zipf law) are within %.1f %% of the measured in the mean; the measured "
                  "include heartbeats and epoch reports.",
               100 * err_sum / k);
    reason(v, "On %s the tasks share its cores, so samples/s says what each strategy costs "
              "here, not what a cluster of machines would give.",
           S->cluster.description);
}

/* ------------------------------------------------------------- the outputs */

static int write_outputs(const study *S, const cell *cells, int n, const verdict *v, double wall,
                         dp_err *err)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "experiment", "sparse");
    cJSON_AddStringToObject(root, "cluster", S->cluster.description);
    cJSON_AddNumberToObject(root, "cores", study_cores());
    cJSON_AddStringToObject(root, "data", S->data);
    cJSON_AddStringToObject(root, "model", S->model);
    cJSON_AddNumberToObject(root, "params", (double)S->n_params);
    cJSON_AddNumberToObject(root, "sparse_tables", S->sp.tables);
    cJSON_AddNumberToObject(root, "table_floats", (double)S->sp.table_floats);
    cJSON_AddNumberToObject(root, "workers", (double)S->workers);
    cJSON_AddNumberToObject(root, "ps", (double)S->ps);
    cJSON_AddNumberToObject(root, "batch", (double)S->batch);
    cJSON_AddNumberToObject(root, "epochs", (double)S->epochs);
    cJSON_AddNumberToObject(root, "train_records", (double)S->train);
    cJSON_AddNumberToObject(root, "steps_per_worker", (double)S->steps);
    cJSON_AddNumberToObject(root, "repeats", (double)S->repeats);
    cJSON_AddNumberToObject(root, "wall_seconds", wall);
    cJSON *arr = cJSON_AddArrayToObject(root, "cells");
    for (int i = 0; i < n; i++) {
        const cell *c = &cells[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "strategy", c->kind);
        if (c->failed) {
            cJSON_AddStringToObject(o, "status", "failed");
            cJSON_AddStringToObject(o, "reason", c->why);
        } else {
            cJSON_AddStringToObject(o, "status", "done");
            cJSON_AddItemToObject(o, "test_auc", study_stat_json(c->auc));
            cJSON_AddItemToObject(o, "test_log_loss", study_stat_json(c->logloss));
            cJSON_AddItemToObject(o, "samples_per_second", study_stat_json(c->sps));
            cJSON_AddItemToObject(o, "train_seconds", study_stat_json(c->train_s));
            cJSON_AddItemToObject(o, "bytes_per_step_per_worker", study_stat_json(c->bytes));
        }
        if (isfinite(c->predicted))
            cJSON_AddNumberToObject(o, "predicted_bytes_per_step_per_worker", c->predicted);
        cJSON_AddBoolToObject(o, "tables_by_rows", c->by_rows);
        cJSON_AddItemToArray(arr, o);
    }
    cJSON *rec = cJSON_AddObjectToObject(root, "recommendation");
    if (v->kind)
        cJSON_AddStringToObject(rec, "strategy", v->kind);
    else
        cJSON_AddNullToObject(rec, "strategy");
    cJSON *rs = cJSON_AddArrayToObject(rec, "reasons");
    for (int i = 0; i < v->n; i++)
        cJSON_AddItemToArray(rs, cJSON_CreateString(v->reasons[i]));
    if (study_write_results(S->out, root, err) < 0)
        return -1;

    dp_report *r;
    if (dp_report_open(&r, "Sparse tables: parameter servers against all-reduce", err) < 0)
        return -1;
    char para[1024];
    snprintf(para, sizeof para,
             "%s (%zu parameters, %d sparse table(s) of %zu floats) on %s, batch %ld a worker, "
             "%ld epoch(s) of %ld records, %ld worker(s)%s, on %s; %ld run(s) a strategy "
             "(medians). Bytes are each worker's sent + received a step, measured by the "
             "transport and predicted by the cost model.",
             S->model, S->n_params, S->sp.tables, S->sp.table_floats, S->data, S->batch,
             S->epochs, S->train, S->workers, S->ps ? " (+ a chief and the ps tasks under ps-*)" : "",
             S->cluster.description, S->repeats);
    int bad = dp_report_add_paragraph(r, para);
    enum { COLS = 7 };
    const char *head[COLS] = {"strategy", "test AUC", "test log loss", "samples/s",
                              "bytes/step/worker", "predicted", "tables"};
    const char *cellp[N_KINDS * COLS];
    char store[N_KINDS * COLS][48];
    for (int i = 0; i < n; i++) {
        const cell *c = &cells[i];
        char(*s)[48] = store + i * COLS;
        snprintf(s[0], 48, "%s", c->kind);
        if (c->failed) {
            for (int k = 1; k < COLS; k++)
                snprintf(s[k], 48, "%s", k == 1 ? "failed" : "-");
        } else {
            snprintf(s[1], 48, "%.4f", c->auc.median);
            snprintf(s[2], 48, "%.4f", c->logloss.median);
            snprintf(s[3], 48, "%.0f", c->sps.median);
            snprintf(s[4], 48, "%.0f", c->bytes.median);
            snprintf(s[5], 48, "%.0f", c->predicted);
            snprintf(s[6], 48, "%s", c->by_rows ? "by rows" : "whole");
        }
        for (int k = 0; k < COLS; k++)
            cellp[i * COLS + k] = s[k];
    }
    bad |= dp_report_add_table(r, "Per strategy", COLS, head, n, cellp);
    snprintf(para, sizeof para, "Recommendation: %s.", v->kind ? v->kind : "none");
    bad |= dp_report_add_paragraph(r, para);
    for (int i = 0; i < v->n; i++)
        bad |= dp_report_add_paragraph(r, v->reasons[i]);
    if (bad) {
        dp_report_free(r);
        return dp_errf(err, "report: out of memory");
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < cells[i].runs; k++)
            if (dp_report_add_run(r, cells[i].metrics[k], cells[i].kind, err) < 0) {
                dp_report_free(r);
                return -1;
            }
    char path[4200];
    snprintf(path, sizeof path, "%s/report.html", S->out);
    int rc = dp_report_write(r, path, err);
    dp_report_free(r);
    return rc;
}

/* The set, written unless --data names one. */
static int make_data(study *S, char *dir, size_t cap)
{
    snprintf(dir, cap, "%s/data", S->out);
    study_argv a;
    study_argv_init(&a);
    int bad = study_argv_add(&a, "/proc/self/exe") |
              study_argv_add_words(&a, "data synth ctr --force --seed 1 --to") |
              study_argv_add(&a, dir) | add_num(&a, "--rows", S->rows) |
              add_num(&a, "--test-rows", S->test_rows) | add_num(&a, "--ids", S->ids);
    char z[32];
    snprintf(z, sizeof z, "%g", S->zipf);
    bad |= study_argv_add(&a, "--zipf") | study_argv_add(&a, z);
    char log[4200];
    snprintf(log, sizeof log, "%s/runs/data.log", S->out);
    dp_err err;
    double wall;
    int rc = bad ? -1 : study_spawn(&a, log, 3600, &wall, &err);
    if (rc != 0) {
        fprintf(stderr, "downpour experiment sparse: writing the set failed (%s)\n",
                bad ? "command line too long" : rc < 0 ? err.msg : log);
        study_log_tail(stderr, log, 12);
        return -1;
    }
    printf("wrote the set to %s in %.1f s\n", dir, wall);
    return 0;
}

int dp_experiment_sparse(int argc, char **argv)
{
    study S;
    memset(&S, 0, sizeof S);
    const char *out = NULL, *data = NULL, *model = NULL, *runs = "ps-async,ps-sync,allreduce,allreduce-dense";
    long rows = 20000, test_rows = 2000, ids = 1000, workers = 2, ps = 2, batch = 64, epochs = 1,
         repeats = 2;
    double zipf = 1.1;
    study_cluster_opts copts;
    study_cluster_opts_init(&copts);
    const cli_opt opts[] = {
        {"out", CLI_STR, &out, "DIR", "where results.json, report.html, data/ and runs/ go", 0, 0},
        {"data", CLI_STR, &data, "DIR", "a click-through set to train on (default: written to DIR/data)", 0, 0},
        {"rows", CLI_INT, &rows, "N", "the set's training records (written here)", 100, 1L << 31},
        {"test-rows", CLI_INT, &test_rows, "N", "its test records", 10, 1L << 31},
        {"ids", CLI_INT, &ids, "N", "ids of each of its 8 categorical features", 2, 1L << 24},
        {"zipf", CLI_NUM, &zipf, "S", "the ids' Zipf exponent (the set's, for the cost model)", 0.01, 10},
        {"model", CLI_STR, &model, "SPEC", "the model (default: wide-deep's shape for the set)", 0, 0},
        {"runs", CLI_STR, &runs, "LIST", "of ps-async, ps-sync, allreduce, allreduce-dense", 0, 0},
        {"workers", CLI_INT, &workers, "N", "workers (allreduce: replicas)", 1, 64},
        {"ps", CLI_INT, &ps, "N", "ps tasks under ps-async and ps-sync", 1, 64},
        {"batch", CLI_INT, &batch, "N", "records a step a worker", 1, 1 << 20},
        {"epochs", CLI_INT, &epochs, "N", "epochs a run", 1, 1000},
        {"repeats", CLI_INT, &repeats, "N", "runs a strategy, seeds 1..N (medians; 2 or more for a verdict)", 1, MAX_REPEATS},
        STUDY_CLUSTER_CLI_OPTS(copts),
    };
    int pr = study_parse("sparse", USAGE, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv,
                         &out);
    if (pr >= 0)
        return pr;
    dp_err err;
    char kbuf[128];
    const char *kinds[STUDY_MAX_LIST];
    int nk;
    if (study_split_list("runs", runs, kbuf, sizeof kbuf, kinds, &nk, ok_kind, &err) < 0 ||
        study_cluster_setup(&S.cluster, &copts, &err) < 0) {
        fprintf(stderr, "downpour experiment sparse: %s\n", err.msg);
        return 2;
    }
    if (nk > N_KINDS) {
        fprintf(stderr, "downpour experiment sparse: --runs: at most %d strategies\n", N_KINDS);
        return 2;
    }
    if (study_prepare_out(out, &err) < 0) {
        fprintf(stderr, "downpour experiment sparse: %s\n", err.msg);
        return 1;
    }
    S.out = out;
    S.rows = rows;
    S.test_rows = test_rows;
    S.ids = ids;
    S.zipf = zipf;
    S.workers = workers;
    S.ps = ps;
    S.batch = batch;
    S.epochs = epochs;
    S.repeats = repeats;
    char spec[1024], dir[4200];
    if (!model) {
        /* wide-deep (docs/models.md) with the set's ids */
        size_t used = (size_t)snprintf(spec, sizeof spec, "12");
        for (int f = 0; f < 8; f++)
            used += (size_t)snprintf(spec + used, sizeof spec - used, "-bag%ldx16", ids);
        snprintf(spec + used, sizeof spec - used, "-res(dense64-relu-dense32-relu-dense1|dense1)-bce");
        model = spec;
    }
    S.model = model;
    if (!data) {
        if (make_data(&S, dir, sizeof dir) < 0)
            return 1;
        data = dir;
    }
    S.data = data;
    if (describe_model(&S, &err) < 0) {
        fprintf(stderr, "downpour experiment sparse: --model: %s\n", err.msg);
        return 2;
    }
    /* a tenth validates; each worker's share, in steps */
    S.val = rows / 10;
    S.train = rows - S.val;
    long share = (S.train + workers - 1) / workers;
    S.steps = (share + batch - 1) / batch * epochs;
    cell cells[N_KINDS];
    memset(cells, 0, sizeof cells);
    for (int i = 0; i < nk; i++) {
        cells[i].kind = kinds[i];
        cells[i].predicted = predict(&S, &cells[i]);
    }
    printf("downpour experiment sparse: %d run(s) of %s on %s; outputs in %s\n",
           nk * (int)repeats, S.model, S.cluster.description, out);
    fflush(stdout);
    double t0 = dp_now();
    int done = 0, failed = 0;
    for (int i = 0; i < nk; i++) {
        run_cell(&S, &cells[i], &done, nk * (int)repeats);
        failed += cells[i].failed;
    }
    double wall = dp_now() - t0;
    verdict v;
    recommend(&S, cells, nk, &v);
    int rc = failed ? 1 : 0;
    if (write_outputs(&S, cells, nk, &v, wall, &err) < 0) {
        fprintf(stderr, "downpour experiment sparse: %s\n", err.msg);
        rc = 1;
    }
    printf("\n%-16s %8s %9s %10s %12s %12s %8s\n", "strategy", "AUC", "log loss", "samples/s",
           "bytes/step", "predicted", "tables");
    for (int i = 0; i < nk; i++) {
        const cell *c = &cells[i];
        if (c->failed)
            printf("%-16s failed: %s\n", c->kind, c->why);
        else
            printf("%-16s %8.4f %9.4f %10.0f %12.0f %12.0f %8s\n", c->kind, c->auc.median,
                   c->logloss.median, c->sps.median, c->bytes.median, c->predicted,
                   c->by_rows ? "by rows" : "whole");
    }
    printf("\nRecommendation: %s\n", v.kind ? v.kind : "none");
    for (int i = 0; i < v.n; i++)
        printf("  - %s\n", v.reasons[i]);
    printf("Study wall time: %.1f s; wrote %s/results.json and %s/report.html\n", wall, out, out);
    return rc;
}
