/* A split of n random byte records of dim pixels and labels 0..9, drawn
 * from rng, in the caller's arrays (n*dim and n bytes): what the device
 * tests train on when the real data does not matter. */
#ifndef DOWNPOUR_TESTS_RANDOM_SPLIT_H
#define DOWNPOUR_TESTS_RANDOM_SPLIT_H

#include <stdint.h>

#include "downpour/dataset.h"
#include "downpour/rng.h"

static inline dp_split random_split(uint8_t *images, uint8_t *labels, uint32_t n, uint32_t dim,
                                    dp_rng *rng)
{
    for (size_t i = 0; i < (size_t)n * dim; i++)
        images[i] = (uint8_t)dp_rng_below(rng, 256);
    for (uint32_t i = 0; i < n; i++)
        labels[i] = (uint8_t)dp_rng_below(rng, 10);
    return (dp_split){.images = images, .labels = labels, .n = n, .dim = dim};
}

#endif
