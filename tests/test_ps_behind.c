/* Push-behind in ps-async (--push-behind N): one worker's client against two
 * ps shards on the in-process transport, each shard served by a thread of
 * its own.  The gradient is a function of the parameters the worker sees, so
 * a local replay tells exactly which parameters each step computed on:
 * - the worker never waits for an answer while fewer than N pushes are
 *   unanswered: with the servers held, N steps return, and their parameters
 *   stay as they were (nothing is written into a step's parameters);
 * - each gradient is computed on the parameters after every push but the
 *   newest N, bit for bit: never older than N pushes;
 * - every push is applied exactly once and finishing (flush) takes every
 *   answer: the final parameters, and the servers' update counts, are those
 *   of the replay, which applies each gradient once, in order;
 * - N = 0 is the synchronous client as it was: each gradient on the
 *   parameters of every push before it, the run one process would make;
 *   and N = 1 is not (the check can fail).
 * Each N >= 1 runs twice: the pushes sent by the client's send thread (the
 * default), and by the worker itself (--push-inline). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "downpour/inproc.h"
#include "downpour/log.h"
#include "downpour/ps.h"
#include "downpour/wire.h"

#define NP 40 /* parameters: two shards of 20 (vector body and tail) */
#define STEPS (SANITIZED ? 24 : 60)
#define LR 0.01f

static dp_err err;

/* The servers wait at the gate until the test opens it. */
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static int gate_open;

typedef struct server_thread {
    dp_ps_server *s;
    pthread_t thr;
    int rc;
    dp_err err;
} server_thread;

static void *serve_main(void *arg)
{
    server_thread *st = arg;
    pthread_mutex_lock(&gate_mu);
    while (!gate_open)
        pthread_cond_wait(&gate_cv, &gate_mu);
    pthread_mutex_unlock(&gate_mu);
    while ((st->rc = dp_ps_server_poll(st->s, 1.0, &st->err)) == 0)
        ;
    return NULL;
}

