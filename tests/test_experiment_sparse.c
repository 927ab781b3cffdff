/* downpour experiment sparse (docs/experiments.md): on a small
 * `downpour data synth ctr` set of categorical ids only and
 * 8-emb1000x16-gap-dense1-bce, two seeds a strategy:
 * - every strategy finishes and results.json holds its AUC, log loss,
 *   samples/s and bytes per step per worker;
 * - allreduce moves the table by rows and allreduce-dense whole, with the
 *   same AUC (the same bits), and by rows at least 3x fewer bytes; ps-async
 *   and ps-sync move rows too;
 * - the cost model's bytes per step per worker are within 10 % of the
 *   measured for every strategy (the measured add heartbeats and epoch
 *   reports; docs/cost_model.md, "Sparse tables");
 * - the recommendation names one of the strategies, with reasons;
 * - the default model (wide-deep's shape) runs on a set the study writes;
 * - a bad --runs item is refused naming it (exit 2). */
#include <math.h>

#include "proc.h"

static char err[65536];

static cJSON *read_json(const char *path)
{
    char *s = slurp(path, NULL);
    CHECKF(s != NULL, "%s missing", path);
    cJSON *j = s ? cJSON_Parse(s) : NULL;
    CHECKF(j != NULL, "%s is not JSON", path);
    free(s);
    return j;
}

static double stat_median(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, key),
                                                      "median");
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

int main(void)
{
    REQUIRE(test_bin() && test_tmp());
    int rc = run_cmd(err, sizeof err, "%s data synth ctr --to %s/ids --rows 4000 --test-rows 500 "
                     "--numeric 0 --seed 1 --force", test_bin(), test_tmp());
    CHECKF(rc == 0, "synth exited %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s experiment sparse --out %s/sp --data %s/ids --rows 4000 "
                 "--model 8-emb1000x16-gap-dense1-bce --repeats 2", test_bin(), test_tmp(),
                 test_tmp());
    CHECKF(rc == 0, "experiment sparse exited %d: %s", rc, err);
    char path[1200];
    snprintf(path, sizeof path, "%s/sp/results.json", test_tmp());
    cJSON *root = read_json(path);
    REQUIRE(root);
    const cJSON *cells = cJSON_GetObjectItemCaseSensitive(root, "cells");
    CHECKF(cJSON_GetArraySize(cells) == 4, "%d cells", cJSON_GetArraySize(cells));
    double bytes[4] = {0}, auc[4] = {0};
    const char *names[4] = {"ps-async", "ps-sync", "allreduce", "allreduce-dense"};
    for (int i = 0; i < 4; i++) {
        const cJSON *c = cJSON_GetArrayItem(cells, i);
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(c, "status");
        CHECKF(cJSON_IsString(st) && strcmp(st->valuestring, "done") == 0, "%s: %s", names[i],
               cJSON_IsString(st) ? st->valuestring : "?");
        bytes[i] = stat_median(c, "bytes_per_step_per_worker");
        auc[i] = stat_median(c, "test_auc");
        double ll = stat_median(c, "test_log_loss"), sps = stat_median(c, "samples_per_second");
        const cJSON *pred = cJSON_GetObjectItemCaseSensitive(c, "predicted_bytes_per_step_per_worker");
        double p = cJSON_IsNumber(pred) ? pred->valuedouble : NAN;
        fprintf(stderr, "%-16s AUC %.4f, log loss %.4f, %.0f samples/s, %.0f bytes a step "
                "(predicted %.0f)\n", names[i], auc[i], ll, sps, bytes[i], p);
        CHECKF(auc[i] > 0 && auc[i] < 1 && ll > 0 && sps > 0, "%s: figures missing", names[i]);
        CHECKF(fabs(p / bytes[i] - 1) < 0.10, "%s: predicted %.0f bytes a step, measured %.0f",
               names[i], p, bytes[i]);
        const cJSON *rows = cJSON_GetObjectItemCaseSensitive(c, "tables_by_rows");
        CHECKF(cJSON_IsTrue(rows) == (i != 3), "%s: tables_by_rows %d", names[i],
               cJSON_IsTrue(rows));
    }
    CHECKF(auc[2] == auc[3], "allreduce by rows and whole differ in AUC: %.6f against %.6f",
           auc[2], auc[3]);
    CHECKF(bytes[2] * 3 < bytes[3], "allreduce by rows moves %.0f bytes a step, whole %.0f",
           bytes[2], bytes[3]);
    const cJSON *rec = cJSON_GetObjectItemCaseSensitive(root, "recommendation");
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(rec, "strategy");
    CHECKF(cJSON_IsString(s), "no strategy recommended");
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(rec, "reasons")) >= 3);
    cJSON_Delete(root);
    snprintf(path, sizeof path, "%s/sp/report.html", test_tmp());
    size_t len = 0;
    char *html = slurp(path, &len);
    CHECKF(html && len > 1000 && strstr(html, "allreduce-dense"), "report.html: %zu bytes", len);
    free(html);

    /* the default: wide-deep's shape on a set the study writes, one seed */
    rc = run_cmd(err, sizeof err, "%s experiment sparse --out %s/wd --rows 2000 --test-rows 300 "
                 "--repeats 1 --runs ps-sync,allreduce", test_bin(), test_tmp());
    CHECKF(rc == 0, "experiment sparse (default model) exited %d: %s", rc, err);
    snprintf(path, sizeof path, "%s/wd/results.json", test_tmp());
    root = read_json(path);
    REQUIRE(root);
    rec = cJSON_GetObjectItemCaseSensitive(root, "recommendation");
    const cJSON *r0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(rec, "reasons"), 0);
    CHECKF(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(rec, "strategy")) &&
               cJSON_IsString(r0) && strstr(r0->valuestring, "One seed ran"),
           "one seed draws no verdict");
    cJSON_Delete(root);

    rc = run_cmd(err, sizeof err, "%s experiment sparse --out %s/bad --runs ps-async,single",
                 test_bin(), test_tmp());
    CHECKF(rc == 2 && strstr(err, "single"), "a bad --runs item: exit %d, %s", rc, err);
    return CHECK_DONE();
}
