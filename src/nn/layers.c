/* Layer kernels.  Matrix products go through dp_sgemm; the elementwise loops
 * are written plainly (restrict, unit stride, float math) so gcc -O3
 * vectorises them, and the products' epilogues are compiled for each
 * instruction-set level (isa_paths.h: lanes are columns, the same bits on
 * every path). */
#include "downpour/layers.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "downpour/blas.h"
#include "nn/isa_paths.h"

/* Epilogues run by each thread of dp_sgemm_ep on the block of C it just
 * computed, while the block is in cache. */
typedef struct bias_ctx {
    const float *b;
    int relu;
} bias_ctx;

/* out rows [r0,r1), columns [c0,c1): += b, then optionally max(., 0). */
DP_ISA_BODY void bias_act_block_body(void *ctx, float *out, int ld, int r0, int r1, int c0, int c1)
{
    const bias_ctx *bc = ctx;
    const float *restrict b = bc->b + c0;
    int w = c1 - c0;
    for (int r = r0; r < r1; r++) {
        float *restrict o = out + (size_t)r * ld + c0;
        if (bc->relu) {
            for (int j = 0; j < w; j++) {
                float v = o[j] + b[j];
                o[j] = v < 0.0f ? 0.0f : v;
            }
        } else {
            for (int j = 0; j < w; j++)
                o[j] += b[j];
        }
    }
}
DP_ISA_FN(dp_gemm_epilogue, bias_act_block,
          (void *ctx, float *out, int ld, int r0, int r1, int c0, int c1),
          (ctx, out, ld, r0, r1, c0, c1))

void dp_dense_forward(float *out, const float *inp, const float *w, const float *b, int batch,
                      int in, int out_dim)
{
    bias_ctx bc = {b, 0};
    dp_sgemm_ep(false, true, batch, out_dim, in, 1.0f, inp, in, w, in, 0.0f, out, out_dim,
                bias_act_block[dp_isa_paths_level()], &bc);
}

void dp_dense_relu_forward(float *out, const float *inp, const float *w, const float *b,
                           int batch, int in, int out_dim)
{
    bias_ctx bc = {b, 1};
    dp_sgemm_ep(false, true, batch, out_dim, in, 1.0f, inp, in, w, in, 0.0f, out, out_dim,
                bias_act_block[dp_isa_paths_level()], &bc);
}

/* db[lo,hi) = (accumulate ? db : 0) + column sums of dout (batch,out_dim).  Each
 * element sums the rows in order, so the result never depends on the split. */
DP_ISA_BODY void col_sums(float *restrict db, const float *restrict dout, int batch,
                          int out_dim, int lo, int hi, int accumulate)
{
    int r = 0, w = hi - lo;
    db += lo;
    dout += lo;
    if (!accumulate) {
        if (batch <= 0) {
            memset(db, 0, (size_t)w * sizeof *db);
            return;
        }
        memcpy(db, dout, (size_t)w * sizeof *db);
        r = 1;
    }
    for (; r < batch; r++) {
        const float *restrict d = dout + (size_t)r * out_dim;
        for (int j = 0; j < w; j++)
            db[j] += d[j];
    }
}

typedef struct dw_ctx {
    float *db;
    const float *dout;
    int batch, out_dim, in, accumulate;
} dw_ctx;

/* After a block of columns [c0,c1) of dw (out,in): the same share of the bias
 * sums, out*c0/in .. out*c1/in, so the blocks' shares tile [0, out). */
DP_ISA_BODY void bias_sums_block_body(void *ctx, float *dw, int ld, int r0, int r1, int c0, int c1)
{
    (void)dw;
    (void)ld;
    const dw_ctx *d = ctx;
    int lo, hi;
    if (r0 == 0 && r1 == d->out_dim) { /* a column block (or the whole of dw) */
        lo = (int)((long long)d->out_dim * c0 / d->in);
        hi = (int)((long long)d->out_dim * c1 / d->in);
    } else { /* a row block: rows are output units */
        lo = r0;
        hi = r1;
    }
    if (hi > lo)
        col_sums(d->db, d->dout, d->batch, d->out_dim, lo, hi, d->accumulate);
}
DP_ISA_FN(dp_gemm_epilogue, bias_sums_block,
          (void *ctx, float *dw, int ld, int r0, int r1, int c0, int c1),
          (ctx, dw, ld, r0, r1, c0, c1))

