/* Locally connected layer (untied weights): every output position p has its
 * own (oc, k) filters, so the layer is `positions` small products, one per
 * position, over the rows of dp_im2row that belong to p.  Row (r, p) is at
 * r*positions + p, so position p's rows are a strided matrix with leading
 * dimension positions*k and need no gathering; its outputs likewise with
 * positions*oc.
 *
 * The positions are split over the arithmetic pool in fixed ranges and each
 * dp_sgemm call runs inline on its thread (a product inside a pool task
 * never splits), so every position's numbers are those of one whole product
 * whatever the thread count. */
#include "downpour/layers.h"

#include <stdbool.h>
#include <string.h>

#include "downpour/blas.h"
#include "downpour/pool.h"

typedef struct local_job {
    float *out, *drows, *dw, *db;
    const float *rows, *w, *b, *dout;
    int batch, positions, k, oc, relu, accumulate;
} local_job;

static void forward_task(void *ctx, int i, int n)
{
    const local_job *j = ctx;
    const int P = j->positions, k = j->k, oc = j->oc;
    const size_t ldo = (size_t)P * oc;
    size_t lo, hi;
    dp_pool_range((size_t)P, 1, i, n, &lo, &hi);
    for (size_t p = lo; p < hi; p++) {
        float *out = j->out + p * oc;
        /* out_p (batch, oc) = rows_p (batch, k) . W_p^T */
        dp_sgemm(false, true, j->batch, oc, k, 1.0f, j->rows + p * k, P * k,
                 j->w + p * oc * k, k, 0.0f, out, (int)ldo);
        /* bias and relu while out_p is still in cache */
        const float *restrict b = j->b + p * oc;
        for (int r = 0; r < j->batch; r++) {
            float *restrict o = out + (size_t)r * ldo;
            if (j->relu) {
                for (int q = 0; q < oc; q++) {
                    float v = o[q] + b[q];
                    o[q] = v < 0.0f ? 0.0f : v;
                }
            } else {
                for (int q = 0; q < oc; q++)
                    o[q] += b[q];
            }
        }
    }
}

void dp_local_forward(float *out, const float *rows, const float *w, const float *b, int batch,
                      int positions, int k, int oc, int relu)
{
    if (batch <= 0 || positions <= 0 || oc <= 0)
        return;
    local_job j = {.out = out, .rows = rows, .w = w, .b = b, .batch = batch,
                   .positions = positions, .k = k, .oc = oc, .relu = relu};
    /* Always through the pool, even for small layers: a product called from
     * outside a task could split by itself, and its numbers must not depend
     * on that.  dp_blas_threads first starts the default pool, which the
     * first product of the process would otherwise start mid-loop. */
    (void)dp_blas_threads();
    dp_pool_run(forward_task, &j);
}

static void backward_task(void *ctx, int i, int n)
{
    const local_job *j = ctx;
    const int P = j->positions, k = j->k, oc = j->oc;
    const size_t ldo = (size_t)P * oc;
    size_t lo, hi;
    dp_pool_range((size_t)P, 1, i, n, &lo, &hi);
    for (size_t p = lo; p < hi; p++) {
        const float *dout = j->dout + p * oc;
        /* dw_p (oc, k) = dout_p^T (oc, batch) . rows_p (batch, k) */
        dp_sgemm(true, false, oc, k, j->batch, 1.0f, dout, (int)ldo, j->rows + p * k, P * k,
                 j->accumulate ? 1.0f : 0.0f, j->dw + p * oc * k, k);
        /* db_p = (db_p or 0) + column sums of dout_p, rows in order */
        float *restrict db = j->db + p * oc;
        int r = 0;
        if (!j->accumulate) {
            memcpy(db, dout, (size_t)oc * sizeof *db);
            r = 1;
        }
        for (; r < j->batch; r++) {
            const float *restrict d = dout + (size_t)r * ldo;
            for (int q = 0; q < oc; q++)
                db[q] += d[q];
        }
        /* drows_p (batch, k) = dout_p (batch, oc) . W_p (oc, k) */
        if (j->drows)
            dp_sgemm(false, false, j->batch, k, oc, 1.0f, dout, (int)ldo, j->w + p * oc * k, k,
                     0.0f, j->drows + p * k, P * k);
    }
}

void dp_local_backward(float *drows, float *dw, float *db, const float *dout, const float *rows,
                       const float *w, int batch, int positions, int k, int oc, int accumulate)
{
    if (positions <= 0 || oc <= 0 || (batch <= 0 && accumulate))
        return;
    if (batch <= 0) { /* an empty batch: the gradient is zero */
        memset(dw, 0, (size_t)positions * oc * k * sizeof *dw);
        memset(db, 0, (size_t)positions * oc * sizeof *db);
        return;
    }
    local_job j = {.drows = drows, .dw = dw, .db = db, .dout = dout, .rows = rows, .w = w,
                   .batch = batch, .positions = positions, .k = k, .oc = oc,
                   .accumulate = accumulate};
    (void)dp_blas_threads();
    dp_pool_run(backward_task, &j);
}
