/* The kernel bodies do not depend on the order of their items (kernels.h's
 * rule: an item writes only its own outputs, tallies through DP_ATOMIC_ADD).
 * A GPU runs a launch's items in parallel, in no order, while sim runs them
 * in the order DOWNPOUR_SIM_ORDER says (sim.c).  So every kernel in
 * DP_KERNELS, and whole training steps of an MLP (dense, dropout, a relu of
 * its own, adam, --ema's average), of a CNN (hwc, conv, avgpool, local,
 * lcn, maxpool, flatten, over a split of float records, momentum) and of
 * the zoo's mlp-300-100, cnn-mnist and distbelief-image, and of models with
 * batch norm, the element-wise activations, the token layers (pos,
 * emb, mha, ln over tokens) and residual blocks, run here under
 * forward, reverse and shuffle (two seeds), and every output, every piece
 * of device state a kernel writes, must be the same bits; only the tallies,
 * sums of doubles in launch order, may move, by at most TALLY_RTOL.
 * Outputs start as random values, not zeros, and the kernels that may
 * (kernels.h) run in place as well, so an item that read another's output
 * would see a different value in another order.
 *
 * And the order modes themselves: shuffle and reverse visit every item once
 * (a doubling of n items doubles each once, for many n); the orders really
 * differ (a launch made order-dependent on purpose gives forward's,
 * reverse's and shuffle's own results, a seed reproduces its result and a
 * graph's replay draws anew); bad values of DOWNPOUR_SIM_ORDER and
 * DOWNPOUR_SIM_SEED are refused, naming the variable. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "device/backend.h"
#include "device/device_impl.h"
#include "device/dexec.h"
#include "downpour/layer_kind.h"
#include "downpour/dataset.h"
#include "downpour/device.h"
#include "downpour/layers.h"
#include "downpour/model.h"
#include "downpour/optim.h"
#include "downpour/rng.h"
#include "downpour/testhooks.h"

/* |tally - forward's| / |forward's|: a sum of ~100 doubles of a few units
 * each in another order moves by ~1e-15. */
#define TALLY_RTOL 1e-12

#define WHAT 160 /* room for a name of an output */

/* ---- what one run under one order produced ---- */

typedef struct segment {
    char what[WHAT];
    size_t at, n; /* floats of rec.f */
} segment;

typedef struct rec {
    float *f;
    size_t n, cap;
    segment seg[192];
    int nseg;
    double tally[32];
    char tally_what[32][WHAT];
    int ntally;
} rec;

static rec *cur; /* the run being recorded */

static void keep(const char *what, const float *p, size_t n)
{
    if (cur->n + n > cur->cap) {
        size_t cap = 2 * (cur->n + n);
        REQUIRE((cur->f = realloc(cur->f, cap * sizeof *cur->f)) != NULL);
        cur->cap = cap;
    }
    REQUIRE(cur->nseg < 192);
    segment *s = &cur->seg[cur->nseg++];
    snprintf(s->what, sizeof s->what, "%s", what);
    s->at = cur->n;
    s->n = n;
    memcpy(cur->f + cur->n, p, n * sizeof *p);
    cur->n += n;
}

static void keep_tally(const char *what, double v)
{
    REQUIRE(cur->ntally < 32);
    snprintf(cur->tally_what[cur->ntally], sizeof cur->tally_what[0], "%s", what);
    cur->tally[cur->ntally++] = v;
}

/* ---- sim with every launch counted ---- */

static long launched[DP_K_COUNT];
static dp_backend be; /* dp_backend_sim, launch counted */
static void *ctx;
static dp_rng rng;

static void count_launch(void *c, const dp_kernel *k)
{
    if ((unsigned)k->id < DP_K_COUNT)
        launched[k->id]++;
    dp_backend_sim.launch(c, k);
}

static void set_order(const char *order, const char *seed)
{
    dp_hook_set("DOWNPOUR_SIM_ORDER", order, NULL);
    dp_hook_set("DOWNPOUR_SIM_SEED", seed, NULL);
}

static void *open_sim(void)
{
    void *c;
    char msg[256];
    if (dp_backend_sim.open(&c, 0, msg, sizeof msg) < 0) {
        fprintf(stderr, "sim: %s\n", msg);
        exit(1);
    }
    return c;
}

static void go(const dp_kernel *k) { be.launch(ctx, k); }

static void sync_ok(void)
{
    char msg[256];
    CHECKF(be.sync(ctx, msg, sizeof msg) == 0, "sim: %s", msg);
}

static float *falloc(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof *p);
    REQUIRE(p);
    return p;
}

/* n floats in [lo, hi), from the run's rng (the same in every order). */
static float *rnd(size_t n, float lo, float hi)
{
    float *p = falloc(n);
    for (size_t i = 0; i < n; i++)
        p[i] = lo + (hi - lo) * dp_rng_uniform(&rng);
    return p;
}

/* ---- every kernel, launched directly ---- */

