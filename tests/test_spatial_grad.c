/* The spatial layer kernels (layers.h, "spatial layers") against plain
 * double-precision references written here with direct loops (no lowering):
 * forward values, and analytic gradients against central finite differences
 * of the double forward, over random geometries from a seeded dp_rng.  Then
 * hand-worked cases, LCN's corners, dropout's mask, dp_window_init's
 * refusals, and bit-identical results with 1 and 2 threads. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "downpour/blas.h"
#include "downpour/layers.h"
#include "downpour/rng.h"

#define H 1e-4
#define RTOL 1e-3
#define ATOL 1e-5
/* At most this many coordinates of one array go through finite differences
 * (chosen at random); smaller arrays are checked whole. */
#define FD_MAX 80

static float urand(dp_rng *r, float lo, float hi) { return lo + (hi - lo) * dp_rng_uniform(r); }
static int below(dp_rng *r, int n) { return (int)dp_rng_below(r, (uint32_t)n); }
static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }

static float *falloc(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof *p);
    REQUIRE(p);
    return p;
}

static double *dalloc(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof *p);
    REQUIRE(p);
    return p;
}

/* x and its double copy xd, uniform in [lo, hi). */
static void fill(float *x, double *xd, size_t n, dp_rng *r, float lo, float hi)
{
    for (size_t i = 0; i < n; i++) {
        x[i] = urand(r, lo, hi);
        if (xd)
            xd[i] = x[i];
    }
}

static size_t img_size(const dp_window *g, int batch) { return (size_t)batch * g->h * g->w * g->c; }
static size_t out_pos(const dp_window *g, int batch) { return (size_t)batch * g->oh * g->ow; }
static size_t win_size(const dp_window *g) { return (size_t)g->kh * g->kw * g->c; }

/* Pixel (y, x), channel ch of sample r; 0 outside the image (the padding). */
static double pix(const double *in, const dp_window *g, int r, int y, int x, int ch)
{
    if (y < 0 || y >= g->h || x < 0 || x >= g->w)
        return 0.0;
    return in[(((size_t)r * g->h + y) * g->w + x) * g->c + ch];
}

/* ---- finite differences ---------------------------------------------------- */

typedef double (*loss_fn)(void *ctx);

static long fd_coords; /* coordinates checked by finite differences, for the summary */

/* dL/dx[k] by central differences, against analytic[k], for every k (or
 * FD_MAX random ones); x is one of the arrays loss reads through ctx. */
static void check_fd(const char *what, loss_fn loss, void *ctx, double *x, size_t n,
                     const float *analytic, double h, double atol, double rtol, dp_rng *r)
{
    size_t count = n <= FD_MAX ? n : FD_MAX;
    for (size_t t = 0; t < count; t++) {
        size_t k = n <= FD_MAX ? t : (size_t)dp_rng_below(r, (uint32_t)n);
        double save = x[k];
        x[k] = save + h;
        double lp = loss(ctx);
        x[k] = save - h;
        double lm = loss(ctx);
        x[k] = save;
        double num = (lp - lm) / (2 * h);
        fd_coords++;
        CHECKF(fabs(analytic[k] - num) <= atol + rtol * fabs(num),
               "%s[%zu]: analytic %.9g, finite differences %.9g", what, k, (double)analytic[k],
               num);
    }
}

/* A random geometry: kernel 1..5 (square or not), stride 1..3, padding
 * 0..2 below the kernel, channels 1..5, a size from the smallest that fits
 * the window up to 5 more (odd and even both come up). */
static int seen_stride[4], seen_pad[3], seen_parity[2], seen_k[6], seen_c[6], seen_nonsquare;

static dp_window random_window(dp_rng *r, int square)
{
    int kh = 1 + below(r, 5), kw = square ? kh : 1 + below(r, 5);
    int stride = 1 + below(r, 3), pad = below(r, imin(3, imin(kh, kw)));
    int c = 1 + below(r, 5);
    int h = imax(1, kh - 2 * pad) + below(r, 6), w = imax(1, kw - 2 * pad) + below(r, 6);
    dp_window g;
    REQUIRE(dp_window_init(&g, c, h, w, kh, kw, stride, pad) == 0);
    REQUIRE(g.oh == (h + 2 * pad - kh) / stride + 1 && g.ow == (w + 2 * pad - kw) / stride + 1);
    seen_stride[stride]++;
    seen_pad[pad]++;
    seen_parity[h & 1]++;
    seen_k[kh]++;
    seen_c[c]++;
    seen_nonsquare += kh != kw;
    return g;
}

/* ---- references ------------------------------------------------------------ */

/* Convolution (tied, w (oc, kh, kw, c)) or locally connected (untied,
 * w (positions, oc, kh, kw, c)) straight from the image; out (batch, oh, ow, oc). */
static void conv_ref(double *out, const double *in, const double *w, const double *b,
                     const dp_window *g, int batch, int oc, int untied, int relu)
{
    size_t k = win_size(g);
    for (int r = 0; r < batch; r++)
        for (int oy = 0; oy < g->oh; oy++)
            for (int ox = 0; ox < g->ow; ox++) {
                int p = oy * g->ow + ox;
                for (int o = 0; o < oc; o++) {
                    const double *wo = w + ((untied ? (size_t)p * oc : 0) + o) * k;
                    double z = b[(untied ? (size_t)p * oc : 0) + o];
                    for (int ky = 0; ky < g->kh; ky++)
                        for (int kx = 0; kx < g->kw; kx++)
                            for (int ch = 0; ch < g->c; ch++)
                                z += wo[((size_t)ky * g->kw + kx) * g->c + ch] *
                                     pix(in, g, r, oy * g->stride - g->pad + ky,
                                         ox * g->stride - g->pad + kx, ch);
                    if (relu && z < 0)
                        z = 0;
                    out[((size_t)r * g->oh * g->ow + p) * oc + o] = z;
                }
            }
}

/* Max (first maximum, the padding never wins) or average (/ kh kw) pooling. */
static void pool_ref(double *out, const double *in, const dp_window *g, int batch, int avg)
{
    for (int r = 0; r < batch; r++)
        for (int oy = 0; oy < g->oh; oy++)
            for (int ox = 0; ox < g->ow; ox++)
                for (int ch = 0; ch < g->c; ch++) {
                    double acc = avg ? 0.0 : -INFINITY;
                    for (int ky = 0; ky < g->kh; ky++)
                        for (int kx = 0; kx < g->kw; kx++) {
                            int y = oy * g->stride - g->pad + ky, x = ox * g->stride - g->pad + kx;
                            if (y < 0 || y >= g->h || x < 0 || x >= g->w)
                                continue;
                            double v = pix(in, g, r, y, x, ch);
                            if (avg)
                                acc += v;
                            else if (v > acc)
                                acc = v;
                        }
                    out[(((size_t)r * g->oh + oy) * g->ow + ox) * g->c + ch] =
                        avg ? acc / (g->kh * g->kw) : acc;
                }
}

