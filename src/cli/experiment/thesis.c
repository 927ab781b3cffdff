/* downpour experiment thesis: the source experiment in one command
 * (docs/experiments.md).  Twelve runs, MNIST, Fashion-MNIST and KMNIST x
 * parameter servers (a chief, 6 workers, 2 ps) and all-reduce (9 replicas) x
 * batch 128 and 256, 25 epochs each, then DIR/results.json and
 * DIR/report.html: the source's figures beside ours, per-epoch validation
 * accuracy, resource use, the runs' charts, and a recommendation computed
 * from the measurements. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "downpour/clock.h"
#include "downpour/cost_model.h"
#include "downpour/dataset.h"
#include "downpour/file.h"
#include "downpour/report.h"
#include "downpour/strategy.h"
#include "cli/experiment/experiment.h"
#include "cli/experiment/study.h"

#define USAGE                                                                                  \
    "downpour experiment thesis --out DIR [--epochs N] [--datasets LIST] [--strategies LIST]\n" \
    "                           [--batches LIST] [--repeats N] [--train-size N] [--val-size N]\n" \
    "                           [--hosts N --link-mbit B [--delay-ms D]]\n"                     \
    "\n"                                                                                       \
    "Runs the source experiment (a 2022 TensorFlow thesis on nine 4-core VMs) on this\n"         \
    "machine: every dataset x strategy x batch, each as `downpour launch` of the source's\n"    \
    "cluster (parameter servers: a chief, 6 workers, 2 ps; all-reduce: 9 replicas), with\n"    \
    "one hyperparameter rule per strategy and batch (docs/experiments.md), then writes\n"     \
    "DIR/results.json and DIR/report.html, and each run's metrics and log under DIR/runs.\n" \
    "A dataset whose files are missing (KMNIST is not fetched automatically) is reported\n"  \
    "as absent with how to get it. LIST is comma-separated: --datasets mnist,fashion-mnist."

/* The source's figures (MISSION: the reference experiment). */
typedef struct source_cell {
    const char *dataset;
    const char *layout; /* "ps" or "allreduce" */
    int batch;
    double test_accuracy, train_seconds;
} source_cell;

static const source_cell SOURCE[] = {
    {"mnist", "ps", 128, 0.9804, 173.9},          {"mnist", "ps", 256, 0.9838, 107.2},
    {"mnist", "allreduce", 128, 0.9804, 144.7},   {"mnist", "allreduce", 256, 0.9780, 85.6},
    {"fashion-mnist", "ps", 128, 0.8862, 121.2},  {"fashion-mnist", "ps", 256, 0.8920, 89.2},
    {"fashion-mnist", "allreduce", 128, 0.8577, 259.3},
    {"fashion-mnist", "allreduce", 256, 0.8592, 202.3},
    {"kmnist", "ps", 128, 0.8758, 125.6},         {"kmnist", "ps", 256, 0.8855, 82.7},
    {"kmnist", "allreduce", 128, 0.8687, 145.9},  {"kmnist", "allreduce", 256, 0.8538, 75.1},
};

/* One hyperparameter rule per strategy and batch size, the same for every
 * dataset (docs/experiments.md says how they were chosen).  warmup: the
 * rule's warm-up epochs, given only to runs of at least 10 times as many
 * epochs (a study shortened by --epochs runs without it: a one-epoch run
 * would otherwise be all warm-up). */
typedef struct rule {
    const char *strategy;
    int batch;
    const char *options;
    int warmup;
} rule;

static const rule RULES[] = {
    {"ps-async", 128, "--optimizer adam --lr 0.001 --lr-schedule cosine --keep-best", 0},
    {"ps-async", 256, "--optimizer adam --lr 0.001 --lr-schedule cosine --keep-best", 0},
    {"ps-sync", 128, "--optimizer adam --lr 0.005 --lr-schedule cosine --keep-best", 0},
    {"ps-sync", 256,
     "--optimizer adamw --lr 0.016 --weight-decay 0.2 --clip-norm 1 --lr-schedule cosine "
     "--keep-best",
     1},
    {"allreduce", 128, "--optimizer adam --lr 0.003 --lr-schedule cosine --keep-best", 0},
    {"allreduce", 256, "--optimizer adam --lr 0.006 --lr-schedule cosine --keep-best", 0},
};

static const char *const DATASETS[] = {"mnist", "fashion-mnist", "kmnist"};

static const char *model_of(const char *dataset)
{
    /* Model 1 for MNIST; Models 2 and 3 (784-128-10) for the others */
    return strcmp(dataset, "mnist") == 0 ? "mlp-300-100" : "mlp-128";
}

/* The source's two layouts: one with ps tasks (the strategy table says
 * whose), or the replicas alone. */
static const char *layout_of(const char *strategy)
{
    dp_err ignored;
    const dp_strategy_ops *ops = dp_strategy_find(strategy, &ignored);
    return ops && (ops->needs & DP_ROLE_BIT(DP_ROLE_PS)) ? "ps" : "allreduce";
}

static const source_cell *source_of(const char *dataset, const char *strategy, int batch)
{
    for (size_t i = 0; i < sizeof SOURCE / sizeof SOURCE[0]; i++)
        if (!strcmp(SOURCE[i].dataset, dataset) && !strcmp(SOURCE[i].layout, layout_of(strategy)) &&
            SOURCE[i].batch == batch)
            return &SOURCE[i];
    return NULL;
}

static const rule *rule_of(const char *strategy, int batch)
{
    for (size_t i = 0; i < sizeof RULES / sizeof RULES[0]; i++)
        if (!strcmp(RULES[i].strategy, strategy) && RULES[i].batch == batch)
            return &RULES[i];
    return NULL;
}

