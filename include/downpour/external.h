/* An external model: one whose forward and backward run outside downpour
 * (a torch.nn.Module, through downpour.torch: docs/python.md, "PyTorch").
 * downpour sees only its parameters, one flat float buffer of n_params
 * values the caller owns, and a twin buffer of gradients; a step asks the
 * caller for its next batch and for the gradient there.  The data-parallel
 * strategies (single, allreduce, ps-async, ps-sync, ps-ssp, ps-dssp,
 * model-avg) train it as they train downpour's own models: the ps shards
 * and the local optimiser update the buffer in place, allreduce sums the
 * gradient buffers (docs/architecture.md, "External models").
 *
 * dp_model_init takes "external:NAME" as a spec, for a model registered
 * under NAME in this process (as the in-memory datasets' "mem:NAME"), so
 * `downpour train --model external:NAME`, run in-process, trains it; or
 * set dp_train_config.external.  The model has no layers: nothing of
 * downpour's own that runs layers (evaluation, the device, the
 * model-parallel strategies) applies to it; checkpoints hold its flat
 * buffers as they are. */
#ifndef DOWNPOUR_EXTERNAL_H
#define DOWNPOUR_EXTERNAL_H

#include <stddef.h>

#include "downpour/status.h"

typedef struct dp_external_model {
    size_t n_params;
    float *params; /* n_params floats: the live weights, read and written in place */
    float *grads;  /* n_params floats: where compute leaves the gradient */
    /* the trainers' steps per epoch (a DataLoader's len); every task of a
     * run gives the same; a ps task may give 0 */
    long steps_per_epoch;
    /* The records of the next batch, which the caller fetches and keeps
     * for compute (0: it has none this step), or -1 on an error.  NULL on
     * tasks that train nothing (the chief, a ps). */
    int (*next)(void *ctx);
    /* Forward and backward of the batch next fetched, with the weights in
     * params: the gradient of the mean loss into grads (overwritten), the
     * mean loss in *loss and the correct predictions in *correct.  0, or
     * -1 on an error. */
    int (*compute)(void *ctx, float *loss, int *correct);
    /* Optional (NULL: no validation or test figures): the accuracy of the
     * weights `weights` (n_params floats, maybe not params) on the
     * caller's validation (test 0) or test (test 1) records, with the mean
     * loss in *loss; < 0 on an error.  Called by the evaluator: the chief,
     * or worker 0 / the single process. */
    double (*evaluate)(void *ctx, const float *weights, int test, double *loss);
    void *ctx;
    /* Optional: state that is not trained (a BatchNorm's running mean and
     * variance), n_buffers floats the caller's model moves in its own
     * forward.  downpour treats them as its own models' buffers
     * (docs/strategies.md, "Buffers"): worker 0 sends its to the chief,
     * checkpoints hold them, a resume gives every task the file's.  0 and
     * NULL: none. */
    size_t n_buffers;
    float *buffers;
    /* Optional (NULL: --save is refused): writes the weights `weights`
     * (n_params floats, maybe not params: the best epoch's, the EMA) and
     * buffers to path in the caller's own format (a torch state_dict);
     * 0, or -1 on an error.  Called by the evaluator at the end. */
    int (*save)(void *ctx, const float *weights, const float *buffers, const char *path);
} dp_external_model;

/* Registers m (which must outlive the runs that use it) under name, for
 * the spec "external:NAME"; m NULL removes it.  0, or -1 (a name too long,
 * or the table full). */
int dp_external_register(const char *name, const dp_external_model *m, dp_err *err);
/* The model registered under name, or NULL. */
const dp_external_model *dp_external_find(const char *name);

#endif
