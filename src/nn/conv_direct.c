/* Direct NHWC convolution on the CPU (docs/architecture.md, "Image layers",
 * "Direct convolutions"): no lowering, no packing.  Three products, each
 * with register-blocked AVX-512 and AVX2 microkernels that do the same
 * multiply-adds in the same order per output, so both give the same bits:
 *
 *  forward   out[n,oy,ox,oc] = b[oc] + sum over (ky, kx, ic) of
 *            in[n, oy*s-p+ky, ox*s-p+kx, ic] * w[oc,ky,kx,ic]
 *            a tile of px output pixels (of one row, or across rows on
 *            a small image) by 16*nv output channels, the input broadcast, the filters repacked to
 *            (ky, kx, ic, oc) so a channel vector is one load;
 *  data      din[n,y,x,ic] = sum over (ky, kx, oc) with oy = (y+p-ky)/s
 *            and ox = (x+p-kx)/s whole of dout[n,oy,ox,oc] * w[oc,ky,kx,ic]:
 *            the same microkernel, the filters repacked to (ky, kx, oc,
 *            ic), the pixels of a row in s classes by x mod s;
 *  weights   gw[oc,ky,kx,ic] = sum over (n, oy, ox) of dout[n,oy,ox,oc] *
 *            in[n, oy*s-p+ky, ox*s-p+kx, ic]: a tile of ob output channels
 *            (broadcast) by vectors of a window row's (kx, ic) run, summed
 *            over the positions in order; gb the column sums of dout.
 *
 * A tap outside the image reads zeros (the lowering's padding), so every
 * output sums the same terms in the same order whatever the blocking.  The
 * forward and the data product split over the pool by output rows (or
 * tiles), the
 * weights by tiles of gw (each summed over the whole batch, a chunk of
 * records at a time so the operands stay in cache): no result depends on
 * the thread count. */
#include "nn/conv_direct.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "downpour/blas.h"
#include "downpour/isa.h"
#include "downpour/pool.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define DIRECT_X86 1
#endif

#define MAX_CH 1024   /* input or output channels the microkernels read */
#define MAX_K 8       /* kh, kw */
#define MAX_TAPS (MAX_K * MAX_K)
#define MAX_WIDTH 256  /* input and output columns */
#define MAX_TILES (MAX_WIDTH / 6 + MAX_K + 1) /* tiles of a row: 6 pixels or more, s classes */
#define MAX_RUN_V 32  /* 16-float vectors in one window row (kw * c / 16) */
#define GMAXPX 12     /* pixels of a forward / data tile */
#define GMAXNV 4      /* 16-channel vectors of one */
#define WG_RV 3       /* run vectors of a weight tile (AVX-512) */
#define WG_OB 8       /* output channels of one (AVX-512) */
#define WG_OB2 4      /* (AVX2) */
/* Records of a weight-gradient pass: about this many floats of dout and input. */
#define WG_CHUNK_FLOATS (1u << 16)
/* Work below this many multiply-adds stays on the calling thread. */
#define MIN_SPLIT 65536.0

static const float zeros[MAX_CH] __attribute__((aligned(64)));

/* ---- eligibility ---- */

static _Atomic bool enabled = true;

void dp_conv_direct_enable(bool on) { atomic_store(&enabled, on); }

static bool direct_isa(void)
{
#ifdef DIRECT_X86
    return atomic_load_explicit(&enabled, memory_order_relaxed) && dp_isa_max() >= DP_ISA_AVX2;
#else
    return false;
#endif
}

static bool common_ok(const dp_layer *d)
{
    const dp_window *g = &d->win;
    if (g->kh > MAX_K || g->kw > MAX_K || g->stride > MAX_K || d->c > MAX_CH ||
        d->oc > MAX_CH || g->w > MAX_WIDTH || g->ow > MAX_WIDTH)
        return false;
    /* a 1x1 stride-1 window lowers to the input itself: a product already */
    if (g->kh == 1 && g->kw == 1 && g->stride == 1 && g->pad == 0)
        return false;
    return direct_isa();
}

bool dp_conv_direct_forward_ok(const dp_layer *d) { return common_ok(d) && d->oc % 16 == 0; }

