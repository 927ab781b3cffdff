/* Sparse rows on the parameter servers (docs/strategies.md, "Sparse rows"),
 * on the in-process transport:
 * - the optimiser on rows: lazy Adam and Adagrad equal a naive (double)
 *   implementation on the rows pushed, and every other row and its state
 *   never change, bit for bit; sgd and adagrad on rows give the bits of the
 *   dense update of a gradient that is zero elsewhere; the rows' gradients
 *   laid out as the table or one after another give the same bits;
 * - a worker's client against two ps servers (threads), ps-sync,
 *   ps-async, ps-ssp and ps-dssp, sgd and adagrad: pulling and pushing only the rows a step
 *   touches ends with the parameters of the dense path, bit for bit, with
 *   the rows spread id mod 2 over the shards;
 * - with --ps-replicas 2, and with ps:1 crashed after the first step (its
 *   shard and rows going on on their backup on ps:0), the same bits;
 * - only touched rows move: the bytes a step puts on the wire equal the ids
 *   and rows computed by hand, frame by frame;
 * - a worker that sends a row id out of range, ids not increasing, or a
 *   count larger than the shard's rows is dropped, named, with nothing of
 *   its push applied, and the round goes on with the others;
 * - a checkpoint's rows stream in STATE_ROWS frames of a bounded chunk:
 *   the bytes by hand, and the same state as in one chunk a part; a chunk
 *   that starts elsewhere than the next row, or whose length is not its
 *   count's, fails the pull, naming the shard's task;
 * - every table's rows streamed in pieces that cut rows anywhere (the
 *   chief's --save on rows) are the whole pull's; a pass ended half read
 *   leaves the client whole; in TABLE_ROWS chunks of 2 rows (a shard's 5
 *   rows larger than a chunk) the same bits, the bytes frame by frame by
 *   hand; a chunk repeated, skipped or longer than its count is refused
 *   naming the shard's task, and a PULL_TABLE asking past the shard, more
 *   than a chunk or of another length is refused naming the sender;
 * - a shard's initial rows drawn alone (dp_model_init_rows: what a ps task
 *   holds, docs/strategies.md "Tables larger than a worker") are the whole
 *   model's rows id mod S, bit for bit, from the whole model or a compact
 *   one, an embedding or four bags, 1 to 3 shards; a model without that
 *   many tables is refused. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ps_capture.h"
#include "ps_rig.h"
#include "downpour/frame.h"
#include "downpour/inproc.h"
#include "downpour/log.h"
#include "downpour/model.h"
#include "downpour/optim.h"
#include "downpour/ps.h"
#include "downpour/sparse.h"
#include "downpour/wire.h"

#define ROWS 10
#define WIDTH 3
#define NDENSE 4
#define TAB (ROWS * WIDTH)
#define NP (TAB + NDENSE)

static dp_err err;

/* ------------------------------------------------------------ the optimiser on rows */

static float init_of(int i) { return 0.5f - 0.07f * (float)(i % 13) + 0.01f * (float)i; }
static float grad_of(int step, int i) { return 0.3f * sinf(1.7f * (float)i + (float)step); }

/* The rows each step touches (a different set every step, some never). */
static const uint32_t step_rows[4][4] = {{1, 4, 7, 0}, {4, 5, 0, 0}, {1, 2, 8, 0}, {7, 0, 0, 0}};
static const size_t step_count[4] = {3, 2, 3, 1};

static void optimiser_on_rows(dp_optim_kind kind)
{
    dp_optim_config oc = dp_optim_defaults(kind);
    oc.lr = 0.05f;
    dp_optim o;
    REQUIRE(dp_optim_init(&o, &oc, TAB, &err) == 0);
    float p[TAB];
    double np[TAB], m[TAB], v[TAB], a[TAB];
    for (int i = 0; i < TAB; i++) {
        p[i] = init_of(i);
        np[i] = p[i];
        m[i] = v[i] = 0;
        a[i] = oc.initial_accumulator;
    }
    int slots = dp_optim_slots(kind);
    for (int step = 0; step < 4; step++) {
        float before[TAB], sbefore[2 * TAB], g[TAB] = {0}, rowg[4 * WIDTH];
        memcpy(before, p, sizeof p);
        if (slots)
            memcpy(sbefore, o.state, (size_t)slots * TAB * sizeof(float));
        const uint32_t *rows = step_rows[step];
        size_t n = step_count[step];
        for (size_t r = 0; r < n; r++)
            for (int e = 0; e < WIDTH; e++) {
                int i = (int)rows[r] * WIDTH + e;
                rowg[r * WIDTH + e] = g[i] = grad_of(step, i);
            }
        dp_optim_step st = dp_optim_begin(&o, oc.lr);
        dp_optim_apply_rows(&o, &st, p, rowg, rows, n, WIDTH, 0);
        /* the naive lazy update of the same rows, global t */
        double t = (double)o.t;
        for (size_t r = 0; r < n; r++)
            for (int e = 0; e < WIDTH; e++) {
                int i = (int)rows[r] * WIDTH + e;
                double gi = g[i];
                if (kind == DP_OPTIM_ADAM) {
                    double lr_t = oc.lr * sqrt(1 - pow(oc.beta2, t)) / (1 - pow(oc.beta1, t));
                    m[i] = oc.beta1 * m[i] + (1 - oc.beta1) * gi;
                    v[i] = oc.beta2 * v[i] + (1 - oc.beta2) * gi * gi;
                    np[i] -= lr_t * m[i] / (sqrt(v[i]) + oc.eps);
                } else if (kind == DP_OPTIM_ADAGRAD) {
                    a[i] += gi * gi;
                    np[i] -= oc.lr * gi / (sqrt(a[i]) + oc.eps);
                } else {
                    np[i] -= oc.lr * gi;
                }
            }
        for (int i = 0; i < TAB; i++) {
            int touched = 0;
            for (size_t r = 0; r < n; r++)
                touched |= (uint32_t)(i / WIDTH) == rows[r];
            if (!touched) {
                CHECKF(memcmp(&p[i], &before[i], 4) == 0, "%s: untouched element %d moved",
                       dp_optim_kind_name(kind), i);
                for (int k = 0; k < slots; k++)
                    CHECKF(memcmp(&o.state[k * TAB + i], &sbefore[k * TAB + i], 4) == 0,
                           "%s: the state of untouched element %d moved", dp_optim_kind_name(kind),
                           i);
            }
            CHECKF(fabs(p[i] - np[i]) <= 1e-6 * (1 + fabs(np[i])),
                   "%s step %d: element %d is %.9g, the naive update %.9g",
                   dp_optim_kind_name(kind), step, i, (double)p[i], np[i]);
        }
    }
    dp_optim_free(&o);
}

