/* What several layer kinds' files share (private to src/nn; layer_kind.h):
 * the windowed tokens' grammar and spelling, and the lowered layers' (conv,
 * local) chunked products on the CPU, on a band of rows, and on a device
 * (layer_window.c). */
#ifndef DOWNPOUR_NN_LAYER_IMPL_H
#define DOWNPOUR_NN_LAYER_IMPL_H

#include <stdbool.h>

#include "downpour/layer_kind.h"
#include "nn/model_spec.h"

/* conv / local: KHxKWxOC[sS][pP]; a pool: K[xK][sS][pP] (stride defaults to
 * the window). */
int dp_lk_parse_filter(dp_spec_parser *p, dp_layer_kind kind, const char *s, const char *end);
int dp_lk_parse_pool(dp_spec_parser *p, dp_layer_kind kind, const char *s, const char *end);
/* The canonical spelling of a windowed layer, defaults left out. */
void dp_lk_emit_window(dp_spec_parser *p, const char *name, const dp_layer *d, bool pooled);

/* A lowered layer's fans (window times channels) and file shapes. */
void dp_lk_lowered_fans(const dp_layer *d, double *fan_in, double *fan_out);

/* conv and local, a chunk of c->chunk records at a time through c->rows
 * (and c->drows); local: one product per position. */
float dp_lk_lowered_forward(const dp_layer_call *c, bool local);
void dp_lk_lowered_backward(const dp_layer_call *c, bool local);
/* A conv's backward in parts (the other part direct, conv_direct.c): the
 * weight and bias gradients (overwritten) when weights, din when data. */
void dp_lk_lowered_backward_part(const dp_layer_call *c, bool weights, bool data);
/* The same on the band [c->y0, c->y1) of output rows (model parallelism):
 * the product through c->band into c->out's band. */
void dp_lk_lowered_band(const dp_layer_call *c, bool local, bool backward);
/* On a device. */
size_t dp_lk_lowered_dev_scratch(const dp_layer *d, int max_batch);
long dp_lk_lowered_dev_ones(const dp_layer *d, int max_batch, bool local);
void dp_lk_lowered_dev_forward(const struct dp_dexec *x, const dp_layer_call *c, bool local);
void dp_lk_lowered_dev_backward(const struct dp_dexec *x, const dp_layer_call *c, bool local);

/* The element-wise kinds (tanh, sigmoid, gelu; layer_pointwise.c): fn on
 * the elements [lo, hi) of the call's arrays (the forward: out from in; the
 * backward: din from dout, in, out), over every element (band false) or
 * the band [c->y0, c->y1) of output rows of every record (model
 * parallelism), split over the pool by fixed ranges, so the bits do not
 * depend on the thread count. */
typedef void (*dp_lk_span_fn)(const dp_layer_call *c, size_t lo, size_t hi);
void dp_lk_pointwise(const dp_layer_call *c, bool band, dp_lk_span_fn fn);
/* A kernels.h kernel on the CPU: its body for items [0, k->items), split
 * over the pool in ranges whose inner bounds are multiples of align (the
 * items are independent, so the bits do not depend on the thread count).
 * The kinds whose CPU path is their device bodies (ln, pos, emb, gap) run
 * through it. */
struct dp_kernel;
void dp_lk_pool_kernel(const struct dp_kernel *k, size_t align);
/* Its device kernel (kernels.h, "element-wise activations"): forward
 * out = f(in), backward din = g(dout, in, out), over every element. */
void dp_lk_pointwise_dev(const struct dp_dexec *x, const dp_layer_call *c, int kernel_id,
                         bool backward);

/* out = a + b over n floats, split over the pool (layer_res.c): a residual
 * block's sum, and in the backward the shortcut's gradient added to the
 * main branch's at the block's input. */
void dp_lk_res_add(float *out, const float *a, const float *b, size_t n);

#endif
