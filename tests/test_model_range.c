/* The layer-range model: forward and backward over any range [a, b) give the
 * whole model's activations, loss and gradients (split at every boundary, and
 * one layer at a time, so every dense | relu boundary runs unfused); the input
 * gradient of layer 0 against central differences of an independent
 * double-precision forward; several slots in flight give what one at a time
 * gives; parameters are an argument; bad arguments do nothing. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "downpour/blas.h"
#include "downpour/model.h"
#include "downpour/rng.h"

#define MAXB 8
#define MAXW 32
#define MAXP 4096

static const char *const specs[] = {"6-5-4-3", "20-16-12-8-5", "5-3", "9-31-2"};

/* Mean cross-entropy of the model described by m's layer table with
 * parameters p, in double, on x (batch, inputs), also in double. */
static double ref_loss(const dp_model *m, const double *p, const double *x, const uint8_t *y,
                       int batch)
{
    double a[2][MAXW];
    double loss = 0.0;
    for (int r = 0; r < batch; r++) {
        for (int i = 0; i < m->layers[0].in; i++)
            a[0][i] = x[r * m->layers[0].in + i];
        int cur = 0;
        for (int l = 0; l + 1 < m->n_layers; l++) {
            const dp_layer *d = &m->layers[l];
            for (int o = 0; o < d->out; o++) {
                double z = a[cur][o];
                if (d->kind == DP_LAYER_DENSE) {
                    z = p[d->b_off + o];
                    for (int i = 0; i < d->in; i++)
                        z += p[d->w_off + (size_t)o * d->in + i] * a[cur][i];
                } else if (z < 0) {
                    z = 0.0;
                }
                a[1 - cur][o] = z;
            }
            cur = 1 - cur;
        }
        double zmax = a[cur][0], sum = 0.0;
        for (int j = 1; j < dp_model_classes(m); j++)
            zmax = a[cur][j] > zmax ? a[cur][j] : zmax;
        for (int j = 0; j < dp_model_classes(m); j++)
            sum += exp(a[cur][j] - zmax);
        loss += log(sum) - (a[cur][y[r]] - zmax);
    }
    return loss / batch;
}

/* What one whole-model step gives: the reference every range run is held to. */
typedef struct whole {
    float loss;
    int correct;
    float grads[MAXP];
    float dx[MAXB * MAXW];          /* the gradient at x, from the range call */
    float act[DP_MAX_LAYERS + 1][MAXB * MAXW]; /* [l]: input of layer l, where kept */
} whole;

static void setup(dp_model *m, const char *spec, int slots, uint64_t seed, float *x, uint8_t *y,
                  int batch)
{
    dp_err err;
    REQUIRE(dp_model_init(m, spec, MAXB, slots, &err) == 0);
    REQUIRE(m->n_params <= MAXP && dp_model_inputs(m) <= MAXW);
    dp_model_init_params(m, seed);
    dp_rng r;
    dp_rng_seed(&r, seed + 1000);
    for (int l = 0; l < m->n_layers; l++) /* non-zero biases so they matter */
        for (int o = 0; m->layers[l].kind == DP_LAYER_DENSE && o < m->layers[l].out; o++)
            m->params[m->layers[l].b_off + o] = 0.4f * (dp_rng_uniform(&r) - 0.5f);
    for (int k = 0; k < batch * dp_model_inputs(m); k++)
        x[k] = 2.0f * dp_rng_uniform(&r) - 1.0f;
    for (int k = 0; k < batch; k++)
        y[k] = (uint8_t)dp_rng_below(&r, (uint64_t)dp_model_classes(m));
}

/* Is the input of layer l written by a whole-model forward?  Not when layer
 * l-1 is a dense fused with the relu at l. */
static int kept(const dp_model *m, int l)
{
    return !(m->layers[l - 1].kind == DP_LAYER_DENSE && l < m->n_layers &&
             m->layers[l].kind == DP_LAYER_RELU);
}

