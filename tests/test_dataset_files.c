/* Datasets of record files through dp_dataset_open_with (dataset.h): small
 * TFRecord datasets written here are opened with the decoded cache and with
 * streaming, and automatically against a budget.  The cache holds the
 * written records and the files' bounds, is reused (same inode and mtime),
 * rebuilt when a source changes or a byte of it flips (with a warning naming
 * the section); streaming keeps the training records in their files and the
 * test and validation records in memory; the choice follows the budget, and
 * a budget the test records alone exceed is refused. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "downpour/dataset.h"
#include "downpour/example.h"
#include "downpour/stream.h"
#include "downpour/tfrecord.h"
#include "scratch.h"

static char scratch[1024];

static const char *path_of(const char *name) /* scratch/name */
{
    static char buf[8][1400];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", scratch, name);
    return buf[k];
}

enum { ROWS = 4, COLS = 3, DIM = ROWS * COLS, FDIM = 5 };

/* Record id's pixels, float values and label (ids: training records from
 * 0, test records from 1000). */
static uint8_t px(uint32_t id, int j) { return (uint8_t)(id * 37 + (uint32_t)j * 11 + 5); }
static float fv(uint32_t id, int j) { return (float)id * 0.25f - (float)j * 1.5e-3f + (j == 2 ? 1e30f : 0); }
static uint8_t lab(uint32_t id) { return (uint8_t)((id * 3 + 1) % 7); }

/* A TFRecord file of Examples id first .. first+n-1: raw bytes with height
 * and width (floats with FDIM values when floats) and a label. */
static void write_file(const char *path, uint32_t first, uint32_t n, int floats, int append)
{
    dp_tfrecord_writer *w;
    dp_err err;
    char tmp[1300];
    /* Appending: rewrite the old records and one more (the writer truncates). */
    snprintf(tmp, sizeof tmp, "%s", path);
    REQUIRE(dp_tfrecord_writer_open(&w, tmp, DP_TFRECORD_RAW, &err) == 0);
    for (uint32_t id = first; id < first + n + (uint32_t)append; id++) {
        uint8_t pix[DIM];
        float val[FDIM];
        for (int j = 0; j < DIM; j++)
            pix[j] = px(id, j);
        for (int j = 0; j < FDIM; j++)
            val[j] = fv(id, j);
        int64_t l = lab(id), h = ROWS, wd = COLS;
        dp_bytes b = {pix, DIM};
        dp_feature fs[4] = {{"height", DP_FEATURE_INT64, 1, NULL, NULL, &h},
                            {"image", DP_FEATURE_BYTES, 1, &b, NULL, NULL},
                            {"label", DP_FEATURE_INT64, 1, NULL, NULL, &l},
                            {"width", DP_FEATURE_INT64, 1, NULL, NULL, &wd}};
        if (floats)
            fs[1] = (dp_feature){"image", DP_FEATURE_FLOAT, FDIM, NULL, val, NULL};
        size_t len = dp_example_encoded_size(fs, 4);
        uint8_t *enc = malloc(len);
        REQUIRE(enc);
        dp_example_encode(enc, fs, 4);
        REQUIRE(dp_tfrecord_write(w, enc, len, &err) == 0);
        free(enc);
    }
    REQUIRE(dp_tfrecord_writer_close(w, &err) == 0);
}

/* dir/train-0000k.tfrecord with counts[k] records each, dir/test.tfrecord
 * with n_test. */
static void write_dataset(const char *dir, const uint32_t *counts, int n_train_files,
                          uint32_t n_test, int floats)
{
    REQUIRE(mkdir(path_of(dir), 0755) == 0);
    char name[256];
    uint32_t first = 0;
    for (int k = 0; k < n_train_files; k++) {
        snprintf(name, sizeof name, "%s/train-%05d.tfrecord", dir, k);
        write_file(path_of(name), first, counts[k], floats, 0);
        first += counts[k];
    }
    snprintf(name, sizeof name, "%s/test.tfrecord", dir);
    write_file(path_of(name), 1000, n_test, floats, 0);
}

