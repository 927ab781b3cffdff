/* The only file that calls CBLAS (OpenBLAS).  Everything else multiplies
 * matrices through dp_sgemm. */
#include "downpour/blas.h"

#include <cblas.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/pool.h"

/* Products smaller than this many multiply-adds run on the calling thread:
 * waking the pool costs more than the product.  Column blocks of C are
 * multiples of DP_GEMM_ALIGN columns (64-byte lines; row-major C is column-
 * major C^T to OpenBLAS, whose SkylakeX kernel tiles 16 of its M = our
 * columns), row blocks multiples of DP_GEMM_ROW_ALIGN rows (its N tile of 4):
 * 300 rows split 152/148, not 144/156 (tile_range).
 * C is split along its larger dimension, so each thread reads half of the
 * bigger operand, except products with op(A) = A^T (the weight gradients
 * dout^T inp), split by rows: 300x784x128 took 211 us in row blocks vs 253 in
 * column blocks (mlp-300-100, batch 128, OpenBLAS 0.3.21 SkylakeX, 2 threads;
 * OpenBLAS's own 2 threads: 291, 1 thread: 404). */
#define DP_GEMM_MIN_SPLIT (48 * 1024)
#define DP_GEMM_ALIGN 16
#define DP_GEMM_ROW_ALIGN 4

static dp_gemm_log *_Atomic gemm_log; /* dp_blas_log: benchmarks only */
static int native_mode; /* dp_blas_set_native_threads: OpenBLAS threads, pool off */
static pthread_once_t default_once = PTHREAD_ONCE_INIT;

/* OpenBLAS built for every x86 core (DYNAMIC_ARCH, as Debian's) picks its
 * kernels from the CPU's family and model, and a model newer than the
 * library (0.3.21 does not know Emerald Rapids, model 207) falls back to
 * Prescott's SSE3 kernels: 20 GFLOPS where the CPU's AVX-512 kernels give
 * 70-100 on one core (a 1024^3 product; docs/architecture.md, "BLAS").  So
 * when OpenBLAS fell back and OPENBLAS_CORETYPE does not say otherwise, its
 * kernels are chosen again from the instruction sets the CPU has, through
 * OpenBLAS's own re-initialisation (weak: absent in another BLAS, nothing is
 * done).  Runs once, before the first product. */
extern void gotoblas_dynamic_init(void) __attribute__((weak));
extern void gotoblas_dynamic_quit(void) __attribute__((weak));

static const char *kernels_for_cpu(void)
{
#if !defined(__x86_64__)
    return NULL;
#else
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        return __builtin_cpu_supports("avx512bf16") ? "Cooperlake" : "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return "Haswell";
    return NULL;
#endif
}

static void fix_kernels(void)
{
    const char *core = openblas_get_corename();
    const char *want = kernels_for_cpu();
    if (!gotoblas_dynamic_init || !gotoblas_dynamic_quit || getenv("OPENBLAS_CORETYPE") ||
        !core || strcmp(core, "Prescott") != 0 || !want)
        return;
    setenv("OPENBLAS_CORETYPE", want, 0);
    gotoblas_dynamic_quit();
    gotoblas_dynamic_init();
    unsetenv("OPENBLAS_CORETYPE");
}

/* Until dp_blas_set_threads: the pool takes OpenBLAS's default thread count
 * and OpenBLAS itself goes single-threaded. */
static void default_threads(void)
{
    fix_kernels();
    int n = openblas_get_num_threads();
    openblas_set_num_threads(1);
    dp_pool_set_threads(n, NULL);
}

typedef struct gemm_job {
    bool ta, tb;
    int m, n, k;
    float alpha, beta;
    const float *a, *b;
    float *c;
    int lda, ldb, ldc;
    bool split_rows;
    dp_gemm_epilogue ep;
    void *ep_ctx;
} gemm_job;

