/* Launcher: /bin/sh task commands (so this does not depend on `train`):
 * output prefixed, environment given, a failed task stops the others, SIGTERM
 * and the launcher's death leave no child behind, metrics merged. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "downpour/clock.h"
#include "downpour/cluster.h"
#include "downpour/launcher.h"
#include "downpour/testhooks.h"

static char g_dir[4096];

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s)
        s[n] = '\0';
    fclose(f);
    return s;
}

static int count_substr(const char *s, const char *sub)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, sub)); p += strlen(sub))
        n++;
    return n;
}

/* A process that is gone: no such pid, or a zombie waiting for init. */
static int pid_gone(pid_t pid)
{
    for (int i = 0; i < 300; i++) {
        if (kill(pid, 0) < 0 && errno == ESRCH)
            return 1;
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
        FILE *f = fopen(path, "r");
        if (f) {
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[n] = '\0';
            char *p = strrchr(buf, ')');
            if (p && p[1] == ' ' && p[2] == 'Z')
                return 1;
        }
        usleep(10000);
    }
    return 0;
}

static void local_cluster(dp_cluster *c, int chief, int workers, int ps)
{
    int ports[16];
    dp_err err;
    REQUIRE(chief + workers + ps <= 16);
    REQUIRE(dp_launch_free_ports(ports, NULL, chief + workers + ps, &err) == 0);
    for (int i = 0; i < chief + workers + ps; i++)
        for (int j = 0; j < i; j++)
            CHECK(ports[i] != ports[j]);
    REQUIRE(dp_cluster_local(c, chief, workers, ps, ports, &err) == 0);
}

static int open_out(const char *name, char *path, size_t size)
{
    snprintf(path, size, "%s/%s", g_dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    return fd;
}

/* Free ports differ and, where the kernel's ephemeral range leaves room,
 * lie below it: a port bind(0) chose could go to another process's
 * outgoing connection before the task binds it. */
static void test_free_ports(void)
{
    int ports[40];
    dp_err err;
    REQUIRE(dp_launch_free_ports(ports, NULL, 40, &err) == 0);
    int lo = 0, hi = 0;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d %d", &lo, &hi) != 2)
            lo = 0;
        fclose(f);
    }
    for (int i = 0; i < 40; i++) {
        for (int j = 0; j < i; j++)
            CHECKF(ports[i] != ports[j], "port %d twice", ports[i]);
        if (lo - 10000 >= 1024)
            CHECKF(ports[i] >= lo - 10000 && ports[i] < lo, "port %d outside [%d, %d)", ports[i],
                   lo - 10000, lo);
    }
    printf("40 free ports, distinct%s\n", lo - 10000 >= 1024 ? ", below the ephemeral range" : "");
}

/* Kept, the ports' sockets listen (no other process can take them), and
 * each task gets its own as fd 3, named by DOWNPOUR_LISTEN_FD. */
static void test_listen_fds(void)
{
    int ports[3], fds[3];
    dp_err err;
    REQUIRE(dp_launch_free_ports(ports, fds, 3, &err) == 0);
    for (int i = 0; i < 3; i++) {
        int acc = 0;
        socklen_t al = sizeof acc;
        struct sockaddr_in a;
        socklen_t sl = sizeof a;
        CHECK(getsockopt(fds[i], SOL_SOCKET, SO_ACCEPTCONN, &acc, &al) == 0 && acc);
        CHECK(getsockname(fds[i], (struct sockaddr *)&a, &sl) == 0 &&
              ntohs(a.sin_port) == ports[i]);
    }
    dp_cluster c;
    REQUIRE(dp_cluster_local(&c, 0, 3, 0, ports, &err) == 0);
    char out_path[4200];
    int out = open_out("launch_listen.txt", out_path, sizeof out_path);
    char *argv[] = {"/bin/sh", "-c",
                    "echo \"$DOWNPOUR_TASK fd=$DOWNPOUR_LISTEN_FD $(readlink /proc/$$/fd/3 | "
                    "cut -c1-7)\"",
                    NULL};
    dp_launch_opts o = {.cluster = &c, .argc = 3, .argv = argv, .out_fd = out,
                        .listen_fds = fds};
    int rc = dp_launch(&o, &err);
    CHECKF(rc == 0, "rc %d: %s", rc, err.msg);
    close(out);
    char *so = slurp(out_path);
    REQUIRE(so);
    CHECKF(count_substr(so, "fd=3 socket:") == 3, "%s", so);
    free(so);
    for (int i = 0; i < 3; i++)
        close(fds[i]);
    dp_cluster_free(&c);
}

