/* A model replica: one trainer's model and optimiser, seen the same whether
 * its arrays live on the host or on a device (docs/gpu.md, "Strategies").
 * The loop and the data-parallel strategies (single, allreduce, the ps
 * workers) call it and never a device themselves.
 *
 * A replica computes on the host (over dp_model and dp_optim) or on a
 * device (over dp_dmodel, the training split loaded there).  Its state (the
 * parameters, the optimiser state, --ema's average when the replica keeps
 * it) lives in one of two places, chosen once with dp_replica_settle:
 *   DP_STATE_HOST   the host's arrays (model->params, the host optimiser):
 *                   on a device only forward and backward run there, the
 *                   parameters going there and the gradients coming back
 *                   every step (host staging);
 *   DP_STATE_LOCAL  where the replica computes: on a device the whole step,
 *                   the update included, runs there, and the state comes
 *                   back only when asked (dp_replica_to_host, _weights,
 *                   _state).  On the host it is DP_STATE_HOST.
 *
 * Steps on a device queue and return: their loss and count of correct
 * predictions are tallied there (the step calls return 1, "deferred") and
 * come back with dp_replica_collect.  Nothing here allocates after settle. */
#ifndef DOWNPOUR_REPLICA_H
#define DOWNPOUR_REPLICA_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/dataset.h"
#include "downpour/device.h"
#include "downpour/model.h"
#include "downpour/optim.h"
#include "downpour/status.h"

typedef struct dp_replica dp_replica;

/* One step's outcome, for step lines and metrics: what a strategy's step
 * (strategy.h) and the model-parallel executor's (src/exec/mp_replica.h)
 * fill.  Here, below the strategy interface, so the executor needs nothing
 * of strategy.h. */
typedef struct dp_step_out {
    float loss;         /* mean over the records (0 when there were none) */
    int correct;
    long clock_gap;     /* ps-*: the largest staleness this worker has been allowed */
    int deferred;       /* loss and correct are tallied in info->replica, not here:
                           the loop reads them with dp_replica_collect */
} dp_step_out;

typedef struct dp_replica_config {
    dp_model *model;              /* the host model: the layout and the host's arrays,
                                     which must outlive the replica */
    const dp_optim_config *optim; /* NULL: no optimiser (dp_replica_apply fails) */
    const dp_device_spec *device; /* NULL or DP_DEVICE_CPU: the host */
    const dp_split *train;        /* the training split, loaded on a device */
    const char *label;            /* "Worker 0": log lines and messages */
    int resumed;                  /* 1: the optimiser starts from slots and optim_t */
    const float *slots;           /* the resumed optimiser slots ... */
    long optim_t;                 /* ... and update count */
} dp_replica_config;

typedef enum dp_replica_state {
    DP_STATE_HOST,
    DP_STATE_LOCAL,
} dp_replica_home;

/* Opens the host optimiser, and on a device the device and the model there
 * (logging "<label> trains on <device>"); a device needs c->train.  The
 * state stays on the host until dp_replica_settle. */
int dp_replica_open(dp_replica **out, const dp_replica_config *c, dp_err *err);
void dp_replica_close(dp_replica *r); /* NULL: no-op */

/* Where the state lives for the rest of the run.  DP_STATE_LOCAL on a
 * device sends the host's state there and, with ema > 0, keeps --ema's
 * average there from ema_start (NULL: the parameters).  DP_STATE_HOST on a
 * device page-locks the staging arrays (a failure is a warning).  Once. */
int dp_replica_settle(dp_replica *r, dp_replica_home where, float ema, const float *ema_start,
                      dp_err *err);
/* 1 when the host model's params are the live weights (the loop keeps
 * --ema from them); 0 when the state lives on a device. */
int dp_replica_host_live(const dp_replica *r);
/* The host optimiser: its state is live where dp_replica_host_live. */
dp_optim *dp_replica_optim(dp_replica *r);

/* ---- batches (the loop) ---- */
/* The next batch from b into where the replica computes: gathered into x
 * and y on the host, or its record indices staged on the device (which
 * gathers them).  Returns the records (0: the shard ran out), -1 on error. */
