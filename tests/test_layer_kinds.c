/* The layer kinds tanh, sigmoid and gelu (element-wise), ln (layer norm,
 * over features or each position's channels) and gap (global average pooling), each through its table entry
 * (layer_kind.h):
 *   - the forward against a naive double-precision implementation;
 *   - the backward (input gradient and, for ln, weight and bias gradients)
 *     against double-precision central differences of that implementation,
 *     on odd sizes;
 *   - 1 and 2 threads give the same bits, forward and backward, and so do
 *     model parallelism's bands of rows where the kind splits by rows;
 *   - the device kernels (through the sim backend) give the CPU's bits;
 *   - ln's weight and bias in checkpoints under nn.LayerNorm's names;
 *   - model parallelism's plan runs gap whole on every task and refuses
 *     ln with its reason;
 *   - the preset mlp-bn's spec and parameter count;
 *   - whole models with them against finite differences of the loss, their
 *     canonical spelling, and specs that cannot work refused naming the
 *     token. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "layer_fd.h"
#include "model_fd.h"
#include "checkpoint_trip.h"
#include "device/dexec.h"
#include "device/device_impl.h"
#include "downpour/checkpoint.h"
#include "downpour/device.h"
#include "downpour/layer_kind.h"
#include "downpour/model.h"
#include "downpour/pool.h"
#include "downpour/rng.h"
#include "downpour/safetensors.h"
#include "exec/mp_slice.h"
#include "scratch.h"

static dp_rng rng;

static void fill(float *p, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        p[i] = lo + (hi - lo) * dp_rng_uniform(&rng);
}

/* A layer of kind k over C channels of h x w, as the grammar makes it. */
static dp_layer make(dp_layer_kind k, int C, int h, int w)
{
    dp_layer d;
    memset(&d, 0, sizeof d);
    d.kind = k;
    d.c = d.oc = C, d.h = d.oh = h, d.w = d.ow = w;
    d.in = d.out = C * h * w;
    if (k == DP_LAYER_GAP)
        d.oh = d.ow = 1, d.out = C;
    if (k == DP_LAYER_LAYERNORM)
        d.w_len = d.b_len = (size_t)C; /* a flat vector is C x 1 x 1 */
    return d;
}

/* The naive double-precision forward of one record: y (d->out) from x
 * (d->in), with weights w and bias b where the kind has them. */
static void naive(const dp_layer *d, double *y, const double *x, const double *w,
                  const double *b)
{
    if (d->kind == DP_LAYER_LAYERNORM) { /* nn.LayerNorm(C) at each position, eps 1e-5 */
        int C = d->c;
        for (int p = 0; p < d->h * d->w; p++, x += C, y += C) {
            double mu = 0, var = 0;
            for (int f = 0; f < C; f++)
                mu += x[f] / C;
            for (int f = 0; f < C; f++)
                var += (x[f] - mu) * (x[f] - mu) / C;
            for (int f = 0; f < C; f++)
                y[f] = (x[f] - mu) / sqrt(var + 1e-5) * w[f] + b[f];
        }
        return;
    }
    if (d->kind == DP_LAYER_GAP) {
        for (int ch = 0; ch < d->c; ch++) {
            y[ch] = 0;
            for (int p = 0; p < d->h * d->w; p++)
                y[ch] += x[p * d->c + ch] / (d->h * d->w);
        }
        return;
    }
    for (int i = 0; i < d->in; i++) {
        double v = x[i];
        switch (d->kind) {
        case DP_LAYER_TANH: y[i] = tanh(v); break;
        case DP_LAYER_SIGMOID: y[i] = 1.0 / (1.0 + exp(-v)); break;
        case DP_LAYER_GELU: y[i] = 0.5 * v * (1.0 + erf(v / sqrt(2.0))); break;
        default: REQUIRE(!"a kind this test knows");
        }
    }
}

/* What one CPU or device run of a layer produced. */
typedef struct run {
    float *y, *din, *gwb, *keep;
} run;

