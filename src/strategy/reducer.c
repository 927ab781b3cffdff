/* Bucketed gradient reduction, overlapped or inline: see
 * include/downpour/reducer.h. */
#include "downpour/reducer.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/clock.h"
#include "downpour/trace.h"

/* The timings bucket.  Each replica adds its veto, whether backprop left it
 * nothing to overlap, its median ratio of an
 * overlapped step to the inline step after it (in 1/10000), and its two
 * median steps (in microseconds), each whole number cut into base-2048
 * digits: every partial sum is an integer below 2^24, exact in a float in
 * any order, so the ring (or MPI, whatever its order) hands every replica
 * the same sums. */
enum { V_VETO, V_NOTHING, V_RATIO_HI, V_RATIO_LO, V_ON_HI, V_ON_LO, V_OFF_HI, V_OFF_LO, V_COUNT };
#define DIGIT 2048.0
#define WHOLE_MAX 8388607.0 /* 2^23 - 1 (8.4 s a step); below 2^24 summed over 2^11 replicas */
#define CALIB_END (DP_REDUCER_WARMUP + 2 * DP_REDUCER_SAMPLES)

struct dp_reducer {
    dp_ring *ring;
    float *grads;
    size_t n, bucket;   /* floats; bucket b is [lo(b), hi(b)) counted from the end */
    size_t skip_lo[DP_REDUCER_MAX_SKIP], skip_hi[DP_REDUCER_MAX_SKIP]; /* left alone */
    int n_skip;
    int n_buckets;
    dp_overlap mode;
    int spare;          /* spare cores, as given */
    int threaded;       /* the communication thread runs */
    int overlap;        /* this step: buckets go to the thread as they become final */
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
    /* AUTO's calibration; the main thread's alone. */
    long calib;         /* steps begun since it (re)started; CALIB_END + 1: over */
    int exchange;       /* this step carries the timings bucket */
    double last_begin;  /* when the previous step began */
    int last_overlap;   /* how the previous step ran */
    double samples[2][DP_REDUCER_SAMPLES]; /* [overlapped] seconds from begin to begin */
    int n_samples[2];
    float votes[V_COUNT];
    int decided, chosen, fresh, vetoed;
    int seen, seen_before;  /* buckets final after backprop's latest report, and before it */
    int hideable;       /* the most buckets final before backprop's last report (warm-up) */
    int nothing;        /* none: the thread could only start when backprop is over */
    double on_ms, off_ms, ratio;
};

static size_t bucket_hi(const dp_reducer *r, int b) { return r->n - (size_t)b * r->bucket; }
static size_t bucket_lo(const dp_reducer *r, int b)
{
    size_t hi = bucket_hi(r, b);
    return hi > r->bucket ? hi - r->bucket : 0;
}

/* Bucket b less the skipped ranges, piece by piece, each summed with the
 * chunks of the whole bucket (dp_ring_allreduce_part): the same bits as the
 * whole bucket's sum. */
static int reduce_bucket(dp_reducer *r, int b, uint64_t step, float weight, dp_err *err)
{
    double t0 = dp_now();
    size_t lo = bucket_lo(r, b), hi = bucket_hi(r, b), at = lo;
    float *restrict g = r->grads + lo;
    int rc = 0;
    for (int k = 0; k <= r->n_skip && rc == 0; k++) {
        size_t end = k < r->n_skip ? r->skip_lo[k] : hi;
        end = end < at ? at : end > hi ? hi : end;
        if (end > at) {
            if (weight != 1.0f)
                for (size_t i = at - lo; i < end - lo; i++)
                    g[i] *= weight;
            rc = dp_ring_allreduce_part(r->ring, g, hi - lo, at - lo, end - lo, step, b, err);
        }
        if (k < r->n_skip && r->skip_hi[k] > at)
            at = r->skip_hi[k] < hi ? r->skip_hi[k] : hi;
    }
    dp_trace_span("all-reduce bucket", "allreduce", t0, dp_now(), b);
    return rc;
}

int dp_reducer_skip(dp_reducer *r, const size_t *lo, const size_t *hi, int n)
{
    if (n < 0 || n > DP_REDUCER_MAX_SKIP)
        return -1;
    for (int k = 0; k < n; k++)
        if (lo[k] > hi[k] || hi[k] > r->n || (k > 0 && lo[k] < hi[k - 1]))
            return -1;
    pthread_mutex_lock(&r->mu);
    memcpy(r->skip_lo, lo, (size_t)n * sizeof *lo);
    memcpy(r->skip_hi, hi, (size_t)n * sizeof *hi);
    r->n_skip = n;
    pthread_mutex_unlock(&r->mu);
    return 0;
}

