/* allreduce: mirrored replicas (TensorFlow's MultiWorkerMirroredStrategy,
 * Horovod).  Every replica holds every parameter and the optimiser state;
 * after each backprop the gradients are summed around a ring (in buckets,
 * overlapped with backprop where that measures faster: reducer.h), so every
 * replica applies the same update and the replicas stay bitwise identical.
 * One replica leads (replica 0, the chief when there is one, at the start):
 * it evaluates, reports and checkpoints, and says who is in the ring.
 *
 * A lost replica never ends the run (docs/faults.md, "All-reduce"): whoever
 * sees the loss says RESET to the others, the survivors agree on the leader
 * (the one that led, or the lowest survivor if it was lost: it takes over
 * evaluating and writing), the leader gathers the last step each survivor
 * applied, the newest survivor hands its state to those one step behind,
 * and the ring re-forms over the survivors; a step nobody applied is
 * retried.  A replica restarted into the running ring says HELLO, and the
 * leader takes it back at the next epoch's start with the newest state, as
 * an ordinary replica.  The fault-free path pays nothing for this but one
 * handshake at open and one per epoch, and a silent evaluation of each
 * epoch on every replica (so any of them holds the evaluator's history).
 *
 * When every replica is on a device with collectives (NCCL), the gradients
 * are summed there and the parameters and optimiser state never leave the
 * devices inside a step (docs/gpu.md, "Strategies"); the ring over the
 * transport still carries the control frames, and a communicator is made
 * anew whenever the ring re-forms, since NCCL's cannot lose a rank. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "downpour/blas.h"
#include "downpour/clip.h"
#include "downpour/clock.h"
#include "downpour/crc32c.h"
#include "downpour/env.h"
#include "downpour/log.h"
#include "downpour/powersgd.h"
#include "allreduce_auto.h"
#include "downpour/reducer.h"
#include "downpour/ring.h"
#include "downpour/strategy.h"
#include "downpour/testhooks.h"
#include "downpour/wire.h"
#include "strategy/allreduce_options.h"
#include "strategy/allreduce_sparse.h"

/* every sparse table of a model can be left to the all-gather */
_Static_assert(DP_REDUCER_MAX_SKIP >= DP_SPARSE_MAX, "the reducer skips fewer ranges than tables");

struct dp_strategy {
    const dp_run_env *env;
    dp_model *m;
    dp_replica *r;         /* the model and optimiser, on the host or a device */
    dp_optim *opt;         /* the replica's host optimiser: live with host state */
    dp_ring ring;
    int ring_open;
    dp_reducer *reducer;
    dp_transport *t;
    int n, position;       /* replicas at the start, and this one's position */
    int *ranks;            /* transport rank of each position */
    unsigned char *live;   /* per position: in the ring */
    uint64_t *rgen;        /* per position: the newest generation of its RESETs read */
    unsigned char *back;   /* per position: restarted, said HELLO, waits (the leader
                              welcomes it; the others note it, should they lead) */
    int leader;            /* the position that leads: evaluates, writes, and says
                              who is in the ring (docs/faults.md, "All-reduce") */
    dp_task_info *info;    /* the loop's: evaluator set when this replica takes the lead */
    int in_end;            /* in epoch_end, waiting on the leader's plan */
    int lead_left;         /* the last leader lost said BYE (drained): no fault */
    uint64_t *inc;         /* per position: the incarnation it had when lost */
    unsigned char *silent; /* per position: lost by this side's timeout (it went
                              silent), not by its closing the connection */
    unsigned char *told;   /* the leader, per position: told it is out (dropped) */
    int dropped;           /* the ring's leader said this replica is out */
    unsigned char *rend;   /* per position, its last REPORT: it waits in epoch_end */
    long *rcur;            /* and the step it was in */
    unsigned char *fresh;  /* per position: a spare slot that has not joined yet
                              (--spare-workers; docs/cluster.md, "Spare slots") */
    int n_live;
    dp_shard_policy policy;
    uint32_t *sizes;       /* per position: its shard's records this epoch */
    int batch;             /* records a step this epoch (the loop's, redeal) */
    int dealt;             /* live replicas when this epoch's shards were dealt */
    long applied;          /* the newest step whose update this replica applied */
    long cur;              /* the step in progress */
    uint64_t gen;          /* ring generation: one more per re-forming */
    int broken;            /* the step's reduction returned DP_RING_BROKEN */
    double (*stats)[3];    /* the leader: epoch figures per position */
    unsigned char *have;   /* the leader: stats[position] arrived */
    long *joined;          /* the leader, per position: the step after which it
                              rejoined (welcome), -1 if it never left */
    int algo;              /* --allreduce-algo (ring.h), set on every (re)built ring */
    dp_compress compress;  /* --compress, likewise */
    dp_powersgd *psgd;     /* --compress powersgd: it sums the gradient, not the reducer */
    long psgd_sums;        /* all-reduces of its factors since the ring formed */
    dp_psgd_plan psgd_plan;
    int auto_compress;     /* --compress auto: autoc says what it took (allreduce_auto.h) */
    dp_auto_compress autoc;
    int no_nccl;           /* --no-nccl or DOWNPOUR_NCCL=0: host staging, asked for */
    int decided;           /* comm_setup has run: nccl says how sums are made */
    int nccl;              /* sums on the devices: the parameters and optimiser
                              state live there (else host staging: the sum and
                              the update on the host) */
    int comm_ok;           /* nccl: the communicator over the members is joined */
    int join_failures;     /* joins failed in a row, and the last one's reason */
    dp_err join_error;
    int sum_failed;        /* --sync-bn: a bn sum of this step failed (its code) */
    dp_ar_sparse *sparse;  /* the sparse tables go by their rows (NULL: whole) */
    float weight;          /* this step's weight of this replica's gradient */
    dp_err sum_err;        /* and why */
};

/* A rejoining replica's welcome carries the ring's generation, and in its
 * top bit whether the ring sums on the devices. */
#define GEN_NCCL (1ULL << 63)
#define GEN_RANK_SHIFT 48 /* and in bits 48-61 the rank --compress auto took (0: none) */
#define GEN_RANK_MASK (0x3FFFULL << GEN_RANK_SHIFT)
#define KEY_MAX 256 /* a device key (device_key) with its NUL */

static int pos_of(const dp_strategy *s, int rank)
{
    for (int p = 0; p < s->n; p++)
        if (s->ranks[p] == rank)
            return p;
    return -1;
}

static const char *name_of(const dp_strategy *s, int p)
{
    return dp_transport_peer_name(s->t, s->ranks[p]);
}

/* The records of shard i of n this epoch.  An external model's caller
 * deals its own (external.h): each replica's loader, taken as full batches. */
static uint32_t shard_records(const dp_strategy *s, int i, int n)
{
    const dp_external_model *e = s->m->external;
    if (e)
        return (uint32_t)(e->steps_per_epoch * (long)s->env->cfg->batch);
    return dp_shard_size(s->policy, s->env->train, i, n);
}

/* Records every live replica contributes to step k of an epoch (the shards'
 * sizes are known to all, so nobody has to send them). */
static double records_in_step(const dp_strategy *s, long k)
{
    int batch = s->batch;
    double total = 0;
    for (int w = 0; w < s->n; w++) {
        if (!s->live[w])
            continue;
        long left = (long)s->sizes[w] - k * batch;
        total += left < 0 ? 0 : (left < batch ? left : batch);
    }
    return total;
}

/* A PLAN's offset that tells a replica the ring dropped it (watch_lost). */
#define PLAN_OUT UINT64_MAX
/* A bare HELLO's offset: a replica's greeting to every other at open, or
 * (to the leader that welcomed it) its READY once it holds the state; the
 * leader's GO, once every replica it welcomed at that epoch's start is
 * READY, lets each take its first ring step (welcome). */
#define HELLO_GREETING 0
#define HELLO_READY 2
#define HELLO_GO 3

static int leads(const dp_strategy *s)
{
    return s->position == s->leader;
}

/* What a replica no longer in the ring has sent is void; reading it also
 * takes the transport's report of its loss, after which a restarted
 * replica's new connection is in place (docs/transport.md).  Its HELLO
 * says it is back: the leader welcomes it at the next epoch, and every
 * other replica notes it too, should it take the lead first.  Every replica
 * looks at each one out of the ring at every step, so none is left with an
 * unread loss. */
static void forget(dp_strategy *s, int p)
{
    for (int k = 0; k < 8; k++) {
        dp_event ev;
        dp_err e;
        if (dp_transport_poll(s->t, s->ranks[p], 0, &ev, &e) < 0 || ev.kind != DP_EVENT_FRAME)
            return;
        if (ev.header.type == DP_WIRE_RING_PLAN && ev.header.offset == PLAN_OUT)
            s->dropped = 1; /* a leader that dropped this replica: it is out */
        if (ev.header.type == DP_WIRE_RING_HELLO && ev.header.length == 0 &&
            ev.header.offset == HELLO_GREETING && !s->back[p]) {
            s->back[p] = 1;
            if (s->fresh[p] && leads(s))
                dp_info("%s (a spare slot) asks to join; it joins the all-reduce ring at the "
                        "next epoch", name_of(s, p));
            else if (leads(s))
                dp_warn("fault: %s came back; it rejoins the all-reduce ring at the next epoch",
                        name_of(s, p));
        }
        dp_transport_skip_payload(s->t, s->ranks[p], &e);
    }
}

static int lowest_live(const dp_strategy *s)
{
    for (int p = 0; p < s->n; p++)
        if (s->live[p])
            return p;
    return s->position;
}

/* Replica p is gone.  If it led, the lowest replica left leads in this
 * replica's view; the ring's re-forming (reform) makes every survivor agree
 * before anyone acts on it, and the one that then leads takes the lead
 * (take_lead).  Returns 0 (an int, as the callers' error paths read it). */
static int lose(dp_strategy *s, int p, const char *reason, dp_err *err)
{
    (void)err;
    char why[sizeof err->msg]; /* reason may be err's own message */
    snprintf(why, sizeof why, "%s", reason);
    if (!s->live[p] || p == s->position)
        return 0;
    s->live[p] = 0;
    s->n_live--;
    s->inc[p] = dp_transport_peer_incarnation(s->t, s->ranks[p]);
    s->told[p] = 0;
    /* the transport's heartbeat and the collective timeouts say "timeout" */
    s->silent[p] = strstr(why, "timeout") != NULL;
    int led = p == s->leader;
    if (led)
        s->leader = lowest_live(s);
    /* It said BYE mid-run: drained (docs/faults.md, "Draining"), after the
     * step this replica applied last; the ring re-forms as for a loss. */
    int drained = dp_transport_peer_left(s->t, s->ranks[p]);
    if (led)
        s->lead_left = drained;
    char then[160] = "";
    if (led)
        snprintf(then, sizeof then, "; it led the ring, and %s leads it from now on (it "
                 "evaluates and writes)", name_of(s, s->leader));
    forget(s, p);
    if (drained) {
        if (leads(s)) {
            dp_info("%s drained at step %ld; the run goes on over %d worker(s)%s", name_of(s, p),
                    s->applied, s->n_live, then);
            dp_metrics_event(s->env->metrics, "drain", DP_F_STR, "task", name_of(s, p),
                             DP_F_STR, "action", "drain", DP_F_INT, "step", s->applied,
                             DP_F_INT, "workers", (long)s->n_live, DP_F_END);
        } else {
            dp_info("%s left the all-reduce ring (drained); it re-forms over the %d replica(s) "
                    "left%s", name_of(s, p), s->n_live, then);
        }
        return 0;
    }
    dp_warn("fault: lost %s (%s); the all-reduce ring re-forms over the %d replica(s) left%s",
            name_of(s, p), why, s->n_live, then);
    dp_metrics_event(s->env->metrics, "fault", DP_F_STR, "task", name_of(s, p), DP_F_STR, "what",
                     why, DP_F_STR, "action", "continue", DP_F_END);
    return 0;
}

/* The ring agreed that this replica leads (the one that led was lost or
 * drained): from now on it evaluates each epoch, writes the checkpoints,
 * the run's events and its result (the loop reads info->evaluator).  Every
 * replica evaluated each epoch already (info->standby), so it holds the
 * history and --keep-best's weights (docs/faults.md, "All-reduce"). */
