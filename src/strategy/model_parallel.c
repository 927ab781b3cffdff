/* model-parallel: DistBelief's model parallelism within a replica.  The
 * tasks (the chief if any, then the workers, in rank order) are R replicas
 * of K tasks: position p is task p % K of replica p / K.  Task j holds, of
 * every dense layer, the output units [lo_j, hi_j) (a balanced split,
 * mp_slice.h): those rows of W and entries of b, their gradients and their
 * optimiser state, about 1/K of the model, in one compact buffer.
 *
 * Image layers before the first dense one are split by bands of output
 * rows instead (docs/architecture.md, "Model parallelism"): a task holds
 * its band's positions of a local layer and its output channels' filters of
 * a conv layer, in the same compact buffer.
 *
 * A step (mp_replica.c): every task of a replica walks the same batch.
 * Forward, each task computes its columns of a layer's output from the full
 * input (one GEMM on its rows of W, then bias and relu) and the replica
 * all-gathers the columns, so every task holds the layer's full output for
 * the next layer; after the last layer every task holds the full logits and
 * computes the same loss and its gradient.  Backward, each task's weight and
 * bias gradients are local (its columns of the output gradient against the
 * full input); the gradient at a layer's input is the sum over the tasks of
 * (their columns of dz) x (their rows of W), which the replica
 * reduce-scatters: each task gets the sum in the columns it owns of the
 * layer below, the only ones its backward there reads (each column summed by
 * its owner, in task order).  Each gradient is weighted by the replica's
 * share of the step's records and, when R > 1, summed with task j of every
 * other replica around a ring; then each task applies the configured
 * optimiser to its slice.  So K tasks (and R replicas of K) equal one
 * process at the same (global) batch within float noise: the same initial
 * weights (every task builds the full model from the seed and keeps its
 * slices), the same records, the same sums.
 *
 * What crosses the wire per step and dense layer, per task: its columns of
 * the output to the K-1 others (rows x units/K floats each: DP_WIRE_MP_ACT)
 * and, for every layer but the first, each other task's columns of its part
 * of the input gradient (DP_WIRE_MP_GRAD; (K-1)/K of rows x in floats in
 * all).  Position 0 (task 0 of replica 0) evaluates: at each epoch's end
 * replica 0's tasks send it their slices (DP_WIRE_MP_PARAMS) and every task
 * its figures (DP_WIRE_MP_STATS); at a checkpoint their optimiser state too
 * (DP_WIRE_MP_STATE).  A lost task takes its slices with it: the replica
 * stops with a message naming it, and under `launch --max-restarts` with
 * --checkpoint-dir every task starts again from the newest checkpoint
 * (restarts_all; docs/faults.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strategy/model_parallel_options.h"

#include "downpour/clip.h"
#include "downpour/group.h"
#include "downpour/log.h"
#include "downpour/ring.h"
#include "downpour/strategy.h"
#include "downpour/wire.h"
#include "exec/mp_replica.h"

#define STATS_BYTES (3 * 8 + 4)

struct dp_strategy {
    const dp_run_env *env;
    dp_model *m;          /* the loop's: position 0 assembles the full weights in params */
    dp_transport *t;
    int n, K, R;          /* tasks, tasks per replica, replicas */
    int position, task, replica;
    int *ranks;           /* transport rank of each position */
    mp_replica *rep;      /* the step's forward and backward within the replica */
    const mp_plan *plan;  /* this task's slices */
    float *params, *grads; /* this task's slices, compact (plan->floats each) */
    dp_optim opt;         /* over the compact slices */
    float *scratch;       /* position 0: another task's compact slices */
    dp_ring across;       /* task j of each replica */
    int across_open;
    uint32_t *sizes;      /* R > 1: each replica's shard, for the step's weights */
    double timeout;
    dp_group g;           /* the positions, each loss named (group.h) */
};

/* A ring that broke names the task it lost. */
static int ring_sum(dp_strategy *s, dp_ring *r, float *buf, size_t len, long step, int bucket,
                    dp_err *err)
{
    int rc = dp_ring_allreduce(r, buf, len, (uint64_t)step, bucket, err);
    if (rc == DP_RING_BROKEN)
        return dp_group_lost_rank(&s->g, r->broken_peer, err);
    return rc < 0 ? -1 : 0;
}

