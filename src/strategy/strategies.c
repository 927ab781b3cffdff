/* The table of strategies: each name is written once, in its own file's
 * dp_strategy_ops; this list only orders them. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/clock.h"
#include "downpour/launcher.h"
#include "downpour/strategy.h"
#include "downpour/trace.h"
#include "strategy/ps_family.h"

const dp_strategy_ops *const dp_strategies[] = {
    &dp_strategy_single,  &dp_strategy_ps_async,  &dp_strategy_ps_sync, &dp_strategy_ps_ssp,
    &dp_strategy_ps_dssp, &dp_strategy_model_avg, &dp_strategy_allreduce, &dp_strategy_pipeline,
    &dp_strategy_model_parallel, &dp_strategy_lbfgs,
};
const int dp_strategy_count = (int)(sizeof dp_strategies / sizeof dp_strategies[0]);

const char *dp_strategy_names(void)
{
    static char names[256];
    if (!names[0]) {
        size_t len = 0;
        for (int i = 0; i < dp_strategy_count && len < sizeof names; i++)
            len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", i ? ", " : "",
                                    dp_strategies[i]->name);
    }
    return names;
}

const dp_strategy_ops *dp_strategy_find(const char *name, dp_err *err)
{
    for (int i = 0; i < dp_strategy_count; i++)
        if (strcmp(name, dp_strategies[i]->name) == 0)
            return dp_strategies[i];
    dp_errf(err, "unknown strategy '%s' (valid: %s)", name, dp_strategy_names());
    return NULL;
}

void dp_strategy_launch_options(const dp_strategy_ops *ops, int workers, char *buf, size_t cap)
{
    bool ps = ops->needs & DP_ROLE_BIT(DP_ROLE_PS);
    snprintf(buf, cap, "%s--workers %d%s", ops->needs & DP_ROLE_BIT(DP_ROLE_CHIEF) ? "--chief " : "",
             workers > 0 ? workers : 2, ps ? " --ps 1" : "");
}

int dp_strategy_trainers(const dp_strategy_ops *ops, int chief, int workers)
{
    if (!ops->cluster)
        return 1;
    return workers + (ops->needs & DP_ROLE_BIT(DP_ROLE_CHIEF) ? 0 : chief);
}

int dp_strategy_check_cluster(const dp_strategy_ops *ops, int chief, int workers, int ps,
                              dp_err *err)
{
    char opts[96];
    dp_strategy_launch_options(ops, workers, opts, sizeof opts);
    if (chief < 0) {
        if (!ops->cluster)
            return 0;
        return dp_errf(err, "--strategy %s runs on a cluster of tasks, and this process is "
                            "alone. Hint: downpour launch %s -- train --strategy %s",
                       ops->name, opts, ops->name);
    }
    int n[DP_ROLE_COUNT] = {0};
    n[DP_ROLE_CHIEF] = chief;
    n[DP_ROLE_WORKER] = workers;
    n[DP_ROLE_PS] = ps;
    char have[96];
    snprintf(have, sizeof have, "%d chief, %d worker(s) and %d ps task(s)", chief, workers, ps);
    if (!ops->cluster)
        return dp_errf(err, "--strategy %s trains one process alone, but this task is one of a "
                            "cluster of %s. Hint: --strategy %s", ops->name, have,
                       ps > 0 ? "ps-async" : "allreduce");
    for (int r = 0; r < DP_ROLE_COUNT; r++) {
        if ((ops->needs & DP_ROLE_BIT(r)) && n[r] == 0)
            return dp_errf(err, "strategy %s needs %s, and the cluster has %s. Hint: downpour "
                                "launch %s -- train --strategy %s",
                           ops->name,
                           r == DP_ROLE_CHIEF ? "a chief (it starts, evaluates and ends the run)"
                           : r == DP_ROLE_PS  ? "at least one ps task (they hold the parameters)"
                                              : "at least one worker",
                           have, opts, ops->name);
        if ((ops->refuses & DP_ROLE_BIT(r)) && n[r] > 0)
            return dp_errf(err, "strategy %s runs on chief and worker tasks and needs no %s "
                                "task; the cluster has %s. Hint: downpour launch %s -- train "
                                "--strategy %s",
                           ops->name, dp_role_name((dp_role)r), have, opts, ops->name);
    }
    if (chief + workers < 1)
        return dp_errf(err, "strategy %s needs a chief or a worker to train, and the cluster "
                            "has %s", ops->name, have);
    return 0;
}

int dp_split_positions(const dp_run_env *env, const char *what, int **ranks, int *position,
                       dp_err *err)
{
    const dp_cluster *c = &env->node->cluster;
    if (c->count[DP_ROLE_PS] > 0)
        return dp_errf(err, "%s runs on chief and worker tasks and needs no ps task (the spec "
                            "has %d). Hint: launch without --ps",
                       what, c->count[DP_ROLE_PS]);
    dp_role role = env->node->self->role;
    if (role != DP_ROLE_CHIEF && role != DP_ROLE_WORKER)
        return dp_errf(err, "%s runs on chief and worker tasks only", what);
    if (env->cfg->ema > 0)
        return dp_errf(err, "--ema %g: %s tasks hold slices of the weights, so no task can "
                            "average them every step; leave --ema out",
                       (double)env->cfg->ema, what);
    int n = c->count[DP_ROLE_CHIEF] + c->count[DP_ROLE_WORKER];
    if (!(*ranks = malloc((size_t)n * sizeof **ranks)))
        return dp_errf(err, "out of memory");
    for (int i = 0, k = 0; i < c->n_tasks; i++)
        if (c->tasks[i].role == DP_ROLE_CHIEF || c->tasks[i].role == DP_ROLE_WORKER) {
            if (i == c->self)
                *position = k;
            (*ranks)[k++] = i;
        }
    return n;
}

int dp_data_parallel_step(dp_model *m, dp_replica *r, const dp_grad_ops *ops, void *self,
                          const float *x, const uint8_t *y, int n, float lr, long step,
                          dp_step_out *out, dp_err *err)
{
    out->loss = 0;
    out->correct = 0;
    if (ops->begin)
        ops->begin(self, step, n);
    if (n > 0) {
        double t0 = dp_now();
        int rc = r ? dp_replica_grads(r, x, y, n, &out->loss, &out->correct, err)
                   : (out->loss = dp_model_forward_backward(m, x, y, n, &out->correct), 0);
        if (rc < 0)
            return -1;
        out->deferred = rc > 0;
        dp_trace_compute("compute", t0, dp_now());
        if (!out->deferred && !isfinite(out->loss))
            return dp_errf(err, "the loss became %g at step %ld: lower the learning rate (--lr)",
                           (double)out->loss, step);
    } else {
        /* a shard that ran out still takes part in a synchronous step,
         * and in its batch sums (--sync-bn) */
        dp_model_batch_sum_idle(m);
        memset(m->grads, 0, m->n_params * sizeof *m->grads);
    }
    /* the exchange: push and pull, or the all-reduce, and the update */
    double t1 = dp_now();
    int rc = ops->update(self, m->params, m->grads, n, lr, err);
    dp_trace_span("update", "comm", t1, dp_now(), -1);
    return rc;
}

