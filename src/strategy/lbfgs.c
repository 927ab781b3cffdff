/* lbfgs: Sandblaster L-BFGS (DistBelief; docs/strategies.md, "lbfgs").
 *
 * The chief is the COORDINATOR and holds no parameter vector: it runs the
 * L-BFGS driver (lbfgs.h) with a backend whose vectors live sharded on the
 * ps tasks (lbfgs_shard.c).  Each vector op is one frame to every shard;
 * only dot products' partial sums come back, and the chief adds them.  The
 * ops that answer nothing are not waited for: frames to a shard keep their
 * order, so a dot product's answer comes after every op before it.
 *
 * An evaluation (the objective and its gradient at x or at a trial point of
 * the line search) is the mean loss over the iteration's batch (--batch
 * records of the training split), cut into portions of --portion records.
 * The chief hands portions to workers as they free up, one at a time; a
 * worker pulls the point from the shards (once an evaluation), computes the
 * portion's mean gradient and loss, pushes the gradient's slices to the
 * shards and reports the loss to the chief.  When no portion is left to
 * hand out, an idle worker gets a second copy of one still outstanding
 * (a backup task): the first result wins, and the shards accumulate each
 * portion once whichever copy reaches them first (both copies are the same
 * numbers), so one slow worker does not hold the batch and no portion
 * counts twice; each shard says how many portions it accumulated and the
 * chief checks it.
 *
 * An iteration is one L-BFGS step on one batch; batch j of an epoch is the
 * records [j B, (j+1) B) of the split, so an epoch (ceil(n / B) iterations)
 * covers the split once; with B >= n every iteration sees the whole split.
 * When the batch changes, f and g are evaluated again at x on the new one
 * and the history is kept (pairs come from one batch each).
 *
 * Workers are TRAINERs whose step() answers portions until the chief says
 * the iteration is over; they read records themselves, not the loop's
 * batches (info->no_batches). */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "downpour/clock.h"
#include "downpour/lbfgs.h"
#include "downpour/log.h"
#include "downpour/partition.h"
#include "downpour/ps.h"
#include "downpour/strategy.h"
#include "downpour/wire.h"
#include "strategy/lbfgs_impl.h"
#include "strategy/ps_family.h"

#define BACKUP_COPIES 2 /* live copies of an outstanding portion at most */

typedef struct portion {
    int done;
    int holders; /* live workers computing it now */
} portion;

struct dp_strategy {
    const dp_run_env *env;
    const dp_train_config *cfg;
    dp_model *m;
    dp_transport *t;
    const dp_cluster *c;
    dp_part part;
    dp_ps_layout layout;
    int chief;            /* the chief's rank */
    int n_workers;
    int vectors;
    uint32_t portion;     /* records a portion */
    uint32_t max_portions;
    double timeout;
    /* chief */
    dp_lbfgs lb;
    float *params;        /* x pulled from the shards, for evaluation */
    uint64_t op_seq, eval_seq;
    uint32_t batch_lo, batch_n;
    long batch_index;     /* the batch the history's f and g are on (-1: none) */
    portion *por;
    int *busy;            /* per worker: the portion it computes, -1 idle, -2 lost */
    int live;
    int done_count;
    double loss_sum, correct;
    long iter, portions_run, backups, duplicates, evals_run;
    double eval_seconds;
    int stalled;
    int shut;             /* the shards were told SHUTDOWN */
    dp_epoch_stats ep;    /* the epoch under way's figures so far */
    double ep_t0;         /* when it started (0: not yet) */
    int ckpt_pending;     /* a checkpoint of the step just evaluated is due */
    /* worker */
    int index;
    long have_eval;       /* m->params hold this evaluation's point (0: none) */
    float *x;             /* a portion's records */
    uint8_t *y;
    uint32_t *idx;
    /* ps */
    lb_shard shard;
    int has_shard;
};

static const char *peer_name(const dp_strategy *s, int rank)
{
    return dp_transport_peer_name(s->t, rank);
}

static int worker_of(const dp_strategy *s, int rank)
{
    const dp_task *k = &s->c->tasks[rank];
    return k->role == DP_ROLE_WORKER ? k->index : -1;
}

/* ---------------------------------------------------------------- chief */

static int shard_lost(dp_strategy *s, int rank, const char *why, dp_err *err)
{
    const char *dir = s->cfg->checkpoint_dir;
    return dp_errf(err, "lost %s (%s): its shard of x, the gradient and the L-BFGS history is "
                        "gone, so the run stops%s%s%s",
                   peer_name(s, rank), why, dir ? "; --resume goes on from the newest "
                                                  "checkpoint in " : "",
                   dir ? dir : "", dir ? " (with any number of ps tasks)" : "");
}

/* A result from a worker: frees it; counts the first copy of a portion of
 * the evaluation under way. */
static int take_result(dp_strategy *s, int rank, const dp_event *ev, dp_err *err)
{
    int w = worker_of(s, rank);
    if (w < 0 || ev->header.length != LB_RESULT_BYTES)
        return dp_errf(err, "%s sent a portion result of %llu bytes (want %d)",
                       peer_name(s, rank), (unsigned long long)ev->header.length,
                       LB_RESULT_BYTES);
    uint8_t b[LB_RESULT_BYTES];
    if (dp_transport_recv_payload(s->t, rank, b, sizeof b, err) < 0)
        return 0; /* its loss comes as the next event */
    uint64_t e = ev->header.step, p = ev->header.offset;
    if (s->busy[w] >= 0 && e == s->eval_seq && p < s->max_portions)
        s->por[p].holders--;
    if (s->busy[w] != -2)
        s->busy[w] = -1;
    uint32_t records = dp_get_u32(b + 12);
    if (e != s->eval_seq || p >= s->max_portions || s->por[p].done || records == 0) {
        s->duplicates += records > 0;
        return 0;
    }
    s->por[p].done = 1;
    s->done_count++;
    s->loss_sum += dp_get_f64(b);
    s->correct += dp_get_u32(b + 8);
    return 0;
}

/* Worker `rank` is gone: its portion goes back to the others.  `left`: it
 * said BYE first, a drained worker (docs/faults.md, "Draining"), no fault. */
