/* What the five parameter-server strategies share (ps-async, ps-sync,
 * ps-ssp, ps-dssp, model-avg): the same three parts, differing only in the
 * consistency mode their servers and clients follow (include/downpour/ps.h).
 *   ps tasks   SERVERs: each holds one shard of the parameters and its
 *              optimiser state (src/strategy/ps.c);
 *   workers    TRAINERs: push gradients (or parameters) and pull parameters;
 *   the chief  the COORDINATOR: starts the run, gathers the workers' epoch
 *              figures, pulls the parameters to evaluate, and holds the
 *              checkpoint barrier (every worker pauses at the checkpoint
 *              step, the servers hand in their shards, the chief writes).
 * Buffers (batch norm's running statistics): every worker moves its own;
 * worker 0 sends its to the chief (DP_WIRE_BUFFERS) before each epoch
 * report, at each checkpoint barrier and when it re-attaches, so the
 * chief evaluates, checkpoints and saves with worker 0's statistics
 * (docs/strategies.md, "Buffers").
 * Each strategy's file is its mode's table entry and the statement of its
 * rule; this file is the machinery. */
#ifndef DOWNPOUR_STRATEGY_PS_FAMILY_H
#define DOWNPOUR_STRATEGY_PS_FAMILY_H

#include "downpour/options.h"
#include "downpour/partition.h" /* DP_PARTITION_MIN_SHARD_BYTES */
#include "downpour/ps.h"
#include "downpour/strategy.h"

/* The family's settings (ps_options.c): dp_train_config's strategy_cfg
 * under every ps strategy and model-avg.  A new option of the family is
 * one line here (options.h, DP_OPT_FIELD): its field, default and table
 * line come from it; the code that reads it comes on top. */
#define DP_PS_OPTIONS(X)                                                                           \
    X(int, fetch_every, 1, "fetch-every", DP_OPT_INT, "N", 1, 1000000, 0,                          \
      "ps-async: pull parameters every N steps")                                                   \
    X(int, push_every, 1, "push-every", DP_OPT_INT, "N", 1, 1000000, 0,                            \
      "ps-async: push gradients accumulated over N steps")                                         \
    X(int, push_behind, 0, "push-behind", DP_OPT_INT, "N", 0, 64, 0,                               \
      "ps-async: pushes a worker may have in flight, not yet answered, while it computes on (0:"   \
      " wait for each)")                                                                           \
    X(bool, push_inline, false, "push-inline", DP_OPT_FLAG, NULL, 0, 0, 0,                         \
      "ps-async --push-behind: the worker sends each push itself, not a send thread")              \
    X(int, staleness, 3, "staleness", DP_OPT_INT, "S", 0, 1000000, 0,                              \
      "ps-ssp: how many clocks a worker may lead the slowest")                                     \
    X(const char *, staleness_range, "1:6", "staleness-range", DP_OPT_STR, "LO:HI", 0, 0, 0,       \
      "ps-dssp: range of the adapted bound")                                                       \
    X(int, period, 8, "period", DP_OPT_INT, "K", 1, 1000000, 0,                                    \
      "model-avg: local steps between averages")                                                   \
    X(size_t, min_shard_bytes, DP_PARTITION_MIN_SHARD_BYTES, "ps-min-shard-bytes", DP_OPT_SIZE,    \
      "N", 4096, (double)(1L << 40), 0,                                                            \
      "smallest parameter shard in bytes")                                                         \
    X(int, max_shards, 0, "ps-max-shards", DP_OPT_INT, "N", 0, 4096, 0,                            \
      "most shards (0: one per ps task)")                                                          \
    X(int, replicas, 1, "ps-replicas", DP_OPT_INT, "N", 1, 2, 0,                                   \
      "copies of each ps shard: 2 keeps a backup on the next ps task, which takes over when the"   \
      " primary is lost")                                                                          \
    X(const char *, ps_reply, NULL, "ps-reply", DP_OPT_STR, "FORMAT", 0, 0, 0,                    \
      "the servers' parameters to the workers: f32 (the default), bf16 (half the bytes,"           \
      " rounded), delta4 (the 4-bit difference from the worker's copy) or topk:RATIO")             \
    X(const char *, ps_push, NULL, "ps-push", DP_OPT_STR, "MODE", 0, 0, 0,                       \
      "ps-sync: worker (each worker pushes), host (the workers of a host sum their gradients"     \
      " there and one of them pushes) or auto (host where the servers' link is the slower)")     \
    /* --compress: listed with allreduce's options (ps family: bf16, fp16, topk:RATIO, auto) */     \
    X(const char *, compress, NULL, "compress", DP_OPT_STR, "MODE", 0, 0, DP_OPT_ALSO,             \
      "gradient compression of the pushes")                                                        \
    /* ps-async's model-parallel replicas: listed with model-parallel's options */                 \
    X(bool, dense, false, "ps-dense", DP_OPT_FLAG, NULL, 0, 0, 0,                                  \
      "sparse tables (emb) move whole on every step, as dense parameters, not by the rows a"       \
      " batch touches (for comparison)")                                                           \
    X(int, model_parallel, 0, "model-parallel", DP_OPT_INT, "K", 1, 4096, DP_OPT_ALSO,             \
      "tasks per model-parallel replica")

