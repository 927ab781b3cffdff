/* The device's element-wise kernels: one body each, shared by every backend
 * (docs/gpu.md, "Kernels").  A kernel is a count of work items and a body
 * that does item i; the CUDA plugin runs a body as a grid-stride loop of
 * threads, sim as a loop on the host (in the order DOWNPOUR_SIM_ORDER says:
 * docs/gpu.md, "Kernels").  So the arithmetic that tests check through sim
 * is the arithmetic the GPU runs.
 *
 * Rules for a body: C and C++ alike (nvcc compiles it as C++); it touches
 * only its item's outputs, except through DP_ATOMIC_ADD (tallies), and reads
 * no other item's output of the same launch (tests/test_sim_order.c); floats
 * with the same formula as the CPU kernel it mirrors (layers.h, optim.h),
 * so the two agree to rounding.  Values that change from one step to the
 * next (the learning rate, the batch's record indices, dropout's keys) are
 * read from the device's step block, never passed by value, so a captured
 * graph replays them fresh (backend.h, "Graphs").
 *
 * Adding a kernel: its argument struct, a member in dp_kernel's union, a
 * body dp_k_<name>(const dp_kernel *, long), and a line in DP_KERNELS. */
#ifndef DP_DEVICE_KERNELS_H
#define DP_DEVICE_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define DP_HD static inline __device__
#define DP_ATOMIC_ADD(p, v) atomicAdd((p), (v))
#else
#define DP_HD static inline
#define DP_ATOMIC_ADD(p, v) (*(p) += (v))
#endif

#ifdef __CUDACC__
#define DP_ADAM_FN DP_HD
#endif
#include "nn/adam_fast.h"

/* ---- image layers (1/2): kernel list and arguments (src/nn/layer_*.c) ----
 * Images are NHWC as layers.h stores them; g is the layer's dp_window.  Each
 * body mirrors its CPU kernel's float operations in the same order, so the
 * two agree bit for bit (the lowering, pools and layout changes) or, where a
 * product comes between, to the product's rounding. */
#define DP_KERNELS_IMAGE(X)                                                                      \
    X(IM2ROW, im2row)                                                                            \
    X(ROW2IM, row2im)                                                                            \
    X(MAXPOOL_FWD, maxpool_fwd)                                                                  \
    X(MAXPOOL_BWD, maxpool_bwd)                                                                  \
    X(AVGPOOL_FWD, avgpool_fwd)                                                                  \
    X(AVGPOOL_BWD, avgpool_bwd)                                                                  \
    X(LAYOUT, layout)

typedef struct dp_kwin { /* dp_window's fields */
    int c, h, w, kh, kw, stride, pad, oh, ow;
} dp_kwin;
typedef struct dp_ka_window { /* every windowed kernel; items as each body says */
    float *dst;        /* im2row: rows; pool forward: out; row2im, pool backward: din */
    const float *src;  /* im2row, pool forward, maxpool backward: the input image */
    const float *grad; /* row2im: drows; pool backward: the output's gradient */
    const float *fout; /* maxpool backward: the forward's output */
    dp_kwin g;
} dp_ka_window;
typedef struct dp_ka_layout { /* items batch*c*hw: per sample (hw, c) <-> (c, hw) */
    float *out;               /* may not alias in */
    const float *in;
    int c, hw;
    int to_chw; /* 1: HWC -> CHW (flatten forward, hwc backward); 0: the reverse */
} dp_ka_layout;
/* ---- end of image layers (1/2) ---- */

/* ---- lcn (1/2): kernel list and arguments (src/nn/layer_lcn.c) ----
 * Local contrast normalisation as lcn.c computes it, per sample of N = h*w
 * pixels of c channels: one kernel per pass of lcn.c's forward_sample and
 * backward_sample, each item repeating lcn.c's float operations for its
 * pixel in lcn.c's order, so the two agree bit for bit.  The two sums over
 * a whole map (the mean of s, and gM) are one item per sample, in double
 * in pixel order as lcn.c sums them. */
#define DP_KERNELS_LCN(X)                                                                        \
    X(LCN_SUM, lcn_sum)                                                                          \
    X(LCN_BLUR_H, lcn_blur_h)                                                                    \
    X(LCN_BLUR_V, lcn_blur_v)                                                                    \
    X(LCN_CENTER, lcn_center)                                                                    \
    X(LCN_MEAN, lcn_mean)                                                                        \
    X(LCN_DIV, lcn_div)                                                                          \
    X(LCN_GD, lcn_gd)                                                                            \
    X(LCN_GM, lcn_gm)                                                                            \
    X(LCN_GS, lcn_gs)                                                                            \
    X(LCN_GV, lcn_gv)                                                                            \
    X(LCN_ADD, lcn_add)

typedef struct dp_ka_lcn { /* every lcn kernel; items as each body says */
    float *out;            /* forward: the layer's output; backward: din */
    const float *in;       /* forward: its input x; backward: dout */
    /* the layer's keep on the device, per sample r: v + r*N*c (x - m, (N, c)),
     * s, a, b + r*N (maps), mean[r] and gm[r] (gM / N) */
    float *v, *s, *a, *b, *mean, *gm;
    const float *u; /* the n Gaussian taps (dp_lcn_taps) */
    int c, h, w, n;
    float eps; /* DP_LCN_EPS */
} dp_ka_lcn;
/* ---- end of lcn (1/2) ---- */

/* ---- batch norm (1/2): kernel list and arguments (src/nn/layer_batchnorm.c) ----
 * R rows of C channels (R = batch*h*w; channel ch of row r at r*C + ch).
 * Each body repeats layer_batchnorm.c's operations in its order, so the
 * device gives the CPU's bits.  A per-channel sum runs in double over
 * blocks of DP_BN_ROWS rows, each block's rows in order, and then over the
 * blocks in order: on a GPU one thread per (block, channel), so the rows of
 * a 16-channel layer are not summed by 16 threads alone (an H200 trained
 * resnet-fashion at 754 samples/s that way), and on the CPU the same
 * additions in the same order. */
#define DP_BN_ROWS 64
#define DP_KERNELS_BN(X)                                                                         \
    X(BN_PART, bn_part)                                                                          \
    X(BN_MEAN, bn_mean)                                                                          \
    X(BN_STATS, bn_stats)                                                                        \
    X(BN_NORM, bn_norm)                                                                          \
    X(BN_GRAD, bn_grad)                                                                          \
    X(BN_DIN, bn_din)

/* bn_part's passes */
enum { DP_BN_SUM, DP_BN_SQUARES, DP_BN_GRADS };

typedef struct dp_ka_bn { /* every bn kernel; items as each body says */
    const float *x, *dy;  /* the input; backward: the gradient at the output */
    float *y, *dx;        /* the output; backward: the gradient at the input */
    const float *w, *b;   /* gamma, beta */
    float *gw, *gb;       /* their gradients */
    float *mean, *inv, *var; /* the keep: the batch's mean, 1/std, biased variance */
    float *rm, *rv, *nbt;    /* the buffers: running mean, variance, batch count */
    /* the keep's doubles: the blocks' partial sums (2 P C: P blocks of C,
     * then a second set for the gradients), then the mean (C) */
    double *part;
    long R;
    int C;
    int pass; /* bn_part: DP_BN_SUM, DP_BN_SQUARES or DP_BN_GRADS */
    float momentum;
    double eps;
} dp_ka_bn;

/* Blocks of DP_BN_ROWS rows in R rows. */
DP_HD long dp_bn_blocks(long R) { return (R + DP_BN_ROWS - 1) / DP_BN_ROWS; }
/* ---- end of batch norm (1/2) ---- */

