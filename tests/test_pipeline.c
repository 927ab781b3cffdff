/* Layer pipelining (src/strategy/pipeline.c, pipeline_plan.c):
 * - the schedules: every micro-batch forwarded and backwarded once per
 *   stage, in an order that respects the dependencies between stages (a
 *   simulation of all stages runs every schedule to its end), 1f1b holds at
 *   most min(S-s, M) <= S micro-batches, gpipe M;
 * - the partition: balanced by cost, cut after a relu; --split checked;
 * - S = 2 and 3 stages (and 2 replicas of 2 stages, and of 1) on the in-process
 *   transport, one thread a stage, M = 1, 4 and 8, both schedules, sgd and
 *   adam, over steps with a short last batch: the parameters equal one
 *   process's at the same batch within float noise; the instrumented peak of
 *   micro-batches held is what the schedule says; the same for a model of
 *   residual blocks (identity and projection), whose stages start only
 *   between blocks (resnet-fashion's too, at 2 to 8 stages); and for
 *   vit-mnist on 2 stages (cut between its transformer blocks), both
 *   schedules, sgd;
 * - batch norm (a conv+bn model with a residual block of bn): with 1
 *   micro-batch a step, 2 and 3 stages equal one process bit for bit,
 *   parameters and buffers (running statistics and counts); with 4 each
 *   stage's buffers move once per micro-batch and position 0 holds every
 *   stage's (replica 0's under 2 replicas); a checkpoint at step 2 resumed
 *   to step 3 equals the uninterrupted run bit for bit; a stage's buffers
 *   frame with a count other than its layers' in the model, or longer than
 *   the model's buffers, is refused by position 0 naming the stage;
 * - a stage that dies ends its neighbours' steps with a message naming it. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "inproc_node.h"
#include "downpour/blas.h"
#include "downpour/checkpoint.h"
#include "downpour/inproc.h"
#include "downpour/pipeline.h"
#include "downpour/rng.h"
#include "downpour/strategy.h"
#include "downpour/train.h"
#include "downpour/wire.h"

/* ---------------------------------------------------------------- schedules */

/* Runs every stage's schedule as far as the dependencies let it (a forward
 * needs the previous stage's forward of that micro-batch, a backward the next
 * stage's backward and its own forward); 1 when every stage finishes. */
static int simulate(dp_pipe_schedule kind, int S, int M)
{
    dp_pipe_action a[8][64];
    int pos[8] = {0}, n[8];
    unsigned char fdone[8][32] = {{0}}, bdone[8][32] = {{0}};
    for (int s = 0; s < S; s++)
        n[s] = dp_pipe_schedule_make(a[s], kind, s, S, M);
    for (int progress = 1; progress;) {
        progress = 0;
        for (int s = 0; s < S; s++) {
            if (pos[s] == n[s])
                continue;
            dp_pipe_action x = a[s][pos[s]];
            int ok = x.op == DP_PIPE_FORWARD ? (s == 0 || fdone[s - 1][x.micro])
                                             : (fdone[s][x.micro] &&
                                                (s == S - 1 || bdone[s + 1][x.micro]));
            if (!ok)
                continue;
            (x.op == DP_PIPE_FORWARD ? fdone : bdone)[s][x.micro] = 1;
            pos[s]++;
            progress = 1;
        }
    }
    for (int s = 0; s < S; s++)
        if (pos[s] != n[s])
            return 0;
    return 1;
}

