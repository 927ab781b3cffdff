/* A cost model: from a short calibration run (compute per record, the model's
 * size, a link's speed) it predicts how long each data-parallel strategy
 * takes on a cluster the user describes, names what bounds it, and ranks the
 * strategies.  The equations and their limits are in docs/cost_model.md;
 * every term is plain arithmetic on the structs below, so a test can check
 * one by hand. */
#ifndef DOWNPOUR_COST_MODEL_H
#define DOWNPOUR_COST_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "downpour/compress.h"
#include "downpour/ring.h"
#include "downpour/status.h"

typedef enum dp_cost_strategy {
    DP_COST_SINGLE,
    DP_COST_PS_ASYNC,
    DP_COST_PS_SYNC,
    DP_COST_ALLREDUCE,
    DP_COST_STRATEGY_COUNT
} dp_cost_strategy;

/* What bounds a step (or, for ps-async, the rate of all workers' steps). */
typedef enum dp_cost_bottleneck {
    DP_COST_BOUND_COMPUTE,  /* the workers' forward, backward and framework time */
    DP_COST_BOUND_PS_LINK,  /* a parameter server host's link */
    DP_COST_BOUND_PS_CPU,   /* a parameter server applying every push */
    DP_COST_BOUND_RING,     /* the all-reduce's bytes and latency hops */
    DP_COST_BOUND_COUNT
} dp_cost_bottleneck;

/* Measured once, on one core.  Frameworks slower than ours (TensorFlow) are
 * described by the two overhead terms; downpour's own are 0. */
typedef struct dp_cost_calibration {
    double sample_s;         /* forward + backward per training record, one core */
    double apply_s_per_param; /* one optimiser update per parameter (memory-bound) */
    double step_overhead_s;  /* framework seconds per step, not parallelised */
    double record_overhead_s; /* framework seconds per record (input pipeline) */
    double thread_gain;      /* each core beyond the first adds this much of one core */
    size_t n_params;         /* floats in the model */
    double codec_s_per_float; /* bf16/fp16: encode and decode one float (allreduce --compress) */
    double topk_s_per_float;  /* the ps family: one top-k (or 4-bit answer) encode a float */
} dp_cost_calibration;

/* The cluster: identical hosts, each with one link of `bandwidth` bytes/s in
 * each direction, `latency` seconds one way per message.  Tasks are placed
 * as `downpour launch`/TensorFlow runs place them: ps tasks first, then the
 * chief, then the workers, round-robin over the hosts. */
typedef struct dp_cost_cluster {
    int hosts;
    int cores;        /* per host */
    double bandwidth; /* bytes/s, each way, per host */
    double latency;   /* seconds, one way */
    int workers;
    int ps;
    int chief;        /* 0 or 1; with allreduce the chief is replica 0 */
    int tasks_per_host; /* 0: round-robin over the hosts; K: K tasks to a host in
                           rank order (scripts/vcluster.sh --tasks-per-host) */
    double local_bandwidth; /* bytes/s between two all-reduce members of one host
                               (shared memory); 0: they use the host's link */
} dp_cost_cluster;

/* A model's sparse tables as the cost model sees them (docs/cost_model.md,
 * "Sparse tables"): each table's width, the unique rows one worker's batch
 * touches in expectation (from the data's id distribution,
 * dp_cost_zipf_unique, or measured), and the most it can touch (min(rows,
 * batch x ids a record): allreduce chooses the all-gather from this bound,
 * docs/strategies.md). */
#define DP_COST_MAX_TABLES 16
typedef struct dp_cost_sparse {
    int tables;
    size_t table_floats;             /* every table's rows x width, part of n_params */
    int width[DP_COST_MAX_TABLES];
    double rows[DP_COST_MAX_TABLES];  /* expected unique rows a batch touches */
    double bound[DP_COST_MAX_TABLES]; /* the most a batch can touch */
} dp_cost_sparse;

