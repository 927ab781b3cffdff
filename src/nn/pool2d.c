/* Max and average pooling over NHWC images, channel by channel.
 *
 * Forwards are split over the pool by output position: each writes its own c
 * outputs, scanning the window in (ky, kx) order with the channels as the
 * vectorised inner loop.  The average's backward is a gather over input rows
 * (sample, iy), like dp_row2im, so threads never share a pixel.  The max's
 * backward scatters each output's gradient to the first maximum of its
 * window, so it is split by (sample, block of channels): the windows of one
 * such unit only ever touch its own pixels' channels; windows that tile
 * the image (2x2 stride 2 on an even image) split by output instead, each
 * writing its own pixels once.
 *
 * The channel loops are compiled for each instruction set (isa_paths.h):
 * each lane is a channel of its own, so every path gives the same bits. */
#include "downpour/layers.h"

#include <math.h>
#include <string.h>

#include "downpour/pool.h"
#include "nn/isa_paths.h"

/* Work below this many floats stays on the calling thread. */
#define POOL2D_MIN_SPLIT 16384
/* Channels per unit of the max's backward: one 64-byte line of floats. */
#define MAX_CBLOCK 16

typedef struct pool_job {
    float *out;       /* forward: out;  backward: din */
    const float *in;  /* forward and max backward: the input */
    const float *dout, *fout;
    const dp_window *g;
    int batch;
} pool_job;

/* [*lo, *hi): the k whose pixel x0 + k lies inside [0, n). */
static void valid_span(int x0, int k, int n, int *lo, int *hi)
{
    *lo = x0 < 0 ? -x0 : 0;
    *hi = n - x0 < k ? n - x0 : k;
    if (*hi < *lo)
        *hi = *lo;
}

static size_t positions(const pool_job *j)
{
    return (size_t)(j->batch > 0 ? j->batch : 0) * j->g->oh * j->g->ow;
}

/* Outputs [lo, hi) (each one (r, oy, ox) with its c channels); avg selects
 * the average, else the max. */
DP_ISA_BODY void forward_range_body(const pool_job *j, size_t lo, size_t hi, int avg)
{
    const dp_window *g = j->g;
    const int c = g->c, h = g->h, w = g->w;
    const size_t per_sample = (size_t)g->oh * g->ow;
    const float inv = 1.0f / (float)(g->kh * g->kw);
    for (size_t pos = lo; pos < hi; pos++) {
        size_t r = pos / per_sample, q = pos % per_sample;
        int iy0 = (int)(q / (size_t)g->ow) * g->stride - g->pad;
        int ix0 = (int)(q % (size_t)g->ow) * g->stride - g->pad;
        int ky_lo, ky_hi, kx_lo, kx_hi;
        valid_span(iy0, g->kh, h, &ky_lo, &ky_hi);
        valid_span(ix0, g->kw, w, &kx_lo, &kx_hi);
        float *restrict o = j->out + pos * c;
        const float *img = j->in + r * (size_t)h * w * c;
        for (int ch = 0; ch < c; ch++)
            o[ch] = avg ? 0.0f : -INFINITY;
        for (int ky = ky_lo; ky < ky_hi; ky++)
            for (int kx = kx_lo; kx < kx_hi; kx++) {
                const float *restrict px =
                    img + ((size_t)(iy0 + ky) * w + (size_t)(ix0 + kx)) * c;
                if (avg) {
                    for (int ch = 0; ch < c; ch++)
                        o[ch] += px[ch];
                } else {
                    for (int ch = 0; ch < c; ch++)
                        o[ch] = px[ch] > o[ch] ? px[ch] : o[ch];
                }
            }
        if (avg)
            for (int ch = 0; ch < c; ch++)
                o[ch] *= inv;
    }
}

typedef void (*range_fn)(const pool_job *j, size_t lo, size_t hi, int flag);
DP_ISA_FN(range_fn, forward_range, (const pool_job *j, size_t lo, size_t hi, int avg),
          (j, lo, hi, avg))

DP_ISA_BODY void max_forward_task_body(void *ctx, int i, int n)
{
    const pool_job *j = ctx;
    size_t lo, hi;
    dp_pool_range(positions(j), 1, i, n, &lo, &hi);
    forward_range_body(j, lo, hi, 0);
}
DP_ISA_POOL_TASK(max_forward_task)