static int worker_lost(dp_strategy *s, int rank, const char *why, int left, dp_err *err)
{
    int w = worker_of(s, rank);
    if (w < 0 || s->busy[w] == -2)
        return 0;
    if (s->busy[w] >= 0 && (uint32_t)s->busy[w] < s->max_portions)
        s->por[s->busy[w]].holders--;
    s->busy[w] = -2;
    s->live--;
    if (left && s->live > 0 && s->iter < s->env->steps_per_epoch * s->cfg->epochs) {
        dp_info("%s drained at iteration %ld; lbfgs hands its portions to the %d other "
                "worker(s)", peer_name(s, rank), s->iter + 1, s->live);
        dp_metrics_event(s->env->metrics, "drain", DP_F_STR, "task", peer_name(s, rank),
                         DP_F_STR, "action", "drain", DP_F_INT, "step", s->iter + 1, DP_F_INT,
                         "workers", (long)s->live, DP_F_END);
    } else if (s->live > 0 && s->iter < s->env->steps_per_epoch * s->cfg->epochs) {
        /* one fault line and event (docs/faults.md, "Who decides") */
        dp_warn("fault: lost %s (%s); lbfgs hands its portions to the %d other worker(s)",
                peer_name(s, rank), why, s->live);
        dp_metrics_event(s->env->metrics, "fault", DP_F_STR, "task", peer_name(s, rank),
                         DP_F_STR, "what", why, DP_F_STR, "action", "continue", DP_F_END);
    }
    if (s->live == 0 && s->iter < s->env->steps_per_epoch * s->cfg->epochs)
        return dp_errf(err, "every worker is lost (the last, %s: %s): nobody is left to "
                            "compute gradients", peer_name(s, rank), why);
    return 0;
}

/* Handles one event.  Returns 1 when it is the frame `type` from `rank`
 * (DP_PEER_ANY: from any ps task; type 0: none), left unread for the
 * caller; 0 when it was handled here; -1 on error. */
static int pump(dp_strategy *s, int rank, unsigned type, const char *what, dp_event *ev,
                dp_err *err)
{
    double end = dp_now() + s->timeout;
    for (;;) {
        if (dp_transport_poll(s->t, DP_PEER_ANY, 1.0, ev, err) < 0)
            return -1;
        if (ev->kind == DP_EVENT_TIMEOUT) {
            if (dp_now() > end)
                return dp_errf(err, "waiting for %s (%s): nothing came for %.0f s",
                               rank >= 0 ? peer_name(s, rank) : "the shards or workers", what,
                               s->timeout);
            continue;
        }
        const dp_task *k = &s->c->tasks[ev->peer];
        if (ev->kind == DP_EVENT_PEER_LOST) {
            if (k->role == DP_ROLE_PS) {
                for (int i = 0; i < s->layout.n_shards; i++)
                    if (s->layout.rank[i] == ev->peer && !s->shut)
                        return shard_lost(s, ev->peer, ev->reason, err);
                continue;
            }
            if (worker_lost(s, ev->peer, ev->reason, ev->orderly, err) < 0)
                return -1;
            return 0;
        }
        if ((rank == DP_PEER_ANY ? k->role == DP_ROLE_PS : ev->peer == rank) &&
            ev->header.type == type && type != 0)
            return 1;
        if (k->role == DP_ROLE_WORKER && ev->header.type == DP_WIRE_LB_RESULT)
            return take_result(s, ev->peer, ev, err) < 0 ? -1 : 0;
        return dp_errf(err, "%s sent frame type %u (%llu bytes) while the chief waited for %s",
                       peer_name(s, ev->peer), ev->header.type,
                       (unsigned long long)ev->header.length, what);
    }
}

/* Waits for the frame `type` from `rank`, handling the others. */
static int await(dp_strategy *s, int rank, unsigned type, const char *what, dp_event *ev,
                 dp_err *err)
{
    int rc;
    while ((rc = pump(s, rank, type, what, ev, err)) == 0)
        ;
    return rc < 0 ? -1 : 0;
}

static int send_op(dp_strategy *s, const lb_op *op, dp_err *err)
{
    uint8_t b[LB_OP_BYTES];
    lb_op_put(b, op);
    s->op_seq++;
    for (int i = 0; i < s->layout.n_shards; i++)
        if (dp_transport_send(s->t, s->layout.rank[i], DP_WIRE_LB_OP, s->op_seq, 0, b, sizeof b,
                              err) < 0)
            return shard_lost(s, s->layout.rank[i], err->msg, err);
    return 0;
}

/* Every shard's answer to the last op: n values, summed. */
static int gather(dp_strategy *s, uint32_t n, double *out, const char *what, dp_err *err)
{
    for (uint32_t k = 0; k < n; k++)
        out[k] = 0;
    for (int i = 0; i < s->layout.n_shards; i++) {
        dp_event ev;
        if (await(s, DP_PEER_ANY, DP_WIRE_LB_DOTS, what, &ev, err) < 0)
            return -1;
        int r = ev.peer;
        uint8_t b[4 + 8 * LB_MAX_PAIRS];
        if (ev.header.step != s->op_seq || ev.header.length != 4 + 8 * (uint64_t)n)
            return dp_errf(err, "%s answered op %llu with %llu bytes; op %llu wants %u values",
                           peer_name(s, r), (unsigned long long)ev.header.step,
                           (unsigned long long)ev.header.length, (unsigned long long)s->op_seq,
                           n);
        if (dp_transport_recv_payload(s->t, r, b, 4 + 8 * (size_t)n, err) < 0)
            return shard_lost(s, r, err->msg, err);
        if (dp_get_u32(b) != n)
            return dp_errf(err, "%s sent %u values for %u", peer_name(s, r), dp_get_u32(b), n);
        for (uint32_t k = 0; k < n; k++)
            out[k] += dp_get_f64(b + 4 + 8 * k);
    }
    return 0;
}

static int v_dots(void *self, int n, const int *a, const int *b, double *out, dp_err *err)
{
    dp_strategy *s = self;
    lb_op op = {.kind = LB_OP_DOTS, .n = (uint32_t)n};
    for (int k = 0; k < n; k++)
        op.a[k] = (uint32_t)a[k], op.b[k] = (uint32_t)b[k];
    return send_op(s, &op, err) < 0 ? -1 : gather(s, (uint32_t)n, out, "dot products", err);
}

static int v_axpy(void *self, int y, double alpha, int x, dp_err *err)
{
    lb_op op = {.kind = LB_OP_AXPY, .a = {(uint32_t)y}, .b = {(uint32_t)x}, .alpha = alpha};
    return send_op(self, &op, err);
}

