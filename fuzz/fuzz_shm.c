/* libFuzzer target for the shared-memory rings (src/net/shm.c): the harness
 * plays the peer, so everything the peer may write is fuzz bytes: its write
 * position in our receive ring, the frames (headers, lengths, payloads,
 * padding) and raw bytes it publishes there, its read position in our send
 * ring, and any word of the control area.  The link is dp_shm_test_open's, on
 * a heap segment, so a read or write outside a ring is a sanitizer finding.
 * The receiver takes headers (dp_shm_next), payloads in pieces (copied,
 * added as floats, dropped), sends frames of its own, and moves what the
 * peer published into its overflow as a sender waiting for room does
 * (dp_shm_drain), so reads come from both; a refusal must come
 * with its reason, and while the peer has only published well-formed frames
 * the receiver must see exactly those frames and bytes.  The waiter says the
 * peer is gone, so a read or a send that would wait ends the run: never a
 * crash, a read past a ring, a leak or a hang.
 *
 * Input: byte 0 the ring size (64 << (b % 11) bytes: small rings wrap
 * often); byte 1 the largest frame the receiver takes (0: 1 MiB, else b * 97
 * bytes); then one operation per byte (the switch below) and its arguments. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/frame.h"
#include "downpour/log.h"
#include "fuzz_input.h"
#include "net/shm.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define QCAP ((size_t)1 << 20) /* the peer's unsent bytes */
#define MAX_FRAMES 256
#define SOURCE 0u

typedef struct sent {
    uint16_t type;
    uint32_t len, seed;
} sent;

typedef struct peer {
    dp_shm_peer p;
    size_t cap;
    uint64_t tail;      /* its write position, as it keeps it */
    uint8_t *q;         /* what it has yet to publish */
    size_t qlen, qpos;
    sent frames[MAX_FRAMES]; /* well-formed frames queued, oldest first */
    int nf, first;
    int honest;         /* only well-formed frames and true positions so far */
} peer;

static uint64_t get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, sizeof v); }

/* Payload bytes: frame seed's byte i is pat[seed + i] (made once; the
 * harness copies and compares whole runs, so its time goes to the rings). */
static uint8_t *pat;

static int gone(void *ctx, int sending, dp_err *err)
{
    (void)ctx;
    return dp_errf(err, "the peer is gone (fuzz: %s)", sending ? "no room" : "nothing more");
}

static void queue(peer *pr, const void *b, size_t n)
{
    if (n > QCAP - pr->qlen)
        n = QCAP - pr->qlen;
    memcpy(pr->q + pr->qlen, b, n);
    pr->qlen += n;
}

/* A well-formed frame as tcp.c's sender writes it: header (payload CRC 0),
 * payload, zeros to 8 bytes. */
static void queue_frame(peer *pr, uint16_t type, uint32_t len, uint32_t seed)
{
    uint64_t total = DP_FRAME_HEADER_SIZE + (uint64_t)len;
    if (pr->nf == MAX_FRAMES || total + 8 > QCAP - pr->qlen)
        return;
    dp_frame_header h = {0};
    h.type = type;
    h.source = SOURCE;
    h.step = seed;
    h.length = len;
    h.flags = len > DP_FRAME_CHUNK ? DP_FRAME_F_CHUNKED : 0;
    uint8_t hb[DP_FRAME_HEADER_SIZE];
    dp_frame_encode(hb, &h);
    queue(pr, hb, sizeof hb);
    memcpy(pr->q + pr->qlen, pat + seed, len);
    pr->qlen += len;
    static const uint8_t zeros[8];
    queue(pr, zeros, (size_t)(-total & 7));
    pr->frames[(pr->first + pr->nf++) % MAX_FRAMES] = (sent){type, len, seed};
}

