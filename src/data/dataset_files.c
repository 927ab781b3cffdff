/* Datasets of record files (records.h) behind dp_dataset_open: decoded once
 * into a cache file when the decoded records fit the memory budget, else
 * streamed from their files with only the test (and validation) records in
 * memory (docs/datasets.md, "The decoded cache or streaming").
 *
 * Cache file, version 3 (all integers little-endian).  It is as safe as the
 * IDX datasets' version 2 (dataset.c): written to a temporary file, fsynced
 * and renamed into place; builders queue on flock("<cache>.lock"); the
 * header, the sources and every payload section checked on every open; a
 * cache failing a check is rebuilt with a warning naming it and the check.
 *   0   magic "DPCACHE\x1a"     8   u32 version (3)     12  u32 payload offset
 *   16  u32 header length H     20  u32 format          24  u32 value kind
 *   28  u32 rows                32  u32 cols            36  u32 channels
 *   40  u32 classes             44  u32 training files  48  u32 test files
 *   52  u32 CRC32C of the payload
 *   56  u64 n_train             64  u64 n_test          72  u64 payload length
 *   80  u64 dataset key: FNV-1a of the spec's absolute path and the options
 *   88  4 x u32 CRC32C of each payload section, in payload order
 *   104 per file, the training files then the test files, 64 bytes:
 *       u64 records; u64 size, u64 mtime in ns, u64 inode of the features'
 *       file; the same three of the labels' file (an .npy pair; else 0);
 *       u64 FNV-1a of the file's names (paths and .npz members)
 *   H-4 u32 CRC32C of bytes [0, H-4)
 *   payload, at H rounded up to 4096: train values, test values, train
 *   labels, test labels; values are bytes or little-endian float32s (the
 *   float sections start 4-byte aligned, so the mapping is used as is).
 * The per-file records give train_all.file_end without reading the files. */
#include "downpour/dataset.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "downpour/clock.h"
#include "downpour/crc32c.h"
#include "downpour/file.h"
#include "downpour/log.h"
#include "downpour/records.h"
#include "downpour/stream.h"

#include "cache.h"
#include "dataset_files.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the cache maps little-endian float32s as they lie: a big-endian host needs a byte swap"
#endif

#define CACHE_VERSION 3u
#define HDR_FIXED 104u
#define SRC_BYTES 64u
#define MAX_FILES 65536u /* bounds the header (4 MiB) before it is read */
#define PAGE 4096u
#define MAX_DIM (1u << 24)

enum { SEC_TRAIN_VALUES, SEC_TEST_VALUES, SEC_TRAIN_LABELS, SEC_TEST_LABELS, SEC_COUNT };
static const char *const section_names[SEC_COUNT] = {"train values", "test values",
                                                       "train labels", "test labels"};


struct dp_val_buffer {
    void *mem;
    size_t cap;
};

typedef struct file_stat {
    uint64_t size, mtime_ns, ino;
} file_stat;

/* One file of the dataset as the cache header records it. */
typedef struct src_entry {
    uint64_t records;
    file_stat feat, lab;
    uint64_t names;
} src_entry;

/* What a cache header describes. */
typedef struct layout {
    uint32_t format, kind, rows, cols, channels, classes, n_train_files, n_test_files;
    uint64_t n_train, n_test, payload_off, payload_len;
    uint32_t header_len, payload_crc, sec_crc[SEC_COUNT];
    size_t sec_len[SEC_COUNT];
} layout;

/* ---- small helpers ---- */

static const dp_data_file *file_at(const dp_dataset *ds, size_t i)
{
    return i < ds->files.train.n ? &ds->files.train.files[i]
                                 : &ds->files.test.files[i - ds->files.train.n];
}

static size_t n_files(const dp_dataset *ds)
{
    return ds->files.train.n + ds->files.test.n;
}

static size_t record_bytes(const dp_record_shape *s)
{
    return (size_t)s->dim * dp_value_size(s->kind);
}

/* 60000 -> "60,000". */
static const char *count_text(char *buf, size_t cap, uint64_t v)
{
    char raw[32];
    int n = snprintf(raw, sizeof raw, "%llu", (unsigned long long)v), o = 0;
    for (int i = 0; i < n && (size_t)o + 2 < cap; i++) {
        if (i > 0 && (n - i) % 3 == 0)
            buf[o++] = ',';
        buf[o++] = raw[i];
    }
    buf[o] = '\0';
    return buf;
}

/* 54950000 -> "55.0 MB" (decimal units, as dp_data_memory_parse reads them). */
static const char *bytes_text(char *buf, size_t cap, uint64_t v)
{
    static const char *const unit[] = {"B", "kB", "MB", "GB", "TB", "PB"};
    double x = (double)v;
    int u = 0;
    while (x >= 999.95 && u < 5) {
        x /= 1000;
        u++;
    }
    if (u == 0)
        snprintf(buf, cap, "%llu B", (unsigned long long)v);
    else
        snprintf(buf, cap, "%.1f %s", x, unit[u]);
    return buf;
}

static int stat_one(const char *path, file_stat *out, dp_err *err)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return dp_errf(err, "%s: %s", path, strerror(errno));
    out->size = (uint64_t)st.st_size;
    out->mtime_ns = (uint64_t)st.st_mtim.tv_sec * 1000000000u + (uint64_t)st.st_mtim.tv_nsec;
    out->ino = (uint64_t)st.st_ino;
    return 0;
}

static uint64_t hash_str(uint64_t h, const char *s)
{
    return s ? dp_cache_hash(h, s, strlen(s) + 1) : dp_cache_hash(h, "", 1);
}

