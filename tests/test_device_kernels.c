/* Every device kernel body, run through the sim backend's launch, against its
 * CPU counterpart (layers.h, optim.h, dropout, dp_split_gather) on the same
 * random inputs, at several shapes with odd sizes; sim's column-major gemm in
 * all four transpose cases against a plain triple loop, its strided batches
 * against the same products one by one (the same bits), and the executor's
 * dense products (dmodel.c, "Products") against layers.h; and sim's graphs:
 * a capture records without running, a replay runs, and values read from
 * device memory come fresh at each replay.
 *
 * Each comparison prints its measured maximum error beside its bound. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "device/backend.h"
#include "downpour/dataset.h"
#include "downpour/layers.h"
#include "downpour/optim.h"
#include "downpour/rng.h"
#include "downpour/testhooks.h"

static void *ctx;
static dp_rng rng;

static float *rnd(size_t n, float lo, float hi)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    REQUIRE(p);
    for (size_t i = 0; i < n; i++)
        p[i] = lo + (hi - lo) * dp_rng_uniform(&rng);
    return p;
}

static void run(const dp_kernel *k) { dp_backend_sim.launch(ctx, k); }

static void sync_ok(void)
{
    char msg[256];
    REQUIRE(dp_backend_sim.sync(ctx, msg, sizeof msg) == 0);
}

/* Max |a - b| / (|b| + floor) over n, the measure every bound below uses. */
static double max_rel(const float *a, const float *b, size_t n, double floor)
{
    double e = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]) / (fabs((double)b[i]) + floor);
        if (!(d <= e)) /* NaN counts as the worst */
            e = isnan(d) ? INFINITY : d;
    }
    return e;
}

static void report(const char *what, double err, double bound)
{
    printf("  %-44s max error %.3g (bound %.3g)\n", what, err, bound);
    CHECKF(err <= bound, "%s: max error %.3g > bound %.3g", what, err, bound);
}

/* ---- gemm ---- */

static float at(const float *p, int ld, int r, int c) { return p[(size_t)c * ld + r]; }

static void test_gemm(void)
{
    static const int shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {128, 10, 300}, {3, 129, 2}};
    double worst = 0.0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
                int ra = ta ? k : m, ca = ta ? m : k, rb = tb ? n : k, cb = tb ? k : n;
                int lda = ra + 3, ldb = rb + 1, ldc = m + 2; /* padded leading dimensions */
                float *a = rnd((size_t)lda * ca, -1, 1), *b = rnd((size_t)ldb * cb, -1, 1);
                float *c = rnd((size_t)ldc * n, -1, 1);
                float *c0 = malloc((size_t)ldc * n * sizeof *c0);
                memcpy(c0, c, (size_t)ldc * n * sizeof *c0);
                dp_gemm g = {.ta = ta, .tb = tb, .m = m, .n = n, .k = k, .alpha = 1.5f,
                             .beta = 0.5f, .a = a, .lda = lda, .b = b, .ldb = ldb, .c = c,
                             .ldc = ldc};
                dp_backend_sim.gemm(ctx, &g);
                sync_ok();
                for (int i = 0; i < m; i++)
                    for (int j = 0; j < n; j++) {
                        double sum = 0.0, mag = 0.0;
                        for (int q = 0; q < k; q++) {
                            double x = ta ? at(a, lda, q, i) : at(a, lda, i, q);
                            double y = tb ? at(b, ldb, j, q) : at(b, ldb, q, j);
                            sum += x * y;
                            mag += fabs(x * y);
                        }
                        double want = 1.5 * sum + 0.5 * at(c0, ldc, i, j);
                        mag = 1.5 * mag + 0.5 * fabs(at(c0, ldc, i, j));
                        double e = fabs(at(c, ldc, i, j) - want) / (mag + 1e-30);
                        if (e > worst)
                            worst = e;
                    }
                /* the padding between columns is untouched */
                for (int j = 0; j < n; j++)
                    for (int i = m; i < ldc; i++)
                        CHECK(at(c, ldc, i, j) == at(c0, ldc, i, j));
                free(a), free(b), free(c), free(c0);
            }
    /* relative to sum |alpha a b| + |beta c|: rounding of k float products */
    report("gemm, 4 transpose cases x 5 shapes", worst, 1e-6);
}