static void gathers(void)
{
    enum { N = 50, DIM = 37, ROWS = 13 };
    uint8_t images[N * DIM], labels[N], y[ROWS];
    for (int i = 0; i < N * DIM; i++)
        images[i] = (uint8_t)dp_rng_below(&rng, 256);
    for (int i = 0; i < N; i++)
        labels[i] = (uint8_t)dp_rng_below(&rng, 10);
    float *values = rnd((size_t)N * DIM, -3, 3);
    uint32_t idx[ROWS];
    for (int i = 0; i < ROWS; i++)
        idx[i] = dp_rng_below(&rng, N);
    for (int f32 = 0; f32 < 2; f32++) {
        float *x = rnd((size_t)ROWS * DIM, -1, 1);
        double tally[DP_TALLY_DOUBLES] = {1.25, 3, 10.5, 7};
        memset(y, 0xee, sizeof y);
        dp_kernel k = {.id = f32 ? DP_K_GATHER_F32 : DP_K_GATHER, .items = (long)ROWS * DIM};
        k.u.gather = (dp_ka_gather){x, y, images, values, labels, idx, DIM, tally};
        go(&k);
        sync_ok();
        keep(f32 ? "GATHER_F32 x" : "GATHER x", x, (size_t)ROWS * DIM);
        float yf[ROWS], tf[DP_TALLY_DOUBLES];
        for (int i = 0; i < ROWS; i++)
            yf[i] = y[i];
        for (int i = 0; i < DP_TALLY_DOUBLES; i++)
            tf[i] = (float)tally[i]; /* exact: one addition of small halves */
        keep("GATHER y", yf, ROWS);
        keep("GATHER's tally opened (dp_tally_open)", tf, DP_TALLY_DOUBLES);
        free(x);
    }
    free(values);
}

static void elementwise(void)
{
    size_t n = 1001;
    float *p = rnd(n, -1, 1);
    dp_kernel k = {.id = DP_K_SCALE, .items = (long)n};
    k.u.scale = (dp_ka_scale){p, 0.37f};
    go(&k);
    sync_ok();
    keep("SCALE", p, n);
    k = (dp_kernel){.id = DP_K_FILL, .items = (long)n - 3};
    k.u.fill = (dp_ka_fill){p, -2.5f};
    go(&k);
    sync_ok();
    keep("FILL", p, n);
    free(p);

    /* BIAS_ACT in place (as always), with and without its relu */
    for (int relu = 0; relu < 2; relu++) {
        long rows = 9, cols = 37;
        float *out = rnd((size_t)(rows * cols), -1, 1), *b = rnd((size_t)cols, -0.5f, 0.5f);
        k = (dp_kernel){.id = DP_K_BIAS_ACT, .items = rows * cols};
        k.u.bias_act = (dp_ka_bias_act){out, b, cols, relu};
        go(&k);
        sync_ok();
        keep(relu ? "BIAS_ACT relu" : "BIAS_ACT", out, (size_t)(rows * cols));
        free(out), free(b);
    }

    /* RELU and RELU_BWD apart and in place (dmodel.c runs RELU_BWD in place) */
    n = 4099;
    for (int alias = 0; alias < 2; alias++) {
        float *in = rnd(n, -1, 1), *out = alias ? in : rnd(n, -1, 1);
        in[0] = -0.0f;
        in[1] = NAN;
        k = (dp_kernel){.id = DP_K_RELU, .items = (long)n};
        k.u.relu = (dp_ka_relu){out, in};
        go(&k);
        sync_ok();
        keep(alias ? "RELU in place" : "RELU", out, n);
        float *dout = rnd(n, -1, 1), *din = alias ? dout : rnd(n, -1, 1);
        k = (dp_kernel){.id = DP_K_RELU_BWD, .items = (long)n};
        k.u.relu_bwd = (dp_ka_relu_bwd){din, dout, out};
        go(&k);
        sync_ok();
        keep(alias ? "RELU_BWD in place" : "RELU_BWD", din, n);
        if (!alias)
            free(out), free(din);
        free(in), free(dout);
    }

    /* DROPOUT apart and in place */
    n = 2001;
    for (int alias = 0; alias < 2; alias++) {
        uint64_t key = dp_rng_u64(&rng);
        float *in = rnd(n, -1, 1), *out = alias ? in : rnd(n, -1, 1);
        k = (dp_kernel){.id = DP_K_DROPOUT, .items = (long)n};
        k.u.dropout = (dp_ka_dropout){out, in, &key, (uint64_t)(0.3 * 4294967296.0), 1.0f / 0.7f};
        go(&k);
        sync_ok();
        keep(alias ? "DROPOUT in place" : "DROPOUT", out, n);
        if (!alias)
            free(out);
        free(in);
    }

    /* EMA */
    float *a = rnd(1001, -1, 1), *q = rnd(1001, -1, 1);
    k = (dp_kernel){.id = DP_K_EMA, .items = 1001};
    k.u.ema = (dp_ka_ema){a, q, 0.9f, 1.0f - 0.9f};
    go(&k);
    sync_ok();
    keep("EMA", a, 1001);
    free(a), free(q);
}

/* XENT_FWD (probabilities apart and over the logits, with labels and
 * without) and XENT_BWD (apart and over the probabilities). */
static void xent(void)
{
    enum { ROWS = 33, CLASSES = 10 };
    size_t n = (size_t)ROWS * CLASSES;
    uint8_t y[ROWS];
    for (int r = 0; r < ROWS; r++)
        y[r] = (uint8_t)dp_rng_below(&rng, CLASSES);
    for (int alias = 0; alias < 2; alias++)
        for (int labels = 0; labels < 2; labels++) {
            float *z = rnd(n, -6, 6), *p = alias ? z : rnd(n, -1, 1);
            z[3] = z[4] = 7.0f; /* a tie in row 0 */
            double tally[2] = {0.5, 1};
            dp_kernel k = {.id = DP_K_XENT_FWD, .items = ROWS};
            k.u.xent_fwd = (dp_ka_xent_fwd){p, z, labels ? y : NULL, tally, CLASSES};
            go(&k);
            sync_ok();
            char what[WHAT];
            snprintf(what, sizeof what, "XENT_FWD%s%s", alias ? " in place" : "",
                     labels ? "" : " without labels");
            keep(what, p, n);
            snprintf(what, sizeof what, "XENT_FWD%s loss tally", alias ? " in place" : "");
            if (labels) {
                keep_tally(what, tally[0]);
                float correct = (float)tally[1]; /* a count: exact */
                keep("XENT_FWD correct tally", &correct, 1);
            }
            float *d = alias ? p : rnd(n, -1, 1);
            k = (dp_kernel){.id = DP_K_XENT_BWD, .items = (long)n};
            k.u.xent_bwd = (dp_ka_xent_bwd){d, p, y, CLASSES, 1.0f / ROWS};
            go(&k);
            sync_ok();
            keep(alias ? "XENT_BWD in place" : "XENT_BWD", d, n);
            if (!alias)
                free(p), free(d);
            free(z);
        }
}