static int ok_dataset(const char *s)
{
    for (size_t i = 0; i < sizeof DATASETS / sizeof DATASETS[0]; i++)
        if (!strcmp(s, DATASETS[i]))
            return 1;
    return 0;
}

/* Those the thesis has rules for (RULES). */
static int ok_strategy(const char *s)
{
    for (size_t i = 0; i < sizeof RULES / sizeof RULES[0]; i++)
        if (!strcmp(RULES[i].strategy, s))
            return 1;
    return 0;
}

static int ok_batch(const char *s)
{
    return !strcmp(s, "128") || !strcmp(s, "256");
}

/* ---------------------------------------------------------------- a cell */

#define MAX_REPEATS 9

typedef struct cell {
    const char *dataset, *strategy;
    int batch;
    const source_cell *src;
    const rule *rule;
    enum { CELL_DONE, CELL_ABSENT, CELL_FAILED } status;
    char why[512];           /* absent or failed: the reason */
    int runs;
    study_run run[MAX_REPEATS];
    char metrics[MAX_REPEATS][4400];
    study_stat acc, train_s, wall_s;
    double val_median[STUDY_MAX_EPOCHS]; /* per epoch, over repeats */
    int epochs;
    double cpu, rss_mib, net_mb;         /* medians over repeats */
    double predicted_s;                  /* the cost model's training time; NAN: none */
} cell;

typedef struct thesis {
    const char *out;
    long epochs, repeats, train_size, val_size;
    study_cluster cluster;
    char prediction_note[1024]; /* how the cost model was calibrated, or why not */
    double prediction_mae;     /* mean absolute relative error over the cells */
    int n_cells;
    cell cells[3 * 3 * 2];
    double wall;
} thesis;

static int build_command(const thesis *T, const cell *c, int seed, const char *metrics,
                         study_argv *a, dp_err *err)
{
    char buf[64];
    int ps_layout = !strcmp(layout_of(c->strategy), "ps");
    if (study_cluster_command(&T->cluster, a, true, ps_layout ? 6 : 8, ps_layout ? 2 : 0, err) <
        0)
        return -1;
    int bad = study_argv_add(a, "train") | study_argv_add(a, "--strategy") |
              study_argv_add(a, c->strategy) | study_argv_add(a, "--dataset") |
              study_argv_add(a, c->dataset) | study_argv_add(a, "--model") |
              study_argv_add(a, model_of(c->dataset)) | study_argv_add(a, "--batch");
    snprintf(buf, sizeof buf, "%d", c->batch);
    bad |= study_argv_add(a, buf) | study_argv_add(a, "--epochs");
    snprintf(buf, sizeof buf, "%ld", T->epochs);
    bad |= study_argv_add(a, buf) | study_argv_add(a, "--seed");
    snprintf(buf, sizeof buf, "%d", seed);
    bad |= study_argv_add(a, buf) | study_argv_add(a, "--train-size");
    snprintf(buf, sizeof buf, "%ld", T->train_size);
    bad |= study_argv_add(a, buf) | study_argv_add(a, "--val-size");
    snprintf(buf, sizeof buf, "%ld", T->val_size);
    bad |= study_argv_add(a, buf) | study_argv_add_words(a, c->rule->options);
    if (c->rule->warmup && T->epochs >= 10L * c->rule->warmup) {
        snprintf(buf, sizeof buf, "%d", c->rule->warmup);
        bad |= study_argv_add(a, "--warmup-epochs") | study_argv_add(a, buf);
    }
    bad |= study_argv_add_words(a, "--log-every 0 --no-progress --metrics") |
           study_argv_add(a, metrics);
    if (bad)
        return dp_errf(err, "command line too long");
    return 0;
}

/* Runs a cell's repeats; a failed run marks the cell failed and the study
 * goes on with the others. */
static void run_cell(thesis *T, cell *c, int *done_runs, int total_runs)
{
    for (int r = 0; r < T->repeats; r++) {
        char log[4400];
        char *metrics = c->metrics[r];
        snprintf(metrics, sizeof c->metrics[r], "%s/runs/%s-%s-b%d-r%d.jsonl", T->out, c->dataset,
                 c->strategy, c->batch, r + 1);
        snprintf(log, sizeof log, "%s/runs/%s-%s-b%d-r%d.log", T->out, c->dataset, c->strategy,
                 c->batch, r + 1);
        study_argv a;
        dp_err err;
        (*done_runs)++;
        if (build_command(T, c, r + 1, metrics, &a, &err) < 0) {
            c->status = CELL_FAILED;
            snprintf(c->why, sizeof c->why, "%s", err.msg);
            return;
        }
        study_run *run = &c->run[c->runs];
        char label[96];
        snprintf(label, sizeof label, "%s %s b%d", c->dataset, c->strategy, c->batch);
        if (study_run_one(&a, metrics, log, 3 * 3600, label, r + 1, run, c->why,
                          sizeof c->why) < 0) {
            c->status = CELL_FAILED;
            return;
        }
        c->runs++;
        printf("[%d/%d] %-13s %-9s b%d seed %d: test accuracy %.4f (source %.4f), train %.1f s, "
               "wall %.1f s\n",
               *done_runs, total_runs, c->dataset, c->strategy, c->batch, r + 1,
               run->test_accuracy, c->src->test_accuracy, run->train_seconds, run->wall_seconds);
        fflush(stdout);
    }
    c->status = CELL_DONE;
}

