/* The transformer's layer kinds over tokens (docs/models.md, "Images as
 * tokens"): mha (multi-head self-attention), pos (a learned position
 * embedding) and emb (an embedding of integer ids), each through its table entry
 * (layer_kind.h):
 *   - the forward against a naive double-precision implementation, and the
 *     backward (input and parameter gradients) against double-precision
 *     central differences of it, on odd token counts and widths, 1 and 3
 *     heads; 1 and 2 threads give the same bits, and the device (sim)
 *     the CPU's bits (mha: within rounding);
 *   - emb rounds and clamps bad ids, and counts them;
 *   - whole models with them (and ln over tokens) against finite
 *     differences of the loss, and every range cut of such a model gives
 *     the whole model's loss and gradients bit for bit;
 *   - their tensors in checkpoints under PyTorch's names and shapes, read
 *     back bit-exact, and their initial values' spread;
 *   - refusals naming the token (heads that do not divide the width, emb
 *     anywhere but on the model's input) and model parallelism's reason. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "device/dexec.h"
#include "device/device_impl.h"
#include "layer_fd.h"
#include "model_fd.h"
#include "downpour/checkpoint.h"
#include "downpour/device.h"
#include "downpour/layer_kind.h"
#include "downpour/model.h"
#include "downpour/pool.h"
#include "downpour/rng.h"
#include "downpour/safetensors.h"
#include "exec/mp_slice.h"
#include "checkpoint_trip.h"

static dp_rng rng;

static void fill(float *p, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        p[i] = lo + (hi - lo) * dp_rng_uniform(&rng);
}

/* Layer l of spec, as the grammar builds it. */
static dp_layer layer_of(const char *spec, int l)
{
    dp_model m;
    dp_err err;
    REQUIRE(dp_model_init(&m, spec, 1, 1, &err) == 0);
    dp_layer d = m.layers[l];
    dp_model_free(&m);
    return d;
}

/* One record's naive forward in double: y (T, D) from x, w (the weight
 * region), b (the bias region). */
static void naive(const dp_layer *d, double *y, const double *x, const double *w,
                  const double *b)
{
    int T = d->h * d->w, D = d->c;
    if (d->kind == DP_LAYER_POS) {
        for (int i = 0; i < T * D; i++)
            y[i] = x[i] + w[i];
        return;
    }
    if (d->kind == DP_LAYER_EMB) { /* ids rounded and clamped, as documented */
        int N = (int)(d->w_len / (size_t)d->oc);
        for (int t = 0; t < d->in; t++) {
            double id = fmin(fmax(nearbyint(x[t]), 0), N - 1);
            for (int e = 0; e < d->oc; e++)
                y[t * d->oc + e] = w[(int)id * d->oc + e];
        }
        return;
    }
    REQUIRE(d->kind == DP_LAYER_MHA);
    int H = d->heads, dh = D / H;
    double *qkv = malloc((size_t)T * 3 * D * sizeof *qkv), *o = malloc((size_t)T * D * sizeof *o);
    double *p = malloc((size_t)T * sizeof *p);
    REQUIRE(qkv && o && p);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < 3 * D; j++) {
            qkv[t * 3 * D + j] = b[j];
            for (int e = 0; e < D; e++)
                qkv[t * 3 * D + j] += x[t * D + e] * w[j * D + e];
        }
    for (int h = 0; h < H; h++)
        for (int i = 0; i < T; i++) {
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < T; j++) {
                p[j] = 0;
                for (int e = 0; e < dh; e++)
                    p[j] += qkv[i * 3 * D + h * dh + e] * qkv[j * 3 * D + D + h * dh + e];
                p[j] /= sqrt(dh);
                mx = fmax(mx, p[j]);
            }
            for (int j = 0; j < T; j++)
                sum += (p[j] = exp(p[j] - mx));
            for (int e = 0; e < dh; e++) {
                double s = 0;
                for (int j = 0; j < T; j++)
                    s += p[j] / sum * qkv[j * 3 * D + 2 * D + h * dh + e];
                o[i * D + h * dh + e] = s;
            }
        }
    const double *wo = w + 3 * D * D, *bo = b + 3 * D;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < D; j++) {
            y[t * D + j] = bo[j];
            for (int e = 0; e < D; e++)
                y[t * D + j] += o[t * D + e] * wo[j * D + e];
        }
    free(qkv), free(o), free(p);
}

typedef struct fixture {
    dp_layer d;
    const dp_layer_ops *o;
    int batch;
    size_t nin, nout, np;
    float *x, *dout, *wb;
} fixture;