/* Each optimiser's kernel over three updates: parameters and state. */
static void optimisers(void)
{
    static const dp_kernel_id ids[DP_OPTIM_COUNT] = {DP_K_SGD,     DP_K_MOMENTUM, DP_K_NESTEROV,
                                                     DP_K_ADAGRAD, DP_K_ADAM,     DP_K_ADAM};
    size_t n = 1003;
    for (int kind = 0; kind < DP_OPTIM_COUNT; kind++) {
        dp_optim_config cfg = dp_optim_defaults((dp_optim_kind)kind);
        float *p = rnd(n, -1, 1), *s = rnd(2 * n, 0, 0.01f);
        for (int step = 0; step < 3; step++) {
            float *g = rnd(n, -0.1f, 0.1f);
            dp_step_block blk = {0.01f * (1 + step), 0.003f, step == 1 ? 0.5f : 1.0f, 0};
            dp_kernel k = {.id = ids[kind], .items = (long)n};
            k.u.optim = (dp_ka_optim){p, g, s, s + n, &blk, cfg.momentum, cfg.beta1, cfg.beta2,
                                      cfg.eps, 0, cfg.weight_decay, kind == DP_OPTIM_ADAMW};
            go(&k);
            sync_ok();
            free(g);
        }
        char what[WHAT];
        snprintf(what, sizeof what, "%s parameters", dp_optim_kind_name(cfg.kind));
        keep(what, p, n);
        snprintf(what, sizeof what, "%s state", dp_optim_kind_name(cfg.kind));
        keep(what, s, 2 * n);
        free(p), free(s);
    }
}

/* The windowed kernels and the layout change, over geometries with padding,
 * strides and overlapping windows; the pools over inputs full of ties. */
static void windows(void)
{
    static const int geo[][7] = {/* c, h, w, kh, kw, stride, pad */
                                 {3, 9, 8, 3, 3, 2, 1},
                                 {2, 7, 7, 2, 2, 2, 0},
                                 {1, 6, 5, 3, 2, 1, 1},
                                 {4, 5, 6, 3, 3, 1, 1}};
    const int batch = 3;
    for (size_t t = 0; t < sizeof geo / sizeof geo[0]; t++) {
        const int *q = geo[t];
        dp_window g;
        REQUIRE(dp_window_init(&g, q[0], q[1], q[2], q[3], q[4], q[5], q[6]) == 0);
        dp_kwin kw = {g.c, g.h, g.w, g.kh, g.kw, g.stride, g.pad, g.oh, g.ow};
        size_t nin = (size_t)batch * g.h * g.w * g.c, nout = (size_t)batch * g.oh * g.ow * g.c;
        size_t nrows = (size_t)batch * g.oh * g.ow * g.kh * g.kw * g.c;
        float *in = falloc(nin);
        for (size_t i = 0; i < nin; i++) { /* {0, 0.5, 1, 1.5}, half of them 0: ties */
            uint32_t v = dp_rng_below(&rng, 8);
            in[i] = v < 4 ? 0.0f : 0.5f * (float)(v - 4);
        }
        float *rows = rnd(nrows, -1, 1), *drows = rnd(nrows, -1, 1), *din = rnd(nin, -1, 1);
        float *fout = rnd(nout, -1, 1), *aout = rnd(nout, -1, 1), *dout = rnd(nout, -1, 1);
        dp_kernel k;
        memset(&k, 0, sizeof k);
        k.u.window.g = kw;
        char what[WHAT];
#define WIN(ID, COUNT, DST, SRC, GRAD, FOUT, name)                                               \
    do {                                                                                         \
        k.id = DP_K_##ID;                                                                        \
        k.items = (long)(COUNT);                                                                 \
        k.u.window.dst = DST;                                                                    \
        k.u.window.src = SRC;                                                                    \
        k.u.window.grad = GRAD;                                                                  \
        k.u.window.fout = FOUT;                                                                  \
        go(&k);                                                                                  \
        sync_ok();                                                                               \
        snprintf(what, sizeof what, "%s, geometry %zu", name, t);                                \
        keep(what, DST, COUNT);                                                                  \
    } while (0)
        WIN(IM2ROW, nrows, rows, in, NULL, NULL, "IM2ROW");
        WIN(ROW2IM, nin, din, NULL, drows, NULL, "ROW2IM");
        WIN(MAXPOOL_FWD, nout, fout, in, NULL, NULL, "MAXPOOL_FWD");
        WIN(MAXPOOL_BWD, nin, din, in, dout, fout, "MAXPOOL_BWD");
        WIN(AVGPOOL_FWD, nout, aout, in, NULL, NULL, "AVGPOOL_FWD");
        WIN(AVGPOOL_BWD, nin, din, NULL, dout, NULL, "AVGPOOL_BWD");
#undef WIN
        for (int to_chw = 0; to_chw < 2; to_chw++) {
            float *out = rnd(nin, -1, 1);
            memset(&k, 0, sizeof k);
            k.id = DP_K_LAYOUT;
            k.items = (long)nin;
            k.u.layout = (dp_ka_layout){out, din, g.c, g.h * g.w, to_chw};
            go(&k);
            sync_ok();
            snprintf(what, sizeof what, "LAYOUT to_chw %d, geometry %zu", to_chw, t);
            keep(what, out, nin);
            free(out);
        }
        free(in), free(rows), free(drows), free(din), free(fout), free(aout), free(dout);
    }
}

