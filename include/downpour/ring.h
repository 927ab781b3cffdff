/* All-reduce over the transport.  The ring (the algorithm of Baidu's ring and
 * Horovod): a reduce-scatter then an all-gather around a ring of n ranks, each
 * rank sending 2(n-1)/n of the buffer, chunked and pipelined in segments so
 * sends never wait on a full socket.  Every element's sum is computed once,
 * by the chunk's owner, and copied to the others: the replicas stay bitwise
 * identical.  Reduce-scatter adds what arrives straight from the transport
 * (dp_transport_recv_payload_add: over shared memory, from the ring).  A
 * transport with a collective fast path (MPI_Allreduce) is used instead when
 * it has one.
 *
 * Two more algorithms (docs/strategies.md, "allreduce: all-reduce algorithms"):
 * direct, for small messages: each chunk's owner receives the n-1 other
 * contributions straight from their senders and folds them in the ring's
 * order (a left fold in ring order from the chunk's index), then sends the
 * sum to every member: 2 latencies instead of 2(n-1), and bitwise the
 * ring's sums.  hier, with several members per host: reduce inside the host
 * to its leader, all-reduce between the leaders, broadcast inside the host:
 * the host links carry 2(H-1)/H of the buffer instead of 2(n-1)/n, and the
 * sums associate differently (equal to the ring's within float noise; the
 * members stay bitwise identical to each other).  auto (allreduce's default)
 * measures both flat algorithms at the first call (and after every
 * re-forming) and picks per message size from the fitted latency and
 * bandwidth; hier when the members span 2 or more hosts and some host has
 * several. */
#ifndef DOWNPOUR_RING_H
#define DOWNPOUR_RING_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/compress.h"
#include "downpour/status.h"
#include "downpour/transport.h"

#define DP_RING_SEGMENT_BYTES (256u << 10)

typedef enum dp_allreduce_algo {
    DP_ALGO_RING,
    DP_ALGO_DIRECT,
    DP_ALGO_HIER,
    DP_ALGO_AUTO,
    DP_ALGO_COUNT
} dp_allreduce_algo;

const char *dp_allreduce_algo_name(dp_allreduce_algo a); /* "ring", ... */
/* -1 for an unknown name. */
int dp_allreduce_algo_parse(const char *name);

/* auto's measurement: each flat algorithm at DP_RING_FIT_SMALL floats per
 * member and at DP_RING_FIT_LARGE floats, the best of DP_RING_FIT_REPS each,
 * averaged over the members (summed over the ring, so every member fits the
 * same line and takes the same choice). */
#define DP_RING_FIT_SMALL 1
#define DP_RING_FIT_LARGE 32768
#define DP_RING_FIT_REPS 3

typedef struct dp_ring {
    dp_transport *t;
    int *ranks;          /* the ring's transport ranks, in ring order */
    int n, pos;          /* size, and this rank's position */
    double timeout;      /* s to wait for a neighbour before giving up */
    size_t seg;          /* floats per segment */
    int use_fast_path;   /* the transport's own all-reduce */
    uint64_t bytes_sent; /* payload bytes this rank sent */
    /* Why the last call returned DP_RING_BROKEN: the neighbour's rank, and
     * whether it was lost; else it sent DP_WIRE_RING_RESET of generation
     * reset_gen (it is re-forming the ring, docs/faults.md), or was silent
     * past the timeout (reset_gen 0: the stall may be further up the ring). */
    int broken_peer, broken_lost;
    uint64_t reset_gen;
    /* Algorithms (above).  algo: forced, or DP_ALGO_AUTO (dp_ring_set_algo). */
    dp_allreduce_algo algo;
    int setup;             /* topology (and for auto the fit) done */
    int n_hosts;           /* hosts among the members, 0 when unknown */
    int hier;              /* sum hierarchically */
    int *host;             /* n: each member's host's leader position */
    int *local, n_local;   /* members on this host, in ring order (leader first) */
    int *leaders, n_leaders, leader_pos; /* one per host; leader_pos -1 if not one */
    double fit_a[2], fit_b[2]; /* ring, direct: s at the small size, s per extra byte */
    double cross_bytes;    /* direct below this many bytes (0: never, HUGE_VAL: always) */
    float *scratch;        /* DP_RING_FIT_LARGE floats, for the measurement */
    uint64_t calls[DP_ALGO_COUNT]; /* all-reduces per algorithm */
    /* Compression (dp_ring_set_compress); auto's codec cost, s per float
     * encoded and decoded, averaged over the members. */
    dp_compress compress;
    double codec_s;
    uint64_t coded_calls;  /* all-reduces that went compressed */
    uint8_t *cbuf;         /* encoded bytes, grown to the largest bucket once */
    size_t cbuf_cap;
    float *fbuf;           /* top-k's selection scratch */
    size_t fbuf_cap;
    char why[240];         /* how the choice was made, for the log and the metrics */
} dp_ring;

