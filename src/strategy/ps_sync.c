/* ps-sync: synchronous aggregation on the parameter servers.  Each step every
 * live worker pushes its gradient; a shard waits for all of them, applies the
 * records-weighted mean gradient once and only then answers, so the run equals
 * one process at the summed batch.  It runs at the pace of the slowest worker;
 * a lost one is dropped and the round closes with the survivors.
 * Its rule, for the servers and the workers, is the dp_ps_rules below; the
 * machinery it runs on is ps.c, its tasks' parts ps_family.c. */
#include "strategy/ps_family.h"
#include "strategy/ps_rules.h"

/* The round's mean gradient is applied once every live worker has pushed. */
static int release(dp_ps_server *s, dp_err *err)
{
    if (!dp_ps_round_complete(s))
        return 0;
    /* --sum-chunk: the sum again, in an order that does not depend on the
     * workers (a restored server's rounds keep the arrival order's) */
    if (s->chunk_buf && !s->restored && s->round_records > 0)
        dp_ps_round_chunk_sum(s);
    const float *mean = dp_ps_round_mean(s);
    if (mean)
        dp_ps_apply(s, mean, s->round_lr);
    return dp_ps_round_close(s, err);
}

static int on_push(dp_ps_server *s, dp_ps_worker *w, const dp_push_head *h, dp_err *err)
{
    return dp_ps_round_add(s, w, h, err) < 0 ? -1 : release(s, err);
}

const dp_ps_rules dp_ps_rules_sync = {
    .mode = DP_PS_SYNC, .name = "sync", .on_push = on_push,
    .release = release, .step = dp_ps_push_and_wait,
};

static int open_ps_sync(dp_strategy **out, const dp_run_env *env, dp_task_info *info, dp_err *err)
{
    return dp_ps_family_open(out, env, info, DP_PS_SYNC, err);
}

static int compact_sync(const dp_train_config *cfg)
{
    return dp_ps_family_compact(cfg, DP_PS_SYNC);
}

const dp_strategy_ops dp_strategy_ps_sync = {
    .name = "ps-sync",
    .summary = "synchronous aggregation on the parameter servers",
    DP_PS_FAMILY_OPS(open_ps_sync, DP_ROLE_BIT(DP_ROLE_CHIEF)),
    .compact_tables = compact_sync,
};
