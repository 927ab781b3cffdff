/* Residual blocks (docs/models.md, "Residual blocks"; docs/architecture.md,
 * "Residual blocks"):
 *   grammar: resnet-fashion's layers, counts and canonical spelling, which
 *     parses back to itself; refusals naming the block and both shapes;
 *   gradients: whole models with identity and projection shortcuts (odd
 *     sizes, a stride, batch norm and dense blocks) against finite
 *     differences;
 *   ranges: forward and backward cut at any one or two block boundaries
 *     give the whole model's loss, gradients and input gradient bit for bit,
 *     and a range that starts or ends inside a block is refused;
 *   the fused update equals backprop then the optimiser, bit for bit, and
 *     grad_ready tells each parameter layer once, last first;
 *   evaluation (running statistics) through blocks gives the training
 *     forward's loss once the statistics have settled on the batch;
 *   model parallelism refuses a residual model naming the layer and the
 *     reason (the device trains it: tests/test_device_model.c);
 *   resnet-fashion after a step round-trips a checkpoint bit for bit, its
 *     tensors named as docs/models.md's PyTorch module loads them. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "downpour/checkpoint.h"
#include "downpour/model.h"
#include "downpour/optim.h"
#include "downpour/rng.h"
#include "downpour/safetensors.h"
#include "exec/mp_slice.h"
#include "model_fd.h"
#include "checkpoint_trip.h"
#include "scratch.h"

static dp_rng rng;

static void fill(float *p, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        p[i] = lo + (hi - lo) * dp_rng_uniform(&rng);
}

/* Small residual models: an image one (identity and projection shortcuts,
 * a stride, odd sizes, batch norm) and a flat one of dense layers. */
static const char *const small[] = {
    "1x7x7-conv3x3x4p1-relu-res(conv3x3x4p1-bn-relu-conv3x3x4p1-bn)-relu"
    "-res(conv3x3x6s2p1-bn-relu-conv3x3x6p1|conv1x1x6s2-bn)-relu-gap-3",
    "10-res(7-dense10)-res(dense6-relu-dense6|dense6)-relu-4",
};

static void test_grammar(void)
{
    dp_model m, again;
    dp_err err;
    REQUIRE(dp_model_init(&m, "resnet-fashion", 2, 1, &err) == 0);
    CHECKF(m.n_dense == 31 && m.n_layers == 52, "resnet-fashion: %d parameter layers, %d layers",
           m.n_dense, m.n_layers);
    printf("resnet-fashion: %zu parameters, %zu buffer floats, %d layers, spec %zu chars\n",
           m.n_params, m.n_buffers, m.n_layers, strlen(m.spec));
    CHECK(m.n_params == 175530 && m.n_buffers == 1135);
    int blocks = 0, projections = 0;
    for (int l = 0; l < m.n_layers; l++) {
        blocks += m.layers[l].kind == DP_LAYER_RES;
        projections += (m.layers[l].res & DP_RES_SHORTCUT) != 0;
    }
    CHECK(blocks == 6 && projections == 2);
    /* the canonical spelling parses back to itself */
    REQUIRE(dp_model_init(&again, m.spec, 2, 1, &err) == 0);
    CHECKF(strcmp(again.spec, m.spec) == 0, "%s\n%s", again.spec, m.spec);
    CHECK(again.n_params == m.n_params && again.n_layers == m.n_layers);
    dp_model_free(&again);
    dp_model_free(&m);
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) {
        REQUIRE(dp_model_init(&m, small[i], 2, 1, &err) == 0);
        CHECKF(strcmp(m.spec, small[i]) == 0, "canonical %s of %s", m.spec, small[i]);
        dp_model_free(&m);
    }

    static const struct {
        const char *spec, *want[3];
    } bad[] = {
        {"1x8x8-res(conv3x3x4p1)-10", {"'res(conv3x3x4p1)'", "4x8x8", "1x8x8"}},
        {"1x8x8-conv3x3x4p1-res(conv3x3x4s2p1|conv1x1x4)-10",
         {"'res(conv3x3x4s2p1|conv1x1x4)'", "4x4x4", "4x8x8"}},
        {"10-res(dense6)-4", {"res(dense6)", "6 features", "10 features"}},
        {"10-res(dense10-res(dense10))-4", {"nested", "", ""}},
        {"10-res(dense10-4", {"without its ')'", "", ""}},
        {"10-res()-4", {"empty", "", ""}},
        {"10-res(dense10|)-4", {"empty", "", ""}},
        {"10-res(dense10|dense10|dense10)-4", {"second '|'", "", ""}},
        {"10-res(dense10)", {"last layer must be dense", "", ""}},
        {"10-dense10)-4", {"without its res(", "", ""}},
        {"10-dense10|dense10-4", {"outside a res(", "", ""}},
        {"10-relu(dense10)-4", {"unexpected '('", "", ""}},
        {"10-res(dense10)relu-4", {"expected '-' after ')'", "", ""}},
        /* a long spec is quoted in part: the block and both shapes still fit */
        {"1x28x28-conv3x3x16p1-bn-relu-res(conv3x3x16p1-bn-relu-conv3x3x16p1-bn)-relu"
         "-res(conv3x3x16p1-bn-relu-conv3x3x16p1-bn)-relu"
         "-res(conv3x3x16p1-bn-relu-conv3x3x16p1-bn)-relu"
         "-res(conv3x3x16p1-bn-relu-conv3x3x16p1-bn)-relu"
         "-res(conv3x3x16p1-bn-relu-conv3x3x16p1-bn-relu-conv3x3x16p1-bn-relu-conv3x3x16p1-bn"
         "|conv1x1x16s2-bn)-relu-gap-10",
         {"...': token 29 'res(conv3x3x16p1", "16x28x28", "16x14x14"}},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err.msg[0] = 0;
        CHECKF(dp_model_init(&m, bad[i].spec, 2, 1, &err) < 0, "%s was accepted", bad[i].spec);
        for (int k = 0; k < 3; k++)
            CHECKF(strstr(err.msg, bad[i].want[k]) != NULL, "%s: '%s' not in: %s", bad[i].spec,
                   bad[i].want[k], err.msg);
        CHECK(m.params == NULL);
    }
}

