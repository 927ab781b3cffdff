/* Datasets of record files (records.h): small datasets written here (TFRecord
 * files of Examples with PNG images, raw bytes, float and int64 lists, raw
 * and gzip; .npy pairs and an .npz; CSV with and without a header) are found,
 * split and sorted as the contract says, counted, and read back record by
 * record equal to what was written (bytes and floats exact).  Mixed formats,
 * a split with no file, a file matching both patterns, a PNG of another size,
 * a label not below the class count and a flipped byte are refused naming
 * the file and the record. */
#include <math.h>
#include <png.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "bytes.h"
#include "check.h"
#include "example_file.h"
#include "downpour/example.h"
#include "downpour/records.h"
#include "downpour/tfrecord.h"
#include "scratch.h"

static char scratch[1024];

static const char *path_of(const char *name)
{
    static char buf[8][1200];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", scratch, name);
    return buf[k];
}

static void make_dir(const char *name) { REQUIRE(mkdir(path_of(name), 0755) == 0); }

/* ---- writing TFRecord files ---- */

/* A gray (channels 1) or RGB PNG of h x w pixels, written with libpng. */
static uint8_t *png_encode(size_t *len, const uint8_t *pixels, uint32_t h, uint32_t w,
                           int channels)
{
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = w;
    img.height = h;
    img.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
    png_alloc_size_t n = 0;
    REQUIRE(png_image_write_to_memory(&img, NULL, &n, 0, pixels, 0, NULL));
    uint8_t *out = malloc(n);
    REQUIRE(out);
    REQUIRE(png_image_write_to_memory(&img, out, &n, 0, pixels, 0, NULL));
    *len = n;
    return out;
}

/* The pixels of record `id` (any size): a pattern that differs per record. */
static void pixels_of(uint8_t *px, size_t n, uint32_t id)
{
    uint32_t x = 2463534242u ^ (id * 2654435761u);
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        px[i] = (uint8_t)x;
    }
}

static dp_tfrecord_writer *tf_create(const char *path)
{
    dp_tfrecord_writer *w;
    dp_err err;
    REQUIRE(dp_tfrecord_writer_open(&w, path, DP_TFRECORD_AUTO, &err) == 0);
    return w;
}

static void tf_finish(dp_tfrecord_writer *w)
{
    dp_err err;
    CHECKF(dp_tfrecord_writer_close(w, &err) == 0, "%s", err.msg);
}

/* A TFRecord file of n Examples: a PNG image (h x w, channels) of record
 * first + i and its label; record `odd` (if < n) gets an odd_h x odd_w PNG. */
static void write_png_file(const char *path, uint32_t first, uint32_t n, uint32_t h, uint32_t w,
                           int channels, const uint8_t *labels, uint32_t odd, uint32_t odd_h,
                           uint32_t odd_w)
{
    dp_tfrecord_writer *wr = tf_create(path);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t rh = i == odd ? odd_h : h, rw = i == odd ? odd_w : w;
        size_t np = (size_t)rh * rw * channels, plen;
        uint8_t *px = malloc(np);
        REQUIRE(px);
        pixels_of(px, np, first + i);
        uint8_t *png = png_encode(&plen, px, rh, rw, channels);
        dp_bytes b = {png, plen};
        int64_t label = labels[first + i];
        const dp_feature fs[2] = {{"image", DP_FEATURE_BYTES, 1, &b, NULL, NULL},
                                  {"label", DP_FEATURE_INT64, 1, NULL, NULL, &label}};
        write_example(wr, fs, 2);
        free(png);
        free(px);
    }
    tf_finish(wr);
}

/* ---- checking a dataset ---- */

static dp_data_files find_ok(const char *spec, const dp_data_options *opt)
{
    dp_data_files f;
    dp_err err;
    int rc = dp_data_files_find(&f, spec, opt, &err);
    CHECKF(rc == 0, "%s: %s", spec, err.msg);
    if (rc != 0)
        exit(1);
    return f;
}

static void count_ok(dp_data_files *f, const dp_data_options *opt)
{
    dp_err err;
    int rc = dp_data_files_count(f, opt, &err);
    CHECKF(rc == 0, "%s", err.msg);
    if (rc != 0)
        exit(1);
    CHECK(f->counted);
}

static void find_fails(const char *spec, const dp_data_options *opt, const char *n1,
                       const char *n2)
{
    dp_data_files f;
    dp_err err;
    err.msg[0] = 0;
    CHECKF(dp_data_files_find(&f, spec, opt, &err) == -1, "%s was accepted", spec);
    CHECKF(strstr(err.msg, n1) && (!n2 || strstr(err.msg, n2)), "%s: \"%s\" lacks \"%s\" or \"%s\"",
           spec, err.msg, n1, n2 ? n2 : "");
    fprintf(stderr, "refused as it should be: %s\n", err.msg);
}

/* Reads file f to the end and compares every record with want (dim values
 * of the shape's kind each) and labels; returns the records read. */
static uint64_t read_all(const dp_data_files *fs, const dp_data_file *f,
                         const dp_data_options *opt, const void *want, const uint8_t *labels)
{
    dp_record_reader *r;
    dp_err err;
    size_t vs = dp_value_size(fs->shape.kind), rb = fs->shape.dim * vs;
    REQUIRE(dp_record_open(&r, f, fs->format, &fs->shape, opt, &err) == 0);
    CHECK(dp_record_reader_bytes(r) > 0);
    uint8_t *got = malloc(rb);
    REQUIRE(got);
    uint64_t n = 0;
    int rc;
    uint8_t label;
    while ((rc = dp_record_next(r, got, &label, &err)) == 1) {
        CHECKF(memcmp(got, (const uint8_t *)want + n * rb, rb) == 0, "%s record %llu differs",
               f->path, (unsigned long long)n);
        CHECKF(label == labels[n], "%s record %llu: label %u, wrote %u", f->path,
               (unsigned long long)n, label, labels[n]);
        n++;
        CHECK(dp_record_index(r) == n);
    }
    CHECKF(rc == 0, "%s: %s", f->path, err.msg);
    CHECK(dp_record_next(r, got, &label, &err) == 0); /* the end stays the end */
    free(got);
    dp_record_close(r);
    return n;
}

