/* Ring all-reduce: see include/downpour/ring.h. */
#include "downpour/ring.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/clock.h"
#include "downpour/log.h"
#include "downpour/testhooks.h"
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
    dp_ring_set_algo(r, DP_ALGO_RING); /* the strategies that want more ask (allreduce) */
    return 0;
}

void dp_ring_free(dp_ring *r)
{
    free(r->ranks);
    free(r->host);
    free(r->local);
    free(r->leaders);
    free(r->scratch);
    free(r->cbuf);
    free(r->fbuf);
    r->cbuf = NULL;
    r->fbuf = NULL;
    r->ranks = r->host = r->local = r->leaders = NULL;
    r->scratch = NULL;
}

static const char *const algo_names[DP_ALGO_COUNT] = {"ring", "direct", "hier", "auto"};

const char *dp_allreduce_algo_name(dp_allreduce_algo a)
{
    return (unsigned)a < DP_ALGO_COUNT ? algo_names[a] : "?";
}

int dp_allreduce_algo_parse(const char *name)
{
    for (int a = 0; a < DP_ALGO_COUNT; a++)
        if (name && strcmp(name, algo_names[a]) == 0)
            return a;
    return -1;
}

void dp_ring_set_algo(dp_ring *r, dp_allreduce_algo algo)
{
    r->algo = algo;
    snprintf(r->why, sizeof r->why, "%s: %s", algo_names[algo],
             r->n == 1 ? "one member, nothing to sum" : "not summed yet");
}

/* A group of members: the ring's (flat), one host's, or the leaders'. */
typedef struct grp {
    const int *ranks; /* transport ranks, in ring order */
    int n, pos;
} grp;

/* Chunk c of n over len elements: [c*len/n, (c+1)*len/n). */
static size_t chunk_lo(size_t len, int n, int c) { return (size_t)((uint64_t)len * (unsigned)c / (unsigned)n); }

static int broken(dp_ring *r, int peer, int lost, uint64_t gen)
{
    r->broken_peer = peer;
    r->broken_lost = lost;
    r->reset_gen = gen;
    return DP_RING_BROKEN;
}

/* The next frame from `from`, past a bare RING_HELLO: a replica's greeting to
 * every member at its open, which a member that took it into the ring on the
 * leader's plan may read only once the ring goes on (docs/faults.md,
 * "All-reduce"); it carries nothing the ring needs. */