/* Record i of a view equals record id as written. */
static int record_is(const dp_split *s, uint32_t i, uint32_t id, int floats)
{
    if (s->labels[i] != lab(id))
        return 0;
    for (int j = 0; j < (floats ? FDIM : DIM); j++)
        if (floats ? s->values[(size_t)i * FDIM + j] != fv(id, j)
                   : s->images[(size_t)i * DIM + j] != px(id, j))
            return 0;
    return 1;
}

static int view_is(const dp_split *s, uint32_t n, uint32_t first_id, int floats)
{
    if (s->n != n || !s->labels || (floats ? !s->values : !s->images))
        return 0;
    for (uint32_t i = 0; i < n; i++)
        if (!record_is(s, i, first_id + i, floats))
            return 0;
    return 1;
}

static char g_log[8192];

/* dp_dataset_open_with with stderr captured into g_log. */
static int open_logged(dp_dataset *ds, const char *spec, const dp_dataset_options *o,
                       dp_err *err)
{
    const char *log = path_of("stderr.log");
    fflush(stderr);
    int saved = dup(2), fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
    int rc = dp_dataset_open_with(ds, spec, o, err);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    FILE *fp = fopen(log, "r");
    REQUIRE(fp);
    size_t n = fread(g_log, 1, sizeof g_log - 1, fp);
    g_log[n] = '\0';
    fclose(fp);
    fprintf(stderr, "log of that open: %s", g_log);
    if (rc != 0)
        fprintf(stderr, "open failed: %s\n", err->msg);
    return rc;
}

static dp_dataset_options opts(int stream, size_t memory)
{
    dp_dataset_options o;
    dp_dataset_options_default(&o);
    o.stream = stream;
    o.memory = memory;
    return o;
}

static void flip_byte(const char *path, long off)
{
    int fd = open(path, O_RDWR);
    REQUIRE(fd >= 0);
    uint8_t b;
    REQUIRE(pread(fd, &b, 1, off) == 1);
    b ^= 0x10;
    REQUIRE(pwrite(fd, &b, 1, off) == 1);
    close(fd);
}

/* ---- the decoded cache ---- */

