/* Datasets stored as files of records: TFRecord files of tf.train.Example
 * (tfrecord.h, example.h, png.h), NumPy arrays (npy.h) and CSV tables
 * (csv.h), found in a directory, a glob or one file, split into training and
 * test files by name, and read one file at a time in record order
 * (docs/datasets.md, "Datasets of files").
 *
 * Every record becomes the same thing whatever the format: `dim` feature
 * values and one class label below 256.  Features are either bytes (an
 * image's pixels, scaled by 1/255 when a batch is gathered, as the IDX sets
 * are) or floats (used as they are): which one is fixed by the dataset's
 * first record, and every later record must match it in kind and shape.
 *
 *   format     features                                   label
 *   tfrecord   Example bytes feature (PNG, as TensorFlow  Example int64 (or integral
 *              Datasets writes the MNIST family; or raw      float) feature of one value
 *              bytes), float list, or int64 list (floats)
 *   npy        an array (rows, ...): uint8 as bytes,      an array (rows,) or (rows, 1)
 *              any other dtype as floats
 *   csv        every column but the label's, as floats    the label column
 *
 * Feature names: the Example's image feature is opt->image ("image") and its
 * label opt->label ("label"), TensorFlow Datasets' names.  A CSV's label
 * column is opt->label when set, else "label" when the header has one, else
 * the first column; a CSV has a header when its first record is not all
 * numbers.
 *
 * Finding the files of a dataset spec (a directory, a glob, or one file):
 *   - every regular file the spec names whose format is known: *.tfrecord*,
 *     *.tfrec and any name holding ".tfrecord" (TFDS's
 *     "mnist-train.tfrecord-00000-of-00008"), *.npy, *.npz, *.csv; formats
 *     may not be mixed;
 *   - the training files are those whose base name matches opt->train
 *     ("*train*"), the test files those matching opt->test ("*test*"), both
 *     fnmatch(3) patterns; a file matching both or neither is refused, as is
 *     a split with no file, naming the files and the patterns;
 *   - npy: each split is one pair of .npy files, the labels being the one
 *     whose name starts with "y" or holds "label" (x_train.npy and
 *     y_train.npy, as keras names them); an .npz holds both splits as the
 *     members x_train, y_train, x_test, y_test (keras's mnist.npz);
 *   - files of a split are sorted by name (so shard 00003-of-00008 comes
 *     third), which is the dataset's record order.
 *
 * All refusals name the file and, for a record, its index in the file:
 *   "data/mnist-train.tfrecord-00002-of-00008: record 17: feature "image":
 *    PNG of 32x32 pixels, the dataset's first record has 28x28" */
#ifndef DOWNPOUR_RECORDS_H
#define DOWNPOUR_RECORDS_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/status.h"

typedef enum dp_data_format {
    DP_DATA_TFRECORD,
    DP_DATA_NPY, /* .npy pairs or one .npz */
    DP_DATA_CSV,
    DP_DATA_FORMAT_COUNT
} dp_data_format;

const char *dp_data_format_name(dp_data_format f); /* "tfrecord", "npy", "csv" */

typedef enum dp_value_kind {
    DP_VALUES_U8,  /* bytes, scaled by 1/255 when gathered */
    DP_VALUES_F32, /* floats, used as they are */
    DP_VALUES_KIND_COUNT
} dp_value_kind;

const char *dp_value_kind_name(dp_value_kind k); /* "uint8", "float32" */
size_t dp_value_size(dp_value_kind k);           /* 1 or 4 */

/* How to read a dataset's files.  dp_data_options_default fills TFDS's names
 * and the split patterns, leaving label NULL (an Example's "label"; a CSV's
 * column picked as above); NULL fields take those defaults. */
typedef struct dp_data_options {
    const char *image; /* Example feature of the inputs: "image" */
    const char *label; /* Example feature or CSV column of the label: NULL: "label" (CSV: picks) */
    const char *train; /* fnmatch pattern of the training files' base names: "*train*" */
    const char *test;  /* of the test files: "*test*" */
    uint32_t classes;  /* labels must be below it: 2..256; 0: 256 */
    /* Named categorical and numeric columns (CSV columns, Example features;
     * docs/datasets.md, "Categorical and numeric columns"): NULL, NULL: the
     * format's usual features.  As dp_csv_config's. */
    const char *categorical, *numeric;
    uint32_t hash_buckets;     /* 0: ids as given; N: raw ids hashed into [0, N) */
    const uint32_t *id_limits; /* per categorical column: ids below it (NULL: 2^24) */
    size_t n_id_limits;
} dp_data_options;

void dp_data_options_default(dp_data_options *o);

/* The documented hash of a raw categorical id (docs/datasets.md,
 * "Categorical and numeric columns"), then taken modulo --hash-buckets: an
 * integer v (an int64 feature, or a CSV cell that is a decimal integer) is
 * splitmix64's finaliser of (uint64_t)v; any other text is FNV-1a 64 of
 * its bytes, then the same finaliser. */
uint64_t dp_id_hash_int(int64_t v);
/* Bounds of named categorical columns: ids of a multi-valued column
 * (NAME:M, M at most this), and ids as given (no --hash-buckets) below
 * 2^24, since they travel as floats, exact below it. */
#define DP_DATA_MAX_PLACES 4096
#define DP_DATA_ID_LIMIT (1u << 24)
/* One item of a --categorical or --numeric list: the item's text (for
 * messages), its name, and (categorical) its places: NAME:M, 1 without.
 * The last ':' splits, so a name may hold one. */