static void take_lead(dp_strategy *s)
{
    if (s->info->evaluator)
        return;
    s->info->evaluator = 1;
    /* a drained leader is no fault (docs/faults.md, "Draining") */
    const char *how = s->lead_left ? "drained" : "lost";
    if (s->lead_left)
        dp_info("%s leads the all-reduce ring from step %ld (the leader drained): it "
                "evaluates, writes the checkpoints and the run's result",
                name_of(s, s->position), s->applied);
    else
        dp_warn("fault: %s leads the all-reduce ring from step %ld: it evaluates, writes the "
                "checkpoints and the run's result", name_of(s, s->position), s->applied);
    dp_metrics_event(s->env->metrics, "lead", DP_F_STR, "task", name_of(s, s->position),
                     DP_F_STR, "leader", how, DP_F_INT, "step", s->applied, DP_F_INT, "workers",
                     (long)s->n_live, DP_F_END);
}

/* Waits for a frame from position p other than ring segments (read past) and
 * stale RESETs.  Returns 0 with a frame, 1 when p was lost (or silent past
 * the collective timeout), -1 on error.  The leader may itself be waiting a
 * timeout per replica for a silent one, so it gets longer. */
static int recv_from(dp_strategy *s, int p, const char *what, dp_event *ev, dp_err *err)
{
    double timeout = s->ring.timeout * (p == s->leader ? s->n + 2 : 1);
    for (;;) {
        if (dp_transport_recv(s->t, s->ranks[p], what, timeout, ev, err) < 0) {
            if (ev->kind != DP_EVENT_PEER_LOST && ev->kind != DP_EVENT_TIMEOUT)
                return -1;
            return lose(s, p, err->msg, err) < 0 ? -1 : 1;
        }
        unsigned type = ev->header.type;
        if (type == DP_WIRE_RING_PLAN && ev->header.offset == PLAN_OUT) {
            s->dropped = 1;
            return dp_errf(err, "the all-reduce ring's leader %s dropped this replica (it was "
                                "silent past the heartbeat timeout: frozen or cut off) and went "
                                "on without it; it leaves the run", name_of(s, p));
        }
        /* ring segments read past, stale RESETs, and a member's greeting
         * at its open read after it was taken into the ring (ring.c) */
        if (type == DP_WIRE_RING || (type == DP_WIRE_RING_RESET && ev->header.step <= s->gen) ||
            (type == DP_WIRE_RING_HELLO && ev->header.length == 0 &&
             ev->header.offset == HELLO_GREETING && s->live[p])) {
            if (dp_transport_skip_payload(s->t, s->ranks[p], err) < 0)
                return lose(s, p, err->msg, err) < 0 ? -1 : 1;
            continue;
        }
        return 0;
    }
}

/* An epoch's figures (loss sum, records, correct) as 24 bytes. */
static void put_figures(uint8_t *b, const double v[3])
{
    for (int i = 0; i < 3; i++) {
        uint64_t u;
        memcpy(&u, &v[i], sizeof u);
        dp_put_u64(b + 8 * i, u);
    }
}

static void get_figures(const uint8_t *b, double v[3])
{
    for (int i = 0; i < 3; i++) {
        uint64_t u = dp_get_u64(b + 8 * i);
        memcpy(&v[i], &u, sizeof u);
    }
}

/* Reads epoch figures from p into the leader's table. */
static int take_stats(dp_strategy *s, int p, dp_err *err)
{
    uint8_t b[24];
    if (dp_transport_recv_payload(s->t, s->ranks[p], b, sizeof b, err) < 0)
        return lose(s, p, err->msg, err);
    get_figures(b, s->stats[p]);
    s->have[p] = 1;
    return 0;
}

/* The members in position order, with who is behind: u32 count, then per
 * member u32 position and u32 behind.  PLAN_MAX bytes at most. */
#define PLAN_MAX (4 + 8 * 256)
static size_t plan_bytes(const dp_strategy *s, uint8_t *buf, long newest, const long *applied)
{
    size_t len = 4;
    int k = 0;
    for (int p = 0; p < s->n && k < 256; p++)
        if (s->live[p]) {
            dp_put_u32(buf + len, (uint32_t)p);
            dp_put_u32(buf + len + 4, applied && applied[p] < newest);
            len += 8;
            k++;
        }
    dp_put_u32(buf, (uint32_t)k);
    return len;
}

static int send_plan(dp_strategy *s, int to, unsigned type, long newest, const long *applied,
                     uint64_t offset, dp_err *err)
{
    uint8_t buf[PLAN_MAX];
    size_t len = plan_bytes(s, buf, newest, applied);
    return dp_transport_send(s->t, s->ranks[to], type, (uint64_t)newest, offset, buf, len, err);
}

/* p, which this replica had given up on, is in the leader's plan: a member
 * again once its connection is up.  This side's loss of p closed their
 * link and the transport is redialing it; a ring step sent before the new
 * link is in place would fail, and this replica would lose p a second time
 * on its own while the others, in the new ring, wait on p and p waits on
 * this replica (docs/faults.md, "All-reduce").  Not up within two heartbeat
 * timeouts, the link between two live members is cut: this replica leaves
 * the run (an error), which the others survive as any lost replica, rather
 * than ring with members it cannot reach. */
static int readmit(dp_strategy *s, int p, dp_err *err)
{
    double hb = s->env->cfg->heartbeat_timeout > 0 ? s->env->cfg->heartbeat_timeout : 10;
    dp_err e; /* connect takes the old link's loss if it was not taken yet */
    if (dp_transport_connect(s->t, s->ranks[p], dp_now() + 2 * hb + 1, &e) < 0)
        return dp_errf(err, "%s is back in the leader's ring plan, but this replica's "
                            "connection to it did not come back within %g s (%s): leaving "
                            "the ring",
                       name_of(s, p), 2 * hb + 1, e.msg);
    s->live[p] = 1;
    s->n_live++;
    if (s->fresh[p])
        dp_info("%s: %s joined the all-reduce ring (a spare slot)", name_of(s, s->position),
                name_of(s, p));
    else
        dp_info("%s: %s is a member again (%s)", name_of(s, s->position), name_of(s, p),
                s->back[p] ? "restarted, welcomed by the leader"
                           : "the leader still had it in the ring");
    s->fresh[p] = 0;
    s->back[p] = 0;
    return 0;
}

/* A plan's bytes from position `from`: the ring's members become exactly
 * the plan's (a member this replica had given up on but the leader heard
 * from is back in), behind[] says who takes the state. */
static int apply_plan(dp_strategy *s, int from, const uint8_t *buf, size_t got,
                      unsigned char *behind, dp_err *err)
{
    if (got < 4 || got > PLAN_MAX || (got - 4) % 8 != 0)
        return dp_errf(err, "%s sent a malformed ring plan (%zu bytes)", name_of(s, from), got);
    uint32_t k = dp_get_u32(buf);
    if (k != (got - 4) / 8)
        return dp_errf(err, "%s sent a malformed ring plan", name_of(s, from));
    unsigned char *in = calloc((size_t)s->n, 1);
    if (!in)
        return dp_errf(err, "out of memory");
    for (uint32_t i = 0; i < k; i++) {
        uint32_t p = dp_get_u32(buf + 4 + 8 * i);
        if (p >= (uint32_t)s->n) {
            free(in);
            return dp_errf(err, "%s sent a ring plan naming replica %u of %d", name_of(s, from),
                           p, s->n);
        }
        in[p] = 1;
        if (behind)
            behind[p] = dp_get_u32(buf + 8 + 8 * i) != 0;
    }
    if (!in[s->position]) {
        free(in);
        return dp_errf(err, "%s sent a ring plan without this replica", name_of(s, from));
    }
    int rc = 0;
    for (int p = 0; p < s->n && rc == 0; p++) {
        if (s->live[p] && !in[p])
            lose(s, p, "the leader lost it", err);
        else if (!s->live[p] && in[p])
            rc = readmit(s, p, err);
    }
    free(in);
    return rc;
}

/* The payload of a plan frame just polled from position `from`. */
static int take_plan(dp_strategy *s, int from, const dp_event *ev, unsigned char *behind,
                     dp_err *err)
{
    uint8_t buf[PLAN_MAX];
    size_t got = ev->header.length;
    if (got < 4 || got > sizeof buf)
        return dp_errf(err, "%s sent a malformed ring plan (%zu bytes)", name_of(s, from), got);
    if (dp_transport_recv_payload(s->t, s->ranks[from], buf, got, err) < 0)
        return -1;
    return apply_plan(s, from, buf, got, behind, err);
}

/* ---- sums on the devices (docs/gpu.md, "Strategies") ---- */

/* Whether this replica can sum on its device: one with collectives, unless
 * --no-nccl (or its fallback DOWNPOUR_NCCL=0) asks for host staging. */
static int can_comm(const dp_strategy *s)
{
    return dp_replica_can_sum(s->r) && !s->no_nccl;
}

/* Which GPU this replica sums on, for the leader to find two replicas on one
 * (NCCL takes one GPU per rank): host and device, e.g. "node3/NVIDIA H100
 * 80GB HBM3 (cuda:0, 79.1 GiB)".  sim's collectives take any number of
 * ranks on a host, so its key is the process's own. */
static size_t device_key(const dp_strategy *s, char *key, size_t len)
{
    char host[128] = "?";
    gethostname(host, sizeof host - 1);
    if (s->env->cfg->device.kind == DP_DEVICE_SIM)
        snprintf(key, len, "%s/sim/%ld", host, (long)getpid());
    else
        snprintf(key, len, "%s/%s", host, dp_replica_describe(s->r));
    return strlen(key);
}

/* comm_setup's (and rebuild_ring's) answer when the ring must re-form
 * again: a member went on to a new round, or the leader was lost. */
#define AGAIN 2

/* At the end of every (re)building of the ring: each member tells the leader
 * whether its device has collectives; at open the leader decides (sums on
 * the devices if every member can) and the choice holds for the run (a
 * restarted replica learns it in its welcome, and refuses to rejoin a ring
 * it cannot sum in).  The leader makes an id and sends it with the members,
 * and each member joins as its place among them.  A join that fails (a
 * member died in it) leaves comm_ok 0, and the next step re-forms the ring. */
