/* Runs the downpour program (DOWNPOUR_BIN) as a test's child, its stdout
 * and stderr kept in g_out and g_err: the command-line tests' one way in
 * (test_cli.c, test_cli_surface.c).  Set g_bin and g_dir (a scratch
 * folder) first; g_fsize_limit > 0 caps the files the child may write. */
#ifndef DOWNPOUR_TESTS_RUN_BIN_H
#define DOWNPOUR_TESTS_RUN_BIN_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

static const char *g_bin;
static char g_dir[1024];
static char g_out[1 << 17], g_err[1 << 17];
static long g_fsize_limit; /* > 0: the child's RLIMIT_FSIZE in bytes (writes fail with EFBIG) */

static void read_back(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, buf, cap - 1) : 0;
    buf[n > 0 ? n : 0] = '\0';
    if (fd >= 0)
        close(fd);
}

/* Runs g_bin with args (NULL-terminated, without argv[0]).  Returns the
 * exit status, -1 if killed. */
static int run_bin(const char *const *args)
{
    char out_path[1100], err_path[1100];
    snprintf(out_path, sizeof out_path, "%s/stdout.txt", g_dir);
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", g_dir);
    const char *argv[96] = {g_bin};
    int n = 1;
    for (; args[n - 1] && n < 95; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int in = open("/dev/null", O_RDONLY);
        if (o < 0 || e < 0 || in < 0 || dup2(in, 0) < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0)
            _exit(126);
        if (g_fsize_limit > 0) {
            struct rlimit lim = {(rlim_t)g_fsize_limit, (rlim_t)g_fsize_limit};
            signal(SIGXFSZ, SIG_IGN); /* the write fails with EFBIG instead */
            if (setrlimit(RLIMIT_FSIZE, &lim) != 0)
                _exit(126);
        }
        execv(g_bin, (char *const *)argv);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        REQUIRE(errno == EINTR);
    read_back(out_path, g_out, sizeof g_out);
    read_back(err_path, g_err, sizeof g_err);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#endif
