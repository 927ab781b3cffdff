/* Datasets of records with class labels, opened by one call whatever they
 * are stored as (docs/architecture.md, "Data"; docs/datasets.md):
 *   - 8-bit images in IDX files (MNIST, Fashion-MNIST, KMNIST, or any
 *     directory of the four IDX files), decoded once into a cache file and
 *     mapped read-only, so every local process shares one copy;
 *   - record files (TFRecord, .npy/.npz, CSV: records.h), either decoded into
 *     a cache file the same way or, when the decoded records exceed the
 *     memory budget, streamed from their files (stream.h): chosen
 *     automatically and reported in one log line.
 *
 * Name resolution for --dataset:
 *   "mnist", "fashion-mnist", "kmnist"  -> $DOWNPOUR_DATA/<name>, default ./data/<name>
 *   a spec dp_data_files_match accepts  -> record files (a directory, glob or file)
 *   anything else                       -> a directory of IDX files
 * The IDX directory holds train-images-idx3-ubyte, train-labels-idx1-ubyte,
 * t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, each raw or with ".gz". */
#ifndef DOWNPOUR_DATASET_H
#define DOWNPOUR_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/records.h"
#include "downpour/rng.h"
#include "downpour/status.h"

struct dp_stream_source;
struct dp_stream;

/* A view of records: labels (n) and the features, one of
 *   images  (n, dim) bytes, scaled by 1/255 when gathered (the IDX sets,
 *           PNG or raw-byte TFRecord images, uint8 .npy arrays);
 *   values  (n, dim) floats, used as they are (CSV, float .npy, float lists);
 *   stream  neither in memory: the records are read from their files as the
 *           batcher walks them (stream.h); labels is NULL too.
 * file_end describes the files the records came from, for FILE sharding:
 * file f holds records [file_end[f-1], file_end[f]) (clipped to n), f <
 * n_files; n_files 0 means one undivided source (an IDX file), which FILE
 * sharding cuts into contiguous blocks. */
typedef struct dp_split {
    const uint8_t *images;
    const uint8_t *labels;
    uint32_t n;
    uint32_t dim;
    const float *values;
    const uint64_t *file_end;
    uint32_t n_files;
    const struct dp_stream_source *stream;
} dp_split;

typedef struct dp_dataset {
    char dir[1024];       /* where the IDX files were found; a record files' spec */
    char cache_path[1024]; /* "" when the decoded data is held in memory only, or streamed */
    uint32_t rows, cols;  /* image shape; dim = rows*cols*channels */
    /* Labels are below it.  IDX: 10 for the named datasets, else 1 + the
     * largest label.  Record files: decoded (a cache), 1 + the largest label
     * of either split (>= 2); streamed, the options' classes (the model's
     * outputs), or 1 + the largest test label when that is 0. */
    uint32_t classes;
    dp_split train_all;   /* every training record */
    dp_split test;        /* the test records */
    void *map;            /* read-only mapping of the cache file */
    size_t map_len;

    /* Record files only (is_files 1); the fields below are zero otherwise. */
    int is_files;
    int streamed;            /* 1: train_all.stream reads the training files */
    dp_data_format format;
    dp_value_kind kind;
    uint32_t channels;
    uint64_t decoded_bytes;  /* every record decoded: records * (dim * value size + 1) */
    size_t memory;           /* the budget the choice was made against */
    dp_data_files files;
    struct dp_stream_source *stream_source; /* streamed: what train_all.stream points to */
    uint64_t *file_end;      /* the training files' ends, then the test files' */
    void *test_mem;          /* streamed: the test records, decoded */
    struct dp_val_buffer *val_buf; /* streamed: the validation records dp_dataset_split decoded */
    char *opt_text;          /* the data options' strings, owned */
} dp_dataset;

