/* allreduce's sparse tables (docs/strategies.md, "Sparse tables under
 * allreduce") on the in-process transport, one thread a replica:
 * - the exchange: for 2, 3 and 4 ranks, ids that overlap and ids disjoint,
 *   odd row counts and widths, buckets cut inside rows, a weight that is not
 *   one, a -0.0 in a row: the all-gather of (ids, rows) folded as the ring
 *   folds leaves every gradient element with the bits of the dense
 *   all-reduce of the whole buffer (the reducer over the same buckets), on
 *   every rank;
 * - bytes on the wire: what each rank sent in the all-gather equals its
 *   share of the blocks (4 + ids x (4 + 4 width) bytes a block, n-1 blocks
 *   forwarded) computed by hand;
 * - a block with an id out of range is refused, naming the peer;
 * - the strategy: 8-emb1000x16-gap-10 (and an odd 5-emb301x3-gap-4) on 2, 3
 *   and 4 replicas ends with the same bits sparse and under
 *   --allreduce-dense, every replica alike, and within float noise of one
 *   process at the summed batch (a short last step included); the sparse
 *   run sends fewer bytes by at least half of what the plan says the rows
 *   save, so the by-rows path was taken;
 * - a replica whose table does not fit the memory is refused, naming the
 *   table's size and the memory (and a malformed DOWNPOUR_REPLICA_MEMORY,
 *   naming it);
 * - under --compress powersgd the table goes by its rows beside the
 *   factors (or whole with them), every replica alike, by rows and whole
 *   the same bits on 2 replicas and within float noise on 3. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "inproc_node.h"
#include "downpour/inproc.h"
#include "downpour/log.h"
#include "downpour/rng.h"
#include "downpour/strategy.h"
#include "downpour/train.h"
#include "downpour/wire.h"
#include "strategy/allreduce_sparse.h"

#define MAX_RANKS 4

/* ------------------------------------------------------------ the exchange */

typedef struct xjob {
    const char *model;
    int n, me, disjoint;
    size_t bucket_bytes;
    dp_transport *t;
    float *dense, *sparse; /* the two results */
    size_t n_params;
    uint64_t sent, hand;   /* bytes the all-gather sent, and by hand */
    int rc;
    dp_err err;
} xjob;

/* Rank me's ids: record b, place i (T places a record).  Overlapping: ids
 * in a small shared range; disjoint: rank me's own residue class. */
static uint32_t id_of(const xjob *j, int rows, int b, int i, int T)
{
    uint32_t v = (uint32_t)(b * T + i) * 7u + 3u * (uint32_t)j->me;
    if (j->disjoint)
        return (uint32_t)(((v % (uint32_t)(rows / j->n)) * (uint32_t)j->n + (uint32_t)j->me) %
                          (uint32_t)rows);
    return v % (uint32_t)(rows / 2 + 1);
}

