/* Sparse rows through `downpour launch` (docs/strategies.md, "Sparse
 * rows"), on a small id dataset written here (8 ids a record in [0, 1000):
 * 4 from its class's hundred, 4 log-uniform over the table, small ids far
 * more often than large) and the model 8-emb1000x16-gap-10:
 * - chosen by itself (said at --verbose), and --ps-dense moves the table
 *   whole instead;
 * - ps-sync, 2 workers and 2 ps tasks, sgd and adagrad: the saved weights
 *   equal the dense path's bit for bit;
 * - ps-async with one worker equals one process (sgd);
 * - ps-ssp and ps-dssp train on rows; --ps-replicas 2 equals one copy;
 * - a ps-sync run killed at step 33 and resumed ends bit for bit where the
 *   uninterrupted one ends, lazy Adam's moments in the checkpoint; so does
 *   one with --ps-replicas 2 and a table every task holds compact, resumed
 *   with ps:0 killed at step 50 (its backup then serving both shards; not
 *   under ASan);
 * - a worker's bytes per step are a fraction of the dense path's;
 * - ps:0 killed at step 30 under --max-restarts 1 (a paced run, a table
 *   of 5,000 rows which the chief holds compact): the launcher restarts
 *   it, the chief restores its shard, its rows among it (read from the
 *   checkpoint at step 20 by rows), and the run ends within 0.06 of the
 *   fault-free run's test accuracy (about 10 steps of a shard are lost). */
#include <math.h>
#include <sys/stat.h>

#include "bytes.h"
#include "launch.h"

#define MODEL "8-emb1000x16-gap-10"
#define BIG "8-emb5000x16-gap-10" /* its table cut on the chief too */
#define COMMON "--model " MODEL " --epochs 2 --threads 1 --no-progress --log-every 0 " \
               "--train-size 1800 --val-size 200 --test-size 200 --batch 16"

static char err[65536];

static void write_file(const char *name, bytes b)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/ids/%s", tmp, name);
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fwrite(b.p, 1, b.n, f) == b.n && fclose(f) == 0);
    free(b.p);
}

/* n records of 8 ids: 4 in [100 c, 100 c + 100) for the record's class c,
 * 4 log-uniform in [0, 999] (Zipf-like: small ids far more often). */
static void write_split(const char *split, int n, uint64_t seed)
{
    float *x = malloc((size_t)n * 8 * sizeof *x);
    uint8_t *y = malloc((size_t)n);
    REQUIRE(x && y);
    for (int i = 0; i < n * 8; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        double u = (double)(seed >> 11) / 9007199254740992.0;
        if (i % 8 == 0)
            y[i / 8] = (uint8_t)(u * 10);
        x[i] = i % 8 < 4 ? (float)(100 * y[i / 8] + (int)(u * 1000) % 100)
                         : (float)floor(pow(1000.0, u) - 1.0);
    }
    char name[64], shape[64];
    snprintf(shape, sizeof shape, "(%d, 8)", n);
    snprintf(name, sizeof name, "x_%s.npy", split);
    write_file(name, npy_array("<f4", shape, x, (size_t)n * 8 * sizeof *x));
    snprintf(shape, sizeof shape, "(%d,)", n);
    snprintf(name, sizeof name, "y_%s.npy", split);
    write_file(name, npy_array("|u1", shape, y, (size_t)n));
    free(x);
    free(y);
}

static int launch(const char *strategy, int workers, const char *save, const char *extra)
{
    return run_cmd(err, sizeof err,
                   "%s launch --chief --workers %d --ps 2 -- train --dataset %s/ids --strategy %s "
                   COMMON " --save %s/%s %s",
                   bin, workers, tmp, strategy, tmp, save, extra);
}

static void same_weights(const char *a, const char *b, const char *what)
{
    double d = checkpoint_max_diff(a, b);
    CHECKF(d == 0, "%s: the weights differ by up to %g", what, d);
}

