/* pipeline: layer pipelining (GPipe, PipeDream-Flush).  The pipeline tasks
 * (the chief if any, then the workers, in rank order) are R replicas of S
 * stages: position p is stage p % S of replica p / S.  Stage s holds and
 * updates only the parameters of its layers [first[s], first[s+1])
 * (pipeline.h), which are a range [lo, hi) of the one flat buffer.
 *
 * A step cuts the batch into M micro-batches and runs this stage's schedule
 * (gpipe or 1f1b, pipeline.h): a forward takes the activations from stage
 * s-1 (stage 0: the batch itself), runs the stage's layers with one
 * activation slot per micro-batch in flight and sends the output to stage
 * s+1 (the last stage computes the loss); a backward takes the gradient at
 * that output from stage s+1 (the last stage: the loss's own), runs the
 * layers backward and sends the gradient at the input to stage s-1.  Each
 * micro-batch's gradient is weighted by its share of the step's records and
 * summed, so the sum is the gradient of the mean loss over the batch (over
 * every replica's batch, summed around a ring of the stage's R peers when R
 * > 1).  Every backward done, each stage applies one optimiser update to its
 * range: the flush.  So a pipeline equals one process at the same (global)
 * batch within float noise.
 *
 * Every stage of a replica walks the same data shard (the replica's): stage
 * 0 reads the inputs and the last stage the labels of the same batch.  The
 * last stage tells the others the step's loss, so every stage's step lines
 * carry it.  Position 0 (stage 0 of replica 0) evaluates: at each epoch's end
 * the stages of replica 0 send it their parameters, and at a checkpoint their
 * optimiser state too.
 *
 * Buffers (batch norm's running statistics): the stage that holds a bn layer
 * holds its buffers, [blo, bhi) of the flat buffer array.  Each micro-batch
 * normalises with its own statistics and moves the running ones in
 * micro-batch order (GPipe's rule, PyTorch's Pipe without SyncBatchNorm);
 * the scratch model pm moves them and each step ends with them copied into
 * the loop's model.  Replicas keep their own.  Replica 0's stages send theirs
 * to position 0 (DP_WIRE_PIPE_BUFFERS) after their parameters at each
 * epoch's end and after their state at each checkpoint, so position 0
 * evaluates, checkpoints and saves with them (docs/strategies.md, "Buffers").
 *
 * Idle time (waiting for a neighbour) and the schedule's time are measured
 * per stage; position 0 reports the measured bubble beside the ideal
 * (S-1)/(M+S-1) each epoch.  Activations and their gradients go out from a
 * send thread (sender.h), so two neighbours sending each other more than the
 * sockets hold never wait for each other.  A lost stage cannot be replaced mid-batch: the
 * stages stop with a message naming it, and under `launch --max-restarts`
 * with --checkpoint-dir every task starts again from the newest checkpoint
 * (restarts_all; docs/faults.md). */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/clip.h"
#include "downpour/group.h"
#include "downpour/clock.h"
#include "downpour/log.h"
#include "downpour/pipeline.h"
#include "downpour/ring.h"
#include "downpour/strategy.h"
#include "downpour/wire.h"
#include "downpour/sender.h"
#include "strategy/buffers_wire.h"

#define STATS_BYTES (5 * 8 + 2 * 4)
#define LOSS_BYTES (8 + 4)

struct dp_strategy {
    const dp_run_env *env;
    dp_model *m;          /* the loop's: params (this stage's range live), grads (the sum) */
    dp_model pm;          /* activation scratch for `slots` micro-batches of micro_max rows;
                             pm.grads: one micro-batch's gradients */
    dp_optim opt;         /* over [lo, hi) */
    dp_transport *t;
    int n, S, R, M;       /* pipeline tasks, stages, replicas, micro-batches */
    int position, stage, replica;
    int *ranks;           /* transport rank of each position */
    int first[DP_PIPE_MAX_STAGES + 1];
    int a, b;             /* this stage's layers [a, b) */
    size_t lo, hi;        /* and their parameters */
    size_t blo, bhi;      /* and their buffers (batch norm's statistics), which pm moves */
    int in_w, out_w;      /* widths at the stage's input and output */
    dp_pipe_schedule kind;
    dp_pipe_action *plan; /* room for 2M actions */
    int slots, micro_max;
    float *in;            /* stage > 0: received activations, one slot per micro-batch held */
    float *din;           /* stage > 0: the gradients sent back, one slot per micro-batch */
    float *dout;          /* not the last: the gradient received */
    double timeout;
    dp_sender *tx;           /* activations and gradients out */
    long *act_seq, *din_seq; /* per slot: the send of what it holds (dp_sender_wait) */
    dp_ring ring;         /* R > 1: this stage's peers in the other replicas */
    int ring_open;
    dp_shard_policy policy;
    uint32_t *sizes;      /* R > 1: each replica's shard, for the step's weights */
    double idle, span;    /* this epoch: s waiting for a neighbour, s in the schedules */
    int held, peak;       /* micro-batches whose activations are held: now, at most */
    int peak_run;         /* at most, over the run */
    /* position 0, at an epoch's end: per stage, summed over the replicas */
    double *stage_idle, *stage_span;
    int *stage_peak;
    dp_group g;           /* the positions, each loss named (group.h) */
};

