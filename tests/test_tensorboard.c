/* TensorBoard event files (docs/tensorboard.md): a reader here checks both
 * masked CRC32Cs of every TFRecord and decodes the protobuf Events with its
 * own small decoder; a flipped byte or a torn record is caught; protoc
 * --decode_raw reads a scalar record; metrics events become the documented
 * tags; `downpour train --tensorboard DIR` writes val/accuracy equal to the
 * metrics file's, and a launched cluster gives each task its directory. */
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "downpour/crc32c.h"
#include "downpour/metrics.h"
#include "downpour/tensorboard.h"
#include "proc.h"
#include "scratch.h"

/* ---- the reader: TFRecords and the Event fields a scalar uses ---- */

typedef struct tb_rec {
    int has_version, has_value;
    char version[32];
    char tag[256];
    double wall;
    int64_t step;
    float value;
    size_t data_at, data_len; /* the Event's bytes in the file */
} tb_rec;

static uint32_t mask(uint32_t c)
{
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static uint64_t le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static int varint(const unsigned char *p, size_t n, size_t *i, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; shift < 64 && *i < n; shift += 7) {
        unsigned char b = p[(*i)++];
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return 0;
    }
    return -1;
}

/* Walks one message's fields: calls fn(field, wire type, value or
 * length-delimited bytes) for each; -1 on a malformed message. */
typedef int (*field_fn)(tb_rec *r, int field, int type, uint64_t v, const unsigned char *b,
                        size_t len);
static int walk(const unsigned char *p, size_t n, tb_rec *r, field_fn fn)
{
    size_t i = 0;
    while (i < n) {
        uint64_t key, v = 0;
        if (varint(p, n, &i, &key) < 0)
            return -1;
        int field = (int)(key >> 3), type = (int)(key & 7);
        const unsigned char *b = NULL;
        size_t len = 0;
        if (type == 0) {
            if (varint(p, n, &i, &v) < 0)
                return -1;
        } else if (type == 1 || type == 5) {
            len = type == 1 ? 8 : 4;
            if (n - i < len)
                return -1;
            v = le(p + i, (int)len);
            i += len;
        } else if (type == 2) {
            if (varint(p, n, &i, &v) < 0 || v > n - i)
                return -1;
            b = p + i;
            len = (size_t)v;
            i += len;
        } else {
            return -1;
        }
        if (fn(r, field, type, v, b, len) < 0)
            return -1;
    }
    return 0;
}

static int value_field(tb_rec *r, int field, int type, uint64_t v, const unsigned char *b,
                       size_t len)
{
    if (field == 1 && type == 2 && len < sizeof r->tag) {
        memcpy(r->tag, b, len);
        r->tag[len] = '\0';
    } else if (field == 2 && type == 5) {
        uint32_t bits = (uint32_t)v;
        memcpy(&r->value, &bits, 4);
        r->has_value = 1;
    } else {
        return -1; /* a scalar Value has nothing else */
    }
    return 0;
}

static int summary_field(tb_rec *r, int field, int type, uint64_t v, const unsigned char *b,
                         size_t len)
{
    (void)v;
    if (field != 1 || type != 2 || r->has_value)
        return -1; /* one Value per Event */
    return walk(b, len, r, value_field);
}

static int event_field(tb_rec *r, int field, int type, uint64_t v, const unsigned char *b,
                       size_t len)
{
    if (field == 1 && type == 1)
        memcpy(&r->wall, &v, 8);
    else if (field == 2 && type == 0)
        r->step = (int64_t)v;
    else if (field == 3 && type == 2 && len < sizeof r->version) {
        memcpy(r->version, b, len);
        r->version[len] = '\0';
        r->has_version = 1;
    } else if (field == 5 && type == 2)
        return walk(b, len, r, summary_field);
    else
        return -1;
    return 0;
}

/* Reads every record of a file's bytes into out; returns their number, or -1
 * with the reason in why. */
