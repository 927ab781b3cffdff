/* CSV reader (the format and the contract are in include/downpour/csv.h).
 *
 * Two steps per row: read_record cuts one record out of the byte stream
 * (tracking quotes, so a newline inside a quoted field continues it, and
 * counting lines), then split_fields cuts the record into fields in place
 * (unquoting, trimming, NUL-terminating: the result is never longer than the
 * input, so no copy is needed).  Both are bounded by max_record. */
#include "downpour/csv.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "downpour/records.h"

#define CSV_READ_BUF ((size_t)64 << 10)
#define CSV_DEFAULT_MAX_RECORD ((size_t)1 << 20)
#define CSV_LIMIT_MAX_RECORD ((size_t)1 << 30)

/* A named column (csv.h, "Named columns"). */
typedef struct csv_sel {
    size_t col;     /* its index in the file */
    int places;     /* categorical: ids it holds (1, or M); numeric: 0 */
    uint32_t limit; /* categorical: ids below it */
    const char *flag; /* --categorical or --numeric, for messages */
} csv_sel;

struct dp_csv {
    char *path;
    int fd;
    dp_csv_config cfg;      /* cfg.label is not kept (NULL) */
    uint8_t *in;            /* CSV_READ_BUF bytes */
    size_t in_len, in_pos;
    uint64_t in_base;       /* file offset of in[0] */
    char *rec;              /* the current record, rec_cap <= max_record + 1 */
    size_t rec_cap;
    char **f;               /* ncols field pointers into rec */
    size_t ncols, label_col;
    char **names;           /* ncols column names, pointing into names_buf */
    char *names_buf;
    uint64_t line;          /* the line the next record starts on */
    uint64_t row_line;      /* the line the row last returned started on */
    uint64_t data_off, data_line; /* where the first row starts, for rewind */
    csv_sel *sel;           /* named columns (n_sel; NULL: every column but the label's) */
    size_t n_sel, n_feat;
    uint32_t buckets;       /* hash_buckets */
};

void dp_csv_config_default(dp_csv_config *cfg)
{
    cfg->header = 1;
    cfg->label = NULL;
    cfg->label_column = -1;
    cfg->classes = 10;
    cfg->delimiter = ',';
    cfg->max_record = CSV_DEFAULT_MAX_RECORD;
    cfg->categorical = cfg->numeric = NULL;
    cfg->hash_buckets = 0;
    cfg->id_limits = NULL;
    cfg->n_id_limits = 0;
}

static int fill(dp_csv *c, dp_err *err)
{
    c->in_base += c->in_len;
    c->in_len = c->in_pos = 0;
    for (;;) {
        ssize_t r = read(c->fd, c->in, CSV_READ_BUF);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return dp_errf(err, "%s: read error near line %llu: %s", c->path,
                           (unsigned long long)c->line, strerror(errno));
        c->in_len = (size_t)r;
        return 0;
    }
}

static int is_blank_char(const dp_csv *c, char ch)
{
    return (ch == ' ' || ch == '\t' || ch == '\r') && ch != c->cfg.delimiter;
}

/* Cuts the next record into c->rec (without its line end, NUL-terminated).
 * Returns 1, 0 at the end of the file, or -1. */
