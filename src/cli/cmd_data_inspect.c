/* downpour data inspect: what a data file holds (docs/datasets.md,
 * "Converting and inspecting").  A TFRecord file is read through, every CRC
 * checked, with its first records' features shown and the features every
 * record shares summed up; a .npy gives its dtype and shape, an .npz each
 * array's, a CSV its columns, rows and label column.  Memory is what the
 * readers hold (one record, one CSV row), whatever the file's size. */
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include <zlib.h>

#include "cli/cli.h"
#include "downpour/csv.h"
#include "downpour/example.h"
#include "downpour/idx.h"
#include "downpour/npy.h"
#include "downpour/png.h"
#include "downpour/status.h"
#include "downpour/tfrecord.h"

#define INSPECT_USAGE                                                                        \
    "downpour data inspect FILE [--records N]\n"                                              \
    "\n"                                                                                      \
    "FILE is a TFRecord file (raw or gzip; read through, every CRC checked), a .npy, an\n"    \
    "  .npz, an IDX (raw or gzip: its shape) or a .csv file (told by content, CSV by its\n"   \
    "  name).  TFRecord: the record count,\n" \
    "  the first N records' features (name, kind, count, values; PNG images' size), and\n"    \
    "  the features every record has with their shapes."

/* Features of the first record followed through the rest (the shared ones). */
#define SCHEMA_MAX 64
#define NAME_MAX_TRACKED 255
/* Values shown of an int64 or float list. */
#define SHOW_VALUES 8

typedef struct schema_entry {
    char name[NAME_MAX_TRACKED + 1];
    dp_feature_kind kind;
    int in_all;            /* present with this kind in every record so far */
    uint64_t min_count, max_count;
    int png;               /* 1: every first value a PNG of one shape; 0: not */
    dp_png_info pi;
    size_t min_len, max_len; /* bytes: the first value's length */
} schema_entry;

typedef struct schema {
    schema_entry e[SCHEMA_MAX];
    int n;
    size_t untracked; /* features of the first record beyond SCHEMA_MAX or with long names */
} schema;

/* A feature name on stdout, control bytes escaped, long names cut. */
static void print_name(const char *s, int width)
{
    int n = 0;
    for (; *s && n < 64; s++, n++) {
        unsigned char ch = (unsigned char)*s;
        if (isprint(ch))
            putchar(ch);
        else
            n += printf("\\x%02x", ch) - 1;
    }
    if (*s)
        n += printf("...");
    for (; n < width; n++)
        putchar(' ');
}

static void describe_bytes(const dp_bytes *b)
{
    dp_png_info pi;
    dp_err err;
    if (dp_png_info_read(&pi, b->data, b->len, &err) == 0) {
        printf("PNG %ux%u, %d channel(s), %d-bit%s (%zu bytes)", pi.height, pi.width, pi.channels,
               pi.bit_depth, pi.palette ? ", palette" : "", b->len);
        return;
    }
    size_t i = 0;
    while (i < b->len && i < 40 && isprint(b->data[i]))
        i++;
    if (b->len > 0 && i == b->len)
        printf("\"%.*s\" (%zu bytes)", (int)b->len, (const char *)b->data, b->len);
    else
        printf("%zu bytes", b->len);
}

static void print_feature(const dp_feature *f)
{
    printf("    ");
    print_name(f->name, 12);
    printf(" %-10s %zu value%s", dp_feature_kind_name(f->kind), f->count,
           f->count == 1 ? "" : "s");
    if (f->count == 0 || f->kind == DP_FEATURE_NONE) {
        putchar('\n');
        return;
    }
    printf(": ");
    if (f->kind == DP_FEATURE_BYTES) {
        describe_bytes(&f->bytes[0]);
        if (f->count > 1)
            printf(" (+%zu more)", f->count - 1);
    } else {
        size_t show = f->count < SHOW_VALUES ? f->count : SHOW_VALUES;
        for (size_t i = 0; i < show; i++) {
            if (f->kind == DP_FEATURE_INT64)
                printf("%s%lld", i ? " " : "", (long long)f->int64s[i]);
            else
                printf("%s%g", i ? " " : "", (double)f->floats[i]);
        }
        if (show < f->count)
            printf(" ...");
    }
    putchar('\n');
}

