/* The parameter server's rules, event by event, on the in-process transport.
 * One thread plays the chief and the workers: it sends raw frames (a push
 * head and the floats) from their endpoints, lets the server handle exactly
 * one event (dp_ps_server_poll with timeout 0), then looks (poll timeout 0)
 * whether a worker has a PARAMS reply, and checks every value exactly.
 * DSSP reads a fake clock the test advances by hand; nothing depends on the
 * wall clock.
 * - ssp: a worker s+1 clocks ahead gets no reply until the slowest pushes,
 *   and gets it at that push; every push is applied at once;
 * - dssp: at or below the lower bound always released; above the upper bound
 *   never, however time passes; between them released iff the slowest
 *   worker's predicted next push is further away than the fast worker's
 *   push interval;
 * - sync: no reply until every live worker pushed; one update with the
 *   records-weighted mean gradient; DONE lets the others go; a worker that
 *   pushes twice in a round is dropped and the round goes on without it;
 * - model averaging: the records-weighted average of the pushed parameters;
 * - async: applied at once, answered only when asked (want = 1);
 * - a lost worker: in ssp the waiting ones go on; in sync the round closes
 *   with the survivors' mean (docs/faults.md);
 * - the chief's STATE_REQ returns params, optimiser slot, moving average and
 *   the update count; a worker that asks is dropped, answered nothing;
 *   PULL, PULL_AVERAGE, SHUTDOWN;
 * - a server restarted into the run: workers the chief names as gone hold
 *   nobody; a worker's JOIN at its step sets its clock and lets the others
 *   go; a push re-sent with the same client clock is not applied twice;
 *   ps-sync rounds go by the pushes' training steps, so workers a round
 *   apart (the old server died answering a round) never wait for each other
 *   forever. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "downpour/inproc.h"
#include "downpour/log.h"
#include "downpour/ps.h"
#include "downpour/wire.h"

#define NP 4 /* parameters, all on the one ps task */
#define MAX_WORKERS 3

static dp_err err;
static const float p_init[NP] = {1, 2, -3, 0.5f};

static double fake_now;
static double fake_clock(void) { return fake_now; }

/* A chief (rank 0), workers (ranks 1..), one ps task (the last rank), an
 * endpoint for each, and the ps task's server. */
typedef struct rig {
    dp_cluster c;
    dp_transport *ts[MAX_WORKERS + 2];
    int n, ps;
    dp_ps_server *s;
} rig;

/* clocks: a server restarted into a running job (dp_ps_start); NULL: a fresh one. */
static void rig_open_at(rig *r, int workers, const dp_ps_config *cfg, const dp_optim_config *oc,
                        const long *clocks)
{
    int ports[MAX_WORKERS + 2];
    const char *names[MAX_WORKERS + 2];
    r->n = workers + 2;
    r->ps = workers + 1;
    for (int i = 0; i < r->n; i++)
        ports[i] = 20000 + i; /* never listened on */
    REQUIRE(dp_cluster_local(&r->c, 1, workers, 1, ports, &err) == 0);
    for (int i = 0; i < r->n; i++)
        names[i] = r->c.tasks[i].name;
    REQUIRE(dp_inproc_open_named(r->ts, r->n, names, &err) == 0);
    dp_ps_layout layout;
    REQUIRE(dp_ps_layout_make(&layout, &r->c, NP, cfg, &err) == 0);
    REQUIRE(layout.n_shards == 1 && layout.rank[0] == r->ps && layout.range[0].lo == 0 &&
            layout.range[0].hi == NP);
    dp_ps_start start = {.params = p_init, .clocks = clocks};
    if (dp_ps_server_open(&r->s, r->ts[r->ps], &r->c, &layout, cfg, oc, &start, NP, &err) < 0) {
        fprintf(stderr, "dp_ps_server_open: %s\n", err.msg);
        exit(1);
    }
}

static void rig_open(rig *r, int workers, const dp_ps_config *cfg, const dp_optim_config *oc)
{
    rig_open_at(r, workers, cfg, oc, NULL);
}

static void rig_close(rig *r)
{
    dp_ps_server_close(r->s);
    for (int i = 0; i < r->n; i++)
        dp_transport_close(r->ts[i]);
    dp_cluster_free(&r->c);
}

static int wrank(int w) { return 1 + w; }

/* Worker w sends a push: the head (records, want, lr) then NP floats.  The
 * optimiser's configured rate is 1, so the rate a push carries is the rate
 * the server applies. */
