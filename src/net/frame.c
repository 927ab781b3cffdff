/* Frame header codec: explicit little-endian byte helpers, bounds checked
 * before anyone allocates from a length. */
#include "downpour/frame.h"

#include "downpour/crc32c.h"

#include <inttypes.h>
#include <stdio.h>

void dp_put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

void dp_put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

void dp_put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

uint16_t dp_get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

uint32_t dp_get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

uint64_t dp_get_u64(const uint8_t *p)
{
    return (uint64_t)dp_get_u32(p) | ((uint64_t)dp_get_u32(p + 4) << 32);
}

enum {
    OFF_MAGIC = 0,
    OFF_VERSION = 4,
    OFF_TYPE = 6,
    OFF_FLAGS = 8,
    OFF_SOURCE = 12,
    OFF_STEP = 16,
    OFF_OFFSET = 24,
    OFF_LENGTH = 32,
    OFF_PAYLOAD_CRC = 40,
    OFF_HEADER_CRC = 44
};

void dp_frame_encode(uint8_t out[DP_FRAME_HEADER_SIZE], const dp_frame_header *h)
{
    dp_put_u32(out + OFF_MAGIC, DP_FRAME_MAGIC);
    dp_put_u16(out + OFF_VERSION, DP_FRAME_VERSION);
    dp_put_u16(out + OFF_TYPE, h->type);
    dp_put_u32(out + OFF_FLAGS, h->flags);
    dp_put_u32(out + OFF_SOURCE, h->source);
    dp_put_u64(out + OFF_STEP, h->step);
    dp_put_u64(out + OFF_OFFSET, h->offset);
    dp_put_u64(out + OFF_LENGTH, h->length);
    dp_put_u32(out + OFF_PAYLOAD_CRC, h->payload_crc);
    dp_put_u32(out + OFF_HEADER_CRC, dp_crc32c(0, out, OFF_HEADER_CRC));
}

#define WHY(...) (why ? (void)snprintf(why, why_cap, __VA_ARGS__) : (void)0)

dp_frame_status dp_frame_decode(dp_frame_header *h, const uint8_t in[DP_FRAME_HEADER_SIZE],
                                uint64_t max_len, char *why, size_t why_cap)
{
    if (why && why_cap)
        why[0] = '\0';
    uint32_t magic = dp_get_u32(in + OFF_MAGIC);
    if (magic != DP_FRAME_MAGIC) {
        WHY("bad magic 0x%08" PRIx32 " (expected 0x%08x \"DPWF\"): not a downpour peer or a "
            "corrupt stream",
            magic, DP_FRAME_MAGIC);
        return DP_FRAME_BAD_MAGIC;
    }
    h->version = dp_get_u16(in + OFF_VERSION);
    if (h->version != DP_FRAME_VERSION) {
        WHY("peer speaks protocol version %u, this build speaks %u: run the same downpour "
            "version on every task",
            (unsigned)h->version, DP_FRAME_VERSION);
        return DP_FRAME_BAD_VERSION;
    }
    uint32_t want = dp_get_u32(in + OFF_HEADER_CRC), got = dp_crc32c(0, in, OFF_HEADER_CRC);
    if (want != got) {
        WHY("header CRC 0x%08" PRIx32 " does not match its contents (0x%08" PRIx32 ")", want, got);
        return DP_FRAME_BAD_HEADER_CRC;
    }
    h->type = dp_get_u16(in + OFF_TYPE);
    h->flags = dp_get_u32(in + OFF_FLAGS);
    h->source = dp_get_u32(in + OFF_SOURCE);
    h->step = dp_get_u64(in + OFF_STEP);
    h->offset = dp_get_u64(in + OFF_OFFSET);
    h->length = dp_get_u64(in + OFF_LENGTH);
    h->payload_crc = dp_get_u32(in + OFF_PAYLOAD_CRC);
    if (h->type >= DP_FRAME_COUNT) {
        WHY("frame type %u is out of range (< %d)", (unsigned)h->type, DP_FRAME_COUNT);
        return DP_FRAME_BAD_TYPE;
    }
    if (h->flags & ~(DP_FRAME_FLAGS_APP | DP_FRAME_F_CHUNKED)) {
        WHY("reserved flag bits set (flags 0x%08" PRIx32 ")", h->flags);
        return DP_FRAME_BAD_FLAGS;
    }
    if (h->length > max_len) {
        WHY("payload length %" PRIu64 " exceeds the maximum frame size %" PRIu64, h->length,
            max_len);
        return DP_FRAME_TOO_LONG;
    }
    if (!(h->flags & DP_FRAME_F_CHUNKED) != !(h->length > DP_FRAME_CHUNK)) {
        WHY("chunked flag %s on a %" PRIu64 "-byte payload (payloads over %" PRIu64
            " bytes, and only those, are chunked)",
            (h->flags & DP_FRAME_F_CHUNKED) ? "set" : "missing", h->length, DP_FRAME_CHUNK);
        return DP_FRAME_BAD_FLAGS;
    }
    return DP_FRAME_OK;
}

int dp_frame_check_payload(const dp_frame_header *h, const void *payload, size_t len)
{
    if ((uint64_t)len != h->length)
        return -1;
    size_t first = len > DP_FRAME_CHUNK ? (size_t)DP_FRAME_CHUNK : len;
    return dp_crc32c(0, payload, first) == h->payload_crc ? 0 : -1;
}

uint64_t dp_frame_wire_size(uint64_t length)
{
    uint64_t chunks = (length + DP_FRAME_CHUNK - 1) / DP_FRAME_CHUNK;
    return DP_FRAME_HEADER_SIZE + length + (chunks > 1 ? 4 * (chunks - 1) : 0);
}

uint64_t dp_frame_wire_size_mac(uint64_t length)
{
    uint64_t chunks = (length + DP_FRAME_CHUNK - 1) / DP_FRAME_CHUNK;
    return DP_FRAME_HEADER_SIZE + length + DP_FRAME_TAG_SIZE * (1 + chunks);
}

const char *dp_frame_status_name(dp_frame_status s)
{
    static const char *const names[DP_FRAME_STATUS_COUNT] = {
        "ok", "bad magic", "bad version", "bad header CRC", "bad type", "bad flags", "too long"};
    return (unsigned)s < DP_FRAME_STATUS_COUNT ? names[s] : "invalid status";
}

const char *dp_frame_type_name(unsigned type)
{
    static const char *const names[] = {"HELLO", "CHALLENGE", "AUTH", "WELCOME",
                                        "REJECT", "HEARTBEAT", "BYE", "SHM", "SPEC"};
    static _Thread_local char buf[16];
    if (type < sizeof names / sizeof names[0])
        return names[type];
    if (type >= DP_FRAME_APP_FIRST && type < DP_FRAME_COUNT) {
        snprintf(buf, sizeof buf, "APP+%u", type - DP_FRAME_APP_FIRST);
        return buf;
    }
    return type < DP_FRAME_APP_FIRST ? "RESERVED" : "INVALID";
}
