/* Parameter-server replicas (--ps-replicas 2; docs/faults.md, "Parameter
 * servers").  Shard s has a backup on the next ps task, which holds the
 * shard as a server of its own (s->backup of that task).
 *
 * The primary forwards every change of its shard, in order: the gradient
 * and rate it applied, or the new parameters of an average, with its worker
 * table (each worker's clock and the client clock of its newest push
 * applied).  The backup applies the same op with the same code, so its
 * parameters, optimiser state, moving average and update count equal the
 * primary's bit for bit, and acknowledges.  A reply to a worker waits until
 * the backup acknowledged every update before it (dp_ps_replica_holds): what
 * a worker saw answered is on the backup.  The primary does not stop while
 * it waits; it serves on, and the held replies go out with the ack.
 *
 * When the primary is lost, the backup takes the shard over.  Clients re-send
 * the request the primary had not answered (ps.c, the client's failover); a
 * push the backup has already applied (the same client clock as that
 * worker's newest applied push) is answered, not applied again.  A client
 * can reach the backup before the backup has read all the primary sent it,
 * so the backup first reads the primary's stream to its end. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "downpour/clock.h"
#include "downpour/log.h"
#include "downpour/wire.h"
#include "strategy/ps_rules.h"

#define REP_HEAD 16       /* [u32 op][f32 lr][u32 workers][u32 reserved = 0] */
#define REP_WORKER 16     /* per worker: [u64 clock][u64 applied] */
#define CONNECT_WAIT 60.0 /* s a ps task waits for the ps tasks it replicates with */
#define DRAIN_WAIT 30.0   /* s a backup reads what its lost primary still sent */

typedef struct dp_ps_server server;

static const char *name(const server *s, int rank) { return dp_transport_peer_name(s->t, rank); }
static const char *self(const server *s) { return name(s, dp_transport_rank(s->t)); }

static size_t table_bytes(const server *s) { return REP_HEAD + (size_t)s->n_workers * REP_WORKER; }

static int start_ticker(server *s, dp_err *err); /* the stop watch, below */

int dp_ps_replica_open(server *s, const dp_cluster *c, const dp_ps_layout *layout,
                       const dp_optim_config *optim, const dp_ps_start *start, size_t n_params,
                       dp_err *err)
{
    /* A stopped server leaves when it wakes where its clients go elsewhere:
     * to a backup, or to a restarted server (ps.c await_restart). */
    if ((s->cfg.replicas >= 2 || s->cfg.ps_wait > 0) && s->cfg.heartbeat_timeout > 0 &&
        start_ticker(s, err) < 0)
        return -1;
    if (s->cfg.replicas < 2)
        return 0;
    int me = dp_transport_rank(s->t), backs = -1;
    for (int i = 0; i < layout->n_shards; i++)
        if (layout->backup[i] == me)
            backs = i;
    double deadline = dp_now() + CONNECT_WAIT;
    if (s->shard >= 0 && layout->backup[s->shard] >= 0) {
        s->backup_rank = layout->backup[s->shard];
        if (!(s->table = malloc(table_bytes(s))))
            return dp_errf(err, "out of memory");
        if (dp_transport_connect(s->t, s->backup_rank, deadline, err) < 0)
            return -1;
    }
    if (backs < 0)
        return 0;
    dp_ps_config cfg = s->cfg;
    cfg.replicas = 1; /* the backup forwards nothing */
    server *b;
    if (dp_ps_shard_open(&b, s->t, c, layout, &cfg, s->rules, optim, start, n_params, backs,
                         err) < 0)
        return -1;
    s->backup = b;
    b->primary_rank = layout->rank[backs];
    if (!(b->table = malloc(table_bytes(b))))
        return dp_errf(err, "out of memory");
    if (dp_transport_connect(s->t, b->primary_rank, deadline, err) < 0)
        return -1;
    dp_info("%s backs up shard %d, parameters [%zu, %zu), for %s", self(s), backs, b->lo,
            b->lo + b->n, name(s, b->primary_rank));
    return 0;
}

static int stopped(const server *s);

