/* Page-locked host staging (docs/gpu.md, "Strategies"): host arrays pinned
 * in place for a device model's life, on sim.
 *   - sim's host_register keeps ranges as cudaHostRegister does: an overlap
 *     of a registered range is refused naming it, adjacent ranges are not,
 *     unregistering a pointer not registered is ignored, the counts follow;
 *   - dp_dmodel_pin_host of a model's params and grads: 2 ranges and their
 *     bytes; refusals (overlap, past DP_DMODEL_MAX_PINS) with the reason;
 *     dp_dmodel_close lets every range go;
 *   - host-staging steps through pinned arrays give the bits of a backend
 *     table without host_register, which pins nothing and still trains;
 *   - through the program, allreduce (summed on the host) and ps-async
 *     workers on sim log the pinned bytes (and no fallback warning), the ps
 *     chief pins nothing, and allreduce summed on the devices (when sim has
 *     collectives) pins nothing;
 *     with room for one array only (DOWNPOUR_SIM_PINNED), each worker warns
 *     once with the reason and trains on. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proc.h"
#include "random_split.h"

#include "device/device_impl.h"
#include "device/sim.h"
#include "downpour/dataset.h"
#include "downpour/device.h"
#include "downpour/model.h"
#include "downpour/rng.h"
#include "downpour/testhooks.h"

#define RECORDS 300
#define DIM 784
#define BATCH 32
#define STEPS 5
#define SPEC "mlp-300-100"

static dp_split split;

static void make_split(void)
{
    static uint8_t images[RECORDS * DIM], labels[RECORDS];
    dp_rng rng;
    dp_rng_seed(&rng, 11);
    split = random_split(images, labels, RECORDS, DIM, &rng);
}

static dp_sim_counts counts(const dp_device *d) { return dp_sim_counts_of(dp_device_ctx(d)); }

static dp_device *open_sim(const dp_backend *be)
{
    dp_device_spec spec = {DP_DEVICE_SIM, 0};
    dp_device *d;
    dp_err err;
    if (dp_device_open_backend(&d, be, &spec, &err) < 0) {
        fprintf(stderr, "open sim: %s\n", err.msg);
        exit(1);
    }
    return d;
}

/* The table entries themselves, as the CUDA plugin's behave. */
static void sim_table(void)
{
    dp_device *d = open_sim(&dp_backend_sim);
    const dp_backend *be = dp_device_backend(d);
    void *ctx = dp_device_ctx(d);
    static unsigned char buf[4096];
    char msg[256];
    CHECK(be->host_register(ctx, buf + 1000, 1000, msg, sizeof msg) == 0);
    dp_sim_counts c = counts(d);
    CHECKF(c.pinned == 1 && c.pinned_bytes == 1000, "%ld ranges, %zu bytes", c.pinned,
           c.pinned_bytes);
    /* the same range, inside it, over its start, over its end, around it */
    const size_t at[][2] = {{1000, 1000}, {1500, 10}, {900, 101}, {1999, 50}, {0, 4096}};
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        msg[0] = '\0';
        int rc = be->host_register(ctx, buf + at[i][0], at[i][1], msg, sizeof msg);
        CHECKF(rc < 0 && strstr(msg, "already registered") && strstr(msg, "1000 bytes"),
               "[%zu, +%zu) over [1000, +1000): %d '%s'", at[i][0], at[i][1], rc, msg);
    }
    c = counts(d);
    CHECK(c.pinned == 1 && c.pinned_bytes == 1000);
    /* touching on either side is no overlap */
    CHECK(be->host_register(ctx, buf + 2000, 96, msg, sizeof msg) == 0);
    CHECK(be->host_register(ctx, buf + 900, 100, msg, sizeof msg) == 0);
    c = counts(d);
    CHECK(c.pinned == 3 && c.pinned_bytes == 1196);
    msg[0] = '\0';
    CHECK(be->host_register(ctx, buf, 0, msg, sizeof msg) < 0 && strstr(msg, "invalid"));
    be->host_unregister(ctx, buf + 1500); /* inside a range: not one registered */
    be->host_unregister(ctx, buf + 3000);
    c = counts(d);
    CHECK(c.pinned == 3 && c.pinned_bytes == 1196);
    be->host_unregister(ctx, buf + 1000);
    c = counts(d);
    CHECK(c.pinned == 2 && c.pinned_bytes == 196);
    CHECK(be->host_register(ctx, buf + 1500, 10, msg, sizeof msg) == 0); /* free again */
    be->host_unregister(ctx, buf + 900);
    be->host_unregister(ctx, buf + 2000);
    be->host_unregister(ctx, buf + 1500);
    c = counts(d);
    CHECK(c.pinned == 0 && c.pinned_bytes == 0);
    /* DOWNPOUR_SIM_PINNED caps the bytes registered at once */
    dp_hook_set("DOWNPOUR_SIM_PINNED", "1500", NULL);
    CHECK(be->host_register(ctx, buf, 1000, msg, sizeof msg) == 0);
    msg[0] = '\0';
    CHECKF(be->host_register(ctx, buf + 1000, 501, msg, sizeof msg) < 0 &&
               strstr(msg, "DOWNPOUR_SIM_PINNED allows 1500 bytes and 1000 are registered"),
           "past the cap: '%s'", msg);
    CHECK(be->host_register(ctx, buf + 1000, 500, msg, sizeof msg) == 0);
    dp_hook_set("DOWNPOUR_SIM_PINNED", "12k", NULL);
    msg[0] = '\0';
    CHECK(be->host_register(ctx, buf + 2000, 8, msg, sizeof msg) < 0 &&
          strstr(msg, "'12k' is not a count of bytes"));
    dp_hook_set("DOWNPOUR_SIM_PINNED", NULL, NULL);
    be->host_unregister(ctx, buf);
    be->host_unregister(ctx, buf + 1000);
    CHECK(counts(d).pinned == 0);
    /* a capture refuses it, as CUDA's does */
    CHECK(be->capture_begin(ctx, msg, sizeof msg) == 0);
    msg[0] = '\0';
    CHECK(be->host_register(ctx, buf, 64, msg, sizeof msg) < 0 && strstr(msg, "capture"));
    void *graph = NULL;
    CHECK(be->capture_end(ctx, &graph, msg, sizeof msg) == 0);
    be->graph_free(ctx, graph);
    be->host_register(ctx, buf, 64, msg, sizeof msg); /* held at close: freed with the context */
    dp_device_close(d);
}

