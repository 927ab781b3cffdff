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
#include <string.h>

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
 * The device's bodies (kernels.h) run one row or one feature per thread.
 * The CPU makes the same additions in the same order with its vector lanes
 * (isa_paths.h; test_tokens and test_layer_kinds hold it to the sim
 * device's bits under each DOWNPOUR_ISA cap): a row's sums as DP_LN_LANES
 * partial sums, eight features at a time (dp_d8), and the weight gradients
 * a block of features at a time over the rows.  vit-mnist's five ln layers ran
 * item by item through the device's bodies, one dependent addition after
 * another, and took about 17 % of its step. */
#define L DP_LN_LANES
_Static_assert(DP_LN_LANES == 8, "dp_lanes_sum and dp_d8 are eight lanes");
#define BLOCK 256

typedef struct ln_job {
    const dp_layer_call *c;
    size_t R;
    int F;
    float *mean, *inv; /* the keep: R each */
} ln_job;

/* Rows [lo, hi): statistics, then y = (x - mean) * inv * w + b. */
static inline __attribute__((always_inline)) void fwd_task_body(void *ctx, int i, int n)
{
    const ln_job *j = ctx;
    const dp_layer_call *c = j->c;
    size_t lo, hi, F = (size_t)j->F, F8 = F / L * L;
    dp_pool_range(j->R, 1, i, n, &lo, &hi);
    for (size_t r = lo; r < hi; r++) {
        const float *x = c->in + r * F;
        double s[L], v[L];
        dp_lanes_sum(x, F, s);
        double mu = dp_k_sum8(s) / j->F;
        dp_d8 acc = {0};
        for (size_t f = 0; f < F8; f += L) {
            dp_d8 t;
            DP_LOAD8(t, x + f);
            t -= mu;
            acc += t * t;
        }
        memcpy(v, &acc, sizeof v);
        for (size_t f = F8; f < F; f++) {
            double t = x[f] - mu;
            v[f % L] += t * t;
        }
        float m = (float)mu, iv = (float)(1.0 / sqrt(dp_k_sum8(v) / j->F + LN_EPS));
        j->mean[r] = m, j->inv[r] = iv;
        float *y = c->out + r * F;
        for (size_t f = 0; f < F; f++)
            y[f] = (x[f] - m) * iv * c->w[f] + c->b[f];
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

/* Rows [lo, hi): dx = inv (g - mean(g) - xhat mean(g xhat)), g = dy * w,
 * the two means in double, as dp_k_ln_din. */
static inline __attribute__((always_inline)) void din_task_body(void *ctx, int i, int n)
{
    const ln_job *j = ctx;
    const dp_layer_call *c = j->c;
    const float *w = c->w;
    size_t lo, hi, F = (size_t)j->F, F8 = F / L * L;
    dp_pool_range(j->R, 1, i, n, &lo, &hi);
    for (size_t r = lo; r < hi; r++) {
        const float *x = c->in + r * F, *dy = c->dout + r * F;
        float m = j->mean[r], iv = j->inv[r];
        double sg[L], sgx[L];
        dp_d8 ag = {0}, agx = {0};
        for (size_t f = 0; f < F8; f += L) {
            dp_f8 gv, xv, wv;
            memcpy(&gv, dy + f, sizeof gv);
            memcpy(&wv, w + f, sizeof wv);
            memcpy(&xv, x + f, sizeof xv);
            gv = gv * wv;
            dp_d8 g = __builtin_convertvector(gv, dp_d8);
            ag += g;
            agx += g * __builtin_convertvector((xv - m) * iv, dp_d8);
        }
        memcpy(sg, &ag, sizeof sg);
        memcpy(sgx, &agx, sizeof sgx);
        for (size_t f = F8; f < F; f++) {
            float gv = dy[f] * w[f];
            sg[f % L] += gv;
            sgx[f % L] += (double)gv * ((x[f] - m) * iv);
        }
        float mg = (float)(dp_k_sum8(sg) / j->F), mgx = (float)(dp_k_sum8(sgx) / j->F);
        float *dx = c->din + r * F;
        for (size_t f = 0; f < F; f++) {
            float gv = dy[f] * w[f], xhat = (x[f] - m) * iv;
            dx[f] = iv * (gv - mg - xhat * mgx);
        }
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
