/* Windows over NHWC images: the geometry (dp_window_init), the lowering of
 * every window to one row (dp_im2row) and its adjoint (dp_row2im), and the
 * per-sample layout changes between HWC and CHW.
 *
 * In NHWC, the kw neighbours of one window row are kw*c contiguous floats, so
 * the lowering is a memcpy per (output position, ky) with zeros where the
 * window hangs over the padding.  The adjoint is written as a gather: each
 * thread owns whole input rows (sample, iy) and adds into them every window
 * row that covers them, in a fixed order (ky, then ox), so no two threads
 * touch one pixel and the sums never depend on the thread count. */
#include "downpour/layers.h"

#include <string.h>

#include "downpour/pool.h"

/* Work below this many floats stays on the calling thread: waking the pool
 * costs more than it saves. */
#define WINDOW_MIN_SPLIT 16384

int dp_window_init(dp_window *g, int c, int h, int w, int kh, int kw, int stride, int pad)
{
    memset(g, 0, sizeof *g);
    if (c < 1 || h < 1 || w < 1 || kh < 1 || kw < 1 || stride < 1 || pad < 0 || pad >= kh ||
        pad >= kw)
        return -1;
    /* long long: h + 2 pad may not fit an int */
    long long ph = (long long)h + 2LL * pad, pw = (long long)w + 2LL * pad;
    if (kh > ph || kw > pw)
        return -1;
    g->c = c;
    g->h = h;
    g->w = w;
    g->kh = kh;
    g->kw = kw;
    g->stride = stride;
    g->pad = pad;
    g->oh = (int)((ph - kh) / stride + 1);
    g->ow = (int)((pw - kw) / stride + 1);
    return 0;
}

/* [*lo, *hi): the kx (or ky) whose pixel x0 + kx lies inside [0, n). */
static void valid_span(int x0, int k, int n, int *lo, int *hi)
{
    *lo = x0 < 0 ? -x0 : 0;
    *hi = n - x0 < k ? n - x0 : k;
    if (*hi < *lo)
        *hi = *lo;
}

typedef struct lower_job {
    float *rows;
    const float *in;
    const dp_window *g;
    int batch;
} lower_job;

/* A short run is copied with fixed-size moves (each an inlined vector load
 * and store): most window rows are a few pixels of a few channels, where a
 * call to memcpy costs more than the copy, and gcc turns a plain element
 * loop back into that call. */
static inline void copy_run(float *restrict dst, const float *restrict src, size_t n)
{
    if (n > 64) {
        memcpy(dst, src, n * sizeof *dst);
        return;
    }
    size_t e = 0;
    for (; e + 4 <= n; e += 4)
        memcpy(dst + e, src + e, 4 * sizeof *dst);
    switch (n - e) {
    case 3: memcpy(dst + e, src + e, 3 * sizeof *dst); break;
    case 2: memcpy(dst + e, src + e, 2 * sizeof *dst); break;
    case 1: dst[e] = src[e]; break;
    default: break;
    }
}

/* Rows [lo, hi) of the lowering: one row per output position (r, oy, ox),
 * walked in order without dividing per row. */
static void im2row_rows(const lower_job *j, size_t lo, size_t hi)
{
    const dp_window *g = j->g;
    const int c = g->c, h = g->h, w = g->w, kh = g->kh, kw = g->kw;
    const size_t run = (size_t)kw * c, k = (size_t)kh * run;
    const size_t per_sample = (size_t)g->oh * g->ow;
    if (lo >= hi)
        return;
    size_t r = lo / per_sample;
    int oy = (int)(lo % per_sample / (size_t)g->ow), ox = (int)(lo % (size_t)g->ow);
    const float *img = j->in + r * (size_t)h * w * c;
    for (size_t row = lo; row < hi; row++) {
        int iy0 = oy * g->stride - g->pad, ix0 = ox * g->stride - g->pad;
        int kx_lo, kx_hi;
        valid_span(ix0, kw, w, &kx_lo, &kx_hi);
        size_t head = (size_t)kx_lo * c, body = (size_t)(kx_hi - kx_lo) * c;
        float *restrict dst = j->rows + row * k;
        for (int ky = 0; ky < kh; ky++, dst += run) {
            int iy = iy0 + ky;
            if (iy < 0 || iy >= h) {
                memset(dst, 0, run * sizeof *dst);
                continue;
            }
            if (head)
                memset(dst, 0, head * sizeof *dst);
            copy_run(dst + head, img + ((size_t)iy * w + (size_t)(ix0 + kx_lo)) * c, body);
            if (head + body < run)
                memset(dst + head + body, 0, (run - head - body) * sizeof *dst);
        }
        if (++ox == g->ow) {
            ox = 0;
            if (++oy == g->oh) {
                oy = 0;
                img += (size_t)h * w * c;
            }
        }
    }
}

static void im2row_task(void *ctx, int i, int n)
{
    const lower_job *j = ctx;
    size_t lo, hi;
    dp_pool_range((size_t)j->batch * j->g->oh * j->g->ow, 1, i, n, &lo, &hi);
    im2row_rows(j, lo, hi);
}

void dp_im2row(float *rows, const float *in, const dp_window *g, int batch)
{
    lower_job j = {rows, in, g, batch};
    size_t m = (size_t)(batch > 0 ? batch : 0) * g->oh * g->ow;
    if (m * g->kh * g->kw * g->c < WINDOW_MIN_SPLIT)
        im2row_rows(&j, 0, m);
    else
        dp_pool_run(im2row_task, &j);
}

