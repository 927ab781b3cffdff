/* Spatial model parallelism of image layers (src/strategy/mp_replica.c,
 * mp_slice.c, src/nn/band.c; docs/architecture.md, "Model parallelism"):
 * - the band kernels: bands of output rows put together give the whole
 *   kernels' im2row, row2im, max and average pooling, forward and backward;
 * - K = 2 and 3 tasks of one replica on the in-process transport, one thread
 *   a task, give one process's loss, correct count and parameter gradients
 *   (relative 1e-5) for whole image models: locally connected layers with
 *   padding, relu, max pooling, lcn, dense layers (odd heights); conv with
 *   stride and padding and average pooling; distbelief-image and cnn-mnist at
 *   a small batch; and the strategy trains them to one process's weights;
 * - a task holds only its band of a local layer's weights (< 1/K + a row);
 * - the bytes on the wire are exactly the halo rows, the bands at a
 *   whole-map layer and the dense layers' exchanges (per-peer counters);
 * - too few output rows for K is refused naming the layer. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "inproc_node.h"
#include "downpour/blas.h"
#include "downpour/frame.h"
#include "downpour/inproc.h"
#include "downpour/layers.h"
#include "downpour/rng.h"
#include "downpour/strategy.h"
#include "downpour/train.h"
#include "exec/mp_replica.h"
#include "exec/mp_slice.h"

#define MAX_K 3

static dp_rng rng;

static void fill(float *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        v[i] = dp_rng_uniform(&rng) * 2 - 1;
}

/* max |a - b| over max |b|: the difference against the buffer's scale */
static double rel_diff(const float *a, const float *b, size_t n)
{
    double worst = 0, big = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        worst = d > worst || isnan(d) ? d : worst;
        big = fabs((double)b[i]) > big ? fabs((double)b[i]) : big;
    }
    return big > 0 ? worst / big : worst;
}

/* The worst rel_diff over a model's weights and biases, buffer by buffer. */
static double grad_diff(const dp_model *m, const float *a, const float *b)
{
    double worst = 0;
    for (int l = 0; l < m->n_layers; l++) {
        const dp_layer *L = &m->layers[l];
        if (!L->w_len)
            continue;
        double dw = rel_diff(a + L->w_off, b + L->w_off, L->w_len);
        double db = rel_diff(a + L->b_off, b + L->b_off, L->b_len);
        worst = dw > worst || isnan(dw) ? dw : worst;
        worst = db > worst || isnan(db) ? db : worst;
    }
    return worst;
}

/* ------------------------------------------------------- band kernels */

