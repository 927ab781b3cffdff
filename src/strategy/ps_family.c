/* The parameter-server strategies' machinery: see ps_family.h. */
#include "strategy/ps_family.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/clip.h"
#include "downpour/clock.h"
#include "downpour/launcher.h"
#include "downpour/log.h"
#include "downpour/sparse.h"
#include "downpour/trace.h"
#include "downpour/wire.h"
#include "exec/mp_replica.h"
#include "strategy/buffers_wire.h"
#include "downpour/ps_auto.h"
#include "strategy/ps_host.h"

#define WAIT_TIMEOUT 600.0    /* s the chief or a worker waits for a peer */
#define PROGRESS_PER_EPOCH 16 /* PROGRESS frames a worker sends an epoch: a restart redoes 1/16 at most */
#define EPOCH_REPORT_SIZE 40  /* f64 loss_sum, f64 records, f64 correct, f64 seconds, u64 steps */
#define ATTACH_HEAD 20        /* u64 step reached, u64 steps when done (else ~0), u32 reports */
#define NOT_DONE UINT64_MAX

typedef struct epoch_tally {
    int reports;
    dp_epoch_stats sum;
} epoch_tally;

struct dp_strategy {
    const dp_run_env *env;
    dp_model *m;
    dp_transport *t;
    const dp_cluster *c;
    dp_ps_config pc;
    dp_ps_layout layout;
    dp_ps_client *client;  /* workers and the chief */
    dp_part part;
    int chief;             /* the chief's rank */
    int worker;            /* this worker's index */
    int deal_index, deal_count; /* the data shard the chief dealt it last */
    int next_index, next_count, next_from; /* a deal for a later epoch (0-based
                                              next_from; -1: none): a worker joins then */
    int chief_optional;    /* the strategy survives a lost chief (docs/faults.md) */
    int chief_lost;        /* a worker: the chief is gone; it trains on and waits */
    uint64_t chief_inc;    /* a worker: the incarnation of the chief it works with */
    int started;           /* a worker: the run has started (a START now is an attach) */
    int finished;          /* a worker: said DONE after done_steps */
    long done_steps, at_step;
    uint8_t *reports;      /* a worker: its epoch reports, sent again to a chief that is back */
    int n_reports;
    /* the chief */
    epoch_tally *tally;    /* [1..epochs] */
    int *live, *ready;     /* per rank: a worker not lost nor done; at the checkpoint barrier */
    int *lost;             /* per rank: a worker lost, not (yet) back */
    int *from_epoch;       /* per rank: the first epoch a worker reports (1; later when it rejoined) */
    int *joining;          /* per rank: a restarted worker waiting for a checkpoint to pass */
    int *losses;           /* per rank: times a worker was lost */
    long *progress;        /* per rank: the newest step a worker said it reached */
    int restarts;          /* times a lost task may come back (DOWNPOUR_RESTARTS, launcher.h) */
    int live_workers, done, next_eval, n_ready;
    long last_ckpt;        /* step of the newest checkpoint written (or resumed from) */
    long ckpt_step;        /* the barrier's step */
    long released;         /* the step of the last barrier released (0: none) */
    long go_pending;       /* a checkpoint written, its workers not yet released; -1 */
    long steps;            /* every worker's steps, from their DONE */
    uint8_t *reported;     /* [rank * (epochs + 1) + e]: epoch e's report counted */
    int *heard;            /* per rank: the worker's first word (JOIN, attach) or loss came */
    unsigned char *fresh;  /* per rank: a spare worker slot not joined yet (--spare-workers) */
    int unheard;           /* workers not heard of yet: nothing is decided before */
    int attached;          /* workers that said they were already running: a restarted chief */
    int attach_state;      /* 0; 1 ATTACH handed to the loop; 2 its checkpoint taken */
    int ended;             /* next() said DONE: close ends the run */
    /* Model-parallel replicas (--model-parallel K, ps-async only): the
     * workers are R replicas of K tasks; task j of a replica holds its
     * slices (mp_slice.h) and is a ps client of the shards that hold them.
     * The ps shards lie over the parameters in slice order (task 0's
     * slices, then task 1's, ...), cut so no shard straddles two tasks. */
    int K, R, mp_task;     /* K = 0: off */
    mp_plan *plans;        /* every task's slices */
    mp_replica *rep;       /* a worker: its replica's forward and backward */
    int *mp_ranks;         /* a worker: the transport rank of each task of its replica */
    double mp_timeout;     /* a worker: s to wait for a replica peer */
    int mp_k;              /* --model-parallel K (0: plain replicas) */
    float *chunk_buf;      /* --sum-chunk, a worker: its chunks' gradients, chunk j at
                              j * n_params (pc.chunks of them) */
    size_t mp_lo, mp_n;    /* a worker: its slices' range in slice order */
    float *vec, *vgrads;   /* slice-order vectors: a worker's (its range used), the
                              chief's pulls, a server's start */
    float *wparams;        /* the vector a worker's client reads and writes:
                              m->params, or vec */
    dp_replica *replica;   /* a data-parallel worker's model (replica.h): on a device
                              forward and backward run there, pushes and pulls through
                              m->grads and m->params (host staging) */
    /* sparse rows (docs/strategies.md, "Sparse rows"): the model's tables
     * as s->pc.tables holds them, and a worker's ids of a step per table */
    dp_sparse_table sp[DP_PS_MAX_TABLES];
    uint32_t *sp_ids[DP_PS_MAX_TABLES];
    long sp_n[DP_PS_MAX_TABLES];
    size_t dense_lo;       /* the dense shards' first parameter (after the tables) */
    size_t cut;            /* a worker with compact tables: the parameters its model
                              lacks (dp_model_sparse_cut); 0: it holds them whole */
    float *cx;             /* a worker with compact tables: the batch, ids as slots */
    /* --ps-push host|auto (ps_host.h): a worker's host and whether it
     * pushes by host; the step being taken */
    dp_ps_host host;
    long step_now;
    /* --compress auto (ps_auto.h): a worker's choice, as a code, said in its
     * PROGRESS and CKPT_READY; the chief's copy of every worker slot's, for
     * the checkpoints and a worker restarted into a slot */
    uint32_t auto_code;
    uint32_t *auto_codes;  /* the chief, per worker index; NULL without auto */
};

static int restore_ps(void *ctx, int rank, dp_err *err);

/* What of the run needs the tables whole (NULL: nothing), from the
 * settings alone. */
static const char *whole_tables(const dp_train_config *cfg, dp_ps_mode mode,
                                const dp_ps_settings *ps, const dp_ps_config *pc, int mp_k)
{
    dp_optim_kind kind = cfg->optim.kind;
    return ps->dense ? "--ps-dense"
        : mode == DP_PS_AVG ? "model-avg pushes parameters, not gradients"
        : kind != DP_OPTIM_SGD && kind != DP_OPTIM_ADAGRAD && kind != DP_OPTIM_ADAM
            ? "its optimizer has no update by rows here (sgd, adagrad and adam have)"
        : cfg->ema > 0 ? "--ema averages every parameter at every update"
        : pc->push_every > 1 || pc->fetch_every > 1 || pc->push_behind > 0
            ? "--push-every, --fetch-every and --push-behind keep whole vectors"
        : mp_k > 0 ? "--model-parallel"
        : cfg->device.kind != DP_DEVICE_CPU ? "--device: the ids are read on the host"
                                            : NULL;
}

int dp_ps_family_compact(const dp_train_config *cfg, dp_ps_mode mode)
{
    const dp_ps_settings *ps = dp_strategy_settings(cfg, &dp_ps_conf);
    dp_ps_config pc;
    dp_ps_config_init(&pc);
    dp_err ignore;
    return ps && dp_ps_settings_apply(ps, &pc, &ignore) == 0 &&
           !whole_tables(cfg, mode, ps, &pc, ps->model_parallel);
}

/* Sparse rows are chosen when the model has sparse tables (sparse.h) and
 * nothing of the run needs them whole (docs/strategies.md, "Sparse
 * rows"): the tables then lie outside the dense shards, and each row goes
 * to shard id mod n_shards.  Every task decides alike, from the same
 * settings and model. */
static int choose_sparse(dp_strategy *s, dp_ps_mode mode, const dp_ps_settings *ps, dp_err *err)
{
    const dp_train_config *cfg = s->env->cfg;
    dp_sparse_table t[DP_SPARSE_MAX];
    int n = dp_model_sparse_tables(s->m, t, DP_SPARSE_MAX);
    if (n == 0)
        return 0;
    /* the tables in order of place: they must cover [0, dense_lo) */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && t[j].off < t[j - 1].off; j--) {
            dp_sparse_table x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    size_t end = 0;
    int prefix = 1;
    for (int i = 0; i < n; i++) {
        prefix &= t[i].off == end;
        end = t[i].off + (size_t)t[i].rows * (size_t)t[i].width;
    }
    const char *why = whole_tables(cfg, mode, ps, &s->pc, s->mp_k);
    why = why ? why
        : n > DP_PS_MAX_TABLES ? "more tables than a ps moves by rows"
        : !prefix ? "the tables do not lie before every dense parameter"
        : end >= s->m->n_params + s->cut ? "the model has no dense parameter to shard"
                                         : NULL;
    if (why && s->cut)
        return dp_errf(err, "this worker holds its sparse tables compact, but they must move "
                            "whole: %s", why);
    if (why) {
        dp_info("%d sparse table(s) of %s move whole, as dense parameters: %s", n, s->m->name,
                why);
        return 0;
    }
    size_t rows = 0;
    for (int k = 0; k < n; k++) {
        long most = (long)s->m->max_batch * t[k].per_record;
        s->sp[k] = t[k];
        s->pc.tables[k] = (dp_ps_table_spec){t[k].off, (uint32_t)t[k].rows,
                                             (uint32_t)t[k].width,
                                             (uint32_t)(most < t[k].rows ? most : t[k].rows),
                                             t[k].local_off, (uint32_t)t[k].slots};
        if (t[k].slots && t[k].slots < (long)s->pc.tables[k].max_ids)
            return dp_errf(err, "sparse table %d holds %ld slots, fewer than the %u rows a step "
                                "may touch", k, t[k].slots, s->pc.tables[k].max_ids);
        if ((s->env->node->self->role == DP_ROLE_WORKER ||
             (s->cut && s->env->node->self->role == DP_ROLE_CHIEF)) &&
            !(s->sp_ids[k] = malloc((size_t)(most > 0 ? most : 1) * sizeof(uint32_t))))
            return dp_errf(err, "out of memory");
        rows += (size_t)t[k].rows;
    }
    s->pc.n_tables = n;
    s->dense_lo = end;
    s->pc.dense_shift = s->cut;
    if (s->cut && s->env->node->self->role != DP_ROLE_PS &&
        !(s->cx = malloc((size_t)s->m->max_batch * (size_t)dp_model_inputs(s->m) *
                                   sizeof(float))))
        return dp_errf(err, "out of memory");
    /* every ps task holds a shard, so the rows spread over all of them */
    s->pc.min_shard_bytes = sizeof(float);
    dp_debug("sparse rows: %d table(s) of %s (%zu rows, %zu floats) move by the rows each batch "
             "touches; row id on shard id mod the shard count; the dense shards cover [%zu, %zu)",
             n, s->m->name, rows, end, end, s->m->n_params + s->cut);
    if (s->cut && s->env->node->self->role == DP_ROLE_WORKER)
        dp_debug("compact tables: this worker holds %zu of the tables' %zu floats (the rows of "
                 "the batch in flight) and %zu parameters in all, not %zu",
                 end - s->cut, end, s->m->n_params, s->m->n_params + s->cut);
    else if (s->cut && s->env->node->self->role == DP_ROLE_PS)
        dp_debug("compact tables: this ps task builds no table; its shard draws its own rows "
                 "(dp_model_init_rows)");
    else if (s->cut)
        dp_debug("compact tables: the chief holds %zu of the tables' %zu floats (the rows of "
                 "an evaluation chunk, pulled chunk by chunk) and %zu parameters in all, not %zu",
                 end - s->cut, end, s->m->n_params, s->m->n_params + s->cut);
    return 0;
}

/* A worker's step with sparse tables: the rows its batch touches, found
 * from the input before the forward, pulled fresh from their shards. */
static int pull_rows(dp_strategy *s, const float *x, int n, dp_err *err)
{
    for (int k = 0; k < s->pc.n_tables; k++)
        s->sp_n[k] = n > 0 ? dp_model_sparse_rows(s->m, &s->sp[k], x, n, s->sp_ids[k]) : 0;
    return dp_ps_client_pull_rows(s->client, s->wparams, (const uint32_t *const *)s->sp_ids,
                                  s->sp_n, err);
}

/* Compact tables: the batch with each id turned into the slot its row was
 * pulled into (docs/strategies.md, "Tables larger than a worker"). */
static const float *slot_batch(dp_strategy *s, const float *x, int n)
{
    if (!s->cx || n <= 0)
        return x;
    memcpy(s->cx, x, (size_t)n * (size_t)dp_model_inputs(s->m) * sizeof(float));
    for (int k = 0; k < s->pc.n_tables; k++)
        dp_model_sparse_slots(s->m, &s->sp[k], s->cx, n, s->sp_ids[k], s->sp_n[k]);
    return s->cx;
}

static int send_to(dp_strategy *s, int rank, unsigned type, uint64_t step, const void *p,
                   size_t len, dp_err *err)
{
    return dp_transport_send(s->t, rank, type, step, 0, p, len, err);
}

void dp_ps_family_close(dp_strategy *s)
{
    if (!s)
        return;
    /* The servers and the workers stop with the chief; where the strategy
     * survives a lost chief, only when it ended the run (a chief that
     * failed leaves the run to its restarted self). */
    if (s->part == DP_PART_COORDINATOR && (s->ended || !s->chief_optional))
        for (int r = 0; r < s->c->n_tasks; r++) {
            dp_err ignore;
            dp_role role = s->c->tasks[r].role;
            if (role == DP_ROLE_PS || (role == DP_ROLE_WORKER && !s->lost[r]))
                send_to(s, r, DP_WIRE_SHUTDOWN, 0, NULL, 0, &ignore);
        }
    dp_ps_client_free(s->client);
    dp_replica_close(s->replica);
    mp_replica_close(s->rep);
    free(s->mp_ranks);
    free(s->plans);
    free(s->vec);
    free(s->vgrads);
    free(s->chunk_buf);
    free(s->tally);
    free(s->live);
    free(s->ready);
    free(s->lost);
    free(s->from_epoch);
    free(s->joining);
    free(s->losses);
    free(s->progress);
    free(s->reported);
    free(s->heard);
    free(s->fresh);
    free(s->auto_codes);
    free(s->reports);
    for (int k = 0; k < DP_PS_MAX_TABLES; k++)
        free(s->sp_ids[k]);
    free(s->cx);
    dp_ps_host_close(&s->host);
    free(s);
}

#define ONLY_DEALS 0u /* from_chief's type when nothing else may come */

