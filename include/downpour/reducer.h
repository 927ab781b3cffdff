/* Bucketed gradient reduction, optionally overlapped with backprop (as
 * Horovod's tensor fusion and PyTorch DDP's reducer do).  The flat gradient
 * is cut into buckets of bucket_bytes from its end, since backprop finishes
 * the last layer first.  Overlapped, a communication thread weights and
 * all-reduces each bucket over the ring as soon as backprop has finished
 * every gradient in it, while the earlier layers are still being
 * differentiated.  Inline, every bucket is reduced in dp_reducer_finish.
 * Both give the same sums, bit for bit: the ring sees the same buckets in
 * the same order either way.
 *
 * Whether to overlap depends on the machine (docs/architecture.md,
 * "Threads"): the thread only pays when a core is free for it and backprop
 * leaves it something to hide behind.  DP_OVERLAP_AUTO decides by
 * measurement: with no spare core, or when backprop makes no bucket final
 * before its end, it stays inline without measuring; otherwise the first
 * steps alternate between the two ways.  Then every replica all-reduces its
 * timings in one tiny extra bucket, so all reach the same choice from the
 * same sums. */
#ifndef DOWNPOUR_REDUCER_H
#define DOWNPOUR_REDUCER_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/ring.h"
#include "downpour/status.h"

/* AUTO's calibration: DP_REDUCER_WARMUP steps inline, then
 * 2 x DP_REDUCER_SAMPLES steps alternating overlapped and inline; the step
 * after them carries the timings and the choice holds from the next one.
 * Overlap is chosen only when an overlapped step takes DP_REDUCER_MARGIN
 * less than the inline step after it: the median ratio, averaged over the
 * replicas. */
#define DP_REDUCER_WARMUP 3
#define DP_REDUCER_SAMPLES 10
#define DP_REDUCER_MARGIN 0.05

typedef struct dp_reducer dp_reducer;

/* Whether gradient buckets are reduced while backprop goes on.  AUTO, the
 * default, measures and picks the faster (above). */
typedef enum dp_overlap {
    DP_OVERLAP_AUTO,
    DP_OVERLAP_ON,
    DP_OVERLAP_OFF
} dp_overlap;

/* mode: DP_OVERLAP_ON / OFF force the way; AUTO measures (above).
 * spare_cores: cores this process may count on beyond its arithmetic
 * threads (AUTO with none never overlaps). */
int dp_reducer_open(dp_reducer **out, dp_ring *ring, float *grads, size_t n, size_t bucket_bytes,
                    dp_overlap mode, int spare_cores, dp_err *err);
void dp_reducer_close(dp_reducer *r); /* NULL is a no-op */
/* When the ring compresses (dp_ring_set_compress): every bucket is summed by
 * dp_ring_allreduce_coded with this replica's residuals (n floats, zero at
 * first), so what a lossy step did not send goes into the next.  Call once,
 * after opening. */
int dp_reducer_compress(dp_reducer *r, dp_err *err);
/* The residuals (n floats), or NULL without compression. */
float *dp_reducer_residual(dp_reducer *r);

/* Ranges [lo[k], hi[k]) of the gradient that the reducer leaves alone from
 * the next step (a sparse table all-gathered by its rows instead,
 * docs/strategies.md, "Sparse tables under allreduce"): increasing and
 * disjoint, at most DP_REDUCER_MAX_SKIP.  The rest of each bucket is summed
 * with the chunks of the whole bucket, so every element gets the bits the
 * whole bucket's sum gives it.  Returns -1 for ranges out of order or
 * range.  Call it between steps. */
#define DP_REDUCER_MAX_SKIP 64 /* a model's sparse tables: DP_SPARSE_MAX (sparse.h) */
int dp_reducer_skip(dp_reducer *r, const size_t *lo, const size_t *hi, int n);
/* The bucket [*lo, *hi) that holds gradient element i. */
void dp_reducer_bucket_of(const dp_reducer *r, size_t i, size_t *lo, size_t *hi);

/* A new step: each gradient is multiplied by weight before the sum. */
void dp_reducer_begin(dp_reducer *r, uint64_t step, float weight);
/* Gradients [lo, n) are final (called from backprop, last layer first). */
void dp_reducer_ready(dp_reducer *r, size_t lo);
/* Everything is final: waits until every bucket is summed.  Returns the
 * ring's failure with its message if a reduction failed: -1 (a late rank),
 * DP_RING_BROKEN (a lost one, or one re-forming the ring; the gradients are
 * then partly summed, and the next dp_reducer_begin starts afresh). */
int dp_reducer_finish(dp_reducer *r, dp_err *err);
/* The ring was re-formed (other members, or a member restarted): AUTO
 * measures again from the next step, which every member of the new ring
 * does at the same step, so the timings bucket lines up. */
void dp_reducer_restart(dp_reducer *r);
int dp_reducer_buckets(const dp_reducer *r);
/* Buckets whose reduction started while backprop was still running, and
 * all buckets reduced so far: how much of the communication overlapped. */
void dp_reducer_counts(dp_reducer *r, long *overlapped, long *total);

/* What the reducer does and why.  decided: 0 while AUTO still measures
 * (steps then alternate); set once, by the step that carried the timings
 * (dp_reducer_choice_new says so once per decision, for the log line). */
typedef struct dp_overlap_choice {
    int decided;
    int overlap;          /* reduce while backprop runs */
    const char *reason;   /* "forced", "one replica", "no spare core" (this replica's),
                             "no spare core on another replica", "no bucket is final
                             before backprop ends", "measured", "measuring" */
    double overlap_ms;    /* measured median step, mean over replicas; 0 if not measured */
    double inline_ms;
    double ratio;         /* median overlapped / next inline step, mean over replicas */
    int spare_cores;      /* this replica's */
} dp_overlap_choice;

void dp_reducer_choice(const dp_reducer *r, dp_overlap_choice *out);
/* 1 once after each decision AUTO takes, else 0. */
int dp_reducer_choice_new(dp_reducer *r);

#endif
