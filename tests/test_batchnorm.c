/* Batch norm (src/nn/layer_batchnorm.c) and the buffers beside the
 * parameters (docs/architecture.md, "Buffers"):
 *   - the layer's training forward (batch statistics, running statistics
 *     moved with momentum 0.1 and the unbiased variance, the batch count)
 *     and evaluation forward (running statistics) against a naive
 *     double-precision implementation, over features (R = batch) and over
 *     channels of an NHWC image (R = batch*h*w), 1 and 2 threads the same bits;
 *   - its backward against finite differences of sum(dout * out), in double;
 *   - a whole model with bn after a conv and after a dense layer against
 *     finite differences of the loss;
 *   - the checkpoint writes weight, bias, running_mean, running_var and
 *     num_batches_tracked under PyTorch's names and shapes, and reads them
 *     back bit-exact (weights and training state);
 *   - its device kernels (through the sim backend) give the CPU's bits:
 *     output, statistics, running statistics, gradients;
 *   - the CPU executor's fusions (a relu into the bn or residual sum
 *     before it, its backward into the bn's, a block's shortcut gradient
 *     added in the relu before the block) give the unfused bits;
 *   - run again under each DOWNPOUR_ISA cap (tests/CMakeLists.txt): the
 *     passes' AVX-512, AVX2 and baseline builds give the device's bits;
 *   - model parallelism refuses it, naming the layer and its rule. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "model_fd.h"
#include "downpour/checkpoint.h"
#include "downpour/device.h"
#include "downpour/layer_kind.h"
#include "downpour/model.h"
#include "downpour/pool.h"
#include "downpour/rng.h"
#include "downpour/safetensors.h"
#include "device/dexec.h"
#include "device/device_impl.h"
#include "exec/mp_slice.h"
#include "checkpoint_trip.h"
#include "scratch.h"

static dp_rng rng;

static void fill(float *p, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        p[i] = lo + (hi - lo) * dp_rng_uniform(&rng);
}

/* A bn layer over C channels of h x w pixels, as the grammar makes it. */
static dp_layer bn_layer(int C, int h, int w)
{
    dp_layer d;
    memset(&d, 0, sizeof d);
    d.kind = DP_LAYER_BATCHNORM;
    d.c = d.oc = C, d.h = d.oh = h, d.w = d.ow = w;
    d.in = d.out = C * h * w;
    d.w_len = d.b_len = (size_t)C;
    d.s_len = 2 * (size_t)C + 1;
    return d;
}

/* Naive double-precision batch norm, training: y, and the running
 * statistics moved as PyTorch moves them. */
static void naive_train(double *y, double *rm, double *rv, const float *x, const float *g,
                        const float *b, int C, size_t R)
{
    for (int ch = 0; ch < C; ch++) {
        double mu = 0, var = 0;
        for (size_t r = 0; r < R; r++)
            mu += x[r * C + ch];
        mu /= (double)R;
        for (size_t r = 0; r < R; r++)
            var += (x[r * C + ch] - mu) * (x[r * C + ch] - mu);
        var /= (double)R;
        for (size_t r = 0; r < R; r++)
            y[r * C + ch] = (x[r * C + ch] - mu) / sqrt(var + 1e-5) * g[ch] + b[ch];
        rm[ch] = 0.9 * rm[ch] + 0.1 * mu;
        rv[ch] = 0.9 * rv[ch] + 0.1 * var * (double)R / (double)(R - 1);
    }
}

static double max_err(const float *a, const double *b, size_t n)
{
    double e = 0, scale = 1e-3;
    for (size_t i = 0; i < n; i++) {
        e = fmax(e, fabs(a[i] - b[i]));
        scale = fmax(scale, fabs(b[i]));
    }
    return e / scale;
}

static float run_forward(const dp_layer *d, float *y, const float *x, const float *wb,
                         float *state, float *keep, int batch, int train)
{
    dp_layer_call c = {.d = d, .batch = batch, .w = wb, .b = wb + d->c, .in = x, .out = y,
                       .state = state, .keep = keep, .train = train};
    return dp_layer_ops_of(d)->forward(&c);
}

