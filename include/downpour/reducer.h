/* Bucketed gradient reduction, overlapped with backprop (as Horovod's tensor
 * fusion and PyTorch DDP's reducer do).  The flat gradient is cut into
 * buckets of bucket_bytes from its end, since backprop finishes the last
 * layer first; as soon as backprop has finished every gradient of a bucket,
 * a communication thread weights it and all-reduces it over the ring while
 * the earlier layers are still being differentiated.  Unthreaded, every
 * bucket is reduced in dp_reducer_finish: the same sums, no overlap. */
#ifndef DOWNPOUR_REDUCER_H
#define DOWNPOUR_REDUCER_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/ring.h"
#include "downpour/status.h"

typedef struct dp_reducer dp_reducer;

int dp_reducer_open(dp_reducer **out, dp_ring *ring, float *grads, size_t n, size_t bucket_bytes,
                    int overlap, dp_err *err);
void dp_reducer_close(dp_reducer *r); /* NULL is a no-op */

/* A new step: each gradient is multiplied by weight before the sum. */
void dp_reducer_begin(dp_reducer *r, uint64_t step, float weight);
/* Gradients [lo, n) are final (called from backprop, last layer first). */
void dp_reducer_ready(dp_reducer *r, size_t lo);
/* Everything is final: waits until every bucket is summed.  Returns the
 * ring's failure with its message if a reduction failed: -1 (a late rank),
 * DP_RING_BROKEN (a lost one, or one re-forming the ring; the gradients are
 * then partly summed, and the next dp_reducer_begin starts afresh). */
int dp_reducer_finish(dp_reducer *r, dp_err *err);
int dp_reducer_buckets(const dp_reducer *r);
/* Buckets whose reduction started while backprop was still running, and
 * all buckets reduced so far: how much of the communication overlapped. */
void dp_reducer_counts(dp_reducer *r, long *overlapped, long *total);

#endif
