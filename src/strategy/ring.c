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

/* Chunk c's bounds clamped to [lo, hi): the part of a whole buffer's chunk
 * that a part-sum moves (dp_ring_allreduce_part). */
static size_t clamp(size_t v, size_t lo, size_t hi) { return v < lo ? lo : v > hi ? hi : v; }

/* One step of the ring: send chunk `out` to the next rank while receiving
 * chunk `in` from the previous one, segment by segment; reduce-scatter adds
 * what arrives, all-gather stores it.  Only [lo, hi) of the chunks moves. */
static int ring_step(dp_ring *r, float *buf, size_t len, size_t lo, size_t hi, int out, int in,
                     int add, uint64_t step, int bucket, dp_err *err)
{
    int next = r->ranks[(r->pos + 1) % r->n], prev = r->ranks[(r->pos + r->n - 1) % r->n];
    size_t olo = clamp(chunk_lo(len, r->n, out), lo, hi), ohi = clamp(chunk_lo(len, r->n, out + 1), lo, hi);
    size_t ilo = clamp(chunk_lo(len, r->n, in), lo, hi), ihi = clamp(chunk_lo(len, r->n, in + 1), lo, hi);
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
    return dp_ring_allreduce_part(r, buf, len, 0, len, step, bucket, err);
}

int dp_ring_allreduce_part(dp_ring *r, float *buf, size_t len, size_t lo, size_t hi,
                           uint64_t step, int bucket, dp_err *err)
{
    if (r->n == 1 || lo >= hi || hi > len)
        return 0;
    if (r->use_fast_path)
        return dp_transport_allreduce(r->t, buf + lo, hi - lo, r->ranks, r->n, err);
    int n = r->n, p = r->pos;
    /* Reduce-scatter: after n-1 steps this rank holds the sum of chunk p+1. */
    int rc = 0;
    for (int s = 0; s < n - 1 && rc == 0; s++)
        rc = ring_step(r, buf, len, lo, hi, (p - s + n) % n, (p - s - 1 + 2 * n) % n, 1, step,
                       bucket, err);
    /* All-gather: pass the finished chunks around. */
    for (int s = 0; s < n - 1 && rc == 0; s++)
        rc = ring_step(r, buf, len, lo, hi, (p + 1 - s + n) % n, (p - s + n) % n, 0, step, bucket,
                       err);
    return rc;
}

size_t dp_ring_chunk_of(size_t len, int n, size_t i)
{
    size_t c = n > 0 && len > 0 ? (size_t)((uint64_t)i * (unsigned)n / len) : 0;
    while (c + 1 < (size_t)n && chunk_lo(len, n, (int)c + 1) <= i)
        c++;
    while (c > 0 && chunk_lo(len, n, (int)c) > i)
        c--;
    return c;
}

/* Receives the next piece of the block that `from` forwards: the frame's
 * offset is the whole block's length (bounded by cap), its pieces come in
 * order.  *total is that length once the first piece is in (else SIZE_MAX). */
static int recv_piece(dp_ring *r, int from, uint8_t *dst, size_t cap, size_t *got, size_t *total,
                      uint64_t step, dp_err *err)
{
    char what[96];
    snprintf(what, sizeof what, "sparse all-gather step %llu", (unsigned long long)step);
    dp_event ev;
    if (dp_transport_recv(r->t, from, what, r->timeout, &ev, err) < 0)
        return broken(r, from, ev.kind == DP_EVENT_PEER_LOST, 0);
    if (ev.header.type == DP_WIRE_RING_RESET) {
        dp_errf(err, "%s is re-forming the ring (%s)", dp_transport_peer_name(r->t, from), what);
        return broken(r, from, 0, ev.header.step);
    }
    size_t whole = ev.header.offset <= cap ? (size_t)ev.header.offset : SIZE_MAX;
    if (ev.header.type != DP_WIRE_RING || ev.header.step != step || whole == SIZE_MAX ||
        (*total != SIZE_MAX && whole != *total) || ev.header.length > whole - *got)
        return dp_errf(err, "%s sent frame type %u step %llu, a block of %llu bytes (%llu in "
                            "this piece) during %s; expected a piece of step %llu of at most "
                            "%zu bytes",
                       dp_transport_peer_name(r->t, from), ev.header.type,
                       (unsigned long long)ev.header.step, (unsigned long long)ev.header.offset,
                       (unsigned long long)ev.header.length, what, (unsigned long long)step, cap);
    *total = whole;
    size_t k = (size_t)ev.header.length;
    if (k && dp_transport_recv_payload(r->t, from, dst + *got, k, err) < 0)
        return broken(r, from, 1, 0);
    *got += k;
    return 0;
}

int dp_ring_allgather(dp_ring *r, const uint8_t *mine, size_t len, uint8_t *all, size_t cap,
                      size_t *lens, uint64_t step, dp_err *err)
{
    int n = r->n, p = r->pos;
    if (len > cap)
        return dp_errf(err, "sparse all-gather: a block of %zu bytes, above its bound of %zu",
                       len, cap);
    if (all + (size_t)p * cap != mine)
        memcpy(all + (size_t)p * cap, mine, len);
    lens[p] = len;
    int next = r->ranks[(p + 1) % n], prev = r->ranks[(p + n - 1) % n];
    size_t seg = r->seg * sizeof(float);
    /* Step s: forward block p-s, take block p-s-1 (every block goes n-1 hops). */
    for (int s = 0; s < n - 1; s++) {
        int out = (p - s + n) % n, in = (p - s - 1 + 2 * n) % n;
        const uint8_t *ob = all + (size_t)out * cap;
        size_t olen = lens[out], o = 0, got = 0, total = SIZE_MAX;
        int sent_one = 0;
        while (o < olen || !sent_one || got < total) {
            if (o < olen || !sent_one) {
                size_t k = olen - o < seg ? olen - o : seg;
                if (dp_transport_send(r->t, next, DP_WIRE_RING, step, olen, ob + o, k, err) < 0)
                    return broken(r, next, 1, 0);
                r->bytes_sent += k;
                o += k;
                sent_one = 1;
            }
            if (got < total) {
                int rc = recv_piece(r, prev, all + (size_t)in * cap, cap, &got, &total, step, err);
                if (rc < 0)
                    return rc;
                lens[in] = total;
            }
        }
    }
    return 0;
}
