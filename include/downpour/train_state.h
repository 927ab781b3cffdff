/* The state a run goes on from and the run it belongs to: the plain
 * structs the loop hands a strategy (a resume, a checkpoint's state to fill,
 * the run's identity), so strategy.h needs them but nothing of src/train.
 * Allocating, reading and writing them is checkpoint.h's (src/train). */
#ifndef DOWNPOUR_TRAIN_STATE_H
#define DOWNPOUR_TRAIN_STATE_H

#include <stddef.h>
#include <stdint.h>

#define DP_STATE_NAME_LEN 40 /* a strategy vector's name, with its NUL */
#define DP_STATE_MAX_VECS 160 /* strategy vectors a checkpoint may hold */

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
    /* A strategy's own state beyond the above (lbfgs: its history; NULL
     * and 0 for the others), malloc'd by whoever fills it and freed with
     * the state: n_vecs vectors of n_params floats, vec i at i * n_params,
     * each a tensor named vec_names[i] ("<strategy>.<name>"), and its
     * scalars as one text value (metadata "strategy_state"). */
    int n_vecs;
    char (*vec_names)[DP_STATE_NAME_LEN];
    float *vecs;
    char *scalars;
    char *path;           /* the file it was read from (malloc'd); NULL when not read */
    void *rows_src;       /* read for a model with compact tables: the file, kept open
                             for the tables' rows (dp_checkpoint_read_rows); NULL else */
} dp_train_state;

/* How a strategy's checkpoints resume on another cluster (dp_run_identity's
 * and dp_strategy_ops's reshards; docs/checkpoints.md, "Resuming on
 * another cluster"). */
enum {
    DP_RESHARD_NONE = 0, /* only on the cluster that wrote them */
    DP_RESHARD_ANY = 1,  /* whole vectors that any workers and ps tasks take up (lbfgs) */
    DP_RESHARD_PS = 2    /* whole vectors the ps tasks re-slice (the ps family): any
                            number of ps tasks; another number of workers only with a
                            global batch (--global-batch) dealt by --shard data, so a
                            step takes the same records */
};

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
    int reshards;         /* DP_RESHARD_*: which cluster may take the state up */
    int global_batch;     /* --global-batch N (0: none): the batch a step takes over
                             all workers, so `batch` (its share) may differ */
    int same_records;     /* 1: a step's records are the same for any number of
                             workers at one global batch (--shard data) */
    const char *settings; /* every other setting the trajectory depends on, as
                             "key=value ..." (momentum, shard, period, ...) */
} dp_run_identity;

#endif
