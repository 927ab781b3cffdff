/* L-BFGS over named vectors (lbfgs.h): the two-loop recursion and a strong
 * Wolfe line search, holding scalars only, and the local backend.  The
 * driver never touches a float of a vector, so the same code runs the
 * vectors in memory and on ps shards (src/strategy/lbfgs.c). */
#include "downpour/lbfgs.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/blas.h"

dp_lbfgs_config dp_lbfgs_defaults(void)
{
    return (dp_lbfgs_config){.m = 10, .c1 = 1e-4, .c2 = 0.9, .max_evals = 20};
}

int dp_lbfgs_init(dp_lbfgs *lb, const dp_lbfgs_config *cfg, const dp_lbfgs_vec_ops *ops,
                  void *self, dp_err *err)
{
    if (cfg->m < 1 || cfg->m > DP_LBFGS_MAX_M)
        return dp_errf(err, "--lbfgs-history %d is out of range [1, %d]", cfg->m, DP_LBFGS_MAX_M);
    if (!(cfg->c1 > 0 && cfg->c1 < cfg->c2 && cfg->c2 < 1) || cfg->max_evals < 1)
        return dp_errf(err, "L-BFGS needs 0 < c1 < c2 < 1 and at least one evaluation a line "
                            "search (c1 %g, c2 %g, %d)", cfg->c1, cfg->c2, cfg->max_evals);
    memset(lb, 0, sizeof *lb);
    lb->cfg = *cfg;
    lb->ops = ops;
    lb->self = self;
    lb->newest = cfg->m - 1;
    lb->gamma = 1;
    return 0;
}

void dp_lbfgs_forget(dp_lbfgs *lb)
{
    lb->pairs = 0;
    lb->gamma = 1;
}

static int dot1(dp_lbfgs *lb, int a, int b, double *out, dp_err *err)
{
    return lb->ops->dots(lb->self, 1, &a, &b, out, err);
}

int dp_lbfgs_start(dp_lbfgs *lb, dp_err *err)
{
    double gg;
    if (lb->ops->eval(lb->self, DP_LBFGS_X, DP_LBFGS_G, &lb->f, err) < 0 ||
        dot1(lb, DP_LBFGS_G, DP_LBFGS_G, &gg, err) < 0)
        return -1;
    lb->evals++;
    lb->gnorm = sqrt(gg);
    lb->started = 1;
    return 0;
}

/* d = -H g, the two-loop recursion (N&W Alg. 7.4), newest pair first. */
static int direction(dp_lbfgs *lb, dp_err *err)
{
    const dp_lbfgs_vec_ops *o = lb->ops;
    int m = lb->cfg.m;
    if (o->copy(lb->self, DP_LBFGS_D, DP_LBFGS_G, err) < 0)
        return -1;
    for (int j = 0; j < lb->pairs; j++) {
        int k = (lb->newest - j + m) % m;
        double sq;
        if (dot1(lb, DP_LBFGS_S(k), DP_LBFGS_D, &sq, err) < 0)
            return -1;
        lb->alpha[k] = lb->rho[k] * sq;
        if (o->axpy(lb->self, DP_LBFGS_D, -lb->alpha[k], DP_LBFGS_Y(k), err) < 0)
            return -1;
    }
    if (lb->pairs > 0 && o->scale(lb->self, DP_LBFGS_D, lb->gamma, err) < 0)
        return -1;
    for (int j = lb->pairs - 1; j >= 0; j--) {
        int k = (lb->newest - j + m) % m;
        double yr;
        if (dot1(lb, DP_LBFGS_Y(k), DP_LBFGS_D, &yr, err) < 0)
            return -1;
        double beta = lb->rho[k] * yr;
        if (o->axpy(lb->self, DP_LBFGS_D, lb->alpha[k] - beta, DP_LBFGS_S(k), err) < 0)
            return -1;
    }
    return o->scale(lb->self, DP_LBFGS_D, -1.0, err);
}

/* phi(t) = f(x + t d) and phi'(t) = g(x + t d).d, left in xt and gt. */
static int trial(dp_lbfgs *lb, double t, double *f, double *dphi, int *evals, dp_err *err)
{
    const dp_lbfgs_vec_ops *o = lb->ops;
    if (o->copy(lb->self, DP_LBFGS_XT, DP_LBFGS_X, err) < 0 ||
        o->axpy(lb->self, DP_LBFGS_XT, t, DP_LBFGS_D, err) < 0 ||
        o->eval(lb->self, DP_LBFGS_XT, DP_LBFGS_GT, f, err) < 0 ||
        dot1(lb, DP_LBFGS_GT, DP_LBFGS_D, dphi, err) < 0)
        return -1;
    (*evals)++;
    lb->evals++;
    return 0;
}

/* The minimiser of the cubic through (a, fa, ga) and (b, fb, gb) (N&W eq.
 * 3.59), NAN when it has none. */
