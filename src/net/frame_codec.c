/* The chunked frame codec (frame_codec.h): one send path and one receive
 * path for CRC and keyed frames over any byte stream. */
#include "frame_codec.h"

#include "downpour/crc32c.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Liveness stamps need milliseconds, not nanoseconds: the coarse clock
 * costs a few ns where the precise one costs ~25 on every frame. */
static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

#define ADD(field, n) atomic_fetch_add_explicit(&c->st->field, (n), memory_order_relaxed)

int dp_codec_init(dp_codec *c, int keyed, int encrypt, uint64_t max_frame, uint32_t peer,
                  const char *name, dp_codec_stats *st, dp_err *err)
{
    memset(c, 0, sizeof *c);
    c->keyed = keyed;
    c->max_frame = max_frame;
    c->peer = peer;
    c->name = name;
    c->st = st;
    /* Keyed codecs hold one chunk for partial reads, one piece for
     * encrypting, and their EVP contexts (fmac.h). */
    if (!(c->rbuf = malloc(DP_CODEC_RBUF)) ||
        (keyed && ((encrypt && !(c->sbuf = malloc(DP_CODEC_SEND_PIECE))) ||
                   !(c->cbuf = malloc(DP_FRAME_CHUNK)) || dp_fmac_alloc(&c->tx) ||
                   dp_fmac_alloc(&c->rx))))
        return dp_errf(err, "out of memory");
    return 0;
}

void dp_codec_free(dp_codec *c)
{
    free(c->rbuf);
    free(c->sbuf);
    free(c->cbuf);
    c->rbuf = c->sbuf = c->cbuf = NULL;
    dp_fmac_free(&c->tx);
    dp_fmac_free(&c->rx);
}

void dp_codec_key(dp_codec *c, int suite, const unsigned char *key_tx, const unsigned char *key_rx,
                  int enc, uint64_t seq0)
{
    c->enc = enc;
    if (c->keyed) {
        /* The contexts were allocated at init: these cannot run out of memory. */
        (void)dp_fmac_init(&c->tx, suite, key_tx, 0);
        (void)dp_fmac_init(&c->rx, suite, key_rx, 1);
    }
    c->tx_seq = c->rx_seq = seq0;
}

void dp_codec_reset_rx(dp_codec *c)
{
    c->rpos = c->rlen = 0;
    c->pay_pending = 0;
    c->pay_left = 0;
    c->wire_left = 0;
    c->cb_pos = c->cb_len = 0;
}

size_t dp_codec_control(int keyed, uint32_t source, unsigned type, dp_fmac *m, uint64_t *seq,
                        uint8_t out[DP_CODEC_HDR_MAC])
{
    dp_frame_header fh = {0};
    fh.type = type;
    fh.source = source;
    dp_frame_encode(out, &fh);
    if (!keyed)
        return DP_FRAME_HEADER_SIZE;
    dp_fmac_tag(m, (*seq)++, DP_FMAC_HEADER, out, DP_FRAME_HEADER_SIZE,
                out + DP_FRAME_HEADER_SIZE);
    return DP_CODEC_HDR_MAC;
}

/* ---- send ---- */

/* Moves up to want bytes of the source iovecs, from cursor (*idx, *off), into
 * out[0..) as pieces; returns the number of pieces and (crc not NULL) the
 * chunk's CRC. */
static int take_chunk(const struct iovec *src, int n, int *idx, size_t *off, size_t want,
                      struct iovec *out, uint32_t *crc)
{
    int k = 0;
    if (crc)
        *crc = 0;
    while (want && *idx < n) {
        size_t avail = src[*idx].iov_len - *off;
        size_t take = avail < want ? avail : want;
        out[k].iov_base = (char *)src[*idx].iov_base + *off;
        out[k].iov_len = take;
        if (crc)
            *crc = dp_crc32c(*crc, out[k].iov_base, take);
        k++;
        want -= take;
        *off += take;
        if (*off == src[*idx].iov_len) {
            (*idx)++;
            *off = 0;
        }
    }
    return k;
}

