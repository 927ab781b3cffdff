/* downpour experiment: studies made of many runs, each a subcommand in
 * src/cli/experiment/ (docs/experiments.md). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/experiment/experiment.h"

typedef struct study {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} study;

static const study studies[] = {
    {"thesis", dp_experiment_thesis,
     "the source experiment: datasets x strategies x batch sizes, report and results"},
    {"scaling", dp_experiment_scaling,
     "samples/s and speedup over one process at 1, 2, 4, 8 workers per strategy"},
    {"sparse", dp_experiment_sparse,
     "a click-through model's sparse tables: ps-async, ps-sync, allreduce by rows and whole"},
    {"cost", dp_experiment_cost,
     "predict each strategy's time on a cluster you describe, from a calibration run"},
};
#define N_STUDIES (sizeof studies / sizeof studies[0])

static void usage(FILE *f)
{
    fprintf(f, "usage: downpour experiment STUDY [OPTIONS]\n\nstudies:\n");
    for (size_t i = 0; i < N_STUDIES; i++)
        fprintf(f, "  %-8s %s\n", studies[i].name, studies[i].summary);
    fprintf(f, "\n'downpour experiment STUDY --help' lists its options.\n");
}

int cmd_experiment(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < N_STUDIES; i++)
        if (!strcmp(argv[1], studies[i].name))
            return studies[i].run(argc - 1, argv + 1);
    fprintf(stderr, "downpour experiment: unknown study '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
