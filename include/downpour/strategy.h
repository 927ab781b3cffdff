/* The strategy interface: how the tasks of a run cooperate, under the one
 * training loop (src/train/loop.c; docs/architecture.md, "The loop and its
 * strategies").
 *
 * The loop owns everything every strategy shares: epochs, batches and their
 * order, the learning-rate schedule, step lines, the progress bar,
 * evaluation, the metrics file, checkpoint cadence, the resume position and
 * the final report.  It never asks which strategy it runs.  A strategy is
 * one table of operations (dp_strategy_ops) in one file under src/strategy/,
 * and owns everything about cooperation: who holds which parameters, what
 * crosses the wire, and which task is lost without stopping the run.
 *
 * Each task of a run is, for its strategy, one of three parts:
 *   TRAINER      walks batches of its data shard; the loop calls step() on
 *                each and epoch_end() after each epoch;
 *   SERVER       holds state for others (a parameter-server shard); the loop
 *                calls serve() once, which returns when the run is over;
 *   COORDINATOR  trains nothing but evaluates and checkpoints (the
 *                parameter-server chief); the loop calls next() for what to
 *                do: an epoch every trainer finished, a checkpoint every
 *                trainer reached, or the end.
 * One task is the evaluator (info.evaluator): it evaluates each epoch with
 * params(), reports, saves the weights and writes checkpoints.  Under a
 * strategy whose lead moves (allreduce) another trainer takes that part over
 * when the evaluator is lost (info.standby).
 *
 * Data-parallel strategies (single, ps-*, model-avg, allreduce) need only
 * the small "gradients -> parameters" interface below (dp_grad_ops: begin,
 * ready, update); dp_data_parallel_step turns it into step(), and what an
 * update holds back is flushed by finish().
 *
 * How the strategies still to come plug in:
 *   pipeline        step() is a schedule of micro-batch forwards and
 *                   backwards over this stage's layer range
 *                   (dp_model_forward_range / backward_range with one
 *                   activation slot per micro-batch in flight), sending
 *                   activations to the next stage and activation gradients
 *                   to the previous; the update happens at the flush.  The
 *                   first stage reads the batch the loop hands it, the last
 *                   computes the loss; each stage is a TRAINER.
 *   model-parallel  step() runs every layer on this task's slice of the
 *                   units, all-gathering activations forward and
 *                   reduce-scattering the input gradients backward within
 *                   the replica; params() assembles the full weights for the
 *                   evaluator; save() contributes this task's slice
 *                   (src/strategy/model_parallel.c).
 *   lbfgs           the chief is a COORDINATOR whose next() drives the
 *                   batch method (gradient requests over the whole data,
 *                   line search, two-loop recursion on ps shards);
 *                   workers are TRAINERs whose step() answers the
 *                   coordinator's requests; ps tasks are SERVERs.
 * Fault tolerance (a lost or restarted task) is decided in one place per
 * strategy: the code that sees the transport's PEER_LOST event; `survives`
 * below says the same to the launcher (docs/faults.md). */
#ifndef DOWNPOUR_STRATEGY_H
#define DOWNPOUR_STRATEGY_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/device.h"
#include "downpour/replica.h"
#include "downpour/metrics.h"
#include "downpour/model.h"
#include "downpour/node.h"
#include "downpour/options.h"
#include "downpour/status.h"
#include "downpour/train_config.h"
#include "downpour/train_state.h"

typedef struct dp_strategy dp_strategy; /* one task's instance; the strategy's own struct */

typedef enum dp_part {
    DP_PART_TRAINER,
    DP_PART_SERVER,
    DP_PART_COORDINATOR,
    DP_PART_COUNT
} dp_part;

/* The run's checkpoints as the loop reads them, for a strategy that reloads
 * state mid-run (the ps family's chief restores a restarted ps task's
 * shard): checkpoint files are the loop's (src/train), so a strategy reaches
 * them only through this. */