static void run_whole(dp_model *m, whole *w, const float *x, const uint8_t *y, int batch)
{
    memset(w, 0, sizeof *w);
    w->loss = dp_model_forward_backward(m, x, y, batch, &w->correct);
    memcpy(w->grads, m->grads, m->n_params * sizeof(float));
    for (int l = 1; l <= m->n_layers; l++)
        if (kept(m, l))
            memcpy(w->act[l], dp_model_act(m, 0, l),
                   (size_t)batch * m->layers[l - 1].out * sizeof(float));
    /* the gradient at x: the range call over the whole model with din */
    float g[MAXP];
    REQUIRE(dp_model_forward_range_loss(m, 0, m->params, x, y, 0, batch, NULL) == w->loss);
    REQUIRE(dp_model_backward_range_loss(m, 0, w->dx, g, m->params, x, y, 0, batch) == 0);
    CHECK(memcmp(g, w->grads, m->n_params * sizeof(float)) == 0);
}

static int same(const float *a, const float *b, size_t n, double tol)
{
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)a[i] - (double)b[i]) <= tol))
            return 0;
    return 1;
}

/* Every split [0,k) + [k,n): activations, loss, correct count, gradients and
 * the input gradient match the whole model. */
static void test_splits(const char *spec, int batch, uint64_t seed)
{
    dp_model m;
    float x[MAXB * MAXW];
    uint8_t y[MAXB];
    setup(&m, spec, 1, seed, x, y, batch);
    static whole w;
    run_whole(&m, &w, x, y, batch);
    int n = m.n_layers;
    for (int k = 1; k < n; k++) {
        float h[MAXB * MAXW], dh[MAXB * MAXW], dx[MAXB * MAXW], g[MAXP];
        const float *out = dp_model_forward_range(&m, 0, m.params, x, 0, k, batch);
        REQUIRE(out == dp_model_act(&m, 0, k));
        size_t nh = (size_t)batch * m.layers[k - 1].out;
        memcpy(h, out, nh * sizeof *h); /* the next stage gets a copy, as over a wire */
        if (kept(&m, k))
            CHECKF(same(h, w.act[k], nh, 0), "%s split %d: activations differ", spec, k);
        else /* the fused kernel kept only the relu's output: apply the relu here */
            for (size_t i = 0; i < nh; i++)
                CHECK((h[i] < 0 ? 0.0f : h[i]) == w.act[k + 1][i]);
        int correct = 0;
        float loss = dp_model_forward_range_loss(&m, 0, m.params, h, y, k, batch, &correct);
        CHECKF(loss == w.loss, "%s split %d: loss %.9g, whole %.9g", spec, k, loss, w.loss);
        CHECK(correct == w.correct);
        CHECK(same(dp_model_act(&m, 0, n), w.act[n], (size_t)batch * dp_model_classes(&m), 0));

        for (size_t i = 0; i < m.n_params; i++)
            g[i] = NAN; /* every gradient must be written, once */
        REQUIRE(dp_model_backward_range_loss(&m, 0, dh, g, m.params, h, y, k, batch) == 0);
        /* the upper range wrote its own layers' gradients and no others */
        for (int l = 0; l < n; l++) {
            const dp_layer *d = &m.layers[l];
            if (d->kind != DP_LAYER_DENSE)
                continue;
            size_t len = (size_t)d->out * (d->in + 1);
            for (size_t i = d->w_off; i < d->w_off + len; i++)
                CHECKF(l >= k ? !isnan(g[i]) : isnan(g[i]), "%s split %d: grad %zu", spec, k, i);
        }
        REQUIRE(dp_model_backward_range(&m, 0, dx, g, m.params, dh, x, 0, k, batch) == 0);
        CHECKF(same(g, w.grads, m.n_params, 1e-6), "%s split %d: gradients differ", spec, k);
        CHECKF(same(dx, w.dx, (size_t)batch * dp_model_inputs(&m), 1e-6),
               "%s split %d: input gradients differ", spec, k);
    }
    dp_model_free(&m);
}

