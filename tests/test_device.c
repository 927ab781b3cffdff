/* Devices: --device spellings, loading the CUDA plugin and its refusals,
 * and, where a GPU is present, the CUDA backend's memory, copies, products
 * (against CBLAS), kernels, graphs and collectives. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "device/backend.h"
#include "device/device_impl.h"
#include "downpour/device.h"

static void parses(const char *text, dp_device_kind kind, int index, const char *canonical)
{
    dp_device_spec s;
    dp_err err;
    err.msg[0] = '\0';
    CHECKF(dp_device_parse(text, &s, &err) == 0, "%s: %s", text, err.msg);
    CHECKF(s.kind == kind && s.index == index, "%s: kind %d index %d", text, (int)s.kind, s.index);
    char buf[32];
    CHECKF(strcmp(dp_device_format(&s, buf, sizeof buf), canonical) == 0, "%s formats as %s", text,
           buf);
}

static void refuses(const char *text)
{
    dp_device_spec s = {DP_DEVICE_SIM, 5};
    dp_err err;
    err.msg[0] = '\0';
    CHECKF(dp_device_parse(text, &s, &err) < 0, "\"%s\" was accepted", text);
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\"", text);
    CHECKF(strstr(err.msg, quoted) != NULL, "message does not name %s: %s", quoted, err.msg);
    CHECKF(strstr(err.msg, "cpu, cuda, cuda:N") != NULL, "message lists no spellings: %s", err.msg);
    CHECK(s.kind == DP_DEVICE_SIM && s.index == 5); /* untouched */
}

