/* The dense ps tests' problem (test_ps_compress, test_ps_reply): NP
 * parameters (the includer defines NP) from start_params(), pulled towards
 * target(i) by a quadratic's gradient scaled per element, with a wobble of
 * the step so that error-feedback residuals move; flat = 1 makes every
 * element's curvature 1 (the convergence checks). */
#ifndef DP_TEST_PS_QUADRATIC_H
#define DP_TEST_PS_QUADRATIC_H

#include <math.h>

static float target(int i) { return 0.5f * sinf(0.37f * (float)i); }
static float init_of(int i) { return 0.3f * cosf(0.11f * (float)i); }

static const float *start_params(void)
{
    static float p[NP];
    for (int i = 0; i < NP; i++)
        p[i] = init_of(i);
    return p;
}

static int flat;

static void grad_at(const float *p, int step, float *g)
{
    for (int i = 0; i < NP; i++)
        g[i] = (flat ? 1.0f : 1.0f + (float)(i % 7)) * (p[i] - target(i)) +
               1e-3f * sinf(0.5f * (float)i + (float)step);
}

#endif
