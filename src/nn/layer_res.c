/* res: the sum that ends a residual block, out = main(x) + shortcut(x)
 * (docs/architecture.md, "Residual blocks").  The block's branches are
 * ordinary layers before it in the sequence; the executor hands this layer
 * the other addend (c->skip: the block's input for an identity shortcut,
 * else the main branch's output) and, in the backward, passes the gradient
 * at its output on to both branches without a copy, so its own backward
 * does nothing.  The grammar of blocks, res(main) and res(main|shortcut),
 * is model_spec.c's.  No parameters.  Model parallelism and devices refuse
 * it (no executor of theirs follows a branch yet). */
#include "nn/layer_impl.h"

#include "downpour/pool.h"

typedef struct add_job {
    float *out;
    const float *a, *b;
    size_t n;
} add_job;

static void add_task(void *ctx, int i, int n)
{
    const add_job *j = ctx;
    size_t lo, hi;
    dp_pool_range(j->n, 64, i, n, &lo, &hi);
    for (size_t k = lo; k < hi; k++)
        j->out[k] = j->a[k] + j->b[k];
}

void dp_lk_res_add(float *out, const float *a, const float *b, size_t n)
{
    add_job j = {out, a, b, n};
    dp_pool_run(add_task, &j);
}

static float forward(const dp_layer_call *c)
{
    dp_lk_res_add(c->out, c->in, c->skip, (size_t)c->batch * c->d->out);
    return 0.0f;
}

static void backward(const dp_layer_call *c) { (void)c; }

const dp_layer_ops dp_layer_res = {
    .kind = DP_LAYER_RES, .name = "res", .token = 0,
    .example = "res(A|B)",
    .help = "residual block: A(x) + x, or A(x) + B(x) (B: a projection)",
    .forward = forward, .backward = backward,
    .mp = DP_MP_REFUSE,
    .mp_reason = "a residual block's shortcut reads the block's input, which model "
                 "parallelism does not keep",
};