bool dp_conv_direct_data_ok(const dp_layer *d) { return common_ok(d) && d->c % 16 == 0; }

bool dp_conv_direct_weights_ok(const dp_layer *d)
{
    return common_ok(d) && d->c % 16 == 0 && d->oc % WG_OB == 0 &&
           d->win.kw * d->c / 16 <= MAX_RUN_V;
}

/* ---- the gather product (forward and data) ----
 * out pixel j, channel vector v = sum over the listed taps t, input
 * channels q of src[t][j][q] * w[tap[t]*wtap + q*wq + 16 v]. */
typedef struct gather_arg {
    const float *w;
    size_t wtap, wq;
    const int *tap; /* the taps summed, in order: tap t reads w + tap[t] * wtap */
    int taps, q;
    const float *bias; /* NULL: none */
    int relu;
} gather_arg;

typedef void (*gather_fn)(const gather_arg *a, const float *const *src, float *out,
                          size_t ostride);

#ifdef DIRECT_X86
static inline __attribute__((always_inline, target("avx512f"))) void
gather512(const gather_arg *a, const float *const *src, float *out, size_t ostride, const int px,
          const int nv)
{
    __m512 acc[GMAXPX][GMAXNV];
    for (int j = 0; j < px; j++)
        for (int v = 0; v < nv; v++)
            acc[j][v] = _mm512_setzero_ps();
    for (int t = 0; t < a->taps; t++) {
        const float *p[GMAXPX];
        for (int j = 0; j < px; j++)
            p[j] = src[(size_t)t * px + j];
        const float *w = a->w + (size_t)a->tap[t] * a->wtap;
        for (int q = 0; q < a->q; q++, w += a->wq) {
            __m512 wv[GMAXNV];
            for (int v = 0; v < nv; v++)
                wv[v] = _mm512_loadu_ps(w + 16 * v);
            for (int j = 0; j < px; j++) {
                __m512 b = _mm512_set1_ps(p[j][q]);
                for (int v = 0; v < nv; v++)
                    acc[j][v] = _mm512_fmadd_ps(b, wv[v], acc[j][v]);
            }
        }
    }
    const __m512 zero = _mm512_setzero_ps();
    for (int j = 0; j < px; j++)
        for (int v = 0; v < nv; v++) {
            __m512 r = acc[j][v];
            if (a->bias)
                r = _mm512_add_ps(r, _mm512_loadu_ps(a->bias + 16 * v));
            if (a->relu)
                r = _mm512_max_ps(r, zero);
            _mm512_storeu_ps(out + (size_t)j * ostride + 16 * v, r);
        }
}

/* AVX2: one 16-channel vector as two halves, the same operations per lane. */
static inline __attribute__((always_inline, target("avx2,fma"))) void
gather256(const gather_arg *a, const float *const *src, float *out, size_t ostride, const int px)
{
    __m256 lo[GMAXPX], hi[GMAXPX];
    for (int j = 0; j < px; j++)
        lo[j] = hi[j] = _mm256_setzero_ps();
    for (int t = 0; t < a->taps; t++) {
        const float *p[GMAXPX];
        for (int j = 0; j < px; j++)
            p[j] = src[(size_t)t * px + j];
        const float *w = a->w + (size_t)a->tap[t] * a->wtap;
        for (int q = 0; q < a->q; q++, w += a->wq) {
            __m256 w0 = _mm256_loadu_ps(w), w1 = _mm256_loadu_ps(w + 8);
            for (int j = 0; j < px; j++) {
                __m256 b = _mm256_set1_ps(p[j][q]);
                lo[j] = _mm256_fmadd_ps(b, w0, lo[j]);
                hi[j] = _mm256_fmadd_ps(b, w1, hi[j]);
            }
        }
    }
    const __m256 zero = _mm256_setzero_ps();
    for (int j = 0; j < px; j++) {
        __m256 r0 = lo[j], r1 = hi[j];
        if (a->bias) {
            r0 = _mm256_add_ps(r0, _mm256_loadu_ps(a->bias));
            r1 = _mm256_add_ps(r1, _mm256_loadu_ps(a->bias + 8));
        }
        if (a->relu) {
            r0 = _mm256_max_ps(r0, zero);
            r1 = _mm256_max_ps(r1, zero);
        }
        _mm256_storeu_ps(out + (size_t)j * ostride, r0);
        _mm256_storeu_ps(out + (size_t)j * ostride + 8, r1);
    }
}

