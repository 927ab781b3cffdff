/* A lost stage in --strategy pipeline under `downpour launch`: without
 * --checkpoint-dir the run stops with a message naming it, never hangs;
 * with it and a restart left every task starts again from the newest
 * checkpoint (restarts_all, docs/faults.md).
 * - worker:1 (the middle of 3 stages) SIGKILLed once the last stage logged
 *   step 20: the launcher stops the run, exit non-zero, naming worker:1 and
 *   what would have let it survive;
 * - worker:1 frozen (SIGSTOP): its neighbours notice within the heartbeat
 *   timeout and stop with "lost pipeline stage 1 of replica 0, worker:1";
 * - worker:1 sent SIGTERM: a stage cannot drain, and says so after its step;
 *   its end is a lost stage's (the run stops);
 * - worker:1 SIGKILLed at step 20 of 64 under launch --max-restarts 1 with
 *   --checkpoint-every 7: exit 0, a "restart all" fault event, and the
 *   --save file is the uninterrupted run's byte for byte. */
#include "launch.h"

static int run(const char *name, const char *fault)
{
    char args[2048];
    /* a freeze is noticed within the 1 s heartbeat timeout; a drain's
     * refusal needs no short one, which a loaded machine can outlast (a
     * neighbour that took worker:1 for lost first ended the run with
     * another message, once) */
    snprintf(args, sizeof args, "--workers 3 -- train --strategy pipeline " RUN
             " --heartbeat-timeout %d --metrics %s/%s.jsonl", strcmp(fault, "term") == 0 ? 10 : 1,
             tmp, name);
    pid_t l = start(name, args);
    pid_t w = await_task(l, name, "Worker 2 (stage 2), At step 20,", "worker:1");
    double t0 = now_s();
    if (w > 0)
        kill(w, strcmp(fault, "kill") == 0   ? SIGKILL
                : strcmp(fault, "term") == 0 ? SIGTERM /* not its parent's: a drain request */
                                             : SIGSTOP);
    int rc = finish(l, 60);
    fprintf(stderr, "%s: the launcher exited %d %.2f s after the fault\n", name, rc,
            now_s() - t0);
    if (w > 0 && strcmp(fault, "stop") == 0)
        kill(w, SIGKILL); /* the launcher may have left a stopped task behind */
    /* stopped, not finished: no test accuracy, no per-stage summary */
    CHECKF(test_accuracy(name) < 0 && count_events(name, "stage") < 3,
           "%s: the run finished as if no stage was lost", name);
    return rc;
}

int main(void)
{
    launch_test_init();
    int rc = run("kill", "kill");
    CHECKF(rc != 0 && rc != -1, "kill: exit %d", rc);
    CHECKF(log_has("kill", "worker:1") &&
               log_has("kill", "pipeline cannot survive a lost worker without --checkpoint-dir"),
           "kill: the stop does not name worker:1 and what was missing");
    rc = run("stop", "stop");
    CHECKF(rc != 0 && rc != -1, "stop: exit %d", rc);
    CHECKF(log_has("stop", "lost pipeline stage 1 of replica 0, worker:1"),
           "stop: no stage noticed the frozen worker:1");
    rc = run("term", "term");
    CHECKF(rc != 0 && rc != -1, "term: exit %d", rc);
    CHECKF(log_has("term", "SIGTERM: pipeline stage 1 of replica 0 holds layers no other task "
                           "has, so it cannot drain"),
           "term: worker:1 does not refuse the drain in words");

    /* 64 steps at 20 ms each: the kill at step 20 comes well before the end */
    setenv("DOWNPOUR_TEST_STEP_MS", "20", 1);
    const char *small = "--strategy pipeline --dataset mnist --model 784-128-10 --train-size 1600 "
                        "--val-size 500 --test-size 1000 --epochs 2 --batch 50 --threads 1 "
                        "--no-progress --log-every 10 --optimizer adam --checkpoint-every 7";
    uninterrupted("full", "--workers 3", small);
    restarts_all("restart", "full", "--workers 3", small, "Worker 2 (stage 2), At step 20,",
                 "worker:1");
    return CHECK_DONE();
}
