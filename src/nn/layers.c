/* Layer kernels.  Matrix products go through dp_sgemm; the elementwise loops
 * are written plainly (restrict, unit stride, float math) so gcc -O3
 * vectorises them. */
#include "downpour/layers.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "downpour/blas.h"

/* out (batch,out_dim) += b on every row, then optionally max(., 0). */
static void bias_act_rows(float *restrict out, const float *restrict b, int batch, int out_dim,
                          int relu)
{
    for (int r = 0; r < batch; r++) {
        float *restrict o = out + (size_t)r * out_dim;
        if (relu) {
            for (int j = 0; j < out_dim; j++) {
                float v = o[j] + b[j];
                o[j] = v < 0.0f ? 0.0f : v;
            }
        } else {
            for (int j = 0; j < out_dim; j++)
                o[j] += b[j];
        }
    }
}

void dp_dense_forward(float *out, const float *inp, const float *w, const float *b, int batch,
                      int in, int out_dim)
{
    dp_sgemm(false, true, batch, out_dim, in, 1.0f, inp, in, w, in, 0.0f, out, out_dim);
    bias_act_rows(out, b, batch, out_dim, 0);
}

void dp_dense_relu_forward(float *out, const float *inp, const float *w, const float *b,
                           int batch, int in, int out_dim)
{
    dp_sgemm(false, true, batch, out_dim, in, 1.0f, inp, in, w, in, 0.0f, out, out_dim);
    bias_act_rows(out, b, batch, out_dim, 1);
}

/* db (out_dim) = (accumulate ? db : 0) + column sums of dout (batch,out_dim). */
static void col_sums(float *restrict db, const float *restrict dout, int batch, int out_dim,
                     int accumulate)
{
    int r = 0;
    if (!accumulate) {
        if (batch <= 0) {
            memset(db, 0, (size_t)out_dim * sizeof *db);
            return;
        }
        memcpy(db, dout, (size_t)out_dim * sizeof *db);
        r = 1;
    }
    for (; r < batch; r++) {
        const float *restrict d = dout + (size_t)r * out_dim;
        for (int j = 0; j < out_dim; j++)
            db[j] += d[j];
    }
}

static void dense_backward(float *dinp, float *dw, float *db, const float *dout,
                           const float *inp, const float *w, int batch, int in, int out_dim,
                           int accumulate)
{
    /* dw (out,in) = dout^T (out,batch) . inp (batch,in) */
    dp_sgemm(true, false, out_dim, in, batch, 1.0f, dout, out_dim, inp, in,
             accumulate ? 1.0f : 0.0f, dw, in);
    col_sums(db, dout, batch, out_dim, accumulate);
    /* dinp (batch,in) = dout (batch,out) . W (out,in) */
    if (dinp)
        dp_sgemm(false, false, batch, in, out_dim, 1.0f, dout, out_dim, w, in, 0.0f, dinp, in);
}

void dp_dense_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                       const float *w, int batch, int in, int out_dim)
{
    dense_backward(dinp, dw, db, dout, inp, w, batch, in, out_dim, 1);
}

void dp_dense_backward_overwrite(float *dinp, float *dw, float *db, const float *dout,
                                 const float *inp, const float *w, int batch, int in,
                                 int out_dim)
{
    dense_backward(dinp, dw, db, dout, inp, w, batch, in, out_dim, 0);
}

void dp_relu_forward(float *restrict x, int n)
{
    for (int i = 0; i < n; i++)
        x[i] = x[i] < 0.0f ? 0.0f : x[i];
}

void dp_relu_backward(float *restrict dx, const float *restrict out, int n)
{
    for (int i = 0; i < n; i++)
        dx[i] = out[i] > 0.0f ? dx[i] : 0.0f;
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
