/* The frame MAC against a man in the middle (docs/transport.md, "Frame MAC").
 * A proxy thread sits between rank 0 ("worker:0") and rank 1 ("ps:0") of two
 * TCP transports in this process and, after the handshake, (a) flips a
 * payload bit, in a small frame and in chunk 1 of a chunked one, and changes
 * a header field with its CRC recomputed, (b) replays an earlier frame, (c) swaps two frames: each time
 * the receiver refuses the frame, drops the connection with the reason
 * logged, and never hands out the altered payload.  (d) A peer with the wrong
 * secret gets nothing.  (e) With encryption on both sides payloads round-trip
 * and the wire does not show them; a mismatch is refused at the handshake.
 * (f) A second rank 0 (a restarted process: a new incarnation) replaces the
 * first: the survivor sees PEER_LOST for the old one, then the new one's
 * frames.  (g) The streaming tags (OpenSSL, in pieces) equal the one-shot
 * ones (libsodium) for both suites, and streamed encryption round-trips.
 * (h) The sniffed wire shows version 3's layout: header | htag | chunk 0 |
 * tag 0 | chunk 1 ..., payload CRC 0 and no chunk CRCs.  A loss from a frame that
 * failed authentication is reported as such (dp_transport_peer_tampered), a
 * restart is not. */
#include "downpour/clock.h"
#include "downpour/crc32c.h"
#include "downpour/frame.h"
#include "downpour/tcp.h"
#include "net/fmac.h"
#include "net/sock.h"

#include "check.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define T_DATA DP_FRAME_APP(0)
#define BIG ((size_t)(3u << 20) + 77) /* four chunks */
#define UPBUF (8u << 20)

static const unsigned char secret[] = "tamper-test-secret-0123456789abc";
static const unsigned char wrong[] = "tamper-test-secret-0123456789abX";
static const char *const names[2] = {"worker:0", "ps:0"};
static const char marker[] = "PLAINTEXT-GRADIENTS-";

/* ---- the man in the middle ---- */

static int fcntl_nonblock_off(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
}

enum { SNIFF, FLIP_SMALL, FLIP_HEADER, FLIP_CHUNK1, REPLAY, SWAP };

typedef struct proxy {
    int lfd, port, mode, target_port;
    pthread_t thr;
    uint8_t *up;     /* rank 0 -> rank 1 bytes not yet forwarded */
    size_t up_len;
    uint8_t *cap;    /* SNIFF: everything rank 0 sent after the handshake */
    size_t cap_len;
    size_t big_at;   /* SNIFF: where the first chunked frame starts in cap, + 1 */
    uint8_t *held;   /* REPLAY: a copy of the first app frame; SWAP: it, held back */
    size_t held_len;
    int hs_frames, app_frames;
    _Atomic int acted; /* read by the test while the proxy runs */
} proxy;

static void fwd(int fd, const void *p, size_t n)
{
    dp_err err;
    if (n && dp_sock_write_full(fd, p, n, dp_now() + 10, &err) != 0)
        fprintf(stderr, "proxy: %s\n", err.msg);
}

/* One whole frame from rank 0, as the mode says. */
static void on_frame(proxy *x, int out, uint8_t *f, size_t n)
{
    unsigned type = dp_get_u16(f + 6);
    uint64_t len = dp_get_u64(f + 32);
    if (x->hs_frames < 2) { /* HELLO and AUTH: no tags yet */
        x->hs_frames++;
        fwd(out, f, n);
        return;
    }
    if (x->mode == SNIFF && x->cap_len + n <= UPBUF) {
        if (len > DP_FRAME_CHUNK && !x->big_at)
            x->big_at = x->cap_len + 1;
        memcpy(x->cap + x->cap_len, f, n);
        x->cap_len += n;
    }
    if (type < DP_FRAME_APP_FIRST) {
        fwd(out, f, n);
        return;
    }
    x->app_frames++;
    size_t hl = DP_FRAME_HEADER_SIZE + DP_FRAME_TAG_SIZE;
    if (x->mode == FLIP_SMALL && !x->acted && len > 0 && len <= DP_FRAME_CHUNK) {
        f[hl + 5] ^= 0x10; /* a gradient's bit: there is no CRC to fix up, only the tag */
        x->acted = 1;
    } else if (x->mode == FLIP_HEADER && !x->acted && len > 0) {
        f[24] ^= 0x08; /* the offset, with the header CRC made right again */
        dp_put_u32(f + 44, dp_crc32c(0, f, 44));
        x->acted = 1;
    } else if (x->mode == FLIP_CHUNK1 && !x->acted && len > DP_FRAME_CHUNK) {
        uint8_t *c1 = f + hl + DP_FRAME_CHUNK + DP_FRAME_TAG_SIZE; /* behind chunk 0's tag */
        c1[100] ^= 0x01;
        x->acted = 1;
    } else if ((x->mode == REPLAY || x->mode == SWAP) && x->app_frames == 1) {
        x->held = malloc(n);
        REQUIRE(x->held);
        memcpy(x->held, f, n);
        x->held_len = n;
        if (x->mode == SWAP)
            return; /* sent after the next one */
    }
    /* Marked before anything goes out: the receiver may refuse the first
     * frame forwarded and the test look at once. */
    int late = x->app_frames == 2 && x->held;
    if (late)
        x->acted = 1;
    fwd(out, f, n);
    if (late)
        fwd(out, x->held, x->held_len); /* REPLAY: again; SWAP: late */
}