static void open_gate(void)
{
    pthread_mutex_lock(&gate_mu);
    gate_open = 1;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

/* The gradient a worker computes at step k on parameters p (a function of
 * both, so the replay can tell which parameters it was). */
static void gradient(float *g, const float *p, int k)
{
    for (int i = 0; i < NP; i++)
        g[i] = 0.5f * p[i] - 0.25f * (float)((i * 7 + k) % 11) + 0.01f * (float)k;
}

/* What the servers do, replayed in order: each shard's Adam over its own
 * buffer (as a server holds it), every gradient applied once.  hist[j] is
 * the full vector after j pushes. */
typedef struct replay {
    dp_ps_layout layout;
    dp_optim o[2];
    float *p[2], *g[2];
    float hist[STEPS + 1][NP];
} replay;

static void replay_run(replay *r, const float *p0, int behind, const dp_optim_config *oc)
{
    memcpy(r->hist[0], p0, sizeof r->hist[0]);
    for (int s = 0; s < 2; s++) {
        size_t lo = r->layout.range[s].lo, n = r->layout.range[s].hi - lo;
        REQUIRE(dp_optim_init(&r->o[s], oc, n, &err) == 0);
        r->p[s] = malloc(n * sizeof(float));
        r->g[s] = malloc(n * sizeof(float));
        REQUIRE(r->p[s] && r->g[s]);
        memcpy(r->p[s], p0 + lo, n * sizeof(float));
    }
    float g[NP];
    for (int k = 1; k <= STEPS; k++) {
        int seen = k - 1 - behind > 0 ? k - 1 - behind : 0;
        gradient(g, r->hist[seen], k);
        for (int s = 0; s < 2; s++) {
            size_t lo = r->layout.range[s].lo, n = r->layout.range[s].hi - lo;
            memcpy(r->g[s], g + lo, n * sizeof(float));
            dp_optim_apply(&r->o[s], r->p[s], r->g[s], LR);
            memcpy(r->hist[k] + lo, r->p[s], n * sizeof(float));
        }
    }
    for (int s = 0; s < 2; s++) {
        dp_optim_free(&r->o[s]);
        free(r->p[s]);
        free(r->g[s]);
    }
}

/* A run with push-behind `behind`, sent inline or by the send thread: the
 * worker's final parameters in out. */
static void run(int behind, int push_inline, float *out)
{
    enum { CHIEF = 0, WORKER = 1, N_RANKS = 4 };
    dp_cluster c;
    int ports[N_RANKS] = {20000, 20001, 20002, 20003}; /* never listened on */
    REQUIRE(dp_cluster_local(&c, 1, 1, 2, ports, &err) == 0);
    REQUIRE(dp_cluster_rank(&c, DP_ROLE_WORKER, 0) == WORKER);
    const char *names[N_RANKS];
    for (int i = 0; i < N_RANKS; i++)
        names[i] = c.tasks[i].name;
    dp_transport *ts[N_RANKS];
    REQUIRE(dp_inproc_open_named(ts, N_RANKS, names, &err) == 0);

    dp_ps_config pc;
    dp_ps_config_init(&pc);
    pc.mode = DP_PS_ASYNC;
    pc.push_behind = behind;
    pc.push_inline = push_inline;
    pc.min_shard_bytes = NP * sizeof(float) / 2;
    static replay r;
    REQUIRE(dp_ps_layout_make(&r.layout, &c, NP, &pc, &err) == 0);
    REQUIRE(r.layout.n_shards == 2);
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_ADAM);
    float p0[NP];
    for (int i = 0; i < NP; i++)
        p0[i] = 0.1f * (float)(i % 9) - 0.3f;
    dp_ps_start start = {.params = p0};
    server_thread st[2];
    gate_open = 0;
    for (int s = 0; s < 2; s++) {
        int rank = r.layout.rank[s];
        REQUIRE(dp_ps_server_open(&st[s].s, ts[rank], &c, &r.layout, &pc, &oc, &start, NP,
                                  &err) == 0);
        REQUIRE(pthread_create(&st[s].thr, NULL, serve_main, &st[s]) == 0);
    }
    dp_ps_client *cl;
    REQUIRE(dp_ps_client_open(&cl, ts[WORKER], &r.layout, &pc, &oc, NP, &err) == 0);
    CHECK(dp_ps_client_push_behind(cl) == behind);
    CHECK(dp_ps_client_send_thread(cl) == (behind > 0 && !push_inline));
    replay_run(&r, p0, behind, &oc);

    float params[NP], g[NP];
    memcpy(params, p0, sizeof params);
    int stale_max = -1;
    for (int k = 1; k <= STEPS; k++) {
        /* With the servers held, the first N steps must not wait. */
        if (k == behind + 1)
            open_gate();
        int seen = k - 1 - behind > 0 ? k - 1 - behind : 0;
        CHECKF(memcmp(params, r.hist[seen], sizeof params) == 0,
               "push-behind %d: step %d computed on parameters other than those after push %d",
               behind, k, seen);
        stale_max = k - 1 - seen > stale_max ? k - 1 - seen : stale_max;
        gradient(g, params, k);
        dp_ps_client_at_step(cl, k);
        REQUIRE(dp_ps_client_step(cl, params, g, 1 + k % 3, LR, &err) == 0);
        int fly = dp_ps_client_in_flight(cl);
        CHECKF(fly == (k < behind ? k : behind), "push-behind %d: %d unanswered after step %d",
               behind, fly, k);
        if (k <= behind)
            CHECKF(memcmp(params, p0, sizeof params) == 0,
                   "push-behind %d: the parameters changed at step %d with the servers held",
                   behind, k);
    }
    CHECK(stale_max == behind);
    /* Finishing takes every answer: nothing in flight, every push applied. */
    REQUIRE(dp_ps_client_flush(cl, params, &err) == 0);
    CHECK(dp_ps_client_in_flight(cl) == 0);
    CHECKF(memcmp(params, r.hist[STEPS], sizeof params) == 0,
           "push-behind %d: the final parameters are not those of every push applied once",
           behind);
    REQUIRE(dp_ps_client_say(cl, DP_WIRE_DONE, STEPS, &err) == 0);
    for (int s = 0; s < 2; s++)
        REQUIRE(dp_transport_send(ts[CHIEF], r.layout.rank[s], DP_WIRE_SHUTDOWN, 0, 0, NULL, 0,
                                  &err) == 0);
    for (int s = 0; s < 2; s++) {
        pthread_join(st[s].thr, NULL);
        CHECKF(st[s].rc == 1, "shard %d's server ended with %d: %s", s, st[s].rc, st[s].err.msg);
        CHECKF(dp_ps_server_updates(st[s].s) == STEPS, "shard %d applied %ld updates of %d", s,
               dp_ps_server_updates(st[s].s), STEPS);
        CHECK(dp_ps_server_clock(st[s].s, 0) == STEPS);
        dp_ps_server_close(st[s].s);
    }
    memcpy(out, params, sizeof params);
    dp_ps_client_free(cl);
    for (int i = 0; i < N_RANKS; i++)
        dp_transport_close(ts[i]);
    dp_cluster_free(&c);
}

int main(void)
{
    dp_log_set_level(DP_LOG_WARN);
    alarm(120); /* a worker that waits where it must not hangs: fail, do not hang */
    float p[4][NP], q[NP];
    for (int n = 0; n <= 3; n++) {
        run(n, 0, p[n]);
        if (n > 0) {
            run(n, 1, q);
            CHECK(memcmp(p[n], q, sizeof q) == 0);
        }
    }
    /* The replay is a real check: computing on older parameters ends elsewhere. */
    CHECK(memcmp(p[0], p[1], sizeof p[0]) != 0);
    return check_failures ? 1 : 0;
}