typedef struct dp_cost_job {
    dp_cost_strategy strategy;
    int batch;           /* per worker (per replica for allreduce) */
    int epochs;
    long train_records;
    long val_records;    /* validated each epoch by the chief (or replica 0) */
    size_t bucket_bytes; /* allreduce: gradient bytes per ring all-reduce (512 KiB) */
    const dp_cost_sparse *sparse; /* NULL: every parameter moves whole (or --ps-dense,
                                     --allreduce-dense) */
    dp_allreduce_algo algo; /* allreduce: --allreduce-algo (auto: the strategy's rule) */
    dp_compress compress;   /* allreduce: --compress (auto: bf16 where predicted faster);
                               ps-async, ps-sync: the workers' pushes (bf16, fp16, topk;
                               auto: the workers' rule, ps_auto.c, on the link's terms) */
    int ps_reply_bf16;      /* ps-async, ps-sync: --ps-reply bf16 */
    double ps_reply_topk;   /* ps-async, ps-sync: --ps-reply topk:RATIO (> 0), answers
                               of ceil(RATIO n_s) (index, value) pairs */
    int ps_reply_delta4;    /* ps-async, ps-sync: --ps-reply delta4, answers of 4 bits a
                               parameter (12 + ceil(n_s / 2) bytes) */
    size_t psgd_floats;     /* powersgd: factor + whole floats a step (dp_cost_powersgd) */
    double psgd_madds;      /* powersgd: its products' multiply-adds a step */
} dp_cost_job;

typedef struct dp_cost_prediction {
    long steps_per_epoch;   /* per worker */
    int replicas;           /* tasks that train */
    double compute_s;       /* one step's compute on the slowest worker */
    double comm_s;          /* one step's communication (ring, or push and pull) */
    double apply_s;         /* one step's optimiser update on its critical path */
    double step_s;          /* one worker's step, everything included */
    double epoch_s;
    double total_s;         /* epochs x epoch_s, plus the last validation */
    double bytes_per_step;  /* one worker's bytes sent per step (frame headers included) */
    double busiest_link_bytes; /* bytes per step through the busiest host link, one direction */
    dp_cost_bottleneck bottleneck;
    char why[320];          /* one sentence: what bounds it, with its figure */
    char how[160];          /* allreduce: the algorithm and codec taken, and why; the ps
                               family under --compress auto: the codec it takes, and why */
} dp_cost_prediction;

const char *dp_cost_strategy_name(dp_cost_strategy s); /* the --strategy value */
/* -1 for a name the model does not cover. */
int dp_cost_strategy_parse(const char *name);
const char *dp_cost_bottleneck_name(dp_cost_bottleneck b);

/* batch 128, 25 epochs, 54,000 + 6,000, 512 KiB, all-reduce algorithm auto, no compression */
void dp_cost_job_init(dp_cost_job *job);
/* Thread gain 0.6 (docs/benchmarks.md: two threads are 1.6x one), Adam's
 * update at 0.45 ns a parameter (120 us for 266,610), a bf16 codec at 3.5 ns
 * a float (docs/strategies.md, "allreduce: compression"), a top-k coder at
 * 17.4 ns a float (docs/strategies.md, "ps family: compression"). */
void dp_cost_calibration_init(dp_cost_calibration *cal);

/* Refuses what no cluster has (0 hosts, no bandwidth, a strategy without
 * the tasks it needs), naming the field. */
int dp_cost_predict(const dp_cost_calibration *cal, const dp_cost_cluster *cl,
                    const dp_cost_job *job, dp_cost_prediction *out, dp_err *err);

/* Bytes one ps-async/ps-sync worker sends per step (push frames to every
 * shard) and receives (parameter frames), with frame headers, for the shard
 * layout of `ps` tasks (docs/strategies.md, "Roles": the min-size partitioner). */
int dp_cost_ps_bytes(size_t n_params, int ps, double *push_bytes, double *pull_bytes, dp_err *err);
/* Bytes one of n ring replicas sends per step: 2(n-1)/n of the gradient plus
 * a frame header per segment. */
double dp_cost_ring_bytes(size_t n_params, int n, size_t bucket_bytes);

/* The expected number of distinct ids among `draws` independent draws from
 * a Zipf law of exponent zipf over n ids (P(rank k) ~ k^-zipf):
 * sum over k of 1 - (1 - p_k)^draws.  O(n). */
