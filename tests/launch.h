/* Helpers for tests that run whole jobs under `downpour launch` and strike
 * one task: start the launcher with its output in a log, wait for a line,
 * find a task's pid among the launcher's children (by the DOWNPOUR_TASK each
 * child gets, launcher.h), wait for the end, read the test accuracy. */
#ifndef DOWNPOUR_TEST_LAUNCH_H
#define DOWNPOUR_TEST_LAUNCH_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "proc.h"

/* A run long enough to strike in the middle of: 180 steps a worker, each
 * paced to last at least 8 ms (launch_test_init), about 2 s in all. */
#define RUN "--dataset mnist --model 784-128-10 --train-size 12000 --val-size 1000 " \
            "--epochs 3 --batch 100 --threads 1 --no-progress --log-every 10"

/* The program under test and the scratch directory: launch_test_init sets them. */
static const char *bin, *tmp;

/* A launch test's start: the program, its scratch directory and MNIST (a
 * test without MNIST is skipped, exit 77). */
static void launch_test_init(void)
{
    bin = test_bin();
    tmp = test_tmp();
    REQUIRE(bin && tmp);
    require_mnist();
    /* Every task sleeps 8 ms a step (docs/faults.md, "Testing: paced
     * runs"): a killed task restarts and rejoins well before the end, and
     * the sleeping tasks leave the CPU to the suite's other tests. */
    setenv("DOWNPOUR_TEST_STEP_MS", "8", 1);
}

/* The parameter-server strategies, which the fault tests strike alike.
 * Under ASan+UBSan, which checks memory rather than rules, two of them:
 * ps-dssp runs the asynchronous apply and the clocks of ps-async and ps-ssp,
 * ps-sync the synchronous round and the lost-worker paths model-avg shares
 * (its own averaging runs under ASan in test_ps, test_resume and
 * test_ps_replicas); the plain build strikes all five. */
#if SANITIZED
static const char *const ps_strategies[] = {"ps-dssp", "ps-sync"};
#else
static const char *const ps_strategies[] = {"ps-async", "ps-ssp", "ps-dssp", "ps-sync",
                                            "model-avg"};
#endif
#define N_PS_STRATEGIES (sizeof ps_strategies / sizeof ps_strategies[0])

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Starts `downpour launch ARGS` with its output in tmp/NAME.log. */
static pid_t start(const char *name, const char *args)
{
    char log[1200], cmd[4096];
    snprintf(log, sizeof log, "%s/%s.log", tmp, name);
    snprintf(cmd, sizeof cmd, "exec %s launch %s", bin, args);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0)
            _exit(126);
        dup2(fd, 1);
        dup2(fd, 2);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Whether tmp/NAME.log holds text. */
static int log_has(const char *name, const char *text)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.log", tmp, name);
    size_t len;
    char *s = slurp(path, &len);
    int has = s && strstr(s, text) != NULL;
    free(s);
    return has;
}

/* Prints tmp/NAME.log's last `lines` lines to stderr: a failed check's
 * evidence, so a failure on a machine no one can reach explains itself. */
static inline void show_log(const char *name, int lines)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.log", tmp, name);
    size_t len;
    char *s = slurp(path, &len);
    if (!s) {
        fprintf(stderr, "---- %s: none\n", path);
        return;
    }
    const char *from = s + len;
    for (int n = 0; from > s && n <= lines; from--)
        if (from[-1] == '\n' && ++n > lines)
            break;
    fprintf(stderr, "---- %s (last %d lines)\n%s%s---- end of %s\n", path, lines, from,
            len && s[len - 1] != '\n' ? "\n" : "", name);
    free(s);
}

static int wait_log(const char *name, const char *text, double timeout)
{
    for (double end = now_s() + timeout; now_s() < end; sleep_s(0.02))
        if (log_has(name, text))
            return 1;
    return 0;
}

/* Waits until tmp/NAME.log holds `text` followed by a number, and returns
 * the number (a pid the launcher logged), or -1 (a failed check).  Unlike
 * task_pid it cannot race a child that has not exec'd yet, whose environment
 * is still the launcher's. */
static inline pid_t await_logged_pid(const char *name, const char *text)
{
    int seen = wait_log(name, text, 120);
    CHECKF(seen, "%s: \"%s\" never came", name, text);
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.log", tmp, name);
    size_t len;
    char *s = seen ? slurp(path, &len) : NULL;
    const char *at = s ? strstr(s, text) : NULL;
    long pid = at ? strtol(at + strlen(text), NULL, 10) : -1;
    free(s);
    CHECKF(!seen || pid > 0, "%s: no pid after \"%s\"", name, text);
    return pid > 0 ? (pid_t)pid : -1;
}

/* The pid of the launcher's child whose environment says DOWNPOUR_TASK=task. */
static pid_t task_pid(pid_t launcher, const char *task)
{
    char want[64];
    snprintf(want, sizeof want, "DOWNPOUR_TASK=%s", task);
    DIR *d = opendir("/proc");
    pid_t found = -1;
    struct dirent *e;
    while (d && found < 0 && (e = readdir(d))) {
        char path[300], buf[8192];
        pid_t pid = (pid_t)atoi(e->d_name);
        if (pid <= 0)
            continue;
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
        FILE *f = fopen(path, "r");
        int ppid = -1;
        if (f) {
            if (fscanf(f, "%*d (%*[^)]) %*c %d", &ppid) != 1)
                ppid = -1;
            fclose(f);
        }
        if (ppid != launcher)
            continue;
        snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
        int fd = open(path, O_RDONLY);
        ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
        if (fd >= 0)
            close(fd);
        for (ssize_t i = 0; i < n; i += (ssize_t)strlen(buf + i) + 1) {
            buf[n] = '\0';
            if (strcmp(buf + i, want) == 0)
                found = pid;
        }
    }
    if (d)
        closedir(d);
    return found;
}

