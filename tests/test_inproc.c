/* The in-process transport against the contract of transport.h:
 * - per-peer FIFO order, and DP_PEER_ANY in the order frames were sent;
 * - two-step receive: a chunked payload read in uneven pieces, byte-exact,
 *   with the header TCP would give (chunked flag, CRC of the first chunk);
 *   skip; an unread payload discarded at the next poll of that peer only;
 * - poll with timeout 0 just looks; a timed poll waits and is woken by a
 *   frame from another thread; recv's timeout names the peer;
 * - losses: close (frames first, then an orderly PEER_LOST, reported once),
 *   crash (frames first, then a PEER_LOST that is not orderly), cut (frames
 *   dropped, the loss first, a payload cut short fails), sends after a loss;
 * - sendv from pieces, counters exact (bytes = wire sizes), names;
 * - four threads sending to one receiver: nothing lost, each sender in order;
 * - the ring all-reduce over 3 and 4 ranks in threads: every replica
 *   bitwise equal to a serial sum taken in the ring's order. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "downpour/clock.h"
#include "downpour/crc32c.h"
#include "downpour/inproc.h"
#include "downpour/log.h"
#include "downpour/ring.h"

#define T0 DP_FRAME_APP(50) /* any application type: the transport does not care */

static dp_err err;

static void open_n(dp_transport **ts, int n)
{
    if (dp_inproc_open(ts, n, &err) < 0) {
        fprintf(stderr, "dp_inproc_open: %s\n", err.msg);
        exit(1);
    }
}

static void close_n(dp_transport **ts, int n)
{
    for (int i = 0; i < n; i++)
        dp_transport_close(ts[i]);
}

static int send_u32(dp_transport *t, int peer, uint64_t step, uint32_t v)
{
    uint8_t b[4];
    dp_put_u32(b, v);
    return dp_transport_send(t, peer, T0, step, 0, b, sizeof b, &err);
}

/* Polls one event with timeout 0. */
static dp_event look(dp_transport *t, int peer)
{
    dp_event ev;
    REQUIRE(dp_transport_poll(t, peer, 0, &ev, &err) == 0);
    return ev;
}

static void test_basics(void)
{
    dp_transport *ts[3];
    const char *names[3] = {"chief:0", "worker:0", NULL};
    REQUIRE(dp_inproc_open_named(ts, 3, names, &err) == 0);
    CHECK(strcmp(dp_transport_name(ts[0]), "inproc") == 0);
    CHECK(dp_transport_rank(ts[2]) == 2 && dp_transport_size(ts[2]) == 3);
    CHECK(strcmp(dp_transport_peer_name(ts[2], 1), "worker:0") == 0);
    CHECK(strcmp(dp_transport_peer_name(ts[0], 2), "rank 2") == 0);
    CHECK(dp_transport_has_allreduce(ts[0]) == 0);
    CHECK(dp_transport_connect_all(ts[1], dp_now() + 1, &err) == 0);
    /* Misuse is refused by the common part. */
    CHECK(dp_transport_send(ts[0], 0, T0, 0, 0, NULL, 0, &err) < 0);
    CHECK(dp_transport_send(ts[0], 1, DP_FRAME_BYE, 0, 0, NULL, 0, &err) < 0);
    dp_event ev;
    CHECK(dp_transport_poll(ts[0], 7, 0, &ev, &err) < 0);
    /* Nothing there: timeout 0 just looks. */
    ev = look(ts[0], DP_PEER_ANY);
    CHECK(ev.kind == DP_EVENT_TIMEOUT);
    /* An empty frame: header only, nothing pending after it. */
    REQUIRE(dp_transport_send(ts[1], 0, T0, 9, 33, NULL, 0, &err) == 0);
    ev = look(ts[0], 1);
    CHECK(ev.kind == DP_EVENT_FRAME && ev.peer == 1 && ev.header.type == T0 &&
          ev.header.step == 9 && ev.header.offset == 33 && ev.header.length == 0 &&
          ev.header.source == 1 && ev.header.payload_crc == 0);
    uint8_t b[1];
    CHECK(dp_transport_recv_payload(ts[0], 1, b, 1, &err) < 0);
    CHECK(strstr(err.msg, "no payload pending from worker:0") != NULL);
    close_n(ts, 3);
}

