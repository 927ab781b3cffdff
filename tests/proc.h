/* Helpers for tests that run the downpour program: run a shell command and
 * keep its stderr, read a file whole, and find metrics events. */
#ifndef DOWNPOUR_TEST_PROC_H
#define DOWNPOUR_TEST_PROC_H

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "downpour/safetensors.h"

/* The program under test and a scratch directory, from CTest's environment.
 * The directory is emptied on first use, so no file of an earlier run can
 * stand in for one this run failed to write. */
static inline const char *test_bin(void) { return getenv("DOWNPOUR_BIN"); }
static inline const char *test_tmp(void)
{
    static int cleaned;
    const char *dir = getenv("DOWNPOUR_TEST_TMP");
    if (dir && !cleaned) {
        char cmd[1200];
        cleaned = 1;
        snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
        if (system(cmd) != 0)
            fprintf(stderr, "cannot empty %s\n", dir);
    }
    return dir;
}

/* Runs a shell command with stdout and stderr kept in files under the scratch
 * directory; returns the exit status (-1 if killed) and copies stderr into out. */
static inline int run_cmd(char *out, size_t out_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline int run_cmd(char *out, size_t out_len, const char *fmt, ...)
{
    char cmd[8192], full[8600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(full, sizeof full, "{ %s\n} 2>%s/stderr.txt >%s/stdout.txt", cmd, test_tmp(), test_tmp());
    int st = system(full);
    if (out) {
        char path[1100];
        snprintf(path, sizeof path, "%s/stderr.txt", test_tmp());
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(out, 1, out_len - 1, f) : 0;
        out[n] = '\0';
        if (f)
            fclose(f);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A script of scripts/ (name: "netns.sh") beside this source tree, unless
 * the environment variable env names one. */
static inline void test_script(char *out, size_t cap, const char *env, const char *name)
{
    const char *e = getenv(env);
    if (e && *e) {
        snprintf(out, cap, "%s", e);
        return;
    }
    snprintf(out, cap, "%s", __FILE__); /* tests/proc.h */
    char *slash = strrchr(out, '/');
    if (slash)
        *slash = '\0';
    else
        snprintf(out, cap, ".");
    size_t n = strlen(out);
    snprintf(out + n, cap - n, "/../scripts/%s", name);
}

static inline char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        if (len)
            *len = (size_t)n;
    }
    return buf;
}

/* Calls fn on every metrics line with the given event (and task, if not NULL). */
static inline int for_each_event(const char *path, const char *event, const char *task,
                                 void (*fn)(const cJSON *j, void *ctx), void *ctx)
{
    size_t len;
    char *text = slurp(path, &len);
    if (!text)
        return -1;
    int count = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(line);
        CHECKF(j != NULL, "metrics line is not JSON: %s", line);
        if (!j)
            continue;
        const cJSON *e = cJSON_GetObjectItem(j, "event"), *t = cJSON_GetObjectItem(j, "task");
        if (cJSON_IsString(e) && strcmp(e->valuestring, event) == 0 &&
            (!task || (cJSON_IsString(t) && strcmp(t->valuestring, task) == 0))) {
            count++;
            if (fn)
                fn(j, ctx);
        }
        cJSON_Delete(j);
    }
    free(text);
    return count;
}

static inline void keep_last(const cJSON *j, void *ctx)
{
    cJSON **last = ctx;
    cJSON_Delete(*last);
    *last = cJSON_Duplicate(j, 1);
}

/* The last line with this event (and task), or NULL; free with cJSON_Delete. */
static inline cJSON *last_event(const char *path, const char *event, const char *task)
{
    cJSON *last = NULL;
    for_each_event(path, event, task, keep_last, &last);
    return last;
}

static inline double json_num(const cJSON *j, const char *key);

/* The test accuracy of the run whose metrics are at path: its last "done"
 * event's, or -1 when there is none. */
static inline double done_accuracy(const char *path)
{
    cJSON *done = last_event(path, "done", NULL);
    double acc = done ? json_num(done, "test_accuracy") : -1;
    cJSON_Delete(done);
    return acc;
}

static inline double json_num(const cJSON *j, const char *key)
{
    const cJSON *v = cJSON_GetObjectItem(j, key);
    CHECKF(cJSON_IsNumber(v), "metrics field '%s' missing", key);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

static inline const char *json_str(const cJSON *j, const char *key)
{
    const cJSON *v = cJSON_GetObjectItem(j, key);
    CHECKF(cJSON_IsString(v), "metrics field '%s' missing", key);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* for_each_event callback over "replica" events: v[0] counts them, v[1]
 * keeps the first params_crc32c, v[2] becomes 1 if any other differs. */
static inline void tally_replica(const cJSON *j, void *ctx)
{
    long *v = ctx;
    long crc = (long)json_num(j, "params_crc32c");
    if (v[0] == 0)
        v[1] = crc;
    else if (crc != v[1])
        v[2] = 1;
    v[0]++;
}

/* Largest |a - b| over every layers.* tensor of two checkpoints in the
 * scratch directory (INFINITY if either cannot be read). */
static inline double checkpoint_max_diff(const char *a_name, const char *b_name)
{
    char pa[1200], pb[1200];
    snprintf(pa, sizeof pa, "%s/%s", test_tmp(), a_name);
    snprintf(pb, sizeof pb, "%s/%s", test_tmp(), b_name);
    dp_safetensors *a = NULL, *b = NULL;
    dp_err e;
    double worst = INFINITY;
    int tensors = 0;
    if (dp_safetensors_load(pa, &a, &e) == 0 && dp_safetensors_load(pb, &b, &e) == 0) {
        worst = 0;
        for (int i = 0; i < dp_safetensors_count(a); i++) {
            const dp_st_tensor *ta = dp_safetensors_at(a, i), *tb;
            if (strncmp(ta->name, "layers.", 7) != 0)
                continue;
            tb = dp_safetensors_find(b, ta->name);
            CHECKF(tb != NULL && tb->ndim == ta->ndim, "%s has no tensor %s like %s's", b_name,
                   ta->name, a_name);
            if (!tb || tb->ndim != ta->ndim)
                continue;
            tensors++;
            size_t n = 1;
            for (int d = 0; d < ta->ndim; d++)
                n *= (size_t)ta->shape[d];
            for (size_t k = 0; k < n; k++)
                worst = fmax(worst, fabs((double)ta->data[k] - (double)tb->data[k]));
        }
        CHECKF(tensors > 0, "%s has no layers.* tensor", a_name);
    } else {
        CHECKF(0, "%s", e.msg);
    }
    dp_safetensors_free(a);
    dp_safetensors_free(b);
    return worst;
}

/* Whether two files of the scratch directory hold the same bytes. */
static inline int same_file(const char *a_name, const char *b_name)
{
    char pa[1200], pb[1200];
    size_t la = 0, lb = 0;
    snprintf(pa, sizeof pa, "%s/%s", test_tmp(), a_name);
    snprintf(pb, sizeof pb, "%s/%s", test_tmp(), b_name);
    char *x = slurp(pa, &la), *y = slurp(pb, &lb);
    int same = x && y && la == lb && memcmp(x, y, la) == 0;
    free(x);
    free(y);
    return same;
}

/* Whether MNIST's training images are under DOWNPOUR_DATA, the IDX file
 * plain or gzipped (the dataset reader takes both); probe gets the path
 * looked at. */
static inline bool have_mnist(char *probe, size_t len)
{
    const char *data = getenv("DOWNPOUR_DATA");
    snprintf(probe, len, "%s/mnist/train-images-idx3-ubyte.gz", data ? data : "data");
    if (access(probe, R_OK) == 0)
        return true;
    probe[strlen(probe) - 3] = '\0';
    return access(probe, R_OK) == 0;
}

/* Skips the test (CTest's code 77) when MNIST is not there. */
static inline void require_mnist(void)
{
    char probe[1200];
    if (!have_mnist(probe, sizeof probe)) {
        fprintf(stderr, "skipping: MNIST not found at %s(.gz) (run scripts/fetch-data.sh)\n",
                probe);
        exit(77);
    }
}

#endif
