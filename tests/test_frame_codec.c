/* The chunked frame codec (src/net/frame_codec.h) on a socketpair, apart
 * from any connection: round trips of every frame shape (empty, small,
 * around the one-shot and chunk bounds, several chunks) with CRCs, tags and
 * encryption; heartbeats consumed and BYE reported; and refusals: a frame
 * cut short (header or payload), a corrupted CRC, a bad tag (header and
 * chunk), another source, and a length over the bound refused from the
 * header, before anything is sized from it. */
#include "net/frame_codec.h"
#include "net/stream.h"

#include "downpour/crc32c.h"

#include "check.h"

#include <pthread.h>
#include <sodium.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

enum { CRC, MAC, ENC };
static const char *mode_name[] = {"crc", "mac", "enc"};

typedef struct end {
    dp_codec cd;
    dp_codec_stats st;
    dp_stream_socket s;
} end;

static unsigned char key_ab[32], key_ba[32];

static void end_open(end *e, int fd, int mode, uint32_t peer, int dialer, uint64_t max)
{
    dp_err err;
    memset(&e->st, 0, sizeof e->st);
    REQUIRE(dp_codec_init(&e->cd, mode != CRC, mode == ENC, max, peer, "peer", &e->st, &err) == 0);
    dp_codec_key(&e->cd, DP_FMAC_CHACHA, dialer ? key_ab : key_ba, dialer ? key_ba : key_ab,
                 mode == ENC, 0);
    struct timeval tv = {0, 200 * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    dp_stream_socket_init(&e->s, fd, NULL, NULL);
}

static void pair(int sv[2])
{
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
}

typedef struct job {
    end *e;
    dp_frame_header h;
    const uint8_t *p;
    size_t len;
    int rc;
} job;

/* The payload in three pieces (gathered by the codec), as a strategy's
 * header, body and tail. */
static void *send_main(void *arg)
{
    job *j = arg;
    struct iovec v[3];
    int n = 0;
    size_t a = j->len / 3, b = j->len / 2;
    size_t cuts[4] = {0, a, b, j->len};
    for (int i = 0; i < 3; i++)
        if (cuts[i + 1] > cuts[i]) {
            v[n].iov_base = (void *)(j->p + cuts[i]);
            v[n++].iov_len = cuts[i + 1] - cuts[i];
        }
    dp_err err;
    j->rc = dp_codec_send(&j->e->cd, &j->e->s.base, 0, &j->h, v, n, j->len, &err);
    return NULL;
}

static void round_trip(int mode, size_t len)
{
    int sv[2];
    pair(sv);
    end a, b;
    end_open(&a, sv[0], mode, 1, 1, DP_FRAME_MAX_DEFAULT);
    end_open(&b, sv[1], mode, 0, 0, DP_FRAME_MAX_DEFAULT);
    uint8_t *p = malloc(len + 1), *q = malloc(len + 1);
    REQUIRE(p && q);
    for (size_t i = 0; i < len; i++)
        p[i] = (uint8_t)(i * 131 + 7);
    /* a heartbeat first: consumed by the receiver */
    uint8_t hb[DP_CODEC_HDR_MAC];
    size_t hl = dp_codec_control(mode != CRC, 0, DP_FRAME_HEARTBEAT, &a.cd.tx, &a.cd.tx_seq, hb);
    REQUIRE(write(sv[0], hb, hl) == (ssize_t)hl);
    job j = {&a, {0}, p, len, -1};
    j.h.type = DP_FRAME_APP(5);
    j.h.step = 42;
    j.h.offset = 99;
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, send_main, &j) == 0);
    dp_frame_header h;
    dp_err why;
    int r;
    while ((r = dp_codec_next(&b.cd, &b.s.base, 1, &h, &why)) == DP_CODEC_NONE)
        ;
    CHECKF(r == DP_CODEC_FRAME, "%s %zu: %d %s", mode_name[mode], len, r, why.msg);
    CHECK(h.type == DP_FRAME_APP(5) && h.step == 42 && h.offset == 99 && h.length == len);
    CHECK(!(h.flags & DP_FRAME_F_CHUNKED) == !(len > DP_FRAME_CHUNK));
    CHECK(b.st.hb_recv == 1);
    /* in uneven pieces: part of a chunk, then the rest */
    size_t first = len > 1000 ? 1000 : len;
    if (len) {
        r = dp_codec_read(&b.cd, &b.s.base, q, first, &why);
        CHECKF(r == 0, "%s %zu: %s", mode_name[mode], len, why.msg);
        r = dp_codec_read(&b.cd, &b.s.base, q + first, len - first, &why);
        CHECKF(r == 0, "%s %zu: %s", mode_name[mode], len, why.msg);
    }
    pthread_join(th, NULL);
    CHECK(j.rc == 0);
    CHECKF(memcmp(p, q, len) == 0, "%s %zu: payload differs", mode_name[mode], len);
    CHECK(!b.cd.pay_pending);
    uint64_t wire = mode == CRC ? dp_frame_wire_size(len) : dp_frame_wire_size_mac(len);
    CHECK(a.st.bytes_sent == wire && a.st.frames_sent == 1);
    CHECKF(b.st.bytes_recv == wire + hl, "%s %zu: %llu received, %llu on the wire", mode_name[mode],
           len, (unsigned long long)b.st.bytes_recv, (unsigned long long)(wire + hl));
    /* then BYE */
    hl = dp_codec_control(mode != CRC, 0, DP_FRAME_BYE, &a.cd.tx, &a.cd.tx_seq, hb);
    REQUIRE(write(sv[0], hb, hl) == (ssize_t)hl);
    CHECK(dp_codec_next(&b.cd, &b.s.base, 1, &h, &why) == DP_CODEC_BYE);
    dp_codec_free(&a.cd);
    dp_codec_free(&b.cd);
    dp_stream_close(&a.s.base);
    dp_stream_close(&b.s.base);
    free(p);
    free(q);
}

