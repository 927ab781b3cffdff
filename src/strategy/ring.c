/* Ring all-reduce: see include/downpour/ring.h. */
#include "downpour/ring.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/wire.h"

int dp_ring_init(dp_ring *r, dp_transport *t, const int *ranks, int n, double timeout,
                 size_t segment_bytes, dp_err *err)
{
    memset(r, 0, sizeof *r);
    int me = dp_transport_rank(t);
    r->pos = -1;
    for (int i = 0; i < n; i++)
        if (ranks[i] == me)
            r->pos = i;
    if (n < 1 || r->pos < 0)
        return dp_errf(err, "ring: rank %d is not among the %d participants", me, n);
    r->t = t;
    r->n = n;
    r->timeout = timeout > 0 ? timeout : 300;
    r->seg = (segment_bytes ? segment_bytes : DP_RING_SEGMENT_BYTES) / sizeof(float);
    if (r->seg < 1)
        r->seg = 1;
    r->ranks = malloc((size_t)n * sizeof *r->ranks);
    if (!r->ranks) {
        dp_ring_free(r);
        return dp_errf(err, "ring: out of memory");
    }
    memcpy(r->ranks, ranks, (size_t)n * sizeof *ranks);
    r->use_fast_path = dp_transport_has_allreduce(t);
    return 0;
}

void dp_ring_free(dp_ring *r)
{
    free(r->ranks);
    r->ranks = NULL;
}

/* Chunk c of n over len elements: [c*len/n, (c+1)*len/n). */
static size_t chunk_lo(size_t len, int n, int c) { return (size_t)((uint64_t)len * (unsigned)c / (unsigned)n); }

static int broken(dp_ring *r, int peer, int lost, uint64_t gen)
{
    r->broken_peer = peer;
    r->broken_lost = lost;
    r->reset_gen = gen;
    return DP_RING_BROKEN;
}

/* Receives segment [off, off + count) from `from` into dst, or (add) adds it
 * to dst straight from the transport (shared memory: from the ring, with no
 * copy besides the sender's). */
static int recv_segment(dp_ring *r, int from, float *dst, size_t off, size_t count, uint64_t step,
                        int bucket, int add, dp_err *err)
{
    const char *phase = add ? "reduce-scatter" : "all-gather";
    char what[96];
    snprintf(what, sizeof what, "all-reduce step %llu bucket %d (%s)", (unsigned long long)step,
             bucket, phase);
    dp_event ev;
    if (dp_transport_recv(r->t, from, what, r->timeout, &ev, err) < 0)
        return broken(r, from, ev.kind == DP_EVENT_PEER_LOST, 0); /* silent: see reset_gen */
    if (ev.header.type == DP_WIRE_RING_RESET) {
        dp_errf(err, "%s is re-forming the ring (%s)", dp_transport_peer_name(r->t, from), what);
        return broken(r, from, 0, ev.header.step);
    }
    if (ev.header.type != DP_WIRE_RING || ev.header.step != step || ev.header.offset != off ||
        ev.header.length != count * sizeof(float))
        return dp_errf(err, "%s sent frame type %u step %llu offset %llu, %llu bytes during %s; "
                            "expected a ring segment of step %llu at %zu, %zu bytes",
                       dp_transport_peer_name(r->t, from), ev.header.type,
                       (unsigned long long)ev.header.step, (unsigned long long)ev.header.offset,
                       (unsigned long long)ev.header.length, what, (unsigned long long)step, off,
                       count * sizeof(float));
    if ((add ? dp_transport_recv_payload_add(r->t, from, dst, count, err)
             : dp_transport_recv_payload(r->t, from, dst, count * sizeof(float), err)) < 0)
        return broken(r, from, 1, 0);
    return 0;
}

/* One step of the ring: send chunk `out` to the next rank while receiving
 * chunk `in` from the previous one, segment by segment; reduce-scatter adds
 * what arrives, all-gather stores it. */
static int ring_step(dp_ring *r, float *buf, size_t len, int out, int in, int add, uint64_t step,
                     int bucket, dp_err *err)
{
    int next = r->ranks[(r->pos + 1) % r->n], prev = r->ranks[(r->pos + r->n - 1) % r->n];
    size_t olo = chunk_lo(len, r->n, out), ohi = chunk_lo(len, r->n, out + 1);
    size_t ilo = chunk_lo(len, r->n, in), ihi = chunk_lo(len, r->n, in + 1);
    size_t o = olo, i = ilo;
    while (o < ohi || i < ihi) {
        if (o < ohi) {
            size_t k = ohi - o < r->seg ? ohi - o : r->seg;
            if (dp_transport_send(r->t, next, DP_WIRE_RING, step, o, buf + o, k * sizeof(float),
                                  err) < 0)
                return broken(r, next, 1, 0);
            r->bytes_sent += k * sizeof(float);
            o += k;
        }
        if (i < ihi) {
            size_t k = ihi - i < r->seg ? ihi - i : r->seg;
            int rc = recv_segment(r, prev, buf + i, i, k, step, bucket, add, err);
            if (rc < 0)
                return rc;
            i += k;
        }
    }
    return 0;
}

int dp_ring_allreduce(dp_ring *r, float *buf, size_t len, uint64_t step, int bucket, dp_err *err)
{
    if (r->n == 1 || len == 0)
        return 0;
    if (r->use_fast_path)
        return dp_transport_allreduce(r->t, buf, len, r->ranks, r->n, err);
    int n = r->n, p = r->pos;
    /* Reduce-scatter: after n-1 steps this rank holds the sum of chunk p+1. */
    int rc = 0;
    for (int s = 0; s < n - 1 && rc == 0; s++)
        rc = ring_step(r, buf, len, (p - s + n) % n, (p - s - 1 + 2 * n) % n, 1, step, bucket, err);
    /* All-gather: pass the finished chunks around. */
    for (int s = 0; s < n - 1 && rc == 0; s++)
        rc = ring_step(r, buf, len, (p + 1 - s + n) % n, (p - s + n) % n, 0, step, bucket, err);
    return rc;
}
