/* The batcher: the records one shard owns, reshuffled every epoch from
 * (seed, epoch) alone, gathered into float batches without allocating. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/dataset.h"
#include "downpour/pool.h"
#include "convert.h"
#include "stream_batcher.h"

/* splitmix64's finaliser: a bijection that spreads every input bit. */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* The records shard k of w owns under policy p, as first + i*stride, i < *n. */
static void shard_range(dp_shard_policy p, uint32_t total, uint32_t k, uint32_t w,
                        uint32_t *first, uint32_t *stride, uint32_t *n)
{
    switch (p) {
    case DP_SHARD_DATA:
        *first = k;
        *stride = w;
        *n = k < total ? (uint32_t)(((uint64_t)total - k + w - 1) / w) : 0;
        break;
    case DP_SHARD_FILE: {
        /* Block k is [k*N/w, (k+1)*N/w): sizes differ by at most one. */
        uint64_t lo = (uint64_t)k * total / w, hi = ((uint64_t)k + 1) * total / w;
        *first = (uint32_t)lo;
        *stride = 1;
        *n = (uint32_t)(hi - lo);
        break;
    }
    default:
        *first = 0;
        *stride = 1;
        *n = total;
        break;
    }
}

static void natural_order(dp_batcher *b)
{
    uint32_t *o = b->order, v = b->first, s = b->stride;
    for (uint32_t i = 0; i < b->n; i++, v += s)
        o[i] = v;
}

int dp_batcher_init(dp_batcher *b, const dp_split *split, uint64_t seed, int shuffle,
                    dp_shard_policy policy, int shard_index, int shard_count, dp_err *err)
{
    memset(b, 0, sizeof *b);
    if (split && split->stream)
        return dp_batcher_stream_init(b, split, seed, shuffle, policy, shard_index, shard_count,
                                      err);
    if (!split || !split->images || split->n == 0)
        return dp_errf(err, "batcher: the split is empty");
    if ((unsigned)policy >= DP_SHARD_COUNT)
        return dp_errf(err, "batcher: unknown shard policy %d", (int)policy);
    if (shard_count < 1)
        return dp_errf(err, "batcher: shard count %d must be at least 1", shard_count);
    if (shard_index < 0 || shard_index >= shard_count)
        return dp_errf(err, "batcher: shard index %d is out of range [0, %d)", shard_index,
                       shard_count);
    uint32_t first, stride, n;
    shard_range(policy, split->n, (uint32_t)shard_index, (uint32_t)shard_count, &first, &stride,
                &n);
    if (n == 0)
        return dp_errf(err, "batcher: shard %d of %d (policy %s) of a %u-record split owns no "
                       "records", shard_index, shard_count, dp_shard_name(policy), split->n);
    b->order = malloc((size_t)n * sizeof *b->order);
    if (policy == DP_SHARD_DATA && shuffle)
        b->perm = malloc((size_t)split->n * sizeof *b->perm);
    if (!b->order || (policy == DP_SHARD_DATA && shuffle && !b->perm)) {
        free(b->order);
        free(b->perm);
        b->order = b->perm = NULL;
        return dp_errf(err, "batcher: out of memory for %u record indices", split->n);
    }
    b->split = split;
    b->n = n;
    b->first = first;
    b->stride = stride;
    b->seed = seed;
    b->shuffle = shuffle != 0;
    natural_order(b);
    return 0;
}

void dp_batcher_free(dp_batcher *b)
{
    if (!b)
        return;
    dp_stream_close(b->stream);
    free(b->order);
    free(b->perm);
    memset(b, 0, sizeof *b);
}

void dp_batcher_start_epoch(dp_batcher *b, long epoch)
{
    if (b->split && b->split->stream) {
        dp_batcher_stream_start(b, epoch);
        return;
    }
    if (!b->order)
        return;
    dp_rng r;
    dp_rng_seed(&r, mix64(b->seed ^ mix64((uint64_t)epoch + 0x9e3779b97f4a7c15ULL)));
    if (b->perm) {
        /* DATA: one shuffle of the whole split, the same in every worker;
         * this shard keeps every stride-th position of it. */
        uint32_t total = b->split->n;
        for (uint32_t i = 0; i < total; i++)
            b->perm[i] = i;
        dp_rng_shuffle(&r, b->perm, total);
        for (uint32_t i = 0; i < b->n; i++)
            b->order[i] = b->perm[b->first + (size_t)i * b->stride];
    } else {
        /* Resetting first makes the order a function of (seed, epoch) alone. */
        natural_order(b);
        if (b->shuffle)
            dp_rng_shuffle(&r, b->order, b->n);
    }
    b->pos = 0;
    b->epoch = epoch + 1;
}