typedef struct fixture {
    dp_layer d;
    const dp_layer_ops *o;
    int batch;
    size_t nin, nout, np, kf;
    float *x, *dout, *wb;
} fixture;

static void fixture_open(fixture *f, dp_layer d, int batch)
{
    f->d = d;
    f->o = dp_layer_ops_of(&f->d);
    f->batch = batch;
    f->nin = (size_t)batch * d.in, f->nout = (size_t)batch * d.out;
    f->np = d.w_len + d.b_len;
    f->kf = f->o->keep_floats ? f->o->keep_floats(&f->d, batch) : 0;
    f->x = malloc(f->nin * sizeof(float));
    f->dout = malloc(f->nout * sizeof(float));
    f->wb = malloc((f->np + 1) * sizeof(float));
    REQUIRE(f->x && f->dout && f->wb);
    fill(f->x, f->nin, -3, 3);
    fill(f->dout, f->nout, -1, 1);
    fill(f->wb, f->np, 0.5f, 1.5f);
}

static void run_open(run *r, const fixture *f)
{
    r->y = malloc(f->nout * sizeof(float));
    r->din = malloc(f->nin * sizeof(float));
    r->gwb = malloc((f->np + 1) * sizeof(float));
    r->keep = malloc((f->kf + 1) * sizeof(float));
    REQUIRE(r->y && r->din && r->gwb && r->keep);
    /* not zeros: a value left unwritten shows */
    fill(r->y, f->nout, 7, 8), fill(r->din, f->nin, 7, 8), fill(r->gwb, f->np, 7, 8);
}

static void run_free(run *r) { free(r->y), free(r->din), free(r->gwb), free(r->keep); }

static dp_layer_call call_of(const fixture *f, run *r)
{
    const dp_layer *d = &f->d;
    dp_layer_call c = {.d = d, .batch = f->batch, .in = f->x, .out = r->y, .dout = f->dout,
                       .din = r->din, .keep = r->keep, .train = 1};
    if (d->w_len)
        c.w = f->wb, c.b = f->wb + d->w_len, c.gw = r->gwb, c.gb = r->gwb + d->w_len;
    return c;
}

static void cpu_run(const fixture *f, run *r)
{
    dp_layer_call c = call_of(f, r);
    f->o->forward(&c);
    f->o->backward(&c);
}

