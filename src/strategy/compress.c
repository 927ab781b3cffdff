/* Gradient compression codecs: see include/downpour/compress.h. */
#include "downpour/compress.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/wire.h"

static const char *const kind_names[DP_COMPRESS_KIND_COUNT] = {"none", "bf16", "fp16", "topk",
                                                               "auto", "powersgd"};

const char *dp_compress_kind_name(dp_compress_kind k)
{
    return (unsigned)k < DP_COMPRESS_KIND_COUNT ? kind_names[k] : "?";
}

int dp_compress_parse(const char *s, dp_compress *out, dp_err *err)
{
    out->kind = DP_COMPRESS_NONE;
    out->ratio = 0;
    out->rank = 0;
    if (!s)
        return 0;
    if (strncmp(s, "topk:", 5) == 0) {
        char *end;
        double r = strtod(s + 5, &end);
        if (end == s + 5 || *end || !(r > 0 && r <= 1))
            return dp_errf(err, "'%s': topk takes a ratio in (0, 1], as topk:0.01", s);
        out->kind = DP_COMPRESS_TOPK;
        out->ratio = r;
        return 0;
    }
    if (strncmp(s, "powersgd", 8) == 0) {
        /* digits only: strtol would take "+4", " 4" and "4.5"'s 4 */
        const char *d = s[8] == ':' ? s + 9 : NULL;
        size_t nd = d ? strspn(d, "0123456789") : 0;
        long r = nd && nd <= 9 && !d[nd] ? strtol(d, NULL, 10) : 0;
        if (r < 1 || r > DP_POWERSGD_MAX_RANK)
            return dp_errf(err, "'%s': powersgd takes a rank, a whole number from 1 to %d, as "
                                "powersgd:4",
                           s, DP_POWERSGD_MAX_RANK);
        out->kind = DP_COMPRESS_POWERSGD;
        out->rank = (int)r;
        return 0;
    }
    for (int k = 0; k < DP_COMPRESS_KIND_COUNT; k++)
        if (k != DP_COMPRESS_TOPK && k != DP_COMPRESS_POWERSGD && strcmp(s, kind_names[k]) == 0) {
            out->kind = (dp_compress_kind)k;
            return 0;
        }
    return dp_errf(err, "'%s' is not none, bf16, fp16, topk:RATIO, powersgd:RANK or auto", s);
}

static uint32_t bits_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

uint16_t dp_f32_to_bf16(float x)
{
    uint32_t u = bits_of(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40); /* a quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1);          /* to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

float dp_bf16_to_f32(uint16_t h) { return float_of((uint32_t)h << 16); }

/* The rounding of F. Giesen's float_to_half_fast3_rtne: subnormals by
 * adding 0.5f, whose ulp (2^-24) is fp16's smallest step. */
uint16_t dp_f32_to_fp16(float x)
{
    uint32_t u = bits_of(x), sign = u & 0x80000000u;
    u ^= sign;
    uint16_t o;
    if (u >= (127u + 16) << 23) {
        o = u > 0x7f800000u ? 0x7e00 : 0x7c00; /* NaN, or infinity (2^16 and above) */
    } else if (u < 113u << 23) {
        o = (uint16_t)(bits_of(float_of(u) + 0.5f) - bits_of(0.5f));
    } else {
        uint32_t odd = (u >> 13) & 1;
        u += ((uint32_t)(15 - 127) << 23) + 0xfff + odd;
        o = (uint16_t)(u >> 13);
    }
    return (uint16_t)(o | (sign >> 16));
}

float dp_fp16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) {
        float v = ldexpf((float)m, -24);
        return sign ? -v : v;
    }
    if (e == 31)
        return float_of(sign | 0x7f800000u | (m << 13));
    return float_of(sign | ((e + 112) << 23) | (m << 13));
}

void dp_compress_encode16(dp_compress_kind kind, const float *x, size_t n, uint8_t *out)
{
    for (size_t i = 0; i < n; i++) {
        uint16_t h = kind == DP_COMPRESS_BF16 ? dp_f32_to_bf16(x[i]) : dp_f32_to_fp16(x[i]);
        /* dp_put_u16's bytes, inline: a call per element would cost more
         * than the conversion */
        out[2 * i] = (uint8_t)h;
        out[2 * i + 1] = (uint8_t)(h >> 8);
    }
}

