/* What `downpour experiment` subcommands share (docs/experiments.md): running
 * one training command as a child process with its output in a log file,
 * the summary of a run's metrics file, medians and spreads, and option lists
 * such as "128,256". */
#ifndef DOWNPOUR_EXPERIMENT_STUDY_H
#define DOWNPOUR_EXPERIMENT_STUDY_H

#include <stdbool.h>
#include <stdio.h>

#include "downpour/status.h"

#define STUDY_MAX_ARGS 96
#define STUDY_MAX_EPOCHS 1000
#define STUDY_MAX_LIST 16
#define STUDY_MAX_WORKERS 256 /* worker tasks whose bytes a run summary adds up */

/* A command line under construction: argv[0] is this program, or another
 * program found on PATH (a script). */
typedef struct study_argv {
    char *argv[STUDY_MAX_ARGS + 1];
    char store[8192];
    size_t used;
    int argc;
} study_argv;

void study_argv_init(study_argv *a);  /* empty: the first argument is the program */
/* Appends one argument (copied); returns -1 when the command is too long. */
int study_argv_add(study_argv *a, const char *arg);
/* Appends the whitespace-separated words of s. */
int study_argv_add_words(study_argv *a, const char *s);
/* The command as one line for logs ("downpour launch ..."). */
void study_argv_format(const study_argv *a, char *out, size_t cap);

/* Runs the command with stdout and stderr to log_path; waits at most
 * timeout seconds (then SIGTERM, SIGKILL).  *wall gets its seconds.
 * Returns its exit status (0-255), 124 after a timeout, -1 when it could
 * not be started (err says why). */
int study_spawn(const study_argv *a, const char *log_path, double timeout, double *wall,
                dp_err *err);
/* Copies the last n lines of a log to f, indented (for a failed run). */
void study_log_tail(FILE *f, const char *log_path, int n);

/* The figures of one run, read from its (merged) metrics file. */
typedef struct study_run {
    bool done;                 /* a "done" event was read */
    double test_accuracy, train_seconds, samples_per_second;
    double wall_seconds;       /* the whole command, set by the caller */
    int epochs;                /* epoch events read */
    double val_accuracy[STUDY_MAX_EPOCHS], val_loss[STUDY_MAX_EPOCHS];
    int tasks;                 /* tasks that sampled their resources */
    double cpu_percent_mean;   /* mean over tasks of each task's mean CPU % */
    double cpu_percent_sum;    /* their sum: cores kept busy x 100 */
    double rss_bytes;          /* sum over tasks of each task's peak */
    double net_bytes;          /* sum over tasks of the bytes each received */
    double test_auc, test_log_loss; /* a model ending in bce (else NAN) */
    int workers;               /* worker tasks whose resource events were read */
    double worker_tx, worker_rx; /* their last net_tx_bytes and net_rx_bytes, summed */
} study_run;

/* Reads path into r.  Returns 0, or -1 naming the file when it cannot be
 * read or holds no "done" event of the evaluator. */
int study_read_run(const char *path, study_run *r, dp_err *err);

/* One run of a study: a's command (its output to log_path, at most
 * timeout seconds), then its metrics file read into *run (wall_seconds
 * set).  Returns 0; or -1 with why set ("run 2 exited 1 (log: ...)", "run 2
 * timed out, ...", or what failed), also said on stderr after "experiment:
 * label:" with the log's last lines.  repeat: the run's number, from 1. */
int study_run_one(const study_argv *a, const char *metrics, const char *log_path,
                  double timeout, const char *label, int repeat, study_run *run, char *why,
                  size_t cap);

/* Median, min and max of n values (n >= 1); v is reordered. */
typedef struct study_stat {
    double median, min, max;
    int n;
} study_stat;
study_stat study_stats(double *v, int n);
struct cJSON;
/* {"median", "min", "max", "n"} of s, for results.json. */
struct cJSON *study_stat_json(study_stat s);

