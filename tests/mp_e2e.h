/* What the model-parallel end-to-end tests share (test_model_parallel_e2e,
 * test_model_parallel_spatial_e2e): a strategy under `launch` against one
 * process at the same batch, and a task's report of the parameters it holds. */
#ifndef DOWNPOUR_TEST_MP_E2E_H
#define DOWNPOUR_TEST_MP_E2E_H

#include "proc.h"

/* `train single_args common` alone, then `launch LAUNCH -- train --strategy
 * STRATEGY single_args mp_args common` (a flag in mp_args overrides the same
 * flag of single_args: the last one counts); their saved weights agree
 * within 1e-5.  stderr of the launch stays in err. */
static inline void mp_as_single(char *err, size_t n, const char *name, const char *launch,
                                const char *strategy, const char *mp_args,
                                const char *single_args, const char *common)
{
    int rc = run_cmd(err, n, "%s train %s %s --save %s/%s-single.st", test_bin(), single_args,
                     common, test_tmp(), name);
    CHECKF(rc == 0, "%s: single exited %d: %s", name, rc, err);
    rc = run_cmd(err, n,
                 "%s launch %s -- train --strategy %s %s %s %s --metrics %s/%s.jsonl "
                 "--save %s/%s.st",
                 test_bin(), launch, strategy, single_args, mp_args, common, test_tmp(), name,
                 test_tmp(), name);
    CHECKF(rc == 0, "%s: %s exited %d: %s", name, strategy, rc, err);
    char single[256], mp[256];
    snprintf(single, sizeof single, "%s-single.st", name);
    snprintf(mp, sizeof mp, "%s.st", name);
    double d = checkpoint_max_diff(single, mp);
    fprintf(stderr, "%s: max |diff| against one process %.3g\n", name, d);
    CHECKF(d < 1e-5, "%s differs from one process at the same batch by %g", name, d);
}

/* Task `task` of K (`who`) says in run NAME's metrics that it holds its share
 * of a model of `total` parameters, within `slack`; returns what it holds. */
static inline double mp_check_share(const char *name, const char *who, int task, int K,
                                    double total, double slack)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.jsonl", test_tmp(), name);
    cJSON *ev = last_event(path, "model_parallel", who);
    CHECKF(ev != NULL, "%s: no model_parallel event from %s", name, who);
    if (!ev)
        return -1;
    double params = json_num(ev, "params");
    fprintf(stderr, "%s: %s (task %d of %d) holds %.0f of %.0f parameters\n", name, who, task, K,
            params, json_num(ev, "total_params"));
    CHECK(json_num(ev, "total_params") == total && json_num(ev, "mp_task") == task &&
          json_num(ev, "tasks") == K);
    CHECKF(params < total / K + slack && params > total / K - slack,
           "%s: %s holds %.0f, not about %.0f", name, who, params, total / K);
    cJSON_Delete(ev);
    return params;
}

#endif