static void push(rig *r, int w, unsigned type, uint32_t records, uint32_t want, float lr,
                 const float *v)
{
    uint8_t raw[DP_PUSH_HEAD_SIZE];
    dp_push_head h = {records, want, lr, 0};
    dp_push_head_put(raw, &h);
    struct iovec iov[2] = {{raw, sizeof raw}, {(void *)v, NP * sizeof(float)}};
    REQUIRE(dp_transport_sendv(r->ts[wrank(w)], r->ps, type, 0, 0, iov, 2, &err) == 0);
}

/* A push of one record at rate 1 that says the worker's training step. */
static void step_grad(rig *r, int w, uint32_t step, const float *g)
{
    uint8_t raw[DP_PUSH_HEAD_SIZE];
    dp_push_head h = {1, 1, 1.0f, step};
    dp_push_head_put(raw, &h);
    struct iovec iov[2] = {{raw, sizeof raw}, {(void *)g, NP * sizeof(float)}};
    REQUIRE(dp_transport_sendv(r->ts[wrank(w)], r->ps, DP_WIRE_PUSH_GRAD, step, 0, iov, 2, &err) ==
            0);
}

static void grad(rig *r, int w, uint32_t records, uint32_t want, float lr, const float *g)
{
    push(r, w, DP_WIRE_PUSH_GRAD, records, want, lr, g);
}

/* A frame without payload from rank `from` to the ps task. */
static void say(rig *r, int from, unsigned type, uint64_t step)
{
    REQUIRE(dp_transport_send(r->ts[from], r->ps, type, step, 0, NULL, 0, &err) == 0);
}

/* The server handles exactly one event. */
static int serve(rig *r) { return dp_ps_server_poll(r->s, 0, &err); }

static void serve_ok(rig *r, int line)
{
    int rc = serve(r);
    if (rc != 0) {
        fprintf(stderr, "%s:%d: server poll returned %d: %s\n", __FILE__, line, rc, err.msg);
        check_failures++;
    }
}
#define SERVE(r) serve_ok(r, __LINE__)

/* Whether rank `at` has a PARAMS reply waiting; if so reads it into out and
 * its step (the slowest live clock) into *step. */
static int reply_at(rig *r, int at, float *out, uint64_t *step)
{
    dp_event ev;
    REQUIRE(dp_transport_poll(r->ts[at], r->ps, 0, &ev, &err) == 0);
    if (ev.kind == DP_EVENT_TIMEOUT)
        return 0;
    REQUIRE(ev.kind == DP_EVENT_FRAME && ev.header.type == DP_WIRE_PARAMS);
    REQUIRE(ev.header.offset == 0 && ev.header.length == NP * sizeof(float));
    REQUIRE(dp_transport_recv_payload(r->ts[at], r->ps, out, NP * sizeof(float), &err) == 0);
    if (step)
        *step = ev.header.step;
    return 1;
}

static int reply(rig *r, int w, float *out, uint64_t *step)
{
    return reply_at(r, wrank(w), out, step);
}

static int no_reply(rig *r, int w)
{
    float tmp[NP];
    return !reply(r, w, tmp, NULL);
}

static int same(const float *a, const float *b) { return memcmp(a, b, NP * sizeof(float)) == 0; }

static void show(const char *what, const float *got, const float *want)
{
    fprintf(stderr, "  %s: got {%.9g %.9g %.9g %.9g}, want {%.9g %.9g %.9g %.9g}\n", what,
            (double)got[0], (double)got[1], (double)got[2], (double)got[3], (double)want[0],
            (double)want[1], (double)want[2], (double)want[3]);
}

#define CHECK_PARAMS(got, want)                                                              \
    do {                                                                                     \
        CHECK(same(got, want));                                                              \
        if (!same(got, want))                                                                \
            show(#got, got, want);                                                           \
    } while (0)

/* The server's parameters, asked for by the chief (PULL). */
static void pull(rig *r, float *out)
{
    say(r, 0, DP_WIRE_PULL, 0);
    SERVE(r);
    REQUIRE(reply_at(r, 0, out, NULL));
}

static dp_optim_config sgd(void)
{
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_SGD);
    oc.lr = 1;
    return oc;
}

static void sub_scaled(float *p, float lr, const float *g)
{
    for (int i = 0; i < NP; i++)
        p[i] -= lr * g[i];
}

/* Gradients with few significant bits: every sum and mean below is exact. */
static const float g0[NP] = {2, -1, 0.5f, 8};
static const float g1[NP] = {6, 1, 0.25f, -8};
static const float g2[NP] = {-2, 3, 1, 4};