#define G512(PX, NV)                                                                           \
    __attribute__((target("avx512f"))) static void g512_##PX##_##NV(                          \
        const gather_arg *a, const float *const *src, float *out, size_t ostride)              \
    {                                                                                          \
        gather512(a, src, out, ostride, PX, NV);                                               \
    }
#define G512_NV(NV)                                                                            \
    G512(1, NV) G512(2, NV) G512(3, NV) G512(4, NV) G512(5, NV) G512(6, NV)
G512_NV(1) G512_NV(2) G512_NV(3) G512_NV(4)
G512(7, 1) G512(8, 1) G512(9, 1) G512(10, 1) G512(11, 1) G512(12, 1)
G512(7, 2) G512(8, 2) G512(9, 2) G512(10, 2) G512(11, 2) G512(12, 2)
G512(7, 3) G512(8, 3)

#define G256(PX)                                                                               \
    __attribute__((target("avx2,fma"))) static void g256_##PX(                                 \
        const gather_arg *a, const float *const *src, float *out, size_t ostride)              \
    {                                                                                          \
        gather256(a, src, out, ostride, PX);                                                   \
    }
G256(1) G256(2) G256(3) G256(4) G256(5) G256(6)

/* [nv - 1][px - 1]; px up to gmax_px[nv - 1] */
static const gather_fn g512[GMAXNV][GMAXPX] = {
    {g512_1_1, g512_2_1, g512_3_1, g512_4_1, g512_5_1, g512_6_1, g512_7_1, g512_8_1, g512_9_1,
     g512_10_1, g512_11_1, g512_12_1},
    {g512_1_2, g512_2_2, g512_3_2, g512_4_2, g512_5_2, g512_6_2, g512_7_2, g512_8_2, g512_9_2,
     g512_10_2, g512_11_2, g512_12_2},
    {g512_1_3, g512_2_3, g512_3_3, g512_4_3, g512_5_3, g512_6_3, g512_7_3, g512_8_3},
    {g512_1_4, g512_2_4, g512_3_4, g512_4_4, g512_5_4, g512_6_4},
};
static const int g512_max_px[GMAXNV] = {12, 12, 8, 6};
static const gather_fn g256[6] = {g256_1, g256_2, g256_3, g256_4, g256_5, g256_6};
#endif

/* An output pixel's taps read a (sh, sw, sc) source image.  Forward: pixel
 * (y, x), tap (ky, kx) reads source pixel (y*s - pad + ky, x*s - pad + kx).
 * Data: din pixel (y, x) sums the dout pixels (oy, ox) with oy*s - pad + ky
 * = y, ox*s - pad + kx = x: a tap counts only where y + pad - ky (and x +
 * pad - kx) divides by s, so the pixels of a row go in s classes by x mod s,
 * each with its own kx.  Taps whose row lies outside the source are left
 * out (per row), a column outside reads zeros: every pixel sums the same
 * terms in the same order however the tiles fall. */
typedef struct gather_job {
    const float *src;
    int sh, sw, sc;
    int s, pad, kh, kw;
    bool data;
    float *out;
    int oh, ow, oc; /* the output image's rows, columns, channels */
    const float *w;
    size_t wtap, wq;
    const float *bias;
    int relu;
    int batch;
    bool avx512;
    const int *off; /* small images: gather_tiles' offsets (NULL: by rows) */
    int tiles;      /* its tiles per sample */
} gather_job;


/* One tile of a row: px pixels from column x0, every step-th; its kx and
 * their columns' offsets in the source row (-1: outside, zeros). */
typedef struct gtile {
    int x0, px, step, nkx;
    int kx[MAX_K];
    int col[MAX_K * GMAXPX];
} gtile;

