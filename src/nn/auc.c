/* The AUC by ranks (auc.h): sort by score, give each group of tied scores
 * the mean of its ranks, and U = (sum of the positives' ranks) - P(P+1)/2;
 * AUC = U / (P N). */
#include "downpour/auc.h"

#include <math.h>
#include <stdlib.h>

static int by_score(const void *a, const void *b)
{
    float x = ((const dp_auc_pair *)a)->score, y = ((const dp_auc_pair *)b)->score;
    return (x > y) - (x < y);
}

double dp_auc(dp_auc_pair *pairs, size_t n)
{
    double pos = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(pairs[i].score))
            return NAN;
        pos += pairs[i].positive != 0;
    }
    double neg = (double)n - pos;
    if (pos == 0 || neg == 0)
        return NAN;
    qsort(pairs, n, sizeof *pairs, by_score);
    double rank_sum = 0; /* the positives' ranks, 1-based, ties averaged */
    for (size_t i = 0; i < n;) {
        size_t j = i;
        double p = 0;
        while (j < n && pairs[j].score == pairs[i].score)
            p += pairs[j++].positive != 0;
        rank_sum += p * ((double)(i + 1) + (double)j) / 2.0; /* ranks i+1 .. j */
        i = j;
    }
    return (rank_sum - pos * (pos + 1) / 2.0) / (pos * neg);
}
