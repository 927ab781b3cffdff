/* libFuzzer target for datasets of record files (include/downpour/records.h;
 * src/data/files.c, src/data/records.c over the TFRecord, Example, PNG, .npy
 * and CSV readers): the fuzz bytes become the files of a dataset in a
 * scratch directory, found with dp_data_files_find, counted with
 * dp_data_files_count and read through with dp_record_open, dp_record_next
 * and dp_record_skip.  Never a crash, a leak or a hang, and:
 *   - every refusal has a message naming a file of the dataset (the spec,
 *     for dp_data_files_find);
 *   - a counted dataset has a consistent shape and counts;
 *   - a file read through without a refusal gives exactly the records it was
 *     counted with, every label below the class count, and the reader's
 *     index follows;
 *   - reading the file again with skips in between gives the same record at
 *     each index, and no refusal before the first index the plain reading
 *     refused (skip checks less, never more).
 *
 * Byte 0 holds flags; the rest makes the files:
 *   bits 0-1  the format: 0 TFRecord (the rest is train.tfrecord), 1 an .npy
 *             pair (a u16 little-endian length L, then L bytes of
 *             x_train.npy, the rest y_train.npy), 2 CSV (train.csv), 3 one
 *             .npz (data.npz, which holds both splits itself)
 *   bit 2     the test split is a copy of the training files, else a fixed
 *             valid file of the format (one record of 4 values)
 *   bit 3     the class count is 10 (else 0: 256)
 *   bit 4     TFRecord: the rest is records, each a u16 little-endian length
 *             and its bytes, that the harness frames with their CRCs (which
 *             a fuzzer cannot guess), so the Examples are what is fuzzed
 *   bits 5-7  k: the second reading skips k records (0: 1) before each
 *             record it reads */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_scratch.h"
#include "downpour/example.h"
#include "downpour/log.h"
#include "downpour/records.h"
#include "downpour/tfrecord.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Records read from one file at most: the input bounds the count anyway,
 * this bounds the per-run time of a file of many empty records. */
#define MAX_READ 4096u

static char dir[256];
static const char *const all_names[] = {"train.tfrecord", "test.tfrecord", "x_train.npy",
                                        "y_train.npy", "x_test.npy", "y_test.npy",
                                        "train.csv", "test.csv", "data.npz"};
#define N_NAMES (sizeof all_names / sizeof all_names[0])

/* The fixed test files: one record of 4 values (2x2 bytes, label 1). */
static uint8_t *tf_fixed;
static size_t tf_fixed_len;
static const char csv_test[] = "label,a,b,c,d\n1,0.5,2,3,-4\n";

static void path_of(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", dir, name);
}

static void le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_file(const char *name, const void *p, size_t n)
{
    char path[400];
    path_of(path, sizeof path, name);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0)
        abort();
}

/* An .npy of version 1: the preamble, the header dict padded with spaces to
 * a multiple of 64 bytes and ended by a newline, then the data. */
static void put_npy(const char *name, const char *dict, const void *body, size_t len)
{
    uint8_t buf[256];
    size_t dl = strlen(dict), total = (10 + dl + 1 + 63) / 64 * 64;
    if (total + len > sizeof buf)
        abort();
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (uint8_t)((total - 10) & 0xff);
    buf[9] = (uint8_t)((total - 10) >> 8);
    memcpy(buf + 10, dict, dl);
    memset(buf + 10 + dl, ' ', total - 10 - dl - 1);
    buf[total - 1] = '\n';
    memcpy(buf + total, body, len);
    put_file(name, buf, total + len);
}

/* The fixed TFRecord test file: one Example {"image": 4 bytes, "label":
 * int64 1}, framed as TFRecord writes it. */
static void make_tf_fixed(void)
{
    static const uint8_t pix[4] = {9, 8, 7, 6};
    int64_t one = 1;
    dp_bytes b = {pix, sizeof pix};
    dp_feature fs[2] = {{"image", DP_FEATURE_BYTES, 1, &b, NULL, NULL},
                        {"label", DP_FEATURE_INT64, 1, NULL, NULL, &one}};
    size_t len = dp_example_encoded_size(fs, 2);
    tf_fixed_len = 8 + 4 + len + 4;
    tf_fixed = malloc(tf_fixed_len);
    if (!tf_fixed)
        abort();
    for (int i = 0; i < 8; i++)
        tf_fixed[i] = (uint8_t)((uint64_t)len >> (8 * i));
    le32(tf_fixed + 8, dp_tfrecord_masked_crc(tf_fixed, 8));
    dp_example_encode(tf_fixed + 12, fs, 2);
    le32(tf_fixed + 12 + len, dp_tfrecord_masked_crc(tf_fixed + 12, len));
}