static void test_schedules(void)
{
    for (int kind = 0; kind < DP_PIPE_SCHEDULE_COUNT; kind++)
        for (int S = 1; S <= 6; S++)
            for (int M = 1; M <= 12; M++) {
                for (int s = 0; s < S; s++) {
                    dp_pipe_action a[64];
                    int n = dp_pipe_schedule_make(a, (dp_pipe_schedule)kind, s, S, M);
                    CHECKF(n == 2 * M, "%s S %d M %d stage %d: %d actions",
                           dp_pipe_schedule_name(kind), S, M, s, n);
                    int fwd[16] = {0}, bwd[16] = {0}, next_b = 0, ordered = 1, after = 1;
                    for (int i = 0; i < n; i++) {
                        if (a[i].op == DP_PIPE_FORWARD) {
                            fwd[a[i].micro]++;
                        } else {
                            bwd[a[i].micro]++;
                            after &= fwd[a[i].micro] == 1;
                            ordered &= a[i].micro == next_b++;
                        }
                    }
                    for (int m = 0; m < M; m++)
                        CHECKF(fwd[m] == 1 && bwd[m] == 1, "%s S %d M %d stage %d micro %d: %d "
                               "forwards, %d backwards", dp_pipe_schedule_name(kind), S, M, s,
                               m, fwd[m], bwd[m]);
                    CHECK(after && ordered);
                    int peak = dp_pipe_schedule_peak(a, n);
                    int want = kind == DP_PIPE_GPIPE ? M : (S - s < M ? S - s : M);
                    CHECKF(peak == want, "%s S %d M %d stage %d: peak %d, want %d",
                           dp_pipe_schedule_name(kind), S, M, s, peak, want);
                    CHECK(kind == DP_PIPE_GPIPE || peak <= S);
                }
                CHECKF(simulate((dp_pipe_schedule)kind, S, M), "%s S %d M %d deadlocks",
                       dp_pipe_schedule_name(kind), S, M);
            }
    dp_pipe_action a[4];
    CHECK(dp_pipe_schedule_make(a, DP_PIPE_1F1B, 2, 2, 2) == -1);
    CHECK(dp_pipe_schedule_make(a, DP_PIPE_1F1B, 0, 2, 0) == -1);
    dp_pipe_schedule k;
    dp_err err;
    CHECK(dp_pipe_schedule_parse("gpipe", &k, &err) == 0 && k == DP_PIPE_GPIPE);
    CHECK(dp_pipe_schedule_parse("1f1b", &k, &err) == 0 && k == DP_PIPE_1F1B);
    CHECK(dp_pipe_schedule_parse("zb", &k, &err) < 0 && strstr(err.msg, "gpipe, 1f1b"));
}

/* --------------------------------------------------------------- partitions */

static void test_partition(void)
{
    dp_model m;
    dp_err err;
    int first[DP_PIPE_MAX_STAGES + 1];
    REQUIRE(dp_model_init(&m, "784-300-100-10", 1, 1, &err) == 0);
    REQUIRE(m.n_layers == 6);
    CHECK(dp_pipe_partition(first, &m, 1, NULL, &err) == 0 && first[0] == 0 && first[1] == 6);
    CHECK(dp_pipe_partition(first, &m, 2, NULL, &err) == 0 && first[1] == 2 && first[2] == 6);
    CHECK(dp_pipe_partition(first, &m, 3, NULL, &err) == 0 && first[1] == 2 && first[2] == 4);
    /* more stages than places after a relu: every layer its own stage */
    CHECK(dp_pipe_partition(first, &m, 6, NULL, &err) == 0);
    for (int s = 0; s <= 6; s++)
        CHECK(first[s] == s);
    CHECK(dp_pipe_partition(first, &m, 7, NULL, &err) < 0 && strstr(err.msg, "--stages 7"));
    CHECK(dp_pipe_partition(first, &m, 3, "1,5", &err) == 0 && first[1] == 1 && first[2] == 5 &&
          first[3] == 6);
    CHECK(dp_pipe_partition(first, &m, 3, "4,4", &err) < 0 && strstr(err.msg, "--split"));
    CHECK(dp_pipe_partition(first, &m, 3, "2,6", &err) < 0 && strstr(err.msg, "--split"));
    CHECK(dp_pipe_partition(first, &m, 2, "2,4", &err) < 0 && strstr(err.msg, "3 stages"));
    CHECK(dp_pipe_split_count("2,4", &err) == 3);
    CHECK(dp_pipe_split_count("2,,4", &err) < 0);
    CHECK(dp_pipe_split_count("", &err) < 0);
    size_t lo, hi;
    dp_pipe_param_range(&m, 2, 6, &lo, &hi);
    CHECK(lo == 784 * 300 + 300 && hi == m.n_params);
    dp_pipe_param_range(&m, 1, 2, &lo, &hi);
    CHECK(lo == hi);
    dp_model_free(&m);
    /* a deeper stack balances by cost */
    REQUIRE(dp_model_init(&m, "100-100-100-100-100-10", 1, 1, &err) == 0);
    CHECK(dp_pipe_partition(first, &m, 2, NULL, &err) == 0 && first[1] == 4);
    dp_model_free(&m);
    int total = 0, off, prev_end = 0;
    for (int k = 0; k < 8; k++) {
        int r = dp_pipe_micro_size(13, 8, k, &off);
        CHECK(off == prev_end && (r == 1 || r == 2));
        prev_end = off + r;
        total += r;
    }
    CHECK(total == 13);
}

/* ------------------------------------------------- against one process */

/* the model: a dense stack, then one of residual blocks (identity and
 * projection shortcuts), whose stages start only between blocks */
