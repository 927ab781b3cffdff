/* The slice math of model parallelism (src/exec/mp_slice.c; the strategy,
 * src/strategy/model_parallel.c, drives the executor): which output units
 * of each dense layer task j of K holds, where they sit in the
 * task's compact buffer and in the model's flat one, and the products on a
 * slice.  A dense layer (out, in) gives task j the units [lo, hi) with
 * lo = out*j/K (balanced): the rows [lo, hi) of W, contiguous in the flat
 * buffer at w_off + lo*in, and the entries [lo, hi) of b.  The compact buffer
 * holds, layer after layer, those rows then those biases: about 1/K of the
 * parameters, and the optimiser runs over it as over any range.  The
 * products on a slice are the dense kind's (layer_kind.h, UNITS).
 *
 * Image models (docs/architecture.md, "Model parallelism") split their image
 * layers, those before the first dense layer, spatially.  Each runs in one
 * of two modes, its kind's rule in the layer table (layer_kind.h): ROWS
 * (conv, local, relu, maxpool, avgpool), where task j
 * computes the output rows [y0, y1) = mp_units(oh, K, j) of every sample
 * from the input rows [iy0, iy1) its windows cover, its own band of the
 * layer below and halo rows of its neighbours'; or FULL (lcn, whose divisor
 * is a mean over the whole map, flatten, hwc), where every task computes the
 * whole layer.  A local layer's weights and biases of the band's positions
 * are one contiguous range each of the flat buffer: task j holds those.  A
 * conv layer's weights are shared by every position: task j holds the
 * output channels [lo, hi) = mp_units(oc, K, j) of them (rows of the (oc,
 * kh, kw, c) weights and entries of the bias), and the replica all-gathers
 * the full filters each step and reduce-scatters their gradients.  So the
 * compact buffers hold every parameter exactly once, image layers first. */
#ifndef DOWNPOUR_EXEC_MP_SLICE_H
#define DOWNPOUR_EXEC_MP_SLICE_H

#include <stddef.h>

#include "downpour/model.h"
#include "downpour/status.h"

typedef struct mp_layer {
    int in, out;     /* the dense layer's widths */
    int lo, hi;      /* this task's output units */
    size_t w_full, b_full; /* its rows and biases in the model's flat buffer */
    size_t w_off, b_off;   /* and in the compact buffer */
} mp_layer;

/* Image layer i (the model's layer i, before the first dense). */
typedef struct mp_img {
    int rows;              /* 1: ROWS (split by output rows), 0: FULL (every task, whole) */
    int y0, y1;            /* ROWS: this task's output rows */
    int iy0, iy1;          /* ROWS: the input rows its windows read */
    int lo, hi;            /* conv: the output channels whose filters this task holds */
    size_t w_full, b_full; /* conv, local: its parameters in the model's flat buffer */
    size_t w_len, b_len;   /* floats of each it holds */
    size_t w_off, b_off;   /* and where they are in the compact buffer */
} mp_img;

typedef struct mp_plan {
    int n_img;                    /* image layers: the model's layers before the first dense */
    mp_img img[DP_MAX_LAYERS];
    int n;                        /* dense layers */
    mp_layer layer[DP_MAX_DENSE];
    size_t floats;                /* the compact buffer's size */
    int max_width;                /* the widest layer input or output */
    int max_units;                /* the most units any task holds in a layer */
} mp_plan;

/* Task j of K's units of a layer of `out` units. */
void mp_units(int out, int K, int j, int *lo, int *hi);

/* Whether every layer of m has a model-parallel rule (layer_kind.h): -1
 * with a message naming the first layer whose rule is DP_MP_REFUSE and its
 * mp_reason, flagged "--model-parallel K" (K <= 0: the number of tasks is
 * not known yet, "--strategy model-parallel").  K plays no part in the
 * answer; mp_plan_make checks this first. */
int mp_check_layers(const dp_model *m, int K, dp_err *err);

/* The plan of task j of K for model m: -1 with a message naming
 * --model-parallel and the layer when m is not (image layers, then) a stack
 * of dense layers each followed by a relu (the last by the loss), a dense
 * layer has fewer than K units, a ROWS layer fewer than K output rows, or
 * an image layer cannot be split (dropout). */
int mp_plan_make(mp_plan *p, const dp_model *m, int K, int j, dp_err *err);

/* compact <- the task's slices of full (n_params floats, the model's layout). */
void mp_gather(float *compact, const float *full, const mp_plan *p);
/* full <- the task's slices from compact; the rest of full is left alone. */
void mp_scatter(float *full, const float *compact, const mp_plan *p);

/* Slice order, for parameter servers (ps_family.c): the K tasks' compact
 * buffers one after the other (task 0's, then task 1's, ...), so that each
 * task's slices are one contiguous range of a vector of n_params floats.
 * mp_order_offset is where task j's range starts; v <- full (the model's
 * layout) in slice order, and back. */
size_t mp_order_offset(const mp_plan *plans, int j);
void mp_order_gather(float *v, const float *full, const mp_plan *plans, int K);
void mp_order_scatter(float *full, const float *v, const mp_plan *plans, int K);

/* Copies the block [:, lo:hi) of a (rows, width) matrix into dst (rows, hi-lo),
 * and back. */
void mp_pack(float *dst, const float *src, int rows, int width, int lo, int hi);
void mp_unpack(float *dst, const float *src, int rows, int width, int lo, int hi);

#endif