/* Opens f and skips `skip` records, then reads one: it must be record skip. */
static void skip_then_read(const dp_data_files *fs, const dp_data_file *f,
                           const dp_data_options *opt, uint64_t skip, const void *want,
                           const uint8_t *labels)
{
    dp_record_reader *r;
    dp_err err;
    size_t rb = fs->shape.dim * dp_value_size(fs->shape.kind);
    REQUIRE(dp_record_open(&r, f, fs->format, &fs->shape, opt, &err) == 0);
    uint8_t *got = malloc(rb), label;
    REQUIRE(got);
    CHECKF(dp_record_skip(r, skip, &err) == (int64_t)skip, "%s", err.msg);
    CHECK(dp_record_index(r) == skip);
    CHECKF(dp_record_next(r, got, &label, &err) == 1, "%s", err.msg);
    CHECK(memcmp(got, (const uint8_t *)want + skip * rb, rb) == 0);
    CHECK(label == labels[skip]);
    /* Past the end: fewer skipped than asked. */
    int64_t left = (int64_t)(f->records - skip - 1);
    CHECK(dp_record_skip(r, 1000, &err) == left);
    CHECK(dp_record_next(r, got, &label, &err) == 0);
    free(got);
    dp_record_close(r);
}

/* Reads file f until a record is refused; the refusal must be record `at`
 * and name the file and `needle`. */
static void read_fails_at(const dp_data_files *fs, const dp_data_file *f,
                          const dp_data_options *opt, uint64_t at, const char *needle)
{
    dp_record_reader *r;
    dp_err err;
    REQUIRE(dp_record_open(&r, f, fs->format, &fs->shape, opt, &err) == 0);
    uint8_t *got = malloc(fs->shape.dim * dp_value_size(fs->shape.kind)), label;
    REQUIRE(got);
    int rc;
    uint64_t n = 0;
    while ((rc = dp_record_next(r, got, &label, &err)) == 1)
        n++;
    char rec[64];
    snprintf(rec, sizeof rec, "record %llu", (unsigned long long)at);
    CHECKF(rc == -1 && n == at, "%s: rc %d after %llu records", f->path, rc, (unsigned long long)n);
    /* The file at fault: the features' or (npy) the labels'. */
    int names_file = strstr(err.msg, f->path) || (f->labels_path && strstr(err.msg, f->labels_path));
    CHECKF(rc == -1 && names_file && strstr(err.msg, rec) && strstr(err.msg, needle),
           "\"%s\" lacks the file, \"%s\" or \"%s\"", err.msg, rec, needle);
    fprintf(stderr, "refused as it should be: %s\n", err.msg);
    free(got);
    dp_record_close(r);
}

/* ---- TFRecord ---- */

#define IMG_H 6
#define IMG_W 8
#define PNG_TRAIN 9 /* records in the training files: 5 + 4 */
#define PNG_TEST 3

static void test_tfrecord_png(void)
{
    make_dir("png");
    uint8_t labels[PNG_TRAIN + PNG_TEST];
    for (int i = 0; i < PNG_TRAIN + PNG_TEST; i++)
        labels[i] = (uint8_t)(i * 7 % 10);
    /* Written out of order: the files must come back sorted by name. */
    write_png_file(path_of("png/mnist-train.tfrecord-00001-of-00002"), 5, 4, IMG_H, IMG_W, 1,
                   labels, 99, 0, 0);
    write_png_file(path_of("png/mnist-train.tfrecord-00000-of-00002"), 0, 5, IMG_H, IMG_W, 1,
                   labels, 99, 0, 0);
    write_png_file(path_of("png/mnist-test.tfrecord-00000-of-00001"), PNG_TRAIN, PNG_TEST, IMG_H,
                   IMG_W, 1, labels, 99, 0, 0);
    /* Passed over: another format, a hidden file, a writer's partial file. */
    write_bytes(path_of("png/README.txt"), "hello", 5);
    write_bytes(path_of("png/.mnist-train.tfrecord-00009"), "x", 1);
    write_bytes(path_of("png/mnist-train.tfrecord-00002-of-00002.tmp"), "x", 1);

    dp_data_options opt;
    dp_data_options_default(&opt);
    opt.classes = 10;
    CHECK(dp_data_files_match(path_of("png")));
    dp_data_files f = find_ok(path_of("png"), &opt);
    CHECK(f.format == DP_DATA_TFRECORD && strcmp(dp_data_format_name(f.format), "tfrecord") == 0);
    REQUIRE(f.train.n == 2 && f.test.n == 1);
    CHECK(strstr(f.train.files[0].path, "00000-of-00002") && strstr(f.train.files[1].path, "00001-of-00002"));
    CHECK(strstr(f.test.files[0].path, "mnist-test.tfrecord"));
    CHECK(f.train.files[0].labels_path == NULL && f.train.files[0].member == NULL);
    count_ok(&f, &opt);
    CHECK(f.shape.kind == DP_VALUES_U8 && f.shape.rows == IMG_H && f.shape.cols == IMG_W &&
          f.shape.channels == 1 && f.shape.dim == IMG_H * IMG_W);
    CHECK(f.train.files[0].records == 5 && f.train.files[0].first == 0);
    CHECK(f.train.files[1].records == 4 && f.train.files[1].first == 5);
    CHECK(f.train.records == PNG_TRAIN && f.test.records == PNG_TEST);
    CHECK(f.test.files[0].first == 0);

    uint8_t want[(PNG_TRAIN + PNG_TEST) * IMG_H * IMG_W];
    for (uint32_t i = 0; i < PNG_TRAIN + PNG_TEST; i++)
        pixels_of(want + i * IMG_H * IMG_W, IMG_H * IMG_W, i);
    CHECK(read_all(&f, &f.train.files[0], &opt, want, labels) == 5);
    CHECK(read_all(&f, &f.train.files[1], &opt, want + 5 * IMG_H * IMG_W, labels + 5) == 4);
    CHECK(read_all(&f, &f.test.files[0], &opt, want + PNG_TRAIN * IMG_H * IMG_W,
                   labels + PNG_TRAIN) == PNG_TEST);
    skip_then_read(&f, &f.train.files[0], &opt, 3, want, labels);

    /* A glob and a single file name the same files. */
    char spec[1200];
    snprintf(spec, sizeof spec, "%s/mnist-*.tfrecord-*", path_of("png"));
    CHECK(dp_data_files_match(spec));
    dp_data_files g = find_ok(spec, &opt);
    CHECK(g.train.n == 2 && g.test.n == 1 &&
          strcmp(g.train.files[1].path, f.train.files[1].path) == 0);
    dp_data_files_free(&g);
    CHECK(dp_data_files_match(f.test.files[0].path));
    dp_data_files_free(&f);

    /* An RGB PNG: three channels from the first record. */
    make_dir("rgb");
    write_png_file(path_of("rgb/a-train.tfrecord"), 0, 2, 3, 5, 3, labels, 99, 0, 0);
    write_png_file(path_of("rgb/a-test.tfrecord"), 2, 1, 3, 5, 3, labels, 99, 0, 0);
    f = find_ok(path_of("rgb"), NULL);
    count_ok(&f, NULL);
    CHECK(f.shape.rows == 3 && f.shape.cols == 5 && f.shape.channels == 3 && f.shape.dim == 45);
    uint8_t rgb[3 * 45];
    for (uint32_t i = 0; i < 3; i++)
        pixels_of(rgb + i * 45, 45, i);
    CHECK(read_all(&f, &f.train.files[0], NULL, rgb, labels) == 2);
    CHECK(read_all(&f, &f.test.files[0], NULL, rgb + 2 * 45, labels + 2) == 1);
    dp_data_files_free(&f);
}