static void test_forward(int C, int h, int w, int batch)
{
    dp_layer d = bn_layer(C, h, w);
    size_t R = (size_t)batch * h * w, n = R * C;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y), *y2 = malloc(n * sizeof *y);
    float wb[64], state[129], state2[129], keep[5 * 32 + 2];
    double *ny = malloc(n * sizeof *ny), rm[32], rv[32];
    REQUIRE(x && y && y2 && ny && C <= 32);
    fill(x, n, -2, 3);
    fill(wb, 2 * (size_t)C, -1, 1);
    dp_layer_ops_of(&d)->init_buffers(&d, state);
    for (int ch = 0; ch < C; ch++)
        rm[ch] = 0, rv[ch] = 1;
    for (int step = 0; step < 3; step++) { /* the running statistics move each step */
        for (size_t i = 0; i < n; i++)
            x[i] += 0.5f; /* a new batch */
        memcpy(state2, state, sizeof state);
        REQUIRE(dp_pool_set_threads(1, NULL) == 0);
        run_forward(&d, y, x, wb, state, keep, batch, 1);
        REQUIRE(dp_pool_set_threads(2, NULL) == 0);
        run_forward(&d, y2, x, wb, state2, keep, batch, 1);
        CHECK(memcmp(y, y2, n * sizeof *y) == 0 && memcmp(state, state2, sizeof state) == 0);
        naive_train(ny, rm, rv, x, wb, wb + C, C, R);
        double ey = max_err(y, ny, n), em = 0, ev = 0;
        for (int ch = 0; ch < C; ch++) {
            em = fmax(em, fabs(state[ch] - rm[ch]));
            ev = fmax(ev, fabs(state[C + ch] - rv[ch]) / rv[ch]);
        }
        CHECKF(ey < 1e-5 && em < 1e-5 && ev < 1e-5, "bn %dx%dx%d batch %d step %d: y %.1e "
               "running mean %.1e var %.1e", C, h, w, batch, step, ey, em, ev);
        CHECK(state[2 * C] == (float)(step + 1));
    }
    /* evaluation: the running statistics, which it leaves alone */
    memcpy(state2, state, sizeof state);
    run_forward(&d, y, x, wb, state, keep, batch, 0);
    CHECK(memcmp(state, state2, sizeof state) == 0);
    for (size_t r = 0; r < R; r++)
        for (int ch = 0; ch < C; ch++)
            ny[r * C + ch] = (x[r * C + ch] - rm[ch]) / sqrt(rv[ch] + 1e-5) * wb[ch] + wb[C + ch];
    double ee = max_err(y, ny, n);
    CHECKF(ee < 1e-5, "bn %dx%dx%d evaluation: %.1e", C, h, w, ee);
    printf("bn over %d channel(s) of %dx%d, batch %d: forward and running statistics match "
           "the double-precision reference\n", C, h, w, batch);
    free(x), free(y), free(y2), free(ny);
}

/* sum(dout * bn(x)) in double, training statistics, for finite differences. */
static double objective(const dp_layer *d, const float *x, const float *wb, const float *dout,
                        int batch)
{
    size_t n = (size_t)batch * d->in;
    float *y = malloc(n * sizeof *y), state[129], keep[5 * 32 + 2];
    dp_layer_ops_of(d)->init_buffers(d, state);
    run_forward(d, y, x, wb, state, keep, batch, 1);
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)dout[i] * y[i];
    free(y);
    return s;
}

