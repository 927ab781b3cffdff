/* bn: batch normalisation over features (after a dense layer: (batch, C))
 * or over channels (after a conv: NHWC, so channel ch of every pixel of
 * every record), as PyTorch's BatchNorm1d and BatchNorm2d.  Both are rows of
 * C: R = batch*h*w rows.  Training normalises with the batch's mean and
 * biased variance and moves the running statistics by momentum 0.1 with the
 * unbiased variance (R / (R-1)); evaluation normalises with the running
 * ones.  eps 1e-5.  Weight (gamma) 1 and bias (beta) 0 at the start;
 * buffers running_mean (C), running_var (C) and num_batches_tracked (a
 * scalar, as a float: exact to 2^24 batches), PyTorch's names in files.
 *
 * Per-channel sums run in double over blocks of rows and then over the
 * blocks, split over the pool by channels; the element passes split by
 * rows: results never depend on the thread count.  On a device the same
 * passes are kernels (kernels.h, "batch norm") that give the CPU's bits.  Its forward keeps the
 * batch's mean, 1/std and variance (3C floats) for its backward and the
 * running update; evaluation uses the keep's 1/std for the running one.
 * On the CPU a relu after it runs in its normalising pass, and its backward
 * then takes the relu's too (c->relu_after; docs/architecture.md, "The
 * model"): one pass each way fewer, the same bits.
 *
 * With a sum hook (c->sum: allreduce --sync-bn, docs/strategies.md
 * "Buffers") the batch is every replica's rows, as PyTorch's SyncBatchNorm:
 * the forward sums each channel's values and the count, then the squares
 * about the whole batch's mean (the one-process two passes, so no
 * cancellation), and moves the running statistics by the whole batch (the
 * unbiased variance with the total count); the backward sums dbeta and
 * dgamma for the input gradient.  Each replica's dy is the gradient of its
 * own mean loss, which the strategy weights by its records' share: the
 * backward's sums are weighted the same way, so the input gradient is the
 * one of the whole batch's mean loss, as one process at the summed batch
 * gives.  dgamma and dbeta stay the replica's own; the strategy sums them
 * with the other gradients.  The keep also holds the total count and the
 * sums' 2C + 1 floats: nothing allocates in a step. */
#include "nn/layer_impl.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "device/dexec.h"
#include "downpour/isa.h"
#include "downpour/pool.h"
#include "nn/isa_paths.h"

#define BN_EPS 1e-5
#define BN_MOMENTUM 0.1f

static int parse(dp_spec_parser *p, const char *s, const char *end)
{
    (void)s, (void)end;
    if (!p->flat && p->h * p->w > 1 && dp_spec_need_image(p) < 0)
        return -1;
    dp_layer *d = dp_spec_add(p, DP_LAYER_BATCHNORM);
    if (!d || dp_spec_params(p, d, (size_t)d->c, (size_t)d->c) < 0)
        return -1;
    dp_spec_buffers(p, d, 2 * (size_t)d->c + 1);
    return 0;
}

static int shapes(const dp_layer *d, int64_t w[6], int64_t b[3], int *bdim)
{
    w[0] = d->c;
    b[0] = d->c;
    *bdim = 1;
    return 1;
}

static void init_params(const dp_layer *d, float *w, float *b)
{
    for (int ch = 0; ch < d->c; ch++)
        w[ch] = 1.0f, b[ch] = 0.0f;
}

static int buffers(const dp_layer *d, dp_lk_buffer out[DP_LK_MAX_BUFFERS])
{
    out[0] = (dp_lk_buffer){"running_mean", (size_t)d->c, 1};
    out[1] = (dp_lk_buffer){"running_var", (size_t)d->c, 1};
    out[2] = (dp_lk_buffer){"num_batches_tracked", 1, 0};
    return 3;
}

static void init_buffers(const dp_layer *d, float *s)
{
    for (int ch = 0; ch < d->c; ch++)
        s[ch] = 0.0f, s[d->c + ch] = 1.0f;
    s[2 * d->c] = 0.0f;
}

/* The keep: mean, 1/std and variance (C each; the device's whole keep),
 * then the rows of the whole batch and the sums of --sync-bn. */
static size_t keep_floats(const dp_layer *d, int max_batch)
{
    (void)max_batch;
    return 5 * (size_t)d->c + 2;
}

/* One pass over a call, split over the pool. */
typedef struct job {
    const dp_layer_call *c;
    int C;
    size_t R;
    const float *mean, *scale; /* the normalisation: (x - mean) * scale */
    float *red;                /* sync_task: each channel's sum goes here */
    float rows;                /* din_task: rows of the whole batch */
    const float *db, *dg;      /* din_task: the whole batch's dbeta and dgamma */
} job;

