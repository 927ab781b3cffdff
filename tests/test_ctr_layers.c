/* The click-through layers (docs/models.md, "Click-through models"): the
 * embedding bag (bag, src/nn/layer_bag.c) and the binary loss (bce,
 * src/nn/layer_bce.c), through whole models:
 *   - the forward (the bags' concatenation, the probabilities, the loss)
 *     against a double-precision implementation of the model;
 *   - every parameter's gradient against double-precision central
 *     differences of that implementation; rows no id touched get exactly 0;
 *   - sum and mean pooling, repeated ids, empty places (-1), an empty bag;
 *   - ids that are not integers in [0, N) skipped and counted (bad_inputs);
 *   - 1 and 2 threads give the same bits;
 *   - bce on large logits stays finite and exact;
 *   - the grammar's spelling, refusals naming the token, the wide-deep
 *     preset's parameter count and two classes;
 *   - model parallelism and the device refuse the kinds with the reason. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "downpour/device.h"
#include "downpour/layer_kind.h"
#include "downpour/model.h"
#include "downpour/pool.h"
#include "downpour/rng.h"
#include "exec/mp_slice.h"

/* The model's loss on (x, y) in double precision, from params p (double),
 * walking its layers: bag, dense, relu, bce.  feat0: when non-NULL, gets
 * the first record's features after the bags. */
static double naive_loss(const dp_model *m, const double *p, const float *x, const uint8_t *y,
                         int batch, double *prob, double *feat0)
{
    double loss = 0;
    double a[256], b[256];
    for (int r = 0; r < batch; r++) {
        const dp_layer *d0 = &m->layers[0];
        for (int i = 0; i < d0->in; i++)
            a[i] = x[(size_t)r * d0->in + i];
        for (int l = 0; l < m->n_layers; l++) {
            const dp_layer *d = &m->layers[l];
            const double *w = p + d->w_off, *bias = p + d->b_off;
            switch (d->kind) {
            case DP_LAYER_BAG: {
                int M = d->bag_ids, W = d->in, D = d->out - W + M;
                long N = (long)(d->w_len / (size_t)D);
                for (int i = 0; i < W - M; i++)
                    b[i] = a[M + i];
                int used = 0;
                for (int k = 0; k < D; k++)
                    b[W - M + k] = 0;
                for (int j = 0; j < M; j++) {
                    double v = a[j];
                    if (v < 0 || v >= N || v != floor(v))
                        continue;
                    used++;
                    for (int k = 0; k < D; k++)
                        b[W - M + k] += w[(long)v * D + k];
                }
                if (d->bag_mean && used)
                    for (int k = 0; k < D; k++)
                        b[W - M + k] /= used;
                break;
            }
            case DP_LAYER_DENSE:
                for (int o = 0; o < d->out; o++) {
                    b[o] = bias[o];
                    for (int i = 0; i < d->in; i++)
                        b[o] += w[(size_t)o * d->in + i] * a[i];
                }
                break;
            case DP_LAYER_LEAD: {
                int K = d->lead_in, W = d->in, U = d->out - W + K;
                for (int u = 0; u < U; u++) {
                    b[u] = bias[u];
                    for (int i = 0; i < K; i++)
                        b[u] += w[(size_t)u * K + i] * a[i];
                    if (d->lead_relu && b[u] < 0)
                        b[u] = 0;
                }
                for (int i = K; i < W; i++)
                    b[U + i - K] = a[i];
                break;
            }
            case DP_LAYER_DOT: {
                int D = d->dot_dim, n = d->in / D, o = D;
                for (int k = 0; k < D; k++)
                    b[k] = a[k];
                for (int i = 1; i < n; i++)
                    for (int j = 0; j < i; j++) {
                        b[o] = 0;
                        for (int k = 0; k < D; k++)
                            b[o] += a[i * D + k] * a[j * D + k];
                        o++;
                    }
                break;
            }
            case DP_LAYER_RELU:
                for (int i = 0; i < d->in; i++)
                    b[i] = a[i] > 0 ? a[i] : 0;
                break;
            case DP_LAYER_BCE: {
                double z = a[0], pr = 1 / (1 + exp(-z));
                if (prob)
                    prob[r] = pr;
                loss -= y[r] ? log(pr) : log1p(-pr);
                b[0] = pr;
                break;
            }
            default:
                REQUIRE(!"a kind this test knows");
            }
            memcpy(a, b, sizeof a);
            if (feat0 && r == 0 && d->kind == DP_LAYER_BAG && l + 1 < m->n_layers &&
                m->layers[l + 1].kind != DP_LAYER_BAG)
                memcpy(feat0, a, (size_t)d->out * sizeof *a);
        }
    }
    return loss / batch;
}

