/* downpour data synth ctr: a synthetic click-through set (docs/datasets.md,
 * "Synthetic click-through data"; the generator is synth_ctr.h).  Writes
 * the training rows in --files CSV files (or one NumPy pair), the test rows
 * likewise, and NAME-synth.json with the configuration and the generating
 * model's log loss on each split: the best a model can score there.
 * Records are made one at a time (a pure function of the row), so memory
 * stays a record and stdio's buffer whatever the set's size. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "downpour/clock.h"
#include "downpour/example.h"
#include "downpour/file.h"
#include "downpour/status.h"
#include "downpour/synth_ctr.h"
#include "downpour/tfrecord.h"

#define SYNTH_USAGE                                                                           \
    "downpour data synth ctr --to DIR [--rows N] [--test-rows N] [--files N]\n"                \
    "       [--test-files N] [--categorical N] [--ids N[,N...]] [--multi K] [--places M]\n"    \
    "       [--numeric N] [--zipf S] [--seed N] [--format csv|npy|tfrecord] [--name NAME]\n"  \
    "       [--force]\n"                                                                        \
    "\n"                                                                                       \
    "Writes a synthetic click-through set: Zipf-distributed ids for each categorical\n"        \
    "feature, normal numeric features, and labels from a known logistic model, so the\n"       \
    "best achievable log loss is printed and written to DIR/NAME-synth.json.  Columns:\n"      \
    "label, c0 ... (a multi-valued feature: c5_0 ... c5_{M-1}, -1 for an empty place),\n"      \
    "n0 ...: the layout the bag layers read (docs/models.md, \"Click-through models\")."

#define MAX_FILES 99999
#define MAX_ROWS 4000000000L

typedef enum synth_format { FMT_CSV, FMT_NPY, FMT_TFRECORD } synth_format;

typedef struct synth_job {
    dp_ctr_synth s;
    const char *dir, *name;
    int npy;
    synth_format fmt;
    long rows[2], files[2];
    int width;
    float *x;
    double logloss[2], entropy[2], clicks[2];
    uint64_t bytes[2];
    /* a bit an id of each feature: seen in a training record */
    uint8_t *seen[DP_CTR_MAX_FEATURES];
    /* the test split's by dp_ctr_synth_seen_p: on its labels, and expected
     * under the generating model (as entropy is the generating model's) */
    double seen_logloss, seen_expected;
    /* each id's Fisher information from the training records, when the ids
     * are few enough (MAX_INFO_IDS), and the Bayes learner's figures */
    float *info[DP_CTR_MAX_FEATURES];
    int have_info;
    double bayes_logloss, bayes_expected;
} synth_job;

/* The ids (floats of information) the Bayes estimate may hold: 256 MiB. */
#define MAX_INFO_IDS (1L << 26)

static const char *const split_names[2] = {"train", "test"};

static void file_path(char *out, size_t cap, const synth_job *j, int k, long i, const char *what)
{
    if (j->npy)
        snprintf(out, cap, "%s/%s-%s-%s.npy", j->dir, j->name, split_names[k], what);
    else if (j->fmt == FMT_TFRECORD) /* TFDS's names */
        snprintf(out, cap, "%s/%s-%s.tfrecord-%05ld-of-%05ld", j->dir, j->name, split_names[k],
                 i, j->files[k]);
    else
        snprintf(out, cap, "%s/%s-%s-%05ld-of-%05ld.csv", j->dir, j->name, split_names[k], i,
                 j->files[k]);
}

/* The generating model's tallies of one record, and what a model trained
 * on the training split can know of it at best. */
