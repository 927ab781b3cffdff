/* A lost chief (docs/faults.md, "A lost chief").  In the asynchronous
 * parameter-server modes the workers train on and the servers serve on
 * while the chief is down; the launcher restarts it (--max-restarts) and
 * the restarted chief re-attaches: it learns where every worker is, takes
 * the evaluation history from the newest checkpoint, and evaluates and
 * writes the result.  The run exits 0 with test accuracy within 1 % of the
 * fault-free run's and every epoch after the re-attach evaluated.  Without a
 * restart left, or in a mode that needs its chief (ps-sync), the run stops
 * and the launcher says why.
 *
 * The test strikes when worker 1 has logged step 70 of its 180 (in epoch 2,
 * after the checkpoint at step 60). */
#include "launch.h"

/* One run of `strategy` on a chief, 2 workers and a ps, the chief
 * SIGKILLed (kill != 0) once worker 1 logged step 70.  Returns the exit
 * status. */
static int run(const char *name, const char *strategy, const char *extra, int kill_chief)
{
    char args[2048];
    snprintf(args, sizeof args, "--chief --workers 2 --ps 1 %s -- train --strategy %s " RUN
             " --heartbeat-timeout 1 --checkpoint-dir %s/%s.ck --checkpoint-every 60 "
             "--metrics %s/%s.jsonl", extra, strategy, tmp, name, tmp, name);
    pid_t l = start(name, args);
    if (kill_chief) {
        CHECKF(wait_log(name, "Worker 1, At step 70,", 120), "%s: worker 1 never reached step 70",
               name);
        pid_t c = task_pid(l, "chief:0");
        CHECKF(c > 0, "%s: no chief:0 among the launcher's children", name);
        if (c > 0)
            kill(c, SIGKILL);
    }
    return finish(l, 300);
}

int main(void)
{
    bin = test_bin();
    tmp = test_tmp();
    REQUIRE(bin && tmp);
    require_mnist();

    int rc = run("async-clean", "ps-async", "", 0);
    double clean = test_accuracy("async-clean");
    CHECKF(rc == 0 && clean > 0.8, "the fault-free run exited %d, accuracy %.4f", rc, clean);

    /* Killed and restarted: the workers never stop, the new chief re-attaches. */
    rc = run("async-chief", "ps-async", "--max-restarts 1", 1);
    double acc = test_accuracy("async-chief");
    CHECKF(rc == 0, "ps-async with a restarted chief exited %d", rc);
    CHECKF(log_has("async-chief", "chief:0") && log_has("async-chief", "restarted as pid"),
           "the chief was not restarted");
    CHECKF(log_has("async-chief", "fault: lost the chief chief:0"),
           "no fault line from a server or worker about the lost chief");
    CHECKF(log_has("async-chief", "fault: the chief re-attached to the running job"),
           "the restarted chief did not re-attach");
    CHECKF(log_has("async-chief", "the evaluation history so far from"),
           "the restarted chief did not take the newest checkpoint's history");
    CHECKF(acc >= clean - 0.01 && acc <= clean + 0.02,
           "accuracy %.4f with the chief restarted, %.4f without", acc, clean);
    CHECKF(count_events("async-chief", "epoch") >= 3,
           "%d epoch events: the epochs after the re-attach were not all evaluated",
           count_events("async-chief", "epoch"));
    CHECKF(log_has("async-chief", "Epoch 3/3"), "epoch 3 was not evaluated");

    /* No restart left: the run cannot produce its result, and stops. */
    rc = run("async-chief-gone", "ps-async", "", 1);
    CHECKF(rc != 0 && log_has("async-chief-gone", "it has no restart left"),
           "a chief lost for good: exit %d", rc);

    /* ps-sync needs its chief: the run stops even with restarts. */
    rc = run("sync-chief", "ps-sync", "--max-restarts 1", 1);
    CHECKF(rc != 0 && log_has("sync-chief", "cannot survive a lost chief"),
           "ps-sync with a lost chief: exit %d", rc);
    return check_failures ? 1 : 0;
}
