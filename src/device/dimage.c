/* The image layers on a device (dexec.h): conv and local as a lowering
 * kernel, column-major products and the bias epilogue, a chunk of samples at
 * a time; pools and layout changes as one kernel each (kernels.h, "image
 * layers").  Everything is queued on the backend's one stream and nothing
 * here waits, so reusing rows/drows from chunk to chunk is safe.
 *
 * Products.  The CPU's conv (model.c) is, per chunk of cb samples and
 * M = cb*P rows (P = oh*ow positions, K = kh*kw*c),
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
 * DIMAGE_ROWS_BUDGET floats (dp_dimage_scratch) and at run time lowers as
 * many samples as the executor's scratch and ones vector hold.  cnn-mnist's
 * layers then run a batch of 128 in one chunk.  The chunks change only the
 * order of the weight-gradient sums, never what is summed. */
#include "device/dexec.h"

#include <string.h>

/* Floats of lowered input a layer asks for (64 MiB, and again for drows). */
#define DIMAGE_ROWS_BUDGET ((size_t)1 << 24)

int dp_dimage_supported(dp_layer_kind kind)
{
    switch (kind) {
    case DP_LAYER_CONV:
    case DP_LAYER_LOCAL:
    case DP_LAYER_MAXPOOL:
    case DP_LAYER_AVGPOOL:
    case DP_LAYER_FLATTEN:
    case DP_LAYER_HWC:
        return 1;
    default:
        return 0;
    }
}

static int lowered(const dp_layer *L)
{
    return L->kind == DP_LAYER_CONV || L->kind == DP_LAYER_LOCAL;
}

/* Floats of one sample's lowering. */
static size_t lowered_floats(const dp_layer *L)
{
    return (size_t)L->oh * L->ow * L->win.kh * L->win.kw * L->c;
}

/* Ones one sample's bias gradient reads: a conv sums over every position,
 * a local layer only over the samples. */
static size_t ones_per_sample(const dp_layer *L)
{
    return L->kind == DP_LAYER_CONV ? (size_t)L->oh * L->ow : 1;
}

/* The chunk dp_dimage_scratch and dp_dimage_ones size for. */
static size_t planned_chunk(const dp_layer *L, int max_batch)
{
    size_t chunk = DIMAGE_ROWS_BUDGET / lowered_floats(L);
    if (chunk < 1)
        chunk = 1;
    if (max_batch > 0 && chunk > (size_t)max_batch)
        chunk = (size_t)max_batch;
    return chunk;
}

size_t dp_dimage_scratch(const dp_layer *L, int max_batch)
{
    return lowered(L) ? planned_chunk(L, max_batch) * lowered_floats(L) : 0;
}

long dp_dimage_ones(const dp_layer *L, int max_batch)
{
    return lowered(L) ? (long)(planned_chunk(L, max_batch) * ones_per_sample(L)) : 0;
}

/* Samples lowered at a time: as many as x's scratch holds (and, in the
 * backward, its ones), at most the batch.  0 only when x was sized below
 * this layer's dp_dimage_scratch or dp_dimage_ones, a bug of the
 * executor's: the layer then does nothing rather than write past the end. */
static int run_chunk(const dp_dexec *x, const dp_layer *L, int batch, int with_ones)
{
    size_t chunk = x->rows_floats / lowered_floats(L);
    size_t by_ones = x->ones_len > 0 ? (size_t)x->ones_len / ones_per_sample(L) : 0;
    if (with_ones && by_ones < chunk)
        chunk = by_ones;
    return chunk < (size_t)batch ? (int)chunk : batch;
}

static void launch_window(const dp_dexec *x, dp_kernel_id id, long items, float *dst,
                          const float *src, const float *grad, const float *fout,
                          const dp_window *w)
{
    dp_kernel k;
    memset(&k, 0, sizeof k);
    k.id = id;
    k.items = items;
    k.u.window.dst = dst;
    k.u.window.src = src;
    k.u.window.grad = grad;
    k.u.window.fout = fout;
    k.u.window.g = (dp_kwin){w->c, w->h, w->w, w->kh, w->kw, w->stride, w->pad, w->oh, w->ow};
    x->be->launch(x->ctx, &k);
}

static void launch_layout(const dp_dexec *x, float *out, const float *in, int batch,
                          const dp_layer *L, int to_chw)
{
    dp_kernel k;
    memset(&k, 0, sizeof k);
    k.id = DP_K_LAYOUT;
    k.items = (long)batch * L->in;
    k.u.layout = (dp_ka_layout){out, in, L->c, L->h * L->w, to_chw};
    x->be->launch(x->ctx, &k);
}

/* c (m, n) = a' b' (alpha 1) + beta c, column-major (backend.h). */
static void gemm(const dp_dexec *x, int ta, int tb, int m, int n, int k, const float *a,
                 int lda, const float *b, int ldb, float beta, float *c, int ldc)
{
    dp_gemm g = {ta, tb, m, n, k, 1.0f, beta, a, lda, b, ldb, c, ldc};
    x->be->gemm(x->ctx, &g);
}

