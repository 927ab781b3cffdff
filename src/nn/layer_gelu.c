/* gelu: out = x Phi(x), the exact erf form (torch.nn.GELU()'s default, not
 * the tanh approximation); its backward reads the input (Phi(x) + x phi(x)).
 * Element-wise on any shape, flat or an image: the formula is kernels.h's,
 * shared by the CPU loop and the device kernel, so the two give the same
 * bits.  Model parallelism splits it with its rows as relu does. */
#include "nn/layer_impl.h"

#include "device/dexec.h"

static int parse(dp_spec_parser *p, const char *s, const char *end)
{
    (void)s, (void)end;
    return dp_spec_add(p, DP_LAYER_GELU) ? 0 : -1;
}

static void fwd_span(const dp_layer_call *c, size_t lo, size_t hi)
{
    for (size_t i = lo; i < hi; i++)
        c->out[i] = dp_k_gelu_f(c->in[i]);
}

static void bwd_span(const dp_layer_call *c, size_t lo, size_t hi)
{
    for (size_t i = lo; i < hi; i++)
        c->din[i] = dp_k_gelu_g(c->dout[i], c->in[i], c->out[i]);
}

static float forward(const dp_layer_call *c)
{
    dp_lk_pointwise(c, false, fwd_span);
    return 0.0f;
}

static void backward(const dp_layer_call *c)
{
    if (c->din)
        dp_lk_pointwise(c, false, bwd_span);
}

/* A band of output rows is the same band of input rows. */
static void mp_forward(const dp_layer_call *c) { dp_lk_pointwise(c, true, fwd_span); }

static void mp_backward(const dp_layer_call *c)
{
    if (c->din)
        dp_lk_pointwise(c, true, bwd_span);
}

static void dev_forward(const dp_dexec *x, const dp_layer_call *c)
{
    dp_lk_pointwise_dev(x, c, DP_K_GELU_FWD, false);
}

static void dev_backward(const dp_dexec *x, const dp_layer_call *c)
{
    dp_lk_pointwise_dev(x, c, DP_K_GELU_BWD, true);
}

const dp_layer_ops dp_layer_gelu = {
    .kind = DP_LAYER_GELU, .name = "gelu", .token = 2,
    .example = "gelu", .help = "x Phi(x), the exact erf form (nn.GELU())", .flags = DP_LK_MP_SAME_ROWS,
    .parse = parse,
    .forward = forward, .backward = backward,
    .mp = DP_MP_ROWS, .mp_forward = mp_forward, .mp_backward = mp_backward,
    .dev_forward = dev_forward, .dev_backward = dev_backward,
};