static void test_band_kernels(void)
{
    static const int geo[][7] = {/* c h w kh kw stride pad */
                                 {2, 11, 9, 3, 3, 1, 1}, {3, 10, 10, 3, 3, 2, 1},
                                 {1, 9, 7, 5, 5, 1, 0}, {2, 9, 8, 2, 2, 2, 0},
                                 {2, 13, 6, 3, 2, 2, 1}};
    int batch = 3;
    for (size_t t = 0; t < sizeof geo / sizeof geo[0]; t++) {
        const int *G = geo[t];
        dp_window g;
        REQUIRE(dp_window_init(&g, G[0], G[1], G[2], G[3], G[4], G[5], G[6]) == 0);
        size_t in_n = (size_t)batch * g.h * g.w * g.c, out_n = (size_t)batch * g.oh * g.ow * g.c;
        size_t k = (size_t)g.kh * g.kw * g.c, rows_n = (size_t)batch * g.oh * g.ow * k;
        float *in = malloc(in_n * 4), *rows = malloc(rows_n * 4), *band = malloc(rows_n * 4);
        float *din = malloc(in_n * 4), *dsum = malloc(in_n * 4), *dpart = malloc(in_n * 4);
        float *out = malloc(out_n * 4), *bout = malloc(out_n * 4), *dout = malloc(out_n * 4);
        float *drows = malloc(rows_n * 4);
        fill(in, in_n);
        fill(drows, rows_n);
        fill(dout, out_n);
        dp_im2row(rows, in, &g, batch);
        dp_row2im(din, drows, &g, batch);
        for (int K = 1; K <= 3 && K <= g.oh; K++) {
            memset(dsum, 0, in_n * 4);
            for (int j = 0; j < K; j++) {
                int y0, y1, iy0, iy1;
                mp_units(g.oh, K, j, &y0, &y1);
                dp_window_band_rows(&g, y0, y1, &iy0, &iy1);
                dp_im2row_band(band, in, &g, batch, y0, y1);
                size_t per = (size_t)(y1 - y0) * g.ow * k;
                int same = 1;
                for (int r = 0; r < batch; r++)
                    same &= memcmp(band + r * per,
                                   rows + ((size_t)r * g.oh + (size_t)y0) * g.ow * k,
                                   per * 4) == 0;
                CHECKF(same, "geometry %zu K %d band %d: im2row differs", t, K, j);
                /* the band's rows of drows through the band's row2im */
                for (int r = 0; r < batch; r++)
                    memcpy(band + r * per, drows + ((size_t)r * g.oh + (size_t)y0) * g.ow * k,
                           per * 4);
                for (size_t e = 0; e < in_n; e++)
                    dpart[e] = NAN;
                dp_row2im_band(dpart, band, &g, batch, y0, y1);
                size_t wc = (size_t)g.w * g.c;
                for (int r = 0; r < batch; r++)
                    for (int iy = 0; iy < g.h; iy++) {
                        float *p = dpart + ((size_t)r * g.h + iy) * wc;
                        int inside = iy >= iy0 && iy < iy1;
                        for (size_t e = 0; e < wc; e++) {
                            if (inside)
                                dsum[(p - dpart) + e] += p[e];
                            else
                                CHECKF(isnan(p[e]), "row2im band wrote row %d outside [%d,%d)",
                                       iy, iy0, iy1);
                        }
                    }
            }
            double d = rel_diff(dsum, din, in_n);
            CHECKF(d < 1e-5, "geometry %zu K %d: row2im bands differ by %g", t, K, d);
        }
        /* pooling */
        for (int avg = 0; avg < 2; avg++) {
            if (avg)
                dp_avgpool_forward(out, in, &g, batch);
            else
                dp_maxpool_forward(out, in, &g, batch);
            avg ? dp_avgpool_backward(din, dout, &g, batch)
                : dp_maxpool_backward(din, dout, in, out, &g, batch);
            for (int K = 1; K <= 3 && K <= g.oh; K++) {
                memset(dsum, 0, in_n * 4);
                for (int j = 0; j < K; j++) {
                    int y0, y1, iy0, iy1;
                    mp_units(g.oh, K, j, &y0, &y1);
                    dp_window_band_rows(&g, y0, y1, &iy0, &iy1);
                    if (avg)
                        dp_avgpool_forward_band(bout, in, &g, batch, y0, y1);
                    else
                        dp_maxpool_forward_band(bout, in, &g, batch, y0, y1);
                    size_t row = (size_t)g.ow * g.c;
                    int same = 1;
                    for (int r = 0; r < batch; r++) {
                        size_t at = ((size_t)r * g.oh + y0) * row;
                        same &= memcmp(bout + at, out + at, (size_t)(y1 - y0) * row * 4) == 0;
                    }
                    CHECKF(same, "geometry %zu %s K %d band %d: forward differs", t,
                           avg ? "avg" : "max", K, j);
                    memset(dpart, 0, in_n * 4);
                    avg ? dp_avgpool_backward_band(dpart, dout, &g, batch, y0, y1)
                        : dp_maxpool_backward_band(dpart, dout, in, out, &g, batch, y0, y1);
                    for (size_t e = 0; e < in_n; e++)
                        dsum[e] += dpart[e];
                }
                double d = rel_diff(dsum, din, in_n);
                CHECKF(d < 1e-5, "geometry %zu %s K %d: backward bands differ by %g", t,
                       avg ? "avg" : "max", K, d);
            }
        }
        free(in), free(rows), free(band), free(din), free(dsum), free(dpart);
        free(out), free(bout), free(dout), free(drows);
    }
}

/* ------------------------------------------- one replica against one process */

typedef struct task_job {
    const dp_model *m;
    dp_transport *t;
    int K, task, n;
    const float *x;
    const uint8_t *y;
    float *full_grads;  /* each task scatters its slices' gradients here */
    pthread_mutex_t *mu;
    float loss;
    int correct, rc;
    size_t floats;
    dp_err err;
} task_job;