static float decode1(dp_compress_kind kind, const uint8_t *in, size_t i)
{
    uint16_t h = (uint16_t)(in[2 * i] | in[2 * i + 1] << 8); /* dp_get_u16's, inline */
    return kind == DP_COMPRESS_BF16 ? dp_bf16_to_f32(h) : dp_fp16_to_f32(h);
}

void dp_compress_decode16(dp_compress_kind kind, const uint8_t *in, size_t n, float *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = decode1(kind, in, i);
}

void dp_compress_decode16_add(dp_compress_kind kind, const uint8_t *in, size_t n, float *acc)
{
    for (size_t i = 0; i < n; i++)
        acc[i] += decode1(kind, in, i);
}

size_t dp_topk_count(double ratio, size_t n)
{
    double k = ceil(ratio * (double)n);
    return k < 1 ? 1 : k > (double)n ? n : (size_t)k;
}

/* A magnitude that orders NaN above everything, so selection stays total. */
static float mag(float x) { return isnan(x) ? INFINITY : fabsf(x); }

static void swap(float *a, size_t i, size_t j)
{
    float t = a[i];
    a[i] = a[j];
    a[j] = t;
}

/* The k-th largest of a[0..n) (1 <= k <= n), reordering a: selection with a
 * median-of-three pivot and a three-way partition (duplicates end a round). */
static float kth_largest(float *a, size_t n, size_t k)
{
    size_t lo = 0, hi = n, want = k - 1;
    while (hi - lo > 1) {
        float p0 = a[lo], p1 = a[lo + (hi - lo) / 2], p2 = a[hi - 1];
        float pivot = p0 > p1 ? (p1 > p2 ? p1 : p0 > p2 ? p2 : p0)
                              : (p0 > p2 ? p0 : p1 > p2 ? p2 : p1);
        /* [lo, lt) above the pivot, [lt, gt) equal, [gt, hi) below */
        size_t lt = lo, i = lo, gt = hi;
        while (i < gt) {
            if (a[i] > pivot)
                swap(a, lt++, i++);
            else if (a[i] < pivot)
                swap(a, i, --gt);
            else
                i++;
        }
        if (want < lt)
            hi = lt;
        else if (want >= gt)
            lo = gt;
        else
            return pivot;
    }
    return a[lo];
}

void dp_topk_encode(const float *x, size_t n, size_t k, float *scratch, uint8_t *out)
{
    for (size_t i = 0; i < n; i++)
        scratch[i] = mag(x[i]);
    float t = kth_largest(scratch, n, k);
    size_t above = 0;
    for (size_t i = 0; i < n; i++)
        above += mag(x[i]) > t;
    size_t ties = k - above, w = 0;
    for (size_t i = 0; i < n && w < k; i++) {
        float m = mag(x[i]);
        if (m > t || (m == t && ties > 0)) {
            if (m == t)
                ties--;
            dp_put_u32(out + 8 * w, (uint32_t)i);
            dp_put_f32(out + 8 * w + 4, x[i]);
            w++;
        }
    }
}

int dp_topk_decode_add(const uint8_t *in, size_t k, float *acc, size_t n, dp_err *err)
{
    for (size_t j = 0; j < k; j++) {
        uint32_t i = dp_get_u32(in + 8 * j);
        if (i >= n)
            return dp_errf(err, "top-k pair %zu names element %u of a bucket of %zu", j, i, n);
        acc[i] += dp_get_f32(in + 8 * j + 4);
    }
    return 0;
}

size_t dp_coded_bytes(const dp_compress *c, size_t n)
{
    if (c->kind == DP_COMPRESS_BF16 || c->kind == DP_COMPRESS_FP16)
        return DP_CODED_HEAD_SIZE + 2 * n;
    if (c->kind == DP_COMPRESS_TOPK)
        return DP_CODED_HEAD_SIZE + 8 * dp_topk_count(c->ratio, n);
    return 0;
}