static int v_scale(void *self, int x, double alpha, dp_err *err)
{
    lb_op op = {.kind = LB_OP_SCALE, .a = {(uint32_t)x}, .alpha = alpha};
    return send_op(self, &op, err);
}

static int v_copy(void *self, int dst, int src, dp_err *err)
{
    lb_op op = {.kind = LB_OP_COPY, .a = {(uint32_t)dst}, .b = {(uint32_t)src}};
    return send_op(self, &op, err);
}

/* The portion an idle worker gets: the next one not handed out, else a
 * backup copy of an outstanding one held by the fewest; -1: none. */
static int pick(dp_strategy *s, uint32_t n, uint32_t *next, int *backup)
{
    if (*next < n) {
        *backup = 0;
        return (int)(*next)++;
    }
    int best = -1;
    for (uint32_t p = 0; p < n; p++)
        if (!s->por[p].done && s->por[p].holders < BACKUP_COPIES &&
            (best < 0 || s->por[p].holders < s->por[best].holders))
            best = (int)p;
    *backup = best >= 0 && s->por[best].holders > 0;
    return best;
}

static int hand_out(dp_strategy *s, uint32_t n, uint32_t *next, dp_err *err)
{
    for (int w = 0; w < s->n_workers; w++) {
        if (s->busy[w] != -1)
            continue;
        int backup, p = pick(s, n, next, &backup);
        if (p < 0)
            return 0;
        uint32_t first = (uint32_t)p * s->portion;
        uint32_t count = s->batch_n - first < s->portion ? s->batch_n - first : s->portion;
        uint8_t b[LB_PORTION_BYTES];
        dp_put_u32(b, s->batch_lo + first);
        dp_put_u32(b + 4, count);
        int rank = dp_cluster_rank(s->c, DP_ROLE_WORKER, w);
        if (dp_transport_send(s->t, rank, DP_WIRE_LB_PORTION, s->eval_seq, (uint64_t)p, b,
                              sizeof b, err) < 0) {
            if (worker_lost(s, rank, err->msg, dp_transport_peer_left(s->t, rank), err) < 0)
                return -1;
            if (backup == 0 && *next > 0 && (uint32_t)p == *next - 1)
                (*next)--; /* never handed out after all */
            continue;
        }
        s->busy[w] = p;
        s->por[p].holders++;
        s->backups += backup;
    }
    return 0;
}

/* f and its gradient at vector x over the batch: portions to workers,
 * gradients accumulated on the shards into g. */
static int v_eval(void *self, int x, int g, double *f, dp_err *err)
{
    dp_strategy *s = self;
    double t0 = dp_now();
    uint32_t n = (s->batch_n + s->portion - 1) / s->portion, next = 0;
    s->eval_seq++;
    lb_op op = {.kind = LB_OP_EVAL_BEGIN, .a = {(uint32_t)x, (uint32_t)g},
                .b = {s->batch_n, n, (uint32_t)s->eval_seq}};
    if (send_op(s, &op, err) < 0)
        return -1;
    memset(s->por, 0, n * sizeof *s->por);
    s->done_count = 0;
    s->loss_sum = s->correct = 0;
    while ((uint32_t)s->done_count < n) {
        if (hand_out(s, n, &next, err) < 0)
            return -1;
        dp_event ev;
        if (pump(s, -1, 0, "portion results", &ev, err) < 0)
            return -1;
    }
    op = (lb_op){.kind = LB_OP_EVAL_END};
    double got[1];
    char what[96];
    snprintf(what, sizeof what, "the end of evaluation %llu", (unsigned long long)s->eval_seq);
    if (send_op(s, &op, err) < 0 || gather(s, 1, got, what, err) < 0)
        return -1;
    if (got[0] != (double)n * s->layout.n_shards)
        return dp_errf(err, "the shards accumulated %.0f portion gradients for evaluation %llu, "
                            "not %u each of %d shards",
                       got[0], (unsigned long long)s->eval_seq, n, s->layout.n_shards);
    *f = s->loss_sum / s->batch_n;
    s->portions_run += n;
    s->evals_run++;
    s->eval_seconds += dp_now() - t0;
    return 0;
}

static const dp_lbfgs_vec_ops sharded_ops = {
    .dots = v_dots,
    .axpy = v_axpy,
    .scale = v_scale,
    .copy = v_copy,
    .eval = v_eval,
};

/* Vector v from the shards into dst (n_params floats). */
static int pull_vec(dp_strategy *s, int v, float *dst, dp_err *err)
{
    lb_op op = {.kind = LB_OP_SEND, .a = {(uint32_t)v}};
    if (send_op(s, &op, err) < 0)
        return -1;
    for (int i = 0; i < s->layout.n_shards; i++) {
        dp_event ev;
        if (await(s, DP_PEER_ANY, DP_WIRE_LB_X, "the slices of a vector", &ev, err) < 0)
            return -1;
        int r = ev.peer, k = 0;
        while (k < s->layout.n_shards && s->layout.rank[k] != r)
            k++;
        if (k == s->layout.n_shards)
            return dp_errf(err, "%s sent a slice of a vector but holds no shard",
                           peer_name(s, r));
        dp_range rg = s->layout.range[k];
        if (ev.header.step != s->op_seq || ev.header.offset != rg.lo ||
            ev.header.length != (rg.hi - rg.lo) * sizeof(float))
            return dp_errf(err, "%s sent a slice of %llu bytes at %llu for [%zu, %zu)",
                           peer_name(s, r), (unsigned long long)ev.header.length,
                           (unsigned long long)ev.header.offset, rg.lo, rg.hi);
        if (dp_transport_recv_payload(s->t, r, dst + rg.lo, (rg.hi - rg.lo) * sizeof(float),
                                      err) < 0)
            return shard_lost(s, r, err->msg, err);
    }
    return 0;
}

/* x from the shards into s->params. */
static int pull_x(dp_strategy *s, dp_err *err)
{
    return pull_vec(s, DP_LBFGS_X, s->params, err);
}

static int checkpoint_due(const dp_strategy *s, long step)
{
    const dp_train_config *cfg = s->cfg;
    long total = s->env->steps_per_epoch * cfg->epochs;
    return cfg->checkpoint_dir &&
           (step == total || (cfg->checkpoint_every > 0 && step % cfg->checkpoint_every == 0));
}

