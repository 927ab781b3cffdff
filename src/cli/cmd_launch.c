/* downpour launch: a whole cluster as local processes on loopback ports. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "downpour/cluster.h"
#include "downpour/launcher.h"
#include "downpour/model.h"
#include "downpour/status.h"
#include "downpour/strategy.h"
#include "downpour/train.h"

#define LAUNCH_USAGE                                                                      \
    "downpour launch --workers N [--ps P] [--chief] [--grace S] [--] train|ping [OPTIONS]\n" \
    "\n"                                                                                  \
    "Starts the tasks of a cluster as local processes on free 127.0.0.1 ports, each\n"   \
    "running `downpour train ...` (or `ping`) with its DOWNPOUR_CONFIG, a fresh secret\n" \
    "and OPENBLAS_NUM_THREADS = cores / tasks (unless set). Output lines are prefixed\n"  \
    "with the task ([worker 2] ...). SIGINT/SIGTERM are forwarded to every task; when\n"  \
    "a task fails, the strategy decides: a task the run survives losing (a worker in\n"  \
    "the ps strategies) is restarted while it has --max-restarts left and rejoins,\n"     \
    "else the run goes on without it; otherwise the others get SIGTERM, then SIGKILL\n"   \
    "after the grace period, and launch exits with the failed task's status. A task\n"    \
    "that exits 3 (trained and saved, but some checkpoint not written) is no failure:\n"  \
    "nothing is restarted or stopped, and launch exits 3 when no task failed. With\n"     \
    "--metrics FILE in the train options, task T writes FILE.<type>-<index> and FILE\n"   \
    "gets all of them merged, with one \"fault\" event per fault."

#define LAUNCH_MAX_TASKS 256

/* What the launcher asks about the tasks' run: the train command's
 * --strategy and --ps-replicas. */
typedef struct task_run {
    const dp_strategy_ops *ops;
    long ps_replicas;
} task_run;

/* The strategy's answer to "does the run go on without this task".  A ps
 * task is survivable where the strategy has ps tasks: each shard has a
 * backup (--ps-replicas 2, docs/faults.md) and fails over, or the ps is
 * restarted and reloads its shard from the newest checkpoint. */
static int strategy_survives(void *ctx, const dp_task *task, char *why, size_t cap)
{
    const task_run *run = ctx;
    const dp_strategy_ops *ops = run->ops;
    if (task->role == DP_ROLE_PS && run->ps_replicas >= 2 && ops->talks_to[DP_ROLE_PS]) {
        /* Not restarted: the clients stay with the backups, and a fresh ps
         * would hold the initial parameters. */
        snprintf(why, cap, "%s survives a lost ps with --ps-replicas %ld: its shards go on on "
                 "their backups", ops->name, run->ps_replicas);
        return DP_LAUNCH_NO_RESTART;
    }
    if (task->role == DP_ROLE_PS && ops->talks_to[DP_ROLE_PS]) {
        /* Restarted, it reloads its shard from the newest checkpoint. */
        snprintf(why, cap, "%s survives a lost ps that is restarted: it reloads its shard from "
                 "the newest checkpoint", ops->name);
        return DP_LAUNCH_IF_RESTARTED;
    }
    if (ops->survives & ops->no_rejoin & DP_ROLE_BIT(task->role)) {
        snprintf(why, cap, "%s survives a lost %s, and does not take a restarted one back",
                 ops->name, dp_role_name(task->role));
        return DP_LAUNCH_NO_RESTART;
    }
    snprintf(why, cap, "%s %s a lost %s", ops->name,
             ops->survives & DP_ROLE_BIT(task->role) ? "survives" : "cannot survive",
             dp_role_name(task->role));
    return (ops->survives & DP_ROLE_BIT(task->role)) != 0;
}

/* The strategy the tasks will run (the train command's --strategy), its
 * --ps-replicas, its --straggler (NULL: none), --model (NULL: the default)
 * and whether it asks --sync-bn. */
static const dp_strategy_ops *task_strategy(int argc, char **argv, long *ps_replicas,
                                            const char **straggler, const char **model,
                                            bool *sync_bn, dp_err *err)
{
    *ps_replicas = 1;
    *straggler = NULL;
    *model = NULL;
    *sync_bn = false;
    if (strcmp(argv[0], "train") != 0)
        return NULL;
    const char *name = "single";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0)
            break;
        if (strcmp(argv[i], "--strategy") == 0 && i + 1 < argc)
            name = argv[++i];
        else if (strncmp(argv[i], "--strategy=", 11) == 0)
            name = argv[i] + 11;
        else if (strcmp(argv[i], "--ps-replicas") == 0 && i + 1 < argc)
            *ps_replicas = atol(argv[++i]);
        else if (strncmp(argv[i], "--ps-replicas=", 14) == 0)
            *ps_replicas = atol(argv[i] + 14);
        else if (strcmp(argv[i], "--straggler") == 0 && i + 1 < argc)
            *straggler = argv[++i];
        else if (strncmp(argv[i], "--straggler=", 12) == 0)
            *straggler = argv[i] + 12;
        else if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
            *model = argv[++i];
        else if (strncmp(argv[i], "--model=", 8) == 0)
            *model = argv[i] + 8;
        else if (strcmp(argv[i], "--sync-bn") == 0)
            *sync_bn = true;
    }
    return dp_strategy_find(name, err);
}

