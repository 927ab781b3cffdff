/* Local launcher: runs every task of a cluster spec as a child process of
 * this one, prefixes their output with the task, and makes sure none
 * outlives the run.
 *
 * For each task the launcher runs opts.argv with this environment added:
 *   DOWNPOUR_CONFIG       the cluster spec JSON with "task" set to that task
 *   DOWNPOUR_TASK         the task's name, "worker:2"
 *   DOWNPOUR_SECRET       64 hex characters, fresh random per run, same for all tasks
 *   OPENBLAS_NUM_THREADS  max(1, online cores / tasks), unless already set
 *   DOWNPOUR_RESTARTS     opts.max_restarts, when above 0: a lost task may come
 *                         back that many times, so a coordinator waits for it
 * Each child runs in its own process group (signals go to the whole group, so
 * helpers a task forks go with it), with stdin on /dev/null and stdout and
 * stderr on pipes; the launcher writes every line as "[worker 2] line" to
 * its own stdout or stderr.  Lines longer than DP_LAUNCH_LINE_MAX bytes are
 * split (at a UTF-8 character boundary); a last line without a newline gets one.
 *
 * Stopping: SIGINT or SIGTERM to the launcher is forwarded to every task
 * (a second one sends SIGKILL); a task takes its parent's SIGTERM as the
 * job stopping, never as a drain (docs/faults.md, "Draining"), and a
 * drained worker's exit 0 is a good end like any other.  When a task exits
 * non-zero or is killed by a signal (a fault), the launcher asks
 * opts.survives whether the run goes on without it (the strategy's answer:
 * docs/faults.md).  If it does, the task
 * is restarted while it has restarts left (opts.max_restarts, counted per
 * task; a restarted task rejoins the running job) and otherwise left out;
 * the run's status stays 0 when the rest end well.  If it does not, the
 * launcher logs which task and how, sends SIGTERM to the others, and SIGKILL
 * after the grace period.  The chief, or without one worker 0 (which plays
 * it), is asked about as the chief, and no task is restarted once it has
 * exited 0 (the run is over).  A task that exits DP_EXIT_CHECKPOINTS_MISSED
 * (status.h: it trained and wrote its results, but not every checkpoint) is
 * no fault: it is not restarted, the others are not stopped, and it counts
 * as a chief that exited 0.  Each fault is one log line and, with --metrics, one
 * "fault" event in FILE.launcher (merged into FILE).  Children get PR_SET_PDEATHSIG SIGKILL,
 * so they die with the launcher even if it is killed with SIGKILL.  When a
 * task's main process ends, the rest of its process group is killed.
 *
 * Metrics: when opts.argv holds "--metrics FILE" (or "--metrics=FILE"), each
 * task is given FILE.<type>-<index> instead (FILE.worker-0, ...), and at the
 * end the launcher writes FILE: every task's lines in rank order, each tagged
 * with "task", then one "resource_total" line (dp_metrics_merge, metrics.h).
 * Once FILE is written the per-task files (and FILE.launcher) are removed;
 * a merge that fails keeps them, and the warning says so.  With
 * DOWNPOUR_METRICS_KEEP_PARTS=1 in the launcher's environment they are kept
 * (to read one task's own events, as the fault tests do; a test hook,
 * testhooks.h, which tests set with dp_hook_set).
 *
 * Tasks inherit no descriptor but 0, 1 and 2.  PR_SET_PDEATHSIG fires when
 * the thread that forked exits, so start and wait from a thread that lives
 * for the whole run (normally the main thread).  Descendants that leave the
 * task's process group (setsid) are outside the launcher's reach.
 *
 * The launcher installs handlers for SIGINT, SIGTERM, SIGUSR1, SIGCHLD and ignores
 * SIGPIPE from dp_launcher_start to dp_launcher_free, restoring the previous
 * dispositions after; only one launcher may be active in a process. */
#ifndef DOWNPOUR_LAUNCHER_H
#define DOWNPOUR_LAUNCHER_H

#include <sys/types.h>

#include "downpour/cluster.h"
#include "downpour/status.h"

#define DP_LAUNCH_LINE_MAX 4096   /* bytes of a child's line before it is split */
#define DP_LAUNCH_GRACE 5.0       /* default seconds between SIGTERM and SIGKILL */
#define DP_LAUNCH_RESTARTS_ENV "DOWNPOUR_RESTARTS" /* see above */
#define DP_LAUNCH_KEEP_PARTS_ENV "DOWNPOUR_METRICS_KEEP_PARTS" /* see above */
#define DP_LAUNCH_NO_RESTART 2 /* survives' answer: goes on, the task not restarted */
#define DP_LAUNCH_IF_RESTARTED 3 /* survives' answer: goes on only with the task restarted */
#define DP_LAUNCH_RESTART_ALL 4 /* survives' answer: goes on only with every task restarted
                                   from the newest checkpoint (--resume) */