/* The state at the end of iteration s->iter into st (docs/checkpoints.md,
 * "lbfgs"): x, g and the held pairs gathered whole from the shards, so a
 * resume can cut them over any number of ps tasks; the scalars as text.
 * Nothing else is live between iterations: the direction and the trial
 * point are written before they are read.  The workers wait meanwhile for
 * their next portion, and a late backup copy's push is dropped by the
 * shards (its evaluation is over), so no barrier is needed. */
static int checkpoint(dp_strategy *s, dp_coord_event *ev, dp_train_state *st, dp_err *err)
{
    int m = s->lb.cfg.m;
    size_t n = s->m->n_params;
    if (!st->vecs) { /* once: room for g and every pair */
        st->vec_names = calloc((size_t)(1 + 2 * m), sizeof *st->vec_names);
        st->vecs = malloc((size_t)(1 + 2 * m) * n * sizeof(float));
        if (!st->vec_names || !st->vecs)
            return dp_errf(err, "out of memory for a checkpoint of %d L-BFGS vectors",
                           1 + 2 * m);
    }
    int want[1 + 2 * DP_LBFGS_MAX_M], nv = 0;
    if (s->lb.started)
        want[nv++] = DP_LBFGS_G;
    for (int j = 0; j < s->lb.pairs; j++) {
        int k = (s->lb.newest - j + m) % m;
        want[nv++] = DP_LBFGS_S(k);
        want[nv++] = DP_LBFGS_Y(k);
    }
    if (pull_x(s, err) < 0)
        return -1;
    memcpy(st->params, s->params, n * sizeof(float));
    for (int i = 0; i < nv; i++) {
        lb_state_name(st->vec_names[i], DP_STATE_NAME_LEN, want[i]);
        if (pull_vec(s, want[i], st->vecs + (size_t)i * n, err) < 0)
            return -1;
    }
    st->n_vecs = nv;
    lb_saved sv = {.iter = s->iter, .batch_index = s->batch_index, .stalled = s->stalled,
                   .evals_run = s->evals_run, .pairs = s->lb.pairs, .newest = s->lb.newest,
                   .started = s->lb.started, .evals = s->lb.evals, .gamma = s->lb.gamma,
                   .f = s->lb.f, .gnorm = s->lb.gnorm};
    memcpy(sv.rho, s->lb.rho, sizeof sv.rho);
    if (lb_state_put(st, &sv, m, err) < 0)
        return -1;
    if (st->slots) /* an optimiser's slots: L-BFGS keeps none */
        memset(st->slots, 0, (size_t)st->n_slots * n * sizeof(float));
    st->step = s->iter;
    st->optim_t = s->iter;
    ev->kind = DP_COORD_CHECKPOINT;
    ev->step = s->iter;
    return 0;
}

static int end_iteration(dp_strategy *s, dp_err *err)
{
    for (int w = 0; w < s->n_workers; w++) {
        int rank = dp_cluster_rank(s->c, DP_ROLE_WORKER, w);
        if (s->busy[w] != -2 &&
            dp_transport_send(s->t, rank, DP_WIRE_LB_ITER_END, (uint64_t)s->iter, 0, NULL, 0,
                              err) < 0 &&
            worker_lost(s, rank, err->msg, dp_transport_peer_left(s->t, rank), err) < 0)
            return -1;
    }
    return 0;
}

/* One L-BFGS iteration on batch j of the epoch. */
static int iterate(dp_strategy *s, dp_epoch_stats *st, dp_err *err)
{
    long spe = s->env->steps_per_epoch, j = s->iter % spe;
    uint32_t n_train = s->env->n_train, B = (uint32_t)s->cfg->batch;
    s->batch_lo = (uint32_t)j * B;
    s->batch_n = n_train - s->batch_lo < B ? n_train - s->batch_lo : B;
    double t0 = dp_now();
    long portions0 = s->portions_run, backups0 = s->backups, evals0 = s->evals_run;
    double es0 = s->eval_seconds;
    dp_lbfgs_iter it = {0};
    if (s->batch_index != j && !s->stalled) {
        if (dp_lbfgs_start(&s->lb, err) < 0)
            return -1;
        s->batch_index = j;
    }
    if (!s->stalled) {
        if (dp_lbfgs_iterate(&s->lb, &it, err) < 0)
            return -1;
        if (!it.accepted) {
            s->stalled = it.gnorm == 0 || it.evals == 0 || s->lb.pairs == 0 ? s->stalled + 1 : 0;
            dp_warn("lbfgs iteration %ld: no step met the Wolfe conditions in %d evaluations "
                    "(|g| %.3g); the history is dropped",
                    s->iter + 1, it.evals, it.gnorm);
        }
        if (s->stalled >= 2)
            dp_warn("lbfgs: stalled at f %.6g, |g| %.3g: the remaining iterations take no step",
                    s->lb.f, s->lb.gnorm);
    }
    s->iter++;
    if (end_iteration(s, err) < 0)
        return -1;
    double secs = dp_now() - t0;
    long evals = s->evals_run - evals0;
    st->loss_sum += s->lb.f * s->batch_n;
    st->records += s->batch_n;
    st->correct += s->correct; /* of the last evaluation: at x */
    if (s->cfg->log_every > 0 && !s->cfg->quiet)
        dp_info("Chief, L-BFGS iteration %ld: f %.6f, |g| %.4g, step %.4g, %ld evaluation(s) of "
                "%u records, %ld portion(s), %ld backup(s), %.2f s",
                s->iter, s->lb.f, s->lb.gnorm, it.t, evals, s->batch_n,
                s->portions_run - portions0, s->backups - backups0, secs);
    dp_metrics_event(s->env->metrics, "lbfgs", DP_F_INT, "iteration", s->iter, DP_F_NUM, "loss",
                     s->lb.f, DP_F_NUM, "grad_norm", s->lb.gnorm, DP_F_NUM, "step_size", it.t,
                     DP_F_INT, "accepted", (long)it.accepted, DP_F_INT, "evaluations", evals,
                     DP_F_INT, "portions", s->portions_run - portions0, DP_F_INT, "backups",
                     s->backups - backups0, DP_F_INT, "duplicates", s->duplicates, DP_F_NUM,
                     "eval_seconds", evals ? (s->eval_seconds - es0) / evals : 0, DP_F_NUM,
                     "seconds", secs, DP_F_END);
    return 0;
}

