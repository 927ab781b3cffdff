/* Sandblaster L-BFGS, private to src/strategy/lbfgs.c (the chief and the
 * workers) and lbfgs_shard.c (the ps tasks): the vector ops the chief sends
 * the shards, as they travel (DP_WIRE_LB_OP), and the shard server. */
#ifndef DOWNPOUR_STRATEGY_LBFGS_IMPL_H
#define DOWNPOUR_STRATEGY_LBFGS_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "downpour/cluster.h"
#include "downpour/lbfgs.h"
#include "downpour/status.h"
#include "downpour/train_state.h"
#include "downpour/transport.h"

/* What a shard does with its slice of the named vectors (lbfgs.h's numbers). */
typedef enum lb_op_kind {
    LB_OP_DOTS,       /* answer n partial dots a[k].b[k] (LB_DOTS) */
    LB_OP_AXPY,       /* a[0] += alpha b[0] */
    LB_OP_SCALE,      /* a[0] *= alpha */
    LB_OP_COPY,       /* a[0] = b[0] */
    LB_OP_EVAL_BEGIN, /* evaluation b[2] starts: workers pull a[0]; gradients of b[1]
                         portions over b[0] records accumulate into a[1] (zeroed) */
    LB_OP_EVAL_END,   /* answer (LB_DOTS, n 1) the portions accumulated, once all are */
    LB_OP_SEND,       /* send the slice of a[0] (LB_X) */
    LB_OP_KIND_COUNT
} lb_op_kind;

#define LB_MAX_PAIRS 4 /* = DP_LBFGS_MAX_DOTS */

/* [u32 kind][u32 n][u32 a[4]][u32 b[4]][f64 alpha]: one size for every op,
 * so a shard checks one length. */
#define LB_OP_BYTES (4 + 4 + 16 + 16 + 8)

typedef struct lb_op {
    lb_op_kind kind;
    uint32_t n;
    uint32_t a[LB_MAX_PAIRS], b[LB_MAX_PAIRS];
    double alpha;
} lb_op;

void lb_op_put(uint8_t *p, const lb_op *op);
void lb_op_get(lb_op *op, const uint8_t *p);

/* LB_RESULT's payload: f64 loss sum, u32 correct, u32 records. */
#define LB_RESULT_BYTES 16
#define LB_PORTION_BYTES 8
#define LB_GRAD_HEAD 4

/* One ps task's shard: its slice [lo, hi) of every vector. */
typedef struct lb_shard {
    dp_transport *t;
    const dp_cluster *c;
    int chief;             /* the chief's rank */
    size_t lo, hi, n;
    int vectors;
    float *mem;            /* vectors * n floats */
    float *scratch;        /* one pushed slice */
    uint32_t max_portions;
    uint8_t *have;         /* per portion of the evaluation: accumulated */
    long eval;             /* the evaluation under way (0: none yet) */
    uint32_t x_vec, g_vec, records, portions, got;
    long end_op;           /* > 0: EVAL_END number end_op waits for the last portions */
    long *pending;         /* per rank: an evaluation a worker's pull waits for (0: none) */
    long dropped;          /* pushes of a portion already accumulated, or of an old evaluation */
} lb_shard;

int lb_shard_open(lb_shard *sh, dp_transport *t, const dp_cluster *c, size_t lo, size_t hi,
                  int vectors, const float *x0, uint32_t max_portions, dp_err *err);
/* Takes up the vectors of a resumed checkpoint (lbfgs_state.c's names),
 * its slice [lo, hi) of each. */
void lb_shard_resume(lb_shard *sh, const dp_train_state *r, int m);
/* Serves the chief and the workers until the chief's SHUTDOWN. */
int lb_shard_serve(lb_shard *sh, dp_err *err);
void lb_shard_free(lb_shard *sh);

/* The chief's state at the end of an iteration, as a checkpoint holds it
 * (lbfgs_state.c; docs/checkpoints.md, "lbfgs"): the driver's scalars and
 * the coordinator's.  The vectors it needs beside x: g and the held pairs. */
typedef struct lb_saved {
    long iter;        /* iterations done: the checkpoint's step */
    long batch_index; /* the batch f and g are on (-1: none) */
    int stalled;
    long evals_run;
    int pairs, newest, started;
    long evals;
    double gamma, f, gnorm;
    double rho[DP_LBFGS_MAX_M];
} lb_saved;

/* sv as st's scalars (a malloc'd text in st->scalars), for history m. */
int lb_state_put(dp_train_state *st, const lb_saved *sv, int m, dp_err *err);
/* sv from a resumed checkpoint, checked: every value present and in range,
 * history m, the step's iteration, g and every held pair's vectors there,
 * no other vector.  Messages name the file. */
int lb_state_get(const dp_train_state *st, int m, lb_saved *sv, dp_err *err);
/* A vector's name in a checkpoint ("lbfgs.g", "lbfgs.s.3", "lbfgs.y.3"). */
int lb_state_name(char *buf, size_t cap, int v);
/* The vector a name stands for (DP_LBFGS_G, _S(i), _Y(i) with i < m); -1: none. */
int lb_state_vec(const char *name, int m);

#endif
