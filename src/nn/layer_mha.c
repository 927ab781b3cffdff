/* mha<H>: multi-head self-attention over a record's T tokens of width D (an
 * NHWC image of T = h*w positions of D = c channels: docs/models.md,
 * "Images as tokens"), as PyTorch's
 * nn.MultiheadAttention(D, H, batch_first=True) called as attn(x, x, x):
 * no mask, no dropout, output (T, D).
 *
 *   [Q K V] = x Win^T + bin            one product over every token of the batch
 *   O_h = softmax(Q_h K_h^T / sqrt(D/H)) V_h   per record and head h (D/H columns)
 *   y = [O_1 .. O_H] Wout^T + bout      one product over every token
 *
 * Parameters, in files as PyTorch names them: in_proj_weight (3D, D),
 * out_proj.weight (D, D) in the weight region; in_proj_bias (3D),
 * out_proj.bias (D) in the bias region.  Initial weights: the Glorot draw
 * with fans D and 3D over both matrices (PyTorch's xavier_uniform_ of
 * in_proj_weight; its out_proj draws from a narrower +-1/sqrt(D)), zero
 * biases, as PyTorch's.
 *
 * The two projections are the dense kernels (layers.h: the BLAS wrapper,
 * split over the pool).  The per-head products go through the BLAS wrapper
 * too, one (record, head) per call, the pairs split over the pool (inside a
 * pool task the wrapper runs on its thread): so no result depends on the
 * thread count.  Measured against a tight loop for those products (mha4,
 * T 16, D 64, batch 128, forward and backward, one thread of this 2-core
 * machine): 15 ms through the wrapper, 28 ms in the loop.  The keep holds what the backward needs and its scratch,
 * per slot (docs/architecture.md, "Tokens and attention"): QKV (B T 3D), the
 * probabilities P (B H T T), the heads' outputs O (B T D), and for the
 * backward dO (B T D), dQKV (B T 3D) and dS (B H T T); nothing is allocated
 * in a step.  Model parallelism refuses it.  On a device the same
 * products run as one strided-batched GEMM per head over the batch's records
 * (backend.h: H launches per product, not B H tiny ones, which left a GPU
 * idle between launches), the softmax and its backward as kernels.h's
 * bodies, which the CPU calls too. */
#include "nn/layer_impl.h"

#include <math.h>
#include <string.h>

#include "device/dexec.h"
#include "downpour/blas.h"
#include "downpour/layers.h"
#include "downpour/pool.h"
#include "nn/isa_paths.h"

static int parse(dp_spec_parser *p, const char *s, const char *end)
{
    long heads = dp_spec_num(&s, end, 1, DP_SPEC_MAX_WIDTH);
    if (heads < 1 || s != end)
        return dp_spec_fail(p, "expected mha<H>: a number of heads in [1, %d], like mha4",
                            DP_SPEC_MAX_WIDTH);
    if (!p->flat && p->h * p->w > 1 && dp_spec_need_image(p) < 0) /* tokens: NHWC */
        return -1;
    if (p->c % heads)
        return dp_spec_fail(p, "%ld heads do not divide the width %d of its tokens (each head "
                               "takes width/heads features; the width is the channels)",
                            heads, p->c);
    dp_layer *d = dp_spec_add(p, DP_LAYER_MHA);
    if (!d)
        return -1;
    d->heads = (int)heads;
    size_t D = (size_t)d->c;
    return dp_spec_params(p, d, 4 * D * D, 4 * D);
}

static int heads_of(const dp_layer *d) { return d->heads; }
static long tokens_of(const dp_layer *d) { return (long)d->h * d->w; }

static void fans(const dp_layer *d, double *fan_in, double *fan_out)
{
    *fan_in = d->c;
    *fan_out = 3.0 * d->c;
}

static int tensors(const dp_layer *d, dp_lk_tensor out[DP_LK_MAX_TENSORS])
{
    int64_t D = d->c;
    size_t wl = d->w_len;
    out[0] = (dp_lk_tensor){"in_proj_weight", 0, 2, {3 * D, D}};
    out[1] = (dp_lk_tensor){"out_proj.weight", (size_t)(3 * D * D), 2, {D, D}};
    out[2] = (dp_lk_tensor){"in_proj_bias", wl, 1, {3 * D}};
    out[3] = (dp_lk_tensor){"out_proj.bias", wl + (size_t)(3 * D), 1, {D}};
    return 4;
}

static double cost(const dp_layer *d)
{
    double T = (double)tokens_of(d), D = d->c;
    return T * 4 * D * D + 2 * T * T * D;
}

/* Where each part of the keep starts, for a batch of B records. */
typedef struct parts {
    float *qkv, *p, *o, *dout_o, *dqkv, *ds;
} parts;

