/* Growing and shrinking a running job (docs/cluster.md, "Spare slots:
 * growing a running job"): 3 worker slots, the last spare
 * (train --spare-workers 1), under `downpour launch`.
 *
 * - A spare never started: the run neither waits for it nor counts it a
 *   fault (the fixed-size baselines).
 * - allreduce: SIGUSR1 to the launcher starts worker:2 once worker 0 logged
 *   step 10; it joins the ring at an epoch's start with the ring's state;
 *   then worker:1 is drained (SIGTERM).  Exit 0, one `join` and one `drain`
 *   event, no fault; every epoch but the drain's walks the 12,000 training
 *   records once over the workers there (one of them over 3); the two
 *   survivors, worker:0 and the joiner, end bitwise identical; the test
 *   accuracy within 1 % of the baseline's.  A second SIGUSR1 finds the job
 *   full and says so.
 * - ps-async (a chief and a ps): the same growth, then the joiner drained;
 *   the accuracy within 1 % too.  ps-async applies every worker's push, so
 *   the updates follow the workers: the epochs over 3 make more of them
 *   than at the fixed size, which gains it 0.3 to 0.7 % here (test_drain
 *   gives a drain alone, which only loses updates, 2 %).
 * - allreduce, 4 slots, 2 spare, two SIGUSR1s at once: both join at one
 *   epoch's start (each waits for the leader's GO), exit 0, no fault, the
 *   four replicas end bitwise equal.
 * - Tasks started by hand (`downpour run`, 4 slots, 2 spare): one for a
 *   spare slot with another secret is refused at once with a message that
 *   says so; worker:2 joins, and `run --join 127.0.0.1:PORT` (no spec
 *   file: it asks worker:1 for the spec) takes the slot left (worker:3),
 *   after the same with another secret was refused; then a second task for
 *   a filled slot and a second `--join` (with the spec) are refused, naming
 *   the slots; the job goes on.
 * - --spare-workers that leaves no worker to start, or under a strategy that
 *   cannot take a worker in mid-run, is refused before any task starts. */
#include "launch.h"

#include "downpour/launcher.h"

#define TRAIN_SIZE 12000
#define SPE 40 /* steps an epoch: 12,000 records over 3 slots of batch 100 */
#define JOB "--dataset mnist --model 784-128-10 --train-size 12000 --val-size 1000 " \
            "--batch 100 --threads 1 --no-progress --log-every 10 --heartbeat-timeout 1 " \
            "--spare-workers 1"

/* Starts the job: 3 worker slots, one spare; with a chief and a ps unless
 * allreduce. */
static pid_t start_job(const char *name, const char *strategy, int epochs)
{
    char args[2048];
    int ps = strcmp(strategy, "allreduce") != 0;
    snprintf(args, sizeof args, "--workers 3 %s -- train --strategy %s " JOB
             " --epochs %d --metrics %s/%s.jsonl", ps ? "--chief --ps 1" : "", strategy, epochs,
             tmp, name);
    return start(name, args);
}

typedef struct by_epoch {
    long records[8];
    int reports[8];
    long drain_step;
} by_epoch;

static void add_records(const cJSON *j, void *ctx)
{
    by_epoch *e = ctx;
    long k = (long)json_num(j, "epoch");
    if (k >= 1 && k < 8) {
        e->records[k] += (long)json_num(j, "records");
        e->reports[k]++;
    }
}

static void take_drain(const cJSON *j, void *ctx)
{
    ((by_epoch *)ctx)->drain_step = (long)json_num(j, "step");
}

