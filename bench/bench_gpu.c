/* Training throughput on a device (issue 14): a model trained on MNIST's
 * 54,000 training records, batch 128, adam, with the split on the device and
 * every step one dp_dmodel_step (a replayed graph on cuda), as the trainer
 * runs it.  Times the epochs alone (the split's copy and the graph's capture
 * before them are left out); then evaluates the parameters on the host, so a
 * fast run that learns nothing shows.
 *
 *   bench_gpu [--device cuda|cuda:N|sim] [--model SPEC] [--epochs N]
 *             [--torch-samples-per-second X]
 * Defaults: cuda, mlp-300-100, 25 epochs.  A device that does not open is
 * skipped with its reason (exit 77).
 * Targets (issue 14): 25 epochs of Model 1 (mlp-300-100) under 1 s; with
 * --torch-samples-per-second, PyTorch's figure on the same GPU, >= 3x it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/clock.h"
#include "downpour/dataset.h"
#include "downpour/device.h"
#include "downpour/model.h"
#include "downpour/optim.h"
#include "downpour/rng.h"

#define BATCH 128
#define N_TRAIN 54000
#define TARGET_EPOCHS 25
#define TARGET_SECONDS 1.0
#define TARGET_TORCH 3.0

static int usage(const char *why)
{
    fprintf(stderr, "bench_gpu: %s\nusage: bench_gpu [--device cuda|cuda:N|sim] [--model SPEC] "
                    "[--epochs N>=1] [--torch-samples-per-second X]\n",
            why);
    return 2;
}

/* Test accuracy of params, evaluated on the host. */
static double test_accuracy(dp_model *m, const dp_split *test)
{
    float *x = malloc((size_t)BATCH * test->dim * sizeof *x);
    uint8_t y[BATCH];
    uint32_t idx[BATCH];
    long hits = 0;
    if (!x)
        return -1.0;
    for (uint32_t pos = 0; pos < test->n; pos += BATCH) {
        int n = test->n - pos < BATCH ? (int)(test->n - pos) : BATCH;
        for (int i = 0; i < n; i++)
            idx[i] = pos + (uint32_t)i;
        dp_split_gather(x, y, test, idx, n);
        int c = 0;
        dp_model_forward(m, m->params, x, y, n, &c);
        hits += c;
    }
    free(x);
    return (double)hits / test->n;
}