static void test_cache(void)
{
    const uint32_t counts[3] = {5, 7, 4};
    write_dataset("u8", counts, 3, 6, 0);
    char spec[1400];
    snprintf(spec, sizeof spec, "%s", path_of("u8"));
    dp_dataset ds;
    dp_err err;
    dp_dataset_options o = opts(0, 0);
    REQUIRE(open_logged(&ds, spec, &o, &err) == 0);
    CHECK(ds.is_files && !ds.streamed && ds.format == DP_DATA_TFRECORD);
    CHECK(ds.kind == DP_VALUES_U8 && ds.rows == ROWS && ds.cols == COLS && ds.channels == 1);
    CHECK(view_is(&ds.train_all, 16, 0, 0));
    CHECK(view_is(&ds.test, 6, 1000, 0));
    CHECK(ds.train_all.stream == NULL);
    CHECK(ds.classes == 7); /* labels (3 id + 1) % 7 reach 6 */
    CHECK(ds.decoded_bytes == 22u * (DIM + 1));
    CHECK(ds.train_all.n_files == 3 && ds.train_all.file_end[0] == 5 &&
          ds.train_all.file_end[1] == 12 && ds.train_all.file_end[2] == 16);
    CHECK(ds.test.n_files == 1 && ds.test.file_end[0] == 6);
    CHECKF(strncmp(ds.cache_path, spec, strlen(spec)) == 0, "cache at %s, not beside %s",
           ds.cache_path, spec);
    CHECKF(strstr(g_log, "4 tfrecord files (16 train, 6 test records of 4x3 uint8); decoded "
                  "cache") != NULL, "report: %s", g_log);
    char cache[1024];
    snprintf(cache, sizeof cache, "%s", ds.cache_path);
    struct stat a, b;
    REQUIRE(stat(cache, &a) == 0);

    /* The split: train keeps the bounds of the files it reaches, val is the next records. */
    dp_split tr, va;
    REQUIRE(dp_dataset_split(&ds, 10, 4, &tr, &va, &err) == 0);
    CHECK(tr.n == 10 && tr.n_files == 2 && tr.file_end == ds.train_all.file_end);
    CHECK(view_is(&va, 4, 10, 0));
    CHECK(dp_dataset_split(&ds, 12, 5, &tr, &va, &err) == -1);
    dp_dataset_close(&ds);

    /* Reused: the same file, not rewritten; the same records. */
    REQUIRE(open_logged(&ds, spec, &o, &err) == 0);
    REQUIRE(stat(cache, &b) == 0);
    CHECK(a.st_ino == b.st_ino && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec &&
          a.st_mtim.tv_sec == b.st_mtim.tv_sec);
    CHECK(strcmp(ds.cache_path, cache) == 0);
    CHECK(view_is(&ds.train_all, 16, 0, 0) && view_is(&ds.test, 6, 1000, 0));
    CHECK(ds.train_all.n_files == 3 && ds.train_all.file_end[2] == 16);
    CHECK(strstr(g_log, "warning") == NULL);
    dp_dataset_close(&ds);

    /* A source changes (one more record in the last training file): rebuilt. */
    write_file(path_of("u8/train-00002.tfrecord"), 12, 4, 0, 1);
    REQUIRE(open_logged(&ds, spec, &o, &err) == 0);
    REQUIRE(stat(cache, &a) == 0);
    CHECK(a.st_ino != b.st_ino);
    CHECKF(strstr(g_log, "out of date") && strstr(g_log, "train-00002"), "log: %s", g_log);
    CHECK(view_is(&ds.train_all, 17, 0, 0) && view_is(&ds.test, 6, 1000, 0));
    CHECK(ds.train_all.n_files == 3 && ds.train_all.file_end[1] == 12 &&
          ds.train_all.file_end[2] == 17);
    dp_dataset_close(&ds);

    /* A flipped byte in each section: a warning naming it, rebuilt, the same data. */
    static const struct {
        long off;
        const char *section;
    } flips[] = {{4096 + 3, "train values"},
                 {4096 + 17 * DIM + 5, "test values"},
                 {4096 + 23 * DIM + 16, "train labels"},
                 {4096 + 23 * DIM + 17 + 2, "test labels"},
                 {20, "header"}};
    for (size_t i = 0; i < sizeof flips / sizeof flips[0]; i++) {
        REQUIRE(stat(cache, &a) == 0);
        flip_byte(cache, flips[i].off);
        REQUIRE(open_logged(&ds, spec, &o, &err) == 0);
        REQUIRE(stat(cache, &b) == 0);
        CHECKF(a.st_ino != b.st_ino, "byte %ld: not rebuilt", flips[i].off);
        CHECKF(strstr(g_log, "warning") && strstr(g_log, cache) &&
                   strstr(g_log, flips[i].section) && strstr(g_log, "rebuilding"),
               "byte %ld: the warning does not name %s: %s", flips[i].off, flips[i].section,
               g_log);
        CHECK(view_is(&ds.train_all, 17, 0, 0) && view_is(&ds.test, 6, 1000, 0));
        dp_dataset_close(&ds);
    }

    /* $DOWNPOUR_CACHE takes the cache elsewhere; a glob names another dataset. */
    REQUIRE(mkdir(path_of("cachedir"), 0755) == 0);
    setenv("DOWNPOUR_CACHE", path_of("cachedir"), 1);
    REQUIRE(open_logged(&ds, path_of("u8/*.tfrecord"), &o, &err) == 0);
    CHECKF(strstr(ds.cache_path, "/cachedir/u8-") != NULL, "cache at %s", ds.cache_path);
    CHECK(view_is(&ds.train_all, 17, 0, 0));
    dp_dataset_close(&ds);
    unsetenv("DOWNPOUR_CACHE");

    /* Labels above the options' classes: the cache is not trusted, the file
     * is refused naming the record. */
    o.data.classes = 5;
    CHECK(open_logged(&ds, spec, &o, &err) == -1);
    CHECKF(strstr(err.msg, ".tfrecord: record ") && strstr(err.msg, "not in [0, 5)"), "%s",
           err.msg);
    dp_dataset_close(&ds);
}

