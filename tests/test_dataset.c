/* Datasets: the cache (built, reused, rebuilt when a source changes or the
 * cache is damaged, safe under racing builders), the checks between the four
 * files, the messages for missing data, the split, the shard policies and the
 * batcher.  With DOWNPOUR_DATA holding the real MNIST, its known facts too. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "check.h"
#include "scratch.h"
#include "downpour/clock.h"
#include "downpour/crc32c.h"
#include "downpour/dataset.h"
#include "downpour/pool.h"
#include "data/cache.h"

static char scratch[1024];

/* scratch/<a>[/<b>], in one of a few rotating buffers. */
static const char *sp(const char *a, const char *b)
{
    static char buf[8][1200];
    static int k;
    k = (k + 1) % 8;
    if (b)
        snprintf(buf[k], sizeof buf[k], "%s/%s/%s", scratch, a, b);
    else
        snprintf(buf[k], sizeof buf[k], "%s/%s", scratch, a);
    return buf[k];
}

/* ---- fake datasets ---- */

typedef struct fake {
    uint32_t n_train, n_test, rows, cols;
    uint32_t train_labels;  /* labels written for train (0: n_train) */
    uint32_t test_rows;     /* 0: rows */
    int bad_label_at;       /* train record given label bad_label, -1 for none */
    uint8_t bad_label;
    int zero_labels;        /* every label 0 */
    int image_rank;         /* 0: 3 */
    int gz_test;            /* write the test files gzipped */
    int skip_test_labels;   /* leave out t10k-labels */
    uint8_t salt;           /* changes every label (a modified source) */
} fake;

static uint8_t px(int split, uint32_t rec, uint32_t j)
{
    return (uint8_t)(rec * 31 + j * 7 + split * 101);
}

static uint8_t lab(const fake *f, int split, uint32_t rec)
{
    if (f->zero_labels)
        return 0;
    if (split == 0 && (int)rec == f->bad_label_at)
        return f->bad_label;
    return (uint8_t)((rec * 3 + (uint32_t)split + f->salt) % 10);
}

static void write_idx(const char *path, int gz, int ndim, const uint32_t *dims, const uint8_t *data)
{
    uint8_t h[20];
    size_t n = 0, len = 1;
    h[n++] = 0, h[n++] = 0, h[n++] = 0x08, h[n++] = (uint8_t)ndim;
    for (int i = 0; i < ndim; i++) {
        h[n++] = (uint8_t)(dims[i] >> 24), h[n++] = (uint8_t)(dims[i] >> 16);
        h[n++] = (uint8_t)(dims[i] >> 8), h[n++] = (uint8_t)dims[i];
        len *= dims[i];
    }
    if (gz) {
        gzFile g = gzopen(path, "wb");
        REQUIRE(g != NULL);
        REQUIRE(gzwrite(g, h, (unsigned)n) == (int)n);
        REQUIRE(gzwrite(g, data, (unsigned)len) == (int)len);
        REQUIRE(gzclose(g) == Z_OK);
    } else {
        FILE *fp = fopen(path, "wb");
        REQUIRE(fp != NULL);
        REQUIRE(fwrite(h, 1, n, fp) == n);
        REQUIRE(fwrite(data, 1, len, fp) == len);
        REQUIRE(fclose(fp) == 0);
    }
}

static void write_fake(const char *dir, const fake *f)
{
    REQUIRE(mkdir(dir, 0755) == 0 || errno == EEXIST);
    char path[1300];
    for (int split = 0; split < 2; split++) {
        uint32_t n = split ? f->n_test : f->n_train;
        uint32_t rows = split && f->test_rows ? f->test_rows : f->rows, cols = f->cols;
        uint8_t *im = malloc((size_t)n * rows * cols + 1), *lb = malloc((size_t)n + 1);
        REQUIRE(im && lb);
        for (uint32_t r = 0; r < n; r++) {
            for (uint32_t j = 0; j < rows * cols; j++)
                im[(size_t)r * rows * cols + j] = px(split, r, j);
            lb[r] = lab(f, split, r);
        }
        int gz = split && f->gz_test;
        const char *pre = split ? "t10k" : "train", *ext = gz ? ".gz" : "";
        snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte%s", dir, pre, ext);
        uint32_t d3[3] = {n, rows, cols}, d2[2] = {n, rows * cols};
        if (f->image_rank == 2)
            write_idx(path, gz, 2, d2, im);
        else
            write_idx(path, gz, 3, d3, im);
        snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte%s", dir, pre, ext);
        uint32_t nl = !split && f->train_labels ? f->train_labels : n;
        if (!(split && f->skip_test_labels))
            write_idx(path, gz, 1, &nl, lb);
        free(im);
        free(lb);
    }
}

static void check_contents(const dp_dataset *ds, const fake *f)
{
    CHECK(ds->rows == f->rows && ds->cols == f->cols);
    CHECK(ds->train_all.n == f->n_train && ds->test.n == f->n_test);
    CHECK(ds->train_all.dim == f->rows * f->cols && ds->test.dim == f->rows * f->cols);
    int same = 1;
    for (int split = 0; split < 2; split++) {
        const dp_split *s = split ? &ds->test : &ds->train_all;
        for (uint32_t r = 0; r < s->n; r++) {
            same &= s->labels[r] == lab(f, split, r);
            for (uint32_t j = 0; j < s->dim; j++)
                same &= s->images[(size_t)r * s->dim + j] == px(split, r, j);
        }
    }
    CHECKF(same, "dataset contents differ from the sources");
}

