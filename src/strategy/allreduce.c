/* allreduce: mirrored replicas (TensorFlow's MultiWorkerMirroredStrategy,
 * Horovod).  Every replica holds every parameter and the optimiser state;
 * after each backprop the gradients are summed around a ring (in buckets,
 * overlapped with backprop: reducer.h), so every replica applies the same
 * update and the replicas stay bitwise identical.  The first replica (the
 * chief when there is one) evaluates, reports and checkpoints; nobody else
 * needs to, since it holds the whole state. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/crc32c.h"
#include "downpour/log.h"
#include "downpour/reducer.h"
#include "downpour/ring.h"
#include "downpour/strategy.h"

struct dp_strategy {
    const dp_run_env *env;
    dp_model *m;
    dp_optim opt;
    dp_ring ring;
    int ring_open;
    dp_reducer *reducer;
    uint32_t *shard_sizes; /* every replica's records per epoch */
    int replicas, position;
    long k;                /* step within the epoch */
};

/* Records every replica contributes to step k of an epoch (the shards'
 * sizes are known to all, so nobody has to send them). */
static double records_in_step(const dp_strategy *s, long k)
{
    int batch = s->env->cfg->batch;
    double total = 0;
    for (int w = 0; w < s->replicas; w++) {
        long left = (long)s->shard_sizes[w] - k * batch;
        total += left < 0 ? 0 : (left < batch ? left : batch);
    }
    return total;
}

/* Each replica's mean gradient weighs its share of the step's records, so
 * the sum is the mean over the summed batch. */
static void begin(void *self, long step, int records)
{
    dp_strategy *s = self;
    long k = (step - 1) % s->env->steps_per_epoch;
    dp_reducer_begin(s->reducer, (uint64_t)step, (float)(records / records_in_step(s, k)));
}

static void ready(void *self, size_t lo) { dp_reducer_ready(((dp_strategy *)self)->reducer, lo); }

static int update(void *self, float *params, const float *grads, int records, float lr,
                  dp_err *err)
{
    (void)records;
    dp_strategy *s = self;
    if (dp_reducer_finish(s->reducer, err) < 0)
        return -1;
    dp_optim_apply(&s->opt, params, grads, lr);
    return 0;
}

static const dp_grad_ops grad_ops = {.begin = begin, .ready = ready, .update = update};

static void allreduce_close(dp_strategy *s)
{
    if (!s)
        return;
    dp_reducer_close(s->reducer);
    if (s->ring_open)
        dp_ring_free(&s->ring);
    dp_optim_free(&s->opt);
    free(s->shard_sizes);
    if (s->m)
        s->m->grad_ready = NULL;
    free(s);
}

static int allreduce_open(dp_strategy **out, const dp_run_env *env, dp_task_info *info,
                          dp_err *err)
{
    const dp_cluster *c = &env->node->cluster;
    const dp_train_config *cfg = env->cfg;
    if (c->count[DP_ROLE_PS] > 0)
        return dp_errf(err, "allreduce keeps every parameter on every worker and needs no ps "
                            "task (the spec has %d). Hint: launch without --ps",
                       c->count[DP_ROLE_PS]);
    dp_role role = env->node->self->role;
    if (role != DP_ROLE_CHIEF && role != DP_ROLE_WORKER)
        return dp_errf(err, "allreduce runs on chief and worker tasks only");
    dp_strategy *s = calloc(1, sizeof *s);
    if (!s)
        return dp_errf(err, "out of memory");
    s->env = env;
    s->m = env->model;
    int n = c->count[DP_ROLE_CHIEF] + c->count[DP_ROLE_WORKER];
    int *ranks = malloc((size_t)n * sizeof *ranks);
    s->shard_sizes = malloc((size_t)n * sizeof *s->shard_sizes);
    if (!ranks || !s->shard_sizes) {
        free(ranks);
        allreduce_close(s);
        return dp_errf(err, "out of memory");
    }
    /* The replicas are the chief (if any) and the workers, in rank order. */
    int k = 0;
    for (int i = 0; i < c->n_tasks; i++)
        if (c->tasks[i].role == DP_ROLE_CHIEF || c->tasks[i].role == DP_ROLE_WORKER) {
            if (i == c->self)
                s->position = k;
            ranks[k++] = i;
        }
    s->replicas = n;
    int rc = dp_ring_init(&s->ring, env->node->transport, ranks, n, cfg->collective_timeout, 0,
                          err);
    free(ranks);
    s->ring_open = rc == 0;
    if (rc < 0 ||
        dp_reducer_open(&s->reducer, &s->ring, s->m->grads, s->m->n_params, cfg->bucket_bytes,
                        cfg->overlap, err) < 0 ||
        dp_optim_init(&s->opt, &cfg->optim, s->m->n_params, err) < 0) {
        allreduce_close(s);
        return -1;
    }
    if (env->resume) {
        size_t len = s->m->n_params * (size_t)dp_optim_slots(s->opt.cfg.kind);
        if (len)
            memcpy(s->opt.state, env->resume->slots, len * sizeof(float));
        s->opt.t = env->resume->optim_t;
    }
    dp_shard_policy policy = n > 1 ? cfg->shard : DP_SHARD_OFF;
    for (int w = 0; w < n; w++)
        s->shard_sizes[w] = dp_shard_size(policy, env->n_train, policy == DP_SHARD_OFF ? 0 : w,
                                          policy == DP_SHARD_OFF ? 1 : n);
    /* Backprop tells the reducer as each layer's gradients are final. */
    s->m->grad_ready = ready;
    s->m->grad_ready_ctx = s;
    info->part = DP_PART_TRAINER;
    info->evaluator = s->position == 0;
    info->live_params = 1;
    info->shard_index = s->position;
    info->shard_count = n;
    info->replicas = n;
    if (role == DP_ROLE_CHIEF)
        snprintf(info->label, sizeof info->label, "Chief");
    else
        snprintf(info->label, sizeof info->label, "Worker %d", env->node->self->index);
    if (s->position == 0)
        dp_info("%s: allreduce over %d replicas (%s), batch %d per replica (global %d), "
                "buckets of %zu KiB%s", env->node->self->name, n,
                s->ring.use_fast_path ? "the transport's collective" : "ring over the transport",
                cfg->batch, cfg->batch * n, cfg->bucket_bytes >> 10,
                cfg->overlap ? ", overlapped with backprop" : "");
    *out = s;
    return 0;
}