static dp_rng rng;

static void init_model(dp_model *m, const char *spec, int batch)
{
    dp_err err;
    int rc = dp_model_init(m, spec, batch, 1, &err);
    CHECKF(rc == 0, "%s: %s", spec, err.msg);
    REQUIRE(rc == 0);
    dp_model_init_params(m, 7);
    for (size_t i = 0; i < m->n_params; i++) /* away from zero and the relu's kink */
        m->params[i] = (float)(dp_rng_uniform(&rng) - 0.5);
}

/* Forward and gradients of a small model against double precision. */
static void test_gradients(const char *spec)
{
    dp_model m;
    enum { B = 6 };
    init_model(&m, spec, B);
    CHECKF(strcmp(m.spec, spec) == 0, "spelled %s", m.spec);
    CHECK(m.layers[0].bag_col == 0 && m.layers[0].bag_ids == 3 &&
          m.layers[0].bag_mean == (strstr(spec, "m3mean") != NULL));
    CHECK(m.layers[1].bag_col == 3 && m.layers[1].bag_ids == 1 && !m.layers[1].bag_mean);
    CHECK(m.layers[1].w_off == 15 && m.layers[1].w_len == (size_t)4 * (m.layers[1].out - 6));
    CHECK(dp_model_classes(&m) == 2);
    /* the rows the forward reads, as the sparse exchange will read them */
    CHECK(dp_model_bag_row(&m.layers[0], 4.0f) == 4 && dp_model_bag_row(&m.layers[0], 0.0f) == 0);
    CHECK(dp_model_bag_row(&m.layers[0], 5.0f) == -1 && dp_model_bag_row(&m.layers[0], 2.5f) == -1);
    CHECK(dp_model_bag_row(&m.layers[0], -1.0f) == -1 && dp_model_bag_row(&m.layers[0], NAN) == -1);
    float x[B * 7] = {
        0, 2, 2, 1, 0.5f, -1.0f, 2.0f,       /* a repeated id */
        4, -1, -1, 3, -0.3f, 0.1f, 0.7f,     /* one id and two empty places */
        -1, -1, -1, 0, 1.5f, 0.2f, -0.4f,    /* an empty bag: zeros */
        1, 3, 0, 2, 0.0f, 0.9f, -1.2f,
        2, 2, 2, 1, 0.3f, 0.3f, 0.3f,
        3, 1, -1, 3, -2.0f, 1.0f, 0.1f,
    };
    uint8_t y[B] = {1, 0, 0, 1, 1, 0};
    double *p = malloc(m.n_params * sizeof *p), feat[16], prob[B];
    REQUIRE(p);
    for (size_t i = 0; i < m.n_params; i++)
        p[i] = m.params[i];
    double want = naive_loss(&m, p, x, y, B, prob, feat);

    float loss = dp_model_forward_backward(&m, x, y, B, NULL);
    CHECK_NEAR(loss, want, 1e-5);
    const float *f = dp_model_act(&m, 0, 2); /* after the two bags */
    for (int i = 0; i < m.layers[1].out; i++)
        CHECK_NEAR(f[i], feat[i], 1e-6);
    const float *pr = dp_model_act(&m, 0, m.n_layers);
    for (int r = 0; r < B; r++)
        CHECK_NEAR(pr[r], prob[r], 1e-6);
    CHECK(dp_model_bad_inputs(&m, B) == 0);

    double worst = 0;
    for (size_t i = 0; i < m.n_params; i++) {
        double v = p[i], h = 1e-6;
        p[i] = v + h;
        double up = naive_loss(&m, p, x, y, B, NULL, NULL);
        p[i] = v - h;
        double dn = naive_loss(&m, p, x, y, B, NULL, NULL);
        p[i] = v;
        double fd = (up - dn) / (2 * h);
        if (fd == 0.0) /* a row no id touched: exactly zero */
            CHECKF(m.grads[i] == 0.0f, "parameter %zu: gradient %g where nothing reads it", i,
                   m.grads[i]);
        worst = fmax(worst, fabs(fd - m.grads[i]) / fmax(1e-3, fabs(fd)));
    }
    CHECKF(worst < 1e-4, "worst relative gradient error %g", worst);
    /* bag 2's row 0 is read once (record 2), its other rows more; bag 1's
     * row 0 by records 0 and 3 */
    printf("%s: loss %.6f (double %.6f), %zu gradients within %.1e of double-precision "
           "central differences\n",
           spec, loss, want, m.n_params, worst);

    /* ids that are not integers in [0, N): skipped and counted */
    float bad[2 * 7] = {
        2.5f, 5, -3, 4, 0, 0, 0, /* not an integer, past N, negative; bag 2: past N */
        1, -1, 0, 1, 0, 0, 0,
    };
    uint8_t yb[2] = {0, 1};
    float lb = dp_model_forward(&m, m.params, bad, yb, 2, NULL);
    CHECKF(dp_model_bad_inputs(&m, 2) == 4, "%ld bad ids", dp_model_bad_inputs(&m, 2));
    CHECK_NEAR(lb, naive_loss(&m, p, bad, yb, 2, NULL, NULL), 1e-5);
    free(p);
    dp_model_free(&m);
}