/* Smooth twins of small[] for finite differences: a relu's kink under the
 * 1e-2 step costs as much error as a bug (a plain conv-bn-relu stack is off
 * by 5e-2), tanh has none. */
static const char *const smooth[] = {
    "1x7x7-conv3x3x4p1-tanh-res(conv3x3x4p1-bn-tanh-conv3x3x4p1-bn)-tanh"
    "-res(conv3x3x6s2p1-bn-tanh-conv3x3x6p1|conv1x1x6s2-bn)-tanh-gap-3",
    "10-res(dense7-tanh-dense10)-res(dense6-tanh-dense6|dense6)-tanh-4",
};

static void test_gradients(void)
{
    const int batch = 5;
    for (size_t i = 0; i < sizeof smooth / sizeof smooth[0]; i++) {
        dp_model m;
        dp_err err;
        REQUIRE(dp_model_init(&m, smooth[i], batch, 1, &err) == 0);
        dp_model_init_params(&m, 7);
        for (int l = 0; l < m.n_layers; l++) /* gamma and beta off 1 and 0 */
            if (m.layers[l].kind == DP_LAYER_BATCHNORM)
                fill(m.params + m.layers[l].w_off, 2 * m.layers[l].w_len, 0.5f, 1.5f);
        size_t nx = (size_t)batch * dp_model_inputs(&m);
        float *x = malloc(nx * sizeof *x);
        uint8_t y[8];
        REQUIRE(x);
        fill(x, nx, -1, 1);
        for (int k = 0; k < batch; k++)
            y[k] = (uint8_t)(k % dp_model_classes(&m));
        double worst = model_fd_worst(&m, x, y, batch);
        CHECKF(worst < 1e-2, "%s: gradient error %.2e", smooth[i], worst);
        printf("%s: whole-model gradient within %.1e of finite differences\n", smooth[i], worst);
        free(x);
        dp_model_free(&m);
    }
}

/* The loss, gradients and input gradient of the ranges [0, c0), [c0, c1),
 * [c1, L) (c0 == c1: two ranges), after the model's buffers are reset. */
static float run_ranges(dp_model *m, const float *x, const uint8_t *y, int batch, int c0, int c1,
                        float *grads, float *dx)
{
    static float mid[2][64 * 512], dmid[2][64 * 512];
    int L = m->n_layers;
    int cut[4] = {0, c0, c1, L}, n = 0, at[4];
    for (int k = 0; k < 4; k++)
        if (k == 0 || cut[k] != at[n - 1])
            at[n++] = cut[k];
    const float *in[4] = {x};
    for (int r = 0; r + 2 < n; r++) { /* every range but the last */
        const float *o = dp_model_forward_range(m, 0, m->params, in[r], at[r], at[r + 1], batch);
        REQUIRE(o);
        size_t len = (size_t)batch * m->layers[at[r + 1] - 1].out;
        REQUIRE(len <= sizeof mid[0] / sizeof(float));
        memcpy(mid[r], o, len * sizeof *o);
        in[r + 1] = mid[r];
    }
    float loss = dp_model_forward_range_loss(m, 0, m->params, in[n - 2], y, at[n - 2], batch, NULL);
    float *dnext = n - 2 > 0 ? dmid[(n - 2) % 2] : dx;
    REQUIRE(dp_model_backward_range_loss(m, 0, dnext, grads, m->params, in[n - 2], y, at[n - 2],
                                         batch) == 0);
    for (int r = n - 3; r >= 0; r--) {
        float *d = r > 0 ? dmid[r % 2] : dx;
        REQUIRE(dp_model_backward_range(m, 0, d, grads, m->params, dnext, in[r], at[r], at[r + 1],
                                        batch) == 0);
        dnext = d;
    }
    return loss;
}