typedef struct lcn_stats {
    int s_wins, mean_wins, eps_wins;
    double margin; /* smallest distance between the winner and the runner-up */
} lcn_stats;

/* LCN exactly as layers.h writes it, with direct 2-D window sums. */
static void lcn_ref(double *out, const double *in, const dp_window *g, int batch,
                    lcn_stats *st)
{
    const int n = g->kh, rad = n / 2, c = g->c, h = g->h, w = g->w;
    const double sigma = n / 4.0, eps = DP_LCN_EPS;
    double *k = dalloc((size_t)n * n), *v = dalloc((size_t)h * w * c), *s = dalloc((size_t)h * w);
    double ksum = 0;
    for (int dy = -rad; dy <= rad; dy++)
        for (int dx = -rad; dx <= rad; dx++)
            ksum += k[(dy + rad) * n + dx + rad] = exp(-(dy * dy + dx * dx) / (2 * sigma * sigma));
    for (int i = 0; i < n * n; i++)
        k[i] /= ksum * c;
    dp_window vg = *g;
    if (st)
        *st = (lcn_stats){0, 0, 0, INFINITY};
    for (int r = 0; r < batch; r++) {
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++) {
                double m = 0;
                for (int c2 = 0; c2 < c; c2++)
                    for (int dy = -rad; dy <= rad; dy++)
                        for (int dx = -rad; dx <= rad; dx++)
                            m += k[(dy + rad) * n + dx + rad] * pix(in, g, r, y + dy, x + dx, c2);
                for (int ch = 0; ch < c; ch++)
                    v[((size_t)y * w + x) * c + ch] = pix(in, g, r, y, x, ch) - m;
            }
        double mean = 0;
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++) {
                double q = 0;
                for (int c2 = 0; c2 < c; c2++)
                    for (int dy = -rad; dy <= rad; dy++)
                        for (int dx = -rad; dx <= rad; dx++) {
                            double e = pix(v, &vg, 0, y + dy, x + dx, c2);
                            q += k[(dy + rad) * n + dx + rad] * e * e;
                        }
                mean += s[y * w + x] = sqrt(q);
            }
        mean /= (double)h * w;
        for (int p = 0; p < h * w; p++) {
            double d = fmax(fmax(mean, s[p]), eps);
            for (int ch = 0; ch < c; ch++)
                out[((size_t)r * h * w + p) * c + ch] = v[(size_t)p * c + ch] / d;
            if (st) {
                double cand[3] = {mean, s[p], eps}, second = -INFINITY;
                int win = s[p] > mean ? (s[p] > eps ? 1 : 2) : (mean > eps ? 0 : 2);
                for (int i = 0; i < 3; i++)
                    if (i != win && cand[i] > second)
                        second = cand[i];
                /* a pixel whose v is all zero has no derivative through d */
                double vmax = 0;
                for (int ch = 0; ch < c; ch++)
                    vmax = fmax(vmax, fabs(v[(size_t)p * c + ch]));
                if (vmax > 0 || win != 2)
                    st->margin = fmin(st->margin, (cand[win] - second) / cand[win]);
                st->s_wins += win == 1;
                st->mean_wins += win == 0;
                st->eps_wins += win == 2;
            }
        }
    }
    free(k);
    free(v);
    free(s);
}

/* sum(c * out) of the references above. */
typedef struct ref_ctx {
    const dp_window *g;
    int batch, oc, kind;
    double *in, *w, *b, *coef, *out;
} ref_ctx;

enum { REF_CONV, REF_LOCAL, REF_MAX, REF_AVG, REF_LCN };

static double ref_loss(void *ctx)
{
    ref_ctx *c = ctx;
    size_t n;
    switch (c->kind) {
    case REF_CONV:
    case REF_LOCAL:
        conv_ref(c->out, c->in, c->w, c->b, c->g, c->batch, c->oc, c->kind == REF_LOCAL, 0);
        n = out_pos(c->g, c->batch) * c->oc;
        break;
    case REF_MAX:
    case REF_AVG:
        pool_ref(c->out, c->in, c->g, c->batch, c->kind == REF_AVG);
        n = out_pos(c->g, c->batch) * c->g->c;
        break;
    default:
        lcn_ref(c->out, c->in, c->g, c->batch, NULL);
        n = img_size(c->g, c->batch);
        break;
    }
    double loss = 0;
    for (size_t i = 0; i < n; i++)
        loss += c->coef[i] * c->out[i];
    return loss;
}

/* ---- lowering -------------------------------------------------------------- */