/* ---- streaming ---- */

static void test_stream(void)
{
    const uint32_t counts[3] = {5, 7, 4};
    write_dataset("st", counts, 3, 6, 0);
    char spec[1400];
    snprintf(spec, sizeof spec, "%s", path_of("st"));
    dp_dataset ds;
    dp_err err;
    dp_dataset_options o = opts(1, 0);
    o.window = 9;
    o.data.classes = 10;
    REQUIRE(open_logged(&ds, spec, &o, &err) == 0);
    CHECK(ds.streamed && ds.cache_path[0] == '\0' && ds.map == NULL);
    const dp_split *all = &ds.train_all;
    CHECK(all->n == 16 && all->dim == DIM && !all->images && !all->values && !all->labels);
    REQUIRE(all->stream != NULL);
    CHECK(all->stream->files->n == 3 && all->stream->files->records == 16);
    CHECK(all->stream->format == DP_DATA_TFRECORD && all->stream->window == 9);
    CHECK(all->stream->shape.dim == DIM && all->stream->shape.kind == DP_VALUES_U8);
    /* the budget is whole: the stream gets what the 6 test records (78 B) leave */
    CHECK(all->stream->memory == ds.memory - 78 && all->stream->held == 78 && ds.memory > 78);
    CHECK(all->n_files == 3 && all->file_end[0] == 5 && all->file_end[2] == 16);
    CHECK(view_is(&ds.test, 6, 1000, 0) && ds.test.n_files == 1);
    CHECK(ds.classes == 10); /* the options' classes */
    CHECKF(strstr(g_log, "streaming (as asked") && strstr(g_log, "window 9 records") &&
           strstr(g_log, " budget = 78 B test + "), "report: %s", g_log);

    /* The split: train streams the first records, val (across a file
     * boundary) is decoded into memory, and again for another split. */
    dp_split tr, va;
    REQUIRE(dp_dataset_split(&ds, 10, 5, &tr, &va, &err) == 0);
    CHECK(tr.n == 10 && tr.stream == all->stream && tr.n_files == 2 && !tr.images);
    CHECK(view_is(&va, 5, 10, 0));
    /* the validation records (5 x 13 B) come out of the stream's bound too */
    CHECK(all->stream->memory == ds.memory - 78 - 65 && all->stream->held == 78 + 65);
    REQUIRE(dp_dataset_split(&ds, 3, 13, &tr, &va, &err) == 0);
    CHECK(tr.n == 3 && tr.n_files == 1 && view_is(&va, 13, 3, 0));
    REQUIRE(dp_dataset_split(&ds, 16, 0, &tr, &va, &err) == 0);
    CHECK(tr.n_files == 3 && va.n == 0);
    /* the buffer keeps the largest split's 13 records, so they still count */
    CHECK(all->stream->memory == ds.memory - 78 - 169 && all->stream->held == 78 + 169);
    dp_dataset_close(&ds);

    /* Floats: the same, values exact. */
    write_dataset("fl", counts, 2, 3, 1);
    REQUIRE(open_logged(&ds, path_of("fl"), &o, &err) == 0);
    CHECK(ds.streamed && ds.kind == DP_VALUES_F32 && ds.train_all.n == 12);
    CHECK(view_is(&ds.test, 3, 1000, 1));
    REQUIRE(dp_dataset_split(&ds, 4, 6, &tr, &va, &err) == 0);
    CHECK(view_is(&va, 6, 4, 1));
    dp_dataset_close(&ds);
    o.stream = 0;
    REQUIRE(open_logged(&ds, path_of("fl"), &o, &err) == 0);
    CHECK(!ds.streamed && view_is(&ds.train_all, 12, 0, 1) && view_is(&ds.test, 3, 1000, 1));
    CHECK(ds.train_all.n_files == 2 && ds.train_all.file_end[1] == 12);
    CHECKF(strstr(g_log, "(12 train, 3 test records of 5 float32 values)"), "report: %s", g_log);
    dp_dataset_close(&ds);
}

/* ---- the automatic choice ---- */