/* ---- element-wise activations (1/2): formulas, kernel list and arguments
 * (src/nn/layer_activations.c) ----
 * One formula per activation and direction, called by the CPU's loop and by
 * the kernel body alike, so the device gives the CPU's bits.  The backward
 * formulas take the gradient at the output, the input and the output. */
DP_HD float dp_k_tanh_f(float x) { return tanhf(x); }
DP_HD float dp_k_tanh_g(float dy, float x, float y) { (void)x; return dy * (1.0f - y * y); }
DP_HD float dp_k_sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
DP_HD float dp_k_sigmoid_g(float dy, float x, float y) { (void)x; return dy * (y * (1.0f - y)); }
/* gelu: torch.nn.GELU()'s exact form, x Phi(x) = x/2 (1 + erf(x / sqrt 2)).
 * Phi and phi are computed here, not by erff and expf, so the CPU's loops
 * vectorise (a libm call per element took about a quarter of vit-mnist's
 * step; layer_activations.c is built with -fno-trapping-math so the
 * selects below become vector blends) and a GPU gives the same bits. */
#define DP_K_RSQRT2 0.70710678118654752f
#define DP_K_RSQRT2PI 0.39894228040143268f

/* e^x within 3e-7 relative for x in [-87, 88], clamped outside (NaN reads
 * as -87: the callers multiply by x, which keeps it NaN): 2^n e^r with
 * r = x - n ln2 in [-ln2/2, ln2/2] (ln2 in two parts, Cody and Waite), e^r
 * by its Taylor polynomial to r^6, 2^n written into the exponent. */
DP_HD float dp_k_exp(float x)
{
    x = x > -87.0f ? x : -87.0f;
    x = x < 88.0f ? x : 88.0f;
    float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f; /* rounded: 1.5 * 2^23 */
    float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.16666667f + r * (0.041666668f +
                                                      r * (0.008333334f + r * 0.0013888889f)))));
    int32_t bits = ((int32_t)n + 127) * (1 << 23);
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* 2 Phi(x) = 1 + erf(x / sqrt 2), from erfc(|z|) (Numerical Recipes'
 * Chebyshev fit, 1.2e-7 relative): within 5e-7 relative for |x| < 1, 2e-6
 * to 3 and 1e-5 to 9, where 1 + erff cancels to nothing below x = -5. */
DP_HD float dp_k_two_phi(float x)
{
    float z = fabsf(x) * DP_K_RSQRT2;
    float t = 1.0f / (1.0f + 0.5f * z);
    float poly = -1.26551223f +
                 t * (1.00002368f +
                      t * (0.37409196f +
                           t * (0.09678418f +
                                t * (-0.18628806f +
                                     t * (0.27886807f +
                                          t * (-1.13520398f +
                                               t * (1.48851587f +
                                                    t * (-0.82215223f + t * 0.17087277f))))))));
    float erfc = t * dp_k_exp(poly - z * z);
    float upper = 2.0f - erfc; /* both sides computed: a select, not a branch */
    return x >= 0.0f ? upper : erfc;
}

DP_HD float dp_k_gelu_f(float x) { return 0.5f * x * dp_k_two_phi(x); }
DP_HD float dp_k_gelu_g(float dy, float x, float y)
{
    (void)y; /* Phi(x) + x phi(x) */
    float cdf = 0.5f * dp_k_two_phi(x);
    return dy * (cdf + x * (DP_K_RSQRT2PI * dp_k_exp(-0.5f * x * x)));
}

#define DP_KERNELS_ACT(X)                                                                        \
    X(TANH_FWD, tanh_fwd)                                                                        \
    X(TANH_BWD, tanh_bwd)                                                                        \
    X(SIGMOID_FWD, sigmoid_fwd)                                                                  \
    X(SIGMOID_BWD, sigmoid_bwd)                                                                  \
    X(GELU_FWD, gelu_fwd)                                                                        \
    X(GELU_BWD, gelu_bwd)

typedef struct dp_ka_act { /* items n: forward out = f(in); backward out = g(dout, in, y) */
    float *out;            /* forward: the output; backward: din (neither aliases another) */
    const float *in;       /* the layer's input */
    const float *dout;     /* backward: the gradient at the output */
    const float *y;        /* backward: the forward's output */
} dp_ka_act;
/* ---- end of element-wise activations (1/2) ---- */

/* ---- gap (1/2): kernel list and arguments (src/nn/layer_gap.c) ----
 * The CPU's loop calls these bodies itself, so the two give the same bits. */
#define DP_KERNELS_GAP(X)                                                                        \
    X(GAP_FWD, gap_fwd)                                                                          \
    X(GAP_BWD, gap_bwd)

typedef struct dp_ka_gap { /* NHWC images of hw pixels of c channels; out (batch, c) */
    float *dst;            /* forward: the means; backward: din */
    const float *src;      /* forward: the image; backward: the means' gradient */
    long c, hw;
} dp_ka_gap;
/* ---- end of gap (1/2) ---- */

/* ---- layer norm (1/2): kernel list and arguments (src/nn/layer_ln.c) ----
 * R records of F features.  The CPU's passes (layer_ln.c) make the same
 * additions in the same order, so the two give the same bits; every sum is
 * in double: a record's over its features in DP_LN_LANES interleaved
 * partial sums (feature f into sum f mod 8, each in feature order, then
 * the eight in dp_k_sum8's fixed tree, so the CPU's vector lanes take a
 * row eight features at a time), a feature's over the records in order. */
#define DP_LN_LANES 8
#define DP_KERNELS_LN(X)                                                                         \
    X(LN_STATS, ln_stats)                                                                        \
    X(LN_NORM, ln_norm)                                                                          \
    X(LN_GRAD, ln_grad)                                                                          \
    X(LN_DIN, ln_din)

typedef struct dp_ka_ln { /* every ln kernel; items as each body says */
    const float *x, *dy;  /* the input; backward: the gradient at the output */
    float *y, *dx;        /* the output; backward: the gradient at the input */
    const float *w, *b;   /* weight, bias (F each) */
    float *gw, *gb;       /* their gradients */
    float *mean, *inv;    /* the keep: each record's mean and 1/std (R each) */
    long R;
    int F;
    double eps;
} dp_ka_ln;
/* ---- end of layer norm (1/2) ---- */

/* ---- tokens (1/2): kernel list and arguments (src/nn/layer_pos.c,
 * layer_emb.c, layer_mha.c) ----
 * The CPU's loops call these bodies themselves, so the two give the same
 * bits; each sum is in double in record (or id) order. */
#define DP_KERNELS_TOK(X)                                                                        \
    X(POS_FWD, pos_fwd)                                                                          \
    X(POS_GRAD, pos_grad)                                                                        \
    X(EMB_IDS, emb_ids)                                                                          \
    X(EMB_FWD, emb_fwd)                                                                          \
    X(EMB_GRAD, emb_grad)                                                                        \
    X(MHA_SOFTMAX, mha_softmax)                                                                  \
    X(MHA_SOFTMAX_BWD, mha_softmax_bwd)

typedef struct dp_ka_tok { /* items as each body says */
    float *dst;       /* pos: out, or P's gradient; emb: out, or the table's gradient */
    const float *src; /* in (emb: the ids), or the gradient at the output */
    const float *p;   /* pos: P (F); emb: the table (N, F) */
    float *ids;       /* emb: the ids used (R), then the count of changed ones */
    long R, F, N;     /* pos: records, T*D; emb: ids, width, table rows */
} dp_ka_tok;
typedef struct dp_ka_attn { /* items: rows of T attention scores */
    float *s;               /* forward: the scores, then P; backward: dP, then dS */
    const float *p;         /* backward: P */
    long T;
    float scale;            /* 1/sqrt(the head's width) */
} dp_ka_attn;
/* ---- end of tokens (1/2) ---- */

