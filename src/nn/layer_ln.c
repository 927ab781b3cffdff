/* ln: layer normalisation over the F features of each row, as PyTorch's
 * nn.LayerNorm(F): y = (x - mean) / sqrt(var + eps) * weight + bias, the
 * row's mean and biased variance, eps 1e-5, the same in training and
 * evaluation (no running statistics).  Weight 1 and bias 0 at the start,
 * named weight and bias (F each) in files.
 *
 * A row is a record's features on flat activations (after a dense layer,
 * flatten or gap, or a flat input), and a position's C channels on an
 * image: an NHWC image of h x w positions is h*w tokens of width C, token
 * after token (docs/models.md, "Images as tokens"), so ln there is a
 * transformer's nn.LayerNorm(D) over each token.  PyTorch's LayerNorm([C, H, W]) over a
 * whole image is flatten-ln.
 *
 * A device launches kernels.h's bodies ("layer norm"); the CPU's passes
 * below make the same additions in the same order, so the two give the
 * same bits.  The CPU splits them over the pool by rows (statistics and
 * normalisation, input gradient) and by features (weight gradients).  The
 * forward keeps each row's mean and 1/std (2 x batch x h x w floats) for
 * the backward. */
#include "nn/layer_impl.h"

#include <math.h>

#include "device/dexec.h"
#include "downpour/pool.h"
#include "nn/isa_paths.h"

#define LN_EPS 1e-5

static int parse(dp_spec_parser *p, const char *s, const char *end)
{
    (void)s, (void)end;
    if (!p->flat && p->h * p->w > 1 && dp_spec_need_image(p) < 0) /* tokens: NHWC */
        return -1;
    dp_layer *d = dp_spec_add(p, DP_LAYER_LAYERNORM);
    return d && dp_spec_params(p, d, (size_t)d->c, (size_t)d->c) == 0 ? 0 : -1;
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
    for (int f = 0; f < d->c; f++)
        w[f] = 1.0f, b[f] = 0.0f;
}

/* The rows of a batch: records, or their positions on an image. */
static long rows(const dp_layer *d, int batch) { return (long)batch * d->h * d->w; }

static size_t keep_floats(const dp_layer *d, int max_batch)
{
    return 2 * (size_t)rows(d, max_batch);
}

static dp_kernel kernel(const dp_layer_call *c, dp_kernel_id id, long items)
{
    dp_kernel k = {.id = id, .items = items};
    k.u.ln = (dp_ka_ln){.x = c->in, .dy = c->dout, .y = c->out, .dx = c->din, .w = c->w,
                        .b = c->b, .gw = c->gw, .gb = c->gb, .mean = c->keep,
                        .inv = c->keep + rows(c->d, c->batch), .R = rows(c->d, c->batch),
                        .F = c->d->c,
                        .eps = LN_EPS};
    return k;
}

/* ---- the CPU's passes ----
 * The device's bodies (kernels.h) run one row or one feature per thread,
 * each row's or feature's sums in double in order.  The CPU does the same
 * additions in the same order with its vector lanes across independent
 * outputs, so it gives the device's bits on every instruction-set path
 * (isa_paths.h; test_tokens and test_layer_kinds hold them to the sim
 * device's, under each DOWNPOUR_ISA cap): the statistics and the input
 * gradient take GROUP rows at a time, one lane each (a row's sum is a
 * chain of dependent additions: one row alone waits on every one), and
 * the weight gradients a block of features at a time over the rows.
 * vit-mnist's five ln layers ran item by item through the device's
 * bodies and took about 17 % of its step. */
#define GROUP 8
#define BLOCK 256

typedef struct ln_job {
    const dp_layer_call *c;
    size_t R;
    int F;
    float *mean, *inv; /* the keep: R each */
} ln_job;

/* Rows x[0..g) of F each (g <= GROUP): each row's mean and 1/std, as
 * dp_k_ln_stats. */
static inline __attribute__((always_inline)) void group_stats(const float *x, int F, size_t g,
                                                              float *mean, float *inv)
{
    double s[GROUP], v[GROUP], mu[GROUP];
    for (size_t k = 0; k < g; k++)
        s[k] = 0.0, v[k] = 0.0;
    for (int f = 0; f < F; f++)
        for (size_t k = 0; k < g; k++)
            s[k] += x[k * (size_t)F + f];
    for (size_t k = 0; k < g; k++)
        mu[k] = s[k] / F;
    for (int f = 0; f < F; f++)
        for (size_t k = 0; k < g; k++) {
            double t = x[k * (size_t)F + f] - mu[k];
            v[k] += t * t;
        }
    for (size_t k = 0; k < g; k++) {
        mean[k] = (float)mu[k];
        inv[k] = (float)(1.0 / sqrt(v[k] / F + LN_EPS));
    }
}

/* Rows [lo, hi): statistics, then y = (x - mean) * inv * w + b. */
static inline __attribute__((always_inline)) void fwd_task_body(void *ctx, int i, int n)
{
    const ln_job *j = ctx;
    const dp_layer_call *c = j->c;
    size_t lo, hi, F = (size_t)j->F;
    dp_pool_range(j->R, GROUP, i, n, &lo, &hi);
    for (size_t r = lo; r < hi; r += GROUP) {
        if (hi - r >= GROUP)
            group_stats(c->in + r * F, j->F, GROUP, j->mean + r, j->inv + r);
        else
            group_stats(c->in + r * F, j->F, hi - r, j->mean + r, j->inv + r);
    }
    for (size_t r = lo; r < hi; r++) {
        const float *x = c->in + r * F;
        float *y = c->out + r * F, mu = j->mean[r], iv = j->inv[r];
        for (size_t f = 0; f < F; f++)
            y[f] = (x[f] - mu) * iv * c->w[f] + c->b[f];
    }
}
DP_ISA_POOL_TASK(fwd_task)