typedef struct run {
    float *y, *din, *gwb, *keep;
} run;

/* The layer's forward and backward on the CPU over `threads` threads, or
 * (threads 0) on the sim device. */
static void run_layer(const fixture *f, run *r, int threads)
{
    size_t kf = f->o->keep_floats ? f->o->keep_floats(&f->d, f->batch) : 0;
    r->y = malloc(f->nout * sizeof(float));
    r->din = malloc(f->nin * sizeof(float));
    r->gwb = malloc(f->np * sizeof(float));
    r->keep = malloc((kf + 1) * sizeof(float));
    REQUIRE(r->y && r->din && r->gwb && r->keep);
    fill(r->din, f->nin, 7, 8), fill(r->gwb, f->np, 7, 8); /* unwritten values show */
    dp_layer_call c = {.d = &f->d, .batch = f->batch, .in = f->x, .out = r->y, .dout = f->dout,
                       .din = r->din, .keep = r->keep, .train = 1, .w = f->wb,
                       .b = f->wb + f->d.w_len, .gw = r->gwb, .gb = r->gwb + f->d.w_len};
    if (threads) {
        REQUIRE(dp_pool_set_threads(threads, NULL) == 0);
        f->o->forward(&c);
        f->o->backward(&c);
        return;
    }
    dp_device *dev = NULL;
    dp_device_spec sim = {.kind = DP_DEVICE_SIM};
    dp_err err;
    REQUIRE(dp_device_open(&dev, &sim, &err) == 0);
    dp_dexec ex = {.be = dp_device_backend(dev), .ctx = dp_device_ctx(dev)};
    long n1 = f->o->dev_ones ? f->o->dev_ones(&f->d, f->batch) : 0;
    float *ones = malloc((size_t)(n1 + 1) * sizeof *ones); /* sim reads host memory */
    REQUIRE(ones);
    for (long i = 0; i < n1; i++)
        ones[i] = 1.0f;
    ex.ones = ones, ex.ones_len = n1;
    c.max_batch = f->batch;
    f->o->dev_forward(&ex, &c);
    f->o->dev_backward(&ex, &c);
    char msg[256];
    REQUIRE(ex.be->sync(ex.ctx, msg, sizeof msg) == 0);
    dp_device_close(dev);
    free(ones);
}

static bool same_run(const fixture *f, const run *a, const run *b)
{
    return memcmp(a->y, b->y, f->nout * sizeof(float)) == 0 &&
           memcmp(a->din, b->din, f->nin * sizeof(float)) == 0 &&
           memcmp(a->gwb, b->gwb, f->np * sizeof(float)) == 0;
}

/* The largest difference between two runs, relative to max(1, |a|). */
static double run_diff(const fixture *f, const run *a, const run *b)
{
    double worst = 0;
    for (size_t i = 0; i < f->nout; i++)
        worst = fmax(worst, layer_fd_rel(b->y[i], a->y[i]));
    for (size_t i = 0; i < f->nin; i++)
        worst = fmax(worst, layer_fd_rel(b->din[i], a->din[i]));
    for (size_t i = 0; i < f->np; i++)
        worst = fmax(worst, layer_fd_rel(b->gwb[i], a->gwb[i]));
    return worst;
}

static void run_free(run *r) { free(r->y), free(r->din), free(r->gwb), free(r->keep); }

/* Layer l of spec: forward and backward against double precision and
 * central differences; 1 and 2 threads the same bits, and the device's
 * kernels (sim) where the kind has them.  ids: the input is
 * integer ids in [0, ids) (emb), or (ids < 0) any values in [-2, 2 - ids],
 * else uniform in [-2, 2]. */
