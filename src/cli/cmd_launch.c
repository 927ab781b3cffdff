/* downpour launch: a whole cluster as local processes on loopback ports. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "downpour/cluster.h"
#include "downpour/launcher.h"
#include "downpour/log.h"
#include "downpour/model.h"
#include "downpour/status.h"
#include "downpour/strategy.h"
#include "downpour/train.h"

#define LAUNCH_USAGE                                                                      \
    "downpour launch [--workers N] [--ps P] [--chief] -- train|ping [OPTIONS]\n"          \
    "downpour launch [--workers N] [--ps P] [--chief] -- PROGRAM [ARGS]\n"                \
    "\n"                                                                                  \
    "Starts the tasks of a cluster as local processes on free 127.0.0.1 ports, each\n"   \
    "running `downpour train ...` (or `ping`) with its DOWNPOUR_CONFIG, a fresh\n"       \
    "secret and OPENBLAS_NUM_THREADS = cores / tasks (unless set). Lines are prefixed\n"  \
    "with the task ([worker 2] ...). SIGINT/SIGTERM are forwarded to every task; when\n" \
    "a task fails, the strategy decides: a task the run survives losing (a worker in\n"  \
    "the ps strategies) is restarted while it has --max-restarts left and rejoins,\n"    \
    "else the run goes on without it; a task whose loss the run survives only from\n"    \
    "its checkpoints (lbfgs's chief or ps, any pipeline or model-parallel task, with\n"  \
    "--checkpoint-dir) has every task started again with --resume while the job has\n"  \
    "--max-restarts left; otherwise the others get SIGTERM, then SIGKILL after the\n"   \
    "grace period, and launch exits with the failed task's status. A task that exits\n" \
    "3 (trained and saved, but some checkpoint not written) is no failure: nothing is\n" \
    "restarted or stopped, and launch exits 3 when no task failed. With --metrics\n"    \
    "FILE in the train options, task T writes FILE.<type>-<index> and FILE gets all\n"  \
    "of them merged, with one \"fault\" event per fault. With --trace FILE, the tasks'\n"\
    "timelines are merged into FILE on one time axis (docs/trace.md).\n"                 \
    "With --spare-workers N in the train options, the last N worker slots are not\n"  \
    "started: each SIGUSR1 to launch starts one, which joins the running job (its\n"    \
    "data dealt at the next epoch); SIGTERM to a worker drains it (docs/cluster.md).\n" \
    "\n"                                                                                  \
    "Without --strategy in the train options, the tasks train with allreduce, or with\n"  \
    "ps-async when --ps is given; a strategy that needs a chief (the ps ones, lbfgs)\n"   \
    "gets one without --chief. The train options and the strategy are checked against\n" \
    "the cluster once, before any task starts: a usage error exits 2. mpirun's -np is\n" \
    "refused: give --workers N (and --ps P, --chief).\n"                                 \
    "\n"                                                                                  \
    "Any other PROGRAM (a path, or a name found on PATH) runs as every task, with the\n"   \
    "same environment, restarts and merged metrics: a Python script that trains\n"        \
    "through downpour.torch (docs/python.md, \"PyTorch\"). Give it --strategy S among\n"  \
    "its ARGS so launch knows the strategy (its chief and restart policy); launch\n"     \
    "does not check ARGS otherwise."

#define LAUNCH_MAX_TASKS 256

/* What the launcher asks about the tasks' run: their strategy and its
 * settings, as train's own parser read them (cli_train_parse). */
typedef struct task_run {
    const dp_strategy_ops *ops;
    dp_train_config cfg;
    bool parsed;
} task_run;

/* The strategy's answer to "does the run go on without this task"
 * (its restart policy: dp_strategy_restart). */
static int strategy_survives(void *ctx, const dp_task *task, char *why, size_t cap)
{
    const task_run *run = ctx;
    const dp_strategy_ops *ops = run->ops;
    const void *settings = run->parsed && ops->conf ? dp_strategy_settings(&run->cfg, ops->conf)
                                                    : NULL;
    int checkpoints = run->parsed && run->cfg.checkpoint_dir;
    return dp_strategy_restart(ops, settings, task->role, checkpoints, why, cap);
}

/* The value of train flag `name` at argv[*i] ("--name V" or "--name=V"),
 * moving *i past it; NULL when argv[*i] is another flag. */
static const char *flag_value(int argc, char **argv, int *i, const char *name)
{
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0)
        return NULL;
    if (argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (argv[*i][n] == '\0' && *i + 1 < argc)
        return argv[++*i];
    return NULL;
}

/* The train command's --strategy (NULL: not given, launch's default): read
 * before the parse, which needs the default spelt out and the chief added;
 * the other flags come from the parse itself (cli_train_parse). */
static const char *task_strategy_name(int argc, char **argv)
{
    if (strcmp(argv[0], "train") != 0)
        return NULL;
    const char *name = NULL, *v;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0)
            break;
        if ((v = flag_value(argc, argv, &i, "--strategy")))
            name = v;
    }
    return name;
}