static void sync_equals_dense(const char *opt)
{
    char extra[256], sa[64], da[64];
    snprintf(sa, sizeof sa, "sync-rows-%s.st", opt);
    snprintf(da, sizeof da, "sync-dense-%s.st", opt);
    snprintf(extra, sizeof extra, "--optimizer %s --lr 0.5 --verbose", opt);
    int rc = launch("ps-sync", 2, sa, extra);
    CHECKF(rc == 0, "ps-sync rows exited %d: %s", rc, err);
    CHECKF(strstr(err, "[worker 1] debug: sparse rows: 1 table(s) of " MODEL " (1000 rows, "
                       "16000 floats)") != NULL,
           "no line says the table moves by rows: %s", err);
    snprintf(extra, sizeof extra, "--optimizer %s --lr 0.5 --ps-dense", opt);
    rc = launch("ps-sync", 2, da, extra);
    CHECKF(rc == 0, "ps-sync dense exited %d: %s", rc, err);
    CHECKF(strstr(err, "move whole, as dense parameters: --ps-dense") != NULL,
           "--ps-dense is not said: %s", err);
    same_weights(sa, da, opt);
    printf("ps-sync %s, 2 workers, 2 ps: rows = dense, bit for bit\n", opt);
}

static void async_equals_single(void)
{
    int rc = run_cmd(err, sizeof err, "%s train --dataset %s/ids " COMMON " --optimizer sgd "
                     "--lr 0.5 --save %s/single.st", bin, tmp, tmp);
    CHECKF(rc == 0, "single exited %d: %s", rc, err);
    rc = launch("ps-async", 1, "async1.st", "--optimizer sgd --lr 0.5");
    CHECKF(rc == 0, "ps-async exited %d: %s", rc, err);
    same_weights("async1.st", "single.st", "ps-async with one worker against one process");
    printf("ps-async, one worker, rows: one process's weights, bit for bit\n");
}

static void other_modes(void)
{
    const char *modes[] = {"ps-ssp", "ps-dssp", "ps-async"};
    for (int i = 0; i < 3; i++) {
        int rc = launch(modes[i], 2, "mode.st", "--optimizer adagrad --lr 0.5 --verbose");
        CHECKF(rc == 0 && strstr(err, "debug: sparse rows:"), "%s on rows exited %d: %s",
               modes[i], rc, err);
    }
    int rc = launch("ps-sync", 2, "sync-rows-replicas.st",
                    "--optimizer adagrad --lr 0.5 --ps-replicas 2");
    CHECKF(rc == 0, "--ps-replicas 2 exited %d: %s", rc, err);
    same_weights("sync-rows-replicas.st", "sync-rows-adagrad.st", "--ps-replicas 2");
    printf("ps-ssp, ps-dssp, ps-async and --ps-replicas 2 on rows\n");
}

static void resume_is_exact(void)
{
    const char *o = "--optimizer adam --lr 0.05 --checkpoint-every 7";
    char extra[512];
    snprintf(extra, sizeof extra, "%s --checkpoint-dir %s/ck-a", o, tmp);
    int rc = launch("ps-sync", 2, "resume-a.st", extra);
    CHECKF(rc == 0, "uninterrupted exited %d: %s", rc, err);
    snprintf(extra, sizeof extra, "%s --checkpoint-dir %s/ck-b", o, tmp);
    rc = run_cmd(err, sizeof err,
                 "DOWNPOUR_FAULT_KILL_AT_STEP=33 %s launch --chief --workers 2 --ps 2 -- train "
                 "--dataset %s/ids --strategy ps-sync " COMMON " --save %s/resume-b.st %s",
                 bin, tmp, tmp, extra);
    CHECKF(rc != 0, "the killed run exited 0");
    snprintf(extra, sizeof extra, "%s --checkpoint-dir %s/ck-b --resume", o, tmp);
    rc = launch("ps-sync", 2, "resume-b.st", extra);
    CHECKF(rc == 0 && strstr(err, "Resuming from"), "the resumed run exited %d: %s", rc, err);
    same_weights("resume-a.st", "resume-b.st", "resumed against uninterrupted (lazy adam)");
    printf("ps-sync on rows, lazy adam: resumed = uninterrupted, bit for bit\n");
}