static void test_kind(const char *spec, int l, int batch, int ids)
{
    fixture f = {.d = layer_of(spec, l), .batch = batch};
    const dp_layer *d = &f.d;
    f.o = dp_layer_ops_of(d);
    f.nin = (size_t)batch * d->in, f.nout = (size_t)batch * d->out;
    f.np = d->w_len + d->b_len;
    f.x = malloc(f.nin * sizeof(float)), f.dout = malloc(f.nout * sizeof(float));
    f.wb = malloc(f.np * sizeof(float));
    REQUIRE(f.x && f.dout && f.wb);
    fill(f.x, f.nin, -2, 2);
    for (size_t i = 0; ids > 0 && i < f.nin; i++)
        f.x[i] = (float)(dp_rng_u64(&rng) % (uint64_t)ids);
    if (ids < 0) /* bad ids too: fractions, and out of [0, -ids) */
        fill(f.x, f.nin, -2, 2 - ids);
    fill(f.dout, f.nout, -1, 1);
    fill(f.wb, f.np, -0.7f, 0.7f);
    char what[160];
    snprintf(what, sizeof what, "%s (layer %d of %s), batch %d", f.o->name, l, spec, batch);

    run r1, r2;
    run_layer(&f, &r1, 1);
    run_layer(&f, &r2, 2);
    CHECKF(same_run(&f, &r1, &r2), "%s: 1 and 2 threads differ", what);
    double dev = -1; /* the device's difference from the CPU */
    if (f.o->dev_forward) {
        run rd;
        run_layer(&f, &rd, 0);
        dev = run_diff(&f, &r1, &rd);
        /* mha's projections are dense's device products, whose bias sums
         * run in another order than the CPU's: rounding apart */
        CHECKF(d->kind == DP_LAYER_MHA ? dev < 1e-5 : dev == 0,
               "%s: the device differs from the CPU by %.2e", what, dev);
        CHECKF((!ids || rd.keep[f.nin] == r1.keep[f.nin]) && /* emb's count */
                   (ids >= 0 || r1.keep[f.nin] > 0),
               "%s: the device counts %g bad ids, the CPU %g", what, (double)rd.keep[f.nin],
               (double)r1.keep[f.nin]);
        run_free(&rd);
    }

    layer_fd fd = {.d = d, .naive = naive, .batch = batch, .x = f.x, .dout = f.dout,
                   .wb = f.wb};
    layer_fd_open(&fd);
    double ey = layer_fd_forward_worst(&fd, r1.y);
    CHECKF(ey < 1e-5, "%s: forward %.2e from the double-precision one", what, ey);
    double eg = layer_fd_grad_worst(&fd, r1.din, r1.gwb, 1 + f.nin / 61, 1 + f.np / 97);
    CHECKF(eg < 1e-4, "%s: gradient %.2e from the finite differences", what, eg);
    printf("%s: forward within %.1e of double precision, gradients within %.1e of finite "
           "differences, 1 and 2 threads the same bits, the device (sim) within %.1e\n", what,
           ey, eg, dev);
    layer_fd_close(&fd);
    run_free(&r1), run_free(&r2);
    free(f.x), free(f.dout), free(f.wb);
}

/* emb: an id that is not an integer or out of [0, N) is rounded and
 * clamped, and counted after the ids in the keep. */
static void test_bad_ids(void)
{
    dp_layer d = layer_of("4-emb5x2-3", 0);
    const dp_layer_ops *o = dp_layer_ops_of(&d);
    float x[4] = {1.0f, 2.4f, 7.0f, -3.0f}, w[10], y[8], keep[5];
    for (int i = 0; i < 10; i++)
        w[i] = (float)i;
    dp_layer_call c = {.d = &d, .batch = 1, .in = x, .out = y, .keep = keep, .w = w};
    o->forward(&c);
    CHECKF(keep[4] == 3.0f, "emb: %g ids counted as changed, not 3", (double)keep[4]);
    CHECK(y[0] == 2 && y[2] == 4 && y[4] == 8 && y[6] == 0); /* rows 1, 2, 4 (clamped), 0 */
    printf("emb: ids 1, 2.4, 7 and -3 of 5 read rows 1, 2, 4 and 0, 3 of them counted\n");

    /* the model sums the count after a forward (what evaluation reports) */
    dp_model m;
    dp_err err;
    REQUIRE(dp_model_init(&m, "4-emb5x2-3", 2, 1, &err) == 0);
    float xs[8] = {1.0f, 2.4f, 7.0f, -3.0f, 0.0f, 1.0f, 2.0f, 4.0f};
    uint8_t ys[2] = {0, 1};
    dp_model_forward(&m, m.params, xs, ys, 2, NULL);
    CHECKF(dp_model_bad_inputs(&m, 2) == 3, "the model counts %ld bad ids in 2 records, not 3",
           dp_model_bad_inputs(&m, 2));
    dp_model_forward(&m, m.params, xs + 4, ys, 1, NULL);
    CHECKF(dp_model_bad_inputs(&m, 1) == 0, "good ids: %ld counted", dp_model_bad_inputs(&m, 1));
    dp_model_free(&m);
    REQUIRE(dp_model_init(&m, "4-dense3-3", 1, 1, &err) == 0);
    dp_model_forward(&m, m.params, xs, ys, 1, NULL);
    CHECK(dp_model_bad_inputs(&m, 1) == 0); /* no layer counts any */
    dp_model_free(&m);
}

