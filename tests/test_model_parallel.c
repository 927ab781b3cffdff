/* Model parallelism (src/strategy/model_parallel.c, mp_slice.c):
 * - the slices: balanced, covering every unit once, about 1/K of the
 *   parameters; gathered and scattered back (per task, and in the slice
 *   order ps shards hold) they are the model; a model
 *   with a layer narrower than K is refused naming --model-parallel;
 * - K = 2 and 3 tasks (and 2 replicas of 2, and of 1) on the in-process
 *   transport, one thread a task, over steps with a short last batch, sgd
 *   and adam: the parameters equal one process's at the same (global) batch
 *   within float noise, and so do the optimiser state a checkpoint gathers;
 * - the gradients of the sliced layers equal the whole model's;
 * - a task that dies ends its replica's steps with a message naming it. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "inproc_node.h"
#include "downpour/blas.h"
#include "downpour/checkpoint.h"
#include "downpour/inproc.h"
#include "downpour/rng.h"
#include "downpour/strategy.h"
#include "downpour/train.h"
#include "exec/mp_slice.h"

#define SPEC "20-16-12-8-5"
#define BATCH 16
#define STEPS 3
#define PER_REPLICA 45 /* records per replica: 16 + 16 + 13 */
#define MAX_TASKS 6
#define MAX_PARAMS 4096

static float data_x[MAX_TASKS * PER_REPLICA * 20];
static uint8_t data_y[MAX_TASKS * PER_REPLICA];

/* ------------------------------------------------------------- the slices */

static void test_slices(void)
{
    dp_model m;
    dp_err err;
    REQUIRE(dp_model_init(&m, SPEC, 1, 1, &err) == 0);
    dp_model_init_params(&m, 7);
    for (int K = 1; K <= 5; K++) {
        static float back[MAX_PARAMS], compact[MAX_PARAMS];
        memset(back, 0, sizeof back);
        size_t total = 0;
        for (int j = 0; j < K; j++) {
            mp_plan p;
            REQUIRE(mp_plan_make(&p, &m, K, j, &err) == 0);
            CHECK(p.n == 4);
            for (int d = 0; d < p.n; d++) {
                int u = p.layer[d].hi - p.layer[d].lo, out = p.layer[d].out;
                CHECKF(u == out / K || u == (out + K - 1) / K, "K %d task %d layer %d: %d units",
                       K, j, d, u);
            }
            total += p.floats;
            mp_gather(compact, m.params, &p);
            mp_scatter(back, compact, &p);
        }
        CHECKF(total == m.n_params, "K %d: the slices hold %zu of %zu parameters", K, total,
               m.n_params);
        CHECK(memcmp(back, m.params, m.n_params * sizeof(float)) == 0);
        /* slice order (ps shards): task j's slices at mp_order_offset, and back */
        mp_plan plans[5];
        for (int j = 0; j < K; j++)
            REQUIRE(mp_plan_make(&plans[j], &m, K, j, &err) == 0);
        static float order[MAX_PARAMS];
        mp_order_gather(order, m.params, plans, K);
        for (int j = 0; j < K; j++) {
            mp_gather(compact, m.params, &plans[j]);
            CHECK(memcmp(order + mp_order_offset(plans, j), compact,
                         plans[j].floats * sizeof(float)) == 0);
        }
        memset(back, 0, sizeof back);
        mp_order_scatter(back, order, plans, K);
        CHECK(memcmp(back, m.params, m.n_params * sizeof(float)) == 0);
    }
    mp_plan p;
    CHECK(mp_plan_make(&p, &m, 6, 0, &err) < 0 && strstr(err.msg, "--model-parallel 6") &&
          strstr(err.msg, "only 5 output units"));
    dp_model_free(&m);
    /* pack and unpack a column block */
    float a[3 * 5], b[3 * 2];
    for (int i = 0; i < 15; i++)
        a[i] = (float)i;
    mp_pack(b, a, 3, 5, 1, 3);
    CHECK(b[0] == 1 && b[1] == 2 && b[2] == 6 && b[5] == 12);
    memset(a, 0, sizeof a);
    mp_unpack(a, b, 3, 5, 1, 3);
    CHECK(a[1] == 1 && a[7] == 7 && a[0] == 0 && a[13] == 0);
}

/* ------------------------------------------------- against one process */