static int comm_setup(dp_strategy *s, dp_err *err)
{
    if (s->n == 1 || (s->decided && !s->nccl))
        return 0;
    uint8_t buf[DP_COMM_ID_BYTES + PLAN_MAX];
    int mode;
    dp_err e;
    int lead = s->leader;
    if (!leads(s)) {
        char key[KEY_MAX];
        int can = can_comm(s);
        size_t klen = can ? device_key(s, key, sizeof key) : 0;
        if (dp_transport_send(s->t, s->ranks[lead], DP_WIRE_RING_COMM, s->gen, (uint64_t)can, key,
                              klen, &e) < 0) {
            if (!s->decided)
                return dp_errf(err, "lost the leader %s building the ring (%s)",
                               name_of(s, lead), e.msg);
            lose(s, lead, e.msg, err);
            return AGAIN;
        }
        dp_event ev;
        int rc;
        while ((rc = recv_from(s, lead, "the devices' communicator", &ev, err)) == 0 &&
               !(ev.header.type == DP_WIRE_RING_COMM && ev.header.step == s->gen)) {
            if (ev.header.type == DP_WIRE_RING_RESET) { /* the leader re-forms anew */
                s->rgen[lead] = ev.header.step;
                return AGAIN;
            }
            if (dp_transport_skip_payload(s->t, s->ranks[lead], err) < 0)
                return -1;
        }
        if (rc > 0 && s->decided)
            return AGAIN; /* the leader lost: the ring re-forms without it */
        if (rc != 0)
            return -1;
        mode = ev.header.offset == 1;
        size_t len = ev.header.length, idb = mode ? DP_COMM_ID_BYTES : 0;
        if (ev.header.offset > 1 || len < idb + 4 || len > idb + PLAN_MAX)
            return dp_errf(err, "%s sent a malformed communicator frame (offset %llu, %zu bytes)",
                           name_of(s, lead), (unsigned long long)ev.header.offset, len);
        if (dp_transport_recv_payload(s->t, s->ranks[lead], buf, len, err) < 0 ||
            apply_plan(s, lead, buf + idb, len - idb, NULL, err) < 0)
            return -1;
        if (mode && !can_comm(s))
            return dp_errf(err, "%s sums the gradients on the devices (NCCL), and this "
                                "replica's device has no collectives",
                           name_of(s, lead));
    } else {
        mode = s->decided ? s->nccl : can_comm(s);
        char(*keys)[KEY_MAX] = mode ? calloc((size_t)s->n, KEY_MAX) : NULL;
        if (mode && !keys)
            return dp_errf(err, "out of memory");
        if (mode)
            device_key(s, keys[s->position], KEY_MAX);
        for (int p = 0; p < s->n; p++)
            while (p != s->position && s->live[p]) {
                dp_event ev;
                int rc = recv_from(s, p, "whether its device has collectives", &ev, err);
                if (rc < 0) {
                    free(keys);
                    return -1;
                }
                if (rc > 0)
                    break;
                if (ev.header.type == DP_WIRE_RING_COMM && ev.header.step == s->gen &&
                    ev.header.length < KEY_MAX) {
                    int can = ev.header.offset == 1;
                    if (keys && dp_transport_recv_payload(s->t, s->ranks[p], keys[p],
                                                          ev.header.length, &e) < 0)
                        can = 0, lose(s, p, e.msg, err);
                    else if (!keys)
                        dp_transport_skip_payload(s->t, s->ranks[p], &e);
                    if (s->decided && s->nccl && !can && s->live[p])
                        lose(s, p, "its device has no collectives, and the ring sums on the "
                                   "devices", err);
                    mode = mode && (can || !s->live[p]);
                    break;
                }
                if (ev.header.type == DP_WIRE_RING_RESET) {
                    /* p went on to a new round (reform): so does this one */
                    s->rgen[p] = ev.header.step;
                    free(keys);
                    return AGAIN;
                }
                if (dp_transport_skip_payload(s->t, s->ranks[p], &e) < 0 &&
                    lose(s, p, e.msg, err) < 0) {
                    free(keys);
                    return -1;
                }
            }
        /* NCCL takes one GPU per rank: two replicas on one keep host staging. */
        for (int p = 0; mode && !s->decided && p < s->n; p++)
            for (int q = p + 1; mode && q < s->n; q++)
                if (s->live[p] && s->live[q] && strcmp(keys[p], keys[q]) == 0) {
                    dp_warn("allreduce: %s and %s share one GPU (%s), and NCCL takes one a "
                            "rank: the gradients are summed on the host (give each replica its "
                            "own --device cuda:N)",
                            name_of(s, p), name_of(s, q), keys[p]);
                    mode = 0;
                }
        free(keys);
        if (mode && dp_replica_sum_id(s->r, buf, &e) < 0) {
            dp_warn("allreduce: %s: the gradients are summed on the host", e.msg);
            mode = 0;
        }
        size_t idb = mode ? DP_COMM_ID_BYTES : 0;
        size_t len = idb + plan_bytes(s, buf + idb, 0, NULL);
        for (int p = 0; p < s->n; p++)
            if (p != s->position && s->live[p] &&
                dp_transport_send(s->t, s->ranks[p], DP_WIRE_RING_COMM, s->gen, (uint64_t)mode, buf,
                                  len, &e) < 0 &&
                lose(s, p, e.msg, err) < 0)
                return -1;
    }
    int first = !s->decided;
    s->decided = 1;
    s->nccl = mode;
    if (!mode)
        return 0;
    int rank = 0;
    for (int p = 0; p < s->position; p++)
        rank += s->live[p];
    s->comm_ok = dp_replica_sum_join(s->r, buf, s->n_live, rank, &e) == 0;
    s->join_failures = s->comm_ok ? 0 : s->join_failures + 1;
    if (!s->comm_ok) {
        s->join_error = e;
        dp_warn("%s: %s; the ring re-forms at the next step", name_of(s, s->position), e.msg);
    }
    else if (leads(s))
        dp_info("allreduce: the gradients are summed on the devices (NCCL) over %d replica(s)%s",
                s->n_live, first ? "" : ", a new communicator");
    return 0;
}

/* The ring over the live replicas, in position order. */
static int rebuild_ring(dp_strategy *s, dp_err *err)
{
    int ranks[256 + 1], k = 0;
    int *r = s->n <= 256 ? ranks : malloc((size_t)s->n * sizeof *r);
    if (!r)
        return dp_errf(err, "out of memory");
    for (int p = 0; p < s->n; p++)
        if (s->live[p])
            r[k++] = s->ranks[p];
    double timeout = s->ring.timeout;
    dp_ring_free(&s->ring);
    int rc = dp_ring_init(&s->ring, s->t, r, k, timeout, 0, err);
    s->ring_open = rc == 0;
    if (rc == 0) {
        dp_ring_set_algo(&s->ring, (dp_allreduce_algo)s->algo);
        dp_ring_set_compress(&s->ring, &s->compress);
    }
    /* Every member of the new ring rebuilds it before the same step: the
     * overlap is measured afresh, in step (reducer.h). */
    if (rc == 0 && s->reducer)
        dp_reducer_restart(s->reducer);
    if (rc == 0 && s->psgd) {
        dp_powersgd_restart(s->psgd); /* the last sum may have broken half way */
        s->psgd_sums = 0;             /* counted since the ring formed, as its own */
    }
    if (r != ranks)
        free(r);
    return rc < 0 ? rc : comm_setup(s, err);
}

/* The parameters and optimiser state, straight from and into their buffers. */
static int send_state(dp_strategy *s, int to, dp_err *err)
{
    struct iovec iov[2] = {{s->m->params, s->m->n_params * sizeof(float)},
                           {s->opt->state, s->m->n_params * (size_t)dp_optim_slots(s->opt->cfg.kind) *
                                              sizeof(float)}};
    return dp_transport_sendv(s->t, s->ranks[to], DP_WIRE_RING_STATE, (uint64_t)s->applied,
                              (uint64_t)s->opt->t, iov, iov[1].iov_len ? 2 : 1, err);
}

static int recv_state(dp_strategy *s, int from, dp_err *err)
{
    size_t pb = s->m->n_params * sizeof(float);
    size_t ob = s->m->n_params * (size_t)dp_optim_slots(s->opt->cfg.kind) * sizeof(float);
    dp_event ev;
    if (dp_transport_recv(s->t, s->ranks[from], "the newest replica's state", s->ring.timeout, &ev,
                          err) < 0)
        return -1;
    if (ev.header.type != DP_WIRE_RING_STATE || ev.header.length != pb + ob)
        return dp_errf(err, "%s sent frame type %u (%llu bytes) instead of its state",
                       name_of(s, from), ev.header.type, (unsigned long long)ev.header.length);
    if (dp_transport_recv_payload(s->t, s->ranks[from], s->m->params, pb, err) < 0 ||
        (ob && dp_transport_recv_payload(s->t, s->ranks[from], s->opt->state, ob, err) < 0))
        return -1;
    s->opt->t = (long)ev.header.offset;
    s->applied = (long)ev.header.step;
    return 0;
}

/* Alone of a ring of two, the other lost by its connection closing
 * (without BYE, not by this side's timeout): dead, or alive and it dropped
 * this replica (this one was frozen or cut off past the heartbeat
 * timeout), which a ring of one cannot tell from the loss.  An
 * alive peer's link comes back (one side redials), so this replica waits
 * for it as readmit does, at most two heartbeat timeouts and a second: the
 * same process back means this replica was dropped, and it leaves (1, err
 * set) rather than go on as a second ring writing a second result.  A
 * restarted one (a new incarnation) or none: 0, and it goes on. */
static int lone_dropped(dp_strategy *s, dp_err *err)
{
    int p = -1;
    for (int i = 0; i < s->ring.n; i++)
        if (pos_of(s, s->ring.ranks[i]) != s->position)
            p = pos_of(s, s->ring.ranks[i]);
    /* Lost by this side's timeout: this side dropped it, and goes on. */
    if (p < 0 || s->live[p] || s->inc[p] == 0 || s->silent[p] ||
        dp_transport_peer_left(s->t, s->ranks[p]))
        return 0;
    double hb = s->env->cfg->heartbeat_timeout > 0 ? s->env->cfg->heartbeat_timeout : 10;
    dp_err e;
    if (dp_transport_connect(s->t, s->ranks[p], dp_now() + 2 * hb + 1, &e) < 0 ||
        dp_transport_peer_incarnation(s->t, s->ranks[p]) != s->inc[p])
        return 0;
    dp_errf(err, "%s, the other replica of the all-reduce ring, is alive and connected again "
                 "after this replica lost it: it dropped this replica (frozen or cut off past "
                 "the heartbeat timeout) and went on; this replica leaves the run",
            name_of(s, p));
    return 1;
}

/* A REPORT's payload: the position this replica names as the leader, 1
 * when it waits in epoch_end on the leader's plan, and the step in progress
 * (the last step it applied is the frame's offset). */
#define REPORT_BYTES 16
/* A reform's PLAN carries the generation above the source's position. */
#define PLAN_GEN_SHIFT 16
#define MAX_ROUNDS(n) (2 * (n) + 4)

/* Re-forms the ring over the survivors (docs/faults.md, "All-reduce"):
 * RESET to every member, read every member up to its RESET (so nothing of
 * the broken ring is left in flight, and each member still held is known
 * alive), then every member REPORTs to every other the last step it applied
 * and whom it names as the leader (the one that led, or, if it lost that
 * one, the lowest replica it holds).  All name the same one, or a member
 * names one this replica had lost before the round (a cut between them):
 * this replica leaves the run, which the others survive as any lost
 * replica.  A leader lost meanwhile starts a new round.  The leader sends
 * the plan, the newest replica hands its state to those one step behind,
 * and the ring is rebuilt.  Afterwards every member has applied the same
 * steps and holds the same bits, and the leader they agree on leads. */