/* A strided batch (backend.h) against its products issued one by one: the
 * same bits, and the floats between C's matrices untouched. */
static void test_gemm_batched(void)
{
    static const int shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {17, 9, 13}, {3, 31, 2}};
    enum { BATCH = 5 };
    int cases = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
                int ra = ta ? k : m, ca = ta ? m : k, rb = tb ? n : k, cb = tb ? k : n;
                int lda = ra + 2, ldb = rb + 1, ldc = m + 3;
                /* strides past each matrix, odd, so the gaps must be skipped */
                long long sa = (long long)lda * ca + 7, sb = (long long)ldb * cb + 3;
                long long sc = (long long)ldc * n + 5;
                float *a = rnd((size_t)(sa * BATCH), -1, 1), *b = rnd((size_t)(sb * BATCH), -1, 1);
                float *c = rnd((size_t)(sc * BATCH), -1, 1);
                float *one = malloc((size_t)(sc * BATCH) * sizeof *one);
                REQUIRE(one);
                memcpy(one, c, (size_t)(sc * BATCH) * sizeof *one);
                dp_gemm g = {.ta = ta, .tb = tb, .m = m, .n = n, .k = k, .alpha = 1.5f,
                             .beta = 0.5f, .a = a, .lda = lda, .b = b, .ldb = ldb, .c = c,
                             .ldc = ldc, .batch = BATCH, .stride_a = sa, .stride_b = sb,
                             .stride_c = sc};
                dp_backend_sim.gemm(ctx, &g);
                for (int i = 0; i < BATCH; i++) {
                    dp_gemm gi = g;
                    gi.batch = 0;
                    gi.a = a + i * sa, gi.b = b + i * sb, gi.c = one + i * sc;
                    dp_backend_sim.gemm(ctx, &gi);
                }
                sync_ok();
                CHECKF(memcmp(c, one, (size_t)(sc * BATCH) * sizeof *c) == 0,
                       "batched gemm ta %d tb %d %dx%dx%d differs from one by one", ta, tb, m, n,
                       k);
                cases++;
                free(a), free(b), free(c), free(one);
            }
    printf("  %-44s %d cases, the same bits\n", "gemm batch 5 vs one by one", cases);
}

/* ---- the executor's dense products (dmodel.c, "Products") ---- */