/* lcn's eleven kernels through its kind's device kernels (layer_lcn.c): the output, the input gradient and
 * the whole keep (v, s, the scratch maps, mean, gm), a batch below max_batch. */
static void lcn(void)
{
    static const int geo[][4] = {{1, 12, 12, 5}, {3, 7, 9, 3}, {16, 6, 5, 5}};
    for (size_t t = 0; t < sizeof geo / sizeof geo[0]; t++) {
        dp_layer L;
        memset(&L, 0, sizeof L);
        L.kind = DP_LAYER_LCN;
        REQUIRE(dp_window_init(&L.win, geo[t][0], geo[t][1], geo[t][2], geo[t][3], geo[t][3], 1,
                               geo[t][3] / 2) == 0);
        L.in = L.out = L.win.c * L.win.h * L.win.w;
        int batch = 3, max_batch = 4;
        const dp_layer_ops *o = dp_layer_table[DP_LAYER_LCN];
        size_t len = (size_t)batch * L.in, kf = o->dev_keep(&L, max_batch);
        float *x = rnd(len, -2, 2), *dout = rnd(len, -1, 1), *out = rnd(len, -1, 1);
        float *din = rnd(len, -1, 1), *keepf = rnd(kf, -1, 1);
        dp_dexec ex = {.be = &be, .ctx = ctx};
        REQUIRE(o->dev_init(&ex, &L, keepf, max_batch) == 0);
        dp_layer_call c = {.d = &L, .batch = batch, .in = x, .out = out, .keep = keepf,
                           .max_batch = max_batch, .dout = dout, .din = din};
        o->dev_forward(&ex, &c);
        sync_ok();
        char what[WHAT];
        snprintf(what, sizeof what, "lcn%d over %dx%dx%d forward", geo[t][3], geo[t][0],
                 geo[t][1], geo[t][2]);
        keep(what, out, len);
        o->dev_backward(&ex, &c);
        sync_ok();
        snprintf(what, sizeof what, "lcn%d over %dx%dx%d backward", geo[t][3], geo[t][0],
                 geo[t][1], geo[t][2]);
        keep(what, din, len);
        snprintf(what, sizeof what, "lcn%d over %dx%dx%d keep", geo[t][3], geo[t][0], geo[t][1],
                 geo[t][2]);
        keep(what, keepf, kf);
        free(x), free(dout), free(out), free(din), free(keepf);
    }
}

/* batch norm's four kernels through its kind's device kernels
 * (layer_batchnorm.c): output, statistics, running statistics, and the
 * backward's gradients, over features and over channels of an image. */
static void bn(void)
{
    static const int geo[][4] = {{5, 1, 1, 7}, {3, 4, 5, 2}}; /* C, h, w, batch */
    for (size_t t = 0; t < sizeof geo / sizeof geo[0]; t++) {
        int C = geo[t][0], batch = geo[t][3];
        dp_layer L;
        memset(&L, 0, sizeof L);
        L.kind = DP_LAYER_BATCHNORM;
        L.c = L.oc = C, L.h = L.oh = geo[t][1], L.w = L.ow = geo[t][2];
        L.in = L.out = C * L.h * L.w;
        L.w_len = L.b_len = (size_t)C;
        L.s_len = 2 * (size_t)C + 1;
        const dp_layer_ops *o = dp_layer_table[DP_LAYER_BATCHNORM];
        size_t len = (size_t)batch * L.in, kf = o->dev_keep(&L, batch);
        float *x = rnd(len, -2, 2), *dout = rnd(len, -1, 1), *out = rnd(len, -1, 1);
        float *din = rnd(len, -1, 1), *keepf = rnd(kf, -1, 1), *wb = rnd(2 * (size_t)C, 0, 2);
        float *gwb = rnd(2 * (size_t)C, -1, 1), *state = rnd(L.s_len, 0, 1);
        dp_dexec ex = {.be = &be, .ctx = ctx};
        dp_layer_call c = {.d = &L, .batch = batch, .in = x, .out = out, .keep = keepf,
                           .state = state, .w = wb, .b = wb + C, .gw = gwb, .gb = gwb + C,
                           .dout = dout, .din = din, .train = 1};
        o->dev_forward(&ex, &c);
        sync_ok();
        char what[WHAT];
        snprintf(what, sizeof what, "bn over %d channels of %dx%d forward", C, L.h, L.w);
        keep(what, out, len);
        snprintf(what, sizeof what, "bn over %d channels of %dx%d keep and buffers", C, L.h,
                 L.w);
        keep(what, keepf, kf);
        keep(what, state, L.s_len);
        o->dev_backward(&ex, &c);
        sync_ok();
        snprintf(what, sizeof what, "bn over %d channels of %dx%d backward", C, L.h, L.w);
        keep(what, din, len);
        keep(what, gwb, 2 * (size_t)C);
        free(x), free(dout), free(out), free(din), free(keepf), free(wb), free(gwb), free(state);
    }
}

/* The element-wise activations' kernels (layer_activations.c), gap's,
 * ln's and res's, forward and backward, through their kinds. */
