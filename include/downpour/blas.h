/* The one place that knows the BLAS call.  Row-major single-precision GEMM:
 * C = alpha * op(A) op(B) + beta * C, with op(X) = X or X^T. */
#ifndef DOWNPOUR_BLAS_H
#define DOWNPOUR_BLAS_H

#include <stdbool.h>

/* C is (m,n); op(A) is (m,k); op(B) is (k,n); lda/ldb/ldc are row strides. */
void dp_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
              const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);

/* Threads of the BLAS pool for this process (the only arithmetic pool). */
void dp_blas_set_threads(int n);
int dp_blas_threads(void);
/* Name of the BLAS library and its kernel ("OpenBLAS 0.3.21 Haswell"). */
const char *dp_blas_info(void);

#endif