static void test_dense(void)
{
    static const int shapes[][3] = {{1, 1, 1}, {7, 13, 5}, {33, 100, 10}, {128, 784, 300}};
    double ef = 0, ew = 0, eb = 0, ex = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int batch = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
        float *x = rnd((size_t)batch * in, -1, 1), *w = rnd((size_t)out * in, -0.5f, 0.5f);
        float *b = rnd((size_t)out, -0.5f, 0.5f), *dout = rnd((size_t)batch * out, -1, 1);
        float *ones = malloc((size_t)batch * sizeof *ones);
        for (int i = 0; i < batch; i++)
            ones[i] = 1.0f;
        float *y_cpu = malloc((size_t)batch * out * sizeof(float));
        float *y_dev = malloc((size_t)batch * out * sizeof(float));
        float *gw_cpu = malloc((size_t)out * in * sizeof(float)), *gw_dev = rnd((size_t)out * in, 5, 6);
        float *gb_cpu = malloc((size_t)out * sizeof(float)), *gb_dev = rnd((size_t)out, 5, 6);
        float *dx_cpu = malloc((size_t)batch * in * sizeof(float));
        float *dx_dev = malloc((size_t)batch * in * sizeof(float));
        for (int relu = 0; relu < 2; relu++) {
            if (relu)
                dp_dense_relu_forward(y_cpu, x, w, b, batch, in, out);
            else
                dp_dense_forward(y_cpu, x, w, b, batch, in, out);
            dp_gemm g = {.ta = 1, .tb = 0, .m = out, .n = batch, .k = in, .alpha = 1.0f,
                         .beta = 0.0f, .a = w, .lda = in, .b = x, .ldb = in, .c = y_dev,
                         .ldc = out};
            dp_backend_sim.gemm(ctx, &g);
            dp_kernel k = {.id = DP_K_BIAS_ACT, .items = (long)batch * out};
            k.u.bias_act = (dp_ka_bias_act){y_dev, b, out, relu};
            run(&k);
            sync_ok();
            double e = max_rel(y_dev, y_cpu, (size_t)batch * out, 1.0);
            ef = e > ef ? e : ef;
        }
        /* backward: x plays the relu's output for the masked variant */
        for (int relu = 0; relu < 2; relu++) {
            if (relu)
                dp_dense_backward_relu_overwrite(dx_cpu, gw_cpu, gb_cpu, dout, x, w, batch, in, out);
            else
                dp_dense_backward_overwrite(dx_cpu, gw_cpu, gb_cpu, dout, x, w, batch, in, out);
            dp_gemm gw = {.ta = 0, .tb = 1, .m = in, .n = out, .k = batch, .alpha = 1.0f,
                          .beta = 0.0f, .a = x, .lda = in, .b = dout, .ldb = out, .c = gw_dev,
                          .ldc = in};
            dp_gemm gb = {.ta = 0, .tb = 0, .m = out, .n = 1, .k = batch, .alpha = 1.0f,
                          .beta = 0.0f, .a = dout, .lda = out, .b = ones, .ldb = batch, .c = gb_dev,
                          .ldc = out};
            dp_gemm gx = {.ta = 0, .tb = 0, .m = in, .n = batch, .k = out, .alpha = 1.0f,
                          .beta = 0.0f, .a = w, .lda = in, .b = dout, .ldb = out, .c = dx_dev,
                          .ldc = in};
            dp_backend_sim.gemm(ctx, &gw);
            dp_backend_sim.gemm(ctx, &gb);
            dp_backend_sim.gemm(ctx, &gx);
            if (relu) {
                dp_kernel k = {.id = DP_K_RELU_BWD, .items = (long)batch * in};
                k.u.relu_bwd = (dp_ka_relu_bwd){dx_dev, dx_dev, x};
                run(&k);
            }
            sync_ok();
            double e1 = max_rel(gw_dev, gw_cpu, (size_t)out * in, 1.0);
            double e2 = max_rel(gb_dev, gb_cpu, (size_t)out, 1.0);
            double e3 = max_rel(dx_dev, dx_cpu, (size_t)batch * in, 1.0);
            ew = e1 > ew ? e1 : ew;
            eb = e2 > eb ? e2 : eb;
            ex = e3 > ex ? e3 : ex;
        }
        free(x), free(w), free(b), free(dout), free(ones), free(y_cpu), free(y_dev);
        free(gw_cpu), free(gw_dev), free(gb_cpu), free(gb_dev), free(dx_cpu), free(dx_dev);
    }
    /* |a - b| / (|b| + 1): sums of up to 784 products of values in [-1, 1] */
    report("dense forward (gemm + BIAS_ACT, relu 0/1)", ef, 2e-5);
    report("dense weight gradient (gemm 0,1)", ew, 2e-5);
    report("dense bias gradient (gemm with ones)", eb, 2e-5);
    report("dense input gradient (gemm 0,0 + RELU_BWD)", ex, 2e-5);
}

/* ---- element-wise kernels ---- */