/* STEPS host-staging steps, device_grads's sequence (strategies.c) and a
 * plain SGD update on the host; returns the loss summed over the steps. */
static double staging_steps(dp_dmodel *g, dp_model *m)
{
    dp_err err;
    double loss = 0;
    uint32_t idx[BATCH];
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < BATCH; i++)
            idx[i] = (uint32_t)((s * 97 + i * 13) % RECORDS);
        long correct = 0;
        REQUIRE(dp_dmodel_set_params(g, m->params, &err) == 0);
        REQUIRE(dp_dmodel_stage(g, idx, BATCH, &err) == 0);
        REQUIRE(dp_dmodel_grads(g, &err) == 0);
        REQUIRE(dp_dmodel_collect(g, &loss, &correct, &err) == 0);
        REQUIRE(dp_dmodel_get_grads(g, m->grads, &err) == 0);
        for (size_t i = 0; i < m->n_params; i++)
            m->params[i] -= 0.05f * m->grads[i];
    }
    return loss;
}

static void model_init(dp_model *m)
{
    dp_err err;
    REQUIRE(dp_model_init(m, SPEC, BATCH, 1, &err) == 0);
    dp_model_init_params(m, 7);
}

static dp_dmodel *dopen(dp_device *d, const dp_model *m)
{
    dp_dmodel *g;
    dp_err err;
    if (dp_dmodel_open(&g, d, m, NULL, &err) < 0) {
        fprintf(stderr, "dp_dmodel_open: %s\n", err.msg);
        exit(1);
    }
    REQUIRE(dp_dmodel_load_split(g, &split, &err) == 0);
    return g;
}