static int reform(dp_strategy *s, dp_err *err)
{
    int me = s->position, n = s->n > 0 ? s->n : 1;
    dp_err e;
    long before = s->applied;
    int rc = -1, rounds = 0;
    unsigned char *behind = calloc((size_t)n, 1), *got = calloc((size_t)n, 1),
                  *had = calloc((size_t)n, 1);
    long *applied = calloc((size_t)n, sizeof *applied);
    uint32_t *named = calloc((size_t)n, sizeof *named);
    if (!behind || !got || !had || !applied || !named) {
        dp_errf(err, "out of memory");
        goto out;
    }
again:
    if (++rounds > MAX_ROUNDS(n)) {
        dp_errf(err, "the all-reduce ring did not agree on its leader in %d rounds", rounds - 1);
        goto out;
    }
    uint64_t gen = s->gen + 1;
    int source = me;
    long newest = s->applied;
    for (int p = 0; p < n; p++)
        if (p != me && s->live[p] &&
            dp_transport_send(s->t, s->ranks[p], DP_WIRE_RING_RESET, gen, 0, NULL, 0, &e) < 0)
            lose(s, p, e.msg, err);
    for (int p = 0; p < n; p++) {
        while (p != me && s->live[p] && s->rgen[p] < gen) {
            dp_event ev;
            int r = recv_from(s, p, "re-forming the ring", &ev, err);
            if (r < 0)
                goto out;
            if (r > 0)
                break;
            if (ev.header.type == DP_WIRE_RING_RESET)
                s->rgen[p] = ev.header.step;
            else if (ev.header.type == DP_WIRE_RING_STATS && leads(s) && ev.header.length == 24)
                r = take_stats(s, p, err); /* sent before its RESET: still this epoch's */
            else if (dp_transport_skip_payload(s->t, s->ranks[p], &e) < 0)
                r = lose(s, p, e.msg, err);
            if (r < 0)
                goto out;
        }
    }
    /* Every member still held sent its RESET of this round: it is alive. */
    memcpy(had, s->live, (size_t)n);
    uint32_t name = (uint32_t)s->leader;
    uint8_t rep[REPORT_BYTES];
    dp_put_u32(rep, name);
    dp_put_u32(rep + 4, (uint32_t)s->in_end);
    dp_put_u64(rep + 8, (uint64_t)s->cur);
    for (int p = 0; p < n; p++)
        if (p != me && s->live[p] &&
            dp_transport_send(s->t, s->ranks[p], DP_WIRE_RING_REPORT, gen, (uint64_t)s->applied,
                              rep, sizeof rep, &e) < 0)
            lose(s, p, e.msg, err);
    memset(got, 0, (size_t)n);
    int newer = 0;
    for (int p = 0; p < n && !newer; p++) {
        while (p != me && s->live[p] && !got[p]) {
            dp_event ev;
            int r = recv_from(s, p, "the last step it applied", &ev, err);
            if (r < 0)
                goto out;
            if (r > 0)
                break;
            if (ev.header.type == DP_WIRE_RING_REPORT && ev.header.step == gen &&
                ev.header.length == REPORT_BYTES) {
                if (dp_transport_recv_payload(s->t, s->ranks[p], rep, sizeof rep, &e) < 0) {
                    lose(s, p, e.msg, err);
                    break;
                }
                applied[p] = (long)ev.header.offset;
                named[p] = dp_get_u32(rep);
                s->rend[p] = dp_get_u32(rep + 4) != 0;
                s->rcur[p] = (long)dp_get_u64(rep + 8);
                got[p] = 1;
                if (named[p] >= (uint32_t)n) {
                    dp_errf(err, "%s named replica %u of %d as the leader", name_of(s, p),
                            named[p], n);
                    goto out;
                }
            } else if (ev.header.type == DP_WIRE_RING_RESET && ev.header.step > gen) {
                s->rgen[p] = ev.header.step; /* it went on to a new round: so does this one */
                newer = 1;
                break;
            } else if (dp_transport_skip_payload(s->t, s->ranks[p], &e) < 0) {
                lose(s, p, e.msg, err);
            }
        }
    }
    int differ = newer || (uint32_t)s->leader != name;
    for (int p = 0; p < n && !differ; p++) {
        if (p == me || !s->live[p] || !got[p] || named[p] == name)
            continue;
        if (!had[named[p]]) {
            dp_errf(err, "%s names %s as the all-reduce ring's leader, and this replica had "
                         "lost it: leaving the ring, which goes on without this replica",
                    name_of(s, p), name_of(s, (int)named[p]));
            goto out;
        }
        /* p does not hold the one this replica names (two that named
         * different ones cannot both hold both): p leaves, and the
         * leader's plan goes without it. */
        if (leads(s))
            lose(s, p, "it lost this leader and leaves", err);
    }
    if (differ) { /* a leader lost in the round, or views that differ: again */
        s->gen = gen;
        goto again;
    }
    /* Alone, having lost two or more others since the ring last formed:
     * far likelier this replica was frozen or cut off than they all died
     * at once, and they go on without it.  It leaves rather than train on
     * as a ring of its own (docs/faults.md, "All-reduce"). */
    if (s->n_live == 1 && s->ring.n >= 3) {
        dp_errf(err, "lost all %d other replicas of the all-reduce ring at once: this replica "
                     "was more likely cut off or frozen than they all died; it leaves the run, "
                     "which goes on without it", s->ring.n - 1);
        goto out;
    }
    if (s->n_live == 1 && s->ring.n == 2 && lone_dropped(s, err))
        goto out;
    if (leads(s)) {
        applied[me] = s->applied;
        for (int p = 0; p < n; p++)
            if (s->live[p] && applied[p] > newest)
                newest = applied[p];
        /* The first replica with the newest state is the source. */
        for (int p = n - 1; p >= 0; p--)
            if (s->live[p] && applied[p] == newest)
                source = p;
        for (int p = 0; p < n; p++)
            if (p != me && s->live[p] &&
                send_plan(s, p, DP_WIRE_RING_PLAN, newest, applied,
                          (gen << PLAN_GEN_SHIFT) | (uint64_t)source, &e) < 0)
                lose(s, p, e.msg, err);
        for (int p = 0; p < n; p++)
            behind[p] = s->live[p] && applied[p] < newest;
    } else {
        int lead = s->leader;
        dp_event ev;
        for (;;) {
            int r = recv_from(s, lead, "the ring's new members", &ev, err);
            if (r < 0)
                goto out;
            if (r > 0 || (ev.header.type == DP_WIRE_RING_RESET && ev.header.step > gen)) {
                if (r == 0)
                    s->rgen[lead] = ev.header.step;
                s->gen = gen; /* the leader lost, or gone on to a new round */
                goto again;
            }
            if (ev.header.type == DP_WIRE_RING_PLAN &&
                ev.header.offset >> PLAN_GEN_SHIFT == gen)
                break;
            if (dp_transport_skip_payload(s->t, s->ranks[lead], err) < 0) {
                s->gen = gen;
                lose(s, lead, err->msg, err);
                goto again;
            }
        }
        memset(behind, 0, (size_t)n);
        if (take_plan(s, lead, &ev, behind, err) < 0)
            goto out;
        newest = (long)ev.header.step;
        source = (int)(ev.header.offset & ((1u << PLAN_GEN_SHIFT) - 1));
        if (source >= n || !s->live[source]) {
            dp_errf(err, "the leader %s named replica %d as the newest", name_of(s, lead),
                    source);
            goto out;
        }
    }
    /* Those behind finished one step fewer (a reduction that completed on
     * some replicas only): the newest state goes to them. */
    if (me == source) {
        for (int p = 0; p < n; p++)
            if (p != me && behind[p] && send_state(s, p, &e) < 0)
                lose(s, p, e.msg, err);
    } else if (behind[me] && recv_state(s, source, err) < 0) {
        dp_err_prefix(err, "re-forming the ring");
        goto out;
    }
    s->gen = gen;
    int built = rebuild_ring(s, err);
    if (built < 0)
        goto out;
    if (built == AGAIN)
        goto again;
    if (leads(s))
        dp_info("%s: the all-reduce ring goes on over %d replica(s) from step %ld%s",
                name_of(s, me), s->n_live, newest + 1,
                s->applied > before ? " (this replica took the newest state)" : "");
    if (leads(s))
        take_lead(s);
    rc = 0;
out:
    free(behind);
    free(got);
    free(had);
    free(applied);
    free(named);
    return rc;
}

/* Called when a ring operation broke: what the ring saw, then re-form. */
static int ring_broke(dp_strategy *s, const dp_err *why, dp_err *err)
{
    int p = pos_of(s, s->ring.broken_peer);
    if (p < 0)
        return dp_errf(err, "%s", why->msg);
    if (s->ring.broken_lost) {
        lose(s, p, why->msg, err);
    } else if (s->ring.reset_gen == 0) {
        dp_warn("%s; re-forming the all-reduce ring", why->msg);
    } else if (s->ring.reset_gen > s->rgen[p]) {
        s->rgen[p] = s->ring.reset_gen;
    }
    return reform(s, err);
}

/* Re-forming with sums on the devices: the communicator ends first (its
 * members change), and the state is on the host while the ring re-forms
 * (reform reads and writes the host's arrays). */
static int reform_all(dp_strategy *s, dp_err *err)
{
    if (!s->nccl)
        return reform(s, err);
    dp_replica_sum_abort(s->r);
    s->comm_ok = 0;
    return dp_replica_to_host(s->r, err) < 0 || reform(s, err) < 0 ||
                   dp_replica_from_host(s->r, err) < 0
               ? -1
               : 0;
}

/* The ring rebuilt over the live members; re-formed instead where that
 * meets a new round (comm_setup's AGAIN). */
static int rebuild_or_reform(dp_strategy *s, dp_err *err)
{
    int rc = rebuild_ring(s, err);
    return rc == AGAIN ? reform_all(s, err) : rc;
}

/* Between waits on the devices' sum, every other member looked at: one
 * lost, or one re-forming the ring, means the sum will never complete.
 * Returns 1 then, 0 when all is well, -1 when the run cannot go on. */
static int watch_members(dp_strategy *s, dp_err *err)
{
    int broken = 0;
    for (int p = 0; p < s->n; p++) {
        if (p == s->position || !s->live[p])
            continue;
        dp_event ev;
        dp_err e;
        if (dp_transport_poll(s->t, s->ranks[p], 0, &ev, &e) < 0 || ev.kind == DP_EVENT_TIMEOUT)
            continue;
        if (ev.kind == DP_EVENT_PEER_LOST) {
            if (lose(s, p, ev.reason, err) < 0)
                return -1;
            broken = 1;
            continue;
        }
        unsigned type = ev.header.type;
        if (type == DP_WIRE_RING_STATS && leads(s) && ev.header.length == 24) {
            if (take_stats(s, p, err) < 0) /* a member done with the epoch's last sum */
                return -1;
            continue;
        }
        if (type == DP_WIRE_RING_RESET && ev.header.step > s->gen) {
            if (ev.header.step > s->rgen[p])
                s->rgen[p] = ev.header.step;
            broken = 1;
        }
        if (dp_transport_skip_payload(s->t, s->ranks[p], &e) < 0 && lose(s, p, e.msg, err) < 0)
            return -1;
    }
    return broken;
}

/* One step summed on the devices: forward and backward, the gradients
 * weighed by this replica's share of the step's records, the sum queued,
 * waited on in slices with the members watched between them, then the
 * update.  The loss stays tallied on the device (deferred).  A sum that
 * cannot complete sets broken. */
#define WAIT_SLICE_S 0.002
#define MAX_JOIN_FAILURES 3 /* in a row: members dying, or NCCL refusing */
static int device_step(dp_strategy *s, int n, float lr, long step, dp_step_out *out,
                       dp_err *err)
{
    double all = records_in_step(s, (step - 1) % s->env->steps_per_epoch);
    float w = all > 0 && n > 0 ? (float)(n / all) : 0.0f;
    out->deferred = 1;
    s->cur = step;
    if (!s->comm_ok) {
        if (s->join_failures >= MAX_JOIN_FAILURES)
            return dp_errf(err, "no communicator over the devices after %d tries (%s); "
                                "--no-nccl sums the gradients on the host",
                           s->join_failures, s->join_error.msg);
        s->broken = 1;
        return dp_errf(err, "no communicator over the devices");
    }
    float loss; /* tallied on the device: the grads are deferred */
    int correct;
    if ((n > 0 && dp_replica_grads(s->r, NULL, NULL, n, &loss, &correct, err) < 0) ||
        dp_replica_scale_grads(s->r, w, err) < 0)
        return -1;
    if (dp_replica_sum_grads(s->r, err) < 0) {
        s->broken = 1;
        return -1;
    }
    double t0 = dp_now();
    for (;;) {
        int rc = dp_replica_sum_wait(s->r, WAIT_SLICE_S, err);
        if (rc == 1)
            break;
        if (rc < 0) {
            s->broken = 1;
            return -1;
        }
        rc = watch_members(s, err);
        if (rc < 0)
            return -1;
        if (rc > 0 || dp_now() - t0 > s->ring.timeout) {
            s->broken = 1;
            return rc > 0 ? dp_errf(err, "a member left during the sum of step %ld", step)
                          : dp_errf(err, "the sum of step %ld on the devices did not finish "
                                         "within %g s (--collective-timeout)",
                                    step, s->ring.timeout);
        }
    }
    if (dp_replica_apply(s->r, lr, err) < 0)
        return -1;
    s->applied = step;
    return 0;
}

/* After a loss: the replicas out of the ring are looked at (forget). */
static void watch_lost(dp_strategy *s)
{
    for (int p = 0; p < s->n; p++)
        if (!s->live[p] && !s->back[p]) {
            forget(s, p);
            /* The same process connected again (a redial): it was frozen
             * or cut off, not dead, and may think itself the ring (alone,
             * or leading).  The leader tells it that it is out. */
            dp_err e;
            if (leads(s) && !s->told[p] && s->inc[p] != 0 &&
                dp_transport_peer_incarnation(s->t, s->ranks[p]) == s->inc[p] &&
                dp_transport_send(s->t, s->ranks[p], DP_WIRE_RING_PLAN, 0, PLAN_OUT, NULL, 0,
                                  &e) == 0)
                s->told[p] = 1;
        }
}

/* The leader, between epochs (and at the end): the replicas that came back
 * are members again (take_back), so the epoch's plan names them; then each
 * is answered (welcome): the plan as the answer to its HELLO, with the step
 * to start after and the ring's generation, then the parameters and
 * optimiser state, so it holds the same bits as every other member. */
static void take_back(dp_strategy *s)
{
    watch_lost(s);
    for (int p = 0; p < s->n; p++)
        if (s->back[p] && !s->live[p]) {
            s->live[p] = 1;
            s->n_live++;
        }
}