void dp_coded_encode(const dp_compress *c, const float *g, float *resid, size_t n, float *tmp,
                     float *tmp2, uint8_t *out)
{
    for (size_t i = 0; i < n; i++)
        tmp[i] = g[i] + resid[i];
    uint8_t *body = out + DP_CODED_HEAD_SIZE;
    dp_put_u32(out, (uint32_t)c->kind);
    if (c->kind == DP_COMPRESS_TOPK) {
        size_t k = dp_topk_count(c->ratio, n);
        dp_put_u32(out + 4, (uint32_t)k);
        dp_topk_encode(tmp, n, k, tmp2, body);
        memcpy(resid, tmp, n * sizeof(float));
        for (size_t j = 0; j < k; j++)
            resid[dp_get_u32(body + 8 * j)] = 0; /* sent whole */
        return;
    }
    dp_put_u32(out + 4, (uint32_t)n);
    dp_compress_encode16(c->kind, tmp, n, body);
    for (size_t i = 0; i < n; i++)
        resid[i] = tmp[i] - decode1(c->kind, body, i);
}

int dp_coded_decode(const dp_compress *c, const uint8_t *in, size_t len, float *out, size_t n,
                    dp_err *err)
{
    size_t want = dp_coded_bytes(c, n);
    if (want == 0 || len != want)
        return dp_errf(err, "a coded block of %zu bytes; --compress %s takes %zu for %zu floats",
                       len, dp_compress_kind_name(c->kind), want, n);
    uint32_t kind = dp_get_u32(in), count = dp_get_u32(in + 4);
    if (kind != (uint32_t)c->kind)
        return dp_errf(err, "a block coded as %s; this run's --compress is %s",
                       dp_compress_kind_name((dp_compress_kind)kind),
                       dp_compress_kind_name(c->kind));
    size_t expect = (want - DP_CODED_HEAD_SIZE) / (c->kind == DP_COMPRESS_TOPK ? 8 : 2);
    if (count != expect)
        return dp_errf(err, "a %s block says %u values; a shard of %zu takes %zu",
                       dp_compress_kind_name(c->kind), count, n, expect);
    if (c->kind != DP_COMPRESS_TOPK) {
        dp_compress_decode16(c->kind, in + DP_CODED_HEAD_SIZE, n, out);
        return 0;
    }
    memset(out, 0, n * sizeof(float));
    return dp_topk_decode_add(in + DP_CODED_HEAD_SIZE, count, out, n, err);
}

int dp_coded_set(const uint8_t *in, size_t len, float *x, size_t n, dp_err *err)
{
    if (len < DP_CODED_HEAD_SIZE + 8 || (len - DP_CODED_HEAD_SIZE) % 8 != 0 ||
        (len - DP_CODED_HEAD_SIZE) / 8 > n)
        return dp_errf(err, "a coded answer of %zu bytes; a shard of %zu takes 8 + 8k for k in "
                            "[1, %zu]", len, n, n);
    uint32_t kind = dp_get_u32(in), count = dp_get_u32(in + 4);
    size_t k = (len - DP_CODED_HEAD_SIZE) / 8;
    if (kind != (uint32_t)DP_COMPRESS_TOPK)
        return dp_errf(err, "a coded answer of codec %u; answers are top-k (%u)", kind,
                       (unsigned)DP_COMPRESS_TOPK);
    if (count != k)
        return dp_errf(err, "a coded answer says %u pairs in %zu bytes (%zu pairs)", count, len,
                       k);
    const uint8_t *body = in + DP_CODED_HEAD_SIZE;
    /* every index checked before anything is set: a bad answer changes nothing */
    for (size_t j = 0; j < k; j++) {
        uint32_t i = dp_get_u32(body + 8 * j);
        if (i >= n || (j > 0 && i <= dp_get_u32(body + 8 * (j - 1))))
            return dp_errf(err, "a coded answer's pair %zu names element %u (%s)", j, i,
                           i >= n ? "not below the shard's n" : "not above the one before");
    }
    for (size_t j = 0; j < k; j++)
        x[dp_get_u32(body + 8 * j)] = dp_get_f32(body + 8 * j + 4);
    return 0;
}