typedef struct raise_job {
    float *din;
    const float *drows;
    const dp_window *g;
    int batch;
} raise_job;

/* Input rows [lo, hi) of din, each (r, iy): zeroed, then every window row
 * (oy, ky) with oy*stride - pad + ky == iy added in, ky ascending, ox
 * ascending within. */
static void row2im_rows(const raise_job *j, size_t lo, size_t hi)
{
    const dp_window *g = j->g;
    const int c = g->c, h = g->h, w = g->w, kh = g->kh, kw = g->kw, s = g->stride;
    const size_t run = (size_t)kw * c, k = (size_t)kh * run, wc = (size_t)w * c;
    for (size_t row = lo; row < hi; row++) {
        size_t r = row / (size_t)h;
        int iy = (int)(row % (size_t)h);
        float *restrict dst = j->din + row * wc;
        memset(dst, 0, wc * sizeof *dst);
        for (int ky = 0; ky < kh; ky++) {
            int t = iy + g->pad - ky; /* oy * stride */
            if (t < 0 || t % s)
                continue;
            int oy = t / s;
            if (oy >= g->oh)
                continue;
            const float *src_row = j->drows + ((r * g->oh + (size_t)oy) * g->ow) * k + ky * run;
            for (int ox = 0; ox < g->ow; ox++) {
                int ix0 = ox * s - g->pad, kx_lo, kx_hi;
                valid_span(ix0, kw, w, &kx_lo, &kx_hi);
                size_t len = (size_t)(kx_hi - kx_lo) * c;
                const float *restrict src = src_row + (size_t)ox * k + (size_t)kx_lo * c;
                float *restrict d = dst + (size_t)(ix0 + kx_lo) * c;
                for (size_t e = 0; e < len; e++)
                    d[e] += src[e];
            }
        }
    }
}

static void row2im_task(void *ctx, int i, int n)
{
    const raise_job *j = ctx;
    size_t lo, hi;
    dp_pool_range((size_t)j->batch * j->g->h, 1, i, n, &lo, &hi);
    row2im_rows(j, lo, hi);
}

void dp_row2im(float *din, const float *drows, const dp_window *g, int batch)
{
    raise_job j = {din, drows, g, batch};
    size_t m = (size_t)(batch > 0 ? batch : 0) * g->oh * g->ow;
    if (m * g->kh * g->kw * g->c < WINDOW_MIN_SPLIT)
        row2im_rows(&j, 0, (size_t)(batch > 0 ? batch : 0) * g->h);
    else
        dp_pool_run(row2im_task, &j);
}

typedef struct layout_job {
    float *out;
    const float *in;
    int batch, c, hw;
    int to_chw;
} layout_job;

/* A tile of this many pixels by every channel stays in L1 while transposed. */
#define LAYOUT_TILE 32

static void hwc_to_chw_one(float *restrict out, const float *restrict in, int c, int hw)
{
    for (int p0 = 0; p0 < hw; p0 += LAYOUT_TILE) {
        int p1 = p0 + LAYOUT_TILE < hw ? p0 + LAYOUT_TILE : hw;
        for (int ch = 0; ch < c; ch++) {
            float *restrict o = out + (size_t)ch * hw;
            for (int p = p0; p < p1; p++)
                o[p] = in[(size_t)p * c + ch];
        }
    }
}

static void chw_to_hwc_one(float *restrict out, const float *restrict in, int c, int hw)
{
    for (int p0 = 0; p0 < hw; p0 += LAYOUT_TILE) {
        int p1 = p0 + LAYOUT_TILE < hw ? p0 + LAYOUT_TILE : hw;
        for (int ch = 0; ch < c; ch++) {
            const float *restrict s = in + (size_t)ch * hw;
            for (int p = p0; p < p1; p++)
                out[(size_t)p * c + ch] = s[p];
        }
    }
}

static void layout_samples(const layout_job *j, size_t lo, size_t hi)
{
    size_t per = (size_t)j->c * j->hw;
    for (size_t r = lo; r < hi; r++) {
        if (j->to_chw)
            hwc_to_chw_one(j->out + r * per, j->in + r * per, j->c, j->hw);
        else
            chw_to_hwc_one(j->out + r * per, j->in + r * per, j->c, j->hw);
    }
}

static void layout_task(void *ctx, int i, int n)
{
    const layout_job *j = ctx;
    size_t lo, hi;
    dp_pool_range((size_t)j->batch, 1, i, n, &lo, &hi);
    layout_samples(j, lo, hi);
}

static void layout(float *out, const float *in, int batch, int c, int hw, int to_chw)
{
    layout_job j = {out, in, batch, c, hw, to_chw};
    if (batch <= 0)
        return;
    if ((size_t)batch * c * hw < WINDOW_MIN_SPLIT)
        layout_samples(&j, 0, (size_t)batch);
    else
        dp_pool_run(layout_task, &j);
}

void dp_hwc_to_chw(float *out, const float *in, int batch, int c, int hw)
{
    layout(out, in, batch, c, hw, 1);
}

void dp_chw_to_hwc(float *out, const float *in, int batch, int c, int hw)
{
    layout(out, in, batch, c, hw, 0);
}
