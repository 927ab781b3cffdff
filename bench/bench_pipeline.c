/* Layer pipelining against one process at the same global batch
 * (docs/benchmarks.md, "Pipeline"): samples/s of `single` and of
 * `pipeline` with S = 2 and 3 stages, M = 1, 4 and 8 micro-batches, gpipe
 * and 1f1b, each stage one process with one BLAS thread (so S stages use S
 * cores); beside each pipeline, the bubble it measured (the stages' idle
 * share of the schedule's time) and the ideal (S-1)/(M+S-1), which assumes
 * stages of equal cost.  Runs the downpour program through `launch` on MNIST.
 *
 *   bench_pipeline [--bin PATH] [--model SPEC] [--batch N] [--train-size N]
 *                  [--epochs N] [--repeats N]
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
    double sps, bubble; /* of the last "done" and "pipeline" events (bubble -1: none) */
} figures;

static void take(const cJSON *j, const char *event, void *ctx)
{
    figures *f = ctx;
    if (strcmp(event, "done") == 0)
        f->sps = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "samples_per_second"));
    else if (strcmp(event, "pipeline") == 0)
        f->bubble = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "bubble"));
}

/* One run; its samples/s and bubble (-1: none). */
static int run(const char *cmd, double *sps, double *bubble)
{
    figures f = {0, -1};
    if (bench_run_metrics(tmpdir, cmd, take, &f) < 0 || f.sps <= 0)
        return -1;
    *sps = f.sps;
    *bubble = f.bubble;
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
    if (batch < 8 || train < batch || epochs < 1 || repeats < 1 || repeats > MAX_REPEATS ||
        access(bin, X_OK) != 0) {
        fprintf(stderr, "usage: bench_pipeline [--bin PATH] [--model SPEC] [--batch N>=8] "
                        "[--train-size N] [--epochs N] [--repeats 1..%d]\n(the program %s)\n",
                MAX_REPEATS, bin);
        return 2;
    }
    if (bench_scratch("bench_pipeline", tmpdir, sizeof tmpdir) < 0)
        return 1;
    char common[1024];
    snprintf(common, sizeof common,
             "train --model %s --batch %ld --train-size %ld --val-size 500 --epochs %ld "
             "--threads 1 --no-progress --log-every 0 --optimizer sgd --lr 0.1",
             model, batch, train, epochs);
    printf("model %s, global batch %ld, %ld records x %ld epoch(s), one BLAS thread a process, "
           "median of %d\n", model, batch, train, epochs, repeats);
    printf("%-26s %12s %9s %9s %9s\n", "run", "samples/s", "vs single", "bubble", "ideal");
    double v[MAX_REPEATS], b[MAX_REPEATS], single = 0;
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s", bin, common);
    for (int r = 0; r < repeats; r++)
        if (run(cmd, &v[r], &b[r]) < 0)
            return 1;
    single = bench_median(v, repeats);
    printf("%-26s %12.0f %9s %9s %9s\n", "single", single, "1.00", "-", "-");
    static const int stages[] = {2, 3}, micro[] = {1, 4, 8};
    static const char *const schedules[] = {"gpipe", "1f1b"};
    for (int si = 0; si < 2; si++)
        for (int k = 0; k < 2; k++)
            for (int mi = 0; mi < 3; mi++) {
                int S = stages[si], M = micro[mi];
                snprintf(cmd, sizeof cmd,
                         "%s launch --workers %d -- %s --strategy pipeline --stages %d "
                         "--micro-batches %d --schedule %s",
                         bin, S, common, S, M, schedules[k]);
                for (int r = 0; r < repeats; r++)
                    if (run(cmd, &v[r], &b[r]) < 0)
                        return 1;
                double sps = bench_median(v, repeats), bubble = bench_median(b, repeats);
                char name[64];
                snprintf(name, sizeof name, "pipeline S %d M %d %s", S, M, schedules[k]);
                printf("%-26s %12.0f %9.2f %9.3f %9.3f\n", name, sps, sps / single, bubble,
                       (double)(S - 1) / (M + S - 1));
                fflush(stdout);
            }
    char rm[300];
    snprintf(rm, sizeof rm, "rm -rf %s", tmpdir);
    if (system(rm) != 0)
        fprintf(stderr, "cannot remove %s\n", tmpdir);
    return 0;
}