static void test_all_succeed(void)
{
    dp_cluster c;
    local_cluster(&c, 1, 2, 1);
    char out_path[4200], err_path[4200];
    int out = open_out("launch_out.txt", out_path, sizeof out_path);
    int errfd = open_out("launch_err.txt", err_path, sizeof err_path);
    /* a descriptor without close-on-exec must not reach the tasks */
    int leak = open("/dev/null", O_RDONLY);
    REQUIRE(leak >= 3);
    char script[256];
    snprintf(script, sizeof script,
             "echo \"hello from $DOWNPOUR_TASK\"; echo \"to stderr\" >&2;"
             " if [ -e /proc/$$/fd/%d ]; then echo leaked; fi; printf 'no newline'", leak);
    char *argv[] = {"/bin/sh", "-c", script, NULL};
    dp_launch_opts o = {.cluster = &c, .argc = 3, .argv = argv, .out_fd = out, .err_fd = errfd};
    dp_err err = {{0}};
    int rc = dp_launch(&o, &err);
    close(leak);
    CHECKF(rc == 0, "rc %d: %s", rc, err.msg);
    close(out);
    close(errfd);
    char *so = slurp(out_path), *se = slurp(err_path);
    REQUIRE(so && se);
    CHECKF(strstr(so, "[chief] hello from chief:0\n"), "%s", so);
    CHECK(strstr(so, "[worker 0] hello from worker:0\n"));
    CHECK(strstr(so, "[worker 1] hello from worker:1\n"));
    CHECK(strstr(so, "[ps 0] hello from ps:0\n"));
    CHECK(strstr(so, "[worker 1] no newline\n"));
    CHECKF(count_substr(so, "\n") == 8, "%s", so);
    CHECK(strstr(se, "[ps 0] to stderr\n") && count_substr(se, "\n") == 4);
    free(so);
    free(se);
    dp_cluster_free(&c);
}

static void test_environment(void)
{
    dp_cluster c;
    local_cluster(&c, 0, 3, 1);
    char out_path[4200];
    int out = open_out("launch_env.txt", out_path, sizeof out_path);
    char *argv[] = {"/bin/sh", "-c",
                    "echo \"cfg=$DOWNPOUR_CONFIG\"; echo \"secret=$DOWNPOUR_SECRET\";"
                    " echo \"blas=$OPENBLAS_NUM_THREADS\"",
                    NULL};
    dp_launch_opts o = {.cluster = &c, .argc = 3, .argv = argv, .out_fd = out};
    unsetenv("OPENBLAS_NUM_THREADS");
    setenv("DOWNPOUR_SECRET", "not-this-one", 1);
    dp_err err = {{0}};
    int rc = dp_launch(&o, &err);
    CHECKF(rc == 0, "rc %d: %s", rc, err.msg);
    close(out);
    char *s = slurp(out_path);
    REQUIRE(s);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    char want[64];
    snprintf(want, sizeof want, "blas=%ld\n", cores / 4 > 1 ? cores / 4 : 1);
    CHECKF(count_substr(s, want) == 4, "want 4 x %s in %s", want, s);
    /* Each task's spec parses and names that task. */
    for (int r = 0; r < c.n_tasks; r++) {
        char tag[64];
        snprintf(tag, sizeof tag, "[%s %d] cfg=", dp_role_name(c.tasks[r].role), c.tasks[r].index);
        char *p = strstr(s, tag);
        CHECKF(p != NULL, "%s missing", tag);
        if (!p)
            continue;
        p += strlen(tag);
        char *nl = strchr(p, '\n');
        REQUIRE(nl);
        *nl = '\0';
        dp_cluster d;
        CHECKF(dp_cluster_parse(&d, p, NULL, &err) == 0, "%s: %s", p, err.msg);
        CHECK(d.self == r && d.n_tasks == c.n_tasks);
        dp_cluster_free(&d);
        *nl = '\n';
    }
    /* One fresh 64-hex-digit secret, the same in every task. */
    char *p = strstr(s, "secret=");
    REQUIRE(p);
    char secret[80];
    snprintf(secret, sizeof secret, "%.71s", p);
    CHECK(strlen(secret) == 71 && strspn(secret + 7, "0123456789abcdef") == 64);
    CHECK(count_substr(s, secret) == 4);
    CHECK(!strstr(s, "not-this-one"));
    free(s);
    unsetenv("DOWNPOUR_SECRET");

    /* A user's OPENBLAS_NUM_THREADS is kept. */
    setenv("OPENBLAS_NUM_THREADS", "7", 1);
    out = open_out("launch_env2.txt", out_path, sizeof out_path);
    o.out_fd = out;
    CHECK(dp_launch(&o, &err) == 0);
    close(out);
    s = slurp(out_path);
    REQUIRE(s);
    CHECK(count_substr(s, "blas=7\n") == 4);
    /* Fresh per run: the second launch's secret is another one. */
    p = strstr(s, "secret=");
    CHECK(p && strspn(p + 7, "0123456789abcdef") == 64 && strncmp(p, secret, 71) != 0);
    free(s);
    dp_cluster_free(&c);
}