/* A DEAL from the chief: this worker's data shard from its next epoch.  A
 * rejoining worker's START (offset 1) under --compress auto carries its
 * slot's choice after the deal (ps_auto.h; 0: none known, it measures). */
static int take_deal(dp_strategy *s, const dp_event *ev, dp_err *err)
{
    uint8_t p[12];
    size_t want = ev->header.type == DP_WIRE_START && ev->header.offset == 1 &&
                          s->pc.compress.kind == DP_COMPRESS_AUTO
                      ? 12
                      : 8;
    if (ev->header.length != want)
        return dp_errf(err, "the chief sent a %llu-byte DEAL; expected %zu",
                       (unsigned long long)ev->header.length, want);
    if (dp_transport_recv_payload(s->t, s->chief, p, want, err) < 0)
        return -1;
    if (want == 12) {
        uint32_t code = dp_get_u32(p + 8);
        if (code >= DP_PS_AUTO_CODES)
            return dp_errf(err, "the chief %s handed this worker --compress auto's choice %u, "
                                "not one auto takes (ps_auto.h: 0 to %d)",
                           dp_transport_peer_name(s->t, s->chief), code, DP_PS_AUTO_CODES - 1);
        s->auto_code = code;
    }
    uint32_t index = dp_get_u32(p), count = dp_get_u32(p + 4);
    if (count < 1 || index >= count || count > (uint32_t)s->c->count[DP_ROLE_WORKER])
        return dp_errf(err, "the chief dealt shard %u of %u", index, count);
    /* offset 0: from this worker's next epoch; E + 1: from epoch E (0-based),
     * when a spare joins, so every worker switches at the same epoch */
    uint64_t from = ev->header.type == DP_WIRE_DEAL ? ev->header.offset : 0;
    if (from > (uint64_t)s->env->cfg->epochs)
        return dp_errf(err, "the chief dealt shard %u of %u from epoch %llu of %d", index,
                       count, (unsigned long long)from, s->env->cfg->epochs);
    if (from > 0) {
        s->next_index = (int)index;
        s->next_count = (int)count;
        s->next_from = (int)from - 1;
        return 0;
    }
    s->next_from = -1;
    s->deal_index = (int)index;
    s->deal_count = (int)count;
    return 0;
}

/* The chief is gone.  Where the strategy survives that, the worker trains
 * on, keeps what it would have told the chief and tells a restarted chief
 * (attach); otherwise the run is over (docs/faults.md, "A lost chief"). */
static int chief_gone(dp_strategy *s, const char *reason, dp_err *err)
{
    const char *who = dp_transport_peer_name(s->t, s->chief);
    if (!s->chief_optional)
        return dp_errf(err, "lost the chief %s (%s)", who, reason);
    if (!s->chief_lost)
        dp_warn("fault: Worker %d lost the chief %s (%s); it trains on and waits for the chief "
                "to come back", s->worker, who, reason);
    s->chief_lost = 1;
    return 0;
}

/* The connection to a lost chief is back, and the chief is the same
 * process: it did not die, it dropped this worker (frozen past the
 * heartbeat timeout, or cut off), which then cannot take part as it is. */
static int check_dropped(dp_strategy *s, dp_err *err)
{
    dp_err e;
    if (!s->chief_lost || s->chief_inc == 0 ||
        dp_transport_connect(s->t, s->chief, dp_now(), &e) < 0 ||
        dp_transport_peer_incarnation(s->t, s->chief) != s->chief_inc)
        return 0;
    return dp_errf(err, "the chief %s is running and dropped this worker (it was silent past "
                        "the heartbeat timeout, or cut off); a restarted worker rejoins the run",
                   dp_transport_peer_name(s->t, s->chief));
}

/* A frame for the chief; while the chief is lost, none (attach sends what
 * it must know again). */
static int tell_chief(dp_strategy *s, unsigned type, uint64_t step, const void *p, size_t len,
                      dp_err *err)
{
    dp_err why;
    /* a PROGRESS's offset: --compress auto's choice (ps_auto.h; 0: none) */
    uint64_t offset = type == DP_WIRE_PROGRESS ? s->auto_code : 0;
    if (s->chief_lost || dp_transport_send(s->t, s->chief, type, step, offset, p, len, &why) == 0)
        return 0;
    return chief_gone(s, why.msg, err);
}

/* Worker 0's buffers (batch norm's running statistics) to the chief, which
 * evaluates, checkpoints and saves with them (docs/strategies.md,
 * "Buffers"): [u32 count][count f32], `step` the epoch or the checkpoint
 * step.  Nothing from another worker, for a model without buffers, or
 * while the chief is lost (the attach sends them again). */
static int send_buffers(dp_strategy *s, uint64_t step, dp_err *err)
{
    if (s->part != DP_PART_TRAINER || s->worker != 0 || s->K || !s->m->n_buffers ||
        s->chief_lost)
        return 0;
    if (dp_replica_get_buffers(s->replica, err) < 0)
        return -1;
    dp_err why;
    if (dp_buffers_send(s->t, s->chief, DP_WIRE_BUFFERS, step, 0, s->m->buffers,
                        s->m->n_buffers, &why) < 0)
        return chief_gone(s, why.msg, err);
    return 0;
}

/* A restarted chief asked where this worker is: the step it reached, its
 * steps if it is done, and every epoch report, for the chief to count
 * those it missed.  The worker then talks to it as before. */
static int attach(dp_strategy *s, dp_err *err)
{
    uint8_t head[ATTACH_HEAD];
    dp_put_u64(head, (uint64_t)s->at_step);
    dp_put_u64(head + 8, s->finished ? (uint64_t)s->done_steps : NOT_DONE);
    dp_put_u32(head + 16, (uint32_t)s->n_reports);
    struct iovec iov[2] = {{head, sizeof head},
                           {s->reports, (size_t)s->n_reports * EPOCH_REPORT_SIZE}};
    s->chief_lost = 0;
    s->chief_inc = dp_transport_peer_incarnation(s->t, s->chief);
    dp_warn("fault: the chief %s is back; Worker %d re-attaches at step %ld%s",
            dp_transport_peer_name(s->t, s->chief), s->worker, s->at_step,
            s->finished ? " (done)" : "");
    if (send_buffers(s, (uint64_t)s->at_step, err) < 0)
        return -1;
    if (s->chief_lost) /* lost again while sending them */
        return 0;
    dp_err why;
    if (dp_transport_sendv(s->t, s->chief, DP_WIRE_JOIN, 0, 1, iov, 2, &why) < 0)
        return chief_gone(s, why.msg, err);
    return 0;
}

/* The next frame from the chief of the given type; DEALs, and the START of
 * a chief that came back (attach), are taken on the way.  Returns 1 with
 * the frame in ev; 0 when the chief was lost and the strategy survives that
 * (s->chief_lost), or with timeout 0 when nothing of that type has come. */
static int from_chief(dp_strategy *s, unsigned type, const char *what, double timeout,
                      dp_event *ev, dp_err *err)
{
    double deadline = dp_now() + timeout;
    for (;;) {
        double left = timeout > 0 ? deadline - dp_now() : 0;
        if (timeout > 0 && left <= 0)
            return dp_errf(err, "waited %.0f s for %s from the chief %s", timeout, what,
                           dp_transport_peer_name(s->t, s->chief));
        /* While the chief is lost, look every second whether it dropped us. */
        if (dp_transport_poll(s->t, s->chief, s->chief_lost && left > 1 ? 1 : left, ev, err) < 0)
            return -1;
        if (ev->kind == DP_EVENT_TIMEOUT) {
            if (check_dropped(s, err) < 0)
                return -1;
            if (timeout > 0)
                continue;
            return 0;
        }
        if (ev->kind == DP_EVENT_PEER_LOST)
            return chief_gone(s, ev->reason, err) < 0 ? -1 : 0;
        if (ev->header.type == DP_WIRE_DEAL) {
            if (take_deal(s, ev, err) < 0)
                return -1;
            continue;
        }
        if (ev->header.type == DP_WIRE_START && s->started) {
            if (dp_transport_skip_payload(s->t, s->chief, err) < 0 || attach(s, err) < 0)
                return -1;
            continue;
        }
        if (ev->header.type == DP_WIRE_SHUTDOWN && type != DP_WIRE_SHUTDOWN)
            return dp_errf(err, "the chief %s ended the run while this worker was %s",
                           dp_transport_peer_name(s->t, s->chief),
                           type == ONLY_DEALS ? "training" : what);
        if (ev->header.type != type)
            return dp_errf(err, "expected %s from the chief, got frame type %u", what,
                           ev->header.type);
        return 1;
    }
}

/* A worker says JOIN and waits for the chief's START, so every clock
 * starts together.  A restarted worker's START names the step it rejoins
 * at: it tells the servers it is back and takes the current parameters
 * (docs/faults.md). */
static int await_start(dp_strategy *s, dp_task_info *info, dp_err *err)
{
    dp_event ev;
    int rc;
    if (send_to(s, s->chief, DP_WIRE_JOIN, 0, NULL, 0, err) < 0)
        return -1;
    /* A chief lost before the start (and the strategy survives it): its
     * restarted self sends the START. */
    int relost = 0;
    while ((rc = from_chief(s, DP_WIRE_START, "the start signal", WAIT_TIMEOUT, &ev, err)) == 0)
        relost = 1;
    if (rc < 0)
        return -1;
    s->started = 1;
    s->chief_lost = 0;
    s->chief_inc = dp_transport_peer_incarnation(s->t, s->chief);
    if (relost && send_to(s, s->chief, DP_WIRE_JOIN, 0, NULL, 0, err) < 0)
        return -1; /* the JOIN went to the chief that was lost */
    if (ev.header.offset != 1) /* the first start: with spare slots, the first deal */
        return ev.header.length ? take_deal(s, &ev, err)
                                : dp_transport_skip_payload(s->t, s->chief, err);
    if (take_deal(s, &ev, err) < 0)
        return -1;
    info->start_step = (long)ev.header.step;
    /* The servers take it back at the clock of the step it starts at. */
    if (dp_ps_client_say(s->client, DP_WIRE_JOIN, (uint64_t)info->start_step + 1, err) < 0)
        return -1;
    if (dp_ps_client_pull(s->client, s->wparams, 0, err) < 0)
        return -1;
    dp_info("Worker %d: %s the run at step %ld", s->worker,
            dp_cluster_is_spare(s->c, s->c->self, s->env->cfg->spare_workers) ? "joined"
                                                                              : "rejoined",
            info->start_step);
    return 0;
}

static int open_chief(dp_strategy *s, dp_err *err)
{
    const dp_train_config *cfg = s->env->cfg;
    int n = s->c->n_tasks;
    s->tally = calloc((size_t)cfg->epochs + 2, sizeof *s->tally);
    s->live = calloc((size_t)n, sizeof *s->live);
    s->ready = calloc((size_t)n, sizeof *s->ready);
    s->lost = calloc((size_t)n, sizeof *s->lost);
    s->from_epoch = calloc((size_t)n, sizeof *s->from_epoch);
    s->joining = calloc((size_t)n, sizeof *s->joining);
    s->losses = calloc((size_t)n, sizeof *s->losses);
    s->progress = calloc((size_t)n, sizeof *s->progress);
    s->reported = calloc((size_t)n * ((size_t)cfg->epochs + 1), 1);
    s->heard = calloc((size_t)n, sizeof *s->heard);
    s->fresh = calloc((size_t)n, 1);
    if (!s->tally || !s->live || !s->ready || !s->lost || !s->from_epoch || !s->joining ||
        !s->losses || !s->progress || !s->reported || !s->heard || !s->fresh)
        return dp_errf(err, "out of memory");
    s->last_ckpt = s->env->resume ? s->env->resume->step : 0;
    for (int r = 0; r < n; r++)
        s->progress[r] = s->last_ckpt;
    int workers = s->c->count[DP_ROLE_WORKER];
    /* --compress auto: every worker slot's choice, from the checkpoint it
     * resumes (the workers read it too) and then as they say it */
    if (s->pc.compress.kind == DP_COMPRESS_AUTO) {
        if (!(s->auto_codes = calloc((size_t)workers, sizeof *s->auto_codes)))
            return dp_errf(err, "out of memory");
        if (s->env->resume &&
            dp_ps_auto_parse(s->env->resume->scalars, workers, s->auto_codes,
                             s->env->resume_path ? s->env->resume_path : "the checkpoint",
                             err) < 0)
            return -1;
    }
    dp_info("Chief: %s on %d worker(s) and %d ps task(s), batch %d per worker (global %d); "
            "%d shard(s)%s", s->env->cfg->strategy, workers, s->c->count[DP_ROLE_PS], cfg->batch,
            cfg->batch * workers, s->layout.n_shards,
            dp_log_get_level() <= DP_LOG_DEBUG ? ":" : " (--verbose lists them)");
    /* one line a shard: debug, so the chief's start-up stays one line */
    for (int i = 0; i < s->layout.n_shards; i++)
        dp_debug("  shard %d: parameters [%zu, %zu) (%.1f KiB) on %s", i, s->layout.range[i].lo,
                s->layout.range[i].hi,
                (s->layout.range[i].hi - s->layout.range[i].lo) * 4 / 1024.0,
                dp_transport_peer_name(s->t, s->layout.rank[i]));
    s->live_workers = workers;
    s->unheard = workers;
    s->go_pending = -1;
    s->next_eval = 0; /* the first next() sets it: steps per epoch are not known yet */
    /* The servers first: each waits for its START (or RESTORE) before it serves. */
    for (int p = 0; p < s->c->count[DP_ROLE_PS]; p++)
        if (send_to(s, dp_cluster_rank(s->c, DP_ROLE_PS, p), DP_WIRE_START, 0, NULL, 0, err) < 0)
            return -1;
    /* Spare slots (--spare-workers) are as workers lost for good until
     * their task says JOIN (admit_rejoin): not waited for, their data dealt
     * to the others, who get it with their START. */
    int spares = 0;
    for (int w = 0; w < workers; w++) {
        int rank = dp_cluster_rank(s->c, DP_ROLE_WORKER, w);
        if (!dp_cluster_is_spare(s->c, rank, cfg->spare_workers))
            continue;
        s->fresh[rank] = s->lost[rank] = s->heard[rank] = 1;
        s->losses[rank] = s->restarts + 1;
        s->unheard--;
        s->live_workers--;
        spares++;
    }
    if (spares)
        dp_info("Chief: %d spare worker slot(s): a task started for one joins the run at an "
                "epoch's start", spares);
    for (int w = 0, k = 0; w < workers; w++) {
        int rank = dp_cluster_rank(s->c, DP_ROLE_WORKER, w);
        if (s->fresh[rank])
            continue;
        s->live[rank] = 1;
        s->from_epoch[rank] = 1;
        uint8_t p[8];
        dp_put_u32(p, (uint32_t)k++);
        dp_put_u32(p + 4, (uint32_t)(workers - spares));
        if (send_to(s, rank, DP_WIRE_START, 0, spares ? p : NULL, spares ? sizeof p : 0, err) < 0)
            return -1;
    }
    return 0;
}

