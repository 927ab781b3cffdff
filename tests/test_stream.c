/* Streaming (stream.h): TFRecord files of Examples holding more decoded
 * bytes than the stream's memory bound are walked, with the reader thread
 * and inline, and every epoch gives every record of the split exactly once
 * (the split ends inside the last file), in an order fixed by (seed, epoch)
 * alone, whether the epoch follows one the reader read on from or starts
 * afresh; DATA and FILE shards together give it exactly once too, and FILE
 * with fewer files than workers is refused; a window of 1 is file order;
 * a seek continues as the uninterrupted epoch, decoding at most the window
 * and queue whatever its place (TFRecord raw and PNG, .npy, CSV, every
 * policy, thread and inline); the stream's peak bytes stay
 * under the bound, which stays under the dataset's bytes; a record damaged
 * after counting fails the batch naming the file and the record; closing
 * mid-epoch joins the reader.  Float features come through exact.  With
 * --augment each record gets the values a gather from memory gives it, in
 * either reader mode and after a seek.  Through
 * the batcher, a small MLP trained on streamed batches ends with the same
 * bits as one trained on the same records gathered from memory.
 *
 * The bound is checked by the test's own accounting too, not only by the
 * stream's report of itself: the heap's growth (glibc's mallinfo2) from
 * before a stream opens to its peak over epochs stays within the stream's
 * bound, for raw, PNG and gzip records, and from before a dataset opens
 * (test, validation and stream together) within the dataset's budget. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__GLIBC__) /* (stdio.h brings glibc's features.h) */
#include <malloc.h>
#endif

#include "check.h"
#include "example_file.h"
#include "downpour/augment.h"
#include "downpour/dataset.h"
#include "downpour/example.h"
#include "downpour/model.h"
#include "downpour/optim.h"
#include "downpour/png.h"
#include "downpour/records.h"
#include "downpour/stream.h"
#include "downpour/tfrecord.h"
#include "scratch.h"

#define DIM 784
#define NFILES 5
#define MAXN 2000
static const uint32_t per_file[NFILES] = {300, 250, 310, 280, 260}; /* 1,400 records */

static char scratch[1024];

static const char *path_of(const char *dir, const char *name)
{
    static char buf[4][1200];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s/%s", scratch, dir, name);
    return buf[k];
}

/* Record id's pixels: its id in the first two bytes, then a pattern. */
static void pixels_of(uint8_t *px, uint32_t id)
{
    uint32_t x = 2463534242u ^ (id * 2654435761u);
    px[0] = (uint8_t)(id & 0xff);
    px[1] = (uint8_t)(id >> 8);
    for (size_t i = 2; i < DIM; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        px[i] = (uint8_t)x;
    }
}

/* A file of n raw-byte Examples, records first .. first+n-1. */
static void write_bytes_file(const char *path, uint32_t first, uint32_t n)
{
    dp_tfrecord_writer *w;
    dp_err err;
    REQUIRE(dp_tfrecord_writer_open(&w, path, DP_TFRECORD_RAW, &err) == 0);
    uint8_t px[DIM];
    for (uint32_t i = 0; i < n; i++) {
        pixels_of(px, first + i);
        dp_bytes b = {px, DIM};
        int64_t label = (first + i) % 10;
        const dp_feature fs[2] = {{"image", DP_FEATURE_BYTES, 1, &b, NULL, NULL},
                                  {"label", DP_FEATURE_INT64, 1, NULL, NULL, &label}};
        write_example(w, fs, 2);
    }
    REQUIRE(dp_tfrecord_writer_close(w, &err) == 0);
}

/* A file of n raw-byte Examples whose record `big` carries a feature "pad"
 * of pad bytes beside its image. */
static void write_padded_file(const char *path, uint32_t n, uint32_t big, size_t pad)
{
    dp_tfrecord_writer *w;
    dp_err err;
    REQUIRE(dp_tfrecord_writer_open(&w, path, DP_TFRECORD_RAW, &err) == 0);
    uint8_t px[DIM], *zeros = calloc(pad, 1);
    REQUIRE(zeros);
    for (uint32_t i = 0; i < n; i++) {
        pixels_of(px, i);
        dp_bytes b = {px, DIM}, z = {zeros, pad};
        int64_t label = i % 10;
        const dp_feature fs[3] = {{"image", DP_FEATURE_BYTES, 1, &b, NULL, NULL},
                                  {"label", DP_FEATURE_INT64, 1, NULL, NULL, &label},
                                  {"pad", DP_FEATURE_BYTES, 1, &z, NULL, NULL}};
        write_example(w, fs, i == big ? 3 : 2);
    }
    free(zeros);
    REQUIRE(dp_tfrecord_writer_close(w, &err) == 0);
}

/* A file of n PNG Examples (28x28 gray, as TFDS stores MNIST), records
 * first .. first+n-1 with pixels_of's values; gzip for a ".gz" name. */
static void write_png_file(const char *path, uint32_t first, uint32_t n)
{
    dp_tfrecord_writer *w;
    dp_err err;
    REQUIRE(dp_tfrecord_writer_open(&w, path, DP_TFRECORD_AUTO, &err) == 0);
    uint8_t px[DIM];
    dp_png_buf png = {0};
    for (uint32_t i = 0; i < n; i++) {
        pixels_of(px, first + i);
        REQUIRE(dp_png_encode(&png, px, 28, 28, 1, &err) == 0);
        dp_bytes b = {png.data, png.len};
        int64_t label = (first + i) % 10;
        const dp_feature fs[2] = {{"image", DP_FEATURE_BYTES, 1, &b, NULL, NULL},
                                  {"label", DP_FEATURE_INT64, 1, NULL, NULL, &label}};
        write_example(w, fs, 2);
    }
    dp_png_buf_free(&png);
    REQUIRE(dp_tfrecord_writer_close(w, &err) == 0);
}

/* A file of n float-list Examples of 7 values: record id's are id + j/8. */
static void write_float_file(const char *path, uint32_t first, uint32_t n)
{
    dp_tfrecord_writer *w;
    dp_err err;
    REQUIRE(dp_tfrecord_writer_open(&w, path, DP_TFRECORD_RAW, &err) == 0);
    for (uint32_t i = 0; i < n; i++) {
        float v[7];
        for (int j = 0; j < 7; j++)
            v[j] = (float)(first + i) + (float)j / 8.0f;
        int64_t label = (first + i) % 3;
        const dp_feature fs[2] = {{"image", DP_FEATURE_FLOAT, 7, NULL, v, NULL},
                                  {"label", DP_FEATURE_INT64, 1, NULL, NULL, &label}};
        write_example(w, fs, 2);
    }
    REQUIRE(dp_tfrecord_writer_close(w, &err) == 0);
}

/* A dataset found and counted, and a streamed split of its first n
 * training records. */
typedef struct ds {
    dp_data_files files;
    dp_stream_source src;
    dp_split split;
} ds;