static void *proxy_main(void *arg)
{
    proxy *x = arg;
    int in = accept(x->lfd, NULL, NULL);
    if (in < 0)
        return NULL;
    dp_sockaddr sa;
    dp_err err;
    int out = -1, eno;
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", x->target_port);
    if (dp_sock_resolve(addr, 0, &sa, &err) || dp_sock_dial(&sa, 0, 2, &out, &eno, &err)) {
        close(in);
        return NULL;
    }
    /* Both blocking from here (accept gives a blocking socket; dial's may not be). */
    int fl = fcntl_nonblock_off(out);
    (void)fl;
    static uint8_t down[65536];
    for (;;) {
        struct pollfd p[2] = {{in, POLLIN, 0}, {out, POLLIN, 0}};
        if (poll(p, 2, 200) < 0 && errno != EINTR)
            break;
        if (p[1].revents) {
            ssize_t r = recv(out, down, sizeof down, 0);
            if (r <= 0)
                break;
            fwd(in, down, (size_t)r);
        }
        if (p[0].revents) {
            ssize_t r = recv(in, x->up + x->up_len, UPBUF - x->up_len, 0);
            if (r <= 0)
                break;
            x->up_len += (size_t)r;
            for (;;) {
                if (x->up_len < DP_FRAME_HEADER_SIZE)
                    break;
                uint64_t len = dp_get_u64(x->up + 32);
                size_t n = x->hs_frames < 2 ? DP_FRAME_HEADER_SIZE + (size_t)len
                                            : (size_t)dp_frame_wire_size_mac(len);
                REQUIRE(n <= UPBUF);
                if (x->up_len < n)
                    break;
                on_frame(x, out, x->up, n);
                memmove(x->up, x->up + n, x->up_len - n);
                x->up_len -= n;
            }
        }
    }
    close(in);
    close(out);
    return NULL;
}

static void proxy_start(proxy *x, int mode, int target_port)
{
    memset(x, 0, sizeof *x);
    dp_err err;
    x->mode = mode;
    x->target_port = target_port;
    x->up = malloc(UPBUF);
    x->cap = malloc(UPBUF);
    REQUIRE(x->up && x->cap);
    REQUIRE(dp_tcp_listen("127.0.0.1:0", 0, &x->lfd, &x->port, &err) == 0);
    /* The listener is non-blocking: the thread's accept must wait. */
    int fl = fcntl_nonblock_off(x->lfd);
    (void)fl;
    REQUIRE(pthread_create(&x->thr, NULL, proxy_main, x) == 0);
}

static void proxy_stop(proxy *x)
{
    shutdown(x->lfd, SHUT_RDWR);
    pthread_join(x->thr, NULL);
    close(x->lfd);
    free(x->up);
    free(x->cap);
    free(x->held);
}

/* ---- two transports, rank 0 dialing rank 1 through the proxy or not ---- */

static dp_transport *open_rank(int rank, int lfd, const char *const *addrs, const unsigned char *key,
                               int encrypt, dp_err *err)
{
    dp_tcp_config cfg;
    dp_tcp_config_init(&cfg);
    cfg.rank = rank;
    cfg.n_ranks = 2;
    cfg.addrs = addrs;
    cfg.names = names;
    cfg.secret = key;
    cfg.secret_len = 32;
    cfg.listen_fd = lfd;
    cfg.heartbeat_interval = 0.2;
    cfg.heartbeat_timeout = 3;
    cfg.handshake_timeout = 2;
    cfg.max_frame_bytes = 8u << 20;
    cfg.encrypt = encrypt;
    dp_transport *t;
    return dp_tcp_open(&cfg, &t, err) == 0 ? t : NULL;
}