static void test_ssp(void)
{
    dp_ps_config cfg;
    dp_ps_config_init(&cfg);
    cfg.mode = DP_PS_SSP;
    cfg.staleness = 1;
    dp_optim_config oc = sgd();
    rig r;
    rig_open(&r, 3, &cfg, &oc);
    float want[NP], got[NP];
    uint64_t step = 99;
    memcpy(want, p_init, sizeof want);

    /* worker:0 one clock ahead of the slowest (0): answered at once. */
    grad(&r, 0, 1, 1, 0.5f, g0);
    SERVE(&r);
    sub_scaled(want, 0.5f, g0);
    CHECK(reply(&r, 0, got, &step) && step == 0);
    CHECK_PARAMS(got, want);
    CHECK(no_reply(&r, 1) && no_reply(&r, 2));
    /* Two (s+1) ahead: held back, though its gradient is applied at once. */
    grad(&r, 0, 1, 1, 0.5f, g1);
    SERVE(&r);
    sub_scaled(want, 0.5f, g1);
    CHECK(no_reply(&r, 0));
    CHECK(dp_ps_server_pending(r.s, 0) == 1 && dp_ps_server_clock(r.s, 0) == 2);
    pull(&r, got);
    CHECK_PARAMS(got, want);
    CHECK(dp_ps_server_updates(r.s) == 2);
    /* worker:1 catches up to 1; the slowest (worker:2) is still at 0. */
    grad(&r, 1, 1, 1, 0.5f, g2);
    SERVE(&r);
    sub_scaled(want, 0.5f, g2);
    CHECK(reply(&r, 1, got, &step) && step == 0);
    CHECK_PARAMS(got, want);
    CHECK(no_reply(&r, 0));
    /* The slowest pushes: exactly now worker:0 is let go, with clock 1. */
    grad(&r, 2, 1, 1, 0.5f, g0);
    SERVE(&r);
    sub_scaled(want, 0.5f, g0);
    CHECK(reply(&r, 2, got, &step) && step == 1);
    CHECK(reply(&r, 0, got, &step) && step == 1);
    CHECK_PARAMS(got, want);
    CHECK(no_reply(&r, 1));
    CHECK(!dp_ps_server_pending(r.s, 0) && !dp_ps_server_pending(r.s, 1) &&
          !dp_ps_server_pending(r.s, 2));

    /* A lost straggler lets the waiting worker go.  Clocks: 2, 1, 1. */
    grad(&r, 1, 1, 1, 0.5f, g1); /* worker:1 to 2: gap 1, answered */
    SERVE(&r);
    CHECK(reply(&r, 1, got, NULL));
    grad(&r, 0, 1, 1, 0.5f, g1); /* worker:0 to 3: gap 2 over worker:2, held */
    SERVE(&r);
    CHECK(no_reply(&r, 0));
    REQUIRE(dp_inproc_kill(r.ts[wrank(2)], DP_INPROC_CRASH, &err) == 0);
    SERVE(&r); /* the loss: training goes on without worker:2 */
    CHECK(reply(&r, 0, got, &step) && step == 2);
    CHECK(dp_ps_server_clock(r.s, 2) == 1);
    rig_close(&r);
}

/* DSSP with bounds [1, 3]; worker:0 is slow (S), worker:1 fast (F). */
static void dssp_rig(rig *r)
{
    dp_ps_config cfg;
    dp_ps_config_init(&cfg);
    cfg.mode = DP_PS_DSSP;
    cfg.staleness_lo = 1;
    cfg.staleness_hi = 3;
    cfg.now = fake_clock;
    dp_optim_config oc = sgd();
    rig_open(r, 2, &cfg, &oc);
}

/* Worker w pushes at fake time t; returns whether it was answered. */
static int dssp_push(rig *r, int w, double t)
{
    fake_now = t;
    grad(r, w, 1, 1, 0.0f, g0); /* rate 0: only the timing matters here */
    SERVE(r);
    return !no_reply(r, w);
}

/* The common start: S pushes at 0 and 10 (interval 10, next push expected
 * at 20), F at 0 and 1 (interval 1).  Clocks S 2, F 2. */
static void dssp_start(rig *r)
{
    dssp_rig(r);
    CHECK(dssp_push(r, 0, 0));  /* S 1, F 0: gap 1 */
    CHECK(dssp_push(r, 1, 0));  /* F 1 */
    CHECK(dssp_push(r, 1, 1));  /* F 2, gap 1 */
    CHECK(dssp_push(r, 0, 10)); /* S 2 */
}