static void ds_open(ds *d, const char *dir, uint32_t n, size_t memory, uint32_t window)
{
    dp_err err;
    dp_data_options opt;
    dp_data_options_default(&opt);
    char spec[1200];
    snprintf(spec, sizeof spec, "%s/%s", scratch, dir);
    memset(d, 0, sizeof *d);
    REQUIRE(dp_data_files_find(&d->files, spec, &opt, &err) == 0);
    if (dp_data_files_count(&d->files, &opt, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        REQUIRE(0);
    }
    REQUIRE(n <= d->files.train.records);
    d->src = (dp_stream_source){.files = &d->files.train, .format = d->files.format,
                                .shape = d->files.shape, .opt = opt, .memory = memory,
                                .window = window};
    d->split = (dp_split){.n = n, .dim = d->files.shape.dim, .stream = &d->src};
}

static dp_stream *open_ok(const ds *d, dp_shard_policy p, int k, int w, uint64_t seed,
                          int shuffle, int max_batch)
{
    dp_stream *s = NULL;
    dp_err err;
    if (dp_stream_open(&s, &d->split, p, k, w, seed, shuffle, max_batch, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        REQUIRE(0);
    }
    return s;
}

static float xb[64 * DIM];
static uint8_t yb[64];

/* The record id of row i of xb, checking its pixels and label. */
static uint32_t id_of(int i)
{
    const float *x = xb + (size_t)i * DIM;
    uint32_t id = (uint32_t)(x[0] * 255.0f + 0.5f) | (uint32_t)(x[1] * 255.0f + 0.5f) << 8;
    uint8_t px[DIM];
    pixels_of(px, id);
    int same = yb[i] == id % 10;
    for (int j = 0; j < DIM && same; j++)
        same = x[j] == (float)px[j] / 255.0f;
    CHECKF(same, "record %u's values or label came out changed", id);
    return id;
}

/* One epoch's record ids in order; returns how many. */
static uint32_t epoch_ids(dp_stream *s, long epoch, uint32_t *ids, int batch)
{
    dp_err err;
    REQUIRE(dp_stream_start_epoch(s, epoch, &err) == 0);
    uint32_t n = 0;
    int got;
    while ((got = dp_stream_next(s, xb, yb, batch, &err)) > 0) {
        for (int i = 0; i < got; i++) {
            REQUIRE(n < MAXN);
            ids[n++] = id_of(i);
        }
    }
    CHECKF(got == 0, "%s", err.msg);
    return n;
}

/* ids[0..n) holds each of want[0..m) exactly once (counts in seen[]). */
static int exactly_once(const uint32_t *ids, uint32_t n, uint32_t total)
{
    static uint32_t seen[MAXN];
    memset(seen, 0, sizeof seen);
    for (uint32_t i = 0; i < n; i++) {
        if (ids[i] >= total)
            return 0;
        seen[ids[i]]++;
    }
    for (uint32_t i = 0; i < total; i++)
        if (seen[i] != 1)
            return 0;
    return n == total;
}

static uint32_t file_of(uint32_t id)
{
    uint32_t f = 0, end = per_file[0];
    while (id >= end)
        end += per_file[++f];
    return f;
}

#define N 1340 /* the split: ends 200 records into the last file */

static uint32_t a[MAXN], b2[MAXN], c[MAXN];

static void test_epochs(const ds *d, const char *mode)
{
    setenv("DOWNPOUR_STREAM_READER", mode, 1);
    dp_stream *s = open_ok(d, DP_SHARD_OFF, 0, 1, 42, 1, 32);
    CHECK(dp_stream_threaded(s) == (strcmp(mode, "thread") == 0));
    CHECK(dp_stream_records(s) == N);
    uint32_t w = dp_stream_window(s);
    CHECKF(w >= 32 && w < N, "window %u", w);
    uint32_t n0 = epoch_ids(s, 0, a, 32);
    CHECKF(exactly_once(a, n0, N), "%s: epoch 0 gives each of the %u records once", mode, N);
    uint32_t n1 = epoch_ids(s, 1, b2, 32);
    CHECK(exactly_once(b2, n1, N));
    CHECK(memcmp(a, b2, sizeof(uint32_t) * N) != 0);
    size_t peak = dp_stream_peak_bytes(s);
    CHECKF(peak <= d->src.memory && d->src.memory < (size_t)N * DIM,
           "peak %zu, bound %zu, dataset %zu bytes", peak, d->src.memory, (size_t)N * DIM);
    CHECK(peak >= (size_t)w * DIM);
    dp_stream_close(s);

    /* the same seed again, another batch size: the same order */
    s = open_ok(d, DP_SHARD_OFF, 0, 1, 42, 1, 32);
    CHECK(epoch_ids(s, 1, c, 7) == N && memcmp(c, b2, sizeof(uint32_t) * N) == 0);
    CHECK(epoch_ids(s, 0, c, 32) == N && memcmp(c, a, sizeof(uint32_t) * N) == 0);

    /* seek: forward, backward, to the end, continuing as the whole epoch */
    const uint32_t pos[] = {37, 500, 3, N - 3, N, 0};
    for (size_t t = 0; t < sizeof pos / sizeof *pos; t++) {
        dp_err err;
        REQUIRE(dp_stream_start_epoch(s, 1, &err) == 0);
        if (t % 2) { /* mid-epoch first: a seek behind where it is */
            REQUIRE(dp_stream_next(s, xb, yb, 32, &err) == 32);
            REQUIRE(dp_stream_next(s, xb, yb, 32, &err) == 32);
        }
        CHECKF(dp_stream_seek(s, pos[t], &err) == 0, "%s", err.msg);
        uint32_t n = 0;
        int got;
        while ((got = dp_stream_next(s, xb, yb, 32, &err)) > 0)
            for (int i = 0; i < got; i++)
                c[n++] = id_of(i);
        CHECKF(n == N - pos[t] && memcmp(c, b2 + pos[t], sizeof(uint32_t) * n) == 0,
               "%s: seek to %u continues the epoch", mode, pos[t]);
    }
    /* epoch 0 read through but its window not drained: epoch 1 (which the
     * reader has gone on into) is still the whole epoch, in its order */
    dp_err err;
    REQUIRE(dp_stream_start_epoch(s, 0, &err) == 0);
    for (int k = 0; k < (N - 5) / 5; k++)
        REQUIRE(dp_stream_next(s, xb, yb, 5, &err) == 5);
    CHECK(epoch_ids(s, 1, c, 32) == N && memcmp(c, b2, sizeof(uint32_t) * N) == 0);
    CHECK(epoch_ids(s, 2, c, 32) == N && exactly_once(c, N, N));
    CHECK(epoch_ids(s, 1, c, 32) == N && memcmp(c, b2, sizeof(uint32_t) * N) == 0);
    dp_stream_close(s);

    /* another seed: another order */
    s = open_ok(d, DP_SHARD_OFF, 0, 1, 43, 1, 32);
    CHECK(epoch_ids(s, 0, c, 32) == N && memcmp(c, a, sizeof(uint32_t) * N) != 0);
    dp_stream_close(s);
}

/* --augment on a stream: each record gets the values a gather from memory
 * gives it (the draw keyed on its index in the split, not on its place in
 * the window), so an epoch's rows are, as a set, the in-memory split's
 * augmented rows; a seek continues the augmented epoch. */
static float aug_rows[2][(size_t)N * DIM], aug_ref[(size_t)N * DIM];
static uint8_t aug_images[(size_t)N * DIM], aug_labels[N];

static int cmp_row(const void *x, const void *y) { return memcmp(x, y, DIM * sizeof(float)); }

static void test_augment(const ds *d, const char *mode)
{
    setenv("DOWNPOUR_STREAM_READER", mode, 1);
    dp_err err;
    dp_augment au;
    REQUIRE(dp_augment_parse("crop:3,flip", &au, &err) == 0);
    au.seed = 7;
    const dp_record_shape *sh = &d->files.shape;
    REQUIRE(dp_augment_check(&au, sh->rows, sh->cols, sh->channels, sh->dim, &err) == 0);
    for (uint32_t id = 0; id < N; id++) {
        pixels_of(aug_images + (size_t)id * DIM, id);
        aug_labels[id] = (uint8_t)(id % 10);
    }
    dp_split mem = {.images = aug_images, .labels = aug_labels, .n = N, .dim = DIM};
    dp_stream *s = open_ok(d, DP_SHARD_OFF, 0, 1, 42, 1, 32);
    dp_stream_augment(s, &au);
    for (long e = 0; e < 2; e++) {
        REQUIRE(dp_stream_start_epoch(s, e, &err) == 0);
        uint32_t n = 0;
        int got;
        while ((got = dp_stream_next(s, aug_rows[e] + (size_t)n * DIM, yb, 32, &err)) > 0)
            n += (uint32_t)got;
        REQUIRE(n == N);
        for (uint32_t id = 0; id < N; id++)
            dp_split_gather_augment(aug_ref + (size_t)id * DIM, NULL, &mem, &id, 1, &au, e);
        static float sorted[(size_t)N * DIM];
        memcpy(sorted, aug_rows[e], sizeof sorted);
        qsort(sorted, N, DIM * sizeof(float), cmp_row);
        qsort(aug_ref, N, DIM * sizeof(float), cmp_row);
        CHECKF(memcmp(sorted, aug_ref, sizeof sorted) == 0,
               "%s: epoch %ld's streamed rows are not the split's augmented rows", mode, e);
    }
    CHECK(memcmp(aug_rows[0], aug_rows[1], sizeof aug_rows[0]) != 0);
    /* a seek into epoch 1 continues it, augmented alike */
    REQUIRE(dp_stream_start_epoch(s, 1, &err) == 0);
    REQUIRE(dp_stream_seek(s, 500, &err) == 0);
    static float rest[(size_t)N * DIM];
    uint32_t n = 0;
    int got;
    while ((got = dp_stream_next(s, rest + (size_t)n * DIM, yb, 32, &err)) > 0)
        n += (uint32_t)got;
    CHECK(n == N - 500 &&
          memcmp(rest, aug_rows[1] + (size_t)500 * DIM, (size_t)n * DIM * sizeof(float)) == 0);
    dp_stream_close(s);
}

/* The same orders with the reader thread and inline. */
static void test_modes_agree(const ds *d)
{
    setenv("DOWNPOUR_STREAM_READER", "thread", 1);
    dp_stream *s = open_ok(d, DP_SHARD_DATA, 1, 3, 9, 1, 16);
    uint32_t n = epoch_ids(s, 2, a, 16);
    dp_stream_close(s);
    setenv("DOWNPOUR_STREAM_READER", "inline", 1);
    s = open_ok(d, DP_SHARD_DATA, 1, 3, 9, 1, 16);
    CHECK(epoch_ids(s, 2, c, 16) == n && memcmp(a, c, sizeof(uint32_t) * n) == 0);
    dp_stream_close(s);
    /* the default: timed inline first, then a thread or not; the same order */
    unsetenv("DOWNPOUR_STREAM_READER");
    s = open_ok(d, DP_SHARD_DATA, 1, 3, 9, 1, 16);
    CHECK(dp_stream_threaded(s) == 0);
    CHECK(epoch_ids(s, 2, c, 16) == n && memcmp(a, c, sizeof(uint32_t) * n) == 0);
    fprintf(stderr, "the default reader chose %s\n", dp_stream_threaded(s) ? "a thread" : "inline");
    dp_stream_close(s);
    setenv("DOWNPOUR_STREAM_READER", "sideways", 1);
    dp_err err;
    CHECK(dp_stream_open(&s, &d->split, DP_SHARD_OFF, 0, 1, 1, 1, 8, &err) == -1 && !s);
    CHECK(strstr(err.msg, "DOWNPOUR_STREAM_READER") != NULL);
    unsetenv("DOWNPOUR_STREAM_READER");
}

static void test_shards(const ds *d)
{
    static uint32_t all[MAXN];
    /* DATA: worker k keeps the split indices k mod w */
    for (int w = 2; w <= 3; w++) {
        uint32_t total = 0;
        for (int k = 0; k < w; k++) {
            dp_stream *s = open_ok(d, DP_SHARD_DATA, k, w, 5, 1, 16);
            uint32_t n = epoch_ids(s, 0, all + total, 16);
            CHECK(n == dp_stream_records(s) && n == (N - (uint32_t)k + (uint32_t)w - 1) / (uint32_t)w);
            for (uint32_t i = 0; i < n; i++)
                CHECKF(all[total + i] % (uint32_t)w == (uint32_t)k, "DATA %d/%d got record %u",
                       k, w, all[total + i]);
            total += n;
            dp_stream_close(s);
        }
        CHECKF(exactly_once(all, total, N), "DATA over %d workers: each record once", w);
    }
    /* FILE: worker k reads files k, k+w, ... whole (the last one up to N) */
    for (int w = 2; w <= 5; w += 3) {
        uint32_t total = 0;
        for (int k = 0; k < w; k++) {
            dp_stream *s = open_ok(d, DP_SHARD_FILE, k, w, 5, 1, 16);
            uint32_t n = epoch_ids(s, 1, all + total, 16);
            uint32_t want = 0;
            for (uint32_t f = (uint32_t)k; f < NFILES; f += (uint32_t)w)
                want += f == NFILES - 1 ? per_file[f] - (1400 - N) : per_file[f];
            CHECKF(n == want && n == dp_stream_records(s), "FILE %d/%d: %u records, want %u", k,
                   w, n, want);
            for (uint32_t i = 0; i < n; i++)
                CHECK(file_of(all[total + i]) % (uint32_t)w == (uint32_t)k);
            total += n;
            dp_stream_close(s);
        }
        CHECKF(exactly_once(all, total, N), "FILE over %d workers: each record once", w);
    }
    dp_err err;
    dp_stream *s = NULL;
    CHECK(dp_stream_open(&s, &d->split, DP_SHARD_FILE, 0, 6, 5, 1, 16, &err) == -1 && !s);
    CHECKF(strcmp(err.msg, "FILE sharding gives each worker whole files, but the training split "
                           "has 5 files for 6 workers: use --shard data, or more files (downpour "
                           "data convert --shards 6 or more)") == 0, "%s", err.msg);
    uint32_t n;
    CHECK(dp_stream_shard_records(&d->split, DP_SHARD_FILE, 5, 6, &n, &err) == -1);
    CHECK(dp_stream_shard_records(&d->split, DP_SHARD_DATA, 3, 4, &n, &err) == 0 &&
          n == (N - 3 + 3) / 4);
}

static void test_file_order(const ds *d)
{
    /* shuffle off: name order, the records as written */
    dp_stream *s = open_ok(d, DP_SHARD_OFF, 0, 1, 1, 0, 32);
    CHECK(dp_stream_window(s) == 1);
    uint32_t n = epoch_ids(s, 3, a, 32);
    int ok = n == N;
    for (uint32_t i = 0; i < n && ok; i++)
        ok = a[i] == i;
    CHECK(ok);
    dp_stream_close(s);

    /* window 1, shuffle on: the files in a shuffled order, each file whole
     * and in its own order */
    ds one = *d;
    one.src.window = 1;
    one.split.stream = &one.src;
    s = open_ok(&one, DP_SHARD_OFF, 0, 1, 1, 1, 32);
    CHECK(dp_stream_window(s) == 1);
    n = epoch_ids(s, 0, a, 32);
    CHECK(exactly_once(a, n, N));
    int runs = 1, in_order = 1;
    for (uint32_t i = 1; i < n; i++) {
        if (file_of(a[i]) != file_of(a[i - 1]))
            runs++;
        else
            in_order &= a[i] == a[i - 1] + 1;
    }
    CHECKF(runs == NFILES && in_order, "window 1: %d runs of files", runs);
    int sorted = 1;
    for (uint32_t i = 1; i < n; i++)
        sorted &= a[i] > a[i - 1];
    CHECK(!sorted); /* (seed 1 shuffles these five files) */
    dp_stream_close(s);
}

static void test_bounds(const ds *d)
{
    ds small = *d;
    small.split.stream = &small.src;
    small.src.memory = 60000;
    dp_stream *s = NULL;
    dp_err err;
    CHECK(dp_stream_open(&s, &small.split, DP_SHARD_OFF, 0, 1, 1, 1, 32, &err) == -1 && !s);
    CHECKF(strstr(err.msg, "memory bound of 60000 bytes is too small") != NULL, "%s", err.msg);
    small.src.memory = d->src.memory;
    small.src.window = 5000;
    CHECK(dp_stream_open(&s, &small.split, DP_SHARD_OFF, 0, 1, 1, 1, 32, &err) == -1 && !s);
    CHECKF(strstr(err.msg, "a window of 5000 records") != NULL, "%s", err.msg);
    /* a bound that holds all: the window is the split, a full shuffle */
    small.src.window = 0;
    small.src.memory = (size_t)8 << 20;
    s = open_ok(&small, DP_SHARD_OFF, 0, 1, 1, 1, 32);
    CHECK(dp_stream_window(s) == N);
    dp_stream_close(s);
}

/* Closing mid-epoch, and starting over mid-epoch, with the reader blocked
 * on a full queue: nothing leaks or hangs. */
static void test_close_mid_epoch(const ds *d)
{
    setenv("DOWNPOUR_STREAM_READER", "thread", 1);
    dp_err err;
    for (int t = 0; t < 20; t++) {
        dp_stream *s = open_ok(d, DP_SHARD_OFF, 0, 1, (uint64_t)t, 1, 32);
        REQUIRE(dp_stream_start_epoch(s, 0, &err) == 0);
        if (t % 2)
            CHECK(dp_stream_next(s, xb, yb, 32, &err) == 32);
        if (t % 3 == 0) {
            CHECK(dp_stream_start_epoch(s, 1, &err) == 0);
            CHECK(dp_stream_next(s, xb, yb, 5, &err) == 5);
        }
        dp_stream_close(s);
    }
    dp_stream_close(NULL);
    unsetenv("DOWNPOUR_STREAM_READER");
}

/* A record damaged after the files were counted. */
static void test_corrupt(const char *mode)
{
    setenv("DOWNPOUR_STREAM_READER", mode, 1);
    char dir[64], p[1200];
    snprintf(dir, sizeof dir, "bad-%s", mode);
    snprintf(p, sizeof p, "%s/%s", scratch, dir);
    REQUIRE(mkdir(p, 0755) == 0);
    write_bytes_file(path_of(dir, "d-train-0.tfrecord"), 0, 300);
    write_bytes_file(path_of(dir, "d-train-1.tfrecord"), 300, 250);
    write_bytes_file(path_of(dir, "d-test.tfrecord"), 5000, 20);
    ds d;
    ds_open(&d, dir, 500, 256 << 10, 0);
    /* record 17 of the second file: its data starts at 17 * (record size) + 12 */
    const char *victim = d.files.train.files[1].path;
    size_t len;
    unsigned char *bytes = read_bytes(victim, &len);
    size_t rec = len / 250;
    REQUIRE(rec * 250 == len);
    bytes[17 * rec + 12 + 40] ^= 0x20;
    write_bytes(victim, bytes, len);
    free(bytes);
    dp_stream *s = open_ok(&d, DP_SHARD_OFF, 0, 1, 3, 0, 32);
    dp_err err;
    REQUIRE(dp_stream_start_epoch(s, 0, &err) == 0);
    int got, batches = 0;
    while ((got = dp_stream_next(s, xb, yb, 32, &err)) > 0)
        batches++;
    CHECK(got == -1);
    CHECKF(strstr(err.msg, victim) && strstr(err.msg, "record 17"), "%s", err.msg);
    CHECK(batches == (300 + 17) / 32); /* the records before it came out */
    dp_err again;
    CHECK(dp_stream_next(s, xb, yb, 32, &again) == -1 && strcmp(again.msg, err.msg) == 0);
    /* a new epoch reads again and meets it again */
    REQUIRE(dp_stream_start_epoch(s, 1, &err) == 0);
    CHECK(dp_stream_seek(s, 400, &err) == -1 && strstr(err.msg, "record 17"));
    dp_stream_close(s);
    dp_data_files_free(&d.files);
    unsetenv("DOWNPOUR_STREAM_READER");
}

static void test_floats(void)
{
    ds d;
    ds_open(&d, "floats", 130, 256 << 10, 0);
    CHECK(d.files.shape.kind == DP_VALUES_F32 && d.files.shape.dim == 7);
    dp_stream *s = open_ok(&d, DP_SHARD_DATA, 1, 2, 8, 1, 10);
    dp_err err;
    REQUIRE(dp_stream_start_epoch(s, 0, &err) == 0);
    static uint32_t seen[200];
    int got, bad = 0;
    uint32_t n = 0;
    float x[10 * 7];
    uint8_t y[10];
    while ((got = dp_stream_next(s, x, y, 10, &err)) > 0) {
        for (int i = 0; i < got; i++) {
            uint32_t id = (uint32_t)x[i * 7];
            for (int j = 0; j < 7; j++)
                bad += x[i * 7 + j] != (float)id + (float)j / 8.0f;
            bad += y[i] != id % 3 || id % 2 != 1 || id >= 130;
            if (id < 200)
                seen[id]++;
            n++;
        }
    }
    CHECK(got == 0 && bad == 0 && n == 65);
    for (uint32_t i = 1; i < 130; i += 2)
        CHECK(seen[i] == 1);
    dp_stream_close(s);
    dp_data_files_free(&d.files);
}

/* A .npy file of a uint8 array of the given shape (numpy's format 1.0). */
static void write_npy_u8(const char *path, const uint8_t *data, uint32_t rows, uint32_t cols)
{
    char head[128];
    int n = cols ? snprintf(head, sizeof head, "{'descr': '|u1', 'fortran_order': False, "
                            "'shape': (%u, %u), }", rows, cols)
                 : snprintf(head, sizeof head, "{'descr': '|u1', 'fortran_order': False, "
                            "'shape': (%u,), }", rows);
    size_t total = 10 + (size_t)n + 1, pad = (64 - total % 64) % 64;
    size_t hl = (size_t)n + pad + 1, len = 10 + hl + (size_t)rows * (cols ? cols : 1);
    uint8_t *buf = malloc(len);
    REQUIRE(buf);
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (uint8_t)(hl & 0xff);
    buf[9] = (uint8_t)(hl >> 8);
    memcpy(buf + 10, head, (size_t)n);
    memset(buf + 10 + n, ' ', pad);
    buf[10 + hl - 1] = '\n';
    memcpy(buf + 10 + hl, data, (size_t)rows * (cols ? cols : 1));
    write_bytes(path, buf, len);
    free(buf);
}

/* CSV and .npy datasets stream as TFRecord ones do. */
static void test_csv_npy(void)
{
    char p[1200];
    snprintf(p, sizeof p, "%s/csv", scratch);
    REQUIRE(mkdir(p, 0755) == 0);
    for (int f = 0; f < 3; f++) {
        FILE *out = fopen(path_of("csv", f == 2 ? "c-test.csv" : f ? "c-train-1.csv"
                                                                   : "c-train-0.csv"), "w");
        REQUIRE(out);
        fprintf(out, "label,a,b,c\n");
        for (int i = 0; i < 60; i++) {
            int id = f * 60 + i;
            fprintf(out, "%d,%d,%d.5,%d\n", id % 4, id, id, -id);
        }
        REQUIRE(fclose(out) == 0);
    }
    ds d;
    ds_open(&d, "csv", 100, 2 << 20, 8);
    dp_stream *s = open_ok(&d, DP_SHARD_FILE, 1, 2, 4, 1, 8);
    dp_err err;
    REQUIRE(dp_stream_start_epoch(s, 0, &err) == 0);
    float x[8 * 3];
    uint8_t y[8];
    int got, bad = 0, n = 0;
    static int seen[120];
    while ((got = dp_stream_next(s, x, y, 8, &err)) > 0)
        for (int i = 0; i < got; i++, n++) {
            int id = (int)x[i * 3];
            bad += id < 60 || id >= 100 || x[i * 3 + 1] != (float)id + 0.5f ||
                   x[i * 3 + 2] != (float)-id || y[i] != id % 4;
            if (id >= 0 && id < 120)
                seen[id]++;
        }
    CHECKF(got == 0 && bad == 0 && n == 40, "%s", err.msg);
    for (int i = 60; i < 100; i++)
        CHECK(seen[i] == 1);
    CHECK(dp_stream_peak_bytes(s) <= d.src.memory);
    dp_stream_close(s);
    dp_data_files_free(&d.files);

    snprintf(p, sizeof p, "%s/npy", scratch);
    REQUIRE(mkdir(p, 0755) == 0);
    static uint8_t xs[300 * 6], ys[300];
    for (int i = 0; i < 300; i++) {
        for (int j = 0; j < 6; j++)
            xs[i * 6 + j] = (uint8_t)(j == 0 ? i & 0xff : j == 1 ? i >> 8 : i * 7 + j);
        ys[i] = (uint8_t)(i % 10);
    }
    write_npy_u8(path_of("npy", "x_train.npy"), xs, 300, 6);
    write_npy_u8(path_of("npy", "y_train.npy"), ys, 300, 0);
    write_npy_u8(path_of("npy", "x_test.npy"), xs, 10, 6);
    write_npy_u8(path_of("npy", "y_test.npy"), ys, 10, 0);
    ds_open(&d, "npy", 250, 3 << 20, 16);
    CHECK(d.files.shape.kind == DP_VALUES_U8 && d.files.shape.dim == 6);
    s = open_ok(&d, DP_SHARD_DATA, 0, 2, 4, 1, 8);
    CHECK(dp_stream_window(s) == 16);
    REQUIRE(dp_stream_start_epoch(s, 0, &err) == 0);
    float xf[8 * 6];
    static int seen2[300];
    n = bad = 0;
    while ((got = dp_stream_next(s, xf, y, 8, &err)) > 0)
        for (int i = 0; i < got; i++, n++) {
            int id = (int)(xf[i * 6] * 255.0f + 0.5f) | (int)(xf[i * 6 + 1] * 255.0f + 0.5f) << 8;
            bad += id >= 250 || id % 2 || y[i] != id % 10 ||
                   xf[i * 6 + 3] != (float)(uint8_t)(id * 7 + 3) / 255.0f;
            if (id < 300)
                seen2[id]++;
        }
    CHECKF(got == 0 && bad == 0 && n == 125, "%s (%d records)", err.msg, n);
    for (int i = 0; i < 250; i += 2)
        CHECK(seen2[i] == 1);
    CHECK(dp_stream_peak_bytes(s) <= d.src.memory);
    dp_stream_close(s);
    dp_data_files_free(&d.files);
}

/* ---- seeks decode only the window's records ---- */

/* Two epochs' values and labels in order (the uninterrupted run), and a
 * seek's rest: sized for the raw dataset's N records of DIM values. */
static float seek_ref[2][(size_t)N * DIM];
static uint8_t seek_lab[2][N];

/* The epoch's records, from where the stream is, to its end in batches of
 * `batch`: whether they are rx/ry's from `from` on, value for value. */
static int rest_matches(dp_stream *s, const float *rx, const uint8_t *ry, uint32_t from,
                        uint32_t n, uint32_t dim, int batch)
{
    dp_err err;
    uint32_t at = from;
    int got, same = 1;
    while ((got = dp_stream_next(s, xb, yb, batch, &err)) > 0) {
        if (at + (uint32_t)got > n)
            return 0;
        same &= memcmp(xb, rx + (size_t)at * dim, (size_t)got * dim * sizeof(float)) == 0 &&
                memcmp(yb, ry + at, (size_t)got) == 0;
        at += (uint32_t)got;
    }
    CHECKF(got == 0, "%s", err.msg);
    return same && got == 0 && at == n;
}

/* Seeks of streams over d (shard k of w under p, window from d, batches of
 * `batch`), with the reader thread and inline: a fresh stream started and
 * sought (a resumed run) to 0, 1, window-1, window, the middle, n-1, n and
 * past n gives exactly the uninterrupted epoch's rest and then its next
 * epoch, having decoded no more than the window and queue hold (the old
 * walk decoded every record before pos: the middle is past that); a stream
 * already reading seeks back, a little ahead and far ahead exactly too. */
static void test_seek_exact(const ds *d, dp_shard_policy p, int k, int w, int batch,
                            const char *what)
{
    const char *modes[2] = {"thread", "inline"};
    const long e = 3;
    for (int m = 0; m < 2; m++) {
        setenv("DOWNPOUR_STREAM_READER", modes[m], 1);
        dp_stream *s = open_ok(d, p, k, w, 77, 1, batch);
        uint32_t n = dp_stream_records(s), win = dp_stream_window(s), dim = d->split.dim;
        uint32_t queue = 2 * (uint32_t)batch < n ? 2 * (uint32_t)batch : n;
        REQUIRE((size_t)n * dim <= (size_t)N * DIM && batch <= 64);
        CHECKF(n / 2 > win + queue && win > 1, "%s: the middle %u must lie past the window %u "
               "and queue %u for the decode count to tell", what, n / 2, win, queue);
        dp_err err;
        for (int r = 0; r < 2; r++) { /* epochs e and e + 1, the second read ahead */
            REQUIRE(dp_stream_start_epoch(s, e + r, &err) == 0);
            uint32_t at = 0;
            int got;
            while ((got = dp_stream_next(s, xb, yb, batch, &err)) > 0) {
                REQUIRE(at + (uint32_t)got <= n);
                memcpy(seek_ref[r] + (size_t)at * dim, xb, (size_t)got * dim * sizeof(float));
                memcpy(seek_lab[r] + at, yb, (size_t)got);
                at += (uint32_t)got;
            }
            REQUIRE(got == 0 && at == n);
        }
        dp_stream_close(s);

        const uint32_t pos[] = {0, 1, win - 1, win, n / 2, n - 1, n, n + 7};
        for (size_t t = 0; t < sizeof pos / sizeof *pos; t++) {
            s = open_ok(d, p, k, w, 77, 1, batch);
            REQUIRE(dp_stream_start_epoch(s, e, &err) == 0);
            CHECKF(dp_stream_seek(s, pos[t], &err) == 0, "%s", err.msg);
            uint64_t decoded = dp_stream_decoded(s);
            CHECKF(decoded <= win + queue, "%s, %s: a seek to %u decoded %" PRIu64 " records, "
                   "more than the window %u and queue %u", what, modes[m], pos[t], decoded, win,
                   queue);
            uint32_t from = pos[t] < n ? pos[t] : n;
            CHECKF(rest_matches(s, seek_ref[0], seek_lab[0], from, n, dim, batch),
                   "%s, %s: a seek to %u continues the epoch", what, modes[m], pos[t]);
            CHECK(dp_stream_threaded(s) == (m == 0));
            if (t == 4) { /* the next epoch, which the reader goes on into, as well */
                REQUIRE(dp_stream_start_epoch(s, e + 1, &err) == 0);
                CHECKF(rest_matches(s, seek_ref[1], seek_lab[1], 0, n, dim, batch),
                       "%s, %s: the epoch after a seek", what, modes[m]);
            }
            dp_stream_close(s);
        }

        /* a stream mid-epoch: back, a little ahead (drawn on), far ahead */
        s = open_ok(d, p, k, w, 77, 1, batch);
        const uint32_t to[] = {1, (uint32_t)batch + win / 2, n - 2, n / 2};
        for (size_t t = 0; t < sizeof to / sizeof *to; t++) {
            REQUIRE(dp_stream_start_epoch(s, e, &err) == 0);
            REQUIRE(dp_stream_next(s, xb, yb, batch, &err) == batch);
            if (t == 0)
                REQUIRE(dp_stream_next(s, xb, yb, batch, &err) == batch);
            CHECKF(dp_stream_seek(s, to[t], &err) == 0, "%s", err.msg);
            CHECKF(rest_matches(s, seek_ref[0], seek_lab[0], to[t], n, dim, batch),
                   "%s, %s: from mid-epoch, a seek to %u", what, modes[m], to[t]);
        }
        dp_stream_close(s);
    }
    unsetenv("DOWNPOUR_STREAM_READER");
}

/* The seeks over TFRecord raw and PNG, .npy and CSV datasets, under the
 * three shard policies. */
static void test_seeks(const ds *raw)
{
    test_seek_exact(raw, DP_SHARD_OFF, 0, 1, 32, "raw TFRecord");
    ds w40 = *raw;
    w40.split.stream = &w40.src;
    w40.src.window = 40;
    test_seek_exact(&w40, DP_SHARD_DATA, 1, 3, 16, "raw TFRecord, DATA 1 of 3");

    char p[1200];
    const char *dirs[] = {"seek-png", "seek-npy", "seek-csv"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", scratch, dirs[i]);
        REQUIRE(mkdir(p, 0755) == 0);
    }
    write_png_file(path_of("seek-png", "p-train.tfrecord-00000-of-00003"), 0, 110);
    write_png_file(path_of("seek-png", "p-train.tfrecord-00001-of-00003"), 110, 100);
    write_png_file(path_of("seek-png", "p-train.tfrecord-00002-of-00003"), 210, 95);
    write_png_file(path_of("seek-png", "p-test.tfrecord"), 900, 5);
    ds d;
    ds_open(&d, "seek-png", 290, 1 << 20, 40); /* the split ends inside the last file */
    test_seek_exact(&d, DP_SHARD_OFF, 0, 1, 8, "PNG TFRecord");
    test_seek_exact(&d, DP_SHARD_DATA, 0, 2, 8, "PNG TFRecord, DATA 0 of 2");
    dp_data_files_free(&d.files);

    static uint8_t xs[300 * 6], ys[300];
    for (int i = 0; i < 300; i++) {
        for (int j = 0; j < 6; j++)
            xs[i * 6 + j] = (uint8_t)(j == 0 ? i & 0xff : j == 1 ? i >> 8 : i * 7 + j);
        ys[i] = (uint8_t)(i % 10);
    }
    write_npy_u8(path_of("seek-npy", "x_train.npy"), xs, 300, 6);
    write_npy_u8(path_of("seek-npy", "y_train.npy"), ys, 300, 0);
    write_npy_u8(path_of("seek-npy", "x_test.npy"), xs, 10, 6);
    write_npy_u8(path_of("seek-npy", "y_test.npy"), ys, 10, 0);
    ds_open(&d, "seek-npy", 250, 3 << 20, 24);
    test_seek_exact(&d, DP_SHARD_OFF, 0, 1, 8, "npy");
    dp_data_files_free(&d.files);

    for (int f = 0; f < 4; f++) {
        const char *name[] = {"c-train-0.csv", "c-train-1.csv", "c-train-2.csv", "c-test.csv"};
        FILE *out = fopen(path_of("seek-csv", name[f]), "w");
        REQUIRE(out);
        fprintf(out, "label,a,b,c\n");
        for (int i = 0; i < 150; i++) {
            int id = f * 150 + i;
            fprintf(out, "%d,%d,%d.5,%d\n", id % 4, id, id, -id);
        }
        REQUIRE(fclose(out) == 0);
    }
    ds_open(&d, "seek-csv", 420, 3 << 20, 20);
    test_seek_exact(&d, DP_SHARD_OFF, 0, 1, 8, "CSV");
    test_seek_exact(&d, DP_SHARD_FILE, 1, 2, 8, "CSV, FILE 1 of 2");
    dp_data_files_free(&d.files);
}

/* Through the batcher: a streamed split's batches, its refusal of device
 * indices, and training on it equal to training from memory. */
static void test_batcher_training(const ds *d)
{
    dp_err err;
    dp_batcher bs;
    REQUIRE(dp_batcher_init(&bs, &d->split, 7, 0, DP_SHARD_OFF, 0, 1, &err) == 0);
    CHECK(bs.n == N && dp_batcher_batches(&bs, 32) == (N + 31) / 32);
    uint32_t idx[4];
    CHECK(dp_batcher_next_indices(&bs, idx, 4) == -1 &&
          strstr(bs.err.msg, "this dataset is streamed") != NULL);

    /* the same records in memory, in file order */
    uint8_t *images = malloc((size_t)N * DIM), *labels = malloc(N);
    REQUIRE(images && labels);
    for (uint32_t i = 0; i < N; i++) {
        pixels_of(images + (size_t)i * DIM, i);
        labels[i] = (uint8_t)(i % 10);
    }
    dp_split mem = {.images = images, .labels = labels, .n = N, .dim = DIM};
    dp_batcher bm;
    REQUIRE(dp_batcher_init(&bm, &mem, 7, 0, DP_SHARD_OFF, 0, 1, &err) == 0);

    dp_model ms, mm;
    dp_optim os, om;
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_MOMENTUM);
    REQUIRE(dp_model_init(&ms, "784-32-10", 32, 1, &err) == 0);
    REQUIRE(dp_model_init(&mm, "784-32-10", 32, 1, &err) == 0);
    dp_model_init_params(&ms, 11);
    dp_model_init_params(&mm, 11);
    REQUIRE(dp_optim_init(&os, &oc, ms.n_params, &err) == 0);
    REQUIRE(dp_optim_init(&om, &oc, mm.n_params, &err) == 0);
    static float xm[32 * DIM];
    static uint8_t ym[32];
    int steps = 0, same_batches = 1;
    for (long epoch = 0; epoch < 2; epoch++) {
        dp_batcher_start_epoch(&bs, epoch);
        dp_batcher_start_epoch(&bm, epoch);
        uint32_t from = epoch ? 20 * 32 : 0; /* the second epoch resumes at step 20 */
        dp_batcher_seek(&bs, from);
        dp_batcher_seek(&bm, from);
        for (int k = 0; k < 12; k++) {
            int n = dp_batcher_next(&bs, xb, yb, 32);
            int n2 = dp_batcher_next(&bm, xm, ym, 32);
            CHECKF(n == 32 && n2 == 32, "%d %d: %s", n, n2, bs.err.msg);
            if (n != 32 || n2 != 32)
                break;
            same_batches &= memcmp(xb, xm, sizeof xm) == 0 && memcmp(yb, ym, 32) == 0;
            dp_model_train_step(&ms, &os, xb, yb, 32, 0.05f, NULL);
            dp_model_train_step(&mm, &om, xm, ym, 32, 0.05f, NULL);
            steps++;
        }
    }
    CHECK(same_batches && steps == 24);
    CHECK(memcmp(ms.params, mm.params, ms.n_params * sizeof(float)) == 0);
    float first = mm.params[0];
    CHECK(first != 0); /* (the weights trained: compared below against the start) */
    dp_model check;
    REQUIRE(dp_model_init(&check, "784-32-10", 32, 1, &err) == 0);
    dp_model_init_params(&check, 11);
    CHECK(memcmp(check.params, mm.params, mm.n_params * sizeof(float)) != 0);
    dp_model_free(&check);
    dp_model_free(&ms);
    dp_model_free(&mm);
    dp_optim_free(&os);
    dp_optim_free(&om);
    dp_batcher_free(&bm);
    dp_batcher_free(&bs);
    free(images);
    free(labels);

    /* a stream the bound cannot hold fails the first batch, with the sizes */
    ds small = *d;
    small.split.stream = &small.src;
    small.src.memory = 1000;
    REQUIRE(dp_batcher_init(&bs, &small.split, 7, 1, DP_SHARD_OFF, 0, 1, &err) == 0);
    dp_batcher_start_epoch(&bs, 0);
    CHECK(dp_batcher_next(&bs, xb, yb, 32) == -1 && strstr(bs.err.msg, "too small"));
    dp_batcher_free(&bs);
}

/* ---- the test's own accounting of the heap ---- */

/* What the heap holds now, by glibc's count over every arena: bytes in use
 * in the arenas (uordblks, chunk headers included) and in mmapped chunks
 * (hblkhd).  Not counted, as they are not the heap: thread stacks (pthread
 * maps them), the binary and its libraries.  Under ASan (which replaces
 * malloc) and without glibc there is no such count: 0, and the checks are
 * skipped. */
static size_t heap_in_use(void)
{
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33)) && \
    !SANITIZED
    struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd;