/* A frame's bytes as the codec writes them (small frames: one write). */
static size_t capture(int mode, size_t len, uint8_t *out, size_t cap)
{
    int sv[2];
    pair(sv);
    end a;
    end_open(&a, sv[0], mode, 1, 1, DP_FRAME_MAX_DEFAULT);
    uint8_t p[8192];
    for (size_t i = 0; i < len; i++)
        p[i] = (uint8_t)(i ^ 0x5a);
    struct iovec v = {p, len};
    dp_frame_header h = {0};
    h.type = DP_FRAME_APP(1);
    dp_err err;
    REQUIRE(dp_codec_send(&a.cd, &a.s.base, 0, &h, &v, len ? 1 : 0, len, &err) == 0);
    ssize_t n = read(sv[1], out, cap);
    REQUIRE(n > 0);
    dp_codec_free(&a.cd);
    close(sv[0]);
    close(sv[1]);
    return (size_t)n;
}

/* Feeds bytes to a fresh receiver (the write end then closed) and reads one
 * frame with its payload; returns the first failure's kind (or 0), why. */
static int feed(int mode, const uint8_t *b, size_t n, uint64_t max, dp_err *why)
{
    int sv[2];
    pair(sv);
    REQUIRE(write(sv[0], b, n) == (ssize_t)n);
    close(sv[0]);
    end r;
    end_open(&r, sv[1], mode, 0, 0, max);
    uint8_t *rbuf = r.cd.rbuf;
    dp_frame_header h;
    int k = dp_codec_next(&r.cd, &r.s.base, 1, &h, why);
    if (k == DP_CODEC_FRAME) {
        uint8_t sink[8192];
        k = h.length ? dp_codec_read(&r.cd, &r.s.base, sink, (size_t)h.length, why) : 0;
    }
    CHECK(r.cd.rbuf == rbuf); /* nothing resized from what came in */
    dp_codec_free(&r.cd);
    close(sv[1]);
    return k;
}