static int welcome(dp_strategy *s, dp_err *err)
{
    unsigned char *ready = NULL; /* those READY: each is sent GO at the end */
    for (int p = 0; p < s->n; p++) {
        if (!s->back[p])
            continue;
        if (!ready && !(ready = calloc((size_t)s->n, 1)))
            return dp_errf(err, "out of memory");
        if (dp_replica_to_host(s->r, err) < 0) {
            free(ready);
            return -1;
        }
        s->back[p] = 0;
        dp_err e;
        if (send_plan(s, p, DP_WIRE_RING_HELLO, s->applied, NULL,
                      s->gen | (s->nccl ? GEN_NCCL : 0) | ((uint64_t)s->autoc.rank << GEN_RANK_SHIFT),
                      &e) < 0 ||
            send_state(s, p, &e) < 0) {
            lose(s, p, e.msg, err);
            continue;
        }
        /* Its READY: it holds the state, so the others, told only now,
         * may send it ring frames (its handshake reads any peer, and one's
         * segment read before this plan would be the wrong frame). */
        dp_event ev;
        int rc = recv_from(s, p, "its READY", &ev, err);
        if (rc < 0) {
            free(ready);
            return -1;
        }
        if (rc == 1)
            continue; /* lost: the others' plan leaves it out */
        if (ev.header.type != DP_WIRE_RING_HELLO || ev.header.offset != HELLO_READY ||
            ev.header.length != 0) {
            dp_transport_skip_payload(s->t, s->ranks[p], &e);
            lose(s, p, "it sent another frame than READY after its state", err);
            continue;
        }
        ready[p] = 1;
        s->joined[p] = s->applied;
        dp_sleep_ms(dp_hook_welcome_ms()); /* a test's wide window (testhooks.h) */
        if (s->fresh[p]) { /* a spare slot filled: the job grows, no fault */
            s->fresh[p] = 0;
            dp_info("%s joined the all-reduce ring at step %ld; the run goes on over %d "
                    "worker(s)", name_of(s, p), s->applied, s->n_live);
            dp_metrics_event(s->env->metrics, "join", DP_F_STR, "task", name_of(s, p), DP_F_STR,
                             "action", "join", DP_F_INT, "step", s->applied, DP_F_INT,
                             "workers", (long)s->n_live, DP_F_END);
            continue;
        }
        dp_warn("fault: %s rejoined the all-reduce ring at step %ld; the ring goes on over %d "
                "replica(s)", name_of(s, p), s->applied, s->n_live);
        dp_metrics_event(s->env->metrics, "fault", DP_F_STR, "task", name_of(s, p), DP_F_STR,
                         "what", "restarted", DP_F_STR, "action", "rejoin", DP_F_INT, "step",
                         s->applied, DP_F_END);
    }
    /* GO to each READY only now: two welcomed at one epoch's start hold a
     * plan naming each other, and the first, let go at its READY, sent the
     * second a ring segment while the second still read its handshake (it
     * left with "sent frame type 24 instead of HELLO", and the ring hung).
     * The GO carries the members as they are now: one welcomed first still
     * holds a plan naming one lost since. */
    for (int p = 0; ready && p < s->n; p++) {
        dp_err e;
        if (ready[p] && s->live[p] &&
            send_plan(s, p, DP_WIRE_RING_HELLO, s->applied, NULL, HELLO_GO, &e) < 0)
            lose(s, p, e.msg, err);
    }
    free(ready);
    return 0;
}

/* What the reducer chose, once it has: one line from the leader. */
static void say_choice(const dp_strategy *s)
{
    dp_overlap_choice c;
    dp_reducer_choice(s->reducer, &c);
    if (c.overlap_ms > 0)
        dp_info("allreduce: overlap %s (measured %.2f ms/step overlapped vs %.2f ms inline, "
                "ratio %.3f, mean over %d replicas; overlap needs below %.2f)",
                c.overlap ? "on" : "off", c.overlap_ms, c.inline_ms, c.ratio, s->ring.n,
                1 - DP_REDUCER_MARGIN);
    else
        dp_info("allreduce: overlap %s (%s)", c.overlap ? "on" : "off", c.reason);
}

/* Cores this process may count on beyond its arithmetic threads: the cores
 * it may run on, less those its own threads and the other tasks on this
 * host take (each assumed to run as many as this one: the launcher gives
 * every local task cores / tasks). */
static int spare_cores(const dp_strategy *s)
{
    const dp_cluster *c = &s->env->node->cluster;
    const char *host = c->tasks[c->self].host;
    int local = 0;
    for (int i = 0; i < c->n_tasks; i++)
        local += strcmp(c->tasks[i].host, host) == 0;
    int cores = 0;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        cores = CPU_COUNT(&set);
    if (cores < 1)
        cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    int spare = cores - local * dp_blas_threads();
    return spare > 0 ? spare : 0;
}

/* Each replica's mean gradient weighs its share of the step's records, so
 * the sum is the mean over the summed batch. */
static void begin(void *self, long step, int records)
{
    dp_strategy *s = self;
    long k = (step - 1) % s->env->steps_per_epoch;
    double all = records_in_step(s, k);
    s->cur = step;
    s->sum_failed = 0;
    s->weight = all > 0 ? (float)(records / all) : 0.0f;
    if (!s->psgd)
        dp_reducer_begin(s->reducer, (uint64_t)step, s->weight);
}

static void ready(void *self, size_t lo)
{
    dp_strategy *s = self;
    if (!s->psgd)
        dp_reducer_ready(s->reducer, lo);
}

/* --compress powersgd: the whole gradient at once, after backprop
 * (powersgd.h), but for the sparse tables that go by their rows
 * (sparse_exchange, after it).  One replica sends nothing, so it sums exactly, as the
 * ring's kinds do (its residual, from a larger ring, goes in). */
static int psgd_sum(dp_strategy *s, dp_err *err)
{
    if (s->ring.n == 1) {
        dp_powersgd_exact(s->psgd, s->m->grads, s->weight);
        return 0;
    }
    s->psgd_sums += 2;
    return dp_powersgd_reduce(s->psgd, &s->ring, s->m->grads, s->weight, (uint64_t)s->cur, err);
}

/* --sync-bn: a bn layer's sums over the ring, on the training thread
 * between the step's gradient buckets (so the reducer stays inline; bucket
 * -1 in messages).  After a failure the step's other sums are skipped: the
 * layers go on with their own rows and update() fails the step. */
static int batch_sum(void *self, float *buf, size_t n)
{
    dp_strategy *s = self;
    if (s->sum_failed)
        return -1;
    int rc = dp_ring_allreduce(&s->ring, buf, n, (uint64_t)s->cur, -1, &s->sum_err);
    if (rc < 0)
        s->sum_failed = rc;
    return rc < 0 ? -1 : 0;
}

/* The sparse tables' rows, after the reducer summed the rest; --verbose
 * says the sizes every step. */
static int sparse_exchange(dp_strategy *s, dp_err *err)
{
    int rc = dp_ar_sparse_exchange(s->sparse, &s->ring, s->reducer, s->m->grads, s->weight,
                                   (uint64_t)s->cur, err);
    if (rc == 0 && leads(s) && dp_log_get_level() <= DP_LOG_DEBUG) {
        uint64_t gathered, sent;
        dp_ar_sparse_last(s->sparse, &gathered, &sent);
        dp_ar_sparse_plan plan;
        dp_ar_sparse_plan_of(s->m, s->ring.n, s->batch, &plan);
        dp_debug("allreduce step %ld: sparse all-gather of %llu bytes over %d replicas, %llu "
                 "sent by this one; all-reduced whole it would send %llu",
                 s->cur, (unsigned long long)gathered, s->ring.n, (unsigned long long)sent,
                 (unsigned long long)plan.dense_bytes);
    }
    return rc;
}

static int update(void *self, float *params, const float *grads, int records, float lr,
                  dp_err *err)
{
    (void)records;
    dp_strategy *s = self;
    int rc = s->sum_failed ? s->sum_failed
             : s->psgd     ? psgd_sum(s, err)
                           : dp_reducer_finish(s->reducer, err);
    if (s->sum_failed)
        *err = s->sum_err;
    if (rc == 0 && s->sparse)
        rc = sparse_exchange(s, err);
    if (rc < 0) {
        s->broken = rc == DP_RING_BROKEN;
        return -1;
    }
    /* the reduced gradient, the same bits on every replica: the same norm */
    if (s->env->cfg->clip_norm > 0)
        dp_grad_clip(s->m->grads, s->m->n_params, s->env->cfg->clip_norm);
    (void)params, (void)grads; /* m->params and m->grads: the replica's */
    if (dp_replica_apply(s->r, lr, err) < 0)
        return -1;
    s->applied = s->cur;
    if (dp_reducer_choice_new(s->reducer) && leads(s))
        say_choice(s);
    return 0;
}

static const dp_grad_ops grad_ops = {.begin = begin, .ready = ready, .update = update};

static void allreduce_close(dp_strategy *s)
{
    if (!s)
        return;
    dp_replica_close(s->r);
    dp_reducer_close(s->reducer);
    dp_powersgd_close(s->psgd);
    dp_ar_sparse_close(s->sparse);
    if (s->ring_open)
        dp_ring_free(&s->ring);
    free(s->ranks);
    free(s->live);
    free(s->rgen);
    free(s->back);
    free(s->rend);
    free(s->rcur);
    free(s->inc);
    free(s->told);
    free(s->silent);
    free(s->sizes);
    free(s->stats);
    free(s->have);
    free(s->joined);
    free(s->fresh);
    if (s->m)
        s->m->grad_ready = NULL, s->m->batch_sum = NULL;
    free(s);
}

/* A welcomed replica, READY: the leader p's GO (welcome) with the members
 * as they are now, after which the ring's other members may send it
 * segments and it them. */
static int await_go(dp_strategy *s, int p, dp_err *err)
{
    dp_event ev;
    int rc = recv_from(s, p, "its GO after this replica's READY", &ev, err);
    if (rc > 0) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        return dp_errf(err, "lost the leader %s while joining the all-reduce ring (%s)",
                       name_of(s, p), why);
    }
    if (rc < 0)
        return -1;
    if (ev.header.type != DP_WIRE_RING_HELLO || ev.header.offset != HELLO_GO)
        return dp_errf(err, "%s sent frame type %u (offset %llu) instead of GO after this "
                            "replica's READY",
                       name_of(s, p), ev.header.type, (unsigned long long)ev.header.offset);
    return take_plan(s, p, &ev, NULL, err);
}

/* At open every replica says HELLO to every other.  In a fresh run each
 * reads the others' HELLOs, and replica 0, which leads at the start,
 * answers each with the ring's members (those that said it).  A replica
 * restarted into the running ring hears no HELLO: whoever leads now (not
 * necessarily replica 0, which may itself be the one restarted) answers it
 * at the next epoch's start (welcome): the step the ring is at and its
 * generation, then the state; it goes on from there (info->start_step) as
 * an ordinary replica. */
static int handshake(dp_strategy *s, dp_task_info *info, dp_err *err)
{
    if (s->n == 1)
        return 0;
    int me = s->position, n = s->n;
    dp_err e;
    for (int p = 0; p < n; p++) /* not to a spare slot: out of the ring until it says HELLO */
        if (p != me && s->live[p] &&
            dp_transport_send(s->t, s->ranks[p], DP_WIRE_RING_HELLO, 0, HELLO_GREETING, NULL, 0,
                              &e) < 0)
            lose(s, p, e.msg, err);
    unsigned char *heard = calloc((size_t)n, 1);
    if (!heard)
        return dp_errf(err, "out of memory");
    int rc = -1, answered = 0;
    dp_event ev;
    double deadline = dp_now() + s->ring.timeout * (n + 2);
    for (;;) {
        int all = 1;
        for (int p = 0; p < n; p++)
            all &= p == me || !s->live[p] || heard[p];
        if (all && (answered || me == 0))
            break;
        double left = deadline - dp_now();
        if (left <= 0 || dp_transport_poll(s->t, DP_PEER_ANY, left < 1 ? left : 1, &ev, err) < 0) {
            if (left <= 0)
                dp_errf(err, "no answer to this replica's HELLO within %g s (--collective-timeout)",
                        s->ring.timeout * (n + 2));
            goto out;
        }
        if (ev.kind == DP_EVENT_TIMEOUT)
            continue;
        int p = pos_of(s, ev.peer);
        if (p < 0) { /* another role's frame: not the ring's */
            if (ev.kind == DP_EVENT_FRAME)
                dp_transport_skip_payload(s->t, ev.peer, &e);
            continue;
        }
        if (ev.kind == DP_EVENT_PEER_LOST) {
            if (p == 0 && !answered) {
                dp_errf(err, "lost replica 0, %s, before the ring formed (%s)", name_of(s, 0),
                        ev.reason);
                goto out;
            }
            lose(s, p, ev.reason, err);
            continue;
        }
        if (ev.kind != DP_EVENT_FRAME)
            continue;
        if (ev.header.type != DP_WIRE_RING_HELLO) {
            dp_errf(err, "%s sent frame type %u instead of HELLO", name_of(s, p),
                    ev.header.type);
            goto out;
        }
        if (ev.header.length == 0) {
            heard[p] = 1;
            continue;
        }
        /* An answer: the ring's members. */
        s->leader = p;
        if (take_plan(s, p, &ev, NULL, err) < 0)
            goto out;
        answered = 1;
        if (ev.header.step == 0)
            continue; /* a fresh run: the others' HELLOs are still to be read */
        /* Restarted into the running ring: how it sums, its state, then on
         * from there. */
        s->gen = ev.header.offset & ~(GEN_NCCL | GEN_RANK_MASK);
        s->autoc.rank = (int)((ev.header.offset & GEN_RANK_MASK) >> GEN_RANK_SHIFT);
        s->decided = 1;
        if ((ev.header.offset & GEN_NCCL) && !can_comm(s)) {
            dp_errf(err, "the all-reduce ring sums the gradients on the devices (NCCL), "
                         "and this replica's %s: restart it where its GPU is",
                    s->env->cfg->device.kind != DP_DEVICE_CPU ? "device has no collectives"
                                                              : "has no device (--device)");
            goto out;
        }
        s->nccl = (ev.header.offset & GEN_NCCL) != 0;
        if (recv_state(s, p, err) < 0 || dp_replica_from_host(s->r, err) < 0 ||
            dp_transport_send(s->t, s->ranks[p], DP_WIRE_RING_HELLO, (uint64_t)s->applied,
                              HELLO_READY, NULL, 0, err) < 0 ||
            await_go(s, p, err) < 0)
            goto out;
        info->start_step = s->applied;
        const dp_cluster *c = &s->env->node->cluster;
        dp_info("%s: %s the all-reduce ring over %d replica(s) at step %ld, led by %s",
                name_of(s, me),
                dp_cluster_is_spare(c, c->self, s->env->cfg->spare_workers) ? "joined"
                                                                            : "rejoined",
                s->n_live, s->applied, name_of(s, p));
        rc = 0;
        goto out;
    }
    if (me == 0 && !answered) {
        for (int p = 1; p < n; p++)
            if (s->live[p] && send_plan(s, p, DP_WIRE_RING_HELLO, 0, NULL, 1, &e) < 0)
                lose(s, p, e.msg, err);
    }
    rc = 0;
out:
    free(heard);
    return rc;
}

