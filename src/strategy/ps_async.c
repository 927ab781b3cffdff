/* ps-async: Downpour SGD (DistBelief, Dean et al. 2012).  Each worker pushes
 * its gradient to every parameter-server shard, which applies it at once with
 * the worker's learning rate and answers with its current parameters; no
 * worker waits for another.  --push-every N accumulates N steps' gradients
 * (records-weighted) before a push, --fetch-every N pulls every N steps:
 * DistBelief's n_push and n_fetch.  A lost worker costs its share of the data,
 * not the run.  The rule lives in ps.c (on_push: DP_PS_ASYNC). */
#include "strategy/ps_family.h"

static int open_ps_async(dp_strategy **out, const dp_run_env *env, dp_task_info *info, dp_err *err)
{
    return dp_ps_family_open(out, env, info, DP_PS_ASYNC, err);
}

const dp_strategy_ops dp_strategy_ps_async = {
    .name = "ps-async",
    .summary = "Downpour SGD: asynchronous pushes to parameter-server shards",
    DP_PS_FAMILY_OPS(open_ps_async),
};
