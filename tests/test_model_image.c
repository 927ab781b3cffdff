/* Models of image layers: the --model grammar (shapes, canonical spelling,
 * refusals naming the token), the whole model's gradient against finite
 * differences, ranges and chunked lowering against the whole batch, dropout's
 * masks, and checkpoints in PyTorch's layouts. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "downpour/blas.h"
#include "downpour/checkpoint.h"
#include "downpour/model.h"
#include "downpour/rng.h"
#include "downpour/safetensors.h"
#include "scratch.h"

static char scratch[512];

static void random_params(dp_model *m, uint64_t seed)
{
    dp_model_init_params(m, seed);
    dp_rng r;
    dp_rng_seed(&r, seed + 99);
    for (int l = 0; l < m->n_layers; l++) /* biases off zero, so they matter */
        for (size_t k = 0; k < m->layers[l].b_len; k++)
            m->params[m->layers[l].b_off + k] = 0.2f * (dp_rng_uniform(&r) - 0.5f);
}

static void random_batch(const dp_model *m, float *x, uint8_t *y, int batch, uint64_t seed)
{
    dp_rng r;
    dp_rng_seed(&r, seed);
    for (int k = 0; k < batch * dp_model_inputs(m); k++)
        x[k] = dp_rng_uniform(&r);
    for (int k = 0; k < batch; k++)
        y[k] = (uint8_t)dp_rng_below(&r, (uint32_t)dp_model_classes(m));
}

/* ---- the grammar ---------------------------------------------------------- */

static void test_cnn_mnist(void)
{
    dp_model m;
    dp_err err = {{0}};
    REQUIRE(dp_model_init(&m, "cnn-mnist", 4, 1, &err) == 0);
    CHECK(strcmp(m.name, "cnn-mnist") == 0);
    CHECK(strcmp(m.spec, "1x28x28-conv5x5x32-relu-maxpool2-conv5x5x64-relu-maxpool2-128-10") == 0);
    const dp_layer_kind kinds[] = {DP_LAYER_CONV,    DP_LAYER_RELU,    DP_LAYER_MAXPOOL,
                                   DP_LAYER_CONV,    DP_LAYER_RELU,    DP_LAYER_MAXPOOL,
                                   DP_LAYER_FLATTEN, DP_LAYER_DENSE,   DP_LAYER_RELU,
                                   DP_LAYER_DENSE,   DP_LAYER_SOFTMAX_XENT};
    REQUIRE(m.n_layers == 11);
    for (int l = 0; l < 11; l++)
        CHECKF(m.layers[l].kind == kinds[l], "layer %d is %s", l,
               dp_layer_kind_name(m.layers[l].kind));
    const dp_layer *L = m.layers;
    CHECK(L[0].c == 1 && L[0].h == 28 && L[0].w == 28 && L[0].oc == 32 && L[0].oh == 24);
    CHECK(L[2].oh == 12 && L[2].ow == 12 && L[2].oc == 32);
    CHECK(L[3].oc == 64 && L[3].oh == 8 && L[5].oh == 4 && L[6].out == 1024);
    CHECK(L[7].in == 1024 && L[7].out == 128 && L[9].out == 10);
    CHECK(L[0].w_off == 0 && L[0].w_len == 32 * 25 && L[0].b_len == 32);
    CHECK(L[3].w_off == L[0].b_off + 32 && L[3].w_len == 64 * 5 * 5 * 32);
    CHECK(m.n_params == 832 + 51264 + 131200 + 1290);
    CHECK(m.n_dense == 4);
    CHECK(dp_model_inputs(&m) == 784 && dp_model_classes(&m) == 10 && dp_model_is_image(&m));
    CHECK(dp_model_check_input(&m, 28, 28, 1, "mnist", &err) == 0);
    CHECK(dp_model_check_input(&m, 32, 32, 1, "other", &err) == -1);
    CHECK(strstr(err.msg, "1x28x28") && strstr(err.msg, "1x32x32"));
    /* several channels stored HWC: refused for an image model, saying why */
    CHECK(dp_model_check_input(&m, 28, 28, 3, "rgb", &err) == -1 && strstr(err.msg, "HWC"));
    dp_model_free(&m);

    REQUIRE(dp_model_init(&m, "distbelief-image", 4, 1, &err) == 0);
    int lcn = 0, local = 0;
    for (int l = 0; l < m.n_layers; l++) {
        lcn += m.layers[l].kind == DP_LAYER_LCN;
        local += m.layers[l].kind == DP_LAYER_LOCAL;
    }
    CHECK(lcn == 2 && local == 2);
    CHECK(m.layers[0].w_len == (size_t)24 * 24 * 16 * 25); /* untied: a filter per position */
    dp_model_free(&m);

    /* the legacy grammar is unchanged */
    REQUIRE(dp_model_init(&m, "784-300-100-10", 4, 1, &err) == 0);
    CHECK(!dp_model_is_image(&m) && m.n_layers == 6);
    CHECK(dp_model_check_input(&m, 28, 28, 1, "mnist", &err) == 0);
    /* a flat model takes every value of a record: 14x14 pixels of 4 channels */
    CHECK(dp_model_check_input(&m, 14, 14, 4, "rgba", &err) == 0);
    CHECK(dp_model_check_input(&m, 28, 28, 3, "rgb", &err) == -1 && strstr(err.msg, "28x28x3"));
    dp_model_free(&m);
}