static void *exchange_job(void *arg)
{
    xjob *j = arg;
    dp_model m;
    dp_err *err = &j->err;
    j->rc = -1;
    const int batch = 3;
    REQUIRE(dp_model_init(&m, j->model, batch, 1, err) == 0);
    dp_model_init_params(&m, 1);
    dp_sparse_table t[DP_SPARSE_MAX];
    REQUIRE(dp_model_sparse_tables(&m, t, DP_SPARSE_MAX) == 1);
    int T = dp_model_inputs(&m);
    float x[3 * 64];
    REQUIRE(T <= 64);
    for (int b = 0; b < batch; b++)
        for (int i = 0; i < T; i++)
            x[b * T + i] = (float)id_of(j, (int)t[0].rows, b, i, T);
    /* The gradient: this rank's rows and every dense element random, every
     * other row zero, as backprop leaves them; one element -0.0. */
    float *g = malloc(m.n_params * sizeof *g);
    REQUIRE(g);
    dp_rng rng;
    dp_rng_seed(&rng, 100 + (uint64_t)j->me);
    memset(g, 0, m.n_params * sizeof *g);
    for (size_t i = t[0].off + (size_t)t[0].rows * t[0].width; i < m.n_params; i++)
        g[i] = dp_rng_uniform(&rng) - 0.5f;
    for (int b = 0; b < batch; b++)
        for (int i = 0; i < T; i++) {
            size_t r = (size_t)x[b * T + i];
            for (int k = 0; k < t[0].width; k++)
                g[t[0].off + r * t[0].width + k] = dp_rng_uniform(&rng) - 0.5f;
        }
    g[t[0].off + (size_t)x[0] * t[0].width] = -0.0f;
    const float weight = 1.0f / 3.0f;
    int ranks[MAX_RANKS];
    for (int i = 0; i < j->n; i++)
        ranks[i] = i;
    dp_ring ring;
    dp_reducer *red = NULL, *red2 = NULL;
    dp_ar_sparse *sp = NULL;
    REQUIRE(dp_ring_init(&ring, j->t, ranks, j->n, 30, 64, err) == 0); /* 16-float segments */
    /* dense: the reducer over the whole buffer */
    memcpy(j->dense, g, m.n_params * sizeof *g);
    REQUIRE(dp_reducer_open(&red, &ring, j->dense, m.n_params, j->bucket_bytes, DP_OVERLAP_OFF, 0,
                            err) == 0);
    dp_reducer_begin(red, 1, weight);
    if (dp_reducer_finish(red, err) < 0)
        goto out;
    /* sparse: the reducer leaves the table to the all-gather */
    memcpy(j->sparse, g, m.n_params * sizeof *g);
    REQUIRE(dp_reducer_open(&red2, &ring, j->sparse, m.n_params, j->bucket_bytes, DP_OVERLAP_OFF,
                            0, err) == 0);
    REQUIRE(dp_ar_sparse_open(&sp, &m, j->n, batch, err) == 0);
    size_t lo[DP_SPARSE_MAX], hi[DP_SPARSE_MAX];
    REQUIRE(dp_reducer_skip(red2, lo, hi, dp_ar_sparse_ranges(sp, lo, hi)) == 0);
    dp_ar_sparse_rows(sp, &m, x, batch);
    dp_reducer_begin(red2, 2, weight);
    if (dp_reducer_finish(red2, err) < 0 ||
        dp_ar_sparse_exchange(sp, &ring, red2, j->sparse, weight, 2, err) < 0)
        goto out;
    uint64_t gathered;
    dp_ar_sparse_last(sp, &gathered, &j->sent);
    /* By hand: every rank's unique ids, a block 4 + u (4 + 4 width); this
     * rank forwards every block but its successor's. */
    j->hand = 0;
    for (int q = 0; q < j->n; q++) {
        if (q == (j->me + 1) % j->n)
            continue;
        xjob o = *j;
        o.me = q;
        unsigned char seen[4096] = {0};
        long u = 0;
        REQUIRE(t[0].rows <= 4096);
        for (int b = 0; b < batch; b++)
            for (int i = 0; i < T; i++) {
                uint32_t id = id_of(&o, (int)t[0].rows, b, i, T);
                u += !seen[id];
                seen[id] = 1;
            }
        j->hand += 4 + (uint64_t)u * (4 + 4 * (uint64_t)t[0].width);
    }
    j->n_params = m.n_params;
    j->rc = 0;
out:
    dp_ar_sparse_close(sp);
    dp_reducer_close(red);
    dp_reducer_close(red2);
    dp_ring_free(&ring);
    free(g);
    dp_model_free(&m);
    return NULL;
}