/* Every file's size, mtime and inode (and its labels file's) and names. */
static int stat_sources(const dp_dataset *ds, src_entry *src, dp_err *err)
{
    for (size_t i = 0; i < n_files(ds); i++) {
        const dp_data_file *f = file_at(ds, i);
        memset(&src[i], 0, sizeof src[i]);
        src[i].records = f->records;
        if (stat_one(f->path, &src[i].feat, err) < 0 ||
            (f->labels_path && stat_one(f->labels_path, &src[i].lab, err) < 0))
            return -1;
        uint64_t h = hash_str(DP_CACHE_HASH_SEED, f->path);
        h = hash_str(h, f->labels_path);
        h = hash_str(h, f->member);
        src[i].names = hash_str(h, f->labels_member);
    }
    return 0;
}

/* ---- the memory budget ---- */

int dp_data_memory_parse(const char *s, size_t *out, const char *what, dp_err *err)
{
    if (!s || !isdigit((unsigned char)*s))
        return dp_errf(err, "%s: '%s' is not a size (a number of bytes, optionally with k, M, "
                       "G or T, or Ki, Mi, Gi, Ti: 800M, 12G, 8Gi)", what, s ? s : "");
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    double mult = 1;
    const char *units = "KMGT";
    const char *u = *end ? strchr(units, toupper((unsigned char)*end)) : NULL;
    if (u) {
        int binary = end[1] == 'i';
        for (const char *k = units; k <= u; k++)
            mult *= binary ? 1024.0 : 1000.0;
        end += 1 + binary;
    }
    if (*end == 'B')
        end++;
    if (errno || *end || !isfinite(v) || v * mult < 1)
        return dp_errf(err, "%s: '%s' is not a size (a number of bytes, optionally with k, M, "
                       "G or T, or Ki, Mi, Gi, Ti: 800M, 12G, 8Gi)", what, s);
    if (v * mult >= (double)SIZE_MAX)
        return dp_errf(err, "%s: %s is more bytes than this machine can address", what, s);
    *out = (size_t)(v * mult);
    return 0;
}

/* The budget: the caller's, else $DOWNPOUR_DATA_MEMORY, else half of RAM. */
static int resolve_memory(size_t asked, size_t *out, dp_err *err)
{
    if (asked) {
        *out = asked;
        return 0;
    }
    const char *env = getenv("DOWNPOUR_DATA_MEMORY");
    if (env && *env)
        return dp_data_memory_parse(env, out, "DOWNPOUR_DATA_MEMORY", err);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0)
        return dp_errf(err, "cannot read the machine's memory size (sysconf: %s). Hint: set "
                       "DOWNPOUR_DATA_MEMORY or --data-memory", strerror(errno));
    uint64_t half = (uint64_t)pages * (uint64_t)page / 2;
    *out = half > SIZE_MAX ? SIZE_MAX : (size_t)half;
    return 0;
}

/* ---- layout ---- */

/* Fills L's sizes from its counts and shape; -1 when they exceed the
 * format's limits. */
static int layout_sizes(layout *L)
{
    uint64_t dim = (uint64_t)L->rows * L->cols * L->channels;
    uint64_t n_src = (uint64_t)L->n_train_files + L->n_test_files;
    if (L->kind >= DP_VALUES_KIND_COUNT || dim == 0 || dim > MAX_DIM || n_src == 0 ||
        n_src > MAX_FILES || L->n_train > UINT32_MAX || L->n_test > UINT32_MAX)
        return -1;
    uint64_t vs = dp_value_size((dp_value_kind)L->kind);
    L->header_len = (uint32_t)(HDR_FIXED + SRC_BYTES * n_src + 4);
    L->payload_off = (L->header_len + PAGE - 1) / PAGE * PAGE;
    uint64_t len = (L->n_train + L->n_test) * (dim * vs + 1);
    if (len > ((uint64_t)1 << 42) || len > SIZE_MAX - L->payload_off)
        return -1;
    L->payload_len = len;
    L->sec_len[SEC_TRAIN_VALUES] = (size_t)(L->n_train * dim * vs);
    L->sec_len[SEC_TEST_VALUES] = (size_t)(L->n_test * dim * vs);
    L->sec_len[SEC_TRAIN_LABELS] = (size_t)L->n_train;
    L->sec_len[SEC_TEST_LABELS] = (size_t)L->n_test;
    return 0;
}

static void layout_of(const dp_dataset *ds, layout *L)
{
    memset(L, 0, sizeof *L);
    L->format = (uint32_t)ds->files.format;
    L->kind = (uint32_t)ds->files.shape.kind;
    L->rows = ds->files.shape.rows;
    L->cols = ds->files.shape.cols;
    L->channels = ds->files.shape.channels;
    L->n_train_files = (uint32_t)ds->files.train.n;
    L->n_test_files = (uint32_t)ds->files.test.n;
    L->n_train = ds->files.train.records;
    L->n_test = ds->files.test.records;
}

/* Sets the files' counts and shape from a cache's header, as
 * dp_data_files_count would have. */
static void counts_from(dp_dataset *ds, const layout *L, const uint64_t *records)
{
    dp_data_split_files *sp[2] = {&ds->files.train, &ds->files.test};
    size_t i = 0;
    for (int s = 0; s < 2; s++) {
        sp[s]->records = 0;
        for (size_t f = 0; f < sp[s]->n; f++, i++) {
            sp[s]->files[f].first = sp[s]->records;
            sp[s]->files[f].records = records[i];
            sp[s]->records += records[i];
        }
    }
    ds->files.shape = (dp_record_shape){(dp_value_kind)L->kind, L->rows, L->cols, L->channels,
                                        L->rows * L->cols * L->channels};
    ds->files.counted = 1;
}

