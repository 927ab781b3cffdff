/* The whole model: every parameter's gradient against central differences of
 * an independent double-precision forward; spec parsing; layout; batches. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "downpour/model.h"
#include "downpour/rng.h"

/* Mean cross-entropy loss of the model described by m's layer table, with
 * parameters p in double (same flat layout), on x (batch, inputs). */
static double ref_loss(const dp_model *m, const double *p, const float *x, const uint8_t *y,
                       int batch)
{
    double a[2][64];
    double loss = 0.0;
    for (int r = 0; r < batch; r++) {
        const dp_layer *d0 = &m->layers[0];
        for (int i = 0; i < d0->in; i++)
            a[0][i] = x[r * d0->in + i];
        int cur = 0;
        for (int l = 0; l + 1 < m->n_layers; l++) {
            const dp_layer *d = &m->layers[l];
            for (int o = 0; o < d->out; o++) {
                double z = a[cur][o];
                if (d->kind == DP_LAYER_DENSE) {
                    z = p[d->b_off + o];
                    for (int i = 0; i < d->in; i++)
                        z += p[d->w_off + (size_t)o * d->in + i] * a[cur][i];
                } else if (z < 0) { /* relu */
                    z = 0.0;
                }
                a[1 - cur][o] = z;
            }
            cur = 1 - cur;
        }
        int classes = m->layers[m->n_layers - 1].out;
        double sum = 0.0;
        for (int j = 0; j < classes; j++)
            sum += exp(a[cur][j]);
        loss += log(sum) - a[cur][y[r]];
    }
    return loss / batch;
}

static void test_gradients(uint64_t seed)
{
    enum { B = 4 };
    dp_model m;
    dp_err err;
    REQUIRE(dp_model_init(&m, "6-5-4-3", B, 1, &err) == 0);
    CHECK(m.n_params == 6 * 5 + 5 + 5 * 4 + 4 + 4 * 3 + 3);
    CHECK(strcmp(m.name, "6-5-4-3") == 0 && strcmp(m.spec, "6-5-4-3") == 0);
    dp_model_init_params(&m, seed);
    dp_rng r;
    dp_rng_seed(&r, seed + 100);
    /* non-zero biases so they matter */
    for (int l = 0; l < m.n_layers; l++)
        for (int o = 0; m.layers[l].kind == DP_LAYER_DENSE && o < m.layers[l].out; o++)
            m.params[m.layers[l].b_off + o] = 0.2f * (dp_rng_uniform(&r) - 0.5f);
    float x[B * 6];
    uint8_t y[B];
    for (int k = 0; k < B * 6; k++)
        x[k] = 2.0f * dp_rng_uniform(&r) - 1.0f;
    for (int k = 0; k < B; k++)
        y[k] = (uint8_t)dp_rng_below(&r, 3);

    double *p = malloc(m.n_params * sizeof *p);
    REQUIRE(p);
    for (size_t k = 0; k < m.n_params; k++)
        p[k] = m.params[k];
    for (size_t k = 0; k < m.n_params; k++)
        m.grads[k] = 1e6f; /* must be overwritten, not accumulated */
    int correct = 0;
    float loss = dp_model_forward_backward(&m, x, y, B, &correct);
    CHECK_NEAR(loss, ref_loss(&m, p, x, y, B), 1e-5);
    CHECK(correct >= 0 && correct <= B);

    const double h = 1e-4;
    for (size_t k = 0; k < m.n_params; k++) {
        double save = p[k];
        p[k] = save + h;
        double lp = ref_loss(&m, p, x, y, B);
        p[k] = save - h;
        double lm = ref_loss(&m, p, x, y, B);
        p[k] = save;
        double num = (lp - lm) / (2 * h);
        CHECKF(fabs(m.grads[k] - num) <= 1e-5 + 1e-3 * fabs(num),
               "seed %llu param %zu: analytic %.9g, finite differences %.9g",
               (unsigned long long)seed, k, (double)m.grads[k], num);
    }

    /* a second call overwrites (same grads, not doubled) */
    float g1[128];
    REQUIRE(m.n_params <= 128);
    memcpy(g1, m.grads, m.n_params * sizeof(float));
    float loss2 = dp_model_forward_backward(&m, x, y, B, NULL);
    CHECK(loss2 == loss);
    CHECK(memcmp(g1, m.grads, m.n_params * sizeof(float)) == 0);

    /* batch < max_batch: the same as a model whose max_batch is that batch */
    dp_model m2;
    REQUIRE(dp_model_init(&m2, "6-5-4-3", 2, 1, &err) == 0);
    memcpy(m2.params, m.params, m.n_params * sizeof(float));
    float la = dp_model_forward_backward(&m, x, y, 2, NULL);
    float lb = dp_model_forward_backward(&m2, x, y, 2, NULL);
    CHECK(la == lb);
    CHECK_NEAR(la, ref_loss(&m, p, x, y, 2), 1e-5);
    for (size_t k = 0; k < m.n_params; k++)
        CHECK_NEAR(m.grads[k], m2.grads[k], 1e-7);
    dp_model_free(&m2);
    free(p);
    dp_model_free(&m);
}