static void test_dssp(void)
{
    rig r;
    float got[NP];
    uint64_t step = 99;

    /* Between the bounds F runs on while S's next push (t = 20) is further
     * away than F's own interval; above the upper bound it waits, whatever
     * the time, until S pushes. */
    dssp_start(&r);
    CHECK(dssp_push(&r, 1, 12));  /* F 3, gap 1; F's interval 0.8*1 + 0.2*11 = 3.0 */
    CHECK(dssp_push(&r, 1, 13));  /* F 4, gap 2, interval 2.6: S due in 7 > 2.6 */
    CHECK(dssp_push(&r, 1, 14));  /* F 5, gap 3 (= hi), interval 2.28: S due in 6 */
    CHECK(!dssp_push(&r, 1, 15)); /* F 6, gap 4 > hi: held though S is due in 5 */
    CHECK(dp_ps_server_pending(r.s, 1));
    for (double t = 15.5; t < 20; t += 1.5) { /* time passes, nothing arrives */
        fake_now = t;
        SERVE(&r);
        CHECK(no_reply(&r, 1));
    }
    fake_now = 20;
    grad(&r, 0, 1, 1, 0.0f, g0); /* S 3 (next due at 30): F at gap 3 goes */
    SERVE(&r);
    CHECK(reply(&r, 0, got, &step) && step == 3);
    CHECK(reply(&r, 1, got, &step) && step == 3);
    rig_close(&r);

    /* Between the bounds F waits when S's next push is nearer than F's
     * interval; at the lower bound it never waits. */
    dssp_start(&r);
    CHECK(dssp_push(&r, 1, 17));  /* F 3, gap 1: goes though S is due in 3 < interval 4.0 */
    CHECK(!dssp_push(&r, 1, 18)); /* F 4, gap 2, interval 3.4: S due in 2: waits */
    fake_now = 18.5;
    SERVE(&r); /* S due in 1.5: still waits */
    CHECK(no_reply(&r, 1));
    CHECK(dssp_push(&r, 0, 20)); /* S 3 */
    CHECK(reply(&r, 1, got, &step) && step == 3); /* F at gap 1 */
    rig_close(&r);
}

static void test_sync(void)
{
    dp_ps_config cfg;
    dp_ps_config_init(&cfg);
    cfg.mode = DP_PS_SYNC;
    dp_optim_config oc = sgd();
    rig r;
    rig_open(&r, 3, &cfg, &oc);
    float got[NP];
    uint64_t step = 99;

    /* Round 1: records 1, 3, 4.  Mean gradient (g0 + 3 g1 + 4 g2) / 8 =
     * {1.5, 1.75, 0.65625, 0}; at rate 0.5 from {1, 2, -3, 0.5}. */
    const float want1[NP] = {0.25f, 1.125f, -3.328125f, 0.5f};
    grad(&r, 0, 1, 1, 0.5f, g0);
    SERVE(&r);
    CHECK(no_reply(&r, 0));
    grad(&r, 1, 3, 1, 0.5f, g1);
    SERVE(&r);
    CHECK(no_reply(&r, 0) && no_reply(&r, 1));
    CHECK(dp_ps_server_updates(r.s) == 0);
    pull(&r, got); /* nothing applied before the round is complete */
    CHECK_PARAMS(got, p_init);
    grad(&r, 2, 4, 1, 0.5f, g2);
    SERVE(&r);
    CHECK(dp_ps_server_updates(r.s) == 1);
    for (int w = 0; w < 3; w++) {
        CHECK(reply(&r, w, got, &step) && step == 1);
        CHECK_PARAMS(got, want1);
    }

    /* Round 2: worker:0 and worker:1 push 2 records each; worker:2 says
     * DONE, which completes the round: mean (g0 + g1) / 2 =
     * {4, 0, 0.375, 0}, at rate 0.5. */
    const float want2[NP] = {-1.75f, 1.125f, -3.515625f, 0.5f};
    grad(&r, 0, 2, 1, 0.5f, g0);
    SERVE(&r);
    grad(&r, 1, 2, 1, 0.5f, g1);
    SERVE(&r);
    CHECK(no_reply(&r, 0) && no_reply(&r, 1));
    say(&r, wrank(2), DP_WIRE_DONE, 0);
    SERVE(&r);
    CHECK(dp_ps_server_updates(r.s) == 2);
    for (int w = 0; w < 2; w++) {
        CHECK(reply(&r, w, got, &step) && step == 2);
        CHECK_PARAMS(got, want2);
    }
    CHECK(no_reply(&r, 2));

    /* Round 3: empty batches (records 0) complete a round without an update. */
    grad(&r, 0, 0, 1, 0.5f, g0);
    SERVE(&r);
    grad(&r, 1, 0, 1, 0.5f, g1);
    SERVE(&r);
    CHECK(dp_ps_server_updates(r.s) == 2);
    CHECK(reply(&r, 0, got, NULL) && reply(&r, 1, got, NULL));
    CHECK_PARAMS(got, want2);

    /* A worker that pushes twice in one round is dropped, not the server:
     * the round closes when the other worker pushes, and only it is answered. */
    grad(&r, 0, 1, 1, 0.5f, g0);
    SERVE(&r);
    grad(&r, 0, 1, 1, 0.5f, g0);
    SERVE(&r);
    CHECK(no_reply(&r, 0) && no_reply(&r, 1));
    grad(&r, 1, 1, 1, 0.5f, g1);
    SERVE(&r);
    CHECK(reply(&r, 1, got, NULL));
    CHECK(no_reply(&r, 0));
    rig_close(&r);

    /* A worker lost in the middle of a round: the round closes with the
     * survivors, its mean weighted by the records they really pushed. */
    rig_open(&r, 3, &cfg, &oc);
    grad(&r, 0, 1, 1, 0.5f, g0);
    SERVE(&r);
    REQUIRE(dp_inproc_kill(r.ts[wrank(1)], DP_INPROC_CRASH, &err) == 0);
    SERVE(&r);
    CHECK(no_reply(&r, 0));
    grad(&r, 2, 3, 1, 0.5f, g2);
    SERVE(&r);
    float mean[NP], want3[NP];
    for (int i = 0; i < NP; i++)
        mean[i] = (g0[i] * 1.0f + g2[i] * 3.0f) * (float)(1.0 / 4.0);
    memcpy(want3, p_init, sizeof want3);
    sub_scaled(want3, 0.5f, mean);
    CHECK(reply(&r, 0, got, NULL));
    CHECK_PARAMS(got, want3);
    CHECK(reply(&r, 2, got, NULL));
    CHECK_PARAMS(got, want3);
    rig_close(&r);
}

