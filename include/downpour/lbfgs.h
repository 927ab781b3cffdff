/* Limited-memory BFGS written against vector operations, so one driver runs
 * with its vectors in local memory (the reference, and a process alone) or
 * sharded over ps tasks (Sandblaster L-BFGS, src/strategy/lbfgs.c;
 * docs/strategies.md, "lbfgs").  The driver holds scalars only: it names
 * vectors by number and asks the backend for dot products, y += a x, x *= a,
 * copies, and the objective with its gradient at a vector.
 *
 * One iteration: the direction d = -H g by the two-loop recursion over the
 * newest m pairs (s_i, y_i) (Nocedal & Wright, Alg. 7.4, with H0 = gamma I,
 * gamma = s.y / y.y of the newest pair), then a line search along d for a
 * step t meeting the strong Wolfe conditions
 *     f(x + t d) <= f(x) + c1 t g.d   and   |g(x + t d).d| <= c2 |g.d|
 * (bracketing and zoom with safeguarded cubic interpolation, N&W Alg. 3.5
 * and 3.6; c1 = 1e-4, c2 = 0.9), then x += t d and the new pair s = x_new -
 * x, y = g_new - g (kept when s.y > 0, which the Wolfe conditions ensure in
 * exact arithmetic).  A line search that finds no such step in max_evals
 * evaluations leaves x where it was and forgets the history; the next
 * iteration starts again from steepest descent. */
#ifndef DOWNPOUR_LBFGS_H
#define DOWNPOUR_LBFGS_H

#include <stddef.h>

#include "downpour/status.h"

#define DP_LBFGS_MAX_M 64 /* --lbfgs-history is 1..this */

/* The vectors, by number: x, its gradient g, the direction d, the trial
 * point xt and its gradient gt, then the pairs s_i, y_i. */
enum {
    DP_LBFGS_X,
    DP_LBFGS_G,
    DP_LBFGS_D,
    DP_LBFGS_XT,
    DP_LBFGS_GT,
    DP_LBFGS_FIXED
};
#define DP_LBFGS_S(i) (DP_LBFGS_FIXED + 2 * (i))
#define DP_LBFGS_Y(i) (DP_LBFGS_FIXED + 2 * (i) + 1)
/* How many vectors a backend holds for history m. */
#define DP_LBFGS_VECTORS(m) (DP_LBFGS_FIXED + 2 * (m))

/* A backend.  Each call returns 0 or -1 with err filled. */
typedef struct dp_lbfgs_vec_ops {
    /* out[k] = a[k] . b[k] for k < n (n <= DP_LBFGS_MAX_DOTS), in one round. */
    int (*dots)(void *self, int n, const int *a, const int *b, double *out, dp_err *err);
    int (*axpy)(void *self, int y, double alpha, int x, dp_err *err); /* y += alpha x */
    int (*scale)(void *self, int x, double alpha, dp_err *err);       /* x *= alpha */
    int (*copy)(void *self, int dst, int src, dp_err *err);
    /* *f = the objective at vector x, its gradient into vector g. */
    int (*eval)(void *self, int x, int g, double *f, dp_err *err);
} dp_lbfgs_vec_ops;
#define DP_LBFGS_MAX_DOTS 4

typedef struct dp_lbfgs_config {
    int m;          /* pairs kept (10) */
    double c1, c2;  /* Wolfe constants (1e-4, 0.9) */
    int max_evals;  /* evaluations a line search may take (20) */
} dp_lbfgs_config;

dp_lbfgs_config dp_lbfgs_defaults(void);

typedef struct dp_lbfgs {
    dp_lbfgs_config cfg;
    const dp_lbfgs_vec_ops *ops;
    void *self;
    int pairs;      /* pairs held, <= m */
    int newest;     /* slot of the newest pair */
    double rho[DP_LBFGS_MAX_M], alpha[DP_LBFGS_MAX_M];
    double gamma;   /* H0 = gamma I */
    double f, gnorm; /* at x */
    int started;
    long evals;     /* evaluations so far */
} dp_lbfgs;

/* What one iteration did.  accepted: the step met both Wolfe conditions
 * (f0, dphi0: f and g.d at x; f, dphi: at x + t d). */
typedef struct dp_lbfgs_iter {
    int accepted;
    double t, f0, dphi0, f, dphi, gnorm;
    int evals;      /* evaluations of the line search */
    int pair_kept;
} dp_lbfgs_iter;

int dp_lbfgs_init(dp_lbfgs *lb, const dp_lbfgs_config *cfg, const dp_lbfgs_vec_ops *ops,
                  void *self, dp_err *err);
/* f and g at x, before the first iteration or when the objective changed
 * (a new batch): the history is kept. */
int dp_lbfgs_start(dp_lbfgs *lb, dp_err *err);
/* One iteration (starts first when dp_lbfgs_start was not called).
 * Returns 0 with *it filled, -1 on a backend error. */
int dp_lbfgs_iterate(dp_lbfgs *lb, dp_lbfgs_iter *it, dp_err *err);
void dp_lbfgs_forget(dp_lbfgs *lb); /* drops the pairs */

/* ---- the local backend: n floats a vector, in memory ---- */

/* The objective: *f at x, gradient into g (n floats). */
typedef int (*dp_lbfgs_fn)(void *ctx, const float *x, float *g, double *f, dp_err *err);

typedef struct dp_lbfgs_local {
    size_t n;
    int count;     /* vectors */
    float *mem;    /* count * n floats */
    dp_lbfgs_fn fn;
    void *ctx;
} dp_lbfgs_local;

extern const dp_lbfgs_vec_ops dp_lbfgs_local_ops;

/* Room for DP_LBFGS_VECTORS(m) vectors of n floats, zeroed; x starts at x0. */
int dp_lbfgs_local_init(dp_lbfgs_local *l, size_t n, int m, const float *x0, dp_lbfgs_fn fn,
                        void *ctx, dp_err *err);
void dp_lbfgs_local_free(dp_lbfgs_local *l);
static inline float *dp_lbfgs_local_vec(dp_lbfgs_local *l, int v)
{
    return l->mem + (size_t)v * l->n;
}

#endif