/* CRC frames: chunk 0 goes with the header; each later chunk is preceded by
 * its CRC and sent right after it was checksummed, while it is in cache. */
static int send_crc(dp_stream *s, dp_frame_header *h, const struct iovec *src, int ns,
                    uint64_t len, dp_err *err)
{
    struct iovec v[DP_CODEC_MAX_IOV + 1];
    uint8_t hb[DP_FRAME_HEADER_SIZE], crcb[4];
    int idx = 0;
    size_t off = 0;
    uint64_t left = len;
    size_t want = left < DP_FRAME_CHUNK ? (size_t)left : (size_t)DP_FRAME_CHUNK;
    int n = 1 + take_chunk(src, ns, &idx, &off, want, v + 1, &h->payload_crc);
    left -= want;
    dp_frame_encode(hb, h);
    v[0].iov_base = hb;
    v[0].iov_len = sizeof hb;
    /* A small frame goes out as one contiguous buffer: one plain send. */
    uint8_t small[DP_FRAME_HEADER_SIZE + DP_CODEC_SMALL];
    if (len <= DP_CODEC_SMALL && n > 1) {
        memcpy(small, hb, sizeof hb);
        size_t at = sizeof hb;
        for (int i = 1; i < n; i++) {
            memcpy(small + at, v[i].iov_base, v[i].iov_len);
            at += v[i].iov_len;
        }
        v[0].iov_base = small;
        v[0].iov_len = at;
        n = 1;
    }
    if (dp_stream_writev(s, v, n, err))
        return -1;
    while (left) {
        uint32_t crc;
        want = left < DP_FRAME_CHUNK ? (size_t)left : (size_t)DP_FRAME_CHUNK;
        n = 1 + take_chunk(src, ns, &idx, &off, want, v + 1, &crc);
        left -= want;
        dp_put_u32(crcb, crc);
        v[0].iov_base = crcb;
        v[0].iov_len = sizeof crcb;
        if (dp_stream_writev(s, v, n, err))
            return -1;
    }
    return 0;
}

/* Keyed frames: header | htag | chunk 0 | tag 0 | chunk 1 | tag 1 ...
 * A chunk is tagged and sent in SEND_PIECE pieces, each hashed (or
 * encrypted into c->sbuf) right before its write, so the first bytes leave
 * at once and the hashing overlaps the receiver's; the tag rides with the
 * chunk's last piece, the header with the first.  A small chunk in one
 * piece gets the one-shot tag. */