/* The tiles of a row (the same for every row): *n of them. */
static int plan_tiles(const gather_job *j, int maxpx, gtile *t)
{
    int n = 0, classes = j->data ? j->s : 1;
    for (int r = 0; r < classes && r < j->ow; r++) {
        int npx = (j->ow - r + classes - 1) / classes;
        int tiles = (npx + maxpx - 1) / maxpx;
        for (int tl = 0; tl < tiles; tl++, n++) {
            gtile *g = &t[n];
            int q0 = (int)((long)npx * tl / tiles), q1 = (int)((long)npx * (tl + 1) / tiles);
            g->x0 = r + q0 * classes, g->px = q1 - q0, g->step = classes, g->nkx = 0;
            for (int kx = 0; kx < j->kw; kx++) {
                int tx = r + j->pad - kx; /* data: x + pad - kx, mod s as r's */
                if (j->data && ((tx % j->s) + j->s) % j->s)
                    continue;
                int k = g->nkx++;
                g->kx[k] = kx;
                for (int q = 0; q < g->px; q++) {
                    int x = g->x0 + q * classes;
                    int sx = j->data ? (x + j->pad - kx) / j->s : x * j->s - j->pad + kx;
                    /* data: x + pad - kx may be negative: then outside */
                    bool in = j->data ? x + j->pad - kx >= 0 && sx < j->sw : sx >= 0 && sx < j->sw;
                    g->col[k * GMAXPX + q] = in ? sx * j->sc : -1;
                }
            }
        }
    }
    return n;
}

/* The most pixels of a tile: what the widest microkernel the output
 * channels use holds. */
static int tile_px(const gather_job *j)
{
#ifdef DIRECT_X86
    int groups = j->oc / 16, nv = groups < GMAXNV ? groups : GMAXNV;
    return j->avx512 ? g512_max_px[nv - 1] : 6;
#else
    (void)j;
    return 1;
#endif
}

#ifdef DIRECT_X86
/* A tile of px pixels, every output channel: the microkernels over the
 * channel vectors, as many at a time as the AVX-512 ones hold. */
static void gather_groups(const gather_job *j, const float *const *src, const int *tap, int taps,
                          int px, float *out, size_t ostride)
{
    const int groups = j->oc / 16;
    gather_arg a = {NULL, j->wtap, j->wq, tap, taps, j->sc, NULL, j->relu};
    for (int g0 = 0; g0 < groups;) {
        int nv = j->avx512 ? (groups - g0 < GMAXNV ? groups - g0 : GMAXNV) : 1;
        a.w = j->w + (size_t)g0 * 16;
        a.bias = j->bias ? j->bias + (size_t)g0 * 16 : NULL;
        if (j->avx512)
            g512[nv - 1][px - 1](&a, src, out + (size_t)g0 * 16, ostride);
        else
            g256[px - 1](&a, src, out + (size_t)g0 * 16, ostride);
        g0 += nv;
    }
}
#endif

static void gather_rows(const gather_job *j, size_t lo, size_t hi)
{
#ifdef DIRECT_X86
    const float *src[MAX_TAPS * GMAXPX];
    int tap[MAX_TAPS];
    gtile tiles[MAX_TILES];
    /* the row in equal tiles of at most tile_px */
    int n_tiles = plan_tiles(j, tile_px(j), tiles);
    for (size_t row = lo; row < hi; row++) {
        int n = (int)(row / (size_t)j->oh), y = (int)(row % (size_t)j->oh);
        const float *img = j->src + (size_t)n * j->sh * j->sw * j->sc;
        float *orow = j->out + ((size_t)n * j->oh + y) * j->ow * j->oc;
        /* the rows this row's taps read */
        int kys[MAX_K], sys[MAX_K], nky = 0;
        for (int ky = 0; ky < j->kh; ky++) {
            int ty = j->data ? y + j->pad - ky : y * j->s - j->pad + ky;
            if (j->data && (ty < 0 || ty % j->s))
                continue;
            int sy = j->data ? ty / j->s : ty;
            if (sy < 0 || sy >= j->sh)
                continue;
            kys[nky] = ky, sys[nky++] = sy;
        }
        for (int tl = 0; tl < n_tiles; tl++) {
            const gtile *g = &tiles[tl];
            int px = g->px, nt = 0;
            for (int a = 0; a < nky; a++) {
                const float *base = img + (size_t)sys[a] * j->sw * j->sc;
                for (int k = 0; k < g->nkx; k++, nt++) {
                    tap[nt] = kys[a] * j->kw + g->kx[k];
                    const float **p = src + (size_t)nt * px;
                    const int *col = g->col + k * GMAXPX;
                    for (int q = 0; q < px; q++)
                        p[q] = col[q] >= 0 ? base + col[q] : zeros;
                }
            }
            gather_groups(j, src, tap, nt, px, orow + (size_t)g->x0 * j->oc,
                          (size_t)g->step * j->oc);
        }
    }
#else
    (void)j, (void)lo, (void)hi;
#endif
}

