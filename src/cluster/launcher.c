/* Local launcher: fork/exec one child per task, relay their output line by
 * line with a task prefix, forward signals, restart or leave out a failed
 * task the run survives, stop everyone when the run cannot go on, and reap
 * every child on every path.  See launcher.h for the behaviour. */
#include "downpour/launcher.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sodium.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "downpour/clock.h"
#include "downpour/file.h"
#include "downpour/log.h"
#include "downpour/metrics.h"
#include "downpour/trace.h"
#include "downpour/secret.h"
#include "downpour/testhooks.h"

extern char **environ;

typedef struct lstream {
    int fd;   /* read end of the child's pipe, -1 once closed */
    int to;   /* launcher fd the lines go to */
    size_t len;
    char buf[DP_LAUNCH_LINE_MAX];
} lstream;

typedef struct ltask {
    pid_t pid;     /* -1 before start and after reaping */
    int running;
    int restarts;  /* times this task was restarted */
    char prefix[40];
    char **argv;
    char **envp;
    int listen_fd; /* the task's listening socket (becomes its fd 3), or -1 */
    int spare;     /* a spare worker slot not started yet (SIGUSR1 starts it) */
    int grown;     /* started in a spare slot by SIGUSR1: like a restarted task, it
                      may come too late to join (stop_latecomers) */
    lstream out, err;
} ltask;

struct dp_launcher {
    const dp_cluster *c;
    int n;
    ltask *t;
    int out_fd, err_fd;
    double grace;
    double t0;
    int devnull;
    int live;              /* tasks not yet reaped */
    int stopping;          /* the others have been told to stop */
    double kill_at;        /* when to send SIGKILL while stopping */
    int killed;            /* SIGKILL sent */
    int status;            /* exit status for the program */
    char reason[DP_ERR_MAX];
    char *metrics_path;    /* FILE of "--metrics FILE", or NULL */
    char *trace_path;      /* FILE of "--trace FILE", or NULL (docs/trace.md) */
    dp_metrics *faults;    /* FILE.launcher: one "fault" event per fault */
    int (*survives)(void *ctx, const dp_task *task, char *why, size_t cap);
    void *survives_ctx;
    int max_restarts;
    int chief_done;        /* a chief exited 0 (or 3): the run is over (run_over) */
    int chief_hands_over;  /* dp_launch_opts's */
    int any_ok;            /* a task exited 0 (or 3) */
    int relaunch;          /* every task is being stopped, to start again with --resume */
    int relaunches;        /* whole restarts so far (DP_LAUNCH_RESTART_ALL) */
    double over_at;        /* when only restarted tasks were left after the run's end */
    char missed[DP_ERR_MAX]; /* a task that exited DP_EXIT_CHECKPOINTS_MISSED, or "" */
    pid_t self;            /* the launcher's pid, for the children's death signal */
    int signals_installed;
    struct sigaction old_int, old_term, old_chld, old_pipe, old_usr1;
};

/* One launcher per process: the signal handlers reach it through these. */
static int g_sig_pipe[2] = {-1, -1};
static volatile sig_atomic_t g_signal;
static volatile sig_atomic_t g_signal_count;
static volatile sig_atomic_t g_grow; /* SIGUSR1s: start a spare worker slot each */
static int g_active;

static void on_signal(int sig)
{
    int saved = errno;
    if (sig == SIGUSR1) {
        g_grow++;
    } else if (sig != SIGCHLD) {
        g_signal = sig;
        g_signal_count++;
    }
    char b = 0;
    if (g_sig_pipe[1] >= 0)
        (void)!write(g_sig_pipe[1], &b, 1);
    errno = saved;
}

static int install_signals(dp_launcher *l, dp_err *err)
{
    if (g_active)
        return dp_errf(err, "launcher: another launcher is already running in this process");
    if (pipe2(g_sig_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
        return dp_errf(err, "launcher: pipe: %s", strerror(errno));
    g_signal = 0;
    g_signal_count = 0;
    g_grow = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, &l->old_int);
    sigaction(SIGTERM, &sa, &l->old_term);
    sigaction(SIGUSR1, &sa, &l->old_usr1);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, &l->old_chld);
    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, &l->old_pipe);
    l->signals_installed = 1;
    g_active = 1;
    return 0;
}

static void restore_signals(dp_launcher *l)
{
    if (!l->signals_installed)
        return;
    sigaction(SIGINT, &l->old_int, NULL);
    sigaction(SIGTERM, &l->old_term, NULL);
    sigaction(SIGUSR1, &l->old_usr1, NULL);
    sigaction(SIGCHLD, &l->old_chld, NULL);
    sigaction(SIGPIPE, &l->old_pipe, NULL);
    close(g_sig_pipe[0]);
    close(g_sig_pipe[1]);
    g_sig_pipe[0] = g_sig_pipe[1] = -1;
    l->signals_installed = 0;
    g_active = 0;
}

/* ---- output relay ---- */

static void emit_line(const ltask *t, const lstream *s, const char *line, size_t n)
{
    char out[sizeof t->prefix + DP_LAUNCH_LINE_MAX + 2];
    size_t pl = strlen(t->prefix);
    memcpy(out, t->prefix, pl);
    memcpy(out + pl, line, n);
    out[pl + n] = '\n';
    /* A failed write (EPIPE: the reader is gone) drops the line. */
    (void)dp_write_all(s->to, out, pl + n + 1, NULL);
}

/* Length of the longest prefix of buf[0..n) that does not end inside a UTF-8
 * sequence (so a split never cuts a character in two). */
static size_t utf8_cut(const char *buf, size_t n)
{
    size_t i = n, back = 0;
    while (i > 0 && back < 4 && ((unsigned char)buf[i - 1] & 0xC0) == 0x80) {
        i--;
        back++;
    }
    if (i == 0)
        return n;
    unsigned char lead = (unsigned char)buf[i - 1];
    size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    if (need > 1 && back + 1 < need)
        return i - 1; /* incomplete sequence at the end: keep it for the next line */
    return n;
}