/* Waits until tmp/NAME.log holds `line`, then finds `task` among the
 * launcher's children: its pid, or -1 (a failed check) when either does
 * not come. */
static pid_t await_task(pid_t launcher, const char *name, const char *line, const char *task)
{
    int seen = wait_log(name, line, 120);
    CHECKF(seen, "%s: \"%s\" never came", name, line);
    pid_t pid = seen ? task_pid(launcher, task) : -1;
    CHECKF(!seen || pid > 0, "%s: no %s among the launcher's children", name, task);
    return pid;
}

/* Waits for the launcher; kills it (and so its tasks) after timeout. */
static int finish(pid_t pid, double timeout)
{
    int st = 0;
    for (double end = now_s() + timeout;; sleep_s(0.05)) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (now_s() > end) {
            fprintf(stderr, "launcher %d still running after %.0f s: killing it\n", (int)pid,
                    timeout);
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
    }
}

/* A run of `launch CLUSTER -- train TRAIN`, uninterrupted, with
 * --checkpoint-dir and --save tmp/NAME.st: the bytes restarted runs must
 * end with. */
static inline void uninterrupted(const char *name, const char *cluster, const char *train)
{
    char args[2048];
    snprintf(args, sizeof args, "%s -- train %s --checkpoint-dir %s/%s.ck --save %s/%s.st",
             cluster, train, tmp, name, tmp, name);
    double t0 = now_s();
    int rc = finish(start(name, args), 120);
    fprintf(stderr, "%s: uninterrupted, %.1f s\n", name, now_s() - t0);
    CHECKF(rc == 0, "%s: the uninterrupted run exited %d", name, rc);
}

/* for_each_event: counts the fault events whose action is "restart all". */
static inline void count_restart_all(const cJSON *j, void *ctx)
{
    const cJSON *a = cJSON_GetObjectItem(j, "action");
    *(int *)ctx += cJSON_IsString(a) && strcmp(a->valuestring, "restart all") == 0;
}

/* The same run under `launch --max-restarts 1` with `victim` SIGKILLed once
 * the log holds `line` (docs/faults.md, restarts_all): it exits 0, the
 * launcher restarted every task with --resume (one "restart all" fault
 * event: about the victim, or about a task that exited for its loss before
 * the victim's own exit was seen, as a neighbour sees the killed task's
 * sockets close before the kernel makes it a zombie), and its --save file
 * is uninterrupted `full`'s, byte for byte. */
static inline void restarts_all(const char *name, const char *full, const char *cluster,
                                const char *train, const char *line, const char *victim)
{
    char args[2048];
    snprintf(args, sizeof args, "--max-restarts 1 %s -- train %s --checkpoint-dir %s/%s.ck "
             "--save %s/%s.st --metrics %s/%s.jsonl", cluster, train, tmp, name, tmp, name,
             tmp, name);
    double t0 = now_s();
    pid_t l = start(name, args);
    pid_t v = await_task(l, name, line, victim);
    if (v > 0)
        kill(v, SIGKILL);
    int rc = finish(l, 120);
    fprintf(stderr, "%s: %s killed, every task restarted, %.1f s in all\n", name, victim,
            now_s() - t0);
    CHECKF(rc == 0, "%s: exit %d", name, rc);
    CHECKF(log_has(name, "restarting every task from the newest checkpoint") &&
               log_has(name, "tasks with --resume (restart 1 of 1)"),
           "%s: no whole restart in the log", name);
    char path[1200], a[256], b[256];
    snprintf(path, sizeof path, "%s/%s.jsonl", tmp, name);
    int restarts = 0;
    for_each_event(path, "fault", NULL, count_restart_all, &restarts);
    CHECKF(restarts == 1, "%s: %d restart-all fault events after %s was killed, not 1", name,
           restarts, victim);
    snprintf(a, sizeof a, "%s.st", full);
    snprintf(b, sizeof b, "%s.st", name);
    CHECKF(same_file(a, b), "%s: the weights differ from the uninterrupted run's (largest "
           "difference %g)", name, checkpoint_max_diff(a, b));
}

/* The test accuracy of the run tmp/NAME.jsonl, or -1. */
static double test_accuracy(const char *name)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.jsonl", tmp, name);
    return done_accuracy(path);
}

/* The replicas' checksums in tmp/NAME.jsonl ("replica" events): whether
 * all are equal, and how many (*count). */
static inline int replicas_equal(const char *name, long *count)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.jsonl", tmp, name);
    long v[3] = {0, 0, 0};
    for_each_event(path, "replica", NULL, tally_replica, v);
    *count = v[0];
    return v[2] == 0;
}

/* How many "event" lines tmp/NAME.jsonl holds. */
static void count_one(const cJSON *j, void *ctx)
{
    (void)j;
    (*(int *)ctx)++;
}

static int count_events(const char *name, const char *event)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.jsonl", tmp, name);
    int n = 0;
    for_each_event(path, event, NULL, count_one, &n);
    return n;
}

#endif
