/* ps-ssp: stale synchronous parallel (Ho et al. 2013).  Gradients are applied
 * at once, as in ps-async, but a worker's parameters come back only while its
 * clock (pushes) leads the slowest live worker's by at most --staleness s, so
 * the fastest worker never runs more than s steps ahead.
 * Its rule, for the servers and the workers, is the dp_ps_rules below; the
 * machinery it runs on is ps.c, its tasks' parts ps_family.c. */
#include "strategy/ps_family.h"
#include "strategy/ps_rules.h"

static int within_staleness(const dp_ps_server *s, const dp_ps_worker *w, long gap, double now)
{
    (void)w, (void)now;
    return gap <= s->cfg.staleness;
}

static int release(dp_ps_server *s, dp_err *err)
{
    return dp_ps_release_if(s, within_staleness, err);
}


const dp_ps_rules dp_ps_rules_ssp = {
    .mode = DP_PS_SSP, .name = "ssp", .on_push = dp_ps_apply_then_wait,
    .release = release, .step = dp_ps_push_and_wait,
};

static int open_ps_ssp(dp_strategy **out, const dp_run_env *env, dp_task_info *info, dp_err *err)
{
    return dp_ps_family_open(out, env, info, DP_PS_SSP, err);
}

static int compact_ssp(const dp_train_config *cfg)
{
    return dp_ps_family_compact(cfg, DP_PS_SSP);
}

const dp_strategy_ops dp_strategy_ps_ssp = {
    .name = "ps-ssp",
    .summary = "stale synchronous parallel: workers at most --staleness clocks apart",
    DP_PS_FAMILY_OPS(open_ps_ssp, DP_ROLE_BIT(DP_ROLE_CHIEF)),
    .compact_tables = compact_ssp,
};