int dp_replica_next_batch(dp_replica *r, dp_batcher *b, float *x, uint8_t *y, int batch,
                          dp_err *err);
/* Why --augment cannot apply to this replica's batches (the device gathers
 * its records itself), or NULL when it can. */
const char *dp_replica_no_augment(const dp_replica *r);
/* The last batch staged again, for a step retried after its update never
 * ran (dp_dmodel_restage); a no-op on the host. */
int dp_replica_restage(dp_replica *r, dp_err *err);
/* The loss summed over records and the correct count of the deferred
 * steps since the last collect, added to *loss_sum and *correct (waits). */
int dp_replica_collect(dp_replica *r, double *loss_sum, long *correct, dp_err *err);

/* ---- steps: 0 with *loss (the mean) and *correct, 1 deferred, -1 ---- */
/* A whole step with the local optimiser on the batch of n > 0 records
 * (x and y on the host, the staged batch on a device): forward, backward
 * and the update with rate lr, fused. */
int dp_replica_step(dp_replica *r, const float *x, const uint8_t *y, int n, float lr,
                    float *loss, int *correct, dp_err *err);
/* Forward and backward on n > 0 records: the gradient of the mean loss
 * into the gradients where the state lives (model->grads with host state:
 * on a device they come back, after the parameters went there, and
 * model->grad_ready is told once for them all). */
int dp_replica_grads(dp_replica *r, const float *x, const uint8_t *y, int n, float *loss,
                     int *correct, dp_err *err);
/* The optimiser's update with rate lr from the gradients where the state
 * lives (on the host: model->grads into model->params). */
int dp_replica_apply(dp_replica *r, float lr, dp_err *err);

/* ---- the state ---- */
/* The state on the host's arrays (model->params, the host optimiser) and
 * back: no-ops unless it lives on a device.  For what reads or writes the
 * host's arrays between steps (a ring re-forming, a replica welcomed). */
int dp_replica_to_host(dp_replica *r, dp_err *err);
int dp_replica_from_host(dp_replica *r, dp_err *err);
/* The model's buffers (batch norm's statistics), which a device's steps
 * move, into model->buffers; a no-op on the host. */
int dp_replica_get_buffers(dp_replica *r, dp_err *err);
/* The weights to evaluate: the model's buffers brought back from a device,
 * then --ema's average where the replica keeps it and average is 1, else
 * the parameters (model->params, brought back from a device).  Valid until
 * the next call. */
const float *dp_replica_weights(dp_replica *r, int average, dp_err *err);
/* A checkpoint's part: the buffers into model->buffers, the parameters,
 * n_slots optimiser slots and the update count, and (ema non-NULL, where
 * the replica keeps it) --ema's average. */
int dp_replica_state(dp_replica *r, float *params, float *slots, int n_slots, long *optim_t,
                     float *ema, dp_err *err);

/* ---- sums of the gradients over replicas on devices (NCCL) ---- */
/* Whether the replica's device has collectives (0 on the host). */
int dp_replica_can_sum(const dp_replica *r);
/* What the replica sums on, for finding two ranks on one GPU. */
const char *dp_replica_describe(const dp_replica *r);
int dp_replica_sum_id(dp_replica *r, uint8_t id[DP_COMM_ID_BYTES], dp_err *err);
int dp_replica_sum_join(dp_replica *r, const uint8_t id[DP_COMM_ID_BYTES], int ranks, int rank,
                        dp_err *err);
/* The device gradients times w (0: zero), before a sum weighing each rank
 * by its share of the records; then the sum over the ranks.  Both queue. */
int dp_replica_scale_grads(dp_replica *r, float w, dp_err *err);
int dp_replica_sum_grads(dp_replica *r, dp_err *err);
/* dp_dmodel_comm_wait and dp_dmodel_comm_abort. */
int dp_replica_sum_wait(dp_replica *r, double timeout_s, dp_err *err);
void dp_replica_sum_abort(dp_replica *r);

#endif