static const char *spec = "20-16-12-8-5";
#define RES_SPEC "20-res(16-dense20)-relu-res(12-dense8|dense8)-relu-5"
#define BATCH 16
#define STEPS 3
#define PER_REPLICA 45 /* records per replica: 16 + 16 + 13 */
#define MAX_TASKS 6
#define MAX_INPUTS 784
#define MAX_PARAMS 80000 /* vit-mnist: 71,946 */
#define MAX_BUFFERS 64
#define BN_SPEC                                                                           \
    "1x4x5-conv3x3x4p1-bn-relu-res(conv3x3x4p1-bn-relu-conv3x3x4p1-bn)-relu-dense8-bn-relu-5"

static int n_inputs = 20; /* the model's */
static float data_x[MAX_TASKS / 2 * PER_REPLICA * MAX_INPUTS];
static uint8_t data_y[MAX_TASKS / 2 * PER_REPLICA];

typedef struct job {
    dp_train_config cfg;
    int tasks, position, replicas;
    dp_transport *t;
    int die_at;         /* step before which this stage dies (0: never) */
    int rc;
    dp_err err;
    int peak;
    float *params; /* the evaluator's: stage_params[position] */
    size_t n_params;
    float buffers[MAX_BUFFERS]; /* this position's model's after the epoch */
    size_t n_buffers;
    int first_step;              /* steps [first_step, STEPS) (0: all) */
    int save_at;                 /* a checkpoint after this step (0: none) */
    dp_train_state *state;       /* position 0's, written at save_at */
    const dp_train_state *resume; /* every position starts from it */
} job;

/* Replica r's batch k: rows of the global batch k (one process's) that are
 * its share. */
static int replica_batch(int replicas, int r, int k, const float **x, const uint8_t **y)
{
    int n = k < STEPS - 1 ? BATCH : PER_REPLICA - BATCH * (STEPS - 1);
    size_t row = (size_t)k * BATCH * replicas + (size_t)r * n;
    *x = data_x + row * n_inputs;
    *y = data_y + row;
    return n;
}

static void *run_stage(void *arg)
{
    job *j = arg;
    dp_node node;
    dp_model m;
    j->rc = -1;
    inproc_node(&node, j->t, j->tasks, j->position);
    REQUIRE(dp_model_init(&m, spec, BATCH, 1, &j->err) == 0);
    dp_model_init_params(&m, 7);
    REQUIRE(m.n_buffers <= MAX_BUFFERS);
    if (j->resume) { /* as the loop does: every task takes the file's */
        memcpy(m.params, j->resume->params, m.n_params * sizeof(float));
        if (m.n_buffers)
            memcpy(m.buffers, j->resume->buffers, m.n_buffers * sizeof(float));
    }
    dp_split counted = {.n = (uint32_t)(PER_REPLICA * j->replicas)}; /* sizes the shards */
    dp_run_env env = {.cfg = &j->cfg, .node = &node, .model = &m, .train = &counted,
                      .n_train = counted.n, .steps_per_epoch = STEPS, .resume = j->resume};
    dp_task_info info;
    memset(&info, 0, sizeof info);
    dp_strategy *s = NULL;
    const dp_strategy_ops *ops = &dp_strategy_pipeline;
    if (ops->open(&s, &env, &info, &j->err) < 0)
        goto out;
    int replica = info.shard_index;
    CHECK(info.replicas == j->replicas && info.shard_count == j->replicas);
    for (int k = j->first_step; k < STEPS; k++) {
        if (j->die_at == k + 1) {
            dp_err e;
            dp_inproc_kill(j->t, DP_INPROC_CRASH, &e);
            j->rc = 0;
            goto out;
        }
        const float *x;
        const uint8_t *y;
        int n = replica_batch(j->replicas, replica, k, &x, &y);
        dp_step_out o;
        if (ops->step(s, x, y, n, j->cfg.optim.lr, k + 1, &o, &j->err) < 0)
            goto out;
        if (j->save_at == k + 1) {
            int rc = ops->save(s, k + 1, j->state, &j->err);
            if (rc < 0)
                goto out;
            CHECK(rc == (info.evaluator ? 1 : 0));
            if (info.evaluator) { /* what the loop's writer takes: the model's buffers */
                j->state->step = k + 1;
                if (m.n_buffers)
                    memcpy(j->state->buffers, m.buffers, m.n_buffers * sizeof(float));
            }
        }
    }
    dp_epoch_stats st = {.records = 1};
    if (ops->epoch_end(s, 1, &st, &j->err) < 0)
        goto out;
    j->peak = dp_pipeline_peak(s);
    if (info.evaluator) {
        const float *p = ops->params(s, DP_WEIGHTS_LIVE, &j->err);
        REQUIRE(p && m.n_params <= MAX_PARAMS);
        memcpy(j->params, p, m.n_params * sizeof(float));
        j->n_params = m.n_params;
    }
    if (m.n_buffers)
        memcpy(j->buffers, m.buffers, m.n_buffers * sizeof(float));
    j->n_buffers = m.n_buffers;
    j->rc = ops->finish(s, STEPS, &j->err);
out:
    ops->close(s);
    dp_model_free(&m);
    dp_cluster_free(&node.cluster);
    return NULL;
}

