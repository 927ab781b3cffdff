/* In-memory datasets (dataset.h, dp_dataset_register; the Python package's
 * NumPy arrays): the registry's checks, "mem:NAME" opened without a copy,
 * float and byte records, and training on registered arrays giving the
 * same weights, bit for bit, as training on the same records in IDX files. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "scratch.h"
#include "downpour/checkpoint.h"
#include "downpour/dataset.h"
#include "downpour/model.h"
#include "downpour/train.h"

#define N_TRAIN 400
#define N_TEST 100
#define DIM 784

static uint8_t g_x[N_TRAIN * DIM], g_y[N_TRAIN], g_tx[N_TEST * DIM], g_ty[N_TEST];

static void synth(uint8_t *x, uint8_t *y, int n, uint32_t seed)
{
    for (int i = 0; i < n; i++) {
        y[i] = (uint8_t)(i % 4);
        for (int j = 0; j < DIM; j++) {
            seed = seed * 1664525u + 1013904223u;
            int bright = (j / 28 < 14) == (y[i] < 2) && (j % 28 < 14) == (y[i] % 2 == 0);
            x[(size_t)i * DIM + j] = (uint8_t)((seed >> 24) % 60 + (bright ? 150 : 0));
        }
    }
}

static void write_idx(const char *dir, const char *prefix, const uint8_t *x, const uint8_t *y,
                      uint32_t n)
{
    char path[1200];
    unsigned char h[16];
    uint32_t img[4] = {0x803, n, 28, 28}, lbl[2] = {0x801, n};
    for (int i = 0; i < 4; i++)
        for (int b = 0; b < 4; b++)
            h[i * 4 + b] = (unsigned char)(img[i] >> (24 - 8 * b));
    unsigned char *buf = malloc(16 + (size_t)n * DIM);
    REQUIRE(buf);
    memcpy(buf, h, 16);
    memcpy(buf + 16, x, (size_t)n * DIM);
    snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte", dir, prefix);
    write_bytes(path, buf, 16 + (size_t)n * DIM);
    for (int i = 0; i < 2; i++)
        for (int b = 0; b < 4; b++)
            h[i * 4 + b] = (unsigned char)(lbl[i] >> (24 - 8 * b));
    memcpy(buf, h, 8);
    memcpy(buf + 8, y, n);
    snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte", dir, prefix);
    write_bytes(path, buf, 8 + n);
    free(buf);
}

static dp_memory_data bytes_data(void)
{
    dp_memory_data d;
    memset(&d, 0, sizeof d);
    d.train_x = g_x;
    d.train_y = g_y;
    d.n_train = N_TRAIN;
    d.test_x = g_tx;
    d.test_y = g_ty;
    d.n_test = N_TEST;
    d.rows = d.cols = 28;
    return d;
}

static void test_registry(void)
{
    dp_err err;
    dp_memory_data d = bytes_data();
    CHECK(!dp_dataset_is_memory("mem:a"));
    CHECK(dp_dataset_register("a", &d, &err) == 0);
    CHECK(dp_dataset_is_memory("mem:a"));
    CHECK(!dp_dataset_is_memory("a"));

    dp_dataset ds;
    REQUIRE(dp_dataset_open_with(&ds, "mem:a", NULL, &err) == 0);
    CHECK(ds.train_all.images == g_x && ds.train_all.labels == g_y); /* no copy */
    CHECK(ds.test.images == g_tx && ds.test.n == N_TEST);
    CHECK(ds.train_all.n == N_TRAIN && ds.train_all.dim == DIM && !ds.train_all.values);
    CHECK(ds.rows == 28 && ds.cols == 28 && ds.classes == 4 && ds.channels == 0);
    dp_split tr, va;
    CHECK(dp_dataset_split(&ds, 300, 100, &tr, &va, &err) == 0);
    CHECK(tr.n == 300 && va.n == 100 && va.images == g_x + 300 * DIM);
    dp_dataset_close(&ds);

    /* floats, used as they are */
    static float fx[8 * 3];
    static uint8_t fy[8];
    for (int i = 0; i < 8 * 3; i++)
        fx[i] = (float)i * 0.5f;
    memset(&d, 0, sizeof d);
    d.train_x = fx;
    d.train_y = fy;
    d.n_train = 8;
    d.rows = 1;
    d.cols = 3;
    d.is_float = 1;
    d.classes = 3;
    CHECK(dp_dataset_register("f", &d, &err) == 0);
    REQUIRE(dp_dataset_open_with(&ds, "mem:f", NULL, &err) == 0);
    CHECK(ds.train_all.values == fx && !ds.train_all.images && ds.classes == 3);
    float x[3];
    uint8_t y;
    uint32_t idx = 2;
    dp_split_gather(x, &y, &ds.train_all, &idx, 1);
    CHECK(x[0] == 3.0f && x[2] == 4.0f && y == 0);
    dp_dataset_close(&ds);

    /* refusals: each with its reason */
    fy[5] = 3;
    CHECKF(dp_dataset_register("f", &d, &err) < 0 && strstr(err.msg, "label 3 of record 5"),
           "%s", err.msg);
    fy[5] = 0;
    d.n_train = 0;
    CHECK(dp_dataset_register("f", &d, &err) < 0 && strstr(err.msg, "no training records"));
    d.n_train = 8;
    d.train_y = NULL;
    CHECK(dp_dataset_register("f", &d, &err) < 0 && strstr(err.msg, "no labels"));
    CHECK(dp_dataset_register("", &d, &err) < 0);
    CHECK(dp_dataset_unregister("f") == 0);
    CHECK(dp_dataset_unregister("f") < 0);
    CHECKF(dp_dataset_open_with(&ds, "mem:f", NULL, &err) < 0 &&
               strstr(err.msg, "no in-memory dataset is registered as 'f'"), "%s", err.msg);
    CHECK(dp_dataset_unregister("a") == 0);
}