static parts parts_of(const dp_layer *d, float *keep, int B)
{
    size_t tok = (size_t)B * tokens_of(d), D = (size_t)d->c;
    size_t att = (size_t)B * heads_of(d) * tokens_of(d) * tokens_of(d);
    parts k;
    k.qkv = keep;
    k.p = k.qkv + tok * 3 * D;
    k.o = k.p + att;
    k.dout_o = k.o + tok * D;
    k.dqkv = k.dout_o + tok * D;
    k.ds = k.dqkv + tok * 3 * D;
    return k;
}

static size_t keep_floats(const dp_layer *d, int max_batch)
{
    size_t tok = (size_t)max_batch * tokens_of(d), D = (size_t)d->c;
    size_t att = (size_t)max_batch * heads_of(d) * tokens_of(d) * tokens_of(d);
    return tok * 8 * D + 2 * att;
}

/* The softmax (forward) or its backward (p: P) over rows of T scores at s:
 * kernels.h's bodies, which the CPU calls and a device launches. */
static dp_kernel softmax_kernel(const dp_layer *d, float *s, const float *p, long items)
{
    dp_kernel k = {.id = p ? DP_K_MHA_SOFTMAX_BWD : DP_K_MHA_SOFTMAX, .items = items};
    k.u.attn = (dp_ka_attn){s, p, tokens_of(d), 1.0f / sqrtf((float)(d->c / heads_of(d)))};
    return k;
}

/* On the CPU: the rows [r0, r1), as dp_k_mha_softmax and its backward
 * (the same operations in the same order: the device's bits), inlined into
 * each instruction-set level's attend task with their partial sums eight
 * scores at a time (dp_d8: a row's sum was a chain of dependent additions,
 * a third of the task's time). */
static inline __attribute__((always_inline)) void softmax_rows(const dp_layer *d, float *s,
                                                               const float *p, long r0, long r1)
{
    dp_kernel k = softmax_kernel(d, s, p, 0);
    const dp_ka_attn *a = &k.u.attn;
    long T = a->T, T8 = T / DP_LN_LANES * DP_LN_LANES;
    for (long r = r0; r < r1; r++) {
        float *x = s + r * T;
        double part[DP_LN_LANES];
        if (p) {
            const float *pr = p + r * T;
            dp_d8 acc = {0};
            for (long j = 0; j < T8; j += DP_LN_LANES) {
                dp_d8 g, q;
                DP_LOAD8(g, x + j);
                DP_LOAD8(q, pr + j);
                acc += g * q;
            }
            memcpy(part, &acc, sizeof part);
            for (long j = T8; j < T; j++)
                part[j % DP_LN_LANES] += (double)x[j] * pr[j];
            float dot = (float)dp_k_sum8(part);
            for (long j = 0; j < T; j++)
                x[j] = a->scale * (pr[j] * (x[j] - dot));
            continue;
        }
        float mx = x[0] * a->scale;
        for (long j = 1; j < T; j++)
            mx = x[j] * a->scale > mx ? x[j] * a->scale : mx;
        for (long j = 0; j < T; j++)
            x[j] = dp_k_exp(x[j] * a->scale - mx);
        dp_lanes_sum(x, (size_t)T, part);
        float inv = (float)(1.0 / dp_k_sum8(part));
        for (long j = 0; j < T; j++)
            x[j] *= inv;
    }
}

/* One (record, head) pair's pointers. */
typedef struct pair {
    const float *q, *k, *v; /* rows of 3D floats */
    float *dq, *dk, *dv;    /* the same in dQKV */
    float *p, *ds;          /* T x T */
    float *o, *dout_o;      /* rows of D floats */
} pair;

static pair pair_of(const dp_layer_call *c, const parts *k, long bh)
{
    const dp_layer *d = c->d;
    long H = heads_of(d), T = tokens_of(d), D = d->c, dh = D / H, b = bh / H, h = bh % H;
    size_t row = (size_t)b * T;
    pair q;
    q.q = k->qkv + row * 3 * D + h * dh;
    q.k = q.q + D;
    q.v = q.q + 2 * D;
    q.dq = k->dqkv + row * 3 * D + h * dh;
    q.dk = q.dq + D;
    q.dv = q.dq + 2 * D;
    q.p = k->p + (size_t)bh * T * T;
    q.ds = k->ds + (size_t)bh * T * T;
    q.o = k->o + row * D + h * dh;
    q.dout_o = k->dout_o + row * D + h * dh;
    return q;
}

/* The per-head part of a forward or a backward, split over the pool by
 * (record, head) pairs.  Forward: S = Q K^T, P = softmax(s S), O = P V.
 * Backward: dV = P^T dO; dP = dO V^T; dS = s P (dP - rowsum(dP P));
 * dQ = dS K; dK = dS^T Q (s = 1/sqrt(dh)). */
