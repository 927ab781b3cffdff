/* What a training run is asked to do (dp_train_config): the settings the
 * loop (train.h) runs with and hands each strategy (strategy.h) whole.  A
 * header of its own, on the strategy level, so that strategy.h needs
 * nothing of the loop's header above it (docs/architecture.md, "Module
 * order"); train.h includes it, so its users see no change. */
#ifndef DOWNPOUR_TRAIN_CONFIG_H
#define DOWNPOUR_TRAIN_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "downpour/augment.h"
#include "downpour/dataset.h"
#include "downpour/device.h"
#include "downpour/optim.h"

/* Learning rate over the run (docs/training.md, "Learning-rate schedule"):
 * constant (Keras's default), a cosine decay from lr to 0 over the steps
 * after the warm-up, or a step decay by gamma every step_every steps of the
 * run (torch's StepLR); all after an optional linear warm-up. */
typedef enum dp_lr_schedule {
    DP_LR_CONSTANT,
    DP_LR_COSINE,
    DP_LR_STEP,
    DP_LR_COUNT
} dp_lr_schedule;

/* --sum-chunk: the most chunks one push carries (the transport gathers at
 * most 64 pieces a frame, one of them the push's head). */
#define DP_PS_MAX_CHUNKS 63

/* Room for a strategy's settings in dp_train_config: its struct is copied
 * with the config, so no one frees it (each strategy checks its size). */
#define DP_STRATEGY_CFG_MAX 256

struct dp_strategy_conf;

typedef struct dp_train_config {
    const char *dataset;      /* name, directory, glob or file (see dataset.h, records.h) */
    dp_dataset_options data;  /* record files: feature names, split patterns, cache or stream */
    const char *model;        /* preset or spec (see model.h) */
    const char *strategy;     /* a name from the strategy table (strategy.h): "single", ... */
    /* the strategy's own settings (strategy.h, dp_strategy_conf), opaque
     * here: strategy_conf says whose they are (NULL: the strategy's
     * defaults); set with dp_strategy_select and dp_strategy_set */
    const struct dp_strategy_conf *strategy_conf;
    _Alignas(max_align_t) unsigned char strategy_cfg[DP_STRATEGY_CFG_MAX];
    dp_shard_policy shard;    /* how workers split the training records (data) */
    double collective_timeout; /* allreduce, pipeline, model-parallel, lbfgs: s to wait
                                  for a neighbour (300) */
    int straggler;            /* worker index slowed on purpose, -1 for none */
    double straggler_ms;      /* its extra milliseconds per step (lbfgs: per portion) */
    bool trace_clocks;        /* a "clock" metrics event per step (for tests) */
    int batch;                /* per-step batch (each worker's) */
    int global_batch;         /* --global-batch N: a step's records over all workers;
                                 the loop sets batch to N / workers (0: batch rules) */
    int sum_chunk;            /* --sum-chunk C (ps-sync with global_batch): each worker's
                                 gradient is pushed as chunks of C consecutive records
                                 and the shards add them in the step's order, so any
                                 number of workers sums the same bits (0: off) */
    int epochs;
    dp_optim_config optim;
    dp_lr_schedule lr_schedule;
    long warmup_steps;        /* linear warm-up over this many steps (0: none) */
    int warmup_epochs;        /* or over this many epochs (0: none; not with warmup_steps) */
    int lr_step_every;        /* step schedule: epochs between decays */
    float lr_gamma;           /* step schedule: the factor at each decay (0.1) */
    dp_augment augment;       /* training batches' crop and flip (pad and flip set; none: 0) */
    float clip_norm;          /* clip the whole gradient to this global norm before each
                                 update, as torch's clip_grad_norm_ (0: off) */
    float ema;                /* evaluate and save an exponential moving average of
                                 the parameters with this decay (0: the parameters) */
    bool keep_best;           /* report and save the epoch with the best validation
                                 accuracy, not the last (Keras restore_best_weights) */
    uint64_t seed;
    uint32_t n_train, n_val;  /* split of the training file: 54,000 / 6,000 */
    uint32_t n_test;          /* test records evaluated at the end (the first N); 0: all */
    int log_every;            /* steps between "Worker 0, At step ..." lines and "train"
                                 metrics events (train_loss every N steps); 0 = never */
    bool quiet;               /* no step lines on stderr (the "train" events stay) */
    int threads;              /* BLAS threads; 0 = leave as configured */
    bool progress;            /* draw a progress bar (stderr is a terminal) */
    const char *transport;    /* "tcp" (default) or "mpi" */
    int mpi_ps;               /* mpi: ps ranks after the chief (rank 0) */
    const char *metrics_path; /* JSON Lines, or NULL */
    const char *trace_path;   /* a timeline in the Chrome trace format, or NULL (trace.h) */
    const char *tensorboard_dir; /* TensorBoard event files (docs/tensorboard.md), or NULL */
    const char *save_path;    /* safetensors weights at the end, or NULL */
    const char *checkpoint_dir; /* training-state checkpoints go here, or NULL */
    long checkpoint_every;    /* steps between checkpoints (0: only at the end of the run) */
    int keep_checkpoints;     /* the newest K are kept (3) */
    bool resume;              /* continue from the newest valid checkpoint in checkpoint_dir */
    bool encrypt;             /* cluster: encrypt payloads between tasks (docs/transport.md) */
    const char *secret_file;  /* the cluster secret (NULL: DOWNPOUR_SECRET) */
    double startup_timeout;   /* s a task waits for every peer (0: the node's, 600) */
    double heartbeat_timeout; /* s of silence before a peer is lost (0: the node's, 10) */
    int spare_workers;        /* the spec's last N worker slots start empty: a task started
                                 for one later joins the running job (docs/cluster.md,
                                 "Spare slots: growing a running job") */
    double link_delay_ms;     /* tcp: latency added to every frame this task sends (0: none) */
    bool no_shm;              /* tcp: peers on this host over TCP, not shared memory */
    dp_device_spec device;    /* where trainers compute: cpu (the default), cuda:N, sim */
    /* an external model (external.h: a torch module's flat parameters and
     * its step) trained in place of `model`; NULL: `model` (which may name
     * a registered one, "external:NAME") */
    const dp_external_model *external;
} dp_train_config;

#endif
