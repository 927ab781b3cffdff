/* Parameter-server training (DistBelief's Downpour SGD and its relatives).
 * Each ps task owns a contiguous range of the flat parameter vector (the
 * min-size partitioner's shards), keeps the optimiser state for it and
 * applies updates; workers push gradients (or, for model averaging,
 * parameters) and pull parameters.  The consistency mode says when a worker
 * gets its parameters back:
 *   async  at once (Downpour SGD), every fetch_every steps; gradients are
 *          accumulated over push_every steps before a push
 *   sync   when every live worker has pushed for this step; the server
 *          applies the records-weighted mean gradient once
 *   ssp    when the slowest live worker's clock is at least clock - staleness
 *   dssp   as ssp with a bound adapted within [lo, hi] from worker speeds
 *   avg    workers train locally; every `period` steps they push parameters,
 *          the server waits for all, averages (records-weighted), hands back */
#ifndef DOWNPOUR_PS_H
#define DOWNPOUR_PS_H

#include <stddef.h>

#include "downpour/cluster.h"
#include "downpour/optim.h"
#include "downpour/partition.h"
#include "downpour/status.h"
#include "downpour/transport.h"

typedef enum dp_ps_mode {
    DP_PS_ASYNC,
    DP_PS_SYNC,
    DP_PS_SSP,
    DP_PS_DSSP,
    DP_PS_AVG,
    DP_PS_MODE_COUNT
} dp_ps_mode;

typedef struct dp_ps_config {
    dp_ps_mode mode;
    int fetch_every;        /* async: pull parameters every n steps (1) */
    int push_every;         /* async: push accumulated gradients every n steps (1) */
    int staleness;          /* ssp: s (3) */
    int staleness_lo, staleness_hi; /* dssp: range (1:6) */
    int period;             /* avg: local steps between averages (8) */
    size_t min_shard_bytes; /* partitioner (256 KiB) */
    int max_shards;         /* partitioner (0: one per ps task) */
    float ema;              /* servers keep an exponential moving average of the
                               parameters with this decay (0: none) for the chief */
} dp_ps_config;

void dp_ps_config_init(dp_ps_config *cfg);

/* Where each shard lives: shard s is range[s] on ps task rank[s]. */
typedef struct dp_ps_layout {
    int n_shards;
    dp_range range[DP_PARTITION_MAX];
    int rank[DP_PARTITION_MAX];
} dp_ps_layout;

/* Shards over the cluster's ps tasks, one contiguous range per task at most;
 * a run with no ps task is refused. */
int dp_ps_layout_make(dp_ps_layout *out, const dp_cluster *c, size_t n_params,
                      const dp_ps_config *cfg, dp_err *err);

/* Serves this task's shard until the chief says SHUTDOWN or every worker and
 * the chief are gone.  init holds the whole initial parameter vector (every
 * task computes the same one from the seed).  Returns -1 when a worker is
 * lost in a mode that cannot go on without it. */
int dp_ps_serve(dp_transport *t, const dp_cluster *c, const dp_ps_layout *layout,
                const dp_ps_config *cfg, const dp_optim_config *optim, const float *init,
                size_t n_params, dp_err *err);

/* A worker's (or the chief's) side. */
typedef struct dp_ps_client dp_ps_client;

/* local_optim is used only by model averaging (the workers' own optimiser). */
int dp_ps_client_open(dp_ps_client **out, dp_transport *t, const dp_ps_layout *layout,
                      const dp_ps_config *cfg, const dp_optim_config *local_optim,
                      size_t n_params, dp_err *err);
void dp_ps_client_free(dp_ps_client *c);

/* After a local forward/backward over `records` records (0: an empty tail
 * batch in a synchronous mode), turns grads into new params as the mode
 * says.  lr_scale multiplies the optimiser's learning rate for this update
 * (the schedule travels with the gradient, so servers need no clock of their
 * own).  Allocates nothing. */
int dp_ps_client_step(dp_ps_client *c, float *params, const float *grads, int records,
                      float lr_scale, dp_err *err);
/* At the end of training: pushes what is still accumulated (async with
 * push_every > 1) or averages a last short period (avg), and takes the
 * parameters back. */
int dp_ps_client_flush(dp_ps_client *c, float *params, dp_err *err);
/* Fetches every shard's parameters into params; with average set, the
 * servers' moving average of them instead (cfg.ema > 0). */
int dp_ps_client_pull(dp_ps_client *c, float *params, int average, dp_err *err);
/* The largest gap (own clock minus the slowest clock the servers reported)
 * this client has been allowed to run with. */
long dp_ps_client_max_gap(const dp_ps_client *c);

#endif