static void test_long_lines(void)
{
    dp_cluster c;
    local_cluster(&c, 0, 1, 0);
    char out_path[4200];
    int out = open_out("launch_long.txt", out_path, sizeof out_path);
    /* 10000 'x' then 2000 three-byte euro signs on one line each */
    char *argv[] = {"/bin/sh", "-c",
                    "i=0; s=''; while [ $i -lt 100 ]; do s=\"${s}xxxxxxxxxx\"; i=$((i+1)); done;"
                    " echo \"$s$s$s$s$s$s$s$s$s$s\";"
                    " e=''; i=0; while [ $i -lt 200 ]; do e=\"${e}\342\202\254\342\202\254\342\202\254"
                    "\342\202\254\342\202\254\342\202\254\342\202\254\342\202\254\342\202\254"
                    "\342\202\254\"; i=$((i+1)); done; echo \"$e\"",
                    NULL};
    dp_launch_opts o = {.cluster = &c, .argc = 3, .argv = argv, .out_fd = out};
    dp_err err = {{0}};
    CHECKF(dp_launch(&o, &err) == 0, "%s", err.msg);
    close(out);
    char *s = slurp(out_path);
    REQUIRE(s);
    CHECK(count_substr(s, "x") == 10000);
    CHECK(count_substr(s, "\342\202\254") == 2000);
    /* every output line is prefixed, at most prefix + DP_LAUNCH_LINE_MAX long,
     * and no euro sign is cut in two */
    int lines = 0;
    for (char *line = s; *line;) {
        char *nl = strchr(line, '\n');
        REQUIRE(nl);
        size_t n = (size_t)(nl - line);
        CHECK(strncmp(line, "[worker 0] ", 11) == 0);
        CHECK(n <= 11 + DP_LAUNCH_LINE_MAX);
        if (line[11] != 'x')
            CHECKF((n - 11) % 3 == 0, "line of %zu bytes", n - 11);
        lines++;
        line = nl + 1;
    }
    CHECKF(lines == 3 + 2, "%d lines", lines);
    free(s);
    dp_cluster_free(&c);
}

static void test_one_fails(void)
{
    dp_cluster c;
    local_cluster(&c, 1, 2, 1);
    char out_path[4200];
    int out = open_out("launch_fail.txt", out_path, sizeof out_path);
    /* worker:1 fails once the others are up; they sleep with a helper each */
    char *argv[] = {"/bin/sh", "-c",
                    "if [ \"$DOWNPOUR_TASK\" = worker:1 ]; then sleep 0.3; echo failing; exit 4; fi;"
                    " sleep 60 & echo \"helper $!\"; wait",
                    NULL};
    dp_launch_opts o = {.cluster = &c, .argc = 3, .argv = argv, .out_fd = out, .grace_seconds = 5};
    dp_err err = {{0}};
    double t0 = dp_now();
    dp_launcher *l;
    REQUIRE(dp_launcher_start(&l, &o, &err) == 0);
    pid_t pids[4];
    for (int r = 0; r < 4; r++)
        pids[r] = dp_launcher_pid(l, r);
    CHECK(dp_launcher_pid(l, 4) == -1);
    int rc = dp_launcher_wait(l, &err);
    dp_launcher_free(l);
    double dt = dp_now() - t0;
    close(out);
    CHECKF(rc == 4, "rc %d", rc);
    CHECKF(strstr(err.msg, "worker:1") && strstr(err.msg, "exited with status 4"), "%s", err.msg);
    /* the others were stopped, not waited for: they sleep 60 s (a bound far
     * from what load can reach; the real check is pid_gone below) */
    CHECKF(dt < 45, "took %.1f s: the launcher waited for the sleeping tasks", dt);
    for (int r = 0; r < 4; r++)
        CHECKF(pid_gone(pids[r]), "task %d (pid %d) still there", r, (int)pids[r]);
    char *s = slurp(out_path);
    REQUIRE(s);
    CHECK(strstr(s, "[worker 1] failing\n"));
    int helpers = 0;
    for (char *p = s; (p = strstr(p, "helper "));) {
        p += 7;
        pid_t h = (pid_t)strtol(p, NULL, 10);
        CHECKF(h > 0 && pid_gone(h), "helper %d still there", (int)h);
        helpers++;
    }
    CHECK(helpers == 3);
    free(s);
    dp_cluster_free(&c);
}

