/* A lost stage in --strategy pipeline under `downpour launch` (survives =
 * 0): the run stops with a message naming it, never hangs.
 * - worker:1 (the middle of 3 stages) SIGKILLed once the last stage logged
 *   step 20: the launcher stops the run, exit non-zero, naming worker:1;
 * - worker:1 frozen (SIGSTOP): its neighbours notice within the heartbeat
 *   timeout and stop with "lost pipeline stage 1 of replica 0, worker:1". */
#include "launch.h"

static int run(const char *name, const char *fault)
{
    char args[2048];
    snprintf(args, sizeof args, "--workers 3 -- train --strategy pipeline " RUN
             " --heartbeat-timeout 1 --metrics %s/%s.jsonl", tmp, name);
    pid_t l = start(name, args);
    pid_t w = await_task(l, name, "Worker 2 (stage 2), At step 20,", "worker:1");
    double t0 = now_s();
    if (w > 0)
        kill(w, strcmp(fault, "kill") == 0 ? SIGKILL : SIGSTOP);
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
    CHECKF(log_has("kill", "worker:1") && log_has("kill", "cannot survive"),
           "kill: the stop does not name worker:1");
    rc = run("stop", "stop");
    CHECKF(rc != 0 && rc != -1, "stop: exit %d", rc);
    CHECKF(log_has("stop", "lost pipeline stage 1 of replica 0, worker:1"),
           "stop: no stage noticed the frozen worker:1");
    return CHECK_DONE();
}
