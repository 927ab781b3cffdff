/* The device executor (dmodel.c) through the sim backend against the CPU
 * engine: whole training steps for every optimiser on mlp-300-100, 784-128-10
 * and models with dropout equal dp_model_forward_backward + dp_optim_apply
 * (DOWNPOUR_EXACT_ADAM=1, the device's IEEE arithmetic) over several steps
 * including a short batch; dp_dmodel_grads equals the CPU gradients; a
 * replayed graph gives the bits of DOWNPOUR_DEVICE_GRAPH=0; nothing
 * allocates device memory in a step; a replayed dropout model draws the
 * CPU's masks; the host copies round-trip; collect's
 * tallies equal the CPU's; models with lcn and with residual blocks train
 * as on the CPU; a split of
 * float records gathers as it is; --ema's
 * average kept on the device follows the host's formula; and
 * the errors name what failed.  Each parity
 * check prints its measured maximum error beside its bound. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "random_split.h"
#include "device/device_impl.h"
#include "device/sim.h"
#include "downpour/dataset.h"
#include "downpour/device.h"
#include "downpour/model.h"
#include "downpour/optim.h"
#include "downpour/rng.h"
#include "downpour/testhooks.h"
#include "downpour/stream.h"
#include "nn/conv_direct.h"

#define RECORDS 600
#define DIM 784

static dp_device *dev;
static dp_split split;
static dp_rng rng;

static void make_split(void)
{
    static uint8_t images[RECORDS * DIM], labels[RECORDS];
    split = random_split(images, labels, RECORDS, DIM, &rng);
}

static void pick(uint32_t *idx, int n)
{
    for (int i = 0; i < n; i++)
        idx[i] = dp_rng_below(&rng, RECORDS);
}

/* max |a - b| / (|b| + floor) */
static double max_rel(const float *a, const float *b, size_t n, double floor)
{
    double e = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]) / (fabs((double)b[i]) + floor);
        if (!(d <= e))
            e = isnan(d) ? INFINITY : d;
    }
    return e;
}

static void report(const char *what, double err, double bound)
{
    printf("  %-56s max error %.3g (bound %.3g)\n", what, err, bound);
    CHECKF(err <= bound, "%s: max error %.3g > bound %.3g", what, err, bound);
}

static void model_init(dp_model *m, const char *spec, int batch)
{
    dp_err err;
    if (dp_model_init(m, spec, batch, 1, &err) < 0) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    dp_model_init_params(m, 7);
}

static dp_dmodel *dopen(const dp_model *m, const dp_optim_config *oc)
{
    dp_dmodel *g;
    dp_err err;
    if (dp_dmodel_open(&g, dev, m, oc, &err) < 0) {
        fprintf(stderr, "dp_dmodel_open: %s\n", err.msg);
        exit(1);
    }
    REQUIRE(dp_dmodel_load_split(g, &split, &err) == 0);
    return g;
}

/* STEPS steps of `batch` records (the last one short) on the device and on
 * the CPU; parameters, optimiser state and tallies compared after each. */
#define STEPS 6
static void parity(const char *spec, dp_optim_kind kind, int batch, double bound)
{
    dp_model m;
    model_init(&m, spec, batch);
    dp_optim_config cfg = dp_optim_defaults(kind);
    if (kind == DP_OPTIM_SGD || kind == DP_OPTIM_ADAGRAD)
        cfg.lr = 0.05f; /* steps that move the weights visibly */
    dp_optim o;
    dp_err err;
    REQUIRE(dp_optim_init(&o, &cfg, m.n_params, &err) == 0);
    dp_dmodel *g = dopen(&m, &cfg);
    int slots = dp_optim_slots(kind);
    float *p = malloc(m.n_params * sizeof(float));
    float *s = malloc((slots ? slots : 1) * m.n_params * sizeof(float));
    float *x = malloc((size_t)batch * DIM * sizeof(float));
    uint8_t *y = malloc((size_t)batch);
    uint32_t idx[256];
    double ep = 0, es = 0, cpu_loss = 0, dev_loss = 0;
    long cpu_correct = 0, dev_correct = 0;
    for (int step = 0; step < STEPS; step++) {
        int n = step == STEPS - 1 ? batch - 5 : batch;
        float lr = cfg.lr * (1.0f - 0.1f * step); /* a schedule: lr comes per step */
        pick(idx, n);
        REQUIRE(dp_dmodel_stage(g, idx, n, &err) == 0);
        REQUIRE(dp_dmodel_step(g, lr, &err) == 0);
        dp_split_gather(x, y, &split, idx, n);
        int correct = 0;
        cpu_loss += (double)dp_model_forward_backward(&m, x, y, n, &correct) * n;
        cpu_correct += correct;
        dp_optim_apply(&o, m.params, m.grads, lr);
        REQUIRE(dp_dmodel_get_params(g, p, &err) == 0);
        double e = max_rel(p, m.params, m.n_params, 1e-2);
        ep = e > ep ? e : ep;
        long t = -1;
        REQUIRE(dp_dmodel_get_optim(g, s, &t, &err) == 0);
        CHECK(t == o.t);
        if (slots) {
            e = max_rel(s, o.state, slots * m.n_params, 1e-2);
            es = e > es ? e : es;
        }
    }
    REQUIRE(dp_dmodel_collect(g, &dev_loss, &dev_correct, &err) == 0);
    CHECKF(dev_correct == cpu_correct, "%s %s: %ld correct, CPU %ld", spec,
           dp_optim_kind_name(kind), dev_correct, cpu_correct);
    char what[128];
    snprintf(what, sizeof what, "%s %s: params, state (%d steps)", spec,
             dp_optim_kind_name(kind), STEPS);
    report(what, ep > es ? ep : es, bound);
    snprintf(what, sizeof what, "%s %s: collect's loss sum", spec, dp_optim_kind_name(kind));
    report(what, fabs(dev_loss - cpu_loss) / cpu_loss, 1e-6);
    /* collect zeroed the tallies */
    dev_loss = 0, dev_correct = 0;
    REQUIRE(dp_dmodel_collect(g, &dev_loss, &dev_correct, &err) == 0);
    CHECK(dev_loss == 0.0 && dev_correct == 0);
    dp_dmodel_close(g);
    dp_optim_free(&o);
    dp_model_free(&m);
    free(p), free(s), free(x), free(y);
}

