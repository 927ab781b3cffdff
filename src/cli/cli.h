/* The downpour program: one file per subcommand (cmd_<name>.c), a shared
 * option parser.  Every subcommand returns the process exit status. */
#ifndef DOWNPOUR_CLI_H
#define DOWNPOUR_CLI_H

#include <stdbool.h>

#include "downpour/options.h"
#include "downpour/status.h"

typedef enum cli_kind {
    CLI_STR,   /* const char **dst */
    CLI_INT,   /* long *dst, range [lo, hi] */
    CLI_NUM,   /* double *dst, range [lo, hi] */
    CLI_FLAG,  /* bool *dst, takes no value */
    CLI_SECTION, /* no option: --help prints `help` as a heading above the next ones */
    CLI_I32,   /* int *dst, range [lo, hi] (a strategy's settings: options.h) */
    CLI_SIZE,  /* size_t *dst, range [lo, hi] */
    CLI_KIND_COUNT
} cli_kind;

typedef struct cli_opt {
    const char *name;  /* "batch" for --batch */
    cli_kind kind;
    void *dst;         /* holds the default on entry (a CLI_NUM's NAN: none shown) */
    const char *meta;  /* value placeholder in --help, "N" */
    const char *help;  /* wrapped at 80 columns ('\x1f': a space never broken);
                          "(default: ...)" is added unless it says "default"
                          itself, so each option shows one default */
    double lo, hi;     /* range for CLI_INT / CLI_NUM */
} cli_opt;

/* Parses "--name value" and "--name=value" into the table's destinations.
 * Stops at "--" or at the first non-option argument; *rest is the index of
 * the first unparsed argument.  Returns 0 on success, 1 when --help was
 * printed on stdout (exit 0), -1 on a bad flag or value (message printed on
 * stderr, exit 2).  Every usage error of the program exits 2. 
 * `usage` is the synopsis line; the help lists every option with its default. */
int cli_parse(const char *usage, const cli_opt *opts, int n_opts, int argc, char **argv,
              int *rest);

void cli_print_help(const char *usage, const cli_opt *opts, int n_opts); /* on stdout */

/* The candidate closest to `word` by edit distance, when close enough to be
 * a likely typo (about one edit in three letters); else NULL.  For "did you
 * mean" in usage errors. */
const char *cli_suggest(const char *word, const char *const *cands, int n);
/* The same over a list in one string, "a, b, c" (as dp_strategy_names()):
 * the suggestion is copied into buf; NULL when none is close. */
const char *cli_suggest_list(const char *word, const char *list, char *buf, size_t cap);

/* The cli_opt of a strategy's option o, its field in `settings`. */
cli_opt cli_opt_of(const dp_opt *o, void *settings);

/* Checks `downpour train ARGS` (argv[0] "train") as each task of a cluster
 * of `chief`, `workers` and `ps` tasks would, without training: every
 * option, and the strategy against that cluster.  For launch, before it
 * starts any task.  Returns 0 (start the tasks), -1 when --help was
 * printed (exit 0, start nothing), or the exit status of a usage error
 * (2, the message printed once). */
int cli_train_check(int argc, char **argv, int chief, int workers, int ps);
/* The same, keeping the parsed configuration in *cfg (its strategy's
 * settings included) for launch's questions to the strategy. */
struct dp_train_config;
int cli_train_parse(int argc, char **argv, int chief, int workers, int ps,
                    struct dp_train_config *cfg);

/* Subcommands. */
int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_launch(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_ping(int argc, char **argv);
int cmd_metrics(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_experiment(int argc, char **argv);
int cmd_data(int argc, char **argv);
int cmd_data_inspect(int argc, char **argv); /* downpour data inspect */
int cmd_data_synth(int argc, char **argv);   /* downpour data synth */

/* The commands a cluster task may run under launch or run: train, ping. */
bool cli_is_task_command(const char *name);

/* --log-level LEVEL and --verbose, the same in train, launch and run. */
#define CLI_LOG_HELP "error, warn, info or debug (default: $DOWNPOUR_LOG_LEVEL, else info)"
#define CLI_LOG_OPTS(level, verbose)                                                      \
    {"log-level", CLI_STR, (level), "LEVEL", CLI_LOG_HELP, 0, 0},                         \
    {"verbose", CLI_FLAG, (verbose), NULL, "the same as --log-level debug", 0, 0}

/* Sets this process's log level from --log-level / --verbose (neither: as it
 * is) and exports it as DOWNPOUR_LOG_LEVEL, so that tasks started from here
 * inherit it.  -1 after a message on stderr naming cmd: a usage error. */
int cli_apply_log_level(const char *cmd, const char *level, bool verbose);

/* train --straggler "K:MS": training task K (a worker's index, or the
 * replica position where the chief trains too) sleeps MS milliseconds a
 * step.  Parses it into *k and *ms. */
int cli_parse_straggler(const char *s, long *k, double *ms, dp_err *err);
/* Whether task K can exist in a cluster of `chief` (0 or 1) chief and
 * `workers` workers, the tasks that train; else err names the flag, the
 * value and the cluster's size (a usage error: exit 2). */
int cli_check_straggler(const char *s, long k, int chief, int workers, dp_err *err);

#endif