/* Sparse tables go by their rows when that is smaller, by the bound of
 * what a batch of --batch can touch (docs/strategies.md, "Sparse tables
 * under allreduce"): the same plan on every replica, from the same
 * settings.  The buffers take the model's largest batch (a batch redealt
 * after a loss may be larger).  Not with sums on the devices, nor under
 * --allreduce-dense. */
static int sparse_setup(dp_strategy *s, const dp_allreduce_settings *as, dp_err *err)
{
    dp_ar_sparse_plan plan;
    dp_ar_sparse_plan_of(s->m, s->n, s->env->cfg->batch, &plan);
    if (plan.tables == 0)
        return 0;
    const char *why = as->dense   ? "--allreduce-dense"
                      : s->nccl   ? "the gradients are summed on the devices"
                      : s->n == 1 ? "one replica"
                      : !plan.sparse ? "the rows a batch can touch are no smaller"
                                     : NULL;
    if (why) {
        if (leads(s))
            dp_debug("allreduce: %d sparse table(s) of %s (%zu floats) all-reduced whole (%s): "
                     "%llu bytes a replica a step, against at most %llu by rows",
                     plan.tables, s->m->name, plan.table_floats, why,
                     (unsigned long long)plan.dense_bytes,
                     (unsigned long long)plan.sparse_bound);
        return 0;
    }
    size_t lo[DP_SPARSE_MAX], hi[DP_SPARSE_MAX];
    if (dp_ar_sparse_open(&s->sparse, s->m, s->n, s->m->max_batch, err) < 0)
        return -1;
    int k = dp_ar_sparse_ranges(s->sparse, lo, hi);
    if (dp_reducer_skip(s->reducer, lo, hi, k) < 0 ||
        (s->psgd && dp_powersgd_skip(s->psgd, lo, hi, k) < 0))
        return dp_errf(err, "allreduce: %s's sparse tables do not lie in order", s->m->name);
    if (leads(s))
        dp_debug("allreduce: %d sparse table(s) of %s (%zu floats) all-gathered by the rows each "
                 "batch touches: at most %llu bytes a replica a step, against %llu all-reduced "
                 "whole (--allreduce-dense)",
                 plan.tables, s->m->name, plan.table_floats,
                 (unsigned long long)plan.sparse_bound, (unsigned long long)plan.dense_bytes);
    return 0;
}

/* --compress powersgd:RANK over the model's weight matrices (powersgd.h);
 * its first Q from the run's seed, the same on every replica. */
static int psgd_open(dp_strategy *s, dp_err *err)
{
    dp_psgd_matrix mats[DP_POWERSGD_MAX_MATRICES]; /* 6 KiB */
    int k = dp_powersgd_matrices(s->m, s->compress.rank, mats, DP_POWERSGD_MAX_MATRICES,
                                 &s->psgd_plan);
    int rc = k > DP_POWERSGD_MAX_MATRICES || k == 0
                 ? dp_errf(err, "--compress powersgd:%d: model %s has %s", s->compress.rank,
                           s->m->name,
                           k ? "too many weight matrices"
                             : "no weight matrix that factors of this rank make smaller (an "
                               "external model has no layer table to find them in)")
                 : dp_powersgd_open(&s->psgd, s->m->n_params, mats, k, s->env->cfg->seed, err);
    return rc;
}

/* What a step sums, once the sparse tables' way is known (sparse_setup). */
static void psgd_say(const dp_strategy *s)
{
    size_t first, second;
    dp_powersgd_floats(s->psgd, &first, &second);
    dp_info("allreduce: powersgd rank %d: %d of %d weight matrices as factors; %zu + %zu floats "
            "summed a step (factors %zu, whole %zu)%s instead of %zu",
            s->compress.rank, s->psgd_plan.compressed, s->psgd_plan.matrices, first, second,
            s->psgd_plan.factor_floats, first + second - s->psgd_plan.factor_floats,
            s->sparse ? ", the sparse tables by their rows," : "", s->psgd_plan.n_params);
}

/* The error-feedback residual of --compress: the reducer's, or under
 * powersgd its own (powersgd.h); NULL without compression. */
static float *resid_of(dp_strategy *s)
{
    return s->psgd ? dp_powersgd_residual(s->psgd) : dp_reducer_residual(s->reducer);
}

/* --compress powersgd's warm start in a checkpoint: its Q^T's (the summed
 * Q, the same on every replica), padded with zeros to a vector of the
 * parameters, as the strategy vector allreduce.powersgd_q
 * (docs/checkpoints.md, "Compression residuals"; Q is always shorter: a
 * matrix is factored only where r (rows + cols) < rows cols).  Under
 * --compress auto its last float is the rank auto took (allreduce_auto.h
 * keeps the Q's shorter than that). */
#define PSGD_Q_NAME "allreduce.powersgd_q"

static int save_q(dp_strategy *s, dp_train_state *st, dp_err *err)
{
    size_t n = s->m->n_params, first, q;
    dp_powersgd_floats(s->psgd, &first, &q);
    if (!st->vecs) { /* once: the loop's state keeps it between checkpoints */
        st->vec_names = calloc(1, sizeof *st->vec_names);
        st->vecs = malloc(n * sizeof(float));
        if (!st->vec_names || !st->vecs)
            return dp_errf(err, "out of memory for powersgd's warm start (%zu floats)", n);
    }
    snprintf(st->vec_names[0], DP_STATE_NAME_LEN, "%s", PSGD_Q_NAME);
    memcpy(st->vecs, dp_powersgd_q(s->psgd), q * sizeof(float));
    memset(st->vecs + q, 0, (n - q) * sizeof(float));
    if (s->auto_compress)
        st->vecs[n - 1] = (float)s->autoc.rank;
    st->n_vecs = 1;
    return 0;
}

/* --resume with powersgd: the warm start back, so the next step's Q is
 * the uninterrupted run's.  Missing, or with anything but zeros past this
 * plan's Q, the file is not this run's: refused, naming it and the tensor. */
static int restore_q(dp_strategy *s, const dp_task_info *info, dp_err *err)
{
    const dp_train_state *r = s->env->resume;
    if (!r || !s->psgd || info->start_step >= 0)
        return 0;
    const char *path = s->env->resume_path ? s->env->resume_path : "the checkpoint";
    size_t n = s->m->n_params, first, q;
    dp_powersgd_floats(s->psgd, &first, &q);
    for (int i = 0; i < r->n_vecs; i++) {
        if (strcmp(r->vec_names[i], PSGD_Q_NAME) != 0)
            continue;
        const float *v = r->vecs + (size_t)i * n;
        for (size_t j = q; j < n - (s->auto_compress ? 1 : 0); j++)
            if (v[j] != 0)
                return dp_errf(err, "%s: tensor '%s' holds a value at %zu, past the %zu floats "
                                    "of --compress powersgd:%d's factors of model %s",
                               path, PSGD_Q_NAME, j, q, s->compress.rank, s->m->name);
        memcpy(dp_powersgd_q(s->psgd), v, q * sizeof(float));
        return 0;
    }
    return dp_errf(err, "%s: --compress powersgd:%d, but tensor '%s' (its warm start) is "
                        "missing (docs/checkpoints.md, \"Compression residuals\")",
                   path, s->compress.rank, PSGD_Q_NAME);
}

/* --resume with --compress: this replica's own residual from the checkpoint,
 * replica.{position}.residual (docs/checkpoints.md), so the run goes on
 * bit for bit.  The identity made the checkpoint's --compress this run's,
 * so a lossy one's checkpoint holds one per replica; any other count is a
 * damaged or foreign file.  A replica restarted into the running ring
 * (info->start_step set) starts from zeros, as after any rejoin. */
static int restore_residual(dp_strategy *s, const dp_task_info *info, const char *compress,
                            dp_err *err)
{
    const dp_train_state *r = s->env->resume;
    float *resid = resid_of(s);
    if (!r || !resid || info->start_step >= 0)
        return 0;
    if (r->n_residuals != s->n)
        return dp_errf(err, "%s: --compress %s, but it holds the compression residuals of %d "
                            "replica(s) and this run has %d: tensor 'replica.%d.residual' is "
                            "%s (docs/checkpoints.md, \"What a checkpoint holds\")",
                       s->env->resume_path ? s->env->resume_path : "the checkpoint",
                       compress, r->n_residuals, s->n,
                       r->n_residuals < s->n ? r->n_residuals : s->n,
                       r->n_residuals < s->n ? "missing" : "one too many");
    memcpy(resid, r->residuals + (size_t)s->position * s->m->n_params,
           s->m->n_params * sizeof *resid);
    return 0;
}

/* --compress auto: powersgd at a rank or the per-bucket bf16/none, once
 * for the run (allreduce_auto.h, docs/strategies.md "allreduce:
 * compression"): measured over a fresh ring (the fit at step 0, before the
 * first sum); on --resume the checkpoint's (it holds powersgd's warm start
 * exactly when auto took it, the rank in its last float: save_q); for a
 * replica restarted into the running ring the ring's (its welcome).
 * Taken, it is powersgd:RANK from here on, as if asked for; a re-formed
 * ring keeps it. */
static int auto_rank_ok(int rank)
{
    static const int ranks[DP_AUTO_PSGD_N_RANKS] = DP_AUTO_PSGD_RANKS;
    for (int i = 0; i < DP_AUTO_PSGD_N_RANKS; i++)
        if (rank == ranks[i])
            return 1;
    return rank == 0;
}

static int auto_open(dp_strategy *s, const dp_allreduce_settings *as, const dp_task_info *info,
                     dp_err *err)
{
    dp_auto_compress *a = &s->autoc;
    if (!s->auto_compress)
        return 0;
    const dp_train_state *r = s->env->resume;
    const char *from = NULL;
    if (dp_allreduce_overlap(as) == DP_OVERLAP_ON) {
        a->rank = 0;
        snprintf(a->why, sizeof a->why, "auto: bf16 or none per bucket (powersgd not "
                                        "considered: --overlap on reduces beside backprop)");
    } else if (info->start_step >= 0) {
        from = "the running ring's choice";
    } else if (r) {
        a->rank = 0;
        for (int i = 0; i < r->n_vecs; i++) {
            if (strcmp(r->vec_names[i], PSGD_Q_NAME) != 0)
                continue;
            float v = r->vecs[(size_t)i * s->m->n_params + s->m->n_params - 1];
            a->rank = v >= 1 && v <= 1024 && v == (float)(int)v ? (int)v : -1;
            if (a->rank < 0)
                return dp_errf(err, "%s: tensor '%s' does not end with the rank --compress auto "
                                    "took (its last float is %g; docs/checkpoints.md, "
                                    "\"Compression residuals\")",
                               s->env->resume_path ? s->env->resume_path : "the checkpoint",
                               PSGD_Q_NAME, (double)v);
        }
        from = "the checkpoint's choice";
    } else if (dp_auto_compress_decide(a, &s->ring, s->m, as->bucket_bytes, s->env->cfg->seed, 0,
                                       err) < 0) {
        return -1;
    }
    if (from && !auto_rank_ok(a->rank))
        return dp_errf(err, "%s: --compress auto took rank %d, not one it chooses",
                       info->start_step >= 0 ? name_of(s, s->leader)
                       : s->env->resume_path ? s->env->resume_path
                                             : "the checkpoint",
                       a->rank);
    if (from)
        snprintf(a->why, sizeof a->why, "auto: %s%.0d (%s)",
                 a->rank ? "powersgd:" : "bf16 or none per bucket", a->rank, from);
    if (s->position == 0)
        dp_debug("all-reduce: compress %s", a->why);
    if (!a->rank)
        return 0;
    char *bf16 = strstr(s->ring.why, "; compress auto:"); /* the fit's per-bucket line: moot */
    if (bf16)
        *bf16 = 0;
    s->compress = (dp_compress){.kind = DP_COMPRESS_POWERSGD, .rank = a->rank};
    dp_ring_set_compress(&s->ring, &s->compress);
    return psgd_open(s, err);
}