/* Medians over a cell's repeats. */
static void summarise(cell *c)
{
    double v[MAX_REPEATS];
    int n = c->runs;
    for (int i = 0; i < n; i++)
        v[i] = c->run[i].test_accuracy;
    c->acc = study_stats(v, n);
    for (int i = 0; i < n; i++)
        v[i] = c->run[i].train_seconds;
    c->train_s = study_stats(v, n);
    for (int i = 0; i < n; i++)
        v[i] = c->run[i].wall_seconds;
    c->wall_s = study_stats(v, n);
    for (int i = 0; i < n; i++)
        v[i] = c->run[i].cpu_percent_mean;
    c->cpu = study_stats(v, n).median;
    for (int i = 0; i < n; i++)
        v[i] = c->run[i].rss_bytes / (1 << 20);
    c->rss_mib = study_stats(v, n).median;
    for (int i = 0; i < n; i++)
        v[i] = c->run[i].net_bytes / 1e6;
    c->net_mb = study_stats(v, n).median;
    c->epochs = n ? c->run[0].epochs : 0;
    for (int i = 1; i < n; i++)
        if (c->run[i].epochs < c->epochs)
            c->epochs = c->run[i].epochs;
    for (int e = 0; e < c->epochs; e++) {
        for (int i = 0; i < n; i++)
            v[i] = c->run[i].val_accuracy[e];
        c->val_median[e] = study_stats(v, n).median;
    }
}

/* The source trained 25 epochs; a shorter study measures another thing
 * (accuracy after fewer epochs), so it draws no verdict against it. */
#define SOURCE_EPOCHS 25
/* Training times within this fraction of each other are "about the same":
 * a 1.00x ratio is no win, and run-to-run noise is a few per cent. */
#define TIME_TOLERANCE STUDY_TIME_TOLERANCE
/* A mean prediction error above this draws a caveat beside the figures. */
#define PREDICTION_CAVEAT 0.25

static bool comparable_to_source(const thesis *T)
{
    return T->epochs >= SOURCE_EPOCHS;
}

/* ------------------------------------------------- the cost model's error */

/* Predicts each finished cell's training time with the cost model
 * (docs/cost_model.md) from a one-thread calibration run of Model 1 and the
 * measured loopback link, and sets each cell's predicted_s and T's mean
 * absolute error, so the report shows how far the model is from this
 * cluster's own measurements.  Local runs only: on a virtual cluster the
 * hosts share this machine's cores, which the model does not describe. */
static void predict_cells(thesis *T)
{
    T->prediction_mae = NAN;
    for (int i = 0; i < T->n_cells; i++)
        T->cells[i].predicted_s = NAN;
    if (T->cluster.hosts > 0) {
        snprintf(T->prediction_note, sizeof T->prediction_note,
                 "No cost-model predictions: on a virtual cluster every host shares this "
                 "machine's %d cores, which the model does not describe.", study_cores());
        return;
    }
    char metrics[4400], log[4400];
    snprintf(metrics, sizeof metrics, "%s/runs/calibration.jsonl", T->out);
    snprintf(log, sizeof log, "%s/runs/calibration.log", T->out);
    study_argv a;
    study_argv_init(&a);
    dp_err err;
    double wall;
    dp_cost_calibration cal;
    dp_cost_calibration_init(&cal);
    double bw, lat;
    int cb;
    if (study_argv_add(&a, "/proc/self/exe") ||
        study_argv_add_words(&a, "train --dataset mnist --model mlp-300-100 --batch 128 --epochs 1 "
                                 "--train-size 12800 --val-size 0 --test-size 1000 --threads 1 "
                                 "--quiet --no-progress --metrics") ||
        study_argv_add(&a, metrics) || study_spawn(&a, log, 600, &wall, &err) != 0 ||
        dp_cost_calibrate_from_metrics(metrics, &cal, &cb, &err) < 0 ||
        dp_cost_measure_loopback(&bw, &lat, &err) < 0) {
        snprintf(T->prediction_note, sizeof T->prediction_note,
                 "No cost-model predictions: the calibration failed (%.300s; log: %.100s).",
                 err.msg, log);
        return;
    }
    double sum = 0;
    int n = 0;
    for (int i = 0; i < T->n_cells; i++) {
        cell *c = &T->cells[i];
        if (c->status != CELL_DONE)
            continue;
        dp_cost_calibration k = cal;
        size_t np;
        if (dp_cost_model_params(model_of(c->dataset), &np, &err) < 0)
            continue;
        k.sample_s = cal.sample_s * (double)np / (double)cal.n_params; /* ~ multiply-adds */
        k.n_params = np;
        int ps_layout = !strcmp(layout_of(c->strategy), "ps");
        dp_cost_cluster cl = {.hosts = 1, .cores = study_cores(), .bandwidth = bw, .latency = lat,
                              .workers = ps_layout ? 6 : 8, .ps = ps_layout ? 2 : 0, .chief = 1};
        dp_cost_job job;
        dp_cost_job_init(&job);
        int modelled = dp_cost_strategy_parse(c->strategy);
        job.strategy = modelled >= 0 ? (dp_cost_strategy)modelled : DP_COST_ALLREDUCE;
        job.batch = c->batch;
        job.epochs = (int)T->epochs;
        job.train_records = T->train_size;
        job.val_records = T->val_size;
        dp_cost_prediction p;
        if (dp_cost_predict(&k, &cl, &job, &p, &err) < 0)
            continue;
        c->predicted_s = p.total_s;
        sum += fabs(p.total_s - c->train_s.median) / c->train_s.median;
        n++;
    }
    if (n)
        T->prediction_mae = sum / n;
    snprintf(T->prediction_note, sizeof T->prediction_note,
             "Predicted: the cost model (docs/cost_model.md) for this machine (%d cores, "
             "loopback %.0f MB/s, %.0f us one way), calibrated by one epoch of 12,800 records "
             "on one thread (%.2f us a record for mlp-300-100). Its mean absolute error over "
             "the %d cells: %.0f %%.%s",
             study_cores(), bw / 1e6, lat * 1e6, cal.sample_s * 1e6, n, 100 * T->prediction_mae,
             T->prediction_mae <= PREDICTION_CAVEAT ? ""
             : comparable_to_source(T)
                 ? " That error is large: the model does not describe this machine's runs "
                   "well, so read its times as rough guides, not predictions."
                 : " That error is large: the model does not describe this machine's runs "
                   "well (a short run is dominated by start-up, which the model leaves "
                   "out), so read its times as rough guides, not predictions.");
}

