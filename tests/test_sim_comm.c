/* sim's collectives (src/device/sim_comm.c; docs/gpu.md, "Backends"):
 * 3 ranks as threads and as processes sum 1,000,003 floats ten times, and
 * every rank gets the bits of a plain loop over the ranks in rank order; a
 * rank killed after joining fails the survivors' sum naming it (a zombie
 * counts as gone), comm_wait repeats it, sync does not, and the survivors
 * rebuild a 2-rank communicator that sums right; a rank that aborts fails
 * the others; a sum during a graph capture, ranks that sum different counts
 * and every bad join argument are refused with the value named; a join
 * nobody else comes to times out naming the missing ranks, and a rank that
 * came meanwhile fails with it; and nothing this test named is left in
 * /dev/shm. */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "device/backend.h"
#include "downpour/testhooks.h"

#define ID 128
#define N 1000003 /* 16 chunks of sim's 64 Ki-float slots, the last one short */
#define ROUNDS 10
#define RANKS 3

static const dp_backend *be = &dp_backend_sim;

/* Every segment name this test's ids stand for, to look for at the end. */
static char names[64][80];
static int n_names;
static pthread_mutex_t names_lock = PTHREAD_MUTEX_INITIALIZER;

static void name_of(const uint8_t *id, char *buf, size_t len)
{
    int at = snprintf(buf, len, "/dev/shm/downpour-simcomm-");
    for (int i = 0; i < 16; i++)
        at += snprintf(buf + at, len - (size_t)at, "%02x", id[i]);
}

static void new_id(void *ctx, uint8_t *id)
{
    char msg[256] = "";
    REQUIRE(be->comm_id(ctx, id, ID, msg, sizeof msg) == 0);
    pthread_mutex_lock(&names_lock);
    REQUIRE(n_names < 64);
    name_of(id, names[n_names++], sizeof names[0]);
    pthread_mutex_unlock(&names_lock);
}

static int exists(const uint8_t *id)
{
    char path[80];
    struct stat st;
    name_of(id, path, sizeof path);
    return stat(path, &st) == 0 && st.st_size > 0;
}

/* A sum queued and waited for, as a caller that has nothing else to watch
 * does: 0 done, -1 failed (comm_wait's message then says why). */
static int sum_done(void *ctx, void *comm, float *buf, size_t n)
{
    if (be->comm_allreduce(ctx, comm, buf, n) < 0)
        return -1;
    int rc;
    while ((rc = be->comm_wait(ctx, comm, 1.0, NULL, 0)) == 0)
        ;
    return rc == 1 ? 0 : -1;
}

static void *open_ctx(void)
{
    void *ctx = NULL;
    char msg[256] = "";
    REQUIRE(be->open(&ctx, 0, msg, sizeof msg) == 0);
    return ctx;
}

/* Rank r's value i in round k: both signs, exponents -8 to 7, never zero,
 * so the order of the sum shows in the bits. */
static float value(int r, size_t i, int k)
{
    uint64_t x = (uint64_t)(r + 1) * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xBF58476D1CE4E5B9ull +
                 (uint64_t)k * 0x94D049BB133111EBull;
    x ^= x >> 31;
    x *= 0xD6E8FEB86659FD93ull;
    x ^= x >> 29;
    float m = 0.5f + (float)((x >> 40) & 0xFFFFFF) / 33554432.0f;
    return ldexpf((x & 1) ? -m : m, (int)((x >> 20) & 15) - 8);
}

/* The plain loop: the ranks' buffers summed in rank order. */
static void rank_order_sum(float *want, int ranks, size_t n, int k)
{
    for (size_t i = 0; i < n; i++) {
        float s = value(0, i, k);
        for (int r = 1; r < ranks; r++)
            s += value(r, i, k);
        want[i] = s;
    }
}

static uint64_t fnv(const void *p, size_t bytes, uint64_t h)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < bytes; i++)
        h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

typedef struct job {
    const uint8_t *id;
    int ranks, rank;
    size_t n;
    int rounds;
    int wrong;     /* rounds whose result differed from the rank-order loop */
    int failed;    /* a call that should have worked did not */
    uint64_t hash; /* of every round's result */
    char msg[512];
} job;

/* One rank: its own sim context, join, `rounds` sums of its values, each
 * checked against the rank-order loop. */