typedef struct dp_ps_settings {
    DP_PS_OPTIONS(DP_OPT_FIELD)
} dp_ps_settings;
extern const dp_strategy_conf dp_ps_conf;
/* The servers' and clients' configuration from the settings (the range
 * parsed; the caller sets mode and what the run decides): 0, or -1. */
int dp_ps_settings_apply(const dp_ps_settings *ps, dp_ps_config *out, dp_err *err);
/* The family's part of the run identity (NULL: the defaults'), appended. */
void dp_ps_settings_identity(const dp_ps_settings *ps, char *buf, size_t cap);
/* The restart policy of a strategy with ps tasks holding `replicas` copies
 * of each shard: a dp_launch survives answer, with why (`checkpoints`: as
 * for dp_strategy_restart). */
int dp_ps_restart(int replicas, const dp_strategy_ops *ops, dp_role role, int checkpoints,
                  char *why, size_t cap);

/* The links a run's settings add (dp_strategy_ops.links): --ps-push host
 * or auto, the workers among themselves. */
void dp_ps_family_links(const dp_train_config *cfg, unsigned *talks_to);

int dp_ps_family_open(dp_strategy **out, const dp_run_env *env, dp_task_info *info,
                      dp_ps_mode mode, dp_err *err);
/* Whether a worker may hold its model's sparse tables compact (strategy.h,
 * compact_tables): the settings move them by rows (docs/strategies.md,
 * "Tables larger than a worker"). */
int dp_ps_family_compact(const dp_train_config *cfg, dp_ps_mode mode);
int dp_ps_family_serve(dp_strategy *s, dp_err *err);
int dp_ps_family_step(dp_strategy *s, const float *x, const uint8_t *y, int n, float lr,
                      long step, dp_step_out *out, dp_err *err);
int dp_ps_family_deal(dp_strategy *s, int epoch, int *index, int *count, dp_err *err);
int dp_ps_family_epoch_end(dp_strategy *s, int epoch, dp_epoch_stats *st, dp_err *err);
int dp_ps_family_next(dp_strategy *s, dp_coord_event *ev, dp_train_state *st, dp_err *err);
const float *dp_ps_family_params(dp_strategy *s, dp_weights which, dp_err *err);
const float *dp_ps_family_eval_rows(dp_strategy *s, const float *x, int n, dp_err *err);
int dp_ps_family_table_rows(dp_strategy *s, int part, int k, float *buf, size_t n,
                            dp_err *err);
int dp_ps_family_save(dp_strategy *s, long step, dp_train_state *st, dp_err *err);
int dp_ps_family_finish(dp_strategy *s, long steps, dp_err *err);
int dp_ps_family_leave(dp_strategy *s, long steps, dp_err *err);
void dp_ps_family_close(dp_strategy *s);

/* A mode's table entry, every operation the family's; `survives`: the
 * roles besides a worker whose loss the mode goes on without. */
#define DP_PS_FAMILY_OPS(open_fn, survives_also)                                               \
    .conf = &dp_ps_conf,                                                                       \
    .cluster = 1, .devices = 1, .buffers = 1, .data_parallel = 1,                              \
    .reshards = DP_RESHARD_PS, /* whole vectors the shards re-slice (docs/checkpoints.md) */   \
    .survives = DP_ROLE_BIT(DP_ROLE_WORKER) | (survives_also),                                 \
    .needs = DP_ROLE_BIT(DP_ROLE_CHIEF) | DP_ROLE_BIT(DP_ROLE_WORKER) | DP_ROLE_BIT(DP_ROLE_PS), \
    .talks_to = {[DP_ROLE_CHIEF] = DP_ROLE_BIT(DP_ROLE_WORKER) | DP_ROLE_BIT(DP_ROLE_PS),     \
                 [DP_ROLE_WORKER] = DP_ROLE_BIT(DP_ROLE_CHIEF) | DP_ROLE_BIT(DP_ROLE_PS),    \
                 [DP_ROLE_PS] = DP_ROLE_BIT(DP_ROLE_CHIEF) | DP_ROLE_BIT(DP_ROLE_WORKER)},   \
    .links = dp_ps_family_links,                                                               \
    .open = open_fn,                                                                           \
    .serve = dp_ps_family_serve, .step = dp_ps_family_step,                                    \
    .deal = dp_ps_family_deal, .epoch_end = dp_ps_family_epoch_end,                            \
    .next = dp_ps_family_next,                                                                 \
    .params = dp_ps_family_params, .eval_rows = dp_ps_family_eval_rows,           \
    .table_rows = dp_ps_family_table_rows, .save = dp_ps_family_save, .finish = dp_ps_family_finish,   \
    .leave = dp_ps_family_leave, .close = dp_ps_family_close

#endif
