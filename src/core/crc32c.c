/* CRC32C: a slicing-by-8 table version and an SSE4.2 version chosen at run
 * time.  The hardware path runs three independent crc32 streams over three
 * adjacent blocks (the instruction has a latency of three cycles and a
 * throughput of one) and joins them with "shift by n zero bytes" tables, as in
 * Mark Adler's crc32c.c; that triples its speed on large payloads.  With
 * PCLMULQDQ it also folds a fourth block with carry-less multiplies at the same
 * time, on another execution port: about 45 GB/s in cache instead of 30. */
#include "downpour/crc32c.h"
#include "downpour/isa.h"

#include <pthread.h>
#include <string.h>

#define POLY 0x82f63b78u

/* Blocks of the three-stream hardware loop. */
#define LONG_BLOCK 8192
#define SHORT_BLOCK 256
/* Hybrid superblock: three crc32 streams of HYB_A bytes each run alongside a
 * four-lane PCLMULQDQ fold over HYB_B bytes (the two instructions use different
 * execution ports), then the four partial CRCs are joined by shifting. */
#define HYB_A 2048
#define HYB_B (4 * HYB_A)

static uint32_t g_table[8][256];
static uint32_t g_long_shift[4][256];
static uint32_t g_short_shift[4][256];
static uint32_t g_hyb_a_shift[4][256], g_hyb_b_shift[4][256];
static uint64_t g_k_fold[3][2]; /* carry-less folding constants: 512, 128, 2048 bits */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_have_sse42, g_have_pclmul, g_have_vpclmul; /* what is used */
static int g_cpu_level; /* 0 table, 1 sse4.2, 2 +pclmul, 3 +avx512 vpclmulqdq */

/* GF(2) 32x32 matrix times vector: the matrix is 32 columns. */
static uint32_t gf2_times(const uint32_t *mat, uint32_t vec)
{
    uint32_t sum = 0;
    while (vec) {
        if (vec & 1)
            sum ^= *mat;
        vec >>= 1;
        mat++;
    }
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat)
{
    for (int n = 0; n < 32; n++)
        square[n] = gf2_times(mat, mat[n]);
}

/* The operator that appends len zero bytes (len a power of two) to a raw CRC
 * register. */
static void zeros_op(uint32_t *even, size_t len)
{
    uint32_t odd[32];
    odd[0] = POLY; /* one zero bit */
    uint32_t row = 1;
    for (int n = 1; n < 32; n++) {
        odd[n] = row;
        row <<= 1;
    }
    gf2_square(even, odd); /* two zero bits */
    gf2_square(odd, even); /* four zero bits */
    /* The first square below gives one zero byte (eight bits) in even. */
    do {
        gf2_square(even, odd);
        len >>= 1;
        if (len == 0)
            return;
        gf2_square(odd, even);
        len >>= 1;
    } while (len);
    memcpy(even, odd, sizeof odd);
}

static void zeros_table(uint32_t zeros[4][256], size_t len)
{
    uint32_t op[32];
    zeros_op(op, len);
    for (uint32_t n = 0; n < 256; n++) {
        zeros[0][n] = gf2_times(op, n);
        zeros[1][n] = gf2_times(op, n << 8);
        zeros[2][n] = gf2_times(op, n << 16);
        zeros[3][n] = gf2_times(op, n << 24);
    }
}

static uint32_t shift(uint32_t zeros[4][256], uint32_t crc)
{
    return zeros[0][crc & 0xff] ^ zeros[1][(crc >> 8) & 0xff] ^ zeros[2][(crc >> 16) & 0xff] ^
           zeros[3][crc >> 24];
}

/* x^n mod P in the normal (unreflected) representation; P = 0x1EDC6F41. */
static uint32_t xpow_mod(int n)
{
    uint64_t r = 1;
    for (int i = 0; i < n; i++) {
        r <<= 1;
        if (r & 0x100000000ull)
            r ^= 0x11EDC6F41ull;
    }
    return (uint32_t)r;
}

static uint32_t reflect32(uint32_t v)
{
    uint32_t r = 0;
    for (int i = 0; i < 32; i++)
        if (v & (1u << i))
            r |= 1u << (31 - i);
    return r;
}

static void init_tables(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
        g_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = g_table[0][n];
        for (int k = 1; k < 8; k++) {
            c = g_table[0][c & 0xff] ^ (c >> 8);
            g_table[k][n] = c;
        }
    }
    zeros_table(g_long_shift, LONG_BLOCK);
    zeros_table(g_short_shift, SHORT_BLOCK);