/* Waits until the frame seq is out: the neighbour has not read it yet, so
 * the wait is idle time. */
static int wait_sent(dp_strategy *s, long seq, dp_err *err)
{
    double t0 = dp_now();
    int rank;
    if (dp_sender_wait(s->tx, seq, &rank, err) < 0)
        return dp_group_lost_rank(&s->g, rank, err);
    s->idle += dp_now() - t0;
    return 0;
}

static int queue_send(dp_strategy *s, long *seq, int p, unsigned type, long step, int k,
                      const float *buf, size_t len, dp_err *err)
{
    int rank;
    *seq = dp_sender_push(s->tx, s->ranks[p], type, (uint64_t)step, (uint64_t)k, buf, len, &rank,
                          err);
    return *seq < 0 ? dp_group_lost_rank(&s->g, rank, err) : 0;
}

/* A group receive (group.h) whose wait is idle time: a neighbour's frame
 * (of micro-batch `micro`, in the offset) not here yet. */
static int recv_timed(dp_strategy *s, int p, unsigned type, long step, uint64_t micro, void *dst,
                      size_t len, const char *what, dp_err *err)
{
    double t0 = dp_now();
    int rc = dp_group_recv(&s->g, p, type, step, micro, dst, len, what, err);
    s->idle += dp_now() - t0;
    return rc;
}

/* grads[lo, hi) = w g (the first micro-batch) or += w g. */
static void accumulate(dp_strategy *s, float w, int first)
{
    float *restrict acc = s->m->grads + s->lo;
    const float *restrict g = s->pm.grads + s->lo;
    size_t n = s->hi - s->lo;
    if (first)
        for (size_t i = 0; i < n; i++)
            acc[i] = w * g[i];
    else
        for (size_t i = 0; i < n; i++)
            acc[i] += w * g[i];
}

/* This stage's buffers, as pm moved them, into the loop's model. */
static void keep_buffers(dp_strategy *s)
{
    if (s->bhi > s->blo)
        memcpy(s->m->buffers + s->blo, s->pm.buffers + s->blo,
               (s->bhi - s->blo) * sizeof(float));
}

/* One micro-batch forward: in from stage s-1 (or the batch), out to stage
 * s+1 (or the loss). */
static int forward(dp_strategy *s, const float *x, const uint8_t *y, int k, int rows, int off,
                   long step, double *loss_sum, int *correct, dp_err *err)
{
    int slot = k % s->slots;
    const float *params = s->m->params;
    const float *in = x + (size_t)off * s->in_w;
    if (s->stage > 0) {
        float *buf = s->in + (size_t)slot * s->micro_max * s->in_w;
        if (recv_timed(s, s->position - 1, DP_WIRE_PIPE_ACT, step, (uint64_t)k, buf,
                       (size_t)rows * s->in_w * sizeof(float), "activations", err) < 0)
            return -1;
        in = buf;
    }
    if (s->stage == s->S - 1) {
        float loss = dp_model_forward_range_loss(&s->pm, slot, params, in, y + off, s->a, rows,
                                                 correct);
        *loss_sum += (double)loss * rows;
    } else {
        /* the slot's output may still be on its way to the next stage */
        if (wait_sent(s, s->act_seq[slot], err) < 0)
            return -1;
        const float *out = dp_model_forward_range(&s->pm, slot, params, in, s->a, s->b, rows);
        if (!out)
            return dp_errf(err, "pipeline stage %d: forward of layers [%d, %d) failed", s->stage,
                           s->a, s->b);
        if (queue_send(s, &s->act_seq[slot], s->position + 1, DP_WIRE_PIPE_ACT, step, k, out,
                       (size_t)rows * s->out_w * sizeof(float), err) < 0)
            return -1;
    }
    if (++s->held > s->peak)
        s->peak = s->held;
    return 0;
}

/* One micro-batch backward: the gradient at the output from stage s+1 (or
 * the loss), the gradient at the input to stage s-1; this stage's gradients
 * summed with weight w. */
static int backward(dp_strategy *s, const float *x, const uint8_t *y, int k, int rows, int off,
                    long step, float w, int first, dp_err *err)
{
    int slot = k % s->slots;
    const float *params = s->m->params;
    const float *in = s->stage > 0 ? s->in + (size_t)slot * s->micro_max * s->in_w
                                   : x + (size_t)off * s->in_w;
    float *din = NULL;
    if (s->stage > 0) {
        din = s->din + (size_t)slot * s->micro_max * s->in_w;
        if (wait_sent(s, s->din_seq[slot], err) < 0)
            return -1;
    }
    int rc;
    if (s->stage == s->S - 1) {
        rc = dp_model_backward_range_loss(&s->pm, slot, din, s->pm.grads, params, in, y + off,
                                          s->a, rows);
    } else {
        if (recv_timed(s, s->position + 1, DP_WIRE_PIPE_GRAD, step, (uint64_t)k, s->dout,
                       (size_t)rows * s->out_w * sizeof(float), "activation gradients", err) < 0)
            return -1;
        rc = dp_model_backward_range(&s->pm, slot, din, s->pm.grads, params, s->dout, in, s->a,
                                     s->b, rows);
    }
    if (rc < 0)
        return dp_errf(err, "pipeline stage %d: backward of layers [%d, %d) failed", s->stage,
                       s->a, s->b);
    if (din && queue_send(s, &s->din_seq[slot], s->position - 1, DP_WIRE_PIPE_GRAD, step, k, din,
                          (size_t)rows * s->in_w * sizeof(float), err) < 0)
        return -1;
    accumulate(s, w, first);
    s->held--;
    return 0;
}