static void *task_main(void *arg)
{
    task_job *j = arg;
    int ranks[MAX_K];
    for (int q = 0; q < j->K; q++)
        ranks[q] = q;
    mp_replica *r = NULL;
    j->rc = -1;
    if (mp_replica_open(&r, j->t, j->m, ranks, j->K, j->task, 0, j->n, 30, &j->err) < 0)
        return NULL;
    const mp_plan *p = mp_replica_plan(r, j->task);
    j->floats = p->floats;
    float *params = malloc((p->floats ? p->floats : 1) * sizeof(float));
    float *grads = malloc((p->floats ? p->floats : 1) * sizeof(float));
    mp_gather(params, j->m->params, p);
    dp_step_out o;
    /* two steps: the second shows nothing stale carries over */
    for (int step = 1; step <= 2 && (j->rc = mp_replica_step(r, params, grads, j->x, j->y, j->n,
                                                              1.0f, step, &o, &j->err)) == 0;
         step++)
        ;
    if (j->rc == 0) {
        j->loss = o.loss;
        j->correct = o.correct;
        pthread_mutex_lock(j->mu);
        mp_scatter(j->full_grads, grads, p);
        pthread_mutex_unlock(j->mu);
    }
    free(params);
    free(grads);
    mp_replica_close(r);
    return NULL;
}

/* K tasks over one batch of n; payload: the bytes task 0 sent, headers off. */
static int run_replica(const dp_model *m, int K, const float *x, const uint8_t *y, int n,
                       float *full_grads, task_job *jobs, uint64_t *payload)
{
    dp_transport *ts[MAX_K];
    dp_err err;
    REQUIRE(dp_inproc_open(ts, K, &err) == 0);
    pthread_t th[MAX_K];
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    for (int q = 0; q < K; q++) {
        jobs[q] = (task_job){.m = m, .t = ts[q], .K = K, .task = q, .n = n, .x = x, .y = y,
                             .full_grads = full_grads, .mu = &mu};
        REQUIRE(pthread_create(&th[q], NULL, task_main, &jobs[q]) == 0);
    }
    for (int q = 0; q < K; q++)
        pthread_join(th[q], NULL);
    if (payload) {
        *payload = 0;
        for (int q = 1; q < K; q++) {
            dp_transport_stats st;
            REQUIRE(dp_transport_stats_get(ts[0], q, &st) == 0);
            *payload += st.bytes_sent - st.frames_sent * DP_FRAME_HEADER_SIZE;
        }
    }
    for (int q = 0; q < K; q++)
        dp_transport_close(ts[q]);
    int ok = 1;
    for (int q = 0; q < K; q++) {
        CHECKF(jobs[q].rc == 0, "task %d of %d: %s", q, K, jobs[q].err.msg);
        ok &= jobs[q].rc == 0;
    }
    return ok;
}