static void test_backward(int C, int h, int w, int batch)
{
    dp_layer d = bn_layer(C, h, w);
    size_t n = (size_t)batch * d.in;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y), *dout = malloc(n * sizeof *y);
    float *din = malloc(n * sizeof *din), wb[64], gwb[64], state[129], keep[5 * 32 + 2];
    REQUIRE(x && y && dout && din);
    fill(x, n, -2, 2);
    fill(dout, n, -1, 1);
    fill(wb, 2 * (size_t)C, 0.5f, 1.5f);
    dp_layer_ops_of(&d)->init_buffers(&d, state);
    run_forward(&d, y, x, wb, state, keep, batch, 1);
    dp_layer_call c = {.d = &d, .batch = batch, .w = wb, .b = wb + C, .gw = gwb,
                       .gb = gwb + C, .in = x, .out = y, .dout = dout, .din = din, .keep = keep,
                       .state = state};
    dp_layer_ops_of(&d)->backward(&c);
    const float hstep = 1e-2f;
    double worst = 0;
    for (size_t i = 0; i < n; i += 1 + n / 40) {
        float v = x[i];
        x[i] = v + hstep;
        double up = objective(&d, x, wb, dout, batch);
        x[i] = v - hstep;
        double dn = objective(&d, x, wb, dout, batch);
        x[i] = v;
        double fd = (up - dn) / (2.0 * hstep);
        worst = fmax(worst, fabs(fd - din[i]) / fmax(1.0, fabs(fd)));
    }
    for (int k = 0; k < 2 * C; k++) {
        float v = wb[k];
        wb[k] = v + hstep;
        double up = objective(&d, x, wb, dout, batch);
        wb[k] = v - hstep;
        double dn = objective(&d, x, wb, dout, batch);
        wb[k] = v;
        double fd = (up - dn) / (2.0 * hstep);
        worst = fmax(worst, fabs(fd - gwb[k]) / fmax(1.0, fabs(fd)));
    }
    CHECKF(worst < 2e-2, "bn %dx%dx%d batch %d: gradient error %.2e", C, h, w, batch, worst);
    printf("bn over %d channel(s) of %dx%d, batch %d: gradients within %.1e of finite "
           "differences\n", C, h, w, batch, worst);
    free(x), free(y), free(dout), free(din);
}

/* A whole model: the gradient of the mean loss against finite differences. */
static void test_model(const char *spec, int batch)
{
    dp_model m;
    dp_err err;
    REQUIRE(dp_model_init(&m, spec, batch, 1, &err) == 0);
    dp_model_init_params(&m, 7);
    /* gamma and beta off 1 and 0, so their gradients matter */
    for (int l = 0; l < m.n_layers; l++)
        if (m.layers[l].kind == DP_LAYER_BATCHNORM)
            fill(m.params + m.layers[l].w_off, 2 * m.layers[l].w_len, 0.5f, 1.5f);
    size_t nx = (size_t)batch * dp_model_inputs(&m);
    float *x = malloc(nx * sizeof *x);
    uint8_t y[16];
    fill(x, nx, 0, 1);
    for (int i = 0; i < batch; i++)
        y[i] = (uint8_t)(i % dp_model_classes(&m));
    double worst = model_fd_worst(&m, x, y, batch);
    CHECKF(worst < 1e-2, "%s: gradient error %.2e", spec, worst);
    printf("%s: whole-model gradient within %.1e of finite differences\n", spec, worst);
    free(x);
    dp_model_free(&m);
}

/* The CPU executor's fusions (a relu into the bn or residual sum before it,
 * its backward into the bn's, a block's shortcut gradient added in the
 * relu's backward before it; dp_model_cpu_fusions) give the bits of each
 * layer run alone: a training step's loss, gradients, input gradient and
 * running statistics, and an evaluation forward's probabilities. */
