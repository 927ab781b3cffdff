/* Splits of float records and FILE sharding over whole files (dataset.h):
 * dp_split_gather and the batcher copy float records bit for bit; under FILE
 * each of w workers owns files k, k+w, ... whole, one epoch of all workers
 * deals every record exactly once, files wholly past the split's end do not
 * count, fewer files than workers is refused with the fixes, one undivided
 * source keeps its contiguous blocks; dp_shard_size and dp_shard_max agree
 * with the batchers; dp_dataset_split carries values and file bounds; a
 * streamed split is refused where records must be in memory. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "downpour/dataset.h"
#include "downpour/rng.h"
#include "downpour/stream.h"

#define DIM 7
#define MAXREC 256

static dp_rng rng;
static float values[MAXREC * DIM];
static uint8_t labels[MAXREC];

/* Eight files of unequal sizes: 57 records. */
static const uint64_t eight_end[8] = {5, 6, 19, 26, 28, 49, 53, 57};

static dp_split float_split(uint32_t n, const uint64_t *file_end, uint32_t n_files)
{
    return (dp_split){.values = values, .labels = labels, .n = n, .dim = DIM,
                      .file_end = file_end, .n_files = n_files};
}

/* The file (index into file_end) record r lies in. */
static uint32_t file_of(const dp_split *s, uint32_t r)
{
    uint32_t f = 0;
    while (f < s->n_files && s->file_end[f] <= r)
        f++;
    return f;
}

static void test_float_gather(void)
{
    /* Rows copied as they are: the bits, -0 and a NaN included; below and
     * above the size at which the gather moves to the pool. */
    static const int batches[] = {1, 9, 256};
    dp_split s = float_split(MAXREC, NULL, 0);
    for (int t = 0; t < 3; t++) {
        int n = batches[t];
        uint32_t idx[MAXREC];
        for (int i = 0; i < n; i++)
            idx[i] = dp_rng_below(&rng, MAXREC);
        idx[0] = 0;
        idx[n - 1] = MAXREC - 1;
        float x[MAXREC * DIM];
        uint8_t y[MAXREC];
        memset(x, 0xab, sizeof x);
        dp_split_gather(x, y, &s, idx, n);
        int same = 1;
        for (int i = 0; i < n; i++)
            same &= memcmp(x + (size_t)i * DIM, values + (size_t)idx[i] * DIM,
                           DIM * sizeof(float)) == 0 && y[i] == labels[idx[i]];
        CHECKF(same, "dp_split_gather of %d float records: not the records' bits", n);
        /* past the batch, nothing written */
        if (n < MAXREC) {
            uint32_t marker;
            memcpy(&marker, x + (size_t)n * DIM, sizeof marker);
            CHECK(marker == 0xababababu);
        }
    }
    /* A big split crosses the pool's threshold (32768 values). */
    enum { BIG = 6000, BIGDIM = 13 };
    float *big = malloc((size_t)BIG * BIGDIM * sizeof *big);
    float *bx = malloc((size_t)4000 * BIGDIM * sizeof *bx);
    uint8_t *bl = malloc(BIG), *by = malloc(4000);
    uint32_t *bidx = malloc(4000 * sizeof *bidx);
    REQUIRE(big && bx && bl && by && bidx);
    for (size_t i = 0; i < (size_t)BIG * BIGDIM; i++)
        big[i] = (float)dp_rng_uniform(&rng) * 8.0f - 4.0f;
    for (int i = 0; i < BIG; i++)
        bl[i] = (uint8_t)dp_rng_below(&rng, 10);
    for (int i = 0; i < 4000; i++)
        bidx[i] = dp_rng_below(&rng, BIG);
    dp_split bs = {.values = big, .labels = bl, .n = BIG, .dim = BIGDIM};
    dp_split_gather(bx, by, &bs, bidx, 4000);
    int same = 1;
    for (int i = 0; i < 4000; i++)
        same &= memcmp(bx + (size_t)i * BIGDIM, big + (size_t)bidx[i] * BIGDIM,
                       BIGDIM * sizeof(float)) == 0 && by[i] == bl[bidx[i]];
    CHECKF(same, "dp_split_gather of 4000 float records (on the pool): not the records' bits");
    free(big), free(bx), free(bl), free(by), free(bidx);

    /* The batcher over a float split gives its epoch's records as they are. */
    dp_batcher b;
    dp_err err;
    REQUIRE(dp_batcher_init(&b, &s, 5, 1, DP_SHARD_DATA, 1, 3, &err) == 0);
    dp_batcher_start_epoch(&b, 2);
    float x[16 * DIM];
    uint8_t y[16];
    uint32_t pos = 0;
    int got, ok = 1;
    while ((got = dp_batcher_next(&b, x, y, 16)) > 0) {
        for (int i = 0; i < got; i++) {
            uint32_t r = b.order[pos + (uint32_t)i];
            ok &= memcmp(x + (size_t)i * DIM, values + (size_t)r * DIM, DIM * sizeof(float)) == 0;
            ok &= y[i] == labels[r];
        }
        pos += (uint32_t)got;
    }
    CHECKF(ok && pos == b.n, "batcher over a float split: %u of %u records, rows %s", pos, b.n,
           ok ? "equal" : "differ");
    dp_batcher_free(&b);
}