static void test_equal_to_one_process(const char *spec, int n)
{
    dp_model m;
    dp_err err;
    REQUIRE(dp_model_init(&m, spec, n, 1, &err) == 0);
    dp_model_init_params(&m, 11);
    /* non-zero biases, so a bias in the wrong place shows */
    for (int l = 0; l < m.n_layers; l++)
        for (size_t e = 0; e < m.layers[l].b_len; e++)
            m.params[m.layers[l].b_off + e] = 0.05f * (dp_rng_uniform(&rng) - 0.5f);
    int in = dp_model_inputs(&m), classes = dp_model_classes(&m);
    float *x = malloc((size_t)n * in * sizeof(float));
    uint8_t *y = malloc((size_t)n);
    for (size_t i = 0; i < (size_t)n * in; i++)
        x[i] = dp_rng_uniform(&rng);
    for (int i = 0; i < n; i++)
        y[i] = (uint8_t)(i * 7 % classes);
    int ref_correct = 0;
    float ref_loss = dp_model_forward_backward(&m, x, y, n, &ref_correct);
    float *g = malloc(m.n_params * sizeof(float));
    for (int K = 2; K <= 3; K++) {
        for (size_t i = 0; i < m.n_params; i++)
            g[i] = NAN; /* every gradient must be written by exactly its owner */
        task_job jobs[MAX_K];
        mp_plan p;
        dp_err perr;
        if (mp_plan_make(&p, &m, K, 0, &perr) < 0) { /* too few rows: refused, naming the layer */
            fprintf(stderr, "%s K %d: refused: %s\n", spec, K, perr.msg);
            CHECKF(strstr(perr.msg, "output rows") && strstr(perr.msg, "layer"), "%s", perr.msg);
            CHECKF(K == 3 && strstr(spec, "avgpool2"), "%s K %d refused: %s", spec, K, perr.msg);
            continue;
        }
        if (!run_replica(&m, K, x, y, n, g, jobs, NULL))
            continue;
        size_t total = 0;
        for (int q = 0; q < K; q++) {
            total += jobs[q].floats;
            CHECKF(fabsf(jobs[q].loss - ref_loss) <= 1e-5f * fabsf(ref_loss),
                   "%s K %d task %d: loss %.7g, one process %.7g", spec, K, q, jobs[q].loss,
                   ref_loss);
            CHECKF(jobs[q].correct == ref_correct, "%s K %d task %d: %d correct, one process %d",
                   spec, K, q, jobs[q].correct, ref_correct);
        }
        CHECKF(total == m.n_params, "%s K %d: the tasks hold %zu of %zu parameters", spec, K,
               total, m.n_params);
        double d = grad_diff(&m, g, m.grads);
        int nans = 0;
        for (size_t i = 0; i < m.n_params; i++)
            nans += isnan(g[i]);
        fprintf(stderr, "%s K %d: loss %.6g, gradients differ by %.3g (relative)\n", spec, K,
                (double)jobs[0].loss, d);
        CHECKF(nans == 0 && d < 1e-5, "%s K %d: gradients differ by %g (%d unset)", spec, K, d,
               nans);
    }
    free(g);
    free(x);
    free(y);
    dp_model_free(&m);
}

/* ----------------------------------------- what a task holds and sends */

static void test_memory_and_wire(void)
{
    dp_model m;
    dp_err err;
    int n = 5;
    /* layers: 0 local 8x6x2 (pad 1), 1 local 8x6x2 (pad 1), 2 flatten, 3 dense 6,
     * 4 relu, 5 dense 4, 6 softmax */
    REQUIRE(dp_model_init(&m, "1x8x6-local3x3x2p1-local3x3x2p1-6-4", n, 1, &err) == 0);
    dp_model_init_params(&m, 5);
    REQUIRE(m.layers[2].kind == DP_LAYER_FLATTEN && m.layers[3].kind == DP_LAYER_DENSE);
    for (int K = 2; K <= 3; K++) {
        const dp_layer *L = &m.layers[1];
        size_t row_params = (size_t)L->ow * (L->w_len / ((size_t)L->oh * L->ow) + L->oc);
        for (int j = 0; j < K; j++) {
            mp_plan p;
            REQUIRE(mp_plan_make(&p, &m, K, j, &err) == 0);
            size_t held = p.img[1].w_len + p.img[1].b_len, full = L->w_len + L->b_len;
            CHECKF(held < full / K + row_params, "K %d task %d holds %zu of a local layer's %zu",
                   K, j, held, full);
            CHECKF(p.img[1].w_full == L->w_off + (size_t)p.img[1].y0 * L->ow * (L->w_len / ((size_t)L->oh * L->ow)),
                   "K %d task %d: the band's weights start elsewhere", K, j);
        }
    }
    /* K = 2: bands [0,4) and [4,8); layer 1 reads one row across the border
     * each way; task 0 sends per record and step: the halo row (6x2 floats)
     * forward and its gradient back, its band of layer 1 to the flatten (4
     * rows x 6 x 2), its 3 units of dense 3 and 2 of dense 5 forward, the 3
     * columns of dense 5's input gradient task 1 owns, and its part of dense
     * 3's input gradient (96) for the whole-map sum. */
    float *x = malloc((size_t)n * 48 * sizeof(float)), *g = malloc(m.n_params * sizeof(float));
    uint8_t y[5] = {0, 1, 2, 3, 1};
    fill(x, (size_t)n * 48);
    task_job jobs[MAX_K];
    uint64_t payload = 0;
    if (run_replica(&m, 2, x, y, n, g, jobs, &payload)) {
        uint64_t halo = 12 + 12, want = 2 * (uint64_t)n * 4 * (halo + 48 + 3 + 2 + 3 + 96);
        fprintf(stderr, "K 2: task 0 sent %llu payload bytes over 2 steps, %llu expected (halo "
                        "%llu)\n", (unsigned long long)payload, (unsigned long long)want,
                (unsigned long long)(2 * n * 4 * halo));
        CHECKF(payload == want, "task 0 sent %llu payload bytes, want %llu",
               (unsigned long long)payload, (unsigned long long)want);
    }
    free(x);
    free(g);
    dp_model_free(&m);
}