typedef struct attend_job {
    const dp_layer_call *c;
    bool backward;
} attend_job;

/* Compiled for each instruction-set level (isa_paths.h): the softmax's
 * exponentials take the vector lanes, a score each, so every path gives
 * the same bits. */
static inline __attribute__((always_inline)) void attend_task_body(void *ctx, int i, int n)
{
    const attend_job *j = ctx;
    const dp_layer_call *c = j->c;
    const dp_layer *d = c->d;
    int T = (int)tokens_of(d), D = d->c, dh = D / heads_of(d);
    parts k = parts_of(d, c->keep, c->batch);
    size_t lo, hi;
    dp_pool_range((size_t)c->batch * heads_of(d), 1, i, n, &lo, &hi);
    for (size_t bh = lo; bh < hi; bh++) {
        pair q = pair_of(c, &k, (long)bh);
        long r0 = (long)bh * T, r1 = r0 + T;
        if (!j->backward) {
            dp_sgemm(false, true, T, T, dh, 1.0f, q.q, 3 * D, q.k, 3 * D, 0.0f, q.p, T);
            softmax_rows(d, k.p, NULL, r0, r1);
            dp_sgemm(false, false, T, dh, T, 1.0f, q.p, T, q.v, 3 * D, 0.0f, q.o, D);
            continue;
        }
        dp_sgemm(true, false, T, dh, T, 1.0f, q.p, T, q.dout_o, D, 0.0f, q.dv, 3 * D);
        dp_sgemm(false, true, T, T, dh, 1.0f, q.dout_o, D, q.v, 3 * D, 0.0f, q.ds, T);
        softmax_rows(d, k.ds, k.p, r0, r1);
        dp_sgemm(false, false, T, dh, T, 1.0f, q.ds, T, q.k, 3 * D, 0.0f, q.dq, 3 * D);
        dp_sgemm(true, false, T, dh, T, 1.0f, q.ds, T, q.q, 3 * D, 0.0f, q.dk, 3 * D);
    }
}
DP_ISA_POOL_TASK(attend_task)

static float forward(const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    int D = d->c, rows = c->batch * (int)tokens_of(d);
    parts k = parts_of(d, c->keep, c->batch);
    dp_dense_forward(k.qkv, c->in, c->w, c->b, rows, D, 3 * D);
    attend_job j = {c, false};
    dp_pool_run(attend_task[dp_isa_paths_level()], &j);
    dp_dense_forward(c->out, k.o, c->w + (size_t)3 * D * D, c->b + 3 * D, rows, D, D);
    return 0.0f;
}

static void backward(const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    int D = d->c, rows = c->batch * (int)tokens_of(d);
    parts k = parts_of(d, c->keep, c->batch);
    dp_dense_backward_overwrite(k.dout_o, c->gw + (size_t)3 * D * D, c->gb + 3 * D, c->dout, k.o,
                                c->w + (size_t)3 * D * D, rows, D, D);
    attend_job j = {c, true};
    dp_pool_run(attend_task[dp_isa_paths_level()], &j);
    dp_dense_backward_overwrite(c->din, c->gw, c->gb, k.dqkv, c->in, c->w, rows, D, 3 * D);
}

/* ---- on a device: the same products, one head at a time over the batch ---- */

/* Row-major C_i (m, n) = op(A_i) op(B_i) for the batch's records i, X_i =
 * X + i sX: one strided-batched product (the device's column-major product
 * of the transposes), so a head costs one launch, not one per record. */
static void dev_gemm(const dp_dexec *x, const dp_layer_call *c, bool ta, bool tb, int m, int n,
                     int k, const float *a, int lda, long long sa, const float *b, int ldb,
                     long long sb, float *y, int ldy, long long sy)
{
    dp_dexec_gemm_batched(x, tb, ta, n, m, k, b, ldb, sb, a, lda, sa, 0.0f, y, ldy, sy, c->batch);
}

/* Floats from one record's matrices of a head to the next record's (pair_of's
 * offsets for b + 1 less those for b): every operand has a single stride, so
 * nothing is left to issue per record. */
typedef struct strides {
    long long qkv; /* q, k, v and dq, dk, dv: T rows of 3D */
    long long att; /* p, ds: the H (T x T) matrices of a record */
    long long od;  /* o, dout_o: T rows of D */
} strides;

static strides strides_of(const dp_layer *d)
{
    long long T = tokens_of(d), D = d->c;
    return (strides){T * 3 * D, (long long)heads_of(d) * T * T, T * D};
}

/* A projection (the input's, or the output's when out) as a dense layer's
 * call on every token of the batch, through dense's device kernels. */