static void stream_flush_lines(const ltask *t, lstream *s, int eof)
{
    size_t start = 0;
    for (;;) {
        char *nl = memchr(s->buf + start, '\n', s->len - start);
        if (!nl)
            break;
        size_t n = (size_t)(nl - (s->buf + start));
        emit_line(t, s, s->buf + start, n);
        start += n + 1;
    }
    if (start > 0) {
        memmove(s->buf, s->buf + start, s->len - start);
        s->len -= start;
    }
    if (s->len == sizeof s->buf) { /* a very long line: split it */
        size_t cut = utf8_cut(s->buf, s->len);
        if (cut == 0)
            cut = s->len;
        emit_line(t, s, s->buf, cut);
        memmove(s->buf, s->buf + cut, s->len - cut);
        s->len -= cut;
    }
    if (eof && s->len > 0) {
        emit_line(t, s, s->buf, s->len);
        s->len = 0;
    }
}

static void stream_close(const ltask *t, lstream *s)
{
    if (s->fd < 0)
        return;
    stream_flush_lines(t, s, 1);
    close(s->fd);
    s->fd = -1;
}

static void stream_read(const ltask *t, lstream *s)
{
    ssize_t r = read(s->fd, s->buf + s->len, sizeof s->buf - s->len);
    if (r < 0) {
        if (errno == EINTR || errno == EAGAIN)
            return;
        stream_close(t, s);
        return;
    }
    if (r == 0) {
        stream_close(t, s);
        return;
    }
    s->len += (size_t)r;
    stream_flush_lines(t, s, 0);
}

/* Relays what is left in a dead task's pipe and closes it (a descendant
 * that left the task's group and still holds the pipe loses the rest). */
static void stream_drain(const ltask *t, lstream *s)
{
    while (s->fd >= 0) {
        ssize_t r = read(s->fd, s->buf + s->len, sizeof s->buf - s->len);
        if (r > 0) {
            s->len += (size_t)r;
            stream_flush_lines(t, s, 0);
        } else if (!(r < 0 && errno == EINTR)) {
            stream_close(t, s);
        }
    }
}

/* ---- building the children's argv and environment (before any fork) ---- */

static char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xasprintf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0)
        s = NULL;
    va_end(ap);
    return s;
}

static void free_strv(char **v)
{
    if (!v)
        return;
    for (char **p = v; *p; p++)
        free(*p);
    free(v);
}

/* "--OPT FILE" or "--OPT=FILE" in argv: *at is the index of the word
 * holding FILE.  opt is "--metrics" or "--trace". */
static int find_file_arg(int argc, char *const *argv, const char *opt, int *at, const char **file)
{
    size_t n = strlen(opt);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], opt) == 0 && i + 1 < argc) {
            *at = i + 1;
            *file = argv[i + 1];
            return 1;
        }
        if (strncmp(argv[i], opt, n) == 0 && argv[i][n] == '=' && argv[i][n + 1]) {
            *at = i;
            *file = argv[i] + n + 1;
            return 1;
        }
    }
    return 0;
}

static int find_metrics_arg(int argc, char *const *argv, int *at, const char **file)
{
    return find_file_arg(argc, argv, "--metrics", at, file);
}

static char **task_argv(const dp_launcher *l, const dp_launch_opts *o, const dp_task *task)
{
    char **v = calloc((size_t)o->argc + 1, sizeof *v);
    if (!v)
        return NULL;
    int at = -1, tat = -1;
    const char *file = NULL;
    find_metrics_arg(o->argc, o->argv, &at, &file);
    find_file_arg(o->argc, o->argv, "--trace", &tat, &file);
    for (int i = 0; i < o->argc; i++) {
        if (i == at && l->metrics_path)
            v[i] = xasprintf("%s%s.%s-%d", strncmp(o->argv[i], "--metrics=", 10) == 0
                                               ? "--metrics=" : "",
                             l->metrics_path, dp_role_name(task->role), task->index);
        else if (i == tat && l->trace_path) /* FILE.<type>-<index>, merged at the end */
            v[i] = xasprintf("%s%s.%s-%d", strncmp(o->argv[i], "--trace=", 8) == 0
                                               ? "--trace=" : "",
                             l->trace_path, dp_role_name(task->role), task->index);
        else
            v[i] = strdup(o->argv[i]);
        if (!v[i]) {
            free_strv(v);
            return NULL;
        }
    }
    return v;
}

static int env_is(const char *entry, const char *name)
{
    size_t n = strlen(name);
    return strncmp(entry, name, n) == 0 && entry[n] == '=';
}

/* free_strv for environments, which hold the cluster secret: each string is
 * zeroed before it is freed. */
static void free_env(char **v)
{
    if (!v)
        return;
    for (char **p = v; *p; p++) {
        sodium_memzero(*p, strlen(*p));
        free(*p);
    }
    free(v);
}

static char **task_envp(const dp_cluster *c, int rank, const char *secret, int blas_threads,
                        int restarts, int listen_fd)
{
    size_t n = 0;
    while (environ && environ[n])
        n++;
    char **v = calloc(n + 7, sizeof *v);
    if (!v)
        return NULL;
    size_t k = 0;
    int keep_blas = 0;
    for (size_t i = 0; i < n; i++) {
        const char *e = environ[i];
        if (env_is(e, DP_CLUSTER_ENV) || env_is(e, DP_CLUSTER_ENV_TF) ||
            env_is(e, "DOWNPOUR_SECRET") || env_is(e, "DOWNPOUR_TASK") ||
            env_is(e, DP_LAUNCH_RESTARTS_ENV) || env_is(e, DP_LAUNCH_LISTEN_FD_ENV))
            continue;
        if (env_is(e, "OPENBLAS_NUM_THREADS"))
            keep_blas = 1;
        if (!(v[k++] = strdup(e)))
            goto fail;
    }
    char *json = dp_cluster_to_json(c, rank, NULL);
    if (!json)
        goto fail;
    v[k] = xasprintf("%s=%s", DP_CLUSTER_ENV, json);
    free(json);
    if (!v[k++])
        goto fail;
    if (!(v[k++] = xasprintf("DOWNPOUR_TASK=%s", c->tasks[rank].name)))
        goto fail;
    if (!(v[k++] = xasprintf("DOWNPOUR_SECRET=%s", secret)))
        goto fail;
    if (!keep_blas && !(v[k++] = xasprintf("OPENBLAS_NUM_THREADS=%d", blas_threads)))
        goto fail;
    if (restarts > 0 && !(v[k++] = xasprintf("%s=%d", DP_LAUNCH_RESTARTS_ENV, restarts)))
        goto fail;
    if (listen_fd >= 0 && !(v[k++] = xasprintf("%s=3", DP_LAUNCH_LISTEN_FD_ENV)))
        goto fail;
    return v;
fail:
    free_env(v);
    return NULL;
}