static void test_order(void)
{
    dp_transport *ts[4];
    open_n(ts, 4);
    /* Per-peer FIFO, with frames of other peers interleaved. */
    for (uint32_t i = 0; i < 100; i++) {
        REQUIRE(send_u32(ts[1], 0, i, i * 3) == 0);
        REQUIRE(send_u32(ts[2], 0, 1000 + i, i) == 0);
    }
    for (uint32_t i = 0; i < 100; i++) {
        dp_event ev = look(ts[0], 2);
        CHECK(ev.kind == DP_EVENT_FRAME && ev.peer == 2 && ev.header.step == 1000 + i);
        uint8_t b[4];
        REQUIRE(dp_transport_recv_payload(ts[0], 2, b, 4, &err) == 0);
        CHECK(dp_get_u32(b) == i);
    }
    CHECK(look(ts[0], 2).kind == DP_EVENT_TIMEOUT);
    for (uint32_t i = 0; i < 100; i++) {
        dp_event ev = look(ts[0], DP_PEER_ANY);
        CHECK(ev.kind == DP_EVENT_FRAME && ev.peer == 1 && ev.header.step == i);
        uint8_t b[4];
        REQUIRE(dp_transport_recv_payload(ts[0], 1, b, 4, &err) == 0);
        CHECK(dp_get_u32(b) == i * 3);
    }
    /* DP_PEER_ANY takes frames in the order they were sent, across senders. */
    const int order[6] = {3, 1, 1, 2, 3, 2};
    for (int k = 0; k < 6; k++)
        REQUIRE(send_u32(ts[order[k]], 0, (uint64_t)k, 0) == 0);
    for (int k = 0; k < 6; k++) {
        dp_event ev = look(ts[0], DP_PEER_ANY);
        CHECK(ev.kind == DP_EVENT_FRAME && ev.peer == order[k] && ev.header.step == (uint64_t)k);
    }
    CHECK(look(ts[0], DP_PEER_ANY).kind == DP_EVENT_TIMEOUT);
    close_n(ts, 4);
}

static void test_payloads(void)
{
    dp_transport *ts[2];
    open_n(ts, 2);
    /* 3 MiB + 5 bytes from three pieces (one of them empty), read back in
     * uneven pieces across the chunk boundaries. */
    size_t len = (3u << 20) + 5;
    uint8_t *src = malloc(len), *dst = malloc(len);
    REQUIRE(src && dst);
    for (size_t i = 0; i < len; i++)
        src[i] = (uint8_t)(i * 131 + (i >> 13));
    struct iovec iov[3] = {{src, 1000}, {src + 1000, 0}, {src + 1000, len - 1000}};
    REQUIRE(dp_transport_sendv(ts[0], 1, T0, 4, 12, iov, 3, &err) == 0);
    dp_event ev = look(ts[1], 0);
    REQUIRE(ev.kind == DP_EVENT_FRAME);
    CHECK(ev.header.length == len && ev.header.step == 4 && ev.header.offset == 12);
    CHECK(ev.header.flags & DP_FRAME_F_CHUNKED);
    CHECK(ev.header.version == DP_FRAME_VERSION);
    CHECK(ev.header.payload_crc == dp_crc32c(0, src, DP_FRAME_CHUNK));
    memset(dst, 0, len);
    size_t pieces[4] = {7, (1u << 20) - 3, (2u << 20) + 1, 0};
    pieces[3] = len - pieces[0] - pieces[1] - pieces[2];
    size_t at = 0;
    for (int k = 0; k < 4; k++) {
        CHECK(dp_transport_recv_payload(ts[1], 0, dst + at, pieces[k], &err) == 0);
        at += pieces[k];
    }
    CHECK(memcmp(src, dst, len) == 0);
    CHECK(dp_frame_check_payload(&ev.header, dst, len) == 0);
    CHECK(dp_transport_recv_payload(ts[1], 0, dst, 1, &err) < 0); /* all read */

    /* Reading more than is left fails without losing the rest. */
    REQUIRE(dp_transport_send(ts[0], 1, T0, 5, 0, src, 10, &err) == 0);
    ev = look(ts[1], 0);
    CHECK(dp_transport_recv_payload(ts[1], 0, dst, 11, &err) < 0);
    CHECK(strstr(err.msg, "only 10 are left") != NULL);
    CHECK(dp_transport_recv_payload(ts[1], 0, dst, 10, &err) == 0 && memcmp(dst, src, 10) == 0);

    /* skip_payload discards on purpose; the next frame is intact. */
    REQUIRE(dp_transport_send(ts[0], 1, T0, 6, 0, src, 100, &err) == 0);
    REQUIRE(dp_transport_send(ts[0], 1, T0, 7, 0, src + 100, 50, &err) == 0);
    ev = look(ts[1], 0);
    CHECK(ev.header.step == 6);
    CHECK(dp_transport_recv_payload(ts[1], 0, dst, 3, &err) == 0);
    CHECK(dp_transport_skip_payload(ts[1], 0, &err) == 0);
    CHECK(dp_transport_skip_payload(ts[1], 0, &err) == 0); /* nothing pending: a no-op */
    ev = look(ts[1], 0);
    CHECK(ev.header.step == 7 && ev.header.length == 50);
    CHECK(dp_transport_recv_payload(ts[1], 0, dst, 50, &err) == 0 && memcmp(dst, src + 100, 50) == 0);
    close_n(ts, 2);
    free(src);
    free(dst);
}

