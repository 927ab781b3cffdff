/* Parameter-server training through `downpour launch`, on MNIST:
 * - every consistency mode reaches 0.95 validation accuracy (make test-long;
 *   make test: 0.85 on 12,000 records);
 * - ps-sync with W workers at batch b ends where one process at batch W*b
 *   ends over the same data order (exact aggregation), and two ps shards
 *   give what one gives;
 * - ps-ssp never lets a worker lead the slowest by more than s clocks while
 *   one worker is slowed on purpose, and ps-async keeps the others at full
 *   speed beside that straggler. */
#include <math.h>

#include "proc.h"

#define MAX_EVENTS 4096

static char err[65536];

static int launch(const char *strategy, int workers, int ps, const char *metrics, const char *extra)
{
    return run_cmd(err, sizeof err,
                   "%s launch --chief --workers %d --ps %d -- train --strategy %s --threads 1 "
                   "--no-progress --log-every 0 --metrics %s/%s %s",
                   test_bin(), workers, ps, strategy, test_tmp(), metrics, extra);
}

/* The modes train on 12,000 records (measured: 0.900 to 0.921 validation
 * accuracy after 2 epochs) and on all 54,000 to the 0.95 the issue set under
 * make test-long; under ASan on 4,000, with a bound that only says they
 * learned (there they check memory). */
#define MODE_LONG (LONG_CHECKS && !SANITIZED)
#define MODE_RECORDS (MODE_LONG ? "" \
                      : SANITIZED ? " --train-size 4000 --val-size 500 --test-size 1000" \
                                  : " --train-size 12000 --val-size 1000 --test-size 2000")
#define MODE_ACCURACY (MODE_LONG ? 0.95 : SANITIZED ? 0.6 : 0.85)

static void check_mode(const char *strategy, const char *extra_options)
{
    char metrics[64], path[1200], extra[512];
    snprintf(metrics, sizeof metrics, "%s.jsonl", strategy);
    snprintf(extra, sizeof extra, "%s%s", extra_options, MODE_RECORDS);
    int rc = launch(strategy, 2, 1, metrics, extra);
    CHECKF(rc == 0, "%s exited %d: %s", strategy, rc, err);
    snprintf(path, sizeof path, "%s/%s", test_tmp(), metrics);
    cJSON *epoch = last_event(path, "epoch", "chief:0"), *done = last_event(path, "done", "chief:0");
    CHECKF(epoch && done, "%s: no epoch or done event from the chief", strategy);
    if (epoch && done) {
        double acc = json_num(epoch, "val_accuracy");
        CHECKF(acc >= MODE_ACCURACY, "%s: validation accuracy %.4f < %.2f", strategy, acc,
               MODE_ACCURACY);
        CHECK(strcmp(json_str(done, "strategy"), strategy) == 0);
        CHECK(json_num(done, "workers") == 2 && json_num(done, "ps") == 1);
        CHECK(json_num(done, "global_batch") == 256);
        fprintf(stderr, "%s: val_accuracy %.4f, test_accuracy %.4f, %.2f s\n", strategy, acc,
                json_num(done, "test_accuracy"), json_num(done, "train_seconds"));
    }
    cJSON_Delete(epoch);
    cJSON_Delete(done);
    /* Every task sampled its resources, and the launcher summed them. */
    CHECK(for_each_event(path, "resource", "worker:1", NULL, NULL) >= 1);
    CHECK(for_each_event(path, "resource_total", NULL, NULL, NULL) == 1);
    /* Each worker's traffic per epoch: ps-async and ps-sync push a whole
     * gradient and pull the parameters (266,610 floats) every step. */
    cJSON *steps = last_event(path, "steps", "worker:1");
    CHECKF(steps != NULL, "%s: no steps event from worker:1", strategy);
    if (steps && (!strcmp(strategy, "ps-async") || !strcmp(strategy, "ps-sync"))) {
        double floor = json_num(steps, "steps") * 266610.0 * 4;
        CHECKF(json_num(steps, "comm_tx_bytes") >= floor &&
                   json_num(steps, "comm_rx_bytes") >= floor,
               "%s: %g steps moved %g / %g bytes", strategy, json_num(steps, "steps"),
               json_num(steps, "comm_tx_bytes"), json_num(steps, "comm_rx_bytes"));
    }
    cJSON_Delete(steps);
}

