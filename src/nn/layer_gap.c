/* gap: global average pooling, the mean of each channel over the H x W
 * pixels of an image, giving C features (PyTorch's AdaptiveAvgPool2d(1)
 * then flatten; a 1x1 map is the same in NHWC and CHW order, so a dense
 * layer after it needs no flatten).  The activations are flat after it.
 * Each mean is summed in double in pixel order, one item per (record,
 * channel), the same on the CPU and the device (kernels.h, "gap"), so the
 * two give the same bits.  No parameters; model parallelism runs it whole
 * on every task (FULL), as flatten. */
#include "nn/layer_impl.h"

#include "device/dexec.h"
#include "downpour/pool.h"

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

static void fwd_task(void *ctx, int i, int n)
{
    const dp_layer_call *c = ctx;
    dp_kernel k = {.id = DP_K_GAP_FWD};
    k.u.gap = args(c, c->out, c->in);
    size_t lo, hi;
    dp_pool_range((size_t)c->batch * c->d->c, 16, i, n, &lo, &hi);
    for (size_t j = lo; j < hi; j++)
        dp_k_gap_fwd(&k, (long)j);
}

static void bwd_task(void *ctx, int i, int n)
{
    const dp_layer_call *c = ctx;
    dp_kernel k = {.id = DP_K_GAP_BWD};
    k.u.gap = args(c, c->din, c->dout);
    size_t lo, hi;
    dp_pool_range((size_t)c->batch * c->d->in, 64, i, n, &lo, &hi);
    for (size_t j = lo; j < hi; j++)
        dp_k_gap_bwd(&k, (long)j);
}

static float forward(const dp_layer_call *c)
{
    dp_pool_run(fwd_task, (void *)c);
    return 0.0f;
}

static void backward(const dp_layer_call *c)
{
    if (c->din)
        dp_pool_run(bwd_task, (void *)c);
}

static void dev_forward(const dp_dexec *x, const dp_layer_call *c)
{
    if (c->batch < 1)
        return;
    dp_kernel k = {.id = DP_K_GAP_FWD, .items = (long)c->batch * c->d->c};
    k.u.gap = args(c, c->out, c->in);
    dp_dexec_launch(x, &k);
}

static void dev_backward(const dp_dexec *x, const dp_layer_call *c)
{
    if (c->batch < 1 || !c->din)
        return;
    dp_kernel k = {.id = DP_K_GAP_BWD, .items = (long)c->batch * c->d->in};
    k.u.gap = args(c, c->din, c->dout);
    dp_dexec_launch(x, &k);
}

const dp_layer_ops dp_layer_gap = {
    .kind = DP_LAYER_GAP, .name = "gap", .token = 2,
    .example = "gap", .help = "global average pooling: an image's C channels to C features",
    .parse = parse, .forward = forward, .backward = backward,
    .mp = DP_MP_FULL,
    .dev_forward = dev_forward, .dev_backward = dev_backward,
};