/* A neighbour was lost or is re-forming the ring: the caller re-forms it
 * (src/strategy/allreduce.c); err says what happened. */
#define DP_RING_BROKEN (-2)

/* ranks: the participants in ring order, this transport's rank among them. */
int dp_ring_init(dp_ring *r, dp_transport *t, const int *ranks, int n, double timeout,
                 size_t segment_bytes, dp_err *err);
void dp_ring_free(dp_ring *r);
/* Sets the algorithm (dp_ring_init's is DP_ALGO_RING, so the rings of
 * pipeline and model-parallel sum as before; allreduce sets its
 * --allreduce-algo, auto by default); before the first call. */
void dp_ring_set_algo(dp_ring *r, dp_allreduce_algo algo);
/* The algorithm a call of len floats takes (after the first call; before it,
 * the forced one or ring). */
dp_allreduce_algo dp_ring_choice(const dp_ring *r, size_t len);

/* Gradient compression for dp_ring_allreduce_coded; kind NONE (the
 * default) sums exactly, and so does POWERSGD, whose factors (powersgd.h)
 * the ring sums exactly.  Before the first call. */
void dp_ring_set_compress(dp_ring *r, const dp_compress *c);
/* What a call of len floats sends (after the first call): NONE, BF16, FP16
 * or TOPK; auto resolved by the fit. */
dp_compress_kind dp_ring_compress_choice(const dp_ring *r, size_t len);

/* The first call's setup (topology, and for auto the fit) now: every
 * member calls it with the same step, before its first sum (allreduce's
 * --compress auto measures at open).  0 when there is nothing to measure
 * (one member, a transport's own collective) or it is done; failures as
 * dp_ring_allreduce's. */
int dp_ring_measure(dp_ring *r, uint64_t step, dp_err *err);
/* auto's prediction, in seconds, of one sum of len floats from the fit
 * (after dp_ring_measure): kind NONE by the faster flat algorithm, BF16
 * coded (half the bytes over direct's line plus the codec); 0 for one
 * member.  The same on every member. */
double dp_ring_predict(const dp_ring *r, size_t len, dp_compress_kind kind);

/* dp_ring_allreduce with the compression set: resid (len floats, or NULL
 * for none) is this member's error feedback for these elements, added to
 * buf before encoding and left holding what was not sent.  bf16/fp16: each
 * member's buf + resid is rounded once; each chunk's owner decodes and
 * folds the n contributions in fp32 in the ring's order (direct), rounds
 * the sum once and sends it to every member, itself included: every member
 * ends with the same bits.  top-k: each member sends its k = ceil(ratio
 * len) largest entries (index, value) to every other, and every member adds
 * the n sparse vectors in position order into zeros, in fp32.  Uncoded
 * (NONE) it is dp_ring_allreduce after buf += resid, resid = 0. */
int dp_ring_allreduce_coded(dp_ring *r, float *buf, size_t len, float *resid, uint64_t step,
                            int bucket, dp_err *err);

/* Sums buf[0..len) over the members, in place, by the algorithm chosen
 * (the first call sets the topology and auto's fit up: every member makes
 * its first call with the same step).  step and bucket name the
 * operation in log lines and errors ("all-reduce step 12 bucket 3"): a late
 * neighbour is logged while we wait; a lost neighbour, one silent past the
 * timeout or a RESET from one returns DP_RING_BROKEN with buf partly summed;
 * -1 is any other error. */
int dp_ring_allreduce(dp_ring *r, float *buf, size_t len, uint64_t step, int bucket, dp_err *err);

/* Sums only buf[lo..hi) of a buffer of len, cut into the chunks of the
 * whole buffer: every element is summed in the order dp_ring_allreduce of
 * buf[0..len) sums it (the same bits), and the rest is left alone.  The
 * ring sums chunk c's elements (c = dp_ring_chunk_of) starting from ring
 * position c: ((g_c + g_c+1) + g_c+2) + ... around the ring.  Over a
 * transport's own collective (MPI) the order is the transport's. */
int dp_ring_allreduce_part(dp_ring *r, float *buf, size_t len, size_t lo, size_t hi,
                           uint64_t step, int bucket, dp_err *err);
/* The chunk (of n) of a len-long buffer that element i falls in. */
size_t dp_ring_chunk_of(size_t len, int n, size_t i);

/* All-gathers blocks of bytes around the ring (each block n-1 hops, in
 * segments): this rank's mine[0..len), and each ring position q's block into
 * all + q*cap, its length into lens[q].  Every block is at most cap bytes; a
 * peer's larger one is refused, naming it.  The frames' offset carries the
 * block's length.  Failures as dp_ring_allreduce's. */
int dp_ring_allgather(dp_ring *r, const uint8_t *mine, size_t len, uint8_t *all, size_t cap,
                      size_t *lens, uint64_t step, dp_err *err);

#endif
