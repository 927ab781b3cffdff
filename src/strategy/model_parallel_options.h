/* model-parallel's settings (model_parallel_options.c), which ps-async's
 * model-parallel replicas share (--model-parallel: DP_OPT_ALSO in
 * ps_options.c).  Private to src/strategy. */
#ifndef DOWNPOUR_STRATEGY_MODEL_PARALLEL_OPTIONS_H
#define DOWNPOUR_STRATEGY_MODEL_PARALLEL_OPTIONS_H

#include "downpour/options.h"
#include "downpour/strategy.h"

/* model-parallel's options.  A new option is one line here (options.h,
 * DP_OPT_FIELD): its field, default and table line come from it.
 * --model-parallel K: tasks per replica (0, not given: every task). */
#define DP_MP_OPTIONS(X)                                                                           \
    X(int, model_parallel, 0, "model-parallel", DP_OPT_INT, "K", 1, 4096, 0,                       \
      "model-parallel, ps-async: tasks each replica's layers are split over (dense by units, "     \
      "image by rows) (model-parallel's default: every task)")

typedef struct dp_mp_settings {
    DP_MP_OPTIONS(DP_OPT_FIELD)
} dp_mp_settings;

extern const dp_strategy_conf dp_mp_conf;

/* --model-parallel K (0: every task, `tasks`; both 0: only the layers'
 * rules) against the model spec: 0, or -1 naming the flag, the layer and
 * why.  A spec that does not parse is the run's to refuse: 0. */
int dp_mp_settings_check_model(const char *model, int K, dp_err *err);

#endif
