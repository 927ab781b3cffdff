/* The image layers' device code (their kinds' files, src/nn/layer_*.c, through
 * the layer table, and the kernel bodies in
 * kernels.h, "image layers") against the CPU engine, on a host backend:
 *   - the lowering, its adjoint and the pools over random geometries, against
 *     dp_im2row, dp_row2im and pool2d.c: the same bits (the bodies repeat the
 *     CPU's float operations in its order), ties included;
 *   - every image layer of cnn-mnist and of models with several channels,
 *     padding, strides, overlapping pools and local layers, forward and
 *     backward through dimage_* against the same layer run by
 *     dp_model_forward_range/backward_range, in one chunk and in chunks of
 *     two samples.  Layers without a product must match bit for bit; conv
 *     and local within PRODUCT_RTOL of the largest value (cuBLAS and
 *     OpenBLAS sum in different orders).
 *
 * The backend is private to this file (host memory, cblas_sgemm in column-
 * major order exactly as cublasSgemm, kernels run as a loop over the items
 * BACKWARDS so a body that leaned on the order of items would show). */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "device/backend.h"
#include "device/dexec.h"
#include "downpour/layer_kind.h"
#include "downpour/layers.h"
#include "downpour/model.h"
#include "downpour/rng.h"

/* Relative to the largest |value| of the CPU's result. */
#define PRODUCT_RTOL 1e-5

/* ---- the private host backend ---- */

static long launches[DP_K_COUNT]; /* per kernel, since the last reset */

static void *tb_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    return calloc(1, bytes ? bytes : 1);
}

static void tb_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

static int tb_copy(void *ctx, void *dst, const void *src, size_t bytes, dp_copy_dir dir)
{
    (void)ctx;
    (void)dir;
    memcpy(dst, src, bytes);
    return 0;
}

static int tb_sync(void *ctx, char *msg, size_t len)
{
    (void)ctx;
    (void)msg;
    (void)len;
    return 0;
}

static void tb_gemm(void *ctx, const dp_gemm *g)
{
    (void)ctx;
    cblas_sgemm(CblasColMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans,
                g->m, g->n, g->k, g->alpha, g->a, g->lda, g->b, g->ldb, g->beta, g->c, g->ldc);
}

static void tb_launch(void *ctx, const dp_kernel *k)
{
    (void)ctx;
    REQUIRE((unsigned)k->id < DP_K_COUNT);
    launches[k->id]++;
    switch (k->id) {
#define TB_CASE(ID, name)                                                                        \
    case DP_K_##ID:                                                                              \
        for (long i = k->items - 1; i >= 0; i--)                                                 \
            dp_k_##name(k, i);                                                                   \
        break;
        DP_KERNELS(TB_CASE)
#undef TB_CASE
    case DP_K_COUNT:
        break;
    }
}

static const dp_backend test_backend = {
    .abi = DP_BACKEND_ABI, .name = "test", .alloc = tb_alloc, .free = tb_free,
    .copy = tb_copy, .sync = tb_sync, .gemm = tb_gemm, .launch = tb_launch,
};

/* ---- helpers ---- */

static float *falloc(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof *p);
    REQUIRE(p);
    return p;
}

static void fill_uniform(float *x, size_t n, dp_rng *r, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * dp_rng_uniform(r);
}

/* Values in {0, 0.5, 1, 1.5}, half of them 0: windows full of ties. */
static void fill_ties(float *x, size_t n, dp_rng *r)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t v = dp_rng_below(r, 8);
        x[i] = v < 4 ? 0.0f : 0.5f * (float)(v - 4);
    }
}

static void fill_nan(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = NAN;
}

/* max |a - b| / max |b| (0 when both are all zero); infinite when a holds a
 * value that is not finite (b never does here). */
static double rel_err(const float *a, const float *b, size_t n)
{
    double err = 0, big = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]))
            return INFINITY;
        double d = fabs((double)a[i] - b[i]);
        err = d > err ? d : err;
        big = fabs(b[i]) > big ? fabs(b[i]) : big;
    }
    return big > 0 ? err / big : err;
}

