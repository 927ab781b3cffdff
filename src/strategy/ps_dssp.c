/* ps-dssp: dynamic stale synchronous parallel (Zhao et al. 2019).  As ps-ssp,
 * but the bound adapts within --staleness-range LO:HI: below LO a worker
 * always goes on, beyond HI never; in between it goes on when waiting for the
 * slowest worker's next push would cost it more than one of its own
 * iterations.
 * Its rule, for the servers and the workers, is the dp_ps_rules below; the
 * machinery it runs on is ps.c, its tasks' parts ps_family.c. */
#include "strategy/ps_family.h"
#include "strategy/ps_rules.h"

/* Beyond the lower bound a fast worker may run on, up to the upper bound,
 * when waiting for the slowest worker's next push would cost it more than
 * one of its own iterations; otherwise it waits. */
static int may_run(const dp_ps_server *s, const dp_ps_worker *fast, long gap, double now)
{
    if (gap <= s->cfg.staleness_lo)
        return 1;
    if (gap > s->cfg.staleness_hi)
        return 0;
    double slow_next = 0;
    long m = dp_ps_min_clock(s);
    for (int i = 0; i < s->n_workers; i++)
        if (s->w[i].live && s->w[i].clock == m) {
            double eta = s->w[i].last_push + s->w[i].interval - now;
            slow_next = eta > slow_next ? eta : slow_next;
        }
    return slow_next > fast->interval;
}

static int release(dp_ps_server *s, dp_err *err) { return dp_ps_release_if(s, may_run, err); }


const dp_ps_rules dp_ps_rules_dssp = {
    .mode = DP_PS_DSSP, .name = "dssp", .watches_time = 1,
    .on_push = dp_ps_apply_then_wait, .release = release, .step = dp_ps_push_and_wait,
};

static int open_ps_dssp(dp_strategy **out, const dp_run_env *env, dp_task_info *info, dp_err *err)
{
    return dp_ps_family_open(out, env, info, DP_PS_DSSP, err);
}

static int compact_dssp(const dp_train_config *cfg)
{
    return dp_ps_family_compact(cfg, DP_PS_DSSP);
}

const dp_strategy_ops dp_strategy_ps_dssp = {
    .name = "ps-dssp",
    .summary = "dynamic SSP: the staleness bound adapts within --staleness-range",
    DP_PS_FAMILY_OPS(open_ps_dssp, DP_ROLE_BIT(DP_ROLE_CHIEF)),
    .compact_tables = compact_dssp,
};