static void *run_rank(void *arg)
{
    job *j = arg;
    void *ctx = open_ctx(), *comm = NULL;
    j->hash = 0xCBF29CE484222325ull;
    if (be->comm_join(ctx, j->id, ID, j->ranks, j->rank, &comm, j->msg, sizeof j->msg) < 0) {
        j->failed = 1;
        be->close(ctx);
        return NULL;
    }
    float *buf = be->alloc(ctx, j->n * sizeof(float));
    float *want = malloc(j->n * sizeof(float));
    REQUIRE(buf && want);
    for (int k = 0; k < j->rounds; k++) {
        for (size_t i = 0; i < j->n; i++)
            buf[i] = value(j->rank, i, k);
        if (sum_done(ctx, comm, buf, j->n) < 0) {
            be->comm_wait(ctx, comm, 1.0, j->msg, sizeof j->msg);
            j->failed = 1;
            break;
        }
        rank_order_sum(want, j->ranks, j->n, k);
        j->wrong += memcmp(buf, want, j->n * sizeof(float)) != 0;
        j->hash = fnv(buf, j->n * sizeof(float), j->hash);
    }
    if (!j->failed && be->comm_wait(ctx, comm, 1.0, j->msg, sizeof j->msg) != 1)
        j->failed = 1;
    be->comm_free(ctx, comm);
    be->free(ctx, buf);
    free(want);
    be->close(ctx);
    return NULL;
}

/* The test's values do tell orders apart: (x0 + x1) + x2 and x0 + (x1 + x2)
 * differ in many places. */
static void test_order_matters(void)
{
    size_t differ = 0;
    for (size_t i = 0; i < 100000; i++) {
        float a = value(0, i, 0), b = value(1, i, 0), c = value(2, i, 0);
        volatile float left = a + b, right = b + c;
        differ += (float)(left + c) != (float)(a + right);
    }
    CHECKF(differ > 1000, "only %zu of 100000 sums depend on the order", differ);
}

static void test_threads(void)
{
    void *ctx = open_ctx();
    uint8_t id[ID];
    new_id(ctx, id);
    job jobs[RANKS];
    pthread_t t[RANKS];
    for (int r = 0; r < RANKS; r++) {
        jobs[r] = (job){.id = id, .ranks = RANKS, .rank = r, .n = N, .rounds = ROUNDS};
        REQUIRE(pthread_create(&t[r], NULL, run_rank, &jobs[r]) == 0);
    }
    for (int r = 0; r < RANKS; r++)
        pthread_join(t[r], NULL);
    for (int r = 0; r < RANKS; r++) {
        CHECKF(!jobs[r].failed, "thread rank %d: %s", r, jobs[r].msg);
        CHECKF(jobs[r].wrong == 0, "thread rank %d: %d of %d sums differ from the rank-order loop",
               r, jobs[r].wrong, ROUNDS);
        CHECK(jobs[r].hash == jobs[0].hash);
    }
    CHECK(!exists(id));
    be->close(ctx);
}

static void test_processes(void)
{
    void *ctx = open_ctx();
    uint8_t id[ID];
    new_id(ctx, id);
    int fds[RANKS][2];
    pid_t pid[RANKS];
    for (int r = 0; r < RANKS; r++) {
        REQUIRE(pipe(fds[r]) == 0);
        pid[r] = fork();
        REQUIRE(pid[r] >= 0);
        if (pid[r] == 0) {
            job j = {.id = id, .ranks = RANKS, .rank = r, .n = N, .rounds = ROUNDS};
            run_rank(&j);
            ssize_t w = write(fds[r][1], &j, sizeof j);
            _exit(w == (ssize_t)sizeof j ? 0 : 2);
        }
        close(fds[r][1]);
    }
    job got[RANKS];
    for (int r = 0; r < RANKS; r++) {
        ssize_t k = read(fds[r][0], &got[r], sizeof got[r]);
        close(fds[r][0]);
        int st = 0;
        waitpid(pid[r], &st, 0);
        CHECKF(k == (ssize_t)sizeof got[r] && WIFEXITED(st) && WEXITSTATUS(st) == 0,
               "process rank %d: read %zd bytes, status %d", r, k, st);
        if (k != (ssize_t)sizeof got[r])
            return;
    }
    for (int r = 0; r < RANKS; r++) {
        CHECKF(!got[r].failed, "process rank %d: %s", r, got[r].msg);
        CHECKF(got[r].wrong == 0, "process rank %d: %d of %d sums differ", r, got[r].wrong,
               ROUNDS);
        CHECK(got[r].hash == got[0].hash);
    }
    CHECK(!exists(id));
    be->close(ctx);
}