/* The grown and shrunk run's checks; `drained` the worker sent SIGTERM. */
static void check_grown(const char *name, int rc, double clean, double slack, int n_epochs)
{
    double acc = test_accuracy(name);
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.jsonl", tmp, name);
    by_epoch e;
    memset(&e, 0, sizeof e);
    e.drain_step = -1;
    for_each_event(path, "steps", NULL, add_records, &e);
    for_each_event(path, "drain", NULL, take_drain, &e);
    long drain_epoch = e.drain_step > 0 ? (e.drain_step - 1) / SPE + 1 : -1;
    fprintf(stderr, "%s: exit %d, accuracy %.4f (fixed size %.4f), drained at step %ld; "
            "records (reports) by epoch:", name, rc, acc, clean, e.drain_step);
    for (int k = 1; k <= n_epochs; k++)
        fprintf(stderr, " %ld (%d)", e.records[k], e.reports[k]);
    fprintf(stderr, "\n");
    CHECKF(rc == 0, "%s: the run ended with exit %d", name, rc);
    CHECKF(count_events(name, "join") == 1, "%s: %d join event(s), expected 1", name,
           count_events(name, "join"));
    CHECKF(count_events(name, "drain") == 1, "%s: %d drain event(s), expected 1", name,
           count_events(name, "drain"));
    CHECKF(count_events(name, "fault") == 0 && !log_has(name, "fault:"),
           "%s: a fault (line or event) for a join or a drain", name);
    CHECKF(log_has(name, "worker:2 joined"), "%s: no line says worker:2 joined", name);
    int three = 0;
    for (int k = 1; k <= n_epochs; k++) {
        three += e.reports[k] == 3;
        CHECKF(k == drain_epoch || e.records[k] == TRAIN_SIZE,
               "%s: epoch %d saw %ld records over %d worker(s), not the %d of the split", name,
               k, e.records[k], e.reports[k], TRAIN_SIZE);
    }
    CHECKF(three > 0, "%s: no epoch was trained by 3 workers: the spare never joined", name);
    CHECKF(fabs(acc - clean) <= slack, "%s: accuracy %.4f grown and shrunk, %.4f at a fixed "
           "size", name, acc, clean);
}

/* A fixed-size run: the spare slot never started.  Its accuracy. */
static double fixed(const char *name, const char *strategy, int epochs)
{
    int rc = finish(start_job(name, strategy, epochs), 300);
    double acc = test_accuracy(name);
    CHECKF(rc == 0 && acc > 0.8, "%s: exit %d, accuracy %.4f (the spare never started)", name,
           rc, acc);
    CHECKF(count_events(name, "fault") == 0 && !log_has(name, "fault:"),
           "%s: a spare never started counted as a fault", name);
    return acc;
}

/* The step the joiner starts after, from its own line ("Worker 2: joined
 * the run at step 40", "worker:2: joined the all-reduce ring over 3
 * replica(s) at step 40"), or -1. */
static long joined_at(const char *name)
{
    if (!wait_log(name, "2: joined the ", 120))
        return -1;
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.log", tmp, name);
    size_t len;
    char *s = slurp(path, &len);
    const char *j = s ? strstr(s, "2: joined the ") : NULL;
    const char *at = j ? strstr(j, " at step ") : NULL;
    long step = at ? strtol(at + 9, NULL, 10) : -1;
    free(s);
    return step;
}

/* Grows the job by SIGUSR1 once worker 0 logged step 10; once the joiner
 * logged a step, drains `drain` (SIGTERM from this process, not the
 * launcher) and asks for one more worker, which the full job refuses. */
static int grow_and_shrink(const char *name, const char *strategy, const char *drain,
                           int epochs)
{
    pid_t l = start_job(name, strategy, epochs);
    CHECKF(wait_log(name, "Worker 0, At step 10,", 120), "%s: step 10 never came", name);
    kill(l, SIGUSR1);
    /* The drain comes once worker 0 and the joiner are a whole epoch past
     * the join, so one epoch is walked by all three. */
    long at = joined_at(name);
    char line[64];
    long step = (at + SPE + 10 + 9) / 10 * 10; /* the log shows every 10th */
    snprintf(line, sizeof line, "Worker 0, At step %ld,", step);
    CHECKF(at >= 0 && wait_log(name, line, 120), "%s: \"%s\" never came", name, line);
    snprintf(line, sizeof line, "Worker 2, At step %ld,", step);
    pid_t w = await_task(l, name, line, drain);
    if (w > 0)
        kill(w, SIGTERM);
    kill(l, SIGUSR1);
    int rc = finish(l, 300);
    CHECKF(log_has(name, "no spare worker slot is free"),
           "%s: a second SIGUSR1 to the full job was not refused", name);
    return rc;
}

/* Two spares asked for at once (two SIGUSR1s, 4 slots, 2 spare) join the
 * ring at one epoch's start.  The first one let go once it held the state
 * sent the second a ring segment while the second still read its
 * handshake: the second left ("sent frame type 24 instead of HELLO") and
 * the ring hung.  Now each waits for the leader's GO, sent once all are
 * READY: exit 0, two joins, no fault, the four replicas end bitwise equal. */