static void test_parse(void)
{
    parses("cpu", DP_DEVICE_CPU, 0, "cpu");
    parses("sim", DP_DEVICE_SIM, 0, "sim");
    parses("cuda", DP_DEVICE_CUDA, 0, "cuda:0");
    parses("cuda:0", DP_DEVICE_CUDA, 0, "cuda:0");
    parses("cuda:7", DP_DEVICE_CUDA, 7, "cuda:7");
    parses("cuda:63", DP_DEVICE_CUDA, 63, "cuda:63");
    const char *bad[] = {"gpu",    "cuda:",   "cuda:-1", "cuda:x",   "cuda:999", "cuda:64",
                         "",       "CUDA",    "cuda:1x", "cuda: 1",  "cuda:+1",  "cpu ",
                         "cuda0",  "cuda:0:", "sim:0",   "cuda:0001"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        refuses(bad[i]);
    dp_device_spec s;
    dp_err err;
    CHECK(dp_device_parse(NULL, &s, &err) < 0 && strstr(err.msg, "cpu, cuda") != NULL);
}

/* Opening cuda with DOWNPOUR_CUDA_BACKEND at `path` fails with `want` in the
 * message. */
static void plugin_refused(const char *path, const char *want)
{
    setenv("DOWNPOUR_CUDA_BACKEND", path, 1);
    dp_device_spec spec = {DP_DEVICE_CUDA, 0};
    dp_device *d = NULL;
    dp_err err;
    err.msg[0] = '\0';
    CHECKF(dp_device_open(&d, &spec, &err) < 0, "%s was loaded", path);
    CHECK(d == NULL);
    CHECKF(strstr(err.msg, path) != NULL, "message does not name %s: %s", path, err.msg);
    CHECKF(strstr(err.msg, want) != NULL, "message lacks \"%s\": %s", want, err.msg);
    unsetenv("DOWNPOUR_CUDA_BACKEND");
}

static void test_plugin_refusals(void)
{
    plugin_refused("/nonexistent/x.so", "does not exist");
    plugin_refused("libm.so.6", "has no dp_backend_cuda_v1");
    plugin_refused(DP_TEST_WRONG_ABI_PLUGIN, "ABI");
    dp_device_spec cpu = {DP_DEVICE_CPU, 0};
    dp_device *d = NULL;
    dp_err err;
    CHECK(dp_device_open(&d, &cpu, &err) < 0 && strstr(err.msg, "cpu") != NULL);
    dp_device_close(NULL); /* a no-op */
}

/* ---- with a GPU ---- */

static float frand(unsigned *state)
{
    *state = *state * 1664525u + 1013904223u;
    return (float)(*state >> 8) / (float)(1u << 24) - 0.5f;
}

static int sync_ok(const dp_backend *be, void *ctx)
{
    char msg[512];
    int rc = be->sync(ctx, msg, sizeof msg);
    if (rc < 0)
        fprintf(stderr, "sync: %s\n", msg);
    return rc == 0;
}

static void test_memory(const dp_backend *be, void *ctx)
{
    size_t n = 1000003;
    float *dev = be->alloc(ctx, n * sizeof(float));
    float *pin = be->host_alloc(ctx, n * sizeof(float));
    float *back = malloc(n * sizeof(float));
    REQUIRE(dev && pin && back);
    CHECK(be->copy(ctx, back, dev, n * sizeof(float), DP_COPY_D2H) == 0);
    CHECK(sync_ok(be, ctx));
    size_t nonzero = 0;
    for (size_t i = 0; i < n; i++)
        nonzero += back[i] != 0.0f;
    CHECKF(nonzero == 0, "%zu of %zu floats of fresh device memory are not zero", nonzero, n);
    for (size_t i = 0; i < n; i++)
        pin[i] = (float)i * 0.5f;
    float *dev2 = be->alloc(ctx, n * sizeof(float));
    REQUIRE(dev2);
    CHECK(be->copy(ctx, dev, pin, n * sizeof(float), DP_COPY_H2D) == 0);
    CHECK(be->copy(ctx, dev2, dev, n * sizeof(float), DP_COPY_D2D) == 0);
    CHECK(be->copy(ctx, back, dev2, n * sizeof(float), DP_COPY_D2H) == 0);
    CHECK(sync_ok(be, ctx));
    CHECK(memcmp(back, pin, n * sizeof(float)) == 0);
    be->free(ctx, dev);
    be->free(ctx, dev2);
    be->host_free(ctx, pin);
    free(back);
}

/* One product against cblas_sgemm in column-major order, with padded
 * leading dimensions. */
static void test_gemm_one(const dp_backend *be, void *ctx, int ta, int tb, int m, int n, int k,
                          float alpha, float beta)
{
    int ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    int lda = ar + 3, ldb = br + 1, ldc = m + 2;
    size_t na = (size_t)lda * (ac > 0 ? ac : 1), nb = (size_t)ldb * (bc > 0 ? bc : 1),
           nc = (size_t)ldc * n;
    float *a = malloc(na * sizeof(float)), *b = malloc(nb * sizeof(float));
    float *c = malloc(nc * sizeof(float)), *want = malloc(nc * sizeof(float));
    float *got = malloc(nc * sizeof(float));
    REQUIRE(a && b && c && want && got);
    unsigned st = 12345u + (unsigned)(m * 7 + n * 3 + k + ta * 100 + tb * 1000);
    for (size_t i = 0; i < na; i++)
        a[i] = frand(&st);
    for (size_t i = 0; i < nb; i++)
        b[i] = frand(&st);
    for (size_t i = 0; i < nc; i++)
        c[i] = want[i] = frand(&st);
    float *da = be->alloc(ctx, na * sizeof(float)), *db = be->alloc(ctx, nb * sizeof(float));
    float *dc = be->alloc(ctx, nc * sizeof(float));
    REQUIRE(da && db && dc);
    CHECK(be->copy(ctx, da, a, na * sizeof(float), DP_COPY_H2D) == 0);
    CHECK(be->copy(ctx, db, b, nb * sizeof(float), DP_COPY_H2D) == 0);
    CHECK(be->copy(ctx, dc, c, nc * sizeof(float), DP_COPY_H2D) == 0);
    dp_gemm g = {.ta = ta, .tb = tb, .m = m, .n = n, .k = k, .alpha = alpha, .beta = beta, .a = da,
                 .lda = lda, .b = db, .ldb = ldb, .c = dc, .ldc = ldc};
    be->gemm(ctx, &g);
    CHECK(be->copy(ctx, got, dc, nc * sizeof(float), DP_COPY_D2H) == 0);
    CHECK(sync_ok(be, ctx));
    cblas_sgemm(CblasColMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
                k, alpha, a, lda, b, ldb, beta, want, ldc);
    double worst = 0;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < ldc; i++) {
            size_t at = (size_t)j * ldc + i;
            /* rows past m are padding: untouched */
            double d = i < m ? fabs((double)got[at] - want[at]) : fabs((double)got[at] - c[at]);
            if (d > worst)
                worst = d;
        }
    /* FP32 sums of k products of numbers under 0.5 (no TF32 by default) */
    CHECKF(worst <= 1e-5 * (k + 1), "gemm ta %d tb %d %dx%dx%d: worst difference %g", ta, tb, m, n,
           k, worst);
    be->free(ctx, da);
    be->free(ctx, db);
    be->free(ctx, dc);
    free(a), free(b), free(c), free(want), free(got);
}

