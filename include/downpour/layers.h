/* Layer kernels: pure compute, outputs first, then inputs, then sizes.
 * Backward functions ACCUMULATE into parameter gradients (dw, db) and
 * OVERWRITE input gradients (dinp).  Matrices are row-major. */
#ifndef DOWNPOUR_LAYERS_H
#define DOWNPOUR_LAYERS_H

#include <stdint.h>

/* out = inp W^T + b.  inp (batch,in), w (out,in) as PyTorch's Linear, b (out), out (batch,out). */
void dp_dense_forward(float *out, const float *inp, const float *w, const float *b,
                      int batch, int in, int out_dim);
/* out = max(inp W^T + b, 0): dense then relu in one pass over out (hidden layers). */
void dp_dense_relu_forward(float *out, const float *inp, const float *w, const float *b,
                           int batch, int in, int out_dim);
/* dinp (batch,in) = dout W  (skipped when dinp is NULL: the first layer needs none);
 * dw (out,in) += dout^T inp;  db (out) += column sums of dout. */
void dp_dense_backward(float *dinp, float *dw, float *db, const float *dout,
                       const float *inp, const float *w, int batch, int in, int out_dim);
/* The same, but OVERWRITES dw and db: dw = dout^T inp, db = column sums.  The
 * model uses it so one batch's gradients need no zeroing pass (the GEMM runs
 * with beta 0). */
void dp_dense_backward_overwrite(float *dinp, float *dw, float *db, const float *dout,
                                 const float *inp, const float *w, int batch, int in,
                                 int out_dim);
/* dp_dense_backward_overwrite for a layer fed by a relu: inp is that relu's
 * output, and dinp comes out already masked (zero where inp is 0), i.e. it is
 * the gradient at the relu's INPUT.  The mask runs on each block of dinp as
 * soon as the product has computed it. */
void dp_dense_backward_relu_overwrite(float *dinp, float *dw, float *db, const float *dout,
                                      const float *inp, const float *w, int batch, int in,
                                      int out_dim);

/* out = max(inp, 0), n elements; out may alias inp (in place). */
void dp_relu_forward(float *out, const float *inp, int n);
/* dinp = dout where the relu's output `out` is positive, else 0; dinp may
 * alias dout (in place). */
void dp_relu_backward(float *dinp, const float *dout, const float *out, int n);

/* Fused softmax + cross-entropy, numerically stable (log-sum-exp).
 * logits (batch,classes) in; probs (batch,classes) out (may alias logits);
 * returns the MEAN loss over the batch; ADDS the number of correct argmax
 * predictions (first maximum wins ties) to *correct if non-NULL.  Every label
 * must be < classes.  labels may be NULL (prediction only): probs are written,
 * the result is 0 and *correct is untouched. */
float dp_softmax_xent_forward(float *probs, const float *logits, const uint8_t *labels,
                              int batch, int classes, int *correct);
/* dlogits = (probs - onehot(labels)) / batch: the gradient of the mean loss.
 * dlogits may alias probs. */
void dp_softmax_xent_backward(float *dlogits, const float *probs, const uint8_t *labels,
                              int batch, int classes);

#endif
