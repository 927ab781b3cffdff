/* PowerSGD (include/downpour/powersgd.h, docs/strategies.md "allreduce:
 * compression"):
 *   - the layer table's matrices: dense (out, in), conv (oc, kh kw c), the
 *     rank clamped per matrix, a matrix the factors would not shrink sent
 *     whole, biases whole;
 *   - one replica, against a reference in double computed here from the
 *     step's own first Q: P = M Q, orthonormalised, Q = M^T P, M' = P Q^T;
 *     a matrix of rank r comes back whole from one rank-r step (the first,
 *     and the next, warm-started), and M' + residual = M in every step;
 *     repeated on one M, what was sent plus the residual is all of it;
 *   - three replicas on the in-process ring: every one ends with the same
 *     bits (the gradient and the warm start), the whole spans summed
 *     exactly, the residuals and M' adding up to the sum of the M's, and a
 *     step moving 2 (n-1) (sum r (rows + cols) + whole) floats over the
 *     ring, not 2 (n-1) n_params, and a skipped range (a sparse table by
 *     its rows) left alone;
 *   - gradient descent on a least-squares problem with a weight matrix and
 *     a bias over 3 replicas reaches the uncompressed loss within 1 % (and
 *     ends above that without the error feedback);
 *   - the program: bad ranks, ranks no matrix can take, --overlap on, the
 *     ps family and pipeline refused with exit 2; and with MNIST, 784-300-100-10 on two
 *     replicas at rank 4: replicas identical, the ring's bytes a step as
 *     planned (about 1/40 of none's), the loss near none's. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "downpour/inproc.h"
#include "downpour/model.h"
#include "downpour/powersgd.h"
#include "downpour/ring.h"
#include "proc.h"

static double frand(uint64_t *s)
{
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return (double)(*s >> 11) / 9007199254740992.0 * 2 - 1;
}

/* ---- the plan over a model's layers ---- */

static void plan(void)
{
    dp_model m;
    dp_err err;
    dp_psgd_matrix mats[DP_POWERSGD_MAX_MATRICES];
    dp_psgd_plan p;
    REQUIRE(dp_model_describe(&m, "784-300-100-10", &err) == 0);
    int k = dp_powersgd_matrices(&m, 4, mats, DP_POWERSGD_MAX_MATRICES, &p);
    CHECK(k == 3 && p.matrices == 3 && p.compressed == 3);
    CHECK(mats[0].off == m.layers[0].w_off && mats[0].rows == 300 && mats[0].cols == 784 &&
          mats[0].rank == 4);
    CHECK(mats[2].rows == 10 && mats[2].cols == 100 && mats[2].rank == 4);
    CHECK(p.factor_floats == 4 * (300 + 784) + 4 * (100 + 300) + 4 * (10 + 100));
    CHECK(p.whole_floats == 300 + 100 + 10); /* the biases */
    /* rank 9: 10 x 100 is factored at 9 (1 (10 + 100) each); rank 10 would
     * send 1100 floats for 1000: whole */
    k = dp_powersgd_matrices(&m, 10, mats, DP_POWERSGD_MAX_MATRICES, &p);
    CHECK(k == 2 && p.compressed == 2 && p.whole_floats == 410 + 1000);
    k = dp_powersgd_matrices(&m, 9, mats, DP_POWERSGD_MAX_MATRICES, &p);
    CHECK(k == 3 && mats[2].rank == 9);
    /* the largest rank anything takes: 300 x 784 at 216 (216 * 1084 < 235200) */
    k = dp_powersgd_matrices(&m, 1000, mats, DP_POWERSGD_MAX_MATRICES, &p);
    CHECK(k == 0 && p.max_rank == 216);
    k = dp_powersgd_matrices(&m, 216, mats, DP_POWERSGD_MAX_MATRICES, &p);
    CHECK(k == 1 && mats[0].rank == 216);
    dp_model_free(&m);
    /* conv filters (oc, kh kw c); bn's scale and shift whole */
    REQUIRE(dp_model_describe(&m, "1x28x28-conv5x5x32-bn-relu-maxpool2-10", &err) == 0);
    k = dp_powersgd_matrices(&m, 2, mats, DP_POWERSGD_MAX_MATRICES, &p);
    CHECKF(k == 2 && mats[0].rows == 32 && mats[0].cols == 25, "%d matrices, %d x %d", k,
           mats[0].rows, mats[0].cols);
    CHECK(p.whole_floats == 32 + 32 + 32 + 10); /* conv bias, bn's two, dense bias */
    dp_model_free(&m);
}

