/* Frame codec: round trip of every field, byte order on the wire, and every
 * bad header field refused with its own reason. */
#include "downpour/crc32c.h"
#include "downpour/frame.h"

#include "check.h"

#include <string.h>

static dp_frame_header sample(void)
{
    dp_frame_header h = {0};
    h.type = DP_FRAME_APP(3);
    h.flags = 0x1234;
    h.source = 7;
    h.step = 0x0102030405060708ull;
    h.offset = 266610ull * 4;
    h.length = 11;
    h.payload_crc = dp_crc32c(0, "hello world", 11);
    return h;
}

static dp_frame_status decode(const uint8_t *b, uint64_t max, char *why)
{
    dp_frame_header h;
    return dp_frame_decode(&h, b, max, why, 256);
}

int main(void)
{
    uint8_t b[DP_FRAME_HEADER_SIZE];
    char why[256];
    dp_frame_header h = sample(), g;
    dp_frame_encode(b, &h);

    /* Little-endian on the wire, at the documented offsets. */
    CHECK(memcmp(b, "DPWF", 4) == 0);
    CHECK(b[4] == DP_FRAME_VERSION && b[5] == 0);
    CHECK(b[6] == DP_FRAME_APP(3) && b[7] == 0);
    CHECK(b[12] == 7);
    CHECK(b[16] == 0x08 && b[23] == 0x01);
    CHECK(b[32] == 11);

    CHECK(dp_frame_decode(&g, b, DP_FRAME_MAX_DEFAULT, why, sizeof why) == DP_FRAME_OK);
    CHECK(g.version == DP_FRAME_VERSION && g.type == h.type && g.flags == h.flags);
    CHECK(g.source == h.source && g.step == h.step && g.offset == h.offset);
    CHECK(g.length == h.length && g.payload_crc == h.payload_crc);
    CHECK(dp_frame_check_payload(&g, "hello world", 11) == 0);
    CHECK(dp_frame_check_payload(&g, "hello World", 11) == -1);
    CHECK(dp_frame_check_payload(&g, "hello worl", 10) == -1);
    CHECK(why[0] == '\0');

    /* Bad magic. */
    uint8_t c[DP_FRAME_HEADER_SIZE];
    memcpy(c, b, sizeof c);
    memcpy(c, "GET ", 4);
    CHECK(decode(c, DP_FRAME_MAX_DEFAULT, why) == DP_FRAME_BAD_MAGIC);
    CHECKF(strstr(why, "magic") != NULL, "%s", why);

    /* Another protocol version. */
    memcpy(c, b, sizeof c);
    dp_put_u16(c + 4, DP_FRAME_VERSION + 1);
    CHECK(decode(c, DP_FRAME_MAX_DEFAULT, why) == DP_FRAME_BAD_VERSION);
    char want_version[32];
    snprintf(want_version, sizeof want_version, "version %d", DP_FRAME_VERSION + 1);
    CHECKF(strstr(why, want_version) != NULL, "%s", why);

    /* Any flipped bit in the covered bytes: header CRC. */
    int crc_bad = 0;
    for (int bit = 6 * 8; bit < 44 * 8; bit++) {
        memcpy(c, b, sizeof c);
        c[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        if (decode(c, DP_FRAME_MAX_DEFAULT, why) != DP_FRAME_BAD_HEADER_CRC)
            crc_bad++;
    }
    CHECKF(crc_bad == 0, "%d bit flips not caught by the header CRC", crc_bad);
    memcpy(c, b, sizeof c);
    c[47] ^= 1;
    CHECK(decode(c, DP_FRAME_MAX_DEFAULT, why) == DP_FRAME_BAD_HEADER_CRC);
    CHECKF(strstr(why, "header CRC") != NULL, "%s", why);

    /* Type out of range (with a valid header CRC). */
    dp_frame_header bad = sample();
    bad.type = DP_FRAME_COUNT;
    dp_frame_encode(c, &bad);
    CHECK(decode(c, DP_FRAME_MAX_DEFAULT, why) == DP_FRAME_BAD_TYPE);
    CHECKF(strstr(why, "type 256") != NULL, "%s", why);
    bad.type = DP_FRAME_COUNT - 1;
    dp_frame_encode(c, &bad);
    CHECK(decode(c, DP_FRAME_MAX_DEFAULT, why) == DP_FRAME_OK);

    /* Reserved flags. */
    bad = sample();
    bad.flags = 0x20000;
    dp_frame_encode(c, &bad);
    CHECK(decode(c, DP_FRAME_MAX_DEFAULT, why) == DP_FRAME_BAD_FLAGS);
    CHECKF(strstr(why, "reserved") != NULL, "%s", why);

    /* The chunked flag goes with, and only with, payloads over one chunk. */
    bad = sample();
    bad.flags = DP_FRAME_F_CHUNKED;
    dp_frame_encode(c, &bad);
    CHECK(decode(c, DP_FRAME_MAX_DEFAULT, why) == DP_FRAME_BAD_FLAGS);
    CHECKF(strstr(why, "chunked flag set") != NULL, "%s", why);
    bad.length = DP_FRAME_CHUNK + 1;
    dp_frame_encode(c, &bad);
    CHECK(decode(c, DP_FRAME_MAX_DEFAULT, why) == DP_FRAME_OK);
    bad.flags = 0;
    dp_frame_encode(c, &bad);
    CHECK(decode(c, DP_FRAME_MAX_DEFAULT, why) == DP_FRAME_BAD_FLAGS);
    CHECKF(strstr(why, "chunked flag missing") != NULL, "%s", why);
    CHECK(dp_frame_wire_size(0) == DP_FRAME_HEADER_SIZE);
    CHECK(dp_frame_wire_size(DP_FRAME_CHUNK) == DP_FRAME_HEADER_SIZE + DP_FRAME_CHUNK);
    CHECK(dp_frame_wire_size(DP_FRAME_CHUNK + 1) == DP_FRAME_HEADER_SIZE + DP_FRAME_CHUNK + 5);
    CHECK(dp_frame_wire_size(64 * DP_FRAME_CHUNK) ==
          DP_FRAME_HEADER_SIZE + 64 * DP_FRAME_CHUNK + 4 * 63);

    /* Length over the limit, at the limit, and a huge one. */
    bad = sample();
    bad.length = 4097;
    dp_frame_encode(c, &bad);
    CHECK(decode(c, 4096, why) == DP_FRAME_TOO_LONG);
    CHECKF(strstr(why, "4097") != NULL && strstr(why, "4096") != NULL, "%s", why);
    CHECK(decode(c, 4097, why) == DP_FRAME_OK);
    bad.length = UINT64_MAX;
    bad.flags = DP_FRAME_F_CHUNKED;
    dp_frame_encode(c, &bad);
    CHECK(decode(c, DP_FRAME_MAX_DEFAULT, why) == DP_FRAME_TOO_LONG);

    /* Names. */
    CHECK(strcmp(dp_frame_type_name(DP_FRAME_HEARTBEAT), "HEARTBEAT") == 0);
    CHECK(strcmp(dp_frame_type_name(DP_FRAME_APP(2)), "APP+2") == 0);
    CHECK(strcmp(dp_frame_type_name(999), "INVALID") == 0);
    CHECK(strcmp(dp_frame_status_name(DP_FRAME_TOO_LONG), "too long") == 0);
    CHECK(dp_frame_decode(&g, b, 0, NULL, 0) == DP_FRAME_TOO_LONG);
    return CHECK_DONE();
}
