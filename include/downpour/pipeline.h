/* Layer pipelining's pure parts (src/strategy/pipeline_plan.c): which layers
 * each stage runs, and in which order a stage runs the forwards and
 * backwards of a batch's micro-batches.  The strategy that moves activations
 * between stages is src/strategy/pipeline.c (docs/strategies.md,
 * "pipeline").
 *
 * Stages.  The model's layers [0, n_layers) are cut into S contiguous ranges,
 * stage s running [first[s], first[s+1]) with first[0] = 0 and first[S] =
 * n_layers, each stage at least one layer.  Given no --split, the cut
 * minimises the largest stage's cost (a dense layer costs in*out
 * multiply-adds, any other layer its width), cutting after a relu where
 * there are enough such places, so a dense and its relu stay one fused
 * kernel (model.h).
 *
 * Schedules.  A stage's work on one batch of M micro-batches is 2M actions,
 * each the forward or the backward of one micro-batch.  Stage s's forward of
 * micro-batch m needs stage s-1's; its backward of m needs its own forward of
 * m and stage s+1's backward of m.  Backwards run in micro-batch order, so
 * the micro-batches whose activations a stage holds are always consecutive
 * and slot m % peak is free for micro-batch m.
 *   gpipe  every forward, then every backward: a stage holds all M
 *          micro-batches' activations at once (peak M).
 *   1f1b   PipeDream-Flush: stage s runs min(S-s-1, M) warm-up forwards,
 *          then alternates one forward and one backward, then drains the
 *          backwards: it holds at most min(S-s, M) <= S micro-batches.
 * Both end with every backward done: one synchronous update (the flush), so
 * either equals one process at the same batch. */
#ifndef DOWNPOUR_PIPELINE_H
#define DOWNPOUR_PIPELINE_H

#include "downpour/model.h"
#include "downpour/status.h"

#define DP_PIPE_MAX_STAGES DP_MAX_LAYERS /* at most one layer a stage */
#define DP_PIPE_MAX_MICRO 4096

typedef enum dp_pipe_schedule {
    DP_PIPE_GPIPE,
    DP_PIPE_1F1B,
    DP_PIPE_SCHEDULE_COUNT
} dp_pipe_schedule;

/* "gpipe", "1f1b"; -1 with a message naming the valid ones. */
int dp_pipe_schedule_parse(const char *name, dp_pipe_schedule *out, dp_err *err);
const char *dp_pipe_schedule_name(dp_pipe_schedule s);

typedef enum dp_pipe_op {
    DP_PIPE_FORWARD,
    DP_PIPE_BACKWARD,
    DP_PIPE_OP_COUNT
} dp_pipe_op;

typedef struct dp_pipe_action {
    dp_pipe_op op;
    int micro; /* 0..M-1 */
} dp_pipe_action;

/* Stage `stage` of `stages` on `micro` micro-batches: writes the 2*micro
 * actions in order into out (room for 2*micro) and returns their count, or
 * -1 for arguments out of range.  Allocates nothing (it runs in a step). */
int dp_pipe_schedule_make(dp_pipe_action *out, dp_pipe_schedule kind, int stage, int stages,
                          int micro);

/* The most micro-batches whose activations are held at once (forwarded, not
 * yet backwarded) along a stage's actions. */
int dp_pipe_schedule_peak(const dp_pipe_action *a, int n);

/* The layer ranges: first[0..stages] as above.  split: NULL (balance by
 * cost) or "a,b,..." with stages-1 strictly increasing layer indices in
 * (0, n_layers) where stages 1.. start.  Messages name the flag (--stages,
 * --split) and the model. */
int dp_pipe_partition(int *first, const dp_model *m, int stages, const char *split, dp_err *err);

/* How many stages "a,b,..." makes (its numbers + 1), or -1 with a message when it
 * is not a list of integers. */
int dp_pipe_split_count(const char *split, dp_err *err);

/* [lo, hi): the parameters of layers [a, b) in the flat buffer (lo == hi
 * when the range has no dense layer). */
void dp_pipe_param_range(const dp_model *m, int a, int b, size_t *lo, size_t *hi);

/* [lo, hi): the buffers (batch norm's running statistics) of layers [a, b)
 * in the flat buffer array, each layer's [s_off, s_off + s_len) (lo == hi
 * when the range holds none). */
void dp_pipe_buffer_range(const dp_model *m, int a, int b, size_t *lo, size_t *hi);

/* A stage's multiply-adds per record of layers [a, b), the partition's cost. */
double dp_pipe_cost(const dp_model *m, int a, int b);

/* Records of micro-batch k when n records are cut into M: the first n % M
 * get one more.  *off: where it starts. */
int dp_pipe_micro_size(int n, int M, int k, int *off);

#endif