/* Two workers averaging (model-avg), plain SGD. */
static const float p0[NP] = {1, 2, 3, 4}, p1[NP] = {5, -2, 3, 0};

static void avg_rig(rig *r)
{
    dp_ps_config cfg;
    dp_ps_config_init(&cfg);
    cfg.mode = DP_PS_AVG;
    dp_optim_config oc = sgd();
    rig_open(r, 2, &cfg, &oc);
}

static void test_avg(void)
{
    rig r;
    avg_rig(&r);
    const float want[NP] = {4, -1, 3, 1}; /* (p0 + 3 p1) / 4 */
    float got[NP];
    uint64_t step = 99;
    push(&r, 0, DP_WIRE_PUSH_PARAMS, 1, 1, 1.0f, p0);
    SERVE(&r);
    CHECK(no_reply(&r, 0));
    push(&r, 1, DP_WIRE_PUSH_PARAMS, 3, 1, 1.0f, p1);
    SERVE(&r);
    for (int w = 0; w < 2; w++) {
        CHECK(reply(&r, w, got, &step) && step == 1);
        CHECK_PARAMS(got, want);
    }
    /* Gradients have no place in an averaging run: their sender is dropped,
     * and what it sends later counts for nothing. */
    grad(&r, 0, 1, 1, 1.0f, g0);
    SERVE(&r);
    push(&r, 0, DP_WIRE_PUSH_PARAMS, 1, 1, 1.0f, p0);
    SERVE(&r);
    CHECK(no_reply(&r, 0));
    /* The round of the one worker left closes at its own push. */
    push(&r, 1, DP_WIRE_PUSH_PARAMS, 3, 1, 1.0f, p1);
    SERVE(&r);
    CHECK(reply(&r, 1, got, NULL));
    CHECK_PARAMS(got, p1);
    rig_close(&r);
}

/* Worker w's n-th average (the frame's step, as a client counts its
 * pushes), saying its training step (model-avg's clock). */
static void avg_at(rig *r, int w, uint64_t n, uint32_t step, uint32_t records, const float *v)
{
    uint8_t raw[DP_PUSH_HEAD_SIZE];
    dp_push_head h = {records, 1, 1.0f, step};
    dp_push_head_put(raw, &h);
    struct iovec iov[2] = {{raw, sizeof raw}, {(void *)v, NP * sizeof(float)}};
    REQUIRE(dp_transport_sendv(r->ts[wrank(w)], r->ps, DP_WIRE_PUSH_PARAMS, n, 0, iov, 2,
                               &err) == 0);
    SERVE(r);
}

/* model-avg clocks a worker by the step it averaged at, not by a count of
 * its averages (those come every --period steps and before checkpoints):
 * one behind (a restarted worker, back at an earlier step) pairs its next
 * average with the other's round, then averages alone until it catches
 * up, and never waits on the one ahead (which, counted, it did: a hang at
 * the next checkpoint barrier, docs/faults.md "Rejoining"). */