typedef struct pair {
    dp_transport *t0, *t1;
    char a[2][32];
    const char *addrs[2];
    int port1;
    proxy x;
    int proxied;
} pair;

/* Opens rank 1, then rank 0 (dialing it through a proxy of mode, or
 * directly when mode < 0).  Returns rank 0's connect status. */
static int pair_open(pair *p, int mode, const unsigned char *key0, int enc0, int enc1, dp_err *err)
{
    int lfd[2], port[2];
    memset(p, 0, sizeof *p);
    for (int r = 0; r < 2; r++)
        REQUIRE(dp_tcp_listen("127.0.0.1:0", 0, &lfd[r], &port[r], err) == 0);
    p->port1 = port[1];
    p->proxied = mode >= 0;
    if (p->proxied)
        proxy_start(&p->x, mode, port[1]);
    snprintf(p->a[0], sizeof p->a[0], "127.0.0.1:%d", port[0]);
    snprintf(p->a[1], sizeof p->a[1], "127.0.0.1:%d", p->proxied ? p->x.port : port[1]);
    p->addrs[0] = p->a[0];
    p->addrs[1] = p->a[1];
    p->t1 = open_rank(1, lfd[1], p->addrs, secret, enc1, err);
    REQUIRE(p->t1);
    p->t0 = open_rank(0, lfd[0], p->addrs, key0, enc0, err);
    REQUIRE(p->t0);
    int rc = dp_transport_connect(p->t0, 1, dp_now() + 5, err);
    if (rc == 0)
        REQUIRE(dp_transport_connect(p->t1, 0, dp_now() + 5, err) == 0);
    return rc;
}

static void pair_close(pair *p)
{
    dp_transport_close(p->t0);
    dp_transport_close(p->t1);
    if (p->proxied)
        proxy_stop(&p->x);
}

/* The marker, then bytes that depend on seed and position, and so on. */
static void fill(uint8_t *b, size_t n, unsigned seed)
{
    size_t m = sizeof marker - 1;
    for (size_t i = 0; i < n; i++)
        b[i] = (i / m) % 2 ? (uint8_t)(i * 31 + seed * 7) : (uint8_t)marker[i % m];
}

/* Receives frames from rank 0 until PEER_LOST or 5 s; every payload is read
 * and compared with fill(seed = step).  Returns the frames whose payload
 * read and matched; *reason gets the loss's reason ("" if none). */
static int drain(dp_transport *t, size_t cap, char *reason, size_t rcap, int *bad_payloads)
{
    int good = 0;
    uint8_t *buf = malloc(cap), *want = malloc(cap);
    REQUIRE(buf && want);
    reason[0] = '\0';
    *bad_payloads = 0;
    double end = dp_now() + 5;
    while (dp_now() < end) {
        dp_event ev;
        dp_err err;
        REQUIRE(dp_transport_poll(t, 0, end - dp_now(), &ev, &err) == 0);
        if (ev.kind == DP_EVENT_PEER_LOST) {
            snprintf(reason, rcap, "%s", ev.reason);
            break;
        }
        if (ev.kind != DP_EVENT_FRAME)
            continue;
        size_t n = (size_t)ev.header.length;
        REQUIRE(n <= cap);
        if (dp_transport_recv_payload(t, 0, buf, n, &err) != 0) {
            fprintf(stderr, "recv_payload refused, as it should: %s\n", err.msg);
            continue;
        }
        fill(want, n, (unsigned)ev.header.step);
        if (memcmp(buf, want, n) == 0)
            good++;
        else
            (*bad_payloads)++;
    }
    free(buf);
    free(want);
    return good;
}

static void send_fill(dp_transport *t, uint64_t step, size_t n)
{
    uint8_t *b = malloc(n);
    dp_err err;
    REQUIRE(b);
    fill(b, n, (unsigned)step);
    CHECKF(dp_transport_send(t, 1, T_DATA, step, 0, b, n, &err) == 0, "%s", err.msg);
    free(b);
}

