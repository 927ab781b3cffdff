/* Streaming's reader thread against reading inline (docs/datasets.md,
 * "Streaming"; docs/benchmarks.md): one epoch of a streamed split of
 * TFRecord files (28x28 images in Examples, raw bytes or, with --png, PNG as
 * TensorFlow Datasets stores MNIST, written to a temporary directory) under a memory bound a sixteenth of its size, with a consumer
 * that does nothing, or an SGD step of mlp-128 or mlp-300-100 per batch.
 * The rule the default follows: no thread where it makes a run slower than
 * the same work inline.  Prints the median time of a second epoch (whose
 * reading the thread began during the first) and how long the second
 * epoch's first batch waited.  With --seek 1 it times instead what a resumed
 * run pays before its first step: dp_stream_seek to the middle of an epoch
 * just started, and the first batch after it, and counts the records
 * decoded.
 *
 *   bench_stream [--records N] [--repeats R] [--batch B] [--png 1] [--threads T] [--seek 1]
 *   (T: the arithmetic pool's threads, blas.h; default OpenBLAS's count) */
#include <inttypes.h>
#include <png.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench.h"
#include "downpour/blas.h"
#include "downpour/clock.h"
#include "downpour/example.h"
#include "downpour/model.h"
#include "downpour/optim.h"
#include "downpour/records.h"
#include "downpour/stream.h"
#include "downpour/tfrecord.h"

#define DIM 784
#define FILES 8

/* The image as a gray PNG (libpng's simplified writer) into out (cap bytes). */
static size_t png_of(uint8_t *out, size_t cap, const uint8_t *px)
{
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = img.height = 28;
    img.format = PNG_FORMAT_GRAY;
    png_alloc_size_t n = cap;
    return png_image_write_to_memory(&img, out, &n, 0, px, 0, NULL) ? (size_t)n : 0;
}

static int write_files(const char *dir, uint32_t records, int png, dp_err *err)
{
    char path[512];
    uint8_t px[DIM], enc[4 * DIM], pngbuf[2 * DIM];
    uint32_t x = 2463534242u;
    for (int f = 0; f <= FILES; f++) {
        snprintf(path, sizeof path, "%s/b-%s.tfrecord-%05d", dir, f < FILES ? "train" : "test", f);
        dp_tfrecord_writer *w;
        if (dp_tfrecord_writer_open(&w, path, DP_TFRECORD_RAW, err) < 0)
            return -1;
        uint32_t n = f < FILES ? records / FILES : 100;
        for (uint32_t i = 0; i < n; i++) {
            for (int j = 0; j < DIM; j++) { /* an MNIST-like mix: dark, with strokes */
                x ^= x << 13, x ^= x >> 17, x ^= x << 5;
                px[j] = (x & 3) ? 0 : (uint8_t)x;
            }
            dp_bytes b = {px, DIM};
            if (png && (b.len = png_of(pngbuf, sizeof pngbuf, px)) > 0)
                b.data = pngbuf;
            if (b.len == 0)
                return dp_errf(err, "PNG encoding failed");
            int64_t label = x % 10;
            const dp_feature fs[2] = {{"image", DP_FEATURE_BYTES, 1, &b, NULL, NULL},
                                      {"label", DP_FEATURE_INT64, 1, NULL, NULL, &label}};
            size_t len = dp_example_encode(enc, fs, 2);
            if (dp_tfrecord_write(w, enc, len, err) < 0) {
                dp_tfrecord_writer_abort(w);
                return -1;
            }
        }
        if (dp_tfrecord_writer_close(w, err) < 0)
            return -1;
    }
    return 0;
}

/* Two epochs of one stream: the second's seconds (the steady state: its
 * reading began during the first), or -1; *first_wait the seconds its first
 * batch took, from the epoch's start (the window's fill). */