void dp_reducer_bucket_of(const dp_reducer *r, size_t i, size_t *lo, size_t *hi)
{
    int b = i < r->n ? (int)((r->n - 1 - i) / r->bucket) : 0;
    *lo = bucket_lo(r, b);
    *hi = bucket_hi(r, b);
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

void dp_reducer_restart(dp_reducer *r)
{
    if (r->mode != DP_OVERLAP_AUTO)
        return;
    r->calib = 0;
    r->exchange = 0;
    r->hideable = 0;
    r->nothing = 0;
    r->n_samples[0] = r->n_samples[1] = 0;
    memset(r->votes, 0, sizeof r->votes);
    /* Without the thread this replica already knows the answer; it still
     * sends its veto with the others' timings. */
    r->decided = r->vetoed;
    r->chosen = 0;
    r->on_ms = r->off_ms = r->ratio = 0;
}

int dp_reducer_open(dp_reducer **out, dp_ring *ring, float *grads, size_t n, size_t bucket_bytes,
                    dp_overlap mode, int spare_cores, dp_err *err)
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
    r->mode = mode;
    r->spare = spare_cores;
    /* A thread with no core of its own only takes turns with backprop.  AUTO
     * starts it even for a ring of one, which a replica may rejoin. */
    r->threaded = mode == DP_OVERLAP_ON ? ring->n > 1 : mode == DP_OVERLAP_AUTO && spare_cores > 0;
    r->vetoed = mode == DP_OVERLAP_AUTO && !r->threaded;
    r->overlap = mode == DP_OVERLAP_ON && r->threaded;
    r->decided = mode != DP_OVERLAP_AUTO;
    r->chosen = r->overlap;
    dp_reducer_restart(r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    if (r->threaded) {
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
    if (r->threaded) {
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

/* AUTO, at each step's start until the timings went out: times the step
 * before (begin to begin, so all a step costs counts, the optimiser and the
 * next batch included), and says how this one runs.  Warm-up steps run
 * inline; the samples alternate, overlapped first, so drift on a busy
 * machine falls on both ways alike. */
static void calibrate(dp_reducer *r)
{
    double now = dp_now();
    long c = r->calib++;
    if (c > DP_REDUCER_WARMUP && c <= CALIB_END) {
        int k = r->last_overlap;
        if (r->n_samples[k] < DP_REDUCER_SAMPLES)
            r->samples[k][r->n_samples[k]++] = now - r->last_begin;
    }
    r->last_begin = now;
    /* A model whose backprop finishes no bucket before its very end (one
     * big first layer: mlp-300-100 in 512 KiB buckets) has nothing to hide
     * the communication behind: no overlapped step is run. */
    if (c == DP_REDUCER_WARMUP)
        r->nothing = r->hideable == 0;
    r->overlap = r->threaded && !r->nothing && c >= DP_REDUCER_WARMUP && c < CALIB_END &&
                 (c - DP_REDUCER_WARMUP) % 2 == 0;
    r->last_overlap = r->overlap;
    r->exchange = c == CALIB_END;
}

static double median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n ? (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2])) : 0;
}

static void put_whole(float *hi_lo, double x)
{
    double w = floor(x + 0.5);
    w = w < 0 ? 0 : w > WHOLE_MAX ? WHOLE_MAX : w;
    hi_lo[0] = (float)floor(w / DIGIT);
    hi_lo[1] = (float)(w - floor(w / DIGIT) * DIGIT);
}

static double get_whole(const float *hi_lo) { return (double)hi_lo[0] * DIGIT + hi_lo[1]; }

/* The timings bucket, after the step's gradient buckets on the same ring:
 * every replica gets the same sums, so every replica chooses alike.  The
 * choice rests on the ratios of neighbouring steps, so a load that comes
 * and goes over the measuring falls on both ways alike. */
static int exchange(dp_reducer *r, dp_err *err)
{
    double ratio[DP_REDUCER_SAMPLES];
    int pairs = r->n_samples[0] < r->n_samples[1] ? r->n_samples[0] : r->n_samples[1];
    for (int k = 0; k < pairs; k++)
        ratio[k] = r->samples[0][k] > 0 ? r->samples[1][k] / r->samples[0][k] : 1;
    memset(r->votes, 0, sizeof r->votes);
    r->votes[V_VETO] = (float)r->vetoed;
    r->votes[V_NOTHING] = (float)(r->nothing && !r->vetoed);
    put_whole(r->votes + V_RATIO_HI, 1e4 * (pairs ? median(ratio, pairs) : 1));
    put_whole(r->votes + V_ON_HI, 1e6 * median(r->samples[1], r->n_samples[1]));
    put_whole(r->votes + V_OFF_HI, 1e6 * median(r->samples[0], r->n_samples[0]));
    int rc = dp_ring_allreduce(r->ring, r->votes, V_COUNT, r->step, r->n_buckets, err);
    if (rc < 0)
        return rc;
    r->exchange = 0;
    int n = r->ring->n;
    r->ratio = get_whole(r->votes + V_RATIO_HI) / 1e4 / n;
    r->on_ms = get_whole(r->votes + V_ON_HI) / 1e3 / n;
    r->off_ms = get_whole(r->votes + V_OFF_HI) / 1e3 / n;
    int measured = r->votes[V_VETO] == 0 && r->votes[V_NOTHING] == 0;
    r->chosen = measured && n > 1 && r->on_ms > 0 && r->ratio < 1 - DP_REDUCER_MARGIN;
    r->fresh = 1;
    r->decided = 1;
    if (!measured)
        r->on_ms = r->off_ms = r->ratio = 0; /* not a measurement of both ways */
    return 0;
}

void dp_reducer_begin(dp_reducer *r, uint64_t step, float weight)
{
    if (r->calib <= CALIB_END && r->mode == DP_OVERLAP_AUTO)
        calibrate(r);
    else if (r->mode == DP_OVERLAP_AUTO)
        r->overlap = r->chosen && r->threaded;
    r->seen = r->seen_before = 0;
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
    int ready = 0;
    while (ready < r->n_buckets && bucket_lo(r, ready) >= lo)
        ready++;
    if (ready > r->seen) {
        r->seen_before = r->seen;
        r->seen = ready;
    }
    if (!r->overlap)
        return;
    pthread_mutex_lock(&r->mu);
    if (ready > r->ready) {
        r->ready = ready;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
}

int dp_reducer_finish(dp_reducer *r, dp_err *err)
{
    if (r->calib <= DP_REDUCER_WARMUP && r->seen_before > r->hideable)
        r->hideable = r->seen_before;
    if (!r->overlap) {
        for (int b = 0; b < r->n_buckets; b++) {
            int rc = reduce_bucket(r, b, r->step, r->weight, err);
            if (rc < 0)
                return rc;
        }
        return r->exchange ? exchange(r, err) : 0;
    }
    pthread_mutex_lock(&r->mu);
    r->ready = r->n_buckets;
    r->finishing = 1;
    pthread_cond_broadcast(&r->cv);
    /* backprop is over: what is left is waiting on the ring (the others) */
    double t_wait = dp_now();
    while (r->done < r->n_buckets && !r->failed)
        pthread_cond_wait(&r->cv, &r->mu);
    dp_trace_span("wait", "wait", t_wait, dp_now(), -1);
    int failed = r->failed;
    if (failed && err)
        *err = r->err;
    pthread_mutex_unlock(&r->mu);
    if (!failed && r->exchange)
        return exchange(r, err);
    return failed;
}

void dp_reducer_choice(const dp_reducer *r, dp_overlap_choice *out)
{
    memset(out, 0, sizeof *out);
    out->decided = r->decided;
    out->overlap = r->chosen;
    out->spare_cores = r->spare;
    out->overlap_ms = r->on_ms;
    out->inline_ms = r->off_ms;
    out->ratio = r->ratio;
    if (r->mode != DP_OVERLAP_AUTO)
        out->reason = "forced";
    else if (r->vetoed)
        out->reason = "no spare core";
    else if (r->ring->n < 2)
        out->reason = "one replica";
    else if (r->decided && r->votes[V_VETO] != 0)
        out->reason = "no spare core on another replica";
    else if (r->nothing || (r->decided && r->votes[V_NOTHING] != 0))
        out->reason = r->decided ? "no bucket is final before backprop ends" : "measuring";
    else
        out->reason = r->decided ? "measured" : "measuring";
}

int dp_reducer_choice_new(dp_reducer *r)
{
    int fresh = r->fresh;
    r->fresh = 0;
    return fresh;
}