/* sgd and adagrad on rows: the dense update's bits where the gradient is
 * zero outside them; the table-laid gradient (indexed) gives the same. */
static void rows_equal_dense(dp_optim_kind kind)
{
    dp_optim_config oc = dp_optim_defaults(kind);
    oc.lr = 0.05f;
    dp_optim d, r1, r2;
    REQUIRE(dp_optim_init(&d, &oc, TAB, &err) == 0 && dp_optim_init(&r1, &oc, TAB, &err) == 0 &&
            dp_optim_init(&r2, &oc, TAB, &err) == 0);
    float pd[TAB], p1[TAB], p2[TAB];
    for (int i = 0; i < TAB; i++)
        pd[i] = p1[i] = p2[i] = init_of(i);
    for (int step = 0; step < 4; step++) {
        float g[TAB] = {0}, rowg[4 * WIDTH];
        for (size_t r = 0; r < step_count[step]; r++)
            for (int e = 0; e < WIDTH; e++) {
                int i = (int)step_rows[step][r] * WIDTH + e;
                rowg[r * WIDTH + e] = g[i] = grad_of(step, i);
            }
        dp_optim_apply(&d, pd, g, oc.lr);
        dp_optim_step s1 = dp_optim_begin(&r1, oc.lr), s2 = dp_optim_begin(&r2, oc.lr);
        dp_optim_apply_rows(&r1, &s1, p1, rowg, step_rows[step], step_count[step], WIDTH, 0);
        dp_optim_apply_rows(&r2, &s2, p2, g, step_rows[step], step_count[step], WIDTH, 1);
    }
    CHECKF(memcmp(pd, p1, sizeof pd) == 0 && memcmp(pd, p2, sizeof pd) == 0,
           "%s: rows differ from the dense update", dp_optim_kind_name(kind));
    if (dp_optim_slots(kind))
        CHECKF(memcmp(d.state, r1.state, TAB * 4) == 0, "%s: the rows' state differs",
               dp_optim_kind_name(kind));
    dp_optim_free(&d);
    dp_optim_free(&r1);
    dp_optim_free(&r2);
}

/* ------------------------------------------------------------ client and servers */


static const float *start_params(void)
{
    static float p[NP];
    for (int i = 0; i < NP; i++)
        p[i] = init_of(i);
    return p;
}

static size_t rig_state_chunk; /* the rigs' cfg.state_chunk (0: the default) */

static void rig_open(rig *r, int workers, int sparse, dp_ps_mode mode, const dp_optim_config *oc,
                     int threads, int replicas)
{
    int ports[8];
    const char *names[8];
    memset(r, 0, sizeof *r);
    r->workers = workers;
    r->n = workers + 3;
    r->ps0 = workers + 1;
    for (int i = 0; i < r->n; i++)
        ports[i] = 21000 + i;
    REQUIRE(dp_cluster_local(&r->c, 1, workers, 2, ports, &err) == 0);
    for (int i = 0; i < r->n; i++)
        names[i] = r->c.tasks[i].name;
    REQUIRE(dp_inproc_open_named(r->ts, r->n, names, &err) == 0);
    dp_ps_config_init(&r->cfg);
    r->cfg.mode = mode;
    r->cfg.state_chunk = rig_state_chunk;
    r->cfg.min_shard_bytes = sizeof(float); /* two shards of the dense part */
    r->cfg.replicas = replicas;
    if (sparse) {
        r->cfg.n_tables = 1;
        r->cfg.tables[0] = (dp_ps_table_spec){0, ROWS, WIDTH, ROWS, 0, 0};
    }
    REQUIRE(dp_ps_layout_make_from(&r->layout, &r->c, sparse ? TAB : 0, NP, &r->cfg, &err) == 0);
    REQUIRE(r->layout.n_shards == 2);
    dp_ps_start start = {.params = start_params()};
    for (int k = 0; k < 2; k++) {
        if (dp_ps_server_open(&r->s[k], r->ts[r->ps0 + k], &r->c, &r->layout, &r->cfg, oc, &start,
                              NP, &err) < 0) {
            fprintf(stderr, "dp_ps_server_open: %s\n", err.msg);
            exit(1);
        }
    }
    if (threads)
        rig_serve(r);
}

/* ps task k's thread stops serving, then its process "crashes". */
/* A step's unique rows and gradient: the rows of step_rows, the dense part
 * always. */
static void step_grad(int step, float *g)
{
    memset(g, 0, NP * sizeof(float));
    for (size_t r = 0; r < step_count[step]; r++)
        for (int e = 0; e < WIDTH; e++) {
            int i = (int)step_rows[step][r] * WIDTH + e;
            g[i] = grad_of(step, i);
        }
    for (int i = TAB; i < NP; i++)
        g[i] = grad_of(step, i);
}