/* ------------------------------------------------------ the recommendation */

typedef struct verdict {
    const char *strategy;  /* NULL: no comparison possible */
    char reasons[6][400];
    int n_reasons;
} verdict;

static void add_reason(verdict *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_reason(verdict *v, const char *fmt, ...)
{
    if (v->n_reasons >= 6)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->reasons[v->n_reasons++], sizeof v->reasons[0], fmt, ap);
    va_end(ap);
}

/* The spread between seeds, measured: the median over finished cells of
 * (max - min) test accuracy; NAN with one seed (nothing measured). */
static double seed_spread(const thesis *T)
{
    double sp[64];
    int n = 0;
    for (int i = 0; i < T->n_cells && n < 64; i++)
        if (T->cells[i].status == CELL_DONE && T->cells[i].acc.n > 1)
            sp[n++] = T->cells[i].acc.max - T->cells[i].acc.min;
    return n ? study_stats(sp, n).median : NAN;
}

/* Compares the parameter-server strategy with all-reduce over the cells
 * both finished (same dataset and batch): accuracy first, where one is
 * better by more than the spread between seeds measured in this study,
 * then training time, where one is more than TIME_TOLERANCE faster.  A
 * study shorter than the source's 25 epochs, or of one seed, draws no
 * verdict from accuracy it cannot compare or noise it has not measured. */
static void recommend(const thesis *T, verdict *v)
{
    memset(v, 0, sizeof *v);
    const char *ps = NULL;
    for (int i = 0; i < T->n_cells; i++)
        if (strcmp(T->cells[i].strategy, "allreduce") && T->cells[i].status == CELL_DONE)
            ps = T->cells[i].strategy;
    double dacc[18], ratio[18];
    int n = 0, ar_more_acc = 0, ps_met = 0, ar_met = 0;
    for (int i = 0; i < T->n_cells; i++) {
        const cell *a = &T->cells[i];
        if (!ps || strcmp(a->strategy, ps) || a->status != CELL_DONE)
            continue;
        for (int j = 0; j < T->n_cells && n < 18; j++) {
            const cell *b = &T->cells[j];
            if (strcmp(b->strategy, "allreduce") || b->status != CELL_DONE ||
                strcmp(a->dataset, b->dataset) || a->batch != b->batch)
                continue;
            dacc[n] = b->acc.median - a->acc.median;
            ratio[n] = b->train_s.median / a->train_s.median;
            ar_more_acc += dacc[n] > 0;
            ps_met += a->acc.median >= a->src->test_accuracy;
            ar_met += b->acc.median >= b->src->test_accuracy;
            n++;
        }
    }
    if (n == 0) {
        add_reason(v, "No dataset and batch size was run under both a parameter-server strategy "
                      "and all-reduce, so there is nothing to compare.");
        return;
    }
    bool full = comparable_to_source(T);
    double spread = seed_spread(T);
    study_stat sd = study_stats(dacc, n), sr = study_stats(ratio, n);
    bool time_tie = fabs(sr.median - 1) <= TIME_TOLERANCE;
    const char *faster = time_tie ? NULL : sr.median < 1 ? "allreduce" : ps;
    const char *more_acc = sd.median > 0 ? "allreduce" : ps;
    if (!full)
        add_reason(v, "A short run: %ld epoch(s) against the source's %d, so its accuracy "
                      "cannot be compared with the source's figures and no strategy is "
                      "recommended from it. Rerun with --epochs %d for a verdict.",
                   T->epochs, SOURCE_EPOCHS, SOURCE_EPOCHS);
    if (!isfinite(spread)) {
        add_reason(v, "Test accuracy: all-reduce minus %s is %+.2f points in the median over %d "
                      "cells (%+.2f to %+.2f). One seed ran, so the spread between seeds is "
                      "not measured and this difference decides nothing (--repeats 3 "
                      "measures it).",
                   ps, 100 * sd.median, n, 100 * sd.min, 100 * sd.max);
    } else if (fabs(sd.median) > spread) {
        add_reason(v, "%s reached the higher test accuracy in %d of %d comparable cells, by %.2f "
                      "points in the median (%+.2f to %+.2f, all-reduce minus %s), more than "
                      "the %.2f-point spread between seeds measured here.",
                   more_acc, sd.median > 0 ? ar_more_acc : n - ar_more_acc, n,
                   100 * fabs(sd.median), 100 * sd.min, 100 * sd.max, ps, 100 * spread);
    } else {
        add_reason(v, "Test accuracy is a tie: all-reduce minus %s is %+.2f points in the median "
                      "over %d cells (%+.2f to %+.2f), within the %.2f-point spread between "
                      "seeds measured here.",
                   ps, 100 * sd.median, n, 100 * sd.min, 100 * sd.max, 100 * spread);
    }
    if (time_tie)
        add_reason(v, "Training time is about the same: all-reduce took %.2fx the time of %s in "
                      "the median (%.2fx to %.2fx), within %.0f %%, on %s.",
                   sr.median, ps, sr.min, sr.max, 100 * TIME_TOLERANCE, T->cluster.description);
    else
        add_reason(v, "%s trained faster: all-reduce took %.2fx the time of %s in the median "
                      "(%.2fx to %.2fx) on %s.",
                   faster, sr.median, ps, sr.min, sr.max, T->cluster.description);
    if (full) /* accuracy first; tied within a measured spread, time decides */
        v->strategy = study_pick(ps, "allreduce", sd.median, spread, sr.median);
    if (full)
        add_reason(v, "Cells at or above the source's test accuracy: %s %d of %d, all-reduce %d "
                      "of %d.",
                   ps, ps_met, n, ar_met, n);
    if (v->strategy && faster && strcmp(v->strategy, faster) != 0)
        add_reason(v, "Accuracy comes first: the faster strategy's time gain (%.0f %%) does not "
                      "make up for lower accuracy in a study of accuracy.",
                   100 * fabs(1 - (sr.median < 1 ? sr.median : 1 / sr.median)));
    add_reason(v, "The source recommended on a cluster of nine 4-core VMs where all-reduce's "
                  "times ranged 75-259 s against 83-174 s for parameter servers; here, on %s, "
                  "communication costs differ, so the same measurements can favour another "
                  "strategy.",
               T->cluster.description);
}

