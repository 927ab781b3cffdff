/* downpour report: one self-contained HTML page from metrics files
 * (docs/reports.md).  --label may repeat, so the options are read here
 * rather than by cli_parse; they may come before or after the files. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "downpour/report.h"

#define USAGE "downpour report RUN.jsonl... -o OUT.html [--title TEXT] [--label NAME]..."
#define MAX_FILES 64

static void help(void)
{
    printf("usage: " USAGE "\n\n"
           "Writes one HTML file (inline SVG charts, no script, nothing fetched to view it)\n"
           "from the metrics files of one or more runs (train --metrics FILE, or launch's\n"
           "merged FILE): validation accuracy and loss per epoch with the runs overlaid, a\n"
           "table of their final figures, and per run each task's CPU, memory and network\n"
           "over time, step-time distribution and throughput, with stragglers and faults\n"
           "marked.  docs/reports.md says how to read it.\n\n"
           "options:\n"
           "  -o, --output FILE  the HTML file to write (replaced atomically); required\n"
           "  --title TEXT       the page's title (default: \"downpour report\")\n"
           "  --label NAME       the name of a run in legends and tables, in the order of\n"
           "                     the files; repeat it for each run (default: from the run's\n"
           "                     done event, \"ps-async b128 mnist\")\n"
           "  -h, --help         this help\n");
}

/* The value of option argv[*i] ("--x v" or "--x=v"); NULL (message printed) if missing. */
static const char *value(int argc, char **argv, int *i, const char *name)
{
    const char *a = argv[*i], *eq = strchr(a, '=');
    if (strncmp(a, "--", 2) == 0 && eq)
        return eq + 1;
    if (*i + 1 >= argc) {
        fprintf(stderr, "downpour report: %s needs a value (see --help)\n", name);
        return NULL;
    }
    return argv[++*i];
}

static bool is_opt(const char *a, const char *name)
{
    size_t n = strlen(name);
    return strncmp(a, name, n) == 0 && (a[n] == '\0' || (name[1] == '-' && a[n] == '='));
}

int cmd_report(int argc, char **argv)
{
    const char *files[MAX_FILES], *labels[MAX_FILES];
    const char *out = NULL, *title = "downpour report";
    int n_files = 0, n_labels = 0;
    bool options = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (options && (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)) {
            help();
            return 0;
        }
        if (options && strcmp(a, "--") == 0) {
            options = false;
        } else if (options && (is_opt(a, "-o") || is_opt(a, "--output"))) {
            if (!(out = value(argc, argv, &i, "--output")))
                return 2;
        } else if (options && is_opt(a, "--title")) {
            if (!(title = value(argc, argv, &i, "--title")))
                return 2;
        } else if (options && is_opt(a, "--label")) {
            if (n_labels == MAX_FILES) {
                fprintf(stderr, "downpour report: more than %d --label\n", MAX_FILES);
                return 2;
            }
            if (!(labels[n_labels++] = value(argc, argv, &i, "--label")))
                return 2;
        } else if (options && a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "downpour report: unknown option '%s' (see --help)\n", a);
            return 2;
        } else {
            if (n_files == MAX_FILES) {
                fprintf(stderr, "downpour report: at most %d metrics files\n", MAX_FILES);
                return 2;
            }
            files[n_files++] = a;
        }
    }
    if (n_files == 0) {
        fprintf(stderr, "downpour report: no metrics file given\nusage: " USAGE "\n");
        return 2;
    }
    if (!out) {
        fprintf(stderr, "downpour report: -o OUT.html is required\nusage: " USAGE "\n");
        return 2;
    }
    if (n_labels > n_files) {
        fprintf(stderr, "downpour report: %d --label for %d file(s)\n", n_labels, n_files);
        return 2;
    }
    dp_err err;
    dp_report *r = NULL;
    int rc = 1;
    if (dp_report_open(&r, title, &err) < 0)
        goto out;
    for (int i = 0; i < n_files; i++)
        if (dp_report_add_run(r, files[i], i < n_labels ? labels[i] : NULL, &err) < 0)
            goto out;
    if (dp_report_write(r, out, &err) < 0)
        goto out;
    fprintf(stderr, "downpour report: wrote %s (%d run%s)\n", out, n_files, n_files == 1 ? "" : "s");
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "downpour report: %s\n", err.msg);
    dp_report_free(r);
    return rc;
}
