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

/* The ranks auto considers, lowest first (the rule: allreduce_auto.c), and
 * the speed-up over bf16/none it keeps when it takes a higher one. */
#define DP_AUTO_PSGD_RANKS {4, 8, 16}
#define DP_AUTO_PSGD_N_RANKS 3
#define DP_AUTO_PSGD_MARGIN 3.0

/* One rank's step: its two sums' floats (the P's with the whole part, the
 * Q's) and its products' time. */
typedef struct dp_auto_cand {
    int rank;
    size_t first, second;
    double products_s;
} dp_auto_cand;

typedef struct dp_auto_compress {
    int rank;      /* took powersgd:rank for the whole run; 0: bf16 or none per bucket */
    char why[400]; /* "auto: powersgd:16 (...)" or "auto: bf16 or none per bucket (...)":
                      the log's and the metrics' compress */
} dp_auto_compress;

/* The ranks of DP_AUTO_PSGD_RANKS that factor some matrix of m, but for
 * one that sends what the one before does (every matrix clamped), and
 * whose Q's leave a float of the parameters over (the checkpoint keeps the
 * rank there): at most DP_AUTO_PSGD_N_RANKS into out, products 0; returns
 * how many. */
int dp_auto_candidates(const dp_model *m, dp_auto_cand *out);

/* The rule, from the fitted ring (dp_ring_measure): with base the
 * parameters' sum in bucket_bytes buckets, each bf16 or none as the fit
 * picks, and each candidate's prediction its two sums plus its products,
 * the highest rank predicted at most base / DP_AUTO_PSGD_MARGIN, else the
 * lowest when it is below base, else none.  Fills a->why; returns a->rank.
 * The same inputs give the same answer. */
int dp_auto_psgd_rule(dp_auto_compress *a, const dp_ring *r, const dp_auto_cand *c, int n,
                      size_t n_params, size_t bucket_bytes);

/* At open, every member of a fresh ring at once (step names the frames):
 * the ring's fit (dp_ring_measure), model m's candidates, their products
 * timed on this replica (dp_powersgd_time) and averaged over the ring,
 * then the rule.  A model with nothing to factor takes bf16/none without
 * measuring.  Failures as dp_ring_allreduce's. */
int dp_auto_compress_decide(dp_auto_compress *a, dp_ring *r, const dp_model *m,
                            size_t bucket_bytes, uint64_t seed, uint64_t step, dp_err *err);

#endif