/* One process at the global batch over the same records; its buffers. */
static float ref_buffers[MAX_BUFFERS];

static void reference(float *out, const dp_optim_config *oc, int replicas)
{
    dp_model m;
    dp_optim opt;
    dp_err err;
    REQUIRE(dp_model_init(&m, spec, BATCH * replicas, 1, &err) == 0);
    dp_model_init_params(&m, 7);
    REQUIRE(dp_optim_init(&opt, oc, m.n_params, &err) == 0);
    for (int k = 0; k < STEPS; k++) {
        const float *x;
        const uint8_t *y;
        int n = replica_batch(replicas, 0, k, &x, &y) * replicas;
        dp_model_forward_backward(&m, x, y, n, NULL);
        dp_optim_apply(&opt, m.params, m.grads, oc->lr);
    }
    memcpy(out, m.params, m.n_params * sizeof(float));
    REQUIRE(m.n_buffers <= MAX_BUFFERS);
    if (m.n_buffers)
        memcpy(ref_buffers, m.buffers, m.n_buffers * sizeof(float));
    dp_optim_free(&opt);
    dp_model_free(&m);
}

/* Runs the stages in threads; returns the evaluator's job (position 0). */
static void run_pipeline_from(job *jobs, int tasks, const dp_train_config *cfg, int replicas,
                              int die_position, int first_step, int save_at,
                              dp_train_state *state, const dp_train_state *resume)
{
    static float stage_params[MAX_TASKS][MAX_PARAMS];
    dp_transport *ts[MAX_TASKS];
    dp_err err;
    REQUIRE(dp_inproc_open(ts, tasks, &err) == 0);
    pthread_t th[MAX_TASKS];
    for (int p = 0; p < tasks; p++) {
        memset(&jobs[p], 0, sizeof jobs[p]);
        jobs[p].cfg = *cfg;
        jobs[p].params = stage_params[p];
        jobs[p].tasks = tasks;
        jobs[p].position = p;
        jobs[p].replicas = replicas;
        jobs[p].t = ts[p];
        jobs[p].die_at = p == die_position ? 2 : 0;
        jobs[p].first_step = first_step;
        jobs[p].save_at = save_at;
        jobs[p].state = state;
        jobs[p].resume = resume;
        REQUIRE(pthread_create(&th[p], NULL, run_stage, &jobs[p]) == 0);
    }
    for (int p = 0; p < tasks; p++)
        pthread_join(th[p], NULL);
    for (int p = 0; p < tasks; p++)
        dp_transport_close(ts[p]);
}

static void run_pipeline(job *jobs, int tasks, const dp_train_config *cfg, int replicas,
                         int die_position)
{
    run_pipeline_from(jobs, tasks, cfg, replicas, die_position, 0, 0, NULL, NULL);
}

/* The run's configuration: S stages of the model spec, M micro-batches. */
static dp_train_config pipe_config(int S, int M, dp_pipe_schedule kind, const dp_optim_config *oc)
{
    dp_train_config cfg = dp_train_defaults();
    cfg.model = spec;
    cfg.batch = BATCH;
    dp_err err;
    char v[16];
    REQUIRE(dp_strategy_select(&cfg, "pipeline", &err) == 0);
    snprintf(v, sizeof v, "%d", S);
    REQUIRE(dp_strategy_set(&cfg, "stages", v, &err) == 0);
    snprintf(v, sizeof v, "%d", M);
    REQUIRE(dp_strategy_set(&cfg, "micro-batches", v, &err) == 0);
    REQUIRE(dp_strategy_set(&cfg, "schedule", dp_pipe_schedule_name(kind), &err) == 0);
    cfg.optim = *oc;
    cfg.collective_timeout = 30;
    return cfg;
}

/* S stages of R replicas, M micro-batches, against ref (one process's
 * parameters at the global batch). */
