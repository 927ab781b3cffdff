/* Sandblaster L-BFGS, the ps side (docs/strategies.md, "lbfgs"): a shard
 * holds its slice [lo, hi) of x, g, the direction, the trial point and its
 * gradient and the m (s, y) pairs, and runs the chief's vector ops on it;
 * only scalars (partial dot products) go back.  Workers pull the point of
 * an evaluation and push each portion's gradient, which the shard
 * accumulates once per portion: a backup copy of a portion that arrives
 * second is dropped, so no portion counts twice whichever copy wins.
 *
 * Frames from the chief and from workers travel on different connections,
 * so a worker's pull can come before the chief's EVAL_BEGIN that says what
 * to serve: it waits (pending) until then.  A push can not come early (its
 * worker pulled first, on the same connection).  EVAL_END is answered only
 * when every portion is in, and the chief sends nothing until then. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/blas.h"
#include "downpour/log.h"
#include "downpour/wire.h"
#include "strategy/lbfgs_impl.h"

void lb_op_put(uint8_t *p, const lb_op *op)
{
    dp_put_u32(p, (uint32_t)op->kind);
    dp_put_u32(p + 4, op->n);
    for (int k = 0; k < LB_MAX_PAIRS; k++) {
        dp_put_u32(p + 8 + 4 * k, op->a[k]);
        dp_put_u32(p + 24 + 4 * k, op->b[k]);
    }
    dp_put_f64(p + 40, op->alpha);
}

void lb_op_get(lb_op *op, const uint8_t *p)
{
    op->kind = (lb_op_kind)dp_get_u32(p);
    op->n = dp_get_u32(p + 4);
    for (int k = 0; k < LB_MAX_PAIRS; k++) {
        op->a[k] = dp_get_u32(p + 8 + 4 * k);
        op->b[k] = dp_get_u32(p + 24 + 4 * k);
    }
    op->alpha = dp_get_f64(p + 40);
}

static float *vec(lb_shard *sh, uint32_t v)
{
    return sh->mem + (size_t)v * sh->n;
}

int lb_shard_open(lb_shard *sh, dp_transport *t, const dp_cluster *c, size_t lo, size_t hi,
                  int vectors, const float *x0, uint32_t max_portions, dp_err *err)
{
    memset(sh, 0, sizeof *sh);
    sh->t = t;
    sh->c = c;
    sh->chief = dp_cluster_rank(c, DP_ROLE_CHIEF, 0);
    sh->lo = lo;
    sh->hi = hi;
    sh->n = hi - lo;
    sh->vectors = vectors;
    sh->max_portions = max_portions;
    sh->mem = calloc((size_t)vectors * sh->n, sizeof(float));
    sh->scratch = malloc((sh->n ? sh->n : 1) * sizeof(float));
    sh->have = calloc(max_portions ? max_portions : 1, 1);
    sh->pending = calloc((size_t)c->n_tasks, sizeof *sh->pending);
    if (!sh->mem || !sh->scratch || !sh->have || !sh->pending) {
        lb_shard_free(sh);
        return dp_errf(err, "out of memory for %d L-BFGS vectors of %zu floats", vectors, sh->n);
    }
    memcpy(sh->mem, x0 + lo, sh->n * sizeof(float));
    return 0;
}

void lb_shard_resume(lb_shard *sh, const dp_train_state *r, int m)
{
    for (int i = 0; i < r->n_vecs; i++) {
        int v = lb_state_vec(r->vec_names[i], m);
        if (v >= 0 && v < sh->vectors)
            memcpy(vec(sh, (uint32_t)v), r->vecs + i * r->n_params + sh->lo,
                   sh->n * sizeof(float));
    }
}

void lb_shard_free(lb_shard *sh)
{
    free(sh->mem);
    free(sh->scratch);
    free(sh->have);
    free(sh->pending);
    memset(sh, 0, sizeof *sh);
}

static int send_slice(lb_shard *sh, int peer, uint32_t v, uint64_t step, dp_err *err)
{
    return dp_transport_send(sh->t, peer, DP_WIRE_LB_X, step, sh->lo, vec(sh, v),
                             sh->n * sizeof(float), err);
}

static int answer(lb_shard *sh, uint64_t op, uint32_t n, const double *v, dp_err *err)
{
    uint8_t b[4 + 8 * LB_MAX_PAIRS];
    dp_put_u32(b, n);
    for (uint32_t k = 0; k < n; k++)
        dp_put_f64(b + 4 + 8 * k, v[k]);
    return dp_transport_send(sh->t, sh->chief, DP_WIRE_LB_DOTS, op, 0, b, 4 + 8 * (size_t)n, err);
}

static int answer_end(lb_shard *sh, dp_err *err)
{
    double got = sh->got;
    long op = sh->end_op;
    sh->end_op = 0;
    return answer(sh, (uint64_t)op, 1, &got, err);
}

static int check_vecs(const lb_shard *sh, const lb_op *op, int na, int nb, dp_err *err)
{
    for (int k = 0; k < na; k++)
        if (op->a[k] >= (uint32_t)sh->vectors)
            return dp_errf(err, "the chief named vector %u of %d (op %d)", op->a[k], sh->vectors,
                           (int)op->kind);
    for (int k = 0; k < nb; k++)
        if (op->b[k] >= (uint32_t)sh->vectors)
            return dp_errf(err, "the chief named vector %u of %d (op %d)", op->b[k], sh->vectors,
                           (int)op->kind);
    return 0;
}

static int begin_eval(lb_shard *sh, const lb_op *op, dp_err *err)
{
    if (check_vecs(sh, op, 2, 0, err) < 0)
        return -1;
    if (op->b[1] > sh->max_portions || op->b[1] == 0 || op->b[0] == 0)
        return dp_errf(err, "the chief asked for an evaluation of %u portions over %u records "
                            "(at most %u portions here)", op->b[1], op->b[0], sh->max_portions);
    sh->eval = op->b[2];
    sh->x_vec = op->a[0];
    sh->g_vec = op->a[1];
    sh->records = op->b[0];
    sh->portions = op->b[1];
    sh->got = 0;
    memset(sh->have, 0, sh->portions);
    memset(vec(sh, sh->g_vec), 0, sh->n * sizeof(float));
    /* pulls that came before this op */
    for (int r = 0; r < sh->c->n_tasks; r++)
        if (sh->pending[r] == sh->eval) {
            sh->pending[r] = 0;
            if (send_slice(sh, r, sh->x_vec, (uint64_t)sh->eval, err) < 0)
                dp_warn("lbfgs shard: %s", err->msg); /* its loss comes as an event */
        }
    return 0;
}