/* (a), (b), (c): the proxy alters the stream; the receiver takes the frames
 * before the altered one, refuses that one, and is told the peer is lost. */
static void tampered(int mode, const char *what, int want_good)
{
    pair p;
    dp_err err;
    REQUIRE(pair_open(&p, mode, secret, 0, 0, &err) == 0);
    if (mode == FLIP_CHUNK1) {
        send_fill(p.t0, 1, 1000);
        send_fill(p.t0, 2, BIG);
    } else {
        for (uint64_t k = 1; k <= 3; k++)
            send_fill(p.t0, k, 200 + k);
    }
    char reason[256];
    int bad;
    int good = drain(p.t1, BIG, reason, sizeof reason, &bad);
    fprintf(stderr, "%s: %d good frame(s), lost: %s\n", what, good, reason);
    CHECKF(p.x.acted, "%s: the proxy did nothing", what);
    CHECKF(bad == 0, "%s: %d altered payload(s) handed out as valid", what, bad);
    CHECKF(good == want_good, "%s: %d good frames, expected %d", what, good, want_good);
    CHECKF(strstr(reason, "failed authentication: altered or replayed") != NULL,
           "%s: reason '%s'", what, reason);
    CHECKF(strstr(reason, "from worker:0") != NULL, "%s: reason '%s'", what, reason);
    /* The receiver dropped a live peer: its client must not say it died
     * (issue 27: "lost ps:0" while the ps was alive). */
    CHECKF(dp_transport_peer_tampered(p.t1, 0) == 1, "%s: the loss is not reported as tampering",
           what);
    pair_close(&p);
}

/* (g) Both implementations of each suite, on a payload cut into uneven pieces. */
static void fmac_streaming(int suite)
{
    static uint8_t d[100003], e[sizeof d], back[sizeof d];
    unsigned char key[DP_FMAC_KEY], t1[DP_FMAC_TAG], t2[DP_FMAC_TAG];
    fill(d, sizeof d, 11);
    fill(key, sizeof key, 12);
    dp_fmac tx = {0}, rx = {0};
    REQUIRE(dp_fmac_init(&tx, suite, key, 0) == 0 && dp_fmac_init(&rx, suite, key, 1) == 0);
    const size_t cut[] = {0, 1, 15, 16, 4096, 70001, sizeof d};
    dp_fmac_tag(&tx, 7, 3, d, sizeof d, t1);
    dp_fmac_begin(&tx, 7, 3);
    for (int i = 0; i + 1 < 7; i++)
        dp_fmac_ad(&tx, d + cut[i], cut[i + 1] - cut[i]);
    dp_fmac_end_tag(&tx, t2);
    CHECKF(memcmp(t1, t2, sizeof t1) == 0, "%s: streamed tag differs", dp_fmac_suite_name(suite));
    CHECK(dp_fmac_verify(&rx, 7, 3, d, sizeof d, t2) == 0);
    for (int flip = 0; flip < 2; flip++) {
        d[5000] ^= (uint8_t)flip;
        dp_fmac_begin(&rx, 7, 3);
        for (int i = 0; i + 1 < 7; i++)
            dp_fmac_ad(&rx, d + cut[i], cut[i + 1] - cut[i]);
        CHECK(dp_fmac_end_verify(&rx, t1) == (flip ? -1 : 0));
        d[5000] ^= (uint8_t)flip;
    }
    dp_fmac_begin(&rx, 8, 3); /* another sequence number */
    dp_fmac_ad(&rx, d, sizeof d);
    CHECK(dp_fmac_end_verify(&rx, t1) == -1);
    dp_fmac_begin(&tx, 9, 0);
    for (int i = 0; i + 1 < 7; i++)
        dp_fmac_crypt(&tx, e + cut[i], d + cut[i], cut[i + 1] - cut[i]);
    dp_fmac_end_tag(&tx, t1);
    CHECK(memcmp(e, d, 64) != 0);
    memcpy(back, e, sizeof e);
    dp_fmac_begin(&rx, 9, 0);
    dp_fmac_crypt(&rx, back, back, 4097);
    dp_fmac_crypt(&rx, back + 4097, back + 4097, sizeof back - 4097);
    CHECK(dp_fmac_end_verify(&rx, t1) == 0 && memcmp(back, d, sizeof d) == 0);
    e[99999] ^= 1;
    dp_fmac_begin(&rx, 9, 0);
    dp_fmac_crypt(&rx, back, e, sizeof e);
    CHECK(dp_fmac_end_verify(&rx, t1) == -1);
    dp_fmac_free(&tx);
    dp_fmac_free(&rx);
}

