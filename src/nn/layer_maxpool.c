/* maxpool: the max over each window, per channel (a stride that defaults
 * to the window).  Model parallelism splits it by output rows. */
#include "nn/layer_impl.h"

#include "device/dexec.h"
#include "downpour/layers.h"

static int parse(dp_spec_parser *p, const char *s, const char *end)
{
    return dp_lk_parse_pool(p, DP_LAYER_MAXPOOL, s, end);
}

static void emit(dp_spec_parser *p, const dp_layer *d) { dp_lk_emit_window(p, "maxpool", d, true); }

static float forward(const dp_layer_call *c)
{
    dp_maxpool_forward(c->out, c->in, &c->d->win, c->batch);
    return 0.0f;
}

static void backward(const dp_layer_call *c)
{
    if (c->din && c->relu) /* in is the relu's output */
        dp_maxpool_relu_backward(c->din, c->dout, c->in, c->out, &c->d->win, c->batch);
    else if (c->din)
        dp_maxpool_backward(c->din, c->dout, c->in, c->out, &c->d->win, c->batch);
}

static void mp_forward(const dp_layer_call *c)
{
    dp_maxpool_forward_band(c->out, c->in, &c->d->win, c->batch, c->y0, c->y1);
}

static void mp_backward(const dp_layer_call *c)
{
    if (c->din)
        dp_maxpool_backward_band(c->din, c->dout, c->in, c->out, &c->d->win, c->batch, c->y0,
                                 c->y1);
}

static void dev_forward(const dp_dexec *x, const dp_layer_call *c)
{
    if (c->batch >= 1)
        dp_dexec_window(x, DP_K_MAXPOOL_FWD, (long)c->batch * c->d->out, c->out, c->in, NULL,
                        NULL, &c->d->win);
}

static void dev_backward(const dp_dexec *x, const dp_layer_call *c)
{
    if (c->batch >= 1 && c->din)
        dp_dexec_window(x, DP_K_MAXPOOL_BWD, (long)c->batch * c->d->in, c->din, c->in, c->dout,
                        c->out, &c->d->win);
}

const dp_layer_ops dp_layer_maxpool = {
    .kind = DP_LAYER_MAXPOOL, .name = "maxpool", .token = 1,
    .example = "maxpool2", .help = "max pooling 2x2 (maxpool3x3s2p1)",
    .flags = DP_LK_TAKES_RELU_MASK,
    .parse = parse, .emit = emit,
    .forward = forward, .backward = backward,
    .mp = DP_MP_ROWS, .mp_forward = mp_forward, .mp_backward = mp_backward,
    .dev_forward = dev_forward, .dev_backward = dev_backward,
};