/* ---- children ---- */

static void signal_all(dp_launcher *l, int sig)
{
    for (int i = 0; i < l->n; i++)
        if (l->t[i].running)
            kill(-l->t[i].pid, sig);
}

static void describe_status(char *buf, size_t size, int st)
{
    if (WIFEXITED(st))
        snprintf(buf, size, "exited with status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(buf, size, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        snprintf(buf, size, "ended with wait status %d", st);
}

static void begin_stop(dp_launcher *l, int sig)
{
    if (!l->stopping) {
        l->stopping = 1;
        l->kill_at = dp_now() + l->grace;
    }
    signal_all(l, sig);
}

static int spawn(dp_launcher *l, int i, pid_t parent, dp_err *err);

/* Whether a task never restarted still runs. */
static int originals_running(const dp_launcher *l)
{
    for (int i = 0; i < l->n; i++)
        if (l->t[i].running && l->t[i].restarts == 0)
            return 1;
    return 0;
}

/* The run is over: the chief (or worker 0 playing it) exited 0; where its
 * part moves to another task (chief_hands_over: it may have drained), once
 * a task exited 0 and no task never restarted still runs. */
static int run_over(const dp_launcher *l)
{
    return l->chief_done || (l->chief_hands_over && l->any_ok && !originals_running(l));
}

/* The chief, or without one worker 0, which plays it (evaluates, writes:
 * cluster.h): the launcher asks about it as about the chief, and the run is
 * over when it has exited 0. */
static int plays_chief(const dp_cluster *c, const dp_task *t)
{
    return t->role == DP_ROLE_CHIEF ||
           (t->role == DP_ROLE_WORKER && t->index == 0 && c->count[DP_ROLE_CHIEF] == 0);
}

/* FILE.<type>-<index>, the metrics file of task i; with restart r > 0, the
 * file an earlier run of the task left, renamed FILE.<type>-<index>.r<r>. */
static char *task_metrics_path(const dp_launcher *l, int i, int r)
{
    const dp_task *t = &l->c->tasks[i];
    return r > 0 ? xasprintf("%s.%s-%d.r%d", l->metrics_path, dp_role_name(t->role), t->index, r)
                 : xasprintf("%s.%s-%d", l->metrics_path, dp_role_name(t->role), t->index);
}

/* Task i failed and the run goes on only from its newest checkpoint, with
 * every task started again (DP_LAUNCH_RESTART_ALL): the others are stopped
 * now, and relaunch() starts them all once every one is reaped.  -1 when
 * the job has no restart left or the run is over. */
static int restart_all(dp_launcher *l, int i, const char *how, const char *why)
{
    const dp_task *task = &l->c->tasks[i];
    if (run_over(l) || l->relaunches >= l->max_restarts) {
        dp_metrics_event(l->faults, "fault", DP_F_STR, "task", task->name, DP_F_STR, "what", how,
                         DP_F_STR, "action", "stop", DP_F_END);
        dp_error("launcher: fault: %s (pid %d) %s; the run cannot go on (%s, and %s)",
                 task->name, (int)l->t[i].pid, how, why,
                 run_over(l) ? "the run is over"
                 : l->max_restarts == 0
                     ? "no restart was allowed (--max-restarts 0): with launch --max-restarts 1 "
                       "or more every task would have started again from the newest checkpoint"
                     : "the job has no restart left (each whole restart counts against "
                       "--max-restarts)");
        return -1;
    }
    l->relaunches++;
    dp_warn("launcher: fault: %s (pid %d) %s; restarting every task from the newest checkpoint "
            "(%s; restart %d of %d)", task->name, (int)l->t[i].pid, how, why, l->relaunches,
            l->max_restarts);
    dp_metrics_event(l->faults, "fault", DP_F_STR, "task", task->name, DP_F_STR, "what", how,
                     DP_F_STR, "action", "restart all", DP_F_INT, "restarts",
                     (long)l->relaunches, DP_F_END);
    l->relaunch = 1;
    if (l->live > 0)
        begin_stop(l, SIGTERM);
    return 0;
}

/* "--resume" after the command's first word (train), unless it is there:
 * a fresh argv, or NULL when out of memory. */
static char **with_resume(char **argv)
{
    int n = 0, has = 0;
    for (; argv[n]; n++)
        has |= strcmp(argv[n], "--resume") == 0;
    char **v = calloc((size_t)n + 2, sizeof *v);
    if (!v)
        return NULL;
    for (int i = 0, k = 0; i < n; i++) {
        if (!(v[k++] = strdup(argv[i]))) {
            free_strv(v);
            return NULL;
        }
        if (i == 1 && !has && !(v[k++] = strdup("--resume"))) {
            free_strv(v);
            return NULL;
        }
    }
    return v;
}

/* Starts task i again (its streams drained by the caller): one restart
 * more, its earlier metrics file kept as FILE.<type>-<index>.r<k>. */
static int respawn(dp_launcher *l, int i)
{
    ltask *t = &l->t[i];
    t->restarts++;
    if (l->metrics_path) {
        char *cur = task_metrics_path(l, i, 0), *old = task_metrics_path(l, i, t->restarts);
        if (cur && old && rename(cur, old) != 0 && errno != ENOENT)
            dp_warn("launcher: cannot keep %s as %s: %s", cur, old, strerror(errno));
        free(cur);
        free(old);
    }
    dp_err err;
    if (spawn(l, i, l->self, &err) < 0) {
        dp_error("launcher: cannot restart %s: %s", l->c->tasks[i].name, err.msg);
        return -1;
    }
    return 0;
}

/* Every task reaped after restart_all: each starts again with --resume, its
 * earlier metrics file kept as FILE.<type>-<index>.r<k>.  -1 when one
 * cannot be started (the others are then stopped). */
static int relaunch(dp_launcher *l)
{
    l->relaunch = 0;
    l->stopping = 0;
    l->killed = 0;
    for (int i = 0; i < l->n; i++) {
        ltask *t = &l->t[i];
        stream_drain(t, &t->out);
        stream_drain(t, &t->err);
        char **v = with_resume(t->argv);
        if (!v) {
            dp_error("launcher: out of memory restarting %s", l->c->tasks[i].name);
            return -1;
        }
        free_strv(t->argv);
        t->argv = v;
        if (respawn(l, i) < 0)
            return -1;
    }
    dp_info("launcher: restarted all %d tasks with --resume (restart %d of %d)", l->n,
            l->relaunches, l->max_restarts);
    return 0;
}

/* Task i failed (wait status st; how says how).  Returns 0 when the run goes
 * on without it (the strategy survives the loss of such a task), after
 * restarting it if it has restarts left; -1 when the run must stop. */
static int survive_fault(dp_launcher *l, int i, int st, const char *how)
{
    const dp_task *task = &l->c->tasks[i];
    ltask *t = &l->t[i];
    char why[320] = "";
    if (!l->survives)
        return -1;
    /* Exit status 2 is a usage error: every task would make it again. */
    if (WIFEXITED(st) && WEXITSTATUS(st) == 2)
        return -1;
    dp_task as = *task;
    if (plays_chief(l->c, task))
        as.role = DP_ROLE_CHIEF;
    int survived = l->survives(l->survives_ctx, &as, why, sizeof why);
    if (survived == DP_LAUNCH_RESTART_ALL)
        return restart_all(l, i, how, why);
    int restart = survived && survived != DP_LAUNCH_NO_RESTART && !run_over(l) &&
                  t->restarts < l->max_restarts;
    if (survived && as.role == DP_ROLE_CHIEF && !restart && survived != DP_LAUNCH_HANDS_OVER) {
        /* The chief evaluates and writes the result: the run may go on
         * without it only while it can come back. */
        snprintf(why, sizeof why, "the chief evaluates and writes the result, and it has no "
                 "restart left (--max-restarts %d)", l->max_restarts);
        survived = 0;
    } else if (survived && !restart && l->live == 0 && !l->any_ok) {
        /* the last task, lost with none ended well: nobody is left to
         * finish the run (allreduce's every replica killed at once) */
        snprintf(why, sizeof why, "no other task is left to finish the run");
        survived = 0;
    } else if (survived == DP_LAUNCH_IF_RESTARTED && !restart) {
        size_t len = strlen(why);
        snprintf(why + len, sizeof why - len, ", and it has no restart left (--max-restarts %d)",
                 l->max_restarts);
        survived = 0;
    }
    if (!survived) {
        dp_metrics_event(l->faults, "fault", DP_F_STR, "task", task->name, DP_F_STR, "what", how,
                         DP_F_STR, "action", "stop", DP_F_END);
        dp_error("launcher: fault: %s (pid %d) %s; the run cannot go on (%s)", task->name,
                 (int)t->pid, how, why);
        return -1;
    }
    dp_warn("launcher: fault: %s (pid %d) %s; %s (%s)", task->name, (int)t->pid, how,
            restart ? "restarting it" : "the run goes on without it", why);
    dp_metrics_event(l->faults, "fault", DP_F_STR, "task", task->name, DP_F_STR, "what", how,
                     DP_F_STR, "action", restart ? "restart" : "continue", DP_F_INT, "restarts",
                     (long)t->restarts + restart, DP_F_END);
    if (!restart)
        return 0;
    /* What the old process wrote is relayed before the new one writes. */
    stream_drain(t, &t->out);
    stream_drain(t, &t->err);
    if (respawn(l, i) < 0)
        return -1;
    dp_info("launcher: %s restarted as pid %d (restart %d of %d)", task->name, (int)t->pid,
            t->restarts, l->max_restarts);
    return 0;
}

static void reap_one(dp_launcher *l, int i, int killed_only);

/* Task i exited with an error, perhaps because a peer was killed (a chief
 * that lost its only ps): its peer's sockets close a moment before the
 * killed process becomes a zombie, so the peer may exit first.  The fault
 * is the killed one's: wait up to KILLED_FIRST_MS for a task ended by a
 * signal and reap it first (reap). */
#define KILLED_FIRST_MS 200
static void reap_killed_first(dp_launcher *l, int i)
{
    for (int waited = 0; waited <= KILLED_FIRST_MS; waited += 5) {
        for (int j = 0; j < l->n; j++) {
            siginfo_t si;
            memset(&si, 0, sizeof si);
            if (j == i || !l->t[j].running ||
                waitid(P_PID, (id_t)l->t[j].pid, &si, WEXITED | WNOHANG | WNOWAIT) < 0)
                continue;
            if (si.si_pid != 0 && si.si_code != CLD_EXITED) {
                reap_one(l, j, 1);
                return;
            }
        }
        dp_sleep_ms(5);
    }
}

/* Reaps task i if it has ended (with killed_only, only if a signal ended
 * it).  Its leftover process group is killed before the zombie is reaped,
 * so its id cannot be reused meanwhile. */
static void reap_one(dp_launcher *l, int i, int killed_only)
{
    ltask *t = &l->t[i];
    if (!t->running)
        return;
    siginfo_t si;
    memset(&si, 0, sizeof si);
    if (waitid(P_PID, (id_t)t->pid, &si, WEXITED | WNOHANG | WNOWAIT) < 0) {
        if (errno != ECHILD)
            return;
        /* Reaped behind our back (SIGCHLD set to SIG_IGN by another thread?) */
        dp_warn("launcher: %s (pid %d) was reaped elsewhere; its status is lost",
                l->c->tasks[i].name, (int)t->pid);
        kill(-t->pid, SIGKILL);
        t->running = 0;
        l->live--;
        return;
    }
    if (si.si_pid == 0 || (killed_only && si.si_code == CLD_EXITED))
        return;
    if (si.si_code == CLD_EXITED && si.si_status != 0 &&
        si.si_status != DP_EXIT_CHECKPOINTS_MISSED && !l->stopping)
        reap_killed_first(l, i);
    kill(-t->pid, SIGKILL);
    int st = 0;
    while (waitpid(t->pid, &st, 0) < 0 && errno == EINTR)
        ;
    t->running = 0;
    l->live--;
    int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    /* A task that did its work but could not write some checkpoint(s): no
     * fault to restart it for, but the run's status says so (status.h). */
    int missed = WIFEXITED(st) && WEXITSTATUS(st) == DP_EXIT_CHECKPOINTS_MISSED;
    char how[96];
    describe_status(how, sizeof how, st);
    const char *name = l->c->tasks[i].name;
    if (missed && !l->stopping) {
        dp_warn("launcher: %s (pid %d) finished, but some checkpoint(s) could not be written "
                "(exit status %d)", name, (int)t->pid, DP_EXIT_CHECKPOINTS_MISSED);
        if (!l->missed[0])
            snprintf(l->missed, sizeof l->missed, "task %s (pid %d) finished, but some "
                     "checkpoint(s) could not be written", name, (int)t->pid);
    }
    if (ok || (missed && !l->stopping)) {
        dp_debug("launcher: %s (pid %d) %s", name, (int)t->pid, how);
        l->any_ok = 1;
        if (!l->chief_hands_over && plays_chief(l->c, &l->c->tasks[i]))
            l->chief_done = 1;
    } else if (l->stopping) {
        dp_debug("launcher: %s (pid %d) %s while stopping", name, (int)t->pid, how);
    } else if (survive_fault(l, i, st, how) < 0) {
        l->status = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 1;
        snprintf(l->reason, sizeof l->reason, "task %s (pid %d) %s", name, (int)t->pid, how);
        if (l->live > 0)
            dp_error("launcher: %s; stopping the other %d task%s", l->reason, l->live,
                     l->live == 1 ? "" : "s");
        else
            dp_error("launcher: %s", l->reason);
        begin_stop(l, SIGTERM);
    }
}

/* Reaps the tasks that have ended, those killed by a signal first: when one
 * task's death makes another exit with an error (a chief that lost its only
 * ps), the fault is the first one's. */
static void reap(dp_launcher *l)
{
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < l->n; i++)
            reap_one(l, i, pass == 0);
}

