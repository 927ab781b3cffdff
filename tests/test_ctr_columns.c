/* Named categorical and numeric columns (docs/datasets.md, "Categorical and
 * numeric columns"), through the dataset readers (records.h):
 *   - CSV columns and TFRecord Example features read as the categorical
 *     columns' ids (multi-valued cells padded with -1), then the numeric
 *     values, in the lists' orders, other columns passed over;
 *   - --hash-buckets: raw ids (integers and text) hashed by the documented
 *     hash, equal in both formats for an integer;
 *   - refusals naming the file, the record (and for CSV the line) and the
 *     column: an id not below its table's rows, a negative id, an id that
 *     is not an integer, a column that is missing, too many ids in a cell,
 *     a numeric value that is not finite; a malformed list item;
 *   - .npz files whose arrays are the columns, read the same way, and
 *     their refusals naming the file, the record and the column;
 *   - named columns against a model's bags (dp_data_check_bags), and an
 *     .npy pair refused with the reason. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytes.h"
#include "check.h"
#include "downpour/model.h"
#include "downpour/records.h"
#include "example_file.h"
#include "scratch.h"
#include "zip_stored.h"

static char g_dir[1024];

/* Reads the first file of spec's training split: its records' features
 * into x (rows * dim), their count in *n; -1 with err on a refusal. */
static int read_all(const char *spec, const dp_data_options *o, float *x, size_t cap, int *n,
                    uint32_t *dim, dp_err *err)
{
    dp_data_files f;
    if (dp_data_files_find(&f, spec, o, err) < 0)
        return -1;
    int rc = dp_data_files_count(&f, o, err);
    if (rc == 0) {
        *dim = f.shape.dim;
        dp_record_reader *r;
        rc = dp_record_open(&r, &f.train.files[0], f.format, &f.shape, o, err);
        if (rc == 0) {
            uint8_t y;
            *n = 0;
            while ((rc = dp_record_next(r, x + (size_t)*n * f.shape.dim, &y, err)) == 1)
                if ((size_t)(++*n + 1) * f.shape.dim > cap)
                    break;
            dp_record_close(r);
            rc = rc < 0 ? -1 : 0;
        }
    }
    dp_data_files_free(&f);
    return rc;
}

static void write_text(const char *path, const char *text)
{
    write_bytes(path, text, strlen(text));
}

static void csv_case(const char *train, const dp_data_options *o, const char *needle)
{
    char dir[1100], path[1200];
    static int k;
    snprintf(dir, sizeof dir, "%s/csv%d", g_dir, k++);
    REQUIRE(mkdir(dir, 0755) == 0);
    snprintf(path, sizeof path, "%s/a-train.csv", dir);
    write_text(path, train);
    snprintf(path, sizeof path, "%s/a-test.csv", dir);
    write_text(path, train);
    float x[256];
    int n;
    uint32_t dim;
    dp_err err;
    int rc = read_all(dir, o, x, 256, &n, &dim, &err);
    CHECKF(rc < 0 && strstr(err.msg, needle), "want '%s': %s", needle, rc < 0 ? err.msg : "read");
    if (rc < 0)
        printf("refused: %s\n", err.msg);
}