/* A ps task lost while its shards go on on their backups: a `fault` event. */
static void failover_event(void *ctx, int rank, const char *reason)
{
    dp_strategy *s = ctx;
    dp_metrics_event(s->env->metrics, "fault", DP_F_STR, "task",
                     dp_transport_peer_name(s->t, rank), DP_F_STR, "what", reason, DP_F_STR,
                     "action", "failover", DP_F_END);
}

/* --model-parallel K: the checks, every task's slices, and the shards laid
 * over them in slice order: task j's range cut into P/K (or one more) shards,
 * shard i on ps task i. */
static int mp_layout(dp_strategy *s, dp_ps_mode mode, dp_err *err)
{
    const dp_train_config *cfg = s->env->cfg;
    int K = s->mp_k, W = s->c->count[DP_ROLE_WORKER], P = s->c->count[DP_ROLE_PS];
    if (mode != DP_PS_ASYNC)
        return dp_errf(err, "--model-parallel %d under --strategy %s: of the parameter-server "
                            "strategies only ps-async takes model-parallel replicas (the servers "
                            "of the others count every worker's pushes, and a model-parallel "
                            "task pushes to the shards of its own slices only)",
                       K, cfg->strategy);
    if (s->pc.replicas > 1)
        return dp_errf(err, "--ps-replicas %d with --model-parallel: shard backups are not built "
                            "for model-parallel replicas; leave --ps-replicas out",
                       s->pc.replicas);
    if (W % K != 0)
        return dp_errf(err, "--model-parallel %d: the %d worker(s) are not a whole number of "
                            "replicas of %d tasks. Hint: launch --workers %d (or a multiple)",
                       K, W, K, K);
    if (P < K || P > DP_PARTITION_MAX)
        return dp_errf(err, "--model-parallel %d under ps-async needs %d to %d ps tasks, each "
                            "shard holding one task's slices (the spec has %d). Hint: launch "
                            "--ps %d",
                       K, K, DP_PARTITION_MAX, P, K);
    s->K = K;
    s->R = W / K;
    if (!(s->plans = calloc((size_t)K, sizeof *s->plans)))
        return dp_errf(err, "out of memory");
    for (int j = 0; j < K; j++)
        if (mp_plan_make(&s->plans[j], s->m, K, j, err) < 0)
            return -1;
    memset(&s->layout, 0, sizeof s->layout);
    for (int j = 0, i = 0; j < K; j++) {
        size_t lo = mp_order_offset(s->plans, j), n = s->plans[j].floats;
        int m = P / K + (j < P % K);
        for (int k = 0; k < m; k++, i++) {
            s->layout.range[i].lo = lo + n * (size_t)k / (size_t)m;
            s->layout.range[i].hi = lo + n * (size_t)(k + 1) / (size_t)m;
            s->layout.rank[i] = dp_cluster_rank(s->c, DP_ROLE_PS, i);
            s->layout.backup[i] = -1;
        }
    }
    s->layout.n_shards = P;
    return 0;
}

/* A model-parallel worker: its replica, its slices in slice order, and the
 * shards that hold them (the only ones its client talks to). */
static int mp_open_worker(dp_strategy *s, dp_ps_layout *mine, dp_task_info *info, dp_err *err)
{
    const dp_train_config *cfg = s->env->cfg;
    int w = s->env->node->self->index, replica = w / s->K;
    s->mp_task = w % s->K;
    s->mp_lo = mp_order_offset(s->plans, s->mp_task);
    s->mp_n = s->plans[s->mp_task].floats;
    memset(mine, 0, sizeof *mine);
    for (int i = 0; i < s->layout.n_shards; i++)
        if (s->layout.range[i].lo >= s->mp_lo && s->layout.range[i].hi <= s->mp_lo + s->mp_n) {
            int k = mine->n_shards++;
            mine->range[k] = s->layout.range[i];
            mine->rank[k] = s->layout.rank[i];
            mine->backup[k] = -1;
        }
    int *ranks = s->mp_ranks = malloc((size_t)s->K * sizeof *ranks);
    if (!ranks)
        return dp_errf(err, "out of memory");
    double deadline = dp_now() + WAIT_TIMEOUT;
    for (int q = 0; q < s->K; q++) {
        ranks[q] = dp_cluster_rank(s->c, DP_ROLE_WORKER, replica * s->K + q);
        /* ps-async workers connect to the chief and the servers only */
        if (q != s->mp_task && dp_transport_connect(s->t, ranks[q], deadline, err) < 0)
            return -1;
    }
    double timeout = s->mp_timeout = cfg->collective_timeout > 0 ? cfg->collective_timeout : 300;
    if (mp_replica_open(&s->rep, s->t, s->m, ranks, s->K, s->mp_task, replica, cfg->batch,
                        timeout, err) < 0)
        return -1;
    /* calloc: the pages outside this task's range are never touched */
    s->vec = calloc(s->m->n_params, sizeof(float));
    s->vgrads = calloc(s->m->n_params, sizeof(float));
    if (!s->vec || !s->vgrads)
        return dp_errf(err, "out of memory");
    mp_gather(s->vec + s->mp_lo, s->m->params, &s->plans[s->mp_task]);
    s->wparams = s->vec;
    info->sliced = 1;
    info->shard_index = replica;
    s->deal_index = replica;
    s->deal_count = s->R;
    dp_info("model-parallel: task %d holds %zu parameters (%.2f MiB) of %zu (1/%d); replica "
            "%d, a ps client of %d shard(s)",
            s->mp_task, s->mp_n, (double)s->mp_n * sizeof(float) / (1 << 20), s->m->n_params,
            s->K, replica, mine->n_shards);
    dp_metrics_event(s->env->metrics, "model_parallel", DP_F_INT, "mp_task", (long)s->mp_task,
                     DP_F_INT, "replica", (long)replica, DP_F_INT, "tasks", (long)s->K,
                     DP_F_INT, "replicas", (long)s->R, DP_F_INT, "params", (long)s->mp_n,
                     DP_F_INT, "total_params", (long)s->m->n_params, DP_F_NUM, "param_mib",
                     (double)s->mp_n * sizeof(float) / (1 << 20), DP_F_END);
    return 0;
}

void dp_ps_family_links(const dp_train_config *cfg, unsigned *talks_to)
{
    const dp_ps_settings *ps = dp_strategy_settings(cfg, &dp_ps_conf);
    if (ps && dp_ps_push_parse(ps->ps_push) > DP_PS_PUSH_WORKER)
        talks_to[DP_ROLE_WORKER] |= DP_ROLE_BIT(DP_ROLE_WORKER);
}

/* --ps-push host|auto (docs/strategies.md, "ps-sync: one push per host"):
 * the hosts are formed by the workers that start with the run; one that
 * rejoins it later, or a run whose ps may be restarted into it, pushes
 * on its own.  Said in the log and the metrics. */
static int host_setup(dp_strategy *s, const dp_task_info *info, dp_err *err)
{
    int mode = dp_ps_push_parse(
        ((const dp_ps_settings *)dp_strategy_settings(s->env->cfg, &dp_ps_conf))->ps_push);
    if (mode <= DP_PS_PUSH_WORKER)
        return 0;
    const char *off = NULL;
    if (s->pc.n_tables > 0 || s->cut > 0)
        off = "its pushes carry sparse rows";
    else if (s->K > 0 || s->chunk_buf || s->pc.mode != DP_PS_SYNC)
        off = "only plain ps-sync pushes go by host";
    if (off && mode == DP_PS_PUSH_HOST)
        return dp_errf(err, "--ps-push host: %s (docs/strategies.md, \"ps-sync: one push per "
                            "host\")", off);
    /* Where a ps may come back (--max-restarts), a restarted server takes
     * each worker's push on its own, by step: by worker, said. */
    if (!off && s->restarts > 0) {
        off = "a ps restarted into the run (--max-restarts) takes each worker's push on its own";
        if (mode == DP_PS_PUSH_HOST)
            dp_warn("%s: --ps-push host: pushes by worker: %s", info->label, off);
    }
    if (info->start_step >= 0) /* it rejoined: its host went on without it */
        off = "it rejoined the run, whose hosts were formed at its start";
    if (off) {
        snprintf(s->host.why, sizeof s->host.why, "%s", off);
    } else if (dp_ps_host_open(&s->host, s->t, s->c, s->worker, mode, s->client, &s->layout,
                               s->wparams, s->m->n_params, WAIT_TIMEOUT, err) < 0) {
        return -1;
    }
    dp_info("%s: ps pushes by %s (%d worker(s) on its host%s): %s", info->label,
            s->host.on ? "host" : "worker", s->host.n ? s->host.n : 1,
            s->host.on ? (s->host.lead ? ", it leads" : "") : "", s->host.why);
    dp_metrics_event(s->env->metrics, "ps_push", DP_F_STR, "push",
                     s->host.on ? "host" : "worker", DP_F_STR, "reason", s->host.why, DP_F_INT,
                     "host_workers", (long)(s->host.n ? s->host.n : 1), DP_F_INT, "leads",
                     (long)(s->host.on && s->host.lead), DP_F_END);
    return 0;
}

/* The launcher's DOWNPOUR_RESTARTS (launcher.h): how often a lost task may
 * come back, so whether the chief waits for a lost ps.  Unset or empty is
 * 0; anything but a count is refused rather than read as 0. */
static int launch_restarts(int *out, dp_err *err)
{
    const char *v = getenv(DP_LAUNCH_RESTARTS_ENV);
    *out = 0;
    if (!v || !*v)
        return 0;
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || end == v || *end || n < 0 || n > INT_MAX)
        return dp_errf(err, "%s=\"%s\": expected the number of restarts a lost task has (0 or "
                            "more), as downpour launch --max-restarts sets it",
                       DP_LAUNCH_RESTARTS_ENV, v);
    *out = (int)n;
    return 0;
}

/* --sum-chunk (docs/strategies.md, "--global-batch"): the servers and the
 * workers agree on the chunks a push carries; a worker holds room for them.
 * Only where a chunk's gradient is the host model's over its own records
 * and nothing else adds into the sum. */
static int chunk_setup(dp_strategy *s, dp_ps_mode mode, dp_err *err)
{
    const dp_train_config *cfg = s->env->cfg;
    if (cfg->sum_chunk <= 0)
        return 0;
    const char *no = mode != DP_PS_SYNC                        ? "the strategy is not ps-sync"
                     : s->mp_k > 0                             ? "--model-parallel"
                     : s->pc.replicas > 1                      ? "--ps-replicas 2"
                     : s->pc.n_tables > 0                      ? "sparse tables moved by rows"
                     : cfg->device.kind != DP_DEVICE_CPU       ? "--device"
                     : cfg->clip_norm > 0                      ? "--clip-norm (each worker clips its own gradient)"
                     : s->m->external                          ? "an external model"
                     : s->m->n_buffers                         ? "batch norm's statistics"
                     : cfg->batch % cfg->sum_chunk != 0        ? "a share it does not divide"
                                                               : NULL;
    if (no)
        return dp_errf(err, "--sum-chunk %d: not with %s (docs/strategies.md, \"--global-batch\")",
                       cfg->sum_chunk, no);
    s->pc.chunks = cfg->batch / cfg->sum_chunk;
    s->pc.chunk = cfg->sum_chunk;
    if (s->part == DP_PART_TRAINER &&
        !(s->chunk_buf = malloc((size_t)s->pc.chunks * s->m->n_params * sizeof(float))))
        return dp_errf(err, "out of memory for %d chunks of %zu gradients", s->pc.chunks,
                       s->m->n_params);
    return 0;
}

/* --resume with --compress: this worker's own residual from the checkpoint,
 * replica.{worker}.residual (docs/checkpoints.md), so the run goes on bit
 * for bit.  The identity made the checkpoint's --compress this run's, so
 * it holds one per worker; any other count is a damaged or foreign file.
 * A worker restarted into the running run starts from zeros. */
static int restore_residual(dp_strategy *s, const dp_task_info *info, dp_err *err)
{
    const dp_train_state *r = s->env->resume;
    float *resid = dp_ps_client_residual(s->client);
    int W = s->c->count[DP_ROLE_WORKER];
    if (!r || !resid || info->start_step >= 0)
        return 0;
    if (r->n_residuals != W)
        return dp_errf(err, "%s: --compress %s, but it holds the compression residuals of %d "
                            "worker(s) and this run has %d: tensor 'replica.%d.residual' is %s "
                            "(docs/checkpoints.md, \"What a checkpoint holds\")",
                       s->env->resume_path ? s->env->resume_path : "the checkpoint",
                       dp_compress_kind_name(s->pc.compress.kind), r->n_residuals, W,
                       r->n_residuals < W ? r->n_residuals : W,
                       r->n_residuals < W ? "missing" : "one too many");
    memcpy(resid, r->residuals + (size_t)s->worker * s->m->n_params,
           s->m->n_params * sizeof *resid);
    return 0;
}

/* --compress auto, a worker: its slot's choice (docs/strategies.md, "ps
 * family: compression").  Each slot chooses once: a worker restarted or
 * joining into the running run takes what the chief hands it (its slot's,
 * else the lowest slot's: the running job's), a resumed one the
 * checkpoint's (the same way), and only one that finds none measures.
 * Said in the log, the metrics ("compress") and to the chief at once. */
static int auto_open(dp_strategy *s, const dp_task_info *info, dp_err *err)
{
    const dp_train_state *r = s->env->resume;
    int W = s->c->count[DP_ROLE_WORKER];
    char why[640], from[96] = "measured";
    if (info->start_step >= 0 && s->auto_code != DP_PS_AUTO_UNSET) {
        snprintf(from, sizeof from, "the running job's choice");
    } else if (info->start_step < 0 && r) {
        uint32_t *codes = calloc((size_t)W, sizeof *codes);
        if (!codes)
            return dp_errf(err, "out of memory");
        if (dp_ps_auto_parse(r->scalars, W, codes,
                             s->env->resume_path ? s->env->resume_path : "the checkpoint",
                             err) < 0) {
            free(codes);
            return -1;
        }
        s->auto_code = codes[s->worker];
        snprintf(from, sizeof from, "the checkpoint's choice");
        if (s->auto_code == DP_PS_AUTO_UNSET) { /* a slot that never chose */
            s->auto_code = dp_ps_auto_fallback(codes, W);
            for (int w = 0; w < W; w++)
                if (codes[w] == s->auto_code) {
                    snprintf(from, sizeof from, "the checkpoint's choice of worker %d", w);
                    break;
                }
        }
        free(codes);
    }
    if (s->auto_code != DP_PS_AUTO_UNSET) {
        double ratio = dp_ps_auto_ratio(s->auto_code);
        if (dp_ps_client_auto_take(s->client, ratio, err) < 0)
            return -1;
        if (ratio > 0)
            snprintf(why, sizeof why, "auto: topk:%g pushes, 4-bit answers (%s)", ratio, from);
        else
            snprintf(why, sizeof why, "auto: none (%s)", from);
    } else {
        if (dp_ps_client_auto(s->client, s->wparams, why, sizeof why, err) < 0)
            return -1;
        s->auto_code = dp_ps_auto_code(dp_ps_client_auto_ratio(s->client));
    }
    dp_info("%s: compress %s", info->label, why);
    dp_metrics_event(s->env->metrics, "compress", DP_F_STR, "task", s->env->node->self->name,
                     DP_F_INT, "worker", (long)s->worker, DP_F_STR, "compress", why, DP_F_STR,
                     "from", from, DP_F_END);
    long step = info->start_step >= 0 ? info->start_step : r ? r->step : 0;
    return tell_chief(s, DP_WIRE_PROGRESS, (uint64_t)step, NULL, 0, err);
}

