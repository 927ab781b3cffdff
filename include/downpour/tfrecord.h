/* TFRecord files: TensorFlow's framing of a sequence of byte strings
 * (usually serialized tf.train.Example protos, example.h).  Each record is
 *
 *   offset  size  field
 *   0       8     length L of the data, little-endian uint64
 *   8       4     masked CRC32C of the 8 length bytes, little-endian
 *   12      L     data
 *   12+L    4     masked CRC32C of the data, little-endian
 *
 * with mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 over CRC32C
 * (crc32c.h).  A GZIP TFRecord file is that byte stream compressed as one
 * gzip stream (or several concatenated members), as TensorFlow writes it.
 *
 * The reader streams: it holds a 64 KiB read buffer and one record, never the
 * file.  For every record it checks, in this order, that the 12-byte head is
 * whole, the length's CRC, the length against the limit (before allocating
 * anything for it), that the data and its CRC are whole, and the data's CRC.
 * A file that ends exactly after a record is the end; any other end is
 * "truncated".  Every refusal names the file and the record's index (0 is
 * the first) and where it starts in the (decompressed) stream:
 *   "mnist-train.tfrecord-00003-of-00008: record 17 (byte 5012): data CRC
 *    mismatch (stored 0x1c2d3e4f, computed 0x0a0b0c0d)" */
#ifndef DOWNPOUR_TFRECORD_H
#define DOWNPOUR_TFRECORD_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/status.h"

/* The default limit on one record's data: far above an image Example, low
 * enough that a damaged length never asks for gigabytes. */
#define DP_TFRECORD_MAX_RECORD ((size_t)64 << 20)

typedef enum dp_tfrecord_compression {
    /* Reader: gzip when the file starts with the gzip magic (1f 8b) and its
     * first 12 bytes are not a valid record head (a raw file whose first
     * length happens to start 1f 8b has a head whose CRC matches); the name
     * does not matter.  Writer: gzip when the path ends in ".gz". */
    DP_TFRECORD_AUTO,
    DP_TFRECORD_RAW,
    DP_TFRECORD_GZIP,
    DP_TFRECORD_COMPRESSION_COUNT
} dp_tfrecord_compression;

/* Reader options; a zeroed struct (or NULL) means AUTO and the default limit. */
typedef struct dp_tfrecord_options {
    dp_tfrecord_compression compression;
    size_t max_record; /* largest record data accepted; 0: DP_TFRECORD_MAX_RECORD */
} dp_tfrecord_options;

typedef struct dp_tfrecord_reader dp_tfrecord_reader;

/* Opens path for reading (opt may be NULL).  *out is NULL on failure. */
int dp_tfrecord_open(dp_tfrecord_reader **out, const char *path,
                     const dp_tfrecord_options *opt, dp_err *err);

/* Reads the next record.  Returns 1 with *data and *len set (the bytes are
 * the reader's, valid until the next call or close; an empty record has
 * len 0), 0 at a clean end of file, -1 on an error.  After -1 or 0 every
 * later call returns the same again. */
int dp_tfrecord_next(dp_tfrecord_reader *r, const uint8_t **data, size_t *len, dp_err *err);

/* Records returned so far: the index of the next record. */
uint64_t dp_tfrecord_count(const dp_tfrecord_reader *r);

/* Whether the file is read as gzip (after AUTO's decision). */
int dp_tfrecord_is_gzip(const dp_tfrecord_reader *r);

/* What zlib holds for a gzip reader, counted rather than asked (zlib has no
 * call that says): gzread's input buffer and its output buffer of twice
 * that (64 + 128 KiB, the 64 KiB gzbuffer the reader sets), the inflate
 * window (32 KiB for gzip's 15 window bits) and the inflate and gz states
 * (about 7 KiB and 0.3 KiB; 8 KiB counted). */
#define DP_TFRECORD_GZIP_BYTES ((size_t)232 << 10)

/* Bytes the reader holds: its struct and path, the 64 KiB read buffer, the
 * record buffer (as large as the largest record so far:
 * dp_tfrecord_record_capacity) and, reading gzip, DP_TFRECORD_GZIP_BYTES. */
size_t dp_tfrecord_reader_bytes(const dp_tfrecord_reader *r);
size_t dp_tfrecord_record_capacity(const dp_tfrecord_reader *r);

/* Changes the limit on one record's data (0: DP_TFRECORD_MAX_RECORD) for the
 * records still to be read: a longer one is refused, naming it, before any
 * byte of it is held. */
void dp_tfrecord_set_max_record(dp_tfrecord_reader *r, size_t max_record);

/* Closes the file and frees the reader; NULL is a no-op. */
void dp_tfrecord_close(dp_tfrecord_reader *r);

/* The masked CRC32C of a record field, for writers and tests. */
uint32_t dp_tfrecord_masked_crc(const void *buf, size_t len);

typedef struct dp_tfrecord_writer dp_tfrecord_writer;

/* Creates path for writing records, replacing it atomically at close
 * (file.h): a reader never sees half a file.  AUTO is gzip for a ".gz" name.
 * *out is NULL on failure. */
int dp_tfrecord_writer_open(dp_tfrecord_writer **out, const char *path,
                            dp_tfrecord_compression compression, dp_err *err);

/* Appends one record (len may be 0).  Errors are sticky: later writes and
 * the close fail too, and the file is not put in place. */
int dp_tfrecord_write(dp_tfrecord_writer *w, const void *data, size_t len, dp_err *err);

/* Flushes, ends the gzip stream, fsyncs and renames the file into place.
 * Frees w either way; on -1 path is untouched.  NULL is a no-op (0). */
int dp_tfrecord_writer_close(dp_tfrecord_writer *w, dp_err *err);

/* Drops everything written; path is untouched.  NULL is a no-op. */
void dp_tfrecord_writer_abort(dp_tfrecord_writer *w);

#endif