/* The last stage tells the replica's other stages the step's loss; a loss
 * that is not finite stops every stage with the same message. */
static int share_loss(dp_strategy *s, long step, double *loss_sum, int *correct, dp_err *err)
{
    int last = s->position - s->stage + s->S - 1;
    uint8_t b[LOSS_BYTES];
    if (s->stage == s->S - 1) {
        dp_put_f64(b, *loss_sum);
        dp_put_u32(b + 8, (uint32_t)*correct);
        for (int p = last - s->S + 1; p < last; p++)
            if (dp_group_send(&s->g, p, DP_WIRE_PIPE_LOSS, step, 0, b, sizeof b, err) < 0)
                return -1;
    } else {
        if (recv_timed(s, last, DP_WIRE_PIPE_LOSS, step, 0, b, sizeof b, "the step's loss",
                       err) < 0)
            return -1;
        *loss_sum = dp_get_f64(b);
        *correct = (int)dp_get_u32(b + 8);
    }
    if (!isfinite(*loss_sum))
        return dp_errf(err, "the loss became %g at step %ld: lower the learning rate (--lr)",
                       *loss_sum, step);
    return 0;
}

/* --clip-norm (docs/training.md, "Gradient clipping"): the whole
 * gradient's norm is the stages' parts summed.  Each stage sends its sum of
 * squares to the replica's other stages and adds all S in stage order, so
 * every stage, and every replica (the ring gave each the same sums), scales
 * by the same coefficient.  Everything queued is out already (share_loss
 * came after wait_sent), so these frames follow the step's in order. */
static int clip_stages(dp_strategy *s, long step, dp_err *err)
{
    size_t len = s->hi > s->lo ? s->hi - s->lo : 0;
    double part = dp_grad_sumsq(s->m->grads + s->lo, len), sum = 0;
    int first = s->position - s->stage;
    uint8_t b[8];
    dp_put_f64(b, part);
    for (int q = 0; q < s->S; q++)
        if (q != s->stage &&
            dp_group_send(&s->g, first + q, DP_WIRE_PIPE_NORM, step, (uint64_t)s->stage, b, 8,
                          err) < 0)
            return -1;
    for (int q = 0; q < s->S; q++) {
        double v = part;
        if (q != s->stage) {
            if (recv_timed(s, first + q, DP_WIRE_PIPE_NORM, step, (uint64_t)q, b, 8,
                           "a stage's part of the gradient norm", err) < 0)
                return -1;
            v = dp_get_f64(b);
        }
        sum += v;
    }
    dp_grad_scale(s->m->grads + s->lo, len, dp_clip_coef(sum, s->env->cfg->clip_norm));
    return 0;
}

static int pipe_step(dp_strategy *s, const float *x, const uint8_t *y, int n, float lr,
                     long step, dp_step_out *out, dp_err *err)
{
    out->loss = 0;
    out->correct = 0;
    double total = dp_group_step_records(s->sizes, s->R, step, s->env->steps_per_epoch,
                                         s->env->cfg->batch, n);
    if (n > 0) {
        double t0 = dp_now(), loss_sum = 0;
        int correct = 0, M = n < s->M ? n : s->M;
        int na = dp_pipe_schedule_make(s->plan, s->kind, s->stage, s->S, M);
        int done = 0; /* backwards so far */
        for (int i = 0; i < na; i++) {
            int k = s->plan[i].micro, off, rows = dp_pipe_micro_size(n, M, k, &off);
            int rc = s->plan[i].op == DP_PIPE_FORWARD
                         ? forward(s, x, y, k, rows, off, step, &loss_sum, &correct, err)
                         : backward(s, x, y, k, rows, off, step, (float)(rows / total),
                                    done++ == 0, err);
            if (rc < 0)
                return -1;
        }
        /* everything out before the frames sent inline (one order per peer) */
        if (wait_sent(s, dp_sender_last(s->tx), err) < 0 ||
            share_loss(s, step, &loss_sum, &correct, err) < 0)
            return -1;
        s->span += dp_now() - t0;
        keep_buffers(s);
        out->loss = (float)(loss_sum / n);
        out->correct = correct;
    } else if (s->hi > s->lo) {
        /* a shard that ran out still takes part in the replicas' sum */
        memset(s->m->grads + s->lo, 0, (s->hi - s->lo) * sizeof(float));
    }
    if (s->R > 1 && s->hi > s->lo &&
        dp_ring_allreduce(&s->ring, s->m->grads + s->lo, s->hi - s->lo, (uint64_t)step, 0, err) <
            0)
        return -1;
    if (s->env->cfg->clip_norm > 0 && clip_stages(s, step, err) < 0)
        return -1;
    if (total > 0)
        dp_optim_apply(&s->opt, s->m->params + s->lo, s->m->grads + s->lo, lr);
    return 0;
}

/* ---------------------------------------------------------- the epoch's end */