static void schema_first(schema *s, const dp_example *ex)
{
    for (size_t i = 0; i < dp_example_count(ex); i++) {
        const dp_feature *f = dp_example_feature(ex, i);
        if (s->n == SCHEMA_MAX || strlen(f->name) > NAME_MAX_TRACKED) {
            s->untracked++;
            continue;
        }
        schema_entry *e = &s->e[s->n++];
        snprintf(e->name, sizeof e->name, "%s", f->name);
        e->kind = f->kind;
        e->in_all = 1;
        e->min_count = e->max_count = f->count;
        e->png = -1; /* set from the first value below */
        e->min_len = SIZE_MAX;
    }
}

/* Folds one record's features into the shared ones. */
static void schema_add(schema *s, const dp_example *ex)
{
    for (int i = 0; i < s->n; i++) {
        schema_entry *e = &s->e[i];
        if (!e->in_all)
            continue;
        const dp_feature *f = dp_example_find(ex, e->name);
        if (!f || f->kind != e->kind) {
            e->in_all = 0;
            continue;
        }
        if (f->count < e->min_count)
            e->min_count = f->count;
        if (f->count > e->max_count)
            e->max_count = f->count;
        if (e->kind != DP_FEATURE_BYTES || f->count == 0) {
            e->png = 0;
            continue;
        }
        const dp_bytes *b = &f->bytes[0];
        if (b->len < e->min_len)
            e->min_len = b->len;
        if (b->len > e->max_len)
            e->max_len = b->len;
        if (e->png == 0)
            continue;
        dp_png_info pi;
        dp_err err;
        if (dp_png_info_read(&pi, b->data, b->len, &err) < 0)
            e->png = 0;
        else if (e->png < 0) {
            e->pi = pi;
            e->png = 1;
        } else if (memcmp(&pi, &e->pi, sizeof pi) != 0) {
            e->png = 0;
        }
    }
}

static void print_schema(const schema *s)
{
    int shown = 0;
    printf("every record has:");
    for (int i = 0; i < s->n; i++) {
        const schema_entry *e = &s->e[i];
        if (!e->in_all)
            continue;
        printf("%s ", shown++ ? ";" : "");
        print_name(e->name, 0);
        printf(" %s", dp_feature_kind_name(e->kind));
        if (e->min_count == e->max_count)
            printf("[%llu]", (unsigned long long)e->min_count);
        else
            printf("[%llu..%llu]", (unsigned long long)e->min_count,
                   (unsigned long long)e->max_count);
        if (e->kind == DP_FEATURE_BYTES && e->png == 1)
            printf(" PNG %ux%u, %d channel(s), %d-bit", e->pi.height, e->pi.width,
                   e->pi.channels, e->pi.bit_depth);
        else if (e->kind == DP_FEATURE_BYTES && e->max_len > 0 && e->min_len == e->max_len)
            printf(" of %zu bytes", e->min_len);
        else if (e->kind == DP_FEATURE_BYTES && e->max_len > 0)
            printf(" of %zu..%zu bytes", e->min_len, e->max_len);
    }
    printf("%s\n", shown ? "" : " (no feature in common)");
    if (s->untracked)
        printf("(%zu more features of the first record not followed)\n", s->untracked);
}

static int inspect_tfrecord(const char *path, long show, dp_err *err)
{
    dp_tfrecord_reader *r;
    if (dp_tfrecord_open(&r, path, NULL, err) < 0)
        return -1;
    dp_example *ex = dp_example_new();
    schema *s = calloc(1, sizeof *s);
    if (!ex || !s) {
        dp_example_free(ex);
        free(s);
        dp_tfrecord_close(r);
        return dp_errf(err, "%s: out of memory", path);
    }
    uint64_t data_bytes = 0;
    const uint8_t *rec;
    size_t len;
    int got, rc = 0;
    while ((got = dp_tfrecord_next(r, &rec, &len, err)) == 1) {
        uint64_t i = dp_tfrecord_count(r) - 1;
        data_bytes += len;
        if (dp_example_decode(ex, rec, len, err) < 0) {
            rc = dp_err_prefix(err, "%s: record %llu", path, (unsigned long long)i);
            break;
        }
        if (i == 0)
            schema_first(s, ex);
        schema_add(s, ex);
        if (i < (uint64_t)show) {
            printf("record %llu (%zu bytes): %zu feature%s\n", (unsigned long long)i, len,
                   dp_example_count(ex), dp_example_count(ex) == 1 ? "" : "s");
            for (size_t k = 0; k < dp_example_count(ex); k++)
                print_feature(dp_example_feature(ex, k));
        }
    }
    if (got < 0)
        rc = -1;
    if (rc == 0) {
        struct stat st;
        uint64_t n = dp_tfrecord_count(r);
        printf("%s: %llu record%s (TFRecord, %s), %lld bytes, %llu bytes of record data, every "
               "CRC checked\n", path, (unsigned long long)n, n == 1 ? "" : "s",
               dp_tfrecord_is_gzip(r) ? "gzip" : "raw",
               stat(path, &st) == 0 ? (long long)st.st_size : -1LL,
               (unsigned long long)data_bytes);
        if (n > 0)
            print_schema(s);
    }
    free(s);
    dp_example_free(ex);
    dp_tfrecord_close(r);
    return rc;
}