static void check_config(int S, int R, int M, dp_pipe_schedule kind, const dp_optim_config *oc,
                         const float *ref)
{
    dp_train_config cfg = pipe_config(S, M, kind, oc);
    job jobs[MAX_TASKS];
    run_pipeline(jobs, S * R, &cfg, R, -1);
    int ok_all = 1;
    for (int p = 0; p < S * R; p++) {
        CHECKF(jobs[p].rc == 0, "%s S %d R %d M %d %s: position %d: %s", spec, S, R, M,
               dp_pipe_schedule_name(kind), p, jobs[p].err.msg);
        ok_all &= jobs[p].rc == 0;
        int s = p % S;
        int want = kind == DP_PIPE_GPIPE ? M : (S - s < M ? S - s : M);
        CHECKF(jobs[p].peak == want, "S %d M %d %s stage %d held %d micro-batches, want %d", S,
               M, dp_pipe_schedule_name(kind), s, jobs[p].peak, want);
        CHECK(kind == DP_PIPE_GPIPE || jobs[p].peak <= S);
    }
    if (!ok_all)
        return;
    double worst = 0;
    for (size_t i = 0; i < jobs[0].n_params; i++) {
        double d = fabs((double)jobs[0].params[i] - ref[i]) / (1.0 + fabs((double)ref[i]));
        worst = d > worst ? d : worst;
    }
    CHECK(jobs[0].n_params > 0);
    fprintf(stderr, "%s S %d R %d M %d %-5s %-4s: max relative diff %.3g\n", spec, S, R, M,
            dp_pipe_schedule_name(kind), dp_optim_kind_name(oc->kind), worst);
    CHECKF(worst < 1e-5, "%s S %d R %d M %d %s %s differs from one process by %g", spec, S, R, M,
           dp_pipe_schedule_name(kind), dp_optim_kind_name(oc->kind), worst);
}

static dp_optim_config optim_config(int adam)
{
    dp_optim_config oc = dp_optim_defaults(adam ? DP_OPTIM_ADAM : DP_OPTIM_SGD);
    oc.lr = adam ? 0.01f : 0.2f;
    return oc;
}

static void test_equal_to_one_process(void)
{
    static const int stage_counts[][2] = {{2, 1}, {3, 1}, {2, 2}, {1, 2}}; /* S, R */
    static const int micro[] = {1, 4, 8};
    static float ref[MAX_PARAMS];
    for (int sc = 0; sc < 4; sc++)
        for (int o = 0; o < 2; o++) {
            dp_optim_config oc = optim_config(o);
            int S = stage_counts[sc][0], R = stage_counts[sc][1];
            reference(ref, &oc, R);
            for (int mi = 0; mi < 3; mi++)
                for (int kind = 0; kind < DP_PIPE_SCHEDULE_COUNT; kind++)
                    check_config(S, R, micro[mi], (dp_pipe_schedule)kind, &oc, ref);
        }
}

/* vit-mnist on 2 stages: the cut falls between its blocks (the tokens
 * cross it), and the run equals one process, under both schedules, with sgd
 * (adam, whose step is about lr wherever a gradient is about 0, takes float
 * noise in vit's near-zero gradients to 1e-5 of the parameters). */
static void test_vit(void)
{
    static float ref[MAX_PARAMS];
    dp_model m;
    dp_err err;
    int first[DP_PIPE_MAX_STAGES + 1];
    REQUIRE(dp_model_init(&m, "vit-mnist", 1, 1, &err) == 0);
    REQUIRE(dp_pipe_partition(first, &m, 2, NULL, &err) == 0);
    CHECKF(dp_model_cut_ok(&m, first[1]), "vit-mnist: stage 1 starts at layer %d, inside a block",
           first[1]);
    dp_model_free(&m);
    spec = "vit-mnist";
    n_inputs = 784;
    dp_optim_config oc = optim_config(0);
    reference(ref, &oc, 1);
    for (int kind = 0; kind < DP_PIPE_SCHEDULE_COUNT; kind++)
        check_config(2, 1, 4, (dp_pipe_schedule)kind, &oc, ref);
}

/* A residual model's stages start only between its blocks, cut by the cost
 * or by --split. */
static void test_residual_partition(void)
{
    dp_model m;
    dp_err err;
    int first[DP_PIPE_MAX_STAGES + 1];
    REQUIRE(dp_model_init(&m, "resnet-fashion", 1, 1, &err) == 0);
    for (int S = 2; S <= 8; S++) {
        REQUIRE(dp_pipe_partition(first, &m, S, NULL, &err) == 0);
        for (int k = 1; k < S; k++)
            CHECKF(dp_model_cut_ok(&m, first[k]), "%d stages: stage %d starts at layer %d, "
                   "inside a block", S, k, first[k]);
    }
    dp_model_free(&m);
    REQUIRE(dp_model_init(&m, RES_SPEC, 1, 1, &err) == 0);
    CHECK(dp_pipe_partition(first, &m, 2, "2", &err) < 0 && strstr(err.msg, "residual block"));
    CHECK(dp_pipe_partition(first, &m, 2, "5", &err) == 0 && first[1] == 5);
    /* 13 layers, but 5 places to cut between blocks */
    CHECK(dp_pipe_partition(first, &m, 6, NULL, &err) == 0);
    CHECK(dp_pipe_partition(first, &m, 7, NULL, &err) < 0 && strstr(err.msg, "5 places"));
    dp_model_free(&m);
}

