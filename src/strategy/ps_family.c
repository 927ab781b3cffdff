/* The parameter-server strategies' machinery: see ps_family.h. */
#include "strategy/ps_family.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/launcher.h"
#include "downpour/log.h"
#include "downpour/wire.h"

#define WAIT_TIMEOUT 600.0    /* s the chief or a worker waits for a peer */
#define PROGRESS_PER_EPOCH 16 /* PROGRESS frames a worker sends an epoch: a restart redoes 1/16 at most */
#define EPOCH_REPORT_SIZE 40  /* f64 loss_sum, f64 records, f64 correct, f64 seconds, u64 steps */

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
    long go_pending;       /* a checkpoint written, its workers not yet released; -1 */
    long steps;            /* every worker's steps, from their DONE */
};

static int send_to(dp_strategy *s, int rank, unsigned type, uint64_t step, const void *p,
                   size_t len, dp_err *err)
{
    return dp_transport_send(s->t, rank, type, step, 0, p, len, err);
}

void dp_ps_family_close(dp_strategy *s)
{
    if (!s)
        return;
    if (s->part == DP_PART_COORDINATOR)
        /* The servers stop with the chief, whatever happened. */
        for (int i = 0; i < s->c->count[DP_ROLE_PS]; i++) {
            dp_err ignore;
            send_to(s, dp_cluster_rank(s->c, DP_ROLE_PS, i), DP_WIRE_SHUTDOWN, 0, NULL, 0,
                    &ignore);
        }
    dp_ps_client_free(s->client);
    free(s->tally);
    free(s->live);
    free(s->ready);
    free(s->lost);
    free(s->from_epoch);
    free(s->joining);
    free(s->losses);
    free(s->progress);
    free(s);
}

#define ONLY_DEALS 0u /* from_chief's type when nothing else may come */

/* A DEAL from the chief: this worker's data shard from its next epoch. */
static int take_deal(dp_strategy *s, const dp_event *ev, dp_err *err)
{
    uint8_t p[8];
    if (ev->header.length != sizeof p)
        return dp_errf(err, "the chief sent a %llu-byte DEAL; expected 8",
                       (unsigned long long)ev->header.length);
    if (dp_transport_recv_payload(s->t, s->chief, p, sizeof p, err) < 0)
        return -1;
    uint32_t index = dp_get_u32(p), count = dp_get_u32(p + 4);
    if (count < 1 || index >= count || count > (uint32_t)s->c->count[DP_ROLE_WORKER])
        return dp_errf(err, "the chief dealt shard %u of %u", index, count);
    s->deal_index = (int)index;
    s->deal_count = (int)count;
    return 0;
}

/* The next frame from the chief of the given type; DEALs on the way are
 * taken in passing.  timeout 0: only what has arrived (returns 0 when
 * nothing of that type has). */
