/* The batcher: the records one shard owns, reshuffled every epoch from
 * (seed, epoch) alone, gathered into float batches without allocating. */
#include <stdlib.h>
#include <string.h>

#include "downpour/augment.h"
#include "downpour/dataset.h"
#include "downpour/pool.h"
#include "convert.h"
#include "stream_batcher.h"

int dp_split_in_memory(const dp_split *s)
{
    return s && (s->images || s->values) && s->labels;
}

/* ---- the split's files (FILE sharding, docs/datasets.md "Sharding") ---- */

/* A walk over the files that hold records of the split, in file order.
 * Each file's records start where the last one's ended, so the files never
 * overlap even under a file_end the batcher would refuse (check_files). */
typedef struct file_walk {
    const dp_split *s;
    uint32_t f;  /* next index into file_end */
    uint32_t at; /* first record not yet in a file */
} file_walk;

/* The next file with at least one of the split's records: [*lo, *hi),
 * clipped to n; 0 when there is none (files wholly past n do not count). */
static int next_file(file_walk *w, uint32_t *lo, uint32_t *hi)
{
    const dp_split *s = w->s;
    while (s->file_end && w->f < s->n_files && w->at < s->n) {
        uint64_t end = s->file_end[w->f++];
        uint32_t e = end < s->n ? (uint32_t)end : s->n;
        if (e > w->at) {
            *lo = w->at;
            *hi = e;
            w->at = e;
            return 1;
        }
    }
    return 0;
}

static uint32_t count_files(const dp_split *s)
{
    file_walk w = {s, 0, 0};
    uint32_t lo, hi, f = 0;
    while (next_file(&w, &lo, &hi))
        f++;
    return f;
}

/* Records of the files worker k of w owns: files k, k+w, k+2w, ... of those
 * holding records, round-robin as TensorFlow's FILE auto-shard deals them. */
static uint32_t file_shard_records(const dp_split *s, uint32_t k, uint32_t w)
{
    file_walk fw = {s, 0, 0};
    uint32_t lo, hi, rank = 0, n = 0;
    while (next_file(&fw, &lo, &hi))
        if (rank++ % w == k)
            n += hi - lo;
    return n;
}

/* FILE shards by whole files when the split says where its files end;
 * one undivided source is cut into contiguous blocks. */
static int by_files(dp_shard_policy p, const dp_split *s)
{
    return p == DP_SHARD_FILE && s->n_files > 0;
}

/* The records shard k of w owns under policy p: first + i*stride, i < *n,
 * or (by files) the records of the files of ranks first + i*stride. */
