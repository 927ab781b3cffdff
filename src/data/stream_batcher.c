/* The batcher's walk of a streamed split: the stream opens at the first
 * batch, when its size is known (the window's least size and the queue's
 * depth depend on it); until then the epoch and position are kept in the
 * batcher and applied at the open.  A failure of a call that cannot return
 * one (start, seek) is kept in b->err and returned by the next batch. */
#include "stream_batcher.h"

int dp_batcher_stream_init(dp_batcher *b, const dp_split *split, uint64_t seed, int shuffle,
                           dp_shard_policy policy, int shard_index, int shard_count, dp_err *err)
{
    uint32_t n;
    if (dp_stream_shard_records(split, policy, shard_index, shard_count, &n, err) < 0)
        return -1;
    b->split = split;
    b->n = n;
    b->seed = seed;
    b->shuffle = shuffle != 0;
    b->stream_policy = policy;
    b->stream_index = shard_index;
    b->stream_count = shard_count;
    return 0;
}

void dp_batcher_stream_start(dp_batcher *b, long epoch)
{
    b->epoch = epoch + 1;
    b->pos = 0;
    b->stream_failed = 0;
    if (b->stream && dp_stream_start_epoch(b->stream, epoch, &b->err) < 0)
        b->stream_failed = 1;
}

void dp_batcher_stream_seek(dp_batcher *b, uint32_t pos)
{
    b->pos = pos < b->n ? pos : b->n;
    if (b->stream && !b->stream_failed && dp_stream_seek(b->stream, b->pos, &b->err) < 0)
        b->stream_failed = 1;
}

int dp_batcher_stream_next(dp_batcher *b, float *x, uint8_t *y, int batch)
{
    if (b->stream_failed)
        return -1;
    if (batch <= 0)
        return 0;
    if (!b->stream) {
        /* An epoch never started is epoch 0, as the in-memory walk's
         * natural order stands before the first start. */
        long epoch = b->epoch > 0 ? b->epoch - 1 : 0;
        if (dp_stream_open(&b->stream, b->split, b->stream_policy, b->stream_index,
                           b->stream_count, b->seed, b->shuffle, batch, &b->err) < 0 ||
            dp_stream_start_epoch(b->stream, epoch, &b->err) < 0 ||
            dp_stream_seek(b->stream, b->pos, &b->err) < 0) {
            b->stream_failed = 1;
            return -1;
        }
        dp_stream_augment(b->stream, b->augment);
    }
    int n = dp_stream_next(b->stream, x, y, batch, &b->err);
    if (n < 0)
        b->stream_failed = 1;
    return n;
}
