/* local: a locally connected layer, a convolution whose filters differ at
 * each output position (docs/architecture.md, "Image layers"): weights
 * (positions, oc, kh, kw, c), bias (positions, oc); in files (oh, ow, oc, c,
 * kh, kw) and (oh, ow, oc).  One product per position, at least
 * LOCAL_MIN_CHUNK records at a time to keep those efficient.  Model
 * parallelism splits it by output rows, and task j holds the weights of its
 * band's positions, about 1/K of them. */
#include "nn/layer_impl.h"

#define LOCAL_MIN_CHUNK 128

static int parse(dp_spec_parser *p, const char *s, const char *end)
{
    return dp_lk_parse_filter(p, DP_LAYER_LOCAL, s, end);
}

static void emit(dp_spec_parser *p, const dp_layer *d) { dp_lk_emit_window(p, "local", d, false); }

static int shapes(const dp_layer *d, int64_t w[6], int64_t b[3], int *bdim)
{
    w[0] = d->oh, w[1] = d->ow, w[2] = d->oc, w[3] = d->c, w[4] = d->win.kh, w[5] = d->win.kw;
    b[0] = d->oh, b[1] = d->ow, b[2] = d->oc;
    *bdim = 3;
    return 6;
}

static float forward(const dp_layer_call *c) { return dp_lk_lowered_forward(c, true); }
static void backward(const dp_layer_call *c) { dp_lk_lowered_backward(c, true); }
static void mp_forward(const dp_layer_call *c) { dp_lk_lowered_band(c, true, false); }
static void mp_backward(const dp_layer_call *c) { dp_lk_lowered_band(c, true, true); }

/* the band's positions: rows y0*ow .. y1*ow of (positions, oc, k) and (positions, oc) */
static void mp_params(const dp_layer *d, int K, int j, int y0, int y1, size_t *w_full,
                      size_t *w_len, size_t *b_full, size_t *b_len, int *lo, int *hi)
{
    (void)K, (void)j, (void)lo, (void)hi;
    size_t per = d->w_len / ((size_t)d->oh * d->ow), bper = (size_t)d->oc;
    size_t p0 = (size_t)y0 * d->ow, p1 = (size_t)y1 * d->ow;
    *w_full = d->w_off + p0 * per;
    *w_len = (p1 - p0) * per;
    *b_full = d->b_off + p0 * bper;
    *b_len = (p1 - p0) * bper;
}

static size_t dev_scratch(const dp_layer *d, int mb) { return dp_lk_lowered_dev_scratch(d, mb); }
static long dev_ones(const dp_layer *d, int mb) { return dp_lk_lowered_dev_ones(d, mb, true); }
static void dev_forward(const struct dp_dexec *x, const dp_layer_call *c)
{
    dp_lk_lowered_dev_forward(x, c, true);
}
static void dev_backward(const struct dp_dexec *x, const dp_layer_call *c)
{
    dp_lk_lowered_dev_backward(x, c, true);
}

const dp_layer_ops dp_layer_local = {
    .kind = DP_LAYER_LOCAL, .name = "local", .token = 1,
    .example = "local5x5x16", .help = "locally connected (untied weights); s, p as conv",
    .flags = DP_LK_FUSES_RELU | DP_LK_LOWERED | DP_LK_FILTER_ORDER,
    .parse = parse, .emit = emit,
    .fans = dp_lk_lowered_fans, .shapes = shapes, .min_chunk = LOCAL_MIN_CHUNK,
    .forward = forward, .backward = backward,
    .mp = DP_MP_ROWS, .mp_forward = mp_forward, .mp_backward = mp_backward,
    .mp_params = mp_params,
    .dev_forward = dev_forward, .dev_backward = dev_backward,
    .dev_scratch = dev_scratch, .dev_ones = dev_ones,
};