/* ---- one replica, against a reference in double ---- */

/* x's r rows (of len) orthonormal: Gram-Schmidt, twice. */
static void orth_d(double *x, int r, int len)
{
    for (int k = 0; k < r; k++) {
        double *v = x + (size_t)k * len;
        for (int pass = 0; pass < 2; pass++)
            for (int j = 0; j < k; j++) {
                double c = 0;
                for (int i = 0; i < len; i++)
                    c += x[(size_t)j * len + i] * v[i];
                for (int i = 0; i < len; i++)
                    v[i] -= c * x[(size_t)j * len + i];
            }
        double n = 0;
        for (int i = 0; i < len; i++)
            n += v[i] * v[i];
        n = sqrt(n);
        for (int i = 0; i < len; i++)
            v[i] = n > 0 ? v[i] / n : 0;
    }
}

/* M' of one step on M (rows x cols) from Q^T (r x cols), in double. */
static void reference(const float *M, const float *Qt0, int rows, int cols, int r, double *out)
{
    double *Q = malloc(sizeof(double) * (size_t)r * cols), *P = malloc(sizeof(double) * (size_t)r * rows);
    REQUIRE(Q && P);
    for (int i = 0; i < r * cols; i++)
        Q[i] = Qt0[i];
    orth_d(Q, r, cols);
    for (int k = 0; k < r; k++)
        for (int i = 0; i < rows; i++) {
            double s = 0;
            for (int j = 0; j < cols; j++)
                s += M[(size_t)i * cols + j] * Q[(size_t)k * cols + j];
            P[(size_t)k * rows + i] = s;
        }
    orth_d(P, r, rows);
    for (int k = 0; k < r; k++)
        for (int j = 0; j < cols; j++) {
            double s = 0;
            for (int i = 0; i < rows; i++)
                s += P[(size_t)k * rows + i] * M[(size_t)i * cols + j];
            Q[(size_t)k * cols + j] = s;
        }
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            double s = 0;
            for (int k = 0; k < r; k++)
                s += P[(size_t)k * rows + i] * Q[(size_t)k * cols + j];
            out[(size_t)i * cols + j] = s;
        }
    free(Q);
    free(P);
}

static double max_abs(const float *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(x[i]));
    return m;
}

/* A matrix of rank `true_rank` (sum of outer products), or full (0). */
static void make_matrix(float *M, int rows, int cols, int true_rank, uint64_t seed)
{
    uint64_t s = seed;
    if (true_rank == 0) {
        for (int i = 0; i < rows * cols; i++)
            M[i] = (float)frand(&s);
        return;
    }
    memset(M, 0, sizeof(float) * (size_t)rows * cols);
    for (int t = 0; t < true_rank; t++) {
        float u[64], v[64];
        for (int i = 0; i < rows; i++)
            u[i] = (float)frand(&s);
        for (int j = 0; j < cols; j++)
            v[j] = (float)frand(&s);
        for (int i = 0; i < rows; i++)
            for (int j = 0; j < cols; j++)
                M[i * cols + j] += u[i] * v[j];
    }
}