/* Features [lo, hi): dw = sum dy * xhat and db = sum dy over the rows in
 * order, in double, as dp_k_ln_grad. */
static inline __attribute__((always_inline)) void grad_task_body(void *ctx, int i, int n)
{
    const ln_job *j = ctx;
    const dp_layer_call *c = j->c;
    size_t lo, hi, F = (size_t)j->F;
    dp_pool_range(F, 16, i, n, &lo, &hi);
    for (size_t f0 = lo; f0 < hi; f0 += BLOCK) {
        size_t m = hi - f0 < BLOCK ? hi - f0 : BLOCK;
        double g[BLOCK], b[BLOCK];
        for (size_t k = 0; k < m; k++)
            g[k] = 0.0, b[k] = 0.0;
        for (size_t r = 0; r < j->R; r++) {
            const float *dy = c->dout + r * F + f0, *x = c->in + r * F + f0;
            float mu = j->mean[r], iv = j->inv[r];
            for (size_t k = 0; k < m; k++) {
                double d = dy[k];
                g[k] += d * ((x[k] - mu) * iv);
                b[k] += d;
            }
        }
        for (size_t k = 0; k < m; k++)
            c->gw[f0 + k] = (float)g[k], c->gb[f0 + k] = (float)b[k];
    }
}
DP_ISA_POOL_TASK(grad_task)

/* Rows r0.. of a group (g <= GROUP): dx = inv (g - mean(g) - xhat
 * mean(g xhat)), g = dy * w, the two means in double, as dp_k_ln_din. */
static inline __attribute__((always_inline)) void group_din(const ln_job *j, size_t r0, size_t g)
{
    const dp_layer_call *c = j->c;
    size_t F = (size_t)j->F;
    const float *x = c->in + r0 * F, *dy = c->dout + r0 * F, *w = c->w;
    const float *mu = j->mean + r0, *iv = j->inv + r0;
    double sg[GROUP], sgx[GROUP];
    for (size_t k = 0; k < g; k++)
        sg[k] = 0.0, sgx[k] = 0.0;
    for (size_t f = 0; f < F; f++)
        for (size_t k = 0; k < g; k++) {
            float gv = dy[k * F + f] * w[f];
            sg[k] += gv;
            sgx[k] += (double)gv * ((x[k * F + f] - mu[k]) * iv[k]);
        }
    for (size_t k = 0; k < g; k++) {
        float mg = (float)(sg[k] / j->F), mgx = (float)(sgx[k] / j->F), m = mu[k], s = iv[k];
        const float *xr = x + k * F, *dyr = dy + k * F;
        float *dx = c->din + (r0 + k) * F;
        for (size_t f = 0; f < F; f++) {
            float gv = dyr[f] * w[f], xhat = (xr[f] - m) * s;
            dx[f] = s * (gv - mg - xhat * mgx);
        }
    }
}

static inline __attribute__((always_inline)) void din_task_body(void *ctx, int i, int n)
{
    const ln_job *j = ctx;
    size_t lo, hi;
    dp_pool_range(j->R, GROUP, i, n, &lo, &hi);
    for (size_t r = lo; r < hi; r += GROUP) {
        if (hi - r >= GROUP)
            group_din(j, r, GROUP);
        else
            group_din(j, r, hi - r);
    }
}
DP_ISA_POOL_TASK(din_task)

static ln_job job_of(const dp_layer_call *c)
{
    size_t R = (size_t)rows(c->d, c->batch);
    return (ln_job){c, R, c->d->c, c->keep, c->keep + R};
}

static float forward(const dp_layer_call *c)
{
    ln_job j = job_of(c);
    if (j.R)
        dp_pool_run(fwd_task[dp_isa_paths_level()], &j);
    return 0.0f;
}

static void backward(const dp_layer_call *c)
{
    ln_job j = job_of(c);
    dp_pool_run(grad_task[dp_isa_paths_level()], &j);
    if (c->din && j.R)
        dp_pool_run(din_task[dp_isa_paths_level()], &j);
}

static size_t dev_keep(const dp_layer *d, int max_batch) { return keep_floats(d, max_batch); }

static void dev_forward(const dp_dexec *x, const dp_layer_call *c)
{
    if (c->batch < 1)
        return;
    dp_kernel k = kernel(c, DP_K_LN_STATS, rows(c->d, c->batch));
    dp_dexec_launch(x, &k);
    k = kernel(c, DP_K_LN_NORM, (long)c->batch * c->d->in);
    dp_dexec_launch(x, &k);
}

static void dev_backward(const dp_dexec *x, const dp_layer_call *c)
{
    if (c->batch < 1)
        return;
    dp_kernel k = kernel(c, DP_K_LN_GRAD, c->d->c);
    dp_dexec_launch(x, &k);
    if (c->din) {
        k = kernel(c, DP_K_LN_DIN, rows(c->d, c->batch));
        dp_dexec_launch(x, &k);
    }
}

const dp_layer_ops dp_layer_ln = {
    .kind = DP_LAYER_LAYERNORM, .name = "ln", .token = 2,
    .example = "ln", .help = "layer norm over features, or each token's channels (nn.LayerNorm)",
    .parse = parse, .shapes = shapes, .init_params = init_params,
    .keep_floats = keep_floats,
    .forward = forward, .backward = backward,
    .mp = DP_MP_REFUSE,
    .mp_reason = "its mean and variance span every feature of a row, which a split "
                 "divides among the tasks, and its weights would be needed whole on every task; "
                 "not split yet",
    .dev_forward = dev_forward, .dev_backward = dev_backward, .dev_keep = dev_keep,
};
