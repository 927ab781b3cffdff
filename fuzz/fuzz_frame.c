/* libFuzzer target for the frame decoder: any 48 bytes must decode to OK or
 * a named failure without crashing, reading out of bounds or allocating from
 * the length; an accepted header must re-encode to the same bytes; and the
 * payload check must agree with a direct CRC of the bytes that follow. */
#include "downpour/crc32c.h"
#include "downpour/frame.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < DP_FRAME_HEADER_SIZE + 8)
        return 0;
    /* The first 8 bytes choose the maximum frame size. */
    uint64_t max_len = dp_get_u64(data) & 0xffffff;
    const uint8_t *hdr = data + 8;
    const uint8_t *payload = hdr + DP_FRAME_HEADER_SIZE;
    size_t plen = size - 8 - DP_FRAME_HEADER_SIZE;

    dp_frame_header h;
    char why[256];
    dp_frame_status st = dp_frame_decode(&h, hdr, max_len, why, sizeof why);
    if ((unsigned)st >= DP_FRAME_STATUS_COUNT)
        abort();
    if (st != DP_FRAME_OK) {
        if (why[0] == '\0' || strlen(why) >= sizeof why)
            abort(); /* every refusal gives a reason */
        return 0;
    }
    if (h.length > max_len || h.type >= DP_FRAME_COUNT ||
        (h.flags & ~(DP_FRAME_FLAGS_APP | DP_FRAME_F_CHUNKED)) ||
        !(h.flags & DP_FRAME_F_CHUNKED) != !(h.length > DP_FRAME_CHUNK))
        abort();
    uint8_t again[DP_FRAME_HEADER_SIZE];
    dp_frame_encode(again, &h);
    if (memcmp(again, hdr, DP_FRAME_HEADER_SIZE) != 0)
        abort(); /* decode and encode are inverse on valid headers */
    int ok = dp_frame_check_payload(&h, payload, plen) == 0;
    size_t first = plen > DP_FRAME_CHUNK ? (size_t)DP_FRAME_CHUNK : plen;
    int want = h.length == plen && dp_crc32c_sw(0, payload, first) == h.payload_crc;
    if (ok != want)
        abort();
    (void)dp_frame_type_name(h.type);
    return 0;
}