/* dp_dmodel_grads overwrites the device gradients with the CPU's. */
static void test_grads(const char *spec, double bound)
{
    int batch = 50;
    dp_model m;
    model_init(&m, spec, batch);
    dp_dmodel *g = dopen(&m, NULL);
    dp_err err;
    uint32_t idx[64];
    float *x = malloc((size_t)batch * DIM * sizeof(float)), *gr = malloc(m.n_params * sizeof(float));
    uint8_t y[64];
    for (size_t i = 0; i < m.n_params; i++) /* stale values the call must overwrite */
        gr[i] = 1e3f;
    REQUIRE(dp_dmodel_set_grads(g, gr, &err) == 0);
    pick(idx, batch);
    REQUIRE(dp_dmodel_stage(g, idx, batch, &err) == 0);
    REQUIRE(dp_dmodel_grads(g, &err) == 0);
    REQUIRE(dp_dmodel_get_grads(g, gr, &err) == 0);
    dp_split_gather(x, y, &split, idx, batch);
    dp_model_forward_backward(&m, x, y, batch, NULL);
    float gmax = 0;
    for (size_t i = 0; i < m.n_params; i++)
        gmax = fabsf(m.grads[i]) > gmax ? fabsf(m.grads[i]) : gmax;
    char what[128];
    snprintf(what, sizeof what, "%s: dp_dmodel_grads (floor max|g|/100)", spec);
    report(what, max_rel(gr, m.grads, m.n_params, gmax * 1e-2), bound);
    /* no optimiser: updates are refused */
    CHECK(dp_dmodel_update(g, 0.1f, 1.0f, &err) == -1 && strstr(err.msg, "without an optimiser"));
    dp_dmodel_close(g);
    dp_model_free(&m);
    free(x), free(gr);
}

/* A split of float records (dp_split.values) on the device: the gathered
 * batch is the records as they are, as dp_split_gather gives on the CPU, so
 * the gradients and a few whole steps (graph captured) agree with the CPU's;
 * loading the byte split again switches back to pixels / 255. */
static void test_float_split(void)
{
    enum { BATCH = 40 };
    static float values[RECORDS * DIM];
    for (size_t i = 0; i < sizeof values / sizeof *values; i++) /* not a byte / 255 */
        values[i] = 4.0f * dp_rng_uniform(&rng) - 2.0f;
    dp_split fs = {.values = values, .labels = split.labels, .n = RECORDS, .dim = DIM};
    dp_model m;
    model_init(&m, "784-128-10", BATCH);
    dp_optim_config cfg = dp_optim_defaults(DP_OPTIM_SGD);
    dp_optim o;
    dp_err err;
    REQUIRE(dp_optim_init(&o, &cfg, m.n_params, &err) == 0);
    dp_dmodel *g = dopen(&m, &cfg);
    REQUIRE(dp_dmodel_load_split(g, &fs, &err) == 0);
    float *x = malloc((size_t)BATCH * DIM * sizeof *x), *gr = malloc(m.n_params * sizeof *gr);
    float *p = malloc(m.n_params * sizeof *p);
    uint8_t y[BATCH];
    uint32_t idx[BATCH];
    REQUIRE(x && gr && p);
    pick(idx, BATCH);
    REQUIRE(dp_dmodel_stage(g, idx, BATCH, &err) == 0);
    REQUIRE(dp_dmodel_grads(g, &err) == 0);
    REQUIRE(dp_dmodel_get_grads(g, gr, &err) == 0);
    dp_split_gather(x, y, &fs, idx, BATCH);
    dp_model_forward_backward(&m, x, y, BATCH, NULL);
    float gmax = 0;
    for (size_t i = 0; i < m.n_params; i++)
        gmax = fabsf(m.grads[i]) > gmax ? fabsf(m.grads[i]) : gmax;
    /* ~1e-6 single-threaded, ~7e-6 with OpenBLAS's threads in sim's
     * products; gathering the floats as bytes would be off by O(1) */
    report("float split: dp_dmodel_grads (floor max|g|/100)",
           max_rel(gr, m.grads, m.n_params, gmax * 1e-2), 1e-4);
    double ep = 0;
    for (int step = 0; step < 4; step++) {
        pick(idx, BATCH);
        REQUIRE(dp_dmodel_stage(g, idx, BATCH, &err) == 0);
        REQUIRE(dp_dmodel_step(g, 0.05f, &err) == 0);
        dp_split_gather(x, y, &fs, idx, BATCH);
        dp_model_forward_backward(&m, x, y, BATCH, NULL);
        dp_optim_apply(&o, m.params, m.grads, 0.05f);
        REQUIRE(dp_dmodel_get_params(g, p, &err) == 0);
        double e = max_rel(p, m.params, m.n_params, 1e-2);
        ep = e > ep ? e : ep;
    }
    report("float split: 4 sgd steps, parameters", ep, 1e-5);
    /* back to the bytes: the same indices now give pixels / 255 */
    REQUIRE(dp_dmodel_load_split(g, &split, &err) == 0);
    REQUIRE(dp_dmodel_set_params(g, m.params, &err) == 0);
    REQUIRE(dp_dmodel_stage(g, idx, BATCH, &err) == 0);
    REQUIRE(dp_dmodel_grads(g, &err) == 0);
    REQUIRE(dp_dmodel_get_grads(g, gr, &err) == 0);
    dp_split_gather(x, y, &split, idx, BATCH);
    dp_model_forward_backward(&m, x, y, BATCH, NULL);
    gmax = 0;
    for (size_t i = 0; i < m.n_params; i++)
        gmax = fabsf(m.grads[i]) > gmax ? fabsf(m.grads[i]) : gmax;
    report("byte split loaded after it: dp_dmodel_grads",
           max_rel(gr, m.grads, m.n_params, gmax * 1e-2), 1e-4);
    /* a streamed split has no records to copy */
    static dp_stream_source src;
    dp_split streamed = {.n = RECORDS, .dim = DIM, .stream = &src};
    CHECK(dp_dmodel_load_split(g, &streamed, &err) == -1);
    CHECKF(strstr(err.msg, "streamed from their files"), "%s", err.msg);
    dp_dmodel_close(g);
    dp_optim_free(&o);
    dp_model_free(&m);
    free(x), free(gr), free(p);
}