static int send_keyed(dp_codec *c, dp_stream *s, dp_frame_header *h, const struct iovec *src,
                      int ns, uint64_t len, dp_err *err)
{
    uint8_t pre[DP_CODEC_HDR_MAC + DP_CODEC_SMALL + DP_FRAME_TAG_SIZE];
    uint8_t tag[DP_FRAME_TAG_SIZE];
    struct iovec v[DP_CODEC_MAX_IOV + 2];
    uint64_t seq = c->tx_seq++, left = len;
    h->payload_crc = 0;
    dp_frame_encode(pre, h);
    dp_fmac_tag(&c->tx, seq, DP_FMAC_HEADER, pre, DP_FRAME_HEADER_SIZE, pre + DP_FRAME_HEADER_SIZE);
    size_t plen = DP_CODEC_HDR_MAC;
    if (len <= DP_CODEC_SMALL) { /* one contiguous buffer: one plain send */
        uint8_t *p = pre + plen;
        for (int i = 0; i < ns; i++) {
            memcpy(pre + plen, src[i].iov_base, src[i].iov_len);
            plen += src[i].iov_len;
        }
        if (len && c->enc) {
            dp_fmac_begin(&c->tx, seq, 0);
            dp_fmac_crypt(&c->tx, p, p, (size_t)len);
            dp_fmac_end_tag(&c->tx, pre + plen);
            plen += DP_FRAME_TAG_SIZE;
        } else if (len) {
            dp_fmac_tag(&c->tx, seq, 0, p, (size_t)len, pre + plen);
            plen += DP_FRAME_TAG_SIZE;
        }
        v[0].iov_base = pre;
        v[0].iov_len = plen;
        return dp_stream_writev(s, v, 1, err);
    }
    int idx = 0, head = 1; /* the header is still to go, with the first piece */
    size_t off = 0;
    for (uint32_t k = 0; left; k++) {
        size_t cleft = left < DP_FRAME_CHUNK ? (size_t)left : (size_t)DP_FRAME_CHUNK;
        left -= cleft;
        int oneshot = !c->enc && cleft <= DP_CODEC_ONESHOT;
        if (!oneshot)
            dp_fmac_begin(&c->tx, seq, k);
        while (cleft) {
            size_t want = cleft < DP_CODEC_SEND_PIECE ? cleft : DP_CODEC_SEND_PIECE;
            int n0 = head, n = head;
            if (head) {
                v[0].iov_base = pre;
                v[0].iov_len = plen;
            }
            n += take_chunk(src, ns, &idx, &off, want, v + n0, NULL);
            cleft -= want;
            if (oneshot && n - n0 == 1) {
                dp_fmac_tag(&c->tx, seq, k, v[n0].iov_base, want, tag);
            } else {
                if (oneshot) /* gathered from several pieces: stream them */
                    dp_fmac_begin(&c->tx, seq, k);
                size_t at = 0;
                for (int i = n0; i < n; i++) {
                    if (c->enc) {
                        dp_fmac_crypt(&c->tx, c->sbuf + at, v[i].iov_base, v[i].iov_len);
                        at += v[i].iov_len;
                    } else {
                        dp_fmac_ad(&c->tx, v[i].iov_base, v[i].iov_len);
                    }
                }
                if (c->enc) {
                    v[n0].iov_base = c->sbuf;
                    v[n0].iov_len = want;
                    n = n0 + 1;
                }
                if (!cleft)
                    dp_fmac_end_tag(&c->tx, tag);
            }
            if (!cleft) {
                v[n].iov_base = tag;
                v[n].iov_len = sizeof tag;
                n++;
            }
            if (dp_stream_writev(s, v, n, err))
                return -1;
            head = 0;
        }
    }
    return 0;
}

int dp_codec_send(dp_codec *c, dp_stream *s, uint32_t source, dp_frame_header *h,
                  const struct iovec *src, int ns, uint64_t len, dp_err *err)
{
    if (ns < 0 || ns > DP_CODEC_MAX_IOV)
        return dp_errf(err, "%d payload pieces (at most %d)", ns, DP_CODEC_MAX_IOV);
    if (len > c->max_frame)
        return dp_errf(err, "frame of %" PRIu64 " bytes is larger than the maximum %" PRIu64,
                       len, c->max_frame);
    h->source = source;
    h->length = len;
    if (len > DP_FRAME_CHUNK)
        h->flags |= DP_FRAME_F_CHUNKED;
    if (c->keyed ? send_keyed(c, s, h, src, ns, len, err) : send_crc(s, h, src, ns, len, err))
        return -1;
    ADD(frames_sent, 1);
    ADD(bytes_sent, c->keyed ? dp_frame_wire_size_mac(len) : dp_frame_wire_size(len));
    atomic_store(&c->st->last_tx_us, now_us());
    return 0;
}

/* ---- receive ---- */

enum { RX_MORE = -1 }; /* parse_header: a header's tag is still on its way */

