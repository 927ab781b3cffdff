/* allreduce's sparse tables (docs/strategies.md, "Sparse tables under
 * allreduce"): a table's gradient all-gathered as the (ids, rows) each
 * replica's batch touched, instead of all-reduced whole, when that is
 * smaller, and summed in the order the dense ring sums each element, so the
 * bits are the dense path's.  Private to src/strategy (allreduce.c, and the
 * tests that drive it). */
#ifndef DOWNPOUR_STRATEGY_ALLREDUCE_SPARSE_H
#define DOWNPOUR_STRATEGY_ALLREDUCE_SPARSE_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/model.h"
#include "downpour/reducer.h"
#include "downpour/ring.h"
#include "downpour/sparse.h"

typedef struct dp_ar_sparse dp_ar_sparse;

/* The sizes the choice rests on, per replica and step, for a ring of
 * `replicas` (at most `max_batch` records a replica a step). */
typedef struct dp_ar_sparse_plan {
    int tables;
    size_t table_floats;  /* every table's floats together */
    size_t block_bound;   /* the most bytes one replica's block can take */
    uint64_t dense_bytes; /* bytes a replica sends all-reducing the tables whole */
    uint64_t sparse_bound;/* bytes a replica sends at most all-gathering the blocks */
    int sparse;           /* sparse_bound < dense_bytes */
} dp_ar_sparse_plan;

/* The plan for model m (0 tables: nothing to choose). */
void dp_ar_sparse_plan_of(const dp_model *m, int replicas, int max_batch, dp_ar_sparse_plan *out);

/* Buffers for a ring of up to `replicas` (allocated once, here; a step
 * allocates nothing). */
int dp_ar_sparse_open(dp_ar_sparse **out, const dp_model *m, int replicas, int max_batch,
                      dp_err *err);
void dp_ar_sparse_close(dp_ar_sparse *sp); /* NULL is a no-op */

/* The tables' ranges of the flat gradient, for dp_reducer_skip: returns how many. */
int dp_ar_sparse_ranges(const dp_ar_sparse *sp, size_t *lo, size_t *hi);

/* The unique rows this replica's batch touches (x, n records), table by table. */
void dp_ar_sparse_rows(dp_ar_sparse *sp, const dp_model *m, const float *x, int n);

/* The step's exchange, after the reducer summed the rest: this replica's
 * rows of grads (times weight, as the reducer weighs a bucket) go out with
 * their ids, every replica's come back, and each table element any replica
 * touched becomes the sum in the order the dense ring would add it (reducer
 * red's buckets, ring positions from the element's chunk on); the others
 * keep this replica's zero.  Returns dp_ring_allgather's failures, or -1 for
 * a malformed block (naming its ring position's peer). */
int dp_ar_sparse_exchange(dp_ar_sparse *sp, dp_ring *ring, const dp_reducer *red, float *grads,
                          float weight, uint64_t step, dp_err *err);

/* The last exchange: bytes all the blocks took together, and this replica sent. */
void dp_ar_sparse_last(const dp_ar_sparse *sp, uint64_t *gathered, uint64_t *sent);

#endif
