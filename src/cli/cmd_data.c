/* downpour data: tools on dataset files (docs/datasets.md, "Converting and
 * inspecting").  `convert` writes an IDX or NumPy dataset as TFRecord shards
 * of tf.train.Example in TensorFlow Datasets' layout, so FILE sharding has
 * files to deal out; `inspect` (cmd_data_inspect.c) shows what a file holds.
 *
 * convert holds one record at a time: the IDX dataset is the mapped cache
 * (dataset.h), a NumPy array is read a chunk of rows at a time (npy.h), and
 * each record is encoded (PNG, then the Example) into buffers reused from one
 * record to the next and appended to the shard being written. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "downpour/clock.h"
#include "downpour/dataset.h"
#include "downpour/example.h"
#include "downpour/file.h"
#include "downpour/npy.h"
#include "downpour/png.h"
#include "downpour/status.h"
#include "downpour/tfrecord.h"

#define DATA_USAGE                                                                        \
    "downpour data SUBCOMMAND [OPTIONS]\n"                                                 \
    "\n"                                                                                   \
    "subcommands:\n"                                                                       \
    "  convert   write an IDX or NumPy dataset as TFRecord shards of tf.train.Example\n"   \
    "  inspect   print a TFRecord, .npy, .npz or CSV file's records, features and shapes\n" \
    "  synth     write a synthetic dataset (synth ctr: click-through records)\n"                \
    "\n"                                                                                   \
    "'downpour data SUBCOMMAND --help' lists its options (docs/datasets.md,\n"             \
    "\"Converting and inspecting\")."

#define CONVERT_USAGE                                                                        \
    "downpour data convert --from SRC --to DIR [--shards N] [--test-shards N] [--name NAME]\n" \
    "       [--encoding png|raw] [--gzip] [--force] [--limit N]\n"                            \
    "\n"                                                                                      \
    "SRC is a dataset name (mnist, fashion-mnist, kmnist), a directory of the four IDX\n"     \
    "files, an .npz holding x_train, y_train, x_test, y_test, or a directory of\n"            \
    "x_train.npy, y_train.npy, x_test.npy, y_test.npy.  Writes\n"                             \
    "DIR/NAME-train.tfrecord-00000-of-0000N ... and DIR/NAME-test.tfrecord-..., records\n"    \
    "in the source's order in contiguous blocks, each a tf.train.Example with \"image\"\n"    \
    "(PNG or raw bytes for uint8 data, a float_list otherwise) and \"label\" (int64).\n"      \
    "FILE sharding needs at least as many files as workers: --shards >= workers."

/* The TFDS naming of shards has five digits for the index and the total. */
#define MAX_SHARDS 99999
/* Rows of a NumPy array read per chunk: about this many bytes of floats. */
#define CHUNK_BYTES ((size_t)4 << 20)
/* Labels written must fit the dataset readers' class limit (records.h). */
#define MAX_CLASSES 256
/* Room for the Example's framing and the small features around the image. */
#define EXAMPLE_SLACK 4096

typedef enum encoding { ENC_PNG, ENC_RAW, ENC_COUNT } encoding;

typedef enum src_kind { SRC_IDX, SRC_NPZ, SRC_NPY_DIR } src_kind;

/* One split of the source, read record by record. */
typedef struct split_src {
    const char *name; /* "train" or "test" (TFDS's split names) */
    uint64_t n;       /* records to write (after --limit) */
    uint32_t height, width, channels;
    size_t dim;       /* values per record: height * width * channels */
    int is_bytes;     /* 1: uint8 pixels; 0: floats */
    /* IDX: views into the mapped dataset */
    const uint8_t *images, *labels;
    /* NumPy: the arrays and the chunk of rows [lo, hi) held below */
    dp_npy *x, *y;
    uint64_t lo, hi, chunk;
    float *xf;
    uint8_t *x8;
    uint32_t *yl;
} split_src;

typedef struct source {
    src_kind kind;
    dp_dataset ds;
    int ds_open;
    split_src split[2];
} source;

/* The options and buffers of one convert. */
typedef struct convert_job {
    const char *dir, *name;
    encoding enc;
    int gzip;
    long shards[2];
    dp_png_buf png;
    uint8_t *ex;
    size_t ex_cap;
    uint64_t bytes[2];
    long done[2]; /* shards of each split put in place (removed again on failure) */
} convert_job;

static const char *const encoding_names[ENC_COUNT] = {"png", "raw"};

