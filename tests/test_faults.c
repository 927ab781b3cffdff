/* Lost and restarted tasks under `downpour launch` (docs/faults.md): for each
 * parameter-server strategy, a worker SIGKILLed in the middle of the run
 * costs the run nothing but that worker's share of the data: the launcher
 * exits 0 and the test accuracy is no more than 2 % below the fault-free
 * run's (in the asynchronous modes, the lower of two fault-free runs'):
 * losing worker 1's last 160 of 180 steps costs about 1 % by itself on this
 * short run (784-128-10, 3 epochs), and a run the fault broke ends near
 * chance.  (It may come out higher: while a worker is down the others train
 * without waiting for it, so the same records make more updates, and this
 * short run is far from converged; 2 % above is the sanity bound.)
 * With --max-restarts 1 the killed worker is restarted and rejoins.  A
 * worker frozen (SIGSTOP) past the heartbeat timeout is dropped; when it
 * wakes, its old incarnation finds itself refused and exits, and the run
 * still completes.  A lost parameter server with no restart left stops the
 * run, with the launcher's exit status saying so (tests/test_ps_restart.c
 * restarts one).
 *
 * Under --compress auto the restarted worker takes its slot's choice from
 * the chief.
 *
 * The test strikes when worker 1 has logged step 20 of its 180, and finds
 * its pid among the launcher's children by the DOWNPOUR_TASK each child
 * gets (launcher.h). */
#include "launch.h"

/* One run of `strategy` on a chief, 2 workers and a ps; fault: NULL, or
 * "kill" / "stop" worker:1 once it logged step 20.  Returns the exit status. */
static int run(const char *name, const char *strategy, const char *extra, const char *fault)
{
    char args[2048];
    snprintf(args, sizeof args, "--chief --workers 2 --ps 1 %s -- train --strategy %s " RUN
             " --heartbeat-timeout 1 --metrics %s/%s.jsonl", extra, strategy, tmp, name);
    pid_t l = start(name, args);
    if (fault) {
        pid_t w = await_task(l, name, "Worker 1, At step 20,", "worker:1");
        if (w > 0 && strcmp(fault, "kill") == 0) {
            kill(w, SIGKILL);
        } else if (w > 0) {
            double t0 = now_s();
            kill(w, SIGSTOP);
            int seen = wait_log(name, "fault: lost worker:1", 60);
            CHECKF(seen, "%s: the chief never noticed the frozen worker", name);
            if (seen)
                fprintf(stderr, "%s: frozen worker detected after %.2f s (heartbeat timeout 1 s)\n",
                        name, now_s() - t0);
            kill(w, SIGCONT);
        }
    }
    return finish(l, 300);
}

/* The asynchronous modes' fault-free accuracy itself moves by about 1 %
 * from run to run (how the workers' pushes interleave): their bound is 1 %
 * below the lower of two fault-free runs (2 % above the higher). */
static int asynchronous(const char *strategy)
{
    return strcmp(strategy, "ps-async") == 0 || strcmp(strategy, "ps-ssp") == 0 ||
           strcmp(strategy, "ps-dssp") == 0;
}