/* Float lists (gzip), int64 lists, a float label, raw bytes. */
static void test_tfrecord_lists(void)
{
    make_dir("flt");
    enum { DIM = 5, NTR = 4, NTE = 3 };
    float want[(NTR + NTE) * DIM];
    uint8_t labels[NTR + NTE];
    for (int i = 0; i < NTR + NTE; i++) {
        labels[i] = (uint8_t)(200 + i); /* above 10: classes 0 means 256 */
        for (int k = 0; k < DIM; k++)
            want[i * DIM + k] = i < NTR ? (float)(i * 0.37 - k * 1.5e-3 + (k == 2 ? 1e30 : 0))
                                        : (float)((i + 1) * (k - 2) * 1000003);
    }
    dp_tfrecord_writer *w = tf_create(path_of("flt/train.tfrecord.gz"));
    for (int i = 0; i < NTR; i++) {
        int64_t l = labels[i];
        float fl = (float)labels[i];
        /* Record 1's label is an integral float. */
        const dp_feature fs[2] = {{"image", DP_FEATURE_FLOAT, DIM, NULL, want + i * DIM, NULL},
                                  i == 1 ? (dp_feature){"label", DP_FEATURE_FLOAT, 1, NULL, &fl, NULL}
                                         : (dp_feature){"label", DP_FEATURE_INT64, 1, NULL, NULL, &l}};
        write_example(w, fs, 2);
    }
    tf_finish(w);
    /* The test file holds int64 lists: numbers, read as floats. */
    w = tf_create(path_of("flt/test.tfrecord.gz"));
    for (int i = NTR; i < NTR + NTE; i++) {
        int64_t l = labels[i], v[DIM];
        for (int k = 0; k < DIM; k++)
            v[k] = (int64_t)want[i * DIM + k];
        const dp_feature fs[3] = {{"image", DP_FEATURE_INT64, DIM, NULL, NULL, v},
                                  {"label", DP_FEATURE_INT64, 1, NULL, NULL, &l},
                                  {"other", DP_FEATURE_FLOAT, 1, NULL, want, NULL}};
        write_example(w, fs, 3);
    }
    tf_finish(w);
    /* Really gzip. */
    size_t n;
    uint8_t *raw = read_bytes(path_of("flt/train.tfrecord.gz"), &n);
    CHECK(n > 2 && raw[0] == 0x1f && raw[1] == 0x8b);
    free(raw);

    dp_data_files f = find_ok(path_of("flt"), NULL);
    count_ok(&f, NULL);
    CHECK(f.shape.kind == DP_VALUES_F32 && f.shape.rows == 1 && f.shape.cols == DIM &&
          f.shape.channels == 1 && f.shape.dim == DIM);
    CHECK(f.train.records == NTR && f.test.records == NTE);
    CHECK(read_all(&f, &f.train.files[0], NULL, want, labels) == NTR);
    CHECK(read_all(&f, &f.test.files[0], NULL, want + NTR * DIM, labels + NTR) == NTE);
    skip_then_read(&f, &f.train.files[0], NULL, 2, want, labels);
    /* With 10 classes, label 200 is refused at record 0. */
    dp_data_options o10;
    dp_data_options_default(&o10);
    o10.classes = 10;
    read_fails_at(&f, &f.train.files[0], &o10, 0, "label 200");
    dp_data_files_free(&f);

    /* Raw bytes: height and width features give the shape (2 channels
     * here); without them a square; else 1 x len.  Other pattern names. */
    make_dir("raw");
    uint8_t px[3 * 24];
    pixels_of(px, sizeof px, 5);
    uint8_t lab[3] = {1, 2, 3};
    w = tf_create(path_of("raw/fit.tfrec"));
    for (int i = 0; i < 2; i++) {
        int64_t l = lab[i], h = 3, wd = 4;
        dp_bytes b = {px + i * 24, 24};
        const dp_feature fs[4] = {{"pix", DP_FEATURE_BYTES, 1, &b, NULL, NULL},
                                  {"y", DP_FEATURE_INT64, 1, NULL, NULL, &l},
                                  {"height", DP_FEATURE_INT64, 1, NULL, NULL, &h},
                                  {"width", DP_FEATURE_INT64, 1, NULL, NULL, &wd}};
        write_example(w, fs, 4);
    }
    tf_finish(w);
    w = tf_create(path_of("raw/eval.tfrec"));
    {
        int64_t l = lab[2];
        dp_bytes b = {px + 48, 24};
        const dp_feature fs[2] = {{"pix", DP_FEATURE_BYTES, 1, &b, NULL, NULL},
                                  {"y", DP_FEATURE_INT64, 1, NULL, NULL, &l}};
        write_example(w, fs, 2);
    }
    tf_finish(w);
    dp_data_options ro;
    dp_data_options_default(&ro);
    ro.image = "pix";
    ro.label = "y";
    ro.train = "fit*";
    ro.test = "eval*";
    f = find_ok(path_of("raw"), &ro);
    count_ok(&f, &ro);
    CHECK(f.shape.kind == DP_VALUES_U8 && f.shape.rows == 3 && f.shape.cols == 4 &&
          f.shape.channels == 2 && f.shape.dim == 24);
    CHECK(read_all(&f, &f.train.files[0], &ro, px, lab) == 2);
    CHECK(read_all(&f, &f.test.files[0], &ro, px + 48, lab + 2) == 1);
    dp_data_files_free(&f);
    /* The eval file as the training set: 24 bytes and no height: 1 x 24. */
    ro.train = "eval*";
    ro.test = "fit*";
    f = find_ok(path_of("raw"), &ro);
    count_ok(&f, &ro);
    CHECK(f.shape.rows == 1 && f.shape.cols == 24 && f.shape.channels == 1);
    dp_data_files_free(&f);

    /* Sides whose product wraps 64 bits (2^32 x 2^32 is 0 modulo 2^64) are
     * refused, not divided by (found by fuzz_records). */
    make_dir("wrap");
    for (int k = 0; k < 2; k++) {
        w = tf_create(path_of(k ? "wrap/eval.tfrec" : "wrap/fit.tfrec"));
        int64_t l = 1, side = (int64_t)1 << 32;
        dp_bytes b = {px, 24};
        const dp_feature fs[4] = {{"pix", DP_FEATURE_BYTES, 1, &b, NULL, NULL},
                                  {"y", DP_FEATURE_INT64, 1, NULL, NULL, &l},
                                  {"height", DP_FEATURE_INT64, 1, NULL, NULL, &side},
                                  {"width", DP_FEATURE_INT64, 1, NULL, NULL, &side}};
        write_example(w, fs, 4);
        tf_finish(w);
    }
    ro.train = "fit*";
    ro.test = "eval*";
    f = find_ok(path_of("wrap"), &ro);
    dp_err err;
    CHECK(dp_data_files_count(&f, &ro, &err) == -1);
    CHECKF(strstr(err.msg, "wrap/fit.tfrec") && strstr(err.msg, "record 0") &&
           strstr(err.msg, "4294967296 x 4294967296"), "%s", err.msg);
    fprintf(stderr, "refused as it should be: %s\n", err.msg);
    dp_data_files_free(&f);
}

