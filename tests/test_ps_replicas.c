/* Parameter-server replicas (--ps-replicas 2, docs/faults.md "Parameter
 * servers").
 *
 * Event by event on the in-process transport (one shard on ps:0, its backup
 * on ps:1, one worker; frames sent by hand as in test_ps_rules):
 * - the primary applies a push, forwards it and holds the reply until the
 *   backup acknowledged it; the backup's parameters, Adam state, step count
 *   and update count then equal the primary's bit for bit;
 * - the primary crashes after forwarding an update whose reply it held: the
 *   worker re-sends the push to the backup, which applied it already and
 *   answers it without applying it again;
 * - the primary's links are cut with the forward in flight: the backup never
 *   got the update, so the re-sent push is applied there, once.
 *
 * Whole runs under `downpour launch` (2 workers, 2 ps tasks, each the
 * primary of one shard and the backup of the other), a ps SIGKILLed when
 * worker 1 has logged step 60 of 180:
 * - ps-sync (ps:0 or ps:1 killed) and model-avg: exit 0, and the saved
 *   parameters equal the fault-free run's (both modes are deterministic; no
 *   update is lost or applied twice); checkpoints every 25 steps, so the
 *   chief's state pulls fail over as well;
 * - ps-sync with ps:0 frozen (SIGSTOP) past the 1 s heartbeat timeout, then
 *   woken: the same;
 * - ps-async with one worker (deterministic): the final parameters equal the
 *   fault-free run's; with two: exit 0, the shard taken over holds each of
 *   the 360 pushes once, and the test accuracy is within 2 % (the workers'
 *   interleaving alone moves it by about 1 %);
 * - --ps-replicas 2 with one ps task is refused, naming the fix. */
#include <math.h>
#include <stdint.h>

#include "downpour/inproc.h"
#include "downpour/launcher.h"
#include "downpour/log.h"
#include "downpour/wire.h"
#include "launch.h"
#include "strategy/ps_rules.h"

#define NP 4

static dp_err err;
static const float p_init[NP] = {1, 2, -3, 0.5f};

/* chief 0, worker 1, ps:0 2 (the primary), ps:1 3 (the backup). */
enum { CHIEF, WORKER, PS0, PS1, N_RANKS };

typedef struct rig {
    dp_cluster c;
    dp_transport *ts[N_RANKS];
    dp_ps_server *s[N_RANKS]; /* PS0, PS1 */
} rig;

static void rig_open(rig *r)
{
    int ports[N_RANKS] = {21000, 21001, 21002, 21003}; /* never listened on */
    const char *names[N_RANKS];
    REQUIRE(dp_cluster_local(&r->c, 1, 1, 2, ports, &err) == 0);
    for (int i = 0; i < N_RANKS; i++)
        names[i] = r->c.tasks[i].name;
    REQUIRE(dp_inproc_open_named(r->ts, N_RANKS, names, &err) == 0);
    dp_ps_config cfg;
    dp_ps_config_init(&cfg);
    cfg.replicas = 2;
    cfg.max_shards = 1;
    dp_ps_layout layout;
    REQUIRE(dp_ps_layout_make(&layout, &r->c, NP, &cfg, &err) == 0);
    REQUIRE(layout.n_shards == 1 && layout.rank[0] == PS0 && layout.backup[0] == PS1);
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_ADAM);
    oc.lr = 1;
    dp_ps_start start = {.params = p_init};
    for (int p = PS0; p <= PS1; p++)
        if (dp_ps_server_open(&r->s[p], r->ts[p], &r->c, &layout, &cfg, &oc, &start, NP, &err) <
            0) {
            fprintf(stderr, "dp_ps_server_open: %s\n", err.msg);
            exit(1);
        }
    REQUIRE(r->s[PS1]->backup && r->s[PS1]->shard < 0 && r->s[PS0]->backup == NULL);
}

static void rig_close(rig *r)
{
    for (int p = PS0; p <= PS1; p++)
        dp_ps_server_close(r->s[p]);
    for (int i = 0; i < N_RANKS; i++)
        dp_transport_close(r->ts[i]);
    dp_cluster_free(&r->c);
}

/* The worker pushes gradient g with client clock `step` to ps task `to`. */
static void push(rig *r, int to, uint64_t step, const float *g)
{
    uint8_t raw[DP_PUSH_HEAD_SIZE];
    dp_push_head h = {10, 1, 0.1f, 0};
    dp_push_head_put(raw, &h);
    struct iovec iov[2] = {{raw, sizeof raw}, {(void *)g, NP * sizeof(float)}};
    REQUIRE(dp_transport_sendv(r->ts[WORKER], to, DP_WIRE_PUSH_GRAD, step, 0, iov, 2, &err) == 0);
}