/* The image kinds (conv, local, pools, layouts) that this test compares
 * layer by layer, and their device calls through the layer table
 * (layer_kind.h), as dmodel.c makes them. */
static int dimage_supported(dp_layer_kind k)
{
    return k == DP_LAYER_CONV || k == DP_LAYER_LOCAL || k == DP_LAYER_MAXPOOL ||
           k == DP_LAYER_AVGPOOL || k == DP_LAYER_FLATTEN || k == DP_LAYER_HWC;
}

static size_t dimage_scratch(const dp_layer *L, int max_batch)
{
    const dp_layer_ops *o = dp_layer_ops_of(L);
    return o->dev_scratch ? o->dev_scratch(L, max_batch) : 0;
}

static long dimage_ones(const dp_layer *L, int max_batch)
{
    const dp_layer_ops *o = dp_layer_ops_of(L);
    return o->dev_ones ? o->dev_ones(L, max_batch) : 0;
}

static dp_layer_call dimage_call(const dp_layer *L, const float *params, float *grads,
                                 const float *in, float *out, int batch)
{
    dp_layer_call c = {.d = L, .batch = batch, .in = in, .out = out};
    if (L->w_len && params)
        c.w = params + L->w_off, c.b = params + L->b_off;
    if (L->w_len && grads)
        c.gw = grads + L->w_off, c.gb = grads + L->b_off;
    return c;
}

static void dimage_forward(const dp_dexec *x, const dp_layer *L, const float *params,
                           const float *in, float *out, int batch, int relu)
{
    dp_layer_call c = dimage_call(L, params, NULL, in, out, batch);
    c.relu = relu;
    dp_layer_ops_of(L)->dev_forward(x, &c);
}

static void dimage_backward(const dp_dexec *x, const dp_layer *L, const float *params,
                            float *grads, const float *in, const float *out, const float *dout,
                            float *din, int batch)
{
    dp_layer_call c = dimage_call(L, params, grads, in, (float *)out, batch);
    c.dout = dout;
    c.din = din;
    dp_layer_ops_of(L)->dev_backward(x, &c);
}

static int same_bits(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof *a) == 0;
}

/* The executor's state for a model (or one layer): scratch and ones sized by
 * dimage_scratch and dimage_ones, as dmodel.c sizes them. */
typedef struct test_exec {
    dp_dexec x;
    size_t full_rows; /* floats of rows/drows allocated */
    long full_ones;
} test_exec;

static void exec_open(test_exec *t, const dp_layer *layers, int n, int max_batch)
{
    memset(t, 0, sizeof *t);
    for (int l = 0; l < n; l++) {
        size_t s = dimage_scratch(&layers[l], max_batch);
        long o = dimage_ones(&layers[l], max_batch);
        t->full_rows = s > t->full_rows ? s : t->full_rows;
        t->full_ones = o > t->full_ones ? o : t->full_ones;
    }
    const dp_backend *be = &test_backend;
    t->x.be = be;
    REQUIRE(be->open == NULL || be->open(&t->x.ctx, 0, NULL, 0) == 0);
    t->x.rows = be->alloc(t->x.ctx, t->full_rows * sizeof(float));
    t->x.drows = be->alloc(t->x.ctx, t->full_rows * sizeof(float));
    float *ones = be->alloc(t->x.ctx, (size_t)t->full_ones * sizeof(float));
    REQUIRE(t->x.rows && t->x.drows && ones);
    dp_kernel k;
    memset(&k, 0, sizeof k);
    k.id = DP_K_FILL;
    k.items = t->full_ones;
    k.u.fill.p = ones;
    k.u.fill.value = 1.0f;
    be->launch(t->x.ctx, &k);
    t->x.ones = ones;
    t->x.ones_len = t->full_ones;
    t->x.rows_floats = t->full_rows;
}

static void exec_close(test_exec *t)
{
    t->x.be->free(t->x.ctx, t->x.rows);
    t->x.be->free(t->x.ctx, t->x.drows);
    t->x.be->free(t->x.ctx, (void *)t->x.ones);
}