DP_ISA_BODY void avg_forward_task_body(void *ctx, int i, int n)
{
    const pool_job *j = ctx;
    size_t lo, hi;
    dp_pool_range(positions(j), 1, i, n, &lo, &hi);
    forward_range_body(j, lo, hi, 1);
}
DP_ISA_POOL_TASK(avg_forward_task)

static void run_forward(pool_job *j, int avg)
{
    size_t work = positions(j) * j->g->kh * j->g->kw * j->g->c;
    int l = dp_isa_paths_level();
    if (work < POOL2D_MIN_SPLIT)
        forward_range[l](j, 0, positions(j), avg);
    else
        dp_pool_run(avg ? avg_forward_task[l] : max_forward_task[l], j);
}

void dp_maxpool_forward(float *out, const float *in, const dp_window *g, int batch)
{
    pool_job j = {.out = out, .in = in, .g = g, .batch = batch};
    run_forward(&j, 0);
}

void dp_avgpool_forward(float *out, const float *in, const dp_window *g, int batch)
{
    pool_job j = {.out = out, .in = in, .g = g, .batch = batch};
    run_forward(&j, 1);
}

/* A band of output rows [oy0, oy1) of every sample (src/nn/band.c has the
 * other band kernels): the same outputs as the whole image's, on the
 * calling thread. */
static void forward_band(float *out, const float *in, const dp_window *g, int batch, int oy0,
                         int oy1, int avg)
{
    pool_job j = {.out = out, .in = in, .g = g, .batch = batch};
    size_t per = (size_t)g->oh * g->ow;
    range_fn range = forward_range[dp_isa_paths_level()];
    for (int r = 0; r < batch && oy1 > oy0; r++)
        range(&j, r * per + (size_t)oy0 * g->ow, r * per + (size_t)oy1 * g->ow, avg);
}

void dp_maxpool_forward_band(float *out, const float *in, const dp_window *g, int batch,
                             int oy0, int oy1)
{
    forward_band(out, in, g, batch, oy0, oy1, 0);
}

void dp_avgpool_forward_band(float *out, const float *in, const dp_window *g, int batch,
                             int oy0, int oy1)
{
    forward_band(out, in, g, batch, oy0, oy1, 1);
}

/* Units [lo, hi) of the max's backward, unit u = (sample u / blocks, channel
 * block u % blocks).  Outputs in order, each window in scan order: the first
 * pixel equal to the output takes the gradient.  Branch-free so the channel
 * loop vectorises: `left` holds each channel's gradient until a pixel equal
 * to the maximum takes it, and 0 after.  relu: the input is a relu's output
 * and din the gradient at the relu's input, so a maximum that is not positive
 * passes nothing (the relu's mask, fused). */
DP_ISA_BODY void max_backward_range_body(const pool_job *j, size_t lo, size_t hi, int relu)
{
    const dp_window *g = j->g;
    const int c = g->c, h = g->h, w = g->w;
    const size_t blocks = ((size_t)c + MAX_CBLOCK - 1) / MAX_CBLOCK;
    const size_t hw = (size_t)h * w, per_sample = (size_t)g->oh * g->ow;
    for (size_t u = lo; u < hi; u++) {
        size_t r = u / blocks;
        int c0 = (int)(u % blocks) * MAX_CBLOCK;
        int nc = c - c0 < MAX_CBLOCK ? c - c0 : MAX_CBLOCK;
        float *din = j->out + r * hw * c + c0;
        const float *img = j->in + r * hw * c + c0;
        for (size_t p = 0; p < hw; p++)
            memset(din + p * c, 0, (size_t)nc * sizeof *din);
        for (size_t q = 0; q < per_sample; q++) {
            const float *restrict o = j->fout + (r * per_sample + q) * c + c0;
            const float *restrict d = j->dout + (r * per_sample + q) * c + c0;
            int iy0 = (int)(q / (size_t)g->ow) * g->stride - g->pad;
            int ix0 = (int)(q % (size_t)g->ow) * g->stride - g->pad;
            int ky_lo, ky_hi, kx_lo, kx_hi;
            valid_span(iy0, g->kh, h, &ky_lo, &ky_hi);
            valid_span(ix0, g->kw, w, &kx_lo, &kx_hi);
            float left[MAX_CBLOCK];
            for (int ch = 0; ch < nc; ch++)
                left[ch] = relu ? (float)(o[ch] > 0.0f) * d[ch] : d[ch];
            for (int ky = ky_lo; ky < ky_hi; ky++)
                for (int kx = kx_lo; kx < kx_hi; kx++) {
                    size_t at = ((size_t)(iy0 + ky) * w + (size_t)(ix0 + kx)) * c;
                    float *restrict px = din + at;
                    const float *restrict ip = img + at;
                    for (int ch = 0; ch < nc; ch++) { /* hit: 1.0f or 0.0f */
                        float t = (float)(ip[ch] == o[ch]) * left[ch];
                        px[ch] += t;
                        left[ch] -= t;
                    }
                }
        }
    }
}