/* The scale of a 4-bit difference: the smallest power of two s with
 * max|d| <= 7 s (0 for no difference), so q s is exact and x + q s one
 * rounding, the same on every host. */
static float delta4_scale(float most)
{
    if (!(most > 0))
        return 0;
    int e;
    float m = frexpf(most / 7.0f, &e); /* most / 7 = m 2^e, m in [0.5, 1) */
    float s = ldexpf(1.0f, m == 0.5f ? e - 1 : e);
    return s * 7.0f < most ? s * 2.0f : s;
}

size_t dp_delta4_bytes(size_t n) { return DP_DELTA4_HEAD_SIZE + (n + 1) / 2; }

int dp_delta4_encode(const float *x, float *copy, size_t n, uint8_t *out)
{
    float most = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(x[i] - copy[i]);
        if (!(d <= FLT_MAX))
            return -1; /* not finite (NaN or inf): nothing changed, the caller answers whole */
        most = d > most ? d : most;
    }
    float s = delta4_scale(most);
    if (!(s <= FLT_MAX))
        return -1;
    dp_put_u32(out, DP_CODED_DELTA4);
    dp_put_u32(out + 4, (uint32_t)n);
    dp_put_f32(out + 8, s);
    uint8_t *q = out + DP_DELTA4_HEAD_SIZE;
    memset(q, 0, (n + 1) / 2);
    if (s == 0)
        return 0;
    /* 1 / s is exact for a normal power of two; d / s rounded to nearest
     * even by the 1.5 x 2^23 trick (|d / s| <= 7) */
    int exact = s >= FLT_MIN && s <= 0x1p126f;
    float inv = exact ? 1.0f / s : 0;
    for (size_t i = 0; i < n; i++) {
        float d = x[i] - copy[i];
        float v = exact ? d * inv : d / s;
        v = (v + 12582912.0f) - 12582912.0f;
        int k = v > 7 ? 7 : v < -7 ? -7 : (int)v;
        q[i / 2] |= (uint8_t)((k & 15) << (4 * (i & 1)));
        /* the copy takes what was sent, as the receiver's does in
         * dp_delta4_apply: the same expression on the same bits */
        copy[i] += (float)k * s;
    }
    return 0;
}

int dp_delta4_apply(const uint8_t *in, size_t len, float *x, size_t n, dp_err *err)
{
    if (len != dp_delta4_bytes(n))
        return dp_errf(err, "a 4-bit answer of %zu bytes; a shard of %zu takes %zu", len, n,
                       dp_delta4_bytes(n));
    uint32_t kind = dp_get_u32(in), count = dp_get_u32(in + 4);
    float s = dp_get_f32(in + 8);
    if (kind != DP_CODED_DELTA4 || count != n)
        return dp_errf(err, "a 4-bit answer says codec %u, %u values; a shard of %zu takes "
                            "codec %u, %zu", kind, count, n, (unsigned)DP_CODED_DELTA4, n);
    int e;
    if (!(s >= 0 && s <= FLT_MAX) || (s > 0 && frexpf(s, &e) != 0.5f))
        return dp_errf(err, "a 4-bit answer's scale %g is not 0 or a power of two", (double)s);
    const uint8_t *q = in + DP_DELTA4_HEAD_SIZE;
    for (size_t i = 0; i < n; i++)
        if (((q[i / 2] >> (4 * (i & 1))) & 15) == 8)
            return dp_errf(err, "a 4-bit answer's value %zu is -8; they lie in [-7, 7]", i);
    if (n & 1 && q[n / 2] >> 4)
        return dp_errf(err, "a 4-bit answer's padding nibble is not 0");
    for (size_t i = 0; i < n; i++) {
        int k = (q[i / 2] >> (4 * (i & 1))) & 15;
        x[i] += (float)(k > 7 ? k - 16 : k) * s;
    }
    return 0;
}
