/* The min-size partitioner: shard counts as TensorFlow's MinSizePartitioner
 * computes them, and ranges that tile the vector exactly. */
#include <string.h>

#include "check.h"
#include "downpour/partition.h"

static void check_tiles(const dp_range *r, int k, size_t n)
{
    size_t lo = 0, min = (size_t)-1, max = 0;
    for (int s = 0; s < k; s++) {
        CHECK(r[s].lo == lo);
        CHECK(r[s].hi > r[s].lo);
        size_t len = r[s].hi - r[s].lo;
        min = len < min ? len : min;
        max = len > max ? len : max;
        lo = r[s].hi;
    }
    CHECK(lo == n);
    CHECK(max - min <= 1);
}

int main(void)
{
    dp_range r[DP_PARTITION_MAX];
    dp_err err;
    /* mlp-300-100: 266,610 floats = 1,066,440 bytes -> 5 shards of 256 KiB, capped. */
    CHECK(dp_partition_min_size(266610, 256 << 10, 2, r, &err) == 2);
    check_tiles(r, 2, 266610);
    CHECK(r[0].hi == 133305);
    CHECK(dp_partition_min_size(266610, 256 << 10, 16, r, &err) == 5);
    check_tiles(r, 5, 266610);
    /* Small models stay in one shard whatever the maximum. */
    CHECK(dp_partition_min_size(1000, 256 << 10, 8, r, &err) == 1);
    check_tiles(r, 1, 1000);
    /* Uneven splits: the first shards take the extra element. */
    CHECK(dp_partition_min_size(10, 4, 3, r, &err) == 3);
    CHECK(r[0].hi - r[0].lo == 4 && r[1].hi - r[1].lo == 3 && r[2].hi - r[2].lo == 3);
    /* Never more shards than elements. */
    CHECK(dp_partition_min_size(3, 1, 8, r, &err) == 3);
    check_tiles(r, 3, 3);
    for (size_t n = 1; n < 300; n += 7)
        for (int m = 1; m < 9; m++) {
            int k = dp_partition_min_size(n, 16, m, r, &err);
            REQUIRE(k >= 1 && k <= m);
            check_tiles(r, k, n);
        }
    CHECK(dp_partition_min_size(0, 16, 2, r, &err) < 0);
    CHECK(dp_partition_min_size(10, 0, 2, r, &err) < 0 && strstr(err.msg, "min-shard-bytes"));
    CHECK(dp_partition_min_size(10, 16, 0, r, &err) < 0 && strstr(err.msg, "max-shards"));
    return CHECK_DONE();
}
