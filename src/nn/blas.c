/* The only file that calls CBLAS (OpenBLAS).  Everything else multiplies
 * matrices through dp_sgemm. */
#include "downpour/blas.h"

#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

void dp_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
              const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc)
{
    if (m <= 0 || n <= 0)
        return;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c,
                ldc);
}

void dp_blas_set_threads(int n) { openblas_set_num_threads(n < 1 ? 1 : n); }

int dp_blas_threads(void) { return openblas_get_num_threads(); }

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
    pthread_once(&blas_info_once, blas_info_build);
    return blas_info;
}