/* One range per layer: every layer's forward and backward alone. */
static void test_layer_by_layer(const char *spec, int batch, uint64_t seed)
{
    dp_model m;
    float x[MAXB * MAXW];
    uint8_t y[MAXB];
    setup(&m, spec, 1, seed, x, y, batch);
    static whole w;
    run_whole(&m, &w, x, y, batch);
    int n = m.n_layers;
    static float in[DP_MAX_LAYERS][MAXB * MAXW]; /* the input of each range, owned here */
    memcpy(in[0], x, (size_t)batch * dp_model_inputs(&m) * sizeof(float));
    for (int l = 0; l + 1 < n; l++) {
        const float *out = dp_model_forward_range(&m, 0, m.params, in[l], l, l + 1, batch);
        size_t no = (size_t)batch * m.layers[l].out;
        memcpy(in[l + 1], out, no * sizeof(float));
        if (kept(&m, l + 1))
            CHECKF(same(out, w.act[l + 1], no, 0), "%s layer %d (%s): output differs", spec, l,
                   dp_layer_kind_name(m.layers[l].kind));
    }
    int correct = 0;
    CHECK(dp_model_forward_range_loss(&m, 0, m.params, in[n - 1], y, n - 1, batch, &correct) ==
          w.loss);
    CHECK(correct == w.correct);

    float g[MAXP], d[2][MAXB * MAXW];
    REQUIRE(dp_model_backward_range_loss(&m, 0, d[0], g, m.params, in[n - 1], y, n - 1, batch) ==
            0);
    int cur = 0;
    for (int l = n - 2; l >= 0; l--) {
        float *din = d[1 - cur];
        REQUIRE(dp_model_backward_range(&m, 0, din, g, m.params, d[cur], in[l], l, l + 1,
                                        batch) == 0);
        cur = 1 - cur;
    }
    CHECKF(same(g, w.grads, m.n_params, 1e-6), "%s layer by layer: gradients differ", spec);
    CHECKF(same(d[cur], w.dx, (size_t)batch * dp_model_inputs(&m), 1e-6),
           "%s layer by layer: input gradients differ", spec);
    dp_model_free(&m);
}

/* The gradient at x (layer 0's input) against central differences in double. */
static void test_input_gradient(const char *spec, int batch, uint64_t seed)
{
    dp_model m;
    float x[MAXB * MAXW];
    uint8_t y[MAXB];
    setup(&m, spec, 1, seed, x, y, batch);
    static whole w;
    run_whole(&m, &w, x, y, batch);
    static double p[MAXP], xd[MAXB * MAXW];
    for (size_t k = 0; k < m.n_params; k++)
        p[k] = m.params[k];
    int nx = batch * dp_model_inputs(&m);
    for (int k = 0; k < nx; k++)
        xd[k] = x[k];
    CHECK_NEAR(w.loss, ref_loss(&m, p, xd, y, batch), 1e-5);
    const double h = 1e-4;
    for (int k = 0; k < nx; k++) {
        double save = xd[k];
        xd[k] = save + h;
        double lp = ref_loss(&m, p, xd, y, batch);
        xd[k] = save - h;
        double lm = ref_loss(&m, p, xd, y, batch);
        xd[k] = save;
        double num = (lp - lm) / (2 * h);
        CHECKF(fabs(w.dx[k] - num) <= 1e-5 + 1e-3 * fabs(num),
               "%s seed %llu dx[%d]: analytic %.9g, finite differences %.9g", spec,
               (unsigned long long)seed, k, (double)w.dx[k], num);
    }
    dp_model_free(&m);
}

/* Three micro-batches in flight through two stages [0,k) and [k,n), forwards
 * all first and backwards in another order, each into its own gradient
 * buffer: the same as each batch alone in a one-slot model. */