static void test_lowering(uint64_t seed)
{
    dp_rng r;
    dp_rng_seed(&r, seed);
    dp_window g = random_window(&r, 0);
    int batch = 1 + below(&r, 3);
    size_t ni = img_size(&g, batch), m = out_pos(&g, batch), k = win_size(&g);
    float *x = falloc(ni), *rows = falloc(m * k), *d = falloc(m * k), *dx = falloc(ni);
    double *xd = dalloc(ni), *ref = dalloc(ni);
    fill(x, xd, ni, &r, -1, 1);
    fill(d, NULL, m * k, &r, -1, 1);

    /* im2row copies: bit-exact against the naive window walk */
    for (size_t i = 0; i < m * k; i++)
        rows[i] = NAN;
    dp_im2row(rows, x, &g, batch);
    int bad = 0;
    for (int rr = 0; rr < batch; rr++)
        for (int oy = 0; oy < g.oh; oy++)
            for (int ox = 0; ox < g.ow; ox++)
                for (int ky = 0; ky < g.kh; ky++)
                    for (int kx = 0; kx < g.kw; kx++)
                        for (int ch = 0; ch < g.c; ch++) {
                            size_t row = ((size_t)rr * g.oh + oy) * g.ow + ox;
                            float got = rows[row * k + ((size_t)ky * g.kw + kx) * g.c + ch];
                            double want = pix(xd, &g, rr, oy * g.stride - g.pad + ky,
                                              ox * g.stride - g.pad + kx, ch);
                            bad += got != (float)want;
                        }
    CHECKF(bad == 0, "im2row: %d elements differ (seed %llu)", bad, (unsigned long long)seed);

    /* row2im against a naive scatter, and the adjoint identity */
    for (size_t i = 0; i < ni; i++)
        dx[i] = NAN;
    dp_row2im(dx, d, &g, batch);
    for (int rr = 0; rr < batch; rr++)
        for (int oy = 0; oy < g.oh; oy++)
            for (int ox = 0; ox < g.ow; ox++)
                for (int ky = 0; ky < g.kh; ky++)
                    for (int kx = 0; kx < g.kw; kx++) {
                        int y = oy * g.stride - g.pad + ky, xx = ox * g.stride - g.pad + kx;
                        if (y < 0 || y >= g.h || xx < 0 || xx >= g.w)
                            continue;
                        for (int ch = 0; ch < g.c; ch++)
                            ref[(((size_t)rr * g.h + y) * g.w + xx) * g.c + ch] +=
                                d[(((size_t)rr * g.oh + oy) * g.ow + ox) * k +
                                  ((size_t)ky * g.kw + kx) * g.c + ch];
                    }
    for (size_t i = 0; i < ni; i++)
        CHECKF(fabs(dx[i] - ref[i]) <= 1e-5, "row2im[%zu] = %.9g, want %.9g", i, (double)dx[i],
               ref[i]);
    double lhs = 0, rhs = 0, mag = 0;
    for (size_t i = 0; i < ni; i++) {
        lhs += (double)dx[i] * x[i];
        mag += fabs((double)dx[i] * x[i]);
    }
    for (size_t i = 0; i < m * k; i++)
        rhs += (double)d[i] * rows[i];
    CHECKF(fabs(lhs - rhs) <= 1e-6 * (1 + mag), "<row2im(d), x> = %.12g, <d, im2row(x)> = %.12g",
           lhs, rhs);

    /* the layout changes against the index formula, and the round trip */
    int hw = g.h * g.w;
    float *t = falloc(ni), *back = falloc(ni);
    dp_hwc_to_chw(t, x, batch, g.c, hw);
    bad = 0;
    for (int rr = 0; rr < batch; rr++)
        for (int ch = 0; ch < g.c; ch++)
            for (int p = 0; p < hw; p++)
                bad += t[((size_t)rr * g.c + ch) * hw + p] != x[((size_t)rr * hw + p) * g.c + ch];
    CHECK(bad == 0);
    dp_chw_to_hwc(back, t, batch, g.c, hw);
    CHECK(memcmp(back, x, ni * sizeof *x) == 0);
    free(t);
    free(back);

    free(x);
    free(rows);
    free(d);
    free(dx);
    free(xd);
    free(ref);
}

/* ---- convolution (im2row + dense) and locally connected ---------------------- */

static void test_conv_local(uint64_t seed, int untied)
{
    dp_rng r;
    dp_rng_seed(&r, seed);
    dp_window g = random_window(&r, 0);
    int batch = 1 + below(&r, 3), oc = 1 + below(&r, 4), P = g.oh * g.ow;
    size_t ni = img_size(&g, batch), m = out_pos(&g, batch), k = win_size(&g);
    size_t nw = (untied ? (size_t)P : 1) * oc * k, nb = (untied ? (size_t)P : 1) * oc;
    float *x = falloc(ni), *w = falloc(nw), *b = falloc(nb), *rows = falloc(m * k);
    float *y = falloc(m * oc), *yr = falloc(m * oc), *dy = falloc(m * oc);
    float *drows = falloc(m * k), *dx = falloc(ni), *dw = falloc(nw), *db = falloc(nb);
    double *xd = dalloc(ni), *wd = dalloc(nw), *bd = dalloc(nb), *cd = dalloc(m * oc);
    double *ref = dalloc(m * oc), *refr = dalloc(m * oc);
    fill(x, xd, ni, &r, -1, 1);
    fill(w, wd, nw, &r, -1, 1);
    fill(b, bd, nb, &r, -1, 1);
    fill(dy, cd, m * oc, &r, -1, 1);

    dp_im2row(rows, x, &g, batch);
    if (untied) {
        dp_local_forward(y, rows, w, b, batch, P, (int)k, oc, 0);
        dp_local_forward(yr, rows, w, b, batch, P, (int)k, oc, 1);
    } else { /* the model's convolution: one dense product over every position */
        dp_dense_forward(y, rows, w, b, (int)m, (int)k, oc);
        dp_dense_relu_forward(yr, rows, w, b, (int)m, (int)k, oc);
    }
    conv_ref(ref, xd, wd, bd, &g, batch, oc, untied, 0);
    conv_ref(refr, xd, wd, bd, &g, batch, oc, untied, 1);
    for (size_t i = 0; i < m * oc; i++) {
        CHECKF(fabs(y[i] - ref[i]) <= 1e-4, "%s forward[%zu] = %.9g, want %.9g",
               untied ? "local" : "conv", i, (double)y[i], ref[i]);
        CHECKF(fabs(yr[i] - refr[i]) <= 1e-4, "%s relu forward[%zu] = %.9g, want %.9g",
               untied ? "local" : "conv", i, (double)yr[i], refr[i]);
    }

    /* backward: dw, db overwritten; the image's gradient through row2im */
    for (size_t i = 0; i < nw; i++)
        dw[i] = 1e6f;
    for (size_t i = 0; i < nb; i++)
        db[i] = 1e6f;
    for (size_t i = 0; i < m * k; i++)
        drows[i] = NAN;
    if (untied)
        dp_local_backward(drows, dw, db, dy, rows, w, batch, P, (int)k, oc, 0);
    else
        dp_dense_backward_overwrite(drows, dw, db, dy, rows, w, (int)m, (int)k, oc);
    dp_row2im(dx, drows, &g, batch);
    ref_ctx ctx = {&g, batch, oc, untied ? REF_LOCAL : REF_CONV, xd, wd, bd, cd, ref};
    const char *name = untied ? "local" : "conv";
    char what[32];
    snprintf(what, sizeof what, "%s dx", name);
    check_fd(what, ref_loss, &ctx, xd, ni, dx, H, ATOL, RTOL, &r);
    snprintf(what, sizeof what, "%s dw", name);
    check_fd(what, ref_loss, &ctx, wd, nw, dw, H, ATOL, RTOL, &r);
    snprintf(what, sizeof what, "%s db", name);
    check_fd(what, ref_loss, &ctx, bd, nb, db, H, ATOL, RTOL, &r);

    if (untied) { /* drows NULL: the same dw and db, and a second call overwrites again */
        float *dw2 = falloc(nw), *db2 = falloc(nb);
        dp_local_backward(NULL, dw2, db2, dy, rows, w, batch, P, (int)k, oc, 0);
        dp_local_backward(NULL, dw2, db2, dy, rows, w, batch, P, (int)k, oc, 0);
        CHECK(memcmp(dw2, dw, nw * sizeof *dw) == 0);
        CHECK(memcmp(db2, db, nb * sizeof *db) == 0);
        /* accumulate: a second call adds the same gradient again */
        dp_local_backward(NULL, dw2, db2, dy, rows, w, batch, P, (int)k, oc, 1);
        for (size_t i = 0; i < nw; i++)
            CHECKF(fabsf(dw2[i] - 2 * dw[i]) <= 1e-6f * (1 + fabsf(dw[i])), "local dw accumulated[%zu]", i);
        for (size_t i = 0; i < nb; i++)
            CHECKF(fabsf(db2[i] - 2 * db[i]) <= 1e-6f * (1 + fabsf(db[i])), "local db accumulated[%zu]", i);
        free(dw2);
        free(db2);
    }

    free(x);
    free(w);
    free(b);
    free(rows);
    free(y);
    free(yr);
    free(dy);
    free(drows);
    free(dx);
    free(dw);
    free(db);
    free(xd);
    free(wd);
    free(bd);
    free(cd);
    free(ref);
    free(refr);
}

