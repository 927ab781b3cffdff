/* Bands of output rows: the window kernels (window.c, pool2d.c) restricted
 * to output rows [oy0, oy1) of every sample, for spatial model parallelism
 * (docs/architecture.md, "Model parallelism"): a task computes its band of a
 * layer from the input rows the band's windows cover, its own rows and the
 * halo rows its neighbours sent.  Images keep their full NHWC layout; only
 * the rows named are read or written.  The sums run in the order of the
 * whole-image kernels (ky, then ox; outputs in order), so a band gives the
 * whole kernel's numbers on its rows. */
#include "downpour/layers.h"

#include <math.h>
#include <string.h>

/* [*lo, *hi): the k whose pixel x0 + k lies inside [0, n). */
static void valid_span(int x0, int k, int n, int *lo, int *hi)
{
    *lo = x0 < 0 ? -x0 : 0;
    *hi = n - x0 < k ? n - x0 : k;
    if (*hi < *lo)
        *hi = *lo;
}

void dp_window_band_rows(const dp_window *g, int oy0, int oy1, int *iy0, int *iy1)
{
    int a = oy0 * g->stride - g->pad, b = (oy1 - 1) * g->stride - g->pad + g->kh;
    *iy0 = a < 0 ? 0 : a;
    *iy1 = b > g->h ? g->h : b;
    if (oy1 <= oy0 || *iy1 < *iy0)
        *iy0 = *iy1 = 0;
}

void dp_im2row_band(float *rows, const float *in, const dp_window *g, int batch, int oy0,
                    int oy1)
{
    const int c = g->c, h = g->h, w = g->w, kh = g->kh, kw = g->kw;
    const size_t run = (size_t)kw * c, hwc = (size_t)h * w * c;
    float *restrict dst = rows;
    for (int r = 0; r < batch; r++) {
        const float *img = in + (size_t)r * hwc;
        for (int oy = oy0; oy < oy1; oy++)
            for (int ox = 0; ox < g->ow; ox++) {
                int iy0 = oy * g->stride - g->pad, ix0 = ox * g->stride - g->pad;
                int kx_lo, kx_hi;
                valid_span(ix0, kw, w, &kx_lo, &kx_hi);
                size_t head = (size_t)kx_lo * c, body = (size_t)(kx_hi - kx_lo) * c;
                for (int ky = 0; ky < kh; ky++, dst += run) {
                    int iy = iy0 + ky;
                    if (iy < 0 || iy >= h) {
                        memset(dst, 0, run * sizeof *dst);
                        continue;
                    }
                    memset(dst, 0, head * sizeof *dst);
                    memcpy(dst + head, img + ((size_t)iy * w + (size_t)(ix0 + kx_lo)) * c,
                           body * sizeof *dst);
                    memset(dst + head + body, 0, (run - head - body) * sizeof *dst);
                }
            }
    }
}