/* ------------------------------------------------------------- the outputs */

static cJSON *num_or_null(double v)
{
    return isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull();
}

static int write_results(const thesis *T, const verdict *v, const char *dir, dp_err *err)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "experiment", "thesis");
    cJSON_AddStringToObject(root, "cluster", T->cluster.description);
    cJSON_AddNumberToObject(root, "cores", study_cores());
    cJSON_AddNumberToObject(root, "epochs", (double)T->epochs);
    cJSON_AddBoolToObject(root, "comparable_to_source", comparable_to_source(T));
    cJSON_AddNumberToObject(root, "repeats", (double)T->repeats);
    cJSON_AddNumberToObject(root, "train_size", (double)T->train_size);
    cJSON_AddNumberToObject(root, "val_size", (double)T->val_size);
    cJSON_AddNumberToObject(root, "wall_seconds", T->wall);
    cJSON *rules = cJSON_AddArrayToObject(root, "rules");
    for (size_t i = 0; i < sizeof RULES / sizeof RULES[0]; i++) {
        cJSON *r = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "strategy", RULES[i].strategy);
        cJSON_AddNumberToObject(r, "batch", RULES[i].batch);
        cJSON_AddStringToObject(r, "train_options", RULES[i].options);
        cJSON_AddNumberToObject(r, "warmup_epochs", RULES[i].warmup);
        cJSON_AddItemToArray(rules, r);
    }
    cJSON *cells = cJSON_AddArrayToObject(root, "cells");
    for (int i = 0; i < T->n_cells; i++) {
        const cell *c = &T->cells[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "dataset", c->dataset);
        cJSON_AddStringToObject(o, "model", model_of(c->dataset));
        cJSON_AddStringToObject(o, "strategy", c->strategy);
        cJSON_AddStringToObject(o, "layout", strcmp(layout_of(c->strategy), "ps")
                                                 ? "9 replicas (a chief and 8 workers)"
                                                 : "a chief, 6 workers, 2 ps");
        cJSON_AddNumberToObject(o, "batch", c->batch);
        cJSON_AddStringToObject(o, "status", c->status == CELL_DONE     ? "done"
                                             : c->status == CELL_ABSENT ? "absent"
                                                                        : "failed");
        if (c->status != CELL_DONE)
            cJSON_AddStringToObject(o, "reason", c->why);
        cJSON *src = cJSON_AddObjectToObject(o, "source");
        cJSON_AddNumberToObject(src, "test_accuracy", c->src->test_accuracy);
        cJSON_AddNumberToObject(src, "train_seconds", c->src->train_seconds);
        if (c->status == CELL_DONE) {
            cJSON_AddItemToObject(o, "test_accuracy", study_stat_json(c->acc));
            cJSON_AddItemToObject(o, "train_seconds", study_stat_json(c->train_s));
            cJSON_AddItemToObject(o, "wall_seconds", study_stat_json(c->wall_s));
            if (comparable_to_source(T))
                cJSON_AddBoolToObject(o, "meets_source", c->acc.median >= c->src->test_accuracy);
            else /* a short run: no verdict against 25-epoch figures */
                cJSON_AddNullToObject(o, "meets_source");
            cJSON *ve = cJSON_AddArrayToObject(o, "val_accuracy_per_epoch");
            for (int e = 0; e < c->epochs; e++)
                cJSON_AddItemToArray(ve, num_or_null(c->val_median[e]));
            cJSON_AddItemToObject(o, "cpu_percent_mean", num_or_null(c->cpu));
            cJSON_AddItemToObject(o, "memory_mib_total", num_or_null(c->rss_mib));
            cJSON_AddItemToObject(o, "network_mb_total", num_or_null(c->net_mb));
            cJSON_AddItemToObject(o, "predicted_train_seconds", num_or_null(c->predicted_s));
            cJSON_AddItemToObject(o, "prediction_error",
                                  num_or_null((c->predicted_s - c->train_s.median) /
                                              c->train_s.median));
            cJSON *runs = cJSON_AddArrayToObject(o, "runs");
            for (int r = 0; r < c->runs; r++) {
                cJSON *run = cJSON_CreateObject();
                cJSON_AddNumberToObject(run, "seed", r + 1);
                cJSON_AddStringToObject(run, "metrics", c->metrics[r] + strlen(T->out) + 1);
                cJSON_AddNumberToObject(run, "test_accuracy", c->run[r].test_accuracy);
                cJSON_AddNumberToObject(run, "train_seconds", c->run[r].train_seconds);
                cJSON_AddNumberToObject(run, "wall_seconds", c->run[r].wall_seconds);
                cJSON_AddItemToArray(runs, run);
            }
        }
        cJSON_AddItemToArray(cells, o);
    }
    cJSON *cm = cJSON_AddObjectToObject(root, "cost_model");
    cJSON_AddStringToObject(cm, "note", T->prediction_note);
    cJSON_AddItemToObject(cm, "mean_absolute_error", num_or_null(T->prediction_mae));
    cJSON *rec = cJSON_AddObjectToObject(root, "recommendation");
    if (v->strategy)
        cJSON_AddStringToObject(rec, "strategy", v->strategy);
    else
        cJSON_AddNullToObject(rec, "strategy");
    cJSON *reasons = cJSON_AddArrayToObject(rec, "reasons");
    for (int i = 0; i < v->n_reasons; i++)
        cJSON_AddItemToArray(reasons, cJSON_CreateString(v->reasons[i]));
    return study_write_results(dir, root, err);
}