static void serve(rig *r, int p, int line)
{
    int rc = dp_ps_server_poll(r->s[p], 0, &err);
    if (rc != 0) {
        fprintf(stderr, "%s:%d: %s poll returned %d: %s\n", __FILE__, line, r->c.tasks[p].name,
                rc, err.msg);
        check_failures++;
    }
}
#define SERVE(r, p) serve(r, p, __LINE__)

/* Whether the worker has a PARAMS reply from `from`; read into out. */
static int reply(rig *r, int from, float *out)
{
    dp_event ev;
    REQUIRE(dp_transport_poll(r->ts[WORKER], from, 0, &ev, &err) == 0);
    if (ev.kind != DP_EVENT_FRAME)
        return 0;
    REQUIRE(ev.header.type == DP_WIRE_PARAMS && ev.header.length == NP * sizeof(float));
    REQUIRE(dp_transport_recv_payload(r->ts[WORKER], from, out, NP * sizeof(float), &err) == 0);
    return 1;
}

/* The backup's copy equals the primary's bit for bit. */
static int same_state(const dp_ps_server *a, const dp_ps_server *b)
{
    return a->n == b->n && memcmp(a->params, b->params, a->n * sizeof(float)) == 0 &&
           memcmp(a->opt.state, b->opt.state, 2 * a->n * sizeof(float)) == 0 &&
           a->opt.t == b->opt.t && a->updates == b->updates;
}

static const float g1[NP] = {0.5f, -1, 2, 0.25f}, g2[NP] = {-0.3f, 0.7f, 0.1f, -2};

static void forwarding(void)
{
    rig r;
    rig_open(&r);
    dp_ps_server *primary = r.s[PS0], *backup = r.s[PS1]->backup;
    float got[NP];
    push(&r, PS0, 1, g1);
    SERVE(&r, PS0); /* applied and forwarded; the reply waits for the ack */
    CHECK(primary->updates == 1 && backup->updates == 0);
    CHECKF(!reply(&r, PS0, got), "the primary answered before its backup had the update");
    SERVE(&r, PS1); /* the backup applies it and acknowledges */
    CHECK(backup->updates == 1);
    CHECKF(same_state(primary, backup), "the backup's shard differs from the primary's");
    SERVE(&r, PS0); /* the ack lets the reply go */
    CHECKF(reply(&r, PS0, got), "no reply after the backup's acknowledgement");
    CHECK(memcmp(got, primary->params, sizeof got) == 0);

    /* A second update, then the primary crashes with its reply held. */
    push(&r, PS0, 2, g2);
    SERVE(&r, PS0);
    float want[NP];
    memcpy(want, primary->params, sizeof want);
    REQUIRE(dp_inproc_kill(r.ts[PS0], DP_INPROC_CRASH, &err) == 0);
    push(&r, PS1, 2, g2); /* the worker's failover: the same push, to the backup */
    SERVE(&r, PS1);       /* the forwarded update */
    SERVE(&r, PS1);       /* ps:0 lost: ps:1 takes shard 0 over */
    CHECK(backup->primary_rank < 0);
    SERVE(&r, PS1); /* the re-sent push: applied already, answered */
    CHECKF(backup->updates == 2, "the backup applied %ld updates; 2 were pushed", backup->updates);
    CHECKF(reply(&r, PS1, got) && memcmp(got, want, sizeof got) == 0,
           "the re-sent push was not answered with the parameters after both updates");
    /* The next push is a new one, applied by the new primary. */
    push(&r, PS1, 3, g1);
    SERVE(&r, PS1);
    CHECK(backup->updates == 3 && reply(&r, PS1, got));
    rig_close(&r);
}

static void forward_lost(void)
{
    rig r;
    rig_open(&r);
    dp_ps_server *backup = r.s[PS1]->backup;
    float got[NP];
    push(&r, PS0, 1, g1);
    SERVE(&r, PS0);
    float want[NP];
    memcpy(want, r.s[PS0]->params, sizeof want);
    REQUIRE(dp_inproc_kill(r.ts[PS0], DP_INPROC_CUT, &err) == 0); /* the forward is dropped */
    push(&r, PS1, 1, g1);
    SERVE(&r, PS1); /* ps:0 lost */
    CHECK(backup->updates == 0 && backup->primary_rank < 0);
    SERVE(&r, PS1); /* the re-sent push is new here: applied */
    CHECKF(backup->updates == 1, "the backup applied %ld updates; 1 was pushed", backup->updates);
    CHECKF(reply(&r, PS1, got) && memcmp(got, want, sizeof got) == 0,
           "the backup's update differs from the primary's");
    rig_close(&r);
}

