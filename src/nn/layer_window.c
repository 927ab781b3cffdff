/* What the windowed layer kinds share (layer_impl.h): their tokens, their
 * spelling, and the lowered kinds' (conv, local) products on the CPU, on a
 * band of rows (model parallelism) and on a device. */
#include "nn/layer_impl.h"

#include <string.h>

#include "device/dexec.h"
#include "downpour/blas.h"
#include "downpour/layers.h"

int dp_lk_parse_filter(dp_spec_parser *p, dp_layer_kind kind, const char *s, const char *end)
{
    int kh = 0, kw = 0, oc = 0, stride = 1, pad = 0;
    if (dp_spec_window_size(p, &s, end, &kh, &kw, &oc) < 0 ||
        dp_spec_window_opts(p, s, end, &stride, &pad) < 0 || dp_spec_need_image(p) < 0)
        return -1;
    dp_layer *d = dp_spec_add(p, kind);
    if (!d || dp_spec_window(p, d, kh, kw, stride, pad) < 0 ||
        dp_spec_out(p, d, oc, d->win.oh, d->win.ow) < 0)
        return -1;
    size_t k = (size_t)kh * kw * d->c, positions = (size_t)d->oh * d->ow;
    if (kind == DP_LAYER_CONV) /* filters shared by every position */
        return dp_spec_params(p, d, (size_t)oc * k, (size_t)oc);
    return dp_spec_params(p, d, positions * oc * k, positions * oc);
}

int dp_lk_parse_pool(dp_spec_parser *p, dp_layer_kind kind, const char *s, const char *end)
{
    int kh = 0, kw = 0, stride = 0, pad = 0;
    if (dp_spec_window_size(p, &s, end, &kh, &kw, NULL) < 0 ||
        dp_spec_window_opts(p, s, end, &stride, &pad) < 0 || dp_spec_need_image(p) < 0)
        return -1;
    dp_layer *d = dp_spec_add(p, kind);
    return !d || dp_spec_window(p, d, kh, kw, stride ? stride : kh, pad) < 0 ||
                   dp_spec_out(p, d, d->c, d->win.oh, d->win.ow) < 0
               ? -1
               : 0;
}

void dp_lk_emit_window(dp_spec_parser *p, const char *name, const dp_layer *d, bool pooled)
{
    const dp_window *g = &d->win;
    dp_spec_emit(p, "-%s%d", name, g->kh);
    if (!pooled || g->kw != g->kh)
        dp_spec_emit(p, "x%d", g->kw);
    if (!pooled)
        dp_spec_emit(p, "x%d", d->oc);
    if (g->stride != (pooled ? g->kh : 1))
        dp_spec_emit(p, "s%d", g->stride);
    if (g->pad)
        dp_spec_emit(p, "p%d", g->pad);
}

void dp_lk_lowered_fans(const dp_layer *d, double *fan_in, double *fan_out)
{
    *fan_in = (double)d->win.kh * d->win.kw * d->c;
    *fan_out = (double)d->win.kh * d->win.kw * d->oc;
}

/* ---- CPU ---- */

/* A conv whose window is one pixel, stride 1, no padding: its lowering is
 * the input itself, so its products read the input (and write the input's
 * gradient) in place, without the copies. */
static bool identity_window(const dp_layer *d, bool local)
{
    const dp_window *g = &d->win;
    return !local && g->kh == 1 && g->kw == 1 && g->stride == 1 && g->pad == 0;
}

float dp_lk_lowered_forward(const dp_layer_call *c, bool local)
{
    const dp_layer *d = c->d;
    int positions = d->oh * d->ow, k = d->win.kh * d->win.kw * d->c;
    for (int r0 = 0; r0 < c->batch; r0 += c->chunk) {
        int cb = c->batch - r0 < c->chunk ? c->batch - r0 : c->chunk;
        float *o = c->out + (size_t)r0 * d->out;
        const float *rows = c->in + (size_t)r0 * d->in;
        if (!identity_window(d, local)) {
            dp_im2row(c->rows, rows, &d->win, cb);
            rows = c->rows;
        }
        if (local)
            dp_local_forward(o, rows, c->w, c->b, cb, positions, k, d->oc, c->relu);
        else if (c->relu)
            dp_dense_relu_forward(o, rows, c->w, c->b, cb * positions, k, d->oc);
        else
            dp_dense_forward(o, rows, c->w, c->b, cb * positions, k, d->oc);
    }
    return 0.0f;
}