int cmd_launch(int argc, char **argv)
{
    long workers = 2, ps = 0;
    bool chief = false;
    double grace = DP_LAUNCH_GRACE;
    long max_restarts = 0;
    const cli_opt opts[] = {
        {"workers", CLI_INT, &workers, "N", "worker tasks", 1, LAUNCH_MAX_TASKS},
        {"ps", CLI_INT, &ps, "P", "parameter-server tasks", 0, LAUNCH_MAX_TASKS},
        {"chief", CLI_FLAG, &chief, NULL, "add a chief task (rank 0)", 0, 0},
        {"grace", CLI_NUM, &grace, "S", "seconds between SIGTERM and SIGKILL when stopping",
         0.1, 3600},
        {"max-restarts", CLI_INT, &max_restarts, "N",
         "restart a failed task up to N times when its strategy survives losing it", 0, 1000},
    };
    int rest = 0;
    int rc = cli_parse(LAUNCH_USAGE, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, &rest);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    if (rest >= argc) {
        fprintf(stderr, "downpour launch: no task command. Hint: downpour launch --workers 2 "
                        "-- train --strategy ps-async ...\n");
        return 2;
    }
    if (!cli_is_task_command(argv[rest])) {
        fprintf(stderr, "downpour launch: '%s': the tasks run `downpour train` or `downpour ping`, "
                        "so the command after the launch options must start with one of them\n",
                argv[rest]);
        return 2;
    }
    int n = (chief ? 1 : 0) + (int)workers + (int)ps;
    if (n > LAUNCH_MAX_TASKS) {
        fprintf(stderr, "downpour launch: %d tasks, at most %d on one machine\n", n,
                LAUNCH_MAX_TASKS);
        return 2;
    }

    int ports[LAUNCH_MAX_TASKS];
    dp_err err;
    task_run run = {0};
    const char *straggler, *model;
    bool sync_bn;
    const dp_strategy_ops *strategy = task_strategy(argc - rest, argv + rest, &run.ps_replicas,
                                                    &straggler, &model, &sync_bn, &err);
    run.ops = strategy;
    if (!strategy && strcmp(argv[rest], "train") == 0) {
        fprintf(stderr, "downpour launch: --strategy: %s\n", err.msg);
        return 2;
    }
    /* Known here before any task starts: the tasks would each refuse it. */
    long k;
    double ms;
    if (straggler && (cli_parse_straggler(straggler, &k, &ms, &err) < 0 ||
                      cli_check_straggler(straggler, k, chief, (int)workers, &err) < 0)) {
        fprintf(stderr, "downpour launch: %s\n", err.msg);
        return 2;
    }
    /* A model with buffers under a strategy without a rule for them (a
     * spec the tasks cannot parse is theirs to refuse, with its usage). */
    if (strategy && model && !strategy->buffers) {
        dp_model m;
        memset(&m, 0, sizeof m);
        int bad = dp_model_init(&m, model, 1, 1, &err) == 0 &&
                  dp_train_check_buffers(&m, strategy->name, &err) < 0;
        dp_model_free(&m);
        if (bad) {
            fprintf(stderr, "downpour launch: %s\n", err.msg);
            return 2;
        }
    }
    /* --sync-bn against the strategy and the model, as each task would
     * refuse it (--device is the tasks' to check) */
    dp_train_config sb = dp_train_defaults();
    sb.strategy = strategy ? strategy->name : sb.strategy;
    sb.model = model ? model : sb.model;
    sb.sync_bn = sync_bn;
    if (strategy && dp_train_check_sync_bn(&sb, &err) < 0) {
        fprintf(stderr, "downpour launch: %s\n", err.msg);
        return 2;
    }
    dp_cluster c;
    if (dp_launch_free_ports(ports, n, &err) < 0 ||
        dp_cluster_local(&c, chief ? 1 : 0, (int)workers, (int)ps, ports, &err) < 0) {
        fprintf(stderr, "downpour launch: %s\n", err.msg);
        return 1;
    }
    /* The tasks run this very program: /proc/self/exe, then the train arguments. */
    int targc = argc - rest + 1;
    char **cmd = calloc((size_t)targc + 1, sizeof *cmd);
    if (!cmd) {
        dp_cluster_free(&c);
        fprintf(stderr, "downpour launch: out of memory\n");
        return 1;
    }
    cmd[0] = "/proc/self/exe";
    for (int i = rest; i < argc; i++)
        cmd[i - rest + 1] = argv[i];
    dp_launch_opts lo = {.cluster = &c, .argc = targc, .argv = cmd, .grace_seconds = grace,
                         .survives = strategy ? strategy_survives : NULL,
                         .survives_ctx = &run, .max_restarts = (int)max_restarts};
    int status = dp_launch(&lo, &err);
    if (status != 0)
        fprintf(stderr, "downpour launch: %s\n", err.msg);
    free(cmd);
    dp_cluster_free(&c);
    return status;
}