/* The next batch's positions in the epoch's order, consumed: *idx and
 * how many (< batch at the end of the epoch, 0 when done). */
static int take(dp_batcher *b, int batch, const uint32_t **idx)
{
    if (!b->order || batch <= 0 || b->pos >= b->n)
        return 0;
    uint32_t left = b->n - b->pos;
    int k = left < (uint32_t)batch ? (int)left : batch;
    *idx = b->order + b->pos;
    b->pos += (uint32_t)k;
    return k;
}

int dp_batcher_next(dp_batcher *b, float *x, uint8_t *y, int batch)
{
    if (b->split && b->split->stream)
        return dp_batcher_stream_next(b, x, y, batch);
    const uint32_t *idx = NULL;
    int k = take(b, batch, &idx);
    if (k > 0)
        dp_split_gather(x, y, b->split, idx, k);
    return k;
}

int dp_batcher_next_indices(dp_batcher *b, uint32_t *idx, int batch)
{
    if (b->split && b->split->stream)
        return dp_errf(&b->err, "a device trainer needs the records in memory; this dataset is "
                       "streamed (docs/datasets.md)");
    const uint32_t *from = NULL;
    int k = take(b, batch, &from);
    if (k > 0)
        memcpy(idx, from, (size_t)k * sizeof *idx);
    return k;
}

void dp_batcher_seek(dp_batcher *b, uint32_t pos)
{
    if (b->split && b->split->stream)
        dp_batcher_stream_seek(b, pos);
    else
        b->pos = pos < b->n ? pos : b->n;
}

uint32_t dp_batcher_batches(const dp_batcher *b, int batch)
{
    if (batch <= 0)
        return 0;
    return (uint32_t)(((uint64_t)b->n + (uint64_t)batch - 1) / (uint64_t)batch);
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
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
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

typedef struct gather_job {
    float *x;
    uint8_t *y;
    const dp_split *s;
    const uint32_t *idx;
    int n;
} gather_job;

static void gather_rows(const gather_job *j, int lo, int hi)
{
    const dp_split *s = j->s;
    size_t dim = s->dim;
    for (int i = lo; i < hi; i++) {
        size_t r = j->idx[i];
        if (i + 1 < hi) { /* rows are random: start fetching the next one now */
            const uint8_t *next = s->images + (size_t)j->idx[i + 1] * dim;
            for (size_t o = 0; o < dim; o += 64)
                __builtin_prefetch(next + o);
        }
        bytes_to_unit(j->x + (size_t)i * dim, s->images + r * dim, s->dim);
        if (j->y)
            j->y[i] = s->labels[r];
    }
}

static void gather_task(void *ctx, int i, int n_threads)
{
    const gather_job *j = ctx;
    size_t lo, hi;
    dp_pool_range((size_t)j->n, 1, i, n_threads, &lo, &hi);
    gather_rows(j, (int)lo, (int)hi);
}

/* Batches below this many values convert on the calling thread. */
#define GATHER_MIN_SPLIT 32768

void dp_split_gather(float *x, uint8_t *y, const dp_split *s, const uint32_t *idx, int n)
{
    gather_job j = {x, y, s, idx, n};
    if (n <= 0)
        return;
    init_convert();
    if ((size_t)n * s->dim < GATHER_MIN_SPLIT)
        gather_rows(&j, 0, n);
    else
        dp_pool_run(gather_task, &j);
}

int dp_redeal_batch(int batch, int all, int live, uint32_t total, long steps_per_epoch,
                    int max_batch)
{
    if (live >= all || live < 1 || steps_per_epoch < 1)
        return batch;
    long share = ((long)total + live - 1) / live;
    long want = (share + steps_per_epoch - 1) / steps_per_epoch;
    return want > max_batch ? max_batch : (int)want;
}

uint32_t dp_shard_size(dp_shard_policy p, uint32_t total, int k, int w)
{
    uint32_t first, stride, n;
    if (w < 1 || k < 0 || k >= w)
        return 0;
    shard_range(p, total, (uint32_t)k, (uint32_t)w, &first, &stride, &n);
    return n;
}