/* The bytes of one sparse step, frame by frame (docs/strategies.md,
 * "Sparse rows"): per shard s with u_s of the step's rows and n_s dense
 * floats, PULL_ROWS [u32 count][u_s ids], ROWS u_s * WIDTH floats,
 * PUSH_ROWS [head][n_s floats][u32 count][u_s ids][u_s * WIDTH floats],
 * PARAMS n_s floats; each frame a 48-byte header. */
static void bytes_by_hand(const rig *r, int step, uint64_t *sent, uint64_t *recv)
{
    *sent = *recv = 0;
    for (int s = 0; s < 2; s++) {
        uint64_t u = 0, n = r->layout.range[s].hi - r->layout.range[s].lo;
        for (size_t k = 0; k < step_count[step]; k++)
            u += step_rows[step][k] % 2 == (uint32_t)s;
        *sent += DP_FRAME_HEADER_SIZE + 4 + 4 * u;
        *recv += DP_FRAME_HEADER_SIZE + 4 * u * WIDTH;
        *sent += DP_FRAME_HEADER_SIZE + DP_PUSH_HEAD_SIZE + 4 * n + 4 + u * (4 + 4 * WIDTH);
        *recv += DP_FRAME_HEADER_SIZE + 4 * n;
    }
}

static void sorted_rows(int step, uint32_t *out)
{
    size_t n = step_count[step];
    memcpy(out, step_rows[step], n * sizeof *out);
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && out[j] < out[j - 1]; j--) {
            uint32_t t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
}

/* Four steps of one worker; the chief pulls everything at the end.
 * replicas: 0 one copy of each shard; 1 two; 2 two, ps:1 crashed after
 * the first step. */
static void run_client(dp_ps_mode mode, dp_optim_kind kind, int sparse, int replicas,
                       float *final)
{
    dp_optim_config oc = dp_optim_defaults(kind);
    oc.lr = 0.05f;
    rig r;
    rig_open(&r, 1, sparse, mode, &oc, 1, replicas ? 2 : 1);
    dp_ps_client *w, *chief;
    REQUIRE(dp_ps_client_open(&w, r.ts[1], &r.layout, &r.cfg, &oc, NP, &err) == 0);
    REQUIRE(dp_ps_client_open(&chief, r.ts[0], &r.layout, &r.cfg, &oc, NP, &err) == 0);
    float params[NP], g[NP];
    memcpy(params, start_params(), sizeof params);
    for (int step = 0; step < 4; step++) {
        step_grad(step, g);
        dp_transport_stats a, b;
        REQUIRE(dp_transport_stats_get(r.ts[1], DP_PEER_ANY, &a) == 0);
        if (sparse) {
            uint32_t ids[4];
            sorted_rows(step, ids);
            const uint32_t *idp[1] = {ids};
            long n[1] = {(long)step_count[step]};
            if (dp_ps_client_pull_rows(w, params, idp, n, &err) < 0) {
                fprintf(stderr, "pull rows: %s\n", err.msg);
                exit(1);
            }
            if (dp_ps_client_step(w, params, g, 1, oc.lr, &err) < 0) {
                fprintf(stderr, "step: %s\n", err.msg);
                exit(1);
            }
        } else {
            REQUIRE(dp_ps_client_step(w, params, g, 1, oc.lr, &err) == 0);
        }
        REQUIRE(dp_transport_stats_get(r.ts[1], DP_PEER_ANY, &b) == 0);
        if (replicas == 2 && step == 0)
            crash_ps(&r, 1);
        if (sparse && !replicas) {
            uint64_t sent, recv;
            bytes_by_hand(&r, step, &sent, &recv);
            CHECKF(b.bytes_sent - a.bytes_sent == sent && b.bytes_recv - a.bytes_recv == recv,
                   "step %d moved %llu / %llu bytes; by hand %llu / %llu", step,
                   (unsigned long long)(b.bytes_sent - a.bytes_sent),
                   (unsigned long long)(b.bytes_recv - a.bytes_recv), (unsigned long long)sent,
                   (unsigned long long)recv);
            if (step == 0 && mode == DP_PS_SYNC && kind == DP_OPTIM_SGD)
                printf("sparse step 0 (%zu of %d rows of width %d, %d dense floats): %llu bytes "
                       "sent, %llu received (the dense path: %llu / %llu)\n",
                       step_count[0], ROWS, WIDTH, NDENSE,
                       (unsigned long long)sent, (unsigned long long)recv,
                       (unsigned long long)(2 * (DP_FRAME_HEADER_SIZE + DP_PUSH_HEAD_SIZE) +
                                            4 * NP),
                       (unsigned long long)(2 * DP_FRAME_HEADER_SIZE + 4 * NP));
        }
    }
    if (dp_ps_client_pull(chief, final, 0, &err) < 0) {
        fprintf(stderr, "pull: %s\n", err.msg);
        exit(1);
    }
    /* the worker's pulled rows are the servers' (sync: what the chief sees) */
    dp_ps_client_free(w);
    dp_ps_client_free(chief);
    rig_close(&r, 1);
}

static const char *mode_name(dp_ps_mode mode)
{
    return mode == DP_PS_SYNC ? "sync" : mode == DP_PS_ASYNC ? "async" : mode == DP_PS_SSP ? "ssp"
                                                                                           : "dssp";
}