static void test_slots(const char *spec, uint64_t seed)
{
    enum { S = 3 };
    const int batches[S] = {MAXB, 3, 5};
    dp_model m, one;
    static float x[S][MAXB * MAXW];
    uint8_t y[S][MAXB];
    setup(&one, spec, 1, seed, x[0], y[0], MAXB);
    setup(&m, spec, S, seed, x[0], y[0], MAXB);
    dp_rng r;
    dp_rng_seed(&r, seed + 7);
    for (int s = 1; s < S; s++) {
        for (int k = 0; k < batches[s] * dp_model_inputs(&m); k++)
            x[s][k] = 2.0f * dp_rng_uniform(&r) - 1.0f;
        for (int k = 0; k < batches[s]; k++)
            y[s][k] = (uint8_t)dp_rng_below(&r, (uint64_t)dp_model_classes(&m));
    }
    /* n = 6: k = 4, after a relu; n = 8: k = 5, between a dense and its relu */
    int n = m.n_layers, k = n / 2 + (n > 2);
    static float h[S][MAXB * MAXW], dh[S][MAXB * MAXW], dx[S][MAXB * MAXW], g[S][MAXP];
    float loss[S];
    int correct[S] = {0};
    for (int s = 0; s < S; s++) {
        const float *out = dp_model_forward_range(&m, s, m.params, x[s], 0, k, batches[s]);
        REQUIRE(out);
        memcpy(h[s], out, (size_t)batches[s] * m.layers[k - 1].out * sizeof(float));
    }
    for (int s = 0; s < S; s++)
        loss[s] = dp_model_forward_range_loss(&m, s, m.params, h[s], y[s], k, batches[s],
                                              &correct[s]);
    const int order[S] = {1, 2, 0};
    for (int i = 0; i < S; i++) {
        int s = order[i];
        REQUIRE(dp_model_backward_range_loss(&m, s, dh[s], g[s], m.params, h[s], y[s], k,
                                             batches[s]) == 0);
    }
    for (int i = S - 1; i >= 0; i--) {
        int s = order[i];
        REQUIRE(dp_model_backward_range(&m, s, dx[s], g[s], m.params, dh[s], x[s], 0, k,
                                        batches[s]) == 0);
    }
    for (int s = 0; s < S; s++) {
        static whole w;
        run_whole(&one, &w, x[s], y[s], batches[s]);
        CHECKF(loss[s] == w.loss && correct[s] == w.correct, "%s slot %d: loss %.9g vs %.9g",
               spec, s, loss[s], w.loss);
        CHECKF(same(g[s], w.grads, m.n_params, 1e-6), "%s slot %d: gradients differ", spec, s);
        CHECKF(same(dx[s], w.dx, (size_t)batches[s] * dp_model_inputs(&m), 1e-6),
               "%s slot %d: input gradients differ", spec, s);
        CHECK(same(dp_model_act(&m, s, n), w.act[n],
                   (size_t)batches[s] * dp_model_classes(&m), 0));
    }
    dp_model_free(&m);
    dp_model_free(&one);
}

/* Parameters are an argument: other weights give what a model holding them
 * gives, and m->params is never touched. */
static void test_params_argument(void)
{
    dp_model m, other;
    float x[MAXB * MAXW];
    uint8_t y[MAXB];
    setup(&m, "20-16-12-8-5", 2, 3, x, y, MAXB);
    setup(&other, "20-16-12-8-5", 1, 4, x, y, MAXB);
    static float saved[MAXP];
    memcpy(saved, m.params, m.n_params * sizeof(float));
    int c1 = 0, c2 = 0;
    float l1 = dp_model_forward(&m, other.params, x, y, MAXB, &c1);
    float l2 = dp_model_forward(&other, other.params, x, y, MAXB, &c2);
    CHECK(l1 == l2 && c1 == c2);
    CHECK(memcmp(saved, m.params, m.n_params * sizeof(float)) == 0);
    float g1[MAXP], g2[MAXP];
    int n = m.n_layers;
    CHECK(dp_model_forward_range_loss(&m, 1, other.params, x, y, 0, MAXB, NULL) == l2);
    REQUIRE(dp_model_backward_range_loss(&m, 1, NULL, g1, other.params, x, y, 0, MAXB) == 0);
    CHECK(dp_model_forward_backward(&other, x, y, MAXB, NULL) == l2);
    memcpy(g2, other.grads, other.n_params * sizeof(float));
    CHECK(memcmp(g1, g2, m.n_params * sizeof(float)) == 0);
    CHECK(memcmp(saved, m.params, m.n_params * sizeof(float)) == 0);
    /* a range holding the loss layer without labels: the probabilities */
    const float *probs = dp_model_forward_range(&m, 0, other.params, x, 0, n, MAXB);
    REQUIRE(probs == dp_model_act(&m, 0, n));
    CHECK(same(probs, dp_model_act(&m, 1, n), (size_t)MAXB * dp_model_classes(&m), 0));
    dp_model_free(&m);
    dp_model_free(&other);
}

/* The hook: whole-model backprop tells each dense layer's offset, last first;
 * the range calls tell nobody. */
typedef struct hook_log {
    size_t lo[DP_MAX_DENSE + 1];
    int n;
} hook_log;

static void hook(void *ctx, size_t lo)
{
    hook_log *h = ctx;
    if (h->n <= DP_MAX_DENSE)
        h->lo[h->n] = lo;
    h->n++;
}

