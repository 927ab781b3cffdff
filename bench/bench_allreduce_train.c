/* allreduce training against its own parts (issue 13): two replicas on this
 * machine through `downpour launch`, with the default --overlap (auto), with
 * --no-overlap and with --overlap on, beside
 *   compute: two `single` processes at once, each the per-replica batch and
 *            threads a replica has (so each core carries what it carries
 *            in the allreduce run), their step time; single fuses the
 *            optimiser into backprop, which allreduce cannot (the update
 *            waits for the sums), so the same with DOWNPOUR_UNFUSED_UPDATE=1
 *            is shown beside it;
 *   ring:    the isolated ring all-reduce of the model's gradient between
 *            two processes through the TCP transport with frame MACs, as a
 *            launched run's (shared memory where it takes it): the whole
 *            gradient in one call, and in the default 512 KiB buckets as
 *            the reducer sends it.
 * The six take turns in every round, and each step time is the median over
 * the rounds of the runs' median steps (the `steps` event, docs/metrics.md;
 * for a run, its slowest task's).  The two ratios are each the median over
 * the rounds of that round's ratio, so a busy moment falls on both sides of
 * a ratio alike.  Prints
 *   default / no-overlap throughput, beside 0.95;
 *   default throughput / (1 / (compute + ring)), beside 0.85.
 *
 *   bench_allreduce_train [--bin PATH] [--model SPEC] [--batch N]
 *                         [--train-size N] [--repeats N]
 *   PATH defaults to $DOWNPOUR_BIN, else ../downpour beside this program's
 *   build directory; DOWNPOUR_DATA must name the data directory. */
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "bench_run.h"
#include "downpour/clock.h"
#include "downpour/log.h"
#include "downpour/model.h"
#include "downpour/ring.h"
#include "downpour/tcp.h"

#define MAX_REPEATS 15
#define RING_CALLS 60
#define BUCKET_BYTES (512u << 10) /* the default --bucket-bytes */

static char tmpdir[256];
static const unsigned char secret[32] = "bench_allreduce_train secret 32";

typedef struct figures {
    double step_ms[4]; /* per task: step_ms_median of its last `steps` event */
    int n;
    char overlap[16], reason[64];
} figures;

static void take(const cJSON *j, const char *event, void *ctx)
{
    figures *f = ctx;
    if (strcmp(event, "steps") == 0 && f->n < 4) {
        f->step_ms[f->n++] = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "step_ms_median"));
    } else if (strcmp(event, "replica") == 0) {
        const cJSON *o = cJSON_GetObjectItem(j, "overlap");
        const cJSON *r = cJSON_GetObjectItem(j, "overlap_reason");
        if (cJSON_IsString(o))
            snprintf(f->overlap, sizeof f->overlap, "%s", o->valuestring);
        if (cJSON_IsString(r))
            snprintf(f->reason, sizeof f->reason, "%s", r->valuestring);
    }
}

/* The slowest task's median step of one run, in ms; -1 on failure. */
static double run(const char *cmd, figures *f)
{
    memset(f, 0, sizeof *f);
    if (bench_run_metrics(tmpdir, cmd, take, f) < 0 || f->n == 0)
        return -1;
    double worst = 0;
    for (int i = 0; i < f->n; i++)
        worst = f->step_ms[i] > worst ? f->step_ms[i] : worst;
    return worst;
}

/* The events of one metrics file. */
static void read_events(const char *path, figures *f)
{
    memset(f, 0, sizeof *f);
    FILE *fp = fopen(path, "r");
    char line[8192];
    while (fp && fgets(line, sizeof line, fp)) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *ev = j ? cJSON_GetObjectItem(j, "event") : NULL;
        if (ev && cJSON_IsString(ev))
            take(j, ev->valuestring, f);
        cJSON_Delete(j);
    }
    if (fp)
        fclose(fp);
}

/* Compute alone: two single processes at once; the mean of their medians. */
static double compute(const char *env, const char *bin, const char *single)
{
    char path[2][512], cmd[8192];
    for (int i = 0; i < 2; i++)
        snprintf(path[i], sizeof path[i], "%s/single%d.jsonl", tmpdir, i);
    snprintf(cmd, sizeof cmd,
             "rm -f %s %s; %s %s %s --metrics %s >/dev/null 2>&1 & %s %s %s --metrics %s "
             ">/dev/null 2>&1; wait",
             path[0], path[1], env, bin, single, path[0], env, bin, single, path[1]);
    int st = system(cmd);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return -1;
    double sum = 0;
    for (int i = 0; i < 2; i++) {
        figures f;
        read_events(path[i], &f);
        if (f.n == 0) {
            fprintf(stderr, "bench_allreduce_train: %s wrote no steps\n", single);
            return -1;
        }
        sum += f.step_ms[0];
    }
    return sum / 2;
}