/* ---- NumPy ---- */

static void write_npy(const char *name, const char *descr, const char *shape, const void *data,
                      size_t n)
{
    bytes b = npy_array(descr, shape, data, n);
    write_bytes(path_of(name), b.p, b.n);
    free(b.p);
}

/* A ZIP of stored members (numpy.savez without ZIP64). */
static void write_zip(const char *name, const char **names, const bytes *m, int nm)
{
    bytes b = {0}, cd = {0};
    for (int i = 0; i < nm; i++) {
        uint32_t crc = (uint32_t)crc32(0, m[i].p, (uInt)m[i].n), off = (uint32_t)b.n;
        uint32_t nl = (uint32_t)strlen(names[i]);
        put32(&b, 0x04034b50);
        put16(&b, 20), put16(&b, 0), put16(&b, 0), put16(&b, 0), put16(&b, 0x21);
        put32(&b, crc), put32(&b, (uint32_t)m[i].n), put32(&b, (uint32_t)m[i].n);
        put16(&b, nl), put16(&b, 0);
        put(&b, names[i], nl);
        put(&b, m[i].p, m[i].n);
        put32(&cd, 0x02014b50);
        put16(&cd, 20), put16(&cd, 20), put16(&cd, 0), put16(&cd, 0), put16(&cd, 0);
        put16(&cd, 0x21);
        put32(&cd, crc), put32(&cd, (uint32_t)m[i].n), put32(&cd, (uint32_t)m[i].n);
        put16(&cd, nl), put16(&cd, 0), put16(&cd, 0), put16(&cd, 0), put16(&cd, 0);
        put32(&cd, 0), put32(&cd, off);
        put(&cd, names[i], nl);
    }
    uint32_t cd_off = (uint32_t)b.n;
    put(&b, cd.p, cd.n);
    put32(&b, 0x06054b50);
    put16(&b, 0), put16(&b, 0), put16(&b, (uint32_t)nm), put16(&b, (uint32_t)nm);
    put32(&b, (uint32_t)cd.n), put32(&b, cd_off), put16(&b, 0);
    write_bytes(path_of(name), b.p, b.n);
    free(b.p);
    free(cd.p);
}