/* How to open a dataset of record files (IDX datasets ignore it). */
typedef struct dp_dataset_options {
    dp_data_options data;
    int stream;      /* -1 auto (stream when the decoded records exceed memory), 0 never
                        (the decoded cache), 1 always */
    size_t memory;   /* budget in bytes for decoded data, streamed or not (a stream's
                        buffers, the test and validation records together); 0:
                        $DOWNPOUR_DATA_MEMORY, else half the machine's physical memory */
    uint32_t window; /* streaming's shuffle window in records, 0: as the budget allows */
} dp_dataset_options;

void dp_dataset_options_default(dp_dataset_options *o);

/* A byte count as people write it: "1500000", "800M", "12G", "1.5T" (decimal
 * k/K, M, G, T), "512Mi", "8Gi" (binary), each with an optional trailing "B".
 * what names the setting in the message ("--data-memory"). */
int dp_data_memory_parse(const char *s, size_t *out, const char *what, dp_err *err);

/* Resolves spec, reads or builds the cache, maps it.  The cache lives
 * in $DOWNPOUR_CACHE, else beside the data if writable, else $XDG_CACHE_HOME/downpour or
 * ~/.cache/downpour; it is rebuilt when the source files change (size, mtime,
 * inode) and, with a warning naming the file and the check, when its header
 * or a payload section's checksum is wrong (checked on every open).  The named datasets
 * refuse labels >= 10; a directory has 1 + its largest label classes (>= 2).
 * A missing KMNIST says where to download it and where to put it.
 *
 * Record files: decoded into such a cache when o->stream is 0, or -1 and
 * the decoded records fit o->memory; otherwise the training records are
 * streamed (train_all.stream set, no record in memory) and the test records
 * decoded into memory.  The budget is whole: the stream's bound
 * (train_all.stream->memory) is what the test records leave of it, and the
 * open is refused, naming the sizes, when that cannot hold the least stream
 * (dp_stream_least_bytes for a batch of 1).  One info line reports the
 * files, the counts, the choice and, streamed, the budget's parts. */
int dp_dataset_open_with(dp_dataset *ds, const char *spec, const dp_dataset_options *o,
                         dp_err *err);
/* dp_dataset_open_with with dp_dataset_options_default. */
int dp_dataset_open(dp_dataset *ds, const char *name_or_dir, dp_err *err);
/* Where the known names live: $DOWNPOUR_DATA, "./data" when it is unset or
 * empty.  The one reader of that variable, for the library and the program. */
const char *dp_dataset_root(void);
void dp_dataset_close(dp_dataset *ds);

/* In-memory datasets: caller-owned arrays registered under a name and
 * opened as "mem:NAME" (dp_dataset_open_with, so train's --dataset and
 * eval's in the same process), with nothing copied: the splits point at
 * the caller's records, which must outlive every dataset opened on them
 * (the Python package, docs/python.md).  Inputs are n records of
 * rows*cols*channels values, bytes scaled by 1/255 when gathered (as IDX
 * images) or floats used as they are; channels 0 or 1 is one channel, more
 * are stored pixel by pixel (HWC), as record files' images. */
#define DP_MEMORY_PREFIX "mem:"
typedef struct dp_memory_data {
    const void *train_x;      /* n_train records: uint8_t, or float when is_float */
    const uint8_t *train_y;   /* n_train labels */
    uint32_t n_train;         /* > 0 */
    const void *test_x;       /* n_test records (NULL when n_test is 0) */
    const uint8_t *test_y;
    uint32_t n_test;
    uint32_t rows, cols, channels;
    int is_float;
    uint32_t classes;         /* labels are below it; 0: 1 + the largest label (>= 2) */
} dp_memory_data;
/* Registers (or replaces) `name`, checking the labels against classes:
 * 0, or -1 with the reason.  Thread-safe; at most 32 names at once. */
int dp_dataset_register(const char *name, const dp_memory_data *d, dp_err *err);
/* Forgets `name` (datasets already open keep their pointers): 0, or -1 when
 * it is not registered. */