/* The views of a payload at base (a mapping or the test records). */
static void fill_view(dp_split *s, const uint8_t *values, const uint8_t *labels, uint64_t n,
                      const dp_record_shape *shape)
{
    s->n = (uint32_t)n;
    s->dim = shape->dim;
    s->labels = labels;
    if (shape->kind == DP_VALUES_F32)
        s->values = (const float *)(const void *)values;
    else
        s->images = values;
}

static void fill_views(dp_dataset *ds, const uint8_t *base, const layout *L)
{
    const uint8_t *p = base + L->payload_off;
    const uint8_t *tr_lab = p + L->sec_len[0] + L->sec_len[1];
    fill_view(&ds->train_all, p, tr_lab, L->n_train, &ds->files.shape);
    fill_view(&ds->test, p + L->sec_len[0], tr_lab + L->n_train, L->n_test, &ds->files.shape);
}

/* ---- reading a cache ---- */

/* Checks the cache at path against the sources (and, with map, maps it and
 * checks its payload and labels, filling ds's views).  records gets each
 * file's count. */
static dp_cache_state try_cache(dp_dataset *ds, const char *path, const src_entry *src,
                                uint64_t key, uint32_t max_classes, int map, layout *L,
                                uint64_t *records, char *why, size_t whylen)
{
    int fd;
    struct stat fs;
    dp_cache_state st = dp_cache_open(path, &fd, &fs, why, whylen);
    if (st != DP_CACHE_OK)
        return st;
    st = DP_CACHE_CORRUPT;
    uint8_t *h = NULL;
    uint8_t fixed[HDR_FIXED];
    if (pread(fd, fixed, sizeof fixed, 0) != (ssize_t)sizeof fixed) {
        dp_cache_fmt(why, whylen, "header is truncated (the file is %lld bytes)",
                     (long long)fs.st_size);
        goto done;
    }
    if (memcmp(fixed, DP_CACHE_MAGIC, 8) != 0) {
        dp_cache_fmt(why, whylen, "bad magic");
        goto done;
    }
    if (dp_get32(fixed + 8) != CACHE_VERSION) {
        dp_cache_fmt(why, whylen, "format version %u, expected %u", dp_get32(fixed + 8),
                     CACHE_VERSION);
        st = DP_CACHE_STALE;
        goto done;
    }
    memset(L, 0, sizeof *L);
    L->format = dp_get32(fixed + 20);
    L->kind = dp_get32(fixed + 24);
    L->rows = dp_get32(fixed + 28);
    L->cols = dp_get32(fixed + 32);
    L->channels = dp_get32(fixed + 36);
    L->classes = dp_get32(fixed + 40);
    L->n_train_files = dp_get32(fixed + 44);
    L->n_test_files = dp_get32(fixed + 48);
    L->n_train = dp_get64(fixed + 56);
    L->n_test = dp_get64(fixed + 64);
    /* The sizes follow from the counts and shape; the stored ones must agree
     * before the header's length is trusted for an allocation. */
    if (layout_sizes(L) < 0 || dp_get32(fixed + 16) != L->header_len ||
        dp_get32(fixed + 12) != L->payload_off || dp_get64(fixed + 72) != L->payload_len ||
        L->format >= DP_DATA_FORMAT_COUNT || L->classes < 2 || L->classes > 256 ||
        L->n_train == 0 || L->n_test == 0) {
        dp_cache_fmt(why, whylen, "header fields are inconsistent");
        goto done;
    }
    if ((uint64_t)fs.st_size != L->payload_off + L->payload_len) {
        dp_cache_fmt(why, whylen, "file is %lld bytes, its header describes %llu",
                     (long long)fs.st_size,
                     (unsigned long long)(L->payload_off + L->payload_len));
        goto done;
    }
    h = malloc(L->header_len);
    if (!h) {
        dp_cache_fmt(why, whylen, "cannot allocate %u bytes for its header", L->header_len);
        goto done;
    }
    if (pread(fd, h, L->header_len, 0) != (ssize_t)L->header_len) {
        dp_cache_fmt(why, whylen, "cannot read its header: %s", strerror(errno));
        goto done;
    }
    if (dp_get32(h + L->header_len - 4) != dp_crc32c(0, h, L->header_len - 4)) {
        dp_cache_fmt(why, whylen, "header checksum mismatch");
        goto done;
    }
    L->payload_crc = dp_get32(h + 52);
    for (int i = 0; i < SEC_COUNT; i++)
        L->sec_crc[i] = dp_get32(h + 88 + 4 * i);
    uint64_t tr = 0, te = 0;
    for (size_t i = 0; i < (size_t)L->n_train_files + L->n_test_files; i++)
        *(i < L->n_train_files ? &tr : &te) += dp_get64(h + HDR_FIXED + SRC_BYTES * i);
    if (tr != L->n_train || te != L->n_test) {
        dp_cache_fmt(why, whylen, "its files' record counts do not add up to its splits'");
        goto done;
    }
    st = DP_CACHE_STALE;
    if (dp_get64(h + 80) != key) {
        dp_cache_fmt(why, whylen, "it was built from another spec or other options");
        goto done;
    }
    if (L->format != (uint32_t)ds->files.format || L->n_train_files != ds->files.train.n ||
        L->n_test_files != ds->files.test.n) {
        dp_cache_fmt(why, whylen, "it was built from %u + %u files, the dataset has %zu + %zu",
                     L->n_train_files, L->n_test_files, ds->files.train.n, ds->files.test.n);
        goto done;
    }
    for (size_t i = 0; i < n_files(ds); i++) {
        const uint8_t *s = h + HDR_FIXED + SRC_BYTES * i;
        const src_entry *e = &src[i];
        if (dp_get64(s + 8) != e->feat.size || dp_get64(s + 16) != e->feat.mtime_ns ||
            dp_get64(s + 24) != e->feat.ino || dp_get64(s + 32) != e->lab.size ||
            dp_get64(s + 40) != e->lab.mtime_ns || dp_get64(s + 48) != e->lab.ino ||
            dp_get64(s + 56) != e->names) {
            dp_cache_fmt(why, whylen, "%s changed since it was built", file_at(ds, i)->path);
            goto done;
        }
        records[i] = dp_get64(s);
    }
    if (L->classes > max_classes) {
        dp_cache_fmt(why, whylen, "it has %u classes, the options allow %u", L->classes,
                     max_classes);
        goto done;
    }
    st = DP_CACHE_CORRUPT;
    if (!map) {
        st = DP_CACHE_OK;
        goto done;
    }
    size_t map_len = (size_t)fs.st_size;
    /* Populated at once: the checksum reads every page anyway. */
    uint8_t *m = mmap(NULL, map_len, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (m == MAP_FAILED) {
        dp_cache_fmt(why, whylen, "cannot map it: %s", strerror(errno));
        goto done;
    }
    size_t off = L->payload_off;
    uint32_t all = 0;
    for (int i = 0; i < SEC_COUNT; i++) {
        uint32_t c = dp_crc32c(0, m + off, L->sec_len[i]);
        if (c != L->sec_crc[i]) {
            dp_cache_fmt(why, whylen, "payload checksum mismatch in the %s (bytes %zu..%zu): "
                         "CRC32C 0x%08x, the header says 0x%08x", section_names[i], off,
                         off + L->sec_len[i] - 1, c, L->sec_crc[i]);
            munmap(m, map_len);
            goto done;
        }
        all = dp_crc32c_combine(all, c, L->sec_len[i]);
        off += L->sec_len[i];
    }
    if (all != L->payload_crc) {
        dp_cache_fmt(why, whylen, "payload checksum mismatch: the sections' CRC32C 0x%08x, the "
                     "header says 0x%08x", all, L->payload_crc);
        munmap(m, map_len);
        goto done;
    }
    const uint8_t *lab = m + L->payload_off + L->sec_len[0] + L->sec_len[1];
    for (uint64_t i = 0; i < L->n_train + L->n_test; i++)
        if (lab[i] >= L->classes) {
            dp_cache_fmt(why, whylen, "a label is >= its %u classes", L->classes);
            munmap(m, map_len);
            goto done;
        }
    counts_from(ds, L, records);
    ds->map = m;
    ds->map_len = map_len;
    ds->classes = L->classes;
    fill_views(ds, m, L);
    st = DP_CACHE_OK;
done:
    free(h);
    close(fd);
    return st;
}

/* ---- decoding ---- */

/* Decodes records [first, first+count) of a split's files (in file order)
 * into values (count * record bytes) and labels; *max_label gets the
 * largest label seen. */
static int decode_range(const dp_dataset *ds, const dp_data_split_files *sf, uint64_t first,
                        uint64_t count, uint8_t *values, uint8_t *labels, uint8_t *max_label,
                        dp_err *err)
{
    const dp_stream_source *ss = ds->stream_source;
    size_t rec = record_bytes(&ds->files.shape);
    uint64_t done = 0;
    for (size_t f = 0; f < sf->n && done < count; f++) {
        const dp_data_file *file = &sf->files[f];
        uint64_t at = first + done, end = file->first + file->records;
        if (at >= end)
            continue;
        dp_record_reader *r;
        if (dp_record_open(&r, file, ds->files.format, &ds->files.shape, &ss->opt, err) < 0)
            return -1;
        uint64_t skip = at - file->first;
        int64_t sk = skip ? dp_record_skip(r, skip, err) : 0;
        if (sk < 0) {
            dp_record_close(r);
            return -1;
        }
        if ((uint64_t)sk < skip)
            at = file->first + (uint64_t)sk; /* reported below as a file cut short */
        for (; done < count && at < end; done++, at++) {
            int k = (uint64_t)sk == skip
                        ? dp_record_next(r, values + done * rec, &labels[done], err)
                        : 0;
            if (k < 0) {
                dp_record_close(r);
                return -1;
            }
            if (k == 0) {
                dp_record_close(r);
                return dp_errf(err, "%s: ends at record %llu, but it held %llu when the dataset "
                               "was counted (it changed while being read)", file->path,
                               (unsigned long long)(at - file->first),
                               (unsigned long long)file->records);
            }
            if (labels[done] > *max_label)
                *max_label = labels[done];
        }
        dp_record_close(r);
    }
    if (done < count)
        return dp_errf(err, "dataset %s: %llu records asked from record %llu, its files hold "
                       "%llu", ds->dir, (unsigned long long)count, (unsigned long long)first,
                       (unsigned long long)sf->records);
    return 0;
}

/* ---- building a cache ---- */

/* Decodes every record into a new cache image at path ("" for memory only),
 * published atomically; ds's views point into it.  A cache that cannot be
 * written leaves the data in memory with a warning; a refused record fails. */
static int build_cache(dp_dataset *ds, const char *path, uint64_t key, const src_entry *src,
                       dp_err *err)
{
    layout L;
    layout_of(ds, &L);
    if (layout_sizes(&L) < 0)
        return dp_errf(err, "dataset %s: %zu files of %llu + %llu records of %u values are too "
                       "large to cache. Hint: stream it (--data-memory below its decoded size)",
                       ds->dir, n_files(ds), (unsigned long long)L.n_train,
                       (unsigned long long)L.n_test, ds->files.shape.dim);
    size_t len = (size_t)(L.payload_off + L.payload_len);
    dp_atomic_file af = {.fd = -1};
    uint8_t *img = MAP_FAILED;
    if (path[0]) {
        dp_err e;
        char why[600] = "";
        int rc;
        if (dp_atomic_open(&af, path, &e) < 0) {
            dp_cache_fmt(why, sizeof why, "%s", e.msg);
        } else if ((rc = posix_fallocate(af.fd, 0, (off_t)len)) != 0) {
            /* Reserved first: a full disk under a shared mapping is SIGBUS. */
            dp_cache_fmt(why, sizeof why, "cannot reserve %zu bytes for %s: %s", len, af.tmp,
                         strerror(rc));
            dp_atomic_abort(&af);
        } else if ((img = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, af.fd, 0)) ==
                   MAP_FAILED) {
            dp_cache_fmt(why, sizeof why, "cannot map %s: %s", af.tmp, strerror(errno));
            dp_atomic_abort(&af);
        }
        if (img == MAP_FAILED)
            dp_warn("dataset %s: cannot write the cache (%s); keeping the decoded data in "
                    "memory", ds->dir, why);
    } else {
        dp_warn("dataset %s: no writable cache location (set DOWNPOUR_CACHE); keeping the "
                "decoded data in memory", ds->dir);
    }
    if (img == MAP_FAILED) {
        img = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (img == MAP_FAILED)
            return dp_errf(err, "dataset %s: cannot allocate %zu bytes for the decoded data: %s",
                           ds->dir, len, strerror(errno));
    }
    uint8_t *p = img + L.payload_off, max = 0;
    uint8_t *tr_lab = p + L.sec_len[0] + L.sec_len[1];
    if (decode_range(ds, &ds->files.train, 0, L.n_train, p, tr_lab, &max, err) < 0 ||
        decode_range(ds, &ds->files.test, 0, L.n_test, p + L.sec_len[0], tr_lab + L.n_train,
                     &max, err) < 0)
        goto fail;
    L.classes = (uint32_t)max + 1;
    if (L.classes < 2) {
        dp_errf(err, "dataset %s: every label is 0; a classifier needs at least 2 classes",
                ds->dir);
        goto fail;
    }
    memcpy(img, DP_CACHE_MAGIC, 8);
    dp_put32(img + 8, CACHE_VERSION);
    dp_put32(img + 12, (uint32_t)L.payload_off);
    dp_put32(img + 16, L.header_len);
    dp_put32(img + 20, L.format);
    dp_put32(img + 24, L.kind);
    dp_put32(img + 28, L.rows);
    dp_put32(img + 32, L.cols);
    dp_put32(img + 36, L.channels);
    dp_put32(img + 40, L.classes);
    dp_put32(img + 44, L.n_train_files);
    dp_put32(img + 48, L.n_test_files);
    dp_put64(img + 56, L.n_train);
    dp_put64(img + 64, L.n_test);
    dp_put64(img + 72, L.payload_len);
    dp_put64(img + 80, key);
    size_t off = L.payload_off;
    uint32_t all = 0;
    for (int i = 0; i < SEC_COUNT; i++) {
        uint32_t c = dp_crc32c(0, img + off, L.sec_len[i]);
        dp_put32(img + 88 + 4 * i, c);
        all = dp_crc32c_combine(all, c, L.sec_len[i]);
        off += L.sec_len[i];
    }
    dp_put32(img + 52, all);
    for (size_t i = 0; i < n_files(ds); i++) {
        uint8_t *s = img + HDR_FIXED + SRC_BYTES * i;
        dp_put64(s, file_at(ds, i)->records);
        dp_put64(s + 8, src[i].feat.size);
        dp_put64(s + 16, src[i].feat.mtime_ns);
        dp_put64(s + 24, src[i].feat.ino);
        dp_put64(s + 32, src[i].lab.size);
        dp_put64(s + 40, src[i].lab.mtime_ns);
        dp_put64(s + 48, src[i].lab.ino);
        dp_put64(s + 56, src[i].names);
    }
    dp_put32(img + L.header_len - 4, dp_crc32c(0, img, L.header_len - 4));
    if (af.fd >= 0) {
        dp_err e;
        /* The mapping outlives the descriptor, and the file if the rename fails. */
        if (dp_atomic_commit(&af, &e) < 0)
            dp_warn("dataset %s: cannot write the cache (%s); keeping the decoded data in "
                    "memory", ds->dir, e.msg);
        else
            snprintf(ds->cache_path, sizeof ds->cache_path, "%s", path);
    }
    (void)mprotect(img, len, PROT_READ);
    ds->map = img;
    ds->map_len = len;
    ds->classes = L.classes;
    fill_views(ds, img, &L);
    return 0;
fail:
    munmap(img, len);
    dp_atomic_abort(&af);
    return -1;
}