static int allreduce_step(dp_strategy *s, const float *x, const uint8_t *y, int n, float lr,
                          long step, dp_step_out *out, dp_err *err)
{
    return dp_data_parallel_step(s->m, &grad_ops, s, x, y, n, lr, step, out, err);
}

/* Sums the epoch's training figures over every replica. */
static int allreduce_epoch_end(dp_strategy *s, int epoch, dp_epoch_stats *st, dp_err *err)
{
    float v[3] = {(float)st->loss_sum, (float)st->records, (float)st->correct};
    if (dp_ring_allreduce(&s->ring, v, 3, (uint64_t)st->steps, -1, err) < 0)
        return -1;
    (void)epoch;
    st->loss_sum = v[0];
    st->records = v[1];
    st->correct = v[2];
    return 0;
}

static const float *allreduce_params(dp_strategy *s, dp_weights which, dp_err *err)
{
    (void)which, (void)err;
    return s->m->params;
}

/* The first replica holds the whole state: params and optimiser are the
 * same on every replica. */
static int allreduce_save(dp_strategy *s, long step, dp_train_state *st, dp_err *err)
{
    (void)step, (void)err;
    if (s->position != 0)
        return 0;
    memcpy(st->params, s->m->params, s->m->n_params * sizeof(float));
    if (st->n_slots)
        memcpy(st->slots, s->opt.state, (size_t)st->n_slots * s->m->n_params * sizeof(float));
    st->optim_t = s->opt.t;
    return 1;
}

/* Mirrored replicas must end identical: each says what it holds. */
static int allreduce_finish(dp_strategy *s, long steps, dp_err *err)
{
    (void)err;
    uint32_t crc = dp_crc32c(0, s->m->params, s->m->n_params * sizeof *s->m->params);
    long early, total;
    dp_reducer_counts(s->reducer, &early, &total);
    dp_metrics_event(s->env->metrics, "replica", DP_F_INT, "params_crc32c", (long)crc, DP_F_INT,
                     "steps", steps, DP_F_INT, "buckets", total, DP_F_INT, "buckets_overlapped",
                     early, DP_F_END);
    if (s->position == 0)
        dp_info("%s: %ld of %ld gradient buckets started reducing while backprop ran",
                s->env->node->self->name, early, total);
    return 0;
}

const dp_strategy_ops dp_strategy_allreduce = {
    .name = "allreduce",
    .summary = "synchronous ring all-reduce of gradients, mirrored replicas",
    .cluster = 1,
    .open = allreduce_open,
    .step = allreduce_step,
    .epoch_end = allreduce_epoch_end,
    .params = allreduce_params,
    .save = allreduce_save,
    .finish = allreduce_finish,
    .close = allreduce_close,
};
