/* PowerSGD's step over the ring: see include/downpour/powersgd.h.  The
 * factors are kept transposed, P^T (r x rows) and Q^T (r x cols), so that
 * each column Gram-Schmidt works on is a contiguous row. */
#include "downpour/powersgd.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/blas.h"
#include "downpour/clock.h"
#include "downpour/layer_kind.h"
#include "downpour/rng.h"

/* A tensor of the file's shape dims[0..nd) at off, len floats: a matrix
 * when two or more dimensions are above 1 (rows: the first of them). */
static void add_tensor(const int64_t *dims, int nd, size_t off, size_t len, int rank,
                       dp_psgd_matrix *out, int cap, int *k, dp_psgd_plan *plan)
{
    int first = -1, big = 0;
    for (int i = 0; i < nd; i++)
        if (dims[i] > 1) {
            big++;
            if (first < 0)
                first = i;
        }
    if (big < 2 || len == 0 || len % (size_t)dims[first] != 0 || dims[first] > INT32_MAX ||
        len / (size_t)dims[first] > INT32_MAX)
        return;
    int rows = (int)dims[first], cols = (int)(len / (size_t)rows);
    int lo = rows < cols ? rows : cols;
    plan->matrices++;
    /* the largest r with r (rows + cols) < rows cols */
    size_t useful = ((size_t)rows * cols - 1) / ((size_t)rows + cols);
    if (useful > (size_t)lo)
        useful = (size_t)lo;
    if ((int)useful > plan->max_rank)
        plan->max_rank = (int)useful;
    int r = rank < lo ? rank : lo;
    if ((size_t)r * ((size_t)rows + cols) >= (size_t)rows * cols)
        return; /* the factors would be no smaller: whole */
    if (*k < cap)
        out[*k] = (dp_psgd_matrix){off, rows, cols, r};
    (*k)++;
    plan->compressed++;
    plan->factor_floats += (size_t)r * ((size_t)rows + cols);
    plan->whole_floats -= len;
}

int dp_powersgd_matrices(const dp_model *m, int rank, dp_psgd_matrix *out, int cap,
                         dp_psgd_plan *plan)
{
    memset(plan, 0, sizeof *plan);
    plan->n_params = m->n_params;
    plan->whole_floats = m->n_params;
    int k = 0;
    for (int l = 0; l < m->n_layers; l++) {
        const dp_layer *d = &m->layers[l];
        const dp_layer_ops *ops = dp_layer_ops_of(d);
        if (d->w_len == 0)
            continue;
        dp_lk_sparse sp[DP_LK_MAX_SPARSE];
        if (ops->sparse && ops->sparse(d, sp) > 0)
            continue; /* a table read by rows: never factored */
        if (ops->tensors) {
            dp_lk_tensor t[DP_LK_MAX_TENSORS];
            int n = ops->tensors(d, t);
            for (int i = 0; i < n; i++) {
                size_t len = 1;
                for (int j = 0; j < t[i].ndim; j++)
                    len *= (size_t)t[i].shape[j];
                add_tensor(t[i].shape, t[i].ndim, d->w_off + t[i].off, len, rank, out, cap, &k,
                           plan);
            }
        } else if (ops->shapes) {
            int64_t w[6], b[3];
            int bdim, wdim = ops->shapes(d, w, b, &bdim);
            add_tensor(w, wdim, d->w_off, d->w_len, rank, out, cap, &k, plan);
        }
    }
    return k;
}

/* A matrix with its factors' places: P^T at p, Q^T at q (r x rows, r x
 * cols floats in pbuf and qbuf). */
typedef struct mat {
    dp_psgd_matrix m;
    size_t p, q;
} mat;

/* A run of the gradient summed whole: [off, off + len), packed at at. */
typedef struct span {
    size_t off, len, at;
} span;

struct dp_powersgd {
    size_t n;
    mat *mats;
    int k;
    span *whole;        /* room for k + 1 + DP_POWERSGD_MAX_SKIP */
    int n_whole;
    size_t skip_lo[DP_POWERSGD_MAX_SKIP], skip_hi[DP_POWERSGD_MAX_SKIP];
    int n_skip;
    size_t p_floats, q_floats, w_floats;
    float *pbuf;   /* P^T's, then the whole spans: the first all-reduce */
    float *qbuf;   /* Q^T's: the warm start, then the second all-reduce */
    float *qown;   /* this replica's Q^T's before the sum, for the residual */
    float *resid;  /* n */
    uint64_t seed;
};

