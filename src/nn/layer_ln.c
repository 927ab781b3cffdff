/* ln: layer normalisation over the F features of each row, as PyTorch's
 * nn.LayerNorm(F): y = (x - mean) / sqrt(var + eps) * weight + bias, the
 * row's mean and biased variance, eps 1e-5, the same in training and
 * evaluation (no running statistics).  Weight 1 and bias 0 at the start,
 * named weight and bias (F each) in files.
 *
 * A row is a record's features on flat activations (after a dense layer,
 * flatten or gap, or a flat input), and a position's C channels on an
 * image: an NHWC image of h x w positions is h*w tokens of width C, token
 * after token (docs/models.md, "Images as tokens"), so ln there is a
 * transformer's nn.LayerNorm(D) over each token.  PyTorch's LayerNorm([C, H, W]) over a
 * whole image is flatten-ln.
 *
 * The passes are kernels.h's bodies ("layer norm"), called by the CPU's
 * loop and launched on a device alike, so the two give the same bits; the
 * CPU splits them over the pool by rows (statistics, normalisation, input
 * gradient) and by features (weight gradients).  The forward keeps each
 * row's mean and 1/std (2 x batch x h x w floats) for the backward. */
#include "nn/layer_impl.h"

#include "device/dexec.h"

#define LN_EPS 1e-5

static int parse(dp_spec_parser *p, const char *s, const char *end)
{
    (void)s, (void)end;
    if (!p->flat && p->h * p->w > 1 && dp_spec_need_image(p) < 0) /* tokens: NHWC */
        return -1;
    dp_layer *d = dp_spec_add(p, DP_LAYER_LAYERNORM);
    return d && dp_spec_params(p, d, (size_t)d->c, (size_t)d->c) == 0 ? 0 : -1;
}

static int shapes(const dp_layer *d, int64_t w[6], int64_t b[3], int *bdim)
{
    w[0] = d->c;
    b[0] = d->c;
    *bdim = 1;
    return 1;
}

static void init_params(const dp_layer *d, float *w, float *b)
{
    for (int f = 0; f < d->c; f++)
        w[f] = 1.0f, b[f] = 0.0f;
}

/* The rows of a batch: records, or their positions on an image. */
static long rows(const dp_layer *d, int batch) { return (long)batch * d->h * d->w; }

static size_t keep_floats(const dp_layer *d, int max_batch)
{
    return 2 * (size_t)rows(d, max_batch);
}

static dp_kernel kernel(const dp_layer_call *c, dp_kernel_id id, long items)
{
    dp_kernel k = {.id = id, .items = items};
    k.u.ln = (dp_ka_ln){.x = c->in, .dy = c->dout, .y = c->out, .dx = c->din, .w = c->w,
                        .b = c->b, .gw = c->gw, .gb = c->gb, .mean = c->keep,
                        .inv = c->keep + rows(c->d, c->batch), .R = rows(c->d, c->batch),
                        .F = c->d->c,
                        .eps = LN_EPS};
    return k;
}

/* The CPU runs the device bodies over the pool (dp_lk_pool_kernel): each
 * row's statistics, then the elements; the features' gradients, then each
 * row's input gradient. */
static float forward(const dp_layer_call *c)
{
    dp_kernel k = kernel(c, DP_K_LN_STATS, rows(c->d, c->batch));
    dp_lk_pool_kernel(&k, 1);
    k = kernel(c, DP_K_LN_NORM, (long)c->batch * c->d->in);
    dp_lk_pool_kernel(&k, 64);
    return 0.0f;
}

static void backward(const dp_layer_call *c)
{
    dp_kernel k = kernel(c, DP_K_LN_GRAD, c->d->c);
    dp_lk_pool_kernel(&k, 16);
    if (c->din) {
        k = kernel(c, DP_K_LN_DIN, rows(c->d, c->batch));
        dp_lk_pool_kernel(&k, 1);
    }
}

static size_t dev_keep(const dp_layer *d, int max_batch) { return keep_floats(d, max_batch); }

static void dev_forward(const dp_dexec *x, const dp_layer_call *c)
{
    if (c->batch < 1)
        return;
    dp_kernel k = kernel(c, DP_K_LN_STATS, rows(c->d, c->batch));
    dp_dexec_launch(x, &k);
    k = kernel(c, DP_K_LN_NORM, (long)c->batch * c->d->in);
    dp_dexec_launch(x, &k);
}

static void dev_backward(const dp_dexec *x, const dp_layer_call *c)
{
    if (c->batch < 1)
        return;
    dp_kernel k = kernel(c, DP_K_LN_GRAD, c->d->c);
    dp_dexec_launch(x, &k);
    if (c->din) {
        k = kernel(c, DP_K_LN_DIN, rows(c->d, c->batch));
        dp_dexec_launch(x, &k);
    }
}

const dp_layer_ops dp_layer_ln = {
    .kind = DP_LAYER_LAYERNORM, .name = "ln", .token = 2,
    .example = "ln", .help = "layer norm over features, or each token's channels (nn.LayerNorm)",
    .parse = parse, .shapes = shapes, .init_params = init_params,
    .keep_floats = keep_floats,
    .forward = forward, .backward = backward,
    .mp = DP_MP_REFUSE,
    .mp_reason = "its mean and variance span every feature of a row, which a split "
                 "divides among the tasks, and its weights would be needed whole on every task; "
                 "not split yet",
    .dev_forward = dev_forward, .dev_backward = dev_backward, .dev_keep = dev_keep,
};
