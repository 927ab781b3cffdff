/* model-parallel's settings: --model-parallel, its checks against the
 * model and the cluster, and its refusal under the strategies that do not
 * split a replica (docs/architecture.md, "A strategy's settings"). */
#include "strategy/model_parallel_options.h"

#include "downpour/model.h"
#include "downpour/model_parallel.h"
#include "downpour/options.h"
#include "downpour/train_config.h"

_Static_assert(sizeof(dp_mp_settings) <= DP_STRATEGY_CFG_MAX, "model-parallel settings too big");

static const dp_mp_settings defaults = {DP_MP_OPTIONS(DP_OPT_DEFAULT)};

#define DP_OPT_SETTINGS dp_mp_settings
static const dp_opt opts[] = {DP_MP_OPTIONS(DP_OPT_LINE)};
#undef DP_OPT_SETTINGS

int dp_mp_settings_check_model(const char *model, int K, dp_err *err)
{
    dp_model m;
    dp_err merr;
    if (dp_model_describe(&m, model, &merr) < 0)
        return 0; /* the run says what is wrong with --model */
    /* the split itself says what cannot split: a layer it does not split
     * (by its kind's rule), a dense layer narrower than K, an image layer
     * with fewer output rows than K (docs/strategies.md, "model-parallel") */
    int rc = dp_mp_check(&m, K, err);
    dp_model_free(&m);
    return rc;
}

/* Given under a strategy that does not read it (the ps family reads it too,
 * and refuses it itself under all but ps-async). */
static int foreign(const void *own, const dp_train_config *cfg, dp_err *err)
{
    dp_err ignored;
    const dp_strategy_ops *ops = dp_strategy_find(cfg->strategy ? cfg->strategy : "", &ignored);
    if (((const dp_mp_settings *)own)->model_parallel == 0 ||
        (ops && ops->conf && dp_opt_find(ops->conf->opts, ops->conf->n_opts, "model-parallel")))
        return 0;
    return dp_errf(err, "--model-parallel is for --strategy model-parallel, or ps-async "
                        "(model-parallel replicas training against ps shards)");
}

/* Without K the model splits over every training task, known only with the
 * cluster (check_tasks): here only the layers' rules. */
static int check(const void *own, const dp_train_config *cfg, dp_err *err)
{
    return dp_mp_settings_check_model(cfg->model, ((const dp_mp_settings *)own)->model_parallel,
                                      err);
}

static int check_tasks(const void *own, const dp_train_config *cfg, int chief, int workers,
                       int ps, dp_err *err)
{
    (void)ps;
    int k = ((const dp_mp_settings *)own)->model_parallel;
    return k > 0 ? 0 : dp_mp_settings_check_model(cfg->model, chief + workers, err);
}

const dp_strategy_conf dp_mp_conf = {
    .opts = opts, .n_opts = (int)(sizeof opts / sizeof opts[0]),
    .size = sizeof(dp_mp_settings), .defaults = &defaults,
    .foreign = foreign, .check = check, .check_tasks = check_tasks,
};
