/* A drained worker (docs/faults.md, "Draining") under `downpour launch`:
 * worker:2 of 3, sent SIGTERM once it logged step 20, finishes that step,
 * leaves in order and exits 0.  The run does not count it as a fault: no
 * `fault` event anywhere, one `drain` event and line from the chief (or
 * replica 0), the launcher exits 0 and restarts nothing.  From the next
 * epoch the survivors' records add up to the whole training split (the data
 * re-dealt), and the test accuracy is within 1 % of the fault-free run's
 * (2 % under ps-async, where the drained worker's updates go unmade).
 * Under allreduce the two survivors end bitwise identical, and the leader,
 * replica 0, drains as well: worker:1 takes the lead over and writes the
 * run's result; under ps-sync and
 * ps-async (a chief, one ps) the servers retire the worker as done.  A
 * SIGTERM to the launcher still stops the whole job: its tasks die of it,
 * none drains. */
#include "launch.h"

#define TRAIN_SIZE 12000 /* RUN's --train-size */

/* One run of `strategy` on 3 workers (with a chief and a ps unless
 * allreduce); worker:2 (or the launcher: "launcher") sent SIGTERM once
 * worker 2 logged step 20 (NULL: none).  Returns the launcher's status. */
static int run(const char *name, const char *strategy, const char *term)
{
    char args[2048];
    int ps = strcmp(strategy, "allreduce") != 0;
    snprintf(args, sizeof args, "--workers 3 %s -- train --strategy %s " RUN
             " --heartbeat-timeout 1 --metrics %s/%s.jsonl", ps ? "--chief --ps 1" : "",
             strategy, tmp, name);
    pid_t l = start(name, args);
    if (term && strcmp(term, "launcher") == 0) {
        CHECKF(wait_log(name, "Worker 2, At step 20,", 120), "%s: step 20 never came", name);
        kill(l, SIGTERM);
    } else if (term) {
        pid_t w = await_task(l, name, "Worker 2, At step 20,", term);
        if (w > 0)
            kill(w, SIGTERM);
    }
    return finish(l, 300);
}

/* Sums the "steps" events' records by epoch (1-based, up to 3). */
static void add_records(const cJSON *j, void *ctx)
{
    long *by_epoch = ctx;
    long e = (long)json_num(j, "epoch");
    if (e >= 1 && e <= 3)
        by_epoch[e] += (long)json_num(j, "records");
}

static void drained(const char *name, const char *strategy, double clean, const char *task)
{
    int rc = run(name, strategy, task);
    double acc = test_accuracy(name);
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.jsonl", tmp, name);
    long by_epoch[4] = {0, 0, 0, 0};
    for_each_event(path, "steps", NULL, add_records, by_epoch);
    fprintf(stderr, "%s: exit %d, accuracy %.4f (fault-free %.4f), records by epoch %ld, %ld, "
            "%ld\n", name, rc, acc, clean, by_epoch[1], by_epoch[2], by_epoch[3]);
    CHECKF(rc == 0, "%s: the drain ended the run (exit %d)", name, rc);
    CHECKF(log_has(name, "SIGTERM: drained after step"), "%s: worker 2 did not drain", name);
    char line[64];
    snprintf(line, sizeof line, "%s drained at step", task);
    CHECKF(log_has(name, line) && log_has(name, "the run goes on over 2 worker(s)"),
           "%s: no drain line from the chief (or the allreduce leader)", name);
    CHECKF(count_events(name, "fault") == 0, "%s: %d fault event(s) for a drain", name,
           count_events(name, "fault"));
    CHECKF(count_events(name, "drain") == 1, "%s: %d drain event(s), expected 1", name,
           count_events(name, "drain"));
    CHECKF(!log_has(name, "fault:") && !log_has(name, "restart"),
           "%s: a fault line or a restart for a drain", name);
    /* ps-async applies every worker's push: two workers from epoch 2 make
     * two thirds of the fault-free run's updates (at 1.5 times the batch),
     * which costs it 1 to 2 % after 3 short epochs; test_faults gives a lost
     * worker 2 % likewise.  The synchronous strategies step alike either way. */
    double slack = strcmp(strategy, "ps-async") == 0 ? 0.02 : 0.01;
    CHECKF(fabs(acc - clean) <= slack, "%s: accuracy %.4f after the drain, %.4f without", name,
           acc, clean);
    /* the drained worker reports no epoch it left; every later epoch
     * walks the whole split over the two survivors */
    CHECKF(by_epoch[2] == TRAIN_SIZE && by_epoch[3] == TRAIN_SIZE,
           "%s: epochs 2 and 3 saw %ld and %ld records, not %d each", name, by_epoch[2],
           by_epoch[3], TRAIN_SIZE);
}

int main(void)
{
    launch_test_init();

    int rc = run("ar-clean", "allreduce", NULL);
    double clean = test_accuracy("ar-clean");
    CHECKF(rc == 0 && clean > 0.8, "ar-clean: exit %d, accuracy %.4f", rc, clean);
    drained("ar-drain", "allreduce", clean, "worker:2");
    long n;
    int same = replicas_equal("ar-drain", &n);
    CHECKF(same && n == 2, "ar-drain: %ld replica checksums, %s (expected the 2 survivors', "
           "equal)", n, same ? "all equal" : "not all equal");
    /* The leader, replica 0, drains too: worker:1 takes the lead over (no
     * fault), and the run's one result is its. */
    drained("ar-drain-leader", "allreduce", clean, "worker:0");
    same = replicas_equal("ar-drain-leader", &n);
    char path[1200];
    snprintf(path, sizeof path, "%s/ar-drain-leader.jsonl", tmp);
    cJSON *done = last_event(path, "done", "worker:1");
    CHECKF(same && n == 2 && done && count_events("ar-drain-leader", "done") == 1 &&
               count_events("ar-drain-leader", "lead") == 1 &&
               log_has("ar-drain-leader", "worker:1 leads the all-reduce ring from step"),
           "ar-drain-leader: %ld replica checksums (%s), %s done event from worker:1, %d lead "
           "event(s)", n, same ? "equal" : "not equal", done ? "a" : "no",
           count_events("ar-drain-leader", "lead"));
    cJSON_Delete(done);

    const char *ps[] = {"ps-sync", "ps-async"};
    for (int i = 0; i < (SANITIZED ? 1 : 2); i++) {
        char name[64];
        snprintf(name, sizeof name, "%s-clean", ps[i]);
        rc = run(name, ps[i], NULL);
        clean = test_accuracy(name);
        CHECKF(rc == 0 && clean > 0.8, "%s: exit %d, accuracy %.4f", name, rc, clean);
        snprintf(name, sizeof name, "%s-drain", ps[i]);
        drained(name, ps[i], clean, "worker:2");
    }

    /* SIGTERM to the launcher stops the job: forwarded, it kills each task
     * as before (the parent's SIGTERM is no drain request). */
    rc = run("stop", "allreduce", "launcher");
    CHECKF(rc == 128 + SIGTERM, "stop: the launcher exited %d on SIGTERM, expected %d", rc,
           128 + SIGTERM);
    CHECKF(!log_has("stop", "drained"), "stop: a task drained on the launcher's SIGTERM");
    return check_failures ? 1 : 0;
}