static int open_ok(dp_dataset *ds, const char *name)
{
    dp_err err = {{0}};
    int rc = dp_dataset_open(ds, name, &err);
    CHECKF(rc == 0, "opening %s: %s", name, err.msg);
    return rc;
}

/* Opening must fail with a message containing every one of the needles. */
static void expect_refused(const char *name, const char *n1, const char *n2, const char *n3)
{
    dp_dataset ds;
    dp_err err = {{0}};
    int rc = dp_dataset_open(&ds, name, &err);
    fprintf(stderr, "refused as expected: %s\n", err.msg);
    CHECKF(rc == -1, "%s was accepted", name);
    const char *needles[3] = {n1, n2, n3};
    for (int i = 0; i < 3; i++)
        if (needles[i])
            CHECKF(strstr(err.msg, needles[i]) != NULL, "message lacks '%s': %s", needles[i],
                   err.msg);
    CHECK(ds.map == NULL);
    dp_dataset_close(&ds);
}

/* Opening must fail with a message containing neither needle. */
static void expect_refused_without(const char *name, const char *n1, const char *n2)
{
    dp_dataset ds;
    dp_err err = {{0}};
    CHECKF(dp_dataset_open(&ds, name, &err) == -1, "%s was accepted", name);
    CHECKF(!strstr(err.msg, n1) && !strstr(err.msg, n2), "message names '%s' or '%s': %s", n1,
           n2, err.msg);
    dp_dataset_close(&ds);
}

static int stat_ok(const char *path, struct stat *st)
{
    int rc = stat(path, st);
    CHECKF(rc == 0, "stat %s: %s", path, strerror(errno));
    return rc;
}

static char g_log[4096]; /* what the last open_logged wrote on stderr */

/* Runs dp_dataset_open with stderr sent to a file; returns the open's status
 * and whether the log contained `needle`. */
static int open_logged(dp_dataset *ds, const char *name, const char *needle, int *found)
{
    const char *log = sp("stderr.log", NULL);
    fflush(stderr);
    int saved = dup(2);
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
    dp_err err = {{0}};
    int rc = dp_dataset_open(ds, name, &err);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char *text = g_log;
    FILE *fp = fopen(log, "r");
    REQUIRE(fp != NULL);
    size_t n = fread(text, 1, sizeof g_log - 1, fp);
    text[n] = '\0';
    fclose(fp);
    fprintf(stderr, "log of that open: %s", text);
    *found = strstr(text, needle) != NULL;
    if (rc != 0)
        fprintf(stderr, "open failed: %s\n", err.msg);
    return rc;
}

static void patch_file(const char *path, long off, const void *bytes, size_t n)
{
    FILE *fp = fopen(path, "r+b");
    REQUIRE(fp != NULL);
    REQUIRE(fseek(fp, off, SEEK_SET) == 0);
    REQUIRE(fwrite(bytes, 1, n, fp) == n);
    REQUIRE(fclose(fp) == 0);
}