/* Parses the buffered header at rpos.  Heartbeats are consumed (NONE). */
static int parse_header(dp_codec *c, dp_frame_header *out, dp_err *why)
{
    dp_frame_header h;
    char what[200];
    const uint8_t *hb = c->rbuf + c->rpos;
    dp_frame_status st = dp_frame_decode(&h, hb, c->max_frame, what, sizeof what);
    if (st != DP_FRAME_OK || h.source != c->peer) {
        c->rpos += DP_FRAME_HEADER_SIZE;
        ADD(bytes_recv, DP_FRAME_HEADER_SIZE);
        if (st != DP_FRAME_OK)
            dp_errf(why, "bad frame header: %s", what);
        else
            dp_errf(why, "frame claims to come from rank %u", h.source);
        return DP_CODEC_BAD;
    }
    size_t hl = DP_FRAME_HEADER_SIZE;
    if (c->keyed) { /* nothing of the header counts before its tag matches */
        if (c->rlen - c->rpos < DP_CODEC_HDR_MAC)
            return RX_MORE;
        hl = DP_CODEC_HDR_MAC;
        if (dp_fmac_verify(&c->rx, c->rx_seq, DP_FMAC_HEADER, hb, DP_FRAME_HEADER_SIZE,
                           hb + DP_FRAME_HEADER_SIZE) != 0) {
            c->rpos += hl;
            ADD(bytes_recv, hl);
            dp_errf(why, "frame %" PRIu64 " from %s failed authentication: altered or "
                         "replayed (its header)",
                    c->rx_seq, c->name);
            return DP_CODEC_TAMPERED;
        }
        c->pay_seq = c->rx_seq++;
    }
    c->rpos += hl;
    ADD(bytes_recv, hl);
    ADD(frames_recv, 1);
    if (h.type == DP_FRAME_HEARTBEAT && h.length == 0) {
        ADD(hb_recv, 1);
        return DP_CODEC_NONE;
    }
    if (h.type == DP_FRAME_BYE && h.length == 0)
        return DP_CODEC_BYE;
    if (h.type < DP_FRAME_APP_FIRST) {
        dp_errf(why, "unexpected %s frame (%" PRIu64 " payload bytes) after the handshake",
                dp_frame_type_name(h.type), h.length);
        return DP_CODEC_BAD;
    }
    if (h.length == 0 && h.payload_crc != 0) {
        dp_errf(why, "empty %s frame with payload CRC 0x%08" PRIx32, dp_frame_type_name(h.type),
                h.payload_crc);
        return DP_CODEC_BAD;
    }
    if (c->keyed && h.payload_crc != 0) { /* one encoding per frame: tags, no CRCs */
        dp_errf(why, "%s frame with payload CRC 0x%08" PRIx32 " on an authenticated "
                     "connection (tags replace CRCs there)",
                dp_frame_type_name(h.type), h.payload_crc);
        return DP_CODEC_BAD;
    }
    c->pay_pending = h.length > 0;
    c->pay_left = h.length;
    c->wire_left = h.length;
    c->cb_pos = c->cb_len = 0;
    c->chunk_left = h.length < DP_FRAME_CHUNK ? h.length : DP_FRAME_CHUNK;
    c->pay_crc = 0;
    c->chunk_crc = h.payload_crc;
    c->chunk_no = 0;
    c->pay_h = h;
    *out = h;
    return DP_CODEC_FRAME;
}

/* Reads what the stream has into the read-ahead buffer (wait: up to one
 * slice).  1 (got bytes), NONE, or END with why. */
static int fill(dp_codec *c, dp_stream *s, int wait, dp_err *why)
{
    if (c->rpos > 0) {
        memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
        c->rlen -= c->rpos;
        c->rpos = 0;
    }
    dp_err e;
    ssize_t n = dp_stream_read(s, c->rbuf + c->rlen, DP_CODEC_RBUF - c->rlen, wait, &e);
    if (n > 0) {
        c->rlen += (size_t)n;
        atomic_store(&c->st->last_rx_us, now_us());
        return 1;
    }
    if (n == DP_STREAM_NONE)
        return DP_CODEC_NONE;
    if (n == DP_STREAM_EOF && c->rlen)
        dp_errf(why, "connection closed mid-frame (%zu of %d header%s bytes)", c->rlen,
                c->rlen < DP_FRAME_HEADER_SIZE ? DP_FRAME_HEADER_SIZE : DP_CODEC_HDR_MAC,
                c->rlen < DP_FRAME_HEADER_SIZE ? "" : " and tag");
    else if (n == DP_STREAM_EOF)
        dp_errf(why, "connection closed (EOF) without BYE");
    else
        dp_errf(why, "%s", e.msg);
    return DP_CODEC_END;
}