static void check_sync_is_exact(void)
{
    const char *common = "--train-size 3200 --val-size 500 --test-size 1000 --epochs 1 --optimizer sgd --lr 0.1";
    int rc = run_cmd(err, sizeof err,
                     "%s train --batch 128 --threads 1 --no-progress --log-every 0 %s --save %s/single.st",
                     test_bin(), common, test_tmp());
    CHECKF(rc == 0, "single exited %d: %s", rc, err);
    char extra[512];
    snprintf(extra, sizeof extra, "--batch 64 %s --save %s/sync1.st", common, test_tmp());
    rc = launch("ps-sync", 2, 1, "sync1.jsonl", extra);
    CHECKF(rc == 0, "ps-sync exited %d: %s", rc, err);
    /* --verbose: the chief's shard layout is a debug line */
    snprintf(extra, sizeof extra,
             "--verbose --batch 64 %s --ps-min-shard-bytes 4096 --save %s/sync2.st", common,
             test_tmp());
    rc = launch("ps-sync", 2, 2, "sync2.jsonl", extra);
    CHECKF(rc == 0, "ps-sync on 2 shards exited %d: %s", rc, err);
    CHECKF(strstr(err, "shard 1: parameters") != NULL, "the run did not use two shards: %s", err);
    double d1 = checkpoint_max_diff("single.st", "sync1.st"), d2 = checkpoint_max_diff("sync1.st", "sync2.st");
    fprintf(stderr, "ps-sync vs single at the summed batch: max |diff| %.3g; 2 shards vs 1: %.3g\n",
            d1, d2);
    CHECKF(d1 < 1e-5, "ps-sync differs from one process at the summed batch by %g", d1);
    CHECKF(d2 < 1e-6, "two shards differ from one by %g", d2);
    /* And the check itself can fail: a different batch is a different run. */
    rc = run_cmd(err, sizeof err,
                 "%s train --batch 64 --threads 1 --no-progress --log-every 0 %s --save %s/other.st",
                 test_bin(), common, test_tmp());
    CHECK(rc == 0);
    CHECK(checkpoint_max_diff("single.st", "other.st") > 1e-3);
}

/* Clock events of one worker: when it started each step. */
typedef struct trace {
    int n;
    double mono[MAX_EVENTS];
    long clock[MAX_EVENTS];
    long max_gap;
} trace;

static void add_clock(const cJSON *j, void *ctx)
{
    trace *t = ctx;
    if (t->n < MAX_EVENTS) {
        t->mono[t->n] = json_num(j, "mono");
        t->clock[t->n] = (long)json_num(j, "clock");
        long g = (long)json_num(j, "max_gap");
        t->max_gap = g > t->max_gap ? g : t->max_gap;
        t->n++;
    }
}

static void read_traces(const char *metrics, trace *tr, int workers)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", test_tmp(), metrics);
    for (int w = 0; w < workers; w++) {
        char task[32];
        snprintf(task, sizeof task, "worker:%d", w);
        memset(&tr[w], 0, sizeof tr[w]);
        CHECK(for_each_event(path, "clock", task, add_clock, &tr[w]) > 0);
    }
}

/* Steps worker v had finished by time t. */
static long finished_by(const trace *v, double t)
{
    long c = 0;
    for (int i = 0; i < v->n && v->mono[i] <= t; i++)
        c = v->clock[i];
    return c;
}

/* The largest lead over the slowest worker seen in the traces, and the
 * largest gap the servers said they allowed. */
static long traced_lead(const trace *tr, int workers, long *server_gap)
{
    long worst = 0;
    *server_gap = 0;
    for (int w = 0; w < workers; w++) {
        *server_gap = tr[w].max_gap > *server_gap ? tr[w].max_gap : *server_gap;
        for (int i = 0; i < tr[w].n; i++) {
            long slowest = tr[w].clock[i];
            for (int v = 0; v < workers; v++)
                if (v != w && tr[v].n > 0 && tr[v].mono[tr[v].n - 1] > tr[w].mono[i]) {
                    long f = finished_by(&tr[v], tr[w].mono[i]);
                    slowest = f < slowest ? f : slowest;
                }
            long gap = tr[w].clock[i] - slowest;
            worst = gap > worst ? gap : worst;
        }
    }
    return worst;
}

