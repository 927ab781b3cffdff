/* The direct convolution kernels (src/nn/conv_direct.c; docs/architecture.md,
 * "Image layers"), on odd shapes: the forward, the data and the weight
 * products against a double-precision reference whose gradients are checked
 * by finite differences, and against the lowered GEMM path; 1 and 2 threads
 * give the same bits; and at AVX-512 the AVX2 path gives the same bits (the
 * test runs itself again under DOWNPOUR_ISA=avx2).  Under a cap without
 * AVX2 (test_conv_direct@scalar) the kernels must decline every shape. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "downpour/blas.h"
#include "downpour/isa.h"
#include "downpour/layers.h"
#include "downpour/rng.h"
#include "nn/conv_direct.h"
#include "nn/layer_impl.h"

typedef struct shape {
    int batch, c, h, w, kh, kw, stride, pad, oc;
} shape;

/* stem-like (1 channel), 3x3 s1/s2/s3, 1x1 s2, 5x5, channel groups of 16
 * (3, 5), run vectors not a multiple of 3, a row wider than a tile, the
 * forward by tiles across rows and by rows */
static const shape shapes[] = {
    {3, 16, 7, 5, 3, 3, 1, 1, 16},  {2, 32, 9, 9, 3, 3, 2, 1, 48},
    {2, 16, 6, 7, 1, 1, 2, 0, 32},  {2, 1, 11, 10, 3, 3, 1, 1, 16},
    {2, 16, 8, 13, 5, 5, 1, 2, 80}, {2, 48, 5, 6, 3, 3, 1, 0, 16},
    {2, 16, 3, 29, 3, 3, 1, 1, 32}, {1, 32, 4, 4, 3, 3, 1, 1, 64},
    {2, 16, 8, 7, 3, 3, 2, 0, 16},  {2, 16, 10, 11, 3, 3, 3, 1, 32},
    {2, 16, 6, 5, 3, 3, 1, 1, 20}, /* 20 outputs: only the input gradient direct */
    /* LeNet's stem on MNIST: 784 positions by 25 taps is past gather_tiles'
     * offsets table, so the forward goes by rows (gather_rows) */
    {2, 1, 28, 28, 5, 5, 1, 2, 32},
};

typedef struct layer_set {
    dp_layer d;
    float *in, *w, *b, *dout;
    float *out, *din, *gw, *gb;      /* direct */
    float *lout, *ldin, *lgw, *lgb;  /* lowered */
    float *rows, *drows;
} layer_set;