/* ---- where and what ---- */

/* The directory the data lives in (the cache goes beside it) and the key
 * naming this dataset: the spec's absolute path and the options. */
static int locate(dp_dataset *ds, const char *spec, char *data_dir, size_t cap, uint64_t *key,
                  dp_err *err)
{
    struct stat st;
    const char *dir_of = stat(spec, &st) == 0 && S_ISDIR(st.st_mode)
                             ? spec
                             : ds->files.train.files[0].path;
    char tmp[1100];
    if (dp_cache_fmt(tmp, sizeof tmp, "%s", dir_of) != 0)
        return dp_errf(err, "dataset %s: path too long", spec);
    if (dir_of != spec) {
        char *slash = strrchr(tmp, '/');
        if (!slash)
            snprintf(tmp, sizeof tmp, ".");
        else if (slash == tmp)
            tmp[1] = '\0';
        else
            *slash = '\0';
    }
    char *abs = realpath(tmp, NULL);
    if (!abs)
        return dp_errf(err, "dataset %s: cannot resolve %s: %s", spec, tmp, strerror(errno));
    /* A glob's pattern is part of its name; a directory's or file's path
     * says it all. */
    const char *pat = strrchr(spec, '/');
    pat = pat ? pat + 1 : spec;
    uint64_t h = hash_str(DP_CACHE_HASH_SEED, abs);
    h = hash_str(h, dir_of == spec ? "" : pat);
    const dp_data_options *o = &ds->stream_source->opt;
    h = hash_str(h, o->image);
    h = hash_str(h, o->label);
    h = hash_str(h, o->train);
    h = hash_str(h, o->test);
    if (o->categorical || o->numeric) { /* named columns: what they read, and how */
        char how[64];
        snprintf(how, sizeof how, "hash %u", o->hash_buckets);
        h = hash_str(h, o->categorical);
        h = hash_str(h, o->numeric);
        h = hash_str(h, how);
        for (size_t i = 0; i < o->n_id_limits; i++) {
            snprintf(how, sizeof how, "limit %u", o->id_limits[i]);
            h = hash_str(h, how);
        }
    }
    *key = h;
    int rc = dp_cache_fmt(data_dir, cap, "%s", tmp);
    free(abs);
    return rc == 0 ? 0 : dp_errf(err, "dataset %s: path too long", spec);
}