/* The run is over (the chief exited 0) and only restarted tasks are left:
 * one that had not rejoined before the end waits for peers that are gone
 * (an allreduce replica dials until --startup-timeout, docs/faults.md
 * "Who decides").  One that rejoined ends with the others, so after the
 * grace period those left are stopped, and their ending is not a fault. */
static void stop_latecomers(dp_launcher *l, double now)
{
    if (!run_over(l) || l->stopping || l->live == 0)
        return;
    for (int i = 0; i < l->n; i++)
        if (l->t[i].running && l->t[i].restarts == 0 && !l->t[i].grown)
            return;
    if (l->over_at == 0) {
        l->over_at = now;
        return;
    }
    if (now - l->over_at < l->grace)
        return;
    for (int i = 0; i < l->n; i++)
        if (l->t[i].running) {
            dp_warn("launcher: the run is over and %s (pid %d), %s, is still running "
                    "%.1f s after the others ended; stopping it",
                    l->c->tasks[i].name, (int)l->t[i].pid,
                    l->t[i].restarts ? "restarted" : "started in a spare slot", now - l->over_at);
            dp_metrics_event(l->faults, "fault", DP_F_STR, "task", l->c->tasks[i].name,
                             DP_F_STR, "what", "still running after the run ended", DP_F_STR,
                             "action", "end", DP_F_END);
        }
    begin_stop(l, SIGTERM);
}