/* --clip-norm (docs/training.md, "Gradient clipping"): the compact slices
 * of the K tasks hold every parameter once, so the whole gradient's norm is
 * their parts summed: each task sends its sum of squares to its replica's
 * others and adds all K in task order (the same bits everywhere, as every
 * replica's slices hold the ring's same sums).  mp_replica_step waited for
 * its frames, so these follow them in order. */
static int clip_slices(dp_strategy *s, long step, dp_err *err)
{
    size_t len = s->plan->floats;
    double part = dp_grad_sumsq(s->grads, len), sum = 0;
    int first = s->replica * s->K;
    uint8_t b[8];
    dp_put_f64(b, part);
    for (int q = 0; q < s->K; q++)
        if (q != s->task && dp_group_send(&s->g, first + q, DP_WIRE_MP_NORM, step,
                                          (uint64_t)s->task, b, 8, err) < 0)
            return -1;
    for (int q = 0; q < s->K; q++) {
        double v = part;
        if (q != s->task) {
            if (dp_group_recv(&s->g, first + q, DP_WIRE_MP_NORM, step, (uint64_t)q, b, 8,
                              "a task's part of the gradient norm", err) < 0)
                return -1;
            v = dp_get_f64(b);
        }
        sum += v;
    }
    dp_grad_scale(s->grads, len, dp_clip_coef(sum, s->env->cfg->clip_norm));
    return 0;
}

static int mp_step(dp_strategy *s, const float *x, const uint8_t *y, int n, float lr, long step,
                   dp_step_out *out, dp_err *err)
{
    out->loss = 0;
    out->correct = 0;
    double total = dp_group_step_records(s->sizes, s->R, step, s->env->steps_per_epoch,
                                         s->env->cfg->batch, n);
    if (n > 0) {
        if (mp_replica_step(s->rep, s->params, s->grads, x, y, n, (float)(n / total), step, out,
                            err) < 0)
            return -1;
    } else {
        /* a shard that ran out still takes part in the replicas' sum */
        memset(s->grads, 0, s->plan->floats * sizeof(float));
    }
    if (s->R > 1 && ring_sum(s, &s->across, s->grads, s->plan->floats, step, 0, err) < 0)
        return -1;
    if (s->env->cfg->clip_norm > 0 && clip_slices(s, step, err) < 0)
        return -1;
    if (total > 0)
        dp_optim_apply(&s->opt, s->params, s->grads, lr);
    return 0;
}

/* ---------------------------------------------------------- the epoch's end */

static int send_stats(dp_strategy *s, int epoch, const dp_epoch_stats *st, dp_err *err)
{
    uint8_t b[STATS_BYTES];
    dp_put_f64(b, st->loss_sum);
    dp_put_f64(b + 8, st->records);
    dp_put_f64(b + 16, st->correct);
    dp_put_u32(b + 24, (uint32_t)s->task);
    if (dp_group_send(&s->g, 0, DP_WIRE_MP_STATS, epoch, 0, b, sizeof b, err) < 0)
        return -1;
    /* replica 0's tasks: their slices for the evaluation */
    if (s->replica == 0)
        return dp_group_send(&s->g, 0, DP_WIRE_MP_PARAMS, epoch, (uint64_t)s->task, s->params,
                             s->plan->floats * sizeof(float), err);
    return 0;
}

/* Position 0: the run's figures (each replica's task 0 counts its records)
 * and the full weights from replica 0's slices. */
static int gather_epoch(dp_strategy *s, int epoch, dp_epoch_stats *st, dp_err *err)
{
    mp_scatter(s->m->params, s->params, s->plan);
    for (int p = 1; p < s->n; p++) {
        uint8_t b[STATS_BYTES];
        if (dp_group_recv(&s->g, p, DP_WIRE_MP_STATS, epoch, 0, b, sizeof b, "its epoch figures",
                          err) < 0)
            return -1;
        if (dp_get_u32(b + 24) != (uint32_t)(p % s->K))
            return dp_errf(err, "%s says it is task %u, but position %d is task %d",
                           dp_group_name(&s->g, p), dp_get_u32(b + 24), p, p % s->K);
        if (p % s->K == 0) {
            st->loss_sum += dp_get_f64(b);
            st->records += dp_get_f64(b + 8);
            st->correct += dp_get_f64(b + 16);
        }
        if (p < s->K) {
            if (dp_group_recv(&s->g, p, DP_WIRE_MP_PARAMS, epoch, (uint64_t)p, s->scratch,
                              mp_replica_plan(s->rep, p)->floats * sizeof(float),
                              "its slices of the model", err) < 0)
                return -1;
            mp_scatter(s->m->params, s->scratch, mp_replica_plan(s->rep, p));
        }
    }
    return 0;
}

