/* Image networks' training throughput against the machine's GEMM bound for
 * the same products, and PyTorch's, measured in the same run (issues 11, 28).
 *
 * For 1 and 2 threads it times whole training steps (batch gather, forward,
 * backward, Adam update) of cnn-mnist, resnet-fashion and vit-mnist and, in
 * the same run, the step's matrix products alone: the BLAS wrapper logs the
 * shapes of every product one step runs (dp_blas_log), which are replayed
 * on scratch operands (gemm_step_seconds).  A convolution that runs directly
 * (src/nn/conv_direct.c) runs no product but logs those its lowered form
 * would run (dp_blas_note), so the bound always means the same thing: the
 * GEMM time of the step with every convolution lowered.  bound = batch /
 * (GEMM seconds per step); the fraction is the step's throughput over that
 * bound, so what it misses is the work outside the products (lowering,
 * pooling, normalisation, activations, the optimiser), and a direct
 * convolution faster than its lowered products can take it past 100 %.
 * Figures are medians of --repeats.  With --torch, PyTorch trains the same
 * network with the same batch, optimiser and threads in the same run
 * (bench/torch_cnn.py, through /usr/bin/python3; skipped when PyTorch is
 * missing).  distbelief-image is printed for reference.
 *
 *   bench_cnn [--steps N] [--repeats N] [--batch N] [--torch] [--model NAME]
 * (--model: that one network only).
 * Targets (issue 28), at batch 128 on 2 threads: each of the three reaches
 * >= 80 % of its GEMM bound, and resnet-fashion and vit-mnist >= 1.5x
 * PyTorch's samples/s.  Exit 0 whatever the verdicts (they are printed). */
#include <stdatomic.h>
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
#include "downpour/pool.h"
#include "downpour/rng.h"

#define MAX_REPEATS 15
#define N_RECORDS 4096
#define MAX_SHAPES 65536 /* products a training step runs, at most */

#ifndef DP_SOURCE_DIR
#define DP_SOURCE_DIR "."
#endif

/* The products of one training step, logged by the BLAS wrapper (blas.h,
 * dp_blas_log), replayed alone with the same shapes: the step's GEMM time
 * without the work around the products.  Operands are scratch of small
 * random values (nothing drifts into denormals); a run of products the
 * step ran inside pool tasks (mha's per-head ones) is replayed the same
 * way, split over the pool, each thread into its own C. */
typedef struct replay {
    const dp_gemm_shape *s;
    size_t n;
    const float *a, *b;
    float *c;
    size_t c_floats; /* each thread's C */
} replay;

static void replay_task(void *ctx, int i, int n)
{
    const replay *r = ctx;
    size_t lo, hi;
    dp_pool_range(r->n, 1, i, n, &lo, &hi);
    for (size_t q = lo; q < hi; q++) {
        const dp_gemm_shape *g = &r->s[q];
        dp_sgemm(g->ta, g->tb, g->m, g->n, g->k, 1.0f, r->a, g->lda, r->b, g->ldb, g->beta,
                 r->c + (size_t)i * r->c_floats, g->ldc);
    }
}

static double gemm_step_seconds(const dp_gemm_shape *s, size_t n, int steps, const float *a,
                                const float *b, float *c, size_t c_floats)
{
    double t0 = dp_now();
    for (int st = 0; st < steps; st++)
        for (size_t i = 0; i < n;) {
            size_t j = i + 1;
            while (s[i].in_task && j < n && s[j].in_task)
                j++;
            replay r = {s + i, j - i, a, b, c, c_floats};
            if (s[i].in_task)
                dp_pool_run(replay_task, &r);
            else
                replay_task(&r, 0, 1);
            i = j;
        }
    return (dp_now() - t0) / steps;
}

/* The floats each operand of the logged products needs at most. */
static void operand_floats(const dp_gemm_shape *s, size_t n, size_t *a, size_t *b, size_t *c)
{
    *a = *b = *c = 1;
    for (size_t i = 0; i < n; i++) {
        size_t fa = (size_t)(s[i].ta ? s[i].k : s[i].m) * s[i].lda;
        size_t fb = (size_t)(s[i].tb ? s[i].n : s[i].k) * s[i].ldb;
        size_t fc = (size_t)s[i].m * s[i].ldc;
        *a = fa > *a ? fa : *a, *b = fb > *b ? fb : *b, *c = fc > *c ? fc : *c;
    }
}