/* --ps-replicas 2 on rows with --resume (a table of 5,000 rows: every task
 * holds it compact, the chief streams it into its checkpoints and --save
 * from the shards a chunk at a time, each ps task reads its rows of the
 * checkpoint a piece at a time): a ps-sync run with replicas killed at step
 * 33 and resumed with ps:0 SIGKILLed at step 50 (paced): its backup ps:1
 * takes shard 0 over, the checkpoints after it and --save are streamed from
 * ps:1 serving both shards (before, refused: "serves two shards"), and the
 * run ends bit for bit where the uninterrupted run (one copy of each shard)
 * ends.  Not under ASan (three more runs, 8 s there): the chunked table
 * pulls and a shard's failover run under it in test_ps_sparse, in process,
 * and the resume on rows in resume_is_exact. */
static void replicas_resume(void)
{
    if (SANITIZED)
        return;
    const char *o = "--optimizer adam --lr 0.05 --checkpoint-every 7 --model " BIG;
    char extra[512], args[2048];
    snprintf(extra, sizeof extra, "%s --checkpoint-dir %s/rr-a", o, tmp);
    int rc = launch("ps-sync", 2, "rr-a.st", extra);
    CHECKF(rc == 0, "uninterrupted exited %d: %s", rc, err);
    snprintf(extra, sizeof extra, "%s --ps-replicas 2 --checkpoint-dir %s/rr-b", o, tmp);
    rc = run_cmd(err, sizeof err,
                 "DOWNPOUR_FAULT_KILL_AT_STEP=33 %s launch --chief --workers 2 --ps 2 -- train "
                 "--dataset %s/ids --strategy ps-sync " COMMON " --save %s/rr-b.st %s",
                 bin, tmp, tmp, extra);
    CHECKF(rc != 0, "the killed run exited 0");
    setenv("DOWNPOUR_TEST_STEP_MS", "8", 1); /* long enough to strike in */
    snprintf(args, sizeof args, "--chief --workers 2 --ps 2 -- train --dataset %s/ids "
             "--strategy ps-sync " COMMON " %s --ps-replicas 2 --heartbeat-timeout 1 "
             "--log-every 10 --checkpoint-dir %s/rr-b --resume --save %s/rr-b.st", tmp, o, tmp,
             tmp);
    pid_t l = start("rr-b", args);
    pid_t ps = await_task(l, "rr-b", "Worker 1, At step 50,", "ps:0");
    if (ps > 0)
        kill(ps, SIGKILL);
    rc = finish(l, 300);
    unsetenv("DOWNPOUR_TEST_STEP_MS");
    CHECKF(rc == 0 && log_has("rr-b", "[ps 0] Resuming from") &&
               log_has("rr-b", "ckpt-0000000028") && log_has("rr-b", "takes the shard over") &&
               !log_has("rr-b", "not written"),
           "resumed with replicas, ps:0 killed at step 50: exit %d, not resumed from step 28, no "
           "takeover, or a checkpoint not written", rc);
    if (rc != 0)
        show_log("rr-b", 20);
    same_weights("rr-a.st", "rr-b.st", "--ps-replicas 2 resumed, ps:0 lost, against "
                 "uninterrupted");
    printf("ps-sync on rows (compact everywhere), --ps-replicas 2, lazy adam: killed at step "
           "33 and resumed, ps:0 killed at step 50 of the resumed run (ps:1 serving both "
           "shards) = uninterrupted, bit for bit\n");
}

/* The worker's bytes per step from its steps event. */
static double bytes_per_step(const char *metrics)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", tmp, metrics);
    cJSON *steps = last_event(path, "steps", "worker:0");
    CHECKF(steps != NULL, "no steps event in %s", metrics);
    double b = steps ? (json_num(steps, "comm_tx_bytes") + json_num(steps, "comm_rx_bytes")) /
                           json_num(steps, "steps")
                     : 0;
    cJSON_Delete(steps);
    return b;
}

