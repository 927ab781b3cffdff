/* All-reduce training through `downpour launch`, on MNIST:
 * - three replicas at batch b end where one process at batch 3b ends over
 *   the same data order (a short last step included), within float noise;
 * - the replicas are bitwise identical at the end, overlapped or not;
 * - a rank that stops answering ends the run within the collective timeout
 *   with a message naming it, instead of a hang;
 * - allreduce reaches 0.95 validation accuracy. */
#include <math.h>

#include "downpour/clock.h"
#include "downpour/safetensors.h"
#include "proc.h"

static char err[65536];

static double max_diff(const char *a_name, const char *b_name)
{
    char pa[1200], pb[1200];
    snprintf(pa, sizeof pa, "%s/%s", test_tmp(), a_name);
    snprintf(pb, sizeof pb, "%s/%s", test_tmp(), b_name);
    dp_safetensors *a = NULL, *b = NULL;
    dp_err e;
    double worst = INFINITY;
    if (dp_safetensors_load(pa, &a, &e) == 0 && dp_safetensors_load(pb, &b, &e) == 0) {
        worst = 0;
        for (int i = 0; i < dp_safetensors_count(a); i++) {
            const dp_st_tensor *ta = dp_safetensors_at(a, i), *tb;
            if (strncmp(ta->name, "layers.", 7) != 0 || !(tb = dp_safetensors_find(b, ta->name)))
                continue;
            size_t n = 1;
            for (int d = 0; d < ta->ndim; d++)
                n *= (size_t)ta->shape[d];
            for (size_t k = 0; k < n; k++)
                worst = fmax(worst, fabs((double)ta->data[k] - (double)tb->data[k]));
        }
    } else {
        CHECKF(0, "%s", e.msg);
    }
    dp_safetensors_free(a);
    dp_safetensors_free(b);
    return worst;
}

/* Every replica's final checksum agrees. */
static void crc_of(const cJSON *j, void *ctx)
{
    long *v = ctx;
    long crc = (long)json_num(j, "params_crc32c");
    if (v[0] == 0)
        v[1] = crc;
    else if (crc != v[1])
        v[2] = 1;
    v[0]++;
}

static void check_replicas(const char *metrics, int replicas)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", test_tmp(), metrics);
    long v[3] = {0, 0, 0};
    for_each_event(path, "replica", NULL, crc_of, v);
    CHECKF(v[0] == replicas && v[2] == 0, "%s: %ld replica checksums, %s", metrics, v[0],
           v[2] ? "not all equal" : "all equal");
}

int main(void)
{
    REQUIRE(test_bin() && test_tmp());
    require_mnist();
    const char *common = "--train-size 3200 --val-size 1000 --epochs 1 --optimizer sgd --lr 0.1 "
                         "--threads 1 --no-progress --log-every 0";
    int rc = run_cmd(err, sizeof err, "%s train --batch 192 %s --save %s/single.st", test_bin(),
                     common, test_tmp());
    CHECKF(rc == 0, "single exited %d: %s", rc, err);
    const char *modes[2] = {"", "--no-overlap"};
    for (int m = 0; m < 2; m++) {
        rc = run_cmd(err, sizeof err,
                     "%s launch --chief --workers 2 -- train --strategy allreduce --batch 64 "
                     "--bucket-bytes 100000 %s %s --metrics %s/ar%d.jsonl --save %s/ar%d.st",
                     test_bin(), modes[m], common, test_tmp(), m, test_tmp(), m);
        CHECKF(rc == 0, "allreduce %s exited %d: %s", modes[m], rc, err);
        double d = max_diff("single.st", m ? "ar1.st" : "ar0.st");
        fprintf(stderr, "allreduce %s vs one process at the summed batch: max |diff| %.3g\n",
                modes[m], d);
        CHECKF(d < 1e-5, "allreduce differs from one process at the summed batch by %g", d);
        check_replicas(m ? "ar1.jsonl" : "ar0.jsonl", 3);
    }

    /* Accuracy, five replicas, default buckets. */
    rc = run_cmd(err, sizeof err,
                 "%s launch --workers 5 -- train --strategy allreduce --epochs 2 --threads 1 "
                 "--no-progress --log-every 0 --metrics %s/acc.jsonl",
                 test_bin(), test_tmp());
    CHECKF(rc == 0, "allreduce on 5 workers exited %d: %s", rc, err);
    char path[1200];
    snprintf(path, sizeof path, "%s/acc.jsonl", test_tmp());
    cJSON *epoch = last_event(path, "epoch", "worker:0");
    REQUIRE(epoch);
    CHECKF(json_num(epoch, "val_accuracy") >= 0.95, "val_accuracy %.4f",
           json_num(epoch, "val_accuracy"));
    cJSON_Delete(epoch);
    check_replicas("acc.jsonl", 5);

    /* A rank that stops answering: named, and the run ends, within the timeout. */
    double t0 = dp_now();
    rc = run_cmd(err, sizeof err,
                 "%s launch --workers 3 --grace 2 -- train --strategy allreduce --epochs 1 "
                 "--train-size 1280 %s --straggler 1:60000 --collective-timeout 2",
                 test_bin(), common + strlen("--train-size 3200 "));
    double secs = dp_now() - t0;
    CHECKF(rc != 0, "a stuck rank did not fail the run");
    CHECKF(secs < 20, "the run took %.1f s to give up on a stuck rank", secs);
    CHECKF(strstr(err, "worker:1") && strstr(err, "all-reduce step 1"),
           "the error does not name the rank and the step: %s", err);
    return CHECK_DONE();
}