typedef struct job {
    dp_train_config cfg;
    int tasks, position, replicas, steps;
    dp_transport *t;
    int die_at;         /* step before which this task dies (0: never) */
    int save;           /* every task saves after the steps */
    int rc, wrote;
    dp_err err;
    float params[MAX_PARAMS];
    float slots[2 * MAX_PARAMS];
    long optim_t;
    size_t n_params;
} job;

/* Replica r's batch k: its share of the global batch k (one process's). */
static int replica_batch(int replicas, int r, int k, int steps, const float **x,
                         const uint8_t **y)
{
    int n = k < steps - 1 ? BATCH : PER_REPLICA - BATCH * (STEPS - 1);
    size_t row = (size_t)k * BATCH * replicas + (size_t)r * n;
    *x = data_x + row * 20;
    *y = data_y + row;
    return n;
}

static void *run_task(void *arg)
{
    job *j = arg;
    dp_node node;
    dp_model m;
    dp_train_state st;
    memset(&st, 0, sizeof st);
    j->rc = -1;
    inproc_node(&node, j->t, j->tasks, j->position);
    REQUIRE(dp_model_init(&m, SPEC, BATCH, 1, &j->err) == 0);
    dp_model_init_params(&m, 7);
    dp_split counted = {.n = (uint32_t)(PER_REPLICA * j->replicas)}; /* sizes the shards */
    dp_run_env env = {.cfg = &j->cfg, .node = &node, .model = &m, .train = &counted,
                      .n_train = counted.n, .steps_per_epoch = STEPS};
    dp_task_info info;
    memset(&info, 0, sizeof info);
    dp_strategy *s = NULL;
    const dp_strategy_ops *ops = &dp_strategy_model_parallel;
    if (ops->open(&s, &env, &info, &j->err) < 0)
        goto out;
    int replica = info.shard_index;
    CHECK(info.replicas == j->replicas && info.shard_count == j->replicas);
    for (int k = 0; k < j->steps; k++) {
        if (j->die_at == k + 1) {
            dp_err e;
            dp_inproc_kill(j->t, DP_INPROC_CRASH, &e);
            j->rc = 0;
            goto out;
        }
        const float *x;
        const uint8_t *y;
        int n = replica_batch(j->replicas, replica, k, j->steps, &x, &y);
        dp_step_out o;
        if (ops->step(s, x, y, n, j->cfg.optim.lr, k + 1, &o, &j->err) < 0)
            goto out;
    }
    dp_epoch_stats st_e = {.records = 1};
    if (ops->epoch_end(s, 1, &st_e, &j->err) < 0)
        goto out;
    if (info.evaluator) {
        const float *p = ops->params(s, DP_WEIGHTS_LIVE, &j->err);
        REQUIRE(p && m.n_params <= MAX_PARAMS);
        memcpy(j->params, p, m.n_params * sizeof(float));
        j->n_params = m.n_params;
        /* each replica's task 0 counts its records (1 each here) */
        CHECKF(st_e.records == j->replicas, "epoch records %g, want %d", st_e.records,
               j->replicas);
    }
    if (j->save) {
        int slots = dp_optim_slots(j->cfg.optim.kind);
        REQUIRE(dp_train_state_alloc(&st, m.n_params, slots, 0, 1, 0, &j->err) == 0);
        j->wrote = ops->save(s, j->steps, &st, &j->err);
        if (j->wrote < 0)
            goto out;
        if (j->wrote) {
            memcpy(j->params, st.params, m.n_params * sizeof(float));
            if (slots)
                memcpy(j->slots, st.slots, (size_t)slots * m.n_params * sizeof(float));
            j->optim_t = st.optim_t;
        }
    }
    j->rc = ops->finish(s, j->steps, &j->err);
out:
    /* a task that failed ends as its process would: its links close */
    if (j->rc < 0) {
        dp_err e;
        dp_inproc_kill(j->t, DP_INPROC_CRASH, &e);
    }
    ops->close(s);
    dp_train_state_free(&st);
    dp_model_free(&m);
    dp_cluster_free(&node.cluster);
    return NULL;
}

/* One process at the global batch over the same records: its parameters,
 * optimiser slots, and the gradients of its last step. */