static void sparse_equals_dense(dp_ps_mode mode, dp_optim_kind kind)
{
    float a[NP], b[NP], c[NP];
    for (int i = 0; i < NP; i++)
        a[i] = b[i] = c[i] = NAN;
    run_client(mode, kind, 1, 0, a);
    run_client(mode, kind, 0, 0, b);
    CHECKF(memcmp(a, b, sizeof a) == 0, "%s %s: sparse rows end elsewhere than the dense path",
           mode_name(mode), dp_optim_kind_name(kind));
    for (int replicas = 1; replicas <= 2; replicas++) {
        run_client(mode, kind, 1, replicas, c);
        CHECKF(memcmp(a, c, sizeof a) == 0, "%s %s: sparse rows with replicas%s end elsewhere",
               mode_name(mode), dp_optim_kind_name(kind),
               replicas == 2 ? " and ps:1 crashed" : "");
    }
    /* rows never touched are the initial ones */
    const float *p0 = start_params();
    CHECK(memcmp(a + 3 * WIDTH, p0 + 3 * WIDTH, WIDTH * 4) == 0 &&
          memcmp(a + 9 * WIDTH, p0 + 9 * WIDTH, WIDTH * 4) == 0);
    CHECK(memcmp(a + 1 * WIDTH, p0 + 1 * WIDTH, WIDTH * 4) != 0);
}

/* ------------------------------------------------------------ a checkpoint's rows */

/* Two adagrad steps of one worker on rows, then the chief's pull of the
 * training state with STATE_ROWS frames of `chunk` bytes of rows; the
 * bytes the chief received for it. */
static uint64_t state_of(size_t chunk, float *params, float *slots)
{
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_ADAGRAD);
    oc.lr = 0.05f;
    rig r;
    rig_state_chunk = chunk;
    rig_open(&r, 1, 1, DP_PS_SYNC, &oc, 1, 1);
    rig_state_chunk = 0;
    dp_ps_client *w, *chief;
    REQUIRE(dp_ps_client_open(&w, r.ts[1], &r.layout, &r.cfg, &oc, NP, &err) == 0);
    REQUIRE(dp_ps_client_open(&chief, r.ts[0], &r.layout, &r.cfg, &oc, NP, &err) == 0);
    float p[NP], g[NP];
    memcpy(p, start_params(), sizeof p);
    for (int step = 0; step < 2; step++) {
        uint32_t ids[4];
        sorted_rows(step, ids);
        const uint32_t *idp[1] = {ids};
        long n[1] = {(long)step_count[step]};
        step_grad(step, g);
        REQUIRE(dp_ps_client_pull_rows(w, p, idp, n, &err) == 0);
        REQUIRE(dp_ps_client_step(w, p, g, 1, oc.lr, &err) == 0);
    }
    dp_transport_stats a, b;
    long t = -1;
    REQUIRE(dp_transport_stats_get(r.ts[0], DP_PEER_ANY, &a) == 0);
    if (dp_ps_client_pull_state(chief, 7, &oc, params, slots, NULL, &t, &err) < 0) {
        fprintf(stderr, "pull state: %s\n", err.msg);
        exit(1);
    }
    REQUIRE(dp_transport_stats_get(r.ts[0], DP_PEER_ANY, &b) == 0);
    CHECK(t == 2);
    dp_ps_client_free(w);
    dp_ps_client_free(chief);
    rig_close(&r, 1);
    return b.bytes_recv - a.bytes_recv;
}

/* A checkpoint's rows in chunks (docs/strategies.md, "Evaluation and
 * checkpoints"): with chunks of 2 rows each shard's 5 rows and their
 * accumulators come in 2 x 3 STATE_ROWS frames, the bytes by hand, and the
 * state is the one that came in one chunk a part, bit for bit. */
static void state_in_chunks(void)
{
    float p1[NP], s1[NP], p2[NP], s2[NP];
    uint64_t whole = state_of(0, p1, s1), chunked = state_of(2 * WIDTH * sizeof(float), p2, s2);
    CHECK(memcmp(p1, p2, sizeof p1) == 0 && memcmp(s1, s2, sizeof s1) == 0);
    CHECK(memcmp(p1, start_params(), TAB * sizeof(float)) != 0); /* the steps moved rows */
    uint64_t by_hand[2] = {0, 0}, rows = ROWS / 2; /* each shard's rows */
    /* per shard: a STATE of [u64 t][u64 updates] and its dense slice and
     * slot (added below), then per part (the rows, the accumulators) its
     * chunks, each [4 x u32] and its rows */
    for (int c = 0; c < 2; c++)
        for (int sh = 0; sh < 2; sh++) {
            uint64_t frames = c ? (rows + 1) / 2 : 1;
            by_hand[c] += DP_FRAME_HEADER_SIZE + 16 +
                          2 * (frames * (DP_FRAME_HEADER_SIZE + 16) + rows * WIDTH * 4);
        }
    uint64_t dense = 2 * 4 * (uint64_t)NDENSE; /* both shards' dense slices and slots */
    CHECKF(whole == by_hand[0] + dense && chunked == by_hand[1] + dense,
           "the chief received %llu and %llu bytes of state; by hand %llu and %llu",
           (unsigned long long)whole, (unsigned long long)chunked,
           (unsigned long long)(by_hand[0] + dense), (unsigned long long)(by_hand[1] + dense));
    printf("a checkpoint's rows in chunks of 2 rows: %llu bytes to the chief (one chunk a part: "
           "%llu), the same state bit for bit\n", (unsigned long long)chunked,
           (unsigned long long)whole);
}

