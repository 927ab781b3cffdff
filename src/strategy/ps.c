/* Parameter servers and their clients: see include/downpour/ps.h.  The
 * machinery is here; what each consistency mode decides is in its
 * strategy's file (ps_rules.h). */
#include "downpour/ps.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/wire.h"
#include "downpour/clock.h"
#include "downpour/log.h"
#include "downpour/train_config.h"
#include "downpour/sender.h"
#include "downpour/trace.h"
#include "downpour/testhooks.h"
#include "downpour/ps_auto.h"
#include "strategy/ps_rules.h"

#define PS_TIMEOUT 600.0 /* s a worker waits for its parameters before giving up */
#define CHIEF_WAIT 600.0 /* s a server with nothing left to serve waits for a lost chief */
/* Push-behind leaves answers unread while the worker computes: they must fit
 * the sockets' buffers (TCP's 4 MiB each way, src/net/tcp.c), or the server
 * would block answering one worker and stall the others. */
#define BEHIND_BYTES (4u << 20)

static const dp_ps_rules *const rules_of[DP_PS_MODE_COUNT] = {
    [DP_PS_ASYNC] = &dp_ps_rules_async, [DP_PS_SYNC] = &dp_ps_rules_sync,
    [DP_PS_SSP] = &dp_ps_rules_ssp,     [DP_PS_DSSP] = &dp_ps_rules_dssp,
    [DP_PS_AVG] = &dp_ps_rules_avg,
};

void dp_push_head_put(uint8_t *p, const dp_push_head *h)
{
    dp_put_u32(p, h->records);
    dp_put_u32(p + 4, h->want);
    dp_put_f32(p + 8, h->lr);
    dp_put_u32(p + 12, h->step);
}

void dp_push_head_get(dp_push_head *h, const uint8_t *p)
{
    h->records = dp_get_u32(p);
    h->want = dp_get_u32(p + 4);
    h->lr = dp_get_f32(p + 8);
    h->step = dp_get_u32(p + 12);
}

void dp_ps_config_init(dp_ps_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->mode = DP_PS_ASYNC;
    cfg->fetch_every = 1;
    cfg->push_every = 1;
    cfg->push_behind = 0;
    cfg->staleness = 3;
    cfg->staleness_lo = 1;
    cfg->staleness_hi = 6;
    cfg->period = 8;
    cfg->min_shard_bytes = DP_PARTITION_MIN_SHARD_BYTES;
    cfg->replicas = 1;
}

int dp_ps_layout_make(dp_ps_layout *out, const dp_cluster *c, size_t n_params,
                      const dp_ps_config *cfg, dp_err *err)
{
    return dp_ps_layout_make_from(out, c, 0, n_params, cfg, err);
}