/* Small images (the forward, and the data product of a stride-1 conv that
 * keeps the image's size): tiles of
 * maxpx pixels over a sample's positions, across rows, so a tile reuses
 * each filter vector it loads as often as on a wide image.  Every tap is
 * summed, a source pixel outside the image reading zeros, whichever tile a
 * pixel falls in.  j->off: each position's taps' offsets in the source
 * image (-1: outside). */
static void gather_tiles(const gather_job *j, size_t lo, size_t hi)
{
#ifdef DIRECT_X86
    const int taps = j->kh * j->kw, P = j->oh * j->ow;
    const float *src[MAX_TAPS * GMAXPX];
    int tap[MAX_TAPS];
    for (int t = 0; t < taps; t++)
        tap[t] = t;
    for (size_t u = lo; u < hi; u++) {
        int n = (int)(u / (size_t)j->tiles), tl = (int)(u % (size_t)j->tiles);
        int p0 = (int)((long)P * tl / j->tiles), p1 = (int)((long)P * (tl + 1) / j->tiles);
        int px = p1 - p0;
        const float *img = j->src + (size_t)n * j->sh * j->sw * j->sc;
        const int *off = j->off + (size_t)p0 * taps; /* the tile's, in src's order */
        for (int i = 0; i < taps * px; i++)
            src[i] = off[i] >= 0 ? img + off[i] : zeros;
        gather_groups(j, src, tap, taps, px, j->out + ((size_t)n * P + p0) * j->oc,
                      (size_t)j->oc);
    }
#else
    (void)j, (void)lo, (void)hi;
#endif
}

static void gather_task(void *ctx, int i, int n)
{
    const gather_job *j = ctx;
    size_t lo, hi;
    if (j->off) {
        dp_pool_range((size_t)j->batch * j->tiles, 1, i, n, &lo, &hi);
        gather_tiles(j, lo, hi);
    } else {
        dp_pool_range((size_t)j->batch * j->oh, 1, i, n, &lo, &hi);
        gather_rows(j, lo, hi);
    }
}

/* The offsets table of gather_tiles, one per calling thread (layers run one
 * at a time on it). */
#define MAX_OFFSETS 16384
static _Thread_local int offsets[MAX_OFFSETS];

static void run_gather(gather_job *j)
{
    j->avx512 = dp_isa_max() >= DP_ISA_AVX512;
    const int taps = j->kh * j->kw, P = j->oh * j->ow;
    j->off = NULL;
    /* the data product's taps mostly miss the image unless it is padded
     * to keep its size: the rows then skip theirs */
    bool same = j->s == 1 && 2 * j->pad == j->kh - 1 && 2 * j->pad == j->kw - 1;
    if ((!j->data || same) && (size_t)P * taps <= MAX_OFFSETS) {
        int maxpx = tile_px(j);
        j->tiles = (P + maxpx - 1) / maxpx;
        /* tile by tile, tap by tap, pixel by pixel: gather_tiles' order */
        for (int tl = 0; tl < j->tiles; tl++) {
            int p0 = (int)((long)P * tl / j->tiles), p1 = (int)((long)P * (tl + 1) / j->tiles);
            for (int t = 0; t < taps; t++)
                for (int p = p0; p < p1; p++) {
                    int ky = t / j->kw, kx = t % j->kw, y = p / j->ow, x = p % j->ow, sy, sx;
                    if (j->data)
                        sy = y + j->pad - ky, sx = x + j->pad - kx;
                    else
                        sy = y * j->s - j->pad + ky, sx = x * j->s - j->pad + kx;
                    bool in = sy >= 0 && sy < j->sh && sx >= 0 && sx < j->sw;
                    offsets[(size_t)p0 * taps + (size_t)t * (p1 - p0) + (p - p0)] =
                        in ? (sy * j->sw + sx) * j->sc : -1;
                }
        }
        j->off = offsets;
    }
    double work = (double)j->batch * P * j->oc * taps * j->sc;
    if (work < MIN_SPLIT)
        gather_task(j, 0, 1);
    else
        dp_pool_run(gather_task, j);
}