static int from_chief(dp_strategy *s, unsigned type, const char *what, double timeout,
                      dp_event *ev, dp_err *err)
{
    for (;;) {
        if (timeout > 0) {
            if (dp_transport_recv(s->t, s->chief, what, timeout, ev, err) < 0)
                return -1;
        } else {
            if (dp_transport_poll(s->t, s->chief, 0, ev, err) < 0)
                return -1;
            if (ev->kind == DP_EVENT_TIMEOUT)
                return 0;
            if (ev->kind == DP_EVENT_PEER_LOST)
                return dp_errf(err, "lost the chief %s (%s)",
                               dp_transport_peer_name(s->t, s->chief), ev->reason);
        }
        if (ev->header.type == DP_WIRE_DEAL) {
            if (take_deal(s, ev, err) < 0)
                return -1;
            continue;
        }
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
    if (send_to(s, s->chief, DP_WIRE_JOIN, 0, NULL, 0, err) < 0 ||
        from_chief(s, DP_WIRE_START, "the start signal", WAIT_TIMEOUT, &ev, err) < 0)
        return -1;
    if (ev.header.offset != 1)
        return dp_transport_skip_payload(s->t, s->chief, err);
    if (take_deal(s, &ev, err) < 0)
        return -1;
    info->start_step = (long)ev.header.step;
    for (int i = 0; i < s->layout.n_shards; i++)
        if (send_to(s, s->layout.rank[i], DP_WIRE_JOIN, 0, NULL, 0, err) < 0)
            return -1;
    if (dp_ps_client_pull(s->client, s->m->params, 0, err) < 0)
        return -1;
    dp_info("Worker %d: rejoined the run at step %ld", s->worker, info->start_step);
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
    if (!s->tally || !s->live || !s->ready || !s->lost || !s->from_epoch || !s->joining ||
        !s->losses || !s->progress)
        return dp_errf(err, "out of memory");
    const char *restarts = getenv(DP_LAUNCH_RESTARTS_ENV);
    s->restarts = restarts ? atoi(restarts) : 0;
    s->last_ckpt = s->env->resume ? s->env->resume->step : 0;
    for (int r = 0; r < n; r++)
        s->progress[r] = s->last_ckpt;
    int workers = s->c->count[DP_ROLE_WORKER];
    dp_info("Chief: %s on %d worker(s) and %d ps task(s), batch %d per worker (global %d); "
            "%d shard(s):", s->env->cfg->strategy, workers, s->c->count[DP_ROLE_PS], cfg->batch,
            cfg->batch * workers, s->layout.n_shards);
    for (int i = 0; i < s->layout.n_shards; i++)
        dp_info("  shard %d: parameters [%zu, %zu) (%.1f KiB) on %s", i, s->layout.range[i].lo,
                s->layout.range[i].hi,
                (s->layout.range[i].hi - s->layout.range[i].lo) * 4 / 1024.0,
                dp_transport_peer_name(s->t, s->layout.rank[i]));
    s->live_workers = workers;
    s->go_pending = -1;
    s->next_eval = 0; /* the first next() sets it: steps per epoch are not known yet */
    for (int w = 0; w < workers; w++) {
        int rank = dp_cluster_rank(s->c, DP_ROLE_WORKER, w);
        s->live[rank] = 1;
        s->from_epoch[rank] = 1;
        if (send_to(s, rank, DP_WIRE_START, 0, NULL, 0, err) < 0)
            return -1;
    }
    return 0;
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
    dp_strategy *s = calloc(1, sizeof *s);
    if (!s)
        return dp_errf(err, "out of memory");
    s->env = env;
    s->m = env->model;
    s->t = env->node->transport;
    s->c = c;
    s->pc = cfg->ps;
    s->pc.mode = mode;
    s->pc.ema = cfg->ema;
    s->chief = dp_cluster_rank(c, DP_ROLE_CHIEF, 0);
    dp_role role = env->node->self->role;
    s->part = role == DP_ROLE_PS      ? DP_PART_SERVER
              : role == DP_ROLE_CHIEF ? DP_PART_COORDINATOR
                                      : DP_PART_TRAINER;
    if (dp_ps_layout_make(&s->layout, c, s->m->n_params, &s->pc, err) < 0)
        goto fail;
    info->part = s->part;
    info->evaluator = role == DP_ROLE_CHIEF;
    info->live_params = 0;
    info->replicas = c->count[DP_ROLE_WORKER];
    info->shard_count = c->count[DP_ROLE_WORKER];
    info->worker_optimizers = mode == DP_PS_AVG ? c->count[DP_ROLE_WORKER] : 0;
    if (s->part == DP_PART_SERVER) {
        *out = s;
        return 0;
    }
    if (dp_ps_client_open(&s->client, s->t, &s->layout, &s->pc, &cfg->optim, s->m->n_params,
                          err) < 0)
        goto fail;
    if (s->part == DP_PART_COORDINATOR) {
        snprintf(info->label, sizeof info->label, "Chief");
        if (open_chief(s, err) < 0)
            goto fail;
    } else {
        s->worker = env->node->self->index;
        info->shard_index = s->worker;
        s->deal_index = s->worker;
        s->deal_count = c->count[DP_ROLE_WORKER];
        snprintf(info->label, sizeof info->label, "Worker %d", s->worker);
        dp_optim *local = dp_ps_client_local_optim(s->client);
        if (local && env->resume) {
            size_t n = s->m->n_params * (size_t)dp_optim_slots(local->cfg.kind);
            if (n)
                memcpy(local->state, env->resume->worker_slots + (size_t)s->worker * n,
                       n * sizeof(float));
            local->t = env->resume->worker_t[s->worker];
        }
        if (await_start(s, info, err) < 0)
            goto fail;
    }
    *out = s;
    return 0;
fail:
    s->part = DP_PART_TRAINER; /* nothing to shut down yet */
    dp_ps_family_close(s);
    return -1;
}

int dp_ps_family_serve(dp_strategy *s, dp_err *err)
{
    const dp_train_state *r = s->env->resume;
    dp_ps_start start = {.params = s->m->params};
    if (r) {
        start.slots = r->slots;
        start.t = r->optim_t;
        start.ema = r->ema;
    }
    return dp_ps_serve(s->t, s->c, &s->layout, &s->pc, &s->env->cfg->optim, &start,
                       s->m->n_params, err);
}

/* ------------------------------------------------------------ workers */

static int update(void *self, float *params, const float *grads, int records, float lr,
                  dp_err *err)
{
    dp_strategy *s = self;
    return dp_ps_client_step(s->client, params, grads, records, lr, err);
}

static const dp_grad_ops grad_ops = {.update = update};

int dp_ps_family_step(dp_strategy *s, const float *x, const uint8_t *y, int n, float lr,
                      long step, dp_step_out *out, dp_err *err)
{
    int rc = dp_data_parallel_step(s->m, &grad_ops, s, x, y, n, lr, step, out, err);
    out->clock_gap = dp_ps_client_max_gap(s->client);
    /* A few times an epoch the chief hears how far this worker got: a
     * restarted worker goes on from there, not from its epoch's start. */
    long every = s->env->steps_per_epoch / PROGRESS_PER_EPOCH;
    if (rc == 0 && step % (every > 0 ? every : 1) == 0)
        rc = send_to(s, s->chief, DP_WIRE_PROGRESS, (uint64_t)step, NULL, 0, err);
    return rc;
}

int dp_ps_family_deal(dp_strategy *s, int epoch, int *index, int *count, dp_err *err)
{
    (void)epoch;
    dp_event ev;
    if (from_chief(s, ONLY_DEALS, "nothing but deals", 0, &ev, err) < 0)
        return -1;
    *index = s->deal_index;
    *count = s->deal_count;
    return 0;
}

int dp_ps_family_epoch_end(dp_strategy *s, int epoch, dp_epoch_stats *st, dp_err *err)
{
    uint8_t p[EPOCH_REPORT_SIZE];
    dp_put_f64(p, st->loss_sum);
    dp_put_f64(p + 8, st->records);
    dp_put_f64(p + 16, st->correct);
    dp_put_f64(p + 24, st->seconds);
    dp_put_u64(p + 32, (uint64_t)st->steps);
    return send_to(s, s->chief, DP_WIRE_EPOCH, (uint64_t)epoch, p, sizeof p, err);
}

/* The checkpoint barrier, a worker's side: everything this worker pushed is
 * applied, it hands in its own state (model-avg: its optimiser) and waits
 * until the chief has written the checkpoint. */
int dp_ps_family_save(dp_strategy *s, long step, dp_train_state *st, dp_err *err)
{
    (void)st;
    if (dp_ps_client_sync(s->client, s->m->params, err) < 0)
        return -1;
    dp_optim *local = dp_ps_client_local_optim(s->client);
    uint8_t head[8];
    struct iovec iov[2] = {{head, sizeof head}, {NULL, 0}};
    int iovcnt = 0;
    if (local) {
        dp_put_u64(head, (uint64_t)local->t);
        iov[1].iov_base = local->state;
        iov[1].iov_len = local->n * (size_t)dp_optim_slots(local->cfg.kind) * sizeof(float);
        iovcnt = 2;
    }
    if (dp_transport_sendv(s->t, s->chief, DP_WIRE_CKPT_READY, (uint64_t)step, 0, iov, iovcnt,
                           err) < 0)
        return -1;
    dp_event ev;
    if (from_chief(s, DP_WIRE_CKPT_GO, "the checkpoint to be written", WAIT_TIMEOUT, &ev,
                   err) < 0)
        return -1;
    if (ev.header.step != (uint64_t)step)
        return dp_errf(err, "expected the chief's go-ahead after checkpoint %ld, got frame type "
                            "%u for step %llu", step, ev.header.type,
                       (unsigned long long)ev.header.step);
    return dp_transport_skip_payload(s->t, s->chief, err) < 0 ? -1 : 0;
}

int dp_ps_family_finish(dp_strategy *s, long steps, dp_err *err)
{
    if (dp_ps_client_flush(s->client, s->m->params, err) < 0)
        return -1;
    dp_info("Worker %d: done after %ld steps; largest clock gap allowed: %ld", s->worker, steps,
            dp_ps_client_max_gap(s->client));
    for (int i = 0; i < s->layout.n_shards; i++)
        if (send_to(s, s->layout.rank[i], DP_WIRE_DONE, (uint64_t)steps, NULL, 0, err) < 0)
            return -1;
    return send_to(s, s->chief, DP_WIRE_DONE, (uint64_t)steps, NULL, 0, err);
}

/* ------------------------------------------------------------ the chief */

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
    epoch_tally *t = &s->tally[e];
    t->reports++;
    if ((long)e * s->env->steps_per_epoch > s->progress[ev->peer])
        s->progress[ev->peer] = (long)e * s->env->steps_per_epoch;
    t->sum.loss_sum += dp_get_f64(p);
    t->sum.records += dp_get_f64(p + 8);
    t->sum.correct += dp_get_f64(p + 16);
    t->sum.steps += (long)dp_get_u64(p + 32);
    return 0;
}