static void tally(synth_job *j, int k, uint64_t row, const float *x, uint8_t y, double p)
{
    if (k == 0) {
        dp_ctr_synth_mark_seen(&j->s, x, j->seen);
        if (j->have_info)
            dp_ctr_synth_add_info(&j->s, x, p, j->info);
    } else {
        double q = dp_ctr_synth_seen_p(&j->s, x, (const uint8_t *const *)j->seen);
        j->seen_logloss -= y ? log(q) : log1p(-q);
        j->seen_expected -= p * log(q) + (1 - p) * log1p(-q);
        if (j->have_info) {
            q = dp_ctr_synth_bayes_p(&j->s, row, x, (const float *const *)j->info);
            j->bayes_logloss -= y ? log(q) : log1p(-q);
            j->bayes_expected -= p * log(q) + (1 - p) * log1p(-q);
        }
    }
    j->logloss[k] -= y ? log(p) : log1p(-p);
    j->entropy[k] -= (p > 0 ? p * log(p) : 0) + (p < 1 ? (1 - p) * log1p(-p) : 0);
    j->clicks[k] += y;
}

static void csv_header(const synth_job *j, FILE *f)
{
    fputs("label", f);
    for (int c = 0; c < j->s.n_cat; c++) {
        if (j->s.places[c] == 1)
            fprintf(f, ",c%d", c);
        else
            for (int m = 0; m < j->s.places[c]; m++)
                fprintf(f, ",c%d_%d", c, m);
    }
    for (int n = 0; n < j->s.n_num; n++)
        fprintf(f, ",n%d", n);
    fputc('\n', f);
}

/* A file written through stdio, replaced atomically (file.h's
 * dp_atomic_*): the stream writes a duplicate of the temporary's fd. */
static FILE *open_out(dp_atomic_file *af, const char *path, dp_err *err)
{
    if (dp_atomic_open(af, path, err) < 0)
        return NULL;
    int fd = dup(af->fd);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "wb");
    if (!f) {
        dp_errf(err, "%s: cannot write: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        dp_atomic_abort(af);
        return NULL;
    }
    setvbuf(f, NULL, _IOFBF, 1 << 20);
    return f;
}

/* Closes the stream and puts the file in place; *bytes gets its size. */
static int finish(FILE *f, dp_atomic_file *af, uint64_t *bytes, dp_err *err)
{
    long at = ftell(f);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        dp_errf(err, "%s: write failed: %s", af->path, strerror(errno ? errno : EIO));
        dp_atomic_abort(af);
        return -1;
    }
    if (dp_atomic_commit(af, err) < 0)
        return -1;
    *bytes += at > 0 ? (uint64_t)at : 0;
    return 0;
}

static int write_csv(synth_job *j, int k, dp_err *err)
{
    for (long i = 0; i < j->files[k]; i++) {
        char path[4096];
        file_path(path, sizeof path, j, k, i, "features");
        dp_atomic_file af;
        FILE *f = open_out(&af, path, err);
        if (!f)
            return -1;
        csv_header(j, f);
        uint64_t lo = (uint64_t)j->rows[k] * i / j->files[k];
        uint64_t hi = (uint64_t)j->rows[k] * (i + 1) / j->files[k];
        int n_ids = j->width - j->s.n_num;
        for (uint64_t r = lo; r < hi; r++) {
            uint8_t y;
            double p;
            dp_ctr_synth_row(&j->s, k, r, j->x, &y, &p);
            tally(j, k, r, j->x, y, p);
            fprintf(f, "%u", y);
            for (int c = 0; c < n_ids; c++)
                fprintf(f, ",%d", (int)j->x[c]);
            for (int c = n_ids; c < j->width; c++)
                fprintf(f, ",%.9g", j->x[c]);
            fputc('\n', f);
        }
        if (finish(f, &af, &j->bytes[k], err) < 0)
            return -1;
    }
    return 0;
}

/* TFRecord files of tf.train.Example: "label" (int64), each categorical
 * feature "cK" an int64_list of its ids (a multi-valued one only the ids it
 * holds: no -1), each numeric "nK" a float_list of one value; read with
 * --categorical and --numeric (docs/datasets.md). */