/* The captured-and-replayed step gives the bits of the direct one, over 70
 * steps whose last is short (past the 64 host step blocks, so the ring wraps
 * through a sync); no step allocates device memory. */
#define GRAPH_STEPS 70
static void test_graph(void)
{
    int batch = 32;
    dp_model m;
    model_init(&m, "mlp-300-100", batch);
    dp_optim_config cfg = dp_optim_defaults(DP_OPTIM_ADAM);
    setenv("DOWNPOUR_DEVICE_GRAPH", "0", 1);
    dp_dmodel *direct = dopen(&m, &cfg);
    unsetenv("DOWNPOUR_DEVICE_GRAPH");
    dp_dmodel *graph = dopen(&m, &cfg);
    dp_sim_counts c0 = dp_sim_counts_of(dp_device_ctx(dev));
    dp_err err;
    uint32_t idx[32];
    for (int step = 0; step < GRAPH_STEPS; step++) {
        int n = step == GRAPH_STEPS - 1 ? 13 : batch;
        pick(idx, n);
        float lr = 0.001f * (1.0f + 0.05f * step);
        REQUIRE(dp_dmodel_stage(direct, idx, n, &err) == 0);
        REQUIRE(dp_dmodel_step(direct, lr, &err) == 0);
        REQUIRE(dp_dmodel_stage(graph, idx, n, &err) == 0);
        REQUIRE(dp_dmodel_step(graph, lr, &err) == 0);
    }
    dp_sim_counts c1 = dp_sim_counts_of(dp_device_ctx(dev));
    CHECKF(c1.allocs == c0.allocs && c1.bytes == c0.bytes && c1.host_allocs == c0.host_allocs,
           "steps allocated: %ld -> %ld device blocks, %ld -> %ld host", c0.allocs, c1.allocs,
           c0.host_allocs, c1.host_allocs);
    CHECKF(c1.graph_launches - c0.graph_launches == GRAPH_STEPS - 1,
           "%ld graph launches, want %d (the full steps)", c1.graph_launches - c0.graph_launches,
           GRAPH_STEPS - 1);
    float *a = malloc(m.n_params * sizeof(float)), *b = malloc(m.n_params * sizeof(float));
    float *sa = malloc(2 * m.n_params * sizeof(float)), *sb = malloc(2 * m.n_params * sizeof(float));
    long ta, tb;
    REQUIRE(dp_dmodel_get_params(direct, a, &err) == 0 && dp_dmodel_get_params(graph, b, &err) == 0);
    REQUIRE(dp_dmodel_get_optim(direct, sa, &ta, &err) == 0 &&
            dp_dmodel_get_optim(graph, sb, &tb, &err) == 0);
    CHECKF(memcmp(a, b, m.n_params * sizeof(float)) == 0, "graph replay: parameters differ");
    CHECKF(memcmp(sa, sb, 2 * m.n_params * sizeof(float)) == 0 && ta == tb && ta == GRAPH_STEPS,
           "graph replay: optimiser state differs (t %ld, %ld)", ta, tb);
    CHECKF(memcmp(a, m.params, m.n_params * sizeof(float)) != 0, "the steps did nothing");
    double la = 0, lb = 0;
    long ca = 0, cb = 0;
    REQUIRE(dp_dmodel_collect(direct, &la, &ca, &err) == 0);
    REQUIRE(dp_dmodel_collect(graph, &lb, &cb, &err) == 0);
    CHECK(la == lb && ca == cb && la > 0);
    printf("  graph replay: %d replays + 1 short direct step, the bits of "
           "DOWNPOUR_DEVICE_GRAPH=0\n", GRAPH_STEPS - 1);

    /* a longer batch after a shorter first one recaptures */
    dp_dmodel_close(graph);
    graph = dopen(&m, &cfg);
    c0 = dp_sim_counts_of(dp_device_ctx(dev));
    for (int n = 8; n <= 32; n += 24) {
        pick(idx, n);
        REQUIRE(dp_dmodel_stage(graph, idx, n, &err) == 0);
        REQUIRE(dp_dmodel_step(graph, 0.001f, &err) == 0);
    }
    c1 = dp_sim_counts_of(dp_device_ctx(dev));
    CHECK(c1.graph_launches - c0.graph_launches == 2);
    dp_dmodel_close(direct);
    dp_dmodel_close(graph);
    dp_model_free(&m);
    free(a), free(b), free(sa), free(sb);
}