static void strategy_survives(const char *strategy, const char *extra)
{
    char name[128];
    double lo = 1, hi = 0;
    for (int k = 0; k < (asynchronous(strategy) ? 2 : 1); k++) {
        snprintf(name, sizeof name, "%s-clean%d", strategy, k);
        int rc = run(name, strategy, "", NULL);
        double a = test_accuracy(name);
        CHECKF(rc == 0 && a > 0.8, "%s: the fault-free run exited %d, accuracy %.4f", strategy,
               rc, a);
        lo = a < lo ? a : lo;
        hi = a > hi ? a : hi;
    }

    snprintf(name, sizeof name, "%s-kill", strategy);
    int rc = run(name, strategy, extra, "kill");
    double acc = test_accuracy(name);
    CHECKF(rc == 0, "%s: a killed worker ended the run (exit %d)", strategy, rc);
    fprintf(stderr, "%s: accuracy %.4f with a worker lost, %.4f to %.4f without\n", strategy,
            acc, lo, hi);
    CHECKF(acc >= lo - 0.02 && acc <= hi + 0.02,
           "%s: accuracy %.4f with a worker lost, %.4f to %.4f without",
           strategy, acc, lo, hi);
    CHECKF(log_has(name, "fault: lost worker:1"), "%s: no fault line from the chief", strategy);
    CHECKF(count_events(name, "fault") >= 2, "%s: expected fault events from the launcher and "
           "the chief in the metrics", strategy);

    snprintf(name, sizeof name, "%s-restart", strategy);
    char more[256];
    snprintf(more, sizeof more, "--max-restarts 1 %s", extra);
    rc = run(name, strategy, more, "kill");
    acc = test_accuracy(name);
    CHECKF(rc == 0, "%s: the run with a restarted worker exited %d", strategy, rc);
    CHECKF(log_has(name, "restarted as pid") && log_has(name, "fault: worker:1 rejoined"),
           "%s: the killed worker was not restarted and rejoined", strategy);
    /* A restarted worker's pushes land among the others' in the scheduler's
     * order: under a loaded suite ps-ssp once ended 1.45 % below, so the
     * asynchronous modes get 2 % here. */
    double slack = asynchronous(strategy) ? 0.02 : 0.01;
    fprintf(stderr, "%s: accuracy %.4f with a restarted worker, %.4f to %.4f without\n",
            strategy, acc, lo, hi);
    CHECKF(acc >= lo - slack && acc <= hi + 0.02,
           "%s: accuracy %.4f with a restarted worker, %.4f to %.4f without",
           strategy, acc, lo, hi);
}

int main(void)
{
    launch_test_init();
    for (size_t i = 0; i < N_PS_STRATEGIES; i++)
        strategy_survives(ps_strategies[i], "");

    /* Frozen past the heartbeat timeout: dropped; awake, refused; the run completes. */
    int rc = run("sync-stop", "ps-sync", "", "stop");
    CHECKF(rc == 0, "ps-sync with a frozen worker exited %d", rc);
    CHECKF(test_accuracy("sync-stop") > 0.8, "ps-sync with a frozen worker: accuracy %.4f",
           test_accuracy("sync-stop"));

    /* --compress auto: the restarted worker takes its slot's choice from
     * the chief (the running job's), measured by its first incarnation on
     * the fake slow link, rather than measuring again (docs/strategies.md,
     * "ps family: compression"). */
    setenv("DOWNPOUR_TEST_LINK_NS", "1000", 1);
    rc = run("auto-restart", "ps-sync --compress auto", "--max-restarts 1", "kill");
    unsetenv("DOWNPOUR_TEST_LINK_NS");
    char path[1200], want[256] = "(no choice logged)";
    snprintf(path, sizeof path, "%s/auto-restart.log", tmp);
    size_t len;
    char *log = slurp(path, &len);
    const char *first = log ? strstr(log, "Worker 1: compress auto: ") : NULL;
    if (first) {
        first += strlen("Worker 1: compress ");
        snprintf(want, sizeof want, "Worker 1: compress %.*s(the running job's choice)",
                 (int)strcspn(first, "("), first);
    }
    CHECKF(rc == 0 && log_has("auto-restart", "fault: worker:1 rejoined") &&
               log_has("auto-restart", want),
           "--compress auto, a restarted worker: exit %d, no '%s'", rc, want);
    free(log);

    /* A lost ps: the run cannot go on, and says so. */
    char args[2048];
    snprintf(args, sizeof args, "--chief --workers 2 --ps 1 -- train --strategy ps-async " RUN
             " --heartbeat-timeout 1");
    pid_t l = start("ps-kill", args);
    pid_t ps = await_task(l, "ps-kill", "Worker 1, At step 20,", "ps:0");
    if (ps > 0)
        kill(ps, SIGKILL);
    rc = finish(l, 120);
    /* Whichever the launcher reaps first, the killed ps or the chief that
     * exited for want of it, the run stops and the ps is named. */
    CHECKF(rc != 0 && (log_has("ps-kill", "task ps:0") || log_has("ps-kill", "lost ps:0")) &&
               log_has("ps-kill", "the run cannot go on"),
           "a lost ps: exit %d", rc);
    return check_failures ? 1 : 0;
}