int dp_dataset_unregister(const char *name);
/* Whether spec is "mem:NAME" with NAME registered. */
int dp_dataset_is_memory(const char *spec);
/* Opens "mem:NAME" (dp_dataset_open_with does for such a spec). */
int dp_dataset_memory_open(dp_dataset *ds, const char *spec, dp_err *err);

/* The source experiment's split: of the training records the first n_train
 * train and the next n_val validate (54,000 and 6,000 by default).  Returns -1
 * if they do not fit.  train keeps the files' bounds (file_end, n_files)
 * of the records it holds.  A streamed dataset's train is streamed too, and
 * its validation records are decoded into memory the dataset owns, read from
 * the training files once per call: val stays valid until the next call or
 * dp_dataset_close.  The stream's bound becomes the budget less the test
 * records and the validation buffer (the largest asked for so far), read
 * by a stream opened after the call; the call is refused, naming the sizes,
 * when that cannot hold the least stream, and otherwise logs one line:
 * "streaming: 16.0 MB budget = 7.8 MB test + 4.7 MB validation + 3.5 MB
 * stream". */
int dp_dataset_split(const dp_dataset *ds, uint32_t n_train, uint32_t n_val, dp_split *train,
                     dp_split *val, dp_err *err);

/* Sharding policies for data-parallel workers. */
typedef enum dp_shard_policy {
    DP_SHARD_OFF,  /* every worker sees every record */
    DP_SHARD_DATA, /* every worker shuffles all records alike (same seed) and worker k
                      of w keeps positions k, k+w, k+2w, ... of that order, as
                      TensorFlow's DATA auto-shard does: so the w workers' j-th
                      batches of b together are the j-th batch of w*b of one process */
    DP_SHARD_FILE, /* whole files: worker k of w keeps files k, k+w, k+2w, ... of
                      those holding records of the split (n_files > 0), as
                      TensorFlow's FILE auto-shard does, and fewer such files than
                      workers is refused; one undivided source (n_files 0) is cut
                      into w contiguous blocks, the k-th kept */
    DP_SHARD_COUNT
} dp_shard_policy;

int dp_shard_parse(const char *name, dp_shard_policy *out, dp_err *err);

/* How many of the split's records shard k of w owns under a policy (OFF:
 * all), so every worker knows every other's batch sizes without asking.
 * Needs only n and the file bounds, not the records. */
uint32_t dp_shard_size(dp_shard_policy p, const dp_split *s, int k, int w);
/* The largest of the w shards (FILE's whole files may differ by more than
 * one record), so steps per epoch cover every worker's shard. */
uint32_t dp_shard_max(dp_shard_policy p, const dp_split *s, int w);
/* Whether w workers can shard split under policy: FILE over files needs at
 * least as many files as workers (the trap TensorFlow's FILE policy sets);
 * -1 with the reason and the fixes otherwise. */
int dp_shard_check(dp_shard_policy policy, const dp_split *split, int workers, dp_err *err);
/* The batch a worker takes when the split is re-dealt among `live` of the
 * `all` workers a run started with (docs/faults.md): enough that an epoch
 * keeps its steps_per_epoch steps, at most max_batch; with all of them
 * there, the run's own batch. */
int dp_redeal_batch(int batch, int all, int live, uint32_t total, long steps_per_epoch,
                    int max_batch);
const char *dp_shard_name(dp_shard_policy p);

/* Walks a split in batches, reshuffled every epoch from a seed.  All memory
 * is allocated in dp_batcher_init; dp_batcher_next allocates nothing. */