/* ---- pooling --------------------------------------------------------------- */

static void test_pool(uint64_t seed, int avg)
{
    dp_rng r;
    dp_rng_seed(&r, seed);
    dp_window g = random_window(&r, 0);
    int batch = 1 + below(&r, 3);
    size_t ni = img_size(&g, batch), no = out_pos(&g, batch) * g.c;
    float *x = falloc(ni), *y = falloc(no), *dy = falloc(no), *dx = falloc(ni);
    double *xd = dalloc(ni), *cd = dalloc(no), *ref = dalloc(no);
    /* distinct values 2/ni apart (ni <= 1500), so no window's maximum is
     * within the finite-difference step of another value */
    uint32_t *perm = malloc(ni * sizeof *perm);
    REQUIRE(perm);
    for (size_t i = 0; i < ni; i++)
        perm[i] = (uint32_t)i;
    dp_rng_shuffle(&r, perm, (uint32_t)ni);
    for (size_t i = 0; i < ni; i++)
        xd[i] = x[i] = (float)((perm[i] + 0.5) * 2.0 / ni - 1.0);
    free(perm);
    fill(dy, cd, no, &r, -1, 1);

    for (size_t i = 0; i < no; i++)
        y[i] = NAN;
    (avg ? dp_avgpool_forward : dp_maxpool_forward)(y, x, &g, batch);
    pool_ref(ref, xd, &g, batch, avg);
    for (size_t i = 0; i < no; i++)
        CHECKF(fabs(y[i] - ref[i]) <= (avg ? 1e-6 : 0), "%s forward[%zu] = %.9g, want %.9g",
               avg ? "avgpool" : "maxpool", i, (double)y[i], ref[i]);

    for (size_t i = 0; i < ni; i++)
        dx[i] = NAN;
    if (avg)
        dp_avgpool_backward(dx, dy, &g, batch);
    else
        dp_maxpool_backward(dx, dy, x, y, &g, batch);
    ref_ctx ctx = {&g, batch, 0, avg ? REF_AVG : REF_MAX, xd, NULL, NULL, cd, ref};
    check_fd(avg ? "avgpool dx" : "maxpool dx", ref_loss, &ctx, xd, ni, dx, H, ATOL, RTOL, &r);

    free(x);
    free(y);
    free(dy);
    free(dx);
    free(xd);
    free(cd);
    free(ref);
}

/* ---- local contrast normalisation -------------------------------------------- */

static lcn_stats lcn_totals;

/* One LCN case: forward against lcn_ref, backward against finite differences
 * with step h and absolute floor atol; the winners go into lcn_totals. */
static void lcn_case(const dp_window *g, int batch, const float *x, dp_rng *r, double h,
                     double atol, const char *what)
{
    size_t ni = img_size(g, batch);
    size_t nk = (size_t)batch * dp_lcn_keep_floats(g);
    float *y = falloc(ni), *keep = falloc(nk), *dy = falloc(ni), *dx = falloc(ni),
          *dx2 = falloc(ni);
    double *xd = dalloc(ni), *cd = dalloc(ni), *ref = dalloc(ni);
    for (size_t i = 0; i < ni; i++)
        xd[i] = x[i];
    fill(dy, cd, ni, r, -1, 1);
    lcn_stats st;
    lcn_ref(ref, xd, g, batch, &st);
    lcn_totals.s_wins += st.s_wins;
    lcn_totals.mean_wins += st.mean_wins;
    lcn_totals.eps_wins += st.eps_wins;

    dp_lcn_forward(y, keep, x, g, batch);
    double ymax = 0;
    for (size_t i = 0; i < ni; i++)
        ymax = fmax(ymax, fabs(ref[i]));
    for (size_t i = 0; i < ni; i++)
        CHECKF(fabs(y[i] - ref[i]) <= 2e-5 * (1 + ymax), "%s forward[%zu] = %.9g, want %.9g",
               what, i, (double)y[i], ref[i]);

    for (size_t i = 0; i < ni; i++)
        dx[i] = NAN;
    dp_lcn_backward(dx, dy, keep, g, batch);
    ref_ctx ctx = {g, batch, 0, REF_LCN, xd, NULL, NULL, cd, ref};
    check_fd(what, ref_loss, &ctx, xd, ni, dx, h, atol, 2e-3, r);
    /* keep survives the backward: a second one gives the same numbers */
    dp_lcn_backward(dx2, dy, keep, g, batch);
    CHECK(memcmp(dx, dx2, ni * sizeof *dx) == 0);
    for (size_t i = 0; i < ni; i++)
        CHECK(isfinite(dx[i]) && isfinite(y[i]));

    free(y);
    free(keep);
    free(dy);
    free(dx);
    free(dx2);
    free(xd);
    free(cd);
    free(ref);
}

static void test_lcn(uint64_t seed)
{
    dp_rng r;
    dp_rng_seed(&r, seed);
    int n = 1 + 2 * below(&r, 3), c = 1 + below(&r, 3), batch = 1 + below(&r, 2);
    int h = 1 + below(&r, 9), w = 1 + below(&r, 9);
    dp_window g;
    REQUIRE(dp_window_init(&g, c, h, w, n, n, 1, n / 2) == 0);
    REQUIRE(g.oh == h && g.ow == w);
    size_t ni = img_size(&g, batch);
    float *x = falloc(ni);
    double *xd = dalloc(ni), *ref = dalloc(ni);
    /* redraw until no pixel is near a switch of the max: a step of H moves s
     * by well under 1e-3 of itself, so a margin of 2e-3 keeps the finite
     * differences on one side */
    for (int tries = 0;; tries++) {
        REQUIRE(tries < 100);
        fill(x, xd, ni, &r, -1, 1);
        lcn_stats st;
        lcn_ref(ref, xd, &g, batch, &st);
        if (st.margin > 2e-3)
            break;
    }
    lcn_case(&g, batch, x, &r, H, 1e-4, "lcn dx");
    free(x);
    free(xd);
    free(ref);
}

