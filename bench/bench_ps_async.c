/* ps-async against one process on the same machine (issue 13, "a worker
 * that never waits"): samples/s of `downpour launch --chief --workers 2 --ps
 * 1 -- train --strategy ps-async` with --push-behind 1 (a worker computes on
 * while its push is answered; its pushes sent by a send thread, or with
 * --push-inline by the worker itself) and 0 (the default: it waits for each
 * answer), and of `train --strategy single` at the same model and batch, each
 * with the threads it takes by default (the launcher divides the cores among
 * its local tasks).  The four take turns round by round, so each ratio is
 * the median of runs taken moments apart.  Prints each run's samples/s, the
 * workers' median step time, the test accuracy (pushing behind, a gradient
 * is one push older), and ps-async / single beside the target 0.9.
 *
 *   bench_ps_async [--bin PATH] [--model SPEC] [--batch N] [--train-size N]
 *                  [--epochs N] [--repeats N]
 *   PATH defaults to $DOWNPOUR_BIN, else ../downpour beside this program's
 *   build directory; DOWNPOUR_DATA must name the data directory. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "bench_run.h"

#define MAX_REPEATS 15
#define TARGET 0.9 /* ps-async, 2 workers and 1 ps: at least 0.9 of one process's samples/s */
#define KINDS 4

static char tmpdir[256];

typedef struct figures {
    double sps;     /* the done event's samples/s */
    double acc;     /* its test accuracy */
    double step_ms; /* the workers' median step time (mean of their medians), 0: none */
    int workers;
} figures;

static void take(const cJSON *j, const char *event, void *ctx)
{
    figures *f = ctx;
    if (strcmp(event, "done") == 0) {
        f->sps = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "samples_per_second"));
        f->acc = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "test_accuracy"));
    } else if (strcmp(event, "steps") == 0) {
        const cJSON *task = cJSON_GetObjectItem(j, "task");
        if (!task || !cJSON_IsString(task) || strncmp(task->valuestring, "worker:", 7) == 0) {
            f->step_ms += cJSON_GetNumberValue(cJSON_GetObjectItem(j, "step_ms_median"));
            f->workers++;
        }
    }
}

static int run(const char *cmd, figures *f)
{
    memset(f, 0, sizeof *f);
    if (bench_run_metrics(tmpdir, cmd, take, f) < 0 || f->sps <= 0)
        return -1;
    if (f->workers > 0)
        f->step_ms /= f->workers;
    return 0;
}

int main(int argc, char **argv)
{
    bench_run_opts o = {.model = "mlp-300-100", .batch = 128, .train = 50000, .epochs = 2,
                        .repeats = 5};
    bench_run_args(argc, argv, &o);
    if (o.batch < 1 || o.train < o.batch || o.epochs < 1 || o.repeats < 1 ||
        o.repeats > MAX_REPEATS || access(o.bin, X_OK) != 0) {
        fprintf(stderr, "usage: bench_ps_async [--bin PATH] [--model SPEC] [--batch N] "
                        "[--train-size N] [--epochs N] [--repeats 1..%d]\n(the program %s)\n",
                MAX_REPEATS, o.bin);
        return 2;
    }
    if (bench_scratch("bench_ps_async", tmpdir, sizeof tmpdir) < 0)
        return 1;
    char common[1024];
    snprintf(common, sizeof common,
             "train --model %s --batch %ld --train-size %ld --val-size 1000 --epochs %ld "
             "--no-progress --log-every 0",
             o.model, o.batch, o.train, o.epochs);
    static const char *const names[KINDS] = {"single", "ps-async --push-behind 1",
                                             "  the same, --push-inline",
                                             "ps-async --push-behind 0"};
    static const char *const flags[KINDS] = {"", "--push-behind 1", "--push-behind 1 --push-inline",
                                             "--push-behind 0"};
    static char cmds[KINDS][2048];
    char *cmd[KINDS];
    for (int k = 0; k < KINDS; k++)
        cmd[k] = cmds[k];
    snprintf(cmd[0], sizeof cmds[0], "%s %s --strategy single", o.bin, common);
    for (int k = 1; k < KINDS; k++)
        snprintf(cmd[k], sizeof cmds[k],
                 "%s launch --chief --workers 2 --ps 1 -- %s --strategy ps-async %s", o.bin,
                 common, flags[k]);
    double sps[KINDS][MAX_REPEATS], ms[KINDS][MAX_REPEATS], ratio[KINDS][MAX_REPEATS];
    double acc[KINDS][MAX_REPEATS];
    for (int r = 0; r < o.repeats; r++)
        for (int k = 0; k < KINDS; k++) {
            figures f;
            if (run(cmd[k], &f) < 0)
                return 1;
            sps[k][r] = f.sps;
            ms[k][r] = f.step_ms;
            acc[k][r] = f.acc;
        }
    for (int k = 0; k < KINDS; k++)
        for (int r = 0; r < o.repeats; r++)
            ratio[k][r] = sps[k][r] / sps[0][r];
    printf("model %s, batch %ld per worker, %ld records x %ld epoch(s), median of %d rounds "
           "(the runs of a round taken in turn)\n",
           o.model, o.batch, o.train, o.epochs, o.repeats);
    printf("%-26s %10s %14s %10s %10s\n", "run", "samples/s", "step ms (med)", "test acc",
           "vs single");
    double best = 0;
    for (int k = 0; k < KINDS; k++) {
        double v = bench_median(ratio[k], o.repeats);
        printf("%-26s %10.0f %14.2f %10.4f %10.2f\n", names[k], bench_median(sps[k], o.repeats),
               bench_median(ms[k], o.repeats), bench_median(acc[k], o.repeats), v);
        best = k > 0 && v > best ? v : best;
    }
    printf("ps-async (2 workers, 1 ps) / single, the best setting: %.2f (target >= %.1f: %s)\n",
           best, TARGET, best >= TARGET ? "met" : "missed");
    char rm[300];
    snprintf(rm, sizeof rm, "rm -rf %s", tmpdir);
    if (system(rm) != 0)
        fprintf(stderr, "cannot remove %s\n", tmpdir);
    return 0;
}