void dp_powersgd_close(dp_powersgd *ps)
{
    if (!ps)
        return;
    free(ps->mats);
    free(ps->whole);
    free(ps->pbuf);
    free(ps->qbuf);
    free(ps->qown);
    free(ps->resid);
    free(ps);
}

/* [at, end) less the skipped ranges, as whole spans. */
static void add_whole(dp_powersgd *ps, size_t at, size_t end)
{
    for (int j = 0; j <= ps->n_skip && at < end; j++) {
        size_t stop = j < ps->n_skip && ps->skip_lo[j] < end ? ps->skip_lo[j] : end;
        if (stop > at) {
            ps->whole[ps->n_whole++] = (span){at, stop - at, ps->w_floats};
            ps->w_floats += stop - at;
        }
        if (j < ps->n_skip && ps->skip_hi[j] > at)
            at = ps->skip_hi[j];
    }
}

/* The whole spans: what no matrix and no skipped range holds. */
static void spans(dp_powersgd *ps)
{
    ps->n_whole = 0;
    ps->w_floats = 0;
    size_t at = 0;
    for (int i = 0; i <= ps->k; i++) {
        size_t end = i < ps->k ? ps->mats[i].m.off : ps->n;
        add_whole(ps, at, end);
        if (i < ps->k)
            at = end + (size_t)ps->mats[i].m.rows * ps->mats[i].m.cols;
    }
}

int dp_powersgd_skip(dp_powersgd *ps, const size_t *lo, const size_t *hi, int n)
{
    if (n < 0 || n > DP_POWERSGD_MAX_SKIP)
        return -1;
    for (int j = 0; j < n; j++) {
        if (lo[j] > hi[j] || hi[j] > ps->n || (j > 0 && lo[j] < hi[j - 1]))
            return -1;
        for (int i = 0; i < ps->k; i++) { /* a matrix is never skipped, even in part */
            size_t a = ps->mats[i].m.off, b = a + (size_t)ps->mats[i].m.rows * ps->mats[i].m.cols;
            if (lo[j] < b && a < hi[j])
                return -1;
        }
    }
    memcpy(ps->skip_lo, lo, (size_t)n * sizeof *lo);
    memcpy(ps->skip_hi, hi, (size_t)n * sizeof *hi);
    ps->n_skip = n;
    spans(ps);
    return 0;
}

void dp_powersgd_restart(dp_powersgd *ps)
{
    for (int i = 0; i < ps->k; i++) {
        dp_rng g;
        dp_rng_seed(&g, ps->seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(i + 1)));
        float *q = ps->qbuf + ps->mats[i].q;
        size_t len = (size_t)ps->mats[i].m.rank * (size_t)ps->mats[i].m.cols;
        for (size_t j = 0; j < len; j++)
            q[j] = 2.0f * dp_rng_uniform(&g) - 1.0f;
    }
}

