/* TensorBoard event files (tensorboard.h, docs/tensorboard.md): TFRecord
 * framing, the few protobuf fields of a scalar Event written by explicit
 * varint and fixed-width helpers, and the mapping of metrics events to
 * scalars.  Write errors are sticky and reported at close, as for the metrics
 * file (docs/metrics.md). */
#include "downpour/tensorboard.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "downpour/crc32c.h"
#include "downpour/file.h"
#include "downpour/log.h"
#include "downpour/varint.h"

/* Protobuf wire types and the keys (field << 3 | type) of event.proto. */
enum { WT_VARINT = 0, WT_FIXED64 = 1, WT_LEN = 2, WT_FIXED32 = 5 };
#define KEY(field, type) ((uint8_t)((field) << 3 | (type)))
#define EVENT_WALL_TIME KEY(1, WT_FIXED64)
#define EVENT_STEP KEY(2, WT_VARINT)
#define EVENT_FILE_VERSION KEY(3, WT_LEN)
#define EVENT_SUMMARY KEY(5, WT_LEN)
#define SUMMARY_VALUE KEY(1, WT_LEN)
#define VALUE_TAG KEY(1, WT_LEN)
#define VALUE_SIMPLE KEY(2, WT_FIXED32)

#define RECORD_HEAD 12 /* length + its CRC */
#define RECORD_TAIL 4  /* the data's CRC */
/* An Event with one scalar: wall time 9, step <= 11, then a key and a
 * length of at most 3 for each of summary, value and tag, the tag's bytes
 * and simple_value 5. */
#define RECORD_MAX (RECORD_HEAD + 9 + 11 + 3 * 3 + DP_TENSORBOARD_MAX_TAG + 5 + RECORD_TAIL)

struct dp_tensorboard {
    int fd;
    int failed; /* errno of the first failed write, 0: none (under mu) */
    int64_t last_step; /* the largest step of an epoch or steps event, -1: none */
    pthread_mutex_t mu;
    char *path;
};

uint32_t dp_tensorboard_mask_crc(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/* ---- byte writers: each returns the bytes written at p ---- */

static size_t put_u32le(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
    return 4;
}

static size_t put_u64le(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
    return 8;
}

static size_t put_double(uint8_t *p, double d)
{
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    return put_u64le(p, bits);
}

static size_t put_float(uint8_t *p, float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return put_u32le(p, bits);
}

static size_t put_bytes(uint8_t *p, uint8_t key, const void *s, size_t len)
{
    size_t n = 0;
    p[n++] = key;
    n += dp_put_varint(p + n, len);
    memcpy(p + n, s, len);
    return n + len;
}

/* Frames the `len` bytes of data already at buf + RECORD_HEAD; returns the
 * record's size. */
static size_t frame(uint8_t *buf, size_t len)
{
    put_u64le(buf, len);
    put_u32le(buf + 8, dp_tensorboard_mask_crc(dp_crc32c(0, buf, 8)));
    put_u32le(buf + RECORD_HEAD + len,
              dp_tensorboard_mask_crc(dp_crc32c(0, buf + RECORD_HEAD, len)));
    return RECORD_HEAD + len + RECORD_TAIL;
}

/* Call with mu held. */
static int write_record(dp_tensorboard *tb, const uint8_t *rec, size_t n)
{
    if (tb->failed)
        return -1; /* already reported: one warning, not one per record */
    if (dp_write_all(tb->fd, rec, n, NULL) == 0)
        return 0;
    tb->failed = errno ? errno : EIO;
    dp_warn("tensorboard file %s: write failed: %s; later scalars are dropped and the command "
            "will exit with an error", tb->path, strerror(tb->failed));
    return -1;
}

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Creates dir/events.out.tfevents.<secs>.<host>.<pid>[.<n>]; returns the fd. */
static int create_file(const char *dir, char **path, dp_err *err)
{
    char host[256];
    if (gethostname(host, sizeof host) < 0)
        snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    for (char *c = host; *c; c++)
        if (*c == '/')
            *c = '_';
    long long secs = (long long)time(NULL);
    for (int n = 0; n < 100; n++) {
        char suffix[16] = "";
        if (n > 0)
            snprintf(suffix, sizeof suffix, ".%d", n);
        size_t cap = strlen(dir) + strlen(host) + 96;
        char *p = malloc(cap);
        if (!p)
            return dp_errf(err, "--tensorboard %s: out of memory", dir);
        snprintf(p, cap, "%s/events.out.tfevents.%010lld.%s.%ld%s", dir, secs, host,
                 (long)getpid(), suffix);
        int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0) {
            *path = p;
            return fd;
        }
        int e = errno;
        if (e != EEXIST) {
            dp_errf(err, "cannot create tensorboard file %s: %s", p, strerror(e));
            free(p);
            return -1;
        }
        free(p);
    }
    return dp_errf(err, "--tensorboard %s: cannot find a free events file name", dir);
}