const void *dp_strategy_settings(const dp_train_config *cfg, const dp_strategy_conf *conf)
{
    return cfg->strategy_conf == conf ? (const void *)cfg->strategy_cfg : conf->defaults;
}

int dp_strategy_select(dp_train_config *cfg, const char *name, dp_err *err)
{
    const dp_strategy_ops *ops = dp_strategy_find(name, err);
    if (!ops)
        return -1;
    cfg->strategy = ops->name;
    cfg->strategy_conf = ops->conf;
    memset(cfg->strategy_cfg, 0, sizeof cfg->strategy_cfg);
    if (ops->conf)
        memcpy(cfg->strategy_cfg, ops->conf->defaults, ops->conf->size);
    return 0;
}

int dp_strategy_set(dp_train_config *cfg, const char *name, const char *value, dp_err *err)
{
    const dp_strategy_ops *ops = dp_strategy_find(cfg->strategy ? cfg->strategy : "", err);
    if (!ops)
        return -1;
    if (cfg->strategy_conf != ops->conf && dp_strategy_select(cfg, ops->name, err) < 0)
        return -1;
    const dp_opt *o = ops->conf ? dp_opt_find(ops->conf->opts, ops->conf->n_opts, name) : NULL;
    if (!o)
        return dp_errf(err, "--%s is no option of strategy %s", name, ops->name);
    return dp_opt_set(o, cfg->strategy_cfg, value, err);
}

/* --device: refused, before anything opens, for a strategy whose trainers
 * run on the CPU only; the device itself is opened by the strategy's
 * trainers (a ps task never opens one). */
static int check_device(const dp_train_config *cfg, dp_err *err)
{
    const dp_strategy_ops *ops = dp_strategy_find(cfg->strategy ? cfg->strategy : "", err);
    if (!ops)
        return -1;
    if (cfg->device.kind == DP_DEVICE_CPU || ops->devices)
        return 0;
    char name[32], on[256] = "";
    dp_device_format(&cfg->device, name, sizeof name);
    for (int i = 0; i < dp_strategy_count; i++)
        if (dp_strategies[i]->devices)
            snprintf(on + strlen(on), sizeof on - strlen(on), "%s%s", on[0] ? ", " : "",
                     dp_strategies[i]->name);
    return dp_errf(err, "--device %s: strategy %s trains on the CPU only; these train on a "
                        "device: %s (docs/gpu.md)", name, cfg->strategy, on);
}

/* A model with buffers (batch norm's running statistics) only under a
 * strategy with a rule for them (docs/strategies.md, "Buffers"). */
int dp_strategy_check_buffers(const dp_model *m, const char *strategy, dp_err *err)
{
    const dp_strategy_ops *ops = dp_strategy_find(strategy ? strategy : "", err);
    if (!ops)
        return -1;
    if (!m->n_buffers || ops->buffers)
        return 0;
    char on[256] = "";
    for (int i = 0; i < dp_strategy_count; i++)
        if (dp_strategies[i]->buffers)
            snprintf(on + strlen(on), sizeof on - strlen(on), "%s%s", on[0] ? ", " : "",
                     dp_strategies[i]->name);
    return dp_errf(err, "model %s has buffers (batch norm's running statistics), which strategy "
                        "%s does not handle yet; these do: %s (docs/strategies.md, \"Buffers\")",
                   m->name, strategy, on);
}