static void test_grad_ready(void)
{
    dp_model m;
    float x[MAXB * MAXW];
    uint8_t y[MAXB];
    setup(&m, "20-16-12-8-5", 1, 5, x, y, MAXB);
    hook_log log = {{0}, 0};
    m.grad_ready = hook;
    m.grad_ready_ctx = &log;
    dp_model_forward_backward(&m, x, y, MAXB, NULL);
    REQUIRE(log.n == m.n_dense);
    for (int i = 0, l = m.n_layers - 2; i < log.n; i++, l -= 2) {
        REQUIRE(m.layers[l].kind == DP_LAYER_DENSE);
        CHECK(log.lo[i] == m.layers[l].w_off);
    }
    float g[MAXP];
    dp_model_forward_range_loss(&m, 0, m.params, x, y, 0, MAXB, NULL);
    REQUIRE(dp_model_backward_range_loss(&m, 0, NULL, g, m.params, x, y, 0, MAXB) == 0);
    CHECK(log.n == m.n_dense);
    dp_model_free(&m);
}

static void test_bad_arguments(void)
{
    dp_model m;
    float x[MAXB * MAXW], d[MAXB * MAXW], g[MAXP];
    uint8_t y[MAXB];
    setup(&m, "6-5-4-3", 2, 6, x, y, MAXB);
    int n = m.n_layers;
    const float *p = m.params;
    CHECK(dp_model_forward_range(&m, 2, p, x, 0, 1, 1) == NULL);  /* slot */
    CHECK(dp_model_forward_range(&m, -1, p, x, 0, 1, 1) == NULL);
    CHECK(dp_model_forward_range(&m, 0, p, x, 1, 1, 1) == NULL);  /* empty */
    CHECK(dp_model_forward_range(&m, 0, p, x, -1, 1, 1) == NULL);
    CHECK(dp_model_forward_range(&m, 0, p, x, 0, n + 1, 1) == NULL);
    CHECK(dp_model_forward_range(&m, 0, p, x, 0, 1, 0) == NULL); /* batch */
    CHECK(dp_model_forward_range(&m, 0, p, x, 0, 1, MAXB + 1) == NULL);
    CHECK(isnan(dp_model_forward_range_loss(&m, 0, p, x, NULL, 0, 1, NULL))); /* labels */
    CHECK(isnan(dp_model_forward_range_loss(&m, 0, p, x, y, n, 1, NULL)));
    CHECK(isnan(dp_model_forward_range_loss(&m, 2, p, x, y, 0, 1, NULL)));
    /* the loss layer's backward needs labels: not through the plain call */
    CHECK(dp_model_backward_range(&m, 0, d, g, p, d, x, 0, n, 1) == -1);
    CHECK(dp_model_backward_range(&m, 0, d, g, p, d, x, 1, 1, 1) == -1);
    CHECK(dp_model_backward_range(&m, 2, d, g, p, d, x, 0, 1, 1) == -1);
    CHECK(dp_model_backward_range_loss(&m, 0, d, g, p, x, NULL, 0, 1) == -1);
    CHECK(dp_model_backward_range_loss(&m, 0, d, g, p, x, y, 0, MAXB + 1) == -1);
    CHECK(dp_model_act(&m, 0, 0) == NULL && dp_model_act(&m, 0, n + 1) == NULL);
    CHECK(dp_model_act(&m, 2, 1) == NULL && dp_model_act(&m, 1, n) != NULL);
    dp_model_free(&m);
    CHECK(dp_model_forward_range(&m, 0, p, x, 0, 1, 1) == NULL); /* freed */
    CHECK(dp_model_act(&m, 0, 1) == NULL);
}

int main(void)
{
    for (int threads = 1; threads <= 2; threads++) { /* products split over the pool too */
        dp_blas_set_threads(threads);
        for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
            for (uint64_t seed = 1; seed <= 3; seed++) {
                test_splits(specs[i], MAXB, seed);
                test_splits(specs[i], 3, seed + 10);
                test_layer_by_layer(specs[i], MAXB - 1, seed);
                test_input_gradient(specs[i], 4, seed);
            }
            test_slots(specs[i], 9);
        }
    }
    test_params_argument();
    test_grad_ready();
    test_bad_arguments();
    return CHECK_DONE();
}
