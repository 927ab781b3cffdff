/* The learning-rate schedule (dp_lr_scale; docs/training.md,
 * "Learning-rate schedule"): its factor at given steps for constant,
 * cosine and step, with and without the linear warm-up, worked out by
 * hand; and the schedule's names. */
#include <math.h>
#include <string.h>

#include "check.h"
#include "downpour/train.h"

static float at(dp_lr_schedule s, long warmup, long every, float gamma, long done, long total)
{
    dp_lr_plan p = {s, warmup, every, gamma};
    return dp_lr_scale(&p, done, total);
}

static void test_constant_and_cosine(void)
{
    for (long k = 0; k < 1000; k += 37)
        CHECK(at(DP_LR_CONSTANT, 0, 0, 0, k, 1000) == 1.0f);
    /* cosine without warm-up: 0.5 (1 + cos(pi k / total)) */
    CHECK(at(DP_LR_COSINE, 0, 0, 0, 0, 1000) == 1.0f);
    CHECK_NEAR(at(DP_LR_COSINE, 0, 0, 0, 500, 1000), 0.5, 1e-7);
    CHECK_NEAR(at(DP_LR_COSINE, 0, 0, 0, 250, 1000), 0.5 * (1 + cos(M_PI / 4)), 1e-7);
    CHECK(at(DP_LR_COSINE, 0, 0, 0, 1000, 1000) == 0.0f);
    CHECK(at(DP_LR_COSINE, 0, 0, 0, 2000, 1000) == 0.0f); /* clamped past the end */
}

static void test_warmup(void)
{
    /* step k < 10 runs at (k+1)/10: the first step moves already */
    CHECK_NEAR(at(DP_LR_CONSTANT, 10, 0, 0, 0, 100), 0.1, 1e-7);
    CHECK_NEAR(at(DP_LR_CONSTANT, 10, 0, 0, 4, 100), 0.5, 1e-7);
    CHECK(at(DP_LR_CONSTANT, 10, 0, 0, 9, 100) == 1.0f);
    CHECK(at(DP_LR_CONSTANT, 10, 0, 0, 10, 100) == 1.0f);
    CHECK(at(DP_LR_CONSTANT, 10, 0, 0, 99, 100) == 1.0f);
    /* cosine after the warm-up: over the remaining 90 steps */
    CHECK_NEAR(at(DP_LR_COSINE, 10, 0, 0, 4, 100), 0.5, 1e-7);
    CHECK(at(DP_LR_COSINE, 10, 0, 0, 10, 100) == 1.0f);
    CHECK_NEAR(at(DP_LR_COSINE, 10, 0, 0, 55, 100), 0.5, 1e-7);
    CHECK(at(DP_LR_COSINE, 10, 0, 0, 100, 100) == 0.0f);
    /* the rise is monotone and reaches 1 exactly at the warm-up's last step */
    float last = 0;
    for (long k = 0; k < 64; k++) {
        float f = at(DP_LR_CONSTANT, 64, 0, 0, k, 1000);
        CHECK(f > last && f <= 1.0f);
        last = f;
    }
    CHECK(last == 1.0f);
}

static void test_step(void)
{
    /* gamma^floor(k / every), every counted from the run's start (StepLR) */
    CHECK(at(DP_LR_STEP, 0, 100, 0.1f, 0, 1000) == 1.0f);
    CHECK(at(DP_LR_STEP, 0, 100, 0.1f, 99, 1000) == 1.0f);
    CHECK(at(DP_LR_STEP, 0, 100, 0.1f, 100, 1000) == (float)0.1f);
    CHECK(at(DP_LR_STEP, 0, 100, 0.1f, 199, 1000) == (float)0.1f);
    CHECK_NEAR(at(DP_LR_STEP, 0, 100, 0.1f, 250, 1000), 0.01, 1e-9);
    CHECK_NEAR(at(DP_LR_STEP, 0, 100, 0.5f, 999, 1000), 0.5 * 0.5 * 0.5 * 0.5 * 0.5 * 0.5 * 0.5 *
                                                            0.5 * 0.5, 1e-9);
    /* with a warm-up of 50 steps: the rise, then the decays at 100, 200 */
    CHECK_NEAR(at(DP_LR_STEP, 50, 100, 0.1f, 0, 1000), 0.02, 1e-8);
    CHECK(at(DP_LR_STEP, 50, 100, 0.1f, 49, 1000) == 1.0f);
    CHECK(at(DP_LR_STEP, 50, 100, 0.1f, 99, 1000) == 1.0f);
    CHECK(at(DP_LR_STEP, 50, 100, 0.1f, 100, 1000) == (float)0.1f);
}

static void test_names(void)
{
    const char *names[DP_LR_COUNT] = {"constant", "cosine", "step"};
    for (int s = 0; s < DP_LR_COUNT; s++) {
        dp_lr_schedule got = DP_LR_COUNT;
        dp_err err;
        CHECK(dp_lr_schedule_parse(names[s], &got, &err) == 0 && (int)got == s);
        CHECK(strcmp(dp_lr_schedule_name(got), names[s]) == 0);
    }
    dp_lr_schedule got = DP_LR_CONSTANT;
    dp_err err = {{0}};
    CHECK(dp_lr_schedule_parse("linear", &got, &err) == -1);
    CHECK(strstr(err.msg, "linear") && strstr(err.msg, "step") && got == DP_LR_CONSTANT);
}

int main(void)
{
    test_constant_and_cosine();
    test_warmup();
    test_step();
    test_names();
    return CHECK_DONE();
}