static void one_replica(int rows, int cols, int r, int true_rank)
{
    dp_transport *t;
    dp_err err;
    REQUIRE(dp_inproc_open(&t, 1, &err) == 0);
    dp_ring ring;
    int rank0 = 0;
    REQUIRE(dp_ring_init(&ring, t, &rank0, 1, 20, 0, &err) == 0);
    /* a bias before and after the matrix: summed whole */
    size_t off = 3, n = off + (size_t)rows * cols + 5;
    dp_psgd_matrix mat = {off, rows, cols, r};
    dp_powersgd *ps;
    REQUIRE(dp_powersgd_open(&ps, n, &mat, 1, 42, &err) == 0);
    {   /* a skipped range inside the matrix, out of order or past n: refused */
        size_t lo[2] = {0, off + 1}, hi[2] = {2, off + 2}, lo2[2] = {1, 0}, hi2[2] = {2, 1},
               end = n + 1;
        CHECK(dp_powersgd_skip(ps, lo, hi, 2) < 0 && dp_powersgd_skip(ps, lo2, hi2, 2) < 0 &&
              dp_powersgd_skip(ps, lo, &end, 1) < 0 && dp_powersgd_skip(ps, lo, hi, 1) == 0 &&
              dp_powersgd_skip(ps, lo, hi, 0) == 0);
    }
    float *M = malloc(sizeof(float) * (size_t)rows * cols), *g = malloc(sizeof(float) * n),
          *Q0 = malloc(sizeof(float) * (size_t)r * cols), *in = malloc(sizeof(float) * n);
    double *want = malloc(sizeof(double) * (size_t)rows * cols);
    REQUIRE(M && g && Q0 && want && in);
    make_matrix(M, rows, cols, true_rank, 0x1234u + (uint64_t)rows * 77 + (uint64_t)r);
    double scale = max_abs(M, (size_t)rows * cols);
    const float *e = dp_powersgd_residual(ps);
    for (int step = 1; step <= 3; step++) {
        for (size_t i = 0; i < n; i++)
            g[i] = i < off || i >= off + (size_t)rows * cols ? (float)i : M[i - off];
        /* the step's M: this gradient plus the residual */
        for (size_t i = 0; i < n; i++)
            in[i] = g[i] + e[i];
        memcpy(Q0, dp_powersgd_q(ps), sizeof(float) * (size_t)r * cols);
        reference(in + off, Q0, rows, cols, r, want);
        REQUIRE(dp_powersgd_reduce(ps, &ring, g, 1.0f, (uint64_t)step, &err) == 0);
        double worst = 0, fb = 0, whole = 0, exact = 0;
        for (size_t i = 0; i < (size_t)rows * cols; i++) {
            worst = fmax(worst, fabs(g[off + i] - want[i]));
            fb = fmax(fb, fabs((double)g[off + i] + e[off + i] - in[off + i]));
            exact = fmax(exact, fabs(g[off + i] - M[i]));
        }
        for (size_t i = 0; i < n; i++)
            if (i < off || i >= off + (size_t)rows * cols)
                whole = fmax(whole, fabs(g[i] - (float)i) + fabs(e[i]));
        CHECKF(worst <= 1e-4 * scale, "%dx%d rank %d (M of rank %d) step %d: %g off the reference",
               rows, cols, r, true_rank, step, worst);
        CHECKF(fb <= 1e-5 * scale, "%dx%d rank %d step %d: M' + residual off M by %g", rows, cols,
               r, step, fb);
        CHECKF(whole == 0, "%dx%d: the bias not summed whole (%g)", rows, cols, whole);
        /* rank r or less: all of it, first step and warm-started */
        CHECKF(true_rank == 0 || true_rank > r || exact <= 1e-5 * scale,
               "%dx%d rank %d, M of rank %d, step %d: M' off M by %g", rows, cols, r, true_rank,
               step, exact);
    }
    /* Error feedback on one M, repeated: what went out plus what is left
     * is everything that came in. */
    if (true_rank == 0) {
        double *sent = calloc((size_t)rows * cols, sizeof(double));
        REQUIRE(sent);
        memset(dp_powersgd_residual(ps), 0, sizeof(float) * n);
        int T = 20;
        for (int step = 1; step <= T; step++) {
            for (size_t i = 0; i < n; i++)
                g[i] = i < off || i >= off + (size_t)rows * cols ? 0.0f : M[i - off];
            REQUIRE(dp_powersgd_reduce(ps, &ring, g, 1.0f, (uint64_t)step, &err) == 0);
            for (size_t i = 0; i < (size_t)rows * cols; i++)
                sent[i] += g[off + i];
        }
        double worst = 0, lag = 0;
        for (size_t i = 0; i < (size_t)rows * cols; i++) {
            worst = fmax(worst, fabs(sent[i] + e[off + i] - T * (double)M[i]));
            lag = fmax(lag, fabs(e[off + i]));
        }
        CHECKF(worst <= 1e-4 * T * scale, "%dx%d rank %d: sent + residual off %d M by %g", rows,
               cols, r, T, worst);
        /* and the residual stays bounded: it does not grow with T */
        CHECKF(lag <= 4 * scale * sqrt((double)rows * cols), "%dx%d rank %d: residual %g", rows,
               cols, r, lag);
        free(sent);
    }
    /* One replica alone: the weighted gradient plus the residual, exactly,
     * and the residual spent. */
    float *res = dp_powersgd_residual(ps);
    for (size_t i = 0; i < n; i++) {
        g[i] = (float)i;
        in[i] = res[i];
    }
    dp_powersgd_exact(ps, g, 0.5f);
    int exact_ok = 1;
    for (size_t i = 0; i < n; i++)
        exact_ok &= g[i] == (float)i * 0.5f + in[i] && res[i] == 0;
    CHECKF(exact_ok, "%dx%d: one replica's exact sum is off", rows, cols);
    free(M), free(g), free(Q0), free(want), free(in);
    dp_powersgd_close(ps);
    dp_ring_free(&ring);
    dp_transport_close(t);
}