#else
    return 0;
#endif
}

/* What the heap may grow by beyond what the stream counts: malloc's chunk
 * headers and alignment (up to 16 bytes on each of some 30 blocks), the
 * reader thread's arena header and its thread-local vectors (a few KiB):
 * 16 KiB, small beside the bounds checked (a sixteenth of the smallest). */
#define HEAP_SLACK ((size_t)16 << 10)

/* Epochs of batches of `batch` through s, the heap sampled after every
 * batch: the most it grew above `base`. */
static size_t heap_peak_epochs(dp_stream *s, long epochs, int batch, size_t base)
{
    dp_err err;
    size_t peak = 0;
    for (long e = 0; e < epochs; e++) {
        REQUIRE(dp_stream_start_epoch(s, e, &err) == 0);
        int got;
        while ((got = dp_stream_next(s, xb, yb, batch, &err)) > 0) {
            size_t now = heap_in_use();
            if (now > base && now - base > peak)
                peak = now - base;
        }
        CHECKF(got == 0, "%s", err.msg);
    }
    return peak;
}

/* A stream's heap growth stays within its bound, with the bound several
 * times smaller than the split's decoded records. */
static void test_heap_stream(const ds *d, const char *mode, size_t decoded)
{
    if (heap_in_use() == 0) {
        fprintf(stderr, "heap accounting skipped: no mallinfo2 (ASan or not glibc)\n");
        return;
    }
    setenv("DOWNPOUR_STREAM_READER", mode, 1);
    CHECKF(decoded >= 3 * d->src.memory, "decoded %zu, bound %zu", decoded, d->src.memory);
    size_t base = heap_in_use();
    dp_stream *s = open_ok(d, DP_SHARD_OFF, 0, 1, 21, 1, 32);
    size_t peak = heap_peak_epochs(s, 2, 32, base);
    size_t self = dp_stream_peak_bytes(s);
    dp_stream_close(s);
    fprintf(stderr, "heap (%s): grew %zu bytes at most; the stream counted %zu; bound %zu\n",
            mode, peak, self, d->src.memory);
    CHECKF(peak <= d->src.memory + HEAP_SLACK, "%s: the heap grew %zu bytes, bound %zu + %zu",
           mode, peak, d->src.memory, HEAP_SLACK);
    /* the bound was used, so the check means something */
    CHECKF(peak >= d->src.memory / 2, "%s: the heap grew only %zu of %zu", mode, peak,
           d->src.memory);
    unsetenv("DOWNPOUR_STREAM_READER");
}

