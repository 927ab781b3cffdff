/* ps-sync's pushes by host (docs/strategies.md, "ps-sync: one push per
 * host"), on the in-process transport (one host): a chief, 2 workers and 2
 * ps shards, each task a thread, the workers through ps_host.c as a
 * strategy drives them.
 * - by host, the servers end with the bits of the per-worker run: 2
 *   workers' shares summed in either order are the same float sum, and
 *   the leader weights each share as a server would;
 * - the bytes on the wire, frame by frame: per step and shard the leader
 *   sends one PUSH_HOST of 48 + 16 + 4 + 8 + 4n bytes, the member nothing
 *   to any server; inside the host the member's share (48 + 16 + 4 NP)
 *   and the answer (48 + 4 NP);
 * - a member lost after step K: the leader pushes alone from step K+1, and
 *   the servers end with the bits of a per-worker run whose worker 1 was
 *   lost there; a leader lost after step K: the member pushes on its own,
 *   the same bits as per-worker with worker 0 lost; a leader lost after its
 *   push of step K+1 but before it handed the answer on: the member pushes
 *   step K+1 itself and the servers only answer it (its share is not
 *   applied twice): the bits of worker 0 lost after step K+1;
 * - auto: by worker with every ps on the workers' host; by host with the
 *   servers on another (a fake host map) and their link faked slow
 *   (DOWNPOUR_TEST_LINK_NS 1 ms a byte against an in-process echo); the
 *   member takes the leader's choice; the bits are per-worker's either way. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ps_rig.h"
#include "downpour/frame.h"
#include "downpour/inproc.h"
#include "downpour/ps.h"
#include "downpour/wire.h"
#include "strategy/ps_host.h"

#define NP 4096 /* two shards of 2048 */
#define STEPS 10
#define LOST_AT 4

#include "ps_quadratic.h"

static dp_err err;

enum { PER_WORKER, BY_HOST, BY_AUTO };
/* A fault: worker `lose` dies before its step `at` (-1: none); after_push:
 * the leader dies in step `at`, after its push, before the answer goes on. */
typedef struct fault {
    int lose, at, after_push;
} fault;

typedef struct job {
    rig *r;
    int w, how;
    fault f;
    dp_ps_client *c;
    float params[NP];
    int failed;
    int on;        /* auto: what it chose */
    char why[384]; /* and why */
} job;

static void die(job *j)
{
    REQUIRE(dp_inproc_kill(j->r->ts[1 + j->w], DP_INPROC_CRASH, &err) == 0);
}

static int records_of(int w) { return 3 + 2 * w; }

/* The leader's step of the last case, by hand: the member's share in, the
 * host push out and answered, and then it dies before the answer goes on. */
static void push_then_die(job *j, dp_ps_host *h, const float *g, long step)
{
    static float sum[NP];
    static uint8_t share[DP_PUSH_HEAD_SIZE + NP * sizeof(float)];
    REQUIRE(dp_transport_recv_exact(j->r->ts[1], h->rank[1], DP_WIRE_HOST_GRAD, (uint64_t)step,
                                    0, share, sizeof share, "a share", 30, &err) == 0);
    const float *s = (const float *)(share + DP_PUSH_HEAD_SIZE);
    for (int i = 0; i < NP; i++)
        sum[i] = g[i] * (float)records_of(0) + s[i];
    uint8_t members[12];
    dp_put_u32(members, 2);
    dp_put_u32(members + 4, 0);
    dp_put_u32(members + 8, 1);
    REQUIRE(dp_ps_client_push_host(j->c, j->params, sum, records_of(0) + records_of(1), 0.05f,
                                   members, sizeof members, &err) == 0);
    die(j);
}

