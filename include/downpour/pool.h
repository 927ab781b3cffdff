/* The process's one arithmetic thread pool (docs/architecture.md, "Threads").  A pool of n
 * threads runs fn(ctx, i, n) for i in [0, n): the caller is thread 0 and the
 * n-1 workers are persistent.  dp_pool_exec returns when every index is done.
 * Idle workers spin briefly (about DP_POOL_SPIN_US microseconds, with a pause
 * instruction) so back-to-back runs of one training step wake them in well
 * under a microsecond, then sleep on a futex, so an idle pool costs no CPU.
 *
 * A run never nests and never shares: a call from inside a running task, or
 * from a second thread while the pool is busy, runs fn(ctx, 0, 1) inline.
 * Task functions must therefore accept any n >= 1 and split their work by
 * (i, n) alone (dp_pool_range), which also keeps results deterministic for a
 * given thread count: fixed partitions, no atomics in reductions. */
#ifndef DOWNPOUR_POOL_H
#define DOWNPOUR_POOL_H

#include <stddef.h>

#include "downpour/status.h"

#define DP_POOL_MAX_THREADS 256
#define DP_POOL_SPIN_US 50

typedef void (*dp_pool_fn)(void *ctx, int index, int n_threads);
typedef struct dp_pool dp_pool;

/* n in [1, DP_POOL_MAX_THREADS]; n = 1 starts no thread at all. */
int dp_pool_new(dp_pool **out, int n, dp_err *err);
void dp_pool_free(dp_pool *p); /* joins the workers; NULL is a no-op */
int dp_pool_size(const dp_pool *p); /* 1 for NULL */
/* Runs fn(ctx, i, n) for every i in [0, n); a NULL pool runs fn(ctx, 0, 1). */
void dp_pool_exec(dp_pool *p, dp_pool_fn fn, void *ctx);

/* The process-wide pool, set by dp_blas_set_threads (blas.h).  Not to be
 * called while another thread may be running on the pool.  On failure to
 * start threads the pool stays at 1 thread and -1 is returned. */
int dp_pool_set_threads(int n, dp_err *err);
int dp_pool_threads(void);
void dp_pool_run(dp_pool_fn fn, void *ctx);
/* True on a thread while it runs a task of some pool. */
int dp_pool_in_task(void);

/* Thread i's share [*lo, *hi) of [0, total) split n ways: inner boundaries are
 * multiples of align where that still gives every thread work (align >= 1). */
void dp_pool_range(size_t total, size_t align, int i, int n, size_t *lo, size_t *hi);

#endif