static void test_gather(void)
{
    static const int dims[] = {1, 37, 784};
    static const int rows[] = {1, 13, 128};
    for (int t = 0; t < 3; t++) {
        uint32_t n = 1000, dim = (uint32_t)dims[t];
        uint8_t *images = malloc((size_t)n * dim), *labels = malloc(n);
        for (size_t i = 0; i < (size_t)n * dim; i++)
            images[i] = (uint8_t)dp_rng_below(&rng, 256);
        images[0] = 255; /* both ends of the range */
        images[1 % ((size_t)n * dim)] = 0;
        for (uint32_t i = 0; i < n; i++)
            labels[i] = (uint8_t)dp_rng_below(&rng, 10);
        dp_split s = {.images = images, .labels = labels, .n = n, .dim = dim};
        int r = rows[t];
        uint32_t idx[128];
        for (int i = 0; i < r; i++)
            idx[i] = dp_rng_below(&rng, n);
        idx[0] = 0;
        float *x_cpu = malloc((size_t)r * dim * sizeof(float)), *x_dev = malloc((size_t)r * dim * sizeof(float));
        uint8_t y_cpu[128], y_dev[128];
        dp_split_gather(x_cpu, y_cpu, &s, idx, r);
        dp_kernel k = {.id = DP_K_GATHER, .items = (long)r * dim};
        k.u.gather = (dp_ka_gather){.x = x_dev, .y = y_dev, .images = images, .labels = labels,
                                    .idx = idx, .dim = dim};
        run(&k);
        sync_ok();
        CHECKF(memcmp(x_cpu, x_dev, (size_t)r * dim * sizeof(float)) == 0,
               "gather (%d rows of %u): pixels differ", r, dim);
        CHECKF(memcmp(y_cpu, y_dev, (size_t)r) == 0, "gather: labels differ");

        /* The same records as floats: GATHER_F32 copies them as they are,
         * as dp_split_gather does (bits, -0 and a NaN included). */
        float *values = rnd((size_t)n * dim, -3, 3);
        values[0] = -0.0f;
        values[(size_t)n * dim - 1] = NAN;
        dp_split f = {.values = values, .labels = labels, .n = n, .dim = dim};
        idx[r - 1] = n - 1;
        memset(x_dev, 0, (size_t)r * dim * sizeof(float));
        memset(y_dev, 0xff, sizeof y_dev);
        dp_split_gather(x_cpu, y_cpu, &f, idx, r);
        k = (dp_kernel){.id = DP_K_GATHER_F32, .items = (long)r * dim};
        k.u.gather = (dp_ka_gather){.x = x_dev, .y = y_dev, .values = values, .labels = labels,
                                    .idx = idx, .dim = dim};
        run(&k);
        sync_ok();
        int rows_same = 1;
        for (int i = 0; i < r; i++)
            rows_same &= memcmp(x_cpu + (size_t)i * dim, values + (size_t)idx[i] * dim,
                                dim * sizeof(float)) == 0 && y_cpu[i] == labels[idx[i]];
        CHECKF(rows_same, "dp_split_gather of floats (%d rows of %u): not the records' bits", r,
               dim);
        CHECKF(memcmp(x_cpu, x_dev, (size_t)r * dim * sizeof(float)) == 0,
               "gather_f32 (%d rows of %u): values differ", r, dim);
        CHECKF(memcmp(y_cpu, y_dev, (size_t)r) == 0, "gather_f32: labels differ");
        free(values);
        free(images), free(labels), free(x_cpu), free(x_dev);
    }
    report("GATHER, GATHER_F32 vs dp_split_gather (bits)", 0.0, 0.0);
}

static void test_fill_scale(void)
{
    size_t n = 1001;
    float *p = rnd(n, -1, 1), *q = malloc(n * sizeof *q);
    memcpy(q, p, n * sizeof *q);
    dp_kernel k = {.id = DP_K_SCALE, .items = (long)n};
    k.u.scale = (dp_ka_scale){p, 0.37f};
    run(&k);
    sync_ok();
    int same = 1;
    for (size_t i = 0; i < n; i++)
        same &= p[i] == q[i] * 0.37f;
    CHECKF(same, "SCALE differs from p * s");
    k.id = DP_K_FILL;
    k.items = (long)n - 1;
    k.u.fill = (dp_ka_fill){p, 2.5f};
    run(&k);
    sync_ok();
    for (size_t i = 0; i + 1 < n; i++)
        same &= p[i] == 2.5f;
    CHECKF(same && p[n - 1] == q[n - 1] * 0.37f, "FILL wrote the wrong items");
    report("FILL, SCALE (bits)", same ? 0.0 : 1.0, 0.0);
    free(p), free(q);
}