/* --ema on the device: the average after full (replayed) steps, a short
 * direct step and an update equals the loop's host formula over the CPU's
 * weights; a start value is taken as given; the errors name the call. */
static void test_ema(void)
{
    enum { BATCH = 32, EMA_STEPS = 12 };
    const float decay = 0.9f, rest = 1.0f - decay; /* as loop.c rounds it */
    dp_model m;
    model_init(&m, "784-128-10", BATCH);
    dp_optim_config cfg = dp_optim_defaults(DP_OPTIM_MOMENTUM);
    dp_optim o;
    dp_err err;
    REQUIRE(dp_optim_init(&o, &cfg, m.n_params, &err) == 0);
    dp_dmodel *g = dopen(&m, &cfg);
    float *x = malloc((size_t)BATCH * DIM * sizeof *x), *a = malloc(m.n_params * sizeof *a);
    float *da = malloc(m.n_params * sizeof *da);
    uint8_t y[BATCH];
    uint32_t idx[BATCH];
    REQUIRE(x && a && da);
    CHECK(dp_dmodel_get_ema(g, da, &err) == -1 && strstr(err.msg, "dp_dmodel_ema_start first"));
    CHECK(dp_dmodel_ema_start(g, 1.0f, NULL, &err) == -1 && strstr(err.msg, "decay 1 "));
    CHECK(dp_dmodel_ema_start(g, 0.0f, NULL, &err) == -1);
    /* one step before the start: the average starts at the weights it left */
    pick(idx, BATCH);
    REQUIRE(dp_dmodel_stage(g, idx, BATCH, &err) == 0 && dp_dmodel_step(g, cfg.lr, &err) == 0);
    dp_split_gather(x, y, &split, idx, BATCH);
    dp_model_forward_backward(&m, x, y, BATCH, NULL);
    dp_optim_apply(&o, m.params, m.grads, cfg.lr);
    REQUIRE(dp_dmodel_ema_start(g, decay, NULL, &err) == 0);
    memcpy(a, m.params, m.n_params * sizeof *a);
    REQUIRE(dp_dmodel_get_ema(g, da, &err) == 0);
    report("ema: started at the device's weights", max_rel(da, a, m.n_params, 1e-2), 1e-6);
    dp_sim_counts c0 = dp_sim_counts_of(dp_device_ctx(dev));
    for (int step = 0; step < EMA_STEPS; step++) {
        int n = step == EMA_STEPS - 2 ? BATCH - 7 : BATCH; /* one short, direct step */
        pick(idx, n);
        REQUIRE(dp_dmodel_stage(g, idx, n, &err) == 0);
        dp_split_gather(x, y, &split, idx, n);
        dp_model_forward_backward(&m, x, y, n, NULL);
        if (step == EMA_STEPS - 1) { /* grads + update: the average follows an update too */
            REQUIRE(dp_dmodel_grads(g, &err) == 0 &&
                    dp_dmodel_update(g, cfg.lr, 1.0f, &err) == 0);
        } else {
            REQUIRE(dp_dmodel_step(g, cfg.lr, &err) == 0);
        }
        dp_optim_apply(&o, m.params, m.grads, cfg.lr);
        for (size_t i = 0; i < m.n_params; i++)
            a[i] = decay * a[i] + rest * m.params[i];
    }
    dp_sim_counts c1 = dp_sim_counts_of(dp_device_ctx(dev));
    CHECKF(c1.graph_launches - c0.graph_launches == EMA_STEPS - 2, "%ld graph launches, want %d",
           c1.graph_launches - c0.graph_launches, EMA_STEPS - 2);
    CHECK(c1.allocs == c0.allocs);
    REQUIRE(dp_dmodel_get_ema(g, da, &err) == 0);
    report("ema: average after 12 steps vs the host's formula", max_rel(da, a, m.n_params, 1e-2),
           1e-5);
    /* it lags the weights: not a copy of them */
    REQUIRE(dp_dmodel_get_params(g, a, &err) == 0);
    CHECK(max_rel(da, a, m.n_params, 1e-2) > 1e-3);
    /* a given start (a resumed average) is taken as it is */
    for (size_t i = 0; i < m.n_params; i++)
        a[i] = (float)i * 1e-6f;
    REQUIRE(dp_dmodel_ema_start(g, 0.5f, a, &err) == 0 && dp_dmodel_get_ema(g, da, &err) == 0);
    CHECK(memcmp(a, da, m.n_params * sizeof *a) == 0);
    dp_dmodel_close(g);
    g = dopen(&m, NULL);
    CHECK(dp_dmodel_ema_start(g, 0.5f, NULL, &err) == -1 && strstr(err.msg, "without an optimiser"));
    dp_dmodel_close(g);
    dp_optim_free(&o);
    dp_model_free(&m);
    free(x), free(a), free(da);
}

/* Dropout under graph capture: the keys come from the step block, so every
 * replay draws that step's masks.  With one record a step, a weight after a
 * dropout is left unchanged exactly where its input was dropped (its
 * gradient is 0), so which weights moved shows both masks: the device's,
 * replayed, must move the CPU's weights bit for bit, every step.  The
 * replayed run also gives the bits of DOWNPOUR_DEVICE_GRAPH=0. */