static void test_fused(const char *spec, int batch)
{
    float loss[2], eval[2], *grads[2], *dx[2], *buf[2], *probs[2];
    size_t np = 0, nb = 0, nx = 0, no = 0;
    for (int k = 0; k < 2; k++) {
        dp_model_cpu_fusions(k == 0);
        dp_model m;
        dp_err err;
        REQUIRE(dp_model_init(&m, spec, batch, 1, &err) == 0);
        dp_model_init_params(&m, 11);
        dp_rng r;
        dp_rng_seed(&r, 99);
        /* gamma near 1, beta either side of 0: each relu passes about half */
        for (int l = 0; l < m.n_layers; l++)
            if (m.layers[l].kind == DP_LAYER_BATCHNORM)
                for (size_t i = 0; i < m.layers[l].w_len; i++) {
                    m.params[m.layers[l].w_off + i] = 0.5f + dp_rng_uniform(&r);
                    m.params[m.layers[l].b_off + i] = dp_rng_uniform(&r) - 0.5f;
                }
        np = m.n_params, nb = m.n_buffers, nx = (size_t)batch * dp_model_inputs(&m);
        no = (size_t)batch * dp_model_classes(&m);
        float *x = malloc(nx * sizeof *x);
        uint8_t y[64];
        for (size_t i = 0; i < nx; i++)
            x[i] = 2.0f * dp_rng_uniform(&r) - 1.0f;
        for (int i = 0; i < batch; i++)
            y[i] = (uint8_t)(i % dp_model_classes(&m));
        grads[k] = malloc(np * sizeof(float)), dx[k] = malloc(nx * sizeof(float));
        buf[k] = malloc(nb * sizeof(float)), probs[k] = malloc(no * sizeof(float));
        /* the fusion is taken: a bn's or a sum's output before the relu
         * after it is never written (poisoned here), unfused it is */
        int fusable = 0;
        for (int l = 0; l + 1 < m.n_layers; l++)
            if ((m.layers[l].kind == DP_LAYER_BATCHNORM || m.layers[l].kind == DP_LAYER_RES) &&
                m.layers[l + 1].kind == DP_LAYER_RELU) {
                float *pre = dp_model_act(&m, 0, l + 1);
                for (int i = 0; i < batch * m.layers[l].out; i++)
                    pre[i] = NAN;
                fusable++;
            }
        REQUIRE(fusable > 0);
        loss[k] = dp_model_forward_range_loss(&m, 0, m.params, x, y, 0, batch, NULL);
        REQUIRE(dp_model_backward_range_loss(&m, 0, dx[k], grads[k], m.params, x, y, 0,
                                             batch) == 0);
        memcpy(buf[k], m.buffers, nb * sizeof(float));
        eval[k] = dp_model_forward(&m, m.params, x, y, batch, NULL);
        memcpy(probs[k], dp_model_act(&m, 0, m.n_layers), no * sizeof(float));
        for (int l = 0; l + 1 < m.n_layers; l++)
            if ((m.layers[l].kind == DP_LAYER_BATCHNORM || m.layers[l].kind == DP_LAYER_RES) &&
                m.layers[l + 1].kind == DP_LAYER_RELU) {
                const float *pre = dp_model_act(&m, 0, l + 1);
                int written = 0;
                for (int i = 0; i < batch * m.layers[l].out; i++)
                    written += !isnan(pre[i]);
                CHECKF(k == 0 ? written == 0 : written == batch * m.layers[l].out,
                       "%s: layer %d's output before its relu: %d of %d written %s", spec, l,
                       written, batch * m.layers[l].out, k == 0 ? "fused" : "alone");
            }
        free(x);
        dp_model_free(&m);
    }
    dp_model_cpu_fusions(1);
    CHECKF(memcmp(&loss[0], &loss[1], sizeof(float)) == 0, "%s: loss %.9g fused, %.9g alone",
           spec, loss[0], loss[1]);
    CHECKF(memcmp(grads[0], grads[1], np * sizeof(float)) == 0, "%s: gradients differ", spec);
    CHECKF(memcmp(dx[0], dx[1], nx * sizeof(float)) == 0, "%s: input gradients differ", spec);
    CHECKF(memcmp(buf[0], buf[1], nb * sizeof(float)) == 0, "%s: running statistics differ",
           spec);
    CHECK(memcmp(&eval[0], &eval[1], sizeof(float)) == 0);
    CHECKF(memcmp(probs[0], probs[1], no * sizeof(float)) == 0, "%s: evaluation differs", spec);
    printf("%s: fused and unfused the same bits\n", spec);
    for (int k = 0; k < 2; k++)
        free(grads[k]), free(dx[k]), free(buf[k]), free(probs[k]);
}