/* ---- a lost peer ---- */

typedef struct survivor {
    const uint8_t *id;
    int rank, ranks;
    pthread_barrier_t *bar;
    uint8_t *id2; /* rank 0 makes the rebuilt communicator's id */
    const char *want; /* in the failure */
    int abort_at_once; /* this rank aborts right after joining */
    char msg[512];
    int ok;
} survivor;

/* A survivor's sum fails naming the lost rank; comm_wait says the same;
 * the device's sync does not; then ranks 0 and 1 rebuild and sum. */
static void *survive(void *arg)
{
    survivor *s = arg;
    void *ctx = open_ctx(), *comm = NULL;
    char msg[512] = "";
    s->ok = 1;
    if (be->comm_join(ctx, s->id, ID, s->ranks, s->rank, &comm, s->msg, sizeof s->msg) < 0) {
        s->ok = 0;
        be->close(ctx);
        return NULL;
    }
    if (s->abort_at_once) {
        be->comm_abort(ctx, comm);
        be->close(ctx);
        return NULL;
    }
    float buf[1000];
    for (int i = 0; i < 1000; i++)
        buf[i] = (float)i;
    if (sum_done(ctx, comm, buf, 1000) != -1) {
        snprintf(s->msg, sizeof s->msg, "the sum without rank 2 worked");
        s->ok = 0;
    }
    if (be->comm_wait(ctx, comm, 1.0, msg, sizeof msg) != -1 || !strstr(msg, s->want)) {
        snprintf(s->msg, sizeof s->msg, "comm_wait: \"%.300s\", wanted \"%.100s\"", msg, s->want);
        s->ok = 0;
    }
    if (be->comm_allreduce(ctx, comm, buf, 1000) != -1) { /* the failure is kept */
        snprintf(s->msg, sizeof s->msg, "a second sum worked");
        s->ok = 0;
    }
    if (be->sync(ctx, msg, sizeof msg) != 0) {
        snprintf(s->msg, sizeof s->msg, "sync failed with the communicator: %.400s", msg);
        s->ok = 0;
    }
    be->comm_abort(ctx, comm);
    if (!s->id2) { /* the abort case: no rebuild */
        be->close(ctx);
        return NULL;
    }
    if (s->rank == 0)
        new_id(ctx, s->id2);
    pthread_barrier_wait(s->bar);
    job j = {.id = s->id2, .ranks = 2, .rank = s->rank, .n = 200000, .rounds = 2};
    run_rank(&j);
    if (j.failed || j.wrong) {
        snprintf(s->msg, sizeof s->msg, "the rebuilt 2 ranks: %.400s (%d wrong)", j.msg, j.wrong);
        s->ok = 0;
    }
    be->close(ctx);
    return NULL;
}

static void test_killed_rank(void)
{
    dp_hook_set("DOWNPOUR_SIM_COMM_TIMEOUT", "60", NULL); /* the killed rank shows long before */
    void *ctx = open_ctx();
    uint8_t id[ID], id2[ID];
    new_id(ctx, id);
    pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        void *cctx = open_ctx(), *comm = NULL;
        char msg[256];
        if (be->comm_join(cctx, id, ID, 3, 2, &comm, msg, sizeof msg) < 0)
            _exit(3);
        raise(SIGKILL); /* joined, then gone before the sum */
        _exit(4);
    }
    char want[64];
    snprintf(want, sizeof want, "rank 2 of 3 (pid %d) is gone", (int)child);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 2);
    survivor s[2];
    pthread_t t[2];
    for (int r = 0; r < 2; r++) {
        s[r] = (survivor){.id = id, .rank = r, .ranks = 3, .bar = &bar, .id2 = id2, .want = want};
        REQUIRE(pthread_create(&t[r], NULL, survive, &s[r]) == 0);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(t[r], NULL);
    /* reaped only now: the survivors saw a zombie */
    int st = 0;
    waitpid(child, &st, 0);
    CHECKF(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the killed rank ended with status %d",
           st);
    for (int r = 0; r < 2; r++)
        CHECKF(s[r].ok, "survivor %d: %s", r, s[r].msg);
    CHECK(!exists(id) && !exists(id2));
    pthread_barrier_destroy(&bar);
    be->close(ctx);
    dp_hook_set("DOWNPOUR_SIM_COMM_TIMEOUT", NULL, NULL);
}