static void test_dropout_graph(void)
{
    enum { DROP_STEPS = 8 };
    dp_model m;
    model_init(&m, "784-dropout0.5-32-relu-dropout0.3-10", 1);
    dp_optim_config cfg = dp_optim_defaults(DP_OPTIM_SGD);
    cfg.lr = 0.05f;
    dp_optim o;
    dp_err err;
    REQUIRE(dp_optim_init(&o, &cfg, m.n_params, &err) == 0);
    setenv("DOWNPOUR_DEVICE_GRAPH", "0", 1);
    dp_dmodel *direct = dopen(&m, &cfg);
    unsetenv("DOWNPOUR_DEVICE_GRAPH");
    dp_dmodel *g = dopen(&m, &cfg);
    size_t n = m.n_params;
    float *prev = malloc(n * sizeof(float)), *cpu_prev = malloc(n * sizeof(float));
    float *p = malloc(n * sizeof(float)), *q = malloc(n * sizeof(float));
    float x[DIM];
    uint8_t y[1];
    REQUIRE(prev && cpu_prev && p && q);
    memcpy(prev, m.params, n * sizeof(float));
    dp_sim_counts c0 = dp_sim_counts_of(dp_device_ctx(dev));
    long differ = 0, moved = 0, kept = 0;
    double e = 0;
    for (int step = 0; step < DROP_STEPS; step++) {
        uint32_t idx;
        pick(&idx, 1);
        REQUIRE(dp_dmodel_stage(g, &idx, 1, &err) == 0 && dp_dmodel_step(g, cfg.lr, &err) == 0);
        REQUIRE(dp_dmodel_stage(direct, &idx, 1, &err) == 0 &&
                dp_dmodel_step(direct, cfg.lr, &err) == 0);
        memcpy(cpu_prev, m.params, n * sizeof(float));
        dp_split_gather(x, y, &split, &idx, 1);
        dp_model_forward_backward(&m, x, y, 1, NULL);
        dp_optim_apply(&o, m.params, m.grads, cfg.lr);
        REQUIRE(dp_dmodel_get_params(g, p, &err) == 0);
        for (size_t i = 0; i < n; i++) {
            int dev_moved = p[i] != prev[i], cpu_moved = m.params[i] != cpu_prev[i];
            differ += dev_moved != cpu_moved;
            moved += cpu_moved;
            kept += !cpu_moved;
        }
        double d = max_rel(p, m.params, n, 1e-2);
        e = d > e ? d : e;
        memcpy(prev, p, n * sizeof(float));
    }
    dp_sim_counts c1 = dp_sim_counts_of(dp_device_ctx(dev));
    CHECKF(c1.graph_launches - c0.graph_launches == DROP_STEPS,
           "%ld graph launches for %d steps: the dropout model was not replayed",
           c1.graph_launches - c0.graph_launches, DROP_STEPS);
    CHECKF(differ == 0, "replayed dropout: %ld weights moved on one side only (masks differ)",
           differ);
    CHECKF(moved > 0 && kept > 0, "the masks showed nothing: %ld moved, %ld kept", moved, kept);
    printf("  replayed dropout, %d steps: the CPU's masks (%ld weight moves, %ld kept)\n",
           DROP_STEPS, moved, kept);
    report("replayed dropout: parameters vs the CPU's", e, 1e-5);
    REQUIRE(dp_dmodel_get_params(direct, q, &err) == 0);
    CHECKF(memcmp(p, q, n * sizeof(float)) == 0, "replayed dropout: not the bits of the direct run");
    dp_dmodel_close(direct);
    dp_dmodel_close(g);
    dp_optim_free(&o);
    dp_model_free(&m);
    free(prev), free(cpu_prev), free(p), free(q);
}

/* grads then update equals step; a batch staged before an update survives
 * it; update's scale multiplies the gradients. */