int main(void)
{
    REQUIRE(sodium_init() >= 0);
    randombytes_buf(key_ab, sizeof key_ab);
    randombytes_buf(key_ba, sizeof key_ba);
    static const size_t sizes[] = {0, 1, 7, 512, 513, 4096, 4097, 65536 + 3, DP_FRAME_CHUNK,
                                   DP_FRAME_CHUNK + 1, 2 * DP_FRAME_CHUNK + 4099};
    for (int m = CRC; m <= ENC; m++)
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
            round_trip(m, sizes[i]);

    uint8_t b[16384];
    dp_err why;
    for (int m = CRC; m <= ENC; m++) {
        size_t n = capture(m, 3000, b, sizeof b);
        CHECK(n == (m == CRC ? dp_frame_wire_size(3000) : dp_frame_wire_size_mac(3000)));
        CHECKF(feed(m, b, n, DP_FRAME_MAX_DEFAULT, &why) == 0, "%s: %s", mode_name[m], why.msg);
        /* cut in the header, then in the payload */
        CHECK(feed(m, b, 20, DP_FRAME_MAX_DEFAULT, &why) == DP_CODEC_END);
        CHECKF(strstr(why.msg, "closed mid-frame (20 of 48 header bytes)"), "%s", why.msg);
        CHECK(feed(m, b, n - 100, DP_FRAME_MAX_DEFAULT, &why) == DP_CODEC_END);
        CHECKF(strstr(why.msg, "connection closed mid-frame"), "%s", why.msg);
        /* a payload byte changed */
        b[n - 40] ^= 1;
        int k = feed(m, b, n, DP_FRAME_MAX_DEFAULT, &why);
        if (m == CRC) {
            CHECK(k == DP_CODEC_BAD);
            CHECKF(strstr(why.msg, "payload CRC mismatch"), "%s", why.msg);
        } else {
            CHECK(k == DP_CODEC_TAMPERED);
            CHECKF(strstr(why.msg, "failed authentication") && strstr(why.msg, "chunk 0"), "%s",
                   why.msg);
        }
        b[n - 40] ^= 1;
        /* a length over the receiver's bound: refused from the header */
        k = feed(m, b, n, 2999, &why);
        CHECK(k == DP_CODEC_BAD);
        CHECKF(strstr(why.msg, "bad frame header") && strstr(why.msg, "2999"), "%s", why.msg);
        /* the header's CRC */
        b[10] ^= 1;
        CHECK(feed(m, b, n, DP_FRAME_MAX_DEFAULT, &why) == DP_CODEC_BAD);
        CHECKF(strstr(why.msg, "bad frame header"), "%s", why.msg);
        b[10] ^= 1;
    }
    /* a keyed header's tag */
    size_t n = capture(MAC, 0, b, sizeof b);
    CHECK(n == DP_CODEC_HDR_MAC);
    b[DP_FRAME_HEADER_SIZE + 3] ^= 1;
    CHECK(feed(MAC, b, n, DP_FRAME_MAX_DEFAULT, &why) == DP_CODEC_TAMPERED);
    CHECKF(strstr(why.msg, "(its header)"), "%s", why.msg);
    /* another source: the header names rank 0, this receiver expects rank 3 */
    n = capture(CRC, 10, b, sizeof b);
    {
        int sv[2];
        pair(sv);
        REQUIRE(write(sv[0], b, n) == (ssize_t)n);
        end r;
        end_open(&r, sv[1], CRC, 3, 0, DP_FRAME_MAX_DEFAULT);
        dp_frame_header h;
        CHECK(dp_codec_next(&r.cd, &r.s.base, 1, &h, &why) == DP_CODEC_BAD);
        CHECKF(strstr(why.msg, "claims to come from rank 0"), "%s", why.msg);
        dp_codec_free(&r.cd);
        close(sv[0]);
        close(sv[1]);
    }
    /* as many pieces as a transport send may have (DP_TRANSPORT_MAX_IOV) */
    {
        int sv[2];
        pair(sv);
        end a, r;
        end_open(&a, sv[0], MAC, 1, 1, DP_FRAME_MAX_DEFAULT);
        end_open(&r, sv[1], MAC, 0, 0, DP_FRAME_MAX_DEFAULT);
        static uint8_t p[64 * 100], q[64 * 100];
        struct iovec v[64];
        for (int i = 0; i < 64; i++) {
            memset(p + 100 * i, i, 100);
            v[i].iov_base = p + 100 * i;
            v[i].iov_len = 100;
        }
        dp_frame_header h = {0};
        h.type = DP_FRAME_APP(0);
        CHECK(dp_codec_send(&a.cd, &a.s.base, 0, &h, v, 64, sizeof p, &why) == 0);
        CHECK(dp_codec_next(&r.cd, &r.s.base, 1, &h, &why) == DP_CODEC_FRAME);
        CHECK(dp_codec_read(&r.cd, &r.s.base, q, sizeof q, &why) == 0);
        CHECK(memcmp(p, q, sizeof p) == 0);
        dp_codec_free(&a.cd);
        dp_codec_free(&r.cd);
        close(sv[0]);
        close(sv[1]);
    }
    /* the sender refuses a payload over its bound too */
    {
        int sv[2];
        pair(sv);
        end a;
        end_open(&a, sv[0], CRC, 1, 1, 100);
        uint8_t p[200] = {0};
        struct iovec v = {p, sizeof p};
        dp_frame_header h = {0};
        h.type = DP_FRAME_APP(0);
        CHECK(dp_codec_send(&a.cd, &a.s.base, 0, &h, &v, 1, sizeof p, &why) == -1);
        CHECK(a.st.bytes_sent == 0);
        dp_codec_free(&a.cd);
        close(sv[0]);
        close(sv[1]);
    }
    return CHECK_DONE();
}