/* An unread payload is discarded at the next poll of that peer, and only
 * then: a poll of another peer leaves it readable. */
static void test_discard(void)
{
    dp_transport *ts[3];
    open_n(ts, 3);
    uint8_t src[64], dst[64];
    for (int i = 0; i < 64; i++)
        src[i] = (uint8_t)i;
    REQUIRE(dp_transport_send(ts[1], 0, T0, 1, 0, src, 64, &err) == 0);
    REQUIRE(dp_transport_send(ts[1], 0, T0, 2, 0, src, 8, &err) == 0);
    REQUIRE(dp_transport_send(ts[2], 0, T0, 3, 0, src, 4, &err) == 0);
    dp_event ev = look(ts[0], 1);
    CHECK(ev.header.step == 1);
    CHECK(dp_transport_recv_payload(ts[0], 1, dst, 10, &err) == 0);
    ev = look(ts[0], 2); /* another peer: frame 1's payload stays */
    CHECK(ev.peer == 2 && ev.header.step == 3);
    CHECK(dp_transport_recv_payload(ts[0], 1, dst + 10, 20, &err) == 0);
    CHECK(memcmp(dst, src, 30) == 0);
    ev = look(ts[0], 1); /* this peer again: the rest is discarded */
    CHECK(ev.header.step == 2 && ev.header.length == 8);
    CHECK(dp_transport_recv_payload(ts[0], 1, dst, 8, &err) == 0 && memcmp(dst, src, 8) == 0);
    CHECK(look(ts[0], DP_PEER_ANY).kind == DP_EVENT_TIMEOUT); /* discards peer 2's 4 bytes */
    CHECK(dp_transport_recv_payload(ts[0], 2, dst, 4, &err) < 0);
    close_n(ts, 3);
}

typedef struct later {
    dp_transport *t;
    double delay;
} later;

static void *send_later(void *arg)
{
    later *l = arg;
    dp_err e;
    struct timespec ts = {0, (long)(l->delay * 1e9)};
    nanosleep(&ts, NULL);
    if (dp_transport_send(l->t, 0, T0, 77, 0, "x", 1, &e) < 0)
        fprintf(stderr, "send_later: %s\n", e.msg);
    return NULL;
}