/* A strided batch (cublasSgemmStridedBatched) against the same products
 * issued one by one (cublasSgemm), within 1e-5 of sum |alpha a b| + |beta c|
 * (the two may sum in different orders), with strides past each matrix; the
 * floats between C's matrices stay untouched. */
static void test_gemm_batched_one(const dp_backend *be, void *ctx, int ta, int tb, int m, int n,
                                  int k, int batch)
{
    int ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    int lda = ar + 2, ldb = br + 1, ldc = m + 3;
    long long sa = (long long)lda * ac + 7, sb = (long long)ldb * bc + 3,
              sc = (long long)ldc * n + 5;
    size_t na = (size_t)(sa * batch), nb = (size_t)(sb * batch), nc = (size_t)(sc * batch);
    float *a = malloc(na * sizeof(float)), *b = malloc(nb * sizeof(float));
    float *c = malloc(nc * sizeof(float)), *got = malloc(nc * sizeof(float));
    float *want = malloc(nc * sizeof(float));
    REQUIRE(a && b && c && got && want);
    unsigned st = 777u + (unsigned)(m * 7 + n * 3 + k + ta * 100 + tb * 1000);
    for (size_t i = 0; i < na; i++)
        a[i] = frand(&st);
    for (size_t i = 0; i < nb; i++)
        b[i] = frand(&st);
    for (size_t i = 0; i < nc; i++)
        c[i] = frand(&st);
    float *da = be->alloc(ctx, na * sizeof(float)), *db = be->alloc(ctx, nb * sizeof(float));
    float *dc = be->alloc(ctx, nc * sizeof(float)), *d1 = be->alloc(ctx, nc * sizeof(float));
    REQUIRE(da && db && dc && d1);
    CHECK(be->copy(ctx, da, a, na * sizeof(float), DP_COPY_H2D) == 0);
    CHECK(be->copy(ctx, db, b, nb * sizeof(float), DP_COPY_H2D) == 0);
    CHECK(be->copy(ctx, dc, c, nc * sizeof(float), DP_COPY_H2D) == 0);
    CHECK(be->copy(ctx, d1, c, nc * sizeof(float), DP_COPY_H2D) == 0);
    const float alpha = 1.5f, beta = 0.5f;
    dp_gemm g = {.ta = ta, .tb = tb, .m = m, .n = n, .k = k, .alpha = alpha, .beta = beta,
                 .a = da, .lda = lda, .b = db, .ldb = ldb, .c = dc, .ldc = ldc, .batch = batch,
                 .stride_a = sa, .stride_b = sb, .stride_c = sc};
    be->gemm(ctx, &g);
    for (int i = 0; i < batch; i++) {
        dp_gemm gi = g;
        gi.batch = 1;
        gi.a = da + i * sa, gi.b = db + i * sb, gi.c = d1 + i * sc;
        be->gemm(ctx, &gi);
    }
    CHECK(be->copy(ctx, got, dc, nc * sizeof(float), DP_COPY_D2H) == 0);
    CHECK(be->copy(ctx, want, d1, nc * sizeof(float), DP_COPY_D2H) == 0);
    CHECK(sync_ok(be, ctx));
    double worst = 0;
    for (size_t at = 0; at < nc; at++) {
        long long bi = (long long)at / sc, off = (long long)at % sc;
        int j = (int)(off / ldc), i = (int)(off % ldc);
        if (j >= n || i >= m) { /* a gap or padding: untouched */
            CHECKF(got[at] == c[at], "batched gemm wrote at %zu, outside its matrices", at);
            continue;
        }
        double mag = fabs(beta * (double)c[at]);
        const float *ai = a + bi * sa, *bj = b + bi * sb;
        for (int q = 0; q < k; q++) {
            double x = ta ? ai[(size_t)i * lda + q] : ai[(size_t)q * lda + i];
            double y = tb ? bj[(size_t)q * ldb + j] : bj[(size_t)j * ldb + q];
            mag += fabs(alpha * x * y);
        }
        double e = fabs((double)got[at] - want[at]) / (mag + 1e-30);
        if (e > worst)
            worst = e;
    }
    CHECKF(worst <= 1e-5, "batched gemm ta %d tb %d %dx%dx%d batch %d: relative error %g", ta, tb,
           m, n, k, batch, worst);
    be->free(ctx, da);
    be->free(ctx, db);
    be->free(ctx, dc);
    be->free(ctx, d1);
    free(a), free(b), free(c), free(got), free(want);
}