/* The lowered form's products, logged for the benchmarks' GEMM bound
 * (bench/bench_cnn.c): what dp_lk_lowered_forward and _backward would run. */
static void note_lowered(const dp_layer_call *c, int which)
{
    const dp_layer *d = c->d;
    int P = d->oh * d->ow, K = d->win.kh * d->win.kw * d->c, oc = d->oc;
    for (int r0 = 0; r0 < c->batch; r0 += c->chunk) {
        int cb = c->batch - r0 < c->chunk ? c->batch - r0 : c->chunk, M = cb * P;
        if (which == 0)
            dp_blas_note(false, true, M, oc, K, K, K, oc, 0.0f);
        else if (which == 1)
            dp_blas_note(true, false, oc, K, M, oc, K, K, r0 > 0 ? 1.0f : 0.0f);
        else
            dp_blas_note(false, false, M, K, oc, oc, K, K, 0.0f);
    }
}

void dp_conv_direct_forward(const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    const int T = d->win.kh * d->win.kw, C = d->c, OC = d->oc;
    note_lowered(c, 0);
    /* filters (oc, t, ic) -> (t, ic, oc) */
    float *wr = c->rows;
    for (int o = 0; o < OC; o++)
        for (int t = 0; t < T; t++)
            for (int i = 0; i < C; i++)
                wr[((size_t)t * C + i) * OC + o] = c->w[((size_t)o * T + t) * C + i];
    gather_job j = {c->in, d->win.h, d->win.w, C, d->win.stride, d->win.pad, d->win.kh,
                    d->win.kw, false, c->out, d->oh, d->ow, OC, wr, (size_t)C * OC, (size_t)OC,
                    c->b, c->relu, c->batch, false, NULL, 0};
    run_gather(&j);
}

void dp_conv_direct_data(const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    const int T = d->win.kh * d->win.kw, C = d->c, OC = d->oc;
    note_lowered(c, 2);
    /* din (h, w, c) from dout (oh, ow, oc): filters (oc, t, ic) -> (t, oc,
     * ic), so a tap's filters are one run */
    float *wd = c->drows;
    for (int o = 0; o < OC; o++)
        for (int t = 0; t < T; t++)
            memcpy(wd + ((size_t)t * OC + o) * C, c->w + ((size_t)o * T + t) * C,
                   (size_t)C * sizeof(float));
    gather_job j = {c->dout, d->oh, d->ow, OC, d->win.stride, d->win.pad, d->win.kh,
                    d->win.kw, true, c->din, d->win.h, d->win.w, C, wd, (size_t)OC * C,
                    (size_t)C, NULL, 0, c->batch, false, NULL, 0};
    run_gather(&j);
}

/* ---- the weight gradient ---- */

typedef struct wgrad_job {
    const float *dout, *in;
    float *gw, *gb;
    const dp_layer *d;
    int batch;
    int ob, rvb;     /* tile: output channels, run vectors */
    int n_rv, tiles; /* run vectors of a window row; tiles of gw */
    int chunk;       /* records a pass */
    uint32_t vmask[MAX_WIDTH]; /* per output column: the run vectors inside the image */
    bool avx512;
} wgrad_job;

typedef struct wgrad_arg {
    const wgrad_job *j;
    int n0, n1, ky, o0, v0, first;
} wgrad_arg;