int main(void)
{
    dp_err err;
    pair p;

    if (dp_fmac_aes_available())
        fmac_streaming(DP_FMAC_AESGCM);
    fmac_streaming(DP_FMAC_CHACHA);

    /* (a) a flipped payload bit, in a small frame (its chunk's tag fails)
     * and in chunk 1 of a chunked frame (chunk 0 was good, chunk 1's tag
     * fails); a header field changed, header CRC recomputed (its tag fails). */
    tampered(FLIP_SMALL, "bit flip, small frame", 0);
    tampered(FLIP_HEADER, "header field, CRC recomputed", 0);
    tampered(FLIP_CHUNK1, "bit flip, chunk 1", 1);
    /* (b) a replayed frame, (c) two frames swapped. */
    tampered(REPLAY, "replay", 2);
    tampered(SWAP, "swap", 0);

    /* (d) The wrong secret: refused, and rank 1 never sees a frame. */
    CHECK(pair_open(&p, -1, wrong, 0, 0, &err) != 0);
    CHECKF(strstr(err.msg, "authentication failed") != NULL, "%s", err.msg);
    dp_event ev;
    CHECK(dp_transport_poll(p.t1, DP_PEER_ANY, 0.3, &ev, &err) == 0);
    CHECKF(ev.kind == DP_EVENT_TIMEOUT, "%s", dp_event_kind_name(ev.kind));
    pair_close(&p);

    /* (e) Encryption: payloads round-trip (one scattered across chunk
     * boundaries), and what the proxy saw does not contain them; without
     * encryption it does (so the sniffing works). */
    for (int enc = 0; enc <= 1; enc++) {
        REQUIRE(pair_open(&p, SNIFF, secret, enc, enc, &err) == 0);
        send_fill(p.t0, 1, 4000);
        send_fill(p.t0, 2, BIG);
        uint8_t *got = malloc(BIG), *want = malloc(BIG);
        REQUIRE(got && want);
        CHECK(dp_transport_recv(p.t1, 0, "small", 5, &ev, &err) == 0 && ev.header.length == 4000);
        CHECK(dp_transport_recv_payload(p.t1, 0, got, 4000, &err) == 0);
        fill(want, 4000, 1);
        CHECK(memcmp(got, want, 4000) == 0);
        CHECK(dp_transport_recv(p.t1, 0, "big", 5, &ev, &err) == 0 && ev.header.length == BIG);
        size_t cut = (1u << 20) + 12345; /* inside chunk 1, then the rest */
        CHECKF(dp_transport_recv_payload(p.t1, 0, got, cut, &err) == 0, "%s", err.msg);
        CHECKF(dp_transport_recv_payload(p.t1, 0, got + cut, BIG - cut, &err) == 0, "%s",
               err.msg);
        fill(want, BIG, 2);
        CHECKF(memcmp(got, want, BIG) == 0, "encrypt %d: the big payload differs", enc);
        free(got);
        free(want);
        dp_transport_close(p.t0); /* the BYE: everything rank 0 sent has passed the proxy */
        p.t0 = NULL;
        CHECK(dp_transport_poll(p.t1, 0, 5, &ev, &err) == 0 && ev.kind == DP_EVENT_PEER_LOST &&
              ev.orderly);
        int seen = memmem(p.x.cap, p.x.cap_len, marker, sizeof marker - 1) != NULL;
        fprintf(stderr, "encrypt %d: %zu bytes sniffed, plaintext %s\n", enc, p.x.cap_len,
                seen ? "visible" : "not visible");
        CHECKF(p.x.cap_len > BIG, "only %zu bytes sniffed", p.x.cap_len);
        CHECKF(seen == !enc, "encrypt %d: plaintext %s on the wire", enc,
               seen ? "visible" : "not visible");
        /* (h) header | htag | chunk 0 | tag 0 | chunk 1 ...: no CRCs. */
        CHECK(p.x.big_at > 0);
        const uint8_t *bf = p.x.cap + p.x.big_at - 1;
        size_t hl = DP_FRAME_HEADER_SIZE + DP_FRAME_TAG_SIZE, ch = DP_FRAME_CHUNK;
        CHECK(p.x.big_at - 1 + dp_frame_wire_size_mac(BIG) <= p.x.cap_len);
        CHECK(dp_get_u64(bf + 32) == BIG && dp_get_u32(bf + 40) == 0);
        CHECK(dp_get_u16(bf + 4) == DP_FRAME_VERSION && DP_FRAME_VERSION == 3);
        if (!enc) {
            want = malloc(BIG);
            REQUIRE(want);
            fill(want, BIG, 2);
            CHECK(memcmp(bf + hl, want, ch) == 0);
            CHECK(memcmp(bf + hl + ch + DP_FRAME_TAG_SIZE, want + ch, ch) == 0);
            CHECK(memcmp(bf + hl + 3 * (ch + DP_FRAME_TAG_SIZE), want + 3 * ch, BIG - 3 * ch) == 0);
            free(want);
        }
        pair_close(&p);
    }
    /* An encryption mismatch is refused at the handshake, with the reason. */
    CHECK(pair_open(&p, -1, secret, 1, 0, &err) != 0);
    CHECKF(strstr(err.msg, "encryption mismatch") != NULL, "%s", err.msg);
    pair_close(&p);
    CHECK(pair_open(&p, -1, secret, 0, 1, &err) != 0);
    CHECKF(strstr(err.msg, "encryption mismatch") != NULL, "%s", err.msg);
    pair_close(&p);

    /* (f) Incarnation: a second rank 0 (a restarted process) dials while the
     * first is still UP.  The survivor reports the old one lost, then takes
     * the new one's frames, and tells the two apart by incarnation. */
    REQUIRE(pair_open(&p, -1, secret, 0, 0, &err) == 0);
    uint64_t inc_a = dp_transport_incarnation(p.t0);
    CHECK(inc_a != 0 && dp_transport_peer_incarnation(p.t1, 0) == inc_a);
    CHECK(dp_transport_peer_incarnation(p.t0, 1) == dp_transport_incarnation(p.t1));
    send_fill(p.t0, 1, 100);
    CHECK(dp_transport_recv(p.t1, 0, "old", 5, &ev, &err) == 0 && ev.header.step == 1);
    CHECK(dp_transport_skip_payload(p.t1, 0, &err) == 0);
    int lfd, port;
    REQUIRE(dp_tcp_listen("127.0.0.1:0", 0, &lfd, &port, &err) == 0);
    dp_transport *t0b = open_rank(0, lfd, p.addrs, secret, 0, &err);
    REQUIRE(t0b);
    uint64_t inc_b = dp_transport_incarnation(t0b);
    CHECK(inc_b != 0 && inc_b != inc_a);
    CHECKF(dp_transport_connect(t0b, 1, dp_now() + 5, &err) == 0, "%s", err.msg);
    send_fill(t0b, 7, 300);
    CHECK(dp_transport_poll(p.t1, 0, 5, &ev, &err) == 0);
    CHECKF(ev.kind == DP_EVENT_PEER_LOST && strstr(ev.reason, "worker:0 restarted (new incarnation)"),
           "%s %s", dp_event_kind_name(ev.kind), ev.reason);
    CHECK(dp_transport_peer_tampered(p.t1, 0) == 0); /* a restart is no tampering */
    CHECK(dp_transport_connect(p.t1, 0, dp_now() + 5, &err) == 0);
    CHECK(dp_transport_recv(p.t1, 0, "new", 5, &ev, &err) == 0 && ev.header.step == 7);
    uint8_t buf[300], want[300];
    CHECK(dp_transport_recv_payload(p.t1, 0, buf, 300, &err) == 0);
    fill(want, 300, 7);
    CHECK(memcmp(buf, want, 300) == 0);
    CHECK(dp_transport_peer_incarnation(p.t1, 0) == inc_b);
    /* The old rank 0 learns its connection is gone. */
    CHECK(dp_transport_poll(p.t0, 1, 5, &ev, &err) == 0 && ev.kind == DP_EVENT_PEER_LOST);
    /* Answers go to the new one. */
    CHECKF(dp_transport_send(p.t1, 0, T_DATA, 8, 0, "ok", 2, &err) == 0, "%s", err.msg);
    CHECK(dp_transport_recv(t0b, 1, "answer", 5, &ev, &err) == 0 && ev.header.step == 8);
    dp_transport_close(t0b);
    pair_close(&p);
    return CHECK_DONE();
}
