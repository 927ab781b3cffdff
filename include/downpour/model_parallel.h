/* The model-parallel executor's one public call (src/exec/, docs/strategies.md,
 * "model-parallel"): whether a model splits over K tasks, for the checks a
 * run makes before any task starts (downpour train and launch).  The plan
 * itself stays private to the executor and the strategies that drive it. */
#ifndef DOWNPOUR_MODEL_PARALLEL_H
#define DOWNPOUR_MODEL_PARALLEL_H

#include "downpour/model.h"
#include "downpour/status.h"

/* 0 when K tasks can split m; -1 with the message of the split itself: a
 * layer whose kind has no model-parallel rule, a dense layer narrower than
 * K, an image layer with fewer output rows than K.  K <= 0 (the number of
 * tasks not known yet) checks the layers' rules alone. */
int dp_mp_check(const dp_model *m, int K, dp_err *err);

#endif
