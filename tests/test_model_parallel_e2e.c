/* Model parallelism through `downpour launch`, on MNIST:
 * - K = 2 (sgd) and K = 3 (adam) tasks end where one process at the same
 *   batch ends, within float noise; 2 replicas of K = 2 (the chief among
 *   them) end where one process at the summed batch ends;
 * - each task reports the parameters it holds (1/K of them) in its log and
 *   metrics;
 * - killed at a step that is no checkpoint boundary and resumed, it ends
 *   with the uninterrupted run's weights, bitwise;
 * - 2 replicas of 2 tasks train MNIST to >= 0.95 test accuracy in an epoch;
 * - under ps-async (each task a ps client of the shards holding its slices):
 *   one replica of 2 tasks ends where one process ends, within float noise,
 *   and resumes bitwise; 2 replicas of 2 train MNIST to >= 0.95;
 * - bad --model-parallel values are usage errors (exit 2) naming the flag; a
 *   cluster that is not a whole number of replicas is refused with a hint. */
#include "mp_e2e.h"

#define COMMON "--train-size 1600 --val-size 500 --test-size 1000 --epochs 1 --threads 1 --no-progress " \
               "--log-every 0"

static char err[65536];

static void strategy_as_single(const char *name, const char *launch, const char *strategy,
                               const char *mp_args, const char *single_args)
{
    mp_as_single(err, sizeof err, name, launch, strategy, mp_args, single_args, COMMON);
}

static void same_as_single(const char *name, const char *launch, const char *mp_args,
                           const char *single_args)
{
    strategy_as_single(name, launch, "model-parallel", mp_args, single_args);
}

/* Task `task` says it holds its share of mlp-300-100's 266,610 parameters. */
static void check_memory(const char *name, const char *who, int task, int K)
{
    double params = mp_check_share(name, who, task, K, 266610, 1000);
    char line[128];
    snprintf(line, sizeof line, "model-parallel: task %d holds %.0f parameters", task, params);
    CHECKF(strstr(err, line) != NULL, "%s: no line '%s'", name, line);
}

/* Killed at step 40 (no checkpoint boundary) and resumed from step 35, a
 * run under `launch LAUNCH` (one replica: deterministic) ends with the
 * uninterrupted run's weights, bitwise. */
static void resume_is_exact(const char *tag, const char *launch)
{
    const char *args = "--train-size 1600 --val-size 500 --test-size 1000 --epochs 2 --batch 50 --threads 1 "
                       "--no-progress --log-every 0 --optimizer adam --checkpoint-every 7";
    int rc = run_cmd(err, sizeof err, "%s launch %s %s --checkpoint-dir %s/%s-a --save "
                     "%s/%s-full.st", test_bin(), launch, args, test_tmp(), tag, test_tmp(), tag);
    CHECKF(rc == 0, "%s: the uninterrupted run exited %d: %s", tag, rc, err);
    rc = run_cmd(err, sizeof err, "DOWNPOUR_FAULT_KILL_AT_STEP=40 %s launch %s %s "
                 "--checkpoint-dir %s/%s-b --save %s/%s-part.st",
                 test_bin(), launch, args, test_tmp(), tag, test_tmp(), tag);
    CHECKF(rc != 0, "%s: the run meant to be killed at step 40 exited 0", tag);
    rc = run_cmd(err, sizeof err, "%s launch %s %s --checkpoint-dir %s/%s-b --save "
                 "%s/%s-part.st --resume", test_bin(), launch, args, test_tmp(), tag, test_tmp(),
                 tag);
    CHECKF(rc == 0, "%s: the resumed run exited %d: %s", tag, rc, err);
    CHECKF(strstr(err, "(step 35)") != NULL, "%s: the resumed run does not say it resumed from "
           "step 35: %s", tag, err);
    char full[64], part[64];
    snprintf(full, sizeof full, "%s-full.st", tag);
    snprintf(part, sizeof part, "%s-part.st", tag);
    double d = checkpoint_max_diff(full, part);
    fprintf(stderr, "%s: resumed against uninterrupted: max |diff| %g\n", tag, d);
    CHECKF(d == 0, "%s: the resumed run's weights differ from the uninterrupted run's by %g",
           tag, d);
}