int dp_ps_family_open(dp_strategy **out, const dp_run_env *env, dp_task_info *info,
                      dp_ps_mode mode, dp_err *err)
{
    const dp_train_config *cfg = env->cfg;
    const dp_cluster *c = &env->node->cluster;
    if (c->count[DP_ROLE_CHIEF] == 0)
        return dp_errf(err, "strategy %s needs a chief to start, evaluate and end the run. Hint: "
                            "downpour launch --chief ..., or a \"chief\" entry in the cluster spec",
                       cfg->strategy);
    if (c->count[DP_ROLE_WORKER] < 1)
        return dp_errf(err, "the cluster has no worker");
    int restarts;
    if (launch_restarts(&restarts, err) < 0)
        return -1;
    dp_strategy *s = calloc(1, sizeof *s);
    if (!s)
        return dp_errf(err, "out of memory");
    s->env = env;
    s->m = env->model;
    s->t = env->node->transport;
    s->c = c;
    s->mp_k = ((const dp_ps_settings *)dp_strategy_settings(cfg, &dp_ps_conf))->model_parallel;
    if (s->mp_k > 0 && cfg->spare_workers > 0) {
        free(s);
        return dp_errf(err, "--spare-workers: a --model-parallel worker holds slices of a "
                            "replica and cannot join one in mid-run");
    }
    if (dp_ps_settings_apply(dp_strategy_settings(cfg, &dp_ps_conf), &s->pc, err) < 0) {
        free(s);
        return -1;
    }
    s->pc.mode = mode;
    s->pc.heartbeat_timeout = cfg->heartbeat_timeout;
    s->pc.ema = cfg->ema;
    const dp_strategy_ops *ops = dp_strategy_find(cfg->strategy, NULL);
    s->chief_optional = ops && (ops->survives & DP_ROLE_BIT(DP_ROLE_CHIEF));
    s->pc.survives_chief = s->chief_optional;
    s->chief = dp_cluster_rank(c, DP_ROLE_CHIEF, 0);
    s->restarts = restarts;
    /* A lost ps without a backup is waited for while the launcher (or a
     * supervisor) may restart it: it reloads its shard (restore_ps).  Not
     * with --model-parallel, whose shards hold slice order (not built). */
    if (s->restarts > 0 && s->pc.replicas < 2 && s->mp_k == 0)
        s->pc.ps_wait = WAIT_TIMEOUT;
    dp_role role = env->node->self->role;
    s->part = role == DP_ROLE_PS      ? DP_PART_SERVER
              : role == DP_ROLE_CHIEF ? DP_PART_COORDINATOR
                                      : DP_PART_TRAINER;
    s->wparams = s->m->params;
    s->cut = dp_model_sparse_cut(s->m);
    if (choose_sparse(s, mode, dp_strategy_settings(cfg, &dp_ps_conf), err) < 0 ||
        chunk_setup(s, mode, err) < 0)
        goto fail;
    if (s->mp_k > 0 ? mp_layout(s, mode, err) < 0
                    : dp_ps_layout_make_from(&s->layout, c, s->dense_lo, s->m->n_params + s->cut,
                                             &s->pc,
                                             err) < 0)
        goto fail;
    info->part = s->part;
    info->evaluator = role == DP_ROLE_CHIEF;
    info->live_params = 0;
    info->replicas = s->K ? s->R : c->count[DP_ROLE_WORKER];
    info->shard_count = info->replicas;
    info->worker_optimizers = mode == DP_PS_AVG ? c->count[DP_ROLE_WORKER] : 0;
    if (s->part == DP_PART_SERVER) {
        *out = s;
        return 0;
    }
    dp_ps_layout mine = s->layout;
    if (s->K && s->part == DP_PART_TRAINER && mp_open_worker(s, &mine, info, err) < 0)
        goto fail;
    if (s->K && s->part == DP_PART_COORDINATOR && !(s->vec = malloc(s->m->n_params * sizeof(float)))) {
        dp_errf(err, "out of memory");
        goto fail;
    }
    dp_ps_config pc = s->pc;
    if (s->part == DP_PART_COORDINATOR)
        pc.push_behind = 0; /* the chief pushes nothing: no send thread, no log line */
    if (dp_ps_client_open(&s->client, s->t, &mine, &pc, &cfg->optim, s->m->n_params, err) < 0)
        goto fail;
    dp_ps_client_on_failover(s->client, failover_event, s);
    if (s->chunk_buf && dp_ps_client_send_thread(s->client)) { /* it copies one gradient */
        dp_errf(err, "--sum-chunk: not with a send thread (push-behind)");
        goto fail;
    }
    if (s->part == DP_PART_COORDINATOR) {
        dp_ps_client_on_restart(s->client, restore_ps, s);
        /* the workers' residuals go into its checkpoints (on_ready) */
        if (dp_ps_client_residual(s->client))
            info->residuals = c->count[DP_ROLE_WORKER];
        snprintf(info->label, sizeof info->label, "Chief");
        if (open_chief(s, err) < 0)
            goto fail;
    } else {
        s->worker = env->node->self->index;
        s->next_from = -1; /* no deal for a later epoch yet */
        if (!s->K) {
            info->shard_index = s->worker;
            s->deal_index = s->worker;
            s->deal_count = c->count[DP_ROLE_WORKER];
            snprintf(info->label, sizeof info->label, "Worker %d", s->worker);
        } else {
            snprintf(info->label, sizeof info->label, "Worker %d (mp task %d)", s->worker,
                     s->mp_task);
        }
        /* Which way the pushes go out is measured (docs/strategies.md,
         * "ps-async"): said, so a run's log shows what it chose. */
        if (s->pc.push_behind > 0 && dp_ps_client_push_behind(s->client) > 0)
            dp_info("%s: push-behind %d: it computes the next step while up to %d push(es) "
                    "are unanswered, taking the answers between steps; %s",
                    info->label, dp_ps_client_push_behind(s->client),
                    dp_ps_client_push_behind(s->client),
                    dp_ps_client_send_thread(s->client)
                        ? "a send thread sends each push while it computes"
                        : "it sends each push itself (--push-inline, or a shard may fail over)");
        s->reports = calloc((size_t)cfg->epochs, EPOCH_REPORT_SIZE);
        if (!s->reports) {
            dp_errf(err, "out of memory");
            goto fail;
        }
        dp_optim *local = dp_ps_client_local_optim(s->client);
        if (local && env->resume) {
            size_t n = s->m->n_params * (size_t)dp_optim_slots(local->cfg.kind);
            if (n)
                memcpy(local->state, env->resume->worker_slots + (size_t)s->worker * n,
                       n * sizeof(float));
            local->t = env->resume->worker_t[s->worker];
        }
        if (s->K && cfg->device.kind != DP_DEVICE_CPU) {
            dp_errf(err, "--device with --model-parallel: a model-parallel replica trains on "
                         "the CPU only (docs/gpu.md). Hint: drop one of them");
            goto fail;
        }
        if (dp_strategy_replica_open(env, info->label, 0, &s->replica, err) < 0 ||
            dp_replica_settle(s->replica, DP_STATE_HOST, 0, NULL, err) < 0)
            goto fail;
        info->replica = s->replica;
        /* --ps-reply bf16: a worker computes on what the servers answer,
         * bf16, from its first step on, so a resumed worker starts from the
         * weights the uninterrupted one had (docs/checkpoints.md) */
        for (int k = 0; s->pc.reply16 && k < mine.n_shards; k++)
            for (size_t i = mine.range[k].lo; i < mine.range[k].hi; i++) {
                float *p = s->wparams + i - s->pc.dense_shift;
                *p = dp_bf16_to_f32(dp_f32_to_bf16(*p));
            }
        if (await_start(s, info, err) < 0 || restore_residual(s, info, err) < 0 ||
            host_setup(s, info, err) < 0)
            goto fail;
        if (s->pc.compress.kind == DP_COMPRESS_AUTO && auto_open(s, info, err) < 0)
            goto fail;
    }
    *out = s;
    return 0;
fail:
    s->part = DP_PART_TRAINER; /* nothing to shut down yet */
    dp_ps_family_close(s);
    return -1;
}

/* The RESTORE a restarted ps gets from the chief: [u64 base step][u64
 * optimiser t][u32 flags][u32 workers], per worker a u64: the step it
 * reached as the chief knows it (NOT_DONE: it takes no part), then with
 * RESTORE_STATE the shard's parameters, each optimiser slot and the moving
 * average (when kept), as the STATE answer has them; the frame's step is
 * the checkpoint's.  With sparse tables each table's rows of the shard then
 * each slot's rows, in local order, follow in STATE_ROWS frames of a chunk
 * each, as a checkpoint's come (docs/faults.md, "A restarted ps"). */
#define RESTORE_HEAD 24
#define RESTORE_STATE 1u

/* Sparse tables: the rows of table k that shard `shard` holds (ids shard,
 * shard + S, ...: ps_shard.c's rule), and all of a shard's rows' floats
 * with their optimiser slots' (a RESTORE's part after the dense slice). */
static size_t shard_rows(const dp_strategy *s, int k, int shard)
{
    size_t rows = s->pc.tables[k].rows, S = (size_t)s->layout.n_shards;
    return shard >= 0 && rows > (size_t)shard ? (rows - 1 - (size_t)shard) / S + 1 : 0;
}

static size_t shard_rows_floats(const dp_strategy *s, int shard, int n_slots)
{
    size_t n = 0;
    for (int k = 0; k < s->pc.n_tables; k++)
        n += shard_rows(s, k, shard) * s->pc.tables[k].width * (size_t)(1 + n_slots);
    return n;
}

static int shard_of(const dp_strategy *s, int rank)
{
    for (int i = 0; i < s->layout.n_shards; i++)
        if (s->layout.rank[i] == rank)
            return i;
    return -1;
}

/* This task's shard (range lo, n floats; n = 0: it holds none). */
static void own_shard(const dp_strategy *s, int rank, size_t *lo, size_t *n)
{
    *lo = *n = 0;
    for (int i = 0; i < s->layout.n_shards; i++)
        if (s->layout.rank[i] == rank) {
            *lo = s->layout.range[i].lo;
            *n = s->layout.range[i].hi - *lo;
        }
}

/* A server's state as the chief restores it, in full-length buffers the
 * way dp_ps_start takes them (only this shard's slice is filled). */
typedef struct restored {
    float *slots, *ema, *rows;
    long *clocks;
} restored;

/* A RESTORE's rows: STATE_ROWS frames from the chief, table by table, the
 * rows then each slot's (part 0, 1, ..), each chunk checked against the one
 * expected next and its length against its count before a float is read,
 * into `rows` (local order, shard_rows_floats long). */
static int take_restore_rows(dp_strategy *s, int shard, int n_slots, long step, size_t lo,
                             float *rows, dp_err *err)
{
    const char *chief = dp_transport_peer_name(s->t, s->chief);
    size_t at = 0;
    for (int q = 0; q < s->pc.n_tables; q++) {
        size_t w = s->pc.tables[q].width, n = shard_rows(s, q, shard),
               per = dp_ps_state_chunk_rows(&s->pc, w);
        for (int j = 0; j <= n_slots; j++)
            for (size_t first = 0; first < n;) {
                size_t want = n - first < per ? n - first : per;
                dp_event ev;
                if (dp_transport_recv(s->t, s->chief, "the rows of its restore", WAIT_TIMEOUT,
                                      &ev, err) < 0)
                    return -1;
                uint8_t h[DP_PS_STATE_ROWS_HEAD];
                if (ev.header.type != DP_WIRE_STATE_ROWS || ev.header.step != (uint64_t)step ||
                    ev.header.offset != lo ||
                    ev.header.length != sizeof h + (uint64_t)want * w * sizeof(float))
                    return dp_errf(err, "the chief %s sent frame type %u of %llu bytes; expected "
                                        "STATE_ROWS of %zu rows of sparse table %d (part %d, "
                                        "from local row %zu) of its restore",
                                   chief, ev.header.type, (unsigned long long)ev.header.length,
                                   want, q, j, first);
                if (dp_transport_recv_payload(s->t, s->chief, h, sizeof h, err) < 0)
                    return -1;
                if (dp_get_u32(h) != (uint32_t)q || dp_get_u32(h + 4) != (uint32_t)j ||
                    dp_get_u32(h + 8) != (uint32_t)first || dp_get_u32(h + 12) != want)
                    return dp_errf(err, "the chief %s sent rows [%u, +%u) of part %u of sparse "
                                        "table %u; expected [%zu, +%zu) of part %d of table %d",
                                   chief, dp_get_u32(h + 8), dp_get_u32(h + 12),
                                   dp_get_u32(h + 4), dp_get_u32(h), first, want, j, q);
                if (dp_transport_recv_payload(s->t, s->chief, rows + at,
                                              want * w * sizeof(float), err) < 0)
                    return -1;
                at += want * w;
                first += want;
            }
    }
    return 0;
}