#ifdef DIRECT_X86
static inline __attribute__((always_inline, target("avx512f"))) void
wgrad512(const wgrad_arg *a, const int rv)
{
    const wgrad_job *j = a->j;
    const dp_layer *d = j->d;
    const int C = d->c, OC = d->oc, H = d->win.h, W = d->win.w, s = d->win.stride,
              pad = d->win.pad, kw = d->win.kw, oh = d->oh, ow = d->ow;
    const size_t K = (size_t)d->win.kh * kw * C;
    float *g = j->gw + (size_t)a->o0 * K + (size_t)a->ky * kw * C + 16 * (size_t)a->v0;
    __m512 acc[WG_OB][WG_RV];
    for (int o = 0; o < WG_OB; o++)
        for (int v = 0; v < rv; v++)
            acc[o][v] = a->first ? _mm512_setzero_ps() : _mm512_loadu_ps(g + o * K + 16 * v);
    for (int n = a->n0; n < a->n1; n++)
        for (int oy = 0; oy < oh; oy++) {
            int iy = oy * s - pad + a->ky;
            if (iy < 0 || iy >= H)
                continue;
            const float *dr = j->dout + ((size_t)n * oh + oy) * ow * OC + a->o0;
            const float *ir = j->in + ((size_t)n * H + iy) * W * C + 16 * (size_t)a->v0;
            for (int ox = 0; ox < ow; ox++, dr += OC) {
                uint32_t m = j->vmask[ox] >> a->v0;
                long off = (long)(ox * s - pad) * C;
                __m512 x[WG_RV];
                for (int v = 0; v < rv; v++) /* a select, not a branch */
                    x[v] = _mm512_loadu_ps(m >> v & 1 ? ir + off + 16 * v : zeros);
                for (int o = 0; o < WG_OB; o++) {
                    __m512 b = _mm512_set1_ps(dr[o]);
                    for (int v = 0; v < rv; v++)
                        acc[o][v] = _mm512_fmadd_ps(b, x[v], acc[o][v]);
                }
            }
        }
    for (int o = 0; o < WG_OB; o++)
        for (int v = 0; v < rv; v++)
            _mm512_storeu_ps(g + o * K + 16 * v, acc[o][v]);
}

__attribute__((target("avx512f"))) static void wg512_1(const wgrad_arg *a) { wgrad512(a, 1); }
__attribute__((target("avx512f"))) static void wg512_2(const wgrad_arg *a) { wgrad512(a, 2); }
__attribute__((target("avx512f"))) static void wg512_3(const wgrad_arg *a) { wgrad512(a, 3); }

/* AVX2: WG_OB2 output channels by one run vector in two halves. */
__attribute__((target("avx2,fma"))) static void wg256(const wgrad_arg *a)
{
    const wgrad_job *j = a->j;
    const dp_layer *d = j->d;
    const int C = d->c, OC = d->oc, H = d->win.h, W = d->win.w, s = d->win.stride,
              pad = d->win.pad, kw = d->win.kw, oh = d->oh, ow = d->ow;
    const size_t K = (size_t)d->win.kh * kw * C;
    float *g = j->gw + (size_t)a->o0 * K + (size_t)a->ky * kw * C + 16 * (size_t)a->v0;
    __m256 lo[WG_OB2], hi[WG_OB2];
    for (int o = 0; o < WG_OB2; o++) {
        lo[o] = a->first ? _mm256_setzero_ps() : _mm256_loadu_ps(g + o * K);
        hi[o] = a->first ? _mm256_setzero_ps() : _mm256_loadu_ps(g + o * K + 8);
    }
    for (int n = a->n0; n < a->n1; n++)
        for (int oy = 0; oy < oh; oy++) {
            int iy = oy * s - pad + a->ky;
            if (iy < 0 || iy >= H)
                continue;
            const float *dr = j->dout + ((size_t)n * oh + oy) * ow * OC + a->o0;
            const float *ir = j->in + ((size_t)n * H + iy) * W * C + 16 * (size_t)a->v0;
            for (int ox = 0; ox < ow; ox++, dr += OC) {
                long off = (long)(ox * s - pad) * C;
                const float *p = j->vmask[ox] >> a->v0 & 1 ? ir + off : zeros;
                __m256 x0 = _mm256_loadu_ps(p), x1 = _mm256_loadu_ps(p + 8);
                for (int o = 0; o < WG_OB2; o++) {
                    __m256 b = _mm256_set1_ps(dr[o]);
                    lo[o] = _mm256_fmadd_ps(b, x0, lo[o]);
                    hi[o] = _mm256_fmadd_ps(b, x1, hi[o]);
                }
            }
        }
    for (int o = 0; o < WG_OB2; o++) {
        _mm256_storeu_ps(g + o * K, lo[o]);
        _mm256_storeu_ps(g + o * K + 8, hi[o]);
    }
}
#endif