#if defined(__x86_64__)
    if (__builtin_cpu_supports("sse4.2")) {
        g_cpu_level = 1;
        if (__builtin_cpu_supports("pclmul")) {
            g_cpu_level = 2;
            if (__builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("avx512f") &&
                __builtin_cpu_supports("avx512vl"))
                g_cpu_level = 3;
        }
    }
    /* within DOWNPOUR_ISA's cap (downpour/isa.h) */
    dp_isa cap = dp_isa_cap();
    if (cap < DP_ISA_AVX512 && g_cpu_level > 2)
        g_cpu_level = 2;
    if (cap < DP_ISA_SSE42)
        g_cpu_level = 0;
#endif
    g_have_sse42 = g_cpu_level >= 1;
    g_have_pclmul = g_cpu_level >= 2;
    g_have_vpclmul = g_cpu_level >= 3;
    zeros_table(g_hyb_a_shift, HYB_A);
    zeros_table(g_hyb_b_shift, HYB_B);
    /* Folding a 128-bit lane forward by d bits multiplies its low (earlier)
     * quadword by x^(d+32) and its high quadword by x^(d-32), mod P; in the
     * reflected domain each constant is bit-reversed and shifted left by 1. */
    const int dist[3] = {512, 128, 2048};
    for (int k = 0; k < 3; k++) {
        g_k_fold[k][0] = (uint64_t)reflect32(xpow_mod(dist[k] + 32)) << 1;
        g_k_fold[k][1] = (uint64_t)reflect32(xpow_mod(dist[k] - 32)) << 1;
    }
}

static uint64_t load_le64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8); /* the table and the instruction both assume x86's little-endian */
    return v;
}

uint32_t dp_crc32c_sw(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&g_once, init_tables);
    const unsigned char *p = buf;
    uint32_t c = ~crc;
    while (len && ((uintptr_t)p & 7)) {
        c = g_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
        len--;
    }
    while (len >= 8) {
        uint64_t w = load_le64(p) ^ c;
        c = g_table[7][w & 0xff] ^ g_table[6][(w >> 8) & 0xff] ^ g_table[5][(w >> 16) & 0xff] ^
            g_table[4][(w >> 24) & 0xff] ^ g_table[3][(w >> 32) & 0xff] ^
            g_table[2][(w >> 40) & 0xff] ^ g_table[1][(w >> 48) & 0xff] ^ g_table[0][w >> 56];
        p += 8;
        len -= 8;
    }
    while (len--)
        c = g_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return ~c;
}

#if defined(__x86_64__)
#include <immintrin.h>
#include <nmmintrin.h>
#include <wmmintrin.h>

#define AVX512_TARGET "avx512f,avx512vl,vpclmulqdq,pclmul,sse4.2"

__attribute__((target(AVX512_TARGET))) static __m512i fold512(__m512i z, __m512i k)
{
    return _mm512_xor_si512(_mm512_clmulepi64_epi128(z, k, 0x00),
                            _mm512_clmulepi64_epi128(z, k, 0x11));
}

__attribute__((target(AVX512_TARGET))) static __m128i fold128_v(__m128i x, __m128i k)
{
    return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

/* VPCLMULQDQ on 512-bit registers: four accumulators of four 128-bit lanes
 * fold 256 bytes per iteration; len is a multiple of 256.  crc is the raw
 * register; it is xored into the first bytes, and the single 128-bit lane
 * left at the end is finished with the crc32 instruction. */
__attribute__((target(AVX512_TARGET))) static uint64_t crc_avx512(uint64_t crc,
                                                                 const unsigned char *p,
                                                                 size_t len)
{
    const __m512i k2048 = _mm512_broadcast_i32x4(
        _mm_set_epi64x((long long)g_k_fold[2][1], (long long)g_k_fold[2][0]));
    const __m512i k512 = _mm512_broadcast_i32x4(
        _mm_set_epi64x((long long)g_k_fold[0][1], (long long)g_k_fold[0][0]));
    const __m128i k128 = _mm_set_epi64x((long long)g_k_fold[1][1], (long long)g_k_fold[1][0]);
    __m512i z0 = _mm512_loadu_si512(p), z1 = _mm512_loadu_si512(p + 64);
    __m512i z2 = _mm512_loadu_si512(p + 128), z3 = _mm512_loadu_si512(p + 192);
    z0 = _mm512_xor_si512(z0, _mm512_zextsi128_si512(_mm_cvtsi32_si128((int)(uint32_t)crc)));
    for (p += 256, len -= 256; len >= 256; p += 256, len -= 256) {
        z0 = _mm512_xor_si512(fold512(z0, k2048), _mm512_loadu_si512(p));
        z1 = _mm512_xor_si512(fold512(z1, k2048), _mm512_loadu_si512(p + 64));
        z2 = _mm512_xor_si512(fold512(z2, k2048), _mm512_loadu_si512(p + 128));
        z3 = _mm512_xor_si512(fold512(z3, k2048), _mm512_loadu_si512(p + 192));
    }
    z0 = _mm512_xor_si512(fold512(z0, k512), z1);
    z0 = _mm512_xor_si512(fold512(z0, k512), z2);
    z0 = _mm512_xor_si512(fold512(z0, k512), z3);
    __m128i x = _mm512_extracti32x4_epi32(z0, 0);
    x = _mm_xor_si128(fold128_v(x, k128), _mm512_extracti32x4_epi32(z0, 1));
    x = _mm_xor_si128(fold128_v(x, k128), _mm512_extracti32x4_epi32(z0, 2));
    x = _mm_xor_si128(fold128_v(x, k128), _mm512_extracti32x4_epi32(z0, 3));
    uint64_t c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(x));
    return _mm_crc32_u64(c, (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(x, x)));
}