/* What each task would refuse before training that train's parse, being
 * one process, cannot see (a model with buffers under a strategy without a
 * rule for them): 0, or -1 with the message.  The options themselves, the
 * strategy's settings and --straggler against this cluster were checked by
 * cli_train_parse. */
static int check_task_flags(const dp_strategy_ops *strategy, const dp_train_config *cfg,
                            dp_err *err)
{
    if (strategy->buffers)
        return 0;
    dp_model m;
    dp_err ignored;
    memset(&m, 0, sizeof m);
    int bad = dp_model_describe(&m, cfg->model, &ignored) == 0 &&
              dp_strategy_check_buffers(&m, strategy->name, err) < 0;
    dp_model_free(&m);
    return bad ? -1 : 0;
}

/* A program's path: as given when it has a slash, else the first
 * executable of that name on PATH (execve does not search it).  Writes
 * into buf; NULL when there is none. */
static const char *find_program(const char *name, char *buf, size_t cap)
{
    if (strchr(name, '/'))
        return access(name, X_OK) == 0 ? name : NULL;
    const char *path = getenv("PATH");
    for (const char *p = path ? path : "/usr/bin:/bin"; *p;) {
        size_t n = strcspn(p, ":");
        if (n > 0 && (size_t)snprintf(buf, cap, "%.*s/%s", (int)n, p, name) < cap &&
            access(buf, X_OK) == 0)
            return buf;
        p += n + (p[n] == ':');
    }
    return NULL;
}

/* --strategy S among a program's arguments (the script's own flag, read
 * only to know the run's strategy), or NULL. */
static const char *program_strategy(int argc, char **argv)
{
    const char *name = NULL, *v;
    for (int i = 1; i < argc; i++)
        if ((v = flag_value(argc, argv, &i, "--strategy")))
            name = v;
    return name;
}

/* mpirun's "-np N" (or "-n N") among launch's options: refused, with the
 * command that means it ("--workers N"), since launch counts tasks by role. */
static int refuse_np(int argc, char **argv)
{
    int at = -1;
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0 && !cli_is_task_command(argv[i]); i++)
        if (strcmp(argv[i], "-np") == 0 || strcmp(argv[i], "-n") == 0 ||
            strncmp(argv[i], "-np=", 4) == 0) {
            at = i;
            break;
        }
    if (at < 0)
        return 0;
    char hint[2048] = "downpour launch";
    size_t n = strlen(hint);
    for (int i = 1; i < argc && n < sizeof hint; i++) {
        if (i == at) {
            const char *v = strchr(argv[i], '=');
            v = v ? v + 1 : i + 1 < argc ? argv[++i] : "2";
            n += (size_t)snprintf(hint + n, sizeof hint - n, " --workers %s", v);
        } else {
            n += (size_t)snprintf(hint + n, sizeof hint - n, " %s", argv[i]);
        }
    }
    fprintf(stderr, "downpour launch: %s is mpirun's flag; launch counts its tasks by role: "
                    "--workers N (and --ps P, --chief). Hint: %s\n", argv[at], hint);
    return 2;
}

