/* A lost replica in --strategy allreduce under `downpour launch`
 * (docs/faults.md, "All-reduce"): worker:2 of 3 SIGKILLed once it logged
 * step 20 costs the run nothing but its share of the data: the launcher
 * exits 0, the two survivors end bitwise identical, and the test accuracy is
 * within 1 % of the fault-free run's.  Frozen (SIGSTOP) past the heartbeat
 * timeout it is dropped the same way.  Restarted (--max-restarts 1), it is
 * told the ring takes no replica back and exits, and the run still
 * completes.  Losing the chief (replica 0, the evaluator) stops the run. */
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

#define RUN "--dataset mnist --model 784-300-100-10 --train-size 12000 --val-size 1000 " \
            "--epochs 3 --batch 100 --threads 1 --no-progress --log-every 10"

static const char *bin, *tmp;

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

static int wait_log(const char *name, const char *text, double timeout)
{
    for (double end = now_s() + timeout; now_s() < end; sleep_s(0.02))
        if (log_has(name, text))
            return 1;
    return 0;
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

static double test_accuracy(const char *name)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.jsonl", tmp, name);
    cJSON *done = last_event(path, "done", NULL);
    double acc = done ? json_num(done, "test_accuracy") : -1;
    cJSON_Delete(done);
    return acc;
}

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

static void tally(const cJSON *j, void *ctx)
{
    long *v = ctx;
    long crc = (long)json_num(j, "params_crc32c");
    if (v[0]++ == 0)
        v[1] = crc;
    v[2] |= crc != v[1];
}

/* Replica checksums in the run's metrics: how many, and whether all equal. */
static int replicas_equal(const char *name, long *count)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.jsonl", tmp, name);
    long v[3] = {0, 0, 0};
    for_each_event(path, "replica", NULL, tally, v);
    *count = v[0];
    return v[2] == 0;
}

/* One run on 3 workers; fault: NULL, or "kill" / "stop" `task` once worker 2
 * logged step 20.  Returns the launcher's exit status. */
static int run(const char *name, const char *extra, const char *fault, const char *task)
{
    char args[2048];
    snprintf(args, sizeof args, "--workers 3 %s -- train --strategy allreduce " RUN
             " --heartbeat-timeout 1 --metrics %s/%s.jsonl", extra, tmp, name);
    pid_t l = start(name, args);
    if (fault) {
        CHECKF(wait_log(name, "Worker 2, At step 20,", 120), "%s: worker 2 never reached step 20",
               name);
        pid_t w = task_pid(l, task);
        CHECKF(w > 0, "%s: no %s among the launcher's children", name, task);
        if (w > 0 && strcmp(fault, "kill") == 0) {
            kill(w, SIGKILL);
        } else if (w > 0) {
            double t0 = now_s();
            kill(w, SIGSTOP);
            char line[64];
            snprintf(line, sizeof line, "fault: lost %s", task);
            int seen = wait_log(name, line, 60);
            CHECKF(seen, "%s: nobody noticed the frozen %s", name, task);
            if (seen)
                fprintf(stderr, "%s: frozen %s dropped after %.2f s (heartbeat timeout 1 s)\n",
                        name, task, now_s() - t0);
            kill(w, SIGCONT);
        }
    }
    return finish(l, 300);
}

static void survived(const char *name, int rc, double clean, const char *what)
{
    double acc = test_accuracy(name);
    long n;
    int same = replicas_equal(name, &n);
    fprintf(stderr, "%s: exit %d, accuracy %.4f (fault-free %.4f), %ld replica checksums%s\n",
            name, rc, acc, clean, n, same ? ", all equal" : ", NOT equal");
    CHECKF(rc == 0, "%s: %s ended the run (exit %d)", name, what, rc);
    CHECKF(fabs(acc - clean) <= 0.01, "%s: accuracy %.4f with %s, %.4f without", name, acc, what,
           clean);
    CHECKF(log_has(name, "fault: lost worker:2"), "%s: no fault line for worker:2", name);
    CHECKF(n >= 2 && same, "%s: %ld replica checksums, %s", name, n,
           same ? "all equal" : "not all equal");
}

int main(void)
{
    bin = test_bin();
    tmp = test_tmp();
    REQUIRE(bin && tmp);
    require_mnist();

    int rc = run("clean", "", NULL, NULL);
    double clean = test_accuracy("clean");
    CHECKF(rc == 0 && clean > 0.8, "the fault-free run exited %d, accuracy %.4f", rc, clean);

    rc = run("kill", "", "kill", "worker:2");
    survived("kill", rc, clean, "a killed replica");
    CHECKF(count_events("kill", "fault") >= 2,
           "kill: expected fault events from the launcher and the survivors");
    CHECKF(log_has("kill", "the all-reduce ring goes on over 2 replica(s)"),
           "kill: replica 0 did not say the ring re-formed");

    rc = run("stop", "", "stop", "worker:2");
    survived("stop", rc, clean, "a frozen replica");

    rc = run("restart", "--max-restarts 1", "kill", "worker:2");
    survived("restart", rc, clean, "a restarted replica");
    CHECKF(log_has("restart", "restarted as pid") &&
               log_has("restart", "takes none back"),
           "restart: the restarted replica was not refused clearly");

    /* Replica 0 (the chief) evaluates and writes: losing it stops the run. */
    rc = run("lead", "--chief", "kill", "chief:0");
    CHECKF(rc != 0 && log_has("lead", "cannot survive"), "lead: exit %d with the chief killed",
           rc);
    return check_failures ? 1 : 0;
}