static void test_csv(void)
{
    const char *text = "extra,c0,label,n0,tags,c1\n"
                       "x,3,1,0.5,1|2,4\n"
                       "y,0,0,-1.5,,1\n"
                       "z,2,1,2.0,3,0\n";
    char dir[1100], path[1200];
    snprintf(dir, sizeof dir, "%s/csv", g_dir);
    REQUIRE(mkdir(dir, 0755) == 0);
    snprintf(path, sizeof path, "%s/a-train.csv", dir);
    write_text(path, text);
    snprintf(path, sizeof path, "%s/a-test.csv", dir);
    write_text(path, text);
    dp_data_options o;
    dp_data_options_default(&o);
    o.categorical = "c0,tags:2,c1";
    o.numeric = "n0";
    uint32_t limits[3] = {5, 4, 6};
    o.id_limits = limits;
    o.n_id_limits = 3;
    float x[64];
    int n;
    uint32_t dim;
    dp_err err;
    REQUIRE(read_all(dir, &o, x, 64, &n, &dim, &err) == 0 || (printf("%s\n", err.msg), 0));
    float want[3][5] = {{3, 1, 2, 4, 0.5f}, {0, -1, -1, 1, -1.5f}, {2, 3, -1, 0, 2.0f}};
    CHECK(n == 3 && dim == 5 && memcmp(x, want, sizeof want) == 0);

    o.hash_buckets = 4; /* every id hashed, the text x too */
    o.categorical = "extra,tags:2";
    o.numeric = NULL;
    REQUIRE(read_all(dir, &o, x, 64, &n, &dim, &err) == 0 || (printf("%s\n", err.msg), 0));
    CHECK(n == 3 && dim == 3);
    CHECK(x[0] == (float)(dp_id_hash_text("x", 1) % 4) && x[1] == (float)(dp_id_hash_int(1) % 4) &&
          x[2] == (float)(dp_id_hash_int(2) % 4) && x[4] == -1 && x[5] == -1);
    /* the documented hash: splitmix64's finaliser of the integer */
    CHECK(dp_id_hash_int(0) == 0xe220a8397b1dcdafULL);
    printf("csv: named columns read, raw ids hashed\n");

    dp_data_options_default(&o);
    o.categorical = "c0,tags:2,c1";
    o.numeric = "n0";
    o.id_limits = limits;
    o.n_id_limits = 3;
    const char *head = "extra,c0,label,n0,tags,c1\nx,3,1,0.5,1|2,4\n";
    char buf[256];
    snprintf(buf, sizeof buf, "%sz,5,1,2.0,3,0\n", head);
    csv_case(buf, &o, "a-train.csv: record 1: line 3, column 2 (c0): id 5 is not below 5");
    snprintf(buf, sizeof buf, "%sz,-1,1,2.0,3,0\n", head);
    csv_case(buf, &o, "a-train.csv: record 1: line 3, column 2 (c0): id -1 is negative");
    snprintf(buf, sizeof buf, "%sz,1.5,1,2.0,3,0\n", head);
    csv_case(buf, &o, "line 3, column 2 (c0): id '1.5' is not an integer");
    snprintf(buf, sizeof buf, "%sz,1,1,2.0,0|1|2,0\n", head);
    csv_case(buf, &o, "line 3, column 5 (tags): more than 2 ids");
    snprintf(buf, sizeof buf, "%sz,1,1,2.0,0|x,0\n", head);
    csv_case(buf, &o, "line 3, column 5 (tags): id 'x' is not an integer");
    o.categorical = "c0,tags:2,c9";
    csv_case(text, &o, "a-train.csv: no column named 'c9' (--categorical); the header has");
    o.categorical = "c0,c0";
    csv_case(text, &o, "column 2 (c0) is named twice");
    o.categorical = "c0,tags:0";
    csv_case(text, &o, "a-train.csv: --categorical 'tags:0': expected NAME, or NAME:M with M "
                       "ids in [1, 4096]");
    o.categorical = "c0,,c1";
    csv_case(text, &o, "--categorical '': expected NAME");
}

/* The TFRecord and .npz sets' columns: c0 (ids below 5), tags (2 places,
 * below 4), n0. */
static dp_data_options example_options(void)
{
    static const uint32_t limits[2] = {5, 4};
    dp_data_options o;
    dp_data_options_default(&o);
    o.categorical = "c0,tags:2";
    o.numeric = "n0";
    o.id_limits = limits;
    o.n_id_limits = 2;
    return o;
}

