/* res: the sum that ends a residual block, out = main(x) + shortcut(x)
 * (docs/architecture.md, "Residual blocks").  The block's branches are
 * ordinary layers before it in the sequence; the executor hands this layer
 * the other addend (c->skip: the block's input for an identity shortcut,
 * else the main branch's output) and, in the backward, passes the gradient
 * at its output on to both branches without a copy, so its own backward
 * does nothing.  On the CPU a relu after the block runs in the sum
 * (DP_LK_CPU_FUSES_RELU).  The grammar of blocks, res(main) and res(main|shortcut),
 * is model_spec.c's.  No parameters.  On a device the sum is one kernel
 * (kernels.h, "residual blocks"), which the device executor (dmodel.c) also
 * launches at the block's input in the backward.  Model parallelism
 * refuses it (its slices do not keep the block's input). */
#include "nn/layer_impl.h"

#include "device/dexec.h"
#include "downpour/pool.h"
#include "nn/isa_paths.h"

typedef struct add_job {
    float *out;
    const float *a, *b;
    size_t n;
    bool relu;
} add_job;

/* Compiled for each instruction-set level (isa_paths.h): lanes are
 * elements, the same bits on every path. */
static inline __attribute__((always_inline)) void add_task_body(void *ctx, int i, int n)
{
    const add_job *j = ctx;
    size_t lo, hi;
    dp_pool_range(j->n, 64, i, n, &lo, &hi);
    if (j->relu) /* as dp_relu_forward: NaN and -0 pass */
        for (size_t k = lo; k < hi; k++) {
            float v = j->a[k] + j->b[k];
            j->out[k] = v < 0.0f ? 0.0f : v;
        }
    else
        for (size_t k = lo; k < hi; k++)
            j->out[k] = j->a[k] + j->b[k];
}
DP_ISA_POOL_TASK(add_task)

void dp_lk_res_add(float *out, const float *a, const float *b, size_t n)
{
    add_job j = {out, a, b, n, false};
    dp_pool_run(add_task[dp_isa_paths_level()], &j);
}

/* The relu after the block runs in the sum (DP_LK_CPU_FUSES_RELU): one
 * pass over the block's output instead of two. */
static float forward(const dp_layer_call *c)
{
    add_job j = {c->out, c->in, c->skip, (size_t)c->batch * c->d->out, c->relu};
    dp_pool_run(add_task[dp_isa_paths_level()], &j);
    return 0.0f;
}

static void backward(const dp_layer_call *c) { (void)c; }

static void dev_forward(const dp_dexec *x, const dp_layer_call *c)
{
    if (c->batch < 1)
        return;
    dp_kernel k = {.id = DP_K_RES_ADD, .items = (long)c->batch * c->d->out};
    k.u.res = (dp_ka_res){c->out, c->in, c->skip};
    dp_dexec_launch(x, &k);
}

static void dev_backward(const dp_dexec *x, const dp_layer_call *c) { (void)x, (void)c; }

const dp_layer_ops dp_layer_res = {
    .kind = DP_LAYER_RES, .name = "res", .token = 0,
    .example = "res(A|B)",
    .help = "residual block: A(x) + x, or A(x) + B(x) (B: a projection)",
    .flags = DP_LK_CPU_FUSES_RELU,
    .forward = forward, .backward = backward,
    .dev_forward = dev_forward, .dev_backward = dev_backward,
    .mp = DP_MP_REFUSE,
    .mp_reason = "a residual block's shortcut reads the block's input, which model "
                 "parallelism does not keep",
};
