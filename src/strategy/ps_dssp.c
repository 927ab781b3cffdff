/* ps-dssp: dynamic stale synchronous parallel (Zhao et al. 2019).  As ps-ssp,
 * but the bound adapts within --staleness-range LO:HI: below LO a worker
 * always goes on, beyond HI never; in between it goes on when waiting for the
 * slowest worker's next push would cost it more than one of its own
 * iterations.  The rule lives in ps.c (dssp_may_run). */
#include "strategy/ps_family.h"

static int open_ps_dssp(dp_strategy **out, const dp_run_env *env, dp_task_info *info, dp_err *err)
{
    return dp_ps_family_open(out, env, info, DP_PS_DSSP, err);
}

const dp_strategy_ops dp_strategy_ps_dssp = {
    .name = "ps-dssp",
    .summary = "dynamic SSP: the staleness bound adapts within --staleness-range",
    DP_PS_FAMILY_OPS(open_ps_dssp),
};