#define DP_LAUNCH_HANDS_OVER 5 /* survives' answer for the chief (or worker 0 playing it):
                                  goes on, another task takes over its part (allreduce's
                                  leader); restarted while it has restarts left */

typedef struct dp_launch_opts {
    const dp_cluster *cluster; /* every task is started locally */
    int argc;
    char *const *argv;         /* task command; argv[0] is a path (execve, no PATH search) */
    double grace_seconds;      /* <= 0: DP_LAUNCH_GRACE */
    int out_fd, err_fd;        /* where prefixed lines go; <= 0: 1 and 2 */
    /* Whether the run goes on without `task` once it has failed; NULL: never
     * (every fault stops the run).  0: it stops; 1: it goes on, and the task
     * is restarted while it has restarts left; DP_LAUNCH_NO_RESTART: it goes
     * on, never with the task restarted (a ps whose shards went to their
     * backups); DP_LAUNCH_IF_RESTARTED: it goes on only while the task has a
     * restart left (a ps without replicas: it reloads its shard);
     * DP_LAUNCH_RESTART_ALL: it goes on only by stopping every task and
     * starting them all again with "--resume" after the command's first
     * word (lbfgs, pipeline, model-parallel with --checkpoint-dir: their state is
     * in their checkpoints),
     * while the job has a restart left (max_restarts counts these whole
     * restarts too); DP_LAUNCH_HANDS_OVER: as 1, for a task playing the
     * chief whose part another task takes over.  `why` gets a few words
     * for the log. */
    int (*survives)(void *ctx, const dp_task *task, char *why, size_t cap);
    void *survives_ctx;
    int max_restarts;          /* restarts of each task the run survives losing (0) */
    /* 1: the chief's part (or worker 0's, without a chief) moves to another
     * task when it ends (survives answers DP_LAUNCH_HANDS_OVER for it), so
     * its exit 0 does not end the run: the run is over once a task has
     * exited 0 and no task never restarted still runs. */
    int chief_hands_over;
    /* NULL, or per task a listening socket bound to its address (from
     * dp_launch_free_ports), which the task takes over instead of binding
     * the address itself: fd 3 in the task, named by DP_LAUNCH_LISTEN_FD_ENV.
     * The launcher keeps it for the task's restarts; the caller closes it
     * after dp_launch.  No other process can take the port meanwhile. */
    const int *listen_fds;
    /* The spec's last N worker slots (train --spare-workers N) are not
     * started with the others; each SIGUSR1 to the launcher starts the
     * first one left, which joins the running job (docs/cluster.md, "Spare
     * slots: growing a running job").  With none left it says so. */
    int spare_workers;
} dp_launch_opts;

/* The variable that tells a task started by the launcher which descriptor
 * holds its listening socket (dp_launch_opts.listen_fds). */
#define DP_LAUNCH_LISTEN_FD_ENV "DOWNPOUR_LISTEN_FD"

typedef struct dp_launcher dp_launcher;

/* Starts every task.  On failure nothing is left running. */
int dp_launcher_start(dp_launcher **out, const dp_launch_opts *opts, dp_err *err);

/* Pid of the task of rank `rank` (its process group id too); -1 if none. */
pid_t dp_launcher_pid(const dp_launcher *l, int rank);

/* Relays output and waits until every task has ended and been reaped, then
 * merges metrics.  Returns the exit status for the program: 0 when every task
 * exited 0; else the first failed task's exit code (128+signal if it was
 * killed), or 128+signal when the launcher itself was signalled, with err
 * saying which task failed and how; DP_EXIT_CHECKPOINTS_MISSED when none
 * failed but one or more exited with it.  Call once. */
int dp_launcher_wait(dp_launcher *l, dp_err *err);

/* Kills (SIGKILL) and reaps any task still running, closes everything and
 * restores the signal dispositions.  NULL is a no-op. */
void dp_launcher_free(dp_launcher *l);

/* start + wait + free: the exit status as dp_launcher_wait gives it (1 if
 * the tasks could not be started). */
int dp_launch(const dp_launch_opts *opts, dp_err *err);

/* Picks n distinct free TCP ports on 127.0.0.1.  With fds, each port's
 * socket is kept, listening, in fds (for dp_launch_opts.listen_fds; the
 * caller closes them); without, it is closed, and another process may take
 * the port before the task binds it (two launches side by side did). */
int dp_launch_free_ports(int *ports, int *fds, int n, dp_err *err);

#endif