int dp_powersgd_open(dp_powersgd **out, size_t n, const dp_psgd_matrix *mats, int k,
                     uint64_t seed, dp_err *err)
{
    *out = NULL;
    if (k < 0 || k > DP_POWERSGD_MAX_MATRICES)
        return dp_errf(err, "powersgd: %d matrices, at most %d", k, DP_POWERSGD_MAX_MATRICES);
    size_t at = 0;
    for (int i = 0; i < k; i++) {
        const dp_psgd_matrix *m = &mats[i];
        if (m->rows < 1 || m->cols < 1 || m->rank < 1 || m->rank > m->rows ||
            m->rank > m->cols || m->off < at || m->off > n ||
            (size_t)m->rows * m->cols > n - m->off)
            return dp_errf(err, "powersgd: matrix %d (%d x %d, rank %d at %zu) does not lie in "
                                "order inside the %zu floats",
                           i, m->rows, m->cols, m->rank, m->off, n);
        at = m->off + (size_t)m->rows * m->cols;
    }
    dp_powersgd *ps = calloc(1, sizeof *ps);
    if (!ps)
        return dp_errf(err, "powersgd: out of memory");
    ps->n = n;
    ps->k = k;
    ps->seed = seed;
    ps->mats = calloc((size_t)k + 1, sizeof *ps->mats);
    ps->whole = calloc((size_t)k + 1 + DP_POWERSGD_MAX_SKIP, sizeof *ps->whole);
    if (!ps->mats || !ps->whole) {
        dp_powersgd_close(ps);
        return dp_errf(err, "powersgd: out of memory");
    }
    for (int i = 0; i < k; i++) {
        ps->mats[i] = (mat){mats[i], ps->p_floats, ps->q_floats};
        ps->p_floats += (size_t)mats[i].rank * (size_t)mats[i].rows;
        ps->q_floats += (size_t)mats[i].rank * (size_t)mats[i].cols;
    }
    spans(ps);
    size_t first = ps->p_floats + ps->w_floats; /* no skip yet: the most it takes */
    ps->pbuf = malloc((first ? first : 1) * sizeof *ps->pbuf);
    ps->qbuf = malloc((ps->q_floats ? ps->q_floats : 1) * sizeof *ps->qbuf);
    ps->qown = malloc((ps->q_floats ? ps->q_floats : 1) * sizeof *ps->qown);
    ps->resid = calloc(n ? n : 1, sizeof *ps->resid);
    if (!ps->pbuf || !ps->qbuf || !ps->qown || !ps->resid) {
        dp_powersgd_close(ps);
        return dp_errf(err, "powersgd: out of memory for the factors (%zu + %zu floats) and "
                            "the residual (%zu)",
                       first, ps->q_floats, n);
    }
    dp_powersgd_restart(ps);
    *out = ps;
    return 0;
}

/* The r rows of x (r x len) made orthonormal: Gram-Schmidt, each row's
 * projections taken off twice ("twice is enough": orthogonal to the
 * rounding even when M's rank is below r).  A row with nothing left (M
 * zero, or of lower rank in exact arithmetic) becomes zero, and so
 * contributes nothing. */
static void orthonormalise(float *x, int r, size_t len)
{
    for (int k = 0; k < r; k++) {
        float *v = x + (size_t)k * len;
        for (int pass = 0; pass < 2; pass++)
            for (int j = 0; j < k; j++) {
                const float *u = x + (size_t)j * len;
                double c = dp_dot(u, v, len);
                if (c != 0)
                    dp_axpy(v, (float)-c, u, len);
            }
        double nrm = sqrt(dp_dot(v, v, len));
        if (nrm > 0 && isfinite(nrm))
            dp_scal(v, (float)(1.0 / nrm), len);
        else
            memset(v, 0, len * sizeof *v);
    }
}

