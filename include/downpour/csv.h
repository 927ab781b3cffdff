/* CSV files of numeric features and an integer class label, read row after
 * row with bounded memory.
 *
 * The format: RFC 4180 records (fields separated by the delimiter, a field
 * in double quotes may hold delimiters, newlines and "" for a quote), LF or
 * CRLF line ends, an optional UTF-8 byte-order mark, an optional header
 * record naming the columns.  Spaces and tabs around a field are dropped;
 * a NUL byte (a UTF-16 file) is refused.
 * Blank lines (anywhere, the trailing one included) are skipped: a row has
 * at least two fields, so a blank line is never one.
 *
 * The label column: by name (cfg.label, needs a header), or by index
 * (cfg.label_column, 0-based); by default a column named "label" if the
 * header has one, else the first.  Every other column is a feature, in file
 * order.  Features are numbers (strtod's decimal or exponent forms) that fit
 * a finite float; labels are integers ("3" or "3.0") in [0, classes).
 *
 * Refusals name the file, the line (1-based, counted as an editor does, so a
 * record spanning lines is named by its first) and the column (1-based, with
 * its header name):
 *   "train.csv: line 12, column 1 (label): label 10 is not below the class
 *    count 10"
 *   "train.csv: line 7 has 4 fields, the header has 785"
 * A record longer than cfg.max_record bytes is refused, so memory is the
 * 64 KiB read buffer plus at most max_record bytes, whatever the file's size.
 * After a refusal the reader is positioned nowhere useful: close it (or
 * rewind). */
#ifndef DOWNPOUR_CSV_H
#define DOWNPOUR_CSV_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/status.h"

typedef struct dp_csv_config {
    int header;             /* 1: the first record names the columns */
    const char *label;      /* the label column by name, or NULL */
    int label_column;       /* the label column by 0-based index, or -1 */
    uint32_t classes;       /* labels must lie in [0, classes) */
    char delimiter;         /* ',' (or ';', '\t', ...; not '"', CR or LF) */
    size_t max_record;      /* bytes in one record; 0: 1 MiB */
    /* Named columns (docs/datasets.md, "Categorical and numeric columns"):
     * with either list set, a row's features are exactly the categorical
     * columns' ids, then the numeric columns, in the lists' orders, and
     * other columns are passed over.  categorical: names joined by ',',
     * each NAME or NAME:M (a multi-valued column of up to M ids joined by
     * '|' in its cell; unused places -1; an empty cell holds no id).  An id
     * is a decimal integer in [0, limit) of its column (id_limits[k], else
     * 2^24), refused naming the line and column when negative, not an
     * integer or not below it; with hash_buckets N > 0 any text is an id,
     * dp_id_hash'd into [0, N). */
    const char *categorical, *numeric;
    uint32_t hash_buckets;
    const uint32_t *id_limits; /* n_id_limits, one per categorical column; NULL: 2^24 */
    size_t n_id_limits;
} dp_csv_config;

/* header 1, label and label_column unset, classes 10, ',' and 1 MiB. */
void dp_csv_config_default(dp_csv_config *cfg);

typedef struct dp_csv dp_csv;

/* Opens path and reads the header (or, without one, the first record's field
 * count); the configuration is checked against it (a missing or ambiguous
 * label column, fewer than two columns). */
int dp_csv_open(dp_csv **out, const char *path, const dp_csv_config *cfg, dp_err *err);
void dp_csv_close(dp_csv *c); /* NULL is a no-op */

size_t dp_csv_columns(const dp_csv *c);        /* fields per record */
size_t dp_csv_features(const dp_csv *c);       /* columns - 1, or the named columns' values */
size_t dp_csv_label_column(const dp_csv *c);   /* 0-based */
/* A column's name from the header, or "column N" (1-based) without one. */
const char *dp_csv_column_name(const dp_csv *c, size_t col);

/* Reads the next row: features[dp_csv_features] and *label.  Returns 1 for a
 * row, 0 at the end of the file, -1 on a refusal. */
int dp_csv_next(dp_csv *c, float *features, uint32_t *label, dp_err *err);

/* The line on which the row last returned began. */
uint64_t dp_csv_line(const dp_csv *c);

/* Back to the first row (each epoch). */
int dp_csv_rewind(dp_csv *c, dp_err *err);

#endif