int dp_tensorboard_open(dp_tensorboard **out, const char *dir, const char *run, dp_err *err)
{
    if (!out)
        return dp_errf(err, "tensorboard: no output handle");
    *out = NULL;
    if (!dir || !*dir)
        return dp_errf(err, "--tensorboard: empty path");
    if (dp_dir_prepare(dir, "--tensorboard", err) < 0)
        return -1;
    char *sub = NULL;
    if (run) {
        if (!*run || strchr(run, '/') || strcmp(run, ".") == 0 || strcmp(run, "..") == 0)
            return dp_errf(err, "--tensorboard %s: bad run name '%s'", dir, run);
        size_t cap = strlen(dir) + strlen(run) + 2;
        if (!(sub = malloc(cap)))
            return dp_errf(err, "--tensorboard %s: out of memory", dir);
        snprintf(sub, cap, "%s/%s", dir, run);
        if (dp_dir_prepare(sub, "--tensorboard", err) < 0) {
            free(sub);
            return -1;
        }
    }
    dp_tensorboard *tb = calloc(1, sizeof *tb);
    if (!tb) {
        free(sub);
        return dp_errf(err, "--tensorboard %s: out of memory", dir);
    }
    tb->last_step = -1;
    tb->fd = create_file(sub ? sub : dir, &tb->path, err);
    free(sub);
    if (tb->fd < 0) {
        free(tb);
        return -1;
    }
    pthread_mutex_init(&tb->mu, NULL);

    uint8_t rec[64];
    size_t n = RECORD_HEAD;
    rec[n++] = EVENT_WALL_TIME;
    n += put_double(rec + n, wall_now());
    n += put_bytes(rec + n, EVENT_FILE_VERSION, "brain.Event:2", 13);
    n = frame(rec, n - RECORD_HEAD);
    if (write_record(tb, rec, n) < 0) {
        dp_errf(err, "tensorboard file %s: write failed: %s", tb->path, strerror(tb->failed));
        dp_tensorboard_close(tb);
        return -1;
    }
    *out = tb;
    return 0;
}

const char *dp_tensorboard_path(const dp_tensorboard *tb)
{
    return tb ? tb->path : NULL;
}

/* Call with mu held. */
static int scalar_locked(dp_tensorboard *tb, const char *tag, int64_t step, double wall,
                         float value)
{
    size_t tag_len = tag ? strlen(tag) : 0;
    if (tag_len == 0 || tag_len > DP_TENSORBOARD_MAX_TAG)
        return -1;
    uint8_t rec[RECORD_MAX];
    /* Value, then Summary around it, then Event: the lengths are known
     * before the bytes, as each message is small. */
    size_t value_len = 1 + (tag_len < 128 ? 1 : 2) + tag_len + 1 + 4;
    size_t summary_len = 1 + (value_len < 128 ? 1 : 2) + value_len;
    size_t n = RECORD_HEAD;
    rec[n++] = EVENT_WALL_TIME;
    n += put_double(rec + n, wall);
    rec[n++] = EVENT_STEP;
    n += dp_put_varint(rec + n, (uint64_t)step); /* int64: two's complement, as protobuf does */
    rec[n++] = EVENT_SUMMARY;
    n += dp_put_varint(rec + n, summary_len);
    rec[n++] = SUMMARY_VALUE;
    n += dp_put_varint(rec + n, value_len);
    n += put_bytes(rec + n, VALUE_TAG, tag, tag_len);
    rec[n++] = VALUE_SIMPLE;
    n += put_float(rec + n, value);
    return write_record(tb, rec, frame(rec, n - RECORD_HEAD));
}

int dp_tensorboard_scalar(dp_tensorboard *tb, const char *tag, int64_t step, double wall_time,
                          float value)
{
    if (!tb)
        return -1;
    pthread_mutex_lock(&tb->mu);
    int rc = scalar_locked(tb, tag, step, wall_time, value);
    pthread_mutex_unlock(&tb->mu);
    return rc;
}

/* ---- metrics events as scalars ---- */

typedef struct field_tag {
    const char *field; /* the metrics field */
    const char *tag;   /* its TensorBoard tag */
    double scale;      /* the value is multiplied by this */
} field_tag;

