/* pos: a learned position embedding, out = in + P, P (T, D) added to every
 * record's T tokens of width D (an NHWC image of T = h*w positions of D = c
 * channels: docs/models.md, "Images as tokens").  In files P is
 * pos_embedding of shape (1, T, D), as a ViT's parameter
 * (x + self.pos_embedding); no bias.  Its
 * initial values are uniform with standard deviation 0.02 (torchvision's
 * ViT draws normal(std=0.02)): the Glorot draw with fans 2500 and 2500.
 *
 * A device launches kernels.h's bodies ("tokens"); the CPU's passes make
 * the same additions in the same order, so the two give the same bits.
 * The forward splits the records over the pool; the backward's din is dout,
 * and P's gradient sums each element over the batch in record order (split
 * by elements), so no result depends on the thread count.  Model
 * parallelism refuses it (a parameter every task would need whole). */
#include "nn/layer_impl.h"

#include <string.h>

#include "device/dexec.h"
#include "downpour/pool.h"
#include "nn/isa_paths.h"

static int parse(dp_spec_parser *p, const char *s, const char *end)
{
    (void)s, (void)end;
    if (!p->flat && p->h * p->w > 1 && dp_spec_need_image(p) < 0) /* tokens: NHWC */
        return -1;
    dp_layer *d = dp_spec_add(p, DP_LAYER_POS);
    return d && dp_spec_params(p, d, (size_t)d->in, 0) == 0 ? 0 : -1;
}

static void fans(const dp_layer *d, double *fan_in, double *fan_out)
{
    (void)d;
    *fan_in = *fan_out = 2500.0; /* sqrt(6 / 5000) / sqrt(3) = 0.02 */
}

static int tensors(const dp_layer *d, dp_lk_tensor out[DP_LK_MAX_TENSORS])
{
    out[0] = (dp_lk_tensor){"pos_embedding", 0, 3, {1, (int64_t)d->h * d->w, d->c}};
    return 1;
}

static dp_kernel kernel(const dp_layer_call *c, dp_kernel_id id, long items)
{
    dp_kernel k = {.id = id, .items = items};
    bool fwd = id == DP_K_POS_FWD;
    k.u.tok = (dp_ka_tok){.dst = fwd ? c->out : c->gw, .src = fwd ? c->in : c->dout, .p = c->w,
                          .R = c->batch, .F = c->d->in};
    return k;
}

/* The CPU's passes: out = in + P a record at a time, and P's gradient
 * summed over the records in order in double with the vector lanes across
 * the elements (isa_paths.h), as dp_k_pos_grad: the device's bits on every
 * path. */
#define BLOCK 256

static inline __attribute__((always_inline)) void fwd_task_body(void *ctx, int i, int n)
{
    const dp_layer_call *c = ctx;
    size_t F = (size_t)c->d->in, lo, hi;
    dp_pool_range((size_t)c->batch, 1, i, n, &lo, &hi);
    for (size_t r = lo; r < hi; r++)
        for (size_t f = 0; f < F; f++)
            c->out[r * F + f] = c->in[r * F + f] + c->w[f];
}
DP_ISA_POOL_TASK(fwd_task)

static inline __attribute__((always_inline)) void grad_task_body(void *ctx, int i, int n)
{
    const dp_layer_call *c = ctx;
    size_t F = (size_t)c->d->in, lo, hi;
    dp_pool_range(F, 16, i, n, &lo, &hi);
    for (size_t f0 = lo; f0 < hi; f0 += BLOCK) {
        size_t m = hi - f0 < BLOCK ? hi - f0 : BLOCK;
        double g[BLOCK];
        for (size_t k = 0; k < m; k++)
            g[k] = 0.0;
        for (size_t r = 0; r < (size_t)c->batch; r++)
            for (size_t k = 0; k < m; k++)
                g[k] += c->dout[r * F + f0 + k];
        for (size_t k = 0; k < m; k++)
            c->gw[f0 + k] = (float)g[k];
    }
}
DP_ISA_POOL_TASK(grad_task)

static float forward(const dp_layer_call *c)
{
    if (c->batch > 0)
        dp_pool_run(fwd_task[dp_isa_paths_level()], (void *)c);
    return 0.0f;
}

static void backward(const dp_layer_call *c)
{
    dp_pool_run(grad_task[dp_isa_paths_level()], (void *)c);
    if (c->din)
        memcpy(c->din, c->dout, (size_t)c->batch * c->d->in * sizeof(float));
}

static void dev_forward(const dp_dexec *x, const dp_layer_call *c)
{
    dp_kernel k = kernel(c, DP_K_POS_FWD, (long)c->batch * c->d->in);
    dp_dexec_launch(x, &k);
}

static void dev_backward(const dp_dexec *x, const dp_layer_call *c)
{
    dp_kernel k = kernel(c, DP_K_POS_GRAD, c->d->in);
    dp_dexec_launch(x, &k);
    if (c->din)
        x->be->copy(x->ctx, c->din, c->dout, (size_t)c->batch * c->d->in * sizeof(float),
                    DP_COPY_D2D);
}

const dp_layer_ops dp_layer_pos = {
    .kind = DP_LAYER_POS, .name = "pos", .token = 2,
    .example = "pos", .help = "learned position embedding added to the tokens",
    .parse = parse, .fans = fans, .tensors = tensors,
    .forward = forward, .backward = backward,
    .mp = DP_MP_REFUSE,
    .mp_reason = "its (T, D) parameter would be needed whole on every task, and a layer run "
                 "whole on every task (FULL) holds no parameters",
    .dev_forward = dev_forward, .dev_backward = dev_backward,
};