static int count_of(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* ---- the cache ---- */

/* One flipped byte anywhere in the payload: the next open (no environment
 * variable needed) warns once, naming the file and the damaged section,
 * rebuilds the cache from the sources and hands out the sources' data. */
static void test_cache_flip(const char *dir, const char *cache, const fake *f)
{
    static const struct {
        long off;
        const char *section;
    } cases[] = {
        {4096 + 17, "train images"},
        {4096 + 50 * 16 - 1, "train images"},
        {4096 + 50 * 16 + 3, "train labels"},
        {4096 + 50 * 17 + 20 * 16 - 5, "test images"},
        {4096 + 50 * 17 + 20 * 17 - 1, "test labels"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct stat a, b;
        size_t n;
        if (stat_ok(cache, &a) != 0)
            return;
        uint8_t *before = read_bytes(cache, &n);
        uint8_t byte = before[cases[i].off] ^ 0x01;
        patch_file(cache, cases[i].off, &byte, 1);
        dp_dataset ds;
        int found = 0;
        if (open_logged(&ds, dir, "payload checksum mismatch", &found) != 0) {
            CHECK(0);
            free(before);
            return;
        }
        CHECKF(found && strstr(g_log, cache) && strstr(g_log, cases[i].section),
               "byte %ld: the warning names neither %s nor the %s: %s", cases[i].off, cache,
               cases[i].section, g_log);
        CHECKF(count_of(g_log, "warning") == 1, "byte %ld: not one warning: %s", cases[i].off,
               g_log);
        check_contents(&ds, f);
        dp_dataset_close(&ds);
        stat_ok(cache, &b);
        CHECKF(a.st_ino != b.st_ino, "byte %ld: the cache was not rebuilt", cases[i].off);
        /* The rebuilt file is the original one, byte for byte, and opens quietly. */
        uint8_t *after = read_bytes(cache, &n);
        CHECKF(memcmp(before, after, n) == 0, "byte %ld: the rebuilt cache differs",
               cases[i].off);
        free(before);
        free(after);
        if (open_logged(&ds, dir, "warning", &found) == 0) {
            CHECKF(!found, "byte %ld: the rebuilt cache warns: %s", cases[i].off, g_log);
            check_contents(&ds, f);
            dp_dataset_close(&ds);
        }
    }
}

/* Patches a label of the cache and re-signs the file (section, payload and
 * header CRCs), so only the label check can catch it. */
static void patch_label_resigned(const char *cache, long off, uint8_t label)
{
    size_t n;
    uint8_t *p = read_bytes(cache, &n);
    p[off] = label;
    /* tiny: 50 + 20 records of 4x4; sections at 4096 in payload order */
    size_t lens[4] = {50 * 16, 50, 20 * 16, 20}, at = 4096;
    uint32_t all = 0;
    for (int i = 0; i < 4; i++) {
        uint32_t c = dp_crc32c(0, p + at, lens[i]);
        memcpy(p + 152 + 4 * i, &c, 4); /* little-endian host */
        all = dp_crc32c_combine(all, c, lens[i]);
        at += lens[i];
    }
    memcpy(p + 36, &all, 4);
    uint32_t h = dp_crc32c(0, p, 168);
    memcpy(p + 168, &h, 4);
    write_bytes(cache, p, n);
    free(p);
}

static void test_cache(void)
{
    fake f = {.n_train = 50, .n_test = 20, .rows = 4, .cols = 4, .bad_label_at = -1,
              .gz_test = 1};
    char dir[1200], cache[1200];
    snprintf(dir, sizeof dir, "%s", sp("tiny", NULL));
    snprintf(cache, sizeof cache, "%s", sp("tiny", "tiny.dpcache"));
    write_fake(dir, &f);
    dp_dataset ds;
    if (open_ok(&ds, dir) != 0)
        return;
    check_contents(&ds, &f);
    CHECK(ds.classes == 10);
    CHECKF(strcmp(ds.cache_path, cache) == 0, "cache at %s, expected %s", ds.cache_path, cache);
    CHECK(strcmp(ds.dir, dir) == 0);
    dp_dataset_close(&ds);
    CHECK(ds.map == NULL);
    dp_dataset_close(&ds); /* twice is harmless */

    /* Second open reuses the file as it is. */
    struct stat a, b;
    if (stat_ok(cache, &a) != 0)
        return;
    if (open_ok(&ds, dir) != 0)
        return;
    check_contents(&ds, &f);
    dp_dataset_close(&ds);
    stat_ok(cache, &b);
    CHECKF(a.st_ino == b.st_ino && a.st_mtim.tv_sec == b.st_mtim.tv_sec &&
               a.st_mtim.tv_nsec == b.st_mtim.tv_nsec,
           "the cache was rewritten although its sources did not change");

    /* A trailing slash names the same directory and the same cache. */
    char slash[1300];
    snprintf(slash, sizeof slash, "%s/", dir);
    if (open_ok(&ds, slash) == 0) {
        CHECK(strcmp(ds.cache_path, cache) == 0);
        dp_dataset_close(&ds);
    }
    stat_ok(cache, &b);
    CHECK(a.st_ino == b.st_ino);

    /* A modified source (same size, new labels) rebuilds the cache.  The
     * mtime is moved on explicitly, as a coarse-grained filesystem might not. */
    f.salt = 1;
    write_fake(dir, &f);
    struct timespec ts[2] = {{.tv_nsec = UTIME_OMIT}, {.tv_sec = time(NULL) + 5}};
    REQUIRE(utimensat(AT_FDCWD, sp("tiny", "train-labels-idx1-ubyte"), ts, 0) == 0);
    if (open_ok(&ds, dir) != 0)
        return;
    check_contents(&ds, &f);
    dp_dataset_close(&ds);
    stat_ok(cache, &b);
    CHECKF(a.st_ino != b.st_ino, "the cache was not rebuilt after a source changed");

    /* A damaged header: rebuilt with a warning, never a crash. */
    int found = 0;
    patch_file(cache, 0, "garbage!", 8);
    if (open_logged(&ds, dir, "warning", &found) == 0) {
        CHECKF(found, "no warning about the damaged cache");
        check_contents(&ds, &f);
        dp_dataset_close(&ds);
    } else {
        CHECK(0);
    }
    /* A header field changed behind its checksum. */
    patch_file(cache, 24, "\x07", 1);
    if (open_logged(&ds, dir, "checksum", &found) == 0) {
        CHECKF(found, "no warning about the header checksum");
        check_contents(&ds, &f);
        dp_dataset_close(&ds);
    } else {
        CHECK(0);
    }
    /* A cut file: its length disagrees with its header. */
    stat_ok(cache, &a);
    REQUIRE(truncate(cache, a.st_size - 3) == 0);
    if (open_logged(&ds, dir, "warning", &found) == 0) {
        CHECK(found);
        check_contents(&ds, &f);
        dp_dataset_close(&ds);
    } else {
        CHECK(0);
    }
    /* Too short to hold a header at all. */
    REQUIRE(truncate(cache, 10) == 0);
    if (open_logged(&ds, dir, "warning", &found) == 0) {
        CHECK(found);
        check_contents(&ds, &f);
        dp_dataset_close(&ds);
    } else {
        CHECK(0);
    }
    /* A flipped payload byte is caught on every open by the payload checksum. */
    test_cache_flip(dir, cache, &f);
    /* A label beyond the classes in its header is never handed out, even in
     * a cache whose checksums were made to match. */
    patch_label_resigned(cache, 4096 + 50 * 16 + 3, 200);
    if (open_logged(&ds, dir, "label", &found) == 0) {
        CHECK(found);
        check_contents(&ds, &f);
        dp_dataset_close(&ds);
    } else {
        CHECK(0);
    }

    /* DOWNPOUR_CACHE puts the cache in a shared directory, under a name that
     * carries a hash of the dataset's path. */
    setenv("DOWNPOUR_CACHE", sp("shared-cache", "sub"), 1);
    if (open_ok(&ds, dir) == 0) {
        const char *prefix = sp("shared-cache", "sub/tiny-");
        CHECKF(strncmp(ds.cache_path, prefix, strlen(prefix)) == 0 &&
                   strstr(ds.cache_path, ".dpcache") != NULL,
               "cache at %s", ds.cache_path);
        CHECK(access(ds.cache_path, R_OK) == 0);
        check_contents(&ds, &f);
        dp_dataset_close(&ds);
    }
    unsetenv("DOWNPOUR_CACHE");
}

/* Several processes open a dataset that has no cache yet: all succeed.  With
 * the builders' lock blocked (a directory where its file should be) they all
 * build at once and rely on the atomic rename alone. */
static void test_race(const char *name, int block_lock)
{
    fake f = {.n_train = 300, .n_test = 100, .rows = 8, .cols = 8, .bad_label_at = -1};
    char dir[1200], lock[1300];
    snprintf(dir, sizeof dir, "%s", sp(name, NULL));
    write_fake(dir, &f);
    snprintf(lock, sizeof lock, "%s/%s.dpcache.lock", dir, name);
    if (block_lock)
        REQUIRE(mkdir(lock, 0755) == 0);
    enum { KIDS = 6 };
    pid_t pid[KIDS];
    for (int i = 0; i < KIDS; i++) {
        fflush(stderr);
        pid[i] = fork();
        REQUIRE(pid[i] >= 0);
        if (pid[i] == 0) {
            int before = check_failures;
            dp_dataset ds;
            dp_err err;
            if (dp_dataset_open(&ds, dir, &err) != 0) {
                fprintf(stderr, "child %d: %s\n", i, err.msg);
                _exit(1);
            }
            check_contents(&ds, &f);
            dp_dataset_close(&ds);
            _exit(check_failures != before);
        }
    }
    for (int i = 0; i < KIDS; i++) {
        int status = 0;
        REQUIRE(waitpid(pid[i], &status, 0) == pid[i]);
        CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "racing child %d failed", i);
    }
    /* No temporary files are left behind, and the survivor is a valid cache. */
    int leftovers = 0;
    DIR *d = opendir(dir);
    REQUIRE(d != NULL);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        /* nor the builders' lock file (issue 29), unless the test put a directory there */
        int left = strstr(e->d_name, ".tmp.") != NULL ||
                   (!block_lock && strstr(e->d_name, ".lock") != NULL);
        leftovers += left;
        if (left)
            fprintf(stderr, "left behind: %s\n", e->d_name);
    }
    closedir(d);
    CHECK(leftovers == 0);
    dp_dataset ds;
    int found = 1;
    if (open_logged(&ds, dir, "rebuilding", &found) == 0) {
        CHECK(!found);
        check_contents(&ds, &f);
        dp_dataset_close(&ds);
    }
}

