/* ps-async: Downpour SGD (DistBelief, Dean et al. 2012).  Each worker pushes
 * its gradient to every parameter-server shard, which applies it at once with
 * the worker's learning rate and answers with its current parameters; no
 * worker waits for another.  --push-every N accumulates N steps' gradients
 * (records-weighted) before a push, --fetch-every N pulls every N steps:
 * DistBelief's n_push and n_fetch.  --push-behind N lets the worker compute
 * on while N pushes are unanswered (DistBelief's workers push and fetch in
 * the background): their answers are taken between steps, so a gradient is
 * computed on parameters at most N of its own pushes old, and a step's
 * parameters never change under it.  A lost worker costs its share of the
 * data, not the run.
 * Its rule, for the servers and the workers, is the dp_ps_rules below; the
 * machinery it runs on is ps.c, its tasks' parts ps_family.c. */
#include <string.h>

#include "downpour/wire.h"
#include "strategy/ps_family.h"
#include "strategy/ps_rules.h"

/* The server applies every gradient at once and answers when asked. */
static int on_push(dp_ps_server *s, dp_ps_worker *w, const dp_push_head *h, dp_err *err)
{
    if (h->records > 0)
        dp_ps_apply(s, s->scratch, h->lr);
    (void)err;
    if (h->want)
        dp_ps_reply(s, w);
    return 0;
}

/* Pushes v; with push-behind the answer is taken later.  Every answer owed
 * is taken before the push but the newest push_behind - 1, so the answers a
 * worker leaves unread stay within what the sockets hold while it sends
 * (ps.c BEHIND_BYTES); push_behind 0 waits for this one's answer at once. */
static int push(dp_ps_client *c, float *params, const float *v, uint32_t records, int want,
                dp_err *err)
{
    if (dp_ps_settle(c, params, c->behind > 0 ? c->behind - 1 : 0, err) < 0 ||
        dp_ps_push(c, DP_WIRE_PUSH_GRAD, v, records, want, err) < 0)
        return -1;
    c->in_flight += want;
    return dp_ps_settle(c, params, c->behind, err);
}

/* Pushes the accumulated gradient (push_every > 1), records-weighted. */
static int push_accumulated(dp_ps_client *c, float *params, int want, dp_err *err)
{
    if (c->acc_records > 0) {
        float scale = 1.0f / (float)c->acc_records;
        for (size_t i = 0; i < c->n; i++)
            c->acc[i] *= scale;
    }
    c->clock++;
    /* A failover re-sends the sum: it is kept until answered, or copied
     * when the answer comes behind (ps.c). */
    int rc = push(c, params, c->acc, c->acc_records, want, err);
    memset(c->acc, 0, c->n * sizeof *c->acc);
    c->acc_records = 0;
    c->acc_steps = 0;
    return rc;
}

/* A worker pushes every push_every steps and fetches every fetch_every. */
static int step(dp_ps_client *c, float *params, const float *grads, int records, dp_err *err)
{
    int fetch = ++c->since_fetch >= c->cfg.fetch_every;
    if (fetch)
        c->since_fetch = 0;
    if (c->cfg.push_every <= 1) {
        c->clock++;
        return push(c, params, grads, (uint32_t)records, fetch, err);
    }
    float r = (float)records;
    for (size_t i = 0; i < c->n; i++)
        c->acc[i] += grads[i] * r;
    c->acc_records += (uint32_t)records;
    if (++c->acc_steps >= c->cfg.push_every)
        return push_accumulated(c, params, fetch, err);
    return fetch ? dp_ps_client_pull(c, params, 0, err) : 0;
}

static int flush(dp_ps_client *c, float *params, dp_err *err)
{
    return c->acc_steps > 0 ? push_accumulated(c, params, 1, err) : 0;
}

/* Before a checkpoint: the last push went unanswered, so a pull behind it on
 * the same connection returns once the server has applied it. */
static int sync(dp_ps_client *c, float *params, dp_err *err)
{
    int rc = c->acc_steps > 0     ? push_accumulated(c, params, 1, err)
             : c->since_fetch > 0 ? dp_ps_client_pull(c, params, 0, err)
                                  : 0;
    c->since_fetch = 0; /* as a fresh client resuming from here starts */
    return rc;
}

const dp_ps_rules dp_ps_rules_async = {
    .mode = DP_PS_ASYNC, .name = "async", .on_push = on_push,
    .step = step, .flush = flush, .sync = sync,
};

static int open_ps_async(dp_strategy **out, const dp_run_env *env, dp_task_info *info, dp_err *err)
{
    return dp_ps_family_open(out, env, info, DP_PS_ASYNC, err);
}

static int compact_async(const dp_train_config *cfg)
{
    return dp_ps_family_compact(cfg, DP_PS_ASYNC);
}

const dp_strategy_ops dp_strategy_ps_async = {
    .name = "ps-async",
    .summary = "Downpour SGD: asynchronous pushes to parameter-server shards",
    DP_PS_FAMILY_OPS(open_ps_async, DP_ROLE_BIT(DP_ROLE_CHIEF)),
    .compact_tables = compact_async,
};