double dp_cost_zipf_unique(uint32_t n, double zipf, double draws);

/* Sparse rows on the parameter servers (docs/strategies.md, "Sparse rows"):
 * the bytes one worker sends (PULL_ROWS and PUSH_ROWS to every shard) and
 * receives (ROWS and PARAMS) per step, with frame headers, the dense
 * parameters cut with a floor of one float so every ps task holds a shard,
 * and each table's rows spread evenly over the shards (id mod S).  sp
 * NULL: no tables, dp_cost_ps_bytes. */
int dp_cost_sparse_ps_bytes(size_t n_params, const dp_cost_sparse *sp, int ps, double *sent,
                            double *received, dp_err *err);
/* The sparse all-gather under allreduce (docs/strategies.md, "Sparse tables
 * under allreduce"): the bytes one of n replicas sends per step forwarding
 * n-1 blocks of sum over tables (4 + rows (4 + 4 width)), with a frame
 * header per segment; rows = sp->rows (expected) or sp->bound (bound != 0). */
double dp_cost_gather_bytes(const dp_cost_sparse *sp, int n, int bound);
/* What one allreduce replica sends per step with sparse tables: the dense
 * part over the ring, and the tables all-gathered when the bound says so (as
 * the strategy chooses), else all-reduced whole.  *gathered (may be NULL)
 * says which. */
double dp_cost_allreduce_sparse_bytes(size_t n_params, const dp_cost_sparse *sp, int n,
                                      size_t bucket_bytes, int *gathered);

/* The covered strategies that fit the cluster, fastest first, with one line
 * each; text holds the ranking and the reasons.  Returns how many. */
int dp_cost_recommend(const dp_cost_calibration *cal, const dp_cost_cluster *cl,
                      const dp_cost_job *job, dp_cost_prediction out[DP_COST_STRATEGY_COUNT],
                      dp_cost_strategy order[DP_COST_STRATEGY_COUNT], char *text, size_t text_cap,
                      dp_err *err);

/* Calibration from a short single-process run's metrics (--threads 1): the
 * median step of its `steps` events when there are some, else the `done`
 * event's samples_per_second.  Fills sample_s and n_params (from the done
 * event's model); *batch receives the run's batch (may be NULL). */
int dp_cost_calibrate_from_metrics(const char *path, dp_cost_calibration *cal, int *batch,
                                   dp_err *err);

/* Parameters of a model spec ("mlp-300-100"), without allocating its buffers
 * for long. */
int dp_cost_model_params(const char *model, size_t *n_params, dp_err *err);
/* What --compress powersgd:rank sums a step for a model spec (the
 * strategy's plan, powersgd.h): factor + whole floats, and the
 * multiply-adds of its four products a matrix (P, Q, the residual, P Q^T). */
int dp_cost_powersgd(const char *model, int rank, size_t *floats, double *madds, dp_err *err);

/* One measured run, for validation: what its `done` event says. */
typedef struct dp_cost_run {
    char strategy[32];
    char model[64];
    int batch, epochs, workers, ps;
    double train_seconds;
    double samples_per_second;
} dp_cost_run;
int dp_cost_read_done(const char *path, dp_cost_run *run, dp_err *err);

/* A loopback TCP link between two threads of this process: bytes/s of a
 * 64 MiB stream in 1 MiB writes and the one-way latency (half a 64-byte
 * round trip).  What two tasks on this host get, before framing. */
int dp_cost_measure_loopback(double *bytes_per_s, double *latency_s, dp_err *err);

/* The source experiment's 12 TensorFlow times (9 hosts of 4 cores) beside
 * the model's predictions, as a Markdown table on out: cal's sample_s is for
 * a model of cal_params parameters (scaled to each cell's model); fit A
 * fits one per-step overhead on MNIST PS batch 128, fit B a per-step and a
 * per-record overhead on MNIST PS batches 128 and 256; the errors of the
 * cells not fitted are summed up at the end. */
int dp_cost_validate_source(const dp_cost_calibration *cal, size_t cal_params, double bandwidth,
                            double latency, FILE *out, dp_err *err);

#endif