/* ------------------------------------------------------------ batch norm */

/* Every position's buffers [lo, hi) (its stage's) equal position 0's copy
 * of them: what it gathered is the stage's own. */
static void check_gathered(const job *jobs, int S, const char *what)
{
    dp_model m;
    dp_err err;
    int first[DP_PIPE_MAX_STAGES + 1];
    REQUIRE(dp_model_init(&m, spec, 1, 1, &err) == 0);
    REQUIRE(dp_pipe_partition(first, &m, S, NULL, &err) == 0);
    for (int p = 1; p < S; p++) {
        size_t lo, hi;
        dp_pipe_buffer_range(&m, first[p], first[p + 1], &lo, &hi);
        CHECKF(hi > lo, "%s: stage %d holds no bn layer", what, p);
        CHECKF(memcmp(jobs[0].buffers + lo, jobs[p].buffers + lo, (hi - lo) * sizeof(float)) == 0,
               "%s: position 0's buffers [%zu, %zu) are not stage %d's", what, lo, hi, p);
    }
    dp_model_free(&m);
}

/* The largest |a - b| over n floats. */
static double max_diff(const float *a, const float *b, size_t n)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        worst = d > worst ? d : worst;
    }
    return worst;
}

static void test_batch_norm(void)
{
    static float ref[MAX_PARAMS];
    const char *saved_spec = spec;
    spec = BN_SPEC;
    n_inputs = 20;
    dp_model m;
    dp_err err;
    REQUIRE(dp_model_init(&m, spec, 1, 1, &err) == 0);
    size_t nb = m.n_buffers, np = m.n_params;
    /* the buffers of the last bn layer: its count of batches at 2C */
    const dp_layer *last_bn = NULL;
    for (int l = 0; l < m.n_layers; l++)
        if (m.layers[l].s_len)
            last_bn = &m.layers[l];
    REQUIRE(last_bn && nb > 0);
    size_t count_at = last_bn->s_off + last_bn->s_len - 1;
    dp_model_free(&m);
    /* 1 micro-batch: one process, bit for bit, parameters and buffers */
    for (int adam = 0; adam < 2; adam++) {
        dp_optim_config oc = optim_config(adam);
        reference(ref, &oc, 1);
        for (int S = 2; S <= 3; S++)
            for (int kind = 0; kind < DP_PIPE_SCHEDULE_COUNT; kind++) {
                dp_train_config cfg = pipe_config(S, 1, (dp_pipe_schedule)kind, &oc);
                job jobs[MAX_TASKS];
                run_pipeline(jobs, S, &cfg, 1, -1);
                int ok = 1;
                for (int p = 0; p < S; p++) {
                    CHECKF(jobs[p].rc == 0, "bn S %d M 1: position %d: %s", S, p, jobs[p].err.msg);
                    ok &= jobs[p].rc == 0;
                }
                if (!ok)
                    continue;
                double dp = max_diff(jobs[0].params, ref, np);
                double db = max_diff(jobs[0].buffers, ref_buffers, nb);
                fprintf(stderr, "bn S %d M 1 %-5s %-4s: parameters %.3g, buffers %.3g from one "
                        "process\n", S, dp_pipe_schedule_name(kind),
                        dp_optim_kind_name(oc.kind), dp, db);
                CHECKF(dp == 0 && db == 0, "bn S %d M 1 %s: parameters differ by %g, buffers by "
                       "%g from one process", S, dp_pipe_schedule_name(kind), dp, db);
                CHECK(jobs[0].buffers[count_at] == (float)STEPS);
                check_gathered(jobs, S, "bn M 1");
            }
    }
    /* 4 micro-batches: the statistics move once a micro-batch (3 steps of
     * 4); position 0 holds each stage's own; 2 replicas: replica 0's */
    for (int R = 1; R <= 2; R++) {
        dp_optim_config oc = optim_config(0);
        dp_train_config cfg = pipe_config(2, 4, DP_PIPE_1F1B, &oc);
        job jobs[MAX_TASKS];
        run_pipeline(jobs, 2 * R, &cfg, R, -1);
        int ok = 1;
        for (int p = 0; p < 2 * R; p++) {
            CHECKF(jobs[p].rc == 0, "bn S 2 R %d M 4: position %d: %s", R, p, jobs[p].err.msg);
            ok &= jobs[p].rc == 0;
        }
        if (!ok)
            continue;
        CHECKF(jobs[0].buffers[count_at] == (float)(STEPS * 4), "bn M 4: %g batches counted",
               (double)jobs[0].buffers[count_at]);
        check_gathered(jobs, 2, R == 1 ? "bn M 4" : "bn M 4, 2 replicas");
        if (R == 2) /* replica 1's own statistics, from its own records */
            CHECK(memcmp(jobs[1].buffers, jobs[3].buffers, nb * sizeof(float)) != 0);
    }
    /* a checkpoint at step 2, resumed to step 3: bit for bit (adam: its
     * slots and t come back too) */
    {
        dp_optim_config oc = optim_config(1);
        dp_train_config cfg = pipe_config(2, 4, DP_PIPE_GPIPE, &oc);
        dp_train_state st;
        memset(&st, 0, sizeof st);
        REQUIRE(dp_train_state_alloc(&st, np, 2, 0, 1, 0, &err) == 0);
        REQUIRE((st.buffers = calloc(nb, sizeof(float))) != NULL);
        st.n_buffers = nb;
        job whole[2], resumed[2];
        run_pipeline_from(whole, 2, &cfg, 1, -1, 0, 2, &st, NULL);
        CHECKF(whole[0].rc == 0 && whole[1].rc == 0, "bn checkpoint run: %s / %s",
               whole[0].err.msg, whole[1].err.msg);
        CHECK(st.step == 2 && st.optim_t == 2 && st.buffers[count_at] == 8);
        static float whole_params[MAX_PARAMS];
        float whole_buffers[MAX_BUFFERS];
        memcpy(whole_params, whole[0].params, np * sizeof(float));
        memcpy(whole_buffers, whole[0].buffers, nb * sizeof(float));
        run_pipeline_from(resumed, 2, &cfg, 1, -1, 2, 0, NULL, &st);
        CHECKF(resumed[0].rc == 0 && resumed[1].rc == 0, "bn resumed run: %s / %s",
               resumed[0].err.msg, resumed[1].err.msg);
        CHECKF(memcmp(resumed[0].params, whole_params, np * sizeof(float)) == 0 &&
               memcmp(resumed[0].buffers, whole_buffers, nb * sizeof(float)) == 0,
               "bn: the run resumed at step 2 differs from the whole run: parameters by %g, "
               "buffers by %g", max_diff(resumed[0].params, whole_params, np),
               max_diff(resumed[0].buffers, whole_buffers, nb));
        dp_train_state_free(&st);
    }
    spec = saved_spec;
}

