/* libFuzzer target for the TCP transport's receive path (src/net/tcp.c):
 * frames arriving on a real, authenticated connection.  One dp_tcp transport
 * (rank 1 of 2) listens on loopback for the whole run; each input dials it
 * as rank 0, completes the real handshake (dp_auth_dial), then a writer
 * thread sends the bytes decoded from the input and closes its side, while
 * the transport polls, reads payloads and reports the connection lost.  Any
 * byte stream must end in a PEER_LOST with a reason (EOF, bad header, bad
 * CRC or frame tag, BYE, ...), with every FRAME event plausible on the way;
 * never a crash, a read past a buffer, a leak or a hang.
 *
 * Two transports, chosen by the input: one without a cluster secret (frames
 * carry CRCs only: chunking, chunk CRCs, partial reads, discards), and one
 * with a secret (wire version 3: header | htag | chunk 0 | tag 0 | ..., no
 * payload CRCs).  The harness holds the session keys of its own handshake, so
 * it tags the frames it encodes there, and they reach the tagged payload
 * path; damage bits spoil a tag, set a payload CRC or cut a frame.
 *
 * Input: byte 0 bits 0-1 how payloads are read (0 whole, 1 in pieces of
 * bits 3-7 + 1 bytes, 2 skipped, 3 left for the next poll to discard), bit 2
 * the keyed transport; then operations, a byte each (bits 0-1 the kind, see
 * the switch below) and their arguments. */
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "downpour/clock.h"
#include "downpour/crc32c.h"
#include "downpour/frame.h"
#include "downpour/log.h"
#include "downpour/tcp.h"
#include "fuzz_input.h"
#include "net/auth.h"
#include "net/fmac.h"
#include "net/sock.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char secret[] = "downpour-fuzz-secret-0123456789ab";
#define MAX_FRAME ((uint64_t)4 << 20)
#define MAX_OUT ((size_t)6 << 20)

typedef struct server {
    dp_transport *t;
    char addr[64];
} server;

static server servers[2]; /* [0] without a secret, [1] with one */

static void open_server(server *s, int keyed)
{
    int fd, port;
    dp_err err;
    if (dp_tcp_listen("127.0.0.1:0", 0, &fd, &port, &err) != 0) {
        fprintf(stderr, "fuzz_tcp: %s\n", err.msg);
        abort();
    }
    snprintf(s->addr, sizeof s->addr, "127.0.0.1:%d", port);
    const char *addrs[2] = {"127.0.0.1:1", s->addr};
    dp_tcp_config cfg;
    dp_tcp_config_init(&cfg);
    cfg.rank = 1;
    cfg.n_ranks = 2;
    cfg.addrs = addrs;
    cfg.listen_fd = fd;
    cfg.insecure = !keyed;
    cfg.secret = keyed ? (const unsigned char *)secret : NULL;
    cfg.secret_len = keyed ? sizeof secret - 1 : 0;
    cfg.max_frame_bytes = MAX_FRAME;
    cfg.sock_buf_bytes = 0;
    if (dp_tcp_open(&cfg, &s->t, &err) != 0) {
        fprintf(stderr, "fuzz_tcp: %s\n", err.msg);
        abort();
    }
}

/* ---- the bytes to send ---- */

typedef struct out {
    uint8_t *p;
    size_t n;
    dp_fmac *m;   /* keyed: the dialer's sending key; NULL: CRCs only */
    uint64_t seq; /* the next frame's sequence number */
    uint64_t fseq; /* the current frame's */
} out;

static void emit(out *o, const void *p, size_t n)
{
    if (o->n + n > MAX_OUT)
        return;
    memcpy(o->p + o->n, p, n);
    o->n += n;
}

static void emit_header(out *o, unsigned type, uint32_t flags, uint32_t source, uint64_t step,
                        uint64_t offset, uint64_t length, uint32_t crc)
{
    dp_frame_header h = {0};
    h.type = (uint16_t)type;
    h.flags = flags;
    h.source = source;
    h.step = step;
    h.offset = offset;
    h.length = length;
    h.payload_crc = crc;
    uint8_t b[DP_FRAME_HEADER_SIZE];
    dp_frame_encode(b, &h);
    emit(o, b, sizeof b);
    if (o->m) {
        uint8_t tag[DP_FMAC_TAG];
        o->fseq = o->seq++;
        dp_fmac_tag(o->m, o->fseq, DP_FMAC_HEADER, b, sizeof b, tag);
        emit(o, tag, sizeof tag);
    }
}

