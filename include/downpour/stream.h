/* Streaming a dataset's training records from their files, for a dataset
 * larger than the memory it may take (docs/datasets.md, "Streaming").
 *
 * A stream walks the records one shard owns, reading its files in order
 * (records.h) through a bounded buffer and a shuffle window, as tf.data's
 * interleave-free `list_files(shuffle) -> TFRecordDataset -> shuffle(window)`
 * does:
 *   - each epoch the shard's files are taken in an order shuffled from
 *     (seed, epoch) (with shuffle off: in name order);
 *   - records enter a window of `window` records; each record given out is
 *     drawn from the window at random and its slot refilled by the next one
 *     read, and at the end the window drains in random order.  With a window
 *     of at least the shard's records this is a full shuffle; with 1 it is
 *     file order;
 *   - the draws come from an RNG seeded by (seed, epoch) alone, so an epoch's
 *     order is the same on every run whatever the reader's timing, and a
 *     resumed run skips to its place by walking the same order: the walk's
 *     draws depend only on how many records have entered the window, so it
 *     is run on record indices, and only the records the window holds there
 *     are decoded (dp_stream_seek).
 *
 * Shards (the split's file_end says where its files begin and end):
 *   OFF   every record, in every worker;
 *   DATA  worker k of w keeps records k, k+w, k+2w, ... of the split's file
 *         order, reading every file and skipping the others' records without
 *         decoding them (TensorFlow's DATA policy);
 *   FILE  worker k of w reads files k, k+w, k+2w, ... only, whole: refused
 *         when the split has fewer files than workers.
 *
 * Memory: a stream holds the window, a bounded queue of decoded records
 * between its reader thread and the batches, and one file reader's buffers
 * (reserved as dp_record_reader_reserve measures them on the shard's first
 * record), all allocated when it opens; dp_stream_peak_bytes reports the
 * most it held, which never exceeds the bound it was given: a record that
 * would take the reader past it is refused, naming the file and record. */
#ifndef DOWNPOUR_STREAM_H
#define DOWNPOUR_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/dataset.h"
#include "downpour/records.h"
#include "downpour/status.h"

/* What a streamed split reads: the first n records (split->n) of the files,
 * in order.  Owned by the dataset (dp_dataset_open), pointed to by
 * dp_split.stream. */
typedef struct dp_stream_source {
    const dp_data_split_files *files; /* the split's files, counted */
    dp_data_format format;
    dp_record_shape shape;
    dp_data_options opt;
    /* The most bytes one stream may hold, read by dp_stream_open.  A
     * dataset's is its budget less `held`, the bytes of its test and
     * validation records (docs/datasets.md, "The decoded cache or
     * streaming"); held is 0 for a source made by hand, and only names the
     * parts in messages. */
    size_t memory;
    size_t held;
    uint32_t window; /* shuffle window in records; 0: as many as the memory bound allows */
} dp_stream_source;

typedef struct dp_stream dp_stream;

/* Opens a stream over shard k of w of split (split->stream set) under
 * policy, with split->stream->memory as its bound.  It reads the first
 * record of the shard's first file to measure the reader's reserve, then
 * nothing until dp_stream_start_epoch.  max_batch is the largest batch
 * dp_stream_next will be asked for.  Refuses a bound too small for the
 * reader's reserve, a queue of two batches and a window of one, naming the
 * sizes. */
int dp_stream_open(dp_stream **out, const dp_split *split, dp_shard_policy policy, int k, int w,
                   uint64_t seed, int shuffle, int max_batch, dp_err *err);

/* The least bound a stream over src's files with batches of max_batch
 * opens with, whatever its shard: dp_stream_open's need with every file
 * listed, the reader's reserve measured on the first file with records. */
int dp_stream_least_bytes(const dp_stream_source *src, int max_batch, size_t *out, dp_err *err);

/* Records this shard owns in one epoch (the batcher's n). */
uint32_t dp_stream_records(const dp_stream *s);

/* The same count without opening a stream (the batcher's init), with
 * dp_stream_open's refusals of the shard (FILE with fewer files than
 * workers, a shard with no records). */
int dp_stream_shard_records(const dp_split *split, dp_shard_policy policy, int k, int w,
                            uint32_t *n, dp_err *err);

/* Starts epoch `epoch` (0-based).  When it follows an epoch read through,
 * the reader thread has already gone on into it (docs/datasets.md,
 * "Streaming"); otherwise the last one's reading ends and this one's
 * starts at its first record asked for (a seek first costs no reading). */
int dp_stream_start_epoch(dp_stream *s, long epoch, dp_err *err);

/* The next batch into x (batch, dim) (bytes scaled by 1/255, floats as they
 * are) and y: the number of records (< batch at the epoch's end, 0 when it
 * is over) or -1 on a refusal naming the file and record. */
int dp_stream_next(dp_stream *s, float *x, uint8_t *y, int batch, dp_err *err);

/* Skips to position pos of the epoch's order (a resumed run; past the
 * epoch's records: its end), then gives out what the uninterrupted epoch
 * would.  It decodes at most window records, whatever pos: a few steps
 * ahead it draws on; otherwise it reads the files from the epoch's start,
 * skipping (dp_record_skip) every record but those the window holds at
 * pos.  -1 on a refusal naming the file and record. */
int dp_stream_seek(dp_stream *s, uint32_t pos, dp_err *err);

/* The window in records, and the most bytes the stream has held. */
uint32_t dp_stream_window(const dp_stream *s);
size_t dp_stream_peak_bytes(const dp_stream *s);

/* Records the stream has decoded since it opened (by its reader thread or
 * inline), counting none it only skipped: what a seek or an epoch cost in
 * decoding. */
uint64_t dp_stream_decoded(const dp_stream *s);

/* Whether records are read by a reader thread (1) or inline by
 * dp_stream_next (0).  $DOWNPOUR_STREAM_READER "thread" or "inline" fixes
 * it; otherwise the first records are read inline and timed, and the rest
 * go to a thread where reading is slow enough for one to pay and the
 * machine has two cores (docs/datasets.md, "Streaming").  The order of the
 * records is the same either way. */
int dp_stream_threaded(const dp_stream *s);

/* From now on dp_stream_next augments each record as a (augment.h) draws
 * it for (the epoch, its index in the split): the same values a gather from
 * memory gives it.  a must outlive the stream; NULL: none. */
struct dp_augment;
void dp_stream_augment(dp_stream *s, const struct dp_augment *a);

void dp_stream_close(dp_stream *s); /* NULL is a no-op */

#endif