static void two_at_once(void)
{
    char args[2048];
    snprintf(args, sizeof args, "--workers 4 -- train --strategy allreduce --dataset mnist "
             "--model 784-128-10 --train-size 12000 --val-size 1000 --batch 100 --threads 1 "
             "--no-progress --log-every 10 --heartbeat-timeout 1 --spare-workers 2 --epochs 5 "
             "--metrics %s/ar-two.jsonl", tmp);
    /* epochs long enough for both to start; the leader waits after each
     * READY, so one let go too early would surely speak to the other */
    setenv("DOWNPOUR_TEST_STEP_MS", "10", 1);
    setenv("DOWNPOUR_TEST_WELCOME_MS", "300", 1);
    pid_t l = start("ar-two", args);
    unsetenv("DOWNPOUR_TEST_STEP_MS");
    unsetenv("DOWNPOUR_TEST_WELCOME_MS");
    CHECKF(wait_log("ar-two", "Worker 0, At step 10,", 120), "ar-two: step 10 never came");
    kill(l, SIGUSR1);
    sleep_s(0.1); /* two signals, not one pending twice */
    kill(l, SIGUSR1);
    int rc = finish(l, 300);
    long n = 0;
    int same = replicas_equal("ar-two", &n);
    int at2 = log_has("ar-two", "worker:2 joined the all-reduce ring at step"),
        at3 = log_has("ar-two", "worker:3 joined the all-reduce ring at step");
    fprintf(stderr, "ar-two: exit %d, %d join event(s), %ld replica checksum(s) %s\n", rc,
            count_events("ar-two", "join"), n, same ? "equal" : "NOT equal");
    CHECKF(rc == 0 && at2 && at3 && count_events("ar-two", "join") == 2,
           "ar-two: two spares at once: exit %d, worker:2 %s, worker:3 %s", rc,
           at2 ? "joined" : "did not join", at3 ? "joined" : "did not join");
    CHECKF(count_events("ar-two", "fault") == 0 && !log_has("ar-two", "fault:"),
           "ar-two: a fault (line or event) for two joins");
    CHECKF(same && n == 4, "ar-two: %ld replica checksums, %s (expected 4, equal)", n,
           same ? "all equal" : "not all equal");
    if (rc != 0)
        show_log("ar-two", 40);
}

/* --- joins refused, tasks started by hand --- */

static void write_secret(const char *path, char c)
{
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    for (int i = 0; i < 64; i++)
        fputc(c, f);
    fputc('\n', f);
    fclose(f);
    chmod(path, 0600);
}

/* `downpour run --task worker:I` (I -1: `--join`, a free spare slot; I < -1:
 * `--join 127.0.0.1:-I`, the spec asked of the task at that port, no
 * --cluster) of a job of 4 worker slots, 2 spare, output in tmp/NAME.log;
 * with its listening socket as fd 3 (as the launcher hands it) unless
 * fd < 0, when it binds its address itself. */