/* Weights and buffers under PyTorch's names, back bit-exact. */
static void test_checkpoint(void)
{
    const char *spec = "1x6x6-conv3x3x4-bn-relu-dense8-bn-relu-3";
    dp_model m, back;
    dp_err err;
    REQUIRE(dp_model_init(&m, spec, 8, 1, &err) == 0);
    dp_model_init_params(&m, 3);
    CHECK(m.n_buffers == (2 * 4 + 1) + (2 * 8 + 1));
    float x[8 * 36];
    uint8_t y[8] = {0, 1, 2, 0, 1, 2, 0, 1};
    fill(x, sizeof x / sizeof x[0], 0, 1);
    for (int s = 0; s < 3; s++)
        dp_model_forward_backward(&m, x, y, 8, NULL);
    checkpoint_trip t;
    dp_safetensors *f = checkpoint_trip_write(&t, "test_batchnorm", &m, 3);
    static const checkpoint_want want[] = {{"layers.1.running_var", 1, {4}},
                                           {"layers.1.weight", 1, {4}},
                                           {"layers.3.num_batches_tracked", 0, {0}},
                                           {"layers.3.running_mean", 1, {8}}};
    checkpoint_trip_shapes(&t, want, sizeof want / sizeof want[0]);
    const dp_st_tensor *n = dp_safetensors_find(f, "layers.3.num_batches_tracked");
    CHECK(n && n->data[0] == 3.0f);
    checkpoint_trip_back(&t, &m, 8, &back);
    /* evaluation gives the same loss from the file's weights and statistics */
    int c1 = 0, c2 = 0;
    float l1 = dp_model_forward(&m, m.params, x, y, 8, &c1);
    float l2 = dp_model_forward(&back, back.params, x, y, 8, &c2);
    CHECK(l1 == l2 && c1 == c2);
    dp_model_free(&back);
    dp_model_free(&m);
    printf("checkpoint: bn weights and buffers under PyTorch's names, read back bit-exact\n");
}

static void test_refusals(void)
{
    dp_model m;
    dp_err err;
    REQUIRE(dp_model_init(&m, "1x8x8-conv3x3x4-bn-relu-10", 4, 1, &err) == 0);
    CHECK(strcmp(m.spec, "1x8x8-conv3x3x4-bn-relu-10") == 0);
    mp_plan p;
    CHECK(mp_plan_make(&p, &m, 2, 0, &err) < 0 && strstr(err.msg, "bn") &&
          strstr(err.msg, "not split yet"));
    printf("model parallelism: %s\n", err.msg);
    dp_model_free(&m);
    CHECK(dp_model_init(&m, "784-bn2-10", 4, 1, &err) < 0);
}

