/* PNG images held in memory (a bytes feature of a tf.train.Example, where
 * TensorFlow Datasets stores the MNIST family's images), decoded with libpng
 * into 8-bit pixels, rows top to bottom, channels interleaved (height x
 * width x channels).  Only 8-bit PNGs without a palette are read, and no
 * conversion is made: a PNG whose size, channels or bit depth differ from
 * what the caller expects is refused naming both, never silently changed.
 * Encoding writes the same layout as an 8-bit PNG into a buffer the caller
 * keeps from one image to the next (downpour data convert). */
#ifndef DOWNPOUR_PNG_H
#define DOWNPOUR_PNG_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/status.h"

/* The largest width or height read: far above a dataset image, small enough
 * that a damaged header does not ask for gigabytes. */
#define DP_PNG_MAX_SIDE 16384

typedef struct dp_png_info {
    uint32_t width, height;
    int channels;  /* 1 gray, 2 gray+alpha, 3 RGB, 4 RGBA (palette: 1, the index) */
    int bit_depth; /* 1, 2, 4, 8 or 16 */
    int palette;   /* 1 for a palette image (refused by dp_png_decode) */
} dp_png_info;

/* Reads the header (the signature and IHDR) of png, len bytes. */
int dp_png_info_read(dp_png_info *info, const uint8_t *png, size_t len, dp_err *err);

/* Decodes png into pixels (height * width * channels bytes).  Refuses a
 * palette image, a bit depth other than 8, another size or channel count,
 * and damaged or truncated data. */
int dp_png_decode(uint8_t *pixels, const uint8_t *png, size_t len, uint32_t height,
                  uint32_t width, int channels, dp_err *err);

/* A PNG being written: data holds len bytes of cap allocated.  Start it
 * zeroed; each dp_png_encode overwrites it (len from 0), growing data only
 * when an image needs more than it held, so a run of same-sized images
 * stops reallocating after the first.  Free with dp_png_buf_free. */
typedef struct dp_png_buf {
    uint8_t *data;
    size_t len, cap;
} dp_png_buf;

/* Encodes pixels (height * width * channels bytes, 8-bit, channels 1 gray,
 * 2 gray+alpha, 3 RGB, 4 RGBA) as a non-interlaced 8-bit PNG with zlib's
 * default compression, as TensorFlow's encode_png writes the MNIST family.
 * Sides must be 1..DP_PNG_MAX_SIDE.  On -1 out->len is 0 and out keeps
 * whatever it had allocated (still freed by dp_png_buf_free). */
int dp_png_encode(dp_png_buf *out, const uint8_t *pixels, uint32_t height, uint32_t width,
                  int channels, dp_err *err);

void dp_png_buf_free(dp_png_buf *b); /* frees data, zeroes b; NULL is a no-op */

#endif
