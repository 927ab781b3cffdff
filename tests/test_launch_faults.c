/* Findings of the fault campaign (issue 27) about how `downpour launch`
 * ends a run that survived a fault (docs/faults.md, "Who decides";
 * docs/cluster.md, "Stopping"):
 * - allreduce with --max-restarts 1: worker:1 SIGKILLed in the last epoch
 *   and its restarted self held (SIGSTOP) until replica 0 has written the
 *   result, so it cannot rejoin before the end.  It used to dial its gone
 *   peers until --startup-timeout (600 s); now the launcher stops it --grace
 *   after the others ended (or it meets replica 0 closing and leaves), and
 *   exits 0;
 * - lbfgs with worker:1 frozen past the 1 s heartbeat timeout, then woken:
 *   the chief hands its portions to worker:0 and saves the model, and the
 *   woken worker, dropped, exits non-zero.  launch used to exit 1 (lbfgs
 *   said it could not survive a lost worker); now 0, as for ps-async and
 *   allreduce;
 * - --straggler K with no training task K in the cluster is a usage error
 *   (exit 2) naming the value and the cluster's size, under launch and in a
 *   cluster task alike.
 * No check bounds the wall time: finish() only kills a launcher still
 * running after 120 s, far beyond these 3-5 s runs but well before the
 * 600 s --startup-timeout a stuck task would wait, so a hang fails the exit
 * status check. */
#include "launch.h"

/* Finding 1: a restarted replica that had not rejoined when the run ended. */
static void allreduce_late_rejoin(void)
{
    char args[2048];
    snprintf(args, sizeof args, "--workers 3 --max-restarts 1 --grace 1 -- train --strategy "
             "allreduce " RUN " --metrics %s/late.jsonl", tmp);
    pid_t l = start("late", args);
    /* step 110 of 120: the last epoch */
    pid_t w = await_task(l, "late", "Worker 1, At step 110,", "worker:1");
    if (w > 0)
        kill(w, SIGKILL);
    pid_t again = await_logged_pid("late", "launcher: worker:1 restarted as pid ");
    if (again > 0)
        kill(again, SIGSTOP);
    int over = wait_log("late", "[worker 0] Test accuracy:", 120);
    CHECKF(over, "late: replica 0 never wrote the result");
    if (again > 0)
        kill(again, SIGCONT);
    int rc = finish(l, 120);
    CHECKF(rc == 0, "late: launch exited %d (-1: still running after 120 s)", rc);
    /* Woken, it rejoins, or is stopped --grace after the others ended, or
     * (woken just as replica 0 closes: seen once under load) meets replica
     * 0 closing and leaves by itself; each ends the run in time. */
    CHECKF(log_has("late", "the run is over and worker:1") ||
               log_has("late", "rejoined the all-reduce ring") ||
               log_has("late", "[worker 1] downpour train: worker:1: lost replica 0, worker:0, "
                               "before the ring formed"),
           "late: the restarted worker:1 neither rejoined, nor was stopped at the end, nor "
           "left on meeting the closed replica 0");
    CHECKF(test_accuracy("late") > 0.8, "late: accuracy %.4f", test_accuracy("late"));
    /* the launcher's (kill, restart), a survivor's, and the end's */
    CHECKF(count_events("late", "fault") >= 3, "late: %d fault events",
           count_events("late", "fault"));
}

/* Finding 2: lbfgs survives a frozen worker; launch says so. */
static void lbfgs_frozen_worker(void)
{
    char args[2048];
    snprintf(args, sizeof args,
             "--chief --workers 2 --ps 2 -- train --strategy lbfgs --model mlp-128 "
             "--train-size 4000 --val-size 500 --batch 4000 --portion 500 --epochs 30 "
             "--threads 1 --no-progress --log-every 1 --heartbeat-timeout 1 "
             "--metrics %s/frozen.jsonl --save %s/frozen.st", tmp, tmp);
    pid_t l = start("frozen", args);
    pid_t w = await_task(l, "frozen", "L-BFGS iteration 2:", "worker:1");
    if (w > 0) {
        kill(w, SIGSTOP);
        /* the chief drops it within the heartbeat timeout (or ends first) */
        int seen = wait_log("frozen", "[chief] warning: lost worker:1", 60) ||
                   log_has("frozen", "[chief] Saved");
        CHECKF(seen, "frozen: the chief never noticed the frozen worker:1");
        kill(w, SIGCONT);
    }
    int rc = finish(l, 120);
    char path[1200];
    snprintf(path, sizeof path, "%s/frozen.st", tmp);
    FILE *f = fopen(path, "rb");
    CHECKF(f != NULL, "frozen: no model saved at %s", path);
    if (f)
        fclose(f);
    CHECKF(rc == 0, "frozen: launch exited %d after a run that saved its model", rc);
    CHECKF(!log_has("frozen", "cannot go on"), "frozen: the launcher stopped the run");
    CHECKF(test_accuracy("frozen") > 0.8, "frozen: accuracy %.4f", test_accuracy("frozen"));
}

/* Finding 4: --straggler K against the cluster's size. */
static void straggler_out_of_range(void)
{
    static char err[16384];
    int rc = run_cmd(err, sizeof err, "%s launch --workers 2 --ps 1 -- train --strategy "
                     "ps-async --straggler 5:10", bin);
    CHECKF(rc == 2 && strstr(err, "--straggler 5:10") && strstr(err, "2 worker(s)"),
           "launch --workers 2 --straggler 5:10: exit %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "DOWNPOUR_CONFIG='{\"cluster\":{\"worker\":[\"127.0.0.1:1\","
                 "\"127.0.0.1:2\"]},\"task\":{\"type\":\"worker\",\"index\":0}}' %s train "
                 "--strategy ps-async --straggler 2:10", bin);
    CHECKF(rc == 2 && strstr(err, "--straggler 2:10") && strstr(err, "2 worker(s)"),
           "train in a 2-worker cluster --straggler 2:10: exit %d: %s", rc, err);
    /* allreduce with a chief: the chief is replica 0, so K 2 is worker:1 */
    rc = run_cmd(err, sizeof err, "%s launch --chief --workers 2 -- train --strategy allreduce "
                 "--straggler 3:10", bin);
    CHECKF(rc == 2 && strstr(err, "a chief"), "--chief --workers 2 --straggler 3:10: exit %d: %s",
           rc, err);
}

int main(void)
{
    launch_test_init();
    straggler_out_of_range();
    lbfgs_frozen_worker();
    allreduce_late_rejoin();
    return check_failures ? 1 : 0;
}