static int take_restore(dp_strategy *s, const dp_event *ev, dp_ps_start *start, restored *rs,
                        dp_err *err)
{
    size_t lo, n, np = s->m->n_params;
    own_shard(s, dp_transport_rank(s->t), &lo, &n);
    int workers = s->c->count[DP_ROLE_WORKER];
    int n_slots = dp_optim_slots(s->env->cfg->optim.kind), has_ema = s->pc.ema > 0;
    uint64_t len = ev->header.length;
    uint8_t head[RESTORE_HEAD];
    uint64_t table = 8 * (uint64_t)workers;
    if (len < RESTORE_HEAD + table || ev->header.offset != lo)
        return dp_errf(err, "the chief sent a RESTORE of %llu bytes for offset %llu; this task's "
                            "shard is at %zu", (unsigned long long)len,
                       (unsigned long long)ev->header.offset, lo);
    if (dp_transport_recv_payload(s->t, s->chief, head, sizeof head, err) < 0)
        return -1;
    uint32_t flags = dp_get_u32(head + 16), nw = dp_get_u32(head + 20);
    int shard = shard_of(s, dp_transport_rank(s->t));
    uint64_t want = RESTORE_HEAD + table +
                    (flags & RESTORE_STATE ? n * sizeof(float) * (uint64_t)(1 + n_slots + has_ema)
                                           : 0);
    if (nw != (uint32_t)workers || len != want)
        return dp_errf(err, "the chief's RESTORE holds %llu bytes for %u worker(s); expected %llu "
                            "for %d", (unsigned long long)len, nw, (unsigned long long)want,
                       workers);
    uint8_t *raw = malloc((size_t)table);
    rs->clocks = malloc((size_t)workers * sizeof *rs->clocks);
    if (!raw || !rs->clocks) {
        free(raw);
        return dp_errf(err, "out of memory");
    }
    if (dp_transport_recv_payload(s->t, s->chief, raw, (size_t)table, err) < 0) {
        free(raw);
        return -1;
    }
    long base = (long)dp_get_u64(head), ckpt = (long)ev->header.step;
    for (int w = 0; w < workers; w++) {
        uint64_t at = dp_get_u64(raw + 8 * w);
        rs->clocks[w] = at == NOT_DONE ? -1 : at > (uint64_t)base ? (long)at - base : 0;
    }
    free(raw);
    start->clocks = rs->clocks;
    start->step = base;
    if (!(flags & RESTORE_STATE)) {
        dp_warn("fault: %s was restarted; no checkpoint was written yet: its shard starts again "
                "from the run's initial parameters", dp_transport_peer_name(s->t, dp_transport_rank(s->t)));
        return 0;
    }
    /* the model's vectors: dense j at j - cut (a ps with compact tables) */
    size_t nrows = shard_rows_floats(s, shard, n_slots), at = lo - s->cut;
    if ((n_slots && !(rs->slots = calloc((size_t)n_slots * np, sizeof(float)))) ||
        (has_ema && !(rs->ema = calloc(np, sizeof(float)))) ||
        (nrows && !(rs->rows = malloc(nrows * sizeof(float)))))
        return dp_errf(err, "out of memory for %zu parameters and %zu floats of rows", np,
                       nrows);
    size_t bytes = n * sizeof(float);
    if (dp_transport_recv_payload(s->t, s->chief, s->m->params + at, bytes, err) < 0)
        return -1;
    for (int k = 0; k < n_slots; k++)
        if (dp_transport_recv_payload(s->t, s->chief, rs->slots + (size_t)k * np + at, bytes,
                                      err) < 0)
            return -1;
    if (has_ema && dp_transport_recv_payload(s->t, s->chief, rs->ema + at, bytes, err) < 0)
        return -1;
    /* the shard's rows of each table, then each slot's rows, in local order,
     * in STATE_ROWS chunks: the shard opens from them as they are
     * (dp_ps_start.rows) */
    if (nrows && take_restore_rows(s, shard, n_slots, ckpt, lo, rs->rows, err) < 0)
        return -1;
    start->rows = rs->rows;
    start->params = s->m->params;
    start->slots = rs->slots;
    start->t = (long)dp_get_u64(head + 8);
    start->ema = rs->ema;
    dp_warn("fault: %s was restarted; its shard [%zu, %zu) goes on from the checkpoint at step "
            "%ld", dp_transport_peer_name(s->t, dp_transport_rank(s->t)), lo, lo + n, ckpt);
    return 0;
}

/* A server starts when the chief says: START as the run starts, or a
 * RESTORE when this task was restarted into a running job.  Workers'
 * frames wait meanwhile (only the chief is read). */
static int await_chief(dp_strategy *s, dp_ps_start *start, restored *rs, dp_err *err)
{
    double deadline = dp_now() + WAIT_TIMEOUT;
    for (;;) {
        dp_event ev;
        double left = deadline - dp_now();
        if (left <= 0)
            return dp_errf(err, "waited %.0f s for the start signal from the chief %s",
                           WAIT_TIMEOUT, dp_transport_peer_name(s->t, s->chief));
        if (dp_transport_poll(s->t, s->chief, left, &ev, err) < 0)
            return -1;
        if (ev.kind == DP_EVENT_PEER_LOST) {
            if (!s->chief_optional)
                return dp_errf(err, "lost the chief %s (%s) before the start", 
                               dp_transport_peer_name(s->t, s->chief), ev.reason);
            continue; /* its restarted self sends the START */
        }
        if (ev.kind != DP_EVENT_FRAME)
            continue;
        if (ev.header.type == DP_WIRE_RESTORE)
            return take_restore(s, &ev, start, rs, err);
        if (ev.header.type == DP_WIRE_START)
            return dp_transport_skip_payload(s->t, s->chief, err);
        dp_warn("ignoring frame type %u from the chief before the start", ev.header.type);
        if (dp_transport_skip_payload(s->t, s->chief, err) < 0)
            return -1;
    }
}

/* In place: v (n_params floats) from the model's layout to slice order
 * (--model-parallel), through scratch. */
static void to_slice_order(const dp_strategy *s, float *v, float *scratch)
{
    memcpy(scratch, v, s->m->n_params * sizeof(float));
    mp_order_gather(v, scratch, s->plans, s->K);
}

/* dp_ps_start.read_rows: a resumed shard's rows from the checkpoint, by
 * rows (the loop's reader: no strategy calls into src/train). */
static int resumed_rows(void *ctx, int shard, int shards, int table, int part, float *dst,
                        size_t n, dp_err *err)
{
    const dp_strategy *s = ctx;
    const dp_checkpoint_source *ck = s->env->checkpoints;
    if (!ck || !ck->rows)
        return dp_errf(err, "a resumed shard with compact tables and no checkpoint reader");
    return ck->rows(s->env->resume, table, part, shard, shards, 0, n, dst, err);
}

/* dp_ps_start.init_rows: a shard's initial rows from the run's seed. */
static int draw_rows(void *ctx, int shard, int shards, float *const *dst, int n)
{
    const dp_strategy *s = ctx;
    return dp_model_init_rows(s->m, s->env->cfg->seed, shard, shards, dst, n);
}

int dp_ps_family_serve(dp_strategy *s, dp_err *err)
{
    const dp_train_state *r = s->env->resume;
    dp_ps_start start = {.params = s->m->params,
                         .spare_workers = s->env->cfg->spare_workers};
    if (r) {
        start.slots = r->slots;
        start.t = r->optim_t;
        start.ema = r->ema;
        start.step = r->step;
    }
    /* --model-parallel: the shards hold slice order */
    size_t np = s->m->n_params;
    int n_slots = r && r->slots ? r->n_slots : 0, has_ema = r && r->ema;
    float *v = NULL;
    if (s->K) {
        size_t nv = 1 + (size_t)n_slots + (size_t)has_ema;
        float *scratch = malloc(np * sizeof(float));
        if (!scratch || !(v = malloc(np * nv * sizeof(float)))) {
            free(scratch);
            return dp_errf(err, "out of memory for %zu parameters", np);
        }
        for (size_t k = 0; k < nv; k++) {
            const float *from = k == 0 ? s->m->params
                                : k <= (size_t)n_slots ? r->slots + np * (k - 1)
                                                       : r->ema;
            memcpy(v + np * k, from, np * sizeof(float));
            to_slice_order(s, v + np * k, scratch);
        }
        free(scratch);
        start.params = v;
        if (n_slots)
            start.slots = v + np;
        if (has_ema)
            start.ema = v + np * (1 + (size_t)n_slots);
    }
    /* compact tables: no table in the model's vectors; the shard draws its
     * rows (docs/strategies.md, "Tables larger than a worker") */
    start.shift = s->cut;
    start.init_rows = draw_rows;
    start.init_ctx = s;
    if (r && s->cut) { /* resumed: its rows from the checkpoint, a piece at a time */
        start.read_rows = resumed_rows;
        start.read_ctx = s;
    }
    restored rs = {0};
    int rc = await_chief(s, &start, &rs, err);
    if (rc == 0)
        rc = dp_ps_serve(s->t, s->c, &s->layout, &s->pc, &s->env->cfg->optim, &start,
                         s->m->n_params + s->cut, err);
    free(rs.slots);
    free(rs.ema);
    free(rs.rows);
    free(rs.clocks);
    free(v);
    return rc;
}

/* ------------------------------------------------------------ the chief's restore */

/* A ps task lost and restarted (ps.c await_restart): the chief sends it its
 * shard from the newest checkpoint (or, before the first one, tells it to
 * start from the initial parameters) and which workers take part, and
 * reports the steps lost.  1: the ps was lost again on the way. */
static void release_state(dp_strategy *s, dp_train_state *st)
{
    if (s->env->checkpoints)
        s->env->checkpoints->release(s->env->checkpoints->ctx, st);
}

/* The rows of a RESTORE (take_restore_rows's order), each chunk gathered
 * from the checkpoint's full-length vectors into one buffer of a chunk. */
static int send_restore_rows(dp_strategy *s, int rank, int shard, const dp_train_state *st,
                             int n_slots, uint64_t step, size_t lo, dp_err *err)
{
    size_t S = (size_t)s->layout.n_shards, most = 1;
    for (int q = 0; q < s->pc.n_tables; q++) {
        size_t w = s->pc.tables[q].width, r = dp_ps_state_chunk_rows(&s->pc, w) * w;
        most = r > most ? r : most;
    }
    float *buf = malloc(most * sizeof(float));
    if (!buf)
        return dp_errf(err, "out of memory for a chunk of %zu floats of rows", most);
    int rc = 0;
    const dp_checkpoint_source *ck = s->env->checkpoints;
    for (int q = 0; q < s->pc.n_tables && rc == 0; q++) {
        const dp_ps_table_spec *t = &s->pc.tables[q];
        size_t w = t->width, n = shard_rows(s, q, shard), per = dp_ps_state_chunk_rows(&s->pc, w);
        for (int j = 0; j <= n_slots && rc == 0; j++) {
            const float *v = j == 0 ? st->params : st->slots + (size_t)(j - 1) * st->n_params;
            for (size_t first = 0; first < n && rc == 0; first += per) {
                size_t m = n - first < per ? n - first : per;
                if (s->cut) { /* a chief on rows: from the file, a piece at a time */
                    dp_err why;
                    if (ck->rows(st, q, j, shard, (int)S, first, m, buf, &why) < 0) {
                        dp_warn("restoring %s: %s", dp_transport_peer_name(s->t, rank), why.msg);
                        rc = dp_errf(err, "%s", why.msg);
                        break;
                    }
                }
                for (size_t i = 0; i < m && !s->cut; i++)
                    memcpy(buf + i * w, v + t->off + ((size_t)shard + (first + i) * S) * w,
                           w * sizeof(float));
                uint8_t h[DP_PS_STATE_ROWS_HEAD];
                dp_put_u32(h, (uint32_t)q);
                dp_put_u32(h + 4, (uint32_t)j);
                dp_put_u32(h + 8, (uint32_t)first);
                dp_put_u32(h + 12, (uint32_t)m);
                struct iovec c[2] = {{h, sizeof h}, {buf, m * w * sizeof(float)}};
                rc = dp_transport_sendv(s->t, rank, DP_WIRE_STATE_ROWS, step, lo, c, 2, err);
            }
        }
    }
    free(buf);
    return rc;
}

static int restore_ps(void *ctx, int rank, dp_err *err)
{
    dp_strategy *s = ctx;
    const dp_train_config *cfg = s->env->cfg;
    const char *who = dp_transport_peer_name(s->t, rank);
    long base = s->env->resume ? s->env->resume->step : 0;
    dp_train_state st;
    memset(&st, 0, sizeof st);
    char path[4096] = "";
    int found = 0;
    const dp_checkpoint_source *ck = s->env->checkpoints;
    if (ck) {
        found = ck->newest(ck->ctx, &st, path, sizeof path, err);
        if (found < 0)
            return -1;
        if (found && st.step < base) /* an older run's */
            found = 0;
    }
    if (found && s->K) { /* the shards hold slice order */
        float *scratch = malloc(st.n_params * sizeof(float));
        if (!scratch) {
            release_state(s, &st);
            return dp_errf(err, "out of memory");
        }
        to_slice_order(s, st.params, scratch);
        for (int k = 0; k < st.n_slots; k++)
            to_slice_order(s, st.slots + (size_t)k * st.n_params, scratch);
        if (st.ema)
            to_slice_order(s, st.ema, scratch);
        free(scratch);
    }
    size_t lo, n;
    own_shard(s, rank, &lo, &n);
    int workers = s->c->count[DP_ROLE_WORKER];
    int n_slots = dp_optim_slots(cfg->optim.kind);
    uint8_t head[RESTORE_HEAD], *lv = malloc(8 * (size_t)workers);
    if (!lv || (found && st.n_slots != n_slots)) {
        free(lv);
        release_state(s, &st);
        return dp_errf(err, lv ? "%s holds %d optimiser slot(s); this run's optimiser has %d"
                               : "out of memory", path, st.n_slots, n_slots);
    }
    /* Where each worker is: the barrier's step for one waiting there (it
     * will not JOIN before it is let go, and must hold nobody), else the
     * newest step it reported (a few behind at most). */
    for (int w = 0; w < workers; w++) {
        int r = dp_cluster_rank(s->c, DP_ROLE_WORKER, w);
        long at = s->ready[r] ? s->ckpt_step : s->progress[r];
        dp_put_u64(lv + 8 * w, s->live[r] ? (uint64_t)(at > base ? at : base) : NOT_DONE);
    }
    dp_put_u64(head, (uint64_t)base);
    dp_put_u64(head + 8, found ? (uint64_t)st.optim_t : 0);
    dp_put_u32(head + 16, found ? RESTORE_STATE : 0);
    dp_put_u32(head + 20, (uint32_t)workers);
    struct iovec iov[7];
    int k = 0;
    size_t bytes = n * sizeof(float);
    iov[k++] = (struct iovec){head, sizeof head};
    iov[k++] = (struct iovec){lv, 8 * (size_t)workers};
    int shard = shard_of(s, rank);
    size_t nrows = found ? shard_rows_floats(s, shard, n_slots) : 0;
    if (found) { /* a chief on rows reads the dense parts only: dense j at j - cut */
        size_t at = n ? lo - s->cut : 0;
        iov[k++] = (struct iovec){st.params + at, bytes};
        for (int j = 0; j < n_slots; j++)
            iov[k++] = (struct iovec){st.slots + (size_t)j * st.n_params + at, bytes};
        if (s->pc.ema > 0)
            iov[k++] = (struct iovec){(st.ema ? st.ema : st.params) + at, bytes};
    }
    long from = found ? st.step : base, reached = from;
    for (int r = 0; r < s->c->n_tasks; r++)
        if (s->progress[r] > reached)
            reached = s->progress[r];
    dp_err why;
    uint64_t step = (uint64_t)(found ? st.step : 0);
    int rc = dp_transport_sendv(s->t, rank, DP_WIRE_RESTORE, step, lo, iov, k, &why);
    /* sparse tables: the shard's rows and their slots' rows follow in
     * STATE_ROWS chunks, gathered from the checkpoint's vectors a chunk at a
     * time (docs/faults.md, "A restarted ps") */
    if (rc == 0 && nrows)
        rc = send_restore_rows(s, rank, shard, &st, n_slots, step, lo, &why);
    release_state(s, &st);
    free(lv);
    if (rc < 0)
        return 1;
    dp_warn("fault: %s was restarted; the Chief restores its shard [%zu, %zu) from %s: the "
            "updates of about %ld step(s) to it are lost", who, lo, lo + n,
            found ? path : "the initial parameters (no checkpoint yet)", reached - from);
    dp_metrics_event(s->env->metrics, "fault", DP_F_STR, "task", who, DP_F_STR, "what",
                     "restarted", DP_F_STR, "action", "restore", DP_F_INT, "from_step", from,
                     DP_F_INT, "steps_lost", reached - from, DP_F_END);
    return 0;
}

