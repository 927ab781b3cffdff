/* CRC32C: known answers, and every implementation the CPU has (AVX-512
 * VPCLMULQDQ, SSE4.2 + PCLMULQDQ, SSE4.2, table) against the table on random
 * lengths and alignments, chained and combined. */
#include "downpour/crc32c.h"
#include "downpour/rng.h"

#include "check.h"

#include <string.h>

static const char *const impls[] = {"avx512+vpclmulqdq", "sse4.2+pclmul", "sse4.2",
                                    "slicing-by-8"};

/* Returns the number of mismatches over random pieces of buf[0, cap + 16). */
static int compare(dp_rng *r, const unsigned char *buf, size_t cap)
{
    int bad = 0;
    for (int it = 0; it < 2000; it++) {
        size_t off = dp_rng_below(r, 16);
        size_t len = it < 1000 ? dp_rng_below(r, 2000) : dp_rng_below(r, (uint32_t)cap);
        uint32_t a = dp_crc32c_sw(0, buf + off, len);
        if (dp_crc32c_hw(0, buf + off, len) != a || dp_crc32c(0, buf + off, len) != a)
            bad++;
        /* Chaining: two calls equal one. */
        size_t cut = len ? dp_rng_below(r, (uint32_t)len) : 0;
        if (dp_crc32c(dp_crc32c(0, buf + off, cut), buf + off + cut, len - cut) != a)
            bad++;
        /* Combining two separately computed pieces. */
        if (dp_crc32c_combine(dp_crc32c(0, buf + off, cut), dp_crc32c(0, buf + off + cut, len - cut),
                              len - cut) != a)
            bad++;
    }
    return bad;
}

int main(void)
{
    const char *s = "123456789";
    CHECK(dp_crc32c(0, s, 9) == 0xE3069283u);
    CHECK(dp_crc32c_sw(0, s, 9) == 0xE3069283u);
    CHECK(dp_crc32c_hw(0, s, 9) == 0xE3069283u);
    CHECK(dp_crc32c(0, s, 0) == 0);
    CHECK(dp_crc32c(0, NULL, 0) == 0);
    CHECK(dp_crc32c_combine(0xE3069283u, 0, 0) == 0xE3069283u);

    /* RFC 3720 B.4 vectors: 32 zero bytes, 32 0xFF bytes, ascending, descending. */
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

    /* Random lengths crossing every block size (256 B, 14 KiB, 24 KiB), and
     * alignments, for each implementation this CPU can run. */
    size_t cap = 200000;
    unsigned char *buf = malloc(cap + 16);
    REQUIRE(buf);
    dp_rng r;
    dp_rng_seed(&r, 42);
    for (size_t i = 0; i < cap + 16; i++)
        buf[i] = (unsigned char)dp_rng_u64(&r);
    for (int k = 0; k < 4; k++) {
        if (dp_crc32c_force(impls[k]) != 0) {
            fprintf(stderr, "crc32c %s: not supported by this CPU, skipped\n", impls[k]);
            continue;
        }
        CHECK(strcmp(dp_crc32c_impl(), impls[k]) == 0);
        CHECK(dp_crc32c(0, s, 9) == 0xE3069283u);
        int bad = compare(&r, buf, cap);
        CHECKF(bad == 0, "%s: %d mismatches with the table, chained or combined", impls[k], bad);
    }
    CHECK(dp_crc32c_force("no-such-crc") == -1);
    free(buf);
    return CHECK_DONE();
}