/* The options with NULL fields taken from the defaults, their strings
 * copied into ds. */
static int own_options(dp_dataset *ds, const dp_data_options *in, dp_err *err)
{
    dp_data_options o;
    dp_data_options_default(&o);
    enum { N_STR = 6 };
    const char *s[N_STR] = {in->image ? in->image : o.image, in->label ? in->label : o.label,
                            in->train ? in->train : o.train, in->test ? in->test : o.test,
                            in->categorical, in->numeric};
    /* the id limits first (aligned), then the strings */
    size_t len = in->n_id_limits * sizeof(uint32_t);
    for (int i = 0; i < N_STR; i++)
        len += (s[i] ? strlen(s[i]) : 0) + 1;
    ds->stream_source = calloc(1, sizeof *ds->stream_source);
    ds->opt_text = malloc(len);
    if (!ds->stream_source || !ds->opt_text)
        return dp_errf(err, "dataset: out of memory");
    char *p = ds->opt_text;
    if (in->id_limits && in->n_id_limits) {
        memcpy(p, in->id_limits, in->n_id_limits * sizeof(uint32_t));
        o.id_limits = (const uint32_t *)(void *)p;
        o.n_id_limits = in->n_id_limits;
        p += in->n_id_limits * sizeof(uint32_t);
    }
    o.hash_buckets = in->hash_buckets;
    const char **dst[N_STR] = {&o.image, &o.label, &o.train, &o.test, &o.categorical,
                               &o.numeric};
    for (int i = 0; i < N_STR; i++) {
        if (!s[i]) {
            *dst[i] = NULL;
            *p++ = '\0';
            continue;
        }
        size_t n = strlen(s[i]) + 1;
        memcpy(p, s[i], n);
        *dst[i] = p;
        p += n;
    }
    o.classes = in->classes;
    ds->stream_source->opt = o;
    return 0;
}