/* Under FILE over files, w workers' shards for several epochs: every record
 * once per epoch, each worker's records exactly its files k, k+w, ... whole
 * (ranks among the files holding records), shuffled within. */
static void check_file_shards(const dp_split *s, int w)
{
    dp_err err;
    /* the files holding records, in order: their index into file_end */
    uint32_t files[64], nf = 0;
    for (uint32_t f = 0, at = 0; f < s->n_files && at < s->n; f++) {
        uint32_t e = s->file_end[f] < s->n ? (uint32_t)s->file_end[f] : s->n;
        if (e > at) {
            files[nf++] = f;
            at = e;
        }
    }
    dp_batcher b[8];
    for (int k = 0; k < w; k++) {
        REQUIRE(dp_batcher_init(&b[k], s, 99, 1, DP_SHARD_FILE, k, w, &err) == 0);
        CHECK(b[k].n == dp_shard_size(DP_SHARD_FILE, s, k, w));
    }
    for (long epoch = 0; epoch < 3; epoch++) {
        uint32_t seen[MAXREC] = {0};
        for (int k = 0; k < w; k++) {
            dp_batcher_start_epoch(&b[k], epoch);
            uint32_t want = 0;
            for (uint32_t j = (uint32_t)k; j < nf; j += (uint32_t)w) {
                uint32_t f = files[j];
                uint32_t lo = f ? (uint32_t)s->file_end[f - 1] : 0;
                uint32_t hi = s->file_end[f] < s->n ? (uint32_t)s->file_end[f] : s->n;
                want += hi - lo;
            }
            CHECKF(b[k].n == want, "%d workers: worker %d owns %u records, its files hold %u", w,
                   k, b[k].n, want);
            int whole = 1;
            for (uint32_t i = 0; i < b[k].n; i++) {
                uint32_t r = b[k].order[i];
                REQUIRE(r < s->n);
                seen[r]++;
                uint32_t f = file_of(s, r), rank = 0;
                while (rank < nf && files[rank] != f)
                    rank++;
                whole &= rank < nf && rank % (uint32_t)w == (uint32_t)k;
            }
            CHECKF(whole, "%d workers, epoch %ld: worker %d holds a record of another's file", w,
                   epoch, k);
        }
        int once = 1;
        for (uint32_t r = 0; r < s->n; r++)
            once &= seen[r] == 1;
        CHECKF(once, "%d workers, epoch %ld: the shards do not deal every record once", w, epoch);
    }
    /* Shuffled within the shard, the order a function of (seed, epoch). */
    if (b[0].n > 3) {
        uint32_t e1[MAXREC], again[MAXREC];
        dp_batcher_start_epoch(&b[0], 1);
        memcpy(e1, b[0].order, b[0].n * sizeof *e1);
        dp_batcher_start_epoch(&b[0], 2);
        CHECK(memcmp(e1, b[0].order, b[0].n * sizeof *e1) != 0);
        dp_batcher_start_epoch(&b[0], 1);
        memcpy(again, b[0].order, b[0].n * sizeof *again);
        CHECK(memcmp(e1, again, b[0].n * sizeof *e1) == 0);
    }
    for (int k = 0; k < w; k++)
        dp_batcher_free(&b[k]);
}

