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
#include <stddef.h>
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
#include "downpour/train.h"
#include "strategy/ps_family.h"

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

/* ------------------------------------------- Sandblaster against one process */

#define SPEC "20-12-5" /* 317 parameters */
#define DIM 20
#define NREC 300
#define CHIEF_WORKERS_PS 6 /* a chief, 3 workers, 2 ps */

static uint8_t images[NREC * DIM], labels[NREC];
static dp_split split = {.images = images, .labels = labels, .n = NREC, .dim = DIM};

typedef struct task {
    dp_train_config cfg;
    int rank;
    dp_transport *t;
    int rc;
    dp_err err;
    float params[512];
    size_t n_params;
    long portions, backups, duplicates;
} task;

static void *run_task(void *arg)
{
    task *j = arg;
    int ports[CHIEF_WORKERS_PS];
    for (int i = 0; i < CHIEF_WORKERS_PS; i++)
        ports[i] = 30000 + i; /* never listened on */
    dp_node node;
    memset(&node, 0, sizeof node);
    dp_model m;
    j->rc = -1;
    REQUIRE(dp_cluster_local(&node.cluster, 1, 3, 2, ports, &j->err) == 0);
    node.cluster.self = j->rank;
    node.self = &node.cluster.tasks[j->rank];
    node.transport = j->t;
    const dp_strategy_ops *ops = &dp_strategy_lbfgs;
    REQUIRE(dp_model_init(&m, SPEC, ops->model_rows(&j->cfg), 1, &j->err) == 0);
    dp_model_init_params(&m, 7);
    long spe = (NREC + j->cfg.batch - 1) / j->cfg.batch;
    dp_run_env env = {.cfg = &j->cfg, .node = &node, .model = &m, .n_train = NREC,
                      .steps_per_epoch = spe, .train = &split};
    dp_task_info info;
    memset(&info, 0, sizeof info);
    dp_strategy *s = NULL;
    if (ops->open(&s, &env, &info, &j->err) < 0)
        goto out;
    if (info.part == DP_PART_SERVER) {
        j->rc = ops->serve(s, &j->err);
    } else if (info.part == DP_PART_TRAINER) {
        CHECK(info.no_batches && info.replicas == 1);
        for (long k = 0; k < spe * j->cfg.epochs; k++) {
            dp_step_out o;
            if (ops->step(s, NULL, NULL, 0, 0, k + 1, &o, &j->err) < 0)
                goto out;
        }
        j->rc = ops->finish(s, spe * j->cfg.epochs, &j->err);
    } else {
        dp_coord_event ev;
        do {
            if (ops->next(s, &ev, NULL, &j->err) < 0)
                goto out;
        } while (ev.kind != DP_COORD_DONE);
        const float *p = ops->params(s, DP_WEIGHTS_LIVE, &j->err);
        REQUIRE(p && m.n_params <= 512);
        memcpy(j->params, p, m.n_params * sizeof(float));
        j->n_params = m.n_params;
        dp_lbfgs_counts(s, &j->portions, &j->backups, &j->duplicates);
        j->rc = 0;
    }
out:
    ops->close(s);
    dp_model_free(&m);
    dp_cluster_free(&node.cluster);
    return NULL;
}

/* The single-process objective: the batch's mean loss, its gradient summed
 * over the same portions with the same weights as the shards'. */
typedef struct ref {
    dp_model m;
    uint32_t lo, n, portion;
    float x[NREC * DIM];
    uint8_t y[NREC];
    uint32_t idx[NREC];
} ref;

static int ref_fn(void *ctx, const float *x, float *g, double *f, dp_err *err)
{
    (void)err;
    ref *r = ctx;
    memcpy(r->m.params, x, r->m.n_params * sizeof(float));
    memset(g, 0, r->m.n_params * sizeof(float));
    double sum = 0;
    for (uint32_t first = 0; first < r->n; first += r->portion) {
        uint32_t count = r->n - first < r->portion ? r->n - first : r->portion;
        for (uint32_t i = 0; i < count; i++)
            r->idx[i] = r->lo + first + i;
        dp_split_gather(r->x, r->y, &split, r->idx, (int)count);
        float loss = dp_model_forward_backward(&r->m, r->x, r->y, (int)count, NULL);
        dp_axpy(g, (float)((double)count / r->n), r->m.grads, r->m.n_params);
        sum += (double)loss * count;
    }
    *f = sum / r->n;
    return 0;
}

#define PORTION 25
#define HISTORY 5

