/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78), as used by iSCSI,
 * ext4 and every downpour wire frame.  dp_crc32c picks the SSE4.2 instruction
 * at run time when the CPU has it and a slicing-by-8 table otherwise; both
 * give identical results.
 *
 * Chaining: crc starts at 0 and the result of one call is the crc of the next,
 * so dp_crc32c(dp_crc32c(0, a, n), b, m) is the CRC of a followed by b.
 * Known answer: dp_crc32c(0, "123456789", 9) == 0xE3069283. */
#ifndef DOWNPOUR_CRC32C_H
#define DOWNPOUR_CRC32C_H

#include <stddef.h>
#include <stdint.h>

uint32_t dp_crc32c(uint32_t crc, const void *buf, size_t len);

/* The CRC of A followed by B from crc1 = CRC(A), crc2 = CRC(B) and len2 =
 * |B|, in O(log len2): lets pieces be checksummed in parallel. */
uint32_t dp_crc32c_combine(uint32_t crc1, uint32_t crc2, size_t len2);

/* The table and the hardware implementation, for tests and benchmarks.
 * dp_crc32c_hw uses the best the CPU has (SSE4.2 crc32, with PCLMULQDQ or
 * AVX-512 VPCLMULQDQ folding when present) and falls back to the table, so it
 * is always safe to call. */
uint32_t dp_crc32c_sw(uint32_t crc, const void *buf, size_t len);
uint32_t dp_crc32c_hw(uint32_t crc, const void *buf, size_t len);

/* What dp_crc32c uses here: "avx512+vpclmulqdq", "sse4.2+pclmul", "sse4.2" or
 * "slicing-by-8". */
const char *dp_crc32c_impl(void);

/* For tests and benchmarks: use the named implementation (or a lesser one,
 * never one the CPU lacks).  Returns 0, or -1 if unknown or unsupported.
 * Not thread-safe: call it before any other thread computes a CRC. */
int dp_crc32c_force(const char *impl);

#endif
