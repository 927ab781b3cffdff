/* Layer kernels: pure compute, outputs first, then inputs, then sizes.
 * Backward functions ACCUMULATE into parameter gradients (dw, db) and
 * OVERWRITE input gradients (dinp).  Matrices are row-major. */
#ifndef DOWNPOUR_LAYERS_H
#define DOWNPOUR_LAYERS_H

#include <stddef.h>
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

/* ---- spatial layers (docs/architecture.md, "Spatial layers") ----------------
 * Images are NHWC: sample r's pixel (y, x), channel c is at
 * in[((r*h + y)*w + x)*c_count + c], so a convolution is ONE product over
 * every output position of the batch, and a window's kw neighbours are kw*c
 * contiguous floats.  Only the checkpoint and flatten (dp_hwc_to_chw) speak
 * PyTorch's CHW order.  Every kernel here splits its work over the process's
 * arithmetic pool (pool.h) by fixed partitions, so results never depend on
 * timing, and allocates nothing. */

/* The geometry of a window sliding over an image: c channels of h x w pixels,
 * a kh x kw window moving by stride, with pad zero pixels on every side. */
typedef struct dp_window {
    int c, h, w;     /* input channels, height, width */
    int kh, kw;      /* window height and width */
    int stride, pad; /* stride >= 1; 0 <= pad < the window's size */
    int oh, ow;      /* output positions: (h + 2 pad - kh) / stride + 1, likewise ow */
} dp_window;

/* Fills *g and computes oh and ow.  Returns 0, or -1 when a size is < 1, the
 * stride < 1, the padding negative or not smaller than the window, or the
 * window larger than the padded input. */
int dp_window_init(dp_window *g, int c, int h, int w, int kh, int kw, int stride, int pad);

/* Lowering for convolution and locally connected layers.
 * rows (batch*oh*ow, kh*kw*c): row (r, oy, ox) holds the window of output
 * position (oy, ox) of sample r, in (ky, kx, c) order, zeros where it hangs
 * over the padding.  in (batch, h, w, c). */
void dp_im2row(float *rows, const float *in, const dp_window *g, int batch);
/* The adjoint: din (batch, h, w, c) = the sum over every row element of
 * drows that the lowering copied from that pixel.  Overwrites din. */
void dp_row2im(float *din, const float *drows, const dp_window *g, int batch);

/* Locally connected layer (untied weights, DistBelief's): each output position
 * p = oy*ow + ox has its own filters.
 * rows (batch*positions, k) from dp_im2row, k = kh*kw*c;
 * w (positions, oc, k); b (positions, oc); out (batch*positions, oc), i.e.
 * NHWC (batch, oh, ow, oc).  relu: out = max(., 0) fused. */
void dp_local_forward(float *out, const float *rows, const float *w, const float *b,
                      int batch, int positions, int k, int oc, int relu);
/* drows (batch*positions, k) = dout . W per position (skipped when drows is
 * NULL); dw (positions, oc, k) and db (positions, oc) are OVERWRITTEN
 * (accumulate 0) or added to (accumulate 1) with the gradient summed over the
 * batch, so a batch lowered in chunks adds chunk after chunk. */
void dp_local_backward(float *drows, float *dw, float *db, const float *dout,
                       const float *rows, const float *w, int batch, int positions, int k,
                       int oc, int accumulate);

/* Pooling over g's windows, channel by channel: out (batch, oh, ow, c).
 * Max: padding never wins (it is -inf).  Average: the sum over the window
 * divided by kh*kw, padding counting as zeros (PyTorch's AvgPool2d default,
 * count_include_pad=True). */
void dp_maxpool_forward(float *out, const float *in, const dp_window *g, int batch);
/* din (batch, h, w, c), OVERWRITTEN: each output's gradient goes to the
 * first maximum of its window (row-major scan order), found again from in
 * and out; windows that overlap add up. */
void dp_maxpool_backward(float *din, const float *dout, const float *in, const float *out,
                         const dp_window *g, int batch);
/* The same when in is the output of a relu: din is then the gradient at the
 * relu's INPUT (a window whose maximum is not positive passes nothing), so
 * the relu's own backward pass is not needed. */
void dp_maxpool_relu_backward(float *din, const float *dout, const float *in, const float *out,
                              const dp_window *g, int batch);
void dp_avgpool_forward(float *out, const float *in, const dp_window *g, int batch);
void dp_avgpool_backward(float *din, const float *dout, const dp_window *g, int batch);