/* ---- checks between the files, and the messages ---- */

static void test_refusals(void)
{
    /* A named dataset (here a fake "mnist" under DOWNPOUR_DATA) refuses labels >= 10. */
    setenv("DOWNPOUR_DATA", sp("named", NULL), 1);
    REQUIRE(mkdir(sp("named", NULL), 0755) == 0);
    fake f = {.n_train = 50, .n_test = 20, .rows = 4, .cols = 4, .bad_label_at = 5,
              .bad_label = 10};
    write_fake(sp("named", "mnist"), &f);
    expect_refused("mnist", sp("named", "mnist/train-labels-idx1-ubyte"),
                   "label 10 at record 5 is out of range", "must be < 10");
    /* Fixed, it opens from DOWNPOUR_DATA/mnist with 10 classes. */
    f.bad_label_at = -1;
    write_fake(sp("named", "mnist"), &f);
    dp_dataset ds;
    if (open_ok(&ds, "mnist") == 0) {
        CHECK(strcmp(ds.dir, sp("named", "mnist")) == 0);
        CHECK(ds.classes == 10);
        check_contents(&ds, &f);
        dp_dataset_close(&ds);
    }
    /* Named datasets missing: where to get the files and where to put them,
     * naming nothing an installed program lacks (make run, scripts/). */
    expect_refused("fashion-mnist", sp("named", "fashion-mnist"), "dataset-fashion-mnist",
                   "4 IDX files");
    expect_refused_without("fashion-mnist", "make run", "scripts/");
    REQUIRE(mkdir(sp("empty", NULL), 0755) == 0);
    setenv("DOWNPOUR_DATA", sp("empty", NULL), 1);
    expect_refused("kmnist", sp("empty", "kmnist"), "codh.rois.ac.jp/kmnist",
                   "t10k-labels-idx1-ubyte.gz");
    /* Without DOWNPOUR_DATA the default is ./data (checked from the scratch dir). */
    unsetenv("DOWNPOUR_DATA");
    char cwd[1024];
    REQUIRE(getcwd(cwd, sizeof cwd) != NULL && chdir(scratch) == 0);
    expect_refused("kmnist", "./data/kmnist", "rois-codh/kmnist", NULL);
    REQUIRE(chdir(cwd) == 0);

    /* A directory: classes = 1 + the largest label, so 10 is allowed there... */
    f.bad_label_at = 5;
    write_fake(sp("label10", NULL), &f);
    if (open_ok(&ds, sp("label10", NULL)) == 0) {
        CHECK(ds.classes == 11);
        check_contents(&ds, &f);
        dp_dataset_close(&ds);
    }
    /* ...but a single class is not a classification problem. */
    fake z = f;
    z.zero_labels = 1;
    write_fake(sp("zeros", NULL), &z);
    expect_refused(sp("zeros", NULL), sp("zeros", "train-labels-idx1-ubyte"),
                   "at least 2 classes", NULL);

    /* Counts that disagree, named by both files. */
    fake c = {.n_train = 50, .n_test = 20, .rows = 4, .cols = 4, .bad_label_at = -1,
              .train_labels = 49};
    write_fake(sp("counts", NULL), &c);
    expect_refused(sp("counts", NULL), sp("counts", "train-images-idx3-ubyte"),
                   sp("counts", "train-labels-idx1-ubyte"), "49 labels");
    /* Train and test shapes that disagree. */
    fake s = {.n_train = 50, .n_test = 20, .rows = 4, .cols = 4, .bad_label_at = -1,
              .test_rows = 5, .gz_test = 1};
    write_fake(sp("shapes", NULL), &s);
    expect_refused(sp("shapes", NULL), sp("shapes", "t10k-images-idx3-ubyte.gz"), "4x4", "5x4");
    /* Images that are not 3-D. */
    fake r = {.n_train = 50, .n_test = 20, .rows = 4, .cols = 4, .bad_label_at = -1,
              .image_rank = 2};
    write_fake(sp("rank2", NULL), &r);
    expect_refused(sp("rank2", NULL), sp("rank2", "train-images-idx3-ubyte"), "3-D", NULL);
    /* A missing file, named with its directory. */
    fake m = {.n_train = 50, .n_test = 20, .rows = 4, .cols = 4, .bad_label_at = -1,
              .skip_test_labels = 1};
    write_fake(sp("missing", NULL), &m);
    expect_refused(sp("missing", NULL), sp("missing", "t10k-labels-idx1-ubyte"), "not found",
                   NULL);
    /* A damaged source file is reported by the IDX reader, naming the file. */
    write_fake(sp("damaged", NULL), &f);
    REQUIRE(truncate(sp("damaged", "train-images-idx3-ubyte"), 100) == 0);
    expect_refused(sp("damaged", NULL), sp("damaged", "train-images-idx3-ubyte"), "truncated",
                   NULL);
    /* Neither a name nor a directory. */
    expect_refused(sp("no-such-dataset", NULL), "no-such-dataset", "mnist, fashion-mnist", NULL);
    expect_refused("", "empty", NULL, NULL);
}