/* Every table's rows streamed (a chief on rows writing a file): pieces of
 * 4 floats, rows of 3 cut anywhere, give the table the chief's whole pull
 * gives, and pieces of 5 of part 1 the accumulators its state pull gives; a
 * pass left half read and ended leaves the client whole (a pull after it,
 * and a second pass, read the same); pieces past the table or out of order
 * are refused.  With `chunk` bytes of rows a TABLE_ROWS frame (0: the
 * default, 4 MiB: one frame a shard), the whole pull's bytes are counted
 * frame by frame against the hand's: per shard a PULL and its PARAMS, then
 * per chunk of at most `chunk` bytes of its 5 rows a PULL_TABLE of 16 bytes
 * and a TABLE_ROWS of 16 bytes and its rows.  The table pulled goes to
 * out. */
static void tables_streamed(size_t chunk, float *out)
{
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_ADAGRAD);
    oc.lr = 0.05f;
    rig r;
    rig_state_chunk = chunk;
    rig_open(&r, 1, 1, DP_PS_SYNC, &oc, 1, 1);
    rig_state_chunk = 0;
    dp_ps_client *w, *chief;
    REQUIRE(dp_ps_client_open(&w, r.ts[1], &r.layout, &r.cfg, &oc, NP, &err) == 0);
    REQUIRE(dp_ps_client_open(&chief, r.ts[0], &r.layout, &r.cfg, &oc, NP, &err) == 0);
    float p[NP], g[NP], whole[NP], streamed[TAB];
    memcpy(p, start_params(), sizeof p);
    for (int step = 0; step < 2; step++) {
        uint32_t ids[4];
        sorted_rows(step, ids);
        const uint32_t *idp[1] = {ids};
        long n[1] = {(long)step_count[step]};
        step_grad(step, g);
        REQUIRE(dp_ps_client_pull_rows(w, p, idp, n, &err) == 0);
        REQUIRE(dp_ps_client_step(w, p, g, 1, oc.lr, &err) == 0);
    }
    dp_transport_stats a, b;
    REQUIRE(dp_transport_stats_get(r.ts[0], DP_PEER_ANY, &a) == 0);
    REQUIRE(dp_ps_client_pull(chief, whole, 0, &err) == 0);
    REQUIRE(dp_transport_stats_get(r.ts[0], DP_PEER_ANY, &b) == 0);
    uint64_t per = chunk ? chunk / (WIDTH * 4) : ROWS, rows = ROWS / 2, hs = 0, hr = 0;
    for (int sh = 0; sh < 2; sh++) {
        uint64_t frames = (rows + per - 1) / per;
        hs += DP_FRAME_HEADER_SIZE + frames * (DP_FRAME_HEADER_SIZE + 16);
        hr += DP_FRAME_HEADER_SIZE + 4 * (r.layout.range[sh].hi - r.layout.range[sh].lo) +
              frames * (DP_FRAME_HEADER_SIZE + 16) + rows * WIDTH * 4;
    }
    CHECKF(b.bytes_sent - a.bytes_sent == hs && b.bytes_recv - a.bytes_recv == hr,
           "chunks of %zu bytes: the whole pull sent %llu and received %llu bytes; by hand %llu "
           "and %llu", chunk, (unsigned long long)(b.bytes_sent - a.bytes_sent),
           (unsigned long long)(b.bytes_recv - a.bytes_recv), (unsigned long long)hs,
           (unsigned long long)hr);
    /* part 1, the accumulators' rows, against the checkpoint's state */
    float sp[NP], ss[NP], acc[TAB];
    long t = 0;
    REQUIRE(dp_ps_client_pull_state(chief, 9, &oc, sp, ss, NULL, &t, &err) == 0);
    for (size_t at = 0; at < TAB; at += 5) {
        size_t n = TAB - at < 5 ? TAB - at : 5;
        REQUIRE(dp_ps_client_tables_read(chief, 1, 0, acc + at, n, &err) == 0);
    }
    CHECK(memcmp(acc, ss, sizeof acc) == 0 && memcmp(sp, whole, sizeof acc) == 0);
    for (int pass = 0; pass < 2; pass++) {
        memset(streamed, 0, sizeof streamed);
        for (size_t at = 0; at < TAB; at += 4) {
            size_t n = TAB - at < 4 ? TAB - at : 4;
            if (dp_ps_client_tables_read(chief, 0, 0, streamed + at, n, &err) < 0) {
                fprintf(stderr, "tables read: %s\n", err.msg);
                exit(1);
            }
        }
        CHECK(memcmp(streamed, whole, sizeof streamed) == 0);
        CHECK(memcmp(whole, start_params(), sizeof streamed) != 0); /* the steps moved rows */
    }
    /* half a pass, ended: the rest skipped */
    REQUIRE(dp_ps_client_tables_read(chief, 0, 0, streamed, 7, &err) == 0);
    CHECK(dp_ps_client_tables_read(chief, 0, 1, streamed, 1, &err) < 0 &&
          strstr(err.msg, "out of order"));
    CHECK(dp_ps_client_tables_read(chief, 0, 0, streamed, TAB, &err) < 0 &&
          strstr(err.msg, "are left"));
    REQUIRE(dp_ps_client_tables_end(chief, &err) == 0);
    float again[NP];
    REQUIRE(dp_ps_client_pull(chief, again, 0, &err) == 0);
    CHECK(memcmp(again, whole, sizeof again) == 0);
    memcpy(out, whole, TAB * sizeof(float));
    dp_ps_client_free(w);
    dp_ps_client_free(chief);
    rig_close(&r, 1);
    printf("a table streamed in pieces of 4 and 5 floats (rows of 3), chunks of %zu bytes: the "
           "whole pull's rows (%llu bytes received) and accumulators\n", chunk,
           (unsigned long long)(b.bytes_recv - a.bytes_recv));
}

/* A shard's 5 rows in TABLE_ROWS chunks of 2 rows (a table larger than a
 * chunk) end where one chunk a shard ends, bit for bit. */