/* 1 and 2 threads: the same bits, forward and backward. */
static void test_threads(void)
{
    const char *spec = "6-bag300x8m4-bag200x4mean-16-dense1-bce";
    enum { B = 64 };
    float x[B * 6];
    uint8_t y[B];
    for (int r = 0; r < B; r++) {
        for (int j = 0; j < 4; j++)
            x[r * 6 + j] = (float)dp_rng_below(&rng, 300);
        x[r * 6 + 4] = (float)dp_rng_below(&rng, 200);
        x[r * 6 + 5] = (float)dp_rng_uniform(&rng);
        y[r] = (uint8_t)dp_rng_below(&rng, 2);
    }
    float *g[2];
    float loss[2];
    for (int t = 0; t < 2; t++) {
        REQUIRE(dp_pool_set_threads(t + 1, NULL) == 0);
        dp_model m;
        dp_rng_seed(&rng, 5);
        init_model(&m, spec, B);
        loss[t] = dp_model_forward_backward(&m, x, y, B, NULL);
        g[t] = malloc(m.n_params * sizeof(float));
        REQUIRE(g[t]);
        memcpy(g[t], m.grads, m.n_params * sizeof(float));
        if (t == 1)
            CHECKF(memcmp(g[0], g[1], m.n_params * sizeof(float)) == 0 && loss[0] == loss[1],
                   "1 and 2 threads differ");
        dp_model_free(&m);
    }
    REQUIRE(dp_pool_set_threads(1, NULL) == 0);
    printf("%s: 1 and 2 threads give the same bits\n", spec);
    free(g[0]), free(g[1]);
}

/* bce on logits far from zero: the stable form. */
static void test_bce_extremes(void)
{
    dp_model m;
    init_model(&m, "1-dense1-bce", 4);
    m.params[0] = 1.0f, m.params[1] = 0.0f; /* z = x */
    float x[4] = {60, 60, -60, -60};
    uint8_t y[4] = {0, 1, 0, 1};
    int correct = 0;
    float loss = dp_model_forward(&m, m.params, x, y, 4, &correct);
    CHECK_NEAR(loss, (60.0 + 60.0) / 4, 1e-5); /* the wrong two cost 60 each */
    CHECK(correct == 2);
    dp_model_free(&m);
}

static void refused(const char *spec, const char *token, const char *why)
{
    dp_model m;
    dp_err err;
    int rc = dp_model_init(&m, spec, 4, 1, &err);
    CHECKF(rc < 0 && strstr(err.msg, token) && strstr(err.msg, why), "%s: %s", spec,
           rc < 0 ? err.msg : "accepted");
    if (rc == 0)
        dp_model_free(&m);
}

