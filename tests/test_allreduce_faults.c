/* A lost replica in --strategy allreduce under `downpour launch`
 * (docs/faults.md, "All-reduce"): worker:2 of 3 SIGKILLed once it logged
 * step 20 costs the run nothing but its share of the data: the launcher
 * exits 0, the two survivors end bitwise identical, and the test accuracy is
 * within 1 % of the fault-free run's.  Frozen (SIGSTOP) past the heartbeat
 * timeout it is dropped the same way, or, woken before replica 0 dropped it,
 * taken back by the replica that did.  Restarted (--max-restarts 1), it
 * rejoins the ring at the next epoch with replica 0's state, and all three
 * end bitwise identical.  Under --sync-bn (a bn model) a killed replica is
 * survived the same way, and under --compress auto that took powersgd (a
 * fake slow link, DOWNPOUR_TEST_LINK_NS) a killed and restarted one: the
 * re-formed rings keep the choice, and the restarted replica takes the
 * running ring's.  With --compress topk the checkpoints hold each replica's residual,
 * zeros for one out of the ring, and its own again once it rejoined.  Losing
 * the chief (replica 0, the evaluator) stops the run. */
#include "launch.h"

/* One run on 3 workers, launch's flags extra and train's flags more (after
 * RUN's); fault: NULL, or "kill" / "stop" `task` once worker 2 logged step
 * 20.  Returns the launcher's exit status. */
static int run_with(const char *name, const char *extra, const char *more, const char *fault,
                    const char *task)
{
    char args[2048];
    snprintf(args, sizeof args, "--workers 3 %s -- train --strategy allreduce " RUN
             " %s --heartbeat-timeout 1 --metrics %s/%s.jsonl", extra, more, tmp, name);
    pid_t l = start(name, args);
    if (fault) {
        pid_t w = await_task(l, name, "Worker 2, At step 20,", task);
        if (w > 0 && strcmp(fault, "kill") == 0) {
            kill(w, SIGKILL);
        } else if (w > 0) {
            double t0 = now_s();
            kill(w, SIGSTOP);
            /* Woken as soon as one peer's link to it ran out: often before
             * the other's did, so that replica 0 still has it in the ring
             * when the one that dropped it re-forms (docs/faults.md,
             * "All-reduce", step 3); the verdict is the same either way. */
            char line[64];
            snprintf(line, sizeof line, "warning: lost %s", task);
            int seen = wait_log(name, line, 60);
            CHECKF(seen, "%s: nobody noticed the frozen %s", name, task);
            if (seen)
                fprintf(stderr, "%s: frozen %s dropped after %.2f s (heartbeat timeout 1 s)\n",
                        name, task, now_s() - t0);
            kill(w, SIGCONT);
        }
    }
    return finish(l, 300);
}

static int run(const char *name, const char *extra, const char *fault, const char *task)
{
    return run_with(name, extra, "", fault, task);
}

static void survived(const char *name, int rc, double clean, const char *what)
{
    double acc = test_accuracy(name);
    long n;
    int same = replicas_equal(name, &n);
    fprintf(stderr, "%s: exit %d, accuracy %.4f (fault-free %.4f), %ld replica checksums%s\n",
            name, rc, acc, clean, n, same ? ", all equal" : ", NOT equal");
    CHECKF(rc == 0, "%s: %s ended the run (exit %d)", name, what, rc);
    CHECKF(fabs(acc - clean) <= 0.01, "%s: accuracy %.4f with %s, %.4f without", name, acc, what,
           clean);
    CHECKF(log_has(name, "fault: lost worker:2"), "%s: no fault line for worker:2", name);
    CHECKF(n >= 2 && same, "%s: %ld replica checksums, %s", name, n,
           same ? "all equal" : "not all equal");
}

/* The replicas' "compress" fields: how many, how many start with
 * took[0], and how many hold took[1]. */
typedef struct tally {
    const char *took[2];
    int n, first, second;
} tally;

static void tally_compress(const cJSON *j, void *ctx)
{
    tally *t = ctx;
    const char *c = json_str(j, "compress");
    t->n++;
    t->first += strncmp(c, t->took[0], strlen(t->took[0])) == 0;
    t->second += strstr(c, t->took[1]) != NULL;
}