static int write_tfrecord(synth_job *j, int k, dp_err *err)
{
    int nf = 1 + j->s.n_cat + j->s.n_num;
    dp_feature *fs = calloc((size_t)nf, sizeof *fs);
    int64_t *ids = malloc(((size_t)j->width + 1) * sizeof *ids);
    char *names = malloc((size_t)nf * 16);
    uint8_t *enc = NULL;
    size_t cap = 0;
    int rc = fs && ids && names ? 0 : dp_errf(err, "out of memory");
    for (long i = 0; rc == 0 && i < j->files[k]; i++) {
        char path[4096];
        file_path(path, sizeof path, j, k, i, "features");
        dp_tfrecord_writer *w;
        if (dp_tfrecord_writer_open(&w, path, DP_TFRECORD_RAW, err) != 0) {
            rc = -1;
            break;
        }
        uint64_t lo = (uint64_t)j->rows[k] * i / j->files[k];
        uint64_t hi = (uint64_t)j->rows[k] * (i + 1) / j->files[k];
        for (uint64_t r = lo; rc == 0 && r < hi; r++) {
            uint8_t y;
            double p;
            dp_ctr_synth_row(&j->s, k, r, j->x, &y, &p);
            tally(j, k, r, j->x, y, p);
            int f = 0, at = 0;
            ids[j->width] = y;
            fs[f++] = (dp_feature){.name = "label", .kind = DP_FEATURE_INT64, .count = 1,
                                   .int64s = &ids[j->width]};
            for (int c = 0; c < j->s.n_cat; c++) {
                char *nm = names + (size_t)f * 16;
                snprintf(nm, 16, "c%d", c);
                size_t used = 0;
                for (int q = 0; q < j->s.places[c]; q++)
                    if (j->x[at + q] >= 0)
                        ids[at + (int)used++] = (int64_t)j->x[at + q];
                fs[f++] = (dp_feature){.name = nm, .kind = DP_FEATURE_INT64, .count = used,
                                       .int64s = &ids[at]};
                at += j->s.places[c];
            }
            for (int q = 0; q < j->s.n_num; q++) {
                char *nm = names + (size_t)f * 16;
                snprintf(nm, 16, "n%d", q);
                fs[f++] = (dp_feature){.name = nm, .kind = DP_FEATURE_FLOAT, .count = 1,
                                       .floats = &j->x[at + q]};
            }
            size_t len = dp_example_encoded_size(fs, (size_t)nf);
            if (len > cap) {
                uint8_t *g = realloc(enc, len);
                if (!g) {
                    rc = dp_errf(err, "out of memory");
                    break;
                }
                enc = g, cap = len;
            }
            dp_example_encode(enc, fs, (size_t)nf);
            if (dp_tfrecord_write(w, enc, len, err) != 0)
                rc = -1;
            j->bytes[k] += len + 16; /* the record's framing */
        }
        if (dp_tfrecord_writer_close(w, rc == 0 ? err : NULL) != 0 && rc == 0)
            rc = -1;
    }
    free(fs);
    free(ids);
    free(names);
    free(enc);
    return rc;
}

/* A version 1.0 .npy header for shape (n,) or (n, w), padded to 64 bytes. */
static void npy_header(FILE *f, const char *descr, long n, int w)
{
    char dict[200];
    int len = w ? snprintf(dict, sizeof dict,
                           "{'descr': '%s', 'fortran_order': False, 'shape': (%ld, %d), }", descr,
                           n, w)
                : snprintf(dict, sizeof dict,
                           "{'descr': '%s', 'fortran_order': False, 'shape': (%ld,), }", descr, n);
    int total = 10 + len + 1, pad = (64 - total % 64) % 64;
    uint16_t hl = (uint16_t)(len + pad + 1);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    uint8_t le[2] = {(uint8_t)(hl & 0xff), (uint8_t)(hl >> 8)};
    fwrite(le, 1, 2, f);
    fwrite(dict, 1, (size_t)len, f);
    for (int i = 0; i < pad; i++)
        fputc(' ', f);
    fputc('\n', f);
}