/* Rank 2 aborts right after joining: the others' sum fails on its flag
 * (the ranks are threads of one process, so its pid tells nothing). */
static void test_abort(void)
{
    dp_hook_set("DOWNPOUR_SIM_COMM_TIMEOUT", "120", NULL); /* a timeout would say something else */
    void *ctx = open_ctx();
    uint8_t id[ID];
    new_id(ctx, id);
    char want[96];
    snprintf(want, sizeof want, "rank 2 of 3 (pid %d) left the communicator", (int)getpid());
    survivor s[3];
    pthread_t t[3];
    for (int r = 0; r < 3; r++) {
        s[r] = (survivor){.id = id, .rank = r, .ranks = 3, .abort_at_once = r == 2, .want = want};
        REQUIRE(pthread_create(&t[r], NULL, survive, &s[r]) == 0);
    }
    for (int r = 0; r < 3; r++)
        pthread_join(t[r], NULL);
    for (int r = 0; r < 3; r++)
        CHECKF(s[r].ok, "rank %d: %s", r, s[r].msg);
    CHECK(!exists(id));
    be->close(ctx);
    dp_hook_set("DOWNPOUR_SIM_COMM_TIMEOUT", NULL, NULL);
}

/* ---- refusals ---- */

static void join_refused(void *ctx, const uint8_t *id, size_t id_len, int ranks, int rank,
                         const char *want1, const char *want2)
{
    void *comm = (void *)1;
    char msg[512] = "";
    CHECKF(be->comm_join(ctx, id, id_len, ranks, rank, &comm, msg, sizeof msg) == -1,
           "rank %d of %d (id_len %zu) joined", rank, ranks, id_len);
    CHECK(comm == NULL);
    CHECKF(strstr(msg, want1) && (!want2 || strstr(msg, want2)), "rank %d of %d: \"%s\"", rank,
           ranks, msg);
}

typedef struct joiner {
    const uint8_t *id;
    int ranks, rank;
    void *ctx, *comm;
    int rc;
    char msg[512];
} joiner;

static void *join_thread(void *arg)
{
    joiner *j = arg;
    j->rc = be->comm_join(j->ctx, j->id, ID, j->ranks, j->rank, &j->comm, j->msg, sizeof j->msg);
    return NULL;
}