static void test_pieces(void)
{
    int batch = 16;
    dp_model m;
    model_init(&m, "784-128-10", batch);
    dp_optim_config cfg = dp_optim_defaults(DP_OPTIM_MOMENTUM);
    dp_dmodel *a = dopen(&m, &cfg), *b = dopen(&m, &cfg), *c = dopen(&m, &cfg);
    dp_err err;
    uint32_t idx[16];
    float *pa = malloc(m.n_params * sizeof(float)), *pb = malloc(m.n_params * sizeof(float));
    float *pc = malloc(m.n_params * sizeof(float)), *gr = malloc(m.n_params * sizeof(float));
    for (int step = 0; step < 3; step++) {
        pick(idx, batch);
        REQUIRE(dp_dmodel_stage(a, idx, batch, &err) == 0 && dp_dmodel_step(a, 0.01f, &err) == 0);
        REQUIRE(dp_dmodel_stage(b, idx, batch, &err) == 0 && dp_dmodel_grads(b, &err) == 0);
        REQUIRE(dp_dmodel_update(b, 0.01f, 1.0f, &err) == 0);
        /* c: the gradients doubled on the host, then scaled by 0.5 */
        REQUIRE(dp_dmodel_stage(c, idx, batch, &err) == 0 && dp_dmodel_grads(c, &err) == 0);
        REQUIRE(dp_dmodel_get_grads(c, gr, &err) == 0);
        for (size_t i = 0; i < m.n_params; i++)
            gr[i] *= 2.0f;
        REQUIRE(dp_dmodel_set_grads(c, gr, &err) == 0);
        REQUIRE(dp_dmodel_update(c, 0.01f, 0.5f, &err) == 0);
    }
    REQUIRE(dp_dmodel_get_params(a, pa, &err) == 0 && dp_dmodel_get_params(b, pb, &err) == 0 &&
            dp_dmodel_get_params(c, pc, &err) == 0);
    CHECKF(memcmp(pa, pb, m.n_params * sizeof(float)) == 0, "grads + update != step");
    CHECKF(memcmp(pa, pc, m.n_params * sizeof(float)) == 0, "update's scale: differs");
    dp_dmodel_close(a), dp_dmodel_close(b);
    /* a batch staged before an update (sgd, lr 0: no change) is the one the
     * next step trains on */
    cfg = dp_optim_defaults(DP_OPTIM_SGD);
    a = dopen(&m, &cfg);
    b = dopen(&m, &cfg);
    pick(idx, batch);
    REQUIRE(dp_dmodel_stage(a, idx, batch, &err) == 0 && dp_dmodel_step(a, 0.01f, &err) == 0);
    REQUIRE(dp_dmodel_stage(b, idx, batch, &err) == 0);
    REQUIRE(dp_dmodel_update(b, 0.0f, 1.0f, &err) == 0);
    REQUIRE(dp_dmodel_step(b, 0.01f, &err) == 0);
    REQUIRE(dp_dmodel_get_params(a, pa, &err) == 0 && dp_dmodel_get_params(b, pb, &err) == 0);
    CHECKF(memcmp(pa, pb, m.n_params * sizeof(float)) == 0, "a staged batch did not survive "
           "an update");
    dp_dmodel_close(a), dp_dmodel_close(b), dp_dmodel_close(c);
    dp_model_free(&m);
    free(pa), free(pb), free(pc), free(gr);
}

/* A step retried after its sum broke (allreduce re-forms the ring and stages
 * the batch again): its forward's loss is taken back, so the tallies and the
 * parameters are those of the steps run once each. */
static void test_retry(void)
{
    int batch = 16;
    dp_model m;
    model_init(&m, "784-128-10", batch);
    dp_optim_config cfg = dp_optim_defaults(DP_OPTIM_MOMENTUM);
    dp_dmodel *once = dopen(&m, &cfg), *retried = dopen(&m, &cfg);
    dp_err err;
    uint32_t idx[16];
    for (int step = 0; step < 4; step++) {
        pick(idx, batch);
        REQUIRE(dp_dmodel_stage(once, idx, batch, &err) == 0 && dp_dmodel_grads(once, &err) == 0);
        REQUIRE(dp_dmodel_update(once, 0.01f, 1.0f, &err) == 0);
        REQUIRE(dp_dmodel_stage(retried, idx, batch, &err) == 0);
        if (step == 1) /* failed before its forward: restaging is a no-op */
            REQUIRE(dp_dmodel_restage(retried, &err) == 0);
        REQUIRE(dp_dmodel_grads(retried, &err) == 0);
        for (int tries = 0; step >= 2 && tries < step - 1; tries++) /* its sum broke */
            REQUIRE(dp_dmodel_restage(retried, &err) == 0 && dp_dmodel_grads(retried, &err) == 0);
        REQUIRE(dp_dmodel_update(retried, 0.01f, 1.0f, &err) == 0);
    }
    double lo = 0, lr = 0;
    long co = 0, cr = 0;
    REQUIRE(dp_dmodel_collect(once, &lo, &co, &err) == 0);
    REQUIRE(dp_dmodel_collect(retried, &lr, &cr, &err) == 0);
    CHECKF(lo == lr && co == cr && lo > 0, "retried steps: loss %.9g, correct %ld; run once: "
           "loss %.9g, correct %ld", lr, cr, lo, co);
    float *a = malloc(m.n_params * sizeof(float)), *b = malloc(m.n_params * sizeof(float));
    REQUIRE(dp_dmodel_get_params(once, a, &err) == 0 && dp_dmodel_get_params(retried, b, &err) == 0);
    CHECKF(memcmp(a, b, m.n_params * sizeof(float)) == 0, "retried steps: parameters differ");
    /* collect zeroed every tally: the next step counts alone */
    pick(idx, batch);
    REQUIRE(dp_dmodel_stage(once, idx, batch, &err) == 0 && dp_dmodel_step(once, 0.01f, &err) == 0);
    REQUIRE(dp_dmodel_stage(retried, idx, batch, &err) == 0 && dp_dmodel_grads(retried, &err) == 0);
    REQUIRE(dp_dmodel_restage(retried, &err) == 0 && dp_dmodel_step(retried, 0.01f, &err) == 0);
    lo = lr = 0, co = cr = 0;
    REQUIRE(dp_dmodel_collect(once, &lo, &co, &err) == 0);
    REQUIRE(dp_dmodel_collect(retried, &lr, &cr, &err) == 0);
    CHECKF(lo == lr && co == cr && lo > 0, "after a collect: loss %.9g against %.9g", lr, lo);
    printf("  retried steps: the tallies and parameters of the steps run once\n");
    dp_dmodel_close(once), dp_dmodel_close(retried);
    dp_model_free(&m);
    free(a), free(b);
}

