/* libFuzzer target for the decoded cache of datasets of record files (cache
 * format version 3, src/data/dataset_files.c): the fuzz bytes become the
 * cache file of a small real dataset (three TFRecord files of Examples in a
 * scratch directory, byte images or float lists), opened with
 * dp_dataset_open_with and the cache asked for (stream 0).  The open must
 * trust the cache only when it holds the sources' records, else rebuild it
 * (or, only for a cache whose checksums were forged, fail with a message
 * naming the dataset); never a crash, a read outside the mapping, a leak or
 * an allocation sized by an unchecked field.
 *
 * The target does not restate the format: at start it lets the library
 * build the real cache and keeps it as the reference, and it finds the
 * checksums in it by search: the header's own CRC32C is the u32 equal to the
 * CRC32C of the bytes before it; the payload is the file's tail holding the
 * records (train values, test values, train labels, test labels: sizes known
 * from the written records), and each section's CRC32C, and the whole
 * payload's, is the u32 of the header equal to it.
 *
 * What an accepted open must give depends on which checksums the final file
 * still carries as the reference does (a fuzzer cannot change a covered byte
 * and keep its CRC):
 *   all of them   the dataset exactly: shape, classes, records, labels, the
 *                 files' bounds; and the cache file on disk is either the
 *                 one written or, rebuilt, the reference byte for byte;
 *   the payload's the same records and labels as bytes (a re-signed header
 *                 may re-describe them: 4x3 bytes as 2x6, per-file counts);
 *   fewer         a self-consistent dataset: labels below its classes, the
 *                 views inside the mapping, every value readable.
 *
 * The first input byte holds flags; the rest is the cache file:
 *   bit 0  XOR the rest onto the reference (0x01 alone is the valid cache),
 *          else the rest is the whole file as is
 *   bit 1  re-sign the header's CRC afterwards (a fuzzer cannot guess it)
 *   bit 2  re-sign the payload sections' CRCs and the payload's, in the
 *          reference's places, before the header
 *   bit 3  with bit 0: cut the file to the input's length (bit 5: at the
 *          window's offset)
 *   bit 4  the float dataset instead of the byte one
 *   bit 5  with bit 0: the rest is a u16 offset (little-endian, taken modulo
 *          the reference's length + 16) and a window XORed there, so short
 *          inputs reach the payload */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_scratch.h"
#include "downpour/crc32c.h"
#include "downpour/dataset.h"
#include "downpour/example.h"
#include "downpour/log.h"
#include "downpour/tfrecord.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { ROWS = 3, COLS = 4, DIM = ROWS * COLS, FDIM = 5, N_FILES = 3, N_TRAIN = 5, N_TEST = 2 };

/* The files: train-00000 holds records 0..2, train-00001 records 3..4,
 * test records 100..101 (ids, from which values and labels follow). */
static const char *const file_names[N_FILES] = {"train-00000.tfrecord", "train-00001.tfrecord",
                                                "test.tfrecord"};
static const uint32_t file_first[N_FILES] = {0, 3, 100}, file_count[N_FILES] = {3, 2, 2};

static uint8_t px(uint32_t id, int j) { return (uint8_t)(id * 37 + (uint32_t)j * 11 + 5); }
static float fv(uint32_t id, int j) { return (float)id * 0.25f - (float)j * 1.5e-3f; }
static uint8_t lab(uint32_t id) { return (uint8_t)((id * 3 + 1) % 5); } /* 5 classes */

typedef struct dataset_ref {
    char dir[256], cache[1024];
    int floats;
    size_t rec;                 /* bytes of one record's values */
    uint8_t *ref;               /* the cache the library built */
    size_t ref_len, payload_off, sec_len[4];
    long hdr_crc_at, sec_crc_at[4], payload_crc_at;
    uint8_t values[2][N_TRAIN * FDIM * 4], labels[2][N_TRAIN]; /* train, test as written */
    uint32_t classes;
} dataset_ref;

static char root[256];
static dataset_ref sets[2];

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void write_file(const char *path, uint32_t first, uint32_t n, int floats)
{
    dp_tfrecord_writer *w;
    dp_err err;
    if (dp_tfrecord_writer_open(&w, path, DP_TFRECORD_RAW, &err) != 0)
        abort();
    for (uint32_t id = first; id < first + n; id++) {
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
        uint8_t enc[256];
        size_t len = dp_example_encoded_size(fs, 4);
        if (len > sizeof enc)
            abort();
        dp_example_encode(enc, fs, 4);
        if (dp_tfrecord_write(w, enc, len, &err) != 0)
            abort();
    }
    if (dp_tfrecord_writer_close(w, &err) != 0)
        abort();
}