static int on_ready(dp_strategy *s, const dp_event *ev, dp_train_state *st, dp_err *err)
{
    const char *who = dp_transport_peer_name(s->t, ev->peer);
    long step = (long)ev->header.step;
    int w = s->c->tasks[ev->peer].role == DP_ROLE_WORKER ? s->c->tasks[ev->peer].index : -1;
    if (w < 0 || !s->live[ev->peer] || s->ready[ev->peer])
        return dp_errf(err, "%s reached a checkpoint it should not (step %ld)", who, step);
    if (s->n_ready > 0 && step != s->ckpt_step)
        return dp_errf(err, "%s is at checkpoint step %ld, the others at %ld", who, step,
                       s->ckpt_step);
    size_t want = 0, per = 0;
    if (st->n_workers > 0) {
        per = (size_t)st->n_slots * st->n_params;
        want = 8 + per * sizeof(float);
    }
    if (ev->header.length != want)
        return dp_errf(err, "%s handed in %llu bytes of state at checkpoint %ld; expected %zu", who,
                       (unsigned long long)ev->header.length, step, want);
    if (want) {
        uint8_t head[8];
        if (dp_transport_recv_payload(s->t, ev->peer, head, sizeof head, err) < 0 ||
            dp_transport_recv_payload(s->t, ev->peer, st->worker_slots + (size_t)w * per,
                                      per * sizeof(float), err) < 0)
            return -1;
        st->worker_t[w] = (long)dp_get_u64(head);
    }
    s->ready[ev->peer] = 1;
    s->n_ready++;
    s->ckpt_step = step;
    return 0;
}