/* This task answers nobody any more, for either shard it holds. */
static void fence(server *s)
{
    s->fenced = 1;
    if (s->backup)
        s->backup->fenced = 1;
}

/* The backup is gone: the shard goes on alone, and every held reply goes out.
 * Unless this task was stopped (below): then the backup may have taken the
 * shard over, and the held replies must never go (the clients re-send them
 * there). */
static void lose_backup(server *s)
{
    s->backup_rank = -1;
    if (stopped(s)) {
        fence(s);
        return;
    }
    for (int i = 0; i < s->n_workers; i++)
        if (s->w[i].owed)
            dp_ps_send_reply(s, &s->w[i]);
}

static void release_owed(server *s)
{
    for (int i = 0; i < s->n_workers; i++)
        if (s->w[i].owed && s->w[i].owed <= s->ack_seq)
            dp_ps_send_reply(s, &s->w[i]);
}

int dp_ps_replica_holds(server *s, dp_ps_worker *w)
{
    if (s->backup_rank < 0 || s->fwd_seq <= s->ack_seq)
        return 0;
    w->owed = s->fwd_seq;
    return 1;
}

void dp_ps_replica_forward(server *s, int op, const float *v, float lr)
{
    if (s->backup_rank < 0)
        return;
    uint8_t *p = s->table;
    dp_put_u32(p, (uint32_t)op);
    dp_put_f32(p + 4, lr);
    dp_put_u32(p + 8, (uint32_t)s->n_workers);
    dp_put_u32(p + 12, 0);
    for (int i = 0; i < s->n_workers; i++) {
        uint8_t *q = p + REP_HEAD + (size_t)i * REP_WORKER;
        dp_put_u64(q, (uint64_t)s->w[i].clock);
        dp_put_u64(q + 8, s->w[i].applied);
    }
    /* an update of sparse rows carries them after the dense floats: a rows
     * section (ps_rules.h), as a push does */
    int rows = op == DP_PS_OP_APPLY && s->n_tab > 0;
    struct iovec iov[3] = {{s->table, table_bytes(s)}, {(void *)v, s->n * sizeof(float)},
                           {s->fwd, rows ? dp_ps_rows_put(s) : 0}};
    dp_err why;
    if (dp_transport_sendv(s->t, s->backup_rank, DP_WIRE_REPLICATE, ++s->fwd_seq, s->lo, iov,
                           2 + rows, &why) < 0) {
        dp_warn("fault: cannot forward update %llu of shard %d to its backup %s (%s); %s serves "
                "the shard without a backup", (unsigned long long)s->fwd_seq, s->shard,
                name(s, s->backup_rank), why.msg, self(s));
        lose_backup(s);
    }
}

/* The backup's side of REPLICATE: the same op, the primary's worker table,
 * then the ack.  Everything is read before anything changes, so a primary
 * that dies in the middle of a frame leaves the shard as it was. */
