/* downpour data convert and downpour data inspect, run as a user would
 * (docs/datasets.md, "Converting and inspecting").
 *
 * MNIST is converted to 8 training shards and 1 test shard of PNG images,
 * as TensorFlow Datasets lays it out; the shards are read back in name order
 * with the library's own readers (tfrecord.h, example.h, png.h), and every
 * record must be exactly the IDX image and label at its place.  Under ASan a
 * slice (--limit) is converted instead.  Then raw encoding, gzip, NumPy
 * sources (.npy files written here byte by byte, and an .npz built around
 * them), the refusals (--shards 0, more shards than records, files already
 * there without --force, an output path under a file, a missing source),
 * --force replacing an older set, and inspect on shards, a damaged shard,
 * NumPy and CSV files. */
#include <dirent.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "downpour/dataset.h"
#include "downpour/example.h"
#include "downpour/png.h"
#include "downpour/tfrecord.h"
#include "proc.h"
#include "zip_stored.h"

static const char *bin;
static char out_text[1 << 16];
static char err_text[1 << 16];

/* Runs `downpour ARGS`; stdout lands in out_text, stderr in err_text. */
static int data_cmd(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int data_cmd(const char *fmt, ...)
{
    char args[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    int rc = run_cmd(err_text, sizeof err_text, "'%s' %s", bin, args);
    char path[1200];
    snprintf(path, sizeof path, "%s/stdout.txt", test_tmp());
    size_t n = 0;
    char *s = slurp(path, &n);
    snprintf(out_text, sizeof out_text, "%s", s ? s : "");
    free(s);
    return rc;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Files in dir (not . and ..). */
static int count_files(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

/* What a split of the source holds, to compare the shards against. */
typedef struct expect {
    const uint8_t *images; /* n x (h*w*c) bytes, or NULL for floats */
    const float *values;   /* n x dim floats */
    const int64_t *labels64;
    const uint8_t *labels8;
    uint64_t n;
    uint32_t h, w, c;
    size_t dim;
    int raw; /* images as raw bytes with height and width features */
} expect;

static int64_t expect_label(const expect *x, uint64_t i)
{
    return x->labels8 ? x->labels8[i] : x->labels64[i];
}

/* Reads shards dir/prefix-00000-of-N... in name order and checks every
 * record against x: the counts, the order, each image and label. */
static void check_shards(const char *dir, const char *prefix, int shards, const char *suffix,
                         const expect *x)
{
    dp_example *ex = dp_example_new();
    REQUIRE(ex);
    uint8_t *pix = malloc(x->dim ? x->dim : 1);
    REQUIRE(pix);
    uint64_t idx = 0, bad = 0;
    for (int s = 0; s < shards; s++) {
        char path[1400];
        snprintf(path, sizeof path, "%s/%s-%05d-of-%05d%s", dir, prefix, s, shards, suffix);
        dp_tfrecord_reader *r;
        dp_err err;
        if (dp_tfrecord_open(&r, path, NULL, &err) < 0) {
            CHECKF(0, "%s", err.msg);
            continue;
        }
        CHECKF(dp_tfrecord_is_gzip(r) == (suffix[0] != '\0'), "%s: gzip %d", path,
               dp_tfrecord_is_gzip(r));
        uint64_t first = idx;
        const uint8_t *rec;
        size_t len;
        int got;
        while ((got = dp_tfrecord_next(r, &rec, &len, &err)) == 1) {
            if (idx >= x->n) {
                idx++;
                continue;
            }
            int ok = dp_example_decode(ex, rec, len, &err) == 0;
            const dp_feature *im = ok ? dp_example_find(ex, DP_EXAMPLE_IMAGE) : NULL;
            const dp_feature *lb = ok ? dp_example_find(ex, DP_EXAMPLE_LABEL) : NULL;
            ok = ok && im && lb && lb->kind == DP_FEATURE_INT64 && lb->count == 1 &&
                 lb->int64s[0] == expect_label(x, idx);
            if (ok && !x->images) {
                ok = im->kind == DP_FEATURE_FLOAT && im->count == x->dim &&
                     memcmp(im->floats, x->values + idx * x->dim, x->dim * sizeof(float)) == 0;
            } else if (ok && x->raw) {
                const dp_feature *h = dp_example_find(ex, "height"),
                                 *w = dp_example_find(ex, "width");
                ok = im->kind == DP_FEATURE_BYTES && im->count == 1 &&
                     im->bytes[0].len == x->dim &&
                     memcmp(im->bytes[0].data, x->images + idx * x->dim, x->dim) == 0 && h &&
                     w && h->count == 1 && w->count == 1 && h->int64s[0] == x->h &&
                     w->int64s[0] == x->w;
            } else if (ok) {
                ok = im->kind == DP_FEATURE_BYTES && im->count == 1 &&
                     dp_png_decode(pix, im->bytes[0].data, im->bytes[0].len, x->h, x->w,
                                   (int)x->c, &err) == 0 &&
                     memcmp(pix, x->images + idx * x->dim, x->dim) == 0;
            }
            if (!ok && bad++ < 5)
                CHECKF(0, "%s: record %llu (source record %llu) differs from the source",
                       path, (unsigned long long)(idx - first), (unsigned long long)idx);
            idx++;
        }
        CHECKF(got == 0, "%s: %s", path, err.msg);
        /* contiguous blocks: shard s holds [s*n/N, (s+1)*n/N) */
        uint64_t want = x->n * (uint64_t)(s + 1) / (uint64_t)shards - x->n * (uint64_t)s / (uint64_t)shards;
        CHECKF(idx - first == want, "%s: %llu records, want %llu", path,
               (unsigned long long)(idx - first), (unsigned long long)want);
        dp_tfrecord_close(r);
    }
    CHECKF(idx == x->n, "%s: %llu records in all, want %llu", prefix, (unsigned long long)idx,
           (unsigned long long)x->n);
    CHECKF(bad == 0, "%s: %llu records differ", prefix, (unsigned long long)bad);
    free(pix);
    dp_example_free(ex);
}

static void test_help_and_usage(void)
{
    CHECK(data_cmd("data --help") == 0 && strstr(out_text, "convert") && strstr(out_text, "inspect"));
    CHECK(data_cmd("data convert --help") == 0 && strstr(out_text, "--shards N") &&
          strstr(out_text, "--limit N") && strstr(out_text, "--gzip"));
    CHECK(data_cmd("data inspect --help") == 0 && strstr(out_text, "--records N"));
    CHECK(data_cmd("--help") == 0 && strstr(out_text, "data "));
    CHECK(data_cmd("data") == 2);
    CHECK(data_cmd("data frobnicate") == 2 && strstr(err_text, "unknown subcommand 'frobnicate'"));
    CHECK(data_cmd("data convert --to x") == 2 && strstr(err_text, "--from SRC is required"));
    CHECK(data_cmd("data convert --from mnist --to x --encoding jpeg") == 2 &&
          strstr(err_text, "--encoding 'jpeg'"));
    CHECK(data_cmd("data convert --from mnist --to x --name a/b") == 2 &&
          strstr(err_text, "--name 'a/b'"));
    CHECK(data_cmd("data inspect") == 2 && strstr(err_text, "FILE is required"));
    CHECK(data_cmd("data inspect a b") == 2 && strstr(err_text, "unexpected argument 'b'"));
}

/* MNIST: 8 PNG training shards and 1 test shard, then inspect, raw, gzip,
 * the refusals and --force. */
static void test_mnist(void)
{
    dp_dataset ds;
    dp_err err;
    memset(&ds, 0, sizeof ds);
    REQUIRE(dp_dataset_open(&ds, "mnist", &err) == 0);
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/mnist-tfds", test_tmp());
    /* under ASan a slice: the same code at a tenth of the records */
    uint64_t n_train = SANITIZED ? 6000 : ds.train_all.n, n_test = SANITIZED ? 1000 : ds.test.n;
    const char *limit = SANITIZED ? "--limit 6000" : "";
    int rc = data_cmd("data convert --from mnist --to '%s' --shards 8 %s", dir, limit);
    CHECKF(rc == 0, "convert: exit %d: %s", rc, err_text);
    fprintf(stderr, "%s", out_text);
    char want[200];
    snprintf(want, sizeof want, "train: %llu records in 8 shards", (unsigned long long)n_train);
    CHECKF(strstr(out_text, want), "summary lacks '%s': %s", want, out_text);
    CHECK(strstr(out_text, "records/s") != NULL);
    CHECKF(count_files(dir) == 9, "%s holds %d files, want 8 + 1", dir, count_files(dir));
    char path[1400];
    for (int s = 0; s < 8; s++) {
        snprintf(path, sizeof path, "%s/mnist-train.tfrecord-%05d-of-00008", dir, s);
        CHECKF(exists(path), "%s missing", path);
    }
    expect x = {ds.train_all.images, NULL, NULL, ds.train_all.labels, n_train, 28, 28, 1, 784, 0};
    check_shards(dir, "mnist-train.tfrecord", 8, "", &x);
    if (SANITIZED) /* --limit applies to both splits */
        n_test = n_train < ds.test.n ? n_train : ds.test.n;
    expect t = {ds.test.images, NULL, NULL, ds.test.labels, n_test, 28, 28, 1, 784, 0};
    check_shards(dir, "mnist-test.tfrecord", 1, "", &t);

    /* inspect: the count (every record read) and the PNG shape */
    snprintf(path, sizeof path, "%s/mnist-train.tfrecord-00003-of-00008", dir);
    rc = data_cmd("data inspect '%s' --records 2", path);
    snprintf(want, sizeof want, ": %llu records (TFRecord, raw)",
             (unsigned long long)(n_train * 4 / 8 - n_train * 3 / 8));
    CHECKF(rc == 0 && strstr(out_text, want) && strstr(out_text, "PNG 28x28, 1 channel(s), 8-bit") &&
           strstr(out_text, "record 1 (") && !strstr(out_text, "record 2 (") &&
           strstr(out_text, "every record has: image bytes_list[1] PNG 28x28, 1 channel(s), "
                            "8-bit; label int64_list[1]"),
           "inspect: exit %d, want '%s': %s%s", rc, want, out_text, err_text);
    fprintf(stderr, "%s", out_text);

    /* a damaged shard: the reader's message, naming the file and the record */
    size_t len;
    char *shard = slurp(path, &len);
    REQUIRE(shard && len > 1000);
    shard[len / 2] ^= 0x40;
    char bad[1400];
    snprintf(bad, sizeof bad, "%s/damaged.tfrecord", test_tmp());
    FILE *f = fopen(bad, "wb");
    REQUIRE(f && fwrite(shard, 1, len, f) == len && fclose(f) == 0);
    free(shard);
    rc = data_cmd("data inspect '%s'", bad);
    CHECKF(rc == 1 && strstr(err_text, "damaged.tfrecord: record ") && strstr(err_text, "CRC"),
           "damaged: exit %d: %s", rc, err_text);
    fprintf(stderr, "damaged: %s", err_text);

    /* raw bytes with height and width, on a slice, 3 shards */
    rc = data_cmd("data convert --from mnist --to '%s' --name raw --encoding raw --shards 3 "
                  "--limit 100", dir);
    CHECKF(rc == 0, "raw: exit %d: %s", rc, err_text);
    expect xr = x;
    xr.n = 100;
    xr.raw = 1;
    check_shards(dir, "raw-train.tfrecord", 3, "", &xr);

    /* gzip: ".gz" names, gzip content */
    rc = data_cmd("data convert --from mnist --to '%s' --name gz --gzip --shards 2 --limit 50",
                  dir);
    CHECKF(rc == 0, "gzip: exit %d: %s", rc, err_text);
    expect xg = x;
    xg.n = 50;
    check_shards(dir, "gz-train.tfrecord", 2, ".gz", &xg);
    snprintf(path, sizeof path, "%s/gz-test.tfrecord-00000-of-00001.gz", dir);
    CHECK(exists(path));

    /* refusals */
    rc = data_cmd("data convert --from mnist --to '%s/zero' --shards 0", dir);
    CHECKF(rc != 0 && strstr(err_text, "--shards: 0 is out of range"), "--shards 0: %d %s", rc,
           err_text);
    rc = data_cmd("data convert --from mnist --to '%s' --name few --shards 6 --limit 5", dir);
    CHECKF(rc == 1 && strstr(err_text, "--shards 6 is more than the 5 train records"),
           "too many shards: %d %s", rc, err_text);
    rc = data_cmd("data convert --from mnist --to '%s' --name gz --shards 2 --limit 50", dir);
    CHECKF(rc == 1 && strstr(err_text, "/gz-") && strstr(err_text, "exists") &&
           strstr(err_text, "--force"), "existing: %d %s", rc, err_text);
    snprintf(path, sizeof path, "%s/gz-train.tfrecord-00001-of-00002.gz", dir);
    CHECK(exists(path)); /* untouched */
    snprintf(path, sizeof path, "%s/mnist-train.tfrecord-00000-of-00008", dir);
    rc = data_cmd("data convert --from mnist --to '%s/sub' --limit 10", path);
    CHECKF(rc == 1 && strstr(err_text, "is a file, not a directory"), "unwritable: %d %s", rc,
           err_text);
    rc = data_cmd("data convert --from '%s/no-such-data' --to '%s/none'", test_tmp(), dir);
    CHECKF(rc == 1 && strstr(err_text, "no-such-data"), "missing source: %d %s", rc, err_text);

    /* --force: the new set replaces the old, and old shards it did not
     * overwrite go (a reader of the directory sees one set) */
    rc = data_cmd("data convert --from mnist --to '%s' --name gz --gzip --force --limit 30", dir);
    CHECKF(rc == 0 && strstr(out_text, "removed 2 old gz-*.tfrecord* file(s)"), "force: %d %s %s",
           rc, out_text, err_text);
    snprintf(path, sizeof path, "%s/gz-train.tfrecord-00001-of-00002.gz", dir);
    CHECK(!exists(path));
    expect xf = x;
    xf.n = 30;
    check_shards(dir, "gz-train.tfrecord", 1, ".gz", &xf);
    dp_dataset_close(&ds);
}

/* ---- NumPy sources, written here ---- */

static size_t npy_bytes(uint8_t *out, const char *descr, const char *shape, const void *data,
                        size_t n)
{
    char dict[256];
    int hl = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                      descr, shape);
    size_t total = (10 + (size_t)hl + 1 + 63) / 64 * 64, pos = 10;
    memcpy(out, "\x93NUMPY\x01\x00", 8);
    out[8] = (uint8_t)((total - 10) & 0xff);
    out[9] = (uint8_t)((total - 10) >> 8);
    memcpy(out + pos, dict, (size_t)hl);
    pos += (size_t)hl;
    while (pos < total - 1)
        out[pos++] = ' ';
    out[pos++] = '\n';
    memcpy(out + pos, data, n);
    return pos + n;
}

static void write_file(const char *dir, const char *name, const uint8_t *p, size_t n)
{
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fwrite(p, 1, n, f) == n && fclose(f) == 0);
}

static void test_numpy(void)
{
    enum { NTR = 10, NTE = 3, H = 4, W = 5 };
    uint8_t xtr[NTR * H * W], xte[NTE * H * W];
    int64_t ytr[NTR], yte[NTE];
    for (int i = 0; i < NTR * H * W; i++)
        xtr[i] = (uint8_t)(i * 7 + 3);
    for (int i = 0; i < NTE * H * W; i++)
        xte[i] = (uint8_t)(255 - i);
    for (int i = 0; i < NTR; i++)
        ytr[i] = (i * 3) % 10;
    for (int i = 0; i < NTE; i++)
        yte[i] = 9 - i;
    static uint8_t files[4][1024];
    size_t lens[4];
    lens[0] = npy_bytes(files[0], "|u1", "(10, 4, 5)", xtr, sizeof xtr);
    lens[1] = npy_bytes(files[1], "<i8", "(10,)", ytr, sizeof ytr);
    lens[2] = npy_bytes(files[2], "|u1", "(3, 4, 5)", xte, sizeof xte);
    lens[3] = npy_bytes(files[3], "<i8", "(3,)", yte, sizeof yte);
    static const char *const names[4] = {"x_train.npy", "y_train.npy", "x_test.npy", "y_test.npy"};
    char src[1200], dir[1200];
    snprintf(src, sizeof src, "%s/digits", test_tmp());
    snprintf(dir, sizeof dir, "%s/npy-out", test_tmp());
    REQUIRE(mkdir(src, 0755) == 0);
    for (int i = 0; i < 4; i++)
        write_file(src, names[i], files[i], lens[i]);

    /* a directory of .npy files: NAME defaults to its base name */
    int rc = data_cmd("data convert --from '%s/' --to '%s' --shards 2", src, dir);
    CHECKF(rc == 0, "npy dir: exit %d: %s", rc, err_text);
    expect x = {xtr, NULL, ytr, NULL, NTR, H, W, 1, H * W, 0};
    check_shards(dir, "digits-train.tfrecord", 2, "", &x);
    expect t = {xte, NULL, yte, NULL, NTE, H, W, 1, H * W, 0};
    check_shards(dir, "digits-test.tfrecord", 1, "", &t);

    /* an .npz of the same arrays (keras's mnist.npz layout) */
    bytes data[4];
    for (int i = 0; i < 4; i++)
        data[i] = (bytes){files[i], lens[i], lens[i]};
    bytes zip = zip_stored(names, data, 4);
    write_file(test_tmp(), "keras.npz", zip.p, zip.n);
    free(zip.p);
    rc = data_cmd("data convert --from '%s/keras.npz' --to '%s' --shards 3 --encoding raw",
                  test_tmp(), dir);
    CHECKF(rc == 0, "npz: exit %d: %s", rc, err_text);
    expect xr = x;
    xr.raw = 1;
    check_shards(dir, "keras-train.tfrecord", 3, "", &xr);

    /* float images become a float_list */
    float ftr[NTR * 3], fte[NTE * 3];
    for (int i = 0; i < NTR * 3; i++)
        ftr[i] = (float)i * 0.25f - 1.0f;
    for (int i = 0; i < NTE * 3; i++)
        fte[i] = (float)i * 0.5f;
    char fsrc[1200];
    snprintf(fsrc, sizeof fsrc, "%s/floats", test_tmp());
    REQUIRE(mkdir(fsrc, 0755) == 0);
    static uint8_t buf[1024];
    write_file(fsrc, "x_train.npy", buf, npy_bytes(buf, "<f4", "(10, 3)", ftr, sizeof ftr));
    write_file(fsrc, "x_test.npy", buf, npy_bytes(buf, "<f4", "(3, 3)", fte, sizeof fte));
    write_file(fsrc, "y_train.npy", files[1], lens[1]);
    write_file(fsrc, "y_test.npy", files[3], lens[3]);
    rc = data_cmd("data convert --from '%s' --to '%s'", fsrc, dir);
    CHECKF(rc == 0 && strstr(out_text, "float_list"), "floats: exit %d: %s %s", rc, out_text,
           err_text);
    expect xf = {NULL, ftr, ytr, NULL, NTR, 1, 3, 1, 3, 0};
    check_shards(dir, "floats-train.tfrecord", 1, "", &xf);

    /* images and labels that do not pair up are refused */
    char bsrc[1200];
    snprintf(bsrc, sizeof bsrc, "%s/unpaired", test_tmp());
    REQUIRE(mkdir(bsrc, 0755) == 0);
    write_file(bsrc, "x_train.npy", files[0], lens[0]);
    write_file(bsrc, "y_train.npy", files[3], lens[3]); /* 3 labels for 10 images */
    write_file(bsrc, "x_test.npy", files[2], lens[2]);
    write_file(bsrc, "y_test.npy", files[3], lens[3]);
    rc = data_cmd("data convert --from '%s' --to '%s'", bsrc, dir);
    CHECKF(rc == 1 && strstr(err_text, "x_train.npy has 10 rows but y_train has 3"),
           "unpaired: %d %s", rc, err_text);

    /* five channels do not fit a PNG: refused before writing, raw takes them */
    uint8_t x5[NTR * 2 * 2 * 5];
    for (size_t i = 0; i < sizeof x5; i++)
        x5[i] = (uint8_t)(i ^ 0x5a);
    char csrc[1200];
    snprintf(csrc, sizeof csrc, "%s/chan5", test_tmp());
    REQUIRE(mkdir(csrc, 0755) == 0);
    write_file(csrc, "x_train.npy", buf, npy_bytes(buf, "|u1", "(10, 2, 2, 5)", x5, sizeof x5));
    write_file(csrc, "x_test.npy", buf, npy_bytes(buf, "|u1", "(3, 2, 2, 5)", x5, 3 * 20));
    write_file(csrc, "y_train.npy", files[1], lens[1]);
    write_file(csrc, "y_test.npy", files[3], lens[3]);
    rc = data_cmd("data convert --from '%s' --to '%s'", csrc, dir);
    CHECKF(rc == 1 && strstr(err_text, "2x2 with 5 channels do not fit a PNG") &&
           strstr(err_text, "--encoding raw"), "5 channels: %d %s", rc, err_text);
    rc = data_cmd("data convert --from '%s' --to '%s' --encoding raw", csrc, dir);
    CHECKF(rc == 0, "5 channels raw: %d %s", rc, err_text);
    expect x5r = {x5, NULL, ytr, NULL, NTR, 2, 2, 5, 20, 1};
    check_shards(dir, "chan5-train.tfrecord", 1, "", &x5r);
    rc = data_cmd("data inspect '%s/chan5-train.tfrecord-00000-of-00001' --records 1", dir);
    CHECKF(rc == 0 && strstr(out_text, "channels     int64_list 1 value: 5") &&
           strstr(out_text, "every record has: channels int64_list[1]; height int64_list[1]; "
                            "image bytes_list[1] of 20 bytes; label int64_list[1]; width "
                            "int64_list[1]"), "inspect raw: %d %s %s", rc, out_text, err_text);
    fprintf(stderr, "%s", out_text);

    /* inspect: .npy, .npz, CSV */
    rc = data_cmd("data inspect '%s/x_train.npy'", src);
    CHECKF(rc == 0 && strstr(out_text, "dtype uint8 ('|u1'), shape (10, 4, 5), fortran_order False"),
           "inspect npy: %d %s %s", rc, out_text, err_text);
    rc = data_cmd("data inspect '%s/keras.npz'", test_tmp());
    CHECKF(rc == 0 && strstr(out_text, "4 arrays") && strstr(out_text, "y_test") &&
           strstr(out_text, "int64 ('<i8'), shape (3,)"), "inspect npz: %d %s %s", rc, out_text,
           err_text);
    fprintf(stderr, "%s", out_text);
    const char *csv = "label,a,b\n1,0.5,2\n0,1,1\n7,3,3\n2,4,4\n";
    write_file(test_tmp(), "t.csv", (const uint8_t *)csv, strlen(csv));
    rc = data_cmd("data inspect '%s/t.csv'", test_tmp());
    CHECKF(rc == 0 && strstr(out_text, "3 columns") && strstr(out_text, "header: label, a, b") &&
           strstr(out_text, "label column: 1 (label)") && strstr(out_text, "rows: 4, labels 0..7"),
           "inspect csv: %d %s %s", rc, out_text, err_text);
    fprintf(stderr, "%s", out_text);
}

int main(void)
{
    bin = test_bin();
    REQUIRE(bin && test_tmp());
    test_help_and_usage();
    test_numpy();
    if (check_failures)
        return CHECK_DONE();
    require_mnist(); /* skips the rest (exit 77) without the data */
    test_mnist();
    return CHECK_DONE();
}
