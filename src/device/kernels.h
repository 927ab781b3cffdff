/* The device's element-wise kernels: one body each, shared by every backend
 * (docs/gpu.md, "Kernels").  A kernel is a count of work items and a body
 * that does item i; the CUDA plugin runs a body as a grid-stride loop of
 * threads, sim as a plain loop on the host.  So the arithmetic that tests
 * check through sim is the arithmetic the GPU runs.
 *
 * Rules for a body: C and C++ alike (nvcc compiles it as C++); it touches
 * only its item's outputs, except through DP_ATOMIC_ADD (tallies); floats
 * with the same formula as the CPU kernel it mirrors (layers.h, optim.h),
 * so the two agree to rounding.  Values that change from one step to the
 * next (the learning rate, the batch's record indices) are read from the
 * device's step block, never passed by value, so a captured graph replays
 * them fresh (backend.h, "Graphs").
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

/* Every kernel: X(ID, name).  The ids are DP_K_<ID>; the bodies dp_k_<name>. */
#define DP_KERNELS(X)                                                                            \
    X(GATHER, gather)                                                                            \
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
    X(ADAM, adam)

typedef enum dp_kernel_id {
#define DP_K_ENUM(ID, name) DP_K_##ID,
    DP_KERNELS(DP_K_ENUM)
#undef DP_K_ENUM
    DP_K_COUNT
} dp_kernel_id;

/* The step block: one per step in device memory, written by one H2D copy
 * before the step's kernels (dmodel.c, "The step block").  The batch's
 * record indices follow it. */
typedef struct dp_step_block {
    float lr;    /* this update's learning rate */
    float lr_t;  /* adam: lr sqrt(1 - b2^t) / (1 - b1^t) */
    float scale; /* gradients are multiplied by this before the update */
    uint32_t n;  /* records in the batch */
} dp_step_block;

/* ---- arguments, one struct per kernel ---- */
typedef struct dp_ka_gather {  /* items rows*dim */
    float *x;                  /* (rows, dim) pixels / 255 */
    uint8_t *y;                /* (rows) labels */
    const uint8_t *images;     /* the split's (n, dim) bytes */
    const uint8_t *labels;
    const uint32_t *idx;       /* (rows) record indices, in the step block */
    long dim;
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
    uint64_t key, threshold;
    float scale;
} dp_ka_dropout;
typedef struct dp_ka_optim {   /* items n: one optimiser's update, optim.h's formulas */
    float *p;
    const float *g;
    float *s0, *s1;            /* state slots (velocity, accumulator, or m and v) */
    const dp_step_block *step; /* lr, lr_t, scale */
    float mu, b1, b2, eps;
} dp_ka_optim;

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
    uint64_t h = dp_k_mix64(a->key ^ (uint64_t)(i >> 1) * 0x9e3779b97f4a7c15ULL);
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
    a->p[i] -= a->step->lr * (a->g[i] * a->step->scale);
}

DP_HD void dp_k_momentum(const dp_kernel *k, long i)
{
    const dp_ka_optim *a = &k->u.optim;
    float g = a->g[i] * a->step->scale;
    float v = a->mu * a->s0[i] - a->step->lr * g;
    a->s0[i] = v;
    a->p[i] += v;
}

DP_HD void dp_k_nesterov(const dp_kernel *k, long i)
{
    const dp_ka_optim *a = &k->u.optim;
    float g = a->g[i] * a->step->scale;
    float v = a->mu * a->s0[i] - a->step->lr * g;
    a->s0[i] = v;
    a->p[i] += a->mu * v - a->step->lr * g;
}

DP_HD void dp_k_adagrad(const dp_kernel *k, long i)
{
    const dp_ka_optim *a = &k->u.optim;
    float g = a->g[i] * a->step->scale;
    float acc = a->s0[i] + g * g;
    a->s0[i] = acc;
    a->p[i] -= a->step->lr * g / (sqrtf(acc) + a->eps);
}

DP_HD void dp_k_adam(const dp_kernel *k, long i)
{
    const dp_ka_optim *a = &k->u.optim;
    float g = a->g[i] * a->step->scale;
    float m = a->b1 * a->s0[i] + (1.0f - a->b1) * g;
    float v = a->b2 * a->s1[i] + (1.0f - a->b2) * g * g;
    a->s0[i] = m;
    a->s1[i] = v;
    a->p[i] -= a->step->lr_t * m / (sqrtf(v) + a->eps);
}

#endif
