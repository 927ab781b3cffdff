/* Adam's fast arithmetic for one element (docs/architecture.md, "Fast
 * paths"): 1/sqrt(v) and 1/(sqrt(v) + eps) from integer-bit estimates and
 * three Newton steps each, every float operation correctly rounded (mul,
 * add, fmaf, max), so it gives the same bits wherever it runs.  optim.c's
 * portable body and the device kernel (src/device/kernels.h) both call it;
 * optim.c's AVX2 and AVX-512 bodies repeat it operation for operation
 * (tests/test_optim.c and tests/test_device_kernels.c compare the bits).
 * A includer may define DP_ADAM_FN (the device kernels make it __device__). */
#ifndef DOWNPOUR_ADAM_FAST_H
#define DOWNPOUR_ADAM_FAST_H

#include <math.h>
#include <stdint.h>

#ifndef DP_ADAM_FN /* always inline: into sim.c's FMA loop even at -O1 (the ASan build) */
#define DP_ADAM_FN static inline __attribute__((always_inline))
#endif

#define DP_ADAM_RSQRT_MAGIC 0x5f375a86u /* 1/sqrt(x) ~ bits(MAGIC - bits(x)/2), within 3.4 % */
#define DP_ADAM_RCP_MAGIC 0x7ef311c3u   /* 1/x ~ bits(MAGIC - bits(x)), within 5 % */
#define DP_ADAM_TINY 1.17549435e-38f    /* FLT_MIN: v = 0 gives sqrt(v) = 0 */

/* Through a union, not memcpy: an instrumented build would call its memcpy
 * for every element. */
typedef union dp_adam_word {
    float f;
    uint32_t u;
} dp_adam_word;

DP_ADAM_FN uint32_t dp_adam_float_bits(float f)
{
    dp_adam_word w;
    w.f = f;
    return w.u;
}

DP_ADAM_FN float dp_adam_bits_float(uint32_t u)
{
    dp_adam_word w;
    w.u = u;
    return w.f;
}

/* One element: g += l2 p (an L2 weight decay; skipped when 0), m and v
 * move toward g (c1 = 1 - b1, c2 = 1 - b2, rounded once by the caller),
 * p *= decay (adamw's decoupled decay; skipped when 1), then
 * p -= lr_t m / (sqrt(v) + eps).  The two skips depend on the scalars only,
 * so every path takes them alike, and wd = 0 keeps the bits of Adam. */
DP_ADAM_FN void dp_adam_fast_element(float *p, float *m, float *v, float g, float lr_t, float b1,
                                     float c1, float b2, float c2, float eps, float l2,
                                     float decay)
{
    if (l2 != 0.0f)
        g = g + l2 * *p;
    float mi = fmaf(b1, *m, c1 * g);
    float vi = fmaf(b2, *v, (c2 * g) * g);
    *m = mi;
    *v = vi;
    float x = vi > DP_ADAM_TINY ? vi : DP_ADAM_TINY; /* as maxps: a NaN v gives tiny */
    float y = dp_adam_bits_float(DP_ADAM_RSQRT_MAGIC - (dp_adam_float_bits(x) >> 1));
    for (int k = 0; k < 3; k++)
        y = y * fmaf(-((0.5f * x) * y), y, 1.5f);
    float d = vi * y + eps;
    float r = dp_adam_bits_float(DP_ADAM_RCP_MAGIC - dp_adam_float_bits(d));
    for (int k = 0; k < 3; k++)
        r = r * fmaf(-d, r, 2.0f);
    float p0 = decay != 1.0f ? *p * decay : *p;
    *p = fmaf(-(lr_t * mi), r, p0);
}

#endif