static void test_tfrecord(void)
{
    char dir[1100], path[1200];
    snprintf(dir, sizeof dir, "%s/tf", g_dir);
    REQUIRE(mkdir(dir, 0755) == 0);
    for (int v = 0; v < 5; v++) {
        for (int split = 0; split < 2; split++) {
            snprintf(path, sizeof path, "%s/v%d-%s.tfrecord", dir, v, split ? "test" : "train");
            dp_tfrecord_writer *w;
            dp_err err;
            REQUIRE(dp_tfrecord_writer_open(&w, path, DP_TFRECORD_RAW, &err) == 0);
            int64_t c0[2][1] = {{3}, {v == 1 ? 7 : v == 2 ? -2 : 0}}, tags[2][3] = {{1, 2, 0}, {4}};
            size_t ntags[2] = {2, v == 3 ? 3 : 0};
            float n0[2] = {0.5f, v == 4 ? NAN : -1.5f};
            int64_t label[2] = {1, 0};
            for (int r = 0; r < 2; r++) {
                dp_feature fs[4] = {
                    {.name = "c0", .kind = DP_FEATURE_INT64, .count = 1, .int64s = c0[r]},
                    {.name = "tags", .kind = DP_FEATURE_INT64, .count = ntags[r],
                     .int64s = tags[r]},
                    {.name = "n0", .kind = DP_FEATURE_FLOAT, .count = 1, .floats = &n0[r]},
                    {.name = "label", .kind = DP_FEATURE_INT64, .count = 1, .int64s = &label[r]},
                };
                write_example(w, fs, 4);
            }
            REQUIRE(dp_tfrecord_writer_close(w, &err) == 0);
        }
    }
    dp_data_options o = example_options();
    float x[64];
    int n;
    uint32_t dim;
    dp_err err;
    snprintf(path, sizeof path, "%s/v0-*", dir);
    REQUIRE(read_all(path, &o, x, 64, &n, &dim, &err) == 0 || (printf("%s\n", err.msg), 0));
    float want[2][4] = {{3, 1, 2, 0.5f}, {0, -1, -1, -1.5f}};
    CHECK(n == 2 && dim == 4 && memcmp(x, want, sizeof want) == 0);
    o.hash_buckets = 4;
    REQUIRE(read_all(path, &o, x, 64, &n, &dim, &err) == 0);
    CHECK(x[0] == (float)(dp_id_hash_int(3) % 4) && x[1] == (float)(dp_id_hash_int(1) % 4));
    o.hash_buckets = 0;
    printf("tfrecord: named int64 and float features read, raw ids hashed as CSV's\n");

    const char *needles[5] = {NULL,
                              "v1-train.tfrecord: record 1: feature \"c0\": id 7 is not below 5",
                              "v2-train.tfrecord: record 1: feature \"c0\": id -2 is negative",
                              "v3-train.tfrecord: record 1: feature \"tags\" holds 3 ids",
                              "v4-train.tfrecord: record 1: feature \"n0\": nan is not a finite "
                              "number"};
    for (int v = 1; v < 5; v++) {
        snprintf(path, sizeof path, "%s/v%d-*", dir, v);
        int rc = read_all(path, &o, x, 64, &n, &dim, &err);
        CHECKF(rc < 0 && strstr(err.msg, needles[v]), "%s", rc < 0 ? err.msg : "read");
        printf("refused: %s\n", err.msg);
    }
    snprintf(path, sizeof path, "%s/v0-*", dir);
    o.categorical = "c0,tag";
    int rc = read_all(path, &o, x, 64, &n, &dim, &err);
    CHECKF(rc < 0 && strstr(err.msg, "v0-train.tfrecord: record 0: no feature \"tag\" "
                                     "(--categorical)"), "%s", rc < 0 ? err.msg : "read");
    o.categorical = "n0";
    o.numeric = NULL;
    rc = read_all(path, &o, x, 64, &n, &dim, &err);
    CHECKF(rc < 0 && strstr(err.msg, "feature \"n0\" is a float_list; categorical ids are an "
                                     "int64_list"), "%s", rc < 0 ? err.msg : "read");
    o.categorical = ":2";
    rc = read_all(path, &o, x, 64, &n, &dim, &err);
    CHECKF(rc < 0 && strstr(err.msg, "--categorical ':2': expected NAME"), "%s",
           rc < 0 ? err.msg : "read");
}

/* DIR/v-train.npz and v-test.npz: label, c0 (ids), tags (n, 2), n0; variant
 * v changes one value of the training file's record 1 (or a dtype). */
static void write_npz(const char *dir, int v)
{
    uint8_t label[2] = {1, 0};
    int64_t c0[2] = {3, v == 1 ? 9 : v == 2 ? -3 : 0};
    int64_t tags[2][2] = {{1, 2}, {-1, -1}};
    float n0[2] = {0.5f, -1.5f}, c0f[2] = {3, 0};
    for (int split = 0; split < 2; split++) {
        int w = split == 0 ? v : 0;
        bytes m[4] = {
            npy_array("|u1", "(2,)", label, 2),
            w == 3 ? npy_array("<f4", "(2,)", c0f, sizeof c0f)
                   : npy_array("<i8", "(2,)", c0, sizeof c0),
            npy_array("<i8", "(2, 2)", tags, sizeof tags),
            npy_array("<f4", "(2,)", n0, sizeof n0),
        };
        if (split == 1) { /* the test file: always good */
            free(m[1].p);
            c0[1] = 0;
            m[1] = npy_array("<i8", "(2,)", c0, sizeof c0);
        }
        const char *names[4] = {"label.npy", "c0.npy", "tags.npy", "n0.npy"};
        bytes zip = zip_stored(names, m, 4);
        char path[1300];
        snprintf(path, sizeof path, "%s/v%d-%s.npz", dir, v, split ? "test" : "train");
        write_bytes(path, zip.p, zip.n);
        free(zip.p);
        for (int i = 0; i < 4; i++)
            free(m[i].p);
    }
}

