/* single: one process trains alone with a local optimiser.  The reference
 * every distributed strategy is checked against.  Its model is a replica
 * (replica.h): on a device (--device) the whole step, the update included,
 * runs there, and the weights, --ema's moving average (kept there too) and
 * the optimiser state come back to the host only to be evaluated or saved
 * (docs/gpu.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/clip.h"
#include "downpour/strategy.h"
#include "downpour/testhooks.h"

struct dp_strategy {
    dp_model *m;
    dp_replica *r; /* the model and its optimiser, where they compute */
    int unfused; /* DOWNPOUR_UNFUSED_UPDATE=1, or --clip-norm (the norm needs every
                    gradient first): the optimiser after backprop */
    float clip;  /* --clip-norm (0: off) */
};

static int update(void *self, float *params, const float *grads, int records, float lr,
                  dp_err *err)
{
    (void)params, (void)grads; /* m->params and m->grads: the replica's */
    struct dp_strategy *s = self;
    if (records > 0 && s->clip > 0)
        dp_grad_clip(s->m->grads, s->m->n_params, s->clip);
    return records > 0 ? dp_replica_apply(s->r, lr, err) : 0;
}

static const dp_grad_ops grad_ops = {.update = update};

static void single_close(dp_strategy *s)
{
    if (!s)
        return;
    dp_replica_close(s->r);
    free(s);
}

static int single_open(dp_strategy **out, const dp_run_env *env, dp_task_info *info, dp_err *err)
{
    dp_strategy *s = calloc(1, sizeof *s);
    if (!s)
        return dp_errf(err, "out of memory");
    s->m = env->model;
    /* The state lives where the replica computes; on a device the host's
     * weights are not live, so the loop cannot keep --ema from them: the
     * device keeps it, starting where the loop would (the resumed average,
     * else the weights). */
    if (dp_strategy_replica_open(env, "Worker 0", 1, &s->r, err) < 0 ||
        dp_replica_settle(s->r, DP_STATE_LOCAL, env->cfg->ema,
                          env->resume ? env->resume->ema : NULL, err) < 0) {
        single_close(s);
        return -1;
    }
    info->replica = s->r;
    s->clip = env->cfg->clip_norm;
    /* unfused works on the host's gradients: only where they are live */
    s->unfused = (dp_hook_on(DP_HOOK_UNFUSED_UPDATE) || s->clip > 0) &&
                 dp_replica_host_live(s->r);
    info->part = DP_PART_TRAINER;
    info->evaluator = 1;
    info->live_params = dp_replica_host_live(s->r);
    info->shard_index = 0;
    info->shard_count = 1;
    info->replicas = 1;
    snprintf(info->label, sizeof info->label, "Worker 0");
    *out = s;
    return 0;
}

/* The update is local, so it runs fused into backprop (docs/architecture.md,
 * "Fast paths"): the same bits as the data-parallel step, which
 * DOWNPOUR_UNFUSED_UPDATE=1 selects. */
static int single_step(dp_strategy *s, const float *x, const uint8_t *y, int n, float lr,
                       long step, dp_step_out *out, dp_err *err)
{
    if (n <= 0 || s->unfused)
        return dp_data_parallel_step(s->m, s->r, &grad_ops, s, x, y, n, lr, step, out, err);
    int rc = dp_replica_step(s->r, x, y, n, lr, &out->loss, &out->correct, err);
    out->deferred = rc > 0;
    if (rc != 0)
        return rc < 0 ? -1 : 0;
    if (!isfinite(out->loss))
        return dp_errf(err, "the loss became %g at step %ld: lower the learning rate (--lr)",
                       (double)out->loss, step);
    return 0;
}

static int single_epoch_end(dp_strategy *s, int epoch, dp_epoch_stats *st, dp_err *err)
{
    (void)s, (void)epoch, (void)st, (void)err;
    return 0;
}

static const float *single_params(dp_strategy *s, dp_weights which, dp_err *err)
{
    return dp_replica_weights(s->r, which == DP_WEIGHTS_AVERAGE, err);
}

/* The loop's st->ema is the replica's to fill where the host's weights are
 * not live (live_params 0). */
static int single_save(dp_strategy *s, long step, dp_train_state *st, dp_err *err)
{
    (void)step;
    return dp_replica_state(s->r, st->params, st->slots, st->n_slots, &st->optim_t, st->ema,
                            err) < 0
               ? -1
               : 1;
}

static int single_finish(dp_strategy *s, long steps, dp_err *err)
{
    (void)s, (void)steps, (void)err;
    return 0;
}

const dp_strategy_ops dp_strategy_single = {
    .name = "single",
    .summary = "one process, a local optimiser",
    .cluster = 0,
    .data_parallel = 1,
    .devices = 1,
    .buffers = 1,
    .no_clip_device = "its whole step, the update included, runs on the device, and the norm "
                      "is summed on the host",
    .open = single_open,
    .step = single_step,
    .epoch_end = single_epoch_end,
    .params = single_params,
    .save = single_save,
    .finish = single_finish,
    .close = single_close,
};
