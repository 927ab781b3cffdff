/* downpour train: the training run of one process. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "downpour/file.h"
#include "downpour/log.h"
#include "downpour/node.h"
#include "downpour/records.h"
#include "downpour/strategy.h"
#include "downpour/tcp.h"
#include "downpour/train.h"

/* Who speaks in train's messages: launch checks the options for its tasks. */
static const char *g_who = "downpour train";

#define USAGE "downpour train [--dataset NAME|PATH] [--model SPEC] [--strategy S] [...]"

/* --straggler K against the cluster this task belongs to: topo (chief,
 * workers, ps) when launch asks, else its spec, as the loop will read it
 * (DOWNPOUR_CONFIG, which launch and run set, or TF_CONFIG).  Alone, or
 * with a spec the loop will refuse, nothing to say. */
static int check_straggler_cluster(const char *value, long k, const int *topo, dp_err *err)
{
    dp_cluster c;
    dp_err ignored;
    if (topo)
        return cli_check_straggler(value, k, topo[0], topo[1], err);
    if (dp_cluster_from_env(&c, NULL, &ignored) != 0)
        return 0;
    int rc = cli_check_straggler(value, k, c.count[DP_ROLE_CHIEF], c.count[DP_ROLE_WORKER], err);
    dp_cluster_free(&c);
    return rc;
}

/* --spare-workers N against the cluster (topo, else the spec in the
 * environment): at least one worker must start, and the strategy must be
 * one that re-deals the data when a worker comes or goes (`deal`:
 * allreduce, the ps family; docs/cluster.md, "Spare slots: growing a
 * running job"). */
static int check_spares(long n, const dp_strategy_ops *ops, const int *topo, dp_err *err)
{
    if (n == 0)
        return 0;
    if (!ops->deal || !ops->leave)
        return dp_errf(err, "--spare-workers %ld: --strategy %s cannot take a worker in "
                            "mid-run (allreduce and the ps family can)", n, ops->name);
    dp_cluster c;
    dp_err ignored;
    int workers;
    if (topo) {
        workers = topo[1];
    } else {
        if (dp_cluster_from_env(&c, NULL, &ignored) != 0)
            return 0;
        workers = c.count[DP_ROLE_WORKER];
        dp_cluster_free(&c);
    }
    if (n >= workers)
        return dp_errf(err, "--spare-workers %ld: the cluster has %d worker slot(s), and at "
                            "least one must start", n, workers);
    return 0;
}

/* "learning rate (default: the optimizer's: sgd 0.01, ..., adam 0.001)" */
static void lr_help(char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "learning rate (default: the optimizer's:");
    for (int k = 0; k < DP_OPTIM_COUNT && n < cap; k++) /* \x1f: a space help never breaks */
        n += (size_t)snprintf(buf + n, cap - n, "%s %s\x1f%g", k ? "," : "",
                              dp_optim_kind_name((dp_optim_kind)k),
                              (double)dp_optim_defaults((dp_optim_kind)k).lr);
    if (n < cap)
        snprintf(buf + n, cap - n, ")");
}

/* Checks the output paths before any training, so a typo costs seconds, not
 * a run: exits 2 with the message. */
static int check_outputs(const char *save, const char *metrics, const char *checkpoint_dir,
                         const char *tensorboard, const char *trace)
{
    dp_err err;
    if ((save && dp_path_check_replaceable(save, "--save", &err) < 0) ||
        (trace && dp_path_check_replaceable(trace, "--trace", &err) < 0) ||
        (tensorboard && dp_dir_prepare(tensorboard, "--tensorboard", &err) < 0) ||
        (metrics && dp_path_check_writable(metrics, "--metrics", &err) < 0) ||
        (checkpoint_dir && dp_dir_prepare(checkpoint_dir, "--checkpoint-dir", &err) < 0)) {
        fprintf(stderr, "%s: %s\n", g_who, err.msg);
        return -1;
    }
    return 0;
}

/* Appends arg to buf as a shell word, quoted when it needs it, so a hint
 * pastes as typed. */
static void append_word(char *buf, size_t cap, const char *arg)
{
    size_t n = strlen(buf);
    bool plain = *arg != '\0';
    for (const char *p = arg; *p; p++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./:=,+-@%", *p))
            plain = false;
    if (plain) {
        snprintf(buf + n, cap - n, " %s", arg);
        return;
    }
    n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, " '");
    for (const char *p = arg; *p && n + 5 < cap; p++)
        n += (size_t)snprintf(buf + n, cap - n, *p == '\'' ? "'\\''" : "%c", *p);
    if (n < cap)
        snprintf(buf + n, cap - n, "'");
}

/* Is this process a rank of an MPI job?  The variables each launcher sets
 * (Open MPI's mpirun, MPICH's hydra, PMIx, Slurm's srun, MVAPICH). */
static bool under_mpi_launcher(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK",
                                       "PMIX_RANK", "SLURM_PROCID", "MPI_LOCALNRANKS",
                                       "MV2_COMM_WORLD_SIZE", "HYDI_CONTROL_FD"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i]))
            return true;
    return false;
}