static void test_refusals(void)
{
    void *ctx = open_ctx(), *comm = NULL;
    uint8_t id[ID], other[ID];
    char msg[512] = "";
    CHECK(be->comm_id(ctx, id, ID - 1, msg, sizeof msg) == -1 && strstr(msg, "127"));
    new_id(ctx, id);
    join_refused(ctx, id, ID - 1, 2, 0, "127 id bytes", "128");
    join_refused(ctx, id, ID + 1, 2, 0, "129 id bytes", "128");
    join_refused(ctx, id, ID, 3, 3, "rank 3", "3 ranks");
    join_refused(ctx, id, ID, 3, -1, "rank -1", "3 ranks");
    join_refused(ctx, id, ID, 0, 0, "0 ranks", "1 to 1024");
    join_refused(ctx, id, ID, 1025, 0, "1025 ranks", "1 to 1024");
    memset(other, 0, sizeof other);
    join_refused(ctx, other, ID, 2, 0, "not made by sim's comm_id", NULL);
    memcpy(other, id, ID);
    other[100] = 7; /* an id of another kind (NCCL's) */
    join_refused(ctx, other, ID, 2, 0, "not made by sim's comm_id", NULL);
    const char *bad[] = {"abc", "0", "-1", "5s", "inf", " 5", "1e3", "0x10"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dp_hook_set("DOWNPOUR_SIM_COMM_TIMEOUT", bad[i], NULL);
        char quoted[32];
        snprintf(quoted, sizeof quoted, "'%s'", bad[i]);
        join_refused(ctx, id, ID, 2, 0, "DOWNPOUR_SIM_COMM_TIMEOUT", quoted);
    }
    CHECK(!exists(id)); /* no refusal above got as far as the segment */

    /* another `ranks`, and a rank twice, while rank 0 of 2 waits */
    dp_hook_set("DOWNPOUR_SIM_COMM_TIMEOUT", NULL, NULL);
    joiner a = {.id = id, .ranks = 2, .rank = 0, .ctx = open_ctx()};
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, join_thread, &a) == 0);
    for (int i = 0; i < 10000 && !exists(id); i++) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    CHECK(exists(id));
    join_refused(ctx, id, ID, 3, 1, "joins with 3 ranks", "made for 2 ranks");
    join_refused(ctx, id, ID, 2, 0, "rank 0 of 2 joined this communicator twice", NULL);
    CHECKF(be->comm_join(ctx, id, ID, 2, 1, &comm, msg, sizeof msg) == 0, "%s", msg);
    pthread_join(t, NULL);
    CHECKF(a.rc == 0, "rank 0: %s", a.msg);
    CHECK(!exists(id)); /* unlinked once both joined */
    CHECK(be->comm_wait(ctx, comm, 0.0, msg, sizeof msg) == 1);
    be->comm_free(ctx, comm);
    be->comm_free(a.ctx, a.comm);
    be->close(a.ctx);

    /* a join nobody else comes to */
    dp_hook_set("DOWNPOUR_SIM_COMM_TIMEOUT", "1", NULL);
    new_id(ctx, id);
    join_refused(ctx, id, ID, 3, 0, "comm_join: rank(s) 1, 2 of 3 did not join within 1 s",
                 "DOWNPOUR_SIM_COMM_TIMEOUT");
    CHECK(!exists(id));

    /* a rank that joins while rank 0 gives up (its 2 s) fails then, not
     * after its own 30 s */
    dp_hook_set("DOWNPOUR_SIM_COMM_TIMEOUT", "2", NULL);
    new_id(ctx, id);
    joiner g = {.id = id, .ranks = 3, .rank = 0, .ctx = open_ctx()};
    REQUIRE(pthread_create(&t, NULL, join_thread, &g) == 0);
    for (int i = 0; i < 10000 && !exists(id); i++) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    dp_hook_set("DOWNPOUR_SIM_COMM_TIMEOUT", "30", NULL); /* rank 0 read its 2 before the file was */
    char want[64];
    snprintf(want, sizeof want, "rank 0 of 3 (pid %d) gave up joining", (int)getpid());
    join_refused(ctx, id, ID, 3, 1, want, NULL);
    pthread_join(t, NULL);
    CHECKF(g.rc == -1 && strstr(g.msg, "2 of 3 did not join within 2 s"), "rank 0: %s", g.msg);
    CHECK(!exists(id));
    be->close(g.ctx);
    dp_hook_set("DOWNPOUR_SIM_COMM_TIMEOUT", NULL, NULL);
    be->close(ctx);
}

/* Two ranks that sum different counts both fail, naming the counts. */
typedef struct small_sum {
    joiner *j;
    float y[100];
    int rc;
    char msg[512];
} small_sum;

static void *sum_small(void *arg)
{
    small_sum *s = arg;
    s->rc = sum_done(s->j->ctx, s->j->comm, s->y, 100);
    be->comm_wait(s->j->ctx, s->j->comm, 0.0, s->msg, sizeof s->msg);
    return NULL;
}

/* Two ranks joined: rank 0 here on ctx (*comm), rank 1 by a thread on a
 * context of its own (a->ctx, a->comm). */
static void join_two(void *ctx, uint8_t *id, void **comm, joiner *a)
{
    char msg[512] = "";
    new_id(ctx, id);
    *a = (joiner){.id = id, .ranks = 2, .rank = 1, .ctx = open_ctx()};
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, join_thread, a) == 0);
    REQUIRE(be->comm_join(ctx, id, ID, 2, 0, comm, msg, sizeof msg) == 0);
    pthread_join(t, NULL);
    REQUIRE(a->rc == 0);
}

