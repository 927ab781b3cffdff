/* Gradient compression (include/downpour/compress.h, the coded all-reduce
 * of ring.h), on the in-process transport:
 *   - bf16 and fp16 give back every value they hold, bit for bit (all 65536
 *     patterns; NaN stays NaN), round to nearest even (checked against the
 *     compiler's _Float16 where it has one, and on constructed ties), and
 *     go to infinity past their range;
 *   - top-k picks the largest magnitudes, ties to the lower index;
 *   - the coded all-reduce leaves every replica bitwise identical, sums
 *     exactly what the format holds (bf16 of small integers, top-k at ratio
 *     1), and keeps the residual of what it did not send; flat, and
 *     hierarchical over a fake host map (compressed between leaders only);
 *   - gradient descent on a least-squares problem over 3 replicas (rate 1,
 *     then 1/4, then 1/16), with bf16, fp16 and top-k at 0.1 (error
 *     feedback), reaches the uncompressed loss within 1 %; top-k without
 *     the feedback stays far above it.
 * The ps answers' 4-bit difference (dp_delta4_encode / _apply): the
 * receiver ends with the sender's copy bit for bit, the scale is the
 * smallest power of two with max |x - copy| <= 7 scale, what 4 bits leave
 * out stays in the next difference, and a difference that is not finite
 * is refused with the copy untouched.
 * --compress's parse refuses what it does not know.
 * --compress auto's choice of PowerSGD (src/strategy/allreduce_auto.h):
 *   - the rule: for Model 1 (784-300-100-10) on a 100 Mbit/s-like fit it
 *     takes powersgd:16 (within a third of bf16/none's step), on slower
 *     ones 8 and 4, on a 10 GB/s one none, nor on the slow link when the
 *     products cost more than the bytes saved;
 *   - measured on 4 members of the in-process transport with a fake slow
 *     link (DOWNPOUR_TEST_LINK_NS=80, docs/faults.md "Test hooks") every
 *     member takes powersgd with the same numbers; without it every member
 *     takes the same choice too; a model with no matrix to factor is not
 *     considered, and says so. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "downpour/compress.h"
#include "downpour/inproc.h"
#include "downpour/model.h"
#include "downpour/ring.h"
#include "downpour/testhooks.h"
#include "downpour/wire.h"
#include "strategy/allreduce_auto.h"

static uint32_t bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float from_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static void round_trips(void)
{
    int bad_bf = 0, bad_fp = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float b = dp_bf16_to_f32((uint16_t)h), f = dp_fp16_to_f32((uint16_t)h);
        if (isnan(b))
            bad_bf += !isnan(dp_bf16_to_f32(dp_f32_to_bf16(b)));
        else
            bad_bf += dp_f32_to_bf16(b) != h;
        if (isnan(f))
            bad_fp += !isnan(dp_fp16_to_f32(dp_f32_to_fp16(f)));
        else
            bad_fp += dp_f32_to_fp16(f) != h;
    }
    CHECKF(bad_bf == 0, "%d bf16 values do not come back", bad_bf);
    CHECKF(bad_fp == 0, "%d fp16 values do not come back", bad_fp);
    /* Known values, ties to even, range. */
    CHECK(dp_fp16_to_f32(dp_f32_to_fp16(1.0f)) == 1.0f);
    CHECK(dp_f32_to_fp16(65504.0f) == 0x7bff);
    CHECK(dp_f32_to_fp16(65520.0f) == 0x7c00); /* halfway to 2^16: rounds to infinity */
    CHECK(dp_f32_to_fp16(65519.0f) == 0x7bff);
    CHECK(dp_f32_to_fp16(-1e10f) == 0xfc00);
    CHECK(dp_f32_to_fp16(ldexpf(1, -24)) == 0x0001);   /* the smallest subnormal */
    CHECK(dp_f32_to_fp16(ldexpf(1, -25)) == 0x0000);   /* halfway to it: even is 0 */
    CHECK(dp_f32_to_fp16(ldexpf(3, -25)) == 0x0002);   /* 1.5 ulp: even is 2 */
    CHECK(dp_f32_to_fp16(1.0f + ldexpf(1, -11)) == 0x3c00); /* tie: to even (1.0) */
    CHECK(dp_f32_to_fp16(1.0f + ldexpf(3, -11)) == 0x3c02); /* tie: to even (up) */
    CHECK(dp_f32_to_bf16(1.0f + ldexpf(1, -8)) == 0x3f80);  /* tie: to even */
    CHECK(dp_f32_to_bf16(1.0f + ldexpf(3, -8)) == 0x3f82);
    CHECK(dp_f32_to_bf16(from_bits(0x7f7fffff)) == 0x7f80); /* FLT_MAX rounds to infinity */
    CHECK(isnan(dp_bf16_to_f32(dp_f32_to_bf16(NAN))) && isnan(dp_fp16_to_f32(dp_f32_to_fp16(NAN))));
    /* Random floats: the nearest value held, ties to even. */
    uint64_t s = 88172645463325252ull;
    int far = 0, differ = 0;
    for (int i = 0; i < 200000; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        float x = from_bits((uint32_t)s & 0xbfffffffu); /* exponents up to 2^1: all finite */
        float b = dp_bf16_to_f32(dp_f32_to_bf16(x));
        uint32_t lo = bits(x) & 0xffff0000u; /* truncated toward zero, and the next one up */
        float down = from_bits(lo), up = from_bits(lo + 0x10000u);
        far += !(b == down || b == up) || fabsf(b - x) > fabsf((b == down ? up : down) - x);
#ifdef __FLT16_MANT_DIG__
        _Float16 h = (_Float16)x;
        differ += bits(dp_fp16_to_f32(dp_f32_to_fp16(x))) != bits((float)h);
#endif
    }
    CHECKF(far == 0, "%d bf16 roundings are not to the nearest", far);
    CHECKF(differ == 0, "%d fp16 roundings differ from the compiler's _Float16", differ);
    /* Encoded bytes are little-endian. */
    float one = 1.0f;
    uint8_t enc[2];
    dp_compress_encode16(DP_COMPRESS_BF16, &one, 1, enc);
    CHECK(enc[0] == 0x80 && enc[1] == 0x3f);
}

