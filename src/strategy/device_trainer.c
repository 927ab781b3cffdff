/* A trainer on a device (docs/gpu.md, "Strategies"): the device and the
 * model there, opened for a strategy's trainer part.  Servers and
 * coordinators never open one: a ps task keeps its shard on the CPU. */
#include <stdlib.h>

#include "downpour/log.h"
#include "downpour/strategy.h"

/* Host staging copies the parameters to the device and the gradients back
 * every step (device_grads in strategies.c): page-locked in place, they cross
 * at the bus's speed with no bounce buffer (docs/gpu.md, "Strategies").  Not
 * being able to lock them costs speed only, so it is a warning.  The model's
 * arrays outlive the device model: the loop frees them after ops->close. */
void dp_strategy_device_pin(const dp_run_env *env, const char *label, dp_dmodel *dm)
{
    if (!dm)
        return;
    dp_model *m = env->model;
    size_t bytes = m->n_params * sizeof(float);
    dp_err err;
    if (dp_dmodel_pin_host(dm, m->params, bytes, &err) < 0 ||
        dp_dmodel_pin_host(dm, m->grads, bytes, &err) < 0) {
        dp_warn("%s: copies go through pageable memory: %s", label, err.msg);
        return;
    }
    size_t pinned = dp_dmodel_pinned_bytes(dm);
    if (pinned)
        dp_info("%s pinned %.1f MiB of host staging buffers (parameters and gradients)", label,
                (double)pinned / (1024.0 * 1024.0));
}

int dp_strategy_device_open(const dp_run_env *env, const char *label, int with_optim,
                            dp_dmodel **out, dp_err *err)
{
    *out = NULL;
    const dp_device_spec *spec = &env->cfg->device;
    if (spec->kind == DP_DEVICE_CPU)
        return 0;
    char name[32];
    dp_device_format(spec, name, sizeof name);
    if (!env->train)
        return dp_errf(err, "--device %s: %s has no training split to load", name, label);
    dp_device *d = NULL;
    dp_dmodel *dm = NULL;
    if (dp_device_open(&d, spec, err) < 0)
        return -1;
    if (dp_dmodel_open(&dm, d, env->model, with_optim ? &env->cfg->optim : NULL, err) < 0 ||
        dp_dmodel_load_split(dm, env->train, err) < 0) {
        dp_dmodel_close(dm);
        dp_device_close(d);
        return -1;
    }
    dp_info("%s trains on %s", label, dp_device_describe(d));
    if (!with_optim)
        dp_strategy_device_pin(env, label, dm);
    *out = dm;
    return 0;
}

void dp_strategy_device_close(dp_dmodel *dm)
{
    if (!dm)
        return;
    dp_device *d = dp_dmodel_device(dm);
    dp_dmodel_close(dm);
    dp_device_close(d);
}
