/* allreduce's settings (allreduce_options.c): read by allreduce.c where
 * the ring and the reducer open.  Private to src/strategy. */
#ifndef DOWNPOUR_STRATEGY_ALLREDUCE_OPTIONS_H
#define DOWNPOUR_STRATEGY_ALLREDUCE_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>

#include "downpour/compress.h"
#include "downpour/options.h"
#include "downpour/reducer.h"
#include "downpour/strategy.h"

/* allreduce's options in --help order.  A new option is one line here
 * (options.h, DP_OPT_FIELD): its field, default and table line come from
 * it; the code that reads it (allreduce.c) comes on top.  --overlap's NULL:
 * not given (auto); --no-overlap is --overlap off. */
#define DP_ALLREDUCE_OPTIONS(X)                                                                    \
    X(size_t, bucket_bytes, 512u << 10, "bucket-bytes", DP_OPT_SIZE, "N", 16384,                  \
      (double)(1L << 32), 0,                                                                       \
      "allreduce: gradient bytes fused per all-reduce")                                            \
    X(const char *, allreduce_algo, NULL, "allreduce-algo", DP_OPT_STR, "ALGO", 0, 0, 0,           \
      "allreduce: ring, direct (2 latencies, for small buckets), hier (through one leader per "    \
      "host) or auto (measured per bucket size; the default)")                                     \
    X(const char *, compress, NULL, "compress", DP_OPT_STR, "MODE", 0, 0, 0,                       \
      "allreduce: gradient compression: none (the default), bf16, fp16, topk:RATIO (with error "   \
      "feedback), powersgd:RANK (each weight matrix as rank-RANK factors, with error feedback), "  \
      "auto (powersgd:4-16 for the run, else bf16 per bucket, where the measured link makes it"    \
      " pay); the ps family: bf16, fp16, topk:RATIO for the workers' gradient pushes")             \
    X(const char *, overlap, NULL, "overlap", DP_OPT_STR, "MODE", 0, 0, 0,                         \
      "allreduce: reduce buckets during backprop: auto (measured over the first steps; the "       \
      "default), on, off")                                                                         \
    X(bool, no_overlap, false, "no-overlap", DP_OPT_FLAG, NULL, 0, 0, 0,                           \
      "allreduce: reduce only after the whole backprop (--overlap off)")                           \
    X(bool, no_nccl, false, "no-nccl", DP_OPT_FLAG, NULL, 0, 0, 0,                                 \
      "allreduce, --device: sum the gradients on the host (host staging), not on the devices "     \
      "with NCCL (as DOWNPOUR_NCCL=0)")                                                            \
    X(bool, dense, false, "allreduce-dense", DP_OPT_FLAG, NULL, 0, 0, 0,                           \
      "allreduce: sparse tables' gradients are all-reduced whole, as dense parameters, not "       \
      "all-gathered by the rows each batch touches (for comparison)")                              \
    X(bool, sync_bn, false, "sync-bn", DP_OPT_FLAG, NULL, 0, 0, 0,                                 \
      "allreduce: batch norm normalises with the statistics of every replica's rows and moves "    \
      "the same running ones (PyTorch's SyncBatchNorm; the reducer then runs inline)")

typedef struct dp_allreduce_settings {
    DP_ALLREDUCE_OPTIONS(DP_OPT_FIELD)
} dp_allreduce_settings;

extern const dp_strategy_conf dp_allreduce_conf;

/* The reducer's mode: --sync-bn and --no-overlap make it off. */
dp_overlap dp_allreduce_overlap(const dp_allreduce_settings *a);
/* --allreduce-algo as a dp_allreduce_algo (ring.h); auto when not given. */
int dp_allreduce_algo_of(const dp_allreduce_settings *a);
/* --compress, parsed (check() refused what does not parse). */
void dp_allreduce_compress_of(const dp_allreduce_settings *a, dp_compress *out);

#endif