static int ring_recv(dp_ring *r, int from, const char *what, dp_event *ev, dp_err *err)
{
    for (;;) {
        if (dp_transport_recv(r->t, from, what, r->timeout, ev, err) < 0)
            return -1;
        if (ev->header.type != DP_WIRE_RING_HELLO || ev->header.length != 0 ||
            ev->header.offset != 0)
            return 0;
    }
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
    if (ring_recv(r, from, what, &ev, err) < 0)
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

/* One exchange: send [olo, ohi) to `to` while receiving [ilo, ihi) from
 * `from`, segment by segment (to or from -1: none); add sums what arrives,
 * else it is stored.  Interleaving keeps every pattern whose exchanges are
 * permutations (a ring step, a shift by k) free of deadlock as long as a
 * link buffers one segment. */
static int exchange(dp_ring *r, float *buf, int to, size_t olo, size_t ohi, int from, size_t ilo,
                    size_t ihi, int add, uint64_t step, int bucket, dp_err *err)
{
    size_t o = to < 0 ? ohi : olo, i = from < 0 ? ihi : ilo;
    while (o < ohi || i < ihi) {
        if (o < ohi) {
            size_t k = ohi - o < r->seg ? ohi - o : r->seg;
            if (dp_transport_send(r->t, to, DP_WIRE_RING, step, o, buf + o, k * sizeof(float),
                                  err) < 0)
                return broken(r, to, 1, 0);
            r->bytes_sent += k * sizeof(float);
            o += k;
        }
        if (i < ihi) {
            size_t k = ihi - i < r->seg ? ihi - i : r->seg;
            int rc = recv_segment(r, from, buf + i, i, k, step, bucket, add, err);
            if (rc < 0)
                return rc;
            i += k;
        }
    }
    return 0;
}

/* Chunk c's bounds clamped to [lo, hi): the part of a whole buffer's chunk
 * that a part-sum moves (dp_ring_allreduce_part). */
static size_t clamp(size_t v, size_t lo, size_t hi) { return v < lo ? lo : v > hi ? hi : v; }

/* The part [lo, hi) of a buffer of len: chunks are the whole buffer's. */
typedef struct part {
    size_t len, lo, hi;
} part;

static size_t part_chunk(const part *q, int n, int c) { return clamp(chunk_lo(q->len, n, c), q->lo, q->hi); }

/* Chunk exchange within a group: send chunk `out` to position pto while
 * receiving chunk `in` from position pfrom (only what falls in the part). */
static int chunk_step(dp_ring *r, const grp *g, float *buf, const part *q, int pto, int out,
                      int pfrom, int in, int add, uint64_t step, int bucket, dp_err *err)
{
    return exchange(r, buf, g->ranks[pto], part_chunk(q, g->n, out), part_chunk(q, g->n, out + 1),
                    g->ranks[pfrom], part_chunk(q, g->n, in), part_chunk(q, g->n, in + 1), add,
                    step, bucket, err);
}

/* The ring: chunk c's sum is the left fold x_c + x_{c+1} + ... + x_{c-1}
 * (positions mod n), finished at position c-1 and passed on. */
static int ring_sum(dp_ring *r, const grp *g, float *buf, const part *q, uint64_t step, int bucket,
                    dp_err *err)
{
    int n = g->n, p = g->pos, next = (p + 1) % n, prev = (p + n - 1) % n;
    int rc = 0;
    /* Reduce-scatter: after n-1 steps this rank holds the sum of chunk p+1. */
    for (int s = 0; s < n - 1 && rc == 0; s++)
        rc = chunk_step(r, g, buf, q, next, (p - s + n) % n, prev, (p - s - 1 + 2 * n) % n, 1,
                        step, bucket, err);
    /* All-gather: pass the finished chunks around. */
    for (int s = 0; s < n - 1 && rc == 0; s++)
        rc = chunk_step(r, g, buf, q, next, (p + 1 - s + n) % n, prev, (p - s + n) % n, 0, step,
                        bucket, err);
    return rc;
}

/* Direct: position c owns chunk c.  Reduce-scatter step k = 1..n-1 sends
 * chunk p-k to its owner and adds position p+k's share of chunk p, so the
 * owner folds x_p + x_{p+1} + ... + x_{p-1}: the ring's order, the ring's
 * bits (float addition commutes, so x + acc is acc + x).  All-gather step k
 * sends chunk p to position p+k and stores chunk p-k from its owner.  No
 * step waits on the one before it: 2 latencies in all. */
static int direct_sum(dp_ring *r, const grp *g, float *buf, const part *q, uint64_t step,
                      int bucket, dp_err *err)
{
    int n = g->n, p = g->pos, rc = 0;
    for (int k = 1; k < n && rc == 0; k++)
        rc = chunk_step(r, g, buf, q, (p - k + n) % n, (p - k + n) % n, (p + k) % n, p, 1, step,
                        bucket, err);
    for (int k = 1; k < n && rc == 0; k++)
        rc = chunk_step(r, g, buf, q, (p + k) % n, p, (p - k + n) % n, (p - k + n) % n, 0, step,
                        bucket, err);
    return rc;
}

static grp flat_group(const dp_ring *r) { return (grp){r->ranks, r->n, r->pos}; }

/* Ring or direct over g by auto's fit: direct below cross_bytes. */
static int flat_pick(const dp_ring *r, size_t len)
{
    return (double)len * sizeof(float) < r->cross_bytes ? DP_ALGO_DIRECT : DP_ALGO_RING;
}

/* Hierarchical: the host's members send their buffers to its leader, which
 * folds them in ring order (its own first); the leaders sum over the ring or
 * directly (auto's fit, else the ring); each leader sends the sum back to
 * its members.  Inside a host the frames go through shared memory. */
static int hier_sum(dp_ring *r, float *buf, const part *q, uint64_t step, int bucket, dp_err *err)
{
    int rc = 0;
    size_t lo = q->lo, hi = q->hi;
    if (r->leader_pos < 0) {
        int leader = r->local[0];
        rc = exchange(r, buf, leader, lo, hi, -1, 0, 0, 0, step, bucket, err);
        return rc < 0 ? rc : exchange(r, buf, -1, 0, 0, leader, lo, hi, 0, step, bucket, err);
    }
    for (int j = 1; j < r->n_local && rc == 0; j++)
        rc = exchange(r, buf, -1, 0, 0, r->local[j], lo, hi, 1, step, bucket, err);
    grp g = {r->leaders, r->n_leaders, r->leader_pos};
    if (rc == 0 && g.n > 1)
        rc = r->algo == DP_ALGO_AUTO && flat_pick(r, hi - lo) == DP_ALGO_DIRECT
                 ? direct_sum(r, &g, buf, q, step, bucket, err)
                 : ring_sum(r, &g, buf, q, step, bucket, err);
    for (int j = 1; j < r->n_local && rc == 0; j++)
        rc = exchange(r, buf, r->local[j], lo, hi, -1, 0, 0, 0, step, bucket, err);
    return rc;
}

/* The hosts: each member's host is named by the first position on it, as
 * that member sees it (dp_transport_same_host); the map is summed over the
 * ring so every member holds all of it, and checked for agreement.  Fills
 * host, local, leaders; n_hosts 0 when some member cannot tell. */
static int setup_hosts(dp_ring *r, uint64_t step, dp_err *err)
{
    int n = r->n;
    free(r->host);
    free(r->local);
    free(r->leaders);
    r->host = malloc((size_t)n * sizeof *r->host);
    r->local = malloc((size_t)n * sizeof *r->local);
    r->leaders = malloc((size_t)n * sizeof *r->leaders);
    float *m = calloc((size_t)n + 1, sizeof *m);
    if (!r->host || !r->local || !r->leaders || !m) {
        free(m);
        return dp_errf(err, "all-reduce: out of memory for the host map");
    }
    int mine = -1, unknown = 0;
    for (int q = 0; q < n; q++) {
        int same = dp_transport_same_host(r->t, r->ranks[q]);
        unknown |= same < 0;
        if (same > 0 && mine < 0)
            mine = q;
    }
    m[r->pos] = (float)(mine + 1);
    m[n] = unknown ? 1.0f : 0.0f;
    grp g = flat_group(r);
    part whole = {(size_t)n + 1, 0, (size_t)n + 1};
    int rc = ring_sum(r, &g, m, &whole, step, -2, err);
    if (rc < 0) {
        free(m);
        return rc;
    }
    int ok = m[n] == 0;
    for (int q = 0; q < n && ok; q++) {
        r->host[q] = (int)m[q] - 1;
        /* A host is named by its first member, who names itself. */
        ok = r->host[q] >= 0 && r->host[q] <= q && (int)m[r->host[q]] - 1 == r->host[q];
    }
    free(m);
    if (!ok) {
        for (int q = 0; q < n; q++)
            r->host[q] = q; /* unknown: each member on its own host, as far as we know */
        r->n_hosts = 0;
    }
    r->n_local = r->n_leaders = 0;
    r->leader_pos = -1;
    for (int q = 0; q < n; q++) {
        if (r->host[q] == q) {
            if (q == r->pos)
                r->leader_pos = r->n_leaders;
            r->leaders[r->n_leaders++] = r->ranks[q];
        }
        if (r->host[q] == r->host[r->pos])
            r->local[r->n_local++] = r->ranks[q];
    }
    if (ok)
        r->n_hosts = r->n_leaders;
    return 0;
}

/* auto's fit: both flat algorithms timed at two sizes, the best of a few,
 * averaged over the members; then the size below which direct is faster. */
static int fit(dp_ring *r, uint64_t step, dp_err *err)
{
    size_t small = (size_t)DP_RING_FIT_SMALL * (size_t)r->n, large = DP_RING_FIT_LARGE;
    if (!r->scratch && !(r->scratch = calloc(large, sizeof(float))))
        return dp_errf(err, "all-reduce: out of memory for the measurement");
    grp g = flat_group(r);
    double best[4] = {HUGE_VAL, HUGE_VAL, HUGE_VAL, HUGE_VAL}; /* ring s, ring l, direct s, l */
    for (int rep = 0; rep < DP_RING_FIT_REPS; rep++)
        for (int i = 0; i < 4; i++) {
            memset(r->scratch, 0, large * sizeof(float));
            double t0 = dp_now();
            size_t len = i % 2 ? large : small;
            part whole = {len, 0, len};
            int rc = i < 2 ? ring_sum(r, &g, r->scratch, &whole, step, -3, err)
                           : direct_sum(r, &g, r->scratch, &whole, step, -3, err);
            if (rc < 0)
                return rc;
            /* a fake slow link for the tests (docs/faults.md, "Test hooks"):
             * each member sends 2 (n-1)/n of the floats, either way */
            double t = dp_now() - t0 + dp_hook_link_ns() * 1e-9 * 2.0 * (r->n - 1) / r->n *
                                           (double)len * sizeof(float);
            if (t < best[i])
                best[i] = t;
        }
    /* The codec: bf16 out and back in, per float (auto's compression). */
    double codec = HUGE_VAL;
    if (r->compress.kind == DP_COMPRESS_AUTO) {
        uint8_t *tmp = malloc(large * 2);
        if (!tmp)
            return dp_errf(err, "all-reduce: out of memory for the measurement");
        for (int rep = 0; rep < DP_RING_FIT_REPS; rep++) {
            double t0 = dp_now();
            dp_compress_encode16(DP_COMPRESS_BF16, r->scratch, large, tmp);
            dp_compress_decode16_add(DP_COMPRESS_BF16, tmp, large, r->scratch);
            double t = (dp_now() - t0) / (double)large;
            if (t < codec)
                codec = t;
        }
        free(tmp);
    } else {
        codec = 0;
    }
    float sums[5];
    for (int i = 0; i < 4; i++)
        sums[i] = (float)(best[i] * 1e6); /* microseconds, summed over the members */
    sums[4] = (float)(codec * 1e12); /* picoseconds per float */
    part five = {5, 0, 5};
    int rc = ring_sum(r, &g, sums, &five, step, -3, err);
    if (rc < 0)
        return rc;
    r->codec_s = sums[4] / r->n * 1e-12;
    double extra = (double)(large - small) * sizeof(float);
    for (int a = 0; a < 2; a++) {
        r->fit_a[a] = sums[2 * a] / r->n * 1e-6;
        r->fit_b[a] = (sums[2 * a + 1] / r->n * 1e-6 - r->fit_a[a]) / extra;
        if (r->fit_b[a] < 0)
            r->fit_b[a] = 0;
    }
    /* t_a(N) = a_a + b_a (N - small): direct below the crossing. */
    double da = r->fit_a[DP_ALGO_RING] - r->fit_a[DP_ALGO_DIRECT];
    double db = r->fit_b[DP_ALGO_DIRECT] - r->fit_b[DP_ALGO_RING];
    double s0 = (double)small * sizeof(float);
    if (da <= 0)
        r->cross_bytes = db < 0 ? HUGE_VAL : 0; /* ring no slower when small */
    else
        r->cross_bytes = db <= 0 ? HUGE_VAL : s0 + da / db;
    return 0;
}

/* auto's predictions for len floats: the faster flat algorithm, and bf16
 * (half the bytes over direct's line, plus encoding and decoding each
 * float about twice: the member's share and the owner's sum). */
static double t_line(const dp_ring *r, int a, size_t len)
{
    double extra = ((double)len - DP_RING_FIT_SMALL * (double)r->n) * sizeof(float);
    return r->fit_a[a] + r->fit_b[a] * (extra > 0 ? extra : 0);
}

static double t_flat(const dp_ring *r, size_t len)
{
    double ring = t_line(r, DP_ALGO_RING, len), direct = t_line(r, DP_ALGO_DIRECT, len);
    return ring < direct ? ring : direct;
}

static double t_bf16(const dp_ring *r, size_t len)
{
    return t_line(r, DP_ALGO_DIRECT, len / 2) + 2 * r->codec_s * (double)len;
}

static int setup(dp_ring *r, uint64_t step, dp_err *err)
{
    int rc = 0;
    r->cross_bytes = r->algo == DP_ALGO_DIRECT ? HUGE_VAL : 0;
    if (r->algo == DP_ALGO_AUTO || r->algo == DP_ALGO_HIER)
        rc = setup_hosts(r, step, err);
    if (rc == 0 && (r->algo == DP_ALGO_AUTO || r->compress.kind == DP_COMPRESS_AUTO))
        rc = fit(r, step, err);
    if (rc < 0)
        return rc;
    /* Hierarchy pays when some host has several members and there are 2 or
     * more hosts: the host links then carry 2(H-1)/H of the buffer instead
     * of 2(n-1)/n, over 2(H-1) hops instead of 2(n-1), and the rest goes
     * through shared memory (docs/strategies.md). */
    r->hier = r->algo == DP_ALGO_HIER ||
              (r->algo == DP_ALGO_AUTO && r->n_hosts >= 2 && r->n_hosts < r->n);
    char fitted[160] = "", cross[48];
    if (isinf(r->cross_bytes))
        snprintf(cross, sizeof cross, "direct at every size");
    else if (r->cross_bytes <= 0)
        snprintf(cross, sizeof cross, "ring at every size");
    else
        snprintf(cross, sizeof cross, "direct below %.0f bytes", r->cross_bytes);
    if (r->algo == DP_ALGO_AUTO || r->compress.kind == DP_COMPRESS_AUTO)
        snprintf(fitted, sizeof fitted,
                 "; measured ring %.1f us + %.3f ns/B, direct %.1f us + %.3f ns/B: %s",
                 r->fit_a[0] * 1e6, r->fit_b[0] * 1e9, r->fit_a[1] * 1e6, r->fit_b[1] * 1e9,
                 cross);
    if (r->algo == DP_ALGO_RING || r->algo == DP_ALGO_DIRECT)
        snprintf(r->why, sizeof r->why, "forced: %s over %d members", algo_names[r->algo], r->n);
    else if (r->n_hosts)
        snprintf(r->why, sizeof r->why, "%s: %s over %d members on %d host(s)%s",
                 algo_names[r->algo], r->hier ? "hierarchical" : "flat", r->n, r->n_hosts,
                 fitted);
    else
        snprintf(r->why, sizeof r->why, "%s: %s over %d members, hosts unknown%s",
                 algo_names[r->algo], r->hier ? "hierarchical (one member a host)" : "flat", r->n,
                 fitted);
    size_t n = strlen(r->why);
    if (r->compress.kind == DP_COMPRESS_AUTO) {
        size_t at = (512u << 10) / sizeof(float);
        snprintf(r->why + n, sizeof r->why - n,
                 "; compress auto: bf16 at 512 KiB predicted %.2f ms vs %.2f ms (codec %.2f "
                 "ns/float): %s there",
                 t_bf16(r, at) * 1e3, t_flat(r, at) * 1e3, r->codec_s * 1e9,
                 t_bf16(r, at) < t_flat(r, at) ? "bf16" : "none");
    } else if (r->compress.kind != DP_COMPRESS_NONE) {
        snprintf(r->why + n, sizeof r->why - n, "; compress %s",
                 dp_compress_kind_name(r->compress.kind));
    }
    r->setup = 1;
    if (r->pos == 0)
        dp_debug("all-reduce: %s", r->why);
    return 0;
}

int dp_ring_measure(dp_ring *r, uint64_t step, dp_err *err)
{
    if (r->n == 1 || r->use_fast_path || r->setup)
        return 0;
    return setup(r, step, err);
}

double dp_ring_predict(const dp_ring *r, size_t len, dp_compress_kind kind)
{
    if (r->n == 1 || len == 0)
        return 0;
    return kind == DP_COMPRESS_BF16 ? t_bf16(r, len) : t_flat(r, len);
}

dp_allreduce_algo dp_ring_choice(const dp_ring *r, size_t len)
{
    if (!r->setup)
        return r->algo == DP_ALGO_AUTO ? DP_ALGO_RING : r->algo;
    if (r->hier)
        return DP_ALGO_HIER;
    if (r->algo != DP_ALGO_AUTO)
        return r->algo;
    return flat_pick(r, len);
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
    if (!r->setup) {
        int rc = setup(r, step, err);
        if (rc < 0)
            return rc;
    }
    /* The choice by the floats that move: the same on every member. */
    dp_allreduce_algo a = dp_ring_choice(r, hi - lo);
    r->calls[a]++;
    grp g = flat_group(r);
    part q = {len, lo, hi};
    return a == DP_ALGO_HIER     ? hier_sum(r, buf, &q, step, bucket, err)
           : a == DP_ALGO_DIRECT ? direct_sum(r, &g, buf, &q, step, bucket, err)
                                 : ring_sum(r, &g, buf, &q, step, bucket, err);
}

void dp_ring_set_compress(dp_ring *r, const dp_compress *c)
{
    r->compress = *c;
    /* PowerSGD works on whole matrices above the ring (powersgd.h), which
     * sums its factors exactly */
    if (c->kind == DP_COMPRESS_POWERSGD)
        r->compress.kind = DP_COMPRESS_NONE;
}

dp_compress_kind dp_ring_compress_choice(const dp_ring *r, size_t len)
{
    if (r->compress.kind != DP_COMPRESS_AUTO)
        return r->compress.kind;
    return r->setup && t_bf16(r, len) < t_flat(r, len) ? DP_COMPRESS_BF16 : DP_COMPRESS_NONE;
}

static int grow(dp_ring *r, size_t bytes, size_t floats, dp_err *err)
{
    if (bytes > r->cbuf_cap) {
        uint8_t *b = realloc(r->cbuf, bytes);
        if (!b)
            return dp_errf(err, "all-reduce: out of memory for %zu encoded bytes", bytes);
        r->cbuf = b;
        r->cbuf_cap = bytes;
    }
    if (floats > r->fbuf_cap) {
        float *f = realloc(r->fbuf, floats * sizeof *f);
        if (!f)
            return dp_errf(err, "all-reduce: out of memory for the top-k selection");
        r->fbuf = f;
        r->fbuf_cap = floats;
    }
    return 0;
}

/* Waits for the encoded segment [off, off + len) from `from` and reads it
 * into dst. */
static int recv_bytes(dp_ring *r, int from, uint8_t *dst, size_t off, size_t len, uint64_t step,
                      int bucket, dp_err *err)
{
    char what[96];
    snprintf(what, sizeof what, "compressed all-reduce step %llu bucket %d",
             (unsigned long long)step, bucket);
    dp_event ev;
    if (ring_recv(r, from, what, &ev, err) < 0)
        return broken(r, from, ev.kind == DP_EVENT_PEER_LOST, 0);
    if (ev.header.type == DP_WIRE_RING_RESET) {
        dp_errf(err, "%s is re-forming the ring (%s)", dp_transport_peer_name(r->t, from), what);
        return broken(r, from, 0, ev.header.step);
    }
    if (ev.header.type != DP_WIRE_RING || ev.header.step != step || ev.header.offset != off ||
        ev.header.length != len)
        return dp_errf(err, "%s sent frame type %u step %llu offset %llu, %llu bytes during %s; "
                            "expected step %llu at byte %zu, %zu bytes",
                       dp_transport_peer_name(r->t, from), ev.header.type,
                       (unsigned long long)ev.header.step, (unsigned long long)ev.header.offset,
                       (unsigned long long)ev.header.length, what, (unsigned long long)step, off,
                       len);
    if (dp_transport_recv_payload(r->t, from, dst, len, err) < 0)
        return broken(r, from, 1, 0);
    return 0;
}

/* Sends bytes [so, so + sn) of sb to `to` while receiving [ro, ro + rn)
 * from `from`, in segments.  Received bytes land at rb + offset; with
 * add_to, each segment lands in a scratch segment instead and is decoded
 * (16-bit kind) and added to add_to + (offset - ro) / 2. */
static int xchg_bytes(dp_ring *r, int to, const uint8_t *sb, size_t so, size_t sn, int from,
                      uint8_t *rb, size_t ro, size_t rn, dp_compress_kind kind, float *add_to,
                      uint64_t step, int bucket, dp_err *err)
{
    size_t seg = r->seg * sizeof(float), o = so, i = ro;
    while (o < so + sn || i < ro + rn) {
        if (o < so + sn) {
            size_t k = so + sn - o < seg ? so + sn - o : seg;
            if (dp_transport_send(r->t, to, DP_WIRE_RING, step, o, sb + o, k, err) < 0)
                return broken(r, to, 1, 0);
            r->bytes_sent += k;
            o += k;
        }
        if (i < ro + rn) {
            size_t k = ro + rn - i < seg ? ro + rn - i : seg;
            int rc = recv_bytes(r, from, add_to ? rb : rb + i, i, k, step, bucket, err);
            if (rc < 0)
                return rc;
            if (add_to)
                dp_compress_decode16_add(kind, rb, k / 2, add_to + (i - ro) / 2);
            i += k;
        }
    }
    return 0;
}

static int coded16(dp_ring *r, const grp *g, dp_compress_kind kind, float *buf, size_t len,
                   float *resid, uint64_t step, int bucket, dp_err *err)
{
    int n = g->n, p = g->pos;
    size_t seg = r->seg * sizeof(float);
    if (grow(r, 2 * len + seg, 0, err) < 0)
        return -1;
    uint8_t *q = r->cbuf, *tmp = r->cbuf + 2 * len;
    dp_compress_encode16(kind, buf, len, q);
    if (resid) { /* what rounding lost: buf less what q sends */
        dp_compress_decode16(kind, q, len, resid);
        for (size_t i = 0; i < len; i++)
            resid[i] = buf[i] - resid[i];
    }
    size_t plo = chunk_lo(len, n, p), phi = chunk_lo(len, n, p + 1);
    /* Reduce-scatter: this member's own share first, then p+1, p+2, ... */
    dp_compress_decode16(kind, q + 2 * plo, phi - plo, buf + plo);
    int rc = 0;
    for (int k = 1; k < n && rc == 0; k++) {
        int to = (p - k + n) % n, from = (p + k) % n;
        size_t tlo = chunk_lo(len, n, to), thi = chunk_lo(len, n, to + 1);
        rc = xchg_bytes(r, g->ranks[to], q, 2 * tlo, 2 * (thi - tlo), g->ranks[from], tmp,
                        2 * plo, 2 * (phi - plo), kind, buf + plo, step, bucket, err);
    }
    if (rc < 0)
        return rc;
    /* The sum rounded once, the owner taking the rounded value too. */
    dp_compress_encode16(kind, buf + plo, phi - plo, q + 2 * plo);
    for (int k = 1; k < n && rc == 0; k++) {
        int to = (p + k) % n, from = (p - k + n) % n;
        size_t flo = chunk_lo(len, n, from), fhi = chunk_lo(len, n, from + 1);
        rc = xchg_bytes(r, g->ranks[to], q, 2 * plo, 2 * (phi - plo), g->ranks[from], q,
                        2 * flo, 2 * (fhi - flo), kind, NULL, step, bucket, err);
    }
    if (rc == 0)
        dp_compress_decode16(kind, q, len, buf);
    return rc;
}

static int coded_topk(dp_ring *r, const grp *g, float *buf, size_t len, float *resid,
                      uint64_t step, int bucket, dp_err *err)
{
    int n = g->n, p = g->pos;
    size_t k = dp_topk_count(r->compress.ratio, len), slot = 8 * k;
    if (grow(r, slot * (size_t)n, len, err) < 0)
        return -1;
    uint8_t *pairs = r->cbuf;
    dp_topk_encode(buf, len, k, r->fbuf, pairs + slot * (size_t)p);
    if (resid) {
        memcpy(resid, buf, len * sizeof *resid);
        const uint8_t *mine = pairs + slot * (size_t)p;
        for (size_t j = 0; j < k; j++)
            resid[dp_get_u32(mine + 8 * j)] = 0;
    }
    int rc = 0;
    for (int s = 1; s < n && rc == 0; s++) {
        int to = (p + s) % n, from = (p - s + n) % n;
        rc = xchg_bytes(r, g->ranks[to], pairs, slot * (size_t)p, slot, g->ranks[from], pairs,
                        slot * (size_t)from, slot, DP_COMPRESS_TOPK, NULL, step, bucket, err);
    }
    if (rc < 0)
        return rc;
    memset(buf, 0, len * sizeof *buf);
    for (int q = 0; q < n; q++)
        if (dp_topk_decode_add(pairs + slot * (size_t)q, k, buf, len, err) < 0)
            return dp_errf(err, "%s: %s", dp_transport_peer_name(r->t, g->ranks[q]), err->msg);
    return 0;
}

static int coded_sum(dp_ring *r, const grp *g, dp_compress_kind kind, float *buf, size_t len,
                     float *resid, uint64_t step, int bucket, dp_err *err)
{
    return kind == DP_COMPRESS_TOPK ? coded_topk(r, g, buf, len, resid, step, bucket, err)
                                    : coded16(r, g, kind, buf, len, resid, step, bucket, err);
}

int dp_ring_allreduce_coded(dp_ring *r, float *buf, size_t len, float *resid, uint64_t step,
                            int bucket, dp_err *err)
{
    if (resid)
        for (size_t i = 0; i < len; i++)
            buf[i] += resid[i];
    if (r->n == 1 || len == 0 || r->use_fast_path || r->compress.kind == DP_COMPRESS_NONE) {
        if (resid)
            memset(resid, 0, len * sizeof *resid);
        return dp_ring_allreduce(r, buf, len, step, bucket, err);
    }
    if (!r->setup) {
        int rc = setup(r, step, err);
        if (rc < 0)
            return rc;
    }
    dp_compress_kind kind = dp_ring_compress_choice(r, len);
    if (kind == DP_COMPRESS_NONE) {
        if (resid)
            memset(resid, 0, len * sizeof *resid);
        return dp_ring_allreduce(r, buf, len, step, bucket, err);
    }
    r->coded_calls++;
    grp g = flat_group(r);
    if (!r->hier)
        return coded_sum(r, &g, kind, buf, len, resid, step, bucket, err);
    /* Hierarchical: exact inside the host (shared memory), compressed
     * between the leaders only, with the leader's residual; the others'
     * residuals stay zero (theirs went into buf above). */
    r->calls[DP_ALGO_HIER]++;
    int rc = 0;
    if (r->leader_pos < 0) {
        if (resid)
            memset(resid, 0, len * sizeof *resid);
        int leader = r->local[0];
        rc = exchange(r, buf, leader, 0, len, -1, 0, 0, 0, step, bucket, err);
        return rc < 0 ? rc : exchange(r, buf, -1, 0, 0, leader, 0, len, 0, step, bucket, err);
    }
    for (int j = 1; j < r->n_local && rc == 0; j++)
        rc = exchange(r, buf, -1, 0, 0, r->local[j], 0, len, 1, step, bucket, err);
    grp lg = {r->leaders, r->n_leaders, r->leader_pos};
    if (rc == 0 && lg.n > 1)
        rc = coded_sum(r, &lg, kind, buf, len, resid, step, bucket, err);
    else if (rc == 0 && resid)
        memset(resid, 0, len * sizeof *resid); /* one host: nothing was lost */
    for (int j = 1; j < r->n_local && rc == 0; j++)
        rc = exchange(r, buf, r->local[j], 0, len, -1, 0, 0, 0, step, bucket, err);
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
    if (ring_recv(r, from, what, &ev, err) < 0)
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