static void test_spellings(void)
{
    const struct {
        const char *spec, *canonical;
        int layers, in, out;
    } ok[] = {
        {"1x28x28-128-10", "1x28x28-128-10", 4, 784, 10},
        {"1x8x8-conv3x3x4s1p0-relu-maxpool2s2-10", "1x8x8-conv3x3x4-relu-maxpool2-10", 6, 64, 10},
        {"1x9x9-conv3x3x2s2p1-avgpool3x2s1-lcn03-dropout0.25-dense7-relu-3",
         "1x9x9-conv3x3x2s2p1-avgpool3x2s1-lcn3-dropout0.25-dense7-relu-3", 9, 81, 3},
        /* several channels: NHWC before the first image layer, CHW again at the dense */
        {"3x6x6-conv3x3x2-flatten-5", "3x6x6-conv3x3x2-flatten-5", 5, 108, 5},
        {"3x6x6-local2x2x1p1-flatten-5", "3x6x6-local2x2x1p1-flatten-5", 4, 108, 5},
        {"3x6x6-local2x2x2p1-5", "3x6x6-local2x2x2p1-5", 5, 108, 5},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        dp_model m;
        dp_err err = {{0}};
        int rc = dp_model_init(&m, ok[i].spec, 2, 1, &err);
        CHECKF(rc == 0, "'%s': %s", ok[i].spec, err.msg);
        if (rc)
            continue;
        CHECKF(strcmp(m.spec, ok[i].canonical) == 0, "'%s' spelled '%s'", ok[i].spec, m.spec);
        CHECKF(m.n_layers == ok[i].layers, "'%s': %d layers", ok[i].spec, m.n_layers);
        CHECK(dp_model_inputs(&m) == ok[i].in && dp_model_classes(&m) == ok[i].out);
        if (ok[i].spec[0] == '3' && ok[i].layers == 5) {
            CHECK(m.layers[0].kind == DP_LAYER_HWC);
            CHECK(m.layers[m.n_layers - 3].kind == DP_LAYER_FLATTEN);
        }
        dp_model_free(&m);
    }
}