/* ---- replicas on the in-process ring ---- */

#define N 3
#define ROWS 8  /* outputs: W is ROWS x DIM */
#define DIM 12
#define SAMPLES 40 /* per replica */
#define SKIP_LO 738 /* replicas(): a range left alone, in the last whole span */
#define SKIP_HI 743

typedef struct rep {
    dp_transport *t;
    const int *order;
    int mode; /* 0: one step of the layout below; 1: gradient descent */
    int compress;
    int no_feedback; /* the residual zeroed after every step, for contrast */
    /* one step */
    size_t n;
    const dp_psgd_matrix *mats;
    int k;
    float *g;
    float *resid; /* a copy of the residual after the step */
    float *q;     /* and of the warm start */
    size_t q_floats;
    uint64_t bytes;
    size_t first, second;
    /* descent: y = W x + b on this replica's samples */
    const float *x, *y;
    float w[ROWS * DIM + ROWS];
    int rc;
    char msg[sizeof(dp_err)];
} rep;

static void grad_of(const rep *p, float *g)
{
    memset(g, 0, sizeof(float) * (ROWS * DIM + ROWS));
    for (int s = 0; s < SAMPLES; s++) {
        const float *x = p->x + s * DIM;
        for (int o = 0; o < ROWS; o++) {
            float e = p->w[ROWS * DIM + o] - p->y[s * ROWS + o];
            for (int j = 0; j < DIM; j++)
                e += p->w[o * DIM + j] * x[j];
            for (int j = 0; j < DIM; j++)
                g[o * DIM + j] += e * x[j] / SAMPLES;
            g[ROWS * DIM + o] += e / SAMPLES;
        }
    }
}