/* Tile t of gw: (ky, output-channel block, run-vector block). */
static void wgrad_tile(const wgrad_job *j, int t, int n0, int n1)
{
#ifdef DIRECT_X86
    int n_ob = j->d->oc / j->ob, n_vb = (j->n_rv + j->rvb - 1) / j->rvb;
    int vb = t % n_vb, ob = t / n_vb % n_ob, ky = t / n_vb / n_ob;
    wgrad_arg a = {j, n0, n1, ky, ob * j->ob, vb * j->rvb, n0 == 0};
    if (!j->avx512) {
        wg256(&a);
        return;
    }
    int rv = j->n_rv - a.v0 < j->rvb ? j->n_rv - a.v0 : j->rvb;
    if (rv == 3)
        wg512_3(&a);
    else if (rv == 2)
        wg512_2(&a);
    else
        wg512_1(&a);
#else
    (void)j, (void)t, (void)n0, (void)n1;
#endif
}

static void wgrad_task(void *ctx, int i, int n)
{
    const wgrad_job *j = ctx;
    size_t lo, hi;
    dp_pool_range((size_t)j->tiles, 1, i, n, &lo, &hi);
    for (int n0 = 0; n0 < j->batch; n0 += j->chunk) {
        int n1 = j->batch - n0 < j->chunk ? j->batch : n0 + j->chunk;
        for (size_t t = lo; t < hi; t++)
            wgrad_tile(j, (int)t, n0, n1);
    }
    /* the bias gradient: column sums of dout, this thread's channels */
    const int OC = j->d->oc;
    size_t c0, c1, P = (size_t)j->batch * j->d->oh * j->d->ow;
    dp_pool_range((size_t)OC, 16, i, n, &c0, &c1);
    float *restrict gb = j->gb;
    for (size_t o = c0; o < c1; o++)
        gb[o] = 0.0f;
    for (size_t p = 0; p < P; p++) {
        const float *restrict r = j->dout + p * OC;
        for (size_t o = c0; o < c1; o++)
            gb[o] += r[o];
    }
}

/* One job per layer call on the caller's stack would be 4 KiB of masks;
 * a call never nests (layers run one at a time), so one static job per
 * thread that calls suffices. */
static _Thread_local wgrad_job wjob;

void dp_conv_direct_weights(const dp_layer_call *c)
{
    const dp_layer *d = c->d;
    const int C = d->c, kw = d->win.kw, s = d->win.stride, pad = d->win.pad, W = d->win.w;
    note_lowered(c, 1);
    wgrad_job *j = &wjob;
    j->dout = c->dout, j->in = c->in, j->gw = c->gw, j->gb = c->gb, j->d = d;
    j->batch = c->batch;
    j->avx512 = dp_isa_max() >= DP_ISA_AVX512;
    j->ob = j->avx512 ? WG_OB : WG_OB2;
    j->rvb = j->avx512 ? WG_RV : 1;
    j->n_rv = kw * C / 16;
    j->tiles = d->win.kh * (d->oc / j->ob) * ((j->n_rv + j->rvb - 1) / j->rvb);
    size_t per = (size_t)d->oh * d->ow * d->oc + (size_t)d->win.h * W * C;
    j->chunk = (int)(WG_CHUNK_FLOATS / per);
    if (j->chunk < 1)
        j->chunk = 1;
    for (int ox = 0; ox < d->ow; ox++) {
        uint32_t m = 0;
        for (int v = 0; v < j->n_rv; v++) {
            int ix = ox * s - pad + v * 16 / C;
            if (ix >= 0 && ix < W)
                m |= 1u << v;
        }
        j->vmask[ox] = m;
    }
    double work = (double)c->batch * d->oh * d->ow * d->w_len;
    if (work < MIN_SPLIT)
        wgrad_task(j, 0, 1);
    else
        dp_pool_run(wgrad_task, j);
}