static void reference(float *out, float *slots, float *grads, const dp_optim_config *oc,
                      int replicas, int steps)
{
    dp_model m;
    dp_optim opt;
    dp_err err;
    REQUIRE(dp_model_init(&m, SPEC, BATCH * replicas, 1, &err) == 0);
    dp_model_init_params(&m, 7);
    REQUIRE(dp_optim_init(&opt, oc, m.n_params, &err) == 0);
    for (int k = 0; k < steps; k++) {
        const float *x;
        const uint8_t *y;
        int n = replica_batch(replicas, 0, k, steps, &x, &y) * replicas;
        dp_model_forward_backward(&m, x, y, n, NULL);
        dp_optim_apply(&opt, m.params, m.grads, oc->lr);
    }
    memcpy(out, m.params, m.n_params * sizeof(float));
    if (slots && opt.state)
        memcpy(slots, opt.state, (size_t)dp_optim_slots(oc->kind) * m.n_params * sizeof(float));
    if (grads)
        memcpy(grads, m.grads, m.n_params * sizeof(float));
    dp_optim_free(&opt);
    dp_model_free(&m);
}

static void run_tasks(job *jobs, int tasks, const dp_train_config *cfg, int replicas, int steps,
                      int die_position, int save)
{
    dp_transport *ts[MAX_TASKS];
    dp_err err;
    REQUIRE(dp_inproc_open(ts, tasks, &err) == 0);
    pthread_t th[MAX_TASKS];
    for (int p = 0; p < tasks; p++) {
        memset(&jobs[p], 0, sizeof jobs[p]);
        jobs[p].cfg = *cfg;
        jobs[p].tasks = tasks;
        jobs[p].position = p;
        jobs[p].replicas = replicas;
        jobs[p].steps = steps;
        jobs[p].t = ts[p];
        jobs[p].save = save;
        jobs[p].die_at = p == die_position ? 2 : 0;
        REQUIRE(pthread_create(&th[p], NULL, run_task, &jobs[p]) == 0);
    }
    for (int p = 0; p < tasks; p++)
        pthread_join(th[p], NULL);
    for (int p = 0; p < tasks; p++)
        dp_transport_close(ts[p]);
}

static double max_rel_diff(const float *a, const float *b, size_t n)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / (1.0 + fabs((double)b[i]));
        worst = d > worst ? d : worst;
    }
    return worst;
}

static dp_train_config config(int K, const dp_optim_config *oc)
{
    dp_train_config cfg = dp_train_defaults();
    dp_err err;
    char k[16];
    snprintf(k, sizeof k, "%d", K);
    REQUIRE(dp_strategy_select(&cfg, "model-parallel", &err) == 0 &&
            (K == 0 || dp_strategy_set(&cfg, "model-parallel", k, &err) == 0));
    cfg.model = SPEC;
    cfg.batch = BATCH;
    cfg.optim = *oc;
    cfg.collective_timeout = 30;
    return cfg;
}

static void test_equal_to_one_process(void)
{
    static const int shapes[][2] = {{2, 1}, {3, 1}, {2, 2}, {1, 2}, {3, 2}}; /* K, R */
    for (int sc = 0; sc < 5; sc++)
        for (int o = 0; o < 2; o++) {
            dp_optim_kind ok = o ? DP_OPTIM_ADAM : DP_OPTIM_SGD;
            dp_optim_config oc = dp_optim_defaults(ok);
            oc.lr = o ? 0.01f : 0.2f;
            int K = shapes[sc][0], R = shapes[sc][1];
            static float ref[MAX_PARAMS], ref_slots[2 * MAX_PARAMS];
            reference(ref, ref_slots, NULL, &oc, R, STEPS);
            dp_train_config cfg = config(K, &oc);
            job jobs[MAX_TASKS];
            run_tasks(jobs, K * R, &cfg, R, STEPS, -1, 1);
            int ok_all = 1;
            for (int p = 0; p < K * R; p++) {
                CHECKF(jobs[p].rc == 0, "K %d R %d %s: position %d: %s", K, R,
                       dp_optim_kind_name(ok), p, jobs[p].err.msg);
                CHECKF(jobs[p].wrote == (p == 0), "K %d R %d: position %d save() %d", K, R, p,
                       jobs[p].wrote);
                ok_all &= jobs[p].rc == 0;
            }
            if (!ok_all)
                continue;
            size_t n = jobs[0].n_params;
            CHECK(n > 0);
            double worst = max_rel_diff(jobs[0].params, ref, n);
            int slots = dp_optim_slots(ok);
            double worst_slots = slots ? max_rel_diff(jobs[0].slots, ref_slots, slots * n) : 0;
            fprintf(stderr, "K %d R %d %-4s: max relative diff %.3g (optimiser state %.3g)\n", K,
                    R, dp_optim_kind_name(ok), worst, worst_slots);
            CHECKF(worst < 1e-5, "K %d R %d %s differs from one process by %g", K, R,
                   dp_optim_kind_name(ok), worst);
            CHECKF(worst_slots < 1e-5, "K %d R %d %s: optimiser state differs by %g", K, R,
                   dp_optim_kind_name(ok), worst_slots);
            CHECK(jobs[0].optim_t == STEPS);
        }
}

