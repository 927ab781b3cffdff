/* Ring all-reduce over the transport (the algorithm of Baidu's ring and
 * Horovod): a reduce-scatter then an all-gather around a ring of n ranks, each
 * rank sending 2(n-1)/n of the buffer, chunked and pipelined in segments so
 * sends never wait on a full socket.  Every element's sum is computed once,
 * by the chunk's owner, and copied to the others: the replicas stay bitwise
 * identical.  Reduce-scatter adds what arrives straight from the transport
 * (dp_transport_recv_payload_add: over shared memory, from the ring).  A
 * transport with a collective fast path (MPI_Allreduce) is used instead when
 * it has one. */
#ifndef DOWNPOUR_RING_H
#define DOWNPOUR_RING_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/status.h"
#include "downpour/transport.h"

#define DP_RING_SEGMENT_BYTES (256u << 10)

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
} dp_ring;

/* A neighbour was lost or is re-forming the ring: the caller re-forms it
 * (src/strategy/allreduce.c); err says what happened. */
#define DP_RING_BROKEN (-2)

/* ranks: the participants in ring order, this transport's rank among them. */
int dp_ring_init(dp_ring *r, dp_transport *t, const int *ranks, int n, double timeout,
                 size_t segment_bytes, dp_err *err);
void dp_ring_free(dp_ring *r);

/* Sums buf[0..len) over the ring, in place.  step and bucket name the
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