/* dinp rows [r0,r1), columns [c0,c1): zero where the relu output inp was not positive. */
DP_ISA_BODY void relu_mask_block_body(void *ctx, float *dinp, int ld, int r0, int r1, int c0,
                                      int c1)
{
    const float *inp = ctx;
    int w = c1 - c0;
    for (int r = r0; r < r1; r++) {
        float *restrict d = dinp + (size_t)r * ld + c0;
        const float *restrict o = inp + (size_t)r * ld + c0;
        for (int j = 0; j < w; j++)
            d[j] = o[j] > 0.0f ? d[j] : 0.0f;
    }
}
DP_ISA_FN(dp_gemm_epilogue, relu_mask_block,
          (void *ctx, float *dinp, int ld, int r0, int r1, int c0, int c1),
          (ctx, dinp, ld, r0, r1, c0, c1))

static void dense_backward(float *dinp, float *dw, float *db, const float *dout,
                           const float *inp, const float *w, int batch, int in, int out_dim,
                           int accumulate, int relu_inp)
{
    /* dw (out,in) = dout^T (out,batch) . inp (batch,in); db = column sums of dout */
    dw_ctx dc = {db, dout, batch, out_dim, in, accumulate};
    dp_sgemm_ep(true, false, out_dim, in, batch, 1.0f, dout, out_dim, inp, in,
                accumulate ? 1.0f : 0.0f, dw, in, bias_sums_block[dp_isa_paths_level()], &dc);
    /* dinp (batch,in) = dout (batch,out) . W (out,in) */
    if (dinp)
        dp_sgemm_ep(false, false, batch, in, out_dim, 1.0f, dout, out_dim, w, in, 0.0f, dinp,
                    in, relu_inp ? relu_mask_block[dp_isa_paths_level()] : NULL, (void *)inp);
}

void dp_dense_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                       const float *w, int batch, int in, int out_dim)
{
    dense_backward(dinp, dw, db, dout, inp, w, batch, in, out_dim, 1, 0);
}

void dp_dense_backward_overwrite(float *dinp, float *dw, float *db, const float *dout,
                                 const float *inp, const float *w, int batch, int in,
                                 int out_dim)
{
    dense_backward(dinp, dw, db, dout, inp, w, batch, in, out_dim, 0, 0);
}

void dp_dense_backward_relu_overwrite(float *dinp, float *dw, float *db, const float *dout,
                                      const float *inp, const float *w, int batch, int in,
                                      int out_dim)
{
    dense_backward(dinp, dw, db, dout, inp, w, batch, in, out_dim, 0, 1);
}

/* No restrict on the aliasable pair: gcc checks for overlap at run time and
 * still vectorises. */
void dp_relu_forward(float *out, const float *inp, int n)
{
    for (int i = 0; i < n; i++)
        out[i] = inp[i] < 0.0f ? 0.0f : inp[i];
}

/* dout is read whether or not it is passed on: a select, which vectorises,
 * not a branch around a load (resnet-fashion spent 7 % of a step here). */
void dp_relu_backward(float *dinp, const float *dout, const float *restrict out, int n)
{
    for (int i = 0; i < n; i++) {
        float g = dout[i];
        dinp[i] = out[i] > 0.0f ? g : 0.0f;
    }
}

/* Rows are processed one at a time and each logit is read before its prob is
 * written, so probs may alias logits. */
float dp_softmax_xent_forward(float *probs, const float *logits, const uint8_t *labels,
                              int batch, int classes, int *correct)
{
    double loss = 0.0;
    int hits = 0;
    for (int r = 0; r < batch; r++) {
        const float *z = logits + (size_t)r * classes;
        float *p = probs + (size_t)r * classes;
        int arg = 0;
        float zmax = z[0];
        for (int j = 1; j < classes; j++) {
            if (z[j] > zmax) {
                zmax = z[j];
                arg = j;
            }
        }
        int y = labels ? labels[r] : 0;
        float zy = labels ? z[y] - zmax : 0.0f;
        float sum = 0.0f;
        for (int j = 0; j < classes; j++) {
            float e = expf(z[j] - zmax);
            p[j] = e;
            sum += e;
        }
        float inv = 1.0f / sum;
        for (int j = 0; j < classes; j++)
            p[j] *= inv;
        if (labels) {
            /* -log softmax_y = log(sum exp(z - zmax)) - (z_y - zmax) */
            loss += (double)logf(sum) - (double)zy;
            hits += arg == y;
        }
    }
    if (correct && labels)
        *correct += hits;
    return batch > 0 && labels ? (float)(loss / batch) : 0.0f;
}

void dp_softmax_xent_backward(float *dlogits, const float *probs, const uint8_t *labels,
                              int batch, int classes)
{
    float inv_b = 1.0f / (float)batch;
    for (int r = 0; r < batch; r++) {
        const float *p = probs + (size_t)r * classes;
        float *d = dlogits + (size_t)r * classes;
        for (int j = 0; j < classes; j++)
            d[j] = p[j] * inv_b;
        d[labels[r]] -= inv_b;
    }
}
