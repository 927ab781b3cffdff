/* The batcher over a streamed split (batch.c hands a split whose records
 * are in files here; stream.h).  Internal to src/data. */
#ifndef DOWNPOUR_DATA_STREAM_BATCHER_H
#define DOWNPOUR_DATA_STREAM_BATCHER_H

#include "downpour/dataset.h"
#include "downpour/stream.h"

int dp_batcher_stream_init(dp_batcher *b, const dp_split *split, uint64_t seed, int shuffle,
                           dp_shard_policy policy, int shard_index, int shard_count, dp_err *err);
void dp_batcher_stream_start(dp_batcher *b, long epoch);
int dp_batcher_stream_next(dp_batcher *b, float *x, uint8_t *y, int batch);
void dp_batcher_stream_seek(dp_batcher *b, uint32_t pos);

#endif