static void acts(void)
{
    static const dp_layer_kind kinds[] = {DP_LAYER_TANH, DP_LAYER_SIGMOID, DP_LAYER_GELU};
    for (size_t t = 0; t < sizeof kinds / sizeof kinds[0]; t++) {
        dp_layer L;
        memset(&L, 0, sizeof L);
        L.kind = kinds[t];
        L.c = L.oc = 3, L.h = L.oh = 5, L.w = L.ow = 7;
        L.in = L.out = 105;
        const dp_layer_ops *o = dp_layer_table[kinds[t]];
        size_t len = 3 * (size_t)L.in;
        float *x = rnd(len, -3, 3), *dout = rnd(len, -1, 1), *out = rnd(len, -1, 1);
        float *din = rnd(len, -1, 1);
        dp_dexec ex = {.be = &be, .ctx = ctx};
        dp_layer_call c = {.d = &L, .batch = 3, .in = x, .out = out, .dout = dout, .din = din};
        o->dev_forward(&ex, &c);
        o->dev_backward(&ex, &c);
        sync_ok();
        char what[WHAT];
        snprintf(what, sizeof what, "%s forward", o->name);
        keep(what, out, len);
        snprintf(what, sizeof what, "%s backward", o->name);
        keep(what, din, len);
        free(x), free(dout), free(out), free(din);
    }
    /* gap over 5 channels of 3x7 (layer_gap.c) */
    dp_layer L;
    memset(&L, 0, sizeof L);
    L.kind = DP_LAYER_GAP;
    L.c = L.oc = 5, L.h = 3, L.w = 7, L.oh = L.ow = 1;
    L.in = 105, L.out = 5;
    const dp_layer_ops *o = dp_layer_table[DP_LAYER_GAP];
    float *x = rnd(3 * 105, -3, 3), *dout = rnd(3 * 5, -1, 1), *out = rnd(3 * 5, -1, 1);
    float *din = rnd(3 * 105, -1, 1);
    dp_dexec ex = {.be = &be, .ctx = ctx};
    dp_layer_call c = {.d = &L, .batch = 3, .in = x, .out = out, .dout = dout, .din = din};
    o->dev_forward(&ex, &c);
    o->dev_backward(&ex, &c);
    sync_ok();
    keep("gap forward", out, 3 * 5);
    keep("gap backward", din, 3 * 105);
    free(x), free(dout), free(out), free(din);
    /* ln over 11 features (layer_ln.c): output, keep, gradients */
    memset(&L, 0, sizeof L);
    L.kind = DP_LAYER_LAYERNORM;
    L.c = L.oc = 11, L.h = L.w = L.oh = L.ow = 1;
    L.in = L.out = 11;
    L.w_len = L.b_len = 11;
    o = dp_layer_table[DP_LAYER_LAYERNORM];
    x = rnd(4 * 11, -3, 3), dout = rnd(4 * 11, -1, 1), out = rnd(4 * 11, -1, 1);
    din = rnd(4 * 11, -1, 1);
    float *wb = rnd(22, 0, 2), *gwb = rnd(22, -1, 1), *kp = rnd(o->dev_keep(&L, 4), -1, 1);
    c = (dp_layer_call){.d = &L, .batch = 4, .in = x, .out = out, .dout = dout, .din = din,
                        .w = wb, .b = wb + 11, .gw = gwb, .gb = gwb + 11, .keep = kp};
    o->dev_forward(&ex, &c);
    o->dev_backward(&ex, &c);
    sync_ok();
    keep("ln forward", out, 4 * 11);
    keep("ln keep", kp, 8);
    keep("ln backward", din, 4 * 11);
    keep("ln gradients", gwb, 22);
    free(x), free(dout), free(out), free(din), free(wb), free(gwb), free(kp);
    /* a residual block's sum over 3 records of 35 (layer_res.c) */
    memset(&L, 0, sizeof L);
    L.kind = DP_LAYER_RES;
    L.c = L.oc = 35, L.h = L.w = L.oh = L.ow = 1;
    L.in = L.out = 35;
    o = dp_layer_table[DP_LAYER_RES];
    x = rnd(3 * 35, -3, 3), out = rnd(3 * 35, -1, 1), din = rnd(3 * 35, -1, 1);
    c = (dp_layer_call){.d = &L, .batch = 3, .in = x, .skip = din, .out = out};
    o->dev_forward(&ex, &c);
    sync_ok();
    keep("res forward", out, 3 * 35);
    free(x), free(out), free(din);
}

/* pos's, emb's and mha's kernels (layer_pos.c, layer_emb.c, layer_mha.c),
 * forward and backward, through their kinds; emb's ids include bad ones
 * (counted). */
static void tokens(void)
{
    dp_model m;
    dp_err err;
    REQUIRE(dp_model_init(&m, "6-emb9x4-pos-mha2-3", 4, 1, &err) == 0);
    float ones[24]; /* mha's bias gradients: every token of the batch */
    for (int i = 0; i < 24; i++)
        ones[i] = 1.0f;
    dp_dexec ex = {.be = &be, .ctx = ctx, .ones = ones, .ones_len = 24};
    for (int l = 0; l < 3; l++) {
        const dp_layer *L = &m.layers[l];
        const dp_layer_ops *o = dp_layer_ops_of(L);
        size_t nin = 4 * (size_t)L->in, nout = 4 * (size_t)L->out, np = L->w_len + L->b_len;
        float *x = rnd(nin, -2, 11), *dout = rnd(nout, -1, 1), *out = rnd(nout, -1, 1);
        float *din = rnd(nin, -1, 1), *w = rnd(np, -1, 1), *gw = rnd(np, -1, 1);
        size_t kf = o->dev_keep ? o->dev_keep(L, 4) : 1;
        float *kp = rnd(kf, -1, 1);
        dp_layer_call c = {.d = L, .batch = 4, .in = x, .out = out, .dout = dout, .din = din,
                           .w = w, .b = w + L->w_len, .gw = gw, .gb = gw + L->w_len,
                           .keep = kp, .max_batch = 4};
        o->dev_forward(&ex, &c);
        o->dev_backward(&ex, &c);
        sync_ok();
        char what[WHAT];
        snprintf(what, sizeof what, "%s forward", o->name);
        keep(what, out, nout);
        snprintf(what, sizeof what, "%s backward", o->name);
        keep(what, din, nin);
        keep(what, gw, np);
        if (o->dev_keep)
            keep(what, kp, kf);
        free(x), free(dout), free(out), free(din), free(w), free(gw), free(kp);
    }
    dp_model_free(&m);
}