static void test_timeouts(void)
{
    dp_transport *ts[2];
    const char *names[2] = {"ps:0", "worker:1"};
    REQUIRE(dp_inproc_open_named(ts, 2, names, &err) == 0);
    double t0 = dp_now();
    CHECK(look(ts[0], 1).kind == DP_EVENT_TIMEOUT);
    dp_event ev;
    REQUIRE(dp_transport_poll(ts[0], DP_PEER_ANY, 0.05, &ev, &err) == 0);
    CHECK(ev.kind == DP_EVENT_TIMEOUT);
    CHECK(dp_now() - t0 >= 0.045);
    CHECK(dp_transport_recv(ts[0], 1, "gradients", 0.02, &ev, &err) < 0);
    CHECK(ev.kind == DP_EVENT_TIMEOUT);
    CHECK(strstr(err.msg, "waiting for worker:1 (gradients): no frame after") != NULL);
    /* A waiting poll is woken by a frame sent from another thread. */
    later l = {ts[1], 0.02};
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, send_later, &l) == 0);
    REQUIRE(dp_transport_poll(ts[0], 1, 30, &ev, &err) == 0);
    CHECK(ev.kind == DP_EVENT_FRAME && ev.header.step == 77);
    pthread_join(th, NULL);
    l.delay = 0.01;
    REQUIRE(pthread_create(&th, NULL, send_later, &l) == 0);
    CHECK(dp_transport_recv(ts[0], 1, "x", 30, &ev, &err) == 0 && ev.header.step == 77);
    pthread_join(th, NULL);
    close_n(ts, 2);
}

static void test_close(void)
{
    dp_transport *ts[3];
    const char *names[3] = {"chief:0", "worker:0", "ps:0"};
    REQUIRE(dp_inproc_open_named(ts, 3, names, &err) == 0);
    REQUIRE(send_u32(ts[1], 0, 1, 11) == 0);
    REQUIRE(send_u32(ts[1], 0, 2, 22) == 0);
    REQUIRE(send_u32(ts[1], 2, 3, 33) == 0);
    dp_transport_close(ts[1]);
    ts[1] = NULL;
    /* What it sent comes first, then the orderly loss, once. */
    dp_event ev = look(ts[0], DP_PEER_ANY);
    CHECK(ev.kind == DP_EVENT_FRAME && ev.header.step == 1);
    uint8_t b[4];
    CHECK(dp_transport_recv_payload(ts[0], 1, b, 4, &err) == 0 && dp_get_u32(b) == 11);
    /* Until it has read the goodbye, a send to the closed peer goes nowhere. */
    CHECK(send_u32(ts[0], 1, 0, 0) == 0);
    ev = look(ts[0], 1);
    CHECK(ev.kind == DP_EVENT_FRAME && ev.header.step == 2);
    ev = look(ts[0], 1);
    CHECK(ev.kind == DP_EVENT_PEER_LOST && ev.peer == 1 && ev.orderly == 1);
    CHECK(strstr(ev.reason, "BYE") != NULL);
    CHECK(look(ts[0], 1).kind == DP_EVENT_TIMEOUT);
    CHECK(look(ts[0], DP_PEER_ANY).kind == DP_EVENT_TIMEOUT);
    CHECK(send_u32(ts[0], 1, 0, 0) < 0);
    CHECK(strstr(err.msg, "worker:0") != NULL);
    CHECK(dp_transport_connect(ts[0], 1, dp_now() + 1, &err) < 0);
    /* ps:0 sees the same, and nothing of the others. */
    ev = look(ts[2], DP_PEER_ANY);
    CHECK(ev.kind == DP_EVENT_FRAME && ev.peer == 1 && ev.header.step == 3);
    ev = look(ts[2], DP_PEER_ANY);
    CHECK(ev.kind == DP_EVENT_PEER_LOST && ev.peer == 1 && ev.orderly == 1);
    CHECK(look(ts[2], DP_PEER_ANY).kind == DP_EVENT_TIMEOUT);
    /* A poll that may wait returns the loss of a peer closed meanwhile. */
    dp_transport_close(ts[0]);
    REQUIRE(dp_transport_poll(ts[2], 0, 30, &ev, &err) == 0);
    CHECK(ev.kind == DP_EVENT_PEER_LOST && ev.peer == 0 && ev.orderly == 1);
    dp_transport_close(ts[2]); /* the last one frees the hub (ASan watches) */
    dp_transport_close(NULL);
}