DP_ISA_FN(range_fn, max_backward_range, (const pool_job *j, size_t lo, size_t hi, int relu),
          (j, lo, hi, relu))

/* Outputs [lo, hi) of the max's backward when the windows tile the image
 * (stride = window, no padding, every pixel in one window: tiles()): each
 * output writes its window's pixels, all channels, with no zeroing pass
 * and no read of din.  The same bits as max_backward_range: a pixel gets
 * 0 + its share, as there (+0 where the share is -0). */
#define TILE_CBLOCK 64
DP_ISA_BODY void max_backward_tiles_body(const pool_job *j, size_t lo, size_t hi, int relu)
{
    const dp_window *g = j->g;
    const int c = g->c, w = g->w, k = g->kh, kw = g->kw;
    const size_t hw = (size_t)g->h * w, per_sample = (size_t)g->oh * g->ow;
    for (size_t pos = lo; pos < hi; pos++) {
        size_t r = pos / per_sample, q = pos % per_sample;
        size_t iy0 = q / (size_t)g->ow * (size_t)k, ix0 = q % (size_t)g->ow * (size_t)kw;
        float *din = j->out + r * hw * c;
        const float *img = j->in + r * hw * c;
        for (int c0 = 0; c0 < c; c0 += TILE_CBLOCK) {
            int nc = c - c0 < TILE_CBLOCK ? c - c0 : TILE_CBLOCK;
            const float *restrict o = j->fout + pos * c + c0;
            const float *restrict d = j->dout + pos * c + c0;
            float left[TILE_CBLOCK];
            for (int ch = 0; ch < nc; ch++)
                left[ch] = relu ? (float)(o[ch] > 0.0f) * d[ch] : d[ch];
            for (int ky = 0; ky < k; ky++)
                for (int kx = 0; kx < kw; kx++) {
                    size_t at = ((iy0 + (size_t)ky) * (size_t)w + ix0 + (size_t)kx) * c + c0;
                    float *restrict px = din + at;
                    const float *restrict ip = img + at;
                    for (int ch = 0; ch < nc; ch++) {
                        float t = (float)(ip[ch] == o[ch]) * left[ch];
                        px[ch] = 0.0f + t;
                        left[ch] -= t;
                    }
                }
        }
    }
}

DP_ISA_BODY void max_backward_tiles_task_body(void *ctx, int i, int n)
{
    const pool_job *j = ctx;
    size_t lo, hi;
    dp_pool_range(positions(j), 1, i, n, &lo, &hi);
    max_backward_tiles_body(j, lo, hi, 0);
}
DP_ISA_POOL_TASK(max_backward_tiles_task)

DP_ISA_BODY void max_relu_backward_tiles_task_body(void *ctx, int i, int n)
{
    const pool_job *j = ctx;
    size_t lo, hi;
    dp_pool_range(positions(j), 1, i, n, &lo, &hi);
    max_backward_tiles_body(j, lo, hi, 1);
}
DP_ISA_POOL_TASK(max_relu_backward_tiles_task)
DP_ISA_FN(range_fn, max_backward_tiles, (const pool_job *j, size_t lo, size_t hi, int relu),
          (j, lo, hi, relu))

/* The windows tile the image: each pixel in exactly one. */
static int tiles(const dp_window *g)
{
    return g->pad == 0 && g->stride == g->kh && g->stride == g->kw && g->oh * g->kh == g->h &&
           g->ow * g->kw == g->w;
}

DP_ISA_BODY void max_backward_task_body(void *ctx, int i, int n)
{
    const pool_job *j = ctx;
    size_t lo, hi, blocks = ((size_t)j->g->c + MAX_CBLOCK - 1) / MAX_CBLOCK;
    dp_pool_range((size_t)j->batch * blocks, 1, i, n, &lo, &hi);
    max_backward_range_body(j, lo, hi, 0);
}
DP_ISA_POOL_TASK(max_backward_task)