static void test_round_trip(void)
{
    dp_model m;
    model_init(&m, "784-128-10", 8);
    dp_optim_config cfg = dp_optim_defaults(DP_OPTIM_ADAM);
    dp_dmodel *g = dopen(&m, &cfg);
    dp_err err;
    size_t n = m.n_params;
    float *a = malloc(2 * n * sizeof(float)), *b = malloc(2 * n * sizeof(float));
    /* a fresh model holds m's parameters and zero adam state at t = 0 */
    long t = -1;
    REQUIRE(dp_dmodel_get_params(g, a, &err) == 0);
    CHECK(memcmp(a, m.params, n * sizeof(float)) == 0);
    REQUIRE(dp_dmodel_get_optim(g, a, &t, &err) == 0);
    int zero = 1;
    for (size_t i = 0; i < 2 * n; i++)
        zero &= a[i] == 0.0f;
    CHECK(zero && t == 0);
    for (size_t i = 0; i < 2 * n; i++)
        a[i] = dp_rng_uniform(&rng);
    REQUIRE(dp_dmodel_set_params(g, a, &err) == 0 && dp_dmodel_get_params(g, b, &err) == 0);
    CHECK(memcmp(a, b, n * sizeof(float)) == 0);
    REQUIRE(dp_dmodel_set_grads(g, a + 1, &err) == 0 && dp_dmodel_get_grads(g, b, &err) == 0);
    CHECK(memcmp(a + 1, b, n * sizeof(float)) == 0);
    REQUIRE(dp_dmodel_set_optim(g, a, 7, &err) == 0 && dp_dmodel_get_optim(g, b, &t, &err) == 0);
    CHECK(memcmp(a, b, 2 * n * sizeof(float)) == 0 && t == 7);
    CHECK(dp_dmodel_set_optim(g, a, -1, &err) == -1);
    CHECK(dp_dmodel_device(g) == dev);
    dp_dmodel_close(g);

    /* adagrad's accumulator starts at its initial value, as dp_optim_init */
    cfg = dp_optim_defaults(DP_OPTIM_ADAGRAD);
    g = dopen(&m, &cfg);
    REQUIRE(dp_dmodel_get_optim(g, a, &t, &err) == 0);
    int init = 1;
    for (size_t i = 0; i < n; i++)
        init &= a[i] == cfg.initial_accumulator;
    CHECK(init);
    dp_dmodel_close(g);
    dp_model_free(&m);
    free(a), free(b);
}

static void test_errors(void)
{
    dp_model m;
    model_init(&m, "mlp-300-100", 256);
    dp_optim_config cfg = dp_optim_defaults(DP_OPTIM_ADAM);
    dp_dmodel *g;
    dp_err err;
    uint32_t idx[300] = {0};
    REQUIRE(dp_dmodel_open(&g, dev, &m, &cfg, &err) == 0);
    CHECK(dp_dmodel_stage(g, idx, 4, &err) == -1 && strstr(err.msg, "no split loaded"));
    REQUIRE(dp_dmodel_load_split(g, &split, &err) == 0);
    CHECK(dp_dmodel_step(g, 0.1f, &err) == -1 && strstr(err.msg, "no batch staged"));
    CHECK(dp_dmodel_stage(g, idx, 300, &err) == -1);
    CHECKF(strstr(err.msg, "batch of 300 records is more than the model's 256 rows"), "%s", err.msg);
    CHECK(dp_dmodel_stage(g, idx, 0, &err) == -1);
    idx[5] = RECORDS + 100;
    CHECK(dp_dmodel_stage(g, idx, 8, &err) == -1);
    CHECKF(strstr(err.msg, "record 700 (batch position 5) is past the loaded split's 600"), "%s",
           err.msg);
    uint8_t id[DP_COMM_ID_BYTES];
    /* sim's collectives (test_sim_comm.c): a sum before a join is refused;
     * one rank's sum is the gradients themselves; close ends the communicator */
    CHECKF(dp_dmodel_comm_id(g, id, &err) == 0, "%s", err.msg);
    CHECK(dp_dmodel_allreduce_grads(g, &err) == -1 && strstr(err.msg, "no communicator"));
    CHECK(dp_dmodel_comm_join(g, id, 2, 2, &err) == -1 && strstr(err.msg, "out of range"));
    CHECKF(dp_dmodel_comm_join(g, id, 1, 0, &err) == 0, "%s", err.msg);
    CHECKF(dp_dmodel_allreduce_grads(g, &err) == 0, "%s", err.msg);
    /* a sum refused (here: during a capture) says the communicator's reason */
    const dp_backend *be = dp_device_backend(dev);
    char msg[256];
    void *graph = NULL;
    REQUIRE(be->capture_begin(dp_device_ctx(dev), msg, sizeof msg) == 0);
    CHECK(dp_dmodel_allreduce_grads(g, &err) == -1);
    CHECKF(strstr(err.msg, "did not start: sim collective: a sum of ") &&
               strstr(err.msg, "during a graph capture"), "%s", err.msg);
    if (be->capture_end(dp_device_ctx(dev), &graph, msg, sizeof msg) == 0)
        be->graph_free(dp_device_ctx(dev), graph);
    dp_split narrow = {.images = split.images, .labels = split.labels, .n = RECORDS / 2,
                       .dim = DIM / 2};
    CHECK(dp_dmodel_load_split(g, &narrow, &err) == -1 && strstr(err.msg, "392 values"));
    dp_dmodel_close(g);
    dp_dmodel_close(NULL);
    dp_model_free(&m);

    /* out of device memory: the first buffer that does not fit, named */
    model_init(&m, "mlp-300-100", 128);
    dp_hook_set("DOWNPOUR_SIM_MEMORY", "4300000", NULL); /* params, grads, adam's m and v: 4265760 */
    dp_device *small;
    dp_device_spec spec = {DP_DEVICE_SIM, 0};
    REQUIRE(dp_device_open(&small, &spec, &err) == 0);
    dp_hook_set("DOWNPOUR_SIM_MEMORY", NULL, NULL);
    CHECK(dp_dmodel_open(&g, small, &m, &cfg, &err) == -1);
    CHECKF(strstr(err.msg, "device sim: out of memory for the activations (") != NULL, "%s",
           err.msg);
    CHECKF(dp_sim_counts_of(dp_device_ctx(small)).bytes == 0, "a failed open left memory held");
    dp_device_close(small);

    /* a device whose queued work failed: the failure named, not memory */
    REQUIRE(dp_device_open(&small, &spec, &err) == 0);
    dp_kernel k = {.id = DP_K_COUNT, .items = 1};
    dp_device_backend(small)->launch(dp_device_ctx(small), &k);
    CHECK(dp_dmodel_open(&g, small, &m, &cfg, &err) == -1);
    CHECKF(strstr(err.msg, "cannot allocate the parameters: device sim: no kernel has id") != NULL,
           "%s", err.msg);
    dp_device_close(small);
    dp_optim_config bad = cfg;
    bad.beta1 = 2.0f;
    CHECK(dp_dmodel_open(&g, dev, &m, &bad, &err) == -1 && strstr(err.msg, "beta1"));
    dp_model_free(&m);
}

