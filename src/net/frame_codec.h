/* The chunked frame codec: frames (frame.h's header, then the payload in
 * DP_FRAME_CHUNK chunks) written to and read from any byte stream
 * (stream.h).  One codec, two options fixed per connection:
 *   CRC    header | chunk 0 | CRC 1 | chunk 1 ...   (payload_crc = CRC 0)
 *   keyed  header | htag | chunk 0 | tag 0 | chunk 1 | tag 1 ...  (no CRCs;
 *          tags from fmac.h, payloads optionally encrypted)
 * docs/transport.md has the formats.  The codec knows no connection: what it
 * needs of one (is the peer silent?) it asks the stream, and failures come
 * back as a kind and a sentence for the connection manager to act on. */
#ifndef DOWNPOUR_NET_FRAME_CODEC_H
#define DOWNPOUR_NET_FRAME_CODEC_H

#include "downpour/frame.h"
#include "downpour/status.h"
#include "fmac.h"
#include "stream.h"

#include <stdatomic.h>
#include <stdint.h>

#define DP_CODEC_HDR_MAC (DP_FRAME_HEADER_SIZE + DP_FRAME_TAG_SIZE) /* header and its tag */
#define DP_CODEC_RBUF (64 * 1024) /* read-ahead buffer: headers and small payloads in one read */
#define DP_CODEC_RECV_CHUNK (8 * 1024) /* payload read size: 8 KiB reads keep the kernel's copy and the CRC in L1 (measured best of 8..1024 KiB) */
#define DP_CODEC_SMALL 512 /* payloads up to this are copied next to the header: one plain send */
/* A keyed sender tags (or encrypts) and writes a chunk in pieces of this
 * size, each while it is in cache; up to DP_CODEC_ONESHOT bytes in one piece
 * take libsodium's one-shot tag, which starts faster than OpenSSL's (fmac.h).
 * A whole chunk per write costs less CPU on loopback but holds a frame's
 * first byte back on a network (docs/transport.md, "Piece size"). */
#ifndef DP_CODEC_SEND_PIECE
#define DP_CODEC_SEND_PIECE (64 * 1024)
#endif
#define DP_CODEC_ONESHOT 4096
#define DP_CODEC_MAX_IOV 64 /* source pieces of one frame (at least DP_TRANSPORT_MAX_IOV) */

/* Counters and liveness stamps of one connection; the codec adds what it
 * moves, the connection manager reads them (and adds its own frames). */
typedef struct dp_codec_stats {
    _Atomic int64_t last_rx_us, last_tx_us;
    _Atomic uint64_t bytes_sent, bytes_recv, frames_sent, frames_recv, hb_sent, hb_recv;
} dp_codec_stats;

/* What dp_codec_next and dp_codec_read return. */
enum {
    DP_CODEC_NONE = 0,  /* no whole header yet (next), or done (read) */
    DP_CODEC_FRAME,     /* next: an application frame; its payload is pending */
    DP_CODEC_BYE,       /* next: the peer said goodbye (orderly end) */
    DP_CODEC_END,       /* the stream ended or failed (why) */
    DP_CODEC_BAD,       /* a frame broke the format or its CRC (why) */
    DP_CODEC_TAMPERED,  /* a frame failed authentication (why) */
};

typedef struct dp_codec {
    /* Fixed at init. */
    int keyed;          /* tags instead of CRCs */
    uint64_t max_frame; /* longest payload accepted, checked before any sizing */
    uint32_t peer;      /* the source every header must name */
    const char *name;   /* the peer's, for the reasons */
    dp_codec_stats *st;
    /* Fixed while a connection is up (dp_codec_key). */
    int enc;           /* payloads encrypted */
    dp_fmac tx, rx;    /* tx: sending side; rx: receiving side */
    /* Sending side (the caller sends one frame at a time). */
    uint64_t tx_seq;
    uint8_t *sbuf; /* one piece encrypted (encrypting codecs only) */
    /* Receiving side (one thread). */
    uint64_t rx_seq;
    uint8_t *rbuf;
    size_t rpos, rlen;
    int pay_pending;
    uint64_t pay_left;   /* payload bytes still to hand out */
    uint64_t chunk_left; /* CRC: bytes left in the current chunk; 0 before a chunk CRC */
    uint32_t pay_crc;    /* CRC: running CRC of the current chunk */
    uint32_t chunk_crc;  /* CRC: what it must come to */
    uint64_t chunk_no;
    dp_frame_header pay_h;
    uint64_t pay_seq;   /* keyed: the pending payload's frame */
    uint64_t wire_left; /* keyed: payload bytes not yet read from the stream */
    uint8_t *cbuf;      /* keyed: one verified chunk not yet handed out */
    size_t cb_pos, cb_len;
} dp_codec;

/* Allocates the buffers (and, keyed, the fmac contexts; sbuf only with
 * encrypt).  0, or -1 with err (out of memory).  Free with dp_codec_free. */
int dp_codec_init(dp_codec *c, int keyed, int encrypt, uint64_t max_frame, uint32_t peer,
                  const char *name, dp_codec_stats *st, dp_err *err);
void dp_codec_free(dp_codec *c);
/* A new connection: its keys (keyed; from the handshake), payload
 * encryption and the first sequence number of both directions. */
void dp_codec_key(dp_codec *c, int suite, const unsigned char *key_tx, const unsigned char *key_rx,
                  int enc, uint64_t seq0);
/* Received bytes not yet parsed (a header may be among them). */
static inline size_t dp_codec_buffered(const dp_codec *c) { return c->rlen - c->rpos; }
/* Forgets the receive state of a connection that ended. */
void dp_codec_reset_rx(dp_codec *c);

/* Sends one frame: h's type, flags, step and offset as given; its source,
 * length, chunked flag and payload CRC are set here.  The payload is
 * src[0..ns) (no empty pieces, ns <= DP_CODEC_MAX_IOV), len bytes in all.
 * 0, or -1 with err (the stream failed; the frame may be cut). */
int dp_codec_send(dp_codec *c, dp_stream *s, uint32_t source, dp_frame_header *h,
                  const struct iovec *src, int ns, uint64_t len, dp_err *err);
/* A HEARTBEAT or BYE of source into out, tagged with m's next sequence
 * number (*seq) when keyed; returns its size. */
size_t dp_codec_control(int keyed, uint32_t source, unsigned type, dp_fmac *m, uint64_t *seq,
                        uint8_t out[DP_CODEC_HDR_MAC]);

/* The next application frame's header into h, reading at most once with
 * wait (the stream's slice) and otherwise only what has arrived;
 * heartbeats are consumed.  Returns a DP_CODEC_ kind; END, BAD and TAMPERED
 * fill why. */
int dp_codec_next(dp_codec *c, dp_stream *s, int wait, dp_frame_header *h, dp_err *why);
/* The next len bytes of the pending payload into dst (NULL: discarded),
 * each chunk checked as its last byte arrives (keyed: handed out only after
 * its tag matched).  0, or END, BAD or TAMPERED with why (the payload is
 * then forgotten).  len must not exceed c->pay_left. */
int dp_codec_read(dp_codec *c, dp_stream *s, uint8_t *dst, size_t len, dp_err *why);

#endif