static void reference(float *out, const dp_train_config *cfg)
{
    static ref r;
    dp_err err;
    REQUIRE(dp_model_init(&r.m, SPEC, PORTION, 1, &err) == 0);
    dp_model_init_params(&r.m, 7);
    r.portion = PORTION;
    dp_lbfgs_local l;
    REQUIRE(dp_lbfgs_local_init(&l, r.m.n_params, HISTORY, r.m.params, ref_fn, &r,
                                &err) == 0);
    dp_lbfgs lb;
    dp_lbfgs_config c = dp_lbfgs_defaults();
    c.m = HISTORY;
    REQUIRE(dp_lbfgs_init(&lb, &c, &dp_lbfgs_local_ops, &l, &err) == 0);
    long spe = (NREC + cfg->batch - 1) / cfg->batch, batch = -1;
    for (long k = 0; k < spe * cfg->epochs; k++) {
        long j = k % spe;
        r.lo = (uint32_t)(j * cfg->batch);
        r.n = NREC - r.lo < (uint32_t)cfg->batch ? NREC - r.lo : (uint32_t)cfg->batch;
        if (j != batch) {
            REQUIRE(dp_lbfgs_start(&lb, &err) == 0);
            batch = j;
        }
        dp_lbfgs_iter it;
        REQUIRE(dp_lbfgs_iterate(&lb, &it, &err) == 0);
        CHECKF(it.accepted, "reference iteration %ld took no step", k + 1);
    }
    memcpy(out, dp_lbfgs_local_vec(&l, DP_LBFGS_X), r.m.n_params * sizeof(float));
    dp_lbfgs_local_free(&l);
    dp_model_free(&r.m);
}

static void run_cluster(task *tasks, const dp_train_config *cfg)
{
    dp_transport *ts[CHIEF_WORKERS_PS];
    dp_err err;
    REQUIRE(dp_inproc_open(ts, CHIEF_WORKERS_PS, &err) == 0);
    pthread_t th[CHIEF_WORKERS_PS];
    for (int r = 0; r < CHIEF_WORKERS_PS; r++) {
        memset(&tasks[r], 0, sizeof tasks[r]);
        tasks[r].cfg = *cfg;
        tasks[r].rank = r;
        tasks[r].t = ts[r];
        REQUIRE(pthread_create(&th[r], NULL, run_task, &tasks[r]) == 0);
    }
    for (int r = 0; r < CHIEF_WORKERS_PS; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < CHIEF_WORKERS_PS; r++)
        dp_transport_close(ts[r]);
}

static void test_against_one_process(int batch, int epochs, int straggler)
{
    dp_train_config cfg = dp_train_defaults();
    dp_err e;
    REQUIRE(dp_strategy_select(&cfg, "lbfgs", &e) == 0);
    cfg.model = SPEC;
    cfg.batch = batch;
    cfg.epochs = epochs;
    REQUIRE(dp_strategy_set(&cfg, "portion", "25", &e) == 0);
    REQUIRE(dp_strategy_set(&cfg, "lbfgs-history", "5", &e) == 0);
    /* 2 shards of 317 floats: below the option's bound, so by the field */
    REQUIRE(dp_strategy_set(&cfg, "ps-min-shard-bytes", "4096", &e) == 0);
    *(size_t *)(cfg.strategy_cfg + offsetof(dp_ps_settings, min_shard_bytes)) = 64;
    cfg.collective_timeout = 60;
    cfg.log_every = 0;
    cfg.straggler = straggler;
    cfg.straggler_ms = 30;
    float want[512];
    reference(want, &cfg);
    task tasks[CHIEF_WORKERS_PS];
    run_cluster(tasks, &cfg);
    int ok = 1;
    for (int r = 0; r < CHIEF_WORKERS_PS; r++) {
        CHECKF(tasks[r].rc == 0, "batch %d: rank %d: %s", batch, r, tasks[r].err.msg);
        ok &= tasks[r].rc == 0;
    }
    if (!ok)
        return;
    double worst = 0, moved = 0;
    dp_model m0;
    dp_err err;
    REQUIRE(dp_model_init(&m0, SPEC, 1, 1, &err) == 0);
    dp_model_init_params(&m0, 7);
    for (size_t i = 0; i < tasks[0].n_params; i++) {
        double d = fabs((double)tasks[0].params[i] - want[i]) / (1.0 + fabs((double)want[i]));
        worst = d > worst ? d : worst;
        moved += fabs((double)want[i] - m0.params[i]);
    }
    dp_model_free(&m0);
    fprintf(stderr, "batch %d, %d epoch(s), straggler %d: max relative diff against one process "
            "%.3g (the parameters moved %.3g in all); %ld portions, %ld backups, %ld duplicate "
            "results\n", batch, epochs, straggler, worst, moved, tasks[0].portions,
            tasks[0].backups, tasks[0].duplicates);
    CHECK(tasks[0].n_params == 317 && moved > 1);
    CHECKF(worst < 1e-4, "batch %d: Sandblaster differs from one process by %g", batch, worst);
    if (straggler >= 0)
        CHECKF(tasks[0].backups > 0, "a straggler, and no backup portion was handed out");
}

int main(void)
{
    dp_blas_set_threads(1);
    test_quadratic();
    test_logistic();
    dp_rng r;
    dp_rng_seed(&r, 3);
    for (size_t i = 0; i < sizeof images; i++)
        images[i] = (uint8_t)(dp_rng_uniform(&r) * 256);
    for (size_t i = 0; i < NREC; i++) /* a learnable rule: the class of the first pixels */
        labels[i] = (uint8_t)((images[i * DIM] + images[i * DIM + 1]) / 103);
    test_against_one_process(NREC, 12, -1);
    test_against_one_process(100, 4, -1);
    test_against_one_process(NREC, 6, 1);
    return CHECK_DONE();
}
