/* cnn-mnist training throughput against the machine's GEMM bound for the same
 * lowered products, measured in the same run (issue 11).
 *
 * For 1 and 2 threads it times whole training steps (batch gather, forward,
 * backward, Adam update) and, in the same run, the step's matrix products
 * alone with the shapes the model runs them in: each convolution's product
 * per lowered chunk (forward, weight gradient, and the input gradient except
 * for the first layer), and the dense layers' products.  bound = batch / (GEMM
 * seconds per step); the fraction is the step's throughput over that bound.
 * Figures are medians of --repeats.  With --torch, PyTorch trains the same
 * network with the same batch, optimiser and threads in the same run
 * (bench/torch_cnn.py, through /usr/bin/python3; skipped when PyTorch is
 * missing).  distbelief-image's throughput is printed for reference.
 *
 *   bench_cnn [--steps N] [--repeats N] [--batch N] [--torch]
 * Target: cnn-mnist at batch 128 reaches >= 70 % of the bound on 2 threads. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "bench_train.h"
#include "downpour/blas.h"
#include "downpour/clock.h"
#include "downpour/dataset.h"
#include "downpour/model.h"
#include "downpour/optim.h"
#include "downpour/rng.h"

#define MAX_REPEATS 15
#define N_RECORDS 4096

#ifndef DP_SOURCE_DIR
#define DP_SOURCE_DIR "."
#endif

/* Seconds per step of the model's products alone, on the model's own
 * buffers; the output gradients are read from a buffer of random values
 * (read only, so nothing drifts into denormals). */
static double gemm_step_seconds(dp_model *m, const float *x, int batch, int steps,
                                const float *dout, float *dinp)
{
    double t0 = dp_now();
    for (int s = 0; s < steps; s++) {
        for (int l = 0; l < m->n_layers; l++) { /* forward */
            const dp_layer *d = &m->layers[l];
            const float *inp = l == 0 ? x : dp_model_act(m, 0, l);
            float *out = dp_model_act(m, 0, l + 1);
            if (d->kind == DP_LAYER_DENSE) {
                dp_sgemm(false, true, batch, d->out, d->in, 1.0f, inp, d->in,
                         m->params + d->w_off, d->in, 0.0f, out, d->out);
            } else if (d->kind == DP_LAYER_CONV) {
                int k = d->win.kh * d->win.kw * d->c, p = d->oh * d->ow;
                for (int r0 = 0; r0 < batch; r0 += d->chunk) {
                    int cb = batch - r0 < d->chunk ? batch - r0 : d->chunk;
                    dp_sgemm(false, true, cb * p, d->oc, k, 1.0f, m->rows, k,
                             m->params + d->w_off, k, 0.0f, out + (size_t)r0 * d->out, d->oc);
                }
            }
        }
        for (int l = m->n_layers - 1; l >= 0; l--) { /* backward */
            const dp_layer *d = &m->layers[l];
            const float *inp = l == 0 ? x : dp_model_act(m, 0, l);
            if (d->kind == DP_LAYER_DENSE) {
                dp_sgemm(true, false, d->out, d->in, batch, 1.0f, dout, d->out, inp, d->in, 0.0f,
                         m->grads + d->w_off, d->in);
                if (l > 0)
                    dp_sgemm(false, false, batch, d->in, d->out, 1.0f, dout, d->out,
                             m->params + d->w_off, d->in, 0.0f, dinp, d->in);
            } else if (d->kind == DP_LAYER_CONV) {
                int k = d->win.kh * d->win.kw * d->c, p = d->oh * d->ow;
                for (int r0 = 0; r0 < batch; r0 += d->chunk) {
                    int cb = batch - r0 < d->chunk ? batch - r0 : d->chunk;
                    dp_sgemm(true, false, d->oc, k, cb * p, 1.0f, dout, d->oc, m->rows, k,
                             r0 ? 1.0f : 0.0f, m->grads + d->w_off, k);
                    if (l > 0)
                        dp_sgemm(false, false, cb * p, k, d->oc, 1.0f, dout, d->oc,
                                 m->params + d->w_off, k, 0.0f, m->drows, k);
                }
            }
        }
    }
    return (dp_now() - t0) / steps;
}

/* PyTorch's samples/s for the same network, or 0 when it cannot run. */
static double torch_samples_per_s(const char *model, int threads, int batch, int steps,
                                  int repeats)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 %s/bench/torch_cnn.py --model %s --threads %d --batch %d "
             "--steps %d --repeats %d 2>/dev/null",
             DP_SOURCE_DIR, model, threads, batch, steps, repeats);
    FILE *p = popen(cmd, "r");
    if (!p)
        return 0;
    double sps = 0;
    if (fscanf(p, "%lf", &sps) != 1)
        sps = 0;
    pclose(p);
    return sps;
}