static float *fl(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

static void make(layer_set *s, const shape *p, dp_rng *rng)
{
    memset(s, 0, sizeof *s);
    dp_layer *d = &s->d;
    d->kind = DP_LAYER_CONV;
    REQUIRE(dp_window_init(&d->win, p->c, p->h, p->w, p->kh, p->kw, p->stride, p->pad) == 0);
    d->c = p->c, d->h = p->h, d->w = p->w, d->oc = p->oc, d->oh = d->win.oh, d->ow = d->win.ow;
    d->in = p->c * p->h * p->w, d->out = p->oc * d->oh * d->ow;
    d->w_len = (size_t)p->oc * p->kh * p->kw * p->c, d->b_len = (size_t)p->oc;
    d->chunk = 1; /* several chunks in the lowered path */
    size_t n = (size_t)p->batch;
    s->in = fl(n * d->in), s->dout = fl(n * d->out);
    s->w = fl(d->w_len), s->b = fl(d->b_len);
    for (size_t i = 0; i < n * d->in; i++)
        s->in[i] = dp_rng_uniform(rng) - 0.5f;
    for (size_t i = 0; i < n * d->out; i++)
        s->dout[i] = dp_rng_uniform(rng) - 0.5f;
    for (size_t i = 0; i < d->w_len; i++)
        s->w[i] = dp_rng_uniform(rng) - 0.5f;
    for (size_t i = 0; i < d->b_len; i++)
        s->b[i] = dp_rng_uniform(rng) - 0.5f;
    s->out = fl(n * d->out), s->lout = fl(n * d->out);
    s->din = fl(n * d->in), s->ldin = fl(n * d->in);
    s->gw = fl(d->w_len), s->lgw = fl(d->w_len), s->gb = fl(d->b_len), s->lgb = fl(d->b_len);
    size_t rows = (size_t)d->oh * d->ow * p->kh * p->kw * p->c;
    if (rows < d->w_len)
        rows = d->w_len;
    s->rows = fl(rows), s->drows = fl(rows);
}

static void drop(layer_set *s)
{
    float *f[] = {s->in,  s->w,    s->b,   s->dout, s->out, s->din,  s->gw,
                  s->gb,  s->lout, s->ldin, s->lgw, s->lgb, s->rows, s->drows};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        free(f[i]);
}

static dp_layer_call call(layer_set *s, int batch, int relu, bool lowered)
{
    dp_layer_call c = {.d = &s->d, .batch = batch, .w = s->w, .b = s->b, .in = s->in,
                       .dout = s->dout, .relu = relu, .rows = s->rows, .drows = s->drows,
                       .chunk = s->d.chunk};
    c.out = lowered ? s->lout : s->out;
    c.din = lowered ? s->ldin : s->din;
    c.gw = lowered ? s->lgw : s->gw;
    c.gb = lowered ? s->lgb : s->gb;
    return c;
}

/* The direct products where the kernels take the shape (the rest lowered,
 * as the conv layer does). */
static void run_direct(layer_set *s, int batch, int relu)
{
    dp_layer_call c = call(s, batch, relu, false);
    if (dp_conv_direct_forward_ok(&s->d))
        dp_conv_direct_forward(&c);
    else
        dp_lk_lowered_forward(&c, false);
    bool wt = dp_conv_direct_weights_ok(&s->d), dt = dp_conv_direct_data_ok(&s->d);
    if (wt)
        dp_conv_direct_weights(&c);
    if (dt)
        dp_conv_direct_data(&c);
    if (!wt || !dt)
        dp_lk_lowered_backward_part(&c, !wt, !dt);
}

/* Double-precision forward of one record: out (oh, ow, oc), no relu. */
static void ref_forward(const dp_layer *d, const double *in, const double *w, const double *b,
                        double *out)
{
    const dp_window *g = &d->win;
    for (int oy = 0; oy < d->oh; oy++)
        for (int ox = 0; ox < d->ow; ox++)
            for (int o = 0; o < d->oc; o++) {
                double acc = b[o];
                for (int ky = 0; ky < g->kh; ky++)
                    for (int kx = 0; kx < g->kw; kx++) {
                        int iy = oy * g->stride - g->pad + ky, ix = ox * g->stride - g->pad + kx;
                        if (iy < 0 || iy >= d->h || ix < 0 || ix >= d->w)
                            continue;
                        for (int i = 0; i < d->c; i++)
                            acc += in[((size_t)iy * d->w + ix) * d->c + i] *
                                   w[(((size_t)o * g->kh + ky) * g->kw + kx) * d->c + i];
                    }
                out[((size_t)oy * d->ow + ox) * d->oc + o] = acc;
            }
}

/* Loss of the whole batch: sum of out * dout, in double. */
static double ref_loss(const layer_set *s, int batch, const double *in, const double *w,
                       const double *b, double *scratch)
{
    const dp_layer *d = &s->d;
    double L = 0;
    for (int r = 0; r < batch; r++) {
        ref_forward(d, in + (size_t)r * d->in, w, b, scratch);
        for (int e = 0; e < d->out; e++)
            L += scratch[e] * s->dout[(size_t)r * d->out + e];
    }
    return L;
}

static double *dbl(const float *x, size_t n)
{
    double *y = malloc((n ? n : 1) * sizeof *y);
    for (size_t i = 0; i < n; i++)
        y[i] = x[i];
    return y;
}

static uint64_t fnv(uint64_t h, const float *x, size_t n)
{
    const unsigned char *p = (const unsigned char *)x;
    for (size_t i = 0; i < n * sizeof(float); i++)
        h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

static double max_abs(const float *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

/* Every shape's direct products hashed (the bits the other ISA path must give). */
static uint64_t hash_all(void)
{
    uint64_t h = 1469598103934665603ULL;
    dp_rng rng;
    dp_rng_seed(&rng, 11);
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        layer_set s;
        make(&s, &shapes[k], &rng);
        for (int relu = 0; relu <= 1; relu++) {
            run_direct(&s, shapes[k].batch, relu);
            size_t n = (size_t)shapes[k].batch;
            if (dp_conv_direct_forward_ok(&s.d))
                h = fnv(h, s.out, n * s.d.out);
            if (dp_conv_direct_data_ok(&s.d))
                h = fnv(h, s.din, n * s.d.in);
            if (dp_conv_direct_weights_ok(&s.d)) {
                h = fnv(h, s.gw, s.d.w_len);
                h = fnv(h, s.gb, s.d.b_len);
            }
        }
        drop(&s);
    }
    return h;
}

static void check_shape(const shape *p, dp_rng *rng)
{
    layer_set s;
    make(&s, p, rng);
    const dp_layer *d = &s.d;
    int n = p->batch;
    bool any = dp_conv_direct_forward_ok(d) || dp_conv_direct_data_ok(d) ||
               dp_conv_direct_weights_ok(d);
    if (dp_isa_max() < DP_ISA_AVX2)
        CHECKF(!any, "shape %dx%dx%d k%dx%d s%d: direct path taken without AVX2", p->c, p->h,
               p->w, p->kh, p->kw, p->stride);
    for (int relu = 0; relu <= 1; relu++) {
        run_direct(&s, n, relu);
        dp_layer_call lc = call(&s, n, relu, true);
        dp_lk_lowered_forward(&lc, false);
        dp_lk_lowered_backward(&lc, false);
        /* against the lowered path: the same sums in another order */
        double so = max_abs(s.lout, (size_t)n * d->out), sd = max_abs(s.ldin, (size_t)n * d->in);
        double sw = max_abs(s.lgw, d->w_len), sb = max_abs(s.lgb, d->b_len);
        for (size_t i = 0; i < (size_t)n * d->out; i++)
            CHECK_NEAR(s.out[i], s.lout[i], 1e-5 * (so + 1));
        for (size_t i = 0; i < (size_t)n * d->in; i++)
            CHECK_NEAR(s.din[i], s.ldin[i], 1e-5 * (sd + 1));
        for (size_t i = 0; i < d->w_len; i++)
            CHECK_NEAR(s.gw[i], s.lgw[i], 1e-5 * (sw + 1));
        for (size_t i = 0; i < d->b_len; i++)
            CHECK_NEAR(s.gb[i], s.lgb[i], 1e-5 * (sb + 1));
        /* 2 threads against 1: the same bits (the direct products; the
         * lowered ones' depend on BLAS's kernels) */
        float *o1 = fl((size_t)n * d->out), *i1 = fl((size_t)n * d->in), *w1 = fl(d->w_len);
        memcpy(o1, s.out, (size_t)n * d->out * sizeof(float));
        memcpy(i1, s.din, (size_t)n * d->in * sizeof(float));
        memcpy(w1, s.gw, d->w_len * sizeof(float));
        dp_blas_set_threads(2);
        run_direct(&s, n, relu);
        dp_blas_set_threads(1);
        CHECK(!dp_conv_direct_forward_ok(d) ||
              memcmp(o1, s.out, (size_t)n * d->out * sizeof(float)) == 0);
        CHECK(!dp_conv_direct_data_ok(d) ||
              memcmp(i1, s.din, (size_t)n * d->in * sizeof(float)) == 0);
        CHECK(!dp_conv_direct_weights_ok(d) || memcmp(w1, s.gw, d->w_len * sizeof(float)) == 0);
        free(o1), free(i1), free(w1);
    }
    /* against double precision: the forward, and the gradients of
     * sum(out * dout) by central differences at a few entries */
    run_direct(&s, n, 0);
    double *in = dbl(s.in, (size_t)n * d->in), *w = dbl(s.w, d->w_len), *b = dbl(s.b, d->b_len);
    double *scratch = malloc((size_t)d->out * sizeof *scratch);
    for (int r = 0; r < n; r++) {
        ref_forward(d, in + (size_t)r * d->in, w, b, scratch);
        for (int e = 0; e < d->out; e++)
            CHECK_NEAR(s.out[(size_t)r * d->out + e], scratch[e], 1e-5);
    }
    const double h = 1e-3;
    for (int t = 0; t < 6; t++) {
        size_t wi = dp_rng_below(rng, (uint32_t)d->w_len);
        size_t ii = dp_rng_below(rng, (uint32_t)((size_t)n * d->in));
        size_t bi = dp_rng_below(rng, (uint32_t)d->b_len);
        double keep = w[wi];
        w[wi] = keep + h;
        double lp = ref_loss(&s, n, in, w, b, scratch);
        w[wi] = keep - h;
        double lm = ref_loss(&s, n, in, w, b, scratch);
        w[wi] = keep;
        CHECK_NEAR(s.gw[wi], (lp - lm) / (2 * h), 1e-4 * (1 + fabs(s.gw[wi])));
        keep = in[ii];
        in[ii] = keep + h;
        lp = ref_loss(&s, n, in, w, b, scratch);
        in[ii] = keep - h;
        lm = ref_loss(&s, n, in, w, b, scratch);
        in[ii] = keep;
        CHECK_NEAR(s.din[ii], (lp - lm) / (2 * h), 1e-4 * (1 + fabs(s.din[ii])));
        keep = b[bi];
        b[bi] = keep + h;
        lp = ref_loss(&s, n, in, w, b, scratch);
        b[bi] = keep - h;
        lm = ref_loss(&s, n, in, w, b, scratch);
        b[bi] = keep;
        CHECK_NEAR(s.gb[bi], (lp - lm) / (2 * h), 1e-4 * (1 + fabs(s.gb[bi])));
    }
    free(in), free(w), free(b), free(scratch);
    drop(&s);
}

int main(int argc, char **argv)
{
    dp_blas_set_threads(1);
    if (argc > 1 && strcmp(argv[1], "--hash") == 0) {
        printf("%016" PRIx64 "\n", hash_all());
        return 0;
    }
    dp_rng rng;
    dp_rng_seed(&rng, 5);
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        check_shape(&shapes[k], &rng);
    /* resnet-fashion's shapes take the direct path on an AVX2 machine */
    if (dp_isa_max() >= DP_ISA_AVX2) {
        layer_set s;
        make(&s, &shapes[0], &rng);
        CHECK(dp_conv_direct_forward_ok(&s.d) && dp_conv_direct_data_ok(&s.d) &&
              dp_conv_direct_weights_ok(&s.d));
        drop(&s);
    }
    /* AVX-512 and AVX2 give the same bits */
    if (dp_isa_max() >= DP_ISA_AVX512) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "DOWNPOUR_ISA=avx2 '%s' --hash", argv[0]);
        FILE *p = popen(cmd, "r");
        REQUIRE(p);
        char got[64] = "", want[64];
        if (!fgets(got, sizeof got, p))
            got[0] = '\0';
        CHECK(pclose(p) == 0);
        snprintf(want, sizeof want, "%016" PRIx64 "\n", hash_all());
        CHECKF(strcmp(got, want) == 0, "AVX2 %s AVX-512 %s", got, want);
    }
    if (check_failures == 0)
        printf("all checks passed\n");
    return check_failures ? 1 : 0;
}