static void *work(void *arg)
{
    job *j = arg;
    static float gbuf[2][NP];
    float *g = gbuf[j->w];
    dp_ps_host h;
    memcpy(j->params, start_params(), sizeof j->params);
    if (j->how != PER_WORKER &&
        dp_ps_host_open(&h, j->r->ts[1 + j->w], &j->r->c, j->w,
                        j->how == BY_AUTO ? DP_PS_PUSH_AUTO : DP_PS_PUSH_HOST, j->c,
                        &j->r->layout, j->params, NP, 30, &err) < 0) {
        fprintf(stderr, "worker %d: %s\n", j->w, err.msg);
        j->failed = 1;
        return NULL;
    }
    CHECK(j->how != BY_HOST || (h.on && h.n == 2 && h.lead == (j->w == 0)));
    if (j->how == BY_AUTO) {
        j->on = h.on;
        snprintf(j->why, sizeof j->why, "%s", h.why);
    }
    for (long step = 1; step <= STEPS; step++) {
        int mine = j->f.lose == j->w && step == j->f.at;
        if (mine && !j->f.after_push) {
            die(j);
            break;
        }
        grad_at(j->params, (int)step * 2 + j->w, g);
        dp_ps_client_at_step(j->c, step);
        if (mine) {
            push_then_die(j, &h, g, step);
            break;
        }
        int rc = j->how != PER_WORKER && h.on
                     ? dp_ps_host_step(&h, j->c, j->params, g, records_of(j->w), 0.05f, step,
                                       &err)
                     : dp_ps_client_step(j->c, j->params, g, records_of(j->w), 0.05f, &err);
        if (rc < 0) {
            fprintf(stderr, "worker %d step %ld: %s\n", j->w, step, err.msg);
            j->failed = 1;
            break;
        }
    }
    if (j->how != PER_WORKER)
        dp_ps_host_close(&h);
    return NULL;
}

static job workers[2];     /* the last run's */
static const int *host_map; /* NULL: every task on one host */

/* One run: the servers' parameters at the end into out; the bytes ps:k
 * took from each worker (from[k][w]), and the member's bytes from the
 * leader and back (host[0] in, host[1] out, the leader's view). */
static void run(int how, fault f, float *out, uint64_t from[2][2], uint64_t host[2])
{
    rig r;
    int ports[8];
    const char *names[8];
    memset(&r, 0, sizeof r);
    r.n = 5; /* chief, 2 workers, 2 ps */
    r.ps0 = 3;
    for (int i = 0; i < r.n; i++)
        ports[i] = 23000 + i;
    REQUIRE(dp_cluster_local(&r.c, 1, 2, 2, ports, &err) == 0);
    for (int i = 0; i < r.n; i++)
        names[i] = r.c.tasks[i].name;
    REQUIRE(dp_inproc_open_named(r.ts, r.n, names, &err) == 0);
    if (host_map)
        REQUIRE(dp_inproc_set_hosts(r.ts[0], host_map, &err) == 0);
    dp_ps_config_init(&r.cfg);
    r.cfg.mode = DP_PS_SYNC;
    r.cfg.min_shard_bytes = sizeof(float);
    rig_open_servers(&r, start_params(), NP);
    rig_serve(&r);
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_SGD);
    oc.lr = 0.05f;
    job *jobs = workers;
    pthread_t th[2];
    for (int w = 0; w < 2; w++) {
        jobs[w] = (job){.r = &r, .w = w, .how = how, .f = f};
        REQUIRE(dp_ps_client_open(&jobs[w].c, r.ts[1 + w], &r.layout, &r.cfg, &oc, NP, &err) ==
                0);
        REQUIRE(pthread_create(&th[w], NULL, work, &jobs[w]) == 0);
    }
    for (int w = 0; w < 2; w++)
        pthread_join(th[w], NULL);
    for (int w = 0; w < 2; w++)
        CHECKF(!jobs[w].failed, "how %d, worker %d lost at %d: worker %d failed", how, f.lose,
               f.at, w);
    dp_ps_client *chief;
    REQUIRE(dp_ps_client_open(&chief, r.ts[0], &r.layout, &r.cfg, &oc, NP, &err) == 0);
    REQUIRE(dp_ps_client_pull(chief, out, 0, &err) == 0);
    for (int k = 0; k < 2; k++)
        for (int w = 0; w < 2; w++) {
            dp_transport_stats st;
            REQUIRE(dp_transport_stats_get(r.ts[r.ps0 + k], 1 + w, &st) == 0);
            from[k][w] = st.bytes_recv;
        }
    dp_transport_stats st;
    REQUIRE(dp_transport_stats_get(r.ts[1], 2, &st) == 0);
    host[0] = st.bytes_recv;
    host[1] = st.bytes_sent;
    /* the survivors end as workers do: DONE to the servers */
    for (int w = 0; w < 2; w++) {
        dp_err ignore;
        dp_ps_client_say(jobs[w].c, DP_WIRE_DONE, 0, &ignore);
        dp_ps_client_free(jobs[w].c);
    }
    dp_ps_client_free(chief);
    rig_close(&r, 1);
}

static void same(const char *what, const float *a, const float *b)
{
    CHECKF(memcmp(a, b, NP * sizeof(float)) == 0, "%s: not the same bits", what);
}