static const char *fmt(char *buf, size_t cap, const char *f, double v)
{
    if (!isfinite(v))
        snprintf(buf, cap, "-");
    else
        snprintf(buf, cap, f, v);
    return buf;
}

static int write_report(const thesis *T, const verdict *v, const char *path, dp_err *err)
{
    dp_report *r;
    if (dp_report_open(&r, "The source experiment on downpour", err) < 0)
        return -1;
    char text[2048];
    snprintf(text, sizeof text,
             "%ld epoch(s) per run, %ld training and %ld validation records, %ld repeat(s) per "
             "cell (seeds 1..%ld; figures are medians, with the range when repeated), on %s. "
             "Parameter servers: a chief, 6 workers and 2 ps tasks; all-reduce: 9 replicas. The "
             "source: TensorFlow 2.8 on nine 4-core VMs, 25 epochs. The study took %.0f s.",
             T->epochs, T->train_size, T->val_size, T->repeats, T->repeats,
             T->cluster.description, T->wall);
    int bad = dp_report_add_paragraph(r, text);
    if (!comparable_to_source(T)) {
        snprintf(text, sizeof text,
                 "A short run: %ld epoch(s) against the source's %d. Its figures are shown "
                 "beside the source's, but accuracy after fewer epochs cannot be compared with "
                 "them, so no cell is marked below or above the source and no strategy is "
                 "recommended.",
                 T->epochs, SOURCE_EPOCHS);
        bad |= dp_report_add_paragraph(r, text);
    }

    bad |= dp_report_add_heading(r, "Recommendation");
    snprintf(text, sizeof text, "On this cluster: %s.",
             v->strategy ? v->strategy : "no recommendation (see why below)");
    bad |= dp_report_add_paragraph(r, text);
    for (int i = 0; i < v->n_reasons; i++)
        bad |= dp_report_add_paragraph(r, v->reasons[i]);

    /* the final figures beside the source's */
    enum { COLS = 13 };
    const char *head[COLS] = {"dataset", "strategy", "batch", "test accuracy", "source",
                              "difference", "train s", "source s", "wall s", "CPU % (mean/task)",
                              "memory MiB (sum)", "network MB (sum)", "predicted train s"};
    const char **cells = calloc((size_t)T->n_cells * COLS, sizeof *cells);
    char (*store)[96] = calloc((size_t)T->n_cells * COLS, sizeof *store);
    if (!cells || !store) {
        free(cells);
        free(store);
        dp_report_free(r);
        return dp_errf(err, "out of memory");
    }
    for (int i = 0; i < T->n_cells; i++) {
        const cell *c = &T->cells[i];
        char(*s)[96] = store + (size_t)i * COLS;
        const char **row = cells + (size_t)i * COLS;
        snprintf(s[0], 96, "%s (%s)", c->dataset, model_of(c->dataset));
        snprintf(s[1], 96, "%s", c->strategy);
        snprintf(s[2], 96, "%d", c->batch);
        snprintf(s[4], 96, "%.4f", c->src->test_accuracy);
        snprintf(s[7], 96, "%.1f", c->src->train_seconds);
        if (c->status != CELL_DONE) {
            snprintf(s[3], 96, "%s", c->status == CELL_ABSENT ? "absent" : "failed");
            for (int k = 5; k < COLS; k++)
                if (k != 7) /* the training time stays */
                    snprintf(s[k], 96, "-");
        } else {
            if (c->acc.n > 1)
                snprintf(s[3], 96, "%.4f (%.4f-%.4f)", c->acc.median, c->acc.min, c->acc.max);
            else
                snprintf(s[3], 96, "%.4f", c->acc.median);
            if (comparable_to_source(T))
                snprintf(s[5], 96, "%+.4f", c->acc.median - c->src->test_accuracy);
            else
                snprintf(s[5], 96, "n/a (%ld vs %d epochs)", T->epochs, SOURCE_EPOCHS);
            fmt(s[6], 96, "%.1f", c->train_s.median);
            fmt(s[8], 96, "%.1f", c->wall_s.median);
            fmt(s[9], 96, "%.1f", c->cpu);
            fmt(s[10], 96, "%.0f", c->rss_mib);
            fmt(s[11], 96, "%.1f", c->net_mb);
            if (isfinite(c->predicted_s))
                snprintf(s[12], 96, "%.1f (%+.0f %%)", c->predicted_s,
                         100 * (c->predicted_s - c->train_s.median) / c->train_s.median);
            else
                snprintf(s[12], 96, "-");
        }
        for (int k = 0; k < COLS; k++)
            row[k] = s[k];
    }
    bad |= dp_report_add_heading(r, "Test accuracy and time, beside the source");
    bad |= dp_report_add_table(r,
                               "Test accuracy after the last epoch (10,000 test records), "
                               "training time of the epoch loop, the whole command's wall time, "
                               "resource use summed or averaged over the run's tasks, and the "
                               "cost model's predicted training time with its error",
                               COLS, head, T->n_cells, cells);
    bad |= dp_report_add_paragraph(r, T->prediction_note);
    /* the cells that did not run, and why: an absent dataset once */
    for (int i = 0; i < T->n_cells; i++) {
        const cell *c = &T->cells[i];
        if (c->status == CELL_DONE ||
            (c->status == CELL_ABSENT && i > 0 && T->cells[i - 1].status == CELL_ABSENT &&
             !strcmp(T->cells[i - 1].dataset, c->dataset)))
            continue;
        if (c->status == CELL_ABSENT)
            snprintf(text, sizeof text, "%s is absent, so its cells did not run: %s", c->dataset,
                     c->why);
        else
            snprintf(text, sizeof text, "%s %s b%d failed: %s", c->dataset, c->strategy,
                     c->batch, c->why);
        bad |= dp_report_add_paragraph(r, text);
    }
    free(cells);
    free(store);

    /* per-epoch validation accuracy: one column per finished cell */
    int done = 0, max_e = 0;
    for (int i = 0; i < T->n_cells; i++)
        if (T->cells[i].status == CELL_DONE) {
            done++;
            if (T->cells[i].epochs > max_e)
                max_e = T->cells[i].epochs;
        }
    if (done > 0 && max_e > 0) {
        int cols = done + 1;
        const char **hd = calloc((size_t)cols, sizeof *hd);
        char (*hs)[64] = calloc((size_t)cols, sizeof *hs);
        const char **ep = calloc((size_t)cols * max_e, sizeof *ep);
        char (*es)[16] = calloc((size_t)cols * max_e, sizeof *es);
        if (hd && hs && ep && es) {
            hd[0] = "epoch";
            for (int e = 0; e < max_e; e++) {
                snprintf(es[(size_t)e * cols], 16, "%d", e + 1);
                ep[(size_t)e * cols] = es[(size_t)e * cols];
            }
            int k = 1;
            for (int i = 0; i < T->n_cells; i++) {
                const cell *c = &T->cells[i];
                if (c->status != CELL_DONE)
                    continue;
                snprintf(hs[k], 64, "%s %s b%d", c->dataset, c->strategy, c->batch);
                hd[k] = hs[k];
                for (int e = 0; e < max_e; e++) {
                    char *s = es[(size_t)e * cols + k];
                    fmt(s, 16, "%.4f", e < c->epochs ? c->val_median[e] : NAN);
                    ep[(size_t)e * cols + k] = s;
                }
                k++;
            }
            bad |= dp_report_add_heading(r, "Validation accuracy per epoch");
            char caption[128];
            snprintf(caption, sizeof caption,
                     "Validation accuracy on %ld records after each epoch (median over seeds)",
                     T->val_size);
            bad |= dp_report_add_table(r, caption, cols, hd, max_e, ep);
        } else {
            bad = -1;
        }
        free(hd);
        free(hs);
        free(ep);
        free(es);
    }
    if (bad) {
        dp_report_free(r);
        return dp_errf(err, "%s: out of memory", path);
    }
    for (int i = 0; i < T->n_cells; i++)
        for (int k = 0; k < T->cells[i].runs; k++) {
            char label[128];
            snprintf(label, sizeof label, "%s %s b%d", T->cells[i].dataset,
                     T->cells[i].strategy, T->cells[i].batch);
            if (T->repeats > 1)
                snprintf(label + strlen(label), sizeof label - strlen(label), " #%d", k + 1);
            if (dp_report_add_run(r, T->cells[i].metrics[k], label, err) < 0) {
                dp_report_free(r);
                return -1;
            }
        }
    int rc = dp_report_write(r, path, err);
    dp_report_free(r);
    return rc;
}

