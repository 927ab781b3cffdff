/* single: one process trains alone with a local optimiser.  The reference
 * every distributed strategy is checked against.  On a device (--device)
 * the whole step, the update included, runs there, and the weights, --ema's
 * moving average (kept there too) and the optimiser state come back to the
 * host only to be evaluated or saved (docs/gpu.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/clip.h"
#include "downpour/strategy.h"

struct dp_strategy {
    dp_model *m;
    dp_optim opt;
    int unfused; /* DOWNPOUR_UNFUSED_UPDATE=1, or --clip-norm (the norm needs every
                    gradient first): the optimiser after backprop */
    float clip;  /* --clip-norm (0: off) */
    dp_dmodel *dev; /* on a device: the model and its optimiser there; NULL on the CPU */
    float *ema;     /* on a device with --ema: the average brought back to evaluate */
};

static int update(void *self, float *params, const float *grads, int records, float lr,
                  dp_err *err)
{
    (void)err;
    struct dp_strategy *s = self;
    if (records > 0 && s->clip > 0)
        dp_grad_clip(s->m->grads, s->m->n_params, s->clip); /* grads is m->grads */
    if (records > 0)
        dp_optim_apply(&s->opt, params, grads, lr);
    return 0;
}

static const dp_grad_ops grad_ops = {.update = update};

static void single_close(dp_strategy *s)
{
    if (!s)
        return;
    dp_strategy_device_close(s->dev);
    free(s->ema);
    dp_optim_free(&s->opt);
    free(s);
}

static int single_open(dp_strategy **out, const dp_run_env *env, dp_task_info *info, dp_err *err)
{
    dp_strategy *s = calloc(1, sizeof *s);
    if (!s)
        return dp_errf(err, "out of memory");
    s->m = env->model;
    if (dp_optim_init(&s->opt, &env->cfg->optim, env->model->n_params, err) < 0) {
        single_close(s);
        return -1;
    }
    if (env->resume) {
        size_t n = env->model->n_params * (size_t)dp_optim_slots(s->opt.cfg.kind);
        if (n)
            memcpy(s->opt.state, env->resume->slots, n * sizeof(float));
        s->opt.t = env->resume->optim_t;
    }
    if (dp_strategy_device_open(env, "Worker 0", 1, &s->dev, err) < 0 ||
        (s->dev && env->resume &&
         dp_dmodel_set_optim(s->dev, s->opt.state, s->opt.t, err) < 0)) {
        single_close(s);
        return -1;
    }
    /* On a device the host's weights are not live, so the loop cannot keep
     * --ema from them: the device keeps it, starting where the loop would
     * (the resumed average, else the weights). */
    float ema = env->cfg->ema;
    if (s->dev && ema > 0 &&
        (!(s->ema = malloc(env->model->n_params * sizeof(float))) ||
         dp_dmodel_ema_start(s->dev, ema, env->resume ? env->resume->ema : NULL, err) < 0)) {
        if (!s->ema)
            dp_errf(err, "out of memory for --ema's average (%zu parameters)",
                    env->model->n_params);
        single_close(s);
        return -1;
    }
    info->device = s->dev;
    const char *unfused = getenv("DOWNPOUR_UNFUSED_UPDATE");
    s->clip = env->cfg->clip_norm;
    s->unfused = (unfused && strcmp(unfused, "1") == 0) || s->clip > 0;
    info->part = DP_PART_TRAINER;
    info->evaluator = 1;
    info->live_params = !s->dev;
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
    if (s->dev) {
        out->deferred = 1;
        return n > 0 ? dp_dmodel_step(s->dev, lr, err) : 0;
    }
    if (n <= 0 || s->unfused)
        return dp_data_parallel_step(s->m, s->dev, &grad_ops, s, x, y, n, lr, step, out, err);
    out->correct = 0;
    out->loss = dp_model_train_step(s->m, &s->opt, x, y, n, lr, &out->correct);
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
    if (s->dev && dp_dmodel_get_buffers(s->dev, s->m->buffers, err) < 0)
        return NULL; /* the statistics the device's steps moved */
    if (which == DP_WEIGHTS_AVERAGE && s->ema)
        return dp_dmodel_get_ema(s->dev, s->ema, err) < 0 ? NULL : s->ema;
    if (s->dev && dp_dmodel_get_params(s->dev, s->m->params, err) < 0)
        return NULL;
    return s->m->params;
}

static int single_save(dp_strategy *s, long step, dp_train_state *st, dp_err *err)
{
    (void)step;
    if (s->dev) /* the loop's st->ema is the device's on a device (live_params 0) */
        return dp_dmodel_get_params(s->dev, st->params, err) < 0 ||
                       dp_dmodel_get_buffers(s->dev, s->m->buffers, err) < 0 ||
                       dp_dmodel_get_optim(s->dev, st->slots, &st->optim_t, err) < 0 ||
                       (s->ema && st->ema && dp_dmodel_get_ema(s->dev, st->ema, err) < 0)
                   ? -1
                   : 1;
    memcpy(st->params, s->m->params, s->m->n_params * sizeof(float));
    if (st->n_slots)
        memcpy(st->slots, s->opt.state, (size_t)st->n_slots * s->m->n_params * sizeof(float));
    st->optim_t = s->opt.t;
    return 1;
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