static void cleanup(void)
{
    char path[1400];
    for (int s = 0; s < 2; s++) {
        if (!sets[s].dir[0])
            continue;
        for (int f = 0; f < N_FILES; f++) {
            snprintf(path, sizeof path, "%s/%s", sets[s].dir, file_names[f]);
            unlink(path);
        }
        if (sets[s].cache[0]) {
            unlink(sets[s].cache);
            snprintf(path, sizeof path, "%s.lock", sets[s].cache);
            unlink(path);
        }
        rmdir(sets[s].dir);
    }
    rmdir(root);
}

static dp_dataset_options cache_options(void)
{
    dp_dataset_options o;
    dp_dataset_options_default(&o);
    o.stream = 0;
    o.memory = (size_t)1 << 30;
    return o;
}

/* The u32 in [from, to) of the reference equal to v; aborts when none is. */
static long find_u32(const dataset_ref *d, long from, long to, uint32_t v, const char *what)
{
    for (long off = from; off + 4 <= to; off += 4)
        if (get32(d->ref + off) == v)
            return off;
    fprintf(stderr, "fuzz_dataset_files_cache: no %s CRC in the reference header\n", what);
    abort();
}

static void setup_one(dataset_ref *d, int floats)
{
    d->floats = floats;
    d->rec = floats ? FDIM * 4 : DIM;
    snprintf(d->dir, sizeof d->dir, "%s/%s", root, floats ? "f32" : "u8");
    if (mkdir(d->dir, 0755) != 0)
        abort();
    char path[1400];
    uint32_t max = 0;
    for (int f = 0; f < N_FILES; f++) {
        snprintf(path, sizeof path, "%s/%s", d->dir, file_names[f]);
        write_file(path, file_first[f], file_count[f], floats);
        int split = f == N_FILES - 1;
        uint32_t at = f == 1 ? file_count[0] : 0;
        for (uint32_t i = 0; i < file_count[f]; i++) {
            uint32_t id = file_first[f] + i;
            uint8_t *v = d->values[split] + (size_t)(at + i) * d->rec;
            for (int j = 0; j < (floats ? FDIM : DIM); j++) {
                if (floats) {
                    float x = fv(id, j);
                    memcpy(v + 4 * j, &x, 4); /* the cache holds little-endian floats */
                } else {
                    v[j] = px(id, j);
                }
            }
            d->labels[split][at + i] = lab(id);
            if (lab(id) > max)
                max = lab(id);
        }
    }
    d->classes = max + 1;
    dp_dataset ds;
    dp_err err;
    dp_dataset_options o = cache_options();
    if (dp_dataset_open_with(&ds, d->dir, &o, &err) != 0) {
        fprintf(stderr, "fuzz_dataset_files_cache: building the reference cache: %s\n", err.msg);
        abort();
    }
    if (!ds.cache_path[0] || ds.streamed)
        abort(); /* the directory is writable: the cache lies beside the data */
    snprintf(d->cache, sizeof d->cache, "%s", ds.cache_path);
    dp_dataset_close(&ds);
    FILE *fp = fopen(d->cache, "rb");
    if (!fp || fseek(fp, 0, SEEK_END) != 0)
        abort();
    long len = ftell(fp);
    rewind(fp);
    d->ref_len = len > 0 ? (size_t)len : 0;
    d->ref = malloc(d->ref_len + 1);
    if (!d->ref || fread(d->ref, 1, d->ref_len, fp) != d->ref_len)
        abort();
    fclose(fp);

    d->sec_len[0] = N_TRAIN * d->rec;
    d->sec_len[1] = N_TEST * d->rec;
    d->sec_len[2] = N_TRAIN;
    d->sec_len[3] = N_TEST;
    size_t payload = d->sec_len[0] + d->sec_len[1] + d->sec_len[2] + d->sec_len[3];
    if (payload > d->ref_len)
        abort();
    d->payload_off = d->ref_len - payload;
    d->hdr_crc_at = -1;
    for (long off = 8; d->hdr_crc_at < 0 && off + 4 <= (long)d->payload_off; off += 4)
        if (get32(d->ref + off) == dp_crc32c(0, d->ref, (size_t)off))
            d->hdr_crc_at = off;
    if (d->hdr_crc_at < 0) {
        fprintf(stderr, "fuzz_dataset_files_cache: no header CRC in the reference\n");
        abort();
    }
    size_t off = d->payload_off;
    for (int i = 0; i < 4; i++) {
        d->sec_crc_at[i] = find_u32(d, 8, d->hdr_crc_at, dp_crc32c(0, d->ref + off, d->sec_len[i]),
                                    "section");
        off += d->sec_len[i];
    }
    d->payload_crc_at = find_u32(d, 8, d->hdr_crc_at,
                                 dp_crc32c(0, d->ref + d->payload_off, payload), "payload");
}