typedef struct dp_data_column {
    const char *item, *name;
    size_t item_len, name_len;
    int places;
} dp_data_column;
/* Reads the item at *s into c and moves *s past it and its ','.  Returns 1,
 * 0 at the end of the list, -1 for a malformed item (an empty name, or M
 * not in [1, DP_DATA_MAX_PLACES]); c->item names it then. */
int dp_data_column_next(const char **s, int categorical, dp_data_column *c);
/* The places of each column of a --categorical list ("a,b:4": 1 and 4),
 * the first cap written; returns how many columns, or -1 for a malformed
 * list. */
int dp_data_categorical_places(const char *list, int *places, int cap);
/* Named categorical columns against a model's embedding bags (rows and
 * places a bag, dp_model_bags): as many columns as bags, each holding the
 * bag's places, and --hash-buckets no more than any bag's rows.  Fills
 * limits (n_bags) with the rows, for dp_data_options.id_limits; fails
 * naming what differs. */
int dp_data_check_bags(const dp_data_options *o, const uint32_t *rows, const int *places,
                       int n_bags, uint32_t *limits, dp_err *err);
uint64_t dp_id_hash_text(const char *s, size_t n);

/* The shape every record of a dataset has. */
typedef struct dp_record_shape {
    dp_value_kind kind;
    uint32_t rows, cols, channels; /* an image's; flat features are 1 x dim x 1 */
    uint32_t dim;                  /* rows * cols * channels values */
} dp_record_shape;

/* One file of a split: a TFRecord or CSV file, an .npy pair, or an .npz's
 * pair of members. */
typedef struct dp_data_file {
    char *path;         /* the features' file (TFRecord, CSV, x .npy, the .npz) */
    char *labels_path;  /* npy: the labels' .npy; NULL otherwise */
    char *member;       /* npz: the features' member ("x_train"); NULL otherwise */
    char *labels_member;/* npz: the labels' member ("y_train"); NULL otherwise */
    uint64_t records;   /* filled by dp_data_files_count */
    uint64_t first;     /* index of its first record in the split (files in order) */
} dp_data_file;

typedef struct dp_data_split_files {
    dp_data_file *files;
    size_t n;
    uint64_t records; /* the sum over files, after dp_data_files_count */
} dp_data_split_files;

typedef struct dp_data_files {
    dp_data_format format;
    dp_data_split_files train, test;
    dp_record_shape shape; /* after dp_data_files_count */
    int counted;
} dp_data_files;

/* Whether spec looks like a dataset of record files (a glob, or a path that
 * is a file of a known format, or a directory holding one) rather than a
 * dataset name or a directory of IDX files.  Never fails: an unreadable path
 * is "no", and the IDX path reports it. */
int dp_data_files_match(const char *spec);

/* Finds the files of spec and sorts them into the splits (see above); no
 * file is opened.  On -1 *out holds nothing. */
int dp_data_files_find(dp_data_files *out, const char *spec, const dp_data_options *opt,
                       dp_err *err);

/* Counts every file's records (reading each through, every TFRecord's CRCs
 * and every CSV field checked; an .npy's header gives its rows) and takes
 * the shape from the first training record; sets first and records. */
int dp_data_files_count(dp_data_files *f, const dp_data_options *opt, dp_err *err);

void dp_data_files_free(dp_data_files *f);

/* Reads one file's records in order.  Holds bounded memory whatever the
 * file's size: the format reader's buffers and one record. */
typedef struct dp_record_reader dp_record_reader;

/* Opens file f of a dataset whose records have `shape` (from
 * dp_data_files_count): every record read is checked against it. */
int dp_record_open(dp_record_reader **out, const dp_data_file *f, dp_data_format format,
                   const dp_record_shape *shape, const dp_data_options *opt, dp_err *err);

/* The next record: shape->dim values into features (bytes or floats, as
 * shape->kind says) and its label.  1 for a record, 0 at the end, -1 on a
 * refusal naming the file and the record's index. */
int dp_record_next(dp_record_reader *r, void *features, uint8_t *label, dp_err *err);

/* Skips n records without decoding their features (a resumed stream, a
 * shard that keeps every w-th record).  Returns the number skipped (< n at
 * the end) or -1. */
int64_t dp_record_skip(dp_record_reader *r, uint64_t n, dp_err *err);

/* Index of the next record in the file. */
uint64_t dp_record_index(const dp_record_reader *r);

/* Bytes the reader holds, for the streaming memory bound: its struct and
 * names and the format's buffers.  TFRecord: tfrecord.c's read buffer, its
 * record buffer (as large as the largest record so far) and, for a gzip
 * file, zlib's state (DP_TFRECORD_GZIP_BYTES); the Example's decoded arrays;
 * and once a record was a PNG, what libpng takes while it decodes one
 * (about 50 KiB for 28x28; its ancillary chunks are not counted).  npy: the
 * two 1 MiB staging buffers and the chunk of rows; CSV: the read buffer,
 * the longest record (1 MiB) and a row. */
size_t dp_record_reader_bytes(const dp_record_reader *r);

/* What the reader may come to hold for records of up to twice the size of
 * the largest it has read: dp_record_reader_bytes with TFRecord's record
 * buffer and the Example's arrays grown once more (npy's and CSV's buffers
 * do not grow).  A stream reserves it from its first record. */
size_t dp_record_reader_reserve(const dp_record_reader *r);

/* Caps the bytes the reader holds (0: no cap): a TFRecord record whose data
 * would take the record buffer past what the cap leaves is refused, naming
 * the file and the record, before it is read ("length 90000 is above the
 * limit of 70312 bytes per record").  What decoding it adds (the Example's
 * arrays, a PNG's) is counted after; the caller checks that. */
void dp_record_limit(dp_record_reader *r, size_t bytes);

void dp_record_close(dp_record_reader *r); /* NULL is a no-op */

#endif