static double cubic_min(double a, double fa, double ga, double b, double fb, double gb)
{
    double d1 = ga + gb - 3 * (fa - fb) / (a - b);
    double rad = d1 * d1 - ga * gb;
    if (!(rad >= 0))
        return NAN;
    double d2 = copysign(sqrt(rad), b - a);
    double den = gb - ga + 2 * d2;
    return den == 0 ? NAN : b - (b - a) * (gb + d2 - d1) / den;
}

typedef struct point {
    double t, f, d;
} point;

/* N&W Alg. 3.6: lo satisfies sufficient decrease with the lowest f so far,
 * and the interval between lo and hi holds a strong Wolfe step.  Returns 1
 * with the step in xt/gt, 0 when the evaluations ran out. */
static int zoom(dp_lbfgs *lb, point lo, point hi, double f0, double dphi0, dp_lbfgs_iter *it,
                dp_err *err)
{
    const dp_lbfgs_config *c = &lb->cfg;
    while (it->evals < c->max_evals) {
        double a = lo.t < hi.t ? lo.t : hi.t, b = lo.t < hi.t ? hi.t : lo.t;
        if (b - a <= 1e-12 * b)
            return 0; /* the interval shrank to nothing: f is flat in float noise */
        double t = cubic_min(lo.t, lo.f, lo.d, hi.t, hi.f, hi.d), margin = 0.1 * (b - a);
        if (!isfinite(t) || t < a + margin || t > b - margin)
            t = 0.5 * (a + b);
        point p = {t, 0, 0};
        if (trial(lb, t, &p.f, &p.d, &it->evals, err) < 0)
            return -1;
        if (!isfinite(p.f) || p.f > f0 + c->c1 * t * dphi0 || p.f >= lo.f) {
            if (!isfinite(p.f))
                p.f = INFINITY, p.d = 0; /* too far: the loss overflowed */
            hi = p;
            continue;
        }
        if (fabs(p.d) <= -c->c2 * dphi0) {
            it->t = t, it->f = p.f, it->dphi = p.d;
            return 1;
        }
        if (p.d * (hi.t - lo.t) >= 0)
            hi = lo;
        lo = p;
    }
    return 0;
}

/* N&W Alg. 3.5: widen the step until it brackets a strong Wolfe step, then
 * zoom.  Returns 1 with the step in xt/gt, 0 when none was found. */
static int line_search(dp_lbfgs *lb, double t, double f0, double dphi0, dp_lbfgs_iter *it,
                       dp_err *err)
{
    const dp_lbfgs_config *c = &lb->cfg;
    point prev = {0, f0, dphi0};
    for (int i = 0; it->evals < c->max_evals; i++) {
        point p = {t, 0, 0};
        if (trial(lb, t, &p.f, &p.d, &it->evals, err) < 0)
            return -1;
        if (!isfinite(p.f) || p.f > f0 + c->c1 * t * dphi0 || (i > 0 && p.f >= prev.f))
            return isfinite(p.f) ? zoom(lb, prev, p, f0, dphi0, it, err)
                                 : zoom(lb, prev, (point){t, INFINITY, 0}, f0, dphi0, it, err);
        if (fabs(p.d) <= -c->c2 * dphi0) {
            it->t = t, it->f = p.f, it->dphi = p.d;
            return 1;
        }
        if (p.d >= 0)
            return zoom(lb, p, prev, f0, dphi0, it, err);
        prev = p;
        t *= 2;
    }
    return 0;
}

/* x, g <- xt, gt; the new pair s = x_new - x, y = g_new - g into the
 * oldest slot, kept when s.y > 0. */
static int take_step(dp_lbfgs *lb, dp_lbfgs_iter *it, dp_err *err)
{
    const dp_lbfgs_vec_ops *o = lb->ops;
    int m = lb->cfg.m, k = (lb->newest + 1) % m;
    void *v = lb->self;
    if (o->copy(v, DP_LBFGS_S(k), DP_LBFGS_XT, err) < 0 ||
        o->axpy(v, DP_LBFGS_S(k), -1.0, DP_LBFGS_X, err) < 0 ||
        o->copy(v, DP_LBFGS_Y(k), DP_LBFGS_GT, err) < 0 ||
        o->axpy(v, DP_LBFGS_Y(k), -1.0, DP_LBFGS_G, err) < 0 ||
        o->copy(v, DP_LBFGS_X, DP_LBFGS_XT, err) < 0 || o->copy(v, DP_LBFGS_G, DP_LBFGS_GT, err) < 0)
        return -1;
    int a[3] = {DP_LBFGS_S(k), DP_LBFGS_Y(k), DP_LBFGS_G};
    int b[3] = {DP_LBFGS_Y(k), DP_LBFGS_Y(k), DP_LBFGS_G};
    double r[3];
    if (o->dots(v, 3, a, b, r, err) < 0)
        return -1;
    double sy = r[0], yy = r[1];
    if (sy > 1e-10 * yy && yy > 0) {
        lb->rho[k] = 1.0 / sy;
        lb->gamma = sy / yy;
        lb->newest = k;
        lb->pairs = lb->pairs < m ? lb->pairs + 1 : m;
        it->pair_kept = 1;
    } else if (lb->pairs == m) {
        lb->pairs--; /* its slot, the oldest pair's, was overwritten */
    }
    lb->f = it->f;
    lb->gnorm = sqrt(r[2]);
    return 0;
}