static void shard_range(dp_shard_policy p, const dp_split *s, uint32_t k, uint32_t w,
                        uint32_t *first, uint32_t *stride, uint32_t *n)
{
    uint32_t total = s->n;
    switch (p) {
    case DP_SHARD_DATA:
        *first = k;
        *stride = w;
        *n = k < total ? (uint32_t)(((uint64_t)total - k + w - 1) / w) : 0;
        break;
    case DP_SHARD_FILE:
        if (by_files(p, s)) {
            *first = k;
            *stride = w;
            *n = file_shard_records(s, k, w);
        } else {
            /* Block k is [k*N/w, (k+1)*N/w): sizes differ by at most one. */
            uint64_t lo = (uint64_t)k * total / w, hi = ((uint64_t)k + 1) * total / w;
            *first = (uint32_t)lo;
            *stride = 1;
            *n = (uint32_t)(hi - lo);
        }
        break;
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
    if (b->by_files) {
        file_walk fw = {b->split, 0, 0};
        uint32_t lo, hi, rank = 0, i = 0;
        while (next_file(&fw, &lo, &hi))
            if (rank++ % s == v)
                for (uint32_t r = lo; r < hi && i < b->n; r++)
                    o[i++] = r;
        return;
    }
    for (uint32_t i = 0; i < b->n; i++, v += s)
        o[i] = v;
}

/* The split's file bounds, when FILE sharding deals its files: rising, and
 * covering every record (else records would belong to no worker). */
static int check_files(const dp_split *s, dp_err *err)
{
    if (!s->file_end)
        return dp_errf(err, "batcher: the split names %u files but not where they end "
                       "(file_end is NULL)", s->n_files);
    for (uint32_t f = 1; f < s->n_files; f++)
        if (s->file_end[f] < s->file_end[f - 1])
            return dp_errf(err, "batcher: file %u of the split ends at record %llu, before "
                           "file %u does (%llu)", f, (unsigned long long)s->file_end[f], f - 1,
                           (unsigned long long)s->file_end[f - 1]);
    if (s->file_end[s->n_files - 1] < s->n)
        return dp_errf(err, "batcher: the split's %u files end at record %llu, but it has %u "
                       "records", s->n_files, (unsigned long long)s->file_end[s->n_files - 1],
                       s->n);
    return 0;
}

/* Every check of dp_batcher_init's arguments, in one place. */
static int check_init(const dp_split *split, dp_shard_policy policy, int shard_index,
                      int shard_count, dp_err *err)
{
    if (!split || split->n == 0)
        return dp_errf(err, "batcher: the split is empty");
    if ((unsigned)policy >= DP_SHARD_COUNT)
        return dp_errf(err, "batcher: unknown shard policy %d", (int)policy);
    if (shard_count < 1)
        return dp_errf(err, "batcher: shard count %d must be at least 1", shard_count);
    if (shard_index < 0 || shard_index >= shard_count)
        return dp_errf(err, "batcher: shard index %d is out of range [0, %d)", shard_index,
                       shard_count);
    return dp_shard_check(policy, split, shard_count, err);
}

int dp_shard_check(dp_shard_policy policy, const dp_split *split, int workers, dp_err *err)
{
    if (!by_files(policy, split))
        return 0;
    if (check_files(split, err) < 0)
        return -1;
    uint32_t files = count_files(split);
    if (files < (uint32_t)workers)
        return dp_errf(err, "FILE sharding gives each worker whole files, but the training "
                       "split has %u file%s for %d workers: use --shard data, or more files "
                       "(downpour data convert --shards %d or more)", files,
                       files == 1 ? "" : "s", workers, workers);
    return 0;
}

int dp_batcher_init(dp_batcher *b, const dp_split *split, uint64_t seed, int shuffle,
                    dp_shard_policy policy, int shard_index, int shard_count, dp_err *err)
{
    memset(b, 0, sizeof *b);
    if (check_init(split, policy, shard_index, shard_count, err) < 0)
        return -1;
    /* A streamed split (stream.h) has no records in memory: the walk over
     * its files goes here, in place of the in-memory order below. */
    if (split->stream)
        return dp_batcher_stream_init(b, split, seed, shuffle, policy, shard_index, shard_count,
                                      err);
    if (!dp_split_in_memory(split))
        return dp_errf(err, "batcher: the split has no records in memory (images or values, "
                       "and labels)");
    uint32_t first, stride, n;
    shard_range(policy, split, (uint32_t)shard_index, (uint32_t)shard_count, &first, &stride,
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
    b->by_files = by_files(policy, split);
    b->seed = seed;
    b->shuffle = shuffle != 0;
    natural_order(b);
    return 0;
}

/* Position i of a by-blocks shard's order, in the epoch's order. */
static uint32_t block_position(const dp_batcher *b, uint32_t i)
{
    uint64_t blk = (uint64_t)(i / b->block) * b->stride + b->first;
    return (uint32_t)(blk * b->block + i % b->block);
}

int dp_batcher_blocks(dp_batcher *b, uint32_t block, dp_err *err)
{
    if (block == 0 || !b->perm || b->by_files)
        return dp_errf(err, "batcher: blocks of %u records need DATA sharding of records in "
                       "memory", block);
    /* the positions p < total whose block (p / block) is this shard's */
    uint32_t total = b->split->n, n = 0;
    for (uint64_t blk = b->first; blk * block < total; blk += b->stride) {
        uint64_t end = (blk + 1) * block;
        n += (uint32_t)((end < total ? end : total) - blk * block);
    }
    if (n == 0)
        return dp_errf(err, "batcher: shard %u of %u owns no block of %u of the %u records",
                       b->first, b->stride, block, total);
    uint32_t *order = realloc(b->order, (size_t)n * sizeof *order); /* may own more */
    if (!order)
        return dp_errf(err, "batcher: out of memory for %u record indices", n);
    b->order = order;
    b->block = block;
    b->n = n;
    for (uint32_t i = 0; i < n; i++)
        b->order[i] = block_position(b, i);
    b->pos = 0;
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
    dp_rng_seed(&r, dp_data_epoch_seed(b->seed, epoch));
    if (b->perm) {
        /* DATA: one shuffle of the whole split, the same in every worker;
         * this shard keeps every stride-th position of it. */
        uint32_t total = b->split->n;
        for (uint32_t i = 0; i < total; i++)
            b->perm[i] = i;
        dp_rng_shuffle(&r, b->perm, total);
        for (uint32_t i = 0; i < b->n; i++)
            b->order[i] = b->perm[b->block ? block_position(b, i)
                                           : b->first + (size_t)i * b->stride];
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
    long epoch = b->epoch > 0 ? b->epoch - 1 : 0; /* epochs started, so this one */
    if (k > 0 && b->augment)
        dp_split_gather_augment(x, y, b->split, idx, k, b->augment, epoch);
    else if (k > 0)
        dp_split_gather(x, y, b->split, idx, k);
    return k;
}

int dp_batcher_augment(dp_batcher *b, const dp_augment *a, dp_err *err)
{
    (void)err;
    b->augment = dp_augment_on(a) ? a : NULL;
    if (b->stream) /* a streamed split: its stream keys each record's draw */
        dp_stream_augment(b->stream, b->augment);
    return 0;
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
    /* Byte records become pixels / 255; float records are copied as they are. */
    const unsigned char *base = s->values ? (const unsigned char *)s->values : s->images;
    size_t row_bytes = s->values ? dim * sizeof(float) : dim;
    for (int i = lo; i < hi; i++) {
        size_t r = j->idx[i];
        if (i + 1 < hi) { /* rows are random: start fetching the next one now */
            const unsigned char *next = base + (size_t)j->idx[i + 1] * row_bytes;
            for (size_t o = 0; o < row_bytes; o += 64)
                __builtin_prefetch(next + o);
        }
        if (s->values)
            memcpy(j->x + (size_t)i * dim, s->values + r * dim, row_bytes);
        else
            dp_bytes_to_unit(j->x + (size_t)i * dim, s->images + r * dim, s->dim);
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
    if (!dp_split_in_memory(s)) { /* callers refuse such a split first: zeros, never a crash */
        memset(x, 0, (size_t)n * s->dim * sizeof *x);
        if (y)
            memset(y, 0, (size_t)n);
        return;
    }
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

uint32_t dp_shard_size(dp_shard_policy p, const dp_split *s, int k, int w)
{
    uint32_t first, stride, n;
    if (!s || w < 1 || k < 0 || k >= w)
        return 0;
    shard_range(p, s, (uint32_t)k, (uint32_t)w, &first, &stride, &n);
    return n;
}

uint32_t dp_shard_max(dp_shard_policy p, const dp_split *s, int w)
{
    uint32_t most = 0;
    for (int k = 0; k < w; k++) {
        uint32_t n = dp_shard_size(p, s, k, w);
        most = n > most ? n : most;
    }
    return most;
}

/* ---- gathering with augmentation (dp_augment_record per record) ---- */

typedef struct aug_job {
    float *x;
    uint8_t *y;
    const dp_split *s;
    const uint32_t *idx;
    int n;
    const dp_augment *a;
    long epoch;
} aug_job;

static void aug_rows(const aug_job *j, int lo, int hi)
{
    const dp_split *s = j->s;
    for (int i = lo; i < hi; i++) {
        size_t r = j->idx[i];
        dp_augment_record(j->x + (size_t)i * s->dim, s->values ? NULL : s->images + r * s->dim,
                          s->values ? s->values + r * s->dim : NULL, (uint32_t)r, j->a, j->epoch);
        if (j->y)
            j->y[i] = j->s->labels[j->idx[i]];
    }
}

static void aug_task(void *ctx, int i, int n_threads)
{
    const aug_job *j = ctx;
    size_t lo, hi;
    dp_pool_range((size_t)j->n, 1, i, n_threads, &lo, &hi);
    aug_rows(j, (int)lo, (int)hi);
}

/* Batches below this many values run on the calling thread (as the gather). */
#define AUG_MIN_SPLIT 32768

void dp_split_gather_augment(float *x, uint8_t *y, const dp_split *s, const uint32_t *idx, int n,
                             const dp_augment *a, long epoch)
{
    if (!dp_augment_on(a) || !dp_split_in_memory(s) || a->h == 0) {
        dp_split_gather(x, y, s, idx, n);
        return;
    }
    if (n <= 0)
        return;
    aug_job j = {x, y, s, idx, n, a, epoch};
    if ((size_t)n * s->dim < AUG_MIN_SPLIT)
        aug_rows(&j, 0, n);
    else
        dp_pool_run(aug_task, &j);
}
