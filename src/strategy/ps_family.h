/* What the five parameter-server strategies share (ps-async, ps-sync,
 * ps-ssp, ps-dssp, model-avg): the same three parts, differing only in the
 * consistency mode their servers and clients follow (include/downpour/ps.h).
 *   ps tasks   SERVERs: each holds one shard of the parameters and its
 *              optimiser state (src/strategy/ps.c);
 *   workers    TRAINERs: push gradients (or parameters) and pull parameters;
 *   the chief  the COORDINATOR: starts the run, gathers the workers' epoch
 *              figures, pulls the parameters to evaluate, and holds the
 *              checkpoint barrier (every worker pauses at the checkpoint
 *              step, the servers hand in their shards, the chief writes).
 * Buffers (batch norm's running statistics): every worker moves its own;
 * worker 0 sends its to the chief (DP_WIRE_BUFFERS) before each epoch
 * report, at each checkpoint barrier and when it re-attaches, so the
 * chief evaluates, checkpoints and saves with worker 0's statistics
 * (docs/strategies.md, "Buffers").
 * Each strategy's file is its mode's table entry and the statement of its
 * rule; this file is the machinery. */
#ifndef DOWNPOUR_STRATEGY_PS_FAMILY_H
#define DOWNPOUR_STRATEGY_PS_FAMILY_H

#include "downpour/ps.h"
#include "downpour/strategy.h"

int dp_ps_family_open(dp_strategy **out, const dp_run_env *env, dp_task_info *info,
                      dp_ps_mode mode, dp_err *err);
int dp_ps_family_serve(dp_strategy *s, dp_err *err);
int dp_ps_family_step(dp_strategy *s, const float *x, const uint8_t *y, int n, float lr,
                      long step, dp_step_out *out, dp_err *err);
int dp_ps_family_deal(dp_strategy *s, int epoch, int *index, int *count, dp_err *err);
int dp_ps_family_epoch_end(dp_strategy *s, int epoch, dp_epoch_stats *st, dp_err *err);
int dp_ps_family_next(dp_strategy *s, dp_coord_event *ev, dp_train_state *st, dp_err *err);
const float *dp_ps_family_params(dp_strategy *s, dp_weights which, dp_err *err);
int dp_ps_family_save(dp_strategy *s, long step, dp_train_state *st, dp_err *err);
int dp_ps_family_finish(dp_strategy *s, long steps, dp_err *err);
void dp_ps_family_close(dp_strategy *s);

/* A mode's table entry, every operation the family's; `survives`: the
 * roles besides a worker whose loss the mode goes on without. */
#define DP_PS_FAMILY_OPS(open_fn, survives_also)                                               \
    .cluster = 1, .devices = 1, .buffers = 1,                                                  \
    .survives = DP_ROLE_BIT(DP_ROLE_WORKER) | (survives_also),                                 \
    .needs = DP_ROLE_BIT(DP_ROLE_CHIEF) | DP_ROLE_BIT(DP_ROLE_WORKER) | DP_ROLE_BIT(DP_ROLE_PS), \
    .talks_to = {[DP_ROLE_CHIEF] = DP_ROLE_BIT(DP_ROLE_WORKER) | DP_ROLE_BIT(DP_ROLE_PS),     \
                 [DP_ROLE_WORKER] = DP_ROLE_BIT(DP_ROLE_CHIEF) | DP_ROLE_BIT(DP_ROLE_PS),    \
                 [DP_ROLE_PS] = DP_ROLE_BIT(DP_ROLE_CHIEF) | DP_ROLE_BIT(DP_ROLE_WORKER)},   \
    .open = open_fn,                                                                           \
    .serve = dp_ps_family_serve, .step = dp_ps_family_step,                                    \
    .deal = dp_ps_family_deal, .epoch_end = dp_ps_family_epoch_end,                            \
    .next = dp_ps_family_next,                                                                 \
    .params = dp_ps_family_params, .save = dp_ps_family_save, .finish = dp_ps_family_finish,   \
    .close = dp_ps_family_close

#endif
