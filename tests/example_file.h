/* Tests that write TFRecord files of tf.train.Examples: one record at a time. */
#ifndef DOWNPOUR_TEST_EXAMPLE_FILE_H
#define DOWNPOUR_TEST_EXAMPLE_FILE_H

#include <stdlib.h>

#include "check.h"
#include "downpour/example.h"
#include "downpour/tfrecord.h"

/* Appends the Example of features fs[0..n) to w. */
static inline void write_example(dp_tfrecord_writer *w, const dp_feature *fs, size_t n)
{
    size_t len = dp_example_encoded_size(fs, n);
    uint8_t *enc = malloc(len + 1);
    REQUIRE(enc);
    dp_example_encode(enc, fs, n);
    dp_err err;
    REQUIRE(dp_tfrecord_write(w, enc, len, &err) == 0);
    free(enc);
}

#endif