typedef struct dp_checkpoint_source {
    /* The newest checkpoint of this run that reads back: 1 with *st filled
     * and path set, 0 when there is none, -1 on an error (err says). */
    int (*newest)(void *ctx, dp_train_state *st, char *path, size_t cap, dp_err *err);
    void (*release)(void *ctx, dp_train_state *st); /* frees what newest filled */
    /* A state read for a model with compact tables (st->rows_src): rows
     * [first, first + n) of shard `shard` of `shards` of table k's part (0:
     * the rows, 1 + q: slot q's) into dst (dp_checkpoint_read_rows). */
    int (*rows)(const dp_train_state *st, int table, int part, int shard, int shards,
                size_t first, size_t n, float *dst, dp_err *err);
    void *ctx;
} dp_checkpoint_source;

/* What the loop hands a strategy when it opens. */
typedef struct dp_run_env {
    const dp_train_config *cfg;
    dp_node *node;                /* NULL for a process alone */
    dp_model *model;              /* params hold the initial weights (or the resumed ones) */
    dp_metrics *metrics;
    uint32_t n_train;             /* records in the training split */
    long steps_per_epoch;         /* the same on every trainer */
    const dp_train_state *resume; /* NULL: a fresh run; else the checkpoint resumed from */
    const char *resume_path;      /* and its file, for messages that name it */
    const dp_run_identity *id;    /* the run's checkpoints are this run's */
    const dp_split *train;        /* the training split (NULL on a ps task): for
                                     trainers that read their own records (lbfgs)
                                     and the replicas' shard sizes (dp_shard_size) */
    const dp_checkpoint_source *checkpoints; /* NULL: the run writes none */
    /* Whether SIGTERM asked this trainer to drain (docs/faults.md,
     * "Draining"; 0 where the loop does not drain it), for a strategy whose
     * step may end early at a boundary of its own (lbfgs: between
     * portions); the loop calls leave() after that step.  NULL: none. */
    int (*drain_asked)(void);
} dp_run_env;

/* What this task is, filled by open(). */
typedef struct dp_task_info {
    dp_part part;
    int evaluator;      /* evaluates, reports, saves and writes checkpoints; a
                           strategy whose lead moves (allreduce) sets it on the
                           trainer that takes over mid-run, and the loop reads
                           it at each epoch's end and at the end */
    int standby;        /* TRAINER that may become the evaluator mid-run: it
                           evaluates each epoch as the evaluator does, silently
                           (no line, no event), so it holds the history and the
                           --keep-best weights when it takes over; and, being
                           followed by another when it leaves, the evaluator
                           among such may drain (docs/faults.md, "All-reduce") */
    int live_params;    /* the evaluator's model->params are the live weights
                           (the loop keeps --ema and evaluates them directly) */
    int shard_index;    /* TRAINER: which data shard of shard_count it walks */
    int shard_count;
    int replicas;       /* data-parallel replicas (the global batch is batch * replicas) */
    int worker_optimizers; /* workers whose own optimiser is part of the state
                              (model-avg), so the writer's state has room for them */
    int residuals;      /* replicas whose compression residual is part of the state
                           (allreduce with --compress), likewise */
    int sliced;         /* TRAINER: holds only a slice of the model (model-parallel)
                           and never evaluates nor writes unless it is the
                           evaluator: the loop frees the full-size weights and
                           gradients it built for open(), and keeps no
                           full-size checkpoint state, on the others */
    long start_step;    /* TRAINER: where a restarted task rejoins the running
                           job (the coordinator's answer); -1: the loop's own
                           start (0, or the --resume position) */
    char label[32];     /* in step lines: "Worker 2", "Chief" */
    int no_batches;     /* TRAINER: reads its own records (lbfgs: the portions the
                           coordinator hands out); the loop gives step() none (n 0) */
    dp_replica *replica; /* TRAINER with a replica (replica.h): the loop takes each
                            batch through it (dp_replica_next_batch) and reads
                            deferred figures from it; NULL: the host model */
} dp_task_info;

/* An epoch's training figures: one trainer's in, the run's out. */
typedef struct dp_epoch_stats {
    double loss_sum;    /* over records */
    double records;
    double correct;
    double seconds;
    long steps;         /* every trainer's steps by the end of this epoch */
} dp_epoch_stats;

/* What a coordinator's next() tells the loop to do. */
typedef enum dp_coord_kind {
    DP_COORD_EPOCH,      /* every trainer finished `epoch`: evaluate it with params() */
    DP_COORD_CHECKPOINT, /* every trainer is at `step`; the state is gathered: write it */
    DP_COORD_DONE,       /* every trainer is done; `step` is the sum of their steps */
    DP_COORD_ATTACH,     /* this coordinator was restarted into a running job: the
                            loop fills state's evaluator part (history, best) from
                            the newest checkpoint, state->step its step (0: none),
                            before it asks again (docs/faults.md, "A lost chief") */
    DP_COORD_KIND_COUNT
} dp_coord_kind;