static void test_relu(void)
{
    size_t n = 4099;
    float *in = rnd(n, -1, 1), *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    in[0] = 0.0f;
    in[1] = -0.0f;
    in[2] = NAN; /* passes on, so a diverged step shows in the loss */
    dp_relu_forward(a, in, (int)n);
    dp_kernel k = {.id = DP_K_RELU, .items = (long)n};
    k.u.relu = (dp_ka_relu){b, in};
    run(&k);
    sync_ok();
    CHECKF(memcmp(a, b, n * sizeof *a) == 0, "RELU differs from dp_relu_forward");
    float *dout = rnd(n, -1, 1);
    dp_relu_backward(a, dout, in, (int)n);
    k.id = DP_K_RELU_BWD;
    k.u.relu_bwd = (dp_ka_relu_bwd){b, dout, in};
    run(&k);
    sync_ok();
    CHECKF(memcmp(a, b, n * sizeof *a) == 0, "RELU_BWD differs from dp_relu_backward");
    /* BIAS_ACT's relu against dp_dense_relu_forward's epilogue, NaN included */
    float w0 = 0.0f, x0 = 0.0f, bias[3] = {NAN, -1.0f, 2.0f}, o_cpu[3], o_dev[3] = {0, 0, 0};
    for (int j = 0; j < 3; j++) {
        dp_dense_relu_forward(&o_cpu[j], &x0, &w0, &bias[j], 1, 1, 1);
        k.id = DP_K_BIAS_ACT;
        k.items = 1;
        k.u.bias_act = (dp_ka_bias_act){&o_dev[j], &bias[j], 1, 1};
        run(&k);
    }
    sync_ok();
    CHECKF(isnan(o_dev[0]) && isnan(o_cpu[0]) && o_dev[1] == o_cpu[1] && o_dev[2] == o_cpu[2],
           "BIAS_ACT relu: %g %g %g, CPU %g %g %g", (double)o_dev[0], (double)o_dev[1],
           (double)o_dev[2], (double)o_cpu[0], (double)o_cpu[1], (double)o_cpu[2]);
    report("RELU, RELU_BWD, BIAS_ACT's relu (bits, NaN, -0)", 0.0, 0.0);
    free(in), free(a), free(b), free(dout);
}

static void test_xent(void)
{
    static const int shapes[][2] = {{1, 2}, {7, 10}, {128, 10}, {33, 257}};
    double ep = 0, el = 0, ed = 0;
    for (int s = 0; s < 4; s++) {
        int batch = shapes[s][0], classes = shapes[s][1];
        size_t n = (size_t)batch * classes;
        float *z = rnd(n, -8, 8), *p_cpu = malloc(n * sizeof(float)), *p_dev = malloc(n * sizeof(float));
        uint8_t *y = malloc((size_t)batch);
        for (int r = 0; r < batch; r++)
            y[r] = (uint8_t)dp_rng_below(&rng, (uint32_t)(classes < 256 ? classes : 256));
        if (classes > 2)
            z[1] = z[2] = 9.0f; /* a tie: the first maximum wins on both */
        int correct = 0;
        float loss = dp_softmax_xent_forward(p_cpu, z, y, batch, classes, &correct);
        double tally[2] = {0, 0};
        dp_kernel k = {.id = DP_K_XENT_FWD, .items = batch};
        k.u.xent_fwd = (dp_ka_xent_fwd){p_dev, z, y, tally, classes};
        run(&k);
        sync_ok();
        double e = max_rel(p_dev, p_cpu, n, 1e-30);
        ep = e > ep ? e : ep;
        e = fabs(tally[0] / batch - loss) / fabs(loss);
        el = e > el ? e : el;
        CHECKF((int)tally[1] == correct, "XENT_FWD: %d correct, CPU %d", (int)tally[1], correct);
        float *d_cpu = malloc(n * sizeof(float)), *d_dev = malloc(n * sizeof(float));
        dp_softmax_xent_backward(d_cpu, p_cpu, y, batch, classes);
        k.id = DP_K_XENT_BWD;
        k.items = (long)n;
        k.u.xent_bwd = (dp_ka_xent_bwd){d_dev, p_cpu, y, classes, 1.0f / (float)batch};
        run(&k);
        sync_ok();
        /* absolute, in units of 1/batch: (p - 1)/b against p/b - 1/b */
        for (size_t i = 0; i < n; i++) {
            e = fabs((double)d_dev[i] - d_cpu[i]) * batch;
            ed = e > ed ? e : ed;
        }
        free(z), free(p_cpu), free(p_dev), free(y), free(d_cpu), free(d_dev);
    }
    report("XENT_FWD probabilities (relative)", ep, 0.0);
    report("XENT_FWD loss sum / batch vs the CPU's mean", el, 1e-6);
    report("XENT_BWD (absolute, times batch)", ed, 2.0 * FLT_EPSILON);
}