/* Replica 0's stage -> position 0: [u32 count][count f32], its buffers
 * [blo, bhi), offset blo, step the epoch or the checkpoint step.  A stage
 * without buffers sends nothing (position 0 knows the ranges). */
static int send_buffers(dp_strategy *s, long step, dp_err *err)
{
    size_t n = s->bhi - s->blo;
    if (!n)
        return 0;
    if (dp_buffers_send(s->t, s->ranks[0], DP_WIRE_PIPE_BUFFERS, (uint64_t)step, s->blo,
                        s->m->buffers + s->blo, n, err) < 0)
        return dp_group_lost(&s->g, 0, err);
    return 0;
}

/* Position 0: position p's buffers (send_buffers) into buffers + lo, where
 * [lo, hi) is what its layers hold in the model; a frame of another step,
 * offset, length or count is refused naming the stage. */
static int recv_buffers(dp_strategy *s, int p, long step, float *buffers, dp_err *err)
{
    int stage = p % s->S;
    size_t lo, hi;
    dp_pipe_buffer_range(s->m, s->first[stage], s->first[stage + 1], &lo, &hi);
    size_t n = hi - lo;
    if (!n)
        return 0;
    double t0 = dp_now();
    dp_event ev;
    if (dp_transport_recv(s->t, s->ranks[p], "its buffers", s->timeout, &ev, err) < 0)
        return dp_group_lost(&s->g, p, err);
    s->idle += dp_now() - t0;
    const char *who = dp_group_name(&s->g, p);
    if (ev.header.type != DP_WIRE_PIPE_BUFFERS || ev.header.step != (uint64_t)step ||
        ev.header.offset != lo)
        return dp_errf(err, "%s sent frame type %u (step %llu, offset %llu) instead of its "
                            "buffers for step %ld from buffer %zu", who, ev.header.type,
                       (unsigned long long)ev.header.step, (unsigned long long)ev.header.offset,
                       step, lo);
    char holder[DP_MAX_SPEC + 32];
    snprintf(holder, sizeof holder, "stage %d of model %s", stage, s->m->name);
    int rc = dp_buffers_recv(s->t, &ev, who, holder, buffers + lo, n, err);
    return rc == -2 ? dp_group_lost(&s->g, p, err) : rc;
}

/* Epoch figures to position 0: loss sum, records, correct, idle s, schedule s,
 * peak micro-batches held, stage. */
static int send_stats(dp_strategy *s, int epoch, const dp_epoch_stats *st, dp_err *err)
{
    uint8_t b[STATS_BYTES];
    dp_put_f64(b, st->loss_sum);
    dp_put_f64(b + 8, st->records);
    dp_put_f64(b + 16, st->correct);
    dp_put_f64(b + 24, s->idle);
    dp_put_f64(b + 32, s->span);
    dp_put_u32(b + 40, (uint32_t)s->peak);
    dp_put_u32(b + 44, (uint32_t)s->stage);
    if (dp_group_send(&s->g, 0, DP_WIRE_PIPE_STATS, epoch, 0, b, sizeof b, err) < 0)
        return -1;
    /* replica 0's stages: their parameters for the evaluation */
    if (s->replica == 0 &&
        (dp_group_send(&s->g, 0, DP_WIRE_PIPE_PARAMS, epoch, s->lo, s->m->params + s->lo,
                       (s->hi - s->lo) * sizeof(float), err) < 0 ||
         send_buffers(s, epoch, err) < 0))
        return -1;
    return 0;
}

/* Position 0: the measured bubble per stage and overall, beside the ideal. */
static void report_bubble(dp_strategy *s, int epoch)
{
    char per[512];
    size_t len = 0;
    double idle = 0, all = 0;
    int peak = 0;
    for (int k = 0; k < s->S; k++) {
        double f = s->stage_span[k] > 0 ? s->stage_idle[k] / s->stage_span[k] : 0;
        idle += s->stage_idle[k];
        all += s->stage_span[k];
        peak = s->stage_peak[k] > peak ? s->stage_peak[k] : peak;
        if (len < sizeof per)
            len += (size_t)snprintf(per + len, sizeof per - len, "%s%.3f", k ? " " : "", f);
    }
    double bubble = all > 0 ? idle / all : 0;
    double ideal = (double)(s->S - 1) / (s->M + s->S - 1);
    dp_info("Pipeline epoch %d: bubble %.3f measured (stages %s), ideal (S-1)/(M+S-1) = %.3f; "
            "at most %d micro-batch(es) of activations held by a stage (%s)",
            epoch, bubble, per, ideal, peak, dp_pipe_schedule_name(s->kind));
    dp_metrics_event(s->env->metrics, "pipeline", DP_F_INT, "epoch", (long)epoch, DP_F_INT,
                     "stages", (long)s->S, DP_F_INT, "micro_batches", (long)s->M, DP_F_STR,
                     "schedule", dp_pipe_schedule_name(s->kind), DP_F_NUM, "bubble", bubble,
                     DP_F_NUM, "ideal_bubble", ideal, DP_F_INT, "peak_micro_batches",
                     (long)peak, DP_F_END);
}

/* Position 0: every other position's figures (the loss from each replica's
 * stage 0, the bubble from all) and replica 0's parameters. */
