/* downpour launch: a whole cluster as local processes on loopback ports. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "downpour/cluster.h"
#include "downpour/launcher.h"
#include "downpour/status.h"

#define LAUNCH_USAGE                                                                      \
    "downpour launch --workers N [--ps P] [--chief] [--grace S] [--] train|ping [OPTIONS]\n" \
    "\n"                                                                                  \
    "Starts the tasks of a cluster as local processes on free 127.0.0.1 ports, each\n"   \
    "running `downpour train ...` (or `ping`) with its DOWNPOUR_CONFIG, a fresh secret\n" \
    "and OPENBLAS_NUM_THREADS = cores / tasks (unless set). Output lines are prefixed\n"  \
    "with the task ([worker 2] ...). SIGINT/SIGTERM are forwarded to every task; when\n"  \
    "one task fails the others get SIGTERM, then SIGKILL after the grace period, and\n"   \
    "launch exits with the failed task's status. With --metrics FILE in the train\n"      \
    "options, task T writes FILE.<type>-<index> and FILE gets all of them merged."

#define LAUNCH_MAX_TASKS 256

int cmd_launch(int argc, char **argv)
{
    long workers = 2, ps = 0;
    bool chief = false;
    double grace = DP_LAUNCH_GRACE;
    const cli_opt opts[] = {
        {"workers", CLI_INT, &workers, "N", "worker tasks", 1, LAUNCH_MAX_TASKS},
        {"ps", CLI_INT, &ps, "P", "parameter-server tasks", 0, LAUNCH_MAX_TASKS},
        {"chief", CLI_FLAG, &chief, NULL, "add a chief task (rank 0)", 0, 0},
        {"grace", CLI_NUM, &grace, "S", "seconds between SIGTERM and SIGKILL when stopping",
         0.1, 3600},
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
    dp_launch_opts lo = {.cluster = &c, .argc = targc, .argv = cmd, .grace_seconds = grace};
    int status = dp_launch(&lo, &err);
    if (status != 0)
        fprintf(stderr, "downpour launch: %s\n", err.msg);
    free(cmd);
    dp_cluster_free(&c);
    return status;
}