static int write_npy(synth_job *j, int k, dp_err *err)
{
    char xp[4096], yp[4096];
    file_path(xp, sizeof xp, j, k, 0, "features");
    file_path(yp, sizeof yp, j, k, 0, "labels");
    dp_atomic_file ax, ay;
    FILE *fx = open_out(&ax, xp, err);
    if (!fx)
        return -1;
    FILE *fy = open_out(&ay, yp, err);
    if (!fy) {
        fclose(fx);
        dp_atomic_abort(&ax);
        return -1;
    }
    npy_header(fx, "<f4", j->rows[k], j->width);
    npy_header(fy, "|u1", j->rows[k], 0);
    for (uint64_t r = 0; r < (uint64_t)j->rows[k]; r++) {
        uint8_t y;
        double p;
        dp_ctr_synth_row(&j->s, k, r, j->x, &y, &p);
        tally(j, k, r, j->x, y, p);
        fwrite(j->x, sizeof(float), (size_t)j->width, fx); /* little-endian hosts only */
        fputc(y, fy);
    }
    if (finish(fx, &ax, &j->bytes[k], err) < 0) {
        fclose(fy);
        dp_atomic_abort(&ay);
        return -1;
    }
    return finish(fy, &ay, &j->bytes[k], err);
}

static int write_info(const synth_job *j, dp_err *err)
{
    char path[4096], text[16384];
    snprintf(path, sizeof path, "%s/%s-synth.json", j->dir, j->name);
    size_t len = (size_t)snprintf(
        text, sizeof text,
        "{\"generator\": \"downpour data synth ctr\", \"format\": \"%s\", \"width\": %d,\n"
        " \"categorical\": %d, \"numeric\": %d, \"zipf\": %.17g, \"id_scale\": %.17g,\n"
        " \"num_scale\": %.17g, \"bias\": %.17g, \"seed\": %llu,\n \"ids\": [",
        j->npy ? "npy" : j->fmt == FMT_TFRECORD ? "tfrecord" : "csv", j->width, j->s.n_cat,
        j->s.n_num, j->s.zipf, j->s.id_scale,
        j->s.num_scale, j->s.bias, (unsigned long long)j->s.seed);
    for (int f = 0; f < j->s.n_cat && len < sizeof text; f++)
        len += (size_t)snprintf(text + len, sizeof text - len, "%s%u", f ? ", " : "", j->s.card[f]);
    len += (size_t)snprintf(text + len, sizeof text - len, "],\n \"places\": [");
    for (int f = 0; f < j->s.n_cat && len < sizeof text; f++)
        len += (size_t)snprintf(text + len, sizeof text - len, "%s%d", f ? ", " : "",
                                j->s.places[f]);
    len += (size_t)snprintf(text + len, sizeof text - len, "]");
    for (int k = 0; k < 2 && len < sizeof text; k++) {
        double n = (double)j->rows[k];
        len += (size_t)snprintf(
            text + len, sizeof text - len,
            ",\n \"%s\": {\"rows\": %ld, \"files\": %ld, \"click_rate\": %.17g, "
            "\"generating_log_loss\": %.17g, \"expected_log_loss\": %.17g",
            split_names[k], j->rows[k], j->npy ? 1 : j->files[k], n ? j->clicks[k] / n : 0,
            n ? j->logloss[k] / n : 0, n ? j->entropy[k] / n : 0);
        if (k == 1 && len < sizeof text)
            len += (size_t)snprintf(text + len, sizeof text - len,
                                    ", \"seen_ids_log_loss\": %.17g, "
                                    "\"seen_ids_expected_log_loss\": %.17g",
                                    n ? j->seen_logloss / n : 0, n ? j->seen_expected / n : 0);
        if (k == 1 && j->have_info && len < sizeof text)
            len += (size_t)snprintf(text + len, sizeof text - len,
                                    ", \"bayes_estimate_log_loss\": %.17g, "
                                    "\"bayes_estimate_expected_log_loss\": %.17g",
                                    n ? j->bayes_logloss / n : 0, n ? j->bayes_expected / n : 0);
        if (len < sizeof text)
            len += (size_t)snprintf(text + len, sizeof text - len, "}");
    }
    len += (size_t)snprintf(text + len, sizeof text - len, "}\n");
    if (len >= sizeof text)
        return dp_errf(err, "%s: too many features to describe", path);
    return dp_file_replace(path, text, len, err);
}