__attribute__((target("sse4.2,pclmul"))) static __m128i fold(__m128i x, __m128i k)
{
    return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

/* One superblock of 3 * HYB_A + HYB_B bytes at p, crc a raw (uninverted)
 * register; returns the raw register after it.  Each iteration: two crc32
 * steps on each of three streams (16 bytes each) and one fold of four
 * 16-byte lanes (64 bytes), enough independent work to hide both latencies. */
__attribute__((target("sse4.2,pclmul"))) static uint64_t hybrid_block(uint64_t crc0,
                                                                      const unsigned char *p)
{
    const unsigned char *s1 = p + HYB_A, *s2 = p + 2 * HYB_A, *pc = p + 3 * HYB_A;
    const __m128i k512 = _mm_set_epi64x((long long)g_k_fold[0][1], (long long)g_k_fold[0][0]);
    const __m128i k128 = _mm_set_epi64x((long long)g_k_fold[1][1], (long long)g_k_fold[1][0]);
    uint64_t crc1 = 0, crc2 = 0;
    __m128i x0 = _mm_loadu_si128((const __m128i *)pc);
    __m128i x1 = _mm_loadu_si128((const __m128i *)(pc + 16));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(pc + 32));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(pc + 48));
    for (size_t i = 0; i < HYB_A / 16; i++) {
        crc0 = _mm_crc32_u64(crc0, load_le64(p + 16 * i));
        crc1 = _mm_crc32_u64(crc1, load_le64(s1 + 16 * i));
        crc2 = _mm_crc32_u64(crc2, load_le64(s2 + 16 * i));
        crc0 = _mm_crc32_u64(crc0, load_le64(p + 16 * i + 8));
        crc1 = _mm_crc32_u64(crc1, load_le64(s1 + 16 * i + 8));
        crc2 = _mm_crc32_u64(crc2, load_le64(s2 + 16 * i + 8));
        if (i + 1 < HYB_A / 16) {
            const unsigned char *q = pc + 64 * (i + 1);
            x0 = _mm_xor_si128(fold(x0, k512), _mm_loadu_si128((const __m128i *)q));
            x1 = _mm_xor_si128(fold(x1, k512), _mm_loadu_si128((const __m128i *)(q + 16)));
            x2 = _mm_xor_si128(fold(x2, k512), _mm_loadu_si128((const __m128i *)(q + 32)));
            x3 = _mm_xor_si128(fold(x3, k512), _mm_loadu_si128((const __m128i *)(q + 48)));
        }
    }
    x0 = _mm_xor_si128(fold(x0, k128), x1);
    x0 = _mm_xor_si128(fold(x0, k128), x2);
    x0 = _mm_xor_si128(fold(x0, k128), x3);
    uint64_t crcp = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(x0));
    crcp = _mm_crc32_u64(crcp, (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(x0, x0)));
    uint32_t c = shift(g_hyb_a_shift, (uint32_t)crc0) ^ (uint32_t)crc1;
    c = shift(g_hyb_a_shift, c) ^ (uint32_t)crc2;
    return shift(g_hyb_b_shift, c) ^ (uint32_t)crcp;
}