/* The input is lowered again, chunk by chunk, and the weight and bias
 * gradients add up over the chunks (the first overwrites). */
void dp_lk_lowered_backward(const dp_layer_call *c, bool local)
{
    const dp_layer *d = c->d;
    int positions = d->oh * d->ow, k = d->win.kh * d->win.kw * d->c;
    bool same = identity_window(d, local);
    for (int r0 = 0; r0 < c->batch; r0 += c->chunk) {
        int cb = c->batch - r0 < c->chunk ? c->batch - r0 : c->chunk;
        const float *go = c->dout + (size_t)r0 * d->out;
        const float *rows = c->in + (size_t)r0 * d->in;
        float *drows = !c->din ? NULL : same ? c->din + (size_t)r0 * d->in : c->drows;
        if (!same) {
            dp_im2row(c->rows, rows, &d->win, cb);
            rows = c->rows;
        }
        if (local)
            dp_local_backward(drows, c->gw, c->gb, go, rows, c->w, cb, positions, k, d->oc,
                              r0 > 0);
        else if (r0 == 0)
            dp_dense_backward_overwrite(drows, c->gw, c->gb, go, rows, c->w, cb * positions, k,
                                        d->oc);
        else
            dp_dense_backward(drows, c->gw, c->gb, go, rows, c->w, cb * positions, k, d->oc);
        if (c->din && !same)
            dp_row2im(c->din + (size_t)r0 * d->in, drows, &d->win, cb);
    }
}

void dp_lk_lowered_backward_part(const dp_layer_call *c, bool weights, bool data)
{
    const dp_layer *d = c->d;
    int positions = d->oh * d->ow, k = d->win.kh * d->win.kw * d->c;
    for (int r0 = 0; r0 < c->batch; r0 += c->chunk) {
        int cb = c->batch - r0 < c->chunk ? c->batch - r0 : c->chunk, M = cb * positions;
        const float *go = c->dout + (size_t)r0 * d->out;
        if (weights) {
            dp_im2row(c->rows, c->in + (size_t)r0 * d->in, &d->win, cb);
            if (r0 == 0)
                dp_dense_backward_overwrite(NULL, c->gw, c->gb, go, c->rows, c->w, M, k, d->oc);
            else
                dp_dense_backward(NULL, c->gw, c->gb, go, c->rows, c->w, M, k, d->oc);
        }
        if (data) {
            dp_sgemm(false, false, M, k, d->oc, 1.0f, go, d->oc, c->w, k, 0.0f, c->drows, k);
            dp_row2im(c->din + (size_t)r0 * d->in, c->drows, &d->win, cb);
        }
    }
}

/* Model parallelism: the band's rows [y0, y1) of every record lowered, the
 * product in c->band, copied into (or, backward, from) the band of the full
 * output (gradient). */
void dp_lk_lowered_band(const dp_layer_call *c, bool local, bool backward)
{
    const dp_layer *L = c->d;
    int P = (c->y1 - c->y0) * L->ow, k = L->win.kh * L->win.kw * L->c, oc = L->oc;
    size_t band_off = (size_t)c->y0 * L->ow * oc, blen = (size_t)P * oc;
    int n = c->batch;
    for (int r0 = 0; r0 < n; r0 += c->chunk) {
        int cb = n - r0 < c->chunk ? n - r0 : c->chunk;
        dp_im2row_band(c->rows, c->in + (size_t)r0 * L->in, &L->win, cb, c->y0, c->y1);
        if (!backward) {
            if (local)
                dp_local_forward(c->band, c->rows, c->w, c->b, cb, P, k, oc, 0);
            else
                dp_dense_forward(c->band, c->rows, c->w, c->b, cb * P, k, oc);
            for (int r = 0; r < cb; r++)
                memcpy(c->out + (size_t)(r0 + r) * L->out + band_off, c->band + r * blen,
                       blen * sizeof(float));
            continue;
        }
        for (int r = 0; r < cb; r++)
            memcpy(c->band + r * blen, c->dout + (size_t)(r0 + r) * L->out + band_off,
                   blen * sizeof(float));
        float *dlow = c->din ? c->drows : NULL;
        if (local)
            dp_local_backward(dlow, c->gw, c->gb, c->band, c->rows, c->w, cb, P, k, oc, r0 > 0);
        else if (r0 == 0)
            dp_dense_backward_overwrite(dlow, c->gw, c->gb, c->band, c->rows, c->w, cb * P, k,
                                        oc);
        else
            dp_dense_backward(dlow, c->gw, c->gb, c->band, c->rows, c->w, cb * P, k, oc);
        if (c->din)
            dp_row2im_band(c->din + (size_t)r0 * L->in, c->drows, &L->win, cb, c->y0, c->y1);
    }
}