/* ---- residual blocks (1/2): kernel list and arguments (src/nn/layer_res.c) ----
 * The block's sum, and in the backward the shortcut's gradient added to the
 * main branch's at the block's input; the CPU adds the same floats. */
#define DP_KERNELS_RES(X) X(RES_ADD, res_add)

typedef struct dp_ka_res { /* items n: out = a + b (out may be a) */
    float *out;
    const float *a, *b;
} dp_ka_res;
/* ---- end of residual blocks (1/2) ---- */

/* Every kernel: X(ID, name).  The ids are DP_K_<ID>; the bodies dp_k_<name>. */
#define DP_KERNELS(X)                                                                            \
    DP_KERNELS_IMAGE(X)                                                                          \
    DP_KERNELS_LCN(X)                                                                            \
    DP_KERNELS_BN(X)                                                                             \
    DP_KERNELS_ACT(X)                                                                            \
    DP_KERNELS_GAP(X)                                                                            \
    DP_KERNELS_LN(X)                                                                             \
    DP_KERNELS_RES(X)                                                                            \
    X(GATHER, gather)                                                                            \
    X(GATHER_F32, gather_f32)                                                                    \
    X(FILL, fill)                                                                                \
    X(SCALE, scale)                                                                              \
    X(BIAS_ACT, bias_act)                                                                        \
    X(RELU, relu)                                                                                \
    X(RELU_BWD, relu_bwd)                                                                        \
    X(XENT_FWD, xent_fwd)                                                                        \
    X(XENT_BWD, xent_bwd)                                                                        \
    X(DROPOUT, dropout)                                                                          \
    X(SGD, sgd)                                                                                  \
    X(MOMENTUM, momentum)                                                                        \
    X(NESTEROV, nesterov)                                                                        \
    X(ADAGRAD, adagrad)                                                                          \
    X(ADAM, adam)                                                                                \
    X(EMA, ema)                                                                                  \
    DP_KERNELS_TOK(X)

typedef enum dp_kernel_id {
#define DP_K_ENUM(ID, name) DP_K_##ID,
    DP_KERNELS(DP_K_ENUM)
#undef DP_K_ENUM
    DP_K_COUNT
} dp_kernel_id;

/* The step block: one per step in device memory, written by one H2D copy
 * before the step's kernels (dmodel.c, "The step block").  The step's
 * dropout keys (one uint64_t per dropout layer) follow it, then the batch's
 * record indices. */
typedef struct dp_step_block {
    float lr;    /* this update's learning rate */
    float lr_t;  /* adam: lr sqrt(1 - b2^t) / (1 - b1^t) */
    float scale; /* gradients are multiplied by this before the update */
    uint32_t n;  /* records in the batch */
} dp_step_block;

/* ---- arguments, one struct per kernel ---- */
typedef struct dp_ka_gather {  /* items rows*dim; GATHER and GATHER_F32 */
    float *x;                  /* (rows, dim) pixels / 255, or the values as they are */
    uint8_t *y;                /* (rows) labels */
    const uint8_t *images;     /* GATHER: the split's (n, dim) bytes */
    const float *values;       /* GATHER_F32: the split's (n, dim) floats */
    const uint8_t *labels;
    const uint32_t *idx;       /* (rows) record indices, in the step block */
    long dim;
    double *tally;             /* or NULL: item 0 opens the step's tally (dp_tally_open) */
} dp_ka_gather;
typedef struct dp_ka_fill { float *p; float value; } dp_ka_fill;     /* items n */
typedef struct dp_ka_scale { float *p; float s; } dp_ka_scale;       /* items n: p *= s */
typedef struct dp_ka_bias_act { /* items rows*cols: out = act(out + b[col]) */
    float *out;
    const float *b;
    long cols;
    int relu;
} dp_ka_bias_act;
typedef struct dp_ka_relu { float *out; const float *in; } dp_ka_relu; /* may alias */
typedef struct dp_ka_relu_bwd { /* din = dout where the relu's output is > 0 */
    float *din;                 /* may alias dout */
    const float *dout;
    const float *out;
} dp_ka_relu_bwd;
typedef struct dp_ka_xent_fwd { /* items rows */
    float *probs;               /* (rows, classes); may alias logits */
    const float *logits;
    const uint8_t *y;           /* NULL: probabilities only */
    double *tally;              /* [0] += each row's loss, [1] += each correct row */
    long classes;
} dp_ka_xent_fwd;

/* The device's tally is four doubles: [0] and [1] the loss and correct rows
 * of the step that ran last, [2] and [3] those of the steps before it.  The
 * next step's gather adds the last step's into the rest before its forward
 * tallies anew, so a step that failed before its update (a sum that broke)
 * can be taken back by zeroing [0] and [1] alone (dp_dmodel_restage), and its
 * retry is counted once. */
enum { DP_TALLY_STEP = 0, DP_TALLY_BEFORE = 2, DP_TALLY_DOUBLES = 4 };
DP_HD void dp_tally_open(double *t)
{
    t[DP_TALLY_BEFORE] += t[DP_TALLY_STEP];
    t[DP_TALLY_BEFORE + 1] += t[DP_TALLY_STEP + 1];
    t[DP_TALLY_STEP] = t[DP_TALLY_STEP + 1] = 0.0;
}
typedef struct dp_ka_xent_bwd { /* items rows*classes: (probs - onehot) / rows */
    float *dlogits;             /* may alias probs */
    const float *probs;
    const uint8_t *y;
    long classes;
    float inv_rows;
} dp_ka_xent_bwd;
typedef struct dp_ka_dropout { /* items n: layers.h's dropout, bit for bit */
    float *out;                /* may alias in */
    const float *in;
    const uint64_t *key;       /* dropout.c's key: the step's, in the step block */
    uint64_t threshold;
    float scale;
} dp_ka_dropout;
typedef struct dp_ka_optim {   /* items n: one optimiser's update, optim.h's formulas */
    float *p;
    const float *g;
    float *s0, *s1;            /* state slots (velocity, accumulator, or m and v) */
    const dp_step_block *step; /* lr, lr_t, scale */
    float mu, b1, b2, eps;
    int exact;                 /* adam: IEEE sqrt and division (dp_optim_adam_exact) */
    float wd;                  /* weight decay: L2 on g, or adamw's when decoupled (0: none) */
    int decoupled;             /* adamw: p *= 1 - lr wd before the update */
} dp_ka_optim;

/* optim.h's weight decay, as dp_optim_begin fixes it: g + wd p for every
 * kind but adamw, whose decay 1 - lr wd is rounded here as there. */
DP_HD float dp_k_l2(const dp_ka_optim *a, float g, long i)
{
    return a->wd != 0.0f && !a->decoupled ? g + a->wd * a->p[i] : g;
}
DP_HD float dp_k_decay(const dp_ka_optim *a)
{
    return a->decoupled ? 1.0f - a->step->lr * a->wd : 1.0f;
}

typedef struct dp_ka_ema { /* items n: --ema's average, a = decay a + rest p (loop.c's) */
    float *a;
    const float *p;
    float decay, rest; /* rest = 1 - decay, rounded once as the loop rounds it */
} dp_ka_ema;