/* The per-channel sums run row by row over a block of channels, each
 * channel's sum in its own double: one pass over the rows per block instead
 * of one strided pass per channel (NHWC keeps a position's channels side
 * by side: resnet-fashion's 16-channel bn layers spent 29 % of a step in
 * channel-by-channel passes).  The rows are summed in blocks of DP_BN_ROWS,
 * then the blocks in order: the additions a GPU makes with one thread per
 * (block, channel) (kernels.h, "batch norm"), so the device gives these
 * bits. */
#define BLOCK 256

/* The passes are compiled for AVX-512, AVX2 and the baseline (isa_paths.h):
 * the vector lanes are channels, each channel's additions keep their order,
 * so every path gives the same bits (test_batchnorm runs under each cap and
 * holds them to the device's). */

/* Channels [c0, c0 + n), n <= BLOCK: out[k] = sum over rows of x (mu
 * NULL), else of (x - mu[k])^2. */
static inline __attribute__((always_inline)) void channel_sums(const float *x, size_t R, int C, size_t c0, size_t n,
                                                       const double *mu, double *out)
{
    double part[BLOCK];
    for (size_t k = 0; k < n; k++)
        out[k] = 0.0;
    for (size_t r0 = 0; r0 < R; r0 += DP_BN_ROWS) {
        size_t r1 = R - r0 < DP_BN_ROWS ? R : r0 + DP_BN_ROWS;
        for (size_t k = 0; k < n; k++)
            part[k] = 0.0;
        for (size_t r = r0; r < r1; r++) {
            const float *row = x + r * (size_t)C + c0;
            if (mu)
                for (size_t k = 0; k < n; k++) {
                    double t = row[k] - mu[k];
                    part[k] += t * t;
                }
            else
                for (size_t k = 0; k < n; k++)
                    part[k] += row[k];
        }
        for (size_t k = 0; k < n; k++)
            out[k] += part[k];
    }
}

/* Channels [lo, hi): the batch's mean, 1/std and variance into the keep. */
static inline __attribute__((always_inline)) void stats_task_body(void *ctx, int i, int n)
{
    const job *j = ctx;
    size_t lo, hi;
    dp_pool_range((size_t)j->C, 1, i, n, &lo, &hi);
    float *mean = j->c->keep, *inv = j->c->keep + j->C, *var = j->c->keep + 2 * j->C;
    double R = (double)j->R;
    for (size_t c0 = lo; c0 < hi; c0 += BLOCK) {
        size_t m = hi - c0 < BLOCK ? hi - c0 : BLOCK;
        double mu[BLOCK], v[BLOCK];
        channel_sums(j->c->in, j->R, j->C, c0, m, NULL, mu);
        for (size_t k = 0; k < m; k++)
            mu[k] /= R;
        channel_sums(j->c->in, j->R, j->C, c0, m, mu, v);
        for (size_t k = 0; k < m; k++) {
            mean[c0 + k] = (float)mu[k];
            var[c0 + k] = (float)(v[k] / R);
            inv[c0 + k] = (float)(1.0 / sqrt(v[k] / R + BN_EPS));
        }
    }
}
DP_ISA_POOL_TASK(stats_task)

/* Channels [lo, hi), --sync-bn: sum x (j->mean NULL), else sum (x - mean)^2. */
static void sync_task(void *ctx, int i, int n)
{
    const job *j = ctx;
    size_t lo, hi;
    dp_pool_range((size_t)j->C, 1, i, n, &lo, &hi);
    for (size_t c0 = lo; c0 < hi; c0 += BLOCK) {
        size_t m = hi - c0 < BLOCK ? hi - c0 : BLOCK;
        double mu[BLOCK], sums[BLOCK];
        for (size_t k = 0; k < m; k++)
            mu[k] = j->mean ? j->mean[c0 + k] : 0.0;
        channel_sums(j->c->in, j->R, j->C, c0, m, j->mean ? mu : NULL, sums);
        for (size_t k = 0; k < m; k++)
            j->red[c0 + k] = (float)sums[k];
    }
}

/* --sync-bn: the whole batch's mean, 1/std, variance and rows into the
 * keep.  -1 when a sum failed (the caller then takes its own rows'). */