/* ---- device (docs/gpu.md, "Layers") ----
 * The CPU's conv is, per chunk of cb samples and M = cb*P rows (P = oh*ow
 * positions, K = kh*kw*c),
 *     out (M, oc) = rows (M, K) W^T,   W (oc, K) row-major,
 *     dW = dout^T rows,  db = column sums of dout,  drows = dout W.
 * A row-major (r, c) matrix is a column-major (c, r) one with leading
 * dimension c, so in cuBLAS's terms (backend.h) these are
 *     out^T (oc, M) = W (ta: W is stored (K, oc)) . rows^T (stored (K, M))
 *     dW^T (K, oc)  = rows^T (stored (K, M)) . dout (tb: stored (oc, M))
 *     db (oc, 1)    = dout^T (stored (oc, M)) . ones (M, 1)
 *     drows^T (K, M) = W^T (stored (K, oc)) . dout^T (stored (oc, M)).
 * A local layer is the same per position p, on rows and outputs strided by
 * P*K and P*oc (local.c), with its bias (P, oc) summed over the cb samples.
 *
 * Chunks.  The CPU lowers 4 MiB at a time to stay in its last-level cache;
 * a GPU wants products with thousands of rows, so a layer asks for up to
 * DEV_ROWS_BUDGET floats (dev_scratch) and at run time lowers as many
 * samples as the executor's scratch and ones vector hold.  cnn-mnist's
 * layers then run a batch of 128 in one chunk.  The chunks change only the
 * order of the weight-gradient sums, never what is summed. */

/* Floats of lowered input a layer asks for (64 MiB, and again for drows). */
#define DEV_ROWS_BUDGET ((size_t)1 << 24)

static size_t lowered_floats(const dp_layer *L)
{
    return (size_t)L->oh * L->ow * L->win.kh * L->win.kw * L->c;
}

/* Ones one sample's bias gradient reads: a conv sums over every position,
 * a local layer only over the samples. */
static size_t ones_per_sample(const dp_layer *L, bool local)
{
    return local ? 1 : (size_t)L->oh * L->ow;
}

static size_t planned_chunk(const dp_layer *L, int max_batch)
{
    size_t chunk = DEV_ROWS_BUDGET / lowered_floats(L);
    if (chunk < 1)
        chunk = 1;
    if (max_batch > 0 && chunk > (size_t)max_batch)
        chunk = (size_t)max_batch;
    return chunk;
}

size_t dp_lk_lowered_dev_scratch(const dp_layer *d, int max_batch)
{
    return planned_chunk(d, max_batch) * lowered_floats(d);
}

long dp_lk_lowered_dev_ones(const dp_layer *d, int max_batch, bool local)
{
    return (long)(planned_chunk(d, max_batch) * ones_per_sample(d, local));
}

/* Samples lowered at a time: as many as x's scratch holds (and, in the
 * backward, its ones), at most the batch.  0 only when x was sized below
 * this layer's dev_scratch or dev_ones, a bug of the executor's: the layer
 * then does nothing rather than write past the end. */
static int run_chunk(const dp_dexec *x, const dp_layer *L, int batch, int with_ones, bool local)
{
    size_t chunk = x->rows_floats / lowered_floats(L);
    size_t by_ones = x->ones_len > 0 ? (size_t)x->ones_len / ones_per_sample(L, local) : 0;
    if (with_ones && by_ones < chunk)
        chunk = by_ones;
    return chunk < (size_t)batch ? (int)chunk : batch;
}