static int read_record(dp_csv *c, size_t *len_out, uint64_t *line_out, dp_err *err)
{
    /* Where we are in the record: a quote opens a quoted field only at a
     * field's start (a quote inside an unquoted field is data, as in
     * Python's csv module), and inside one "" is a quote. */
    enum { FIELD_START, UNQUOTED, QUOTED, QUOTE_SEEN } st = FIELD_START;
    size_t len = 0, max = c->cfg.max_record;
    int any = 0;
    char delim = c->cfg.delimiter;
    uint64_t start = c->line;
    for (;;) {
        if (c->in_pos == c->in_len) {
            if (fill(c, err) != 0)
                return -1;
            if (c->in_len == 0) {
                if (st == QUOTED)
                    return dp_errf(err, "%s: line %llu: a quoted field is never closed (the "
                                   "file ends inside it); add the closing '\"'", c->path,
                                   (unsigned long long)start);
                if (!any)
                    return 0;
                break;
            }
        }
        char ch = (char)c->in[c->in_pos++];
        any = 1;
        if (ch == '\0') /* a field would end there unseen: strtod stops at it */
            return dp_errf(err, "%s: line %llu: a NUL byte; a CSV file is text (a file saved "
                           "as UTF-16 holds one in every character: save it as UTF-8)",
                           c->path, (unsigned long long)c->line);
        if (ch == '\n') {
            c->line++;
            if (st != QUOTED)
                break;
        } else if (st == FIELD_START) {
            st = ch == '"' ? QUOTED : ch == delim || is_blank_char(c, ch) ? FIELD_START
                                                                          : UNQUOTED;
        } else if (st == UNQUOTED) {
            st = ch == delim ? FIELD_START : UNQUOTED;
        } else if (st == QUOTED) {
            st = ch == '"' ? QUOTE_SEEN : QUOTED;
        } else { /* QUOTE_SEEN: "" is a quote; anything else closed the field */
            st = ch == '"' ? QUOTED : ch == delim ? FIELD_START : UNQUOTED;
        }
        if (len == max)
            return dp_errf(err, "%s: line %llu: a record longer than %zu bytes (the reader's "
                           "max_record; raise it for wider rows, or look for a quote that "
                           "is never closed)", c->path, (unsigned long long)start, max);
        if (len + 1 >= c->rec_cap) {
            size_t cap = c->rec_cap * 2 < max + 1 ? c->rec_cap * 2 : max + 1;
            char *r = realloc(c->rec, cap);
            if (!r)
                return dp_errf(err, "%s: out of memory for a %zu-byte record", c->path, cap);
            c->rec = r;
            c->rec_cap = cap;
        }
        c->rec[len++] = ch;
    }
    if (len > 0 && c->rec[len - 1] == '\r') /* CRLF */
        len--;
    c->rec[len] = '\0';
    *len_out = len;
    *line_out = start;
    return 1;
}

static int is_blank(const dp_csv *c, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!is_blank_char(c, s[i]))
            return 0;
    return 1;
}

/* Splits rec (len bytes) into fields in place: f[0..cap) get the first cap,
 * *nf the count of all.  RFC 4180 quoting; blanks around a field dropped. */
static int split_fields(dp_csv *c, size_t len, char **f, size_t cap, size_t *nf,
                        uint64_t line, dp_err *err)
{
    char *r = c->rec, *end = c->rec + len, *w = c->rec;
    char delim = c->cfg.delimiter;
    size_t n = 0;
    for (;;) {
        while (r < end && is_blank_char(c, *r))
            r++;
        char *start = w;
        if (r < end && *r == '"') {
            r++;
            for (;;) {
                if (r == end)
                    return dp_errf(err, "%s: line %llu, column %zu: a quoted field is never "
                                   "closed", c->path, (unsigned long long)line, n + 1);
                if (*r == '"') {
                    if (r + 1 < end && r[1] == '"') { /* "" is one quote */
                        *w++ = '"';
                        r += 2;
                        continue;
                    }
                    r++;
                    break;
                }
                *w++ = *r++;
            }
            while (r < end && is_blank_char(c, *r))
                r++;
            if (r < end && *r != delim)
                return dp_errf(err, "%s: line %llu, column %zu: text after a closing quote "
                               "(quote the whole field, and write a quote inside it as \"\")",
                               c->path, (unsigned long long)line, n + 1);
        } else {
            while (r < end && *r != delim)
                *w++ = *r++;
            while (w > start && is_blank_char(c, w[-1]))
                w--;
        }
        if (n < cap)
            f[n] = start;
        n++;
        /* w <= r always: each byte read writes at most one. */
        if (r < end) {
            r++;
            *w++ = '\0';
        } else {
            *w = '\0';
            break;
        }
    }
    *nf = n;
    return 0;
}

/* Reads records until one that is not blank; 0 at the end of the file. */
static int next_record(dp_csv *c, size_t *len, uint64_t *line, dp_err *err)
{
    for (;;) {
        int r = read_record(c, len, line, err);
        if (r <= 0)
            return r;
        if (!is_blank(c, c->rec, *len))
            return 1;
    }
}

void dp_csv_close(dp_csv *c)
{
    if (!c)
        return;
    if (c->fd >= 0)
        close(c->fd);
    free(c->in);
    free(c->rec);
    free(c->f);
    free(c->names);
    free(c->names_buf);
    free(c->sel);
    free(c->path);
    free(c);
}

