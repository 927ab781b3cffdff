/* Model parallelism against one process and all-reduce at the same global
 * batch (docs/benchmarks.md, "Model parallelism"): samples/s of `single`,
 * of `allreduce` with K replicas of batch/K, and of `model-parallel` with K
 * = 2 and 3 tasks splitting every dense layer, and of one such replica
 * under ps-async against K ps shards, each process one BLAS thread (so K
 * tasks use K cores, plus the chief and the servers under ps-async); beside
 * each model-parallel run, the parameters one task holds (from its
 * model_parallel event) against the model's.  Runs the downpour program
 * through `launch` on MNIST.
 *
 *   bench_model_parallel [--bin PATH] [--model SPEC] [--batch N] [--train-size N]
 *                        [--epochs N] [--repeats N]
 *   PATH defaults to $DOWNPOUR_BIN, else ../downpour beside this program's
 *   build directory; DOWNPOUR_DATA must name the data directory. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "bench_run.h"

#define MAX_REPEATS 9

static char tmpdir[256];

typedef struct figures {
    double sps;           /* the last "done" event's samples/s */
    double params, total; /* task 0's parameters, from its "model_parallel" event (0: none) */
} figures;

static void take(const cJSON *j, const char *event, void *ctx)
{
    figures *f = ctx;
    if (strcmp(event, "done") == 0) {
        f->sps = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "samples_per_second"));
    } else if (strcmp(event, "model_parallel") == 0 &&
               cJSON_GetNumberValue(cJSON_GetObjectItem(j, "mp_task")) == 0) {
        f->params = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "params"));
        f->total = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "total_params"));
    }
}

static int run(const char *cmd, double *sps, double *params, double *total)
{
    figures f = {0, 0, 0};
    if (bench_run_metrics(tmpdir, cmd, take, &f) < 0 || f.sps <= 0)
        return -1;
    *sps = f.sps;
    *params = f.params;
    *total = f.total;
    return 0;
}

/* The median samples/s of `repeats` runs of cmd, and the last run's
 * per-task parameters. */
static int measure(const char *cmd, int repeats, double *sps, double *params, double *total)
{
    double v[MAX_REPEATS];
    for (int r = 0; r < repeats; r++)
        if (run(cmd, &v[r], params, total) < 0)
            return -1;
    *sps = bench_median(v, repeats);
    return 0;
}

int main(int argc, char **argv)
{
    bench_run_opts o = {.model = "mlp-300-100", .batch = 128, .train = 12800, .epochs = 1,
                        .repeats = 3};
    bench_run_args(argc, argv, &o);
    const char *bin = o.bin, *model = o.model;
    long batch = o.batch, train = o.train, epochs = o.epochs;
    int repeats = o.repeats;
    if (batch < 6 || batch % 6 != 0 || train < batch || epochs < 1 || repeats < 1 ||
        repeats > MAX_REPEATS || access(bin, X_OK) != 0) {
        fprintf(stderr, "usage: bench_model_parallel [--bin PATH] [--model SPEC] [--batch N, a "
                        "multiple of 6] [--train-size N] [--epochs N] [--repeats 1..%d]\n(the "
                        "program %s)\n",
                MAX_REPEATS, bin);
        return 2;
    }
    if (bench_scratch("bench_model_parallel", tmpdir, sizeof tmpdir) < 0)
        return 1;
    char common[1024];
    snprintf(common, sizeof common,
             "--model %s --train-size %ld --val-size 500 --epochs %ld --threads 1 --no-progress "
             "--log-every 0 --optimizer sgd --lr 0.1",
             model, train, epochs);
    printf("model %s, global batch %ld, %ld records x %ld epoch(s), one BLAS thread a process, "
           "median of %d\n", model, batch, train, epochs, repeats);
    printf("%-24s %12s %9s %16s %8s\n", "run", "samples/s", "vs single", "params a task",
           "share");
    char cmd[2048];
    double single, sps, params, total;
    snprintf(cmd, sizeof cmd, "%s train %s --batch %ld", bin, common, batch);
    if (measure(cmd, repeats, &single, &params, &total) < 0)
        return 1;
    printf("%-24s %12.0f %9s %16s %8s\n", "single", single, "1.00", "all", "1");
    for (int K = 2; K <= 3; K++) {
        char name[64];
        snprintf(cmd, sizeof cmd, "%s launch --workers %d -- train --strategy allreduce %s "
                 "--batch %ld", bin, K, common, batch / K);
        if (measure(cmd, repeats, &sps, &params, &total) < 0)
            return 1;
        snprintf(name, sizeof name, "allreduce %d x %ld", K, batch / K);
        printf("%-24s %12.0f %9.2f %16s %8s\n", name, sps, sps / single, "all", "1");
        snprintf(cmd, sizeof cmd, "%s launch --workers %d -- train --strategy model-parallel "
                 "--model-parallel %d %s --batch %ld", bin, K, K, common, batch);
        if (measure(cmd, repeats, &sps, &params, &total) < 0)
            return 1;
        snprintf(name, sizeof name, "model-parallel K %d", K);
        printf("%-24s %12.0f %9.2f %16.0f %8.3f\n", name, sps, sps / single, params,
               total > 0 ? params / total : 0);
        /* one replica against K ps shards: each task pushes its slices */
        snprintf(cmd, sizeof cmd, "%s launch --chief --workers %d --ps %d -- train --strategy "
                 "ps-async --model-parallel %d %s --batch %ld", bin, K, K, K, common, batch);
        if (measure(cmd, repeats, &sps, &params, &total) < 0)
            return 1;
        snprintf(name, sizeof name, "ps-async mp K %d, %d ps", K, K);
        printf("%-24s %12.0f %9.2f %16.0f %8.3f\n", name, sps, sps / single, params,
               total > 0 ? params / total : 0);
        fflush(stdout);
    }
    char rm[300];
    snprintf(rm, sizeof rm, "rm -rf %s", tmpdir);
    if (system(rm) != 0)
        fprintf(stderr, "cannot remove %s\n", tmpdir);
    return 0;
}