/* PyTorch's samples/s for the same network, or 0 when it cannot run. */
static double torch_samples_per_s(const char *model, int threads, int batch, int steps,
                                  int repeats)
{
    char cmd[1024];
    /* PyTorch's products go through the same OpenBLAS (Debian's torch:
     * BLAS_INFO=generic), so it gets the kernels downpour runs on (blas.c
     * re-picks them where OpenBLAS fell back to Prescott): "OpenBLAS 0.3.21
     * (Cooperlake, pthread)" gives OPENBLAS_CORETYPE=Cooperlake. */
    char core[32] = "";
    const char *paren = strchr(dp_blas_info(), '(');
    if (paren && sscanf(paren + 1, "%31[A-Za-z0-9]", core) != 1)
        core[0] = '\0';
    snprintf(cmd, sizeof cmd,
             "OPENBLAS_CORETYPE=%s /usr/bin/python3 %s/bench/torch_cnn.py --model %s --threads %d "
             "--batch %d --steps %d --repeats %d 2>/dev/null",
             core, DP_SOURCE_DIR, model, threads, batch, steps, repeats);
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
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--torch") == 0)
            torch = true;
        else if (i + 1 < argc && strcmp(argv[i], "--steps") == 0)
            steps = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--repeats") == 0)
            repeats = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--batch") == 0)
            batch = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--model") == 0)
            only = argv[++i];
        else
            steps = 0;
    }
    if (steps < 1 || repeats < 1 || repeats > MAX_REPEATS || batch < 1 || batch > 1024) {
        fprintf(stderr, "usage: bench_cnn [--steps N>=1] [--repeats 1..%d] [--batch 1..1024] "
                        "[--torch] [--model NAME]\n", MAX_REPEATS);
        return 2;
    }
    const char *models[] = {"cnn-mnist", "resnet-fashion", "vit-mnist", "distbelief-image"};
    const int n_models = (int)(sizeof models / sizeof models[0]);
    bool known = !only;
    for (int mi = 0; mi < n_models; mi++)
        known = known || strcmp(only, models[mi]) == 0;
    if (!known) {
        fprintf(stderr, "bench_cnn: --model: unknown network '%s' (expected cnn-mnist, "
                        "resnet-fashion, vit-mnist or distbelief-image)\n", only);
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
    printf("%-17s %8s %12s %14s %9s %14s %9s\n", "model", "threads", "samples/s",
           "gemm bound/s", "fraction", "pytorch/s", "x pytorch");
    char verdicts[1024] = "";
    size_t vlen = 0;
    dp_gemm_log log = {.cap = MAX_SHAPES, .shapes = malloc(MAX_SHAPES * sizeof(dp_gemm_shape))};
    if (!log.shapes) {
        fprintf(stderr, "bench_cnn: out of memory\n");
        return 1;
    }
    for (int mi = 0; mi < n_models; mi++)
        for (int threads = 1; threads <= 2; threads++) {
            if (only && strcmp(only, models[mi]) != 0)
                continue;
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
            dp_model_init_params(&m, 1);
            dp_batcher_start_epoch(&bt, 0);
            dp_blas_set_threads(threads);
            bool target = mi < 3; /* distbelief-image: for reference */
            bench_train_step_seconds(&m, &o, &bt, x, y, batch, steps / 4 + 1, 0); /* warm up */
            atomic_store(&log.n, 0);
            dp_blas_log(&log);
            bench_train_step_seconds(&m, &o, &bt, x, y, batch, 1, 0);
            dp_blas_log(NULL);
            size_t n_shapes = atomic_load(&log.n);
            if (n_shapes > log.cap) {
                fprintf(stderr, "bench_cnn: %s runs %zu products a step, more than %d\n",
                        models[mi], n_shapes, MAX_SHAPES);
                return 1;
            }
            size_t fa, fb, fc;
            operand_floats(log.shapes, n_shapes, &fa, &fb, &fc);
            float *ga = malloc(fa * sizeof *ga), *gb_ = malloc(fb * sizeof *gb_),
                  *gc = calloc(fc * (size_t)threads, sizeof *gc);
            if (!ga || !gb_ || !gc) {
                fprintf(stderr, "bench_cnn: out of memory\n");
                return 1;
            }
            for (size_t i = 0; i < fa; i++)
                ga[i] = dp_rng_uniform(&rng) - 0.5f;
            for (size_t i = 0; i < fb; i++)
                gb_[i] = dp_rng_uniform(&rng) - 0.5f;
            double tr[MAX_REPEATS], gm[MAX_REPEATS];
            for (int r = 0; r < repeats; r++) {
                tr[r] = bench_train_step_seconds(&m, &o, &bt, x, y, batch, steps, 0);
                gm[r] = gemm_step_seconds(log.shapes, n_shapes, steps, ga, gb_, gc, fc);
            }
            double sps = batch / bench_median(tr, repeats);
            double gbound = batch / bench_median(gm, repeats);
            double ts = torch ? torch_samples_per_s(models[mi], threads, batch, steps, repeats) : 0;
            char tbuf[32] = "-", xbuf[32] = "-";
            if (ts > 0) {
                snprintf(tbuf, sizeof tbuf, "%.0f", ts);
                snprintf(xbuf, sizeof xbuf, "%.2fx", sps / ts);
            }
            printf("%-17s %8d %12.0f %14.0f %8.1f%% %14s %9s\n", models[mi], threads, sps, gbound,
                   100 * sps / gbound, tbuf, xbuf);
            fflush(stdout);
            if (target && threads == 2) {
                bool gemm_ok = sps / gbound >= 0.80, torch_ok = mi == 0 || ts <= 0 || sps >= 1.5 * ts;

                vlen += (size_t)snprintf(verdicts + vlen, sizeof verdicts - vlen,
                                         "target: %s batch %d on 2 threads: >= 80%% of the GEMM "
                                         "bound (%.1f%%) %s",
                                         models[mi], batch, 100 * sps / gbound,
                                         gemm_ok ? "met" : "NOT met");
                if (mi > 0)
                    vlen += (size_t)snprintf(verdicts + vlen, sizeof verdicts - vlen,
                                             "; >= 1.5x PyTorch (%s) %s", xbuf,
                                             ts <= 0 ? "not measured" : torch_ok ? "met" : "NOT met");
                vlen += (size_t)snprintf(verdicts + vlen, sizeof verdicts - vlen, "\n");
            }
            free(ga);
            free(gb_);
            free(gc);
            dp_batcher_free(&bt);
            dp_optim_free(&o);
            dp_model_free(&m);
            nanosleep(&(struct timespec){0, 200 * 1000 * 1000}, NULL);
        }
    fputs(verdicts, stdout);
    free(log.shapes);
    free(images);
    free(labels);
    free(x);
    free(y);
    return 0;
}