static void test_gemm(const dp_backend *be, void *ctx)
{
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            test_gemm_one(be, ctx, ta, tb, 37, 29, 53, 1.0f, 0.0f);
    test_gemm_one(be, ctx, 0, 1, 128, 300, 784, 0.5f, 1.0f);
    test_gemm_one(be, ctx, 1, 0, 10, 128, 100, 1.0f, 1.0f);
    test_gemm_one(be, ctx, 0, 0, 5, 7, 0, 1.0f, 0.5f); /* k = 0: C = beta C */
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            test_gemm_batched_one(be, ctx, ta, tb, 17, 16, 17, 9); /* mha's shapes, odd */
            test_gemm_batched_one(be, ctx, ta, tb, 33, 5, 129, 3);
        }
}

static void test_kernels_and_graph(const dp_backend *be, void *ctx)
{
    long n = (1L << 22) + 3; /* more items than one grid's threads: the loop strides */
    float *p = be->alloc(ctx, (size_t)n * sizeof(float));
    float *back = malloc((size_t)n * sizeof(float));
    REQUIRE(p && back);
    dp_kernel k;
    memset(&k, 0, sizeof k);
    k.id = DP_K_FILL;
    k.items = n;
    k.u.fill.p = p;
    k.u.fill.value = 3.5f;
    be->launch(ctx, &k);
    memset(&k, 0, sizeof k);
    k.id = DP_K_SCALE;
    k.items = n - 1; /* the last stays 3.5 */
    k.u.scale.p = p;
    k.u.scale.s = 2.0f;
    be->launch(ctx, &k);
    CHECK(be->copy(ctx, back, p, (size_t)n * sizeof(float), DP_COPY_D2H) == 0);
    CHECK(sync_ok(be, ctx));
    long wrong = 0;
    for (long i = 0; i < n - 1; i++)
        wrong += back[i] != 7.0f;
    CHECKF(wrong == 0 && back[n - 1] == 3.5f, "fill+scale: %ld wrong, last %g", wrong,
           (double)back[n - 1]);

    /* A graph of one scale kernel, replayed three times: 7 * 2^3. */
    char msg[512];
    void *graph = NULL;
    REQUIRE(be->capture_begin && be->capture_end && be->graph_launch && be->graph_free);
    CHECKF(be->capture_begin(ctx, msg, sizeof msg) == 0, "%s", msg);
    be->launch(ctx, &k);
    CHECK(be->sync(ctx, msg, sizeof msg) < 0); /* refused while capturing, capture intact */
    CHECKF(be->capture_end(ctx, &graph, msg, sizeof msg) == 0, "%s", msg);
    REQUIRE(graph);
    for (int r = 0; r < 3; r++)
        CHECK(be->graph_launch(ctx, graph) == 0);
    CHECK(be->copy(ctx, back, p, (size_t)n * sizeof(float), DP_COPY_D2H) == 0);
    CHECK(sync_ok(be, ctx));
    wrong = 0;
    for (long i = 0; i < n - 1; i++)
        wrong += back[i] != 56.0f;
    CHECKF(wrong == 0 && back[n - 1] == 3.5f, "graph replays: %ld wrong, last %g", wrong,
           (double)back[n - 1]);
    be->graph_free(ctx, graph);

    /* A captured product (cuBLAS in a graph needs its workspace set):
     * C += A B twice gives 2 A B. */
    int m = 64, nn = 48, kk = 96;
    float *a = malloc(sizeof(float) * m * kk), *b = malloc(sizeof(float) * kk * nn);
    float *want = calloc((size_t)m * nn, sizeof(float)), *got = malloc(sizeof(float) * m * nn);
    REQUIRE(a && b && want && got);
    unsigned st = 99;
    for (int i = 0; i < m * kk; i++)
        a[i] = frand(&st);
    for (int i = 0; i < kk * nn; i++)
        b[i] = frand(&st);
    float *da = be->alloc(ctx, sizeof(float) * m * kk), *db = be->alloc(ctx, sizeof(float) * kk * nn);
    float *dc = be->alloc(ctx, sizeof(float) * m * nn);
    REQUIRE(da && db && dc);
    CHECK(be->copy(ctx, da, a, sizeof(float) * m * kk, DP_COPY_H2D) == 0);
    CHECK(be->copy(ctx, db, b, sizeof(float) * kk * nn, DP_COPY_H2D) == 0);
    dp_gemm g = {.ta = 0, .tb = 0, .m = m, .n = nn, .k = kk, .alpha = 1.0f, .beta = 1.0f, .a = da,
                 .lda = m, .b = db, .ldb = kk, .c = dc, .ldc = m};
    CHECKF(be->capture_begin(ctx, msg, sizeof msg) == 0, "%s", msg);
    be->gemm(ctx, &g);
    CHECKF(be->capture_end(ctx, &graph, msg, sizeof msg) == 0, "%s", msg);
    if (graph) {
        CHECK(be->graph_launch(ctx, graph) == 0);
        CHECK(be->graph_launch(ctx, graph) == 0);
    }
    CHECK(be->copy(ctx, got, dc, sizeof(float) * m * nn, DP_COPY_D2H) == 0);
    CHECK(sync_ok(be, ctx));
    be->graph_free(ctx, graph);
    cblas_sgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, m, nn, kk, 2.0f, a, m, b, kk, 0.0f, want,
                m);
    double worst = 0;
    for (int i = 0; i < m * nn; i++)
        worst = fmax(worst, fabs((double)got[i] - want[i]));
    CHECKF(worst <= 1e-4, "captured gemm: worst difference %g", worst);
    be->free(ctx, da);
    be->free(ctx, db);
    be->free(ctx, dc);
    be->free(ctx, p);
    free(a), free(b), free(want), free(got), free(back);
}

