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
 * x features: the device's kernels, on the CPU over the pool. */
static dp_kernel gap_kernel(const dp_layer_call *c, bool fwd)
{
    dp_kernel k = {.id = fwd ? DP_K_GAP_FWD : DP_K_GAP_BWD,
                   .items = (long)c->batch * (fwd ? c->d->c : c->d->in)};
    k.u.gap = fwd ? args(c, c->out, c->in) : args(c, c->din, c->dout);
    return k;
}

static float forward(const dp_layer_call *c)
{
    dp_kernel k = gap_kernel(c, true);
    dp_lk_pool_kernel(&k, 16);
    return 0.0f;
}

static void backward(const dp_layer_call *c)
{
    if (!c->din)
        return;
    dp_kernel k = gap_kernel(c, false);
    dp_lk_pool_kernel(&k, 64);
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
