/* lcn on a device (its kind's device kernels, src/nn/layer_lcn.c, and the lcn
 * bodies in kernels.h, called through the layer table) through
 * the sim backend against the CPU's dp_lcn_forward / dp_lcn_backward: the
 * forward's output and the backward's input gradient must be the same bits,
 * since each kernel repeats lcn.c's float operations in lcn.c's order.
 * Geometries: one channel and several, a window wider than the map, a 1x1
 * map, a batch smaller than the keep's max_batch; inputs: random (the mean
 * and s both win somewhere), constant (s = 0: eps wins, nothing flows
 * through s) and half constant.  A backward run twice gives the same bits
 * (the forward's keep stays intact). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "device/backend.h"
#include "device/dexec.h"
#include "downpour/layer_kind.h"
#include "downpour/layers.h"
#include "downpour/model.h"
#include "downpour/rng.h"

static void *ctx;
static dp_rng rng;

static float *falloc(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof *p);
    REQUIRE(p);
    return p;
}

static int same_bits(const float *a, const float *b, size_t n, size_t *at)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof *a) != 0) {
            *at = i;
            return 0;
        }
    return 1;
}

enum { INPUT_RANDOM, INPUT_CONSTANT, INPUT_HALF, INPUT_COUNT };

static void fill(float *x, size_t n, int kind)
{
    for (size_t i = 0; i < n; i++) {
        float r = 4.0f * dp_rng_uniform(&rng) - 2.0f;
        x[i] = kind == INPUT_CONSTANT || (kind == INPUT_HALF && i < n / 2) ? 0.75f : r;
    }
}

/* One geometry: c channels of h x w, window n, batch of `batch` rows in a
 * keep sized for max_batch. */
static void check_case(int c, int h, int w, int n, int batch, int max_batch, int input)
{
    dp_layer L;
    memset(&L, 0, sizeof L);
    L.kind = DP_LAYER_LCN;
    REQUIRE(dp_window_init(&L.win, c, h, w, n, n, 1, n / 2) == 0);
    L.in = L.out = c * h * w;
    size_t len = (size_t)batch * L.in;
    float *x = falloc(len), *dout = falloc(len), *out_cpu = falloc(len), *out_dev = falloc(len);
    float *din_cpu = falloc(len), *din_dev = falloc(len), *din_again = falloc(len);
    float *keep_cpu = falloc((size_t)batch * dp_lcn_keep_floats(&L.win));
    const dp_layer_ops *o = dp_layer_table[DP_LAYER_LCN];
    float *keep_dev = falloc(o->dev_keep(&L, max_batch));
    fill(x, len, input);
    fill(dout, len, INPUT_RANDOM);
    dp_lcn_forward(out_cpu, keep_cpu, x, &L.win, batch);
    dp_lcn_backward(din_cpu, dout, keep_cpu, &L.win, batch);

    dp_dexec ex = {.be = &dp_backend_sim, .ctx = ctx};
    char msg[256];
    REQUIRE(o->dev_init(&ex, &L, keep_dev, max_batch) == 0);
    dp_layer_call call = {.d = &L, .batch = batch, .in = x, .out = out_dev, .keep = keep_dev,
                          .max_batch = max_batch, .dout = dout, .din = din_dev};
    o->dev_forward(&ex, &call);
    o->dev_backward(&ex, &call);
    call.din = din_again;
    o->dev_backward(&ex, &call);
    REQUIRE(dp_backend_sim.sync(ctx, msg, sizeof msg) == 0);

    static const char *const names[INPUT_COUNT] = {"random", "constant", "half constant"};
    size_t at = 0;
    CHECKF(same_bits(out_dev, out_cpu, len, &at),
           "lcn%d over %dx%dx%d, batch %d of %d, %s input: forward differs at %zu: %.9g, CPU "
           "%.9g",
           n, c, h, w, batch, max_batch, names[input], at, (double)out_dev[at],
           (double)out_cpu[at]);
    CHECKF(same_bits(din_dev, din_cpu, len, &at),
           "lcn%d over %dx%dx%d, batch %d of %d, %s input: backward differs at %zu: %.9g, CPU "
           "%.9g",
           n, c, h, w, batch, max_batch, names[input], at, (double)din_dev[at],
           (double)din_cpu[at]);
    CHECKF(same_bits(din_again, din_dev, len, &at), "lcn%d: a second backward differs at %zu",
           n, at);
    int moved = 0;
    for (size_t i = 0; i < len; i++)
        moved |= din_dev[i] != 0.0f;
    CHECKF(moved || input == INPUT_CONSTANT || len == (size_t)batch * c,
           "lcn%d over %dx%dx%d: the gradient is all zeros", n, c, h, w);
    free(x), free(dout), free(out_cpu), free(out_dev), free(din_cpu), free(din_dev);
    free(din_again), free(keep_cpu), free(keep_dev);
}

int main(void)
{
    char msg[256];
    dp_rng_seed(&rng, 2009);
    REQUIRE(dp_backend_sim.open(&ctx, 0, msg, sizeof msg) == 0);
    static const int geo[][4] = {/* c, h, w, n */
                                 {1, 28, 28, 5}, {1, 12, 12, 3}, {3, 7, 9, 3}, {4, 5, 6, 7},
                                 {16, 6, 5, 5},  {2, 1, 1, 3},   {5, 9, 4, 1}};
    int cases = 0;
    for (size_t g = 0; g < sizeof geo / sizeof geo[0]; g++)
        for (int input = 0; input < INPUT_COUNT; input++) {
            check_case(geo[g][0], geo[g][1], geo[g][2], geo[g][3], 3, 5, input);
            cases++;
        }
    check_case(1, 28, 28, 5, 1, 1, INPUT_RANDOM); /* batch = max_batch = 1 */
    printf("lcn: %d cases, forward and backward bit for bit with the CPU's\n", cases + 1);
    dp_backend_sim.close(ctx);
    return CHECK_DONE();
}