static void test_dropout(void)
{
    static const float rates[] = {0.1f, 0.5f, 0.9f};
    static const size_t sizes[] = {1, 1001, 40001};
    for (int r = 0; r < 3; r++)
        for (int s = 0; s < 3; s++) {
            size_t n = sizes[s];
            uint64_t seed = dp_rng_u64(&rng);
            float *in = rnd(n, -1, 1), *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
            dp_dropout_forward(a, in, n, rates[r], seed);
            /* dropout.c's key and threshold from its seed */
            uint64_t z = seed;
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
            z ^= z >> 31;
            dp_kernel k = {.id = DP_K_DROPOUT, .items = (long)n};
            k.u.dropout = (dp_ka_dropout){b, in, &z, (uint64_t)((double)rates[r] * 4294967296.0),
                                          1.0f / (1.0f - rates[r])};
            run(&k);
            sync_ok();
            CHECKF(memcmp(a, b, n * sizeof *a) == 0, "DROPOUT rate %g, %zu items: mask differs",
                   (double)rates[r], n);
            free(in), free(a), free(b);
        }
    report("DROPOUT vs dp_dropout_forward (bits)", 0.0, 0.0);
}

static void test_optim(void)
{
    static const dp_kernel_id ids[DP_OPTIM_COUNT] = {DP_K_SGD,     DP_K_MOMENTUM, DP_K_NESTEROV,
                                                     DP_K_ADAGRAD, DP_K_ADAM,     DP_K_ADAM};
    /* every kind with its IEEE twin, then adam and adamw with the fast
     * arithmetic; the second pass of each with an L2 (or adamw's) weight
     * decay */
    for (int pass = 0; pass < 2 * (DP_OPTIM_COUNT + 2); pass++) {
        int round = pass % (DP_OPTIM_COUNT + 2);
        int kind = round < DP_OPTIM_COUNT ? round : round == DP_OPTIM_COUNT ? DP_OPTIM_ADAM
                                                                           : DP_OPTIM_ADAMW;
        size_t n = 1003;
        dp_optim_config cfg = dp_optim_defaults((dp_optim_kind)kind);
        cfg.weight_decay = pass < DP_OPTIM_COUNT + 2 ? 0.0f : 0.05f;
        dp_optim o, rates;
        dp_err err;
        REQUIRE(dp_optim_init(&o, &cfg, n, &err) == 0);
        REQUIRE(dp_optim_init(&rates, &cfg, 0, &err) == 0);
        o.exact = round < DP_OPTIM_COUNT;
        int slots = dp_optim_slots(cfg.kind);
        float *p_cpu = rnd(n, -1, 1), *p_dev = malloc(n * sizeof(float));
        memcpy(p_dev, p_cpu, n * sizeof(float));
        float *s_dev = malloc((slots ? slots : 1) * n * sizeof(float));
        memcpy(s_dev, o.state ? o.state : p_dev, (slots ? slots : 1) * n * sizeof(float));
        double ep = 0, es = 0;
        for (int step = 0; step < 5; step++) {
            float *g = rnd(n, -0.1f, 0.1f);
            float scale = step % 2 ? 0.5f : 1.0f; /* exact: the CPU gets g * scale */
            float *gs = malloc(n * sizeof(float));
            for (size_t i = 0; i < n; i++)
                gs[i] = g[i] * scale;
            float lr = cfg.lr * (1.0f + 0.25f * step);
            dp_optim_apply(&o, p_cpu, gs, lr);
            dp_optim_step st = dp_optim_begin(&rates, lr);
            dp_step_block blk = {st.lr, st.lr_t, scale, 0};
            dp_kernel k = {.id = ids[kind], .items = (long)n};
            k.u.optim = (dp_ka_optim){p_dev, g, s_dev, slots == 2 ? s_dev + n : NULL, &blk,
                                      cfg.momentum, cfg.beta1, cfg.beta2, cfg.eps,
                                      dp_optim_adam_exact(&o), cfg.weight_decay,
                                      kind == DP_OPTIM_ADAMW};
            run(&k);
            sync_ok();
            double e = max_rel(p_dev, p_cpu, n, 1e-3);
            ep = e > ep ? e : ep;
            if (slots) {
                e = max_rel(s_dev, o.state, slots * n, 1e-3);
                es = e > es ? e : es;
            }
            free(g), free(gs);
        }
        char what[64];
        snprintf(what, sizeof what, "%s%s wd %g parameters and state, 5 updates",
                 dp_optim_kind_name(cfg.kind),
                 kind < DP_OPTIM_ADAM ? "" : dp_optim_adam_exact(&o) ? " (IEEE)" : " (fast)",
                 (double)cfg.weight_decay);
        /* the same operations, so the same bits (inputs far from the
         * denormals that dp_optim_apply's FTZ would flush) */
        report(what, ep > es ? ep : es, 0.0);
        dp_optim_free(&o), dp_optim_free(&rates);
        free(p_cpu), free(p_dev), free(s_dev);
    }
}