/* ------------------------------------------------------------ workers */

static int update(void *self, float *params, const float *grads, int records, float lr,
                  dp_err *err)
{
    dp_strategy *s = self;
    /* the worker holds its whole gradient: clipped before it is pushed (or,
     * model-avg, applied locally) */
    if (records > 0 && s->env->cfg->clip_norm > 0)
        dp_grad_clip(s->m->grads, s->m->n_params, s->env->cfg->clip_norm);
    if (s->host.on)
        return dp_ps_host_step(&s->host, s->client, params, grads, records, lr, s->step_now, err);
    return dp_ps_client_step(s->client, params, grads, records, lr, err);
}

static const dp_grad_ops grad_ops = {.update = update};

/* --clip-norm on a model-parallel worker (docs/training.md, "Gradient
 * clipping"): its slices are a part of the replica's gradient, so the
 * replica's tasks exchange their sums of squares (MP_NORM, as
 * model_parallel.c's tasks do) and each scales its part by the whole
 * gradient's coefficient before it pushes.  mp_replica_step waited for its
 * frames, so these follow them in order. */
static int clip_replica(dp_strategy *s, long step, float *g, dp_err *err)
{
    double part = dp_grad_sumsq(g, s->mp_n), sum = 0;
    uint8_t b[8];
    dp_put_f64(b, part);
    for (int q = 0; q < s->K; q++)
        if (q != s->mp_task && dp_transport_send(s->t, s->mp_ranks[q], DP_WIRE_MP_NORM,
                                                 (uint64_t)step, (uint64_t)s->mp_task, b, 8,
                                                 err) < 0)
            return -1;
    for (int q = 0; q < s->K; q++) {
        double v = part;
        if (q != s->mp_task) {
            if (dp_transport_recv_exact(s->t, s->mp_ranks[q], DP_WIRE_MP_NORM, (uint64_t)step,
                                        (uint64_t)q, b, 8, "a replica task's part of the "
                                        "gradient norm", s->mp_timeout, err) != 0)
                return -1;
            v = dp_get_f64(b);
        }
        sum += v;
    }
    dp_grad_scale(g, s->mp_n, dp_clip_coef(sum, s->env->cfg->clip_norm));
    return 0;
}

/* A model-parallel worker's step: its replica's forward and backward give
 * the gradient of its slices, which its client pushes to their shards. */
static int mp_step(dp_strategy *s, const float *x, const uint8_t *y, int n, float lr, long step,
                   dp_step_out *out, dp_err *err)
{
    out->loss = 0;
    out->correct = 0;
    float *g = s->vgrads + s->mp_lo;
    if (n > 0) {
        if (mp_replica_step(s->rep, s->vec + s->mp_lo, g, x, y, n, 1.0f, step, out, err) < 0)
            return -1;
    } else {
        memset(g, 0, s->mp_n * sizeof *g);
    }
    if (s->env->cfg->clip_norm > 0 && clip_replica(s, step, g, err) < 0)
        return -1;
    return dp_ps_client_step(s->client, s->vec, s->vgrads, n, lr, err);
}

/* --sum-chunk: the gradient of each chunk of the batch on its own (the
 * host model over its records, whatever the batch around it), pushed
 * together for the shards to add in order (ps.c, dp_ps_round_chunk_sum). */
static int chunk_step(dp_strategy *s, const float *x, const uint8_t *y, int n, float lr,
                      long step, dp_step_out *out, dp_err *err)
{
    size_t np = s->m->n_params, dim = s->env->train->dim;
    int c = s->pc.chunk;
    double loss = 0;
    if (n > s->pc.chunks * c) /* the loop's redeal after a lost worker: bigger shares */
        return dp_errf(err, "--sum-chunk %d: a step of %d records, more than this run's %d "
                            "chunks a worker; a run that lost a worker goes on with --resume "
                            "from its newest checkpoint on the workers there are "
                            "(docs/checkpoints.md)", c, n, s->pc.chunks);
    out->loss = 0;
    out->correct = 0;
    double t0 = dp_now();
    for (int j = 0; j < s->pc.chunks; j++) {
        int lo = j * c, k = n - lo < c ? n - lo : c;
        float *g = s->chunk_buf + (size_t)j * np;
        if (k <= 0) {
            memset(g, 0, np * sizeof *g);
            continue;
        }
        int right = 0;
        loss += (double)dp_model_forward_backward(s->m, x + (size_t)lo * dim, y + lo, k, &right) *
                k;
        out->correct += right;
        memcpy(g, s->m->grads, np * sizeof *g);
    }
    dp_trace_compute("compute", t0, dp_now());
    if (n > 0) {
        out->loss = (float)(loss / n);
        if (!isfinite(out->loss))
            return dp_errf(err, "the loss became %g at step %ld: lower the learning rate (--lr)",
                           (double)out->loss, step);
    }
    double t1 = dp_now();
    int rc = dp_ps_client_step(s->client, s->m->params, s->chunk_buf, n, lr, err);
    dp_trace_span("update", "comm", t1, dp_now(), -1);
    return rc;
}

int dp_ps_family_step(dp_strategy *s, const float *x, const uint8_t *y, int n, float lr,
                      long step, dp_step_out *out, dp_err *err)
{
    dp_ps_client_at_step(s->client, step);
    s->step_now = step;
    if (s->pc.n_tables > 0 && pull_rows(s, x, n, err) < 0)
        return -1;
    x = slot_batch(s, x, n);
    int rc = s->K          ? mp_step(s, x, y, n, lr, step, out, err)
             : s->chunk_buf ? chunk_step(s, x, y, n, lr, step, out, err)
                            : dp_data_parallel_step(s->m, s->replica, &grad_ops, s, x, y, n, lr,
                                                    step, out, err);
    /* The chief evaluates once every epoch report is in: the epoch's pushes
     * are answered within it (push-behind), so it evaluates them all. */
    if (rc == 0 && s->env->steps_per_epoch > 0 && step % s->env->steps_per_epoch == 0)
        rc = dp_ps_client_drain(s->client, s->wparams, err);
    out->clock_gap = dp_ps_client_max_gap(s->client);
    /* A few times an epoch the chief hears how far this worker got: a
     * restarted worker goes on from there, not from its epoch's start. */
    s->at_step = step;
    long every = s->env->steps_per_epoch / PROGRESS_PER_EPOCH;
    if (rc < 0 || step % (every > 0 ? every : 1) != 0)
        return rc;
    /* Then whatever the chief sent: a deal, or a chief that is back. */
    dp_event ev;
    if (tell_chief(s, DP_WIRE_PROGRESS, (uint64_t)step, NULL, 0, err) < 0 ||
        from_chief(s, ONLY_DEALS, "nothing but deals", 0, &ev, err) < 0)
        return -1;
    return 0;
}

int dp_ps_family_deal(dp_strategy *s, int epoch, int *index, int *count, dp_err *err)
{
    dp_event ev;
    if (from_chief(s, ONLY_DEALS, "nothing but deals", 0, &ev, err) < 0)
        return -1;
    if (s->next_from >= 0 && epoch >= s->next_from) {
        s->deal_index = s->next_index;
        s->deal_count = s->next_count;
        s->next_from = -1;
    }
    *index = s->deal_index;
    *count = s->deal_count;
    return 0;
}

int dp_ps_family_epoch_end(dp_strategy *s, int epoch, dp_epoch_stats *st, dp_err *err)
{
    uint8_t p[EPOCH_REPORT_SIZE];
    /* the tasks of a model-parallel replica train the same records: its
     * task 0 counts them */
    int counts = !s->K || s->mp_task == 0;
    dp_put_f64(p, counts ? st->loss_sum : 0);
    dp_put_f64(p + 8, counts ? st->records : 0);
    dp_put_f64(p + 16, counts ? st->correct : 0);
    dp_put_f64(p + 24, st->seconds);
    dp_put_u64(p + 32, counts ? (uint64_t)st->steps : 0);
    if (epoch >= 1 && epoch <= s->env->cfg->epochs) {
        memcpy(s->reports + (size_t)(epoch - 1) * EPOCH_REPORT_SIZE, p, sizeof p);
        s->n_reports = epoch;
    }
    if (send_buffers(s, (uint64_t)epoch, err) < 0)
        return -1;
    return tell_chief(s, DP_WIRE_EPOCH, (uint64_t)epoch, p, sizeof p, err);
}

/* The checkpoint barrier, a worker's side: everything this worker pushed is
 * applied, it hands in its own state (model-avg: its optimiser) and waits
 * until the chief has written the checkpoint. */
int dp_ps_family_save(dp_strategy *s, long step, dp_train_state *st, dp_err *err)
{
    (void)st;
    if (dp_ps_client_sync(s->client, s->wparams, err) < 0)
        return -1;
    dp_optim *local = dp_ps_client_local_optim(s->client);
    float *resid = dp_ps_client_residual(s->client);
    uint8_t head[8];
    struct iovec iov[3] = {{head, sizeof head}, {NULL, 0}};
    int iovcnt = 0;
    if (local) {
        dp_put_u64(head, (uint64_t)local->t);
        iov[1].iov_base = local->state;
        iov[1].iov_len = local->n * (size_t)dp_optim_slots(local->cfg.kind) * sizeof(float);
        iovcnt = 2;
    }
    /* --compress: its error-feedback residual, after the pushes synced
     * (docs/checkpoints.md, "Compression residuals") */
    if (resid)
        iov[iovcnt++] = (struct iovec){resid, s->m->n_params * sizeof(float)};
    /* A chief that is back is attached first, so that it holds this
     * checkpoint with this worker; while it is lost, the checkpoint is not
     * written and its restarted self goes on from the one before. */
    dp_event ev;
    dp_err why;
    int rc = 0;
    if (s->chief_lost && from_chief(s, ONLY_DEALS, "nothing but deals", 0, &ev, err) < 0)
        return -1;
    if (send_buffers(s, (uint64_t)step, err) < 0)
        return -1;
    if (!s->chief_lost &&
        dp_transport_sendv(s->t, s->chief, DP_WIRE_CKPT_READY, (uint64_t)step, s->auto_code,
                           iov, iovcnt, &why) < 0 &&
        chief_gone(s, why.msg, err) < 0)
        return -1;
    if (!s->chief_lost && (rc = from_chief(s, DP_WIRE_CKPT_GO, "the checkpoint to be written",
                                           WAIT_TIMEOUT, &ev, err)) < 0)
        return -1;
    if (rc == 0) {
        dp_warn("fault: Worker %d: the checkpoint at step %ld is not written: the chief is lost",
                s->worker, step);
        return 0;
    }
    if (ev.header.step != (uint64_t)step)
        return dp_errf(err, "expected the chief's go-ahead after checkpoint %ld, got frame type "
                            "%u for step %llu", step, ev.header.type,
                       (unsigned long long)ev.header.step);
    return dp_transport_skip_payload(s->t, s->chief, err) < 0 ? -1 : 0;
}

int dp_ps_family_finish(dp_strategy *s, long steps, dp_err *err)
{
    if (dp_ps_client_flush(s->client, s->wparams, err) < 0)
        return -1;
    /* The clock gap is the bound only ps-ssp and ps-dssp keep. */
    if (s->pc.mode == DP_PS_SSP || s->pc.mode == DP_PS_DSSP)
        dp_info("Worker %d: done after %ld steps; largest clock gap allowed: %ld", s->worker,
                steps, dp_ps_client_max_gap(s->client));
    else
        dp_info("Worker %d: done after %ld steps", s->worker, steps);
    if (dp_ps_client_say(s->client, DP_WIRE_DONE, (uint64_t)steps, err) < 0)
        return -1;
    s->finished = 1;
    s->done_steps = steps;
    if (tell_chief(s, DP_WIRE_DONE, (uint64_t)steps, NULL, 0, err) < 0)
        return -1;
    /* The worker stays until the chief has ended the run, so a chief
     * restarted meanwhile still hears that it is done. */
    dp_event ev;
    int rc;
    while ((rc = from_chief(s, DP_WIRE_SHUTDOWN, "the end of the run", WAIT_TIMEOUT, &ev, err)) == 0)
        ;
    return rc < 0 ? -1 : dp_transport_skip_payload(s->t, s->chief, err);
}

/* Drained after `steps` (docs/faults.md, "Draining"): what is pending is
 * pushed, the servers retire this worker as one that is done (a ps-sync
 * round closes without it), and the chief hears its last step; the BYE the
 * node then says tells the chief it left rather than died. */
int dp_ps_family_leave(dp_strategy *s, long steps, dp_err *err)
{
    if (s->K)
        return dp_errf(err, "SIGTERM: Worker %d holds slices of a model-parallel replica, "
                            "which cannot go on without them, so it cannot drain", s->worker);
    if (s->chief_lost)
        return dp_errf(err, "SIGTERM: Worker %d cannot drain while the chief is lost (a "
                            "restarted chief would wait for it)", s->worker);
    if (dp_ps_client_flush(s->client, s->wparams, err) < 0 ||
        dp_ps_client_say(s->client, DP_WIRE_DONE, (uint64_t)steps, err) < 0)
        return -1;
    return tell_chief(s, DP_WIRE_PROGRESS, (uint64_t)steps, NULL, 0, err);
}

/* ------------------------------------------------------------ the chief */

/* Worker r's report of epoch e, counted once: a worker tells a restarted
 * chief every report again (attach). */
static void count_report(dp_strategy *s, int r, int e, const uint8_t *p)
{
    uint8_t *seen = &s->reported[(size_t)r * ((size_t)s->env->cfg->epochs + 1) + (size_t)e];
    if (*seen)
        return;
    *seen = 1;
    epoch_tally *t = &s->tally[e];
    t->reports++;
    if ((long)e * s->env->steps_per_epoch > s->progress[r])
        s->progress[r] = (long)e * s->env->steps_per_epoch;
    t->sum.loss_sum += dp_get_f64(p);
    t->sum.records += dp_get_f64(p + 8);
    t->sum.correct += dp_get_f64(p + 16);
    t->sum.steps += (long)dp_get_u64(p + 32);
}

static int on_epoch_report(dp_strategy *s, const dp_event *ev, dp_err *err)
{
    const char *who = dp_transport_peer_name(s->t, ev->peer);
    uint64_t e = ev->header.step;
    if (ev->header.length != EPOCH_REPORT_SIZE || e < 1 || e > (uint64_t)s->env->cfg->epochs)
        return dp_errf(err, "%s sent a malformed epoch report (%llu bytes for epoch %llu)", who,
                       (unsigned long long)ev->header.length, (unsigned long long)e);
    uint8_t p[EPOCH_REPORT_SIZE];
    if (dp_transport_recv_payload(s->t, ev->peer, p, sizeof p, err) < 0)
        return -1;
    count_report(s, ev->peer, (int)e, p);
    return 0;
}