static int run_op(lb_shard *sh, uint64_t seq, dp_err *err)
{
    uint8_t b[LB_OP_BYTES];
    if (dp_transport_recv_payload(sh->t, sh->chief, b, sizeof b, err) < 0)
        return -1;
    lb_op op;
    lb_op_get(&op, b);
    double out[LB_MAX_PAIRS];
    switch (op.kind) {
    case LB_OP_DOTS:
        if (op.n < 1 || op.n > LB_MAX_PAIRS)
            return dp_errf(err, "the chief asked for %u dot products (1..%d)", op.n, LB_MAX_PAIRS);
        if (check_vecs(sh, &op, (int)op.n, (int)op.n, err) < 0)
            return -1;
        for (uint32_t k = 0; k < op.n; k++)
            out[k] = dp_dot(vec(sh, op.a[k]), vec(sh, op.b[k]), sh->n);
        return answer(sh, seq, op.n, out, err);
    case LB_OP_AXPY:
        if (check_vecs(sh, &op, 1, 1, err) < 0)
            return -1;
        dp_axpy(vec(sh, op.a[0]), (float)op.alpha, vec(sh, op.b[0]), sh->n);
        return 0;
    case LB_OP_SCALE:
        if (check_vecs(sh, &op, 1, 0, err) < 0)
            return -1;
        dp_scal(vec(sh, op.a[0]), (float)op.alpha, sh->n);
        return 0;
    case LB_OP_COPY:
        if (check_vecs(sh, &op, 1, 1, err) < 0)
            return -1;
        memmove(vec(sh, op.a[0]), vec(sh, op.b[0]), sh->n * sizeof(float));
        return 0;
    case LB_OP_EVAL_BEGIN:
        return begin_eval(sh, &op, err);
    case LB_OP_EVAL_END:
        sh->end_op = (long)seq;
        return sh->got == sh->portions ? answer_end(sh, err) : 0;
    case LB_OP_SEND:
        if (check_vecs(sh, &op, 1, 0, err) < 0)
            return -1;
        return send_slice(sh, sh->chief, op.a[0], seq, err);
    default:
        return dp_errf(err, "the chief sent vector op %u, which this build does not know",
                       (unsigned)op.kind);
    }
}

/* A worker's pull: answered now, when its evaluation begins, or empty when
 * that evaluation is over. */