static int sync_ok(const dp_dexec *x)
{
    char msg[256];
    return x->be->sync(x->ctx, msg, sizeof msg) == 0;
}

/* ---- the kernels against the CPU kernels, over random windows ---- */

static void test_window_kernels(void)
{
    dp_rng rng;
    dp_rng_seed(&rng, 14);
    int tried = 0;
    for (int trial = 0; trial < 300; trial++) {
        dp_window g;
        int c = 1 + (int)dp_rng_below(&rng, 4), h = 1 + (int)dp_rng_below(&rng, 9);
        int w = 1 + (int)dp_rng_below(&rng, 9), kh = 1 + (int)dp_rng_below(&rng, 4);
        int kw = 1 + (int)dp_rng_below(&rng, 4), s = 1 + (int)dp_rng_below(&rng, 3);
        int pad = (int)dp_rng_below(&rng, (uint32_t)(kh < kw ? kh : kw));
        if (dp_window_init(&g, c, h, w, kh, kw, s, pad) < 0)
            continue;
        tried++;
        int batch = 1 + (int)dp_rng_below(&rng, 3);
        size_t nin = (size_t)batch * h * w * c, nout = (size_t)batch * g.oh * g.ow * c;
        size_t nrows = (size_t)batch * g.oh * g.ow * kh * kw * c;
        float *in = falloc(nin), *rows = falloc(nrows), *drows = falloc(nrows);
        float *a = falloc(nrows > nin ? nrows : nin), *b = falloc(nrows > nin ? nrows : nin);
        float *out = falloc(nout), *dout = falloc(nout), *fout = falloc(nout);
        fill_ties(in, nin, &rng);
        fill_uniform(drows, nrows, &rng, -1, 1);
        fill_uniform(dout, nout, &rng, -1, 1);

        /* a layer made by hand around g, as the model builds it */
        dp_layer L;
        memset(&L, 0, sizeof L);
        L.win = g;
        L.c = c, L.h = h, L.w = w, L.oc = c, L.oh = g.oh, L.ow = g.ow;
        L.in = c * h * w, L.out = c * g.oh * g.ow;
        dp_dexec x = {.be = &test_backend};

        fill_nan(a, nrows);
        dp_im2row(rows, in, &g, batch);
        dp_kernel k;
        memset(&k, 0, sizeof k);
        k.id = DP_K_IM2ROW;
        k.items = (long)nrows;
        k.u.window.dst = a;
        k.u.window.src = in;
        k.u.window.g = (dp_kwin){c, h, w, kh, kw, s, pad, g.oh, g.ow};
        tb_launch(NULL, &k);
        CHECKF(same_bits(a, rows, nrows), "im2row c%d %dx%d k%dx%d s%d p%d", c, h, w, kh, kw, s,
               pad);

        fill_nan(a, nin);
        dp_row2im(b, drows, &g, batch);
        k.id = DP_K_ROW2IM;
        k.items = (long)nin;
        k.u.window.src = NULL;
        k.u.window.grad = drows;
        tb_launch(NULL, &k);
        CHECKF(same_bits(a, b, nin), "row2im c%d %dx%d k%dx%d s%d p%d", c, h, w, kh, kw, s, pad);

        L.kind = DP_LAYER_MAXPOOL;
        fill_nan(a, nout);
        dp_maxpool_forward(fout, in, &g, batch);
        dimage_forward(&x, &L, NULL, in, a, batch, 0);
        CHECKF(same_bits(a, fout, nout), "maxpool fwd c%d %dx%d k%dx%d s%d p%d", c, h, w, kh, kw,
               s, pad);
        fill_nan(a, nin);
        dp_maxpool_backward(b, dout, in, fout, &g, batch);
        dimage_backward(&x, &L, NULL, NULL, in, fout, dout, a, batch);
        CHECKF(same_bits(a, b, nin), "maxpool bwd c%d %dx%d k%dx%d s%d p%d", c, h, w, kh, kw, s,
               pad);

        L.kind = DP_LAYER_AVGPOOL;
        fill_nan(a, nout);
        dp_avgpool_forward(out, in, &g, batch);
        dimage_forward(&x, &L, NULL, in, a, batch, 0);
        CHECKF(same_bits(a, out, nout), "avgpool fwd c%d %dx%d k%dx%d s%d p%d", c, h, w, kh, kw,
               s, pad);
        fill_nan(a, nin);
        dp_avgpool_backward(b, dout, &g, batch);
        dimage_backward(&x, &L, NULL, NULL, in, out, dout, a, batch);
        CHECKF(same_bits(a, b, nin), "avgpool bwd c%d %dx%d k%dx%d s%d p%d", c, h, w, kh, kw, s,
               pad);
        free(in), free(rows), free(drows), free(a), free(b), free(out), free(dout), free(fout);
    }
    CHECK(tried > 100);
    printf("window kernels: %d random geometries, im2row/row2im/max/avg bit-identical\n", tried);
}