static void print_shape(const dp_npy_info *in)
{
    printf("(");
    for (int d = 0; d < in->ndim; d++)
        printf("%s%llu", d ? ", " : "", (unsigned long long)in->shape[d]);
    printf(in->ndim == 1 ? ",)" : ")");
}

static int inspect_npy(const char *path, dp_err *err)
{
    dp_npy *a;
    if (dp_npy_open(&a, path, NULL, err) < 0)
        return -1;
    const dp_npy_info *in = dp_npy_get_info(a);
    printf("%s: NumPy %d.0 array, dtype %s ('%s'), shape ", path, in->version,
           dp_npy_dtype_name(in->dtype), in->descr);
    print_shape(in);
    printf(", fortran_order %s: %llu rows of %llu value%s\n", in->fortran_order ? "True" : "False",
           (unsigned long long)in->rows, (unsigned long long)in->row_elems,
           in->row_elems == 1 ? "" : "s");
    dp_npy_close(a);
    return 0;
}

static int inspect_npz(const char *path, dp_err *err)
{
    char **names;
    size_t n;
    if (dp_npz_list(path, &names, &n, err) < 0)
        return -1;
    printf("%s: NumPy .npz archive, %zu array%s\n", path, n, n == 1 ? "" : "s");
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        dp_npy *a;
        if (dp_npy_open(&a, path, names[i], err) < 0) {
            rc = -1;
            break;
        }
        const dp_npy_info *in = dp_npy_get_info(a);
        printf("  ");
        print_name(names[i], 12);
        printf(" %s ('%s'), shape ", dp_npy_dtype_name(in->dtype), in->descr);
        print_shape(in);
        printf(", fortran_order %s%s\n", in->fortran_order ? "True" : "False",
               in->deflated ? ", deflated" : ", stored");
        dp_npy_close(a);
    }
    dp_npz_list_free(names, n);
    return rc;
}

static int all_numbers(const dp_csv *c)
{
    for (size_t i = 0; i < dp_csv_columns(c); i++) {
        const char *s = dp_csv_column_name(c, i);
        char *end;
        strtod(s, &end);
        if (end == s || *end)
            return 0;
    }
    return 1;
}

static int inspect_csv(const char *path, dp_err *err)
{
    dp_csv_config cfg;
    dp_csv_config_default(&cfg);
    cfg.classes = UINT32_MAX; /* inspect shows labels; it does not judge them */
    dp_csv *c;
    if (dp_csv_open(&c, path, &cfg, err) < 0)
        return -1;
    if (all_numbers(c)) { /* the first record is data: no header (records.h's rule) */
        dp_csv_close(c);
        cfg.header = 0;
        if (dp_csv_open(&c, path, &cfg, err) < 0)
            return -1;
    }
    size_t cols = dp_csv_columns(c), lab = dp_csv_label_column(c);
    printf("%s: CSV, %zu columns (%zu features and a label), %s", path, cols,
           dp_csv_features(c), cfg.header ? "header:" : "no header");
    for (size_t i = 0; cfg.header && i < cols && i < 8; i++) {
        printf("%s ", i ? "," : "");
        print_name(dp_csv_column_name(c, i), 0);
    }
    if (cfg.header && cols > 8)
        printf(", ...");
    printf("\n  label column: %zu (", lab + 1);
    print_name(dp_csv_column_name(c, lab), 0);
    printf(")\n");
    float *row = malloc(dp_csv_features(c) * sizeof *row);
    if (!row) {
        dp_csv_close(c);
        return dp_errf(err, "%s: out of memory", path);
    }
    uint64_t rows = 0;
    uint32_t label, lo = UINT32_MAX, hi = 0;
    int got;
    while ((got = dp_csv_next(c, row, &label, err)) == 1) {
        rows++;
        lo = label < lo ? label : lo;
        hi = label > hi ? label : hi;
    }
    free(row);
    dp_csv_close(c);
    if (got < 0)
        return -1;
    if (rows)
        printf("  rows: %llu, labels %u..%u\n", (unsigned long long)rows, lo, hi);
    else
        printf("  rows: 0\n");
    return 0;
}