static void delta4(void)
{
    enum { N = 9 }; /* odd: a padding nibble */
    float x[N], copy[N], recv[N];
    uint8_t blk[DP_DELTA4_HEAD_SIZE + (N + 1) / 2];
    for (int i = 0; i < N; i++) {
        copy[i] = recv[i] = 0.25f * (float)i;
        x[i] = copy[i] + 0.37f * sinf((float)i + 1.0f);
    }
    dp_err e;
    for (int round = 0; round < 3; round++) {
        CHECK(dp_delta4_bytes(N) == sizeof blk && dp_delta4_encode(x, copy, N, blk) == 0);
        float sc = dp_get_f32(blk + 8), most = 0;
        int ex;
        CHECKF(sc > 0 && frexpf(sc, &ex) == 0.5f, "round %d: scale %g", round, (double)sc);
        CHECK(dp_delta4_apply(blk, sizeof blk, recv, N, &e) == 0);
        CHECKF(memcmp(recv, copy, sizeof recv) == 0, "round %d: the receiver's copy differs",
               round);
        for (int i = 0; i < N; i++)
            most = fmaxf(most, fabsf(x[i] - copy[i]));
        CHECKF(most <= 0.501f * sc, "round %d: %g left at scale %g", round, (double)most,
               (double)sc);
    }
    float keep[N];
    memcpy(keep, copy, sizeof keep);
    x[3] = INFINITY;
    CHECK(dp_delta4_encode(x, copy, N, blk) == -1 && memcmp(keep, copy, sizeof keep) == 0);
    x[3] = NAN;
    CHECK(dp_delta4_encode(x, copy, N, blk) == -1 && memcmp(keep, copy, sizeof keep) == 0);
    printf("delta4: the receiver holds the sender's copy bit for bit over 3 answers; "
           "inf and NaN refused, the copy untouched\n");
}