static int lb_next(dp_strategy *s, dp_coord_event *ev, dp_train_state *st, dp_err *err)
{
    memset(ev, 0, sizeof *ev);
    long spe = s->env->steps_per_epoch, total = spe * s->cfg->epochs;
    if (s->ckpt_pending) { /* the epoch's last step, after its evaluation */
        s->ckpt_pending = 0;
        return checkpoint(s, ev, st, err);
    }
    if (s->iter >= total) {
        /* backup copies still under way push to the shards before they
         * report: once every worker has reported, the shards may go */
        for (int w = 0; w < s->n_workers; w++)
            while (s->busy[w] >= 0) {
                dp_event any;
                if (pump(s, DP_PEER_ANY, 0, "the last backup copies", &any, err) < 0)
                    return -1;
            }
        if (pull_x(s, err) < 0)
            return -1;
        for (int i = 0; i < s->layout.n_shards; i++)
            dp_transport_send(s->t, s->layout.rank[i], DP_WIRE_SHUTDOWN, 0, 0, NULL, 0, err);
        s->shut = 1;
        dp_info("lbfgs: %ld iterations, %ld evaluations, %ld portions, %ld backup copies, %ld "
                "duplicate results ignored; %.3f s an evaluation",
                s->iter, s->evals_run, s->portions_run, s->backups, s->duplicates,
                s->evals_run ? s->eval_seconds / s->evals_run : 0);
        dp_metrics_event(s->env->metrics, "lbfgs_done", DP_F_INT, "iterations", s->iter,
                         DP_F_INT, "evaluations", s->evals_run, DP_F_INT, "portions",
                         s->portions_run, DP_F_INT, "backups", s->backups, DP_F_INT,
                         "duplicates", s->duplicates, DP_F_NUM, "eval_seconds",
                         s->evals_run ? s->eval_seconds / s->evals_run : 0, DP_F_END);
        ev->kind = DP_COORD_DONE;
        ev->step = s->iter;
        return 0;
    }
    if (s->ep_t0 == 0)
        s->ep_t0 = dp_now();
    for (;;) {
        if (iterate(s, &s->ep, err) < 0)
            return -1;
        if (s->iter % spe == 0)
            break;
        if (checkpoint_due(s, s->iter)) /* in the middle of an epoch */
            return checkpoint(s, ev, st, err);
    }
    ev->kind = DP_COORD_EPOCH;
    ev->epoch = (int)(s->iter / spe);
    ev->step = s->iter;
    ev->stats = s->ep;
    ev->stats.steps = s->iter;
    ev->stats.seconds = dp_now() - s->ep_t0;
    memset(&s->ep, 0, sizeof s->ep);
    s->ep_t0 = 0;
    s->ckpt_pending = checkpoint_due(s, s->iter);
    return pull_x(s, err);
}

static const float *lb_params(dp_strategy *s, dp_weights which, dp_err *err)
{
    (void)which, (void)err;
    return s->params; /* pulled at the epoch's end */
}

/* --------------------------------------------------------------- worker */

static int to_chief(dp_strategy *s, unsigned type, uint64_t step, uint64_t off, const void *b,
                    size_t len, dp_err *err)
{
    if (dp_transport_send(s->t, s->chief, type, step, off, b, len, err) < 0)
        return dp_err_prefix(err, "lost the chief, the L-BFGS coordinator");
    return 0;
}

/* The point of evaluation e from every shard into m->params; 0 when a
 * shard says the evaluation is over (the portion is abandoned). */
static int pull_point(dp_strategy *s, uint64_t e, dp_err *err)
{
    s->have_eval = 0;
    for (int i = 0; i < s->layout.n_shards; i++)
        if (dp_transport_send(s->t, s->layout.rank[i], DP_WIRE_LB_PULL, e, 0, NULL, 0, err) < 0)
            return dp_err_prefix(err, "lost %s", peer_name(s, s->layout.rank[i]));
    int fresh = 1;
    for (int i = 0; i < s->layout.n_shards; i++) {
        int r = s->layout.rank[i];
        dp_range rg = s->layout.range[i];
        dp_event ev;
        if (dp_transport_recv(s->t, r, "the point to evaluate", s->timeout, &ev, err) < 0)
            return dp_err_prefix(err, "lost %s (a shard of x)", peer_name(s, r));
        size_t len = (rg.hi - rg.lo) * sizeof(float);
        if (ev.header.type != DP_WIRE_LB_X || ev.header.step != e || ev.header.offset != rg.lo ||
            (ev.header.length != len && ev.header.length != 0))
            return dp_errf(err, "%s sent frame type %u (%llu bytes) for the slice [%zu, %zu) of "
                                "evaluation %llu",
                           peer_name(s, r), ev.header.type, (unsigned long long)ev.header.length,
                           rg.lo, rg.hi, (unsigned long long)e);
        if (ev.header.length == 0) {
            fresh = 0;
            continue;
        }
        if (dp_transport_recv_payload(s->t, r, s->m->params + rg.lo, len, err) < 0)
            return dp_err_prefix(err, "lost %s (a shard of x)", peer_name(s, r));
    }
    if (fresh)
        s->have_eval = (long)e;
    return fresh;
}

