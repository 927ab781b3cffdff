/* emb<N>x<D>: an embedding from integer ids, as nn.Embedding(N, D).  The
 * model's input is T ids (a flat input of T features, each an id in
 * [0, N) stored as a float); the output is T tokens of width D, an NHWC
 * image of h = T, w = 1, c = D (docs/models.md, "Images as tokens"), which
 * ln, mha, pos, conv1x1 and gap take.  Its one parameter is weight (N, D) in files,
 * as nn.Embedding's; its initial values are uniform with standard
 * deviation 1 (nn.Embedding draws normal(0, 1)): the Glorot draw with fans
 * 1 and 1.
 *
 * An id is rounded to the nearest integer and clamped to [0, N): a bad id
 * never reads outside the table.  The forward counts the ids it had to
 * change (not an integer, or out of range) in the keep's last float, for
 * tests and a caller that wants to check its data.  The forward's pass over
 * the ids runs on the calling thread (T ids a record: a few thousand per
 * batch) and keeps the ids it used; the row copies split over the pool.
 * The backward's weight gradient is dense: zero, then each token's output
 * gradient added into its id's row, records and tokens in order, split over
 * the pool by columns of the table, so no result depends on the thread
 * count.  The gradient at the input is zero (ids are not differentiable).
 * It must be the model's first layer.  Model parallelism refuses it; no
 * device kernels yet. */
#include "nn/layer_impl.h"

#include <math.h>
#include <string.h>

#include "downpour/pool.h"

#define MAX_ROWS (1L << 24) /* ids a float holds exactly */

static int parse(dp_spec_parser *p, const char *s, const char *end)
{
    long n = dp_spec_num(&s, end, 1, MAX_ROWS), dim = -1;
    if (n > 0 && s < end && *s == 'x') {
        s++;
        dim = dp_spec_num(&s, end, 1, DP_SPEC_MAX_WIDTH);
    }
    if (n < 1 || dim < 1 || s != end)
        return dp_spec_fail(p, "expected emb<N>x<D>: N ids in [1, %ld] and a width D in "
                               "[1, %d], like emb1000x64",
                            MAX_ROWS, DP_SPEC_MAX_WIDTH);
    if (p->m->n_layers != 0 || p->h * p->w > 1)
        return dp_spec_fail(p, "an embedding takes the model's input of integer ids, so it "
                               "must be the first layer, on a flat input of T ids (like "
                               "16-emb1000x64), not on %s",
                            p->m->n_layers ? "another layer's output" : "an image");
    dp_layer *d = dp_spec_add(p, DP_LAYER_EMB);
    if (!d || dp_spec_out(p, d, (int)dim, d->in, 1) < 0 ||
        dp_spec_params(p, d, (size_t)n * (size_t)dim, 0) < 0)
        return -1;
    p->hwc = true; /* T tokens of width D, token after token */
    return 0;
}

static void emit(dp_spec_parser *p, const dp_layer *d)
{
    dp_spec_emit(p, "-emb%zux%d", d->w_len / (size_t)d->oc, d->oc);
}

static long rows_of(const dp_layer *d) { return (long)(d->w_len / (size_t)d->oc); }

static void fans(const dp_layer *d, double *fan_in, double *fan_out)
{
    (void)d;
    *fan_in = *fan_out = 1.0; /* sqrt(6 / 2) / sqrt(3) = 1 */
}

static int tensors(const dp_layer *d, dp_lk_tensor out[DP_LK_MAX_TENSORS])
{
    out[0] = (dp_lk_tensor){"weight", 0, 2, {rows_of(d), d->oc}};
    return 1;
}

static double cost(const dp_layer *d) { return d->out; }

/* The ids used (as floats, exact below 2^24) and the count of changed ones. */
static size_t keep_floats(const dp_layer *d, int max_batch)
{
    return (size_t)max_batch * d->in + 1;
}

static void fwd_task(void *ctx, int i, int n)
{
    const dp_layer_call *c = ctx;
    size_t D = (size_t)c->d->oc, lo, hi;
    dp_pool_range((size_t)c->batch * c->d->in, 8, i, n, &lo, &hi);
    for (size_t t = lo; t < hi; t++)
        memcpy(c->out + t * D, c->w + (size_t)c->keep[t] * D, D * sizeof(float));
}

/* Columns [lo, hi) of the table's gradient: zero, then every token's row. */
static void grad_task(void *ctx, int i, int n)
{
    const dp_layer_call *c = ctx;
    size_t D = (size_t)c->d->oc, lo, hi, ids = (size_t)c->batch * c->d->in;
    dp_pool_range(D, 16, i, n, &lo, &hi);
    for (long r = 0; r < rows_of(c->d); r++)
        memset(c->gw + (size_t)r * D + lo, 0, (hi - lo) * sizeof(float));
    for (size_t t = 0; t < ids; t++) {
        float *g = c->gw + (size_t)c->keep[t] * D;
        const float *dy = c->dout + t * D;
        for (size_t e = lo; e < hi; e++)
            g[e] += dy[e];
    }
}

static float forward(const dp_layer_call *c)
{
    size_t ids = (size_t)c->batch * c->d->in;
    float top = (float)(rows_of(c->d) - 1), changed = 0.0f;
    for (size_t t = 0; t < ids; t++) {
        float v = c->in[t], id = nearbyintf(v);
        id = !(id >= 0.0f) ? 0.0f : id > top ? top : id; /* NaN goes to 0 */
        changed += id != v;
        c->keep[t] = id;
    }
    c->keep[keep_floats(c->d, c->batch) - 1] = changed;
    dp_pool_run(fwd_task, (void *)c);
    return 0.0f;
}

static void backward(const dp_layer_call *c)
{
    dp_pool_run(grad_task, (void *)c);
    if (c->din)
        memset(c->din, 0, (size_t)c->batch * c->d->in * sizeof(float));
}

const dp_layer_ops dp_layer_emb = {
    .kind = DP_LAYER_EMB, .name = "emb", .token = 1,
    .example = "emb1000x64", .help = "integer ids (the input) to tokens of width 64 (nn.Embedding)",
    .parse = parse, .emit = emit, .fans = fans, .tensors = tensors, .cost = cost,
    .keep_floats = keep_floats,
    .forward = forward, .backward = backward,
    .mp = DP_MP_REFUSE,
    .mp_reason = "its table would be needed whole on every task (sparse rows on parameter "
                 "servers are the next step), and a layer run whole on every task (FULL) holds "
                 "no parameters",
};