static void test_crash(void)
{
    dp_transport *ts[3];
    open_n(ts, 3);
    REQUIRE(send_u32(ts[1], 0, 1, 0) == 0);
    REQUIRE(send_u32(ts[0], 1, 5, 0) == 0); /* to the one about to crash: dropped */
    REQUIRE(dp_inproc_kill(ts[1], DP_INPROC_CRASH, &err) == 0);
    CHECK(dp_inproc_kill(ts[1], DP_INPROC_CRASH, &err) < 0);
    CHECK(send_u32(ts[1], 0, 2, 0) < 0); /* a dead endpoint sends nothing */
    CHECK(strstr(err.msg, "killed") != NULL);
    dp_event ev = look(ts[0], 1);
    CHECK(ev.kind == DP_EVENT_FRAME && ev.header.step == 1);
    ev = look(ts[0], 1);
    CHECK(ev.kind == DP_EVENT_PEER_LOST && ev.peer == 1 && ev.orderly == 0);
    CHECK(strstr(ev.reason, "without BYE") != NULL);
    ev = look(ts[2], DP_PEER_ANY);
    CHECK(ev.kind == DP_EVENT_PEER_LOST && ev.peer == 1 && ev.orderly == 0);
    /* The dead endpoint reports each peer lost once, then nothing. */
    int lost = 0;
    for (int k = 0; k < 3; k++) {
        ev = look(ts[1], DP_PEER_ANY);
        lost += ev.kind == DP_EVENT_PEER_LOST && ev.orderly == 0;
    }
    CHECK(lost == 2);
    /* Its owner closes it; no goodbye follows the crash. */
    dp_transport_close(ts[1]);
    CHECK(look(ts[0], DP_PEER_ANY).kind == DP_EVENT_TIMEOUT);
    dp_transport_close(ts[2]);
    ev = look(ts[0], DP_PEER_ANY);
    CHECK(ev.kind == DP_EVENT_PEER_LOST && ev.peer == 2 && ev.orderly == 1);
    dp_transport_close(ts[0]);
}

static void test_cut(void)
{
    dp_transport *ts[3];
    open_n(ts, 3);
    uint8_t big[1000] = {0}, dst[1000];
    REQUIRE(dp_transport_send(ts[2], 0, T0, 1, 0, big, sizeof big, &err) == 0);
    REQUIRE(send_u32(ts[2], 0, 2, 0) == 0);
    REQUIRE(send_u32(ts[1], 0, 3, 0) == 0);
    dp_event ev = look(ts[0], 2);
    REQUIRE(ev.kind == DP_EVENT_FRAME && ev.header.step == 1);
    CHECK(dp_transport_recv_payload(ts[0], 2, dst, 100, &err) == 0);
    REQUIRE(dp_inproc_kill(ts[2], DP_INPROC_CUT, &err) == 0);
    /* The payload on its way is cut short, the queued frame dropped, and the
     * loss comes before the frame rank 1 sent earlier. */
    CHECK(dp_transport_recv_payload(ts[0], 2, dst, 100, &err) < 0);
    CHECK(strstr(err.msg, "cut") != NULL);
    CHECK(send_u32(ts[0], 2, 0, 0) < 0);
    ev = look(ts[0], DP_PEER_ANY);
    CHECK(ev.kind == DP_EVENT_PEER_LOST && ev.peer == 2 && ev.orderly == 0);
    ev = look(ts[0], DP_PEER_ANY);
    CHECK(ev.kind == DP_EVENT_FRAME && ev.peer == 1 && ev.header.step == 3);
    CHECK(look(ts[0], DP_PEER_ANY).kind == DP_EVENT_TIMEOUT);
    close_n(ts, 3);
    CHECK(dp_inproc_kill(NULL, DP_INPROC_CUT, &err) < 0);
}

