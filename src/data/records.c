/* Reading one file of a dataset of record files, record after record, over
 * the format readers: tfrecord.c + example.c + png.c, npy.c, csv.c (the
 * contract is include/downpour/records.h; docs/datasets.md, "Datasets of
 * files").  Every refusal is "FILE: record N: why", N counted from 0 in the
 * file, whichever reader found the fault. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/csv.h"
#include "downpour/example.h"
#include "downpour/npy.h"
#include "downpour/png.h"
#include "downpour/tfrecord.h"
#include "records_impl.h"

/* Rows of an .npy pair read at once: a few hundred MNIST images per pread,
 * and a bounded buffer whatever the array's size. */
#define NPY_BUF_BYTES ((size_t)256 << 10)

/* What libpng takes while it decodes one image (png.c), counted rather than
 * asked: its read and info structs (about 2 KiB), zlib's inflate state
 * (about 7 KiB) and window (up to 32 KiB) and libpng's 8 KiB IDAT buffer,
 * rounded up to 48 KiB; beside them two rows and the row pointers
 * (png_decode_bytes).  A PNG's ancillary chunks (text, profiles: up to
 * 1 MiB each, png.c's CHUNK_MALLOC_MAX) are not counted. */
#define PNG_DECODE_FIXED ((size_t)48 << 10)

struct dp_record_reader {
    dp_data_format format;
    dp_record_shape shape;
    char *where;        /* the features' file, for messages ("x.npz (member x_train)") */
    char *labels_where; /* npy: the labels' file */
    char *path, *labels_path; /* the files alone: the head of npy.c's messages */
    char *image, *label; /* feature names (copied: the caller's options may go) */
    uint32_t classes;
    uint64_t index;     /* of the next record */
    /* tfrecord */
    dp_tfrecord_reader *tf;
    dp_example *ex;
    int png;            /* a record was a PNG: its decoding is counted */
    size_t limit;       /* dp_record_limit's cap on the bytes held; 0: none */
    /* npy */
    dp_npy *x, *y;
    uint64_t rows;
    uint8_t *buf;       /* chunk_rows records' features, NULL when reading straight */
    uint32_t *lbuf;     /* their labels */
    uint64_t chunk_rows, buf_lo, buf_hi;
    uint64_t single_until; /* rows before it are read one at a time (see npy_next) */
    /* csv */
    dp_csv *csv;
    float *scratch;     /* a row skipped */
    /* TFRecord's named columns (records.h, dp_data_options.categorical) */
    struct named_col *cols;
    size_t n_cols, n_feat;
    uint32_t buckets;
};

/* A named feature of an Example: places > 0 categorical (int64 ids, or any
 * bytes under hashing), 0 numeric (one number). */
typedef struct named_col {
    char *name;
    int places;
    uint32_t limit;
    /* an .npz's array of the column (npz_named_*): its values a row, and a
     * chunk of rows (int64 ids, or float numbers) */
    dp_npy *arr;
    int width;
    void *chunk;
} named_col;

#define NPZ_NAMED_CHUNK 1024 /* rows of every column read at once */


static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

