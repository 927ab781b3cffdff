/* flatten: an NHWC image to PyTorch's CHW feature order, so a dense layer after
 * it has nn.Linear's layout.  The grammar inserts it before a dense layer
 * after an image of several channels (the token flatten asks for it).
 * Model parallelism runs it whole on every task. */
#include "nn/layer_impl.h"

#include "device/dexec.h"
#include "downpour/layers.h"

static int parse(dp_spec_parser *p, const char *s, const char *end)
{
    (void)s, (void)end;
    return dp_spec_to_flat(p);
}

static float forward(const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    dp_hwc_to_chw(c->out, c->in, c->batch, d->c, d->h * d->w);
    return 0.0f;
}

static void backward(const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    if (c->din)
        dp_chw_to_hwc(c->din, c->dout, c->batch, d->c, d->h * d->w);
}

static void dev_forward(const dp_dexec *x, const dp_layer_call *c)
{
    if (c->batch >= 1)
        dp_dexec_layout(x, c->out, c->in, c->batch, c->d->c, c->d->h * c->d->w, 1);
}

static void dev_backward(const dp_dexec *x, const dp_layer_call *c)
{
    if (c->batch >= 1 && c->din)
        dp_dexec_layout(x, c->din, c->dout, c->batch, c->d->c, c->d->h * c->d->w, 0);
}

const dp_layer_ops dp_layer_flatten = {
    .kind = DP_LAYER_FLATTEN, .name = "flatten", .token = 2,
    .example = "flatten", .help = "an image to a vector (inserted before a dense layer)",
    .parse = parse, .forward = forward, .backward = backward,
    .mp = DP_MP_FULL,
    .dev_forward = dev_forward, .dev_backward = dev_backward,
};