typedef struct dp_kernel {
    dp_kernel_id id;
    long items;
    union {
        dp_ka_gather gather;
        dp_ka_fill fill;
        dp_ka_scale scale;
        dp_ka_bias_act bias_act;
        dp_ka_relu relu;
        dp_ka_relu_bwd relu_bwd;
        dp_ka_xent_fwd xent_fwd;
        dp_ka_xent_bwd xent_bwd;
        dp_ka_dropout dropout;
        dp_ka_optim optim;
        dp_ka_ema ema;
        dp_ka_window window; /* image layers */
        dp_ka_layout layout;
        dp_ka_lcn lcn;
        dp_ka_bn bn;
        dp_ka_act act; /* element-wise activations */
        dp_ka_gap gap;
        dp_ka_ln ln;
        dp_ka_tok tok;
        dp_ka_attn attn;
        dp_ka_res res;
    } u;
} dp_kernel;

/* ---- bodies ---- */

DP_HD void dp_k_gather(const dp_kernel *k, long i)
{
    const dp_ka_gather *a = &k->u.gather;
    long r = i / a->dim, j = i - r * a->dim;
    long rec = (long)a->idx[r];
    /* the correctly rounded x / 255, as dp_split_gather gives */
    a->x[i] = (float)a->images[rec * a->dim + j] / 255.0f;
    if (i == 0 && a->tally)
        dp_tally_open(a->tally);
    if (j == 0)
        a->y[r] = a->labels[rec];
}

/* A split of float records (dp_split.values): copied as they are. */
DP_HD void dp_k_gather_f32(const dp_kernel *k, long i)
{
    const dp_ka_gather *a = &k->u.gather;
    long r = i / a->dim, j = i - r * a->dim;
    long rec = (long)a->idx[r];
    a->x[i] = a->values[rec * a->dim + j];
    if (i == 0 && a->tally)
        dp_tally_open(a->tally);
    if (j == 0)
        a->y[r] = a->labels[rec];
}

DP_HD void dp_k_fill(const dp_kernel *k, long i) { k->u.fill.p[i] = k->u.fill.value; }

DP_HD void dp_k_scale(const dp_kernel *k, long i) { k->u.scale.p[i] *= k->u.scale.s; }

DP_HD void dp_k_bias_act(const dp_kernel *k, long i)
{
    const dp_ka_bias_act *a = &k->u.bias_act;
    float v = a->out[i] + a->b[i % a->cols];
    /* layers.c's test: a NaN passes on (a diverged step shows in the loss) */
    a->out[i] = a->relu && v < 0.0f ? 0.0f : v;
}

DP_HD void dp_k_relu(const dp_kernel *k, long i)
{
    float v = k->u.relu.in[i];
    k->u.relu.out[i] = v < 0.0f ? 0.0f : v; /* as dp_relu_forward: NaN and -0 pass */
}

DP_HD void dp_k_relu_bwd(const dp_kernel *k, long i)
{
    const dp_ka_relu_bwd *a = &k->u.relu_bwd;
    a->din[i] = a->out[i] > 0.0f ? a->dout[i] : 0.0f;
}

/* One row: layers.c's dp_softmax_xent_forward (first maximum wins ties). */
DP_HD void dp_k_xent_fwd(const dp_kernel *k, long r)
{
    const dp_ka_xent_fwd *a = &k->u.xent_fwd;
    const float *z = a->logits + r * a->classes;
    float *p = a->probs + r * a->classes;
    long arg = 0;
    float zmax = z[0];
    for (long j = 1; j < a->classes; j++)
        if (z[j] > zmax) {
            zmax = z[j];
            arg = j;
        }
    int y = a->y ? a->y[r] : 0;
    float zy = a->y ? z[y] - zmax : 0.0f;
    float sum = 0.0f;
    for (long j = 0; j < a->classes; j++) {
        float e = expf(z[j] - zmax);
        p[j] = e;
        sum += e;
    }
    float inv = 1.0f / sum;
    for (long j = 0; j < a->classes; j++)
        p[j] *= inv;
    if (a->y) {
        DP_ATOMIC_ADD(&a->tally[0], (double)logf(sum) - (double)zy);
        DP_ATOMIC_ADD(&a->tally[1], (double)(arg == y));
    }
}

DP_HD void dp_k_xent_bwd(const dp_kernel *k, long i)
{
    const dp_ka_xent_bwd *a = &k->u.xent_bwd;
    long r = i / a->classes, j = i - r * a->classes;
    float hot = j == (long)a->y[r] ? 1.0f : 0.0f;
    a->dlogits[i] = (a->probs[i] - hot) * a->inv_rows;
}

/* splitmix64's finaliser, as dropout.c draws its masks */
DP_HD uint64_t dp_k_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

DP_HD void dp_k_dropout(const dp_kernel *k, long i)
{
    const dp_ka_dropout *a = &k->u.dropout;
    uint64_t h = dp_k_mix64(*a->key ^ (uint64_t)(i >> 1) * 0x9e3779b97f4a7c15ULL);
    uint32_t u = (i & 1) ? (uint32_t)(h >> 32) : (uint32_t)h;
    float x = a->in[i];
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    bits &= (uint32_t)0 - (uint32_t)(u >= a->threshold);
    memcpy(&x, &bits, sizeof x);
    a->out[i] = x * a->scale;
}

DP_HD void dp_k_sgd(const dp_kernel *k, long i)
{
    const dp_ka_optim *a = &k->u.optim;
    a->p[i] -= a->step->lr * dp_k_l2(a, a->g[i] * a->step->scale, i);
}

DP_HD void dp_k_momentum(const dp_kernel *k, long i)
{
    const dp_ka_optim *a = &k->u.optim;
    float g = dp_k_l2(a, a->g[i] * a->step->scale, i);
    float v = a->mu * a->s0[i] - a->step->lr * g;
    a->s0[i] = v;
    a->p[i] += v;
}

DP_HD void dp_k_nesterov(const dp_kernel *k, long i)
{
    const dp_ka_optim *a = &k->u.optim;
    float g = dp_k_l2(a, a->g[i] * a->step->scale, i);
    float v = a->mu * a->s0[i] - a->step->lr * g;
    a->s0[i] = v;
    a->p[i] += a->mu * v - a->step->lr * g;
}

DP_HD void dp_k_adagrad(const dp_kernel *k, long i)
{
    const dp_ka_optim *a = &k->u.optim;
    float g = dp_k_l2(a, a->g[i] * a->step->scale, i);
    float acc = a->s0[i] + g * g;
    a->s0[i] = acc;
    a->p[i] -= a->step->lr * g / (sqrtf(acc) + a->eps);
}

/* Adam: the IEEE twin, or the host's fast arithmetic (nn/adam_fast.h), so a
 * device update gives the host's bits either way. */
DP_HD void dp_k_adam(const dp_kernel *k, long i)
{
    const dp_ka_optim *a = &k->u.optim;
    float g = dp_k_l2(a, a->g[i] * a->step->scale, i), decay = dp_k_decay(a);
    if (a->exact) {
        float m = a->b1 * a->s0[i] + (1.0f - a->b1) * g;
        float v = a->b2 * a->s1[i] + (1.0f - a->b2) * g * g;
        a->s0[i] = m;
        a->s1[i] = v;
        float p = decay != 1.0f ? a->p[i] * decay : a->p[i];
        a->p[i] = p - a->step->lr_t * m / (sqrtf(v) + a->eps);
        return;
    }
    dp_adam_fast_element(a->p + i, a->s0 + i, a->s1 + i, g, a->step->lr_t, a->b1, 1.0f - a->b1,
                         a->b2, 1.0f - a->b2, a->eps, 0.0f, decay);
}

DP_HD void dp_k_ema(const dp_kernel *k, long i)
{
    const dp_ka_ema *a = &k->u.ema;
    a->a[i] = a->decay * a->a[i] + a->rest * a->p[i];
}