/* ---- split, shards, batches ---- */

static void test_split(const dp_dataset *ds)
{
    dp_split tr, va;
    dp_err err;
    REQUIRE(dp_dataset_split(ds, 40, 10, &tr, &va, &err) == 0);
    CHECK(tr.n == 40 && va.n == 10 && tr.dim == 16 && va.dim == 16);
    CHECK(tr.images == ds->train_all.images && tr.labels == ds->train_all.labels);
    CHECK(va.images == ds->train_all.images + 40 * 16 && va.labels == ds->train_all.labels + 40);
    CHECK(dp_dataset_split(ds, 30, 5, &tr, &va, &err) == 0 && va.n == 5);
    CHECK(dp_dataset_split(ds, 45, 10, &tr, &va, &err) == -1);
    CHECK(strstr(err.msg, "does not fit") != NULL);
    CHECK(dp_dataset_split(ds, 0, 10, &tr, &va, &err) == -1);
    CHECK(dp_dataset_split(ds, 4000000000u, 4000000000u, &tr, &va, &err) == -1);
}

static void test_shards(const dp_split *s)
{
    dp_err err;
    dp_shard_policy p;
    CHECK(dp_shard_parse("off", &p, &err) == 0 && p == DP_SHARD_OFF);
    CHECK(dp_shard_parse("data", &p, &err) == 0 && p == DP_SHARD_DATA);
    CHECK(dp_shard_parse("file", &p, &err) == 0 && p == DP_SHARD_FILE);
    CHECK(dp_shard_parse("DATA", &p, &err) == -1 && strstr(err.msg, "off, data or file"));
    CHECK(dp_shard_parse("", &p, &err) == -1);
    CHECK(strcmp(dp_shard_name(DP_SHARD_DATA), "data") == 0);
    CHECK(strcmp(dp_shard_name(DP_SHARD_COUNT), "unknown") == 0);

    const int ws[4] = {1, 2, 3, 5};
    for (int pi = DP_SHARD_OFF; pi < DP_SHARD_COUNT; pi++) {
        for (int wi = 0; wi < 4; wi++) {
            int w = ws[wi];
            uint32_t seen[64] = {0}, min_n = UINT32_MAX, max_n = 0;
            for (int k = 0; k < w; k++) {
                dp_batcher b;
                REQUIRE(dp_batcher_init(&b, s, 7, 0, (dp_shard_policy)pi, k, w, &err) == 0);
                min_n = b.n < min_n ? b.n : min_n;
                max_n = b.n > max_n ? b.n : max_n;
                for (uint32_t i = 0; i < b.n; i++) {
                    REQUIRE(b.order[i] < s->n);
                    seen[b.order[i]]++;
                    if (pi == DP_SHARD_DATA)
                        CHECK(b.order[i] == (uint32_t)k + i * (uint32_t)w);
                    if (pi == DP_SHARD_FILE && i > 0)
                        CHECK(b.order[i] == b.order[i - 1] + 1);
                }
                /* Shuffled, a FILE or OFF shard keeps exactly its own records
                 * (DATA shards reshuffle the whole split: checked below). */
                dp_batcher bs;
                REQUIRE(dp_batcher_init(&bs, s, 7, 1, (dp_shard_policy)pi, k, w, &err) == 0);
                dp_batcher_start_epoch(&bs, 3);
                uint32_t a[64] = {0}, c[64] = {0};
                for (uint32_t i = 0; i < b.n; i++)
                    a[b.order[i]]++, c[bs.order[i]]++;
                if (pi != DP_SHARD_DATA)
                    CHECK(memcmp(a, c, sizeof a) == 0);
                dp_batcher_free(&bs);
                dp_batcher_free(&b);
            }
            int exact = 1;
            for (uint32_t i = 0; i < s->n; i++)
                exact &= seen[i] == (pi == DP_SHARD_OFF ? (uint32_t)w : 1u);
            CHECKF(exact, "policy %s, %d workers: records not covered exactly",
                   dp_shard_name((dp_shard_policy)pi), w);
            if (pi != DP_SHARD_OFF)
                CHECK(max_n - min_n <= 1);
        }
    }
    /* DATA, shuffled: worker k's j-th batch of b is, as a set, its share of
     * the j-th batch of w*b of one process with the same seed; the shards of
     * one epoch partition the split; the next epoch deals other records. */
    for (int wi = 1; wi < 4; wi++) {
        uint32_t w = (uint32_t)ws[wi], bsz = 3;
        dp_batcher one, k_b[5];
        REQUIRE(dp_batcher_init(&one, s, 11, 1, DP_SHARD_DATA, 0, 1, &err) == 0);
        dp_batcher_start_epoch(&one, 2);
        uint32_t seen[64] = {0};
        for (uint32_t k = 0; k < w; k++) {
            REQUIRE(dp_batcher_init(&k_b[k], s, 11, 1, DP_SHARD_DATA, (int)k, (int)w, &err) == 0);
            dp_batcher_start_epoch(&k_b[k], 2);
            for (uint32_t i = 0; i < k_b[k].n; i++)
                seen[k_b[k].order[i]]++;
        }
        int exact = 1;
        for (uint32_t i = 0; i < s->n; i++)
            exact &= seen[i] == 1;
        CHECKF(exact, "DATA, %u workers: one epoch does not deal every record once", w);
        for (uint32_t j = 0; (j + 1) * bsz * w <= s->n; j++) {
            uint32_t a[64] = {0}, c[64] = {0};
            for (uint32_t i = 0; i < bsz * w; i++)
                a[one.order[j * bsz * w + i]]++;
            for (uint32_t k = 0; k < w; k++)
                for (uint32_t i = 0; i < bsz; i++)
                    c[k_b[k].order[j * bsz + i]]++;
            CHECKF(memcmp(a, c, sizeof a) == 0, "DATA, %u workers: batch %u differs from the "
                   "single process's", w, j);
        }
        uint32_t before[64];
        memcpy(before, k_b[0].order, k_b[0].n * sizeof *before);
        dp_batcher_start_epoch(&k_b[0], 3);
        CHECK(memcmp(before, k_b[0].order, k_b[0].n * sizeof *before) != 0);
        for (uint32_t k = 0; k < w; k++)
            dp_batcher_free(&k_b[k]);
        dp_batcher_free(&one);
    }
    /* DATA by blocks (--sum-chunk): worker k's j-th batch of b is, in order,
     * positions k*b .. (k+1)*b - 1 of the single process's j-th batch of
     * w*b, the last step's too; the shards of an epoch partition the split. */
    for (int wi = 0; wi < 4; wi++) {
        uint32_t w = (uint32_t)ws[wi], bsz = 3;
        dp_batcher one, k_b[5];
        REQUIRE(dp_batcher_init(&one, s, 11, 1, DP_SHARD_DATA, 0, 1, &err) == 0);
        dp_batcher_start_epoch(&one, 2);
        uint32_t seen[64] = {0}, at = 0;
        for (uint32_t k = 0; k < w; k++) {
            REQUIRE(dp_batcher_init(&k_b[k], s, 11, 1, DP_SHARD_DATA, (int)k, (int)w, &err) == 0);
            CHECKF(dp_batcher_blocks(&k_b[k], bsz, &err) == 0, "%s", err.msg);
            dp_batcher_start_epoch(&k_b[k], 2);
            for (uint32_t i = 0; i < k_b[k].n; i++)
                seen[k_b[k].order[i]]++;
        }
        int exact = 1;
        for (uint32_t i = 0; i < s->n; i++)
            exact &= seen[i] == 1;
        CHECKF(exact, "DATA by blocks, %u workers: one epoch does not deal every record once", w);
        for (uint32_t j = 0; at < s->n && j < s->n; j++) /* j: bounded if a deal fails */
            for (uint32_t k = 0; k < w; k++)
                for (uint32_t i = j * bsz; i < (j + 1) * bsz && i < k_b[k].n; i++, at++)
                    CHECKF(k_b[k].order[i] == one.order[at], "DATA by blocks, %u workers: step "
                           "%u, worker %u, record %u is not the single process's %u", w, j, k,
                           i, at);
        for (uint32_t k = 0; k < w; k++)
            dp_batcher_free(&k_b[k]);
        dp_batcher_free(&one);
    }
    /* Refusals: index out of range, no workers, a shard with no records. */
    dp_batcher b;
    CHECK(dp_batcher_init(&b, s, 1, 1, DP_SHARD_DATA, 3, 3, &err) == -1);
    CHECK(strstr(err.msg, "out of range") != NULL);
    CHECK(dp_batcher_init(&b, s, 1, 1, DP_SHARD_DATA, -1, 3, &err) == -1);
    CHECK(dp_batcher_init(&b, s, 1, 1, DP_SHARD_FILE, 0, 0, &err) == -1);
    CHECK(dp_batcher_init(&b, s, 1, 1, (dp_shard_policy)7, 0, 1, &err) == -1);
    dp_split tiny = *s;
    tiny.n = 3;
    CHECK(dp_batcher_init(&b, &tiny, 1, 1, DP_SHARD_DATA, 4, 5, &err) == -1);
    CHECK(strstr(err.msg, "no records") != NULL);
    CHECK(dp_batcher_init(&b, &tiny, 1, 1, DP_SHARD_FILE, 0, 5, &err) == -1);
    CHECK(dp_batcher_init(&b, &tiny, 1, 1, DP_SHARD_FILE, 1, 5, &err) == 0 && b.n == 1);
    dp_batcher_free(&b);
    dp_batcher_free(NULL);
}