typedef struct dp_coord_event {
    dp_coord_kind kind;
    int epoch;
    long step;
    dp_epoch_stats stats; /* EPOCH */
} dp_coord_event;

/* Which weights params() returns. */
typedef enum dp_weights {
    DP_WEIGHTS_LIVE,    /* the current parameters */
    DP_WEIGHTS_AVERAGE, /* their moving average (--ema), where the strategy keeps it */
    DP_WEIGHTS_COUNT
} dp_weights;

/* A strategy's own settings (docs/architecture.md, "A strategy's
 * settings"): its options, the struct they fill (opaque to the loop: it
 * travels in dp_train_config's strategy_cfg), its defaults and checks, its
 * part of the run identity and its restart policy.  Strategies of a family
 * share one (the ps strategies and model-avg). */
typedef struct dp_strategy_ops dp_strategy_ops;
typedef struct dp_strategy_conf {
    const dp_opt *opts;   /* in --help order, under "strategy" */
    int n_opts;
    size_t size;          /* of the settings struct (<= DP_STRATEGY_CFG_MAX) */
    const void *defaults; /* a settings struct holding every default */
    /* Options of this conf given (differing from the defaults) under
     * another strategy, cfg->strategy: -1 with the refusal, or 0 where they
     * are quietly unused.  NULL: always 0. */
    int (*foreign)(const void *own, const dp_train_config *cfg, dp_err *err);
    /* Its settings against each other and the generic ones, before
     * anything opens (train, launch, dp_train_run): 0, or -1 naming the
     * flag.  NULL: none. */
    int (*check)(const void *own, const dp_train_config *cfg, dp_err *err);
    /* Its settings against the cluster's `chief` (0 or 1), `workers` and
     * `ps` tasks where they are known before any task starts (launch asks
     * it first, then check): 0, or -1 naming the flag.  NULL: none. */
    int (*check_tasks)(const void *own, const dp_train_config *cfg, int chief, int workers,
                       int ps, dp_err *err);
    /* Its part of the run identity (checkpoint.h's settings) at `part`:
     * 0 right after "ema=", 1 after "clip_norm=" (where those checkpoints
     * have always carried it).  Appends to buf.  NULL: nothing. */
    void (*identity)(const void *own, int part, char *buf, size_t cap);
    /* The launcher's question for a failed task of `role` under ops: a
     * dp_launch survives answer (launcher.h), with why; `checkpoints`: the
     * train command writes them (--checkpoint-dir), without which no
     * DP_LAUNCH_RESTART_ALL.  NULL: ops's survives, no_rejoin and
     * restarts_all decide. */
    int (*restart)(const void *own, const dp_strategy_ops *ops, dp_role role, int checkpoints,
                   char *why, size_t cap);
} dp_strategy_conf;

