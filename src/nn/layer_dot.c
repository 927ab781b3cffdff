/* dot<D>: DLRM's interaction (docs/models.md, "Click-through models").  The
 * input is n vectors of width D a record, z0 (the bottom MLP's output) and
 * the embeddings z1 .. z(n-1); the output is z0 followed by every pairwise
 * dot product z_i . z_j, i > j, in the order (1,0), (2,0), (2,1), (3,0),
 * ... (the strict lower triangle of Z Z^T by rows, as DLRM's "dot"
 * interaction without the diagonal):
 *
 *     out = [z0 (D), n (n - 1) / 2 dots]
 *
 * No parameters.  The backward: dz_k = [k = 0] dout[:D] + sum over the
 * pairs holding k of their gradient times the other vector.  Records split
 * over the pool, each record's sums in a fixed order.  Model parallelism
 * and the device refuse it (no kernels yet). */
#include "nn/layer_impl.h"

#include <limits.h>
#include <string.h>

#include "downpour/pool.h"

static int parse(dp_spec_parser *p, const char *s, const char *end)
{
    long dim = dp_spec_num(&s, end, 1, DP_SPEC_MAX_WIDTH);
    if (dim < 1 || s != end)
        return dp_spec_fail(p, "expected dot<D>: the vectors' width D in [1, %d], like dot16",
                            DP_SPEC_MAX_WIDTH);
    int in = p->c * p->h * p->w;
    if ((!p->flat && p->h * p->w > 1) || in % dim != 0 || in / dim < 2)
        return dp_spec_fail(p, "takes at least two vectors of width %ld a record (the bottom "
                               "MLP's output and the embeddings, each %ld wide), not %d features",
                            dim, dim, in);
    long n = in / dim, out = dim + n * (n - 1) / 2;
    if (out > INT_MAX) /* else the cast below wraps to a small width */
        return dp_spec_fail(p, "%ld vectors make %ld outputs a record (their pairwise dot "
                               "products): too many", n, out);
    dp_layer *d = dp_spec_add(p, DP_LAYER_DOT);
    if (!d)
        return -1;
    d->dot_dim = (int)dim;
    if (dp_spec_out(p, d, (int)out, 1, 1) < 0)
        return -1;
    p->flat = true;
    return 0;
}

static double cost(const dp_layer *d)
{
    return (double)(d->out - d->dot_dim) * d->dot_dim;
}

typedef struct dot_task {
    const dp_layer_call *c;
} dot_task;

static void fwd_task(void *ctx, int t, int nt)
{
    const dp_layer_call *c = ((dot_task *)ctx)->c;
    int D = c->d->dot_dim, n = c->d->in / D;
    size_t lo, hi;
    dp_pool_range((size_t)c->batch, 1, t, nt, &lo, &hi);
    for (size_t r = lo; r < hi; r++) {
        const float *z = c->in + r * (size_t)c->d->in;
        float *o = c->out + r * (size_t)c->d->out;
        memcpy(o, z, (size_t)D * sizeof *o);
        o += D;
        for (int i = 1; i < n; i++)
            for (int j = 0; j < i; j++) {
                float s = 0.0f;
                for (int k = 0; k < D; k++)
                    s += z[i * D + k] * z[j * D + k];
                *o++ = s;
            }
    }
}

static float forward(const dp_layer_call *c)
{
    dot_task t = {c};
    dp_pool_run(fwd_task, &t);
    return 0.0f;
}

static void bwd_task(void *ctx, int t, int nt)
{
    const dp_layer_call *c = ((dot_task *)ctx)->c;
    int D = c->d->dot_dim, n = c->d->in / D;
    size_t lo, hi;
    dp_pool_range((size_t)c->batch, 1, t, nt, &lo, &hi);
    for (size_t r = lo; r < hi; r++) {
        const float *z = c->in + r * (size_t)c->d->in;
        const float *g = c->dout + r * (size_t)c->d->out;
        float *dz = c->din + r * (size_t)c->d->in;
        memcpy(dz, g, (size_t)D * sizeof *dz);
        memset(dz + D, 0, (size_t)(n - 1) * D * sizeof *dz);
        g += D;
        for (int i = 1; i < n; i++)
            for (int j = 0; j < i; j++) {
                float gij = *g++;
                for (int k = 0; k < D; k++) {
                    dz[i * D + k] += gij * z[j * D + k];
                    dz[j * D + k] += gij * z[i * D + k];
                }
            }
    }
}

static void backward(const dp_layer_call *c)
{
    if (!c->din)
        return;
    dot_task t = {c};
    dp_pool_run(bwd_task, &t);
}

const dp_layer_ops dp_layer_dot = {
    .kind = DP_LAYER_DOT, .name = "dot", .token = 1,
    .example = "dot16",
    .help = "pairwise dot products of a record's vectors of width 16 (DLRM's interaction)",
    .parse = parse, .cost = cost,
    .forward = forward, .backward = backward,
    .mp = DP_MP_REFUSE,
    .mp_reason = "it is not split yet (a click-through model's bags before it are not either)",
    .dev_reason = "click-through models (bag, lead, dot, bce) train on the CPU for now; "
                  "leave out --device (docs/models.md, \"Click-through models\")",
};