static void test_avg_steps(void)
{
    rig r;
    avg_rig(&r);
    const float want[NP] = {3, 0, 3, 2}; /* (p0 + p1) / 2 */
    float got[NP];
    avg_at(&r, 0, 1, 8, 1, p0);
    avg_at(&r, 1, 1, 8, 1, p1);
    CHECK(dp_ps_server_clock(r.s, 0) == 8 && dp_ps_server_clock(r.s, 1) == 8);
    CHECK(reply(&r, 0, got, NULL) && reply(&r, 1, got, NULL));
    CHECK_PARAMS(got, want);
    /* worker 0 is at step 200 (a barrier's flush), worker 1 back at 158 */
    avg_at(&r, 0, 2, 200, 1, p0);
    CHECK(no_reply(&r, 0)); /* worker 1 (clock 8) is due */
    avg_at(&r, 1, 2, 158, 1, p1);
    CHECK(dp_ps_server_clock(r.s, 0) == 200 && dp_ps_server_clock(r.s, 1) == 158);
    CHECK(reply(&r, 0, got, NULL) && reply(&r, 1, got, NULL));
    CHECK_PARAMS(got, want);
    /* behind, it averages alone: worker 0 (clock 200) is not due at 166 */
    avg_at(&r, 1, 3, 166, 1, p1);
    CHECK(reply(&r, 1, got, NULL));
    CHECK_PARAMS(got, p1);
    rig_close(&r);
}

static void test_async(void)
{
    dp_ps_config cfg;
    dp_ps_config_init(&cfg);
    cfg.mode = DP_PS_ASYNC;
    dp_optim_config oc = sgd();
    rig r;
    rig_open(&r, 2, &cfg, &oc);
    float want[NP], got[NP];
    uint64_t step = 99;
    memcpy(want, p_init, sizeof want);
    grad(&r, 0, 1, 0, 0.5f, g0); /* applied, not answered */
    SERVE(&r);
    sub_scaled(want, 0.5f, g0);
    CHECK(no_reply(&r, 0) && dp_ps_server_updates(r.s) == 1);
    grad(&r, 1, 5, 1, 0.25f, g1); /* answered; records do not weigh a lone push */
    SERVE(&r);
    sub_scaled(want, 0.25f, g1);
    CHECK(reply(&r, 1, got, &step) && step == 1);
    CHECK_PARAMS(got, want);
    CHECK(no_reply(&r, 0));
    grad(&r, 0, 0, 1, 0.5f, g2); /* no records: nothing applied, still answered */
    SERVE(&r);
    CHECK(reply(&r, 0, got, &step) && step == 1);
    CHECK_PARAMS(got, want);
    CHECK(dp_ps_server_updates(r.s) == 2 && dp_ps_server_clock(r.s, 0) == 2);
    /* A lost worker costs nothing in async. */
    REQUIRE(dp_inproc_kill(r.ts[wrank(1)], DP_INPROC_CUT, &err) == 0);
    SERVE(&r);
    grad(&r, 0, 1, 1, 0.5f, g2);
    SERVE(&r);
    sub_scaled(want, 0.5f, g2);
    CHECK(reply(&r, 0, got, &step) && step == 3); /* the slowest live clock is its own */
    CHECK_PARAMS(got, want);
    /* The chief ends the run. */
    say(&r, 0, DP_WIRE_SHUTDOWN, 0);
    CHECK(serve(&r) == 1);
    rig_close(&r);
}

