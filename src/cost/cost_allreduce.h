/* The all-reduce's communication as the cost model sees it
 * (docs/cost_model.md, "All-reduce algorithms and compression"): the bytes
 * each algorithm (ring, direct, hierarchical) and each codec (bf16, fp16,
 * top-k, PowerSGD) puts on every host's link and memory path, and the time
 * that takes.  Internal to src/cost. */
#ifndef DOWNPOUR_COST_ALLREDUCE_H
#define DOWNPOUR_COST_ALLREDUCE_H

#include <stddef.h>

#include "downpour/compress.h"
#include "downpour/ring.h"

typedef struct cost_ar_in {
    int n;                /* members, in ring order */
    const int *host;      /* n: each member's host, 0..hosts-1 */
    int hosts;
    size_t floats;        /* the gradient summed a step, in buckets */
    size_t bucket_bytes;
    double extra_ring_bytes; /* a member's further bytes to its ring neighbour (the
                                sparse all-gather), with extra_hops latencies */
    double extra_hops;
    dp_allreduce_algo algo; /* ring, direct, hier or auto (the strategy's rule) */
    dp_compress codec;      /* none, bf16, fp16, topk, powersgd or auto */
    size_t psgd_floats;     /* powersgd: factor + whole floats a step (two sums) */
    double bandwidth;       /* a host's link, bytes/s each way */
    double local_bandwidth; /* between two members of one host; 0: they use the link */
    double latency;         /* s one way */
    double codec_s;         /* bf16/fp16: s to encode and decode one float */
} cost_ar_in;

typedef struct cost_ar_out {
    double comm_s;        /* one step's all-reduces, latencies and coding included */
    double sent_bytes;    /* member 0's bytes sent a step */
    double busiest_link;  /* bytes through the busiest host link, one direction */
    dp_allreduce_algo algo;   /* what was taken */
    dp_compress_kind codec;   /* what was taken */
    char how[160];        /* the algorithm and codec taken, and why */
} cost_ar_out;

void cost_allreduce(const cost_ar_in *in, cost_ar_out *out);

#endif
