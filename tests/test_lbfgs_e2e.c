/* Sandblaster L-BFGS through `downpour launch`, on MNIST:
 * - a chief, 2 workers and 2 ps tasks train mlp-128 on 10,000 records
 *   (full-batch L-BFGS, portions of 1,000) to a test accuracy above 0.88 in
 *   20 iterations; every iteration is in the metrics with its evaluations,
 *   portions and backups, and --save writes the weights;
 * - with worker 1 slowed by 200 ms a portion (--straggler 1:200), backup
 *   copies are handed out, the run still ends with the same accuracy within
 *   a point, and no portion counts twice (each shard reports the portions it
 *   accumulated at every evaluation and the chief checks the count);
 * - checkpoints and --resume (2,000 records, 2 batches an epoch, one portion
 *   a batch so that two runs add the same numbers): every task killed after
 *   step 5, resumed from the checkpoint of step 3 (in the middle of epoch
 *   2), the run ends with the uninterrupted run's --save file byte for byte;
 *   resumed with 1 worker instead of 2, with its weights;
 * - bad flags are usage errors (exit 2) naming the flag; a cluster without
 *   ps tasks is refused with a hint. */
#include "proc.h"

#define RUN "--strategy lbfgs --model mlp-128 --train-size 10000 --val-size 1000 " \
            "--batch 10000 --portion 1000 --threads 1 --no-progress --log-every 0"

static char err[65536];

/* Sums the "backups" of every lbfgs event. */
static void add_backups(const cJSON *j, void *ctx)
{
    *(double *)ctx += json_num(j, "backups");
}

static double run_lbfgs(const char *name, const char *extra, int epochs)
{
    int rc = run_cmd(err, sizeof err,
                     "%s launch --chief --workers 2 --ps 2 -- train " RUN " --epochs %d %s "
                     "--metrics %s/%s.jsonl --save %s/%s.st",
                     test_bin(), epochs, extra, test_tmp(), name, test_tmp(), name);
    CHECKF(rc == 0, "%s: exit %d: %s", name, rc, err);
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.jsonl", test_tmp(), name);
    double acc = done_accuracy(path);
    fprintf(stderr, "%s: test accuracy %.4f\n", name, acc);
    return acc;
}

#define CKPT "--strategy lbfgs --model mlp-128 --train-size 2000 --val-size 500 " \
             "--test-size 1000 --batch 1000 --portion 1000 --threads 1 --no-progress " \
             "--log-every 0 --epochs 3 --checkpoint-every 3"

static void resume_is_exact(void)
{
    const char *bin = test_bin(), *tmp = test_tmp();
    int rc = run_cmd(err, sizeof err, "%s launch --chief --workers 2 --ps 2 -- train " CKPT
                     " --checkpoint-dir %s/ck-a --save %s/full.st", bin, tmp, tmp);
    CHECKF(rc == 0, "the uninterrupted run: exit %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "DOWNPOUR_FAULT_KILL_AT_STEP=5 %s launch --chief --workers 2 "
                 "--ps 2 -- train " CKPT " --checkpoint-dir %s/ck-b --save %s/part.st",
                 bin, tmp, tmp);
    CHECKF(rc != 0, "the run meant to be killed at step 5 exited 0");
    char probe[1200];
    snprintf(probe, sizeof probe, "%s/ck-b/ckpt-0000000003.safetensors", tmp);
    CHECKF(access(probe, R_OK) == 0, "no checkpoint at step 3 before the kill");
    /* a copy of it for the resume with another cluster */
    rc = run_cmd(err, sizeof err, "mkdir -p %s/ck-c && cp %s %s/ck-c/", tmp, probe, tmp);
    REQUIRE(rc == 0);
    rc = run_cmd(err, sizeof err, "%s launch --chief --workers 2 --ps 2 -- train " CKPT
                 " --checkpoint-dir %s/ck-b --save %s/part.st --resume", bin, tmp, tmp);
    CHECKF(rc == 0 && strstr(err, "ckpt-0000000003.safetensors (step 3)") &&
               strstr(err, "resumed at iteration 3"),
           "the resumed run: exit %d: %s", rc, err);
    CHECKF(same_file("full.st", "part.st"), "the resumed run's weights differ from the "
           "uninterrupted run's (largest difference %g)", checkpoint_max_diff("full.st", "part.st"));
    rc = run_cmd(err, sizeof err, "%s launch --chief --workers 1 --ps 2 -- train " CKPT
                 " --checkpoint-dir %s/ck-c --save %s/one.st --resume", bin, tmp, tmp);
    CHECKF(rc == 0, "resumed with 1 worker: exit %d: %s", rc, err);
    double d = checkpoint_max_diff("full.st", "one.st");
    CHECKF(d == 0, "resumed with 1 worker instead of 2, the weights differ by %g", d);
}

int main(void)
{
    REQUIRE(test_bin() && test_tmp());
    require_mnist();
    double acc = run_lbfgs("plain", "", 20);
    CHECKF(acc > 0.88, "lbfgs reached %.4f", acc);
    char path[1200];
    snprintf(path, sizeof path, "%s/plain.jsonl", test_tmp());
    cJSON *it = last_event(path, "lbfgs", NULL);
    CHECKF(it != NULL, "no lbfgs event in %s", path);
    if (it) {
        CHECK(json_num(it, "iteration") == 20);
        CHECK(json_num(it, "portions") >= 10);
        CHECK(json_num(it, "evaluations") >= 1);
        cJSON_Delete(it);
    }
    resume_is_exact();
    double slow = run_lbfgs("straggler", "--straggler 1:200", 6);
    double fast = run_lbfgs("plain6", "", 6);
    CHECKF(fabs(slow - fast) < 0.01, "with a straggler %.4f, without %.4f", slow, fast);
    snprintf(path, sizeof path, "%s/straggler.jsonl", test_tmp());
    double backups = 0;
    for_each_event(path, "lbfgs", NULL, add_backups, &backups);
    fprintf(stderr, "straggler: %.0f backup copies\n", backups);
    CHECK(backups > 0);

    int rc = run_cmd(err, sizeof err, "%s train --strategy lbfgs --lbfgs-history 0", test_bin());
    CHECKF(rc == 2 && strstr(err, "--lbfgs-history"), "exit %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s train --strategy lbfgs --batch 100 --portion 200",
                 test_bin());
    CHECKF(rc == 2 && strstr(err, "--portion 200"), "exit %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s train --portion 100", test_bin());
    CHECKF(rc == 2 && strstr(err, "--strategy lbfgs"), "exit %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s launch --chief --workers 2 -- train " RUN " --epochs 1",
                 test_bin());
    CHECKF(rc == 2 && strstr(err, "at least one ps task") && strstr(err, "--ps 1"), "exit %d: %s",
           rc, err);
    return CHECK_DONE();
}