static int is_perm(const uint32_t *o, uint32_t n)
{
    uint8_t seen[256] = {0};
    for (uint32_t i = 0; i < n; i++) {
        if (o[i] >= n || seen[o[i]])
            return 0;
        seen[o[i]] = 1;
    }
    return 1;
}

static void test_batcher(const dp_split *s)
{
    dp_err err;
    dp_batcher a, b;
    REQUIRE(dp_batcher_init(&a, s, 42, 1, DP_SHARD_OFF, 0, 1, &err) == 0);
    REQUIRE(dp_batcher_init(&b, s, 42, 1, DP_SHARD_OFF, 0, 1, &err) == 0);
    uint32_t n = a.n, e0[64], e1[64];
    REQUIRE(n == 50);
    dp_batcher_start_epoch(&a, 0);
    memcpy(e0, a.order, n * sizeof *e0);
    dp_batcher_start_epoch(&a, 1);
    memcpy(e1, a.order, n * sizeof *e1);
    CHECK(is_perm(e0, n) && is_perm(e1, n));
    CHECK(memcmp(e0, e1, n * sizeof *e0) != 0);
    uint32_t natural[64];
    for (uint32_t i = 0; i < n; i++)
        natural[i] = i;
    CHECK(memcmp(e0, natural, n * sizeof *e0) != 0);
    /* Another batcher reproduces epoch 1 directly, and epoch 0 after it. */
    dp_batcher_start_epoch(&b, 1);
    CHECK(memcmp(b.order, e1, n * sizeof *e1) == 0);
    dp_batcher_start_epoch(&b, 0);
    CHECK(memcmp(b.order, e0, n * sizeof *e0) == 0);
    /* Another seed, another order. */
    dp_batcher c;
    REQUIRE(dp_batcher_init(&c, s, 43, 1, DP_SHARD_OFF, 0, 1, &err) == 0);
    dp_batcher_start_epoch(&c, 0);
    CHECK(memcmp(c.order, e0, n * sizeof *e0) != 0);
    dp_batcher_free(&c);
    /* Without shuffling every epoch is the natural order. */
    REQUIRE(dp_batcher_init(&c, s, 42, 0, DP_SHARD_OFF, 0, 1, &err) == 0);
    dp_batcher_start_epoch(&c, 5);
    CHECK(memcmp(c.order, natural, n * sizeof *natural) == 0);
    dp_batcher_free(&c);

    /* Batches: 16, 16, 16, then a short 2, then 0; contents as gathered. */
    enum { BATCH = 16, DIM = 16 };
    float x[BATCH * DIM], gx[BATCH * DIM];
    uint8_t y[BATCH], gy[BATCH];
    CHECK(dp_batcher_batches(&a, BATCH) == 4);
    CHECK(dp_batcher_batches(&a, 50) == 1 && dp_batcher_batches(&a, 0) == 0);
    dp_batcher_start_epoch(&a, 1);
    uint32_t pos = 0;
    int got, sizes[8], nb = 0;
    while ((got = dp_batcher_next(&a, x, y, BATCH)) > 0 && nb < 8) {
        sizes[nb++] = got;
        dp_split_gather(gx, gy, s, e1 + pos, got);
        CHECK(memcmp(x, gx, (size_t)got * DIM * sizeof *x) == 0);
        CHECK(memcmp(y, gy, (size_t)got) == 0);
        uint32_t r = e1[pos];
        CHECK(y[0] == s->labels[r]);
        CHECK(x[5] == (float)s->images[(size_t)r * DIM + 5] / 255.0f);
        pos += (uint32_t)got;
    }
    CHECK(nb == 4 && sizes[0] == 16 && sizes[3] == 2 && pos == 50);
    CHECK(dp_batcher_next(&a, x, y, BATCH) == 0);
    CHECK(dp_batcher_next(&a, x, y, 0) == 0);
    /* The pixel scale covers 0 and 1 exactly. */
    uint8_t imgs[2 * DIM], labs[2] = {1, 2};
    for (int j = 0; j < 2 * DIM; j++)
        imgs[j] = (uint8_t)(j % 2 ? 255 : 0);
    dp_split two = {.images = imgs, .labels = labs, .n = 2, .dim = DIM};
    uint32_t idx[2] = {1, 0};
    dp_split_gather(gx, NULL, &two, idx, 2);
    CHECK(gx[0] == 0.0f && gx[1] == 1.0f && gx[DIM + 1] == 1.0f);
    dp_batcher_free(&a);
    dp_batcher_free(&b);
}