static void test_kind(dp_layer d, int batch)
{
    fixture f;
    fixture_open(&f, d, batch);
    const char *name = f.o->name;
    char what[128];
    snprintf(what, sizeof what, "%s over %dx%dx%d, batch %d", name, d.c, d.h, d.w, batch);

    /* 1 and 2 threads: the same bits */
    run r1, r2;
    run_open(&r1, &f), run_open(&r2, &f);
    REQUIRE(dp_pool_set_threads(1, NULL) == 0);
    cpu_run(&f, &r1);
    REQUIRE(dp_pool_set_threads(2, NULL) == 0);
    cpu_run(&f, &r2);
    CHECKF(memcmp(r1.y, r2.y, f.nout * sizeof(float)) == 0 &&
           memcmp(r1.din, r2.din, f.nin * sizeof(float)) == 0 &&
           memcmp(r1.gwb, r2.gwb, f.np * sizeof(float)) == 0,
           "%s: 1 and 2 threads differ", what);

    /* the forward against the naive one, the backward against central
     * differences of it */
    layer_fd fd = {.d = &f.d, .naive = naive, .batch = batch, .x = f.x, .dout = f.dout,
                   .wb = f.wb};
    layer_fd_open(&fd);
    double ey = layer_fd_forward_worst(&fd, r1.y);
    CHECKF(ey < 1e-5, "%s: forward %.2e from the double-precision one", what, ey);
    double eg = layer_fd_grad_worst(&fd, r1.din, r1.gwb, 1 + f.nin / 97, 1);
    CHECKF(eg < 1e-4, "%s: gradient %.2e from the finite differences", what, eg);
    layer_fd_close(&fd);

    /* model parallelism's bands of rows: together, the whole layer's bits */
    if (f.o->mp == DP_MP_ROWS && d.oh >= 2) {
        run rb;
        run_open(&rb, &f);
        for (int j = 0; j < 2; j++) {
            dp_layer_call c = call_of(&f, &rb);
            c.y0 = j ? d.oh / 2 : 0, c.y1 = j ? d.oh : d.oh / 2;
            f.o->mp_forward(&c);
            f.o->mp_backward(&c);
        }
        CHECKF(memcmp(r1.y, rb.y, f.nout * sizeof(float)) == 0 &&
               memcmp(r1.din, rb.din, f.nin * sizeof(float)) == 0,
               "%s: two bands of rows differ from the whole layer", what);
        run_free(&rb);
    }

    /* the device (sim): the CPU's bits */
    REQUIRE(dp_pool_set_threads(1, NULL) == 0);
    dp_device *dev = NULL;
    dp_device_spec sim = {.kind = DP_DEVICE_SIM};
    dp_err err;
    REQUIRE(dp_device_open(&dev, &sim, &err) == 0);
    dp_dexec ex = {.be = dp_device_backend(dev), .ctx = dp_device_ctx(dev)};
    run rd;
    run_open(&rd, &f);
    dp_layer_call c = call_of(&f, &rd);
    c.max_batch = batch;
    REQUIRE(f.o->dev_forward && f.o->dev_backward);
    f.o->dev_forward(&ex, &c);
    f.o->dev_backward(&ex, &c);
    char msg[256];
    REQUIRE(ex.be->sync(ex.ctx, msg, sizeof msg) == 0);
    CHECKF(memcmp(r1.y, rd.y, f.nout * sizeof(float)) == 0 &&
           memcmp(r1.din, rd.din, f.nin * sizeof(float)) == 0 &&
           memcmp(r1.gwb, rd.gwb, f.np * sizeof(float)) == 0,
           "%s: the device's bits differ from the CPU's", what);
    dp_device_close(dev);
    printf("%s: forward within %.1e of double precision, gradients within %.1e of finite "
           "differences, 1 and 2 threads and the device (sim) the same bits\n",
           what, ey, eg);
    run_free(&r1), run_free(&r2), run_free(&rd);
    free(f.x), free(f.dout), free(f.wb);
}

/* A whole model: the gradient of the mean loss against finite differences. */
static void test_model(const char *spec, const char *canonical, int batch)
{
    dp_model m;
    dp_err err;
    REQUIRE(dp_model_init(&m, spec, batch, 1, &err) == 0);
    CHECKF(strcmp(m.spec, canonical) == 0, "%s: spelled %s", spec, m.spec);
    dp_model_init_params(&m, 11);
    fill(m.params, m.n_params, -0.8f, 0.8f);
    size_t nx = (size_t)batch * dp_model_inputs(&m);
    float *x = malloc(nx * sizeof *x);
    uint8_t y[16];
    REQUIRE(x && batch <= 16);
    fill(x, nx, 0, 1);
    for (int i = 0; i < batch; i++)
        y[i] = (uint8_t)(i % dp_model_classes(&m));
    double worst = model_fd_worst(&m, x, y, batch);
    CHECKF(worst < 1e-2, "%s: gradient error %.2e", spec, worst);
    printf("%s: whole-model gradient within %.1e of finite differences\n", spec, worst);
    free(x);
    dp_model_free(&m);
}

/* ln's weight and bias under PyTorch's names and shapes, read back. */
static void test_checkpoint(void)
{
    dp_model m;
    dp_err err;
    REQUIRE(dp_model_init(&m, "1x5x5-conv3x3x2-gelu-gap-ln-dense6-ln-3", 4, 1, &err) == 0);
    dp_model_init_params(&m, 3);
    const dp_layer *ln = NULL;
    for (int l = 0; l < m.n_layers && !ln; l++)
        if (m.layers[l].kind == DP_LAYER_LAYERNORM)
            ln = &m.layers[l];
    REQUIRE(ln && ln->w_len == 2);
    CHECK(m.params[ln->w_off] == 1.0f && m.params[ln->b_off] == 0.0f); /* nn.LayerNorm's */
    fill(m.params, m.n_params, -1, 1);
    checkpoint_trip t;
    checkpoint_trip_write(&t, "test_layer_kinds", &m, 1);
    static const checkpoint_want want[] = {{"layers.1.weight", 1, {2}}, {"layers.3.bias", 1, {6}}};
    checkpoint_trip_shapes(&t, want, sizeof want / sizeof want[0]);
    checkpoint_trip_back(&t, &m, 4, NULL);
    dp_model_free(&m);
    printf("checkpoint: ln's weight and bias as nn.LayerNorm names them, read back bit-exact\n");
}