static void test_state(void)
{
    dp_ps_config cfg;
    dp_ps_config_init(&cfg);
    cfg.mode = DP_PS_ASYNC;
    cfg.ema = 0.5f;
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_MOMENTUM);
    oc.lr = 1;
    oc.momentum = 0.5f;
    rig r;
    rig_open(&r, 2, &cfg, &oc);
    /* One push of g0 at rate 0.5: v = -0.5 g0, p = p_init + v, and the
     * moving average 0.5 p_init + 0.5 p. */
    const float v[NP] = {-1, 0.5f, -0.25f, -4};
    const float p[NP] = {0, 2.5f, -3.25f, -3.5f};
    const float ema[NP] = {0.5f, 2.25f, -3.125f, -1.5f};
    grad(&r, 0, 1, 0, 0.5f, g0);
    SERVE(&r);
    say(&r, 0, DP_WIRE_STATE_REQ, 42);
    SERVE(&r);
    dp_event ev;
    REQUIRE(dp_transport_poll(r.ts[0], r.ps, 0, &ev, &err) == 0);
    REQUIRE(ev.kind == DP_EVENT_FRAME && ev.header.type == DP_WIRE_STATE);
    CHECK(ev.header.step == 42 && ev.header.offset == 0);
    REQUIRE(ev.header.length == 16 + 3 * NP * sizeof(float));
    uint8_t head[16];
    float got[3][NP];
    REQUIRE(dp_transport_recv_payload(r.ts[0], r.ps, head, sizeof head, &err) == 0);
    REQUIRE(dp_transport_recv_payload(r.ts[0], r.ps, got, sizeof got, &err) == 0);
    CHECK(dp_get_u64(head) == 1 && dp_get_u64(head + 8) == 1); /* optimiser t, updates */
    CHECK_PARAMS(got[0], p);
    CHECK_PARAMS(got[1], v);
    CHECK_PARAMS(got[2], ema);
    /* PULL_AVERAGE hands out the moving average, PULL the parameters. */
    say(&r, 0, DP_WIRE_PULL_AVERAGE, 0);
    SERVE(&r);
    CHECK(reply_at(&r, 0, got[0], NULL));
    CHECK_PARAMS(got[0], ema);
    pull(&r, got[0]);
    CHECK_PARAMS(got[0], p);
    /* A worker may not ask: it is dropped and sent nothing. */
    say(&r, wrank(1), DP_WIRE_STATE_REQ, 43);
    SERVE(&r);
    CHECK(no_reply(&r, 1));
    rig_close(&r);
}

/* A server restarted into the run (docs/faults.md, "A restarted ps"): the
 * chief said worker 2 takes no part and the others were at clock 10.
 * Worker 0 says it is at step 15 (clock 14) and pushes: answered at once in
 * ps-ssp with staleness 1, since worker 1, which has not said where it is
 * (it may wait at a checkpoint barrier), holds nobody.  Worker 1 JOINs at
 * step 15 (clock 14): worker 0's next push (clock 16) is held until worker
 * 1's push lets it go; worker 2 never holds anyone.  The same push again
 * (its client clock: a re-send) is answered, not applied twice. */
