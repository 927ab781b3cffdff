/* One model replica split over K tasks: see mp_replica.h. */
#include "strategy/mp_replica.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/layers.h"
#include "downpour/wire.h"
#include "strategy/sender.h"

struct mp_replica {
    dp_transport *t;
    int K, task, replica;
    int *ranks;           /* the replica's transport ranks, in task order */
    mp_plan *plans;       /* every task's slices */
    const mp_plan *plan;  /* this task's */
    int rows;             /* the largest batch a step takes */
    float *act[DP_MAX_DENSE]; /* each dense layer's full output (rows, out) */
    float *dbuf[2];       /* input gradients, ping-pong (rows, max_width) */
    float *pack, *unpack; /* one task's columns (rows, max_units) */
    float *blocks;        /* a partial input gradient, peer by peer (rows, max_width) */
    sender *tx;           /* the exchanges' sends */
    double timeout;
};

/* A task that is gone, silent or off the protocol ends the step: its slices
 * of the model are lost with it. */
static int task_lost(mp_replica *s, int q, dp_err *err)
{
    char why[sizeof err->msg];
    snprintf(why, sizeof why, "%s", err->msg);
    return dp_errf(err, "lost model-parallel task %d of replica %d, %s (%s): a replica cannot "
                        "go on without a slice of its model, so the run stops",
                   q, s->replica, dp_transport_peer_name(s->t, s->ranks[q]), why);
}

static int lost_rank(mp_replica *s, int rank, dp_err *err)
{
    for (int q = 0; q < s->K; q++)
        if (s->ranks[q] == rank)
            return task_lost(s, q, err);
    return -1;
}

static int wait_sent(mp_replica *s, dp_err *err)
{
    int rank;
    if (sender_wait(s->tx, sender_last(s->tx), &rank, err) < 0)
        return lost_rank(s, rank, err);
    return 0;
}

/* Waits for frame `type` of `step` for layer d, len bytes, from task q and
 * reads it into dst. */
static int recv_exact(mp_replica *s, int q, unsigned type, long step, uint64_t d, void *dst,
                      size_t len, const char *what, dp_err *err)
{
    int rc = dp_transport_recv_exact(s->t, s->ranks[q], type, (uint64_t)step, d, dst, len, what,
                                     s->timeout, err);
    return rc == DP_RECV_LOST ? task_lost(s, q, err) : rc;
}

/* The replica's tasks swap their columns of dense layer d's output: after
 * it every task holds the full (rows, out) output. */
static int all_gather(mp_replica *s, int d, int rows, long step, dp_err *err)
{
    const mp_layer *l = &s->plan->layer[d];
    int rank;
    mp_pack(s->pack, s->act[d], rows, l->out, l->lo, l->hi);
    size_t len = (size_t)rows * (size_t)(l->hi - l->lo) * sizeof(float);
    for (int q = 0; q < s->K; q++)
        if (q != s->task && sender_push(s->tx, s->ranks[q], DP_WIRE_MP_ACT,
                                        (uint64_t)step, (uint64_t)d, s->pack, len, &rank,
                                        err) < 0)
            return lost_rank(s, rank, err);
    for (int q = 0; q < s->K; q++) {
        if (q == s->task)
            continue;
        const mp_layer *lq = &s->plans[q].layer[d];
        if (recv_exact(s, q, DP_WIRE_MP_ACT, step, (uint64_t)d, s->unpack,
                       (size_t)rows * (size_t)(lq->hi - lq->lo) * sizeof(float),
                       "its columns of a layer's output", err) < 0)
            return -1;
        mp_unpack(s->act[d], s->unpack, rows, l->out, lq->lo, lq->hi);
    }
    /* everything out before the ring's inline sends (one order per peer) */
    return wait_sent(s, err);
}

/* The replica sums its tasks' parts of the gradient at dense layer d's
 * input, din (rows, in): each task ends with the sum in the columns it owns
 * of layer d-1 (the only ones its backward reads); the other columns of din
 * are left as they were.  Each part of a column is added by its owner in
 * task order, so the sum is the same whoever computes it. */
static int reduce_scatter(mp_replica *s, int d, float *din, int rows, long step, dp_err *err)
{
    int width = s->plan->layer[d].in, rank;
    const mp_layer *mine = &s->plan->layer[d - 1];
    for (int q = 0; q < s->K; q++) {
        if (q == s->task)
            continue;
        const mp_layer *lq = &s->plans[q].layer[d - 1];
        float *block = s->blocks + (size_t)rows * lq->lo;
        mp_pack(block, din, rows, width, lq->lo, lq->hi);
        if (sender_push(s->tx, s->ranks[q], DP_WIRE_MP_GRAD, (uint64_t)step, (uint64_t)d,
                        block, (size_t)rows * (size_t)(lq->hi - lq->lo) * sizeof(float), &rank,
                        err) < 0)
            return lost_rank(s, rank, err);
    }
    int u = mine->hi - mine->lo;
    /* the sum starts from this task's own part, in the packed layout */
    float *sum = s->blocks + (size_t)rows * mine->lo;
    mp_pack(sum, din, rows, width, mine->lo, mine->hi);
    for (int q = 0; q < s->K; q++) {
        if (q == s->task)
            continue;
        if (recv_exact(s, q, DP_WIRE_MP_GRAD, step, (uint64_t)d, s->unpack,
                       (size_t)rows * u * sizeof(float), "its part of an input gradient",
                       err) < 0)
            return -1;
        float *restrict a = sum;
        const float *restrict b = s->unpack;
        for (size_t i = 0; i < (size_t)rows * u; i++)
            a[i] += b[i];
    }
    mp_unpack(din, sum, rows, width, mine->lo, mine->hi);
    /* the packed blocks stay in use until they are out */
    return wait_sent(s, err);
}

