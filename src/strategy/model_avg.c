/* model-avg: parameter averaging.  Every worker trains its own replica with
 * its own optimiser; every --period steps it hands its parameters to the
 * servers, which wait for every live worker, average them (records-weighted)
 * and hand the average back.  Each worker's optimiser is part of a
 * checkpoint.
 * Its rule, for the servers and the workers, is the dp_ps_rules below; the
 * machinery it runs on is ps.c, its tasks' parts ps_family.c. */
#include <string.h>

#include "downpour/wire.h"
#include "strategy/ps_family.h"
#include "strategy/ps_rules.h"

/* The round's records-weighted mean of the pushed parameters becomes the
 * shard once every live worker has pushed. */
static int release(dp_ps_server *s, dp_err *err)
{
    if (!dp_ps_round_complete(s))
        return 0;
    const float *mean = dp_ps_round_mean(s);
    if (mean) {
        memcpy(s->params, mean, s->n * sizeof(float));
        dp_ps_changed(s);
    }
    return dp_ps_round_close(s, err);
}

static int on_push(dp_ps_server *s, dp_ps_worker *w, const dp_push_head *h, dp_err *err)
{
    return dp_ps_round_add(s, w, h, err) < 0 ? -1 : release(s, err);
}

/* Hand in this worker's parameters, take the average back. */
static int average(dp_ps_client *c, float *params, dp_err *err)
{
    c->clock++;
    int rc = dp_ps_push(c, DP_WIRE_PUSH_PARAMS, params, c->avg_records, 1, err);
    c->since_avg = 0;
    c->avg_records = 0;
    return rc < 0 ? -1 : dp_ps_receive(c, params, err);
}

/* A worker trains alone with its own optimiser; every period it averages. */
static int step(dp_ps_client *c, float *params, const float *grads, int records, dp_err *err)
{
    if (records > 0)
        dp_optim_apply(&c->local, params, grads, c->lr);
    c->avg_records += (uint32_t)records;
    return ++c->since_avg >= c->cfg.period ? average(c, params, err) : 0;
}

/* A last short period (at the end, or before a checkpoint). */
static int flush(dp_ps_client *c, float *params, dp_err *err)
{
    return c->since_avg > 0 ? average(c, params, err) : 0;
}

const dp_ps_rules dp_ps_rules_avg = {
    .mode = DP_PS_AVG, .name = "avg", .pushes_params = 1,
    .on_push = on_push, .release = release, .step = step, .flush = flush, .sync = flush,
};

static int open_model_avg(dp_strategy **out, const dp_run_env *env, dp_task_info *info, dp_err *err)
{
    return dp_ps_family_open(out, env, info, DP_PS_AVG, err);
}

const dp_strategy_ops dp_strategy_model_avg = {
    .name = "model-avg",
    .summary = "parameter averaging every --period local steps",
    DP_PS_FAMILY_OPS(open_model_avg, DP_ROLE_BIT(DP_ROLE_CHIEF)),
};
