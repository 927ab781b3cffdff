/* A small seeded generator (splitmix64 seeding xoshiro256**): the same seed
 * gives the same initial weights and the same data order on every machine. */
#ifndef DOWNPOUR_RNG_H
#define DOWNPOUR_RNG_H

#include <stdint.h>

typedef struct dp_rng {
    uint64_t s[4];
} dp_rng;

void dp_rng_seed(dp_rng *r, uint64_t seed);
uint64_t dp_rng_u64(dp_rng *r);
/* Uniform in [0, 1) with 24 random bits. */
float dp_rng_uniform(dp_rng *r);
/* Uniform integer in [0, n), unbiased. */
uint32_t dp_rng_below(dp_rng *r, uint32_t n);
/* Fisher-Yates shuffle of idx[0..n). */
void dp_rng_shuffle(dp_rng *r, uint32_t *idx, uint32_t n);

#endif
