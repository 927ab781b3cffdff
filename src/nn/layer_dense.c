/* dense: out = in W^T + b, W (out, in) as nn.Linear keeps it.  A relu after
 * it runs in the product's epilogue, and the mask of a relu before it in its
 * input-gradient product.  Model parallelism splits it by output units
 * (mp_slice.h). */
#include "nn/layer_impl.h"

#include <stdbool.h>
#include <string.h>

#include "device/dexec.h"
#include "downpour/blas.h"
#include "downpour/layers.h"

static int parse(dp_spec_parser *p, const char *s, const char *end)
{
    long n = dp_spec_num(&s, end, 1, DP_SPEC_MAX_WIDTH);
    if (n < 1 || s != end)
        return dp_spec_fail(p, "expected a width in [1, %d], like dense128", DP_SPEC_MAX_WIDTH);
    return dp_spec_dense(p, n, false);
}

/* the last token's dense is the classifier, spelled as a bare width */
static void emit(dp_spec_parser *p, const dp_layer *d)
{
    dp_spec_emit(p, p->last ? "-%d" : "-dense%d", d->out);
}

static int shapes(const dp_layer *d, int64_t w[6], int64_t b[3], int *bdim)
{
    w[0] = d->out, w[1] = d->in;
    b[0] = (int64_t)d->b_len;
    *bdim = 1;
    return 2;
}

static float forward(const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    if (c->relu) /* the relu in the product's epilogue */
        dp_dense_relu_forward(c->out, c->in, c->w, c->b, c->batch, d->in, d->out);
    else
        dp_dense_forward(c->out, c->in, c->w, c->b, c->batch, d->in, d->out);
    return 0.0f;
}

static void backward(const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    if (c->relu && c->din) /* in is the relu's output: the mask fuses in */
        dp_dense_backward_relu_overwrite(c->din, c->gw, c->gb, c->dout, c->in, c->w, c->batch,
                                         d->in, d->out);
    else
        dp_dense_backward_overwrite(c->din, c->gw, c->gb, c->dout, c->in, c->w, c->batch, d->in,
                                    d->out);
}

/* Model parallelism: output units [lo, hi), the slice's rows of W and
 * entries of b (src/exec/mp_slice.h). */
static void mp_forward(const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    int u = c->hi - c->lo, rows = c->batch;
    /* the slice's columns of the full output, in place: ldc is the full width */
    dp_sgemm(false, true, rows, u, d->in, 1.0f, c->in, d->in, c->w, d->in, 0.0f, c->out + c->lo,
             d->out);
    const float *restrict b = c->b;
    for (int r = 0; r < rows; r++) {
        float *restrict o = c->out + (size_t)r * d->out + c->lo;
        if (c->relu) {
            for (int k = 0; k < u; k++) {
                float v = o[k] + b[k];
                o[k] = v < 0.0f ? 0.0f : v;
            }
        } else {
            for (int k = 0; k < u; k++)
                o[k] += b[k];
        }
    }
}

/* From the full gradient at the output: the slice's gradients, and this
 * task's part of the input gradient (the replica sums the parts). */
static void mp_backward(const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    int u = c->hi - c->lo, rows = c->batch;
    const float *dzs = c->dout + c->lo; /* the slice's columns, row stride d->out */
    /* dW (u, in) = dz_slice^T (u, rows) . in (rows, in) */
    dp_sgemm(true, false, u, d->in, rows, 1.0f, dzs, d->out, c->in, d->in, 0.0f, c->gw, d->in);
    /* db = column sums, row by row in order (as the whole model sums them) */
    float *restrict db = c->gb;
    memset(db, 0, (size_t)u * sizeof *db);
    for (int r = 0; r < rows; r++) {
        const float *restrict g = dzs + (size_t)r * d->out;
        for (int k = 0; k < u; k++)
            db[k] += g[k];
    }
    /* din (rows, in) = dz_slice (rows, u) . W_slice (u, in) */
    if (c->din)
        dp_sgemm(false, false, rows, d->in, u, 1.0f, dzs, d->out, c->w, d->in, 0.0f, c->din,
                 d->in);
}

/* Column-major products (src/device/dmodel.c, "Products"). */
static void dev_forward(const dp_dexec *x, const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    dp_dexec_gemm(x, 1, 0, d->out, c->batch, d->in, c->w, d->in, c->in, d->in, 0.0f, c->out,
                  d->out);
    dp_kernel k = {.id = DP_K_BIAS_ACT, .items = (long)c->batch * d->out};
    k.u.bias_act = (dp_ka_bias_act){c->out, c->b, d->out, c->relu};
    dp_dexec_launch(x, &k);
}

static void dev_backward(const dp_dexec *x, const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    int batch = c->batch;
    dp_dexec_gemm(x, 0, 1, d->in, d->out, batch, c->in, d->in, c->dout, d->out, 0.0f, c->gw,
                  d->in);
    dp_dexec_gemm(x, 0, 0, d->out, 1, batch, c->dout, d->out, x->ones, batch, 0.0f, c->gb,
                  d->out);
    if (!c->din)
        return;
    dp_dexec_gemm(x, 0, 0, d->in, batch, d->out, c->w, d->in, c->dout, d->out, 0.0f, c->din,
                  d->in);
    if (c->relu) { /* in is the relu's output: its mask */
        dp_kernel k = {.id = DP_K_RELU_BWD, .items = (long)batch * d->in};
        k.u.relu_bwd = (dp_ka_relu_bwd){c->din, c->din, c->in};
        dp_dexec_launch(x, &k);
    }
}

const dp_layer_ops dp_layer_dense = {
    .kind = DP_LAYER_DENSE, .name = "dense", .token = 1,
    .example = "dense128", .help = "dense alone",
    .flags = DP_LK_FUSES_RELU | DP_LK_TAKES_RELU_MASK | DP_LK_DEV_TAKES_RELU_MASK |
             DP_LK_CLASSIFIER,
    .parse = parse, .emit = emit, .shapes = shapes,
    .forward = forward, .backward = backward,
    .mp = DP_MP_UNITS, .mp_forward = mp_forward, .mp_backward = mp_backward,
    .dev_forward = dev_forward, .dev_backward = dev_backward,
};