static void test_ranges(void)
{
    const int batch = 3;
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) {
        dp_model m;
        dp_err err;
        REQUIRE(dp_model_init(&m, small[i], batch, 1, &err) == 0);
        dp_model_init_params(&m, 11);
        int L = m.n_layers;
        size_t nx = (size_t)batch * dp_model_inputs(&m);
        float *x = malloc(nx * sizeof *x), *dx0 = malloc(nx * sizeof *x),
              *dx = malloc(nx * sizeof *x), *g0 = malloc(m.n_params * sizeof *g0),
              *g = malloc(m.n_params * sizeof *g);
        float *b0 = malloc((m.n_buffers + 1) * sizeof *b0);
        uint8_t y[4] = {0, 1, 2, 1};
        REQUIRE(x && dx0 && dx && g0 && g && b0);
        fill(x, nx, -1, 1);
        if (m.n_buffers)
            memcpy(b0, m.buffers, m.n_buffers * sizeof *b0);
        float whole = run_ranges(&m, x, y, batch, L, L, g0, dx0);
        int checked = 0;
        for (int c0 = 1; c0 < L; c0++)
            for (int c1 = c0; c1 < L; c1++) {
                if (!dp_model_cut_ok(&m, c0) || !dp_model_cut_ok(&m, c1))
                    continue;
                if (m.n_buffers)
                    memcpy(m.buffers, b0, m.n_buffers * sizeof *b0);
                memset(g, 0, m.n_params * sizeof *g);
                float loss = run_ranges(&m, x, y, batch, c0, c1, g, dx);
                CHECKF(memcmp(&loss, &whole, sizeof loss) == 0 &&
                           memcmp(g, g0, m.n_params * sizeof *g) == 0 &&
                           memcmp(dx, dx0, nx * sizeof *dx) == 0,
                       "%s cut at %d, %d: not the whole model's bits", small[i], c0, c1);
                checked++;
            }
        /* the whole-model call gives the same gradients */
        if (m.n_buffers)
            memcpy(m.buffers, b0, m.n_buffers * sizeof *b0);
        float fb = dp_model_forward_backward(&m, x, y, batch, NULL);
        CHECK(memcmp(&fb, &whole, sizeof fb) == 0 &&
              memcmp(m.grads, g0, m.n_params * sizeof *g) == 0);
        /* ranges that start or end inside a block are refused */
        int refused = 0;
        for (int c = 1; c < L; c++) {
            if (dp_model_cut_ok(&m, c))
                continue;
            CHECK(dp_model_forward_range(&m, 0, m.params, x, 0, c, batch) == NULL);
            CHECK(dp_model_backward_range(&m, 0, dx, g, m.params, x, x, c, L - 1, batch) == -1);
            refused++;
        }
        CHECK(refused > 0 && checked > 3);
        printf("%s: %d cuts at block boundaries equal the whole model; %d cuts inside blocks "
               "refused\n", small[i], checked, refused);
        free(x), free(dx0), free(dx), free(g0), free(g), free(b0);
        dp_model_free(&m);
    }
}

static size_t told[64];
static int n_told;
static void on_ready(void *ctx, size_t lo)
{
    (void)ctx;
    if (n_told < 64)
        told[n_told++] = lo;
}

