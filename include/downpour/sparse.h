/* A model's sparse tables (docs/architecture.md, "Sparse tables"): the
 * parameters a batch reads only at the rows its ids name (an embedding's
 * table), as the layer table states them (layer_kind.h, sparse and
 * sparse_ids), and the rows a batch touches, found from the model's input
 * alone before the forward.  A parameter server moves only those rows
 * (docs/strategies.md, "Sparse rows"). */
#ifndef DOWNPOUR_SPARSE_H
#define DOWNPOUR_SPARSE_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/model.h"

#define DP_SPARSE_MAX 64 /* tables in one model: one a layer of DP_MAX_LAYERS (26 features' bags fit) */

typedef struct dp_sparse_table {
    size_t off;       /* row r is params[off + r*width .. + width) of the whole model */
    long rows;
    int width;
    long per_record;  /* the most ids one record names */
    int layer, k;     /* the layer that holds it, and which of its tables */
    /* A compact table (dp_model_init_compact): this model holds `slots`
     * rows at local_off, slot i at local_off + i*width, and off is where
     * the whole model holds it.  Else slots = 0 and local_off = off. */
    size_t local_off;
    long slots;
} dp_sparse_table;

/* The model's sparse tables, in layer order (at most max): returns how many
 * (0 for a model without any, or an external one).  Of a compact model:
 * each table's place in the whole model and in this one. */
int dp_model_sparse_tables(const dp_model *m, dp_sparse_table *out, int max);
/* The parameters the whole model holds more than this one (its compact
 * tables' rows left out; 0 for a model built whole). */
size_t dp_model_sparse_cut(const dp_model *m);

/* A table's initial rows on one shard, without the table (docs/strategies.md,
 * "Tables larger than a worker"): row id of sparse table k holds the draws
 * P_k + id*width .. + width of the model's generator from `seed`, P_k the
 * draws of every layer before it, exactly as dp_model_init_params lays them
 * down; this runs the generator through the tables (dst[0..n_dst), one a
 * table in layer order) and keeps the rows id mod shards == shard, local row
 * id / shards at dst[k] + (id / shards) * width.  The model whole or compact
 * (its tables one a layer, as dp_model_init_compact lays them).  0, or -1
 * when the model has not n_dst such tables.  Implemented in model.c, beside
 * the initialiser it mirrors. */
int dp_model_init_rows(const dp_model *m, uint64_t seed, int shard, int shards,
                       float *const *dst, int n_dst);

/* Compaction: rewrites the places of table t in the batch x (records of the
 * model's input width) that name rows, each to the slot of its row among
 * rows[0..n) (unique, increasing: dp_model_sparse_rows's), in place, so the
 * compact model's forward reads in slot i what the whole model reads in
 * row rows[i]; places that name no row are left naming none.  Allocates
 * nothing. */
void dp_model_sparse_slots(const dp_model *m, const dp_sparse_table *t, float *x, int batch,
                           const uint32_t *rows, long n);

/* The unique rows of table t that a batch of `batch` records touches, from
 * the model's input x, in increasing order, into ids, which holds batch *
 * per_record ids (every id first, then sorted in place).  Returns how
 * many.  Allocates nothing. */
long dp_model_sparse_rows(const dp_model *m, const dp_sparse_table *t, const float *x, int batch,
                          uint32_t *ids);

/* Sorts n ids in place, increasing, allocating nothing (heapsort). */
void dp_sort_u32(uint32_t *a, size_t n);

#endif