static void test_stats(void)
{
    dp_transport *ts[3];
    open_n(ts, 3);
    size_t lens[4] = {0, 17, (1u << 20) + 1, 3u << 20};
    uint8_t *buf = calloc(1, 3u << 20);
    REQUIRE(buf);
    uint64_t want = 0;
    for (int k = 0; k < 4; k++) {
        REQUIRE(dp_transport_send(ts[1], 0, T0, 0, 0, buf, lens[k], &err) == 0);
        want += dp_frame_wire_size(lens[k]);
    }
    REQUIRE(send_u32(ts[2], 0, 0, 0) == 0);
    dp_transport_stats s;
    REQUIRE(dp_transport_stats_get(ts[1], 0, &s) == 0);
    CHECK(s.frames_sent == 4 && s.bytes_sent == want && s.frames_recv == 0 && s.bytes_recv == 0);
    CHECK(s.heartbeats_sent == 0);
    for (int k = 0; k < 5; k++) {
        dp_event ev = look(ts[0], DP_PEER_ANY);
        CHECK(ev.kind == DP_EVENT_FRAME); /* payloads left unread: still counted */
    }
    REQUIRE(dp_transport_stats_get(ts[0], 1, &s) == 0);
    CHECK(s.frames_recv == 4 && s.bytes_recv == want && s.frames_sent == 0);
    REQUIRE(dp_transport_stats_get(ts[0], DP_PEER_ANY, &s) == 0);
    CHECK(s.frames_recv == 5 && s.bytes_recv == want + dp_frame_wire_size(4));
    CHECK(dp_transport_stats_get(ts[0], 9, &s) < 0);
    close_n(ts, 3);
    free(buf);
}

/* Several threads send to one receiver at once. */
#define SENDERS 4
#define PER_SENDER 5000

static void *sender_main(void *arg)
{
    dp_transport *t = arg;
    dp_err e;
    uint8_t b[64];
    int me = dp_transport_rank(t);
    for (uint32_t i = 0; i < PER_SENDER; i++) {
        size_t len = 4 + (i % 60);
        dp_put_u32(b, i);
        memset(b + 4, me, len - 4);
        if (dp_transport_send(t, 0, T0, i, (uint64_t)me, b, len, &e) < 0) {
            fprintf(stderr, "sender %d: %s\n", me, e.msg);
            return (void *)1;
        }
    }
    return NULL;
}

static void test_threads(void)
{
    dp_transport *ts[SENDERS + 1];
    open_n(ts, SENDERS + 1);
    pthread_t th[SENDERS];
    for (int i = 0; i < SENDERS; i++)
        REQUIRE(pthread_create(&th[i], NULL, sender_main, ts[i + 1]) == 0);
    uint32_t next[SENDERS + 1] = {0};
    int bad = 0;
    for (int got = 0; got < SENDERS * PER_SENDER;) {
        dp_event ev;
        REQUIRE(dp_transport_poll(ts[0], DP_PEER_ANY, 30, &ev, &err) == 0);
        REQUIRE(ev.kind == DP_EVENT_FRAME);
        int p = ev.peer;
        uint8_t b[64];
        REQUIRE(ev.header.length >= 4 && ev.header.length <= 64);
        REQUIRE(dp_transport_recv_payload(ts[0], p, b, (size_t)ev.header.length, &err) == 0);
        bad += ev.header.step != next[p] || dp_get_u32(b) != next[p] || ev.header.offset != (uint64_t)p;
        for (size_t k = 4; k < ev.header.length; k++)
            bad += b[k] != p;
        next[p]++;
        got++;
    }
    for (int i = 0; i < SENDERS; i++) {
        void *rc;
        pthread_join(th[i], &rc);
        CHECK(rc == NULL);
        CHECK(next[i + 1] == PER_SENDER);
    }
    CHECKF(bad == 0, "%d frames out of order or corrupt", bad);
    CHECK(look(ts[0], DP_PEER_ANY).kind == DP_EVENT_TIMEOUT);
    close_n(ts, SENDERS + 1);
}

/* ---- the ring all-reduce over threads ---- */

#define MAX_RANKS 4

typedef struct ring_arg {
    dp_transport *t;
    const int *ranks;
    int n;
    size_t len, seg_bytes;
    float *buf; /* in: this rank's values; out: the sum */
    int rc;
    char msg[DP_ERR_MAX];
} ring_arg;

