/* The bucketed reducer (reducer.h) over the in-process transport, three
 * ranks each on its own thread:
 * - overlapped, inline, automatic, and a mix of forced ways across the
 *   ranks all give the same bits on every rank (the ring sees the same
 *   buckets either way);
 * - with --overlap auto every rank reaches the same choice at the same step,
 *   and again after a restart (a re-formed ring);
 * - a rank with no spare core vetoes the overlap for all, and never starts
 *   its thread;
 * - a backprop that finishes no bucket before its end (one layer) leaves
 *   nothing to overlap: off, without an overlapped step;
 * - forced ways say "forced" and never measure. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "downpour/inproc.h"
#include "downpour/sparse.h"
#include "downpour/reducer.h"

#define RANKS 3
#define N 20000           /* floats: 5 buckets of 16 KiB */
#define BUCKET (16 << 10)
#define STEPS 50
#define RESTART_AFTER 25  /* every rank restarts the measuring after this step */
#define FIRST_CHOICE (DP_REDUCER_WARMUP + 2 * DP_REDUCER_SAMPLES + 1)

typedef struct job {
    dp_transport *t;
    int rank;
    dp_overlap mode;
    int spare;
    int one_layer;      /* backprop reports once, at its end */
    float params[N];
    dp_overlap_choice first, second; /* after step FIRST_CHOICE and after the last */
    int undecided_after_restart;
    long early;         /* buckets that started before dp_reducer_finish */
    int failed;
} job;

/* Rank r's gradient at step s: deterministic, not exact in sums. */
static float grad(int r, int s, size_t i)
{
    uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(r * 40503 + s * 9973);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    return (float)(h & 0xffff) / 65536.0f - 0.5f;
}

