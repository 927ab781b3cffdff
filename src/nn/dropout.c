/* Inverted dropout without a stored mask.  Element i is kept when a 32-bit
 * draw u(seed, i) is at least rate * 2^32; the draws come two to a 64-bit
 * hash, h(seed, i/2) = mix64(mix64(seed) ^ (i/2) * golden), low half for the
 * even element, high half for the odd one.  The mask is thus a pure function
 * of (seed, index): the backward draws it again, and any split of the
 * elements over threads gives the same numbers.  The backward is the forward
 * applied to dout. */
#include "downpour/layers.h"

#include <string.h>

#include "downpour/pool.h"

/* Elements below this many stay on the calling thread. */
#define DROPOUT_MIN_SPLIT 16384
#define GOLDEN 0x9e3779b97f4a7c15ULL

/* splitmix64's finaliser: a bijection that spreads every input bit. */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* x * scale when the draw u passes, else +0.  Branch-free (a bit mask, not
 * a select on x): the mask is random, so a branch would mispredict half the
 * time at rate 0.5, and a dropped inf or NaN still gives 0. */
static inline float keep_or_zero(float x, uint32_t u, uint64_t thr, float scale)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    bits &= (uint32_t)0 - (uint32_t)(u >= thr);
    memcpy(&x, &bits, sizeof x);
    return x * scale;
}

typedef struct drop_job {
    float *out;
    const float *in;
    size_t n;
    uint64_t key, threshold; /* keep when the 32-bit draw >= threshold */
    float scale;
} drop_job;

/* Elements [lo, hi).  No restrict: out may alias in. */
static void drop_range(const drop_job *j, size_t lo, size_t hi)
{
    float *out = j->out;
    const float *in = j->in;
    const uint64_t key = j->key, thr = j->threshold;
    const float scale = j->scale;
    size_t i = lo;
    if (i < hi && (i & 1)) { /* an odd start: the high half of its pair */
        uint64_t hsh = mix64(key ^ (i >> 1) * GOLDEN);
        out[i] = keep_or_zero(in[i], (uint32_t)(hsh >> 32), thr, scale);
        i++;
    }
    for (; i + 1 < hi; i += 2) {
        uint64_t hsh = mix64(key ^ (i >> 1) * GOLDEN);
        out[i] = keep_or_zero(in[i], (uint32_t)hsh, thr, scale);
        out[i + 1] = keep_or_zero(in[i + 1], (uint32_t)(hsh >> 32), thr, scale);
    }
    if (i < hi) { /* an even end: the low half */
        uint64_t hsh = mix64(key ^ (i >> 1) * GOLDEN);
        out[i] = keep_or_zero(in[i], (uint32_t)hsh, thr, scale);
    }
}

static void drop_task(void *ctx, int i, int n)
{
    const drop_job *j = ctx;
    size_t lo, hi;
    dp_pool_range(j->n, 16, i, n, &lo, &hi);
    drop_range(j, lo, hi);
}

static void dropout(float *out, const float *in, size_t n, float rate, uint64_t seed)
{
    /* rate in [0, 1): the threshold is below 2^32, so some draw always passes */
    drop_job j = {out, in, n, mix64(seed), (uint64_t)((double)rate * 4294967296.0),
                  1.0f / (1.0f - rate)};
    if (n < DROPOUT_MIN_SPLIT)
        drop_range(&j, 0, n);
    else
        dp_pool_run(drop_task, &j);
}

void dp_dropout_forward(float *out, const float *in, size_t n, float rate, uint64_t seed)
{
    dropout(out, in, n, rate, seed);
}

void dp_dropout_backward(float *din, const float *dout, size_t n, float rate, uint64_t seed)
{
    dropout(din, dout, n, rate, seed);
}