/* ---- image layers (2/2): bodies (the CPU kernels are in window.c, pool2d.c) ----
 * Only the sample index needs a long: a sample's features fit an int
 * (model_spec.c's MAX_FEATURES), as does a window's kh*kw*c (an int in
 * model.c too), and 64-bit division is emulated on a GPU. */

/* Item i of the lowering rows (n*oh*ow, kh*kw*c): row (r, oy, ox), element
 * (ky, kx, ch); zero where the window hangs over the padding.  Items n*oh*ow*kh*kw*c. */
DP_HD void dp_k_im2row(const dp_kernel *k, long i)
{
    const dp_ka_window *a = &k->u.window;
    const dp_kwin *g = &a->g;
    int run = g->kw * g->c, kk = g->kh * run, pos = g->oh * g->ow;
    long row = i / kk, r = row / pos;
    int e = (int)(i - row * kk), q = (int)(row - r * pos);
    int ky = e / run, kx = e % run / g->c, ch = e % g->c;
    int iy = q / g->ow * g->stride - g->pad + ky, ix = q % g->ow * g->stride - g->pad + kx;
    float v = 0.0f;
    if (iy >= 0 && iy < g->h && ix >= 0 && ix < g->w)
        v = a->src[((r * g->h + iy) * g->w + ix) * g->c + ch];
    a->dst[i] = v;
}

/* Item i = input float (r, iy, ix, ch) of an (n, h, w, c) image: r, and the
 * rest through *iy, *ix, *ch. */
DP_HD long dp_k_pixel(const dp_kwin *g, long i, int *iy, int *ix, int *ch)
{
    int per = g->h * g->w * g->c;
    long r = i / per;
    int e = (int)(i - r * per), pix = e / g->c;
    *ch = e % g->c;
    *ix = pix % g->w;
    *iy = pix / g->w;
    return r;
}

/* The adjoint as a gather, item i = input float (r, iy, ix, ch): the sum of
 * every lowered element copied from it, in dp_row2im's order (ky ascending,
 * then ox ascending, i.e. kx descending), so no atomics and the CPU's bits.
 * Items n*h*w*c. */
DP_HD void dp_k_row2im(const dp_kernel *k, long i)
{
    const dp_ka_window *a = &k->u.window;
    const dp_kwin *g = &a->g;
    int iy, ix, ch, run = g->kw * g->c, kk = g->kh * run;
    long r = dp_k_pixel(g, i, &iy, &ix, &ch);
    float s = 0.0f;
    for (int ky = 0; ky < g->kh; ky++) {
        int ty = iy + g->pad - ky; /* oy * stride */
        if (ty < 0 || ty % g->stride || ty / g->stride >= g->oh)
            continue;
        const float *drow =
            a->grad + ((r * g->oh + ty / g->stride) * g->ow * kk + ky * run + ch);
        for (int kx = g->kw - 1; kx >= 0; kx--) {
            int tx = ix + g->pad - kx; /* ox * stride */
            if (tx < 0 || tx % g->stride || tx / g->stride >= g->ow)
                continue;
            s += drow[(long)(tx / g->stride) * kk + kx * g->c];
        }
    }
    a->dst[i] = s;
}

/* The window of output (oy, ox) clipped to the image: ky in [*ky0, *ky1),
 * kx in [*kx0, *kx1), at input (*iy0 + ky, *ix0 + kx). */
DP_HD void dp_k_window_span(const dp_kwin *g, int oy, int ox, int *iy0, int *ix0, int *ky0,
                            int *ky1, int *kx0, int *kx1)
{
    *iy0 = oy * g->stride - g->pad;
    *ix0 = ox * g->stride - g->pad;
    *ky0 = *iy0 < 0 ? -*iy0 : 0;
    *ky1 = g->h - *iy0 < g->kh ? g->h - *iy0 : g->kh;
    *kx0 = *ix0 < 0 ? -*ix0 : 0;
    *kx1 = g->w - *ix0 < g->kw ? g->w - *ix0 : g->kw;
}

/* Item i = output (r, oy, ox, ch), items n*oh*ow*c.  Max: scan order (ky, kx),
 * padding never wins; avg: the window's sum / (kh kw), padding as zeros. */
DP_HD void dp_k_pool_fwd(const dp_kernel *k, long i, int avg)
{
    const dp_ka_window *a = &k->u.window;
    const dp_kwin *g = &a->g;
    int per = g->oh * g->ow * g->c, iy0, ix0, ky0, ky1, kx0, kx1;
    long r = i / per;
    int e = (int)(i - r * per), q = e / g->c, ch = e % g->c;
    dp_k_window_span(g, q / g->ow, q % g->ow, &iy0, &ix0, &ky0, &ky1, &kx0, &kx1);
    const float *img = a->src + (r * g->h * g->w * g->c + ch);
    float m = avg ? 0.0f : -INFINITY;
    for (int ky = ky0; ky < ky1; ky++)
        for (int kx = kx0; kx < kx1; kx++) {
            float v = img[((iy0 + ky) * g->w + ix0 + kx) * g->c];
            if (avg)
                m += v;
            else
                m = v > m ? v : m;
        }
    a->dst[i] = avg ? m * (1.0f / (float)(g->kh * g->kw)) : m;
}

DP_HD void dp_k_maxpool_fwd(const dp_kernel *k, long i) { dp_k_pool_fwd(k, i, 0); }
DP_HD void dp_k_avgpool_fwd(const dp_kernel *k, long i) { dp_k_pool_fwd(k, i, 1); }

/* What dp_maxpool_backward's scan of output (oy, ox)'s window gives the
 * pixel at = iy*w + ix: the gradient `left` goes to the first pixel equal to
 * the maximum o, as (float)hit * left, then left -= that; so ties, and even
 * an infinite gradient, give the CPU's bits.  img is the sample's channel. */
DP_HD float dp_k_max_share(const dp_kwin *g, const float *img, int oy, int ox, float o,
                           float left, int at)
{
    int iy0, ix0, ky0, ky1, kx0, kx1;
    dp_k_window_span(g, oy, ox, &iy0, &ix0, &ky0, &ky1, &kx0, &kx1);
    for (int ky = ky0; ky < ky1; ky++)
        for (int kx = kx0; kx < kx1; kx++) {
            int p = (iy0 + ky) * g->w + ix0 + kx;
            float t = (float)(img[p * g->c] == o) * left;
            if (p == at)
                return t;
            left -= t;
        }
    return 0.0f; /* not reached: the window covers the pixel */
}

/* Item i = input float (r, iy, ix, ch), items n*h*w*c: the sum of its shares
 * in dp_maxpool_backward's order (outputs ascending: oy, then ox). */
DP_HD void dp_k_maxpool_bwd(const dp_kernel *k, long i)
{
    const dp_ka_window *a = &k->u.window;
    const dp_kwin *g = &a->g;
    int iy, ix, ch;
    long r = dp_k_pixel(g, i, &iy, &ix, &ch);
    const float *img = a->src + (r * g->h * g->w * g->c + ch);
    float s = 0.0f;
    for (int ky = g->kh - 1; ky >= 0; ky--) { /* oy ascending */
        int ty = iy + g->pad - ky;
        if (ty < 0 || ty % g->stride || ty / g->stride >= g->oh)
            continue;
        for (int kx = g->kw - 1; kx >= 0; kx--) { /* ox ascending */
            int tx = ix + g->pad - kx;
            if (tx < 0 || tx % g->stride || tx / g->stride >= g->ow)
                continue;
            int oy = ty / g->stride, ox = tx / g->stride;
            long o_at = ((r * g->oh + oy) * g->ow + ox) * g->c + ch;
            s += dp_k_max_share(g, img, oy, ox, a->fout[o_at], a->grad[o_at], iy * g->w + ix);
        }
    }
    a->dst[i] = s;
}

