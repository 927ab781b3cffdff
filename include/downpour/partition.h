/* How the flat parameter vector is split over parameter-server shards, after
 * TensorFlow's MinSizePartitioner: as many shards as keep each at least
 * min_shard_bytes, at most max_shards, at least one; the elements are split as
 * evenly as possible, the first (n % shards) shards one element longer. */
#ifndef DOWNPOUR_PARTITION_H
#define DOWNPOUR_PARTITION_H

#include <stddef.h>

#include "downpour/status.h"

#define DP_PARTITION_MIN_SHARD_BYTES (256 << 10) /* TensorFlow's default */
#define DP_PARTITION_MAX 4096

typedef struct dp_range {
    size_t lo, hi; /* elements [lo, hi) of the flat vector */
} dp_range;

/* Splits n floats; out holds max_shards entries.  Returns the shard count. */
int dp_partition_min_size(size_t n, size_t min_shard_bytes, int max_shards, dp_range *out,
                          dp_err *err);

#endif