/* The device kernels through sim against the CPU's: the same bits. */
static void test_device(int C, int h, int w, int batch)
{
    dp_layer d = bn_layer(C, h, w);
    const dp_layer_ops *o = dp_layer_ops_of(&d);
    /* the keep's first 3C floats (mean, 1/std, variance) are compared; the
     * rest is each side's own scratch */
    size_t n = (size_t)batch * d.in, kf = o->dev_keep(&d, batch);
    size_t kc = o->keep_floats(&d, batch) > kf ? o->keep_floats(&d, batch) : kf;
    float *x = malloc(n * sizeof *x), *dout = malloc(n * sizeof *x);
    float *y[2], *din[2], *keep[2], state[2][129], gwb[2][64], wb[64];
    REQUIRE(x && dout && C <= 32);
    fill(x, n, -2, 2);
    fill(dout, n, -1, 1);
    fill(wb, 2 * (size_t)C, 0.5f, 1.5f);
    dp_device *dev = NULL;
    dp_device_spec sim = {.kind = DP_DEVICE_SIM};
    dp_err err;
    REQUIRE(dp_device_open(&dev, &sim, &err) == 0);
    dp_dexec ex = {.be = dp_device_backend(dev), .ctx = dp_device_ctx(dev)};
    for (int k = 0; k < 2; k++) { /* k = 0: the CPU; 1: the device */
        y[k] = malloc(n * sizeof *x), din[k] = malloc(n * sizeof *x);
        keep[k] = calloc(kc, sizeof(float));
        REQUIRE(y[k] && din[k] && keep[k]);
        o->init_buffers(&d, state[k]);
        state[k][0] = 0.25f; /* a running mean that moves */
        dp_layer_call c = {.d = &d, .batch = batch, .w = wb, .b = wb + C, .gw = gwb[k],
                           .gb = gwb[k] + C, .in = x, .out = y[k], .dout = dout, .din = din[k],
                           .keep = keep[k], .state = state[k], .train = 1};
        if (k == 0) {
            o->forward(&c);
            o->backward(&c);
        } else {
            o->dev_forward(&ex, &c);
            o->dev_backward(&ex, &c);
            char msg[256];
            REQUIRE(ex.be->sync(ex.ctx, msg, sizeof msg) == 0);
        }
    }
    CHECKF(memcmp(y[0], y[1], n * sizeof *x) == 0 && memcmp(din[0], din[1], n * sizeof *x) == 0 &&
           memcmp(keep[0], keep[1], 3 * (size_t)C * sizeof(float)) == 0 &&
           memcmp(state[0], state[1], d.s_len * sizeof(float)) == 0 &&
           memcmp(gwb[0], gwb[1], 2 * (size_t)C * sizeof(float)) == 0,
           "bn %dx%dx%d batch %d: the device's bits differ from the CPU's", C, h, w, batch);
    printf("bn over %d channel(s) of %dx%d, batch %d: the device (sim) gives the CPU's bits\n",
           C, h, w, batch);
    dp_device_close(dev);
    for (int k = 0; k < 2; k++)
        free(y[k]), free(din[k]), free(keep[k]);
    free(x), free(dout);
}

int main(void)
{
    dp_rng_seed(&rng, 2015);
    test_forward(3, 1, 1, 5);  /* features after a dense layer */
    test_forward(4, 3, 5, 2);  /* channels of an NHWC image */
    test_forward(1, 7, 7, 1);
    test_backward(3, 1, 1, 6);
    test_backward(2, 3, 3, 3);
    test_model("8-dense6-bn-relu-3", 5);
    /* smooth ones (no relu or max kinks inside a finite difference's step) */
    test_model("1x6x6-conv3x3x3-bn-avgpool2-dense5-bn-3", 4);
    test_model("2x5x5-conv3x3x3p1-bn-dense4-bn-3", 3);
    test_fused("8-dense6-bn-relu-dense5-bn-relu-3", 7);
    /* a stem and two residual blocks, one with a projection: every fusion */
    test_fused("2x6x6-conv3x3x16p1-bn-relu-res(conv3x3x16p1-bn-relu-conv3x3x16p1-bn)-relu"
               "-res(conv3x3x32s2p1-bn-relu-conv3x3x32p1-bn|conv1x1x32s2-bn)-relu-gap-4",
               5);
    REQUIRE(dp_pool_set_threads(2, NULL) == 0);
    test_fused("8-dense6-bn-relu-dense5-bn-relu-3", 7);
    test_fused("2x6x6-conv3x3x16p1-bn-relu-res(conv3x3x16p1-bn-relu-conv3x3x16p1-bn)-relu"
               "-res(conv3x3x32s2p1-bn-relu-conv3x3x32p1-bn|conv1x1x32s2-bn)-relu-gap-4",
               5);
    test_checkpoint();
    test_refusals();
    REQUIRE(dp_pool_set_threads(1, NULL) == 0);
    test_device(3, 1, 1, 6);
    test_device(4, 3, 5, 2);
    test_device(5, 7, 7, 3);  /* 147 rows: three blocks, the last short */
    test_device(32, 2, 2, 64); /* 256 rows: four whole blocks */
    return CHECK_DONE();
}
