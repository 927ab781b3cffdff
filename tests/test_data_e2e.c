/* End to end through the downpour program, datasets of files (issue 15):
 *   - MNIST converted to 8 TFRecord shards of PNG images (as TensorFlow
 *     Datasets writes them) trains exactly as the IDX files do with the same
 *     seed and order: the same records, bytes and order give the same
 *     accuracies and losses, bit for bit;
 *   - a slice written as .npy arrays (uint8) and as CSV (floats) likewise;
 *   - the same shards streamed under a memory bound smaller than the data
 *     train to a sound accuracy, and say they streamed;
 *   - FILE sharding with fewer files than workers is refused with the reason. */
#include <math.h>
#include <sys/stat.h>

#include "bytes.h"
#include "downpour/dataset.h"
#include "proc.h"

/* One run's figures from its metrics file. */
typedef struct figures {
    double val, test, train_loss;
} figures;

static figures read_figures(const char *tmp, const char *name)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.jsonl", tmp, name);
    figures f = {-1, -1, -1};
    cJSON *epoch = last_event(path, "epoch", NULL), *done = last_event(path, "done", NULL);
    CHECKF(epoch && done, "%s: no epoch or done event", path);
    if (epoch && done) {
        f.val = json_num(epoch, "val_accuracy");
        f.train_loss = json_num(epoch, "train_loss");
        f.test = json_num(done, "test_accuracy");
    }
    cJSON_Delete(epoch);
    cJSON_Delete(done);
    return f;
}

static void same_figures(const char *what, figures a, figures b)
{
    CHECKF(a.val == b.val && a.test == b.test && a.train_loss == b.train_loss,
           "%s: val %.6f / %.6f, test %.6f / %.6f, train loss %.9g / %.9g", what, a.val, b.val,
           a.test, b.test, a.train_loss, b.train_loss);
}

/* A .npy file of a C-order array (tests/bytes.h). */
static void write_npy(const char *path, const char *descr, const char *shape, const void *data,
                      size_t n)
{
    bytes b = npy_array(descr, shape, data, n);
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fwrite(b.p, 1, b.n, f) == b.n && fclose(f) == 0);
    free(b.p);
}

/* Records [lo, lo+n) of a split as CSV: "label,p0,...", each pixel the
 * float the IDX path gathers (byte / 255) printed so that it reads back
 * to the same float. */
static void write_csv(const char *path, const dp_split *s, uint32_t lo, uint32_t n)
{
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fputs("label", f);
    for (uint32_t j = 0; j < s->dim; j++)
        fprintf(f, ",p%u", j);
    fputc('\n', f);
    for (uint32_t i = lo; i < lo + n; i++) {
        fprintf(f, "%u", s->labels[i]);
        const uint8_t *px = s->images + (size_t)i * s->dim;
        for (uint32_t j = 0; j < s->dim; j++) {
            if (px[j] == 0)
                fputs(",0", f);
            else
                fprintf(f, ",%.9g", (double)((float)px[j] / 255.0f));
        }
        fputc('\n', f);
    }
    REQUIRE(fclose(f) == 0);
}

#define TRAIN_ARGS "--model mlp-300-100 --batch 128 --epochs 1 --threads 1 --seed 7 --no-progress"

