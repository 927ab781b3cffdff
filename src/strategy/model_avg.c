/* model-avg: parameter averaging.  Every worker trains its own replica with
 * its own optimiser; every --period steps it hands its parameters to the
 * servers, which wait for every live worker, average them (records-weighted)
 * and hand the average back.  Each worker's optimiser is part of a
 * checkpoint.  The rule lives in ps.c (finish_round) and the client's step. */
#include "strategy/ps_family.h"

static int open_model_avg(dp_strategy **out, const dp_run_env *env, dp_task_info *info, dp_err *err)
{
    return dp_ps_family_open(out, env, info, DP_PS_AVG, err);
}

const dp_strategy_ops dp_strategy_model_avg = {
    .name = "model-avg",
    .summary = "parameter averaging every --period local steps",
    DP_PS_FAMILY_OPS(open_model_avg),
};