static void print_summary(const thesis *T, const verdict *v)
{
    printf("\n%-13s %-9s %5s  %-22s %7s %8s %8s %8s\n", "dataset", "strategy", "batch",
           "test accuracy", "source", "train_s", "source_s", "wall_s");
    for (int i = 0; i < T->n_cells; i++) {
        const cell *c = &T->cells[i];
        char acc[64];
        if (c->status != CELL_DONE)
            snprintf(acc, sizeof acc, "%s", c->status == CELL_ABSENT ? "absent" : "FAILED");
        else if (c->acc.n > 1)
            snprintf(acc, sizeof acc, "%.4f (%.4f-%.4f)", c->acc.median, c->acc.min, c->acc.max);
        else
            snprintf(acc, sizeof acc, "%.4f", c->acc.median);
        char tr[32], wa[32];
        fmt(tr, sizeof tr, "%.1f", c->status == CELL_DONE ? c->train_s.median : NAN);
        fmt(wa, sizeof wa, "%.1f", c->status == CELL_DONE ? c->wall_s.median : NAN);
        printf("%-13s %-9s %5d  %-22s %7.4f %8s %8.1f %8s%s\n", c->dataset, c->strategy,
               c->batch, acc, c->src->test_accuracy, tr, c->src->train_seconds, wa,
               comparable_to_source(T) && c->status == CELL_DONE &&
                       c->acc.median < c->src->test_accuracy
                   ? "  below source"
                   : "");
    }
    if (!comparable_to_source(T))
        printf("\nA short run: %ld epoch(s) against the source's %d; its figures are shown "
               "beside the source's but cannot be compared with them.\n",
               T->epochs, SOURCE_EPOCHS);
    printf("\n%s\n", T->prediction_note);
    printf("\nRecommendation: %s\n", v->strategy ? v->strategy : "none");
    for (int i = 0; i < v->n_reasons; i++)
        printf("  - %s\n", v->reasons[i]);
    printf("Study wall time: %.1f s\n", T->wall);
}

