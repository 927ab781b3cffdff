/* downpour: distributed deep-learning training.  Dispatches to one file per
 * subcommand. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"train", cmd_train, "train a model (one process, or one task of a cluster)"},
    {"eval", cmd_eval, "test accuracy of a saved checkpoint"},
    {"launch", cmd_launch, "run a local cluster of tasks as processes on this machine"},
    {"run", cmd_run, "run one task of a multi-host cluster"},
    {"ping", cmd_ping, "check a cluster: every task reaches every other, with latencies"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: downpour COMMAND [OPTIONS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n'downpour COMMAND --help' lists a command's options and their defaults.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "downpour: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