int cmd_launch(int argc, char **argv)
{
    long workers = 2, ps = 0;
    bool chief = false;
    double grace = DP_LAUNCH_GRACE;
    long max_restarts = 0;
    const char *log_level = NULL;
    bool verbose = false;
    const cli_opt opts[] = {
        {"workers", CLI_INT, &workers, "N", "worker tasks", 1, LAUNCH_MAX_TASKS},
        {"ps", CLI_INT, &ps, "P", "parameter-server tasks", 0, LAUNCH_MAX_TASKS},
        {"chief", CLI_FLAG, &chief, NULL, "add a chief task (rank 0)", 0, 0},
        {"grace", CLI_NUM, &grace, "S", "seconds between SIGTERM and SIGKILL when stopping",
         0.1, 3600},
        {"max-restarts", CLI_INT, &max_restarts, "N",
         "restart a failed task up to N times when its strategy survives losing it", 0, 1000},
        CLI_LOG_OPTS(&log_level, &verbose), /* the launcher's and, inherited, its tasks' */
    };
    int rest = 0;
    if (refuse_np(argc, argv))
        return 2;
    int rc = cli_parse(LAUNCH_USAGE, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, &rest);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    if (cli_apply_log_level("launch", log_level, verbose) < 0)
        return 2;
    if (rest >= argc) {
        fprintf(stderr, "downpour launch: no task command. Hint: downpour launch --workers 2 "
                        "-- train\n");
        return 2;
    }
    dp_err err;
    static task_run run; /* the launch's life: dp_launch asks it */
    bool train = strcmp(argv[rest], "train") == 0;
    bool program = !cli_is_task_command(argv[rest]);
    static char program_path[4096];
    const char *prog = program ? find_program(argv[rest], program_path, sizeof program_path)
                               : NULL;
    if (program && !prog) {
        fprintf(stderr, "downpour launch: '%s': neither train nor ping, nor a program found%s "
                        "(docs/python.md, \"PyTorch\")\n",
                argv[rest], strchr(argv[rest], '/') ? "" : " on PATH");
        return 2;
    }
    const char *strategy_name = program ? program_strategy(argc - rest, argv + rest)
                                        : task_strategy_name(argc - rest, argv + rest);
    const dp_strategy_ops *strategy = strategy_name ? dp_strategy_find(strategy_name, &err) : NULL;
    if (program && !strategy) { /* the script's own --strategy, else launch's default */
        if (!(strategy = dp_strategy_find(strategy_name ? strategy_name
                                          : ps > 0        ? "ps-async"
                                                          : "allreduce",
                                          &err))) {
            fprintf(stderr, "downpour launch: %s: --strategy: %s\n", argv[rest], err.msg);
            return 2;
        }
    }
    if (train && !strategy_name) /* the default: docs/cluster.md, "A local cluster" */
        strategy = dp_strategy_find(ps > 0 ? "ps-async" : "allreduce", &err);
    run.ops = strategy;
    if (train && !strategy) { /* train's own check says it, with a suggestion */
        char *sub[] = {argv[rest], "--strategy", (char *)strategy_name, NULL};
        cli_train_check(3, sub, 0, 1, 0);
        return 2;
    }
    bool add_chief = strategy && (strategy->needs & DP_ROLE_BIT(DP_ROLE_CHIEF)) && !chief;
    if (add_chief)
        chief = true; /* it starts, evaluates and ends the run: no run without one */
    int n = (chief ? 1 : 0) + (int)workers + (int)ps;
    if (n > LAUNCH_MAX_TASKS) {
        fprintf(stderr, "downpour launch: %d tasks, at most %d on one machine\n", n,
                LAUNCH_MAX_TASKS);
        return 2;
    }
    int ports[LAUNCH_MAX_TASKS];
    /* The tasks run this very program: /proc/self/exe, then the train
     * arguments, with the default strategy spelt out when none was given. */
    bool add = train && !strategy_name;
    int targc = argc - rest + 1 + (add ? 2 : 0);
    char **cmd = calloc((size_t)targc + 1, sizeof *cmd);
    if (!cmd) {
        fprintf(stderr, "downpour launch: out of memory\n");
        return 1;
    }
    cmd[0] = program ? (char *)prog : "/proc/self/exe";
    int k = 1;
    if (!program)
        cmd[k++] = argv[rest];
    else
        targc--; /* the program is cmd[0] itself */
    if (add) {
        cmd[k++] = "--strategy";
        cmd[k++] = (char *)strategy->name;
    }
    for (int i = rest + 1; i < argc; i++)
        cmd[k++] = argv[i];
    /* Every option, and the strategy against this cluster, once here: not
     * the same refusal from every task. */
    if (train) {
        int crc = cli_train_parse(targc - 1, cmd + 1, chief ? 1 : 0, (int)workers, (int)ps,
                                  &run.cfg);
        run.parsed = crc == 0;
        if (crc != 0) {
            free(cmd);
            return crc < 0 ? 0 : crc;
        }
    }
    /* Known here before any task starts: the tasks would each refuse it. */
    if (train && check_task_flags(strategy, &run.cfg, &err) < 0) {
        fprintf(stderr, "downpour launch: %s\n", err.msg);
        free(cmd);
        return 2;
    }
    if (add_chief)
        dp_info("launch: %s needs a chief; added one (chief:0)", strategy->name);
    dp_cluster c;
    int listen_fds[LAUNCH_MAX_TASKS];
    if (dp_launch_free_ports(ports, listen_fds, n, &err) < 0 ||
        dp_cluster_local(&c, chief ? 1 : 0, (int)workers, (int)ps, ports, &err) < 0) {
        fprintf(stderr, "downpour launch: %s\n", err.msg);
        for (int i = 0; i < n; i++)
            if (listen_fds[i] >= 0)
                close(listen_fds[i]);
        free(cmd);
        return 1;
    }
    /* where the chief's part moves to another task (allreduce's leader), its
     * exit 0 does not end the run (it may have drained) */
    char why[160];
    dp_task chief_task = {.role = DP_ROLE_CHIEF};
    int hands_over = strategy && strategy_survives(&run, &chief_task, why, sizeof why) ==
                                     DP_LAUNCH_HANDS_OVER;
    dp_launch_opts lo = {.cluster = &c, .argc = targc, .argv = cmd, .grace_seconds = grace,
                         .survives = strategy ? strategy_survives : NULL,
                         .survives_ctx = &run, .max_restarts = (int)max_restarts,
                         .chief_hands_over = hands_over, .listen_fds = listen_fds,
                         .spare_workers = train ? run.cfg.spare_workers : 0};
    int status = dp_launch(&lo, &err);
    for (int i = 0; i < n; i++)
        close(listen_fds[i]);
    if (status != 0)
        fprintf(stderr, "downpour launch: %s\n", err.msg);
    free(cmd);
    dp_cluster_free(&c);
    return status;
}