static int mp_epoch_end(dp_strategy *s, int epoch, dp_epoch_stats *st, dp_err *err)
{
    return s->position == 0 ? gather_epoch(s, epoch, st, err) : send_stats(s, epoch, st, err);
}

static const float *mp_params(dp_strategy *s, dp_weights which, dp_err *err)
{
    (void)which, (void)err;
    return s->m->params;
}

/* ------------------------------------------------------------ checkpoints */

/* Replica 0's tasks hand position 0 their slices and optimiser slots, which
 * it writes in the full layout (slot k at k * n_params); replicas hold the
 * same. */
static int mp_save(dp_strategy *s, long step, dp_train_state *st, dp_err *err)
{
    size_t np = s->m->n_params, nf = s->plan->floats;
    int slots = dp_optim_slots(s->opt.cfg.kind);
    if (s->replica != 0)
        return 0;
    if (s->position != 0) {
        uint8_t head[8];
        dp_put_u64(head, (uint64_t)s->opt.t);
        struct iovec iov[3] = {{head, sizeof head},
                               {s->params, nf * sizeof(float)},
                               {s->opt.state, nf * (size_t)slots * sizeof(float)}};
        if (dp_transport_sendv(s->t, s->ranks[0], DP_WIRE_MP_STATE, (uint64_t)step,
                               (uint64_t)s->task, iov, slots ? 3 : 2, err) < 0)
            return dp_group_lost(&s->g, 0, err);
        return 0;
    }
    if (slots > st->n_slots)
        return dp_errf(err, "model-parallel: the checkpoint has room for %d optimiser slots, "
                            "%s keeps %d", st->n_slots, dp_optim_kind_name(s->opt.cfg.kind),
                       slots);
    mp_scatter(st->params, s->params, s->plan);
    for (int k = 0; k < slots; k++)
        mp_scatter(st->slots + k * np, s->opt.state + k * nf, s->plan);
    st->optim_t = s->opt.t;
    for (int p = 1; p < s->K; p++) {
        const mp_plan *pp = mp_replica_plan(s->rep, p);
        size_t pn = pp->floats, len = 8 + pn * (1 + (size_t)slots) * sizeof(float);
        dp_event ev;
        if (dp_transport_recv(s->t, s->ranks[p], "its checkpoint state", s->timeout, &ev, err) < 0)
            return dp_group_lost(&s->g, p, err);
        if (ev.header.type != DP_WIRE_MP_STATE || ev.header.step != (uint64_t)step ||
            ev.header.offset != (uint64_t)p || ev.header.length != len)
            return dp_errf(err, "%s sent frame type %u (%llu bytes) instead of its state for "
                                "checkpoint %ld (%zu bytes)",
                           dp_group_name(&s->g, p), ev.header.type,
                           (unsigned long long)ev.header.length, step, len);
        uint8_t head[8];
        if (dp_transport_recv_payload(s->t, s->ranks[p], head, sizeof head, err) < 0 ||
            dp_transport_recv_payload(s->t, s->ranks[p], s->scratch, pn * sizeof(float), err) < 0)
            return dp_group_lost(&s->g, p, err);
        mp_scatter(st->params, s->scratch, pp);
        for (int k = 0; k < slots; k++) {
            if (dp_transport_recv_payload(s->t, s->ranks[p], s->scratch, pn * sizeof(float),
                                          err) < 0)
                return dp_group_lost(&s->g, p, err);
            mp_scatter(st->slots + k * np, s->scratch, pp);
        }
        if ((long)dp_get_u64(head) != s->opt.t)
            return dp_errf(err, "%s has applied %ld updates but task 0 %ld at checkpoint %ld",
                           dp_group_name(&s->g, p), (long)dp_get_u64(head), s->opt.t, step);
    }
    return 1;
}