/* Worker 0's buffers (send_buffers): the chief's model takes them, so its
 * evaluation, checkpoints and --save hold worker 0's statistics.  The count
 * must be the model's, and the length its. */
static int on_buffers(dp_strategy *s, const dp_event *ev, dp_err *err)
{
    const char *who = dp_transport_peer_name(s->t, ev->peer);
    const dp_task *task = &s->c->tasks[ev->peer];
    if (task->role != DP_ROLE_WORKER || task->index != 0)
        return dp_errf(err, "%s sent its buffers; only worker 0 sends them", who);
    char holder[DP_MAX_SPEC + 8];
    snprintf(holder, sizeof holder, "model %s", s->m->name);
    return dp_buffers_recv(s->t, ev, who, holder, s->m->buffers, s->m->n_buffers, err) < 0 ? -1
                                                                                          : 0;
}

static int on_ready(dp_strategy *s, const dp_event *ev, dp_train_state *st, dp_err *err)
{
    const char *who = dp_transport_peer_name(s->t, ev->peer);
    long step = (long)ev->header.step;
    int w = s->c->tasks[ev->peer].role == DP_ROLE_WORKER ? s->c->tasks[ev->peer].index : -1;
    if (w < 0 || !s->live[ev->peer] || s->ready[ev->peer])
        return dp_errf(err, "%s reached a checkpoint it should not (step %ld)", who, step);
    /* A barrier released before this worker came to it: a restarted chief
     * passed it over while this one had not re-attached yet.  It goes on at
     * once: held there, it would hold the servers' rounds (ps-sync), which
     * hold the workers let go, and none would come to the barrier again. */
    int late = step <= s->released;
    if (!late && s->n_ready > 0 && step != s->ckpt_step)
        return dp_errf(err, "%s is at checkpoint step %ld, the others at %ld", who, step,
                       s->ckpt_step);
    size_t want = 0, per = 0, resid = 0;
    if (st->n_workers > 0) {
        per = (size_t)st->n_slots * st->n_params;
        want = 8 + per * sizeof(float);
    }
    if (st->n_residuals > 0 && st->residuals) {
        if (w >= st->n_residuals)
            return dp_errf(err, "%s: the checkpoint holds %d workers' residuals", who,
                           st->n_residuals);
        resid = st->n_params * sizeof(float);
    }
    if (ev->header.length != want + resid)
        return dp_errf(err, "%s handed in %llu bytes of state at checkpoint %ld; expected %zu", who,
                       (unsigned long long)ev->header.length, step, want + resid);
    if (want) {
        uint8_t head[8];
        if (dp_transport_recv_payload(s->t, ev->peer, head, sizeof head, err) < 0 ||
            dp_transport_recv_payload(s->t, ev->peer, st->worker_slots + (size_t)w * per,
                                      per * sizeof(float), err) < 0)
            return -1;
        st->worker_t[w] = (long)dp_get_u64(head);
    }
    if (resid && dp_transport_recv_payload(s->t, ev->peer,
                                           st->residuals + (size_t)w * st->n_params, resid,
                                           err) < 0)
        return -1;
    if (late) {
        dp_warn("fault: %s came to the checkpoint barrier of step %ld after it was released; "
                "it goes on at once (that checkpoint is not written)", who, step);
        return send_to(s, ev->peer, DP_WIRE_CKPT_GO, (uint64_t)step, NULL, 0, err);
    }
    s->ready[ev->peer] = 1;
    s->n_ready++;
    s->ckpt_step = step;
    return 0;
}

static void deal_all(dp_strategy *s, int joiner, long step, int from);

/* --compress auto: a worker says its choice in the offset of its PROGRESS
 * and CKPT_READY (ps_auto.h; 0: none yet); the chief keeps its slot's. */
static int hear_auto(dp_strategy *s, const dp_event *ev, dp_err *err)
{
    uint64_t code = ev->header.offset;
    if (!s->auto_codes || code == DP_PS_AUTO_UNSET)
        return 0;
    if (code >= DP_PS_AUTO_CODES || s->c->tasks[ev->peer].role != DP_ROLE_WORKER)
        return dp_errf(err, "%s says --compress auto chose %llu, not one auto takes (ps_auto.h: "
                            "1 to %d)", dp_transport_peer_name(s->t, ev->peer),
                       (unsigned long long)code, DP_PS_AUTO_CODES - 1);
    s->auto_codes[s->c->tasks[ev->peer].index] = (uint32_t)code;
    return 0;
}

/* A rejoining worker's START: its deal, and under --compress auto its
 * slot's choice (else the lowest slot's: the running job's; 0 when none
 * chose yet, and it measures). */
static void send_rejoin_start(dp_strategy *s, int r, long step, uint32_t index, uint32_t count)
{
    uint8_t p[12];
    dp_put_u32(p, index);
    dp_put_u32(p + 4, count);
    if (s->auto_codes) {
        int w = s->c->tasks[r].index, W = s->c->count[DP_ROLE_WORKER];
        dp_put_u32(p + 8, s->auto_codes[w] ? s->auto_codes[w]
                                           : dp_ps_auto_fallback(s->auto_codes, W));
    }
    dp_err ignore;
    dp_transport_send(s->t, r, DP_WIRE_START, (uint64_t)step, 1, p, s->auto_codes ? 12 : 8,
                      &ignore);
}

/* A worker's first word (or its loss) came.  The chief decides nothing
 * before it has heard of every worker: a restarted chief must first learn
 * where the running ones are (on_attach). */
static void hear(dp_strategy *s, int r)
{
    if (s->c->tasks[r].role == DP_ROLE_WORKER && !s->heard[r]) {
        s->heard[r] = 1;
        s->unheard--;
    }
}

/* Every mode goes on without a lost worker: the servers release whoever
 * waited for it, and the run is evaluated on the survivors' reports. */
static int on_lost(dp_strategy *s, const dp_event *ev, dp_err *err)
{
    const char *who = dp_transport_peer_name(s->t, ev->peer);
    s->joining[ev->peer] = 0;
    hear(s, ev->peer);
    if (!s->live[ev->peer] && s->c->tasks[ev->peer].role != DP_ROLE_PS)
        return 0;
    if (s->c->tasks[ev->peer].role == DP_ROLE_PS) {
        /* With --ps-replicas 2 its shards go on on their backups (ps.c,
         * which logs it; failover_event records it). */
        return dp_ps_client_lost(s->client, ev->peer, ev->reason, err) < 0 ? -1 : 0;
    }
    if (s->K)
        return dp_errf(err, "lost %s (%s): it held slices of a model-parallel replica, which "
                            "cannot go on without them, so the run stops", who, ev->reason);
    s->live_workers--;
    s->live[ev->peer] = 0;
    s->lost[ev->peer] = 1;
    if (ev->orderly) {
        /* A BYE before DONE: drained (docs/faults.md, "Draining").  It said
         * DONE to the servers and its last step (PROGRESS) to this chief;
         * it will not come back, so its share is dealt to the others now. */
        s->losses[ev->peer] = s->restarts + 1;
        dp_info("%s drained at step %ld; the run goes on over %d worker(s)", who,
                s->progress[ev->peer], s->live_workers - s->done);
        dp_metrics_event(s->env->metrics, "drain", DP_F_STR, "task", who, DP_F_STR, "action",
                         "drain", DP_F_INT, "step", s->progress[ev->peer], DP_F_INT, "workers",
                         (long)(s->live_workers - s->done), DP_F_END);
        deal_all(s, -1, 0, 0);
        if (s->ready[ev->peer]) {
            s->ready[ev->peer] = 0;
            s->n_ready--;
        }
        return 0;
    }
    /* A worker with a restart left comes back for its own share; one
     * without has its share dealt to the others. */
    int awaited = ++s->losses[ev->peer] <= s->restarts;
    dp_warn("fault: lost %s (%s); the run goes on with %d worker(s), %s", who, ev->reason,
            s->live_workers - s->done,
            awaited ? "waiting for it to rejoin" : "its data dealt among them from their next epoch");
    dp_metrics_event(s->env->metrics, "fault", DP_F_STR, "task", who, DP_F_STR, "what",
                     ev->reason, DP_F_STR, "action", awaited ? "await" : "continue", DP_F_INT,
                     "workers", (long)(s->live_workers - s->done), DP_F_END);
    if (!awaited)
        deal_all(s, -1, 0, 0);
    if (s->ready[ev->peer]) {
        s->ready[ev->peer] = 0;
        s->n_ready--;
    }
    return 0;
}

/* Deals the data among the workers not lost, in worker order: a
 * DEAL to each, and to a rejoining worker (rank `joiner`) its START at
 * `step` with its deal.  `from`: 0, each takes it at its next epoch; E + 1,
 * from epoch E (0-based; a spare that joins starts there).  A worker that
 * cannot be told is on its way out: its loss arrives as an event. */
static void deal_all(dp_strategy *s, int joiner, long step, int from)
{
    int n = 0;
    for (int w = 0; w < s->c->count[DP_ROLE_WORKER]; w++)
        n += !s->lost[dp_cluster_rank(s->c, DP_ROLE_WORKER, w)];
    for (int w = 0, k = 0; w < s->c->count[DP_ROLE_WORKER]; w++) {
        int r = dp_cluster_rank(s->c, DP_ROLE_WORKER, w);
        if (s->lost[r])
            continue;
        int index = k++;
        if (!s->live[r])
            continue; /* done: its epochs are behind it */
        uint8_t p[8];
        dp_put_u32(p, (uint32_t)index);
        dp_put_u32(p + 4, (uint32_t)n);
        dp_err ignore;
        if (r == joiner)
            send_rejoin_start(s, r, step, (uint32_t)index, (uint32_t)n);
        else
            dp_transport_send(s->t, r, DP_WIRE_DEAL, 0, (uint64_t)from, p, sizeof p, &ignore);
    }
}

/* Reports epoch e waits for: every worker not lost that takes part from e. */
static int expected_reports(const dp_strategy *s, int e)
{
    int n = 0;
    for (int w = 0; w < s->c->count[DP_ROLE_WORKER]; w++) {
        int r = dp_cluster_rank(s->c, DP_ROLE_WORKER, w);
        n += !s->lost[r] && s->from_epoch[r] <= e;
    }
    return n;
}

/* A restarted worker is back: it goes on from the newest step it said it
 * reached (PROGRESS, an epoch report), so its share is trained once, however
 * far the others got; no earlier than the newest checkpoint, and one step
 * before it when a checkpoint falls there, so it takes part in that
 * checkpoint. */
static void admit_rejoin(dp_strategy *s, int r)
{
    const dp_train_config *cfg = s->env->cfg;
    long spe = s->env->steps_per_epoch, total = spe * cfg->epochs;
    long step = s->progress[r];
    int from = 0;
    if (s->fresh[r]) {
        /* A spare slot filled: it starts at the start of an epoch no live
         * worker has begun, and every worker takes the new deal from that
         * epoch on, so each epoch is walked once by one set of shards.
         * What the chief knows of their steps (PROGRESS, 16 an epoch) may
         * lag: a worker within an eighth of an epoch of the next is taken
         * to be in it already. */
        long hi = s->last_ckpt;
        for (int q = 0; q < s->c->n_tasks; q++)
            if (s->live[q] && s->progress[q] > hi)
                hi = s->progress[q];
        long e = (hi + spe / 8) / spe + 1;
        step = e < cfg->epochs ? e * spe : total;
        from = e < cfg->epochs ? (int)e + 1 : 0;
        /* A checkpoint barrier the others reach before its first step would
         * count it (live) without it: it is admitted at that barrier's
         * release instead (release_barrier), as near its start as that. */
        long seen = s->ckpt_step > s->last_ckpt ? s->ckpt_step : s->last_ckpt;
        if (from && cfg->checkpoint_dir && cfg->checkpoint_every > 0 &&
            (seen / cfg->checkpoint_every + 1) * cfg->checkpoint_every < step) {
            s->joining[r] = 1;
            return;
        }
    }
    if (step < s->last_ckpt)
        step = s->last_ckpt;
    int ckpt_there = cfg->checkpoint_dir &&
                     (step == total || (cfg->checkpoint_every > 0 && step % cfg->checkpoint_every == 0));
    /* a spare slot filled after the last epoch began starts at the end: it
     * trains nothing and takes part in no checkpoint */
    if (step > s->last_ckpt && ckpt_there && !(s->fresh[r] && !from))
        step--;
    s->joining[r] = 0;
    s->lost[r] = 0;
    s->live[r] = 1;
    s->live_workers++;
    s->from_epoch[r] = (int)(step / spe) + 1;
    const char *who = dp_transport_peer_name(s->t, r);
    if (s->fresh[r]) { /* the job grows: no fault */
        s->fresh[r] = 0;
        s->losses[r] = 0;
        dp_info("%s joined (a spare slot); it starts at step %ld (epoch %d), and the run goes "
                "on with %d worker(s)%s", who, step, s->from_epoch[r], s->live_workers - s->done,
                from ? ", the data dealt among them from that epoch" : "");
        dp_metrics_event(s->env->metrics, "join", DP_F_STR, "task", who, DP_F_STR, "action",
                         "join", DP_F_INT, "step", step, DP_F_INT, "workers",
                         (long)(s->live_workers - s->done), DP_F_END);
        if (from) {
            deal_all(s, r, step, from);
        } else { /* the last epoch is under way: nothing left for it */
            send_rejoin_start(s, r, step, 0, 1);
        }
        return;
    }
    dp_warn("fault: %s rejoined; it starts at step %ld (epoch %d) and the run goes on with %d "
            "worker(s)", who, step, s->from_epoch[r], s->live_workers - s->done);
    dp_metrics_event(s->env->metrics, "fault", DP_F_STR, "task", who, DP_F_STR, "what",
                     "restarted", DP_F_STR, "action", "rejoin", DP_F_INT, "step", step, DP_F_END);
    deal_all(s, r, step, 0);
}

/* A restarted chief hears from a worker that was running all along
 * (attach): where it is, whether it is done, and its epoch reports. */