static int sync_stats(const dp_layer_call *c, job *j)
{
    int C = j->C;
    float *mean = c->keep, *inv = mean + C, *var = mean + 2 * C, *red = mean + 3 * C + 1;
    j->red = red, j->mean = NULL;
    dp_pool_run(sync_task, j);
    red[C] = (float)j->R;
    if (c->sum(c->sum_ctx, red, (size_t)C + 1) < 0)
        return -1;
    double R = red[C];
    for (int ch = 0; ch < C; ch++)
        mean[ch] = R > 0 ? (float)(red[ch] / R) : 0.0f;
    j->mean = mean;
    dp_pool_run(sync_task, j);
    if (c->sum(c->sum_ctx, red, (size_t)C) < 0)
        return -1;
    for (int ch = 0; ch < C; ch++) {
        double v = R > 0 ? red[ch] / R : 0.0;
        var[ch] = (float)v;
        inv[ch] = (float)(1.0 / sqrt(v + BN_EPS));
    }
    mean[3 * C] = (float)R;
    return 0;
}

/* The normalised value of x in a channel: the forward's output.  A backward
 * with the relu after it (c->relu_after) recomputes it, ((x - mean) *
 * scale) * gamma + beta in the same order (ISO C: no contraction, so the
 * same bits), for the relu's mask: y > 0 exactly when relu(y) > 0. */
static inline float bn_y(float x, float mean, float scale, float w, float b)
{
    return (x - mean) * scale * w + b;
}

/* Rows [lo, hi): out = (x - mean) * scale * gamma + beta, then the relu
 * after it when fused (c->relu: as dp_relu_forward, NaN and -0 pass). */
static inline __attribute__((always_inline)) void norm_task_body(void *ctx, int i, int n)
{
    const job *j = ctx;
    size_t lo, hi;
    dp_pool_range(j->R, 1, i, n, &lo, &hi);
    const dp_layer_call *c = j->c;
    for (size_t r = lo; r < hi; r++) {
        const float *x = c->in + r * j->C;
        float *y = c->out + r * j->C;
        if (c->relu)
            for (int ch = 0; ch < j->C; ch++) {
                float v = bn_y(x[ch], j->mean[ch], j->scale[ch], c->w[ch], c->b[ch]);
                y[ch] = v < 0.0f ? 0.0f : v;
            }
        else
            for (int ch = 0; ch < j->C; ch++)
                y[ch] = bn_y(x[ch], j->mean[ch], j->scale[ch], c->w[ch], c->b[ch]);
    }
}
DP_ISA_POOL_TASK(norm_task)

static float forward(const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    int C = d->c;
    job j = {.c = c, .C = C, .R = (size_t)c->batch * d->h * d->w};
    float *rm = c->state, *rv = c->state + C;
    if (!c->train) { /* the running statistics: their 1/std into the keep's second half */
        float *inv = c->keep + C;
        for (int ch = 0; ch < C; ch++)
            inv[ch] = (float)(1.0 / sqrt((double)rv[ch] + BN_EPS));
        j.mean = rm, j.scale = inv;
        dp_pool_run(norm_task[dp_isa_paths_level()], &j);
        return 0.0f;
    }
    double R = (double)j.R;
    if (c->sum && sync_stats(c, &j) == 0) {
        R = c->keep[3 * C];
    } else {
        dp_pool_run(stats_task[dp_isa_paths_level()], &j);
        c->keep[3 * C] = (float)R;
    }
    const float *mean = c->keep, *inv = c->keep + C, *var = c->keep + 2 * C;
    if (R < 1) /* no rows anywhere: nothing to move the statistics by */
        return 0.0f;
    for (int ch = 0; ch < C; ch++) { /* PyTorch's: the unbiased variance */
        float unbiased = (float)(R > 1 ? (double)var[ch] * R / (R - 1) : (double)var[ch]);
        rm[ch] = (1.0f - BN_MOMENTUM) * rm[ch] + BN_MOMENTUM * mean[ch];
        rv[ch] = (1.0f - BN_MOMENTUM) * rv[ch] + BN_MOMENTUM * unbiased;
    }
    c->state[2 * C] += 1.0f;
    j.mean = mean, j.scale = inv;
    dp_pool_run(norm_task[dp_isa_paths_level()], &j);
    return 0.0f;
}

/* Channels [lo, hi): dgamma = sum dy * xhat and dbeta = sum dy, row by row
 * over a block of channels, in blocks of rows (see channel_sums). */