static void lowered_forward(const dp_dexec *x, const dp_layer *L, const float *params,
                            const float *in, float *out, int batch, int relu)
{
    const int P = L->oh * L->ow, K = L->win.kh * L->win.kw * L->c, oc = L->oc;
    const float *w = params + L->w_off;
    int chunk = run_chunk(x, L, batch, 0);
    if (chunk < 1)
        return;
    for (int r0 = 0; r0 < batch; r0 += chunk) {
        int cb = batch - r0 < chunk ? batch - r0 : chunk;
        float *o = out + (size_t)r0 * L->out;
        launch_window(x, DP_K_IM2ROW, (long)cb * P * K, x->rows, in + (size_t)r0 * L->in,
                      NULL, NULL, &L->win);
        if (L->kind == DP_LAYER_CONV)
            gemm(x, 1, 0, oc, cb * P, K, w, K, x->rows, K, 0.0f, o, oc);
        else
            for (int p = 0; p < P; p++)
                gemm(x, 1, 0, oc, cb, K, w + (size_t)p * oc * K, K, x->rows + (size_t)p * K,
                     P * K, 0.0f, o + (size_t)p * oc, P * oc);
    }
    /* one epilogue for the whole batch: a conv's bias is (oc), a local
     * layer's (P, oc), i.e. a row of (batch, P*oc) */
    dp_kernel k;
    memset(&k, 0, sizeof k);
    k.id = DP_K_BIAS_ACT;
    k.items = (long)batch * L->out;
    k.u.bias_act = (dp_ka_bias_act){out, params + L->b_off,
                                    L->kind == DP_LAYER_CONV ? oc : (long)P * oc, relu};
    x->be->launch(x->ctx, &k);
}

/* Lowers the input again, chunk by chunk; the first chunk's products
 * overwrite the gradients (beta 0) and the later ones add (beta 1). */
static void lowered_backward(const dp_dexec *x, const dp_layer *L, const float *params,
                             float *grads, const float *in, const float *dout, float *din,
                             int batch)
{
    const int P = L->oh * L->ow, K = L->win.kh * L->win.kw * L->c, oc = L->oc;
    const float *w = params + L->w_off;
    float *gw = grads + L->w_off, *gb = grads + L->b_off;
    int chunk = run_chunk(x, L, batch, 1);
    if (chunk < 1)
        return;
    for (int r0 = 0; r0 < batch; r0 += chunk) {
        int cb = batch - r0 < chunk ? batch - r0 : chunk, M = cb * P;
        const float *go = dout + (size_t)r0 * L->out;
        float beta = r0 > 0 ? 1.0f : 0.0f;
        launch_window(x, DP_K_IM2ROW, (long)M * K, x->rows, in + (size_t)r0 * L->in, NULL,
                      NULL, &L->win);
        if (L->kind == DP_LAYER_CONV) {
            gemm(x, 0, 1, K, oc, M, x->rows, K, go, oc, beta, gw, K);
            gemm(x, 0, 0, oc, 1, M, go, oc, x->ones, M, beta, gb, oc);
            if (din)
                gemm(x, 0, 0, K, M, oc, w, K, go, oc, 0.0f, x->drows, K);
        } else {
            for (int p = 0; p < P; p++)
                gemm(x, 0, 1, K, oc, cb, x->rows + (size_t)p * K, P * K, go + (size_t)p * oc,
                     P * oc, beta, gw + (size_t)p * oc * K, K);
            gemm(x, 0, 0, P * oc, 1, cb, go, P * oc, x->ones, cb, beta, gb, P * oc);
            for (int p = 0; din && p < P; p++)
                gemm(x, 0, 0, K, cb, oc, w + (size_t)p * oc * K, K, go + (size_t)p * oc, P * oc,
                     0.0f, x->drows + (size_t)p * K, P * K);
        }
        if (din)
            launch_window(x, DP_K_ROW2IM, (long)cb * L->in, din + (size_t)r0 * L->in, NULL,
                          x->drows, NULL, &L->win);
    }
}

void dp_dimage_forward(const dp_dexec *x, const dp_layer *L, const float *params,
                       const float *in, float *out, int batch, int relu)
{
    if (batch < 1)
        return;
    switch (L->kind) {
    case DP_LAYER_CONV:
    case DP_LAYER_LOCAL:
        lowered_forward(x, L, params, in, out, batch, relu);
        break;
    case DP_LAYER_MAXPOOL:
        launch_window(x, DP_K_MAXPOOL_FWD, (long)batch * L->out, out, in, NULL, NULL, &L->win);
        break;
    case DP_LAYER_AVGPOOL:
        launch_window(x, DP_K_AVGPOOL_FWD, (long)batch * L->out, out, in, NULL, NULL, &L->win);
        break;
    case DP_LAYER_FLATTEN: /* NHWC -> PyTorch's CHW */
        launch_layout(x, out, in, batch, L, 1);
        break;
    case DP_LAYER_HWC: /* a CHW input -> NHWC */
        launch_layout(x, out, in, batch, L, 0);
        break;
    default:
        break;
    }
}

void dp_dimage_backward(const dp_dexec *x, const dp_layer *L, const float *params, float *grads,
                        const float *in, const float *out, const float *dout, float *din,
                        int batch)
{
    if (batch < 1)
        return;
    switch (L->kind) {
    case DP_LAYER_CONV:
    case DP_LAYER_LOCAL:
        lowered_backward(x, L, params, grads, in, dout, din, batch);
        break;
    case DP_LAYER_MAXPOOL:
        if (din)
            launch_window(x, DP_K_MAXPOOL_BWD, (long)batch * L->in, din, in, dout, out,
                          &L->win);
        break;
    case DP_LAYER_AVGPOOL:
        if (din)
            launch_window(x, DP_K_AVGPOOL_BWD, (long)batch * L->in, din, NULL, dout, NULL,
                          &L->win);
        break;
    case DP_LAYER_FLATTEN:
        if (din)
            launch_layout(x, din, dout, batch, L, 0);
        break;
    case DP_LAYER_HWC:
        if (din)
            launch_layout(x, din, dout, batch, L, 1);
        break;
    default:
        break;
    }
}
