/* Bucketed, overlapped gradient reduction: see include/downpour/reducer.h. */
#include "downpour/reducer.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct dp_reducer {
    dp_ring *ring;
    float *grads;
    size_t n, bucket;   /* floats; bucket b is [lo(b), hi(b)) counted from the end */
    int n_buckets;
    int overlap;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t step;
    float weight;
    int ready;          /* buckets whose gradients are final */
    int done;           /* buckets reduced */
    int failed, stop;   /* failed: the ring's return (-1, DP_RING_BROKEN) */
    int finishing;      /* dp_reducer_finish has been called this step */
    long early, total;  /* buckets reduced that started before finish, and all */
    dp_err err;
};

static size_t bucket_hi(const dp_reducer *r, int b) { return r->n - (size_t)b * r->bucket; }
static size_t bucket_lo(const dp_reducer *r, int b)
{
    size_t hi = bucket_hi(r, b);
    return hi > r->bucket ? hi - r->bucket : 0;
}

static int reduce_bucket(dp_reducer *r, int b, uint64_t step, float weight, dp_err *err)
{
    size_t lo = bucket_lo(r, b), hi = bucket_hi(r, b);
    float *restrict g = r->grads + lo;
    if (weight != 1.0f)
        for (size_t i = 0; i < hi - lo; i++)
            g[i] *= weight;
    return dp_ring_allreduce(r->ring, g, hi - lo, step, b, err);
}

/* The communication thread: reduces buckets in order as they become ready. */
static void *comm_main(void *arg)
{
    dp_reducer *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->stop && (r->done >= r->ready || r->failed))
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->stop)
            break;
        int b = r->done;
        uint64_t step = r->step;
        float weight = r->weight;
        r->early += !r->finishing;
        pthread_mutex_unlock(&r->mu);
        dp_err err;
        int rc = reduce_bucket(r, b, step, weight, &err);
        pthread_mutex_lock(&r->mu);
        if (rc < 0) {
            r->failed = rc;
            r->err = err;
        } else {
            r->done++;
        }
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

int dp_reducer_open(dp_reducer **out, dp_ring *ring, float *grads, size_t n, size_t bucket_bytes,
                    int overlap, dp_err *err)
{
    dp_reducer *r = calloc(1, sizeof *r);
    if (!r)
        return dp_errf(err, "out of memory");
    r->ring = ring;
    r->grads = grads;
    r->n = n;
    r->bucket = bucket_bytes / sizeof(float);
    if (r->bucket < 1)
        r->bucket = 1;
    r->n_buckets = (int)((n + r->bucket - 1) / r->bucket);
    r->overlap = overlap && ring->n > 1;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    if (r->overlap) {
        int e = pthread_create(&r->thread, NULL, comm_main, r);
        if (e != 0) {
            pthread_mutex_destroy(&r->mu);
            pthread_cond_destroy(&r->cv);
            free(r);
            return dp_errf(err, "cannot start the all-reduce thread: %s", strerror(e));
        }
    }
    *out = r;
    return 0;
}

void dp_reducer_close(dp_reducer *r)
{
    if (!r)
        return;
    if (r->overlap) {
        pthread_mutex_lock(&r->mu);
        r->stop = 1;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->thread, NULL);
    }
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

int dp_reducer_buckets(const dp_reducer *r) { return r->n_buckets; }

void dp_reducer_counts(dp_reducer *r, long *overlapped, long *total)
{
    pthread_mutex_lock(&r->mu);
    *overlapped = r->early;
    *total = r->total;
    pthread_mutex_unlock(&r->mu);
}

void dp_reducer_begin(dp_reducer *r, uint64_t step, float weight)
{
    pthread_mutex_lock(&r->mu);
    r->step = step;
    r->weight = weight;
    r->ready = r->done = 0;
    r->finishing = 0;
    r->failed = 0; /* a broken ring was re-formed before this step */
    r->total += r->n_buckets;
    pthread_mutex_unlock(&r->mu);
}

void dp_reducer_ready(dp_reducer *r, size_t lo)
{
    if (!r->overlap)
        return;
    int ready = 0;
    while (ready < r->n_buckets && bucket_lo(r, ready) >= lo)
        ready++;
    pthread_mutex_lock(&r->mu);
    if (ready > r->ready) {
        r->ready = ready;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
}

int dp_reducer_finish(dp_reducer *r, dp_err *err)
{
    if (!r->overlap) {
        for (int b = 0; b < r->n_buckets; b++) {
            int rc = reduce_bucket(r, b, r->step, r->weight, err);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    pthread_mutex_lock(&r->mu);
    r->ready = r->n_buckets;
    r->finishing = 1;
    pthread_cond_broadcast(&r->cv);
    while (r->done < r->n_buckets && !r->failed)
        pthread_cond_wait(&r->cv, &r->mu);
    int failed = r->failed;
    if (failed && err)
        *err = r->err;
    pthread_mutex_unlock(&r->mu);
    return failed;
}