int dp_lbfgs_iterate(dp_lbfgs *lb, dp_lbfgs_iter *it, dp_err *err)
{
    memset(it, 0, sizeof *it);
    if (!lb->started && dp_lbfgs_start(lb, err) < 0)
        return -1;
    it->f0 = it->f = lb->f;
    it->gnorm = lb->gnorm;
    if (lb->gnorm == 0)
        return 0; /* a stationary point */
    double dphi0;
    if (direction(lb, err) < 0 || dot1(lb, DP_LBFGS_G, DP_LBFGS_D, &dphi0, err) < 0)
        return -1;
    if (!(dphi0 < 0)) {
        /* not a descent direction (a poor history): steepest descent */
        dp_lbfgs_forget(lb);
        if (direction(lb, err) < 0)
            return -1;
        dphi0 = -lb->gnorm * lb->gnorm;
    }
    /* the first step of steepest descent moves x by 1; after it, the
     * quasi-Newton step t = 1 is the natural scale */
    double t = lb->pairs > 0 ? 1.0 : 1.0 / lb->gnorm;
    it->dphi0 = dphi0;
    int found = line_search(lb, t, lb->f, dphi0, it, err);
    if (found < 0)
        return -1;
    if (!found) {
        dp_lbfgs_forget(lb);
        it->f = lb->f;
        return 0;
    }
    it->accepted = 1;
    if (take_step(lb, it, err) < 0)
        return -1;
    it->gnorm = lb->gnorm;
    return 0;
}

/* ------------------------------------------------------------ local vectors */

static int local_dots(void *self, int n, const int *a, const int *b, double *out, dp_err *err)
{
    (void)err;
    dp_lbfgs_local *l = self;
    for (int k = 0; k < n; k++)
        out[k] = dp_dot(dp_lbfgs_local_vec(l, a[k]), dp_lbfgs_local_vec(l, b[k]), l->n);
    return 0;
}

static int local_axpy(void *self, int y, double alpha, int x, dp_err *err)
{
    (void)err;
    dp_lbfgs_local *l = self;
    dp_axpy(dp_lbfgs_local_vec(l, y), (float)alpha, dp_lbfgs_local_vec(l, x), l->n);
    return 0;
}

static int local_scale(void *self, int x, double alpha, dp_err *err)
{
    (void)err;
    dp_lbfgs_local *l = self;
    dp_scal(dp_lbfgs_local_vec(l, x), (float)alpha, l->n);
    return 0;
}

static int local_copy(void *self, int dst, int src, dp_err *err)
{
    (void)err;
    dp_lbfgs_local *l = self;
    memcpy(dp_lbfgs_local_vec(l, dst), dp_lbfgs_local_vec(l, src), l->n * sizeof(float));
    return 0;
}

static int local_eval(void *self, int x, int g, double *f, dp_err *err)
{
    dp_lbfgs_local *l = self;
    return l->fn(l->ctx, dp_lbfgs_local_vec(l, x), dp_lbfgs_local_vec(l, g), f, err);
}

const dp_lbfgs_vec_ops dp_lbfgs_local_ops = {
    .dots = local_dots,
    .axpy = local_axpy,
    .scale = local_scale,
    .copy = local_copy,
    .eval = local_eval,
};

int dp_lbfgs_local_init(dp_lbfgs_local *l, size_t n, int m, const float *x0, dp_lbfgs_fn fn,
                        void *ctx, dp_err *err)
{
    memset(l, 0, sizeof *l);
    if (m < 1 || m > DP_LBFGS_MAX_M)
        return dp_errf(err, "--lbfgs-history %d is out of range [1, %d]", m, DP_LBFGS_MAX_M);
    l->n = n;
    l->count = DP_LBFGS_VECTORS(m);
    l->mem = calloc((size_t)l->count * n, sizeof(float));
    if (!l->mem)
        return dp_errf(err, "out of memory for %d L-BFGS vectors of %zu floats", l->count, n);
    memcpy(l->mem, x0, n * sizeof(float));
    l->fn = fn;
    l->ctx = ctx;
    return 0;
}

void dp_lbfgs_local_free(dp_lbfgs_local *l)
{
    free(l->mem);
    l->mem = NULL;
}