int dp_codec_next(dp_codec *c, dp_stream *s, int wait, dp_frame_header *h, dp_err *why)
{
    for (;;) {
        while (c->rlen - c->rpos >= DP_FRAME_HEADER_SIZE) {
            int r = parse_header(c, h, why);
            if (r == RX_MORE)
                break;
            if (r != DP_CODEC_NONE)
                return r;
        }
        int r = fill(c, s, wait, why);
        if (r != 1)
            return r;
        wait = 0;
    }
}

/* Up to want (> 0) bytes from the read-ahead buffer or, when it is empty,
 * with one read, waiting while the peer is alive.  The count, or -1 (END,
 * why filled). */
static ssize_t read_some(dp_codec *c, dp_stream *s, uint8_t *dst, size_t want, dp_err *why)
{
    size_t have = c->rlen - c->rpos;
    if (have) {
        size_t take = have < want ? have : want;
        memcpy(dst, c->rbuf + c->rpos, take);
        c->rpos += take;
        return (ssize_t)take;
    }
    for (;;) {
        dp_err e;
        ssize_t n = dp_stream_read(s, dst, want, 1, &e); /* blocks up to a slice */
        if (n > 0) {
            atomic_store(&c->st->last_rx_us, now_us());
            return n;
        }
        if (n == DP_STREAM_NONE) {
            double silent;
            if (!dp_stream_stalled(s, &silent))
                continue;
            dp_errf(why, "silent for %.1f s in the middle of %s frame (%" PRIu64 " bytes missing)",
                    silent, dp_frame_type_name(c->pay_h.type), c->pay_left);
        } else if (n == DP_STREAM_EOF) {
            /* Keyed, pay_left counts bytes not yet checked: the chunk under
             * way may have arrived in part. */
            dp_errf(why, "connection closed mid-frame: %" PRIu64 " of %" PRIu64
                         " payload bytes missing%s",
                    c->pay_left, c->pay_h.length, c->keyed ? " or not yet authenticated" : "");
        } else {
            dp_errf(why, "reading a payload: %s", e.msg);
        }
        return -1;
    }
}

/* Exactly len bytes of a payload's framing (a chunk's CRC, a tag), counted
 * as received.  -1: the stream failed (why). */
static int read_exact(dp_codec *c, dp_stream *s, uint8_t *dst, size_t len, dp_err *why)
{
    for (size_t got = 0; got < len;) {
        ssize_t n = read_some(c, s, dst + got, len - got, why);
        if (n < 0)
            return -1;
        got += (size_t)n;
    }
    ADD(bytes_recv, len);
    return 0;
}

/* CRC payloads: each chunk's CRC is checked as its last byte arrives. */
static int read_crc(dp_codec *c, dp_stream *s, uint8_t *dst, size_t len, dp_err *why)
{
    uint8_t sink[DP_CODEC_RECV_CHUNK];
    while (len) {
        if (c->chunk_left == 0) { /* the next chunk's CRC comes first */
            uint8_t b[4];
            if (read_exact(c, s, b, sizeof b, why) < 0)
                return DP_CODEC_END;
            c->chunk_crc = dp_get_u32(b);
            c->chunk_left = c->pay_left < DP_FRAME_CHUNK ? c->pay_left : DP_FRAME_CHUNK;
            c->pay_crc = 0;
            c->chunk_no++;
        }
        size_t want = len < DP_CODEC_RECV_CHUNK ? len : DP_CODEC_RECV_CHUNK;
        if (want > c->chunk_left)
            want = (size_t)c->chunk_left;
        uint8_t *p = dst ? dst : sink;
        ssize_t n = read_some(c, s, p, want, why);
        if (n < 0)
            return DP_CODEC_END;
        c->pay_crc = dp_crc32c(c->pay_crc, p, (size_t)n);
        c->pay_left -= (uint64_t)n;
        c->chunk_left -= (uint64_t)n;
        len -= (size_t)n;
        if (dst)
            dst += n;
        ADD(bytes_recv, (uint64_t)n);
        if (c->chunk_left == 0 && c->pay_crc != c->chunk_crc) {
            dp_errf(why, "payload CRC mismatch on %s frame (step %" PRIu64 ", offset %" PRIu64
                         ", %" PRIu64 " bytes, chunk %" PRIu64 "): got 0x%08" PRIx32
                         ", expected 0x%08" PRIx32,
                    dp_frame_type_name(c->pay_h.type), c->pay_h.step, c->pay_h.offset,
                    c->pay_h.length, c->chunk_no, c->pay_crc, c->chunk_crc);
            return DP_CODEC_BAD;
        }
    }
    return 0;
}