/* ---- graphs and errors ---- */

/* EMA: the loop's --ema formula (loop.c), bit for bit over a few updates */
static void test_ema(void)
{
    size_t n = 1001;
    const float d = 0.999f, e = 1.0f - d;
    float *a_cpu = rnd(n, -1, 1), *a_dev = malloc(n * sizeof(float));
    REQUIRE(a_dev);
    memcpy(a_dev, a_cpu, n * sizeof(float));
    for (int step = 0; step < 3; step++) {
        float *p = rnd(n, -1, 1);
        for (size_t i = 0; i < n; i++)
            a_cpu[i] = d * a_cpu[i] + e * p[i];
        dp_kernel k = {.id = DP_K_EMA, .items = (long)n};
        k.u.ema = (dp_ka_ema){a_dev, p, d, e};
        run(&k);
        sync_ok();
        free(p);
    }
    CHECKF(memcmp(a_cpu, a_dev, n * sizeof(float)) == 0, "EMA: differs from the loop's formula");
    report("EMA vs the loop's --ema formula (bits)", 0.0, 0.0);
    free(a_cpu), free(a_dev);
}

static void test_graph(void)
{
    float buf[8] = {0}, src[8] = {1, 2, 3, 4, 5, 6, 7, 8}, dst[8] = {0};
    float a[4] = {1, 2, 3, 4}, b[4] = {1, 0, 0, 1}, c[4] = {0};
    float p[4] = {1, 1, 1, 1}, g[4] = {1, 2, 3, 4};
    dp_step_block blk = {0.5f, 0.0f, 1.0f, 0};
    char msg[256];
    void *graph = NULL;
    REQUIRE(dp_backend_sim.capture_begin(ctx, msg, sizeof msg) == 0);
    dp_kernel k = {.id = DP_K_FILL, .items = 8};
    k.u.fill = (dp_ka_fill){buf, 3.0f};
    run(&k);
    dp_gemm gm = {.ta = 0, .tb = 0, .m = 2, .n = 2, .k = 2, .alpha = 1.0f, .beta = 0.0f, .a = a,
                  .lda = 2, .b = b, .ldb = 2, .c = c, .ldc = 2};
    dp_backend_sim.gemm(ctx, &gm);
    dp_backend_sim.copy(ctx, dst, src, sizeof src, DP_COPY_H2D);
    dp_kernel s = {.id = DP_K_SGD, .items = 4};
    s.u.optim = (dp_ka_optim){p, g, NULL, NULL, &blk, 0, 0, 0, 0, 0, 0, 0};
    run(&s);
    REQUIRE(dp_backend_sim.capture_end(ctx, &graph, msg, sizeof msg) == 0);
    sync_ok();
    CHECKF(buf[0] == 0.0f && c[0] == 0.0f && dst[0] == 0.0f && p[0] == 1.0f,
           "a captured call ran during the capture");
    REQUIRE(dp_backend_sim.graph_launch(ctx, graph) == 0);
    sync_ok();
    CHECK(buf[7] == 3.0f && dst[7] == 8.0f);
    CHECK(c[0] == 1.0f && c[1] == 2.0f && c[2] == 3.0f && c[3] == 4.0f);
    CHECK(p[0] == 0.5f && p[3] == -1.0f); /* 1 - 0.5 g */
    blk.lr = 0.25f; /* read from memory at the replay, not captured */
    REQUIRE(dp_backend_sim.graph_launch(ctx, graph) == 0);
    sync_ok();
    CHECKF(p[0] == 0.25f && p[3] == -2.0f, "the replay did not read the new lr: p = %g, %g",
           (double)p[0], (double)p[3]);
    dp_backend_sim.graph_free(ctx, graph);
    printf("  graph: capture records without running; replays run and read lr fresh\n");
}