/* Position 0 at an epoch's end, from a fake stage 1 that sends its figures,
 * its parameters and a buffers frame of `count` floats in `len` bytes:
 * position 0's error in err (rc < 0), or rc 0. */
static int gather_from_fake(uint32_t count, uint64_t len, dp_err *err)
{
    dp_transport *ts[2];
    REQUIRE(dp_inproc_open(ts, 2, err) == 0);
    dp_node node;
    dp_model m;
    inproc_node(&node, ts[0], 2, 0);
    REQUIRE(dp_model_init(&m, spec, BATCH, 1, err) == 0);
    int first[DP_PIPE_MAX_STAGES + 1];
    REQUIRE(dp_pipe_partition(first, &m, 2, NULL, err) == 0);
    size_t lo, hi, blo, bhi;
    dp_pipe_param_range(&m, first[1], first[2], &lo, &hi);
    dp_pipe_buffer_range(&m, first[1], first[2], &blo, &bhi);
    REQUIRE(bhi > blo);
    static uint8_t frame[4 + 4 * (MAX_PARAMS + MAX_BUFFERS)];
    memset(frame, 0, sizeof frame);
    dp_put_u32(frame + 44, 1); /* the stats: stage 1 */
    REQUIRE(dp_transport_send(ts[1], 0, DP_WIRE_PIPE_STATS, 1, 0, frame, 48, err) == 0);
    REQUIRE(dp_transport_send(ts[1], 0, DP_WIRE_PIPE_PARAMS, 1, lo, frame,
                              (hi - lo) * sizeof(float), err) == 0);
    dp_put_u32(frame, count);
    REQUIRE(len <= sizeof frame);
    REQUIRE(dp_transport_send(ts[1], 0, DP_WIRE_PIPE_BUFFERS, 1, blo, frame, len, err) == 0);
    dp_train_config cfg = dp_train_defaults();
    cfg.model = spec;
    cfg.batch = BATCH;
    REQUIRE(dp_strategy_select(&cfg, "pipeline", err) == 0 &&
            dp_strategy_set(&cfg, "stages", "2", err) == 0);
    cfg.collective_timeout = 5;
    dp_split counted = {.n = PER_REPLICA};
    dp_run_env env = {.cfg = &cfg, .node = &node, .model = &m, .train = &counted,
                      .n_train = counted.n, .steps_per_epoch = STEPS};
    dp_task_info info;
    memset(&info, 0, sizeof info);
    dp_strategy *s = NULL;
    const dp_strategy_ops *ops = &dp_strategy_pipeline;
    REQUIRE(ops->open(&s, &env, &info, err) == 0);
    dp_epoch_stats st = {.records = 1};
    int rc = ops->epoch_end(s, 1, &st, err);
    ops->close(s);
    dp_model_free(&m);
    dp_cluster_free(&node.cluster);
    dp_transport_close(ts[0]);
    dp_transport_close(ts[1]);
    if (rc == 0) { /* what came was stage 1's buffers */
        CHECK(count == bhi - blo);
    }
    return rc;
}