/* One sgd step with lr 1: what each sliced layer moved by is its gradient,
 * which must be the whole model's. */
static void test_gradients(void)
{
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_SGD);
    oc.lr = 1.0f;
    static float p0[MAX_PARAMS], p1[MAX_PARAMS], g[MAX_PARAMS];
    dp_optim_config none = oc;
    none.lr = 0.0f;
    reference(p0, NULL, NULL, &none, 1, 1);
    reference(p1, NULL, g, &oc, 1, 1);
    for (int K = 2; K <= 3; K++) {
        dp_train_config cfg = config(K, &oc);
        job jobs[3];
        run_tasks(jobs, K, &cfg, 1, 1, -1, 0);
        REQUIRE(jobs[0].rc == 0 && jobs[0].n_params > 0);
        double worst = 0, gmax = 0;
        for (size_t i = 0; i < jobs[0].n_params; i++) {
            double gi = (double)p0[i] - jobs[0].params[i];
            double d = fabs(gi - g[i]);
            worst = d > worst ? d : worst;
            gmax = fabs(g[i]) > gmax ? fabs(g[i]) : gmax;
        }
        fprintf(stderr, "K %d: gradients differ by %.3g at most (largest %.3g)\n", K, worst, gmax);
        CHECKF(worst < 1e-6 * (1 + gmax), "K %d: gradients differ by %g", K, worst);
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Task 1 of 3 dies before step 2: task 0 stops naming it, task 2 naming
 * it or task 0 (which stopped first), both at once, not after the timeout. */
static void test_lost_task(void)
{
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_SGD);
    dp_train_config cfg = config(3, &oc);
    job jobs[3];
    double t0 = now_s();
    run_tasks(jobs, 3, &cfg, 1, STEPS, 1, 0);
    double took = now_s() - t0;
    CHECKF(jobs[0].rc < 0 && strstr(jobs[0].err.msg, "lost model-parallel task 1 of replica 0"),
           "position 0: rc %d, %s", jobs[0].rc, jobs[0].err.msg);
    CHECKF(jobs[2].rc < 0 && strstr(jobs[2].err.msg, "lost model-parallel task"),
           "position 2: rc %d, %s", jobs[2].rc, jobs[2].err.msg);
    for (int p = 0; p < 3; p += 2)
        fprintf(stderr, "position %d: %s\n", p, jobs[p].err.msg);
    CHECKF(took < 10, "the tasks took %.1f s to stop (the timeout is %g s)", took,
           cfg.collective_timeout);
    /* a cluster that is not a whole number of replicas */
    cfg = config(2, &oc);
    run_tasks(jobs, 3, &cfg, 1, STEPS, -1, 0);
    CHECKF(jobs[0].rc < 0 && strstr(jobs[0].err.msg, "--model-parallel 2") &&
           strstr(jobs[0].err.msg, "whole number of replicas"), "%s", jobs[0].err.msg);
}

int main(void)
{
    dp_blas_set_threads(1);
    dp_rng r;
    dp_rng_seed(&r, 3);
    for (size_t i = 0; i < sizeof data_x / sizeof data_x[0]; i++)
        data_x[i] = dp_rng_uniform(&r) * 2 - 1;
    for (size_t i = 0; i < sizeof data_y; i++)
        data_y[i] = (uint8_t)(dp_rng_uniform(&r) * 5) % 5;
    test_slices();
    test_equal_to_one_process();
    test_gradients();
    test_lost_task();
    return CHECK_DONE();
}