static void fewer_bytes(void)
{
    char extra[512];
    snprintf(extra, sizeof extra, "--optimizer sgd --lr 0.5 --metrics %s/rows.jsonl", tmp);
    int rc = launch("ps-async", 2, "b.st", extra);
    CHECKF(rc == 0, "exited %d: %s", rc, err);
    snprintf(extra, sizeof extra, "--optimizer sgd --lr 0.5 --ps-dense --metrics %s/dense.jsonl",
             tmp);
    rc = launch("ps-async", 2, "b.st", extra);
    CHECKF(rc == 0, "exited %d: %s", rc, err);
    double rows = bytes_per_step("rows.jsonl"), dense = bytes_per_step("dense.jsonl");
    /* a batch of 16 records touches at most 128 of the 1000 rows */
    CHECKF(rows > 0 && rows * 4 < dense, "a worker moved %.0f bytes a step on rows, %.0f dense",
           rows, dense);
    printf("worker:0 bytes per step (sent + received, heartbeats and epoch reports included): "
           "%.0f on rows, %.0f dense\n", rows, dense);
}

static void restarted_ps(void)
{
    char args[2048], extra[512];
    /* a table of 5,000 rows (the ids stay below 1,000): the chief, whose
     * evaluation chunk touches at most 4,000, holds it compact, and
     * restores the shard's rows from the checkpoint by rows */
    snprintf(extra, sizeof extra, "--optimizer adam --lr 0.1 --metrics %s/clean.jsonl --model "
             BIG, tmp);
    int rc = launch("ps-sync", 2, "clean.st", extra);
    double clean = test_accuracy("clean");
    CHECKF(rc == 0 && clean > 0, "the fault-free run exited %d: %s", rc, err);
    setenv("DOWNPOUR_TEST_STEP_MS", "8", 1); /* long enough to strike in */
    snprintf(args, sizeof args, "--chief --workers 2 --ps 2 --max-restarts 1 --verbose -- train "
             "--dataset %s/ids --strategy ps-sync " COMMON " --optimizer adam --lr 0.1 "
             "--log-every 10 --checkpoint-every 20 --checkpoint-dir %s/restart.ck "
             "--metrics %s/restart.jsonl --model " BIG, tmp, tmp, tmp);
    pid_t l = start("restart", args);
    pid_t ps = await_task(l, "restart", "Worker 1, At step 30,", "ps:0");
    if (ps > 0)
        kill(ps, SIGKILL);
    rc = finish(l, 300);
    unsetenv("DOWNPOUR_TEST_STEP_MS");
    double acc = test_accuracy("restart");
    CHECKF(rc == 0 && log_has("restart", "debug: sparse rows:") &&
               log_has("restart", "restores its shard") &&
               log_has("restart", "compact tables: the chief holds") &&
               log_has("restart", "ckpt-0000000020") && log_has("restart", "fault: ps:0 is back"),
           "ps-sync on rows, ps:0 killed and restarted: exit %d, or no restore from step 20", rc);
    CHECKF(fabs(acc - clean) <= 0.06, "ps-sync on rows, ps:0 restarted: test accuracy %.4f, "
           "fault-free %.4f", acc, clean);
    printf("ps-sync on rows, ps:0 killed at step 30 and restored from step 20: test accuracy "
           "%.4f (fault-free %.4f)\n", acc, clean);
}

int main(void)
{
    (void)launch_test_init; /* it needs MNIST: this test writes its own data */
    (void)count_events;
    bin = test_bin();
    tmp = test_tmp();
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/ids", tmp);
    mkdir(dir, 0755);
    write_split("train", 2000, 1);
    write_split("test", 200, 2);
    sync_equals_dense("sgd");
    sync_equals_dense("adagrad");
    async_equals_single();
    other_modes();
    resume_is_exact();
    replicas_resume();
    fewer_bytes();
    restarted_ps();
    return CHECK_DONE();
}
