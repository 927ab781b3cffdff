/* Sandblaster L-BFGS on MNIST mlp-300-100 (docs/benchmarks.md, "L-BFGS"):
 *   1. time to 0.97 validation accuracy: full-batch lbfgs (a chief, W
 *      workers, 2 ps; portions of 2,000) beside `single` with Adam (batch
 *      128), from the metrics' epoch events (wall-clock since the start);
 *   2. backup tasks: the mean time of an evaluation (one pass of the batch)
 *      with worker 1 slowed 10x (it sleeps 9 portion-times after each
 *      portion, the portion time measured in the plain run), against the
 *      plain run: the target is at most 1.5x.
 * Runs the downpour program through `launch`.
 *
 *   bench_lbfgs [--bin PATH] [--workers W] [--iterations N] [--epochs-adam N]
 *   PATH defaults to $DOWNPOUR_BIN, else ../downpour beside this program's
 *   build directory; DOWNPOUR_DATA must name the data directory. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "bench_run.h"

static char tmpdir[256];

/* The first epoch event at or above `target` (its t, or -1), the test
 * accuracy and the last lbfgs_done's eval_seconds. */
static void read_metrics(const char *path, double target, double *t_target, double *test,
                         double *eval_s)
{
    *t_target = *test = *eval_s = -1;
    FILE *f = fopen(path, "r");
    char line[8192];
    while (f && fgets(line, sizeof line, f)) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *ev = cJSON_GetObjectItem(j, "event");
        if (cJSON_IsString(ev)) {
            if (strcmp(ev->valuestring, "epoch") == 0 && *t_target < 0 &&
                cJSON_GetObjectItem(j, "val_accuracy")->valuedouble >= target)
                *t_target = cJSON_GetObjectItem(j, "t")->valuedouble;
            else if (strcmp(ev->valuestring, "done") == 0)
                *test = cJSON_GetObjectItem(j, "test_accuracy")->valuedouble;
            else if (strcmp(ev->valuestring, "lbfgs_done") == 0)
                *eval_s = cJSON_GetObjectItem(j, "eval_seconds")->valuedouble;
        }
        cJSON_Delete(j);
    }
    if (f)
        fclose(f);
}

static int run(const char *bin, const char *launch, const char *args, const char *name)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s%s train %s --metrics %s/%s.jsonl > %s/%s.log 2>&1", bin,
             launch, *launch ? " --" : "", args, tmpdir, name, tmpdir, name);
    int rc = system(cmd);
    if (rc != 0)
        fprintf(stderr, "bench_lbfgs: %s exited %d (log: %s/%s.log)\n", name, rc, tmpdir, name);
    return rc;
}

int main(int argc, char **argv)
{
    const char *bin = getenv("DOWNPOUR_BIN");
    int workers = 4, iterations = 120, epochs_adam = 10;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--bin") == 0)
            bin = argv[i + 1];
        else if (strcmp(argv[i], "--workers") == 0)
            workers = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--iterations") == 0)
            iterations = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--epochs-adam") == 0)
            epochs_adam = atoi(argv[i + 1]);
    }
    if (workers < 2 || iterations < 1 || epochs_adam < 1) {
        fprintf(stderr, "usage: %s [--bin PATH] [--workers W>=2] [--iterations N] "
                        "[--epochs-adam N]\n", argv[0]);
        return 2;
    }
    if (!bin)
        bin = "../downpour";
    if (bench_scratch("bench_lbfgs", tmpdir, sizeof tmpdir) < 0)
        return 1;
    char launch[128], args[1024], path[512];
    snprintf(launch, sizeof launch, "launch --chief --workers %d --ps 2", workers);
    const char *common = "--model mlp-300-100 --threads 1 --no-progress --log-every 0";

    double t_l, acc_l, eval_plain, t_a, acc_a, dummy, eval_slow;
    snprintf(args, sizeof args, "--strategy lbfgs --batch 54000 --portion 2000 --epochs %d %s",
             iterations, common);
    if (run(bin, launch, args, "lbfgs") != 0)
        return 1;
    snprintf(path, sizeof path, "%s/lbfgs.jsonl", tmpdir);
    read_metrics(path, 0.97, &t_l, &acc_l, &eval_plain);
    snprintf(args, sizeof args, "--strategy single --batch 128 --epochs %d %s", epochs_adam,
             common);
    if (run(bin, "", args, "adam") != 0)
        return 1;
    snprintf(path, sizeof path, "%s/adam.jsonl", tmpdir);
    read_metrics(path, 0.97, &t_a, &acc_a, &dummy);
    printf("time to 0.97 val_accuracy, mlp-300-100:\n");
    printf("  lbfgs full batch, %d workers, 2 ps: %8.1f s (test accuracy %.4f after %d "
           "iterations, %.3f s an evaluation)\n", workers, t_l, acc_l, iterations, eval_plain);
    printf("  single adam, batch 128:            %8.1f s (test accuracy %.4f after %d epochs)\n",
           t_a, acc_a, epochs_adam);

    /* a portion's time in the plain run: an evaluation is 27 portions over
     * the workers */
    double portion_ms = eval_plain * 1e3 * workers / 27.0;
    snprintf(args, sizeof args, "--strategy lbfgs --batch 54000 --portion 2000 --epochs 5 %s",
             common);
    if (run(bin, launch, args, "plain5") != 0)
        return 1;
    snprintf(path, sizeof path, "%s/plain5.jsonl", tmpdir);
    read_metrics(path, 2, &dummy, &dummy, &eval_plain);
    snprintf(args, sizeof args, "--strategy lbfgs --batch 54000 --portion 2000 --epochs 5 "
             "--straggler 1:%.0f %s", 9 * portion_ms, common);
    if (run(bin, launch, args, "straggler") != 0)
        return 1;
    snprintf(path, sizeof path, "%s/straggler.jsonl", tmpdir);
    read_metrics(path, 2, &dummy, &dummy, &eval_slow);
    double ratio = eval_slow / eval_plain;
    printf("an evaluation of 54,000 records (27 portions), %d workers: %.3f s; with worker 1 "
           "10x slower (+%.0f ms a portion): %.3f s, %.2fx (target <= 1.5x): %s\n",
           workers, eval_plain, 9 * portion_ms, eval_slow, ratio, ratio <= 1.5 ? "ok" : "MISSED");
    return 0;
}