struct dp_strategy_ops {
    const char *name;    /* the --strategy value: written here and nowhere else */
    const char *summary; /* one line for --help and the docs */
    const dp_strategy_conf *conf; /* its settings; NULL: none of its own */
    const char *no_checkpoints; /* NULL: it writes training-state checkpoints;
                            else why not, which --checkpoint-dir's refusal quotes */
    int reshards;        /* DP_RESHARD_* (train_state.h): DP_RESHARD_ANY, its
                            checkpoints hold whole vectors, which any number of
                            workers and ps tasks takes up on --resume (lbfgs);
                            DP_RESHARD_PS, any number of ps tasks, and of workers
                            under --global-batch (the ps family); NONE (0): a
                            resume needs the cluster that wrote them */
    int cluster;         /* 1: runs on a cluster of tasks; 0: one process */
    int data_parallel;   /* 1: each trainer holds the whole model and steps on the
                            gradients of its own batch (dp_grad_ops): what the
                            scaling experiment compares (docs/experiments.md) */
    int devices;         /* 1: its trainers run on --device cuda or sim (docs/gpu.md,
                            "Strategies"); 0: the CPU only */
    int buffers;         /* 1: trains models with buffers (batch norm), by its rule in
                            docs/strategies.md, "Buffers"; 0: refuses them */
    const char *no_clip; /* NULL: it clips the whole gradient by --clip-norm
                            (docs/training.md, "Gradient clipping"); else why it
                            cannot, which the loop's refusal quotes */
    const char *no_clip_device; /* NULL: it clips on --device too (the gradient
                            comes to the host: host staging); else why not */
    unsigned survives;   /* DP_ROLE_BIT(role) for each role whose failed task the
                            run goes on without, and which rejoins when restarted
                            (docs/faults.md); the launcher asks it */
    unsigned no_rejoin;  /* of survives, the roles whose restarted task cannot
                            rejoin (lbfgs: its coordinator hands portions only
                            to the workers it started with): the launcher
                            leaves such a task out rather than restart it */
    unsigned restarts_all; /* of the roles it does not survive, those whose loss it
                            survives by every task starting again from the newest
                            checkpoint (--resume), under launch --max-restarts and
                            with --checkpoint-dir (lbfgs: chief, ps; pipeline and
                            model-parallel: every task) */
    unsigned needs;      /* DP_ROLE_BITs of the roles a cluster must have a task of
                            (the ps strategies: a chief, workers and ps tasks) */
    unsigned refuses;    /* DP_ROLE_BITs of the roles it has no use for (allreduce,
                            pipeline, model-parallel: ps); both for
                            dp_strategy_check_cluster, before any task waits */
    unsigned talks_to[DP_ROLE_COUNT]; /* per role, the DP_ROLE_BITs of the roles its
                            tasks exchange frames with; all zero: every task.  The
                            node connects only these, so a restarted task never
                            waits for a peer it has no business with */
    /* The links its settings add to talks_to (NULL: none), as bits of
     * talks_to[role] (the ps family's --ps-push host: worker to worker). */
    void (*links)(const dp_train_config *cfg, unsigned talks_to[DP_ROLE_COUNT]);

    /* Rows the model must hold at once (NULL: the batch, twice it in a
     * cluster); the loop makes it at least its evaluation chunk. */
    int (*model_rows)(const dp_train_config *cfg);
    /* Whether a worker's model may hold its sparse tables compact, only
     * the rows of the batch in flight (dp_model_init_compact): the strategy
     * moves them by rows and nothing of a worker needs them whole (NULL:
     * never).  The strategy's step then turns the batch's ids into slots.
     * The loop builds a ps task's model so too (its shards hold the rows),
     * and the chief's unless it keeps --keep-best weights (docs/strategies.md,
     * "The chief on rows"), which then evaluates through eval_rows and
     * writes its files through table_rows. */
    int (*compact_tables)(const dp_train_config *cfg);
    /* Evaluator with compact tables: pulls the rows that n records of x
     * touch into the weights params() last returned and gives x with its ids
     * turned into their slots (valid until the next call; NULL with err). */
    const float *(*eval_rows)(dp_strategy *s, const float *x, int n, dp_err *err);
    /* Evaluator with compact tables writing a file (--save, checkpoints):
     * the next n floats of part `part` (0 the rows, j optimiser slot j - 1's)
     * of sparse table k, whole (dp_ckpt_rows_fn's order), streamed from where
     * they live; k -1 ends a pass (what it left unread is skipped). */
    int (*table_rows)(dp_strategy *s, int part, int k, float *buf, size_t n, dp_err *err);
    /* Sets up this task's part of the run (from env->resume when resuming). */
    int (*open)(dp_strategy **out, const dp_run_env *env, dp_task_info *info, dp_err *err);
    /* SERVER: serves until the run is over. */
    int (*serve)(dp_strategy *s, dp_err *err);
    /* TRAINER: one step on a batch of n records (n may be 0 when this
     * shard ran out before the others: synchronous strategies still take
     * part); lr is this step's learning rate.  Allocates nothing. */
    int (*step)(dp_strategy *s, const float *x, const uint8_t *y, int n, float lr, long step,
                dp_step_out *out, dp_err *err);
    /* TRAINER, before each epoch (0-based `epoch`): the data shard to walk,
     * *index of *count, when the live trainers changed (one lost, one back:
     * docs/faults.md).  NULL: info's shard throughout. */
    int (*deal)(dp_strategy *s, int epoch, int *index, int *count, dp_err *err);
    /* TRAINER: after epoch `epoch` (1-based): this trainer's figures in,
     * the run's out (meaningful on the evaluator). */
    int (*epoch_end)(dp_strategy *s, int epoch, dp_epoch_stats *stats, dp_err *err);
    /* COORDINATOR: waits for the next thing to do.  A CHECKPOINT's state is
     * in *st; the trainers go on when the loop next calls next(). */
    int (*next)(dp_strategy *s, dp_coord_event *ev, dp_train_state *st, dp_err *err);
    /* Evaluator: the weights to evaluate now (they stay valid until the
     * next call into the strategy). */
    const float *(*params)(dp_strategy *s, dp_weights which, dp_err *err);
    /* TRAINER at a checkpoint step: contribute this task's state.  Returns
     * 1 when this task writes the checkpoint (st filled: parameters and
     * optimiser state), 0 when another task writes it, -1 on error. */
    int (*save)(dp_strategy *s, long step, dp_train_state *st, dp_err *err);
    /* TRAINER after its last step: flush what is pending, say goodbye. */
    int (*finish)(dp_strategy *s, long steps, dp_err *err);
    /* TRAINER that is not the evaluator (or is one on standby), after
     * `steps` steps, on SIGTERM: the step is complete; tell whoever must
     * know that it leaves for good, so the run goes on without it and deals
     * its data to the others (docs/faults.md, "Draining").  The loop then
     * ends the task well: the node says BYE.  A strategy whose trainers can
     * never leave a running job returns -1 saying so (pipeline,
     * model-parallel): the task then fails, a lost task.  NULL: this
     * strategy cannot drain a trainer, and SIGTERM
     * keeps its default action (the task dies: a fault). */
    int (*leave)(dp_strategy *s, long steps, dp_err *err);
    void (*close)(dp_strategy *s); /* NULL is a no-op */
};