/* One portion: pull the point if needed, gradient and loss, push, report. */
static int compute(dp_strategy *s, const dp_event *ev, dp_err *err)
{
    uint8_t b[LB_RESULT_BYTES];
    if (ev->header.length != LB_PORTION_BYTES)
        return dp_errf(err, "the chief sent a portion of %llu bytes (want %d)",
                       (unsigned long long)ev->header.length, LB_PORTION_BYTES);
    if (dp_transport_recv_payload(s->t, s->chief, b, LB_PORTION_BYTES, err) < 0)
        return dp_err_prefix(err, "lost the chief, the L-BFGS coordinator");
    uint32_t first = dp_get_u32(b), count = dp_get_u32(b + 4);
    const dp_split *sp = s->env->train;
    if (count == 0 || count > s->portion || first > sp->n || count > sp->n - first)
        return dp_errf(err, "the chief sent a portion of records [%u, %u+%u) (split of %u, "
                            "portions of %u)", first, first, count, sp->n, s->portion);
    uint64_t e = ev->header.step, p = ev->header.offset;
    int fresh = s->have_eval == (long)e ? 1 : pull_point(s, e, err);
    if (fresh < 0)
        return -1;
    if (!fresh) {
        memset(b, 0, sizeof b);
        return to_chief(s, DP_WIRE_LB_RESULT, e, p, b, sizeof b, err);
    }
    for (uint32_t i = 0; i < count; i++)
        s->idx[i] = first + i;
    dp_split_gather(s->x, s->y, sp, s->idx, (int)count);
    int correct = 0;
    float loss = dp_model_forward_backward(s->m, s->x, s->y, (int)count, &correct);
    if (s->cfg->straggler == s->index)
        dp_sleep_ms(s->cfg->straggler_ms);
    uint8_t head[LB_GRAD_HEAD];
    dp_put_u32(head, count);
    for (int i = 0; i < s->layout.n_shards; i++) {
        dp_range rg = s->layout.range[i];
        struct iovec iov[2] = {{head, sizeof head},
                               {s->m->grads + rg.lo, (rg.hi - rg.lo) * sizeof(float)}};
        if (dp_transport_sendv(s->t, s->layout.rank[i], DP_WIRE_LB_GRAD, e, p, iov, 2, err) < 0)
            return dp_err_prefix(err, "lost %s (a shard of the gradient)",
                                 peer_name(s, s->layout.rank[i]));
    }
    dp_put_f64(b, (double)loss * count);
    dp_put_u32(b + 8, (uint32_t)correct);
    dp_put_u32(b + 12, count);
    return to_chief(s, DP_WIRE_LB_RESULT, e, p, b, sizeof b, err);
}

/* Whether SIGTERM asked this worker to drain: it then leaves at the
 * portion boundary it is at (docs/faults.md, "Draining"). */
static int draining(const dp_strategy *s)
{
    return s->env->drain_asked && s->env->drain_asked();
}

/* A worker's step: portions until the chief ends iteration `step`, or
 * until a drain is asked for: the step ends at the next portion boundary,
 * a portion computed reported, one received left undone (the chief hands
 * it to the others when this worker's BYE comes), and the loop calls
 * lb_leave. */
static int lb_step(dp_strategy *s, const float *x, const uint8_t *y, int n, float lr, long step,
                   dp_step_out *out, dp_err *err)
{
    (void)x, (void)y, (void)n, (void)lr;
    memset(out, 0, sizeof *out);
    for (;;) {
        dp_event ev;
        if (dp_transport_recv(s->t, s->chief, "the coordinator's next portion", s->timeout, &ev,
                              err) < 0)
            return dp_err_prefix(err, "lost the chief, the L-BFGS coordinator");
        if (ev.header.type == DP_WIRE_LB_ITER_END && ev.header.step == (uint64_t)step &&
            ev.header.length == 0)
            return 0;
        if (ev.header.type != DP_WIRE_LB_PORTION)
            return dp_errf(err, "the chief sent frame type %u (%llu bytes, step %llu) during "
                                "iteration %ld",
                           ev.header.type, (unsigned long long)ev.header.length,
                           (unsigned long long)ev.header.step, step);
        if (draining(s)) /* the portion left undone: the node's BYE follows */
            return dp_transport_skip_payload(s->t, s->chief, err) < 0 ? -1 : 0;
        if (compute(s, &ev, err) < 0)
            return -1;
        if (draining(s))
            return 0;
    }
}

/* Drained (lb_step ended at a portion boundary, or at an iteration's end):
 * nothing of the run is held here (the shards hold x and the gradient),
 * so nothing to send; the BYE the node says at close tells the chief and
 * the shards it left rather than died (worker_lost). */
static int lb_leave(dp_strategy *s, long steps, dp_err *err)
{
    (void)s, (void)steps, (void)err;
    return 0;
}

static int lb_epoch_end(dp_strategy *s, int epoch, dp_epoch_stats *st, dp_err *err)
{
    (void)s, (void)epoch, (void)st, (void)err;
    return 0; /* the chief knows the figures */
}

/* A worker at a checkpoint step: it holds no state (the chief gathers it
 * from the shards), and goes on answering portions. */
static int lb_save(dp_strategy *s, long step, dp_train_state *st, dp_err *err)
{
    (void)s, (void)step, (void)st, (void)err;
    return 0;
}

static int lb_finish(dp_strategy *s, long steps, dp_err *err)
{
    (void)s, (void)steps, (void)err;
    return 0;
}

/* ------------------------------------------------------------------- ps */

static int lb_serve(dp_strategy *s, dp_err *err)
{
    if (!s->has_shard) {
        dp_info("%s: no L-BFGS shard here (the partition made %d)",
                s->c->tasks[s->c->self].name, s->layout.n_shards);
        return 0;
    }
    return lb_shard_serve(&s->shard, err);
}

/* ---------------------------------------------------------------- opening */

static void lb_close(dp_strategy *s)
{
    if (!s)
        return;
    lb_shard_free(&s->shard);
    free(s->params);
    free(s->por);
    free(s->busy);
    free(s->x);
    free(s->y);
    free(s->idx);
    free(s);
}

#define DP_LBFGS_DEFAULT_PORTION 1000

/* lbfgs's settings: a new option is a field here and a line in lb_opts
 * below.  The ps layout's options are the ps family's (ps_options.c). */
typedef struct lb_settings {
    dp_ps_settings ps; /* ps-min-shard-bytes, ps-max-shards, ps-replicas */
    int history;       /* (s, y) pairs kept (10) */
    int portion;       /* records a worker computes at once (0: DP_LBFGS_DEFAULT_PORTION) */
} lb_settings;
_Static_assert(sizeof(lb_settings) <= DP_STRATEGY_CFG_MAX, "lbfgs settings too big");
static const dp_strategy_conf lb_conf;

static const lb_settings *settings_of(const dp_train_config *cfg)
{
    return dp_strategy_settings(cfg, &lb_conf);
}

static int lb_model_rows(const dp_train_config *cfg)
{
    int n = settings_of(cfg)->portion;
    return n > 0 ? n : DP_LBFGS_DEFAULT_PORTION;
}

