/* The parameter-server strategies' machinery: see ps_family.h. */
#include "strategy/ps_family.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/log.h"
#include "downpour/wire.h"

#define WAIT_TIMEOUT 600.0    /* s the chief or a worker waits for a peer */
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
    /* the chief */
    epoch_tally *tally;    /* [1..epochs] */
    int *live, *ready;     /* per rank: a worker not lost nor done; at the checkpoint barrier */
    int live_workers, done, next_eval, n_ready;
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
    free(s);
}

/* A worker waits for the chief's START, so every clock starts together. */
static int await_start(dp_strategy *s, dp_err *err)
{
    dp_event ev;
    if (dp_transport_recv(s->t, s->chief, "the start signal", WAIT_TIMEOUT, &ev, err) < 0)
        return -1;
    if (ev.header.type != DP_WIRE_START)
        return dp_errf(err, "expected START from the chief, got frame type %u", ev.header.type);
    return dp_transport_skip_payload(s->t, s->chief, err);
}

static int open_chief(dp_strategy *s, dp_err *err)
{
    const dp_train_config *cfg = s->env->cfg;
    int n = s->c->n_tasks;
    s->tally = calloc((size_t)cfg->epochs + 2, sizeof *s->tally);
    s->live = calloc((size_t)n, sizeof *s->live);
    s->ready = calloc((size_t)n, sizeof *s->ready);
    if (!s->tally || !s->live || !s->ready)
        return dp_errf(err, "out of memory");
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
        snprintf(info->label, sizeof info->label, "Worker %d", s->worker);
        dp_optim *local = dp_ps_client_local_optim(s->client);
        if (local && env->resume) {
            size_t n = s->m->n_params * (size_t)dp_optim_slots(local->cfg.kind);
            if (n)
                memcpy(local->state, env->resume->worker_slots + (size_t)s->worker * n,
                       n * sizeof(float));
            local->t = env->resume->worker_t[s->worker];
        }
        if (await_start(s, err) < 0)
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
    return rc;
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
    if (dp_transport_recv(s->t, s->chief, "the checkpoint to be written", WAIT_TIMEOUT, &ev,
                          err) < 0)
        return -1;
    if (ev.header.type != DP_WIRE_CKPT_GO || ev.header.step != (uint64_t)step)
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

static int on_lost(dp_strategy *s, const dp_event *ev, dp_err *err)
{
    const char *who = dp_transport_peer_name(s->t, ev->peer);
    if (!s->live[ev->peer] && s->c->tasks[ev->peer].role != DP_ROLE_PS)
        return 0;
    if (s->c->tasks[ev->peer].role == DP_ROLE_PS)
        return dp_errf(err, "lost %s (%s): its shard of the parameters is gone", who, ev->reason);
    if (!dp_ps_mode_survives_loss(s->pc.mode))
        return dp_errf(err, "lost %s (%s): a synchronous run cannot go on without it", who,
                       ev->reason);
    s->live_workers--;
    dp_warn("lost %s (%s); the run goes on with %d worker(s)", who, ev->reason, s->live_workers);
    s->live[ev->peer] = 0;
    if (s->ready[ev->peer]) {
        s->ready[ev->peer] = 0;
        s->n_ready--;
    }
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
    }
    for (;;) {
        /* Epochs every live worker has finished, in order; then a
         * checkpoint every live worker has reached; then the end. */
        int active = s->live_workers - s->done;
        if (s->next_eval <= cfg->epochs && s->live_workers > 0 &&
            s->tally[s->next_eval].reports >= s->live_workers) {
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
            return 0;
        }
        if (active <= 0) {
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
        int rc = 0;
        switch (e.header.type) {
        case DP_WIRE_EPOCH:
            rc = on_epoch_report(s, &e, err);
            break;
        case DP_WIRE_CKPT_READY:
            rc = on_ready(s, &e, st, err);
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