static pid_t run_by_hand(const char *name, const char *spec, int i, const char *secret, int fd,
                         const int *fds, int n)
{
    char log[1200], cmd[4096], task[1300];
    snprintf(log, sizeof log, "%s/%s.log", tmp, name);
    if (i >= 0)
        snprintf(task, sizeof task, "--cluster %s --task worker:%d", spec, i);
    else if (i == -1)
        snprintf(task, sizeof task, "--cluster %s --join", spec);
    else
        snprintf(task, sizeof task, "--join 127.0.0.1:%d", -i);
    snprintf(cmd, sizeof cmd, "exec %s run %s --secret-file %s -- "
             "train --strategy allreduce --dataset mnist --model 784-128-10 --train-size "
             "12000 --val-size 1000 --batch 100 --threads 1 --no-progress --log-every 10 "
             "--heartbeat-timeout 1 --spare-workers 2 --epochs 12 --startup-timeout 60", bin,
             task, secret);
    pid_t pid = fork();
    if (pid == 0) {
        int lf = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (lf < 0 || dup2(lf, 1) < 0 || dup2(lf, 2) < 0 ||
            (fd >= 0 && (dup2(fd, 3) < 0 || fcntl(3, F_SETFD, 0) < 0)))
            _exit(126);
        for (int k = 0; k < n; k++)
            if (fds[k] != 3)
                close(fds[k]);
        if (fd >= 0)
            setenv(DP_LAUNCH_LISTEN_FD_ENV, "3", 1);
        /* slower steps than the launched runs': the joins below come
         * after a refusal that takes up to 2 s (the members' redial) */
        setenv("DOWNPOUR_TEST_STEP_MS", "20", 1);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* 4 worker slots, 2 of them spare; worker:0 and worker:1 start.  Then
 * worker:3 with another secret (refused at once, naming the secret),
 * worker:2 with the job's (it joins), `run --join` (it takes worker:3, the
 * slot left), and, the job full, a second worker:2 and a second `--join`
 * (each refused, saying why).  The job ends well. */
static void refused_joins(void)
{
    int ports[4], fds[4], failures = check_failures;
    dp_err err;
    REQUIRE(dp_launch_free_ports(ports, fds, 4, &err) == 0);
    char spec[1200], good[1200], bad[1200];
    snprintf(spec, sizeof spec, "%s/spec.json", tmp);
    snprintf(good, sizeof good, "%s/secret.good", tmp);
    snprintf(bad, sizeof bad, "%s/secret.bad", tmp);
    FILE *f = fopen(spec, "w");
    REQUIRE(f);
    fprintf(f, "{\"cluster\": {\"worker\": [\"127.0.0.1:%d\", \"127.0.0.1:%d\", "
               "\"127.0.0.1:%d\", \"127.0.0.1:%d\"]}}\n", ports[0], ports[1], ports[2], ports[3]);
    fclose(f);
    write_secret(good, 'a');
    write_secret(bad, 'b');
    /* worker:3's port is not held: its tasks bind it themselves, as by
     * hand, and the members' dials to it are refused at once until one
     * listens (a held socket would keep each dial waiting out its
     * handshake timeout, and the job might end before --join is in) */
    close(fds[3]);
    pid_t w0 = run_by_hand("hand-0", spec, 0, good, fds[0], fds, 3);
    pid_t w1 = run_by_hand("hand-1", spec, 1, good, fds[1], fds, 3);
    CHECKF(wait_log("hand-0", "Worker 0, At step 10,", 120), "hand-0: step 10 never came");
    pid_t w3 = run_by_hand("hand-3-bad", spec, 3, bad, -1, fds, 3);
    pid_t w2 = run_by_hand("hand-2", spec, 2, good, fds[2], fds, 3);
    int r3 = finish(w3, 120);
    /* worker:2's slot is held (by this test and the task): --join takes 3,
     * with the spec asked of worker:1 (no --cluster); and a query with the
     * wrong secret is refused, naming it */
    int rq = finish(run_by_hand("hand-query-bad", spec, -ports[1], bad, -1, fds, 3), 60);
    pid_t wj = run_by_hand("hand-join", spec, -ports[1], good, -1, fds, 3);
    CHECKF(wait_log("hand-2", "2: joined the ", 120), "hand-2: worker:2 never joined");
    CHECKF(wait_log("hand-join", "3: joined the ", 120), "hand-join: --join never joined");
    int ra = finish(run_by_hand("hand-2-again", spec, 2, good, -1, fds, 3), 120);
    int rf = finish(run_by_hand("hand-join-full", spec, -1, good, -1, fds, 3), 120);
    int rj = finish(wj, 300), r2 = finish(w2, 300), r0 = finish(w0, 300), r1 = finish(w1, 300);
    for (int i = 0; i < 3; i++)
        close(fds[i]);
    fprintf(stderr, "by hand: the joiner with another secret exited %d, the second worker:2 "
            "%d, --join to the full job %d; the members %d, %d, %d (worker:2) and %d "
            "(worker:3, by --join)\n", r3, ra, rf, r0, r1, r2, rj);
    CHECKF(rf == 1 && log_has("hand-join-full", "no free spare worker slot on this host") &&
               log_has("hand-join-full", "worker:2 at ") &&
               log_has("hand-join-full", "taken"),
           "hand-join-full: --join to a full job exited %d without saying why", rf);
    CHECKF(rj == 0 && log_has("hand-0", "worker:3 joined the all-reduce ring"),
           "hand-join: --join (worker:3) exited %d, or never joined", rj);
    CHECKF(rq == 1 && log_has("hand-query-bad", "for the cluster spec: authentication failed: "
                                                "the task there holds another cluster secret"),
           "hand-query-bad: --join HOST:PORT with another secret exited %d without saying why",
           rq);
    CHECKF(log_has("hand-1", "sent the cluster spec to 127.0.0.1:"),
           "hand-1: no line says it sent the spec to the joiner");
    CHECKF(r3 != 0 && log_has("hand-3-bad", "this task's cluster secret is not the job's"),
           "hand-3-bad: a joiner with the wrong secret exited %d without saying why", r3);
    CHECKF(ra != 0 && log_has("hand-2-again", "the spare slot worker:2 is taken"),
           "hand-2-again: a second task for a filled slot exited %d without saying why", ra);
    CHECKF(r0 == 0 && r1 == 0 && r2 == 0, "the job's tasks exited %d, %d and %d", r0, r1, r2);
    CHECKF(log_has("hand-0", "worker:2 joined the all-reduce ring"),
           "hand-0: worker:2 did not join");
    if (check_failures > failures)
        for (size_t i = 0; i < 8; i++)
            show_log((const char *[]){"hand-0", "hand-1", "hand-2", "hand-3-bad", "hand-join",
                                      "hand-2-again", "hand-join-full", "hand-query-bad"}[i],
                     30);
}

int main(void)
{
    launch_test_init();

    double clean = fixed("ar-fixed", "allreduce", 5);
    int rc = grow_and_shrink("ar-grow", "allreduce", "worker:1", 5);
    check_grown("ar-grow", rc, clean, 0.01, 5);
    long n;
    int same = replicas_equal("ar-grow", &n);
    CHECKF(same && n == 2, "ar-grow: %ld replica checksums, %s (expected worker:0's and the "
           "joiner's, equal)", n, same ? "all equal" : "not all equal");

    clean = fixed("ps-fixed", "ps-async", 5);
    rc = grow_and_shrink("ps-grow", "ps-async", "worker:2", 5);
    check_grown("ps-grow", rc, clean, 0.01, 5);

    /* A spare filled once the last epoch is under way starts at the end and
     * takes part in no checkpoint (it once started a step early, at the
     * final checkpoint's step, and the chief stopped the run: "worker:0 is
     * at checkpoint step 70, the others at 80"). */
    char args[2048];
    snprintf(args, sizeof args, "--workers 3 --chief --ps 1 -- train --strategy ps-async " JOB
             " --epochs 2 --checkpoint-dir %s/late.ck --checkpoint-every 10", tmp);
    pid_t l = start("ps-late", args);
    CHECKF(wait_log("ps-late", "Worker 0, At step 50,", 120), "ps-late: step 50 never came");
    kill(l, SIGUSR1);
    rc = finish(l, 120);
    CHECKF(rc == 0 && log_has("ps-late", "it starts at step 80"),
           "ps-late: a spare filled in the last epoch: exit %d", rc);
    /* ps-sync: a spare filled from a later epoch is not due in the rounds
     * before its first step (the servers once waited for its push there,
     * and the run hung). */
    snprintf(args, sizeof args, "--workers 3 --chief --ps 1 -- train --strategy ps-sync " JOB
             " --epochs 2 --checkpoint-dir %s/sync.ck --checkpoint-every 10", tmp);
    l = start("sync-join", args);
    CHECKF(wait_log("sync-join", "Worker 0, At step 10,", 120), "sync-join: step 10 never came");
    /* admitted at the release of the last barrier before its epoch (30),
     * not at the first (10, 20 would have counted it without it); it starts
     * a step early to take part in the checkpoint at its epoch's start */
    kill(l, SIGUSR1);
    rc = finish(l, 60);
    CHECKF(rc == 0 && log_has("sync-join", "it starts at step 39 (epoch 1)"),
           "sync-join: a spare joining ps-sync at the next epoch: exit %d", rc);
    two_at_once();
    refused_joins();

    /* refused before any task starts (exit 2): no worker would start, or a
     * strategy that cannot take one in mid-run */
    rc = finish(start("refuse-all", "--workers 2 -- train --spare-workers 2"), 60);
    CHECKF(rc == 2 && log_has("refuse-all", "at least one must start"),
           "refuse-all: --spare-workers 2 of 2 workers: exit %d", rc);
    rc = finish(start("refuse-pipe", "--workers 2 -- train --strategy pipeline "
                                     "--spare-workers 1"), 60);
    CHECKF(rc == 2 && log_has("refuse-pipe", "cannot take a worker in mid-run"),
           "refuse-pipe: --spare-workers under pipeline: exit %d", rc);
    return check_failures ? 1 : 0;
}