/* ------------------------------------------------------------ whole runs */

/* One run; victim: NULL, or the ps task to strike once worker 1 logged step
 * 60: SIGKILL, or with `freeze` SIGSTOP until its backup took over (past the
 * 1 s heartbeat timeout), then SIGCONT. */
static int run_workers(const char *name, const char *strategy, const char *extra,
                       const char *victim, int freeze, int workers)
{
    char args[2048], line[64];
    snprintf(args, sizeof args, "--chief --workers %d --ps 2 -- train --strategy %s " RUN
             " --ps-replicas 2 --heartbeat-timeout 1 --metrics %s/%s.jsonl --save %s/%s.st %s",
             workers, strategy, tmp, name, tmp, name, extra);
    pid_t l = start(name, args);
    if (victim) {
        snprintf(line, sizeof line, "Worker %d, At step 60,", workers - 1);
        pid_t ps = await_task(l, name, line, victim);
        if (ps > 0 && !freeze) {
            kill(ps, SIGKILL);
        } else if (ps > 0) {
            kill(ps, SIGSTOP);
            CHECKF(wait_log(name, "takes the shard over", 60), "%s: no backup took over from "
                   "the frozen %s", name, victim);
            kill(ps, SIGCONT);
        }
    }
    return finish(l, 300);
}

static int run_fault(const char *name, const char *strategy, const char *extra,
                     const char *victim, int freeze)
{
    return run_workers(name, strategy, extra, victim, freeze, 2);
}

static int run(const char *name, const char *strategy, const char *extra, const char *victim)
{
    return run_fault(name, strategy, extra, victim, 0);
}

static double max_diff(const char *a, const char *b)
{
    char na[256], nb[256];
    snprintf(na, sizeof na, "%s.st", a);
    snprintf(nb, sizeof nb, "%s.st", b);
    return checkpoint_max_diff(na, nb);
}

/* A deterministic mode (ps-sync, model-avg) ends with the fault-free run's
 * parameters when `victim` is SIGKILLed: no update lost, none applied twice.
 * The fault-free run is made once per strategy (clean_done: it is already
 * there, from the same arguments). */
static void loses_nothing(const char *strategy, const char *victim, const char *extra,
                          int clean_done)
{
    char clean[128], killed[128], cks[2][160];
    snprintf(clean, sizeof clean, "%s-clean", strategy);
    snprintf(killed, sizeof killed, "%s-kill-%c", strategy, victim[3]);
    snprintf(cks[0], sizeof cks[0], "%s --checkpoint-dir %s/%s.ck", extra, tmp, clean);
    snprintf(cks[1], sizeof cks[1], "%s --checkpoint-dir %s/%s.ck", extra, tmp, killed);
    int rc = clean_done ? 0 : run(clean, strategy, cks[0], NULL);
    CHECKF(rc == 0, "%s with replicas, fault-free, exited %d", strategy, rc);
    rc = run(killed, strategy, cks[1], victim);
    CHECKF(rc == 0, "%s with replicas and %s killed exited %d", strategy, victim, rc);
    double d = max_diff(clean, killed);
    fprintf(stderr, "%s, %s killed at step 60: max |diff| of the final parameters %.3g "
            "(test accuracy %.4f, fault-free %.4f)\n", strategy, victim, d,
            test_accuracy(killed), test_accuracy(clean));
    CHECKF(d < 1e-5, "%s's parameters differ from the fault-free run's by %g", strategy, d);
    char chief_line[64];
    snprintf(chief_line, sizeof chief_line, "fault: chief:0 lost %s", victim);
    CHECKF(log_has(killed, "takes the shard over") && log_has(killed, chief_line) &&
               log_has(killed, "survives a lost ps"),
           "%s: missing fault lines from the backup, the chief or the launcher", strategy);
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.jsonl.chief-0", tmp, killed); /* the chief's own */
    CHECKF(count_events(killed, "fault") >= 2 && for_each_event(path, "fault", NULL, NULL, NULL) == 1,
           "%s: expected fault events from the launcher and one from the chief", strategy);
}