/* Copies the fields of the current record (or "column N") as the names. */
static int keep_names(dp_csv *c, char **f, dp_err *err)
{
    size_t total = 0;
    for (size_t i = 0; i < c->ncols; i++)
        total += f ? strlen(f[i]) + 1 : 32;
    c->names = malloc(c->ncols * sizeof *c->names);
    c->names_buf = malloc(total);
    if (!c->names || !c->names_buf)
        return dp_errf(err, "%s: out of memory for %zu column names", c->path, c->ncols);
    char *p = c->names_buf;
    for (size_t i = 0; i < c->ncols; i++) {
        size_t l = f ? strlen(f[i]) + 1 : (size_t)snprintf(p, 32, "column %zu", i + 1) + 1;
        if (f)
            memcpy(p, f[i], l);
        c->names[i] = p;
        p += l;
    }
    return 0;
}

/* Picks the label column from the configuration and the names. */
static int choose_label(dp_csv *c, const dp_csv_config *cfg, dp_err *err)
{
    if (cfg->label_column >= 0) {
        if ((size_t)cfg->label_column >= c->ncols)
            return dp_errf(err, "%s: label column %d (0-based) is outside the file's %zu "
                           "columns", c->path, cfg->label_column, c->ncols);
        c->label_col = (size_t)cfg->label_column;
        return 0;
    }
    const char *want = cfg->label ? cfg->label : "label";
    size_t hits = 0, first = 0;
    for (size_t i = 0; cfg->header && i < c->ncols; i++) {
        if (strcmp(c->names[i], want) == 0) {
            if (hits++ == 0)
                first = i;
            else
                return dp_errf(err, "%s: two columns are named '%s' (columns %zu and %zu); "
                               "choose the label column by index", c->path, want, first + 1,
                               i + 1);
        }
    }
    if (hits) {
        c->label_col = first;
        return 0;
    }
    if (cfg->label) {
        char list[160] = "";
        size_t l = 0;
        for (size_t i = 0; i < c->ncols && l + 8 < sizeof list; i++) {
            int r = snprintf(list + l, sizeof list - l, "%s'%s'", i ? ", " : "", c->names[i]);
            l = r < 0 || (size_t)r >= sizeof list - l ? sizeof list : l + (size_t)r;
        }
        if (l >= sizeof list)
            memcpy(list + sizeof list - 5, "...", 4);
        return dp_errf(err, "%s: no column named '%s' for the label (the header has %s)",
                       c->path, cfg->label, list);
    }
    c->label_col = 0; /* no "label" column: the first */
    return 0;
}

/* The header's names for a message: "'a', 'b', ..." cut to fit. */
static void name_list(const dp_csv *c, char *list, size_t cap)
{
    size_t l = 0;
    list[0] = '\0';
    for (size_t i = 0; i < c->ncols && l + 8 < cap; i++) {
        int r = snprintf(list + l, cap - l, "%s'%s'", i ? ", " : "", c->names[i]);
        l = r < 0 || (size_t)r >= cap - l ? cap : l + (size_t)r;
    }
    if (l >= cap)
        memcpy(list + cap - 5, "...", 4);
}

/* One list of named columns (cat: categorical, NAME or NAME:M) into c->sel. */
static int select_list(dp_csv *c, const char *text, int cat, const dp_csv_config *cfg,
                       dp_err *err)
{
    const char *flag = cat ? "--categorical" : "--numeric";
    dp_data_column it;
    int rc;
    while ((rc = dp_data_column_next(&text, cat, &it)) != 0) {
        if (rc < 0)
            return dp_errf(err, "%s: %s '%.*s': expected NAME, or NAME:M with M ids in [1, "
                           "%d]", c->path, flag, (int)it.item_len, it.item, DP_DATA_MAX_PLACES);
        const char *name = it.name;
        size_t nl = it.name_len;
        size_t col = c->ncols;
        for (size_t i = 0; i < c->ncols; i++)
            if (strlen(c->names[i]) == nl && memcmp(c->names[i], name, nl) == 0)
                col = i;
        if (col == c->ncols) {
            char list[200];
            name_list(c, list, sizeof list);
            return dp_errf(err, "%s: no column named '%.*s' (%s); the header has %s", c->path,
                           (int)nl, name, flag, list);
        }
        if (col == c->label_col)
            return dp_errf(err, "%s: column %zu (%s) is the label, not a feature (%s)", c->path,
                           col + 1, c->names[col], flag);
        for (size_t k = 0; k < c->n_sel; k++)
            if (c->sel[k].col == col)
                return dp_errf(err, "%s: column %zu (%s) is named twice (%s)", c->path,
                               col + 1, c->names[col], flag);
        size_t k = c->n_sel++;
        uint32_t limit = DP_DATA_ID_LIMIT;
        if (cat && cfg->id_limits && k < cfg->n_id_limits)
            limit = cfg->id_limits[k];
        c->sel[k] = (csv_sel){col, it.places, limit, flag};
        c->n_feat += cat ? (size_t)it.places : 1;
    }
    return 0;
}