/* The fused update and grad_ready on a residual model. */
static void test_fused_update(void)
{
    const int batch = 4;
    dp_model a, b;
    dp_err err;
    const char *spec = small[0];
    REQUIRE(dp_model_init(&a, spec, batch, 1, &err) == 0 &&
            dp_model_init(&b, spec, batch, 1, &err) == 0);
    dp_model_init_params(&a, 3);
    dp_model_init_params(&b, 3);
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_ADAM);
    oc.lr = 0.01f;
    dp_optim oa, ob;
    REQUIRE(dp_optim_init(&oa, &oc, a.n_params, &err) == 0 &&
            dp_optim_init(&ob, &oc, b.n_params, &err) == 0);
    float x[4 * 49];
    uint8_t y[4] = {0, 1, 2, 0};
    fill(x, sizeof x / sizeof *x, -1, 1);
    a.grad_ready = on_ready;
    for (int s = 0; s < 3; s++) {
        n_told = 0;
        float la = dp_model_forward_backward(&a, x, y, batch, NULL);
        dp_optim_apply(&oa, a.params, a.grads, oc.lr);
        float lb = dp_model_train_step(&b, &ob, x, y, batch, oc.lr, NULL);
        CHECK(memcmp(&la, &lb, sizeof la) == 0);
        CHECK(memcmp(a.params, b.params, a.n_params * sizeof(float)) == 0);
        CHECK(memcmp(a.buffers, b.buffers, a.n_buffers * sizeof(float)) == 0);
        CHECKF(n_told == a.n_dense, "grad_ready told %d times for %d layers", n_told, a.n_dense);
        for (int k = 1; k < n_told; k++)
            CHECK(told[k] < told[k - 1]);
        CHECK(n_told > 0 && told[n_told - 1] == 0);
    }
    dp_optim_free(&oa), dp_optim_free(&ob);
    dp_model_free(&a), dp_model_free(&b);
}

/* Evaluation through blocks: once the running statistics have settled on
 * one batch (200 training forwards of it), evaluating that batch gives the
 * training forward's loss but for the unbiased variance's R/(R-1). */
static void test_eval(void)
{
    const int batch = 16;
    dp_model m;
    dp_err err;
    REQUIRE(dp_model_init(&m, small[0], batch, 1, &err) == 0);
    dp_model_init_params(&m, 5);
    float x[16 * 49];
    uint8_t y[16];
    fill(x, sizeof x / sizeof *x, -1, 1);
    for (int k = 0; k < batch; k++)
        y[k] = (uint8_t)(k % 3);
    float train = 0;
    for (int k = 0; k < 200; k++)
        train = dp_model_forward_range_loss(&m, 0, m.params, x, y, 0, batch, NULL);
    float eval = dp_model_forward(&m, m.params, x, y, batch, NULL);
    CHECKF(fabsf(eval - train) < 0.02f * train, "evaluation loss %g, training %g", eval, train);
    printf("evaluation through blocks: loss %.5f, training forward %.5f\n", eval, train);
    dp_model_free(&m);
}

static void test_refusals(void)
{
    dp_model m;
    dp_err err;
    REQUIRE(dp_model_init(&m, small[1], 4, 1, &err) == 0);
    mp_plan p;
    CHECK(mp_plan_make(&p, &m, 2, 0, &err) < 0);
    CHECKF(strstr(err.msg, "res") && strstr(err.msg, "shortcut"), "%s", err.msg);
    printf("model parallel: %s\n", err.msg);
    dp_model_free(&m);
}

/* resnet-fashion's checkpoint: parameters and moved buffers back bit for
 * bit, under the names and shapes docs/models.md gives. */
static void test_checkpoint(void)
{
    dp_model m, back;
    dp_err err;
    REQUIRE(dp_model_init(&m, "resnet-fashion", 2, 1, &err) == 0);
    dp_model_init_params(&m, 9);
    float x[2 * 784];
    uint8_t y[2] = {3, 7};
    fill(x, 2 * 784, 0, 1);
    dp_model_forward_backward(&m, x, y, 2, NULL); /* moves the running statistics */
    checkpoint_trip t;
    dp_safetensors *f = checkpoint_trip_write(&t, "resblock", &m, 1);
    CHECK(dp_safetensors_count(f) == 31 * 2 + 15 * 3); /* 15 conv, 15 bn, 1 dense */
    static const checkpoint_want want[] = {
        {"layers.0.weight", 4, {16, 1, 3, 3}},  {"layers.1.running_var", 1, {16}},
        {"layers.10.weight", 4, {32, 16, 3, 3}}, {"layers.14.weight", 4, {32, 16, 1, 1}},
        {"layers.15.running_mean", 1, {32}},    {"layers.24.weight", 4, {64, 32, 1, 1}},
        {"layers.29.num_batches_tracked", 0, {0}}, {"layers.30.weight", 2, {10, 64}},
    };
    checkpoint_trip_shapes(&t, want, sizeof want / sizeof want[0]);
    CHECK(dp_safetensors_find(f, "layers.31.weight") == NULL);
    checkpoint_trip_back(&t, &m, 2, &back);
    CHECK(strcmp(back.name, "resnet-fashion") == 0 && strcmp(back.spec, m.spec) == 0);
    dp_model_free(&back);
    dp_model_free(&m);
}

int main(void)
{
    dp_rng_seed(&rng, 5);
    test_grammar();
    test_gradients();
    test_ranges();
    test_fused_update();
    test_eval();
    test_refusals();
    test_checkpoint();
    return CHECK_DONE();
}
