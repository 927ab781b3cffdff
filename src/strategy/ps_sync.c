/* ps-sync: synchronous aggregation on the parameter servers.  Each step every
 * live worker pushes its gradient; a shard waits for all of them, applies the
 * records-weighted mean gradient once and only then answers, so the run equals
 * one process at the summed batch.  It runs at the pace of the slowest worker
 * and stops when one is lost.  The rule lives in ps.c (finish_round). */
#include "strategy/ps_family.h"

static int open_ps_sync(dp_strategy **out, const dp_run_env *env, dp_task_info *info, dp_err *err)
{
    return dp_ps_family_open(out, env, info, DP_PS_SYNC, err);
}

const dp_strategy_ops dp_strategy_ps_sync = {
    .name = "ps-sync",
    .summary = "synchronous aggregation on the parameter servers",
    DP_PS_FAMILY_OPS(open_ps_sync),
};