/* --strategy against the cluster this task is part of, before it waits on
 * a peer: topo (chief, workers, ps) when launch asks, else the spec in the
 * environment, else none (a process alone).  A hint for a process alone
 * repeats the user's arguments, so it pastes. */
static int check_topology(const dp_strategy_ops *ops, const int *topo, const char *transport,
                          int argc, char **argv)
{
    dp_err err;
    if (strcmp(transport, "mpi") == 0) {
        if (topo || under_mpi_launcher())
            return 0; /* the MPI job is the cluster: the tasks check it when they open */
        fprintf(stderr, "%s: --transport mpi: this process was not started by "
                        "mpirun or srun (one process per task: rank 0 the chief, then --ps "
                        "ranks, the rest workers). Hint: mpirun -np 3 downpour train "
                        "--transport mpi --strategy allreduce, or without --transport mpi: "
                        "downpour launch --workers 2 -- train --strategy allreduce "
                        "(docs/mpi.md)\n", g_who);
        return -1;
    }
    int rc;
    if (topo) {
        rc = dp_strategy_check_cluster(ops, topo[0], topo[1], topo[2], &err);
    } else {
        dp_cluster c;
        dp_err ignored; /* a bad spec: the loop says what is wrong with it */
        int env = dp_cluster_from_env(&c, NULL, &ignored);
        if (env < 0)
            return 0;
        if (env == 0) {
            rc = dp_strategy_check_cluster(ops, c.count[DP_ROLE_CHIEF], c.count[DP_ROLE_WORKER],
                                           c.count[DP_ROLE_PS], &err);
            if (rc < 0)
                dp_err_prefix(&err, "task %s", c.tasks[c.self].name);
            dp_cluster_free(&c);
        } else if (ops->cluster) {
            char opts[96], cmd[2048];
            dp_strategy_launch_options(ops, 2, opts, sizeof opts);
            snprintf(cmd, sizeof cmd, "downpour launch %s -- train", opts);
            for (int i = 1; i < argc; i++)
                append_word(cmd, sizeof cmd, argv[i]);
            fprintf(stderr, "%s: --strategy %s runs on a cluster of tasks, and this "
                            "process is alone. Hint: %s\n", g_who, ops->name, cmd);
            return -1;
        } else {
            rc = 0;
        }
    }
    if (rc < 0)
        fprintf(stderr, "%s: %s\n", g_who, err.msg);
    return rc;
}

/* --model: a spec that does not parse is a usage error, with the closest
 * preset when the spec looks like a misspelt one.  Parsed only, nothing
 * allocated: a task that holds no whole table (docs/strategies.md, "Tables
 * larger than a worker") must not build one to check the spec. */
static int check_model(const char *spec)
{
    dp_model m;
    dp_err err;
    memset(&m, 0, sizeof m);
    if (dp_model_describe(&m, spec, &err) == 0) {
        dp_model_free(&m);
        return 0;
    }
    char near[64];
    if (cli_suggest_list(spec, dp_model_presets(), near, sizeof near))
        fprintf(stderr, "%s: --model: %s; did you mean --model %s?\n", g_who, err.msg, near);
    else
        fprintf(stderr, "%s: --model: %s\n", g_who, err.msg);
    return -1;
}

/* --dataset: a name that is neither a known dataset nor an existing path
 * (nor a glob of record files) is a usage error, before the banner. */
static int check_dataset(const char *name)
{
    static const char *const known[] = {"mnist", "fashion-mnist", "kmnist"};
    struct stat st;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(name, known[i]) == 0)
            return 0;
    if (stat(name, &st) == 0 || strpbrk(name, "*?[") || dp_data_files_match(name) ||
        dp_dataset_is_memory(name))
        return 0;
    const char *near = cli_suggest(name, known, (int)(sizeof known / sizeof known[0]));
    fprintf(stderr, "%s: --dataset '%s' is neither a dataset name (mnist, "
                    "fashion-mnist, kmnist) nor a file or directory%s%s%s (docs/datasets.md)\n", g_who,
            name, near ? "; did you mean --dataset " : "", near ? near : "", near ? "?" : "");
    return -1;
}

/* Parses and checks train's options; topo (chief, workers, ps): only check,
 * as each task of a launched cluster of that shape would, and train nothing. */