static int apply_forwarded(server *s, const dp_event *ev, dp_err *err)
{
    server *b = s->backup;
    const char *from = name(s, ev->peer);
    if (!b || ev->peer != b->primary_rank || ev->header.offset != b->lo) {
        /* An old primary after the backup took over (it was cut off, not
         * dead): what it forwards counts for nothing. */
        dp_warn("ignoring an update from %s of the shard at %llu: %s does not back it up for it",
                from, (unsigned long long)ev->header.offset, self(s));
        return dp_transport_skip_payload(s->t, ev->peer, err);
    }
    size_t tb = table_bytes(b), want = tb + b->n * sizeof(float);
    if (b->n_tab ? ev->header.length < want : ev->header.length != want)
        return dp_errf(err, "%s forwarded %llu bytes for shard %d; expected %zu%s", from,
                       (unsigned long long)ev->header.length, b->shard, want,
                       b->n_tab ? " and its rows" : "");
    dp_err why;
    if (dp_transport_recv_payload(s->t, ev->peer, b->table, tb, &why) < 0 ||
        dp_transport_recv_payload(s->t, ev->peer, b->scratch, b->n * sizeof(float), &why) < 0)
        return 0; /* the primary is gone: its loss comes next */
    uint32_t op = dp_get_u32(b->table), workers = dp_get_u32(b->table + 8);
    float lr = dp_get_f32(b->table + 4);
    if (workers != (uint32_t)b->n_workers || (op != DP_PS_OP_APPLY && op != DP_PS_OP_SET))
        return dp_errf(err, "%s forwarded op %u for %u workers; this run has %d", from, op,
                       workers, b->n_workers);
    for (int k = 0; k < b->n_tab; k++)
        b->tab[k].up_n = 0;
    if (ev->header.length > want &&
        dp_ps_rows_read(b, ev->peer, ev->header.length - want, 1, from, err) < 0)
        return -1;
    /* The update is whole here and is applied before anything else is
     * handled, so it is acknowledged first: the primary's reply does not
     * wait for this task's optimiser step, which runs beside the primary's. */
    dp_err ignore; /* a primary that cannot hear the ack is lost: that comes as an event */
    dp_transport_send(s->t, ev->peer, DP_WIRE_REPLICATE_ACK, ev->header.step, b->lo, NULL, 0,
                      &ignore);
    /* dp_ps_apply's and dp_ps_changed's steps, but for the forward: the
     * backup forwards nothing */
    dp_ps_note_applied(b);
    if (op == DP_PS_OP_APPLY) {
        dp_optim_apply(&b->opt, b->params, b->scratch, lr);
        dp_ps_rows_apply(b, lr);
    } else
        memcpy(b->params, b->scratch, b->n * sizeof(float));
    dp_ps_shard_changed(b);
    for (int i = 0; i < b->n_workers; i++) {
        const uint8_t *q = b->table + REP_HEAD + (size_t)i * REP_WORKER;
        b->w[i].clock = (long)dp_get_u64(q);
        b->w[i].applied = dp_get_u64(q + 8);
    }
    return 0;
}

int dp_ps_replica_frame(server *s, const dp_event *ev, dp_err *err)
{
    if (ev->header.type == DP_WIRE_REPLICATE)
        return apply_forwarded(s, ev, err) < 0 ? -1 : 1;
    if (ev->header.type != DP_WIRE_REPLICATE_ACK)
        return 0;
    if (dp_transport_skip_payload(s->t, ev->peer, err) < 0)
        return -1;
    if (ev->peer == s->backup_rank && ev->header.step > s->ack_seq) {
        s->ack_seq = ev->header.step;
        release_owed(s);
    }
    return 1;
}

/* The backup becomes the shard's primary (alone: it forwards nothing). */
static void take_over(server *s, const char *why)
{
    server *b = s->backup;
    dp_warn("fault: lost %s, the primary of shard %d (%s); %s takes the shard over at update "
            "%ld and the run goes on", name(s, b->primary_rank), b->shard, why, self(s),
            b->updates);
    b->primary_rank = -1;
}

int dp_ps_replica_lost(server *s, const dp_event *ev)
{
    int hit = 0;
    if (s->backup_rank >= 0 && ev->peer == s->backup_rank) {
        dp_warn("fault: lost %s, the backup of shard %d (%s); %s serves the shard without a "
                "backup", name(s, ev->peer), s->shard, ev->reason, self(s));
        lose_backup(s);
        hit = 1;
    }
    if (s->backup && ev->peer == s->backup->primary_rank) {
        take_over(s, ev->reason);
        hit = 1;
    }
    return hit;
}

/* A client came for the shard this task backs up: its primary is lost to
 * that client.  Whatever the primary sent before is read first (its updates
 * come before the client's re-sent request), up to its loss. */
static void drain_primary(server *s)
{
    server *b = s->backup;
    int primary = b->primary_rank;
    for (double end = dp_now() + DRAIN_WAIT; b->primary_rank >= 0;) {
        double left = end - dp_now();
        dp_event ev;
        dp_err why;
        if (left <= 0 || dp_transport_poll(s->t, primary, left, &ev, &why) < 0) {
            take_over(s, "a client came to its backup, and it still sends");
            return;
        }
        if (ev.kind == DP_EVENT_PEER_LOST) {
            dp_ps_replica_lost(s, &ev);
        } else if (ev.kind == DP_EVENT_FRAME) {
            int rc = dp_ps_replica_frame(s, &ev, &why);
            if (rc == 0)
                rc = dp_transport_skip_payload(s->t, primary, &why) < 0 ? -1 : 1;
            if (rc < 0) {
                take_over(s, why.msg);
                return;
            }
        }
    }
}

