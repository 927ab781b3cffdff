/* Wire frames: a fixed 48-byte little-endian header, then `length` payload
 * bytes.  Every field is written and read by explicit byte helpers, so the
 * format does not depend on the host's endianness or struct padding.
 *
 *   off size field
 *    0   4   magic        "DPWF" (bytes 44 50 57 46)
 *    4   2   version      DP_FRAME_VERSION
 *    6   2   type         dp_frame_type, < DP_FRAME_COUNT
 *    8   4   flags        bits 0-15 for the application; bit 16 DP_FRAME_F_CHUNKED;
 *                         17-31 reserved (zero)
 *   12   4   source       rank of the sending task
 *   16   8   step         step or clock of the sender
 *   24   8   offset       e.g. element offset into the flat parameter vector
 *   32   8   length       payload bytes, <= the receiver's maximum frame size
 *   40   4   payload_crc  CRC32C of the payload, or of its first chunk when chunked
 *                         (0 for an empty payload)
 *   44   4   header_crc   CRC32C of bytes 0..43
 *
 * A payload longer than DP_FRAME_CHUNK (1 MiB) is chunked, and only then:
 * flag DP_FRAME_F_CHUNKED is set and every chunk after the first is preceded
 * on the wire by its own 4-byte little-endian CRC32C:
 *   header | chunk 0 | crc 1 | chunk 1 | crc 2 | chunk 2 ...
 * So a sender checksums 1 MiB, sends it while it is still in cache, and so on:
 * the first byte leaves after one chunk's CRC, not the whole payload's, and
 * the payload is read from memory once.  `length` counts payload bytes only.
 *
 * After an authenticated handshake (a cluster secret) every frame carries
 * 16-byte tags instead of payload CRCs (docs/transport.md, "Frame MAC"): one
 * right after the header, over the header, and one right AFTER each chunk,
 * over that chunk; payload_crc is 0 and no chunk CRCs are sent:
 *   header | htag | chunk 0 | tag 0 | chunk 1 | tag 1 ...
 * With the tag behind its chunk a sender tags and sends a chunk piece by
 * piece, and the first bytes leave at once.  Each tag also covers the frame's
 * sequence number on that connection (counted by both sides, never sent) and
 * the chunk index, so an altered, replayed, reordered or dropped frame is
 * refused.  The header CRC stays: it is checked before the header's tag has
 * arrived.  With encryption the chunks are ciphertext. */
#ifndef DOWNPOUR_FRAME_H
#define DOWNPOUR_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define DP_FRAME_MAGIC 0x46575044u /* "DPWF" read as a little-endian u32 */
#define DP_FRAME_VERSION 3 /* 3: keyed frames carry tags after their chunks, no payload CRCs */
#define DP_FRAME_HEADER_SIZE 48
#define DP_FRAME_TAG_SIZE 16 /* per header and per chunk on an authenticated connection */
#define DP_FRAME_MAX_DEFAULT ((uint64_t)1 << 30) /* 1 GiB */
#define DP_FRAME_FLAGS_APP 0x0000ffffu           /* bits an application may set */
#define DP_FRAME_F_CHUNKED 0x00010000u           /* set by the codec iff length > CHUNK */
#define DP_FRAME_CHUNK ((uint64_t)1 << 20)       /* bytes per payload chunk */

typedef enum dp_frame_type {
    /* Connection handshake (see docs/transport.md). */
    DP_FRAME_HELLO = 0,     /* dialer -> acceptor: ranks and a nonce */
    DP_FRAME_CHALLENGE = 1, /* acceptor -> dialer: its nonce and its proof */
    DP_FRAME_AUTH = 2,      /* dialer -> acceptor: the dialer's proof */
    DP_FRAME_WELCOME = 3,   /* acceptor -> dialer: accepted */
    DP_FRAME_REJECT = 4,    /* either way: refused, payload is the reason text */
    /* Liveness and orderly shutdown, consumed by the transport. */
    DP_FRAME_HEARTBEAT = 5,
    DP_FRAME_BYE = 6,
    /* Shared-memory setup right after WELCOME (docs/transport.md, "Shared
     * memory"): the dialer's offer, the acceptor's answer. */
    DP_FRAME_SHM = 7,
    /* The cluster spec, to a dialer that asked for it in its HELLO and proved
     * the secret (docs/transport.md, "Asking for the cluster spec"): its
     * length, its bytes in chunks, then its MAC. */
    DP_FRAME_SPEC = 8,
    /* Types from here on are delivered to the application (the strategies). */
    DP_FRAME_APP_FIRST = 16,
    DP_FRAME_COUNT = 256
} dp_frame_type;

/* The n-th application frame type. */
#define DP_FRAME_APP(n) (DP_FRAME_APP_FIRST + (n))

typedef struct dp_frame_header {
    uint16_t version; /* filled by the decoder; the encoder always writes DP_FRAME_VERSION */
    uint16_t type;
    uint32_t flags;
    uint32_t source;
    uint64_t step;
    uint64_t offset;
    uint64_t length;
    uint32_t payload_crc;
} dp_frame_header;

/* Why a header was refused. */
typedef enum dp_frame_status {
    DP_FRAME_OK = 0,
    DP_FRAME_BAD_MAGIC,
    DP_FRAME_BAD_VERSION,
    DP_FRAME_BAD_HEADER_CRC,
    DP_FRAME_BAD_TYPE,
    DP_FRAME_BAD_FLAGS,
    DP_FRAME_TOO_LONG,
    DP_FRAME_STATUS_COUNT
} dp_frame_status;

/* Writes the header (magic, version and header CRC included) into out.
 * Does not validate: a test can encode a bad type on purpose. */
void dp_frame_encode(uint8_t out[DP_FRAME_HEADER_SIZE], const dp_frame_header *h);

/* Parses and validates a header in this order: magic, version, header CRC,
 * type, reserved flags, length <= max_len, chunked flag == (length > CHUNK).  Returns DP_FRAME_OK or the first
 * failure; why (may be NULL) receives a sentence such as
 * "payload length 2147483648 exceeds the maximum frame size 1073741824".
 * Never allocates; length is checked before anyone sizes a buffer from it. */
dp_frame_status dp_frame_decode(dp_frame_header *h, const uint8_t in[DP_FRAME_HEADER_SIZE],
                                uint64_t max_len, char *why, size_t why_cap);

/* 0 when the payload's length and CRC32C (of its first chunk, when chunked)
 * match the header, else -1.  For a payload held in memory, without the
 * per-chunk CRCs of the wire. */
int dp_frame_check_payload(const dp_frame_header *h, const void *payload, size_t len);

/* Bytes the frame occupies on the wire: header, payload and chunk CRCs. */
uint64_t dp_frame_wire_size(uint64_t length);
/* The same on an authenticated connection: header, its tag, payload and one
 * tag per chunk (no CRCs). */
uint64_t dp_frame_wire_size_mac(uint64_t length);

const char *dp_frame_status_name(dp_frame_status s);
/* "HELLO", "HEARTBEAT", ..., "APP+3" or "INVALID". */
const char *dp_frame_type_name(unsigned type);

/* Little-endian field helpers, shared with the handshake payloads. */
void dp_put_u16(uint8_t *p, uint16_t v);
void dp_put_u32(uint8_t *p, uint32_t v);
void dp_put_u64(uint8_t *p, uint64_t v);
uint16_t dp_get_u16(const uint8_t *p);
uint32_t dp_get_u32(const uint8_t *p);
uint64_t dp_get_u64(const uint8_t *p);

#endif