/* Item i = input float (r, iy, ix, ch), items n*h*w*c: the gradients of the
 * windows covering it in dp_avgpool_backward's order (ky, then ox
 * ascending), then / (kh kw). */
DP_HD void dp_k_avgpool_bwd(const dp_kernel *k, long i)
{
    const dp_ka_window *a = &k->u.window;
    const dp_kwin *g = &a->g;
    int iy, ix, ch;
    long r = dp_k_pixel(g, i, &iy, &ix, &ch);
    float s = 0.0f;
    for (int ky = 0; ky < g->kh; ky++) {
        int ty = iy + g->pad - ky;
        if (ty < 0 || ty % g->stride || ty / g->stride >= g->oh)
            continue;
        const float *drow = a->grad + ((r * g->oh + ty / g->stride) * g->ow * g->c + ch);
        for (int kx = g->kw - 1; kx >= 0; kx--) {
            int tx = ix + g->pad - kx;
            if (tx < 0 || tx % g->stride || tx / g->stride >= g->ow)
                continue;
            s += drow[tx / g->stride * g->c];
        }
    }
    a->dst[i] = s * (1.0f / (float)(g->kh * g->kw));
}

/* Item i = output float; per sample (hw, c) -> (c, hw) or back (window.c). */
DP_HD void dp_k_layout(const dp_kernel *k, long i)
{
    const dp_ka_layout *a = &k->u.layout;
    int c = a->c, hw = a->hw, per = c * hw;
    long r = i / per, base = r * per;
    int e = (int)(i - base);
    if (a->to_chw)
        a->out[i] = a->in[base + e % hw * c + e / hw];
    else
        a->out[i] = a->in[base + e % c * hw + e / c];
}
/* ---- end of image layers (2/2) ---- */

/* ---- lcn (2/2): bodies (the CPU's are in lcn.c) ---- */

/* lcn.c's divisor: max(mean, s, eps), ties to the mean, then to s; *who is
 * 0 (mean), 1 (s) or 2 (eps). */
DP_HD float dp_k_lcn_divisor(float mean, float s, float eps, int *who)
{
    float d = mean;
    *who = 0;
    if (s > d) {
        d = s;
        *who = 1;
    }
    if (eps > d) {
        d = eps;
        *who = 2;
    }
    return d;
}

/* Item i = pixel (r, p), items batch*N: a = sum over the channels of x. */
DP_HD void dp_k_lcn_sum(const dp_kernel *k, long i)
{
    const dp_ka_lcn *a = &k->u.lcn;
    float t = 0.0f;
    for (int ch = 0; ch < a->c; ch++)
        t += a->in[i * a->c + ch];
    a->a[i] = t;
}

/* blur's horizontal pass, item i = pixel (r, y, x), items batch*N:
 * b = sum_j u[j] a(y, x + j - n/2), taps off the map skipped, j ascending. */
DP_HD void dp_k_lcn_blur_h(const dp_kernel *k, long i)
{
    const dp_ka_lcn *a = &k->u.lcn;
    int x = (int)(i % a->w), rad = a->n / 2;
    const float *row = a->a + (i - x);
    float t = 0.0f;
    for (int j = 0; j < a->n; j++) {
        int xx = x + j - rad;
        if (xx >= 0 && xx < a->w)
            t += a->u[j] * row[xx];
    }
    a->b[i] = t;
}

/* blur's vertical pass with the factor 1/c, item i = pixel (r, y, x):
 * a = sum_i (u[i] / c) b(y + i - n/2, x), as blur() with scale 1/c. */
DP_HD void dp_k_lcn_blur_v(const dp_kernel *k, long i)
{
    const dp_ka_lcn *a = &k->u.lcn;
    int np = a->h * a->w, rad = a->n / 2;
    long r = i / np;
    int p = (int)(i - r * np), y = p / a->w, x = p - y * a->w;
    float inv_c = 1.0f / (float)a->c, t = 0.0f;
    const float *map = a->b + r * np;
    for (int j = 0; j < a->n; j++) {
        int yy = y + j - rad;
        if (yy >= 0 && yy < a->h)
            t += a->u[j] * inv_c * map[yy * a->w + x];
    }
    a->a[i] = t;
}

/* Item i = pixel (r, p), items batch*N: v = x - m (m in a), then a = sum_c v^2. */
DP_HD void dp_k_lcn_center(const dp_kernel *k, long i)
{
    const dp_ka_lcn *a = &k->u.lcn;
    float m = a->a[i], t = 0.0f;
    for (int ch = 0; ch < a->c; ch++) {
        float e = a->in[i * a->c + ch] - m;
        a->v[i * a->c + ch] = e;
        t += e * e;
    }
    a->a[i] = t;
}

/* Item r = a sample, items batch: s = sqrt(S) per pixel (S in a), and the
 * map's mean of s, summed in double in pixel order. */
/* ---- element-wise activations (2/2): bodies ---- */
#define DP_K_ACT_BODIES(name)                                                                    \
    DP_HD void dp_k_##name##_fwd(const dp_kernel *k, long i)                                     \
    {                                                                                            \
        k->u.act.out[i] = dp_k_##name##_f(k->u.act.in[i]);                                       \
    }                                                                                            \
    DP_HD void dp_k_##name##_bwd(const dp_kernel *k, long i)                                     \
    {                                                                                            \
        const dp_ka_act *a = &k->u.act;                                                          \
        a->out[i] = dp_k_##name##_g(a->dout[i], a->in[i], a->y[i]);                              \
    }
DP_K_ACT_BODIES(tanh)
DP_K_ACT_BODIES(sigmoid)
DP_K_ACT_BODIES(gelu)
#undef DP_K_ACT_BODIES
/* ---- end of element-wise activations (2/2) ---- */

/* ---- gap (2/2): bodies ---- */
/* Item i = (record r, channel ch), items batch*c: the mean over the pixels,
 * summed in double in pixel order. */
DP_HD void dp_k_gap_fwd(const dp_kernel *k, long i)
{
    const dp_ka_gap *a = &k->u.gap;
    long r = i / a->c, ch = i - r * a->c;
    const float *x = a->src + r * a->hw * a->c + ch;
    double s = 0.0;
    for (long p = 0; p < a->hw; p++)
        s += x[p * a->c];
    a->dst[i] = (float)(s / (double)a->hw);
}

/* Item i = input float (r, p, ch), items batch*hw*c: din = dout / hw. */
DP_HD void dp_k_gap_bwd(const dp_kernel *k, long i)
{
    const dp_ka_gap *a = &k->u.gap;
    long r = i / (a->hw * a->c), ch = i % a->c;
    a->dst[i] = a->src[r * a->c + ch] / (float)a->hw;
}
/* ---- end of gap (2/2) ---- */

/* ---- residual blocks (2/2): bodies ---- */
DP_HD void dp_k_res_add(const dp_kernel *k, long i)
{
    const dp_ka_res *a = &k->u.res;
    a->out[i] = a->a[i] + a->b[i];
}
/* ---- end of residual blocks (2/2) ---- */

/* ---- layer norm (2/2): bodies ---- */
/* The eight partial sums of a record (DP_LN_LANES) in one fixed tree:
 * the halves of a vector added lane to lane, then again, then the last
 * two. */
DP_HD double dp_k_sum8(const double s[DP_LN_LANES])
{
    double a0 = s[0] + s[4], a1 = s[1] + s[5], a2 = s[2] + s[6], a3 = s[3] + s[7];
    return (a0 + a2) + (a1 + a3);
}