static int check_run(const dp_run_env *env, dp_err *err)
{
    const dp_train_config *cfg = env->cfg;
    const dp_cluster *c = &env->node->cluster;
    if (c->count[DP_ROLE_CHIEF] != 1 || c->count[DP_ROLE_WORKER] < 1 || c->count[DP_ROLE_PS] < 1)
        return dp_errf(err, "lbfgs needs a chief (the coordinator), workers (gradients) and ps "
                            "tasks (the vectors); this cluster has %d, %d and %d. Hint: "
                            "downpour launch --chief --workers 4 --ps 2 -- train --strategy lbfgs",
                       c->count[DP_ROLE_CHIEF], c->count[DP_ROLE_WORKER], c->count[DP_ROLE_PS]);
    if (cfg->ema > 0)
        return dp_errf(err, "--ema %g: lbfgs takes few large steps, there is no average to keep; "
                            "leave --ema out", (double)cfg->ema);
    const lb_settings *ls = settings_of(cfg);
    if (ls->ps.replicas > 1)
        return dp_errf(err, "--ps-replicas %d: lbfgs shards keep no backup copy",
                       ls->ps.replicas);
    if (ls->history < 1 || ls->history > DP_LBFGS_MAX_M)
        return dp_errf(err, "--lbfgs-history %d is out of range [1, %d]", ls->history,
                       DP_LBFGS_MAX_M);
    return 0;
}

/* The chief goes on from a checkpoint: the driver's and its own scalars;
 * the shards took the vectors (lb_shard_resume). */
static int resume_chief(dp_strategy *s, const dp_train_state *r, dp_err *err)
{
    lb_saved sv;
    if (lb_state_get(r, s->lb.cfg.m, &sv, err) < 0)
        return -1;
    s->iter = sv.iter;
    s->batch_index = sv.batch_index;
    s->stalled = sv.stalled;
    s->evals_run = sv.evals_run;
    s->lb.pairs = sv.pairs;
    s->lb.newest = sv.newest;
    s->lb.started = sv.started;
    s->lb.evals = sv.evals;
    s->lb.gamma = sv.gamma;
    s->lb.f = sv.f;
    s->lb.gnorm = sv.gnorm;
    memcpy(s->lb.rho, sv.rho, sizeof s->lb.rho);
    dp_info("lbfgs: resumed at iteration %ld with %d pair(s) of history%s", sv.iter, sv.pairs,
            sv.stalled >= 2 ? " (stalled)" : "");
    return 0;
}

static int open_part(dp_strategy *s, const dp_run_env *env, dp_task_info *info, dp_err *err)
{
    const dp_train_config *cfg = env->cfg;
    dp_role role = env->node->self->role;
    uint32_t records = (uint32_t)cfg->batch < env->n_train ? (uint32_t)cfg->batch : env->n_train;
    s->max_portions = (records + s->portion - 1) / s->portion;
    if (role == DP_ROLE_PS) {
        info->part = DP_PART_SERVER;
        int self = env->node->cluster.self;
        for (int i = 0; i < s->layout.n_shards; i++)
            if (s->layout.rank[i] == self) {
                if (lb_shard_open(&s->shard, s->t, s->c, s->layout.range[i].lo,
                                  s->layout.range[i].hi, s->vectors, s->m->params,
                                  s->max_portions, err) < 0)
                    return -1;
                s->has_shard = 1;
                lb_saved sv; /* x is the loop's resumed params; the rest from here */
                if (env->resume && lb_state_get(env->resume, settings_of(cfg)->history, &sv,
                                                err) < 0)
                    return -1;
                if (env->resume)
                    lb_shard_resume(&s->shard, env->resume, settings_of(cfg)->history);
            }
        return 0;
    }
    if (role == DP_ROLE_WORKER) {
        if (!env->train)
            return dp_errf(err, "lbfgs: a worker needs the training split");
        if (!dp_split_in_memory(env->train)) /* portions are gathered by record index */
            return dp_errf(err, "lbfgs: a worker reads its portions from records in memory, "
                                "and the training split is %s",
                           env->train->stream ? "streamed from its files" : "not loaded");
        info->part = DP_PART_TRAINER;
        info->no_batches = 1;
        info->shard_index = s->index = env->node->self->index;
        info->shard_count = 1;
        info->replicas = 1;
        snprintf(info->label, sizeof info->label, "Worker %d", s->index);
        s->x = malloc((size_t)s->portion * env->train->dim * sizeof *s->x);
        s->y = malloc(s->portion);
        s->idx = malloc(s->portion * sizeof *s->idx);
        if (!s->x || !s->y || !s->idx)
            return dp_errf(err, "out of memory for a portion of %u records", s->portion);
        if ((uint32_t)s->m->max_batch < s->portion)
            return dp_errf(err, "lbfgs: the model holds %d rows, a portion %u", s->m->max_batch,
                           s->portion);
        return 0;
    }
    info->part = DP_PART_COORDINATOR;
    info->evaluator = 1;
    info->replicas = 1;
    snprintf(info->label, sizeof info->label, "Chief");
    s->params = malloc(s->m->n_params * sizeof *s->params);
    s->por = calloc(s->max_portions, sizeof *s->por);
    s->busy = malloc((size_t)s->n_workers * sizeof *s->busy);
    if (!s->params || !s->por || !s->busy)
        return dp_errf(err, "out of memory");
    memcpy(s->params, s->m->params, s->m->n_params * sizeof *s->params);
    for (int w = 0; w < s->n_workers; w++)
        s->busy[w] = -1;
    s->live = s->n_workers;
    s->batch_index = -1;
    dp_lbfgs_config lc = dp_lbfgs_defaults();
    lc.m = settings_of(cfg)->history;
    if (dp_lbfgs_init(&s->lb, &lc, &sharded_ops, s, err) < 0)
        return -1;
    if (env->resume && resume_chief(s, env->resume, err) < 0)
        return -1;
    dp_info("lbfgs: history %d, batch %u records in %u portion(s) of %u, %d worker(s), %d "
            "shard(s) of %d vectors (%zu parameters)",
            lc.m, records, s->max_portions, s->portion, s->n_workers, s->layout.n_shards,
            s->vectors, s->m->n_params);
    return 0;
}

