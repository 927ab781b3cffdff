/* A lost task in --strategy model-parallel under `downpour launch`: without
 * --checkpoint-dir the run stops with a message naming it, never hangs; with
 * it and a restart left every task starts again from the newest checkpoint
 * (restarts_all, docs/faults.md).
 * - worker:1 (task 1 of 3) SIGKILLed once worker:2 logged step 20: the
 *   launcher stops the run, exit non-zero, naming worker:1 and what would
 *   have let it survive;
 * - worker:1 frozen (SIGSTOP): its replica notices within the heartbeat
 *   timeout and stops with "lost model-parallel task 1 of replica 0, worker:1";
 * - worker:1 sent SIGTERM: a model-parallel task cannot drain, and says so
 *   after its step; its end is a lost task's (the run stops);
 * - under ps-async (which goes on without a lost worker of its own), worker:1
 *   of a model-parallel replica SIGKILLed: the run stops, the launcher naming
 *   it;
 * - under launch --max-restarts 1 with --checkpoint-every 7, 64 steps: worker:1
 *   of model-parallel, and ps:0 and worker:1 (plain build only) of ps-async
 *   --model-parallel 2 (one replica: deterministic), SIGKILLed at step 20:
 *   exit 0, a "restart all" fault event, and the --save file is the
 *   uninterrupted run's byte for byte. */
#include "launch.h"

static int run(const char *name, const char *launch, const char *line, const char *fault)
{
    char args[2048];
    /* 1 s to notice a freeze; a drain's refusal wants no short timeout a
     * loaded machine can outlast (test_pipeline_faults) */
    snprintf(args, sizeof args, "%s " RUN " --heartbeat-timeout %d --metrics %s/%s.jsonl", launch,
             strcmp(fault, "term") == 0 ? 10 : 1, tmp, name);
    pid_t l = start(name, args);
    pid_t w = await_task(l, name, line, "worker:1");
    double t0 = now_s();
    if (w > 0)
        kill(w, strcmp(fault, "kill") == 0   ? SIGKILL
                : strcmp(fault, "term") == 0 ? SIGTERM /* not its parent's: a drain request */
                                             : SIGSTOP);
    int rc = finish(l, 60);
    double took = now_s() - t0;
    fprintf(stderr, "%s: the launcher exited %d %.2f s after the fault\n", name, rc, took);
    if (w > 0 && strcmp(fault, "stop") == 0)
        kill(w, SIGKILL); /* the launcher may have left a stopped task behind */
    CHECKF(w > 0, "%s: worker:1 never reached step 20", name);
    CHECKF(took < 30, "%s: the run took %.1f s to stop", name, took);
    /* stopped, not finished: no test accuracy */
    CHECKF(test_accuracy(name) < 0 && count_events(name, "done") == 0,
           "%s: the run finished as if no task was lost", name);
    return rc;
}

int main(void)
{
    launch_test_init();
    const char *mp = "--workers 3 -- train --strategy model-parallel";
    const char *at20 = "Worker 2 (mp task 2), At step 20,";
    int rc = run("kill", mp, at20, "kill");
    CHECKF(rc != 0 && rc != -1, "kill: exit %d", rc);
    CHECKF(log_has("kill", "worker:1") &&
               log_has("kill", "model-parallel cannot survive a lost worker without "
                               "--checkpoint-dir"),
           "kill: the stop does not name worker:1 and what was missing");
    rc = run("stop", mp, at20, "stop");
    CHECKF(rc != 0 && rc != -1, "stop: exit %d", rc);
    CHECKF(log_has("stop", "lost model-parallel task 1 of replica 0, worker:1"),
           "stop: no task noticed the frozen worker:1");
    rc = run("term", mp, at20, "term");
    CHECKF(rc != 0 && rc != -1, "term: exit %d", rc);
    CHECKF(log_has("term", "SIGTERM: model-parallel task 1 of replica 0 holds slices of every "
                           "layer"),
           "term: worker:1 does not refuse the drain in words");
    rc = run("ps", "--chief --workers 2 --ps 2 -- train --strategy ps-async --model-parallel 2",
             "Worker 0 (mp task 0), At step 20,", "kill");
    CHECKF(rc != 0 && rc != -1, "ps: exit %d", rc);
    CHECKF(log_has("ps", "worker:1") &&
               log_has("ps", "ps-async --model-parallel cannot survive a lost worker without "
                             "--checkpoint-dir"),
           "ps: the launcher does not name the lost worker:1");

    /* 64 steps at 20 ms each: the kill at step 20 comes well before the end */
    setenv("DOWNPOUR_TEST_STEP_MS", "20", 1);
    const char *small = "--dataset mnist --model 784-128-10 --train-size 1600 --val-size 500 "
                        "--test-size 1000 --epochs 2 --batch 50 --threads 1 --no-progress "
                        "--log-every 10 --optimizer adam --checkpoint-every 7";
    char train[1024];
    snprintf(train, sizeof train, "--strategy model-parallel %s", small);
    uninterrupted("mp-full", "--workers 3", train);
    restarts_all("mp-restart", "mp-full", "--workers 3", train, at20, "worker:1");
    snprintf(train, sizeof train, "--strategy ps-async --model-parallel 2 %s", small);
    const char *ps = "--chief --workers 2 --ps 2";
    uninterrupted("ps-full", ps, train);
    restarts_all("ps-restart-ps", "ps-full", ps, train, "Worker 0 (mp task 0), At step 20,",
                 "ps:0");
    /* the plain build only: under ASan+UBSan the two cases above run the
     * same launcher and resume code */
    if (!SANITIZED)
        restarts_all("ps-restart-worker", "ps-full", ps, train,
                     "Worker 0 (mp task 0), At step 20,", "worker:1");
    return CHECK_DONE();
}
