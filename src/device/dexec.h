/* What a layer's device code needs to queue work (private to src/device/):
 * the backend and its context, and the scratch every layer shares.  The
 * model walk (dmodel.c) runs dense, relu, softmax_xent and dropout itself and
 * hands the image layers (conv, local, maxpool, avgpool, flatten, hwc) to
 * dimage.c and lcn to dlcn.c, one layer's forward or backward per call
 * (docs/gpu.md, "Layers"). */
#ifndef DP_DEVICE_DEXEC_H
#define DP_DEVICE_DEXEC_H

#include <stddef.h>

#include "device/backend.h"
#include "downpour/model.h"

typedef struct dp_dexec {
    const dp_backend *be;
    void *ctx;
    const float *ones;   /* device: ones_len ones, for bias gradients as products */
    long ones_len;
    float *rows, *drows; /* device scratch: a chunk's lowered input and its gradient */
    size_t rows_floats;  /* floats in each (the largest dp_dimage_scratch of the model) */
} dp_dexec;

/* Whether dimage.c runs layer kind `kind`. */
int dp_dimage_supported(dp_layer_kind kind);
/* Floats of rows/drows scratch layer L needs for batches of max_batch rows,
 * and the ones it needs for its bias gradient (0 when none). */
size_t dp_dimage_scratch(const dp_layer *L, int max_batch);
long dp_dimage_ones(const dp_layer *L, int max_batch);

/* out (batch, L->out) from in (batch, L->in), NHWC as on the CPU (layers.h);
 * relu: a relu follows and is fused into the epilogue (conv only). */
void dp_dimage_forward(const dp_dexec *x, const dp_layer *L, const float *params,
                       const float *in, float *out, int batch, int relu);
/* The backward, after the forward with the same params, in and batch: out is
 * what the forward wrote; dout the gradient at the output (for a fused relu,
 * already masked); the layer's weight and bias gradients in grads are
 * OVERWRITTEN; din (batch, L->in) is overwritten, or skipped when NULL. */
void dp_dimage_backward(const dp_dexec *x, const dp_layer *L, const float *params, float *grads,
                        const float *in, const float *out, const float *dout, float *din,
                        int batch);

/* lcn (dlcn.c): its passes as kernels over a keep of its own in device
 * memory, dp_dlcn_keep_floats for batches of up to max_batch rows, holding
 * what the backward needs and the Gaussian taps.  dp_dlcn_init queues the
 * taps' copy into keep (once, at open; -1 when the host is out of memory).
 * The forward writes out (batch, L->out) and keep; the backward, after the
 * forward with the same keep and batch, OVERWRITES din (batch, L->in) with
 * the gradient of sum(dout * out), as dp_lcn_backward. */
size_t dp_dlcn_keep_floats(const dp_layer *L, int max_batch);
int dp_dlcn_init(const dp_dexec *x, const dp_layer *L, float *keep, int max_batch);
void dp_dlcn_forward(const dp_dexec *x, const dp_layer *L, float *keep, int max_batch,
                     const float *in, float *out, int batch);
void dp_dlcn_backward(const dp_dexec *x, const dp_layer *L, float *keep, int max_batch,
                      const float *dout, float *din, int batch);

#endif