/* ---- whole training steps through the executor (dmodel.c) ---- */

#define STEPS 5

/* STEPS steps of `batch` records (the last short, so it runs without the
 * graph the others replay) of spec on a sim device; then the parameters,
 * optimiser state, the average (ema) and the tallies. */
static void train(const char *spec, dp_optim_kind kind, int batch, int floats, int ema)
{
    dp_model m;
    dp_err err;
    if (dp_model_init(&m, spec, batch, 1, &err) < 0) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    dp_model_init_params(&m, 7);
    uint32_t records = 200, dim = (uint32_t)m.layers[0].in;
    uint8_t *images = malloc((size_t)records * dim), *labels = malloc(records);
    REQUIRE(images && labels);
    for (size_t i = 0; i < (size_t)records * dim; i++)
        images[i] = (uint8_t)dp_rng_below(&rng, 256);
    for (uint32_t i = 0; i < records; i++)
        labels[i] = (uint8_t)dp_rng_below(&rng, 10);
    float *values = floats ? rnd((size_t)records * dim, 0, 1) : NULL;
    dp_split split = {.labels = labels, .n = records, .dim = dim};
    if (floats)
        split.values = values;
    else
        split.images = images;

    dp_device_spec ds;
    dp_device *dev;
    REQUIRE(dp_device_parse("sim", &ds, &err) == 0);
    if (dp_device_open(&dev, &ds, &err) < 0) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    dp_optim_config cfg = dp_optim_defaults(kind);
    dp_dmodel *g;
    if (dp_dmodel_open(&g, dev, &m, &cfg, &err) < 0) {
        fprintf(stderr, "dp_dmodel_open %s: %s\n", spec, err.msg);
        exit(1);
    }
    REQUIRE(dp_dmodel_load_split(g, &split, &err) == 0);
    if (ema)
        REQUIRE(dp_dmodel_ema_start(g, 0.9f, NULL, &err) == 0);
    uint32_t idx[256];
    for (int step = 0; step < STEPS; step++) {
        int n = step == STEPS - 1 ? batch - 3 : batch;
        for (int i = 0; i < n; i++)
            idx[i] = dp_rng_below(&rng, records);
        REQUIRE(dp_dmodel_stage(g, idx, n, &err) == 0);
        CHECKF(dp_dmodel_step(g, cfg.lr, &err) == 0, "%s step %d: %s", spec, step, err.msg);
    }
    size_t np = m.n_params;
    int slots = dp_optim_slots(kind);
    float *buf = falloc((slots > 1 ? (size_t)slots : 1) * np);
    char what[WHAT];
    REQUIRE(dp_dmodel_get_params(g, buf, &err) == 0);
    snprintf(what, sizeof what, "%s parameters", spec);
    keep(what, buf, np);
    long t = 0;
    REQUIRE(dp_dmodel_get_optim(g, buf, &t, &err) == 0);
    snprintf(what, sizeof what, "%s optimiser state", spec);
    keep(what, buf, (size_t)slots * np);
    if (ema) {
        REQUIRE(dp_dmodel_get_ema(g, buf, &err) == 0);
        snprintf(what, sizeof what, "%s --ema average", spec);
        keep(what, buf, np);
    }
    double loss = 0;
    long correct = 0;
    REQUIRE(dp_dmodel_collect(g, &loss, &correct, &err) == 0);
    snprintf(what, sizeof what, "%s loss tally", spec);
    keep_tally(what, loss);
    float fc = (float)correct; /* a count below 2^24: exact */
    snprintf(what, sizeof what, "%s correct tally", spec);
    keep(what, &fc, 1);
    dp_dmodel_close(g);
    dp_device_close(dev);
    dp_model_free(&m);
    free(buf), free(images), free(labels), free(values);
}

