/* What a layer kind's device kernels need to queue work: the backend and
 * its context, and the scratch every layer shares.  The device executor
 * (dmodel.c) walks a model through the layer table (layer_kind.h), and each
 * kind's file (src/nn/layer_<kind>.c) queues its forward or backward with
 * the helpers below (docs/gpu.md, "Layers").  Headers only: the kinds' files
 * use the device's kernel vocabulary (backend.h, kernels.h), never its code
 * (docs/architecture.md, "Module order"). */
#ifndef DP_DEVICE_DEXEC_H
#define DP_DEVICE_DEXEC_H

#include <stddef.h>
#include <string.h>

#include "device/backend.h"
#include "downpour/layers.h"

typedef struct dp_dexec {
    const dp_backend *be;
    void *ctx;
    const float *ones;   /* device: ones_len ones, for bias gradients as products */
    long ones_len;
    float *rows, *drows; /* device scratch: a chunk's lowered input and its gradient */
    size_t rows_floats;  /* floats in each (the largest dev_scratch of the model) */
} dp_dexec;

static inline void dp_dexec_launch(const dp_dexec *x, const dp_kernel *k)
{
    x->be->launch(x->ctx, k);
}

/* c (m, n) = a' b' (alpha 1) + beta c, column-major (backend.h). */
static inline void dp_dexec_gemm(const dp_dexec *x, int ta, int tb, int m, int n, int k,
                                 const float *a, int lda, const float *b, int ldb, float beta,
                                 float *c, int ldc)
{
    dp_gemm g = {.ta = ta, .tb = tb, .m = m, .n = n, .k = k, .alpha = 1.0f, .beta = beta, .a = a,
                 .lda = lda, .b = b, .ldb = ldb, .c = c, .ldc = ldc};
    x->be->gemm(x->ctx, &g);
}

/* batch products c_i (m, n) = a_i' b_i' + beta c_i, x_i = x + i stride_x
 * (floats): one strided-batched launch (backend.h) for many small products
 * of one shape, such as mha's per-(record, head) ones. */
static inline void dp_dexec_gemm_batched(const dp_dexec *x, int ta, int tb, int m, int n, int k,
                                         const float *a, int lda, long long stride_a,
                                         const float *b, int ldb, long long stride_b, float beta,
                                         float *c, int ldc, long long stride_c, int batch)
{
    if (batch < 1)
        return; /* no products (dp_gemm's batch 0 would be one) */
    dp_gemm g = {.ta = ta, .tb = tb, .m = m, .n = n, .k = k, .alpha = 1.0f, .beta = beta, .a = a,
                 .lda = lda, .b = b, .ldb = ldb, .c = c, .ldc = ldc, .batch = batch,
                 .stride_a = stride_a, .stride_b = stride_b, .stride_c = stride_c};
    x->be->gemm(x->ctx, &g);
}

/* A window kernel (kernels.h, "image layers") over window w. */
static inline void dp_dexec_window(const dp_dexec *x, dp_kernel_id id, long items, float *dst,
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

/* NHWC <-> CHW of batch images of c channels and hw pixels. */
static inline void dp_dexec_layout(const dp_dexec *x, float *out, const float *in, int batch,
                                   int c, int hw, int to_chw)
{
    dp_kernel k;
    memset(&k, 0, sizeof k);
    k.id = DP_K_LAYOUT;
    k.items = (long)batch * c * hw;
    k.u.layout = (dp_ka_layout){out, in, c, hw, to_chw};
    x->be->launch(x->ctx, &k);
}

#endif