/* One ring rank: RING_CALLS all-reduces of the whole gradient, then as many
 * in buckets; rank 0 writes the two medians (s) to out_fd. */
static int ring_rank(int me, const int *fds, char addrs[][32], size_t n, int out_fd)
{
    const char *ap[2] = {addrs[0], addrs[1]};
    int ranks[2] = {0, 1};
    dp_tcp_config cfg;
    dp_tcp_config_init(&cfg);
    cfg.rank = me;
    cfg.n_ranks = 2;
    cfg.addrs = ap;
    cfg.secret = secret;
    cfg.secret_len = sizeof secret;
    cfg.listen_fd = fds[me];
    dp_err err;
    dp_transport *t;
    dp_ring ring;
    dp_log_set_level(DP_LOG_WARN);
    float *buf = calloc(n, sizeof *buf);
    if (!buf || dp_tcp_open(&cfg, &t, &err) < 0 ||
        dp_transport_connect_all(t, dp_now() + 30, &err) < 0 ||
        dp_ring_init(&ring, t, ranks, 2, 60, 0, &err) < 0) {
        fprintf(stderr, "ring rank %d: %s\n", me, err.msg);
        return 1;
    }
    size_t bucket = BUCKET_BYTES / sizeof(float);
    uint64_t step = 0;
    double med[2];
    for (int way = 0; way < 2; way++) {
        double times[RING_CALLS];
        for (int c = -5; c < RING_CALLS; c++) { /* the first 5 warm up */
            double t0 = dp_now();
            step++;
            int b = 0;
            for (size_t hi = n; hi > 0 && (way == 1 || b == 0); b++) {
                size_t lo = way == 0 || hi < bucket ? 0 : hi - bucket;
                if (dp_ring_allreduce(&ring, buf + lo, hi - lo, step, b, &err) < 0) {
                    fprintf(stderr, "ring rank %d: %s\n", me, err.msg);
                    return 1;
                }
                hi = lo;
            }
            if (c >= 0)
                times[c] = dp_now() - t0;
        }
        med[way] = bench_median(times, RING_CALLS);
    }
    if (me == 0 && write(out_fd, med, sizeof med) != sizeof med)
        return 1;
    dp_ring_free(&ring);
    dp_transport_close(t);
    free(buf);
    return 0;
}