/* Every strategy, in --help order, and lookup by name. */
extern const dp_strategy_ops *const dp_strategies[];
extern const int dp_strategy_count;
const dp_strategy_ops *dp_strategy_find(const char *name, dp_err *err);
/* The settings of cfg's strategy as `conf` reads them: cfg->strategy_cfg
 * when cfg holds that conf's (dp_strategy_select), else its defaults. */
const void *dp_strategy_settings(const dp_train_config *cfg, const dp_strategy_conf *conf);
/* Makes `name` cfg's strategy, its settings the defaults: 0, or -1 with
 * the unknown name and the valid ones. */
int dp_strategy_select(dp_train_config *cfg, const char *name, dp_err *err);
/* Sets the option --name of cfg's strategy from text, as train's command
 * line would (for tests and bindings): 0, or -1 with the message. */
int dp_strategy_set(dp_train_config *cfg, const char *name, const char *value, dp_err *err);
/* cfg against its strategy before anything opens (train, launch,
 * dp_train_run): --device under one whose trainers run on the CPU only
 * (naming those that train on a device), --clip-norm where it cannot clip
 * (ops->no_clip, no_clip_device: the reason quoted), then its conf's check
 * of its settings: 0, or -1 with the message naming the flag. */
int dp_strategy_check(const dp_train_config *cfg, dp_err *err);
/* A model with buffers (batch norm's running statistics) under a strategy
 * without a rule for them: refused, naming the strategies that have one
 * (docs/strategies.md, "Buffers").  downpour launch asks it before any
 * task starts, the loop when the model is built. */
int dp_strategy_check_buffers(const dp_model *m, const char *strategy, dp_err *err);
/* cfg's strategy's check against a cluster known before it starts
 * (conf->check_tasks): 0, or -1. */
int dp_strategy_check_tasks(const dp_train_config *cfg, int chief, int workers, int ps,
                            dp_err *err);
/* cfg's run identity part `part` (conf->identity; see there). */
void dp_strategy_identity(const dp_train_config *cfg, int part, char *buf, size_t cap);
/* The launcher's survives answer for a failed task of `role`, with why
 * (conf->restart; `checkpoints`: the run writes them). */
int dp_strategy_restart(const dp_strategy_ops *ops, const void *settings, dp_role role,
                        int checkpoints, char *why, size_t cap);
