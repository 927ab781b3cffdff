/* downpour metrics: tools on metrics files.  `merge` writes one run's file
 * from its tasks' files, as `downpour launch` does at its end, for tasks
 * started some other way (scripts/vcluster.sh; docs/cluster.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "downpour/cluster.h"
#include "downpour/metrics.h"
#include "downpour/status.h"

#define METRICS_USAGE                                                                        \
    "downpour metrics merge --out FILE [--seconds S] TASK=FILE...\n"                          \
    "\n"                                                                                     \
    "merge: writes --out from the tasks' metrics files, in the order given: each task's\n"   \
    "lines with \"task\":TASK added where missing, then one resource_total summary\n"         \
    "(docs/cluster.md, \"Metrics of a launched run\"). TASK is a task name (chief,\n"          \
    "worker:0, ps:1); a missing file is skipped with a warning. --seconds is the summary's\n" \
    "\"t\" (default: the largest \"t\" in the task files)."

#define MERGE_MAX 4096

/* The largest "t" in a JSON Lines file (0 when none): the merged summary's
 * time when --seconds is not given.  A plain scan: every event has "t". */
static double last_t(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    double best = 0;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        const char *at = strstr(line, "\"t\":");
        if (!at)
            continue;
        double t = strtod(at + 4, NULL);
        if (isfinite(t) && t > best)
            best = t;
    }
    free(line);
    fclose(f);
    return best;
}

/* "worker:0=path" into its task and path; the task must be a task name. */
static int split_source(char *arg, dp_metrics_source *src, dp_err *err)
{
    char *eq = strchr(arg, '=');
    if (!eq || eq == arg || !eq[1])
        return dp_errf(err, "'%s': expected TASK=FILE (worker:0=run.jsonl.worker-0)", arg);
    *eq = '\0';
    dp_role role;
    int index;
    if (dp_task_parse(arg, &role, &index, err) < 0) {
        *eq = '=';
        return dp_err_prefix(err, "'%s'", arg);
    }
    src->task = arg;
    src->path = eq + 1;
    return 0;
}

static int merge(int argc, char **argv)
{
    const char *out = NULL;
    double seconds = NAN;
    const cli_opt opts[] = {
        {"out", CLI_STR, &out, "FILE", "the merged metrics file (replaced atomically)", 0, 0},
        {"seconds", CLI_NUM, &seconds, "S",
         "the summary's \"t\", the run's length (default: the largest \"t\" in the task files)",
         0, 1e9},
    };
    int rest;
    int r = cli_parse(METRICS_USAGE, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, &rest);
    if (r != 0)
        return r > 0 ? 0 : 2;
    if (!out) {
        fprintf(stderr, "downpour metrics merge: --out FILE is required\n");
        return 2;
    }
    int n = argc - rest;
    if (n < 1 || n > MERGE_MAX) {
        fprintf(stderr, "downpour metrics merge: %s task files (1..%d TASK=FILE arguments)\n",
                n < 1 ? "no" : "too many", MERGE_MAX);
        return 2;
    }
    dp_metrics_source *src = calloc((size_t)n, sizeof *src);
    if (!src) {
        fprintf(stderr, "downpour metrics merge: out of memory\n");
        return 1;
    }
    dp_err err;
    for (int i = 0; i < n; i++)
        if (split_source(argv[rest + i], &src[i], &err) < 0) {
            fprintf(stderr, "downpour metrics merge: %s\n", err.msg);
            free(src);
            return 2;
        }
    if (isnan(seconds)) {
        seconds = 0;
        for (int i = 0; i < n; i++) {
            double t = last_t(src[i].path);
            if (t > seconds)
                seconds = t;
        }
    }
    int rc = dp_metrics_merge(out, src, n, seconds, &err);
    free(src);
    if (rc < 0) {
        fprintf(stderr, "downpour metrics merge: %s\n", err.msg);
        return 1;
    }
    return 0;
}

int cmd_metrics(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        if (argc < 2) {
            fprintf(stderr, "usage: %s\n", METRICS_USAGE);
            return 2;
        }
        printf("usage: %s\n", METRICS_USAGE);
        return 0;
    }
    if (strcmp(argv[1], "merge") == 0)
        return merge(argc - 1, argv + 1);
    fprintf(stderr, "downpour metrics: unknown subcommand '%s' (merge)\n", argv[1]);
    return 2;
}
