/* Layer pipelining through `downpour launch`, on MNIST:
 * - 2 stages (1f1b, 4 micro-batches) and 3 stages (gpipe, 8) end where one
 *   process at the same batch ends, within float noise, with sgd and adam;
 * - 2 replicas of 2 stages end where one process at the summed batch ends;
 * - the run reports the measured bubble beside the ideal (S-1)/(M+S-1), and
 *   the activations a stage held (gpipe: M);
 * - neighbours that send each other more than the sockets hold (activations
 *   one way, gradients the other: 24 MB a micro-batch) do not wait for each
 *   other (before the send thread, this run stopped after the heartbeat
 *   timeout with "peer stopped reading");
 * - killed at a step that is no checkpoint boundary and resumed, it ends
 *   with the uninterrupted run's weights, bitwise;
 * - bad pipeline flags are usage errors (exit 2) naming the flag; a cluster
 *   that is not a whole number of pipelines is refused with a hint. */
#include "proc.h"

#define COMMON "--train-size 1600 --val-size 500 --test-size 1000 --epochs 1 --threads 1 --no-progress " \
               "--log-every 0"

static char err[65536];

static void same_as_single(const char *name, const char *launch, const char *pipe_args,
                           const char *single_args)
{
    int rc = run_cmd(err, sizeof err, "%s train %s " COMMON " --save %s/%s-single.st", test_bin(),
                     single_args, test_tmp(), name);
    CHECKF(rc == 0, "%s: single exited %d: %s", name, rc, err);
    rc = run_cmd(err, sizeof err,
                 "%s launch %s -- train --strategy pipeline %s " COMMON
                 " --metrics %s/%s.jsonl --save %s/%s.st",
                 test_bin(), launch, pipe_args, test_tmp(), name, test_tmp(), name);
    CHECKF(rc == 0, "%s: pipeline exited %d: %s", name, rc, err);
    char single[256], pipe[256];
    snprintf(single, sizeof single, "%s-single.st", name);
    snprintf(pipe, sizeof pipe, "%s.st", name);
    double d = checkpoint_max_diff(single, pipe);
    fprintf(stderr, "%s: max |diff| against one process %.3g\n", name, d);
    CHECKF(d < 1e-5, "%s differs from one process at the same batch by %g", name, d);
}

static void check_bubble(const char *name, double ideal, int peak)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.jsonl", test_tmp(), name);
    cJSON *ev = last_event(path, "pipeline", "worker:0");
    CHECKF(ev != NULL, "%s: no pipeline event", name);
    if (!ev)
        return;
    double bubble = json_num(ev, "bubble");
    fprintf(stderr, "%s: bubble %.3f measured, %.3f ideal, %g micro-batches held\n", name,
            bubble, json_num(ev, "ideal_bubble"), json_num(ev, "peak_micro_batches"));
    CHECK(bubble > 0 && bubble < 1);
    CHECK_NEAR(json_num(ev, "ideal_bubble"), ideal, 1e-9);
    CHECK(json_num(ev, "peak_micro_batches") == peak);
    cJSON_Delete(ev);
}

static void resume_is_exact(void)
{
    const char *args = "--train-size 1600 --val-size 500 --test-size 1000 --epochs 2 --batch 50 --threads 1 "
                       "--no-progress --log-every 0 --optimizer adam --checkpoint-every 7";
    int rc = run_cmd(err, sizeof err, "%s launch --workers 2 -- train --strategy pipeline %s "
                     "--checkpoint-dir %s/ck-a --save %s/full.st",
                     test_bin(), args, test_tmp(), test_tmp());
    CHECKF(rc == 0, "the uninterrupted run exited %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "DOWNPOUR_FAULT_KILL_AT_STEP=40 %s launch --workers 2 -- train "
                 "--strategy pipeline %s --checkpoint-dir %s/ck-b --save %s/part.st",
                 test_bin(), args, test_tmp(), test_tmp());
    CHECKF(rc != 0, "the run meant to be killed at step 40 exited 0");
    rc = run_cmd(err, sizeof err, "%s launch --workers 2 -- train --strategy pipeline %s "
                 "--checkpoint-dir %s/ck-b --save %s/part.st --resume",
                 test_bin(), args, test_tmp(), test_tmp());
    CHECKF(rc == 0, "the resumed run exited %d: %s", rc, err);
    CHECKF(strstr(err, "(step 35)") != NULL, "the resumed run does not say it resumed from step "
           "35: %s", err);
    double d = checkpoint_max_diff("full.st", "part.st");
    CHECKF(d == 0, "the resumed run's weights differ from the uninterrupted run's by %g", d);
}

int main(void)
{
    REQUIRE(test_bin() && test_tmp());
    require_mnist();
    same_as_single("s2", "--workers 2", "--stages 2 --batch 64 --optimizer sgd --lr 0.1",
                   "--batch 64 --optimizer sgd --lr 0.1");
    check_bubble("s2", 1.0 / 5, 2);
    same_as_single("s3", "--workers 3",
                   "--schedule gpipe --micro-batches 8 --batch 64 --optimizer adam",
                   "--batch 64 --optimizer adam");
    check_bubble("s3", 2.0 / 10, 8);
    same_as_single("r2", "--chief --workers 3", "--stages 2 --batch 32 --optimizer sgd --lr 0.1",
                   "--batch 64 --optimizer sgd --lr 0.1");
    resume_is_exact();
    int rc = run_cmd(err, sizeof err, "%s launch --workers 2 -- train --strategy pipeline "
                     "--model 784-3000-10 --split 2 --batch 4096 --micro-batches 2 --train-size "
                     "4096 --val-size 100 --test-size 1000 --epochs 1 --threads 1 --no-progress --log-every 0 "
                     "--heartbeat-timeout 5",
                     test_bin());
    CHECKF(rc == 0, "stages sending each other 24 MB at once: exit %d: %s", rc, err);

    rc = run_cmd(err, sizeof err, "%s train --strategy pipeline --batch 8 --micro-batches 9",
                     test_bin());
    CHECKF(rc == 2 && strstr(err, "--micro-batches 9"), "exit %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s train --strategy pipeline --split 2,2", test_bin());
    CHECKF(rc == 2 && strstr(err, "--split"), "exit %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s train --strategy pipeline --schedule zb", test_bin());
    CHECKF(rc == 2 && strstr(err, "--schedule"), "exit %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s train --stages 2", test_bin());
    CHECKF(rc == 2 && strstr(err, "--strategy pipeline"), "exit %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s launch --workers 3 -- train --strategy pipeline --stages 2 "
                 COMMON, test_bin());
    CHECKF(rc != 0 && strstr(err, "whole number of pipelines"), "exit %d: %s", rc, err);
    return CHECK_DONE();
}