static void topk(void)
{
    const float x[8] = {0.5f, -3, 2, NAN, -2, 2, 0, 1};
    float scratch[8], acc[8] = {0};
    uint8_t out[8 * 8];
    dp_topk_encode(x, 8, 4, scratch, out); /* NaN, -3, then the first two of the 2s */
    dp_err err;
    REQUIRE(dp_topk_decode_add(out, 4, acc, 8, &err) == 0);
    CHECK(isnan(acc[3]) && acc[1] == -3 && acc[2] == 2 && acc[4] == -2 && acc[5] == 0);
    CHECK(acc[0] == 0 && acc[6] == 0 && acc[7] == 0);
    out[0] = 9; /* an index past the bucket */
    CHECK(dp_topk_decode_add(out, 4, acc, 8, &err) < 0 && strstr(err.msg, "element 9"));
    CHECK(dp_topk_count(0.01, 1000) == 10 && dp_topk_count(0.001, 10) == 1);
    /* Many equal magnitudes: exactly k, the lowest indices. */
    float y[100];
    for (int i = 0; i < 100; i++)
        y[i] = i % 2 ? 1.0f : -1.0f;
    float sc[100], a2[100] = {0};
    uint8_t o2[8 * 30];
    dp_topk_encode(y, 100, 30, sc, o2);
    REQUIRE(dp_topk_decode_add(o2, 30, a2, 100, &err) == 0);
    int n_set = 0, first_ok = 1;
    for (int i = 0; i < 100; i++) {
        n_set += a2[i] != 0;
        first_ok &= (i < 30) == (a2[i] != 0);
    }
    CHECK(n_set == 30 && first_ok);
}

