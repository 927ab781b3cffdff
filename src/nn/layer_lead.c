/* lead<K>x<U>[relu]: a dense layer on the leading K features of its input,
 * the rest passed on (docs/models.md, "Click-through models"):
 *
 *     in = [x (K), rest]   ->   out = [act(x W^T + b) (U), rest]
 *
 * W (U, K) and b (U) as nn.Linear(K, U) keeps them; act is a relu with
 * "relu", else the identity.  After the bags a click-through model's
 * activations are [numeric, e1, ..., eF], so a run of leads is DLRM's
 * bottom MLP on the numeric features while the embeddings wait behind it.
 * The products are dp_sgemm's over the batch with the input's row stride,
 * the bias, relu and copies record by record in order (no result depends
 * on the thread count).  The relu's mask is read from the output in the
 * backward; its masked gradient lives in the keep.  Model parallelism and
 * the device refuse it (no kernels yet). */
#include "nn/layer_impl.h"

#include <string.h>

#include "downpour/blas.h"

static int units(const dp_layer *d) { return d->out - d->in + d->lead_in; }

static int parse(dp_spec_parser *p, const char *s, const char *end)
{
    long k = dp_spec_num(&s, end, 1, DP_SPEC_MAX_WIDTH), u = -1;
    int relu = 0;
    if (k > 0 && s < end && *s == 'x') {
        s++;
        u = dp_spec_num(&s, end, 1, DP_SPEC_MAX_WIDTH);
    }
    if (u > 0 && end - s == 4 && memcmp(s, "relu", 4) == 0)
        relu = 1, s = end;
    if (k < 1 || u < 1 || s != end)
        return dp_spec_fail(p, "expected lead<K>x<U>[relu]: a dense layer of U units in [1, %d] "
                               "on the leading K features, like lead13x64relu",
                            DP_SPEC_MAX_WIDTH);
    if (!p->flat && p->h * p->w > 1)
        return dp_spec_fail(p, "lead takes flat features, not an image");
    int in = p->c * p->h * p->w;
    if (k > in)
        return dp_spec_fail(p, "reads the leading %ld features of %d", k, in);
    dp_layer *d = dp_spec_add(p, DP_LAYER_LEAD);
    if (!d)
        return -1;
    d->lead_in = (int)k;
    d->lead_relu = relu;
    if (dp_spec_out(p, d, (int)u + in - (int)k, 1, 1) < 0 ||
        dp_spec_params(p, d, (size_t)u * (size_t)k, (size_t)u) < 0)
        return -1;
    p->flat = true;
    return 0;
}

static void emit(dp_spec_parser *p, const dp_layer *d)
{
    dp_spec_emit(p, "-lead%dx%d%s", d->lead_in, units(d), d->lead_relu ? "relu" : "");
}

static void fans(const dp_layer *d, double *fan_in, double *fan_out)
{
    *fan_in = d->lead_in;
    *fan_out = units(d);
}

static int shapes(const dp_layer *d, int64_t w[6], int64_t b[3], int *bdim)
{
    w[0] = units(d), w[1] = d->lead_in;
    b[0] = units(d);
    *bdim = 1;
    return 2;
}

static double cost(const dp_layer *d) { return (double)units(d) * d->lead_in + d->out; }

/* the relu's masked output gradient (batch, U) */
static size_t keep_floats(const dp_layer *d, int max_batch)
{
    return d->lead_relu ? (size_t)max_batch * units(d) : 0;
}

static float forward(const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    int U = units(d), K = d->lead_in, W = d->in, O = d->out;
    dp_sgemm(false, true, c->batch, U, K, 1.0f, c->in, W, c->w, K, 0.0f, c->out, O);
    for (int r = 0; r < c->batch; r++) {
        float *o = c->out + (size_t)r * O;
        for (int u = 0; u < U; u++) {
            float v = o[u] + c->b[u];
            o[u] = d->lead_relu && v < 0 ? 0.0f : v;
        }
        memcpy(o + U, c->in + (size_t)r * W + K, (size_t)(W - K) * sizeof *o);
    }
    return 0.0f;
}

static void backward(const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    int U = units(d), K = d->lead_in, W = d->in, O = d->out;
    const float *g = c->dout;
    int ldg = O;
    if (d->lead_relu) { /* the mask from the output the forward left */
        for (int r = 0; r < c->batch; r++)
            for (int u = 0; u < U; u++) {
                size_t i = (size_t)r * O + (size_t)u;
                c->keep[(size_t)r * U + (size_t)u] = c->out[i] > 0 ? c->dout[i] : 0.0f;
            }
        g = c->keep, ldg = U;
    }
    dp_sgemm(true, false, U, K, c->batch, 1.0f, g, ldg, c->in, W, 0.0f, c->gw, K);
    for (int u = 0; u < U; u++)
        c->gb[u] = 0.0f;
    for (int r = 0; r < c->batch; r++)
        for (int u = 0; u < U; u++)
            c->gb[u] += g[(size_t)r * ldg + (size_t)u];
    if (!c->din)
        return;
    dp_sgemm(false, false, c->batch, K, U, 1.0f, g, ldg, c->w, K, 0.0f, c->din, W);
    for (int r = 0; r < c->batch; r++)
        memcpy(c->din + (size_t)r * W + K, c->dout + (size_t)r * O + U,
               (size_t)(W - K) * sizeof *c->din);
}

const dp_layer_ops dp_layer_lead = {
    .kind = DP_LAYER_LEAD, .name = "lead", .token = 1,
    .example = "lead13x64relu",
    .help = "dense 64 (+ relu) on the leading 13 features, the rest passed on (DLRM's bottom MLP)",
    .parse = parse, .emit = emit, .fans = fans, .shapes = shapes, .cost = cost,
    .keep_floats = keep_floats,
    .forward = forward, .backward = backward,
    .mp = DP_MP_REFUSE,
    .mp_reason = "it is not split yet (a click-through model's bags before it are not either)",
    .dev_reason = "click-through models (bag, lead, dot, bce) train on the CPU for now; "
                  "leave out --device (docs/models.md, \"Click-through models\")",
};