static void test_npy_pairs(void)
{
    /* uint8 images (n, 4, 5) and labels of two dtypes and shapes. */
    make_dir("npy");
    enum { NTR = 7, NTE = 3, D = 20 };
    uint8_t x[(NTR + NTE) * D], y[NTR + NTE];
    pixels_of(x, sizeof x, 1);
    for (int i = 0; i < NTR + NTE; i++)
        y[i] = (uint8_t)(i * 3 % 10);
    int64_t yte[NTE];
    for (int i = 0; i < NTE; i++)
        yte[i] = y[NTR + i];
    write_npy("npy/x_train.npy", "|u1", "(7, 4, 5)", x, NTR * D);
    write_npy("npy/y_train.npy", "|u1", "(7,)", y, NTR);
    write_npy("npy/x_test.npy", "|u1", "(3, 4, 5)", x + NTR * D, NTE * D);
    write_npy("npy/y_test.npy", "<i8", "(3, 1)", yte, sizeof yte);
    dp_data_files f = find_ok(path_of("npy"), NULL);
    CHECK(f.format == DP_DATA_NPY);
    REQUIRE(f.train.n == 1 && f.test.n == 1);
    CHECK(strstr(f.train.files[0].path, "x_train.npy") &&
          strstr(f.train.files[0].labels_path, "y_train.npy") && !f.train.files[0].member);
    CHECK(strstr(f.test.files[0].path, "x_test.npy") &&
          strstr(f.test.files[0].labels_path, "y_test.npy"));
    count_ok(&f, NULL);
    CHECK(f.shape.kind == DP_VALUES_U8 && f.shape.rows == 4 && f.shape.cols == 5 &&
          f.shape.channels == 1 && f.shape.dim == D);
    CHECK(f.train.records == NTR && f.test.records == NTE);
    CHECK(read_all(&f, &f.train.files[0], NULL, x, y) == NTR);
    CHECK(read_all(&f, &f.test.files[0], NULL, x + NTR * D, y + NTR) == NTE);
    skip_then_read(&f, &f.train.files[0], NULL, 4, x, y);
    dp_data_files_free(&f);

    /* float32 rows (n, 30) over more than one 256 KiB chunk, labels int32;
     * a label of 10 at record 2500 (in the second chunk) and one at record
     * 5 (in the first) are refused naming their own record. */
    make_dir("npyf");
    enum { NF = 3000, DF = 30 };
    float *xf = malloc(sizeof(float) * NF * DF);
    int32_t *yf = malloc(sizeof(int32_t) * NF);
    uint8_t *yl = malloc(NF);
    REQUIRE(xf && yf && yl);
    for (int i = 0; i < NF * DF; i++)
        xf[i] = (float)(i % 977) * 0.125f - 17.0f;
    for (int i = 0; i < NF; i++)
        yl[i] = (uint8_t)(yf[i] = i % 10);
    write_npy("npyf/features_train.npy", "<f4", "(3000, 30)", xf, sizeof(float) * NF * DF);
    write_npy("npyf/labels_train.npy", "<i4", "(3000,)", yf, sizeof(int32_t) * NF);
    write_npy("npyf/features_test.npy", "<f4", "(2, 30)", xf, sizeof(float) * 2 * DF);
    write_npy("npyf/labels_test.npy", "<i4", "(2,)", yf, sizeof(int32_t) * 2);
    dp_data_options o10;
    dp_data_options_default(&o10);
    o10.classes = 10;
    f = find_ok(path_of("npyf"), &o10);
    count_ok(&f, &o10);
    CHECK(f.shape.kind == DP_VALUES_F32 && f.shape.rows == 1 && f.shape.cols == DF &&
          f.shape.dim == DF && f.train.records == NF && f.test.records == 2);
    CHECK(read_all(&f, &f.train.files[0], &o10, xf, yl) == NF);
    skip_then_read(&f, &f.train.files[0], &o10, 2700, xf, yl);
    yf[2500] = 10;
    write_npy("npyf/labels_train.npy", "<i4", "(3000,)", yf, sizeof(int32_t) * NF);
    read_fails_at(&f, &f.train.files[0], &o10, 2500, "label 10 at row 2500");
    yf[5] = 10;
    write_npy("npyf/labels_train.npy", "<i4", "(3000,)", yf, sizeof(int32_t) * NF);
    read_fails_at(&f, &f.train.files[0], &o10, 5, "labels_train.npy");
    /* A NaN feature at record 2600 names the features' file. */
    yf[5] = 5, yf[2500] = 0;
    write_npy("npyf/labels_train.npy", "<i4", "(3000,)", yf, sizeof(int32_t) * NF);
    xf[2600 * DF + 3] = NAN;
    write_npy("npyf/features_train.npy", "<f4", "(3000, 30)", xf, sizeof(float) * NF * DF);
    read_fails_at(&f, &f.train.files[0], &o10, 2600, "features_train.npy: record 2600");
    dp_data_files_free(&f);
    free(xf);
    free(yf);
    free(yl);

    /* Rows wider than the chunk buffer are read straight into the caller's. */
    make_dir("npyw");
    enum { DW = 70000 };
    float *xw = malloc(sizeof(float) * 3 * DW);
    REQUIRE(xw);
    for (int i = 0; i < 3 * DW; i++)
        xw[i] = (float)i;
    uint8_t yw[3] = {1, 0, 1};
    write_npy("npyw/x_train.npy", "<f4", "(2, 70000)", xw, sizeof(float) * 2 * DW);
    write_npy("npyw/y_train.npy", "|u1", "(2,)", yw, 2);
    write_npy("npyw/x_test.npy", "<f4", "(1, 70000)", xw + 2 * DW, sizeof(float) * DW);
    write_npy("npyw/y_test.npy", "|u1", "(1,)", yw + 2, 1);
    f = find_ok(path_of("npyw"), NULL);
    count_ok(&f, NULL);
    CHECK(f.shape.dim == DW && f.train.records == 2 && f.test.records == 1);
    CHECK(read_all(&f, &f.train.files[0], NULL, xw, yw) == 2);
    CHECK(read_all(&f, &f.test.files[0], NULL, xw + 2 * DW, yw + 2) == 1);
    dp_data_files_free(&f);
    free(xw);

    /* A pair of unequal rows is refused naming both files; so is a split of
     * three files and a pair with no labels' name. */
    make_dir("npyodd");
    write_npy("npyodd/x_train.npy", "|u1", "(7, 4, 5)", x, NTR * D);
    write_npy("npyodd/y_train.npy", "|u1", "(6,)", y, 6);
    write_npy("npyodd/x_test.npy", "|u1", "(3, 4, 5)", x, NTE * D);
    write_npy("npyodd/y_test.npy", "|u1", "(3,)", y, NTE);
    f = find_ok(path_of("npyodd"), NULL);
    dp_err err;
    CHECK(dp_data_files_count(&f, NULL, &err) == -1);
    CHECKF(strstr(err.msg, "x_train.npy has 7 rows") && strstr(err.msg, "y_train.npy has 6"),
           "%s", err.msg);
    fprintf(stderr, "refused as it should be: %s\n", err.msg);
    dp_data_files_free(&f);
    write_npy("npyodd/z_test.npy", "|u1", "(3,)", y, NTE);
    find_fails(path_of("npyodd"), NULL, "3 .npy files", "test");
    make_dir("npynolabel");
    write_npy("npynolabel/a_train.npy", "|u1", "(3,)", y, 3);
    write_npy("npynolabel/b_train.npy", "|u1", "(3,)", y, 3);
    write_npy("npynolabel/x_test.npy", "|u1", "(3,)", y, 3);
    write_npy("npynolabel/y_test.npy", "|u1", "(3,)", y, 3);
    find_fails(path_of("npynolabel"), NULL, "b_train.npy", "cannot tell which holds the labels");
}

