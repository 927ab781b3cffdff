/* The readers' speed beside the steps' appetite (issue 15): records read and
 * decoded per second on one core from TFRecord files of raw-byte and of PNG
 * images (records.h), the same through a stream (its reader thread, its
 * shuffle window: stream.h), and batches gathered from the decoded cache
 * (dp_split_gather), each beside the records per second a training step of
 * mlp-300-100 and of cnn-mnist consumes at batch 128 on the cores a reader
 * leaves it (all but one; --threads to choose).  A reader meets its bound
 * when one core of it outpaces the step: then it is never what a step waits
 * for.
 *
 * The records are MNIST's first 20,000 training images ($DOWNPOUR_DATA or
 * ./data), written to a scratch directory by the program itself.
 *
 *   bench_data [--records N] [--repeats R] [--threads T] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"
#include "bench_run.h"
#include "bench_train.h"
#include "downpour/blas.h"
#include "downpour/clock.h"
#include "downpour/dataset.h"
#include "downpour/example.h"
#include "downpour/png.h"
#include "downpour/records.h"
#include "downpour/rng.h"
#include "downpour/stream.h"
#include "downpour/tfrecord.h"

#define MAX_REPEATS 15
#define BATCH 128

static void die(const char *what, const dp_err *e)
{
    fprintf(stderr, "bench_data: %s: %s\n", what, e ? e->msg : "");
    exit(1);
}

/* n records of s as one TFRecord file of Examples: PNG or raw bytes. */
static void write_file(const char *path, const dp_split *s, uint32_t n, int png)
{
    dp_err e;
    dp_tfrecord_writer *w = NULL;
    if (dp_tfrecord_writer_open(&w, path, DP_TFRECORD_RAW, &e) < 0)
        die(path, &e);
    dp_png_buf enc = {0};
    uint8_t *ser = NULL;
    size_t ser_cap = 0;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *px = s->images + (size_t)i * s->dim;
        dp_bytes img = {px, s->dim};
        if (png) {
            if (dp_png_encode(&enc, px, 28, 28, 1, &e) < 0)
                die("dp_png_encode", &e);
            img = (dp_bytes){enc.data, enc.len};
        }
        int64_t label = s->labels[i], h = 28, wd = 28;
        dp_feature f[4] = {
            {.name = "image", .kind = DP_FEATURE_BYTES, .count = 1, .bytes = &img},
            {.name = "label", .kind = DP_FEATURE_INT64, .count = 1, .int64s = &label},
            {.name = "height", .kind = DP_FEATURE_INT64, .count = 1, .int64s = &h},
            {.name = "width", .kind = DP_FEATURE_INT64, .count = 1, .int64s = &wd}};
        size_t nf = png ? 2 : 4, len = dp_example_encoded_size(f, nf);
        if (len > ser_cap) {
            free(ser);
            ser_cap = len * 2;
            if (!(ser = malloc(ser_cap)))
                die("out of memory", NULL);
        }
        dp_example_encode(ser, f, nf);
        if (dp_tfrecord_write(w, ser, len, &e) < 0)
            die(path, &e);
    }
    if (dp_tfrecord_writer_close(w, &e) < 0)
        die(path, &e);
    dp_png_buf_free(&enc);
    free(ser);
}

/* Seconds to read and decode every record of dir's training files once. */
static double read_seconds(const char *dir, uint32_t *records)
{
    dp_err e;
    dp_data_options opt;
    dp_data_options_default(&opt);
    dp_data_files f;
    if (dp_data_files_find(&f, dir, &opt, &e) < 0 || dp_data_files_count(&f, &opt, &e) < 0)
        die(dir, &e);
    uint8_t px[4096], label;
    double t0 = dp_now();
    uint32_t n = 0;
    for (size_t i = 0; i < f.train.n; i++) {
        dp_record_reader *r = NULL;
        if (dp_record_open(&r, &f.train.files[i], f.format, &f.shape, &opt, &e) < 0)
            die(f.train.files[i].path, &e);
        int rc;
        while ((rc = dp_record_next(r, px, &label, &e)) == 1)
            n++;
        if (rc < 0)
            die(f.train.files[i].path, &e);
        dp_record_close(r);
    }
    double t = dp_now() - t0;
    dp_data_files_free(&f);
    *records = n;
    return t;
}