static int spawn(dp_launcher *l, int i, pid_t parent, dp_err *err)
{
    ltask *t = &l->t[i];
    int po[2] = {-1, -1}, pe[2] = {-1, -1};
    if (pipe2(po, O_CLOEXEC) < 0 || pipe2(pe, O_CLOEXEC) < 0) {
        int e = errno;
        if (po[0] >= 0) {
            close(po[0]);
            close(po[1]);
        }
        return dp_errf(err, "launcher: pipe for %s: %s%s", l->c->tasks[i].name, strerror(e),
                       e == EMFILE ? " (Hint: raise the open-file limit, ulimit -n)" : "");
    }
    /* Signals stay blocked across fork, so the child cannot run the
     * launcher's handler before it has reset the dispositions. */
    sigset_t all, old_mask;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old_mask);
    pid_t pid = fork();
    if (pid != 0)
        pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    if (pid < 0) {
        int e = errno;
        close(po[0]);
        close(po[1]);
        close(pe[0]);
        close(pe[1]);
        return dp_errf(err, "launcher: fork for %s: %s", l->c->tasks[i].name, strerror(e));
    }
    if (pid == 0) {
        /* Child: async-signal-safe calls only until execve. */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1); /* the launcher died before prctl took effect */
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGCHLD, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        if (dup2(l->devnull, 0) < 0 || dup2(po[1], 1) < 0 || dup2(pe[1], 2) < 0)
            _exit(127);
        /* Its listening socket as fd 3, kept across execve (dup2 onto
         * itself would leave close-on-exec set, hence the fcntl). */
        unsigned first_closed = 3;
        if (t->listen_fd >= 0) {
            if (dup2(t->listen_fd, 3) < 0 || fcntl(3, F_SETFD, 0) < 0)
                _exit(127);
            first_closed = 4;
        }
#ifdef SYS_close_range
        /* Descriptors the caller left without close-on-exec stay out of tasks. */
        syscall(SYS_close_range, first_closed, ~0u, 0u);
#else
        (void)first_closed;
#endif
        execve(t->argv[0], t->argv, t->envp);
        static const char msg[] = "launcher: cannot execute the task command: ";
        (void)!write(2, msg, sizeof msg - 1);
        const char *es = strerror(errno);
        (void)!write(2, t->argv[0], strlen(t->argv[0]));
        (void)!write(2, ": ", 2);
        (void)!write(2, es, strlen(es));
        (void)!write(2, "\n", 1);
        _exit(127);
    }
    setpgid(pid, pid); /* also in the parent, so kill(-pid) works at once */
    close(po[1]);
    close(pe[1]);
    fcntl(po[0], F_SETFL, O_NONBLOCK);
    fcntl(pe[0], F_SETFL, O_NONBLOCK);
    t->pid = pid;
    t->running = 1;
    t->spare = 0;
    t->out.fd = po[0];
    t->out.to = l->out_fd;
    t->err.fd = pe[0];
    t->err.to = l->err_fd;
    l->live++;
    return 0;
}

