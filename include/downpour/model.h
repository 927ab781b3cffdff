/* A model is a sequence of typed layers (docs/architecture.md, "The model"): dense, relu and
 * a softmax/cross-entropy loss layer, run forward or backward over any range
 * of layers [a, b).  One process runs the whole range; a pipeline stage or a
 * model-parallel task runs its part with the same calls.
 *
 * Layers.  Layer l maps (batch, layers[l].in) to (batch, layers[l].out); the
 * spec "784-300-100-10" becomes
 *     0 dense 784->300, 1 relu 300, 2 dense 300->100, 3 relu 100,
 *     4 dense 100->10,  5 softmax_xent 10 (the loss; its output is the probabilities)
 * Only dense layers have parameters.  All parameters live in ONE flat float
 * buffer and all gradients in a twin buffer of the same layout
 * (docs/architecture.md, "The flat parameter buffer"): dense after dense,
 * weights (out,in) at w_off then bias (out) at b_off,
 * PyTorch Linear's layout; a layer only knows its offsets.  Parameters and
 * gradients are arguments of the range calls, so evaluation runs any weights
 * (an EMA, the best epoch's) without touching m->params.
 *
 * Activations.  dp_model_init sizes activation scratch for `slots`
 * micro-batches in flight, each with room for max_batch rows of every layer's
 * output: a pipeline stage runs the forwards of slots 0, 1, 2 and later their
 * backwards, each from its own slot.  A range's input is the caller's memory,
 * never copied: it must stay unchanged until that slot's backward.  Inside a
 * range a dense layer followed by a relu runs as one fused kernel (the relu in
 * the product's epilogue, its mask in the input-gradient product's), so a
 * range costs the same as the old dense stack; a range boundary between a
 * dense and its relu runs them apart and gives the same numbers.  Nothing
 * allocates after dp_model_init.  Calls on one model run one at a time (each
 * product is split over the arithmetic pool inside the call).
 *
 * Spec strings: a preset name, or widths joined by '-', input first:
 *   "mlp-300-100"  = "784-300-100-10"   (reference Model 1)
 *   "mlp-128"      = "784-128-10"       (reference Models 2 and 3)
 *   "784-512-256-10" or any other stack: every hidden layer is dense + relu,
 *   the last is dense + softmax_xent.  2 to DP_MAX_DENSE+1 widths, each 1..65536. */
#ifndef DOWNPOUR_MODEL_H
#define DOWNPOUR_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/status.h"

#define DP_MAX_DENSE 16                   /* dense layers: at most DP_MAX_DENSE+1 widths */
#define DP_MAX_LAYERS (2 * DP_MAX_DENSE)  /* dense, relu, ..., dense, softmax_xent */

typedef enum dp_layer_kind {
    DP_LAYER_DENSE,        /* out = in W^T + b */
    DP_LAYER_RELU,         /* out = max(in, 0) */
    DP_LAYER_SOFTMAX_XENT, /* out = softmax(in); with labels, the mean cross-entropy loss */
    DP_LAYER_KIND_COUNT
} dp_layer_kind;

/* "dense", "relu", "softmax_xent"; "?" outside the enum. */
const char *dp_layer_kind_name(dp_layer_kind kind);

typedef struct dp_layer {
    dp_layer_kind kind;
    int in, out;  /* features in and out (equal for relu and softmax_xent) */
    size_t w_off; /* dense: (out,in) weights at params + w_off */
    size_t b_off; /* dense: (out) bias at params + b_off */
} dp_layer;

/* Told during dp_model_forward_backward each time the gradients [lo,
 * n_params) are final, last layer first, so a gradient all-reduce can start
 * on them while backprop goes on (see reducer.h).  The range calls never call
 * it. */
typedef void (*dp_grad_ready_fn)(void *ctx, size_t lo);

typedef struct dp_model {
    char spec[128];     /* canonical widths, "784-300-100-10" */
    char name[128];     /* preset name if any, else the spec */
    int n_layers;
    dp_layer layers[DP_MAX_LAYERS]; /* the truth: the sequence the range calls run */
    int n_dense;        /* how many of them are dense */
    size_t n_params;
    float *params;      /* n_params floats */
    float *grads;       /* n_params floats, same layout */
    int max_batch;
    int slots;          /* micro-batches whose activations can be in flight */
    float *acts;        /* slots * slot_floats: every layer's output, per slot */
    size_t slot_floats;
    size_t act_off[DP_MAX_LAYERS + 1]; /* [l], l >= 1: output of layer l-1 in a slot */
    float *dacts;       /* two ping-pong gradient buffers, shared by the slots */
    size_t dact_floats; /* floats in each */
    dp_grad_ready_fn grad_ready; /* NULL: nobody listens */
    void *grad_ready_ctx;
} dp_model;