static void test_count_mismatch(void)
{
    dp_hook_set("DOWNPOUR_SIM_COMM_TIMEOUT", "120", NULL); /* a timeout would say something else */
    void *ctx = open_ctx(), *comm = NULL;
    uint8_t id[ID];
    char msg[512] = "";
    joiner a;
    join_two(ctx, id, &comm, &a);
    pthread_t t;
    static small_sum s;
    s.j = &a;
    REQUIRE(pthread_create(&t, NULL, sum_small, &s) == 0);
    static float x[200000];
    CHECK(sum_done(ctx, comm, x, 200000) == -1);
    pthread_join(t, NULL);
    CHECK(s.rc == -1);
    CHECK(be->comm_wait(ctx, comm, 0.0, msg, sizeof msg) == -1);
    CHECKF(strstr(msg, "rank 1 of 2 sums 100 floats, rank 0 200000"), "rank 0: %s", msg);
    CHECKF(strstr(s.msg, "rank 0 of 2 sums 200000 floats, rank 1 100"), "rank 1: %s", s.msg);
    be->comm_abort(ctx, comm);
    be->comm_abort(a.ctx, a.comm);
    be->close(a.ctx);

    /* a sum while a graph is captured is refused (sim records none); a
     * communicator left open is ended by close */
    new_id(ctx, id);
    REQUIRE(be->comm_join(ctx, id, ID, 1, 0, &comm, msg, sizeof msg) == 0);
    CHECK(!exists(id));
    float y[3] = {1, 2, 3};
    CHECK(sum_done(ctx, comm, y, 3) == 0 && y[0] == 1 && y[1] == 2 && y[2] == 3);
    REQUIRE(be->capture_begin(ctx, msg, sizeof msg) == 0);
    CHECK(be->comm_allreduce(ctx, comm, y, 3) == -1);
    void *graph = NULL;
    CHECK(be->capture_end(ctx, &graph, msg, sizeof msg) == 0);
    be->graph_free(ctx, graph);
    CHECK(be->comm_wait(ctx, comm, 0.0, msg, sizeof msg) == -1);
    CHECKF(strstr(msg, "a sum of 3 floats during a graph capture"), "%s", msg);
    CHECK(be->sync(ctx, msg, sizeof msg) == 0);
    be->close(ctx); /* with comm still joined: ASan names a leak if close forgets it */
    dp_hook_set("DOWNPOUR_SIM_COMM_TIMEOUT", NULL, NULL);
}

typedef struct late_sum {
    joiner *j;
    float *y;
    size_t n;
    int rc;
} late_sum;

static void *sum_late(void *arg)
{
    late_sum *l = arg;
    struct timespec nap = {0, 300 * 1000 * 1000};
    nanosleep(&nap, NULL); /* the other rank's copy must wait for this */
    l->rc = sum_done(l->j->ctx, l->j->comm, l->y, l->n);
    return NULL;
}

/* A sum is queued, as NCCL's: comm_allreduce returns with the peer not
 * there yet, comm_wait says "not yet" within its bound, and once the peer
 * sums it says done; and what runs after a sum on the stream (a copy) runs
 * after it, with the summed values. */
static void test_queued(void)
{
    dp_hook_set("DOWNPOUR_SIM_COMM_TIMEOUT", "120", NULL);
    void *ctx = open_ctx(), *comm = NULL;
    uint8_t id[ID];
    char msg[512] = "";
    joiner a;
    join_two(ctx, id, &comm, &a);
    pthread_t t;
    enum { Q = 150000 }; /* three chunks */
    static float x[Q], y[Q], back[Q];
    for (int i = 0; i < Q; i++) {
        x[i] = (float)i;
        y[i] = 0.5f * (float)i;
    }
    CHECK(be->comm_allreduce(ctx, comm, x, Q) == 0);
    CHECKF(be->comm_wait(ctx, comm, 0.05, msg, sizeof msg) == 0,
           "a sum whose peer has not summed is done: %s", msg);
    late_sum l = {.j = &a, .y = y, .n = Q};
    REQUIRE(pthread_create(&t, NULL, sum_late, &l) == 0);
    CHECK(be->copy(ctx, back, x, sizeof back, DP_COPY_D2H) == 0); /* waits for the sum */
    int wrong = 0;
    for (int i = 0; i < Q; i++)
        wrong += back[i] != (float)i + 0.5f * (float)i;
    CHECKF(wrong == 0, "a copy after the sum read %d values before the sum", wrong);
    CHECK(be->comm_wait(ctx, comm, 0.0, msg, sizeof msg) == 1);
    pthread_join(t, NULL);
    CHECK(l.rc == 0 && memcmp(y, back, sizeof back) == 0);
    be->comm_free(ctx, comm);
    be->comm_free(a.ctx, a.comm);
    be->close(a.ctx);
    be->close(ctx);
    dp_hook_set("DOWNPOUR_SIM_COMM_TIMEOUT", NULL, NULL);
}

int main(void)
{
    test_order_matters();
    test_refusals();
    test_threads();
    test_processes();
    test_killed_rank();
    test_abort();
    test_count_mismatch();
    test_queued();
    for (int i = 0; i < n_names; i++) {
        struct stat st;
        CHECKF(stat(names[i], &st) != 0, "%s was left behind", names[i]);
    }
    return CHECK_DONE();
}