/* An infinite gradient into a window of ties: the CPU's arithmetic spreads
 * NaN (0 * inf) over the window; the gather must give the same bits. */
static void test_maxpool_inf(void)
{
    dp_window g;
    REQUIRE(dp_window_init(&g, 1, 2, 2, 2, 2, 1, 0) == 0);
    float in[4] = {1, 1, 0, 1}, out[1], dout[1] = {INFINITY}, a[4], b[4];
    dp_layer L;
    memset(&L, 0, sizeof L);
    L.kind = DP_LAYER_MAXPOOL;
    L.win = g;
    L.c = 1, L.h = 2, L.w = 2, L.oc = 1, L.oh = 1, L.ow = 1, L.in = 4, L.out = 1;
    dp_dexec x = {.be = &test_backend};
    dp_maxpool_forward(out, in, &g, 1);
    dp_maxpool_backward(b, dout, in, out, &g, 1);
    dimage_backward(&x, &L, NULL, NULL, in, out, dout, a, 1);
    int same = 1;
    for (int i = 0; i < 4; i++)
        same &= (isnan(a[i]) && isnan(b[i])) || a[i] == b[i];
    CHECK(same);
}

/* ---- each image layer of a model against the CPU engine ---- */

typedef struct errs {
    double out, dw, db, din;
} errs;

/* Layer l of m (with the relu after it fused when relu), input `in`, one
 * scratch size (rows_floats): device vs CPU, the relative errors.  A layer
 * without a product must give the CPU's bits.  *chunks: the lowerings the
 * forward ran. */
