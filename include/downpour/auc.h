/* The area under the ROC curve of a binary classifier's scores
 * (docs/metrics.md): the probability that a positive record scores above a
 * negative one, ties counting one half (the Mann-Whitney U statistic over
 * P positives and N negatives).  Exact: the records sorted by score,
 * O(n log n). */
#ifndef DOWNPOUR_AUC_H
#define DOWNPOUR_AUC_H

#include <stddef.h>
#include <stdint.h>

/* One record: its score and whether its label is 1. */
typedef struct dp_auc_pair {
    float score;
    uint32_t positive;
} dp_auc_pair;

/* The AUC of pairs[0..n), which it sorts in place; NAN when every label is
 * the same (P = 0 or N = 0) or a score is NaN. */
double dp_auc(dp_auc_pair *pairs, size_t n);

#endif