int dp_ps_layout_make_from(dp_ps_layout *out, const dp_cluster *c, size_t lo, size_t n_params,
                           const dp_ps_config *cfg, dp_err *err)
{
    if (lo >= n_params)
        return dp_errf(err, "no dense parameters to shard: [%zu, %zu)", lo, n_params);
    int n_ps = c->count[DP_ROLE_PS];
    if (n_ps < 1)
        return dp_errf(err, "parameter-server training needs at least one ps task "
                            "(launch --ps 1, or a \"ps\" list in the cluster spec)");
    int replicas = cfg->replicas > 1 ? cfg->replicas : 1;
    if (replicas > 2)
        return dp_errf(err, "--ps-replicas %d: at most 2 copies of a shard are kept (a primary "
                            "and one backup)", replicas);
    if (replicas > n_ps)
        return dp_errf(err, "--ps-replicas %d needs at least %d ps tasks, one for each copy of "
                            "a shard; this cluster has %d (launch --ps %d)",
                       replicas, replicas, n_ps, replicas);
    int max = cfg->max_shards > 0 ? cfg->max_shards : n_ps;
    if (max > n_ps) {
        dp_warn("--ps-max-shards %d is more than the %d ps task(s); using %d", max, n_ps, n_ps);
        max = n_ps;
    }
    int k = dp_partition_min_size(n_params - lo, cfg->min_shard_bytes, max, out->range, err);
    if (k < 0)
        return -1;
    out->n_shards = k;
    for (int s = 0; s < k; s++) {
        out->range[s].lo += lo;
        out->range[s].hi += lo;
        out->rank[s] = dp_cluster_rank(c, DP_ROLE_PS, s);
        out->backup[s] = replicas > 1 ? dp_cluster_rank(c, DP_ROLE_PS, (s + 1) % n_ps) : -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- server */

typedef struct dp_ps_server server;

double dp_ps_now(const server *s) { return s->cfg.now ? s->cfg.now() : dp_now(); }

static const char *self_name(const server *s)
{
    return dp_transport_peer_name(s->t, dp_transport_rank(s->t));
}

static int live_workers(const server *s)
{
    int n = 0;
    for (int i = 0; i < s->n_workers; i++)
        n += s->w[i].live;
    return n;
}

/* A worker the server cannot answer is gone (its loss is on its way as an
 * event): it is dropped here, and the server goes on with the others once
 * whoever waited for it is released (settle).  With a backup, the answer
 * waits until the backup holds every update before it (ps_replica.c). */
void dp_ps_reply(server *s, dp_ps_worker *w)
{
    w->pending = 0;
    if (w->hosted) { /* its leader's answer carries its parameters */
        w->hosted = 0;
        return;
    }
    if (!dp_ps_replica_holds(s, w))
        dp_ps_send_reply(s, w);
}

void dp_ps_changed(server *s)
{
    dp_ps_note_applied(s);
    dp_ps_shard_changed(s);
    dp_ps_replica_forward(s, DP_PS_OP_SET, s->params, 0);
}

/* The gradient goes to the backup first, so both apply it at once.  The
 * tables' rows (their update as set by the push or the round) follow the
 * dense part, with the same rate. */
void dp_ps_apply(server *s, const float *g, float lr)
{
    dp_ps_note_applied(s);
    dp_ps_replica_forward(s, DP_PS_OP_APPLY, g, lr);
    dp_optim_apply(&s->opt, s->params, g, lr);
    dp_ps_rows_apply(s, lr);
    dp_ps_shard_changed(s);
}

int dp_ps_release_if(server *s, dp_ps_may_go go, dp_err *err)
{
    long m = dp_ps_min_clock(s);
    double now = dp_ps_now(s);
    for (int i = 0; i < s->n_workers; i++) {
        dp_ps_worker *w = &s->w[i];
        if (w->pending && go(s, w, m < 0 ? 0 : w->clock - m, now))
            dp_ps_reply(s, w);
    }
    (void)err;
    return 0;
}

int dp_ps_apply_then_wait(server *s, dp_ps_worker *w, const dp_push_head *h, dp_err *err)
{
    if (h->records > 0)
        dp_ps_apply(s, s->scratch, h->lr);
    w->pending = 1;
    return s->rules->release(s, err);
}

/* The open round's records-weighted mean becomes the shard's (applied as a
 * gradient, or set as parameters in model-avg), and its workers are
 * answered: a restarted server's round that cannot wait any longer.  The
 * mean is taken in s->sum, since s->scratch holds the push being handled. */
static void close_round_now(server *s)
{
    float scale = s->round_records > 0 ? (float)(1.0 / s->round_records) : 0;
    for (size_t i = 0; i < s->n; i++)
        s->sum[i] *= scale;
    /* the push being handled keeps its rows (ids, grad); the round's are its sums */
    const uint32_t *keep_ids[DP_PS_MAX_TABLES];
    long keep_n[DP_PS_MAX_TABLES];
    for (int k = 0; k < s->n_tab; k++)
        keep_ids[k] = s->tab[k].up_ids, keep_n[k] = s->tab[k].up_n;
    dp_ps_rows_round_mean(s, scale);
    if (s->round_records > 0 && s->rules->pushes_params) {
        memcpy(s->params, s->sum, s->n * sizeof(float));
        dp_ps_changed(s);
    } else if (s->round_records > 0) {
        dp_ps_apply(s, s->sum, s->round_lr);
    }
    dp_ps_round_close(s, NULL);
    for (int k = 0; k < s->n_tab; k++) {
        s->tab[k].up_ids = keep_ids[k];
        s->tab[k].up_n = keep_n[k];
        s->tab[k].up_g = s->tab[k].grad;
        s->tab[k].up_indexed = 0;
    }
}

/* On a server restarted into the run, the workers can be a round apart (the
 * old server died answering a round: some got the answer, some did not), so
 * its rounds go by the pushes' training steps: a round waits only for the
 * workers that have not pushed its step yet (dp_ps_round_complete).  A push
 * of an older step than the open round's is taken alone and answered; one of
 * a newer step closes the open round first.  1: taken alone. */
static int align_round(server *s, dp_ps_worker *w, const dp_push_head *h)
{
    if (!s->restored || h->step == 0)
        return 0;
    w->last_step = h->step;
    if (s->round_pushes > 0 && h->step < s->round_key) {
        if (s->rules->pushes_params) {
            memcpy(s->params, s->scratch, s->n * sizeof(float));
            dp_ps_changed(s);
        } else {
            dp_ps_apply(s, s->scratch, h->lr);
        }
        dp_ps_reply(s, w);
        return 1;
    }
    if (s->round_pushes > 0 && h->step > s->round_key)
        close_round_now(s);
    if (s->round_pushes == 0)
        s->round_key = h->step;
    return 0;
}

int dp_ps_round_add(server *s, dp_ps_worker *w, const dp_push_head *h, dp_err *err)
{
    if (w->pending)
        return dp_errf(err, "%s pushed twice in one round", dp_transport_peer_name(s->t, w->rank));
    if (align_round(s, w, h))
        return 0;
    float r = (float)h->records;
    if (s->weighted) /* a host's sum: each worker's share weighted as below, by its leader */
        for (size_t i = 0; i < s->n; i++)
            s->sum[i] = s->round_pushes == 0 ? s->scratch[i] : s->sum[i] + s->scratch[i];
    else if (s->round_pushes == 0)
        for (size_t i = 0; i < s->n; i++)
            s->sum[i] = s->scratch[i] * r;
    else
        for (size_t i = 0; i < s->n; i++)
            s->sum[i] += s->scratch[i] * r;
    dp_ps_rows_round_add(s, r);
    s->round_records += h->records;
    s->round_lr = h->lr;
    s->round_pushes++;
    w->pending = 1;
    return 0;
}

/* Complete when every live worker has pushed into it: counted by worker, not
 * by push, so a worker that pushed and then left does not stand in for one
 * that has not pushed yet.  On a restarted server only the workers that have
 * not pushed the round's step count: not one past it (it may wait at a
 * checkpoint barrier), nor one that has not said where it is. */
int dp_ps_round_complete(const server *s)
{
    if (s->round_pushes == 0)
        return 0;
    /* The round's clock: its pushers'.  A worker that joined ahead (a spare
     * slot filled from a later epoch: rejoin_worker set its clock to the
     * step before its first) is not due until the round reaches it. */
    long round = 0;
    for (int i = 0; i < s->n_workers; i++)
        if (s->w[i].live && s->w[i].pending && s->w[i].clock > round)
            round = s->w[i].clock;
    for (int i = 0; i < s->n_workers; i++) {
        const dp_ps_worker *w = &s->w[i];
        if (!w->live || w->pending || w->clock >= round ||
            (s->restored && (w->unsynced || w->last_step >= s->round_key)))
            continue;
        return 0;
    }
    return 1;
}

const float *dp_ps_round_mean(server *s)
{
    if (s->round_records <= 0)
        return NULL;
    float scale = (float)(1.0 / s->round_records);
    for (size_t i = 0; i < s->n; i++)
        s->scratch[i] = s->sum[i] * scale;
    dp_ps_rows_round_mean(s, scale);
    return s->scratch;
}

int dp_ps_round_close(server *s, dp_err *err)
{
    s->round_pushes = 0;
    s->round_records = 0;
    if (s->chunk_in)
        memset(s->chunk_in, 0, (size_t)(s->n_workers ? s->n_workers : 1));
    dp_ps_rows_round_clear(s);
    for (int i = 0; i < s->n_workers; i++)
        if (s->w[i].pending)
            dp_ps_reply(s, &s->w[i]);
    (void)err;
    return 0;
}

/* The records of chunk j of a push of `records` (they fill the chunks in
 * order). */
static float chunk_records(const server *s, uint32_t records, int j)
{
    long left = (long)records - (long)j * s->cfg.chunk;
    return (float)(left <= 0 ? 0 : left < s->cfg.chunk ? left : s->cfg.chunk);
}

/* --sum-chunk: a push's head, then its chunks into the worker's place;
 * s->scratch gets their records-weighted mean, the one gradient the rest
 * of the server handles as any push's (a restored server's rounds). */
static int recv_chunks(server *s, dp_ps_worker *w, uint8_t *raw, dp_err *err)
{
    size_t i = (size_t)(w - s->w), per = (size_t)s->cfg.chunks * s->n;
    float *mine = s->chunk_buf + i * per;
    if (dp_transport_recv_payload(s->t, w->rank, raw, DP_PUSH_HEAD_SIZE, err) < 0 ||
        dp_transport_recv_payload(s->t, w->rank, mine, per * sizeof(float), err) < 0)
        return -1;
    dp_push_head h;
    dp_push_head_get(&h, raw);
    if (h.records > (uint32_t)s->cfg.chunks * (uint32_t)s->cfg.chunk)
        return dp_errf(err, "%s pushed %u records in %d chunks of %d",
                       dp_transport_peer_name(s->t, w->rank), h.records, s->cfg.chunks,
                       s->cfg.chunk);
    s->chunk_rec[i] = h.records;
    s->chunk_in[i] = 1;
    float scale = h.records > 0 ? (float)(1.0 / h.records) : 0;
    for (size_t k = 0; k < s->n; k++)
        s->scratch[k] = 0;
    for (int j = 0; j < s->cfg.chunks; j++) {
        float r = chunk_records(s, h.records, j);
        const float *g = mine + (size_t)j * s->n;
        for (size_t k = 0; k < s->n; k++)
            s->scratch[k] += g[k] * r;
    }
    for (size_t k = 0; k < s->n; k++)
        s->scratch[k] *= scale;
    return 0;
}

void dp_ps_round_chunk_sum(server *s)
{
    int first = 1;
    for (int i = 0; i < s->n_workers; i++) {
        if (!s->chunk_in[i])
            continue;
        const float *mine = s->chunk_buf + (size_t)i * s->cfg.chunks * s->n;
        for (int j = 0; j < s->cfg.chunks; j++, first = 0) {
            float r = chunk_records(s, s->chunk_rec[i], j);
            const float *g = mine + (size_t)j * s->n;
            if (first)
                for (size_t k = 0; k < s->n; k++)
                    s->sum[k] = g[k] * r;
            else
                for (size_t k = 0; k < s->n; k++)
                    s->sum[k] += g[k] * r;
        }
    }
}

/* Checks a push, reads it into s->scratch, counts the worker's clock and
 * hands it to the mode's rule. */
static int on_push(server *s, dp_ps_worker *w, const dp_event *ev, dp_err *err)
{
    const char *who = dp_transport_peer_name(s->t, w->rank);
    int is_params = ev->header.type == DP_WIRE_PUSH_PARAMS;
    int rows = ev->header.type == DP_WIRE_PUSH_ROWS; /* then a rows section follows */
    int chunks = s->chunk_buf && ev->header.type == DP_WIRE_PUSH_GRAD ? s->cfg.chunks : 0;
    int coded = ev->header.type == DP_WIRE_PUSH_CODED; /* a coded block, not floats */
    size_t want_len = DP_PUSH_HEAD_SIZE + (chunks ? (size_t)chunks : 1) * s->n * sizeof(float);
    if (coded && !s->coded)
        return dp_errf(err, "%s pushed a compressed gradient; this run pushes f32 (no "
                            "--compress)", who);
    /* --compress auto: each worker chose its own top-k count (ps_auto.c), which
     * the block's length says: k pairs, 1 <= k <= n */
    dp_compress cz = s->cfg.compress;
    int any_k = coded && cz.kind == DP_COMPRESS_AUTO;
    if (any_k) {
        uint64_t len = ev->header.length, body = len - DP_PUSH_HEAD_SIZE - DP_CODED_HEAD_SIZE;
        if (len < DP_PUSH_HEAD_SIZE + DP_CODED_HEAD_SIZE + 8 || body % 8 != 0 || body / 8 > s->n)
            return dp_errf(err, "%s pushed a coded gradient of %llu bytes; under --compress "
                                "auto this shard of %zu takes a top-k block of 1 to %zu pairs",
                           who, (unsigned long long)len, s->n, s->n);
        cz.kind = DP_COMPRESS_TOPK;
        cz.ratio = (double)(body / 8) / (double)s->n; /* dp_topk_count gives body / 8 back */
        want_len = (size_t)len;
    } else if (coded) {
        want_len = DP_PUSH_HEAD_SIZE + dp_coded_bytes(&s->cfg.compress, s->n);
    }
    if ((rows ? ev->header.length < want_len : ev->header.length != want_len) ||
        ev->header.offset != s->lo)
        return dp_errf(err, "%s pushed %llu bytes at offset %llu; this shard takes %zu%s at %zu",
                       who, (unsigned long long)ev->header.length,
                       (unsigned long long)ev->header.offset, want_len,
                       rows ? " and its rows" : "", s->lo);
    if (is_params != s->rules->pushes_params)
        return dp_errf(err, "%s pushed %s, but this run averages %s", who,
                       is_params ? "parameters" : "gradients",
                       s->rules->pushes_params ? "parameters" : "gradients");
    if (!w->live) /* dropped, or done: what it still sends counts for nothing */
        return dp_transport_skip_payload(s->t, w->rank, err);
    uint8_t raw[DP_PUSH_HEAD_SIZE];
    dp_push_head head;
    if (chunks) {
        if (recv_chunks(s, w, raw, err) < 0)
            return -1;
    } else if (coded) {
        size_t len = want_len - DP_PUSH_HEAD_SIZE;
        dp_err why;
        if (dp_transport_recv_payload(s->t, w->rank, raw, sizeof raw, err) < 0 ||
            dp_transport_recv_payload(s->t, w->rank, s->coded, len, err) < 0)
            return -1;
        if (any_k && dp_get_u32(s->coded + 4) != (len - DP_CODED_HEAD_SIZE) / 8)
            return dp_errf(err, "%s pushed a bad coded gradient: its block says %u pairs in "
                                "%zu bytes", who, dp_get_u32(s->coded + 4), len);
        if (dp_coded_decode(&cz, s->coded, len, s->scratch, s->n, &why) < 0)
            return dp_errf(err, "%s pushed a bad coded gradient: %s", who, why.msg);
    } else if (dp_transport_recv_payload(s->t, w->rank, raw, sizeof raw, err) < 0 ||
               dp_transport_recv_payload(s->t, w->rank, s->scratch, s->n * sizeof(float),
                                         err) < 0) {
        return -1;
    }
    for (int k = 0; k < s->n_tab; k++)
        s->tab[k].up_n = s->tab[k].n_ids = 0; /* a dense push touches no row */
    if (rows && dp_ps_rows_read(s, w->rank, ev->header.length - want_len, 1, who, err) < 0)
        return -1;
    dp_push_head_get(&head, raw);
    if (!(head.lr >= 0 && head.lr <= 1e6f)) /* also refuses NaN */
        return dp_errf(err, "%s pushed a learning rate of %g", who, (double)head.lr);
    uint64_t step = ev->header.step;
    if (head.step != 0 && head.step == w->hosted_step) {
        /* A host member whose leader was lost pushes the step itself: its
         * share is in the round already (its leader's push), so it only
         * takes its own answer (docs/faults.md, "One push per host"). */
        if (w->pending)
            w->hosted = 0;
        else
            dp_ps_reply(s, w);
        return 0;
    }
    if (step != 0 && step == w->applied) {
        /* Re-sent after its primary was lost, and applied already (the
         * primary forwarded it): answered as the rule says, not applied again. */
        if (s->rules->on_push == dp_ps_apply_then_wait) {
            w->pending = 1;
            return s->rules->release(s, err);
        }
        if (head.want)
            dp_ps_reply(s, w);
        return 0;
    }
    w->step = step;
    w->unsynced = 0; /* pushing without a JOIN: its clock as the chief knew it */
    /* --compress auto: a coded push is answered with the 4-bit difference
     * (reply_k its count), an f32 push whole */
    w->reply_k = any_k ? (uint32_t)((want_len - DP_PUSH_HEAD_SIZE - DP_CODED_HEAD_SIZE) / 8) : 0;
    double now = dp_ps_now(s);
    if (w->clock > 0)
        w->interval = w->interval > 0 ? 0.8 * w->interval + 0.2 * (now - w->last_push)
                                      : now - w->last_push;
    w->last_push = now;
    /* model-avg's clock is the step it averaged at: its averages come every
     * --period steps and before each checkpoint, so a count of them is no
     * step count, and a worker restarted to go on after step S
     * (rejoin_worker: clock S) came back far ahead of the others' counts:
     * the rounds went on without it, and its first average waited on a
     * worker already at the next checkpoint barrier (docs/faults.md,
     * "Rejoining") */
    long at = (long)head.step - s->base_step;
    w->clock = s->rules->pushes_params && head.step > 0 && at > w->clock ? at : w->clock + 1;
    s->pusher = w;
    int rc = s->rules->on_push(s, w, &head, err);
    s->pusher = NULL;
    return rc;
}

/* Workers left (dropped while being answered, DONE, lost): whoever waited
 * for them is released.  Releasing may drop more (a reply that cannot be
 * sent), so it runs again until nobody else left. */
static int settle(server *s, dp_err *err)
{
    while (s->dropped) {
        s->dropped = 0;
        if (s->rules->release && s->rules->release(s, err) < 0)
            return -1;
    }
    return 0;
}

/* A worker is gone (DONE, lost or dropped): the others must not wait for it. */
static int retire_worker(server *s, dp_ps_worker *w, dp_err *err)
{
    dp_ps_mirror_forget(s, w);
    w->live = 0;
    w->pending = w->hosted = 0;
    w->owed = 0;
    s->dropped = 1;
    return settle(s, err);
}

/* A restarted worker (a new incarnation) takes part again at the clock of
 * the step it starts at (join_step - 1; 0: not said, the slowest live
 * worker's), as if it had never left: in ps-ssp and ps-dssp the others wait
 * for it as for any slow worker.  At the slowest clock instead, its clock
 * would run ahead of its steps, and a worker held at a checkpoint barrier
 * it has not reached would never be let go (docs/faults.md). */
static int rejoin_worker(server *s, dp_ps_worker *w, uint64_t join_step)
{
    if (w->live && join_step > 0) {
        /* This server was restarted into the run and the worker says where
         * it is (ps.c await_restart): whoever waited for it may go. */
        long c = (long)join_step - 1 - s->base_step;
        w->clock = c < 0 ? 0 : c;
        w->unsynced = 0;
        w->last_step = (uint32_t)join_step - 1;
        s->dropped = 1;
        dp_debug("%s is at clock %ld", dp_transport_peer_name(s->t, w->rank), w->clock);
        return 0;
    }
    if (w->live)
        return 0; /* the first incarnation's JOIN: nothing to do */
    dp_ps_mirror_forget(s, w); /* an incarnation whose copy this server does not know */
    long m = dp_ps_min_clock(s);
    if (join_step > 0)
        m = (long)join_step - 1 - s->base_step;
    w->live = 1;
    w->unsynced = 0;
    w->pending = 0;
    w->owed = 0;
    w->applied = 0; /* a new incarnation counts its pushes from 1 again */
    w->hosted = 0;  /* and pushes on its own (docs/faults.md, "One push per host") */
    w->hosted_step = 0;
    w->clock = m < 0 ? 0 : m;
    w->interval = 0;
    w->last_push = dp_ps_now(s);
    if (w->spare) /* a spare slot filled: the job grows, no fault */
        dp_info("%s joined at clock %ld; %s serves it", dp_transport_peer_name(s->t, w->rank),
                w->clock, self_name(s));
    else
        dp_warn("fault: %s rejoined at clock %ld; %s serves it again",
                dp_transport_peer_name(s->t, w->rank), w->clock, self_name(s));
    w->spare = 0;
    return 0;
}

size_t dp_ps_state_chunk_rows(const dp_ps_config *cfg, size_t w)
{
    size_t bytes = cfg->state_chunk ? cfg->state_chunk : DP_PS_STATE_CHUNK;
    size_t r = bytes / (w * sizeof(float));
    return r ? r : 1;
}

/* The shard's training state for a checkpoint: [u64 optimiser t][u64
 * updates] then the parameters, every optimiser slot and the moving average
 * (when kept), each s->n floats, straight from the server's buffers.  The
 * sparse tables' rows follow in STATE_ROWS frames, table by table, the rows
 * then each slot's rows (part 0, 1, ..), each in chunks of at most
 * dp_ps_state_chunk_rows rows in local order, straight from the tables: no frame
 * grows with the table. */
static int send_state(server *s, int rank, uint64_t step, int rows, dp_err *err)
{
    uint8_t head[16];
    dp_put_u64(head, (uint64_t)s->opt.t);
    dp_put_u64(head + 8, (uint64_t)s->updates);
    size_t bytes = s->n * sizeof(float);
    struct iovec iov[2 + 2 + 1];
    int k = 0;
    iov[k++] = (struct iovec){head, sizeof head};
    iov[k++] = (struct iovec){s->params, bytes};
    for (int j = 0; j < dp_optim_slots(s->opt.cfg.kind) && s->opt.state; j++)
        iov[k++] = (struct iovec){s->opt.state + (size_t)j * s->n, bytes};
    if (s->ema)
        iov[k++] = (struct iovec){s->ema, bytes};
    if (dp_transport_sendv(s->t, rank, DP_WIRE_STATE, step, s->lo, iov, k, err) < 0)
        return -1;
    for (int q = 0; rows && q < s->n_tab; q++) {
        dp_ps_table *t = &s->tab[q];
        size_t w = (size_t)t->width, per = dp_ps_state_chunk_rows(&s->cfg, w);
        int parts = 1 + (t->opt.state ? dp_optim_slots(t->opt.cfg.kind) : 0);
        for (int j = 0; j < parts; j++) {
            const float *v = j == 0 ? t->params : t->opt.state + (size_t)(j - 1) * t->opt.n;
            for (size_t first = 0; first < (size_t)t->local; first += per) {
                size_t n = (size_t)t->local - first < per ? (size_t)t->local - first : per;
                uint8_t h[DP_PS_STATE_ROWS_HEAD];
                dp_put_u32(h, (uint32_t)q);
                dp_put_u32(h + 4, (uint32_t)j);
                dp_put_u32(h + 8, (uint32_t)first);
                dp_put_u32(h + 12, (uint32_t)n);
                struct iovec c[2] = {{h, sizeof h},
                                     {(void *)(v + first * w), n * w * sizeof(float)}};
                if (dp_transport_sendv(s->t, rank, DP_WIRE_STATE_ROWS, step, s->lo, c, 2, err) < 0)
                    return -1;
            }
        }
    }
    return 0;
}

/* A host leader's push (PUSH_HOST, docs/strategies.md, "ps-sync: one push
 * per host"): the records-weighted sum of its host's workers, named in the
 * frame, the leader first.  Each named worker that is live counts as
 * having pushed into the round, answered through the leader's answer. */
static int on_host_push(server *s, dp_ps_worker *w, const dp_event *ev, dp_err *err)
{
    const char *who = dp_transport_peer_name(s->t, w->rank);
    uint8_t raw[DP_PUSH_HEAD_SIZE + 4];
    uint32_t idx[DP_PS_HOST_MAX];
    uint64_t len = ev->header.length;
    /* not on a server restarted into the run, whose rounds go by step and
     * take a late push alone (align_round): its workers push on their own */
    if (s->rules->on_push != dp_ps_rules_sync.on_push || s->chunk_buf || s->coded || s->n_tab ||
        s->restored || s->backup_rank >= 0 || s->backup)
        return dp_errf(err, "%s pushed for its host; only a plain ps-sync run takes host pushes "
                            "(--ps-push host: not with --sum-chunk, --compress, sparse rows, "
                            "--ps-replicas 2 or a restarted ps)", who);
    if (len < sizeof raw || ev->header.offset != s->lo)
        return dp_errf(err, "%s pushed a host push of %llu bytes at offset %llu; this shard "
                            "is at %zu", who, (unsigned long long)len,
                       (unsigned long long)ev->header.offset, s->lo);
    if (!w->live)
        return dp_transport_skip_payload(s->t, w->rank, err);
    if (dp_transport_recv_payload(s->t, w->rank, raw, sizeof raw, err) < 0)
        return -1;
    uint32_t m = dp_get_u32(raw + DP_PUSH_HEAD_SIZE);
    if (m < 1 || m > (uint32_t)s->n_workers || m > DP_PS_HOST_MAX ||
        len != sizeof raw + 4 * (uint64_t)m + s->n * sizeof(float))
        return dp_errf(err, "%s pushed a host push of %llu bytes for %u worker(s); this shard "
                            "of %zu floats takes %zu + 4 per worker + %zu, for 1 to %d workers",
                       who, (unsigned long long)len, m, s->n, sizeof raw, s->n * sizeof(float),
                       s->n_workers < DP_PS_HOST_MAX ? s->n_workers : DP_PS_HOST_MAX);
    uint8_t b[4 * DP_PS_HOST_MAX];
    if (dp_transport_recv_payload(s->t, w->rank, b, 4 * (size_t)m, err) < 0 ||
        dp_transport_recv_payload(s->t, w->rank, s->scratch, s->n * sizeof(float), err) < 0)
        return -1;
    for (uint32_t i = 0; i < m; i++) {
        idx[i] = dp_get_u32(b + 4 * i);
        int twice = 0;
        for (uint32_t j = 0; j < i; j++)
            twice |= idx[j] == idx[i];
        if (idx[i] >= (uint32_t)s->n_workers || twice || (i == 0 && &s->w[idx[0]] != w) ||
            (s->w[idx[i]].live && s->w[idx[i]].pending))
            return dp_errf(err, "%s pushed for worker %u (entry %u of %u): not a worker of the "
                                "run, named twice, not itself first, or one that pushed into "
                                "this round already", who, idx[i], i, m);
    }
    dp_push_head head;
    dp_push_head_get(&head, raw);
    if (!(head.lr >= 0 && head.lr <= 1e6f))
        return dp_errf(err, "%s pushed a learning rate of %g", who, (double)head.lr);
    for (int k = 0; k < s->n_tab; k++)
        s->tab[k].up_n = s->tab[k].n_ids = 0;
    /* its members first: pending, through the leader, at the leader's clock */
    for (uint32_t i = 1; i < m; i++) {
        dp_ps_worker *mw = &s->w[idx[i]];
        if (!mw->live) /* lost after it gave its leader its share: the share counts */
            continue;
        mw->pending = mw->hosted = 1;
        mw->hosted_step = head.step;
        mw->step = ev->header.step;
        mw->unsynced = 0;
        mw->clock++;
    }
    w->step = ev->header.step;
    w->unsynced = 0;
    w->reply_k = 0;
    w->clock++;
    s->pusher = w;
    s->weighted = 1;
    int rc = s->rules->on_push(s, w, &head, err);
    s->weighted = 0;
    s->pusher = NULL;
    return rc;
}

/* One frame from ev->peer (worker index wi, or -1).  -1 with err: that
 * peer is at fault (dp_ps_server_poll decides what it costs). */
static int handle(server *s, const dp_event *ev, int wi, dp_err *err)
{
    const char *who = dp_transport_peer_name(s->t, ev->peer);
    switch (ev->header.type) {
    case DP_WIRE_PUSH_GRAD:
    case DP_WIRE_PUSH_CODED:
    case DP_WIRE_PUSH_ROWS:
    case DP_WIRE_PUSH_PARAMS:
        if (wi < 0) {
            dp_warn("ignoring a push from %s: it is not a worker", who);
            return dp_transport_skip_payload(s->t, ev->peer, err);
        }
    {
        double t0 = dp_now();
        int rc = on_push(s, &s->w[wi], ev, err);
        dp_trace_span("apply push", "ps", t0, dp_now(), wi);
        return rc;
    }
    case DP_WIRE_PUSH_HOST:
        if (wi < 0) {
            dp_warn("ignoring a host push from %s: it is not a worker", who);
            return dp_transport_skip_payload(s->t, ev->peer, err);
        }
    {
        double t0 = dp_now();
        int rc = on_host_push(s, &s->w[wi], ev, err);
        dp_trace_span("apply push", "ps", t0, dp_now(), wi);
        return rc;
    }
    case DP_WIRE_PULL:
        if (dp_transport_skip_payload(s->t, ev->peer, err) < 0)
            return -1;
        if (wi < 0)
            return dp_ps_send_params(s, ev->peer, err);
        dp_ps_mirror_forget(s, &s->w[wi]); /* a worker's pull is answered whole */
        dp_ps_reply(s, &s->w[wi]);
        return 0;
    case DP_WIRE_PULL_ROWS:
        if (dp_ps_rows_read(s, ev->peer, ev->header.length, 0, who, err) < 0)
            return -1;
        return dp_ps_rows_send(s, ev->peer, err);
    case DP_WIRE_PULL_TABLE: { /* one chunk: [u32 table][u32 part][u32 first][u32 count] */
        uint8_t b[DP_PS_STATE_ROWS_HEAD];
        if (ev->header.length != sizeof b) {
            if (dp_transport_skip_payload(s->t, ev->peer, err) < 0)
                return -1;
            return dp_errf(err, "%s sent a PULL_TABLE of %llu bytes; it holds %zu", who,
                           (unsigned long long)ev->header.length, sizeof b);
        }
        if (dp_transport_recv_payload(s->t, ev->peer, b, sizeof b, err) < 0)
            return -1;
        return dp_ps_table_send(s, ev->peer, b, who, err);
    }
    case DP_WIRE_PULL_AVERAGE:
        if (dp_transport_skip_payload(s->t, ev->peer, err) < 0)
            return -1;
        return dp_transport_send(s->t, ev->peer, DP_WIRE_PARAMS, 0, s->lo,
                                 s->ema ? s->ema : s->params, s->n * sizeof(float), err);
    case DP_WIRE_STATE_REQ: { /* [u32 flags] or nothing: STATE_DENSE, no rows */
        uint32_t flags = 0;
        if (ev->header.length == 4) {
            uint8_t b[4];
            if (dp_transport_recv_payload(s->t, ev->peer, b, 4, err) < 0)
                return -1;
            flags = dp_get_u32(b);
        } else if (dp_transport_skip_payload(s->t, ev->peer, err) < 0) {
            return -1;
        }
        if (ev->peer != s->chief)
            return dp_errf(err, "%s asked for the shard's training state; only the chief may",
                           who);
        return send_state(s, ev->peer, ev->header.step, !(flags & DP_PS_STATE_DENSE), err);
    }
    case DP_WIRE_JOIN:
        if (dp_transport_skip_payload(s->t, ev->peer, err) < 0)
            return -1;
        return wi >= 0 ? rejoin_worker(s, &s->w[wi], ev->header.step) : 0;
    case DP_WIRE_DONE:
        if (dp_transport_skip_payload(s->t, ev->peer, err) < 0)
            return -1;
        if (wi >= 0 && s->w[wi].live)
            return retire_worker(s, &s->w[wi], err);
        return 0;
    case DP_WIRE_START: /* a restarted chief starts everyone: this server serves already */
    case DP_WIRE_RESTORE: /* a late one, after this server started */
        if (ev->peer != s->chief)
            dp_warn("ignoring frame type %u from %s", ev->header.type, who);
        return dp_transport_skip_payload(s->t, ev->peer, err);
    case DP_WIRE_SHUTDOWN:
        if (dp_transport_skip_payload(s->t, ev->peer, err) < 0)
            return -1;
        if (ev->peer == s->chief) {
            s->chief_live = 0;
            return 1;
        }
        dp_warn("ignoring SHUTDOWN from %s: only the chief ends a run", who);
        return 0;
    default:
        dp_warn("ignoring frame type %u from %s", ev->header.type, who);
        return dp_transport_skip_payload(s->t, ev->peer, err);
    }
}

/* The chief is gone before it ended the run.  Where the strategy survives
 * that, the server serves the workers on and waits for a restarted chief
 * (docs/faults.md, "A lost chief"); otherwise the run is over. */
static int chief_lost(server *s, const dp_event *ev, dp_err *err)
{
    const char *who = dp_transport_peer_name(s->t, s->chief);
    if (!s->chief_live)
        return 0;
    if (!s->cfg.survives_chief)
        return dp_errf(err, "lost the chief %s (%s) before it ended the run", who, ev->reason);
    dp_warn("fault: lost the chief %s (%s); %s serves the workers on and waits for it to come "
            "back", who, ev->reason, self_name(s));
    s->chief_lost_at = dp_ps_now(s);
    return 0;
}

int dp_ps_server_poll(dp_ps_server *s, double timeout_s, dp_err *err)
{
    if (!s->chief_live && live_workers(s) == 0)
        return 1;
    if (s->chief_lost_at > 0 && live_workers(s) == 0 &&
        dp_ps_now(s) - s->chief_lost_at > CHIEF_WAIT)
        return dp_errf(err, "the chief %s was lost %.0f s ago and has not come back, and every "
                            "worker is done: the run cannot be finished (restart the chief, or "
                            "--resume from the newest checkpoint)",
                       dp_transport_peer_name(s->t, s->chief), CHIEF_WAIT);
    int waiting = 0;
    for (int i = 0; i < s->n_workers; i++)
        waiting |= s->w[i].pending | (s->backup ? s->backup->w[i].pending : 0);
    /* A rule that changes with time alone looks again soon while someone waits. */
    if (s->rules->watches_time && waiting && timeout_s > 0.005)
        timeout_s = 0.005;
    dp_event ev;
    if (dp_transport_poll(s->t, DP_PEER_ANY, timeout_s, &ev, err) < 0 ||
        dp_ps_replica_awake(s, err) < 0)
        return -1;
    if (ev.kind == DP_EVENT_TIMEOUT) {
        if (s->rules->watches_time && waiting &&
            (s->rules->release(s, err) < 0 ||
             (s->backup && s->rules->release(s->backup, err) < 0)))
            return -1;
        return 0;
    }
    int wi = s->worker_of[ev.peer];
    const char *who = dp_transport_peer_name(s->t, ev.peer);
    if (ev.peer == s->chief && s->chief_lost_at > 0 && ev.kind == DP_EVENT_FRAME) {
        dp_warn("fault: the chief %s is back; %s answers it again", who, self_name(s));
        s->chief_lost_at = 0;
    }
    if (ev.kind == DP_EVENT_PEER_LOST) {
        if (ev.peer == s->chief)
            return chief_lost(s, &ev, err);
        if (dp_ps_replica_lost(s, &ev))
            return 0;
        /* The shard this task backs up loses the worker too, silently. */
        if (s->backup && wi >= 0 && s->backup->w[wi].live &&
            retire_worker(s->backup, &s->backup->w[wi], err) < 0)
            return -1;
        if (wi < 0 || !s->w[wi].live)
            return 0;
        dp_warn("fault: lost %s at clock %ld (%s); %s goes on with the other workers", who,
                s->w[wi].clock, ev.reason, self_name(s));
        return retire_worker(s, &s->w[wi], err);
    }
    int rr = dp_ps_replica_frame(s, &ev, err);
    if (rr != 0)
        return rr < 0 ? -1 : 0;
    /* The shard the frame is for: this task's own, or the one it backs up. */
    server *h = dp_ps_replica_route(s, &ev);
    dp_err why;
    int rc = handle(h, &ev, wi, &why);
    if (h != s && s->shard < 0 && wi >= 0)
        s->w[wi].live = h->w[wi].live; /* a task with no shard of its own ends with its backup's workers */
    if (rc >= 0)
        return settle(h, err) < 0 ? -1 : rc;
    if (wi < 0 || ev.peer == s->chief) {
        *err = why;
        return -1;
    }
    /* A worker that sent what no worker may (or died in the middle of a
     * frame) is dropped; the server and the others go on. */
    if (!h->w[wi].live)
        return 0;
    dp_warn("fault: dropping %s: %s; %s goes on with the other workers", who, why.msg,
            self_name(s));
    return retire_worker(h, &h->w[wi], err);
}

void dp_ps_server_close(dp_ps_server *s)
{
    if (!s)
        return;
    dp_ps_replica_close(s);
    dp_ps_server_close(s->backup);
    dp_ps_shard_free(s);
}

int dp_ps_server_open(dp_ps_server **out, dp_transport *t, const dp_cluster *c,
                      const dp_ps_layout *layout, const dp_ps_config *cfg,
                      const dp_optim_config *optim, const dp_ps_start *start, size_t n_params,
                      dp_err *err)
{
    int me = dp_transport_rank(t), shard = -1;
    for (int i = 0; i < layout->n_shards; i++)
        if (layout->rank[i] == me)
            shard = i;
    if (dp_ps_shard_open(out, t, c, layout, cfg, rules_of[cfg->mode], optim, start, n_params, shard,
                         err) < 0)
        return -1;
    if (dp_ps_replica_open(*out, c, layout, optim, start, n_params, err) < 0) {
        dp_ps_server_close(*out);
        return -1;
    }
    return 0;
}

long dp_ps_server_updates(const dp_ps_server *s) { return s->updates; }

long dp_ps_server_clock(const dp_ps_server *s, int worker)
{
    return worker >= 0 && worker < s->n_workers ? s->w[worker].clock : -1;
}

int dp_ps_server_pending(const dp_ps_server *s, int worker)
{
    return worker >= 0 && worker < s->n_workers ? s->w[worker].pending : 0;
}

int dp_ps_serve(dp_transport *t, const dp_cluster *c, const dp_ps_layout *layout,
                const dp_ps_config *cfg, const dp_optim_config *optim, const dp_ps_start *start,
                size_t n_params, dp_err *err)
{
    dp_ps_server *s;
    if (dp_ps_server_open(&s, t, c, layout, cfg, optim, start, n_params, err) < 0)
        return -1;
    int rc;
    while ((rc = dp_ps_server_poll(s, 1.0, err)) == 0)
        ;
    if (rc > 0)
        dp_info("%s applied %ld update(s)", dp_transport_peer_name(t, dp_transport_rank(t)),
                s->updates);
    if (rc > 0 && s->backup && s->backup->primary_rank < 0)
        dp_info("%s holds %ld update(s) of shard %d, which it took over",
                dp_transport_peer_name(t, dp_transport_rank(t)), s->backup->updates,
                s->backup->shard);
    dp_ps_server_close(s);
    return rc < 0 ? -1 : 0;
}

/* ---------------------------------------------------------------- client */

/* The pushes a client may leave unanswered (cfg.push_behind), as far as it
 * can keep them: only ps-async's answers can wait; a shard that may fail
 * over is re-asked only the newest request (c->last), so one at most; MPI
 * may hold a large send until its receiver posts (docs/mpi.md), which would
 * stall the server; and the answers left unread must fit BEHIND_BYTES. */
static int push_behind(const dp_transport *t, const dp_ps_layout *layout, const dp_ps_config *cfg)
{
    int n = cfg->mode == DP_PS_ASYNC && cfg->push_behind > 0 ? cfg->push_behind : 0;
    if (n == 0)
        return 0;
    const char *why = NULL;
    int keep = n;
    size_t most = 0;
    for (int s = 0; s < layout->n_shards; s++)
        if ((layout->range[s].hi - layout->range[s].lo) * sizeof(float) > most)
            most = (layout->range[s].hi - layout->range[s].lo) * sizeof(float);
    if (strcmp(dp_transport_name(t), "mpi") == 0) {
        keep = 0;
        why = "MPI may hold a large answer until it is received";
    } else if (most > 0 && (size_t)n * most > BEHIND_BYTES) {
        keep = (int)(BEHIND_BYTES / most);
        why = "the answers left unread must fit the sockets' buffers";
    }
    if (keep > 1 && (cfg->replicas > 1 || cfg->ps_wait > 0)) {
        keep = 1;
        why = "a shard that fails over is asked again only the newest push";
    }
    if (keep < n)
        dp_info("--push-behind %d: %d kept (%s)", n, keep, why);
    return keep;
}

static int rows_buffers(dp_ps_client *c);

/* --compress: pushes of dense gradients go as coded blocks (with sparse
 * rows they stay f32 PUSH_ROWS; docs/strategies.md, "ps family:
 * compression"), with the residual beside them; --ps-reply bf16: the
 * answers' bytes.  Sized by the largest shard. */
static int coder_open(dp_ps_client *c)
{
    size_t most = 0, total = 0;
    /* --compress auto: laid out for its largest top-k (ps_auto.c), pushed
     * f32 until it has chosen */
    dp_compress cz = c->cfg.compress;
    if (cz.kind == DP_COMPRESS_AUTO)
        cz = (dp_compress){.kind = DP_COMPRESS_TOPK, .ratio = DP_PS_AUTO_MAX_RATIO};
    for (int s = 0; s < c->layout.n_shards; s++) {
        size_t n = c->layout.range[s].hi - c->layout.range[s].lo;
        most = n > most ? n : most;
        c->coff[s] = total;
        c->clen[s] = dp_coded_bytes(&cz, n);
        total += c->clen[s];
    }
    if (c->cfg.reply16 && !(c->in16 = malloc(2 * (most ? most : 1))))
        return -1;
    int coded = c->cfg.reply_topk > 0 || c->cfg.reply_delta4 ||
                c->cfg.compress.kind == DP_COMPRESS_AUTO; /* answers PARAMS_CODED */
    if (coded && !c->rules->pushes_params &&
        !(c->cin = malloc(DP_CODED_HEAD_SIZE + 8 * (most ? most : 1))))
        return -1;
    if (total == 0 || c->cfg.n_tables > 0 || c->rules->pushes_params)
        return 0;
    c->resid = calloc(c->n, sizeof(float));
    c->cbuf = malloc(total);
    c->ctmp = malloc(most * sizeof(float));
    c->ctmp2 = malloc(most * sizeof(float));
    return c->resid && c->cbuf && c->ctmp && c->ctmp2 ? 0 : -1;
}

float *dp_ps_client_residual(dp_ps_client *c) { return c->resid; }

int dp_ps_client_open(dp_ps_client **out, dp_transport *t, const dp_ps_layout *layout,
                      const dp_ps_config *cfg, const dp_optim_config *local_optim,
                      size_t n_params, dp_err *err)
{
    dp_ps_client *c = calloc(1, sizeof *c);
    if (!c)
        return dp_errf(err, "out of memory");
    c->t = t;
    c->rules = rules_of[cfg->mode];
    c->layout = *layout;
    c->cfg = *cfg;
    c->n = n_params;
    if (cfg->mode == DP_PS_ASYNC && cfg->push_every > 1) {
        c->acc = calloc(n_params, sizeof *c->acc);
        if (!c->acc)
            goto oom;
    }
    c->behind = cfg->n_tables > 0 ? 0 : push_behind(t, layout, cfg);
    if (cfg->n_tables > 0 && rows_buffers(c) < 0)
        goto oom;
    /* A send thread only where no shard fails over: a failover re-sends
     * from the caller's thread, in order with what it sent itself. */
    if (c->behind > 0 && !cfg->push_inline && cfg->replicas < 2 && cfg->ps_wait <= 0) {
        if (dp_sender_open(&c->q, t, layout->n_shards, err) < 0)
            goto fail;
        if (!(c->out = malloc(n_params * sizeof(float))))
            goto oom;
    }
    if (c->rules->pushes_params && dp_optim_init(&c->local, local_optim, n_params, err) < 0)
        goto fail;
    if (coder_open(c) < 0)
        goto oom;
    /* A push re-sent on failover must be the one made: a caller pushing
     * behind has changed its gradient by then. */
    if ((c->rules->pushes_params || c->behind > 0) && (cfg->replicas > 1 || cfg->ps_wait > 0) &&
        !(c->sent = malloc(n_params * sizeof(float))))
        goto oom;
    for (int s = 0; s < layout->n_shards; s++)
        c->inc[s] = dp_transport_peer_incarnation(t, layout->rank[s]);
    c->lr = local_optim->lr;
    *out = c;
    return 0;
oom:
    dp_errf(err, "out of memory for %zu parameters", n_params);
fail:
    dp_ps_client_free(c);
    return -1;
}

void dp_ps_client_free(dp_ps_client *c)
{
    if (!c)
        return;
    dp_sender_close(c->q);
    free(c->sec);
    free(c->rbuf);
    free(c->stage);
    free(c->out);
    free(c->acc);
    free(c->sent);
    free(c->resid);
    free(c->cbuf);
    free(c->ctmp);
    free(c->ctmp2);
    free(c->in16);
    free(c->cin);
    dp_optim_free(&c->local);
    free(c);
}

long dp_ps_client_max_gap(const dp_ps_client *c) { return c->max_gap; }

int dp_ps_client_push_behind(const dp_ps_client *c) { return c->behind; }

int dp_ps_client_in_flight(const dp_ps_client *c) { return c->in_flight; }

int dp_ps_client_send_thread(const dp_ps_client *c) { return c->q != NULL; }

/* ---- sparse rows: the client's buffers and sections ---- */

/* A table's rows on shard s of S (ps_shard.c's rule). */
static size_t rows_on(const dp_ps_table_spec *t, int s, int S)
{
    return t->rows > (uint32_t)s ? (t->rows - 1 - (uint32_t)s) / (uint32_t)S + 1 : 0;
}

/* The section of a request to one shard holds at most a step's ids of each
 * table that the shard holds; the answers are read through rbuf. */
static int rows_buffers(dp_ps_client *c)
{
    int S = c->layout.n_shards;
    size_t sec = 0, rb = 4096;
    for (int k = 0; k < c->cfg.n_tables; k++) {
        const dp_ps_table_spec *t = &c->cfg.tables[k];
        size_t most = rows_on(t, 0, S);
        if (t->max_ids < most)
            most = t->max_ids;
        sec += 4 + most * (4 + 4 * (size_t)t->width);
        if (most * t->width > rb)
            rb = most * t->width;
        if (t->width > rb)
            rb = t->width;
    }
    c->sec_cap = sec;
    c->rbuf_floats = rb;
    c->sec = malloc(sec ? sec : 1);
    c->rbuf = malloc(rb * sizeof(float));
    return c->sec && c->rbuf ? 0 : -1;
}

/* Shard s's part of the next step's rows: per table [u32 count][ids], and
 * with v (a push) each row's floats from v; the byte count. */
static size_t put_section(dp_ps_client *c, int s, const float *v)
{
    int S = c->layout.n_shards;
    uint8_t *p = c->sec;
    for (int k = 0; k < c->cfg.n_tables; k++) {
        const dp_ps_table_spec *t = &c->cfg.tables[k];
        uint8_t *count = p;
        uint32_t n = 0;
        p += 4;
        for (long i = 0; i < c->n_ids[k]; i++)
            if (c->ids[k][i] % (uint32_t)S == (uint32_t)s) {
                dp_put_u32(p, c->ids[k][i]);
                p += 4;
                n++;
            }
        dp_put_u32(count, n);
        if (!v)
            continue;
        size_t w = t->width;
        for (long i = 0; i < c->n_ids[k]; i++)
            if (c->ids[k][i] % (uint32_t)S == (uint32_t)s) {
                size_t at = t->slots ? t->local_off + (size_t)i * w
                                     : t->off + (size_t)c->ids[k][i] * w;
                memcpy(p, v + at, w * sizeof(float));
                p += w * sizeof(float);
            }
    }
    return (size_t)(p - c->sec);
}

/* ---- the client's requests, and failover to a shard's backup ---- */

static const char *client_name(const dp_ps_client *c)
{
    return dp_transport_peer_name(c->t, dp_transport_rank(c->t));
}

/* The shards task `rank` holds, as this client knows them: its
 * incarnation, and a JOIN at the worker's step to a restarted one. */
static int tell_restarted(dp_ps_client *c, int rank, dp_err *err)
{
    for (int s = 0; s < c->layout.n_shards; s++) {
        if (c->layout.rank[s] != rank)
            continue;
        c->inc[s] = dp_transport_peer_incarnation(c->t, rank);
        if (c->step > 0 && dp_transport_send(c->t, rank, DP_WIRE_JOIN, (uint64_t)c->step,
                                             c->layout.range[s].lo, NULL, 0, err) < 0)
            return 1;
    }
    return 0;
}

/* What happened to ps task `rank`, for the fault line: "lost ps:0", or,
 * when this side dropped the connection because a frame from it failed
 * authentication (transport.h), that: the ps may well be alive, and the
 * frame was altered or replayed on the way (docs/faults.md, "Who decides"). */
static const char *loss_of(const dp_ps_client *c, int rank, char *buf, size_t cap)
{
    const char *who = dp_transport_peer_name(c->t, rank);
    if (dp_transport_peer_tampered(c->t, rank))
        snprintf(buf, cap, "dropped its connection to %s: a frame from %s failed authentication "
                 "(altered or replayed on the way; %s itself may be alive)", who, who, who);
    else
        snprintf(buf, cap, "lost %s", who);
    return buf;
}

/* A ps task with no backup is lost: wait for it to be restarted (a new
 * incarnation of it connected), have it restored (the chief's hook), tell
 * it where this worker is, and go on with it (docs/faults.md, "A restarted
 * ps").  The loss is taken from the transport here, which installs the new
 * connection only after that. */
static int await_restart(dp_ps_client *c, int rank, int shard, const char *reason, dp_err *err)
{
    const char *who = dp_transport_peer_name(c->t, rank);
    uint64_t old = c->inc[shard];
    double deadline = dp_now() + c->cfg.ps_wait;
    char what[320];
    loss_of(c, rank, what, sizeof what);
    dp_warn("fault: %s %s (%s); waiting up to %.0f s for it to be restarted", client_name(c), what,
            reason, c->cfg.ps_wait);
    for (;;) {
        if (dp_now() > deadline)
            return dp_errf(err, "%s (%s), which held shard %d of the parameters, and it was "
                                "not restarted within %.0f s (--resume continues from the newest "
                                "checkpoint)", what, reason, shard, c->cfg.ps_wait);
        dp_event ev;
        if (dp_transport_poll(c->t, rank, 0.1, &ev, err) < 0)
            return -1;
        if (ev.kind == DP_EVENT_FRAME) {
            dp_warn("ignoring frame type %u from %s while it restarts", ev.header.type, who);
            if (dp_transport_skip_payload(c->t, rank, err) < 0)
                continue;
        }
        /* Connect (dialing it where this side dials: a loss taken as
         * orderly, a BYE, is not redialed by the transport). */
        dp_err e;
        if (dp_transport_connect(c->t, rank, dp_now() + 0.5, &e) < 0)
            continue;
        uint64_t inc = dp_transport_peer_incarnation(c->t, rank);
        if (inc == 0)
            continue;
        /* The same process again (its link was cut, or it was stopped and
         * did not notice): its shard is intact, and it takes the worker back
         * at the JOIN.  A new one is restored first. */
        int same = inc == old;
        if (same && c->step > 0 && (c->cfg.mode == DP_PS_SYNC || c->cfg.mode == DP_PS_AVG))
            /* It dropped this worker, maybe in the middle of a round it
             * closed without it: a new incarnation rejoins cleanly. */
            return dp_errf(err, "%s is back as the same process after dropping this worker "
                                "(%s): in %s a worker takes part again only as a restarted one",
                           who, reason, c->rules->name);
        int rc = !same && c->on_restart ? c->on_restart(c->restart_ctx, rank, err) : 0;
        if (rc < 0)
            return -1;
        if (rc == 0 && (rc = tell_restarted(c, rank, &e)) == 0) {
            dp_warn("fault: %s is back%s; %s goes on with it", who,
                    same ? " (the same process: its shard is intact)" : "", client_name(c));
            return 0;
        }
        old = inc; /* lost again on the way: wait for the next one */
    }
}

int dp_ps_client_lost(dp_ps_client *c, int rank, const char *reason, dp_err *err)
{
    dp_ps_layout *l = &c->layout;
    char what[320];
    loss_of(c, rank, what, sizeof what);
    int moved = 0, news = 0;
    for (int s = 0; s < l->n_shards; s++) {
        news |= l->rank[s] == rank || l->backup[s] == rank;
        if (l->backup[s] == rank)
            l->backup[s] = -1;
    }
    for (int s = 0; s < l->n_shards; s++) {
        if (l->rank[s] != rank)
            continue;
        if (l->backup[s] < 0 && c->cfg.ps_wait > 0)
            return await_restart(c, rank, s, reason, err) < 0 ? -1 : 1;
        if (l->backup[s] < 0)
            return dp_errf(err, "%s (%s): it held shard %d of the parameters and no copy of "
                                "it is left%s", what, reason, s,
                           c->cfg.replicas < 2 ? " (--ps-replicas 2 keeps a backup of each shard)"
                                               : "");
        dp_warn("fault: %s %s (%s); shard %d goes on on its backup %s", client_name(c), what,
                reason, s, dp_transport_peer_name(c->t, l->backup[s]));
        l->rank[s] = l->backup[s];
        l->backup[s] = -1;
        moved++;
    }
    if (news && c->on_failover)
        c->on_failover(c->failover_ctx, rank, reason);
    return moved;
}

void dp_ps_client_on_failover(dp_ps_client *c, void (*fn)(void *ctx, int rank, const char *reason),
                              void *ctx)
{
    c->on_failover = fn;
    c->failover_ctx = ctx;
}

void dp_ps_client_on_restart(dp_ps_client *c, int (*fn)(void *ctx, int rank, dp_err *err),
                             void *ctx)
{
    c->on_restart = fn;
    c->restart_ctx = ctx;
}

void dp_ps_client_at_step(dp_ps_client *c, long step) { c->step = step; }

/* Sends shard s the client's newest request (c->last) once. */
static int send_request(dp_ps_client *c, int s, dp_err *err)
{
    const dp_range *r = &c->layout.range[s];
    int rank = c->layout.rank[s];
    if (c->last.type == DP_WIRE_PUSH_GRAD || c->last.type == DP_WIRE_PUSH_PARAMS ||
        c->last.type == DP_WIRE_PUSH_HOST) {
        dp_push_head head = {c->last.records, (uint32_t)c->last.want, c->lr, (uint32_t)c->step};
        uint8_t raw[DP_PUSH_HEAD_SIZE];
        dp_push_head_put(raw, &head);
        if (c->last.type == DP_WIRE_PUSH_HOST) {
            struct iovec iov[3] = {{raw, sizeof raw},
                                   {(void *)c->last.host, c->last.host_len},
                                   {(void *)(c->last.v + r->lo), (r->hi - r->lo) * sizeof(float)}};
            return dp_transport_sendv(c->t, rank, DP_WIRE_PUSH_HOST, c->last.step, r->lo, iov, 3,
                                      err);
        }
        /* with sparse tables a gradient push carries the step's rows */
        int rows = c->cfg.n_tables > 0 && c->last.type == DP_WIRE_PUSH_GRAD;
        if (c->cfg.chunks > 0 && c->last.type == DP_WIRE_PUSH_GRAD) {
            /* --sum-chunk: this shard's slice of every chunk, in order */
            struct iovec iov[1 + DP_PS_MAX_CHUNKS] = {{raw, sizeof raw}};
            for (int j = 0; j < c->cfg.chunks; j++)
                iov[1 + j] = (struct iovec){(void *)(c->last.v + (size_t)j * c->n + r->lo),
                                            (r->hi - r->lo) * sizeof(float)};
            return dp_transport_sendv(c->t, rank, c->last.type, c->last.step, r->lo, iov,
                                      1 + c->cfg.chunks, err);
        }
        if (c->last.coded) {
            struct iovec iov[2] = {{raw, sizeof raw}, {c->cbuf + c->coff[s], c->clen[s]}};
            return dp_transport_sendv(c->t, rank, DP_WIRE_PUSH_CODED, c->last.step, r->lo, iov,
                                      2, err);
        }
        struct iovec iov[3] = {{raw, sizeof raw},
                               {(void *)(c->last.v + r->lo - c->cfg.dense_shift),
                                (r->hi - r->lo) * sizeof(float)},
                               {c->sec, rows ? put_section(c, s, c->last.v) : 0}};
        return dp_transport_sendv(c->t, rank, rows ? DP_WIRE_PUSH_ROWS : c->last.type,
                                  c->last.step, r->lo, iov, 2 + rows, err);
    }
    if (c->last.type == DP_WIRE_PULL_ROWS)
        return dp_transport_send(c->t, rank, c->last.type, c->last.step, r->lo, c->sec,
                                 put_section(c, s, NULL), err);
    return dp_transport_send(c->t, rank, c->last.type, c->last.step, r->lo, NULL, 0, err);
}

/* Sends shard s the newest request, on its backup when its primary cannot
 * be sent to. */
static int request(dp_ps_client *c, int s, dp_err *err)
{
    for (;;) {
        dp_err why;
        if (send_request(c, s, &why) == 0)
            return 0;
        if (dp_ps_client_lost(c, c->layout.rank[s], why.msg, err) < 0)
            return -1;
    }
}

/* The send thread's frames go out before any the caller sends itself, so
 * each shard sees a client's requests in order.  A peer the thread could
 * not send to is lost (no shard fails over where a thread sends). */
static int sends_done(dp_ps_client *c, dp_err *err)
{
    int peer;
    dp_err why;
    if (!c->q || dp_sender_wait(c->q, c->q_last, &peer, &why) == 0)
        return 0;
    return dp_ps_client_lost(c, peer, why.msg, err) < 0 ? -1 : dp_errf(err, "%s", why.msg);
}

/* The push in c->last, through the send thread: copied, so the caller may
 * change v while it goes out. */
static int queue_push(dp_ps_client *c, dp_err *err)
{
    if (sends_done(c, err) < 0)
        return -1;
    if (!c->last.coded) {
        memcpy(c->out, c->last.v, c->n * sizeof(float));
        c->last.v = c->out;
    }
    dp_push_head head = {c->last.records, (uint32_t)c->last.want, c->lr, (uint32_t)c->step};
    uint8_t raw[DP_PUSH_HEAD_SIZE];
    dp_push_head_put(raw, &head);
    for (int s = 0; s < c->layout.n_shards; s++) {
        const dp_range *r = &c->layout.range[s];
        int peer;
        dp_err why;
        c->q_last = c->last.coded
                        ? dp_sender_push_head(c->q, c->layout.rank[s], DP_WIRE_PUSH_CODED,
                                              c->last.step, r->lo, raw, sizeof raw,
                                              c->cbuf + c->coff[s], c->clen[s], &peer, &why)
                        : dp_sender_push_head(c->q, c->layout.rank[s], c->last.type,
                                              c->last.step, r->lo, raw, sizeof raw,
                                              c->out + r->lo - c->cfg.dense_shift,
                                              (r->hi - r->lo) * sizeof(float), &peer, &why);
        if (c->q_last < 0)
            return dp_ps_client_lost(c, peer, why.msg, err) < 0 ? -1
                                                                 : dp_errf(err, "%s", why.msg);
    }
    return 0;
}

static int request_all(dp_ps_client *c, unsigned type, uint64_t step, dp_err *err)
{
    if (sends_done(c, err) < 0)
        return -1;
    c->last.type = type;
    c->last.step = step;
    for (int s = 0; s < c->layout.n_shards; s++)
        if (request(c, s, err) < 0)
            return -1;
    return 0;
}

static int push_untraced(dp_ps_client *c, unsigned type, const float *v, uint32_t records,
                         int want, dp_err *err);

int dp_ps_push(dp_ps_client *c, unsigned type, const float *v, uint32_t records, int want,
               dp_err *err)
{
    double t0 = dp_now();
    int rc = push_untraced(c, type, v, records, want, err);
    dp_trace_span("push", "push", t0, dp_now(), -1);
    return rc;
}

static int push_untraced(dp_ps_client *c, unsigned type, const float *v, uint32_t records,
                         int want, dp_err *err)
{
    c->last.coded = type == DP_WIRE_PUSH_GRAD && c->resid &&
                    c->cfg.compress.kind != DP_COMPRESS_AUTO &&
                    c->cfg.compress.kind != DP_COMPRESS_NONE; /* auto: f32 until it chose */
    if (c->last.coded) {
        /* the send thread may still be sending the last push's blocks */
        if (sends_done(c, err) < 0)
            return -1;
        for (int s = 0; s < c->layout.n_shards; s++) {
            size_t lo = c->layout.range[s].lo, n = c->layout.range[s].hi - lo;
            dp_coded_encode(&c->cfg.compress, v + lo, c->resid + lo, n, c->ctmp, c->ctmp2,
                            c->cbuf + c->coff[s]);
        }
    } else if (c->sent && (type == DP_WIRE_PUSH_PARAMS || c->behind > 0)) {
        memcpy(c->sent, v, c->n * sizeof(float));
        v = c->sent;
    }
    c->last.v = v;
    c->last.records = records;
    c->last.want = want;
    if (c->q && type == DP_WIRE_PUSH_GRAD) {
        c->last.type = type;
        c->last.step = (uint64_t)c->clock;
        return queue_push(c, err);
    }
    return request_all(c, type, (uint64_t)c->clock, err);
}

int dp_ps_client_say(dp_ps_client *c, unsigned type, uint64_t step, dp_err *err)
{
    dp_ps_layout *l = &c->layout;
    if (sends_done(c, err) < 0)
        return -1;
    for (int s = 0; s < l->n_shards; s++) {
        for (int copy = 0; copy < 2; copy++) {
            int rank = copy ? l->backup[s] : l->rank[s];
            dp_err why;
            if (rank < 0 ||
                dp_transport_send(c->t, rank, type, step, l->range[s].lo, NULL, 0, &why) == 0)
                continue;
            if (dp_ps_client_lost(c, rank, why.msg, err) < 0)
                return -1;
            if (copy == 0)
                copy = -1; /* the shard moved to its backup: tell it there */
        }
    }
    return 0;
}

/* One answer of frame type `type` per shard, from whichever task holds the
 * shard now, in whatever order they come (a task that took a shard over
 * answers for two).  take reads the payload of shard s's answer: -1 when it
 * could not be read (its sender is lost), -2 when it is not what it should
 * be.  A task lost meanwhile is asked again on the backups. */
typedef int (*take_fn)(dp_ps_client *c, int s, const dp_event *ev, void *ctx, dp_err *err);

static int shard_answering(const dp_ps_client *c, int rank, uint64_t offset, const char *got)
{
    for (int s = 0; s < c->layout.n_shards; s++)
        if (!got[s] && c->layout.rank[s] == rank && c->layout.range[s].lo == offset)
            return s;
    return -1;
}

static int fail_over(dp_ps_client *c, int rank, const char *reason, const char *got, dp_err *err)
{
    char moved[DP_PARTITION_MAX] = {0};
    for (int s = 0; s < c->layout.n_shards; s++)
        moved[s] = !got[s] && c->layout.rank[s] == rank;
    if (dp_ps_client_lost(c, rank, reason, err) < 0)
        return -1;
    for (int s = 0; s < c->layout.n_shards; s++)
        if (moved[s] && request(c, s, err) < 0)
            return -1;
    return 0;
}

static int collect(dp_ps_client *c, unsigned type, const char *what, take_fn take, void *ctx,
                   dp_err *err)
{
    char got[DP_PARTITION_MAX] = {0};
    for (int left = c->layout.n_shards; left > 0;) {
        int first = 0;
        while (got[first])
            first++;
        int rank = c->layout.rank[first];
        dp_event ev;
        dp_err why;
        if (dp_transport_recv(c->t, rank, what, PS_TIMEOUT, &ev, &why) < 0) {
            if (ev.kind != DP_EVENT_PEER_LOST) {
                *err = why;
                return -1;
            }
            if (fail_over(c, rank, ev.reason, got, err) < 0)
                return -1;
            continue;
        }
        int s = shard_answering(c, rank, ev.header.offset, got);
        /* a worker's PARAMS come as PARAMS16 with --ps-reply bf16 */
        int same = ev.header.type == type ||
                   (type == DP_WIRE_PARAMS && (ev.header.type == DP_WIRE_PARAMS16 ||
                                               ev.header.type == DP_WIRE_PARAMS_CODED));
        if (!same || s < 0)
            return dp_errf(err, "%s answered with frame type %u of %llu bytes at %llu; expected "
                                "%s for a shard it holds",
                           dp_transport_peer_name(c->t, rank), ev.header.type,
                           (unsigned long long)ev.header.length,
                           (unsigned long long)ev.header.offset, what);
        int rc = take(c, s, &ev, ctx, &why);
        if (rc == -2) {
            *err = why;
            return -1;
        }
        if (rc < 0) {
            if (fail_over(c, rank, why.msg, got, err) < 0)
                return -1;
            continue;
        }
        got[s] = 1;
        left--;
    }
    return 0;
}

static int take_params(dp_ps_client *c, int s, const dp_event *ev, void *ctx, dp_err *err)
{
    float *params = ctx;
    const dp_range *r = &c->layout.range[s];
    size_t len = (r->hi - r->lo) * sizeof(float);
    if (ev->header.type == DP_WIRE_PARAMS_CODED) {
        /* the 4-bit difference from this worker's copy, or the parameters
         * that moved most since it, which the server's mirror of it takes too
         * (docs/strategies.md) */
        uint64_t L = ev->header.length, most = DP_CODED_HEAD_SIZE + 2 * len;
        if (!c->cin || L > most) {
            dp_errf(err, "%s answered with a coded answer of %llu bytes for shard %d; %s",
                    dp_transport_peer_name(c->t, ev->peer), (unsigned long long)L, s,
                    c->cin ? "more than a top-k block of the shard takes"
                           : "this run answers uncoded (no --ps-reply topk or delta4, no "
                             "--compress auto)");
            return -2;
        }
        dp_err why;
        if (dp_transport_recv_payload(c->t, ev->peer, c->cin, (size_t)L, err) < 0)
            return -1;
        float *x = params + r->lo - c->cfg.dense_shift;
        size_t n = r->hi - r->lo;
        if ((L >= 4 && dp_get_u32(c->cin) == DP_CODED_DELTA4
                 ? dp_delta4_apply(c->cin, (size_t)L, x, n, &why)
                 : dp_coded_set(c->cin, (size_t)L, x, n, &why)) < 0) {
            dp_errf(err, "%s answered shard %d badly: %s", dp_transport_peer_name(c->t, ev->peer),
                    s, why.msg);
            return -2;
        }
    } else if (ev->header.type == DP_WIRE_PARAMS16) {
        /* --ps-reply bf16: half the bytes, rounded (docs/strategies.md) */
        if (!c->in16 || ev->header.length != len / 2) {
            dp_errf(err, "%s answered with %llu bytes of bf16 parameters for shard %d; expected "
                         "%s",
                    dp_transport_peer_name(c->t, ev->peer), (unsigned long long)ev->header.length,
                    s, c->in16 ? "half its f32 bytes" : "f32 (no --ps-reply bf16)");
            return -2;
        }
        if (dp_transport_recv_payload(c->t, ev->peer, c->in16, len / 2, err) < 0)
            return -1;
        dp_compress_decode16(DP_COMPRESS_BF16, c->in16, r->hi - r->lo,
                             params + r->lo - c->cfg.dense_shift);
    } else if (ev->header.length != len) {
        dp_errf(err, "%s answered with %llu bytes of parameters for shard %d; expected %zu",
                dp_transport_peer_name(c->t, ev->peer), (unsigned long long)ev->header.length, s,
                len);
        return -2;
    }
    else if (dp_transport_recv_payload(c->t, ev->peer, params + r->lo - c->cfg.dense_shift, len,
                                       err) < 0)
        return -1;
    long gap = c->clock - (long)ev->header.step;
    if (gap > c->max_gap)
        c->max_gap = gap;
    return 0;
}

/* Receives every shard's PARAMS straight into params. */
int dp_ps_receive(dp_ps_client *c, float *params, dp_err *err)
{
    /* Under ps-sync this is where a worker waits for the slowest one. */
    double t0 = dp_now();
    int rc = collect(c, DP_WIRE_PARAMS, "parameters", take_params, params, err);
    dp_trace_span("pull", "pull", t0, dp_now(), -1);
    return rc;
}

/* Every shard answers a client's requests in order on its connection, so
 * the next PARAMS from each is the oldest push's answer. */
int dp_ps_settle(dp_ps_client *c, float *params, int left, dp_err *err)
{
    for (; c->in_flight > left; c->in_flight--)
        if (dp_ps_receive(c, params, err) < 0)
            return -1;
    return 0;
}

/* Shard s's ROWS answer: the step's ids it holds, scattered into params
 * (ctx) through rbuf. */
static int take_rows(dp_ps_client *c, int s, const dp_event *ev, void *ctx, dp_err *err)
{
    float *params = ctx;
    int S = c->layout.n_shards;
    uint64_t want = 0;
    for (int k = 0; k < c->cfg.n_tables; k++) {
        const dp_ps_table_spec *t = &c->cfg.tables[k];
        uint64_t n = 0;
        for (long i = 0; i < c->n_ids[k]; i++)
            n += c->ids[k][i] % (uint32_t)S == (uint32_t)s;
        want += n * t->width * sizeof(float);
    }
    if (ev->header.length != want) {
        dp_errf(err, "%s answered with %llu bytes of rows for shard %d; expected %llu",
                dp_transport_peer_name(c->t, ev->peer), (unsigned long long)ev->header.length, s,
                (unsigned long long)want);
        return -2;
    }
    for (int k = 0; k < c->cfg.n_tables; k++) {
        const dp_ps_table_spec *t = &c->cfg.tables[k];
        size_t w = t->width, chunk = c->rbuf_floats / w;
        long i = 0; /* the next of the step's ids */
        for (;;) {
            /* the next chunk of this table's rows: ids[] entries */
            size_t m = 0;
            for (long j = i; j < c->n_ids[k] && m < chunk; j++)
                m += c->ids[k][j] % (uint32_t)S == (uint32_t)s;
            if (m == 0)
                break;
            if (dp_transport_recv_payload(c->t, ev->peer, c->rbuf, m * w * sizeof(float), err) < 0)
                return -1;
            for (size_t q = 0; q < m; q++) {
                while (c->ids[k][i] % (uint32_t)S != (uint32_t)s)
                    i++;
                size_t at = t->slots ? t->local_off + (size_t)i * w
                                     : t->off + (size_t)c->ids[k][i] * w;
                i++;
                memcpy(params + at, c->rbuf + q * w, w * sizeof(float));
            }
        }
    }
    long gap = c->clock - (long)ev->header.step;
    if (gap > c->max_gap)
        c->max_gap = gap;
    return 0;
}

int dp_ps_client_pull_rows(dp_ps_client *c, float *params, const uint32_t *const *ids,
                           const long *n, dp_err *err)
{
    for (int k = 0; k < c->cfg.n_tables; k++) {
        const dp_ps_table_spec *t = &c->cfg.tables[k];
        /* the section buffer holds max_ids ids of a table, each below its rows */
        if (n[k] < 0 || (uint64_t)n[k] > t->max_ids)
            return dp_errf(err, "%ld rows of sparse table %d in one step; at most %u", n[k], k,
                           t->max_ids);
        for (long i = 0; i < n[k]; i++)
            if (ids[k][i] >= t->rows || (i > 0 && ids[k][i] <= ids[k][i - 1]))
                return dp_errf(err, "row id %u (entry %ld) of sparse table %d: ids must be below "
                                    "its %u rows and strictly increasing",
                               ids[k][i], i, k, t->rows);
        c->ids[k] = ids[k];
        c->n_ids[k] = n[k];
    }
    double t0 = dp_now();
    int rc = request_all(c, DP_WIRE_PULL_ROWS, (uint64_t)c->clock, err) < 0
                 ? -1
                 : collect(c, DP_WIRE_ROWS, "rows", take_rows, params, err);
    dp_trace_span("pull rows", "pull", t0, dp_now(), -1);
    return rc;
}

int dp_ps_table_rows_check(unsigned type, uint64_t offset, uint64_t length, const uint8_t *head,
                           const uint8_t *want, uint32_t width, uint64_t lo, const char *peer,
                           dp_err *err)
{
    uint32_t k = dp_get_u32(want), part = dp_get_u32(want + 4), first = dp_get_u32(want + 8),
             n = dp_get_u32(want + 12);
    uint64_t len = DP_PS_STATE_ROWS_HEAD + (uint64_t)n * width * sizeof(float);
    if (!head) {
        if (type != DP_WIRE_TABLE_ROWS || offset != lo || length != len)
            return dp_errf(err, "%s answered with frame type %u of %llu bytes at %llu; expected "
                                "TABLE_ROWS of %llu bytes at %llu (rows [%u, +%u) of sparse table "
                                "%u, part %u)", peer, type, (unsigned long long)length,
                           (unsigned long long)offset, (unsigned long long)len,
                           (unsigned long long)lo, first, n, k, part);
        return 0;
    }
    if (memcmp(head, want, DP_PS_STATE_ROWS_HEAD) != 0)
        return dp_errf(err, "%s sent rows [%u, +%u) of sparse table %u, part %u; expected rows "
                            "[%u, +%u) of table %u, part %u (a chunk missing, repeated or out of "
                            "order)", peer, dp_get_u32(head + 8), dp_get_u32(head + 12),
                       dp_get_u32(head), dp_get_u32(head + 4), first, n, k, part);
    return 0;
}

/* Rows [first, first + n) in local order of shard sh's table k, part
 * `part` (0 the rows, q slot q-1), n at most a chunk: one PULL_TABLE and
 * its TABLE_ROWS answer, checked (dp_ps_table_rows_check) and read into
 * dst (n x width floats).  Each chunk is asked and answered alone, so no
 * frame or buffer grows with a table, and a task serving two shards (a
 * failover) answers each in turn; a shard lost meanwhile is asked again on
 * its backup (docs/strategies.md, "Sparse rows"). */
static int table_chunk(dp_ps_client *c, int sh, int k, int part, size_t first, size_t n,
                       float *dst, dp_err *err)
{
    uint32_t w = c->cfg.tables[k].width;
    uint8_t ask[DP_PS_STATE_ROWS_HEAD], head[DP_PS_STATE_ROWS_HEAD];
    dp_put_u32(ask, (uint32_t)k);
    dp_put_u32(ask + 4, (uint32_t)part);
    dp_put_u32(ask + 8, (uint32_t)first);
    dp_put_u32(ask + 12, (uint32_t)n);
    for (;;) {
        int rank = c->layout.rank[sh];
        uint64_t lo = c->layout.range[sh].lo;
        const char *peer = dp_transport_peer_name(c->t, rank);
        dp_event ev;
        dp_err why;
        int rc = dp_transport_send(c->t, rank, DP_WIRE_PULL_TABLE, (uint64_t)c->clock, lo, ask,
                                   sizeof ask, &why);
        if (rc == 0 && (rc = dp_transport_recv(c->t, rank, "rows of its tables", PS_TIMEOUT, &ev,
                                               &why)) < 0 && ev.kind != DP_EVENT_PEER_LOST) {
            *err = why;
            return -1;
        }
        if (rc == 0) {
            if (dp_ps_table_rows_check(ev.header.type, ev.header.offset, ev.header.length, NULL,
                                       ask, w, lo, peer, err) < 0)
                return -1;
            rc = dp_transport_recv_payload(c->t, rank, head, sizeof head, &why);
            if (rc == 0 && dp_ps_table_rows_check(ev.header.type, ev.header.offset,
                                                  ev.header.length, head, ask, w, lo, peer,
                                                  err) < 0)
                return -1;
            if (rc == 0 && (rc = dp_transport_recv_payload(c->t, rank, dst,
                                                           n * w * sizeof(float), &why)) == 0) {
                long gap = c->clock - (long)ev.header.step;
                if (gap > c->max_gap)
                    c->max_gap = gap;
                return 0;
            }
        }
        if (dp_ps_client_lost(c, rank, why.msg, err) < 0)
            return -1;
    }
}

/* Rows of table k one PULL_TABLE asks at most: a chunk, and no more than
 * `cap` floats hold. */
static size_t table_chunk_rows(const dp_ps_client *c, int k, size_t cap)
{
    size_t w = c->cfg.tables[k].width, per = dp_ps_state_chunk_rows(&c->cfg, w);
    return cap / w < per ? cap / w : per;
}

/* A pass over every table's rows (the chief writing a file from compact
 * tables, docs/strategies.md "The chief on rows"): read a piece at a time
 * as the file wants them, each shard's share of a piece asked in chunks. */
int dp_ps_client_tables_end(dp_ps_client *c, dp_err *err)
{
    (void)err; /* every chunk asked was read whole: nothing is left in flight */
    c->tab_on = 0;
    return 0;
}

int dp_ps_client_tables_read(dp_ps_client *c, int part, int k, float *dst, size_t n,
                             dp_err *err)
{
    if (!c->tab_on) {
        if (sends_done(c, err) < 0)
            return -1;
        c->tab_on = 1, c->tab_part = part, c->tab_k = 0, c->tab_pos = 0;
    }
    if (part != c->tab_part)
        return dp_errf(err, "part %d of the sparse tables asked while part %d is read", part,
                       c->tab_part);
    if (k == c->tab_k + 1 && c->tab_k < c->cfg.n_tables &&
        c->tab_pos == (size_t)c->cfg.tables[c->tab_k].rows * c->cfg.tables[c->tab_k].width)
        c->tab_k = k, c->tab_pos = 0; /* the next table */
    if (k != c->tab_k || k >= c->cfg.n_tables)
        return dp_errf(err, "sparse table %d's rows asked out of order (table %d is next)", k,
                       c->tab_k);
    const dp_ps_table_spec *t = &c->cfg.tables[k];
    size_t w = t->width, S = (size_t)c->layout.n_shards, all = (size_t)t->rows * w;
    if (n == 0)
        return 0;
    if (n > all - c->tab_pos)
        return dp_errf(err, "%zu floats of sparse table %d asked; %zu are left", n, k,
                       all - c->tab_pos);
    /* floats [pos, pos + n): row r from shard r mod S, its local row r / S;
     * each shard's rows of them (whole: a row cut by the piece's ends is
     * asked whole, again by the next piece) into the stage, then laid out */
    size_t pos = c->tab_pos, end = pos + n, r0 = pos / w, r1 = (end + w - 1) / w;
    size_t lr0[DP_PARTITION_MAX], cnt[DP_PARTITION_MAX], at[DP_PARTITION_MAX], need = 0;
    for (size_t sh = 0; sh < S; sh++) {
        /* the first local row at or after r0, and the rows of [r0, r1) */
        lr0[sh] = r0 / S + (r0 % S > sh);
        size_t hi = r1 / S + (r1 % S > sh);
        cnt[sh] = hi > lr0[sh] ? hi - lr0[sh] : 0;
        at[sh] = need;
        need += cnt[sh] * w;
    }
    if (need > c->stage_cap) {
        float *p = realloc(c->stage, need * sizeof(float));
        if (!p)
            return dp_errf(err, "out of memory for %zu floats of rows", need);
        c->stage = p, c->stage_cap = need;
    }
    size_t per = dp_ps_state_chunk_rows(&c->cfg, w);
    for (size_t sh = 0; sh < S; sh++)
        for (size_t i = 0, m; i < cnt[sh]; i += m) {
            m = cnt[sh] - i < per ? cnt[sh] - i : per;
            if (table_chunk(c, (int)sh, k, part, lr0[sh] + i, m, c->stage + at[sh] + i * w,
                            err) < 0)
                return -1;
        }
    for (size_t r = r0; r < r1; r++) {
        size_t a = r * w > pos ? r * w : pos, b = (r + 1) * w < end ? (r + 1) * w : end;
        memcpy(dst + (a - pos), c->stage + at[r % S] + (r / S - lr0[r % S]) * w + (a - r * w),
               (b - a) * sizeof(float));
    }
    c->tab_pos = end;
    if (k == c->cfg.n_tables - 1 && end == all)
        c->tab_on = 0; /* the pass is over */
    return 0;
}

int dp_ps_client_pull(dp_ps_client *c, float *params, int average, dp_err *err)
{
    /* The pushes' answers come first on each connection. */
    if (dp_ps_settle(c, params, 0, err) < 0)
        return -1;
    if (request_all(c, average ? DP_WIRE_PULL_AVERAGE : DP_WIRE_PULL, (uint64_t)c->clock, err) < 0 ||
        dp_ps_receive(c, params, err) < 0)
        return -1;
    if (c->cfg.n_tables == 0 || c->cfg.tables[0].slots)
        return 0;
    /* every row of every table, shard by shard, a chunk at a time through
     * rbuf into its place (row id = shard + local x S) */
    size_t S = (size_t)c->layout.n_shards;
    for (size_t sh = 0; sh < S; sh++)
        for (int k = 0; k < c->cfg.n_tables; k++) {
            const dp_ps_table_spec *t = &c->cfg.tables[k];
            size_t w = t->width, rows = rows_on(t, (int)sh, (int)S);
            size_t per = table_chunk_rows(c, k, c->rbuf_floats);
            for (size_t first = 0, m; first < rows; first += m) {
                m = rows - first < per ? rows - first : per;
                if (table_chunk(c, (int)sh, k, 0, first, m, c->rbuf, err) < 0)
                    return -1;
                for (size_t q = 0; q < m; q++)
                    memcpy(params + t->off + (sh + (first + q) * S) * w, c->rbuf + q * w,
                           w * sizeof(float));
            }
        }
    return 0;
}

int dp_ps_client_auto(dp_ps_client *c, float *params, char *why, size_t cap, dp_err *err)
{
    if (c->cfg.compress.kind != DP_COMPRESS_AUTO)
        return 0;
    if (!c->resid) { /* pushes with sparse rows stay f32 (coder_open) */
        snprintf(why, cap, "auto: none (the pushes carry sparse rows, which go f32)");
        return dp_ps_client_auto_take(c, 0, err);
    }
    size_t n[DP_PARTITION_MAX], most = 0, bytes = 0;
    for (int s = 0; s < c->layout.n_shards; s++) {
        n[s] = c->layout.range[s].hi - c->layout.range[s].lo;
        most = n[s] > most ? n[s] : most;
        bytes += dp_frame_wire_size(4 * (uint64_t)n[s]);
    }
    /* the link: a pull of the whole model, as the step's answers will come
     * (the other workers' frames on it too); DOWNPOUR_TEST_LINK_NS fakes it */
    double t0 = dp_now();
    if (dp_ps_client_pull(c, params, 0, err) < 0)
        return -1;
    double pull = dp_now() - t0, per_byte = bytes ? pull / (double)bytes : 0;
    if (dp_hook_link_ns() > 0)
        per_byte = dp_hook_link_ns() * 1e-9;
    /* the coder: top-k at the largest ratio over the largest shard, best of 3 */
    double best = 0;
    size_t k = dp_topk_count(DP_PS_AUTO_MAX_RATIO, most);
    uint32_t x = 12345;
    for (size_t i = 0; i < most; i++) {
        x = x * 1664525u + 1013904223u;
        c->ctmp[i] = (float)(x >> 8) * 0x1p-24f - 0.5f;
    }
    for (int rep = 0; rep < 3 && most > 0; rep++) {
        double a = dp_now();
        dp_topk_encode(c->ctmp, most, k, c->ctmp2, c->cbuf + DP_CODED_HEAD_SIZE);
        double t = dp_now() - a;
        best = rep == 0 || t < best ? t : best;
    }
    dp_ps_auto a;
    double r = dp_ps_auto_rule(&a, n, c->layout.n_shards, per_byte, most ? best / most : 0);
    snprintf(why, cap, "%s; the pull of %zu bytes took %.2f ms", a.why, bytes, pull * 1e3);
    return dp_ps_client_auto_take(c, r, err);
}

int dp_ps_client_auto_take(dp_ps_client *c, double ratio, dp_err *err)
{
    if (c->cfg.compress.kind != DP_COMPRESS_AUTO)
        return dp_errf(err, "--compress auto's choice taken twice, or under another --compress");
    if (ratio > 0 && !c->resid)
        return dp_errf(err, "--compress auto: topk:%g taken, but the pushes carry sparse rows, "
                            "which go f32", ratio);
    c->cfg.compress = ratio > 0 ? (dp_compress){.kind = DP_COMPRESS_TOPK, .ratio = ratio}
                                : (dp_compress){.kind = DP_COMPRESS_NONE};
    c->auto_taken = 1;
    for (int s = 0; s < c->layout.n_shards; s++)
        c->clen[s] = dp_coded_bytes(&c->cfg.compress, c->layout.range[s].hi - c->layout.range[s].lo);
    return 0;
}

double dp_ps_client_auto_ratio(const dp_ps_client *c)
{
    if (!c->auto_taken)
        return -1;
    return c->cfg.compress.kind == DP_COMPRESS_TOPK ? c->cfg.compress.ratio : 0;
}

int dp_ps_push_and_wait(dp_ps_client *c, float *params, const float *grads, int records,
                        dp_err *err)
{
    c->clock++;
    if (dp_ps_push(c, DP_WIRE_PUSH_GRAD, grads, (uint32_t)records, 1, err) < 0)
        return -1;
    return dp_ps_receive(c, params, err);
}

int dp_ps_client_push_host(dp_ps_client *c, float *params, const float *sum, int records,
                           float lr, const uint8_t *members, size_t len, dp_err *err)
{
    if (c->rules != &dp_ps_rules_sync || c->q || c->resid || c->cfg.n_tables > 0 ||
        c->cfg.chunks > 0)
        return dp_errf(err, "a host push is for plain ps-sync pushes only");
    c->lr = lr;
    c->clock++;
    c->last.v = sum;
    c->last.records = (uint32_t)records;
    c->last.want = 1;
    c->last.coded = 0;
    c->last.host = members;
    c->last.host_len = len;
    double t0 = dp_now();
    int rc = request_all(c, DP_WIRE_PUSH_HOST, (uint64_t)c->clock, err);
    dp_trace_span("push", "push", t0, dp_now(), -1);
    return rc < 0 ? rc : dp_ps_receive(c, params, err);
}

void dp_ps_client_hosted(dp_ps_client *c) { c->clock++; }

int dp_ps_client_step(dp_ps_client *c, float *params, const float *grads, int records, float lr,
                      dp_err *err)
{
    c->lr = lr;
    return c->rules->step(c, params, grads, records, err);
}

/* Finishing waits for every push in flight: none is lost. */
int dp_ps_client_flush(dp_ps_client *c, float *params, dp_err *err)
{
    if (c->rules->flush && c->rules->flush(c, params, err) < 0)
        return -1;
    return dp_ps_settle(c, params, 0, err);
}

typedef struct state_into {
    uint64_t step;
    int n_slots;
    float *params, *slots, *ema;
    long *t;
    int dense_only; /* compact tables: no STATE_ROWS asked (their rows are streamed) */
} state_into;

/* The STATE_ROWS frames of shard s after its STATE, each checked against
 * the one expected next (table q, part j, rows from `first`, at most a
 * chunk) before its rows are read, through rbuf, into the full-length
 * vectors.  -2: the shard broke the protocol (err names it). */
static int take_state_rows(dp_ps_client *c, int s, int rank, const state_into *o, dp_err *err)
{
    int S = c->layout.n_shards;
    const char *who = dp_transport_peer_name(c->t, rank);
    for (int q = 0; q < c->cfg.n_tables; q++) {
        const dp_ps_table_spec *t = &c->cfg.tables[q];
        size_t w = t->width, n = rows_on(t, s, S), per = dp_ps_state_chunk_rows(&c->cfg, w);
        for (int j = 0; j <= o->n_slots; j++) {
            float *v = j == 0 ? o->params : o->slots + (size_t)(j - 1) * c->n;
            for (size_t first = 0; first < n;) {
                size_t want = n - first < per ? n - first : per;
                dp_event ev;
                if (dp_transport_recv(c->t, rank, "the rows of its training state", PS_TIMEOUT,
                                      &ev, err) < 0)
                    return -1;
                uint64_t len = ev.header.length;
                if (ev.header.type != DP_WIRE_STATE_ROWS || ev.header.step != o->step ||
                    ev.header.offset != c->layout.range[s].lo ||
                    len != DP_PS_STATE_ROWS_HEAD + (uint64_t)want * w * sizeof(float)) {
                    dp_errf(err, "%s sent frame type %u of %llu bytes for step %llu; expected "
                                 "STATE_ROWS of %zu rows of sparse table %d (part %d, from local "
                                 "row %zu) for step %llu",
                            who, ev.header.type, (unsigned long long)len,
                            (unsigned long long)ev.header.step, want, q, j, first,
                            (unsigned long long)o->step);
                    return -2;
                }
                uint8_t h[DP_PS_STATE_ROWS_HEAD];
                if (dp_transport_recv_payload(c->t, rank, h, sizeof h, err) < 0)
                    return -1;
                if (dp_get_u32(h) != (uint32_t)q || dp_get_u32(h + 4) != (uint32_t)j ||
                    dp_get_u32(h + 8) != (uint32_t)first || dp_get_u32(h + 12) != want) {
                    dp_errf(err, "%s sent rows [%u, +%u) of part %u of sparse table %u; expected "
                                 "[%zu, +%zu) of part %d of table %d",
                            who, dp_get_u32(h + 8), dp_get_u32(h + 12), dp_get_u32(h + 4),
                            dp_get_u32(h), first, want, j, q);
                    return -2;
                }
                /* the chunk's rows, rbuf at a time, to their places id = s + i S */
                size_t cap = c->rbuf_floats / w;
                for (size_t done = 0; done < want;) {
                    size_t m = want - done < cap ? want - done : cap;
                    if (dp_transport_recv_payload(c->t, rank, c->rbuf, m * w * sizeof(float),
                                                  err) < 0)
                        return -1;
                    for (size_t i = 0; i < m; i++)
                        memcpy(v + t->off + ((size_t)s + (first + done + i) * (size_t)S) * w,
                               c->rbuf + i * w, w * sizeof(float));
                    done += m;
                }
                first += want;
            }
        }
    }
    return 0;
}

static int take_state(dp_ps_client *c, int s, const dp_event *ev, void *ctx, dp_err *err)
{
    state_into *o = ctx;
    const dp_range *r = &c->layout.range[s];
    int rank = ev->peer;
    size_t n = r->hi - r->lo, bytes = n * sizeof(float);
    size_t len = 16 + bytes * (size_t)(1 + o->n_slots + (c->cfg.ema > 0));
    if (ev->header.step != o->step || ev->header.length != len) {
        dp_errf(err, "%s answered the state request for step %llu with %llu bytes for step %llu; "
                     "expected %zu bytes for shard %d", dp_transport_peer_name(c->t, rank),
                (unsigned long long)o->step, (unsigned long long)ev->header.length,
                (unsigned long long)ev->header.step, len, s);
        return -2;
    }
    uint8_t head[16];
    size_t at = r->lo - c->cfg.dense_shift; /* a compact chief's vectors lack the tables */
    if (dp_transport_recv_payload(c->t, rank, head, sizeof head, err) < 0 ||
        dp_transport_recv_payload(c->t, rank, o->params + at, bytes, err) < 0)
        return -1;
    for (int k = 0; k < o->n_slots; k++)
        if (dp_transport_recv_payload(c->t, rank, o->slots + (size_t)k * c->n + at, bytes,
                                      err) < 0)
            return -1;
    if (c->cfg.ema > 0 && (o->ema ? dp_transport_recv_payload(c->t, rank, o->ema + at, bytes, err)
                                  : dp_transport_skip_payload(c->t, rank, err)) < 0)
        return -1;
    int rc = o->dense_only ? 0 : take_state_rows(c, s, rank, o, err);
    if (rc < 0)
        return rc;
    long shard_t = (long)dp_get_u64(head);
    if (s > 0 && shard_t != *o->t)
        dp_warn("%s has applied %ld optimiser updates, shard 0 %ld (the checkpoint keeps "
                "shard 0's count)", dp_transport_peer_name(c->t, rank), shard_t, *o->t);
    if (s == 0)
        *o->t = shard_t;
    return 0;
}

int dp_ps_client_pull_state(dp_ps_client *c, uint64_t step, const dp_optim_config *optim,
                            float *params, float *slots, float *ema, long *t, dp_err *err)
{
    state_into o = {step, dp_optim_slots(optim->kind), params, slots, ema, t, 0};
    o.dense_only = c->cfg.n_tables > 0 && c->cfg.tables[0].slots > 0;
    if (!o.dense_only) {
        if (request_all(c, DP_WIRE_STATE_REQ, step, err) < 0)
            return -1;
    } else { /* the tables' rows go to the file later (dp_ps_client_tables_read) */
        uint8_t b[4];
        dp_put_u32(b, DP_PS_STATE_DENSE);
        if (sends_done(c, err) < 0)
            return -1;
        for (int s = 0; s < c->layout.n_shards; s++)
            if (dp_transport_send(c->t, c->layout.rank[s], DP_WIRE_STATE_REQ, step,
                                  c->layout.range[s].lo, b, 4, err) < 0)
                return -1;
    }
    return collect(c, DP_WIRE_STATE, "its training state", take_state, &o, err);
}

int dp_ps_client_drain(dp_ps_client *c, float *params, dp_err *err)
{
    return dp_ps_settle(c, params, 0, err);
}

int dp_ps_client_sync(dp_ps_client *c, float *params, dp_err *err)
{
    if (dp_ps_settle(c, params, 0, err) < 0)
        return -1;
    if (c->rules->sync && c->rules->sync(c, params, err) < 0)
        return -1;
    /* coded answers: at a checkpoint the worker takes the servers' parameters
     * whole (a pull resets their mirrors), as a resumed worker starts from
     * them, so both go on from the same copy (docs/checkpoints.md) */
    return c->cin ? dp_ps_client_pull(c, params, 0, err) : 0;
}

dp_optim *dp_ps_client_local_optim(dp_ps_client *c)
{
    return c->rules->pushes_params ? &c->local : NULL;
}