/* Seconds per record through a whole streamed epoch (reader thread, window). */
static double stream_seconds(const char *dir, uint32_t n_rec, float *x, uint8_t *y)
{
    dp_err e;
    dp_dataset_options o;
    dp_dataset_options_default(&o);
    o.stream = 1;
    o.memory = 64u << 20;
    o.window = 10000;
    dp_dataset ds;
    dp_split tr, va;
    if (dp_dataset_open_with(&ds, dir, &o, &e) < 0 ||
        dp_dataset_split(&ds, n_rec - 1000, 1000, &tr, &va, &e) < 0)
        die(dir, &e);
    dp_batcher b;
    if (dp_batcher_init(&b, &tr, 1, 1, DP_SHARD_OFF, 0, 1, &e) < 0)
        die(dir, &e);
    dp_batcher_start_epoch(&b, 0);
    double t0 = dp_now();
    long got = 0;
    int k;
    while ((k = dp_batcher_next(&b, x, y, BATCH)) > 0)
        got += k;
    double t = dp_now() - t0;
    if (k < 0)
        die(dir, &b.err);
    dp_batcher_free(&b);
    dp_dataset_close(&ds);
    return got > 0 ? t / (double)got : 0;
}

/* Records per second one training step consumes. */
static double step_rate(const char *model, const dp_split *s, float *x, uint8_t *y, int repeats)
{
    dp_err e;
    dp_model m;
    dp_optim o;
    dp_batcher bt;
    dp_optim_config oc = dp_optim_defaults(DP_OPTIM_ADAM);
    if (dp_model_init(&m, model, BATCH, 1, &e) < 0 || dp_optim_init(&o, &oc, m.n_params, &e) < 0 ||
        dp_batcher_init(&bt, s, 1, 1, DP_SHARD_OFF, 0, 1, &e) < 0)
        die(model, &e);
    dp_model_init_params(&m, 1);
    dp_batcher_start_epoch(&bt, 0);
    int steps = strncmp(model, "cnn", 3) == 0 ? 6 : 60;
    bench_train_step_seconds(&m, &o, &bt, x, y, BATCH, steps / 3 + 1, 0);
    double t[MAX_REPEATS];
    for (int r = 0; r < repeats; r++)
        t[r] = bench_train_step_seconds(&m, &o, &bt, x, y, BATCH, steps, 0);
    dp_batcher_free(&bt);
    dp_optim_free(&o);
    dp_model_free(&m);
    return BATCH / bench_median(t, repeats);
}