/* A record much larger than the first, for which the reserve was
 * measured: refused, naming it, before it is read when the bound has no
 * room for it; read when it has, the stream still within its bound. */
static void test_later_record_larger(void)
{
    char p[1200];
    snprintf(p, sizeof p, "%s/grow", scratch);
    REQUIRE(mkdir(p, 0755) == 0);
    write_padded_file(path_of("grow", "g-train.tfrecord"), 200, 150, 300000);
    write_bytes_file(path_of("grow", "g-test.tfrecord"), 5000, 5);
    ds g;
    ds_open(&g, "grow", 200, 256 << 10, 0);
    dp_stream *s = open_ok(&g, DP_SHARD_OFF, 0, 1, 1, 0, 16);
    dp_err err;
    REQUIRE(dp_stream_start_epoch(s, 0, &err) == 0);
    int got, n = 0;
    while ((got = dp_stream_next(s, xb, yb, 16, &err)) > 0)
        n += got;
    CHECK(got == -1 && n == 144); /* the batches before record 150's */
    CHECKF(strstr(err.msg, "g-train.tfrecord: record 150") && strstr(err.msg, "above the limit"),
           "%s", err.msg);
    CHECK(dp_stream_peak_bytes(s) <= g.src.memory);
    dp_stream_close(s);
    /* a bound with room for it beside a window of 16: read through */
    g.src.memory = 1 << 20;
    g.src.window = 16;
    size_t base = heap_in_use();
    s = open_ok(&g, DP_SHARD_OFF, 0, 1, 1, 1, 16);
    REQUIRE(dp_stream_start_epoch(s, 0, &err) == 0);
    n = 0;
    while ((got = dp_stream_next(s, xb, yb, 16, &err)) > 0)
        n += got;
    CHECKF(got == 0 && n == 200, "%s", err.msg);
    size_t peak = dp_stream_peak_bytes(s);
    CHECKF(peak > 300000 && peak <= g.src.memory, "peak %zu", peak);
    if (base)
        CHECK(heap_in_use() - base <= g.src.memory + HEAP_SLACK);
    dp_stream_close(s);
    dp_data_files_free(&g.files);
}

