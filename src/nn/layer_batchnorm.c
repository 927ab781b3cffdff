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
 * Per-channel sums run channel by channel, each over its rows in order in
 * double, split over the pool by channels; the element passes split by
 * rows: results never depend on the thread count.  On a device the same
 * passes are kernels (kernels.h, "batch norm") that give the CPU's bits.  Its forward keeps the
 * batch's mean, 1/std and variance (3C floats) for its backward and the
 * running update; evaluation uses the keep's 1/std for the running one. */
#include "nn/layer_impl.h"

#include <math.h>

#include "device/dexec.h"
#include "downpour/pool.h"

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

static size_t keep_floats(const dp_layer *d, int max_batch)
{
    (void)max_batch;
    return 3 * (size_t)d->c;
}

/* One pass over a call, split over the pool. */
typedef struct job {
    const dp_layer_call *c;
    int C;
    size_t R;
    const float *mean, *scale; /* the normalisation: (x - mean) * scale */
} job;

/* Channels [lo, hi): the batch's mean, 1/std and variance into the keep. */
static void stats_task(void *ctx, int i, int n)
{
    const job *j = ctx;
    size_t lo, hi;
    dp_pool_range((size_t)j->C, 1, i, n, &lo, &hi);
    const float *x = j->c->in;
    float *mean = j->c->keep, *inv = j->c->keep + j->C, *var = j->c->keep + 2 * j->C;
    for (size_t ch = lo; ch < hi; ch++) {
        double s = 0.0, v = 0.0;
        for (size_t r = 0; r < j->R; r++)
            s += x[r * j->C + ch];
        double mu = s / (double)j->R;
        for (size_t r = 0; r < j->R; r++) {
            double t = x[r * j->C + ch] - mu;
            v += t * t;
        }
        mean[ch] = (float)mu;
        var[ch] = (float)(v / (double)j->R);
        inv[ch] = (float)(1.0 / sqrt(v / (double)j->R + BN_EPS));
    }
}

/* Rows [lo, hi): out = (x - mean) * scale * gamma + beta. */
static void norm_task(void *ctx, int i, int n)
{
    const job *j = ctx;
    size_t lo, hi;
    dp_pool_range(j->R, 1, i, n, &lo, &hi);
    const dp_layer_call *c = j->c;
    for (size_t r = lo; r < hi; r++) {
        const float *x = c->in + r * j->C;
        float *y = c->out + r * j->C;
        for (int ch = 0; ch < j->C; ch++)
            y[ch] = (x[ch] - j->mean[ch]) * j->scale[ch] * c->w[ch] + c->b[ch];
    }
}

static float forward(const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    int C = d->c;
    job j = {c, C, (size_t)c->batch * d->h * d->w, NULL, NULL};
    float *rm = c->state, *rv = c->state + C;
    if (!c->train) { /* the running statistics: their 1/std into the keep's second half */
        float *inv = c->keep + C;
        for (int ch = 0; ch < C; ch++)
            inv[ch] = (float)(1.0 / sqrt((double)rv[ch] + BN_EPS));
        j.mean = rm, j.scale = inv;
        dp_pool_run(norm_task, &j);
        return 0.0f;
    }
    dp_pool_run(stats_task, &j);
    const float *mean = c->keep, *inv = c->keep + C, *var = c->keep + 2 * C;
    double R = (double)j.R;
    for (int ch = 0; ch < C; ch++) { /* PyTorch's: the unbiased variance */
        float unbiased = (float)(R > 1 ? (double)var[ch] * R / (R - 1) : (double)var[ch]);
        rm[ch] = (1.0f - BN_MOMENTUM) * rm[ch] + BN_MOMENTUM * mean[ch];
        rv[ch] = (1.0f - BN_MOMENTUM) * rv[ch] + BN_MOMENTUM * unbiased;
    }
    c->state[2 * C] += 1.0f;
    j.mean = mean, j.scale = inv;
    dp_pool_run(norm_task, &j);
    return 0.0f;
}

