/* model-parallel's settings (model_parallel_options.c), which ps-async's
 * model-parallel replicas share (--model-parallel: DP_OPT_ALSO in
 * ps_options.c).  Private to src/strategy. */
#ifndef DOWNPOUR_STRATEGY_MODEL_PARALLEL_OPTIONS_H
#define DOWNPOUR_STRATEGY_MODEL_PARALLEL_OPTIONS_H

#include "downpour/strategy.h"

/* A new option of model-parallel is a field here and a line in
 * model_parallel_options.c's opts. */
typedef struct dp_mp_settings {
    int model_parallel; /* tasks per replica, K (0: every task) */
} dp_mp_settings;

extern const dp_strategy_conf dp_mp_conf;

/* --model-parallel K (0: every task, `tasks`; both 0: only the layers'
 * rules) against the model spec: 0, or -1 naming the flag, the layer and
 * why.  A spec that does not parse is the run's to refuse: 0. */
int dp_mp_settings_check_model(const char *model, int K, dp_err *err);

#endif