static void test_auto(void)
{
    const uint32_t counts[2] = {8, 8};
    write_dataset("au", counts, 2, 4, 0);
    char spec[1400];
    snprintf(spec, sizeof spec, "%s", path_of("au"));
    const size_t decoded = 20u * (DIM + 1), test = 4u * (DIM + 1);
    dp_dataset ds;
    dp_err err;
    dp_dataset_options o = opts(-1, decoded);
    REQUIRE(open_logged(&ds, spec, &o, &err) == 0);
    CHECK(!ds.streamed && ds.cache_path[0] && ds.decoded_bytes == decoded);
    CHECKF(strstr(g_log, "(fits the 260 B budget)"), "report: %s", g_log);
    dp_dataset_close(&ds);

    /* The budget is whole: streaming needs a stream beside the test
     * records, and 259 B cannot hold one: refused, naming the parts. */
    o.memory = decoded - 1;
    CHECK(open_logged(&ds, spec, &o, &err) == -1);
    CHECKF(strstr(err.msg, "its 4 test records, decoded to 52 B, leave 207 B of the 259 B "
                  "memory budget, and a stream needs at least ") &&
               strstr(err.msg, "--data-memory"), "%s", err.msg);
    dp_dataset_close(&ds);
    /* The test records alone past the budget: refused. */
    setenv("DOWNPOUR_DATA_MEMORY", "50", 1);
    o.memory = 0;
    CHECK(test > 50 && open_logged(&ds, spec, &o, &err) == -1);
    CHECKF(strstr(err.msg, "test records") && strstr(err.msg, "exceed the 50 B memory budget") &&
               strstr(err.msg, "DOWNPOUR_DATA_MEMORY"), "%s", err.msg);
    dp_dataset_close(&ds);
    setenv("DOWNPOUR_DATA_MEMORY", "lots", 1);
    CHECK(open_logged(&ds, spec, &o, &err) == -1 && strstr(err.msg, "DOWNPOUR_DATA_MEMORY"));
    dp_dataset_close(&ds);
    unsetenv("DOWNPOUR_DATA_MEMORY");

    /* A dataset larger than a stream (8,000 training records, 104 kB
     * decoded) under a budget of the test records, the least stream and
     * 20,000 bytes: streamed. */
    const uint32_t big[2] = {4000, 4000};
    write_dataset("big", big, 2, 4, 0);
    o = opts(1, 0);
    REQUIRE(open_logged(&ds, path_of("big"), &o, &err) == 0);
    size_t least;
    REQUIRE(dp_stream_least_bytes(ds.train_all.stream, 1, &least, &err) == 0);
    dp_dataset_close(&ds);
    const size_t budget = test + least + 20000;
    CHECK(budget < 8004u * (DIM + 1));
    char env[32];
    snprintf(env, sizeof env, "%zu", budget);
    setenv("DOWNPOUR_DATA_MEMORY", env, 1);
    o = opts(-1, 0);
    REQUIRE(open_logged(&ds, path_of("big"), &o, &err) == 0);
    unsetenv("DOWNPOUR_DATA_MEMORY");
    CHECK(ds.streamed && ds.memory == budget && ds.train_all.n == 8000);
    CHECK(ds.train_all.stream->memory == budget - test && ds.train_all.stream->held == test);
    CHECKF(strstr(g_log, "streaming (decoded 104.1 kB exceeds the ") &&
               strstr(g_log, " budget = 52 B test + "), "report: %s", g_log);
    /* Val and test together leaving less than a stream: refused, naming both. */
    dp_split tr, va;
    CHECK(dp_dataset_split(&ds, 6000, 2000, &tr, &va, &err) == -1);
    CHECKF(strstr(err.msg, "a validation buffer of 26.0 kB (2,000 records") &&
               strstr(err.msg, "the test records' 52 B") && strstr(err.msg, "a stream needs"),
           "%s", err.msg);
    CHECK(dp_dataset_split(&ds, 7000, 1000, &tr, &va, &err) == 0 && view_is(&va, 1000, 7000, 0));
    CHECK(ds.train_all.stream->memory == budget - test - 13000 &&
          ds.train_all.stream->held == test + 13000);
    /* and a stream opens within what is left, and holds no more */
    dp_stream *st = NULL;
    CHECKF(dp_stream_open(&st, &tr, DP_SHARD_OFF, 0, 1, 1, 1, 1, &err) == 0, "%s", err.msg);
    CHECK(st && dp_stream_peak_bytes(st) <= ds.train_all.stream->memory);
    dp_stream_close(st);
    dp_dataset_close(&ds);

    /* Never streamed when the cache is asked for, whatever the budget. */
    o = opts(0, 1);
    REQUIRE(open_logged(&ds, spec, &o, &err) == 0);
    CHECK(!ds.streamed && view_is(&ds.train_all, 16, 0, 0));
    CHECKF(strstr(g_log, "exceeds the 1 B budget: the cache was asked for"), "%s", g_log);
    dp_dataset_close(&ds);
}

