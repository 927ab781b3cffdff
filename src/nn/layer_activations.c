/* The element-wise activations, one kind each, their bodies written once
 * (ACTIVATION below):
 * - tanh: out = tanh(x), as torch.nn.Tanh; its backward reads the output
 *   (1 - y^2);
 * - sigmoid: out = 1 / (1 + exp(-x)), as torch.nn.Sigmoid; its backward
 *   reads the output (y (1 - y));
 * - gelu: out = x Phi(x), the exact erf form (torch.nn.GELU()'s default,
 *   not the tanh approximation); its backward reads the input
 *   (Phi(x) + x phi(x)).
 * Element-wise on any shape, flat or an image: each formula is kernels.h's,
 * shared by the CPU loop and the device kernel, so the two give the same
 * bits; the CPU's loop is compiled for each instruction-set level
 * (isa_paths.h: lanes are elements, so every path gives those bits).
 * Model parallelism splits them with their rows as relu does (a band of
 * output rows is the same band of input rows). */
#include "nn/layer_impl.h"

#include "device/dexec.h"
#include "nn/isa_paths.h"

/* Each kind's loops over a span of elements: kernels.h's formula. */
#define PLAIN_SPANS(lower)                                                                      \
    static inline __attribute__((always_inline)) void lower##_fwd_span_body(                    \
        const dp_layer_call *c, size_t lo, size_t hi)                                           \
    {                                                                                           \
        for (size_t i = lo; i < hi; i++)                                                        \
            c->out[i] = dp_k_##lower##_f(c->in[i]);                                             \
    }                                                                                           \
    static inline __attribute__((always_inline)) void lower##_bwd_span_body(                    \
        const dp_layer_call *c, size_t lo, size_t hi)                                           \
    {                                                                                           \
        for (size_t i = lo; i < hi; i++)                                                        \
            c->din[i] = dp_k_##lower##_g(c->dout[i], c->in[i], c->out[i]);                      \
    }
PLAIN_SPANS(tanh)
PLAIN_SPANS(sigmoid)

/* gelu's forward keeps Phi(x) (as dp_k_gelu_g computes it, 0.5 2Phi(x)),
 * so its backward needs only phi(x), one exponential, where it recomputed
 * Phi (a division, a polynomial and another exponential): gelu's backward
 * took 6 % of vit-mnist's step.  The same operations in the same order as
 * dp_k_gelu_f and dp_k_gelu_g, so the same bits as the device's kernels,
 * which recompute it. */
static inline __attribute__((always_inline)) void gelu_fwd_span_body(const dp_layer_call *c,
                                                                     size_t lo, size_t hi)
{
    for (size_t i = lo; i < hi; i++) {
        float x = c->in[i], two_phi = dp_k_two_phi(x);
        c->out[i] = 0.5f * x * two_phi;
        c->keep[i] = 0.5f * two_phi;
    }
}

static inline __attribute__((always_inline)) void gelu_bwd_span_body(const dp_layer_call *c,
                                                                     size_t lo, size_t hi)
{
    for (size_t i = lo; i < hi; i++) {
        float x = c->in[i];
        c->din[i] = c->dout[i] * (c->keep[i] + x * (DP_K_RSQRT2PI * dp_k_exp(-0.5f * x * x)));
    }
}

/* One float an element of the layer: Phi(x). */
static size_t gelu_keep_floats(const dp_layer *d, int max_batch)
{
    return (size_t)max_batch * d->in;
}

#define ACTIVATION(lower, UPPER, help_text, keep_fn)                                            \
    static int lower##_parse(dp_spec_parser *p, const char *s, const char *end)                 \
    {                                                                                           \
        (void)s, (void)end;                                                                     \
        return dp_spec_add(p, DP_LAYER_##UPPER) ? 0 : -1;                                       \
    }                                                                                           \
    DP_ISA_FN(dp_lk_span_fn, lower##_fwd_span,                                                  \
              (const dp_layer_call *c, size_t lo, size_t hi), (c, lo, hi))                      \
    DP_ISA_FN(dp_lk_span_fn, lower##_bwd_span,                                                  \
              (const dp_layer_call *c, size_t lo, size_t hi), (c, lo, hi))                      \
    static float lower##_forward(const dp_layer_call *c)                                        \
    {                                                                                           \
        dp_lk_pointwise(c, false, lower##_fwd_span[dp_isa_paths_level()]);                      \
        return 0.0f;                                                                            \
    }                                                                                           \
    static void lower##_backward(const dp_layer_call *c)                                        \
    {                                                                                           \
        if (c->din)                                                                             \
            dp_lk_pointwise(c, false, lower##_bwd_span[dp_isa_paths_level()]);                  \
    }                                                                                           \
    static void lower##_mp_forward(const dp_layer_call *c)                                      \
    {                                                                                           \
        dp_lk_pointwise(c, true, lower##_fwd_span[dp_isa_paths_level()]);                       \
    }                                                                                           \
    static void lower##_mp_backward(const dp_layer_call *c)                                     \
    {                                                                                           \
        if (c->din)                                                                             \
            dp_lk_pointwise(c, true, lower##_bwd_span[dp_isa_paths_level()]);                   \
    }                                                                                           \
    static void lower##_dev_forward(const dp_dexec *x, const dp_layer_call *c)                  \
    {                                                                                           \
        dp_lk_pointwise_dev(x, c, DP_K_##UPPER##_FWD, false);                                   \
    }                                                                                           \
    static void lower##_dev_backward(const dp_dexec *x, const dp_layer_call *c)                 \
    {                                                                                           \
        dp_lk_pointwise_dev(x, c, DP_K_##UPPER##_BWD, true);                                    \
    }                                                                                           \
    const dp_layer_ops dp_layer_##lower = {                                                     \
        .kind = DP_LAYER_##UPPER, .name = #lower, .token = 2,                                   \
        .example = #lower, .help = help_text, .flags = DP_LK_MP_SAME_ROWS,                      \
        .parse = lower##_parse,                                                                 \
        .forward = lower##_forward, .backward = lower##_backward,                               \
        .mp = DP_MP_ROWS, .mp_forward = lower##_mp_forward, .mp_backward = lower##_mp_backward, \
        .keep_floats = keep_fn,                                                                 \
        .dev_forward = lower##_dev_forward, .dev_backward = lower##_dev_backward,               \
    };

ACTIVATION(tanh, TANH, "tanh(x)", NULL)
ACTIVATION(sigmoid, SIGMOID, "1 / (1 + exp(-x))", NULL)
ACTIVATION(gelu, GELU, "x Phi(x), the exact erf form (nn.GELU())", gelu_keep_floats)