static void kill_and_reap_all(dp_launcher *l)
{
    for (int i = 0; i < l->n; i++) {
        ltask *t = &l->t[i];
        if (!t->running)
            continue;
        kill(-t->pid, SIGKILL);
        int st;
        while (waitpid(t->pid, &st, 0) < 0 && errno == EINTR)
            ;
        t->running = 0;
        l->live--;
    }
}

void dp_launcher_free(dp_launcher *l)
{
    if (!l)
        return;
    if (l->t) {
        kill_and_reap_all(l);
        for (int i = 0; i < l->n; i++) {
            stream_close(&l->t[i], &l->t[i].out);
            stream_close(&l->t[i], &l->t[i].err);
            free_strv(l->t[i].argv);
            free_env(l->t[i].envp);
        }
        free(l->t);
    }
    if (l->devnull >= 0)
        close(l->devnull);
    restore_signals(l);
    free(l->metrics_path);
    free(l->trace_path);
    dp_metrics_close(l->faults);
    free(l);
}

int dp_launcher_start(dp_launcher **out, const dp_launch_opts *o, dp_err *err)
{
    *out = NULL;
    if (!o->cluster || o->cluster->n_tasks < 1)
        return dp_errf(err, "launcher: empty cluster");
    if (o->argc < 1 || !o->argv || !o->argv[0])
        return dp_errf(err, "launcher: no task command");
    dp_launcher *l = calloc(1, sizeof *l);
    if (!l)
        return dp_errf(err, "launcher: out of memory");
    char secret[2 * DP_SECRET_GEN + 1] = {0}; /* hex, for DOWNPOUR_SECRET */
    l->devnull = -1;
    l->c = o->cluster;
    l->n = o->cluster->n_tasks;
    l->out_fd = o->out_fd > 0 ? o->out_fd : 1;
    l->err_fd = o->err_fd > 0 ? o->err_fd : 2;
    l->grace = o->grace_seconds > 0 ? o->grace_seconds : DP_LAUNCH_GRACE;
    l->survives = o->survives;
    l->chief_hands_over = o->chief_hands_over;
    l->survives_ctx = o->survives_ctx;
    l->max_restarts = o->max_restarts > 0 ? o->max_restarts : 0;
    l->self = getpid();
    l->t0 = dp_now();
    l->t = calloc((size_t)l->n, sizeof *l->t);
    if (!l->t) {
        dp_errf(err, "launcher: out of memory for %d tasks", l->n);
        goto fail;
    }
    for (int i = 0; i < l->n; i++) {
        l->t[i].pid = -1;
        l->t[i].out.fd = l->t[i].err.fd = -1;
        const dp_task *task = &l->c->tasks[i];
        if (task->role == DP_ROLE_CHIEF)
            snprintf(l->t[i].prefix, sizeof l->t[i].prefix, "[chief] ");
        else
            snprintf(l->t[i].prefix, sizeof l->t[i].prefix, "[%s %d] ",
                     dp_role_name(task->role), task->index);
    }
    int at;
    const char *file;
    if (find_metrics_arg(o->argc, o->argv, &at, &file) && !(l->metrics_path = strdup(file))) {
        dp_errf(err, "launcher: out of memory");
        goto fail;
    }
    if (find_file_arg(o->argc, o->argv, "--trace", &at, &file) && !(l->trace_path = strdup(file))) {
        dp_errf(err, "launcher: out of memory");
        goto fail;
    }
    if (l->metrics_path && l->survives) {
        char *fp = xasprintf("%s.launcher", l->metrics_path);
        int frc = fp ? dp_metrics_open(&l->faults, fp, err) : dp_errf(err, "out of memory");
        free(fp);
        if (frc < 0) {
            dp_err_prefix(err, "launcher: fault log");
            goto fail;
        }
    }
    dp_secret raw;
    int got = dp_secret_generate(&raw, secret, sizeof secret, err);
    dp_secret_wipe(&raw); /* the tasks get the hex form */
    if (got < 0) {
        dp_err_prefix(err, "launcher: cluster secret");
        goto fail;
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int blas = cores > l->n ? (int)(cores / l->n) : 1;
    int spares = 0;
    for (int i = 0; i < l->n; i++) {
        l->t[i].spare = dp_cluster_is_spare(l->c, i, o->spare_workers);
        spares += l->t[i].spare;
        l->t[i].listen_fd = o->listen_fds ? o->listen_fds[i] : -1;
        l->t[i].argv = task_argv(l, o, &l->c->tasks[i]);
        l->t[i].envp = task_envp(l->c, i, secret, blas, l->max_restarts, l->t[i].listen_fd);
        if (!l->t[i].argv || !l->t[i].envp) {
            dp_errf(err, "launcher: out of memory building the command of %s",
                    l->c->tasks[i].name);
            goto fail;
        }
    }
    sodium_memzero(secret, sizeof secret);
    l->devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (l->devnull < 0) {
        dp_errf(err, "launcher: cannot open /dev/null: %s", strerror(errno));
        goto fail;
    }
    if (install_signals(l, err) < 0)
        goto fail;
    for (int i = 0; i < l->n; i++) {
        if (g_signal_count > 0) {
            dp_errf(err, "launcher: interrupted by signal %d while starting the tasks",
                    (int)g_signal);
            goto fail;
        }
        if (!l->t[i].spare && spawn(l, i, l->self, err) < 0)
            goto fail;
    }
    /* Every task has its copy of the environment: the secret goes now,
     * unless a task may have to be started again, or later (a spare). */
    for (int i = 0; i < l->n && l->max_restarts == 0; i++) {
        if (l->t[i].spare)
            continue;
        free_env(l->t[i].envp);
        l->t[i].envp = NULL;
    }
    if (spares)
        dp_info("launcher: started %d task%s (%s); %d spare worker slot(s): kill -USR1 %d "
                "starts one, which joins the running job", l->n - spares,
                l->n - spares == 1 ? "" : "s", o->argv[0], spares, (int)l->self);
    else
        dp_info("launcher: started %d task%s (%s)", l->n, l->n == 1 ? "" : "s", o->argv[0]);
    *out = l;
    return 0;
fail:
    sodium_memzero(secret, sizeof secret);
    dp_launcher_free(l);
    return -1;
}

pid_t dp_launcher_pid(const dp_launcher *l, int rank)
{
    if (!l || rank < 0 || rank >= l->n)
        return -1;
    return l->t[rank].pid;
}

/* FILE from the tasks' FILE.<type>-<index> in rank order (metrics.h), each
 * restarted task's earlier files first, then the launcher's fault events. */
static int merge_metrics(const dp_launcher *l, dp_err *err)
{
    const dp_cluster *c = l->c;
    int n = 1;
    for (int i = 0; i < c->n_tasks; i++)
        n += 1 + l->t[i].restarts;
    dp_metrics_source *src = calloc((size_t)n, sizeof *src);
    if (!src)
        return dp_errf(err, "merging metrics: out of memory");
    int rc = 0, k = 0;
    for (int i = 0; i < c->n_tasks && rc == 0; i++)
        for (int r = 1; r <= l->t[i].restarts + 1 && rc == 0 && !l->t[i].spare; r++) {
            src[k].task = c->tasks[i].name;
            src[k].path = task_metrics_path(l, i, r <= l->t[i].restarts ? r : 0);
            if (!src[k++].path)
                rc = dp_errf(err, "merging metrics: out of memory");
        }
    if (rc == 0 && l->faults) {
        src[k].task = "launcher";
        if (!(src[k++].path = xasprintf("%s.launcher", l->metrics_path)))
            rc = dp_errf(err, "merging metrics: out of memory");
    }
    if (rc == 0)
        rc = dp_metrics_merge(l->metrics_path, src, k, dp_now() - l->t0, err);
    if (rc < 0) { /* the parts hold what the merge could not: keep them */
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        dp_errf(err, "%s; the per-task files %s.<task> are kept", why, l->metrics_path);
    }
    /* Merged: the parts only clutter the folder beside FILE. */
    int keep = dp_hook_on(DP_HOOK_METRICS_KEEP_PARTS);
    for (int i = 0; i < k; i++) {
        if (rc == 0 && !keep && unlink(src[i].path) != 0 && errno != ENOENT)
            dp_warn("launcher: cannot remove %s: %s", src[i].path, strerror(errno));
        free((char *)src[i].path);
    }
    free(src);
    return rc;
}

/* FILE from the tasks' FILE.<type>-<index> (their last run each): one
 * timeline, already on one wall-clock axis. */
static int merge_traces(const dp_launcher *l, dp_err *err)
{
    int n = l->c->n_tasks, rc = 0;
    char **in = calloc((size_t)(n ? n : 1), sizeof *in);
    if (!in)
        return dp_errf(err, "merging traces: out of memory");
    int m = 0; /* spare slots never started wrote nothing */
    for (int i = 0; i < n && rc == 0; i++)
        if (!l->t[i].spare &&
            !(in[m++] = xasprintf("%s.%s-%d", l->trace_path, dp_role_name(l->c->tasks[i].role),
                                  l->c->tasks[i].index)))
            rc = dp_errf(err, "merging traces: out of memory");
    if (rc == 0)
        rc = dp_trace_merge(l->trace_path, (const char *const *)in, m, err);
    for (int i = 0; i < m && rc == 0; i++)
        unlink(in[i]); /* merged: one file beside the metrics, not one a task */
    for (int i = 0; i < n; i++)
        free(in[i]);
    free(in);
    return rc;
}

/* SIGUSR1: the first spare worker slot not started yet is started; it
 * joins the running job (docs/cluster.md, "Spare slots"). */
static void grow(dp_launcher *l)
{
    if (l->stopping || l->chief_done || l->live == 0) {
        dp_warn("launcher: SIGUSR1: the run is %s; no worker is started",
                l->stopping ? "stopping" : "over");
        return;
    }
    int i = 0;
    while (i < l->n && !l->t[i].spare)
        i++;
    if (i == l->n) {
        dp_warn("launcher: SIGUSR1: no spare worker slot is free (the job is full: train "
                "--spare-workers gives it free slots); no worker is started");
        return;
    }
    dp_err err;
    if (spawn(l, i, l->self, &err) < 0) {
        dp_warn("launcher: SIGUSR1: %s", err.msg);
        return;
    }
    l->t[i].grown = 1;
    dp_info("launcher: SIGUSR1: started %s (pid %d) in a spare slot; it joins the running job",
            l->c->tasks[i].name, (int)l->t[i].pid);
    if (l->max_restarts == 0) { /* started: its copy of the secret goes */
        free_env(l->t[i].envp);
        l->t[i].envp = NULL;
    }
}

int dp_launcher_wait(dp_launcher *l, dp_err *err)
{
    int nfd = 2 * l->n + 1;
    struct pollfd *pf = calloc((size_t)nfd, sizeof *pf);
    lstream **who = calloc((size_t)nfd, sizeof *who);
    int *owner = calloc((size_t)nfd, sizeof *owner);
    if (!pf || !who || !owner) {
        free(pf);
        free(who);
        free(owner);
        kill_and_reap_all(l);
        return dp_errf(err, "launcher: out of memory"), 1;
    }
    int seen_signals = 0, seen_grow = 0;
    double drain_until = 0;
    for (;;) {
        reap(l);
        if (g_grow > seen_grow) {
            seen_grow = g_grow;
            grow(l);
        }
        if (l->relaunch && l->live == 0 && g_signal_count == seen_signals &&
            relaunch(l) < 0) {
            l->status = 1;
            snprintf(l->reason, sizeof l->reason, "a task could not be restarted");
            begin_stop(l, SIGTERM);
        }
        /* Signals to the launcher: forward the first, SIGKILL on the second. */
        int count = g_signal_count;
        if (count > seen_signals) {
            int sig = g_signal;
            if (l->live > 0) {
                if (seen_signals == 0) {
                    dp_warn("launcher: got signal %d (%s), forwarding it to %d task%s", sig,
                            strsignal(sig), l->live, l->live == 1 ? "" : "s");
                    begin_stop(l, sig);
                    l->relaunch = 0; /* a stop asked for: no restart */
                } else if (!l->killed) {
                    dp_warn("launcher: second signal, killing every task");
                    signal_all(l, SIGKILL);
                    l->killed = 1;
                }
            }
            if (seen_signals == 0 && l->status == 0) {
                l->status = 128 + sig;
                snprintf(l->reason, sizeof l->reason, "launcher interrupted by signal %d (%s)",
                         sig, strsignal(sig));
            }
            seen_signals = count;
        }
        double now = dp_now();
        stop_latecomers(l, now);
        if (l->stopping && !l->killed && l->live > 0 && now >= l->kill_at) {
            dp_warn("launcher: %d task%s still running after %.1f s, sending SIGKILL", l->live,
                    l->live == 1 ? "" : "s", l->grace);
            signal_all(l, SIGKILL);
            l->killed = 1;
        }
        int k = 0;
        pf[k].fd = g_sig_pipe[0];
        pf[k].events = POLLIN;
        who[k++] = NULL;
        for (int i = 0; i < l->n; i++) {
            lstream *ss[2] = {&l->t[i].out, &l->t[i].err};
            for (int j = 0; j < 2; j++)
                if (ss[j]->fd >= 0) {
                    pf[k].fd = ss[j]->fd;
                    pf[k].events = POLLIN;
                    owner[k] = i;
                    who[k++] = ss[j];
                }
        }
        if (l->live == 0) {
            /* Everyone is reaped: read what is left in the pipes; a descendant
             * that left its group may hold a pipe open, so not forever. */
            if (k == 1)
                break;
            if (drain_until == 0)
                drain_until = now + 2.0;
            if (now >= drain_until)
                break;
        }
        double wait_s = 0.25;
        if (l->stopping && !l->killed && l->kill_at - now < wait_s)
            wait_s = l->kill_at - now > 0 ? l->kill_at - now : 0;
        int r = poll(pf, (nfds_t)k, (int)(wait_s * 1000) + 1);
        if (r < 0 && errno != EINTR) {
            dp_errf(err, "launcher: poll: %s", strerror(errno));
            break;
        }
        if (r <= 0)
            continue;
        if (pf[0].revents) {
            char drain[64];
            while (read(g_sig_pipe[0], drain, sizeof drain) > 0)
                ;
        }
        for (int j = 1; j < k; j++)
            if (pf[j].revents)
                stream_read(&l->t[owner[j]], who[j]);
    }
    free(pf);
    free(who);
    free(owner);
    kill_and_reap_all(l); /* only after a poll failure can any be left */
    for (int i = 0; i < l->n; i++) {
        stream_close(&l->t[i], &l->t[i].out);
        stream_close(&l->t[i], &l->t[i].err);
    }
    if (l->metrics_path) {
        dp_err merr;
        if (merge_metrics(l, &merr) < 0) {
            dp_warn("launcher: %s", merr.msg);
            if (l->status == 0) {
                l->status = 1;
                snprintf(l->reason, sizeof l->reason, "%s", merr.msg);
            }
        }
    }
    if (l->trace_path) {
        dp_err terr;
        if (merge_traces(l, &terr) < 0) {
            dp_warn("launcher: %s", terr.msg);
            if (l->status == 0) {
                l->status = 1;
                snprintf(l->reason, sizeof l->reason, "%s", terr.msg);
            }
        }
    }
    if (l->status == 0 && l->missed[0]) {
        l->status = DP_EXIT_CHECKPOINTS_MISSED;
        snprintf(l->reason, sizeof l->reason, "%s", l->missed);
    }
    if (l->status != 0)
        dp_errf(err, "%s", l->reason[0] ? l->reason : "launcher failed");
    return l->status;
}

int dp_launch(const dp_launch_opts *opts, dp_err *err)
{
    dp_launcher *l;
    if (dp_launcher_start(&l, opts, err) < 0)
        return 1;
    int st = dp_launcher_wait(l, err);
    dp_launcher_free(l);
    return st;
}

/* The lowest port the kernel hands out on its own (outgoing connections'
 * source ports, bind to port 0), or 0 when it cannot be read. */
static int ephemeral_low(void)
{
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    int lo = 0, hi = 0;
    if (f) {
        if (fscanf(f, "%d %d", &lo, &hi) != 2)
            lo = 0;
        fclose(f);
    }
    return lo > 0 && lo <= 65535 ? lo : 0;
}

/* Binds fd to 127.0.0.1:port (0: the kernel's choice); the port bound, or
 * -1 with errno set. */
static int bind_loopback(int fd, int port)
{
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) < 0)
        return -1;
    return ntohs(a.sin_port);
}