static int gather_epoch(dp_strategy *s, int epoch, dp_epoch_stats *st, dp_err *err)
{
    for (int k = 0; k < s->S; k++) {
        s->stage_idle[k] = s->stage_span[k] = 0;
        s->stage_peak[k] = 0;
    }
    s->stage_idle[0] = s->idle;
    s->stage_span[0] = s->span;
    s->stage_peak[0] = s->peak;
    for (int p = 1; p < s->n; p++) {
        uint8_t b[STATS_BYTES];
        if (recv_timed(s, p, DP_WIRE_PIPE_STATS, epoch, 0, b, sizeof b, "its epoch figures",
                       err) < 0)
            return -1;
        uint32_t stage = dp_get_u32(b + 44);
        if (stage != (uint32_t)(p % s->S))
            return dp_errf(err, "%s says it is stage %u, but position %d is stage %d",
                           dp_group_name(&s->g, p), stage, p, p % s->S);
        if (stage == 0) {
            st->loss_sum += dp_get_f64(b);
            st->records += dp_get_f64(b + 8);
            st->correct += dp_get_f64(b + 16);
        }
        s->stage_idle[stage] += dp_get_f64(b + 24);
        s->stage_span[stage] += dp_get_f64(b + 32);
        int pk = (int)dp_get_u32(b + 40);
        s->stage_peak[stage] = pk > s->stage_peak[stage] ? pk : s->stage_peak[stage];
        if (p < s->S) {
            size_t lo, hi;
            dp_pipe_param_range(s->m, s->first[p], s->first[p + 1], &lo, &hi);
            if (recv_timed(s, p, DP_WIRE_PIPE_PARAMS, epoch, lo, s->m->params + lo,
                           (hi - lo) * sizeof(float), "its parameters", err) < 0 ||
                recv_buffers(s, p, epoch, s->m->buffers, err) < 0)
                return -1;
        }
    }
    report_bubble(s, epoch);
    return 0;
}

static int pipe_epoch_end(dp_strategy *s, int epoch, dp_epoch_stats *st, dp_err *err)
{
    int rc = s->position == 0 ? gather_epoch(s, epoch, st, err) : send_stats(s, epoch, st, err);
    s->idle = s->span = 0;
    s->peak_run = s->peak > s->peak_run ? s->peak : s->peak_run;
    s->peak = 0;
    return rc;
}

static const float *pipe_params(dp_strategy *s, dp_weights which, dp_err *err)
{
    (void)which, (void)err;
    return s->m->params;
}

/* ------------------------------------------------------------ checkpoints */

/* Replica 0's stages hand position 0 their parameters and optimiser slots
 * (slot k of the checkpoint is k * n_params + lo); replicas hold the same. */
static int pipe_save(dp_strategy *s, long step, dp_train_state *st, dp_err *err)
{
    size_t np = s->m->n_params, n = s->hi - s->lo;
    int slots = dp_optim_slots(s->opt.cfg.kind);
    if (s->replica != 0)
        return 0;
    if (s->position != 0) {
        uint8_t head[8];
        dp_put_u64(head, (uint64_t)s->opt.t);
        struct iovec iov[3] = {{head, sizeof head},
                               {s->m->params + s->lo, n * sizeof(float)},
                               {s->opt.state, n * (size_t)slots * sizeof(float)}};
        if (dp_transport_sendv(s->t, s->ranks[0], DP_WIRE_PIPE_STATE, (uint64_t)step, s->lo, iov,
                               slots && n ? 3 : 2, err) < 0)
            return dp_group_lost(&s->g, 0, err);
        return send_buffers(s, step, err);
    }
    memcpy(st->params + s->lo, s->m->params + s->lo, n * sizeof(float));
    for (int k = 0; k < slots && k < st->n_slots; k++)
        memcpy(st->slots + k * np + s->lo, s->opt.state + k * n, n * sizeof(float));
    st->optim_t = s->opt.t;
    for (int p = 1; p < s->S; p++) {
        size_t lo, hi;
        dp_pipe_param_range(s->m, s->first[p], s->first[p + 1], &lo, &hi);
        size_t pn = hi - lo, len = 8 + pn * (1 + (size_t)slots) * sizeof(float);
        dp_event ev;
        if (dp_transport_recv(s->t, s->ranks[p], "its checkpoint state", s->timeout, &ev, err) < 0)
            return dp_group_lost(&s->g, p, err);
        if (ev.header.type != DP_WIRE_PIPE_STATE || ev.header.step != (uint64_t)step ||
            ev.header.offset != lo || ev.header.length != len)
            return dp_errf(err, "%s sent frame type %u (%llu bytes) instead of its state for "
                                "checkpoint %ld (%zu bytes)",
                           dp_group_name(&s->g, p), ev.header.type,
                           (unsigned long long)ev.header.length, step, len);
        uint8_t head[8];
        if (dp_transport_recv_payload(s->t, s->ranks[p], head, sizeof head, err) < 0 ||
            dp_transport_recv_payload(s->t, s->ranks[p], st->params + lo, pn * sizeof(float),
                                      err) < 0)
            return dp_group_lost(&s->g, p, err);
        for (int k = 0; k < slots; k++)
            if (dp_transport_recv_payload(s->t, s->ranks[p], st->slots + k * np + lo,
                                          pn * sizeof(float), err) < 0)
                return dp_group_lost(&s->g, p, err);
        if ((long)dp_get_u64(head) != s->opt.t)
            return dp_errf(err, "%s has applied %ld updates but stage 0 %ld at checkpoint %ld",
                           dp_group_name(&s->g, p), (long)dp_get_u64(head), s->opt.t, step);
        /* the checkpoint writes the model's buffers (st's when it holds them) */
        if (recv_buffers(s, p, step, s->m->buffers, err) < 0)
            return -1;
    }
    if (st->buffers && st->n_buffers == s->m->n_buffers && s->m->n_buffers)
        memcpy(st->buffers, s->m->buffers, s->m->n_buffers * sizeof(float));
    return 1;
}

