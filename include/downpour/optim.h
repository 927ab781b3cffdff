/* Optimisers on flat ranges (docs/architecture.md, "Optimisers").  An optimiser owns the state
 * for exactly n parameters (a whole model, or one parameter-server shard) and
 * updates params[0..n) from grads[0..n).  Formulas follow Keras:
 *   sgd:       p -= lr g
 *   momentum:  v = mu v - lr g;  p += v            (nesterov: p += mu v - lr g)
 *   adagrad:   a += g^2;  p -= lr g / (sqrt(a) + eps)      a starts at 0.1
 *   adam:      m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *              p -= lr sqrt(1-b2^t)/(1-b1^t) m / (sqrt(v) + eps)
 *   adamw:     p *= 1 - lr wd, then adam's update (decoupled weight decay, as
 *              torch.optim.AdamW; default wd 0.01)
 * With a weight decay wd, every other kind first takes g += wd p (L2, as the
 * weight_decay of torch.optim.SGD, Adagrad and Adam).  wd = 0 (the default)
 * leaves the arithmetic, and so the bits, as without it. */
#ifndef DOWNPOUR_OPTIM_H
#define DOWNPOUR_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/isa.h"
#include "downpour/status.h"

typedef enum dp_optim_kind {
    DP_OPTIM_SGD,
    DP_OPTIM_MOMENTUM,
    DP_OPTIM_NESTEROV,
    DP_OPTIM_ADAGRAD,
    DP_OPTIM_ADAM,
    DP_OPTIM_ADAMW,
    DP_OPTIM_COUNT
} dp_optim_kind;

typedef struct dp_optim_config {
    dp_optim_kind kind;
    float lr;
    float momentum;      /* momentum, nesterov */
    float beta1, beta2;  /* adam */
    float eps;           /* adagrad, adam */
    float initial_accumulator; /* adagrad */
    float weight_decay;  /* adamw: decoupled; the others: L2 on the gradient (0: none) */
} dp_optim_config;

typedef struct dp_optim {
    dp_optim_config cfg;
    size_t n;
    float *state;  /* slots of n floats each: velocity, accumulator, or m then v */
    long t;        /* updates applied so far */
    int exact;     /* adam: IEEE sqrt and division instead of the fast estimates
                      (set from DOWNPOUR_EXACT_ADAM=1 by dp_optim_init) */
} dp_optim;

/* Keras defaults for a kind: sgd lr 0.01; momentum/nesterov lr 0.01 mu 0.9;
 * adagrad lr 0.001 acc 0.1 eps 1e-7; adam lr 0.001 b 0.9/0.999 eps 1e-7;
 * adamw as adam with PyTorch's weight decay 0.01.  The others: no decay. */
dp_optim_config dp_optim_defaults(dp_optim_kind kind);
/* "sgd", "momentum", "nesterov", "adagrad", "adam", "adamw"; -1 with a message if unknown. */
int dp_optim_parse_kind(const char *name, dp_optim_kind *out, dp_err *err);
const char *dp_optim_kind_name(dp_optim_kind kind);
/* Number of state slots (0, 1 or 2) a kind keeps per parameter. */
int dp_optim_slots(dp_optim_kind kind);

/* Checks cfg (finite lr >= 0, momentum in [0,1], betas in [0,1), eps and the
 * initial accumulator >= 0, weight decay finite and >= 0, and for adamw
 * lr * wd < 1) and allocates the zeroed state (adagrad's at the
 * initial accumulator); slot k is at state + k*n. */
int dp_optim_init(dp_optim *o, const dp_optim_config *cfg, size_t n, dp_err *err);
void dp_optim_free(dp_optim *o); /* safe on a zeroed or freed optimiser */
/* One update of all n parameters with learning rate lr (cfg.lr is the
 * configured rate; a schedule passes its own); increments t first (Adam's t
 * starts at 1).
 * On x86 the update runs with denormals flushed to zero (FTZ/DAZ, as
 * TensorFlow does; the caller's MXCSR is restored): a decaying Adam moment
 * would otherwise crawl through denormals at ~7x the cost. */
void dp_optim_apply(dp_optim *o, float *params, const float *grads, float lr);

/* The same update in pieces, for an update fused into backprop
 * (docs/architecture.md, "Fast paths"): dp_optim_begin counts the update
 * (t++) and fixes its rates; then each piece [lo, hi) of [0, n) is updated
 * once, by dp_optim_apply_range on the calling thread or dp_optim_apply_split
 * over the pool.  Every element gets the same arithmetic wherever the pieces
 * fall, so pieces that tile [0, n) give the bits of dp_optim_apply.
 * params and grads are the bases of the whole range, as for dp_optim_apply. */
typedef struct dp_optim_step {
    float lr;    /* this update's learning rate */
    float lr_t;  /* adam's bias-corrected rate */
    float l2;    /* g += l2 p first (0: none; adamw: 0) */
    float decay; /* adamw: p *= decay first, 1 - lr wd rounded as written (1: none) */
} dp_optim_step;
dp_optim_step dp_optim_begin(dp_optim *o, float lr);
void dp_optim_apply_range(const dp_optim *o, const dp_optim_step *st, float *params,
                          const float *grads, size_t lo, size_t hi);
void dp_optim_apply_split(const dp_optim *o, const dp_optim_step *st, float *params,
                          const float *grads, size_t lo, size_t hi);

/* A sparse update (docs/strategies.md, "Sparse rows"): after one
 * dp_optim_begin, only the rows named in rows[0..count) of a table of
 * width-float rows (row r at params + r*width, its state at the same place
 * of each slot) are updated, each with the arithmetic of dp_optim_apply;
 * row i's gradient is grads + i*width (indexed 0: the rows' gradients one
 * after another) or grads + rows[i]*width (indexed 1: laid out as the
 * table).  Every other row and its state stay as they are: sgd and adagrad
 * give the dense update's bits on a gradient that is zero outside the
 * rows, and adam becomes lazy Adam (TensorFlow's LazyAdam, PyTorch's
 * SparseAdam: the moments of untouched rows do not decay; t counts every
 * update, as theirs do).  A row past the state is skipped. */
void dp_optim_apply_rows(const dp_optim *o, const dp_optim_step *st, float *params,
                         const float *grads, const uint32_t *rows, size_t count, size_t width,
                         int indexed);

/* 1 if Adam updates here run the IEEE twin (DOWNPOUR_EXACT_ADAM=1, or an x86
 * CPU without FMA), 0 if the fast arithmetic: a device update follows the
 * host's choice, so both give the same bits. */
int dp_optim_adam_exact(const dp_optim *o);

/* For tests and benchmarks: the fast Adam of the given instruction-set level
 * (downpour/isa.h), or the widest below it that the CPU has; returns the
 * level now used.  Every level gives the same bits.  Not thread-safe: call it
 * while no update runs. */
dp_isa dp_optim_force_isa(dp_isa level);

#endif