/* Everything above under one order, recorded in r. */
static void run_all(rec *r, const char *order, const char *seed)
{
    memset(r, 0, sizeof *r);
    cur = r;
    set_order(order, seed);
    memset(launched, 0, sizeof launched);
    dp_rng_seed(&rng, 2024); /* the same inputs in every order */
    ctx = open_sim();
    gathers();
    elementwise();
    xent();
    optimisers();
    windows();
    lcn();
    bn();
    acts();
    tokens();
    be.close(ctx);
    ctx = NULL;
    /* every kernel ran (a kernel added to DP_KERNELS needs a case here) */
    for (int id = 0; id < DP_K_COUNT; id++)
        CHECKF(launched[id] > 0, "kernel id %d was not launched", id);
    /* an MLP: a dense with a fused relu, dropout, then a relu of its own */
    train("784-dense64-dropout0.3-relu-32-10", DP_OPTIM_ADAM, 32, 0, 1);
    /* a CNN with every image layer: hwc (2 channels), conv, avgpool, local,
     * lcn, maxpool, flatten; float records (GATHER_F32) */
    train("2x12x12-conv3x3x4p1-relu-avgpool2-local3x3x4-relu-lcn3-maxpool2-16-10",
          DP_OPTIM_MOMENTUM, 16, 1, 0);
    /* the model zoo's (docs/models.md) */
    train("mlp-300-100", DP_OPTIM_SGD, 64, 0, 0);
    train("cnn-mnist", DP_OPTIM_NESTEROV, 8, 0, 0);
    train("distbelief-image", DP_OPTIM_ADAGRAD, 4, 0, 0);
    /* batch norm after a conv and after a dense layer */
    train("2x8x8-conv3x3x4p1-bn-relu-maxpool2-dense16-bn-relu-10", DP_OPTIM_ADAM, 8, 1, 0);
    /* the element-wise activations after a conv and after dense layers */
    train("1x8x8-conv3x3x4-gelu-maxpool2-dense16-tanh-dense8-sigmoid-10", DP_OPTIM_ADAM, 8, 0,
          0);
    train("2x8x8-conv3x3x4p1-relu-gap-10", DP_OPTIM_MOMENTUM, 8, 0, 0);
    train("784-dense32-ln-gelu-dense16-ln-10", DP_OPTIM_ADAM, 16, 0, 0);
    /* tokens: patches, positions, ln over each token; ids (bytes: some clamped) */
    train("1x8x8-conv2x2x6s2-pos-ln-gelu-gap-10", DP_OPTIM_ADAM, 8, 0, 0);
    train("12-emb200x6-pos-ln-gap-10", DP_OPTIM_ADAM, 8, 0, 0);
    train("1x4x4-conv1x1x6-pos-ln-mha3-ln-gap-10", DP_OPTIM_ADAM, 4, 0, 0);
    /* residual blocks: identity and projection shortcuts, bn inside */
    train("1x8x8-conv3x3x4p1-bn-relu-res(conv3x3x4p1-bn-relu-conv3x3x4p1-bn)-relu"
          "-res(conv3x3x6s2p1-bn|conv1x1x6s2-bn)-relu-gap-10",
          DP_OPTIM_MOMENTUM, 8, 0, 0);
}

/* run b against forward's run a: every float the same bits, the tallies
 * within TALLY_RTOL. */
static void compare(const rec *a, const rec *b, const char *order)
{
    REQUIRE(a->nseg == b->nseg && a->n == b->n && a->ntally == b->ntally);
    int differ = 0;
    for (int s = 0; s < a->nseg; s++) {
        const segment *sa = &a->seg[s];
        for (size_t i = 0; i < sa->n; i++) {
            const float *x = a->f + sa->at + i, *y = b->f + sa->at + i;
            if (memcmp(x, y, sizeof *x) != 0) {
                CHECKF(0, "%s: %s differs from forward's at %zu of %zu: %.9g, forward %.9g",
                       order, sa->what, i, sa->n, (double)*y, (double)*x);
                differ++;
                break;
            }
        }
    }
    double worst = 0;
    for (int t = 0; t < a->ntally; t++) {
        double e = fabs(b->tally[t] - a->tally[t]) / fabs(a->tally[t]);
        CHECKF(e <= TALLY_RTOL, "%s: %s %.17g, forward's %.17g (relative %.3g > %g)", order,
               a->tally_what[t], b->tally[t], a->tally[t], e, TALLY_RTOL);
        worst = e > worst ? e : worst;
    }
    printf("  %-16s %d outputs (%zu floats): %s; %d tallies: max relative difference %.3g "
           "(bound %g)\n",
           order, a->nseg, a->n, differ ? "DIFFER" : "the same bits", a->ntally, worst,
           TALLY_RTOL);
}

/* ---- the order modes themselves ---- */

/* SCALE by 2 doubles each item exactly once, whatever n. */
static void test_permutations(void)
{
    static const char *const modes[] = {"reverse", "shuffle"};
    long sizes[64];
    int ns = 0;
    for (long n = 1; n <= 40; n++)
        sizes[ns++] = n;
    long more[] = {64, 97, 100, 128, 210, 720, 1000, 1024, 2310, 4099, 30030};
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++)
        sizes[ns++] = more[i];
    for (int m = 0; m < 2; m++) {
        set_order(modes[m], "3");
        void *c = open_sim();
        int bad = 0;
        for (int rep = 0; rep < 3; rep++)
            for (int s = 0; s < ns; s++) {
                long n = sizes[s];
                float *p = falloc((size_t)n);
                for (long i = 0; i < n; i++)
                    p[i] = (float)(i + 1);
                dp_kernel k = {.id = DP_K_SCALE, .items = n};
                k.u.scale = (dp_ka_scale){p, 2.0f};
                dp_backend_sim.launch(c, &k);
                for (long i = 0; i < n; i++)
                    if (p[i] != 2.0f * (float)(i + 1)) {
                        CHECKF(0, "%s over %ld items: item %ld became %g, not %g (visited %s)",
                               modes[m], n, i, (double)p[i], 2.0 * (double)(i + 1),
                               p[i] == (float)(i + 1) ? "never" : "more than once");
                        bad++;
                        break;
                    }
                free(p);
            }
        dp_backend_sim.close(c);
        printf("  %s: every item once, %d sizes from 1 to 30030, 3 draws each%s\n", modes[m],
               ns, bad ? ": NO" : "");
    }
}

/* A launch made order-dependent on purpose: GATHER_F32 of one float per row
 * with x over the records and idx[r] = r + 1, so item r copies record r+1,
 * which item r+1 overwrites.  Forward copies the originals (a shift by
 * one), reverse carries the last record to every row, shuffle neither. */
enum { PROBE = 101 };
static void probe(void *c, float *x)
{
    static uint32_t idx[PROBE];
    static uint8_t labels[PROBE + 1], y[PROBE];
    for (int r = 0; r < PROBE; r++)
        idx[r] = (uint32_t)r + 1;
    for (int r = 0; r <= PROBE; r++)
        x[r] = (float)r;
    dp_kernel k = {.id = DP_K_GATHER_F32, .items = PROBE};
    k.u.gather = (dp_ka_gather){.x = x, .y = y, .values = x, .labels = labels, .idx = idx,
                                .dim = 1};
    dp_backend_sim.launch(c, &k);
}