int main(void)
{
    setenv("DOWNPOUR_TEST_LINK_NS", "1000000", 1); /* auto's servers' link: 1 ms a byte */
    static float worker[NP], host[NP], ref[NP];
    uint64_t from[2][2], inhost[2], wfrom[2][2], whost[2];
    const fault none = {-1, 0, 0};
    run(PER_WORKER, none, worker, wfrom, whost);
    run(BY_HOST, none, host, from, inhost);
    same("by host against per worker", host, worker);
    CHECK(memcmp(host, start_params(), sizeof host) != 0); /* it trained */

    /* Bytes: the in-process transport counts every frame's header and payload. */
    for (int k = 0; k < 2; k++) {
        uint64_t n = NP / 2, push = DP_FRAME_HEADER_SIZE + DP_PUSH_HEAD_SIZE + 4 * n;
        CHECKF(wfrom[k][0] == STEPS * push && wfrom[k][1] == STEPS * push,
               "per worker: ps:%d took %llu and %llu bytes; by hand %llu each", k,
               (unsigned long long)wfrom[k][0], (unsigned long long)wfrom[k][1],
               (unsigned long long)(STEPS * push));
        uint64_t hpush = DP_FRAME_HEADER_SIZE + DP_PUSH_HEAD_SIZE + 4 + 8 + 4 * n;
        CHECKF(from[k][0] == STEPS * hpush && from[k][1] == 0,
               "by host: ps:%d took %llu bytes from the leader (by hand %llu) and %llu from the "
               "member (by hand 0)", k, (unsigned long long)from[k][0],
               (unsigned long long)(STEPS * hpush), (unsigned long long)from[k][1]);
    }
    /* the leader took the member's map row (2 bytes) and its shares, and
     * sent its own row, the choice (no payload) and the answers */
    uint64_t H = DP_FRAME_HEADER_SIZE, share = H + DP_PUSH_HEAD_SIZE + 4 * (uint64_t)NP,
             answer = H + 4 * (uint64_t)NP;
    CHECKF(inhost[0] == H + 2 + STEPS * share && inhost[1] == H + 2 + H + STEPS * answer,
           "in the host: the leader took %llu bytes (by hand %llu) and sent %llu (by hand %llu)",
           (unsigned long long)inhost[0], (unsigned long long)(H + 2 + STEPS * share),
           (unsigned long long)inhost[1], (unsigned long long)(H + 2 + H + STEPS * answer));

    /* auto: on one host (the servers beside the workers) by worker; with
     * the servers on another host and their link faked at 1 ms a byte
     * (DOWNPOUR_TEST_LINK_NS, set in main) by host; the member takes the
     * leader's choice, and the bits are the per-worker run's either way */
    const job *last = workers;
    run(BY_AUTO, none, host, from, inhost);
    same("auto on one host against per worker", host, worker);
    CHECKF(!last[0].on && !last[1].on && strstr(last[0].why, "every ps shard is on this host") &&
               strstr(last[1].why, "leader, worker 0, chose"),
           "auto on one host: the leader chose %d (%s), the member %d (%s)", last[0].on,
           last[0].why, last[1].on, last[1].why);
    static const int two_hosts[5] = {0, 0, 0, 1, 1}; /* chief, workers | ps tasks */
    host_map = two_hosts;
    run(BY_AUTO, none, host, from, inhost);
    same("auto, the servers on another host, against per worker", host, worker);
    CHECKF(last[0].on && last[1].on && strstr(last[0].why, "auto: by host: ps:0 is on another "
                                                           "host; the servers' link 1000000.000"),
           "auto, the servers away: the leader chose %d (%s), the member %d", last[0].on,
           last[0].why, last[1].on);
    CHECKF(from[0][0] > 0 && from[0][1] == 0, "auto by host: the member pushed %llu bytes",
           (unsigned long long)from[0][1]);
    host_map = NULL;

    /* Faults: the bits of the per-worker run that lost the same worker at
     * the same point. */
    static const struct {
        fault by_host, per_worker;
        const char *what;
    } cases[] = {
        {{1, LOST_AT + 1, 0}, {1, LOST_AT + 1, 0}, "a member lost after step 4"},
        {{0, LOST_AT + 1, 0}, {0, LOST_AT + 1, 0}, "the leader lost after step 4"},
        {{0, LOST_AT + 1, 1}, {0, LOST_AT + 2, 0}, "the leader lost after its push of step 5"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run(PER_WORKER, cases[i].per_worker, ref, wfrom, whost);
        run(BY_HOST, cases[i].by_host, host, from, inhost);
        same(cases[i].what, host, ref);
        CHECKF(memcmp(host, worker, sizeof host) != 0, "%s: the loss changed nothing",
               cases[i].what);
    }
    return CHECK_DONE();
}