static void setup(void)
{
    fz_scratch_dir(root, sizeof root, "fuzz_dataset_files_cache");
    atexit(cleanup);
    unsetenv("DOWNPOUR_CACHE");
    unsetenv("DOWNPOUR_DATA_MEMORY");
    dp_log_set_level(DP_LOG_ERROR); /* every rebuild warns */
    setup_one(&sets[0], 0);
    setup_one(&sets[1], 1);
}

/* Whether file (n bytes) holds the reference's 4 bytes at off. */
static int kept(const dataset_ref *d, const uint8_t *file, size_t n, long off)
{
    return (size_t)off + 4 <= n && memcmp(file + off, d->ref + off, 4) == 0;
}

static int inside(const dp_dataset *ds, const void *p, size_t len)
{
    const uint8_t *b = ds->map, *q = p;
    return q >= b && len <= ds->map_len && (size_t)(q - b) <= ds->map_len - len;
}

/* What any accepted open must give. */
static void check_consistent(const dp_dataset *ds)
{
    if (!ds->is_files || ds->streamed || !ds->map || ds->classes < 2 || ds->classes > 256 ||
        ds->files.shape.dim == 0 ||
        (uint64_t)ds->rows * ds->cols * ds->channels != ds->files.shape.dim)
        abort();
    const dp_split *sp[2] = {&ds->train_all, &ds->test};
    size_t vs = ds->kind == DP_VALUES_F32 ? 4 : 1;
    volatile uint32_t sink = 0;
    for (int k = 0; k < 2; k++) {
        const dp_split *s = sp[k];
        const void *vals = ds->kind == DP_VALUES_F32 ? (const void *)s->values : s->images;
        size_t bytes = (size_t)s->n * s->dim * vs;
        if (s->n == 0 || s->dim != ds->files.shape.dim || !vals || !s->labels ||
            !inside(ds, vals, bytes) || !inside(ds, s->labels, s->n))
            abort(); /* a view outside the mapping */
        if (s->n_files == 0 || s->file_end[s->n_files - 1] != s->n)
            abort();
        for (uint32_t f = 1; f < s->n_files; f++)
            if (s->file_end[f] < s->file_end[f - 1])
                abort();
        for (uint32_t i = 0; i < s->n; i++)
            if (s->labels[i] >= ds->classes)
                abort(); /* an accepted cache has every label below its classes */
        for (size_t i = 0; i < bytes; i++)
            sink += ((const uint8_t *)vals)[i];
    }
    (void)sink;
}

/* The records and labels as bytes. */
static void check_records(const dataset_ref *d, const dp_dataset *ds)
{
    const dp_split *sp[2] = {&ds->train_all, &ds->test};
    const uint32_t n[2] = {N_TRAIN, N_TEST};
    for (int k = 0; k < 2; k++) {
        const void *vals = ds->kind == DP_VALUES_F32 ? (const void *)sp[k]->values
                                                     : sp[k]->images;
        size_t vs = ds->kind == DP_VALUES_F32 ? 4 : 1;
        if (sp[k]->n != n[k] || (size_t)sp[k]->dim * vs != d->rec ||
            memcmp(vals, d->values[k], n[k] * d->rec) != 0 ||
            memcmp(sp[k]->labels, d->labels[k], n[k]) != 0) {
            fprintf(stderr, "the %s records differ from the sources'\n", k ? "test" : "training");
            abort();
        }
    }
}

/* The dataset exactly as its sources are. */
static void check_exact(const dataset_ref *d, const dp_dataset *ds)
{
    check_records(d, ds);
    if (ds->kind != (d->floats ? DP_VALUES_F32 : DP_VALUES_U8) ||
        ds->rows != (d->floats ? 1u : ROWS) || ds->cols != (d->floats ? (uint32_t)FDIM : COLS) ||
        ds->channels != 1 || ds->classes != d->classes) {
        fprintf(stderr, "shape %ux%ux%u kind %d classes %u differ from the sources'\n", ds->rows,
                ds->cols, ds->channels, (int)ds->kind, ds->classes);
        abort();
    }
    if (ds->train_all.n_files != 2 || ds->train_all.file_end[0] != 3 ||
        ds->train_all.file_end[1] != 5 || ds->test.n_files != 1 || ds->test.file_end[0] != 2) {
        fprintf(stderr, "the files' bounds differ from the sources'\n");
        abort();
    }
}