static void test_npz(void)
{
    char dir[1100], path[1200];
    snprintf(dir, sizeof dir, "%s/npz", g_dir);
    REQUIRE(mkdir(dir, 0755) == 0);
    for (int v = 0; v < 4; v++)
        write_npz(dir, v);
    dp_data_options o = example_options();
    float x[64];
    int n;
    uint32_t dim;
    dp_err err;
    snprintf(path, sizeof path, "%s/v0-*", dir);
    int rc = read_all(path, &o, x, 64, &n, &dim, &err);
    CHECKF(rc == 0, "%s", rc < 0 ? err.msg : "");
    float want[2][4] = {{3, 1, 2, 0.5f}, {0, -1, -1, -1.5f}};
    CHECK(n == 2 && dim == 4 && memcmp(x, want, sizeof want) == 0);
    o.hash_buckets = 4;
    REQUIRE(read_all(path, &o, x, 64, &n, &dim, &err) == 0);
    CHECK(x[0] == (float)(dp_id_hash_int(3) % 4) && x[1] == (float)(dp_id_hash_int(1) % 4) &&
          x[6] == -1.0f); /* -1 stays an empty place */
    o.hash_buckets = 0;
    printf("npz: named arrays read, raw ids hashed as the other formats'\n");
    const char *needles[4] = {NULL, "v1-train.npz: record 1: column \"c0\": id 9 is not below 5",
                              "v2-train.npz: record 1: column \"c0\": id -3 is negative",
                              "v3-train.npz: column \"c0\": dtype <f4 is not an integer type"};
    for (int v = 1; v < 4; v++) {
        snprintf(path, sizeof path, "%s/v%d-*", dir, v);
        rc = read_all(path, &o, x, 64, &n, &dim, &err);
        CHECKF(rc < 0 && strstr(err.msg, needles[v]), "%s", rc < 0 ? err.msg : "read");
        printf("refused: %s\n", err.msg);
    }
    snprintf(path, sizeof path, "%s/v0-*", dir);
    o.categorical = "c0,tags"; /* (n, 2) in one place */
    rc = read_all(path, &o, x, 64, &n, &dim, &err);
    CHECKF(rc < 0 && strstr(err.msg, "(member tags): 2 values a row"), "%s",
           rc < 0 ? err.msg : "read");
    o.categorical = "c0,tagz:2";
    rc = read_all(path, &o, x, 64, &n, &dim, &err);
    CHECKF(rc < 0 && strstr(err.msg, "tagz"), "%s", rc < 0 ? err.msg : "read");
    printf("refused: %s\n", err.msg);
}

static void test_bags(void)
{
    dp_model m;
    dp_err err;
    REQUIRE(dp_model_init(&m, "5-bag5x2-bag4x2m2-bag6x2-dense1-bce", 4, 1, &err) == 0);
    uint32_t rows[8], limits[8];
    int places[8];
    int n = dp_model_bags(&m, rows, places, 8);
    CHECK(n == 3 && rows[0] == 5 && rows[1] == 4 && rows[2] == 6 && places[1] == 2);
    dp_data_options o;
    dp_data_options_default(&o);
    o.categorical = "c0,tags:2,c1";
    CHECK(dp_data_check_bags(&o, rows, places, n, limits, &err) == 0 && limits[2] == 6);
    o.categorical = "c0,tags,c1";
    CHECK(dp_data_check_bags(&o, rows, places, n, limits, &err) < 0 &&
          strstr(err.msg, "column 2 holds 1 id(s) a record but bag 2 takes 2"));
    o.categorical = "c0,tags:2";
    CHECK(dp_data_check_bags(&o, rows, places, n, limits, &err) < 0 &&
          strstr(err.msg, "names 2 column(s) but the model has 3 embedding bag(s)"));
    o.categorical = "c0,tags:2,c1";
    o.hash_buckets = 5;
    CHECK(dp_data_check_bags(&o, rows, places, n, limits, &err) < 0 &&
          strstr(err.msg, "--hash-buckets 5 is more than the 4 rows of bag 2's table"));
    dp_model_free(&m);

    /* NumPy: refused with the reason */
    char dir[1100], path[1200];
    snprintf(dir, sizeof dir, "%s/npy", g_dir);
    REQUIRE(mkdir(dir, 0755) == 0);
    float one = 1;
    uint8_t lab = 0;
    const char *names[4] = {"x_train.npy", "x_test.npy", "y_train.npy", "y_test.npy"};
    for (int i = 0; i < 4; i++) {
        bytes b = i < 2 ? npy_array("<f4", "(1, 1)", &one, 4) : npy_array("|u1", "(1,)", &lab, 1);
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        write_bytes(path, b.p, b.n);
        free(b.p);
    }
    o.hash_buckets = 0;
    float v[8];
    int k;
    uint32_t dim;
    int rc = read_all(dir, &o, v, 8, &k, &dim, &err);
    CHECKF(rc < 0 && strstr(err.msg, "named columns (--categorical, --numeric) are read from "
                                     ".npz files"), "%s", rc < 0 ? err.msg : "read");
}

int main(void)
{
    scratch_make(g_dir, sizeof g_dir, "test_ctr_columns");
    test_csv();
    test_tfrecord();
    test_npz();
    test_bags();
    int rc = CHECK_DONE();
    if (rc == 0)
        scratch_remove(g_dir);
    return rc;
}