static void deal_all(dp_strategy *s, int joiner, long step);

/* Every mode goes on without a lost worker: the servers release whoever
 * waited for it, and the run is evaluated on the survivors' reports. */
static int on_lost(dp_strategy *s, const dp_event *ev, dp_err *err)
{
    const char *who = dp_transport_peer_name(s->t, ev->peer);
    s->joining[ev->peer] = 0;
    if (!s->live[ev->peer] && s->c->tasks[ev->peer].role != DP_ROLE_PS)
        return 0;
    if (s->c->tasks[ev->peer].role == DP_ROLE_PS)
        return dp_errf(err, "lost %s (%s): its shard of the parameters is gone", who, ev->reason);
    s->live_workers--;
    s->live[ev->peer] = 0;
    s->lost[ev->peer] = 1;
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
        deal_all(s, -1, 0);
    if (s->ready[ev->peer]) {
        s->ready[ev->peer] = 0;
        s->n_ready--;
    }
    return 0;
}

/* Deals the data among the workers not lost, in worker order: a
 * DEAL to each, and to a rejoining worker (rank `joiner`) its START at
 * `step` with its deal.  A worker that cannot be told is on its way out:
 * its loss arrives as an event. */
static void deal_all(dp_strategy *s, int joiner, long step)
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
            dp_transport_send(s->t, r, DP_WIRE_START, (uint64_t)step, 1, p, sizeof p, &ignore);
        else
            send_to(s, r, DP_WIRE_DEAL, 0, p, sizeof p, &ignore);
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
    if (step < s->last_ckpt)
        step = s->last_ckpt;
    int ckpt_there = cfg->checkpoint_dir &&
                     (step == total || (cfg->checkpoint_every > 0 && step % cfg->checkpoint_every == 0));
    if (step > s->last_ckpt && ckpt_there)
        step--;
    s->joining[r] = 0;
    s->lost[r] = 0;
    s->live[r] = 1;
    s->live_workers++;
    s->from_epoch[r] = (int)(step / spe) + 1;
    const char *who = dp_transport_peer_name(s->t, r);
    dp_warn("fault: %s rejoined; it starts at step %ld (epoch %d) and the run goes on with %d "
            "worker(s)", who, step, s->from_epoch[r], s->live_workers - s->done);
    dp_metrics_event(s->env->metrics, "fault", DP_F_STR, "task", who, DP_F_STR, "what",
                     "restarted", DP_F_STR, "action", "rejoin", DP_F_INT, "step", step, DP_F_END);
    deal_all(s, r, step);
}