void dp_row2im_band(float *din, const float *drows, const dp_window *g, int batch, int oy0,
                    int oy1)
{
    const int c = g->c, h = g->h, w = g->w, kh = g->kh, kw = g->kw, s = g->stride;
    const size_t run = (size_t)kw * c, k = (size_t)kh * run, wc = (size_t)w * c;
    const int nb = oy1 - oy0;
    int iy0, iy1;
    dp_window_band_rows(g, oy0, oy1, &iy0, &iy1);
    for (int r = 0; r < batch; r++)
        for (int iy = iy0; iy < iy1; iy++) {
            float *restrict dst = din + ((size_t)r * h + (size_t)iy) * wc;
            memset(dst, 0, wc * sizeof *dst);
            for (int ky = 0; ky < kh; ky++) {
                int t = iy + g->pad - ky; /* oy * stride */
                if (t < 0 || t % s)
                    continue;
                int oy = t / s;
                if (oy < oy0 || oy >= oy1)
                    continue;
                const float *src_row =
                    drows + (((size_t)r * nb + (size_t)(oy - oy0)) * g->ow) * k + ky * run;
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

/* Zeroes the band's input rows of din. */
static void zero_band_rows(float *din, const dp_window *g, int batch, int oy0, int oy1)
{
    int iy0, iy1;
    dp_window_band_rows(g, oy0, oy1, &iy0, &iy1);
    size_t wc = (size_t)g->w * g->c;
    for (int r = 0; r < batch; r++)
        memset(din + ((size_t)r * g->h + (size_t)iy0) * wc, 0,
               (size_t)(iy1 - iy0) * wc * sizeof *din);
}

void dp_maxpool_backward_band(float *din, const float *dout, const float *in, const float *out,
                              const dp_window *g, int batch, int oy0, int oy1)
{
    const int c = g->c, h = g->h, w = g->w;
    zero_band_rows(din, g, batch, oy0, oy1);
    for (int r = 0; r < batch; r++) {
        const float *img = in + (size_t)r * h * w * c;
        float *dimg = din + (size_t)r * h * w * c;
        for (int oy = oy0; oy < oy1; oy++)
            for (int ox = 0; ox < g->ow; ox++) {
                size_t at_out = (((size_t)r * g->oh + (size_t)oy) * g->ow + (size_t)ox) * c;
                const float *o = out + at_out, *d = dout + at_out;
                int iy0 = oy * g->stride - g->pad, ix0 = ox * g->stride - g->pad;
                int ky_lo, ky_hi, kx_lo, kx_hi;
                valid_span(iy0, g->kh, h, &ky_lo, &ky_hi);
                valid_span(ix0, g->kw, w, &kx_lo, &kx_hi);
                /* per channel, the first pixel equal to the output in scan order */
                for (int ch = 0; ch < c; ch++) {
                    int found = 0;
                    for (int ky = ky_lo; ky < ky_hi && !found; ky++)
                        for (int kx = kx_lo; kx < kx_hi && !found; kx++) {
                            size_t at = ((size_t)(iy0 + ky) * w + (size_t)(ix0 + kx)) * c + ch;
                            if (img[at] == o[ch]) {
                                dimg[at] += d[ch];
                                found = 1;
                            }
                        }
                }
            }
    }
}

void dp_avgpool_backward_band(float *din, const float *dout, const dp_window *g, int batch,
                              int oy0, int oy1)
{
    const int c = g->c, h = g->h, w = g->w;
    const float inv = 1.0f / (float)(g->kh * g->kw);
    zero_band_rows(din, g, batch, oy0, oy1);
    for (int r = 0; r < batch; r++) {
        float *dimg = din + (size_t)r * h * w * c;
        for (int oy = oy0; oy < oy1; oy++)
            for (int ox = 0; ox < g->ow; ox++) {
                const float *d =
                    dout + (((size_t)r * g->oh + (size_t)oy) * g->ow + (size_t)ox) * c;
                int iy0 = oy * g->stride - g->pad, ix0 = ox * g->stride - g->pad;
                int ky_lo, ky_hi, kx_lo, kx_hi;
                valid_span(iy0, g->kh, h, &ky_lo, &ky_hi);
                valid_span(ix0, g->kw, w, &kx_lo, &kx_hi);
                for (int ky = ky_lo; ky < ky_hi; ky++)
                    for (int kx = kx_lo; kx < kx_hi; kx++) {
                        float *restrict px =
                            dimg + ((size_t)(iy0 + ky) * w + (size_t)(ix0 + kx)) * c;
                        for (int ch = 0; ch < c; ch++)
                            px[ch] += d[ch];
                    }
            }
    }
    /* the divisor after the sum, as dp_avgpool_backward applies it */
    int iy0, iy1;
    dp_window_band_rows(g, oy0, oy1, &iy0, &iy1);
    size_t wc = (size_t)w * c;
    for (int r = 0; r < batch; r++) {
        float *restrict p = din + ((size_t)r * h + (size_t)iy0) * wc;
        for (size_t e = 0; e < (size_t)(iy1 - iy0) * wc; e++)
            p[e] *= inv;
    }
}
