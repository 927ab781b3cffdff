/* The sharding policies' names (docs/datasets.md, "Sharding"): the
 * options' spelling, shared by the batcher, streams and messages. */
#include <string.h>

#include "downpour/dataset.h"

static const char *const shard_names[DP_SHARD_COUNT] = {"off", "data", "file"};

int dp_shard_parse(const char *name, dp_shard_policy *out, dp_err *err)
{
    for (int i = 0; i < DP_SHARD_COUNT; i++)
        if (name && strcmp(name, shard_names[i]) == 0) {
            *out = (dp_shard_policy)i;
            return 0;
        }
    return dp_errf(err, "unknown shard policy '%s' (expected off, data or file)",
                   name ? name : "");
}

const char *dp_shard_name(dp_shard_policy p)
{
    return (unsigned)p < DP_SHARD_COUNT ? shard_names[p] : "unknown";
}