/* --clip-norm: refused, before anything opens, where the strategy cannot
 * clip the whole gradient, or cannot on a device (it says why). */
static int check_clip(const dp_train_config *cfg, dp_err *err)
{
    if (!(cfg->clip_norm > 0))
        return 0;
    const dp_strategy_ops *ops = dp_strategy_find(cfg->strategy ? cfg->strategy : "", err);
    if (!ops)
        return -1;
    if (ops->no_clip)
        return dp_errf(err, "--clip-norm: strategy %s cannot clip by the global norm: %s "
                            "(docs/training.md)", cfg->strategy, ops->no_clip);
    if (cfg->device.kind != DP_DEVICE_CPU && ops->no_clip_device)
        return dp_errf(err, "--clip-norm: not with --device for strategy %s yet: %s "
                            "(docs/training.md)", cfg->strategy, ops->no_clip_device);
    return 0;
}

int dp_strategy_check(const dp_train_config *cfg, dp_err *err)
{
    const dp_strategy_ops *ops = dp_strategy_find(cfg->strategy ? cfg->strategy : "", err);
    if (!ops || check_device(cfg, err) < 0 || check_clip(cfg, err) < 0)
        return -1;
    if (cfg->global_batch > 0 && !ops->data_parallel)
        return dp_errf(err, "--global-batch: strategy %s's workers are not data-parallel "
                            "replicas sharing a step's records; give --batch (docs/strategies.md, "
                            "\"--global-batch\")", ops->name);
    if (cfg->sum_chunk > 0 && (ops != &dp_strategy_ps_sync || cfg->global_batch <= 0))
        return dp_errf(err, "--sum-chunk %d: %s", cfg->sum_chunk,
                       ops != &dp_strategy_ps_sync
                           ? "for --strategy ps-sync, whose shards add the workers' chunks"
                           : "it cuts --global-batch's shares: give --global-batch N");
    if (!ops->conf || !ops->conf->check)
        return 0;
    return ops->conf->check(dp_strategy_settings(cfg, ops->conf), cfg, err);
}

int dp_strategy_check_tasks(const dp_train_config *cfg, int chief, int workers, int ps,
                            dp_err *err)
{
    const dp_strategy_ops *ops = dp_strategy_find(cfg->strategy ? cfg->strategy : "", err);
    if (!ops)
        return -1;
    if (!ops->conf || !ops->conf->check_tasks)
        return 0;
    return ops->conf->check_tasks(dp_strategy_settings(cfg, ops->conf), cfg, chief, workers, ps,
                                  err);
}

void dp_strategy_identity(const dp_train_config *cfg, int part, char *buf, size_t cap)
{
    dp_err ignored;
    const dp_strategy_ops *ops = dp_strategy_find(cfg->strategy ? cfg->strategy : "", &ignored);
    if (ops && ops->conf && ops->conf->identity)
        ops->conf->identity(dp_strategy_settings(cfg, ops->conf), part, buf, cap);
    else if (part == 0) /* the fragment every checkpoint carries: see ps_options.c */
        dp_ps_settings_identity(NULL, buf, cap);
}

int dp_strategy_restart_all(const char *who, dp_role role, int checkpoints, char *why,
                            size_t cap)
{
    if (checkpoints) {
        snprintf(why, cap, "%s needs every task restarted from its newest checkpoint after a "
                 "lost %s", who, dp_role_name(role));
        return DP_LAUNCH_RESTART_ALL;
    }
    snprintf(why, cap, "%s cannot survive a lost %s without --checkpoint-dir: with it and a "
             "restart left (launch --max-restarts), every task would start again from the "
             "newest checkpoint", who, dp_role_name(role));
    return 0;
}

int dp_strategy_restart(const dp_strategy_ops *ops, const void *settings, dp_role role,
                        int checkpoints, char *why, size_t cap)
{
    if (settings && ops->conf && ops->conf->restart)
        return ops->conf->restart(settings, ops, role, checkpoints, why, cap);
    if (ops->restarts_all & DP_ROLE_BIT(role))
        /* its state is in its checkpoints: the whole job goes on from them */
        return dp_strategy_restart_all(ops->name, role, checkpoints, why, cap);
    if (ops->survives & ops->no_rejoin & DP_ROLE_BIT(role)) {
        snprintf(why, cap, "%s survives a lost %s, and does not take a restarted one back",
                 ops->name, dp_role_name(role));
        return DP_LAUNCH_NO_RESTART;
    }
    snprintf(why, cap, "%s %s a lost %s", ops->name,
             ops->survives & DP_ROLE_BIT(role) ? "survives" : "cannot survive",
             dp_role_name(role));
    return (ops->survives & DP_ROLE_BIT(role)) != 0;
}