static void parse(void)
{
    dp_compress c;
    dp_err err;
    CHECK(dp_compress_parse("topk:0.01", &c, &err) == 0 && c.kind == DP_COMPRESS_TOPK &&
          c.ratio == 0.01);
    CHECK(dp_compress_parse("fp16", &c, &err) == 0 && c.kind == DP_COMPRESS_FP16);
    CHECK(dp_compress_parse(NULL, &c, &err) == 0 && c.kind == DP_COMPRESS_NONE);
    CHECK(dp_compress_parse("topk:0", &c, &err) < 0 && strstr(err.msg, "(0, 1]"));
    CHECK(dp_compress_parse("topk:x", &c, &err) < 0);
    CHECK(dp_compress_parse("powersgd:4", &c, &err) == 0 && c.kind == DP_COMPRESS_POWERSGD &&
          c.rank == 4);
    CHECK(dp_compress_parse("powersgd:1024", &c, &err) == 0 && c.rank == 1024);
    const char *bad[] = {"powersgd", "powersgd:", "powersgd:0", "powersgd:abc", "powersgd:-1",
                         "powersgd:+4", "powersgd: 4", "powersgd:4.5", "powersgd:4x",
                         "powersgd:1025", "powersgd:99999999999", "powersgd4"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECKF(dp_compress_parse(bad[i], &c, &err) < 0 && strstr(err.msg, "rank"),
               "'%s' taken: %s", bad[i], err.msg);
    CHECK(dp_compress_parse("gzip", &c, &err) < 0 && strstr(err.msg, "'gzip'"));
}

/* ---- the coded all-reduce, one thread per replica ---- */

#define N 3
#define DIM 40
#define ROWS 30

typedef struct rep {
    dp_transport *t;
    const int *order;
    dp_compress c;
    int mode; /* 0: one sum of buf; 1: gradient descent */
    dp_allreduce_algo algo;
    int no_feedback;
    float *buf;
    size_t len;
    float resid[4096];
    /* descent */
    const float *a, *b; /* ROWS x DIM, ROWS: this replica's rows */
    float w[DIM];
    int rc;
    char msg[sizeof(dp_err)];
} rep;

static void *run_rep(void *arg)
{
    rep *p = arg;
    dp_ring r;
    dp_err err;
    if (dp_ring_init(&r, p->t, p->order, N, 20, 64, &err) < 0)
        goto fail;
    dp_ring_set_compress(&r, &p->c);
    dp_ring_set_algo(&r, p->algo);
    if (p->mode == 0) {
        memset(p->resid, 0, sizeof p->resid);
        if (dp_ring_allreduce_coded(&r, p->buf, p->len, p->resid, 1, 0, &err) < 0)
            goto fail;
    } else {
        memset(p->w, 0, sizeof p->w);
        memset(p->resid, 0, sizeof p->resid);
        float g[DIM];
        for (int step = 1; step <= 600; step++) {
            memset(g, 0, sizeof g);
            for (int i = 0; i < ROWS; i++) {
                float e = -p->b[i];
                for (int j = 0; j < DIM; j++)
                    e += p->a[i * DIM + j] * p->w[j];
                for (int j = 0; j < DIM; j++)
                    g[j] += e * p->a[i * DIM + j] / (ROWS * N);
            }
            if (dp_ring_allreduce_coded(&r, g, DIM, p->c.kind && !p->no_feedback ? p->resid : NULL, (uint64_t)step,
                                        0, &err) < 0)
                goto fail;
            for (int j = 0; j < DIM; j++)
                p->w[j] -= (step <= 300 ? 1.0f : step <= 450 ? 0.25f : 0.0625f) * g[j];
        }
    }
    dp_ring_free(&r);
    return NULL;
fail:
    p->rc = -1;
    snprintf(p->msg, sizeof p->msg, "%s", err.msg);
    dp_ring_free(&r);
    return NULL;
}

static dp_allreduce_algo g_algo = DP_ALGO_AUTO; /* for the next runs */
static const int *g_hosts; /* a fake host map for the next runs, or NULL */

static void run_reps(rep *reps)
{
    dp_transport *ts[N];
    dp_err err;
    REQUIRE(dp_inproc_open(ts, N, &err) == 0);
    if (g_hosts)
        REQUIRE(dp_inproc_set_hosts(ts[0], g_hosts, &err) == 0);
    static const int order[N] = {2, 0, 1};
    pthread_t th[N];
    for (int p = 0; p < N; p++) {
        reps[p].t = ts[order[p]];
        reps[p].algo = g_algo;
        reps[p].order = order;
        REQUIRE(pthread_create(&th[p], NULL, run_rep, &reps[p]) == 0);
    }
    for (int p = 0; p < N; p++) {
        pthread_join(th[p], NULL);
        CHECKF(reps[p].rc == 0, "%s: %s", dp_compress_kind_name(reps[p].c.kind), reps[p].msg);
    }
    for (int p = 0; p < N; p++)
        dp_transport_close(ts[p]);
}

static void coded_sums(void)
{
    const dp_compress kinds[] = {{DP_COMPRESS_BF16, 0, 0}, {DP_COMPRESS_FP16, 0, 0},
                                 {DP_COMPRESS_TOPK, 1.0, 0}, {DP_COMPRESS_TOPK, 0.1, 0}};
    const size_t lens[] = {1, 2, 7, 1001};
    for (int k = 0; k < 4; k++)
        for (int l = 0; l < 4; l++) {
            size_t len = lens[l];
            rep reps[N];
            memset(reps, 0, sizeof reps);
            float *in[N];
            for (int p = 0; p < N; p++) {
                REQUIRE((reps[p].buf = malloc(len * sizeof(float))) != NULL);
                REQUIRE((in[p] = malloc(len * sizeof(float))) != NULL);
                for (size_t i = 0; i < len; i++)
                    in[p][i] = reps[p].buf[i] =
                        k == 3 ? (float)((i * 31 + (size_t)p * 7) % 97) / 7.0f
                               : (float)((int)((i * 7 + (size_t)p * 13) % 101) - 50);
                reps[p].len = len;
                reps[p].c = kinds[k];
            }
            run_reps(reps);
            int same = 1, exact = 1, resid_ok = 1;
            for (size_t i = 0; i < len; i++) {
                float want = 0;
                for (int p = 0; p < N; p++)
                    want += in[p][i];
                for (int p = 0; p < N; p++) {
                    same &= bits(reps[p].buf[i]) == bits(reps[0].buf[i]);
                    /* small integers: bf16, fp16 and a full top-k sum exactly */
                    exact &= k == 3 || reps[p].buf[i] == want;
                    /* what was not sent stays behind, what was sent is gone */
                    resid_ok &= k != 3 || g_hosts || reps[p].resid[i] == 0 ||
                                reps[p].resid[i] == in[p][i];
                }
            }
            if (k >= 2) { /* top-k: the sum and the residuals hold every input */
                double worst = 0;
                for (size_t i = 0; i < len; i++) {
                    double total = 0, have = reps[0].buf[i];
                    for (int p = 0; p < N; p++)
                        total += in[p][i], have += reps[p].resid[i];
                    worst = fmax(worst, fabs(have - total) / (1 + fabs(total)));
                }
                CHECKF(worst < 1e-5, "top-k len %zu: sum + residuals off by %g", len, worst);
            }
            if (k == 3 && !g_hosts) { /* top-k at 0.1: the residuals hold all but k each */
                size_t kept = dp_topk_count(0.1, len);
                for (int p = 0; p < N; p++) {
                    size_t zero = 0;
                    for (size_t i = 0; i < len; i++)
                        zero += reps[p].resid[i] == 0 && in[p][i] != 0;
                    CHECKF(zero <= kept, "top-k: %zu of %zu sent", zero, len);
                }
            }
            CHECKF(same, "%s len %zu: replicas differ", dp_compress_kind_name(kinds[k].kind), len);
            CHECKF(exact, "%s len %zu: sums not exact", dp_compress_kind_name(kinds[k].kind), len);
            CHECKF(resid_ok, "top-k len %zu: residuals wrong", len);
            for (int p = 0; p < N; p++) {
                free(reps[p].buf);
                free(in[p]);
            }
        }
}

static double loss_of(const float *a, const float *b, const float *w)
{
    double l = 0;
    for (int i = 0; i < ROWS * N; i++) {
        double e = -b[i];
        for (int j = 0; j < DIM; j++)
            e += (double)a[i * DIM + j] * w[j];
        l += e * e / (2.0 * ROWS * N);
    }
    return l;
}

static void convergence(void)
{
    static float a[ROWS * N * DIM], b[ROWS * N];
    uint64_t s = 0x243f6a8885a308d3ull;
    for (int i = 0; i < ROWS * N * DIM; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        a[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2 - 1);
    }
    for (int i = 0; i < ROWS * N; i++) {
        double t = 0;
        for (int j = 0; j < DIM; j++)
            t += a[i * DIM + j] * (j % 3 ? 0.5 : -1.0);
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        b[i] = (float)(t + 0.1 * ((double)(s >> 11) / 9007199254740992.0 - 0.5));
    }
    const dp_compress kinds[] = {{DP_COMPRESS_NONE, 0, 0}, {DP_COMPRESS_BF16, 0, 0},
                                 {DP_COMPRESS_FP16, 0, 0}, {DP_COMPRESS_TOPK, 0.1, 0},
                                 {DP_COMPRESS_TOPK, 0.1, 0}};
    double base = 0, start = 0;
    for (int k = 0; k < 5; k++) {
        rep reps[N];
        memset(reps, 0, sizeof reps);
        for (int p = 0; p < N; p++) {
            reps[p].mode = 1;
            reps[p].c = kinds[k];
            reps[p].a = a + (size_t)p * ROWS * DIM;
            reps[p].b = b + (size_t)p * ROWS;
        }
        int no_feedback = k == 4; /* top-k without error feedback, for contrast */
        for (int p = 0; p < N; p++)
            reps[p].no_feedback = no_feedback;
        run_reps(reps);
        int same = 1;
        for (int p = 1; p < N; p++)
            same &= memcmp(reps[p].w, reps[0].w, sizeof reps[0].w) == 0;
        CHECKF(same, "%s: replicas differ", dp_compress_kind_name(kinds[k].kind));
        double l = loss_of(a, b, reps[0].w);
        float zero[DIM] = {0};
        if (k == 0) {
            base = l;
            start = loss_of(a, b, zero);
        }
        printf("%s%s: loss %.6f (uncompressed %.6f, at w = 0 %.6f)\n",
               dp_compress_kind_name(kinds[k].kind), no_feedback ? " without feedback" : "", l, base,
               start);
        if (k > 0 && k < 4)
            CHECKF(fabs(l - base) <= 0.01 * base, "%s: loss %.6f, uncompressed %.6f",
                   dp_compress_kind_name(kinds[k].kind), l, base);
        /* the residual is what gets top-k there */
        CHECKF(k < 4 || l > 10 * base, "top-k without feedback: loss %.6f", l);
    }
}

/* A ring of 4 whose fit says latency a s, b s per byte of the buffer,
 * and bf16's codec 2 ns a float (as measured on this machine's kind). */
static dp_ring fitted(double a, double b)
{
    dp_ring r;
    memset(&r, 0, sizeof r);
    r.n = 4;
    r.setup = 1;
    r.fit_a[0] = r.fit_a[1] = a;
    r.fit_b[0] = r.fit_b[1] = b;
    r.codec_s = 2e-9;
    return r;
}

static void auto_rule(void)
{
    /* Model 1 (784-300-100-10): rank 4 sums 2050 + 4736 floats a step
     * (docs/strategies.md), 8 and 16 more; buckets of 512 KiB; products
     * of 0.5, 1 and 2 ms */
    dp_model m;
    dp_err err;
    REQUIRE(dp_model_describe(&m, "784-300-100-10", &err) == 0);
    dp_auto_cand c[DP_AUTO_PSGD_N_RANKS];
    int n = dp_auto_candidates(&m, c);
    CHECKF(n == 3 && c[0].rank == 4 && c[0].first == 2050 && c[0].second == 4736 &&
               c[1].rank == 8 && c[2].rank == 16,
           "%d candidates: rank %d, %zu + %zu floats", n, c[0].rank, c[0].first, c[0].second);
    for (int i = 0; i < n; i++)
        c[i].products_s = 0.5e-3 * (1 << i);
    size_t bucket = 512u << 10;
    /* ns a byte of the buffer (100 Mbit/s between 4 hosts: 2 (n-1)/n /
     * 12.5 MB/s = 120), and the rank expected: within a third of bf16/none's
     * prediction the highest, else 4 while faster at all */
    const struct {
        double a, ns;
        int rank;
    } links[] = {{200e-6, 120, 16}, {200e-6, 20, 8}, {200e-6, 5, 4}, {200e-6, 1, 4},
                 {20e-6, 0.1, 0}};
    dp_auto_compress a;
    for (size_t i = 0; i < sizeof links / sizeof links[0]; i++) {
        dp_ring r = fitted(links[i].a, links[i].ns * 1e-9);
        int took = dp_auto_psgd_rule(&a, &r, c, n, m.n_params, bucket);
        char want[32];
        snprintf(want, sizeof want, "auto: powersgd:%d (", links[i].rank);
        CHECKF(took == links[i].rank && a.rank == took &&
                   strncmp(a.why, links[i].rank ? want : "auto: bf16 or none per bucket (",
                           strlen(links[i].rank ? want : "auto: bf16 or none per bucket (")) == 0,
               "%g ns a byte: took %d, expected %d: %s", links[i].ns, took, links[i].rank, a.why);
    }
    dp_ring slow = fitted(200e-6, 120e-9);
    fprintf(stderr, "slow link's rule: %s\n", (dp_auto_psgd_rule(&a, &slow, c, n, m.n_params,
                                                                 bucket), a.why));
    /* products that cost more than the bytes saved: none, even there */
    dp_auto_cand dear[DP_AUTO_PSGD_N_RANKS];
    memcpy(dear, c, sizeof dear);
    for (int i = 0; i < n; i++)
        dear[i].products_s = 1.0;
    CHECKF(dp_auto_psgd_rule(&a, &slow, dear, n, m.n_params, bucket) == 0,
           "slow link, products of 1 s: %s", a.why);
    /* the same inputs, the same text: what every member logs */
    char again[sizeof a.why];
    dp_auto_psgd_rule(&a, &slow, c, n, m.n_params, bucket);
    snprintf(again, sizeof again, "%s", a.why);
    dp_auto_psgd_rule(&a, &slow, c, n, m.n_params, bucket);
    CHECK(strcmp(again, a.why) == 0);
    dp_model_free(&m);
}

#define AN 4
typedef struct auto_job {
    dp_transport *t;
    const int *order;
    const dp_model *m;
    dp_auto_compress a;
    int rc;
    char msg[sizeof(dp_err)];
} auto_job;

static void *run_auto(void *arg)
{
    auto_job *j = arg;
    dp_ring r;
    dp_err err;
    dp_compress c = {DP_COMPRESS_AUTO, 0, 0};
    j->rc = dp_ring_init(&r, j->t, j->order, AN, 20, 0, &err);
    if (j->rc == 0) {
        dp_ring_set_algo(&r, DP_ALGO_AUTO);
        dp_ring_set_compress(&r, &c);
        j->rc = dp_auto_compress_decide(&j->a, &r, j->m, 512u << 10, 7, 0, &err);
        dp_ring_free(&r);
    }
    if (j->rc < 0)
        snprintf(j->msg, sizeof j->msg, "%s", err.msg);
    return NULL;
}

/* Every member's choice over a fresh in-process ring: all the same. */
static int auto_agreed(const char *spec, const char *what)
{
    dp_model m;
    dp_err err;
    REQUIRE(dp_model_describe(&m, spec, &err) == 0);
    dp_transport *ts[AN];
    REQUIRE(dp_inproc_open(ts, AN, &err) == 0);
    static const int order[AN] = {1, 3, 0, 2};
    auto_job jobs[AN];
    pthread_t th[AN];
    for (int p = 0; p < AN; p++) {
        jobs[p] = (auto_job){.t = ts[order[p]], .order = order, .m = &m};
        REQUIRE(pthread_create(&th[p], NULL, run_auto, &jobs[p]) == 0);
    }
    for (int p = 0; p < AN; p++)
        pthread_join(th[p], NULL);
    for (int p = 0; p < AN; p++) {
        CHECKF(jobs[p].rc == 0, "%s, member %d: %s", what, p, jobs[p].msg);
        CHECKF(jobs[p].a.rank == jobs[0].a.rank && strcmp(jobs[p].a.why, jobs[0].a.why) == 0,
               "%s: member %d chose %s, member 0 %s", what, p, jobs[p].a.why, jobs[0].a.why);
        dp_transport_close(ts[p]);
    }
    fprintf(stderr, "%s: %s\n", what, jobs[0].a.why);
    dp_model_free(&m);
    return jobs[0].a.rank;
}

static void auto_measured(void)
{
    dp_err err;
    REQUIRE(dp_hook_set("DOWNPOUR_TEST_LINK_NS", "80", &err) == 0);
    CHECK(auto_agreed("784-300-100-10", "slow link") > 0);
    REQUIRE(dp_hook_set("DOWNPOUR_TEST_LINK_NS", NULL, &err) == 0);
    auto_agreed("784-300-100-10", "in-process link"); /* either, as measured: but agreed */
    REQUIRE(dp_hook_set("DOWNPOUR_TEST_LINK_NS", "80", &err) == 0);
    dp_model m;
    REQUIRE(dp_model_describe(&m, "784-4", &err) == 0); /* 784 x 4: rank 4 saves nothing */
    dp_auto_compress a;
    dp_ring r;
    memset(&r, 0, sizeof r);
    r.n = 4;
    CHECKF(dp_auto_compress_decide(&a, &r, &m, 512u << 10, 7, 0, &err) == 0 && !a.rank &&
               strstr(a.why, "powersgd not considered: model") &&
               strstr(a.why, "has no weight matrix that rank-4 factors make smaller"),
           "no matrix: %s", a.why);
    dp_model_free(&m);
    REQUIRE(dp_hook_set("DOWNPOUR_TEST_LINK_NS", NULL, &err) == 0);
}

int main(void)
{
    auto_rule();
    auto_measured();
    round_trips();
    delta4();
    topk();
    parse();
    coded_sums();
    convergence();
    /* Hierarchical: exact inside a host, compressed between the leaders. */
    static const int two_hosts[N] = {0, 1, 0};
    g_hosts = two_hosts;
    g_algo = DP_ALGO_HIER;
    coded_sums();
    g_algo = DP_ALGO_AUTO;
    coded_sums();
    return check_failures != 0;
}