static void test_refusals(void)
{
    dp_model m;
    dp_err err;
    mp_plan p;
    REQUIRE(dp_model_init(&m, "1x8x8-local3x3x2-maxpool2-5-3", 1, 1, &err) == 0);
    /* maxpool: 3 output rows */
    CHECKF(mp_plan_make(&p, &m, 4, 0, &err) < 0 && strstr(err.msg, "--model-parallel 4") &&
               strstr(err.msg, "layer 1") && strstr(err.msg, "maxpool") &&
               strstr(err.msg, "only 3 output rows"),
           "%s", err.msg);
    CHECK(mp_plan_make(&p, &m, 3, 2, &err) == 0);
    dp_model_free(&m);
    REQUIRE(dp_model_init(&m, "1x8x8-local3x3x2-dropout0.5-5-3", 1, 1, &err) == 0);
    CHECKF(mp_plan_make(&p, &m, 2, 0, &err) < 0 && strstr(err.msg, "dropout"), "%s", err.msg);
    dp_model_free(&m);
}

/* ----------------------------------- the strategy, against one process */

typedef struct strat_job {
    dp_train_config cfg;
    int K, position;
    dp_transport *t;
    const char *spec;
    const float *x;
    const uint8_t *y;
    int batch, steps, rc;
    dp_err err;
    float *params; /* position 0: the weights at the end */
} strat_job;

static void *strat_main(void *arg)
{
    strat_job *j = arg;
    dp_node node;
    dp_model m;
    j->rc = -1;
    inproc_node(&node, j->t, j->K, j->position);
    REQUIRE(dp_model_init(&m, j->spec, j->batch, 1, &j->err) == 0);
    dp_model_init_params(&m, 7);
    dp_split counted = {.n = (uint32_t)(j->batch * j->steps)}; /* sizes the shards */
    dp_run_env env = {.cfg = &j->cfg, .node = &node, .model = &m, .train = &counted,
                      .n_train = counted.n, .steps_per_epoch = j->steps};
    dp_task_info info;
    memset(&info, 0, sizeof info);
    dp_strategy *s = NULL;
    const dp_strategy_ops *ops = &dp_strategy_model_parallel;
    if (ops->open(&s, &env, &info, &j->err) < 0)
        goto out;
    int in = dp_model_inputs(&m);
    for (int k = 0; k < j->steps; k++) {
        dp_step_out o;
        if (ops->step(s, j->x + (size_t)k * j->batch * in, j->y + (size_t)k * j->batch, j->batch,
                      j->cfg.optim.lr, k + 1, &o, &j->err) < 0)
            goto out;
    }
    dp_epoch_stats st = {.records = 1};
    if (ops->epoch_end(s, 1, &st, &j->err) < 0)
        goto out;
    if (info.evaluator) {
        const float *p = ops->params(s, DP_WEIGHTS_LIVE, &j->err);
        REQUIRE(p);
        memcpy(j->params, p, m.n_params * sizeof(float));
    }
    j->rc = ops->finish(s, j->steps, &j->err);
out:
    if (j->rc < 0) {
        dp_err e;
        dp_inproc_kill(j->t, DP_INPROC_CRASH, &e);
    }
    ops->close(s);
    dp_model_free(&m);
    dp_cluster_free(&node.cluster);
    return NULL;
}