/* Exit 3 (DP_EXIT_CHECKPOINTS_MISSED: done, but some checkpoint not
 * written) is no fault: the others go on to their end, and it is the run's. */
static void test_checkpoints_missed(void)
{
    dp_cluster c;
    local_cluster(&c, 1, 2, 1);
    char out_path[4200];
    int out = open_out("launch_missed.txt", out_path, sizeof out_path);
    char *argv[] = {"/bin/sh", "-c",
                    "if [ \"$DOWNPOUR_TASK\" = chief:0 ]; then exit 3; fi;"
                    " sleep 0.5; echo finished",
                    NULL};
    dp_launch_opts o = {.cluster = &c, .argc = 3, .argv = argv, .out_fd = out, .grace_seconds = 5};
    dp_err err = {{0}};
    int rc = dp_launch(&o, &err);
    close(out);
    CHECKF(rc == DP_EXIT_CHECKPOINTS_MISSED, "rc %d", rc);
    CHECKF(strstr(err.msg, "chief:0") && strstr(err.msg, "checkpoint"), "%s", err.msg);
    char *s = slurp(out_path);
    REQUIRE(s);
    CHECKF(strstr(s, "[worker 0] finished\n") && strstr(s, "[worker 1] finished\n") &&
           strstr(s, "[ps 0] finished\n"), "the others were stopped: %s", s);
    free(s);
    dp_cluster_free(&c);
}

static void test_grace_then_kill(void)
{
    /* Tasks that ignore SIGTERM get SIGKILL after the grace period. */
    dp_cluster c;
    local_cluster(&c, 0, 3, 0);
    char *argv[] = {"/bin/sh", "-c",
                    "trap '' TERM; if [ \"$DOWNPOUR_TASK\" = worker:2 ]; then sleep 0.3;"
                    " kill -9 $$; fi; sleep 60",
                    NULL};
    int out = open("/dev/null", O_WRONLY | O_CLOEXEC);
    dp_launch_opts o = {.cluster = &c, .argc = 3, .argv = argv, .out_fd = out, .err_fd = out,
                        .grace_seconds = 0.5};
    dp_err err = {{0}};
    double t0 = dp_now();
    int rc = dp_launch(&o, &err);
    double dt = dp_now() - t0;
    close(out);
    CHECKF(rc == 128 + SIGKILL, "rc %d", rc);
    CHECKF(strstr(err.msg, "worker:2") && strstr(err.msg, "signal 9"), "%s", err.msg);
    /* at least the 0.3 s before the kill and the 0.5 s grace; far less than
     * the survivors' 60 s sleep (they were killed, not waited for) */
    CHECKF(dt > 0.7 && dt < 45, "took %.2f s", dt);
    dp_cluster_free(&c);
}

static void test_exec_failure(void)
{
    dp_cluster c;
    local_cluster(&c, 0, 1, 0);
    char err_path[4200];
    int errfd = open_out("launch_exec.txt", err_path, sizeof err_path);
    char *argv[] = {"/nonexistent/downpour", "train", NULL};
    dp_launch_opts o = {.cluster = &c, .argc = 2, .argv = argv, .err_fd = errfd};
    dp_err err = {{0}};
    CHECK(dp_launch(&o, &err) == 127);
    close(errfd);
    char *s = slurp(err_path);
    REQUIRE(s);
    CHECKF(strstr(s, "[worker 0] launcher: cannot execute") && strstr(s, "No such file"), "%s", s);
    free(s);
    dp_launch_opts bad = {.cluster = &c, .argc = 0, .argv = argv};
    CHECK(dp_launch(&bad, &err) == 1 && strstr(err.msg, "no task command"));
    dp_cluster_free(&c);
}