/* Publishes up to n queued bytes, as far as the ring has room. */
static void pump(peer *pr, size_t n)
{
    uint64_t head = get64(pr->p.rx_head), used = pr->tail - head;
    size_t room = used > pr->cap ? 0 : pr->cap - (size_t)used;
    if (n > room)
        n = room;
    if (n > pr->qlen - pr->qpos)
        n = pr->qlen - pr->qpos;
    size_t at = (size_t)(pr->tail & (pr->cap - 1)), first = pr->cap - at < n ? pr->cap - at : n;
    memcpy(pr->p.rx_data + at, pr->q + pr->qpos, first);
    memcpy(pr->p.rx_data, pr->q + pr->qpos + first, n - first);
    pr->qpos += n;
    pr->tail += n;
    put64(pr->p.rx_tail, pr->tail);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    static uint8_t *qbuf, *buf, *want;
    if (!quiet) {
        dp_log_set_level(DP_LOG_ERROR);
        qbuf = malloc(QCAP);
        buf = malloc(QCAP);
        want = malloc(QCAP);
        pat = malloc(QCAP + 256);
        if (!qbuf || !buf || !want || !pat)
            abort();
        for (size_t i = 0; i < QCAP + 256; i++)
            pat[i] = (uint8_t)(i * 131 + (i >> 9));
        memset(buf, 0, QCAP);
        quiet = 1;
    }
    if (size < 2 || size > 4096)
        return 0;
    fz_in in = {data, size, 0};
    uint8_t b0 = fz_u8(&in), b1 = fz_u8(&in);
    size_t cap = (size_t)64 << (b0 % 11);
    uint64_t max_len = b1 ? (uint64_t)b1 * 97 : (uint64_t)1 << 20;
    static peer pr;
    memset(&pr, 0, sizeof pr);
    pr.cap = cap;
    pr.q = qbuf;
    pr.honest = 1;
    dp_shm *s = dp_shm_test_open(cap, &pr.p);
    if (!s)
        abort();
    dp_shm_waiter w = {gone, NULL, NULL};
    dp_err err;
    char why[256];
    int cur = 0;       /* the payload being read is a queued frame's, */
    uint32_t cur_seed = 0; /* made from this seed */
    uint64_t at = 0;   /* how far into it */
    int dead = 0, scribbled = 0; /* the control area written at random */

    while (!dead && fz_left(&in)) {
        uint8_t op = fz_u8(&in);
        switch (op % 12) {
        case 0: /* the peer queues a well-formed frame */
        case 1: {
            uint16_t type = (op & 0x10) ? (uint16_t)fz_u8(&in) : (uint16_t)DP_FRAME_APP(op >> 5);
            uint32_t len = fz_u16(&in);
            if (op & 0x20)
                len = (len << 4) | (op >> 6); /* up to 1 MiB */
            queue_frame(&pr, type, len, fz_u8(&in));
            break;
        }
        case 2: { /* raw bytes: any header, length, padding */
            uint8_t raw[64];
            size_t n = 1 + fz_u8(&in) % 64;
            fz_bytes(&in, raw, n);
            queue(&pr, raw, n);
            pr.honest = 0;
            break;
        }
        case 3: /* the peer publishes what fits */
        case 4:
            pump(&pr, op & 0x80 ? (size_t)fz_u16(&in) << 4 : 1 + (size_t)fz_u8(&in));
            break;
        case 5: { /* an impossible (or merely odd) write position */
            static const int64_t d[] = {-1, 1, 0, 64, -((int64_t)1 << 40)};
            uint64_t head = get64(pr.p.rx_head);
            uint8_t k = fz_u8(&in);
            pr.tail = k < 5 ? head + cap + (uint64_t)d[k] : k < 128 ? head + k : ((uint64_t)fz_u32(&in) << 32 | k);
            put64(pr.p.rx_tail, pr.tail);
            pr.honest = 0;
            break;
        }
        case 6: { /* any word of the control area */
            size_t off = fz_u16(&in) % (pr.p.ctl_len - 7);
            put64(pr.p.ctl + off, ((uint64_t)fz_u32(&in) << 32) | fz_u32(&in));
            pr.tail = get64(pr.p.rx_tail);
            pr.honest = 0;
            scribbled = 1;
            break;
        }
        case 7: { /* the next header */
            if (dp_shm_pending(s)) {
                if (dp_shm_recv(s, NULL, (size_t)dp_shm_pending(s), 0, &w, &err)) {
                    if (!err.msg[0])
                        abort();
                    dead = 1;
                    break;
                }
            }
            dp_frame_header h;
            why[0] = '\0';
            int r = dp_shm_next(s, max_len, &h, why, sizeof why);
            if (r < 0) {
                if (!why[0])
                    abort();
                /* Refusing a well-formed frame is a bug, unless it is too long. */
                if (pr.honest && pr.nf && pr.frames[pr.first].len <= max_len)
                    abort();
                dead = 1;
            } else if (r > 0) {
                if (h.length > max_len || dp_shm_pending(s) != h.length)
                    abort();
                if (pr.honest) {
                    if (!pr.nf)
                        abort();
                    sent f = pr.frames[pr.first];
                    if (h.type != f.type || h.length != f.len || h.step != f.seed ||
                        h.source != SOURCE)
                        abort();
                    cur = 1;
                    cur_seed = f.seed;
                    pr.first = (pr.first + 1) % MAX_FRAMES;
                    pr.nf--;
                }
                at = 0;
            } else if (pr.honest && pr.nf && pr.tail - get64(pr.p.rx_head) >=
                                                       DP_FRAME_HEADER_SIZE + 8) {
                abort(); /* a whole header (and its padding) was there */
            }
            break;
        }
        case 8: { /* payload: copied (0), added (1) or dropped (2) */
            uint64_t pend = dp_shm_pending(s);
            int mode = (op >> 4) % 3;
            size_t n = 1 + fz_u16(&in) % (op & 0x40 ? QCAP : 4096);
            if (n > pend)
                n = (size_t)pend;
            if (mode == 1)
                n -= n % 4;
            if (n == 0)
                break;
            memset(buf, 0, n);
            if (dp_shm_recv(s, mode == 2 ? NULL : buf, n, mode == 1, &w, &err)) {
                if (!err.msg[0])
                    abort();
                dead = 1;
                break;
            }
            if (dp_shm_pending(s) != pend - n)
                abort();
            if (pr.honest && cur && mode != 2) {
                memcpy(want, pat + cur_seed + at, n);
                if (mode == 1) /* the same sum, bit for bit */
                    for (size_t k = 0; k < n; k += 4) {
                        float v, z = 0;
                        memcpy(&v, want + k, 4);
                        z += v;
                        memcpy(want + k, &z, 4);
                    }
                if (memcmp(buf, want, n) != 0)
                    abort();
            }
            at += n;
            break;
        }
        case 9: { /* our side sends a frame, in up to three pieces */
            uint8_t hb[DP_FRAME_HEADER_SIZE];
            dp_frame_header h = {0};
            h.type = DP_FRAME_APP(1);
            h.length = fz_u16(&in) % (2 * cap + 1);
            dp_frame_encode(hb, &h);
            size_t a = fz_u8(&in) % (h.length + 1), b = fz_u8(&in) % (h.length - a + 1);
            struct iovec iov[3] = {{buf, a}, {buf + a, b}, {buf + a + b, h.length - a - b}};
            uint64_t tail0 = get64(pr.p.tx_tail);
            if (dp_shm_send(s, hb, iov, 3, h.length, &w, &err)) {
                if (!err.msg[0])
                    abort();
                dead = 1;
            } else if (!scribbled && get64(pr.p.tx_tail) - tail0 !=
                       ((DP_FRAME_HEADER_SIZE + h.length + 7) & ~(uint64_t)7)) {
                abort(); /* the whole frame, padded, published */
            }
            break;
        }
        case 10: { /* the peer reads our frames: a true position, or any */
            uint64_t head = get64(pr.p.tx_head), tail = get64(pr.p.tx_tail);
            uint32_t k = fz_u16(&in);
            if (op & 0x80) {
                head += k;
                pr.honest = 0;
            } else {
                head = tail - head < k ? tail : head + k;
            }
            put64(pr.p.tx_head, head);
            break;
        }
        default: { /* what the heartbeat thread asks, or a waiting sender's drain */
            if (op & 0x80)
                dp_shm_drain(s);
            else if (dp_shm_rx_ready(s) > cap + DP_SHM_OVERFLOW_MAX)
                abort();
            break;
        }
        }
    }
    dp_shm_close(s);
    return 0;
}