/* Item r, items R: record r's mean and 1/std (biased variance, eps). */
DP_HD void dp_k_ln_stats(const dp_kernel *k, long r)
{
    const dp_ka_ln *a = &k->u.ln;
    const float *x = a->x + r * a->F;
    double s[DP_LN_LANES] = {0}, v[DP_LN_LANES] = {0};
    for (int f = 0; f < a->F; f++)
        s[f % DP_LN_LANES] += x[f];
    double mu = dp_k_sum8(s) / a->F;
    for (int f = 0; f < a->F; f++) {
        double t = x[f] - mu;
        v[f % DP_LN_LANES] += t * t;
    }
    a->mean[r] = (float)mu;
    a->inv[r] = (float)(1.0 / sqrt(dp_k_sum8(v) / a->F + a->eps));
}

/* Item i = (r, f), items R*F: y = (x - mean) * inv * w + b. */
DP_HD void dp_k_ln_norm(const dp_kernel *k, long i)
{
    const dp_ka_ln *a = &k->u.ln;
    long r = i / a->F, f = i - r * a->F;
    a->y[i] = (a->x[i] - a->mean[r]) * a->inv[r] * a->w[f] + a->b[f];
}

/* Item f, items F: dw = sum dy * xhat, db = sum dy over the records, in double. */
DP_HD void dp_k_ln_grad(const dp_kernel *k, long f)
{
    const dp_ka_ln *a = &k->u.ln;
    double g = 0.0, b = 0.0;
    for (long r = 0; r < a->R; r++) {
        long at = r * a->F + f;
        double dy = a->dy[at];
        g += dy * ((a->x[at] - a->mean[r]) * a->inv[r]);
        b += dy;
    }
    a->gw[f] = (float)g;
    a->gb[f] = (float)b;
}

/* Item r, items R: record r's dx = inv (g - mean(g) - xhat mean(g xhat)),
 * g = dy * w, the two means in double. */
DP_HD void dp_k_ln_din(const dp_kernel *k, long r)
{
    const dp_ka_ln *a = &k->u.ln;
    long at = r * a->F;
    float mu = a->mean[r], inv = a->inv[r];
    double sg[DP_LN_LANES] = {0}, sgx[DP_LN_LANES] = {0};
    for (int f = 0; f < a->F; f++) {
        float g = a->dy[at + f] * a->w[f];
        sg[f % DP_LN_LANES] += g;
        sgx[f % DP_LN_LANES] += (double)g * ((a->x[at + f] - mu) * inv);
    }
    float mg = (float)(dp_k_sum8(sg) / a->F), mgx = (float)(dp_k_sum8(sgx) / a->F);
    for (int f = 0; f < a->F; f++) {
        float g = a->dy[at + f] * a->w[f], xhat = (a->x[at + f] - mu) * inv;
        a->dx[at + f] = inv * (g - mg - xhat * mgx);
    }
}
/* ---- end of layer norm (2/2) ---- */

/* ---- tokens (2/2): bodies ---- */
/* Item i, items R*F: out = in + P. */
DP_HD void dp_k_pos_fwd(const dp_kernel *k, long i)
{
    const dp_ka_tok *a = &k->u.tok;
    a->dst[i] = a->src[i] + a->p[i % a->F];
}

/* Item f, items F: P's gradient, the output gradient summed over the records. */
DP_HD void dp_k_pos_grad(const dp_kernel *k, long f)
{
    const dp_ka_tok *a = &k->u.tok;
    double g = 0.0;
    for (long r = 0; r < a->R; r++)
        g += a->src[r * a->F + f];
    a->dst[f] = (float)g;
}

/* Item t, items R: id t rounded to the nearest integer and clamped to
 * [0, N) (NaN to 0); a changed one counted at ids[R], zeroed before. */
DP_HD void dp_k_emb_ids(const dp_kernel *k, long t)
{
    const dp_ka_tok *a = &k->u.tok;
    float v = a->src[t], id = nearbyintf(v), top = (float)(a->N - 1);
    id = !(id >= 0.0f) ? 0.0f : id > top ? top : id;
    a->ids[t] = id;
    if (id != v)
        DP_ATOMIC_ADD(&a->ids[a->R], 1.0f);
}

/* Item i = (t, e), items R*F: the table's row of id t. */
DP_HD void dp_k_emb_fwd(const dp_kernel *k, long i)
{
    const dp_ka_tok *a = &k->u.tok;
    long t = i / a->F, e = i - t * a->F;
    a->dst[i] = a->p[(long)a->ids[t] * a->F + e];
}

/* Item e, items F: column e of the table's gradient: zero, then each id's
 * output gradient added in id order. */
DP_HD void dp_k_emb_grad(const dp_kernel *k, long e)
{
    const dp_ka_tok *a = &k->u.tok;
    for (long n = 0; n < a->N; n++)
        a->dst[n * a->F + e] = 0.0f;
    for (long t = 0; t < a->R; t++)
        a->dst[(long)a->ids[t] * a->F + e] += a->src[t * a->F + e];
}
/* Item r: row r of scores, scaled, to its softmax (the max taken out,
 * summed in double in DP_LN_LANES partial sums, as ln's rows), in place.
 * The exponentials are dp_k_exp's, in a loop of their own, so the CPU's
 * vector lanes take a row at a time (a libm expf per score took 6 % of
 * vit-mnist's step; layer_mha.c's CPU loop makes the same operations) and
 * a GPU gives the same bits. */
DP_HD void dp_k_mha_softmax(const dp_kernel *k, long r)
{
    const dp_ka_attn *a = &k->u.attn;
    float *s = a->s + r * a->T, mx = s[0] * a->scale;
    for (long j = 1; j < a->T; j++)
        mx = s[j] * a->scale > mx ? s[j] * a->scale : mx;
    for (long j = 0; j < a->T; j++)
        s[j] = dp_k_exp(s[j] * a->scale - mx);
    double part[DP_LN_LANES] = {0};
    for (long j = 0; j < a->T; j++)
        part[j % DP_LN_LANES] += s[j];
    float inv = (float)(1.0 / dp_k_sum8(part));
    for (long j = 0; j < a->T; j++)
        s[j] *= inv;
}

/* Item r: row r of dP to dS = scale P (dP - rowsum(dP P)), in place. */
DP_HD void dp_k_mha_softmax_bwd(const dp_kernel *k, long r)
{
    const dp_ka_attn *a = &k->u.attn;
    float *g = a->s + r * a->T;
    const float *p = a->p + r * a->T;
    double part[DP_LN_LANES] = {0};
    for (long j = 0; j < a->T; j++)
        part[j % DP_LN_LANES] += (double)g[j] * p[j];
    float d = (float)dp_k_sum8(part);
    for (long j = 0; j < a->T; j++)
        g[j] = a->scale * (p[j] * (g[j] - d));
}
/* ---- end of tokens (2/2) ---- */

/* ---- batch norm (2/2): bodies ---- */

/* Item i = (block p, channel ch) = p*C + ch, items P*C: block p's sum of
 * channel ch over its rows in order, in double: of x, of (x - mean)^2 about
 * the double mean, or of dy * xhat and of dy (into the second set). */
DP_HD void dp_k_bn_part(const dp_kernel *k, long i)
{
    const dp_ka_bn *a = &k->u.bn;
    long ch = i % a->C, r0 = i / a->C * DP_BN_ROWS;
    long r1 = r0 + DP_BN_ROWS < a->R ? r0 + DP_BN_ROWS : a->R;
    double s = 0.0, t = 0.0;
    if (a->pass == DP_BN_SUM) {
        for (long r = r0; r < r1; r++)
            s += a->x[r * a->C + ch];
    } else if (a->pass == DP_BN_SQUARES) {
        double mu = a->part[2 * dp_bn_blocks(a->R) * a->C + ch];
        for (long r = r0; r < r1; r++) {
            double d = a->x[r * a->C + ch] - mu;
            s += d * d;
        }
    } else {
        for (long r = r0; r < r1; r++) {
            long at = r * a->C + ch;
            double dy = a->dy[at];
            s += dy * ((a->x[at] - a->mean[ch]) * a->inv[ch]);
            t += dy;
        }
        a->part[dp_bn_blocks(a->R) * a->C + i] = t;
    }
    a->part[i] = s;
}