/* A CSV dataset (records.c's reader) goes the same way: floats, cached and streamed. */
static void test_csv(void)
{
    REQUIRE(mkdir(path_of("csv"), 0755) == 0);
    const char tr[] = "a,label,b\n0.5,1,-2\n1.25,0,3e3\n-7,2,0\n";
    const char te[] = "a,label,b\n9,1,8\n";
    write_bytes(path_of("csv/train.csv"), tr, strlen(tr));
    write_bytes(path_of("csv/test.csv"), te, strlen(te));
    for (int stream = 0; stream < 2; stream++) {
        dp_dataset ds;
        dp_err err;
        dp_dataset_options o = opts(stream, 0);
        REQUIRE(open_logged(&ds, path_of("csv"), &o, &err) == 0);
        CHECK(ds.format == DP_DATA_CSV && ds.kind == DP_VALUES_F32 && ds.streamed == stream);
        CHECK(ds.train_all.n == 3 && ds.train_all.dim == 2 && ds.test.n == 1);
        CHECK(ds.test.values && ds.test.values[0] == 9 && ds.test.values[1] == 8 &&
              ds.test.labels[0] == 1);
        dp_split t, v;
        REQUIRE(dp_dataset_split(&ds, 1, 2, &t, &v, &err) == 0);
        CHECK(v.n == 2 && v.values[0] == 1.25f && v.values[1] == 3e3f && v.values[3] == 0 &&
              v.labels[0] == 0 && v.labels[1] == 2);
        if (!stream)
            CHECK(ds.classes == 3 && ds.train_all.values[1] == -2);
        dp_dataset_close(&ds);
    }
}

static void test_memory_parse(void)
{
    dp_err err;
    size_t v = 0;
    CHECK(dp_data_memory_parse("1500000", &v, "x", &err) == 0 && v == 1500000);
    CHECK(dp_data_memory_parse("12G", &v, "x", &err) == 0 && v == 12000000000ull);
    CHECK(dp_data_memory_parse("800MB", &v, "x", &err) == 0 && v == 800000000ull);
    CHECK(dp_data_memory_parse("8Gi", &v, "x", &err) == 0 && v == (size_t)8 << 30);
    CHECK(dp_data_memory_parse("512MiB", &v, "x", &err) == 0 && v == (size_t)512 << 20);
    CHECK(dp_data_memory_parse("1.5T", &v, "x", &err) == 0 && v == 1500000000000ull);
    CHECK(dp_data_memory_parse("2k", &v, "x", &err) == 0 && v == 2000);
    const char *bad[] = {"", "-1", "12X", "G", "0", "1e", " 5", "5 G", "1.5.2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECKF(dp_data_memory_parse(bad[i], &v, "--data-memory", &err) == -1 &&
                   strstr(err.msg, "--data-memory"),
               "'%s' accepted", bad[i]);
}

int main(void)
{
    scratch_make(scratch, sizeof scratch, "test_dataset_files");
    unsetenv("DOWNPOUR_CACHE");
    unsetenv("DOWNPOUR_DATA_MEMORY");
    test_memory_parse();
    test_cache();
    test_stream();
    test_auto();
    test_csv();
    if (check_failures == 0)
        scratch_remove(scratch);
    return check_failures ? 1 : 0;
}
