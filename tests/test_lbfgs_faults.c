/* A lost chief or ps task of Sandblaster L-BFGS (docs/faults.md): with
 * --checkpoint-dir and launch --max-restarts, the launcher stops every task
 * and starts them all again with --resume, and the run goes on from the
 * newest checkpoint.  One portion a batch, so two runs are the same bits:
 * - ps:0 SIGKILLed after the checkpoint of step 3: the run exits 0 and its
 *   --save file is the uninterrupted run's byte for byte; the merged
 *   metrics hold the launcher's "restart all" fault;
 * - the chief SIGKILLed the same way: the same;
 * - without a restart left (--max-restarts 0) the run stops, and the
 *   launcher says why; without --checkpoint-dir, too;
 * - worker:1 sent SIGTERM (docs/faults.md, "Draining") once epoch 2 was
 *   evaluated: it leaves at a portion boundary and exits 0, the chief hands
 *   its portions to worker:0 with a drain line and event and no fault, and
 *   the --save file is the uninterrupted run's byte for byte. */
#include "launch.h"

#define LB "--strategy lbfgs --dataset mnist --model mlp-128 --train-size 2000 " \
           "--val-size 500 --test-size 1000 --batch 1000 --portion 1000 --threads 1 " \
           "--no-progress --log-every 0 --epochs 12"

static char out[16384];

#define AFTER_3 "ckpt-0000000003.safetensors (step 3" /* the chief wrote it */

/* A run of a chief, 2 workers and 2 ps whose `victim` is SIGKILLed once
 * the log holds `line`; returns the launcher's exit status. */
static int strike(const char *name, const char *launch, const char *train, const char *line,
                  const char *victim)
{
    char args[2048];
    snprintf(args, sizeof args, "%s --chief --workers 2 --ps 2 -- train " LB " %s "
             "--save %s/%s.st --metrics %s/%s.jsonl", launch, train, tmp, name, tmp, name);
    pid_t l = start(name, args);
    pid_t v = await_task(l, name, line, victim);
    if (v > 0)
        kill(v, SIGKILL);
    return finish(l, 120);
}

static void goes_on(const char *name, const char *victim)
{
    char train[1200];
    snprintf(train, sizeof train, "--checkpoint-every 3 --checkpoint-dir %s/%s.ck", tmp, name);
    int rc = strike(name, "--max-restarts 1", train, AFTER_3, victim);
    CHECKF(rc == 0, "%s: exit %d", name, rc);
    CHECKF(log_has(name, "restarting every task from the newest checkpoint") &&
               log_has(name, "lbfgs: resumed at iteration"),
           "%s: no whole restart in the log", name);
    char st[64];
    snprintf(st, sizeof st, "%s.st", name);
    CHECKF(same_file("full.st", st), "%s: the weights differ from the uninterrupted run's "
           "(largest difference %g)", name, checkpoint_max_diff("full.st", st));
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.jsonl", tmp, name);
    /* the launcher's, about the victim, or about a task that exited for
     * its loss before the victim's own exit was seen (a ps sees the killed
     * chief's sockets close before the kernel makes the chief a zombie) */
    int restarts_all = 0;
    for_each_event(path, "fault", NULL, count_restart_all, &restarts_all);
    CHECKF(restarts_all == 1, "%s: %d restart-all fault events, not 1", name, restarts_all);
    /* the run's figures: the test set, and 12 epochs each evaluated once
     * (the one the kill cut is evaluated again after the resume) */
    CHECKF(test_accuracy(name) == test_accuracy("full"), "%s: test accuracy %g, uninterrupted "
           "%g", name, test_accuracy(name), test_accuracy("full"));
    CHECKF(count_events(name, "checkpoint") >= 4, "%s: %d checkpoint events", name,
           count_events(name, "checkpoint"));
}

static void drains(void)
{
    char args[2048];
    snprintf(args, sizeof args, "--chief --workers 2 --ps 2 -- train " LB " --checkpoint-every 3 "
             "--checkpoint-dir %s/drain.ck --save %s/drain.st --metrics %s/drain.jsonl", tmp,
             tmp, tmp);
    pid_t l = start("drain", args);
    pid_t w = await_task(l, "drain", "Epoch 2/12", "worker:1");
    if (w > 0)
        kill(w, SIGTERM); /* not its parent's: a drain request */
    int rc = finish(l, 120);
    CHECKF(rc == 0, "drain: exit %d", rc);
    CHECKF(log_has("drain", "Worker 1: SIGTERM: drained after step"), "drain: worker 1 did not "
           "drain");
    CHECKF(log_has("drain", "worker:1 drained at iteration") &&
               log_has("drain", "lbfgs hands its portions to the 1 other worker(s)"),
           "drain: no drain line from the chief");
    CHECKF(count_events("drain", "fault") == 0 && count_events("drain", "drain") == 1,
           "drain: %d fault and %d drain event(s), expected 0 and 1",
           count_events("drain", "fault"), count_events("drain", "drain"));
    CHECKF(!log_has("drain", "fault:") && !log_has("drain", "restarting"),
           "drain: a fault line or a restart for a drain");
    CHECKF(same_file("full.st", "drain.st"), "drain: the weights differ from the uninterrupted "
           "run's (largest difference %g)", checkpoint_max_diff("full.st", "drain.st"));
}

int main(void)
{
    launch_test_init();
    setenv("DOWNPOUR_TEST_STEP_MS", "40", 1); /* 24 iterations, about 1 s a run */
    int rc = run_cmd(out, sizeof out, "%s launch --chief --workers 2 --ps 2 -- train " LB
                     " --checkpoint-every 3 --checkpoint-dir %s/full.ck --save %s/full.st --metrics %s/full.jsonl", bin, tmp,
                     tmp, tmp);
    CHECKF(rc == 0, "the uninterrupted run: exit %d: %s", rc, out);
    goes_on("ps", "ps:0");
    goes_on("chief", "chief:0");

    char train[1200];
    snprintf(train, sizeof train, "--checkpoint-every 3 --checkpoint-dir %s/norestart.ck", tmp);
    rc = strike("norestart", "", train, AFTER_3, "ps:0");
    CHECKF(rc != 0 && log_has("norestart", "no restart was allowed (--max-restarts 0)"),
           "without --max-restarts: exit %d", rc);
    rc = strike("nockpt", "--max-restarts 1", "", "Epoch 2/12", "ps:0");
    /* The run stops naming the lost ps and what would have let it go on.
     * The chief exits for want of its shard once the ps's sockets close,
     * which is a moment before the killed ps is a zombie; the launcher
     * waits up to 200 ms for such a killed task before it blames the
     * chief (launcher.c, reap_killed_first), so it names the chief only if
     * the ps took longer to die on a loaded machine. */
    /* the lost ps is named by the chief ("lost ps:0"), or, when the
     * launcher reaps the killed ps and stops the others before the chief
     * has logged it, by the launcher ("fault: ps:0 (pid ...) was killed") */
    CHECKF(rc != 0 &&
               (log_has("nockpt", "lost ps:0") || log_has("nockpt", "fault: ps:0 (pid")) &&
               (log_has("nockpt", "cannot survive a lost ps without --checkpoint-dir") ||
                log_has("nockpt", "cannot survive a lost chief without --checkpoint-dir")),
           "without --checkpoint-dir: exit %d", rc);
    drains();
    return CHECK_DONE();
}