/* A streamed dataset holds test records, validation records and a stream:
 * together within its budget (docs/datasets.md, "The decoded cache or
 * streaming"). */
static void test_heap_dataset(void)
{
    if (heap_in_use() == 0)
        return;
    const size_t budget = 400000;
    char spec[1200];
    snprintf(spec, sizeof spec, "%s/ds", scratch);
    dp_dataset_options o;
    dp_dataset_options_default(&o);
    o.stream = 1;
    o.memory = budget;
    dp_dataset dset;
    dp_err err;
    setenv("DOWNPOUR_STREAM_READER", "thread", 1);
    size_t base = heap_in_use();
    if (dp_dataset_open_with(&dset, spec, &o, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        REQUIRE(0);
    }
    dp_split tr, va;
    REQUIRE(dp_dataset_split(&dset, 1200, 140, &tr, &va, &err) == 0);
    CHECK(dset.train_all.stream->held == (20 + 140) * (DIM + 1));
    CHECKF((size_t)1200 * DIM >= 3 * dset.train_all.stream->memory, "stream bound %zu",
           dset.train_all.stream->memory);
    dp_stream *s = NULL;
    CHECKF(dp_stream_open(&s, &tr, DP_SHARD_OFF, 0, 1, 5, 1, 32, &err) == 0, "%s", err.msg);
    REQUIRE(s);
    size_t peak = heap_peak_epochs(s, 2, 32, base);
    dp_stream_close(s);
    /* Beside the budget the dataset keeps its files' list and names (some
     * 2 KiB for these 6 files): within the slack. */
    fprintf(stderr, "heap (dataset): grew %zu bytes at most; budget %zu\n", peak, budget);
    CHECKF(peak <= budget + HEAP_SLACK, "the heap grew %zu bytes, budget %zu + %zu", peak,
           budget, HEAP_SLACK);
    CHECKF(peak >= budget / 2, "the heap grew only %zu of %zu", peak, budget);
    dp_dataset_close(&dset);
    unsetenv("DOWNPOUR_STREAM_READER");
}

int main(void)
{
    scratch_make(scratch, sizeof scratch, "test_stream");
    const char *dirs[] = {"ds", "floats", "png"};
    for (int i = 0; i < 3; i++) {
        char p[1200];
        snprintf(p, sizeof p, "%s/%s", scratch, dirs[i]);
        REQUIRE(mkdir(p, 0755) == 0);
    }
    uint32_t first = 0;
    for (int f = 0; f < NFILES; f++) {
        char name[64];
        snprintf(name, sizeof name, "d-train.tfrecord-%05d-of-%05d", f, NFILES);
        write_bytes_file(path_of("ds", name), first, per_file[f]);
        first += per_file[f];
    }
    write_bytes_file(path_of("ds", "d-test.tfrecord"), 5000, 20);
    write_float_file(path_of("floats", "f-train-0.tfrecord"), 0, 70);
    write_float_file(path_of("floats", "f-train-1.tfrecord"), 70, 70);
    write_float_file(path_of("floats", "f-test.tfrecord"), 0, 5);
    for (int f = 0; f < 3; f++) {
        char name[64];
        snprintf(name, sizeof name, "p-train-%d.tfrecord.gz", f);
        write_png_file(path_of("png", name), (uint32_t)f * 700, 700);
    }
    write_png_file(path_of("png", "p-test.tfrecord.gz"), 5000, 10);

    /* 256 KiB: a window of about 150 of the 1,340 records (1.05 MB) */
    ds d;
    ds_open(&d, "ds", N, 256 << 10, 0);
    test_epochs(&d, "thread");
    test_epochs(&d, "inline");
    test_modes_agree(&d);
    test_augment(&d, "thread");
    test_augment(&d, "inline");
    test_shards(&d);
    test_file_order(&d);
    test_bounds(&d);
    test_close_mid_epoch(&d);
    test_corrupt("thread");
    test_corrupt("inline");
    test_floats();
    test_csv_npy();
    test_batcher_training(&d);
    test_seeks(&d);
    test_heap_stream(&d, "thread", (size_t)N * DIM);
    test_heap_stream(&d, "inline", (size_t)N * DIM);
    dp_data_files_free(&d.files);
    /* PNG records in gzip files: zlib's and libpng's shares counted too */
    ds p;
    ds_open(&p, "png", 2100, 512 << 10, 0);
    test_heap_stream(&p, "thread", (size_t)2100 * DIM);
    dp_data_files_free(&p.files);
    test_heap_dataset();
    test_later_record_larger();

    if (!check_failures)
        scratch_remove(scratch);
    return CHECK_DONE();
}