static const char *shape_text(char *buf, size_t cap, const dp_record_shape *s)
{
    if (s->rows == 1 && s->channels == 1)
        snprintf(buf, cap, "%u %s values", s->dim, dp_value_kind_name(s->kind));
    else if (s->channels == 1)
        snprintf(buf, cap, "%ux%u %s", s->rows, s->cols, dp_value_kind_name(s->kind));
    else
        snprintf(buf, cap, "%ux%ux%u %s", s->rows, s->cols, s->channels,
                 dp_value_kind_name(s->kind));
    return buf;
}

/* The one line saying what the dataset is and how it is held. */
static void report(const dp_dataset *ds, const dp_dataset_options *o, int reused, double secs)
{
    char a[32], b[32], c[64], d[32], e[32], f[32];
    char how[1400];
    bytes_text(d, sizeof d, ds->decoded_bytes);
    bytes_text(e, sizeof e, ds->memory);
    if (ds->streamed) {
        char win[64];
        if (o->window)
            snprintf(win, sizeof win, "window %s records", count_text(f, sizeof f, o->window));
        else
            snprintf(win, sizeof win, "window as the budget allows");
        char parts[128], t[32], m[32];
        snprintf(parts, sizeof parts, "%s budget = %s test + %s stream", e,
                 bytes_text(t, sizeof t, ds->stream_source->held),
                 bytes_text(m, sizeof m, ds->stream_source->memory));
        if (ds->decoded_bytes > ds->memory)
            snprintf(how, sizeof how, "streaming (decoded %s exceeds the %s budget; "
                     "--data-memory), %s; %s", d, e, win, parts);
        else
            snprintf(how, sizeof how, "streaming (as asked; decoded %s, budget %s), %s; %s", d,
                     e, win, parts);
    } else {
        char where[1200];
        if (ds->cache_path[0])
            snprintf(where, sizeof where, "decoded cache %s at %s", d, ds->cache_path);
        else
            snprintf(where, sizeof where, "decoded in memory, %s", d);
        snprintf(how, sizeof how, "%s%s%.2f s (%s the %s budget%s)", where,
                 reused ? ", opened in " : ", built in ", secs,
                 ds->decoded_bytes <= ds->memory ? "fits" : "exceeds", e,
                 ds->decoded_bytes <= ds->memory ? "" : ": the cache was asked for");
    }
    dp_info("dataset %s: %zu %s files (%s train, %s test records of %s); %s", ds->dir,
            n_files(ds), dp_data_format_name(ds->format),
            count_text(a, sizeof a, ds->files.train.records),
            count_text(b, sizeof b, ds->files.test.records),
            shape_text(c, sizeof c, &ds->files.shape), how);
}