static void test_file_shards(void)
{
    dp_split s = float_split(57, eight_end, 8);
    /* 8 files for 3 workers: files {0,3,6}, {1,4,7}, {2,5}: 5+7+4, 1+2+4, 13+21 */
    check_file_shards(&s, 3);
    CHECK(dp_shard_size(DP_SHARD_FILE, &s, 0, 3) == 16);
    CHECK(dp_shard_size(DP_SHARD_FILE, &s, 1, 3) == 7);
    CHECK(dp_shard_size(DP_SHARD_FILE, &s, 2, 3) == 34);
    CHECK(dp_shard_max(DP_SHARD_FILE, &s, 3) == 34);
    for (int w = 1; w <= 8; w++)
        check_file_shards(&s, w);

    /* The first 20 records: files 0..2 whole, 7 records of file 3, files
     * 4..7 wholly past the end and not counted. */
    dp_split cut = float_split(20, eight_end, 8);
    check_file_shards(&cut, 4);
    CHECK(dp_shard_size(DP_SHARD_FILE, &cut, 3, 4) == 1);
    dp_err err;
    dp_batcher b;
    CHECK(dp_batcher_init(&b, &cut, 1, 1, DP_SHARD_FILE, 0, 5, &err) == -1);
    CHECKF(strstr(err.msg, "has 4 files for 5 workers"), "%s", err.msg);

    /* Empty files hold no records and are not counted either. */
    static const uint64_t with_empty[6] = {0, 4, 4, 9, 9, 12};
    dp_split e = float_split(12, with_empty, 6);
    check_file_shards(&e, 3);
    CHECK(dp_batcher_init(&b, &e, 1, 1, DP_SHARD_FILE, 0, 4, &err) == -1);
    CHECKF(strstr(err.msg, "has 3 files for 4 workers"), "%s", err.msg);

    /* Fewer files than workers: refused with the reason and the fixes. */
    static const uint64_t three_end[3] = {10, 25, 31};
    dp_split three = float_split(31, three_end, 3);
    CHECK(dp_batcher_init(&b, &three, 1, 1, DP_SHARD_FILE, 2, 4, &err) == -1);
    CHECKF(strstr(err.msg, "FILE sharding gives each worker whole files, but the training split "
                           "has 3 files for 4 workers: use --shard data, or more files "
                           "(downpour data convert --shards 4 or more)"),
           "%s", err.msg);
    CHECK(b.order == NULL);
    /* DATA and OFF over the same files are unchanged. */
    REQUIRE(dp_batcher_init(&b, &three, 1, 0, DP_SHARD_DATA, 2, 4, &err) == 0);
    CHECK(b.n == 8 && b.order[0] == 2 && b.order[7] == 30);
    dp_batcher_free(&b);
    REQUIRE(dp_batcher_init(&b, &three, 1, 0, DP_SHARD_OFF, 3, 4, &err) == 0);
    CHECK(b.n == 31);
    dp_batcher_free(&b);

    /* Bounds that would leave records to no worker, or overlap, are refused. */
    static const uint64_t short_end[3] = {10, 25, 30};
    dp_split sh = float_split(31, short_end, 3);
    CHECK(dp_batcher_init(&b, &sh, 1, 1, DP_SHARD_FILE, 0, 2, &err) == -1);
    CHECKF(strstr(err.msg, "files end at record 30, but it has 31 records"), "%s", err.msg);
    static const uint64_t falling[3] = {10, 8, 31};
    dp_split fa = float_split(31, falling, 3);
    CHECK(dp_batcher_init(&b, &fa, 1, 1, DP_SHARD_FILE, 0, 2, &err) == -1);
    CHECKF(strstr(err.msg, "file 1 of the split ends at record 8, before file 0 does (10)"),
           "%s", err.msg);
    dp_split no_bounds = float_split(31, NULL, 3);
    CHECK(dp_batcher_init(&b, &no_bounds, 1, 1, DP_SHARD_FILE, 0, 2, &err) == -1);
    CHECKF(strstr(err.msg, "file_end is NULL"), "%s", err.msg);
    CHECK(dp_shard_size(DP_SHARD_FILE, &no_bounds, 0, 2) == 0); /* no crash */

    /* One undivided source (n_files 0): contiguous blocks, as before. */
    dp_split one = float_split(31, NULL, 0);
    REQUIRE(dp_batcher_init(&b, &one, 1, 0, DP_SHARD_FILE, 2, 4, &err) == 0);
    CHECK(b.n == 8 && b.order[0] == 15 && b.order[7] == 22);
    dp_batcher_free(&b);
}