void dp_lk_lowered_dev_forward(const dp_dexec *x, const dp_layer_call *c, bool local)
{
    const dp_layer *L = c->d;
    const int P = L->oh * L->ow, K = L->win.kh * L->win.kw * L->c, oc = L->oc;
    int batch = c->batch;
    if (batch < 1)
        return;
    int chunk = run_chunk(x, L, batch, 0, local);
    if (chunk < 1)
        return;
    for (int r0 = 0; r0 < batch; r0 += chunk) {
        int cb = batch - r0 < chunk ? batch - r0 : chunk;
        float *o = c->out + (size_t)r0 * L->out;
        dp_dexec_window(x, DP_K_IM2ROW, (long)cb * P * K, x->rows, c->in + (size_t)r0 * L->in,
                        NULL, NULL, &L->win);
        if (!local)
            dp_dexec_gemm(x, 1, 0, oc, cb * P, K, c->w, K, x->rows, K, 0.0f, o, oc);
        else
            for (int p = 0; p < P; p++)
                dp_dexec_gemm(x, 1, 0, oc, cb, K, c->w + (size_t)p * oc * K, K,
                              x->rows + (size_t)p * K, P * K, 0.0f, o + (size_t)p * oc, P * oc);
    }
    /* one epilogue for the whole batch: a conv's bias is (oc), a local
     * layer's (P, oc), i.e. a row of (batch, P*oc) */
    dp_kernel k;
    memset(&k, 0, sizeof k);
    k.id = DP_K_BIAS_ACT;
    k.items = (long)batch * L->out;
    k.u.bias_act = (dp_ka_bias_act){c->out, c->b, !local ? oc : (long)P * oc, c->relu};
    dp_dexec_launch(x, &k);
}

/* Lowers the input again, chunk by chunk; the first chunk's products
 * overwrite the gradients (beta 0) and the later ones add (beta 1). */
void dp_lk_lowered_dev_backward(const dp_dexec *x, const dp_layer_call *c, bool local)
{
    const dp_layer *L = c->d;
    const int P = L->oh * L->ow, K = L->win.kh * L->win.kw * L->c, oc = L->oc;
    int batch = c->batch;
    float *din = c->din;
    if (batch < 1)
        return;
    int chunk = run_chunk(x, L, batch, 1, local);
    if (chunk < 1)
        return;
    for (int r0 = 0; r0 < batch; r0 += chunk) {
        int cb = batch - r0 < chunk ? batch - r0 : chunk, M = cb * P;
        const float *go = c->dout + (size_t)r0 * L->out;
        float beta = r0 > 0 ? 1.0f : 0.0f;
        dp_dexec_window(x, DP_K_IM2ROW, (long)M * K, x->rows, c->in + (size_t)r0 * L->in, NULL,
                        NULL, &L->win);
        if (!local) {
            dp_dexec_gemm(x, 0, 1, K, oc, M, x->rows, K, go, oc, beta, c->gw, K);
            dp_dexec_gemm(x, 0, 0, oc, 1, M, go, oc, x->ones, M, beta, c->gb, oc);
            if (din)
                dp_dexec_gemm(x, 0, 0, K, M, oc, c->w, K, go, oc, 0.0f, x->drows, K);
        } else {
            for (int p = 0; p < P; p++)
                dp_dexec_gemm(x, 0, 1, K, oc, cb, x->rows + (size_t)p * K, P * K,
                              go + (size_t)p * oc, P * oc, beta, c->gw + (size_t)p * oc * K, K);
            dp_dexec_gemm(x, 0, 0, P * oc, 1, cb, go, P * oc, x->ones, cb, beta, c->gb, P * oc);
            for (int p = 0; din && p < P; p++)
                dp_dexec_gemm(x, 0, 0, K, cb, oc, c->w + (size_t)p * oc * K, K,
                              go + (size_t)p * oc, P * oc, 0.0f, x->drows + (size_t)p * K, P * K);
        }
        if (din)
            dp_dexec_window(x, DP_K_ROW2IM, (long)cb * L->in, din + (size_t)r0 * L->in, NULL,
                            x->drows, NULL, &L->win);
    }
}
