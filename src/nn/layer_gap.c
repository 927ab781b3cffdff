/* gap: global average pooling, the mean of each channel over the H x W
 * pixels of an image, giving C features (PyTorch's AdaptiveAvgPool2d(1)
 * then flatten; a 1x1 map is the same in NHWC and CHW order, so a dense
 * layer after it needs no flatten).  The activations are flat after it.
 * Each mean is summed in double in pixel order, the same on the CPU and
 * the device (kernels.h, "gap"), so the two give the same bits.  No parameters; model parallelism runs it whole
 * on every task (FULL), as flatten. */
#include "nn/layer_impl.h"

#include "device/dexec.h"
#include "downpour/pool.h"
#include "nn/isa_paths.h"

static int parse(dp_spec_parser *p, const char *s, const char *end)
{
    (void)s, (void)end;
    if (dp_spec_need_image(p) < 0)
        return -1;
    dp_layer *d = dp_spec_add(p, DP_LAYER_GAP);
    if (!d || dp_spec_out(p, d, d->c, 1, 1) < 0)
        return -1;
    p->hwc = false;
    p->flat = true;
    return 0;
}

static dp_ka_gap args(const dp_layer_call *c, float *dst, const float *src)
{
    const dp_layer *d = c->d;
    return (dp_ka_gap){dst, src, d->c, (long)d->h * d->w};
}

/* The pooling (fwd) or its gradient, items records x channels or records
 * x features: the device's kernels. */
static dp_kernel gap_kernel(const dp_layer_call *c, bool fwd)
{
    dp_kernel k = {.id = fwd ? DP_K_GAP_FWD : DP_K_GAP_BWD,
                   .items = (long)c->batch * (fwd ? c->d->c : c->d->in)};
    k.u.gap = fwd ? args(c, c->out, c->in) : args(c, c->din, c->dout);
    return k;
}

/* The CPU's passes, split by records: each channel's mean summed in
 * double in pixel order, as dp_k_gap_fwd, with the vector lanes across a
 * block of channels (isa_paths.h: the same bits on every path and the
 * device's); the gradient dout / hw to every pixel.  Item by item through
 * the device's bodies, the backward's two divisions an element took 4 % of
 * vit-mnist's step. */
#define BLOCK 256

static inline __attribute__((always_inline)) void fwd_task_body(void *ctx, int i, int n)
{
    const dp_layer_call *c = ctx;
    size_t C = (size_t)c->d->c, hw = (size_t)c->d->h * c->d->w, lo, hi;
    dp_pool_range((size_t)c->batch, 1, i, n, &lo, &hi);
    for (size_t r = lo; r < hi; r++)
        for (size_t c0 = 0; c0 < C; c0 += BLOCK) {
            size_t m = C - c0 < BLOCK ? C - c0 : BLOCK;
            const float *x = c->in + r * hw * C + c0;
            double s[BLOCK];
            for (size_t k = 0; k < m; k++)
                s[k] = 0.0;
            for (size_t p = 0; p < hw; p++)
                for (size_t k = 0; k < m; k++)
                    s[k] += x[p * C + k];
            for (size_t k = 0; k < m; k++)
                c->out[r * C + c0 + k] = (float)(s[k] / (double)hw);
        }
}
DP_ISA_POOL_TASK(fwd_task)

static inline __attribute__((always_inline)) void bwd_task_body(void *ctx, int i, int n)
{
    const dp_layer_call *c = ctx;
    size_t C = (size_t)c->d->c, hw = (size_t)c->d->h * c->d->w, lo, hi;
    float div = (float)hw;
    dp_pool_range((size_t)c->batch, 1, i, n, &lo, &hi);
    for (size_t r = lo; r < hi; r++)
        for (size_t p = 0; p < hw; p++) {
            float *dst = c->din + (r * hw + p) * C;
            const float *g = c->dout + r * C;
            for (size_t k = 0; k < C; k++)
                dst[k] = g[k] / div;
        }
}
DP_ISA_POOL_TASK(bwd_task)

static float forward(const dp_layer_call *c)
{
    if (c->batch > 0)
        dp_pool_run(fwd_task[dp_isa_paths_level()], (void *)c);
    return 0.0f;
}

static void backward(const dp_layer_call *c)
{
    if (c->din && c->batch > 0)
        dp_pool_run(bwd_task[dp_isa_paths_level()], (void *)c);
}

static void dev_forward(const dp_dexec *x, const dp_layer_call *c)
{
    if (c->batch < 1)
        return;
    dp_kernel k = gap_kernel(c, true);
    dp_dexec_launch(x, &k);
}

static void dev_backward(const dp_dexec *x, const dp_layer_call *c)
{
    if (c->batch < 1 || !c->din)
        return;
    dp_kernel k = gap_kernel(c, false);
    dp_dexec_launch(x, &k);
}

const dp_layer_ops dp_layer_gap = {
    .kind = DP_LAYER_GAP, .name = "gap", .token = 2,
    .example = "gap", .help = "global average pooling: an image's C channels to C features",
    .parse = parse, .forward = forward, .backward = backward,
    .mp = DP_MP_FULL,
    .dev_forward = dev_forward, .dev_backward = dev_backward,
};