int dp_experiment_thesis(int argc, char **argv)
{
    static thesis T; /* the cells' per-epoch arrays are large */
    memset(&T, 0, sizeof T);
    const char *out = NULL, *datasets = "mnist,fashion-mnist,kmnist",
               *strategies = "ps-sync,allreduce", *batches = "128,256";
    long epochs = 25, repeats = 1, train_size = 54000, val_size = 6000;
    study_cluster_opts copts;
    study_cluster_opts_init(&copts);
    const cli_opt opts[] = {
        {"out", CLI_STR, &out, "DIR", "where results.json, report.html and runs/ go (made if missing)", 0, 0},
        {"epochs", CLI_INT, &epochs, "N", "epochs per run (the source: 25)", 1, STUDY_MAX_EPOCHS},
        {"datasets", CLI_STR, &datasets, "LIST", "of mnist, fashion-mnist, kmnist", 0, 0},
        {"strategies", CLI_STR, &strategies, "LIST", "of ps-sync or ps-async (the parameter-server layout; the source's was asynchronous, docs/experiments.md says why ps-sync is the default), allreduce", 0, 0},
        {"batches", CLI_STR, &batches, "LIST", "of 128, 256 (per worker, as the source's)", 0, 0},
        {"repeats", CLI_INT, &repeats, "N", "runs per cell, seeds 1..N; medians and ranges reported", 1, MAX_REPEATS},
        {"train-size", CLI_INT, &train_size, "N", "training records (the source: 54000)", 1, 60000},
        {"val-size", CLI_INT, &val_size, "N", "validation records (the source: 6000)", 1, 59999},
        STUDY_CLUSTER_CLI_OPTS(copts),
    };
    int pr = study_parse("thesis", USAGE, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv,
                         &out);
    if (pr >= 0)
        return pr;
    if (train_size + val_size > 60000) {
        fprintf(stderr, "downpour experiment thesis: --train-size %ld + --val-size %ld is more "
                        "than the 60000 training records\n", train_size, val_size);
        return 2;
    }
    dp_err err;
    char dbuf[256], sbuf[256], bbuf[64];
    const char *ds[STUDY_MAX_LIST], *st[STUDY_MAX_LIST], *bs[STUDY_MAX_LIST];
    int nd, ns, nb;
    if (study_split_list("datasets", datasets, dbuf, sizeof dbuf, ds, &nd, ok_dataset, &err) < 0 ||
        study_split_list("strategies", strategies, sbuf, sizeof sbuf, st, &ns, ok_strategy, &err) <
            0 ||
        study_split_list("batches", batches, bbuf, sizeof bbuf, bs, &nb, ok_batch, &err) < 0 ||
        study_cluster_setup(&T.cluster, &copts, &err) < 0) {
        fprintf(stderr, "downpour experiment thesis: %s\n", err.msg);
        return 2;
    }
    int ps_layouts = 0;
    for (int i = 0; i < ns; i++)
        ps_layouts += strcmp(layout_of(st[i]), "ps") == 0;
    if (ps_layouts > 1) {
        fprintf(stderr, "downpour experiment thesis: --strategies: ps-async and ps-sync are both "
                        "the source's parameter-server runs; give one of them\n");
        return 2;
    }
    if (study_prepare_out(out, &err) < 0) {
        fprintf(stderr, "downpour experiment thesis: %s\n", err.msg);
        return 1;
    }
    T.out = out;
    T.epochs = epochs;
    T.repeats = repeats;
    T.train_size = train_size;
    T.val_size = val_size;

    /* the cells, in the source's order: dataset, then strategy, then batch */
    int total_runs = 0;
    for (size_t d = 0; d < sizeof DATASETS / sizeof DATASETS[0]; d++) {
        int want = 0;
        for (int i = 0; i < nd; i++)
            want |= !strcmp(ds[i], DATASETS[d]);
        if (!want)
            continue;
        dp_dataset probe;
        dp_err derr;
        int absent = dp_dataset_open(&probe, DATASETS[d], &derr) < 0;
        if (!absent)
            dp_dataset_close(&probe);
        for (int s = 0; s < ns; s++)
            for (int b = 0; b < nb; b++) {
                cell *c = &T.cells[T.n_cells++];
                c->dataset = DATASETS[d];
                c->strategy = st[s];
                c->batch = atoi(bs[b]);
                c->src = source_of(c->dataset, c->strategy, c->batch);
                c->rule = rule_of(c->strategy, c->batch);
                if (absent) {
                    c->status = CELL_ABSENT;
                    snprintf(c->why, sizeof c->why, "%s", derr.msg);
                } else {
                    total_runs += (int)repeats;
                }
            }
        if (absent)
            fprintf(stderr, "experiment: %s is absent, its cells are reported as such: %s\n",
                    DATASETS[d], derr.msg);
    }
    printf("downpour experiment thesis: %d run(s) of %ld epoch(s) on %s; outputs in %s\n",
           total_runs, epochs, T.cluster.description, out);
    fflush(stdout);
    double t0 = dp_now();
    int done_runs = 0, failed = 0;
    for (int i = 0; i < T.n_cells; i++) {
        cell *c = &T.cells[i];
        if (c->status == CELL_ABSENT)
            continue;
        run_cell(&T, c, &done_runs, total_runs);
        if (c->status == CELL_DONE)
            summarise(c);
        else
            failed++;
    }
    T.wall = dp_now() - t0;
    predict_cells(&T);
    verdict v;
    recommend(&T, &v);
    char path[4200];
    int rc = 0;
    if (write_results(&T, &v, out, &err) < 0) {
        fprintf(stderr, "downpour experiment thesis: %s\n", err.msg);
        rc = 1;
    }
    snprintf(path, sizeof path, "%s/report.html", out);
    if (write_report(&T, &v, path, &err) < 0) {
        fprintf(stderr, "downpour experiment thesis: %s\n", err.msg);
        rc = 1;
    }
    print_summary(&T, &v);
    printf("Wrote %s/results.json and %s/report.html\n", out, out);
    if (failed) {
        fprintf(stderr, "downpour experiment thesis: %d cell(s) failed (see above and the logs "
                        "in %s/runs)\n", failed, out);
        rc = 1;
    }
    return rc;
}