static void gemm_block(const gemm_job *j, int r0, int r1, int c0, int c1)
{
    if (r1 <= r0 || c1 <= c0)
        return;
    /* Row r of op(A) starts at a + r*lda (no trans) or a + r (trans);
     * column c of op(B) at b + c (no trans) or b + c*ldb (trans). */
    const float *a = j->a + (j->ta ? (size_t)r0 : (size_t)r0 * j->lda);
    const float *b = j->b + (j->tb ? (size_t)c0 * j->ldb : (size_t)c0);
    float *c = j->c + (size_t)r0 * j->ldc + c0;
    cblas_sgemm(CblasRowMajor, j->ta ? CblasTrans : CblasNoTrans,
                j->tb ? CblasTrans : CblasNoTrans, r1 - r0, c1 - c0, j->k, j->alpha, a, j->lda,
                b, j->ldb, j->beta, c, j->ldc);
    if (j->ep)
        j->ep(j->ep_ctx, j->c, j->ldc, r0, r1, c0, c1);
}

/* Thread i's share of `total` rows or columns counted in the kernel's tiles
 * of `tile`, the last one possibly partial: thread i takes tiles
 * [ceil(i T / n), ceil((i+1) T / n)), so a partial tile goes to a thread with
 * fewer whole ones.  300 columns in 19 tiles of 16 split 160/140 (10 tiles and
 * 9), not 144/156 (9 and 10 with the partial): mlp-300-100's first product,
 * 128x300x784, took 397-482 us against 461-583 us (2 threads, OpenBLAS 0.3.21
 * Zen kernel, best of 15). */
static void tile_range(int total, int tile, int i, int n, int *lo, int *hi)
{
    long long tiles = (total + tile - 1) / tile;
    long long a = (tiles * i + n - 1) / n * tile, b = (tiles * (i + 1) + n - 1) / n * tile;
    *lo = a < total ? (int)a : total;
    *hi = b < total ? (int)b : total;
}

static void gemm_task(void *ctx, int i, int n)
{
    const gemm_job *j = ctx;
    int lo, hi;
    if (j->split_rows) {
        tile_range(j->m, DP_GEMM_ROW_ALIGN, i, n, &lo, &hi);
        gemm_block(j, lo, hi, 0, j->n);
    } else {
        tile_range(j->n, DP_GEMM_ALIGN, i, n, &lo, &hi);
        gemm_block(j, 0, j->m, lo, hi);
    }
}

void dp_sgemm_ep(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a,
                 int lda, const float *b, int ldb, float beta, float *c, int ldc,
                 dp_gemm_epilogue ep, void *ep_ctx)
{
    if (m <= 0 || n <= 0)
        return;
    dp_blas_note(trans_a, trans_b, m, n, k, lda, ldb, ldc, beta);
    pthread_once(&default_once, default_threads);
    gemm_job j = {trans_a, trans_b, m, n, k, alpha, beta, a, b, c, lda, ldb, ldc,
                  m >= n || (trans_a && m >= 2 * DP_GEMM_ALIGN), ep,
                  ep_ctx};
    if (dp_pool_threads() == 1 || (double)m * n * k < DP_GEMM_MIN_SPLIT ||
        (m < 2 * DP_GEMM_ALIGN && n < 2 * DP_GEMM_ALIGN))
        gemm_block(&j, 0, m, 0, n);
    else
        dp_pool_run(gemm_task, &j);
}

void dp_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
              const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc)
{
    dp_sgemm_ep(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, NULL, NULL);
}

void dp_blas_log(dp_gemm_log *log) { atomic_store(&gemm_log, log); }

void dp_blas_note(bool trans_a, bool trans_b, int m, int n, int k, int lda, int ldb, int ldc,
                  float beta)
{
    dp_gemm_log *log = atomic_load_explicit(&gemm_log, memory_order_relaxed);
    if (log && m > 0 && n > 0) {
        size_t i = atomic_fetch_add(&log->n, 1);
        if (i < log->cap)
            log->shapes[i] = (dp_gemm_shape){trans_a, trans_b, dp_pool_in_task(), m, n, k,
                                             lda, ldb, ldc, beta};
    }
}