static double epoch(const dp_split *split, const char *mode, dp_model *m, dp_optim *o, int batch,
                    float *x, uint8_t *y, int *threaded, double *first_wait, dp_err *err)
{
    if (mode)
        setenv("DOWNPOUR_STREAM_READER", mode, 1);
    else
        unsetenv("DOWNPOUR_STREAM_READER");
    dp_stream *s;
    if (dp_stream_open(&s, split, DP_SHARD_OFF, 0, 1, 1, 1, batch, err) < 0)
        return -1;
    double t = 0, t0;
    int n = 0;
    for (long e = 0; e < 2 && n >= 0; e++) {
        t0 = dp_now();
        if (dp_stream_start_epoch(s, e, err) < 0)
            n = -1;
        else
            for (long k = 0; (n = dp_stream_next(s, x, y, batch, err)) > 0; k++) {
                if (k == 0)
                    *first_wait = dp_now() - t0;
                if (m)
                    dp_model_train_step(m, o, x, y, n, 0.01f, NULL);
            }
        t = dp_now() - t0;
    }
    *threaded = dp_stream_threaded(s);
    dp_stream_close(s);
    return n < 0 ? -1 : t;
}

/* A fresh stream's epoch 1 started and sought to its middle: the seek's
 * seconds, or -1; *first the first batch's after it, *decoded the records
 * decoded by both. */
static double seek_middle(const dp_split *split, const char *mode, int batch, float *x,
                          uint8_t *y, double *first, uint64_t *decoded, dp_err *err)
{
    setenv("DOWNPOUR_STREAM_READER", mode, 1);
    dp_stream *s;
    if (dp_stream_open(&s, split, DP_SHARD_OFF, 0, 1, 1, 1, batch, err) < 0)
        return -1;
    double t = -1, t0 = dp_now();
    if (dp_stream_start_epoch(s, 1, err) == 0 && dp_stream_seek(s, split->n / 2, err) == 0) {
        t = dp_now() - t0;
        t0 = dp_now();
        if (dp_stream_next(s, x, y, batch, err) != batch)
            t = -1;
        *first = dp_now() - t0;
    }
    *decoded = dp_stream_decoded(s);
    dp_stream_close(s);
    return t;
}

static int bench_seek(const dp_split *split, long repeats, int batch, float *x, uint8_t *y,
                      dp_err *err)
{
    printf("%-8s %10s %16s %18s\n", "reader", "seek s", "first batch ms", "records decoded");
    static const char *modes[2] = {"thread", "inline"};
    double t[2][15], f[2][15];
    uint64_t dec[2] = {0, 0};
    for (long r = 0; r < repeats; r++)
        for (int m = 0; m < 2; m++)
            if ((t[m][r] = seek_middle(split, modes[m], batch, x, y, &f[m][r], &dec[m], err)) < 0)
                return -1;
    for (int m = 0; m < 2; m++)
        printf("%-8s %10.4f %16.2f %18" PRIu64 "\n", modes[m], bench_median(t[m], (int)repeats),
               1e3 * bench_median(f[m], (int)repeats), dec[m]);
    return 0;
}