static void *run_rep(void *arg)
{
    rep *p = arg;
    dp_ring r;
    dp_err err;
    dp_powersgd *ps = NULL;
    if (dp_ring_init(&r, p->t, p->order, N, 20, 64, &err) < 0)
        goto fail;
    dp_ring_set_algo(&r, DP_ALGO_RING);
    if (p->compress && dp_powersgd_open(&ps, p->n, p->mats, p->k, 7, &err) < 0)
        goto fail;
    if (p->mode == 0) {
        /* a sparse table's range, by its rows elsewhere: left alone */
        const size_t lo = SKIP_LO, hi = SKIP_HI;
        if (dp_powersgd_skip(ps, &lo, &hi, 1) < 0) {
            snprintf(err.msg, sizeof err.msg, "the skipped range is refused");
            goto fail;
        }
        if (dp_powersgd_reduce(ps, &r, p->g, 0.5f, 1, &err) < 0)
            goto fail;
        memcpy(p->resid, dp_powersgd_residual(ps), p->n * sizeof(float));
        dp_powersgd_floats(ps, &p->first, &p->second);
        p->q_floats = p->second;
        memcpy(p->q, dp_powersgd_q(ps), p->q_floats * sizeof(float));
        p->bytes = r.bytes_sent;
    } else {
        memset(p->w, 0, sizeof p->w);
        float g[ROWS * DIM + ROWS];
        for (int step = 1; step <= 600; step++) {
            grad_of(p, g);
            int rc = ps ? dp_powersgd_reduce(ps, &r, g, 1.0f / N, (uint64_t)step, &err)
                        : dp_ring_allreduce(&r, g, ROWS * DIM + ROWS, (uint64_t)step, 0, &err);
            if (rc < 0)
                goto fail;
            if (ps && p->no_feedback)
                memset(dp_powersgd_residual(ps), 0, sizeof g);
            if (!ps)
                for (int i = 0; i < ROWS * DIM + ROWS; i++)
                    g[i] /= N;
            float lr = step <= 300 ? 0.2f : step <= 450 ? 0.05f : 0.0125f;
            for (int i = 0; i < ROWS * DIM + ROWS; i++)
                p->w[i] -= lr * g[i];
        }
        p->bytes = r.bytes_sent;
    }
    dp_powersgd_close(ps);
    dp_ring_free(&r);
    return NULL;
fail:
    p->rc = -1;
    snprintf(p->msg, sizeof p->msg, "%s", err.msg);
    dp_powersgd_close(ps);
    dp_ring_free(&r);
    return NULL;
}

static void run_reps(rep *reps)
{
    dp_transport *ts[N];
    dp_err err;
    REQUIRE(dp_inproc_open(ts, N, &err) == 0);
    static const int order[N] = {2, 0, 1};
    pthread_t th[N];
    for (int p = 0; p < N; p++) {
        reps[p].t = ts[order[p]];
        reps[p].order = order;
        REQUIRE(pthread_create(&th[p], NULL, run_rep, &reps[p]) == 0);
    }
    for (int p = 0; p < N; p++) {
        pthread_join(th[p], NULL);
        CHECKF(reps[p].rc == 0, "replica %d: %s", p, reps[p].msg);
    }
    for (int p = 0; p < N; p++)
        dp_transport_close(ts[p]);
}