static int pull(lb_shard *sh, int peer, uint64_t e, dp_err *err)
{
    if ((long)e == sh->eval) {
        if (send_slice(sh, peer, sh->x_vec, e, err) < 0)
            dp_warn("lbfgs shard: %s", err->msg); /* a lost worker: the chief re-issues */
        return 0;
    }
    if ((long)e > sh->eval) {
        sh->pending[peer] = (long)e;
        return 0;
    }
    if (dp_transport_send(sh->t, peer, DP_WIRE_LB_X, e, sh->lo, NULL, 0, err) < 0)
        dp_warn("lbfgs shard: %s", err->msg);
    return 0;
}

/* A worker lost in the middle of a push: its portion is not counted, and
 * the chief hands it to another worker. */
static int lost_worker(lb_shard *sh, dp_err *err)
{
    (void)sh;
    dp_warn("lbfgs shard: %s", err->msg);
    return 0;
}

/* A portion's gradient: accumulated with weight records / batch the first
 * time, dropped after. */
static int push(lb_shard *sh, int peer, const dp_event *ev, dp_err *err)
{
    uint64_t e = ev->header.step, p = ev->header.offset;
    if (ev->header.length != LB_GRAD_HEAD + sh->n * sizeof(float))
        return dp_errf(err, "%s pushed %llu bytes for a slice of %zu floats",
                       dp_transport_peer_name(sh->t, peer),
                       (unsigned long long)ev->header.length, sh->n);
    uint8_t head[LB_GRAD_HEAD];
    if (dp_transport_recv_payload(sh->t, peer, head, sizeof head, err) < 0)
        return lost_worker(sh, err);
    uint32_t records = dp_get_u32(head);
    if ((long)e != sh->eval || p >= sh->portions || sh->have[p] || records == 0) {
        sh->dropped++;
        return dp_transport_skip_payload(sh->t, peer, err) < 0 ? lost_worker(sh, err) : 0;
    }
    if (records > sh->records)
        return dp_errf(err, "%s pushed a portion of %u records, more than the batch's %u",
                       dp_transport_peer_name(sh->t, peer), records, sh->records);
    if (dp_transport_recv_payload(sh->t, peer, sh->scratch, sh->n * sizeof(float), err) < 0)
        return lost_worker(sh, err);
    dp_axpy(vec(sh, sh->g_vec), (float)((double)records / sh->records), sh->scratch, sh->n);
    sh->have[p] = 1;
    sh->got++;
    return sh->end_op > 0 && sh->got == sh->portions ? answer_end(sh, err) : 0;
}

int lb_shard_serve(lb_shard *sh, dp_err *err)
{
    for (;;) {
        dp_event ev;
        if (dp_transport_poll(sh->t, DP_PEER_ANY, 1.0, &ev, err) < 0)
            return -1;
        if (ev.kind == DP_EVENT_TIMEOUT)
            continue;
        const char *who = dp_transport_peer_name(sh->t, ev.peer);
        if (ev.kind == DP_EVENT_PEER_LOST) {
            if (ev.peer == sh->chief)
                return dp_errf(err, "lost the chief, %s (%s): the L-BFGS coordinator is gone, "
                                    "so the run stops", who, ev.reason);
            /* a worker: the chief hands its portions to others */
            dp_info("lbfgs shard: %s is gone (%s)", who, ev.reason);
            continue;
        }
        unsigned type = ev.header.type;
        int rc;
        if (ev.peer == sh->chief && type == DP_WIRE_LB_OP) {
            if (ev.header.length != LB_OP_BYTES)
                return dp_errf(err, "the chief sent a vector op of %llu bytes (want %d)",
                               (unsigned long long)ev.header.length, LB_OP_BYTES);
            rc = run_op(sh, ev.header.step, err);
        } else if (ev.peer == sh->chief && type == DP_WIRE_SHUTDOWN) {
            if (sh->dropped)
                dp_info("lbfgs shard [%zu, %zu): %ld duplicate or late portion gradient(s) "
                        "dropped", sh->lo, sh->hi, sh->dropped);
            return 0;
        } else if (ev.peer != sh->chief && type == DP_WIRE_LB_PULL && ev.header.length == 0) {
            rc = pull(sh, ev.peer, ev.header.step, err);
        } else if (ev.peer != sh->chief && type == DP_WIRE_LB_GRAD) {
            rc = push(sh, ev.peer, &ev, err);
        } else {
            return dp_errf(err, "%s sent frame type %u (%llu bytes), which an L-BFGS shard "
                                "does not take", who, type,
                           (unsigned long long)ev.header.length);
        }
        if (rc < 0) {
            dp_err_prefix(err, "lbfgs shard [%zu, %zu)", sh->lo, sh->hi);
            return -1;
        }
    }
}