static const field_tag EPOCH_TAGS[] = {
    {"val_accuracy", "val/accuracy", 1},
    {"val_loss", "val/loss", 1},
    {"train_loss", "train/loss", 1},
    {"lr", "train/learning_rate", 1},
    {"val_auc", "val/auc", 1}, /* a bce model's (docs/metrics.md) */
    {"val_log_loss", "val/log_loss", 1},
};
static const field_tag TRAIN_TAGS[] = { /* every --log-every steps */
    {"train_loss", "train/step_loss", 1},
    {"train_accuracy", "train/step_accuracy", 1},
};
static const field_tag STEPS_TAGS[] = {
    {"samples_per_second", "perf/samples_per_second", 1},
    {"step_ms_median", "perf/step_ms_median", 1},
    {"step_ms_p90", "perf/step_ms_p90", 1},
};
static const field_tag RESOURCE_TAGS[] = {
    {"cpu_percent", "resource/cpu_percent", 1},
    {"rss_bytes", "resource/rss_mib", 1.0 / (1 << 20)},
    {"net_tx_bytes", "resource/net_tx_mbytes", 1e-6},
    {"net_rx_bytes", "resource/net_rx_mbytes", 1e-6},
};
static const field_tag DONE_TAGS[] = {
    {"test_accuracy", "test/accuracy", 1},
    {"test_auc", "test/auc", 1},
    {"test_log_loss", "test/log_loss", 1},
};

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

static int number(const cJSON *o, const char *key, double *v)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble))
        return 0;
    *v = j->valuedouble;
    return 1;
}

int dp_tensorboard_metrics_event(dp_tensorboard *tb, const char *json, size_t len)
{
    if (!tb || !json)
        return 0;
    cJSON *o = cJSON_ParseWithLength(json, len);
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(o, "event");
    if (!cJSON_IsString(ev)) {
        cJSON_Delete(o);
        return 0;
    }
    const char *name = ev->valuestring;
    const field_tag *tags = NULL;
    int n_tags = 0, training_step = 0;
    if (strcmp(name, "epoch") == 0)
        tags = EPOCH_TAGS, n_tags = N_OF(EPOCH_TAGS), training_step = 1;
    else if (strcmp(name, "train") == 0)
        tags = TRAIN_TAGS, n_tags = N_OF(TRAIN_TAGS), training_step = 1;
    else if (strcmp(name, "steps") == 0)
        tags = STEPS_TAGS, n_tags = N_OF(STEPS_TAGS), training_step = 1;
    else if (strcmp(name, "resource") == 0)
        tags = RESOURCE_TAGS, n_tags = N_OF(RESOURCE_TAGS);
    else if (strcmp(name, "done") == 0)
        tags = DONE_TAGS, n_tags = N_OF(DONE_TAGS);
    double wall, d;
    if (!number(o, "wall", &wall))
        wall = wall_now();
    int written = 0;
    pthread_mutex_lock(&tb->mu);
    int64_t step = -1;
    if (training_step) {
        if (number(o, "step", &d))
            step = (int64_t)d;
        if (step > tb->last_step)
            tb->last_step = step;
    } else if (strcmp(name, "resource") == 0) {
        step = number(o, "t", &d) && d >= 0 ? (int64_t)floor(d) : -1; /* whole seconds */
    } else {
        step = tb->last_step >= 0 ? tb->last_step : 0;
    }
    for (int i = 0; step >= 0 && i < n_tags && written >= 0; i++) {
        double v;
        if (!number(o, tags[i].field, &v))
            continue;
        if (scalar_locked(tb, tags[i].tag, step, wall, (float)(v * tags[i].scale)) < 0)
            written = -1;
        else
            written++;
    }
    pthread_mutex_unlock(&tb->mu);
    cJSON_Delete(o);
    return written;
}

int dp_tensorboard_close_check(dp_tensorboard *tb, dp_err *err)
{
    if (!tb)
        return 0;
    /* As for the metrics file: a lost write may show only at fsync or close. */
    if (!tb->failed && fsync(tb->fd) < 0 && errno != EINVAL && errno != ENOTSUP &&
        errno != EROFS)
        tb->failed = errno;
    if (close(tb->fd) < 0 && errno != EINTR && !tb->failed)
        tb->failed = errno;
    int rc = 0;
    if (tb->failed)
        rc = dp_errf(err, "tensorboard file %s: write failed: %s (the file is incomplete)",
                     tb->path, strerror(tb->failed));
    pthread_mutex_destroy(&tb->mu);
    free(tb->path);
    free(tb);
    return rc;
}

void dp_tensorboard_close(dp_tensorboard *tb)
{
    dp_tensorboard_close_check(tb, NULL);
}
