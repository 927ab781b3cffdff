/* Local contrast normalisation (Jarrett et al. 2009), forward and backward,
 * per sample over NHWC maps of n x n neighbourhoods (layers.h has the
 * formula).  The Gaussian kernel is separable, k(dy, dx) = u(dy) u(dx) / c
 * with u the normalised 1-D Gaussian, so each weighted window sum is a
 * horizontal then a vertical pass of n taps (zero padding: taps outside the
 * map are skipped), each pass a row-long axpy that gcc vectorises.
 *
 * Per pixel p of one sample (N pixels):
 *   xs(p) = sum_c x        m = blur(xs)       v = x - m
 *   Q(p) = sum_c v^2       S = blur(Q)        s = sqrt(S)
 *   M = mean(s)            d = max(M, s, eps) out = v / d
 * The backward runs the chain in reverse; both blurs are their own adjoints
 * (the kernel is symmetric).  Where M wins the max, the gradient reaches
 * every s through the mean, so it is summed over the map first (gM) and
 * spread back as gM / N.  keep, per sample: v, s, two maps of scratch, u and
 * M; the scratch is what lets the backward run without allocating.  Samples
 * are split over the pool. */
#include "downpour/layers.h"

#include <math.h>
#include <string.h>

#include "downpour/pool.h"

/* Work below this many floats stays on the calling thread. */
#define LCN_MIN_SPLIT 16384

/* Offsets into one sample's keep (N = h*w pixels). */
typedef struct keep_map {
    size_t v, s, a, b, u, mean, stride;
} keep_map;

static keep_map keep_layout(const dp_window *g)
{
    size_t n_pix = (size_t)g->h * g->w, vc = n_pix * g->c;
    keep_map k = {0, vc, vc + n_pix, vc + 2 * n_pix, vc + 3 * n_pix,
                  vc + 3 * n_pix + (size_t)g->kh, 0};
    /* each sample on its own 64-byte lines: no false sharing between threads */
    k.stride = (k.mean + 1 + 15) / 16 * 16;
    return k;
}

size_t dp_lcn_keep_floats(const dp_window *g) { return keep_layout(g).stride; }

void dp_lcn_taps(float *u, int n)
{
    double sigma = n / 4.0, r = (n - 1) / 2.0, sum = 0.0;
    for (int j = 0; j < n; j++)
        sum += exp(-((j - r) * (j - r)) / (2.0 * sigma * sigma));
    for (int j = 0; j < n; j++)
        u[j] = (float)(exp(-((j - r) * (j - r)) / (2.0 * sigma * sigma)) / sum);
}

/* a (h, w) = scale * (u x u) * a, zero padding; tmp (h, w) is scratch. */
static void blur(float *restrict a, float *restrict tmp, const float *restrict u, int n,
                 int h, int w, float scale)
{
    const int rad = n / 2;
    for (int y = 0; y < h; y++) {
        const float *restrict src = a + (size_t)y * w;
        float *restrict dst = tmp + (size_t)y * w;
        memset(dst, 0, (size_t)w * sizeof *dst);
        for (int j = 0; j < n; j++) {
            int off = j - rad;
            int lo = off < 0 ? -off : 0, hi = off > 0 ? w - off : w;
            float uj = u[j];
            for (int x = lo; x < hi; x++)
                dst[x] += uj * src[x + off];
        }
    }
    for (int y = 0; y < h; y++) {
        float *restrict dst = a + (size_t)y * w;
        memset(dst, 0, (size_t)w * sizeof *dst);
        for (int i = 0; i < n; i++) {
            int yy = y + i - rad;
            if (yy < 0 || yy >= h)
                continue;
            const float *restrict src = tmp + (size_t)yy * w;
            float ui = u[i] * scale;
            for (int x = 0; x < w; x++)
                dst[x] += ui * src[x];
        }
    }
}

enum { WIN_MEAN, WIN_S, WIN_EPS };

/* d = max(M, s, eps) and which of them it is: ties go to the mean, then to
 * s, as the backward must see the same winner as the forward. */
static float divisor(float mean, float s, int *who)
{
    float d = mean;
    *who = WIN_MEAN;
    if (s > d) {
        d = s;
        *who = WIN_S;
    }
    if (DP_LCN_EPS > d) {
        d = DP_LCN_EPS;
        *who = WIN_EPS;
    }
    return d;
}

typedef struct lcn_job {
    float *out;  /* forward: out;  backward: din */
    float *keep;
    const float *in; /* forward: in;  backward: dout */
    const dp_window *g;
    int batch;
} lcn_job;