static void test_forward(void)
{
    enum { B = 7 };
    dp_model m;
    dp_err err;
    REQUIRE(dp_model_init(&m, "mlp-128", 16, 1, &err) == 0);
    dp_model_init_params(&m, 42);
    float *x = malloc(B * 784 * sizeof *x);
    REQUIRE(x);
    uint8_t y[B];
    dp_rng r;
    dp_rng_seed(&r, 9);
    for (int k = 0; k < B * 784; k++)
        x[k] = dp_rng_uniform(&r);
    for (int k = 0; k < B; k++)
        y[k] = (uint8_t)dp_rng_below(&r, 10);
    int c1 = 0, c2 = 0;
    float l1 = dp_model_forward(&m, m.params, x, y, B, &c1);
    float l2 = dp_model_forward(&m, m.params, x, y, B, &c2);
    CHECK(isfinite(l1) && l1 > 0.0f);
    CHECK(l1 == l2 && c1 == c2);
    /* untrained on 10 classes: the loss is near ln 10 */
    CHECK(l1 > 1.0f && l1 < 4.0f);
    /* forward agrees with forward_backward's loss; probs rows sum to 1 */
    CHECK(dp_model_forward_backward(&m, x, y, B, NULL) == l1);
    double s = 0.0;
    for (int j = 0; j < 10; j++)
        s += dp_model_act(&m, 0, m.n_layers)[j];
    CHECK_NEAR(s, 1.0, 1e-6);
    /* out-of-range batches do nothing */
    CHECK(isnan(dp_model_forward(&m, m.params, x, y, 0, NULL)));
    CHECK(isnan(dp_model_forward(&m, m.params, x, y, 17, NULL)));
    CHECK(isnan(dp_model_forward_backward(&m, x, y, 17, NULL)));
    free(x);
    dp_model_free(&m);
    dp_model_free(&m); /* freeing twice is harmless */
}

static void test_init_params(void)
{
    dp_model a, b;
    dp_err err;
    REQUIRE(dp_model_init(&a, "mlp-300-100", 1, 1, &err) == 0);
    REQUIRE(dp_model_init(&b, "784-300-100-10", 1, 1, &err) == 0);
    CHECK(a.n_params == 266610);
    CHECK(b.n_params == 266610);
    CHECK(strcmp(a.name, "mlp-300-100") == 0 && strcmp(a.spec, "784-300-100-10") == 0);
    CHECK(strcmp(b.name, "784-300-100-10") == 0);
    CHECK(dp_model_inputs(&a) == 784 && dp_model_classes(&a) == 10);
    /* PyTorch Linear layout: weight (out,in) then bias (out), layer after layer */
    CHECK(a.n_dense == 3);
    const dp_layer *L = a.layers;
    REQUIRE(a.n_layers == 6);
    const dp_layer_kind kinds[6] = {DP_LAYER_DENSE, DP_LAYER_RELU, DP_LAYER_DENSE,
                                    DP_LAYER_RELU,  DP_LAYER_DENSE, DP_LAYER_SOFTMAX_XENT};
    const int ins[6] = {784, 300, 300, 100, 100, 10}, outs[6] = {300, 300, 100, 100, 10, 10};
    for (int l = 0; l < 6; l++)
        CHECKF(L[l].kind == kinds[l] && L[l].in == ins[l] && L[l].out == outs[l],
               "layer %d: %s %d->%d", l, dp_layer_kind_name(L[l].kind), L[l].in, L[l].out);
    CHECK(L[0].w_off == 0 && L[0].b_off == 784 * 300);
    CHECK(L[2].w_off == 784 * 300 + 300);
    CHECK(L[2].b_off == L[2].w_off + 300 * 100);
    CHECK(L[4].w_off == L[2].b_off + 100);
    CHECK(L[4].b_off + 10 == a.n_params);
    CHECK(strcmp(dp_layer_kind_name(DP_LAYER_DENSE), "dense") == 0);
    CHECK(strcmp(dp_layer_kind_name(DP_LAYER_RELU), "relu") == 0);
    CHECK(strcmp(dp_layer_kind_name(DP_LAYER_SOFTMAX_XENT), "softmax_xent") == 0);
    CHECK(strcmp(dp_layer_kind_name(DP_LAYER_KIND_COUNT), "?") == 0);

    dp_model_init_params(&a, 7);
    dp_model_init_params(&b, 7);
    CHECK(memcmp(a.params, b.params, a.n_params * sizeof(float)) == 0);
    for (int l = 0; l < a.n_layers; l += 2) {
        const dp_layer *d = &a.layers[l];
        REQUIRE(d->kind == DP_LAYER_DENSE);
        double limit = sqrt(6.0 / (d->in + d->out)), sum = 0.0, sq = 0.0, maxabs = 0.0;
        size_t n = (size_t)d->in * d->out;
        for (size_t k = 0; k < n; k++) {
            double w = a.params[d->w_off + k];
            sum += w;
            sq += w * w;
            if (fabs(w) > maxabs)
                maxabs = fabs(w);
        }
        CHECK(maxabs <= limit * (1 + 1e-6));
        CHECK(maxabs > 0.9 * limit);
        CHECK(fabs(sum / n) < 0.05 * limit);
        /* uniform on [-L, L] has variance L^2 / 3 */
        CHECK_NEAR(sq / n, limit * limit / 3, 0.1 * limit * limit / 3);
        for (int o = 0; o < d->out; o++)
            CHECK(a.params[d->b_off + o] == 0.0f);
    }
    /* the first weight is the first draw of the seeded generator */
    dp_rng r;
    dp_rng_seed(&r, 7);
    CHECK(a.params[0] == (2.0f * dp_rng_uniform(&r) - 1.0f) * sqrtf(6.0f / (784 + 300)));
    dp_model_init_params(&b, 8);
    CHECK(memcmp(a.params, b.params, a.n_params * sizeof(float)) != 0);
    dp_model_free(&a);
    dp_model_free(&b);

    REQUIRE(dp_model_init(&a, "mlp-128", 1, 1, &err) == 0);
    CHECK(a.n_params == 101770);
    CHECK(strcmp(a.name, "mlp-128") == 0 && strcmp(a.spec, "784-128-10") == 0);
    dp_model_free(&a);
}

