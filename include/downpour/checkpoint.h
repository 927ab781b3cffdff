/* Model checkpoints as safetensors (DESIGN decision 8): the weights under
 * PyTorch Linear names (layers.{i}.weight (out,in), layers.{i}.bias), the
 * optimiser's state slots as flat tensors (optimizer.slot{k}), and metadata
 * strings: format, model spec, model name, optimizer, t, step, epoch,
 * strategy.  Written atomically. */
#ifndef DOWNPOUR_CHECKPOINT_H
#define DOWNPOUR_CHECKPOINT_H

#include "downpour/model.h"
#include "downpour/optim.h"
#include "downpour/status.h"

typedef struct dp_ckpt_info {
    long step;
    long epoch;
    const char *strategy;
    const char *dataset; /* what it was trained on ("mnist", or a directory) */
} dp_ckpt_info;

/* opt may be NULL (weights only). */
int dp_checkpoint_save(const char *path, const dp_model *m, const dp_optim *opt,
                       const dp_ckpt_info *info, dp_err *err);

/* Builds *m from the file's model spec (max_batch for scratch) and loads the
 * weights; if opt is non-NULL and the file holds optimiser state, restores it
 * (opt must be initialised for m->n_params with the same kind).  info may be
 * NULL; its strategy and dataset strings point into static buffers. */
int dp_checkpoint_load(const char *path, dp_model *m, int max_batch, dp_optim *opt,
                       dp_ckpt_info *info, dp_err *err);

#endif