static void replicas(void)
{
    /* [7 whole][20 x 12 at rank 2][9 whole][16 x 30 at rank 3][11 whole] */
    const dp_psgd_matrix mats[2] = {{7, 20, 12, 2}, {7 + 240 + 9, 16, 30, 3}};
    const size_t n = 7 + 240 + 9 + 480 + 11;
    rep reps[N];
    memset(reps, 0, sizeof reps);
    float *in[N];
    for (int p = 0; p < N; p++) {
        REQUIRE((in[p] = malloc(n * sizeof(float))) && (reps[p].g = malloc(n * sizeof(float))) &&
                (reps[p].resid = malloc(n * sizeof(float))) &&
                (reps[p].q = malloc(n * sizeof(float))));
        uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(p + 1);
        for (size_t i = 0; i < n; i++) {
            int in_mat = (i >= 7 && i < 247) || (i >= 256 && i < 736);
            /* whole parts: small integers, so their sum is exact in any order */
            in[p][i] = in_mat ? (float)frand(&s) : (float)((int)((i * 7 + (size_t)p * 13) % 21) - 10);
            reps[p].g[i] = in[p][i];
        }
        reps[p].n = n;
        reps[p].mats = mats;
        reps[p].k = 2;
        reps[p].compress = 1;
    }
    run_reps(reps);
    int same = 1, same_q = 1, left = 1;
    for (int p = 0; p < N; p++)
        for (size_t i = SKIP_LO; i < SKIP_HI; i++)
            left &= reps[p].g[i] == in[p][i] && reps[p].resid[i] == 0;
    CHECKF(left, "the skipped range was touched");
    for (int p = 1; p < N; p++) {
        same &= memcmp(reps[p].g, reps[0].g, SKIP_LO * sizeof(float)) == 0 &&
                memcmp(reps[p].g + SKIP_HI, reps[0].g + SKIP_HI, (n - SKIP_HI) * sizeof(float)) == 0;
        same_q &= memcmp(reps[p].q, reps[0].q, reps[0].q_floats * sizeof(float)) == 0;
    }
    CHECKF(same, "the replicas' gradients differ after the step");
    CHECKF(same_q, "the replicas' warm starts differ after the step");
    double whole = 0, total = 0, worst = 0;
    for (size_t i = 0; i < n; i++) {
        int in_mat = (i >= 7 && i < 247) || (i >= 256 && i < 736);
        double sum = 0, have = reps[0].g[i];
        for (int p = 0; p < N; p++)
            sum += 0.5 * in[p][i], have += reps[p].resid[i];
        if (i >= SKIP_LO && i < SKIP_HI)
            continue;
        if (!in_mat)
            whole = fmax(whole, fabs(reps[0].g[i] - sum));
        else
            worst = fmax(worst, fabs(have - sum)), total = fmax(total, fabs(sum));
    }
    CHECKF(whole == 0, "the whole parts are not summed exactly (%g)", whole);
    CHECKF(worst <= 1e-5 * total, "M' + the residuals off the sum of the M's by %g", worst);
    /* The bytes: the ring moves 2 (n-1) of each all-reduce's floats in all;
     * here 2 (20 + 12) + 3 (16 + 30) factors and 22 whole (27 less the 5
     * skipped), not 747 */
    size_t factors = 2 * (20 + 12) + 3 * (16 + 30), whole_f = 7 + 9 + 11 - (SKIP_HI - SKIP_LO);
    CHECK(reps[0].first == 2 * 20 + 3 * 16 + whole_f && reps[0].second == 2 * 12 + 3 * 30);
    uint64_t bytes = 0;
    for (int p = 0; p < N; p++)
        bytes += reps[p].bytes;
    CHECKF(bytes == 2 * (N - 1) * 4 * (factors + whole_f),
           "the replicas sent %llu bytes, planned %zu", (unsigned long long)bytes,
           2 * (N - 1) * 4 * (factors + whole_f));
    printf("one step of %zu floats (2 matrices): %llu bytes over the ring in all, %zu "
           "uncompressed\n",
           n, (unsigned long long)bytes, (size_t)(2 * (N - 1) * 4 * n));
    for (int p = 0; p < N; p++)
        free(in[p]), free(reps[p].g), free(reps[p].resid), free(reps[p].q);
}

static double loss_of(const float *x, const float *y, const float *w)
{
    double l = 0;
    for (int s = 0; s < SAMPLES * N; s++)
        for (int o = 0; o < ROWS; o++) {
            double e = w[ROWS * DIM + o] - y[s * ROWS + o];
            for (int j = 0; j < DIM; j++)
                e += (double)w[o * DIM + j] * x[s * DIM + j];
            l += e * e / (2.0 * SAMPLES * N);
        }
    return l;
}