static int lb_open(dp_strategy **out, const dp_run_env *env, dp_task_info *info, dp_err *err)
{
    if (check_run(env, err) < 0)
        return -1;
    const dp_train_config *cfg = env->cfg;
    dp_strategy *s = calloc(1, sizeof *s);
    if (!s)
        return dp_errf(err, "out of memory");
    s->env = env;
    s->cfg = cfg;
    s->m = env->model;
    s->t = env->node->transport;
    s->c = &env->node->cluster;
    s->chief = dp_cluster_rank(s->c, DP_ROLE_CHIEF, 0);
    s->n_workers = s->c->count[DP_ROLE_WORKER];
    s->vectors = DP_LBFGS_VECTORS(settings_of(cfg)->history);
    s->timeout = cfg->collective_timeout > 0 ? cfg->collective_timeout : 300;
    s->portion = (uint32_t)lb_model_rows(cfg);
    if (s->portion > (uint32_t)cfg->batch)
        s->portion = (uint32_t)cfg->batch;
    dp_ps_config pc;
    if (dp_ps_settings_apply(&settings_of(cfg)->ps, &pc, err) < 0 ||
        dp_ps_layout_make(&s->layout, s->c, s->m->n_params, &pc, err) < 0 ||
        open_part(s, env, info, err) < 0) {
        lb_close(s);
        return -1;
    }
    *out = s;
    return 0;
}

#define F(field) offsetof(lb_settings, field)
static const dp_opt lb_opts[] = {
    {"lbfgs-history", DP_OPT_INT, F(history), "M", "lbfgs: (s, y) pairs the L-BFGS history keeps", 1, DP_LBFGS_MAX_M, 0},
    {"portion", DP_OPT_INT, F(portion), "N", "lbfgs: records a worker computes at once; --batch is the L-BFGS batch (default: 1000)", 1, 65536, 0},
    /* its ps shards' layout: listed with the ps family's options */
    {"ps-min-shard-bytes", DP_OPT_SIZE, F(ps.min_shard_bytes), "N", "smallest parameter shard in bytes", 4096, (double)(1L << 40), DP_OPT_ALSO},
    {"ps-max-shards", DP_OPT_INT, F(ps.max_shards), "N", "most shards (0: one per ps task)", 0, 4096, DP_OPT_ALSO},
    {"ps-replicas", DP_OPT_INT, F(ps.replicas), "N", "copies of each ps shard", 1, 2, DP_OPT_ALSO},
};
#undef F

static int lb_foreign(const void *own, const dp_train_config *cfg, dp_err *err)
{
    (void)cfg;
    const lb_settings *ls = own;
    if (ls->history != 10 || ls->portion != 0)
        return dp_errf(err, "--lbfgs-history and --portion are for --strategy lbfgs");
    return 0;
}

static int lb_check(const void *own, const dp_train_config *cfg, dp_err *err)
{
    const lb_settings *ls = own;
    if (ls->portion > cfg->batch)
        return dp_errf(err, "--portion %d: a portion cannot hold more records than the L-BFGS "
                            "batch (--batch %d)", ls->portion, cfg->batch);
    /* a weight decay other than the optimizer's default counts as given */
    if (cfg->optim.weight_decay != dp_optim_defaults(cfg->optim.kind).weight_decay ||
        cfg->warmup_steps > 0 || cfg->warmup_epochs > 0 || cfg->lr_schedule == DP_LR_STEP)
        return dp_errf(err, "--weight-decay, --warmup-steps, --warmup-epochs and "
                            "--lr-schedule step shape gradient steps; --strategy lbfgs takes "
                            "L-BFGS steps with a line search, no learning rate (docs/training.md)");
    return 0;
}

static void lb_identity(const void *own, int part, char *buf, size_t cap)
{
    const lb_settings *ls = own;
    if (part != 0)
        return;
    dp_ps_settings_identity(&ls->ps, buf, cap);
    /* the history, and the portions the batch's gradient is summed over */
    size_t n = strlen(buf);
    snprintf(buf + n, n < cap ? cap - n : 0, " lbfgs_history=%d portion=%d", ls->history,
             ls->portion > 0 ? ls->portion : DP_LBFGS_DEFAULT_PORTION);
}

static const lb_settings lb_defaults = {
    .ps = {.fetch_every = 1, .push_every = 1, .staleness = 3, .staleness_range = "1:6",
           .period = 8, .min_shard_bytes = DP_PARTITION_MIN_SHARD_BYTES, .replicas = 1},
    .history = 10,
};

static const dp_strategy_conf lb_conf = {
    .opts = lb_opts, .n_opts = (int)(sizeof lb_opts / sizeof lb_opts[0]),
    .size = sizeof(lb_settings), .defaults = &lb_defaults,
    .foreign = lb_foreign, .check = lb_check, .identity = lb_identity,
};

const dp_strategy_ops dp_strategy_lbfgs = {
    .name = "lbfgs",
    .conf = &lb_conf,
    .reshards = DP_RESHARD_ANY, /* x, g and the pairs are gathered whole into a checkpoint */
    .no_clip = "L-BFGS steps along a search direction chosen by a line search over the whole "
               "batch, not along the gradient",
    .summary = "Sandblaster L-BFGS: a coordinator drives L-BFGS on vectors sharded over the ps "
               "tasks; workers compute portions of a large batch, with backup copies",
    .cluster = 1,
    .needs = DP_ROLE_BIT(DP_ROLE_CHIEF) | DP_ROLE_BIT(DP_ROLE_WORKER) | DP_ROLE_BIT(DP_ROLE_PS),
    /* A lost worker's portions go to the others (worker_lost), and the
     * run ends well without it; a restarted one is not taken back. */
    .survives = DP_ROLE_BIT(DP_ROLE_WORKER),
    /* A lost chief or ps: the whole job again from the newest checkpoint
     * (docs/faults.md), as the state is there whole. */
    .restarts_all = DP_ROLE_BIT(DP_ROLE_CHIEF) | DP_ROLE_BIT(DP_ROLE_PS),
    .no_rejoin = DP_ROLE_BIT(DP_ROLE_WORKER),
    .model_rows = lb_model_rows,
    .open = lb_open,
    .serve = lb_serve,
    .step = lb_step,
    .epoch_end = lb_epoch_end,
    .next = lb_next,
    .params = lb_params,
    .save = lb_save,
    .finish = lb_finish,
    .leave = lb_leave,
    .close = lb_close,
};

void dp_lbfgs_counts(const dp_strategy *s, long *portions, long *backups, long *duplicates)
{
    *portions = s->portions_run;
    *backups = s->backups;
    *duplicates = s->duplicates;
}