static void test_npz(void)
{
    /* keras's mnist.npz layout, images with 2 channels: (n, 3, 2, 2). */
    make_dir("npz");
    enum { NTR = 5, NTE = 2, D = 12 };
    uint8_t x[(NTR + NTE) * D], y[NTR + NTE];
    pixels_of(x, sizeof x, 9);
    for (int i = 0; i < NTR + NTE; i++)
        y[i] = (uint8_t)(9 - i);
    bytes m[4] = {npy_array("|u1", "(5, 3, 2, 2)", x, NTR * D), npy_array("|u1", "(5,)", y, NTR),
                  npy_array("|u1", "(2, 3, 2, 2)", x + NTR * D, NTE * D),
                  npy_array("|u1", "(2,)", y + NTR, NTE)};
    const char *names[4] = {"x_train.npy", "y_train.npy", "x_test.npy", "y_test.npy"};
    write_zip("npz/mnist.npz", names, m, 4);
    CHECK(dp_data_files_match(path_of("npz/mnist.npz")));
    dp_data_files f = find_ok(path_of("npz/mnist.npz"), NULL);
    REQUIRE(f.format == DP_DATA_NPY && f.train.n == 1 && f.test.n == 1);
    CHECK(strcmp(f.train.files[0].member, "x_train") == 0 &&
          strcmp(f.train.files[0].labels_member, "y_train") == 0 &&
          strcmp(f.test.files[0].member, "x_test") == 0 && !f.test.files[0].labels_path);
    count_ok(&f, NULL);
    CHECK(f.shape.kind == DP_VALUES_U8 && f.shape.rows == 3 && f.shape.cols == 2 &&
          f.shape.channels == 2 && f.shape.dim == D && f.train.records == NTR &&
          f.test.records == NTE);
    CHECK(read_all(&f, &f.train.files[0], NULL, x, y) == NTR);
    CHECK(read_all(&f, &f.test.files[0], NULL, x + NTR * D, y + NTR) == NTE);
    skip_then_read(&f, &f.train.files[0], NULL, 2, x, y);
    dp_data_files_free(&f);
    /* The directory holding it works too. */
    f = find_ok(path_of("npz"), NULL);
    CHECK(f.train.n == 1 && f.test.n == 1);
    dp_data_files_free(&f);
    /* An .npz without the test arrays is refused naming what it has. */
    write_zip("npz/half.npz", names, m, 2);
    find_fails(path_of("npz/half.npz"), NULL, "half.npz", "this one holds x_train, y_train");
    /* A label above the class count in an .npz member names the member. */
    dp_data_options o;
    dp_data_options_default(&o);
    o.classes = 6;
    f = find_ok(path_of("npz/mnist.npz"), &o);
    dp_err err;
    CHECK(dp_data_files_count(&f, &o, &err) == -1);
    CHECKF(strstr(err.msg, "mnist.npz (member y_train): record 0") && strstr(err.msg, "label 9"),
           "%s", err.msg);
    fprintf(stderr, "refused as it should be: %s\n", err.msg);
    dp_data_files_free(&f);
    for (int i = 0; i < 4; i++)
        free(m[i].p);
}

/* ---- CSV ---- */