/* Where the mean wins for some pixels and s for others, in one sample; and a
 * faint image where eps wins far from a few bright pixels and s near them. */
static void test_lcn_winners(void)
{
    dp_rng r;
    dp_rng_seed(&r, 77);
    dp_window g;
    REQUIRE(dp_window_init(&g, 2, 9, 8, 3, 3, 1, 1) == 0);
    float x[2 * 9 * 8];
    double xd[2 * 9 * 8], ref[2 * 9 * 8];
    lcn_stats st;
    for (int tries = 0;; tries++) {
        REQUIRE(tries < 100);
        fill(x, xd, 2 * 9 * 8, &r, -1, 1);
        for (int i = 0; i < 2 * 4 * 8; i++) /* a calm top half: s below the mean there */
            xd[i] = x[i] *= 0.1f;
        lcn_ref(ref, xd, &g, 1, &st);
        if (st.margin > 2e-3)
            break;
    }
    CHECK(st.s_wins > 0 && st.mean_wins > 0);
    lcn_case(&g, 1, x, &r, H, 1e-4, "lcn mixed dx");

    REQUIRE(dp_window_init(&g, 1, 10, 10, 3, 3, 1, 1) == 0);
    float faint[100];
    double faint_d[100], fref[100];
    for (int tries = 0;; tries++) {
        REQUIRE(tries < 100);
        memset(faint, 0, sizeof faint);
        for (int i = 0; i < 3; i++)
            faint[below(&r, 100)] = urand(&r, 0.8e-3f, 1.2e-3f) * (below(&r, 2) ? 1 : -1);
        for (int i = 0; i < 100; i++)
            faint_d[i] = faint[i];
        lcn_ref(fref, faint_d, &g, 1, &st);
        if (st.margin > 5e-2)
            break;
    }
    CHECK(st.s_wins > 0 && st.eps_wins > 0);
    /* gradients of order 1/eps: a step and a floor to match */
    lcn_case(&g, 1, faint, &r, 1e-8, 1e-1, "lcn faint dx");
}

/* A constant image: zero image gives v = 0, s = 0, the divisor eps, and zeros
 * out and back; a nonzero constant is 0 inside (v = 0 away from the border)
 * and finite everywhere. */
static void test_lcn_constant(void)
{
    dp_window g;
    REQUIRE(dp_window_init(&g, 2, 11, 11, 3, 3, 1, 1) == 0);
    size_t ni = img_size(&g, 2), nk = 2 * dp_lcn_keep_floats(&g);
    float *x = falloc(ni), *y = falloc(ni), *keep = falloc(nk), *dy = falloc(ni),
          *dx = falloc(ni);
    for (size_t i = 0; i < ni; i++)
        dy[i] = 1.0f;
    dp_lcn_forward(y, keep, x, &g, 2);
    dp_lcn_backward(dx, dy, keep, &g, 2);
    for (size_t i = 0; i < ni; i++) {
        CHECK(y[i] == 0.0f);
        /* d out / d x = (I - blur) / eps: the ones of dy cancel inside */
        CHECK(isfinite(dx[i]));
    }
    for (size_t i = 0; i < ni; i++)
        x[i] = 3.0f;
    dp_lcn_forward(y, keep, x, &g, 2);
    dp_lcn_backward(dx, dy, keep, &g, 2);
    for (int rr = 0; rr < 2; rr++)
        for (int yy = 0; yy < 11; yy++)
            for (int xx = 0; xx < 11; xx++)
                for (int ch = 0; ch < 2; ch++) {
                    size_t i = (((size_t)rr * 11 + yy) * 11 + xx) * 2 + ch;
                    CHECK(isfinite(y[i]) && isfinite(dx[i]));
                    if (yy > 0 && yy < 10 && xx > 0 && xx < 10)
                        CHECK(fabsf(y[i]) < 1e-5f);
                }
    free(x);
    free(y);
    free(keep);
    free(dy);
    free(dx);
}

/* ---- hand-worked cases ------------------------------------------------------- */

/* x is the 1x4x4 image 1..16 (x(y, x) = 4y + x + 1), the kernel 2x2
 * [1 2; 3 4] with no bias: out = x(y0,x0) + 2 x(y0,x0+1) + 3 x(y0+1,x0)
 * + 4 x(y0+1,x0+1), which inside the image is 10 x(y0,x0) + 34. */
static void conv_by_hand(int stride, int pad, const float *want, int oh)
{
    const float w[4] = {1, 2, 3, 4}, b[1] = {0};
    float x[16], rows[25 * 4], y[25], yl[25], wl[25 * 4], bl[25] = {0};
    for (int i = 0; i < 16; i++)
        x[i] = (float)(i + 1);
    dp_window g;
    REQUIRE(dp_window_init(&g, 1, 4, 4, 2, 2, stride, pad) == 0);
    REQUIRE(g.oh == oh && g.ow == oh);
    dp_im2row(rows, x, &g, 1);
    dp_dense_forward(y, rows, w, b, oh * oh, 4, 1);
    for (int p = 0; p < oh * oh; p++) /* the same filter at every position, untied */
        memcpy(wl + 4 * p, w, sizeof w);
    dp_local_forward(yl, rows, wl, bl, 1, oh * oh, 4, 1, 0);
    for (int i = 0; i < oh * oh; i++) {
        CHECKF(y[i] == want[i], "conv stride %d pad %d [%d] = %g, want %g", stride, pad, i,
               (double)y[i], (double)want[i]);
        CHECK(yl[i] == want[i]);
    }
}