static int read_records(const unsigned char *p, size_t n, tb_rec *out, int cap, char *why,
                        size_t why_len)
{
    int count = 0;
    size_t i = 0;
    while (i < n) {
        if (n - i < 12)
            return snprintf(why, why_len, "torn length at byte %zu", i), -1;
        uint64_t len = le(p + i, 8);
        if ((uint32_t)le(p + i + 8, 4) != mask(dp_crc32c(0, p + i, 8)))
            return snprintf(why, why_len, "length CRC of record %d is wrong", count), -1;
        if (len > n - i - 12 || n - i - 12 - len < 4)
            return snprintf(why, why_len, "record %d is torn", count), -1;
        const unsigned char *data = p + i + 12;
        if ((uint32_t)le(data + len, 4) != mask(dp_crc32c(0, data, (size_t)len)))
            return snprintf(why, why_len, "data CRC of record %d is wrong", count), -1;
        if (count == cap)
            return snprintf(why, why_len, "more than %d records", cap), -1;
        tb_rec *r = &out[count];
        memset(r, 0, sizeof *r);
        r->data_at = i + 12;
        r->data_len = (size_t)len;
        if (walk(data, (size_t)len, r, event_field) < 0)
            return snprintf(why, why_len, "record %d is not a scalar Event", count), -1;
        count++;
        i += 12 + (size_t)len + 4;
    }
    return count;
}

/* The one events file in dir (path filled), or the number found when not one. */
static int events_file(const char *dir, char *path, size_t cap)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int found = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strncmp(e->d_name, "events.out.tfevents.", 20) == 0 && found++ == 0)
            snprintf(path, cap, "%.1000s/%.255s", dir, e->d_name);
    closedir(d);
    return found;
}

/* Reads the events file in dir; ends the test when there is none. */
static int read_dir(const char *dir, tb_rec *out, int cap, unsigned char **bytes, size_t *n)
{
    char path[1400], why[200];
    int files = events_file(dir, path, sizeof path);
    CHECKF(files == 1, "%d events files in %s, expected 1", files, dir);
    REQUIRE(files == 1);
    *bytes = read_bytes(path, n);
    int count = read_records(*bytes, *n, out, cap, why, sizeof why);
    CHECKF(count > 0, "%s: %s", path, why);
    REQUIRE(count > 0);
    CHECKF(out[0].has_version && strcmp(out[0].version, "brain.Event:2") == 0 &&
               !out[0].tag[0] && out[0].wall > 1e9,
           "%s: the first record is not the file_version Event", path);
    return count;
}

/* The records with this tag, in order: their count, steps and values. */
static int with_tag(const tb_rec *r, int n, const char *tag, int64_t *steps, float *values,
                    int cap)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        if (strcmp(r[i].tag, tag) == 0) {
            if (k < cap) {
                steps[k] = r[i].step;
                values[k] = r[i].value;
            }
            k++;
        }
    return k;
}

/* ---- the writer through the reader ---- */

#define MAX_RECS 4096

static tb_rec recs[MAX_RECS];

