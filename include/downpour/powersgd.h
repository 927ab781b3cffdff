/* PowerSGD (Vogels, Karimireddy and Jaggi 2019, "PowerSGD: Practical
 * Low-Rank Gradient Compression"): allreduce's --compress powersgd:RANK
 * (docs/strategies.md, "allreduce: compression").  Each weight matrix's
 * gradient M (rows x cols, the layer table's weight viewed as 2-D) is sent
 * as two rank-r factors instead of its rows x cols floats:
 *
 *     M += residual                  error feedback (this replica's)
 *     Q  = orthonormal columns of Q  warm start: last step's summed Q
 *     P  = M Q,        all-reduced   (rows x r)
 *     P  = orthonormal columns of P  (Gram-Schmidt, twice)
 *     Q  = M^T P,      all-reduced   (cols x r)
 *     M' = P Q^T                     the same bits on every replica
 *     residual = M - P Q_own^T       Q_own: this replica's Q before the sum
 *
 * Everything else (biases, batch norm's and layer norm's parameters, and a
 * matrix that the factors would not make smaller) is summed whole, in fp32,
 * in the first all-reduce with the P's.  A step is two all-reduces of the
 * ring: sum(r (rows + cols)) + whole floats, against n_params.
 *
 * The residual is the part of this replica's M outside the summed P's
 * columns ((I - P P^T) M): the replicas' residuals and M' add up to the sum
 * of their M's, so nothing any replica computed is lost, and a replica's
 * residual carries none of the others' gradients.  It changes only when a
 * step's two sums both succeed, so a step retried after the ring broke
 * starts from the same residual. */
#ifndef DOWNPOUR_POWERSGD_H
#define DOWNPOUR_POWERSGD_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/model.h"
#include "downpour/ring.h"
#include "downpour/status.h"

/* A model's matrices: at most its layers' tensors (layer_kind.h). */
#define DP_POWERSGD_MAX_MATRICES 256

/* One weight matrix: rows x cols floats, row-major, at off in the flat
 * buffer, sent as factors of rank min(RANK, rows, cols). */
typedef struct dp_psgd_matrix {
    size_t off;
    int rows, cols, rank;
} dp_psgd_matrix;

/* What PowerSGD at a rank does with a model. */
typedef struct dp_psgd_plan {
    int matrices;       /* 2-D weights in the layer table */
    int compressed;     /* of them, sent as factors */
    size_t factor_floats; /* sum of rank (rows + cols) over the compressed: P's and Q's */
    size_t whole_floats;  /* the rest, summed whole */
    size_t n_params;
    int max_rank;       /* the largest rank that compresses some matrix (0: none can) */
} dp_psgd_plan;

/* The matrices of m that powersgd:rank sends as factors, in offset order
 * (the first cap written), and the plan; returns how many.  A tensor is a
 * matrix when it has two or more dimensions above 1 in the file's shape
 * (layer_kind.h: shapes, or tensors): its first such dimension is rows, the
 * rest together cols (PyTorch's hook's view); a conv filter is (oc, kh kw
 * c).  Its rank is min(rank, rows, cols), and it is compressed only when
 * rank (rows + cols) < rows cols: else it goes whole (exact, and fewer
 * bytes).  A sparse table (layer_kind.h) is never a matrix here. */
int dp_powersgd_matrices(const dp_model *m, int rank, dp_psgd_matrix *out, int cap,
                         dp_psgd_plan *plan);

typedef struct dp_powersgd dp_powersgd;

/* n: the flat gradient's floats; mats: k matrices inside it, in offset
 * order and disjoint; seed: the first Q's, the same on every replica.
 * Every buffer is allocated here. */
int dp_powersgd_open(dp_powersgd **out, size_t n, const dp_psgd_matrix *mats, int k,
                     uint64_t seed, dp_err *err);
void dp_powersgd_close(dp_powersgd *ps); /* NULL is a no-op */

/* One step over the ring (above): grads (n floats) times weight, plus the
 * residual, becomes the replicas' compressed sum, the same bits on every
 * member; the skipped ranges are left alone.  step names the two all-reduces (buckets 0 and 1) in messages.
 * The ring's failures as dp_ring_allreduce's: grads is then partly summed,
 * the residual unchanged, and the warm start spoilt (dp_powersgd_restart
 * before the retry).  ring NULL: the products alone, nothing summed (as one
 * member's share of a step: dp_powersgd_time). */
int dp_powersgd_reduce(dp_powersgd *ps, dp_ring *ring, float *grads, float weight, uint64_t step,
                       dp_err *err);
/* One replica, nothing to send: grads times weight plus the residual,
 * exactly, and the residual zero (the skipped ranges left alone). */
void dp_powersgd_exact(dp_powersgd *ps, float *grads, float weight);
/* Ranges [lo[j], hi[j]) of the gradient that the steps leave alone from
 * the next one (allreduce's sparse tables, all-gathered by their rows:
 * docs/strategies.md, "Sparse tables under allreduce"): not weighted, not
 * summed.  Increasing, disjoint, at most DP_POWERSGD_MAX_SKIP, and outside
 * every matrix; else -1.  Call it between steps. */
#define DP_POWERSGD_MAX_SKIP 64 /* a model's sparse tables: DP_SPARSE_MAX (sparse.h) */
int dp_powersgd_skip(dp_powersgd *ps, const size_t *lo, const size_t *hi, int n);
/* Q back to the seed's: every member of a re-formed ring does it before the
 * same step, so they warm-start alike again. */
void dp_powersgd_restart(dp_powersgd *ps);
/* The residual (n floats, zero outside the compressed matrices). */
float *dp_powersgd_residual(dp_powersgd *ps);
/* The warm start: each matrix's Q^T (rank x cols), matrix after matrix,
 * as the next step will take it (before its orthonormalisation). */
float *dp_powersgd_q(dp_powersgd *ps);
/* Floats in a step's first all-reduce (P's and the whole part) and second
 * (Q's). */
void dp_powersgd_floats(const dp_powersgd *ps, size_t *first, size_t *second);

/* The products of one step (dp_powersgd_reduce with no ring) on a model of
 * n floats with these k matrices, timed on random gradients: the best of
 * DP_POWERSGD_TIME_REPS, in seconds.  A scratch instance, allocated and
 * freed here (--compress auto measures it once, at open). */
#define DP_POWERSGD_TIME_REPS 3
int dp_powersgd_time(size_t n, const dp_psgd_matrix *mats, int k, uint64_t seed, double *seconds,
                     dp_err *err);

#endif