/* "where: record N: why". */
static int rec_errf(dp_err *err, const char *where, uint64_t index, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int rec_errf(dp_err *err, const char *where, uint64_t index, const char *fmt, ...)
{
    if (!err)
        return -1;
    char why[DP_ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    snprintf(err->msg, sizeof err->msg, "%s: record %llu: %.400s", where,
             (unsigned long long)index, why);
    return -1;
}

/* Rewrites a reader's message as "where: record N: why", dropping the
 * reader's own "path...: " head when it names the same file. */
static int rec_wrap(dp_err *err, const char *path, const char *where, uint64_t index)
{
    if (!err)
        return -1;
    char why[DP_ERR_MAX];
    const char *m = err->msg;
    size_t pl = strlen(path);
    if (pl > 0 && strncmp(m, path, pl) == 0) {
        const char *colon = strstr(m + pl, ": ");
        if (colon)
            m = colon + 2;
    }
    snprintf(why, sizeof why, "%s", m);
    return rec_errf(err, where, index, "%s", why);
}

/* ---- TFRecord of tf.train.Example ---- */

static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

static int is_png(const dp_bytes *b)
{
    return b->len >= sizeof png_sig && memcmp(b->data, png_sig, sizeof png_sig) == 0;
}

/* The one value of an int64 feature, if ex has it so. */
static int int64_one(const dp_example *ex, const char *name, int64_t *v)
{
    const dp_feature *f = dp_example_find(ex, name);
    if (!f || f->kind != DP_FEATURE_INT64 || f->count != 1)
        return 0;
    *v = f->int64s[0];
    return 1;
}

static const dp_feature *find_image(dp_record_reader *r, dp_err *err)
{
    const dp_feature *f = dp_example_find(r->ex, r->image);
    if (!f) {
        char names[200] = "";
        size_t at = 0, n = dp_example_count(r->ex);
        for (size_t i = 0; i < n && at < sizeof names - 1; i++) {
            int w = snprintf(names + at, sizeof names - at, "%s\"%s\"", i ? ", " : "",
                             dp_example_feature(r->ex, i)->name);
            at += w > 0 ? (size_t)w : 0;
        }
        rec_errf(err, r->where, r->index, "no feature \"%s\" (the Example has %s)", r->image,
                 n ? names : "no features");
        return NULL;
    }
    if (f->kind == DP_FEATURE_NONE || (f->kind == DP_FEATURE_BYTES && f->count != 1) ||
        f->count == 0) {
        rec_errf(err, r->where, r->index, "feature \"%s\" is a %s of %zu values; expected one "
                 "image (bytes) or a list of numbers", r->image, dp_feature_kind_name(f->kind),
                 f->count);
        return NULL;
    }
    return f;
}

static int named_features(dp_record_reader *r, float *out, dp_err *err);

/* The shape the image feature of the decoded record gives. */
static int tf_shape(dp_record_reader *r, dp_record_shape *s, dp_err *err)
{
    if (r->cols) { /* named features: their values, as floats */
        memset(s, 0, sizeof *s);
        s->kind = DP_VALUES_F32;
        s->rows = s->channels = 1;
        s->cols = s->dim = (uint32_t)r->n_feat;
        return 0;
    }
    const dp_feature *f = find_image(r, err);
    if (!f)
        return -1;
    memset(s, 0, sizeof *s);
    s->channels = 1;
    s->rows = 1;
    if (f->kind == DP_FEATURE_BYTES) {
        const dp_bytes *b = &f->bytes[0];
        s->kind = DP_VALUES_U8;
        if (is_png(b)) {
            dp_png_info info;
            if (dp_png_info_read(&info, b->data, b->len, err) != 0)
                return rec_wrap(err, "", r->where, r->index);
            s->rows = info.height;
            s->cols = info.width;
            s->channels = (uint32_t)info.channels;
        } else {
            int64_t h, w;
            if (b->len == 0 || b->len > UINT32_MAX)
                return rec_errf(err, r->where, r->index, "feature \"%s\" holds %zu bytes",
                                r->image, b->len);
            if (int64_one(r->ex, "height", &h) && int64_one(r->ex, "width", &w)) {
                /* Each side bounded by the bytes first: 2^32 x 2^32 would
                 * wrap the product to 0 (a division by zero). */
                if (h <= 0 || w <= 0 || (uint64_t)h > b->len ||
                    (uint64_t)w > b->len / (uint64_t)h ||
                    (uint64_t)b->len % ((uint64_t)h * (uint64_t)w) != 0)
                    return rec_errf(err, r->where, r->index, "feature \"%s\" holds %zu bytes, "
                                    "not a whole number of height x width = %lld x %lld "
                                    "pixels", r->image, b->len, (long long)h, (long long)w);
                s->rows = (uint32_t)h;
                s->cols = (uint32_t)w;
                s->channels = (uint32_t)(b->len / ((size_t)h * (size_t)w));
            } else {
                uint32_t q = (uint32_t)sqrt((double)b->len);
                while ((uint64_t)q * q > b->len)
                    q--;
                while ((uint64_t)(q + 1) * (q + 1) <= b->len)
                    q++;
                if ((uint64_t)q * q == b->len)
                    s->rows = s->cols = q;
                else
                    s->cols = (uint32_t)b->len;
            }
        }
    } else {
        if (f->count > UINT32_MAX)
            return rec_errf(err, r->where, r->index, "feature \"%s\" has %zu values", r->image,
                            f->count);
        s->kind = DP_VALUES_F32;
        s->cols = (uint32_t)f->count;
    }
    uint64_t dim = (uint64_t)s->rows * s->cols * s->channels;
    if (dim == 0 || dim > UINT32_MAX)
        return rec_errf(err, r->where, r->index, "feature \"%s\": %u x %u x %u values", r->image,
                        s->rows, s->cols, s->channels);
    s->dim = (uint32_t)dim;
    return 0;
}

static int tf_label(dp_record_reader *r, uint8_t *label, dp_err *err)
{
    const dp_feature *f = dp_example_find(r->ex, r->label);
    if (!f)
        return rec_errf(err, r->where, r->index, "no feature \"%s\" (the label)", r->label);
    double v;
    if (f->kind == DP_FEATURE_INT64 && f->count == 1) {
        if (f->int64s[0] < 0 || f->int64s[0] >= (int64_t)r->classes)
            return rec_errf(err, r->where, r->index, "feature \"%s\": label %lld is not in "
                            "[0, %u)", r->label, (long long)f->int64s[0], r->classes);
        *label = (uint8_t)f->int64s[0];
        return 0;
    }
    if (f->kind != DP_FEATURE_FLOAT || f->count != 1)
        return rec_errf(err, r->where, r->index, "feature \"%s\" is a %s of %zu values; the "
                        "label is one int64 (or an integral float)", r->label,
                        dp_feature_kind_name(f->kind), f->count);
    v = f->floats[0];
    if (!(v >= 0 && v < r->classes) || v != floor(v))
        return rec_errf(err, r->where, r->index, "feature \"%s\": label %g is not an integer in "
                        "[0, %u)", r->label, v, r->classes);
    *label = (uint8_t)v;
    return 0;
}

static const char *kind_str(const dp_feature *f)
{
    return f->kind == DP_FEATURE_BYTES ? "bytes (uint8)" : "a number list (float32)";
}

static int tf_features(dp_record_reader *r, void *out, dp_err *err)
{
    if (r->cols) {
        if (r->shape.kind != DP_VALUES_F32 || r->shape.dim != r->n_feat)
            return rec_errf(err, r->where, r->index, "%zu named values, the dataset's first "
                            "record has %u", r->n_feat, r->shape.dim);
        return named_features(r, out, err);
    }
    const dp_feature *f = find_image(r, err);
    if (!f)
        return -1;
    const dp_record_shape *s = &r->shape;
    dp_value_kind k = f->kind == DP_FEATURE_BYTES ? DP_VALUES_U8 : DP_VALUES_F32;
    if (k != s->kind)
        return rec_errf(err, r->where, r->index, "feature \"%s\" is %s, the dataset's first "
                        "record has %s values", r->image, kind_str(f), dp_value_kind_name(s->kind));
    if (f->kind == DP_FEATURE_BYTES) {
        const dp_bytes *b = &f->bytes[0];
        if (!is_png(b)) {
            if (b->len != s->dim)
                return rec_errf(err, r->where, r->index, "feature \"%s\" holds %zu bytes, the "
                                "dataset's first record has %u", r->image, b->len, s->dim);
            memcpy(out, b->data, b->len);
            return 0;
        }
        dp_png_info info;
        if (dp_png_info_read(&info, b->data, b->len, err) != 0)
            return rec_wrap(err, "", r->where, r->index);
        r->png = 1;
        if (info.width != s->cols || info.height != s->rows)
            return rec_errf(err, r->where, r->index, "feature \"%s\": PNG of %ux%u pixels, the "
                            "dataset's first record has %ux%u", r->image, info.width,
                            info.height, s->cols, s->rows);
        if ((uint32_t)info.channels != s->channels)
            return rec_errf(err, r->where, r->index, "feature \"%s\": PNG of %d channels, the "
                            "dataset's first record has %u", r->image, info.channels,
                            s->channels);
        if (dp_png_decode(out, b->data, b->len, s->rows, s->cols, (int)s->channels, err) != 0) {
            char why[DP_ERR_MAX];
            snprintf(why, sizeof why, "%s", err->msg);
            return rec_errf(err, r->where, r->index, "feature \"%s\": %.400s", r->image, why);
        }
        return 0;
    }
    if (f->count != s->dim)
        return rec_errf(err, r->where, r->index, "feature \"%s\" has %zu values, the dataset's "
                        "first record has %u", r->image, f->count, s->dim);
    float *o = out;
    if (f->kind == DP_FEATURE_FLOAT) {
        memcpy(o, f->floats, f->count * sizeof *o);
    } else {
        for (size_t i = 0; i < f->count; i++)
            o[i] = (float)f->int64s[i];
    }
    return 0;
}

/* Reads and decodes the next Example: 1, 0 at the end, -1. */
/* The next record's data may take the record buffer up to what
 * dp_record_limit's cap leaves beside the rest the reader holds; a longer
 * record is refused by tfrecord.c, naming it, before it is read. */
static void tf_limit(dp_record_reader *r)
{
    if (!r->limit)
        return;
    size_t rest = dp_record_reader_bytes(r) - dp_tfrecord_record_capacity(r->tf);
    size_t room = r->limit > rest ? r->limit - rest : 1;
    dp_tfrecord_set_max_record(r->tf, room < DP_TFRECORD_MAX_RECORD ? room : DP_TFRECORD_MAX_RECORD);
}

static int tf_read(dp_record_reader *r, dp_err *err)
{
    const uint8_t *data;
    size_t len;
    tf_limit(r);
    int rc = dp_tfrecord_next(r->tf, &data, &len, err);
    if (rc <= 0)
        return rc; /* tfrecord.c's messages name the file and the record */
    if (dp_example_decode(r->ex, data, len, err) != 0)
        return rec_wrap(err, "", r->where, r->index);
    return 1;
}

static int tf_next(dp_record_reader *r, void *features, uint8_t *label, dp_err *err)
{
    int rc = tf_read(r, err);
    if (rc <= 0)
        return rc;
    if (tf_features(r, features, err) != 0 || tf_label(r, label, err) != 0)
        return -1;
    r->index++;
    return 1;
}

/* One list of named features into r->cols. */
static int named_list(dp_record_reader *r, const char *text, int cat, const dp_data_options *o,
                      dp_err *err)
{
    const char *flag = cat ? "--categorical" : "--numeric";
    dp_data_column it;
    int rc;
    while ((rc = dp_data_column_next(&text, cat, &it)) != 0) {
        if (rc < 0)
            return dp_errf(err, "%s: %s '%.*s': expected NAME, or NAME:M with M ids in [1, "
                           "%d]", r->where, flag, (int)it.item_len, it.item, DP_DATA_MAX_PLACES);
        size_t nl = it.name_len;
        named_col *c = &r->cols[r->n_cols];
        c->name = malloc(nl + 1);
        if (!c->name)
            return dp_errf(err, "%s: out of memory", r->where);
        memcpy(c->name, it.name, nl);
        c->name[nl] = '\0';
        size_t k = 0; /* its place among the categorical ones */
        for (size_t i = 0; i < r->n_cols; i++)
            k += r->cols[i].places > 0;
        c->places = it.places;
        c->limit = cat && o->id_limits && k < o->n_id_limits ? o->id_limits[k] : DP_DATA_ID_LIMIT;
        for (size_t i = 0; i < r->n_cols; i++)
            if (strcmp(r->cols[i].name, c->name) == 0) {
                dp_errf(err, "%s: feature \"%s\" is named twice (%s)", r->where, c->name, flag);
                free(c->name);
                return -1;
            }
        r->n_cols++;
        r->n_feat += cat ? (size_t)it.places : 1;
    }
    return 0;
}

static int named_open(dp_record_reader *r, const dp_data_options *o, dp_err *err)
{
    if (!o->categorical && !o->numeric)
        return 0;
    size_t n = 2;
    for (const char *lists[2] = {o->categorical, o->numeric}, **l = lists; l < lists + 2; l++)
        for (const char *q = *l; q && *q; q++)
            n += *q == ',';
    r->cols = calloc(n, sizeof *r->cols);
    if (!r->cols)
        return dp_errf(err, "%s: out of memory", r->where);
    r->buckets = o->hash_buckets;
    if ((o->categorical && named_list(r, o->categorical, 1, o, err) < 0) ||
        (o->numeric && named_list(r, o->numeric, 0, o, err) < 0))
        return -1;
    if (r->n_feat == 0 || r->n_feat > UINT32_MAX)
        return dp_errf(err, "%s: --categorical and --numeric name no feature", r->where);
    return 0;
}

/* The named features of the decoded Example into out (r->n_feat floats). */
static int named_features(dp_record_reader *r, float *out, dp_err *err)
{
    size_t k = 0;
    for (size_t j = 0; j < r->n_cols; j++) {
        const named_col *c = &r->cols[j];
        const char *flag = c->places ? "--categorical" : "--numeric";
        const dp_feature *f = dp_example_find(r->ex, c->name);
        if (!f)
            return rec_errf(err, r->where, r->index, "no feature \"%s\" (%s)", c->name, flag);
        if (!c->places) {
            if ((f->kind != DP_FEATURE_FLOAT && f->kind != DP_FEATURE_INT64) || f->count != 1)
                return rec_errf(err, r->where, r->index, "feature \"%s\" is a %s of %zu values; "
                                "a numeric feature is one number", c->name,
                                dp_feature_kind_name(f->kind), f->count);
            out[k] = f->kind == DP_FEATURE_FLOAT ? f->floats[0] : (float)f->int64s[0];
            if (!isfinite(out[k])) /* as a CSV cell's or an .npz column's */
                return rec_errf(err, r->where, r->index, "feature \"%s\": %g is not a finite "
                                "number; clean the data", c->name, (double)out[k]);
            k++;
            continue;
        }
        int bytes_ok = r->buckets && f->kind == DP_FEATURE_BYTES;
        if (f->kind != DP_FEATURE_INT64 && !bytes_ok && !(f->kind == DP_FEATURE_NONE))
            return rec_errf(err, r->where, r->index, "feature \"%s\" is a %s; categorical ids "
                            "are an int64_list%s", c->name, dp_feature_kind_name(f->kind),
                            r->buckets ? " or a bytes_list" : " (raw bytes need --hash-buckets N)");
        size_t cnt = f->kind == DP_FEATURE_NONE ? 0 : f->count;
        if (cnt > (size_t)c->places)
            return rec_errf(err, r->where, r->index, "feature \"%s\" holds %zu ids, more than "
                            "its %d places", c->name, cnt, c->places);
        for (size_t i = 0; i < cnt; i++) {
            uint64_t id;
            if (r->buckets) {
                id = (f->kind == DP_FEATURE_INT64
                          ? dp_id_hash_int(f->int64s[i])
                          : dp_id_hash_text((const char *)f->bytes[i].data, f->bytes[i].len)) %
                     r->buckets;
            } else {
                int64_t v = f->int64s[i];
                if (v < 0)
                    return rec_errf(err, r->where, r->index, "feature \"%s\": id %lld is "
                                    "negative", c->name, (long long)v);
                if ((uint64_t)v >= c->limit)
                    return rec_errf(err, r->where, r->index, "feature \"%s\": id %lld is not "
                                    "below %u, %s (give --hash-buckets N to hash raw ids)",
                                    c->name, (long long)v, c->limit,
                                    c->limit == DP_DATA_ID_LIMIT
                                        ? "the most a float holds exactly"
                                        : "the rows of its embedding table");
                id = (uint64_t)v;
            }
            out[k + i] = (float)id;
        }
        for (size_t i = cnt; i < (size_t)c->places; i++)
            out[k + i] = -1.0f; /* an empty place */
        k += (size_t)c->places;
    }
    return 0;
}

/* ---- NumPy with named columns: an .npz a file, its arrays the columns ---- */

static int npz_named_open(dp_record_reader *r, const dp_data_file *f, dp_err *err)
{
    if (f->member || f->labels_path)
        return dp_errf(err, "%s: named columns (--categorical, --numeric) are read from .npz "
                       "files, one or more a split, whose arrays are the columns and the "
                       "label; not from .npy pairs", f->path);
    r->path = dup_str(f->path);
    if (!r->path)
        return dp_errf(err, "%s: out of memory", f->path);
    if (dp_npy_open(&r->y, f->path, r->label, err) != 0)
        return -1;
    const dp_npy_info *yi = dp_npy_get_info(r->y);
    if (yi->row_elems != 1 || yi->ndim > 2)
        return dp_errf(err, "%s (member %s): labels must have shape (n,) or (n, 1)", f->path,
                       r->label);
    r->rows = yi->rows;
    r->chunk_rows = NPZ_NAMED_CHUNK;
    r->lbuf = malloc(NPZ_NAMED_CHUNK * sizeof *r->lbuf);
    if (!r->lbuf)
        return dp_errf(err, "%s: out of memory", f->path);
    for (size_t j = 0; j < r->n_cols; j++) {
        named_col *c = &r->cols[j];
        if (dp_npy_open(&c->arr, f->path, c->name, err) != 0)
            return -1;
        const dp_npy_info *in = dp_npy_get_info(c->arr);
        if (in->rows != r->rows)
            return dp_errf(err, "%s (member %s): %llu rows, the labels have %llu", f->path,
                           c->name, (unsigned long long)in->rows, (unsigned long long)r->rows);
        if (in->ndim > 2 || (c->places ? in->row_elems > (uint64_t)c->places
                                       : in->row_elems != 1))
            return dp_errf(err, "%s (member %s): %llu values a row; %s", f->path, c->name,
                           (unsigned long long)in->row_elems,
                           c->places ? "a categorical column holds shape (n,) or (n, M), at "
                                       "most its places"
                                     : "a numeric column holds shape (n,) or (n, 1)");
        c->width = (int)in->row_elems;
        c->chunk = malloc((size_t)NPZ_NAMED_CHUNK * (size_t)c->width * sizeof(int64_t));
        if (!c->chunk)
            return dp_errf(err, "%s: out of memory", f->path);
    }
    return 0;
}

/* npy.c's refusal of a column's chunk, named by the file and the column
 * (its own message names the row where there is one). */
static int npz_column_err(const dp_record_reader *r, const char *column, dp_err *err)
{
    char why[DP_ERR_MAX];
    const char *m = strstr(err->msg, "): ");
    snprintf(why, sizeof why, "%s", m ? m + 3 : err->msg);
    return dp_errf(err, "%s: column \"%s\": %.400s", r->where, column, why);
}

/* The next record of an .npz of named columns. */
static int npz_named_next(dp_record_reader *r, float *out, uint8_t *label, dp_err *err)
{
    uint64_t i = r->index;
    if (i >= r->rows)
        return 0;
    if (i < r->buf_lo || i >= r->buf_hi) {
        uint64_t hi = i + NPZ_NAMED_CHUNK < r->rows ? i + NPZ_NAMED_CHUNK : r->rows;
        r->buf_lo = r->buf_hi = 0;
        if (dp_npy_read_labels(r->y, i, hi, r->classes, r->lbuf, err) != 0)
            return npz_column_err(r, r->label, err);
        for (size_t j = 0; j < r->n_cols; j++) {
            named_col *c = &r->cols[j];
            int rc = c->places ? dp_npy_read_i64(c->arr, i, hi, c->chunk, err)
                               : dp_npy_read_f32(c->arr, i, hi, c->chunk, err);
            if (rc != 0)
                return npz_column_err(r, c->name, err);
        }
        r->buf_lo = i, r->buf_hi = hi;
    }
    size_t row = (size_t)(i - r->buf_lo), k = 0;
    for (size_t j = 0; j < r->n_cols; j++) {
        const named_col *c = &r->cols[j];
        if (!c->places) {
            out[k++] = ((const float *)c->chunk)[row];
            continue;
        }
        const int64_t *v = (const int64_t *)c->chunk + row * (size_t)c->width;
        for (int q = 0; q < c->places; q++) {
            int64_t id = q < c->width ? v[q] : -1;
            if (id == -1) { /* an empty place */
                out[k + (size_t)q] = -1.0f;
                continue;
            }
            if (r->buckets) {
                out[k + (size_t)q] = (float)(dp_id_hash_int(id) % r->buckets);
                continue;
            }
            if (id < 0)
                return rec_errf(err, r->where, i, "column \"%s\": id %lld is negative (-1 "
                                "marks an empty place)", c->name, (long long)id);
            if ((uint64_t)id >= c->limit)
                return rec_errf(err, r->where, i, "column \"%s\": id %lld is not below %u, "
                                "%s (give --hash-buckets N to hash raw ids)", c->name,
                                (long long)id, c->limit,
                                c->limit == DP_DATA_ID_LIMIT ? "the most a float holds exactly"
                                                           : "the rows of its embedding table");
            out[k + (size_t)q] = (float)id;
        }
        k += (size_t)c->places;
    }
    *label = (uint8_t)r->lbuf[row];
    r->index++;
    return 1;
}

static int tf_open(dp_record_reader *r, const dp_data_file *f, dp_err *err)
{
    if (dp_tfrecord_open(&r->tf, f->path, NULL, err) != 0)
        return -1;
    r->ex = dp_example_new();
    if (!r->ex)
        return dp_errf(err, "%s: out of memory", f->path);
    return 0;
}

/* ---- NumPy: an .npy pair or an .npz's two members ---- */

/* The record shape of an array (rows, ...): (n, d) is 1 x d, (n, h, w) an
 * image h x w, (n, h, w, c) one of c channels; more axes are flattened. */
static int npy_shape(const dp_npy_info *in, const char *where, dp_record_shape *s, dp_err *err)
{
    memset(s, 0, sizeof *s);
    s->kind = in->dtype == DP_NPY_U8 ? DP_VALUES_U8 : DP_VALUES_F32;
    s->rows = s->cols = s->channels = 1;
    uint64_t r = 1, c = in->row_elems, ch = 1;
    if (in->ndim == 3 || in->ndim == 4) {
        r = in->shape[1];
        c = in->shape[2];
        ch = in->ndim == 4 ? in->shape[3] : 1;
    }
    if (in->row_elems == 0 || in->row_elems > UINT32_MAX)
        return dp_errf(err, "%s: rows of %llu values; a record holds 1 to %u", where,
                       (unsigned long long)in->row_elems, UINT32_MAX);
    s->rows = (uint32_t)r;
    s->cols = (uint32_t)c;
    s->channels = (uint32_t)ch;
    s->dim = (uint32_t)in->row_elems;
    return 0;
}

static char *member_where(const char *path, const char *member)
{
    if (!member)
        return dup_str(path);
    size_t n = strlen(path) + strlen(member) + 12;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s (member %s)", path, member);
    return p;
}

static int same_shape(const dp_record_shape *a, const dp_record_shape *b)
{
    return a->kind == b->kind && a->rows == b->rows && a->cols == b->cols &&
           a->channels == b->channels && a->dim == b->dim;
}

static int npy_open_pair(dp_record_reader *r, const dp_data_file *f, dp_err *err)
{
    const char *lpath = f->labels_path ? f->labels_path : f->path;
    free(r->where);
    r->where = member_where(f->path, f->member);
    r->labels_where = member_where(lpath, f->labels_member);
    r->path = dup_str(f->path);
    r->labels_path = dup_str(lpath);
    if (!r->where || !r->labels_where || !r->path || !r->labels_path)
        return dp_errf(err, "%s: out of memory", f->path);
    if (dp_npy_open(&r->x, f->path, f->member, err) != 0 ||
        dp_npy_open(&r->y, lpath, f->labels_member, err) != 0)
        return -1;
    const dp_npy_info *xi = dp_npy_get_info(r->x), *yi = dp_npy_get_info(r->y);
    if (xi->rows != yi->rows)
        return dp_errf(err, "%s has %llu rows of features but %s has %llu labels; the two "
                       "arrays must have as many rows", r->where, (unsigned long long)xi->rows,
                       r->labels_where, (unsigned long long)yi->rows);
    if (yi->row_elems != 1 || yi->ndim > 2)
        return dp_errf(err, "%s: labels must have shape (n,) or (n, 1); this array has %d axes "
                       "and %llu values a row", r->labels_where, yi->ndim,
                       (unsigned long long)yi->row_elems);
    r->rows = xi->rows;
    return 0;
}

/* Sizes the chunk buffers once the shape is known. */
static int npy_buffers(dp_record_reader *r, dp_err *err)
{
    dp_record_shape s;
    if (npy_shape(dp_npy_get_info(r->x), r->where, &s, err) != 0)
        return -1;
    if (!same_shape(&s, &r->shape))
        return rec_errf(err, r->where, 0, "%u x %u x %u %s values, the dataset's first record "
                        "has %u x %u x %u %s values", s.rows, s.cols, s.channels,
                        dp_value_kind_name(s.kind), r->shape.rows, r->shape.cols,
                        r->shape.channels, dp_value_kind_name(r->shape.kind));
    size_t rb = (size_t)s.dim * dp_value_size(s.kind);
    uint64_t chunk = NPY_BUF_BYTES / rb;
    if (chunk > r->rows)
        chunk = r->rows;
    r->chunk_rows = chunk > 1 ? chunk : 1;
    if (r->chunk_rows > 1) { /* else rows are read straight into the caller's buffer */
        r->buf = malloc((size_t)r->chunk_rows * rb);
        if (!r->buf)
            return dp_errf(err, "%s: out of memory", r->where);
    }
    r->lbuf = malloc((size_t)r->chunk_rows * sizeof *r->lbuf);
    if (!r->lbuf)
        return dp_errf(err, "%s: out of memory", r->where);
    return 0;
}

/* Rows [lo, hi) into out and r->lbuf; a refusal names record lo. */
static int npy_load(dp_record_reader *r, uint64_t lo, uint64_t hi, void *out, dp_err *err)
{
    int rc = r->shape.kind == DP_VALUES_U8 ? dp_npy_read_u8(r->x, lo, hi, out, err)
                                           : dp_npy_read_f32(r->x, lo, hi, out, err);
    if (rc != 0)
        return rec_wrap(err, r->path, r->where, lo);
    if (dp_npy_read_labels(r->y, lo, hi, r->classes, r->lbuf, err) != 0)
        return rec_wrap(err, r->labels_path, r->labels_where, lo);
    return 0;
}

static int npy_next(dp_record_reader *r, void *features, uint8_t *label, dp_err *err)
{
    uint64_t i = r->index;
    if (i >= r->rows)
        return 0;
    size_t rb = (size_t)r->shape.dim * dp_value_size(r->shape.kind);
    if (!r->buf) {
        if (npy_load(r, i, i + 1, features, err) != 0)
            return -1;
        *label = (uint8_t)r->lbuf[0];
        r->index++;
        return 1;
    }
    if (i < r->buf_lo || i >= r->buf_hi) {
        uint64_t hi = i + r->chunk_rows < r->rows ? i + r->chunk_rows : r->rows;
        /* A refusal inside a chunk is found again row by row, so that it
         * names its own record and the rows before it are still served. */
        if (i < r->single_until || npy_load(r, i, hi, r->buf, err) != 0) {
            if (i >= r->single_until)
                r->single_until = hi;
            hi = i + 1;
            r->buf_lo = r->buf_hi = 0;
            if (npy_load(r, i, hi, r->buf, err) != 0)
                return -1;
        }
        r->buf_lo = i;
        r->buf_hi = hi;
    }
    memcpy(features, r->buf + (size_t)(i - r->buf_lo) * rb, rb);
    *label = (uint8_t)r->lbuf[i - r->buf_lo];
    r->index++;
    return 1;
}

/* ---- CSV ---- */

/* The bytes looked at to tell a header: csv.c's default longest record. */
#define CSV_PEEK_MAX ((size_t)1 << 20)

static int csv_field_is_number(const char *f, size_t n, int overflow)
{
    while (n > 0 && (f[n - 1] == ' ' || f[n - 1] == '\t'))
        n--;
    if (n == 0 || overflow)
        return 0;
    char tmp[64];
    memcpy(tmp, f, n);
    tmp[n] = '\0';
    char *end;
    double v = strtod(tmp, &end);
    return *end == '\0' && isfinite(v);
}

/* Whether path's first record is a header: any field of it not a number
 * (records.h).  Reads at most CSV_PEEK_MAX bytes, past a byte-order mark and
 * blank lines, quoting as RFC 4180 says; csv.c checks the rest. */
static int csv_has_header(const char *path, int *has, dp_err *err)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return dp_errf(err, "cannot open %s: %s", path, strerror(errno));
    char field[64];
    size_t fl = 0, seen = 0;
    int quoted = 0, overflow = 0, nonblank = 0, header = 0, ch;
    *has = 0;
    unsigned char bom[3];
    if (fread(bom, 1, 3, fp) != 3 || memcmp(bom, "\xef\xbb\xbf", 3) != 0)
        rewind(fp); /* no byte-order mark */
    while (seen++ < CSV_PEEK_MAX) {
        ch = getc(fp);
        if (quoted) {
            if (ch == EOF)
                break;
            if (ch == '"') {
                int next = getc(fp);
                if (next != '"') {
                    quoted = 0;
                    if (next != EOF)
                        ungetc(next, fp);
                    continue;
                }
            }
            if (fl < sizeof field - 1)
                field[fl++] = (char)ch;
            else
                overflow = 1;
            continue;
        }
        if (ch == ',' || ch == '\n' || ch == EOF) {
            if (ch != ',' && !nonblank) { /* a blank line */
                if (ch == EOF)
                    break;
                fl = 0;
                continue;
            }
            if (!csv_field_is_number(field, fl, overflow))
                header = 1;
            fl = 0;
            overflow = 0;
            nonblank = 1;
            if (ch != ',')
                break;
            continue;
        }
        if (ch == '\0')
            break; /* csv.c refuses it */
        if (ch == '\r' || ((ch == ' ' || ch == '\t') && fl == 0))
            continue;
        nonblank = 1;
        if (ch == '"' && fl == 0) {
            quoted = 1;
            continue;
        }
        if (fl < sizeof field - 1)
            field[fl++] = (char)ch;
        else
            overflow = 1;
    }
    fclose(fp);
    *has = header;
    return 0;
}

static int csv_open(dp_record_reader *r, const dp_data_file *f, const dp_data_options *o,
                    dp_err *err)
{
    dp_csv_config cfg;
    dp_csv_config_default(&cfg);
    if (csv_has_header(f->path, &cfg.header, err) != 0)
        return -1;
    cfg.label = o->label; /* NULL: "label" if the header has it, else the first column */
    cfg.categorical = o->categorical;
    cfg.numeric = o->numeric;
    cfg.hash_buckets = o->hash_buckets;
    cfg.id_limits = o->id_limits;
    cfg.n_id_limits = o->n_id_limits;
    cfg.classes = r->classes;
    if (dp_csv_open(&r->csv, f->path, &cfg, err) != 0)
        return -1;
    r->path = dup_str(f->path);
    if (!r->path)
        return dp_errf(err, "%s: out of memory", f->path);
    return 0;
}

/* Checks the columns against the shape and sizes the skipping row. */
static int csv_buffers(dp_record_reader *r, dp_err *err)
{
    size_t nf = dp_csv_features(r->csv);
    const dp_record_shape *s = &r->shape;
    if (s->kind != DP_VALUES_F32 || s->dim != nf)
        return rec_errf(err, r->where, 0, "%zu feature columns, the dataset's first record has "
                        "%u %s values", nf, s->dim, dp_value_kind_name(s->kind));
    r->scratch = malloc(nf * sizeof *r->scratch);
    if (!r->scratch)
        return dp_errf(err, "%s: out of memory", r->where);
    return 0;
}

static int csv_next(dp_record_reader *r, float *features, uint8_t *label, dp_err *err)
{
    uint32_t l;
    int rc = dp_csv_next(r->csv, features, &l, err);
    if (rc < 0)
        return rec_wrap(err, r->path, r->where, r->index); /* csv.c names line and column */
    if (rc == 0)
        return 0;
    *label = (uint8_t)l; /* csv.c checked it against the class count */
    r->index++;
    return 1;
}

static int csv_probe(dp_record_reader *r, dp_record_shape *s, dp_err *err)
{
    size_t nf = dp_csv_features(r->csv);
    if (nf == 0 || nf > UINT32_MAX)
        return dp_errf(err, "%s: %zu feature columns", r->where, nf);
    float *row = malloc(nf * sizeof *row);
    if (!row)
        return dp_errf(err, "%s: out of memory", r->where);
    uint8_t label;
    int rc = csv_next(r, row, &label, err);
    free(row);
    if (rc == 1) {
        memset(s, 0, sizeof *s);
        s->kind = DP_VALUES_F32;
        s->rows = s->channels = 1;
        s->cols = s->dim = (uint32_t)nf;
    }
    return rc;
}

/* ---- the reader ---- */

static int open_reader(dp_record_reader **out, const dp_data_file *f, dp_data_format format,
                       const dp_data_options *opt, dp_err *err)
{
    *out = NULL;
    dp_data_options o;
    dp_data_options_resolve(&o, opt);
    uint32_t classes = dp_data_classes(&o);
    if (classes < 2 || classes > 256)
        return dp_errf(err, "%s: the class count %u is not in 2..256", f->path, classes);
    dp_record_reader *r = calloc(1, sizeof *r);
    if (!r)
        return dp_errf(err, "%s: out of memory", f->path);
    r->format = format;
    r->classes = classes;
    r->image = dup_str(o.image);
    r->label = dup_str(o.label ? o.label : "label");
    r->where = dup_str(f->path);
    if (!r->image || !r->label || !r->where) {
        dp_record_close(r);
        return dp_errf(err, "%s: out of memory", f->path);
    }
    int rc;
    if (format != DP_DATA_CSV && named_open(r, &o, err) < 0) {
        dp_record_close(r);
        return -1;
    }
    switch (format) {
    case DP_DATA_TFRECORD: rc = tf_open(r, f, err); break;
    case DP_DATA_NPY: rc = r->cols ? npz_named_open(r, f, err) : npy_open_pair(r, f, err); break;
    case DP_DATA_CSV: rc = csv_open(r, f, &o, err); break;
    default: rc = dp_errf(err, "%s: unknown dataset format %d", f->path, (int)format);
    }
    if (rc != 0) {
        dp_record_close(r);
        return -1;
    }
    *out = r;
    return 0;
}

int dp_record_probe(const dp_data_file *f, dp_data_format format, const dp_data_options *opt,
                    dp_record_shape *shape, dp_err *err)
{
    dp_record_reader *r;
    if (open_reader(&r, f, format, opt, err) != 0)
        return -1;
    int rc = -1;
    switch (format) {
    case DP_DATA_TFRECORD:
        rc = tf_read(r, err);
        if (rc == 1 && tf_shape(r, shape, err) != 0)
            rc = -1;
        break;
    case DP_DATA_NPY:
        if (r->cols) { /* named columns: their values, as floats */
            rc = r->rows == 0 ? 0 : 1;
            memset(shape, 0, sizeof *shape);
            shape->kind = DP_VALUES_F32;
            shape->rows = shape->channels = 1;
            shape->cols = shape->dim = (uint32_t)r->n_feat;
            break;
        }
        rc = r->rows == 0 ? 0 : npy_shape(dp_npy_get_info(r->x), r->where, shape, err) == 0 ? 1 : -1;
        break;
    case DP_DATA_CSV: rc = csv_probe(r, shape, err); break;
    default: break;
    }
    dp_record_close(r);
    return rc;
}

int dp_record_open(dp_record_reader **out, const dp_data_file *f, dp_data_format format,
                   const dp_record_shape *shape, const dp_data_options *opt, dp_err *err)
{
    if (!shape || shape->dim == 0 || shape->kind >= DP_VALUES_KIND_COUNT ||
        (uint64_t)shape->rows * shape->cols * shape->channels != shape->dim) {
        *out = NULL;
        return dp_errf(err, "%s: no record shape (count the dataset's files first)", f->path);
    }
    if (open_reader(out, f, format, opt, err) != 0)
        return -1;
    (*out)->shape = *shape;
    if ((format == DP_DATA_NPY && !(*out)->cols && npy_buffers(*out, err) != 0) ||
        (format == DP_DATA_NPY && (*out)->cols &&
         (shape->kind != DP_VALUES_F32 || shape->dim != (*out)->n_feat) &&
         rec_errf(err, (*out)->where, 0, "%zu named values, the dataset's first record has %u",
                  (*out)->n_feat, shape->dim) < 0) ||
        (format == DP_DATA_CSV && csv_buffers(*out, err) != 0)) {
        dp_record_close(*out);
        *out = NULL;
        return -1;
    }
    return 0;
}

int dp_record_next(dp_record_reader *r, void *features, uint8_t *label, dp_err *err)
{
    switch (r->format) {
    case DP_DATA_TFRECORD: return tf_next(r, features, label, err);
    case DP_DATA_NPY:
        return r->cols ? npz_named_next(r, features, label, err)
                       : npy_next(r, features, label, err);
    case DP_DATA_CSV: return csv_next(r, features, label, err);
    default: return dp_errf(err, "%s: unknown format", r->where);
    }
}

int64_t dp_record_skip(dp_record_reader *r, uint64_t n, dp_err *err)
{
    uint64_t done = 0;
    if (r->format == DP_DATA_NPY) { /* the header gave the rows: move the cursor */
        done = r->rows - r->index < n ? r->rows - r->index : n;
        r->index += done;
        return (int64_t)done;
    }
    while (done < n) {
        int rc;
        if (r->format == DP_DATA_TFRECORD) {
            const uint8_t *data; /* framing and CRCs checked, the Example left alone */
            size_t len;
            tf_limit(r);
            rc = dp_tfrecord_next(r->tf, &data, &len, err);
            if (rc == 1)
                r->index++;
        } else if (r->format == DP_DATA_CSV) {
            uint8_t label; /* every field still checked: csv.c has no cheaper way past a row */
            rc = csv_next(r, r->scratch, &label, err);
        } else {
            return dp_errf(err, "%s: unknown format", r->where);
        }
        if (rc < 0)
            return -1;
        if (rc == 0)
            break;
        done++;
    }
    return (int64_t)done;
}

uint64_t dp_record_index(const dp_record_reader *r) { return r->index; }

static size_t str_bytes(const char *s)
{
    return s ? strlen(s) + 1 : 0;
}

/* libpng's share while it decodes an image of the dataset's shape. */
static size_t png_decode_bytes(const dp_record_shape *s)
{
    size_t row = (size_t)s->cols * s->channels;
    return PNG_DECODE_FIXED + 2 * (row + 64) + (size_t)s->rows * sizeof(void *);
}

size_t dp_record_reader_bytes(const dp_record_reader *r)
{
    size_t n = sizeof *r + str_bytes(r->where) + str_bytes(r->labels_where) +
               str_bytes(r->path) + str_bytes(r->labels_path) + str_bytes(r->image) +
               str_bytes(r->label);
    if (r->tf) /* tfrecord.c's buffers (the largest record so far) and zlib's state */
        n += dp_tfrecord_reader_bytes(r->tf);
    if (r->ex) /* the Example's decoded arrays */
        n += dp_example_bytes(r->ex);
    if (r->png)
        n += png_decode_bytes(&r->shape);
    if (r->csv) /* csv.c's read buffer, its longest record and the skipping row */
        n += ((size_t)64 << 10) + ((size_t)1 << 20) + (size_t)r->shape.dim * sizeof(float);
    for (size_t j = 0; j < r->n_cols; j++) /* named .npz columns: a handle and a chunk each */
        if (r->cols[j].arr)
            n += ((size_t)1 << 20) + (size_t)NPZ_NAMED_CHUNK * r->cols[j].width * sizeof(int64_t);
    if (r->cols && r->y)
        n += ((size_t)1 << 20) + (size_t)r->chunk_rows * sizeof *r->lbuf;
    if (r->x) { /* npy.c's staging buffers (1 MiB a handle) and the chunk */
        n += ((size_t)2 << 20) + (size_t)r->chunk_rows * sizeof *r->lbuf;
        if (r->buf)
            n += (size_t)r->chunk_rows * r->shape.dim * dp_value_size(r->shape.kind);
    }
    return n;
}

size_t dp_record_reader_reserve(const dp_record_reader *r)
{
    size_t n = dp_record_reader_bytes(r);
    if (r->tf) /* the record buffer and the Example's arrays grown once more */
        n += dp_tfrecord_record_capacity(r->tf) + dp_example_bytes(r->ex);
    return n;
}

void dp_record_limit(dp_record_reader *r, size_t bytes)
{
    r->limit = bytes;
    if (r->tf && !bytes)
        dp_tfrecord_set_max_record(r->tf, 0); /* the default limit again */
}

void dp_record_close(dp_record_reader *r)
{
    if (!r)
        return;
    dp_tfrecord_close(r->tf);
    dp_example_free(r->ex);
    dp_npy_close(r->x);
    dp_npy_close(r->y);
    dp_csv_close(r->csv);
    free(r->buf);
    free(r->lbuf);
    free(r->scratch);
    free(r->where);
    free(r->labels_where);
    free(r->path);
    free(r->labels_path);
    free(r->image);
    free(r->label);
    for (size_t i = 0; i < r->n_cols; i++) {
        free(r->cols[i].name);
        dp_npy_close(r->cols[i].arr);
        free(r->cols[i].chunk);
    }
    free(r->cols);
    free(r);
}