/* The weights of a run on `dataset`, saved under dir. */
static int train_on(const char *dataset, const char *dir, const char *name, dp_model *m)
{
    char save[1200];
    snprintf(save, sizeof save, "%s/%s.safetensors", dir, name);
    dp_train_config cfg = dp_train_defaults();
    cfg.dataset = dataset;
    cfg.model = "784-32-4";
    cfg.epochs = 2;
    cfg.batch = 50;
    cfg.n_train = 300;
    cfg.n_val = 100;
    cfg.threads = 1;
    cfg.log_every = 0;
    cfg.quiet = true;
    cfg.save_path = save;
    dp_train_result res;
    dp_err err;
    if (dp_train_run(&cfg, &res, &err) < 0) {
        fprintf(stderr, "train on %s: %s\n", dataset, err.msg);
        return -1;
    }
    dp_ckpt_info info;
    memset(m, 0, sizeof *m);
    if (dp_checkpoint_load_weights(save, m, 1, &info, &err) < 0) {
        fprintf(stderr, "%s: %s\n", save, err.msg);
        return -1;
    }
    return 0;
}

static void test_same_as_idx(void)
{
    char dir[1024];
    scratch_make(dir, sizeof dir, "memory_dataset");
    write_idx(dir, "train", g_x, g_y, N_TRAIN);
    write_idx(dir, "t10k", g_tx, g_ty, N_TEST);
    setenv("DOWNPOUR_CACHE", dir, 1);
    dp_memory_data d = bytes_data();
    dp_err err;
    REQUIRE(dp_dataset_register("same", &d, &err) == 0);
    dp_model a, b;
    REQUIRE(train_on(dir, dir, "idx", &a) == 0);
    REQUIRE(train_on("mem:same", dir, "mem", &b) == 0);
    CHECK(a.n_params == b.n_params &&
          memcmp(a.params, b.params, (size_t)a.n_params * sizeof *a.params) == 0);
    dp_model_free(&a);
    dp_model_free(&b);
    dp_dataset_unregister("same");
    scratch_remove(dir);
}

int main(void)
{
    synth(g_x, g_y, N_TRAIN, 1);
    synth(g_tx, g_ty, N_TEST, 2);
    test_registry();
    test_same_as_idx();
    if (check_failures)
        fprintf(stderr, "test_memory_dataset: %d check(s) failed\n", check_failures);
    return check_failures ? 1 : 0;
}