/* try_cache as dp_cache_find calls it: mapped, counts kept. */
typedef struct files_try {
    dp_dataset *ds;
    const src_entry *src;
    uint64_t key;
    uint32_t max_classes;
    uint64_t *records;
} files_try;

static dp_cache_state files_try_cache(void *ctx, const char *path, char *why, size_t whylen)
{
    files_try *t = ctx;
    layout L;
    return try_cache(t->ds, path, t->src, t->key, t->max_classes, 1, &L, t->records, why, whylen);
}

/* ---- the two ways to hold a dataset ---- */

static int open_cached(dp_dataset *ds, const char *primary, const char *fallback, uint64_t key,
                       const src_entry *src, uint64_t *records, int *reused, dp_err *err)
{
    uint32_t max_classes = ds->stream_source->opt.classes ? ds->stream_source->opt.classes : 256;
    files_try ctx = {ds, src, key, max_classes, records};
    int lock;
    *reused = 1;
    if (dp_cache_find(primary, fallback, files_try_cache, &ctx, ds->cache_path,
                      sizeof ds->cache_path, &lock))
        return 0;
    *reused = 0;
    int rc = build_cache(ds, primary, key, src, err);
    dp_cache_unlock(primary, lock);
    return rc;
}

/* The budget is whole (docs/datasets.md, "The decoded cache or streaming"):
 * the stream's bound is what the test records and the validation buffer
 * (held) leave of it.  -1, naming the parts, when that is less than the
 * least stream (`least`, dp_stream_least_bytes for a batch of 1). */
static int set_stream_bound(const dp_dataset *ds, uint64_t held, size_t least, const char *what,
                            dp_err *err)
{
    char a[64], b[32], c[32], d[32];
    if (held <= ds->memory && ds->memory - held >= least) {
        ds->stream_source->memory = ds->memory - (size_t)held;
        ds->stream_source->held = (size_t)held;
        return 0;
    }
    if (held > ds->memory)
        snprintf(a, sizeof a, "exceed the");
    else
        snprintf(a, sizeof a, "leave %s of the", bytes_text(d, sizeof d, ds->memory - held));
    return dp_errf(err, "dataset %s: %s %s %s memory budget, and a stream needs at least %s "
                   "beside them (streaming holds the test and validation records in memory). "
                   "Hint: raise --data-memory or DOWNPOUR_DATA_MEMORY to at least %s bytes",
                   ds->dir, what, a, bytes_text(b, sizeof b, ds->memory),
                   bytes_text(c, sizeof c, least), count_text(d, sizeof d, held + least));
}

static int open_streamed(dp_dataset *ds, const dp_dataset_options *o, dp_err *err)
{
    const dp_record_shape *shape = &ds->files.shape;
    uint64_t n_test = ds->files.test.records;
    uint64_t bytes = n_test * (record_bytes(shape) + 1);
    char a[32], b[32], what[200];
    dp_stream_source *ss = ds->stream_source;
    ss->files = &ds->files.train;
    ss->format = ds->files.format;
    ss->shape = *shape;
    ss->window = o->window;
    size_t least;
    if (dp_stream_least_bytes(ss, 1, &least, err) < 0)
        return -1;
    snprintf(what, sizeof what, "its %s test records, decoded to %s,",
             count_text(a, sizeof a, n_test), bytes_text(b, sizeof b, bytes));
    if (set_stream_bound(ds, bytes, least, what, err) < 0)
        return -1;
    ds->test_mem = malloc(bytes ? (size_t)bytes : 1);
    ds->val_buf = calloc(1, sizeof *ds->val_buf);
    if (!ds->test_mem || !ds->val_buf)
        return dp_errf(err, "dataset %s: cannot allocate %s for the test records", ds->dir,
                       bytes_text(b, sizeof b, bytes));
    uint8_t *values = ds->test_mem, *labels = values + n_test * record_bytes(shape), max = 0;
    if (decode_range(ds, &ds->files.test, 0, n_test, values, labels, &max, err) < 0)
        return -1;
    fill_view(&ds->test, values, labels, n_test, shape);
    uint32_t classes = ds->stream_source->opt.classes;
    ds->classes = classes ? classes : (uint32_t)max + 1 < 2 ? 2 : (uint32_t)max + 1;

    ds->train_all = (dp_split){.n = (uint32_t)ds->files.train.records, .dim = shape->dim,
                               .stream = ss};
    ds->streamed = 1;
    return 0;
}

