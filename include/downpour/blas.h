/* The one place that knows the BLAS call.  Row-major single-precision GEMM:
 * C = alpha * op(A) op(B) + beta * C, with op(X) = X or X^T. */
#ifndef DOWNPOUR_BLAS_H
#define DOWNPOUR_BLAS_H

#include <stdbool.h>
#include <stddef.h>

/* C is (m,n); op(A) is (m,k); op(B) is (k,n); lda/ldb/ldc are row strides. */
void dp_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
              const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);

/* The same product; afterwards every thread calls ep(ep_ctx, c, ldc, r0, r1, c0, c1)
 * on the block of C it computed (rows [r0,r1), columns [c0,c1)) while it is
 * still in cache: bias and activation fuse into the product this way. */
typedef void (*dp_gemm_epilogue)(void *ctx, float *c, int ldc, int r0, int r1, int c0, int c1);
void dp_sgemm_ep(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a,
                 int lda, const float *b, int ldb, float beta, float *c, int ldc,
                 dp_gemm_epilogue ep, void *ep_ctx);

/* Level-1 vector operations over n floats (L-BFGS's vector ops, lbfgs.h):
 * the dot product accumulated in double (cblas_dsdot), y += alpha x, x *= alpha.
 * They run on the calling thread: a vector of 266k floats is a few tens of us. */
double dp_dot(const float *x, const float *y, size_t n);
void dp_axpy(float *y, float alpha, const float *x, size_t n);
void dp_scal(float *x, float alpha, size_t n);

/* Threads of the process's arithmetic pool (pool.h; docs/architecture.md, "Threads").  BLAS
 * itself always runs single-threaded: dp_sgemm splits each product over the
 * pool, each thread multiplying its block of C.  n = 1 starts no thread.
 * Until this is called the pool takes OpenBLAS's own default (OPENBLAS_NUM_THREADS
 * or all cores) at the first product. */
void dp_blas_set_threads(int n);
int dp_blas_threads(void);
/* Waits for the one-time set-up every wrapper here does first (OpenBLAS's
 * kernels and threads): code that calls cblas itself calls it before. */
void dp_blas_ready(void);
/* For benchmarks only: our pool off, OpenBLAS's own n threads inside each product. */
void dp_blas_set_native_threads(int n);
/* For benchmarks: the shapes of the products some code runs, so that they
 * can be timed alone (bench/bench_cnn.c's GEMM bound, docs/benchmarks.md).
 * While a log is set, every dp_sgemm and dp_sgemm_ep appends its shape (the
 * first cap of them; n counts them all).  in_task: the call ran inside a pool
 * task (one of many small products the pool's threads ran side by side, as
 * mha's per-head ones).  Set and clear it while no product runs. */
typedef struct dp_gemm_shape {
    bool ta, tb, in_task;
    int m, n, k, lda, ldb, ldc;
    float beta;
} dp_gemm_shape;
typedef struct dp_gemm_log {
    dp_gemm_shape *shapes;
    size_t cap;
    _Atomic size_t n;
} dp_gemm_log;
void dp_blas_log(dp_gemm_log *log); /* NULL: stop logging */
/* Appends a product's shape to the log without running it (nothing when no
 * log is set): a direct convolution (src/nn/conv_direct.c) notes the
 * products its lowered form would run, so the bound stays the lowered
 * products' GEMM time whichever path a layer takes. */
void dp_blas_note(bool trans_a, bool trans_b, int m, int n, int k, int lda, int ldb, int ldc,
                  float beta);

/* Name of the BLAS library and its kernel ("OpenBLAS 0.3.21 Haswell"). */
const char *dp_blas_info(void);

#endif
