/* downpour eval: test accuracy of a saved checkpoint. */
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "downpour/checkpoint.h"
#include "downpour/clock.h"
#include "downpour/dataset.h"
#include "downpour/log.h"
#include "downpour/metrics.h"
#include "downpour/records.h"
#include "downpour/train.h"

#define USAGE "downpour eval --checkpoint FILE [--dataset NAME|PATH] [--test-size N] [--metrics FILE]"
#define EVAL_BATCH 500

/* A --dataset value as the path it opens: a known name under
 * $DOWNPOUR_DATA (./data), then the canonical path where there is one. */
static void dataset_path(const char *name, char *out, size_t cap)
{
    static const char *const known[] = {"mnist", "fashion-mnist", "kmnist"};
    char path[4096];
    snprintf(path, sizeof path, "%s", name);
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(name, known[i]) == 0)
            snprintf(path, sizeof path, "%s/%s", dp_dataset_root(), name);
    char real[PATH_MAX];
    if (realpath(path, real))
        snprintf(out, cap, "%s", real);
    else
        snprintf(out, cap, "%s", path);
}

/* Whether the checkpoint's dataset and --dataset name the same data, however
 * each was spelt (mnist, data/mnist, ./data/mnist/, a symlink). */
static bool same_dataset(const char *trained, const char *given)
{
    if (strcmp(trained, given) == 0)
        return true;
    char a[4096], b[4096];
    dataset_path(trained, a, sizeof a);
    dataset_path(given, b, sizeof b);
    return strcmp(a, b) == 0;
}