/* The records [u16 length, bytes]... of in framed as a TFRecord file: each
 * record takes 2 input bytes more than its own (1 for a last one cut short)
 * and 16 output bytes more, so the file is under 8 times the input + 16. */
static uint8_t *frame_records(const uint8_t *in, size_t n, size_t *len)
{
    uint8_t *out = malloc(n * 8 + 16), *o = out;
    if (!out)
        return NULL;
    size_t at = 0;
    while (at < n) {
        size_t l = at + 2 <= n ? (size_t)in[at] | (size_t)in[at + 1] << 8 : 0;
        at = at + 2 <= n ? at + 2 : n;
        if (l > n - at)
            l = n - at;
        for (int i = 0; i < 8; i++)
            o[i] = (uint8_t)((uint64_t)l >> (8 * i));
        le32(o + 8, dp_tfrecord_masked_crc(o, 8));
        memcpy(o + 12, in + at, l);
        le32(o + 12 + l, dp_tfrecord_masked_crc(in + at, l));
        o += 16 + l;
        at += l;
    }
    *len = (size_t)(o - out);
    return out;
}

static void cleanup(void)
{
    char path[400];
    for (size_t i = 0; i < N_NAMES; i++) {
        path_of(path, sizeof path, all_names[i]);
        unlink(path);
    }
    rmdir(dir);
    free(tf_fixed);
}

static void setup(void)
{
    fz_scratch_dir(dir, sizeof dir, "fuzz_records");
    atexit(cleanup);
    make_tf_fixed();
    dp_log_set_level(DP_LOG_ERROR);
}

/* Whether msg names a file of the dataset. */
static int names_file(const char *msg, const dp_data_files *fs)
{
    const dp_data_split_files *sp[2] = {&fs->train, &fs->test};
    for (int s = 0; s < 2; s++)
        for (size_t i = 0; i < sp[s]->n; i++)
            if (strstr(msg, sp[s]->files[i].path) ||
                (sp[s]->files[i].labels_path && strstr(msg, sp[s]->files[i].labels_path)))
                return 1;
    return 0;
}

static void refused(const char *what, const dp_err *err, const dp_data_file *f,
                    const dp_data_files *fs)
{
    int ok = f ? strstr(err->msg, f->path) != NULL ||
                     (f->labels_path && strstr(err->msg, f->labels_path) != NULL)
               : names_file(err->msg, fs);
    if (!ok) {
        fprintf(stderr, "%s: the refusal names no file of the dataset: \"%s\"\n", what, err->msg);
        abort();
    }
}

static uint64_t hash_record(const void *p, size_t n, uint8_t label)
{
    uint64_t h = 0xcbf29ce484222325ull ^ label;
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const uint8_t *)p)[i]) * 0x100000001b3ull;
    return h;
}