/* Channel ch's blocks' partial sums (of the set at `set`), in order. */
DP_HD double dp_bn_total(const dp_ka_bn *a, long set, long ch)
{
    long P = dp_bn_blocks(a->R);
    double s = 0.0;
    for (long p = 0; p < P; p++)
        s += a->part[set + p * a->C + ch];
    return s;
}

/* Item ch, items C: the batch's mean of channel ch, in double, for the
 * squares' pass. */
DP_HD void dp_k_bn_mean(const dp_kernel *k, long ch)
{
    const dp_ka_bn *a = &k->u.bn;
    a->part[2 * dp_bn_blocks(a->R) * a->C + ch] = dp_bn_total(a, 0, ch) / (double)a->R;
}

/* Item ch, items C: the batch's statistics of channel ch from the squares'
 * partial sums, and the running ones moved (PyTorch's unbiased variance,
 * momentum); item 0 counts the batch. */
DP_HD void dp_k_bn_stats(const dp_kernel *k, long ch)
{
    const dp_ka_bn *a = &k->u.bn;
    double mu = a->part[2 * dp_bn_blocks(a->R) * a->C + ch], v = dp_bn_total(a, 0, ch);
    a->mean[ch] = (float)mu;
    a->var[ch] = (float)(v / (double)a->R);
    a->inv[ch] = (float)(1.0 / sqrt(v / (double)a->R + a->eps));
    double R = (double)a->R;
    float unbiased = (float)(R > 1 ? (double)a->var[ch] * R / (R - 1) : (double)a->var[ch]);
    a->rm[ch] = (1.0f - a->momentum) * a->rm[ch] + a->momentum * a->mean[ch];
    a->rv[ch] = (1.0f - a->momentum) * a->rv[ch] + a->momentum * unbiased;
    if (ch == 0)
        a->nbt[0] += 1.0f;
}

/* Item i = element (r, ch), items R*C: y = (x - mean) * inv * gamma + beta. */
DP_HD void dp_k_bn_norm(const dp_kernel *k, long i)
{
    const dp_ka_bn *a = &k->u.bn;
    long ch = i % a->C;
    a->y[i] = (a->x[i] - a->mean[ch]) * a->inv[ch] * a->w[ch] + a->b[ch];
}

/* Item ch, items C: dgamma = sum dy * xhat and dbeta = sum dy from the
 * gradients' partial sums. */
DP_HD void dp_k_bn_grad(const dp_kernel *k, long ch)
{
    const dp_ka_bn *a = &k->u.bn;
    a->gw[ch] = (float)dp_bn_total(a, 0, ch);
    a->gb[ch] = (float)dp_bn_total(a, dp_bn_blocks(a->R) * a->C, ch);
}

/* Item i = element (r, ch), items R*C: dx = gamma inv / R (R dy - dbeta - xhat dgamma). */
DP_HD void dp_k_bn_din(const dp_kernel *k, long i)
{
    const dp_ka_bn *a = &k->u.bn;
    long ch = i % a->C;
    float R = (float)a->R;
    float xhat = (a->x[i] - a->mean[ch]) * a->inv[ch];
    float kk = a->w[ch] * a->inv[ch] / R;
    a->dx[i] = kk * (R * a->dy[i] - a->gb[ch] - xhat * a->gw[ch]);
}
/* ---- end of batch norm (2/2) ---- */

DP_HD void dp_k_lcn_mean(const dp_kernel *k, long r)
{
    const dp_ka_lcn *a = &k->u.lcn;
    long np = (long)a->h * a->w;
    double sum = 0.0;
    for (long p = r * np; p < (r + 1) * np; p++) {
        a->s[p] = sqrtf(a->a[p]);
        sum += a->s[p];
    }
    a->mean[r] = (float)(sum / (double)np);
}

/* Item i = output float (r, p, ch), items batch*N*c: out = v / d. */
DP_HD void dp_k_lcn_div(const dp_kernel *k, long i)
{
    const dp_ka_lcn *a = &k->u.lcn;
    long pix = i / a->c, np = (long)a->h * a->w;
    int who;
    float d = dp_k_lcn_divisor(a->mean[pix / np], a->s[pix], a->eps, &who);
    a->out[i] = a->v[i] / d;
}

/* Item i = pixel (r, p), items batch*N: a = gd = -<dout, v> / d^2. */
DP_HD void dp_k_lcn_gd(const dp_kernel *k, long i)
{
    const dp_ka_lcn *a = &k->u.lcn;
    long np = (long)a->h * a->w;
    int who;
    float d = dp_k_lcn_divisor(a->mean[i / np], a->s[i], a->eps, &who), e = 0.0f;
    for (int ch = 0; ch < a->c; ch++)
        e += a->in[i * a->c + ch] * a->v[i * a->c + ch];
    a->a[i] = -e / (d * d);
}

/* Item r = a sample, items batch: gm = gM / N, gM the sum of gd where the
 * mean won, in double in pixel order. */
DP_HD void dp_k_lcn_gm(const dp_kernel *k, long r)
{
    const dp_ka_lcn *a = &k->u.lcn;
    long np = (long)a->h * a->w;
    double sum = 0.0;
    for (long p = r * np; p < (r + 1) * np; p++) {
        int who;
        dp_k_lcn_divisor(a->mean[r], a->s[p], a->eps, &who);
        if (who == 0)
            sum += a->a[p];
    }
    a->gm[r] = (float)(sum / (double)np);
}

/* Item i = pixel (r, p), items batch*N: a = dL/dS = (gd where s won, + gm) / (2 s). */
DP_HD void dp_k_lcn_gs(const dp_kernel *k, long i)
{
    const dp_ka_lcn *a = &k->u.lcn;
    long np = (long)a->h * a->w, r = i / np;
    int who;
    dp_k_lcn_divisor(a->mean[r], a->s[i], a->eps, &who);
    float gs = (who == 1 ? a->a[i] : 0.0f) + a->gm[r];
    a->a[i] = a->s[i] > 0.0f ? gs / (2.0f * a->s[i]) : 0.0f;
}

/* Item i = pixel (r, p), items batch*N: din = dL/dv = dout / d + 2 v dL/dQ
 * (dL/dQ in a), then a = -sum_c dL/dv. */
DP_HD void dp_k_lcn_gv(const dp_kernel *k, long i)
{
    const dp_ka_lcn *a = &k->u.lcn;
    long np = (long)a->h * a->w;
    int who;
    float d = dp_k_lcn_divisor(a->mean[i / np], a->s[i], a->eps, &who);
    float gq2 = 2.0f * a->a[i], t = 0.0f;
    for (int ch = 0; ch < a->c; ch++) {
        float gv = a->in[i * a->c + ch] / d + gq2 * a->v[i * a->c + ch];
        a->out[i * a->c + ch] = gv;
        t += gv;
    }
    a->a[i] = -t;
}

/* Item i = input float (r, p, ch), items batch*N*c: din += dL/dxs (in a). */
DP_HD void dp_k_lcn_add(const dp_kernel *k, long i)
{
    const dp_ka_lcn *a = &k->u.lcn;
    a->out[i] += a->a[i / a->c];
}
/* ---- end of lcn (2/2) ---- */

#endif