/* SIGTERM (docs/faults.md, "Draining"): no stage can leave a running
 * pipeline, whose layers it alone holds, so the drain is refused in words
 * after the step (its micro-batches are through), and the stage's end is
 * a lost stage's (every task restarted from the newest checkpoint, or the
 * run stops). */
static int pipe_leave(dp_strategy *s, long steps, dp_err *err)
{
    return dp_errf(err, "SIGTERM: pipeline stage %d of replica %d holds layers no other task "
                        "has, so it cannot drain; it stops after step %ld, a lost stage",
                   s->stage, s->replica, steps);
}

static int pipe_finish(dp_strategy *s, long steps, dp_err *err)
{
    (void)err;
    int peak = s->peak > s->peak_run ? s->peak : s->peak_run;
    dp_metrics_event(s->env->metrics, "stage", DP_F_INT, "stage", (long)s->stage, DP_F_INT,
                     "replica", (long)s->replica, DP_F_INT, "steps", steps, DP_F_INT,
                     "peak_micro_batches", (long)peak, DP_F_INT, "slots", (long)s->slots,
                     DP_F_END);
    return 0;
}

/* ---------------------------------------------------------------- opening */

static void pipe_close(dp_strategy *s)
{
    if (!s)
        return;
    dp_sender_close(s->tx);
    if (s->ring_open)
        dp_ring_free(&s->ring);
    dp_optim_free(&s->opt);
    dp_model_free(&s->pm);
    free(s->ranks);
    free(s->plan);
    free(s->in);
    free(s->din);
    free(s->dout);
    free(s->act_seq);
    free(s->din_seq);
    free(s->sizes);
    free(s->stage_idle);
    free(s->stage_span);
    free(s->stage_peak);
    free(s);
}

/* The pipeline's settings: a new option is a field here and a line in
 * opts below. */
typedef struct pipe_settings {
    int stages;           /* stages per replica (0: every task is a stage) */
    int micro_batches;    /* micro-batches a batch is cut into (4) */
    const char *schedule; /* gpipe or 1f1b (NULL: 1f1b) */
    const char *split;    /* "a,b,..." where stages 1.. start; NULL: balanced */
} pipe_settings;
_Static_assert(sizeof(pipe_settings) <= DP_STRATEGY_CFG_MAX, "pipeline settings too big");
static const pipe_settings pipe_defaults = {.micro_batches = 4};
static const dp_strategy_conf pipe_conf;

/* Stages, replicas and micro-batches from the flags and the cluster. */
static int plan_stages(dp_strategy *s, const dp_train_config *cfg, dp_err *err)
{
    const pipe_settings *ps = dp_strategy_settings(cfg, &pipe_conf);
    int S = ps->stages;
    if (S <= 0 && ps->split) {
        if ((S = dp_pipe_split_count(ps->split, err)) < 0)
            return -1;
    } else if (S <= 0) {
        S = s->n;
    }
    if (S > DP_PIPE_MAX_STAGES || s->n % S != 0)
        return dp_errf(err, "--stages %d: the %d pipeline task(s) (chief and workers) are not a "
                            "whole number of pipelines of %d stages. Hint: launch --workers %d "
                            "(or a multiple) for %d stages",
                       S, s->n, S, S, S);
    s->S = S;
    s->R = s->n / S;
    s->g = (dp_group){.t = s->t, .ranks = s->ranks, .n = s->n, .width = S,
                      .member = "pipeline stage",
                      .cost = "a pipeline cannot go on without one of its stages",
                      .timeout = s->timeout};
    if (dp_pipe_partition(s->first, s->m, S, ps->split, err) < 0)
        return -1;
    s->M = ps->micro_batches > 0 ? ps->micro_batches : 4;
    if (s->M > cfg->batch) {
        if (ps->micro_batches > 0)
            return dp_errf(err, "--micro-batches %d: a batch of %d records cannot be cut into "
                                "more micro-batches than records", s->M, cfg->batch);
        s->M = cfg->batch;
    }
    if (s->M > DP_PIPE_MAX_MICRO)
        return dp_errf(err, "--micro-batches %d: at most %d", s->M, DP_PIPE_MAX_MICRO);
    s->kind = DP_PIPE_1F1B;
    if (ps->schedule && dp_pipe_schedule_parse(ps->schedule, &s->kind, err) < 0)
        return -1;
    return 0;
}

