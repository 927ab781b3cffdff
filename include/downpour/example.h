/* tf.train.Example, the record TensorFlow Datasets stores in TFRecord files
 * (tfrecord.h), decoded from and encoded to the protobuf wire format:
 *
 *   message Example   { Features features = 1; }
 *   message Features  { map<string, Feature> feature = 1; }
 *                       (each entry: string key = 1; Feature value = 2;)
 *   message Feature   { oneof kind { BytesList bytes_list = 1;
 *                                    FloatList float_list = 2;
 *                                    Int64List int64_list = 3; } }
 *   message BytesList { repeated bytes value = 1; }
 *   message FloatList { repeated float value = 1 [packed = true]; }
 *   message Int64List { repeated int64 value = 1 [packed = true]; }
 *
 * The decoder reads what a protobuf parser reads: packed and unpacked
 * repeated floats and int64s, fields in any order, unknown fields skipped,
 * a message field given twice merged, a later oneof member replacing an
 * earlier one, and the last of two map entries with one key winning.  It
 * refuses, naming the field, what a protobuf parser refuses (a length past
 * the end, a varint longer than 10 bytes, a packed float list whose length
 * is not a multiple of 4, a group or an unknown wire type) and, beyond it, a
 * known field with the wrong wire type and a feature name holding a NUL.
 *
 * Nothing is copied that need not be: bytes values point into the
 * serialized buffer, which must outlive their use.  Floats and int64s are
 * decoded into the dp_example's own arrays, reused from one record to the
 * next, so a reader decoding record after record stops allocating once the
 * arrays fit the largest record. */
#ifndef DOWNPOUR_EXAMPLE_H
#define DOWNPOUR_EXAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/status.h"

/* TensorFlow Datasets' names for the MNIST family's features. */
#define DP_EXAMPLE_IMAGE "image"
#define DP_EXAMPLE_LABEL "label"

typedef enum dp_feature_kind {
    DP_FEATURE_NONE,  /* a Feature with no list set */
    DP_FEATURE_BYTES,
    DP_FEATURE_FLOAT,
    DP_FEATURE_INT64,
    DP_FEATURE_KIND_COUNT
} dp_feature_kind;

typedef struct dp_bytes {
    const uint8_t *data;
    size_t len;
} dp_bytes;

/* One feature: its name and count values of its kind (one array is set).
 * The same struct describes the features to dp_example_encode. */
typedef struct dp_feature {
    const char *name; /* NUL-terminated */
    dp_feature_kind kind;
    size_t count;
    const dp_bytes *bytes;  /* DP_FEATURE_BYTES */
    const float *floats;    /* DP_FEATURE_FLOAT */
    const int64_t *int64s;  /* DP_FEATURE_INT64 */
} dp_feature;

typedef struct dp_example dp_example;

dp_example *dp_example_new(void);
void dp_example_free(dp_example *ex); /* NULL is a no-op */

/* Decodes a serialized Example into ex, replacing what it held.  On -1 ex
 * holds no features and err names the field at fault:
 *   "Example.features.feature[\"image\"].bytes_list.value: length 900 runs
 *    past the end of the message (12 bytes left)" */
int dp_example_decode(dp_example *ex, const uint8_t *buf, size_t len, dp_err *err);

/* The features, sorted by name (protobuf maps have no order). */
size_t dp_example_count(const dp_example *ex);
const dp_feature *dp_example_feature(const dp_example *ex, size_t i);

/* The feature called name, or NULL. */
const dp_feature *dp_example_find(const dp_example *ex, const char *name);

/* Bytes ex holds: its struct and its arrays as large as they have grown. */
size_t dp_example_bytes(const dp_example *ex);

/* The kind's name in the proto ("bytes_list", ...; "none"). */
const char *dp_feature_kind_name(dp_feature_kind kind);

/* Serializes n features as an Example, in the given order, floats and
 * int64s packed as TensorFlow writes them.  dp_example_encoded_size gives
 * the exact length; dp_example_encode writes it to out (which must hold
 * that many bytes) and returns it.  A feature of a list kind with no values
 * keeps its kind (an empty list is written); DP_FEATURE_NONE writes an empty
 * Feature. */
size_t dp_example_encoded_size(const dp_feature *features, size_t n);
size_t dp_example_encode(uint8_t *out, const dp_feature *features, size_t n);

#endif