/* dp_shard_size and dp_shard_max against the batchers' n, every policy. */
static void test_sizes(void)
{
    static const uint64_t one_big[4] = {3, 50, 52, 57};
    dp_split splits[4] = {float_split(57, eight_end, 8), float_split(57, NULL, 0),
                          float_split(40, eight_end, 8), float_split(57, one_big, 4)};
    dp_err err;
    for (int si = 0; si < 4; si++)
        for (int p = 0; p < DP_SHARD_COUNT; p++)
            for (int w = 1; w <= 8; w++) {
                uint32_t most = 0, sum = 0;
                int refused = 0;
                for (int k = 0; k < w; k++) {
                    dp_batcher b;
                    uint32_t want = dp_shard_size((dp_shard_policy)p, &splits[si], k, w);
                    if (dp_batcher_init(&b, &splits[si], 3, 1, (dp_shard_policy)p, k, w, &err) <
                        0) {
                        refused = 1;
                        continue;
                    }
                    CHECKF(b.n == want, "split %d, policy %s, shard %d of %d: batcher %u, "
                           "dp_shard_size %u", si, dp_shard_name((dp_shard_policy)p), k, w, b.n,
                           want);
                    most = b.n > most ? b.n : most;
                    sum += b.n;
                    dp_batcher_free(&b);
                }
                if (refused) /* FILE with fewer files than workers */
                    continue;
                CHECKF(dp_shard_max((dp_shard_policy)p, &splits[si], w) == most,
                       "split %d, policy %s, %d workers: dp_shard_max %u, largest batcher %u",
                       si, dp_shard_name((dp_shard_policy)p), w,
                       dp_shard_max((dp_shard_policy)p, &splits[si], w), most);
                CHECK(sum == (p == DP_SHARD_OFF ? (uint32_t)w : 1u) * splits[si].n);
            }
    /* one big file: its worker's shard is far above the mean */
    CHECK(dp_shard_max(DP_SHARD_FILE, &splits[3], 2) == 52);
    CHECK(dp_shard_size(DP_SHARD_FILE, &splits[3], 0, 0) == 0);
    CHECK(dp_shard_size(DP_SHARD_FILE, NULL, 0, 1) == 0);
    CHECK(dp_shard_max(DP_SHARD_DATA, &splits[1], 0) == 0);
}

/* dp_dataset_split keeps the values and the file bounds of the training
 * records; the validation records are the values after them. */
static void test_dataset_split(void)
{
    dp_dataset ds;
    memset(&ds, 0, sizeof ds);
    snprintf(ds.dir, sizeof ds.dir, "floats");
    ds.train_all = float_split(57, eight_end, 8);
    dp_split tr, va;
    dp_err err;
    REQUIRE(dp_dataset_split(&ds, 20, 30, &tr, &va, &err) == 0);
    CHECK(tr.values == values && tr.images == NULL && tr.labels == labels && tr.n == 20);
    CHECK(tr.file_end == eight_end && tr.n_files == 4 && tr.dim == DIM); /* the files holding its records */
    CHECK(va.values == values + 20 * DIM && va.labels == labels + 20 && va.n == 30);
    CHECK(va.images == NULL && va.n_files == 0 && va.file_end == NULL);
    /* the training records' files: 0..2 whole and part of 3 */
    CHECK(dp_shard_max(DP_SHARD_FILE, &tr, 4) == 13);
}

/* A streamed split has no records in memory: the batcher refuses one
 * without files, and a gather from it gives zeros rather than reading
 * through NULL. */
static void test_streamed(void)
{
    static dp_stream_source src;
    dp_split s = {.n = 40, .dim = DIM, .stream = &src};
    dp_err err;
    dp_batcher b;
    CHECK(!dp_split_in_memory(&s) && dp_split_in_memory(&(dp_split){.values = values,
                                                                       .labels = labels}));
    /* the batcher walks a streamed split through a stream (test_stream.c),
     * which needs the source's files */
    CHECK(dp_batcher_init(&b, &s, 1, 1, DP_SHARD_DATA, 0, 1, &err) == -1);
    CHECKF(strstr(err.msg, "the split has no record files"), "%s", err.msg);
    dp_split none = {.n = 40, .dim = DIM};
    CHECK(dp_batcher_init(&b, &none, 1, 1, DP_SHARD_DATA, 0, 1, &err) == -1);
    CHECKF(strstr(err.msg, "no records in memory"), "%s", err.msg);
    float x[2 * DIM];
    uint8_t y[2] = {7, 7};
    uint32_t idx[2] = {0, 39};
    memset(x, 0xab, sizeof x);
    dp_split_gather(x, y, &s, idx, 2);
    int zero = y[0] == 0 && y[1] == 0;
    for (int i = 0; i < 2 * DIM; i++)
        zero &= x[i] == 0.0f;
    CHECK(zero);
}

int main(void)
{
    dp_rng_seed(&rng, 77);
    for (size_t i = 0; i < sizeof values / sizeof *values; i++)
        values[i] = (float)dp_rng_uniform(&rng) * 2.0f - 1.0f;
    values[3] = -0.0f;
    values[MAXREC * DIM - 2] = NAN;
    for (int i = 0; i < MAXREC; i++)
        labels[i] = (uint8_t)dp_rng_below(&rng, 10);
    test_float_gather();
    test_file_shards();
    test_sizes();
    test_dataset_split();
    test_streamed();
    return CHECK_DONE();
}