static void shard_path(char *out, size_t cap, const convert_job *c, int split, long i)
{
    static const char *const names[2] = {"train", "test"};
    snprintf(out, cap, "%s/%s-%s.tfrecord-%05ld-of-%05ld%s", c->dir, c->name, names[split], i,
             c->shards[split], c->gzip ? ".gz" : "");
}

/* ---- the source ---- */

/* Shape of a NumPy image array (n, ...): (n, D) and (n,) are one row of D
 * pixels, (n, H, W) one channel, (n, H, W, C...) C channels. */
static int npy_shape(split_src *sp, const dp_npy_info *xi, const char *what, dp_err *err)
{
    sp->height = 1;
    sp->width = xi->ndim >= 2 ? 0 : 1;
    sp->channels = 1;
    if (xi->ndim == 2) {
        sp->width = (uint32_t)(xi->shape[1] > UINT32_MAX ? 0 : xi->shape[1]);
    } else if (xi->ndim >= 3) {
        uint64_t c = 1;
        for (int d = 3; d < xi->ndim; d++)
            c *= xi->shape[d]; /* bounded: row_elems below fits */
        if (xi->shape[1] > UINT32_MAX || xi->shape[2] > UINT32_MAX || c > UINT32_MAX)
            return dp_errf(err, "%s: rows of shape too large", what);
        sp->height = (uint32_t)xi->shape[1];
        sp->width = (uint32_t)xi->shape[2];
        sp->channels = (uint32_t)c;
    }
    sp->dim = (size_t)xi->row_elems;
    if (xi->row_elems == 0 || sp->width == 0 || sp->height == 0)
        return dp_errf(err, "%s: rows of %llu values (shape has a 0): nothing to write", what,
                       (unsigned long long)xi->row_elems);
    if (xi->row_elems > (DP_TFRECORD_MAX_RECORD - EXAMPLE_SLACK) / sizeof(float))
        return dp_errf(err, "%s: rows of %llu values make records above the readers' limit of "
                       "%zu bytes", what, (unsigned long long)xi->row_elems,
                       (size_t)DP_TFRECORD_MAX_RECORD);
    sp->is_bytes = xi->dtype == DP_NPY_U8;
    return 0;
}

static int open_npy_split(split_src *sp, const char *src, int npz, dp_err *err)
{
    char xp[1200], yp[1200], xm[32], ym[32];
    const char *xmember = NULL, *ymember = NULL;
    snprintf(xm, sizeof xm, "x_%s", sp->name);
    snprintf(ym, sizeof ym, "y_%s", sp->name);
    if (npz) {
        snprintf(xp, sizeof xp, "%s", src);
        snprintf(yp, sizeof yp, "%s", src);
        xmember = xm;
        ymember = ym;
    } else {
        snprintf(xp, sizeof xp, "%s/%s.npy", src, xm);
        snprintf(yp, sizeof yp, "%s/%s.npy", src, ym);
    }
    if (dp_npy_open(&sp->x, xp, xmember, err) < 0 || dp_npy_open(&sp->y, yp, ymember, err) < 0)
        return -1;
    const dp_npy_info *xi = dp_npy_get_info(sp->x), *yi = dp_npy_get_info(sp->y);
    char what[1300];
    snprintf(what, sizeof what, npz ? "%s (member %s)" : "%s", npz ? src : xp, xm);
    if (xi->rows != yi->rows)
        return dp_errf(err, "%s has %llu rows but %s has %llu: images and labels must pair up",
                       what, (unsigned long long)xi->rows, ym, (unsigned long long)yi->rows);
    if (npy_shape(sp, xi, what, err) < 0)
        return -1;
    sp->n = xi->rows;
    sp->chunk = CHUNK_BYTES / (sp->dim * sizeof(float));
    if (sp->chunk < 1)
        sp->chunk = 1;
    if (sp->chunk > 4096)
        sp->chunk = 4096;
    sp->xf = malloc(sp->chunk * sp->dim * sizeof *sp->xf);
    sp->x8 = sp->is_bytes ? malloc(sp->chunk * sp->dim) : NULL;
    sp->yl = malloc(sp->chunk * sizeof *sp->yl);
    if (!sp->xf || !sp->yl || (sp->is_bytes && !sp->x8))
        return dp_errf(err, "%s: out of memory for a chunk of %llu rows", what,
                       (unsigned long long)sp->chunk);
    return 0;
}