static void tables_in_chunks(void)
{
    float one[TAB], chunked[TAB];
    tables_streamed(0, one);
    tables_streamed(2 * WIDTH * sizeof(float), chunked);
    CHECK(memcmp(one, chunked, sizeof one) == 0);
}

/* A pass over the tables in chunks of 2 rows that a fake shard 0 answers:
 * the first chunk as asked, the second with its head's first row moved by
 * `shift` (-2: the first chunk again; 1: one skipped) or `extra` floats
 * more than its count: refused, naming ps:0 (then the fake is gone, so a
 * client that took the chunk fails otherwise, at once). */
typedef struct table_pass {
    dp_ps_client *chief;
    float rows[TAB];
    int rc;
    dp_err err;
} table_pass;

static void *table_pass_thread(void *arg)
{
    table_pass *p = arg;
    p->rc = dp_ps_client_tables_read(p->chief, 0, 0, p->rows, TAB, &p->err);
    return NULL;
}

static void bad_table_rows(int shift, int extra, const char *want)
{
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_SGD);
    table_pass p = {0};
    rig r;
    rig_state_chunk = 2 * WIDTH * sizeof(float);
    rig_open(&r, 1, 1, DP_PS_SYNC, &oc, 0, 1); /* no server polls: this is shard 0 */
    rig_state_chunk = 0;
    REQUIRE(dp_ps_client_open(&p.chief, r.ts[0], &r.layout, &r.cfg, &oc, NP, &err) == 0);
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, table_pass_thread, &p) == 0);
    dp_transport *ps = r.ts[r.ps0];
    uint64_t lo = r.layout.range[0].lo;
    float zeros[3 * WIDTH] = {0};
    for (int c = 0; c < 2; c++) {
        dp_event ev;
        uint8_t ask[16];
        REQUIRE(dp_transport_recv(ps, 0, "a chunk's request", 5, &ev, &err) == 0 &&
                ev.header.type == DP_WIRE_PULL_TABLE && ev.header.length == 16);
        REQUIRE(dp_transport_recv_payload(ps, 0, ask, 16, &err) == 0);
        CHECK(dp_get_u32(ask) == 0 && dp_get_u32(ask + 4) == 0 &&
              dp_get_u32(ask + 8) == (uint32_t)(2 * c) && dp_get_u32(ask + 12) == 2);
        if (c == 1)
            dp_put_u32(ask + 8, (uint32_t)(2 * c + shift));
        struct iovec iov[2] = {{ask, 16}, {zeros, (2 * WIDTH + (size_t)(c ? extra : 0)) * 4}};
        REQUIRE(dp_transport_sendv(ps, 0, DP_WIRE_TABLE_ROWS, 0, lo, iov, 2, &err) == 0);
    }
    /* then it is gone: a client that took the bad chunk fails at its next ask */
    REQUIRE(dp_inproc_kill(ps, DP_INPROC_CRASH, &err) == 0);
    pthread_join(th, NULL);
    CHECKF(p.rc < 0 && strstr(p.err.msg, "ps:0") && strstr(p.err.msg, want),
           "a bad chunk (its first row moved by %d, %d floats more): %s", shift, extra,
           p.rc < 0 ? p.err.msg : "accepted");
    dp_ps_client_free(p.chief);
    rig_close(&r, 0);
}

/* A PULL_TABLE asking what the shard does not hold, or more than a chunk,
 * or of another length, is refused, naming the sender. */
static void bad_table_asks(void)
{
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_ADAGRAD);
    rig r;
    rig_state_chunk = 2 * WIDTH * sizeof(float);
    rig_open(&r, 1, 1, DP_PS_SYNC, &oc, 0, 1);
    rig_state_chunk = 0;
    static const uint32_t asks[][4] = {
        {1, 0, 0, 1}, /* no table 1 */
        {0, 2, 0, 1}, /* adagrad has one slot: parts 0 and 1 */
        {0, 0, 0, 0}, /* no row */
        {0, 0, 0, 3}, /* more than a chunk of 2 rows */
        {0, 0, 4, 2}, /* past the shard's 5 rows */
        {0, 0, 0xffffffffu, 2},
    };
    static const char *const why[] = {"sparse table 1", "part 2", "[0, +0)", "[0, +3)",
                                      "[4, +2)", "[4294967295, +2)"};
    uint64_t lo = r.layout.range[0].lo;
    for (size_t i = 0; i <= sizeof asks / sizeof asks[0]; i++) {
        uint8_t b[20];
        for (int j = 0; j < 4; j++)
            dp_put_u32(b + 4 * j, i < sizeof asks / sizeof asks[0] ? asks[i][j] : 0);
        size_t len = i < sizeof asks / sizeof asks[0] ? 16 : 20; /* the last: 20 bytes */
        REQUIRE(dp_transport_send(r.ts[0], r.ps0, DP_WIRE_PULL_TABLE, 0, lo, b, len, &err) == 0);
        int rc = dp_ps_server_poll(r.s[0], 1, &err);
        const char *w = i < sizeof asks / sizeof asks[0] ? why[i] : "a PULL_TABLE of 20 bytes";
        CHECKF(rc < 0 && strstr(err.msg, "chief:0") && strstr(err.msg, w),
               "PULL_TABLE %zu: %d, %s (expected \"%s\")", i, rc, rc < 0 ? err.msg : "answered",
               w);
    }
    rig_close(&r, 0);
}

/* The chief's pull of a state that a fake shard 0 answers: its one chunk
 * of rows claims to start at local row `first`, or carries `extra` floats
 * more than its count says. */
