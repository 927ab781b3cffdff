#include "downpour/partition.h"

int dp_partition_min_size(size_t n, size_t min_shard_bytes, int max_shards, dp_range *out,
                          dp_err *err)
{
    if (n == 0)
        return dp_errf(err, "nothing to partition: the model has no parameters");
    if (min_shard_bytes == 0)
        return dp_errf(err, "--ps-min-shard-bytes must be positive");
    if (max_shards < 1 || max_shards > DP_PARTITION_MAX)
        return dp_errf(err, "--ps-max-shards %d is out of range [1, %d]", max_shards,
                       DP_PARTITION_MAX);
    size_t bytes = n * sizeof(float);
    size_t shards = (bytes + min_shard_bytes - 1) / min_shard_bytes;
    if (shards > (size_t)max_shards)
        shards = (size_t)max_shards;
    if (shards > n)
        shards = n;
    if (shards < 1)
        shards = 1;
    size_t base = n / shards, extra = n % shards, lo = 0;
    for (size_t s = 0; s < shards; s++) {
        size_t len = base + (s < extra ? 1 : 0);
        out[s].lo = lo;
        out[s].hi = lo + len;
        lo += len;
    }
    return (int)shards;
}