static errs check_layer(dp_model *m, test_exec *t, int l, int relu, const float *in,
                        const float *dout, int batch, size_t rows_floats, long *chunks)
{
    const dp_layer *L = &m->layers[l];
    int b = l + 1 + relu;
    size_t nin = (size_t)batch * L->in, nout = (size_t)batch * L->out;
    float *cpu_din = falloc(nin), *dev_din = falloc(nin), *dev_out = falloc(nout);
    float *cpu_grads = falloc(m->n_params), *dev_grads = falloc(m->n_params);
    float *dmask = falloc(nout);
    errs e = {0, 0, 0, 0};

    const float *o = dp_model_forward_range(m, 0, m->params, in, l, b, batch);
    REQUIRE(o);
    float *cpu_out = falloc(nout);
    memcpy(cpu_out, o, nout * sizeof *o);
    REQUIRE(dp_model_backward_range(m, 0, cpu_din, cpu_grads, m->params, dout, in, l, b,
                                    batch) == 0);
    /* the fused relu's mask, as the executor applies it before the layer */
    for (size_t i = 0; i < nout; i++)
        dmask[i] = relu && !(cpu_out[i] > 0.0f) ? 0.0f : dout[i];

    dp_dexec x = t->x;
    x.rows_floats = rows_floats;
    fill_nan(dev_out, nout);
    fill_nan(dev_din, nin);
    fill_nan(dev_grads, m->n_params); /* the layer's must be overwritten, the rest kept */
    memset(launches, 0, sizeof launches);
    dimage_forward(&x, L, m->params, in, dev_out, batch, relu);
    *chunks = launches[DP_K_IM2ROW];
    dimage_backward(&x, L, m->params, dev_grads, in, dev_out, dmask, dev_din, batch);
    CHECK(sync_ok(&x));

    e.out = rel_err(dev_out, cpu_out, nout);
    e.din = rel_err(dev_din, cpu_din, nin);
    if (L->w_len) {
        e.dw = rel_err(dev_grads + L->w_off, cpu_grads + L->w_off, L->w_len);
        e.db = rel_err(dev_grads + L->b_off, cpu_grads + L->b_off, L->b_len);
        size_t kept = 0;
        for (size_t i = 0; i < m->n_params; i++)
            kept += isnan(dev_grads[i]);
        CHECKF(kept == m->n_params - L->w_len - L->b_len, "layer %d: grads outside it touched",
               l);
        /* without din: the same parameter gradients, din left alone */
        float *g2 = falloc(m->n_params);
        fill_nan(dev_din, nin);
        dimage_backward(&x, L, m->params, g2, in, dev_out, dmask, NULL, batch);
        CHECK(same_bits(g2 + L->w_off, dev_grads + L->w_off, L->w_len + L->b_len));
        CHECK(isnan(dev_din[0]) && isnan(dev_din[nin - 1]));
        free(g2);
    } else {
        CHECK(same_bits(dev_out, cpu_out, nout));
        CHECK(same_bits(dev_din, cpu_din, nin));
    }
    free(cpu_din), free(dev_din), free(dev_out), free(cpu_grads), free(dev_grads);
    free(dmask), free(cpu_out);
    return e;
}

/* Every layer dimage runs in spec, with inputs from the CPU's own forward of
 * the layers before (so a pool sees a relu's zeros and ties) and, for pools,
 * again with fill_ties inputs. */
static void test_model(const char *spec, int batch, uint64_t seed)
{
    dp_model m;
    dp_err err;
    REQUIRE(dp_model_init(&m, spec, batch, 1, &err) == 0);
    dp_model_init_params(&m, seed);
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    /* small biases, so the bias gradients and epilogues are not all zero */
    for (int l = 0; l < m.n_layers; l++)
        fill_uniform(m.params + m.layers[l].b_off, m.layers[l].b_len, &rng, -0.1f, 0.1f);
    test_exec t;
    exec_open(&t, m.layers, m.n_layers, batch);
    printf("%s, batch %d (relative error = max |device - cpu| / max |cpu|):\n", spec, batch);

    size_t nx = (size_t)batch * m.layers[0].in;
    float *x = falloc(nx);
    fill_uniform(x, nx, &rng, 0, 1);
    for (int l = 0; l < m.n_layers; l++) {
        const dp_layer *L = &m.layers[l];
        if (!dimage_supported(L->kind))
            continue;
        size_t nin = (size_t)batch * L->in;
        float *in = falloc(nin);
        if (l == 0) {
            memcpy(in, x, nx * sizeof *x);
        } else {
            const float *a = dp_model_forward_range(&m, 0, m.params, x, 0, l, batch);
            REQUIRE(a);
            memcpy(in, a, nin * sizeof *a);
        }
        int fuse = (L->kind == DP_LAYER_CONV || L->kind == DP_LAYER_LOCAL) &&
                   l + 1 < m.n_layers && m.layers[l + 1].kind == DP_LAYER_RELU;
        size_t nout = (size_t)batch * L->out;
        float *dout = falloc(nout);
        fill_uniform(dout, nout, &rng, -1, 1);
        int lowered = L->kind == DP_LAYER_CONV || L->kind == DP_LAYER_LOCAL;
        size_t per = lowered ? dimage_scratch(L, 1) : 0;
        for (int relu = 0; relu <= fuse; relu++)
            for (int tight = 0; tight <= lowered; tight++) {
                /* tight: two samples a chunk, so the gradients add over chunks */
                long chunks = 0;
                errs e = check_layer(&m, &t, l, relu, in, dout, batch,
                                     tight ? 2 * per : t.full_rows, &chunks);
                printf("  %2d %-7s %dx%dx%d -> %dx%dx%d%s%s: out %.1e  din %.1e", l,
                       dp_layer_kind_name(L->kind), L->c, L->h, L->w, L->oc, L->oh, L->ow,
                       relu ? " +relu" : "", lowered ? (tight ? " chunks of 2" : " 1 chunk") : "",
                       e.out, e.din);
                if (L->w_len)
                    printf("  dw %.1e  db %.1e", e.dw, e.db);
                printf("%s\n", lowered ? "" : " (bit-identical)");
                double bound = lowered ? PRODUCT_RTOL : 0.0;
                CHECKF(e.out <= bound && e.din <= bound && e.dw <= bound && e.db <= bound,
                       "%s layer %d: errors above %g", spec, l, bound);
                if (lowered)
                    CHECK(chunks == (tight ? (batch + 1) / 2 : 1));
            }
        if (L->kind == DP_LAYER_MAXPOOL || L->kind == DP_LAYER_AVGPOOL) {
            fill_ties(in, nin, &rng);
            long chunks;
            errs e = check_layer(&m, &t, l, 0, in, dout, batch, t.full_rows, &chunks);
            printf("  %2d %-7s ties: out %.1e  din %.1e (bit-identical)\n", l,
                   dp_layer_kind_name(L->kind), e.out, e.din);
        }
        free(in), free(dout);
    }
    free(x);
    exec_close(&t);
    dp_model_free(&m);
}