/* Keyed: chunk k's tag, behind it; spoil flips one of its bits. */
static void emit_tag(out *o, uint32_t k, const void *p, size_t n, int spoil)
{
    if (!o->m)
        return;
    uint8_t tag[DP_FMAC_TAG];
    dp_fmac_tag(o->m, o->fseq, k, p, n, tag);
    tag[3] ^= (uint8_t)(spoil ? 0x20 : 0);
    emit(o, tag, sizeof tag);
}

/* A chunked frame of len bytes (> one chunk) filled with `fill`; damage 1
 * spoils the first chunk's CRC (keyed: its tag), 2 the second's, 3 cuts it
 * after the first. */
static void emit_big(out *o, unsigned type, uint64_t len, uint8_t fill, int damage)
{
    static uint8_t chunk[DP_FRAME_CHUNK];
    memset(chunk, fill, sizeof chunk);
    uint32_t c0 = o->m ? 0 : dp_crc32c(0, chunk, DP_FRAME_CHUNK) ^ (damage == 1);
    emit_header(o, type, DP_FRAME_F_CHUNKED, 0, 1, 0, len, c0);
    emit(o, chunk, DP_FRAME_CHUNK);
    if (damage == 3)
        return;
    emit_tag(o, 0, chunk, DP_FRAME_CHUNK, damage == 1);
    uint32_t i = 1;
    for (uint64_t at = DP_FRAME_CHUNK; at < len; at += DP_FRAME_CHUNK, i++) {
        size_t k = len - at < DP_FRAME_CHUNK ? (size_t)(len - at) : (size_t)DP_FRAME_CHUNK;
        if (!o->m) {
            uint8_t cb[4];
            dp_put_u32(cb, dp_crc32c(0, chunk, k) ^ (damage == 2));
            emit(o, cb, 4);
        }
        emit(o, chunk, k);
        emit_tag(o, i, chunk, k, damage == 2);
    }
}

static void decode(fz_in *in, out *o)
{
    uint8_t pay[4096];
    for (int op = 0; op < 256 && fz_left(in) > 0; op++) {
        uint8_t b = fz_u8(in);
        switch (b & 3) {
        case 0: { /* raw bytes */
            size_t k = fz_bytes(in, pay, fz_u8(in));
            emit(o, pay, k);
            break;
        }
        case 1: { /* a frame, well formed unless the bits say otherwise */
            uint8_t ty = fz_u8(in);
            unsigned type = b & 4 ? DP_FRAME_APP_FIRST + ty % (DP_FRAME_COUNT - DP_FRAME_APP_FIRST)
                                  : ty;
            uint32_t flags = b & 8 ? fz_u32(in) : fz_u16(in) & DP_FRAME_FLAGS_APP;
            uint32_t source = b & 16 ? fz_u8(in) : 0;
            uint64_t step = fz_u8(in), offset = fz_u8(in);
            size_t len = fz_u16(in) % sizeof pay;
            fz_bytes(in, pay, len);
            /* Keyed: no payload CRC (bit 7 sets one, which is refused). */
            uint32_t crc = len && (!o->m || (b & 128)) ? dp_crc32c(0, pay, len) : 0;
            int spoil = 0;
            if (b & 32) {
                uint8_t bit = fz_u8(in);
                crc ^= o->m ? 0 : 1u << (bit & 31);
                spoil = 1; /* keyed: the chunk's tag */
            }
            emit_header(o, type, flags, source, step, offset, len, crc);
            size_t sent = b & 64 ? len / 2 : len; /* cut short */
            emit(o, pay, sent);
            if (len && sent == len)
                emit_tag(o, 0, pay, len, spoil);
            break;
        }
        case 2: /* a chunked frame */
            emit_big(o, DP_FRAME_APP_FIRST + (b >> 4), DP_FRAME_CHUNK + 1 + fz_u16(in), fz_u8(in),
                     (b >> 2) & 3);
            break;
        default: { /* the transport's own types after the handshake */
            unsigned type = (b >> 2) & 7; /* HELLO .. BYE, and 7 */
            size_t len = (b >> 5) & 1 ? fz_u8(in) % 16 : 0;
            fz_bytes(in, pay, len);
            emit_header(o, type, 0, 0, 0, 0, len, len && !o->m ? dp_crc32c(0, pay, len) : 0);
            emit(o, pay, len);
            if (len)
                emit_tag(o, 0, pay, len, 0);
            break;
        }
        }
    }
}

/* ---- the sending side ---- */

typedef struct writer {
    int fd;
    const out *o;
} writer;