void dp_blas_set_threads(int n)
{
    pthread_once(&default_once, default_threads);
    native_mode = 0;
    openblas_set_num_threads(1);
    dp_pool_set_threads(n < 1 ? 1 : n, NULL);
}

void dp_blas_set_native_threads(int n)
{
    pthread_once(&default_once, default_threads);
    native_mode = 1;
    dp_pool_set_threads(1, NULL);
    openblas_set_num_threads(n < 1 ? 1 : n);
}

void dp_blas_ready(void)
{
    pthread_once(&default_once, default_threads);
}

int dp_blas_threads(void)
{
    pthread_once(&default_once, default_threads);
    return native_mode ? openblas_get_num_threads() : dp_pool_threads();
}

static char blas_info[128];
static pthread_once_t blas_info_once = PTHREAD_ONCE_INIT;

static void blas_info_build(void)
{
    /* openblas_get_config() starts "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ...":
     * keep the first two words (name and version). */
    const char *cfg = openblas_get_config();
    const char *core = openblas_get_corename();
    char version[48] = "OpenBLAS";
    if (cfg) {
        const char *sp = strchr(cfg, ' ');
        if (sp)
            sp = strchr(sp + 1, ' ');
        size_t len = sp ? (size_t)(sp - cfg) : strlen(cfg);
        if (len >= sizeof version)
            len = sizeof version - 1;
        memcpy(version, cfg, len);
        version[len] = '\0';
    }
    const char *par;
    switch (openblas_get_parallel()) {
    case 0: par = "sequential"; break;
    case 1: par = "pthread"; break;
    case 2: par = "openmp"; break;
    default: par = "unknown threading"; break;
    }
    snprintf(blas_info, sizeof blas_info, "%s (%s, %s)", version, core ? core : "unknown core",
             par);
}

const char *dp_blas_info(void)
{
    pthread_once(&default_once, default_threads); /* the kernels it names are final */
    pthread_once(&blas_info_once, blas_info_build);
    return blas_info;
}

/* BLAS takes an int length: longer vectors go in pieces.  Every call
 * first waits for default_threads: its kernel re-initialisation
 * (fix_kernels) leaves OpenBLAS's kernel table empty for a moment, and a
 * first dot product on another thread read it there (a SEGV in
 * cblas_dsdot, four in-process replicas under ASan). */
#define DP_BLAS1_CHUNK ((size_t)1 << 30)

double dp_dot(const float *x, const float *y, size_t n)
{
    pthread_once(&default_once, default_threads);
    double sum = 0;
    for (size_t lo = 0; lo < n; lo += DP_BLAS1_CHUNK) {
        size_t len = n - lo < DP_BLAS1_CHUNK ? n - lo : DP_BLAS1_CHUNK;
        sum += cblas_dsdot((int)len, x + lo, 1, y + lo, 1);
    }
    return sum;
}

void dp_axpy(float *y, float alpha, const float *x, size_t n)
{
    pthread_once(&default_once, default_threads);
    for (size_t lo = 0; lo < n; lo += DP_BLAS1_CHUNK) {
        size_t len = n - lo < DP_BLAS1_CHUNK ? n - lo : DP_BLAS1_CHUNK;
        cblas_saxpy((int)len, alpha, x + lo, 1, y + lo, 1);
    }
}

void dp_scal(float *x, float alpha, size_t n)
{
    pthread_once(&default_once, default_threads);
    for (size_t lo = 0; lo < n; lo += DP_BLAS1_CHUNK) {
        size_t len = n - lo < DP_BLAS1_CHUNK ? n - lo : DP_BLAS1_CHUNK;
        cblas_sscal((int)len, alpha, x + lo, 1);
    }
}