static void check_writer(const char *dir)
{
    dp_err err;
    dp_tensorboard *tb = NULL;
    char long_tag[DP_TENSORBOARD_MAX_TAG + 2];
    memset(long_tag, 'x', sizeof long_tag - 1);
    long_tag[sizeof long_tag - 1] = '\0';

    CHECK(dp_tensorboard_mask_crc(0x12345678u) == mask(0x12345678u));
    /* A known answer: the data CRC TensorFlow wrote for the record of
     * Event{file_version: "CRC test, one two"}. */
    CHECK(mask(dp_crc32c(0, "\x1a\x11" "CRC test, one two", 19)) == 0x5794d08au);
    REQUIRE(dp_tensorboard_open(&tb, dir, "worker-3", &err) == 0);
    char sub[1300];
    snprintf(sub, sizeof sub, "%s/worker-3", dir);
    CHECK(strncmp(dp_tensorboard_path(tb), sub, strlen(sub)) == 0);
    CHECK(dp_tensorboard_scalar(tb, "val/accuracy", 2, 1700000000.25, 0.75f) == 0);
    CHECK(dp_tensorboard_scalar(tb, "loss", -3, 1700000001.5, -1.5e-7f) == 0);
    /* a 200-byte tag: two-byte lengths in Value and Summary */
    long_tag[DP_TENSORBOARD_MAX_TAG] = '\0';
    CHECK(dp_tensorboard_scalar(tb, long_tag, (int64_t)1 << 40, 1700000002.0, 3.0f) == 0);
    long_tag[DP_TENSORBOARD_MAX_TAG] = 'x';
    CHECK(dp_tensorboard_scalar(tb, long_tag, 1, 0, 0) < 0); /* too long */
    CHECK(dp_tensorboard_scalar(tb, "", 1, 0, 0) < 0);

    /* Metrics events mirrored, from a writer with no file (--tensorboard alone). */
    dp_metrics *m = NULL;
    REQUIRE(dp_metrics_open(&m, NULL, &err) == 0);
    dp_metrics_attach_tensorboard(m, tb);
    dp_metrics_event(m, "train", DP_F_INT, "epoch", 1L, DP_F_INT, "step", 8L, DP_F_NUM,
                     "train_loss", 0.75, DP_F_NUM, "train_accuracy", 0.5, DP_F_END);
    dp_metrics_event(m, "epoch", DP_F_INT, "epoch", 1L, DP_F_NUM, "val_accuracy", 0.625,
                     DP_F_NUM, "val_loss", 1.25, DP_F_NUM, "train_loss", 2.5, DP_F_NUM, "lr",
                     0.001, DP_F_INT, "step", 16L, DP_F_END);
    dp_metrics_event(m, "steps", DP_F_INT, "epoch", 1L, DP_F_INT, "step", 16L, DP_F_NUM,
                     "samples_per_second", 5000.0, DP_F_NUM, "step_ms_median", 2.0, DP_F_NUM,
                     "step_ms_p90", 3.0, DP_F_END);
    dp_metrics_event(m, "resource", DP_F_STR, "task", "worker:3", DP_F_NUM, "cpu_percent", 50.0,
                     DP_F_INT, "rss_bytes", 3L << 20, DP_F_INT, "net_tx_bytes", 2000000L,
                     DP_F_INT, "net_rx_bytes", 500000L, DP_F_END);
    dp_metrics_event(m, "clock", DP_F_INT, "worker", 0L, DP_F_END); /* no scalar */
    dp_metrics_event(m, "epoch", DP_F_INT, "epoch", 2L, DP_F_NUM, "val_accuracy", NAN,
                     DP_F_INT, "step", 32L, DP_F_END); /* null: skipped */
    dp_metrics_event(m, "done", DP_F_NUM, "test_accuracy", 0.5, DP_F_END);
    dp_metrics_attach_tensorboard(m, NULL);
    dp_metrics_event(m, "done", DP_F_NUM, "test_accuracy", 0.25, DP_F_END); /* detached */
    dp_metrics_close(m);
    CHECK(dp_tensorboard_close_check(tb, &err) == 0);
    dp_tensorboard_close(NULL);

    unsigned char *bytes;
    size_t n;
    int count = read_dir(sub, recs, MAX_RECS, &bytes, &n);
    CHECKF(count == 1 + 3 + 2 + 4 + 3 + 4 + 1, "%d records", count);
    if (count < 4) {
        free(bytes);
        return;
    }
    CHECK(strcmp(recs[1].tag, "val/accuracy") == 0 && recs[1].step == 2 &&
          recs[1].value == 0.75f && recs[1].wall == 1700000000.25);
    CHECK(strcmp(recs[2].tag, "loss") == 0 && recs[2].step == -3 && recs[2].value == -1.5e-7f);
    CHECK(strlen(recs[3].tag) == DP_TENSORBOARD_MAX_TAG && recs[3].step == (int64_t)1 << 40 &&
          recs[3].value == 3.0f);

    static const struct {
        const char *tag;
        int64_t step;
        float value;
    } want[] = {
        {"val/accuracy", 16, 0.625f}, {"val/loss", 16, 1.25f}, {"train/loss", 16, 2.5f},
        {"train/learning_rate", 16, 0.001f}, {"perf/samples_per_second", 16, 5000.0f},
        {"perf/step_ms_median", 16, 2.0f}, {"perf/step_ms_p90", 16, 3.0f},
        {"resource/cpu_percent", 0, 50.0f}, {"resource/rss_mib", 0, 3.0f},
        {"resource/net_tx_mbytes", 0, 2.0f}, {"resource/net_rx_mbytes", 0, 0.5f},
        {"test/accuracy", 32, 0.5f}, {"train/step_loss", 8, 0.75f},
        {"train/step_accuracy", 8, 0.5f},
    };
    for (size_t w = 0; w < sizeof want / sizeof want[0]; w++) {
        int64_t step[4];
        float v[4];
        int k = with_tag(recs, count, want[w].tag, step, v, 4);
        int hit = 0;
        for (int j = 0; j < k && j < 4; j++)
            hit += step[j] == want[w].step && v[j] == want[w].value;
        /* val/accuracy: also the direct scalar at step 2; epoch 2's null is skipped */
        int expect = strcmp(want[w].tag, "val/accuracy") == 0 ? 2 : 1;
        CHECKF(hit == 1 && k == expect, "%s: %d record(s) (expected %d), %d at step %lld with %g",
               want[w].tag, k, expect, hit, (long long)want[w].step, (double)want[w].value);
    }
    /* the events' wall time (the metrics line's "wall"; the e2e part compares) */
    for (int i = 4; i < count; i++)
        CHECKF(recs[i].wall > 1.6e9, "%s: wall time %.3f", recs[i].tag, recs[i].wall);

    /* A flipped byte anywhere in a record is caught: in its length, its data
     * or its data's CRC; a file cut short is torn. */
    char why[200];
    size_t at[] = {recs[1].data_at - 12, recs[1].data_at + 5,
                   recs[1].data_at + recs[1].data_len + 1, n - 1};
    for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
        bytes[at[k]] ^= 0x10;
        why[0] = '\0';
        CHECKF(read_records(bytes, n, recs, MAX_RECS, why, sizeof why) < 0,
               "flipping byte %zu went unnoticed", at[k]);
        CHECKF(strstr(why, "CRC"), "byte %zu: %s", at[k], why);
        bytes[at[k]] ^= 0x10;
    }
    CHECK(read_records(bytes, n - 2, recs, MAX_RECS, why, sizeof why) < 0 && strstr(why, "torn"));
    CHECK(read_records(bytes, n, recs, MAX_RECS, why, sizeof why) == count);

    /* protoc, a reader we did not write, decodes a scalar record. */
    if (system("command -v protoc >/dev/null 2>&1") != 0) {
        fprintf(stderr, "skipping the protoc check: protoc not found (apt-get install "
                        "protobuf-compiler)\n");
    } else {
        char payload[1400], out[4096];
        snprintf(payload, sizeof payload, "%s/record1.pb", dir);
        write_bytes(payload, bytes + recs[1].data_at, recs[1].data_len);
        char cmd[4000], dpath[1400];
        snprintf(dpath, sizeof dpath, "%s/decoded.txt", dir);
        snprintf(cmd, sizeof cmd, "protoc --decode_raw < '%s' > '%s'", payload, dpath);
        int rc = system(cmd);
        CHECKF(rc == 0, "%s: exit status %d", cmd, rc);
        size_t dl;
        char *d = slurp(dpath, &dl);
        REQUIRE(d);
        float f = 0.75f;
        uint32_t bits;
        memcpy(&bits, &f, 4);
        snprintf(out, sizeof out, "2: 0x%08x", bits);
        CHECKF(strstr(d, "1: \"val/accuracy\"") && strstr(d, out) && strstr(d, "\n2: 2\n") &&
                   strstr(d, "5 {"),
               "protoc --decode_raw gave:\n%s", d);
        free(d);
    }
    free(bytes);

    /* A path that is a file is refused, naming the flag and the path. */
    char file[1300];
    snprintf(file, sizeof file, "%s/plain", dir);
    write_bytes(file, "x", 1);
    CHECK(dp_tensorboard_open(&tb, file, NULL, &err) < 0 && strstr(err.msg, "--tensorboard") &&
          strstr(err.msg, file) && tb == NULL);
    CHECK(dp_tensorboard_open(&tb, dir, "../up", &err) < 0 && tb == NULL);
}

