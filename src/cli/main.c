/* downpour: distributed deep-learning training.  Dispatches to one file per
 * subcommand.  Exit status: 0 done, 1 the work failed, 2 a usage error (an
 * unknown command or option, a missing or bad value, an unexpected
 * argument), 3 (train and launch) trained and saved but some checkpoint not
 * written (DP_EXIT_CHECKPOINTS_MISSED, docs/checkpoints.md); help and the
 * version go to stdout, errors to stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "downpour/env.h"
#include "downpour/log.h"
#include "downpour/isa.h"
#include "downpour/testhooks.h"
#include "downpour/version.h" /* DOWNPOUR_VERSION: CMake's project version */

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static int cmd_version(int argc, char **argv);

static const command commands[] = {
    {"train", cmd_train, "train a model (one process, or one task of a cluster)"},
    {"eval", cmd_eval, "test accuracy of a saved checkpoint"},
    {"launch", cmd_launch, "run a local cluster of tasks as processes on this machine"},
    {"run", cmd_run, "run one task of a multi-host cluster"},
    {"ping", cmd_ping, "check a cluster: every task reaches every other, with latencies"},
    {"metrics", cmd_metrics, "merge the metrics files of a cluster's tasks into one"},
    {"report", cmd_report, "an HTML report (charts, tables) of one or more runs' metrics files"},
    {"experiment", cmd_experiment, "run a study of many runs (thesis, scaling) with its report"},
    {"data", cmd_data, "convert IDX or NumPy datasets to TFRecord shards; inspect data files"},
    {"version", cmd_version, "print the version"},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f)
{
    fprintf(f, "usage: downpour COMMAND [OPTIONS]\n       downpour --version\n\ncommands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n'downpour COMMAND --help' lists a command's options and their defaults.\n");
}

static int is_help(const char *a)
{
    return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0 || strcmp(a, "help") == 0;
}

static int cmd_version(int argc, char **argv)
{
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        printf("usage: downpour version (or downpour --version)\n\nprints \"downpour %s\"\n",
               DOWNPOUR_VERSION);
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "downpour version: unexpected argument '%s'\n", argv[1]);
        return 2;
    }
    printf("downpour %s\n", DOWNPOUR_VERSION);
    return 0;
}

static const command *find_command(const char *name)
{
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (strcmp(name, commands[i].name) == 0)
            return &commands[i];
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *a = argv[1];
    if (strcmp(a, "--version") == 0 || strcmp(a, "-V") == 0)
        return cmd_version(argc - 1, argv + 1);
    if (is_help(a)) {
        if (argc == 2) {
            usage(stdout);
            return 0;
        }
        /* downpour help train: the same as downpour train --help */
        const command *c = find_command(argv[2]);
        if (!c || argc > 3) {
            fprintf(stderr, "downpour help: %s '%s'\n", c ? "unexpected argument" : "unknown command",
                    c ? argv[3] : argv[2]);
            usage(stderr);
            return 2;
        }
        char *sub[] = {argv[2], "--help", NULL};
        return c->run(2, sub);
    }
    const command *c = find_command(a);
    /* DOWNPOUR_LOG_LEVEL: a launcher's --log-level reaches its tasks this way */
    const char *lv = getenv(DP_LOG_LEVEL_ENV);
    dp_log_level level;
    if (lv && *lv) {
        if (dp_log_level_parse(lv, &level) < 0) {
            fprintf(stderr, "downpour: %s='%s': expected error, warn, info or debug\n",
                    DP_LOG_LEVEL_ENV, lv);
            return 2;
        }
        dp_log_set_level(level);
    }
    dp_err err;
    /* a bad cap, test hook or fallback variable is a usage error, before any work */
    if (c && (dp_isa_check_env(&err) < 0 || dp_hooks_check(&err) < 0 ||
              dp_env_fallbacks_check(&err) < 0)) {
        fprintf(stderr, "downpour: %s\n", err.msg);
        return 2;
    }
    if (c)
        return c->run(argc - 1, argv + 1);
    if (a[0] == '-')
        fprintf(stderr, "downpour: unknown option '%s' (a command comes first)\n", a);
    else
        fprintf(stderr, "downpour: unknown command '%s'\n", a);
    usage(stderr);
    return 2;
}