/* The preset mlp-bn: its spec and docs/models.md's parameter count. */
static void test_preset(void)
{
    dp_model m;
    dp_err err;
    REQUIRE(dp_model_init(&m, "mlp-bn", 8, 1, &err) == 0);
    CHECK(strcmp(m.name, "mlp-bn") == 0 &&
          strcmp(m.spec, "784-dense300-bn-relu-dense100-bn-relu-10") == 0);
    CHECKF(m.n_params == 267410 && m.n_buffers == (2 * 300 + 1) + (2 * 100 + 1),
           "mlp-bn: %zu parameters, %zu buffers", m.n_params, m.n_buffers);
    printf("mlp-bn: %s, %zu parameters\n", m.spec, m.n_params);
    dp_model_free(&m);
}

/* Model parallelism's plan: gap runs whole on every task (after the rows
 * of a conv); what cannot be split is refused with the reason. */
static void test_mp(void)
{
    dp_model m;
    dp_err err;
    mp_plan p;
    REQUIRE(dp_model_init(&m, "1x8x8-conv3x3x4-gelu-gap-16-10", 4, 1, &err) == 0);
    CHECKF(mp_plan_make(&p, &m, 2, 1, &err) == 0, "gap: %s", err.msg);
    dp_model_free(&m);
    printf("model parallelism: 1x8x8-conv3x3x4-gelu-gap-16-10 splits over 2 tasks\n");
    REQUIRE(dp_model_init(&m, "1x8x8-conv3x3x4-relu-flatten-ln-16-10", 4, 1, &err) == 0);
    CHECKF(mp_plan_make(&p, &m, 2, 0, &err) < 0 && strstr(err.msg, "is ln") &&
           strstr(err.msg, "not split yet"), "ln: %s", err.msg);
    printf("model parallelism: %s\n", err.msg);
    dp_model_free(&m);
}

/* gelu's own Phi and phi (kernels.h) over a fine sweep against double
 * precision: the bounds its comment states, and NaN stays NaN. */
static void test_gelu_accuracy(void)
{
    double worst[3] = {0, 0, 0}, gworst = 0;
    for (int i = -9 * 4096; i <= 9 * 4096; i++) {
        float x = (float)i / 4096.0f + (float)dp_rng_uniform(&rng) / 4096.0f;
        double phi2 = erfc(-(double)x / sqrt(2.0)); /* 2 Phi(x), no cancellation */
        double y = 0.5 * x * phi2, g = 0.5 * phi2 + x * exp(-0.5 * (double)x * x) / sqrt(2 * M_PI);
        int band = fabsf(x) < 1 ? 0 : fabsf(x) < 3 ? 1 : 2;
        if (y != 0) {
            double e = fabs(dp_k_gelu_f(x) - y) / fabs(y);
            worst[band] = e > worst[band] ? e : worst[band];
        }
        /* absolute: Phi + x phi cancels for negative x (to 6e-4 near -0.75),
         * in any float arithmetic; the terms are at most about 1 */
        double eg = fabs(dp_k_gelu_g(1.0f, x, 0.0f) - g);
        gworst = eg > gworst ? eg : gworst;
    }
    CHECKF(worst[0] < 5e-7 && worst[1] < 2e-6 && worst[2] < 1e-5,
           "gelu: relative error %.2e (|x| < 1), %.2e (< 3), %.2e (< 9)", worst[0], worst[1],
           worst[2]);
    CHECKF(gworst < 5e-7, "gelu's gradient: error %.2e", gworst);
    CHECK(isnan(dp_k_gelu_f(NAN)) && isnan(dp_k_gelu_g(1.0f, NAN, 0.0f)));
    CHECK(dp_k_gelu_f(100.0f) == 100.0f && fabsf(dp_k_gelu_f(-100.0f)) < 1e-30f);
    printf("gelu: within %.1e, %.1e and %.1e of double precision for |x| < 1, 3 and 9; "
           "its gradient within %.1e (absolute)\n",
           worst[0], worst[1], worst[2], gworst);
}