/* The recommendation's rule (docs/experiments.md, "The recommendation")
 * between two strategies a and b: dq is b's quality minus a's (median test
 * accuracy, or AUC: higher is better), spread the spread between seeds
 * measured in the study (NAN: one seed, nothing measured), ratio b's
 * training time over a's (medians).  Quality first, when |dq| is above the
 * spread; else the faster, when the ratio is more than
 * STUDY_TIME_TOLERANCE from 1.  NULL: no verdict (one seed, or a tie both
 * ways). */
#define STUDY_TIME_TOLERANCE 0.05
const char *study_pick(const char *a, const char *b, double dq, double spread, double ratio);

/* Splits a comma list ("128,256", "mnist,fashion-mnist") into at most
 * STUDY_MAX_LIST items, each checked by ok (NULL: any).  Names the option
 * and the bad item on error.  The strings point into a copy kept in buf. */
int study_split_list(const char *opt, const char *s, char *buf, size_t cap,
                     const char **items, int *n, int (*ok)(const char *), dp_err *err);

/* A study's option parsing (cli.h) with the checks every study makes: no
 * stray argument, and --out given (*out).  Returns -1 to go on, else the
 * exit status (0 after --help, 2 on a usage error, said on stderr). */
struct cli_opt;
int study_parse(const char *study, const char *usage, const struct cli_opt *opts, int n_opts,
                int argc, char **argv, const char *const *out);

/* Makes dir and dir/runs, refusing a path that is not a writable directory. */
int study_prepare_out(const char *dir, dp_err *err);
/* DIR/results.json from root, which it frees, replaced atomically. */
int study_write_results(const char *dir, struct cJSON *root, dp_err *err);

/* Where a study's runs go: `downpour launch` on this machine, or a virtual
 * cluster of network-namespace hosts with capped links (scripts/vcluster.sh,
 * docs/cluster.md). */
typedef struct study_cluster_opts {
    long hosts;     /* 0: this machine, every task a local process */
    long link_mbit; /* hosts: each host's link capped (0: not capped) */
    long delay_ms;  /* hosts: one-way delay per message, in the transport */
} study_cluster_opts;

void study_cluster_opts_init(study_cluster_opts *o);

/* The options' entries for a cli_opt table (cli.h). */
#define STUDY_CLUSTER_CLI_OPTS(o)                                                                \
    {"hosts", CLI_INT, &(o).hosts, "N",                                                          \
     "run each task in one of N virtual hosts (network namespaces on a bridge, "                 \
     "scripts/vcluster.sh; needs root); 0: local processes", 0, 250},                            \
    {"link-mbit", CLI_INT, &(o).link_mbit, "B",                                                  \
     "with --hosts: each host's link capped at B Mbit/s (0: uncapped)", 0, 100000},              \
    {"delay-ms", CLI_INT, &(o).delay_ms, "D",                                                    \
     "with --hosts: every message waits D ms in the transport (latency)", 0, 10000}

typedef struct study_cluster {
    long hosts, link_mbit, delay_ms;
    char script[4096];       /* hosts: the virtual cluster's script */
    char description[256];   /* "this machine (2 cores)", for reports */
} study_cluster;

/* Checks the options (a virtual cluster needs its script and root). */
int study_cluster_setup(study_cluster *c, const study_cluster_opts *o, dp_err *err);
/* Starts a's command: the program and arguments that run a cluster of a
 * chief (when chief), `workers` workers and `ps` ps tasks, up to and
 * including the "--" before the task command ("train ..."). */
int study_cluster_command(const study_cluster *c, study_argv *a, bool chief, int workers, int ps,
                          dp_err *err);

/* The virtual cluster's half of the two above (vcluster.c). */
int study_vcluster_setup(study_cluster *c, dp_err *err);
int study_vcluster_command(const study_cluster *c, study_argv *a, bool chief, int workers,
                           int ps, dp_err *err);

/* This machine's cores (for the report). */
int study_cores(void);

#endif