/* The ring alone, whole and bucketed, in ms; -1 on failure. */
static int ring_ms(size_t n, double *whole, double *bucketed)
{
    int fds[2], pipes[2];
    char addrs[2][32];
    dp_err err;
    for (int i = 0; i < 2; i++) {
        int port;
        if (dp_tcp_listen("127.0.0.1:0", 0, &fds[i], &port, &err) < 0) {
            fprintf(stderr, "bench_allreduce_train: %s\n", err.msg);
            return -1;
        }
        snprintf(addrs[i], sizeof addrs[i], "127.0.0.1:%d", port);
    }
    if (pipe(pipes) < 0)
        return -1;
    pid_t pids[2];
    for (int i = 0; i < 2; i++)
        if ((pids[i] = fork()) == 0)
            _exit(ring_rank(i, fds, addrs, n, pipes[1]));
    for (int i = 0; i < 2; i++)
        close(fds[i]);
    close(pipes[1]);
    double med[2];
    ssize_t got = read(pipes[0], med, sizeof med);
    close(pipes[0]);
    int ok = got == sizeof med;
    for (int i = 0; i < 2; i++) {
        int st;
        waitpid(pids[i], &st, 0);
        ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    *whole = med[0] * 1e3;
    *bucketed = med[1] * 1e3;
    return ok ? 0 : -1;
}

int main(int argc, char **argv)
{
    bench_run_opts o = {.model = "mlp-300-100", .batch = 128, .train = 40000, .epochs = 1,
                        .repeats = 5};
    bench_run_args(argc, argv, &o);
    if (o.batch < 1 || o.train < 2 * o.batch || o.repeats < 1 || o.repeats > MAX_REPEATS ||
        access(o.bin, X_OK) != 0) {
        fprintf(stderr, "usage: bench_allreduce_train [--bin PATH] [--model SPEC] [--batch N] "
                        "[--train-size N] [--repeats 1..%d]\n(the program %s)\n",
                MAX_REPEATS, o.bin);
        return 2;
    }
    dp_err err;
    dp_model m;
    if (dp_model_init(&m, o.model, 1, 1, &err) < 0) {
        fprintf(stderr, "bench_allreduce_train: %s\n", err.msg);
        return 2;
    }
    size_t n = m.n_params;
    dp_model_free(&m);
    if (bench_scratch("bench_allreduce_train", tmpdir, sizeof tmpdir) < 0)
        return 1;
    /* Every replica trains train/2 records; a single process the same. */
    static char ar_auto[1000], ar_off[1000], ar_on[1000];
    char common[512], single[800], *ar[3] = {ar_auto, ar_off, ar_on};
    const char *flags = "--val-size 0 --test-size 500 --epochs 1 --threads 1 --no-progress "
                        "--log-every 0";
    snprintf(common, sizeof common, "--model %s --batch %ld %s", o.model, o.batch, flags);
    snprintf(single, sizeof single, "train %s --train-size %ld", common, o.train / 2);
    char single_cmd[800];
    snprintf(single_cmd, sizeof single_cmd, "%s", single);
    static const char *const ways[3] = {"", "--no-overlap", "--overlap on"};
    for (int w = 0; w < 3; w++)
        snprintf(ar[w], sizeof ar_auto,
                 "%s launch --workers 2 -- train --strategy allreduce %s --train-size %ld %s",
                 o.bin, common, o.train, ways[w]);
    printf("model %s (%zu parameters, %.2f MiB of gradient), 2 replicas x batch %ld, one BLAS "
           "thread each, %ld records a run; median of %d interleaved rounds\n",
           o.model, n, n * 4.0 / (1 << 20), o.batch, o.train, o.repeats);
    double v[5][MAX_REPEATS], whole[MAX_REPEATS], bucketed[MAX_REPEATS];
    double r1[MAX_REPEATS], r2[MAX_REPEATS];
    figures f;
    char chosen[96] = "";
    for (int r = 0; r < o.repeats; r++) {
        for (int w = 0; w < 3; w++) {
            if ((v[w][r] = run(ar[w], &f)) < 0)
                return 1;
            if (w == 0)
                snprintf(chosen, sizeof chosen, "%s (%s)", f.overlap, f.reason);
        }
        if ((v[3][r] = compute("", o.bin, single_cmd)) < 0 ||
            (v[4][r] = compute("DOWNPOUR_UNFUSED_UPDATE=1", o.bin, single_cmd)) < 0 ||
            ring_ms(n, &whole[r], &bucketed[r]) < 0)
            return 1;
        r1[r] = v[1][r] / v[0][r];
        r2[r] = (v[3][r] + whole[r]) / v[0][r];
        fprintf(stderr, "round %d: default %.3f ms, no-overlap %.3f, overlap on %.3f, compute "
                        "%.3f (unfused %.3f), ring %.3f (bucketed %.3f)\n", r + 1, v[0][r],
                v[1][r], v[2][r], v[3][r], v[4][r], whole[r], bucketed[r]);
    }
    double def = bench_median(v[0], o.repeats), off = bench_median(v[1], o.repeats);
    double on = bench_median(v[2], o.repeats), comp = bench_median(v[3], o.repeats);
    double unf = bench_median(v[4], o.repeats);
    double ring = bench_median(whole, o.repeats), ringb = bench_median(bucketed, o.repeats);
    printf("%-34s %9s %12s\n", "", "step ms", "samples/s");
    printf("%-34s %9.3f %12.0f   overlap %s\n", "allreduce, default", def, 2e3 * o.batch / def,
           chosen);
    printf("%-34s %9.3f %12.0f\n", "allreduce --no-overlap", off, 2e3 * o.batch / off);
    printf("%-34s %9.3f %12.0f\n", "allreduce --overlap on", on, 2e3 * o.batch / on);
    printf("%-34s %9.3f %12.0f\n", "compute alone (single, 2 at once)", comp,
           2e3 * o.batch / comp);
    printf("%-34s %9.3f %12.0f\n", "  the same, optimiser after backprop", unf, 2e3 * o.batch / unf);
    printf("%-34s %9.3f\n", "ring alone, whole gradient", ring);
    printf("%-34s %9.3f\n", "ring alone, 512 KiB buckets", ringb);
    double q1 = bench_median(r1, o.repeats), q2 = bench_median(r2, o.repeats);
    printf("default / no-overlap:              %.3f (target >= 0.95: %s)\n", q1,
           q1 >= 0.95 ? "met" : "missed");
    printf("default / 1/(compute + ring):      %.3f (target >= 0.85: %s)\n", q2,
           q2 >= 0.85 ? "met" : "missed");
    char rm[300];
    snprintf(rm, sizeof rm, "rm -rf %s", tmpdir);
    if (system(rm) != 0)
        fprintf(stderr, "cannot remove %s\n", tmpdir);
    return 0;
}
