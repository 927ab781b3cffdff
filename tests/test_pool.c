/* The arithmetic thread pool: every index runs once per run, for 1..4 threads
 * and many runs in a row (spinning and sleeping workers); ranges tile [0, n);
 * nested and concurrent calls run inline; dp_sgemm split over the pool equals
 * the single-threaded product, including while several threads call it. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "downpour/blas.h"
#include "downpour/pool.h"

#define MAX_IDX 8

typedef struct count_ctx {
    int hits[MAX_IDX];
    int seen_n[MAX_IDX];
    long sum[MAX_IDX];
    const int *data;
    int len;
} count_ctx;

static void count_task(void *ctx, int i, int n)
{
    count_ctx *c = ctx;
    c->hits[i]++;
    c->seen_n[i] = n;
    size_t lo, hi;
    dp_pool_range((size_t)c->len, 16, i, n, &lo, &hi);
    long s = 0;
    for (size_t k = lo; k < hi; k++)
        s += c->data[k];
    c->sum[i] = s;
}

static void nested_task(void *ctx, int i, int n)
{
    (void)n;
    int *inner_n = ctx;
    count_ctx c;
    memset(&c, 0, sizeof c);
    static const int one[1] = {1};
    c.data = one;
    c.len = 1;
    dp_pool_run(count_task, &c); /* must run inline as (0, 1) */
    inner_n[i] = c.seen_n[0] * 10 + c.hits[0];
}

static void test_ranges(void)
{
    for (size_t total = 0; total < 200; total += 7)
        for (int n = 1; n <= 5; n++) {
            size_t prev = 0;
            for (int i = 0; i < n; i++) {
                size_t lo, hi;
                dp_pool_range(total, 16, i, n, &lo, &hi);
                CHECKF(lo == prev && hi >= lo, "total %zu n %d i %d: [%zu,%zu)", total, n, i, lo,
                       hi);
                if (total / (size_t)n >= 16 && i > 0)
                    CHECKF(lo % 16 == 0, "total %zu n %d i %d: lo %zu not aligned", total, n, i,
                           lo);
                prev = hi;
            }
            CHECK(prev == total);
        }
}

static void test_runs(int n)
{
    dp_err err;
    dp_pool *p;
    REQUIRE(dp_pool_new(&p, n, &err) == 0);
    CHECK(dp_pool_size(p) == n);
    enum { LEN = 1000 };
    static int data[LEN];
    long want = 0;
    for (int k = 0; k < LEN; k++) {
        data[k] = k * 3 + 1;
        want += data[k];
    }
    count_ctx c;
    memset(&c, 0, sizeof c);
    c.data = data;
    c.len = LEN;
    const int runs = 3000;
    for (int r = 0; r < runs; r++) {
        dp_pool_exec(p, count_task, &c);
        long s = 0;
        for (int i = 0; i < n; i++)
            s += c.sum[i];
        if (s != want) {
            CHECKF(s == want, "run %d: sum %ld want %ld", r, s, want);
            break;
        }
        if (r == runs / 2) {
            /* let the workers fall asleep on the futex, then wake them */
            struct timespec ts = {0, 5 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    for (int i = 0; i < n; i++) {
        CHECKF(c.hits[i] == runs, "n %d: index %d ran %d times", n, i, c.hits[i]);
        CHECK(c.seen_n[i] == n);
    }
    for (int i = n; i < MAX_IDX; i++)
        CHECK(c.hits[i] == 0);
    dp_pool_free(p);
}

static void test_global_and_nested(void)
{
    for (int n = 1; n <= 4; n++) {
        REQUIRE(dp_pool_set_threads(n, NULL) == 0);
        CHECK(dp_pool_threads() == n);
        int inner[MAX_IDX] = {0};
        dp_pool_run(nested_task, inner);
        for (int i = 0; i < n; i++)
            CHECKF(inner[i] == 11, "n %d index %d: nested run gave %d", n, i, inner[i]);
    }
    REQUIRE(dp_pool_set_threads(1, NULL) == 0);
    CHECK(dp_pool_threads() == 1);
}

/* C = op(A) op(B) for one shape, through the pool vs a plain double loop. */
static double gemm_error(bool ta, bool tb, int m, int n, int k, float beta)
{
    int lda = ta ? m + 3 : k + 1, ldb = tb ? k + 2 : n + 5, ldc = n + 7;
    size_t na = (size_t)(ta ? k : m) * lda, nb = (size_t)(tb ? n : k) * ldb,
           nc = (size_t)m * ldc;
    float *a = malloc(na * sizeof *a), *b = malloc(nb * sizeof *b), *c = malloc(nc * sizeof *c);
    REQUIRE(a && b && c);
    for (size_t i = 0; i < na; i++)
        a[i] = (float)((i * 7919) % 17) / 17.0f - 0.5f;
    for (size_t i = 0; i < nb; i++)
        b[i] = (float)((i * 104729) % 13) / 13.0f - 0.5f;
    for (size_t i = 0; i < nc; i++)
        c[i] = (float)(i % 5);
    dp_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
    double worst = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = beta * (double)(((size_t)i * ldc + j) % 5);
            for (int q = 0; q < k; q++) {
                double x = ta ? a[(size_t)q * lda + i] : a[(size_t)i * lda + q];
                double y = tb ? b[(size_t)j * ldb + q] : b[(size_t)q * ldb + j];
                s += x * y;
            }
            double e = fabs(s - c[(size_t)i * ldc + j]);
            if (e > worst)
                worst = e;
        }
    for (int i = 0; i < m; i++) /* padding beyond n untouched */
        for (int j = n; j < ldc; j++)
            if (c[(size_t)i * ldc + j] != (float)(((size_t)i * ldc + j) % 5))
                worst = 1e30;
    free(a);
    free(b);
    free(c);
    return worst;
}

static void test_gemm_split(void)
{
    static const int shapes[][3] = {{128, 300, 784}, {300, 784, 128}, {128, 784, 300},
                                    {100, 300, 128}, {128, 10, 100},  {37, 53, 61},
                                    {200, 33, 40},   {33, 200, 40}};
    for (int n = 1; n <= 3; n++) {
        dp_blas_set_threads(n);
        CHECK(dp_blas_threads() == n);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int t = 0; t < 4; t++) {
                double e = gemm_error(t & 1, t & 2, shapes[s][0], shapes[s][1], shapes[s][2],
                                      t == 3 ? 0.5f : 0.0f);
                CHECKF(e < 1e-3, "threads %d shape %dx%dx%d trans %d: error %g", n,
                       shapes[s][0], shapes[s][1], shapes[s][2], t, e);
            }
    }
}

/* Several application threads multiply at once while the pool (2 threads) is
 * also in use: OpenBLAS at 1 thread must be safe to call concurrently, and a
 * busy pool must run a second caller's product inline. */
static atomic_int stress_bad;
static void *stress_main(void *arg)
{
    (void)arg;
    for (int r = 0; r < 20; r++)
        if (gemm_error(r & 1, r & 2, 96 + r, 80, 64, 0.0f) > 1e-3)
            atomic_fetch_add(&stress_bad, 1);
    return NULL;
}

static void test_concurrent_gemm(void)
{
    dp_blas_set_threads(2);
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        REQUIRE(pthread_create(&th[i], NULL, stress_main, NULL) == 0);
    stress_main(NULL);
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    CHECK(atomic_load(&stress_bad) == 0);
    dp_blas_set_threads(1);
}

/* dp_blas_log: the shape of every product, and whether it ran inside a
 * pool task (bench_cnn replays them as a step's GEMM bound). */
static void in_task_gemm(void *ctx, int i, int n)
{
    (void)n;
    float *c = ctx;
    static const float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, 0, 1, 1, 1};
    if (i == 0)
        dp_sgemm(false, false, 2, 2, 3, 1.0f, a, 3, b, 2, 0.0f, c, 2);
}