static void test_by_hand(void)
{
    /* stride 1, no padding: 10 x0 + 34 for x0 = 1 2 3, 5 6 7, 9 10 11 */
    const float s1p0[9] = {44, 54, 64, 84, 94, 104, 124, 134, 144};
    /* stride 2, no padding: x0 = 1, 3, 9, 11 */
    const float s2p0[4] = {44, 64, 124, 144};
    /* stride 1, padding 1: windows start at y0, x0 = -1..3.  Row y0 = -1 sees
     * only image row 0 through taps 3 and 4: 4*1, 3*1+4*2, 3*2+4*3, 3*3+4*4,
     * 3*4 = 4 11 18 25 12.  Row y0 = 0: x0 = -1 sees taps 2, 4 on column 0:
     * 2*1+4*5 = 22; then 44 54 64; x0 = 3 taps 1, 3 on column 3: 4+3*8 = 28.
     * Row 1: 2*5+4*9 = 46, 84 94 104, 8+3*12 = 44.  Row 2: 2*9+4*13 = 70,
     * 124 134 144, 12+3*16 = 60.  Row y0 = 3 sees image row 3 through taps 1
     * and 2: 2*13 = 26, 13+2*14 = 41, 14+2*15 = 44, 15+2*16 = 47, 16. */
    const float s1p1[25] = {4,  11,  18,  25,  12, 22, 44, 54, 64, 28, 46, 84, 94,
                            104, 44, 70, 124, 134, 144, 60, 26, 41, 44, 47, 16};
    /* stride 2, padding 1: y0, x0 in {-1, 1, 3}, every other of the above */
    const float s2p1[9] = {4, 18, 12, 46, 94, 44, 26, 44, 16};
    conv_by_hand(1, 0, s1p0, 3);
    conv_by_hand(2, 0, s2p0, 2);
    conv_by_hand(1, 1, s1p1, 5);
    conv_by_hand(2, 1, s2p1, 3);

    /* the lowering itself: stride 1, padding 1, first row is (pad, pad, pad, x(0,0)) */
    dp_window g;
    float x[16], rows[25 * 4];
    for (int i = 0; i < 16; i++)
        x[i] = (float)(i + 1);
    REQUIRE(dp_window_init(&g, 1, 4, 4, 2, 2, 1, 1) == 0);
    dp_im2row(rows, x, &g, 1);
    CHECK(rows[0] == 0 && rows[1] == 0 && rows[2] == 0 && rows[3] == 1);
    CHECK(rows[4 * 6 + 0] == 1 && rows[4 * 6 + 1] == 2 && rows[4 * 6 + 2] == 5 &&
          rows[4 * 6 + 3] == 6);

    /* row2im of all ones, 2x2 stride 1 no padding: how many windows cover each pixel */
    REQUIRE(dp_window_init(&g, 1, 4, 4, 2, 2, 1, 0) == 0);
    float ones[9 * 4], cover[16];
    for (int i = 0; i < 36; i++)
        ones[i] = 1;
    dp_row2im(cover, ones, &g, 1);
    const float want_cover[16] = {1, 2, 2, 1, 2, 4, 4, 2, 2, 4, 4, 2, 1, 2, 2, 1};
    CHECK(memcmp(cover, want_cover, sizeof cover) == 0);

    /* 2x2 pools, stride 2, of 1..16: max 6 8 14 16; average (1+2+5+6)/4 =
     * 3.5, (3+4+7+8)/4 = 5.5, 11.5, 13.5 */
    REQUIRE(dp_window_init(&g, 1, 4, 4, 2, 2, 2, 0) == 0);
    float y[4], dx[16];
    dp_maxpool_forward(y, x, &g, 1);
    CHECK(y[0] == 6 && y[1] == 8 && y[2] == 14 && y[3] == 16);
    const float dy[4] = {1, 2, 3, 4};
    dp_maxpool_backward(dx, dy, x, y, &g, 1);
    const float want_max[16] = {0, 0, 0, 0, 0, 1, 0, 2, 0, 0, 0, 0, 0, 3, 0, 4};
    CHECK(memcmp(dx, want_max, sizeof dx) == 0);
    dp_avgpool_forward(y, x, &g, 1);
    CHECK(y[0] == 3.5f && y[1] == 5.5f && y[2] == 11.5f && y[3] == 13.5f);
    dp_avgpool_backward(dx, dy, &g, 1); /* dy / 4 over each window */
    const float want_avg[16] = {0.25f, 0.25f, 0.5f, 0.5f, 0.25f, 0.25f, 0.5f, 0.5f,
                                0.75f, 0.75f, 1,    1,    0.75f, 0.75f, 1,    1};
    CHECK(memcmp(dx, want_avg, sizeof dx) == 0);

    /* ties: the first maximum in scan order takes the gradient.  2x3 image
     * [3 3 1; 0 3 2], 2x2 stride 1: window 0 is [3 3; 0 3] (first 3 at (0,0)),
     * window 1 is [3 1; 3 2] (first 3 at (0,1)). */
    const float tie[6] = {3, 3, 1, 0, 3, 2}, tdy[2] = {10, 20};
    float ty[2], tdx[6];
    REQUIRE(dp_window_init(&g, 1, 2, 3, 2, 2, 1, 0) == 0);
    dp_maxpool_forward(ty, tie, &g, 1);
    CHECK(ty[0] == 3 && ty[1] == 3);
    dp_maxpool_backward(tdx, tdy, tie, ty, &g, 1);
    const float want_tie[6] = {10, 20, 0, 0, 0, 0};
    CHECK(memcmp(tdx, want_tie, sizeof tdx) == 0);
    /* [1 7; 7 7]: the first 7 is (0,1) */
    const float tie2[4] = {1, 7, 7, 7}, t2dy[1] = {5};
    REQUIRE(dp_window_init(&g, 1, 2, 2, 2, 2, 1, 0) == 0);
    dp_maxpool_forward(ty, tie2, &g, 1);
    dp_maxpool_backward(tdx, t2dy, tie2, ty, &g, 1);
    CHECK(ty[0] == 7 && tdx[0] == 0 && tdx[1] == 5 && tdx[2] == 0 && tdx[3] == 0);
    /* two channels, one window, each channel on its own: channel 0 is
     * [5 5; 5 1] (first 5 at (0,0)), channel 1 [1 2; 9 3] (the 9 at (1,0)) */
    const float tie3[8] = {5, 1, 5, 2, 5, 9, 1, 3}, t3dy[2] = {10, 20};
    float t3dx[8];
    REQUIRE(dp_window_init(&g, 2, 2, 2, 2, 2, 1, 0) == 0);
    dp_maxpool_forward(ty, tie3, &g, 1);
    CHECK(ty[0] == 5 && ty[1] == 9);
    dp_maxpool_backward(t3dx, t3dy, tie3, ty, &g, 1);
    const float want_tie3[8] = {10, 0, 0, 0, 0, 20, 0, 0};
    CHECK(memcmp(t3dx, want_tie3, sizeof t3dx) == 0);

    /* padding never wins the max and counts as zero in the average: 2x2
     * [-1 -2; -3 -4], 2x2 stride 1 padding 1, windows at y0, x0 = -1..1:
     * max -1 -1 -2 / -1 -1 -2 / -3 -3 -4; average corner -1/4, middle -10/4 */
    const float neg[4] = {-1, -2, -3, -4};
    float py[9];
    REQUIRE(dp_window_init(&g, 1, 2, 2, 2, 2, 1, 1) == 0);
    dp_maxpool_forward(py, neg, &g, 1);
    const float want_pmax[9] = {-1, -1, -2, -1, -1, -2, -3, -3, -4};
    CHECK(memcmp(py, want_pmax, sizeof py) == 0);
    dp_avgpool_forward(py, neg, &g, 1);
    CHECK(py[0] == -0.25f && py[4] == -2.5f && py[8] == -1.0f);
}

