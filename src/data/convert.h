/* What the batcher (batch.c) and a stream (stream.c) share, so a record
 * streamed from its file becomes the same floats as one gathered from
 * memory, and an epoch's order comes from the same seed. */
#ifndef DOWNPOUR_DATA_CONVERT_H
#define DOWNPOUR_DATA_CONVERT_H

#include <stdint.h>

/* dst[j] = src[j] / 255, correctly rounded, j < n. */
void dp_bytes_to_unit(float *restrict dst, const uint8_t *restrict src, uint32_t n);

/* The generator seed of an epoch's order, from (seed, epoch) alone: the
 * batcher's shuffle and a stream's file order and window draws. */
uint64_t dp_data_epoch_seed(uint64_t seed, long epoch);

#endif
