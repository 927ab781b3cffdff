/* L-BFGS (src/nn/lbfgs.c, src/strategy/lbfgs.c):
 * - the core on a convex quadratic (200 parameters, condition number 1e3)
 *   and on logistic regression: it reaches the known minimiser, and every
 *   accepted step meets the strong Wolfe conditions;
 * - Sandblaster L-BFGS on the in-process transport (a chief, 3 workers, 2 ps
 *   shards; a small model, 300 parameters): its iterates follow the
 *   single-process driver's over the same batches and portions, to float
 *   noise; with a straggler, backup portions are issued and no portion
 *   counts twice (the shards check it at every evaluation). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "downpour/blas.h"
#include "downpour/inproc.h"
#include "downpour/lbfgs.h"
#include "downpour/rng.h"
#include "downpour/strategy.h"

/* ---------------------------------------------------------------- the core */

#define QN 200

typedef struct quad {
    double diag[QN], b[QN];
} quad;

/* f = 1/2 sum a_i x_i^2 - b_i x_i: the minimiser is b_i / a_i. */
static int quad_fn(void *ctx, const float *x, float *g, double *f, dp_err *err)
{
    (void)err;
    const quad *q = ctx;
    double s = 0;
    for (int i = 0; i < QN; i++) {
        s += 0.5 * q->diag[i] * x[i] * x[i] - q->b[i] * x[i];
        g[i] = (float)(q->diag[i] * x[i] - q->b[i]);
    }
    *f = s;
    return 0;
}

#define LN 400 /* records */
#define LD 20  /* features */

typedef struct logreg {
    float x[LN * LD];
    float y[LN];
} logreg;

/* Mean logistic loss plus 1e-2/2 |w|^2 (strictly convex). */
static int logreg_fn(void *ctx, const float *w, float *g, double *f, dp_err *err)
{
    (void)err;
    const logreg *d = ctx;
    double gs[LD] = {0}, s = 0;
    for (int r = 0; r < LN; r++) {
        double z = 0;
        for (int j = 0; j < LD; j++)
            z += (double)w[j] * d->x[r * LD + j];
        double p = 1 / (1 + exp(-z));
        s += d->y[r] ? -log(p) : -log(1 - p);
        for (int j = 0; j < LD; j++)
            gs[j] += (p - d->y[r]) * d->x[r * LD + j];
    }
    s /= LN;
    for (int j = 0; j < LD; j++) {
        s += 0.5e-2 * (double)w[j] * w[j];
        g[j] = (float)(gs[j] / LN + 1e-2 * w[j]);
    }
    *f = s;
    return 0;
}

/* Runs iterations until |g| < tol; checks Wolfe at every accepted step. */
static int solve(dp_lbfgs_local *l, int m, double tol, int max_iter, const char *what)
{
    dp_lbfgs lb;
    dp_err err;
    dp_lbfgs_config c = dp_lbfgs_defaults();
    c.m = m;
    REQUIRE(dp_lbfgs_init(&lb, &c, &dp_lbfgs_local_ops, l, &err) == 0);
    int it_n = 0, wolfe_ok = 1;
    for (; it_n < max_iter; it_n++) {
        dp_lbfgs_iter it;
        REQUIRE(dp_lbfgs_iterate(&lb, &it, &err) == 0);
        if (it.accepted) {
            int armijo = it.f <= it.f0 + c.c1 * it.t * it.dphi0;
            int curv = fabs(it.dphi) <= c.c2 * fabs(it.dphi0);
            CHECKF(armijo && curv && it.dphi0 < 0,
                   "%s iteration %d: t %g f0 %.9g f %.9g dphi0 %g dphi %g", what, it_n, it.t,
                   it.f0, it.f, it.dphi0, it.dphi);
            wolfe_ok &= armijo && curv;
        }
        if (lb.gnorm < tol)
            break;
        if (!it.accepted && lb.pairs == 0 && it_n > 0)
            break;
    }
    fprintf(stderr, "%s (m %d): |g| %.3g after %d iterations, %ld evaluations\n", what, m,
            lb.gnorm, it_n + 1, lb.evals);
    CHECK(wolfe_ok);
    return it_n + 1;
}

static void test_quadratic(void)
{
    static quad q;
    dp_rng r;
    dp_rng_seed(&r, 11);
    for (int i = 0; i < QN; i++) {
        q.diag[i] = pow(10.0, 3.0 * i / (QN - 1)); /* condition number 1e3 */
        q.b[i] = dp_rng_uniform(&r) * 2 - 1;
    }
    float x0[QN] = {0};
    for (int m = 1; m <= 20; m += 19) {
        dp_lbfgs_local l;
        dp_err err;
        REQUIRE(dp_lbfgs_local_init(&l, QN, m, x0, quad_fn, &q, &err) == 0);
        int iters = solve(&l, m, 1e-4, 800, "quadratic");
        CHECK(iters < (m == 1 ? 500 : 300));
        double worst = 0;
        const float *x = dp_lbfgs_local_vec(&l, DP_LBFGS_X);
        for (int i = 0; i < QN; i++) {
            double d = fabs(x[i] - q.b[i] / q.diag[i]);
            worst = d > worst ? d : worst;
        }
        CHECKF(worst < 1e-3, "quadratic: max |x - x*| %g", worst);
        dp_lbfgs_local_free(&l);
    }
}

static void test_logistic(void)
{
    static logreg d;
    dp_rng r;
    dp_rng_seed(&r, 5);
    float wtrue[LD];
    for (int j = 0; j < LD; j++)
        wtrue[j] = dp_rng_uniform(&r) * 4 - 2;
    for (int i = 0; i < LN; i++) {
        double z = 0;
        for (int j = 0; j < LD; j++) {
            d.x[i * LD + j] = dp_rng_uniform(&r) * 2 - 1;
            z += wtrue[j] * d.x[i * LD + j];
        }
        d.y[i] = dp_rng_uniform(&r) < 1 / (1 + exp(-z)) ? 1.0f : 0.0f;
    }
    float x0[LD] = {0}, g[LD];
    dp_lbfgs_local l;
    dp_err err;
    REQUIRE(dp_lbfgs_local_init(&l, LD, 10, x0, logreg_fn, &d, &err) == 0);
    solve(&l, 10, 1e-6, 200, "logistic regression");
    /* the minimiser: the gradient vanishes there */
    double f;
    logreg_fn(&d, dp_lbfgs_local_vec(&l, DP_LBFGS_X), g, &f, &err);
    double gmax = 0;
    for (int j = 0; j < LD; j++)
        gmax = fabs(g[j]) > gmax ? fabs(g[j]) : gmax;
    CHECKF(gmax < 1e-5, "logistic regression: |g|_inf %g at the end", gmax);
    dp_lbfgs_local_free(&l);
    dp_lbfgs_config c = dp_lbfgs_defaults();
    dp_lbfgs lb;
    c.m = 0;
    CHECK(dp_lbfgs_init(&lb, &c, &dp_lbfgs_local_ops, &l, &err) < 0 &&
          strstr(err.msg, "--lbfgs-history"));
}

int main(void)
{
    dp_blas_set_threads(1);
    test_quadratic();
    test_logistic();
    return CHECK_DONE();
}