/* ---- dropout --------------------------------------------------------------- */

#define DROP_N 100000

static void test_dropout(void)
{
    float *x = falloc(DROP_N), *ones = falloc(DROP_N), *y = falloc(DROP_N),
          *y2 = falloc(DROP_N), *dx = falloc(DROP_N);
    dp_rng r;
    dp_rng_seed(&r, 5);
    fill(x, NULL, DROP_N, &r, -1, 1);
    for (int i = 0; i < DROP_N; i++)
        ones[i] = 1.0f;

    /* rate 0 is the identity, both ways */
    dp_dropout_forward(y, x, DROP_N, 0.0f, 42);
    CHECK(memcmp(y, x, DROP_N * sizeof *x) == 0);
    dp_dropout_backward(y, x, DROP_N, 0.0f, 42);
    CHECK(memcmp(y, x, DROP_N * sizeof *x) == 0);

    const float rates[3] = {0.1f, 0.5f, 0.9f};
    for (int t = 0; t < 3; t++) {
        float rate = rates[t], scale = 1.0f / (1.0f - rate);
        dp_dropout_forward(y, ones, DROP_N, rate, 1234 + t);
        long kept = 0, kept_odd = 0;
        int bad = 0;
        for (int i = 0; i < DROP_N; i++) {
            bad += y[i] != 0.0f && y[i] != scale;
            kept += y[i] != 0.0f;
            kept_odd += (i & 1) && y[i] != 0.0f;
        }
        CHECK(bad == 0);
        double frac = (double)kept / DROP_N, frac_odd = 2.0 * kept_odd / DROP_N;
        CHECKF(fabs(frac - (1 - rate)) <= 0.01, "rate %g kept %g", (double)rate, frac);
        /* both halves of each hash are fair */
        CHECKF(fabs(frac_odd - (1 - rate)) <= 0.015, "rate %g odd kept %g", (double)rate,
               frac_odd);

        /* the same seed the same mask; the forward's mask times the scale backward */
        dp_dropout_forward(y2, x, DROP_N, rate, 1234 + t);
        dp_dropout_backward(dx, x, DROP_N, rate, 1234 + t);
        bad = 0;
        for (int i = 0; i < DROP_N; i++) {
            bad += y2[i] != (y[i] != 0.0f ? x[i] * scale : 0.0f);
            bad += dx[i] != (y[i] != 0.0f ? x[i] * scale : 0.0f);
        }
        CHECKF(bad == 0, "rate %g: %d elements off the mask", (double)rate, bad);

        /* another seed another mask: about 2 rate (1 - rate) of the elements differ */
        dp_dropout_forward(y2, ones, DROP_N, rate, 99999 + t);
        long differ = 0;
        for (int i = 0; i < DROP_N; i++)
            differ += (y[i] != 0.0f) != (y2[i] != 0.0f);
        double want = 2.0 * rate * (1 - rate);
        CHECKF(fabs((double)differ / DROP_N - want) <= 0.01, "rate %g seeds differ in %g",
               (double)rate, (double)differ / DROP_N);

        /* the mask is a function of (seed, index): a shorter or odd-length
         * call agrees on its elements; in place gives the same */
        dp_dropout_forward(y2, ones, 777, rate, 1234 + t);
        CHECK(memcmp(y2, y, 777 * sizeof *y) == 0);
        memcpy(y2, ones, DROP_N * sizeof *y2);
        dp_dropout_forward(y2, y2, DROP_N, rate, 1234 + t);
        CHECK(memcmp(y2, y, DROP_N * sizeof *y) == 0);
    }
    free(x);
    free(ones);
    free(y);
    free(y2);
    free(dx);
}

/* ---- dp_window_init ---------------------------------------------------------- */

static void test_window_init(void)
{
    dp_window g;
    CHECK(dp_window_init(&g, 1, 4, 4, 2, 2, 2, 0) == 0 && g.oh == 2 && g.ow == 2);
    CHECK(dp_window_init(&g, 3, 5, 7, 3, 5, 2, 1) == 0 && g.oh == 3 && g.ow == 3);
    CHECK(dp_window_init(&g, 1, 6, 6, 3, 3, 3, 1) == 0 && g.oh == 2 && g.ow == 2);
    CHECK(dp_window_init(&g, 1, 1, 1, 1, 1, 1, 0) == 0 && g.oh == 1 && g.ow == 1);
    /* a window as large as the padded input fits once */
    CHECK(dp_window_init(&g, 1, 3, 2, 5, 4, 1, 1) == 0 && g.oh == 1 && g.ow == 1);
    CHECK(g.c == 1 && g.h == 3 && g.w == 2 && g.kh == 5 && g.kw == 4 && g.stride == 1 &&
          g.pad == 1);

    CHECK(dp_window_init(&g, 1, 3, 3, 4, 4, 1, 0) == -1); /* larger than the input */
    CHECK(dp_window_init(&g, 1, 3, 3, 6, 2, 1, 1) == -1); /* taller than the padded input */
    CHECK(dp_window_init(&g, 1, 3, 3, 2, 6, 1, 1) == -1); /* wider than the padded input */
    CHECK(dp_window_init(&g, 0, 4, 4, 2, 2, 1, 0) == -1); /* no channels */
    CHECK(dp_window_init(&g, 1, 0, 4, 1, 1, 1, 0) == -1);
    CHECK(dp_window_init(&g, 1, 4, 0, 1, 1, 1, 0) == -1);
    CHECK(dp_window_init(&g, 1, 4, 4, 0, 2, 1, 0) == -1);
    CHECK(dp_window_init(&g, 1, 4, 4, 2, 0, 1, 0) == -1);
    CHECK(dp_window_init(&g, 1, 4, 4, 2, 2, 0, 0) == -1); /* stride 0 */
    CHECK(dp_window_init(&g, 1, 4, 4, 2, 2, -1, 0) == -1);
    CHECK(dp_window_init(&g, 1, 4, 4, 2, 2, 1, -1) == -1); /* negative padding */
    CHECK(dp_window_init(&g, 1, 4, 4, 2, 2, 1, 2) == -1);  /* padding == window */
    CHECK(dp_window_init(&g, 1, 4, 4, 3, 2, 1, 2) == -1);  /* padding == window width */
    CHECK(dp_window_init(&g, 1, 4, 4, 2, 3, 1, 2) == -1);  /* padding == window height */
    CHECK(dp_window_init(&g, 1, 4, 4, 2, 2, 1, 5) == -1);  /* padding > window */
    CHECK(dp_window_init(&g, 1, 4, 4, 3, 3, 1, 1 << 30) == -1);
}