/* The cache on disk after an open that trusted or rebuilt it. */
static void check_on_disk(const dataset_ref *d, const uint8_t *written, size_t n)
{
    FILE *fp = fopen(d->cache, "rb");
    if (!fp)
        abort();
    uint8_t *now = malloc(d->ref_len + n + 1);
    if (!now)
        abort();
    size_t got = fread(now, 1, d->ref_len + n + 1, fp);
    fclose(fp);
    int same_written = got == n && memcmp(now, written, n) == 0;
    int same_ref = got == d->ref_len && memcmp(now, d->ref, got) == 0;
    free(now);
    if (!same_written && !same_ref) {
        fprintf(stderr, "the rebuilt cache differs from the reference\n");
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > (1 << 16))
        return 0;
    if (!root[0])
        setup();
    uint8_t flags = data[0];
    dataset_ref *d = &sets[(flags >> 4) & 1];
    data++;
    size--;

    /* The file: n bytes. */
    size_t n = size, at = 0, win = size;
    const uint8_t *x = data;
    if ((flags & 0x21) == 0x21) {
        at = size >= 2 ? ((size_t)data[0] | (size_t)data[1] << 8) % (d->ref_len + 16) : 0;
        x = data + (size >= 2 ? 2 : size);
        win = size >= 2 ? size - 2 : 0;
        n = flags & 8 ? at : at + win > d->ref_len ? at + win : d->ref_len;
    } else if (flags & 1) {
        n = (flags & 8) && size < d->ref_len ? size : size > d->ref_len ? size : d->ref_len;
    }
    uint8_t *file = malloc(n ? n : 1);
    if (!file)
        return 0;
    if (flags & 1) {
        for (size_t i = 0; i < n; i++)
            file[i] = (uint8_t)((i < d->ref_len ? d->ref[i] : 0) ^
                                (i >= at && i - at < win ? x[i - at] : 0));
    } else if (n) {
        memcpy(file, data, n);
    }
    if ((flags & 4) && n >= d->ref_len) {
        size_t off = d->payload_off;
        uint32_t all = 0;
        for (int i = 0; i < 4; i++) {
            uint32_t c = dp_crc32c(0, file + off, d->sec_len[i]);
            put32(file + d->sec_crc_at[i], c);
            all = dp_crc32c(all, file + off, d->sec_len[i]);
            off += d->sec_len[i];
        }
        put32(file + d->payload_crc_at, all);
    }
    if ((flags & 2) && n >= (size_t)d->hdr_crc_at + 4)
        put32(file + d->hdr_crc_at, dp_crc32c(0, file, (size_t)d->hdr_crc_at));
    FILE *fp = fopen(d->cache, "wb");
    if (!fp || (n && fwrite(file, 1, n, fp) != n) || fclose(fp) != 0)
        abort();

    int payload_kept = kept(d, file, n, d->payload_crc_at);
    for (int i = 0; i < 4; i++)
        payload_kept &= kept(d, file, n, d->sec_crc_at[i]);
    int all_kept = payload_kept && kept(d, file, n, d->hdr_crc_at);

    dp_dataset ds;
    dp_err err;
    err.msg[0] = '\0';
    dp_dataset_options o = cache_options();
    if (dp_dataset_open_with(&ds, d->dir, &o, &err) != 0) {
        /* The sources are valid: a damaged cache is rebuilt, never fatal; a
         * forged one may fail the rebuild, with a message naming the
         * dataset or its file. */
        if (all_kept || !strstr(err.msg, d->dir)) {
            fprintf(stderr, "dp_dataset_open_with: %s\n", err.msg);
            abort();
        }
        free(file);
        return 0;
    }
    check_consistent(&ds);
    if (payload_kept)
        check_records(d, &ds);
    if (all_kept) {
        check_exact(d, &ds);
        check_on_disk(d, file, n);
    }
    dp_split tr, va;
    (void)dp_dataset_split(&ds, ds.train_all.n - 1, 1, &tr, &va, &err);
    dp_dataset_close(&ds);
    free(file);
    return 0;
}