static inline __attribute__((always_inline)) void grad_task_body(void *ctx, int i, int n)
{
    const job *j = ctx;
    const dp_layer_call *c = j->c;
    size_t lo, hi;
    dp_pool_range((size_t)j->C, 1, i, n, &lo, &hi);
    for (size_t c0 = lo; c0 < hi; c0 += BLOCK) {
        size_t m = hi - c0 < BLOCK ? hi - c0 : BLOCK;
        double g[BLOCK] = {0}, b[BLOCK] = {0}, pg[BLOCK], pb[BLOCK];
        const float *mean = j->mean + c0, *scale = j->scale + c0, *w = c->w + c0,
                    *bias = c->b + c0;
        for (size_t r0 = 0; r0 < j->R; r0 += DP_BN_ROWS) {
            size_t r1 = j->R - r0 < DP_BN_ROWS ? j->R : r0 + DP_BN_ROWS;
            for (size_t k = 0; k < m; k++)
                pg[k] = 0.0, pb[k] = 0.0;
            for (size_t r = r0; r < r1; r++) {
                const float *dy = c->dout + r * (size_t)j->C + c0;
                const float *x = c->in + r * (size_t)j->C + c0;
                if (c->relu_after) /* dy at the relu's output: its mask first */
                    for (size_t k = 0; k < m; k++) {
                        float xhat = (x[k] - mean[k]) * scale[k];
                        float y = xhat * w[k] + bias[k]; /* the forward's output */
                        /* dy, or +0 where the relu cut it: as a mask of its
                         * bits (a select here does not vectorise) */
                        uint32_t u;
                        memcpy(&u, &dy[k], sizeof u);
                        u &= 0u - (uint32_t)(y > 0.0f);
                        float dk;
                        memcpy(&dk, &u, sizeof dk);
                        double d = dk;
                        pg[k] += d * xhat;
                        pb[k] += d;
                    }
                else
                    for (size_t k = 0; k < m; k++) {
                        double d = dy[k];
                        pg[k] += d * ((x[k] - mean[k]) * scale[k]);
                        pb[k] += d;
                    }
            }
            for (size_t k = 0; k < m; k++)
                g[k] += pg[k], b[k] += pb[k];
        }
        for (size_t k = 0; k < m; k++) {
            c->gw[c0 + k] = (float)g[k];
            c->gb[c0 + k] = (float)b[k];
        }
    }
}
DP_ISA_POOL_TASK(grad_task)

/* Rows [lo, hi): dx = gamma/std/R * (R dy - dbeta - xhat dgamma), with the
 * relu's mask on dy first when c->relu_after.  The per-channel factor is
 * computed once per block of channels (the same operations per element, so
 * the same bits as the device's kernel). */
static inline __attribute__((always_inline)) void din_task_body(void *ctx, int i, int n)
{
    const job *j = ctx;
    const dp_layer_call *c = j->c;
    size_t lo, hi;
    dp_pool_range(j->R, 1, i, n, &lo, &hi);
    float R = j->rows;
    size_t C = (size_t)j->C;
    for (size_t c0 = 0; c0 < C; c0 += BLOCK) {
        size_t m = C - c0 < BLOCK ? C - c0 : BLOCK;
        float f[BLOCK];
        const float *mean = j->mean + c0, *scale = j->scale + c0, *w = c->w + c0,
                    *bias = c->b + c0, *db = j->db + c0, *dg = j->dg + c0;
        for (size_t k = 0; k < m; k++)
            f[k] = w[k] * scale[k] / R;
        for (size_t r = lo; r < hi; r++) {
            const float *x = c->in + r * C + c0, *dy = c->dout + r * C + c0;
            float *dx = c->din + r * C + c0;
            if (c->relu_after)
                for (size_t k = 0; k < m; k++) {
                    float xhat = (x[k] - mean[k]) * scale[k];
                    float y = xhat * w[k] + bias[k]; /* the forward's output */
                    float dk = dy[k]; /* read either way: a select */
                    dk = y > 0.0f ? dk : 0.0f;
                    dx[k] = f[k] * (R * dk - db[k] - xhat * dg[k]);
                }
            else
                for (size_t k = 0; k < m; k++) {
                    float xhat = (x[k] - mean[k]) * scale[k];
                    dx[k] = f[k] * (R * dy[k] - db[k] - xhat * dg[k]);
                }
        }
    }
}
DP_ISA_POOL_TASK(din_task)

/* --sync-bn: the whole batch's dbeta and dgamma, in this replica's scale
 * (the sums weighted by each replica's share of the rows, then taken back
 * to this one's), into the keep for din_task.  -1 when the sum failed. */
static int sync_grads(const dp_layer_call *c, job *j)
{
    int C = j->C;
    float total = c->keep[3 * C], *red = c->keep + 3 * C + 1;
    float share = total > 0 ? (float)j->R / total : 0.0f;
    for (int ch = 0; ch < C; ch++)
        red[ch] = c->gb[ch] * share, red[C + ch] = c->gw[ch] * share;
    if (c->sum(c->sum_ctx, red, 2 * (size_t)C) < 0)
        return -1;
    if (j->R > 0) /* no rows here: no input gradient to scale */
        for (int ch = 0; ch < 2 * C; ch++)
            red[ch] /= share;
    j->rows = total, j->db = red, j->dg = red + C;
    return 0;
}

