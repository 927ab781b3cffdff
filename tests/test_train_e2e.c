/* End to end through the downpour program: one epoch of mlp-300-100 on MNIST
 * reaches 0.95 validation accuracy; the same seed on one thread gives
 * bitwise identical weights twice; eval agrees with train; bad command lines
 * are refused with messages naming the culprit. */
#include <math.h>

#include "proc.h"

int main(void)
{
    const char *bin = test_bin(), *tmp = test_tmp();
    REQUIRE(bin && tmp);
    require_mnist();
    char err[8192];

    /* One epoch, one thread, twice. */
    for (int i = 0; i < 2; i++) {
        int rc = run_cmd(err, sizeof err,
                     "%s train --dataset mnist --model mlp-300-100 --batch 128 --epochs 1 --threads 1 "
                     "--log-every 100 --no-progress --metrics %s/e2e%d.jsonl --save %s/e2e%d.safetensors",
                     bin, tmp, i, tmp, i);
        CHECKF(rc == 0, "train exited %d: %s", rc, err);
        CHECKF(strstr(err, "Worker 0, At step 400, Cost: ") != NULL, "no step line in: %s", err);
    }
    char path[1200];
    snprintf(path, sizeof path, "%s/e2e0.jsonl", tmp);
    cJSON *epoch = last_event(path, "epoch", NULL);
    cJSON *done = last_event(path, "done", NULL);
    REQUIRE(epoch && done);
    double val = json_num(epoch, "val_accuracy");
    CHECKF(val >= 0.95, "validation accuracy after one epoch is %.4f, expected >= 0.95", val);
    CHECK(json_num(epoch, "epoch") == 1);
    CHECK(json_num(epoch, "train_loss") > 0 && json_num(epoch, "seconds") > 0);
    double test_acc = json_num(done, "test_accuracy");
    CHECK(test_acc >= 0.95);
    CHECK(json_num(done, "train_seconds") > 0 && json_num(done, "samples_per_second") > 0);
    CHECK(json_num(done, "batch") == 128 && json_num(done, "epochs") == 1);
    CHECK(strcmp(json_str(done, "strategy"), "single") == 0);
    CHECK(strcmp(json_str(done, "model"), "mlp-300-100") == 0);
    /* the epoch's step times and traffic: 422 steps over 54,000 records, alone */
    cJSON *steps = last_event(path, "steps", NULL);
    REQUIRE(steps);
    CHECK(json_num(steps, "epoch") == 1 && json_num(steps, "steps") == 422 &&
          json_num(steps, "step") == 422 && json_num(steps, "records") == 54000);
    double med = json_num(steps, "step_ms_median"), p90 = json_num(steps, "step_ms_p90"),
           max = json_num(steps, "step_ms_max"), mean = json_num(steps, "step_ms_mean");
    CHECKF(med > 0 && med <= p90 && p90 <= max && mean <= max, "step ms %g %g %g %g", med, p90,
           max, mean);
    double secs = json_num(steps, "train_seconds");
    CHECK(secs > 0 && fabs(json_num(steps, "samples_per_second") * secs - 54000) < 1);
    /* the steps are most of the epoch: their times add up to no more than it */
    CHECKF(mean * 422 <= secs * 1e3 * 1.001, "422 x %g ms in %g s", mean, secs);
    CHECK(json_num(steps, "comm_tx_bytes") == 0 && json_num(steps, "comm_rx_bytes") == 0);
    CHECK(json_num(epoch, "lr") > 0.00099 && json_num(epoch, "lr") < 0.00101);
    cJSON_Delete(steps);

    size_t la, lb;
    char pa[1200], pb[1200];
    snprintf(pa, sizeof pa, "%s/e2e0.safetensors", tmp);
    snprintf(pb, sizeof pb, "%s/e2e1.safetensors", tmp);
    char *a = slurp(pa, &la), *b = slurp(pb, &lb);
    REQUIRE(a && b);
    CHECKF(la == lb && memcmp(a, b, la) == 0, "two runs with the same seed differ (%zu vs %zu bytes)", la, lb);
    CHECK(la > 266610 * 4);
    free(a);
    free(b);

    /* eval agrees with train's own test accuracy. */
    int rc = run_cmd(err, sizeof err, "%s eval --checkpoint %s --dataset mnist --metrics %s/eval.jsonl", bin, pa, tmp);
    CHECKF(rc == 0, "eval exited %d: %s", rc, err);
    snprintf(path, sizeof path, "%s/eval.jsonl", tmp);
    cJSON *ev = last_event(path, "done", NULL);
    REQUIRE(ev);
    CHECK_NEAR(json_num(ev, "test_accuracy"), test_acc, 1e-9);
    cJSON_Delete(ev);
    cJSON_Delete(epoch);
    cJSON_Delete(done);

    /* Bad command lines. */
    CHECK(run_cmd(err, sizeof err, "%s train --bogus 3", bin) == 2 && strstr(err, "--bogus"));
    CHECK(run_cmd(err, sizeof err, "%s train --batch 12x", bin) == 2 && strstr(err, "--batch"));
    CHECK(run_cmd(err, sizeof err, "%s train --batch 0", bin) == 2 && strstr(err, "--batch"));
    CHECK(run_cmd(err, sizeof err, "%s train --optimizer rmsprop", bin) == 2 && strstr(err, "rmsprop"));
    /* a spec that cannot work and a dataset that is neither a name nor a
     * path are usage errors: 2 (docs/training.md, "Help, messages and exit status") */
    CHECK(run_cmd(err, sizeof err, "%s train --model 784-0-10 --epochs 1", bin) == 2 && strstr(err, "784-0-10"));
    CHECK(run_cmd(err, sizeof err, "%s train --dataset %s/nowhere --epochs 1", bin, tmp) == 2 &&
          strstr(err, "nowhere"));
    CHECK(run_cmd(err, sizeof err, "%s eval", bin) == 2 && strstr(err, "--checkpoint"));
    CHECK(run_cmd(NULL, 0, "%s train --help", bin) == 0);
    CHECK(run_cmd(NULL, 0, "%s --help", bin) == 0);
    CHECK(run_cmd(err, sizeof err, "%s frobnicate", bin) == 2 && strstr(err, "frobnicate"));

    /* A corrupt checkpoint is refused with its name. */
    snprintf(path, sizeof path, "%s/corrupt.safetensors", tmp);
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    fwrite("\x10\0\0\0\0\0\0\0{\"a\":", 1, 13, f);
    fclose(f);
    CHECK(run_cmd(err, sizeof err, "%s eval --checkpoint %s", bin, path) == 1 &&
          strstr(err, "corrupt.safetensors"));
    return CHECK_DONE();
}