int main(int argc, char **argv)
{
    long records = 60000, repeats = 5, batch = 128, png = 0, threads = 0, seek = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        long *v = strcmp(argv[i], "--records") == 0   ? &records
                  : strcmp(argv[i], "--repeats") == 0 ? &repeats
                  : strcmp(argv[i], "--batch") == 0   ? &batch
                  : strcmp(argv[i], "--png") == 0     ? &png
                  : strcmp(argv[i], "--threads") == 0 ? &threads
                  : strcmp(argv[i], "--seek") == 0    ? &seek
                                                      : NULL;
        if (!v || (*v = atol(argv[i + 1])) < 0) {
            fprintf(stderr, "usage: %s [--records N] [--repeats R<=15] [--batch B] [--png 1] "
                    "[--threads T] [--seek 1]\n", argv[0]);
            return 2;
        }
    }
    if (threads > 0)
        dp_blas_set_threads((int)threads);
    if (repeats < 1 || repeats > 15 || records < FILES || batch < 1)
        return fprintf(stderr, "repeats at most 15, records at least %d\n", FILES), 2;
    dp_err err;
    char dir[] = "/tmp/bench_stream.XXXXXX";
    if (!mkdtemp(dir) || write_files(dir, (uint32_t)records, png != 0, &err) < 0)
        return fprintf(stderr, "writing the files: %s\n", err.msg), 1;
    dp_data_files files;
    dp_data_options opt;
    dp_data_options_default(&opt);
    if (dp_data_files_find(&files, dir, &opt, &err) < 0 ||
        dp_data_files_count(&files, &opt, &err) < 0)
        return fprintf(stderr, "%s\n", err.msg), 1;
    uint32_t n = (uint32_t)(records / FILES * FILES);
    dp_stream_source src = {.files = &files.train, .format = files.format, .shape = files.shape,
                            .opt = opt, .memory = (size_t)n * DIM / 16};
    dp_split split = {.n = n, .dim = DIM, .stream = &src};
    float *x = malloc((size_t)batch * DIM * sizeof *x);
    uint8_t *y = malloc((size_t)batch);
    printf("%u records of %d bytes (%s) in %d TFRecord files, bound %zu bytes, batch %ld, %d "
           "pool threads, median of %ld epochs\n", n, DIM, png ? "PNG" : "raw", FILES, src.memory,
           batch, dp_blas_threads(), repeats);
    int rc = 0;
    if (seek) {
        if ((rc = bench_seek(&split, repeats, (int)batch, x, y, &err)) < 0)
            fprintf(stderr, "%s\n", err.msg);
        goto done;
    }
    printf("%-16s %10s %10s %8s %10s %-12s %s\n", "consumer", "thread s", "inline s", "ratio",
           "default s", "(its choice)", "first batch ms: thread, inline");
    const char *specs[] = {NULL, "784-128-10", "784-300-100-10"};
    for (int k = 0; k < 3; k++) {
        dp_model m;
        dp_optim o;
        dp_optim_config oc = dp_optim_defaults(DP_OPTIM_SGD);
        if (specs[k] && (dp_model_init(&m, specs[k], (int)batch, 1, &err) < 0 ||
                         dp_optim_init(&o, &oc, m.n_params, &err) < 0))
            return fprintf(stderr, "%s\n", err.msg), 1;
        if (specs[k])
            dp_model_init_params(&m, 1);
        static const char *modes[3] = {"thread", "inline", NULL};
        double t[3][15], w[3][15];
        int threaded = 0;
        for (long r = 0; r < repeats; r++)
            for (int mode = 0; mode < 3; mode++) /* interleaved: drift hits all alike */
                if ((t[mode][r] = epoch(&split, modes[mode], specs[k] ? &m : NULL, &o, (int)batch,
                                        x, y, &threaded, &w[mode][r], &err)) < 0)
                    return fprintf(stderr, "%s\n", err.msg), 1;
        double th = bench_median(t[0], (int)repeats), in = bench_median(t[1], (int)repeats);
        double au = bench_median(t[2], (int)repeats);
        printf("%-16s %10.3f %10.3f %8.2f %10.3f %-12s %.1f, %.1f\n",
               specs[k] ? specs[k] : "none", th, in, in / th, au, threaded ? "thread" : "inline",
               1e3 * bench_median(w[0], (int)repeats), 1e3 * bench_median(w[1], (int)repeats));
        if (specs[k]) {
            dp_model_free(&m);
            dp_optim_free(&o);
        }
    }
done:
    for (size_t i = 0; i < files.train.n; i++)
        remove(files.train.files[i].path);
    for (size_t i = 0; i < files.test.n; i++)
        remove(files.test.files[i].path);
    remove(dir);
    dp_data_files_free(&files);
    free(x);
    free(y);
    return rc < 0;
}