static void fill_input(const dp_model *m, float *x, size_t n)
{
    fill(x, n, 0, 1);
    const dp_layer *d = &m->layers[0];
    if (d->kind == DP_LAYER_EMB)
        for (size_t i = 0; i < n; i++)
            x[i] = (float)(dp_rng_u64(&rng) % (d->w_len / (size_t)d->oc));
}

/* A whole model: the gradient of the mean loss against finite differences,
 * then every range cut [0, k) + [k, n) gives the whole model's loss and
 * gradients bit for bit. */
static void test_model(const char *spec, int batch)
{
    dp_model m;
    dp_err err;
    CHECKF(dp_model_init(&m, spec, batch, 1, &err) == 0, "%s: %s", spec, err.msg);
    CHECKF(strcmp(m.spec, spec) == 0, "%s: spelled %s", spec, m.spec);
    dp_model_init_params(&m, 5);
    size_t nx = (size_t)batch * dp_model_inputs(&m), np = m.n_params;
    float *x = malloc(nx * sizeof *x), *g = malloc(np * sizeof *g), *gr = malloc(np * sizeof *gr);
    uint8_t y[16];
    REQUIRE(x && g && gr && batch <= 16);
    fill_input(&m, x, nx);
    for (int i = 0; i < batch; i++)
        y[i] = (uint8_t)(i % dp_model_classes(&m));
    double worst = model_fd_worst(&m, x, y, batch);
    CHECKF(worst < 1e-2, "%s: gradient error %.2e", spec, worst);

    float loss = dp_model_forward_backward(&m, x, y, batch, NULL);
    memcpy(g, m.grads, np * sizeof *g);
    int n = m.n_layers, cuts = 0;
    for (int k = 1; k < n; k++) {
        float *mid = malloc((size_t)batch * m.layers[k].in * sizeof *mid);
        REQUIRE(mid);
        fill(gr, np, 7, 8);
        REQUIRE(dp_model_forward_range(&m, 0, m.params, x, 0, k, batch));
        float lk = dp_model_forward_range_loss(&m, 0, m.params, dp_model_act(&m, 0, k), y, k,
                                               batch, NULL);
        REQUIRE(dp_model_backward_range_loss(&m, 0, mid, gr, m.params, dp_model_act(&m, 0, k),
                                              y, k, batch) == 0);
        REQUIRE(dp_model_backward_range(&m, 0, NULL, gr, m.params, mid, x, 0, k, batch) == 0);
        CHECKF(lk == loss && memcmp(gr, g, np * sizeof *g) == 0,
               "%s: the cut at layer %d (%s) differs from the whole model", spec, k,
               dp_layer_kind_name(m.layers[k].kind));
        cuts++;
        free(mid);
    }
    printf("%s: whole-model gradient within %.1e of finite differences; %d range cuts give "
           "its loss and gradients bit for bit\n", spec, worst, cuts);
    free(x), free(g), free(gr);
    dp_model_free(&m);
}

static double spread(const float *p, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)p[i] * p[i];
    return sqrt(s / (double)n);
}

/* The kinds' tensors under PyTorch's names and shapes, read back; the
 * initial spreads as documented. */
