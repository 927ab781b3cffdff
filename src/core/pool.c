/* A small persistent thread pool (docs/architecture.md, "Threads").  One run is published
 * by bumping a generation counter; workers spin on it for DP_POOL_SPIN_US,
 * then sleep on a futex.  The caller works as thread 0 and then waits for a
 * pending count to reach zero the same way (spin, then futex).  Sleeping and
 * waking use the Dekker pattern on sequentially consistent atomics: the
 * sleeper announces itself, then re-checks the word inside FUTEX_WAIT; the
 * waker changes the word, then reads the announcement.  Linux only (futex). */
#include "downpour/pool.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

struct dp_pool {
    int n;
    pthread_t *threads;
    dp_pool_fn fn;
    void *ctx;
    _Atomic unsigned gen;     /* futex word: bumped once per run */
    _Atomic int pending;      /* futex word: workers still running this run */
    _Atomic int sleepers;     /* workers inside (or entering) FUTEX_WAIT on gen */
    _Atomic int caller_waits; /* the caller is inside (or entering) FUTEX_WAIT on pending */
    _Atomic int busy;         /* a run is in progress */
    _Atomic int stop;
};

struct worker_arg {
    dp_pool *p;
    int index;
};

static _Thread_local int in_task; /* this thread is running a task of some pool */

static void futex_wait(void *word, int expected)
{
    syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake_all(void *word)
{
    syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Spins until *gen differs from seen, for about DP_POOL_SPIN_US; then sleeps. */
static unsigned wait_generation(dp_pool *p, unsigned seen)
{
    unsigned g;
    uint64_t deadline = 0;
    for (unsigned spins = 0;; spins++) {
        g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen)
            return g;
        cpu_relax();
        if ((spins & 63) != 63)
            continue;
        uint64_t t = now_ns();
        if (!deadline) {
            deadline = t + DP_POOL_SPIN_US * 1000u;
        } else if (t > deadline) {
            atomic_fetch_add(&p->sleepers, 1);
            while ((g = atomic_load(&p->gen)) == seen)
                futex_wait((void *)&p->gen, (int)seen);
            atomic_fetch_sub(&p->sleepers, 1);
            return g;
        }
    }
}

static void *worker_main(void *arg)
{
    struct worker_arg wa = *(struct worker_arg *)arg;
    free(arg);
    dp_pool *p = wa.p;
    unsigned seen = 0;
    in_task = 1; /* anything a task calls runs inline */
    for (;;) {
        seen = wait_generation(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            break;
        p->fn(p->ctx, wa.index, p->n);
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->caller_waits))
            futex_wake_all((void *)&p->pending);
    }
    return NULL;
}

static void wait_done(dp_pool *p)
{
    uint64_t deadline = 0;
    for (unsigned spins = 0;; spins++) {
        if (atomic_load_explicit(&p->pending, memory_order_acquire) == 0)
            return;
        cpu_relax();
        if ((spins & 63) != 63)
            continue;
        uint64_t t = now_ns();
        if (!deadline) {
            deadline = t + DP_POOL_SPIN_US * 1000u;
        } else if (t > deadline) {
            atomic_store(&p->caller_waits, 1);
            int v;
            while ((v = atomic_load(&p->pending)) != 0)
                futex_wait((void *)&p->pending, v);
            atomic_store(&p->caller_waits, 0);
            return;
        }
    }
}

static void wake_workers(dp_pool *p)
{
    atomic_fetch_add(&p->gen, 1); /* seq_cst, and a release of fn, ctx, pending */
    if (atomic_load(&p->sleepers) > 0)
        futex_wake_all((void *)&p->gen);
}

int dp_pool_new(dp_pool **out, int n, dp_err *err)
{
    *out = NULL;
    if (n < 1 || n > DP_POOL_MAX_THREADS)
        return dp_errf(err, "thread pool: %d threads is out of range [1, %d]", n,
                       DP_POOL_MAX_THREADS);
    dp_pool *p = calloc(1, sizeof *p);
    if (!p)
        return dp_errf(err, "thread pool: out of memory");
    p->n = n;
    if (n > 1) {
        p->threads = calloc((size_t)n - 1, sizeof *p->threads);
        if (!p->threads) {
            free(p);
            return dp_errf(err, "thread pool: out of memory for %d threads", n);
        }
    }
    for (int i = 1; i < n; i++) {
        struct worker_arg *wa = malloc(sizeof *wa);
        int rc = wa ? 0 : ENOMEM;
        if (wa) {
            wa->p = p;
            wa->index = i;
            rc = pthread_create(&p->threads[i - 1], NULL, worker_main, wa);
            if (rc)
                free(wa);
        }
        if (rc) {
            p->n = i; /* the workers started so far */
            dp_pool_free(p);
            return dp_errf(err, "thread pool: cannot start thread %d of %d: %s", i, n,
                           strerror(rc));
        }
    }
    *out = p;
    return 0;
}

void dp_pool_free(dp_pool *p)
{
    if (!p)
        return;
    atomic_store(&p->stop, 1);
    wake_workers(p);
    for (int i = 1; i < p->n; i++)
        pthread_join(p->threads[i - 1], NULL);
    free(p->threads);
    free(p);
}

int dp_pool_size(const dp_pool *p) { return p ? p->n : 1; }

void dp_pool_exec(dp_pool *p, dp_pool_fn fn, void *ctx)
{
    if (!p || p->n == 1 || in_task || atomic_exchange(&p->busy, 1)) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    wake_workers(p);
    in_task = 1;
    fn(ctx, 0, p->n);
    in_task = 0;
    wait_done(p);
    atomic_store_explicit(&p->busy, 0, memory_order_release);
}

static dp_pool *global_pool;

int dp_pool_set_threads(int n, dp_err *err)
{
    if (n < 1)
        n = 1;
    if (n > DP_POOL_MAX_THREADS)
        n = DP_POOL_MAX_THREADS;
    if (dp_pool_size(global_pool) == n)
        return 0;
    dp_pool_free(global_pool);
    global_pool = NULL;
    if (n == 1)
        return 0;
    return dp_pool_new(&global_pool, n, err);
}

int dp_pool_threads(void) { return dp_pool_size(global_pool); }

void dp_pool_run(dp_pool_fn fn, void *ctx) { dp_pool_exec(global_pool, fn, ctx); }

int dp_pool_in_task(void) { return in_task; }

void dp_pool_range(size_t total, size_t align, int i, int n, size_t *lo, size_t *hi)
{
    if (n <= 1) {
        *lo = 0;
        *hi = total;
        return;
    }
    if (align < 1 || total / (size_t)n < align)
        align = 1;
    /* boundary k = k*total/n rounded to the nearest multiple of align */
    size_t b[2];
    for (int e = 0; e < 2; e++) {
        size_t k = (size_t)(i + e);
        if (k >= (size_t)n) {
            b[e] = total;
            continue;
        }
        size_t x = (size_t)((unsigned long long)total * k / (size_t)n);
        x = (x + align / 2) / align * align;
        b[e] = x > total ? total : x;
    }
    *lo = b[0];
    *hi = b[1];
}