int main(void)
{
    launch_test_init();

    long n;
    int rc = run("clean", "", NULL, NULL);
    double clean = test_accuracy("clean");
    CHECKF(rc == 0 && clean > 0.8, "the fault-free run exited %d, accuracy %.4f", rc, clean);

    rc = run("kill", "", "kill", "worker:2");
    survived("kill", rc, clean, "a killed replica");
    CHECKF(count_events("kill", "fault") >= 2,
           "kill: expected fault events from the launcher and the survivors");
    CHECKF(log_has("kill", "the all-reduce ring goes on over 2 replica(s)"),
           "kill: replica 0 did not say the ring re-formed");

    rc = run("stop", "", "stop", "worker:2");
    survived("stop", rc, clean, "a frozen replica");

    rc = run("restart", "--max-restarts 1", "kill", "worker:2");
    survived("restart", rc, clean, "a restarted replica");
    CHECKF(log_has("restart", "restarted as pid") &&
               log_has("restart", "fault: worker:2 rejoined the all-reduce ring at step"),
           "restart: the restarted replica did not rejoin");
    CHECKF(replicas_equal("restart", &n) && n == 3,
           "restart: %ld replica checksums (expected 3, all equal)", n);

    /* --sync-bn: the bn sums of the step a replica is lost in fail like its
     * gradient buckets, and the survivors re-form the ring and retry it
     * (arithmetic and the ring, not memory: left to the plain build, where
     * the suite's time allows it; test_sync_bn runs under ASan). */
    if (!SANITIZED) {
        rc = run_with("sync-bn", "", "--model 784-dense128-bn-relu-10 --sync-bn", "kill",
                      "worker:2");
        double acc = test_accuracy("sync-bn");
        CHECKF(rc == 0 && acc > 0.9 && log_has("sync-bn", "fault: lost worker:2") &&
                   replicas_equal("sync-bn", &n) && n == 2,
               "sync-bn: exit %d, accuracy %.4f, %ld replica checksums", rc, acc, n);
        fprintf(stderr, "sync-bn: exit %d, accuracy %.4f, the 2 survivors equal\n", rc, acc);
    }

    /* --compress: replica 0 gathers the residuals at each checkpoint
     * (docs/checkpoints.md, "Compression residuals"); worker:2, killed after
     * step 20 and out of the ring until it rejoins at step 40, is written as
     * zeros at step 30 and with its own residual at the end. */
    char more[1400];
    snprintf(more, sizeof more, "--compress topk:0.1 --checkpoint-every 10 --keep-checkpoints 20 "
             "--checkpoint-dir %s/compress-ck", tmp);
    rc = run_with("compress", "--max-restarts 1", more, "kill", "worker:2");
    CHECKF(rc == 0 && log_has("compress", "fault: worker:2 rejoined the all-reduce ring") &&
               replicas_equal("compress", &n) && n == 3,
           "compress: exit %d, %ld replica checksums", rc, n);
    const char *steps[2] = {"0000000030", "0000000120"};
    for (int i = 0; i < 2; i++) {
        char path[1400];
        snprintf(path, sizeof path, "%s/compress-ck/ckpt-%s.safetensors", tmp, steps[i]);
        dp_safetensors *f = NULL;
        dp_err e;
        CHECKF(dp_safetensors_load(path, &f, &e) == 0, "%s", e.msg);
        size_t nonzero[3] = {0, 0, 0};
        for (int p = 0; p < 3 && f; p++) {
            char name[32];
            snprintf(name, sizeof name, "replica.%d.residual", p);
            const dp_st_tensor *t = dp_safetensors_find(f, name);
            CHECKF(t != NULL, "%s: no %s", path, name);
            for (int64_t k = 0; t && k < t->shape[0]; k++)
                nonzero[p] += t->data[k] != 0;
        }
        CHECKF(nonzero[0] > 0 && nonzero[1] > 0 && (i == 0) == (nonzero[2] == 0),
               "%s: %zu, %zu and %zu nonzero residuals (replica 2 %s)", path, nonzero[0],
               nonzero[1], nonzero[2], i == 0 ? "out of the ring: zeros" : "back: its own");
        dp_safetensors_free(f);
    }

    /* --compress powersgd (auto's, on a link the fit takes for 80 ns a
     * byte): a replica lost between the two sums of its factors; the
     * survivors re-form the ring, keep powersgd and retry the step from
     * their residuals as they were (a residual changes only once both sums
     * are in), and the restarted one takes powersgd from the running ring
     * (its welcome) and rejoins with a fresh residual and the ring's warm
     * start restarted everywhere: all three end bitwise identical (plain
     * build only, as sync-bn).  Its accuracy trails the exact sums'
     * fault-free run a little, being compressed (0.907 against 0.914
     * measured): 3 % allows that, not a lost step's worth of damage. */
    if (!SANITIZED) {
        setenv("DOWNPOUR_TEST_LINK_NS", "80", 1);
        rc = run_with("powersgd", "--max-restarts 1", "--compress auto", "kill", "worker:2");
        unsetenv("DOWNPOUR_TEST_LINK_NS");
        char path[1200];
        snprintf(path, sizeof path, "%s/powersgd.jsonl", tmp);
        tally t = {{"auto: powersgd:4 (", "(the running ring's choice)"}, 0, 0, 0};
        for_each_event(path, "replica", NULL, tally_compress, &t);
        CHECKF(t.n == 3 && t.first == 3 && t.second == 1,
               "powersgd: of %d replicas, %d took auto's powersgd:4, %d from the running ring",
               t.n, t.first, t.second);
        double acc = test_accuracy("powersgd");
        CHECKF(rc == 0 && acc >= clean - 0.03 && log_has("powersgd", "fault: lost worker:2") &&
                   log_has("powersgd", "fault: worker:2 rejoined the all-reduce ring at step") &&
                   replicas_equal("powersgd", &n) && n == 3,
               "powersgd: exit %d, accuracy %.4f (fault-free %.4f), %ld replica checksums", rc,
               acc, clean, n);
        fprintf(stderr, "powersgd: exit %d, accuracy %.4f, the 3 replicas equal\n", rc, acc);
    }

    /* Replica 0 (the chief) evaluates and writes: losing it stops the run. */
    rc = run("lead", "--chief", "kill", "chief:0");
    CHECKF(rc != 0 && log_has("lead", "cannot survive"), "lead: exit %d with the chief killed",
           rc);
    return check_failures ? 1 : 0;
}
