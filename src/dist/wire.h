/* Application frame types of a training run, in one table so no two modules
 * pick the same number.  Payloads are little-endian (the build refuses a
 * big-endian host); float arrays travel as they lie in memory. */
#ifndef DOWNPOUR_DIST_WIRE_H
#define DOWNPOUR_DIST_WIRE_H

#include "downpour/frame.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "downpour's payloads are little-endian; this host is not"
#endif

enum dp_wire_type {
    /* parameter server (src/dist/ps.c) */
    DP_WIRE_PUSH_GRAD = DP_FRAME_APP(0),   /* worker -> ps: push head + gradient of the shard */
    DP_WIRE_PUSH_PARAMS = DP_FRAME_APP(1), /* worker -> ps: push head + parameters (model-avg) */
    DP_WIRE_PULL = DP_FRAME_APP(2),        /* anyone -> ps: send me the shard's parameters */
    DP_WIRE_PARAMS = DP_FRAME_APP(3),      /* ps -> anyone: the shard's parameters; step = slowest clock */
    DP_WIRE_PULL_AVERAGE = DP_FRAME_APP(4), /* chief -> ps: send me the shard's moving average */
    /* ring all-reduce (src/dist/ring.c) */
    DP_WIRE_RING = DP_FRAME_APP(8),        /* a segment; step = the training step, offset = element */
    /* run coordination (src/train) */
    DP_WIRE_START = DP_FRAME_APP(16),      /* chief -> workers: every task is up, go */
    DP_WIRE_EPOCH = DP_FRAME_APP(17),      /* worker -> chief: epoch `step` done, with its stats */
    DP_WIRE_DONE = DP_FRAME_APP(18),       /* worker -> chief and ps: no more steps from me */
    DP_WIRE_SHUTDOWN = DP_FRAME_APP(19),   /* chief -> ps: the run is over */
    /* downpour ping */
    DP_WIRE_PING = DP_FRAME_APP(100),
    DP_WIRE_PONG = DP_FRAME_APP(101),
};

/* Head of a push payload, before the floats. */
typedef struct dp_push_head {
    uint32_t records;   /* records behind this gradient or these parameters (the weight) */
    uint32_t want;      /* 1: answer with the shard's parameters */
    float lr_scale;     /* the worker's learning-rate schedule at this step (1: constant) */
    uint32_t reserved;  /* 0 */
} dp_push_head;

/* Payload of DP_WIRE_EPOCH. */
typedef struct dp_epoch_stats {
    double loss_sum;    /* sum over records of the training loss */
    uint64_t records;
    uint64_t correct;
    double seconds;     /* the worker's time for the epoch */
    uint64_t steps;     /* the worker's steps so far */
} dp_epoch_stats;

#endif
