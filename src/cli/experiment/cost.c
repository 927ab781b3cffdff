/* downpour experiment cost: predicts each strategy's time on a cluster the
 * user describes, from a calibration (docs/cost_model.md). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/experiment/experiment.h"
#include "downpour/cost_model.h"

#define USAGE                                                                                   \
    "downpour experiment cost (--calibrate METRICS | --measure | --sample-us X) [--hosts H]\n"  \
    "       [--cores C] [--link-mbit B] [--latency-ms L] [--workers W] [--ps P] [--chief 0|1]\n" \
    "       [--strategy all|NAME] [--model M] [--batch B] [--epochs E] [--tasks-per-host K]\n"  \
    "       [--local-mbit B] [--allreduce-algo A] [--compress C] [--ps-reply f32|bf16]\n"         \
    "       [METRICS...]\n\n"                                                                  \
    "Predicts single, ps-async, ps-sync and allreduce on the cluster and ranks them.\n"        \
    "Calibration: --calibrate reads a single-process run's metrics (train --threads 1),\n"    \
    "--measure runs one itself (1 epoch of --train-size records), --sample-us gives it.\n"    \
    "No --link-mbit: the loopback link of this machine is measured.\n"                        \
    "METRICS files after the options are measured runs: each is predicted from its done\n"   \
    "event and the error printed.  --source prints the source experiment's 12 TensorFlow\n"  \
    "times beside the predictions (docs/cost_model.md)."

/* Runs this program's train for one short epoch, one thread, into path. */
static int measure(const char *dataset, const char *model, long batch, long records,
                   const char *path)
{
    char b[32], n[32];
    snprintf(b, sizeof b, "%ld", batch);
    snprintf(n, sizeof n, "%ld", records);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "downpour experiment cost: fork: %s\n", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        setenv("OPENBLAS_NUM_THREADS", "1", 1);
        if (!freopen("/dev/null", "w", stdout))
            _exit(127);
        char *args[] = {"downpour", "train", "--dataset", (char *)dataset, "--model", (char *)model,
                        "--batch", b, "--epochs", "1", "--train-size", n, "--val-size", "0",
                        "--threads", "1", "--metrics", (char *)path, "--quiet", NULL};
        execv("/proc/self/exe", args);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "downpour experiment cost: the calibration run failed (see above)\n");
        return -1;
    }
    return 0;
}

/* "single, ps-async, ps-sync, allreduce": the modelled strategies, with
 * `last` before the last ("or"), or a comma. */
static const char *modelled_names(const char *last)
{
    static char buf[128];
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < DP_COST_STRATEGY_COUNT && n < sizeof buf; i++)
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%s", !i ? ""
                              : i + 1 == DP_COST_STRATEGY_COUNT ? last : ", ",
                              dp_cost_strategy_name((dp_cost_strategy)i));
    return buf;
}

static void print_prediction(dp_cost_strategy s, const dp_cost_prediction *p)
{
    printf("  %-9s %9.1f s  %8.2f ms a step (compute %.2f, comm %.2f, apply %.2f), %ld steps an "
           "epoch, %.2f MB sent a step\n            bound by %s\n",
           dp_cost_strategy_name(s), p->total_s, p->step_s * 1e3, p->compute_s * 1e3,
           p->comm_s * 1e3, p->apply_s * 1e3, p->steps_per_epoch, p->bytes_per_step / 1e6, p->why);
    if (p->how[0])
        printf("            %s: %s\n", s == DP_COST_ALLREDUCE ? "all-reduce" : "ps compress",
               p->how);
}

