/* downpour run: one task of a multi-host cluster, started by hand on its host. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "downpour/cluster.h"
#include "downpour/log.h"
#include "downpour/status.h"

#define RUN_USAGE                                                                         \
    "downpour run [--cluster FILE] [--task TYPE:INDEX] [--] train|ping [OPTIONS]\n"      \
    "\n"                                                                                  \
    "Runs one task of a cluster in this process. The spec (TF_CONFIG format:\n"           \
    "{\"cluster\": {\"chief\": [..], \"worker\": [..], \"ps\": [..]}, \"task\": {..}}) comes\n" \
    "from --cluster FILE, else from DOWNPOUR_CONFIG, else from TF_CONFIG; --task\n"       \
    "overrides its \"task\".\n"                                                            \
    "Every task of the run needs the same DOWNPOUR_SECRET. See docs/cluster.md."

int cmd_run(int argc, char **argv)
{
    const char *cluster = NULL, *task = NULL;
    const cli_opt opts[] = {
        {"cluster", CLI_STR, &cluster, "FILE",
         "cluster spec JSON (default: $DOWNPOUR_CONFIG, else $TF_CONFIG)", 0, 0},
        {"task", CLI_STR, &task, "TYPE:INDEX",
         "this process's task, e.g. worker:0 (default: the spec's \"task\")", 0, 0},
    };
    int rest = 0;
    int rc = cli_parse(RUN_USAGE, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, &rest);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    if (rest >= argc) {
        fprintf(stderr, "downpour run: no command. Hint: downpour run --cluster cluster.json "
                        "--task worker:0 -- train --strategy ps-async ...\n");
        return 2;
    }
    if (!cli_is_task_command(argv[rest])) {
        fprintf(stderr, "downpour run: '%s': a task runs `downpour train` or `downpour ping`, so "
                        "the command after the run options must start with one of them\n",
                argv[rest]);
        return 2;
    }

    dp_cluster c;
    dp_err err;
    if (cluster) {
        rc = dp_cluster_load(&c, cluster, task, &err);
    } else {
        rc = dp_cluster_from_env(&c, task, &err);
        if (rc == 1) {
            fprintf(stderr, "downpour run: no cluster spec. Hint: pass --cluster FILE (see "
                            "docs/cluster.md) or set DOWNPOUR_CONFIG (or TF_CONFIG) to the "
                            "spec's JSON\n");
            return 2;
        }
    }
    if (rc < 0) {
        fprintf(stderr, "downpour run: %s\n", err.msg);
        return 2;
    }
    /* train learns its role the same way under launch and run: DOWNPOUR_CONFIG
     * holding the spec with this task (and no TF_CONFIG beside it to differ). */
    char *json = dp_cluster_to_json(&c, c.self, &err);
    if (!json || setenv(DP_CLUSTER_ENV, json, 1) < 0 || unsetenv(DP_CLUSTER_ENV_TF) < 0 ||
        setenv("DOWNPOUR_TASK", c.tasks[c.self].name, 1) < 0) {
        fprintf(stderr, "downpour run: cannot set %s: %s\n", DP_CLUSTER_ENV,
                json ? "out of memory" : err.msg);
        free(json);
        dp_cluster_free(&c);
        return 1;
    }
    free(json);
    const dp_task *me = &c.tasks[c.self];
    dp_info("run: task %s (rank %d of %d) at %s", me->name, me->rank, c.n_tasks, me->addr);
    const char *secret = getenv("DOWNPOUR_SECRET");
    if (!secret || !*secret)
        dp_warn("run: DOWNPOUR_SECRET is not set; every task needs the same secret to "
                "authenticate. Hint: run `openssl rand -hex 32` once and export the result "
                "as DOWNPOUR_SECRET on every host");
    dp_cluster_free(&c);
    return strcmp(argv[rest], "ping") == 0 ? cmd_ping(argc - rest, argv + rest)
                                           : cmd_train(argc - rest, argv + rest);
}
