/* --compress auto's choice between PowerSGD and the per-bucket bf16/none
 * (allreduce_auto.c; docs/strategies.md, "allreduce: compression"): taken
 * once per run, at open, from the ring's measured link and a measured cost
 * of PowerSGD's products, the same on every replica.  Private to
 * src/strategy. */
#ifndef DOWNPOUR_STRATEGY_ALLREDUCE_AUTO_H
#define DOWNPOUR_STRATEGY_ALLREDUCE_AUTO_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/model.h"
#include "downpour/powersgd.h"
#include "downpour/ring.h"
#include "downpour/status.h"

/* The rank auto considers (the MNIST table's powersgd:4, docs/strategies.md). */
#define DP_AUTO_PSGD_RANK 4
#define DP_AUTO_PSGD_RANK_TEXT "4"

typedef struct dp_auto_compress {
    int psgd;      /* took powersgd:DP_AUTO_PSGD_RANK for the whole run */
    char why[240]; /* "auto: powersgd:4 (...)" or "auto: bf16 or none per bucket (...)":
                      the log's and the metrics' compress */
} dp_auto_compress;

/* The rule, from the fitted ring (dp_ring_measure): powersgd when a step's
 * two sums (first, second floats: the P's and the whole part, the Q's)
 * plus products_s of products are predicted faster than n_params floats
 * summed in buckets of bucket_bytes, each bf16 or none as the fit picks.
 * Fills a->why; returns a->psgd.  The same inputs give the same answer. */
int dp_auto_psgd_rule(dp_auto_compress *a, const dp_ring *r, size_t first, size_t second,
                      double products_s, size_t n_params, size_t bucket_bytes);

/* At open, every member of a fresh ring at once (step names the frames):
 * the ring's fit (dp_ring_measure), model m's matrices at the rank, their
 * products timed on this replica (dp_powersgd_time) and averaged over the
 * ring, then the rule.  A model with no matrix to factor takes bf16/none
 * without measuring.  Failures as dp_ring_allreduce's. */
int dp_auto_compress_decide(dp_auto_compress *a, dp_ring *r, const dp_model *m,
                            size_t bucket_bytes, uint64_t seed, uint64_t step, dp_err *err);

#endif
