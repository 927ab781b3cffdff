/* Gradient clipping by the global norm (include/downpour/clip.h,
 * docs/training.md, "Gradient clipping"). */
#include "downpour/clip.h"

#include <math.h>

/* Eight lanes of double in a fixed order: the lanes are independent, so gcc
 * vectorises them without reassociating, and every run adds the same
 * numbers in the same order. */
double dp_grad_sumsq(const float *g, size_t n)
{
    double lane[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            lane[j] += (double)g[i + j] * (double)g[i + j];
    for (int j = 0; i < n; i++, j++)
        lane[j] += (double)g[i] * (double)g[i];
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

float dp_clip_coef(double sumsq, float max_norm)
{
    double c = (double)max_norm / (sqrt(sumsq) + 1e-6); /* torch's 1e-6 */
    return c < 1.0 ? (float)c : 1.0f;
}

void dp_grad_scale(float *g, size_t n, float c)
{
    if (c == 1.0f)
        return;
    for (size_t i = 0; i < n; i++)
        g[i] *= c;
}

double dp_grad_clip(float *g, size_t n, float max_norm)
{
    double sumsq = dp_grad_sumsq(g, n);
    dp_grad_scale(g, n, dp_clip_coef(sumsq, max_norm));
    return sqrt(sumsq);
}