/* Parses spec, allocates params, grads and activation scratch for `slots`
 * (>= 1) micro-batches of up to max_batch rows; params are zero until
 * dp_model_init_params. */
int dp_model_init(dp_model *m, const char *spec, int max_batch, int slots, dp_err *err);
void dp_model_free(dp_model *m); /* safe on a zeroed or freed model */

int dp_model_inputs(const dp_model *m);
int dp_model_classes(const dp_model *m);

/* Glorot-uniform weights, limit sqrt(6/(in+out)), zero biases (Keras defaults). */
void dp_model_init_params(dp_model *m, uint64_t seed);

/* ---- ranges of layers [a, b), 0 <= a < b <= n_layers ----
 * Common arguments: slot in [0, slots); batch in [1, max_batch]; params is a
 * buffer of n_params floats in the model's layout (m->params or any other
 * weights).  A call with an argument out of range does nothing and returns
 * NULL, NAN or -1. */

/* Forward over [a, b): in (batch, layers[a].in) -> returns the output (batch,
 * layers[b-1].out), which lives in the slot's scratch until the slot's next
 * forward over layer b-1.  A range that holds the loss layer gets no labels
 * here: its output is the probabilities and no loss is computed. */
const float *dp_model_forward_range(dp_model *m, int slot, const float *params,
                                    const float *in, int a, int b, int batch);

/* Forward over [a, n_layers), a range that ends with the loss: in (batch,
 * layers[a].in), labels y (batch), each < classes.  Returns the mean loss and
 * ADDS the count of correct argmax predictions to *correct when non-NULL; the
 * probabilities are dp_model_act(m, slot, n_layers). */
float dp_model_forward_range_loss(dp_model *m, int slot, const float *params, const float *in,
                                  const uint8_t *y, int a, int batch, int *correct);

/* Backward over [a, b), b < n_layers (a range without the loss layer), after
 * the forwards of this slot over those layers with the same params, in and
 * batch:
 *   din (batch, layers[a].in) = the gradient at the range's input (for
 *       a = 0, with respect to x); NULL: not wanted, and layer a's
 *       input-gradient product is skipped (training never needs layer 0's).
 *   grads (n_params): each dense layer's weight and bias gradients in [a, b)
 *       are OVERWRITTEN (no zeroing pass; the products run with beta 0);
 *       every other float of grads is left alone.
 *   dout (batch, layers[b-1].out): the gradient at the range's output.
 *   in: the input the forward got (read when layer a is dense; may be NULL
 *       otherwise).
 * din may not alias dout, in, or the model's scratch.  Returns 0, or -1 for
 * arguments out of range. */
int dp_model_backward_range(dp_model *m, int slot, float *din, float *grads,
                            const float *params, const float *dout, const float *in, int a,
                            int b, int batch);

/* Backward over [a, n_layers), a range that ends with the loss, after
 * dp_model_forward_range_loss of this slot with the same a, params, in, y and
 * batch: the gradient of the mean loss.  din and grads as in
 * dp_model_backward_range.  Returns 0, or -1 for arguments out of range. */
int dp_model_backward_range_loss(dp_model *m, int slot, float *din, float *grads,
                                 const float *params, const float *in, const uint8_t *y, int a,
                                 int batch);

/* The input of layer l in a slot, 1 <= l <= n_layers: (max_batch,
 * layers[l-1].out), the output of layer l-1 as the slot's last forward over it
 * left it; l = n_layers is the probabilities.  Inside a range a fused dense +
 * relu writes only the relu's output, so the dense's own output is stale
 * there.  NULL for l or slot out of range. */
float *dp_model_act(const dp_model *m, int slot, int l);

/* ---- the whole model, slot 0 ---- */

/* Forward only (evaluation) with any weights params (n_params floats).  x
 * (batch, inputs); returns mean loss; adds the count of correct predictions to
 * *correct when non-NULL.  Every label must be < classes.  A batch outside
 * [1, max_batch] does nothing and returns NAN. */
float dp_model_forward(dp_model *m, const float *params, const float *x, const uint8_t *y,
                       int batch, int *correct);

/* Forward and backward with m->params: OVERWRITES m->grads with the gradient
 * of the mean loss over the batch (each layer's weight GEMM runs with beta 0
 * and the bias sums overwrite, so there is no zeroing pass); returns the mean
 * loss.  The first layer's input gradient is never computed.  Calls
 * m->grad_ready after each dense layer's gradients are final.  Allocates
 * nothing. */
float dp_model_forward_backward(dp_model *m, const float *x, const uint8_t *y, int batch,
                                int *correct);

#endif