static int on_attach(dp_strategy *s, const dp_event *ev, dp_err *err)
{
    int r = ev->peer;
    const char *who = dp_transport_peer_name(s->t, r);
    uint8_t head[ATTACH_HEAD];
    int epochs = s->env->cfg->epochs;
    if (ev->header.length < ATTACH_HEAD ||
        dp_transport_recv_payload(s->t, r, head, sizeof head, err) < 0)
        return ev->header.length < ATTACH_HEAD
                   ? dp_errf(err, "%s re-attached with %llu bytes; expected at least %d", who,
                             (unsigned long long)ev->header.length, ATTACH_HEAD)
                   : -1;
    uint64_t step = dp_get_u64(head), done = dp_get_u64(head + 8);
    uint32_t n = dp_get_u32(head + 16);
    long total = s->env->steps_per_epoch * epochs;
    if (n > (uint32_t)epochs || ev->header.length != ATTACH_HEAD + (uint64_t)n * EPOCH_REPORT_SIZE ||
        step > (uint64_t)total || (done != NOT_DONE && done > (uint64_t)total))
        return dp_errf(err, "%s re-attached at step %llu with %u epoch report(s) in %llu bytes; "
                            "this run has %d epochs of %ld steps", who, (unsigned long long)step,
                       n, (unsigned long long)ev->header.length, epochs, s->env->steps_per_epoch);
    for (uint32_t e = 1; e <= n; e++) {
        uint8_t p[EPOCH_REPORT_SIZE];
        if (dp_transport_recv_payload(s->t, r, p, sizeof p, err) < 0)
            return -1;
        count_report(s, r, (int)e, p);
    }
    if ((long)step > s->progress[r])
        s->progress[r] = (long)step;
    if (done != NOT_DONE && s->live[r]) {
        s->live[r] = 0;
        s->done++;
        s->steps += (long)done;
    }
    if (!s->heard[r])
        s->attached++;
    hear(s, r);
    dp_info("Chief: %s is running: at step %llu%s, %u epoch(s) reported", who,
            (unsigned long long)step, done != NOT_DONE ? ", done" : "", n);
    return 0;
}

/* JOIN: the first incarnation's is a no-op; a restarted worker's is admitted
 * at once, or after the checkpoint barrier in progress. */
static int on_join(dp_strategy *s, const dp_event *ev, dp_err *err)
{
    int r = ev->peer;
    if (ev->header.offset == 1 && s->c->tasks[r].role == DP_ROLE_WORKER && !s->lost[r])
        return on_attach(s, ev, err);
    if (dp_transport_skip_payload(s->t, r, err) < 0)
        return -1;
    hear(s, r);
    if (s->c->tasks[r].role != DP_ROLE_WORKER || s->live[r] || !s->lost[r])
        return 0;
    if (s->n_ready > 0 || s->go_pending >= 0) {
        s->joining[r] = 1;
        return 0;
    }
    admit_rejoin(s, r);
    return 0;
}

/* A restarted chief has heard from every worker, some running all along:
 * it evaluates from the first epoch one of them has not finished (those
 * before were evaluated by the chief that was lost, or finished while none
 * was there), and asks the loop for the newest checkpoint's state. */
static void reattach(dp_strategy *s, dp_coord_event *ev)
{
    int first = s->env->cfg->epochs + 1;
    long lo = -1, hi = 0;
    for (int w = 0; w < s->c->count[DP_ROLE_WORKER]; w++) {
        int r = dp_cluster_rank(s->c, DP_ROLE_WORKER, w), e = 1;
        if (s->lost[r])
            continue;
        while (e <= s->env->cfg->epochs && s->reported[(size_t)r * (s->env->cfg->epochs + 1) + e])
            e++;
        first = e < first ? e : first;
        lo = lo < 0 || s->progress[r] < lo ? s->progress[r] : lo;
        hi = s->progress[r] > hi ? s->progress[r] : hi;
    }
    if (first > s->next_eval) {
        dp_warn("Chief: epochs %d to %d finished before this chief was there; they are not "
                "evaluated again", s->next_eval, first - 1);
        s->next_eval = first;
    }
    dp_warn("fault: the chief re-attached to the running job: %d worker(s) running, at steps %ld "
            "to %ld, %d done", s->attached, lo, hi, s->done);
    dp_metrics_event(s->env->metrics, "fault", DP_F_STR, "task",
                     dp_transport_peer_name(s->t, s->chief), DP_F_STR, "what", "restarted",
                     DP_F_STR, "action", "re-attach", DP_F_INT, "step", lo, DP_F_END);
    s->attach_state = 1;
    ev->kind = DP_COORD_ATTACH;
}

/* The first live worker not at the checkpoint barrier that is past its
 * step: it went by while the chief was lost, so the barrier can never
 * close; -1 when none. */
static int passed_barrier(const dp_strategy *s)
{
    for (int r = 0; r < s->c->n_tasks; r++)
        if (s->live[r] && !s->ready[r] && s->progress[r] > s->ckpt_step)
            return r;
    return -1;
}

/* The workers at the checkpoint barrier of `step` go on, and the workers
 * that rejoined meanwhile are admitted. */
static int release_barrier(dp_strategy *s, long step, dp_err *err)
{
    for (int r = 0; r < s->c->n_tasks; r++)
        if (s->ready[r]) {
            s->ready[r] = 0;
            if (s->live[r] && send_to(s, r, DP_WIRE_CKPT_GO, (uint64_t)step, NULL, 0, err) < 0)
                return -1;
        }
    s->n_ready = 0;
    if (step > s->released)
        s->released = step;
    for (int r = 0; r < s->c->n_tasks; r++)
        if (s->joining[r])
            admit_rejoin(s, r);
    return 0;
}

/* A barrier that cannot close: its workers go on, writing nothing. */
static int skip_barrier(dp_strategy *s, int passed, dp_err *err)
{
    dp_warn("fault: the checkpoint at step %ld is not written: %s went past it while the chief "
            "was lost", s->ckpt_step, dp_transport_peer_name(s->t, passed));
    return release_barrier(s, s->ckpt_step, err);
}

/* A barrier a restarted chief holds before every worker re-attached: its
 * workers go on, writing nothing (docs/faults.md, "A lost chief"). */
static int skip_unattached(dp_strategy *s, dp_err *err)
{
    int r = 0;
    while (r < s->c->n_tasks && (s->c->tasks[r].role != DP_ROLE_WORKER || s->heard[r]))
        r++;
    dp_warn("fault: the checkpoint at step %ld is not written: %s has not re-attached to the "
            "restarted chief yet", s->ckpt_step,
            r < s->c->n_tasks ? dp_transport_peer_name(s->t, r) : "a worker");
    return release_barrier(s, s->ckpt_step, err);
}

/* --compress auto: every worker slot's choice into the checkpoint,
 * metadata strategy_state (ps_auto.h; "-" for a slot none chose in). */
static int auto_state(dp_strategy *s, dp_train_state *st, dp_err *err)
{
    int W = s->c->count[DP_ROLE_WORKER];
    size_t cap = 16 + 16 * (size_t)W;
    char *text = malloc(cap);
    if (!text)
        return dp_errf(err, "out of memory");
    dp_ps_auto_format(text, cap, s->auto_codes, W);
    free(st->scalars);
    st->scalars = text;
    return 0;
}

static int auto_from_newest(dp_strategy *s, const dp_train_state *st, dp_err *err)
{
    int W = s->c->count[DP_ROLE_WORKER];
    uint32_t *codes = calloc((size_t)W, sizeof *codes);
    if (!codes)
        return dp_errf(err, "out of memory");
    if (dp_ps_auto_parse(st->scalars, W, codes, "the newest checkpoint", err) < 0) {
        free(codes);
        return -1;
    }
    for (int w = 0; w < W; w++)
        if (s->auto_codes[w] == DP_PS_AUTO_UNSET)
            s->auto_codes[w] = codes[w];
    free(codes);
    return 0;
}

int dp_ps_family_next(dp_strategy *s, dp_coord_event *ev, dp_train_state *st, dp_err *err)
{
    const dp_train_config *cfg = s->env->cfg;
    memset(ev, 0, sizeof *ev);
    if (s->next_eval == 0) /* a resumed run evaluates from the epoch it resumed in */
        s->next_eval = s->env->resume
                           ? (int)(s->env->resume->step / s->env->steps_per_epoch) + 1
                           : 1;
    if (s->go_pending >= 0) {
        long step = s->go_pending;
        s->go_pending = -1;
        if (release_barrier(s, step, err) < 0)
            return -1;
    }
    if (s->attach_state == 1) {
        /* The loop took the newest checkpoint's evaluator state: its step,
         * and under --compress auto the choices of the slots no worker has
         * said its own to this chief yet (one lost while it was away). */
        if (st->step > s->last_ckpt)
            s->last_ckpt = st->step;
        s->attach_state = 2;
        if (s->auto_codes && st->step > 0 && auto_from_newest(s, st, err) < 0)
            return -1;
    }
    for (;;) {
        /* Nothing before every worker is heard of; then, for a restarted
         * chief, the attach; epochs every live worker has finished, in
         * order; a checkpoint every live worker has reached; the end. */
        int active = s->live_workers - s->done;
        if (s->unheard > 0) {
            /* A restarted chief with a worker at the barrier and another
             * not re-attached: that one may be past the barrier, and held
             * by the servers' clock bound until the first goes on, so the
             * barrier cannot wait for it.  A fresh chief (none attached)
             * waits: a worker it has not heard of yet, started late, has
             * passed no barrier (none opens without the chief's GO). */
            if (s->n_ready > 0 && s->attached > 0 && skip_unattached(s, err) < 0)
                return -1;
            goto wait;
        }
        if (s->attached > 0 && s->attach_state == 0) {
            reattach(s, ev);
            return 0;
        }
        if (s->n_ready > 0 && passed_barrier(s) >= 0) {
            if (skip_barrier(s, passed_barrier(s), err) < 0)
                return -1;
            continue;
        }
        if (s->next_eval <= cfg->epochs && s->live_workers > 0 &&
            s->tally[s->next_eval].reports >= expected_reports(s, s->next_eval)) {
            ev->kind = DP_COORD_EPOCH;
            ev->epoch = s->next_eval;
            ev->stats = s->tally[s->next_eval].sum;
            ev->step = ev->stats.steps;
            s->next_eval++;
            return 0;
        }
        if (s->n_ready > 0 && s->n_ready >= active) {
            if (dp_ps_client_pull_state(s->client, (uint64_t)s->ckpt_step, &cfg->optim, st->params,
                                        st->slots, st->ema, &st->optim_t, err) < 0)
                return -1;
            if (s->K) /* slice order to the model's layout */
                for (int k = -1; k <= st->n_slots; k++) {
                    float *v = k < 0 ? st->params
                                     : k < st->n_slots ? st->slots + (size_t)k * st->n_params
                                                       : st->ema;
                    if (v) {
                        memcpy(s->vec, v, st->n_params * sizeof(float));
                        mp_order_scatter(v, s->vec, s->plans, s->K);
                    }
                }
            st->step = s->ckpt_step;
            if (s->auto_codes && auto_state(s, st, err) < 0)
                return -1;
            ev->kind = DP_COORD_CHECKPOINT;
            ev->step = s->ckpt_step;
            s->go_pending = s->ckpt_step;
            s->last_ckpt = s->ckpt_step;
            return 0;
        }
        int awaited = 0; /* lost workers with a restart left: they may rejoin */
        for (int r = 0; r < s->c->n_tasks; r++)
            awaited += s->lost[r] && s->losses[r] <= s->restarts;
        if (active <= 0 && awaited == 0 && s->done == 0)
            return dp_errf(err, "every worker was lost and none finished: the run cannot go on "
                                "(downpour launch --max-restarts N restarts lost workers; "
                                "--resume continues from the newest checkpoint)");
        if (active <= 0 && awaited == 0) {
            if (s->next_eval <= cfg->epochs)
                dp_warn("%d worker(s) lost: epochs %d to %d were not evaluated",
                        s->c->count[DP_ROLE_WORKER] - s->live_workers, s->next_eval, cfg->epochs);
            ev->kind = DP_COORD_DONE;
            ev->step = s->steps;
            s->ended = 1;
            return 0;
        }
    wait:;
        dp_event e;
        if (dp_transport_poll(s->t, DP_PEER_ANY, WAIT_TIMEOUT, &e, err) < 0)
            return -1;
        if (e.kind == DP_EVENT_TIMEOUT)
            return dp_errf(err, "no word from any worker for %.0f s (epoch %d of %d unfinished)",
                           WAIT_TIMEOUT, s->next_eval, cfg->epochs);
        if (e.kind == DP_EVENT_PEER_LOST) {
            if (on_lost(s, &e, err) < 0)
                return -1;
            continue;
        }
        if (s->lost[e.peer] && e.header.type != DP_WIRE_JOIN) {
            /* The old incarnation of a dropped worker (frozen, then woken):
             * what it says counts for nothing; it finds itself cut off. */
            if (dp_transport_skip_payload(s->t, e.peer, err) < 0)
                return -1;
            continue;
        }
        int rc = 0;
        switch (e.header.type) {
        case DP_WIRE_EPOCH:
            rc = on_epoch_report(s, &e, err);
            break;
        case DP_WIRE_CKPT_READY:
            rc = hear_auto(s, &e, err) < 0 ? -1 : on_ready(s, &e, st, err);
            break;
        case DP_WIRE_BUFFERS:
            rc = on_buffers(s, &e, err);
            break;
        case DP_WIRE_JOIN:
            rc = on_join(s, &e, err);
            break;
        case DP_WIRE_PROGRESS:
            rc = hear_auto(s, &e, err) < 0 ? -1 : dp_transport_skip_payload(s->t, e.peer, err);
            if ((long)e.header.step > s->progress[e.peer])
                s->progress[e.peer] = (long)e.header.step;
            break;
        case DP_WIRE_DONE:
            /* A worker reports every epoch before it says DONE (one ordered
             * connection), so it still counts for the epochs not evaluated yet. */
            rc = dp_transport_skip_payload(s->t, e.peer, err);
            s->steps += (long)e.header.step;
            if (s->live[e.peer]) {
                s->live[e.peer] = 0;
                s->done++;
            }
            break;
        default:
            dp_warn("ignoring frame type %u from %s", e.header.type,
                    dp_transport_peer_name(s->t, e.peer));
            rc = dp_transport_skip_payload(s->t, e.peer, err);
        }
        if (rc < 0)
            return -1;
    }
}

/* The chief with compact tables: a chunk's rows into the weights
 * dp_ps_family_params pulled, its ids into slots (docs/strategies.md,
 * "Tables larger than a worker"). */
const float *dp_ps_family_eval_rows(dp_strategy *s, const float *x, int n, dp_err *err)
{
    if (!s->cx)
        return x; /* the tables whole: pulled with the weights */
    if (n > s->m->max_batch) {
        dp_errf(err, "an evaluation chunk of %d records; the model holds %d", n,
                s->m->max_batch);
        return NULL;
    }
    if (pull_rows(s, x, n, err) < 0)
        return NULL;
    return slot_batch(s, x, n);
}

int dp_ps_family_table_rows(dp_strategy *s, int part, int k, float *buf, size_t n,
                            dp_err *err)
{
    if (k < 0)
        return dp_ps_client_tables_end(s->client, err);
    return dp_ps_client_tables_read(s->client, part, k, buf, n, err);
}

const float *dp_ps_family_params(dp_strategy *s, dp_weights which, dp_err *err)
{
    if (dp_ps_client_pull(s->client, s->K ? s->vec : s->m->params, which == DP_WEIGHTS_AVERAGE,
                          err) < 0)
        return NULL;
    if (s->K) /* the shards hold slice order */
        mp_order_scatter(s->m->params, s->vec, s->plans, s->K);
    return s->m->params;
}