/* Channels [lo, hi): dgamma = sum dy * xhat and dbeta = sum dy. */
static void grad_task(void *ctx, int i, int n)
{
    const job *j = ctx;
    const dp_layer_call *c = j->c;
    size_t lo, hi;
    dp_pool_range((size_t)j->C, 1, i, n, &lo, &hi);
    for (size_t ch = lo; ch < hi; ch++) {
        double g = 0.0, b = 0.0;
        for (size_t r = 0; r < j->R; r++) {
            size_t at = r * j->C + ch;
            double dy = c->dout[at];
            g += dy * ((c->in[at] - j->mean[ch]) * j->scale[ch]);
            b += dy;
        }
        c->gw[ch] = (float)g;
        c->gb[ch] = (float)b;
    }
}

/* Rows [lo, hi): dx = gamma/std/R * (R dy - dbeta - xhat dgamma). */
static void din_task(void *ctx, int i, int n)
{
    const job *j = ctx;
    const dp_layer_call *c = j->c;
    size_t lo, hi;
    dp_pool_range(j->R, 1, i, n, &lo, &hi);
    float R = (float)j->R;
    for (size_t r = lo; r < hi; r++) {
        size_t at = r * j->C;
        for (int ch = 0; ch < j->C; ch++) {
            float xhat = (c->in[at + ch] - j->mean[ch]) * j->scale[ch];
            float k = c->w[ch] * j->scale[ch] / R;
            c->din[at + ch] = k * (R * c->dout[at + ch] - c->gb[ch] - xhat * c->gw[ch]);
        }
    }
}

/* The backward of a training forward (batch statistics, in the keep). */
static void backward(const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    job j = {c, d->c, (size_t)c->batch * d->h * d->w, c->keep, c->keep + d->c};
    dp_pool_run(grad_task, &j);
    if (c->din)
        dp_pool_run(din_task, &j);
}

/* ---- device: training only (evaluation stays on the host) ---- */

static size_t dev_keep(const dp_layer *d, int max_batch) { return keep_floats(d, max_batch); }

static dp_ka_bn dev_args(const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    int C = d->c;
    return (dp_ka_bn){.x = c->in, .dy = c->dout, .y = c->out, .dx = c->din, .w = c->w,
                      .b = c->b, .gw = c->gw, .gb = c->gb, .mean = c->keep,
                      .inv = c->keep + C, .var = c->keep + 2 * C, .rm = c->state,
                      .rv = c->state + C, .nbt = c->state + 2 * C,
                      .R = (long)c->batch * d->h * d->w, .C = C, .momentum = BN_MOMENTUM,
                      .eps = BN_EPS};
}

static void dev_run(const dp_dexec *x, dp_kernel_id id, long items, const dp_ka_bn *a)
{
    dp_kernel k = {.id = id, .items = items};
    k.u.bn = *a;
    dp_dexec_launch(x, &k);
}

static void dev_forward(const dp_dexec *x, const dp_layer_call *c)
{
    dp_ka_bn a = dev_args(c);
    dev_run(x, DP_K_BN_STATS, a.C, &a);
    dev_run(x, DP_K_BN_NORM, a.R * a.C, &a);
}

static void dev_backward(const dp_dexec *x, const dp_layer_call *c)
{
    dp_ka_bn a = dev_args(c);
    dev_run(x, DP_K_BN_GRAD, a.C, &a);
    if (c->din)
        dev_run(x, DP_K_BN_DIN, a.R * a.C, &a);
}

const dp_layer_ops dp_layer_batchnorm = {
    .kind = DP_LAYER_BATCHNORM, .name = "bn", .token = 2,
    .example = "bn", .help = "batch norm (features after dense, channels after conv)",
    .parse = parse, .shapes = shapes, .init_params = init_params,
    .buffers = buffers, .init_buffers = init_buffers, .keep_floats = keep_floats,
    .forward = forward, .backward = backward,
    .mp = DP_MP_REFUSE,
    .mp_reason = "its statistics span every row of the batch; not split yet",
    .dev_forward = dev_forward, .dev_backward = dev_backward, .dev_keep = dev_keep,
};
