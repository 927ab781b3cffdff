/* relu: out = max(in, 0).  After a dense, conv or local layer it runs in
 * that layer's epilogue (DP_LK_FUSES_RELU), and its mask in the input
 * gradient of a layer after it (DP_LK_TAKES_RELU_MASK). */
#include "nn/layer_impl.h"

#include "device/dexec.h"
#include "downpour/layers.h"

static int parse(dp_spec_parser *p, const char *s, const char *end)
{
    (void)s, (void)end;
    return dp_spec_add(p, DP_LAYER_RELU) ? 0 : -1;
}

static float forward(const dp_layer_call *c)
{
    dp_relu_forward(c->out, c->in, c->batch * c->d->in);
    return 0.0f;
}

static void backward(const dp_layer_call *c)
{
    if (c->din)
        dp_relu_backward(c->din, c->dout, c->out, c->batch * c->d->in);
}

/* A band of output rows is the same band of input rows. */
static void mp_forward(const dp_layer_call *c)
{
    const dp_layer *L = c->d;
    size_t row = (size_t)L->ow * L->oc;
    for (int r = 0; r < c->batch; r++) {
        size_t at = (size_t)r * L->out + (size_t)c->y0 * row;
        dp_relu_forward(c->out + at, c->in + at, (int)((size_t)(c->y1 - c->y0) * row));
    }
}

static void mp_backward(const dp_layer_call *c)
{
    const dp_layer *L = c->d;
    size_t row = (size_t)L->ow * L->oc;
    if (c->din)
        for (int r = 0; r < c->batch; r++) {
            size_t at = (size_t)r * L->out + (size_t)c->y0 * row;
            dp_relu_backward(c->din + at, c->dout + at, c->out + at,
                             (int)((size_t)(c->y1 - c->y0) * row));
        }
}

static void dev_forward(const dp_dexec *x, const dp_layer_call *c)
{
    dp_kernel k = {.id = DP_K_RELU, .items = (long)c->batch * c->d->in};
    k.u.relu = (dp_ka_relu){c->out, c->in};
    dp_dexec_launch(x, &k);
}

static void dev_backward(const dp_dexec *x, const dp_layer_call *c)
{
    if (!c->din)
        return;
    dp_kernel k = {.id = DP_K_RELU_BWD, .items = (long)c->batch * c->d->in};
    k.u.relu_bwd = (dp_ka_relu_bwd){c->din, c->dout, c->out};
    dp_dexec_launch(x, &k);
}

const dp_layer_ops dp_layer_relu = {
    .kind = DP_LAYER_RELU, .name = "relu", .token = 2,
    .example = "relu", .help = "max(x, 0)", .flags = DP_LK_RELU | DP_LK_MP_SAME_ROWS,
    .parse = parse,
    .forward = forward, .backward = backward,
    .mp = DP_MP_ROWS, .mp_forward = mp_forward, .mp_backward = mp_backward,
    .dev_forward = dev_forward, .dev_backward = dev_backward,
};