static void probe_under(const char *order, const char *seed, float *x)
{
    set_order(order, seed);
    void *c = open_sim();
    probe(c, x);
    dp_backend_sim.close(c);
}

static void test_orders_differ(void)
{
    float fw[PROBE + 1], rv[PROBE + 1], s1[PROBE + 1], s1b[PROBE + 1], s2[PROBE + 1];
    probe_under("forward", "1", fw);
    probe_under("reverse", "1", rv);
    probe_under("shuffle", "1", s1);
    probe_under("shuffle", "1", s1b);
    probe_under("shuffle", "2", s2);
    int shifted = 1, carried = 1;
    for (int r = 0; r < PROBE; r++) {
        shifted &= fw[r] == (float)(r + 1);
        carried &= rv[r] == (float)PROBE;
    }
    CHECKF(shifted, "forward: not a plain loop from item 0");
    CHECKF(carried, "reverse: not a loop from the last item down");
    CHECKF(memcmp(s1, fw, sizeof fw) && memcmp(s1, rv, sizeof fw),
           "shuffle: the order of forward or reverse");
    CHECKF(memcmp(s1, s1b, sizeof s1) == 0, "shuffle: the same seed, another order");
    CHECKF(memcmp(s1, s2, sizeof s1) != 0, "shuffle: seeds 1 and 2 gave the same order");

    /* a graph's replays draw anew, as a GPU schedules each launch anew */
    set_order("shuffle", "1");
    void *c = open_sim(), *graph = NULL;
    char msg[256];
    float a[PROBE + 1], b[PROBE + 1];
    REQUIRE(dp_backend_sim.capture_begin(c, msg, sizeof msg) == 0);
    probe(c, a);
    REQUIRE(dp_backend_sim.capture_end(c, &graph, msg, sizeof msg) == 0);
    for (int r = 0; r <= PROBE; r++)
        a[r] = (float)r;
    REQUIRE(dp_backend_sim.graph_launch(c, graph) == 0);
    memcpy(b, a, sizeof a);
    for (int r = 0; r <= PROBE; r++)
        a[r] = (float)r;
    REQUIRE(dp_backend_sim.graph_launch(c, graph) == 0);
    CHECKF(memcmp(a, b, sizeof a) != 0, "shuffle: two replays of a graph ran in one order");
    dp_backend_sim.graph_free(c, graph);
    dp_backend_sim.close(c);
    printf("  forward, reverse, shuffle (seeds 1, 2, and each replay) give their own orders; "
           "a seed repeats its own\n");
}

static void test_bad_values(void)
{
    void *c;
    char msg[256] = "";
    set_order("sideways", "1");
    CHECK(dp_backend_sim.open(&c, 0, msg, sizeof msg) == -1);
    CHECKF(strstr(msg, "DOWNPOUR_SIM_ORDER") && strstr(msg, "'sideways'") &&
               strstr(msg, "forward, reverse, shuffle"),
           "message: %s", msg);
    printf("  %s\n", msg);
    set_order("shuffle", "12x");
    CHECK(dp_backend_sim.open(&c, 0, msg, sizeof msg) == -1);
    CHECKF(strstr(msg, "DOWNPOUR_SIM_SEED") && strstr(msg, "'12x'"), "message: %s", msg);
    printf("  %s\n", msg);
    set_order("shuffle", "-4");
    CHECK(dp_backend_sim.open(&c, 0, msg, sizeof msg) == -1);
    /* through the device: the message reaches the caller */
    dp_device_spec ds;
    dp_device *dev;
    dp_err err;
    set_order("Reverse", "1");
    REQUIRE(dp_device_parse("sim", &ds, &err) == 0);
    CHECK(dp_device_open(&dev, &ds, &err) == -1);
    CHECKF(strstr(err.msg, "DOWNPOUR_SIM_ORDER") != NULL, "dp_device_open: %s", err.msg);
    /* unset and empty: forward */
    dp_hook_set("DOWNPOUR_SIM_ORDER", NULL, NULL);
    dp_hook_set("DOWNPOUR_SIM_SEED", NULL, NULL);
    REQUIRE(dp_backend_sim.open(&c, 0, msg, sizeof msg) == 0);
    dp_backend_sim.close(c);
    dp_hook_set("DOWNPOUR_SIM_ORDER", "", NULL);
    REQUIRE(dp_backend_sim.open(&c, 0, msg, sizeof msg) == 0);
    dp_backend_sim.close(c);
}

int main(void)
{
    be = dp_backend_sim;
    be.launch = count_launch;

    printf("the order modes:\n");
    test_permutations();
    test_orders_differ();
    test_bad_values();

    static const char *const orders[][2] = {
        {"forward", "1"}, {"reverse", "1"}, {"shuffle", "1"}, {"shuffle", "2"}};
    static rec runs[4];
    printf("every kernel (%d) and training steps of MLPs and CNNs, each order against "
           "forward:\n",
           (int)DP_K_COUNT);
    for (int o = 0; o < 4; o++) {
        run_all(&runs[o], orders[o][0], orders[o][1]);
        if (o > 0) {
            char name[32];
            snprintf(name, sizeof name, "%s%s%s", orders[o][0], o >= 2 ? " seed " : "",
                     o >= 2 ? orders[o][1] : "");
            compare(&runs[0], &runs[o], name);
        }
    }
    for (int o = 0; o < 4; o++)
        free(runs[o].f);
    dp_hook_set("DOWNPOUR_SIM_ORDER", NULL, NULL);
    dp_hook_set("DOWNPOUR_SIM_SEED", NULL, NULL);
    fflush(stdout);
    return CHECK_DONE();
}
