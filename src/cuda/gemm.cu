/* Column-major products: cublasSgemm (cublasSgemmStridedBatched when
 * batch > 1) with exactly the dp_gemm fields. */
#include <stdio.h>

#include "cuda/cuda_ctx.h"

static int at_least(int ld, int rows) { return ld >= (rows > 1 ? rows : 1); }

void dp_cuda_gemm(void *ctx, const dp_gemm *g)
{
    dp_cuda *c = (dp_cuda *)ctx;
    if (dp_cuda_enter(c) < 0)
        return;
    char what[96];
    if (g->batch > 1)
        snprintf(what, sizeof what, "gemm %dx%dx%d batch %d", g->m, g->n, g->k, g->batch);
    else
        snprintf(what, sizeof what, "gemm %dx%dx%d", g->m, g->n, g->k);
    if (g->m < 0 || g->n < 0 || g->k < 0) {
        dp_cuda_fail(c, "%s: negative size", what);
        return;
    }
    /* cuBLAS would answer these with a bare CUBLAS_STATUS_INVALID_VALUE. */
    if (g->batch < 0 || (g->batch > 1 && (g->stride_a < 0 || g->stride_b < 0 || g->stride_c < 0))) {
        dp_cuda_fail(c, "gemm %dx%dx%d: batch %d, strides %lld, %lld, %lld: none may be negative",
                     g->m, g->n, g->k, g->batch, g->stride_a, g->stride_b, g->stride_c);
        return;
    }
    if (g->m == 0 || g->n == 0)
        return; /* C is empty */
    /* The stored matrices' rows: A is m x k (k x m when transposed), B is
     * k x n (n x k); cuBLAS would refuse a smaller leading dimension with a
     * bare CUBLAS_STATUS_INVALID_VALUE, so say which one. */
    int a_rows = g->ta ? g->k : g->m, b_rows = g->tb ? g->n : g->k;
    if (!at_least(g->lda, a_rows) || !at_least(g->ldb, b_rows) || !at_least(g->ldc, g->m)) {
        dp_cuda_fail(c, "%s (ta %d, tb %d): leading dimensions lda %d, ldb %d, ldc %d; need at least "
                     "%d, %d, %d (the stored rows of A, B and C)",
                     what, g->ta, g->tb, g->lda, g->ldb, g->ldc, a_rows > 1 ? a_rows : 1,
                     b_rows > 1 ? b_rows : 1, g->m > 1 ? g->m : 1);
        return;
    }
    cublasOperation_t ta = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    /* k == 0: cuBLAS scales C by beta and reads neither A nor B. */
    cublasStatus_t s;
    const char *fn;
    if (g->batch > 1) {
        fn = "cublasSgemmStridedBatched";
        s = cublasSgemmStridedBatched(c->blas, ta, tb, g->m, g->n, g->k, &g->alpha, g->a, g->lda,
                                      g->stride_a, g->b, g->ldb, g->stride_b, &g->beta, g->c,
                                      g->ldc, g->stride_c, g->batch);
    } else {
        fn = "cublasSgemm";
        s = cublasSgemm(c->blas, ta, tb, g->m, g->n, g->k, &g->alpha, g->a, g->lda, g->b, g->ldb,
                        &g->beta, g->c, g->ldc);
    }
    if (s != CUBLAS_STATUS_SUCCESS) {
        (void)cudaGetLastError();
        dp_cuda_fail(c, "%s: %s: %s (%s)", what, fn, cublasGetStatusString(s),
                     cublasGetStatusName(s));
        return;
    }
    dp_cuda_queued(c, what);
}