static void test_bad_specs(void)
{
    const char *bad[] = {
        "",                 /* empty */
        "mlp",              /* not a preset, not numbers */
        "mlp-300",          /* not a preset */
        "784",              /* one width */
        "784--10",          /* empty width */
        "-784-10",          /* leading dash */
        "784-10-",          /* trailing dash */
        "784-300-10x",      /* trailing junk */
        "784-3a0-10",       /* not a number */
        " 784-10",          /* space */
        "784-+300-10",      /* sign */
        "784-0-10",         /* zero width */
        "784-65537-10",     /* too wide */
        "784-99999999999999999999-10", /* overflow */
        "784-300",          /* 300 classes > 256 */
        /* 33 dense layers and their relus: 65 layers with the loss */
        "2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2",
        /* 49 layers with parameters (48 at most): the message quotes the
         * spec's first 120 characters, then "..." */
        "2-dense2-dense2-dense2-dense2-dense2-dense2-dense2-dense2-dense2-dense2-dense2-dense2-"
        "dense2-dense2-dense2-dense2-dense2-dense2-dense2-dense2-dense2-dense2-dense2-dense2-"
        "dense2-dense2-dense2-dense2-dense2-dense2-dense2-dense2-dense2-dense2-dense2-dense2-"
        "dense2-dense2-dense2-dense2-dense2-dense2-dense2-dense2-dense2-dense2-dense2-dense2-2",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dp_model m;
        dp_err err = {{0}};
        CHECKF(dp_model_init(&m, bad[i], 8, 1, &err) == -1, "spec '%s' accepted", bad[i]);
        char quoted[128]; /* a message quotes 120 characters of a long spec */
        snprintf(quoted, sizeof quoted, "%.120s", bad[i]);
        CHECKF(strstr(err.msg, quoted) != NULL, "message for '%s': %s", bad[i], err.msg);
        CHECK(m.params == NULL);
        dp_model_free(&m);
    }
    dp_model m;
    dp_err err = {{0}};
    CHECK(dp_model_init(&m, "784-10", 0, 1, &err) == -1); /* max batch */
    CHECK(strstr(err.msg, "batch") != NULL);
    CHECK(dp_model_init(&m, "784-10", 8, 0, &err) == -1); /* slots */
    CHECK(strstr(err.msg, "slots") != NULL);
    CHECK(m.params == NULL);
    /* the limits themselves are fine */
    REQUIRE(dp_model_init(&m, "2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2-2",
                          1, 1, &err) == 0);
    CHECK(m.n_dense == 32 && m.n_layers == 64 && m.n_layers <= DP_MAX_LAYERS);
    dp_model_free(&m);
    REQUIRE(dp_model_init(&m, "3-256", 1, 1, &err) == 0);
    CHECK(dp_model_classes(&m) == 256);
    dp_model_free(&m);
    REQUIRE(dp_model_init(&m, "0003-0002", 1, 1, &err) == 0);
    CHECK(strcmp(m.spec, "3-2") == 0);
    dp_model_free(&m);
}

int main(void)
{
    for (uint64_t seed = 1; seed <= 5; seed++)
        test_gradients(seed);
    test_forward();
    test_init_params();
    test_bad_specs();
    return CHECK_DONE();
}