static int has_npy_pair(const char *dir)
{
    char p[1200];
    struct stat st;
    snprintf(p, sizeof p, "%s/x_train.npy", dir);
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int source_open(source *s, const char *src, dp_err *err)
{
    struct stat st;
    s->split[0].name = "train";
    s->split[1].name = "test";
    int is_file = stat(src, &st) == 0 && S_ISREG(st.st_mode);
    if (is_file || (stat(src, &st) == 0 && S_ISDIR(st.st_mode) && has_npy_pair(src))) {
        s->kind = is_file ? SRC_NPZ : SRC_NPY_DIR;
        for (int k = 0; k < 2; k++)
            if (open_npy_split(&s->split[k], src, is_file, err) < 0)
                return -1;
        return 0;
    }
    s->kind = SRC_IDX;
    if (dp_dataset_open(&s->ds, src, err) < 0)
        return -1;
    s->ds_open = 1;
    const dp_split *d[2] = {&s->ds.train_all, &s->ds.test};
    for (int k = 0; k < 2; k++) {
        split_src *sp = &s->split[k];
        sp->images = d[k]->images;
        sp->labels = d[k]->labels;
        sp->n = d[k]->n;
        sp->height = s->ds.rows;
        sp->width = s->ds.cols;
        sp->channels = 1;
        sp->dim = d[k]->dim;
        sp->is_bytes = 1;
    }
    return 0;
}

static void source_close(source *s)
{
    for (int k = 0; k < 2; k++) {
        split_src *sp = &s->split[k];
        dp_npy_close(sp->x);
        dp_npy_close(sp->y);
        free(sp->xf);
        free(sp->x8);
        free(sp->yl);
    }
    if (s->ds_open)
        dp_dataset_close(&s->ds);
}

/* Record i of a split: its pixels (bytes) or values (floats) and its label. */
static int record_at(split_src *sp, uint64_t i, const uint8_t **pix, const float **vals,
                     int64_t *label, dp_err *err)
{
    if (sp->images) {
        *pix = sp->images + (size_t)i * sp->dim;
        *label = sp->labels[i];
        return 0;
    }
    if (i < sp->lo || i >= sp->hi) {
        uint64_t hi = i + sp->chunk < sp->n ? i + sp->chunk : sp->n;
        sp->lo = sp->hi = 0;
        if (dp_npy_read_f32(sp->x, i, hi, sp->xf, err) < 0 ||
            dp_npy_read_labels(sp->y, i, hi, MAX_CLASSES, sp->yl, err) < 0)
            return -1;
        if (sp->is_bytes) /* uint8 read as floats is exact: back to bytes */
            for (size_t k = 0; k < (size_t)(hi - i) * sp->dim; k++)
                sp->x8[k] = (uint8_t)sp->xf[k];
        sp->lo = i;
        sp->hi = hi;
    }
    size_t off = (size_t)(i - sp->lo);
    *pix = sp->is_bytes ? sp->x8 + off * sp->dim : NULL;
    *vals = sp->xf + off * sp->dim;
    *label = sp->yl[off];
    return 0;
}

/* ---- the output ---- */

static int name_is_ours(const char *entry, const char *name)
{
    size_t n = strlen(name);
    return strncmp(entry, name, n) == 0 && entry[n] == '-' && strstr(entry + n, ".tfrecord");
}

/* Refuses a directory that already holds NAME-*.tfrecord* files, naming one
 * (--force: they are replaced, and those the new set does not overwrite are
 * removed once it is complete). */
static int check_existing(const convert_job *c, int force, dp_err *err)
{
    if (force)
        return 0;
    DIR *d = opendir(c->dir);
    if (!d)
        return dp_errf(err, "--to %s: %s", c->dir, strerror(errno));
    struct dirent *e;
    char first[512] = "";
    long count = 0;
    while ((e = readdir(d)) != NULL)
        if (name_is_ours(e->d_name, c->name) && (count++ == 0 || strcmp(e->d_name, first) < 0))
            snprintf(first, sizeof first, "%s", e->d_name); /* the first by name, not by disk order */
    closedir(d);
    if (count == 1)
        return dp_errf(err, "%s/%s exists: pass --force to replace it, or choose another --to "
                       "or --name", c->dir, first);
    if (count > 1)
        return dp_errf(err, "%s/%s exists (and %ld more %s-*.tfrecord* files): pass --force to "
                       "replace them, or choose another --to or --name", c->dir, first,
                       count - 1, c->name);
    return 0;
}

/* Whether entry is one of the shards this convert wrote. */
static int is_new_shard(const convert_job *c, const char *entry)
{
    char path[1400];
    for (int k = 0; k < 2; k++) {
        static const char *const names[2] = {"train", "test"};
        char prefix[600];
        int n = snprintf(prefix, sizeof prefix, "%s-%s.tfrecord-", c->name, names[k]);
        if (strncmp(entry, prefix, (size_t)n) != 0)
            continue;
        char *end;
        long i = strtol(entry + n, &end, 10);
        if (end == entry + n || i < 0 || i >= c->shards[k])
            continue;
        shard_path(path, sizeof path, c, k, i);
        const char *base = strrchr(path, '/');
        if (strcmp(base ? base + 1 : path, entry) == 0)
            return 1;
    }
    return 0;
}

/* After a complete convert with --force: the old NAME-*.tfrecord* files the
 * new set did not replace go, so a reader of DIR sees the new set alone. */
static long remove_stale(const convert_job *c)
{
    DIR *d = opendir(c->dir);
    if (!d)
        return 0;
    long removed = 0;
    struct dirent *e;
    char path[1400];
    while ((e = readdir(d)) != NULL)
        if (name_is_ours(e->d_name, c->name) && !is_new_shard(c, e->d_name)) {
            snprintf(path, sizeof path, "%s/%s", c->dir, e->d_name);
            if (unlink(path) == 0)
                removed++;
            else
                fprintf(stderr, "downpour data convert: warning: cannot remove old %s: %s\n",
                        path, strerror(errno));
        }
    closedir(d);
    return removed;
}

/* Encodes record i of a split as an Example into c->ex; returns its length (0 on error). */
static size_t encode_record(convert_job *c, split_src *sp, uint64_t i, dp_err *err)
{
    const uint8_t *pix = NULL;
    const float *vals = NULL;
    int64_t label, height = sp->height, width = sp->width, channels = sp->channels;
    if (record_at(sp, i, &pix, &vals, &label, err) < 0)
        return 0;
    dp_bytes image;
    dp_feature f[5];
    size_t nf = 0;
    int raw = sp->is_bytes && c->enc == ENC_RAW;
    if (raw && channels > 1)
        f[nf++] = (dp_feature){"channels", DP_FEATURE_INT64, 1, NULL, NULL, &channels};
    if (raw)
        f[nf++] = (dp_feature){"height", DP_FEATURE_INT64, 1, NULL, NULL, &height};
    if (!sp->is_bytes) {
        f[nf++] = (dp_feature){DP_EXAMPLE_IMAGE, DP_FEATURE_FLOAT, sp->dim, NULL, vals, NULL};
    } else if (raw) {
        image = (dp_bytes){pix, sp->dim};
        f[nf++] = (dp_feature){DP_EXAMPLE_IMAGE, DP_FEATURE_BYTES, 1, &image, NULL, NULL};
    } else {
        if (dp_png_encode(&c->png, pix, sp->height, sp->width, (int)sp->channels, err) < 0) {
            dp_err_prefix(err, "%s record %llu%s", sp->name, (unsigned long long)i,
                          sp->channels > 4 ? " (PNG holds 1 to 4 channels: use --encoding raw)"
                                           : "");
            return 0;
        }
        image = (dp_bytes){c->png.data, c->png.len};
        f[nf++] = (dp_feature){DP_EXAMPLE_IMAGE, DP_FEATURE_BYTES, 1, &image, NULL, NULL};
    }
    f[nf++] = (dp_feature){DP_EXAMPLE_LABEL, DP_FEATURE_INT64, 1, NULL, NULL, &label};
    if (raw)
        f[nf++] = (dp_feature){"width", DP_FEATURE_INT64, 1, NULL, NULL, &width};
    size_t len = dp_example_encoded_size(f, nf);
    if (len > DP_TFRECORD_MAX_RECORD) {
        dp_errf(err, "%s record %llu: an Example of %zu bytes is above the readers' limit of "
                "%zu", sp->name, (unsigned long long)i, len, (size_t)DP_TFRECORD_MAX_RECORD);
        return 0;
    }
    if (len > c->ex_cap) {
        uint8_t *p = realloc(c->ex, len);
        if (!p) {
            dp_errf(err, "%s record %llu: out of memory for %zu bytes", sp->name,
                    (unsigned long long)i, len);
            return 0;
        }
        c->ex = p;
        c->ex_cap = len;
    }
    return dp_example_encode(c->ex, f, nf);
}

/* Writes split k as c->shards[k] files, shard s holding records
 * [s*n/N, (s+1)*n/N): read in name order they give the source's order. */
static int write_split(convert_job *c, split_src *sp, int k, dp_err *err)
{
    char path[1400];
    long shards = c->shards[k];
    for (long s = 0; s < shards; s++) {
        uint64_t lo = sp->n * (uint64_t)s / (uint64_t)shards;
        uint64_t hi = sp->n * (uint64_t)(s + 1) / (uint64_t)shards;
        shard_path(path, sizeof path, c, k, s);
        dp_tfrecord_writer *w;
        if (dp_tfrecord_writer_open(&w, path, DP_TFRECORD_AUTO, err) < 0)
            return -1;
        for (uint64_t i = lo; i < hi; i++) {
            size_t len = encode_record(c, sp, i, err);
            if (len == 0 || dp_tfrecord_write(w, c->ex, len, err) < 0) {
                dp_tfrecord_writer_abort(w);
                return -1;
            }
        }
        if (dp_tfrecord_writer_close(w, err) < 0)
            return -1;
        c->done[k]++;
        struct stat st;
        if (stat(path, &st) == 0)
            c->bytes[k] += (uint64_t)st.st_size;
    }
    return 0;
}

/* A failed convert takes back the shards it had put in place: a half set
 * would read as a complete, smaller dataset. */
static void remove_written(const convert_job *c)
{
    char path[1400];
    long removed = 0;
    for (int k = 0; k < 2; k++)
        for (long s = 0; s < c->done[k]; s++) {
            shard_path(path, sizeof path, c, k, s);
            removed += unlink(path) == 0;
        }
    if (removed)
        fprintf(stderr, "downpour data convert: removed the %ld shard(s) already written\n",
                removed);
}

/* The source's base name: "mnist" for mnist, data/mnist/ and data/mnist.npz. */
static void default_name(char *out, size_t cap, const char *src)
{
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", src);
    size_t n = strlen(tmp);
    while (n > 1 && tmp[n - 1] == '/')
        tmp[--n] = '\0';
    const char *base = strrchr(tmp, '/');
    base = base && base[1] ? base + 1 : tmp;
    size_t bl = strlen(base) < cap ? strlen(base) : cap - 1;
    memcpy(out, base, bl);
    out[bl] = '\0';
    char *dot = strrchr(out, '.');
    if (dot && dot != out && (strcmp(dot, ".npz") == 0 || strcmp(dot, ".npy") == 0))
        *dot = '\0';
}

static void print_split(const convert_job *c, const split_src *sp, int k)
{
    char first[1400], last[1400];
    shard_path(first, sizeof first, c, k, 0);
    shard_path(last, sizeof last, c, k, c->shards[k] - 1);
    printf("%s: %llu records in %ld shard%s, %llu bytes (%s%s%s)\n", sp->name,
           (unsigned long long)sp->n, c->shards[k], c->shards[k] == 1 ? "" : "s",
           (unsigned long long)c->bytes[k], first, c->shards[k] > 1 ? " ... " : "",
           c->shards[k] > 1 ? strrchr(last, '/') + 1 : "");
}

static int convert(int argc, char **argv)
{
    const char *from = NULL, *to = NULL, *name = NULL, *enc_name = "png";
    long shards = 1, test_shards = 1, limit = 0;
    bool gzip = false, force = false;
    const cli_opt opts[] = {
        {"from", CLI_STR, &from, "SRC", "dataset name, IDX directory, .npz, or directory of .npy", 0, 0},
        {"to", CLI_STR, &to, "DIR", "output directory (made if missing)", 0, 0},
        {"shards", CLI_INT, &shards, "N", "training files to write", 1, MAX_SHARDS},
        {"test-shards", CLI_INT, &test_shards, "N", "test files to write", 1, MAX_SHARDS},
        {"name", CLI_STR, &name, "NAME", "file name prefix (default: SRC's base name)", 0, 0},
        {"encoding", CLI_STR, &enc_name, "png|raw",
         "uint8 images as PNG (as TFDS writes MNIST) or raw bytes with height and width", 0, 0},
        {"gzip", CLI_FLAG, &gzip, NULL, "gzip the files (names end in .gz)", 0, 0},
        {"force", CLI_FLAG, &force, NULL, "replace existing NAME-*.tfrecord* files in DIR", 0, 0},
        {"limit", CLI_INT, &limit, "N", "only the first N records of each split (0: all)", 0,
         UINT32_MAX},
    };
    int rest;
    int r = cli_parse(CONVERT_USAGE, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, &rest);
    if (r != 0)
        return r > 0 ? 0 : 2;
    if (rest < argc) {
        fprintf(stderr, "downpour data convert: unexpected argument '%s' (see --help)\n",
                argv[rest]);
        return 2;
    }
    if (!from || !to) {
        fprintf(stderr, "downpour data convert: %s is required\n", !from ? "--from SRC" : "--to DIR");
        return 2;
    }
    convert_job c;
    memset(&c, 0, sizeof c);
    c.enc = ENC_COUNT;
    for (int e = 0; e < ENC_COUNT; e++)
        if (strcmp(enc_name, encoding_names[e]) == 0)
            c.enc = (encoding)e;
    if (c.enc == ENC_COUNT) {
        fprintf(stderr, "downpour data convert: --encoding '%s': expected png or raw\n", enc_name);
        return 2;
    }
    char name_buf[256];
    if (!name) {
        default_name(name_buf, sizeof name_buf, from);
        name = name_buf;
    }
    if (!*name || strchr(name, '/') || strlen(name) > 200 || name[0] == '.') {
        fprintf(stderr, "downpour data convert: --name '%s': a file name prefix, without '/', "
                "not starting with '.', at most 200 bytes\n", name);
        return 2;
    }
    c.dir = to;
    c.name = name;
    c.gzip = gzip;
    c.shards[0] = shards;
    c.shards[1] = test_shards;

    dp_err err;
    source s;
    memset(&s, 0, sizeof s);
    int rc = 1;
    double t0 = dp_now();
    if (dp_dir_prepare(to, "--to", &err) < 0 || check_existing(&c, force, &err) < 0 ||
        source_open(&s, from, &err) < 0)
        goto out;
    static const char *const flag[2] = {"--shards", "--test-shards"};
    for (int k = 0; k < 2; k++) {
        split_src *sp = &s.split[k];
        if (limit > 0 && sp->n > (uint64_t)limit)
            sp->n = (uint64_t)limit;
        if ((uint64_t)c.shards[k] > sp->n) {
            dp_errf(&err, "%s %ld is more than the %llu %s records of %s: every shard needs at "
                    "least one", flag[k], c.shards[k], (unsigned long long)sp->n, sp->name, from);
            goto out;
        }
        if (sp->is_bytes && c.enc == ENC_PNG &&
            (sp->channels > 4 || sp->height > DP_PNG_MAX_SIDE || sp->width > DP_PNG_MAX_SIDE)) {
            dp_errf(&err, "%s: %s images of %ux%u with %u channels do not fit a PNG (sides up to "
                    "%d, 1 to 4 channels): use --encoding raw", from, sp->name, sp->height,
                    sp->width, sp->channels, DP_PNG_MAX_SIDE);
            goto out;
        }
    }
    for (int k = 0; k < 2; k++)
        if (write_split(&c, &s.split[k], k, &err) < 0) {
            remove_written(&c);
            goto out;
        }
    double secs = dp_now() - t0;
    long stale = force ? remove_stale(&c) : 0;
    const char *kind = s.split[0].is_bytes ? encoding_names[c.enc] : "float_list";
    printf("%s -> %s (%s%s)\n", from, to, kind, gzip ? ", gzip" : "");
    for (int k = 0; k < 2; k++)
        print_split(&c, &s.split[k], k);
    uint64_t n = s.split[0].n + s.split[1].n;
    printf("total: %llu records, %llu bytes in %.2f s (%.0f records/s)\n", (unsigned long long)n,
           (unsigned long long)(c.bytes[0] + c.bytes[1]), secs, secs > 0 ? (double)n / secs : 0.0);
    if (stale)
        printf("removed %ld old %s-*.tfrecord* file(s) the new set did not replace\n", stale,
               name);
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "downpour data convert: %s\n", err.msg);
    source_close(&s);
    dp_png_buf_free(&c.png);
    free(c.ex);
    return rc;
}

int cmd_data(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s\n", DATA_USAGE);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        printf("usage: %s\n", DATA_USAGE);
        return 0;
    }
    if (strcmp(argv[1], "convert") == 0)
        return convert(argc - 1, argv + 1);
    if (strcmp(argv[1], "inspect") == 0)
        return cmd_data_inspect(argc - 1, argv + 1);
    if (strcmp(argv[1], "synth") == 0)
        return cmd_data_synth(argc - 1, argv + 1);
    fprintf(stderr, "downpour data: unknown subcommand '%s' (convert, inspect, synth)\n", argv[1]);
    return 2;
}