int dp_dataset_files_open(dp_dataset *ds, const char *spec, const dp_dataset_options *o,
                          dp_err *err)
{
    ds->is_files = 1;
    if (dp_cache_fmt(ds->dir, sizeof ds->dir, "%s", spec) != 0)
        return dp_errf(err, "dataset %s: path too long", spec);
    if (o->stream < -1 || o->stream > 1)
        return dp_errf(err, "dataset %s: stream is %d, expected -1 (auto), 0 or 1", spec,
                       o->stream);
    if (own_options(ds, &o->data, err) < 0)
        return -1;
    if (dp_data_files_find(&ds->files, spec, &ds->stream_source->opt, err) < 0) {
        memset(&ds->files, 0, sizeof ds->files);
        return -1;
    }
    ds->format = ds->files.format;
    if (resolve_memory(o->memory, &ds->memory, err) < 0)
        return -1;
    double t0 = dp_now();
    size_t n = n_files(ds);
    int rc = -1;
    src_entry *src = calloc(n ? n : 1, sizeof *src);
    uint64_t *records = calloc(n ? n : 1, sizeof *records);
    ds->file_end = calloc(n ? n : 1, sizeof *ds->file_end);
    char data_dir[1100], primary[sizeof ds->cache_path], fallback[sizeof ds->cache_path];
    uint64_t key = 0;
    if (!src || !records || !ds->file_end) {
        dp_errf(err, "dataset %s: out of memory for %zu files", spec, n);
        goto done;
    }
    if (n > MAX_FILES && o->stream == 0) {
        dp_errf(err, "dataset %s: %zu files are more than a cache can list (%u). Hint: stream "
                "it", spec, n, MAX_FILES);
        goto done;
    }
    if (stat_sources(ds, src, err) < 0 ||
        locate(ds, spec, data_dir, sizeof data_dir, &key, err) < 0)
        goto done;
    char *abs = realpath(data_dir, NULL); /* locate resolved it once already */
    const char *base = abs ? strrchr(abs, '/') : NULL;
    char name[300];
    dp_cache_fmt(name, sizeof name, "%s-%016llx.dpcache",
                 base && base[1] ? base + 1 : "dataset", (unsigned long long)key);
    free(abs);
    dp_cache_paths(data_dir, name, name, primary, fallback, sizeof primary);

    /* The counts: from a valid cache's header when there is one (no file
     * read), else by reading every file through. */
    layout L;
    char why[600];
    uint32_t max_classes = ds->stream_source->opt.classes ? ds->stream_source->opt.classes : 256;
    const char *at[2] = {fallback, primary};
    for (int i = 0; i < 2 && !ds->files.counted; i++)
        if (at[i][0] && n <= MAX_FILES &&
            try_cache(ds, at[i], src, key, max_classes, 0, &L, records, why, sizeof why) ==
                DP_CACHE_OK)
            counts_from(ds, &L, records);
    if (!ds->files.counted && dp_data_files_count(&ds->files, &ds->stream_source->opt, err) < 0)
        goto done;
    const dp_record_shape *shape = &ds->files.shape;
    uint64_t total = ds->files.train.records + ds->files.test.records;
    if (ds->files.train.records > UINT32_MAX || ds->files.test.records > UINT32_MAX) {
        dp_errf(err, "dataset %s: %llu training and %llu test records; a split holds at most "
                "4,294,967,295", spec, (unsigned long long)ds->files.train.records,
                (unsigned long long)ds->files.test.records);
        goto done;
    }
    ds->kind = shape->kind;
    ds->rows = shape->rows;
    ds->cols = shape->cols;
    ds->channels = shape->channels;
    ds->decoded_bytes = total * (record_bytes(shape) + 1);
    for (size_t i = 0; i < n; i++)
        ds->file_end[i] = file_at(ds, i)->first + file_at(ds, i)->records;

    int reused = 0;
    if (o->stream == 1 || (o->stream == -1 && (ds->decoded_bytes > ds->memory || n > MAX_FILES)))
        rc = open_streamed(ds, o, err);
    else
        rc = open_cached(ds, primary, fallback, key, src, records, &reused, err);
    if (rc == 0) {
        ds->train_all.file_end = ds->file_end;
        ds->train_all.n_files = (uint32_t)ds->files.train.n;
        ds->test.file_end = ds->file_end + ds->files.train.n;
        ds->test.n_files = (uint32_t)ds->files.test.n;
        report(ds, o, reused, dp_now() - t0);
    }
done:
    free(src);
    free(records);
    return rc;
}

int dp_dataset_files_val(const dp_dataset *ds, uint32_t first, uint32_t n, dp_split *val,
                         dp_err *err)
{
    const dp_record_shape *shape = &ds->files.shape;
    size_t rec = record_bytes(shape);
    uint64_t bytes = (uint64_t)n * (rec + 1);
    uint64_t test = (uint64_t)ds->test.n * (rec + 1);
    struct dp_val_buffer *vb = ds->val_buf;
    /* the buffer keeps the largest validation split asked for */
    uint64_t held_val = vb->cap > bytes ? vb->cap : bytes;
    char a[32], b[32], c[32], d[32], what[300];
    size_t least;
    if (dp_stream_least_bytes(ds->stream_source, 1, &least, err) < 0)
        return -1;
    snprintf(what, sizeof what, "a validation buffer of %s (%s records; a smaller --val-size "
             "takes less) and the test records' %s", bytes_text(b, sizeof b, held_val),
             count_text(a, sizeof a, n), bytes_text(c, sizeof c, test));
    if (set_stream_bound(ds, test + held_val, least, what, err) < 0)
        return -1;
    dp_info("dataset %s: streaming: %s budget = %s test + %s validation + %s stream", ds->dir,
            bytes_text(a, sizeof a, ds->memory), bytes_text(b, sizeof b, test),
            bytes_text(c, sizeof c, held_val), bytes_text(d, sizeof d, ds->stream_source->memory));
    if (vb->cap < bytes) {
        void *m = realloc(vb->mem, (size_t)bytes);
        if (!m)
            return dp_errf(err, "dataset %s: cannot allocate %s for the validation records",
                           ds->dir, bytes_text(b, sizeof b, bytes));
        vb->mem = m;
        vb->cap = (size_t)bytes;
    }
    uint8_t *values = vb->mem, *labels = values + (size_t)n * rec, max = 0;
    *val = (dp_split){.dim = shape->dim};
    if (n == 0)
        return 0;
    if (decode_range(ds, &ds->files.train, first, n, values, labels, &max, err) < 0)
        return -1;
    fill_view(val, values, labels, n, shape);
    return 0;
}

void dp_dataset_files_close(dp_dataset *ds)
{
    if (ds->files.train.files || ds->files.test.files)
        dp_data_files_free(&ds->files);
    if (ds->val_buf)
        free(ds->val_buf->mem);
    free(ds->val_buf);
    free(ds->test_mem);
    free(ds->file_end);
    free(ds->stream_source);
    free(ds->opt_text);
}