/* A frozen primary is lost to the others past the heartbeat timeout; when it
 * wakes, its connections are gone, and it counts for nothing. */
static void sync_survives_freeze(void)
{
    int rc = run_fault("sync-freeze", "ps-sync", "", "ps:0", 1);
    CHECKF(rc == 0, "ps-sync with replicas and ps:0 frozen exited %d", rc);
    double d = max_diff("ps-sync-clean", "sync-freeze");
    fprintf(stderr, "ps-sync, ps:0 frozen past the heartbeat timeout at step 60: max |diff| of "
            "the final parameters %.3g\n", d);
    CHECKF(d < 1e-5, "ps-sync's parameters differ from the fault-free run's by %g after a freeze",
           d);
}

/* ps-async with one worker is deterministic: a lost ps changes nothing. */
static void async_loses_nothing(void)
{
    int rc = run_workers("async1-clean", "ps-async", "", NULL, 0, 1);
    CHECKF(rc == 0, "ps-async, one worker, fault-free, exited %d", rc);
    rc = run_workers("async1-kill", "ps-async", "", "ps:0", 0, 1);
    CHECKF(rc == 0, "ps-async, one worker, ps:0 killed, exited %d", rc);
    double d = max_diff("async1-clean", "async1-kill");
    fprintf(stderr, "ps-async, one worker, ps:0 killed at step 60: max |diff| of the final "
            "parameters %.3g (test accuracy %.4f, fault-free %.4f)\n", d,
            test_accuracy("async1-kill"), test_accuracy("async1-clean"));
    CHECKF(d < 1e-5, "ps-async's parameters differ from the fault-free run's by %g", d);
}

/* Two workers: the order their pushes interleave in differs from run to run
 * (test accuracy varies by about 0.01 between fault-free runs), so the
 * check that nothing is lost is the update count; the accuracy is a sanity
 * bound. */
static void async_goes_on(void)
{
    int rc = run("async-clean", "ps-async", "", NULL);
    double clean = test_accuracy("async-clean");
    CHECKF(rc == 0 && clean > 0.8, "ps-async with replicas, fault-free: exit %d, accuracy %.4f",
           rc, clean);
    rc = run("async-kill", "ps-async", "", "ps:0");
    double acc = test_accuracy("async-kill");
    fprintf(stderr, "ps-async, ps:0 killed at step 60: test accuracy %.4f, fault-free %.4f\n", acc,
            clean);
    CHECKF(rc == 0, "ps-async with replicas and ps:0 killed exited %d", rc);
    /* No update lost or applied twice: 2 workers x 180 pushes, all on ps:1. */
    CHECKF(log_has("async-kill", "ps:1 holds 360 update(s) of shard 0, which it took over"),
           "ps-async: the shard taken over does not hold every worker's 180 pushes once");
    CHECKF(fabs(acc - clean) <= 0.02, "ps-async: accuracy %.4f with ps:0 lost, %.4f without", acc,
           clean);
}

static void refused_without_tasks(void)
{
    char args[1024];
    snprintf(args, sizeof args, "--chief --workers 1 --ps 1 -- train --strategy ps-async " RUN
             " --ps-replicas 2");
    int rc = finish(start("refused", args), 120);
    CHECKF(rc != 0 && log_has("refused", "--ps-replicas 2 needs at least 2 ps tasks"),
           "--ps-replicas 2 on one ps task: exit %d, no clear refusal", rc);
}

int main(void)
{
    dp_log_set_level(DP_LOG_ERROR);
    forwarding();
    forward_lost();
    dp_log_set_level(DP_LOG_INFO);
    launch_test_init();
    /* the chief's own events are read from its part, kept after the merge */
    setenv(DP_LAUNCH_KEEP_PARTS_ENV, "1", 1);
    refused_without_tasks();
    /* Checkpoints every 25 steps: the chief's state pulls fail over too. */
    loses_nothing("ps-sync", "ps:0", "--checkpoint-every 25", 0);
    if (!SANITIZED) /* shard 1's failover is shard 0's code: memory is checked there */
        loses_nothing("ps-sync", "ps:1", "--checkpoint-every 25", 1);
    sync_survives_freeze();
    loses_nothing("model-avg", "ps:0", "--period 4 --checkpoint-every 25", 0);
    async_loses_nothing();
    async_goes_on();
    return check_failures ? 1 : 0;
}