int main(int argc, char **argv)
{
    int steps = 30, repeats = 5, batch = 128;
    bool torch = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--torch") == 0)
            torch = true;
        else if (i + 1 < argc && strcmp(argv[i], "--steps") == 0)
            steps = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--repeats") == 0)
            repeats = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--batch") == 0)
            batch = atoi(argv[++i]);
        else
            steps = 0;
    }
    if (steps < 1 || repeats < 1 || repeats > MAX_REPEATS || batch < 1 || batch > 1024) {
        fprintf(stderr, "usage: bench_cnn [--steps N>=1] [--repeats 1..%d] [--batch 1..1024] "
                        "[--torch]\n", MAX_REPEATS);
        return 2;
    }
    uint8_t *images = malloc((size_t)N_RECORDS * 784), *labels = malloc(N_RECORDS);
    float *x = malloc(sizeof(float) * (size_t)batch * 784);
    uint8_t *y = malloc((size_t)batch);
    if (!images || !labels || !x || !y) {
        fprintf(stderr, "bench_cnn: out of memory\n");
        return 1;
    }
    dp_rng rng;
    dp_rng_seed(&rng, 7);
    for (size_t i = 0; i < (size_t)N_RECORDS * 784; i++)
        images[i] = (uint8_t)dp_rng_below(&rng, 256);
    for (int i = 0; i < N_RECORDS; i++)
        labels[i] = (uint8_t)dp_rng_below(&rng, 10);
    dp_split split = {.images = images, .labels = labels, .n = N_RECORDS, .dim = 784};

    printf("BLAS: %s; %d steps per timing, median of %d, batch %d\n", dp_blas_info(), steps,
           repeats, batch);
    printf("%-17s %8s %12s %14s %9s %14s\n", "model", "threads", "samples/s", "gemm bound/s",
           "fraction", "pytorch/s");
    const char *models[] = {"cnn-mnist", "distbelief-image"};
    int status = 0;
    double fraction2 = 0;
    for (int mi = 0; mi < 2; mi++)
        for (int threads = 1; threads <= 2; threads++) {
            dp_err err;
            dp_model m;
            dp_optim o;
            dp_batcher bt;
            dp_optim_config oc = dp_optim_defaults(DP_OPTIM_ADAM);
            if (dp_model_init(&m, models[mi], batch, 1, &err) < 0 ||
                dp_optim_init(&o, &oc, m.n_params, &err) < 0 ||
                dp_batcher_init(&bt, &split, 1, 1, DP_SHARD_OFF, 0, 1, &err) < 0) {
                fprintf(stderr, "bench_cnn: %s\n", err.msg);
                return 1;
            }
            size_t scratch_n = (size_t)batch * 24 * 24 * 64;
            float *dout = malloc(scratch_n * sizeof *dout), *dinp = malloc(scratch_n * sizeof *dinp);
            if (!dout || !dinp) {
                fprintf(stderr, "bench_cnn: out of memory\n");
                return 1;
            }
            for (size_t i = 0; i < scratch_n; i++)
                dout[i] = dp_rng_uniform(&rng) - 0.5f;
            dp_model_init_params(&m, 1);
            dp_batcher_start_epoch(&bt, 0);
            dp_blas_set_threads(threads);
            bool bound = mi == 0; /* the bound is for cnn-mnist's conv and dense products */
            bench_train_step_seconds(&m, &o, &bt, x, y, batch, steps / 4 + 1, 0); /* warm up */
            double tr[MAX_REPEATS], gm[MAX_REPEATS];
            for (int r = 0; r < repeats; r++) {
                tr[r] = bench_train_step_seconds(&m, &o, &bt, x, y, batch, steps, 0);
                gm[r] = bound ? gemm_step_seconds(&m, x, batch, steps, dout, dinp) : 1;
            }
            double sps = batch / bench_median(tr, repeats);
            double gb = batch / bench_median(gm, repeats);
            double ts = torch ? torch_samples_per_s(models[mi], threads, batch, steps, repeats) : 0;
            char tbuf[32] = "-", gbuf[32] = "-", fbuf[32] = "-";
            if (ts > 0)
                snprintf(tbuf, sizeof tbuf, "%.0f", ts);
            if (bound) {
                snprintf(gbuf, sizeof gbuf, "%.0f", gb);
                snprintf(fbuf, sizeof fbuf, "%.1f%%", 100 * sps / gb);
            }
            printf("%-17s %8d %12.0f %14s %9s %14s\n", models[mi], threads, sps, gbuf, fbuf, tbuf);
            fflush(stdout);
            if (bound && threads == 2) {
                fraction2 = sps / gb;
                status = fraction2 < 0.70;
            }
            free(dout);
            free(dinp);
            dp_batcher_free(&bt);
            dp_optim_free(&o);
            dp_model_free(&m);
            nanosleep(&(struct timespec){0, 200 * 1000 * 1000}, NULL);
        }
    printf("target: cnn-mnist batch %d >= 70%% of the GEMM bound on 2 threads (%.1f%%): %s\n",
           batch, 100 * fraction2, status ? "NOT met" : "met");
    free(images);
    free(labels);
    free(x);
    free(y);
    return 0;
}
