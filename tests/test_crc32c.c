/* CRC32C: known answers, and the SSE4.2 and table paths against each other on
 * random lengths, alignments and chained calls. */
#include "downpour/crc32c.h"
#include "downpour/rng.h"

#include "check.h"

#include <string.h>

int main(void)
{
    const char *s = "123456789";
    CHECK(dp_crc32c(0, s, 9) == 0xE3069283u);
    CHECK(dp_crc32c_sw(0, s, 9) == 0xE3069283u);
    CHECK(dp_crc32c_hw(0, s, 9) == 0xE3069283u);
    CHECK(dp_crc32c(0, s, 0) == 0);
    CHECK(dp_crc32c(0, NULL, 0) == 0);

    /* RFC 3720 B.4 vectors: 32 zero bytes, 32 0xFF bytes, 0..31 ascending. */
    unsigned char v[32];
    memset(v, 0, sizeof v);
    CHECK(dp_crc32c(0, v, 32) == 0x8A9136AAu);
    memset(v, 0xff, sizeof v);
    CHECK(dp_crc32c(0, v, 32) == 0x62A8AB43u);
    for (int i = 0; i < 32; i++)
        v[i] = (unsigned char)i;
    CHECK(dp_crc32c(0, v, 32) == 0x46DD794Eu);
    for (int i = 0; i < 32; i++)
        v[i] = (unsigned char)(31 - i);
    CHECK(dp_crc32c(0, v, 32) == 0x113FDB5Cu);
    fprintf(stderr, "crc32c implementation: %s\n", dp_crc32c_impl());

    /* Random lengths (crossing the 3*8192 and 3*256 block sizes) and alignments. */
    size_t cap = 200000;
    unsigned char *buf = malloc(cap + 16);
    REQUIRE(buf);
    dp_rng r;
    dp_rng_seed(&r, 42);
    for (size_t i = 0; i < cap + 16; i++)
        buf[i] = (unsigned char)dp_rng_u64(&r);
    int bad = 0;
    for (int it = 0; it < 2000; it++) {
        size_t off = dp_rng_below(&r, 16);
        size_t len = it < 1000 ? dp_rng_below(&r, 2000) : dp_rng_below(&r, (uint32_t)cap);
        uint32_t a = dp_crc32c_sw(0, buf + off, len);
        uint32_t b = dp_crc32c_hw(0, buf + off, len);
        if (a != b)
            bad++;
        /* Chaining: two calls equal one. */
        size_t cut = len ? dp_rng_below(&r, (uint32_t)len) : 0;
        uint32_t c = dp_crc32c(dp_crc32c(0, buf + off, cut), buf + off + cut, len - cut);
        if (c != a)
            bad++;
        /* Combining two separately computed pieces. */
        uint32_t d = dp_crc32c_combine(dp_crc32c(0, buf + off, cut),
                                       dp_crc32c(0, buf + off + cut, len - cut), len - cut);
        if (d != a)
            bad++;
    }
    CHECKF(bad == 0, "%d mismatches between the table and SSE4.2 paths, chained or combined calls",
           bad);
    CHECK(dp_crc32c_combine(0xE3069283u, 0, 0) == 0xE3069283u);
    free(buf);
    return CHECK_DONE();
}