/* This stage's layers, buffers and optimiser. */
static int open_stage(dp_strategy *s, const dp_train_config *cfg, dp_err *err)
{
    s->stage = s->position % s->S;
    s->replica = s->position / s->S;
    s->a = s->first[s->stage];
    s->b = s->first[s->stage + 1];
    dp_pipe_param_range(s->m, s->a, s->b, &s->lo, &s->hi);
    dp_pipe_buffer_range(s->m, s->a, s->b, &s->blo, &s->bhi);
    s->in_w = s->m->layers[s->a].in;
    s->out_w = s->m->layers[s->b - 1].out;
    s->micro_max = (cfg->batch + s->M - 1) / s->M;
    s->plan = malloc((size_t)2 * s->M * sizeof *s->plan);
    if (!s->plan)
        return dp_errf(err, "out of memory");
    int na = dp_pipe_schedule_make(s->plan, s->kind, s->stage, s->S, s->M);
    s->slots = dp_pipe_schedule_peak(s->plan, na);
    if (dp_model_init(&s->pm, cfg->model, s->micro_max, s->slots, err) < 0)
        return -1;
    if (s->pm.n_buffers != s->m->n_buffers)
        return dp_errf(err, "pipeline: model %s has %zu buffers, the stage's copy %zu",
                       s->m->name, s->m->n_buffers, s->pm.n_buffers);
    /* the buffers as the loop's model has them: initial, or the resumed file's */
    if (s->m->n_buffers)
        memcpy(s->pm.buffers, s->m->buffers, s->m->n_buffers * sizeof(float));
    size_t in_floats = (size_t)s->micro_max * s->in_w;
    if (s->stage > 0) {
        s->in = malloc((size_t)s->slots * in_floats * sizeof(float));
        s->din = malloc((size_t)s->slots * in_floats * sizeof(float));
        if (!s->in || !s->din)
            return dp_errf(err, "out of memory for %d micro-batches of activations", s->slots);
    }
    if (s->stage < s->S - 1 &&
        !(s->dout = malloc((size_t)s->micro_max * s->out_w * sizeof(float))))
        return dp_errf(err, "out of memory");
    s->act_seq = calloc((size_t)s->slots, sizeof *s->act_seq);
    s->din_seq = calloc((size_t)s->slots, sizeof *s->din_seq);
    if (!s->act_seq || !s->din_seq)
        return dp_errf(err, "out of memory");
    if (dp_sender_open(&s->tx, s->t, 2 * s->M + 2, err) < 0 ||
        dp_optim_init(&s->opt, &cfg->optim, s->hi - s->lo, err) < 0)
        return -1;
    const dp_train_state *r = s->env->resume;
    if (r) {
        size_t n = s->hi - s->lo;
        for (int k = 0; k < dp_optim_slots(s->opt.cfg.kind) && n; k++)
            memcpy(s->opt.state + k * n, r->slots + k * s->m->n_params + s->lo,
                   n * sizeof(float));
        s->opt.t = r->optim_t;
    }
    if (s->position == 0) {
        s->stage_idle = calloc((size_t)s->S, sizeof *s->stage_idle);
        s->stage_span = calloc((size_t)s->S, sizeof *s->stage_span);
        s->stage_peak = calloc((size_t)s->S, sizeof *s->stage_peak);
        if (!s->stage_idle || !s->stage_span || !s->stage_peak)
            return dp_errf(err, "out of memory");
    }
    return 0;
}

/* R > 1: the stage's peers in the other replicas sum their gradients. */
static int open_replicas(dp_strategy *s, const dp_train_config *cfg, dp_err *err)
{
    if (s->R == 1)
        return 0;
    if (!s->env->train) /* the replicas' shard sizes come from it */
        return dp_errf(err, "pipeline: %d replicas need the training split", s->R);
    int ranks[DP_CLUSTER_MAX_TASKS];
    for (int r = 0; r < s->R; r++)
        ranks[r] = s->ranks[r * s->S + s->stage];
    if (dp_ring_init(&s->ring, s->t, ranks, s->R, s->timeout, 0, err) < 0)
        return -1;
    s->ring_open = 1;
    s->policy = cfg->shard;
    s->sizes = malloc((size_t)s->R * sizeof *s->sizes);
    if (!s->sizes)
        return dp_errf(err, "out of memory");
    for (int r = 0; r < s->R; r++)
        s->sizes[r] = dp_shard_size(s->policy, s->env->train,
                                    s->policy == DP_SHARD_OFF ? 0 : r,
                                    s->policy == DP_SHARD_OFF ? 1 : s->R);
    return 0;
}