static int mp_finish(dp_strategy *s, long steps, dp_err *err)
{
    (void)s, (void)steps, (void)err;
    return 0;
}

/* SIGTERM (docs/faults.md, "Draining"): no task can leave a running
 * replica, whose every layer needs its slice, so the drain is refused in
 * words after the step, and the task's end is a lost task's (every task
 * restarted from the newest checkpoint, or the run stops). */
static int mp_leave(dp_strategy *s, long steps, dp_err *err)
{
    return dp_errf(err, "SIGTERM: model-parallel task %d of replica %d holds slices of every "
                        "layer, which the replica cannot go on without, so it cannot drain; "
                        "it stops after step %ld, a lost task", s->task, s->replica, steps);
}

/* ---------------------------------------------------------------- opening */

static void mp_close(dp_strategy *s)
{
    if (!s)
        return;
    mp_replica_close(s->rep);
    if (s->across_open)
        dp_ring_free(&s->across);
    dp_optim_free(&s->opt);
    free(s->scratch);
    free(s->params);
    free(s->grads);
    free(s->ranks);
    free(s->sizes);
    free(s);
}

/* The replica, this task's slices and their optimiser. */
static int open_slices(dp_strategy *s, const dp_train_config *cfg, dp_err *err)
{
    if (mp_replica_open(&s->rep, s->t, s->m, s->ranks + s->replica * s->K, s->K, s->task,
                        s->replica, cfg->batch, s->timeout, err) < 0)
        return -1;
    s->plan = mp_replica_plan(s->rep, s->task);
    size_t most = 0, nf = s->plan->floats;
    for (int j = 0; j < s->K; j++)
        most = mp_replica_plan(s->rep, j)->floats > most ? mp_replica_plan(s->rep, j)->floats
                                                          : most;
    s->params = malloc(nf * sizeof(float));
    s->grads = malloc(nf * sizeof(float));
    if (!s->params || !s->grads || (s->position == 0 && !(s->scratch = malloc(most * sizeof(float)))))
        return dp_errf(err, "out of memory for this task's slices");
    if (dp_optim_init(&s->opt, &cfg->optim, nf, err) < 0)
        return -1;
    /* the loop's params hold the initial (or resumed) full model */
    mp_gather(s->params, s->m->params, s->plan);
    const dp_train_state *r = s->env->resume;
    if (r) {
        for (int k = 0; k < dp_optim_slots(s->opt.cfg.kind); k++)
            mp_gather(s->opt.state + k * nf, r->slots + k * s->m->n_params, s->plan);
        s->opt.t = r->optim_t;
    }
    return 0;
}

/* R > 1: task j's ring across the replicas, and the replicas' shards. */
static int open_rings(dp_strategy *s, const dp_train_config *cfg, dp_err *err)
{
    if (s->R == 1)
        return 0;
    if (!s->env->train) /* the replicas' shard sizes come from it */
        return dp_errf(err, "model-parallel: %d replicas need the training split", s->R);
    int *ranks = malloc((size_t)s->R * sizeof *ranks);
    if (!ranks)
        return dp_errf(err, "out of memory");
    for (int r = 0; r < s->R; r++)
        ranks[r] = s->ranks[r * s->K + s->task];
    int rc = dp_ring_init(&s->across, s->t, ranks, s->R, s->timeout, 0, err);
    s->across_open = rc == 0;
    free(ranks);
    if (rc < 0)
        return -1;
    s->sizes = malloc((size_t)s->R * sizeof *s->sizes);
    if (!s->sizes)
        return dp_errf(err, "out of memory");
    for (int r = 0; r < s->R; r++)
        s->sizes[r] = dp_shard_size(cfg->shard, s->env->train, cfg->shard == DP_SHARD_OFF ? 0 : r,
                                    cfg->shard == DP_SHARD_OFF ? 1 : s->R);
    return 0;
}

/* "model-parallel: task j holds N parameters (X MiB) of M (1/K)", and the
 * same as a metrics event: what the split saves each task. */
