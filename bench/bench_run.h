/* What the benchmarks that run the downpour program share: their options,
 * a scratch directory, and one run whose metrics file is read back event by
 * event.  Needs cJSON (the metrics are JSON lines: docs/metrics.md). */
#ifndef DOWNPOUR_BENCH_RUN_H
#define DOWNPOUR_BENCH_RUN_H

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* `--bin PATH --model SPEC --batch N --train-size N --epochs N --repeats N`;
 * bin defaults to $DOWNPOUR_BIN, else ../downpour beside the build's bench/. */
typedef struct bench_run_opts {
    const char *bin, *model;
    long batch, train, epochs;
    int repeats;
} bench_run_opts;

static inline void bench_run_args(int argc, char **argv, bench_run_opts *o)
{
    o->bin = getenv("DOWNPOUR_BIN");
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--bin") == 0)
            o->bin = argv[i + 1];
        else if (strcmp(argv[i], "--model") == 0)
            o->model = argv[i + 1];
        else if (strcmp(argv[i], "--batch") == 0)
            o->batch = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--train-size") == 0)
            o->train = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--epochs") == 0)
            o->epochs = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--repeats") == 0)
            o->repeats = atoi(argv[i + 1]);
    }
    if (!o->bin)
        o->bin = "../downpour";
}

/* A fresh directory /tmp/PROG.XXXXXX (mkdtemp fills in the X's) for the
 * runs' metrics and error output; 0, or -1 after saying why. */
static inline int bench_scratch(const char *prog, char *dir, size_t cap)
{
    snprintf(dir, cap, "/tmp/%s.XXXXXX", prog);
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return -1;
    }
    return 0;
}

/* Runs cmd with `--metrics DIR/run.jsonl`, its stderr kept in
 * DIR/stderr.txt, then hands each event of the file to fn(j, name, ctx).
 * 0, or -1 when the command failed or wrote no metrics. */
typedef void (*bench_event_fn)(const cJSON *j, const char *event, void *ctx);

static inline int bench_run_metrics(const char *dir, const char *cmd, bench_event_fn fn, void *ctx)
{
    char full[4096], path[512];
    snprintf(path, sizeof path, "%s/run.jsonl", dir);
    snprintf(full, sizeof full, "rm -f %s; %s --metrics %s >/dev/null 2>%s/stderr.txt", path, cmd,
             path, dir);
    int st = system(full);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "failed: %s (see %s/stderr.txt)\n", cmd, dir);
        return -1;
    }
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[8192];
    while (fgets(line, sizeof line, f)) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *ev = j ? cJSON_GetObjectItem(j, "event") : NULL;
        if (ev && cJSON_IsString(ev))
            fn(j, ev->valuestring, ctx);
        cJSON_Delete(j);
    }
    fclose(f);
    return 0;
}

#endif