int main(int argc, char **argv)
{
    const char *device = "cuda", *model = "mlp-300-100";
    long epochs = TARGET_EPOCHS;
    double torch = 0.0;
    dp_err err;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc)
            return usage("every option takes a value");
        if (strcmp(argv[i], "--device") == 0)
            device = argv[++i];
        else if (strcmp(argv[i], "--model") == 0)
            model = argv[++i];
        else if (strcmp(argv[i], "--epochs") == 0) {
            if (dp_parse_long(argv[++i], 1, 100000, &epochs, "--epochs", &err) < 0)
                return usage(err.msg);
        } else if (strcmp(argv[i], "--torch-samples-per-second") == 0) {
            if (dp_parse_double(argv[++i], 1e-9, 1e12, &torch, "--torch-samples-per-second",
                                &err) < 0)
                return usage(err.msg);
        } else {
            return usage("unknown option");
        }
    }

    dp_device_spec spec;
    dp_device *dev;
    if (dp_device_parse(device, &spec, &err) < 0)
        return usage(err.msg);
    if (spec.kind == DP_DEVICE_CPU)
        return usage("--device cpu has no device model; bench_engine times the CPU");
    if (dp_device_open(&dev, &spec, &err) < 0) {
        printf("bench_gpu: skipped: %s\n", err.msg);
        return 77;
    }
    dp_dataset ds;
    if (dp_dataset_open(&ds, "mnist", &err) < 0) {
        fprintf(stderr, "bench_gpu: %s\n", err.msg);
        return 1;
    }
    dp_split train, val;
    dp_model m;
    dp_dmodel *g;
    dp_optim_config cfg = dp_optim_defaults(DP_OPTIM_ADAM);
    if (dp_dataset_split(&ds, N_TRAIN, 60000 - N_TRAIN, &train, &val, &err) < 0 ||
        dp_model_init(&m, model, BATCH, 1, &err) < 0 ||
        dp_model_check_input(&m, ds.rows, ds.cols, ds.channels, "mnist", &err) < 0) {
        fprintf(stderr, "bench_gpu: %s\n", err.msg);
        return 1;
    }
    dp_model_init_params(&m, 1);
    if (dp_dmodel_open(&g, dev, &m, &cfg, &err) < 0 ||
        dp_dmodel_load_split(g, &train, &err) < 0) {
        fprintf(stderr, "bench_gpu: %s\n", err.msg);
        return 1;
    }
    uint32_t *order = malloc(train.n * sizeof *order);
    if (!order) {
        fprintf(stderr, "bench_gpu: out of memory\n");
        return 1;
    }
    for (uint32_t i = 0; i < train.n; i++)
        order[i] = i;
    printf("device: %s; model %s (%zu parameters), batch %d, adam, %ld epochs of %u records\n",
           dp_device_describe(dev), m.name, m.n_params, BATCH, epochs, train.n);

    dp_rng rng;
    dp_rng_seed(&rng, 1);
    /* one training step before the clock starts: the graph's capture */
    if (dp_dmodel_stage(g, order, BATCH, &err) < 0 || dp_dmodel_step(g, cfg.lr, &err) < 0) {
        fprintf(stderr, "bench_gpu: %s\n", err.msg);
        return 1;
    }
    double loss = 0, t0 = dp_now();
    long correct = 0;
    for (long e = 0; e < epochs; e++) {
        dp_rng_shuffle(&rng, order, train.n); /* on the host, as the trainer does */
        for (uint32_t pos = 0; pos < train.n; pos += BATCH) {
            int n = train.n - pos < BATCH ? (int)(train.n - pos) : BATCH;
            if (dp_dmodel_stage(g, order + pos, n, &err) < 0 ||
                dp_dmodel_step(g, cfg.lr, &err) < 0) {
                fprintf(stderr, "bench_gpu: epoch %ld: %s\n", e + 1, err.msg);
                return 1;
            }
        }
    }
    if (dp_dmodel_collect(g, &loss, &correct, &err) < 0) { /* waits for the device */
        fprintf(stderr, "bench_gpu: %s\n", err.msg);
        return 1;
    }
    double secs = dp_now() - t0;
    double sps = (double)epochs * train.n / secs;
    /* batch norm's running statistics too: the host evaluates with them */
    if (dp_dmodel_get_params(g, m.params, &err) < 0 ||
        (m.n_buffers && dp_dmodel_get_buffers(g, m.buffers, &err) < 0)) {
        fprintf(stderr, "bench_gpu: %s\n", err.msg);
        return 1;
    }
    double acc = test_accuracy(&m, &ds.test);
    /* the untimed first step tallied too: a loss over epochs*n + BATCH records */
    printf("train: %.3f s, %.0f samples/s; mean train loss %.4f; test accuracy %.4f\n",
           secs, sps, loss / ((double)epochs * train.n + BATCH), acc);
    double per25 = secs / (double)epochs * TARGET_EPOCHS;
    if (strcmp(m.spec, "784-300-100-10") == 0)
        printf("target: %d epochs of Model 1 under %.0f s: %.3f s%s: %s\n", TARGET_EPOCHS,
               TARGET_SECONDS, per25, epochs == TARGET_EPOCHS ? "" : " (projected)",
               per25 < TARGET_SECONDS ? "met" : "not met");
    else
        printf("target: %d epochs of Model 1 under %.0f s (this run: %s, %.3f s for %d epochs)\n",
               TARGET_EPOCHS, TARGET_SECONDS, m.name, per25, TARGET_EPOCHS);
    if (torch > 0)
        printf("target: >= %.0fx PyTorch's %.0f samples/s: %.2fx: %s\n", TARGET_TORCH, torch,
               sps / torch, sps / torch >= TARGET_TORCH ? "met" : "not met");
    printf("(figures from a shared machine are provisional)\n");
    free(order);
    dp_dmodel_close(g);
    dp_device_close(dev);
    dp_model_free(&m);
    dp_dataset_close(&ds);
    return 0;
}