static int allreduce_open(dp_strategy **out, const dp_run_env *env, dp_task_info *info,
                          dp_err *err)
{
    const dp_cluster *c = &env->node->cluster;
    const dp_train_config *cfg = env->cfg;
    if (c->count[DP_ROLE_PS] > 0)
        return dp_errf(err, "allreduce keeps every parameter on every worker and needs no ps "
                            "task (the spec has %d). Hint: launch without --ps",
                       c->count[DP_ROLE_PS]);
    dp_role role = env->node->self->role;
    if (role != DP_ROLE_CHIEF && role != DP_ROLE_WORKER)
        return dp_errf(err, "allreduce runs on chief and worker tasks only");
    if (!env->train) /* the replicas' shard sizes come from it */
        return dp_errf(err, "allreduce: a replica needs the training split");
    dp_strategy *s = calloc(1, sizeof *s);
    if (!s)
        return dp_errf(err, "out of memory");
    s->env = env;
    s->info = info;
    s->m = env->model;
    s->t = env->node->transport;
    int n = c->count[DP_ROLE_CHIEF] + c->count[DP_ROLE_WORKER];
    s->n = n;
    s->ranks = malloc((size_t)n * sizeof *s->ranks);
    s->sizes = malloc((size_t)n * sizeof *s->sizes);
    s->live = malloc((size_t)n);
    s->rgen = calloc((size_t)n, sizeof *s->rgen);
    s->rend = calloc((size_t)n, 1);
    s->rcur = calloc((size_t)n, sizeof *s->rcur);
    s->inc = calloc((size_t)n, sizeof *s->inc);
    s->told = calloc((size_t)n, 1);
    s->silent = calloc((size_t)n, 1);
    s->back = calloc((size_t)n, 1);
    s->stats = calloc((size_t)n, sizeof *s->stats);
    s->have = calloc((size_t)n, 1);
    s->joined = malloc((size_t)n * sizeof *s->joined);
    s->fresh = calloc((size_t)n, 1);
    if (!s->ranks || !s->sizes || !s->live || !s->rgen || !s->rend || !s->rcur || !s->inc || !s->told || !s->silent || !s->back ||
        !s->stats || !s->have ||
        !s->joined || !s->fresh) {
        allreduce_close(s);
        return dp_errf(err, "out of memory");
    }
    /* The replicas are the chief (if any) and the workers, in rank order. */
    int k = 0;
    for (int i = 0; i < c->n_tasks; i++)
        if (c->tasks[i].role == DP_ROLE_CHIEF || c->tasks[i].role == DP_ROLE_WORKER) {
            if (i == c->self)
                s->position = k;
            s->ranks[k++] = i;
        }
    memset(s->live, 1, (size_t)n);
    for (int p = 0; p < n; p++)
        s->joined[p] = -1;
    s->n_live = n;
    /* Spare slots are out of the ring until their task says HELLO, as a
     * lost replica that comes back; this replica is in its own ring. */
    for (int p = 0; p < n; p++)
        if (p != s->position && dp_cluster_is_spare(c, s->ranks[p], cfg->spare_workers)) {
            s->live[p] = 0;
            s->fresh[p] = 1;
            s->n_live--;
        }
    s->ring.timeout = cfg->collective_timeout > 0 ? cfg->collective_timeout : 300;
    const dp_allreduce_settings *as = dp_strategy_settings(cfg, &dp_allreduce_conf);
    s->no_nccl = as->no_nccl || !dp_env_fallback_on(DP_ENV_NCCL);
    s->algo = dp_allreduce_algo_of(as);
    dp_allreduce_compress_of(as, &s->compress);
    s->auto_compress = s->compress.kind == DP_COMPRESS_AUTO;
    if (env->resume)
        s->applied = env->resume->step;
    if (role == DP_ROLE_CHIEF)
        snprintf(info->label, sizeof info->label, "Chief");
    else
        snprintf(info->label, sizeof info->label, "Worker %d", env->node->self->index);
    /* The device first: whether it has collectives decides, when the ring
     * is built, where the gradients are summed (comm_setup). */
    if (dp_strategy_replica_open(env, info->label, 1, &s->r, err) < 0) {
        allreduce_close(s);
        return -1;
    }
    s->opt = dp_replica_optim(s->r);
    /* A replica restarted into the running ring takes its state here. */
    if (s->compress.kind == DP_COMPRESS_POWERSGD && psgd_open(s, err) < 0) {
        allreduce_close(s);
        return -1;
    }
    int built = handshake(s, info, err) < 0 ? -1 : rebuild_ring(s, err);
    if (built == AGAIN)
        dp_errf(err, "the all-reduce ring re-formed while this replica joined it");
    if (built != 0 || auto_open(s, as, info, err) < 0 ||
        dp_reducer_open(&s->reducer, &s->ring, s->m->grads, s->m->n_params, as->bucket_bytes,
                        s->psgd ? DP_OVERLAP_OFF : dp_allreduce_overlap(as), spare_cores(s),
                        err) < 0 ||
        dp_reducer_compress(s->reducer, err) < 0 ||
        restore_residual(s, info, as->compress, err) < 0 || restore_q(s, info, err) < 0) {
        allreduce_close(s);
        return -1;
    }
    /* The leader writes every replica's residual into its checkpoints; any
     * replica may come to lead, so each has room for them. */
    if (resid_of(s))
        info->residuals = n;
    /* The ring has decided how it sums, for the whole run.  Summed on the
     * host, each step's copies go through the model's arrays, pinned.
     * Summed on the devices, the state (resumed, or a rejoining replica's)
     * goes there, and --ema's average is kept there too (the loop cannot:
     * the host's weights are not live). */
    if (dp_replica_settle(s->r, s->nccl ? DP_STATE_LOCAL : DP_STATE_HOST, cfg->ema,
                          env->resume ? env->resume->ema : NULL, err) < 0) {
        allreduce_close(s);
        return -1;
    }
    if (sparse_setup(s, as, err) < 0) {
        allreduce_close(s);
        return -1;
    }
    if (s->psgd && leads(s))
        psgd_say(s);
    /* The loop deals shard position of n at batch cfg->batch until the
     * replicas change (deal). */
    s->policy = n > 1 ? cfg->shard : DP_SHARD_OFF;
    s->batch = cfg->batch;
    s->dealt = n;
    for (int w = 0; w < n; w++)
        s->sizes[w] = shard_records(s, s->policy == DP_SHARD_OFF ? 0 : w,
                                    s->policy == DP_SHARD_OFF ? 1 : n);
    /* Backprop tells the reducer as each layer's gradients are final. */
    s->m->grad_ready = ready;
    s->m->grad_ready_ctx = s;
    if (as->sync_bn) {
        s->m->batch_sum = batch_sum;
        s->m->batch_sum_ctx = s;
    }
    info->part = DP_PART_TRAINER;
    /* The leader evaluates; every other replica evaluates silently too, so
     * that whichever takes the lead holds the history (docs/faults.md). */
    info->evaluator = leads(s);
    info->standby = n > 1;
    info->live_params = dp_replica_host_live(s->r);
    info->shard_index = s->position;
    info->shard_count = n;
    info->replicas = n;
    info->replica = s->r;
    if (leads(s))
        dp_info("%s: allreduce over %d replicas (%s), batch %d per replica (global %d), "
                "buckets of %zu KiB, overlap %s", env->node->self->name, n,
                s->nccl                 ? "NCCL on the devices"
                : s->ring.use_fast_path ? "the transport's collective"
                                        : "ring over the transport",
                cfg->batch, cfg->batch * n, as->bucket_bytes >> 10,
                as->sync_bn                        ? "off (--sync-bn sums on the training thread)"
                : dp_allreduce_overlap(as) == DP_OVERLAP_ON  ? "on (forced)"
                : dp_allreduce_overlap(as) == DP_OVERLAP_OFF ? "off (forced)"
                                                   : "auto (measured over the first steps)");
    *out = s;
    return 0;
}

static int allreduce_step(dp_strategy *s, const float *x, const uint8_t *y, int n, float lr,
                          long step, dp_step_out *out, dp_err *err)
{
    if (s->n_live < s->n)
        watch_lost(s);
    if (s->dropped)
        return dp_errf(err, "the all-reduce ring dropped this replica (it was silent past the "
                            "heartbeat timeout: frozen or cut off) and went on without it; it "
                            "leaves the run");
    if (s->sparse)
        dp_ar_sparse_rows(s->sparse, s->m, x, n);
    for (;;) {
        s->broken = 0;
        if ((s->nccl ? device_step(s, n, lr, step, out, err)
                     : dp_data_parallel_step(s->m, s->r, &grad_ops, s, x, y, n, lr, step, out,
                                             err)) == 0)
            return 0;
        if (!s->broken)
            return -1;
        dp_err why = *err;
        if (s->nccl)
            dp_warn("%s; re-forming the all-reduce ring", why.msg);
        if ((s->nccl ? reform_all(s, err) : ring_broke(s, &why, err)) < 0)
            return -1;
        /* Applied by some replica before the ring broke: now by all.  Else
         * every survivor retries it over the new ring (on a device, the
         * batch the loop staged, staged again). */
        if (s->applied >= step)
            return 0;
        if (n > 0 && dp_replica_restage(s->r, err) < 0)
            return -1;
    }
}

/* The data shard of each epoch: this replica's place among the live ones.
 * The loop then bites ceil(share / steps per epoch) records a step (redeal),
 * which the step weights must know too. */
static int allreduce_deal(dp_strategy *s, int epoch, int *index, int *count, dp_err *err)
{
    (void)epoch, (void)err;
    int i = 0;
    for (int p = 0; p < s->position; p++)
        i += s->live[p];
    *index = i;
    *count = s->n_live;
    if (s->n_live == s->dealt)
        return 0;
    s->batch = dp_redeal_batch(s->env->cfg->batch, s->n, s->n_live, s->env->n_train,
                               s->env->steps_per_epoch, s->m->max_batch);
    s->dealt = s->n_live;
    for (int p = 0, j = 0; p < s->n; p++)
        s->sizes[p] = s->live[p] ? shard_records(s, j++, s->n_live) : 0;
    return 0;
}

/* Whether member p, by its last REPORT, is past the end of the epoch whose
 * last step is `end`: the leader lost after it sent p the epoch's plan. */
static int past_end(const dp_strategy *s, int p, long end)
{
    return !s->rend[p] && s->rcur[p] > end;
}

/* The leader's end of an epoch: every member's figures (but those past
 * it), summed, and the ring's members as the answer. */
static int lead_epoch_end(dp_strategy *s, dp_epoch_stats *st, dp_err *err)
{
    long end = st->steps;
    double sum[3] = {st->loss_sum, st->records, st->correct};
    for (int p = 0; p < s->n; p++) {
        while (p != s->position && s->live[p] && !s->have[p] && !past_end(s, p, end)) {
            dp_event ev;
            int rc = recv_from(s, p, "its epoch figures", &ev, err);
            if (rc < 0)
                return -1;
            if (rc > 0)
                break;
            if (ev.header.type == DP_WIRE_RING_STATS && ev.header.length == 24) {
                if (take_stats(s, p, err) < 0)
                    return -1;
            } else if (ev.header.type == DP_WIRE_RING_RESET) {
                /* p lost another replica in the epoch's last step. */
                if (ev.header.step > s->rgen[p])
                    s->rgen[p] = ev.header.step;
                if (reform_all(s, err) < 0)
                    return -1;
            } else {
                return dp_errf(err, "%s sent frame type %u at the end of the epoch",
                               name_of(s, p), ev.header.type);
            }
        }
    }
    for (int p = 0; p < s->n; p++) {
        if (s->have[p])
            for (int i = 0; i < 3; i++)
                sum[i] += s->stats[p][i];
        s->have[p] = 0;
    }
    if (s->n_live < s->n)
        take_back(s);
    /* Those back are welcomed first (their plan and the state, then their
     * READY), so no member sends one a ring frame before it is in. */
    if (welcome(s, err) < 0)
        return -1;
    /* the plan, and after it the run's figures (offset 1): every replica's
     * history holds the same rows, should it come to lead */
    uint8_t buf[PLAN_MAX + 24];
    size_t len = plan_bytes(s, buf, 0, NULL);
    put_figures(buf + len, sum);
    for (int p = 0; p < s->n; p++) {
        dp_err e;
        if (p != s->position && s->live[p] && s->joined[p] != s->applied &&
            !past_end(s, p, end) &&
            dp_transport_send(s->t, s->ranks[p], DP_WIRE_RING_PLAN, (uint64_t)s->applied, 1, buf,
                              len + 24, &e) < 0)
            lose(s, p, e.msg, err);
    }
    if (s->ring.n != s->n_live && rebuild_or_reform(s, err) < 0)
        return -1;
    st->loss_sum = sum[0];
    st->records = sum[1];
    st->correct = sum[2];
    return 0;
}