typedef struct state_pull {
    dp_ps_client *chief;
    dp_optim_config oc;
    float params[NP];
    int rc;
    dp_err err;
} state_pull;

static void *pull_state_thread(void *arg)
{
    state_pull *p = arg;
    long t;
    p->rc = dp_ps_client_pull_state(p->chief, 3, &p->oc, p->params, NULL, NULL, &t, &p->err);
    return NULL;
}

static void bad_state_rows(uint32_t first, int extra, const char *want)
{
    state_pull p = {.oc = dp_optim_defaults(DP_OPTIM_SGD)};
    rig r;
    rig_open(&r, 1, 1, DP_PS_SYNC, &p.oc, 0, 1); /* no server polls: this is shard 0 */
    REQUIRE(dp_ps_client_open(&p.chief, r.ts[0], &r.layout, &r.cfg, &p.oc, NP, &err) == 0);
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, pull_state_thread, &p) == 0);
    dp_transport *ps = r.ts[r.ps0];
    dp_event ev;
    REQUIRE(dp_transport_recv(ps, 0, "the state request", 5, &ev, &err) == 0 &&
            ev.header.type == DP_WIRE_STATE_REQ);
    REQUIRE(dp_transport_skip_payload(ps, 0, &err) == 0);
    size_t lo = r.layout.range[0].lo, n = r.layout.range[0].hi - lo;
    float zeros[NP + 8] = {0};
    uint8_t head[16] = {0}, h[16];
    struct iovec st[2] = {{head, 16}, {zeros, n * 4}};
    REQUIRE(dp_transport_sendv(ps, 0, DP_WIRE_STATE, 3, lo, st, 2, &err) == 0);
    dp_put_u32(h, 0);
    dp_put_u32(h + 4, 0);
    dp_put_u32(h + 8, first);
    dp_put_u32(h + 12, ROWS / 2);
    struct iovec c[2] = {{h, 16}, {zeros, (ROWS / 2 * WIDTH + (size_t)extra) * 4}};
    REQUIRE(dp_transport_sendv(ps, 0, DP_WIRE_STATE_ROWS, 3, lo, c, 2, &err) == 0);
    pthread_join(th, NULL);
    CHECKF(p.rc < 0 && strstr(p.err.msg, "ps:0") && strstr(p.err.msg, want),
           "a bad chunk (first %u, %d floats more): %s", first, extra,
           p.rc < 0 ? p.err.msg : "accepted");
    dp_ps_client_free(p.chief);
    rig_close(&r, 0);
}

/* ------------------------------------------------------------ bad ids */

static char captured[8192];

static int poll_captured(dp_ps_server *s)
{
    return ps_poll_captured(s, captured, sizeof captured, &err);
}

/* Worker w (rank 1 + w) pushes to ps:0 (shard 0: even ids) a head, shard
 * 0's dense floats and the section given. */
static void raw_push(rig *r, int w, const uint8_t *sec, size_t len)
{
    size_t n = r->layout.range[0].hi - r->layout.range[0].lo;
    float dense[NDENSE];
    for (int i = 0; i < NDENSE; i++)
        dense[i] = 0.25f;
    uint8_t head[DP_PUSH_HEAD_SIZE];
    dp_push_head h = {1, 1, 1.0f, 0};
    dp_push_head_put(head, &h);
    struct iovec iov[3] = {{head, sizeof head}, {dense, n * 4}, {(void *)sec, len}};
    REQUIRE(dp_transport_sendv(r->ts[1 + w], r->ps0, DP_WIRE_PUSH_ROWS, 0, r->layout.range[0].lo,
                               iov, 3, &err) == 0);
}

static size_t section(uint8_t *p, uint32_t count, const uint32_t *ids, size_t n_ids)
{
    size_t k = 0;
    dp_put_u32(p, count);
    k += 4;
    for (size_t i = 0; i < n_ids; i++, k += 4)
        dp_put_u32(p + k, ids[i]);
    for (size_t i = 0; i < n_ids * WIDTH; i++, k += 4)
        dp_put_f32(p + k, 1.0f);
    return k;
}

static int has_reply(rig *r, int w)
{
    dp_event ev;
    REQUIRE(dp_transport_poll(r->ts[1 + w], r->ps0, 0, &ev, &err) == 0);
    if (ev.kind == DP_EVENT_TIMEOUT)
        return 0;
    REQUIRE(dp_transport_skip_payload(r->ts[1 + w], r->ps0, &err) == 0);
    return ev.kind == DP_EVENT_FRAME && ev.header.type == DP_WIRE_PARAMS;
}