static void test_restarted(void)
{
    dp_ps_config cfg;
    dp_ps_config_init(&cfg);
    cfg.mode = DP_PS_SSP;
    cfg.staleness = 1;
    dp_optim_config oc = sgd();
    const long clocks[3] = {10, 10, -1};
    rig r;
    rig_open_at(&r, 3, &cfg, &oc, clocks);
    CHECK(dp_ps_server_clock(r.s, 0) == 10 && dp_ps_server_clock(r.s, 1) == 10 &&
          dp_ps_server_clock(r.s, 2) == 0);
    say(&r, wrank(0), DP_WIRE_JOIN, 15);
    SERVE(&r);
    CHECK(dp_ps_server_clock(r.s, 0) == 14);
    uint8_t raw[DP_PUSH_HEAD_SIZE];
    dp_push_head h = {1, 1, 1.0f, 0};
    dp_push_head_put(raw, &h);
    struct iovec iov[2] = {{raw, sizeof raw}, {(void *)g0, NP * sizeof(float)}};
    REQUIRE(dp_transport_sendv(r.ts[wrank(0)], r.ps, DP_WIRE_PUSH_GRAD, 7, 0, iov, 2, &err) == 0);
    SERVE(&r);
    float want[NP], got[NP];
    memcpy(want, p_init, sizeof want);
    sub_scaled(want, 1, g0);
    uint64_t step = 0;
    CHECK(dp_ps_server_clock(r.s, 0) == 15 && reply(&r, 0, got, &step) && step == 15);
    CHECK_PARAMS(got, want);
    /* The same push re-sent (client clock 7): answered, not applied again. */
    REQUIRE(dp_transport_sendv(r.ts[wrank(0)], r.ps, DP_WIRE_PUSH_GRAD, 7, 0, iov, 2, &err) == 0);
    SERVE(&r);
    CHECK(reply(&r, 0, got, NULL) && dp_ps_server_updates(r.s) == 1);
    CHECK_PARAMS(got, want);
    /* Worker 1 says where it is: now it holds worker 0 back. */
    say(&r, wrank(1), DP_WIRE_JOIN, 15);
    SERVE(&r);
    CHECK(dp_ps_server_clock(r.s, 1) == 14);
    REQUIRE(dp_transport_sendv(r.ts[wrank(0)], r.ps, DP_WIRE_PUSH_GRAD, 8, 0, iov, 2, &err) == 0);
    SERVE(&r);
    CHECK(dp_ps_server_clock(r.s, 0) == 16 && dp_ps_server_pending(r.s, 0) && no_reply(&r, 0));
    grad(&r, 1, 1, 1, 1.0f, g1);
    SERVE(&r);
    CHECK(dp_ps_server_clock(r.s, 1) == 15 && reply(&r, 1, got, NULL) &&
          reply(&r, 0, got, &step) && step == 15);
    rig_close(&r);

    /* ps-sync: a round closes with the workers the chief named, once each
     * has said where it is. */
    cfg.mode = DP_PS_SYNC;
    rig_open_at(&r, 3, &cfg, &oc, clocks);
    say(&r, wrank(0), DP_WIRE_JOIN, 40);
    say(&r, wrank(1), DP_WIRE_JOIN, 40);
    SERVE(&r);
    SERVE(&r);
    step_grad(&r, 0, 40, g0);
    SERVE(&r);
    CHECK(no_reply(&r, 0));
    step_grad(&r, 1, 40, g1);
    SERVE(&r);
    CHECK(reply(&r, 0, got, NULL) && reply(&r, 1, got, NULL) && dp_ps_server_updates(r.s) == 1);
    rig_close(&r);

    /* The old server died answering round 40: worker 0 got the answer and
     * waits at a checkpoint barrier (it never says where it is), worker 1
     * did not and pushes step 40 again: the round closes without worker 0. */
    rig_open_at(&r, 3, &cfg, &oc, clocks);
    say(&r, wrank(1), DP_WIRE_JOIN, 40);
    SERVE(&r);
    step_grad(&r, 1, 40, g1);
    SERVE(&r);
    CHECK(reply(&r, 1, got, NULL) && dp_ps_server_updates(r.s) == 1);
    rig_close(&r);

    /* Both say where they are: worker 1's push of step 40 is a round of
     * its own (worker 0 is past it); their pushes of step 41 make one. */
    rig_open_at(&r, 3, &cfg, &oc, clocks);
    say(&r, wrank(0), DP_WIRE_JOIN, 41);
    say(&r, wrank(1), DP_WIRE_JOIN, 40);
    SERVE(&r);
    SERVE(&r);
    step_grad(&r, 1, 40, g1);
    SERVE(&r);
    memcpy(want, p_init, sizeof want);
    sub_scaled(want, 1, g1);
    CHECK(reply(&r, 1, got, NULL) && dp_ps_server_updates(r.s) == 1);
    CHECK_PARAMS(got, want);
    step_grad(&r, 0, 41, g0);
    SERVE(&r);
    CHECK(no_reply(&r, 0));
    step_grad(&r, 1, 41, g0);
    SERVE(&r);
    sub_scaled(want, 1, g0); /* the mean of two pushes of g0 */
    CHECK(reply(&r, 0, got, NULL) && reply(&r, 1, got, NULL) && dp_ps_server_updates(r.s) == 2);
    CHECK_PARAMS(got, want);
    rig_close(&r);

    /* Worker 0 pushes step 41 before worker 1 says anything: a round of its
     * own.  Once worker 1 said it is at step 40, worker 0's step 42 waits
     * for it; worker 1's step 40 is taken alone, 41 too (the open round is
     * 42's), and its 42 closes the round. */
    rig_open_at(&r, 3, &cfg, &oc, clocks);
    say(&r, wrank(0), DP_WIRE_JOIN, 41);
    SERVE(&r);
    step_grad(&r, 0, 41, g0);
    SERVE(&r);
    CHECK(reply(&r, 0, got, NULL) && dp_ps_server_updates(r.s) == 1);
    say(&r, wrank(1), DP_WIRE_JOIN, 40);
    SERVE(&r);
    step_grad(&r, 0, 42, g0);
    SERVE(&r);
    CHECK(no_reply(&r, 0));
    step_grad(&r, 1, 40, g1);
    SERVE(&r);
    CHECK(no_reply(&r, 0) && reply(&r, 1, got, NULL) && dp_ps_server_updates(r.s) == 2);
    step_grad(&r, 1, 41, g1);
    SERVE(&r);
    CHECK(no_reply(&r, 0) && reply(&r, 1, got, NULL) && dp_ps_server_updates(r.s) == 3);
    step_grad(&r, 1, 42, g1);
    SERVE(&r);
    CHECK(reply(&r, 0, got, NULL) && reply(&r, 1, got, NULL) && dp_ps_server_updates(r.s) == 4);
    rig_close(&r);
}

int main(void)
{
    dp_log_set_level(DP_LOG_ERROR); /* losses are logged as warnings on purpose */
    test_ssp();
    test_dssp();
    test_sync();
    test_avg();
    test_avg_steps();
    test_async();
    test_state();
    test_restarted();
    return CHECK_DONE();
}