static void pause_us(long us)
{
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

static void *run_rank(void *arg)
{
    job *j = arg;
    dp_err err;
    dp_ring ring;
    dp_reducer *red = NULL;
    int ranks[RANKS] = {0, 1, 2};
    float *g = malloc(N * sizeof *g);
    if (!g || dp_ring_init(&ring, j->t, ranks, RANKS, 20, 0, &err) < 0 ||
        dp_reducer_open(&red, &ring, g, N, BUCKET, j->mode, j->spare, &err) < 0) {
        fprintf(stderr, "rank %d: %s\n", j->rank, err.msg);
        j->failed = 1;
        free(g);
        return NULL;
    }
    memset(j->params, 0, sizeof j->params);
    static const size_t layers[] = {15000, 8000, 3000, 0}; /* where each "layer" starts */
    for (int s = 1; s <= STEPS; s++) {
        dp_reducer_begin(red, (uint64_t)s, 1.0f / 3);
        for (size_t i = 0; i < N; i++)
            g[i] = grad(j->rank, s, i);
        for (int l = j->one_layer ? 3 : 0; l < 4; l++) {
            pause_us(100); /* backprop's time for the layer */
            dp_reducer_ready(red, layers[l]);
        }
        if (dp_reducer_finish(red, &err) < 0) {
            fprintf(stderr, "rank %d step %d: %s\n", j->rank, s, err.msg);
            j->failed = 1;
            break;
        }
        for (size_t i = 0; i < N; i++)
            j->params[i] += g[i];
        if (s == FIRST_CHOICE)
            dp_reducer_choice(red, &j->first);
        if (s == RESTART_AFTER) {
            dp_reducer_restart(red);
            dp_overlap_choice c;
            dp_reducer_choice(red, &c);
            j->undecided_after_restart = !c.decided;
        }
    }
    dp_reducer_choice(red, &j->second);
    long total;
    dp_reducer_counts(red, &j->early, &total);
    dp_reducer_close(red);
    dp_ring_free(&ring);
    free(g);
    return NULL;
}

/* One run of the three ranks with these ways and spare cores. */
static void run(job *jobs, const dp_overlap *mode, const int *spare, int one_layer)
{
    dp_transport *ts[RANKS];
    dp_err err;
    REQUIRE(dp_inproc_open(ts, RANKS, &err) == 0);
    pthread_t th[RANKS];
    for (int r = 0; r < RANKS; r++) {
        jobs[r].t = ts[r];
        jobs[r].rank = r;
        jobs[r].mode = mode[r];
        jobs[r].spare = spare[r];
        jobs[r].one_layer = one_layer;
        jobs[r].failed = 0;
        REQUIRE(pthread_create(&th[r], NULL, run_rank, &jobs[r]) == 0);
    }
    for (int r = 0; r < RANKS; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < RANKS; r++)
        dp_transport_close(ts[r]);
}

static int same_choice(const dp_overlap_choice *a, const dp_overlap_choice *b)
{
    return a->decided == b->decided && a->overlap == b->overlap &&
           a->overlap_ms == b->overlap_ms && a->inline_ms == b->inline_ms && a->ratio == b->ratio;
}

/* The reducer leaves every sparse table of a model to the all-gather: as
 * many ranges as a model has tables (a 26-feature wide-deep has 26), not
 * one more, and only in order. */
static void skip_ranges(void)
{
    dp_transport *t[1];
    dp_err err;
    REQUIRE(dp_inproc_open(t, 1, &err) == 0);
    int rank = 0;
    dp_ring ring;
    REQUIRE(dp_ring_init(&ring, t[0], &rank, 1, 20, 0, &err) == 0);
    static float grads[4 * (DP_SPARSE_MAX + 1)];
    dp_reducer *red;
    REQUIRE(dp_reducer_open(&red, &ring, grads, sizeof grads / sizeof *grads, 64,
                            DP_OVERLAP_OFF, 0, &err) == 0);
    size_t lo[DP_SPARSE_MAX + 1], hi[DP_SPARSE_MAX + 1];
    for (int k = 0; k <= DP_SPARSE_MAX; k++)
        lo[k] = 4 * (size_t)k, hi[k] = lo[k] + 3;
    CHECK(dp_reducer_skip(red, lo, hi, DP_SPARSE_MAX) == 0);
    CHECK(dp_reducer_skip(red, lo, hi, DP_SPARSE_MAX + 1) == -1);
    lo[1] = 0; /* overlaps the first */
    CHECK(dp_reducer_skip(red, lo, hi, 2) == -1);
    dp_reducer_close(red);
    dp_ring_free(&ring);
    dp_transport_close(t[0]);
}

int main(void)
{
    static job ref[RANKS], got[RANKS];
    const dp_overlap off[RANKS] = {DP_OVERLAP_OFF, DP_OVERLAP_OFF, DP_OVERLAP_OFF};
    const int spare1[RANKS] = {1, 1, 1};
    run(ref, off, spare1, 0);
    for (int r = 0; r < RANKS; r++) {
        REQUIRE(!ref[r].failed);
        CHECK(memcmp(ref[r].params, ref[0].params, sizeof ref[0].params) == 0);
        CHECK(ref[r].second.decided && !ref[r].second.overlap);
        CHECK(strcmp(ref[r].second.reason, "forced") == 0);
    }

    struct {
        const char *name;
        dp_overlap mode[RANKS];
        int spare[RANKS];
        int one_layer;
    } cases[] = {
        {"on", {DP_OVERLAP_ON, DP_OVERLAP_ON, DP_OVERLAP_ON}, {0, 0, 0}, 0},
        {"auto", {DP_OVERLAP_AUTO, DP_OVERLAP_AUTO, DP_OVERLAP_AUTO}, {1, 1, 1}, 0},
        {"auto, rank 1 without a spare core",
         {DP_OVERLAP_AUTO, DP_OVERLAP_AUTO, DP_OVERLAP_AUTO},
         {1, 0, 1},
         0},
        {"auto, no spare core", {DP_OVERLAP_AUTO, DP_OVERLAP_AUTO, DP_OVERLAP_AUTO}, {0, 0, 0}, 0},
        {"on, off, on", {DP_OVERLAP_ON, DP_OVERLAP_OFF, DP_OVERLAP_ON}, {1, 1, 1}, 0},
        {"auto, one layer", {DP_OVERLAP_AUTO, DP_OVERLAP_AUTO, DP_OVERLAP_AUTO}, {1, 1, 1}, 1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        run(got, cases[k].mode, cases[k].spare, cases[k].one_layer);
        int autom = cases[k].mode[0] == DP_OVERLAP_AUTO;
        for (int r = 0; r < RANKS; r++) {
            REQUIRE(!got[r].failed);
            CHECKF(memcmp(got[r].params, ref[0].params, sizeof ref[0].params) == 0,
                   "%s: rank %d differs from inline", cases[k].name, r);
            if (!autom) {
                CHECK(strcmp(got[r].second.reason, "forced") == 0);
                CHECK(got[r].second.overlap == (cases[k].mode[r] == DP_OVERLAP_ON));
                continue;
            }
            /* One choice, on every rank, at the same step; again after the
             * restart, measured afresh. */
            CHECKF(got[r].first.decided && got[r].second.decided, "%s: rank %d undecided",
                   cases[k].name, r);
            CHECKF(same_choice(&got[r].first, &got[0].first) &&
                       same_choice(&got[r].second, &got[0].second),
                   "%s: rank %d chose otherwise than rank 0", cases[k].name, r);
            /* Only a rank without a spare core knows its answer at once. */
            CHECKF(got[r].undecided_after_restart == (cases[k].spare[r] > 0), "%s: rank %d",
                   cases[k].name, r);
        }
        if (autom) {
            int veto = cases[k].spare[0] + cases[k].spare[1] + cases[k].spare[2] < RANKS;
            const dp_overlap_choice *c = &got[0].second;
            fprintf(stderr, "%s: overlap %s (%s; %.3f ms overlapped vs %.3f inline)\n",
                    cases[k].name, c->overlap ? "on" : "off", c->reason, c->overlap_ms,
                    c->inline_ms);
            if (veto) {
                CHECK(!c->overlap && c->overlap_ms == 0);
                CHECK(strstr(c->reason, "no spare core") != NULL);
            } else if (cases[k].one_layer) {
                CHECK(!c->overlap && c->overlap_ms == 0);
                CHECK(strcmp(c->reason, "no bucket is final before backprop ends") == 0);
                for (int r = 0; r < RANKS; r++)
                    CHECKF(got[r].early == 0, "rank %d overlapped %ld buckets", r, got[r].early);
            } else {
                CHECK(strcmp(c->reason, "measured") == 0 && c->overlap_ms > 0 &&
                      c->inline_ms > 0 && c->ratio > 0);
                CHECK(c->overlap == (c->ratio < 1 - DP_REDUCER_MARGIN));
            }
        }
    }
    skip_ranges();
    return CHECK_DONE();
}