static void test_buffers_refused(void)
{
    const char *saved_spec = spec;
    spec = BN_SPEC;
    dp_model m;
    dp_err err;
    int first[DP_PIPE_MAX_STAGES + 1];
    REQUIRE(dp_model_init(&m, spec, 1, 1, &err) == 0);
    REQUIRE(dp_pipe_partition(first, &m, 2, NULL, &err) == 0);
    size_t blo, bhi;
    dp_pipe_buffer_range(&m, first[1], first[2], &blo, &bhi);
    uint32_t n = (uint32_t)(bhi - blo);
    size_t nb = m.n_buffers;
    dp_model_free(&m);
    CHECKF(gather_from_fake(n, 4 + 4 * (uint64_t)n, &err) == 0, "the right count: %s", err.msg);
    int rc = gather_from_fake(n + 1, 4 + 4 * (uint64_t)(n + 1), &err);
    CHECKF(rc < 0 && strstr(err.msg, "sent") && strstr(err.msg, "bytes of buffers") &&
               strstr(err.msg, "stage 1") && strstr(err.msg, "rank 1"), /* the peer */
           "one float too many: rc %d, %s", rc, err.msg);
    fprintf(stderr, "one float too many: %s\n", err.msg);
    rc = gather_from_fake(n + 1, 4 + 4 * (uint64_t)n, &err); /* the count lies */
    CHECKF(rc < 0 && strstr(err.msg, "buffer floats in") && strstr(err.msg, "stage 1") &&
               strstr(err.msg, "rank 1"),
           "a count that is not the length's: rc %d, %s", rc, err.msg);
    fprintf(stderr, "a count that is not the length's: %s\n", err.msg);
    rc = gather_from_fake(n, 4 + 4 * (uint64_t)(nb + 1), &err);
    CHECKF(rc < 0 && strstr(err.msg, "bytes of buffers") && strstr(err.msg, "stage 1") &&
               strstr(err.msg, "rank 1"),
           "longer than the model's buffers: rc %d, %s", rc, err.msg);
    fprintf(stderr, "longer than the model's buffers: %s\n", err.msg);
    spec = saved_spec;
}

/* Stage 1 of 3 dies before step 2: its neighbours stop with its name. */
static void test_lost_stage(void)
{
    dp_train_config cfg = dp_train_defaults();
    cfg.model = spec;
    cfg.batch = BATCH;
    dp_err err;
    REQUIRE(dp_strategy_select(&cfg, "pipeline", &err) == 0 &&
            dp_strategy_set(&cfg, "stages", "3", &err) == 0);
    cfg.optim = dp_optim_defaults(DP_OPTIM_SGD);
    cfg.collective_timeout = 30;
    job jobs[3];
    run_pipeline(jobs, 3, &cfg, 1, 1);
    for (int p = 0; p < 3; p += 2) {
        CHECKF(jobs[p].rc < 0 && strstr(jobs[p].err.msg, "lost pipeline stage 1"),
               "position %d: rc %d, %s", p, jobs[p].rc, jobs[p].err.msg);
        fprintf(stderr, "position %d: %s\n", p, jobs[p].err.msg);
    }
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
    test_schedules();
    test_partition();
    test_equal_to_one_process();
    test_lost_stage();
    test_batch_norm();
    test_buffers_refused();
    spec = RES_SPEC;
    test_residual_partition();
    test_equal_to_one_process();
    test_vit();
    return CHECK_DONE();
}