/* The answer of a strategy that survives losing a `role` task only by every
 * task starting again from the newest checkpoint: DP_LAUNCH_RESTART_ALL
 * with `checkpoints`, else 0, why saying what would have let it survive;
 * `who` names it in why ("pipeline", "ps-async --model-parallel"). */
int dp_strategy_restart_all(const char *who, dp_role role, int checkpoints, char *why,
                            size_t cap);
/* "single, ps-async, ...": every name, for messages. */
const char *dp_strategy_names(void);
/* The strategy against a cluster of `chief` (0 or 1), `workers` and `ps`
 * tasks (chief < 0: no cluster, one process alone), checked before any task
 * connects: 0, or -1 with why and the launch options that fit (a usage
 * error: the same answer on every task). */
int dp_strategy_check_cluster(const dp_strategy_ops *ops, int chief, int workers, int ps,
                              dp_err *err);
/* The data-parallel trainers of ops on a cluster of `chief` (0 or 1) and
 * `workers` tasks: the workers, and the chief where it trains as position 0
 * (a strategy that does not need it as its coordinator: allreduce); 1 for
 * a strategy of one process.  What --global-batch is shared among. */
int dp_strategy_trainers(const dp_strategy_ops *ops, int chief, int workers);
/* The `downpour launch` options of a cluster this strategy runs on, with
 * `workers` workers: "--workers 2", "--chief --workers 2 --ps 1".  For
 * hints that are complete commands. */
void dp_strategy_launch_options(const dp_strategy_ops *ops, int workers, char *buf, size_t cap);

/* ------------------------------------------------------------------------
 * The data-parallel interface: every replica computes gradients of its own
 * batch; the strategy turns them into parameters. */
typedef struct dp_grad_ops {
    /* Before backprop of `step` over `records` records (may be NULL). */
    void (*begin)(void *self, long step, int records);
    /* Backprop's hook: gradients [lo, n_params) are final (may be NULL). */
    void (*ready)(void *self, size_t lo);
    /* Gradients -> parameters with learning rate lr. */
    int (*update)(void *self, float *params, const float *grads, int records, float lr,
                  dp_err *err);
} dp_grad_ops;

/* The tasks of a strategy that splits the model (pipeline, model-parallel):
 * the chief, if any, then the workers, in rank order, are its positions.
 * Refuses ps tasks, other roles and --ema (no task holds every live weight),
 * naming the strategy `what`.  *ranks (malloc'd, the caller frees) gets each
 * position's transport rank, *position this task's; returns their number,
 * or -1 with err. */
int dp_split_positions(const dp_run_env *env, const char *what, int **ranks, int *position,
                       dp_err *err);

/* The data-parallel step: begin, forward and backward (gradients zeroed when
 * n is 0), update.  Gives out->loss and out->correct.  Forward and backward
 * run through replica r (dp_replica_grads: on a device, host staging or the
 * gradients kept there, deferred), or, r NULL, on the host model m. */
int dp_data_parallel_step(dp_model *m, dp_replica *r, const dp_grad_ops *ops, void *self,
                          const float *x, const uint8_t *y, int n, float lr, long step,
                          dp_step_out *out, dp_err *err);

/* A trainer's replica (replica.h) for env: env->model with the run's
 * optimiser when with_optim, resumed from env->resume, on env->cfg->device,
 * labelled `label`. */
int dp_strategy_replica_open(const dp_run_env *env, const char *label, int with_optim,
                             dp_replica **out, dp_err *err);

/* The strategies (src/strategy/<name>.c). */
extern const dp_strategy_ops dp_strategy_single, dp_strategy_ps_async, dp_strategy_ps_sync,
    dp_strategy_ps_ssp, dp_strategy_ps_dssp, dp_strategy_model_avg, dp_strategy_allreduce,
    dp_strategy_pipeline, dp_strategy_model_parallel, dp_strategy_lbfgs;

/* pipeline (instrumentation for tests): the most micro-batches whose
 * activations this stage has held at once so far.  s must be a pipeline
 * stage. */
int dp_pipeline_peak(const dp_strategy *s);

/* lbfgs (instrumentation for tests): on the chief, the portions evaluated,
 * the backup copies handed out and the duplicate results ignored so far. */
void dp_lbfgs_counts(const dp_strategy *s, long *portions, long *backups, long *duplicates);

#endif