/* Every byte value converts to exactly (float)v / 255 (the gather's
 * conversion avoids the divider: src/data/batch.c), in the vector body and in
 * the tail of a record, over the pool too. */
static void test_gather_exact(void)
{
    enum { DIM = 256 + 7, N = 160 }; /* N * DIM is above the pool's split size */
    static uint8_t imgs[N * DIM];
    static float gx[N * DIM];
    uint8_t labs[N] = {0};
    uint32_t idx[N];
    for (int i = 0; i < N; i++) {
        idx[i] = (uint32_t)(N - 1 - i);
        for (int j = 0; j < DIM; j++)
            imgs[i * DIM + j] = (uint8_t)(j + i);
    }
    dp_split sp1 = {.images = imgs, .labels = labs, .n = N, .dim = DIM};
    dp_pool_set_threads(2, NULL);
    dp_split_gather(gx, NULL, &sp1, idx, N);
    int bad = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < DIM; j++)
            bad += gx[i * DIM + j] != (float)imgs[idx[i] * DIM + j] / 255.0f;
    CHECKF(bad == 0, "%d values differ from the division", bad);
    dp_pool_set_threads(1, NULL);
}

/* ---- the real MNIST, when present ---- */

static void test_real(const char *root)
{
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/mnist", root);
    struct stat st;
    if (stat(dir, &st) != 0) {
        fprintf(stderr, "%s is absent: skipping the real-MNIST checks\n", dir);
        return;
    }
    setenv("DOWNPOUR_DATA", root, 1);
    setenv("DOWNPOUR_CACHE", sp("real-cache", NULL), 1);
    dp_dataset ds;
    double t0 = dp_now();
    if (open_ok(&ds, "mnist") != 0)
        return;
    double t1 = dp_now();
    dp_dataset_close(&ds);
    if (open_ok(&ds, "mnist") != 0)
        return;
    double t2 = dp_now();
    fprintf(stderr, "MNIST: first open (builds the cache) %.1f ms, second open %.2f ms\n",
            (t1 - t0) * 1e3, (t2 - t1) * 1e3);
    CHECK(ds.train_all.n == 60000 && ds.test.n == 10000);
    CHECK(ds.rows == 28 && ds.cols == 28 && ds.train_all.dim == 784);
    CHECK(ds.classes == 10);
    CHECK(ds.train_all.labels[0] == 5);
    uint32_t hist[256] = {0};
    for (uint32_t i = 0; i < ds.train_all.n; i++)
        hist[ds.train_all.labels[i]]++;
    for (int c = 0; c < 10; c++)
        CHECKF(hist[c] >= 5000 && hist[c] <= 7000, "class %d has %u training records", c, hist[c]);
    dp_split tr, va;
    dp_err err;
    CHECK(dp_dataset_split(&ds, 54000, 6000, &tr, &va, &err) == 0);
    dp_dataset_close(&ds);

    /* Fashion-MNIST, gzipped behind symlinks, when present. */
    snprintf(dir, sizeof dir, "%s/fashion-mnist", root);
    if (stat(dir, &st) == 0 && open_ok(&ds, "fashion-mnist") == 0) {
        CHECK(ds.train_all.n == 60000 && ds.test.n == 10000 && ds.rows == 28 && ds.cols == 28);
        CHECK(ds.train_all.labels[0] == 9); /* an ankle boot */
        dp_dataset_close(&ds);
    }
    unsetenv("DOWNPOUR_CACHE");
}