static void test_bad_image_specs(void)
{
    const struct {
        const char *spec, *token, *why;
    } bad[] = {
        {"1x4x4-conv5x5x2-10", "conv5x5x2", "larger than its 4x4 input"}, /* kernel > input */
        {"1x28x28-conv3x3x0-10", "conv3x3x0", "output channels"},        /* zero channels */
        {"0x28x28-conv3x3x2-10", "0x28x28", "input"},                    /* zero input channels */
        {"1x28x28-pool2-10", "pool2", "unknown layer"},                  /* unknown layer */
        {"1x28x28-conv3x3x2-relu", "relu", "last layer must be dense"},
        {"784-conv3x3x2-10", "conv3x3x2", "needs an image"},
        {"1x28x28-128-conv3x3x2-10", "conv3x3x2", "flat vector"},
        {"1x28x28-conv3x3x2p3-10", "conv3x3x2p3", "padding 3"},
        {"1x28x28-conv3x3x2s0-10", "conv3x3x2s0", "stride"},
        {"1x28x28-conv3x3-10", "conv3x3", "KHxKWxC"},
        {"1x28x28-conv3x3x2t1-10", "conv3x3x2t1", "unexpected 't1'"},
        {"1x28x28-maxpool2x-10", "maxpool2x", "window"},
        {"1x28x28-maxpool30-10", "maxpool30", "larger"},
        {"1x28x28-lcn4-10", "lcn4", "odd"},
        {"1x28x28-dropout1-10", "dropout1", "[0, 1)"},
        {"1x28x28-dropout-10", "dropout", "[0, 1)"},
        {"1x28x28-reluu-10", "reluu", "unknown layer"},
        {"1x28-10", "1x28", "CxHxW"},
        {"1x28x28x2-10", "1x28x28x2", "CxHxW"},
        {"1x99999x99999-10", "1x99999x99999", "CxHxW"},
        {"1x28x28-conv3x3x20000-10", "conv3x3x20000", "output channels"},
        {"1x2000x2000-conv3x3x20-10", "conv3x3x20", "features per sample"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dp_model m;
        dp_err err = {{0}};
        CHECKF(dp_model_init(&m, bad[i].spec, 2, 1, &err) == -1, "'%s' accepted", bad[i].spec);
        CHECKF(strstr(err.msg, bad[i].spec) && strstr(err.msg, bad[i].token) &&
                   strstr(err.msg, bad[i].why),
               "'%s': message '%s' should name '%s' and say '%s'", bad[i].spec, err.msg,
               bad[i].token, bad[i].why);
        CHECK(m.params == NULL);
        dp_model_free(&m);
    }
}

/* ---- the whole model against finite differences ----------------------------- */

/* The mean loss of one batch with params, in training mode (dropout on, with
 * the mask of seed's first forward). */
static double loss_at(dp_model *m, const float *params, const float *x, const uint8_t *y,
                      int batch)
{
    dp_model_seed_dropout(m, 5);
    return dp_model_forward_range_loss(m, 0, params, x, y, 0, batch, NULL);
}

static double central_difference(dp_model *m, size_t k, double h, const float *x,
                                 const uint8_t *y, int batch)
{
    float save = m->params[k];
    m->params[k] = save + (float)h;
    double lp = loss_at(m, m->params, x, y, batch);
    m->params[k] = save - (float)h;
    double lm = loss_at(m, m->params, x, y, batch);
    m->params[k] = save;
    return (lp - lm) / (2 * h);
}

/* Every parameter layer's gradient against central differences of the
 * float loss at a sample of its parameters (the kernels themselves are
 * checked in double precision by test_spatial_grad). */
static void check_model_gradient(const char *spec, int batch, uint64_t seed)
{
    dp_model m;
    dp_err err = {{0}};
    REQUIRE(dp_model_init(&m, spec, batch, 1, &err) == 0);
    random_params(&m, seed);
    float x[4096];
    uint8_t y[64];
    REQUIRE((size_t)batch * dp_model_inputs(&m) <= sizeof x / sizeof x[0]);
    random_batch(&m, x, y, batch, seed + 1);
    dp_model_seed_dropout(&m, 5);
    float loss = dp_model_forward_backward(&m, x, y, batch, NULL);
    CHECK(isfinite(loss) && loss > 0);
    CHECK(fabs(loss - loss_at(&m, m.params, x, y, batch)) < 1e-6);

    dp_rng r;
    dp_rng_seed(&r, seed + 2);
    int checked = 0, bad = 0;
    for (int l = 0; l < m.n_layers; l++) {
        const dp_layer *d = &m.layers[l];
        size_t n = d->w_len + d->b_len;
        for (int t = 0; t < 12 && n; t++) {
            size_t k = d->w_off + dp_rng_below(&r, (uint32_t)n);
            double ana = m.grads[k], num = 0;
            bool ok = false;
            /* a relu, a max or lcn's max(mean, s) may switch within a step:
             * a smaller step then agrees */
            for (double h = 1e-2; h >= 1e-3 && !ok; h /= 3.3) {
                num = central_difference(&m, k, h, x, y, batch);
                ok = fabs(num - ana) <= 2e-3 + 5e-2 * fabs(num);
            }
            checked++;
            if (!ok) {
                bad++;
                fprintf(stderr, "%s: layer %d (%s) param %zu: analytic %.6g, numeric %.6g\n",
                        spec, l, dp_layer_kind_name(d->kind), k - d->w_off, ana, num);
            }
        }
    }
    CHECKF(bad == 0, "%s: %d of %d gradients off", spec, bad, checked);
    dp_model_free(&m);
}

/* ---- ranges, chunks and threads give the same numbers ------------------------ */

static int same(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof *a) == 0;
}

