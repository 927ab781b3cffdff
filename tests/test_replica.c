/* The model replica (replica.h) on the host and on sim, through the one
 * interface the loop and the strategies use: the same batches give the
 * same training on both, whether the state lives on the device (whole
 * steps, deferred figures) or on the host (host staging: grads, apply);
 * weights and a checkpoint's state come back; the host replica refuses
 * the device-only sums, and nothing on it is deferred. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "random_split.h"
#include "downpour/replica.h"
#include "downpour/rng.h"

#define RECORDS 256
#define DIM 784
#define BATCH 32
#define STEPS 5

static dp_split split;

static void make_split(void)
{
    static uint8_t images[RECORDS * DIM], labels[RECORDS];
    dp_rng rng;
    dp_rng_seed(&rng, 11);
    split = random_split(images, labels, RECORDS, DIM, &rng);
}

typedef struct side {
    dp_model m;
    dp_replica *r;
    dp_batcher b;
    double loss_sum;
    long correct;
} side;

static void side_open(side *s, const dp_device_spec *dev, const dp_optim_config *oc,
                      dp_replica_home home)
{
    dp_err err;
    REQUIRE(dp_model_init(&s->m, "784-64-10", BATCH, 1, &err) == 0);
    dp_model_init_params(&s->m, 7);
    dp_replica_config c = {.model = &s->m, .optim = oc, .device = dev, .train = &split,
                           .label = "Worker 0"};
    REQUIRE(dp_replica_open(&s->r, &c, &err) == 0);
    REQUIRE(dp_replica_settle(s->r, home, 0, NULL, &err) == 0);
    REQUIRE(dp_batcher_init(&s->b, &split, 3, 1, DP_SHARD_OFF, 0, 1, &err) == 0);
    dp_batcher_start_epoch(&s->b, 0);
    s->loss_sum = 0;
    s->correct = 0;
}

static void side_close(side *s)
{
    dp_batcher_free(&s->b);
    dp_replica_close(s->r);
    dp_model_free(&s->m);
}

/* One step through the interface: whole (fused) or grads then apply. */
static void side_step(side *s, float *x, uint8_t *y, int whole)
{
    dp_err err;
    int n = dp_replica_next_batch(s->r, &s->b, x, y, BATCH, &err);
    REQUIRE(n == BATCH);
    float loss = 0;
    int correct = 0, rc;
    if (whole) {
        rc = dp_replica_step(s->r, x, y, n, 0.05f, &loss, &correct, &err);
    } else {
        rc = dp_replica_grads(s->r, x, y, n, &loss, &correct, &err);
        CHECK(rc >= 0 && dp_replica_apply(s->r, 0.05f, &err) == 0);
    }
    CHECK(rc >= 0);
    if (rc == 0) {
        s->loss_sum += (double)loss * n;
        s->correct += correct;
    }
    CHECK(dp_replica_collect(s->r, &s->loss_sum, &s->correct, &err) == 0);
}

static double max_rel(const float *a, const float *b, size_t n)
{
    double e = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / (fabs((double)b[i]) + 1e-3);
        e = d > e ? d : e;
    }
    return e;
}

static void compare(dp_replica_home home, int whole)
{
    dp_device_spec cpu = {DP_DEVICE_CPU, 0}, sim = {DP_DEVICE_SIM, 0};
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_MOMENTUM);
    side h, d;
    side_open(&h, &cpu, &oc, DP_STATE_LOCAL);
    side_open(&d, &sim, &oc, home);
    CHECK(dp_replica_host_live(h.r) == 1);
    CHECK(dp_replica_host_live(d.r) == (home == DP_STATE_HOST));
    CHECK(dp_replica_no_augment(h.r) == NULL && dp_replica_no_augment(d.r) != NULL);
    float *x = malloc((size_t)BATCH * DIM * sizeof *x);
    uint8_t y[BATCH];
    REQUIRE(x);
    for (int k = 0; k < STEPS; k++) {
        side_step(&h, x, y, whole);
        side_step(&d, x, y, whole);
    }
    dp_err err;
    size_t n = h.m.n_params;
    const float *hw = dp_replica_weights(h.r, 0, &err), *dw = dp_replica_weights(d.r, 0, &err);
    REQUIRE(hw && dw);
    double e = max_rel(dw, hw, n);
    printf("  %s, %s: weights max error %.3g, loss %.6f / %.6f\n",
           home == DP_STATE_HOST ? "host staging" : "state on the device",
           whole ? "whole steps" : "grads + apply", e, d.loss_sum, h.loss_sum);
    CHECK(e < 1e-4);
    CHECK(fabs(d.loss_sum - h.loss_sum) < 1e-3 * h.loss_sum);
    CHECK(d.correct == h.correct);
    /* a checkpoint's state from the device, and back through the host */
    float *p = malloc(n * sizeof *p), *slots = malloc(n * sizeof *slots);
    long t = -1;
    REQUIRE(p && slots);
    CHECK(dp_replica_state(d.r, p, slots, 1, &t, NULL, &err) == 0);
    CHECK(t == STEPS && max_rel(p, hw, n) < 1e-4);
    CHECK(dp_replica_to_host(d.r, &err) == 0 && dp_replica_from_host(d.r, &err) == 0);
    CHECK(memcmp(dp_replica_weights(d.r, 0, &err), p, n * sizeof *p) == 0);
    free(p);
    free(slots);
    free(x);
    side_close(&h);
    side_close(&d);
}

static void test_host_refuses_sums(void)
{
    dp_device_spec cpu = {DP_DEVICE_CPU, 0};
    side h;
    side_open(&h, &cpu, NULL, DP_STATE_LOCAL);
    dp_err err;
    CHECK(dp_replica_can_sum(h.r) == 0);
    CHECK(dp_replica_sum_grads(h.r, &err) == -1 && strstr(err.msg, "no device"));
    CHECK(dp_replica_apply(h.r, 0.1f, &err) == -1 && strstr(err.msg, "no optimiser"));
    dp_replica_sum_abort(h.r); /* a no-op */
    side_close(&h);
}

int main(void)
{
    make_split();
    compare(DP_STATE_LOCAL, 1);
    compare(DP_STATE_LOCAL, 0);
    compare(DP_STATE_HOST, 0);
    test_host_refuses_sums();
    return CHECK_DONE();
}