/* Ports are drawn below the kernel's ephemeral range where it leaves room:
 * a port from bind(0) is one the kernel may give the next outgoing
 * connection of any process between this check and the task's own bind,
 * and on a busy host (tests side by side) such a task failed to start.
 * Each candidate is held bound until every port is chosen, so they differ;
 * the kernel's choice remains the fallback. */
#define FREE_PORT_SPAN 10000
#define FREE_PORT_TRIES 64

int dp_launch_free_ports(int *ports, int *keep, int n, dp_err *err)
{
    int *fds = keep ? keep : malloc((size_t)(n > 0 ? n : 1) * sizeof *fds);
    if (!fds)
        return dp_errf(err, "free ports: out of memory");
    int eph = ephemeral_low(), lo = eph - FREE_PORT_SPAN;
    uint64_t draw = ((uint64_t)getpid() << 32) ^ (uint64_t)(dp_now() * 1e6);
    int rc = 0, k = 0;
    for (; k < n; k++) {
        fds[k] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fds[k] < 0) {
            rc = dp_errf(err, "free ports: socket: %s", strerror(errno));
            break;
        }
        int port = -1;
        for (int t = 0; lo >= 1024 && port < 0 && t < FREE_PORT_TRIES; t++) {
            draw = draw * 6364136223846793005ULL + 1442695040888963407ULL;
            port = bind_loopback(fds[k], lo + (int)((draw >> 33) % FREE_PORT_SPAN));
        }
        if (port < 0)
            port = bind_loopback(fds[k], 0);
        if (port < 0) {
            rc = dp_errf(err, "free ports: bind 127.0.0.1:0: %s", strerror(errno));
            k++;
            break;
        }
        ports[k] = port;
        if (keep && listen(fds[k], 128) < 0) {
            rc = dp_errf(err, "free ports: listen on 127.0.0.1:%d: %s", port, strerror(errno));
            k++;
            break;
        }
    }
    if (keep && rc == 0)
        return 0;
    for (int i = 0; i < k; i++)
        close(fds[i]);
    if (keep)
        for (int i = 0; i < n; i++)
            keep[i] = -1;
    else
        free(fds);
    return rc;
}