/* Every cut k: forward [0,k) then [k,n) with the loss, backward likewise,
 * equals the whole model's forward_backward bit for bit. */
static void check_ranges(const char *spec, int batch)
{
    dp_model m;
    dp_err err = {{0}};
    REQUIRE(dp_model_init(&m, spec, batch, 2, &err) == 0);
    random_params(&m, 3);
    static float x[64 * 784], whole[300000], din[64 * 4096];
    static uint8_t y[64];
    REQUIRE(m.n_params <= sizeof whole / sizeof whole[0]);
    random_batch(&m, x, y, batch, 4);
    dp_model_seed_dropout(&m, 9);
    float loss = dp_model_forward_backward(&m, x, y, batch, NULL);
    memcpy(whole, m.grads, m.n_params * sizeof(float));
    for (int k = 1; k < m.n_layers; k++) {
        memset(m.grads, 0xff, m.n_params * sizeof(float)); /* NaN: every float must be written */
        dp_model_seed_dropout(&m, 9);
        const float *mid = dp_model_forward_range(&m, 1, m.params, x, 0, k, batch);
        REQUIRE(mid != NULL);
        float l2 = dp_model_forward_range_loss(&m, 1, m.params, mid, y, k, batch, NULL);
        REQUIRE((size_t)batch * m.layers[k].in <= sizeof din / sizeof din[0]);
        CHECK(dp_model_backward_range_loss(&m, 1, din, m.grads, m.params, mid, y, k, batch) == 0);
        CHECK(dp_model_backward_range(&m, 1, NULL, m.grads, m.params, din, x, 0, k, batch) == 0);
        CHECKF(l2 == loss, "%s cut %d: loss %.9g vs %.9g", spec, k, l2, loss);
        CHECKF(same(m.grads, whole, m.n_params), "%s cut %d (%s | %s): gradients differ", spec,
               k, dp_layer_kind_name(m.layers[k - 1].kind), dp_layer_kind_name(m.layers[k].kind));
    }
    dp_model_free(&m);
}

/* cnn-mnist lowers its convolutions 72 and 20 samples at a time: a batch of
 * 100 in chunks has the gradient of its two halves' mean. */