static void check_exchange(const char *model, int n, int disjoint, size_t bucket_bytes)
{
    dp_transport *ts[MAX_RANKS];
    dp_err err;
    REQUIRE(dp_inproc_open(ts, n, &err) == 0);
    xjob jobs[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    for (int p = 0; p < n; p++) {
        memset(&jobs[p], 0, sizeof jobs[p]);
        jobs[p] = (xjob){.model = model, .n = n, .me = p, .disjoint = disjoint,
                         .bucket_bytes = bucket_bytes, .t = ts[p]};
        jobs[p].dense = malloc(20000 * sizeof(float));
        jobs[p].sparse = malloc(20000 * sizeof(float));
        REQUIRE(jobs[p].dense && jobs[p].sparse);
        REQUIRE(pthread_create(&th[p], NULL, exchange_job, &jobs[p]) == 0);
    }
    for (int p = 0; p < n; p++)
        pthread_join(th[p], NULL);
    for (int p = 0; p < n; p++)
        dp_transport_close(ts[p]);
    for (int p = 0; p < n; p++) {
        CHECKF(jobs[p].rc == 0, "%s, %d ranks: rank %d: %s", model, n, p, jobs[p].err.msg);
        if (jobs[p].rc != 0)
            continue;
        size_t np = jobs[p].n_params, bad = 0;
        for (size_t i = 0; i < np; i++)
            if (memcmp(&jobs[p].dense[i], &jobs[p].sparse[i], sizeof(float)) != 0 && bad++ < 3)
                fprintf(stderr, "%s, %d ranks%s: rank %d element %zu: dense %a, sparse %a\n",
                        model, n, disjoint ? " (disjoint)" : "", p, i,
                        (double)jobs[p].dense[i], (double)jobs[p].sparse[i]);
        CHECKF(bad == 0, "%s, %d ranks%s, buckets of %zu bytes: rank %d: %zu elements differ "
               "from the dense all-reduce", model, n, disjoint ? " (disjoint)" : "",
               bucket_bytes, p, bad);
        CHECKF(memcmp(jobs[p].sparse, jobs[0].sparse, np * sizeof(float)) == 0,
               "%s, %d ranks: rank %d ends with other bits than rank 0", model, n, p);
        CHECKF(jobs[p].sent == jobs[p].hand,
               "%s, %d ranks: rank %d sent %llu bytes in the all-gather, by hand %llu", model, n,
               p, (unsigned long long)jobs[p].sent, (unsigned long long)jobs[p].hand);
    }
    fprintf(stderr, "%s, %d ranks%s, buckets of %zu bytes: sparse = dense bit for bit; rank 0 "
            "sent %llu bytes of rows\n", model, n, disjoint ? " (disjoint)" : "", bucket_bytes,
            (unsigned long long)jobs[0].sent);
    for (int p = 0; p < n; p++) {
        free(jobs[p].dense);
        free(jobs[p].sparse);
    }
}

/* ------------------------------------------------------------ a bad block */

typedef struct bjob {
    dp_transport *t;
    int me, rc;
    dp_err err;
} bjob;

/* Rank 1 sends a block naming row 99 of a 37-row table: rank 0 refuses it. */
static void *bad_job(void *arg)
{
    bjob *j = arg;
    dp_model m;
    REQUIRE(dp_model_init(&m, "5-emb37x3-gap-4", 2, 1, &j->err) == 0);
    int ranks[2] = {0, 1};
    dp_ring ring;
    dp_reducer *red = NULL;
    dp_ar_sparse *sp = NULL;
    REQUIRE(dp_ring_init(&ring, j->t, ranks, 2, 30, 0, &j->err) == 0);
    REQUIRE(dp_reducer_open(&red, &ring, m.grads, m.n_params, 1 << 16, DP_OVERLAP_OFF, 0,
                            &j->err) == 0);
    REQUIRE(dp_ar_sparse_open(&sp, &m, 2, 2, &j->err) == 0);
    float x[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    if (j->me == 1) {
        uint8_t b[4 + 4 + 12];
        memset(b, 0, sizeof b);
        dp_put_u32(b, 1);
        dp_put_u32(b + 4, 99);
        size_t lens[2];
        uint8_t all[2 * 256];
        j->rc = dp_ring_allgather(&ring, b, sizeof b, all, 256, lens, 1, &j->err);
    } else {
        dp_ar_sparse_rows(sp, &m, x, 2);
        j->rc = dp_ar_sparse_exchange(sp, &ring, red, m.grads, 1.0f, 1, &j->err);
    }
    dp_ar_sparse_close(sp);
    dp_reducer_close(red);
    dp_ring_free(&ring);
    dp_model_free(&m);
    return NULL;
}

static void check_bad_block(void)
{
    dp_transport *ts[2];
    dp_err err;
    const char *names[2] = {"worker:0", "worker:1"};
    REQUIRE(dp_inproc_open_named(ts, 2, names, &err) == 0);
    bjob j[2] = {{.t = ts[0], .me = 0}, {.t = ts[1], .me = 1}};
    pthread_t th[2];
    for (int p = 0; p < 2; p++)
        REQUIRE(pthread_create(&th[p], NULL, bad_job, &j[p]) == 0);
    for (int p = 0; p < 2; p++)
        pthread_join(th[p], NULL);
    for (int p = 0; p < 2; p++)
        dp_transport_close(ts[p]);
    CHECKF(j[0].rc < 0 && strstr(j[0].err.msg, "worker:1") && strstr(j[0].err.msg, "99") &&
               strstr(j[0].err.msg, "out of range"),
           "a row out of range is not refused naming the peer: rc %d, %s", j[0].rc,
           j[0].err.msg);
}

/* ------------------------------------------------------------ the strategy */

typedef struct run_spec {
    const char *model;
    int replicas, batch;
    uint32_t n_train;
    int steps;
} run_spec;

static float *data_x;
static uint8_t *data_y;
static int data_inputs, data_rows;

typedef struct job {
    const run_spec *rs;
    dp_train_config cfg;
    int position;
    dp_transport *t;
    int rc;
    dp_err err;
    float *params;
    size_t n_params;
} job;

static uint32_t shard_first(const run_spec *rs, const dp_split *sp, int w)
{
    uint32_t first = 0;
    for (int v = 0; v < w; v++)
        first += dp_shard_size(DP_SHARD_DATA, sp, v, rs->replicas);
    return first;
}

static int records_at(const run_spec *rs, const dp_split *sp, int w, int k)
{
    long left = (long)dp_shard_size(DP_SHARD_DATA, sp, w, rs->replicas) - (long)k * rs->batch;
    return left < 0 ? 0 : left < rs->batch ? (int)left : rs->batch;
}

static void *run_replica(void *arg)
{
    job *j = arg;
    const run_spec *rs = j->rs;
    dp_node node;
    dp_model m;
    j->rc = -1;
    inproc_node(&node, j->t, rs->replicas, j->position);
    REQUIRE(dp_model_init(&m, rs->model, rs->batch, 1, &j->err) == 0);
    dp_model_init_params(&m, 7);
    dp_split counted = {.n = rs->n_train};
    dp_run_env env = {.cfg = &j->cfg, .node = &node, .model = &m, .train = &counted,
                      .n_train = counted.n, .steps_per_epoch = rs->steps};
    dp_task_info info;
    memset(&info, 0, sizeof info);
    dp_strategy *s = NULL;
    const dp_strategy_ops *ops = &dp_strategy_allreduce;
    if (ops->open(&s, &env, &info, &j->err) < 0)
        goto out;
    uint32_t first = shard_first(rs, &counted, j->position);
    for (int k = 0; k < rs->steps; k++) {
        int n = records_at(rs, &counted, j->position, k);
        size_t row = first + (size_t)k * rs->batch;
        dp_step_out o;
        if (ops->step(s, data_x + row * data_inputs, data_y + row, n, j->cfg.optim.lr, k + 1, &o,
                      &j->err) < 0)
            goto out;
    }
    const float *p = ops->params(s, DP_WEIGHTS_LIVE, &j->err);
    REQUIRE(p);
    j->n_params = m.n_params;
    j->params = malloc(m.n_params * sizeof(float));
    REQUIRE(j->params);
    memcpy(j->params, p, m.n_params * sizeof(float));
    j->rc = ops->finish(s, rs->steps, &j->err);
out:
    ops->close(s);
    dp_model_free(&m);
    dp_cluster_free(&node.cluster);
    return NULL;
}

static float *reference(const run_spec *rs, const dp_optim_config *oc)
{
    dp_model m;
    dp_optim opt;
    dp_err err;
    int cap = rs->replicas * rs->batch;
    REQUIRE(dp_model_init(&m, rs->model, cap, 1, &err) == 0);
    dp_model_init_params(&m, 7);
    REQUIRE(dp_optim_init(&opt, oc, m.n_params, &err) == 0);
    float *x = malloc((size_t)cap * data_inputs * sizeof *x);
    uint8_t *y = malloc((size_t)cap);
    float *out = malloc(m.n_params * sizeof *out);
    REQUIRE(x && y && out);
    dp_split counted = {.n = rs->n_train};
    for (int k = 0; k < rs->steps; k++) {
        int n = 0;
        for (int w = 0; w < rs->replicas; w++) {
            int r = records_at(rs, &counted, w, k);
            size_t row = shard_first(rs, &counted, w) + (size_t)k * rs->batch;
            memcpy(x + (size_t)n * data_inputs, data_x + row * data_inputs,
                   (size_t)r * data_inputs * sizeof *x);
            memcpy(y + n, data_y + row, (size_t)r);
            n += r;
        }
        dp_model_forward_backward(&m, x, y, n, NULL);
        dp_optim_apply(&opt, m.params, m.grads, oc->lr);
    }
    memcpy(out, m.params, m.n_params * sizeof *out);
    free(x);
    free(y);
    dp_optim_free(&opt);
    dp_model_free(&m);
    return out;
}

/* The replicas' parameters (replica 0's; every replica's alike), and the
 * bytes all of them sent, frame headers included, into *bytes. */
static float *run_all(const run_spec *rs, const dp_optim_config *oc, int dense,
                      const char *compress, size_t *np, uint64_t *bytes)
{
    job jobs[MAX_RANKS];
    dp_transport *ts[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    dp_err err;
    REQUIRE(dp_inproc_open(ts, rs->replicas, &err) == 0);
    for (int p = 0; p < rs->replicas; p++) {
        memset(&jobs[p], 0, sizeof jobs[p]);
        jobs[p].rs = rs;
        jobs[p].cfg = dp_train_defaults();
        REQUIRE(dp_strategy_select(&jobs[p].cfg, "allreduce", &err) == 0);
        if (dense)
            REQUIRE(dp_strategy_set(&jobs[p].cfg, "allreduce-dense", NULL, &err) == 0);
        REQUIRE(dp_strategy_set(&jobs[p].cfg, "bucket-bytes", "16384", &err) == 0);
        if (compress)
            REQUIRE(dp_strategy_set(&jobs[p].cfg, "compress", compress, &err) == 0);
        jobs[p].cfg.model = rs->model;
        jobs[p].cfg.batch = rs->batch;
        jobs[p].cfg.optim = *oc;
        jobs[p].cfg.collective_timeout = 30;
        jobs[p].position = p;
        jobs[p].t = ts[p];
        REQUIRE(pthread_create(&th[p], NULL, run_replica, &jobs[p]) == 0);
    }
    for (int p = 0; p < rs->replicas; p++)
        pthread_join(th[p], NULL);
    *bytes = 0;
    for (int p = 0; p < rs->replicas; p++) {
        dp_transport_stats st;
        REQUIRE(dp_transport_stats_get(ts[p], DP_PEER_ANY, &st) == 0);
        *bytes += st.bytes_sent;
        dp_transport_close(ts[p]);
    }
    float *out = NULL;
    for (int p = 0; p < rs->replicas; p++) {
        CHECKF(jobs[p].rc == 0, "%s%s: replica %d: %s", rs->model, dense ? " dense" : "", p,
               jobs[p].err.msg);
        if (jobs[p].rc == 0 && p > 0 && jobs[0].params)
            CHECKF(memcmp(jobs[p].params, jobs[0].params, jobs[0].n_params * sizeof(float)) == 0,
                   "%s: replica %d ends with other bits than replica 0", rs->model, p);
    }
    out = jobs[0].params;
    *np = jobs[0].n_params;
    for (int p = 1; p < rs->replicas; p++)
        free(jobs[p].params);
    return out;
}

/* compress: NULL, or --compress's value (powersgd:RANK: the table by its
 * rows beside the factors, or whole in the factors' first sum). */
static void check_strategy(const run_spec *rs, int rows, const char *compress)
{
    dp_rng rng;
    dp_rng_seed(&rng, 11);
    dp_model m;
    dp_err err;
    REQUIRE(dp_model_init(&m, rs->model, 1, 1, &err) == 0);
    data_inputs = dp_model_inputs(&m);
    data_rows = rows;
    int classes = dp_model_classes(&m);
    dp_model_free(&m);
    data_x = malloc((size_t)rs->n_train * data_inputs * sizeof *data_x);
    data_y = malloc(rs->n_train);
    REQUIRE(data_x && data_y);
    /* Zipf-like ids: the low ones in most records, so replicas overlap. */
    for (size_t i = 0; i < (size_t)rs->n_train * data_inputs; i++) {
        float u = dp_rng_uniform(&rng);
        data_x[i] = floorf((float)rows * u * u * u);
    }
    for (uint32_t i = 0; i < rs->n_train; i++)
        data_y[i] = (uint8_t)(dp_rng_uniform(&rng) * (float)classes);
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_SGD);
    oc.lr = 0.5f;
    float *ref = reference(rs, &oc);
    size_t np, np2;
    uint64_t sparse_bytes, dense_bytes;
    float *sparse = run_all(rs, &oc, 0, compress, &np, &sparse_bytes);
    float *dense = run_all(rs, &oc, 1, compress, &np2, &dense_bytes);
    /* The rows went by the all-gather: every replica, every step, sent at
     * most the plan's bound for the table instead of its whole ring share
     * (half the difference is margin for headers and chunk rounding); the
     * same bits alone would hold with the sparse path never taken. */
    dp_ar_sparse_plan plan;
    REQUIRE(dp_model_init(&m, rs->model, rs->batch, 1, &err) == 0);
    dp_ar_sparse_plan_of(&m, rs->replicas, rs->batch, &plan);
    dp_model_free(&m);
    REQUIRE(plan.sparse);
    uint64_t saved = (uint64_t)rs->steps * (uint64_t)rs->replicas *
                     (plan.dense_bytes - plan.sparse_bound) / 2;
    CHECKF(dense_bytes > sparse_bytes && dense_bytes - sparse_bytes >= saved,
           "%s on %d replicas: the sparse run sent %llu bytes, --allreduce-dense %llu: not "
           "%llu fewer, the rows did not go by the all-gather", rs->model, rs->replicas,
           (unsigned long long)sparse_bytes, (unsigned long long)dense_bytes,
           (unsigned long long)saved);
    if (sparse && dense && compress) {
        /* The factors' sums and the table's fold differently cut (the
         * factors' buffer holds the table when it goes whole): the same
         * bits where every sum is of two (a + b = b + a), within float noise
         * beyond; and compressed, not one process's numbers. */
        double worst = 0, off = 0;
        for (size_t i = 0; i < np; i++) {
            worst = fmax(worst, fabs((double)sparse[i] - dense[i]) / (1.0 + fabs((double)dense[i])));
            off = fmax(off, fabs((double)sparse[i] - ref[i]));
        }
        fprintf(stderr, "%s, %d x %d, --compress %s: sparse vs dense %.3g, %llu bytes against "
                "%llu; vs one process uncompressed %.3g\n", rs->model, rs->replicas, rs->batch,
                compress, worst, (unsigned long long)sparse_bytes,
                (unsigned long long)dense_bytes, off);
        CHECKF(rs->replicas == 2 ? worst == 0 : worst < 1e-5,
               "%s on %d replicas, --compress %s: sparse and --allreduce-dense differ by %g",
               rs->model, rs->replicas, compress, worst);
        CHECKF(off > 0, "%s, --compress %s: the same bits as one process uncompressed",
               rs->model, compress);
    } else if (sparse && dense) {
        CHECKF(memcmp(sparse, dense, np * sizeof(float)) == 0,
               "%s on %d replicas: the sparse all-gather ends with other bits than "
               "--allreduce-dense", rs->model, rs->replicas);
        double worst = 0;
        for (size_t i = 0; i < np; i++) {
            double d = fabs((double)sparse[i] - ref[i]) / (1.0 + fabs((double)ref[i]));
            worst = d > worst ? d : worst;
        }
        fprintf(stderr, "%s, %d x %d: sparse = dense bit for bit, %llu bytes against %llu; vs "
                "one process at %d: %.3g\n", rs->model, rs->replicas, rs->batch,
                (unsigned long long)sparse_bytes, (unsigned long long)dense_bytes,
                rs->replicas * rs->batch, worst);
        CHECKF(worst < 1e-5, "%s on %d replicas differs from one process by %g", rs->model,
               rs->replicas, worst);
    }
    free(sparse);
    free(dense);
    free(ref);
    free(data_x);
    free(data_y);
}

static void check_fits(void)
{
    dp_train_config c = dp_train_defaults();
    dp_err err;
    REQUIRE(dp_strategy_select(&c, "allreduce", &err) == 0);
    c.model = "8-emb100000x16-gap-10";
    setenv("DOWNPOUR_REPLICA_MEMORY", "8000000", 1);
    CHECKF(dp_strategy_check(&c, &err) < 0 && strstr(err.msg, "6.1 MiB") &&
               strstr(err.msg, "7.6 MiB") && strstr(err.msg, "DOWNPOUR_REPLICA_MEMORY"),
           "a table that does not fit is not refused naming its size and the memory: %s",
           err.msg);
    setenv("DOWNPOUR_REPLICA_MEMORY", "8MB", 1);
    CHECKF(dp_strategy_check(&c, &err) < 0 && strstr(err.msg, "DOWNPOUR_REPLICA_MEMORY"),
           "a malformed DOWNPOUR_REPLICA_MEMORY is not refused naming it: %s", err.msg);
    setenv("DOWNPOUR_REPLICA_MEMORY", "100000000", 1);
    CHECKF(dp_strategy_check(&c, &err) == 0, "a table that fits is refused: %s", err.msg);
    unsetenv("DOWNPOUR_REPLICA_MEMORY");
    REQUIRE(dp_strategy_select(&c, "ps-async", &err) == 0);
    CHECKF(dp_strategy_set(&c, "allreduce-dense", NULL, &err) < 0,
           "--allreduce-dense under ps-async is not refused");
}

int main(void)
{
    if (getenv("TEST_DEBUG"))
        dp_log_set_level(DP_LOG_DEBUG);
    for (int n = 2; n <= 4; n++)
        for (int disjoint = 0; disjoint <= 1; disjoint++) {
            check_exchange("5-emb37x3-gap-4", n, disjoint, 64);   /* 16-float buckets */
            check_exchange("8-emb1000x16-gap-10", n, disjoint, 16384);
        }
    check_exchange("7-emb101x5-gap-3", 3, 0, 1 << 20); /* one bucket for all */
    check_bad_block();
    /* 23 + 22 records, batch 4: the last step 3 + 2 */
    const run_spec a = {"8-emb1000x16-gap-10", 2, 4, 45, 6};
    /* 7 + 7 + 6 records, batch 3: the last step 1 + 1 + 0 */
    const run_spec b = {"5-emb301x3-gap-4", 3, 3, 20, 3};
    const run_spec c = {"8-emb1000x16-gap-10", 4, 5, 37, 2};
    check_strategy(&a, 1000, NULL);
    check_strategy(&b, 301, NULL);
    check_strategy(&c, 1000, NULL);
    /* --compress powersgd: the dense layer (10 x 16) as rank-2 factors, the
     * table by its rows or whole */
    check_strategy(&a, 1000, "powersgd:2");
    check_strategy(&b, 301, "powersgd:1");
    check_fits();
    return CHECK_DONE();
}
