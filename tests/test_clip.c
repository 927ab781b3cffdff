/* Gradient clipping by the global norm (downpour/clip.h) against
 * torch.nn.utils.clip_grad_norm_'s formula, worked out in double:
 * g * min(1, C / (||g|| + 1e-6)). */
#include <math.h>
#include <string.h>

#include "check.h"
#include "downpour/clip.h"
#include "downpour/rng.h"

enum { N = 1003 };

static void fill(float *g, uint64_t seed, float scale)
{
    dp_rng r;
    dp_rng_seed(&r, seed);
    for (int i = 0; i < N; i++)
        g[i] = (dp_rng_uniform(&r) - 0.5f) * scale;
}

static double naive_sumsq(const float *g, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)g[i] * g[i];
    return s;
}

/* A norm above C: every element is scaled by torch's coefficient, and the
 * clipped gradient's norm is C (less torch's 1e-6). */
static void test_clips(void)
{
    static float g[N], orig[N];
    fill(orig, 3, 2.0f);
    memcpy(g, orig, sizeof g);
    double norm = sqrt(naive_sumsq(orig, N));
    const float C = 0.25f;
    REQUIRE(norm > 10 * C);
    double got = dp_grad_clip(g, N, C);
    CHECK_NEAR(got, norm, 1e-9 * norm);
    double coef = C / (norm + 1e-6), worst = 0;
    for (int i = 0; i < N; i++) {
        double want = orig[i] * coef, d = fabs(g[i] - want) / (fabs(want) + 1e-30);
        worst = d > worst ? d : worst;
    }
    CHECKF(worst <= 2.5e-7, "clipped elements are %g (relative) from g * C / (norm + 1e-6)",
           worst);
    CHECK_NEAR(sqrt(naive_sumsq(g, N)), C, 1e-6);
}

/* A norm at or below C leaves the gradient untouched, bit for bit; so does
 * a zero gradient. */
static void test_leaves(void)
{
    static float g[N], orig[N];
    fill(orig, 5, 0.01f);
    memcpy(g, orig, sizeof g);
    double norm = sqrt(naive_sumsq(orig, N));
    dp_grad_clip(g, N, (float)norm * 2);
    CHECK(memcmp(g, orig, sizeof g) == 0);
    memset(g, 0, sizeof g);
    CHECK(dp_grad_clip(g, N, 1.0f) == 0.0);
    for (int i = 0; i < N; i++)
        CHECK(g[i] == 0.0f);
    CHECK(dp_clip_coef(4.0, 1.0f) == (float)(1.0 / (2.0 + 1e-6)));
    CHECK(dp_clip_coef(0.25, 1.0f) == 1.0f);
}

/* The sum of squares: the naive double sum within rounding; the same bits
 * on every call; parts of a split gradient add up to the whole (what a
 * strategy whose gradient is split sums). */
static void test_sumsq(void)
{
    static float g[N];
    fill(g, 7, 1.0f);
    double a = dp_grad_sumsq(g, N), b = naive_sumsq(g, N);
    CHECK_NEAR(a, b, 1e-12 * b);
    CHECK(dp_grad_sumsq(g, N) == a);
    for (size_t cut = 1; cut < N; cut += 97) {
        double parts = dp_grad_sumsq(g, cut) + dp_grad_sumsq(g + cut, N - cut);
        CHECK_NEAR(parts, a, 1e-12 * a);
    }
    CHECK(dp_grad_sumsq(g, 0) == 0.0);
    CHECK(dp_grad_sumsq(g, 5) == naive_sumsq(g, 5) || fabs(dp_grad_sumsq(g, 5) - naive_sumsq(g, 5)) < 1e-15);
}

int main(void)
{
    test_clips();
    test_leaves();
    test_sumsq();
    return CHECK_DONE();
}