static void check_chunks(void)
{
    enum { B = 100 };
    dp_model m;
    dp_err err = {{0}};
    REQUIRE(dp_model_init(&m, "cnn-mnist", B, 1, &err) == 0);
    CHECK(m.layers[0].chunk < B && m.layers[3].chunk < B); /* the test needs chunks */
    random_params(&m, 11);
    static float x[B * 784], g[200000], half[200000];
    static uint8_t y[B];
    REQUIRE(m.n_params <= sizeof g / sizeof g[0]);
    random_batch(&m, x, y, B, 12);
    float loss = dp_model_forward_backward(&m, x, y, B, NULL);
    memcpy(g, m.grads, m.n_params * sizeof(float));
    float l1 = dp_model_forward_backward(&m, x, y, B / 2, NULL);
    memcpy(half, m.grads, m.n_params * sizeof(float));
    float l2 = dp_model_forward_backward(&m, x + (size_t)(B / 2) * 784, y + B / 2, B / 2, NULL);
    CHECK(fabsf(loss - (l1 + l2) / 2) < 1e-5f * fabsf(loss));
    double worst = 0;
    for (size_t i = 0; i < m.n_params; i++) {
        double want = 0.5 * ((double)half[i] + m.grads[i]);
        double e = fabs(g[i] - want) / (1e-4 + fabs(want));
        worst = e > worst ? e : worst;
    }
    CHECKF(worst < 1e-3, "chunked gradient vs halves: worst relative error %.3g", worst);

    /* a thread count gives the same bits every time; another count the same
     * numbers but for the products' rounding (each block of a product is
     * summed in OpenBLAS's order for that block's shape) */
    dp_blas_set_threads(2);
    dp_model_forward_backward(&m, x, y, B, NULL);
    memcpy(half, m.grads, m.n_params * sizeof(float));
    dp_model_forward_backward(&m, x, y, B, NULL);
    CHECK(same(half, m.grads, m.n_params));
    dp_blas_set_threads(1);
    dp_model_forward_backward(&m, x, y, B, NULL);
    worst = 0;
    for (size_t i = 0; i < m.n_params; i++) {
        double e = fabs(half[i] - m.grads[i]) / (1e-4 + fabs(half[i]));
        worst = e > worst ? e : worst;
    }
    CHECKF(worst < 1e-3, "1 vs 2 threads: worst relative difference %.3g", worst);
    dp_blas_set_threads(2);
    dp_model_free(&m);
}

/* Dropout: on in training, off in evaluation; the mask depends on the seed. */
static void check_dropout(void)
{
    dp_model m;
    dp_err err = {{0}};
    REQUIRE(dp_model_init(&m, "1x6x6-dropout0.5-4", 8, 1, &err) == 0);
    random_params(&m, 1);
    float x[8 * 36];
    uint8_t y[8];
    random_batch(&m, x, y, 8, 2);
    float eval1 = dp_model_forward(&m, m.params, x, y, 8, NULL);
    float eval2 = dp_model_forward(&m, m.params, x, y, 8, NULL);
    CHECK(eval1 == eval2);
    dp_model_seed_dropout(&m, 1);
    float t1 = dp_model_forward_range_loss(&m, 0, m.params, x, y, 0, 8, NULL);
    float t2 = dp_model_forward_range_loss(&m, 0, m.params, x, y, 0, 8, NULL);
    dp_model_seed_dropout(&m, 1);
    float t3 = dp_model_forward_range_loss(&m, 0, m.params, x, y, 0, 8, NULL);
    CHECK(t1 != eval1 && t1 != t2 && t1 == t3);
    const float *drop = dp_model_act(&m, 0, 1);
    int zeros = 0;
    for (int i = 0; i < 8 * 36; i++)
        zeros += drop[i] == 0.0f;
    CHECKF(zeros > 8 * 36 / 4 && zeros < 8 * 36 * 3 / 4, "%d of %d dropped", zeros, 8 * 36);
    dp_model_free(&m);
}

/* ---- checkpoints in PyTorch's layouts ---------------------------------------- */