/* One rank's communicator: the sum over one rank is the buffer itself. */
static void test_comm(dp_device *d, const dp_backend *be, void *ctx)
{
    if (!dp_device_has_comm(d)) {
        fprintf(stderr, "no NCCL in this plugin: collectives not checked\n");
        return;
    }
    uint8_t id[DP_COMM_ID_BYTES];
    char msg[512];
    void *comm = NULL;
    CHECKF(be->comm_id(ctx, id, sizeof id, msg, sizeof msg) == 0, "%s", msg);
    CHECK(be->comm_id(ctx, id, sizeof id - 1, msg, sizeof msg) < 0);
    CHECKF(be->comm_join(ctx, id, sizeof id, 1, 0, &comm, msg, sizeof msg) == 0, "%s", msg);
    if (!comm)
        return;
    float host[1000], back[1000];
    for (int i = 0; i < 1000; i++)
        host[i] = (float)i - 500.0f;
    float *buf = be->alloc(ctx, sizeof host);
    REQUIRE(buf);
    CHECK(be->copy(ctx, buf, host, sizeof host, DP_COPY_H2D) == 0);
    CHECK(be->comm_allreduce(ctx, comm, buf, 1000) == 0);
    CHECK(be->copy(ctx, back, buf, sizeof host, DP_COPY_D2H) == 0);
    CHECK(sync_ok(be, ctx));
    CHECK(memcmp(back, host, sizeof host) == 0);
    /* waited on with a bound, as allreduce waits (docs/gpu.md, "Sums on the
     * devices"): done, and again done with nothing queued */
    CHECK(be->comm_allreduce(ctx, comm, buf, 1000) == 0);
    int rc = 0;
    for (int i = 0; i < 5000 && rc == 0; i++)
        rc = be->comm_wait(ctx, comm, 0.002, msg, sizeof msg);
    CHECKF(rc == 1, "comm_wait: %d (%s)", rc, msg);
    CHECKF(be->comm_wait(ctx, comm, 0, msg, sizeof msg) == 1, "comm_wait, nothing queued: %s", msg);
    /* A wait that found the sum not done leaves nothing behind for the next
     * launch's check (cudaStreamQuery's cudaErrorNotReady is the thread's
     * last error until cleared).  Products queued first keep the GPU busy
     * so that the waits see "not ready". */
    enum { BIG = 2048 };
    float *pa = be->alloc(ctx, (size_t)BIG * BIG * sizeof(float));
    float *pc = be->alloc(ctx, (size_t)BIG * BIG * sizeof(float));
    REQUIRE(pa && pc);
    for (int i = 0; i < 20; i++) {
        dp_gemm g = {.m = BIG, .n = BIG, .k = BIG, .alpha = 1.0f, .a = pa, .lda = BIG, .b = pa,
                     .ldb = BIG, .beta = 0.0f, .c = pc, .ldc = BIG};
        be->gemm(ctx, &g);
    }
    CHECK(be->comm_allreduce(ctx, comm, buf, 1000) == 0);
    int not_ready = 0;
    for (rc = 0; rc == 0 && not_ready < 1000000; not_ready += rc == 0)
        rc = be->comm_wait(ctx, comm, 0.0, msg, sizeof msg);
    CHECKF(rc == 1, "comm_wait behind products: %d (%s)", rc, msg);
    dp_kernel k = {.id = DP_K_FILL, .items = 1000};
    k.u.fill = (dp_ka_fill){buf, 3.0f};
    be->launch(ctx, &k);
    CHECKF(sync_ok(be, ctx), "a launch after %d waits that found the sum not done failed",
           not_ready);
    CHECK(be->copy(ctx, back, buf, sizeof host, DP_COPY_D2H) == 0 && sync_ok(be, ctx));
    CHECK(back[0] == 3.0f && back[999] == 3.0f);
    printf("  a launch after %d waits that found the sum not done: fine\n", not_ready);
    be->free(ctx, pa), be->free(ctx, pc);
    be->comm_free(ctx, comm);
    /* an aborted communicator leaves the device working, and a new one joins */
    comm = NULL;
    CHECKF(be->comm_id(ctx, id, sizeof id, msg, sizeof msg) == 0, "%s", msg);
    CHECKF(be->comm_join(ctx, id, sizeof id, 1, 0, &comm, msg, sizeof msg) == 0, "%s", msg);
    if (comm) {
        CHECK(be->comm_allreduce(ctx, comm, buf, 1000) == 0);
        be->comm_abort(ctx, comm);
        CHECK(be->copy(ctx, buf, host, sizeof host, DP_COPY_H2D) == 0);
        CHECK(be->copy(ctx, back, buf, sizeof host, DP_COPY_D2H) == 0);
        CHECKF(sync_ok(be, ctx), "the device failed after comm_abort");
        CHECK(memcmp(back, host, sizeof host) == 0);
    }
    be->free(ctx, buf);
}