int dp_powersgd_reduce(dp_powersgd *ps, dp_ring *ring, float *grads, float weight, uint64_t step,
                       dp_err *err)
{
    /* P = (weight x gradient + residual) Q, with Q's columns orthonormal */
    for (int i = 0; i < ps->k; i++) {
        const mat *a = &ps->mats[i];
        int r = a->m.rank, rows = a->m.rows, cols = a->m.cols;
        float *M = grads + a->m.off, *Qt = ps->qbuf + a->q;
        const float *e = ps->resid + a->m.off;
        for (size_t j = 0; j < (size_t)rows * cols; j++)
            M[j] = M[j] * weight + e[j];
        orthonormalise(Qt, r, (size_t)cols);
        /* P^T = Q^T M^T */
        dp_sgemm(false, true, r, rows, cols, 1.0f, Qt, cols, M, cols, 0.0f, ps->pbuf + a->p, rows);
    }
    for (int s = 0; s < ps->n_whole; s++) {
        float *w = ps->pbuf + ps->p_floats + ps->whole[s].at;
        const float *g = grads + ps->whole[s].off;
        for (size_t j = 0; j < ps->whole[s].len; j++)
            w[j] = g[j] * weight;
    }
    int rc = ring ? dp_ring_allreduce(ring, ps->pbuf, ps->p_floats + ps->w_floats, step, 0, err)
                  : 0;
    if (rc < 0)
        return rc;
    for (int s = 0; s < ps->n_whole; s++)
        memcpy(grads + ps->whole[s].off, ps->pbuf + ps->p_floats + ps->whole[s].at,
               ps->whole[s].len * sizeof *grads);
    /* Q = M^T P, P's columns orthonormal: the same P on every replica */
    for (int i = 0; i < ps->k; i++) {
        const mat *a = &ps->mats[i];
        int r = a->m.rank, rows = a->m.rows, cols = a->m.cols;
        float *Pt = ps->pbuf + a->p;
        orthonormalise(Pt, r, (size_t)rows);
        /* Q^T = P^T M */
        dp_sgemm(false, false, r, cols, rows, 1.0f, Pt, rows, grads + a->m.off, cols, 0.0f,
                 ps->qbuf + a->q, cols);
    }
    memcpy(ps->qown, ps->qbuf, ps->q_floats * sizeof *ps->qown);
    rc = ring ? dp_ring_allreduce(ring, ps->qbuf, ps->q_floats, step, 1, err) : 0;
    if (rc < 0)
        return rc;
    /* Both sums are in: the residual, then M' = P Q^T in the gradient */
    for (int i = 0; i < ps->k; i++) {
        const mat *a = &ps->mats[i];
        int r = a->m.rank, rows = a->m.rows, cols = a->m.cols;
        float *M = grads + a->m.off, *e = ps->resid + a->m.off;
        const float *Pt = ps->pbuf + a->p;
        memcpy(e, M, (size_t)rows * cols * sizeof *e);
        dp_sgemm(true, false, rows, cols, r, -1.0f, Pt, rows, ps->qown + a->q, cols, 1.0f, e,
                 cols);
        dp_sgemm(true, false, rows, cols, r, 1.0f, Pt, rows, ps->qbuf + a->q, cols, 0.0f, M,
                 cols);
    }
    return 0;
}

void dp_powersgd_exact(dp_powersgd *ps, float *grads, float weight)
{
    for (int i = 0; i < ps->k; i++) {
        size_t a = ps->mats[i].m.off, b = a + (size_t)ps->mats[i].m.rows * ps->mats[i].m.cols;
        for (size_t j = a; j < b; j++) {
            grads[j] = grads[j] * weight + ps->resid[j];
            ps->resid[j] = 0;
        }
    }
    for (int s = 0; s < ps->n_whole; s++) {
        float *g = grads + ps->whole[s].off;
        for (size_t j = 0; j < ps->whole[s].len; j++)
            g[j] *= weight;
    }
}

float *dp_powersgd_residual(dp_powersgd *ps) { return ps->resid; }

float *dp_powersgd_q(dp_powersgd *ps) { return ps->qbuf; }

void dp_powersgd_floats(const dp_powersgd *ps, size_t *first, size_t *second)
{
    *first = ps->p_floats + ps->w_floats;
    *second = ps->q_floats;
}

int dp_powersgd_time(size_t n, const dp_psgd_matrix *mats, int k, uint64_t seed, double *seconds,
                     dp_err *err)
{
    dp_powersgd *ps;
    if (dp_powersgd_open(&ps, n, mats, k, seed, err) < 0)
        return -1;
    float *g = malloc((n ? n : 1) * sizeof *g);
    if (!g) {
        dp_powersgd_close(ps);
        return dp_errf(err, "powersgd: out of memory for the measurement (%zu floats)", n);
    }
    dp_rng rng;
    dp_rng_seed(&rng, seed);
    double best = HUGE_VAL;
    for (int rep = 0; rep < DP_POWERSGD_TIME_REPS; rep++) {
        for (size_t j = 0; j < n; j++) /* a fresh gradient: nothing cached but the code */
            g[j] = 2.0f * dp_rng_uniform(&rng) - 1.0f;
        double t0 = dp_now();
        (void)dp_powersgd_reduce(ps, NULL, g, 1.0f, 0, err);
        double t = dp_now() - t0;
        if (t < best)
            best = t;
    }
    free(g);
    dp_powersgd_close(ps);
    *seconds = best;
    return 0;
}
