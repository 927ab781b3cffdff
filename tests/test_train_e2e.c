/* End to end through the downpour program: one epoch of mlp-300-100 on MNIST
 * reaches 0.95 validation accuracy; the same seed on one thread gives
 * bitwise identical weights twice; eval agrees with train; bad command lines
 * are refused with messages naming the culprit. */
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "check.h"

static const char *bin, *tmp;

/* Runs a shell command; returns its exit status and leaves its stderr in
 * tmp/stderr.txt (read into buf). */
static int run(char *out, size_t out_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int run(char *out, size_t out_len, const char *fmt, ...)
{
    char cmd[4096], full[4400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(full, sizeof full, "%s 2>%s/stderr.txt >%s/stdout.txt", cmd, tmp, tmp);
    int st = system(full);
    if (out) {
        char path[1100];
        snprintf(path, sizeof path, "%s/stderr.txt", tmp);
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(out, 1, out_len - 1, f) : 0;
        out[n] = '\0';
        if (f)
            fclose(f);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        *len = (size_t)n;
    }
    return buf;
}

/* Finds the last metrics line with the given event. */
static cJSON *last_event(const char *path, const char *event)
{
    size_t len;
    char *text = slurp(path, &len);
    if (!text)
        return NULL;
    cJSON *found = NULL;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        CHECKF(j != NULL, "metrics line is not JSON: %s", line);
        if (!j)
            continue;
        CHECK(cJSON_IsNumber(cJSON_GetObjectItem(j, "t")));
        cJSON *e = cJSON_GetObjectItem(j, "event");
        if (cJSON_IsString(e) && strcmp(e->valuestring, event) == 0) {
            cJSON_Delete(found);
            found = j;
        } else {
            cJSON_Delete(j);
        }
    }
    free(text);
    return found;
}

static double num(const cJSON *j, const char *key)
{
    const cJSON *v = cJSON_GetObjectItem(j, key);
    CHECKF(cJSON_IsNumber(v), "metrics field '%s' missing", key);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

int main(void)
{
    bin = getenv("DOWNPOUR_BIN");
    tmp = getenv("DOWNPOUR_TEST_TMP");
    const char *data = getenv("DOWNPOUR_DATA");
    REQUIRE(bin && tmp);
    char probe[1200];
    snprintf(probe, sizeof probe, "%s/mnist/train-images-idx3-ubyte", data ? data : "data");
    struct stat sb;
    if (stat(probe, &sb) != 0) {
        fprintf(stderr, "skipping: MNIST not found at %s (run scripts/fetch-data.sh)\n", probe);
        return 77;
    }
    char err[8192];

    /* One epoch, one thread, twice. */
    for (int i = 0; i < 2; i++) {
        int rc = run(err, sizeof err,
                     "%s train --dataset mnist --model mlp-300-100 --batch 128 --epochs 1 --threads 1 "
                     "--log-every 100 --no-progress --metrics %s/e2e%d.jsonl --save %s/e2e%d.safetensors",
                     bin, tmp, i, tmp, i);
        CHECKF(rc == 0, "train exited %d: %s", rc, err);
        CHECKF(strstr(err, "Worker 0, At step 400, Cost: ") != NULL, "no step line in: %s", err);
    }
    char path[1200];
    snprintf(path, sizeof path, "%s/e2e0.jsonl", tmp);
    cJSON *epoch = last_event(path, "epoch");
    cJSON *done = last_event(path, "done");
    REQUIRE(epoch && done);
    double val = num(epoch, "val_accuracy");
    CHECKF(val >= 0.95, "validation accuracy after one epoch is %.4f, expected >= 0.95", val);
    CHECK(num(epoch, "epoch") == 1);
    CHECK(num(epoch, "train_loss") > 0 && num(epoch, "seconds") > 0);
    double test_acc = num(done, "test_accuracy");
    CHECK(test_acc >= 0.95);
    CHECK(num(done, "train_seconds") > 0 && num(done, "samples_per_second") > 0);
    CHECK(num(done, "batch") == 128 && num(done, "epochs") == 1);
    CHECK(strcmp(cJSON_GetObjectItem(done, "strategy")->valuestring, "single") == 0);
    CHECK(strcmp(cJSON_GetObjectItem(done, "model")->valuestring, "mlp-300-100") == 0);

    size_t la, lb;
    char pa[1200], pb[1200];
    snprintf(pa, sizeof pa, "%s/e2e0.safetensors", tmp);
    snprintf(pb, sizeof pb, "%s/e2e1.safetensors", tmp);
    char *a = slurp(pa, &la), *b = slurp(pb, &lb);
    REQUIRE(a && b);
    CHECKF(la == lb && memcmp(a, b, la) == 0, "two runs with the same seed differ (%zu vs %zu bytes)", la, lb);
    CHECK(la > 266610 * 4);
    free(a);
    free(b);

    /* eval agrees with train's own test accuracy. */
    int rc = run(err, sizeof err, "%s eval --checkpoint %s --dataset mnist --metrics %s/eval.jsonl", bin, pa, tmp);
    CHECKF(rc == 0, "eval exited %d: %s", rc, err);
    snprintf(path, sizeof path, "%s/eval.jsonl", tmp);
    cJSON *ev = last_event(path, "done");
    REQUIRE(ev);
    CHECK_NEAR(num(ev, "test_accuracy"), test_acc, 1e-9);
    cJSON_Delete(ev);
    cJSON_Delete(epoch);
    cJSON_Delete(done);

    /* Bad command lines. */
    CHECK(run(err, sizeof err, "%s train --bogus 3", bin) == 2 && strstr(err, "--bogus"));
    CHECK(run(err, sizeof err, "%s train --batch 12x", bin) == 2 && strstr(err, "--batch"));
    CHECK(run(err, sizeof err, "%s train --batch 0", bin) == 2 && strstr(err, "--batch"));
    CHECK(run(err, sizeof err, "%s train --optimizer adamw", bin) == 2 && strstr(err, "adamw"));
    CHECK(run(err, sizeof err, "%s train --model 784-0-10 --epochs 1", bin) == 1 && strstr(err, "784-0-10"));
    CHECK(run(err, sizeof err, "%s train --dataset %s/nowhere --epochs 1", bin, tmp) == 1 &&
          strstr(err, "nowhere"));
    CHECK(run(err, sizeof err, "%s eval", bin) == 2 && strstr(err, "--checkpoint"));
    CHECK(run(NULL, 0, "%s train --help", bin) == 0);
    CHECK(run(NULL, 0, "%s --help", bin) == 0);
    CHECK(run(err, sizeof err, "%s frobnicate", bin) == 2 && strstr(err, "frobnicate"));

    /* A corrupt checkpoint is refused with its name. */
    snprintf(path, sizeof path, "%s/corrupt.safetensors", tmp);
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    fwrite("\x10\0\0\0\0\0\0\0{\"a\":", 1, 13, f);
    fclose(f);
    CHECK(run(err, sizeof err, "%s eval --checkpoint %s", bin, path) == 1 &&
          strstr(err, "corrupt.safetensors"));
    return CHECK_DONE();
}