/* A product with a leading dimension too small fails the device: the next
 * sync names the product, and every later sync says it again. */
static void test_failure(void)
{
    dp_device_spec spec = {DP_DEVICE_CUDA, 0};
    dp_device *d = NULL;
    dp_err err;
    REQUIRE(dp_device_open(&d, &spec, &err) == 0);
    const dp_backend *be = dp_device_backend(d);
    void *ctx = dp_device_ctx(d);
    float *x = be->alloc(ctx, 64 * sizeof(float));
    REQUIRE(x);
    dp_gemm g = {.ta = 0, .tb = 0, .m = 4, .n = 4, .k = 4, .alpha = 1.0f, .beta = 0.0f, .a = x,
                 .lda = 3, .b = x, .ldb = 4, .c = x + 32, .ldc = 4};
    be->gemm(ctx, &g);
    char msg[512];
    CHECK(be->sync(ctx, msg, sizeof msg) < 0);
    CHECKF(strstr(msg, "gemm 4x4x4") && strstr(msg, "lda 3"), "%s", msg);
    CHECK(be->sync(ctx, msg, sizeof msg) < 0);
    be->free(ctx, x);
    dp_device_close(d);

    /* a negative stride is refused before cuBLAS sees it, named */
    REQUIRE(dp_device_open(&d, &spec, &err) == 0);
    be = dp_device_backend(d);
    ctx = dp_device_ctx(d);
    x = be->alloc(ctx, 64 * sizeof(float));
    REQUIRE(x);
    g.a = x, g.b = x, g.c = x + 32, g.lda = 4;
    g.batch = 2, g.stride_a = 16, g.stride_b = -16, g.stride_c = 16;
    be->gemm(ctx, &g);
    CHECK(be->sync(ctx, msg, sizeof msg) < 0);
    CHECKF(strstr(msg, "batch 2") && strstr(msg, "-16") && strstr(msg, "negative"), "%s", msg);
    be->free(ctx, x);
    dp_device_close(d);
}

