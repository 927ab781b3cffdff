/* The tests' one assertion header: a failed check prints file:line and the
 * expression, and the test binary's exit status is the verdict. */
#ifndef DOWNPOUR_TEST_CHECK_H
#define DOWNPOUR_TEST_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int check_failures;

/* SANITIZED: 1 in the ASan+UBSan build, where end-to-end tests shrink their
 * runs (there they check memory, not accuracy, and run several times slower). */
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

/* LONG_CHECKS: 1 under `make test-long` (DOWNPOUR_TEST_LONG=1), where the
 * end-to-end tests that make test runs on a slice of the data train on all
 * of it to the accuracies their issues set (README, "Set up"). */
#define LONG_CHECKS (getenv("DOWNPOUR_TEST_LONG") && getenv("DOWNPOUR_TEST_LONG")[0] == '1')

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);  \
            check_failures++;                                                         \
        }                                                                             \
    } while (0)

/* Like CHECK, with a printf-style explanation. */
#define CHECKF(cond, ...)                                                             \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);  \
            fprintf(stderr, __VA_ARGS__);                                             \
            fputc('\n', stderr);                                                      \
            check_failures++;                                                         \
        }                                                                             \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                         \
    do {                                                                              \
        double check_a_ = (a), check_b_ = (b);                                        \
        if (!(fabs(check_a_ - check_b_) <= (tol))) {                                  \
            fprintf(stderr, "%s:%d: CHECK_NEAR failed: %s = %.9g, %s = %.9g, tol %g\n", \
                    __FILE__, __LINE__, #a, check_a_, #b, check_b_, (double)(tol));   \
            check_failures++;                                                         \
        }                                                                             \
    } while (0)

/* A check that must hold for the test to go on (e.g. a setup call). */
#define REQUIRE(cond)                                                                 \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond); \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

/* Ends main: prints a verdict and returns the exit status. */
#define CHECK_DONE()                                                                  \
    (check_failures ? (fprintf(stderr, "%d check(s) failed\n", check_failures), 1)    \
                    : (fprintf(stderr, "all checks passed\n"), 0))

#endif