static void forward_sample(float *restrict out, float *keep, const float *restrict x,
                           const dp_window *g, keep_map km)
{
    const int c = g->c, h = g->h, w = g->w, n = g->kh;
    const size_t np = (size_t)h * w;
    const float inv_c = 1.0f / (float)c;
    float *restrict v = keep + km.v, *restrict s = keep + km.s;
    float *restrict a = keep + km.a, *restrict b = keep + km.b, *restrict u = keep + km.u;
    dp_lcn_taps(u, n);
    for (size_t p = 0; p < np; p++) {
        float t = 0.0f;
        for (int ch = 0; ch < c; ch++)
            t += x[p * c + ch];
        a[p] = t;
    }
    blur(a, b, u, n, h, w, inv_c); /* a = m */
    for (size_t p = 0; p < np; p++) {
        float t = 0.0f;
        for (int ch = 0; ch < c; ch++) {
            float e = x[p * c + ch] - a[p];
            v[p * c + ch] = e;
            t += e * e;
        }
        a[p] = t;
    }
    blur(a, b, u, n, h, w, inv_c); /* a = S */
    double sum = 0.0;
    for (size_t p = 0; p < np; p++) {
        s[p] = sqrtf(a[p]);
        sum += s[p];
    }
    float mean = (float)(sum / (double)np);
    keep[km.mean] = mean;
    for (size_t p = 0; p < np; p++) {
        int who;
        float d = divisor(mean, s[p], &who);
        for (int ch = 0; ch < c; ch++)
            out[p * c + ch] = v[p * c + ch] / d;
    }
}

static void backward_sample(float *restrict din, float *keep, const float *restrict dout,
                            const dp_window *g, keep_map km)
{
    const int c = g->c, h = g->h, w = g->w, n = g->kh;
    const size_t np = (size_t)h * w;
    const float inv_c = 1.0f / (float)c;
    const float *restrict v = keep + km.v, *restrict s = keep + km.s, *u = keep + km.u;
    float *restrict a = keep + km.a, *restrict b = keep + km.b;
    const float mean = keep[km.mean];
    /* gd = dL/dd = -<dout, v> / d^2 per pixel; gM sums it where the mean won */
    double gm_sum = 0.0;
    for (size_t p = 0; p < np; p++) {
        int who;
        float d = divisor(mean, s[p], &who), e = 0.0f;
        for (int ch = 0; ch < c; ch++)
            e += dout[p * c + ch] * v[p * c + ch];
        a[p] = -e / (d * d);
        if (who == WIN_MEAN)
            gm_sum += a[p];
    }
    /* dL/dS = dL/ds / (2 s), dL/ds = gd where s won, plus gM / N everywhere.
     * Where s = 0 every v of its window is 0, so nothing flows through it. */
    const float gm_share = (float)(gm_sum / (double)np);
    for (size_t p = 0; p < np; p++) {
        int who;
        divisor(mean, s[p], &who);
        float gs = (who == WIN_S ? a[p] : 0.0f) + gm_share;
        a[p] = s[p] > 0.0f ? gs / (2.0f * s[p]) : 0.0f;
    }
    blur(a, b, u, n, h, w, inv_c); /* a = dL/dQ */
    /* dL/dv = dout / d + 2 v dL/dQ (into din); a = dL/dm = -sum_c dL/dv */
    for (size_t p = 0; p < np; p++) {
        int who;
        float d = divisor(mean, s[p], &who), gq2 = 2.0f * a[p], t = 0.0f;
        for (int ch = 0; ch < c; ch++) {
            float gv = dout[p * c + ch] / d + gq2 * v[p * c + ch];
            din[p * c + ch] = gv;
            t += gv;
        }
        a[p] = -t;
    }
    blur(a, b, u, n, h, w, inv_c); /* a = dL/dxs */
    for (size_t p = 0; p < np; p++)
        for (int ch = 0; ch < c; ch++)
            din[p * c + ch] += a[p];
}

static void forward_range(const lcn_job *j, size_t lo, size_t hi)
{
    keep_map km = keep_layout(j->g);
    size_t per = (size_t)j->g->h * j->g->w * j->g->c;
    for (size_t r = lo; r < hi; r++)
        forward_sample(j->out + r * per, j->keep + r * km.stride, j->in + r * per, j->g, km);
}

static void backward_range(const lcn_job *j, size_t lo, size_t hi)
{
    keep_map km = keep_layout(j->g);
    size_t per = (size_t)j->g->h * j->g->w * j->g->c;
    for (size_t r = lo; r < hi; r++)
        backward_sample(j->out + r * per, j->keep + r * km.stride, j->in + r * per, j->g, km);
}

static void forward_task(void *ctx, int i, int n)
{
    const lcn_job *j = ctx;
    size_t lo, hi;
    dp_pool_range((size_t)j->batch, 1, i, n, &lo, &hi);
    forward_range(j, lo, hi);
}

static void backward_task(void *ctx, int i, int n)
{
    const lcn_job *j = ctx;
    size_t lo, hi;
    dp_pool_range((size_t)j->batch, 1, i, n, &lo, &hi);
    backward_range(j, lo, hi);
}

static size_t work(const dp_window *g, int batch)
{
    return (size_t)batch * g->h * g->w * ((size_t)g->c + 2u * g->kh);
}

void dp_lcn_forward(float *out, float *keep, const float *in, const dp_window *g, int batch)
{
    lcn_job j = {out, keep, in, g, batch};
    if (batch <= 0)
        return;
    if (batch == 1 || work(g, batch) < LCN_MIN_SPLIT)
        forward_range(&j, 0, (size_t)batch);
    else
        dp_pool_run(forward_task, &j);
}

void dp_lcn_backward(float *din, const float *dout, float *keep, const dp_window *g, int batch)
{
    lcn_job j = {din, keep, dout, g, batch};
    if (batch <= 0)
        return;
    if (batch == 1 || work(g, batch) < LCN_MIN_SPLIT)
        backward_range(&j, 0, (size_t)batch);
    else
        dp_pool_run(backward_task, &j);
}