/* The builders' lock leaves no file behind, and a waiter whose file was
 * unlinked under it takes the lock again on the file now at the path. */
static void test_lock_file(void)
{
    char cache[1200], lock[1300];
    snprintf(cache, sizeof cache, "%s", sp("lockdir", NULL));
    REQUIRE(mkdir(cache, 0755) == 0 || errno == EEXIST);
    snprintf(cache, sizeof cache, "%s", sp("lockdir", "c.dpcache"));
    snprintf(lock, sizeof lock, "%s.lock", cache);
    int fd = dp_cache_lock(cache);
    REQUIRE(fd >= 0);
    CHECK(access(lock, F_OK) == 0);
    fflush(stderr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) { /* queues behind the parent, then must hold the live file */
        close(fd);      /* the inherited description would hold the parent's lock */
        int k = dp_cache_lock(cache);
        struct stat a, b;
        int ok = k >= 0 && fstat(k, &a) == 0 && stat(lock, &b) == 0 && a.st_ino == b.st_ino;
        dp_cache_unlock(cache, k);
        _exit(ok && access(lock, F_OK) != 0 ? 0 : 1);
    }
    usleep(20000); /* let the child queue; the check holds either way */
    dp_cache_unlock(cache, fd);
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the waiter held a stale lock");
    CHECKF(access(lock, F_OK) != 0, "%s left behind", lock);
}

int main(void)
{
    char real_root[1024] = "";
    const char *env = getenv("DOWNPOUR_DATA");
    if (env && *env)
        snprintf(real_root, sizeof real_root, "%s", env);
    scratch_make(scratch, sizeof scratch, "test_dataset");
    unsetenv("DOWNPOUR_DATA");
    unsetenv("DOWNPOUR_CACHE");
    setenv("XDG_CACHE_HOME", sp("xdg", NULL), 1);

    test_cache();
    test_race("race", 0);
    test_race("race-unlocked", 1);
    test_lock_file();
    test_refusals();

    fake f = {.n_train = 50, .n_test = 20, .rows = 4, .cols = 4, .bad_label_at = -1};
    write_fake(sp("small", NULL), &f);
    dp_dataset ds;
    if (open_ok(&ds, sp("small", NULL)) == 0) {
        test_split(&ds);
        test_shards(&ds.train_all);
        test_batcher(&ds.train_all);
        dp_dataset_close(&ds);
    }
    test_gather_exact();

    if (real_root[0])
        test_real(real_root);
    else
        fprintf(stderr, "DOWNPOUR_DATA is not set: skipping the real-MNIST checks\n");

    int rc = CHECK_DONE();
    if (rc == 0)
        scratch_remove(scratch);
    return rc;
}
