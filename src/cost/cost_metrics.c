/* The cost model's inputs read from metrics files (docs/metrics.md): a
 * calibration from a short single-process run, and a measured run's `done`
 * event to compare a prediction with (docs/cost_model.md, "Calibration"). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/cost_model.h"
#include "downpour/model.h"
#include "downpour/powersgd.h"

int dp_cost_model_params(const char *model, size_t *n_params, dp_err *err)
{
    dp_model m;
    memset(&m, 0, sizeof m);
    if (dp_model_describe(&m, model, err) < 0)
        return dp_err_prefix(err, "model '%s'", model);
    *n_params = m.n_params;
    dp_model_free(&m);
    return 0;
}

int dp_cost_powersgd(const char *model, int rank, size_t *floats, double *madds, dp_err *err)
{
    dp_model m;
    memset(&m, 0, sizeof m);
    if (dp_model_describe(&m, model, err) < 0)
        return dp_err_prefix(err, "model '%s'", model);
    dp_psgd_matrix *mats = malloc(sizeof *mats * DP_POWERSGD_MAX_MATRICES);
    if (!mats) {
        dp_model_free(&m);
        return dp_errf(err, "out of memory");
    }
    dp_psgd_plan plan;
    int k = dp_powersgd_matrices(&m, rank, mats, DP_POWERSGD_MAX_MATRICES, &plan);
    double ma = 0;
    for (int i = 0; i < k && i < DP_POWERSGD_MAX_MATRICES; i++)
        if (mats[i].rank > 0)
            ma += 4.0 * mats[i].rows * (double)mats[i].cols * mats[i].rank;
    free(mats);
    dp_model_free(&m);
    if (plan.compressed == 0)
        return dp_errf(err, "powersgd:%d compresses no matrix of model '%s' (the largest rank that "
                            "compresses one is %d)", rank, model, plan.max_rank);
    *floats = plan.factor_floats + plan.whole_floats;
    *madds = ma;
    return 0;
}

static double num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static const char *str(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* A count field; 0 when absent or not a sane count. */
static int count(const cJSON *o, const char *key)
{
    double v = num(o, key);
    return isfinite(v) && v >= 0 && v <= 1e9 ? (int)v : 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Reads the file's `done` event (the last) into run, and the step medians
 * of its `steps` events into *medians (malloc'd, *n of them). */
static int read_file(const char *path, dp_cost_run *run, double **medians, int *n, dp_err *err)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return dp_errf(err, "cannot open metrics file %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int have_done = 0, cap_m = 0, rc = 0;
    long lineno = 0;
    *medians = NULL;
    *n = 0;
    memset(run, 0, sizeof *run);
    while ((len = getline(&line, &cap, f)) > 0) {
        lineno++;
        cJSON *o = cJSON_ParseWithLength(line, (size_t)len);
        const char *ev = o ? str(o, "event") : NULL;
        if (!cJSON_IsObject(o) || !ev) {
            cJSON_Delete(o);
            rc = dp_errf(err, "%s:%ld: not a metrics event (a JSON object with \"event\")", path,
                         lineno);
            break;
        }
        /* eval's done event has no train_seconds: only training runs count */
        if (strcmp(ev, "done") == 0 && str(o, "strategy") && isfinite(num(o, "train_seconds"))) {
            const char *s = str(o, "strategy"), *m = str(o, "model");
            snprintf(run->strategy, sizeof run->strategy, "%s", s);
            snprintf(run->model, sizeof run->model, "%s", m ? m : "");
            run->batch = count(o, "batch");
            run->epochs = count(o, "epochs");
            run->workers = count(o, "workers");
            run->ps = count(o, "ps");
            run->train_seconds = num(o, "train_seconds");
            run->samples_per_second = num(o, "samples_per_second");
            have_done = 1;
        } else if (strcmp(ev, "steps") == 0) {
            double med = num(o, "step_ms_median");
            if (isfinite(med) && med > 0) {
                if (*n == cap_m) {
                    cap_m = cap_m ? 2 * cap_m : 16;
                    double *g = realloc(*medians, sizeof *g * (size_t)cap_m);
                    if (!g) {
                        cJSON_Delete(o);
                        rc = dp_errf(err, "out of memory");
                        break;
                    }
                    *medians = g;
                }
                (*medians)[(*n)++] = med / 1e3;
            }
        }
        cJSON_Delete(o);
    }
    free(line);
    fclose(f);
    if (rc == 0 && !have_done)
        rc = dp_errf(err, "%s: no \"done\" event of a training run (did the run finish?)", path);
    if (rc == 0 && !(run->batch >= 1) )
        rc = dp_errf(err, "%s: the done event has no valid \"batch\"", path);
    if (rc == 0 && !(run->train_seconds > 0))
        rc = dp_errf(err, "%s: the done event has no positive \"train_seconds\"", path);
    if (rc < 0) {
        free(*medians);
        *medians = NULL;
        *n = 0;
    }
    return rc;
}

int dp_cost_read_done(const char *path, dp_cost_run *run, dp_err *err)
{
    double *med;
    int n;
    if (read_file(path, run, &med, &n, err) < 0)
        return -1;
    free(med);
    return 0;
}

int dp_cost_calibrate_from_metrics(const char *path, dp_cost_calibration *cal, int *batch,
                                   dp_err *err)
{
    dp_cost_run run;
    double *med;
    int n;
    if (read_file(path, &run, &med, &n, err) < 0)
        return -1;
    int rc = 0;
    if (strcmp(run.strategy, dp_cost_strategy_name(DP_COST_SINGLE)) != 0) {
        rc = dp_errf(err, "%s: calibration needs a single-process run (strategy single, "
                          "--threads 1); this one is %s",
                     path, run.strategy);
        goto done;
    }
    size_t np;
    if (dp_cost_model_params(run.model, &np, err) < 0) {
        rc = dp_err_prefix(err, "%s", path);
        goto done;
    }
    double step;
    if (n > 0) {
        /* The median of the epochs' medians: a step alone, no validation,
         * and robust to the odd slow step of a shared machine. */
        qsort(med, (size_t)n, sizeof *med, cmp_double);
        step = n % 2 ? med[n / 2] : 0.5 * (med[n / 2 - 1] + med[n / 2]);
    } else {
        if (!(run.samples_per_second > 0)) {
            rc = dp_errf(err, "%s: no steps events and no positive samples_per_second", path);
            goto done;
        }
        step = run.batch / run.samples_per_second; /* validation time included: a bit high */
    }
    double s = (step - cal->apply_s_per_param * (double)np) / run.batch;
    if (!(s > 0)) /* the update cannot take the whole step; keep the step's own figure */
        s = step / run.batch;
    cal->sample_s = s;
    cal->n_params = np;
    if (batch)
        *batch = run.batch;
done:
    free(med);
    return rc;
}