/* The backward of a training forward (batch statistics, in the keep). */
static void backward(const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    job j = {.c = c, .C = d->c, .R = (size_t)c->batch * d->h * d->w, .mean = c->keep,
             .scale = c->keep + d->c};
    dp_pool_run(grad_task[dp_isa_paths_level()], &j);
    if (!c->din)
        return;
    if (!c->sum || sync_grads(c, &j) < 0)
        j.rows = (float)j.R, j.db = c->gb, j.dg = c->gw;
    dp_pool_run(din_task[dp_isa_paths_level()], &j);
}

/* ---- device: training only (evaluation stays on the host) ---- */

/* Rows of a batch of n records. */
static long rows_of(const dp_layer *d, int n) { return (long)n * d->h * d->w; }

/* mean, 1/std and variance (3C floats: --sync-bn is the CPU's), then the
 * partial sums and the double mean (kernels.h, "batch norm"), one float
 * spare to align them to 8 bytes. */
static size_t dev_keep(const dp_layer *d, int max_batch)
{
    size_t doubles = (2 * (size_t)dp_bn_blocks(rows_of(d, max_batch)) + 1) * (size_t)d->c;
    return 3 * (size_t)d->c + 1 + 2 * doubles;
}

static dp_ka_bn dev_args(const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    int C = d->c;
    /* device addresses, aligned here as numbers: the keep's floats need not
     * start on 8 bytes */
    uintptr_t part = (uintptr_t)(c->keep + 3 * C);
    part = (part + 7) & ~(uintptr_t)7;
    return (dp_ka_bn){.x = c->in, .dy = c->dout, .y = c->out, .dx = c->din, .w = c->w,
                      .b = c->b, .gw = c->gw, .gb = c->gb, .mean = c->keep,
                      .inv = c->keep + C, .var = c->keep + 2 * C, .rm = c->state,
                      .rv = c->state + C, .nbt = c->state + 2 * C, .part = (double *)part,
                      .R = rows_of(d, c->batch), .C = C, .momentum = BN_MOMENTUM,
                      .eps = BN_EPS};
}

static void dev_run(const dp_dexec *x, dp_kernel_id id, long items, dp_ka_bn *a, int pass)
{
    dp_kernel k = {.id = id, .items = items};
    a->pass = pass;
    k.u.bn = *a;
    dp_dexec_launch(x, &k);
}

/* The statistics in four launches: block sums, the mean, block sums of
 * the squares about it, then the variance and the running statistics. */
static void dev_forward(const dp_dexec *x, const dp_layer_call *c)
{
    dp_ka_bn a = dev_args(c);
    long parts = dp_bn_blocks(a.R) * a.C;
    dev_run(x, DP_K_BN_PART, parts, &a, DP_BN_SUM);
    dev_run(x, DP_K_BN_MEAN, a.C, &a, 0);
    dev_run(x, DP_K_BN_PART, parts, &a, DP_BN_SQUARES);
    dev_run(x, DP_K_BN_STATS, a.C, &a, 0);
    dev_run(x, DP_K_BN_NORM, a.R * a.C, &a, 0);
}

static void dev_backward(const dp_dexec *x, const dp_layer_call *c)
{
    dp_ka_bn a = dev_args(c);
    dev_run(x, DP_K_BN_PART, dp_bn_blocks(a.R) * a.C, &a, DP_BN_GRADS);
    dev_run(x, DP_K_BN_GRAD, a.C, &a, 0);
    if (c->din)
        dev_run(x, DP_K_BN_DIN, a.R * a.C, &a, 0);
}

const dp_layer_ops dp_layer_batchnorm = {
    .kind = DP_LAYER_BATCHNORM, .name = "bn", .token = 2,
    .flags = DP_LK_BATCH_SUM | DP_LK_CPU_FUSES_RELU | DP_LK_RELU_GRAD,
    .example = "bn", .help = "batch norm (features after dense, channels after conv)",
    .parse = parse, .shapes = shapes, .init_params = init_params,
    .buffers = buffers, .init_buffers = init_buffers, .keep_floats = keep_floats,
    .forward = forward, .backward = backward,
    .mp = DP_MP_REFUSE,
    .mp_reason = "its statistics span every row of the batch; not split yet",
    .dev_forward = dev_forward, .dev_backward = dev_backward, .dev_keep = dev_keep,
};