static void dev_proj(const dp_dexec *x, const dp_layer_call *c, bool out, bool backward,
                     const float *in, float *y, const float *dy, float *din)
{
    int D = c->d->c;
    size_t wo = out ? (size_t)3 * D * D : 0, bo = out ? (size_t)3 * D : 0;
    dp_layer p = {.kind = DP_LAYER_DENSE, .in = D, .out = out ? D : 3 * D};
    dp_layer_call pc = {.d = &p, .batch = c->batch * (int)tokens_of(c->d), .w = c->w + wo,
                        .b = c->b + bo, .in = in, .out = y, .dout = dy, .din = din};
    if (backward)
        pc.gw = c->gw + wo, pc.gb = c->gb + bo;
    const dp_layer_ops *o = dp_layer_table[DP_LAYER_DENSE];
    (backward ? o->dev_backward : o->dev_forward)(x, &pc);
}

static void dev_softmax(const dp_dexec *x, const dp_layer_call *c, float *s, const float *p)
{
    const dp_layer *d = c->d;
    dp_kernel k = softmax_kernel(d, s, p, (long)c->batch * heads_of(d) * tokens_of(d));
    dp_dexec_launch(x, &k);
}

/* pair_of(c, &k, h) is head h of record 0; the strides reach the others. */
static void dev_forward(const dp_dexec *x, const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    int T = (int)tokens_of(d), D = d->c, H = heads_of(d), dh = D / H;
    strides st = strides_of(d);
    parts k = parts_of(d, c->keep, c->batch);
    dev_proj(x, c, false, false, c->in, k.qkv, NULL, NULL);
    for (int h = 0; h < H; h++) {
        pair q = pair_of(c, &k, h);
        dev_gemm(x, c, false, true, T, T, dh, q.q, 3 * D, st.qkv, q.k, 3 * D, st.qkv, q.p, T,
                 st.att);
    }
    dev_softmax(x, c, k.p, NULL);
    for (int h = 0; h < H; h++) {
        pair q = pair_of(c, &k, h);
        dev_gemm(x, c, false, false, T, dh, T, q.p, T, st.att, q.v, 3 * D, st.qkv, q.o, D, st.od);
    }
    dev_proj(x, c, true, false, k.o, c->out, NULL, NULL);
}

static void dev_backward(const dp_dexec *x, const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    int T = (int)tokens_of(d), D = d->c, H = heads_of(d), dh = D / H;
    strides st = strides_of(d);
    parts k = parts_of(d, c->keep, c->batch);
    dev_proj(x, c, true, true, k.o, NULL, c->dout, k.dout_o);
    for (int h = 0; h < H; h++) {
        pair q = pair_of(c, &k, h);
        dev_gemm(x, c, true, false, T, dh, T, q.p, T, st.att, q.dout_o, D, st.od, q.dv, 3 * D,
                 st.qkv);
        dev_gemm(x, c, false, true, T, T, dh, q.dout_o, D, st.od, q.v, 3 * D, st.qkv, q.ds, T,
                 st.att);
    }
    dev_softmax(x, c, k.ds, k.p);
    for (int h = 0; h < H; h++) {
        pair q = pair_of(c, &k, h);
        dev_gemm(x, c, false, false, T, dh, T, q.ds, T, st.att, q.k, 3 * D, st.qkv, q.dq, 3 * D,
                 st.qkv);
        dev_gemm(x, c, true, false, T, dh, T, q.ds, T, st.att, q.q, 3 * D, st.qkv, q.dk, 3 * D,
                 st.qkv);
    }
    dev_proj(x, c, false, true, c->in, NULL, k.dqkv, c->din);
}

static size_t dev_keep(const dp_layer *d, int max_batch) { return keep_floats(d, max_batch); }

/* The projections' bias gradients sum every token of the batch. */
static long dev_ones(const dp_layer *d, int max_batch) { return (long)max_batch * tokens_of(d); }

const dp_layer_ops dp_layer_mha = {
    .kind = DP_LAYER_MHA, .name = "mha", .token = 1,
    .example = "mha4", .help = "self-attention over the tokens, 4 heads (nn.MultiheadAttention)",
    .parse = parse, .fans = fans, .tensors = tensors, .cost = cost,
    .keep_floats = keep_floats,
    .forward = forward, .backward = backward,
    .mp = DP_MP_REFUSE,
    .mp_reason = "every token attends to every other, so a task's rows need the whole input, "
                 "and its projections would be needed whole on every task, while a layer run "
                 "whole on every task (FULL) holds no parameters; not split yet",
    .dev_forward = dev_forward, .dev_backward = dev_backward, .dev_keep = dev_keep,
    .dev_ones = dev_ones,
};