static void dmodel_pins(void)
{
    dp_err err;
    dp_model m, ref;
    model_init(&m);
    model_init(&ref);
    size_t bytes = m.n_params * sizeof(float);

    /* sim: both arrays pinned, counted, let go at close */
    dp_device *d = open_sim(&dp_backend_sim);
    dp_dmodel *g = dopen(d, &m);
    CHECK(dp_dmodel_pinned_bytes(g) == 0);
    CHECK(dp_dmodel_pin_host(g, m.params, bytes, &err) == 0);
    CHECK(dp_dmodel_pin_host(g, m.grads, bytes, &err) == 0);
    CHECK(dp_dmodel_pin_host(g, m.acts, 0, &err) == 0); /* nothing to pin */
    dp_sim_counts c = counts(d);
    CHECKF(c.pinned == 2 && c.pinned_bytes == 2 * bytes, "%ld ranges, %zu bytes (want 2, %zu)",
           c.pinned, c.pinned_bytes, 2 * bytes);
    CHECK(dp_dmodel_pinned_bytes(g) == 2 * bytes);
    /* an overlap is refused with the backend's reason, and pins nothing */
    err.msg[0] = '\0';
    CHECKF(dp_dmodel_pin_host(g, m.params + 100, 400, &err) < 0 &&
               strstr(err.msg, "dp_dmodel_pin_host") && strstr(err.msg, "already registered"),
           "overlap: '%s'", err.msg);
    err.msg[0] = '\0';
    CHECK(dp_dmodel_pin_host(g, NULL, 64, &err) < 0 && strstr(err.msg, "no memory"));
    c = counts(d);
    CHECK(c.pinned == 2 && dp_dmodel_pinned_bytes(g) == 2 * bytes);

    /* the round trip through pinned arrays */
    float *back = malloc(bytes);
    REQUIRE(back);
    for (size_t i = 0; i < m.n_params; i++)
        m.grads[i] = (float)i * 0.5f - 3.0f;
    REQUIRE(dp_dmodel_set_params(g, m.params, &err) == 0);
    REQUIRE(dp_dmodel_get_params(g, back, &err) == 0);
    CHECK(memcmp(back, m.params, bytes) == 0);
    REQUIRE(dp_dmodel_set_grads(g, m.grads, &err) == 0);
    memset(m.grads, 0, bytes);
    REQUIRE(dp_dmodel_get_grads(g, m.grads, &err) == 0);
    CHECK(m.grads[10] == 2.0f && m.grads[m.n_params - 1] == (float)(m.n_params - 1) * 0.5f - 3.0f);

    double loss = staging_steps(g, &m);
    dp_dmodel_close(g);
    c = counts(d);
    CHECKF(c.pinned == 0 && c.pinned_bytes == 0, "after close: %ld ranges, %zu bytes", c.pinned,
           c.pinned_bytes);

    /* at most DP_DMODEL_MAX_PINS ranges */
    g = dopen(d, &m);
    for (int i = 0; i < DP_DMODEL_MAX_PINS; i++)
        CHECK(dp_dmodel_pin_host(g, m.acts + 16 * i, 64, &err) == 0);
    err.msg[0] = '\0';
    CHECKF(dp_dmodel_pin_host(g, m.acts + 16 * DP_DMODEL_MAX_PINS, 64, &err) < 0 &&
               strstr(err.msg, "at most"),
           "past the limit: '%s'", err.msg);
    CHECK(counts(d).pinned == DP_DMODEL_MAX_PINS);
    dp_dmodel_close(g);
    CHECK(counts(d).pinned == 0 && counts(d).pinned_bytes == 0);
    dp_device_close(d);

    /* a table without host_register pins nothing, and the same steps give
     * the same bits */
    dp_backend nopin = dp_backend_sim;
    nopin.host_register = NULL;
    nopin.host_unregister = NULL;
    d = open_sim(&nopin);
    g = dopen(d, &ref);
    CHECK(dp_dmodel_pin_host(g, ref.params, bytes, &err) == 0);
    CHECK(dp_dmodel_pin_host(g, ref.grads, bytes, &err) == 0);
    CHECK(dp_dmodel_pinned_bytes(g) == 0 && counts(d).pinned == 0);
    double ref_loss = staging_steps(g, &ref);
    dp_dmodel_close(g);
    dp_device_close(d);
    printf("  %d host-staging steps: loss %.6f pinned, %.6f without host_register\n", STEPS,
           loss, ref_loss);
    CHECKF(loss == ref_loss && loss > 0, "loss %.9g pinned, %.9g not", loss, ref_loss);
    CHECK(memcmp(m.params, ref.params, bytes) == 0);
    CHECK(memcmp(m.grads, ref.grads, bytes) == 0);
    free(back);
    dp_model_free(&m);
    dp_model_free(&ref);
}

/* mlp-300-100's 266,610 parameters and as many gradients: 2.0 MiB. */
#define PINNED_LINE " pinned 2.0 MiB of host staging buffers"