static void check_checkpoint(void)
{
    const char *spec = "2x5x6-conv3x2x3p1-relu-local2x3x2s1-relu-4";
    dp_model m, back;
    dp_err err = {{0}};
    REQUIRE(dp_model_init(&m, spec, 2, 1, &err) == 0);
    random_params(&m, 21);
    dp_train_state st;
    REQUIRE(dp_train_state_alloc(&st, m.n_params, 0, 0, 0, 0, &err) == 0);
    memcpy(st.params, m.params, m.n_params * sizeof(float));
    char path[600];
    snprintf(path, sizeof path, "%s/image.safetensors", scratch);
    REQUIRE(dp_checkpoint_write(path, &m, &st, NULL, &err) == 0);

    dp_safetensors *f = NULL;
    REQUIRE(dp_safetensors_load(path, &f, &err) == 0);
    const dp_layer *conv = &m.layers[1], *local = &m.layers[3], *dense = &m.layers[6];
    REQUIRE(conv->kind == DP_LAYER_CONV && local->kind == DP_LAYER_LOCAL);
    REQUIRE(dense->kind == DP_LAYER_DENSE);
    /* Conv2d: (oc, c, kh, kw); the model keeps (oc, kh, kw, c) */
    const dp_st_tensor *t = dp_safetensors_find(f, "layers.0.weight");
    REQUIRE(t && t->ndim == 4);
    CHECK(t->shape[0] == 3 && t->shape[1] == 2 && t->shape[2] == 3 && t->shape[3] == 2);
    const float *tw = t->data;
    int ok = 1;
    for (int o = 0; o < 3; o++)
        for (int c = 0; c < 2; c++)
            for (int ky = 0; ky < 3; ky++)
                for (int kx = 0; kx < 2; kx++)
                    ok &= tw[((o * 2 + c) * 3 + ky) * 2 + kx] ==
                          m.params[conv->w_off + ((o * 3 + ky) * 2 + kx) * 2 + c];
    CHECK(ok);
    t = dp_safetensors_find(f, "layers.0.bias");
    CHECK(t && t->ndim == 1 && t->shape[0] == 3);
    /* local: (oh, ow, oc, c, kh, kw) and bias (oh, ow, oc) */
    t = dp_safetensors_find(f, "layers.1.weight");
    REQUIRE(t && t->ndim == 6);
    CHECK(t->shape[0] == local->oh && t->shape[1] == local->ow && t->shape[2] == 2 &&
          t->shape[3] == 3 && t->shape[4] == 2 && t->shape[5] == 3);
    tw = t->data;
    ok = 1;
    int P = local->oh * local->ow;
    for (int p = 0; p < P; p++)
        for (int o = 0; o < 2; o++)
            for (int c = 0; c < 3; c++)
                for (int ky = 0; ky < 2; ky++)
                    for (int kx = 0; kx < 3; kx++)
                        ok &= tw[(((p * 2 + o) * 3 + c) * 2 + ky) * 3 + kx] ==
                              m.params[local->w_off + (size_t)(p * 2 + o) * 18 +
                                       (ky * 3 + kx) * 3 + c];
    CHECK(ok);
    t = dp_safetensors_find(f, "layers.1.bias");
    CHECK(t && t->ndim == 3 && t->shape[2] == 2);
    t = dp_safetensors_find(f, "layers.2.weight");
    CHECK(t && t->ndim == 2 && t->shape[0] == 4 && t->shape[1] == dense->in);
    dp_safetensors_free(f);

    /* and back, bit for bit */
    dp_ckpt_info info;
    REQUIRE(dp_checkpoint_load_weights(path, &back, 2, &info, &err) == 0);
    CHECK(strcmp(back.spec, m.spec) == 0 && back.n_params == m.n_params);
    CHECK(same(back.params, m.params, m.n_params));
    dp_model_free(&back);
    dp_train_state_free(&st);
    dp_model_free(&m);
}

int main(void)
{
    scratch_make(scratch, sizeof scratch, "test_model_image");
    test_cnn_mnist();
    test_spellings();
    test_bad_image_specs();
    check_model_gradient("1x7x6-conv3x3x3p1-relu-maxpool2-conv2x2x4-relu-6", 3, 1);
    check_model_gradient("2x6x7-conv3x2x3s2p1-avgpool2x1s1-lcn3-dense5-relu-4", 2, 2);
    check_model_gradient("1x8x8-local3x3x2s1-relu-maxpool3s2p1-lcn3-dropout0.3-flatten-7-3", 3, 3);
    check_model_gradient("3x5x5-local2x2x2p1-relu-conv3x3x2-5", 2, 4);
    check_ranges("1x7x6-conv3x3x3p1-relu-maxpool2-conv2x2x4-relu-lcn3-dropout0.2-8-6", 5);
    check_ranges("3x6x6-local3x3x2-relu-avgpool2-6", 4);
    check_chunks();
    check_dropout();
    check_checkpoint();
    int rc = CHECK_DONE();
    if (rc == 0)
        scratch_remove(scratch);
    return rc;
}