int main(void)
{
    dp_err err;
    dp_device_spec spec;
    setenv("DOWNPOUR_EXACT_ADAM", "1", 1); /* before any dp_optim_init */
    /* the CPU's convolutions as the device's: lowered products, the same
     * sums, so max pools pick the same pixels (conv_direct.h) */
    dp_conv_direct_enable(false);
    dp_rng_seed(&rng, 2014);
    make_split();
    REQUIRE(dp_device_parse("sim", &spec, &err) == 0 && spec.kind == DP_DEVICE_SIM);
    REQUIRE(dp_device_open(&dev, &spec, &err) == 0);
    CHECK(strcmp(dp_device_describe(dev), "sim (host)") == 0 && dp_device_has_comm(dev));

    static const char *const specs[] = {"mlp-300-100", "784-128-10"};
    /* Bounds on |device - CPU| / (|CPU| + 0.01) after 6 steps.  Single-threaded
     * (ctest) the products differ only in summation order and the measured
     * errors are ~2e-7 for every optimiser; with OpenBLAS's own threads in
     * sim's products adam reaches ~1.3e-5, since it divides each gradient by
     * its own scale, so an ulp of a tiny gradient moves its update as much as
     * an ulp of a large one. */
    for (int s = 0; s < 2; s++)
        for (int k = 0; k < DP_OPTIM_COUNT; k++)
            parity(specs[s], (dp_optim_kind)k, 64, k == DP_OPTIM_ADAM ? 1e-4 : 1e-5);
    /* dropout after a fused relu, and a relu alone after a dropout */
    parity("784-300-dropout0.5-100-10", DP_OPTIM_ADAM, 64, 1e-4);
    parity("784-dense64-dropout0.3-relu-32-10", DP_OPTIM_SGD, 33, 1e-5);
    /* the image layers (dimage.c) in the walk: conv and local with a fused
     * relu, both pools, flatten before the dense layers */
    if (!SANITIZED) /* ASan: the smaller image model below covers the same code */
        parity("cnn-mnist", DP_OPTIM_ADAM, 16, 1e-4);
    parity("1x28x28-conv3x3x4p1-relu-avgpool2-local3x3x4s2-relu-maxpool2-10", DP_OPTIM_MOMENTUM,
           9, 1e-4);
    /* lcn (dlcn.c) after a relu and before a pool, and two of them in
     * DistBelief's image model */
    parity("1x28x28-conv5x5x4-relu-lcn5-maxpool2-lcn3-10", DP_OPTIM_MOMENTUM, 9, 1e-4);
    if (!SANITIZED)
        parity("distbelief-image", DP_OPTIM_ADAGRAD, 8, 1e-4);
    /* residual blocks (identity and projection shortcuts, bn inside, a
     * stride): the block's sum and its input's gradient on the device */
    parity("1x28x28-conv3x3x4p1-bn-relu-res(conv3x3x4p1-bn-relu-conv3x3x4p1-bn)-relu"
           "-res(conv3x3x6s2p1-bn-relu-conv3x3x6p1|conv1x1x6s2-bn)-relu-gap-10",
           DP_OPTIM_MOMENTUM, 9, 1e-4);
    parity("784-res(64-dense784)-res(dense32-relu-dense16|dense16)-relu-10", DP_OPTIM_SGD, 9,
           1e-5);
    /* a conv filter's gradient sums 50 x 576 positions, in another order
     * than the CPU's chunked product */
    if (!SANITIZED)
        test_grads("cnn-mnist", 1e-4);
    test_grads("mlp-300-100", 1e-5);
    /* lcn's layers alone give the CPU's bits (test_device_lcn), and each pair
     * of this model's stages agrees to ~5e-6; the conv's product rounding,
     * through lcn's 1/d^2 and a max pool between two lcn layers, reaches
     * ~2e-4 on the smallest gradients */
    test_grads("1x28x28-conv5x5x4-relu-lcn5-maxpool2-lcn3-10", 1e-3);
    test_grads("784-dropout0.2-dense50-relu-10", 1e-5);
    test_float_split();
    test_graph();
    test_ema();
    test_dropout_graph();
    test_pieces();
    test_retry();
    test_round_trip();
    test_errors();
    dp_device_close(dev);
    return CHECK_DONE();
}
