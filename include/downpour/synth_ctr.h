/* A synthetic click-through set (docs/datasets.md, "Synthetic click-through
 * data"; `downpour data synth ctr`): categorical features whose ids follow
 * a Zipf law, numeric features, optional multi-valued features, and labels
 * drawn from a known logistic model, so the best achievable log loss is
 * known.
 *
 * A record is a pure function of (config, split, row): any row of any file
 * can be made alone, in any order, on any thread.  Its features, in order:
 * each categorical feature's places (1 id, or M for a multi-valued one,
 * unused places -1), then the numeric features; the layout the bag layers
 * read (docs/models.md, "Click-through models").  The generating model:
 *
 *   z = bias + sum_f w_f(ids of f) + sum_j v_j x_j,   y ~ Bernoulli(sigmoid(z))
 *
 * w_f(id) ~ Normal(0, id_scale^2), drawn from a hash of (seed, f, id) so no
 * table is stored (a multi-valued feature gives the mean of its ids'
 * weights); v_j ~ Normal(0, num_scale^2) from (seed, j); x_j ~ Normal(0, 1)
 * a record.  An id of feature f is rank k - 1 of a Zipf law of exponent
 * zipf over [1, N_f] (rejection-inversion sampling, Hoermann and Derflinger
 * 1996: no table, any N). */
#ifndef DOWNPOUR_SYNTH_CTR_H
#define DOWNPOUR_SYNTH_CTR_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/status.h"

#define DP_CTR_MAX_FEATURES 256   /* categorical features */
#define DP_CTR_MAX_NUMERIC 1024   /* numeric features */
#define DP_CTR_MAX_PLACES 64      /* places of a multi-valued feature */
#define DP_CTR_MAX_IDS (1L << 24) /* ids of a feature: floats hold them exactly */

typedef struct dp_ctr_synth {
    int n_cat;                              /* categorical features */
    uint32_t card[DP_CTR_MAX_FEATURES];     /* ids of each, in [1, DP_CTR_MAX_IDS] */
    int places[DP_CTR_MAX_FEATURES];        /* 1: single-valued; M: up to M ids */
    int n_num;                              /* numeric features */
    double zipf;                            /* the ids' Zipf exponent, > 0 */
    double id_scale, num_scale, bias;       /* the generating model */
    uint64_t seed;
    /* derived by dp_ctr_synth_init: each feature's sampler constants */
    double hx1[DP_CTR_MAX_FEATURES], hxn[DP_CTR_MAX_FEATURES], s_[DP_CTR_MAX_FEATURES];
} dp_ctr_synth;

/* The defaults: 8 features of 1000 ids, 4 numeric, Zipf 1.1, id_scale 0.5,
 * num_scale 0.3, bias -1.1 (about one record in four a click), seed 1. */
dp_ctr_synth dp_ctr_synth_defaults(void);
/* Checks the configuration (a message naming the field) and derives the
 * samplers' constants. */
int dp_ctr_synth_init(dp_ctr_synth *s, dp_err *err);
/* Features a record: the places of every categorical feature plus the
 * numeric ones. */
int dp_ctr_synth_width(const dp_ctr_synth *s);
/* Record `row` of split `split` (0 train, 1 test): x (width floats), its
 * label, and the generating model's probability of a click. */
void dp_ctr_synth_row(const dp_ctr_synth *s, int split, uint64_t row, float *x, uint8_t *y,
                      double *p);

/* What a model trained on a split can know at best.  seen[f] is a bitmap of
 * card[f] bits, one an id of feature f: dp_ctr_synth_mark_seen sets the
 * bits of record x's ids (a training record). */
void dp_ctr_synth_mark_seen(const dp_ctr_synth *s, const float *x, uint8_t *const *seen);
/* The click probability of record x for a predictor that knows the
 * generating model exactly except the weights of the ids not marked seen,
 * which it knows only by their prior Normal(0, id_scale^2): the Bayes
 * predictive E[sigmoid(z_known + e)], e ~ Normal(0, V), V the unseen
 * weights' variance in z.  No model trained on the records that marked
 * seen can expect a lower log loss on other records, since those records
 * say nothing of the weights of ids they do not hold (docs/datasets.md,
 * "Synthetic click-through data").  With every id seen, the generating
 * model's probability, bit for bit. */
double dp_ctr_synth_seen_p(const dp_ctr_synth *s, const float *x, const uint8_t *const *seen);

/* An estimate of the best a learner can do, where the bound above is loose
 * (an id held by one training record is known exactly there).  info[f]
 * holds card[f] floats: dp_ctr_synth_add_info adds training record x's
 * Fisher information about each of its ids' weights, p (1 - p) / used^2
 * (p the generating model's probability).  dp_ctr_synth_bayes_p is then a
 * Bayes learner's probability for record `row` (x): each id's weight known
 * to its Laplace posterior, variance 1 / (1 / id_scale^2 + info), whose
 * mean misses the weight by a draw of that variance (a hash of the seed
 * and the row: the same figure every time), the other weights exact. */
void dp_ctr_synth_add_info(const dp_ctr_synth *s, const float *x, double p, float *const *info);
double dp_ctr_synth_bayes_p(const dp_ctr_synth *s, uint64_t row, const float *x,
                            const float *const *info);

#endif
