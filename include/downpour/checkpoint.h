/* Checkpoints are the training state (docs/architecture.md, "Checkpoints"):
 * one safetensors file holds everything a run needs to go on from a step,
 * and its weights load straight into PyTorch.
 *
 * Tensors (F32):
 *   layers.{i}.weight (out,in), layers.{i}.bias (out)   the weights, as nn.Linear
 *   optimizer.slot{k} (n_params)        the optimiser state over the flat vector
 *                                       (momentum's velocity; Adam's m then v)
 *   worker.{w}.optimizer.slot{k}        model-avg: each worker's own optimiser
 *   replica.{p}.residual (n_params)     allreduce with --compress: replica p's
 *                                       error-feedback residual (the ps family
 *                                       with --compress: worker p's)
 *   ema (n_params)                      --ema: the moving average
 *   best (n_params)                     --keep-best: the best epoch's weights
 *   loop.history (epochs, 3)            per epoch: val_accuracy, train_loss, seconds
 *   <strategy>.<name> (n_params)        a strategy's own vectors (lbfgs: lbfgs.g,
 *                                       lbfgs.s.{k}, lbfgs.y.{k}), read back as they are
 * Metadata (strings): format, model, model_name, optimizer, optimizer_t, lr,
 * lr_schedule, step, epoch, strategy, dataset, workers, ps, batch, seed,
 * train_size, val_size, steps_per_epoch, epochs, settings, best_accuracy,
 * best_epoch, worker.{w}.optimizer_t, strategy_state (a strategy's own
 * scalars, as text) and crc32c.
 *
 * Loading is strict: a missing or damaged tensor or key, a shape that is not
 * the model's, a number that does not parse is an error naming it; a
 * checkpoint of another run (model, strategy, optimiser, world size, batch,
 * seed, split) is refused with what differs; the world size only where the
 * strategy does not re-shard its state (id->reshards). */
#ifndef DOWNPOUR_CHECKPOINT_H
#define DOWNPOUR_CHECKPOINT_H

#include <stdint.h>

#include "downpour/model.h"
#include "downpour/optim.h"
#include "downpour/status.h"
#include "downpour/train_state.h"

#define DP_CKPT_FORMAT "downpour-checkpoint-2"

/* Which parts to allocate beside params (and slots when n_slots > 0). */
enum { DP_STATE_EMA = 1, DP_STATE_BEST = 2 };
int dp_train_state_alloc(dp_train_state *st, size_t n_params, int n_slots, int parts,
                         int max_history, int n_workers, dp_err *err);
void dp_train_state_free(dp_train_state *st); /* safe on a zeroed or freed state */
/* Room for n replicas' residuals (zeros) beside st's n_params (n 0: none). */
int dp_train_state_alloc_residuals(dp_train_state *st, int n, dp_err *err);

/* Writes st (with the model's layout) atomically to path. */
int dp_checkpoint_write(const char *path, const dp_model *m, const dp_train_state *st,
                        const dp_run_identity *id, dp_err *err);
/* The same for a model holding its sparse tables compact (a chief on rows:
 * docs/strategies.md, "Tables larger than a worker"): the file holds each
 * table whole, and each optimiser slot whole, their rows taken from
 * rows(ctx, part, k, buf, n) as they are written, the next n floats of part
 * `part` (0: the rows, j: slot j - 1's) of table k (row after row, ids
 * increasing; the tables in order, each from its first row; the parts in
 * order), never a whole table in memory.  The weights, optimiser slots and
 * best weights (st as the compact model lays them out; part
 * DP_CKPT_PART_BEST the best weights' rows); no other vector. */
typedef int (*dp_ckpt_rows_fn)(void *ctx, int part, int table, float *buf, size_t n,
                               dp_err *err);
int dp_checkpoint_write_rows(const char *path, const dp_model *m, const dp_train_state *st,
                             const dp_run_identity *id, dp_ckpt_rows_fn rows, void *ctx,
                             dp_err *err);