/* The named columns, when the configuration names any. */
static int select_columns(dp_csv *c, const dp_csv_config *cfg, dp_err *err)
{
    if (!cfg->categorical && !cfg->numeric)
        return 0;
    if (!cfg->header)
        return dp_errf(err, "%s: columns are named (--categorical, --numeric) but the file "
                       "has no header naming its columns", c->path);
    c->sel = calloc(c->ncols, sizeof *c->sel);
    if (!c->sel)
        return dp_errf(err, "%s: out of memory", c->path);
    c->buckets = cfg->hash_buckets;
    if ((cfg->categorical && select_list(c, cfg->categorical, 1, cfg, err) < 0) ||
        (cfg->numeric && select_list(c, cfg->numeric, 0, cfg, err) < 0))
        return -1;
    if (c->n_feat == 0)
        return dp_errf(err, "%s: --categorical and --numeric name no column", c->path);
    return 0;
}

int dp_csv_open(dp_csv **out, const char *path, const dp_csv_config *cfg_in, dp_err *err)
{
    *out = NULL;
    dp_csv_config cfg;
    if (cfg_in)
        cfg = *cfg_in;
    else
        dp_csv_config_default(&cfg);
    if (cfg.max_record == 0)
        cfg.max_record = CSV_DEFAULT_MAX_RECORD;
    if (cfg.max_record > CSV_LIMIT_MAX_RECORD)
        return dp_errf(err, "%s: max_record %zu is over the %zu-byte limit", path,
                       cfg.max_record, CSV_LIMIT_MAX_RECORD);
    if (cfg.delimiter == '"' || cfg.delimiter == '\n' || cfg.delimiter == '\r' ||
        cfg.delimiter == '\0')
        return dp_errf(err, "%s: the delimiter cannot be a quote, a line end or NUL", path);
    if (cfg.label && cfg.label_column >= 0)
        return dp_errf(err, "%s: choose the label column by name ('%s') or by index (%d), not "
                       "both", path, cfg.label, cfg.label_column);
    if (cfg.label && !cfg.header)
        return dp_errf(err, "%s: the label column is chosen by name ('%s') but the file is read "
                       "without a header; choose it by index", path, cfg.label);
    if (cfg.classes == 0)
        return dp_errf(err, "%s: the class count must be at least 1", path);

    dp_csv *c = calloc(1, sizeof *c);
    if (!c)
        return dp_errf(err, "%s: out of memory", path);
    c->fd = -1;
    c->path = strdup(path);
    c->in = malloc(CSV_READ_BUF);
    c->rec_cap = cfg.max_record + 1 < 4096 ? cfg.max_record + 1 : 4096;
    c->rec = malloc(c->rec_cap);
    if (!c->path || !c->in || !c->rec) {
        dp_errf(err, "%s: out of memory", path);
        goto fail;
    }
    c->cfg = cfg;
    c->cfg.label = NULL;
    c->cfg.categorical = c->cfg.numeric = NULL;
    c->cfg.id_limits = NULL;
    c->line = 1;
    c->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (c->fd < 0) {
        dp_errf(err, "cannot open %s: %s", path, strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(c->fd, &st) != 0) {
        dp_errf(err, "cannot stat %s: %s", path, strerror(errno));
        goto fail;
    }
    if (S_ISDIR(st.st_mode)) {
        dp_errf(err, "%s: is a directory, not a CSV file", path);
        goto fail;
    }
    if (fill(c, err) != 0)
        goto fail;
    if (c->in_len >= 3 && memcmp(c->in, "\xEF\xBB\xBF", 3) == 0) /* UTF-8 BOM (Excel) */
        c->in_pos = 3;
    uint64_t start_off = c->in_pos;
    size_t len;
    uint64_t line;
    int r = next_record(c, &len, &line, err);
    if (r < 0)
        goto fail;
    if (r == 0) {
        dp_errf(err, "%s: the file is empty (no %s)", path, cfg.header ? "header" : "rows");
        goto fail;
    }
    /* A record of len bytes has at most len + 1 fields. */
    char **hf = malloc((len + 1) * sizeof *hf);
    if (!hf) {
        dp_errf(err, "%s: out of memory", path);
        goto fail;
    }
    if (split_fields(c, len, hf, len + 1, &c->ncols, line, err) != 0 ||
        keep_names(c, cfg.header ? hf : NULL, err) != 0) {
        free(hf);
        goto fail;
    }
    free(hf);
    if (c->ncols < 2) {
        dp_errf(err, "%s: line %llu has one column; a row needs a label and at least one "
                "feature (is the delimiter '%c' right?)", path, (unsigned long long)line,
                cfg.delimiter);
        goto fail;
    }
    if (choose_label(c, &cfg, err) != 0 || select_columns(c, &cfg, err) != 0)
        goto fail;
    c->f = malloc(c->ncols * sizeof *c->f);
    if (!c->f) {
        dp_errf(err, "%s: out of memory", path);
        goto fail;
    }
    if (cfg.header) {
        c->data_off = c->in_base + c->in_pos;
        c->data_line = c->line;
    } else {
        c->data_off = start_off;
        c->data_line = 1;
    }
    if (dp_csv_rewind(c, err) != 0)
        goto fail;
    *out = c;
    return 0;
fail:
    dp_csv_close(c);
    return -1;
}

int dp_csv_rewind(dp_csv *c, dp_err *err)
{
    if (lseek(c->fd, (off_t)c->data_off, SEEK_SET) < 0)
        return dp_errf(err, "%s: cannot seek back to the first row: %s", c->path,
                       strerror(errno));
    c->in_base = c->data_off;
    c->in_len = c->in_pos = 0;
    c->line = c->data_line;
    c->row_line = 0;
    return 0;
}

size_t dp_csv_columns(const dp_csv *c) { return c->ncols; }
size_t dp_csv_features(const dp_csv *c) { return c->sel ? c->n_feat : c->ncols - 1; }
size_t dp_csv_label_column(const dp_csv *c) { return c->label_col; }
uint64_t dp_csv_line(const dp_csv *c) { return c->row_line; }

const char *dp_csv_column_name(const dp_csv *c, size_t col)
{
    return col < c->ncols ? c->names[col] : NULL;
}

/* A number of column i: 0, or -1 naming line and column. */
static int number_of(const dp_csv *c, size_t i, unsigned long long ln, double *v, dp_err *err)
{
    const char *s = c->f[i];
    if (*s == '\0')
        return dp_errf(err, "%s: line %llu, column %zu (%s): empty field, expected a number",
                       c->path, ln, i + 1, c->names[i]);
    char *end;
    *v = strtod(s, &end);
    if (*end != '\0')
        return dp_errf(err, "%s: line %llu, column %zu (%s): '%.40s' is not a number", c->path,
                       ln, i + 1, c->names[i], s);
    return 0;
}

/* One id of a categorical cell: s[0..n) to *id. */
static int id_of(const dp_csv *c, const csv_sel *sl, const char *s, size_t n,
                 unsigned long long ln, float *id, dp_err *err)
{
    size_t i = sl->col;
    const char *name = c->names[i];
    int neg = n > 0 && s[0] == '-';
    size_t d = (size_t)neg;
    while (d < n && s[d] >= '0' && s[d] <= '9')
        d++;
    int integer = d == n && n > (size_t)neg && n - (size_t)neg <= 18; /* fits an int64 */
    if (c->buckets) {
        uint64_t h = dp_id_hash_text(s, n);
        if (integer) {
            long long v = 0;
            for (size_t q = (size_t)neg; q < n; q++)
                v = v * 10 + (s[q] - '0');
            h = dp_id_hash_int(neg ? -v : v);
        }
        *id = (float)(h % c->buckets);
        return 0;
    }
    if (!integer && !(n > (size_t)neg && d == n))
        return dp_errf(err, "%s: line %llu, column %zu (%s): id '%.*s' is not an integer (raw "
                       "ids need --hash-buckets N)", c->path, ln, i + 1, name,
                       (int)(n < 40 ? n : 40), s);
    if (neg)
        return dp_errf(err, "%s: line %llu, column %zu (%s): id %.*s is negative", c->path, ln,
                       i + 1, name, (int)(n < 40 ? n : 40), s);
    unsigned long long v = 0;
    for (size_t q = 0; q < n && v < sl->limit; q++)
        v = v * 10 + (unsigned long long)(s[q] - '0');
    if (v >= sl->limit)
        return dp_errf(err, "%s: line %llu, column %zu (%s): id %.*s is not below %u, %s "
                       "(give --hash-buckets N to hash raw ids)", c->path, ln, i + 1, name,
                       (int)(n < 40 ? n : 40), s, sl->limit,
                       sl->limit == DP_DATA_ID_LIMIT ? "the most a float holds exactly"
                                                 : "the rows of its embedding table");
    *id = (float)v;
    return 0;
}

/* A row of named columns (csv.h): the label, then the selected columns. */
static int named_row(dp_csv *c, float *features, uint32_t *label, uint64_t line, dp_err *err)
{
    unsigned long long ln = (unsigned long long)line;
    size_t lc = c->label_col, k = 0;
    double v;
    if (number_of(c, lc, ln, &v, err) < 0)
        return -1;
    if (!isfinite(v) || v != floor(v) || v < 0 || v >= c->cfg.classes)
        return dp_errf(err, "%s: line %llu, column %zu (%s): label '%.40s' is not a class index "
                       "in [0, %u)", c->path, ln, lc + 1, c->names[lc], c->f[lc],
                       c->cfg.classes);
    *label = (uint32_t)v;
    for (size_t j = 0; j < c->n_sel; j++) {
        const csv_sel *sl = &c->sel[j];
        const char *s = c->f[sl->col];
        if (!sl->places) {
            if (number_of(c, sl->col, ln, &v, err) < 0)
                return -1;
            if (!(fabs(v) <= FLT_MAX))
                return dp_errf(err, "%s: line %llu, column %zu (%s): '%.40s' is not a finite "
                               "float32 value", c->path, ln, sl->col + 1, c->names[sl->col], s);
            features[k++] = (float)v;
            continue;
        }
        int used = 0;
        while (*s) {
            size_t n = sl->places > 1 ? strcspn(s, "|") : strlen(s);
            if (used == sl->places)
                return dp_errf(err, "%s: line %llu, column %zu (%s): more than %d ids",
                               c->path, ln, sl->col + 1, c->names[sl->col], sl->places);
            if (id_of(c, sl, s, n, ln, &features[k + (size_t)used], err) < 0)
                return -1;
            used++;
            s += n;
            if (*s == '|')
                s++;
        }
        for (int q = used; q < sl->places; q++)
            features[k + (size_t)q] = -1.0f; /* an empty place */
        k += (size_t)sl->places;
    }
    c->row_line = line;
    return 1;
}

int dp_csv_next(dp_csv *c, float *features, uint32_t *label, dp_err *err)
{
    size_t len, nf;
    uint64_t line;
    int r = next_record(c, &len, &line, err);
    if (r <= 0)
        return r;
    unsigned long long ln = (unsigned long long)line;
    if (split_fields(c, len, c->f, c->ncols, &nf, line, err) != 0)
        return -1;
    if (nf != c->ncols)
        return dp_errf(err, "%s: line %llu has %zu fields, the %s has %zu", c->path, ln, nf,
                       c->cfg.header ? "header" : "first row", c->ncols);
    if (c->sel)
        return named_row(c, features, label, line, err);
    size_t k = 0;
    for (size_t i = 0; i < c->ncols; i++) {
        const char *s = c->f[i];
        const char *name = c->names[i];
        if (*s == '\0')
            return dp_errf(err, "%s: line %llu, column %zu (%s): empty field, expected a "
                           "number", c->path, ln, i + 1, name);
        char *end;
        double v = strtod(s, &end);
        if (*end != '\0')
            return dp_errf(err, "%s: line %llu, column %zu (%s): '%.40s' is not a number",
                           c->path, ln, i + 1, name, s);
        if (i == c->label_col) {
            if (!isfinite(v) || v != floor(v))
                return dp_errf(err, "%s: line %llu, column %zu (%s): label '%.40s' is not an "
                               "integer class index", c->path, ln, i + 1, name, s);
            if (v < 0)
                return dp_errf(err, "%s: line %llu, column %zu (%s): label %.0f is negative",
                               c->path, ln, i + 1, name, v);
            if (v >= c->cfg.classes)
                return dp_errf(err, "%s: line %llu, column %zu (%s): label %.0f is not below "
                               "the class count %u", c->path, ln, i + 1, name, v,
                               c->cfg.classes);
            *label = (uint32_t)v;
        } else {
            if (!(fabs(v) <= FLT_MAX)) /* NaN, infinity, or beyond float */
                return dp_errf(err, "%s: line %llu, column %zu (%s): '%.40s' is not a finite "
                               "float32 value", c->path, ln, i + 1, name, s);
            features[k++] = (float)v;
        }
    }
    c->row_line = line;
    return 1;
}