int cmd_eval(int argc, char **argv)
{
    const char *checkpoint = NULL, *dataset = "mnist", *metrics_path = NULL;
    long n_test = 0, hash_buckets = 0;
    dp_dataset_options data;
    dp_dataset_options_default(&data);
    const cli_opt opts[] = {
        {"checkpoint", CLI_STR, &checkpoint, "FILE", "a safetensors file written by train --save", 0, 0},
        {"dataset", CLI_STR, &dataset, "NAME|PATH", "mnist, fashion-mnist, kmnist, a directory of IDX files, or TFRecord, NumPy or CSV files (docs/datasets.md)", 0, 0},
        {"image-feature", CLI_STR, &data.data.image, "NAME", "TFRecord: the Example feature holding the inputs", 0, 0},
        {"label-feature", CLI_STR, &data.data.label, "NAME", "TFRecord: the Example feature holding the label; CSV: the label column", 0, 0},
        {"train-files", CLI_STR, &data.data.train, "PATTERN", "record files: base names of the training files", 0, 0},
        {"test-files", CLI_STR, &data.data.test, "PATTERN", "record files: base names of the test files", 0, 0},
        {"test-size", CLI_INT, &n_test, "N", "test records evaluated (the first N, as train's --test-size; 0: all)", 0, 100000000},
        {"categorical", CLI_STR, &data.data.categorical, "NAMES", "named categorical columns, as train's", 0, 0},
        {"numeric", CLI_STR, &data.data.numeric, "NAMES", "named numeric columns, as train's", 0, 0},
        {"hash-buckets", CLI_INT, &hash_buckets, "N", "hash raw categorical ids into [0, N), as train's", 0, 1L << 24},
        {"metrics", CLI_STR, &metrics_path, "FILE", "write a done-style JSON line to FILE", 0, 0},
    };
    int rest;
    int r = cli_parse(USAGE, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, &rest);
    if (r != 0)
        return r > 0 ? 0 : 2;
    if (rest < argc) {
        fprintf(stderr, "downpour eval: unexpected argument '%s' (see --help)\n", argv[rest]);
        return 2;
    }
    if (!checkpoint) {
        fprintf(stderr, "downpour eval: --checkpoint FILE is required\n");
        return 2;
    }

    dp_err err;
    dp_model m;
    dp_dataset ds;
    dp_metrics *metrics = NULL;
    dp_ckpt_info info;
    float *x = NULL;
    uint8_t *y = NULL;
    int rc = 1;
    memset(&m, 0, sizeof m);
    memset(&ds, 0, sizeof ds);
    data.data.hash_buckets = (uint32_t)hash_buckets;
    uint32_t bag_rows[DP_MAX_LAYERS];
    int bag_places[DP_MAX_LAYERS];
    if (dp_checkpoint_load_weights(checkpoint, &m, EVAL_BATCH, &info, &err) < 0)
        goto out;
    if (data.data.categorical) { /* ids checked against the bags' tables, as train does */
        int bags = dp_model_bags(&m, bag_rows, bag_places, DP_MAX_LAYERS);
        if (dp_data_check_bags(&data.data, bag_rows, bag_places, bags, bag_rows, &err) < 0)
            goto out;
        data.data.id_limits = bag_rows;
        data.data.n_id_limits = (size_t)bags;
    }
    if (dp_dataset_open_with(&ds, dataset, &data, &err) < 0 ||
        dp_metrics_open(&metrics, metrics_path, &err) < 0)
        goto out;
    if (dp_model_check_input(&m, ds.rows, ds.cols, ds.channels, dataset, &err) < 0)
        goto out;
    if (!dp_split_in_memory(&ds.test)) { /* dp_evaluate gathers by record index */
        dp_errf(&err, "dataset %s: its test records are %s, and eval reads them in memory",
                dataset, ds.test.stream ? "streamed from their files" : "not loaded");
        goto out;
    }
    if (n_test > 0 && (uint32_t)n_test < ds.test.n)
        ds.test.n = (uint32_t)n_test; /* the first N, as train's --test-size (loop.c) */
    if (strcmp(info.dataset, "unknown") != 0 && !same_dataset(info.dataset, dataset))
        dp_warn("%s was trained on %s, and is being tested on %s", checkpoint, info.dataset,
                dataset);
    x = malloc((size_t)EVAL_BATCH * ds.test.dim * sizeof *x);
    y = malloc(EVAL_BATCH);
    if (!x || !y) {
        snprintf(err.msg, sizeof err.msg, "out of memory");
        goto out;
    }
    double t0 = dp_now(), loss;
    long bad;
    double auc;
    double acc = dp_evaluate_auc(&m, m.params, &ds.test, x, y, &loss, &bad, &auc);
    int binary = dp_model_binary(&m);
    if (bad > 0)
        dp_warn_bad_inputs(&m, bad, "the test set");
    double secs = dp_now() - t0;
    dp_info("%s (%s, step %ld): test accuracy %.4f, test loss %.4f on %u records", checkpoint,
            m.name, info.step, acc, loss, ds.test.n);
    if (binary)
        dp_info("%s: test log loss %.4f, AUC %.4f", checkpoint, loss, auc);
    printf("%.4f\n", acc);
    dp_metrics_event(metrics, "done", DP_F_NUM, "test_accuracy", acc, DP_F_NUM, "test_loss", loss,
                     DP_F_NUM, "eval_seconds", secs, DP_F_STR, "model", m.name, DP_F_STR, "dataset",
                     dataset, DP_F_STR, "checkpoint", checkpoint, DP_F_STR, "strategy",
                     info.strategy, DP_F_INT, "step", info.step,
                     /* a binary model's two more; else the list ends here */
                     binary ? DP_F_NUM : DP_F_END, "test_auc", auc, DP_F_NUM, "test_log_loss",
                     loss, DP_F_END);
    dp_metrics *done = metrics;
    metrics = NULL;
    if (dp_metrics_close_check(done, &err) < 0)
        goto out;
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "downpour eval: %s\n", err.msg);
    free(x);
    free(y);
    dp_metrics_close(metrics);
    dp_dataset_close(&ds);
    dp_model_free(&m);
    return rc;
}