/* Keyed payloads: chunk | tag, no CRCs.  A chunk is handed out only after
 * its tag (behind it) matched: read straight into dst when this call takes
 * the whole chunk (the call fails if the tag does not match, so the caller
 * never takes those bytes as valid), else into c->cbuf, from which this and
 * later calls copy. */
static int read_keyed(dp_codec *c, dp_stream *s, uint8_t *dst, size_t len, dp_err *why)
{
    while (len) {
        if (c->cb_pos < c->cb_len) {
            size_t n = c->cb_len - c->cb_pos < len ? c->cb_len - c->cb_pos : len;
            if (dst) {
                memcpy(dst, c->cbuf + c->cb_pos, n);
                dst += n;
            }
            c->cb_pos += n;
            c->pay_left -= n;
            len -= n;
            continue;
        }
        uint32_t k = (uint32_t)c->chunk_no;
        size_t csize = c->wire_left < DP_FRAME_CHUNK ? (size_t)c->wire_left : (size_t)DP_FRAME_CHUNK;
        int direct = dst && len >= csize;
        uint8_t *p = direct ? dst : c->cbuf;
        /* Each piece is hashed (decrypted) right after the read that brought
         * it in, while it is in L1. */
        int oneshot = !c->enc && csize <= DP_CODEC_ONESHOT;
        if (!oneshot)
            dp_fmac_begin(&c->rx, c->pay_seq, k);
        for (size_t got = 0; got < csize;) {
            size_t want = csize - got < DP_CODEC_RECV_CHUNK ? csize - got : DP_CODEC_RECV_CHUNK;
            ssize_t n = read_some(c, s, p + got, want, why);
            if (n < 0)
                return DP_CODEC_END;
            if (c->enc)
                dp_fmac_crypt(&c->rx, p + got, p + got, (size_t)n);
            else if (!oneshot)
                dp_fmac_ad(&c->rx, p + got, (size_t)n);
            got += (size_t)n;
            ADD(bytes_recv, (uint64_t)n);
        }
        uint8_t tag[DP_FRAME_TAG_SIZE];
        if (read_exact(c, s, tag, sizeof tag, why) < 0)
            return DP_CODEC_END;
        c->wire_left -= csize;
        c->chunk_no++;
        int bad = oneshot ? dp_fmac_verify(&c->rx, c->pay_seq, k, p, csize, tag)
                          : dp_fmac_end_verify(&c->rx, tag);
        if (bad) {
            dp_errf(why, "frame %" PRIu64 " from %s failed authentication: altered or "
                         "replayed (%s frame, chunk %" PRIu32 ")",
                    c->pay_seq, c->name, dp_frame_type_name(c->pay_h.type), k);
            return DP_CODEC_TAMPERED;
        }
        if (direct) {
            dst += csize;
            len -= csize;
            c->pay_left -= csize;
        } else {
            c->cb_pos = 0;
            c->cb_len = csize;
        }
    }
    return 0;
}

int dp_codec_read(dp_codec *c, dp_stream *s, uint8_t *dst, size_t len, dp_err *why)
{
    if (len == 0)
        return 0;
    if (!c->pay_pending || len > c->pay_left) {
        dp_errf(why, "reading %zu payload bytes with %" PRIu64 " pending", len,
                c->pay_pending ? c->pay_left : 0);
        return DP_CODEC_BAD;
    }
    int r = c->keyed ? read_keyed(c, s, dst, len, why) : read_crc(c, s, dst, len, why);
    if (r != 0 || c->pay_left == 0)
        c->pay_pending = 0;
    return r;
}