typedef struct dp_batcher {
    const dp_split *split;
    uint32_t *order;     /* indices of the records this batcher owns */
    uint32_t n;          /* how many it owns */
    uint32_t first;      /* its natural order is first + i*stride, i < n
                            (by_files: of file ranks, below) */
    uint32_t *perm;      /* DATA: the epoch's order of every record of the split */
    uint32_t stride;
    uint32_t block;      /* DATA by blocks (dp_batcher_blocks): it owns blocks first,
                            first + stride, ... of `block` consecutive positions of
                            the epoch's order; 0: every stride-th position */
    int by_files;        /* FILE over files: it owns the records of the files of
                            ranks first + i*stride among those holding records */
    uint32_t pos;        /* next position in order */
    uint64_t seed;
    long epoch;          /* epochs started */
    int shuffle;
    /* a streamed split (split->stream): the stream, opened at the first
     * dp_batcher_next with its batch size, and what went wrong */
    struct dp_stream *stream;
    dp_shard_policy stream_policy;
    int stream_index, stream_count, stream_failed;
    dp_err err;          /* why dp_batcher_next returned -1 */
    const struct dp_augment *augment; /* training batches' augmentation (augment.h), or NULL */
} dp_batcher;

/* Owns the records of shard `shard_index` of `shard_count` under `policy`.
 * A streamed split's records are read from their files as it walks them
 * (stream.h); any other's must be in memory (dp_split_in_memory). */
int dp_batcher_init(dp_batcher *b, const dp_split *split, uint64_t seed, int shuffle,
                    dp_shard_policy policy, int shard_index, int shard_count, dp_err *err);
void dp_batcher_free(dp_batcher *b);
/* Starts epoch `epoch` (0-based): order is a permutation seeded by (seed, epoch),
 * so any process can reproduce any epoch's order.  (A streamed split's
 * failure here, or in dp_batcher_seek, is returned by the next
 * dp_batcher_next.) */
void dp_batcher_start_epoch(dp_batcher *b, long epoch);
/* Fills x (batch, dim) with pixels / 255 (or the float values) and y (batch)
 * with labels; returns the number of records written (< batch at the end of
 * the epoch, 0 when done), or -1 with b->err set (a streamed split's record
 * refused: stream.h). */
int dp_batcher_next(dp_batcher *b, float *x, uint8_t *y, int batch);
/* The same walk, giving the records' indices into the split instead of their
 * data (a device gathers them itself: device.h); -1 with b->err for a
 * streamed split, whose records are not in memory. */
int dp_batcher_next_indices(dp_batcher *b, uint32_t *idx, int batch);
/* From now on dp_batcher_next augments each record as a (augment.h) draws
 * it for (the epoch, its index in the split); a must outlive the batcher.
 * A streamed split is refused (its records come without their index). */
int dp_batcher_augment(dp_batcher *b, const struct dp_augment *a, dp_err *err);
/* DATA sharding by blocks: shard k of w owns blocks k, k + w, ... of
 * `block` consecutive positions of the epoch's order, instead of positions
 * k, k + w, ...  With block = the per-shard batch, step j's w batches are
 * then positions j*w*block .. (j+1)*w*block - 1 in shard order, each
 * shard's a contiguous run (--sum-chunk: docs/strategies.md).  Only for a
 * DATA batcher over records in memory, before its first epoch. */
int dp_batcher_blocks(dp_batcher *b, uint32_t block, dp_err *err);
/* Skips to position pos of the epoch's order (a resumed run's place in
 * its epoch); past the end means the epoch is over. */
void dp_batcher_seek(dp_batcher *b, uint32_t pos);
/* Number of batches in one epoch of this batcher (the last may be short). */
uint32_t dp_batcher_batches(const dp_batcher *b, int batch);

/* Whether the split's records and labels are in memory (images or values),
 * as gathering needs; a streamed split's are not. */
int dp_split_in_memory(const dp_split *s);
/* Copies records idx[0..n) of split into x (pixels / 255, or the float
 * values as they are) and y (y may be NULL).  A split not in memory gives
 * zeros: callers refuse one first (dp_split_in_memory). */
void dp_split_gather(float *x, uint8_t *y, const dp_split *s, const uint32_t *idx, int n);

#endif