static void test_csv(void)
{
    make_dir("csv");
    enum { NTR = 6, NTE = 4, DIM = 3 };
    float want[(NTR + NTE) * DIM];
    uint8_t labels[NTR + NTE];
    for (int i = 0; i < NTR + NTE; i++) {
        labels[i] = (uint8_t)((i * 5 + 1) % 10);
        for (int k = 0; k < DIM; k++)
            want[i * DIM + k] = (float)((i - 3) * 0.1 + k * 1e-7 + (k == 1 ? 1e20 : 0));
    }
    /* Training: a header (quoted names), the label column in the middle, a
     * byte-order mark, CRLF and a blank line. */
    char text[4096];
    size_t at = (size_t)snprintf(text, sizeof text, "\xef\xbb\xbf\"pixel, 0\",label,p1,p2\r\n");
    for (int i = 0; i < NTR; i++) {
        const float *v = want + i * DIM;
        at += (size_t)snprintf(text + at, sizeof text - at, "%.9g, %u ,%.9g,%.9g\r\n%s", v[0],
                               labels[i], v[1], v[2], i == 2 ? "\r\n" : "");
    }
    write_bytes(path_of("csv/mnist_train.csv"), text, at);
    /* Test: no header, the label first (3.0 is an integer label). */
    at = 0;
    for (int i = NTR; i < NTR + NTE; i++) {
        const float *v = want + i * DIM;
        at += (size_t)snprintf(text + at, sizeof text - at, "%u%s,%.9g,%.9g,%.9g\n", labels[i],
                               i == NTR ? ".0" : "", v[0], v[1], v[2]);
    }
    write_bytes(path_of("csv/mnist_test.csv"), text, at);
    dp_data_options opt;
    dp_data_options_default(&opt);
    opt.classes = 10;
    dp_data_files f = find_ok(path_of("csv"), &opt);
    CHECK(f.format == DP_DATA_CSV && f.train.n == 1 && f.test.n == 1);
    count_ok(&f, &opt);
    CHECK(f.shape.kind == DP_VALUES_F32 && f.shape.rows == 1 && f.shape.cols == DIM &&
          f.shape.channels == 1 && f.shape.dim == DIM);
    CHECK(f.train.records == NTR && f.test.records == NTE);
    CHECK(read_all(&f, &f.train.files[0], &opt, want, labels) == NTR);
    CHECK(read_all(&f, &f.test.files[0], &opt, want + NTR * DIM, labels + NTR) == NTE);
    skip_then_read(&f, &f.train.files[0], &opt, 4, want, labels);
    dp_data_files_free(&f);

    /* A label column by name ("p2" here) needs the header. */
    opt.label = "p2";
    f = find_ok(path_of("csv"), &opt);
    dp_err err;
    CHECK(dp_data_files_count(&f, &opt, &err) == -1);
    CHECKF(strstr(err.msg, "mnist_train.csv: record 0: line 2, column 4 (p2)"), "%s", err.msg);
    dp_data_files_free(&f);
    opt.label = NULL;

    /* A label not below the class count in record 4 (line 6 with the header). */
    make_dir("csvbad");
    at = (size_t)snprintf(text, sizeof text, "label,a,b\n");
    for (int i = 0; i < 6; i++)
        at += (size_t)snprintf(text + at, sizeof text - at, "%d,1,2\n", i == 4 ? 10 : i);
    write_bytes(path_of("csvbad/train.csv"), text, at);
    write_bytes(path_of("csvbad/test.csv"), "label,a,b\n1,2,3\n", 16);
    f = find_ok(path_of("csvbad"), &opt);
    CHECK(dp_data_files_count(&f, &opt, &err) == -1);
    CHECKF(strstr(err.msg, "csvbad/train.csv: record 4: line 6") && strstr(err.msg, "label 10"),
           "%s", err.msg);
    fprintf(stderr, "refused as it should be: %s\n", err.msg);
    f.shape = (dp_record_shape){DP_VALUES_F32, 1, 2, 1, 2};
    read_fails_at(&f, &f.train.files[0], &opt, 4, "line 6");
    dp_data_files_free(&f);

    /* A test file of other columns is refused at its record 0. */
    write_bytes(path_of("csvbad/train.csv"), "label,a,b\n1,2,3\n", 16);
    write_bytes(path_of("csvbad/test.csv"), "label,a,b,c\n1,2,3,4\n", 20);
    f = find_ok(path_of("csvbad"), &opt);
    CHECK(dp_data_files_count(&f, &opt, &err) == -1);
    CHECKF(strstr(err.msg, "csvbad/test.csv: record 0: 3 feature columns, the dataset's first "
                  "record has 2"), "%s", err.msg);
    fprintf(stderr, "refused as it should be: %s\n", err.msg);
    dp_data_files_free(&f);
}

/* ---- refusals ---- */

