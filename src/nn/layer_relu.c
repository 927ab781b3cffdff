/* relu: out = max(in, 0).  After a dense, conv or local layer it runs in
 * that layer's epilogue (DP_LK_FUSES_RELU; after a bn or a residual sum on
 * the CPU, DP_LK_CPU_FUSES_RELU), and its mask in the input gradient of a
 * layer after it (DP_LK_TAKES_RELU_MASK) or of the bn before it
 * (DP_LK_RELU_GRAD). */
#include "nn/layer_impl.h"

#include <stdint.h>
#include <string.h>

#include "device/dexec.h"
#include "downpour/layers.h"

static int parse(dp_spec_parser *p, const char *s, const char *end)
{
    (void)s, (void)end;
    return dp_spec_add(p, DP_LAYER_RELU) ? 0 : -1;
}

/* Spans of the call's elements, split over the pool (layer_pointwise.c): a
 * relu on its own (after a batch norm, a residual sum) streams three
 * arrays of the batch's size, a tenth of a resnet-fashion step on one
 * thread. */
static void forward_span(const dp_layer_call *c, size_t lo, size_t hi)
{
    dp_relu_forward(c->out + lo, c->in + lo, (int)(hi - lo));
}

/* With c->skip (the CPU executor: the shortcut's gradient at the input of
 * the block after it) the gradient at its output is dout + skip, added
 * here rather than in a pass of its own: the same sum, then the select. */
static void backward_span(const dp_layer_call *c, size_t lo, size_t hi)
{
    if (!c->skip) {
        dp_relu_backward(c->din + lo, c->dout + lo, c->out + lo, (int)(hi - lo));
        return;
    }
    const float *dout = c->dout, *skip = c->skip, *out = c->out;
    float *din = c->din;
    for (size_t i = lo; i < hi; i++) {
        /* the sum, or +0 where the relu cut it, as a mask of its bits (a
         * select here does not vectorise) */
        float g = dout[i] + skip[i];
        uint32_t u;
        memcpy(&u, &g, sizeof u);
        u &= 0u - (uint32_t)(out[i] > 0.0f);
        memcpy(&din[i], &u, sizeof u);
    }
}

static float forward(const dp_layer_call *c)
{
    dp_lk_pointwise(c, false, forward_span);
    return 0.0f;
}

static void backward(const dp_layer_call *c)
{
    if (c->din)
        dp_lk_pointwise(c, false, backward_span);
}

/* A band of output rows is the same band of input rows. */
static void mp_forward(const dp_layer_call *c) { dp_lk_pointwise(c, true, forward_span); }

static void mp_backward(const dp_layer_call *c)
{
    if (c->din)
        dp_lk_pointwise(c, true, backward_span);
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