/* The first n bytes of a file, inflated when it is gzip: what an IDX
 * header is told by.  Returns the bytes read. */
static size_t peek_inflated(const char *path, unsigned char *buf, size_t n)
{
    gzFile g = gzopen(path, "rb"); /* reads a plain file as it is, too */
    if (!g)
        return 0;
    int got = gzread(g, buf, (unsigned)n);
    gzclose(g);
    return got > 0 ? (size_t)got : 0;
}

/* An IDX header: 0 0, the type (0x08 unsigned bytes .. 0x0E doubles), 1..4 dims. */
static bool is_idx(const unsigned char *m, size_t got)
{
    return got >= 4 && m[0] == 0 && m[1] == 0 && m[2] >= 0x08 && m[2] <= 0x0E && m[2] != 0x0A &&
           m[3] >= 1 && m[3] <= 4;
}

static int inspect_idx(const char *path, bool gz, dp_err *err)
{
    dp_idx idx;
    if (dp_idx_read(path, &idx, err) < 0)
        return -1;
    printf("%s: IDX file%s, unsigned bytes, shape ", path, gz ? " (gzip)" : "");
    for (int d = 0; d < idx.ndim; d++)
        printf("%s%u", d ? " x " : "", idx.dims[d]);
    if (idx.ndim == 1 && idx.len > 0) { /* a labels file */
        unsigned lo = 255, hi = 0;
        for (size_t i = 0; i < idx.len; i++) {
            lo = idx.data[i] < lo ? idx.data[i] : lo;
            hi = idx.data[i] > hi ? idx.data[i] : hi;
        }
        printf(": %u labels, values %u..%u\n", idx.dims[0], lo, hi);
    } else if (idx.ndim >= 2) {
        printf(": %u records of ", idx.dims[0]);
        for (int d = 1; d < idx.ndim; d++)
            printf("%s%u", d > 1 ? "x" : "", idx.dims[d]);
        printf("\n");
    } else {
        printf("\n");
    }
    dp_idx_free(&idx);
    return 0;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcasecmp(s + n - m, suffix) == 0;
}

int cmd_data_inspect(int argc, char **argv)
{
    long show = 3;
    const cli_opt opts[] = {
        {"records", CLI_INT, &show, "N", "records whose features are printed", 0, 1000000},
    };
    const int n_opts = (int)(sizeof opts / sizeof opts[0]);
    int rest;
    int r = cli_parse(INSPECT_USAGE, opts, n_opts, argc, argv, &rest);
    if (r != 0)
        return r > 0 ? 0 : 2;
    if (rest >= argc) {
        fprintf(stderr, "downpour data inspect: FILE is required (see --help)\n");
        return 2;
    }
    const char *path = argv[rest];
    /* Options may follow FILE: parse them with FILE in argv[0]'s place. */
    int rest2;
    r = cli_parse(INSPECT_USAGE, opts, n_opts, argc - rest, argv + rest, &rest2);
    if (r != 0)
        return r > 0 ? 0 : 2;
    if (rest2 < argc - rest) {
        fprintf(stderr, "downpour data inspect: unexpected argument '%s' (one FILE)\n",
                argv[rest + rest2]);
        return 2;
    }

    dp_err err;
    unsigned char magic[8] = {0};
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "downpour data inspect: cannot open %s: %s\n", path, strerror(errno));
        return 1;
    }
    size_t got = fread(magic, 1, sizeof magic, f);
    fclose(f);
    int rc;
    unsigned char head[4];
    bool gz = got >= 2 && magic[0] == 0x1f && magic[1] == 0x8b;
    if (is_idx(magic, got) || (gz && is_idx(head, peek_inflated(path, head, sizeof head))))
        rc = inspect_idx(path, gz, &err);
    else if (got >= 6 && memcmp(magic, "\x93NUMPY", 6) == 0)
        rc = inspect_npy(path, &err);
    else if (got >= 4 && memcmp(magic, "PK", 2) == 0 &&
             ((magic[2] == 3 && magic[3] == 4) || (magic[2] == 5 && magic[3] == 6)))
        rc = inspect_npz(path, &err);
    else if (ends_with(path, ".csv"))
        rc = inspect_csv(path, &err);
    else
        rc = inspect_tfrecord(path, show, &err);
    fflush(stdout);
    if (rc < 0) {
        fprintf(stderr, "downpour data inspect: %s\n", err.msg);
        return 1;
    }
    return 0;
}