static void test_refusals(void)
{
    uint8_t labels[16];
    for (int i = 0; i < 16; i++)
        labels[i] = (uint8_t)(i % 10);
    dp_data_options opt;
    dp_data_options_default(&opt);
    opt.classes = 10;

    make_dir("mixed");
    write_png_file(path_of("mixed/a-train.tfrecord"), 0, 2, 4, 4, 1, labels, 99, 0, 0);
    write_bytes(path_of("mixed/a-test.csv"), "label,x\n1,2\n", 12);
    find_fails(path_of("mixed"), &opt, "formats may not be mixed", "a-test.csv");

    make_dir("notest");
    write_png_file(path_of("notest/a-train.tfrecord-0"), 0, 2, 4, 4, 1, labels, 99, 0, 0);
    write_png_file(path_of("notest/a-train.tfrecord-1"), 0, 2, 4, 4, 1, labels, 99, 0, 0);
    find_fails(path_of("notest"), &opt, "no test file", "*test*");

    make_dir("both");
    write_png_file(path_of("both/a-train.tfrecord"), 0, 2, 4, 4, 1, labels, 99, 0, 0);
    write_png_file(path_of("both/train-test.tfrecord"), 0, 2, 4, 4, 1, labels, 99, 0, 0);
    find_fails(path_of("both"), &opt, "train-test.tfrecord", "matches both");

    make_dir("neither");
    write_png_file(path_of("neither/a-train.tfrecord"), 0, 2, 4, 4, 1, labels, 99, 0, 0);
    write_png_file(path_of("neither/a-test.tfrecord"), 0, 2, 4, 4, 1, labels, 99, 0, 0);
    write_png_file(path_of("neither/a-val.tfrecord"), 0, 2, 4, 4, 1, labels, 99, 0, 0);
    find_fails(path_of("neither"), &opt, "a-val.tfrecord", "matches neither");

    find_fails(path_of("no-such-dir"), &opt, "no-such-dir", NULL);
    char spec[1200];
    snprintf(spec, sizeof spec, "%s/*.nothing", scratch);
    find_fails(spec, &opt, "no file matches", NULL);
    find_fails(path_of("png/README.txt"), &opt, "not a file of a known format", NULL);

    /* A PNG of another size in record 3: counting reads only each file's
     * first record whole, reading finds it. */
    make_dir("size");
    write_png_file(path_of("size/a-train.tfrecord"), 0, 6, 4, 4, 1, labels, 3, 5, 4);
    write_png_file(path_of("size/a-test.tfrecord"), 0, 2, 4, 4, 1, labels, 99, 0, 0);
    dp_data_files f = find_ok(path_of("size"), &opt);
    count_ok(&f, &opt);
    read_fails_at(&f, &f.train.files[0], &opt, 3, "PNG of 4x5 pixels, the dataset's first record has 4x4");
    dp_data_files_free(&f);

    /* A label not below the class count in record 2. */
    make_dir("label");
    labels[2] = 12;
    write_png_file(path_of("label/a-train.tfrecord"), 0, 4, 4, 4, 1, labels, 99, 0, 0);
    labels[2] = 2;
    write_png_file(path_of("label/a-test.tfrecord"), 0, 2, 4, 4, 1, labels, 99, 0, 0);
    f = find_ok(path_of("label"), &opt);
    count_ok(&f, &opt);
    read_fails_at(&f, &f.train.files[0], &opt, 2, "label 12 is not in [0, 10)");
    dp_data_files_free(&f);

    /* A flipped byte inside record 1's data: the CRC refuses it, when
     * counting (no Example decoded) and when reading. */
    make_dir("flip");
    write_png_file(path_of("flip/a-train.tfrecord"), 0, 3, 4, 4, 1, labels, 99, 0, 0);
    write_png_file(path_of("flip/a-test.tfrecord"), 0, 2, 4, 4, 1, labels, 99, 0, 0);
    size_t n;
    uint8_t *raw = read_bytes(path_of("flip/a-train.tfrecord"), &n);
    uint64_t len0 = 0;
    memcpy(&len0, raw, 8); /* little-endian machine, as the format */
    size_t at = 12 + (size_t)len0 + 4 + 12 + 5; /* into record 1's data */
    REQUIRE(at < n);
    raw[at] ^= 0x10;
    write_bytes(path_of("flip/a-train.tfrecord"), raw, n);
    free(raw);
    f = find_ok(path_of("flip"), &opt);
    dp_err err;
    CHECK(dp_data_files_count(&f, &opt, &err) == -1);
    CHECKF(strstr(err.msg, "flip/a-train.tfrecord") && strstr(err.msg, "record 1") &&
           strstr(err.msg, "CRC"), "%s", err.msg);
    fprintf(stderr, "refused as it should be: %s\n", err.msg);
    dp_record_shape s = {DP_VALUES_U8, 4, 4, 1, 16};
    f.shape = s;
    read_fails_at(&f, &f.train.files[0], &opt, 1, "CRC");
    dp_data_files_free(&f);

    /* The options and the shape are checked before a file is read. */
    dp_record_reader *r;
    dp_data_file df = {(char *)path_of("flip/a-test.tfrecord"), NULL, NULL, NULL, 0, 0};
    dp_data_options bad = opt;
    bad.classes = 1;
    CHECK(dp_record_open(&r, &df, DP_DATA_TFRECORD, &s, &bad, &err) == -1 && r == NULL &&
          strstr(err.msg, "class count 1"));
    dp_record_shape zero = {DP_VALUES_U8, 0, 0, 0, 0};
    CHECK(dp_record_open(&r, &df, DP_DATA_TFRECORD, &zero, &opt, &err) == -1 && r == NULL);
}

static void test_match(void)
{
    CHECK(!dp_data_files_match(path_of("no-such")));
    CHECK(!dp_data_files_match(""));
    CHECK(!dp_data_files_match("mnist"));
    CHECK(dp_data_files_match("data/*.tfrecord"));
    make_dir("idx");
    write_bytes(path_of("idx/train-images-idx3-ubyte.gz"), "x", 1);
    write_bytes(path_of("idx/extra.csv"), "1,2\n", 4);
    CHECK(!dp_data_files_match(path_of("idx")));
    make_dir("none");
    write_bytes(path_of("none/a.txt"), "x", 1);
    write_bytes(path_of("none/.b.csv"), "x", 1);
    CHECK(!dp_data_files_match(path_of("none")));
    CHECK(!dp_data_files_match(path_of("none/a.txt")));
    CHECK(strcmp(dp_value_kind_name(DP_VALUES_F32), "float32") == 0 &&
          dp_value_size(DP_VALUES_F32) == 4 && dp_value_size(DP_VALUES_U8) == 1);
}

int main(void)
{
    scratch_make(scratch, sizeof scratch, "test_records");
    test_tfrecord_png();
    test_tfrecord_lists();
    test_npy_pairs();
    test_npz();
    test_csv();
    test_refusals();
    test_match();
    int rc = CHECK_DONE();
    if (rc == 0)
        scratch_remove(scratch);
    return rc;
}
