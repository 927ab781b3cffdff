/* What the batcher (batch.c) and a stream (stream.c) share: bytes to
 * floats and an epoch's seed (convert.h). */
#include <pthread.h>

#include "downpour/isa.h"
#include "convert.h"

/* splitmix64's finaliser: a bijection that spreads every input bit. */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* One record: dst[j] = src[j] / 255.  Blocks of 16 with an unrolled body
 * vectorise even at -O2; the tail is scalar. */
static void bytes_to_unit_div(float *restrict dst, const uint8_t *restrict src, uint32_t n)
{
    uint32_t j = 0;
    for (; j + 16 <= n; j += 16) {
#pragma GCC unroll 16
        for (uint32_t t = 0; t < 16; t++)
            dst[j + t] = (float)src[j + t] / 255.0f;
    }
    for (; j < n; j++)
        dst[j] = (float)src[j] / 255.0f;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
/* The same bits without the divider, which bounded the gather (128 records
 * of 784 bytes: 27.6 us with divisions, 11.2 us without, one thread, AMD EPYC
 * Zen 3): q = x * (1/255) rounded, then one FMA correction
 * q + (x - 255 q) / 255 with the exact residual.  For each of the 256 byte
 * values that is the correctly rounded x / 255, the division's result
 * (tests/test_dataset.c checks all of them). */
__attribute__((target("avx2,fma"))) static void
bytes_to_unit_fma(float *restrict dst, const uint8_t *restrict src, uint32_t n)
{
    const __m256 k = _mm256_set1_ps(255.0f), r = _mm256_set1_ps(1.0f / 255.0f);
    uint32_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m128i b = _mm_loadl_epi64((const __m128i *)(src + j));
        __m256 x = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
        __m256 q = _mm256_mul_ps(x, r);
        __m256 e = _mm256_fnmadd_ps(q, k, x);
        _mm256_storeu_ps(dst + j, _mm256_fmadd_ps(e, r, q));
    }
    for (; j < n; j++)
        dst[j] = (float)src[j] / 255.0f;
}

typedef void (*convert_fn)(float *restrict, const uint8_t *restrict, uint32_t);
static convert_fn bytes_to_unit = bytes_to_unit_div;
static pthread_once_t convert_once = PTHREAD_ONCE_INIT;
static void choose_convert(void)
{
    if (dp_isa_max() >= DP_ISA_AVX2) /* within DOWNPOUR_ISA's cap */
        bytes_to_unit = bytes_to_unit_fma;
}
static void init_convert(void) { pthread_once(&convert_once, choose_convert); }
#else
#define bytes_to_unit bytes_to_unit_div
static void init_convert(void) {}
#endif

void dp_bytes_to_unit(float *restrict dst, const uint8_t *restrict src, uint32_t n)
{
    init_convert();
    bytes_to_unit(dst, src, n);
}

uint64_t dp_data_epoch_seed(uint64_t seed, long epoch)
{
    return mix64(seed ^ mix64((uint64_t)epoch + 0x9e3779b97f4a7c15ULL));
}