static void *write_main(void *arg)
{
    writer *w = arg;
    size_t at = 0;
    while (at < w->o->n) {
        ssize_t n = send(w->fd, w->o->p + at, w->o->n - at, MSG_NOSIGNAL);
        if (n < 0) {
            struct pollfd pf = {w->fd, POLLOUT, 0};
            if (poll(&pf, 1, 100) < 0 || (pf.revents & (POLLERR | POLLHUP)))
                break;
            if (!(pf.revents & POLLOUT))
                continue;
            continue;
        }
        at += (size_t)n;
    }
    shutdown(w->fd, SHUT_WR);
    return NULL;
}

static int dial(server *s, int keyed, uint64_t incarnation, dp_auth_session *ses)
{
    dp_sockaddr sa;
    dp_err err;
    int fd = -1, eno = 0;
    if (dp_sock_resolve(s->addr, 0, &sa, &err) != 0 ||
        dp_sock_dial(&sa, 0, 5.0, &fd, &eno, &err) != 0) {
        fprintf(stderr, "fuzz_tcp: dial %s: %s\n", s->addr, err.msg);
        abort();
    }
    dp_auth_params p = {0};
    p.self_rank = 0;
    p.n_ranks = 2;
    /* Never NULL, as tcp.c passes its (empty) secret array: auth.c hands the
     * pointer to libsodium's HMAC even when the length is 0. */
    p.secret = (const unsigned char *)secret;
    p.secret_len = keyed ? sizeof secret - 1 : 0;
    p.deadline = dp_now() + 10.0;
    p.incarnation = incarnation;
    dp_auth_io io = {0};
    if (dp_auth_dial(fd, &p, 1, &io, ses, &err) != 0) {
        fprintf(stderr, "fuzz_tcp: handshake: %s\n", err.msg);
        abort();
    }
    if (dp_transport_connect(s->t, 0, dp_now() + 10.0, &err) != 0) {
        fprintf(stderr, "fuzz_tcp: %s\n", err.msg);
        abort();
    }
    return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint64_t incarnation = 1;
    static out o;
    static uint8_t *rbuf;
    static dp_fmac tx;
    if (!o.p) {
        dp_log_set_level(DP_LOG_ERROR);
        open_server(&servers[0], 0);
        open_server(&servers[1], 1);
        o.p = malloc(MAX_OUT);
        rbuf = malloc(64 << 10);
        if (!o.p || !rbuf)
            abort();
    }
    if (size < 1 || size > 8192)
        return 0;
    fz_in in = {data, size, 0};
    uint8_t b0 = fz_u8(&in);
    int style = b0 & 3, keyed = (b0 >> 2) & 1;
    size_t piece = 1 + (b0 >> 3);
    server *s = &servers[keyed];
    dp_auth_session ses;
    int fd = dial(s, keyed, incarnation++, &ses);
    o.n = 0;
    o.seq = 0;
    o.m = NULL;
    if (ses.keyed) {
        if (dp_fmac_init(&tx, ses.suite, ses.key_tx, 0) != 0)
            abort();
        o.m = &tx;
    }
    decode(&in, &o);

    writer w = {fd, &o};
    pthread_t thr;
    if (pthread_create(&thr, NULL, write_main, &w) != 0)
        abort();
    dp_err err;
    dp_event ev;
    int lost = 0;
    for (int k = 0; k < 100000 && !lost; k++) {
        if (dp_transport_poll(s->t, 0, 10.0, &ev, &err) != 0)
            abort();
        if (ev.kind == DP_EVENT_TIMEOUT) {
            fprintf(stderr, "fuzz_tcp: no event in 10 s after %zu bytes\n", o.n);
            abort(); /* EOF follows the input: a silent transport is stuck */
        }
        if (ev.peer != 0)
            abort();
        if (ev.kind == DP_EVENT_PEER_LOST) {
            if (ev.reason[0] == '\0')
                abort(); /* a loss says why */
            lost = 1;
            break;
        }
        if (ev.header.type < DP_FRAME_APP_FIRST || ev.header.length > MAX_FRAME ||
            ev.header.source != 0)
            abort(); /* only application frames within the limit reach the caller */
        uint64_t left = ev.header.length;
        if (style == 2 || (style == 1 && left > (256u << 10))) {
            (void)dp_transport_skip_payload(s->t, 0, &err);
        } else if (style != 3) {
            size_t step = style == 0 ? (64u << 10) : piece;
            while (left > 0) {
                size_t n = left < step ? (size_t)left : step;
                if (dp_transport_recv_payload(s->t, 0, rbuf, n, &err) != 0)
                    break;
                left -= n;
            }
        }
    }
    if (!lost)
        abort();
    shutdown(fd, SHUT_RDWR); /* wakes the writer if the transport stopped reading */
    pthread_join(thr, NULL);
    struct linger lg = {1, 0}; /* reset, so no TIME_WAIT piles up over millions of runs */
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd);
    return 0;
}