/* Failures of queued work come back at the next sync, named, and stay. */
static void test_errors(void)
{
    void *c2;
    char msg[256];
    REQUIRE(dp_backend_sim.open(&c2, 0, msg, sizeof msg) == 0);
    float a[4] = {0};
    dp_gemm g = {.ta = 0, .tb = 0, .m = 2, .n = 2, .k = 2, .alpha = 1.0f, .beta = 0.0f, .a = a,
                 .lda = 1, .b = a, .ldb = 2, .c = a, .ldc = 2};
    dp_backend_sim.gemm(c2, &g);
    CHECK(dp_backend_sim.sync(c2, msg, sizeof msg) == -1);
    CHECKF(strstr(msg, "lda 1") != NULL, "message: %s", msg);
    CHECK(dp_backend_sim.sync(c2, msg, sizeof msg) == -1); /* it stays failed */
    dp_backend_sim.close(c2);

    /* negative batches and strides are refused, named */
    g.lda = 2;
    g.batch = -1;
    REQUIRE(dp_backend_sim.open(&c2, 0, msg, sizeof msg) == 0);
    dp_backend_sim.gemm(c2, &g);
    CHECK(dp_backend_sim.sync(c2, msg, sizeof msg) == -1);
    CHECKF(strstr(msg, "batch -1") != NULL, "message: %s", msg);
    dp_backend_sim.close(c2);
    g.batch = 2;
    g.stride_b = -4;
    REQUIRE(dp_backend_sim.open(&c2, 0, msg, sizeof msg) == 0);
    dp_backend_sim.gemm(c2, &g);
    CHECK(dp_backend_sim.sync(c2, msg, sizeof msg) == -1);
    CHECKF(strstr(msg, "-4") != NULL && strstr(msg, "negative") != NULL, "message: %s", msg);
    dp_backend_sim.close(c2);

    REQUIRE(dp_backend_sim.open(&c2, 0, msg, sizeof msg) == 0);
    dp_kernel k = {.id = DP_K_COUNT, .items = 1};
    dp_backend_sim.launch(c2, &k);
    CHECK(dp_backend_sim.sync(c2, msg, sizeof msg) == -1);
    CHECKF(strstr(msg, "no kernel has id") != NULL, "message: %s", msg);
    dp_backend_sim.close(c2);

    REQUIRE(dp_backend_sim.open(&c2, 0, msg, sizeof msg) == 0);
    void *graph = NULL;
    REQUIRE(dp_backend_sim.capture_begin(c2, msg, sizeof msg) == 0);
    float h[2];
    dp_backend_sim.copy(c2, h, a, sizeof h, DP_COPY_D2H);
    CHECK(dp_backend_sim.capture_end(c2, &graph, msg, sizeof msg) == -1 && graph == NULL);
    CHECKF(strstr(msg, "D2H") != NULL, "message: %s", msg);
    dp_backend_sim.close(c2);

    CHECK(dp_backend_sim.open(&c2, 1, msg, sizeof msg) == -1);
    dp_hook_set("DOWNPOUR_SIM_MEMORY", "1000", NULL);
    REQUIRE(dp_backend_sim.open(&c2, 0, msg, sizeof msg) == 0);
    void *p = dp_backend_sim.alloc(c2, 600);
    CHECK(p != NULL && dp_backend_sim.alloc(c2, 600) == NULL);
    dp_backend_sim.free(c2, p);
    p = dp_backend_sim.alloc(c2, 600); /* the bytes came back */
    CHECK(p != NULL);
    dp_backend_sim.free(c2, p);
    dp_backend_sim.close(c2);
    dp_hook_set("DOWNPOUR_SIM_MEMORY", NULL, NULL);
}

int main(void)
{
    char msg[256];
    dp_rng_seed(&rng, 14);
    REQUIRE(dp_backend_sim.open(&ctx, 0, msg, sizeof msg) == 0);
    test_gemm();
    test_gemm_batched();
    test_dense();
    test_gather();
    test_fill_scale();
    test_relu();
    test_xent();
    test_dropout();
    test_optim();
    test_ema();
    test_graph();
    test_errors();
    dp_backend_sim.close(ctx);
    return CHECK_DONE();
}
