/* ps-ssp: stale synchronous parallel (Ho et al. 2013).  Gradients are applied
 * at once, as in ps-async, but a worker's parameters come back only while its
 * clock (pushes) leads the slowest live worker's by at most --staleness s, so
 * the fastest worker never runs more than s steps ahead.  The rule lives in
 * ps.c (release_pending). */
#include "strategy/ps_family.h"

static int open_ps_ssp(dp_strategy **out, const dp_run_env *env, dp_task_info *info, dp_err *err)
{
    return dp_ps_family_open(out, env, info, DP_PS_SSP, err);
}

const dp_strategy_ops dp_strategy_ps_ssp = {
    .name = "ps-ssp",
    .summary = "stale synchronous parallel: workers at most --staleness clocks apart",
    DP_PS_FAMILY_OPS(open_ps_ssp),
};
