/* hwc: a CHW input image (as datasets store images) to NHWC; the grammar
 * inserts it before the first image layer of an input of several channels.
 * Model parallelism runs it whole on every task. */
#include "nn/layer_impl.h"

#include "device/dexec.h"
#include "downpour/layers.h"


static float forward(const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    dp_chw_to_hwc(c->out, c->in, c->batch, d->c, d->h * d->w);
    return 0.0f;
}

static void backward(const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    if (c->din)
        dp_hwc_to_chw(c->din, c->dout, c->batch, d->c, d->h * d->w);
}

static void dev_forward(const dp_dexec *x, const dp_layer_call *c)
{
    if (c->batch >= 1)
        dp_dexec_layout(x, c->out, c->in, c->batch, c->d->c, c->d->h * c->d->w, 0);
}

static void dev_backward(const dp_dexec *x, const dp_layer_call *c)
{
    if (c->batch >= 1 && c->din)
        dp_dexec_layout(x, c->din, c->dout, c->batch, c->d->c, c->d->h * c->d->w, 1);
}

const dp_layer_ops dp_layer_hwc = {
    .kind = DP_LAYER_HWC, .name = "hwc", .token = 0,
    .forward = forward, .backward = backward,
    .mp = DP_MP_FULL,
    .dev_forward = dev_forward, .dev_backward = dev_backward,
};