/* ---- threads --------------------------------------------------------------- */

/* The outputs of run_all, one buffer each. */
enum { T_ROWS, T_DIMG, T_LOCAL, T_LDW, T_LDB, T_LDROWS, T_MAXO, T_MAXD, T_AVGO, T_AVGD,
       T_LCNO, T_LCND, T_CHW, T_HWC, T_DROP, T_COUNT };

/* Every kernel on a geometry large enough to be split over the pool. */
static void run_all(float **o, const float *x, const float *w, const float *b, const float *dy,
                    const dp_window *g, const dp_window *lg, int batch, int oc, float *keep)
{
    int P = g->oh * g->ow, k = (int)win_size(g);
    dp_im2row(o[T_ROWS], x, g, batch);
    dp_row2im(o[T_DIMG], o[T_ROWS], g, batch);
    dp_local_forward(o[T_LOCAL], o[T_ROWS], w, b, batch, P, k, oc, 1);
    dp_local_backward(o[T_LDROWS], o[T_LDW], o[T_LDB], dy, o[T_ROWS], w, batch, P, k, oc, 0);
    dp_maxpool_forward(o[T_MAXO], x, g, batch);
    dp_maxpool_backward(o[T_MAXD], dy, x, o[T_MAXO], g, batch);
    dp_avgpool_forward(o[T_AVGO], x, g, batch);
    dp_avgpool_backward(o[T_AVGD], dy, g, batch);
    dp_lcn_forward(o[T_LCNO], keep, x, lg, batch);
    dp_lcn_backward(o[T_LCND], x, keep, lg, batch);
    dp_hwc_to_chw(o[T_CHW], x, batch, g->c, g->h * g->w);
    dp_chw_to_hwc(o[T_HWC], x, batch, g->c, g->h * g->w);
    dp_dropout_forward(o[T_DROP], x, img_size(g, batch), 0.3f, 11);
}

static void test_threads(void)
{
    dp_window g, lg;
    const int batch = 4, oc = 8;
    REQUIRE(dp_window_init(&g, 6, 33, 29, 3, 5, 2, 1) == 0);
    REQUIRE(dp_window_init(&lg, 6, 33, 29, 5, 5, 1, 2) == 0);
    size_t ni = img_size(&g, batch), m = out_pos(&g, batch), k = win_size(&g);
    size_t P = (size_t)g.oh * g.ow, no = m * g.c;
    dp_rng r;
    dp_rng_seed(&r, 9);
    /* dy serves as every backward's dout: m*k floats cover them all */
    REQUIRE(k >= (size_t)oc && k >= (size_t)g.c);
    float *x = falloc(ni), *w = falloc(P * oc * k), *b = falloc(P * oc), *dy = falloc(m * k);
    fill(x, NULL, ni, &r, -1, 1);
    fill(w, NULL, P * oc * k, &r, -1, 1);
    fill(b, NULL, P * oc, &r, -1, 1);
    fill(dy, NULL, m * k, &r, -1, 1);
    float *keep = falloc((size_t)batch * dp_lcn_keep_floats(&lg));
    const size_t sizes[T_COUNT] = {m * k, ni, m * oc, P * oc * k, P * oc, m * k, no, ni, no,
                                   ni,    ni, ni, ni,     ni,         ni};
    const char *names[T_COUNT] = {"im2row", "row2im", "local forward", "local dw", "local db",
                                  "local drows", "maxpool forward", "maxpool backward",
                                  "avgpool forward", "avgpool backward", "lcn forward",
                                  "lcn backward", "hwc_to_chw", "chw_to_hwc", "dropout"};
    float *o[2][T_COUNT];
    for (int t = 0; t < 2; t++) {
        for (int i = 0; i < T_COUNT; i++)
            o[t][i] = falloc(sizes[i]);
        dp_blas_set_threads(t + 1);
        REQUIRE(dp_blas_threads() == t + 1);
        run_all(o[t], x, w, b, dy, &g, &lg, batch, oc, keep);
    }
    for (int i = 0; i < T_COUNT; i++)
        CHECKF(memcmp(o[0][i], o[1][i], sizes[i] * sizeof(float)) == 0,
               "%s differs between 1 and 2 threads", names[i]);
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < T_COUNT; i++)
            free(o[t][i]);
    free(x);
    free(w);
    free(b);
    free(dy);
    free(keep);
}

int main(void)
{
    dp_blas_set_threads(2);
    test_window_init();
    test_by_hand();
    for (uint64_t seed = 1; seed <= 60; seed++) {
        test_lowering(seed);
        test_conv_local(seed, 0);
        test_conv_local(seed, 1);
        test_pool(seed, 0);
        test_pool(seed, 1);
    }
    /* the random geometries covered what they should */
    for (int i = 1; i <= 5; i++)
        CHECKF(seen_k[i] && seen_c[i], "kernel size or channel count %d never drawn", i);
    CHECK(seen_stride[1] && seen_stride[2] && seen_stride[3]);
    CHECK(seen_pad[0] && seen_pad[1] && seen_pad[2]);
    CHECK(seen_parity[0] && seen_parity[1] && seen_nonsquare);
    for (uint64_t seed = 1; seed <= 30; seed++)
        test_lcn(seed);
    CHECKF(lcn_totals.s_wins > 0 && lcn_totals.mean_wins > 0,
           "random LCN cases: s won %d pixels, the mean %d", lcn_totals.s_wins,
           lcn_totals.mean_wins);
    test_lcn_winners();
    test_lcn_constant();
    test_dropout();
    test_threads();
    dp_blas_set_threads(1);
    fprintf(stderr, "%ld coordinates checked by finite differences; LCN pixels won by s %d, "
            "the mean %d, eps %d\n", fd_coords, lcn_totals.s_wins, lcn_totals.mean_wins,
            lcn_totals.eps_wins);
    return CHECK_DONE();
}
