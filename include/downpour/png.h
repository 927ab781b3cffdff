/* PNG images held in memory (a bytes feature of a tf.train.Example, where
 * TensorFlow Datasets stores the MNIST family's images), decoded with libpng
 * into 8-bit pixels, rows top to bottom, channels interleaved (height x
 * width x channels).  Only 8-bit PNGs without a palette are read, and no
 * conversion is made: a PNG whose size, channels or bit depth differ from
 * what the caller expects is refused naming both, never silently changed. */
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

#endif