/* A write that fails (here: past RLIMIT_FSIZE, as on a full disk) is
 * reported once, later scalars are dropped, and close names the file. */
static void check_write_error(const char *dir)
{
    dp_err err;
    dp_tensorboard *tb = NULL;
    REQUIRE(dp_tensorboard_open(&tb, dir, "full", &err) == 0);
    struct rlimit old, lim;
    REQUIRE(getrlimit(RLIMIT_FSIZE, &old) == 0);
    lim = old;
    lim.rlim_cur = 300; /* the version record and a few scalars */
    signal(SIGXFSZ, SIG_IGN);
    REQUIRE(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    int ok = 0, failed = 0;
    for (int i = 0; i < 20; i++) {
        if (dp_tensorboard_scalar(tb, "train/loss", i, 1700000000.0, 1.0f) == 0)
            ok += !failed;
        else
            failed++;
    }
    char path[1400];
    snprintf(path, sizeof path, "%s", dp_tensorboard_path(tb));
    int rc = dp_tensorboard_close_check(tb, &err);
    REQUIRE(setrlimit(RLIMIT_FSIZE, &old) == 0);
    signal(SIGXFSZ, SIG_DFL);
    CHECKF(ok >= 1 && failed == 20 - ok, "%d scalars written, %d failed", ok, failed);
    CHECKF(rc < 0 && strstr(err.msg, "tensorboard file") && strstr(err.msg, path) &&
               strstr(err.msg, "incomplete"),
           "close after a failed write: %d %s", rc, rc < 0 ? err.msg : "");
}

/* ---- through the program ---- */

/* Up to 8 events' step, one field and wall time, for compare_tag. */
typedef struct tally {
    const char *field;
    int n;
    double step[8], value[8], wall[8];
} tally;

static void tally_event(const cJSON *j, void *ctx)
{
    tally *t = ctx;
    if (t->n < 8) {
        t->step[t->n] = json_num(j, "step");
        t->value[t->n] = json_num(j, t->field);
        t->wall[t->n] = json_num(j, "wall");
    }
    t->n++;
}

/* The tag's records in the events file match the metrics file's `event`
 * lines one for one: the same step, the value as a float, the wall time. */
static void compare_tag(const tb_rec *r, int count, const char *metrics, const char *event,
                        const char *field, const char *tag, int expect)
{
    tally t = {.field = field};
    for_each_event(metrics, event, NULL, tally_event, &t);
    CHECKF(t.n == expect, "%d %s events in %s, expected %d", t.n, event, metrics, expect);
    int k = 0;
    for (int i = 0; i < count; i++) {
        if (strcmp(r[i].tag, tag) != 0)
            continue;
        CHECKF(k < t.n && k < 8 && r[i].step == (int64_t)t.step[k] &&
                   r[i].value == (float)t.value[k] && r[i].wall == t.wall[k],
               "%s #%d: step %lld value %.9g wall %.3f; metrics: %s step %g %s %.9g wall %.3f",
               tag, k, (long long)r[i].step, (double)r[i].value, r[i].wall, event,
               k < 8 ? t.step[k] : -1, field, k < 8 ? t.value[k] : -1, k < 8 ? t.wall[k] : -1);
        k++;
    }
    CHECKF(k == t.n, "%d %s records, %d %s events", k, tag, t.n, event);
}

static void check_train(const char *bin, const char *tmp)
{
    char err[8192], dir[1200], metrics[1200];
    snprintf(dir, sizeof dir, "%s/tb", tmp);
    snprintf(metrics, sizeof metrics, "%s/train.jsonl", tmp);
    int rc = run_cmd(err, sizeof err,
                     "%s train --epochs 2 --train-size 2000 --val-size 500 --model 784-32-10 "
                     "--threads 1 --no-progress --quiet --log-every 10 --metrics %s "
                     "--tensorboard %s",
                     bin, metrics, dir);
    CHECKF(rc == 0, "train exited %d: %s", rc, err);
    if (rc != 0)
        return;
    unsigned char *bytes;
    size_t n;
    int count = read_dir(dir, recs, MAX_RECS, &bytes, &n);
    free(bytes);
    compare_tag(recs, count, metrics, "epoch", "val_accuracy", "val/accuracy", 2);
    compare_tag(recs, count, metrics, "epoch", "train_loss", "train/loss", 2);
    compare_tag(recs, count, metrics, "epoch", "lr", "train/learning_rate", 2);
    compare_tag(recs, count, metrics, "steps", "samples_per_second", "perf/samples_per_second", 2);
    compare_tag(recs, count, metrics, "steps", "step_ms_p90", "perf/step_ms_p90", 2);
    /* --log-every 10 over 30-odd steps: three windows, kept under --quiet */
    compare_tag(recs, count, metrics, "train", "train_loss", "train/step_loss", 3);
    compare_tag(recs, count, metrics, "train", "train_accuracy", "train/step_accuracy", 3);
    int64_t steps[4];
    float vals[4];
    cJSON *last = last_event(metrics, "epoch", NULL);
    REQUIRE(last);
    CHECK(with_tag(recs, count, "test/accuracy", steps, vals, 4) == 1 &&
          steps[0] == (int64_t)json_num(last, "step") && vals[0] == (float)done_accuracy(metrics));
    cJSON_Delete(last);
    /* the sampler's last sample comes at its stop, however short the run */
    CHECK(with_tag(recs, count, "resource/rss_mib", steps, vals, 4) >= 1 && vals[0] > 1);

    /* A file where the directory should be: exit 2 before training. */
    rc = run_cmd(err, sizeof err, "%s train --epochs 1 --train-size 500 --tensorboard %s", bin,
                 metrics);
    CHECKF(rc == 2 && strstr(err, "--tensorboard") && strstr(err, metrics),
           "--tensorboard FILE: exit %d: %s", rc, err);
    rc = run_cmd(NULL, 0, "%s train --help | grep -q -- '--tensorboard DIR'", bin);
    CHECK(rc == 0);
}

/* A launched cluster: one directory per task, the evaluator's with val/accuracy. */
static void check_cluster(const char *bin, const char *tmp)
{
    char err[8192], dir[1200], sub[1300];
    snprintf(dir, sizeof dir, "%s/tbc", tmp);
    int rc = run_cmd(err, sizeof err,
                     "%s launch --chief --workers 2 --ps 1 -- train --strategy ps-async "
                     "--epochs 1 --train-size 1000 --val-size 200 --model 784-32-10 --threads 1 "
                     "--no-progress --quiet --tensorboard %s",
                     bin, dir);
    CHECKF(rc == 0, "launch exited %d: %s", rc, err);
    if (rc != 0)
        return;
    const char *tasks[] = {"chief-0", "worker-0", "worker-1", "ps-0"};
    for (int t = 0; t < 4; t++) {
        snprintf(sub, sizeof sub, "%s/%s", dir, tasks[t]);
        unsigned char *bytes;
        size_t n;
        int count = read_dir(sub, recs, MAX_RECS, &bytes, &n);
        free(bytes);
        int64_t steps[4];
        float vals[4];
        CHECKF(with_tag(recs, count, "resource/cpu_percent", steps, vals, 4) >= 1,
               "%s: no resource scalars", tasks[t]);
        if (strncmp(tasks[t], "worker", 6) == 0)
            CHECKF(with_tag(recs, count, "perf/samples_per_second", steps, vals, 4) == 1 &&
                       vals[0] > 0,
                   "%s: no samples/s of its one epoch", tasks[t]);
        int evals = with_tag(recs, count, "val/accuracy", steps, vals, 4);
        CHECKF(evals == (t == 0), "%s: %d val/accuracy records", tasks[t], evals);
    }
    CHECK(events_file(dir, sub, sizeof sub) == 0); /* nothing in DIR itself */
}

int main(void)
{
    const char *bin = test_bin(), *tmp = test_tmp();
    char dir[1200];
    scratch_make(dir, sizeof dir, "test_tensorboard");
    check_writer(dir);
    check_write_error(dir);
    if (!check_failures)
        scratch_remove(dir);

    char probe[1200];
    if (!bin || !tmp || !have_mnist(probe, sizeof probe)) {
        fprintf(stderr, "skipping the runs of downpour: no DOWNPOUR_BIN, DOWNPOUR_TEST_TMP or "
                        "MNIST (%s)\n", probe);
        return CHECK_DONE();
    }
    check_train(bin, tmp);
    check_cluster(bin, tmp);
    return CHECK_DONE();
}