DP_ISA_BODY void max_relu_backward_task_body(void *ctx, int i, int n)
{
    const pool_job *j = ctx;
    size_t lo, hi, blocks = ((size_t)j->g->c + MAX_CBLOCK - 1) / MAX_CBLOCK;
    dp_pool_range((size_t)j->batch * blocks, 1, i, n, &lo, &hi);
    max_backward_range_body(j, lo, hi, 1);
}
DP_ISA_POOL_TASK(max_relu_backward_task)

static void max_backward(float *din, const float *dout, const float *in, const float *out,
                         const dp_window *g, int batch, int relu)
{
    pool_job j = {.out = din, .in = in, .dout = dout, .fout = out, .g = g, .batch = batch};
    size_t blocks = ((size_t)g->c + MAX_CBLOCK - 1) / MAX_CBLOCK;
    if (batch <= 0)
        return;
    int l = dp_isa_paths_level(), small = positions(&j) * g->kh * g->kw * g->c < POOL2D_MIN_SPLIT;
    if (tiles(g) && small)
        max_backward_tiles[l](&j, 0, positions(&j), relu);
    else if (tiles(g))
        dp_pool_run(relu ? max_relu_backward_tiles_task[l] : max_backward_tiles_task[l], &j);
    else if (small)
        max_backward_range[l](&j, 0, (size_t)batch * blocks, relu);
    else
        dp_pool_run(relu ? max_relu_backward_task[l] : max_backward_task[l], &j);
}

void dp_maxpool_backward(float *din, const float *dout, const float *in, const float *out,
                         const dp_window *g, int batch)
{
    max_backward(din, dout, in, out, g, batch, 0);
}

void dp_maxpool_relu_backward(float *din, const float *dout, const float *in, const float *out,
                              const dp_window *g, int batch)
{
    max_backward(din, dout, in, out, g, batch, 1);
}

/* Input rows [lo, hi) of din, each (r, iy): the sum of the gradients of every
 * window covering each pixel, windows in (ky, ox) order, then / (kh kw). */
DP_ISA_BODY void avg_backward_rows_body(const pool_job *j, size_t lo, size_t hi)
{
    const dp_window *g = j->g;
    const int c = g->c, h = g->h, w = g->w, s = g->stride;
    const size_t wc = (size_t)w * c;
    const float inv = 1.0f / (float)(g->kh * g->kw);
    for (size_t row = lo; row < hi; row++) {
        size_t r = row / (size_t)h;
        int iy = (int)(row % (size_t)h);
        float *restrict dst = j->out + row * wc;
        memset(dst, 0, wc * sizeof *dst);
        for (int ky = 0; ky < g->kh; ky++) {
            int t = iy + g->pad - ky; /* oy * stride */
            if (t < 0 || t % s || t / s >= g->oh)
                continue;
            const float *drow = j->dout + (r * g->oh + (size_t)(t / s)) * g->ow * c;
            for (int ox = 0; ox < g->ow; ox++) {
                int ix0 = ox * s - g->pad, kx_lo, kx_hi;
                valid_span(ix0, g->kw, w, &kx_lo, &kx_hi);
                const float *restrict d = drow + (size_t)ox * c;
                for (int kx = kx_lo; kx < kx_hi; kx++) {
                    float *restrict px = dst + (size_t)(ix0 + kx) * c;
                    for (int ch = 0; ch < c; ch++)
                        px[ch] += d[ch];
                }
            }
        }
        for (size_t e = 0; e < wc; e++)
            dst[e] *= inv;
    }
}

typedef void (*rows_fn)(const pool_job *j, size_t lo, size_t hi);
DP_ISA_FN(rows_fn, avg_backward_rows, (const pool_job *j, size_t lo, size_t hi), (j, lo, hi))

DP_ISA_BODY void avg_backward_task_body(void *ctx, int i, int n)
{
    const pool_job *j = ctx;
    size_t lo, hi;
    dp_pool_range((size_t)j->batch * j->g->h, 1, i, n, &lo, &hi);
    avg_backward_rows_body(j, lo, hi);
}
DP_ISA_POOL_TASK(avg_backward_task)

void dp_avgpool_backward(float *din, const float *dout, const dp_window *g, int batch)
{
    pool_job j = {.out = din, .dout = dout, .g = g, .batch = batch};
    if (batch <= 0)
        return;
    int l = dp_isa_paths_level();
    if (positions(&j) * g->kh * g->kw * g->c < POOL2D_MIN_SPLIT)
        avg_backward_rows[l](&j, 0, (size_t)batch * g->h);
    else
        dp_pool_run(avg_backward_task[l], &j);
}