static void test_gpu(void)
{
    dp_device_spec spec;
    dp_err err;
    REQUIRE(dp_device_parse("cuda:0", &spec, &err) == 0);
    dp_device *d = NULL;
    REQUIRE(dp_device_open(&d, &spec, &err) == 0);
    fprintf(stderr, "device: %s\n", dp_device_describe(d));
    CHECK(strstr(dp_device_describe(d), "cuda:0") != NULL);
    CHECK(dp_device_spec_of(d)->kind == DP_DEVICE_CUDA && dp_device_spec_of(d)->index == 0);
    const dp_backend *be = dp_device_backend(d);
    void *ctx = dp_device_ctx(d);
    CHECK(strcmp(be->name, "cuda") == 0);
    test_memory(be, ctx);
    test_gemm(be, ctx);
    test_kernels_and_graph(be, ctx);
    test_comm(d, be, ctx);
    dp_device_close(d);
    test_failure();

    /* an index past the GPUs present names how many there are */
    spec.index = 63;
    CHECK(dp_device_open(&d, &spec, &err) < 0);
    CHECKF(strstr(err.msg, "cuda:63") && strstr(err.msg, "this machine has"), "%s", err.msg);
}

int main(void)
{
    test_parse();
    test_plugin_refusals();

    char why[DP_ERR_MAX];
    const char *no = dp_device_cuda_unavailable(why, sizeof why);
    if (no) {
#ifdef DOWNPOUR_HAVE_CUDA
        /* built with the plugin: what is missing is the driver or the GPU */
        CHECKF(strstr(no, "GPU") || strstr(no, "driver"), "%s", no);
        CHECKF(strstr(no, "built without") == NULL, "%s", no);
#else
        CHECKF(strstr(no, "built without the CUDA backend") != NULL, "%s", no);
#endif
        fprintf(stderr, "skipped GPU checks: %s\n", no);
    } else {
        test_gpu();
    }
    return CHECK_DONE();
}
