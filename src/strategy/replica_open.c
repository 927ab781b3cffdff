/* A trainer's replica (replica.h) from what the loop hands a strategy: the
 * model, the run's optimiser and device, the resumed state.  Servers and
 * coordinators never open one: a ps task keeps its shard on the CPU. */
#include "downpour/strategy.h"

int dp_strategy_replica_open(const dp_run_env *env, const char *label, int with_optim,
                             dp_replica **out, dp_err *err)
{
    const dp_train_state *rs = env->resume;
    dp_replica_config c = {
        .model = env->model,
        .optim = with_optim ? &env->cfg->optim : NULL,
        .device = &env->cfg->device,
        .train = env->train,
        .label = label,
        .resumed = with_optim && rs,
        .slots = with_optim && rs ? rs->slots : NULL,
        .optim_t = with_optim && rs ? rs->optim_t : 0,
    };
    return dp_replica_open(out, &c, err);
}