static int pipe_open(dp_strategy **out, const dp_run_env *env, dp_task_info *info, dp_err *err)
{
    const dp_train_config *cfg = env->cfg;
    dp_strategy *s = calloc(1, sizeof *s);
    if (!s)
        return dp_errf(err, "out of memory");
    s->env = env;
    s->m = env->model;
    s->t = env->node->transport;
    s->timeout = cfg->collective_timeout > 0 ? cfg->collective_timeout : 300;
    if ((s->n = dp_split_positions(env, "pipeline", &s->ranks, &s->position, err)) < 0) {
        pipe_close(s);
        return -1;
    }
    if (plan_stages(s, cfg, err) < 0 || open_stage(s, cfg, err) < 0 ||
        open_replicas(s, cfg, err) < 0) {
        pipe_close(s);
        return -1;
    }
    info->part = DP_PART_TRAINER;
    info->evaluator = s->position == 0;
    info->live_params = 0; /* only this stage's slice is live between epochs */
    info->shard_index = s->replica;
    info->shard_count = s->R;
    info->replicas = s->R;
    if (env->node->self->role == DP_ROLE_CHIEF)
        snprintf(info->label, sizeof info->label, "Chief (stage %d)", s->stage);
    else
        snprintf(info->label, sizeof info->label, "Worker %d (stage %d)", env->node->self->index,
                 s->stage);
    dp_info("%s: pipeline stage %d of %d (replica %d of %d): layers [%d, %d), parameters "
            "[%zu, %zu), %d activation slot(s)",
            env->node->self->name, s->stage, s->S, s->replica, s->R, s->a, s->b, s->lo, s->hi,
            s->slots);
    if (s->position == 0)
        dp_info("pipeline: %d stage(s) x %d replica(s), %d micro-batches of up to %d records, "
                "schedule %s, global batch %d; ideal bubble (S-1)/(M+S-1) = %.3f",
                s->S, s->R, s->M, s->micro_max, dp_pipe_schedule_name(s->kind),
                cfg->batch * s->R, (double)(s->S - 1) / (s->M + s->S - 1));
    *out = s;
    return 0;
}

#define F(field) offsetof(pipe_settings, field)
static const dp_opt pipe_opts[] = {
    {"stages", DP_OPT_INT, F(stages), "S", "pipeline: stages of each pipeline (0: every task is a stage)", 0, DP_PIPE_MAX_STAGES, 0},
    {"micro-batches", DP_OPT_INT, F(micro_batches), "M", "pipeline: micro-batches each batch is cut into", 1, DP_PIPE_MAX_MICRO, 0},
    {"schedule", DP_OPT_STR, F(schedule), "NAME", "pipeline: gpipe or 1f1b (default: 1f1b)", 0, 0, 0},
    {"split", DP_OPT_STR, F(split), "A,B,..", "pipeline: layers where stages 1.. start (default: balanced by FLOPs)", 0, 0, 0},
};
#undef F

static int pipe_foreign(const void *own, const dp_train_config *cfg, dp_err *err)
{
    (void)cfg;
    const pipe_settings *p = own;
    if (p->stages != 0 || p->micro_batches != pipe_defaults.micro_batches || p->schedule ||
        p->split)
        return dp_errf(err, "--stages, --micro-batches, --schedule and --split are for "
                            "--strategy pipeline");
    return 0;
}

/* The flags against each other, the batch and the model (the cluster's
 * size is checked when the stages open). */
static int pipe_check(const void *own, const dp_train_config *cfg, dp_err *err)
{
    const pipe_settings *p = own;
    dp_pipe_schedule kind;
    if (p->schedule && dp_pipe_schedule_parse(p->schedule, &kind, err) < 0) {
        dp_err_prefix(err, "--schedule");
        return -1;
    }
    int stages = p->stages;
    if (p->split) {
        int n = dp_pipe_split_count(p->split, err);
        if (n < 0)
            return -1;
        if (stages > 0 && stages != n)
            return dp_errf(err, "--split '%s' makes %d stages, but --stages says %d", p->split,
                           n, stages);
        stages = n;
    }
    if (p->micro_batches > cfg->batch)
        return dp_errf(err, "--micro-batches %d: a batch of %d records (--batch) cannot be cut "
                            "into more micro-batches than records", p->micro_batches,
                       cfg->batch);
    if (stages == 0)
        return 0;
    dp_model m;
    dp_err merr;
    if (dp_model_describe(&m, cfg->model, &merr) < 0)
        return 0; /* the run says what is wrong with --model */
    int first[DP_PIPE_MAX_STAGES + 1];
    int rc = dp_pipe_partition(first, &m, stages, p->split, err);
    dp_model_free(&m);
    return rc;
}

static const dp_strategy_conf pipe_conf = {
    .opts = pipe_opts, .n_opts = (int)(sizeof pipe_opts / sizeof pipe_opts[0]),
    .size = sizeof(pipe_settings), .defaults = &pipe_defaults,
    .foreign = pipe_foreign, .check = pipe_check,
};

const dp_strategy_ops dp_strategy_pipeline = {
    .name = "pipeline",
    .conf = &pipe_conf,
    .summary = "layer pipelining: stages of layers, micro-batches, gpipe or 1f1b, one flush a step",
    .cluster = 1,
    .refuses = DP_ROLE_BIT(DP_ROLE_PS),
    .buffers = 1,
    /* A lost stage held micro-batches and layers no one else has: the
     * whole job again from the newest checkpoint (docs/faults.md). */
    .restarts_all = DP_ROLE_BIT(DP_ROLE_CHIEF) | DP_ROLE_BIT(DP_ROLE_WORKER),
    .open = pipe_open,
    .step = pipe_step,
    .epoch_end = pipe_epoch_end,
    .params = pipe_params,
    .save = pipe_save,
    .finish = pipe_finish,
    .leave = pipe_leave,
    .close = pipe_close,
};

int dp_pipeline_peak(const dp_strategy *s)
{
    return s->peak > s->peak_run ? s->peak : s->peak_run;
}