static void convergence(void)
{
    static float x[SAMPLES * N * DIM], y[SAMPLES * N * ROWS];
    uint64_t s = 0x243f6a8885a308d3ull;
    float W[ROWS * DIM];
    for (int i = 0; i < ROWS * DIM; i++)
        W[i] = (float)frand(&s);
    for (int i = 0; i < SAMPLES * N * DIM; i++)
        x[i] = (float)frand(&s);
    for (int t = 0; t < SAMPLES * N; t++)
        for (int o = 0; o < ROWS; o++) {
            double v = 0.3 * o;
            for (int j = 0; j < DIM; j++)
                v += W[o * DIM + j] * x[t * DIM + j];
            y[t * ROWS + o] = (float)(v + 0.1 * frand(&s));
        }
    const dp_psgd_matrix mats[1] = {{0, ROWS, DIM, 2}};
    double base = 0, start = 0, with_feedback = 0;
    uint64_t bytes[3] = {0, 0, 0};
    for (int c = 0; c < 3; c++) {
        rep reps[N];
        memset(reps, 0, sizeof reps);
        for (int p = 0; p < N; p++) {
            reps[p].mode = 1;
            reps[p].compress = c > 0;
            reps[p].no_feedback = c == 2;
            reps[p].n = ROWS * DIM + ROWS;
            reps[p].mats = mats;
            reps[p].k = 1;
            reps[p].x = x + (size_t)p * SAMPLES * DIM;
            reps[p].y = y + (size_t)p * SAMPLES * ROWS;
        }
        run_reps(reps);
        int same = 1;
        for (int p = 1; p < N; p++)
            same &= memcmp(reps[p].w, reps[0].w, sizeof reps[0].w) == 0;
        const char *name = c == 0 ? "none" : c == 1 ? "powersgd rank 2" : "powersgd rank 2 without feedback";
        CHECKF(same, "%s: replicas differ", name);
        for (int p = 0; p < N; p++)
            bytes[c] += reps[p].bytes;
        double l = loss_of(x, y, reps[0].w);
        if (c == 0) {
            float zero[ROWS * DIM + ROWS] = {0};
            base = l;
            start = loss_of(x, y, zero);
        }
        printf("%s: loss %.6f (uncompressed %.6f, at w = 0 %.6f), %llu bytes\n", name, l, base,
               start, (unsigned long long)bytes[c]);
        /* W is of full rank 8, sent 2 directions a step: the residual
         * carries the rest into the next steps, so the compressed descent
         * ends at the same minimum; the lag left by the last steps at a
         * small rate is well under 1 % of the loss there. */
        CHECKF(c != 1 || fabs(l - base) <= 0.01 * base, "powersgd: loss %.6f, uncompressed %.6f",
               l, base);
        if (c == 1)
            with_feedback = l;
        /* Without it, what the factors miss each step is lost.  Only a
         * little on this problem: its gradient is the same every step but
         * for w, so the warm-started factors follow its largest directions
         * as they shrink one after another, and the last steps' rate is
         * small. */
        CHECKF(c != 2 || l > with_feedback, "powersgd without feedback: loss %.6f, with %.6f", l,
               with_feedback);
    }
    CHECK(base < 0.1 * start);
    /* (12 + 8) 2 + 8 floats against 104 a step */
    CHECKF(bytes[1] * 104 == bytes[0] * 48, "bytes: powersgd %llu, none %llu",
           (unsigned long long)bytes[1], (unsigned long long)bytes[0]);
}

/* ---- the program ---- */

static char err[65536];

