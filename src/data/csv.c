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

#define CSV_READ_BUF ((size_t)64 << 10)
#define CSV_DEFAULT_MAX_RECORD ((size_t)1 << 20)
#define CSV_LIMIT_MAX_RECORD ((size_t)1 << 30)

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
};

void dp_csv_config_default(dp_csv_config *cfg)
{
    cfg->header = 1;
    cfg->label = NULL;
    cfg->label_column = -1;
    cfg->classes = 10;
    cfg->delimiter = ',';
    cfg->max_record = CSV_DEFAULT_MAX_RECORD;
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
    if (choose_label(c, &cfg, err) != 0)
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
size_t dp_csv_features(const dp_csv *c) { return c->ncols - 1; }
size_t dp_csv_label_column(const dp_csv *c) { return c->label_col; }
uint64_t dp_csv_line(const dp_csv *c) { return c->row_line; }

const char *dp_csv_column_name(const dp_csv *c, size_t col)
{
    return col < c->ncols ? c->names[col] : NULL;
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
