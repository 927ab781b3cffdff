/* conv: a 2-D convolution over an NHWC image, im2row then one product for
 * a chunk of records (docs/architecture.md, "Image layers").  Filters
 * (oc, kh, kw, c) here, Conv2d's (oc, c, kh, kw) in files.  Model
 * parallelism splits it by output rows; every task needs the whole filters,
 * so task j holds output channels [oc*j/K, oc*(j+1)/K) of them.  On the CPU
 * the shapes conv_direct.c covers run without lowering. */
#include "nn/conv_direct.h"
#include "nn/layer_impl.h"

static int parse(dp_spec_parser *p, const char *s, const char *end)
{
    return dp_lk_parse_filter(p, DP_LAYER_CONV, s, end);
}

static void emit(dp_spec_parser *p, const dp_layer *d) { dp_lk_emit_window(p, "conv", d, false); }

static int shapes(const dp_layer *d, int64_t w[6], int64_t b[3], int *bdim)
{
    w[0] = d->oc, w[1] = d->c, w[2] = d->win.kh, w[3] = d->win.kw;
    b[0] = d->oc;
    *bdim = 1;
    return 4;
}

/* each weight is used at every output position */
static double cost(const dp_layer *d) { return (double)d->w_len * d->oh * d->ow; }

/* Each product directly where conv_direct.c covers the shape and the
 * instruction sets allow, else lowered (docs/architecture.md, "Image
 * layers"). */
static float forward(const dp_layer_call *c)
{
    if (!dp_conv_direct_forward_ok(c->d))
        return dp_lk_lowered_forward(c, false);
    dp_conv_direct_forward(c);
    return 0.0f;
}

static void backward(const dp_layer_call *c)
{
    bool weights = dp_conv_direct_weights_ok(c->d);
    bool data = c->din && dp_conv_direct_data_ok(c->d);
    if (!weights && !data) {
        dp_lk_lowered_backward(c, false);
        return;
    }
    if (weights)
        dp_conv_direct_weights(c);
    if (data)
        dp_conv_direct_data(c);
    if (!weights || (c->din && !data))
        dp_lk_lowered_backward_part(c, !weights, c->din && !data);
}
static void mp_forward(const dp_layer_call *c) { dp_lk_lowered_band(c, false, false); }
static void mp_backward(const dp_layer_call *c) { dp_lk_lowered_band(c, false, true); }

static void mp_params(const dp_layer *d, int K, int j, int y0, int y1, size_t *w_full,
                      size_t *w_len, size_t *b_full, size_t *b_len, int *lo, int *hi)
{
    (void)y0, (void)y1;
    size_t per = d->w_len / (size_t)d->oc;
    *lo = (int)((long long)d->oc * j / K);
    *hi = (int)((long long)d->oc * (j + 1) / K);
    *w_full = d->w_off + (size_t)*lo * per;
    *w_len = (size_t)(*hi - *lo) * per;
    *b_full = d->b_off + (size_t)*lo;
    *b_len = (size_t)(*hi - *lo);
}

static size_t dev_scratch(const dp_layer *d, int mb) { return dp_lk_lowered_dev_scratch(d, mb); }
static long dev_ones(const dp_layer *d, int mb) { return dp_lk_lowered_dev_ones(d, mb, false); }
static void dev_forward(const struct dp_dexec *x, const dp_layer_call *c)
{
    dp_lk_lowered_dev_forward(x, c, false);
}
static void dev_backward(const struct dp_dexec *x, const dp_layer_call *c)
{
    dp_lk_lowered_dev_backward(x, c, false);
}

const dp_layer_ops dp_layer_conv = {
    .kind = DP_LAYER_CONV, .name = "conv", .token = 1,
    .example = "conv5x5x32", .help = "convolution, 5x5 window, 32 channels; s2 stride, p2 padding",
    .flags = DP_LK_FUSES_RELU | DP_LK_LOWERED | DP_LK_FILTER_ORDER | DP_LK_MP_SHARED_FILTERS,
    .parse = parse, .emit = emit,
    .fans = dp_lk_lowered_fans, .shapes = shapes, .cost = cost, .min_chunk = 1,
    .forward = forward, .backward = backward,
    .mp = DP_MP_ROWS, .mp_forward = mp_forward, .mp_backward = mp_backward,
    .mp_params = mp_params,
    .dev_forward = dev_forward, .dev_backward = dev_backward,
    .dev_scratch = dev_scratch, .dev_ones = dev_ones,
};