static void program_runs(void)
{
    const char *bin = test_bin(), *tmp = test_tmp();
    REQUIRE(bin && tmp);
    require_mnist();
    char err[16384];
    const char *args = "--model " SPEC " --epochs 1 --train-size 1280 --val-size 500 "
                       "--test-size 500 --threads 1 --no-progress --log-every 1000";
    /* DOWNPOUR_NCCL=0: summed on the host whether or not sim has collectives */
    int rc = run_cmd(err, sizeof err,
                     "DOWNPOUR_NCCL=0 %s launch --workers 2 -- train --strategy allreduce "
                     "--device sim %s --metrics %s/ar.jsonl",
                     bin, args, tmp);
    CHECKF(rc == 0, "allreduce on sim exited %d: %s", rc, err);
    CHECKF(strstr(err, "Worker 0" PINNED_LINE) && strstr(err, "Worker 1" PINNED_LINE),
           "no pinned line for each worker: %s", err);
    CHECKF(!strstr(err, "pageable"), "a fallback warning: %s", err);
    char path[1200];
    snprintf(path, sizeof path, "%s/ar.jsonl", tmp);
    double acc = done_accuracy(path);
    CHECKF(acc >= 0.6, "allreduce on sim: test accuracy %.4f after 20 steps", acc);

    /* room for the parameters only: the gradients' range is refused, each
     * worker warns once with the reason and trains on */
    rc = run_cmd(err, sizeof err,
                 "DOWNPOUR_NCCL=0 DOWNPOUR_SIM_PINNED=1100000 %s launch --workers 2 -- train "
                 "--strategy allreduce --device sim %s --metrics %s/ar-pageable.jsonl",
                 bin, args, tmp);
    CHECKF(rc == 0, "allreduce on sim, pinning refused, exited %d: %s", rc, err);
    int warned = 0;
    for (const char *p = err; (p = strstr(p, "copies go through pageable memory: ")); p++)
        warned++;
    CHECKF(warned == 2 &&
               strstr(err, "Worker 0: copies go through pageable memory: dp_dmodel_pin_host: "
                           "device sim: host_register of 1066440 bytes: DOWNPOUR_SIM_PINNED") &&
               strstr(err, "Worker 1: copies go through pageable memory: ") &&
               !strstr(err, PINNED_LINE),
           "%d warnings (want one a worker): %s", warned, err);
    snprintf(path, sizeof path, "%s/ar-pageable.jsonl", tmp);
    double acc2 = done_accuracy(path);
    printf("  allreduce on sim, 20 steps: test accuracy %.4f pinned, %.4f pageable\n", acc,
           acc2);
    CHECKF(acc2 >= 0.6, "allreduce on sim, pageable: test accuracy %.4f", acc2);

    /* as it comes: sums on the devices (a sim with collectives) copy no
     * arrays each step and pin nothing; sums on the host pin */
    rc = run_cmd(err, sizeof err,
                 "%s launch --workers 2 -- train --strategy allreduce --device sim %s", bin,
                 args);
    CHECKF(rc == 0, "allreduce on sim exited %d: %s", rc, err);
    int on_devices = strstr(err, "NCCL on the devices") != NULL;
    printf("  allreduce on sim as it comes: summed on the %s\n", on_devices ? "devices" : "host");
    if (on_devices)
        CHECKF(!strstr(err, " pinned ") && !strstr(err, "pageable"),
               "summed on the devices, yet pinned: %s", err);
    else
        CHECKF(strstr(err, "Worker 0" PINNED_LINE) && strstr(err, "Worker 1" PINNED_LINE),
               "summed on the host, no pinned line for each worker: %s", err);

    rc = run_cmd(err, sizeof err,
                 "%s launch --chief --workers 1 --ps 1 -- train --strategy ps-async --device sim "
                 "%s --metrics %s/ps.jsonl",
                 bin, args, tmp);
    CHECKF(rc == 0, "ps-async on sim exited %d: %s", rc, err);
    CHECKF(strstr(err, "Worker 0" PINNED_LINE) && !strstr(err, "Chief pinned"),
           "only the worker pins: %s", err);
    snprintf(path, sizeof path, "%s/ps.jsonl", tmp);
    acc = done_accuracy(path);
    CHECKF(acc >= 0.5, "ps-async on sim: test accuracy %.4f", acc);
}

int main(void)
{
    make_split();
    sim_table();
    dmodel_pins();
    program_runs();
    return CHECK_DONE();
}
