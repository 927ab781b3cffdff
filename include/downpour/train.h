/* The one training loop every strategy shares (src/train/loop.c;
 * docs/architecture.md): epochs, batching, the learning-rate schedule,
 * validation, log lines, the metrics file, checkpoints and resuming are
 * written once there; a strategy (strategy.h) decides how the tasks
 * cooperate. */
#ifndef DOWNPOUR_TRAIN_H
#define DOWNPOUR_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "downpour/dataset.h"
#include "downpour/model.h"
#include "downpour/status.h"
#include "downpour/train_config.h" /* dp_train_config, dp_lr_schedule */

/* A learning-rate schedule (train_config.h, docs/training.md) with its numbers. */
typedef struct dp_lr_plan {
    dp_lr_schedule schedule;
    long warmup;     /* steps of linear warm-up: step k < warmup runs at (k+1)/warmup (0: none) */
    long step_every; /* step: steps between decays (> 0) */
    float gamma;     /* step: the factor at each decay */
} dp_lr_plan;

int dp_lr_schedule_parse(const char *name, dp_lr_schedule *out, dp_err *err);
const char *dp_lr_schedule_name(dp_lr_schedule s);
/* The factor on lr of the step after `done` of `total` steps: the warm-up's
 * (done+1)/warmup while done < warmup, times cosine's
 * 0.5 (1 + cos(pi (done - warmup) / (total - warmup))) (1 in the warm-up),
 * or step's gamma^floor(done / step_every). */
float dp_lr_scale(const dp_lr_plan *p, long done, long total);

/* Defaults of the source experiment: mnist, mlp-300-100, batch 128, 25 epochs,
 * adam with Keras defaults, seed 1, 54,000 / 6,000, a step line every 100 steps. */
dp_train_config dp_train_defaults(void);

typedef struct dp_train_result {
    double test_accuracy;
    double test_loss;         /* the mean loss over the test set (bce: the log loss) */
    double test_auc;          /* a binary model's (dp_model_binary) AUC on it, else NAN */
    double val_accuracy;      /* after the last epoch */
    double train_loss;        /* mean over the last epoch */
    double train_seconds;     /* the epoch loop, data loading excluded */
    double samples_per_second;
    long steps;
    int checkpoints_missed;   /* checkpoints that could not be written: the run went
                                 on without them (docs/checkpoints.md) */
} dp_train_result;

int dp_train_run(const dp_train_config *cfg, dp_train_result *res, dp_err *err);

/* --global-batch N over `workers` data-parallel workers: *batch gets each
 * worker's share N / workers; -1 naming the numbers when N is not a
 * positive multiple of workers (docs/strategies.md, "--global-batch"). */
int dp_global_batch_share(int global, int workers, int *batch, dp_err *err);
/* --sum-chunk C against a worker's share `batch` of --global-batch `global`
 * over `workers`: 0 when C divides the share into at most
 * DP_PS_MAX_CHUNKS chunks, else -1 naming the numbers. */
int dp_sum_chunk_check(int chunk, int batch, int global, int workers, dp_err *err);
/* Accuracy and mean loss of the model with weights params (m->n_params
 * floats) over a split, in chunks of at most m->max_batch records, using x
 * (max_batch * dim floats) and y as scratch.  *bad_inputs (when non-NULL):
 * the inputs the model's layers had to change over the split
 * (dp_model_bad_inputs: emb's ids out of range). */
double dp_evaluate(dp_model *m, const float *params, const dp_split *s, float *x, uint8_t *y,
                   double *mean_loss, long *bad_inputs);
/* dp_evaluate, and for a model ending in bce (dp_model_binary) the AUC of
 * its probabilities over the split in *auc (auc.h; NAN when the split holds
 * one label only, or memory for its 8 bytes a record is short).  The mean
 * loss is then the log loss. */
double dp_evaluate_auc(dp_model *m, const float *params, const dp_split *s, float *x,
                       uint8_t *y, double *mean_loss, long *bad_inputs, double *auc);
/* The warning for `count` (> 0) inputs changed over `what` ("the
 * validation set"): names the first layer that counts them, its kind and
 * what they are, on stderr (docs/models.md, "emb"). */
void dp_warn_bad_inputs(const dp_model *m, long count, const char *what);

#endif