static void test_strategy(const char *spec, int batch, int steps, dp_optim_kind kind, float lr)
{
    dp_model m;
    dp_err err;
    REQUIRE(dp_model_init(&m, spec, batch, 1, &err) == 0);
    dp_model_init_params(&m, 7);
    int in = dp_model_inputs(&m), classes = dp_model_classes(&m);
    size_t nx = (size_t)batch * steps * in;
    float *x = malloc(nx * sizeof(float)), *got = malloc(m.n_params * sizeof(float));
    uint8_t *y = malloc((size_t)batch * steps);
    for (size_t i = 0; i < nx; i++)
        x[i] = dp_rng_uniform(&rng);
    for (int i = 0; i < batch * steps; i++)
        y[i] = (uint8_t)((i * 5 + 1) % classes);
    dp_optim_config oc = dp_optim_defaults(kind);
    oc.lr = lr;
    dp_optim opt;
    REQUIRE(dp_optim_init(&opt, &oc, m.n_params, &err) == 0);
    for (int k = 0; k < steps; k++) {
        dp_model_forward_backward(&m, x + (size_t)k * batch * in, y + (size_t)k * batch, batch,
                                  NULL);
        dp_optim_apply(&opt, m.params, m.grads, lr);
    }
    for (int K = 2; K <= 3; K++) {
        mp_plan p;
        if (mp_plan_make(&p, &m, K, 0, &err) < 0)
            continue; /* test_equal_to_one_process checks the refusal */
        dp_transport *ts[MAX_K];
        REQUIRE(dp_inproc_open(ts, K, &err) == 0);
        strat_job jobs[MAX_K];
        pthread_t th[MAX_K];
        for (int q = 0; q < K; q++) {
            jobs[q] = (strat_job){.cfg = dp_train_defaults(), .K = K, .position = q, .t = ts[q],
                                  .spec = spec, .x = x, .y = y, .batch = batch, .steps = steps,
                                  .params = got};
            jobs[q].cfg.model = spec;
            jobs[q].cfg.batch = batch;
            char k[16];
            snprintf(k, sizeof k, "%d", K);
            REQUIRE(dp_strategy_select(&jobs[q].cfg, "model-parallel", &err) == 0 &&
                    dp_strategy_set(&jobs[q].cfg, "model-parallel", k, &err) == 0);
            jobs[q].cfg.optim = oc;
            jobs[q].cfg.collective_timeout = 30;
            REQUIRE(pthread_create(&th[q], NULL, strat_main, &jobs[q]) == 0);
        }
        for (int q = 0; q < K; q++)
            pthread_join(th[q], NULL);
        for (int q = 0; q < K; q++)
            dp_transport_close(ts[q]);
        int ok = 1;
        for (int q = 0; q < K; q++) {
            CHECKF(jobs[q].rc == 0, "%s K %d position %d: %s", spec, K, q, jobs[q].err.msg);
            ok &= jobs[q].rc == 0;
        }
        if (!ok)
            continue;
        double worst = 0;
        for (size_t i = 0; i < m.n_params; i++) {
            double d = fabs((double)got[i] - m.params[i]) / (1.0 + fabs((double)m.params[i]));
            worst = d > worst ? d : worst;
        }
        fprintf(stderr, "%s K %d %s, %d steps: weights differ from one process by %.3g\n", spec,
                K, dp_optim_kind_name(kind), steps, worst);
        CHECKF(worst < 1e-5, "%s K %d: weights differ from one process by %g", spec, K, worst);
    }
    dp_optim_free(&opt);
    free(x);
    free(y);
    free(got);
    dp_model_free(&m);
}

int main(void)
{
    dp_blas_set_threads(1);
    dp_rng_seed(&rng, 3);
    test_band_kernels();
    test_refusals();
    test_memory_and_wire();
    test_equal_to_one_process("1x11x9-local3x3x4p1-relu-maxpool2-lcn3-local2x2x3-relu-7-5", 6);
    test_equal_to_one_process("1x10x10-conv3x3x4s2p1-relu-avgpool2-6-4", 6);
    test_equal_to_one_process("1x11x11-conv3x3x4s2p1-relu-avgpool2p1-6-4", 6);
    test_equal_to_one_process("1x13x7-conv3x3x3p1-relu-conv3x3x2s2p1-relu-maxpool2-5-3", 5);
    test_equal_to_one_process("distbelief-image", 3);
    test_equal_to_one_process("cnn-mnist", 2);
    test_strategy("1x11x9-local3x3x4p1-relu-maxpool2-lcn3-local2x2x3-relu-7-5", 4, 3,
                  DP_OPTIM_ADAM, 0.01f);
    test_strategy("1x10x10-conv3x3x4s2p1-relu-avgpool2-6-4", 4, 3, DP_OPTIM_SGD, 0.1f);
    test_strategy("1x11x11-conv3x3x4s2p1-relu-avgpool2p1-6-4", 4, 3, DP_OPTIM_SGD, 0.1f);
    return CHECK_DONE();
}