static void test_checkpoint(void)
{
    dp_model m;
    dp_err err;
    /* layers with parameters: 0 emb, 1 pos, 2 ln, 3 mha, 4 dense */
    REQUIRE(dp_model_init(&m, "40-emb300x64-pos-ln-mha4-gap-3", 4, 1, &err) == 0);
    dp_model_init_params(&m, 3);
    const dp_layer *emb = &m.layers[0], *pos = &m.layers[1], *mha = &m.layers[3];
    REQUIRE(mha->kind == DP_LAYER_MHA && pos->kind == DP_LAYER_POS);
    double se = spread(m.params + emb->w_off, emb->w_len);
    double sp = spread(m.params + pos->w_off, pos->w_len);
    double sb = spread(m.params + mha->b_off, mha->b_len);
    CHECKF(fabs(se - 1) < 0.05 && fabs(sp - 0.02) < 0.002 && sb == 0,
           "initial spreads: emb %.3f (1), pos %.4f (0.02), mha's biases %.3f (0)", se, sp, sb);
    fill(m.params, m.n_params, -1, 1);
    checkpoint_trip t;
    dp_safetensors *f = checkpoint_trip_write(&t, "test_tokens", &m, 1);
    static const checkpoint_want want[] = {
        {"layers.0.weight", 2, {300, 64}},   {"layers.1.pos_embedding", 3, {1, 40, 64}},
        {"layers.2.weight", 1, {64}},        {"layers.3.in_proj_weight", 2, {192, 64}},
        {"layers.3.in_proj_bias", 1, {192}}, {"layers.3.out_proj.weight", 2, {64, 64}},
        {"layers.3.out_proj.bias", 1, {64}}, {"layers.4.weight", 2, {3, 64}}};
    checkpoint_trip_shapes(&t, want, sizeof want / sizeof want[0]);
    CHECK(!dp_safetensors_find(f, "layers.0.bias") && !dp_safetensors_find(f, "layers.1.bias") &&
          !dp_safetensors_find(f, "layers.3.weight"));
    const dp_st_tensor *x = dp_safetensors_find(f, "layers.3.out_proj.bias");
    CHECK(x && x->data[5] == m.params[mha->b_off + 3 * 64 + 5]);
    checkpoint_trip_back(&t, &m, 4, NULL);
    dp_model_free(&m);
    printf("checkpoint: emb, pos and mha under nn.Embedding's, a ViT's and "
           "nn.MultiheadAttention's names, read back bit-exact; initial spreads emb %.3f, pos "
           "%.4f\n", se, sp);
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

/* Model parallelism refuses mha, saying why and naming it; the device
 * takes a model of every token kind. */
static void test_mp_and_device(void)
{
    dp_model m;
    dp_err err;
    REQUIRE(dp_model_init(&m, "1x4x4-conv1x1x6-mha2-gap-8-3", 4, 1, &err) == 0);
    mp_plan p;
    CHECKF(mp_plan_make(&p, &m, 2, 0, &err) < 0 && strstr(err.msg, "is mha") &&
               strstr(err.msg, "every token attends"), "model parallelism: %s", err.msg);
    printf("model parallelism: %s\n", err.msg);
    dp_device *dev = NULL;
    dp_device_spec sim = {.kind = DP_DEVICE_SIM};
    REQUIRE(dp_device_open(&dev, &sim, &err) == 0);
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_SGD);
    dp_dmodel *g = NULL;
    dp_model_free(&m);
    REQUIRE(dp_model_init(&m, "6-emb9x4-pos-ln-mha2-gap-3", 4, 1, &err) == 0);
    CHECKF(dp_dmodel_open(&g, dev, &m, &oc, &err) == 0, "device: %s", err.msg);
    printf("device: 6-emb9x4-pos-ln-mha2-gap-3 opens on sim\n");
    dp_dmodel_close(g);
    dp_device_close(dev);
    dp_model_free(&m);
}

int main(void)
{
    dp_rng_seed(&rng, 2029);
    test_kind("1x5x1-conv1x1x9-mha3-3", 1, 2, 0);   /* 5 tokens of 9, 3 heads of 3 */
    test_kind("1x5x1-conv1x1x7-mha1-3", 1, 3, 0);   /* one head of 7 */
    test_kind("1x1x1-dense5-mha1-3", 1, 2, 0);      /* one token */
    test_kind("1x3x3-conv1x1x5-pos-3", 1, 3, 0);    /* 9 tokens of 5 */
    test_kind("7-emb11x5-3", 0, 3, 11);             /* 7 ids of 11 to 7 tokens of 5 */
    test_kind("7-emb11x5-3", 0, 3, -11);            /* bad ids: rounded, clamped, counted */
    test_bad_ids();
    test_model("1x9x9-conv3x3x9s3-pos-ln-mha3-ln-conv1x1x8-gelu-conv1x1x9-ln-gap-3", 3);
    test_model("5-emb7x6-pos-ln-mha2-gap-3", 4);
    test_model("1x2x3-conv1x1x4-mha4-flatten-ln-3", 2);
    test_checkpoint();
    test_mp_and_device();
    refused("1x4x4-conv1x1x6-mha4-3", "token 3 'mha4'", "4 heads do not divide the width 6");
    refused("1x4x4-conv1x1x6-mha-3", "token 3 'mha'", "expected mha<H>");
    refused("1x4x4-emb5x3-3", "token 2 'emb5x3'", "must be the first layer");
    refused("4-dense3-emb5x3-3", "token 3 'emb5x3'", "another layer's output");
    refused("4-emb5-3", "token 2 'emb5'", "expected emb<N>x<D>");
    refused("4-pos1-3", "token 2 'pos1'", "unknown layer");
    return CHECK_DONE();
}