/* Runs a launcher in a child process whose tasks print their pid and sleep.
 * Returns the launcher's pid; fills task pids once all have reported. */
static pid_t launcher_process(const char *name, pid_t *task_pids, int n)
{
    char out_path[4200];
    int out = open_out(name, out_path, sizeof out_path);
    pid_t lp = fork();
    REQUIRE(lp >= 0);
    if (lp == 0) {
        dp_cluster c;
        local_cluster(&c, 0, n, 0);
        char *argv[] = {"/bin/sh", "-c", "echo \"pid $$\"; exec sleep 60", NULL};
        dp_launch_opts o = {.cluster = &c, .argc = 3, .argv = argv, .out_fd = out, .err_fd = out};
        dp_err err;
        int rc = dp_launch(&o, &err);
        _exit(rc);
    }
    close(out);
    int found = 0;
    for (int tries = 0; tries < 500 && found < n; tries++) {
        usleep(10000);
        char *s = slurp(out_path);
        found = 0;
        for (char *p = s; p && (p = strstr(p, "] pid ")) && found < n;) {
            p += 6;
            task_pids[found++] = (pid_t)strtol(p, NULL, 10);
        }
        free(s);
    }
    REQUIRE(found == n);
    return lp;
}

static void test_sigterm_to_launcher(void)
{
    pid_t tasks[3];
    pid_t lp = launcher_process("launch_sigterm.txt", tasks, 3);
    double t0 = dp_now();
    kill(lp, SIGTERM);
    int st;
    REQUIRE(waitpid(lp, &st, 0) == lp);
    double dt = dp_now() - t0;
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGTERM, "wait status %d", st);
    CHECKF(dt < 45, "took %.1f s: the launcher waited for its tasks", dt);
    for (int i = 0; i < 3; i++)
        CHECKF(pid_gone(tasks[i]), "task pid %d still there", (int)tasks[i]);
}

static void test_launcher_killed(void)
{
    /* SIGKILL to the launcher: the tasks die by PR_SET_PDEATHSIG. */
    pid_t tasks[2];
    pid_t lp = launcher_process("launch_sigkill.txt", tasks, 2);
    kill(lp, SIGKILL);
    int st;
    REQUIRE(waitpid(lp, &st, 0) == lp);
    for (int i = 0; i < 2; i++)
        CHECKF(pid_gone(tasks[i]), "task pid %d outlived its launcher", (int)tasks[i]);
}