/* 2 replicas of 2 tasks under `launch LAUNCH`, one epoch of MNIST (the
 * plain build: an accuracy on all 54,000 records, where ASan would check
 * the memory the runs above already check). */
static void trains_mnist(const char *launch)
{
    if (SANITIZED)
        return;
    int rc = run_cmd(err, sizeof err, "%s launch %s --model-parallel 2 --epochs 1 --batch 64 "
                     "--val-size 1000 --threads 1 --no-progress --log-every 0",
                     test_bin(), launch);
    CHECKF(rc == 0, "%s: exit %d: %s", launch, rc, err);
    const char *t = strstr(err, "Test accuracy: ");
    double acc = t ? atof(t + 15) : 0;
    fprintf(stderr, "%s: 2 replicas of 2 tasks, 1 epoch: test accuracy %.4f\n", launch, acc);
    CHECKF(acc >= 0.95, "%s: test accuracy %.4f < 0.95", launch, acc);
}

int main(void)
{
    REQUIRE(test_bin() && test_tmp());
    require_mnist();
    same_as_single("k2", "--workers 2", "--model-parallel 2 --batch 64 --optimizer sgd --lr 0.1",
                   "--batch 64 --optimizer sgd --lr 0.1");
    check_memory("k2", "worker:1", 1, 2);
    same_as_single("k3", "--workers 3", "--batch 64 --optimizer adam", "--batch 64 --optimizer adam");
    check_memory("k3", "worker:2", 2, 3);
    same_as_single("r2", "--chief --workers 3", "--model-parallel 2 --batch 32 --optimizer sgd "
                   "--lr 0.1", "--batch 64 --optimizer sgd --lr 0.1");
    check_memory("r2", "chief:0", 0, 2);
    resume_is_exact("mp", "--workers 2 -- train --strategy model-parallel");
    trains_mnist("--workers 4 -- train --strategy model-parallel");

    /* model-parallel replicas under ps-async */
    strategy_as_single("ps1", "--chief --workers 2 --ps 2", "ps-async", "--model-parallel 2 "
                       "--batch 64 --optimizer adam", "--batch 64 --optimizer adam");
    check_memory("ps1", "worker:1", 1, 2);
    resume_is_exact("ps", "--chief --workers 2 --ps 3 -- train --strategy ps-async "
                    "--model-parallel 2");
    trains_mnist("--chief --workers 4 --ps 2 -- train --strategy ps-async");
    int rc = run_cmd(err, sizeof err, "%s launch --chief --workers 2 --ps 1 -- train --strategy "
                     "ps-async --model-parallel 2 " COMMON, test_bin());
    CHECKF(rc != 0 && strstr(err, "needs 2 to"), "exit %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s train --strategy ps-sync --model-parallel 2", test_bin());
    CHECKF(rc == 2 && strstr(err, "--model-parallel is for"), "exit %d: %s", rc, err);

    rc = run_cmd(err, sizeof err, "%s train --strategy model-parallel --model-parallel 0",
                     test_bin());
    CHECKF(rc == 2 && strstr(err, "--model-parallel"), "exit %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s train --strategy model-parallel --model 784-300-3-10 "
                 "--model-parallel 4", test_bin());
    CHECKF(rc == 2 && strstr(err, "--model-parallel 4") && strstr(err, "only 3 output units"),
           "exit %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s train --model-parallel 2", test_bin());
    CHECKF(rc == 2 && strstr(err, "--strategy model-parallel"), "exit %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s launch --workers 3 -- train --strategy model-parallel "
                 "--model-parallel 2 " COMMON, test_bin());
    CHECKF(rc != 0 && strstr(err, "whole number of replicas"), "exit %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s launch --workers 2 --ps 1 -- train --strategy "
                 "model-parallel " COMMON, test_bin());
    CHECKF(rc != 0 && strstr(err, "needs no ps task"), "exit %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s launch --workers 2 -- train --strategy model-parallel "
                 "--ema 0.9 " COMMON, test_bin());
    CHECKF(rc != 0 && strstr(err, "--ema 0.9"), "exit %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s train --help >&2", test_bin());
    CHECKF(rc == 0 && strstr(err, "--model-parallel") && strstr(err, "model-parallel"),
           "--help does not list --model-parallel: %s", err);
    return CHECK_DONE();
}
