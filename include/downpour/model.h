/* A model is a stack of dense layers with relu between them and a fused
 * softmax/cross-entropy head.  All parameters live in ONE flat float buffer
 * and all gradients in a twin buffer of the same layout (DESIGN decision 1);
 * a layer only knows its offsets.  Scratch for activations is sized once for
 * max_batch, so a training step allocates nothing.
 *
 * Spec strings: a preset name, or widths joined by '-', input first:
 *   "mlp-300-100"  = "784-300-100-10"   (reference Model 1)
 *   "mlp-128"      = "784-128-10"       (reference Models 2 and 3)
 *   "784-512-256-10" or any other stack: every hidden layer is dense + relu,
 *   the last is dense + softmax.  2 to DP_MAX_DENSE+1 widths, each 1..65536. */
#ifndef DOWNPOUR_MODEL_H
#define DOWNPOUR_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/status.h"

#define DP_MAX_DENSE 16

typedef struct dp_dense {
    int in, out;
    size_t w_off; /* (out,in) weights at params + w_off */
    size_t b_off; /* (out) bias at params + b_off */
    int relu;     /* 1 for hidden layers, 0 for the logits layer */
} dp_dense;

/* Told during dp_model_forward_backward each time the gradients [lo,
 * n_params) are final, last layer first, so a gradient all-reduce can start
 * on them while backprop goes on (see reducer.h). */
typedef void (*dp_grad_ready_fn)(void *ctx, size_t lo);

typedef struct dp_model {
    char spec[128];     /* canonical widths, "784-300-100-10" */
    char name[128];     /* preset name if any, else the spec */
    int n_dense;
    dp_dense dense[DP_MAX_DENSE];
    size_t n_params;
    float *params;      /* n_params floats */
    float *grads;       /* n_params floats, same layout */
    int max_batch;
    float *acts;        /* scratch: outputs of every dense layer for max_batch */
    float *dacts;       /* scratch: two ping-pong gradient buffers */
    /* act_off[i], i >= 1: output of dense i-1 (after relu) = input of dense i;
     * act_off[n_dense]: the logits.  act_off[0] is unused: dense 0 reads the
     * caller's x directly (never copied). */
    size_t act_off[DP_MAX_DENSE + 1];
    float *probs;       /* (max_batch, classes) softmax output */
    dp_grad_ready_fn grad_ready; /* NULL: nobody listens */
    void *grad_ready_ctx;
} dp_model;

/* Parses spec, allocates params, grads and scratch; params are zero until
 * dp_model_init_params. */
int dp_model_init(dp_model *m, const char *spec, int max_batch, dp_err *err);
void dp_model_free(dp_model *m); /* safe on a zeroed or freed model */

int dp_model_inputs(const dp_model *m);
int dp_model_classes(const dp_model *m);

/* Glorot-uniform weights, limit sqrt(6/(in+out)), zero biases (Keras defaults). */
void dp_model_init_params(dp_model *m, uint64_t seed);

/* Forward only (evaluation).  x (batch, inputs); returns mean loss; adds the
 * count of correct predictions to *correct when non-NULL.  Every label must be
 * < classes.  A batch outside [1, max_batch] does nothing and returns NAN. */
float dp_model_forward(dp_model *m, const float *x, const uint8_t *y, int batch, int *correct);

/* Forward and backward: OVERWRITES m->grads with the gradient of the mean
 * loss over the batch (each layer's weight GEMM runs with beta 0 and the bias
 * sums overwrite, so there is no zeroing pass); returns the mean loss.  The
 * first layer's input gradient is never computed.  Allocates nothing. */
float dp_model_forward_backward(dp_model *m, const float *x, const uint8_t *y, int batch,
                                int *correct);

#endif