int main(void)
{
    const char *bin = test_bin(), *tmp = test_tmp();
    REQUIRE(bin && tmp);
    require_mnist();
    char err[16384];
    /* ASan: a slice of the training records (the conversion stays whole) */
    const char *sizes = SANITIZED ? "--train-size 6000 --val-size 1000 --test-size 2000" : "";

    /* 1. MNIST as 8 shards of PNG Examples, plus one test shard. */
    int rc = run_cmd(err, sizeof err, "%s data convert --from mnist --to %s/shards --shards 8",
                     bin, tmp);
    REQUIRE(rc == 0 || !fprintf(stderr, "convert exited %d: %s\n", rc, err));
    rc = run_cmd(err, sizeof err, "%s train --dataset mnist %s %s --metrics %s/idx.jsonl", bin,
                 TRAIN_ARGS, sizes, tmp);
    CHECKF(rc == 0, "train on IDX exited %d: %s", rc, err);
    rc = run_cmd(err, sizeof err, "%s train --dataset %s/shards %s %s --metrics %s/shards.jsonl",
                 bin, tmp, TRAIN_ARGS, sizes, tmp);
    CHECKF(rc == 0, "train on the shards exited %d: %s", rc, err);
    CHECKF(strstr(err, "9 tfrecord files (60,000 train") && strstr(err, "decoded cache"),
           "no report of the shards and the cache in: %s", err);
    figures idx = read_figures(tmp, "idx"), shards = read_figures(tmp, "shards");
    same_figures("IDX against 8 TFRecord shards", idx, shards);
    if (!SANITIZED)
        CHECKF(idx.val >= 0.95, "validation accuracy %.4f after one epoch", idx.val);

    /* 2. The shards streamed through a 17 MB budget, less than their 47 MB of
     * training records decoded.  The budget is whole (docs/datasets.md): the
     * 10,000 test records (7.8 MB) and 6,000 validation records (4.7 MB)
     * come out of it, leaving 4.4 MB to the stream, which needs about 3.6 MB
     * for a window of 4,096 records, a queue of two batches of 128 and the
     * reader. */
    rc = run_cmd(err, sizeof err,
                 "%s train --dataset %s/shards %s %s --stream on --data-memory 17M "
                 "--shuffle-window 4096 --metrics %s/stream.jsonl",
                 bin, tmp, TRAIN_ARGS, sizes, tmp);
    CHECKF(rc == 0, "streamed training exited %d: %s", rc, err);
    CHECKF(strstr(err, "streaming") != NULL, "no report of streaming in: %s", err);
    if (!SANITIZED)
        CHECKF(strstr(err, "streaming: 17.0 MB budget = 7.8 MB test + 4.7 MB validation + "),
               "no report of the budget's parts in: %s", err);
    figures st = read_figures(tmp, "stream");
    if (!SANITIZED)
        CHECKF(st.val >= 0.94 && st.test >= 0.94, "streamed: val %.4f, test %.4f", st.val,
               st.test);

    /* 3. A slice as .npy (uint8, as keras stores MNIST) and as CSV (floats). */
    dp_dataset ds;
    dp_err e;
    REQUIRE(dp_dataset_open(&ds, "mnist", &e) == 0 || !fprintf(stderr, "%s\n", e.msg));
    const uint32_t n_tr = SANITIZED ? 1200 : 3000, n_te = 500;
    char path[1200], shape[64];
    snprintf(path, sizeof path, "%s/npy", tmp);
    REQUIRE(mkdir(path, 0755) == 0);
    snprintf(path, sizeof path, "%s/npy/x_train.npy", tmp);
    snprintf(shape, sizeof shape, "(%u, 28, 28)", n_tr);
    write_npy(path, "|u1", shape, ds.train_all.images, (size_t)n_tr * 784);
    snprintf(path, sizeof path, "%s/npy/y_train.npy", tmp);
    snprintf(shape, sizeof shape, "(%u,)", n_tr);
    write_npy(path, "|u1", shape, ds.train_all.labels, n_tr);
    snprintf(path, sizeof path, "%s/npy/x_test.npy", tmp);
    snprintf(shape, sizeof shape, "(%u, 28, 28)", n_te);
    write_npy(path, "|u1", shape, ds.test.images, (size_t)n_te * 784);
    snprintf(path, sizeof path, "%s/npy/y_test.npy", tmp);
    snprintf(shape, sizeof shape, "(%u,)", n_te);
    write_npy(path, "|u1", shape, ds.test.labels, n_te);
    snprintf(path, sizeof path, "%s/csv", tmp);
    REQUIRE(mkdir(path, 0755) == 0);
    snprintf(path, sizeof path, "%s/csv/train.csv", tmp);
    write_csv(path, &ds.train_all, 0, n_tr);
    snprintf(path, sizeof path, "%s/csv/test.csv", tmp);
    write_csv(path, &ds.test, 0, n_te);
    dp_dataset_close(&ds);

    char slice[128];
    snprintf(slice, sizeof slice, "--train-size %u --val-size %u --test-size %u", n_tr - 500, 500u,
             n_te);
    const char *names[3] = {"slice-idx", "slice-npy", "slice-csv"};
    char sets[3][1200];
    snprintf(sets[0], sizeof sets[0], "mnist");
    snprintf(sets[1], sizeof sets[1], "%s/npy", tmp);
    snprintf(sets[2], sizeof sets[2], "%s/csv", tmp);
    for (int i = 0; i < 3; i++) {
        rc = run_cmd(err, sizeof err, "%s train --dataset %s %s %s --metrics %s/%s.jsonl", bin,
                     sets[i], TRAIN_ARGS, slice, tmp, names[i]);
        CHECKF(rc == 0, "train on %s exited %d: %s", sets[i], rc, err);
    }
    figures s_idx = read_figures(tmp, names[0]);
    same_figures("IDX against .npy", s_idx, read_figures(tmp, names[1]));
    same_figures("IDX against CSV", s_idx, read_figures(tmp, names[2]));

    /* 4. FILE sharding: 3 files for 4 workers is refused, naming the trap. */
    rc = run_cmd(err, sizeof err,
                 "%s data convert --from mnist --to %s/three --shards 3 --limit 3000", bin, tmp);
    CHECKF(rc == 0, "convert --shards 3 exited %d: %s", rc, err);
    rc = run_cmd(err, sizeof err,
                 "%s launch --workers 4 -- train --strategy allreduce --shard file --dataset "
                 "%s/three --train-size 2500 --val-size 500 --test-size 500 " TRAIN_ARGS,
                 bin, tmp);
    CHECKF(rc != 0 && strstr(err, "3 files for 4 workers") != NULL,
           "FILE sharding of 3 files over 4 workers: exit %d: %s", rc, err);
    return check_failures != 0;
}
