/* The state a run goes on from and the run it belongs to: the plain
 * structs the loop hands a strategy (a resume, a checkpoint's state to fill,
 * the run's identity), so strategy.h needs them but nothing of src/train.
 * Allocating, reading and writing them is checkpoint.h's (src/train). */
#ifndef DOWNPOUR_TRAIN_STATE_H
#define DOWNPOUR_TRAIN_STATE_H

#include <stddef.h>
#include <stdint.h>

/* Everything a run needs to go on from `step`.  Buffers are owned by the
 * state (dp_train_state_alloc / _free). */
typedef struct dp_train_state {
    long step;            /* steps every trainer has taken */
    size_t n_params;
    int n_slots;          /* optimiser slots per parameter (0, 1 or 2) */
    float *params;        /* n_params */
    float *slots;         /* n_slots * n_params, slot k at k * n_params; NULL when none */
    long optim_t;         /* updates the optimiser has applied */
    float *ema;           /* n_params, or NULL */
    float *best;          /* n_params, or NULL */
    double best_accuracy; /* of best; -1 when none */
    int best_epoch;       /* 0 when none */
    int n_history;        /* epochs evaluated */
    int max_history;
    float *history;       /* max_history rows of val_accuracy, train_loss, seconds */
    int n_workers;        /* model-avg: workers with an optimiser of their own, else 0 */
    float *worker_slots;  /* n_workers * n_slots * n_params */
    long *worker_t;       /* n_workers */
    size_t n_buffers;     /* the model's buffers (batch norm's statistics), read from a */
    float *buffers;       /* checkpoint; NULL otherwise: the writer's model's are written */
    int n_residuals;      /* allreduce with --compress: replicas whose error-feedback */
    float *residuals;     /* residual is kept, n_residuals * n_params, replica p's at
                             p * n_params (docs/checkpoints.md); else 0 and NULL */
} dp_train_state;

/* The run a checkpoint belongs to. */
typedef struct dp_run_identity {
    const char *strategy;
    const char *dataset;
    const char *optimizer;   /* dp_optim_kind_name */
    const char *lr_schedule;
    float lr;
    int workers, ps;
    int batch;
    uint64_t seed;
    uint32_t train_size, val_size;
    long steps_per_epoch;
    int epochs;
    const char *settings; /* every other setting the trajectory depends on, as
                             "key=value ..." (momentum, shard, period, ...) */
} dp_run_identity;

#endif