/* Predicts a measured run from its done event and prints the error. */
static int validate_run(const char *path, const dp_cost_calibration *cal, const dp_cost_cluster *cl,
                        const dp_cost_job *job, long chief)
{
    dp_err err;
    dp_cost_run run;
    if (dp_cost_read_done(path, &run, &err) < 0) {
        fprintf(stderr, "downpour experiment cost: %s\n", err.msg);
        return -1;
    }
    int s = dp_cost_strategy_parse(run.strategy);
    if (s < 0) {
        fprintf(stderr, "downpour experiment cost: %s: strategy %s is not in the model (%s)\n",
                path, run.strategy, modelled_names(", "));
        return -1;
    }
    dp_cost_calibration c = *cal;
    size_t np;
    if (dp_cost_model_params(run.model, &np, &err) < 0) {
        fprintf(stderr, "downpour experiment cost: %s: %s\n", path, err.msg);
        return -1;
    }
    c.sample_s = cal->sample_s * (double)np / (double)cal->n_params; /* multiply-adds ~ params */
    c.n_params = np;
    dp_cost_cluster k = *cl;
    dp_cost_job j = *job;
    j.strategy = (dp_cost_strategy)s;
    if (j.compress.kind == DP_COMPRESS_POWERSGD &&
        dp_cost_powersgd(run.model, j.compress.rank, &j.psgd_floats, &j.psgd_madds, &err) < 0) {
        fprintf(stderr, "downpour experiment cost: %s: %s\n", path, err.msg);
        return -1;
    }
    j.batch = run.batch;
    j.epochs = run.epochs > 0 ? run.epochs : job->epochs;
    k.ps = run.ps;
    k.chief = (int)chief;
    /* The done event counts the training replicas; allreduce's chief is one. */
    k.workers = s == DP_COST_ALLREDUCE && chief ? run.workers - 1 : run.workers;
    if (s == DP_COST_SINGLE)
        k.workers = 1;
    dp_cost_prediction p;
    if (dp_cost_predict(&c, &k, &j, &p, &err) < 0) {
        fprintf(stderr, "downpour experiment cost: %s: %s\n", path, err.msg);
        return -1;
    }
    printf("| %s | %s | %d | %d | %d | %.2f | %.2f | %+.0f %% | %s%s%s |\n", path, run.strategy,
           run.workers, run.ps, run.batch, run.train_seconds, p.total_s,
           (p.total_s - run.train_seconds) / run.train_seconds * 100,
           dp_cost_bottleneck_name(p.bottleneck), p.how[0] ? ": " : "", p.how);
    return 0;
}