/* The epoch's figures go to the leader, which sums them and answers with
 * the ring's members, so every replica starts the next epoch (and deals its
 * data) with the same ring.  A leader lost meanwhile: the ring re-forms,
 * and the figures go to the new one, unless it was past the epoch's end
 * already (it had the old leader's plan: so had this one, in effect). */
static int allreduce_epoch_end(dp_strategy *s, int epoch, dp_epoch_stats *st, dp_err *err)
{
    (void)epoch;
    if (s->n == 1)
        return 0;
    int rc = -1, sent_to = -1;
    long end = st->steps;
    s->in_end = 1;
    for (;;) {
        if (leads(s)) {
            rc = lead_epoch_end(s, st, err);
            break;
        }
        int lead = s->leader;
        if (sent_to != lead) {
            uint8_t b[24];
            double v[3] = {st->loss_sum, st->records, st->correct};
            put_figures(b, v);
            dp_err e;
            sent_to = lead;
            if (dp_transport_send(s->t, s->ranks[lead], DP_WIRE_RING_STATS, (uint64_t)st->steps,
                                  0, b, sizeof b, &e) < 0) {
                lose(s, lead, e.msg, err);
                if (reform_all(s, err) < 0)
                    break;
                if (!leads(s) && past_end(s, s->leader, end)) {
                    rc = 0;
                    break;
                }
                continue;
            }
        }
        dp_event ev;
        int r = recv_from(s, lead, "the end of the epoch", &ev, err);
        if (r < 0)
            break;
        if (r > 0 || ev.header.type == DP_WIRE_RING_RESET) {
            /* The leader lost, or re-forming the ring: take part, then wait on
             * (the one that leads now). */
            if (r == 0 && ev.header.step > s->rgen[lead])
                s->rgen[lead] = ev.header.step;
            if (reform_all(s, err) < 0)
                break;
            if (!leads(s) && past_end(s, s->leader, end)) {
                rc = s->ring.n != s->n_live ? rebuild_or_reform(s, err) : 0;
                break;
            }
            continue;
        }
        if (ev.header.type != DP_WIRE_RING_PLAN) {
            dp_errf(err, "%s sent frame type %u at the end of the epoch", name_of(s, lead),
                    ev.header.type);
            break;
        }
        uint8_t buf[PLAN_MAX + 24];
        size_t got = ev.header.length;
        if (ev.header.offset != 1 || got < 4 + 24 || got > sizeof buf) {
            dp_errf(err, "%s sent a malformed epoch plan (%zu bytes)", name_of(s, lead), got);
            break;
        }
        if (dp_transport_recv_payload(s->t, s->ranks[lead], buf, got, err) < 0 ||
            apply_plan(s, lead, buf, got - 24, NULL, err) < 0)
            break;
        double sum[3];
        get_figures(buf + got - 24, sum);
        st->loss_sum = sum[0];
        st->records = sum[1];
        st->correct = sum[2];
        rc = s->ring.n != s->n_live ? rebuild_or_reform(s, err) : 0;
        break;
    }
    s->in_end = 0;
    return rc;
}

static const float *allreduce_params(dp_strategy *s, dp_weights which, dp_err *err)
{
    return dp_replica_weights(s->r, which == DP_WEIGHTS_AVERAGE, err);
}

/* At a checkpoint with --compress: every replica's residual goes to the
 * leader, which writes them all (replica.{p}.residual; docs/checkpoints.md),
 * since unlike the rest of the state each replica's is its own.  Every
 * replica sends before it takes another step, so the leader reads each one's
 * ahead of anything of the next step.  A replica out of the ring, lost on
 * the way, or welcomed back at this very step (it starts after it, and
 * takes no part in its checkpoint) is written as zeros: what a replica that
 * rejoins starts from. */
static int gather_residuals(dp_strategy *s, long step, dp_train_state *st, dp_err *err)
{
    float *resid = resid_of(s);
    size_t n = s->m->n_params, bytes = n * sizeof *resid;
    if (!leads(s)) {
        /* A leader lost on the way writes no checkpoint of this step; the
         * next one is the new leader's. */
        struct iovec iov = {resid, bytes};
        dp_err e;
        if (dp_transport_sendv(s->t, s->ranks[s->leader], DP_WIRE_RING_RESID, (uint64_t)step, 0,
                               &iov, 1, &e) < 0)
            return lose(s, s->leader, e.msg, err);
        return 0;
    }
    if (st->n_residuals != s->n || !st->residuals)
        return dp_errf(err, "allreduce: the checkpoint's state has room for %d replicas' "
                            "residuals, the ring %d", st->n_residuals, s->n);
    char what[96];
    snprintf(what, sizeof what, "its compression residual at checkpoint step %ld", step);
    for (int p = 0; p < s->n; p++) {
        float *dst = st->residuals + (size_t)p * n;
        if (p == s->position) {
            memcpy(dst, resid, bytes);
            continue;
        }
        memset(dst, 0, bytes);
        /* one welcomed back at this step (an epoch's end) starts after it */
        while (s->live[p] && s->joined[p] < step) {
            dp_event ev;
            int rc = recv_from(s, p, what, &ev, err);
            if (rc < 0)
                return -1;
            if (rc > 0)
                break;
            if (ev.header.type == DP_WIRE_RING_RESID && ev.header.step == (uint64_t)step &&
                ev.header.length == bytes) {
                if (dp_transport_recv_payload(s->t, s->ranks[p], dst, bytes, err) < 0) {
                    memset(dst, 0, bytes);
                    if (lose(s, p, err->msg, err) < 0)
                        return -1;
                }
                break;
            }
            if (ev.header.type == DP_WIRE_RING_RESET) {
                /* p lost another replica in the step before: take part, and
                 * p, through with that step, sends its residual after */
                if (ev.header.step > s->rgen[p])
                    s->rgen[p] = ev.header.step;
                if (reform_all(s, err) < 0)
                    return -1;
                continue;
            }
            return dp_errf(err, "%s sent frame type %u (step %llu, %llu bytes) instead of %s "
                                "(%zu bytes)",
                           name_of(s, p), ev.header.type, (unsigned long long)ev.header.step,
                           (unsigned long long)ev.header.length, what, bytes);
        }
    }
    return 0;
}

/* The leader holds the whole state: params and optimiser are the same on
 * every replica.  The loop's st->ema is ours to fill where the
 * state lives on the devices (live_params 0).  With --compress every
 * replica hands in its residual first. */
static int allreduce_save(dp_strategy *s, long step, dp_train_state *st, dp_err *err)
{
    int lead = leads(s); /* one that sees the leader lost here writes nothing yet */
    if (resid_of(s) && gather_residuals(s, step, st, err) < 0)
        return -1;
    if (!lead)
        return 0;
    if (s->psgd && save_q(s, st, err) < 0)
        return -1;
    return dp_replica_state(s->r, st->params, st->slots, st->n_slots, &st->optim_t, st->ema,
                            err) < 0
               ? -1
               : 1;
}

/* After the last step the leader still has the run's result to write (the
 * test evaluation, the table, --save): the others wait for it to end in
 * order (its BYE).  Lost instead, the lowest survivor takes the lead, and
 * the loop, which reads info->evaluator after finish, writes the result
 * there.  Only where the transport tells a BYE from a death (TCP, which
 * has incarnations). */
static int await_result(dp_strategy *s, dp_err *err)
{
    if (s->n == 1 || dp_transport_incarnation(s->t) == 0)
        return 0;
    while (!leads(s)) {
        int lead = s->leader;
        dp_event ev;
        if (dp_transport_recv(s->t, s->ranks[lead], "its result", s->ring.timeout * (s->n + 2),
                              &ev, err) == 0) {
            /* a late frame of the run (a RESET of a round over): read past */
            if (dp_transport_skip_payload(s->t, s->ranks[lead], err) < 0 &&
                dp_transport_peer_left(s->t, s->ranks[lead]))
                return 0;
            continue;
        }
        if (ev.kind == DP_EVENT_TIMEOUT)
            return dp_errf(err, "the leader %s did not end within %g s of the last step",
                           name_of(s, lead), s->ring.timeout * (s->n + 2));
        if (dp_transport_peer_left(s->t, s->ranks[lead]))
            return 0; /* it ended well: its result is written */
        lose(s, lead, err->msg, err);
        if (leads(s)) {
            take_lead(s);
            dp_warn("fault: %s writes the run's result: the leader was lost after the last "
                    "step", name_of(s, s->position));
        }
    }
    return 0;
}

/* Mirrored replicas must end identical: each says what it holds. */
static int allreduce_finish(dp_strategy *s, long steps, dp_err *err)
{
    if (dp_replica_to_host(s->r, err) < 0)
        return -1;
    uint32_t crc = dp_crc32c(0, s->m->params, s->m->n_params * sizeof *s->m->params);
    long early, total;
    dp_reducer_counts(s->reducer, &early, &total);
    dp_overlap_choice c;
    dp_reducer_choice(s->reducer, &c);
    dp_metrics_event(s->env->metrics, "replica", DP_F_INT, "params_crc32c", (long)crc, DP_F_INT,
                     "steps", steps, DP_F_INT, "buckets", total, DP_F_INT, "buckets_overlapped",
                     early, DP_F_STR, "overlap",
                     !c.decided ? "measuring" : c.overlap ? "on" : "off", DP_F_STR,
                     "overlap_reason", c.reason, DP_F_NUM, "overlap_step_ms", c.overlap_ms,
                     DP_F_NUM, "inline_step_ms", c.inline_ms, DP_F_NUM, "overlap_ratio", c.ratio,
                     DP_F_INT, "spare_cores", (long)c.spare_cores, DP_F_STR, "allreduce_algo",
                     s->ring.why, DP_F_INT, "allreduce_ring", (long)s->ring.calls[DP_ALGO_RING],
                     DP_F_INT, "allreduce_direct", (long)s->ring.calls[DP_ALGO_DIRECT], DP_F_INT,
                     "allreduce_hier", (long)s->ring.calls[DP_ALGO_HIER], DP_F_STR, "compress",
                     s->auto_compress ? s->autoc.why : dp_compress_kind_name(s->compress.kind),
                     DP_F_INT, "compressed_buckets",
                     (long)s->ring.coded_calls + s->psgd_sums, DP_F_INT, "ring_bytes",
                     (long)s->ring.bytes_sent, DP_F_END);
    if (leads(s) && !s->psgd) /* powersgd sums no buckets */
        dp_info("%s: %ld of %ld gradient buckets started reducing while backprop ran",
                s->env->node->self->name, early, total);
    /* One that came back in the last epoch takes the final state: it ends
     * with the same bits. */
    if (leads(s) && s->n_live < s->n) {
        take_back(s);
        return welcome(s, err);
    }
    return await_result(s, err);
}

/* Drained after `steps`, which every replica completed (its last ring
 * step's sends are out before the BYE the node says at close): nothing to
 * tell; each survivor takes the BYE as this replica leaving (lose), and a
 * leader that drains is followed by the lowest survivor, as a lost one. */
static int allreduce_leave(dp_strategy *s, long steps, dp_err *err)
{
    (void)s, (void)steps, (void)err;
    return 0;
}

const dp_strategy_ops dp_strategy_allreduce = {
    .name = "allreduce",
    .conf = &dp_allreduce_conf,
    .summary = "synchronous ring all-reduce of gradients, mirrored replicas",
    .cluster = 1,
    .refuses = DP_ROLE_BIT(DP_ROLE_PS),
    .data_parallel = 1,
    .devices = 1,
    .buffers = 1,
    .no_clip_device = "with collectives the sum and the update run on the devices, and the "
                      "norm is summed on the host",
    .survives = DP_ROLE_BIT(DP_ROLE_WORKER) | DP_ROLE_BIT(DP_ROLE_CHIEF),
    .open = allreduce_open,
    .step = allreduce_step,
    .deal = allreduce_deal,
    .epoch_end = allreduce_epoch_end,
    .params = allreduce_params,
    .save = allreduce_save,
    .finish = allreduce_finish,
    .leave = allreduce_leave,
    .close = allreduce_close,
};