static void report_memory(const dp_strategy *s)
{
    size_t nf = s->plan->floats, np = s->m->n_params;
    int slots = dp_optim_slots(s->opt.cfg.kind);
    double mib = (double)nf * sizeof(float) / (1 << 20);
    double state = (double)nf * (2 + slots) * sizeof(float) / (1 << 20);
    dp_info("model-parallel: task %d holds %zu parameters (%.2f MiB) of %zu (1/%d); with their "
            "gradients and %s state %.2f MiB",
            s->task, nf, mib, np, s->K, dp_optim_kind_name(s->opt.cfg.kind), state);
    dp_metrics_event(s->env->metrics, "model_parallel", DP_F_INT, "mp_task", (long)s->task,
                     DP_F_INT, "replica", (long)s->replica, DP_F_INT, "tasks", (long)s->K,
                     DP_F_INT, "replicas", (long)s->R, DP_F_INT, "params", (long)nf, DP_F_INT,
                     "total_params", (long)np, DP_F_NUM, "param_mib", mib, DP_F_NUM,
                     "state_mib", state, DP_F_END);
}

static int mp_open(dp_strategy **out, const dp_run_env *env, dp_task_info *info, dp_err *err)
{
    const dp_train_config *cfg = env->cfg;
    dp_strategy *s = calloc(1, sizeof *s);
    if (!s)
        return dp_errf(err, "out of memory");
    s->env = env;
    s->m = env->model;
    s->t = env->node->transport;
    s->timeout = cfg->collective_timeout > 0 ? cfg->collective_timeout : 300;
    if ((s->n = dp_split_positions(env, "model-parallel", &s->ranks, &s->position, err)) < 0) {
        mp_close(s);
        return -1;
    }
    int k = ((const dp_mp_settings *)dp_strategy_settings(cfg, &dp_mp_conf))->model_parallel;
    s->K = k > 0 ? k : s->n;
    if (s->n % s->K != 0) {
        dp_errf(err, "--model-parallel %d: the %d task(s) (chief and workers) are not a whole "
                     "number of replicas of %d tasks. Hint: launch --workers %d (or a multiple)",
                s->K, s->n, s->K, s->K);
        mp_close(s);
        return -1;
    }
    s->R = s->n / s->K;
    s->task = s->position % s->K;
    s->replica = s->position / s->K;
    s->g = (dp_group){.t = s->t, .ranks = s->ranks, .n = s->n, .width = s->K,
                      .member = "model-parallel task",
                      .cost = "a replica cannot go on without a slice of its model",
                      .timeout = s->timeout};
    if (open_slices(s, cfg, err) < 0 || open_rings(s, cfg, err) < 0) {
        mp_close(s);
        return -1;
    }
    info->part = DP_PART_TRAINER;
    info->evaluator = s->position == 0;
    info->live_params = 0; /* the full weights are assembled at each epoch's end */
    info->sliced = 1;      /* only position 0 needs the loop's full-size buffers */
    info->shard_index = s->replica;
    info->shard_count = s->R;
    info->replicas = s->R;
    if (env->node->self->role == DP_ROLE_CHIEF)
        snprintf(info->label, sizeof info->label, "Chief (mp task %d)", s->task);
    else
        snprintf(info->label, sizeof info->label, "Worker %d (mp task %d)",
                 env->node->self->index, s->task);
    report_memory(s);
    if (s->position == 0)
        dp_info("model-parallel: %d replica(s) of %d task(s), global batch %d", s->R, s->K,
                cfg->batch * s->R);
    *out = s;
    return 0;
}

const dp_strategy_ops dp_strategy_model_parallel = {
    .name = "model-parallel",
    .conf = &dp_mp_conf,
    .summary = "model parallelism: dense layers' units, image layers' rows split over K tasks a replica",
    .cluster = 1,
    .refuses = DP_ROLE_BIT(DP_ROLE_PS),
    /* A lost task took its slices: the whole job again from the newest
     * checkpoint (docs/faults.md). */
    .restarts_all = DP_ROLE_BIT(DP_ROLE_CHIEF) | DP_ROLE_BIT(DP_ROLE_WORKER),
    .open = mp_open,
    .step = mp_step,
    .epoch_end = mp_epoch_end,
    .params = mp_params,
    .save = mp_save,
    .finish = mp_finish,
    .leave = mp_leave,
    .close = mp_close,
};