/* A spec that cannot work: refused, naming the token and saying why. */
static void refused(const char *spec, const char *token, const char *why)
{
    dp_model m;
    dp_err err;
    CHECKF(dp_model_init(&m, spec, 4, 1, &err) < 0, "%s: accepted", spec);
    CHECKF(strstr(err.msg, token) && strstr(err.msg, why), "%s: '%s'", spec, err.msg);
    printf("refused: %s\n", err.msg);
}

int main(void)
{
    dp_rng_seed(&rng, 2028);
    test_gelu_accuracy();
    static const dp_layer_kind acts[] = {DP_LAYER_TANH, DP_LAYER_SIGMOID, DP_LAYER_GELU};
    for (size_t k = 0; k < sizeof acts / sizeof acts[0]; k++) {
        test_kind(make(acts[k], 13, 1, 1), 7);  /* features after a dense layer */
        test_kind(make(acts[k], 3, 5, 7), 3);   /* an NHWC image */
    }
    test_model("8-dense7-tanh-dense5-sigmoid-dense6-gelu-3",
               "8-dense7-tanh-dense5-sigmoid-dense6-gelu-3", 5);
    test_model("1x6x6-conv3x3x3-gelu-conv3x3x2-tanh-dense5-sigmoid-3",
               "1x6x6-conv3x3x3-gelu-conv3x3x2-tanh-dense5-sigmoid-3", 4);
    test_kind(make(DP_LAYER_GAP, 5, 3, 7), 3);
    test_kind(make(DP_LAYER_GAP, 1, 9, 1), 2);
    test_model("1x6x6-conv3x3x5-tanh-gap-dense4-gelu-3", "1x6x6-conv3x3x5-tanh-gap-dense4-gelu-3",
               4);
    test_model("2x5x5-gap-3", "2x5x5-gap-3", 3); /* an hwc first: 2 channels */
    test_kind(make(DP_LAYER_LAYERNORM, 13, 1, 1), 5);
    test_kind(make(DP_LAYER_LAYERNORM, 1, 1, 1), 3); /* one feature: y = bias */
    test_kind(make(DP_LAYER_LAYERNORM, 37, 1, 1), 1);
    test_model("8-dense7-ln-gelu-dense5-ln-3", "8-dense7-ln-gelu-dense5-ln-3", 5);
    test_model("2x4x4-conv3x3x3-flatten-ln-tanh-3", "2x4x4-conv3x3x3-flatten-ln-tanh-3", 3);
    test_model("3x4x4-gap-ln-2", "3x4x4-gap-ln-2", 4);
    test_kind(make(DP_LAYER_LAYERNORM, 5, 3, 3), 2); /* tokens: each position's channels */
    test_model("1x5x5-conv3x3x3-ln-gelu-3", "1x5x5-conv3x3x3-ln-gelu-3", 3);
    test_checkpoint();
    test_preset();
    test_mp();
    refused("784-300-tanh", "token 3 'tanh'", "the last layer must be dense");
    refused("784-gap-10", "token 2 'gap'", "needs an image");
    refused("1x8x8-gap-conv3x3x2-10", "token 3 'conv3x3x2'", "needs an image");
    refused("784-ln1-10", "token 2 'ln1'", "unknown layer");
    refused("784-gelu2-10", "token 2 'gelu2'", "unknown layer");
    return CHECK_DONE();
}