static void *ring_main(void *arg)
{
    ring_arg *a = arg;
    dp_ring ring;
    dp_err e;
    a->rc = dp_ring_init(&ring, a->t, a->ranks, a->n, 30, a->seg_bytes, &e);
    if (a->rc == 0) {
        a->rc = dp_ring_allreduce(&ring, a->buf, a->len, 3, 0, &e);
        dp_ring_free(&ring);
    }
    if (a->rc)
        snprintf(a->msg, sizeof a->msg, "%s", e.msg);
    return NULL;
}

/* Values of many magnitudes, so the order of the additions shows. */
static float value(int r, size_t i)
{
    uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(r * 40503u + 7u);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    float m = (float)(h & 0xffff) / 65536.0f - 0.5f;
    return m * (float)(1u << ((h >> 16) % 20));
}

static size_t chunk_lo(size_t len, int n, int c) { return (size_t)((uint64_t)len * (unsigned)c / (unsigned)n); }

static void check_ring(int n, size_t len, size_t seg_bytes)
{
    dp_transport *ts[MAX_RANKS];
    open_n(ts, n);
    int ranks[MAX_RANKS];
    for (int i = 0; i < n; i++)
        ranks[i] = (n + 1 - i) % n; /* ring order is not rank order: 1 0 2, 1 0 3 2 */
    ring_arg a[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    for (int r = 0; r < n; r++) {
        a[r] = (ring_arg){.t = ts[r], .ranks = ranks, .n = n, .len = len, .seg_bytes = seg_bytes};
        a[r].buf = malloc((len ? len : 1) * sizeof(float));
        REQUIRE(a[r].buf);
        for (size_t i = 0; i < len; i++)
            a[r].buf[i] = value(r, i);
    }
    for (int r = 0; r < n; r++)
        REQUIRE(pthread_create(&th[r], NULL, ring_main, &a[r]) == 0);
    for (int r = 0; r < n; r++) {
        pthread_join(th[r], NULL);
        CHECKF(a[r].rc == 0, "%d ranks, %zu floats: rank %d: %s", n, len, r, a[r].msg);
    }
    /* The serial sum in the ring's order: chunk c starts at ring position c
     * and each later position adds its own value to what arrives. */
    size_t bad = 0, diff_naive = 0;
    for (int c = 0; c < n; c++)
        for (size_t i = chunk_lo(len, n, c); i < chunk_lo(len, n, c + 1); i++) {
            float acc = value(ranks[c], i), naive = 0;
            for (int k = 1; k < n; k++)
                acc = value(ranks[(c + k) % n], i) + acc;
            for (int r = 0; r < n; r++)
                naive += value(r, i);
            diff_naive += memcmp(&acc, &naive, sizeof acc) != 0;
            for (int r = 0; r < n; r++)
                bad += memcmp(&a[r].buf[i], &acc, sizeof acc) != 0;
        }
    CHECKF(bad == 0, "%d ranks, %zu floats, %zu-byte segments: %zu elements differ from the "
                     "ring-order sum", n, len, seg_bytes, bad);
    if (len >= 1000) /* the check can tell orders apart */
        CHECKF(diff_naive > 0, "no element's sum depends on the order of additions");
    for (int r = 0; r < n; r++)
        free(a[r].buf);
    close_n(ts, n);
}

int main(void)
{
    dp_log_set_level(DP_LOG_ERROR); /* the discard warnings are expected */
    test_basics();
    test_order();
    test_payloads();
    test_discard();
    test_timeouts();
    test_close();
    test_crash();
    test_cut();
    test_stats();
    test_threads();
    const size_t lens[] = {0, 1, 3, 5, 1000, 4099, 100003};
    for (int n = 3; n <= 4; n++)
        for (size_t k = 0; k < sizeof lens / sizeof *lens; k++) {
            check_ring(n, lens[k], 64 * sizeof(float));
            check_ring(n, lens[k], 0); /* default segments */
        }
    return CHECK_DONE();
}