__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const void *buf,
                                                                size_t len)
{
    const unsigned char *next = buf;
    uint64_t crc0 = (uint32_t)~crc, crc1, crc2;

    while (len && ((uintptr_t)next & 7)) {
        crc0 = _mm_crc32_u8((uint32_t)crc0, *next++);
        len--;
    }
    if (g_have_vpclmul && len >= 1024) {
        size_t n = len & ~(size_t)255;
        crc0 = crc_avx512(crc0, next, n);
        next += n;
        len -= n;
    }
    if (g_have_pclmul)
        while (len >= 3 * HYB_A + HYB_B) {
            crc0 = hybrid_block(crc0, next);
            next += 3 * HYB_A + HYB_B;
            len -= 3 * HYB_A + HYB_B;
        }
    /* Three streams over three adjacent blocks, joined by shifting. */
    while (len >= 3 * LONG_BLOCK) {
        crc1 = crc2 = 0;
        const unsigned char *end = next + LONG_BLOCK;
        do {
            crc0 = _mm_crc32_u64(crc0, load_le64(next));
            crc1 = _mm_crc32_u64(crc1, load_le64(next + LONG_BLOCK));
            crc2 = _mm_crc32_u64(crc2, load_le64(next + 2 * LONG_BLOCK));
            next += 8;
        } while (next < end);
        crc0 = shift(g_long_shift, (uint32_t)crc0) ^ (uint32_t)crc1;
        crc0 = shift(g_long_shift, (uint32_t)crc0) ^ (uint32_t)crc2;
        next += 2 * LONG_BLOCK;
        len -= 3 * LONG_BLOCK;
    }
    while (len >= 3 * SHORT_BLOCK) {
        crc1 = crc2 = 0;
        const unsigned char *end = next + SHORT_BLOCK;
        do {
            crc0 = _mm_crc32_u64(crc0, load_le64(next));
            crc1 = _mm_crc32_u64(crc1, load_le64(next + SHORT_BLOCK));
            crc2 = _mm_crc32_u64(crc2, load_le64(next + 2 * SHORT_BLOCK));
            next += 8;
        } while (next < end);
        crc0 = shift(g_short_shift, (uint32_t)crc0) ^ (uint32_t)crc1;
        crc0 = shift(g_short_shift, (uint32_t)crc0) ^ (uint32_t)crc2;
        next += 2 * SHORT_BLOCK;
        len -= 3 * SHORT_BLOCK;
    }
    while (len >= 8) {
        crc0 = _mm_crc32_u64(crc0, load_le64(next));
        next += 8;
        len -= 8;
    }
    while (len) {
        crc0 = _mm_crc32_u8((uint32_t)crc0, *next++);
        len--;
    }
    return ~(uint32_t)crc0;
}

static int have_sse42(void)
{
    pthread_once(&g_once, init_tables);
    return g_have_sse42;
}

uint32_t dp_crc32c_hw(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&g_once, init_tables);
    if (!have_sse42())
        return dp_crc32c_sw(crc, buf, len);
    return crc32c_sse42(crc, buf, len);
}
#else
static int have_sse42(void) { return 0; }

uint32_t dp_crc32c_hw(uint32_t crc, const void *buf, size_t len)
{
    return dp_crc32c_sw(crc, buf, len);
}
#endif

uint32_t dp_crc32c(uint32_t crc, const void *buf, size_t len)
{
    return have_sse42() ? dp_crc32c_hw(crc, buf, len) : dp_crc32c_sw(crc, buf, len);
}

uint32_t dp_crc32c_combine(uint32_t crc1, uint32_t crc2, size_t len2)
{
    /* Apply the operator for len2 zero bytes to crc1 by squaring (zlib's
     * crc32_combine); the pre- and post-inversions cancel out. */
    if (len2 == 0)
        return crc1;
    uint32_t even[32], odd[32];
    odd[0] = POLY;
    uint32_t row = 1;
    for (int n = 1; n < 32; n++) {
        odd[n] = row;
        row <<= 1;
    }
    gf2_square(even, odd); /* two zero bits */
    gf2_square(odd, even); /* four zero bits */
    do {
        gf2_square(even, odd); /* the first time: one zero byte */
        if (len2 & 1)
            crc1 = gf2_times(even, crc1);
        len2 >>= 1;
        if (len2 == 0)
            break;
        gf2_square(odd, even);
        if (len2 & 1)
            crc1 = gf2_times(odd, crc1);
        len2 >>= 1;
    } while (len2);
    return crc1 ^ crc2;
}

static const char *const impl_names[4] = {"slicing-by-8", "sse4.2", "sse4.2+pclmul",
                                           "avx512+vpclmulqdq"};

int dp_crc32c_force(const char *impl)
{
    pthread_once(&g_once, init_tables);
    for (int level = 0; level < 4; level++) {
        if (strcmp(impl, impl_names[level]) != 0)
            continue;
        if (level > g_cpu_level)
            return -1;
        g_have_sse42 = level >= 1;
        g_have_pclmul = level >= 2;
        g_have_vpclmul = level >= 3;
        return 0;
    }
    return -1;
}

const char *dp_crc32c_impl(void)
{
    pthread_once(&g_once, init_tables);
    return impl_names[g_have_vpclmul ? 3 : g_have_pclmul ? 2 : g_have_sse42 ? 1 : 0];
}