int main(int argc, char **argv)
{
    long records = 20000, threads = 0;
    int repeats = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--records") == 0)
            records = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--repeats") == 0)
            repeats = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--threads") == 0)
            threads = atol(argv[i + 1]);
    }
    if (records < 2000 || records > 60000 || repeats < 1 || repeats > MAX_REPEATS ||
        threads < 0) {
        fprintf(stderr, "usage: bench_data [--records 2000..60000] [--repeats 1..%d] "
                        "[--threads N]\n", MAX_REPEATS);
        return 2;
    }
    /* The step gets the cores a reader leaves it: a streamed dataset's
     * reader thread takes one (stream.h), so the steps are timed on the
     * others (at least one). */
    if (threads == 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        threads = cores > 2 ? cores - 1 : 1;
    }
    dp_blas_set_threads((int)threads);
    dp_err e;
    dp_dataset mnist;
    if (dp_dataset_open(&mnist, "mnist", &e) < 0)
        die("MNIST (run make run or scripts/fetch-data.sh)", &e);
    char dir[256], raw[320], png[320], path[400];
    if (bench_scratch("bench_data", dir, sizeof dir) < 0)
        return 1;
    snprintf(raw, sizeof raw, "%s/raw", dir);
    snprintf(png, sizeof png, "%s/png", dir);
    if (mkdir(raw, 0755) < 0 || mkdir(png, 0755) < 0) {
        perror("mkdir");
        return 1;
    }
    dp_split test = mnist.test;
    test.n = 1000;
    const char *dirs[2] = {raw, png};
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/mnist-train.tfrecord-00000-of-00001", dirs[k]);
        write_file(path, &mnist.train_all, (uint32_t)records, k);
        snprintf(path, sizeof path, "%s/mnist-test.tfrecord-00000-of-00001", dirs[k]);
        write_file(path, &test, test.n, k);
    }

    float *x = malloc(sizeof(float) * BATCH * 784);
    uint8_t *y = malloc(BATCH);
    uint32_t *idx = malloc(sizeof(uint32_t) * BATCH);
    if (!x || !y || !idx)
        die("out of memory", NULL);

    /* the appetites, on the cores beside a reader's */
    double mlp = step_rate("mlp-300-100", &mnist.train_all, x, y, repeats);
    double cnn = step_rate("cnn-mnist", &mnist.train_all, x, y, repeats);

    double rate[4], t[MAX_REPEATS];
    uint32_t n = 0;
    for (int k = 0; k < 2; k++) {
        read_seconds(dirs[k], &n); /* warm the page cache */
        for (int r = 0; r < repeats; r++)
            t[r] = read_seconds(dirs[k], &n) / n;
        rate[k] = 1 / bench_median(t, repeats);
    }
    for (int r = 0; r < repeats; r++)
        t[r] = stream_seconds(png, (uint32_t)records, x, y);
    rate[2] = 1 / bench_median(t, repeats);
    dp_rng rng;
    dp_rng_seed(&rng, 3);
    for (int r = 0; r < repeats; r++) {
        double t0 = dp_now();
        for (int b = 0; b < 200; b++) {
            for (int i = 0; i < BATCH; i++)
                idx[i] = (uint32_t)dp_rng_below(&rng, mnist.train_all.n);
            dp_split_gather(x, y, &mnist.train_all, idx, BATCH);
        }
        t[r] = (dp_now() - t0) / (200.0 * BATCH);
    }
    rate[3] = 1 / bench_median(t, repeats);

    const char *names[4] = {"tfrecord raw bytes (1 core)", "tfrecord PNG (1 core)",
                            "stream of PNG, window 10k", "decoded cache gather"};
    printf("%ld MNIST records, batch %d, median of %d; steps on %d BLAS thread(s), the cores "
           "beside a reader's (%s)\n",
           records, BATCH, repeats, dp_blas_threads(), dp_blas_info());
    printf("step consumption: mlp-300-100 %.0f records/s, cnn-mnist %.0f records/s\n", mlp, cnn);
    printf("%-30s %14s %22s %22s\n", "reader", "records/s", "vs mlp-300-100", "vs cnn-mnist");
    int missed = 0;
    for (int k = 0; k < 4; k++) {
        int m1 = rate[k] >= mlp, m2 = rate[k] >= cnn;
        missed += !m1 + !m2;
        printf("%-30s %14.0f %14.1fx %-7s %14.1fx %-7s\n", names[k], rate[k], rate[k] / mlp,
               m1 ? "met" : "NOT", rate[k] / cnn, m2 ? "met" : "NOT");
    }
    printf("target: every reader outpaces both steps: %d of 8 met\n", 8 - missed);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_data: could not remove %s\n", dir);
    free(x);
    free(y);
    free(idx);
    dp_dataset_close(&mnist);
    return 0;
}