static void test_gemm_log(void)
{
    dp_blas_set_threads(2);
    dp_gemm_shape shapes[4];
    dp_gemm_log log = {.shapes = shapes, .cap = 4};
    static float a[64 * 48], b[48 * 40], c[64 * 40];
    dp_blas_log(&log);
    dp_sgemm(true, false, 64, 40, 48, 1.0f, a, 64, b, 40, 0.5f, c, 40);
    float small[4];
    dp_pool_run(in_task_gemm, small);
    dp_blas_log(NULL);
    dp_sgemm(false, false, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2); /* not logged */
    CHECKF(atomic_load(&log.n) == 2, "%zu products logged, 2 ran", atomic_load(&log.n));
    const dp_gemm_shape *g = &shapes[0];
    CHECK(g->ta && !g->tb && g->m == 64 && g->n == 40 && g->k == 48 && g->lda == 64 &&
          g->ldb == 40 && g->ldc == 40 && g->beta == 0.5f && !g->in_task);
    CHECK(shapes[1].m == 2 && shapes[1].k == 3 && shapes[1].in_task);
    CHECK(small[0] == 4 && small[3] == 11); /* [1 2 3; 4 5 6] [1 0; 0 1; 1 1] */
    dp_blas_set_threads(1);
}

/* A CPU with AVX2 (or AVX-512) gets its own kernels, never OpenBLAS's SSE3
 * fallback for a model it does not know (docs/architecture.md, "BLAS
 * kernels"), unless OPENBLAS_CORETYPE says otherwise. */
static void test_blas_kernels(void)
{
    const char *info = dp_blas_info();
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (!getenv("OPENBLAS_CORETYPE") && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("fma") && strstr(info, "OpenBLAS"))
        CHECKF(!strstr(info, "Prescott"), "BLAS kernels: %s on a CPU with AVX2", info);
#endif
    printf("BLAS: %s\n", info);
}

int main(void)
{
    test_ranges();
    for (int n = 1; n <= 4; n++)
        test_runs(n);
    test_global_and_nested();
    test_gemm_split();
    test_concurrent_gemm();
    test_gemm_log();
    test_blas_kernels();
    return CHECK_DONE();
}