static void test_metrics_merge(void)
{
    dp_cluster c;
    local_cluster(&c, 1, 2, 0);
    char metrics[4200];
    snprintf(metrics, sizeof metrics, "%s/launch_metrics.jsonl", g_dir);
    /* "$2" is the rewritten FILE.<type>-<index> after "--metrics" ($1). */
    char *argv[] = {"/bin/sh", "-c",
                    "n=${DOWNPOUR_TASK#*:};"
                    " for cpu in 40 60; do printf '{\"event\":\"resource\",\"t\":1,\"task\":\"%s\","
                    "\"cpu_percent\":%d,\"rss_bytes\":%d,\"net_tx_bytes\":%d,\"net_rx_bytes\":%d}\\n'"
                    " \"$DOWNPOUR_TASK\" $cpu $((1000 + cpu)) $((cpu + n)) $cpu; done > \"$2\";"
                    " echo '{\"event\":\"epoch\",\"epoch\":1}' >> \"$2\"; printf '{\"torn' >> \"$2\"",
                    "sh", "--metrics", metrics, NULL};
    int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
    dp_launch_opts o = {.cluster = &c, .argc = 6, .argv = argv, .err_fd = devnull};
    dp_err err = {{0}};
    CHECKF(dp_launch(&o, &err) == 0, "%s", err.msg);
    close(devnull);
    char *s = slurp(metrics);
    REQUIRE(s);
    CHECKF(count_substr(s, "\n") == 3 * 3 + 1, "%s", s);
    CHECK(strstr(s, "{\"event\":\"epoch\",\"epoch\":1,\"task\":\"worker:1\"}\n"));
    CHECK(strstr(s, "\"task\":\"chief:0\",\"cpu_percent\":40"));
    const char *tot = strstr(s, "{\"event\":\"resource_total\"");
    CHECKF(tot != NULL, "%s", s);
    if (tot) {
        CHECKF(strstr(tot, "\"tasks\":3,\"samples\":6,\"cpu_percent_mean\":50.000,"
                           "\"cpu_percent_sum\":150.000,\"rss_peak_bytes\":3180,"
                           "\"net_tx_bytes\":181,\"net_rx_bytes\":180}\n"), "%s", tot);
    }
    /* merged: the per-task files are gone (issue 29); FILE stays */
    char path[4500];
    snprintf(path, sizeof path, "%s.worker-1", metrics);
    CHECKF(access(path, F_OK) != 0, "%s left behind", path);
    snprintf(path, sizeof path, "%s.chief-0", metrics);
    CHECKF(access(path, F_OK) != 0, "%s left behind", path);
    CHECK(access(metrics, F_OK) == 0);
    free(s);

    /* DOWNPOUR_METRICS_KEEP_PARTS=1 keeps them */
    dp_hook_set(DP_LAUNCH_KEEP_PARTS_ENV, "1", NULL);
    devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
    o.err_fd = devnull;
    CHECKF(dp_launch(&o, &err) == 0, "%s", err.msg);
    close(devnull);
    dp_hook_set(DP_LAUNCH_KEEP_PARTS_ENV, NULL, NULL);
    snprintf(path, sizeof path, "%s.worker-1", metrics);
    CHECK(access(path, F_OK) == 0);

    /* a merge that fails (FILE's folder is gone) keeps the parts and says so */
    char sub[4300], sub_metrics[4400];
    snprintf(sub, sizeof sub, "%s/launch_metrics_gone", g_dir);
    REQUIRE(mkdir(sub, 0700) == 0 || errno == EEXIST);
    snprintf(sub_metrics, sizeof sub_metrics, "%s/m.jsonl", sub);
    char *argv2[] = {"/bin/sh", "-c", "echo '{\"event\":\"epoch\"}' > \"$2\"", "sh",
                     "--metrics", sub_metrics, NULL};
    /* FILE a directory: the merge's rename onto it fails */
    REQUIRE(mkdir(sub_metrics, 0700) == 0 || errno == EEXIST);
    devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
    dp_launch_opts o2 = {.cluster = &c, .argc = 6, .argv = argv2, .err_fd = devnull};
    int rc2 = dp_launch(&o2, &err);
    close(devnull);
    CHECKF(rc2 != 0 && strstr(err.msg, "are kept"), "exit %d: %s", rc2, err.msg);
    snprintf(path, sizeof path, "%s.worker-1", sub_metrics);
    CHECKF(access(path, F_OK) == 0, "%s removed although the merge failed", path);
    dp_cluster_free(&c);
}

static int count_fds(void)
{
    int n = 0;
    for (int fd = 0; fd < 1024; fd++)
        if (fcntl(fd, F_GETFD) >= 0)
            n++;
    return n;
}

int main(void)
{
    int fds0 = count_fds();
    const char *dir = getenv("DOWNPOUR_TEST_TMP");
    snprintf(g_dir, sizeof g_dir, "%s", dir && *dir ? dir : "/tmp");
    if (access("/bin/sh", X_OK) != 0) {
        fprintf(stderr, "no /bin/sh: skipped\n");
        return 77;
    }
    test_free_ports();
    test_listen_fds();
    test_all_succeed();
    test_environment();
    test_long_lines();
    test_one_fails();
    test_checkpoints_missed();
    test_grace_then_kill();
    test_exec_failure();
    test_sigterm_to_launcher();
    test_launcher_killed();
    test_metrics_merge();
    CHECKF(count_fds() == fds0, "%d open fds, %d at the start", count_fds(), fds0);
    /* the launcher restored the signal dispositions */
    struct sigaction sa;
    sigaction(SIGPIPE, NULL, &sa);
    CHECK(sa.sa_handler == SIG_DFL);
    sigaction(SIGTERM, NULL, &sa);
    CHECK(sa.sa_handler == SIG_DFL);
    return CHECK_DONE();
}