static int train_main(int argc, char **argv, const int *topo, dp_train_config *parsed)
{
    dp_train_config cfg = dp_train_defaults();
    const char *dataset = cfg.dataset, *model = cfg.model, *strategy = "single";
    const char *lr_schedule = "constant";
    const char *shard = "data", *straggler = NULL;
    bool trace_clocks = false;
    long mpi_ps = 0;
    const char *transport = "tcp", *device = "cpu";
    double collective_timeout = cfg.collective_timeout;
    const char *optimizer = "adam", *metrics = NULL, *save = NULL, *trace = NULL;
    const char *checkpoint_dir = NULL, *secret_file = NULL, *tensorboard = NULL;
    long checkpoint_every = cfg.checkpoint_every, keep_checkpoints = cfg.keep_checkpoints;
    bool resume = false;
    dp_node_config node_defaults;
    dp_node_config_init(&node_defaults);
    double startup_timeout = node_defaults.connect_timeout;
    double heartbeat_timeout = node_defaults.heartbeat_timeout;
    long spare_workers = 0;
    double link_delay_ms = 0;
    long global_batch = 0; /* not given: --batch rules */
    long sum_chunk = 0;
    long batch = 0 /* not given: cfg.batch */, epochs = cfg.epochs, seed = 1, threads = 0, log_every = cfg.log_every;
    long n_train = cfg.n_train, n_val = cfg.n_val, n_test = 0;
    double lr = NAN, momentum = NAN, ema = 0; /* NAN: not given, the optimizer's */
    double weight_decay = NAN, clip_norm = 0, lr_gamma = NAN;
    long warmup_steps = 0, warmup_epochs = 0, lr_step_every = 0;
    const char *augment = NULL;
    char lr_text[200], momentum_text[80], batch_text[80];
    snprintf(batch_text, sizeof batch_text, "records per step (default: %d)", cfg.batch);
    lr_help(lr_text, sizeof lr_text);
    snprintf(momentum_text, sizeof momentum_text, "momentum for momentum/nesterov (default: %g)",
             (double)dp_optim_defaults(DP_OPTIM_MOMENTUM).momentum);
    bool no_progress = false, quiet = false, keep_best = false, verbose = false;
    const char *log_level = NULL;
    const char *stream = "auto", *data_memory = NULL;
    long shuffle_window = 0, hash_buckets = 0;
    const cli_opt generic[] = {
        {"", CLI_SECTION, NULL, NULL, "data", 0, 0},
        {"dataset", CLI_STR, &dataset, "NAME|PATH", "mnist, fashion-mnist, kmnist, a directory of IDX files, or TFRecord, NumPy or CSV files: a directory, a glob or a file (docs/datasets.md)", 0, 0},
        {"train-size", CLI_INT, &n_train, "N", "training records (the first N of the training file)", 1, 100000000},
        {"val-size", CLI_INT, &n_val, "N", "validation records (the next N)", 0, 100000000},
        {"test-size", CLI_INT, &n_test, "N", "test records evaluated at the end (the first N; 0: all)", 0, 100000000},
        {"image-feature", CLI_STR, &cfg.data.data.image, "NAME", "TFRecord: the Example feature holding the inputs", 0, 0},
        {"label-feature", CLI_STR, &cfg.data.data.label, "NAME", "TFRecord: the Example feature holding the label (label); CSV: the label column (label when the header has it, else the first)", 0, 0},
        {"categorical", CLI_STR, &cfg.data.data.categorical, "NAMES", "CSV columns, Example int64 features or .npz arrays of categorical ids, NAME or NAME:M (up to M ids), joined by ','; the features are then these ids, then --numeric's (docs/datasets.md, \"Categorical and numeric columns\")", 0, 0},
        {"numeric", CLI_STR, &cfg.data.data.numeric, "NAMES", "CSV columns, Example features or .npz arrays of numeric features, joined by ','", 0, 0},
        {"hash-buckets", CLI_INT, &hash_buckets, "N", "hash each raw categorical id into [0, N) (0: ids are integers below their table's rows)", 0, 1L << 24},
        {"train-files", CLI_STR, &cfg.data.data.train, "PATTERN", "record files: base names of the training files", 0, 0},
        {"test-files", CLI_STR, &cfg.data.data.test, "PATTERN", "record files: base names of the test files", 0, 0},
        {"stream", CLI_STR, &stream, "MODE", "record files: auto (stream when the decoded records exceed --data-memory), on, off (always the decoded cache)", 0, 0},
        {"data-memory", CLI_STR, &data_memory, "SIZE", "record files: memory all decoded data may take: the cache, or streaming, the test and validation records and the stream together, e.g. 800M, 12G (default: $DOWNPOUR_DATA_MEMORY, else half the machine's memory)", 0, 0},
        {"shuffle-window", CLI_INT, &shuffle_window, "N", "streaming: records the shuffle window holds (0: as many as --data-memory leaves beside the test and validation records)", 0, 1L << 31},
        {"shard", CLI_STR, &shard, "POLICY", "how workers split the records: off, data, file", 0, 0},
        {"augment", CLI_STR, &augment, "SPEC", "training images: crop:P (shift up to P pixels each way, zeros in: a random crop with padding P), flip (left-right, half the time), or crop:P,flip; drawn per record and epoch from --seed (default: none)", 0, 0},
        {"", CLI_SECTION, NULL, NULL, "model", 0, 0},
        {"model", CLI_STR, &model, "SPEC", dp_model_spec_help(), 0, 0},
        {"device", CLI_STR, &device, "DEV", "where trainers compute: cpu (the default), cuda, cuda:N (a GPU), or sim (the GPU code path run on the host, for tests); docs/gpu.md", 0, 0},
        {"", CLI_SECTION, NULL, NULL, "optimisation", 0, 0},
        {"batch", CLI_INT, &batch, "N", batch_text, 1, 65536},
        {"global-batch", CLI_INT, &global_batch, "N", "records per step over all workers, in place of --batch (0: --batch's): each worker takes N / workers, N a multiple of the workers; a checkpoint then resumes on any number of workers dividing N (docs/strategies.md)", 1, 1L << 24},
        {"sum-chunk", CLI_INT, &sum_chunk, "C", "ps-sync with --global-batch: push each worker's gradient as chunks of C records that the shards add in the step's order, so any number of workers whose share C divides ends with the same bits (0: off; docs/strategies.md)", 1, 65536},
        {"epochs", CLI_INT, &epochs, "N", "passes over the training split", 1, 100000},
        {"optimizer", CLI_STR, &optimizer, "NAME", "sgd, momentum, nesterov, adagrad, adam, or adamw (adam with decoupled weight decay, as torch.optim.AdamW)", 0, 0},
        {"lr", CLI_NUM, &lr, "X", lr_text, -INFINITY, INFINITY},
        {"lr-schedule", CLI_STR, &lr_schedule, "NAME", "constant; cosine: decay to 0 over the run after the warm-up; step: times --lr-gamma every --lr-step-every epochs (torch's StepLR)", 0, 0},
        {"lr-step-every", CLI_INT, &lr_step_every, "E", "--lr-schedule step: epochs between decays (required there)", 1, 100000},
        {"lr-gamma", CLI_NUM, &lr_gamma, "G", "--lr-schedule step: the factor at each decay, in (0, 1] (default: 0.1)", -INFINITY, INFINITY},
        {"warmup-steps", CLI_INT, &warmup_steps, "N", "raise the rate linearly over the first N steps (step k at lr*(k+1)/N), then the schedule (0: none)", 0, 1000000000000L},
        {"warmup-epochs", CLI_INT, &warmup_epochs, "E", "the same warm-up over the first E epochs", 0, 100000},
        {"momentum", CLI_NUM, &momentum, "X", momentum_text, -INFINITY, INFINITY},
        {"weight-decay", CLI_NUM, &weight_decay, "W", "adamw: p -= lr*W*p each step (default 0.01); the others: L2, the gradient += W*p, as torch.optim's weight_decay (default 0)", -INFINITY, INFINITY},
        {"clip-norm", CLI_NUM, &clip_norm, "C", "clip the whole gradient to global norm C before each update, as torch.nn.utils.clip_grad_norm_ (0: off)", -INFINITY, INFINITY},
        {"ema", CLI_NUM, &ema, "DECAY", "evaluate and save a moving average of the weights (0: off)", 0, 0.999999},
        {"keep-best", CLI_FLAG, &keep_best, NULL, "test and save the epoch with the best validation accuracy", 0, 0},
        {"seed", CLI_INT, &seed, "N", "seed of the weights and of the data order", 0, 0x7fffffffL},
        {"threads", CLI_INT, &threads, "N", "BLAS threads (0: OPENBLAS_NUM_THREADS or all cores)", 0, 1024},
        {"", CLI_SECTION, NULL, NULL, "strategy (docs/strategies.md)", 0, 0},
        {"strategy", CLI_STR, &strategy, "NAME", dp_strategy_names(), 0, 0},
        {"collective-timeout", CLI_NUM, &collective_timeout, "S", "allreduce: seconds to wait for a late rank", 1, 86400},
        {"straggler", CLI_STR, &straggler, "K:MS", "slow worker K by MS milliseconds a step (experiments)", 0, 0},
        {"trace-clocks", CLI_FLAG, &trace_clocks, NULL, "a metrics line per step with the worker's clock", 0, 0},
        {"", CLI_SECTION, NULL, NULL, "cluster (docs/cluster.md)", 0, 0},
        {"transport", CLI_STR, &transport, "NAME", "tcp (launch, run) or mpi (mpirun, srun)", 0, 0},
        {"ps", CLI_INT, &mpi_ps, "P", "mpi: ranks 1..P are ps tasks (rank 0 is the chief)", 0, 4096},
        {"secret-file", CLI_STR, &secret_file, "FILE", "cluster secret (default: $DOWNPOUR_SECRET)", 0, 0},
        {"encrypt", CLI_FLAG, &cfg.encrypt, NULL, "cluster: encrypt payloads between tasks (every task must agree)", 0, 0},
        {"startup-timeout", CLI_NUM, &startup_timeout, "S", "cluster: seconds to wait for every peer at startup", 1, 86400},
        {"spare-workers", CLI_INT, &spare_workers, "N", "cluster: the spec's last N worker slots start empty; a task started for one joins the running job", 0, 4095},
        {"heartbeat-timeout", CLI_NUM, &heartbeat_timeout, "S", "cluster: seconds of silence before a peer is lost", 0.5, 3600},
        {"link-delay-ms", CLI_NUM, &link_delay_ms, "MS", "cluster, tcp: every frame this task sends waits MS ms first (a one-way latency per message, for experiments; docs/cluster.md)", 0, DP_TCP_MAX_LINK_DELAY_MS},
        {"no-shm", CLI_FLAG, &cfg.no_shm, NULL, "cluster, tcp: tasks on this host talk over TCP, not shared memory (as DOWNPOUR_SHM=0)", 0, 0},
        {"", CLI_SECTION, NULL, NULL, "output", 0, 0},
        {"log-every", CLI_INT, &log_every, "N", "steps between step lines and train_loss records in --metrics and --tensorboard (0: none)", 0, 100000000},
        {"quiet", CLI_FLAG, &quiet, NULL, "no step lines on stderr (the --log-every records stay)", 0, 0},
        {"no-progress", CLI_FLAG, &no_progress, NULL, "no progress bar even on a terminal", 0, 0},
        CLI_LOG_OPTS(&log_level, &verbose),
        {"metrics", CLI_STR, &metrics, "FILE", "write JSON Lines metrics to FILE", 0, 0},
        {"trace", CLI_STR, &trace, "FILE", "write a timeline of every span (Chrome trace format, docs/trace.md)", 0, 0},
        {"tensorboard", CLI_STR, &tensorboard, "DIR", "write TensorBoard scalars under DIR (a cluster task: DIR/<type>-<index>)", 0, 0},
        {"save", CLI_STR, &save, "FILE", "save the trained weights as safetensors", 0, 0},
        {"checkpoint-dir", CLI_STR, &checkpoint_dir, "DIR", "write training-state checkpoints here (made if missing); one that cannot be written is a warning, and the run goes on and exits 3", 0, 0},
        {"checkpoint-every", CLI_INT, &checkpoint_every, "N", "steps between checkpoints (0: only at the end)", 0, 1000000000000L},
        {"keep-checkpoints", CLI_INT, &keep_checkpoints, "K", "keep the newest K checkpoints", 1, 1000},
        {"resume", CLI_FLAG, &resume, NULL, "continue from the newest valid checkpoint in --checkpoint-dir", 0, 0},
    };
    /* Each strategy's options (its dp_strategy_conf) follow --strategy,
     * into that conf's own settings; the chosen strategy's are kept. */
    enum { N_GENERIC = (int)(sizeof generic / sizeof generic[0]), MAX_CONFS = 16 };
    static _Alignas(max_align_t) unsigned char settings[MAX_CONFS][DP_STRATEGY_CFG_MAX];
    const dp_strategy_conf *confs[MAX_CONFS];
    int n_confs = 0, n = 0, n_strategy_opts = 0;
    for (int i = 0; i < dp_strategy_count; i++) {
        const dp_strategy_conf *c = dp_strategies[i]->conf;
        bool seen = !c;
        for (int j = 0; j < n_confs && !seen; j++)
            seen = confs[j] == c;
        if (seen || n_confs == MAX_CONFS)
            continue;
        memcpy(settings[n_confs], c->defaults, c->size);
        confs[n_confs++] = c;
        n_strategy_opts += c->n_opts;
    }
    cli_opt *opts = malloc((size_t)(N_GENERIC + n_strategy_opts) * sizeof *opts);
    if (!opts) {
        fprintf(stderr, "%s: out of memory\n", g_who);
        return 1;
    }
    for (int i = 0; i < N_GENERIC; i++) {
        opts[n++] = generic[i];
        if (generic[i].kind != CLI_SECTION && strcmp(generic[i].name, "strategy") == 0)
            for (int j = 0; j < n_confs; j++)
                for (int k = 0; k < confs[j]->n_opts; k++)
                    if (!(confs[j]->opts[k].flags & DP_OPT_ALSO))
                        opts[n++] = cli_opt_of(&confs[j]->opts[k], settings[j]);
    }
    int rest;
    int r = cli_parse(USAGE, opts, n, argc, argv, &rest);
    /* an option two confs read (DP_OPT_ALSO) was parsed into the one
     * --help lists it under: the others get its value too */
    for (int j = 0; j < n_confs; j++) {
        for (int k2 = 0; k2 < confs[j]->n_opts; k2++) {
            const dp_opt *o = &confs[j]->opts[k2];
            for (int i = 0; i < n && (o->flags & DP_OPT_ALSO); i++)
                if (opts[i].kind != CLI_SECTION && strcmp(opts[i].name, o->name) == 0) {
                    static const size_t size[DP_OPT_KIND_COUNT] = {
                        [DP_OPT_STR] = sizeof(const char *), [DP_OPT_INT] = sizeof(int),
                        [DP_OPT_SIZE] = sizeof(size_t), [DP_OPT_NUM] = sizeof(double),
                        [DP_OPT_FLAG] = sizeof(bool)};
                    memcpy(settings[j] + o->offset, opts[i].dst, size[o->kind]);
                }
        }
    }
    free(opts);
    if (r == 0 && rest < argc) {
        fprintf(stderr, "%s: unexpected argument '%s' (see --help)\n", g_who, argv[rest]);
        r = -1;
    }
    if (r != 0)
        return r > 0 ? 0 : 2;
    if (cli_apply_log_level("train", log_level, verbose) < 0)
        return 2;

    dp_err err;
    cfg.strategy = strategy;
    const char *bad = !dp_strategy_find(strategy, &err)                             ? "--strategy"
                      : dp_lr_schedule_parse(lr_schedule, &cfg.lr_schedule, &err) < 0 ? "--lr-schedule"
                      : dp_shard_parse(shard, &cfg.shard, &err) < 0                 ? "--shard"
                      : dp_device_parse(device, &cfg.device, &err) < 0              ? "--device"
                                                                                    : NULL;
    char near[64];
    if (bad && strcmp(bad, "--strategy") == 0 &&
        cli_suggest_list(strategy, dp_strategy_names(), near, sizeof near)) {
        fprintf(stderr, "%s: --strategy: %s; did you mean --strategy %s?\n", g_who, err.msg,
                near);
        return 2;
    }
    if (bad) {
        fprintf(stderr, "%s: %s: %s\n", g_who, bad, err.msg);
        return 2;
    }
    long k = -1;
    double ms = 0;
    if (straggler && cli_parse_straggler(straggler, &k, &ms, &err) < 0) {
        fprintf(stderr, "%s: %s\n", g_who, err.msg);
        return 2;
    }
    /* the chosen strategy's settings, with the options it shares with the
     * strategy --help lists them under (DP_OPT_ALSO); the others' given
     * options refused where their strategy says so */
    const dp_strategy_ops *ops = dp_strategy_find(strategy, &err);
    for (int j = 0; j < n_confs; j++) {
        if (confs[j] != ops->conf) {
            if (confs[j]->foreign && confs[j]->foreign(settings[j], &cfg, &err) < 0) {
                fprintf(stderr, "%s: %s\n", g_who, err.msg);
                return 2;
            }
            continue;
        }
        cfg.strategy_conf = ops->conf;
        memcpy(cfg.strategy_cfg, settings[j], ops->conf->size);
    }
    if (straggler && check_straggler_cluster(straggler, k, topo, &err) < 0) {
        fprintf(stderr, "%s: %s\n", g_who, err.msg);
        return 2;
    }
    cfg.straggler = (int)k;
    cfg.straggler_ms = ms;
    cfg.trace_clocks = trace_clocks;
    cfg.ema = (float)ema;
    cfg.keep_best = keep_best;
    if (mpi_ps > 0 && strcmp(transport, "mpi") != 0) {
        fprintf(stderr, "%s: --ps %ld is for --transport mpi; a TCP cluster's ps tasks "
                        "come from its spec (downpour launch --ps, or the \"ps\" list)\n", g_who, mpi_ps);
        return 2;
    }
    cfg.transport = transport;
    cfg.mpi_ps = (int)mpi_ps;
    cfg.collective_timeout = collective_timeout;
    dp_optim_kind kind;
    if (dp_optim_parse_kind(optimizer, &kind, &err) < 0) {
        fprintf(stderr, "%s: --optimizer: %s\n", g_who, err.msg);
        return 2;
    }
    cfg.optim = dp_optim_defaults(kind);
    if (!isnan(lr)) {
        if (!(lr > 0 && lr <= 100)) {
            fprintf(stderr, "%s: --lr %g: the learning rate must be in (0, 100]. "
                            "Hint: leave --lr out for %s's default, %g\n", g_who,
                    lr, optimizer, (double)cfg.optim.lr);
            return 2;
        }
        cfg.optim.lr = (float)lr;
    }
    if (!isnan(momentum)) {
        if (!(momentum >= 0 && momentum <= 1)) {
            fprintf(stderr, "%s: --momentum %g: the momentum must be in [0, 1] "
                            "(default %g)\n", g_who,
                    momentum, (double)dp_optim_defaults(DP_OPTIM_MOMENTUM).momentum);
            return 2;
        }
        cfg.optim.momentum = (float)momentum;
    }
    if (!isnan(weight_decay)) {
        if (!(weight_decay >= 0 && weight_decay <= 1e6)) {
            fprintf(stderr, "%s: --weight-decay %g: the weight decay must be a finite "
                            "number >= 0 (typical: 5e-4 with sgd, 0.01 to 0.1 with adamw)\n", g_who,
                    weight_decay);
            return 2;
        }
        cfg.optim.weight_decay = (float)weight_decay;
    }
    if (kind == DP_OPTIM_ADAMW && (double)cfg.optim.lr * cfg.optim.weight_decay >= 1.0) {
        fprintf(stderr, "%s: --weight-decay %g: adamw multiplies every weight by "
                        "1 - lr*W each step, so lr*W (%g * %g) must be below 1\n", g_who,
                (double)cfg.optim.weight_decay, (double)cfg.optim.lr,
                (double)cfg.optim.weight_decay);
        return 2;
    }
    if (!(clip_norm >= 0 && clip_norm <= 1e30)) {
        fprintf(stderr, "%s: --clip-norm %g: the largest gradient norm must be a "
                        "finite number > 0 (0: no clipping)\n", g_who, clip_norm);
        return 2;
    }
    cfg.clip_norm = (float)clip_norm;
    if (warmup_steps > 0 && warmup_epochs > 0) {
        fprintf(stderr, "%s: --warmup-steps and --warmup-epochs say the same thing "
                        "twice: give one\n", g_who);
        return 2;
    }
    if (warmup_epochs > epochs) {
        fprintf(stderr, "%s: --warmup-epochs %ld: the warm-up is longer than the "
                        "run (--epochs %ld)\n", g_who, warmup_epochs, epochs);
        return 2;
    }
    cfg.warmup_steps = warmup_steps;
    cfg.warmup_epochs = (int)warmup_epochs;
    if (cfg.lr_schedule != DP_LR_STEP && (lr_step_every > 0 || !isnan(lr_gamma))) {
        fprintf(stderr, "%s: --lr-step-every and --lr-gamma are for --lr-schedule "
                        "step\n", g_who);
        return 2;
    }
    if (cfg.lr_schedule == DP_LR_STEP && lr_step_every == 0) {
        fprintf(stderr, "%s: --lr-schedule step needs --lr-step-every E, the epochs "
                        "between decays (e.g. --lr-step-every 10 --lr-gamma 0.1)\n", g_who);
        return 2;
    }
    if (!isnan(lr_gamma)) {
        if (!(lr_gamma > 0 && lr_gamma <= 1)) {
            fprintf(stderr, "%s: --lr-gamma %g: the factor at each decay must be in "
                            "(0, 1]\n", g_who, lr_gamma);
            return 2;
        }
        cfg.lr_gamma = (float)lr_gamma;
    }
    cfg.lr_step_every = (int)lr_step_every;
    if (dp_augment_parse(augment, &cfg.augment, &err) < 0) {
        fprintf(stderr, "%s: %s\n", g_who, err.msg);
        return 2;
    }
    if (dp_augment_on(&cfg.augment) && cfg.device.kind != DP_DEVICE_CPU) {
        fprintf(stderr, "%s: --augment: not with --device yet: the device gathers "
                        "the records itself (docs/training.md)\n", g_who);
        return 2;
    }
    cfg.dataset = dataset;
    if (strcmp(stream, "auto") == 0 || strcmp(stream, "on") == 0 || strcmp(stream, "off") == 0) {
        cfg.data.stream = stream[1] == 'u' ? -1 : stream[1] == 'n';
    } else {
        fprintf(stderr, "%s: --stream %s: expected auto, on or off\n", g_who, stream);
        return 2;
    }
    if (data_memory && dp_data_memory_parse(data_memory, &cfg.data.memory, "--data-memory", &err) < 0) {
        fprintf(stderr, "%s: %s\n", g_who, err.msg);
        return 2;
    }
    cfg.data.window = (uint32_t)shuffle_window;
    cfg.data.data.hash_buckets = (uint32_t)hash_buckets;
    cfg.model = model;
    if (check_model(model) < 0 || check_dataset(dataset) < 0)
        return 2;
    bool batch_given = batch > 0;
    if (batch_given && global_batch > 0) {
        fprintf(stderr, "%s: --batch %ld and --global-batch %ld: give one (--batch is each "
                        "worker's records a step, --global-batch all workers' together)\n",
                g_who, batch, global_batch);
        return 2;
    }
    if (global_batch > n_train) {
        fprintf(stderr, "%s: --global-batch %ld: a step cannot take more records than the "
                        "training split holds (--train-size %ld). Hint: --global-batch %ld or "
                        "less\n", g_who, global_batch, n_train, n_train);
        return 2;
    }
    if (global_batch > 0) {
        /* each worker's share: launch knows the workers now; a task alone
         * learns them when it joins its cluster (dp_train_run) */
        int share = (int)global_batch, w = topo && ops ? dp_strategy_trainers(ops, topo[0], topo[1]) : 1;
        if (topo && ops && ops->data_parallel &&
            (dp_global_batch_share((int)global_batch, w, &share, &err) < 0 ||
             dp_sum_chunk_check((int)sum_chunk, share, (int)global_batch, w, &err) < 0)) {
            fprintf(stderr, "%s: %s\n", g_who, err.msg);
            return 2;
        }
        batch = share;
        batch_given = true;
    }
    if (!batch_given)
        batch = cfg.batch;
    /* a --batch given above the records is a mistake; the default batch over
     * a few records (a quick test) takes them all in one step */
    if (batch_given && batch > n_train) {
        fprintf(stderr, "%s: --batch %ld: a step cannot take more records than the "
                        "training split holds (--train-size %ld). Hint: --batch %ld or less\n", g_who,
                batch, n_train, n_train);
        return 2;
    }
    cfg.batch = (int)batch;
    cfg.global_batch = (int)global_batch;
    cfg.sum_chunk = (int)sum_chunk;
    cfg.epochs = (int)epochs;
    cfg.seed = (uint64_t)seed;
    cfg.n_train = (uint32_t)n_train;
    cfg.n_val = (uint32_t)n_val;
    cfg.n_test = (uint32_t)n_test;
    cfg.threads = (int)threads;
    cfg.log_every = (int)log_every;
    cfg.quiet = quiet;
    cfg.progress = !no_progress && isatty(STDERR_FILENO);
    cfg.metrics_path = metrics;
    cfg.trace_path = trace;
    cfg.tensorboard_dir = tensorboard;
    cfg.save_path = save;
    if (resume && !checkpoint_dir) {
        fprintf(stderr, "%s: --resume needs --checkpoint-dir DIR, the directory "
                        "holding the checkpoints to continue from\n", g_who);
        return 2;
    }
    if (!checkpoint_dir && (checkpoint_every != cfg.checkpoint_every ||
                            keep_checkpoints != cfg.keep_checkpoints)) {
        fprintf(stderr, "%s: --checkpoint-every and --keep-checkpoints need "
                        "--checkpoint-dir DIR\n", g_who);
        return 2;
    }
    if (keep_best && n_val == 0) {
        fprintf(stderr, "%s: --keep-best picks the epoch with the best validation "
                        "accuracy, and --val-size 0 leaves no validation records\n", g_who);
        return 2;
    }
    /* the strategy: --device, --clip-norm and its own settings; against
     * launch's cluster first, without which it knows less (model-parallel's
     * split over every task) */
    if ((topo && dp_strategy_check_tasks(&cfg, topo[0], topo[1], topo[2], &err) < 0) ||
        dp_strategy_check(&cfg, &err) < 0) {
        fprintf(stderr, "%s: %s\n", g_who, err.msg);
        return 2;
    }
    if (ops->no_checkpoints && checkpoint_dir) {
        fprintf(stderr, "%s: --checkpoint-dir: --strategy %s writes no training-state "
                        "checkpoints (%s); --save keeps the final weights\n", g_who, ops->name,
                ops->no_checkpoints);
        return 2;
    }
    cfg.checkpoint_dir = checkpoint_dir;
    cfg.checkpoint_every = checkpoint_every;
    cfg.keep_checkpoints = (int)keep_checkpoints;
    cfg.resume = resume;
    cfg.secret_file = secret_file;
    cfg.startup_timeout = startup_timeout;
    cfg.heartbeat_timeout = heartbeat_timeout;
    cfg.spare_workers = (int)spare_workers;
    if (link_delay_ms > 0 && strcmp(transport, "tcp") != 0) {
        fprintf(stderr, "%s: --link-delay-ms is for --transport tcp (MPI has its own "
                        "network)\n", g_who);
        return 2;
    }
    cfg.link_delay_ms = link_delay_ms;
    if (spare_workers > 0 && strcmp(transport, "tcp") != 0) {
        fprintf(stderr, "%s: --spare-workers is for --transport tcp (an MPI job's ranks are "
                        "fixed when it starts)\n", g_who);
        return 2;
    }
    if (check_spares(spare_workers, ops, topo, &err) < 0) {
        fprintf(stderr, "%s: %s\n", g_who, err.msg);
        return 2;
    }
    /* what the options ask of the strategy (dp_strategy_check, above)
     * first, then the cluster: a hint to launch must not lead to a refusal
     * of the options themselves */
    if (check_outputs(save, metrics, checkpoint_dir, tensorboard, trace) < 0 ||
        check_topology(dp_strategy_find(strategy, &err), topo, transport, argc, argv) < 0)
        return 2;
    if (parsed)
        *parsed = cfg;
    if (topo)
        return 0; /* launch's check: each task trains */

    dp_train_result res;
    if (dp_train_run(&cfg, &res, &err) < 0) {
        fprintf(stderr, "%s: %s\n", g_who, err.msg);
        return 1;
    }
    if (res.checkpoints_missed > 0) {
        /* trained and saved, but not every checkpoint asked for is there */
        dp_warn("%d checkpoint(s) in %s could not be written (see the warnings above); the "
                "run trained and wrote its other outputs; exit status %d",
                res.checkpoints_missed, checkpoint_dir, DP_EXIT_CHECKPOINTS_MISSED);
        return DP_EXIT_CHECKPOINTS_MISSED;
    }
    return 0;
}

int cmd_train(int argc, char **argv)
{
    return train_main(argc, argv, NULL, NULL);
}

int cli_train_check(int argc, char **argv, int chief, int workers, int ps)
{
    dp_train_config cfg;
    return cli_train_parse(argc, argv, chief, workers, ps, &cfg);
}

int cli_train_parse(int argc, char **argv, int chief, int workers, int ps, dp_train_config *cfg)
{
    int topo[3] = {chief, workers, ps};
    bool help = false;
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        help |= strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0;
    g_who = "downpour launch";
    int rc = train_main(argc, argv, topo, cfg);
    g_who = "downpour train";
    return help && rc == 0 ? -1 : rc; /* -1: help printed, nothing to start */
}