/* Peers lose a task after heartbeat_timeout of silence.  A task stopped
 * about that long (SIGSTOP, a suspended VM; a margin, since their clocks
 * started at its last frame) may find its shards served by their backups
 * when it wakes; serving on would make two primaries of one shard, so it
 * leaves, and its clients fail over too.  A thread ticking every TICK_NS
 * tells being stopped (it stops too) from being blocked (a send to a slow
 * peer, a drain): the main thread's own clock cannot. */
#define FENCE_SHARE 0.8
#define TICK_NS 50000000L

struct dp_ps_ticker {
    pthread_t thread;
    atomic_int stop;
    atomic_llong last_us; /* its newest tick */
    atomic_int gap;       /* a tick came FENCE_SHARE * heartbeat_timeout late */
    long long fence_us;
};

static long long now_us(void) { return (long long)(dp_now() * 1e6); }

static void *tick(void *arg)
{
    struct dp_ps_ticker *k = arg;
    while (!atomic_load(&k->stop)) {
        struct timespec ts = {0, TICK_NS};
        nanosleep(&ts, NULL);
        long long now = now_us();
        if (now - atomic_load(&k->last_us) > k->fence_us)
            atomic_store(&k->gap, 1);
        atomic_store(&k->last_us, now);
    }
    return NULL;
}

static int start_ticker(server *s, dp_err *err)
{
    struct dp_ps_ticker *k = calloc(1, sizeof *k);
    if (!k)
        return dp_errf(err, "out of memory");
    k->fence_us = (long long)(FENCE_SHARE * s->cfg.heartbeat_timeout * 1e6);
    atomic_store(&k->last_us, now_us());
    if (pthread_create(&k->thread, NULL, tick, k) != 0) {
        free(k);
        return dp_errf(err, "cannot start the ps's stop watch thread");
    }
    s->ticker = k;
    return 0;
}

void dp_ps_replica_close(server *s)
{
    if (!s->ticker)
        return;
    atomic_store(&s->ticker->stop, 1);
    pthread_join(s->ticker->thread, NULL);
    free(s->ticker);
    s->ticker = NULL;
}

/* Whether this task was stopped long enough to have been taken over: the
 * ticker saw it, or has not ticked for that long (it is waking up too). */
static int stopped(const server *s)
{
    const struct dp_ps_ticker *k = s->ticker;
    return k && (atomic_load(&k->gap) || now_us() - atomic_load(&k->last_us) > k->fence_us);
}

int dp_ps_replica_awake(server *s, dp_err *err)
{
    if (!s->fenced && !stopped(s))
        return 0;
    fence(s);
    return dp_errf(err, "fault: %s was stopped near or past the %.1f s heartbeat timeout: its "
                        "peers may have handed its shards to their backups, so it leaves the run",
                   self(s), s->cfg.heartbeat_timeout);
}

server *dp_ps_replica_route(server *s, const dp_event *ev)
{
    server *b = s->backup;
    if (!b)
        return s;
    unsigned type = ev->header.type;
    int serve = type == DP_WIRE_PUSH_GRAD || type == DP_WIRE_PUSH_CODED ||
                type == DP_WIRE_PUSH_PARAMS ||
                type == DP_WIRE_PUSH_ROWS || type == DP_WIRE_PULL_ROWS ||
                type == DP_WIRE_PULL_TABLE || type == DP_WIRE_PULL ||
                type == DP_WIRE_PULL_AVERAGE || type == DP_WIRE_STATE_REQ;
    if (!serve && type != DP_WIRE_JOIN && type != DP_WIRE_DONE)
        return s;
    if (s->shard >= 0 && ev->header.offset != b->lo)
        return s;
    if (serve && b->primary_rank >= 0)
        drain_primary(s);
    return b;
}