/* Reads a checkpoint for model m (already built from the run's spec) and run
 * id into *st (allocated here; free with dp_train_state_free).  Strict:
 * see the top of this file. */
int dp_checkpoint_read(const char *path, const dp_model *m, const dp_run_identity *id,
                       dp_train_state *st, dp_err *err);

/* A state read for a model with compact tables (dp_model_init_compact: a
 * task of a run on rows) holds the dense parts only, the tables' slots
 * zeros, and keeps its file open (st->rows_src): the n rows from local row
 * `first` of shard `shard` of `shards` (ids shard + (first + i) x shards)
 * of table k's part (0: its rows; 1 + q: optimiser slot q's) into dst
 * (n x width floats), read from the file a piece of at most 1 MiB at a
 * time.  The file's checksum was verified in a streamed pass when it was
 * read, through the same open file (docs/checkpoints.md, "Reading in
 * pieces"). */
int dp_checkpoint_read_rows(const dp_train_state *st, int table, int part, int shard, int shards,
                            size_t first, size_t n, float *dst, dp_err *err);
/* The rows ids[0..n) (strictly increasing, below the table's rows) of
 * table k's part of such a state into dst (row ids[i] at i x width): ids
 * close together (a gap of at most 4 KiB of rows) are read together, one
 * read a run of at most a piece (1 MiB), through the state's own piece
 * buffer (docs/checkpoints.md, "Reading in pieces"). */
int dp_checkpoint_read_ids(const dp_train_state *st, int table, int part, const uint32_t *ids,
                           size_t n, float *dst, dp_err *err);
/* The part of the best weights ('best', --keep-best), in
 * dp_checkpoint_read_rows and _read_table and dp_ckpt_rows_fn. */
#define DP_CKPT_PART_BEST 3
/* Floats [off, off + n) of table k's part (row after row, whole rows or
 * not) of such a state, into dst. */
int dp_checkpoint_read_table(const dp_train_state *st, int table, int part, size_t off,
                             size_t n, float *dst, dp_err *err);
/* A weights file this run wrote (dp_checkpoint_write_rows: a --save file)
 * opened for model m's compact tables' rows (part 0), no checksum read
 * (the writer's own), nothing else of st filled but path. */
int dp_checkpoint_open_rows(const char *path, const dp_model *m, dp_train_state *st,
                            dp_err *err);

/* What downpour eval needs: builds *m from the file's model spec (max_batch
 * for scratch), loads its weights; strategy, dataset and step are copied
 * into info (which may be NULL). */
typedef struct dp_ckpt_info {
    long step;
    char strategy[64];
    char dataset[1024];
} dp_ckpt_info;
int dp_checkpoint_load_weights(const char *path, dp_model *m, int max_batch, dp_ckpt_info *info,
                               dp_err *err);

/* Checkpoint files in a directory: DIR/ckpt-<step, 10 digits>.safetensors. */
void dp_checkpoint_path(char *buf, size_t n, const char *dir, long step);
/* The newest checkpoint of dir that reads back (older ones are tried when a
 * newer one is damaged, with a warning naming it): 1 with *st filled and
 * path set, 0 when the directory holds none, -1 on an error (a checkpoint
 * that reads but belongs to another run is an error, not skipped). */
int dp_checkpoint_find_newest(const char *dir, const dp_model *m, const dp_run_identity *id,
                              dp_train_state *st, char *path, size_t path_len, dp_err *err);
/* Deletes all but the newest `keep` checkpoints of dir. */
void dp_checkpoint_prune(const char *dir, int keep);
/* Removes the temporary files that checkpoint writes killed mid-way left
 * in dir: only names of the exact form ckpt-<10 digits>.safetensors.tmp.<pid>.<n>
 * (dp_atomic_temp_parse), and none whose pid is a live process other than
 * this one (it may be writing; call this before this process writes a
 * checkpoint, so one with its own pid is an earlier process's).  Each
 * removal is logged.  Returns how many
 * were removed, or -1 when dir cannot be read (err says why). */
int dp_checkpoint_remove_temps(const char *dir, dp_err *err);

#endif