/* Reads file f through twice (plainly, then skipping k before each read). */
static void read_file(const dp_data_file *f, const dp_data_files *fs, const dp_data_options *o,
                      void *feat, size_t rec, uint32_t classes, uint64_t k, uint64_t *hashes)
{
    dp_record_reader *r;
    dp_err err;
    if (dp_record_open(&r, f, fs->format, &fs->shape, o, &err) != 0) {
        refused("dp_record_open", &err, f, fs);
        return;
    }
    if (dp_record_reader_bytes(r) == 0)
        abort();
    uint64_t got = 0, bad = UINT64_MAX; /* bad: the first index refused */
    int rc;
    for (;;) {
        if (got >= MAX_READ) {
            rc = 2; /* stopped, not at the end: what lies past it is unknown */
            bad = got;
            break;
        }
        uint8_t label = 0xff;
        rc = dp_record_next(r, feat, &label, &err);
        if (rc < 0) {
            refused("dp_record_next", &err, f, fs);
            bad = got;
            break;
        }
        if (rc == 0)
            break;
        if (label >= classes)
            abort();
        hashes[got++] = hash_record(feat, rec, label);
        if (dp_record_index(r) != got)
            abort();
    }
    dp_record_close(r);
    if (rc == 0 && got != f->records) {
        fprintf(stderr, "%s: read %llu records, counted %llu\n", f->path,
                (unsigned long long)got, (unsigned long long)f->records);
        abort();
    }

    /* Again, skipping k before each record read. */
    if (dp_record_open(&r, f, fs->format, &fs->shape, o, &err) != 0) {
        refused("dp_record_open (skipping)", &err, f, fs);
        return;
    }
    uint64_t at = 0;
    int clean = rc == 0;
    while (at < got) {
        int64_t s = dp_record_skip(r, k, &err);
        if (s < 0) {
            refused("dp_record_skip", &err, f, fs);
            if (dp_record_index(r) < bad)
                abort(); /* skipping refused a record plain reading took */
            break;
        }
        at += (uint64_t)s;
        if (dp_record_index(r) != at)
            abort();
        if ((uint64_t)s < k) {
            if (clean && at != got)
                abort(); /* the end came early */
            break;
        }
        if (at >= got)
            break;
        uint8_t label = 0xff;
        int n = dp_record_next(r, feat, &label, &err);
        if (n < 0) {
            refused("dp_record_next (skipping)", &err, f, fs);
            if (at < bad)
                abort();
            break;
        }
        if (n == 0 || hash_record(feat, rec, label) != hashes[at]) {
            fprintf(stderr, "%s: record %llu differs when reached by skipping\n", f->path,
                    (unsigned long long)at);
            abort();
        }
        at++;
    }
    dp_record_close(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > (1 << 16))
        return 0;
    if (!dir[0])
        setup();
    uint8_t flags = data[0];
    int format = flags & 3, copy = (flags >> 2) & 1;
    uint64_t k = flags >> 5 ? flags >> 5 : 1;
    data++;
    size--;
    char path[400];
    for (size_t i = 0; i < N_NAMES; i++) {
        path_of(path, sizeof path, all_names[i]);
        unlink(path);
    }
    switch (format) {
    case 0: {
        const uint8_t *file = data;
        size_t len = size;
        uint8_t *framed = NULL;
        if (flags & 16) {
            framed = frame_records(data, size, &len);
            if (!framed)
                return 0;
            file = framed;
        }
        put_file("train.tfrecord", file, len);
        if (copy)
            put_file("test.tfrecord", file, len);
        else
            put_file("test.tfrecord", tf_fixed, tf_fixed_len);
        free(framed);
        break;
    }
    case 1: {
        size_t l = size >= 2 ? (size_t)data[0] | (size_t)data[1] << 8 : 0;
        const uint8_t *p = data + (size >= 2 ? 2 : size);
        size_t rest = size >= 2 ? size - 2 : 0;
        if (l > rest)
            l = rest;
        put_file("x_train.npy", p, l);
        put_file("y_train.npy", p + l, rest - l);
        if (copy) {
            put_file("x_test.npy", p, l);
            put_file("y_test.npy", p + l, rest - l);
        } else {
            static const uint8_t x[4] = {9, 8, 7, 6}, y[8] = {1};
            put_npy("x_test.npy", "{'descr': '|u1', 'fortran_order': False, 'shape': (1, 2, 2), }",
                    x, sizeof x);
            put_npy("y_test.npy", "{'descr': '<i8', 'fortran_order': False, 'shape': (1,), }", y,
                    sizeof y);
        }
        break;
    }
    case 2:
        put_file("train.csv", data, size);
        if (copy)
            put_file("test.csv", data, size);
        else
            put_file("test.csv", csv_test, sizeof csv_test - 1);
        break;
    default:
        put_file("data.npz", data, size);
        break;
    }

    dp_data_options o;
    dp_data_options_default(&o);
    o.classes = flags & 8 ? 10 : 0;
    uint32_t classes = o.classes ? o.classes : 256;
    dp_data_files fs;
    dp_err err;
    err.msg[0] = '\0';
    if (dp_data_files_find(&fs, dir, &o, &err) != 0) {
        if (!strstr(err.msg, dir)) {
            fprintf(stderr, "dp_data_files_find: the refusal names neither the spec nor a "
                    "file: \"%s\"\n", err.msg);
            abort();
        }
        return 0;
    }
    if (dp_data_files_count(&fs, &o, &err) != 0) {
        refused("dp_data_files_count", &err, NULL, &fs);
        dp_data_files_free(&fs);
        return 0;
    }
    const dp_record_shape *s = &fs.shape;
    if (!fs.counted || s->dim == 0 || s->kind >= DP_VALUES_KIND_COUNT ||
        (uint64_t)s->rows * s->cols * s->channels != s->dim || fs.train.records == 0 ||
        fs.test.records == 0)
        abort();
    const dp_data_split_files *sp[2] = {&fs.train, &fs.test};
    for (int i = 0; i < 2; i++) {
        uint64_t sum = 0;
        for (size_t j = 0; j < sp[i]->n; j++) {
            if (sp[i]->files[j].first != sum)
                abort();
            sum += sp[i]->files[j].records;
        }
        if (sum != sp[i]->records)
            abort();
    }
    size_t rec = (size_t)s->dim * dp_value_size(s->kind);
    void *feat = malloc(rec);
    uint64_t *hashes = malloc(MAX_READ * sizeof *hashes);
    if (feat && hashes)
        for (int i = 0; i < 2; i++)
            for (size_t j = 0; j < sp[i]->n; j++)
                read_file(&sp[i]->files[j], &fs, &o, feat, rec, classes, k, hashes);
    free(feat);
    free(hashes);
    dp_data_files_free(&fs);
    return 0;
}