static void refusals(void)
{
    const char *bin = test_bin();
    if (!bin || !test_tmp())
        return;
    static const struct {
        const char *args, *says;
    } bad[] = {
        {"--strategy allreduce --compress powersgd:0", "whole number from 1 to 1024"},
        {"--strategy allreduce --compress powersgd:abc", "whole number from 1 to 1024"},
        {"--strategy allreduce --compress powersgd:4.5", "whole number from 1 to 1024"},
        {"--strategy allreduce --compress powersgd", "whole number from 1 to 1024"},
        {"--strategy allreduce --compress powersgd:300 --model 784-300-100-10",
         "the largest rank that makes one smaller is 216"},
        {"--strategy allreduce --compress powersgd:2 --overlap on", "leave out --overlap on"},
        {"--strategy allreduce --compress powersgd:2 --device sim", "not with --device"},
        {"--strategy ps-sync --compress powersgd:2", "a server cannot sum them"},
        {"--strategy ps-async --compress powersgd:2", "a server cannot sum them"},
        {"--strategy pipeline --compress powersgd:2", "strategy pipeline does not compress"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = run_cmd(err, sizeof err, "%s train %s", bin, bad[i].args);
        CHECKF(rc == 2 && strstr(err, bad[i].says), "train %s: exit %d: %s", bad[i].args, rc,
               err);
    }
    /* Resuming is no longer refused (tests/test_resume_compress.c resumes
     * it bit for bit); from an empty directory it starts afresh. */
}

static void end_to_end(void)
{
    char probe[1200];
    if (!test_bin() || !test_tmp())
        return;
    if (!have_mnist(probe, sizeof probe)) {
        fprintf(stderr, "skipping the end-to-end part: no MNIST at %s\n", probe);
        return;
    }
    const char *common = "--model 784-300-100-10 --train-size 2560 --val-size 500 --test-size 500 "
                         "--epochs 1 --batch 64 --optimizer sgd --lr 0.1 --threads 1 "
                         "--no-progress --log-every 0 --allreduce-algo ring --overlap off";
    const char *kinds[2] = {"none", "powersgd:4"};
    double bytes[2], loss[2];
    for (int c = 0; c < 2; c++) {
        int rc = run_cmd(err, sizeof err,
                         "%s launch --workers 2 -- train --strategy allreduce --compress %s %s "
                         "--metrics %s/e2e%d.jsonl",
                         test_bin(), kinds[c], common, test_tmp(), c);
        CHECKF(rc == 0, "%s exited %d: %s", kinds[c], rc, err);
        if (rc != 0)
            return;
        char path[1200];
        snprintf(path, sizeof path, "%s/e2e%d.jsonl", test_tmp(), c);
        long v[3] = {0, 0, 0};
        for_each_event(path, "replica", NULL, tally_replica, v);
        CHECKF(v[0] == 2 && v[2] == 0, "%s: %ld replica checksums, %s", kinds[c], v[0],
               v[2] ? "not all equal" : "all equal");
        cJSON *ev = last_event(path, "replica", "worker:0");
        cJSON *ep = last_event(path, "epoch", "worker:0");
        REQUIRE(ev && ep);
        double steps = json_num(ev, "steps");
        bytes[c] = json_num(ev, "ring_bytes") / steps;
        loss[c] = json_num(ep, "val_loss");
        CHECK(strcmp(json_str(ev, "compress"), c ? "powersgd" : "none") == 0);
        CHECK(!c || json_num(ev, "compressed_buckets") == 2 * steps);
        cJSON_Delete(ev);
        cJSON_Delete(ep);
        printf("784-300-100-10, 2 replicas, %s: %.0f ring bytes a step, val loss %.4f\n",
               kinds[c], bytes[c], loss[c]);
    }
    /* Two replicas on the ring: each sends what it sums once.  Uncompressed
     * 266610 floats; at rank 4 the factors 4 (300 + 784 + 100 + 300 + 10 +
     * 100) = 6376 and the biases 410. */
    CHECKF(bytes[0] == 4.0 * 266610, "none: %.0f bytes a step", bytes[0]);
    CHECKF(bytes[1] == 4.0 * (6376 + 410), "powersgd:4: %.0f bytes a step", bytes[1]);
    /* one epoch of 20 steps: rank 4 with error feedback trails the exact sum
     * by a little; 10 % covers it (none's is about 0.6) */
    CHECKF(loss[1] < 1.1 * loss[0], "powersgd:4's val loss %.4f, none's %.4f", loss[1], loss[0]);
}

int main(void)
{
    plan();
    one_replica(8, 6, 1, 1);  /* rank 1 of a rank-1 matrix */
    one_replica(8, 6, 2, 2);  /* rank 2 of a rank-2 matrix */
    one_replica(5, 9, 2, 1);  /* more rank than the matrix: still M */
    one_replica(12, 20, 3, 0); /* a full matrix: the reference, and feedback */
    one_replica(30, 7, 2, 0);
    replicas();
    convergence();
    refusals();
    end_to_end();
    return CHECK_DONE();
}
