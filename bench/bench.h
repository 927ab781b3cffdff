/* What every benchmark program shares: medians of repeated timings, and
 * the push benchmarks' options. */
#ifndef DOWNPOUR_BENCH_H
#define DOWNPOUR_BENCH_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v[0..n) and returns its median. */
static inline double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* `--pushes N --repeats R` (defaults: what *pushes and *repeats hold);
 * returns 0, or 2 after the usage line for a nonsense value. */
static inline int bench_push_args(int argc, char **argv, const char *prog, int max_repeats,
                                  long *pushes, int *repeats)
{
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--pushes") == 0)
            *pushes = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--repeats") == 0)
            *repeats = atoi(argv[i + 1]);
    }
    if (*pushes < 1 || *repeats < 1 || *repeats > max_repeats) {
        fprintf(stderr, "usage: %s [--pushes N>=1] [--repeats 1..%d]\n", prog, max_repeats);
        return 2;
    }
    return 0;
}

#endif