int dp_experiment_cost(int argc, char **argv)
{
    const char *calibrate = NULL, *strategy = "all", *dataset = "mnist", *model = NULL;
    bool do_measure = false, source = false;
    long hosts = 1, cores = sysconf(_SC_NPROCESSORS_ONLN), workers = 2, ps = 1, chief = 1;
    long batch = 128, epochs = 25, n_train = 54000, n_val = 6000, calib_records = 12800;
    double link_mbit = NAN, latency_ms = NAN, sample_us = NAN, step_ms = 0, record_us = 0;
    double thread_gain = 0.6, apply_ns = 120e-6 / 266610.0 * 1e9, local_mbit = 0, codec_ns = 3.5;
    double topk_ns = 17.4;
    long tasks_per_host = 0;
    const char *algo_name = "auto", *compress_name = "none", *ps_reply = "f32";
    if (cores < 1)
        cores = 1;
    cli_opt opts[] = {
        {"calibrate", CLI_STR, &calibrate, "METRICS", "metrics of a single-process run (--threads 1)", 0, 0},
        {"measure", CLI_FLAG, &do_measure, NULL, "run the calibration now (one epoch, one thread)", 0, 0},
        {"sample-us", CLI_NUM, &sample_us, "X", "calibration given: microseconds of forward+backward a record, one core", 1e-6, 1e9},
        {"calibration-records", CLI_INT, &calib_records, "N", "--measure: records in its epoch", 1280, 60000},
        {"hosts", CLI_INT, &hosts, "H", "hosts of the cluster", 1, 4096},
        {"cores", CLI_INT, &cores, "C", "cores a host", 1, 4096},
        {"link-mbit", CLI_NUM, &link_mbit, "B", "each host's link, Mbit/s each way (default: this machine's loopback, measured)", 1e-3, 1e9},
        {"latency-ms", CLI_NUM, &latency_ms, "L", "one-way latency a message (default: loopback's, measured)", 0, 1e5},
        {"workers", CLI_INT, &workers, "W", "worker tasks", 0, 4095},
        {"ps", CLI_INT, &ps, "P", "parameter server tasks (allreduce takes workers + ps replicas)", 0, 4095},
        {"chief", CLI_INT, &chief, "0|1", "a chief task (allreduce: replica 0)", 0, 1},
        {"strategy", CLI_STR, &strategy, "NAME", "all, single, ps-async, ps-sync or allreduce", 0, 0},
        {"dataset", CLI_STR, &dataset, "NAME", "--measure: the dataset", 0, 0},
        {"model", CLI_STR, &model, "SPEC", "the model (default: the calibration's, or mlp-300-100)", 0, 0},
        {"batch", CLI_INT, &batch, "N", "batch per worker", 1, 1 << 20},
        {"epochs", CLI_INT, &epochs, "N", "epochs", 1, 1000000},
        {"train-size", CLI_INT, &n_train, "N", "training records", 1, 1L << 40},
        {"val-size", CLI_INT, &n_val, "N", "validation records, each epoch", 0, 1L << 40},
        {"step-overhead-ms", CLI_NUM, &step_ms, "MS", "framework overhead a step (TensorFlow's, docs/cost_model.md)", 0, 1e6},
        {"record-overhead-us", CLI_NUM, &record_us, "US", "framework overhead a record", 0, 1e6},
        {"thread-gain", CLI_NUM, &thread_gain, "G", "what each core beyond one adds, in cores", 0, 1},
        {"apply-ns", CLI_NUM, &apply_ns, "NS", "optimiser update a parameter", 0, 1e6},
        {"tasks-per-host", CLI_INT, &tasks_per_host, "K", "K tasks to a host in rank order (scripts/vcluster.sh); default round-robin", 0, 4096},
        {"local-mbit", CLI_NUM, &local_mbit, "B", "allreduce: between two replicas of one host (shared memory), Mbit/s; default: over the host's link", 0, 1e9},
        {"allreduce-algo", CLI_STR, &algo_name, "A", "allreduce: ring, direct, hier or auto (the strategy's rule)", 0, 0},
        {"compress", CLI_STR, &compress_name, "C", "allreduce: none, bf16, fp16, topk:RATIO, powersgd:RANK or auto; ps family: none, bf16, fp16, topk:RATIO or auto (the workers' rule on the link's terms)", 0, 0},
        {"ps-reply", CLI_STR, &ps_reply, "f32|bf16|delta4|topk:RATIO", "ps family: the servers' replies", 0, 0},
        {"codec-ns", CLI_NUM, &codec_ns, "NS", "allreduce: bf16/fp16 encode and decode a float", 0, 1e6},
        {"topk-ns", CLI_NUM, &topk_ns, "NS", "ps family: a top-k (or 4-bit answer) encode a float", 0, 1e6},
        {"source", CLI_FLAG, &source, NULL, "the source experiment's cluster: TensorFlow's times beside the predictions", 0, 0},
    };
    int rest;
    int rc = cli_parse(USAGE, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, &rest);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    if (rest < argc && strcmp(argv[rest], "--") == 0)
        rest++;
    int given = (calibrate != NULL) + do_measure + !isnan(sample_us);
    if (given != 1) {
        fprintf(stderr, "downpour experiment cost: needs exactly one calibration: --calibrate METRICS, "
                        "--measure or --sample-us X (%d given)\n", given);
        return 2;
    }
    int only = -1;
    if (strcmp(strategy, "all") != 0 && (only = dp_cost_strategy_parse(strategy)) < 0) {
        fprintf(stderr, "downpour experiment cost: --strategy: '%s' is not all, %s\n", strategy,
                modelled_names(" or "));
        return 2;
    }
    dp_err err;
    int algo = dp_allreduce_algo_parse(algo_name);
    if (algo < 0) {
        fprintf(stderr, "downpour experiment cost: --allreduce-algo: '%s' is not ring, direct, "
                        "hier or auto\n", algo_name);
        return 2;
    }
    dp_compress codec;
    if (dp_compress_parse(compress_name, &codec, &err) < 0) {
        fprintf(stderr, "downpour experiment cost: --compress: %s\n", err.msg);
        return 2;
    }
    dp_compress reply = {DP_COMPRESS_NONE, 0, 0};
    if (strncmp(ps_reply, "topk:", 5) == 0 ? dp_compress_parse(ps_reply, &reply, &err) < 0
                                           : strcmp(ps_reply, "f32") != 0 &&
                                                 strcmp(ps_reply, "bf16") != 0 &&
                                                 strcmp(ps_reply, "delta4") != 0) {
        fprintf(stderr, "downpour experiment cost: --ps-reply: '%s' is not f32, bf16, delta4 or "
                        "topk:RATIO\n", ps_reply);
        return 2;
    }
    dp_cost_calibration cal;
    dp_cost_calibration_init(&cal);
    cal.codec_s_per_float = codec_ns * 1e-9;
    cal.topk_s_per_float = topk_ns * 1e-9;
    cal.apply_s_per_param = apply_ns * 1e-9;
    cal.thread_gain = thread_gain;
    cal.step_overhead_s = step_ms * 1e-3;
    cal.record_overhead_s = record_us * 1e-6;
    char tmp[64] = "";
    if (do_measure) {
        snprintf(tmp, sizeof tmp, "/tmp/downpour-cost-%ld.jsonl", (long)getpid());
        if (!model)
            model = "mlp-300-100";
        fprintf(stderr, "calibrating: %s on %s, batch %ld, %ld records, one thread\n", model, dataset,
                batch, calib_records);
        if (measure(dataset, model, batch, calib_records, tmp) < 0) {
            unlink(tmp);
            return 1;
        }
        calibrate = tmp;
    }
    if (calibrate) {
        int cb;
        rc = dp_cost_calibrate_from_metrics(calibrate, &cal, &cb, &err);
        if (tmp[0])
            unlink(tmp);
        if (rc < 0) {
            fprintf(stderr, "downpour experiment cost: --calibrate: %s\n", err.msg);
            return 1;
        }
    } else {
        cal.sample_s = sample_us * 1e-6;
        if (!model)
            model = "mlp-300-100";
    }
    if (model) {
        size_t np;
        if (dp_cost_model_params(model, &np, &err) < 0) {
            fprintf(stderr, "downpour experiment cost: --model: %s\n", err.msg);
            return 2;
        }
        if (cal.n_params && np != cal.n_params) /* another model: multiply-adds ~ params */
            cal.sample_s *= (double)np / (double)cal.n_params;
        cal.n_params = np;
    }
    double bw = link_mbit * 1e6 / 8, lat = latency_ms * 1e-3;
    if (isnan(link_mbit) || isnan(latency_ms)) {
        double mbw, mlat;
        if (dp_cost_measure_loopback(&mbw, &mlat, &err) < 0) {
            fprintf(stderr, "downpour experiment cost: %s; give --link-mbit and --latency-ms\n", err.msg);
            return 1;
        }
        if (isnan(link_mbit))
            bw = mbw;
        if (isnan(latency_ms))
            lat = mlat;
        printf("Loopback measured: %.0f MB/s, %.1f us one way\n", mbw / 1e6, mlat * 1e6);
    }
    printf("Calibration: %.2f us a record (forward + backward, one core), %zu parameters, "
           "update %.2f ns a parameter, overheads %.2f ms a step + %.2f us a record\n",
           cal.sample_s * 1e6, cal.n_params, cal.apply_s_per_param * 1e9,
           cal.step_overhead_s * 1e3, cal.record_overhead_s * 1e6);
    if (source)
        return dp_cost_validate_source(&cal, cal.n_params, isnan(link_mbit) ? 125e6 : bw,
                                       isnan(latency_ms) ? 0.2e-3 : lat, stdout, &err) < 0
                   ? (fprintf(stderr, "downpour experiment cost: %s\n", err.msg), 1)
                   : 0;
    dp_cost_cluster cl = {(int)hosts, (int)cores, bw, lat, (int)workers, (int)ps, (int)chief,
                          (int)tasks_per_host, local_mbit * 1e6 / 8};
    dp_cost_job job;
    dp_cost_job_init(&job);
    job.algo = (dp_allreduce_algo)algo;
    job.compress = codec;
    job.ps_reply_bf16 = strcmp(ps_reply, "bf16") == 0;
    job.ps_reply_topk = reply.kind == DP_COMPRESS_TOPK ? reply.ratio : 0;
    job.ps_reply_delta4 = strcmp(ps_reply, "delta4") == 0;
    if (codec.kind == DP_COMPRESS_POWERSGD && !model) {
        fprintf(stderr, "downpour experiment cost: --compress powersgd needs --model (its matrices)\n");
        return 2;
    }
    if (codec.kind == DP_COMPRESS_POWERSGD &&
        dp_cost_powersgd(model, codec.rank, &job.psgd_floats, &job.psgd_madds, &err) < 0) {
        fprintf(stderr, "downpour experiment cost: --compress: %s\n", err.msg);
        return 2;
    }
    job.batch = (int)batch;
    job.epochs = (int)epochs;
    job.train_records = n_train;
    job.val_records = n_val;
    if (rest < argc) {
        printf("| metrics | strategy | workers | ps | batch | measured s | predicted s | error | bound |\n"
               "|---|---|---|---|---|---|---|---|---|\n");
        int bad = 0;
        for (int i = rest; i < argc; i++)
            bad |= validate_run(argv[i], &cal, &cl, &job, chief) < 0;
        return bad ? 1 : 0;
    }
    printf("Cluster: %ld host(s) x %ld cores, %.0f MB/s, %.3f ms; %ld worker(s), %ld ps, %s chief; "
           "batch %ld, %ld epoch(s) of %ld records\n",
           hosts, cores, bw / 1e6, lat * 1e3, workers, ps, chief ? "a" : "no", batch, epochs, n_train);
    if (only >= 0) {
        job.strategy = (dp_cost_strategy)only;
        dp_cost_prediction p;
        if (dp_cost_predict(&cal, &cl, &job, &p, &err) < 0) {
            fprintf(stderr, "downpour experiment cost: %s\n", err.msg);
            return 1;
        }
        print_prediction(job.strategy, &p);
        return 0;
    }
    dp_cost_prediction preds[DP_COST_STRATEGY_COUNT];
    dp_cost_strategy order[DP_COST_STRATEGY_COUNT];
    char text[2048];
    int n = dp_cost_recommend(&cal, &cl, &job, preds, order, text, sizeof text, &err);
    if (n < 0) {
        fprintf(stderr, "downpour experiment cost: %s\n", err.msg);
        return 1;
    }
    for (int i = 0; i < n; i++)
        print_prediction(order[i], &preds[order[i]]);
    printf("\n%s", text);
    return 0;
}