/* --ids: one count for every feature, or one per feature. */
static int parse_ids(synth_job *j, const char *text)
{
    int n = 0;
    const char *s = text;
    uint32_t v[DP_CTR_MAX_FEATURES];
    while (*s) {
        char *end;
        errno = 0;
        long c = strtol(s, &end, 10);
        if (end == s || errno || c < 1 || c > DP_CTR_MAX_IDS || n == DP_CTR_MAX_FEATURES ||
            (*end && *end != ','))
            return -1;
        v[n++] = (uint32_t)c;
        s = *end ? end + 1 : end;
        if (*end == ',' && !*s)
            return -1;
    }
    if (n == 0 || (n != 1 && n != j->s.n_cat))
        return -1;
    for (int f = 0; f < j->s.n_cat; f++)
        j->s.card[f] = v[n == 1 ? 0 : f];
    return 0;
}

/* A spec of the wide-deep shape for this set (docs/models.md). */
static void print_model(const synth_job *j)
{
    printf("a model for it: --model %d", j->width);
    for (int f = 0; f < j->s.n_cat; f++) {
        printf("-bag%ux16", j->s.card[f]);
        if (j->s.places[f] > 1)
            printf("m%dmean", j->s.places[f]);
    }
    printf("-res(dense64-relu-dense32-relu-dense1|dense1)-bce\n");
    if (j->fmt != FMT_TFRECORD)
        return;
    printf("read it with: --categorical ");
    for (int f = 0; f < j->s.n_cat; f++) {
        printf("%sc%d", f ? "," : "", f);
        if (j->s.places[f] > 1)
            printf(":%d", j->s.places[f]);
    }
    printf(" --numeric ");
    for (int f = 0; f < j->s.n_num; f++)
        printf("%sn%d", f ? "," : "", f);
    printf("\n");
}