static void test_grammar(void)
{
    dp_model m;
    dp_err err;
    REQUIRE(dp_model_init(&m, "wide-deep", 8, 1, &err) == 0);
    /* 8 tables of 1000 x 16; 4 + 8 x 16 = 132 features; 132-64-32-1 and 132-1 */
    size_t want = 8 * 1000 * 16 + (132 * 64 + 64) + (64 * 32 + 32) + (32 + 1) + (132 + 1);
    CHECKF(m.n_params == want, "wide-deep: %zu parameters, want %zu", m.n_params, want);
    CHECK(dp_model_inputs(&m) == 12 && dp_model_classes(&m) == 2);
    printf("wide-deep: %s, %zu parameters\n", m.spec, m.n_params);

    mp_plan plan;
    CHECKF(mp_plan_make(&plan, &m, 2, 0, &err) < 0 && strstr(err.msg, "bag") &&
           strstr(err.msg, "sparse rows"), "model parallelism: %s", err.msg);
    printf("model parallelism: %s\n", err.msg);
    dp_device *dev = NULL;
    dp_device_spec sim = {.kind = DP_DEVICE_SIM};
    REQUIRE(dp_device_open(&dev, &sim, &err) == 0);
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_SGD);
    dp_dmodel *g = NULL;
    CHECKF(dp_dmodel_open(&g, dev, &m, &oc, &err) < 0 && strstr(err.msg, "bag") &&
           strstr(err.msg, "no device kernel"), "device: %s", err.msg);
    printf("device: %s\n", err.msg);
    dp_device_close(dev);
    dp_model_free(&m);

    refused("7-4-bag5x3-dense1-bce", "token 3 'bag5x3'", "must be the first layers");
    refused("3-bag5x3m4-dense1-bce", "token 2 'bag5x3m4'", "only 3 input columns");
    refused("7-bag5x3-bag5x3m7-dense1-bce", "token 3", "only 6 input columns");
    refused("7-bag5x3x2-dense1-bce", "token 2", "expected bag<N>x<D>");
    refused("7-bag0x3-dense1-bce", "token 2", "expected bag<N>x<D>");
    refused("7-bag5x3-dense2-bce", "token 4 'bce'", "one logit");
    refused("7-bag5x3-bce-dense1", "token 3 'bce'", "last token");
    refused("1x4x4-bag5x3-dense1-bce", "token 2", "not an image");
    refused("7-bag5x3-lead10x4-dense1-bce", "token 3 'lead10x4'", "leading 10 features of 9");
    refused("7-bag5x3-lead3-dense1-bce", "token 3 'lead3'", "expected lead<K>x<U>");
    refused("7-bag5x3-dot4-dense1-bce", "token 3 'dot4'", "at least two vectors of width 4");
    /* 131073 vectors: 2^33 + 2^16 dots, which an int cast took for 2^16 */
    refused("131073-dot1-dense1-bce", "token 2 'dot1'", "131073 vectors make");

    REQUIRE(dp_model_init(&m, "dlrm", 8, 1, &err) == 0);
    /* tables; bottom 4-64-16; 9 vectors of 16: 16 + 36 = 52; top 52-64-1 */
    want = 8 * 1000 * 16 + (4 * 64 + 64) + (64 * 16 + 16) + (52 * 64 + 64) + (64 + 1);
    CHECKF(m.n_params == want, "dlrm: %zu parameters, want %zu", m.n_params, want);
    CHECK(m.layers[10].kind == DP_LAYER_DOT && m.layers[10].out == 52);
    printf("dlrm: %s, %zu parameters\n", m.spec, m.n_params);
    dp_model_free(&m);
}

int main(void)
{
    dp_rng_seed(&rng, 1);
    REQUIRE(dp_pool_set_threads(1, NULL) == 0);
    /* bag 1: 3 places, mean; bag 2: one id; 3 numeric features */
    test_gradients("7-bag5x3m3mean-bag4x2-4-dense1-bce");
    /* DLRM's shape: a bottom lead on the numeric features, the dots */
    test_gradients("7-bag5x3m3mean-bag4x3-lead3x3relu-dot3-4-dense1-bce");
    test_gradients("7-bag5x3m3-bag4x3-lead3x5-lead5x3relu-dot3-dense1-bce");
    test_threads();
    test_bce_extremes();
    test_grammar();
    return CHECK_DONE();
}