static void bad_ids_refused(void)
{
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_SGD);
    oc.lr = 1;
    rig r;
    rig_open(&r, 4, 1, DP_PS_SYNC, &oc, 0, 1);
    uint8_t sec[256];
    /* worker 0: id 10 of a table of 10 rows */
    uint32_t out_of_range[2] = {2, 10};
    raw_push(&r, 0, sec, section(sec, 2, out_of_range, 2));
    CHECK(poll_captured(r.s[0]) == 0);
    CHECKF(strstr(captured, "dropping worker:0") && strstr(captured, "row id 10"),
           "an id out of range: %s", captured);
    /* worker 1: the same id twice */
    uint32_t twice[2] = {4, 4};
    raw_push(&r, 1, sec, section(sec, 2, twice, 2));
    CHECK(poll_captured(r.s[0]) == 0);
    CHECKF(strstr(captured, "dropping worker:1") && strstr(captured, "strictly increasing"),
           "ids not increasing: %s", captured);
    /* worker 2: an odd id, which shard 1 holds */
    uint32_t odd[1] = {3};
    raw_push(&r, 2, sec, section(sec, 1, odd, 1));
    CHECK(poll_captured(r.s[0]) == 0);
    CHECKF(strstr(captured, "dropping worker:2") && strstr(captured, "id mod 2 = 0"),
           "an id of the other shard: %s", captured);
    /* worker 3: a count far beyond the shard's 5 rows, refused before any read */
    raw_push(&r, 3, sec, section(sec, 0xFFFFFFFFu, NULL, 0));
    CHECK(poll_captured(r.s[0]) == 0);
    CHECKF(strstr(captured, "dropping worker:3") && strstr(captured, "4294967295 rows"),
           "a huge count: %s", captured);
    /* every worker is dropped: nothing was applied, nobody answered */
    CHECK(dp_ps_server_updates(r.s[0]) == 0);
    for (int w = 0; w < 4; w++)
        CHECK(!has_reply(&r, w));
    rig_close(&r, 0);

    /* a good push beside a bad one: the round goes on without the bad one */
    rig_open(&r, 2, 1, DP_PS_SYNC, &oc, 0, 1);
    raw_push(&r, 0, sec, section(sec, 2, out_of_range, 2));
    CHECK(poll_captured(r.s[0]) == 0);
    uint32_t good[2] = {2, 8};
    raw_push(&r, 1, sec, section(sec, 2, good, 2));
    CHECK(poll_captured(r.s[0]) == 0);
    CHECK(dp_ps_server_updates(r.s[0]) == 1);
    CHECK(has_reply(&r, 1) && !has_reply(&r, 0));
    rig_close(&r, 0);
}

/* Each shard's rows drawn alone equal the whole model's, bit for bit. */
static void rows_drawn_alone(const char *spec)
{
    dp_model whole, compact;
    dp_err e;
    REQUIRE(dp_model_init(&whole, spec, 20, 1, &e) == 0);
    REQUIRE(dp_model_init_compact(&compact, spec, 20, 1, &e) == 1);
    dp_model_init_params(&whole, 7);
    dp_sparse_table t[DP_SPARSE_MAX];
    int n = dp_model_sparse_tables(&whole, t, DP_SPARSE_MAX);
    REQUIRE(n >= 1 && n <= 4);
    for (int S = 1; S <= 3; S++)
        for (int sh = 0; sh < S; sh++)
            for (int c = 0; c < 2; c++) {
                float *dst[4];
                for (int k = 0; k < n; k++)
                    REQUIRE((dst[k] = calloc((size_t)t[k].rows * t[k].width, sizeof(float))));
                CHECK(dp_model_init_rows(c ? &compact : &whole, 7, sh, S, dst, n) == 0);
                long bad = 0;
                for (int k = 0; k < n; k++) {
                    size_t w = (size_t)t[k].width;
                    for (long id = sh, j = 0; id < t[k].rows; id += S, j++)
                        bad += memcmp(dst[k] + (size_t)j * w,
                                      whole.params + t[k].off + (size_t)id * w,
                                      w * sizeof(float)) != 0;
                    free(dst[k]);
                }
                CHECKF(bad == 0, "%s, %s model, shard %d of %d: %ld row(s) differ from the whole "
                                 "model's", spec, c ? "compact" : "whole", sh, S, bad);
            }
    float *dst[5];
    for (int k = 0; k <= n; k++)
        REQUIRE((dst[k] = malloc((size_t)t[k < n ? k : 0].rows * t[k < n ? k : 0].width *
                                 sizeof(float))));
    CHECK(dp_model_init_rows(&whole, 7, 0, 1, dst, n + 1) < 0); /* more tables than it has */
    CHECK(dp_model_init_rows(&whole, 7, 2, 2, dst, n) < 0);     /* no shard 2 of 2 */
    for (int k = 0; k <= n; k++)
        free(dst[k]);
    dp_model_free(&whole);
    dp_model_free(&compact);
}

int main(void)
{
    dp_log_set_level(DP_LOG_WARN);
    optimiser_on_rows(DP_OPTIM_ADAM);
    optimiser_on_rows(DP_OPTIM_ADAGRAD);
    optimiser_on_rows(DP_OPTIM_SGD);
    rows_equal_dense(DP_OPTIM_SGD);
    rows_equal_dense(DP_OPTIM_ADAGRAD);
    sparse_equals_dense(DP_PS_SYNC, DP_OPTIM_SGD);
    sparse_equals_dense(DP_PS_SYNC, DP_OPTIM_ADAGRAD);
    sparse_equals_dense(DP_PS_ASYNC, DP_OPTIM_SGD);
    sparse_equals_dense(DP_PS_ASYNC, DP_OPTIM_ADAGRAD);
    sparse_equals_dense(DP_PS_SSP, DP_OPTIM_ADAGRAD);
    sparse_equals_dense(DP_PS_DSSP, DP_OPTIM_SGD);
    bad_ids_refused();
    state_in_chunks();
    tables_in_chunks();
    bad_table_rows(-2, 0, "(a chunk missing, repeated or out of order)");
    bad_table_rows(1, 0, "sent rows [3, +2) of sparse table 0, part 0; expected rows [2, +2)");
    bad_table_rows(0, 1, "expected TABLE_ROWS of 40 bytes");
    bad_table_asks();
    bad_state_rows(1, 0, "sent rows [1, +5) of part 0 of sparse table 0; expected [0, +5)");
    bad_state_rows(0, 1, "expected STATE_ROWS of 5 rows of sparse table 0");
    rows_drawn_alone("8-emb1000x16-gap-10");
    rows_drawn_alone("8-bag201x4-bag203x4-bag202x4-bag200x4m3mean-res(dense8-relu-dense1|dense1)"
                     "-bce");
    CHECK_DONE();
}