/* JOIN: the first incarnation's is a no-op; a restarted worker's is admitted
 * at once, or after the checkpoint barrier in progress. */
static int on_join(dp_strategy *s, int r, dp_err *err)
{
    if (dp_transport_skip_payload(s->t, r, err) < 0)
        return -1;
    if (s->c->tasks[r].role != DP_ROLE_WORKER || s->live[r] || !s->lost[r])
        return 0;
    if (s->n_ready > 0 || s->go_pending >= 0) {
        s->joining[r] = 1;
        return 0;
    }
    admit_rejoin(s, r);
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
        for (int r = 0; r < s->c->n_tasks; r++)
            if (s->ready[r]) {
                s->ready[r] = 0;
                if (s->live[r] &&
                    send_to(s, r, DP_WIRE_CKPT_GO, (uint64_t)s->go_pending, NULL, 0, err) < 0)
                    return -1;
            }
        s->n_ready = 0;
        s->go_pending = -1;
        for (int r = 0; r < s->c->n_tasks; r++)
            if (s->joining[r])
                admit_rejoin(s, r);
    }
    for (;;) {
        /* Epochs every live worker has finished, in order; then a
         * checkpoint every live worker has reached; then the end. */
        int active = s->live_workers - s->done;
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
            st->step = s->ckpt_step;
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
            return 0;
        }
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
            rc = on_ready(s, &e, st, err);
            break;
        case DP_WIRE_JOIN:
            rc = on_join(s, e.peer, err);
            break;
        case DP_WIRE_PROGRESS:
            rc = dp_transport_skip_payload(s->t, e.peer, err);
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

const float *dp_ps_family_params(dp_strategy *s, dp_weights which, dp_err *err)
{
    if (dp_ps_client_pull(s->client, s->m->params, which == DP_WEIGHTS_AVERAGE, err) < 0)
        return NULL;
    return s->m->params;
}