static void check_ssp_bound(void)
{
    enum { W = 3, S = 2 };
    const char *common = "--train-size 6000 --val-size 500 --test-size 1000 --epochs 2 --batch 64 --straggler 1:40 "
                         "--trace-clocks";
    char extra[256];
    snprintf(extra, sizeof extra, "%s --staleness %d", common, S);
    int rc = launch("ps-ssp", W, 1, "ssp.jsonl", extra);
    CHECKF(rc == 0, "ps-ssp exited %d: %s", rc, err);
    static trace tr[W];
    read_traces("ssp.jsonl", tr, W);
    long allowed, worst = traced_lead(tr, W, &allowed);
    CHECKF(allowed <= S, "a worker was let run %ld clocks ahead (s = %d)", allowed, S);
    /* A worker's trace line follows its push, so the servers may count one
     * more step of the slowest worker than its trace shows by then: s + 1. */
    fprintf(stderr, "ps-ssp s=%d with a straggler: largest lead seen in the traces %ld\n", S, worst);
    CHECKF(worst <= S + 1, "a worker led the slowest by %ld clocks with staleness %d", worst, S);
    CHECKF(worst >= 1, "the straggler never fell behind: the test proves nothing");

    /* ps-dssp: the bound adapts within its range and never passes the upper
     * one.  (When it goes past the lower bound depends on the timing of the
     * pushes; test_ps_rules checks that rule step by step on a clock of its
     * own, since a loaded machine can change the timing here.) */
    enum { LO = 1, HI = 4 };
    snprintf(extra, sizeof extra, "%s --staleness-range %d:%d", common, LO, HI);
    rc = launch("ps-dssp", W, 1, "dssp.jsonl", extra);
    CHECKF(rc == 0, "ps-dssp exited %d: %s", rc, err);
    read_traces("dssp.jsonl", tr, W);
    worst = traced_lead(tr, W, &allowed);
    fprintf(stderr, "ps-dssp %d:%d with a straggler: servers allowed %ld, traces show %ld\n", LO, HI,
            allowed, worst);
    CHECKF(allowed <= HI && worst <= HI + 1, "ps-dssp let a worker lead by %ld (traced %ld), "
           "upper bound %d", allowed, worst, HI);

    /* ps-async with the same straggler: the others do not wait for it.  The
     * straggler sleeps 40 ms a step on top of the work every worker does, so
     * the others end at least half those sleeps before it; a ratio of the
     * times would not hold on a loaded machine, where the work grows and the
     * sleeps do not (ASan under load once saw 4.0 and 3.8 s against 5.1). */
    rc = launch("ps-async", W, 1, "async.jsonl", common);
    CHECKF(rc == 0, "ps-async exited %d: %s", rc, err);
    read_traces("async.jsonl", tr, W);
    double span[W];
    for (int w = 0; w < W; w++)
        span[w] = tr[w].n > 1 ? tr[w].mono[tr[w].n - 1] - tr[w].mono[0] : 0;
    fprintf(stderr, "ps-async with a straggler: worker times %.3f %.3f %.3f s\n", span[0], span[1],
            span[2]);
    double slept = tr[1].n > 1 ? (tr[1].n - 1) * 0.040 : 0;
    CHECKF(span[0] < span[1] - slept / 2 && span[2] < span[1] - slept / 2,
           "fast workers took %.3f and %.3f s beside the straggler's %.3f s, %.3f s of which it "
           "slept", span[0], span[2], span[1], slept);
}

int main(void)
{
    REQUIRE(test_bin() && test_tmp());
    require_mnist();
    check_mode("ps-async", "--epochs 2 --keep-best --ema 0.9");
    CHECKF(strstr(err, "Restored the weights of epoch"), "--keep-best restored nothing: %s", err);
    check_mode("ps-sync", "--epochs 2");
    check_mode("ps-ssp", "--epochs 2 --staleness 3");
    check_mode("ps-dssp", "--epochs 2 --staleness-range 1:6");
    check_mode("model-avg", "--epochs 2 --period 4");
    check_sync_is_exact();
    check_ssp_bound();
    return CHECK_DONE();
}