/* The sizing calls: nothing for layers without a lowering; a conv's ones
 * cover a chunk's rows, a local layer's a chunk's samples; the chunk never
 * exceeds the batch. */
static void test_sizes(void)
{
    dp_model m;
    dp_err err;
    REQUIRE(dp_model_init(&m, "cnn-mnist", 128, 1, &err) == 0);
    const dp_layer *c1 = &m.layers[0], *c2 = &m.layers[3];
    CHECK(dimage_scratch(c1, 128) == (size_t)128 * 24 * 24 * 25);
    CHECK(dimage_ones(c1, 128) == 128L * 24 * 24);
    CHECK(dimage_scratch(c2, 128) == (size_t)128 * 8 * 8 * 800);
    CHECK(dimage_scratch(c2, 1) == (size_t)8 * 8 * 800);
    CHECK(dimage_scratch(&m.layers[2], 128) == 0 && dimage_ones(&m.layers[2], 128) == 0);
    CHECK(dp_layer_table[DP_LAYER_CONV]->dev_forward && dp_layer_table[DP_LAYER_HWC]->dev_forward);
    CHECK(!dp_layer_table[DP_LAYER_DENSE]->dev_scratch && !dp_layer_table[DP_LAYER_LCN]->dev_scratch &&
          dp_layer_table[DP_LAYER_LCN]->dev_keep && !dp_layer_table[DP_LAYER_DROPOUT]->dev_scratch);
    dp_model_free(&m);
    REQUIRE(dp_model_init(&m, "1x8x8-local3x3x2-10", 7, 1, &err) == 0);
    CHECK(dimage_ones(&m.layers[0], 7) == 7);
    dp_model_free(&m);
}

int main(void)
{
    test_sizes();
    test_window_kernels();
    test_maxpool_inf();
    test_model("1x28x28-conv5x5x32-relu-maxpool2-conv5x5x64-relu-maxpool2-128-10", 5, 1);
    /* hwc first (3 channels), padding and stride, overlapping max windows
     * (stride 1, then 2), a non-square average with padding */
    test_model("3x11x10-conv3x3x4s2p1-relu-maxpool3s1p1-maxpool3s2p1-avgpool3x2s1p1-"
               "conv2x3x5p1-relu-10",
               3, 2);
    test_model("2x7x6-local3x2x3s2p1-relu-avgpool2-local2x2x2p1-10", 5, 3);
    fflush(stdout);
    return CHECK_DONE();
}