/* Bands of output rows (spatial model parallelism, docs/architecture.md,
 * "Model parallelism"; src/nn/band.c): the kernels above over output rows
 * [oy0, oy1) of every sample.  Images keep their full (batch, h, w, c) and
 * (batch, oh, ow, c) layouts; a band reads and writes only the input rows
 * its windows cover, dp_window_band_rows: [oy0*stride - pad, (oy1-1)*stride
 * - pad + kh) clipped to [0, h) (empty when oy1 <= oy0), vertical padding
 * applying only where the band touches the image's border. */
void dp_window_band_rows(const dp_window *g, int oy0, int oy1, int *iy0, int *iy1);
/* rows (batch*(oy1-oy0)*ow, kh*kw*c): dp_im2row's rows of the band, packed. */
void dp_im2row_band(float *rows, const float *in, const dp_window *g, int batch, int oy0,
                    int oy1);
/* The adjoint: din's band input rows OVERWRITTEN with the sum of what the
 * band's lowering copied from each pixel; din's other rows are left alone. */
void dp_row2im_band(float *din, const float *drows, const dp_window *g, int batch, int oy0,
                    int oy1);
/* out's rows [oy0, oy1) (full layout); backward: din's band input rows
 * OVERWRITTEN from dout's (and, max, out's) rows [oy0, oy1). */
void dp_maxpool_forward_band(float *out, const float *in, const dp_window *g, int batch,
                             int oy0, int oy1);
void dp_maxpool_backward_band(float *din, const float *dout, const float *in, const float *out,
                              const dp_window *g, int batch, int oy0, int oy1);
void dp_avgpool_forward_band(float *out, const float *in, const dp_window *g, int batch,
                             int oy0, int oy1);
void dp_avgpool_backward_band(float *din, const float *dout, const dp_window *g, int batch,
                              int oy0, int oy1);

/* Local contrast normalisation (Jarrett et al. 2009, as DistBelief used it)
 * over an n x n neighbourhood (n odd), same-size output, zero padding:
 *   v = x - sum_{c', dy, dx} k(dy, dx) x[c', y+dy, x+dx]     (subtractive)
 *   s(y, x) = sqrt(sum_{c', dy, dx} k(dy, dx) v[c', y+dy, x+dx]^2)
 *   out = v / max(mean_{y,x} s, s(y, x), DP_LCN_EPS)           (divisive)
 * k is a Gaussian of standard deviation n/4 over the window, divided by its
 * sum times c so that it sums to 1 over the channels and the window.  The
 * mean is per sample.  g: dp_window_init(g, c, h, w, n, n, 1, n/2).
 * keep (batch * dp_lcn_keep_floats(g)) holds what the backward needs: the
 * forward writes it, the backward reads it and uses part of it as scratch
 * (the backward needs two maps of workspace and allocates nothing; what the
 * forward kept stays intact, so the backward may run again). */
#define DP_LCN_EPS 1e-4f
size_t dp_lcn_keep_floats(const dp_window *g);
/* u (n): the 1-D Gaussian taps of k, standard deviation n/4, summing to 1
 * (k(dy, dx) = u(dy) u(dx) / c); the device's lcn uses the same ones. */
void dp_lcn_taps(float *u, int n);
void dp_lcn_forward(float *out, float *keep, const float *in, const dp_window *g, int batch);
/* din (batch, h, w, c) OVERWRITTEN with the gradient of sum(dout * out). */
void dp_lcn_backward(float *din, const float *dout, float *keep, const dp_window *g,
                     int batch);

/* Inverted dropout: each of n elements is kept with probability 1 - rate and
 * then scaled by 1 / (1 - rate), dropped otherwise.  Which elements drop is a
 * hash of (seed, element index): no mask is stored, the backward draws the
 * same mask from the same seed, and the result never depends on threads.
 * out may alias in, din may alias dout.  0 <= rate < 1. */
void dp_dropout_forward(float *out, const float *in, size_t n, float rate, uint64_t seed);
void dp_dropout_backward(float *din, const float *dout, size_t n, float rate, uint64_t seed);

/* Layout changes, per sample: (hw, c) -> (c, hw) and back.  Flatten uses the
 * first so a dense layer after it sees PyTorch's CHW order (nn.Flatten); a
 * model whose input has c > 1 channels (CHW, as datasets store images) uses
 * the second first.  out may not alias in. */
void dp_hwc_to_chw(float *out, const float *in, int batch, int c, int hw);
void dp_chw_to_hwc(float *out, const float *in, int batch, int c, int hw);

#endif