/* Forward and backward of n records: the loss and this task's gradients,
 * weighted by w (its replica's share of the step's records). */
int mp_replica_step(mp_replica *s, const float *params, float *grads, const float *x,
                    const uint8_t *y, int n, float w, long step, dp_step_out *out, dp_err *err)
{
    const mp_plan *p = s->plan;
    int last = p->n - 1;
    out->loss = 0;
    out->correct = 0;
    if (n < 1 || n > s->rows)
        return dp_errf(err, "model-parallel: a step of %d records, but room for %d", n, s->rows);
    for (int d = 0; d <= last; d++) {
        mp_forward(s->act[d], d ? s->act[d - 1] : x, params, &p->layer[d], n, d < last);
        if (s->K > 1 && all_gather(s, d, n, step, err) < 0)
            return -1;
    }
    /* every task: the same logits, the same loss and gradient */
    float *logits = s->act[last];
    int classes = p->layer[last].out;
    out->loss = dp_softmax_xent_forward(logits, logits, y, n, classes, &out->correct);
    if (!isfinite(out->loss))
        return dp_errf(err, "the loss became %g at step %ld: lower the learning rate (--lr)",
                       (double)out->loss, step);
    dp_softmax_xent_backward(logits, logits, y, n, classes);
    if (w != 1.0f)
        for (size_t i = 0; i < (size_t)n * classes; i++)
            logits[i] *= w;
    const float *dz = logits;
    int cur = 0;
    for (int d = last; d >= 0; d--) {
        const mp_layer *l = &p->layer[d];
        float *din = d ? s->dbuf[cur] : NULL; /* never the input's gradient */
        mp_backward(din, grads, dz, d ? s->act[d - 1] : x, params, l, n);
        if (!din)
            break;
        if (s->K > 1 && reduce_scatter(s, d, din, n, step, err) < 0)
            return -1;
        /* through the relu before layer d (its output is act[d-1]), on the
         * columns this task owns (K = 1: all of them) */
        const mp_layer *prev = &p->layer[d - 1];
        for (int r = 0; r < n; r++)
            dp_relu_backward(din + (size_t)r * l->in + prev->lo,
                             din + (size_t)r * l->in + prev->lo,
                             s->act[d - 1] + (size_t)r * l->in + prev->lo, prev->hi - prev->lo);
        dz = din;
        cur ^= 1;
    }
    return 0;
}


const mp_plan *mp_replica_plan(const mp_replica *r, int j)
{
    return &r->plans[j];
}

void mp_replica_close(mp_replica *s)
{
    if (!s)
        return;
    sender_close(s->tx);
    for (int d = 0; d < DP_MAX_DENSE; d++)
        free(s->act[d]);
    free(s->dbuf[0]);
    free(s->dbuf[1]);
    free(s->pack);
    free(s->unpack);
    free(s->blocks);
    free(s->plans);
    free(s->ranks);
    free(s);
}

int mp_replica_open(mp_replica **out, dp_transport *t, const dp_model *m, const int *ranks,
                    int K, int task, int replica, int rows, double timeout, dp_err *err)
{
    mp_replica *s = calloc(1, sizeof *s);
    if (!s)
        return dp_errf(err, "out of memory");
    s->t = t;
    s->K = K;
    s->task = task;
    s->replica = replica;
    s->rows = rows;
    s->timeout = timeout;
    s->ranks = malloc((size_t)K * sizeof *s->ranks);
    s->plans = calloc((size_t)K, sizeof *s->plans);
    if (!s->ranks || !s->plans) {
        mp_replica_close(s);
        return dp_errf(err, "out of memory");
    }
    memcpy(s->ranks, ranks, (size_t)K * sizeof *ranks);
    for (int j = 0; j < K; j++)
        if (mp_plan_make(&s->plans[j], m, K, j, err) < 0) {
            mp_replica_close(s);
            return -1;
        }
    s->plan = &s->plans[task];
    const mp_plan *p = s->plan;
    size_t r = (size_t)rows;
    s->dbuf[0] = malloc(r * p->max_width * sizeof(float));
    s->dbuf[1] = malloc(r * p->max_width * sizeof(float));
    s->pack = malloc(r * p->max_units * sizeof(float));
    s->unpack = malloc(r * p->max_units * sizeof(float));
    s->blocks = malloc(r * p->max_width * sizeof(float));
    int ok = s->dbuf[0] && s->dbuf[1] && s->pack && s->unpack && s->blocks;
    for (int d = 0; d < p->n && ok; d++)
        ok = (s->act[d] = malloc(r * p->layer[d].out * sizeof(float))) != NULL;
    if (!ok) {
        mp_replica_close(s);
        return dp_errf(err, "out of memory for a batch of %d records", rows);
    }
    if (sender_open(&s->tx, t, 2 * K, err) < 0) {
        mp_replica_close(s);
        return -1;
    }
    *out = s;
    return 0;
}