static int synth_ctr(int argc, char **argv)
{
    synth_job j;
    memset(&j, 0, sizeof j);
    j.s = dp_ctr_synth_defaults();
    const char *to = NULL, *name = "ctr", *ids = "1000", *format = "csv";
    long rows = 100000, test_rows = 10000, files = 1, test_files = 1, cat = 8, num = 4;
    long multi = 0, places = 4, seed = 1;
    double zipf = 1.1, id_scale = 0.5, num_scale = 0.3, bias = -1.1;
    bool force = false;
    const cli_opt opts[] = {
        {"to", CLI_STR, &to, "DIR", "output directory (made if missing)", 0, 0},
        {"rows", CLI_INT, &rows, "N", "training records", 1, MAX_ROWS},
        {"test-rows", CLI_INT, &test_rows, "N", "test records", 1, MAX_ROWS},
        {"files", CLI_INT, &files, "N", "training files (CSV, TFRecord)", 1, MAX_FILES},
        {"test-files", CLI_INT, &test_files, "N", "test files (CSV, TFRecord)", 1, MAX_FILES},
        {"categorical", CLI_INT, &cat, "N", "categorical features", 0, DP_CTR_MAX_FEATURES},
        {"ids", CLI_STR, &ids, "N[,N...]",
         "ids of each categorical feature: one count for all, or one per feature (at most 2^24)",
         0, 0},
        {"multi", CLI_INT, &multi, "K", "the last K categorical features are multi-valued", 0,
         DP_CTR_MAX_FEATURES},
        {"places", CLI_INT, &places, "M", "ids a multi-valued feature holds at most (1 to M)", 2,
         DP_CTR_MAX_PLACES},
        {"numeric", CLI_INT, &num, "N", "numeric features", 0, DP_CTR_MAX_NUMERIC},
        {"zipf", CLI_NUM, &zipf, "S", "the ids' Zipf exponent", 0.01, 10},
        {"id-scale", CLI_NUM, &id_scale, "X", "the generating model's per-id weights' deviation",
         0, 10},
        {"num-scale", CLI_NUM, &num_scale, "X",
         "the generating model's numeric weights' deviation", 0, 10},
        {"bias", CLI_NUM, &bias, "X", "the generating model's bias (the click rate)", -20, 20},
        {"seed", CLI_INT, &seed, "N", "the seed: the same seed, the same files", 0, 1e15},
        {"format", CLI_STR, &format, "csv|npy|tfrecord",
         "CSV files, one NumPy pair a split (features float32, labels uint8), or TFRecord "
         "files of tf.train.Example (int64 ids, float numerics: read with --categorical and "
         "--numeric)", 0, 0},
        {"name", CLI_STR, &name, "NAME", "file name prefix", 0, 0},
        {"force", CLI_FLAG, &force, NULL, "replace files of the same names", 0, 0},
    };
    int rest;
    int r = cli_parse(SYNTH_USAGE, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, &rest);
    if (r != 0)
        return r > 0 ? 0 : 2;
    if (rest < argc) {
        fprintf(stderr, "downpour data synth ctr: unexpected argument '%s' (see --help)\n",
                argv[rest]);
        return 2;
    }
    if (!to) {
        fprintf(stderr, "downpour data synth ctr: --to DIR is required\n");
        return 2;
    }
    if (strcmp(format, "csv") != 0 && strcmp(format, "npy") != 0 &&
        strcmp(format, "tfrecord") != 0) {
        fprintf(stderr, "downpour data synth ctr: --format '%s': expected csv, npy or tfrecord\n",
                format);
        return 2;
    }
    j.npy = strcmp(format, "npy") == 0;
    j.fmt = j.npy ? FMT_NPY : strcmp(format, "tfrecord") == 0 ? FMT_TFRECORD : FMT_CSV;
    if (j.npy && (files != 1 || test_files != 1)) {
        fprintf(stderr, "downpour data synth ctr: --format npy writes one pair of .npy files a "
                        "split (a NumPy dataset is one pair a split): --files and --test-files "
                        "must be 1; use --format csv for several files\n");
        return 2;
    }
    if (!*name || strchr(name, '/') || strlen(name) > 200 || name[0] == '.') {
        fprintf(stderr, "downpour data synth ctr: --name '%s': a file name prefix, without '/', "
                        "not starting with '.', at most 200 bytes\n", name);
        return 2;
    }
    if (multi > cat) {
        fprintf(stderr, "downpour data synth ctr: --multi %ld is more than the %ld categorical "
                        "features\n", multi, cat);
        return 2;
    }
    if (files > rows || test_files > test_rows) {
        fprintf(stderr, "downpour data synth ctr: more files than rows (%ld > %ld): every file "
                        "needs at least one record\n",
                files > rows ? files : test_files, files > rows ? rows : test_rows);
        return 2;
    }
    j.s.n_cat = (int)cat;
    j.s.n_num = (int)num;
    if (parse_ids(&j, ids) < 0) {
        fprintf(stderr, "downpour data synth ctr: --ids '%s': expected one count or %ld counts "
                        "joined by ',', each in [1, %ld]\n", ids, cat, DP_CTR_MAX_IDS);
        return 2;
    }
    for (long f = cat - multi; f < cat; f++)
        j.s.places[f] = (int)places;
    j.s.zipf = zipf, j.s.id_scale = id_scale, j.s.num_scale = num_scale, j.s.bias = bias;
    j.s.seed = (uint64_t)seed;
    dp_err err;
    if (dp_ctr_synth_init(&j.s, &err) < 0) {
        fprintf(stderr, "downpour data synth ctr: %s\n", err.msg);
        return 2;
    }
    j.dir = to, j.name = name;
    j.rows[0] = rows, j.rows[1] = test_rows;
    j.files[0] = files, j.files[1] = test_files;
    j.width = dp_ctr_synth_width(&j.s);
    j.x = malloc((size_t)j.width * sizeof *j.x);
    int rc = 1, oom = !j.x;
    long n_ids = 0;
    for (int f = 0; f < j.s.n_cat && !oom; f++) {
        oom = !(j.seen[f] = calloc(((size_t)j.s.card[f] + 7) / 8, 1));
        n_ids += j.s.card[f];
    }
    j.have_info = !oom && n_ids <= MAX_INFO_IDS;
    for (int f = 0; f < j.s.n_cat && j.have_info; f++)
        j.have_info = (j.info[f] = calloc(j.s.card[f], sizeof(float))) != NULL;
    if (oom) {
        dp_errf(&err, "out of memory (a bit an id of each categorical feature, and a record)");
        goto out;
    }
    double t0 = dp_now();
    if (dp_dir_prepare(to, "--to", &err) < 0)
        goto out;
    if (!force) /* the first file of each split, and the description */
        for (int k = 0; k < 2; k++) {
            char path[4096];
            file_path(path, sizeof path, &j, k, 0, "features");
            if (access(path, F_OK) == 0) {
                dp_errf(&err, "%s exists: give --force to replace the set, or another --name "
                              "or --to", path);
                goto out;
            }
        }
    for (int k = 0; k < 2; k++)
        if ((j.npy                    ? write_npy(&j, k, &err)
             : j.fmt == FMT_TFRECORD ? write_tfrecord(&j, k, &err)
                                     : write_csv(&j, k, &err)) < 0)
            goto out;
    if (write_info(&j, &err) < 0)
        goto out;
    double secs = dp_now() - t0;
    printf("synthetic click-through set -> %s (%s): %d features a record (%d categorical, %d "
           "numeric)\n",
           to, format, j.width, j.s.n_cat, j.s.n_num);
    for (int k = 0; k < 2; k++)
        printf("%s: %ld records in %ld file(s), %llu bytes; click rate %.4f; the generating "
               "model's log loss %.6f (expected %.6f)\n",
               split_names[k], j.rows[k], j.npy ? 1 : j.files[k], (unsigned long long)j.bytes[k],
               j.clicks[k] / j.rows[k], j.logloss[k] / j.rows[k], j.entropy[k] / j.rows[k]);
    if (test_rows > 0)
        printf("test: the best a model trained on the training records can do, knowing every "
               "id they hold exactly and the others by their prior: log loss %.6f (expected "
               "%.6f)\n",
               j.seen_logloss / (double)test_rows, j.seen_expected / (double)test_rows);
    if (test_rows > 0 && j.have_info)
        printf("test: an estimate of the best a learner of them can do, each id's weight known "
               "to its Laplace posterior: log loss %.6f (expected %.6f)\n",
               j.bayes_logloss / (double)test_rows, j.bayes_expected / (double)test_rows);
    printf("described in %s/%s-synth.json; %.2f s (%.0f records/s)\n", to, name, secs,
           secs > 0 ? (rows + test_rows) / secs : 0.0);
    print_model(&j);
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "downpour data synth ctr: %s\n", err.msg);
    free(j.x);
    for (int f = 0; f < j.s.n_cat; f++) {
        free(j.seen[f]);
        free(j.info[f]);
    }
    return rc;
}

int cmd_data_synth(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        FILE *f = argc < 2 ? stderr : stdout;
        fprintf(f, "usage: downpour data synth KIND [OPTIONS]\n\nkinds:\n  ctr   a synthetic "
                   "click-through set ('downpour data synth ctr --help')\n");
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "ctr") == 0)
        return synth_ctr(argc - 1, argv + 1);
    fprintf(stderr, "downpour data synth: unknown kind '%s' (ctr)\n", argv[1]);
    return 2;
}
